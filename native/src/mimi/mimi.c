/*
 * mimi.c: Mimi's hyperparameters, tensor list, architecture table, and the
 * graph pieces both of its graphs use (mimi.h draws the decoder).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mimi.h"

/* --------------------------------------------------------- hyperparameters */

static codecrt_status mimi_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    mimi_hparams *hp = hp_;
    codecrt_status st;
    if ((st = cr_gguf_u32(g, "mimi.sample_rate", &hp->sample_rate, err)) ||
        (st = cr_gguf_u32(g, "mimi.dim", &hp->dim, err)) ||
        (st = cr_gguf_u32(g, "mimi.n_filters", &hp->n_filters, err)) ||
        (st = cr_gguf_u32(g, "mimi.n_residual_layers", &hp->n_res, err)) ||
        (st = cr_gguf_u32(g, "mimi.kernel_size", &hp->kernel, err)) ||
        (st = cr_gguf_u32(g, "mimi.last_kernel_size", &hp->last_kernel, err)) ||
        (st = cr_gguf_u32(g, "mimi.residual_kernel_size", &hp->res_kernel, err)) ||
        (st = cr_gguf_u32(g, "mimi.dilation_base", &hp->dil_base, err)) ||
        (st = cr_gguf_u32(g, "mimi.compress", &hp->compress, err)) ||
        (st = cr_gguf_u32(g, "mimi.n_q", &hp->n_q, err)) ||
        (st = cr_gguf_u32(g, "mimi.n_q_semantic", &hp->n_q_sem, err)) ||
        (st = cr_gguf_u32(g, "mimi.codebook_size", &hp->bins, err)) ||
        (st = cr_gguf_u32(g, "mimi.codebook_dim", &hp->cdim, err)) ||
        (st = cr_gguf_u32(g, "mimi.n_layers", &hp->n_layers, err)) ||
        (st = cr_gguf_u32(g, "mimi.n_heads", &hp->n_heads, err)) ||
        (st = cr_gguf_u32(g, "mimi.ff_dim", &hp->ff, err)) ||
        (st = cr_gguf_u32(g, "mimi.context", &hp->context, err)) ||
        (st = cr_gguf_u32(g, "mimi.upsample_stride", &hp->up_stride, err)) ||
        (st = cr_gguf_u32(g, "mimi.hop", &hp->hop, err)) ||
        (st = cr_gguf_i32_array(g, "mimi.ratios", hp->ratios, MIMI_MAX_RATIOS, &hp->n_ratios, err)) ||
        (st = cr_gguf_f32(g, "mimi.rope_theta", &hp->rope_theta, err)) ||
        (st = cr_gguf_f32(g, "mimi.norm_eps", &hp->norm_eps, err))) {
        return st;
    }
    if (hp->up_stride != 2) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "mimi.upsample_stride = %d; the runtime implements 2 (k 4)",
                       hp->up_stride);
    }
    if (hp->sample_rate < 1000 || hp->dim < 2 || hp->n_heads < 1 || hp->dim % hp->n_heads ||
        mimi_head_dim(hp) % 2 || hp->n_layers > MIMI_MAX_LAYERS || hp->n_res != 1) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS,
                       "mimi: dim %d, %d heads (even head size), %d layers (<= %d), %d residual blocks per ratio (1)",
                       hp->dim, hp->n_heads, hp->n_layers, MIMI_MAX_LAYERS, hp->n_res);
    }
    /* the first codebook is the semantic one (its own projection): at least one of it and one acoustic */
    if (hp->n_q > CODECRT_MAX_LEVELS || hp->n_q_sem < 1 || hp->n_q_sem >= hp->n_q) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "mimi: %d codebooks (at most %d), %d semantic (1 to fewer)",
                       hp->n_q, CODECRT_MAX_LEVELS, hp->n_q_sem);
    }
    if (hp->bins < 2 || hp->cdim < 1 || hp->ff < 1 || hp->n_filters < 1 || hp->compress < 1 || hp->hop < 1 ||
        hp->n_ratios < 1) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS,
                       "mimi: codebook_size %d (>= 2), codebook_dim %d, ff_dim %d, n_filters %d, compress %d, hop %d, "
                       "%d ratios (>= 1)",
                       hp->bins, hp->cdim, hp->ff, hp->n_filters, hp->compress, hp->hop, hp->n_ratios);
    }
    if ((int64_t)hp->n_q * (hp->bins + 1) > INT32_MAX / 2 || hp->context < 2 || hp->context > 1 << 16 ||
        hp->kernel < 2 || hp->kernel > 64 || hp->last_kernel < 2 || hp->last_kernel > 64 || hp->res_kernel < 2 ||
        hp->res_kernel > 64 || hp->dil_base > 64) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "mimi hyperparameters out of range");
    }
    int64_t hop = 1;
    for (int i = 0; i < hp->n_ratios; i++) {
        if (hp->ratios[i] < 1 || hp->ratios[i] > 64) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "mimi.ratios[%d] = %d (1 to 64)", i, hp->ratios[i]);
        }
        hop *= hp->ratios[i];
    }
    if (hop != hp->hop) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "mimi.hop = %d but prod(ratios) = %lld", hp->hop, (long long)hop);
    }
    if ((int64_t)hp->n_filters << hp->n_ratios > 1 << 16 || mimi_channels(hp, hp->n_ratios) % hp->compress) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "mimi: n_filters %d with %d ratios and compress %d",
                       hp->n_filters, hp->n_ratios, hp->compress);
    }
    if (!(hp->rope_theta > 0.0f) || !(hp->norm_eps > 0.0f) || !isfinite(hp->rope_theta)) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "mimi: rope_theta and norm_eps must be positive");
    }
    return CODECRT_OK;
}

