/*
 * test_ops_cpu.c: the fused CPU kernels against references computed here in
 * double precision, on shapes that exercise every remainder of their tiling
 * (query blocks of 48 in register tiles of 6 rows, keys in tiles of 64 and 16).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "internal.h"
#include "test_common.h"

static float lcg_uniform(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static void fill(struct ggml_tensor *t, float amp, unsigned *seed) {
    float *p = (float *)t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++) {
        p[i] = amp * lcg_uniform(seed);
    }
}

/* x rounded to bfloat16 (nearest even), as the BF16 mode rounds its operands. */
static double bfr(double x) {
    union {
        float f;
        uint32_t u;
    } v = {(float)x};
    v.u = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u;
    return v.f;
}

/* An operand as the kernel under test sees it: itself, or rounded in BF16 mode. */
static double op(float x, bool bf16) {
    return bf16 ? bfr(x) : (double)x;
}

/* Relative L2 error, accumulated output by output. */
typedef struct rel_l2 {
    double err, norm;
} rel_l2;

static void rel_add(rel_l2 *r, double got, double ref) {
    r->err += (got - ref) * (got - ref);
    r->norm += ref * ref;
}

static double rel_value(const rel_l2 *r) {
    return sqrt(r->err / (r->norm > 0 ? r->norm : 1));
}

/* x, w and (if any) b of a product test: uniform in [-1, 1). */
static void fill_operands(struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b, unsigned *seed) {
    fill(x, 2.0f, seed);
    fill(w, 2.0f, seed);
    if (b) {
        fill(b, 2.0f, seed);
    }
}

/* The ops a check runs with: its own packs if ops has any (packs are keyed by
   the weight's address, which the next check's context may reuse with other
   values; a context's weights never change while its packs live). */
static cr_cpu_ops check_ops(const cr_cpu_ops *ops) {
    cr_cpu_ops o = {.bf16 = ops && ops->bf16, .packs = ops && ops->packs ? cr_packs_new() : NULL,
                    .x3 = ops && ops->x3};
    return o;
}

/* Computes the graph of out with this many threads. */
static void compute(struct ggml_context *ctx, struct ggml_tensor *out, int threads) {
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    CHECK(ggml_graph_compute_with_ctx(ctx, gf, threads) == GGML_STATUS_SUCCESS, "compute");
}

/* Relative L2 of o against softmax(q k^T / 8) v per head, in double, or with
   a position table p, softmax(((q+u) k^T + (q+bv) p_{T-1-i+j}) / 8) v (p, u and
   bv NULL: plain). With bf16, of the BF16 mode's operands: q, k, v, p rounded
   (q+u and q+bv after the F32 add), and the normalized softmax. */
static double attention_error(const float *q, const float *k, const float *v, const float *o, int64_t H, int64_t T,
                              int64_t B, bool bf16, const float *p, const float *u, const float *bv) {
    const int64_t ld = H * 64;
    rel_l2 e = {0, 0};
    double *s = malloc(sizeof(double) * (size_t)T);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            for (int64_t i = 0; i < T; i++) {
                const float *qi = q + (b * T + i) * ld + h * 64;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < T; j++) {
                    const float *kj = k + (b * T + j) * ld + h * 64;
                    const float *pm = p ? p + (T - 1 - i + j) * ld + h * 64 : NULL;
                    double d = 0;
                    for (int c = 0; c < 64; c++) {
                        if (!p) {
                            d += op(qi[c], bf16) * op(kj[c], bf16);
                        } else {
                            d += op(qi[c] + u[h * 64 + c], bf16) * op(kj[c], bf16) +
                                 op(qi[c] + bv[h * 64 + c], bf16) * op(pm[c], bf16);
                        }
                    }
                    s[j] = d / 8.0;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int64_t j = 0; j < T; j++) {
                    s[j] = exp(s[j] - mx);
                    sum += s[j];
                }
                for (int c = 0; c < 64; c++) {
                    double ref = 0;
                    for (int64_t j = 0; j < T; j++) {
                        const double p = bf16 ? bfr(s[j] / sum) : s[j] / sum;
                        ref += p * op(v[(b * T + j) * ld + h * 64 + c], bf16);
                    }
                    rel_add(&e, o[(b * T + i) * ld + h * 64 + c], ref);
                }
            }
        }
    }
    free(s);
    return rel_value(&e);
}

