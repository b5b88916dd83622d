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
 *
 * The pieces are the shared layers (layers.h: convolutions, the transposed
 * convolution, Snake, residual units) and the stream state buffers
 * (stream_state.h); this file holds what is SNAC's own: hyperparameters,
 * tensor names, the local attention, the wiring, the stream's delays.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "layers.h"
#include "stream_state.h"

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

static codecrt_status snac_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    snac_hparams *hp = hp_;
    codecrt_status st;
    if ((st = cr_gguf_u32(g, "snac.sampling_rate", &hp->sampling_rate, err)) ||
        (st = cr_gguf_u32(g, "snac.hop_length", &hp->hop_length, err)) ||
        (st = cr_gguf_u32(g, "snac.latent_dim", &hp->latent_dim, err)) ||
        (st = cr_gguf_u32(g, "snac.decoder_dim", &hp->decoder_dim, err)) ||
        (st = cr_gguf_i32_array(g, "snac.decoder_rates", hp->rates, SNAC_MAX_BLOCKS, &hp->n_blocks, err)) ||
        (st = cr_gguf_u32(g, "snac.attn_window_size", &hp->window, err)) ||
        (st = cr_gguf_u32(g, "snac.codebook_size", &hp->codebook_size, err)) ||
        (st = cr_gguf_u32(g, "snac.codebook_dim", &hp->codebook_dim, err)) ||
        (st = cr_gguf_i32_array(g, "snac.vq_strides", hp->strides, SNAC_MAX_LEVELS, &hp->n_levels, err)) ||
        (st = cr_gguf_bool(g, "snac.noise", &hp->noise, err)) ||
        (st = cr_gguf_bool(g, "snac.depthwise", &hp->depthwise, err))) {
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

/* Snake on x [C, T, B] by prefix's parameters (cr_snake: fused on the CPU, fusable elsewhere). */
static struct ggml_tensor *snac_snake(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                      struct ggml_tensor *x, const char *prefix, bool cpu_ops) {
    return cr_snake(ctx, gf, x, W(w, "%s.alpha", prefix), W(w, "%s.inv_alpha", prefix), cpu_ops);
}

/* ResidualUnit (i, j)'s weights: Snake, depthwise k7, Snake, 1x1. */
static cr_res_unit snac_res_unit(struct ggml_context *w, int i, int j) {
    const char *p = "decoder.block";
    return (cr_res_unit){
        .alpha1 = W(w, "%s.%d.res.%d.snake1.alpha", p, i, j),
        .inv_alpha1 = W(w, "%s.%d.res.%d.snake1.inv_alpha", p, i, j),
        .dw_w = W(w, "%s.%d.res.%d.dw.weight", p, i, j),
        .dw_b = W(w, "%s.%d.res.%d.dw.bias", p, i, j),
        .alpha2 = W(w, "%s.%d.res.%d.snake2.alpha", p, i, j),
        .inv_alpha2 = W(w, "%s.%d.res.%d.snake2.inv_alpha", p, i, j),
        .pw_w = W(w, "%s.%d.res.%d.pw.weight", p, i, j),
        .pw_b = W(w, "%s.%d.res.%d.pw.bias", p, i, j),
    };
}

/* Local windowed attention with rotary positions. x: [D, T, B] -> [D, T, B]. */
static struct ggml_tensor *snac_attention(struct ggml_context *ctx, struct ggml_context *w,
                                          struct ggml_tensor *x, struct ggml_tensor *pos, int window) {
    const int64_t D = x->ne[0], T = x->ne[1], B = x->ne[2];
    const int64_t nh = D / SNAC_HEAD_DIM, nw = T / window, hd = SNAC_HEAD_DIM;
    struct ggml_tensor *h = cr_layer_norm(ctx, x, W(w, "decoder.attn.norm.weight"), W(w, "decoder.attn.norm.bias"),
                                          1e-5f);
    struct ggml_tensor *qkv = cr_mm(ctx, W(w, "decoder.attn.qkv.weight"), h); /* [3D, T, B] */
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
    o = cr_mm(ctx, W(w, "decoder.attn.out.weight"), o);
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
                                             cr_graph_io *gio) {
    struct ggml_tensor **io = gio->t;
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
        struct ggml_tensor *y = cr_pwconv(ctx, e, W(w, "quantizer.%d.out_proj.weight", l),
                                          W(w, "quantizer.%d.out_proj.bias", l)); /* [L, Tl*B] */
        if (s > 1) {
            y = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, y, L, 1, Tl, B), L, s, Tl, B);
        }
        y = ggml_reshape_3d(ctx, y, L, T, B);
        z = z ? ggml_add(ctx, z, y) : y;
    }
    struct ggml_tensor *x = snac_mask(ctx, z, masks[0]);

    x = cr_dwconv(ctx, x, W(w, "decoder.in_dw.weight"), W(w, "decoder.in_dw.bias"), 1, 3, 3); /* k7 "same" */
    x = cr_pwconv(ctx, x, W(w, "decoder.in_pw.weight"), W(w, "decoder.in_pw.bias"));
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
        x = snac_snake(ctx, w, gf, x, p, shape->cpu_ops);
        /* ConvTranspose1d(k 2s, stride s, padding ceil(s/2), output_padding s % 2): T*s samples */
        x = cr_upconv(ctx, x, W(w, "decoder.block.%d.up.weight", i), W(w, "decoder.block.%d.up.bias", i), s,
                      (s + 1) / 2, t);
        if (shape->noise && hp->noise) {
            snprintf(name, sizeof(name), "noise.%d", i);
            struct ggml_tensor *n = io[SNAC_IO_NOISE + i] = snac_input(ctx, GGML_TYPE_F32, 1, t, B, name);
            struct ggml_tensor *h = cr_mm(ctx, W(w, "decoder.block.%d.noise.weight", i), x);
            x = ggml_add(ctx, x, ggml_mul(ctx, h, n));
        }
        x = snac_mask(ctx, x, masks[i + 1]);
        int dil = 1;
        for (int j = 0; j < 3; j++, dil *= 3) {
            const cr_res_unit u = snac_res_unit(w, i, j);
            struct ggml_tensor *y = cr_res_branch(ctx, gf, x, &u, dil, true, shape->cpu_ops);
            x = snac_mask(ctx, ggml_add(ctx, x, y), masks[i + 1]);
        }
    }
    x = snac_snake(ctx, w, gf, x, "decoder.out_snake", shape->cpu_ops);
    x = cr_conv_narrow(ctx, x, W(w, "decoder.out.weight"), W(w, "decoder.out.bias"), SNAC_DW_K, 3,
                       3); /* [1, T*hop, B] */
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

