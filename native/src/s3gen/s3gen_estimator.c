/*
 * s3gen_estimator.c: the flow's vector field, CosyVoice2's causal
 * ConditionalDecoder (a Matcha-TTS 1-D U-Net of one resolution), evaluated
 * once per Euler step.
 *
 * Activations are F32 [C, T, B], channels fastest: Linear layers and 1x1
 * convolutions are plain products with the (possibly F16) weight as src0,
 * LayerNorm over channels (the causal blocks' transpose-LayerNorm-transpose)
 * is a row norm, and per-channel parameters broadcast rows. Per evaluation:
 *
 *   temb = time_mlp(sinusoid(t)) [1024, B]; meanflow: time_embed_mixer(
 *          [time_mlp(sinusoid(t)); time_mlp(sinusoid(r))])      (host sinusoid)
 *   h = [x; mu; spks broadcast over T; cond] [320, T, B]
 *   down:  resnet(320 -> 256), 4 x transformer, causal conv k3 -> skip = h
 *   mid:   12 x (resnet(256 -> 256), 4 x transformer)
 *   up:    resnet([h; skip] 512 -> 256), 4 x transformer, causal conv k3
 *   final_block (causal conv k3, LayerNorm, Mish) -> final_proj 1x1 [80, T, B]
 *
 *   resnet(x) = block2(block1(x) + Linear(Mish(temb))) + res_conv(x)
 *   block     = causal conv k3 (left pad 2) -> LayerNorm(1e-5) -> Mish
 *   transformer: x += to_out(MHA(LN1(x))); x += W2 gelu_erf(W1 LN3(x))
 *                (8 heads of 64, softmax scale 1/8, no q/k/v bias)
 *
 * With one channel count the U-Net has no Downsample1D/Upsample1D: the
 * "down" and "up" samplers are CausalConv1d(256, 256, 3). The reference's
 * masks are all ones here (no padding; static_chunk_size 0 makes the
 * attention bias (1 - mask) * -1e10 = 0), so every "* mask" is dropped.
 *
 * On the CPU (cpu_ops) the products and the attention are the fused kernels
 * of ops/ on AVX-512 CPUs (F32, or BF16 in a BF16 context; no
 * [T, T, 8, B] score tensor), in F32 also on AVX2 + FMA CPUs, and ggml's
 * tiled F32 flash attention elsewhere,
 * and the element-wise chains around LayerNorm, Mish and GELU are fused
 * kernels of this file. Where codecrt's device ops are (CUDA, or the portable
 * graphs with CODECRT_FUSED_UNIT=1) a transformer block is all codecrt's ops:
 * the norms, the products, the attention's scores, softmax and values, the
 * biases with GELU or the residual (est_graph below). Elsewhere the same
 * arithmetic is composed from ggml ops.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "s3gen.h"

#define EST_CH 256                /* U-Net channels */
#define EST_IN (4 * S3_MEL)       /* x, mu, spks, cond */
#define EST_TIME (4 * EST_CH)     /* time embedding width */
#define EST_HEADS 8
#define EST_HEAD_DIM 64
#define EST_INNER (EST_HEADS * EST_HEAD_DIM)
#define EST_FF (4 * EST_CH)
#define EST_K 3                   /* causal conv kernel */
#define EST_BLOCKS 4              /* transformer blocks per stage */
#define EST_MID 12                /* mid stages */
#define EST_EPS 1e-5f             /* every LayerNorm */
#define EST_TIME_SCALE 1000.0f    /* SinusoidalPosEmb's scale */

/* io->in[] slots */
enum { EST_IN_TIME = 0 };

/* printf into a name buffer of GGML_MAX_NAME (every name here is far shorter;
   vsnprintf keeps gcc's truncation check quiet about the nested prefixes). */
