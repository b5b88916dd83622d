/*
 * layers.c: graph building blocks shared by the codecs (layers.h documents
 * each one's shapes and layout).
 */
#include "layers.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- products */

/* ggml 0.15.3's CUDA backend runs an F32 product of 4 to 16 columns in its
   small-batch kernel (mmf), on TF32 tensor cores, whatever
   NVIDIA_TF32_OVERRIDE says; 1 to 3 columns go to its F32 mat-vec kernel and
   more than 16 to cuBLAS, which the override governs. */
enum { CR_MMF_MIN_COLS = 4, CR_MMF_MAX_COLS = 16 };

/* w lives in a device (non-host) buffer: the scheduler runs its products there.
   A view (a conv's weight reshaped to [K*Cin, Cout]) has no buffer until the
   graph is allocated: its source's is the one. A weight computed in the graph
   (DAC's projections side by side, a conv's taps side by side) has none either:
   it is computed where its first source lives, a weight a few nodes up. */
static bool cr_on_device(const struct ggml_tensor *w) {
    for (int depth = 0; w != NULL && depth < 16; depth++) {
        const struct ggml_tensor *t = w->view_src ? w->view_src : w;
        if (t->buffer != NULL) {
            return !ggml_backend_buffer_is_host(t->buffer);
        }
        w = t->src[0];
    }
    return false;
}

struct ggml_tensor *cr_mm_padded(struct ggml_context *ctx, struct ggml_tensor *w, struct ggml_tensor *x) {
    const int64_t cols = x->ne[1] * x->ne[2] * x->ne[3];
    /* x [K, cols] + zero columns -> [K, 17]: cuBLAS, so a stream tick of a few
       streams rounds as the offline decode does (f32 exact with the override
       at 0); the zero columns' results are dropped. */
    struct ggml_tensor *x2 = ggml_reshape_2d(ctx, cr_dense(ctx, x), x->ne[0], cols);
    if (cols <= CR_MMF_MAX_COLS) {
        x2 = ggml_pad(ctx, x2, 0, CR_MMF_MAX_COLS + 1 - cols, 0, 0);
    }
    struct ggml_tensor *y = ggml_mul_mat(ctx, w, x2);                    /* [M, max(cols, 17)] */
    y = ggml_view_2d(ctx, y, w->ne[1], cols, y->nb[1], 0);                /* [M, cols], contiguous */
    return ggml_reshape_4d(ctx, y, w->ne[1], x->ne[1], x->ne[2], x->ne[3]);
}

struct ggml_tensor *cr_mm(struct ggml_context *ctx, struct ggml_tensor *w, struct ggml_tensor *x) {
    const int64_t cols = x->ne[1] * x->ne[2] * x->ne[3];
    if (w->type == GGML_TYPE_F32 && w->ne[2] == 1 && w->ne[3] == 1 && cols >= CR_MMF_MIN_COLS &&
        cols <= CR_MMF_MAX_COLS && cr_on_device(w)) { /* a 2-D weight (never a batched operand) */
        return cr_mm_padded(ctx, w, x);
    }
    if (!ggml_is_contiguous(x) || x->ne[3] != 1) {
        return ggml_mul_mat(ctx, w, x);
    }
    struct ggml_tensor *y = ggml_mul_mat(ctx, w, ggml_reshape_2d(ctx, x, x->ne[0], x->ne[1] * x->ne[2]));
    return ggml_reshape_3d(ctx, y, w->ne[1], x->ne[1], x->ne[2]);
}

struct ggml_tensor *cr_dense(struct ggml_context *ctx, struct ggml_tensor *t) {
    return ggml_is_contiguous(t) ? t : ggml_cont(ctx, t);
}

struct ggml_tensor *cr_f32(struct ggml_context *ctx, struct ggml_tensor *w) {
    return w->type == GGML_TYPE_F32 ? w : ggml_cast(ctx, w, GGML_TYPE_F32);
}

struct ggml_tensor *cr_input(struct ggml_context *ctx, enum ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                             const char *name) {
    struct ggml_tensor *t = ggml_new_tensor_3d(ctx, type, ne0, ne1, ne2);
    ggml_set_name(t, name);
    ggml_set_input(t);
    return t;
}

