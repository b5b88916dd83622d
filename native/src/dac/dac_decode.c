/*
 * dac_decode.c: DAC's offline decode graph (whole sequences, optionally
 * bucketed and masked; dac.h draws the decoder) and its host inputs: codes
 * and masks.
 */
#include <stdio.h>

#include "dac.h"

static struct ggml_tensor *dac_mask(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *mask) {
    return mask ? ggml_mul(ctx, x, mask) : x;
}

struct ggml_cgraph *dac_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                     const cr_decode_shape *shape, cr_graph_io *gio) {
    struct ggml_tensor **io = gio->t;
    const dac_hparams *hp = model->hparams;
    const int64_t T = shape->n_frames, B = shape->n_batch, L = hp->latent_dim;
    const bool cpu = shape->cpu_ops;
    const cr_cpu_ops *ops = cr_graph_ops(cpu, shape->ops);
    const bool dev = cr_conv_cols_on(shape->fused_unit, cpu); /* codecrt's device ops (dac.h) */
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 4096, false);
    char name[32];

    /* masks [1, n_r, B] over each point's valid length (dac.h), the last over the padded output */
    struct ggml_tensor *masks[DAC_MAX_BLOCKS + 2] = {0};
    if (shape->masked) {
        for (int r = 0; r <= hp->n_blocks; r++) {
            snprintf(name, sizeof(name), "mask.%d", r);
            masks[r] = io[DAC_IO_MASK + r] = cr_input(ctx, GGML_TYPE_F32, 1, dac_points(hp, T, r), B, name);
        }
        masks[hp->n_blocks + 1] = io[DAC_IO_MASK + hp->n_blocks + 1] =
            cr_input(ctx, GGML_TYPE_F32, 1, T * hp->hop_length, B, "mask.out");
    }

    /* quantizer: sum over codebooks of out_proj(codebook[codes]) */
    for (int q = 0; q < hp->n_codebooks; q++) {
        snprintf(name, sizeof(name), "codes.%d", q);
        io[DAC_IO_CODES + q] = cr_input(ctx, GGML_TYPE_I32, T * B, 1, 1, name);
    }
    struct ggml_tensor *z = dac_quantize(ctx, w, io + DAC_IO_CODES, hp->n_codebooks, ops); /* [L, T*B] */
    struct ggml_tensor *x = dac_mask(ctx, ggml_reshape_3d(ctx, z, L, T, B), masks[0]);

    x = dac_conv(ctx, gf, x, dac_w(w, "decoder.in.weight"), dac_w(w, "decoder.in.bias"), 1, 3, ops,
                 dev); /* [D, T, B] */
    x = dac_mask(ctx, x, masks[0]);

    char p[64];
    for (int i = 0; i < hp->n_blocks; i++) {
        const int s = hp->rates[i];
        snprintf(p, sizeof(p), "decoder.block.%d.snake", i);
        x = dac_snake(ctx, w, gf, x, p, cpu, dev);
        /* ConvTranspose1d(k 2s, stride s, padding ceil(s/2)): s n - (s mod 2) samples */
        x = cr_upconv(ctx, x, dac_w(w, "decoder.block.%d.up.weight", i), dac_w(w, "decoder.block.%d.up.bias", i), s,
                      (s + 1) / 2, dac_points(hp, T, i + 1), ops, cpu);
        x = dac_mask(ctx, x, masks[i + 1]);
        for (int j = 0; j < 3; j++) {
            x = dac_mask(ctx, dac_res_unit(ctx, w, gf, x, i, j, true, x, ops, dev), masks[i + 1]);
        }
    }
    x = dac_snake(ctx, w, gf, x, "decoder.out_snake", cpu, dev);
    x = cr_conv_narrow(ctx, x, dac_w(w, "decoder.out.weight"), dac_w(w, "decoder.out.bias"), DAC_K, 3,
                       3); /* [1, n_N, B] */
    x = ggml_tanh(ctx, x);
    const int64_t n_out = dac_points(hp, T, hp->n_blocks);
    if (n_out < T * hp->hop_length) { /* the samples an odd stride lost, as silence (dac.h) */
        x = cr_pad_frames(ctx, x, 0, (int)(T * hp->hop_length - n_out), cpu);
    }
    x = dac_mask(ctx, x, masks[hp->n_blocks + 1]); /* [1, T*hop, B] */
    ggml_set_name(x, "pcm");
    ggml_set_output(x);
    io[DAC_IO_OUT] = x;
    ggml_build_forward_expand(gf, x);
    return gf;
}

/* ------------------------------------------------------------------ inputs */

size_t dac_scratch_floats(const cr_model *model, const cr_decode_shape *shape) {
    const dac_hparams *hp = model->hparams;
    /* the largest single input: the output mask */
    return (size_t)shape->n_frames * (size_t)hp->hop_length * (size_t)shape->n_batch;
}

/*
 * The largest tensor: a k7 conv's (cr_conv1d_max_elements), a transposed conv's
 * product [2 s C_out, n + 2, B] or an activation [C, n, B], with `context` extra
 * frames at every point.
 */
int64_t dac_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context) {
    const dac_hparams *hp = model->hparams;
    const int64_t t = T + context + 6;
    int64_t best = cr_conv1d_max_elements(DAC_K, hp->latent_dim, hp->decoder_dim, t, B); /* the input conv */
    int64_t tt = T;
    for (int i = 0; i < hp->n_blocks; i++) {
        const int64_t s = hp->rates[i], co = dac_channels(hp, i + 1);
        const int64_t cols = 2 * s * co * (tt + 2 + context) * B;
        tt *= s;
        /* a residual conv; dilation 9: 54 frames of padding */
        const int64_t conv = cr_conv1d_max_elements(DAC_K, co, co, tt + context + 54, B);
        best = cols > best ? cols : best;
        best = conv > best ? conv : best;
    }
    return best;
}

void dac_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *gio,
                    const cr_decode_inputs *in) {
    struct ggml_tensor *const *io = gio->t;
    const dac_hparams *hp = model->hparams;
    const int64_t Tg = shape->n_frames, Bg = shape->n_batch;
    const int64_t Tv = in->n_frames, Bv = in->codes->n_batch;
    float *f = in->scratch;
    int32_t *iv = (int32_t *)in->scratch;

    for (int q = 0; q < hp->n_codebooks; q++) {
        const int32_t *src = in->codes->levels[q];
        for (int64_t b = 0; b < Bg; b++) {
            for (int64_t t = 0; t < Tg; t++) {
                iv[b * Tg + t] = (b < Bv && t < Tv) ? src[b * Tv + t] : 0;
            }
        }
        ggml_backend_tensor_set(io[DAC_IO_CODES + q], iv, 0, (size_t)(Tg * Bg) * sizeof(int32_t));
    }
    if (!shape->masked) {
        return;
    }
    for (int r = 0; r <= hp->n_blocks + 1; r++) {
        const int64_t tg = r <= hp->n_blocks ? dac_points(hp, Tg, r) : Tg * hp->hop_length;
        const int64_t tv = dac_points(hp, Tv, r <= hp->n_blocks ? r : hp->n_blocks);
        for (int64_t b = 0; b < Bg; b++) {
            for (int64_t t = 0; t < tg; t++) {
                f[b * tg + t] = (b < Bv && t < tv) ? 1.0f : 0.0f;
            }
        }
        ggml_backend_tensor_set(io[DAC_IO_MASK + r], f, 0, (size_t)(tg * Bg) * sizeof(float));
    }
}
