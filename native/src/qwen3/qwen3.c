/*
 * qwen3.c: the Qwen3-TTS 12 Hz tokenizer decoder's hyperparameters, tensor
 * list, architecture table, and the graph pieces both of its graphs use
 * (qwen3.h draws the decoder). Mimi's split RVQ, attention and window masks
 * are reused as they are (mimi/mimi.h).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "qwen3.h"

#include "mimi/mimi.h"

/* --------------------------------------------------------- hyperparameters */

static codecrt_status qwen3_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    qwen3_hparams *hp = hp_;
    codecrt_status st;
    if ((st = cr_gguf_u32(g, "qwen3.sample_rate", &hp->sample_rate, err)) ||
        (st = cr_gguf_u32(g, "qwen3.n_q", &hp->n_q, err)) ||
        (st = cr_gguf_u32(g, "qwen3.n_q_semantic", &hp->n_q_sem, err)) ||
        (st = cr_gguf_u32(g, "qwen3.codebook_size", &hp->bins, err)) ||
        (st = cr_gguf_u32(g, "qwen3.codebook_dim", &hp->cdim, err)) ||
        (st = cr_gguf_u32(g, "qwen3.quantizer_dim", &hp->qdim, err)) ||
        (st = cr_gguf_u32(g, "qwen3.latent_dim", &hp->latent, err)) ||
        (st = cr_gguf_u32(g, "qwen3.dim", &hp->dim, err)) ||
        (st = cr_gguf_u32(g, "qwen3.n_layers", &hp->n_layers, err)) ||
        (st = cr_gguf_u32(g, "qwen3.n_heads", &hp->n_heads, err)) ||
        (st = cr_gguf_u32(g, "qwen3.head_dim", &hp->head_dim, err)) ||
        (st = cr_gguf_u32(g, "qwen3.ff_dim", &hp->ff, err)) ||
        (st = cr_gguf_u32(g, "qwen3.context", &hp->context, err)) ||
        (st = cr_gguf_u32(g, "qwen3.decoder_dim", &hp->dec_dim, err)) ||
        (st = cr_gguf_u32(g, "qwen3.hop", &hp->hop, err)) ||
        (st = cr_gguf_i32_array(g, "qwen3.upsampling_ratios", hp->up, QWEN3_MAX_UP, &hp->n_up, err)) ||
        (st = cr_gguf_i32_array(g, "qwen3.upsample_rates", hp->rates, QWEN3_MAX_RATES, &hp->n_rates, err)) ||
        (st = cr_gguf_f32(g, "qwen3.rope_theta", &hp->rope_theta, err)) ||
        (st = cr_gguf_f32(g, "qwen3.norm_eps", &hp->norm_eps, err))) {
        return st;
    }
    if (hp->sample_rate < 1000 || hp->dim < 2 || hp->n_heads < 1 || hp->head_dim < 2 || hp->head_dim % 2 ||
        hp->n_layers > QWEN3_MAX_LAYERS || hp->ff < 1 || hp->latent < 1 || hp->qdim < 1 || hp->cdim < 1) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS,
                       "qwen3: dim %d, %d heads of %d (even), %d layers (<= %d), ff %d, latent %d", hp->dim,
                       hp->n_heads, hp->head_dim, hp->n_layers, QWEN3_MAX_LAYERS, hp->ff, hp->latent);
    }
    if (hp->n_q > CODECRT_MAX_LEVELS || hp->n_q_sem < 1 || hp->n_q_sem >= hp->n_q) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "qwen3: %d codebooks (at most %d), %d semantic (1 .. fewer)",
                       hp->n_q, CODECRT_MAX_LEVELS, hp->n_q_sem);
    }
    if ((int64_t)hp->n_q * (hp->bins + 1) > INT32_MAX / 2 || hp->bins < 1 || hp->context < 2 ||
        hp->context > 1 << 16 || hp->n_up < 1 || hp->n_rates < 1) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "qwen3 hyperparameters out of range");
    }
    int64_t up = 1, hop = 1;
    for (int i = 0; i < hp->n_up; i++) {
        if (hp->up[i] < 1 || hp->up[i] > 64) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "qwen3: upsampling ratio %d", hp->up[i]);
        }
        up *= hp->up[i];
    }
    for (int i = 0; i < hp->n_rates; i++) {
        if (hp->rates[i] < 1 || hp->rates[i] > 64) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "qwen3: upsample rate %d", hp->rates[i]);
        }
        hop *= hp->rates[i];
    }
    hp->up_total = (int32_t)up;
    if (up * hop != hp->hop) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "qwen3.hop = %d but the ratios' product is %lld", hp->hop,
                       (long long)(up * hop));
    }
    if (hp->dec_dim < 2 || hp->dec_dim > 1 << 16 || (hp->dec_dim >> hp->n_rates) << hp->n_rates != hp->dec_dim) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "qwen3: decoder_dim %d must halve %d times", hp->dec_dim,
                       hp->n_rates);
    }
    if (!(hp->rope_theta > 0.0f) || !(hp->norm_eps > 0.0f) || !isfinite(hp->rope_theta)) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "qwen3: rope_theta and norm_eps must be positive");
    }
    return CODECRT_OK;
}