static int64_t snac_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context) {
    const snac_hparams *hp = model->hparams;
    int64_t t = T + context, best = (int64_t)hp->decoder_dim * t * B;
    best = best > (int64_t)hp->latent_dim * t * B ? best : (int64_t)hp->latent_dim * t * B;
    if (hp->window > 0) { /* qkv, and the scores [W, W, heads, windows * B] */
        const int64_t qkv = 3 * (int64_t)hp->decoder_dim * t * B;
        const int64_t kq = (int64_t)hp->window * t * (hp->decoder_dim / SNAC_HEAD_DIM) * B;
        best = qkv > best ? qkv : best;
        best = kq > best ? kq : best;
    }
    int64_t tt = T;
    for (int i = 0; i < hp->n_blocks; i++) {
        const int64_t s = hp->rates[i], co = snac_channels(hp, i + 1);
        const int64_t cols = 2 * s * co * (tt + 2 + context) * B;
        tt *= s;
        const int64_t out = co * (tt + context) * B;
        best = cols > best ? cols : best;
        best = out > best ? out : best;
    }
    return best;
}

static void snac_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *gio,
                            const cr_decode_inputs *in) {
    struct ggml_tensor *const *io = gio->t;
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
                iv[b * Tg + t] = (int32_t)((in->frame_offset + t) % hp->window);
            }
        }
        ggml_backend_tensor_set(io[SNAC_IO_POS], iv, 0, (size_t)(Tg * Bg) * sizeof(int32_t));
    }
    int64_t tg = Tg, tv = Tv, t0 = in->frame_offset; /* t0: absolute position of the graph's first point */
    for (int i = 0; i < hp->n_blocks; i++) {
        tg *= hp->rates[i];
        tv *= hp->rates[i];
        t0 *= hp->rates[i];
        if (io[SNAC_IO_NOISE + i]) {
            for (int64_t b = 0; b < Bg; b++) {
                const uint64_t seed = b < Bv ? in->seeds[b] : 0;
                for (int64_t t = 0; t < tg; t++) {
                    f[b * tg + t] =
                        (b < Bv && t < tv) ? cr_noise_normal(seed, (uint32_t)i, (uint64_t)(t0 + t)) : 0.0f;
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


/* --------------------------------------------------------------- streaming */

/*
 * The streaming tick. Every time-mixing layer reads concat(state, new input)
 * and leaves the last frames of that buffer as the next state, so it computes
 * each output once ("valid" convolution over the buffer). Each point of the
 * decoder lags the input frontier by a fixed delay d (in samples of its own
 * rate r): a symmetric conv with padding P adds P, a transposed conv with
 * stride s maps d to d*s + ceil(s/2), an attention window W rounds up to the
 * next window boundary. States, in the order the builder takes them:
 *
 *   in_dw         [L, 6]          left context of the k7 conv
 *   attn          [D, W]          the previous window (32/44 kHz)
 *   block i up    [C_i, 1]        one input frame: the transposed conv overlap
 *   block i res j [C_i+1, 2*3^(j+1)]  the dilated k7 conv's context; its middle
 *                                 doubles as the residual delay line
 *   out           [C_n, 6]        the last conv's context
 *
 * A stream's first tick multiplies every gathered state by keep = 0 (zero left
 * padding); masks zero every tensor outside [0, end) before a time-mixing layer
 * reads it, exactly as an offline decode's zero padding does.
 */

/* What the tick's pieces share: the state buffers and inputs (stream_state.h), the weights. */
typedef struct snac_tick {
    cr_states st;
    struct ggml_context *w;
} snac_tick;

/*
 * Off the CPU the decoder blocks keep their residual stream time fastest,
 * x [n, B, C], so the Snake-depthwise-Snake core needs no transposes: the one
 * transpose per residual unit feeds the 1x1 conv, whose product is taken as
 * y^T w, landing time fastest again (cr_res_unit_tf). The state pools are laid
 * out differently on the two paths (cr_states_append and _append_tf); a
 * context only ever uses one of them.
 */

/* Snake on x [n, B, C] by prefix's parameters, then transposed: [C, n, B] channels fastest. */
static struct ggml_tensor *snac_snake_tf_to_cf(snac_tick *k, struct ggml_tensor *x, const char *prefix) {
    struct ggml_context *ctx = k->st.ctx;
    const int64_t n = x->ne[0], B = x->ne[1], C = x->ne[2];
    struct ggml_tensor *t = cr_snake_tf(ctx, k->st.gf, ggml_reshape_2d(ctx, x, n * B, C),
                                        W(k->w, "%s.alpha", prefix), W(k->w, "%s.inv_alpha", prefix));
    return cr_to_cf(ctx, t, n, B);
}

static struct ggml_cgraph *snac_build_stream(const cr_model *model, struct ggml_context *ctx,
                                             struct ggml_context *w, const cr_stream_shape *shape,
                                             struct ggml_tensor *const *pool, int n_pool, cr_graph_io *io) {
    const snac_hparams *hp = model->hparams;
    const int64_t N = shape->chunk, B = shape->n_batch, L = hp->latent_dim;
    snac_tick tk = {.w = w};
    cr_states *st = &tk.st;
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 4096, false);
    cr_states_init(st, ctx, gf, pool, n_pool, io, B, shape->masked);

    struct ggml_tensor *z = NULL;
    for (int l = 0; l < hp->n_levels; l++) {
        const int64_t s = hp->strides[l], Nl = N / s;
        struct ggml_tensor *codes = io->codes[l] = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, Nl * B);
        ggml_set_input(codes);
        struct ggml_tensor *e = ggml_get_rows(ctx, W(w, "quantizer.%d.codebook", l), codes);
        struct ggml_tensor *y = cr_pwconv(ctx, e, W(w, "quantizer.%d.out_proj.weight", l),
                                          W(w, "quantizer.%d.out_proj.bias", l));
        if (s > 1) {
            y = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, y, L, 1, Nl, B), L, s, Nl, B);
        }
        y = ggml_reshape_3d(ctx, y, L, N, B);
        z = z ? ggml_add(ctx, z, y) : y;
    }
    int32_t r = 1, d = 0;
    int64_t n = N;
    struct ggml_tensor *x = cr_states_mask(st, z, r, d);

    struct ggml_tensor *buf = cr_states_append(st, x, 2 * 3);
    x = cr_dwconv(ctx, buf, W(w, "decoder.in_dw.weight"), W(w, "decoder.in_dw.bias"), 1, 0, 0); /* valid */
    d += 3;
    x = cr_pwconv(ctx, x, W(w, "decoder.in_pw.weight"), W(w, "decoder.in_pw.bias"));
    x = cr_states_mask(st, x, r, d);
    if (hp->window > 0) {
        const int32_t win = hp->window, off = d % win;
        buf = cr_states_append(st, x, win); /* [D, W+N, B] */
        struct ggml_tensor *seg = ggml_cont(ctx, ggml_view_3d(ctx, buf, buf->ne[0], N, B, buf->nb[1], buf->nb[2],
                                                              (size_t)off * buf->nb[1]));
        d = d - off + win;
        struct ggml_tensor *pos = cr_states_time(st, CR_TIME_POS, N, r, d, win);
        x = snac_attention(ctx, w, seg, pos, win);
        x = cr_states_mask(st, x, r, d);
    }
    char p[64];
    const bool tf = !shape->cpu_ops;
    struct ggml_tensor *xt = NULL; /* the residual stream [n, B, C] on the time-fastest path */
    for (int i = 0; i < hp->n_blocks; i++) {
        const int s = hp->rates[i];
        const int64_t Cout = W(w, "decoder.block.%d.up.bias", i)->ne[0];
        snprintf(p, sizeof(p), "decoder.block.%d.snake", i);
        if (tf) {
            if (!xt) {
                xt = ggml_reshape_3d(ctx, cr_to_tf(ctx, x), n, B, x->ne[0]);
            }
            buf = snac_snake_tf_to_cf(&tk, cr_states_append_tf(st, xt, 1), p); /* [Cin, 1+n, B] */
        } else {
            buf = cr_states_append(st, x, 1); /* [Cin, 1+n, B] */
            buf = snac_snake(ctx, w, gf, buf, p, true);
        }
        x = cr_upconv_step(ctx, buf, W(w, "decoder.block.%d.up.weight", i), W(w, "decoder.block.%d.up.bias", i),
                           s); /* [Cout, n*s, B] */
        n *= s;
        r *= s;
        d = d * s + (s + 1) / 2;
        if (hp->noise) {
            struct ggml_tensor *nz = cr_states_time(st, CR_TIME_NOISE, n, r, d, i);
            struct ggml_tensor *h = cr_mm(ctx, W(w, "decoder.block.%d.noise.weight", i), x);
            x = ggml_add(ctx, x, ggml_mul(ctx, h, nz));
        }
        x = cr_states_mask(st, x, r, d);
        if (tf) {
            xt = ggml_reshape_3d(ctx, cr_to_tf(ctx, x), n, B, Cout);
        }
        int dil = 1;
        for (int j = 0; j < 3; j++, dil *= 3) {
            const int P = 3 * dil;
            const cr_res_unit u = snac_res_unit(w, i, j);
            d += P;
            if (tf) {
                buf = cr_states_append_tf(st, xt, 2 * P); /* [2P+n, B, C] */
                xt = cr_states_mask_tf(st, cr_res_unit_tf(ctx, gf, buf, &u, dil), r, d);
                continue;
            }
            buf = cr_states_append(st, x, 2 * P); /* [C, 2P+n, B] */
            struct ggml_tensor *y = cr_res_branch(ctx, gf, buf, &u, dil, false, true);
            struct ggml_tensor *xd = ggml_view_3d(ctx, buf, buf->ne[0], n, B, buf->nb[1], buf->nb[2],
                                                  (size_t)P * buf->nb[1]);
            x = cr_states_mask(st, ggml_add(ctx, xd, y), r, d);
        }
    }
    struct ggml_tensor *y = NULL;
    if (tf) {
        /* the last conv (C -> 1, k7) as one product buf^T w [(n+6)*B, 7], then
           its 7 shifted columns summed: out[t, b] = sum_k zc[t + k + (n+6) b, k] */
        buf = snac_snake_tf_to_cf(&tk, cr_states_append_tf(st, xt, 6), "decoder.out_snake"); /* [C, n+6, B] */
        struct ggml_tensor *zc = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, buf, buf->ne[0], (n + 6) * B),
                                              W(w, "decoder.out.weight")); /* [(n+6)*B, 7] */
        for (int64_t k = 0; k < SNAC_DW_K; k++) {
            struct ggml_tensor *v = ggml_view_2d(ctx, zc, n, B, (size_t)(n + 6) * sizeof(float),
                                                 (size_t)k * zc->nb[1] + (size_t)k * sizeof(float));
            y = y ? ggml_add(ctx, y, v) : ggml_cont(ctx, v);
        }
        y = ggml_reshape_3d(ctx, y, 1, n, B);
    } else {
        buf = cr_states_append(st, x, 6);
        buf = snac_snake(ctx, w, gf, buf, "decoder.out_snake", true);
        struct ggml_tensor *zc = ggml_mul_mat(ctx, W(w, "decoder.out.weight"), buf); /* [7, n+6, B] */
        for (int64_t k = 0; k < SNAC_DW_K; k++) {
            struct ggml_tensor *v = ggml_view_3d(ctx, zc, 1, n, B, zc->nb[1], zc->nb[2],
                                                 (size_t)k * sizeof(float) + (size_t)k * zc->nb[1]);
            y = y ? ggml_add(ctx, y, v) : ggml_cont(ctx, v);
        }
    }
    y = ggml_tanh(ctx, ggml_add(ctx, y, W(w, "decoder.out.bias")));
    d += 3;
    ggml_set_output(y);
    io->out = y;
    io->out_rate = r;
    io->out_delay = d;
    ggml_build_forward_expand(gf, y);
    return gf;
}

