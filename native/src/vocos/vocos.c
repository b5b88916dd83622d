/*
 * vocos.c: the graph blocks WavTokenizer, NeuCodec and XCodec2 share (vocos.h).
 *
 * Every block is built from ggml ops that have CPU and CUDA kernels
 * (mul_mat, im2col, conv_2d_dw_direct, sum_rows, norm, rms_norm, soft_max,
 * exp, sin, cos, clamp, concat, col2im_1d, and elementwise arithmetic); on
 * the CPU backend the products, convolutions and 64-channel-head attention
 * take the fused kernels of ops/ops_avx512_*.c where they apply (cpu_ops).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vocos.h"
#include "layers.h"

void vc_graph_begin(vc_graph *g, struct ggml_context *ctx, struct ggml_context *w, cr_graph_io *io,
                    const cr_decode_shape *shape) {
    const int64_t T = shape->n_frames, B = shape->n_batch;
    memset(g, 0, sizeof(*g));
    g->ctx = ctx;
    g->w = w;
    g->io = io;
    g->T = T;
    g->B = B;
    g->cpu_ops = shape->cpu_ops;
    g->ops = cr_graph_ops(shape->cpu_ops, shape->ops);
    g->dev = cr_conv_cols_on(shape->fused_unit, shape->cpu_ops);
    g->gf = ggml_new_graph_custom(ctx, 4096, false);
    if (shape->frames_masked) {
        g->mask = vc_input(g, VC_IO_MASK, GGML_TYPE_F32, 1, T, B, 1, "mask");
        g->mask_bt = vc_input(g, VC_IO_MASK_BT, GGML_TYPE_F32, 1, B, T, 1, "mask_bt");
        g->kq_mask = vc_input(g, VC_IO_KQ, GGML_TYPE_F32, T, T, 1, B, "kq_mask");
    }
}

struct ggml_tensor *vc_input(vc_graph *g, int slot, enum ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                             int64_t ne3, const char *name) {
    struct ggml_tensor *t = ggml_new_tensor_4d(g->ctx, type, ne0, ne1, ne2, ne3);
    ggml_set_name(t, name);
    ggml_set_input(t);
    g->io->t[slot] = t;
    return t;
}

struct ggml_tensor *vc_w(const vc_graph *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    struct ggml_tensor *t = cr_weightv(g->w, fmt, ap);
    va_end(ap);
    return t;
}

struct ggml_tensor *vc_mask(vc_graph *g, struct ggml_tensor *x) {
    return g->mask ? ggml_mul(g->ctx, x, g->mask) : x;
}

/* Product of w [K, M] and x [K, T, B] as one [K, T*B] product (a 3-D product with a short T goes to ggml
   CUDA's small-batch kernel once per sequence, rereading w B times; see snac.c). */
static struct ggml_tensor *vc_mm(vc_graph *g, struct ggml_tensor *w, struct ggml_tensor *x) {
    return cr_mm(g->ctx, w, cr_dense(g->ctx, x));
}

/* vc_linear with the fused kernel's precision given: ops NULL for F32 */
static struct ggml_tensor *vc_product(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w,
                                      struct ggml_tensor *b, const cr_cpu_ops *ops) {
    if (g->cpu_ops) {
        struct ggml_context *ctx = g->ctx;
        x = cr_dense(ctx, x);
        const int64_t M = w->ne[1], M16 = M / 16 * 16;
        if (M % 16 != 0 && M16 > 0 && ggml_is_contiguous(w) && ggml_n_dims(w) == 2 && ggml_is_contiguous(x)) {
            /* the head's n_fft + 2 outputs: the first M16 rows of w on the fused kernel (its
               panels take multiples of 16), the last few through ggml, joined */
            struct ggml_tensor *y = cr_linear_cpu(ctx, x, ggml_view_2d(ctx, w, w->ne[0], M16, w->nb[1], 0),
                                                  b ? ggml_view_1d(ctx, b, M16, 0) : NULL, ops);
            if (y) {
                struct ggml_tensor *r = ggml_mul_mat(ctx, ggml_view_2d(ctx, w, w->ne[0], M - M16, w->nb[1],
                                                                       (size_t)M16 * w->nb[1]),
                                                     ggml_reshape_2d(ctx, x, x->ne[0], ggml_nrows(x)));
                if (b) {
                    r = ggml_add(ctx, r, ggml_view_1d(ctx, b, M - M16, (size_t)M16 * sizeof(float)));
                }
                y = ggml_concat(ctx, ggml_reshape_2d(ctx, y, M16, ggml_nrows(x)), r, 0);
                return ggml_reshape_4d(ctx, y, M, x->ne[1], x->ne[2], x->ne[3]);
            }
        }
        struct ggml_tensor *y = cr_linear_cpu(ctx, x, w, b, ops);
        if (y) {
            return y;
        }
    }
    struct ggml_tensor *y = vc_mm(g, w, x);
    return b ? ggml_add(g->ctx, y, b) : y;
}