static void est_name(char *buf, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void est_name(char *buf, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, GGML_MAX_NAME, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------ tensor specs */

static void est_resnet_specs(cr_spec_list *s, const char *p, int64_t cin) {
    cr_spec_add(s, true, 2, EST_TIME, EST_CH, "%s.mlp.1.weight", p);
    cr_spec_add(s, false, 1, EST_CH, 1, "%s.mlp.1.bias", p);
    for (int j = 1; j <= 2; j++) {
        cr_spec_add3(s, true, EST_K, j == 1 ? cin : EST_CH, EST_CH, "%s.block%d.block.0.weight", p, j);
        cr_spec_add(s, false, 1, EST_CH, 1, "%s.block%d.block.0.bias", p, j);
        cr_spec_add(s, false, 1, EST_CH, 1, "%s.block%d.block.2.weight", p, j);
        cr_spec_add(s, false, 1, EST_CH, 1, "%s.block%d.block.2.bias", p, j);
    }
    cr_spec_add3(s, true, 1, cin, EST_CH, "%s.res_conv.weight", p);
    cr_spec_add(s, false, 1, EST_CH, 1, "%s.res_conv.bias", p);
}

static void est_transformer_specs(cr_spec_list *s, const char *p) {
    const int64_t D = EST_CH;
    cr_spec_add(s, false, 1, D, 1, "%s.norm1.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm1.bias", p);
    cr_spec_add(s, true, 2, D, EST_INNER, "%s.attn1.to_q.weight", p);
    cr_spec_add(s, true, 2, D, EST_INNER, "%s.attn1.to_k.weight", p);
    cr_spec_add(s, true, 2, D, EST_INNER, "%s.attn1.to_v.weight", p);
    cr_spec_add(s, true, 2, EST_INNER, D, "%s.attn1.to_out.0.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.attn1.to_out.0.bias", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm3.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm3.bias", p);
    cr_spec_add(s, true, 2, D, EST_FF, "%s.ff.net.0.proj.weight", p);
    cr_spec_add(s, false, 1, EST_FF, 1, "%s.ff.net.0.proj.bias", p);
    cr_spec_add(s, true, 2, EST_FF, D, "%s.ff.net.2.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.ff.net.2.bias", p);
}

/* One U-Net stage: resnet at "<stage>.0", transformers at "<stage>.1.<j>". */
static void est_stage_specs(cr_spec_list *s, const char *stage, int64_t cin) {
    char p[GGML_MAX_NAME];
    est_name(p, "%s.0", stage);
    est_resnet_specs(s, p, cin);
    for (int j = 0; j < EST_BLOCKS; j++) {
        est_name(p, "%s.1.%d", stage, j);
        est_transformer_specs(s, p);
    }
}

void s3_estimator_specs(const s3gen_hparams *hp, cr_spec_list *s) {
    cr_spec_add(s, true, 2, S3_TEMB, EST_TIME, "est.time_mlp.linear_1.weight");
    cr_spec_add(s, false, 1, EST_TIME, 1, "est.time_mlp.linear_1.bias");
    cr_spec_add(s, true, 2, EST_TIME, EST_TIME, "est.time_mlp.linear_2.weight");
    cr_spec_add(s, false, 1, EST_TIME, 1, "est.time_mlp.linear_2.bias");
    est_stage_specs(s, "est.down_blocks.0", EST_IN);
    cr_spec_add3(s, true, EST_K, EST_CH, EST_CH, "est.down_blocks.0.2.weight");
    cr_spec_add(s, false, 1, EST_CH, 1, "est.down_blocks.0.2.bias");
    char p[GGML_MAX_NAME];
    for (int i = 0; i < EST_MID; i++) {
        est_name(p, "est.mid_blocks.%d", i);
        est_stage_specs(s, p, EST_CH);
    }
    est_stage_specs(s, "est.up_blocks.0", 2 * EST_CH);
    cr_spec_add3(s, true, EST_K, EST_CH, EST_CH, "est.up_blocks.0.2.weight");
    cr_spec_add(s, false, 1, EST_CH, 1, "est.up_blocks.0.2.bias");
    cr_spec_add3(s, true, EST_K, EST_CH, EST_CH, "est.final_block.block.0.weight");
    cr_spec_add(s, false, 1, EST_CH, 1, "est.final_block.block.0.bias");
    cr_spec_add(s, false, 1, EST_CH, 1, "est.final_block.block.2.weight");
    cr_spec_add(s, false, 1, EST_CH, 1, "est.final_block.block.2.bias");
    cr_spec_add3(s, true, 1, EST_CH, S3_MEL, "est.final_proj.weight");
    cr_spec_add(s, false, 1, S3_MEL, 1, "est.final_proj.bias");
    if (hp->meanflow) {
        cr_spec_add(s, true, 2, 2 * EST_TIME, EST_TIME, "est.time_embed_mixer.weight");
    }
}

/* ------------------------------------------------ fused CPU kernels (cpu_ops) */

/*
 * Element-wise chains that dominate the CPU time when composed from ggml ops
 * (libm's scalar erff, and Mish as softplus, tanh and a product: 20-40 ns per
 * element against ~1 ns here). Written branch-free (selects of ready values
 * only, bit-level scaling) so that the compiler vectorizes the row loops even
 * with trapping math. Other graphs use codecrt's device ops or ggml's.
 */

/* e^x to ~1e-7 relative for x in [-87, 88] (clamped there): n = round(x / ln 2)
   from the mantissa of x / ln 2 + 1.5 * 2^23, Cody-Waite reduction, degree-7
   Taylor polynomial on |r| <= ln(2) / 2 (truncation < 1e-8), times 2^n. */
static inline float est_expf(float x) {
    x = x > -87.0f ? x : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    const union { float f; int32_t i; } v = {.f = fmaf(x, 1.44269504088896341f, 12582912.0f)};
    const float n = v.f - 12582912.0f;
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    union { float f; int32_t i; } y = {.f = p};
    y.i += (v.i - 0x4b400000) * (1 << 23);
    return y.f;
}

/* Mish: tanh(log(1 + e)) = n / (n + 2) with n = e (e + 2), e = e^x (one
   exponential; above x = 20 the factor is 1 in float). Error < 3e-7 relative. */
static inline float est_mishf(float x) {
    const float e = est_expf(x < 20.0f ? x : 20.0f);
    const float n = e * (e + 2.0f);
    return x * n / (n + 2.0f);
}

/* Exact (erf) GELU x (1 + erf(x / sqrt 2)) / 2 with erfc(z), z = |x| / sqrt 2,
   from Abramowitz-Stegun 7.1.26 (absolute error < 1.5e-7). */
static inline float est_geluf(float x) {
    const float z = fabsf(x) * 0.70710678118654752f;
    const float t = 1.0f / fmaf(0.3275911f, z, 1.0f);
    float p = 1.061405429f;
    p = fmaf(p, t, -1.453152027f);
    p = fmaf(p, t, 1.421413741f);
    p = fmaf(p, t, -0.284496736f);
    p = fmaf(p, t, 0.254829592f);
    const float erfc = p * t * est_expf(-z * z);
    return 0.5f * x * (1.0f + copysignf(1.0f - erfc, x));
}

/* This thread's rows [*r0, *r1) of a tensor of `rows` rows. */
static void est_rows(int64_t rows, int ith, int nth, int64_t *r0, int64_t *r1) {
    const int64_t per = (rows + nth - 1) / nth;
    *r0 = per * ith < rows ? per * ith : rows;
    *r1 = *r0 + per < rows ? *r0 + per : rows;
}

/* dst = x * g + b (then Mish), x [C, rows] contiguous (ggml_norm's output), g, b [C]. */
static inline void est_affine_rows(struct ggml_tensor *dst, const struct ggml_tensor *x,
                                   const struct ggml_tensor *g, const struct ggml_tensor *b, int ith, int nth,
                                   bool mish) {
    const int64_t C = x->ne[0];
    int64_t r0, r1;
    est_rows(ggml_nrows(x), ith, nth, &r0, &r1);
    const float *gv = (const float *)g->data, *bv = (const float *)b->data;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = (const float *)x->data + r * C;
        float *yr = (float *)dst->data + r * C;
        if (mish) {
            for (int64_t c = 0; c < C; c++) {
                yr[c] = est_mishf(fmaf(xr[c], gv[c], bv[c]));
            }
        } else {
            for (int64_t c = 0; c < C; c++) {
                yr[c] = fmaf(xr[c], gv[c], bv[c]);
            }
        }
    }
}

static void est_affine_kernel(struct ggml_tensor *dst, const struct ggml_tensor *x, const struct ggml_tensor *g,
                              const struct ggml_tensor *b, int ith, int nth, void *user) {
    (void)user;
    est_affine_rows(dst, x, g, b, ith, nth, false);
}

static void est_affine_mish_kernel(struct ggml_tensor *dst, const struct ggml_tensor *x,
                                   const struct ggml_tensor *g, const struct ggml_tensor *b, int ith, int nth,
                                   void *user) {
    (void)user;
    est_affine_rows(dst, x, g, b, ith, nth, true);
}

/* dst = Mish(x), x contiguous. */
static void est_mish_kernel(struct ggml_tensor *dst, const struct ggml_tensor *x, int ith, int nth, void *user) {
    (void)user;
    const int64_t C = x->ne[0];
    int64_t r0, r1;
    est_rows(ggml_nrows(x), ith, nth, &r0, &r1);
    const float *xv = (const float *)x->data + r0 * C;
    float *yv = (float *)dst->data + r0 * C;
    for (int64_t i = 0; i < (r1 - r0) * C; i++) {
        yv[i] = est_mishf(xv[i]);
    }
}

/* dst = GELU(x + b), x [C, rows] contiguous, b [C]. */
static void est_bias_gelu_kernel(struct ggml_tensor *dst, const struct ggml_tensor *x, const struct ggml_tensor *b,
                                 int ith, int nth, void *user) {
    (void)user;
    const int64_t C = x->ne[0];
    int64_t r0, r1;
    est_rows(ggml_nrows(x), ith, nth, &r0, &r1);
    const float *bv = (const float *)b->data;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = (const float *)x->data + r * C;
        float *yr = (float *)dst->data + r * C;
        for (int64_t c = 0; c < C; c++) {
            yr[c] = est_geluf(xr[c] + bv[c]);
        }
    }
}

/* ----------------------------------------------------------- graph pieces */

/* What every piece needs: contexts, the time embedding after its Mish, whether the
   graph runs on the CPU backend (fused kernels, flash attention), and whether codecrt's
   device ops are there (the norms as cr_norm_rows, the products as cr_matmul, the
   attention's scores as cr_attn_scores, its softmax as cr_softmax_rows, its values as
   cr_attn_values, biases with their activation or residual as cr_bias_act). */
typedef struct est_graph {
    struct ggml_context *ctx;
    struct ggml_context *w;
    struct ggml_tensor *tm; /* Mish(temb) [1024, B] */
    const cr_cpu_ops *cpu;
    bool ops;
} est_graph;

static struct ggml_tensor *est_mish(const est_graph *g, struct ggml_tensor *x) {
    if (g->cpu) {
        return ggml_map_custom1(g->ctx, x, est_mish_kernel, GGML_N_TASKS_MAX, NULL);
    }
    /* ggml's softplus is torch's (identity above 20) */
    return ggml_mul(g->ctx, x, ggml_tanh(g->ctx, ggml_softplus(g->ctx, x)));
}

/* LayerNorm over channels (eps 1e-5) of x [C, T, B] contiguous, then Mish if asked. */
static struct ggml_tensor *est_norm(const est_graph *g, struct ggml_tensor *x, const char *p, bool mish) {
    struct ggml_tensor *gain = s3_w(g->w, "%s.weight", p), *bias = s3_w(g->w, "%s.bias", p);
    struct ggml_tensor *y = g->ops ? cr_norm_rows(g->ctx, x, gain, bias, EST_EPS, false, mish) : NULL;
    if (y) { /* codecrt's device op: the norm, its affine and the Mish in one pass */
        return y;
    }
    x = ggml_norm(g->ctx, x, EST_EPS);
    if (g->cpu) {
        return ggml_map_custom3(g->ctx, x, gain, bias, mish ? est_affine_mish_kernel : est_affine_kernel,
                                GGML_N_TASKS_MAX, NULL);
    }
    x = ggml_add(g->ctx, ggml_mul(g->ctx, x, gain), bias);
    return mish ? est_mish(g, x) : x;
}

/* W x + b (+ res): x [K, T, B] contiguous, w [K, N], b [N], res [N, T, B] or NULL. With
   codecrt's device ops the product is codecrt's too (cr_matmul: a transformer block's ops
   stay on one backend, no split of the graph between them) and the bias and the residual
   one pass after it (cr_bias_act); else cr_linear and ggml's add. */
static struct ggml_tensor *est_linear(const est_graph *g, struct ggml_tensor *x, struct ggml_tensor *w,
                                      struct ggml_tensor *b, struct ggml_tensor *res) {
    struct ggml_tensor *y = g->ops ? cr_matmul(g->ctx, w, x) : NULL;
    struct ggml_tensor *out = y && b ? cr_bias_act(g->ctx, y, b, res, CR_ACT_NONE) : NULL;
    if (out) {
        return out;
    }
    if (y) { /* a bias the op does not take: ggml's adds after codecrt's product */
        y = b ? ggml_add(g->ctx, y, b) : y;
    } else {
        y = cr_linear(g->ctx, x, w, b, g->cpu);
    }
    return res ? ggml_add(g->ctx, res, y) : y;
}

/*
 * CausalConv1d(k3) of x [Cin, T, B] -> [Cout, T, B]: on AVX-512 CPUs the fused
 * convolution; with codecrt's ops (GPU graphs) one product over the columns op's
 * matrix [3 Cin, T, B] (row c 3 + k: channel c at frame t + k - 2, the kernel's
 * own order); elsewhere (other CPUs, graphs without the ops) one product over a
 * column matrix whose row k Cin + c is input channel c at frame t + k of the input
 * left-padded by 2 frames, against the kernel [3, Cin, Cout] permuted to
 * [Cin, 3, Cout] to match. The product comes out channels fastest.
 */
static struct ggml_tensor *est_causal_conv(const est_graph *g, struct ggml_tensor *x, const char *p) {
    struct ggml_tensor *k = s3_w(g->w, "%s.weight", p);
    const int64_t Cin = k->ne[1], Cout = k->ne[2];
    struct ggml_tensor *y = g->cpu ? cr_conv1d_cpu(g->ctx, x, k, s3_w(g->w, "%s.bias", p), 1, EST_K - 1, 0, g->cpu) : NULL;
    if (y) { /* AVX-512 CPUs: the fused convolution, no transpose, pad or column matrix */
        return y;
    }
    struct ggml_tensor *cols = g->ops ? cr_cols(g->ctx, x, NULL, NULL, EST_K, 1, EST_K - 1, 0) : NULL;
    if (cols) { /* codecrt's columns op: [K Cin, T, B], rows c K + k, the kernel's own order */
        return est_linear(g, cols, ggml_reshape_2d(g->ctx, k, EST_K * Cin, Cout), s3_w(g->w, "%s.bias", p), NULL);
    }
    /* Channels fastest, the column of output frame t is xp[:, t .. t+2] of the input padded by
       two frames on the left: the three frames side by side, 3 Cin floats. So the column
       matrix is the three shifted views of xp concatenated along the channels: no transpose
       and no im2col's gather (which took 23 % of a 64-stream Turbo tick's kernel time on an
       H100). (One view with rows overlapping by 2 Cin would be the same numbers, but ggml
       refuses a view larger than its source.) The weight's taps go side by side to match:
       [K, Cin, Cout] -> [Cin, K, Cout] (row k Cin + c). */
    struct ggml_tensor *xp = cr_pad_frames(g->ctx, x, EST_K - 1, 0, false); /* [Cin, T+2, B] */
    const int64_t T = x->ne[1], B = x->ne[2];
    struct ggml_tensor *col = NULL;
    for (int j = 0; j < EST_K; j++) {
        struct ggml_tensor *v = ggml_view_3d(g->ctx, xp, Cin, T, B, xp->nb[1], xp->nb[2], (size_t)j * xp->nb[1]);
        col = col ? ggml_concat(g->ctx, col, v, 0) : v; /* [(j+1) Cin, T, B] */
    }
    struct ggml_tensor *wk = ggml_cont(g->ctx, ggml_permute(g->ctx, k, 1, 0, 2, 3)); /* [Cin, K, Cout] */
    return cr_linear(g->ctx, col, ggml_reshape_2d(g->ctx, wk, EST_K * Cin, Cout), s3_w(g->w, "%s.bias", p),
                     g->cpu);
}

/* CausalBlock1D: conv -> LayerNorm over channels -> Mish. p names the block
   ("….block1"); its Sequential holds the conv at .0 and the norm at .2. */
static struct ggml_tensor *est_block(const est_graph *g, struct ggml_tensor *x, const char *p) {
    char q[GGML_MAX_NAME];
    est_name(q, "%s.block.0", p);
    x = est_causal_conv(g, x, q);
    est_name(q, "%s.block.2", p);
    return est_norm(g, x, q, true);
}

/* CausalResnetBlock1D: x [Cin, T, B] -> [256, T, B]. */
static struct ggml_tensor *est_resnet(const est_graph *g, struct ggml_tensor *x, const char *p) {
    char q[GGML_MAX_NAME];
    est_name(q, "%s.block1", p);
    struct ggml_tensor *h = est_block(g, x, q);
    struct ggml_tensor *t = est_linear(g, g->tm, s3_w(g->w, "%s.mlp.1.weight", p), s3_w(g->w, "%s.mlp.1.bias", p),
                                       NULL);
    h = ggml_add(g->ctx, h, ggml_reshape_3d(g->ctx, t, EST_CH, 1, t->ne[1])); /* per sequence, over time */
    est_name(q, "%s.block2", p);
    h = est_block(g, h, q);
    struct ggml_tensor *r = s3_w(g->w, "%s.res_conv.weight", p);
    return est_linear(g, x, ggml_reshape_2d(g->ctx, r, r->ne[1], r->ne[2]), s3_w(g->w, "%s.res_conv.bias", p), h);
}


/* [512, T, B] -> per head [64, T, 8, B] (a view). */
static struct ggml_tensor *est_heads(const est_graph *g, struct ggml_tensor *x) {
    x = ggml_reshape_4d(g->ctx, x, EST_HEAD_DIM, EST_HEADS, x->ne[1], x->ne[2]);
    return ggml_permute(g->ctx, x, 0, 2, 1, 3);
}

/*
 * diffusers Attention (AttnProcessor2_0: scaled_dot_product_attention, scale
 * 1/8, no q/k/v bias; the reference's bias is 0 with its all-ones mask) on
 * x [256, T, B] (normed), added to the residual res [256, T, B] (the block's input)
 * -> [256, T, B]. On CPUs with AVX-512 (or, in F32, AVX2 and FMA) our fused
 * kernel (ops_avx512_attention.c, 2.6x ggml's on AVX-512), on other CPUs ggml's tiled F32
 * flash attention; elsewhere two products around a softmax.
 */
static struct ggml_tensor *est_attention(const est_graph *g, struct ggml_tensor *x, struct ggml_tensor *res,
                                         const char *p) {
    const int64_t T = x->ne[1], B = x->ne[2];
    const float scale = 1.0f / sqrtf((float)EST_HEAD_DIM);
    struct ggml_tensor *q = est_linear(g, x, s3_w(g->w, "%s.to_q.weight", p), NULL, NULL); /* [512, T, B] */
    struct ggml_tensor *k = est_linear(g, x, s3_w(g->w, "%s.to_k.weight", p), NULL, NULL);
    struct ggml_tensor *v = g->cpu ? cr_linear(g->ctx, x, s3_w(g->w, "%s.to_v.weight", p), NULL, g->cpu) : NULL;
    struct ggml_tensor *o = g->cpu ? cr_attention_cpu(g->ctx, q, k, v, g->cpu) : NULL; /* [512, T, B]; AVX-512, AVX2 CPUs */
    if (o) {
        return ggml_add(g->ctx, res, cr_linear(g->ctx, o, s3_w(g->w, "%s.to_out.0.weight", p),
                                               s3_w(g->w, "%s.to_out.0.bias", p), g->cpu));
    }
    q = est_heads(g, q);
    k = est_heads(g, k);
    if (g->cpu) {
        o = ggml_flash_attn_ext(g->ctx, q, k, est_heads(g, v), NULL, scale, 0.0f, 0.0f); /* [64, 8, T, B] */
    } else {
        /* V time fastest straight from its product, operands swapped: x^T Wv over every frame
           of every sequence, [T B, 512]; per head and sequence the view [T, 64] the second
           product reads (rows T B apart). No transposing copy of V (a cont(permute) of
           [512, T, B] before). */
        /* F16 weights cast here: ggml's CPU and CUDA products take no F16 second operand */
        struct ggml_tensor *wv = cr_f32(g->ctx, s3_w(g->w, "%s.to_v.weight", p));
        struct ggml_tensor *x2 = ggml_reshape_2d(g->ctx, cr_dense(g->ctx, x), x->ne[0], T * B);
        struct ggml_tensor *vt = g->ops ? cr_matmul(g->ctx, x2, wv) : NULL;
        vt = vt ? vt : ggml_mul_mat(g->ctx, x2, wv);
        const size_t f = sizeof(float);
        v = ggml_view_4d(g->ctx, vt, T, EST_HEAD_DIM, EST_HEADS, B, (size_t)(T * B) * f,
                         (size_t)(EST_HEAD_DIM * T * B) * f, (size_t)T * f, 0);             /* [T, 64, 8, B] */
        struct ggml_tensor *a = g->ops ? cr_attn_scores(g->ctx, k, q) : NULL;           /* [Tk, Tq, 8, B] */
        a = a ? a : ggml_mul_mat(g->ctx, k, q);
        struct ggml_tensor *sm = g->ops ? cr_softmax_rows(g->ctx, a, scale) : NULL;  /* a warp a row */
        a = sm ? sm : ggml_soft_max_ext(g->ctx, a, NULL, scale, 0.0f);
        /* the heads of each query side by side for the output projection: in one op where the
           device has codecrt's (no copy), else a product [64, Tq, 8, B] and its permutation */
        o = g->ops ? cr_attn_values(g->ctx, v, a) : NULL;                               /* [64, 8, T, B] */
        if (!o) {
            o = ggml_mul_mat(g->ctx, v, a);                                             /* [64, Tq, 8, B] */
            o = ggml_cont(g->ctx, ggml_permute(g->ctx, o, 0, 2, 1, 3));                 /* [64, 8, T, B] */
        }
    }
    o = ggml_reshape_3d(g->ctx, o, EST_INNER, T, B);
    return est_linear(g, o, s3_w(g->w, "%s.to_out.0.weight", p), s3_w(g->w, "%s.to_out.0.bias", p), res);
}

/* BasicTransformerBlock (layer norms, self-attention, GELU feed-forward; no cross-attention). */
static struct ggml_tensor *est_transformer(const est_graph *g, struct ggml_tensor *x, const char *p) {
    char q[GGML_MAX_NAME];
    est_name(q, "%s.norm1", p);
    struct ggml_tensor *h = est_norm(g, x, q, false);
    est_name(q, "%s.attn1", p);
    x = est_attention(g, h, x, q);
    est_name(q, "%s.norm3", p);
    h = est_norm(g, x, q, false);
    /* diffusers GELU (approximate="none") of ff.net.0.proj */
    struct ggml_tensor *b1 = s3_w(g->w, "%s.ff.net.0.proj.bias", p);
    h = est_linear(g, h, s3_w(g->w, "%s.ff.net.0.proj.weight", p), NULL, NULL);
    struct ggml_tensor *a = g->ops ? cr_bias_act(g->ctx, h, b1, NULL, CR_ACT_GELU_ERF) : NULL;
    if (!a) {
        a = g->cpu ? ggml_map_custom2(g->ctx, h, b1, est_bias_gelu_kernel, GGML_N_TASKS_MAX, NULL)
                   : ggml_gelu_erf(g->ctx, ggml_add(g->ctx, h, b1));
    }
    return est_linear(g, a, s3_w(g->w, "%s.ff.net.2.weight", p), s3_w(g->w, "%s.ff.net.2.bias", p), x);
}

/* resnet then the stage's transformer blocks. */
static struct ggml_tensor *est_stage(const est_graph *g, struct ggml_tensor *x, const char *stage) {
    char p[GGML_MAX_NAME];
    est_name(p, "%s.0", stage);
    x = est_resnet(g, x, p);
    for (int j = 0; j < EST_BLOCKS; j++) {
        est_name(p, "%s.1.%d", stage, j);
        x = est_transformer(g, x, p);
    }
    return x;
}

/* TimestepEmbedding: e [320, n] -> linear_2(silu(linear_1(e))) [1024, n]. */
static struct ggml_tensor *est_time_mlp(const est_graph *g, struct ggml_tensor *e) {
    e = cr_linear(g->ctx, e, s3_w(g->w, "est.time_mlp.linear_1.weight"), s3_w(g->w, "est.time_mlp.linear_1.bias"),
                  g->cpu);
    e = ggml_silu(g->ctx, e);
    return cr_linear(g->ctx, e, s3_w(g->w, "est.time_mlp.linear_2.weight"),
                     s3_w(g->w, "est.time_mlp.linear_2.bias"), g->cpu);
}

/* ------------------------------------------------------------------ graph */

struct ggml_tensor *s3_estimator_build(struct ggml_context *ctx, struct ggml_context *w, const s3gen_hparams *hp,
                                       int64_t T, int64_t B, const cr_cpu_ops *cpu_ops, bool ops,
                                       s3_estimator_io *io) {
    const int64_t n_times = hp->meanflow ? 2 : 1;
    io->x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, T, S3_MEL, B);
    io->mu = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, T, S3_MEL, B);
    io->cond = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, T, S3_MEL, B);
    io->spks = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, S3_MEL, B);
    /* sinusoid(t[b]) in column b, meanflow: sinusoid(r[b]) in column B + b */
    io->in[EST_IN_TIME] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, S3_TEMB, n_times * B);
    ggml_set_input(io->x);
    ggml_set_input(io->mu);
    ggml_set_input(io->cond);
    ggml_set_input(io->spks);
    ggml_set_input(io->in[EST_IN_TIME]);

    est_graph g = {.ctx = ctx, .w = w, .cpu = cpu_ops, .ops = ops && !cpu_ops};
    struct ggml_tensor *temb = est_time_mlp(&g, io->in[EST_IN_TIME]); /* [1024, n_times B] */
    if (hp->meanflow) {
        struct ggml_tensor *et = ggml_view_2d(ctx, temb, EST_TIME, B, temb->nb[1], 0);
        struct ggml_tensor *er = ggml_view_2d(ctx, temb, EST_TIME, B, temb->nb[1], (size_t)B * temb->nb[1]);
        temb = cr_linear(ctx, ggml_concat(ctx, et, er, 0), s3_w(w, "est.time_embed_mixer.weight"), NULL, g.cpu);
    }
    g.tm = est_mish(&g, temb); /* every resnet's mlp starts with Mish */

    /* pack([x, mu, spks, cond]) over channels, time fastest [T, 320, B] */
    struct ggml_tensor *spks = ggml_repeat(ctx, ggml_reshape_3d(ctx, io->spks, 1, S3_MEL, B), io->x);
    struct ggml_tensor *h =
        ggml_concat(ctx, ggml_concat(ctx, io->x, io->mu, 1), ggml_concat(ctx, spks, io->cond, 1), 1);
    h = ggml_cont(ctx, ggml_transpose(ctx, h)); /* [320, T, B] */

    h = est_stage(&g, h, "est.down_blocks.0");
    struct ggml_tensor *skip = h;
    h = est_causal_conv(&g, h, "est.down_blocks.0.2");
    char p[GGML_MAX_NAME];
    for (int i = 0; i < EST_MID; i++) {
        est_name(p, "est.mid_blocks.%d", i);
        h = est_stage(&g, h, p);
    }
    h = est_stage(&g, ggml_concat(ctx, h, skip, 0), "est.up_blocks.0"); /* [512, T, B] in */
    h = est_causal_conv(&g, h, "est.up_blocks.0.2");
    h = est_block(&g, h, "est.final_block");
    struct ggml_tensor *fp = s3_w(w, "est.final_proj.weight");
    h = cr_linear(ctx, h, ggml_reshape_2d(ctx, fp, fp->ne[1], fp->ne[2]), s3_w(w, "est.final_proj.bias"), g.cpu);
    return ggml_cont(ctx, ggml_transpose(ctx, h)); /* [T, 80, B] */
}

