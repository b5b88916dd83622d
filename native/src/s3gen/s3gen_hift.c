/*
 * s3gen_hift.c: the HiFT vocoder of S3Gen (HiFTGenerator, CosyVoice2 via
 * Chatterbox): the F0 predictor graph, the harmonic source on the host, and
 * the decode graph. Also the components' shared weight lookup s3_w.
 *
 * Inside the graphs activations are F32 [C, T, B], channels fastest: a
 * convolution's product mul_mat(kernel, columns) comes out that way with the
 * (possibly F16) kernel as src0, per-channel parameters broadcast as rows, and
 * the fused CPU Snake expects it. A stride-1 convolution's column matrix comes
 * from codecrt's columns op (ops/ops_cols.c), which reads channels-fastest input
 * and, in the ResBlocks on a device, applies the Snake before each conv as it
 * gathers; ggml's F32 im2col, which reads time-fastest rows, is left to the
 * time-fastest inputs (mel, the source's spectrum) and to graphs without the ops,
 * which transpose first ([C, T, B] -> [T, C, B]). The interface tensors (mel,
 * source, PCM) are time-fastest, as s3gen.h says.
 *
 * Decode of T mel frames (per sequence; 480 samples per frame):
 *   source [480T] -> reflect pad 8 -> frames of 16, hop 4 -> DFT with the Hann
 *     window -> s [18, 120T+1] (real parts of bins 0..8, then imaginary parts)
 *   mel [T, 80] -> conv_pre k7 -> [512, T]
 *   stage i = 0, 1, 2 (rate u = 8, 5, 3; kernel 16, 11, 7; C = 256, 128, 64):
 *     leaky_relu 0.1 -> ConvTranspose(stride u) -> [C, 8T | 40T | 120T]
 *     (last stage: reflection pad (1, 0) -> 120T+1 frames, the STFT's count)
 *     + source_resblocks[i](source_downs[i](s))  (s strided by 15, 3, 1)
 *     -> mean of 3 Snake ResBlocks (kernels 3, 7, 11; dilations 1, 3, 5)
 *   leaky_relu 0.01 -> conv_post k7 -> [18, 120T+1]: magnitude exp (<= 100),
 *     phase sin -> inverse DFT per frame with the window -> overlap-add, trim 8
 *     on both sides, divide by the summed squared window -> clamp +-0.99
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3gen.h"

#define HIFT_BASE 512           /* conv_pre width; stage i has HIFT_BASE >> (i + 1) channels */
#define HIFT_STAGES 3
#define HIFT_KERNELS 3          /* ResBlocks averaged per stage */
#define HIFT_F0_CH 512          /* ConvRNNF0Predictor width */
#define HIFT_F0_LAYERS 5
#define HIFT_BINS (S3_NFFT / 2 + 1)  /* 9 one-sided bins */
#define HIFT_SPEC (2 * HIFT_BINS)    /* 18 channels: real parts, then imaginary parts */
#define HIFT_FRAMES_PER_MEL (S3_MEL_HOP / S3_ISTFT_HOP) /* 120 STFT hops per mel frame */

static const int hift_up_rate[HIFT_STAGES] = {8, 5, 3};
static const int hift_up_kernel[HIFT_STAGES] = {16, 11, 7};
static const int hift_res_kernel[HIFT_KERNELS] = {3, 7, 11};
static const int hift_src_kernel[HIFT_STAGES] = {7, 7, 11};
static const int hift_dilation[3] = {1, 3, 5};

/* io->in[] slots of the decode graph */
enum { HIFT_IN_STFT = 0, HIFT_IN_ISTFT = 1, HIFT_IN_ENVELOPE = 2 };

/* Names were validated at load, so a lookup of a listed tensor cannot miss. */
/* ------------------------------------------------------------ tensor specs */

/* The source branch of stage i is strided by the later stages' rates (15, 3, 1),
   with a kernel of twice that (a 1x1 conv at stride 1). */
static int64_t hift_source_stride(int i) {
    int64_t u = 1;
    for (int k = i + 1; k < HIFT_STAGES; k++) {
        u *= hift_up_rate[k];
    }
    return u;
}