struct ggml_tensor *vc_linear(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b) {
    return vc_product(g, x, w, b, g->ops);
}

struct ggml_tensor *vc_conv(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b) {
    const int pad = (int)((w->ne[0] - 1) / 2);
    x = cr_dense(g->ctx, vc_mask(g, x));
    /* on codecrt's device ops the columns op and a product; else the fused CPU conv (no column
       matrix) or, off the CPU, im2col or the tap products (layers.h) */
    struct ggml_tensor *y = g->dev ? cr_conv1d_cols(g->ctx, x, NULL, NULL, w, b, 1, pad, pad, NULL) : NULL;
    return y ? y : cr_conv1d(g->ctx, g->gf, x, w, b, 1, pad, pad, g->cpu_ops ? g->ops : NULL);
}

/*
 * The ConvNeXt blocks' "same" depthwise conv: cr_dwconv (the CPU's loop along the
 * channels, ggml's direct depthwise conv on a channels-last view elsewhere), F32.
 */
struct ggml_tensor *vc_dwconv(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b) {
    struct ggml_context *ctx = g->ctx;
    x = cr_dense(ctx, vc_mask(g, x));
    const int64_t C = x->ne[0], T = x->ne[1], K = w->ne[1];
    if (T == 1 && !g->cpu_ops) {
        /* one frame sees only the centre tap; and ggml tells the channels-last layout from the
           strides, which a one-frame view does not distinguish (it would read it channels-first) */
        struct ggml_tensor *tap = ggml_view_1d(ctx, w, C, (size_t)((K - 1) / 2) * w->nb[1]);
        return ggml_add(ctx, ggml_mul(ctx, x, tap), b);
    }
    return cr_dwconv(ctx, x, w, b, 1, (int)((K - 1) / 2), (int)((K - 1) / 2), g->cpu_ops); /* "same" */
}

/* Sum of x [cg, G, T, B] over its group channels and frames: [1, G, 1, B]. */
static struct ggml_tensor *vc_group_sum(vc_graph *g, struct ggml_tensor *x) {
    struct ggml_context *ctx = g->ctx;
    const int64_t G = x->ne[1], T = x->ne[2], B = x->ne[3];
    struct ggml_tensor *s = ggml_sum_rows(ctx, x);                                 /* [1, G, T, B] */
    s = ggml_cont(ctx, ggml_transpose(ctx, ggml_reshape_3d(ctx, s, G, T, B)));      /* [T, G, B] */
    return ggml_reshape_4d(ctx, ggml_sum_rows(ctx, s), 1, G, 1, B);
}

/*
 * GroupNorm on the channels-fastest layout, computed from its definition:
 * mean and (biased) variance of each group over its C/G channels and the valid
 * frames, two passes as PyTorch does. ggml_group_norm wants the channels in
 * ne2 (a transposed copy each way) and cannot leave padded frames out of the
 * statistics; sum_rows accumulates in double on the CPU.
 */
