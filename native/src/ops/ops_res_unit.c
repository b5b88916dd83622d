/*
 * ops_res_unit.c: a Snake residual unit (SNAC's) on the time-fastest layout in two ops
 * around its 1x1 conv's product. The core: Snake1, the depthwise conv with its bias,
 * Snake2, and the transpose that feeds the product, in one pass over memory. The tail:
 * the product's bias and the residual added in one pass (two adds composed; ggml CUDA
 * fuses a chain of adds only where their operands share a layout, and a [C] bias and a
 * [n, B, C] view do not).
 *
 * Composed from ggml ops that core is five passes (the fused Snake, ggml's generic
 * depthwise kernel, the bias add, the second Snake, the transpose copy): on an H200 a
 * 4-frame tick of 256 SNAC streams spent 9 of its 17.6 ms of kernels on them
 * (docs/benchmarks.md, where a tick's time goes). Each op is a ggml custom op (GGML_OP_CUSTOM)
 * whose function below is its CPU implementation: it runs wherever the node lands
 * on the CPU backend (CODECRT_PORTABLE_OPS graphs with CODECRT_FUSED_UNIT=1, the
 * tests' check of the ops). On CUDA the codecrt ops backend (cuda/cuda_ops.cu) claims the
 * node by its function's address and runs its kernel instead; the two are checked
 * against each other (tests/native/test_gpu.py), the CPU one against a double-precision
 * reference (native/tests/test_layers.c) and against the composed ops
 * (tests/native/test_parity.py, tests/native/test_stream.py).
 */
#include <math.h>

#include "internal.h"

/* x + inv * sin(a x)^2 with the composed ops' order (mul, sin, sqr, mul, add). */
static inline float cr_unit_snake(float x, float a, float inv) {
    const float s = sinf(x * a);
    return x + (s * s) * inv;
}

/*
 * dst [C, n, B] (channels fastest) from t [L, B, C] (time fastest):
 *   dst[c, i, b] = Snake2(b_c + sum_k w[c + k C] Snake1(t[i + k d - lp, b, c]))
 * with zeros outside [0, L) (a "same" conv: lp = d (K-1)/2, n = L; a stream tick's
 * valid conv: lp = 0, n = L - d (K-1)). Taps summed in order from zero and the bias
 * added after, as ggml's direct depthwise conv and the add that follows it do.
 * One task per range of (b, c) rows.
 */
void cr_unit_core_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *t = dst->src[0], *w = dst->src[1], *bias = dst->src[2];
    const float *a1 = (const float *)dst->src[3]->data, *i1 = (const float *)dst->src[4]->data;
    const float *a2 = (const float *)dst->src[5]->data, *i2 = (const float *)dst->src[6]->data;
    const cr_unit_core_params p = cr_unit_core_unpack(user);
    const int64_t L = t->ne[0], B = t->ne[1], C = t->ne[2], K = w->ne[1], n = dst->ne[1];
    const int64_t lp = p.same ? (int64_t)p.dil * (K - 1) / 2 : 0;
    const float *td = (const float *)t->data, *wd = (const float *)w->data, *bd = (const float *)bias->data;
    float *yd = (float *)dst->data;
    const int64_t rows = B * C, r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t c = r / B, b = r % B;
        const float *x = td + (c * B + b) * L;
        for (int64_t i = 0; i < n; i++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                const int64_t j = i + k * p.dil - lp;
                if (j >= 0 && j < L) {
                    acc += cr_unit_snake(x[j], a1[c], i1[c]) * wd[c + k * C];
                }
            }
            yd[(b * n + i) * C + c] = cr_unit_snake(acc + bd[c], a2[c], i2[c]);
        }
    }
}