/* The converter's rule: tensors of 2+ dims and >= 4096 elements may be F16. */
static bool hift_mat(int64_t numel) { return numel >= 4096; }

static void hift_conv_spec(cr_spec_list *s, int64_t K, int64_t cin, int64_t cout, const char *name) {
    cr_spec_add3(s, hift_mat(K * cin * cout), K, cin, cout, "%s.weight", name);
    cr_spec_add(s, false, 1, cout, 1, "%s.bias", name);
}

static void hift_resblock_specs(cr_spec_list *s, const char *prefix, int64_t C, int64_t K) {
    for (int j = 0; j < 3; j++) {
        for (int c = 1; c <= 2; c++) {
            cr_spec_add3(s, hift_mat(K * C * C), K, C, C, "%s.convs%d.%d.weight", prefix, c, j);
            cr_spec_add(s, false, 1, C, 1, "%s.convs%d.%d.bias", prefix, c, j);
            cr_spec_add(s, false, 1, C, 1, "%s.activations%d.%d.alpha", prefix, c, j);
        }
    }
}

void s3_hift_specs(const s3gen_hparams *hp, cr_spec_list *s) {
    (void)hp; /* the vocoder is the same in both variants */
    char name[GGML_MAX_NAME];
    cr_spec_add(s, false, 2, S3_HARMONICS, 1, "hift.m_source.l_linear.weight");
    cr_spec_add(s, false, 1, 1, 1, "hift.m_source.l_linear.bias");
    hift_conv_spec(s, 7, S3_MEL, HIFT_BASE, "hift.conv_pre");
    for (int i = 0; i < HIFT_STAGES; i++) {
        const int64_t cin = HIFT_BASE >> i, cout = HIFT_BASE >> (i + 1), K = hift_up_kernel[i];
        /* ConvTranspose1d (Cin, Cout, K): ne [K, Cout, Cin] */
        cr_spec_add3(s, hift_mat(K * cout * cin), K, cout, cin, "hift.ups.%d.weight", i);
        cr_spec_add(s, false, 1, cout, 1, "hift.ups.%d.bias", i);
        snprintf(name, sizeof(name), "hift.source_downs.%d", i);
        const int64_t stride = hift_source_stride(i);
        hift_conv_spec(s, stride > 1 ? 2 * stride : 1, HIFT_SPEC, cout, name);
        snprintf(name, sizeof(name), "hift.source_resblocks.%d", i);
        hift_resblock_specs(s, name, cout, hift_src_kernel[i]);
        for (int j = 0; j < HIFT_KERNELS; j++) {
            snprintf(name, sizeof(name), "hift.resblocks.%d", i * HIFT_KERNELS + j);
            hift_resblock_specs(s, name, cout, hift_res_kernel[j]);
        }
    }
    hift_conv_spec(s, 7, HIFT_BASE >> HIFT_STAGES, HIFT_SPEC, "hift.conv_post");
    for (int l = 0; l < HIFT_F0_LAYERS; l++) {
        snprintf(name, sizeof(name), "hift.f0_predictor.condnet.%d", 2 * l);
        hift_conv_spec(s, 3, l == 0 ? S3_MEL : HIFT_F0_CH, HIFT_F0_CH, name);
    }
    cr_spec_add(s, false, 2, HIFT_F0_CH, 1, "hift.f0_predictor.classifier.weight");
    cr_spec_add(s, false, 1, 1, 1, "hift.f0_predictor.classifier.bias");
}

/* ----------------------------------------------------------- graph pieces */

/* [C, T, B] <-> [T, C, B] */
static struct ggml_tensor *hift_transpose(struct ggml_context *ctx, struct ggml_tensor *x) {
    return ggml_cont(ctx, ggml_transpose(ctx, x));
}

/*
 * Conv1d of a time-fastest xt [T, Cin, B] with w ne [K, Cin, Cout] (PyTorch
 * (Cout, Cin, K)) and b [Cout] -> [Cout, T_out, B]. The im2col rows are
 * ic*K + k, the order of the kernel flattened to [K*Cin, Cout].
 */