static void qwen3_fill_info(const void *hp_, codecrt_model_info *info) {
    const qwen3_hparams *hp = hp_;
    info->sample_rate = hp->sample_rate;
    info->hop_length = hp->hop;
    info->n_levels = hp->n_q;
    for (int l = 0; l < hp->n_q; l++) {
        info->codebook_size[l] = hp->bins;
        info->level_stride[l] = 1;
    }
    info->frame_multiple = 1;
}

/* ------------------------------------------------------------ tensor specs */

static void qwen3_snake_specs(cr_spec_list *s, int64_t c, const char *prefix) {
    cr_spec_add(s, false, 1, c, 1, "%s.alpha", prefix);
    cr_spec_add(s, false, 1, c, 1, "%s.inv_alpha", prefix);
}

static void qwen3_tensor_specs(const void *hp_, cr_spec_list *s) {
    const qwen3_hparams *hp = hp_;
    const int64_t Q = hp->qdim, L = hp->latent, D = hp->dim, F = hp->ff, A = (int64_t)hp->n_heads * hp->head_dim;
    cr_spec_add(s, false, 2, hp->cdim, (int64_t)hp->n_q * (hp->bins + 1), "quant.codebooks");
    cr_spec_add(s, false, 2, hp->cdim, Q, "quant.first.proj");
    cr_spec_add(s, false, 2, hp->cdim, Q, "quant.rest.proj");
    cr_spec_add3(s, false, QWEN3_PRE_K, Q, L, "pre_conv.weight");
    cr_spec_add(s, false, 1, L, 1, "pre_conv.bias");
    cr_spec_add(s, false, 2, L, D, "tr.in.weight");
    cr_spec_add(s, false, 1, D, 1, "tr.in.bias");
    for (int l = 0; l < hp->n_layers; l++) {
        cr_spec_add(s, false, 1, D, 1, "tr.%d.norm1.weight", l);
        cr_spec_add(s, false, 1, D, 1, "tr.%d.norm2.weight", l);
        cr_spec_add(s, true, 2, D, 3 * A, "tr.%d.attn_qkv.weight", l);
        cr_spec_add(s, true, 2, A, D, "tr.%d.attn_out.weight", l);
        cr_spec_add(s, true, 2, D, F, "tr.%d.ff_gate.weight", l);
        cr_spec_add(s, true, 2, D, F, "tr.%d.ff_up.weight", l);
        cr_spec_add(s, true, 2, F, D, "tr.%d.ff_down.weight", l);
    }
    cr_spec_add(s, false, 1, D, 1, "tr.norm.weight");
    cr_spec_add(s, false, 2, D, L, "tr.out.weight");
    cr_spec_add(s, false, 1, L, 1, "tr.out.bias");
    for (int i = 0; i < hp->n_up; i++) {
        cr_spec_add(s, false, 2, L, (int64_t)hp->up[i] * L, "up%d.weight", i);
        cr_spec_add(s, false, 1, (int64_t)hp->up[i] * L, 1, "up%d.bias", i);
        cr_spec_add(s, false, 2, L, QWEN3_K, "up%d.dw.weight", i);
        cr_spec_add(s, false, 1, L, 1, "up%d.dw.bias", i);
        cr_spec_add(s, false, 1, L, 1, "up%d.norm.weight", i);
        cr_spec_add(s, false, 1, L, 1, "up%d.norm.bias", i);
        cr_spec_add(s, false, 2, L, 4 * L, "up%d.pw1.weight", i);
        cr_spec_add(s, false, 1, 4 * L, 1, "up%d.pw1.bias", i);
        cr_spec_add(s, false, 2, 4 * L, L, "up%d.pw2.weight", i);
        cr_spec_add(s, false, 1, L, 1, "up%d.pw2.bias", i);
    }
    const int64_t C0 = qwen3_channels(hp, 0);
    cr_spec_add3(s, false, QWEN3_K, L, C0, "dec.in.weight");
    cr_spec_add(s, false, 1, C0, 1, "dec.in.bias");
    char p[64];
    for (int i = 0; i < hp->n_rates; i++) {
        const int64_t ci = qwen3_channels(hp, i), co = qwen3_channels(hp, i + 1);
        snprintf(p, sizeof(p), "dec.%d.snake", i);
        qwen3_snake_specs(s, ci, p);
        cr_spec_add(s, false, 2, ci, 2 * (int64_t)hp->rates[i] * co, "dec.%d.up.weight", i);
        cr_spec_add(s, false, 1, co, 1, "dec.%d.up.bias", i);
        for (int j = 0; j < QWEN3_N_RES; j++) {
            snprintf(p, sizeof(p), "dec.%d.res.%d.snake1", i, j);
            qwen3_snake_specs(s, co, p);
            cr_spec_add3(s, false, QWEN3_K, co, co, "dec.%d.res.%d.conv.weight", i, j);
            cr_spec_add(s, false, 1, co, 1, "dec.%d.res.%d.conv.bias", i, j);
            snprintf(p, sizeof(p), "dec.%d.res.%d.snake2", i, j);
            qwen3_snake_specs(s, co, p);
            cr_spec_add(s, false, 2, co, co, "dec.%d.res.%d.pw.weight", i, j);
            cr_spec_add(s, false, 1, co, 1, "dec.%d.res.%d.pw.bias", i, j);
        }
    }
    const int64_t cn = qwen3_channels(hp, hp->n_rates);
    qwen3_snake_specs(s, cn, "dec.out_snake");
    cr_spec_add(s, false, 2, cn, QWEN3_K, "dec.out.weight");
    cr_spec_add(s, false, 1, 1, 1, "dec.out.bias");
}

