/*
 * cuda_ops.h: codecrt's own ops on a CUDA device, as a ggml backend of their own
 * (cuda_ops.cu), so that they are added the way ggml adds an op (a CPU and a device
 * implementation of one node) without a change to the fetched ggml sources.
 *
 * The backend shares the CUDA backend's buffers (its buffer type is that backend's, so
 * the scheduler copies nothing between them) and takes only codecrt's custom ops,
 * recognised by their CPU function (ops/res_unit.h, ops/upconv.h); the CUDA backend takes none of
 * those, so the scheduler hands them to this one when it sits between the device and
 * the CPU in its list. Ordering against the CUDA backend's stream is by events, both
 * ways, with no host synchronisation.
 */
#ifndef CODECRT_CUDA_OPS_H
#define CODECRT_CUDA_OPS_H

#include <stdbool.h>

#include "ggml-backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ops backend beside device (a backend of ggml's CUDA device), or NULL where the
   build has no CUDA (CODECRT_CUDA_OPS undefined) or device is not a CUDA device. Freed by
   ggml_backend_free, before device. precise_sin: the Snakes take CUDA's sinf rather than
   the hardware's sine after a reduction modulo 2 pi (CODECRT_PRECISE_SIN=1). */
ggml_backend_t cr_cuda_ops_new(ggml_backend_t device, bool precise_sin);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_CUDA_OPS_H */