static struct ggml_tensor *hift_conv_t(struct ggml_context *ctx, struct ggml_tensor *xt, struct ggml_tensor *w,
                                       struct ggml_tensor *b, int stride, int pad, int dilation, const cr_cpu_ops *cpu_ops) {
    const int64_t K = w->ne[0], cin = w->ne[1], cout = w->ne[2];
    struct ggml_tensor *cols = ggml_im2col(ctx, w, xt, stride, 0, pad, 0, dilation, 0, false, GGML_TYPE_F32);
    return cr_linear(ctx, cols, ggml_reshape_2d(ctx, w, K * cin, cout), b, cpu_ops);
}

/* 1/(alpha + 1e-9), the Snake's factor, taken as the reference takes it: the reciprocal
   first, then multiplied. A C-element op, so computed here rather than stored. */
static struct ggml_tensor *hift_snake_inv(struct ggml_context *ctx, struct ggml_tensor *alpha) {
    struct ggml_tensor *one = ggml_scale_bias(ctx, alpha, 0.0f, 1.0f);
    return ggml_div(ctx, one, ggml_scale_bias(ctx, alpha, 1.0f, 1e-9f));
}

/* Snake x + inv * sin(alpha x)^2 per channel, x [C, T, B], inv = hift_snake_inv(alpha). */
static struct ggml_tensor *hift_snake(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *alpha,
                                      struct ggml_tensor *inv, const cr_cpu_ops *cpu_ops) {
    if (cpu_ops) {
        return cr_snake_cpu(ctx, x, alpha, inv);
    }
    struct ggml_tensor *y = ggml_sqr(ctx, ggml_sin(ctx, ggml_mul(ctx, x, alpha)));
    return ggml_add(ctx, x, ggml_mul(ctx, y, inv));
}

/*
 * Stride-1 "same" Conv1d of a channels-fastest x [Cin, T, B] -> [Cout, T, B], after a
 * Snake with alpha where alpha is given. ops (codecrt's device ops, or their C functions in
 * the portable graphs): the columns op gathers the columns through the Snake, one pass
 * where the composed Snake takes five; on the CPU backend the fused convolution (AVX-512
 * CPUs) or the columns op's C function, and a product; elsewhere transpose + im2col.
 */
static struct ggml_tensor *hift_conv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                     struct ggml_tensor *b, int dilation, struct ggml_tensor *alpha,
                                     const cr_cpu_ops *cpu_ops, bool ops) {
    const int64_t K = w->ne[0], cin = w->ne[1], cout = w->ne[2];
    const int pad = dilation * (int)(K - 1) / 2;
    struct ggml_tensor *w2 = ggml_reshape_2d(ctx, w, K * cin, cout); /* [K Cin, Cout], row c K + k */
    struct ggml_tensor *inv = alpha ? hift_snake_inv(ctx, alpha) : NULL;
    if (ops && !cpu_ops) {
        struct ggml_tensor *cols = cr_cols(ctx, x, alpha, inv, (int)K, dilation, pad, pad);
        if (cols) {
            return cr_linear(ctx, cols, w2, b, NULL);
        }
    }
    if (alpha) {
        x = hift_snake(ctx, x, alpha, inv, cpu_ops);
    }
    struct ggml_tensor *y = cpu_ops ? cr_conv1d_cpu(ctx, x, w, b, dilation, pad, pad, cpu_ops) : NULL;
    if (y) { /* AVX-512 CPUs: no column matrix */
        return y;
    }
    struct ggml_tensor *cols = cpu_ops ? cr_cols(ctx, x, NULL, NULL, (int)K, dilation, pad, pad) : NULL;
    if (cols) {
        return cr_linear(ctx, cols, w2, b, cpu_ops);
    }
    return hift_conv_t(ctx, hift_transpose(ctx, x), w, b, 1, pad, dilation, cpu_ops);
}

