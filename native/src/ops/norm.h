/*
 * norm.h: what the rows' norm op (ops_norm.c) shares with the device backends that run it
 * (cuda/cuda_ops.cu): its parameters and the address of its CPU function, by which a
 * backend recognises the node. C and C++.
 */
#ifndef CODECRT_NORM_H
#define CODECRT_NORM_H

#include <stdint.h>
#include <string.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op's parameters, carried in the custom op's userdata pointer (64 bits): eps's float
   bits (0..31), RMSNorm rather than LayerNorm (bit 32), Mish after the affine (bit 33). */
typedef struct cr_norm_params {
    float eps;
    int rms;
    int mish;
} cr_norm_params;

static inline void *cr_norm_pack(cr_norm_params p) {
    uint32_t e;
    memcpy(&e, &p.eps, sizeof(e));
    return (void *)(uintptr_t)((uint64_t)e | (uint64_t)(p.rms ? 1 : 0) << 32 | (uint64_t)(p.mish ? 1 : 0) << 33);
}

static inline cr_norm_params cr_norm_unpack(const void *user) {
    const uint64_t u = (uint64_t)(uintptr_t)user;
    const uint32_t e = (uint32_t)(u & 0xffffffffu);
    cr_norm_params p;
    memcpy(&p.eps, &e, sizeof(p.eps));
    p.rms = (int)(u >> 32 & 1);
    p.mish = (int)(u >> 33 & 1);
    return p;
}

/* The CPU implementation, a ggml_custom_op_t (GGML_OP_CUSTOM): src = x [C, rows...]
   (contiguous F32), w [C], b [C] or none; dst, x's shape, per row
     y = (x - mean) / sqrt(var + eps) w + b      (LayerNorm; var the mean squared deviation)
     y = x / sqrt(mean(x^2) + eps) w (+ b)        (RMSNorm, rms)
   then with mish y tanh(softplus(y)) (softplus y above 20, as torch's), the sums in double.
   Rows are independent (batch invariance). */
void cr_norm_rows_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_NORM_H */
