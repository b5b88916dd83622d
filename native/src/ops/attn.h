/*
 * attn.h: what the attention's product ops (ops_attn.c) share with the device backends that
 * run them (cuda/cuda_ops.cu): the addresses of their CPU functions, by which a backend
 * recognises the nodes. C and C++.
 */
#ifndef CODECRT_ATTN_H
#define CODECRT_ATTN_H

#include <stdbool.h>

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An operand the attention's products take as it lies: F32, nb0 = 4, every stride and a
   view's offset a whole number of floats (what cuBLAS' pointers, leading dimensions and
   batch strides are counted in). Their builders and the device backends check it. */
static inline bool cr_attn_operand(const struct ggml_tensor *t) {
    bool ok = t->type == GGML_TYPE_F32 && t->nb[0] == sizeof(float) && t->view_offs % sizeof(float) == 0;
    for (int i = 1; i < 4; i++) {
        ok = ok && t->nb[i] % sizeof(float) == 0;
    }
    return ok;
}

/* The scores, a ggml_custom_op_t (GGML_OP_CUSTOM): src[0] = k [D, Tk, H, B], src[1] = q
   [D, Tq, H, B] (F32, channels fastest: nb0 = 4, any other strides: views of the
   projections [H D, T, B]); dst [Tk, Tq, H, B] contiguous:
     dst[i, j, h, b] = sum_d k[d, i, h, b] q[d, j, h, b]      (ggml_mul_mat(k, q)),
   each sum in float over eight interleaved partial sums (cr_dot_f32). */
void cr_attn_scores_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

/* The weighted values, a ggml_custom_op_t (GGML_OP_CUSTOM): src[0] = v [Tk, D, H, B]
   (F32, keys fastest: nb0 = 4, any other strides), src[1] = p [Tk, Tq, H, B] (contiguous
   F32, each row a query's weights over the keys); dst [D, H, Tq, B] contiguous:
     dst[d, h, t, b] = sum_k v[k, d, h, b] p[k, t, h, b],
   each head's output beside the others' in a query's row (what the output projection
   reads), each sum as the scores'. */
void cr_attn_values_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_ATTN_H */
