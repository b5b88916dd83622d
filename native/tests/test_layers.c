/*
 * test_layers.c: each shared layer (native/src/layers.h) computed on the CPU
 * against a plain C reference in double written from its definition (PyTorch
 * semantics), on a few shapes each: batch 1 and 3, odd lengths, dilations,
 * "same", valid, causal and asymmetric padding, both activation layouts, and
 * both CPU paths (fused kernels and the portable ggml ops that GPUs run).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "layers.h"
#include "test_common.h"

#define TOL 2e-5 /* F32 against double: relative to the output's largest magnitude */

static unsigned g_seed = 12345u;

static float uni(void) { /* uniform [-1, 1) */
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)((g_seed >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

static struct ggml_context *new_ctx(void) {
    struct ggml_init_params ip = {.mem_size = (size_t)64 << 20, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(ip);
    CHECK(ctx != NULL, "ggml_init");
    return ctx;
}

/* A tensor of random values in [lo, lo + 2*amp). */
static struct ggml_tensor *rnd(struct ggml_context *ctx, int64_t ne0, int64_t ne1, int64_t ne2, float amp, float lo) {
    struct ggml_tensor *t = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ne0, ne1, ne2);
    float *d = (float *)t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++) {
        d[i] = lo + amp * (uni() + 1.0f);
    }
    return t;
}

static struct ggml_tensor *rnd1(struct ggml_context *ctx, int64_t n) { return rnd(ctx, n, 1, 1, 1.0f, -1.0f); }

static const float *F(const struct ggml_tensor *t) { return (const float *)t->data; }

/* Compute y (made contiguous) in its own graph; gf may already hold nodes. */
static const float *compute(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor **y) {
    if (!ggml_is_contiguous(*y)) {
        *y = ggml_cont(ctx, *y);
    }
    ggml_build_forward_expand(gf, *y);
    CHECK(ggml_graph_compute_with_ctx(ctx, gf, 2) == GGML_STATUS_SUCCESS, "compute");
    return F(*y);
}

/* got against ref (n values, ne of the result checked by the caller). */
static void compare(const char *what, const float *got, const double *ref, int64_t n) {
    double mx = 0.0, err = 0.0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(ref[i]));
        err = fmax(err, fabs((double)got[i] - ref[i]));
        bad |= !isfinite(got[i]);
    }
    CHECK(!bad && err <= TOL * fmax(mx, 1e-3), "%s: max error %.3g of max |ref| %.3g", what, err, mx);
}

/* got against another implementation's floats (ggml's ops), by compare's rule. */
static void compare_f32(const char *what, const float *got, const float *want, int64_t n) {
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        ref[i] = want[i];
    }
    compare(what, got, ref, n);
    free(ref);
}

static void check_shape(const char *what, const struct ggml_tensor *y, int64_t ne0, int64_t ne1, int64_t ne2) {
    CHECK(y->ne[0] == ne0 && y->ne[1] == ne1 && y->ne[2] == ne2 && y->ne[3] == 1,
          "%s: shape [%lld, %lld, %lld, %lld], want [%lld, %lld, %lld]", what, (long long)y->ne[0],
          (long long)y->ne[1], (long long)y->ne[2], (long long)y->ne[3], (long long)ne0, (long long)ne1,
          (long long)ne2);
}

static struct ggml_cgraph *graph(struct ggml_context *ctx) { return ggml_new_graph_custom(ctx, 4096, false); }

/* ------------------------------------------------------------ references */

/* x [C, T, B] at (c, t, b), 0 outside [0, T). */
static double at(const float *x, int64_t C, int64_t T, int64_t c, int64_t t, int64_t b) {
    return t < 0 || t >= T ? 0.0 : (double)x[c + C * (t + T * b)];
}

static double snake_ref(double x, double a, double inv) {
    const double s = sin(a * x);
    return x + inv * s * s;
}

/* Depthwise conv: w [C, K] (tap k of c at c + k*C). */
static void dwconv_ref(double *y, const float *x, const float *w, const float *bias, int64_t C, int64_t T, int64_t B,
                       int64_t K, int d, int pl, int64_t To) {
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < To; t++) {
            for (int64_t c = 0; c < C; c++) {
                double acc = bias ? bias[c] : 0.0;
                for (int64_t k = 0; k < K; k++) {
                    acc += (double)w[c + k * C] * at(x, C, T, c, t + k * d - pl, b);
                }
                y[c + C * (t + To * b)] = acc;
            }
        }
    }
}

/* Pointwise conv / linear: w [Cin, Cout] (ggml ne), y [Cout, N]. */
static void pw_ref(double *y, const double *x, const float *w, const float *bias, int64_t Cin, int64_t Cout,
                   int64_t N) {
    for (int64_t n = 0; n < N; n++) {
        for (int64_t o = 0; o < Cout; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int64_t i = 0; i < Cin; i++) {
                acc += (double)w[i + Cin * o] * x[i + Cin * n];
            }
            y[o + Cout * n] = acc;
        }
    }
}

static double *dup_d(const float *x, int64_t n) {
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        d[i] = x[i];
    }
    return d;
}

/* -------------------------------------------------------------- products */

static void test_products(void) {
    /* {9, 5, 2} and {4, 4, 1}: 10 and 4 columns, which cr_mm pads on a device */
    const int64_t shapes[][3] = {{5, 7, 3}, {13, 1, 1}, {8, 16, 3}, {9, 5, 2}, {4, 4, 1}};
    for (int s = 0; s < 5; s++) {
        const int64_t K = shapes[s][0], T = shapes[s][1], B = shapes[s][2];
        for (int M = 6; M <= 32; M += 26) { /* 6: never fused; 32: fused where AVX-512 is */
            for (int mode = 0; mode < 5; mode++) {
                struct ggml_context *ctx = new_ctx();
                struct ggml_tensor *x = rnd(ctx, K, T, B, 1.0f, -1.0f), *w = rnd(ctx, K, M, 1, 1.0f, -1.0f);
                struct ggml_tensor *b = mode == 1 || mode == 4 ? NULL : rnd1(ctx, M);
                const cr_cpu_ops ops = {.bf16 = false, .packs = NULL};
                struct ggml_tensor *y = mode == 0   ? cr_pwconv(ctx, x, w, b)
                                        : mode == 1 ? cr_mm(ctx, w, x)
                                        : mode == 2 ? cr_linear(ctx, x, w, b, NULL)
                                        : mode == 3 ? cr_linear(ctx, x, w, b, &ops)
                                                    : cr_mm_padded(ctx, w, x);
                check_shape("product", y, M, T, B);
                const float *got = compute(ctx, graph(ctx), &y);
                double *xd = dup_d(F(x), K * T * B), *ref = malloc(sizeof(double) * (size_t)(M * T * B));
                pw_ref(ref, xd, F(w), b ? F(b) : NULL, K, M, T * B);
                char what[64];
                snprintf(what, sizeof(what), "product mode %d K %lld M %d T %lld B %lld", mode, (long long)K, M,
                         (long long)T, (long long)B);
                compare(what, got, ref, M * T * B);
                free(xd);
                free(ref);
                ggml_free(ctx);
            }
        }
    }
}

/* --------------------------------------------------------------- layouts */