struct ggml_tensor *cr_pwconv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                              struct ggml_tensor *b) {
    struct ggml_tensor *y = cr_mm(ctx, w, x);
    return b ? ggml_add(ctx, y, b) : y;
}

const cr_cpu_ops *cr_graph_ops(bool cpu_ops, const cr_cpu_ops *shape_ops) {
    static const cr_cpu_ops f32 = {.bf16 = false, .packs = NULL};
    return !cpu_ops ? NULL : shape_ops ? shape_ops : &f32;
}

struct ggml_tensor *cr_linear(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                              struct ggml_tensor *b, const cr_cpu_ops *ops) {
    struct ggml_tensor *y = ops ? cr_linear_cpu(ctx, x, w, b, ops) : NULL; /* AVX-512 CPUs */
    if (y) {
        return y;
    }
    y = cr_mm(ctx, w, x); /* one product over every sequence of a batch, not one per sequence */
    return b ? ggml_add(ctx, y, b) : y;
}

/* ----------------------------------------------------------------- layouts */

struct ggml_tensor *cr_to_tf(struct ggml_context *ctx, struct ggml_tensor *x) {
    x = cr_dense(ctx, x);
    return ggml_cont(ctx, ggml_transpose(ctx, ggml_reshape_2d(ctx, x, x->ne[0], x->ne[1] * x->ne[2])));
}

struct ggml_tensor *cr_to_cf(struct ggml_context *ctx, struct ggml_tensor *t, int64_t T, int64_t B) {
    return ggml_reshape_3d(ctx, ggml_cont(ctx, ggml_transpose(ctx, t)), t->ne[1], T, B);
}

struct ggml_tensor *cr_pad_frames(struct ggml_context *ctx, struct ggml_tensor *x, int l, int r, bool cpu) {
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2];
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(ctx, x);
    }
    if (cpu) { /* zeros, then x's rows at frame l */
        struct ggml_tensor *y = ggml_fill(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, T + l + r, B), 0.0f);
        return ggml_set_inplace(ctx, y, x, y->nb[1], y->nb[2], y->nb[3], (size_t)l * y->nb[1]);
    }
    struct ggml_tensor *y = ggml_pad_ext(ctx, ggml_reshape_2d(ctx, x, C * T, B), (int)(l * C), (int)(r * C), 0, 0,
                                         0, 0, 0, 0);
    return ggml_reshape_3d(ctx, y, C, T + l + r, B);
}

/* ------------------------------------------------------------------- Snake */

struct ggml_tensor *cr_snake_tf(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *t,
                                struct ggml_tensor *alpha, struct ggml_tensor *inv_alpha) {
    struct ggml_tensor *a = ggml_reshape_2d(ctx, alpha, 1, alpha->ne[0]);
    struct ggml_tensor *ia = ggml_reshape_2d(ctx, inv_alpha, 1, inv_alpha->ne[0]);
    ggml_build_forward_expand(gf, a);
    ggml_build_forward_expand(gf, ia);
    struct ggml_tensor *y = ggml_mul(ctx, t, a);
    y = ggml_sin(ctx, y);
    y = ggml_sqr(ctx, y);
    y = ggml_mul(ctx, y, ia);
    return ggml_add(ctx, t, y);
}


struct ggml_tensor *cr_weightv(struct ggml_context *w, const char *fmt, va_list ap) {
    char name[GGML_MAX_NAME];
    vsnprintf(name, sizeof(name), fmt, ap);
    return ggml_get_tensor(w, name);
}

struct ggml_tensor *cr_weight(struct ggml_context *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    struct ggml_tensor *t = cr_weightv(w, fmt, ap);
    va_end(ap);
    return t;
}

struct ggml_tensor *cr_snake(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *x,
                             struct ggml_tensor *alpha, struct ggml_tensor *inv_alpha, bool cpu_ops) {
    if (cpu_ops) {
        return cr_snake_cpu(ctx, x, alpha, inv_alpha);
    }
    return cr_to_cf(ctx, cr_snake_tf(ctx, gf, cr_to_tf(ctx, x), alpha, inv_alpha), x->ne[1], x->ne[2]);
}

/* ------------------------------------------------------------------- norms */