/* ----------------------------------------------------------- graph pieces */

struct ggml_tensor *qwen3_quantizer(struct ggml_context *ctx, struct ggml_context *w, const qwen3_hparams *hp,
                                    struct ggml_tensor *const *codes, int64_t T, int64_t B) {
    return mimi_split_rvq(ctx, w, hp->n_q, hp->n_q_sem, hp->bins, hp->cdim, codes, T, B);
}

struct ggml_tensor *qwen3_qkv(struct ggml_context *ctx, struct ggml_context *w, const qwen3_hparams *hp,
                              struct ggml_tensor *x, int l, const cr_cpu_ops *ops) {
    struct ggml_tensor *h = cr_rms_norm(ctx, x, cr_weight(w, "tr.%d.norm1.weight", l), hp->norm_eps);
    return cr_linear(ctx, h, cr_weight(w, "tr.%d.attn_qkv.weight", l), NULL, ops);
}

struct ggml_tensor *qwen3_rope(struct ggml_context *ctx, const qwen3_hparams *hp, struct ggml_tensor *x,
                               struct ggml_tensor *pos) {
    /* transformers' rotate_half: dimension i pairs with i + hd/2, ggml's NEOX mode */
    return ggml_rope_ext(ctx, x, pos, NULL, hp->head_dim, GGML_ROPE_TYPE_NEOX, 0, hp->rope_theta, 1.0f, 0.0f, 1.0f,
                         0.0f, 0.0f);
}

struct ggml_tensor *qwen3_layer_out(struct ggml_context *ctx, struct ggml_context *w, const qwen3_hparams *hp,
                                    struct ggml_tensor *x, struct ggml_tensor *o, int l, const cr_cpu_ops *ops) {
    x = ggml_add(ctx, x, cr_linear(ctx, o, cr_weight(w, "tr.%d.attn_out.weight", l), NULL, ops));
    struct ggml_tensor *h = cr_rms_norm(ctx, x, cr_weight(w, "tr.%d.norm2.weight", l), hp->norm_eps);
    struct ggml_tensor *g = ggml_silu(ctx, cr_linear(ctx, h, cr_weight(w, "tr.%d.ff_gate.weight", l), NULL, ops));
    h = ggml_mul(ctx, g, cr_linear(ctx, h, cr_weight(w, "tr.%d.ff_up.weight", l), NULL, ops));
    return ggml_add(ctx, x, cr_linear(ctx, h, cr_weight(w, "tr.%d.ff_down.weight", l), NULL, ops));
}

struct ggml_tensor *qwen3_upsample(struct ggml_context *ctx, struct ggml_context *w, const qwen3_hparams *hp,
                                   struct ggml_tensor *x, int i, const cr_cpu_ops *ops) {
    const int64_t L = hp->latent, n = x->ne[1], B = x->ne[2], f = hp->up[i];
    /* kernel = stride: output t*f + k is tap k of frame t alone, row k*L + oc of one product */
    struct ggml_tensor *y = cr_linear(ctx, x, cr_weight(w, "up%d.weight", i), cr_weight(w, "up%d.bias", i), ops);
    return ggml_reshape_3d(ctx, y, L, f * n, B);
}