static void mimi_fill_info(const void *hp_, codecrt_model_info *info) {
    const mimi_hparams *hp = hp_;
    info->sample_rate = hp->sample_rate;
    info->hop_length = hp->hop * hp->up_stride;
    info->n_levels = hp->n_q;
    for (int l = 0; l < hp->n_q; l++) {
        info->codebook_size[l] = hp->bins;
        info->level_stride[l] = 1;
    }
    info->frame_multiple = 1;
}

/* ------------------------------------------------------------ tensor specs */

static void mimi_tensor_specs(const void *hp_, cr_spec_list *s) {
    const mimi_hparams *hp = hp_;
    const int64_t D = hp->dim, F = hp->ff;
    cr_spec_add(s, false, 2, hp->cdim, (int64_t)hp->n_q * (hp->bins + 1), "quant.codebooks");
    cr_spec_add(s, false, 2, hp->cdim, D, "quant.first.proj");
    cr_spec_add(s, false, 2, hp->cdim, D, "quant.rest.proj");
    cr_spec_add(s, false, 2, D, 4, "upsample.weight");
    for (int l = 0; l < hp->n_layers; l++) {
        cr_spec_add(s, false, 1, D, 1, "tr.%d.norm1.weight", l);
        cr_spec_add(s, false, 1, D, 1, "tr.%d.norm1.bias", l);
        cr_spec_add(s, false, 1, D, 1, "tr.%d.norm2.weight", l);
        cr_spec_add(s, false, 1, D, 1, "tr.%d.norm2.bias", l);
        cr_spec_add(s, true, 2, D, 3 * D, "tr.%d.attn_qkv.weight", l);
        cr_spec_add(s, true, 2, D, D, "tr.%d.attn_out.weight", l);
        cr_spec_add(s, true, 2, D, F, "tr.%d.ff1.weight", l);
        cr_spec_add(s, true, 2, F, D, "tr.%d.ff2.weight", l);
    }
    const int64_t C0 = mimi_channels(hp, 0);
    cr_spec_add3(s, false, hp->kernel, D, C0, "dec.in.weight");
    cr_spec_add(s, false, 1, C0, 1, "dec.in.bias");
    for (int i = 0; i < hp->n_ratios; i++) {
        const int64_t ci = mimi_channels(hp, i), co = mimi_channels(hp, i + 1), hid = co / hp->compress;
        cr_spec_add(s, false, 2, ci, 2 * (int64_t)hp->ratios[i] * co, "dec.up%d.weight", i);
        cr_spec_add(s, false, 1, co, 1, "dec.up%d.bias", i);
        for (int j = 0; j < hp->n_res; j++) {
            cr_spec_add(s, false, 2, co, (int64_t)hp->res_kernel * hid, "dec.res%d.%d.conv1.weight", i, j);
            cr_spec_add(s, false, 1, hid, 1, "dec.res%d.%d.conv1.bias", i, j);
            cr_spec_add(s, false, 2, hid, co, "dec.res%d.%d.conv2.weight", i, j);
            cr_spec_add(s, false, 1, co, 1, "dec.res%d.%d.conv2.bias", i, j);
        }
    }
    cr_spec_add(s, false, 2, mimi_channels(hp, hp->n_ratios), hp->last_kernel, "dec.out.weight");
    cr_spec_add(s, false, 1, 1, 1, "dec.out.bias");
}

