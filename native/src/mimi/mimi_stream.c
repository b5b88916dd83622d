/*
 * mimi_stream.c: Mimi's streaming tick graph, exact: every layer is causal,
 * so each keeps the tail of its input that its next outputs need (stream_state.h)
 * and every point of the decoder is at delay 0. A tick of n frames emits
 * n * 1920 samples: the audio of those frames, final. States, in the order
 * the builder takes them (mimi_stream_states lists the same):
 *
 *   upsample          [D, 1]           the previous frame (transposed-conv overlap)
 *   layer l keys      ring [D, S']     post-RoPE keys of the last S' steps
 *                                      (S = W-1, W = context, S' = S rounded up
 *                                      to whole ticks of 2n steps): with the 2n
 *                                      new ones, every key of every new query's
 *                                      window; a ring (stream_state.h) that a
 *                                      tick writes 2n steps of, not all of them
 *   layer l values    ring [D, S']     their values, also channels fastest: the
 *                                      attention's output is an outer-product
 *                                      sum over the window (mimi_stream_attend)
 *   dec.in            [D, K-1]         the causal conv's left context
 *   ratio i up        [C_i, 1]         the previous input frame (overlap)
 *   ratio i res conv1 [C_i+1, KR-1]    the residual block's k3 conv context
 *   dec.out           [C_n, KL-1]      the last conv's context
 *
 * The attention mask is built in the graph: the band "key j of the window is
 * in the window of new query i" (E+i <= j <= E+S+i, E = S'-S older steps that
 * lead the ring's window; from two triangles of a constant square) times each
 * stream's key validity (positions >= 0, a time mask input: before a stream's
 * start the ring holds an earlier stream's steps, not keys), as an additive
 * 0 / -1e30 (finite: a row with no valid key stays finite).
 */
#include <math.h>
#include <stdio.h>

#include "mimi.h"


#define MIMI_POS_SITE (1 << 30) /* positions are absolute: "t mod site" never wraps in practice */

int mimi_stream_states(const cr_model *model, cr_state_spec *s, int max) {
    const mimi_hparams *hp = model->hparams;
    int n = 0;
    cr_state_spec_add(s, max, &n, hp->dim, 1);
    for (int l = 0; l < hp->n_layers; l++) {
        cr_state_spec_add_window(s, max, &n, hp->dim, hp->context - 1, hp->up_stride); /* keys */
        cr_state_spec_add_window(s, max, &n, hp->dim, hp->context - 1, hp->up_stride); /* values */
    }
    cr_state_spec_add(s, max, &n, hp->dim, hp->kernel - 1);
    for (int i = 0; i < hp->n_ratios; i++) {
        cr_state_spec_add(s, max, &n, mimi_channels(hp, i), 1);
        for (int j = 0; j < hp->n_res; j++) {
            cr_state_spec_add(s, max, &n, mimi_channels(hp, i + 1), hp->res_kernel - 1);
        }
    }
    cr_state_spec_add(s, max, &n, mimi_channels(hp, hp->n_ratios), hp->last_kernel - 1);
    return n;
}

struct ggml_tensor *mimi_stream_mask(cr_states *st, int64_t S, int32_t rate, int64_t n2) {
    struct ggml_context *ctx = st->ctx;
    const int64_t Tk = cr_window_steps(S, n2), E = Tk - n2 - S, B = st->B; /* E older steps lead the window */
    struct ggml_tensor *ones = ggml_fill(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, Tk, Tk), 1.0f);
    struct ggml_tensor *lo = ggml_tri(ctx, ones, GGML_TRI_TYPE_UPPER_DIAG); /* row r: 1 where j >= r */
    struct ggml_tensor *hi = ggml_tri(ctx, ones, GGML_TRI_TYPE_LOWER_DIAG); /* row r: 1 where j <= r */
    /* query i: keys E + i <= j <= E + S + i */
    struct ggml_tensor *band = ggml_mul(ctx, ggml_view_2d(ctx, lo, Tk, n2, lo->nb[1], (size_t)E * lo->nb[1]),
                                        ggml_view_2d(ctx, hi, Tk, n2, hi->nb[1], (size_t)(E + S) * hi->nb[1]));
    /* the keys' positions start Tk - n2 steps before the tick's first step */
    struct ggml_tensor *valid = cr_states_time(st, CR_TIME_MASK, Tk, rate, (int32_t)(Tk - n2), 0); /* [1, Tk, B] */
    struct ggml_tensor *m = ggml_mul(ctx, ggml_repeat_4d(ctx, band, Tk, n2, 1, B), ggml_reshape_4d(ctx, valid, Tk, 1, 1, B));
    return ggml_scale_bias(ctx, m, 1e30f, -1e30f);
}

