/*
 * qwen3_decode.c: the Qwen3-TTS 12 Hz decoder's offline graph: upstream's
 * Qwen3TTSTokenizerV2Decoder.forward, one graph over the whole sequence,
 * causal, so bucketed (right-padded) sequences need no masks. Its io table
 * and host inputs are Mimi's (MIMI_IO_*, mimi_fill_inputs: code rows,
 * absolute positions, the window mask), with the transformer at the frame rate.
 */
#include <stdio.h>

#include "qwen3.h"

#include "mimi/mimi.h"


/* The decoder after the upsampling stack: x [L, S, B] -> PCM [1, S * prod(rates), B], every conv causal. */
static struct ggml_tensor *qwen3_decoder(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                         const qwen3_hparams *hp, struct ggml_tensor *x, bool cpu,
                                         const cr_cpu_ops *ops, bool dev) {
    x = cr_conv1d(ctx, gf, x, cr_weight(w, "dec.in.weight"), cr_weight(w, "dec.in.bias"), 1, QWEN3_K - 1, 0, ops);
    int64_t t = x->ne[1];
    for (int i = 0; i < hp->n_rates; i++) {
        const int r = hp->rates[i];
        t *= r;
        struct ggml_tensor *sx = dev ? qwen3_snake_dev(ctx, w, x, "dec.%d.snake", i) : NULL;
        x = sx ? sx : qwen3_snake(ctx, w, gf, x, cpu, "dec.%d.snake", i);
        /* ConvTranspose1d(k 2r, stride r) with its last r samples trimmed: T*r samples */
        x = cr_upconv(ctx, x, cr_weight(w, "dec.%d.up.weight", i), cr_weight(w, "dec.%d.up.bias", i), r, 0, t, ops, cpu);
        for (int j = 0, dil = 1; j < QWEN3_N_RES; j++, dil *= 3) {
            struct ggml_tensor *u = dev ? qwen3_res_unit_dev(ctx, w, x, x, i, j, (QWEN3_K - 1) * dil) : NULL;
            if (u) {
                x = u;
                continue;
            }
            struct ggml_tensor *y = qwen3_snake(ctx, w, gf, x, cpu, "dec.%d.res.%d.snake1", i, j);
            x = ggml_add(ctx, x, qwen3_res_branch(ctx, w, gf, y, i, j, (QWEN3_K - 1) * dil, cpu, ops));
        }
    }
    struct ggml_tensor *sx = dev ? qwen3_snake_dev(ctx, w, x, "dec.out_snake") : NULL;
    x = sx ? sx : qwen3_snake(ctx, w, gf, x, cpu, "dec.out_snake");
    x = cr_conv_narrow(ctx, x, cr_weight(w, "dec.out.weight"), cr_weight(w, "dec.out.bias"), QWEN3_K, QWEN3_K - 1, 0);
    return ggml_clamp(ctx, x, -1.0f, 1.0f);
}