/*
 * SinusoidalPosEmb(320) of one time, in float32 like the reference:
 * f_i = exp(i * -(ln 10000 / 159)), a_i = (1000 t) f_i, e = [sin a; cos a].
 */
static void est_sinusoid(float t, float *e) {
    const int half = S3_TEMB / 2;
    const float c = (float)(-log(10000.0) / (half - 1)), st = EST_TIME_SCALE * t;
    for (int i = 0; i < half; i++) {
        const float a = st * expf((float)i * c);
        e[i] = sinf(a);
        e[half + i] = cosf(a);
    }
}

void s3_estimator_set_inputs(const s3gen_hparams *hp, int64_t T, int64_t B, const float *t, const float *r,
                             const s3_estimator_io *io) {
    (void)T;
    float e[S3_TEMB];
    const size_t col = sizeof(e);
    for (int64_t b = 0; b < B; b++) {
        est_sinusoid(t[b], e);
        ggml_backend_tensor_set(io->in[EST_IN_TIME], e, (size_t)b * col, col);
        if (hp->meanflow) {
            est_sinusoid(r[b], e);
            ggml_backend_tensor_set(io->in[EST_IN_TIME], e, (size_t)(B + b) * col, col);
        }
    }
}

/* The attention scores [T, T, 8, B] (off the CPU) or the up stage's columns [3 * 512, T, B]. */
int64_t s3_estimator_max_elements(int64_t T, int64_t B) {
    const int64_t scores = T * EST_HEADS, cols = EST_K * 2 * EST_CH;
    return T * B * (scores > cols ? scores : cols);
}
