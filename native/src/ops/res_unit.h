/*
 * res_unit.h: what the residual unit's ops (ops_res_unit.c: the unit core and the unit
 * tail) share with the device backends that run them (cuda/cuda_ops.cu): their
 * parameters and the addresses of their CPU functions, by which a backend recognises
 * the nodes. C and C++.
 */
#ifndef CODECRT_RES_UNIT_H
#define CODECRT_RES_UNIT_H

#include <stdbool.h>
#include <stdint.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The widest kernel and the longest reach (dilation x (taps - 1)) the op takes: a
   device kernel keeps a channel's taps in registers and a tile of 64 outputs plus the
   reach in shared memory (32 channels x (64 + 512) floats = 72 KiB at most). SNAC's units
   are 7 taps at dilations 1, 3 and 9: a reach of 54. */
enum { CR_UNIT_CORE_MAX_TAPS = 16, CR_UNIT_CORE_MAX_SPAN = 512 };

/* The op's parameters, carried in the custom op's userdata pointer. */
typedef struct cr_unit_core_params {
    int dil;   /* dilation, 1 .. CR_UNIT_CORE_MAX_SPAN */
    bool same; /* conv padded on both sides (n = L) rather than valid (n = L - dil (K-1)) */
} cr_unit_core_params;

static inline void *cr_unit_core_pack(cr_unit_core_params p) {
    return (void *)(uintptr_t)((uint32_t)p.dil << 1 | (p.same ? 1u : 0u));
}

static inline cr_unit_core_params cr_unit_core_unpack(const void *user) {
    const uint32_t u = (uint32_t)(uintptr_t)user;
    cr_unit_core_params p;
    p.dil = (int)(u >> 1);
    p.same = (u & 1u) != 0;
    return p;
}

/* The CPU implementation, a ggml_custom_op_t (GGML_OP_CUSTOM): src = t [L, B, C], w [C, K],
   b, alpha1, inv_alpha1, alpha2, inv_alpha2 [C]; dst [C, n, B]. */
void cr_unit_core_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

/* The unit tail's CPU implementation: src = y [n*B, C] (the 1x1 conv's product, contiguous),
   b [C], x [n, B, C] (the residual, any strides), in a masked graph mask [n, B] (contiguous;
   else src[3] NULL) and, where the op writes the next layer's state first, prefix [S, B, C]
   (time contiguous, any strides; else no src[4]); dst [S + n, B, C] = concat(prefix,
   ((y + b) + x) * mask) along time. */
void cr_unit_tail_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_RES_UNIT_H */
