/*
 * attn_values.h: what the attention's values op (ops_attn_values.c) shares with the device
 * backends that run it (cuda/cuda_ops.cu): the address of its CPU function, by which a
 * backend recognises the node. C and C++.
 */
#ifndef CODECRT_ATTN_VALUES_H
#define CODECRT_ATTN_VALUES_H

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU implementation, a ggml_custom_op_t (GGML_OP_CUSTOM): src[0] = v [Tk, D, H, B]
   (F32, keys fastest: nb0 = 4, any other strides), src[1] = p [Tk, Tq, H, B] (contiguous
   F32, each row a query's weights over the keys); dst [D, H, Tq, B] contiguous:
     dst[d, h, t, b] = sum_k v[k, d, h, b] p[k, t, h, b],
   each head's output beside the others' in a query's row (what the output projection
   reads), the sum in float in key order. */
void cr_attn_values_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_ATTN_VALUES_H */