/* ----------------------------------------------------------- graph pieces */

struct ggml_tensor *mimi_split_rvq(struct ggml_context *ctx, struct ggml_context *w, int n_q, int n_sem, int bins,
                                   int cdim, struct ggml_tensor *const *codes, int64_t T, int64_t B) {
    struct ggml_tensor *cb = mimi_w(w, "quant.codebooks"); /* [cdim, n_q * (bins + 1)] */
    struct ggml_tensor *e[2] = {NULL, NULL};               /* per group: sum of the looked-up rows [cdim, T*B] */
    for (int k = 0; k < n_q; k++) {
        struct ggml_tensor *book =
            ggml_view_2d(ctx, cb, cdim, bins + 1, cb->nb[1], (size_t)k * (size_t)(bins + 1) * cb->nb[1]);
        struct ggml_tensor *r = ggml_get_rows(ctx, book, codes[k]);
        const int g = k >= n_sem;
        e[g] = e[g] ? ggml_add(ctx, e[g], r) : r;
    }
    struct ggml_tensor *z = cr_pwconv(ctx, ggml_reshape_3d(ctx, e[0], cdim, T, B), mimi_w(w, "quant.first.proj"), NULL);
    return ggml_add(ctx, z, cr_pwconv(ctx, ggml_reshape_3d(ctx, e[1], cdim, T, B), mimi_w(w, "quant.rest.proj"),
                                      NULL)); /* [D, T, B] */
}

struct ggml_tensor *mimi_upsample(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *buf,
                                  int64_t n) {
    const int64_t D = buf->ne[0], B = buf->ne[2];
    struct ggml_tensor *wt = mimi_w(w, "upsample.weight"); /* [D, 4]: tap k at column k */
    /* output step 2t+r = w_r x_t + w_{r+2} x_{t-1} (ConvTranspose1d k4 s2, its last 2 samples trimmed) */
    struct ggml_tensor *cur = ggml_view_3d(ctx, buf, D, n, B, buf->nb[1], buf->nb[2], buf->nb[1]);
    struct ggml_tensor *prev = ggml_view_3d(ctx, buf, D, n, B, buf->nb[1], buf->nb[2], 0);
    struct ggml_tensor *tap[4];
    for (int k = 0; k < 4; k++) {
        tap[k] = ggml_view_1d(ctx, wt, D, (size_t)k * wt->nb[1]);
    }
    struct ggml_tensor *y0 = ggml_add(ctx, ggml_mul(ctx, cur, tap[0]), ggml_mul(ctx, prev, tap[2]));
    struct ggml_tensor *y1 = ggml_add(ctx, ggml_mul(ctx, cur, tap[1]), ggml_mul(ctx, prev, tap[3]));
    /* [D, 1, n*B] twice -> [D, 2, n*B] = [D, 2n, B]: three dimensions, since ggml's CUDA concat
       launches one kernel per index of ne3 (1,000 launches a tick at 1,000 streams with B there) */
    struct ggml_tensor *y = ggml_concat(ctx, ggml_reshape_3d(ctx, y0, D, 1, n * B), ggml_reshape_3d(ctx, y1, D, 1, n * B),
                                        1);
    return ggml_reshape_3d(ctx, y, D, 2 * n, B);
}