static int32_t snac_stream_chunk_multiple(const cr_model *model) { return model->info.frame_multiple; }

static int32_t snac_stream_latency(const cr_model *model);

/* The receptive field is symmetric but for the transposed convolutions' one
   frame of overlap: the stream latency (the right field) in frames, plus two,
   rounded up to whole attention windows / code groups. */
static int32_t snac_decode_context_frames(const cr_model *model) {
    const int32_t hop = model->info.hop_length, mult = model->info.frame_multiple;
    const int32_t frames = (snac_stream_latency(model) + hop - 1) / hop + 2;
    return (frames + mult - 1) / mult * mult;
}

static int snac_stream_states(const cr_model *model, cr_state_spec *s, int max) {
    const snac_hparams *hp = model->hparams;
    int n = 0;
#define SNAC_STATE(c, f)                                                                           \
    do {                                                                                           \
        if (n < max) {                                                                             \
            s[n].channels = (c);                                                                   \
            s[n].frames = (f);                                                                     \
        }                                                                                          \
        n++;                                                                                       \
    } while (0)
    SNAC_STATE(hp->latent_dim, 6);
    if (hp->window > 0) {
        SNAC_STATE(hp->decoder_dim, hp->window);
    }
    for (int i = 0; i < hp->n_blocks; i++) {
        SNAC_STATE(snac_channels(hp, i), 1);
        for (int j = 0, dil = 1; j < 3; j++, dil *= 3) {
            SNAC_STATE(snac_channels(hp, i + 1), 6 * dil);
        }
    }
    SNAC_STATE(snac_channels(hp, hp->n_blocks), 6);
#undef SNAC_STATE
    return n;
}

static int32_t snac_stream_latency(const cr_model *model) {
    /* the same arithmetic as snac_build_stream's d */
    const snac_hparams *hp = model->hparams;
    int32_t d = 3;
    if (hp->window > 0) {
        d = d - d % hp->window + hp->window;
    }
    for (int i = 0; i < hp->n_blocks; i++) {
        d = d * hp->rates[i] + (hp->rates[i] + 1) / 2 + 3 + 9 + 27;
    }
    return d + 3;
}

const cr_arch cr_arch_snac = {
    .name = "snac",
    .hparams_size = sizeof(snac_hparams),
    .read_hparams = snac_read_hparams,
    .fill_info = snac_fill_info,
    .tensor_specs = snac_tensor_specs,
    .build_decode = snac_build_decode,
    .scratch_floats = snac_scratch_floats,
    .max_tensor_elements = snac_max_tensor_elements,
    .set_decode_inputs = snac_set_inputs,
    .stream_chunk_multiple = snac_stream_chunk_multiple,
    .stream_states = snac_stream_states,
    .stream_latency = snac_stream_latency,
    .build_stream = snac_build_stream,
    .decode_context_frames = snac_decode_context_frames,
};