static void test_layouts(void) {
    const int64_t C = 5, T = 7, B = 3;
    for (int cpu = 0; cpu < 2; cpu++) { /* the pad: ggml's (any backend), fill then set (the CPU's) */
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *x = rnd(ctx, C, T, B, 1.0f, -1.0f);
        struct ggml_tensor *t = cr_to_tf(ctx, x);
        CHECK(t->ne[0] == T * B && t->ne[1] == C && ggml_is_contiguous(t), "to_tf shape");
        struct ggml_tensor *back = cr_to_cf(ctx, t, T, B);
        check_shape("to_cf", back, C, T, B);
        struct ggml_tensor *pad = cr_pad_frames(ctx, x, 2, 3, cpu);
        check_shape("pad_frames", pad, C, T + 5, B);
        struct ggml_cgraph *gf = graph(ctx);
        ggml_build_forward_expand(gf, back);
        const float *gp = compute(ctx, gf, &pad);
        int bad_t = 0, bad_b = 0, bad_p = 0;
        for (int64_t b = 0; b < B; b++) {
            for (int64_t i = 0; i < T; i++) {
                for (int64_t c = 0; c < C; c++) {
                    const float v = F(x)[c + C * (i + T * b)];
                    bad_t += F(t)[(i + T * b) + T * B * c] != v;
                    bad_b += F(back)[c + C * (i + T * b)] != v;
                }
            }
            for (int64_t i = 0; i < T + 5; i++) {
                for (int64_t c = 0; c < C; c++) {
                    bad_p += gp[c + C * (i + (T + 5) * b)] != (float)at(F(x), C, T, c, i - 2, b);
                }
            }
        }
        CHECK(!bad_t && !bad_b && !bad_p, "layouts (cpu pad %d): %d to_tf, %d to_cf, %d pad values wrong", cpu,
              bad_t, bad_b, bad_p);
        ggml_free(ctx);
    }
}

/* ----------------------------------------------------------------- Snake */

static void test_snake(void) {
    const int64_t C = 6, T = 9, B = 3;
    for (int path = 0; path < 3; path++) { /* fused CPU, composed [C,T,B], composed time fastest */
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *x = rnd(ctx, C, T, B, 3.0f, -3.0f), *a = rnd(ctx, C, 1, 1, 0.5f, 0.3f);
        struct ggml_tensor *ia = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, C);
        for (int64_t c = 0; c < C; c++) {
            ((float *)ia->data)[c] = 1.0f / (F(a)[c] + 1e-9f);
        }
        struct ggml_cgraph *gf = graph(ctx);
        struct ggml_tensor *y;
        if (path < 2) {
            y = cr_snake(ctx, gf, x, a, ia, path == 0);
        } else {
            y = cr_to_cf(ctx, cr_snake_tf(ctx, gf, cr_to_tf(ctx, x), a, ia), T, B);
        }
        check_shape("snake", y, C, T, B);
        const float *got = compute(ctx, gf, &y);
        double *ref = malloc(sizeof(double) * (size_t)(C * T * B));
        for (int64_t i = 0; i < C * T * B; i++) {
            ref[i] = snake_ref(F(x)[i], F(a)[i % C], F(ia)[i % C]);
        }
        char what[32];
        snprintf(what, sizeof(what), "snake path %d", path);
        compare(what, got, ref, C * T * B);
        free(ref);
        ggml_free(ctx);
    }
}

/* ----------------------------------------------------------------- norms */

static void test_norms(void) {
    const int64_t C = 12, T = 7, B = 3;
    const float eps = 1e-5f;
    for (int kind = 0; kind < 5; kind++) { /* layer, rms, group 4, group 12, group 1 */
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *x = rnd(ctx, C, T, B, 2.0f, -1.5f), *g = rnd1(ctx, C), *b = rnd1(ctx, C);
        const int G = kind == 2 ? 4 : kind == 3 ? 12 : 1;
        struct ggml_tensor *y = kind == 0   ? cr_layer_norm(ctx, x, g, b, eps)
                                : kind == 1 ? cr_rms_norm(ctx, x, g, eps)
                                            : cr_group_norm(ctx, x, G, g, b, eps);
        check_shape("norm", y, C, T, B);
        const float *got = compute(ctx, graph(ctx), &y);
        double *ref = malloc(sizeof(double) * (size_t)(C * T * B));
        const float *xd = F(x);
        if (kind < 2) {
            for (int64_t n = 0; n < T * B; n++) {
                double mean = 0.0, var = 0.0;
                for (int64_t c = 0; c < C; c++) {
                    mean += xd[c + C * n] / (double)C;
                }
                if (kind == 1) {
                    mean = 0.0;
                }
                for (int64_t c = 0; c < C; c++) {
                    var += (xd[c + C * n] - mean) * (xd[c + C * n] - mean) / (double)C;
                }
                for (int64_t c = 0; c < C; c++) {
                    const double v = (xd[c + C * n] - mean) / sqrt(var + eps) * F(g)[c];
                    ref[c + C * n] = kind == 0 ? v + F(b)[c] : v;
                }
            }
        } else {
            const int64_t per = C / G;
            for (int64_t bb = 0; bb < B; bb++) {
                for (int64_t gi = 0; gi < G; gi++) {
                    double mean = 0.0, var = 0.0;
                    for (int64_t t = 0; t < T; t++) {
                        for (int64_t c = gi * per; c < (gi + 1) * per; c++) {
                            mean += xd[c + C * (t + T * bb)] / (double)(per * T);
                        }
                    }
                    for (int64_t t = 0; t < T; t++) {
                        for (int64_t c = gi * per; c < (gi + 1) * per; c++) {
                            const double dv = xd[c + C * (t + T * bb)] - mean;
                            var += dv * dv / (double)(per * T);
                        }
                    }
                    for (int64_t t = 0; t < T; t++) {
                        for (int64_t c = gi * per; c < (gi + 1) * per; c++) {
                            const int64_t i = c + C * (t + T * bb);
                            ref[i] = (xd[i] - mean) / sqrt(var + eps) * F(g)[c] + F(b)[c];
                        }
                    }
                }
            }
        }
        char what[32];
        snprintf(what, sizeof(what), "norm kind %d", kind);
        compare(what, got, ref, C * T * B);
        free(ref);
        ggml_free(ctx);
    }
}

/* ggml's activations that the codecs use as they are: their PyTorch definitions. */
static void test_activations(void) {
    const int64_t n = 64;
    for (int kind = 0; kind < 3; kind++) {
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *x = rnd(ctx, n, 1, 1, 4.0f, -4.0f);
        ((float *)x->data)[0] = 1e-4f; /* near 0, where ELU needs expm1 */
        ((float *)x->data)[1] = -1e-4f;
        struct ggml_tensor *y = kind == 0 ? ggml_elu(ctx, x) : kind == 1 ? ggml_gelu_erf(ctx, x) : ggml_silu(ctx, x);
        const float *got = compute(ctx, graph(ctx), &y);
        double ref[64];
        for (int64_t i = 0; i < n; i++) {
            const double v = F(x)[i];
            ref[i] = kind == 0 ? (v > 0 ? v : expm1(v)) : kind == 1 ? 0.5 * v * (1.0 + erf(v / sqrt(2.0)))
                                                                    : v / (1.0 + exp(-v));
        }
        const char *names[] = {"ggml_elu (ELU)", "ggml_gelu_erf (nn.GELU)", "ggml_silu (SiLU)"};
        compare(names[kind], got, ref, n);
        ggml_free(ctx);
    }
}

