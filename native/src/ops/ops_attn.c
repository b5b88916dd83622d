/*
 * ops_attn.c: the attention's two products as ops, per head h and sequence b: the scores
 * K_h^T Q_h ([Tk, D] x [D, Tq]) read from the projections where they lie, and the weighted
 * values V_h P_h ([D, Tk] x [Tk, Tq]) written where the output projection reads them, row
 * (t, b) holding head after head ([D H, Tq, B]).
 *
 * ggml's products write [D, Tq, H, B] (a head's queries side by side); the projection
 * needs the heads of one query side by side, so each attention was a product and then a
 * copy of its permutation. In S3Gen's flow estimator (56 transformer blocks an Euler step)
 * that copy took 86 ms of a 24-stream original tick's 789 ms of kernel time on an H100
 * (docs/benchmarks.md). On CUDA both ops are cuBLAS' strided batched products, one call a
 * head, whose output rows are as far apart as asked (cuda/cuda_ops.cu): no copy. Being
 * codecrt's ops, they also keep a transformer block's run of codecrt's ops on one backend
 * (each change of backend is a split of the graph, with its events and its host work).
 *
 * ggml custom ops (GGML_OP_CUSTOM) whose functions below are their CPU implementations
 * (the portable graphs; native/tests/test_layers.c checks them against a double reference
 * and ggml's products); on CUDA the codecrt ops backend runs them, checked against these
 * functions (tests/native/test_gpu.py).
 */
#include "internal.h"

void cr_attn_scores_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    (void)user;
    const struct ggml_tensor *k = dst->src[0], *q = dst->src[1];
    const int64_t D = k->ne[0], Tk = k->ne[1], Tq = q->ne[1], H = k->ne[2];
    const int64_t rows = Tq * H * k->ne[3]; /* (j, h, b): Tk scores each */
    const int64_t r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t j = r % Tq, h = r / Tq % H, b = r / (Tq * H);
        const float *qj = (const float *)((const char *)q->data + j * q->nb[1] + h * q->nb[2] + b * q->nb[3]);
        const char *kb = (const char *)k->data + h * k->nb[2] + b * k->nb[3];
        float *out = (float *)dst->data + r * Tk;
        for (int64_t i = 0; i < Tk; i++) {
            out[i] = cr_dot_f32((const float *)(kb + i * k->nb[1]), qj, D);
        }
    }
}

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
            out[d] = cr_dot_f32((const float *)(vb + d * v->nb[1]), w, Tk);
        }
    }
}

struct ggml_tensor *cr_attn_scores(struct ggml_context *ctx, struct ggml_tensor *k, struct ggml_tensor *q) {
    if (!cr_attn_operand(k) || !cr_attn_operand(q) || k->ne[0] != q->ne[0] || k->ne[2] != q->ne[2] ||
        k->ne[3] != q->ne[3] || k->ne[0] < 1 || k->ne[1] < 1) {
        return NULL;
    }
    struct ggml_tensor *args[2] = {k, q};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, k->ne[1], q->ne[1], q->ne[2], q->ne[3], args, 2, cr_attn_scores_cpu,
                          GGML_N_TASKS_MAX, NULL);
}

struct ggml_tensor *cr_attn_values(struct ggml_context *ctx, struct ggml_tensor *v, struct ggml_tensor *p) {
    if (!cr_attn_operand(v) || p->type != GGML_TYPE_F32 || !ggml_is_contiguous(p) || v->ne[0] != p->ne[0] ||
        v->ne[2] != p->ne[2] || v->ne[3] != p->ne[3] || p->ne[0] < 1 || v->ne[1] < 1) {
        return NULL;
    }
    struct ggml_tensor *args[2] = {v, p};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, v->ne[1], p->ne[2], p->ne[1], p->ne[3], args, 2, cr_attn_values_cpu,
                          GGML_N_TASKS_MAX, NULL);
}
