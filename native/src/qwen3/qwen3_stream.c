/*
 * qwen3_stream.c: the Qwen3-TTS 12 Hz decoder's streaming tick graph, exact
 * as Mimi's (mimi_stream.c): every layer is causal, so each keeps the tail
 * of its input that its next outputs need (stream_state.h) and every point
 * of the decoder is at delay 0. A tick of n frames emits n * 1920 samples:
 * the audio of those frames, final. States, in the order the builder takes
 * them (qwen3_stream_states lists the same):
 *
 *   pre_conv          [Q, 2]           the k3 causal conv's left context
 *   layer l keys      ring [A, S']     post-RoPE keys of the last S' frames
 *                                      (S = W-1, W = context, A = H hd, S' = S
 *                                      rounded up to whole ticks; stream_state.h)
 *   layer l values    ring [A, S']     their values (mimi_stream_attend)
 *   stage i dwconv    [L, 6]           the ConvNeXt's k7 depthwise conv context
 *   dec.in            [L, 6]           the decoder's first conv context
 *   rate i up         [C_i, 1]         the previous input frame (overlap)
 *   rate i res j      [C_i+1, 6 * 3^j] the dilated k7 conv's context
 *   dec.out           [C_n, 6]         the last conv's context
 *
 * The upsampling stack's transposed convs (kernel = stride) have no overlap
 * and no state. The attention mask is Mimi's: the window band times each
 * stream's key validity (mimi_stream_mask).
 */
#include <stdio.h>

#include "qwen3.h"

#include "mimi/mimi.h"


#define QWEN3_POS_SITE (1 << 30) /* positions are absolute: "t mod site" never wraps in practice */

int qwen3_stream_states(const cr_model *model, cr_state_spec *s, int max) {
    const qwen3_hparams *hp = model->hparams;
    int n = 0;
    cr_state_spec_add(s, max, &n, hp->qdim, QWEN3_PRE_K - 1);
    for (int l = 0; l < hp->n_layers; l++) {
        cr_state_spec_add_window(s, max, &n, (int64_t)hp->n_heads * hp->head_dim, hp->context - 1, 1); /* keys */
        cr_state_spec_add_window(s, max, &n, (int64_t)hp->n_heads * hp->head_dim, hp->context - 1, 1); /* values */
    }
    for (int i = 0; i < hp->n_up; i++) {
        cr_state_spec_add(s, max, &n, hp->latent, QWEN3_K - 1);
    }
    cr_state_spec_add(s, max, &n, hp->latent, QWEN3_K - 1);
    for (int i = 0; i < hp->n_rates; i++) {
        cr_state_spec_add(s, max, &n, qwen3_channels(hp, i), 1);
        for (int j = 0, dil = 1; j < QWEN3_N_RES; j++, dil *= 3) {
            cr_state_spec_add(s, max, &n, qwen3_channels(hp, i + 1), (QWEN3_K - 1) * dil);
        }
    }
    cr_state_spec_add(s, max, &n, qwen3_channels(hp, hp->n_rates), QWEN3_K - 1);
    return n;
}

