/*
 * dac_stream.c: DAC's streaming tick graph, built as SNAC's (snac_stream.c):
 * every time-mixing layer reads concat(state, new input) and leaves the last
 * frames of that buffer as the next state, so each output is computed once
 * ("valid" convolution over the buffer). Each point of the decoder lags the
 * input frontier by a fixed delay d (in samples of its own rate r): a k7 conv
 * of dilation dil adds 3 dil, a transposed conv of stride s maps d to
 * d s + ceil(s/2). The output lags the codes by the right receptive field,
 * 3,141 samples at 24 and 16 kHz (9.8 frames), 4,757 at 44.1 kHz (9.3
 * frames): the stream is exact, equal to the offline decode. States, in the
 * order the builder takes them:
 *
 *   in            [L, 6]             left context of the k7 input conv
 *   block i up    [C_i, 1]           one input frame: the transposed conv's overlap
 *   block i res j [C_i+1, 6 * 3^j]   the dilated k7 conv's context; its middle
 *                                    doubles as the residual's delay line
 *   out           [C_n, 6]           the last conv's context
 *
 * An odd stride's lost sample is the end of the valid length at its point
 * (dac.h): on edge ticks the masks zero every point at or past it, as the
 * offline decode's zero padding does there, and the output past the last
 * valid sample (the silence appended offline).
 *
 * Activations stay channels fastest on every backend. Off the CPU each Snake
 * runs time fastest between two transposes and each k7 conv through im2col, or
 * as seven shifted products summed (CODECRT_CONV=taps; cr_conv1d), or with
 * CODECRT_CONV=cols on codecrt's device ops as the columns op with its Snake
 * gathered through it, one product and its bias (cr_res_unit_cols, layers.h), each
 * other Snake one pass of the columns op.
 */
#include <stdio.h>

#include "dac.h"

struct ggml_cgraph *dac_build_stream(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                     const cr_stream_shape *shape, struct ggml_tensor *const *pool, int n_pool,
                                     cr_graph_io *io) {
    const dac_hparams *hp = model->hparams;
    const int64_t N = shape->chunk, B = shape->n_batch, L = hp->latent_dim;
    const bool cpu = shape->cpu_ops;
    const cr_cpu_ops *ops = cr_graph_ops(cpu, shape->ops);
    const bool dev = cr_conv_cols_on(shape->fused_unit, cpu); /* codecrt's device ops (dac.h) */
    cr_states st;
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 4096, false);
    cr_states_init(&st, ctx, gf, pool, n_pool, io, B, shape->masked, shape->cpu_ops);

    for (int q = 0; q < hp->n_codebooks; q++) {
        io->codes[q] = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, N * B);
        ggml_set_input(io->codes[q]);
    }
    struct ggml_tensor *z = dac_quantize(ctx, w, io->codes, hp->n_codebooks, ops); /* [L, N*B] */
    int32_t r = 1, d = 0;
    int64_t n = N;
    struct ggml_tensor *x = cr_states_mask(&st, ggml_reshape_3d(ctx, z, L, N, B), r, d);

    struct ggml_tensor *buf = cr_states_append(&st, x, 6); /* [L, 6+N, B] */
    x = dac_conv(ctx, gf, buf, dac_w(w, "decoder.in.weight"), dac_w(w, "decoder.in.bias"), 1, 0, ops,
                 dev); /* valid */
    d += 3;
    x = cr_states_mask(&st, x, r, d);

    char p[64];
    for (int i = 0; i < hp->n_blocks; i++) {
        const int s = hp->rates[i];
        snprintf(p, sizeof(p), "decoder.block.%d.snake", i);
        buf = cr_states_append(&st, x, 1); /* [C_i, 1+n, B] */
        buf = dac_snake(ctx, w, gf, buf, p, cpu, dev);
        x = cr_upconv_step(ctx, buf, dac_w(w, "decoder.block.%d.up.weight", i),
                           dac_w(w, "decoder.block.%d.up.bias", i), s, ops); /* [C_i+1, n*s, B] */
        n *= s;
        r *= s;
        d = d * s + (s + 1) / 2;
        x = cr_states_mask(&st, x, r, d);
        for (int j = 0, dil = 1; j < 3; j++, dil *= 3) {
            const int P = 3 * dil;
            d += P;
            buf = cr_states_append(&st, x, 2 * P); /* [C, 2P+n, B] */
            struct ggml_tensor *xd = ggml_view_3d(ctx, buf, buf->ne[0], n, B, buf->nb[1], buf->nb[2],
                                                  (size_t)P * buf->nb[1]); /* the residual's delay line */
            x = cr_states_mask(&st, dac_res_unit(ctx, w, gf, buf, i, j, false, xd, ops, dev), r, d);
        }
    }
    buf = cr_states_append(&st, x, 6);
    buf = dac_snake(ctx, w, gf, buf, "decoder.out_snake", cpu, dev);
    /* the last conv (C -> 1, k7) as one product [7, n+6, B], then its 7 shifted diagonals summed */
    struct ggml_tensor *zc = cr_mm(ctx, dac_w(w, "decoder.out.weight"), buf);
    struct ggml_tensor *y = NULL;
    for (int64_t k = 0; k < DAC_K; k++) {
        struct ggml_tensor *v = ggml_view_3d(ctx, zc, 1, n, B, zc->nb[1], zc->nb[2],
                                             (size_t)k * sizeof(float) + (size_t)k * zc->nb[1]);
        y = y ? ggml_add(ctx, y, v) : ggml_cont(ctx, v);
    }
    y = ggml_tanh(ctx, ggml_add(ctx, y, dac_w(w, "decoder.out.bias")));
    d += 3;
    y = cr_states_mask(&st, y, r, d); /* zero past the valid end (an odd stride's lost samples) */
    ggml_set_output(y);
    io->out = y;
    io->out_rate = r;
    io->out_delay = d;
    ggml_build_forward_expand(gf, y);
    return gf;
}