struct ggml_tensor *mimi_rope(struct ggml_context *ctx, const mimi_hparams *hp, struct ggml_tensor *x,
                              struct ggml_tensor *pos) {
    /* moshi's apply_rope rotates pairs (2i, 2i+1) by pos * theta^(-2i/hd): ggml's normal mode */
    return ggml_rope_ext(ctx, x, pos, NULL, mimi_head_dim(hp), GGML_ROPE_TYPE_NORMAL, 0, hp->rope_theta, 1.0f, 0.0f,
                         1.0f, 0.0f, 0.0f);
}

struct ggml_tensor *mimi_attend_vt(struct ggml_context *ctx, int64_t hd, int64_t H, struct ggml_tensor *q,
                                   struct ggml_tensor *k, struct ggml_tensor *vt, struct ggml_tensor *mask,
                                   int64_t Tq, int64_t Tk, int64_t B) {
    /* [hd, H, T*B] -> [hd, T, H, B] views (no copy of a contiguous q or k) */
    q = ggml_permute(ctx, ggml_reshape_4d(ctx, cr_dense(ctx, q), hd, H, Tq, B), 0, 2, 1, 3);
    k = ggml_permute(ctx, ggml_reshape_4d(ctx, cr_dense(ctx, k), hd, H, Tk, B), 0, 2, 1, 3);
    struct ggml_tensor *v = ggml_reshape_4d(ctx, vt, Tk, hd, H, B); /* [Tk, hd, H, B]: time fastest */
    struct ggml_tensor *kq = ggml_mul_mat(ctx, k, q);                /* [Tk, Tq, H, B] */
    kq = ggml_soft_max_ext(ctx, kq, mask, 1.0f / sqrtf((float)hd), 0.0f);
    struct ggml_tensor *o = ggml_mul_mat(ctx, v, kq);                /* [hd, Tq, H, B] */
    o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3));            /* [hd, H, Tq, B] */
    return ggml_reshape_3d(ctx, o, hd * H, Tq, B);
}

struct ggml_tensor *mimi_attend(struct ggml_context *ctx, int64_t hd, int64_t H, struct ggml_tensor *q,
                                struct ggml_tensor *k, struct ggml_tensor *v, struct ggml_tensor *mask,
                                int64_t Tq, int64_t Tk, int64_t B) {
    /* v [hd, H, Tk*B] -> [Tk, hd*H, B], time fastest: the weights' product contracts over time */
    struct ggml_tensor *vt = ggml_reshape_3d(ctx, cr_dense(ctx, v), hd * H, Tk, B);
    vt = ggml_cont(ctx, ggml_permute(ctx, vt, 1, 0, 2, 3));
    return mimi_attend_vt(ctx, hd, H, q, k, vt, mask, Tq, Tk, B);
}

