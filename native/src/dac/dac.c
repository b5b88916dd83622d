/*
 * dac.c: DAC's hyperparameters, tensor list, stream states and latency, its
 * architecture table, and the graph pieces both of its graphs use (dac.h).
 */
#include <stdio.h>
#include <string.h>

#include "dac.h"

/* --------------------------------------------------------- hyperparameters */

static codecrt_status dac_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    dac_hparams *hp = hp_;
    codecrt_status st;
    if ((st = cr_gguf_u32(g, "dac.sampling_rate", &hp->sampling_rate, err)) ||
        (st = cr_gguf_u32(g, "dac.hop_length", &hp->hop_length, err)) ||
        (st = cr_gguf_u32(g, "dac.latent_dim", &hp->latent_dim, err)) ||
        (st = cr_gguf_u32(g, "dac.decoder_dim", &hp->decoder_dim, err)) ||
        (st = cr_gguf_i32_array(g, "dac.decoder_rates", hp->rates, DAC_MAX_BLOCKS, &hp->n_blocks, err)) ||
        (st = cr_gguf_u32(g, "dac.codebook_size", &hp->codebook_size, err)) ||
        (st = cr_gguf_u32(g, "dac.codebook_dim", &hp->codebook_dim, err)) ||
        (st = cr_gguf_u32(g, "dac.n_codebooks", &hp->n_codebooks, err))) {
        return st;
    }
    if (hp->sampling_rate < 1000 || hp->latent_dim < 1 || hp->codebook_size < 1 || hp->codebook_dim < 1 ||
        hp->n_codebooks < 1 || hp->n_codebooks > DAC_MAX_CODEBOOKS) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "dac hyperparameters out of range (n_codebooks 1..%d)",
                       DAC_MAX_CODEBOOKS);
    }
    int64_t hop = 1;
    for (int i = 0; i < hp->n_blocks; i++) {
        if (hp->rates[i] < 2) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "dac.decoder_rates[%d] = %d: every stride must be >= 2", i,
                           hp->rates[i]);
        }
        hop *= hp->rates[i];
    }
    if (hop != hp->hop_length) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "dac.hop_length = %d but prod(decoder_rates) = %lld",
                       hp->hop_length, (long long)hop);
    }
    if (hp->decoder_dim % (1 << hp->n_blocks) != 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "dac.decoder_dim = %d is not divisible by 2^%d",
                       hp->decoder_dim, hp->n_blocks);
    }
    return CODECRT_OK;
}

static void dac_fill_info(const void *hp_, codecrt_model_info *info) {
    const dac_hparams *hp = hp_;
    info->sample_rate = hp->sampling_rate;
    info->hop_length = hp->hop_length;
    info->n_levels = hp->n_codebooks;
    for (int l = 0; l < hp->n_codebooks; l++) {
        info->codebook_size[l] = hp->codebook_size;
        info->level_stride[l] = 1;
    }
    info->frame_multiple = 1;
}

int64_t dac_points(const dac_hparams *hp, int64_t T, int i) {
    for (int k = 0; k < i && k < hp->n_blocks; k++) {
        T = T * hp->rates[k] - hp->rates[k] % 2;
    }
    return T;
}

/* The valid points at a point of rate samples per frame (1, or the product of the first strides). */
static int64_t dac_valid_points(const cr_model *model, int64_t n_frames, int32_t rate) {
    const dac_hparams *hp = model->hparams;
    int64_t r = 1;
    for (int i = 0; i <= hp->n_blocks; i++) {
        if (r == rate) {
            return dac_points(hp, n_frames, i);
        }
        if (i < hp->n_blocks) {
            r *= hp->rates[i];
        }
    }
    return n_frames * rate;
}

/* ------------------------------------------------------------ tensor specs */

static void dac_snake_specs(cr_spec_list *s, int64_t c, const char *prefix) {
    cr_spec_add(s, false, 1, c, 1, "%s.alpha", prefix);
    cr_spec_add(s, false, 1, c, 1, "%s.inv_alpha", prefix);
}

