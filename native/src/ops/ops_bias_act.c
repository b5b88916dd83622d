/*
 * ops_bias_act.c: a product's bias, an activation and a residual in one pass:
 * act(y + b) (+ r) over a channels-fastest [C, rows] tensor.
 *
 * Composed, a linear layer's bias is an add over its whole output, the activation another
 * pass, the residual a third. In S3Gen's flow estimator (56 transformer blocks an Euler
 * step, each an output projection and a feed-forward network) the adds alone took 21 % of a
 * 24-stream original tick's kernel time on an H100 and the GELU 6 % (docs/benchmarks.md).
 * This op reads y (and r) once and writes once.
 *
 * A ggml custom op (GGML_OP_CUSTOM) whose function below is its CPU implementation (the
 * portable graphs; native/tests/test_layers.c checks it against ggml's ops); on CUDA the
 * codecrt ops backend runs its kernel (cuda/cuda_ops.cu), checked against this function in
 * tests/native/test_gpu.py.
 */
#include <math.h>

#include "internal.h"

void cr_bias_act_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *y = dst->src[0], *b = dst->src[1], *r = dst->src[2];
    const cr_bias_act_kind act = cr_bias_act_unpack(user);
    const int64_t C = y->ne[0], rows = ggml_nrows(y), r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    const float *bd = (const float *)b->data;
    for (int64_t i = r0; i < r1; i++) {
        const float *yr = (const float *)y->data + i * C;
        const float *rr = r ? (const float *)r->data + i * C : NULL;
        float *out = (float *)dst->data + i * C;
        for (int64_t c = 0; c < C; c++) {
            float v = yr[c] + bd[c];
            if (act == CR_ACT_GELU_ERF) {
                v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
            }
            out[c] = rr ? rr[c] + v : v;
        }
    }
}

struct ggml_tensor *cr_bias_act(struct ggml_context *ctx, struct ggml_tensor *y, struct ggml_tensor *b,
                                struct ggml_tensor *r, cr_bias_act_kind act) {
    if (y->type != GGML_TYPE_F32 || !ggml_is_contiguous(y) || b->type != GGML_TYPE_F32 || !ggml_is_contiguous(b) ||
        ggml_nelements(b) != y->ne[0] || (act != CR_ACT_NONE && act != CR_ACT_GELU_ERF) ||
        (r && (r->type != GGML_TYPE_F32 || !ggml_is_contiguous(r) || !ggml_are_same_shape(r, y)))) {
        return NULL;
    }
    struct ggml_tensor *args[3] = {y, b, r};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, y->ne[0], y->ne[1], y->ne[2], y->ne[3], args, r ? 3 : 2,
                          cr_bias_act_cpu, GGML_N_TASKS_MAX, cr_bias_act_pack(act));
}
