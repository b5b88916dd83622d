/*
 * bias_act.h: what the bias-activation op (ops_bias_act.c) shares with the device backends
 * that run it (cuda/cuda_ops.cu): its parameter and the address of its CPU function, by
 * which a backend recognises the node. C and C++.
 */
#ifndef CODECRT_BIAS_ACT_H
#define CODECRT_BIAS_ACT_H

#include <stdint.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The activation after the bias, carried in the custom op's userdata pointer. */
typedef enum cr_bias_act_kind {
    CR_ACT_NONE = 0,
    CR_ACT_GELU_ERF = 1, /* x (1 + erf(x / sqrt 2)) / 2, ggml's gelu_erf and torch's GELU() */
} cr_bias_act_kind;

static inline void *cr_bias_act_pack(cr_bias_act_kind act) {
    return (void *)(uintptr_t)act;
}

static inline cr_bias_act_kind cr_bias_act_unpack(const void *user) {
    return (cr_bias_act_kind)(uintptr_t)user;
}

/* The CPU implementation, a ggml_custom_op_t (GGML_OP_CUSTOM): src = y [C, rows...]
   (contiguous F32, a product), b [C], and optionally r (y's shape, contiguous: a residual);
   dst, y's shape:  dst[c, i] = act(y[c, i] + b[c]) (+ r[c, i]), each sum rounded as
   ggml's add would round it (so without an activation it equals r + (y + b) bit for bit). */
void cr_bias_act_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_BIAS_ACT_H */