static void dac_tensor_specs(const void *hp_, cr_spec_list *s) {
    const dac_hparams *hp = hp_;
    const int64_t L = hp->latent_dim, D = hp->decoder_dim, H = hp->codebook_dim, N = hp->codebook_size;
    for (int q = 0; q < hp->n_codebooks; q++) {
        cr_spec_add(s, false, 2, H, N, "quantizer.%d.codebook", q);
        cr_spec_add(s, false, 2, H, L, "quantizer.%d.out_proj.weight", q);
        cr_spec_add(s, false, 1, L, 1, "quantizer.%d.out_proj.bias", q);
    }
    cr_spec_add3(s, true, DAC_K, L, D, "decoder.in.weight");
    cr_spec_add(s, false, 1, D, 1, "decoder.in.bias");
    char p[64];
    for (int i = 0; i < hp->n_blocks; i++) {
        const int64_t ci = dac_channels(hp, i), co = dac_channels(hp, i + 1), k = 2 * hp->rates[i];
        snprintf(p, sizeof(p), "decoder.block.%d.snake", i);
        dac_snake_specs(s, ci, p);
        cr_spec_add(s, true, 2, ci, k * co, "decoder.block.%d.up.weight", i);
        cr_spec_add(s, false, 1, co, 1, "decoder.block.%d.up.bias", i);
        for (int j = 0; j < 3; j++) {
            snprintf(p, sizeof(p), "decoder.block.%d.res.%d.snake1", i, j);
            dac_snake_specs(s, co, p);
            cr_spec_add3(s, true, DAC_K, co, co, "decoder.block.%d.res.%d.conv.weight", i, j);
            cr_spec_add(s, false, 1, co, 1, "decoder.block.%d.res.%d.conv.bias", i, j);
            snprintf(p, sizeof(p), "decoder.block.%d.res.%d.snake2", i, j);
            dac_snake_specs(s, co, p);
            cr_spec_add(s, true, 2, co, co, "decoder.block.%d.res.%d.pw.weight", i, j);
            cr_spec_add(s, false, 1, co, 1, "decoder.block.%d.res.%d.pw.bias", i, j);
        }
    }
    const int64_t cn = dac_channels(hp, hp->n_blocks);
    dac_snake_specs(s, cn, "decoder.out_snake");
    cr_spec_add(s, true, 2, cn, DAC_K, "decoder.out.weight");
    cr_spec_add(s, false, 1, 1, 1, "decoder.out.bias");
}

/* ----------------------------------------------------------- graph pieces */

struct ggml_tensor *dac_snake(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                              struct ggml_tensor *x, const char *prefix, bool cpu_ops, bool dev) {
    struct ggml_tensor *alpha = dac_w(w, "%s.alpha", prefix), *inv = dac_w(w, "%s.inv_alpha", prefix);
    struct ggml_tensor *y = dev ? cr_snake_cols(ctx, x, alpha, inv) : NULL;
    return y ? y : cr_snake(ctx, gf, x, alpha, inv, cpu_ops);
}

/* t[0..n) side by side along dim 0, in a balanced tree of concatenations (log2 n copies of
   each element instead of up to n) */
static struct ggml_tensor *dac_concat0(struct ggml_context *ctx, struct ggml_tensor *const *t, int n) {
    if (n == 1) {
        return t[0];
    }
    return ggml_concat(ctx, dac_concat0(ctx, t, n / 2), dac_concat0(ctx, t + n / 2, n - n / 2), 0);
}

struct ggml_tensor *dac_quantize(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *const *codes,
                                 int n_codebooks, const cr_cpu_ops *ops) {
    struct ggml_tensor *e[CODECRT_MAX_LEVELS], *proj[CODECRT_MAX_LEVELS], *bias = NULL;
    for (int q = 0; q < n_codebooks; q++) {
        e[q] = ggml_get_rows(ctx, dac_w(w, "quantizer.%d.codebook", q), codes[q]); /* [H, N] */
        proj[q] = dac_w(w, "quantizer.%d.out_proj.weight", q);                      /* [H, L] */
        struct ggml_tensor *b = dac_w(w, "quantizer.%d.out_proj.bias", q);          /* [L] */
        bias = bias ? ggml_add(ctx, bias, b) : b;
    }
    /* [H Q, N] by [H Q, L] -> [L, N] */
    return cr_linear(ctx, dac_concat0(ctx, e, n_codebooks), dac_concat0(ctx, proj, n_codebooks), bias, ops);
}