/* ---------------------------------------------------------- convolutions */

static void test_dwconv(void) {
    const int64_t C = 5, K = 7;
    const int64_t shapes[][2] = {{13, 3}, {8, 1}};
    for (int s = 0; s < 2; s++) {
        const int64_t T = shapes[s][0], B = shapes[s][1];
        for (int d = 1; d <= 3; d += 2) {
            const int P = d * (int)(K - 1) / 2;
            const int pads[][2] = {{P, P}, {0, 0}, {2 * P, 0}, {1, 4}}; /* same, valid, causal, asymmetric */
            for (int p = 0; p < 4; p++) {
                const int pl = pads[p][0], pr = pads[p][1];
                const int64_t To = T + pl + pr - d * (K - 1);
                if (To < 1) {
                    continue;
                }
                /* channels fastest (ggml's op), time fastest, channels fastest on the CPU's loop */
                for (int layout = 0; layout < 3; layout++) {
                    if (layout == 1 && pl != pr) {
                        continue; /* the time-fastest conv pads symmetrically */
                    }
                    struct ggml_context *ctx = new_ctx();
                    struct ggml_tensor *x = rnd(ctx, C, T, B, 1.0f, -1.0f), *w = rnd(ctx, C, K, 1, 1.0f, -1.0f);
                    struct ggml_tensor *b = rnd1(ctx, C);
                    struct ggml_tensor *y;
                    if (layout != 1) {
                        y = cr_dwconv(ctx, x, w, b, d, pl, pr, layout == 2);
                    } else {
                        struct ggml_tensor *t = cr_dwconv_tf(ctx, cr_to_tf(ctx, x), T, B, w, b, d, pl);
                        y = cr_to_cf(ctx, ggml_reshape_2d(ctx, t, To * B, C), To, B);
                    }
                    check_shape("dwconv", y, C, To, B);
                    const float *got = compute(ctx, graph(ctx), &y);
                    double *ref = malloc(sizeof(double) * (size_t)(C * To * B));
                    dwconv_ref(ref, F(x), F(w), F(b), C, T, B, K, d, pl, To);
                    char what[96];
                    snprintf(what, sizeof(what), "dwconv layout %d T %lld B %lld d %d pad %d,%d", layout,
                             (long long)T, (long long)B, d, pl, pr);
                    compare(what, got, ref, C * To * B);
                    free(ref);
                    ggml_free(ctx);
                }
            }
        }
    }
}

/*
 * The longest run of ADD nodes in gf that ggml's CUDA backend fuses into one kernel
 * (ggml-cuda.cu, multi-add): consecutive nodes, each reading the last as src[0], their
 * src[1] all of one layout, each intermediate read once. cr_conv1d's tap sum must be one.
 */
static bool same_layout(const struct ggml_tensor *a, const struct ggml_tensor *b) {
    for (int d = 0; d < GGML_MAX_DIMS; d++) {
        if (a->ne[d] != b->ne[d] || a->nb[d] != b->nb[d]) {
            return false;
        }
    }
    return a->type == b->type;
}

static int fusable_add_chain(struct ggml_cgraph *gf) {
    int best = 0;
    const int n = ggml_graph_n_nodes(gf);
    for (int i = 0; i < n; i++) {
        int len = 1;
        struct ggml_tensor *a = ggml_graph_node(gf, i);
        if (a->op != GGML_OP_ADD) {
            continue;
        }
        while (i + len < n) {
            struct ggml_tensor *prev = ggml_graph_node(gf, i + len - 1), *next = ggml_graph_node(gf, i + len);
            if (next->op != GGML_OP_ADD || next->src[0] != prev || !same_layout(prev->src[1], next->src[1])) {
                break;
            }
            len++;
        }
        best = len > best ? len : best;
    }
    return best;
}

static void test_conv1d(void) {
    const int64_t Cin = 6, T = 11, B = 3;
    const int Ks[] = {7, 3, 1};
    for (int ki = 0; ki < 3; ki++) {
        const int64_t K = Ks[ki];
        for (int d = 1; d <= 3; d += 2) {
            const int P = d * (int)(K - 1) / 2;
            const int pads[][2] = {{P, P}, {0, 0}, {2 * P, 0}, {0, 3}};
            for (int p = 0; p < 4; p++) {
                for (int Cout = 5; Cout <= 16; Cout += 11) {
                    /* path 0: the shifted products (CODECRT_CONV=taps), 1: im2col (the GPUs' default), 2: the fused CPU conv */
                    for (int path = 0; path < 3; path++) {
                        const int fused = path == 2;
                        const int pl = pads[p][0], pr = pads[p][1];
                        const int64_t To = T + pl + pr - d * (K - 1);
                        if (To < 1) {
                            continue;
                        }
                        struct ggml_context *ctx = new_ctx();
                        struct ggml_tensor *x = rnd(ctx, Cin, T, B, 1.0f, -1.0f);
                        struct ggml_tensor *w = rnd(ctx, K, Cin, Cout, 1.0f, -1.0f), *b = rnd1(ctx, Cout);
                        const cr_cpu_ops ops = {.bf16 = false, .packs = NULL};
                        struct ggml_cgraph *gf = graph(ctx);
                        if (path == 0) {
                            setenv("CODECRT_CONV", "taps", 1);
                        }
                        struct ggml_tensor *y =
                            cr_conv1d(ctx, gf, x, w, p == 1 ? NULL : b, d, pl, pr, fused ? &ops : NULL);
                        unsetenv("CODECRT_CONV");
                        check_shape("conv1d", y, Cout, To, B);
                        if (path == 0 && K > 1) {
                            ggml_build_forward_expand(gf, y);
                            CHECK(fusable_add_chain(gf) == K - 1, "conv1d K %lld: %d adds in a fusable chain, want %lld",
                                  (long long)K, fusable_add_chain(gf), (long long)(K - 1));
                        }
                        const float *got = compute(ctx, gf, &y);
                        double *ref = malloc(sizeof(double) * (size_t)(Cout * To * B));
                        for (int64_t bb = 0; bb < B; bb++) {
                            for (int64_t t = 0; t < To; t++) {
                                for (int64_t o = 0; o < Cout; o++) {
                                    double acc = p == 1 ? 0.0 : F(b)[o];
                                    for (int64_t i = 0; i < Cin; i++) {
                                        for (int64_t k = 0; k < K; k++) {
                                            acc += (double)F(w)[k + K * (i + Cin * o)] *
                                                   at(F(x), Cin, T, i, t + k * d - pl, bb);
                                        }
                                    }
                                    ref[o + Cout * (t + To * bb)] = acc;
                                }
                            }
                        }
                        char what[96];
                        snprintf(what, sizeof(what), "conv1d K %lld d %d pad %d,%d Cout %d path %d", (long long)K, d,
                                 pl, pr, Cout, path);
                        compare(what, got, ref, Cout * To * B);
                        free(ref);
                        ggml_free(ctx);
                    }
                }
            }
        }
    }
}

