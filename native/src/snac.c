/*
 * snac.c: the SNAC decoder (hubertsiuzdak/snac), 24, 32 and 44 kHz models.
 *
 * Activations are F32 [C, T, B]: channels fastest, then time, then batch. That
 * makes 1x1 convolutions plain matrix products, LayerNorm a row norm, and
 * per-channel parameters broadcast rows. Decoder path (shapes per sequence):
 *
 *   codes_l [T/s_l] -> get_rows(codebook) [H, T/s_l] -> out_proj [L, T/s_l]
 *     -> repeat each frame s_l times [L, T]; sum over levels      (quantizer)
 *   depthwise conv k7 [L, T] -> 1x1 conv [D, T]
 *   (32/44 kHz) LocalMHA over windows of W frames, rotary NEOX positions t % W
 *   for each block i: Snake -> ConvTranspose(stride s_i) [C_{i+1}, T*s_0..s_i]
 *     -> NoiseBlock x + n * (Wn x) -> 3 x ResidualUnit (Snake, depthwise k7
 *     dilated 1/3/9, Snake, 1x1, + residual)
 *   Snake -> conv k7 to one channel -> tanh -> [1, T*hop]
 *
 * When the graph is bucketed (masked), every tensor is multiplied by a 0/1 time
 * mask after each operation that could make padded positions non-zero before a
 * time-mixing operation reads them. With zeros beyond the valid length, every
 * convolution sees exactly the zero padding of an unpadded decode, so padding
 * never changes the valid samples.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define SNAC_MAX_BLOCKS 8
#define SNAC_MAX_LEVELS 8
#define SNAC_HEAD_DIM 64
#define SNAC_DW_K 7

typedef struct snac_hparams {
    int32_t sampling_rate;
    int32_t hop_length;
    int32_t latent_dim;
    int32_t decoder_dim;
    int32_t n_blocks;
    int32_t rates[SNAC_MAX_BLOCKS];
    int32_t window;        /* attention window in frames, 0 = none */
    int32_t codebook_size;
    int32_t codebook_dim;
    int32_t n_levels;
    int32_t strides[SNAC_MAX_LEVELS];
    bool noise;
    bool depthwise;
} snac_hparams;

/* Indices into the graph's io[] table. */
enum {
    SNAC_IO_OUT = 0,
    SNAC_IO_POS = 1,
    SNAC_IO_CODES = 2,                              /* + level */
    SNAC_IO_NOISE = SNAC_IO_CODES + SNAC_MAX_LEVELS, /* + block */
    SNAC_IO_MASK = SNAC_IO_NOISE + SNAC_MAX_BLOCKS,  /* + resolution: 0 latent, 1+i block i */
    SNAC_IO_END = SNAC_IO_MASK + SNAC_MAX_BLOCKS + 1
};
_Static_assert(SNAC_IO_END <= CR_MAX_IO, "io table too small");

/* --------------------------------------------------------- hyperparameters */

static codecrt_status snac_get_u32(const struct gguf_context *g, const char *key, int32_t *out,
                                   cr_err *err) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is missing", key);
    }
    const enum gguf_type t = gguf_get_kv_type(g, id);
    uint64_t v;
    switch (t) {
    case GGUF_TYPE_UINT32: v = gguf_get_val_u32(g, id); break;
    case GGUF_TYPE_INT32: {
        const int32_t s = gguf_get_val_i32(g, id);
        if (s < 0) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is negative", key);
        }
        v = (uint64_t)s;
        break;
    }
    default:
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' has type %s, expected u32", key,
                       gguf_type_name(t));
    }
    if (v > (1u << 30)) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' = %llu is out of range", key,
                       (unsigned long long)v);
    }
    *out = (int32_t)v;
    return CODECRT_OK;
}

static codecrt_status snac_get_bool(const struct gguf_context *g, const char *key, bool *out,
                                    cr_err *err) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is missing", key);
    }
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_BOOL) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' must be a bool", key);
    }
    *out = gguf_get_val_bool(g, id);
    return CODECRT_OK;
}

