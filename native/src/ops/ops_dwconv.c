/*
 * ops_dwconv.c: the depthwise convolution on the channels-fastest layout
 * [C, T, B] for the CPU backend (SNAC's residual units and input conv, Qwen3's
 * upsample blocks, the Vocos codecs' ConvNeXt blocks). ggml's conv_2d_dw_direct
 * on a channels-last view of this layout ran at about 6 GFLOP/s here (a 7-tap,
 * 768-channel conv over 750 frames: 1.3 ms), 17 % of a SNAC decode; the loop
 * below runs along the channels, which are contiguous, so it vectorizes, and it
 * pads by skipping taps instead of copying. GPU graphs keep ggml's op.
 */
#include "internal.h"

/*
 * dst [C, T_out, B] = b + sum over taps k of w[k][c] x[t + k d - pl][c], zero outside
 * the sequence (T_out = T + pl + pr - d (K-1)); w ne [C, K] (PyTorch's (C, 1, K)
 * transposed), b [C] or absent. One task per range of output frames; a frame's sums in
 * tap order whatever the batch or threads, and a tap that reads padding adds nothing
 * (the same bits as adding the zero it would read). user: dilation (10 bits), pl and pr
 * (11 bits each), so that it fits a 32-bit pointer too.
 */
static void cr_dwconv_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const uint64_t u = (uint64_t)(uintptr_t)user;
    const int64_t d = (int64_t)(u & 0x3ff), pl = (int64_t)((u >> 10) & 0x7ff);
    const int64_t C = x->ne[0], T = x->ne[1], K = w->ne[1], To = dst->ne[1], B = dst->ne[2];
    const int64_t rows = To * B, r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    const float *xd = (const float *)x->data, *wd = (const float *)w->data;
    const float *bd = b ? (const float *)b->data : NULL;
    float *yd = (float *)dst->data;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t bb = r / To, t = r % To;
        float *y = yd + r * C;
        for (int64_t c = 0; c < C; c++) {
            y[c] = bd ? bd[c] : 0.0f;
        }
        for (int64_t k = 0; k < K; k++) {
            const int64_t s = t + k * d - pl;
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
                                  struct ggml_tensor *b, int dilation, int pl, int pr) {
    const int64_t To = x->ne[1] + pl + pr - (int64_t)dilation * (w->ne[1] - 1);
    const bool ok = x->type == GGML_TYPE_F32 && w->type == GGML_TYPE_F32 && ggml_is_contiguous(x) &&
                    ggml_is_contiguous(w) && x->ne[3] == 1 && w->ne[0] == x->ne[0] && w->ne[2] == 1 &&
                    w->ne[3] == 1 && dilation >= 1 && dilation < (1 << 10) && pl >= 0 && pl < (1 << 11) &&
                    pr >= 0 && pr < (1 << 11) && To >= 1 &&
                    (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == x->ne[0]));
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[3] = {x, w, b};
    void *user = (void *)(uintptr_t)((uint32_t)dilation | (uint32_t)pl << 10 | (uint32_t)pr << 21);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], To, x->ne[2], 1, args, b ? 3 : 2, cr_dwconv_kernel,
                          GGML_N_TASKS_MAX, user);
}