struct ggml_tensor *vc_group_norm(vc_graph *g, struct ggml_tensor *x, int n_groups, struct ggml_tensor *w,
                                  struct ggml_tensor *b) {
    struct ggml_context *ctx = g->ctx;
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], cg = C / n_groups;
    x = cr_dense(ctx, vc_mask(g, x));
    /* the CPU's one-pass kernel (ops/ops_group_norm.c), the same definition */
    struct ggml_tensor *fused = g->cpu_ops ? cr_group_norm_cpu(ctx, x, n_groups, w, b, g->mask, VC_EPS) : NULL;
    if (fused) {
        return fused;
    }
    if (g->mask && !g->count) { /* 1 / valid frames [1, 1, 1, B]: an input of the composed form only */
        g->count = vc_input(g, VC_IO_COUNT, GGML_TYPE_F32, 1, 1, 1, B, "count");
    }
    struct ggml_tensor *xs = ggml_reshape_4d(ctx, x, cg, n_groups, T, B);
    struct ggml_tensor *mean = vc_group_sum(g, xs); /* [1, G, 1, B] */
    mean = g->count ? ggml_scale(ctx, ggml_mul(ctx, mean, g->count), 1.0f / (float)cg)
                    : ggml_scale(ctx, mean, 1.0f / (float)(cg * T));
    struct ggml_tensor *d = ggml_sub(ctx, xs, mean); /* [cg, G, T, B] */
    if (g->mask) {
        d = ggml_mul(ctx, d, ggml_reshape_4d(ctx, g->mask, 1, 1, T, B));
    }
    struct ggml_tensor *var = vc_group_sum(g, ggml_sqr(ctx, d));
    var = g->count ? ggml_scale_bias(ctx, ggml_mul(ctx, var, g->count), 1.0f / (float)cg, VC_EPS)
                   : ggml_scale_bias(ctx, var, 1.0f / (float)(cg * T), VC_EPS);
    struct ggml_tensor *y = ggml_div(ctx, d, ggml_sqrt(ctx, var));
    y = ggml_reshape_3d(ctx, y, C, T, B);
    return ggml_add(ctx, ggml_mul(ctx, y, w), b);
}

/* ------------------------------------------------------------ GELU (erf) */

/*
 * exp(x) for x in [-87, 88] (clamped): Cody-Waite reduction by ln 2 and
 * Cephes' degree-7 polynomial (relative error ~1 ulp), scaled by 2^k through
 * the exponent bits. Branch-free, so loops calling it vectorize.
 */