static void check_attention(int64_t H, int64_t T, int64_t B, int threads, const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16 && !ops->x3;
    /* BF16x3: both products split on AMX tiles (F32-grade), F32 without AMX */
    const bool x3 = ops && ops->bf16 && ops->x3 && cr_amx_cpu_available();
    struct ggml_init_params ip = {(size_t)(3 * H * 64 * T * B * 2 * sizeof(float)) + (16u << 20), NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    unsigned seed = (unsigned)(H * 1000 + T * 10 + B);
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, H * 64, T, B);
    struct ggml_tensor *k = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, H * 64, T, B);
    struct ggml_tensor *v = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, H * 64, T, B);
    /* scores of a few units, as in a trained model: a peaked softmax */
    fill(q, 6.0f, &seed);
    fill(k, 6.0f, &seed);
    fill(v, 2.0f, &seed);
    struct ggml_tensor *o = cr_attention_cpu(ctx, q, k, v, ops);
    CHECK(o && ggml_are_same_shape(o, q), "attention output shape");
    if (!o) {
        ggml_free(ctx);
        return;
    }
    compute(ctx, o, threads);
    const double e = attention_error(q->data, k->data, v->data, o->data, H, T, B, bf16, NULL, NULL, NULL);
    /* F32 products of 64 and of T terms: a few ulps per output. BF16: against
       its own rounded operands the same, but for the odd softmax weight whose
       F32 and double values round to neighbouring bfloat16s. */
    CHECK(e < (bf16 ? 1e-4 : x3 ? 2e-5 : 2e-6), "attention%s H=%lld T=%lld B=%lld threads=%d: relative L2 %.3g",
          bf16 ? " bf16" : x3 ? " bf16x3" : "", (long long)H, (long long)T, (long long)B, threads, e);
    if (bf16 && T >= 16) {
        /* and against the exact result it is as far as bfloat16's rounding puts it */
        const double ex = attention_error(q->data, k->data, v->data, o->data, H, T, B, false, NULL, NULL, NULL);
        CHECK(ex > 3e-4 && ex < 2e-2, "attention bf16 H=%lld T=%lld: relative L2 to the exact result %.3g",
              (long long)H, (long long)T, ex);
    }
    ggml_free(ctx);
}

/* cr_relpos_attention_cpu against attention_error's reference with positions. */
static void check_relpos(int64_t H, int64_t T, int64_t B, int64_t extra, int threads, const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16 && !ops->x3; /* BF16x3: attention in F32 */
    const int64_t D = H * 64, L = 2 * T - 1 + extra;
    struct ggml_init_params ip = {(size_t)((4 * D * T * B + D * L + 2 * D) * sizeof(float)) + (16u << 20), NULL,
                                  false};
    struct ggml_context *ctx = ggml_init(ip);
    unsigned seed = (unsigned)(H * 100 + T * 7 + B + extra);
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, T, B);
    struct ggml_tensor *k = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, T, B);
    struct ggml_tensor *v = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, T, B);
    struct ggml_tensor *p = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D, L);
    struct ggml_tensor *u = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, H);
    struct ggml_tensor *bv = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, H);
    fill(q, 4.0f, &seed);
    fill(k, 4.0f, &seed);
    fill(v, 2.0f, &seed);
    fill(p, 4.0f, &seed);
    fill(u, 1.0f, &seed);
    fill(bv, 1.0f, &seed);
    struct ggml_tensor *o = cr_relpos_attention_cpu(ctx, q, k, v, p, u, bv, ops);
    CHECK(o && ggml_are_same_shape(o, q), "relpos output shape");
    if (!o) {
        ggml_free(ctx);
        return;
    }
    compute(ctx, o, threads);
    const double err = attention_error(q->data, k->data, v->data, o->data, H, T, B, bf16, p->data, u->data, bv->data);
    CHECK(err < (bf16 ? 1e-4 : 2e-6), "relpos attention%s H=%lld T=%lld B=%lld: relative L2 %.3g",
          bf16 ? " bf16" : "", (long long)H, (long long)T, (long long)B, err);
    ggml_free(ctx);
}

