/*
 * ops_matmul.c: a matrix product as codecrt's op, for graphs whose other ops around it are
 * codecrt's too (S3Gen's flow estimator: a transformer block is norms, products, the
 * attention and biases).
 *
 * ggml's product is as fast (on CUDA, past 16 columns, both are cuBLAS' SGEMM with TF32
 * allowed; ggml takes kernels of its own for fewer), but it runs on ggml's backend: each product between two of codecrt's ops cut the graph into
 * another split, each with its events between the two streams and the scheduler's host
 * work. With the products, the biases, the norms and the attention all codecrt's, a
 * transformer block is one split: on an H100 the 24-stream original S3Gen tick had 571
 * splits a graph with ggml's products around codecrt's other ops, and its kernels filled 80 %
 * of its wall (docs/benchmarks.md).
 *
 * A ggml custom op (GGML_OP_CUSTOM) whose function below is its CPU implementation (the
 * portable graphs; native/tests/test_layers.c checks it against ggml's product); on CUDA
 * the codecrt ops backend runs it (cuda/cuda_ops.cu), checked against this function in
 * tests/native/test_gpu.py.
 */
#include "internal.h"

void cr_matmul_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    (void)user;
    const struct ggml_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t K = a->ne[0], N = a->ne[1], M = ggml_nrows(b);
    const int64_t m0 = M * ith / nth, m1 = M * (ith + 1) / nth;
    for (int64_t m = m0; m < m1; m++) {
        const float *bm = (const float *)b->data + m * K;
        float *out = (float *)dst->data + m * N;
        for (int64_t n = 0; n < N; n++) {
            out[n] = cr_dot_f32((const float *)a->data + n * K, bm, K);
        }
    }
}

struct ggml_tensor *cr_matmul(struct ggml_context *ctx, struct ggml_tensor *a, struct ggml_tensor *b) {
    if (a->type != GGML_TYPE_F32 || b->type != GGML_TYPE_F32 || !ggml_is_contiguous(a) || !ggml_is_contiguous(b) ||
        a->ne[2] != 1 || a->ne[3] != 1 || a->ne[0] != b->ne[0] || a->ne[0] < 1) {
        return NULL;
    }
    struct ggml_tensor *args[2] = {a, b};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, a->ne[1], b->ne[1], b->ne[2], b->ne[3], args, 2, cr_matmul_cpu,
                          GGML_N_TASKS_MAX, NULL);
}
