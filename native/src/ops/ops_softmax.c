/*
 * ops_softmax.c: a softmax over each row, scaled, as one op: the attention scores of
 * S3Gen's flow estimator ([T, T, 8, B] per transformer block, 56 blocks an Euler step).
 *
 * ggml's CUDA softmax gives each row a block of up to 1,024 threads that meet at barriers
 * for the maximum and the sum; rows of a few hundred scores leave most of that block idle
 * and the kernel bound by its reductions: on an H100 it took 30 % of an S3Gen tick's kernel
 * time (325 ms of 1,066 for 24 original streams, docs/benchmarks.md), five times what its
 * bytes would take at the card's bandwidth. The CUDA kernel of this op (cuda/cuda_ops.cu)
 * gives a row one warp, its scores in registers, and reduces by shuffles.
 *
 * A ggml custom op (GGML_OP_CUSTOM) whose function below is its CPU implementation (the
 * portable graphs; native/tests/test_layers.c checks it against a double reference); on
 * CUDA the codecrt ops backend runs its kernel, checked against this function
 * (tests/native/test_gpu.py).
 */
#include <math.h>

#include "internal.h"

void cr_softmax_rows_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *a = dst->src[0];
    const float scale = cr_softmax_unpack(user);
    const int64_t n = a->ne[0], rows = ggml_nrows(a);
    const int64_t r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)a->data + r * n;
        float *y = (float *)dst->data + r * n;
        float m = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            m = fmaxf(m, scale * x[i]);
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            y[i] = expf(scale * x[i] - m);
            sum += y[i];
        }
        const float inv = 1.0f / sum;
        for (int64_t i = 0; i < n; i++) {
            y[i] *= inv;
        }
    }
}

struct ggml_tensor *cr_softmax_rows(struct ggml_context *ctx, struct ggml_tensor *a, float scale) {
    if (a->type != GGML_TYPE_F32 || !ggml_is_contiguous(a) || a->ne[0] < 1 || !isfinite(scale)) {
        return NULL;
    }
    struct ggml_tensor *args[1] = {a};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, a->ne[0], a->ne[1], a->ne[2], a->ne[3], args, 1,
                          cr_softmax_rows_cpu, GGML_N_TASKS_MAX, cr_softmax_pack(scale));
}