/* cr_linear_cpu against x W^T + b in double, x [K, N1, N2]. */
static void check_linear(int64_t K, int64_t M, int64_t N1, int64_t N2, bool bias, int threads,
                         const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16 && !ops->x3, x3 = ops && ops->bf16 && ops->x3; /* x3: F32-grade */
    cr_cpu_ops own = check_ops(ops);
    struct ggml_init_params ip = {(size_t)((K * N1 * N2 + K * M + M + M * N1 * N2) * sizeof(float)) + (1u << 20),
                                  NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    unsigned seed = (unsigned)(K * 7 + M * 13 + N1 * 17 + N2);
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, N1, N2);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
    struct ggml_tensor *b = bias ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, M) : NULL;
    fill_operands(x, w, b, &seed);
    struct ggml_tensor *y = cr_linear_cpu(ctx, x, w, b, &own);
    CHECK(y && y->ne[0] == M && y->ne[1] == N1 && y->ne[2] == N2, "linear output shape");
    if (!y) {
        cr_packs_free(own.packs);
        ggml_free(ctx);
        return;
    }
    compute(ctx, y, threads);
    const float *xd = x->data, *wd = w->data, *yd = y->data;
    rel_l2 r = {0, 0}, rx = {0, 0}; /* to the product of the operands as rounded, and as given */
    for (int64_t n = 0; n < N1 * N2; n++) {
        for (int64_t m = 0; m < M; m++) {
            double ref = b ? ((const float *)b->data)[m] : 0.0, exact = ref;
            for (int64_t k = 0; k < K; k++) {
                ref += op(xd[n * K + k], bf16) * op(wd[m * K + k], bf16);
                exact += (double)xd[n * K + k] * wd[m * K + k];
            }
            rel_add(&r, yd[n * M + m], ref);
            rel_add(&rx, yd[n * M + m], exact);
        }
    }
    const double e = rel_value(&r), ex = rel_value(&rx);
    /* BF16x3: three BF16 products of split operands, about 2^-16 relative (packed weights;
       per call, F32) */
    CHECK(e < (x3 ? 2e-5 : 1e-6), "linear%s K=%lld M=%lld N=%lldx%lld bias=%d threads=%d: relative L2 %.3g",
          x3 ? " bf16x3" : bf16 ? " bf16" : "",
          (long long)K, (long long)M, (long long)N1, (long long)N2, (int)bias, threads, e);
    CHECK(!bf16 || K < 16 || (ex > 3e-4 && ex < 2e-2), "linear bf16 K=%lld M=%lld: relative L2 to the exact %.3g",
          (long long)K, (long long)M, ex);
    cr_packs_free(own.packs);
    ggml_free(ctx);
}

/* cr_conv1d_cpu against the direct sum in double, x [C, T, B], w [K, C, M]. */
static void check_conv(int64_t C, int64_t T, int64_t B, int64_t K, int64_t M, int d, int pl, int pr, bool bias,
                       int threads, const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16 && !ops->x3, x3 = ops && ops->bf16 && ops->x3; /* x3: F32-grade */
    cr_cpu_ops own = check_ops(ops);
    struct ggml_init_params ip = {(size_t)((C * T * B + K * C * M + M + M * (T + pl + pr) * B) * sizeof(float)) +
                                      (1u << 20),
                                  NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    unsigned seed = (unsigned)(C * 3 + T * 5 + K * 7 + M * 11 + d);
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, T, B);
    struct ggml_tensor *w = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, C, M);
    struct ggml_tensor *b = bias ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, M) : NULL;
    fill_operands(x, w, b, &seed);
    const int64_t To = T + pl + pr - (int64_t)d * (K - 1);
    struct ggml_tensor *y = cr_conv1d_cpu(ctx, x, w, b, d, pl, pr, &own);
    CHECK(y && y->ne[0] == M && y->ne[1] == To && y->ne[2] == B, "conv output shape");
    if (!y) {
        cr_packs_free(own.packs);
        ggml_free(ctx);
        return;
    }
    compute(ctx, y, threads);
    const float *xd = x->data, *wd = w->data, *yd = y->data;
    rel_l2 r = {0, 0};
    for (int64_t bb = 0; bb < B; bb++) {
        for (int64_t t = 0; t < To; t++) {
            for (int64_t m = 0; m < M; m++) {
                double ref = b ? ((const float *)b->data)[m] : 0.0;
                for (int64_t k = 0; k < K; k++) {
                    const int64_t s = t + k * d - pl;
                    for (int64_t c = 0; s >= 0 && s < T && c < C; c++) {
                        ref += op(xd[(bb * T + s) * C + c], bf16) * op(wd[(m * C + c) * K + k], bf16);
                    }
                }
                rel_add(&r, yd[(bb * To + t) * M + m], ref);
            }
        }
    }
    const double e = rel_value(&r);
    CHECK(e < (x3 ? 2e-5 : 1e-6), "conv%s C=%lld T=%lld B=%lld K=%lld M=%lld d=%d pad %d/%d: relative L2 %.3g",
          x3 ? " bf16x3" : bf16 ? " bf16" : "", (long long)C,
          (long long)T, (long long)B, (long long)K, (long long)M, d, pl, pr, e);
    cr_packs_free(own.packs);
    ggml_free(ctx);
}

