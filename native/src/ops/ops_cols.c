/*
 * ops_cols.c: the column matrix of a stride-1 convolution, built from a channels-fastest
 * input as one op, optionally with a Snake applied to every value it reads.
 *
 * ggml's im2col reads time-fastest rows: a channels-fastest activation ([C, T, B], what a
 * product leaves) is transposed and padded first, and its CUDA kernel divides 64-bit
 * indices per element and reads each warp's values from a column per channel. In S3Gen's
 * vocoder that took 26 % of a 64-stream Turbo tick's kernel time on an H100 (108 ms of
 * 414, docs/benchmarks.md), and the transposes before it another 30 ms. This op reads the
 * channels-fastest input where it lies: column (t, b) is K input frames of C channels, the
 * padding a test, no copy before it. HiFT's ResBlocks put a Snake before every conv; with
 * `snake` the op applies it to each value as it gathers it, which spares the five
 * element-wise passes of the composed Snake (the Snake's output feeds only the conv).
 *
 * A ggml custom op (GGML_OP_CUSTOM) whose function below is its CPU implementation (the
 * portable graphs, and the vocoder's convs on CPUs without the fused convolution;
 * native/tests/test_layers.c checks it against ggml's im2col); on CUDA the codecrt ops
 * backend runs its kernel, checked against this function (tests/native/test_gpu.py).
 */
#include <math.h>

#include "internal.h"

void cr_cols_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *x = dst->src[0];
    const cr_cols_params p = cr_cols_unpack(user);
    const float *alpha = p.snake ? (const float *)dst->src[1]->data : NULL;
    const float *inv = p.snake ? (const float *)dst->src[2]->data : NULL;
    const int64_t C = x->ne[0], T = x->ne[1], K = p.k, To = dst->ne[1];
    const int64_t cols = To * dst->ne[2];
    const int64_t j0 = cols * ith / nth, j1 = cols * (ith + 1) / nth;
    const float *src[CR_COLS_MAX_TAPS];
    for (int64_t j = j0; j < j1; j++) {
        const int64_t b = j / To, t = j % To;
        float *out = (float *)dst->data + j * K * C;
        for (int64_t k = 0; k < K; k++) {
            const int64_t s = t + k * p.d - p.pl;
            src[k] = s >= 0 && s < T ? (const float *)x->data + (b * T + s) * C : NULL;
        }
        for (int64_t c = 0; c < C; c++) {
            for (int64_t k = 0; k < K; k++) {
                float v = src[k] ? src[k][c] : 0.0f;
                if (alpha && src[k]) {
                    const float s = sinf(v * alpha[c]);
                    v = v + (s * s) * inv[c];
                }
                out[c * K + k] = v;
            }
        }
    }
}

struct ggml_tensor *cr_cols(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *alpha,
                            struct ggml_tensor *inv, int k, int d, int pl, int pr) {
    if (sizeof(void *) < sizeof(uint64_t) || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) || x->ne[3] != 1 ||
        k < 1 || k > CR_COLS_MAX_TAPS || d < 1 || d > CR_COLS_MAX_REACH || pl < 0 || pl > CR_COLS_MAX_REACH ||
        pr < 0 || pr > CR_COLS_MAX_REACH || (!alpha) != (!inv)) {
        return NULL;
    }
    if (alpha && (alpha->type != GGML_TYPE_F32 || inv->type != GGML_TYPE_F32 || !ggml_is_contiguous(alpha) ||
                  !ggml_is_contiguous(inv) || ggml_nelements(alpha) != x->ne[0] ||
                  ggml_nelements(inv) != x->ne[0])) {
        return NULL;
    }
    const int64_t To = x->ne[1] + pl + pr - (int64_t)d * (k - 1);
    if (To < 1) {
        return NULL;
    }
    const cr_cols_params p = {.k = k, .d = d, .pl = pl, .pr = pr, .snake = alpha != NULL};
    struct ggml_tensor *args[3] = {x, alpha, inv};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0] * k, To, x->ne[2], 1, args, alpha ? 3 : 1, cr_cols_cpu,
                          GGML_N_TASKS_MAX, cr_cols_pack(p));
}