struct ggml_tensor *cr_unit_core(struct ggml_context *ctx, struct ggml_tensor *t, struct ggml_tensor *w,
                                 struct ggml_tensor *b, struct ggml_tensor *alpha1, struct ggml_tensor *inv1,
                                 struct ggml_tensor *alpha2, struct ggml_tensor *inv2, int dil, bool same) {
    const int64_t C = w->ne[0], K = w->ne[1], L = t->ne[0];
    const int64_t n = same ? L : L - (int64_t)dil * (K - 1);
    struct ggml_tensor *vec[5] = {b, alpha1, inv1, alpha2, inv2};
    bool ok = t->type == GGML_TYPE_F32 && w->type == GGML_TYPE_F32 && ggml_is_contiguous(t) &&
              ggml_is_contiguous(w) && t->ne[2] == C && t->ne[3] == 1 && w->ne[2] == 1 && w->ne[3] == 1 &&
              K >= 1 && K <= CR_UNIT_CORE_MAX_TAPS && dil >= 1 && (int64_t)dil * (K - 1) <= CR_UNIT_CORE_MAX_SPAN &&
              n >= 1;
    for (int i = 0; i < 5 && ok; i++) {
        ok = vec[i] && vec[i]->type == GGML_TYPE_F32 && ggml_is_contiguous(vec[i]) && ggml_nelements(vec[i]) == C;
    }
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[7] = {t, w, b, alpha1, inv1, alpha2, inv2};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, C, n, t->ne[1], 1, args, 7, cr_unit_core_cpu, GGML_N_TASKS_MAX,
                          cr_unit_core_pack((cr_unit_core_params){.dil = dil, .same = same}));
}

/* dst (S + t, b, c) = ((y[t + n b, c] + bias[c]) + x(t, b, c)) * mask(t, b), in the composed
   ops' order (two adds, then the mask's product where a masked graph has one), after the S
   frames dst (s, b, c) = prefix(s, b, c) where the op has a prefix (the next layer's state:
   what ggml_concat(prefix, out) would hold). One task per range of (b, c) rows. */
void cr_unit_tail_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    (void)user;
    const struct ggml_tensor *y = dst->src[0], *bias = dst->src[1], *x = dst->src[2], *mask = dst->src[3],
                             *pre = dst->src[4];
    const int64_t L = dst->ne[0], B = dst->ne[1], C = dst->ne[2], S = pre ? pre->ne[0] : 0, n = L - S;
    const float *yd = (const float *)y->data, *bd = (const float *)bias->data;
    const float *md = mask ? (const float *)mask->data : NULL;
    const char *xd = (const char *)x->data;
    float *od = (float *)dst->data;
    const int64_t rows = B * C, r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t c = r / B, b = r % B;
        const float *xr = (const float *)(xd + b * x->nb[1] + c * x->nb[2]);
        const float *yr = yd + r * n;
        float *o = pre ? cr_prefix_row(od + r * L, pre, b, c) : od + r * L;
        if (md) {
            const float *mr = md + b * n;
            for (int64_t t = 0; t < n; t++) {
                o[t] = ((yr[t] + bd[c]) + xr[t]) * mr[t];
            }
        } else {
            for (int64_t t = 0; t < n; t++) {
                o[t] = (yr[t] + bd[c]) + xr[t];
            }
        }
    }
}

struct ggml_tensor *cr_unit_tail(struct ggml_context *ctx, struct ggml_tensor *y, struct ggml_tensor *b,
                                 struct ggml_tensor *x, struct ggml_tensor *mask, struct ggml_tensor *prefix) {
    const int64_t n = x->ne[0], B = x->ne[1], C = x->ne[2];
    bool ok = y->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32 && x->type == GGML_TYPE_F32 &&
              ggml_is_contiguous(y) && ggml_is_contiguous(b) && ggml_nelements(b) == C &&
              y->ne[0] == n * B && y->ne[1] == C && y->ne[2] == 1 && y->ne[3] == 1 && x->ne[3] == 1 &&
              x->nb[0] == sizeof(float);
    if (ok && mask) {
        ok = mask->type == GGML_TYPE_F32 && ggml_is_contiguous(mask) && ggml_nelements(mask) == n * B;
    }
    if (ok && prefix) {
        ok = cr_prefix_fits(prefix, B, C);
    }
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[5] = {y, b, x, mask, prefix};
    const int64_t S = prefix ? prefix->ne[0] : 0;
    return ggml_custom_4d(ctx, GGML_TYPE_F32, S + n, B, C, 1, args, prefix ? 5 : mask ? 4 : 3, cr_unit_tail_cpu,
                          GGML_N_TASKS_MAX, NULL);
}