/* An F32 product of few rows reads the context's packed panels (LN_MIN_ROWS), one of
   many rows packs per call: the same kernel, so the same bits (streamed == offline). */
static void check_f32_packed_bitwise(int64_t K, int64_t M, int64_t N, int64_t C, int64_t T, int64_t taps) {
    struct ggml_init_params ip = {(size_t)(4 * (K * N + K * M + 2 * M * N + C * T + taps * C * M + 2 * M * T)) +
                                      (1u << 20),
                                  NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    unsigned seed = (unsigned)(K + M + N);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
    struct ggml_tensor *xc = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, T, 1);
    struct ggml_tensor *wc = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, taps, C, M);
    fill_operands(x, w, NULL, &seed);
    fill_operands(xc, wc, NULL, &seed);
    cr_cpu_ops packed = {.bf16 = false, .packs = cr_packs_new()};
    struct ggml_tensor *a = cr_linear_cpu(ctx, x, w, NULL, &packed), *b = cr_linear_cpu(ctx, x, w, NULL, NULL);
    struct ggml_tensor *ca = cr_conv1d_cpu(ctx, xc, wc, NULL, 1, (int)taps - 1, 0, &packed);
    struct ggml_tensor *cb = cr_conv1d_cpu(ctx, xc, wc, NULL, 1, (int)taps - 1, 0, NULL);
    CHECK(a && b && ca && cb && cr_packs_bytes(packed.packs) > 0, "F32 packed products built (K=%lld N=%lld)",
          (long long)K, (long long)N);
    if (a && b && ca && cb) {
        compute(ctx, a, 2);
        compute(ctx, b, 1);
        compute(ctx, ca, 1);
        compute(ctx, cb, 2);
        CHECK(memcmp(a->data, b->data, ggml_nbytes(a)) == 0, "F32 linear K=%lld M=%lld N=%lld: packed != per call",
              (long long)K, (long long)M, (long long)N);
        CHECK(memcmp(ca->data, cb->data, ggml_nbytes(ca)) == 0, "F32 conv C=%lld T=%lld: packed != per call",
              (long long)C, (long long)T);
    }
    cr_packs_free(packed.packs);
    ggml_free(ctx);
}

/* BF16 from packed weights (the AMX tiles where the CPU has them, blocks of 16 rows):
   a row's product is the same bits alone as among N rows, a sequence's convolution
   the same alone as in a batch of B (batched streams == streams decoded alone). */
static void check_bf16_packed_rows(int64_t K, int64_t M, int64_t N, int64_t C, int64_t T, int64_t B, int64_t taps,
                                   bool x3) {
    struct ggml_init_params ip = {(size_t)(8 * (K * N + K * M + M * N + C * T * B + taps * C * M + M * T * B)) +
                                      (1u << 22),
                                  NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    unsigned seed = (unsigned)(K + M + N + C);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, M);
    struct ggml_tensor *bias = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, M);
    struct ggml_tensor *xc = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, T, B);
    struct ggml_tensor *wc = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, taps, C, M);
    fill_operands(x, w, bias, &seed);
    fill_operands(xc, wc, NULL, &seed);
    cr_cpu_ops packed = {.bf16 = true, .packs = cr_packs_new(), .x3 = x3};
    struct ggml_tensor *all = cr_linear_cpu(ctx, x, w, bias, &packed);
    struct ggml_tensor *call = cr_conv1d_cpu(ctx, xc, wc, NULL, 2, (int)(2 * (taps - 1)), 0, &packed);
    CHECK(all && call, "bf16 packed products built");
    if (!all || !call) {
        cr_packs_free(packed.packs);
        ggml_free(ctx);
        return;
    }
    compute(ctx, all, 2);
    compute(ctx, call, 2);
    const int64_t rows[] = {0, N / 2, N - 1};
    for (size_t i = 0; i < 3; i++) {
        struct ggml_tensor *xr = ggml_view_2d(ctx, x, K, 1, x->nb[1], (size_t)rows[i] * x->nb[1]);
        struct ggml_tensor *one = cr_linear_cpu(ctx, ggml_cont(ctx, xr), w, bias, &packed);
        compute(ctx, one, 1);
        CHECK(memcmp(one->data, (const float *)all->data + rows[i] * M, (size_t)M * sizeof(float)) == 0,
              "bf16 packed linear K=%lld M=%lld: row %lld alone != among %lld", (long long)K, (long long)M,
              (long long)rows[i], (long long)N);
    }
    for (int64_t b = 0; b < B; b++) {
        struct ggml_tensor *xs = ggml_view_3d(ctx, xc, C, T, 1, xc->nb[1], xc->nb[2], (size_t)b * xc->nb[2]);
        struct ggml_tensor *one = cr_conv1d_cpu(ctx, ggml_cont(ctx, xs), wc, NULL, 2, (int)(2 * (taps - 1)), 0, &packed);
        compute(ctx, one, 1);
        CHECK(memcmp(one->data, (const char *)call->data + b * call->nb[2], ggml_nbytes(one)) == 0,
              "bf16 packed conv C=%lld T=%lld: sequence %lld alone != in a batch of %lld", (long long)C, (long long)T,
              (long long)b, (long long)B);
    }
    cr_packs_free(packed.packs);
    ggml_free(ctx);
}