static void test_conv_narrow(void) {
    const int64_t Cin = 9, T = 10, B = 3;
    const int cases[][4] = {{7, 1, 3, 3}, {7, 2, 3, 3}, {3, 1, 2, 0}, {5, 1, 0, 0}}; /* K, Cout, pl, pr */
    for (int c = 0; c < 4; c++) {
        const int K = cases[c][0], Cout = cases[c][1], pl = cases[c][2], pr = cases[c][3];
        const int64_t To = T + pl + pr - (K - 1);
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *x = rnd(ctx, Cin, T, B, 1.0f, -1.0f), *w = rnd(ctx, Cin, K * Cout, 1, 1.0f, -1.0f);
        struct ggml_tensor *b = rnd1(ctx, Cout);
        struct ggml_tensor *y = cr_conv_narrow(ctx, x, w, b, K, pl, pr);
        check_shape("conv_narrow", y, Cout, To, B);
        const float *got = compute(ctx, graph(ctx), &y);
        double *ref = malloc(sizeof(double) * (size_t)(Cout * To * B));
        for (int64_t bb = 0; bb < B; bb++) {
            for (int64_t t = 0; t < To; t++) {
                for (int64_t o = 0; o < Cout; o++) {
                    double acc = F(b)[o];
                    for (int64_t k = 0; k < K; k++) {
                        for (int64_t i = 0; i < Cin; i++) {
                            acc += (double)F(w)[i + Cin * (k * Cout + o)] * at(F(x), Cin, T, i, t + k - pl, bb);
                        }
                    }
                    ref[o + Cout * (t + To * bb)] = acc;
                }
            }
        }
        char what[64];
        snprintf(what, sizeof(what), "conv_narrow K %d Cout %d pad %d,%d", K, Cout, pl, pr);
        compare(what, got, ref, Cout * To * B);
        free(ref);
        ggml_free(ctx);
    }
}

/* PyTorch ConvTranspose1d(kernel 2s, stride s, padding p, output_padding op). */
static void test_upconv(void) {
    const int64_t Cin = 6, Cout = 4, B = 3;
    /* s, crop, output_padding (-1: causal, trimmed of its last s samples) */
    const int cases[][3] = {{2, 1, 0}, {3, 2, 1}, {5, 3, 0}, {8, 4, 0}, {4, 0, -1}, {1, 1, 1}};
    const int64_t Ts[] = {7, 1};
    for (int c = 0; c < 6; c++) {
        for (int ti = 0; ti < 2; ti++) {
            const int s = cases[c][0], p = cases[c][1], op = cases[c][2];
            const int64_t T = Ts[ti], K = 2 * s;
            const int64_t n_out = op < 0 ? T * s : (T - 1) * s - 2 * p + K + op;
            struct ggml_context *ctx = new_ctx();
            struct ggml_tensor *x = rnd(ctx, Cin, T, B, 1.0f, -1.0f), *w = rnd(ctx, Cin, K * Cout, 1, 1.0f, -1.0f);
            struct ggml_tensor *b = rnd1(ctx, Cout);
            struct ggml_tensor *y = cr_upconv(ctx, x, w, b, s, p, n_out, NULL, (ti + c) % 2 == 1);
            check_shape("upconv", y, Cout, n_out, B);
            const float *got = compute(ctx, graph(ctx), &y);
            const int64_t full = (T + 1) * s;
            double *acc = calloc((size_t)(Cout * full * B), sizeof(double));
            double *ref = malloc(sizeof(double) * (size_t)(Cout * n_out * B));
            for (int64_t bb = 0; bb < B; bb++) {
                for (int64_t i = 0; i < T; i++) {
                    for (int64_t k = 0; k < K; k++) {
                        for (int64_t o = 0; o < Cout; o++) {
                            for (int64_t ic = 0; ic < Cin; ic++) {
                                acc[o + Cout * (i * s + k + full * bb)] +=
                                    (double)F(w)[ic + Cin * (k * Cout + o)] * at(F(x), Cin, T, ic, i, bb);
                            }
                        }
                    }
                }
                for (int64_t t = 0; t < n_out; t++) {
                    for (int64_t o = 0; o < Cout; o++) {
                        ref[o + Cout * (t + n_out * bb)] = acc[o + Cout * (t + p + full * bb)] + F(b)[o];
                    }
                }
            }
            char what[64];
            snprintf(what, sizeof(what), "upconv s %d crop %d op %d T %lld", s, p, op, (long long)T);
            compare(what, got, ref, Cout * n_out * B);
            /* the tail op (cr_upconv_tf: ops/ops_upconv.c's C function here): time fastest
               [n_out, B, Cout], the mask's zeros applied (every third sample; all ones on odd cases) */
            struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_out, B);
            for (int64_t i = 0; i < n_out * B; i++) {
                ((float *)mask->data)[i] = c % 2 == 1 || i % 3 ? 1.0f : 0.0f;
            }
            struct ggml_tensor *yt = cr_upconv_tf(ctx, x, w, b, mask, s, p, n_out);
            CHECK(yt != NULL, "%s: the tail op applies", what);
            check_shape("upconv_tf", yt, n_out, B, Cout);
            const float *gt = compute(ctx, graph(ctx), &yt);
            double *reft = malloc(sizeof(double) * (size_t)(Cout * n_out * B));
            for (int64_t bb = 0; bb < B; bb++) {
                for (int64_t t = 0; t < n_out; t++) {
                    for (int64_t o = 0; o < Cout; o++) {
                        reft[t + n_out * (bb + B * o)] =
                            ref[o + Cout * (t + n_out * bb)] * ((const float *)mask->data)[t + n_out * bb];
                    }
                }
            }
            snprintf(what, sizeof(what), "upconv_tf s %d crop %d op %d T %lld", s, p, op, (long long)T);
            compare(what, gt, reft, Cout * n_out * B);
            CHECK(cr_upconv_tf(ctx, x, w, NULL, NULL, s, p, n_out) == NULL, "%s: no bias, no op", what);
            CHECK(cr_upconv_tf(ctx, x, w, b, NULL, s, p, (T + 1) * s - p + 1) == NULL, "%s: past the output", what);
            free(reft);
            free(acc);
            free(ref);
            ggml_free(ctx);
        }
    }
}