static codecrt_status snac_get_i32_array(const struct gguf_context *g, const char *key, int32_t *out,
                                         int32_t max_n, int32_t *n_out, cr_err *err) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is missing", key);
    }
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_ARRAY ||
        (gguf_get_arr_type(g, id) != GGUF_TYPE_INT32 && gguf_get_arr_type(g, id) != GGUF_TYPE_UINT32)) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' must be an array of int32", key);
    }
    const size_t n = gguf_get_arr_n(g, id);
    if (n == 0 || n > (size_t)max_n) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' has %zu entries (1..%d allowed)",
                       key, n, max_n);
    }
    const int32_t *data = gguf_get_arr_data(g, id);
    for (size_t i = 0; i < n; i++) {
        if (data[i] < 1 || data[i] > 64) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s'[%zu] = %d is out of range",
                           key, i, data[i]);
        }
        out[i] = data[i];
    }
    *n_out = (int32_t)n;
    return CODECRT_OK;
}

static codecrt_status snac_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    snac_hparams *hp = hp_;
    codecrt_status st;
    if ((st = snac_get_u32(g, "snac.sampling_rate", &hp->sampling_rate, err)) ||
        (st = snac_get_u32(g, "snac.hop_length", &hp->hop_length, err)) ||
        (st = snac_get_u32(g, "snac.latent_dim", &hp->latent_dim, err)) ||
        (st = snac_get_u32(g, "snac.decoder_dim", &hp->decoder_dim, err)) ||
        (st = snac_get_i32_array(g, "snac.decoder_rates", hp->rates, SNAC_MAX_BLOCKS, &hp->n_blocks, err)) ||
        (st = snac_get_u32(g, "snac.attn_window_size", &hp->window, err)) ||
        (st = snac_get_u32(g, "snac.codebook_size", &hp->codebook_size, err)) ||
        (st = snac_get_u32(g, "snac.codebook_dim", &hp->codebook_dim, err)) ||
        (st = snac_get_i32_array(g, "snac.vq_strides", hp->strides, SNAC_MAX_LEVELS, &hp->n_levels, err)) ||
        (st = snac_get_bool(g, "snac.noise", &hp->noise, err)) ||
        (st = snac_get_bool(g, "snac.depthwise", &hp->depthwise, err))) {
        return st;
    }
    if (!hp->depthwise) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "snac.depthwise = false is not supported");
    }
    if (hp->sampling_rate < 1000 || hp->latent_dim < 1 || hp->codebook_size < 1 || hp->codebook_dim < 1) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "snac hyperparameters out of range");
    }
    int64_t hop = 1;
    for (int i = 0; i < hp->n_blocks; i++) {
        hop *= hp->rates[i];
    }
    if (hop != hp->hop_length) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "snac.hop_length = %d but prod(decoder_rates) = %lld",
                       hp->hop_length, (long long)hop);
    }
    if (hp->decoder_dim % (1 << hp->n_blocks) != 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "snac.decoder_dim = %d is not divisible by 2^%d",
                       hp->decoder_dim, hp->n_blocks);
    }
    if (hp->window > 0 && (hp->decoder_dim % SNAC_HEAD_DIM != 0 || hp->window > 4096)) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS,
                       "snac attention needs decoder_dim a multiple of %d and a window <= 4096",
                       SNAC_HEAD_DIM);
    }
    return CODECRT_OK;
}

