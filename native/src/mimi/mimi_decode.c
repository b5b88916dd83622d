/*
 * mimi_decode.c: Mimi's offline decode graph and its host inputs: code-row
 * indices, absolute positions, the causal window mask. The decoder is causal,
 * so a bucketed graph (sequences right-padded to n_frames, batch padded)
 * needs no masks: padding only follows the valid samples.
 */
#include <math.h>
#include <stdio.h>

#include "mimi.h"


/* The SEANet decoder on x [D, S, B] (S transformer steps) -> PCM [1, S*hop, B], all convs causal. */
static struct ggml_tensor *mimi_seanet(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                       const mimi_hparams *hp, struct ggml_tensor *x, const cr_cpu_ops *ops) {
    const int64_t S = x->ne[1];
    x = cr_conv1d(ctx, gf, x, mimi_w(w, "dec.in.weight"), mimi_w(w, "dec.in.bias"), 1, hp->kernel - 1, 0, ops);
    int64_t t = S;
    for (int i = 0; i < hp->n_ratios; i++) {
        const int r = hp->ratios[i];
        t *= r;
        x = mimi_elu(ctx, ops != NULL, x);
        /* ConvTranspose1d(k 2r, stride r) with its last r samples trimmed: T*r samples */
        x = cr_upconv(ctx, x, mimi_w(w, "dec.up%d.weight", i), mimi_w(w, "dec.up%d.bias", i), r, 0, t, ops, ops != NULL);
        for (int j = 0; j < hp->n_res; j++) { /* one block (dilation 1), checked at load */
            struct ggml_tensor *y = mimi_elu(ctx, ops != NULL, x);
            /* C -> C/compress, k3, as K shifted products: never a [C*K, T] column matrix */
            y = cr_conv_narrow(ctx, y, mimi_w(w, "dec.res%d.%d.conv1.weight", i, j),
                               mimi_w(w, "dec.res%d.%d.conv1.bias", i, j), hp->res_kernel, hp->res_kernel - 1, 0);
            y = mimi_elu(ctx, ops != NULL, y);
            y = cr_linear(ctx, y, mimi_w(w, "dec.res%d.%d.conv2.weight", i, j), mimi_w(w, "dec.res%d.%d.conv2.bias", i, j),
                          ops); /* the fused product on the CPU, as the stream's */
            x = ggml_add(ctx, x, y);
        }
    }
    x = mimi_elu(ctx, ops != NULL, x);
    return cr_conv_narrow(ctx, x, mimi_w(w, "dec.out.weight"), mimi_w(w, "dec.out.bias"), hp->last_kernel,
                          hp->last_kernel - 1, 0);
}

struct ggml_cgraph *mimi_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                      const cr_decode_shape *shape, cr_graph_io *gio) {
    struct ggml_tensor **io = gio->t;
    const mimi_hparams *hp = model->hparams;
    const int64_t T = shape->n_frames, B = shape->n_batch, S = T * hp->up_stride, D = hp->dim;
    const cr_cpu_ops *ops = cr_graph_ops(shape->cpu_ops, shape->ops); /* packs */
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, CR_GRAPH_SIZE, false);

    mimi_new_inputs(ctx, io, hp->n_q, T, B, hp->up_stride);

    struct ggml_tensor *x = mimi_quantizer(ctx, w, hp, io + MIMI_IO_CODES, T, B); /* [D, T, B] */
    x = mimi_upsample(ctx, w, cr_pad_frames(ctx, x, 1, 0, ops != NULL), T);                                       /* [D, S, B] */

    const int64_t hd = mimi_head_dim(hp), H = hp->n_heads;
    for (int l = 0; l < hp->n_layers; l++) {
        struct ggml_tensor *h = cr_layer_norm(ctx, x, mimi_w(w, "tr.%d.norm1.weight", l),
                                              mimi_w(w, "tr.%d.norm1.bias", l), hp->norm_eps);
        struct ggml_tensor *qkv = cr_linear(ctx, h, mimi_w(w, "tr.%d.attn_qkv.weight", l), NULL, ops); /* [3D, S, B] */
        const size_t row = qkv->nb[1];
        struct ggml_tensor *q = ggml_view_3d(ctx, qkv, hd, H, S * B, hd * sizeof(float), row, 0);
        struct ggml_tensor *k = ggml_view_3d(ctx, qkv, hd, H, S * B, hd * sizeof(float), row, D * sizeof(float));
        struct ggml_tensor *v = ggml_view_3d(ctx, qkv, hd, H, S * B, hd * sizeof(float), row, 2 * D * sizeof(float));
        q = mimi_rope(ctx, hp, q, io[MIMI_IO_POS]);
        k = mimi_rope(ctx, hp, k, io[MIMI_IO_POS]);
        struct ggml_tensor *o = mimi_attend(ctx, hd, H, q, k, v, io[MIMI_IO_MASK], S, S, B);
        o = cr_linear(ctx, o, mimi_w(w, "tr.%d.attn_out.weight", l), NULL, ops); /* LayerScale folded in */
        x = ggml_add(ctx, x, o);
        x = mimi_ff(ctx, w, hp, x, l, ops);
    }
    x = mimi_seanet(ctx, w, gf, hp, x, ops); /* [1, T*1920, B] */
    ggml_set_name(x, "pcm");
    ggml_set_output(x);
    io[MIMI_IO_OUT] = x;
    ggml_build_forward_expand(gf, x);
    return gf;
}

/* ------------------------------------------------------------------ inputs */