struct ggml_tensor *qwen3_convnext(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                   struct ggml_tensor *dw, int i, const cr_cpu_ops *ops) {
    struct ggml_tensor *h =
        cr_layer_norm(ctx, dw, cr_weight(w, "up%d.norm.weight", i), cr_weight(w, "up%d.norm.bias", i), 1e-6f);
    h = ggml_gelu_erf(ctx, cr_linear(ctx, h, cr_weight(w, "up%d.pw1.weight", i), cr_weight(w, "up%d.pw1.bias", i), ops));
    h = cr_linear(ctx, h, cr_weight(w, "up%d.pw2.weight", i), cr_weight(w, "up%d.pw2.bias", i), ops); /* gamma folded */
    return ggml_add(ctx, x, h);
}

struct ggml_tensor *qwen3_snake(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                struct ggml_tensor *x, bool cpu_ops, const char *fmt, ...) {
    char p[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof(p), fmt, ap);
    va_end(ap);
    return cr_snake(ctx, gf, x, cr_weight(w, "%s.alpha", p), cr_weight(w, "%s.inv_alpha", p), cpu_ops);
}

struct ggml_tensor *qwen3_res_branch(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                     struct ggml_tensor *buf, int i, int j, int pad, bool cpu_ops,
                                     const cr_cpu_ops *ops) {
    static const int dil[QWEN3_N_RES] = {1, 3, 9};
    if (!ggml_is_contiguous(buf)) {
        buf = ggml_cont(ctx, buf);
    }
    struct ggml_tensor *y = cr_conv1d(ctx, gf, buf, cr_weight(w, "dec.%d.res.%d.conv.weight", i, j),
                                      cr_weight(w, "dec.%d.res.%d.conv.bias", i, j), dil[j], pad, 0, ops);
    y = qwen3_snake(ctx, w, gf, y, cpu_ops, "dec.%d.res.%d.snake2", i, j);
    return cr_linear(ctx, y, cr_weight(w, "dec.%d.res.%d.pw.weight", i, j), cr_weight(w, "dec.%d.res.%d.pw.bias", i, j),
                     ops);
}

struct ggml_tensor *qwen3_snake_dev(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                    const char *fmt, ...) {
    char p[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof(p), fmt, ap);
    va_end(ap);
    return cr_snake_cols(ctx, x, cr_weight(w, "%s.alpha", p), cr_weight(w, "%s.inv_alpha", p));
}

struct ggml_tensor *qwen3_res_unit_dev(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *buf,
                                       struct ggml_tensor *x, int i, int j, int pad) {
    static const int dil[QWEN3_N_RES] = {1, 3, 9};
    char unit[64];
    snprintf(unit, sizeof(unit), "dec.%d.res.%d", i, j);
    const cr_res_unit u = cr_res_unit_weights(w, unit, "conv");
    return cr_res_unit_cols(ctx, buf, &u, dil[j], pad, 0, x);
}

/* --------------------------------------------------------- stream shape */

static int32_t qwen3_stream_chunk_multiple(const cr_model *model) {
    (void)model;
    return 1;
}

/* Every layer is causal: a frame's audio is final when the frame arrives. */
static int32_t qwen3_stream_latency(const cr_model *model) {
    (void)model;
    return 0;
}

/* An exact piece needs n_layers * (context - 1) frames of left context (568 with the
   released sizes, 45 s): a piece is never cut; the decode is one graph. */
static int32_t qwen3_decode_context_frames(const cr_model *model) {
    (void)model;
    return 0;
}

const cr_arch cr_arch_qwen3 = {
    .name = "qwen3",
    .levels_prefix = true,
    .hparams_size = sizeof(qwen3_hparams),
    .read_hparams = qwen3_read_hparams,
    .fill_info = qwen3_fill_info,
    .tensor_specs = qwen3_tensor_specs,
    .build_decode = qwen3_build_decode,
    .scratch_floats = qwen3_scratch_floats,
    .max_tensor_elements = qwen3_max_tensor_elements,
    .set_decode_inputs = qwen3_set_inputs,
    .stream_chunk_multiple = qwen3_stream_chunk_multiple,
    .stream_states = qwen3_stream_states,
    .stream_latency = qwen3_stream_latency,
    .build_stream = qwen3_build_stream,
    .decode_context_frames = qwen3_decode_context_frames,
};