/* Every shape class of the kernels, in F32 (ops NULL) or in the BF16 mode
   (with weights packed per call, or once into ops->packs). */
static void check_products(const cr_cpu_ops *bf16);

static void check_all(const cr_cpu_ops *bf16) {
    const int64_t Ts[] = {1, 5, 6, 7, 16, 17, 47, 48, 49, 64, 65, 97, 130, 333};
    for (size_t i = 0; i < sizeof(Ts) / sizeof(Ts[0]); i++) {
        check_attention(2, Ts[i], 1, 1, bf16);
        check_attention(1, Ts[i], 3, 3, bf16);
    }
    check_attention(8, 650, 2, 2, bf16);
    /* relative positions: every block position against the band of the table,
       a table longer than 2T-1 (the encoder's is padded) */
    const int64_t Tr[] = {1, 2, 5, 47, 48, 49, 97, 130};
    for (size_t i = 0; i < sizeof(Tr) / sizeof(Tr[0]); i++) {
        check_relpos(2, Tr[i], 2, (int64_t)(i % 3) * 5, 1 + (int)(i % 2), bf16);
    }
    check_relpos(8, 325, 1, 3, 2, bf16);
    check_products(bf16);
}

/* the linear layers and convolutions (the F32 ones also on AVX2 + FMA CPUs) */
static void check_products(const cr_cpu_ops *bf16) {
    const int64_t Ks[] = {1, 3, 64, 250}, Ms[] = {16, 48, 64, 80, 272}, Ns[] = {1, 5, 7, 96, 97, 200};
    for (size_t i = 0; i < 4; i++) {
        for (size_t j = 0; j < 5; j++) {
            for (size_t n = 0; n < 6; n++) {
                check_linear(Ks[i], Ms[j], Ns[n], 1, (i + j + n) % 2 == 0, 1 + (int)((i + n) % 3), bf16);
            }
        }
    }
    check_linear(256, 512, 650, 2, true, 2, bf16);
    check_linear(1024, 256, 33, 3, false, 2, bf16);
    /* "same" convolutions as the vocoder's, causal ones as the estimator's,
       lengths around the 96-frame blocks and shorter than the kernel; odd
       channel counts end their pairs with a zero in the BF16 mode */
    const int64_t Tc[] = {1, 2, 7, 95, 96, 97, 200};
    for (size_t i = 0; i < sizeof(Tc) / sizeof(Tc[0]); i++) {
        check_conv(5, Tc[i], 2, 3, 16, 1, 1, 1, true, 2, bf16);
        check_conv(8, Tc[i], 1, 11, 48, 5, 25, 25, i % 2 == 0, 3, bf16);
        check_conv(16, Tc[i], 3, 3, 80, 1, 2, 0, true, 1, bf16);
        check_conv(3, Tc[i], 1, 7, 64, 3, 9, 9, false, 2, bf16);
    }
    check_conv(256, 300, 2, 7, 256, 3, 9, 9, true, 2, bf16);
}

/* cr_elu_cpu against expm1 in double over [-100, 20] (both branches, the clamp, the
   polynomial's whole range), and against ggml's ELU (libm's expm1f) in the graph. */