static int32_t snac_gcd(int32_t a, int32_t b) {
    while (b) {
        const int32_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void snac_fill_info(const void *hp_, codecrt_model_info *info) {
    const snac_hparams *hp = hp_;
    info->sample_rate = hp->sampling_rate;
    info->hop_length = hp->hop_length;
    info->n_levels = hp->n_levels;
    int32_t mult = 1;
    for (int l = 0; l < hp->n_levels; l++) {
        info->codebook_size[l] = hp->codebook_size;
        info->level_stride[l] = hp->strides[l];
        mult = mult / snac_gcd(mult, hp->strides[l]) * hp->strides[l];
    }
    if (hp->window > 0) {
        mult = mult / snac_gcd(mult, hp->window) * hp->window;
    }
    info->frame_multiple = mult;
}

/* ------------------------------------------------------------ tensor specs */

static int32_t snac_channels(const snac_hparams *hp, int i) { return hp->decoder_dim >> i; }

static void snac_snake_specs(cr_spec_list *s, int64_t c, const char *prefix) {
    cr_spec_add(s, false, 1, c, 1, "%s.alpha", prefix);
    cr_spec_add(s, false, 1, c, 1, "%s.inv_alpha", prefix);
}

static void snac_tensor_specs(const void *hp_, cr_spec_list *s) {
    const snac_hparams *hp = hp_;
    const int64_t L = hp->latent_dim, D = hp->decoder_dim, H = hp->codebook_dim, N = hp->codebook_size;
    for (int l = 0; l < hp->n_levels; l++) {
        cr_spec_add(s, false, 2, H, N, "quantizer.%d.codebook", l);
        cr_spec_add(s, false, 2, H, L, "quantizer.%d.out_proj.weight", l);
        cr_spec_add(s, false, 1, L, 1, "quantizer.%d.out_proj.bias", l);
    }
    cr_spec_add(s, false, 2, L, SNAC_DW_K, "decoder.in_dw.weight");
    cr_spec_add(s, false, 1, L, 1, "decoder.in_dw.bias");
    cr_spec_add(s, true, 2, L, D, "decoder.in_pw.weight");
    cr_spec_add(s, false, 1, D, 1, "decoder.in_pw.bias");
    if (hp->window > 0) {
        cr_spec_add(s, false, 1, D, 1, "decoder.attn.norm.weight");
        cr_spec_add(s, false, 1, D, 1, "decoder.attn.norm.bias");
        cr_spec_add(s, true, 2, D, 3 * D, "decoder.attn.qkv.weight");
        cr_spec_add(s, true, 2, D, D, "decoder.attn.out.weight");
    }
    char p[64];
    for (int i = 0; i < hp->n_blocks; i++) {
        const int64_t ci = snac_channels(hp, i), co = snac_channels(hp, i + 1), k = 2 * hp->rates[i];
        snprintf(p, sizeof(p), "decoder.block.%d.snake", i);
        snac_snake_specs(s, ci, p);
        cr_spec_add(s, true, 2, ci, k * co, "decoder.block.%d.up.weight", i);
        cr_spec_add(s, false, 1, co, 1, "decoder.block.%d.up.bias", i);
        if (hp->noise) {
            cr_spec_add(s, true, 2, co, co, "decoder.block.%d.noise.weight", i);
        }
        for (int j = 0; j < 3; j++) {
            snprintf(p, sizeof(p), "decoder.block.%d.res.%d.snake1", i, j);
            snac_snake_specs(s, co, p);
            cr_spec_add(s, false, 2, co, SNAC_DW_K, "decoder.block.%d.res.%d.dw.weight", i, j);
            cr_spec_add(s, false, 1, co, 1, "decoder.block.%d.res.%d.dw.bias", i, j);
            snprintf(p, sizeof(p), "decoder.block.%d.res.%d.snake2", i, j);
            snac_snake_specs(s, co, p);
            cr_spec_add(s, true, 2, co, co, "decoder.block.%d.res.%d.pw.weight", i, j);
            cr_spec_add(s, false, 1, co, 1, "decoder.block.%d.res.%d.pw.bias", i, j);
        }
    }
    const int64_t cn = snac_channels(hp, hp->n_blocks);
    snac_snake_specs(s, cn, "decoder.out_snake");
    cr_spec_add(s, true, 2, cn, SNAC_DW_K, "decoder.out.weight");
    cr_spec_add(s, false, 1, 1, 1, "decoder.out.bias");
}

/* ----------------------------------------------------------- graph pieces */

static struct ggml_tensor *W(struct ggml_context *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Weight lookup by name; names were validated at load, so this cannot miss. */
static struct ggml_tensor *W(struct ggml_context *w, const char *fmt, ...) {
    char name[GGML_MAX_NAME];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    return ggml_get_tensor(w, name);
}

/* x + inv_alpha * sin(alpha * x)^2, per channel. x: [C, T, B]. */
static struct ggml_tensor *snac_snake(struct ggml_context *ctx, struct ggml_tensor *x,
                                      struct ggml_tensor *alpha, struct ggml_tensor *inv_alpha) {
    struct ggml_tensor *y = ggml_mul(ctx, x, alpha);
    y = ggml_sin(ctx, y);
    y = ggml_sqr(ctx, y);
    y = ggml_mul(ctx, y, inv_alpha);
    return ggml_add(ctx, x, y);
}

static struct ggml_tensor *snac_snake_named(struct ggml_context *ctx, struct ggml_context *w,
                                            struct ggml_tensor *x, const char *prefix) {
    return snac_snake(ctx, x, W(w, "%s.alpha", prefix), W(w, "%s.inv_alpha", prefix));
}

/*
 * Depthwise conv, "same" length. x: [C, T, B] contiguous, w: [C, K], b: [C].
 * Runs as ggml's direct depthwise 2-D conv on a channels-last (CWHN) view, so
 * the padding is implicit and the product stays F32.
 */
static struct ggml_tensor *snac_dwconv(struct ggml_context *ctx, struct ggml_tensor *x,
                                       struct ggml_tensor *w, struct ggml_tensor *b, int dilation) {
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], K = w->ne[1];
    /* input as ne [T, 1, C, B] with nb [4C, 4CT, 4, 4CT] */
    struct ggml_tensor *xv = ggml_permute(ctx, ggml_reshape_4d(ctx, x, C, T, 1, B), 2, 0, 1, 3);
    /* kernel as ne [K, 1, 1, C] with channels fastest in memory */
    struct ggml_tensor *wv = ggml_permute(ctx, ggml_reshape_4d(ctx, w, C, 1, K, 1), 3, 2, 0, 1);
    const int pad = (int)(dilation * (K - 1) / 2);
    struct ggml_tensor *y = ggml_conv_2d_dw_direct(ctx, wv, xv, 1, 1, pad, 0, dilation, 1);
    /* result is ne [T, 1, C, B] laid out as [C, T, B]: view it back */
    y = ggml_permute(ctx, y, 1, 2, 0, 3);
    y = ggml_reshape_3d(ctx, y, C, T, B);
    return ggml_add(ctx, y, b);
}

/* 1x1 conv: w [Cin, Cout], x [Cin, T, B] -> [Cout, T, B]. */
static struct ggml_tensor *snac_pwconv(struct ggml_context *ctx, struct ggml_tensor *x,
                                       struct ggml_tensor *w, struct ggml_tensor *b) {
    struct ggml_tensor *y = ggml_mul_mat(ctx, w, x);
    return b ? ggml_add(ctx, y, b) : y;
}

/*
 * ConvTranspose1d with kernel 2s, stride s, padding ceil(s/2), output padding
 * s % 2, as one matrix product and an overlap of two halves.
 * x: [Cin, T, B], w: [Cin, 2s*Cout] (row k*Cout + oc), b: [Cout] -> [Cout, T*s, B].
 *
 * cols[k*Cout + oc, t] lands at uncropped sample t*s + k. With k < 2s, output
 * block j (s samples) is cols_lo[:, j] + cols_hi[:, j-1]; the crop takes
 * samples from ceil(s/2).
 */
static struct ggml_tensor *snac_upconv(struct ggml_context *ctx, struct ggml_tensor *x,
                                       struct ggml_tensor *w, struct ggml_tensor *b, int s) {
    const int64_t T = x->ne[1], B = x->ne[2], Cout = b->ne[0];
    const int p = (s + 1) / 2;
    struct ggml_tensor *cols = ggml_mul_mat(ctx, w, x); /* [2s*Cout, T, B] */
    const size_t half = (size_t)(s * Cout) * sizeof(float);
    struct ggml_tensor *lo = ggml_view_3d(ctx, cols, s * Cout, T, B, cols->nb[1], cols->nb[2], 0);
    struct ggml_tensor *hi = ggml_view_3d(ctx, cols, s * Cout, T, B, cols->nb[1], cols->nb[2], half);
    lo = ggml_pad_ext(ctx, lo, 0, 0, 0, 1, 0, 0, 0, 0); /* [s*Cout, T+1, B] */
    hi = ggml_pad_ext(ctx, hi, 0, 0, 1, 0, 0, 0, 0, 0);
    struct ggml_tensor *y = ggml_add(ctx, lo, hi);      /* = [Cout, s*(T+1), B] */
    y = ggml_view_3d(ctx, y, Cout, T * s, B, (size_t)Cout * sizeof(float), y->nb[2],
                     (size_t)(p * Cout) * sizeof(float));
    return ggml_add(ctx, y, b);
}

/*
 * Conv1d "same" with a few output channels. x: [Cin, T, B], w: [Cin, K*Cout]
 * (row k*Cout + oc), b: [Cout] -> [Cout, T, B]. One product over the padded
 * input, then the K shifted diagonals summed.
 */
static struct ggml_tensor *snac_conv_small(struct ggml_context *ctx, struct ggml_tensor *x,
                                           struct ggml_tensor *w, struct ggml_tensor *b) {
    const int64_t T = x->ne[1], B = x->ne[2], Cout = b->ne[0];
    const int64_t K = w->ne[1] / Cout;
    const int pad = (int)((K - 1) / 2);
    struct ggml_tensor *xp = ggml_pad_ext(ctx, x, 0, 0, pad, pad, 0, 0, 0, 0);
    struct ggml_tensor *z = ggml_mul_mat(ctx, w, xp); /* [K*Cout, T+2p, B] */
    struct ggml_tensor *y = NULL;
    for (int64_t k = 0; k < K; k++) {
        struct ggml_tensor *v = ggml_view_3d(ctx, z, Cout, T, B, z->nb[1], z->nb[2],
                                             (size_t)(k * Cout) * sizeof(float) + (size_t)k * z->nb[1]);
        y = y ? ggml_add(ctx, y, v) : ggml_cont(ctx, v);
    }
    return ggml_add(ctx, y, b);
}

/* Local windowed attention with rotary positions. x: [D, T, B] -> [D, T, B]. */
static struct ggml_tensor *snac_attention(struct ggml_context *ctx, struct ggml_context *w,
                                          struct ggml_tensor *x, struct ggml_tensor *pos, int window) {
    const int64_t D = x->ne[0], T = x->ne[1], B = x->ne[2];
    const int64_t nh = D / SNAC_HEAD_DIM, nw = T / window, hd = SNAC_HEAD_DIM;
    struct ggml_tensor *h = ggml_norm(ctx, x, 1e-5f);
    h = ggml_add(ctx, ggml_mul(ctx, h, W(w, "decoder.attn.norm.weight")), W(w, "decoder.attn.norm.bias"));
    struct ggml_tensor *qkv = ggml_mul_mat(ctx, W(w, "decoder.attn.qkv.weight"), h); /* [3D, T, B] */
    const size_t row = qkv->nb[1];
    /* [hd, nh, T*B] views: channel h*hd + d of q, k, v */
    struct ggml_tensor *q = ggml_view_3d(ctx, qkv, hd, nh, T * B, hd * sizeof(float), row, 0);
    struct ggml_tensor *k = ggml_view_3d(ctx, qkv, hd, nh, T * B, hd * sizeof(float), row, D * sizeof(float));
    struct ggml_tensor *v = ggml_view_3d(ctx, qkv, hd, nh, T * B, hd * sizeof(float), row, 2 * D * sizeof(float));
    q = ggml_rope_ext(ctx, q, pos, NULL, (int)hd, GGML_ROPE_TYPE_NEOX, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    k = ggml_rope_ext(ctx, k, pos, NULL, (int)hd, GGML_ROPE_TYPE_NEOX, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    /* windows: [hd, nh, W, nw*B] -> [hd, W, nh, nw*B] */
    q = ggml_permute(ctx, ggml_reshape_4d(ctx, q, hd, nh, window, nw * B), 0, 2, 1, 3);
    k = ggml_permute(ctx, ggml_reshape_4d(ctx, k, hd, nh, window, nw * B), 0, 2, 1, 3);
    v = ggml_reshape_4d(ctx, ggml_cont(ctx, v), hd, nh, window, nw * B);
    v = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3)); /* [W, hd, nh, nw*B] */
    struct ggml_tensor *kq = ggml_mul_mat(ctx, k, q);       /* [W keys, W queries, nh, nw*B] */
    kq = ggml_soft_max_ext(ctx, kq, NULL, 1.0f / sqrtf((float)hd), 0.0f);
    struct ggml_tensor *o = ggml_mul_mat(ctx, v, kq);       /* [hd, W, nh, nw*B] */
    o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3));  /* [hd, nh, W, nw*B] */
    o = ggml_reshape_3d(ctx, o, D, T, B);
    o = ggml_mul_mat(ctx, W(w, "decoder.attn.out.weight"), o);
    return ggml_add(ctx, o, x);
}