/* The stream form: blocks 1..n of the uncropped transposed conv over [previous frame, n new frames]. */
static void test_upconv_step(void) {
    const int64_t Cin = 5, Cout = 3, B = 3;
    const int ss[] = {2, 3, 8};
    for (int si = 0; si < 3; si++) {
        for (int64_t n = 1; n <= 4; n += 3) {
            const int s = ss[si];
            const int64_t L = n + 1, K = 2 * s, full = (L + 1) * s;
            struct ggml_context *ctx = new_ctx();
            struct ggml_tensor *buf = rnd(ctx, Cin, L, B, 1.0f, -1.0f), *w = rnd(ctx, Cin, K * Cout, 1, 1.0f, -1.0f);
            struct ggml_tensor *b = rnd1(ctx, Cout);
            struct ggml_tensor *y = cr_upconv_step(ctx, buf, w, b, s, NULL);
            check_shape("upconv_step", y, Cout, n * s, B);
            const float *got = compute(ctx, graph(ctx), &y);
            double *acc = calloc((size_t)(Cout * full * B), sizeof(double));
            double *ref = malloc(sizeof(double) * (size_t)(Cout * n * s * B));
            for (int64_t bb = 0; bb < B; bb++) {
                for (int64_t i = 0; i < L; i++) {
                    for (int64_t k = 0; k < K; k++) {
                        for (int64_t o = 0; o < Cout; o++) {
                            for (int64_t ic = 0; ic < Cin; ic++) {
                                acc[o + Cout * (i * s + k + full * bb)] +=
                                    (double)F(w)[ic + Cin * (k * Cout + o)] * at(F(buf), Cin, L, ic, i, bb);
                            }
                        }
                    }
                }
                for (int64_t t = 0; t < n * s; t++) {
                    for (int64_t o = 0; o < Cout; o++) {
                        ref[o + Cout * (t + n * s * bb)] = acc[o + Cout * (t + s + full * bb)] + F(b)[o];
                    }
                }
            }
            char what[48];
            snprintf(what, sizeof(what), "upconv_step s %d n %lld", s, (long long)n);
            compare(what, got, ref, Cout * n * s * B);
            /* the stream graph's form where the codecrt ops run (snac_stream.c): the tail op with
               crop s over the 1+n frames, time fastest [n s, B, Cout]; bit for bit the step's
               floats (the same two adds in the same order) */
            struct ggml_tensor *yt = cr_upconv_tail(ctx, cr_mm(ctx, w, buf), b, NULL, s, s, n * s, NULL);
            CHECK(yt != NULL, "%s: the tail op applies with crop s", what);
            check_shape("upconv_tail crop s", yt, n * s, B, Cout);
            const float *gt = compute(ctx, graph(ctx), &yt);
            int64_t differ = 0;
            for (int64_t bb = 0; bb < B; bb++) {
                for (int64_t t = 0; t < n * s; t++) {
                    for (int64_t o = 0; o < Cout; o++) {
                        differ += gt[t + n * s * (bb + B * o)] != got[o + Cout * (t + n * s * bb)];
                    }
                }
            }
            CHECK(differ == 0, "%s: the tail op with crop s equals the step bit for bit (%lld differ)", what,
                  (long long)differ);
            /* with the next unit's state written first (a strided [S, B, Cout] view of gathered
               rows, as cr_states_take_tf gives it) and a mask: concat(prefix, masked step) bit
               for bit */
            const int64_t S = 6, no = n * s;
            struct ggml_tensor *rows = rnd(ctx, S * Cout, B, 1, 1.0f, -1.0f);
            struct ggml_tensor *pre = ggml_permute(ctx, ggml_reshape_3d(ctx, rows, S, Cout, B), 0, 2, 1, 3);
            struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, no, B);
            for (int64_t i = 0; i < no * B; i++) {
                ((float *)mask->data)[i] = i % 3 ? 1.0f : 0.0f;
            }
            struct ggml_tensor *yp = cr_upconv_tail(ctx, cr_mm(ctx, w, buf), b, mask, s, s, no, pre);
            CHECK(yp != NULL, "%s: the tail op applies with a prefix", what);
            check_shape("upconv_tail prefix", yp, S + no, B, Cout);
            CHECK(cr_upconv_tail(ctx, cr_mm(ctx, w, buf), b, mask, s, s, no,
                                 ggml_view_3d(ctx, rows, S, B - 1, Cout, pre->nb[1], pre->nb[2], 0)) == NULL,
                  "%s: a prefix of other streams, no op", what);
            const float *gp = compute(ctx, graph(ctx), &yp);
            differ = 0;
            for (int64_t bb = 0; bb < B; bb++) {
                for (int64_t o = 0; o < Cout; o++) {
                    for (int64_t t = 0; t < S + no; t++) {
                        const float want = t < S ? F(rows)[t + S * o + S * Cout * bb]
                                                 : got[o + Cout * ((t - S) + no * bb)] * F(mask)[(t - S) + no * bb];
                        differ += gp[t + (S + no) * (bb + B * o)] != want;
                    }
                }
            }
            CHECK(differ == 0, "%s: the tail op with a prefix and a mask equals concat(prefix, step) (%lld differ)",
                  what, (long long)differ);
            free(acc);
            free(ref);
            ggml_free(ctx);
        }
    }
}

/* --------------------------------------------------------- residual unit */

static void test_res_unit(void) {
    const int64_t C = 6, K = 7, B = 3, n = 9;
    for (int d = 1; d <= 9; d *= 3) {
        const int P = d * (int)(K - 1) / 2;
        for (int mode = 0; mode < 12; mode++) { /* same fused/portable, valid fused/portable, time fastest
                                                    valid (a stream tick) and same (an offline decode), the
                                                    same two with the core as one op (cr_unit_core), then
                                                    modes 4-7 again with a masked graph's 0/1 mask */
            const bool masked = mode >= 8;
            const int m4 = masked ? mode - 4 : mode;
            const bool same = m4 < 2 || m4 == 5 || m4 == 7, cpu_ops = m4 == 0 || m4 == 2;
            const int64_t L = same ? n : n + 2 * P;
            struct ggml_context *ctx = new_ctx();
            struct ggml_tensor *buf = rnd(ctx, C, L, B, 2.0f, -2.0f);
            cr_res_unit u = {
                .alpha1 = rnd(ctx, C, 1, 1, 0.5f, 0.3f), .inv_alpha1 = rnd(ctx, C, 1, 1, 0.5f, 0.5f),
                .dw_w = rnd(ctx, C, K, 1, 0.5f, -0.5f), .dw_b = rnd1(ctx, C),
                .alpha2 = rnd(ctx, C, 1, 1, 0.5f, 0.3f), .inv_alpha2 = rnd(ctx, C, 1, 1, 0.5f, 0.5f),
                .pw_w = rnd(ctx, C, C, 1, 0.5f, -0.5f), .pw_b = rnd1(ctx, C),
            };
            struct ggml_cgraph *gf = graph(ctx);
            struct ggml_tensor *y;
            /* the mask: stream b's points [b, n - b) (a start and an end inside the tick) */
            struct ggml_tensor *mask = NULL;
            if (masked) {
                mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, B);
                for (int64_t bb = 0; bb < B; bb++) {
                    for (int64_t t = 0; t < n; t++) {
                        ((float *)mask->data)[t + n * bb] = t >= bb && t < n - bb ? 1.0f : 0.0f;
                    }
                }
            }
            if (m4 < 4) {
                y = cr_res_branch(ctx, gf, buf, &u, d, same, cr_graph_ops(cpu_ops, NULL));
            } else { /* the whole unit time fastest, back to channels fastest to compare */
                struct ggml_tensor *t = ggml_reshape_3d(ctx, cr_to_tf(ctx, buf), L, B, C);
                t = cr_res_unit_tf(ctx, gf, t, &u, d, same, m4 >= 6, mask, NULL);
                CHECK(t->ne[0] == n && t->ne[1] == B && t->ne[2] == C, "res_unit_tf shape");
                y = cr_to_cf(ctx, ggml_reshape_2d(ctx, t, n * B, C), n, B);
                ggml_build_forward_expand(gf, y);
                int cores = 0, muls = 0;
                for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
                    cores += ggml_graph_node(gf, i)->op == GGML_OP_CUSTOM;
                    muls += ggml_graph_node(gf, i)->op == GGML_OP_MUL;
                }
                CHECK(cores == (m4 >= 6 ? 2 : 0), "res_unit_tf: the core and the tail are ops exactly when asked");
                /* the composed Snakes have products of their own: count the mask's alone */
                CHECK(m4 < 6 || muls == 0, "res_unit_tf: the fused tail applies the mask itself");
            }
            check_shape("res unit", y, C, n, B);
            const float *got = compute(ctx, gf, &y);
            /* reference: Snake1, depthwise conv, Snake2, pw (+ the delayed input for the whole unit) */
            float *s1 = malloc(sizeof(float) * (size_t)(C * L * B));
            for (int64_t i = 0; i < C * L * B; i++) {
                s1[i] = (float)snake_ref(F(buf)[i], F(u.alpha1)[i % C], F(u.inv_alpha1)[i % C]);
            }
            double *h = malloc(sizeof(double) * (size_t)(C * n * B));
            double *ref = malloc(sizeof(double) * (size_t)(C * n * B));
            dwconv_ref(h, s1, F(u.dw_w), F(u.dw_b), C, L, B, K, d, same ? P : 0, n);
            for (int64_t i = 0; i < C * n * B; i++) {
                h[i] = snake_ref(h[i], F(u.alpha2)[i % C], F(u.inv_alpha2)[i % C]);
            }
            pw_ref(ref, h, F(u.pw_w), F(u.pw_b), C, C, n * B);
            if (m4 >= 4) {
                for (int64_t bb = 0; bb < B; bb++) {
                    for (int64_t t = 0; t < n; t++) {
                        for (int64_t c = 0; c < C; c++) {
                            ref[c + C * (t + n * bb)] += at(F(buf), C, L, c, t + (same ? 0 : P), bb);
                            ref[c + C * (t + n * bb)] *= mask ? F(mask)[t + n * bb] : 1.0f;
                        }
                    }
                }
            }
            char what[48];
            snprintf(what, sizeof(what), "res unit mode %d dil %d", mode, d);
            compare(what, got, ref, C * n * B);
            free(s1);
            free(h);
            free(ref);
            ggml_free(ctx);
        }
    }
}