/* HiFiGAN ResBlock with Snakes: for each dilation d, x += conv(Snake(conv_d(Snake(x)))). x [C, T, B]. */
static struct ggml_tensor *hift_resblock(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                         const char *prefix, const cr_cpu_ops *cpu_ops, bool ops) {
    for (int j = 0; j < 3; j++) {
        struct ggml_tensor *y =
            hift_conv(ctx, x, s3_w(w, "%s.convs1.%d.weight", prefix, j), s3_w(w, "%s.convs1.%d.bias", prefix, j),
                      hift_dilation[j], s3_w(w, "%s.activations1.%d.alpha", prefix, j), cpu_ops, ops);
        y = hift_conv(ctx, y, s3_w(w, "%s.convs2.%d.weight", prefix, j), s3_w(w, "%s.convs2.%d.bias", prefix, j), 1,
                      s3_w(w, "%s.activations2.%d.alpha", prefix, j), cpu_ops, ops);
        x = ggml_add(ctx, y, x);
    }
    return x;
}

/*
 * ConvTranspose1d(stride u, padding p) of x [Cin, L, B] with w ne [K, Cout, Cin]
 * (PyTorch (Cin, Cout, K)) -> time-fastest [L*u + pad_left, Cout, B], bias not
 * added. The product with the kernel transposed to [Cin, K*Cout] gives the
 * columns (oc*K + k, t) that col2im overlap-adds and crops by p on both sides
 * (K - 2p = u here, so L*u samples). The kernel transpose is a copy per
 * compute (2M elements at most), cheaper than any layout change of x.
 * col2im takes matrices, so the batch runs one sequence at a time.
 */
static struct ggml_tensor *hift_upconv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                       int u, int p, int pad_left, const cr_cpu_ops *cpu_ops) {
    const int64_t K = w->ne[0], cout = w->ne[1], cin = w->ne[2], L = x->ne[1], B = x->ne[2];
    struct ggml_tensor *wt = hift_transpose(ctx, ggml_reshape_2d(ctx, w, K * cout, cin)); /* [Cin, K*Cout] */
    struct ggml_tensor *cols = cr_linear(ctx, x, wt, NULL, cpu_ops);                      /* [K*Cout, L, B] */
    struct ggml_tensor *y = NULL;
    for (int64_t b = 0; b < B; b++) {
        struct ggml_tensor *cb = ggml_view_2d(ctx, cols, K * cout, L, cols->nb[1], (size_t)b * cols->nb[2]);
        struct ggml_tensor *yb = ggml_col2im_1d(ctx, cb, u, (int)cout, p); /* [L*u, Cout] */
        if (pad_left > 0) {
            yb = ggml_pad_reflect_1d(ctx, yb, pad_left, 0);
        }
        y = y ? ggml_concat(ctx, y, yb, 2) : yb;
    }
    return y;
}

/* The source branch of stage i: s [18, F, B], st its transpose -> [C_i, L_i, B]. */
static struct ggml_tensor *hift_source_branch(struct ggml_context *ctx, struct ggml_context *w,
                                              struct ggml_tensor *s, struct ggml_tensor *st, int i,
                                              const cr_cpu_ops *cpu_ops, bool ops) {
    struct ggml_tensor *wd = s3_w(w, "hift.source_downs.%d.weight", i), *bd = s3_w(w, "hift.source_downs.%d.bias", i);
    struct ggml_tensor *y;
    if (wd->ne[0] == 1) { /* 1x1: a plain product on the channels-fastest spectrum */
        y = cr_linear(ctx, s, ggml_reshape_2d(ctx, wd, wd->ne[1], wd->ne[2]), bd, cpu_ops);
    } else { /* kernel 2u, stride u, padding u/2: 120T+1 frames -> 120T/u */
        const int u = (int)(wd->ne[0] / 2);
        y = hift_conv_t(ctx, st, wd, bd, u, u / 2, 1, cpu_ops);
    }
    char prefix[GGML_MAX_NAME];
    snprintf(prefix, sizeof(prefix), "hift.source_resblocks.%d", i);
    return hift_resblock(ctx, w, y, prefix, cpu_ops, ops);
}