static struct ggml_tensor *snac_input(struct ggml_context *ctx, enum ggml_type type, int64_t ne0,
                                      int64_t ne1, int64_t ne2, const char *name) {
    struct ggml_tensor *t = ggml_new_tensor_3d(ctx, type, ne0, ne1, ne2);
    ggml_set_name(t, name);
    ggml_set_input(t);
    return t;
}

static struct ggml_tensor *snac_mask(struct ggml_context *ctx, struct ggml_tensor *x,
                                     struct ggml_tensor *mask) {
    return mask ? ggml_mul(ctx, x, mask) : x;
}

static struct ggml_cgraph *snac_build_decode(const cr_model *model, struct ggml_context *ctx,
                                             struct ggml_context *w, const cr_decode_shape *shape,
                                             struct ggml_tensor **io) {
    const snac_hparams *hp = model->hparams;
    const int64_t T = shape->n_frames, B = shape->n_batch, L = hp->latent_dim;
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 4096, false);
    char name[32];

    struct ggml_tensor *masks[SNAC_MAX_BLOCKS + 1] = {0};
    if (shape->masked) {
        int64_t t = T;
        for (int r = 0; r <= hp->n_blocks; r++) {
            snprintf(name, sizeof(name), "mask.%d", r);
            masks[r] = io[SNAC_IO_MASK + r] = snac_input(ctx, GGML_TYPE_F32, 1, t, B, name);
            if (r < hp->n_blocks) {
                t *= hp->rates[r];
            }
        }
    }

    /* quantizer: sum over levels of out_proj(codebook[codes]) repeated to frame rate */
    struct ggml_tensor *z = NULL;
    for (int l = 0; l < hp->n_levels; l++) {
        const int64_t s = hp->strides[l], Tl = T / s;
        snprintf(name, sizeof(name), "codes.%d", l);
        struct ggml_tensor *codes = io[SNAC_IO_CODES + l] = snac_input(ctx, GGML_TYPE_I32, Tl * B, 1, 1, name);
        struct ggml_tensor *e = ggml_get_rows(ctx, W(w, "quantizer.%d.codebook", l), codes); /* [H, Tl*B] */
        struct ggml_tensor *y = snac_pwconv(ctx, e, W(w, "quantizer.%d.out_proj.weight", l),
                                            W(w, "quantizer.%d.out_proj.bias", l)); /* [L, Tl*B] */
        if (s > 1) {
            y = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, y, L, 1, Tl, B), L, s, Tl, B);
        }
        y = ggml_reshape_3d(ctx, y, L, T, B);
        z = z ? ggml_add(ctx, z, y) : y;
    }
    struct ggml_tensor *x = snac_mask(ctx, z, masks[0]);

    x = snac_dwconv(ctx, x, W(w, "decoder.in_dw.weight"), W(w, "decoder.in_dw.bias"), 1);
    x = snac_pwconv(ctx, x, W(w, "decoder.in_pw.weight"), W(w, "decoder.in_pw.bias"));
    if (hp->window > 0) {
        struct ggml_tensor *pos = io[SNAC_IO_POS] = snac_input(ctx, GGML_TYPE_I32, T * B, 1, 1, "pos");
        x = snac_attention(ctx, w, x, pos, hp->window);
    }
    x = snac_mask(ctx, x, masks[0]);

    int64_t t = T;
    char p[64];
    for (int i = 0; i < hp->n_blocks; i++) {
        const int s = hp->rates[i];
        t *= s;
        snprintf(p, sizeof(p), "decoder.block.%d.snake", i);
        x = snac_snake_named(ctx, w, x, p);
        x = snac_upconv(ctx, x, W(w, "decoder.block.%d.up.weight", i), W(w, "decoder.block.%d.up.bias", i), s);
        if (shape->noise && hp->noise) {
            snprintf(name, sizeof(name), "noise.%d", i);
            struct ggml_tensor *n = io[SNAC_IO_NOISE + i] = snac_input(ctx, GGML_TYPE_F32, 1, t, B, name);
            struct ggml_tensor *h = ggml_mul_mat(ctx, W(w, "decoder.block.%d.noise.weight", i), x);
            x = ggml_add(ctx, x, ggml_mul(ctx, h, n));
        }
        x = snac_mask(ctx, x, masks[i + 1]);
        int dil = 1;
        for (int j = 0; j < 3; j++, dil *= 3) {
            snprintf(p, sizeof(p), "decoder.block.%d.res.%d.snake1", i, j);
            struct ggml_tensor *y = snac_snake_named(ctx, w, x, p);
            y = snac_dwconv(ctx, y, W(w, "decoder.block.%d.res.%d.dw.weight", i, j),
                            W(w, "decoder.block.%d.res.%d.dw.bias", i, j), dil);
            snprintf(p, sizeof(p), "decoder.block.%d.res.%d.snake2", i, j);
            y = snac_snake_named(ctx, w, y, p);
            y = snac_pwconv(ctx, y, W(w, "decoder.block.%d.res.%d.pw.weight", i, j),
                            W(w, "decoder.block.%d.res.%d.pw.bias", i, j));
            x = snac_mask(ctx, ggml_add(ctx, x, y), masks[i + 1]);
        }
    }
    x = snac_snake_named(ctx, w, x, "decoder.out_snake");
    x = snac_conv_small(ctx, x, W(w, "decoder.out.weight"), W(w, "decoder.out.bias")); /* [1, T*hop, B] */
    x = ggml_tanh(ctx, x);
    ggml_set_name(x, "pcm");
    ggml_set_output(x);
    io[SNAC_IO_OUT] = x;
    ggml_build_forward_expand(gf, x);
    return gf;
}