static void check_elu(void) {
    const int64_t n = 120001;
    struct ggml_init_params ip = {(size_t)(3 * n * sizeof(float)) + (1u << 20), NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    float *xd = x->data;
    for (int64_t i = 0; i < n; i++) {
        xd[i] = -100.0f + 120.0f * (float)i / (float)(n - 1);
    }
    xd[n / 2] = 0.0f;
    xd[n / 2 + 1] = -1e-6f;
    xd[n / 2 + 2] = -1e-30f;
    xd[n / 2 + 3] = NAN; /* stays NaN, as with expm1f */
    struct ggml_tensor *y = cr_elu_cpu(ctx, x), *g = ggml_elu(ctx, x);
    compute(ctx, y, 2);
    compute(ctx, g, 1);
    double worst = 0.0, worst_ggml = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double v = xd[i], ref = v > 0.0 ? v : expm1(v);
        const double got = ((const float *)y->data)[i], other = ((const float *)g->data)[i];
        if (isnan(v)) {
            CHECK(isnan(got), "ELU of NaN: %g", got);
            continue;
        }
        const double tol = fabs(ref) > 1e-30 ? fabs(ref) : 1e-30;
        worst = fmax(worst, fabs(got - ref) / tol);
        worst_ggml = fmax(worst_ggml, fabs(got - other) / tol);
    }
    CHECK(worst < 4e-7, "ELU: relative error to expm1 %.3g", worst);
    CHECK(worst_ggml < 5e-7, "ELU: relative difference to ggml's ELU %.3g", worst_ggml);
    ggml_free(ctx);
}

/* cr_group_norm_cpu and cr_dwconv_cpu against their definitions in double, x [C, T, B]
   with an offset (GroupNorm's mean must matter), sequence 1 of 2 shorter than T (the
   mask: its padded frames give b, and its statistics leave them out); each sequence
   alone equals it in the batch, bitwise. */
static void check_group_norm_dwconv(int64_t C, int64_t T, int G, int64_t K, int threads) {
    const int64_t B = 2, len1 = T / 2 + 1, cg = C / G;
    struct ggml_init_params ip = {(size_t)(8 * C * T * B + 4 * K * C + 4 * 4 * C + 4 * T * B) * sizeof(float) +
                                      (1u << 20),
                                  NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    unsigned seed = (unsigned)(C + T + G + K);
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, T, B);
    struct ggml_tensor *w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, C), *b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, C);
    struct ggml_tensor *k = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, C, K);
    struct ggml_tensor *mask = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, T, B);
    fill(x, 2.0f, &seed);
    fill(w, 1.0f, &seed);
    fill(b, 1.0f, &seed);
    fill(k, 1.0f, &seed);
    float *xd = x->data, *md = mask->data;
    for (int64_t i = 0; i < C * T * B; i++) {
        xd[i] += 3.0f;
    }
    for (int64_t t = 0; t < T; t++) {
        md[t] = 1.0f;
        md[T + t] = t < len1 ? 1.0f : 0.0f;
    }
    struct ggml_tensor *gn = cr_group_norm_cpu(ctx, x, G, w, b, mask, 1e-6f);
    struct ggml_tensor *dw = cr_dwconv_cpu(ctx, x, k, b, 1, (int)((K - 1) / 2), (int)((K - 1) / 2));
    CHECK(gn && dw, "group norm and depthwise conv built");
    if (!gn || !dw) {
        ggml_free(ctx);
        return;
    }
    compute(ctx, gn, threads);
    compute(ctx, dw, threads);
    rel_l2 rg = {0, 0}, rd = {0, 0};
    const float *wd = w->data, *bd = b->data, *kd = k->data, *gd = gn->data, *dd = dw->data;
    for (int64_t bb = 0; bb < B; bb++) {
        const int64_t n = bb == 0 ? T : len1;
        for (int g = 0; g < G; g++) {
            double s = 0, v = 0;
            for (int64_t t = 0; t < n; t++) {
                for (int64_t c = g * cg; c < (g + 1) * cg; c++) {
                    s += xd[(bb * T + t) * C + c];
                }
            }
            const double mean = s / (double)(n * cg);
            for (int64_t t = 0; t < n; t++) {
                for (int64_t c = g * cg; c < (g + 1) * cg; c++) {
                    v += (xd[(bb * T + t) * C + c] - mean) * (xd[(bb * T + t) * C + c] - mean);
                }
            }
            const double inv = 1.0 / sqrt(v / (double)(n * cg) + 1e-6);
            for (int64_t t = 0; t < T; t++) {
                for (int64_t c = g * cg; c < (g + 1) * cg; c++) {
                    const double ref = t < n ? (xd[(bb * T + t) * C + c] - mean) * inv * wd[c] + bd[c] : bd[c];
                    rel_add(&rg, gd[(bb * T + t) * C + c], ref);
                }
            }
        }
        for (int64_t t = 0; t < T; t++) {
            for (int64_t c = 0; c < C; c++) {
                double ref = bd[c];
                for (int64_t j = 0; j < K; j++) {
                    const int64_t s = t + j - (K - 1) / 2;
                    ref += s >= 0 && s < T ? (double)kd[j * C + c] * xd[(bb * T + s) * C + c] : 0.0;
                }
                rel_add(&rd, dd[(bb * T + t) * C + c], ref);
            }
        }
    }
    CHECK(rel_value(&rg) < 1e-6, "group norm C=%lld T=%lld G=%d: relative L2 %.3g", (long long)C, (long long)T, G,
          rel_value(&rg));
    CHECK(rel_value(&rd) < 1e-6, "depthwise conv C=%lld T=%lld K=%lld: relative L2 %.3g", (long long)C, (long long)T,
          (long long)K, rel_value(&rd));
    struct ggml_tensor *x1 = ggml_view_3d(ctx, x, C, T, 1, x->nb[1], x->nb[2], x->nb[2]);
    struct ggml_tensor *m1 = ggml_view_3d(ctx, mask, 1, T, 1, mask->nb[1], mask->nb[2], mask->nb[2]);
    struct ggml_tensor *gn1 = cr_group_norm_cpu(ctx, ggml_cont(ctx, x1), G, w, b, ggml_cont(ctx, m1), 1e-6f);
    struct ggml_tensor *dw1 = cr_dwconv_cpu(ctx, ggml_cont(ctx, x1), k, b, 1, (int)((K - 1) / 2), (int)((K - 1) / 2));
    compute(ctx, gn1, 1);
    compute(ctx, dw1, 1);
    CHECK(memcmp(gn1->data, gd + T * C, (size_t)(T * C) * sizeof(float)) == 0, "group norm: sequence alone != batched");
    CHECK(memcmp(dw1->data, dd + T * C, (size_t)(T * C) * sizeof(float)) == 0, "dwconv: sequence alone != batched");
    ggml_free(ctx);
}