struct ggml_cgraph *qwen3_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                       const cr_decode_shape *shape, cr_graph_io *gio) {
    struct ggml_tensor **io = gio->t;
    const qwen3_hparams *hp = model->hparams;
    const int64_t T = shape->n_frames, B = shape->n_batch, hd = hp->head_dim, H = hp->n_heads, A = H * hd;
    const bool cpu = shape->cpu_ops;
    const cr_cpu_ops *ops = cr_graph_ops(cpu, shape->ops);
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, CR_GRAPH_SIZE, false);

    mimi_new_inputs(ctx, io, hp->n_q, T, B, 1);

    struct ggml_tensor *x = qwen3_quantizer(ctx, w, hp, io + MIMI_IO_CODES, T, B); /* [Q, T, B] */
    x = cr_conv1d(ctx, gf, x, cr_weight(w, "pre_conv.weight"), cr_weight(w, "pre_conv.bias"), 1, QWEN3_PRE_K - 1, 0, ops);
    x = cr_linear(ctx, x, cr_weight(w, "tr.in.weight"), cr_weight(w, "tr.in.bias"), ops); /* [D, T, B] */
    for (int l = 0; l < hp->n_layers; l++) {
        struct ggml_tensor *qkv = qwen3_qkv(ctx, w, hp, x, l, ops); /* [3A, T, B] */
        const size_t row = qkv->nb[1];
        struct ggml_tensor *q = ggml_view_3d(ctx, qkv, hd, H, T * B, hd * sizeof(float), row, 0);
        struct ggml_tensor *k = ggml_view_3d(ctx, qkv, hd, H, T * B, hd * sizeof(float), row, A * sizeof(float));
        struct ggml_tensor *v = ggml_view_3d(ctx, qkv, hd, H, T * B, hd * sizeof(float), row, 2 * A * sizeof(float));
        q = qwen3_rope(ctx, hp, q, io[MIMI_IO_POS]);
        k = qwen3_rope(ctx, hp, k, io[MIMI_IO_POS]);
        struct ggml_tensor *o = mimi_attend(ctx, hd, H, q, k, v, io[MIMI_IO_MASK], T, T, B); /* [A, T, B] */
        x = qwen3_layer_out(ctx, w, hp, x, o, l, ops);
    }
    x = cr_rms_norm(ctx, x, cr_weight(w, "tr.norm.weight"), hp->norm_eps);
    x = cr_linear(ctx, x, cr_weight(w, "tr.out.weight"), cr_weight(w, "tr.out.bias"), ops); /* [L, T, B] */
    for (int i = 0; i < hp->n_up; i++) {
        x = qwen3_upsample(ctx, w, hp, x, i, ops);
        struct ggml_tensor *dw =
            cr_dwconv(ctx, x, cr_weight(w, "up%d.dw.weight", i), cr_weight(w, "up%d.dw.bias", i), 1, QWEN3_K - 1, 0,
                      cpu);
        x = qwen3_convnext(ctx, w, x, dw, i, ops);
    }
    x = qwen3_decoder(ctx, w, gf, hp, x, cpu, ops, cr_conv_cols_on(shape->fused_unit, cpu)); /* [1, T*hop, B] */
    ggml_set_name(x, "pcm");
    ggml_set_output(x);
    io[MIMI_IO_OUT] = x;
    ggml_build_forward_expand(gf, x);
    return gf;
}

/* ------------------------------------------------------------------ inputs */

size_t qwen3_scratch_floats(const cr_model *model, const cr_decode_shape *shape) {
    const qwen3_hparams *hp = model->hparams;
    return mimi_inputs_scratch(hp->n_q, 1, shape);
}

int64_t qwen3_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context) {
    /* T new frames per stream and `context` extra steps of state at every rate (a tick's
       conv tails and overlaps); the KV window is counted in the scores' keys */
    const qwen3_hparams *hp = model->hparams;
    const int64_t A = (int64_t)hp->n_heads * hp->head_dim;
    const int64_t S = T + context, ring = context > 0 ? cr_window_steps(hp->context - 1, T) : 0;
    const int64_t keys = ring > S + hp->context ? ring : S + (context > 0 ? hp->context : 0);
    int64_t best = (int64_t)hp->n_q * hp->cdim * S * B;
    const int64_t cand[] = {3 * A * S * B, (int64_t)hp->ff * S * B, keys * S * hp->n_heads * B,
                            cr_conv1d_max_elements(QWEN3_PRE_K, hp->qdim, hp->latent, S + QWEN3_PRE_K - 1, B)};
    for (size_t i = 0; i < sizeof(cand) / sizeof(cand[0]); i++) {
        best = cand[i] > best ? cand[i] : best;
    }
    int64_t tf = T;
    for (int i = 0; i < hp->n_up; i++) {
        tf *= hp->up[i];
        const int64_t pw = 4 * (int64_t)hp->latent * (tf + context) * B;
        best = pw > best ? pw : best;
    }
    /* the first conv, causal: K-1 frames of padding */
    const int64_t in =
        cr_conv1d_max_elements(QWEN3_K, hp->latent, qwen3_channels(hp, 0), tf + context + QWEN3_K - 1, B);
    best = in > best ? in : best;
    for (int i = 0; i < hp->n_rates; i++) {
        const int64_t r = hp->rates[i], co = qwen3_channels(hp, i + 1);
        const int64_t cols = 2 * r * co * (tf + context + 2) * B;
        tf *= r;
        /* a residual conv: 6*9 frames of context plus the new */
        const int64_t col = cr_conv1d_max_elements(QWEN3_K, co, co, tf + context + (QWEN3_K - 1) * 9, B);
        best = cols > best ? cols : best;
        best = col > best ? col : best;
    }
    return best;
}

void qwen3_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *gio,
                      const cr_decode_inputs *in) {
    const qwen3_hparams *hp = model->hparams;
    mimi_fill_inputs(gio, hp->n_q, hp->bins, 1, hp->context, shape, in); /* the transformer runs at the frame rate */
}