static struct ggml_tensor *cr_affine(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *g,
                                     struct ggml_tensor *b) {
    if (g) {
        x = ggml_mul(ctx, x, g);
    }
    return b ? ggml_add(ctx, x, b) : x;
}

struct ggml_tensor *cr_layer_norm(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *g,
                                  struct ggml_tensor *b, float eps) {
    return cr_affine(ctx, ggml_norm(ctx, x, eps), g, b);
}

struct ggml_tensor *cr_rms_norm(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *g, float eps) {
    return cr_affine(ctx, ggml_rms_norm(ctx, x, eps), g, NULL);
}

struct ggml_tensor *cr_group_norm(struct ggml_context *ctx, struct ggml_tensor *x, int n_groups,
                                  struct ggml_tensor *g, struct ggml_tensor *b, float eps) {
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], G = n_groups;
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(ctx, x);
    }
    /* [C/G, G, T, B] -> [C/G, T, G, B]: ggml_group_norm normalizes each group
       of ne2 over ne0 * ne1 (here: one group of channels over every frame) */
    struct ggml_tensor *y = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, C / G, G, T, B), 0, 2, 1, 3));
    y = ggml_group_norm(ctx, y, n_groups, eps);
    y = ggml_cont(ctx, ggml_permute(ctx, y, 0, 2, 1, 3)); /* [C/G, G, T, B] */
    return cr_affine(ctx, ggml_reshape_3d(ctx, y, C, T, B), g, b);
}

/* ------------------------------------------------------------ convolutions */

struct ggml_tensor *cr_dwconv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                              struct ggml_tensor *b, int dilation, int pl, int pr, bool cpu_ops) {
    struct ggml_tensor *fused = cpu_ops ? cr_dwconv_cpu(ctx, x, w, b, dilation, pl, pr) : NULL; /* ops/ops_dwconv.c */
    if (fused) {
        return fused;
    }
    int pad = pl;
    if (pl != pr) { /* the conv pads symmetrically: pad asymmetric frames first */
        x = cr_pad_frames(ctx, x, pl, pr, false);
        pad = 0;
    }
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], K = w->ne[1];
    /* input as ne [T, 1, C, B] with nb [4C, 4CT, 4, 4CT] */
    struct ggml_tensor *xv = ggml_permute(ctx, ggml_reshape_4d(ctx, x, C, T, 1, B), 2, 0, 1, 3);
    /* kernel as ne [K, 1, 1, C] with channels fastest in memory */
    struct ggml_tensor *wv = ggml_permute(ctx, ggml_reshape_4d(ctx, w, C, 1, K, 1), 3, 2, 0, 1);
    struct ggml_tensor *y = ggml_conv_2d_dw_direct(ctx, wv, xv, 1, 1, pad, 0, dilation, 1);
    /* result is ne [T_out, 1, C, B] laid out as [C, T_out, B]: view it back */
    const int64_t T_out = y->ne[0];
    y = ggml_permute(ctx, y, 1, 2, 0, 3);
    y = ggml_reshape_3d(ctx, y, C, T_out, B);
    return b ? ggml_add(ctx, y, b) : y;
}

struct ggml_tensor *cr_dwconv_tf(struct ggml_context *ctx, struct ggml_tensor *t, int64_t L, int64_t B,
                                 struct ggml_tensor *w, struct ggml_tensor *b, int dilation, int pad) {
    const int64_t C = w->ne[0], K = w->ne[1];
    /* ggml's direct depthwise conv, WHCN: input [L, B, C, 1] (width = time,
       height = batch), kernel [K, 1, 1, C] */
    struct ggml_tensor *k = ggml_reshape_4d(ctx, ggml_cont(ctx, ggml_transpose(ctx, w)), K, 1, 1, C);
    struct ggml_tensor *y = ggml_conv_2d_dw_direct(ctx, k, ggml_reshape_4d(ctx, t, L, B, C, 1), 1, 1, pad, 0,
                                                   dilation, 1);
    return b ? ggml_add(ctx, y, ggml_reshape_4d(ctx, b, 1, 1, C, 1)) : y; /* [L_out, B, C, 1] */
}

enum { CR_CONV_MAX_TAPS = 16 }; /* the shifted products' view table; wider kernels take im2col */