/* cr_norm_rows, LayerNorm (with and without a bias, with and without a Mish after it) and
   RMSNorm, against double over rows with an offset; a row alone equals it among the
   others, bitwise. */
static void check_norm(int64_t C, int64_t rows, bool rms, bool bias, bool mish, int threads) {
    struct ggml_init_params ip = {(size_t)(4 * C * rows + 4 * C) * sizeof(float) + (1u << 20), NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    unsigned seed = (unsigned)(C + rows + rms);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, C, rows);
    struct ggml_tensor *w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, C), *b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, C);
    fill(x, 2.0f, &seed);
    fill(w, 1.0f, &seed);
    fill(b, 1.0f, &seed);
    float *xd = x->data;
    for (int64_t i = 0; i < C * rows; i++) {
        xd[i] += 0.5f;
    }
    struct ggml_tensor *y = cr_norm_rows(ctx, x, w, bias ? b : NULL, 1e-6f, rms, mish);
    CHECK(y != NULL, "norm built");
    if (!y) {
        ggml_free(ctx);
        return;
    }
    compute(ctx, y, threads);
    rel_l2 r = {0, 0};
    const float *wd = w->data, *bd = b->data, *yd = y->data;
    for (int64_t i = 0; i < rows; i++) {
        double s = 0, q = 0;
        for (int64_t c = 0; c < C; c++) {
            s += xd[i * C + c];
        }
        const double mean = rms ? 0.0 : s / (double)C;
        for (int64_t c = 0; c < C; c++) {
            q += (xd[i * C + c] - mean) * (xd[i * C + c] - mean);
        }
        const double inv = 1.0 / sqrt(q / (double)C + 1e-6);
        for (int64_t c = 0; c < C; c++) {
            const double v = (xd[i * C + c] - mean) * inv * wd[c] + (bias ? bd[c] : 0.0);
            rel_add(&r, yd[i * C + c], mish ? v * tanh(v > 20.0 ? v : log1p(exp(v))) : v);
        }
    }
    CHECK(rel_value(&r) < 1e-6, "%s%s C=%lld rows=%lld: relative L2 %.3g", rms ? "RMSNorm" : "LayerNorm",
          mish ? " + Mish" : "", (long long)C, (long long)rows, rel_value(&r));
    struct ggml_tensor *one = cr_norm_rows(ctx, ggml_cont(ctx, ggml_view_2d(ctx, x, C, 1, x->nb[1], x->nb[1] * (rows - 1))),
                                           w, bias ? b : NULL, 1e-6f, rms, mish);
    compute(ctx, one, 1);
    CHECK(memcmp(one->data, yd + (rows - 1) * C, (size_t)C * sizeof(float)) == 0, "norm: a row alone != among others");
    ggml_free(ctx);
}