static struct ggml_tensor *hift_input(struct ggml_context *ctx, int64_t ne0, int64_t ne1, int64_t ne2,
                                      const char *name) {
    struct ggml_tensor *t = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ne0, ne1, ne2);
    ggml_set_name(t, name);
    ggml_set_input(t);
    return t;
}

/* -------------------------------------------------------------- F0 graph */

struct ggml_tensor *s3_f0_build(struct ggml_context *ctx, struct ggml_context *w, const s3gen_hparams *hp,
                                int64_t T, int64_t B, bool ops, s3_f0_io *io) {
    (void)hp;
    io->mel = hift_input(ctx, T, S3_MEL, B, "hift.f0.mel");
    /* 5 x (conv k3 pad 1 + ELU) -> [512, T, B] */
    struct ggml_tensor *x = hift_conv_t(ctx, io->mel, s3_w(w, "hift.f0_predictor.condnet.0.weight"),
                                        s3_w(w, "hift.f0_predictor.condnet.0.bias"), 1, 1, 1, false);
    x = ggml_elu(ctx, x);
    for (int l = 1; l < HIFT_F0_LAYERS; l++) {
        x = hift_conv(ctx, x, s3_w(w, "hift.f0_predictor.condnet.%d.weight", 2 * l),
                      s3_w(w, "hift.f0_predictor.condnet.%d.bias", 2 * l), 1, NULL, NULL, ops);
        x = ggml_elu(ctx, x);
    }
    /* |Linear 512 -> 1| per frame: [1, T, B] -> f0 [T, B] */
    x = ggml_mul_mat(ctx, s3_w(w, "hift.f0_predictor.classifier.weight"), x);
    x = ggml_add(ctx, x, s3_w(w, "hift.f0_predictor.classifier.bias"));
    return ggml_abs(ctx, ggml_reshape_2d(ctx, x, T, B));
}

/* ------------------------------------------------------------ host source */

void s3_source_weights(struct ggml_context *w, float lw[S3_HARMONICS], float *lb) {
    ggml_backend_tensor_get(s3_w(w, "hift.m_source.l_linear.weight"), lw, 0, sizeof(float) * S3_HARMONICS);
    ggml_backend_tensor_get(s3_w(w, "hift.m_source.l_linear.bias"), lb, 0, sizeof(float));
}

void s3_source_term(const float *f0, int64_t T, int h, float phase, float lw_h, float *term) {
    const int64_t N = T * S3_MEL_HOP;
    /*
     * Every step below is one float32 operation of the reference, one per
     * statement so that no compiler fuses two into an FMA: the phase of the
     * 9th harmonic after seconds of audio is a large cumulative sum, and torch
     * accumulates it in double, rounding each partial sum to float, before the
     * float remainder and the float product by (float)(2 pi).
     * nn.Upsample(nearest) reads frame floor(i * (float)(1/480)).
     */
    const float up_scale = (float)(1.0 / S3_MEL_HOP);
    const float two_pi = (float)(2.0 * S3_PI);
    const float rate = (float)S3_SAMPLE_RATE;
    const float mult = (float)(h + 1);
    double acc = 0.0;
    for (int64_t i = 0; i < N; i++) {
        const float pos = (float)i * up_scale;
        int64_t k = (int64_t)floorf(pos);
        k = k < T - 1 ? k : T - 1;
        const float f = f0[k];
        const float fh = f * mult;
        const float inc = fh / rate;
        acc += (double)inc;
        const float cum = (float)acc;
        float frac = fmodf(cum, 1.0f);
        if (frac < 0.0f) { /* torch.remainder takes the divisor's sign */
            frac += 1.0f;
        }
        const float theta = two_pi * frac;
        const float arg = theta + phase;
        const float sine = 0.1f * sinf(arg);
        /* SineGen: voiced above 10 Hz; noise std 0.003 voiced, 0.1/3 unvoiced */
        const float uv = f > 10.0f ? 1.0f : 0.0f;
        const float amp_v = uv * 0.003f;
        const float amp_u = ((1.0f - uv) * 0.1f) / 3.0f;
        const float amp = amp_v + amp_u;
        const float n = amp * term[i]; /* the noise sample, overwritten by the term */
        const float voiced = sine * uv;
        const float e = voiced + n;
        term[i] = lw_h * e; /* l_linear (9 -> 1): this harmonic's part */
    }
}