static inline float vc_expf(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float k = rintf(x * 1.44269504088896341f);
    float r = fmaf(-k, 0.693359375f, x);
    r = fmaf(k, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return p * scale;
}

/*
 * PyTorch's nn.GELU(): 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2),
 * with erfc(z) for z >= 0 by the Chebyshev fit of Numerical Recipes (erfcc,
 * fractional error < 1.2e-7 everywhere) and erfc(-z) = 2 - erfc(z). ggml's
 * CPU GELU_ERF calls libm's scalar erff per element, about a quarter of
 * WavTokenizer's decode on this machine; this loop vectorizes.
 */
static inline float vc_gelu_erf(float x) {
    const float z = fabsf(x) * 0.70710678118654752f;
    const float t = 1.0f / fmaf(0.5f, z, 1.0f);
    float p = 0.17087277f;
    p = fmaf(p, t, -0.82215223f);
    p = fmaf(p, t, 1.48851587f);
    p = fmaf(p, t, -1.13520398f);
    p = fmaf(p, t, 0.27886807f);
    p = fmaf(p, t, -0.18628806f);
    p = fmaf(p, t, 0.09678418f);
    p = fmaf(p, t, 0.37409196f);
    p = fmaf(p, t, 1.00002368f);
    p = fmaf(p, t, -1.26551223f);
    const float c = t * vc_expf(fmaf(-z, z, p)); /* erfc(|x| / sqrt 2) */
    return 0.5f * x * (x >= 0.0f ? 2.0f - c : c);
}

static void vc_gelu_kernel(struct ggml_tensor *dst, const struct ggml_tensor *x, int ith, int nth, void *user) {
    (void)user;
    const int64_t n = ggml_nelements(x), per = (n + nth - 1) / nth;
    const int64_t i0 = per * ith, i1 = i0 + per < n ? i0 + per : n;
    const float *xs = (const float *)x->data;
    float *ys = (float *)dst->data;
    for (int64_t i = i0; i < i1; i++) {
        ys[i] = vc_gelu_erf(xs[i]);
    }
}

struct ggml_tensor *vc_gelu(vc_graph *g, struct ggml_tensor *x) {
    if (g->cpu_ops && x->type == GGML_TYPE_F32 && ggml_is_contiguous(x)) {
        return ggml_map_custom1(g->ctx, x, vc_gelu_kernel, GGML_N_TASKS_MAX, NULL);
    }
    return ggml_gelu_erf(g->ctx, x);
}

float vc_gelu_ref(float x) { return vc_gelu_erf(x); }

/* ------------------------------------------------- the iSTFT head's spectrum */

/*
 * sin and cos of x: Cody-Waite reduction by pi/2 (three-part constant, exact products for
 * |x| up to about 1e4), Taylor polynomials on [-pi/4, pi/4] (truncation below 2e-9), the
 * quadrant chosen by selects: branch-free, so the loop that calls it vectorizes. ggml's CPU
 * SIN and COS call libm per element.
 */
typedef struct vc_sincos {
    float s, c;
} vc_sincos;

static inline vc_sincos vc_sincosf(float x) {
    const float k = rintf(x * 0.63661977236758134f);
    float r = fmaf(-k, 1.5703125f, x);
    r = fmaf(-k, 4.837512969970703125e-4f, r);
    r = fmaf(-k, 7.54978995489188216e-8f, r);
    const float r2 = r * r;
    float ps = 2.7557319224e-6f;
    ps = fmaf(ps, r2, -1.9841269841e-4f);
    ps = fmaf(ps, r2, 8.3333333333e-3f);
    ps = fmaf(ps, r2, -1.6666666667e-1f);
    const float sr = fmaf(r * r2, ps, r);
    float pc = -2.7557319224e-7f;
    pc = fmaf(pc, r2, 2.4801587302e-5f);
    pc = fmaf(pc, r2, -1.3888888889e-3f);
    pc = fmaf(pc, r2, 4.1666666667e-2f);
    const float cr = fmaf(r2 * r2, pc, fmaf(-0.5f, r2, 1.0f));
    const int q = (int)k & 3; /* x = k pi/2 + r: quadrant k mod 4 */
    const float ss = (q & 1) ? cr : sr, cc = (q & 1) ? sr : cr;
    return (vc_sincos){(q & 2) ? -ss : ss, ((q + 1) & 2) ? -cc : cc};
}

/* rows of y [2F] = [log-magnitudes | phases] -> [m cos p | m sin p], m = min(exp, 100) */
static void vc_spectrum_kernel(struct ggml_tensor *dst, const struct ggml_tensor *y, int ith, int nth, void *user) {
    (void)user;
    const int64_t F = y->ne[0] / 2, rows = ggml_nrows(y), r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++) {
        const float *yr = (const float *)y->data + r * 2 * F;
        float *out = (float *)dst->data + r * 2 * F;
        for (int64_t f = 0; f < F; f++) {
            const float e = vc_expf(yr[f]);
            const float m = e > 100.0f ? 100.0f : e; /* not fminf, whose NaN rule keeps the loop scalar */
            const vc_sincos sc = vc_sincosf(yr[F + f]);
            out[f] = m * sc.c;
            out[F + f] = m * sc.s;
        }
    }
}

void vc_sincos_ref(float x, float *s, float *c) {
    const vc_sincos sc = vc_sincosf(x);
    *s = sc.s;
    *c = sc.c;
}

