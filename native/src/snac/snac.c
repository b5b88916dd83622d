/*
 * snac.c: SNAC's hyperparameters, tensor list, stream states and latency, its
 * architecture table, and the graph pieces both of its graphs use (snac.h).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "snac.h"

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

struct ggml_tensor *snac_snake(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                               struct ggml_tensor *x, const char *prefix, bool cpu_ops) {
    return cr_snake(ctx, gf, x, snac_w(w, "%s.alpha", prefix), snac_w(w, "%s.inv_alpha", prefix), cpu_ops);
}

struct ggml_tensor *snac_snake_tf_to_cf(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                        struct ggml_tensor *x, const char *prefix) {
    const int64_t n = x->ne[0], B = x->ne[1], C = x->ne[2];
    struct ggml_tensor *t = cr_snake_tf(ctx, gf, ggml_reshape_2d(ctx, x, n * B, C), snac_w(w, "%s.alpha", prefix),
                                        snac_w(w, "%s.inv_alpha", prefix));
    return cr_to_cf(ctx, t, n, B);
}

cr_res_unit snac_res_unit(struct ggml_context *w, int i, int j) {
    char unit[64];
    snprintf(unit, sizeof(unit), "decoder.block.%d.res.%d", i, j);
    return cr_res_unit_weights(w, unit, "dw");
}

struct ggml_tensor *snac_attention(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                   struct ggml_tensor *pos, int window) {
    const int64_t D = x->ne[0], T = x->ne[1], B = x->ne[2];
    const int64_t nh = D / SNAC_HEAD_DIM, nw = T / window, hd = SNAC_HEAD_DIM;
    struct ggml_tensor *h = cr_layer_norm(ctx, x, snac_w(w, "decoder.attn.norm.weight"), snac_w(w, "decoder.attn.norm.bias"),
                                          1e-5f);
    struct ggml_tensor *qkv = cr_mm(ctx, snac_w(w, "decoder.attn.qkv.weight"), h); /* [3D, T, B] */
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
    o = cr_mm(ctx, snac_w(w, "decoder.attn.out.weight"), o);
    return ggml_add(ctx, o, x);
}

/* --------------------------------------------------------- stream shape */

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

/* In the order snac_stream.c's builder takes them (its header lists them). */
static int snac_stream_states(const cr_model *model, cr_state_spec *s, int max) {
    const snac_hparams *hp = model->hparams;
    int n = 0;
#define SNAC_STATE(c, f) cr_state_spec_add(s, max, &n, (c), (f))
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
