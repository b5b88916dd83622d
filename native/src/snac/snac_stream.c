/*
 * snac_stream.c: SNAC's streaming tick graph. Every time-mixing layer reads concat(state, new input)
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
#include <stdio.h>

#include "snac.h"

/*
 * Off the CPU the decoder blocks keep their residual stream time fastest,
 * x [n, B, C], so the Snake-depthwise-Snake core needs no transposes: the one
 * transpose per residual unit feeds the 1x1 conv, whose product is taken as
 * y^T w, landing time fastest again (cr_res_unit_tf). The state pools are laid
 * out differently on the two paths (cr_states_append and _append_tf); a
 * context only ever uses one of them.
 */

struct ggml_cgraph *snac_build_stream(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                      const cr_stream_shape *shape, struct ggml_tensor *const *pool, int n_pool,
                                      cr_graph_io *io) {
    const snac_hparams *hp = model->hparams;
    const int64_t N = shape->chunk, B = shape->n_batch, L = hp->latent_dim;
    cr_states states; /* the state buffers and inputs (stream_state.h) */
    cr_states *st = &states;
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 4096, false);
    cr_states_init(st, ctx, gf, pool, n_pool, io, B, shape->masked, shape->cpu_ops);
    /* the fused CPU products (the 1x1 convs, the transposed convs' products) on the CPU: the
       offline graph's kernel, so the same bits at any number of frames */
    const cr_cpu_ops *ops = cr_graph_ops(shape->cpu_ops, shape->ops);

    struct ggml_tensor *z = NULL;
    for (int l = 0; l < hp->n_levels; l++) {
        const int64_t s = hp->strides[l], Nl = N / s;
        struct ggml_tensor *codes = io->codes[l] = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, Nl * B);
        ggml_set_input(codes);
        struct ggml_tensor *e = ggml_get_rows(ctx, snac_w(w, "quantizer.%d.codebook", l), codes);
        /* cr_linear, not ggml's product: on the CPU the offline graph's kernel, the same bits
           at any number of frames (ggml's summation order follows the shapes: on an AVX2 CPU
           this product and in_pw's left the small random SNAC's stream 1e-4 from offline) */
        struct ggml_tensor *y = cr_linear(ctx, e, snac_w(w, "quantizer.%d.out_proj.weight", l),
                                          snac_w(w, "quantizer.%d.out_proj.bias", l), ops);
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
    x = cr_dwconv(ctx, buf, snac_w(w, "decoder.in_dw.weight"), snac_w(w, "decoder.in_dw.bias"), 1, 0, 0,
                  shape->cpu_ops); /* valid */
    d += 3;
    x = cr_linear(ctx, x, snac_w(w, "decoder.in_pw.weight"), snac_w(w, "decoder.in_pw.bias"), ops);
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
    /* on the time-fastest path, the next layer's buffer [S+n, B, C] that the previous op (a
       unit's tail, a transposed conv's tail) wrote after that layer's state (the ops' prefix):
       the concats they replace were 28 % of a tick's kernel time at 2,000 streams on an H100 */
    struct ggml_tensor *next = NULL;
    for (int i = 0; i < hp->n_blocks; i++) {
        const int s = hp->rates[i];
        const int64_t Cout = snac_w(w, "decoder.block.%d.up.bias", i)->ne[0];
        snprintf(p, sizeof(p), "decoder.block.%d.snake", i);
        if (tf) {
            /* [1+n, B, Cin]: the last unit's tail op wrote it after this state, or (the first
               block) the concat */
            if (!next) {
                next = cr_states_append_tf(st, ggml_reshape_3d(ctx, cr_to_tf(ctx, x), n, B, x->ne[0]), 1);
            }
            buf = snac_snake_tf_to_cf(ctx, w, gf, next, p); /* [Cin, 1+n, B] */
            next = NULL;
        } else {
            buf = cr_states_append(st, x, 1); /* [Cin, 1+n, B] */
            buf = snac_snake(ctx, w, gf, buf, p, true);
        }
        struct ggml_tensor *up_w = snac_w(w, "decoder.block.%d.up.weight", i);
        struct ggml_tensor *up_b = snac_w(w, "decoder.block.%d.up.bias", i);
        n *= s;
        r *= s;
        d = d * s + (s + 1) / 2;
        /* on the time-fastest path the block's first unit's state (2P = 6 frames, dil 1) is
           taken here, in the list's order, so that the transposed conv's tail op writes it
           before its output */
        cr_state_tf ux = {0};
        if (tf) {
            ux = cr_states_take_tf(st, 2 * 3, Cout);
        }
        /* where the codecrt ops run and no noise comes between: the tail op straight into the
           time-fastest stream ([6+n*s, B, Cout]: the unit's state, then the step masked on
           edge ticks), one pass where the concat, the composed halves' add, the bias, the mask
           and the transpose are five. Output sample o of the step is the buffer's frame 1 + o/s
           (lo half) plus frame o/s (hi half): the offline tail's formula with crop s over the
           1+n frames of buf. */
        struct ggml_tensor *up = tf && shape->fused_unit && !(hp->noise && shape->noise)
                                     ? cr_upconv_tail(ctx, cr_mm(ctx, up_w, buf), up_b, cr_states_mask_of(st, n, r, d),
                                                      s, s, n, ux.st)
                                     : NULL;
        if (up) {
            next = cr_states_put_tf(st, &ux, up);
        } else {
            x = cr_upconv_step(ctx, buf, up_w, up_b, s, ops); /* [Cout, n*s, B] */
            if (hp->noise && shape->noise) { /* with every stream's noise off it adds exactly 0 */
                struct ggml_tensor *nz = cr_states_time(st, CR_TIME_NOISE, n, r, d, i);
                struct ggml_tensor *h = cr_mm(ctx, snac_w(w, "decoder.block.%d.noise.weight", i), x);
                x = ggml_add(ctx, x, ggml_mul(ctx, h, nz));
            }
            x = cr_states_mask(st, x, r, d);
            if (tf) { /* [6+n*s, B, Cout] by the concat pass */
                next = cr_states_join_tf(st, &ux, ggml_reshape_3d(ctx, cr_to_tf(ctx, x), n, B, Cout));
            }
        }
        int dil = 1;
        for (int j = 0; j < 3; j++, dil *= 3) {
            const int P = 3 * dil;
            const cr_res_unit u = snac_res_unit(w, i, j);
            d += P;
            if (tf) {
                /* [2P+n, B, C]: the upconv's or the previous unit's tail op's output, which it
                   wrote after this unit's state itself (no concat pass) */
                buf = next;
                /* the next layer's state, S frames: the next unit's 2P', the next block's
                   Snake input (1 frame) or the last conv's (6) */
                const int64_t S = j < 2 ? 2 * 3 * (3 * dil) : i + 1 < hp->n_blocks ? 1 : 6;
                cr_state_tf nx = cr_states_take_tf(st, S, Cout);
                next = cr_states_put_tf(st, &nx,
                                        cr_res_unit_tf(ctx, gf, buf, &u, dil, false, shape->fused_unit,
                                                       cr_states_mask_of(st, n, r, d), nx.st)); /* [S+n, B, C] */
                continue;
            }
            buf = cr_states_append(st, x, 2 * P); /* [C, 2P+n, B] */
            struct ggml_tensor *y = cr_res_branch(ctx, gf, buf, &u, dil, false, ops);
            struct ggml_tensor *xd = ggml_view_3d(ctx, buf, buf->ne[0], n, B, buf->nb[1], buf->nb[2],
                                                  (size_t)P * buf->nb[1]);
            x = cr_states_mask(st, ggml_add(ctx, xd, y), r, d);
        }
    }
    struct ggml_tensor *y = NULL;
    if (tf) {
        /* the last conv (C -> 1, k7) as one product buf^T w [(n+6)*B, 7], then
           its 7 shifted columns summed: out[t, b] = sum_k zc[t + k + (n+6) b, k] */
        if (!next) { /* no block */
            next = cr_states_append_tf(st, ggml_reshape_3d(ctx, cr_to_tf(ctx, x), n, B, x->ne[0]), 6);
        }
        buf = snac_snake_tf_to_cf(ctx, w, gf, next,
                                  "decoder.out_snake"); /* [C, n+6, B] */
        struct ggml_tensor *zc = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, buf, buf->ne[0], (n + 6) * B),
                                              cr_f32(ctx, snac_w(w, "decoder.out.weight"))); /* [(n+6)*B, 7] */
        for (int64_t k = 0; k < SNAC_DW_K; k++) {
            struct ggml_tensor *v = ggml_view_2d(ctx, zc, n, B, (size_t)(n + 6) * sizeof(float),
                                                 (size_t)k * zc->nb[1] + (size_t)k * sizeof(float));
            y = y ? ggml_add(ctx, y, v) : ggml_cont(ctx, v);
        }
        y = ggml_reshape_3d(ctx, y, 1, n, B);
    } else {
        buf = cr_states_append(st, x, 6);
        buf = snac_snake(ctx, w, gf, buf, "decoder.out_snake", true);
        struct ggml_tensor *zc = ggml_mul_mat(ctx, snac_w(w, "decoder.out.weight"), buf); /* [7, n+6, B] */
        for (int64_t k = 0; k < SNAC_DW_K; k++) {
            struct ggml_tensor *v = ggml_view_3d(ctx, zc, 1, n, B, zc->nb[1], zc->nb[2],
                                                 (size_t)k * sizeof(float) + (size_t)k * zc->nb[1]);
            y = y ? ggml_add(ctx, y, v) : ggml_cont(ctx, v);
        }
    }
    y = ggml_tanh(ctx, ggml_add(ctx, y, snac_w(w, "decoder.out.bias")));
    d += 3;
    ggml_set_output(y);
    io->out = y;
    io->out_rate = r;
    io->out_delay = d;
    ggml_build_forward_expand(gf, y);
    return gf;
}