struct ggml_tensor *vc_layer_norm(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b) {
    struct ggml_tensor *fused = g->cpu_ops ? cr_norm_rows(g->ctx, x, w, b, VC_EPS, false, false) : NULL; /* ops/ops_norm.c */
    if (fused) {
        return fused;
    }
    struct ggml_tensor *y = ggml_mul(g->ctx, ggml_norm(g->ctx, x, VC_EPS), w);
    return b ? ggml_add(g->ctx, y, b) : y;
}

struct ggml_tensor *vc_rms_norm(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w) {
    struct ggml_tensor *fused = g->cpu_ops ? cr_norm_rows(g->ctx, x, w, NULL, VC_EPS, true, false) : NULL; /* ops/ops_norm.c */
    return fused ? fused : ggml_mul(g->ctx, ggml_rms_norm(g->ctx, x, VC_EPS), w);
}

struct ggml_tensor *vc_resnet_block(vc_graph *g, struct ggml_tensor *x, int n_groups, const char *p) {
    struct ggml_context *ctx = g->ctx;
    struct ggml_tensor *h = vc_group_norm(g, x, n_groups, vc_w(g, "%s.norm1.weight", p), vc_w(g, "%s.norm1.bias", p));
    h = vc_conv(g, ggml_silu(ctx, h), vc_w(g, "%s.conv1.weight", p), vc_w(g, "%s.conv1.bias", p));
    h = vc_group_norm(g, h, n_groups, vc_w(g, "%s.norm2.weight", p), vc_w(g, "%s.norm2.bias", p));
    h = vc_conv(g, ggml_silu(ctx, h), vc_w(g, "%s.conv2.weight", p), vc_w(g, "%s.conv2.bias", p));
    return ggml_add(ctx, x, h);
}

/*
 * One head of D channels (WavTokenizer's pos_net attention, D = 768) on the CPU: both products on
 * the fused linear kernel, per sequence (its weight operand is 2-D). Scores [Tk, Tq] = k^T q with
 * k padded by zero keys to a multiple of 16 (the kernel's column panels) and the padding cut off
 * before the softmax; then o [D, Tq] = v A with v transposed to [Tk, D]. ggml's F32 product
 * takes a slow path on these shapes (a summed dimension of Tk, not a multiple of 16): a tenth of
 * the decode. In the context's precision, as the 64-channel kernel. NULL where it does not apply.
 */
static struct ggml_tensor *vc_attention_one_head(vc_graph *g, struct ggml_tensor *q, struct ggml_tensor *k,
                                                 struct ggml_tensor *v, float scale) {
    struct ggml_context *ctx = g->ctx;
    const int64_t D = q->ne[0], T = q->ne[1], B = q->ne[2], T16 = (T + 15) / 16 * 16;
    static const cr_cpu_ops bf16 = {.bf16 = true, .packs = NULL}; /* activations are never in the packs */
    const cr_cpu_ops *ops = g->ops && g->ops->bf16 && !g->ops->x3 ? &bf16 : NULL; /* BF16x3: F32 */
    if (D % 16 != 0 || !ggml_is_contiguous(q) || !ggml_is_contiguous(k) || !ggml_is_contiguous(v)) {
        return NULL;
    }
    struct ggml_tensor *vt = ggml_cont(ctx, ggml_transpose(ctx, ggml_reshape_2d(ctx, v, D, T * B))); /* [T*B, D] */
    struct ggml_tensor *out = NULL;
    for (int64_t b = 0; b < B; b++) {
        struct ggml_tensor *qb = ggml_view_2d(ctx, q, D, T, q->nb[1], (size_t)b * q->nb[2]);
        struct ggml_tensor *kb = ggml_view_2d(ctx, k, D, T, k->nb[1], (size_t)b * k->nb[2]);
        if (T16 > T) {
            kb = ggml_pad(ctx, kb, 0, (int)(T16 - T), 0, 0); /* [D, T16], zero keys */
        }
        struct ggml_tensor *s = cr_linear_cpu(ctx, qb, kb, NULL, ops); /* [T16, Tq] */
        if (!s) {
            return NULL;
        }
        if (T16 > T) {
            s = ggml_cont(ctx, ggml_view_2d(ctx, s, T, T, s->nb[1], 0));
        }
        s = ggml_soft_max_ext(ctx, s, NULL, scale, 0.0f); /* [Tk, Tq] */
        /* vt's rows b*T .. b*T+T-1 as the weight [Tk, D]: column block b of the transposed v */
        struct ggml_tensor *vb = ggml_cont(ctx, ggml_view_2d(ctx, vt, T, D, vt->nb[1], (size_t)(b * T) * sizeof(float)));
        struct ggml_tensor *o = cr_linear_cpu(ctx, s, vb, NULL, ops); /* [D, Tq] */
        if (!o) {
            return NULL;
        }
        out = out ? ggml_concat(ctx, out, o, 1) : o;
    }
    return ggml_reshape_3d(ctx, out, D, T, B);
}

