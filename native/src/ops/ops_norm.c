/*
 * ops_norm.c: LayerNorm and RMSNorm over the channels of each row, with their affine
 * weights (and a Mish after them if asked), in one pass per row. Composed, each is ggml's
 * NORM or RMS_NORM and then a product and a sum over the whole tensor (and Mish's three):
 * three passes over memory and more. On the CPU backend ggml's norms run one row per call
 * of scalar code (the Vocos codecs' ConvNeXt blocks and transformers take this op there);
 * on CUDA the codecrt ops backend runs its kernel (cuda/cuda_ops.cu: a warp a row, the row
 * in registers), which S3Gen's flow estimator takes for its 140 norms an Euler step.
 *
 * A ggml custom op (GGML_OP_CUSTOM) whose function below is its CPU implementation
 * (native/tests/test_ops_cpu.c checks it against a double reference); the CUDA kernel is
 * checked against it in tests/native/test_gpu.py.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

/* torch's Mish, x tanh(softplus(x)), softplus x above 20 */
static inline float norm_mish(float x) {
    return x * tanhf(x > 20.0f ? x : log1pf(expf(x)));
}

void cr_norm_rows_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const cr_norm_params p = cr_norm_unpack(user);
    const int64_t C = x->ne[0], rows = ggml_nrows(x), r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    const float *wd = (const float *)w->data, *bd = b ? (const float *)b->data : NULL;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = (const float *)x->data + r * C;
        float *yr = (float *)dst->data + r * C;
        float mean = 0.0f;
        if (!p.rms) {
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
        const float inv = 1.0f / sqrtf((float)(sq / (double)C) + p.eps);
        if (bd) {
            for (int64_t c = 0; c < C; c++) {
                yr[c] = (xr[c] - mean) * inv * wd[c] + bd[c];
            }
        } else {
            for (int64_t c = 0; c < C; c++) {
                yr[c] = (xr[c] - mean) * inv * wd[c];
            }
        }
        if (p.mish) {
            for (int64_t c = 0; c < C; c++) {
                yr[c] = norm_mish(yr[c]);
            }
        }
    }
}

struct ggml_tensor *cr_norm_rows(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                 struct ggml_tensor *b, float eps, bool rms, bool mish) {
    const int64_t C = x->ne[0];
    const bool ok = x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && w->type == GGML_TYPE_F32 &&
                    ggml_is_contiguous(w) && ggml_nelements(w) == C && C >= 1 && isfinite(eps) && eps >= 0.0f &&
                    (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == C));
    if (!ok || sizeof(void *) < 8) { /* the settings ride in the user pointer's 64 bits */
        return NULL;
    }
    struct ggml_tensor *args[3] = {x, w, b};
    const cr_norm_params p = {.eps = eps, .rms = rms, .mish = mish};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], x->ne[2], x->ne[3], args, b ? 3 : 2,
                          cr_norm_rows_cpu, GGML_N_TASKS_MAX, cr_norm_pack(p));
}