void s3_source_combine(const float *terms, int64_t N, float lb, float *source) {
    /* the harmonics accumulated in order, as l_linear's sum */
    for (int64_t i = 0; i < N; i++) {
        source[i] = terms[i];
    }
    for (int h = 1; h < S3_HARMONICS; h++) {
        const float *t = terms + (size_t)h * (size_t)N;
        for (int64_t i = 0; i < N; i++) {
            source[i] = source[i] + t[i];
        }
    }
    for (int64_t i = 0; i < N; i++) {
        source[i] = tanhf(source[i] + lb);
    }
}

bool s3_source_host(struct ggml_context *w, const float *f0, int64_t T, const float *phases, const float *noise,
                    float *source) {
    const int64_t N = T * S3_MEL_HOP;
    float lw[S3_HARMONICS], lb;
    float *terms = malloc(sizeof(float) * (size_t)N * S3_HARMONICS);
    if (!terms) {
        return false;
    }
    s3_source_weights(w, lw, &lb);
    memcpy(terms, noise, sizeof(float) * (size_t)N * S3_HARMONICS);
    for (int h = 0; h < S3_HARMONICS; h++) {
        s3_source_term(f0, T, h, phases[h], lw[h], terms + (size_t)h * (size_t)N);
    }
    s3_source_combine(terms, N, lb, source);
    free(terms);
    return true;
}

/* ----------------------------------------------------------- decode graph */