struct ggml_cgraph *qwen3_build_stream(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                       const cr_stream_shape *shape, struct ggml_tensor *const *pool, int n_pool,
                                       cr_graph_io *io) {
    const qwen3_hparams *hp = model->hparams;
    const int64_t N = shape->chunk, B = shape->n_batch;
    const int64_t S = hp->context - 1, hd = hp->head_dim, H = hp->n_heads, A = H * hd;
    const bool cpu = shape->cpu_ops;
    const cr_cpu_ops *ops = cr_graph_ops(cpu, shape->ops);
    const bool dev = cr_conv_cols_on(shape->fused_unit, cpu); /* codecrt's device ops (qwen3.h) */
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, CR_GRAPH_SIZE, false);
    cr_states sts;
    cr_states *st = &sts;
    cr_states_init(st, ctx, gf, pool, n_pool, io, B, shape->masked, shape->cpu_ops);

    for (int k = 0; k < hp->n_q; k++) {
        io->codes[k] = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, N * B);
        ggml_set_input(io->codes[k]);
    }
    struct ggml_tensor *x = qwen3_quantizer(ctx, w, hp, io->codes, N, B); /* [Q, N, B] */
    x = cr_conv1d(ctx, gf, cr_states_append(st, x, QWEN3_PRE_K - 1), cr_weight(w, "pre_conv.weight"),
                  cr_weight(w, "pre_conv.bias"), 1, 0, 0, ops);
    x = cr_linear(ctx, x, cr_weight(w, "tr.in.weight"), cr_weight(w, "tr.in.bias"), ops); /* [D, N, B] */

    struct ggml_tensor *pos = cr_states_time(st, CR_TIME_POS, N, 1, 0, QWEN3_POS_SITE);
    struct ggml_tensor *mask = mimi_stream_mask(st, S, 1, N);
    for (int l = 0; l < hp->n_layers; l++) {
        struct ggml_tensor *qkv = qwen3_qkv(ctx, w, hp, x, l, ops); /* [3A, N, B] */
        const size_t row = qkv->nb[1];
        struct ggml_tensor *q = ggml_view_3d(ctx, qkv, hd, H, N * B, hd * sizeof(float), row, 0);
        struct ggml_tensor *k = ggml_view_3d(ctx, qkv, hd, H, N * B, hd * sizeof(float), row, A * sizeof(float));
        struct ggml_tensor *v = ggml_view_3d(ctx, qkv, A, N, B, row, row * N, 2 * A * sizeof(float));
        q = qwen3_rope(ctx, hp, q, pos);
        k = ggml_reshape_3d(ctx, qwen3_rope(ctx, hp, k, pos), A, N, B);
        struct ggml_tensor *o = mimi_stream_attend(st, hd, H, q, k, v, mask, S);
        x = qwen3_layer_out(ctx, w, hp, x, o, l, ops);
    }
    x = cr_rms_norm(ctx, x, cr_weight(w, "tr.norm.weight"), hp->norm_eps);
    x = cr_linear(ctx, x, cr_weight(w, "tr.out.weight"), cr_weight(w, "tr.out.bias"), ops); /* [L, N, B] */
    for (int i = 0; i < hp->n_up; i++) {
        x = qwen3_upsample(ctx, w, hp, x, i, ops);
        struct ggml_tensor *dw = cr_dwconv(ctx, cr_states_append(st, x, QWEN3_K - 1), cr_weight(w, "up%d.dw.weight", i),
                                           cr_weight(w, "up%d.dw.bias", i), 1, 0, 0, cpu);
        x = qwen3_convnext(ctx, w, x, dw, i, ops);
    }

    /* the decoder: each conv "valid" over concat(state, input) */
    x = cr_conv1d(ctx, gf, cr_states_append(st, x, QWEN3_K - 1), cr_weight(w, "dec.in.weight"), cr_weight(w, "dec.in.bias"),
                  1, 0, 0, ops);
    for (int i = 0; i < hp->n_rates; i++) {
        const int r = hp->rates[i];
        struct ggml_tensor *sx = dev ? qwen3_snake_dev(ctx, w, x, "dec.%d.snake", i) : NULL;
        x = sx ? sx : qwen3_snake(ctx, w, gf, x, cpu, "dec.%d.snake", i);
        x = cr_upconv_step(ctx, cr_states_append(st, x, 1), cr_weight(w, "dec.%d.up.weight", i),
                           cr_weight(w, "dec.%d.up.bias", i), r, ops); /* [C/2, n*r, B] */
        for (int j = 0, dil = 1; j < QWEN3_N_RES; j++, dil *= 3) {
            /* with dev the state holds x before Snake1, which the columns op applies (pointwise,
               so the same); should the ops not fit, the composed Snake runs on that buffer */
            struct ggml_tensor *buf = dev ? cr_states_append(st, x, (QWEN3_K - 1) * dil) : NULL;
            struct ggml_tensor *u = dev ? qwen3_res_unit_dev(ctx, w, buf, x, i, j, 0) : NULL;
            if (u) {
                x = u;
                continue;
            }
            struct ggml_tensor *y = qwen3_snake(ctx, w, gf, dev ? buf : x, cpu, "dec.%d.res.%d.snake1", i, j);
            y = dev ? y : cr_states_append(st, y, (QWEN3_K - 1) * dil);
            x = ggml_add(ctx, x, qwen3_res_branch(ctx, w, gf, y, i, j, 0, cpu, ops));
        }
    }
    struct ggml_tensor *so = dev ? qwen3_snake_dev(ctx, w, x, "dec.out_snake") : NULL;
    x = cr_states_append(st, so ? so : qwen3_snake(ctx, w, gf, x, cpu, "dec.out_snake"), QWEN3_K - 1);
    x = cr_conv_narrow(ctx, x, cr_weight(w, "dec.out.weight"), cr_weight(w, "dec.out.bias"), QWEN3_K, 0, 0);
    x = ggml_clamp(ctx, x, -1.0f, 1.0f);
    ggml_set_output(x);
    io->out = x; /* [1, N * hop, B] */
    io->out_rate = hp->hop;
    io->out_delay = 0;
    ggml_build_forward_expand(gf, x);
    return gf;
}