/* Off the fused CPU kernels, a full conv runs through im2col unless CODECRT_CONV=taps
   asks for the shifted products. On an H200 and an H100 (2026-12-05) the products made
   DAC decodes 1.5 to 1.7x and Qwen3 ticks 1.5x faster, but one GPU check failed with them
   in two runs of five (DAC 24 kHz, bucketed and masked: 1.0e-3 from the CPU where every
   other check is 4e-6; docs/benchmarks.md) and in none of twelve since (compute-sanitizer's
   initcheck clean, also with PDL off), cause unknown: until it is found they stay opt-in.
   Read when a graph is built. */
static bool cr_conv_im2col(void) {
    const char *e = getenv("CODECRT_CONV");
    return !(e && strcmp(e, "taps") == 0);
}

bool cr_conv_cols_on(bool fused_unit, bool cpu_ops) {
    const char *e = getenv("CODECRT_CONV");
    return fused_unit && !cpu_ops && e && strcmp(e, "cols") == 0;
}

/* x [Cin, T', B] (padded) through ggml's F32 im2col: x transposed to time fastest,
   padded, unrolled to a column matrix [Cin*K, T', B] whose rows ic*K + k match the
   kernel's memory order, and multiplied. */
static struct ggml_tensor *cr_conv1d_im2col(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                            struct ggml_tensor *b, int dilation, int pl, int pr) {
    const int64_t K = w->ne[0], Cin = w->ne[1], Cout = w->ne[2];
    struct ggml_tensor *xt = ggml_cont(ctx, ggml_transpose(ctx, x)); /* [T, Cin, B] */
    if (pl || pr) {
        xt = ggml_pad_ext(ctx, xt, pl, pr, 0, 0, 0, 0, 0, 0);
    }
    struct ggml_tensor *col = ggml_im2col(ctx, w, xt, 1, 0, 0, 0, dilation, 0, false, GGML_TYPE_F32);
    return cr_linear(ctx, col, ggml_reshape_2d(ctx, w, K * Cin, Cout), b, NULL); /* [Cout, T', B] */
}

struct ggml_tensor *cr_conv1d(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *x,
                              struct ggml_tensor *w, struct ggml_tensor *b, int dilation, int pl, int pr,
                              const cr_cpu_ops *ops) {
    struct ggml_tensor *y = ops ? cr_conv1d_cpu(ctx, x, w, b, dilation, pl, pr, ops) : NULL;
    if (y) { /* AVX-512 CPUs: the fused convolution, no transpose, pad or column matrix */
        return y;
    }
    const int64_t K = w->ne[0], Cin = w->ne[1], Cout = w->ne[2];
    if (cr_conv_im2col() || K > CR_CONV_MAX_TAPS) {
        return cr_conv1d_im2col(ctx, x, w, b, dilation, pl, pr);
    }
    x = cr_dense(ctx, x);
    if (pl || pr) {
        x = cr_pad_frames(ctx, x, pl, pr, false); /* [Cin, Tp, B], padded along ne0 of [Cin*T, B] */
    }
    const int64_t Tp = x->ne[1], B = x->ne[2], To = Tp - (int64_t)dilation * (K - 1);
    /* the taps side by side: wk [Cin, K*Cout], row k*Cout + oc is tap k of output oc (a copy
       of the weight per compute: K Cin Cout floats, 66 MB for DAC's widest, against the
       column matrix's K Cin T B) */
    struct ggml_tensor *wk = ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, w, 2, 0, 1, 3)), Cin, K * Cout);
    /* [K*Cout, Tp, B]; on a CPU graph whose fused conv did not apply, the fused product */
    struct ggml_tensor *z = ops ? cr_linear(ctx, x, wk, NULL, ops) : cr_mm(ctx, wk, x);
    /* y[:, t] = sum_k z[k*Cout : (k+1)*Cout, t + k*dil]: K views of one layout. Their view
       nodes go into gf first, so that the K-1 adds are consecutive nodes, each reading the
       last: ggml's CUDA backend fuses such a chain into one kernel (K reads, one write). */
    struct ggml_tensor *v[CR_CONV_MAX_TAPS] = {0};
    for (int64_t k = 0; k < K; k++) {
        v[k] = ggml_view_3d(ctx, z, Cout, To, B, z->nb[1], z->nb[2],
                            (size_t)(k * Cout) * sizeof(float) + (size_t)(k * dilation) * z->nb[1]);
        ggml_build_forward_expand(gf, v[k]);
    }
    y = v[0]; /* K = 1: z itself, viewed */
    for (int64_t k = 1; k < K; k++) {
        y = ggml_add(ctx, y, v[k]);
    }
    return b ? ggml_add(ctx, y, b) : y; /* [Cout, To, B] */
}

