/*
 * ops_norm.c: LayerNorm and RMSNorm over the channels of each row, with their
 * affine weights, in one pass per row for the CPU backend (the Vocos codecs'
 * ConvNeXt blocks and transformers). Composed, each is ggml's NORM or RMS_NORM
 * and then a product and a sum over the whole tensor: three passes over memory,
 * and ggml's CPU norms run one row per call of scalar code. GPU graphs keep
 * the composed form.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

/*
 * dst [C, rows] = norm(x) * w (+ b): LayerNorm (x - mean) / sqrt(var + eps), or with
 * rms, RMSNorm x / sqrt(mean(x^2) + eps); sums in double as ggml's. user: eps's float
 * bits, and bit 32 for rms. Rows are independent (batch invariance).
 */
static void cr_norm_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const uint64_t u = (uint64_t)(uintptr_t)user;
    const uint32_t eps_bits = (uint32_t)(u & 0xffffffffu);
    const bool rms = (u >> 32) & 1u;
    float eps;
    memcpy(&eps, &eps_bits, sizeof(eps));
    const int64_t C = x->ne[0], rows = ggml_nrows(x), r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    const float *wd = (const float *)w->data, *bd = b ? (const float *)b->data : NULL;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = (const float *)x->data + r * C;
        float *yr = (float *)dst->data + r * C;
        float mean = 0.0f;
        if (!rms) {
            double s = 0.0;
            for (int64_t c = 0; c < C; c++) {
                s += xr[c];
            }
            mean = (float)(s / (double)C);
        }
        double sq = 0.0;
        for (int64_t c = 0; c < C; c++) {
            const float d = xr[c] - mean;
            sq += (double)d * d;
        }
        const float inv = 1.0f / sqrtf((float)(sq / (double)C) + eps);
        if (bd) {
            for (int64_t c = 0; c < C; c++) {
                yr[c] = (xr[c] - mean) * inv * wd[c] + bd[c];
            }
        } else {
            for (int64_t c = 0; c < C; c++) {
                yr[c] = (xr[c] - mean) * inv * wd[c];
            }
        }
    }
}

struct ggml_tensor *cr_norm_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                struct ggml_tensor *b, float eps, bool rms) {
    const int64_t C = x->ne[0];
    const bool ok = x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && w->type == GGML_TYPE_F32 &&
                    ggml_is_contiguous(w) && ggml_nelements(w) == C &&
                    (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == C));
    if (!ok || sizeof(void *) < 8) { /* the settings ride in the user pointer's 64 bits */
        return NULL;
    }
    uint32_t eps_bits;
    memcpy(&eps_bits, &eps, sizeof(eps_bits));
    struct ggml_tensor *args[3] = {x, w, b};
    void *user = (void *)(uintptr_t)(((uint64_t)(rms ? 1u : 0u) << 32) | eps_bits);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], x->ne[2], x->ne[3], args, b ? 3 : 2,
                          cr_norm_kernel, GGML_N_TASKS_MAX, user);
}