/*
 * On the CPU with AVX-512 (or AVX2 and FMA), heads of 64 channels at scale 1/8 take the fused
 * kernel (one query block's scores in cache, never T x T in memory); else
 * (other heads, masked graphs, other backends) two products around a softmax,
 * the scores [Tk, Tq, H, B] materialised: every backend has those ops, in F32.
 * (ggml's flash attention would not materialise them, but CUDA's converts K
 * and V to F16, and none of its kernels takes WavTokenizer's 768-wide head.)
 */
struct ggml_tensor *vc_attention(vc_graph *g, struct ggml_tensor *q, struct ggml_tensor *k, struct ggml_tensor *v,
                                 int n_heads, float scale) {
    struct ggml_context *ctx = g->ctx;
    const int64_t D = q->ne[0], T = q->ne[1], B = q->ne[2], hd = D / n_heads;
    if (g->cpu_ops && !g->kq_mask && hd == 64 && scale == 0.125f) {
        struct ggml_tensor *o = cr_attention_cpu(ctx, q, k, v, g->ops);
        if (o) {
            return o;
        }
    }
    if (g->cpu_ops && !g->kq_mask && n_heads == 1) {
        struct ggml_tensor *o = vc_attention_one_head(g, q, k, v, scale);
        if (o) {
            return o;
        }
    }
    struct ggml_tensor *q4 = ggml_permute(ctx, ggml_reshape_4d(ctx, q, hd, n_heads, T, B), 0, 2, 1, 3); /* [hd, T, H, B] */
    struct ggml_tensor *k4 = ggml_permute(ctx, ggml_reshape_4d(ctx, k, hd, n_heads, T, B), 0, 2, 1, 3);
    struct ggml_tensor *v4 = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, v, hd, n_heads, T, B), 1, 2, 0, 3));
    struct ggml_tensor *a = ggml_mul_mat(ctx, k4, q4); /* [Tk, Tq, H, B] */
    a = ggml_soft_max_ext(ctx, a, g->kq_mask, scale, 0.0f);
    struct ggml_tensor *o = ggml_mul_mat(ctx, v4, a); /* [hd, Tq, H, B] */
    o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3)); /* [hd, H, T, B] */
    return ggml_reshape_3d(ctx, o, D, T, B);
}

/*
 * The head works on frames ordered sequence-fastest ([., B, T]) so that the
 * DFT's output [n_fft, B*T] is, as [n_fft*B, T], exactly col2im_1d's column
 * layout for B output channels: one overlap-add for the whole batch.
 */
