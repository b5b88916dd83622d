/*
 * ops_attn_values.c: the attention's weighted values with the heads interleaved, as one op:
 * per head h and sequence b the product V_h P_h ([D, Tk] x [Tk, Tq]), written where the
 * output projection reads it, row (t, b) holding head after head ([D H, Tq, B]).
 *
 * ggml's products write [D, Tq, H, B] (a head's queries side by side); the projection
 * needs the heads of one query side by side, so each attention was a product and then a
 * copy of its permutation. In S3Gen's flow estimator (56 transformer blocks an Euler step)
 * that copy took 86 ms of a 24-stream original tick's 789 ms of kernel time on an H100
 * (docs/benchmarks.md). On CUDA this op is cuBLAS' strided batched product, one call a
 * head, whose output rows are D H apart (cuda/cuda_ops.cu): the same product, no copy.
 *
 * A ggml custom op (GGML_OP_CUSTOM) whose function below is its CPU implementation (the
 * portable graphs; native/tests/test_layers.c checks it against a double reference); on
 * CUDA the codecrt ops backend runs it, checked against this function
 * (tests/native/test_gpu.py).
 */
#include "internal.h"

void cr_attn_values_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    (void)user;
    const struct ggml_tensor *v = dst->src[0], *p = dst->src[1];
    const int64_t Tk = p->ne[0], Tq = p->ne[1], H = p->ne[2], D = v->ne[1];
    const int64_t rows = Tq * H * p->ne[3]; /* (t, h, b): D outputs each */
    const int64_t r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = r % Tq, h = r / Tq % H, b = r / (Tq * H);
        const float *w = (const float *)p->data + r * Tk; /* p's rows are (t, h, b) in this order */
        const char *vb = (const char *)v->data + h * v->nb[2] + b * v->nb[3];
        float *out = (float *)dst->data + ((b * Tq + t) * H + h) * D;
        for (int64_t d = 0; d < D; d++) {
            const float *vd = (const float *)(vb + d * v->nb[1]);
            float s = 0.0f;
            for (int64_t k = 0; k < Tk; k++) {
                s += vd[k] * w[k];
            }
            out[d] = s;
        }
    }
}

struct ggml_tensor *cr_attn_values(struct ggml_context *ctx, struct ggml_tensor *v, struct ggml_tensor *p) {
    if (v->type != GGML_TYPE_F32 || p->type != GGML_TYPE_F32 || !ggml_is_contiguous(p) ||
        v->nb[0] != sizeof(float) || v->ne[0] != p->ne[0] || v->ne[2] != p->ne[2] || v->ne[3] != p->ne[3] ||
        p->ne[0] < 1 || v->ne[1] < 1) {
        return NULL;
    }
    for (int i = 1; i < 4; i++) {
        if (v->nb[i] % sizeof(float)) {
            return NULL;
        }
    }
    struct ggml_tensor *args[2] = {v, p};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, v->ne[1], p->ne[2], p->ne[1], p->ne[3], args, 2, cr_attn_values_cpu,
                          GGML_N_TASKS_MAX, NULL);
}