struct ggml_tensor *cr_linear_ops(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, struct ggml_tensor *res) {
    struct ggml_tensor *y = cr_matmul(ctx, w, cr_dense(ctx, x));
    if (!y) {
        return NULL;
    }
    if (res && !(ggml_is_contiguous(res) && ggml_are_same_shape(res, y))) {
        return NULL;
    }
    return cr_bias_act(ctx, y, b, res, CR_ACT_NONE);
}

struct ggml_tensor *cr_conv1d_cols(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *alpha,
                                   struct ggml_tensor *inv, struct ggml_tensor *w, struct ggml_tensor *b, int d,
                                   int pl, int pr, struct ggml_tensor *res) {
    const int64_t K = w->ne[0], Cin = w->ne[1], Cout = w->ne[2];
    if (x->ne[0] != Cin || !ggml_is_contiguous(w)) {
        return NULL;
    }
    struct ggml_tensor *cols = cr_cols(ctx, cr_dense(ctx, x), alpha, inv, (int)K, d, pl, pr); /* [K Cin, T', B] */
    return cols ? cr_linear_ops(ctx, cols, ggml_reshape_2d(ctx, w, K * Cin, Cout), b, res) : NULL;
}

struct ggml_tensor *cr_snake_cols(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *alpha,
                                  struct ggml_tensor *inv) {
    return cr_cols(ctx, cr_dense(ctx, x), alpha, inv, 1, 1, 0, 0);
}

cr_res_unit cr_res_unit_weights(struct ggml_context *w, const char *unit, const char *conv) {
    return (cr_res_unit){
        .alpha1 = cr_weight(w, "%s.snake1.alpha", unit),
        .inv_alpha1 = cr_weight(w, "%s.snake1.inv_alpha", unit),
        .dw_w = cr_weight(w, "%s.%s.weight", unit, conv),
        .dw_b = cr_weight(w, "%s.%s.bias", unit, conv),
        .alpha2 = cr_weight(w, "%s.snake2.alpha", unit),
        .inv_alpha2 = cr_weight(w, "%s.snake2.inv_alpha", unit),
        .pw_w = cr_weight(w, "%s.pw.weight", unit),
        .pw_b = cr_weight(w, "%s.pw.bias", unit),
    };
}

struct ggml_tensor *cr_res_unit_cols(struct ggml_context *ctx, struct ggml_tensor *buf, const cr_res_unit *u,
                                     int dil, int pl, int pr, struct ggml_tensor *res) {
    struct ggml_tensor *y = cr_conv1d_cols(ctx, buf, u->alpha1, u->inv_alpha1, u->dw_w, u->dw_b, dil, pl, pr, NULL);
    y = y ? cr_snake_cols(ctx, y, u->alpha2, u->inv_alpha2) : NULL;
    const bool fold = res && ggml_is_contiguous(res);
    struct ggml_tensor *out = y ? cr_linear_ops(ctx, y, u->pw_w, u->pw_b, fold ? res : NULL) : NULL;
    return !out || !res || fold ? out : ggml_add(ctx, res, out);
}

int64_t cr_conv1d_max_elements(int64_t K, int64_t Cin, int64_t Cout, int64_t T, int64_t B) {
    const int64_t cols = K * (Cin > Cout ? Cin : Cout) * T * B, taps = K * Cin * Cout;
    return cols > taps ? cols : taps;
}

struct ggml_tensor *cr_conv_narrow(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                   struct ggml_tensor *b, int K, int pl, int pr) {
    const int64_t Cout = w->ne[1] / K, B = x->ne[2];
    const int64_t T_out = x->ne[1] + pl + pr - (K - 1);
    struct ggml_tensor *z = cr_mm(ctx, w, x);  /* [K*Cout, T, B] */
    z = cr_pad_frames(ctx, z, pl, pr, false);  /* [K*Cout, T+pl+pr, B] */
    struct ggml_tensor *y = NULL;
    for (int64_t k = 0; k < K; k++) {
        struct ggml_tensor *v = ggml_view_3d(ctx, z, Cout, T_out, B, z->nb[1], z->nb[2],
                                             (size_t)(k * Cout) * sizeof(float) + (size_t)k * z->nb[1]);
        y = y ? ggml_add(ctx, y, v) : ggml_cont(ctx, v);
    }
    return b ? ggml_add(ctx, y, b) : y;
}

