/*
 * snac_decode.c: SNAC's offline decode graph (whole sequences, optionally
 * bucketed and masked; snac.h draws the decoder) and its host inputs: codes,
 * rotary positions, noise keyed by absolute position, masks.
 */
#include <stdio.h>

#include "snac.h"

static struct ggml_tensor *snac_mask(struct ggml_context *ctx, struct ggml_tensor *x,
                                     struct ggml_tensor *mask) {
    return mask ? ggml_mul(ctx, x, mask) : x;
}

struct ggml_cgraph *snac_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                      const cr_decode_shape *shape, cr_graph_io *gio) {
    struct ggml_tensor **io = gio->t;
    const snac_hparams *hp = model->hparams;
    const int64_t T = shape->n_frames, B = shape->n_batch, L = hp->latent_dim;
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 4096, false);
    /* the fused CPU products (the 1x1 convs, the transposed convs' products) on the CPU */
    const cr_cpu_ops *ops = cr_graph_ops(shape->cpu_ops, shape->ops);
    char name[32];

    struct ggml_tensor *masks[SNAC_MAX_BLOCKS + 1] = {0};
    if (shape->masked) {
        int64_t t = T;
        for (int r = 0; r <= hp->n_blocks; r++) {
            snprintf(name, sizeof(name), "mask.%d", r);
            masks[r] = io[SNAC_IO_MASK + r] = cr_input(ctx, GGML_TYPE_F32, 1, t, B, name);
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
        struct ggml_tensor *codes = io[SNAC_IO_CODES + l] = cr_input(ctx, GGML_TYPE_I32, Tl * B, 1, 1, name);
        struct ggml_tensor *e = ggml_get_rows(ctx, snac_w(w, "quantizer.%d.codebook", l), codes); /* [H, Tl*B] */
        struct ggml_tensor *y = cr_linear(ctx, e, snac_w(w, "quantizer.%d.out_proj.weight", l),
                                          snac_w(w, "quantizer.%d.out_proj.bias", l), ops); /* [L, Tl*B] */
        if (s > 1) {
            y = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, y, L, 1, Tl, B), L, s, Tl, B);
        }
        y = ggml_reshape_3d(ctx, y, L, T, B);
        z = z ? ggml_add(ctx, z, y) : y;
    }
    struct ggml_tensor *x = snac_mask(ctx, z, masks[0]);

    x = cr_dwconv(ctx, x, snac_w(w, "decoder.in_dw.weight"), snac_w(w, "decoder.in_dw.bias"), 1, 3, 3,
                  shape->cpu_ops); /* k7 "same" */
    x = cr_linear(ctx, x, snac_w(w, "decoder.in_pw.weight"), snac_w(w, "decoder.in_pw.bias"), ops);
    if (hp->window > 0) {
        struct ggml_tensor *pos = io[SNAC_IO_POS] = cr_input(ctx, GGML_TYPE_I32, T * B, 1, 1, "pos");
        x = snac_attention(ctx, w, x, pos, hp->window);
    }
    x = snac_mask(ctx, x, masks[0]);

    int64_t t = T;
    char p[64];
    const bool tf = shape->time_fastest;
    struct ggml_tensor *xt = NULL; /* the residual stream [t, B, C] on the time-fastest path */
    for (int i = 0; i < hp->n_blocks; i++) {
        const int s = hp->rates[i];
        snprintf(p, sizeof(p), "decoder.block.%d.snake", i);
        if (tf) {
            if (!xt) {
                xt = ggml_reshape_3d(ctx, cr_to_tf(ctx, x), t, B, x->ne[0]);
            }
            x = snac_snake_tf_to_cf(ctx, w, gf, xt, p); /* [Cin, t, B] */
        } else {
            x = snac_snake(ctx, w, gf, x, p, shape->cpu_ops);
        }
        t *= s;
        /* ConvTranspose1d(k 2s, stride s, padding ceil(s/2), output_padding s % 2): T*s samples */
        struct ggml_tensor *up_w = snac_w(w, "decoder.block.%d.up.weight", i);
        struct ggml_tensor *up_b = snac_w(w, "decoder.block.%d.up.bias", i);
        /* where the codecrt ops run and no noise comes between: its tail as one op, straight
           into the time-fastest residual stream, masked ([t, B, Cout]) */
        struct ggml_tensor *up = tf && shape->fused_unit && !(shape->noise && hp->noise)
                                     ? cr_upconv_tf(ctx, x, up_w, up_b,
                                                    masks[i + 1] ? ggml_reshape_2d(ctx, masks[i + 1], t, B) : NULL, s,
                                                    (s + 1) / 2, t)
                                     : NULL;
        if (up) {
            xt = up;
        } else {
            x = cr_upconv(ctx, x, up_w, up_b, s, (s + 1) / 2, t, ops, shape->cpu_ops);
            if (shape->noise && hp->noise) {
                snprintf(name, sizeof(name), "noise.%d", i);
                struct ggml_tensor *n = io[SNAC_IO_NOISE + i] = cr_input(ctx, GGML_TYPE_F32, 1, t, B, name);
                struct ggml_tensor *h = cr_mm(ctx, snac_w(w, "decoder.block.%d.noise.weight", i), x);
                x = ggml_add(ctx, x, ggml_mul(ctx, h, n));
            }
            x = snac_mask(ctx, x, masks[i + 1]);
            if (tf) {
                xt = ggml_reshape_3d(ctx, cr_to_tf(ctx, x), t, B, x->ne[0]);
            }
        }
        /* the mask of this resolution as [t, B], for the time-fastest stream's units */
        struct ggml_tensor *mt = masks[i + 1] && tf ? ggml_reshape_2d(ctx, masks[i + 1], t, B) : NULL;
        int dil = 1;
        for (int j = 0; j < 3; j++, dil *= 3) {
            const cr_res_unit u = snac_res_unit(w, i, j);
            if (tf) {
                xt = cr_res_unit_tf(ctx, gf, xt, &u, dil, true, shape->fused_unit, mt, NULL);
                continue;
            }
            struct ggml_tensor *y = cr_res_branch(ctx, gf, x, &u, dil, true, ops);
            x = snac_mask(ctx, ggml_add(ctx, x, y), masks[i + 1]);
        }
    }
    if (tf) {
        x = snac_snake_tf_to_cf(ctx, w, gf, xt, "decoder.out_snake");
    } else {
        x = snac_snake(ctx, w, gf, x, "decoder.out_snake", shape->cpu_ops);
    }
    x = cr_conv_narrow(ctx, x, snac_w(w, "decoder.out.weight"), snac_w(w, "decoder.out.bias"), SNAC_DW_K, 3,
                       3); /* [1, T*hop, B] */
    x = ggml_tanh(ctx, x);
    ggml_set_name(x, "pcm");
    ggml_set_output(x);
    io[SNAC_IO_OUT] = x;
    ggml_build_forward_expand(gf, x);
    return gf;
}

/* ------------------------------------------------------------------ inputs */

size_t snac_scratch_floats(const cr_model *model, const cr_decode_shape *shape) {
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

int64_t snac_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context) {
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

void snac_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *gio,
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
