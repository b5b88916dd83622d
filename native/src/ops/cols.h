/*
 * cols.h: what the convolution columns op (ops_cols.c) shares with the device backends
 * that run it (cuda/cuda_ops.cu): its parameters and the address of its CPU function, by
 * which a backend recognises the node. C and C++.
 */
#ifndef CODECRT_COLS_H
#define CODECRT_COLS_H

#include <stdint.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The op's parameters, carried in the custom op's userdata pointer (64 bits): the taps K,
   the dilation d, the zero frames padded on the left (pl) and the right (pr), and whether
   a Snake comes first. */
enum { CR_COLS_MAX_TAPS = 255, CR_COLS_MAX_REACH = 0xffff };

typedef struct cr_cols_params {
    int k;      /* taps, 1 .. CR_COLS_MAX_TAPS */
    int d;      /* dilation, 1 .. CR_COLS_MAX_REACH */
    int pl, pr; /* zero frames before and after the input, 0 .. CR_COLS_MAX_REACH */
    int snake;  /* 1: each input value goes through Snake (src[1] alpha, src[2] 1/alpha) first */
} cr_cols_params;

static inline void *cr_cols_pack(cr_cols_params p) {
    const uint64_t u = (uint64_t)p.k | (uint64_t)p.d << 8 | (uint64_t)p.pl << 24 | (uint64_t)p.pr << 40 |
                       (uint64_t)(p.snake ? 1 : 0) << 56;
    return (void *)(uintptr_t)u;
}

static inline cr_cols_params cr_cols_unpack(const void *user) {
    const uint64_t u = (uint64_t)(uintptr_t)user;
    cr_cols_params p;
    p.k = (int)(u & 0xff);
    p.d = (int)(u >> 8 & 0xffff);
    p.pl = (int)(u >> 24 & 0xffff);
    p.pr = (int)(u >> 40 & 0xffff);
    p.snake = (int)(u >> 56 & 1);
    return p;
}

/* The CPU implementation, a ggml_custom_op_t (GGML_OP_CUSTOM): src = x [C, T, B] (channels
   fastest, contiguous F32) and, with snake, alpha and inv [C]; dst [C K, To, B] with
   To = T + pl + pr - d (K - 1), the column matrix of a stride-1 convolution whose rows
   c K + k match a PyTorch kernel (Cout, Cin, K) flattened:
     dst[c K + k, t, b] = f(x[c, t + k d - pl, b]), zero where that frame is outside 0 .. T-1,
   f(v) = v + inv[c] sin(alpha[c] v)^2 with snake (x + (sin(alpha x))^2 inv, the composed
   ggml ops' order; a compiler that contracts to an FMA rounds it once less), else v. */
void cr_cols_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_COLS_H */