struct ggml_tensor *cr_upconv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                              struct ggml_tensor *b, int s, int crop, int64_t n_out, const cr_cpu_ops *ops, bool cpu) {
    const int64_t T = x->ne[1], B = x->ne[2], Cout = w->ne[1] / (2 * s);
    struct ggml_tensor *xp = cr_pad_frames(ctx, x, 1, 1, cpu); /* [Cin, T+2, B] */
    struct ggml_tensor *cols = ops ? cr_linear(ctx, xp, w, NULL, ops) : cr_mm(ctx, w, xp); /* [2s*Cout, T+2, B] */
    const size_t half = (size_t)(s * Cout) * sizeof(float);
    /* block j = lo at padded frame j+1 + hi at padded frame j, j = 0..T */
    struct ggml_tensor *lo = ggml_view_3d(ctx, cols, s * Cout, T + 1, B, cols->nb[1], cols->nb[2], cols->nb[1]);
    struct ggml_tensor *hi = ggml_view_3d(ctx, cols, s * Cout, T + 1, B, cols->nb[1], cols->nb[2], half);
    struct ggml_tensor *y = ggml_add(ctx, lo, hi); /* [s*Cout, T+1, B] = [Cout, s*(T+1), B] */
    y = ggml_view_3d(ctx, y, Cout, n_out, B, (size_t)Cout * sizeof(float), y->nb[2],
                     (size_t)(crop * Cout) * sizeof(float));
    return b ? ggml_add(ctx, y, b) : y;
}

struct ggml_tensor *cr_upconv_tf(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                 struct ggml_tensor *b, struct ggml_tensor *mask, int s, int crop, int64_t n_out) {
    if (s < 1 || s >= CR_UPCONV_MAX_STRIDE || crop < 0 || crop >= CR_UPCONV_MAX_STRIDE) {
        return NULL; /* what the op's parameters cannot carry; the shapes next, all before the
                        product, so that no node is left without a use */
    }
    const int64_t Cout = w->ne[1] / (2 * s);
    if (!b || b->type != GGML_TYPE_F32 || w->type != GGML_TYPE_F32 || x->type != GGML_TYPE_F32 ||
        ggml_nelements(b) != Cout || w->ne[1] != 2 * s * Cout || w->ne[0] != x->ne[0] || n_out < 1 ||
        crop + n_out > s * (x->ne[1] + 1)) {
        return NULL;
    }
    struct ggml_tensor *z = cr_mm(ctx, w, cr_dense(ctx, x)); /* [2s*Cout, T, B] */
    return cr_upconv_tail(ctx, z, b, mask, s, crop, n_out, NULL); /* [n_out, B, Cout] */
}

struct ggml_tensor *cr_upconv_step(struct ggml_context *ctx, struct ggml_tensor *buf, struct ggml_tensor *w,
                                   struct ggml_tensor *b, int s, const cr_cpu_ops *ops) {
    const int64_t n = buf->ne[1] - 1, B = buf->ne[2], Cout = w->ne[1] / (2 * s);
    struct ggml_tensor *cols = ops ? cr_linear(ctx, buf, w, NULL, ops) : cr_mm(ctx, w, buf); /* [2s*Cout, n+1, B] */
    const size_t half = (size_t)(s * Cout) * sizeof(float);
    struct ggml_tensor *lo = ggml_view_3d(ctx, cols, s * Cout, n, B, cols->nb[1], cols->nb[2], cols->nb[1]);
    struct ggml_tensor *hi = ggml_view_3d(ctx, cols, s * Cout, n, B, cols->nb[1], cols->nb[2], half);
    struct ggml_tensor *y = ggml_reshape_3d(ctx, ggml_add(ctx, lo, hi), Cout, n * s, B);
    return b ? ggml_add(ctx, y, b) : y;
}