/* The unit with a prefix (a stream tick's next layer's state written first by the tail op):
   concat(prefix, unit) bit for bit, fused and composed, masked and not, with the prefix a
   strided view (the gathered state rows permuted, as cr_states_take_tf gives them). */
static void test_res_unit_prefix(void) {
    const int64_t C = 5, K = 7, B = 3, n = 8, S = 4;
    for (int mode = 0; mode < 4; mode++) {
        const bool fused = mode & 1, masked = mode & 2;
        const int d = 3, P = d * (int)(K - 1) / 2;
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *buf = rnd(ctx, n + 2 * P, B, C, 2.0f, -2.0f);
        cr_res_unit u = {
            .alpha1 = rnd(ctx, C, 1, 1, 0.5f, 0.3f), .inv_alpha1 = rnd(ctx, C, 1, 1, 0.5f, 0.5f),
            .dw_w = rnd(ctx, C, K, 1, 0.5f, -0.5f), .dw_b = rnd1(ctx, C),
            .alpha2 = rnd(ctx, C, 1, 1, 0.5f, 0.3f), .inv_alpha2 = rnd(ctx, C, 1, 1, 0.5f, 0.5f),
            .pw_w = rnd(ctx, C, C, 1, 0.5f, -0.5f), .pw_b = rnd1(ctx, C),
        };
        struct ggml_tensor *mask = NULL;
        if (masked) {
            mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, B);
            for (int64_t i = 0; i < n * B; i++) {
                ((float *)mask->data)[i] = i % 3 ? 1.0f : 0.0f;
            }
        }
        /* rows [S*C, B] as gathered, viewed [S, B, C] */
        struct ggml_tensor *rows = rnd(ctx, S * C, B, 1, 1.0f, -1.0f);
        struct ggml_tensor *pre = ggml_permute(ctx, ggml_reshape_3d(ctx, rows, S, C, B), 0, 2, 1, 3);
        struct ggml_cgraph *gf = graph(ctx);
        struct ggml_tensor *plain = cr_res_unit_tf(ctx, gf, buf, &u, d, false, fused, mask, NULL);
        struct ggml_tensor *with = cr_res_unit_tf(ctx, gf, buf, &u, d, false, fused, mask, pre);
        check_shape("res_unit_tf prefix", with, S + n, B, C);
        ggml_build_forward_expand(gf, plain);
        const float *got = compute(ctx, gf, &with);
        int64_t differ = 0;
        for (int64_t c = 0; c < C; c++) {
            for (int64_t bb = 0; bb < B; bb++) {
                for (int64_t t = 0; t < S + n; t++) {
                    const float want = t < S ? F(rows)[t + S * c + S * C * bb] : F(plain)[(t - S) + n * (bb + B * c)];
                    differ += got[t + (S + n) * (bb + B * c)] != want;
                }
            }
        }
        CHECK(differ == 0, "res_unit_tf prefix (fused %d, masked %d): %lld values differ from concat(prefix, unit)",
              fused, masked, (long long)differ);
        ggml_free(ctx);
    }
}

/* The rows' softmax op (ops/ops_softmax.c's C function here) against a double reference and
   against ggml's own softmax, rows short and past the CUDA kernel's 1,024 in registers. */
static void test_softmax_rows(void) {
    const int64_t ns[] = {1, 7, 350, 1100};
    const float scale = 0.125f;
    for (int c = 0; c < 4; c++) {
        const int64_t n = ns[c], R = 3, B = 2;
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *a = rnd(ctx, n, R, B, 20.0f, -20.0f); /* scaled scores in [-2.5, 2.5) */
        struct ggml_tensor *y = cr_softmax_rows(ctx, a, scale);
        CHECK(y != NULL, "softmax_rows n %lld: the op applies", (long long)n);
        check_shape("softmax_rows", y, n, R, B);
        const float *got = compute(ctx, graph(ctx), &y);
        double *ref = malloc(sizeof(double) * (size_t)(n * R * B));
        for (int64_t r = 0; r < R * B; r++) {
            double m = -INFINITY, sum = 0.0;
            for (int64_t i = 0; i < n; i++) {
                m = fmax(m, (double)scale * F(a)[r * n + i]);
            }
            for (int64_t i = 0; i < n; i++) {
                sum += exp((double)scale * F(a)[r * n + i] - m);
            }
            for (int64_t i = 0; i < n; i++) {
                ref[r * n + i] = exp((double)scale * F(a)[r * n + i] - m) / sum;
            }
        }
        char what[64];
        snprintf(what, sizeof(what), "softmax_rows n %lld", (long long)n);
        compare(what, got, ref, n * R * B);
        struct ggml_tensor *g = ggml_soft_max_ext(ctx, a, NULL, scale, 0.0f);
        const float *want = compute(ctx, graph(ctx), &g);
        free(ref);
        snprintf(what, sizeof(what), "softmax_rows n %lld vs ggml", (long long)n);
        compare_f32(what, got, want, n * R * B);
        CHECK(n == 1 || cr_softmax_rows(ctx, ggml_transpose(ctx, a), scale) == NULL, "softmax_rows: a view, no op");
        CHECK(cr_softmax_rows(ctx, a, INFINITY) == NULL, "softmax_rows: no infinite scale");
        ggml_free(ctx);
    }
}

/* The convolution columns op (ops/ops_cols.c's C function here) against a double reference
   and against ggml's im2col of the transposed, padded input (bit for bit: both copy), with
   "same", causal and asymmetric padding, dilations, and through a Snake. */
