/*
 * ops_dwconv.c: the depthwise "same" convolution of the Vocos codecs' ConvNeXt
 * blocks on the channels-fastest layout [C, T, B] for the CPU backend. ggml's
 * conv_2d_dw_direct on this layout ran at about 6 GFLOP/s here (a 7-tap, 768-
 * channel conv over 750 frames took 1.3 ms of a 12-block WavTokenizer decode's
 * 15 ms of them on 2 cores); the loop below runs along the channels, which are
 * contiguous, so it vectorizes. GPU graphs keep ggml's op.
 */

#include "internal.h"

/*
 * dst [C, T, B] = b + sum over taps k of w[k][c] x[t + k - (K-1)/2][c] (zero outside
 * the sequence); w ne [C, K] (PyTorch's (C, 1, K) transposed), b [C]. One task per
 * range of output frames, a frame's sums in tap order whatever the batch or threads.
 */
static void cr_dwconv_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    (void)user;
    const struct ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], K = w->ne[1], pad = (K - 1) / 2;
    const int64_t rows = T * B, r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    const float *xd = (const float *)x->data, *wd = (const float *)w->data, *bd = (const float *)b->data;
    float *yd = (float *)dst->data;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t bb = r / T, t = r % T;
        float *y = yd + r * C;
        for (int64_t c = 0; c < C; c++) {
            y[c] = bd[c];
        }
        for (int64_t k = 0; k < K; k++) {
            const int64_t s = t + k - pad;
            if (s < 0 || s >= T) {
                continue;
            }
            const float *xs = xd + (bb * T + s) * C, *wk = wd + k * C;
            for (int64_t c = 0; c < C; c++) {
                y[c] += wk[c] * xs[c]; /* a product and a sum: fmaf is a libm call where the build has no FMA */
            }
        }
    }
}

struct ggml_tensor *cr_dwconv_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b) {
    const bool ok = x->type == GGML_TYPE_F32 && w->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32 &&
                    ggml_is_contiguous(x) && ggml_is_contiguous(w) && ggml_is_contiguous(b) && x->ne[3] == 1 &&
                    w->ne[0] == x->ne[0] && w->ne[1] % 2 == 1 && w->ne[2] == 1 && w->ne[3] == 1 &&
                    ggml_nelements(b) == x->ne[0];
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[3] = {x, w, b};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], x->ne[2], 1, args, 3, cr_dwconv_kernel,
                          GGML_N_TASKS_MAX, NULL);
}
