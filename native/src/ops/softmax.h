/*
 * softmax.h: what the rows' softmax op (ops_softmax.c) shares with the device backends
 * that run it (cuda/cuda_ops.cu): its parameter and the address of its CPU function, by
 * which a backend recognises the node. C and C++.
 */
#ifndef CODECRT_SOFTMAX_H
#define CODECRT_SOFTMAX_H

#include <stdint.h>
#include <string.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op's parameter, carried in the custom op's userdata pointer: the scale's float bits. */
static inline void *cr_softmax_pack(float scale) {
    uint32_t u;
    memcpy(&u, &scale, sizeof(u));
    return (void *)(uintptr_t)u;
}

static inline float cr_softmax_unpack(const void *user) {
    const uint32_t u = (uint32_t)(uintptr_t)user;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* The CPU implementation, a ggml_custom_op_t (GGML_OP_CUSTOM): src = a [n, rows...]
   (contiguous F32); dst, a's shape, per row
     dst[i] = exp(s a[i] - m) / sum_j exp(s a[j] - m),  m = max_j s a[j],
   the sum in float in index order (ggml's CPU softmax sums in double). */
void cr_softmax_rows_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_SOFTMAX_H */