struct ggml_cgraph *mimi_build_stream(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                      const cr_stream_shape *shape, struct ggml_tensor *const *pool, int n_pool,
                                      cr_graph_io *io) {
    const mimi_hparams *hp = model->hparams;
    const int64_t N = shape->chunk, B = shape->n_batch, D = hp->dim, n2 = N * hp->up_stride;
    const int64_t S = hp->context - 1, hd = mimi_head_dim(hp), H = hp->n_heads;
    const cr_cpu_ops *ops = cr_graph_ops(shape->cpu_ops, shape->ops); /* packs */
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, CR_GRAPH_SIZE, false);
    cr_states sts;
    cr_states *st = &sts;
    cr_states_init(st, ctx, gf, pool, n_pool, io, B, shape->masked, shape->cpu_ops);

    for (int k = 0; k < hp->n_q; k++) {
        io->codes[k] = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, N * B);
        ggml_set_input(io->codes[k]);
    }
    struct ggml_tensor *x = mimi_quantizer(ctx, w, hp, io->codes, N, B);    /* [D, N, B] */
    x = mimi_upsample(ctx, w, cr_states_append(st, x, 1), N);              /* [D, n2, B] */

    struct ggml_tensor *pos = cr_states_time(st, CR_TIME_POS, n2, hp->up_stride, 0, MIMI_POS_SITE);
    struct ggml_tensor *mask = mimi_stream_mask(st, S, hp->up_stride, n2);
    for (int l = 0; l < hp->n_layers; l++) {
        struct ggml_tensor *h = cr_layer_norm(ctx, x, mimi_w(w, "tr.%d.norm1.weight", l),
                                              mimi_w(w, "tr.%d.norm1.bias", l), hp->norm_eps);
        struct ggml_tensor *qkv = cr_linear(ctx, h, mimi_w(w, "tr.%d.attn_qkv.weight", l), NULL, ops); /* [3D, n2, B] */
        const size_t row = qkv->nb[1];
        struct ggml_tensor *q = ggml_view_3d(ctx, qkv, hd, H, n2 * B, hd * sizeof(float), row, 0);
        struct ggml_tensor *k = ggml_view_3d(ctx, qkv, hd, H, n2 * B, hd * sizeof(float), row, D * sizeof(float));
        struct ggml_tensor *v = ggml_view_3d(ctx, qkv, D, n2, B, row, row * n2, 2 * D * sizeof(float));
        q = mimi_rope(ctx, hp, q, pos);
        k = ggml_reshape_3d(ctx, mimi_rope(ctx, hp, k, pos), D, n2, B);
        struct ggml_tensor *o = mimi_stream_attend(st, hd, H, q, k, v, mask, S);
        o = cr_linear(ctx, o, mimi_w(w, "tr.%d.attn_out.weight", l), NULL, ops);
        x = ggml_add(ctx, x, o);
        x = mimi_ff(ctx, w, hp, x, l, ops);
    }

    /* SEANet: each conv "valid" over concat(state, input) */
    x = cr_conv1d(ctx, gf, cr_states_append(st, x, hp->kernel - 1), mimi_w(w, "dec.in.weight"), mimi_w(w, "dec.in.bias"),
                  1, 0, 0, ops);
    int64_t n = n2;
    for (int i = 0; i < hp->n_ratios; i++) {
        const int r = hp->ratios[i];
        x = mimi_elu(ctx, ops != NULL, x);
        x = cr_upconv_step(ctx, cr_states_append(st, x, 1), mimi_w(w, "dec.up%d.weight", i),
                           mimi_w(w, "dec.up%d.bias", i), r, ops); /* [C/2, n*r, B] */
        n *= r;
        for (int j = 0; j < hp->n_res; j++) {
            struct ggml_tensor *y = cr_states_append(st, mimi_elu(ctx, ops != NULL, x), hp->res_kernel - 1);
            y = cr_conv_narrow(ctx, y, mimi_w(w, "dec.res%d.%d.conv1.weight", i, j),
                               mimi_w(w, "dec.res%d.%d.conv1.bias", i, j), hp->res_kernel, 0, 0);
            y = mimi_elu(ctx, ops != NULL, y);
            y = cr_linear(ctx, y, mimi_w(w, "dec.res%d.%d.conv2.weight", i, j), mimi_w(w, "dec.res%d.%d.conv2.bias", i, j),
                          ops); /* the fused product on the CPU: the offline graph's kernel */
            x = ggml_add(ctx, x, y);
        }
    }
    x = cr_states_append(st, mimi_elu(ctx, ops != NULL, x), hp->last_kernel - 1);
    x = cr_conv_narrow(ctx, x, mimi_w(w, "dec.out.weight"), mimi_w(w, "dec.out.bias"), hp->last_kernel, 0, 0);
    (void)n;
    ggml_set_output(x);
    io->out = x; /* [1, N * 1920, B] */
    io->out_rate = hp->hop * hp->up_stride;
    io->out_delay = 0;
    ggml_build_forward_expand(gf, x);
    return gf;
}