struct ggml_tensor *vc_istft_head(vc_graph *g, struct ggml_tensor *x, int32_t n_fft, int32_t hop) {
    struct ggml_context *ctx = g->ctx;
    const int64_t T = x->ne[1], B = x->ne[2], F = n_fft / 2 + 1;
    if (B > 1) {
        x = ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3)); /* [D, B, T] */
    }
    struct ggml_tensor *y = vc_linear(g, x, vc_w(g, "head.out.weight"), vc_w(g, "head.out.bias")); /* [n_fft+2, B, T] */
    y = ggml_reshape_2d(ctx, y, n_fft + 2, B * T);
    struct ggml_tensor *spec; /* [n_fft+2, B*T]: [m cos p | m sin p] */
    if (g->cpu_ops) { /* one pass (vc_spectrum_kernel) where the composed form below makes seven */
        spec = ggml_map_custom1(ctx, y, vc_spectrum_kernel, GGML_N_TASKS_MAX, NULL);
    } else {
        /* unary ops over all rows (their CUDA kernels want contiguous rows), then the halves as views */
        struct ggml_tensor *mag = ggml_clamp(ctx, ggml_exp(ctx, y), 0.0f, 100.0f);
        struct ggml_tensor *c = ggml_cos(ctx, y), *s = ggml_sin(ctx, y);
        const size_t half = (size_t)F * sizeof(float);
        struct ggml_tensor *m = ggml_view_2d(ctx, mag, F, B * T, mag->nb[1], 0);
        struct ggml_tensor *re = ggml_mul(ctx, m, ggml_view_2d(ctx, c, F, B * T, c->nb[1], half));
        struct ggml_tensor *im = ggml_mul(ctx, m, ggml_view_2d(ctx, s, F, B * T, s->nb[1], half));
        spec = ggml_concat(ctx, re, im, 0);
    }
    if (g->mask_bt) { /* padded frames add nothing to the overlap-add */
        spec = ggml_mul(ctx, spec, ggml_reshape_2d(ctx, g->mask_bt, 1, B * T));
    }
    /* the fused product on the CPU: ggml's F32 GEMM leaves its fast path when the summed dimension
       (n_fft + 2) is not a multiple of 16. In the context's precision like every product: F32 here
       was a third of a BF16 WavTokenizer 40 decode once the rest ran on AMX, and BF16 moves its
       relative L2 to the F32 decode from 7.2e-3 to 7.6e-3 (docs/benchmarks.md) */
    struct ggml_tensor *frames = vc_product(g, spec, vc_w(g, "head.basis"), NULL, g->ops); /* [n_fft, B*T] */
    frames = ggml_reshape_2d(ctx, frames, (int64_t)n_fft * B, T);
    struct ggml_tensor *pcm = ggml_col2im_1d(ctx, frames, hop, (int)B, (n_fft - hop) / 2); /* [T*hop, B] */
    struct ggml_tensor *env = g->mask ? vc_input(g, VC_IO_ENV, GGML_TYPE_F32, T * hop, B, 1, 1, "env")
                                      : vc_input(g, VC_IO_ENV, GGML_TYPE_F32, T * hop, 1, 1, 1, "env");
    return ggml_mul(ctx, pcm, env);
}

struct ggml_cgraph *vc_graph_end(vc_graph *g, struct ggml_tensor *pcm) {
    ggml_set_name(pcm, "pcm");
    ggml_set_output(pcm);
    g->io->t[VC_IO_OUT] = pcm;
    ggml_build_forward_expand(g->gf, pcm);
    return g->gf;
}

/* --------------------------------------------------------------- host side */

size_t vc_scratch_floats(int64_t T, int64_t B, int32_t hop, bool masked) {
    size_t n = (size_t)(T * hop) * (size_t)(masked ? B : 1);
    if (masked) {
        const size_t kq = (size_t)T * (size_t)T * (size_t)B;
        n = kq > n ? kq : n;
    }
    return n;
}

/*
 * 1 / envelope for a sequence of L frames, out[0 .. T*hop): the summed squared
 * window of every frame covering each output sample ("same": output sample n
 * is uncropped sample n + (n_fft - hop)/2), in float as PyTorch's fold sums
 * it; 0 past the L*hop valid samples. Never zero inside: hop <= n_fft/2 is
 * checked at load, so every sample is covered by a window's middle half.
 */
