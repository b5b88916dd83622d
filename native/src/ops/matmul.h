/*
 * matmul.h: what the matrix product op (ops_matmul.c) shares with the device backends that
 * run it (cuda/cuda_ops.cu): the address of its CPU function, by which a backend recognises
 * the node. C and C++.
 */
#ifndef CODECRT_MATMUL_H
#define CODECRT_MATMUL_H

#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU implementation, a ggml_custom_op_t (GGML_OP_CUSTOM): src[0] = a [K, N]
   (contiguous F32), src[1] = b [K, M, ...] (contiguous F32); dst [N, M, ...] contiguous:
     dst[n, m] = sum_k a[k, n] b[k, m]                  (ggml_mul_mat(a, b)),
   each sum in float over eight interleaved partial sums. */
void cr_matmul_cpu(struct ggml_tensor *dst, int ith, int nth, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_MATMUL_H */
