/*
 * upconv.h: what the transposed conv's tail op (ops_upconv.c) shares with the device
 * backends that run it (cuda/cuda_ops.cu): its parameters and the address of its CPU
 * function, by which a backend recognises the node. C and C++.
 */
#ifndef CODECRT_UPCONV_H
#define CODECRT_UPCONV_H

#include <stdint.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op's parameters, carried in the custom op's userdata pointer: the stride s and the
   samples cropped at the start (SNAC's ConvTranspose1d padding), each below 2^15. */
enum { CR_UPCONV_MAX_STRIDE = 1 << 15 };

typedef struct cr_upconv_params {
    int s;    /* stride: s output samples per input frame, 1 .. CR_UPCONV_MAX_STRIDE - 1 */
    int crop; /* output samples dropped at the start, 0 .. CR_UPCONV_MAX_STRIDE - 1 */
} cr_upconv_params;

static inline void *cr_upconv_pack(cr_upconv_params p) {
    return (void *)(uintptr_t)((uint32_t)p.s << 15 | (uint32_t)p.crop);
}

static inline cr_upconv_params cr_upconv_unpack(const void *user) {
    const uint32_t u = (uint32_t)(uintptr_t)user;
    cr_upconv_params p;
    p.s = (int)(u >> 15);
    p.crop = (int)(u & (CR_UPCONV_MAX_STRIDE - 1));
    return p;
}

/* The CPU implementation, a ggml_custom_op_t (GGML_OP_CUSTOM): src = z [2s*C, T, B] (the
   kernel's product with the unpadded input, channels fastest), b [C], optionally a
   mask [n, B] (1 where a sample is real; else src[2] NULL) and, where the op writes the next
   layer's state first, prefix [S, B, C] (time contiguous, any strides; else no src[3]);
   dst [S + n, B, C] (time fastest) = concat(prefix, out) along time, with
     out[o, b, c] = ((z[r C + c, j, b] + z[(s + r) C + c, j - 1, b]) + b[c]) * mask[o, b]
   with u = o + crop, j = u / s, r = u % s, and frames -1 and T reading as zeros. */
void cr_upconv_tail_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_UPCONV_H */