void mimi_new_inputs(struct ggml_context *ctx, struct ggml_tensor **io, int n_q, int64_t T, int64_t B, int32_t rate) {
    const int64_t S = T * rate;
    char name[32];
    for (int k = 0; k < n_q; k++) {
        snprintf(name, sizeof(name), "codes.%d", k);
        io[MIMI_IO_CODES + k] = cr_input(ctx, GGML_TYPE_I32, T * B, 1, 1, name);
    }
    io[MIMI_IO_POS] = cr_input(ctx, GGML_TYPE_I32, S * B, 1, 1, "pos");
    io[MIMI_IO_MASK] = cr_input(ctx, GGML_TYPE_F32, S, S, 1, "mask"); /* [keys, queries] */
}

size_t mimi_inputs_scratch(int n_q, int32_t rate, const cr_decode_shape *shape) {
    const size_t S = (size_t)shape->n_frames * (size_t)rate;
    const size_t idx = (size_t)n_q * (size_t)shape->n_frames * (size_t)shape->n_batch;
    const size_t mask = S * S, pos = S * (size_t)shape->n_batch;
    size_t best = idx > mask ? idx : mask;
    return best > pos ? best : pos;
}

size_t mimi_scratch_floats(const cr_model *model, const cr_decode_shape *shape) {
    const mimi_hparams *hp = model->hparams;
    return mimi_inputs_scratch(hp->n_q, hp->up_stride, shape);
}

int64_t mimi_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context) {
    /* T new 12.5 Hz frames per stream; `context` extra steps of state at every rate (a
       stream tick's conv tails and transposed-conv overlaps, each a few steps at its own
       rate: never `context` coarse frames upsampled, which would size the last SEANet
       stage for 64 x 1,920 samples of state and cap a tick graph at about 100 streams) */
    const mimi_hparams *hp = model->hparams;
    int64_t tf = T * hp->up_stride; /* new steps at the current rate */
    const int64_t S = tf + context;
    int64_t best = 3 * (int64_t)hp->dim * S * B;
    /* scores [keys, queries, heads, B]; a stream tick's keys are its window ring's (stream_state.h) */
    int64_t keys = S + (context > 0 ? hp->context : 0);
    if (context > 0 && cr_window_steps(hp->context - 1, tf) > keys) {
        keys = cr_window_steps(hp->context - 1, tf);
    }
    const int64_t ff = (int64_t)hp->ff * S * B, kq = keys * S * hp->n_heads * B;
    const int64_t cb = (int64_t)hp->n_q * hp->cdim * (T + context) * B;
    best = ff > best ? ff : best;
    best = kq > best ? kq : best;
    best = cb > best ? cb : best;
    /* the first conv, causal: K-1 frames of padding */
    const int64_t in = cr_conv1d_max_elements(hp->kernel, hp->dim, mimi_channels(hp, 0), S + hp->kernel - 1, B);
    best = in > best ? in : best;
    for (int i = 0; i < hp->n_ratios; i++) {
        const int64_t r = hp->ratios[i], co = mimi_channels(hp, i + 1);
        const int64_t t_in = tf + context;
        const int64_t cols = 2 * r * co * (t_in + 2) * B;
        tf *= r;
        const int64_t t = tf + context;
        const int64_t out = co * (t + hp->res_kernel) * B * hp->res_kernel / hp->compress + co * t * B;
        best = cols > best ? cols : best;
        best = out > best ? out : best;
    }
    return best;
}

void mimi_fill_inputs(const cr_graph_io *gio, int n_q, int32_t bins, int32_t rate, int32_t context,
                      const cr_decode_shape *shape, const cr_decode_inputs *in) {
    struct ggml_tensor *const *io = gio->t;
    const int64_t Tg = shape->n_frames, Bg = shape->n_batch, S = Tg * rate;
    int32_t *iv = (int32_t *)in->scratch;
    const codecrt_codes *codes = in->codes;
    const int64_t Tv = in->n_frames, Bv = codes->n_batch;

    for (int k = 0; k < n_q; k++) {
        /* absent codebooks (k >= K) and padding read the zero row after each codebook */
        const int32_t *src = k < codes->n_levels ? codes->levels[k] : NULL;
        for (int64_t b = 0; b < Bg; b++) {
            for (int64_t t = 0; t < Tg; t++) {
                iv[b * Tg + t] = src && b < Bv && t < Tv ? src[b * Tv + t] : bins;
            }
        }
        ggml_backend_tensor_set(io[MIMI_IO_CODES + k], iv, 0, (size_t)(Tg * Bg) * sizeof(int32_t));
    }
    const int64_t p0 = in->frame_offset * rate;
    for (int64_t b = 0; b < Bg; b++) {
        for (int64_t t = 0; t < S; t++) {
            iv[b * S + t] = (int32_t)(p0 + t);
        }
    }
    ggml_backend_tensor_set(io[MIMI_IO_POS], iv, 0, (size_t)(S * Bg) * sizeof(int32_t));
    mimi_window_mask(in->scratch, S, context);
    ggml_backend_tensor_set(io[MIMI_IO_MASK], in->scratch, 0, (size_t)(S * S) * sizeof(float));
}

void mimi_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *gio,
                     const cr_decode_inputs *in) {
    const mimi_hparams *hp = model->hparams;
    mimi_fill_inputs(gio, hp->n_q, hp->bins, hp->up_stride, hp->context, shape, in);
}

void mimi_window_mask(float *f, int64_t S, int64_t context) {
    /* query q sees key k iff 0 <= q - k < context */
    for (int64_t q = 0; q < S; q++) {
        for (int64_t k = 0; k < S; k++) {
            f[q * S + k] = (q - k >= 0 && q - k < context) ? 0.0f : -INFINITY;
        }
    }
}