/* ------------------------------------------------------------------ inputs */

static size_t snac_scratch_floats(const cr_model *model, const cr_decode_shape *shape) {
    const snac_hparams *hp = model->hparams;
    /* the largest single input: the finest noise or mask, or codes/positions */
    size_t t = (size_t)shape->n_frames;
    size_t biggest = t;
    for (int i = 0; i < hp->n_blocks; i++) {
        t *= (size_t)hp->rates[i];
        biggest = t > biggest ? t : biggest;
    }
    return biggest * (size_t)shape->n_batch;
}

static void snac_set_inputs(const cr_model *model, const cr_decode_shape *shape, struct ggml_tensor **io,
                            const cr_decode_inputs *in) {
    const snac_hparams *hp = model->hparams;
    const int64_t Tg = shape->n_frames, Bg = shape->n_batch;
    const int64_t Tv = in->n_frames, Bv = in->codes->n_batch;
    float *f = in->scratch;
    int32_t *iv = (int32_t *)in->scratch;

    for (int l = 0; l < hp->n_levels; l++) {
        const int64_t s = hp->strides[l], Tlg = Tg / s, Tlv = Tv / s;
        const int32_t *src = in->codes->levels[l];
        for (int64_t b = 0; b < Bg; b++) {
            for (int64_t t = 0; t < Tlg; t++) {
                iv[b * Tlg + t] = (b < Bv && t < Tlv) ? src[b * Tlv + t] : 0;
            }
        }
        ggml_backend_tensor_set(io[SNAC_IO_CODES + l], iv, 0, (size_t)(Tlg * Bg) * sizeof(int32_t));
    }
    if (io[SNAC_IO_POS]) {
        for (int64_t b = 0; b < Bg; b++) {
            for (int64_t t = 0; t < Tg; t++) {
                iv[b * Tg + t] = (int32_t)(t % hp->window);
            }
        }
        ggml_backend_tensor_set(io[SNAC_IO_POS], iv, 0, (size_t)(Tg * Bg) * sizeof(int32_t));
    }
    int64_t tg = Tg, tv = Tv;
    for (int i = 0; i < hp->n_blocks; i++) {
        tg *= hp->rates[i];
        tv *= hp->rates[i];
        if (io[SNAC_IO_NOISE + i]) {
            for (int64_t b = 0; b < Bg; b++) {
                const uint64_t seed = b < Bv ? in->seeds[b] : 0;
                for (int64_t t = 0; t < tg; t++) {
                    f[b * tg + t] = (b < Bv && t < tv) ? cr_noise_normal(seed, (uint32_t)i, (uint64_t)t) : 0.0f;
                }
            }
            ggml_backend_tensor_set(io[SNAC_IO_NOISE + i], f, 0, (size_t)(tg * Bg) * sizeof(float));
        }
    }
    if (shape->masked) {
        tg = Tg;
        tv = Tv;
        for (int r = 0; r <= hp->n_blocks; r++) {
            for (int64_t b = 0; b < Bg; b++) {
                for (int64_t t = 0; t < tg; t++) {
                    f[b * tg + t] = (b < Bv && t < tv) ? 1.0f : 0.0f;
                }
            }
            ggml_backend_tensor_set(io[SNAC_IO_MASK + r], f, 0, (size_t)(tg * Bg) * sizeof(float));
            if (r < hp->n_blocks) {
                tg *= hp->rates[r];
                tv *= hp->rates[r];
            }
        }
    }
}

const cr_arch cr_arch_snac = {
    .name = "snac",
    .hparams_size = sizeof(snac_hparams),
    .read_hparams = snac_read_hparams,
    .fill_info = snac_fill_info,
    .tensor_specs = snac_tensor_specs,
    .build_decode = snac_build_decode,
    .scratch_floats = snac_scratch_floats,
    .set_decode_inputs = snac_set_inputs,
};