struct ggml_tensor *s3_hift_build(struct ggml_context *ctx, struct ggml_context *w, const s3gen_hparams *hp,
                                  int64_t T, int64_t B, const cr_cpu_ops *cpu_ops, bool ops, s3_hift_io *io) {
    (void)hp;
    const int64_t N = T * S3_MEL_HOP, F = T * HIFT_FRAMES_PER_MEL + 1;
    io->mel = hift_input(ctx, T, S3_MEL, B, "hift.mel");
    io->source = hift_input(ctx, N, B, 1, "hift.source");
    struct ggml_tensor *basis = io->in[HIFT_IN_STFT] = hift_input(ctx, S3_NFFT, HIFT_SPEC, 1, "hift.stft_basis");
    struct ggml_tensor *ibasis = io->in[HIFT_IN_ISTFT] = hift_input(ctx, HIFT_SPEC, S3_NFFT, 1, "hift.istft_basis");
    struct ggml_tensor *env = io->in[HIFT_IN_ENVELOPE] = hift_input(ctx, N, 1, 1, "hift.istft_envelope");

    /* STFT of the source: reflect pad n_fft/2, frames [16, F, B], DFT -> s [18, F, B] */
    struct ggml_tensor *sp = ggml_pad_reflect_1d(ctx, io->source, S3_NFFT / 2, S3_NFFT / 2);
    sp = ggml_reshape_3d(ctx, sp, N + S3_NFFT, 1, B);
    struct ggml_tensor *k16 = ggml_view_2d(ctx, basis, S3_NFFT, 1, basis->nb[1], 0); /* im2col reads only its shape */
    struct ggml_tensor *frames = ggml_im2col(ctx, k16, sp, S3_ISTFT_HOP, 0, 0, 0, 1, 0, false, GGML_TYPE_F32);
    struct ggml_tensor *s = ggml_mul_mat(ctx, basis, frames); /* [18, F, B] */
    struct ggml_tensor *st = hift_transpose(ctx, s);          /* [F, 18, B] */

    struct ggml_tensor *x = hift_conv_t(ctx, io->mel, s3_w(w, "hift.conv_pre.weight"), s3_w(w, "hift.conv_pre.bias"),
                                        1, 3, 1, cpu_ops); /* [512, T, B] */
    for (int i = 0; i < HIFT_STAGES; i++) {
        const int u = hift_up_rate[i], last = i + 1 == HIFT_STAGES;
        x = ggml_leaky_relu(ctx, x, 0.1f, false);
        x = hift_upconv(ctx, x, s3_w(w, "hift.ups.%d.weight", i), u, (hift_up_kernel[i] - u) / 2, last ? 1 : 0,
                        cpu_ops);
        x = ggml_add(ctx, hift_transpose(ctx, x), s3_w(w, "hift.ups.%d.bias", i)); /* [C_i, L_i, B] */
        x = ggml_add(ctx, x, hift_source_branch(ctx, w, s, st, i, cpu_ops, ops));
        struct ggml_tensor *xs = NULL;
        for (int j = 0; j < HIFT_KERNELS; j++) {
            char prefix[GGML_MAX_NAME];
            snprintf(prefix, sizeof(prefix), "hift.resblocks.%d", i * HIFT_KERNELS + j);
            struct ggml_tensor *r = hift_resblock(ctx, w, x, prefix, cpu_ops, ops);
            xs = xs ? ggml_add(ctx, xs, r) : r;
        }
        x = ggml_scale(ctx, xs, 1.0f / HIFT_KERNELS);
    }
    /* F.leaky_relu with its default slope, then the 18 spectrum channels [18, F, B] */
    x = ggml_leaky_relu(ctx, x, 0.01f, false);
    x = hift_conv(ctx, x, s3_w(w, "hift.conv_post.weight"), s3_w(w, "hift.conv_post.bias"), 1, NULL, cpu_ops, ops);

    /* magnitude exp(x[0:9]) clipped at 100, phase sin(x[9:18]) -> real, imaginary parts */
    const size_t half = HIFT_BINS * sizeof(float);
    struct ggml_tensor *mag = ggml_cont(ctx, ggml_view_3d(ctx, x, HIFT_BINS, F, B, x->nb[1], x->nb[2], 0));
    struct ggml_tensor *phs = ggml_cont(ctx, ggml_view_3d(ctx, x, HIFT_BINS, F, B, x->nb[1], x->nb[2], half));
    mag = ggml_clamp(ctx, ggml_exp(ctx, mag), 0.0f, 100.0f);
    phs = ggml_sin(ctx, phs);
    struct ggml_tensor *re = ggml_mul(ctx, mag, ggml_cos(ctx, phs));
    struct ggml_tensor *im = ggml_mul(ctx, mag, ggml_sin(ctx, phs));
    struct ggml_tensor *spec = ggml_concat(ctx, re, im, 0);       /* [18, F, B] */
    struct ggml_tensor *wf = ggml_mul_mat(ctx, ibasis, spec);     /* windowed frames [16, F, B] */

    /* overlap-add with hop 4, trimming n_fft/2 on both sides: 4(F-1) = N samples */
    struct ggml_tensor *y = NULL;
    for (int64_t b = 0; b < B; b++) {
        struct ggml_tensor *fb = ggml_view_2d(ctx, wf, S3_NFFT, F, wf->nb[1], (size_t)b * wf->nb[2]);
        struct ggml_tensor *yb = ggml_col2im_1d(ctx, fb, S3_ISTFT_HOP, 1, S3_NFFT / 2); /* [N, 1] */
        y = y ? ggml_concat(ctx, y, yb, 1) : yb;
    }
    y = ggml_div(ctx, y, ggml_reshape_2d(ctx, env, N, 1)); /* [N, B] */
    return ggml_clamp(ctx, y, -0.99f, 0.99f);
}

/* --------------------------------------------------------- decode inputs */

/* scipy's periodic Hann window of n_fft points, cast to float32 like the reference's. */
static float hift_window(int n) { return (float)(0.5 - 0.5 * cos(2.0 * S3_PI * n / S3_NFFT)); }

/* cos and sin of 2 pi k / n_fft, exact at multiples of pi/2 (the real-only DC and Nyquist bins) */
static void hift_twiddle(int k, double *c, double *s) {
    k %= S3_NFFT;
    if (k % (S3_NFFT / 4) == 0) {
        static const double cs[4][2] = {{1, 0}, {0, 1}, {-1, 0}, {0, -1}};
        *c = cs[k / (S3_NFFT / 4)][0];
        *s = cs[k / (S3_NFFT / 4)][1];
        return;
    }
    *c = cos(2.0 * S3_PI * k / S3_NFFT);
    *s = sin(2.0 * S3_PI * k / S3_NFFT);
}