struct ggml_tensor *mimi_stream_attend(cr_states *st, int64_t hd, int64_t H, struct ggml_tensor *q,
                                       struct ggml_tensor *k, struct ggml_tensor *v, struct ggml_tensor *mask,
                                       int64_t S) {
    struct ggml_context *ctx = st->ctx;
    const int64_t n = k->ne[1], B = k->ne[2];
    k = cr_states_window(st, k, S); /* [A, W, B] */
    v = cr_states_window(st, v, S); /* [A, W, B] */
    const int64_t W = k->ne[1];
    /* [hd, H, T*B] -> [hd, T, H, B] views (no copy of a contiguous q or window) */
    q = ggml_permute(ctx, ggml_reshape_4d(ctx, cr_dense(ctx, q), hd, H, n, B), 0, 2, 1, 3);
    struct ggml_tensor *kp = ggml_permute(ctx, ggml_reshape_4d(ctx, k, hd, H, W, B), 0, 2, 1, 3);
    struct ggml_tensor *kq = ggml_mul_mat(ctx, kp, q); /* [W, n, H, B] */
    kq = ggml_soft_max_ext(ctx, kq, mask, 1.0f / sqrtf((float)hd), 0.0f);
    /* o[:, i] = sum_t v[:, t] kq[t, i]: an outer-product sum over the window, whose values stay
       channels fastest as the ring keeps them (a product contracting over time would need them
       transposed every tick). Batched over streams in ne2 and heads in ne3: cuBLAS runs one
       strided batch of B products per head. */
    struct ggml_tensor *vp = ggml_permute(ctx, ggml_reshape_4d(ctx, v, hd, H, W, B), 0, 3, 1, 2); /* [hd, W, B, H] */
    struct ggml_tensor *o = ggml_out_prod(ctx, vp, ggml_permute(ctx, kq, 1, 0, 3, 2));        /* [hd, n, B, H] */
    o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 3, 1));                                     /* [hd, H, n, B] */
    return ggml_reshape_3d(ctx, o, hd * H, n, B);
}

struct ggml_tensor *mimi_ff(struct ggml_context *ctx, struct ggml_context *w, const mimi_hparams *hp,
                            struct ggml_tensor *x, int l, const cr_cpu_ops *ops) {
    struct ggml_tensor *h = cr_layer_norm(ctx, x, mimi_w(w, "tr.%d.norm2.weight", l), mimi_w(w, "tr.%d.norm2.bias", l),
                                          hp->norm_eps);
    h = cr_linear(ctx, h, mimi_w(w, "tr.%d.ff1.weight", l), NULL, ops);
    h = ggml_gelu_erf(ctx, h);
    h = cr_linear(ctx, h, mimi_w(w, "tr.%d.ff2.weight", l), NULL, ops); /* LayerScale folded in */
    return ggml_add(ctx, x, h);
}

struct ggml_tensor *mimi_elu(struct ggml_context *ctx, bool cpu_ops, struct ggml_tensor *x) {
    return cpu_ops ? cr_elu_cpu(ctx, x) : ggml_elu(ctx, x);
}

/* --------------------------------------------------------- stream shape */

static int32_t mimi_stream_chunk_multiple(const cr_model *model) {
    (void)model;
    return 1;
}

/* Every layer is causal: a frame's audio is final when the frame arrives. */
static int32_t mimi_stream_latency(const cr_model *model) {
    (void)model;
    return 0;
}

/* An exact piece needs n_layers * (context - 1) steps of left context: with
   the released sizes 1,000 frames (80 s), more than a piece holds. */
static int32_t mimi_decode_context_frames(const cr_model *model) {
    (void)model;
    return 0;
}

const cr_arch cr_arch_mimi = {
    .name = "mimi",
    .levels_prefix = true,
    .hparams_size = sizeof(mimi_hparams),
    .read_hparams = mimi_read_hparams,
    .fill_info = mimi_fill_info,
    .tensor_specs = mimi_tensor_specs,
    .build_decode = mimi_build_decode,
    .scratch_floats = mimi_scratch_floats,
    .max_tensor_elements = mimi_max_tensor_elements,
    .set_decode_inputs = mimi_set_inputs,
    .stream_chunk_multiple = mimi_stream_chunk_multiple,
    .stream_states = mimi_stream_states,
    .stream_latency = mimi_stream_latency,
    .build_stream = mimi_build_stream,
    .decode_context_frames = mimi_decode_context_frames,
};