struct ggml_tensor *dac_conv(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *x,
                             struct ggml_tensor *w, struct ggml_tensor *b, int dil, int pad, const cr_cpu_ops *ops,
                             bool dev) {
    struct ggml_tensor *y = dev ? cr_conv1d_cols(ctx, x, NULL, NULL, w, b, dil, pad, pad, NULL) : NULL;
    return y ? y : cr_conv1d(ctx, gf, cr_dense(ctx, x), w, b, dil, pad, pad, ops);
}

struct ggml_tensor *dac_res_unit(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                 struct ggml_tensor *buf, int i, int j, bool same, struct ggml_tensor *res,
                                 const cr_cpu_ops *ops, bool dev) {
    int dil = 1;
    for (int k = 0; k < j; k++) {
        dil *= 3;
    }
    const int pad = same ? 3 * dil : 0;
    char unit[64];
    snprintf(unit, sizeof(unit), "decoder.block.%d.res.%d", i, j);
    const cr_res_unit u = cr_res_unit_weights(w, unit, "conv");
    struct ggml_tensor *out = dev ? cr_res_unit_cols(ctx, buf, &u, dil, pad, pad, res) : NULL;
    if (out) {
        return out;
    }
    const bool cpu_ops = ops != NULL;
    struct ggml_tensor *y = cr_snake(ctx, gf, buf, u.alpha1, u.inv_alpha1, cpu_ops);
    y = dac_conv(ctx, gf, y, u.dw_w, u.dw_b, dil, pad, ops, false);
    y = cr_snake(ctx, gf, y, u.alpha2, u.inv_alpha2, cpu_ops);
    y = cr_linear(ctx, y, u.pw_w, u.pw_b, ops);
    return res ? ggml_add(ctx, res, y) : y;
}

/* --------------------------------------------------------- stream shape */

static int32_t dac_stream_chunk_multiple(const cr_model *model) {
    (void)model;
    return 1;
}

/* In the order dac_stream.c's builder takes them (its header lists them). */
static int dac_stream_states(const cr_model *model, cr_state_spec *s, int max) {
    const dac_hparams *hp = model->hparams;
    int n = 0;
#define DAC_STATE(c, f) cr_state_spec_add(s, max, &n, (c), (f))
    DAC_STATE(hp->latent_dim, 6);
    for (int i = 0; i < hp->n_blocks; i++) {
        DAC_STATE(dac_channels(hp, i), 1);
        for (int j = 0, dil = 1; j < 3; j++, dil *= 3) {
            DAC_STATE(dac_channels(hp, i + 1), 6 * dil);
        }
    }
    DAC_STATE(dac_channels(hp, hp->n_blocks), 6);
#undef DAC_STATE
    return n;
}

/* The output lags the codes by this many samples: the right receptive field
   (the same arithmetic as dac_build_stream's delay d). */
static int32_t dac_stream_latency(const cr_model *model) {
    const dac_hparams *hp = model->hparams;
    int32_t d = 3;
    for (int i = 0; i < hp->n_blocks; i++) {
        d = d * hp->rates[i] + (hp->rates[i] + 1) / 2 + 3 + 9 + 27;
    }
    return d + 3;
}

/* The receptive field is symmetric but for the transposed convolutions' one
   frame of overlap: the right field in frames, plus two (as SNAC's). */
static int32_t dac_decode_context_frames(const cr_model *model) {
    const int32_t hop = model->info.hop_length;
    return (dac_stream_latency(model) + hop - 1) / hop + 2;
}

const cr_arch cr_arch_dac = {
    .name = "dac",
    .bf16_products = true,
    .hparams_size = sizeof(dac_hparams),
    .read_hparams = dac_read_hparams,
    .fill_info = dac_fill_info,
    .tensor_specs = dac_tensor_specs,
    .build_decode = dac_build_decode,
    .scratch_floats = dac_scratch_floats,
    .max_tensor_elements = dac_max_tensor_elements,
    .set_decode_inputs = dac_set_inputs,
    .stream_chunk_multiple = dac_stream_chunk_multiple,
    .stream_states = dac_stream_states,
    .stream_latency = dac_stream_latency,
    .build_stream = dac_build_stream,
    .decode_context_frames = dac_decode_context_frames,
    .valid_points = dac_valid_points,
};