/* ---------------------------------------------------------- residual units */

struct ggml_tensor *cr_res_branch(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *buf,
                                  const cr_res_unit *u, int dil, bool same, const cr_cpu_ops *ops) {
    const int pad = same ? (int)(dil * (u->dw_w->ne[1] - 1) / 2) : 0;
    struct ggml_tensor *y;
    if (ops) {
        y = cr_snake_cpu(ctx, buf, u->alpha1, u->inv_alpha1);
        y = cr_dwconv(ctx, y, u->dw_w, u->dw_b, dil, pad, pad, true);
        y = cr_snake_cpu(ctx, y, u->alpha2, u->inv_alpha2);
    } else {
        const int64_t C = buf->ne[0], L = buf->ne[1], B = buf->ne[2];
        struct ggml_tensor *t = cr_snake_tf(ctx, gf, cr_to_tf(ctx, buf), u->alpha1, u->inv_alpha1); /* [L*B, C] */
        t = cr_dwconv_tf(ctx, t, L, B, u->dw_w, u->dw_b, dil, pad); /* [n, B, C, 1] */
        const int64_t n = t->ne[0];
        t = cr_snake_tf(ctx, gf, ggml_reshape_2d(ctx, t, n * B, C), u->alpha2, u->inv_alpha2);
        y = cr_to_cf(ctx, t, n, B);
    }
    return cr_linear(ctx, y, u->pw_w, u->pw_b, ops); /* the fused product on the CPU */
}

struct ggml_tensor *cr_res_unit_tf(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *buf,
                                   const cr_res_unit *u, int dil, bool same, bool fused, struct ggml_tensor *mask,
                                   struct ggml_tensor *prefix) {
    const int64_t Lb = buf->ne[0], B = buf->ne[1], C = buf->ne[2], K = u->dw_w->ne[1];
    const int64_t P = dil * (K - 1) / 2, n = same ? Lb : Lb - 2 * P;
    /* y [C, n*B]: the branch before its 1x1 conv, channels fastest */
    struct ggml_tensor *y = fused ? cr_unit_core(ctx, buf, u->dw_w, u->dw_b, u->alpha1, u->inv_alpha1, u->alpha2,
                                                 u->inv_alpha2, dil, same)
                                  : NULL;
    if (y) {
        y = ggml_reshape_2d(ctx, y, C, n * B);
    } else {
        struct ggml_tensor *t = cr_snake_tf(ctx, gf, ggml_reshape_2d(ctx, buf, Lb * B, C), u->alpha1,
                                            u->inv_alpha1); /* [Lb*B, C] */
        t = cr_dwconv_tf(ctx, t, Lb, B, u->dw_w, u->dw_b, dil, same ? (int)P : 0); /* [n, B, C, 1] */
        t = cr_snake_tf(ctx, gf, ggml_reshape_2d(ctx, t, n * B, C), u->alpha2, u->inv_alpha2);
        y = ggml_cont(ctx, ggml_transpose(ctx, t)); /* the one transpose */
    }
    /* 1x1 conv as y^T w: y [C, n*B], w [C, Cout] -> [n*B, Cout] */
    y = ggml_mul_mat(ctx, y, cr_f32(ctx, u->pw_w));
    struct ggml_tensor *xd =
        same ? buf : ggml_view_3d(ctx, buf, n, B, C, buf->nb[1], buf->nb[2], (size_t)P * sizeof(float));
    /* + bias + residual (x mask) (after the prefix): one op when fused, else two adds (and a
       product, and a concat) */
    struct ggml_tensor *out = fused ? cr_unit_tail(ctx, y, u->pw_b, xd, mask, prefix) : NULL;
    if (out) {
        return out;
    }
    y = ggml_add(ctx, y, ggml_reshape_2d(ctx, u->pw_b, 1, u->pw_b->ne[0]));
    out = ggml_add(ctx, ggml_reshape_3d(ctx, y, n, B, C), xd);
    out = mask ? ggml_mul(ctx, out, ggml_reshape_3d(ctx, mask, n, B, 1)) : out;
    if (prefix) {
        out = ggml_concat(ctx, ggml_is_contiguous(prefix) ? prefix : ggml_cont(ctx, prefix), out, 0);
    }
    return out;
}