static void test_cols(void) {
    static const int cases[][4] = {{3, 1, 1, 1}, {7, 3, 9, 9}, {11, 5, 25, 25}, {3, 1, 2, 0}, {5, 1, 0, 3}, {4, 2, 0, 0}};
    for (int c = 0; c < 6; c++) {
        const int K = cases[c][0], d = cases[c][1], pl = cases[c][2], pr = cases[c][3];
        const int64_t C = 6, T = 29, B = 2, To = T + pl + pr - (int64_t)d * (K - 1);
        for (int snake = 0; snake < 2; snake++) {
            struct ggml_context *ctx = new_ctx();
            struct ggml_tensor *x = rnd(ctx, C, T, B, 2.0f, -2.0f);
            struct ggml_tensor *alpha = snake ? rnd(ctx, C, 1, 1, 0.5f, 0.2f) : NULL;
            struct ggml_tensor *inv = NULL;
            if (snake) {
                inv = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, C);
                for (int64_t i = 0; i < C; i++) {
                    ((float *)inv->data)[i] = 1.0f / (F(alpha)[i] + 1e-9f);
                }
            }
            struct ggml_tensor *y = cr_cols(ctx, x, alpha, inv, K, d, pl, pr);
            CHECK(y != NULL, "cols K %d d %d: the op applies", K, d);
            check_shape("cols", y, C * K, To, B);
            const float *got = compute(ctx, graph(ctx), &y);
            double *ref = malloc(sizeof(double) * (size_t)(C * K * To * B));
            for (int64_t b = 0; b < B; b++) {
                for (int64_t t = 0; t < To; t++) {
                    for (int64_t ch = 0; ch < C; ch++) {
                        for (int k = 0; k < K; k++) {
                            const int64_t s = t + (int64_t)k * d - pl;
                            double v = s >= 0 && s < T ? F(x)[(b * T + s) * C + ch] : 0.0;
                            if (snake && s >= 0 && s < T) {
                                const double sn = sin(F(alpha)[ch] * v);
                                v += sn * sn / (F(alpha)[ch] + 1e-9);
                            }
                            ref[((b * To + t) * C + ch) * K + k] = v;
                        }
                    }
                }
            }
            char what[64];
            snprintf(what, sizeof(what), "cols K %d d %d pad %d,%d snake %d", K, d, pl, pr, snake);
            compare(what, got, ref, C * K * To * B);
            free(ref);
            if (!snake) { /* ggml's im2col over the transposed, padded input: the same copy */
                struct ggml_tensor *w = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, C, 1); /* its shape only */
                struct ggml_tensor *xt = ggml_pad_ext(ctx, ggml_cont(ctx, ggml_transpose(ctx, x)), pl, pr, 0, 0, 0,
                                                      0, 0, 0);
                struct ggml_tensor *g = ggml_im2col(ctx, w, xt, 1, 0, 0, 0, d, 0, false, GGML_TYPE_F32);
                const float *want = compute(ctx, graph(ctx), &g);
                int same = 1;
                for (int64_t i = 0; i < C * K * To * B; i++) {
                    same &= got[i] == want[i];
                }
                CHECK(same, "%s: equals ggml's im2col", what);
            }
            CHECK(cr_cols(ctx, ggml_transpose(ctx, x), NULL, NULL, K, d, pl, pr) == NULL, "cols: a view, no op");
            CHECK(cr_cols(ctx, x, NULL, NULL, 31, 1, 0, 0) == NULL, "cols: a kernel longer than the input");
            CHECK(cr_cols(ctx, x, alpha, NULL, K, d, pl, pr) == NULL || !snake, "cols: alpha without inv");
            CHECK(cr_cols(ctx, x, NULL, NULL, 0, d, pl, pr) == NULL, "cols: no taps");
            ggml_free(ctx);
        }
    }
}

/* The attention's values op (ops/ops_attn.c's C function here) against a double
   reference and against ggml's product and permutation, with v a strided view as S3Gen's
   estimator gives it (one product's [T B, H D] output read per head and sequence). */
static void test_attn_values(void) {
    const int64_t D = 5, H = 3, B = 2;
    const int64_t Ts[] = {1, 9, 33};
    for (int c = 0; c < 3; c++) {
        const int64_t T = Ts[c];
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *vt = rnd(ctx, T * B, H * D, 1, 2.0f, -1.0f); /* [T B, H D] */
        const size_t f = sizeof(float);
        struct ggml_tensor *v = ggml_view_4d(ctx, vt, T, D, H, B, (size_t)(T * B) * f, (size_t)(D * T * B) * f,
                                             (size_t)T * f, 0); /* [T, D, H, B] */
        const int64_t Tq = T + 2; /* queries and keys differ in number: a swap shows */
        struct ggml_tensor *p = rnd(ctx, T, Tq, H * B, 1.0f, 0.0f);
        p = ggml_reshape_4d(ctx, p, T, Tq, H, B);
        struct ggml_tensor *y = cr_attn_values(ctx, v, p);
        CHECK(y != NULL, "attn_values T %lld: the op applies", (long long)T);
        CHECK(y->ne[0] == D && y->ne[1] == H && y->ne[2] == Tq && y->ne[3] == B, "attn_values: shape [D, H, Tq, B]");
        const float *got = compute(ctx, graph(ctx), &y);
        const int64_t n = D * H * Tq * B;
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t b = 0; b < B; b++) {
            for (int64_t t = 0; t < Tq; t++) {
                for (int64_t h = 0; h < H; h++) {
                    for (int64_t d = 0; d < D; d++) {
                        double sum = 0.0;
                        for (int64_t k = 0; k < T; k++) {
                            sum += (double)F(vt)[(b * T + k) + (h * D + d) * T * B] *
                                   F(p)[((b * H + h) * Tq + t) * T + k];
                        }
                        ref[((b * Tq + t) * H + h) * D + d] = sum;
                    }
                }
            }
        }
        char what[64];
        snprintf(what, sizeof(what), "attn_values T %lld", (long long)T);
        compare(what, got, ref, n);
        struct ggml_tensor *g = ggml_cont(ctx, ggml_permute(ctx, ggml_mul_mat(ctx, v, p), 0, 2, 1, 3));
        const float *want = compute(ctx, graph(ctx), &g);
        free(ref);
        snprintf(what, sizeof(what), "attn_values T %lld vs ggml", (long long)T);
        compare_f32(what, got, want, n);
        struct ggml_tensor *vd = ggml_reshape_4d(ctx, rnd(ctx, D, T, H * B, 1.0f, -1.0f), D, T, H, B);
        CHECK(cr_attn_values(ctx, ggml_permute(ctx, vd, 1, 0, 2, 3), p) == NULL, "attn_values: keys not fastest");
        CHECK(cr_attn_values(ctx, v, ggml_view_4d(ctx, p, T, Tq - 1, H, B, p->nb[1], p->nb[2], p->nb[3], 0)) ==
                  NULL, "attn_values: weights not contiguous");
        CHECK(cr_attn_values(ctx, v, ggml_reshape_4d(ctx, p, T, Tq, B, H)) == NULL || H == B,
              "attn_values: heads differ");
        ggml_free(ctx);
    }
}

/* The bias-activation op (ops/ops_bias_act.c's C function here): without an activation
   bit for bit ggml's r + (y + b), with GELU against ggml's gelu_erf of y + b and a double
   reference. */