int main(void) {
    check_elu();
    check_norm(768, 37, false, true, false, 2);
    check_norm(1024, 5, true, false, false, 3);
    check_norm(17, 1, false, false, false, 1);
    check_norm(256, 23, false, true, true, 2);
    check_group_norm_dwconv(768, 57, 32, 7, 2);
    check_group_norm_dwconv(64, 1, 4, 7, 1);
    check_group_norm_dwconv(48, 9, 3, 3, 3);
    if (!cr_f32_products_cpu_available()) {
        printf("test_ops_cpu: no AVX-512 or AVX2 + FMA on this CPU: the fused kernels are not used; "
               "%d checks, %d failures\n", g_checks, g_failures);
        return g_failures ? 1 : 0;
    }
    /* F32, on AVX-512 or on AVX2 + FMA (ops_avx2_*.c) */
    check_all(NULL);
    cr_cpu_ops f32_packed = {.bf16 = false, .packs = cr_packs_new()}; /* products of few rows from packed panels */
    check_all(&f32_packed);
    cr_packs_free(f32_packed.packs);
    check_f32_packed_bitwise(512, 2048, 2, 64, 9, 7);
    check_f32_packed_bitwise(250, 80, 97, 16, 50, 3);
    if (!cr_attention_cpu_available()) {
        printf("test_ops_cpu: no AVX-512 on this CPU: the F32 products and attention on AVX2, no BF16; "
               "%d checks, %d failures\n", g_checks, g_failures);
        return g_failures ? 1 : 0;
    }
    if (cr_bf16_cpu_available()) {
        const cr_cpu_ops per_call = {.bf16 = true};
        cr_cpu_ops packed = {.bf16 = true, .packs = cr_packs_new()};
        cr_cpu_ops x3 = {.bf16 = true, .packs = cr_packs_new(), .x3 = true}; /* BF16x3 */
        check_all(&per_call);
        check_all(&packed);
        check_all(&x3);
        cr_packs_free(packed.packs);
        cr_packs_free(x3.packs);
        for (int i = 0; i < 2; i++) {
            check_bf16_packed_rows(250, 80, 97, 33, 50, 3, 3, i == 1);
            check_bf16_packed_rows(1024, 256, 40, 256, 120, 2, 7, i == 1);
        }
        printf("test_ops_cpu: BF16 products of packed weights %s\n",
               cr_amx_cpu_available() ? "and the BF16 attention on AMX tiles" : "and the BF16 attention on AVX512-BF16 (no AMX, or CODECRT_NO_AMX)");
    } else {
        printf("test_ops_cpu: no AVX512-BF16 on this CPU, the BF16 mode is not checked\n");
    }
    /* shapes the kernel does not take come back NULL (the caller uses ggml_mul_mat) */
    struct ggml_init_params ip = {1u << 20, NULL, true};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 4);
    CHECK(!cr_linear_cpu(ctx, x, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 20), NULL, NULL), "M not a multiple of 16");
    struct ggml_tensor *h = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 5, 2);
    CHECK(!cr_relpos_attention_cpu(ctx, h, h, h, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 9), h, h, NULL),
          "relpos: biases of the wrong size");
    CHECK(!cr_relpos_attention_cpu(ctx, h, h, h, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 8),
                                   ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64),
                                   ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64), NULL),
          "relpos: a position table shorter than 2T-1");
    CHECK(!cr_attention_cpu(ctx, h, h, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 6, 2), NULL), "attention shapes differ");
    CHECK(!cr_attention_cpu(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 48, 5, 2),
                            ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 48, 5, 2),
                            ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 48, 5, 2), NULL),
          "attention width not a multiple of 64");
    CHECK(!cr_conv1d_cpu(ctx, x, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 3, 8, 18), NULL, 1, 1, 1, NULL),
          "conv output channels not a multiple of 16");
    CHECK(!cr_conv1d_cpu(ctx, x, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 9, 8, 16), NULL, 1, 0, 0, NULL),
          "conv kernel longer than its padded input");
    CHECK(!cr_linear_cpu(ctx, x, ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 8, 16), NULL, NULL), "F16 weights");
    CHECK(!cr_linear_cpu(ctx, ggml_transpose(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 8)),
                         ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 16), NULL, NULL),
          "non-contiguous x");
    ggml_free(ctx);
    printf("test_ops_cpu: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