static void vc_envelope(const float *window, int32_t n_fft, int32_t hop, int64_t L, int64_t T, float *out) {
    const int64_t pad = (n_fft - hop) / 2;
    for (int64_t n = 0; n < T * hop; n++) {
        if (n >= L * hop) {
            out[n] = 0.0f;
            continue;
        }
        const int64_t u = n + pad; /* uncropped position; frames t with 0 <= u - t*hop < n_fft cover it */
        const int64_t t_lo = u >= n_fft ? (u - n_fft) / hop + 1 : 0;
        const int64_t t_hi = u / hop < L - 1 ? u / hop : L - 1;
        float e = 0.0f;
        for (int64_t t = t_lo; t <= t_hi; t++) {
            const float wv = window[u - t * hop];
            e += wv * wv;
        }
        out[n] = 1.0f / e;
    }
}

void vc_set_common_inputs(const cr_graph_io *io, int64_t T, int64_t B, int64_t n_seqs, int64_t n_frames,
                          const int32_t *lens, const float *window, int32_t n_fft, int32_t hop, float *f) {
#define VC_LEN(b) (lens ? (int64_t)lens[b] : ((b) < n_seqs ? n_frames : T))
    struct ggml_tensor *env = io->t[VC_IO_ENV];
    const bool masked = io->t[VC_IO_MASK] != NULL;
    if (!masked) {
        vc_envelope(window, n_fft, hop, T, T, f);
        ggml_backend_tensor_set(env, f, 0, (size_t)(T * hop) * sizeof(float));
        return;
    }
    for (int64_t b = 0; b < B; b++) {
        vc_envelope(window, n_fft, hop, VC_LEN(b), T, f + b * T * hop);
    }
    ggml_backend_tensor_set(env, f, 0, (size_t)(T * hop * B) * sizeof(float));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < T; t++) {
            f[b * T + t] = t < VC_LEN(b) ? 1.0f : 0.0f;
        }
    }
    ggml_backend_tensor_set(io->t[VC_IO_MASK], f, 0, (size_t)(T * B) * sizeof(float));
    for (int64_t t = 0; t < T; t++) {
        for (int64_t b = 0; b < B; b++) {
            f[t * B + b] = t < VC_LEN(b) ? 1.0f : 0.0f;
        }
    }
    ggml_backend_tensor_set(io->t[VC_IO_MASK_BT], f, 0, (size_t)(T * B) * sizeof(float));
    if (io->t[VC_IO_COUNT]) { /* GroupNorm's composed form only (vc_group_norm) */
        for (int64_t b = 0; b < B; b++) {
            f[b] = 1.0f / (float)VC_LEN(b);
        }
        ggml_backend_tensor_set(io->t[VC_IO_COUNT], f, 0, (size_t)B * sizeof(float));
    }
    for (int64_t b = 0; b < B; b++) {
        float *row = f + b * T * T;
        for (int64_t k = 0; k < T; k++) {
            row[k] = k < VC_LEN(b) ? 0.0f : -INFINITY;
        }
        for (int64_t q = 1; q < T; q++) {
            memcpy(row + q * T, row, (size_t)T * sizeof(float));
        }
    }
    ggml_backend_tensor_set(io->t[VC_IO_KQ], f, 0, (size_t)(T * T * B) * sizeof(float));
#undef VC_LEN
}

int64_t vc_max_elements(int64_t T, int64_t B, int64_t heads, int32_t n_fft, int32_t hop) {
    int64_t best = heads * T * T * B;
    const int64_t spec = (int64_t)(n_fft + 2) * T * B, pcm = (int64_t)hop * T * B;
    best = spec > best ? spec : best;
    return pcm > best ? pcm : best;
}

codecrt_status vc_check_istft(int32_t n_fft, int32_t hop, cr_err *err) {
    /* the crop (n_fft - hop)/2 must be whole, and every output sample must lie
       in some frame's middle (hop <= n_fft/2) so the envelope is never ~0 */
    if (n_fft < 4 || n_fft > VC_MAX_NFFT || n_fft % 2 != 0 || hop < 1 || 2 * hop > n_fft ||
        (n_fft - hop) % 2 != 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS,
                       "iSTFT n_fft = %d, hop_length = %d: need an even n_fft in [4, %d], 1 <= hop <= n_fft/2 "
                       "and n_fft - hop even", n_fft, hop, VC_MAX_NFFT);
    }
    return CODECRT_OK;
}