static void test_bias_act(void) {
    const int64_t C = 12, T = 7, B = 3;
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *y = rnd(ctx, C, T, B, 3.0f, -3.0f), *r = rnd(ctx, C, T, B, 1.0f, -1.0f);
    struct ggml_tensor *b = rnd(ctx, C, 1, 1, 1.0f, -1.0f);
    b = ggml_reshape_1d(ctx, b, C);
    struct ggml_tensor *o = cr_bias_act(ctx, y, b, r, CR_ACT_NONE);
    CHECK(o != NULL, "bias_act: the op applies");
    check_shape("bias_act", o, C, T, B);
    const float *got = compute(ctx, graph(ctx), &o);
    struct ggml_tensor *g = ggml_add(ctx, r, ggml_add(ctx, y, b));
    const float *want = compute(ctx, graph(ctx), &g);
    int same = 1;
    for (int64_t i = 0; i < C * T * B; i++) {
        same &= got[i] == want[i];
    }
    CHECK(same, "bias_act with a residual: equals ggml's two adds bit for bit");
    struct ggml_tensor *og = cr_bias_act(ctx, y, b, NULL, CR_ACT_GELU_ERF);
    CHECK(og != NULL, "bias_act gelu: the op applies");
    const float *gg = compute(ctx, graph(ctx), &og);
    struct ggml_tensor *gw = ggml_gelu_erf(ctx, ggml_add(ctx, y, b));
    const float *gwant = compute(ctx, graph(ctx), &gw);
    double *ref = malloc(sizeof(double) * (size_t)(C * T * B));
    for (int64_t i = 0; i < C * T * B; i++) {
        const double v = (double)F(y)[i] + F(b)[i % C];
        ref[i] = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    }
    compare("bias_act gelu", gg, ref, C * T * B);
    free(ref);
    compare_f32("bias_act gelu vs ggml", gg, gwant, C * T * B);
    CHECK(cr_bias_act(ctx, ggml_transpose(ctx, y), b, NULL, CR_ACT_NONE) == NULL, "bias_act: a view, no op");
    CHECK(cr_bias_act(ctx, y, ggml_view_1d(ctx, b, C - 1, 0), NULL, CR_ACT_NONE) == NULL, "bias_act: a short bias");
    CHECK(cr_bias_act(ctx, y, b, ggml_view_2d(ctx, r, C, T, r->nb[1], 0), CR_ACT_NONE) == NULL,
          "bias_act: a residual of another shape");
    CHECK(cr_bias_act(ctx, y, b, NULL, (cr_bias_act_kind)7) == NULL, "bias_act: an unknown activation");
    ggml_free(ctx);
}

/* The attention's scores op (ops/ops_attn.c's C function here) against a double reference
   and ggml's product, with k and q strided views as S3Gen's estimator gives them (heads of
   the projections [H D, T, B]). */
static void test_attn_scores(void) {
    const int64_t D = 9, H = 3, B = 2;
    const int64_t Ts[] = {1, 5, 21};
    for (int c = 0; c < 3; c++) {
        const int64_t T = Ts[c];
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *kp = rnd(ctx, H * D, T, B, 2.0f, -1.0f), *qp = rnd(ctx, H * D, T + 2, B, 2.0f, -1.0f);
        struct ggml_tensor *k = ggml_permute(ctx, ggml_reshape_4d(ctx, kp, D, H, T, B), 0, 2, 1, 3); /* [D, T, H, B] */
        struct ggml_tensor *q = ggml_permute(ctx, ggml_reshape_4d(ctx, qp, D, H, T + 2, B), 0, 2, 1, 3);
        struct ggml_tensor *y = cr_attn_scores(ctx, k, q);
        CHECK(y != NULL, "attn_scores T %lld: the op applies", (long long)T);
        CHECK(y->ne[0] == T && y->ne[1] == T + 2 && y->ne[2] == H && y->ne[3] == B, "attn_scores: shape");
        const float *got = compute(ctx, graph(ctx), &y);
        const int64_t n = T * (T + 2) * H * B;
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t b = 0; b < B; b++) {
            for (int64_t h = 0; h < H; h++) {
                for (int64_t j = 0; j < T + 2; j++) {
                    for (int64_t i = 0; i < T; i++) {
                        double sum = 0.0;
                        for (int64_t d = 0; d < D; d++) {
                            sum += (double)F(kp)[(b * T + i) * H * D + h * D + d] *
                                   F(qp)[(b * (T + 2) + j) * H * D + h * D + d];
                        }
                        ref[((b * H + h) * (T + 2) + j) * T + i] = sum;
                    }
                }
            }
        }
        char what[64];
        snprintf(what, sizeof(what), "attn_scores T %lld", (long long)T);
        compare(what, got, ref, n);
        struct ggml_tensor *g = ggml_mul_mat(ctx, k, q);
        const float *want = compute(ctx, graph(ctx), &g);
        free(ref);
        snprintf(what, sizeof(what), "attn_scores T %lld vs ggml", (long long)T);
        compare_f32(what, got, want, n);
        CHECK(cr_attn_scores(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, kp, D, H, T, B), 1, 0, 2, 3), q) == NULL,
              "attn_scores: channels not fastest");
        CHECK(cr_attn_scores(ctx, k, ggml_view_4d(ctx, q, D - 1, T + 2, H, B, q->nb[1], q->nb[2], q->nb[3], 0)) == NULL,
              "attn_scores: channels differ");
        ggml_free(ctx);
    }
}

/* The matrix product op (ops/ops_matmul.c's C function here) against a double reference and
   ggml's product, over a 3-D right operand. */
static void test_matmul(void) {
    const int64_t K = 37, N = 11, T = 6, B = 2;
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = rnd(ctx, K, N, 1, 2.0f, -1.0f);
    a = ggml_reshape_2d(ctx, a, K, N);
    struct ggml_tensor *x = rnd(ctx, K, T, B, 2.0f, -1.0f);
    struct ggml_tensor *y = cr_matmul(ctx, a, x);
    CHECK(y != NULL, "matmul: the op applies");
    check_shape("matmul", y, N, T, B);
    const float *got = compute(ctx, graph(ctx), &y);
    double *ref = malloc(sizeof(double) * (size_t)(N * T * B));
    for (int64_t m = 0; m < T * B; m++) {
        for (int64_t n = 0; n < N; n++) {
            double sum = 0.0;
            for (int64_t k = 0; k < K; k++) {
                sum += (double)F(a)[n * K + k] * F(x)[m * K + k];
            }
            ref[m * N + n] = sum;
        }
    }
    compare("matmul", got, ref, N * T * B);
    struct ggml_tensor *g = ggml_mul_mat(ctx, a, x);
    const float *want = compute(ctx, graph(ctx), &g);
    free(ref);
    compare_f32("matmul vs ggml", got, want, N * T * B);
    CHECK(cr_matmul(ctx, ggml_transpose(ctx, a), x) == NULL, "matmul: a view, no op");
    CHECK(cr_matmul(ctx, a, ggml_view_3d(ctx, x, K - 1, T, B, x->nb[1], x->nb[2], 0)) == NULL,
          "matmul: inner extents differ");
    CHECK(cr_matmul(ctx, x, x) == NULL, "matmul: a 3-D left operand");
    ggml_free(ctx);
}

int main(void) {
    test_products();
    test_layouts();
    test_snake();
    test_norms();
    test_activations();
    test_dwconv();
    test_conv1d();
    test_conv_narrow();
    test_upconv();
    test_upconv_step();
    test_softmax_rows();
    test_cols();
    test_attn_scores();
    test_attn_values();
    test_matmul();
    test_bias_act();
    test_res_unit();
    test_res_unit_prefix();
    printf("test_layers: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