void s3_hift_set_inputs(const s3gen_hparams *hp, int64_t T, int64_t B, const s3_hift_io *io) {
    (void)hp;
    (void)B;
    float win[S3_NFFT];
    for (int n = 0; n < S3_NFFT; n++) {
        win[n] = hift_window(n);
    }
    /* STFT [16, 18]: row n, column f: w[n] cos(2 pi f n / 16); column 9 + f: -w[n] sin(...) */
    float fwd[HIFT_SPEC * S3_NFFT];
    /* inverse [18, 16]: irfft (1/16, bins 1..7 twice, imaginary parts of bins 0 and 8 ignored)
       times the window, so one product gives the windowed frame */
    float inv[HIFT_SPEC * S3_NFFT];
    for (int n = 0; n < S3_NFFT; n++) {
        for (int f = 0; f < HIFT_BINS; f++) {
            double c, sn;
            hift_twiddle(f * n, &c, &sn);
            const double a = (f == 0 || f == S3_NFFT / 2) ? 1.0 : 2.0;
            fwd[n + S3_NFFT * f] = (float)(win[n] * c);
            fwd[n + S3_NFFT * (HIFT_BINS + f)] = (float)(-win[n] * sn);
            inv[f + HIFT_SPEC * n] = (float)(win[n] * a * c / S3_NFFT);
            inv[HIFT_BINS + f + HIFT_SPEC * n] = (float)(-win[n] * a * sn / S3_NFFT);
        }
    }
    ggml_backend_tensor_set(io->in[HIFT_IN_STFT], fwd, 0, sizeof(fwd));
    ggml_backend_tensor_set(io->in[HIFT_IN_ISTFT], inv, 0, sizeof(inv));

    /*
     * torch.istft's window envelope: sum over the frames covering a sample of
     * w^2 (float), added in order of increasing window index as its col2im
     * does. Sample t of the output is t + n_fft/2 of the overlap-add; frames
     * j = 0..F-1 start at 4j. Filled in chunks (the tensor is N floats).
     */
    const int64_t N = T * S3_MEL_HOP, F = T * HIFT_FRAMES_PER_MEL + 1;
    float w2[S3_NFFT];
    for (int n = 0; n < S3_NFFT; n++) {
        w2[n] = win[n] * win[n];
    }
    float chunk[1024];
    for (int64_t t0 = 0; t0 < N; t0 += 1024) {
        const int64_t len = N - t0 < 1024 ? N - t0 : 1024;
        for (int64_t i = 0; i < len; i++) {
            const int64_t p = t0 + i + S3_NFFT / 2;
            float e = 0.0f;
            for (int64_t n = p % S3_ISTFT_HOP; n < S3_NFFT; n += S3_ISTFT_HOP) {
                const int64_t j = (p - n) / S3_ISTFT_HOP;
                if (j >= 0 && j < F) {
                    e += w2[n];
                }
            }
            chunk[i] = e;
        }
        ggml_backend_tensor_set(io->in[HIFT_IN_ENVELOPE], chunk, (size_t)t0 * sizeof(float),
                                (size_t)len * sizeof(float));
    }
}

int64_t s3_hift_max_elements(int64_t T, int64_t B) {
    /* the largest tensor is the im2col of the last stage's kernel-11 convolutions
       (64 channels x 11 taps x 120T+1 frames); for very short inputs, the first
       upsampling kernel's transpose (512 x 16*256) */
    const int64_t cols = (int64_t)(HIFT_BASE >> HIFT_STAGES) * 11 * (T * HIFT_FRAMES_PER_MEL + 1) * B;
    const int64_t wt = (int64_t)HIFT_BASE * hift_up_kernel[0] * (HIFT_BASE >> 1);
    return cols > wt ? cols : wt;
}
