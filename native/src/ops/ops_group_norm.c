/*
 * ops_group_norm.c: GroupNorm on the channels-fastest layout [C, T, B] for the
 * CPU backend, one pass of statistics per group instead of the composed graph's
 * sums, transposes and broadcast subtract and divide (vocos.c, vc_group_norm):
 * ggml's CPU broadcast of a [1, G, 1, B] operand over [C/G, G, T, B] goes one
 * element per call, and the chain took 12 % of a WavTokenizer 75 BF16 decode on
 * 2 cores (CODECRT_PROFILE_OPS). GPU graphs keep the composed form.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

/*
 * dst [C, T, B] = GroupNorm(x) * w + b, groups of C/G adjacent channels, statistics
 * over a group's channels and the sequence's valid frames (mask [T, B] of ones and
 * zeros, or none: all T), mean then the biased variance of the deviations, both
 * summed in double; a padded frame's output is b, as the composed graph's. One task
 * per (sequence, group): a sequence's output never depends on the others (batch
 * invariance). user: G in the low 32 bits, eps's float bits in the high 32.
 */
static void cr_group_norm_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2], *mask = dst->src[3];
    const uint64_t u = (uint64_t)(uintptr_t)user;
    const int64_t G = (int64_t)(u & 0xffffffffu);
    const uint32_t eps_bits = (uint32_t)(u >> 32);
    float eps;
    memcpy(&eps, &eps_bits, sizeof(eps));
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], cg = C / G;
    const int64_t n = B * G, t0 = n * ith / nth, t1 = n * (ith + 1) / nth;
    const float *xd = (const float *)x->data, *wd = (const float *)w->data, *bd = (const float *)b->data;
    const float *md = mask ? (const float *)mask->data : NULL;
    float *yd = (float *)dst->data;
    for (int64_t task = t0; task < t1; task++) {
        const int64_t bb = task / G, c0 = (task % G) * cg;
        const float *xs = xd + bb * T * C + c0;
        float *ys = yd + bb * T * C + c0;
        const float *ms = md ? md + bb * T : NULL;
        int64_t valid = 0;
        double sum = 0.0;
        for (int64_t t = 0; t < T; t++) {
            if (ms && ms[t] == 0.0f) {
                continue;
            }
            valid++;
            for (int64_t c = 0; c < cg; c++) {
                sum += xs[t * C + c];
            }
        }
        const double count = (double)(valid > 0 ? valid : 1) * (double)cg;
        const float mean = (float)(sum / count);
        double sq = 0.0;
        for (int64_t t = 0; t < T; t++) {
            if (ms && ms[t] == 0.0f) {
                continue;
            }
            for (int64_t c = 0; c < cg; c++) {
                const double d = (double)(xs[t * C + c] - mean);
                sq += d * d;
            }
        }
        const float inv = 1.0f / sqrtf((float)(sq / count) + eps);
        for (int64_t t = 0; t < T; t++) {
            const float keep = ms ? ms[t] : 1.0f;
            for (int64_t c = 0; c < cg; c++) {
                ys[t * C + c] = (xs[t * C + c] - mean) * inv * keep * wd[c0 + c] + bd[c0 + c];
            }
        }
    }
}

struct ggml_tensor *cr_group_norm_cpu(struct ggml_context *ctx, struct ggml_tensor *x, int n_groups,
                                      struct ggml_tensor *w, struct ggml_tensor *b, struct ggml_tensor *mask,
                                      float eps) {
    const int64_t C = x->ne[0];
    const bool ok = x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && x->ne[3] == 1 && n_groups > 0 &&
                    C % n_groups == 0 && w->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32 &&
                    ggml_is_contiguous(w) && ggml_is_contiguous(b) && ggml_nelements(w) == C &&
                    ggml_nelements(b) == C &&
                    (!mask || (mask->type == GGML_TYPE_F32 && ggml_is_contiguous(mask) &&
                               ggml_nelements(mask) == x->ne[1] * x->ne[2]));
    if (!ok || sizeof(void *) < 8) { /* the settings ride in the user pointer's 64 bits */
        return NULL;
    }
    uint32_t eps_bits;
    memcpy(&eps_bits, &eps, sizeof(eps_bits));
    struct ggml_tensor *args[4] = {x, w, b, mask};
    void *user = (void *)(uintptr_t)(((uint64_t)eps_bits << 32) | (uint64_t)(uint32_t)n_groups);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], x->ne[2], 1, args, mask ? 4 : 3,
                          cr_group_norm_kernel, GGML_N_TASKS_MAX, user);
}
