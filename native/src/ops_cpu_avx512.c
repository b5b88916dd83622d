/*
 * ops_cpu_avx512.c: the S3Gen decoders' products for the CPU backend on
 * x86-64 CPUs with AVX-512: multi-head self-attention, linear layers and
 * stride-1 convolutions, all on one register-tiled FMA loop, in F32 or (on
 * CPUs with AVX512-BF16, CODECRT_PRECISION_BF16) with bfloat16 operands.
 *
 * Attention. The S3Gen flow estimator spends about half of its time in
 * attention (56 blocks of 8 heads over every frame of prompt and speech, with
 * guidance a batch of 2); ggml's tiled CPU flash attention reaches about 60
 * GFLOP/s on this shape on 2 Zen 4 cores and a composition of ggml products
 * 17 to 45 (its GEMM leaves the fast path when T is not a multiple of 16).
 * This kernel keeps one query block's scores in cache and runs both products
 * as register-tiled FMA loops: about 155 GFLOP/s on the same cores, with the
 * same F32 rounding as ggml's (relative error to a double-precision reference
 * 9e-7 for both at T = 650).
 *
 * The work is split over (sequence, head, block of 48 queries). Per block:
 *   S[48, Tp] = scale * Q[48, 64] K^T   (K packed as KT [64, Tp], Tp = T to 16)
 *   P = exp(S - rowmax), l = rowsum(P)  (all keys at once: no online rescale)
 *   O[48, 64] = (P V) / l
 * Each thread packs KT once per head it visits and holds KT and S in a scratch
 * of (64 + 48) * Tp floats, about 300 KB at T = 650: in L2.
 *
 * Linear layers. ggml's F32 products (llamafile's tinyBLAS) reach 80 to 108
 * GFLOP/s on these shapes here; the same register tile on a packed weight panel
 * reaches about 150 (bench: native/tests/test_ops_cpu.c prints both), with the
 * bias added in the tile's epilogue instead of in a pass of its own.
 *
 * BF16 (the section of that name below): the same tiles on vdpbf16ps, which
 * does two multiply-adds per F32 lane, with operands packed as bfloat16 pairs
 * along the summed dimension; 1.5x (Turbo) to 1.9x (original) the F32 speed
 * on S3Gen end to end.
 *
 * Elsewhere (other CPUs, other backends) the graphs use ggml's ops;
 * cr_attention_cpu_available() and cr_bf16_cpu_available() say which.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && !defined(CODECRT_NO_AVX512)
#define CR_OPS_AVX512 1
#include <immintrin.h>
#endif

#define AT_D 64  /* head dim */
#define AT_QB 48 /* queries per block: 8 tiles of 6 rows */
#define AT_R 6   /* rows per register tile: 6 x 4 accumulators of 16 floats */
#define LN_PANEL 64 /* linear: output columns per packed weight panel */
#define LN_NB 96    /* linear: rows of x per work item (16 register tiles) */

/* The attention's operands for one head of one sequence: q, k, v (and o) at
   the head's first channel, rows ld apart; for relative-position attention
   also p, the head's table of positions T-1 .. -(T-1) (rows ld apart), and the
   biases u and bv (64 each); p NULL for plain attention. */
typedef struct at_head {
    const float *q, *k, *v, *p, *u, *bv;
    float *o;
    int64_t ld, T;
} at_head;

/* Score of query i against key j, unscaled: q.k, or (q+u).k + (q+bv).p[T-1-i+j]. */
static float at_score_plain(const at_head *h, int64_t i, int64_t j) {
    const float *qi = h->q + i * h->ld, *kj = h->k + j * h->ld;
    float s = 0.0f;
    if (!h->p) {
        for (int d = 0; d < AT_D; d++) {
            s += qi[d] * kj[d];
        }
        return s;
    }
    const float *pm = h->p + (h->T - 1 - i + j) * h->ld;
    float t = 0.0f;
    for (int d = 0; d < AT_D; d++) {
        s += (qi[d] + h->u[d]) * kj[d];
        t += (qi[d] + h->bv[d]) * pm[d];
    }
    return s + t;
}

/*
 * Plain path for the one case the fast path cannot take: no scratch memory.
 * Two passes over the keys per query (max, then exp-sum and the weighted sum of
 * V into the output row itself).
 */
static void at_rows_plain(const at_head *h, int64_t i0, int64_t nq, float scale) {
    const int64_t ld = h->ld, T = h->T;
    for (int64_t i = i0; i < i0 + nq; i++) {
        float *oi = h->o + i * ld;
        float mx = -INFINITY;
        for (int64_t j = 0; j < T; j++) {
            mx = fmaxf(mx, at_score_plain(h, i, j) * scale);
        }
        float l = 0.0f;
        memset(oi, 0, AT_D * sizeof(float));
        for (int64_t j = 0; j < T; j++) {
            const float p = expf(at_score_plain(h, i, j) * scale - mx);
            l += p;
            for (int d = 0; d < AT_D; d++) {
                oi[d] += p * h->v[j * ld + d];
            }
        }
        for (int d = 0; d < AT_D; d++) {
            oi[d] /= l;
        }
    }
}

/* Per-thread scratch of the attention kernels (floats or pairs). */
typedef struct at_scratch {
    float *kt, *pt; /* F32: keys [64, Tp], positions [64, at_pos_cols(T)]; BF16: pairs, half the rows */
    uint32_t *vp;   /* BF16: values [Tp/2, 64] in pairs */
    float *s, *bd;  /* scores [48, Tp]; the position band's [48, Tp + 64] */
    float *qa, *qb; /* q + u, q + bv [48, 64] */
    uint32_t *qs, *qs2, *ps; /* BF16: those (or q) [48, 32] in pairs; P [48, Tp/2] */
} at_scratch;

static inline int64_t at_round16(int64_t n) { return (n + 15) & ~(int64_t)15; }
/* Columns of a head's packed position table: the band of block rows reads up
   to column 2T + 14 (see at_block). */
static inline int64_t at_pos_cols(int64_t T) { return at_round16(2 * T + 15); }

#ifdef CR_OPS_AVX512

#define AT_AVX512 __attribute__((target("avx512f,fma")))
#define AT_INLINE static inline __attribute__((always_inline)) AT_AVX512

/* CALL(R) for R = min(n, AT_R), a constant in each branch: the tiles unroll on
   their row count, so each remainder of a row loop gets its own instance. */
#define AT_ROWS(n, CALL)                                                                                             \
    do {                                                                                                             \
        switch ((n) < AT_R ? (int)(n) : AT_R) {                                                                      \
        case 6: CALL(6); break;                                                                                      \
        case 5: CALL(5); break;                                                                                      \
        case 4: CALL(4); break;                                                                                      \
        case 3: CALL(3); break;                                                                                      \
        case 2: CALL(2); break;                                                                                      \
        default: CALL(1); break;                                                                                     \
        }                                                                                                            \
    } while (0)

/* e^x for x <= 0 (softmax arguments; below -87 it returns about 1e-38):
   Cody-Waite reduction by ln 2, Taylor polynomial of degree 7 on |r| <= 0.35
   (truncation below 2e-8 relative), scaled by 2^n. */
AT_INLINE __m512 at_exp(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/*
 * The register tile every kernel here is built on: C = sum over taps of A_t B_t
 * for R rows (R <= 6) and 16*NC columns (NC <= 4). Per k, NC loads of B's row,
 * R broadcasts of A, R*NC FMAs into 24 of the 32 vector registers. A [R, K]
 * rows lda apart, B [K, 16*NC] rows ldb apart (packed: its 16*NC columns
 * contiguous); tap t reads A + t*atap and B + t*btap (a convolution's taps: the
 * input shifted by the dilation, the kernel's next slice). C[r][c] =
 * scale * acc + bias[c] (bias may be NULL).
 */
AT_INLINE void at_tile(int R, int NC, const float *a, int64_t lda, int64_t atap, const float *b, int64_t ldb,
                       int64_t btap, int64_t K, int64_t taps, float *c, int64_t ldc, float scale, const float *bias) {
    __m512 acc[AT_R][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            acc[r][j] = _mm512_setzero_ps();
        }
    }
    for (int64_t t = 0; t < taps; t++) {
        const float *at = a + t * atap, *bt = b + t * btap;
        for (int64_t k = 0; k < K; k++) {
            __m512 bv[4];
#pragma GCC unroll 4
            for (int j = 0; j < NC; j++) {
                bv[j] = _mm512_loadu_ps(bt + k * ldb + 16 * j);
            }
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                const __m512 ab = _mm512_set1_ps(at[r * lda + k]);
#pragma GCC unroll 4
                for (int j = 0; j < NC; j++) {
                    acc[r][j] = _mm512_fmadd_ps(ab, bv[j], acc[r][j]);
                }
            }
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 bs[4];
#pragma GCC unroll 4
    for (int j = 0; j < NC; j++) {
        bs[j] = bias ? _mm512_loadu_ps(bias + 16 * j) : _mm512_setzero_ps();
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            _mm512_storeu_ps(c + r * ldc + 16 * j, _mm512_fmadd_ps(acc[r][j], sc, bs[j]));
        }
    }
}

/* O[r][0, 64) = inv[r] * sum_j P[r][j] V[j][.] for R rows: per key, 4 loads of
   V, R broadcasts of P, 4R FMAs. */
AT_INLINE void at_pv_tile(int R, const float *p, int64_t ldp, const float *v, int64_t ldv, int64_t T, float *o,
                          int64_t ldo, const float *inv) {
    __m512 acc[AT_R][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            acc[r][c] = _mm512_setzero_ps();
        }
    }
    for (int64_t j = 0; j < T; j++) {
        __m512 vv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            vv[c] = _mm512_loadu_ps(v + j * ldv + 16 * c);
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512 pb = _mm512_set1_ps(p[r * ldp + j]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                acc[r][c] = _mm512_fmadd_ps(pb, vv[c], acc[r][c]);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        const __m512 s = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            _mm512_storeu_ps(o + r * ldo + 16 * c, _mm512_mul_ps(acc[r][c], s));
        }
    }
}

/* Score rows (R constant after inlining) against ncols packed columns. */
#define AT_SCORE_ROWS(R)                                                                                             \
    do {                                                                                                             \
        int64_t j = 0;                                                                                               \
        for (; j + 64 <= ncols; j += 64) {                                                                           \
            at_tile(R, 4, ar, lda, 0, b + j, ldb, 0, AT_D, 1, sr + j, lds, scale, NULL);                            \
        }                                                                                                            \
        for (; j < ncols; j += 16) {                                                                                 \
            at_tile(R, 1, ar, lda, 0, b + j, ldb, 0, AT_D, 1, sr + j, lds, scale, NULL);                            \
        }                                                                                                            \
    } while (0)

/* S[nq, ncols] = scale * A B: A [nq, 64] rows lda apart, B [64, ncols] packed
   (rows ldb apart, ncols a multiple of 16), S rows lds apart. */
AT_AVX512 static void at_scores(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t ncols, int64_t nq,
                                float *s, int64_t lds, float scale) {
    for (int64_t r0 = 0; r0 < nq; r0 += AT_R) {
        const float *ar = a + r0 * lda;
        float *sr = s + r0 * lds;
        AT_ROWS(nq - r0, AT_SCORE_ROWS);
    }
}

/* Row-wise softmax of S[nq, Tp] over the first T columns, in place; inv = 1/sum.
   Columns T..Tp come out 0 (they scale zero-padded keys). */
AT_INLINE void at_softmax(float *s, int64_t Tp, int64_t T, int64_t nq, float *inv) {
    const __mmask16 tail = (__mmask16)((1u << (T & 15)) - 1u);
    for (int64_t r = 0; r < nq; r++) {
        float *sr = s + r * Tp;
        __m512 m = _mm512_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 16 <= T; j += 16) {
            m = _mm512_max_ps(m, _mm512_loadu_ps(sr + j));
        }
        if (j < T) {
            m = _mm512_mask_max_ps(m, tail, m, _mm512_loadu_ps(sr + j));
        }
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        __m512 sum = _mm512_setzero_ps();
        for (j = 0; j + 16 <= T; j += 16) {
            const __m512 e = at_exp(_mm512_sub_ps(_mm512_loadu_ps(sr + j), mx));
            _mm512_storeu_ps(sr + j, e);
            sum = _mm512_add_ps(sum, e);
        }
        if (j < T) {
            const __m512 e = _mm512_maskz_mov_ps(tail, at_exp(_mm512_sub_ps(_mm512_loadu_ps(sr + j), mx)));
            _mm512_storeu_ps(sr + j, e);
            sum = _mm512_add_ps(sum, e);
        }
        inv[r] = 1.0f / _mm512_reduce_add_ps(sum);
    }
}

/* kt [64, cols] = rows 0 .. n of x (rows ld apart) transposed, zeros after. */
static void at_pack_t(float *kt, const float *x, int64_t ld, int64_t n, int64_t cols) {
    for (int64_t j = 0; j < cols; j++) {
        for (int d = 0; d < AT_D; d++) {
            kt[d * cols + j] = j < n ? x[j * ld + d] : 0.0f;
        }
    }
}

/* The relative-position term of a block: S[r][j] += BD[r][nq-1-r+j] for j < T,
   BD the block's scores against its band of the position table. */
static void at_add_band(float *s, int64_t Tp, const float *bd, int64_t Wp, int64_t T, int64_t nq) {
    for (int64_t r = 0; r < nq; r++) {
        float *sr = s + r * Tp;
        const float *br = bd + r * Wp + (nq - 1 - r);
        for (int64_t j = 0; j < T; j++) {
            sr[j] += br[j];
        }
    }
}

/* qa, qb [nq, 64] = the block's queries plus u, plus bv (added in F32, as the reference does). */
static void at_biased_queries(const at_head *h, int64_t i0, int64_t nq, float *qa, float *qb) {
    for (int64_t r = 0; r < nq; r++) {
        const float *qi = h->q + (i0 + r) * h->ld;
        for (int d = 0; d < AT_D; d++) {
            qa[r * AT_D + d] = qi[d] + h->u[d];
            qb[r * AT_D + d] = qi[d] + h->bv[d];
        }
    }
}

/* Softmax of S's rows over the first T columns, then O's rows = P V. */
AT_AVX512 static void at_finish(float *s, int64_t Tp, int64_t T, int64_t nq, const float *v, int64_t ld, float *o) {
    float inv[AT_QB];
    at_softmax(s, Tp, T, nq, inv);
#define AT_PV_ROWS(R) at_pv_tile(R, pr, Tp, v, ld, T, orow, ld, inv + r0)
    for (int64_t r0 = 0; r0 < nq; r0 += AT_R) {
        const float *pr = s + r0 * Tp;
        float *orow = o + r0 * ld;
        AT_ROWS(nq - r0, AT_PV_ROWS);
    }
#undef AT_PV_ROWS
}


/*
 * One head (h), queries i0 .. i0+nq (nq <= 48); keys (and positions) packed
 * into the scratch first when pack is set. Plain: S = scale q k^T. Relative
 * positions: S[r][j] = scale ((q_i + u) k_j + (q_i + bv) p_{T-1-i+j}), i =
 * i0 + r; row r's positions are the band m0 + nq-1-r + j of the table, m0 =
 * T - i0 - nq, so the block's position scores are one product against the
 * W = T + nq - 1 columns from m0 (read up to column m0 + Wp <= 2T + 14).
 */
AT_AVX512 static void at_block(const at_head *h, int64_t i0, int64_t nq, float scale, const at_scratch *w, int pack) {
    const int64_t ld = h->ld, T = h->T, Tp = at_round16(T);
    if (pack) {
        at_pack_t(w->kt, h->k, ld, T, Tp);
        if (h->p) {
            at_pack_t(w->pt, h->p, ld, 2 * T - 1, at_pos_cols(T));
        }
    }
    if (!h->p) {
        at_scores(h->q + i0 * ld, ld, w->kt, Tp, Tp, nq, w->s, Tp, scale);
    } else {
        const int64_t Lp = at_pos_cols(T), Wp = at_round16(T + nq - 1), m0 = T - i0 - nq;
        at_biased_queries(h, i0, nq, w->qa, w->qb);
        at_scores(w->qa, AT_D, w->kt, Tp, Tp, nq, w->s, Tp, scale);
        at_scores(w->qb, AT_D, w->pt + m0, Lp, Wp, nq, w->bd, Wp, scale);
        at_add_band(w->s, Tp, w->bd, Wp, T, nq);
    }
    at_finish(w->s, Tp, T, nq, h->v, ld, h->o + i0 * ld);
}


/* One row group of a panel product: NC (1..4) vectors of columns. */
#define PN_COLS(R)                                                                                                   \
    do {                                                                                                             \
        switch (nc) {                                                                                                \
        case 4: at_tile(R, 4, a, lda, atap, wp, LN_PANEL, K * LN_PANEL, K, taps, c, ldc, 1.0f, bias); break;         \
        case 3: at_tile(R, 3, a, lda, atap, wp, LN_PANEL, K * LN_PANEL, K, taps, c, ldc, 1.0f, bias); break;         \
        case 2: at_tile(R, 2, a, lda, atap, wp, LN_PANEL, K * LN_PANEL, K, taps, c, ldc, 1.0f, bias); break;         \
        default: at_tile(R, 1, a, lda, atap, wp, LN_PANEL, K * LN_PANEL, K, taps, c, ldc, 1.0f, bias); break;        \
        }                                                                                                            \
    } while (0)

/*
 * n output rows (ldc apart) of 16*nc columns from a packed panel wp [taps][K][64]:
 * row r, tap t reads K floats at x + r*lda + t*atap. A linear layer is one tap;
 * a convolution's taps read its input window shifted by the dilation, so no
 * column matrix is ever written.
 */
AT_AVX512 static void at_panel_rows(const float *x, int64_t lda, int64_t atap, const float *wp, int64_t K,
                                    int64_t taps, const float *bias, float *y, int64_t ldc, int nc, int64_t n) {
    for (int64_t r0 = 0; r0 < n; r0 += AT_R) {
        const float *a = x + r0 * lda;
        float *c = y + r0 * ldc;
        AT_ROWS(n - r0, PN_COLS);
    }
}

/* wp[t][c][j] = w[m0 + j][c][t] for j < width: the panel of output columns
   m0 .. m0+width of w [M][C][taps] (a linear layer's W [M][C] is one tap). */
static void at_pack_panel(float *wp, const float *w, int64_t m0, int64_t width, int64_t C, int64_t taps) {
    for (int64_t j = 0; j < width; j++) {
        for (int64_t c = 0; c < C; c++) {
            const float *wr = w + ((m0 + j) * C + c) * taps;
            for (int64_t t = 0; t < taps; t++) {
                wp[(t * C + c) * LN_PANEL + j] = wr[t];
            }
        }
    }
}


/* ------------------------------------------------------------------- BF16 */

/*
 * The BF16 product mode (CODECRT_PRECISION_BF16): the same tiles with both
 * operands rounded to bfloat16 (round to nearest even) and products summed in
 * F32 by vdpbf16ps, which does two multiply-adds per lane where vfmadd231ps
 * does one. Operands are packed as pairs along the summed dimension: a uint32
 * holds elements 2i (low half) and 2i+1 (high half); an odd length ends in a
 * zero. Both sides of every product are converted by the same code whatever the
 * batch or thread count, so batch invariance holds in this mode too.
 */
#define BF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
#define BF_INLINE static inline __attribute__((always_inline)) BF_AVX512

/* n floats -> ceil(n/2) pairs, the odd tail padded with a zero. */
BF_AVX512 static void bf_convert_row(uint32_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
        const int64_t pairs = (n - i + 1) / 2; /* the zero-padded tail's pairs */
        _mm256_mask_storeu_epi32((uint16_t *)dst + i, (__mmask8)((1u << pairs) - 1u), h);
    }
}

/*
 * bf_tile: at_tile on pair-packed operands. A [R][K2] pairs, rows lda apart; B
 * [K2][16*NC] pairs, rows ldb apart; tap t reads A + t*atap and B + t*btap.
 * Per pair of k: NC loads of B, R broadcasts of A's pair, R*NC vdpbf16ps.
 */
BF_INLINE void bf_tile(int R, int NC, const uint32_t *a, int64_t lda, int64_t atap, const uint32_t *b,
                       int64_t ldb, int64_t btap, int64_t K2, int64_t taps, float *c, int64_t ldc, float scale,
                       const float *bias) {
    __m512 acc[AT_R][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            acc[r][j] = _mm512_setzero_ps();
        }
    }
    for (int64_t t = 0; t < taps; t++) {
        const uint32_t *at = a + t * atap, *bt = b + t * btap;
        for (int64_t k = 0; k < K2; k++) {
            __m512bh bv[4];
#pragma GCC unroll 4
            for (int j = 0; j < NC; j++) {
                bv[j] = (__m512bh)_mm512_loadu_si512(bt + k * ldb + 16 * j);
            }
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                const __m512bh ab = (__m512bh)_mm512_set1_epi32((int)at[r * lda + k]);
#pragma GCC unroll 4
                for (int j = 0; j < NC; j++) {
                    acc[r][j] = _mm512_dpbf16_ps(acc[r][j], ab, bv[j]);
                }
            }
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 bs[4];
#pragma GCC unroll 4
    for (int j = 0; j < NC; j++) {
        bs[j] = bias ? _mm512_loadu_ps(bias + 16 * j) : _mm512_setzero_ps();
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 4
        for (int j = 0; j < NC; j++) {
            _mm512_storeu_ps(c + r * ldc + 16 * j, _mm512_fmadd_ps(acc[r][j], sc, bs[j]));
        }
    }
}

#define BF_COLS(R)                                                                                                   \
    do {                                                                                                             \
        switch (nc) {                                                                                                \
        case 4: bf_tile(R, 4, a, lda, atap, wp, LN_PANEL, K2 * LN_PANEL, K2, taps, c, ldc, 1.0f, bias); break;       \
        case 3: bf_tile(R, 3, a, lda, atap, wp, LN_PANEL, K2 * LN_PANEL, K2, taps, c, ldc, 1.0f, bias); break;       \
        case 2: bf_tile(R, 2, a, lda, atap, wp, LN_PANEL, K2 * LN_PANEL, K2, taps, c, ldc, 1.0f, bias); break;       \
        default: bf_tile(R, 1, a, lda, atap, wp, LN_PANEL, K2 * LN_PANEL, K2, taps, c, ldc, 1.0f, bias); break;      \
        }                                                                                                            \
    } while (0)

/* at_panel_rows for pair-packed x (rows lda pairs apart) and panel wp [taps][K2][64]. */
BF_AVX512 static void bf_panel_rows(const uint32_t *x, int64_t lda, int64_t atap, const uint32_t *wp, int64_t K2,
                                    int64_t taps, const float *bias, float *y, int64_t ldc, int nc, int64_t n) {
    for (int64_t r0 = 0; r0 < n; r0 += AT_R) {
        const uint32_t *a = x + r0 * lda;
        float *c = y + r0 * ldc;
        AT_ROWS(n - r0, BF_COLS);
    }
}

/* wp[t][c2][j] = pair(w[m0+j][2c2][t], w[m0+j][2c2+1][t]) for j < width:
   at_pack_panel in pairs. Each output channel's C*taps weights are rounded by
   the vector converter into row (C*taps + 1 halves), then paired. */
BF_AVX512 static void bf_pack_panel(uint32_t *wp, uint16_t *row, const float *w, int64_t m0, int64_t width, int64_t C,
                                    int64_t taps) {
    const int64_t C2 = (C + 1) / 2, n = C * taps;
    for (int64_t j = 0; j < width; j++) {
        bf_convert_row((uint32_t *)row, w + (m0 + j) * n, n);
        if (taps == 1) {
            const uint32_t *pairs = (const uint32_t *)row; /* odd C: the converter's zero ends the last pair */
            for (int64_t c2 = 0; c2 < C2; c2++) {
                wp[c2 * LN_PANEL + j] = pairs[c2];
            }
            continue;
        }
        for (int64_t c2 = 0; c2 < C2; c2++) {
            const uint16_t *lo = row + 2 * c2 * taps, *hi = lo + taps;
            const bool has_hi = 2 * c2 + 1 < C;
            for (int64_t t = 0; t < taps; t++) {
                wp[(t * C2 + c2) * LN_PANEL + j] = (uint32_t)lo[t] | (has_hi ? (uint32_t)hi[t] << 16 : 0u);
            }
        }
    }
}

/* kt [32, cols] pairs: kt[d2][j] = pair(x[j][2 d2], x[j][2 d2 + 1]) for j < n, zeros after. */
BF_AVX512 static void bf_pack_t(uint32_t *kt, const float *x, int64_t ld, int64_t n, int64_t cols) {
    uint32_t row[AT_D / 2];
    for (int64_t j = 0; j < cols; j++) {
        if (j < n) {
            bf_convert_row(row, x + j * ld, AT_D);
        } else {
            memset(row, 0, sizeof row);
        }
        for (int d = 0; d < AT_D / 2; d++) {
            kt[d * cols + j] = row[d];
        }
    }
}

/* vp[j2][c] = pair(v[2 j2][c], v[2 j2 + 1][c]) for j2 < Tp/2 (rows from T on are
   zero): two rows interleaved, then rounded. */
BF_AVX512 static void bf_pack_v(uint32_t *vp, const float *v, int64_t ld, int64_t T, int64_t Tp) {
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int64_t j2 = 0; j2 < Tp / 2; j2++) {
        const int64_t j = 2 * j2;
        for (int c = 0; c < AT_D; c += 16) {
            const __m512 v0 = j < T ? _mm512_loadu_ps(v + j * ld + c) : _mm512_setzero_ps();
            const __m512 v1 = j + 1 < T ? _mm512_loadu_ps(v + (j + 1) * ld + c) : _mm512_setzero_ps();
            const __m512 a = _mm512_permutex2var_ps(v0, lo, v1), b = _mm512_permutex2var_ps(v0, hi, v1);
            _mm512_storeu_si512(vp + j2 * AT_D + c, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
}

#define BF_SCORE_ROWS(R)                                                                                             \
    do {                                                                                                             \
        int64_t j = 0;                                                                                               \
        for (; j + 64 <= ncols; j += 64) {                                                                           \
            bf_tile(R, 4, ar, lda, 0, b + j, ldb, 0, AT_D / 2, 1, sr + j, lds, scale, NULL);                        \
        }                                                                                                            \
        for (; j < ncols; j += 16) {                                                                                 \
            bf_tile(R, 1, ar, lda, 0, b + j, ldb, 0, AT_D / 2, 1, sr + j, lds, scale, NULL);                        \
        }                                                                                                            \
    } while (0)

/* at_scores on pairs: A [nq, 32] pairs rows lda apart, B [32, ncols] pairs. */
BF_AVX512 static void bf_scores(const uint32_t *a, int64_t lda, const uint32_t *b, int64_t ldb, int64_t ncols,
                                int64_t nq, float *s, int64_t lds, float scale) {
    for (int64_t r0 = 0; r0 < nq; r0 += AT_R) {
        const uint32_t *ar = a + r0 * lda;
        float *sr = s + r0 * lds;
        AT_ROWS(nq - r0, BF_SCORE_ROWS);
    }
}

/*
 * at_block with BF16 products. The softmax is normalized before P is rounded,
 * so that P V needs no per-row scale; q (or q + u, q + bv) is rounded after
 * the bias is added, as the reference adds it in F32.
 */
BF_AVX512 static void bf_block(const at_head *h, int64_t i0, int64_t nq, float scale, const at_scratch *w,
                               int pack) {
    const int64_t ld = h->ld, T = h->T, Tp = at_round16(T), T2 = Tp / 2;
    uint32_t *kt = (uint32_t *)w->kt, *pt = (uint32_t *)w->pt;
    if (pack) {
        bf_pack_t(kt, h->k, ld, T, Tp);
        bf_pack_v(w->vp, h->v, ld, T, Tp);
        if (h->p) {
            bf_pack_t(pt, h->p, ld, 2 * T - 1, at_pos_cols(T));
        }
    }
    if (!h->p) {
        for (int64_t r = 0; r < nq; r++) {
            bf_convert_row(w->qs + r * (AT_D / 2), h->q + (i0 + r) * ld, AT_D);
        }
        bf_scores(w->qs, AT_D / 2, kt, Tp, Tp, nq, w->s, Tp, scale);
    } else {
        const int64_t Lp = at_pos_cols(T), Wp = at_round16(T + nq - 1), m0 = T - i0 - nq;
        at_biased_queries(h, i0, nq, w->qa, w->qb);
        for (int64_t r = 0; r < nq; r++) {
            bf_convert_row(w->qs + r * (AT_D / 2), w->qa + r * AT_D, AT_D);
            bf_convert_row(w->qs2 + r * (AT_D / 2), w->qb + r * AT_D, AT_D);
        }
        bf_scores(w->qs, AT_D / 2, kt, Tp, Tp, nq, w->s, Tp, scale);
        bf_scores(w->qs2, AT_D / 2, pt + m0, Lp, Wp, nq, w->bd, Wp, scale);
        at_add_band(w->s, Tp, w->bd, Wp, T, nq);
    }
    float inv[AT_QB];
    at_softmax(w->s, Tp, T, nq, inv);
    for (int64_t r = 0; r < nq; r++) {
        float *sr = w->s + r * Tp;
        const __m512 sc = _mm512_set1_ps(inv[r]);
        for (int64_t j = 0; j < Tp; j += 16) {
            _mm512_storeu_ps(sr + j, _mm512_mul_ps(_mm512_loadu_ps(sr + j), sc));
        }
        bf_convert_row(w->ps + r * T2, sr, Tp);
    }
#define BF_PV_ROWS(R) bf_tile(R, 4, pr, T2, 0, w->vp, AT_D, 0, T2, 1, orow, ld, 1.0f, NULL)
    for (int64_t r0 = 0; r0 < nq; r0 += AT_R) {
        const uint32_t *pr = w->ps + r0 * T2;
        float *orow = h->o + (i0 + r0) * ld;
        AT_ROWS(nq - r0, BF_PV_ROWS);
    }
#undef BF_PV_ROWS
}

#endif /* CR_OPS_AVX512 */

bool cr_attention_cpu_available(void) {
#ifdef CR_OPS_AVX512
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
#else
    return false;
#endif
}

bool cr_bf16_cpu_available(void) {
#ifdef CR_OPS_AVX512
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

/* ------------------------------------------------------------ weight packs */

/* One weight packed for the BF16 product kernels: w [M][C][taps] (a linear
   layer's [M][K] is one tap) as panels [P][taps][C2][64] pairs, P = M/64
   rounded up (columns past M zero). Keyed by the weight's data and shape and
   the convolution's dilation and left pad, so views of one weight share it. */
typedef struct cr_packed {
    const void *data;
    int64_t C, taps, M;
    int32_t dilation, pad_left;
    uint32_t *panels;
} cr_packed;

struct cr_packs {
    cr_packed **items;
    size_t n, cap;
    size_t bytes; /* of the panels */
};

size_t cr_packs_bytes(const cr_packs *packs) { return packs ? packs->bytes : 0; }

cr_packs *cr_packs_new(void) { return (cr_packs *)calloc(1, sizeof(cr_packs)); }

void cr_packs_free(cr_packs *packs) {
    if (!packs) {
        return;
    }
    for (size_t i = 0; i < packs->n; i++) {
        free(packs->items[i]->panels);
        free(packs->items[i]);
    }
    free(packs->items);
    free(packs);
}

/* The packed form of w (data in host memory), packed now if new; NULL if w is
   not in host memory or memory runs out (the caller packs per call instead). */
static const cr_packed *cr_packs_get(cr_packs *packs, const struct ggml_tensor *w, int64_t C, int64_t taps,
                                     int64_t M, int dilation, int pad_left) {
#ifdef CR_OPS_AVX512
    if (!packs || !w->data || (w->buffer && !ggml_backend_buffer_is_host(w->buffer))) {
        return NULL;
    }
    for (size_t i = 0; i < packs->n; i++) {
        const cr_packed *e = packs->items[i];
        if (e->data == w->data && e->C == C && e->taps == taps && e->M == M && e->dilation == dilation &&
            e->pad_left == pad_left) {
            return e;
        }
    }
    if (packs->n == packs->cap) {
        const size_t cap = packs->cap ? 2 * packs->cap : 64;
        cr_packed **items = (cr_packed **)realloc(packs->items, cap * sizeof(*items));
        if (!items) {
            return NULL;
        }
        packs->items = items;
        packs->cap = cap;
    }
    const int64_t C2 = (C + 1) / 2, P = (M + LN_PANEL - 1) / LN_PANEL, panel = taps * C2 * LN_PANEL;
    cr_packed *e = (cr_packed *)calloc(1, sizeof(*e));
    uint16_t *row = (uint16_t *)malloc((size_t)(C * taps + 32) * sizeof(uint16_t));
    uint32_t *panels = (uint32_t *)aligned_alloc(64, ((size_t)(P * panel) * sizeof(uint32_t) + 63) & ~(size_t)63);
    if (!e || !row || !panels) {
        free(e);
        free(row);
        free(panels);
        return NULL;
    }
    for (int64_t p = 0; p < P; p++) {
        const int64_t m0 = p * LN_PANEL, width = M - m0 < LN_PANEL ? M - m0 : LN_PANEL;
        if (width < LN_PANEL) {
            memset(panels + p * panel, 0, (size_t)panel * sizeof(uint32_t));
        }
        bf_pack_panel(panels + p * panel, row, (const float *)w->data, m0, width, C, taps);
    }
    free(row);
    *e = (cr_packed){w->data, C, taps, M, dilation, pad_left, panels};
    packs->items[packs->n++] = e;
    packs->bytes += (size_t)(P * panel) * sizeof(uint32_t);
    return e;
#else
    (void)packs, (void)w, (void)C, (void)taps, (void)M, (void)dilation, (void)pad_left;
    return NULL;
#endif
}

/*
 * Both attention ops: o, q, k, v [H*64, T, B] contiguous F32, scale 1/sqrt(64);
 * p [H*64, >= 2T-1] (shared by the batch), u and bv [H*64], or p NULL. Work
 * items are (sequence, head, block of 48 queries).
 */
static void cr_attention_run(float *od, const float *qd, const float *kd, const float *vd, const float *pd,
                             const float *ud, const float *bvd, int64_t ld, int64_t T, int64_t B, bool bf16, int ith,
                             int nth) {
    const float scale = 0.125f;
    const int64_t H = ld / AT_D, nblk = (T + AT_QB - 1) / AT_QB, n = B * H * nblk;
    const int64_t it0 = n * ith / nth, it1 = n * (ith + 1) / nth;
    float *mem = NULL;
    at_scratch w = {0};
#ifdef CR_OPS_AVX512
    /* F32: KT [64, Tp], PT [64, Lp], S [48, Tp], BD [48, Tp + 64], QA and QB
       [48, 64]. BF16: KT and PT in pairs (half), V [Tp/2, 64] pairs, the same S,
       BD, QA and QB, their pairs [48, 32] twice, P [48, Tp/2] pairs. */
    const int64_t Tp = at_round16(T), Lp = pd ? at_pos_cols(T) : 0, kd_rows = bf16 ? AT_D / 2 : AT_D;
    const size_t sizes[] = {(size_t)(kd_rows * Tp), (size_t)(kd_rows * Lp), bf16 ? (size_t)(Tp / 2 * AT_D) : 0,
                            (size_t)(AT_QB * Tp), pd ? (size_t)(AT_QB * (Tp + 64)) : 0,
                            pd ? (size_t)(AT_QB * AT_D) : 0, pd ? (size_t)(AT_QB * AT_D) : 0,
                            bf16 ? (size_t)(AT_QB * AT_D / 2) : 0, bf16 && pd ? (size_t)(AT_QB * AT_D / 2) : 0,
                            bf16 ? (size_t)(AT_QB * Tp / 2) : 0};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        total += (sizes[i] + 15) & ~(size_t)15; /* each part 64-byte aligned */
    }
    mem = (float *)aligned_alloc(64, total * sizeof(float));
    if (mem) {
        void **parts[] = {(void **)&w.kt, (void **)&w.pt, (void **)&w.vp, (void **)&w.s,  (void **)&w.bd,
                          (void **)&w.qa, (void **)&w.qb, (void **)&w.qs, (void **)&w.qs2, (void **)&w.ps};
        float *cur = mem;
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            *parts[i] = cur;
            cur += (sizes[i] + 15) & ~(size_t)15;
        }
    }
#endif
    int64_t packed = -1;
#ifndef CR_OPS_AVX512
    (void)w, (void)bf16, (void)packed;
#endif
    for (int64_t it = it0; it < it1; it++) {
        const int64_t bh = it / nblk, blk = it % nblk, b = bh / H, h = bh % H;
        const int64_t off = b * T * ld + h * AT_D;
        const int64_t i0 = blk * AT_QB, nq = T - i0 < AT_QB ? T - i0 : AT_QB;
        const at_head hd = {qd + off, kd + off, vd + off, pd ? pd + h * AT_D : NULL, pd ? ud + h * AT_D : NULL,
                            pd ? bvd + h * AT_D : NULL, od + off, ld, T};
#ifdef CR_OPS_AVX512
        if (mem) {
            if (bf16) {
                bf_block(&hd, i0, nq, scale, &w, packed != bh);
            } else {
                at_block(&hd, i0, nq, scale, &w, packed != bh);
            }
            packed = bh;
            continue;
        }
#endif
        at_rows_plain(&hd, i0, nq, scale);
    }
    free(mem);
}

static void cr_attention_kernel(struct ggml_tensor *dst, const struct ggml_tensor *q, const struct ggml_tensor *k,
                                const struct ggml_tensor *v, int ith, int nth, void *user) {
    cr_attention_run((float *)dst->data, (const float *)q->data, (const float *)k->data, (const float *)v->data, NULL,
                     NULL, NULL, q->ne[0], q->ne[1], q->ne[2], user != NULL, ith, nth);
}

static void cr_relpos_attention_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *q = dst->src[0];
    cr_attention_run((float *)dst->data, (const float *)q->data, (const float *)dst->src[1]->data,
                     (const float *)dst->src[2]->data, (const float *)dst->src[3]->data,
                     (const float *)dst->src[4]->data, (const float *)dst->src[5]->data, q->ne[0], q->ne[1], q->ne[2],
                     user != NULL, ith, nth);
}

static bool cr_attention_operands_ok(const struct ggml_tensor *q, const struct ggml_tensor *k,
                                     const struct ggml_tensor *v, bool bf16) {
    return cr_attention_cpu_available() && (!bf16 || cr_bf16_cpu_available()) && q->type == GGML_TYPE_F32 &&
           k->type == GGML_TYPE_F32 && v->type == GGML_TYPE_F32 && ggml_is_contiguous(q) && ggml_is_contiguous(k) &&
           ggml_is_contiguous(v) && ggml_are_same_shape(q, k) && ggml_are_same_shape(q, v) && q->ne[0] > 0 &&
           q->ne[0] % AT_D == 0 && q->ne[3] == 1;
}

struct ggml_tensor *cr_attention_cpu(struct ggml_context *ctx, struct ggml_tensor *q, struct ggml_tensor *k,
                                     struct ggml_tensor *v, const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16;
    if (!cr_attention_operands_ok(q, k, v, bf16)) {
        return NULL;
    }
    return ggml_map_custom3(ctx, q, k, v, cr_attention_kernel, GGML_N_TASKS_MAX, bf16 ? (void *)1 : NULL);
}

struct ggml_tensor *cr_relpos_attention_cpu(struct ggml_context *ctx, struct ggml_tensor *q, struct ggml_tensor *k,
                                            struct ggml_tensor *v, struct ggml_tensor *p, struct ggml_tensor *u,
                                            struct ggml_tensor *bv, const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16;
    const int64_t D = q->ne[0];
    const bool ok = cr_attention_operands_ok(q, k, v, bf16) && p->type == GGML_TYPE_F32 &&
                    u->type == GGML_TYPE_F32 && bv->type == GGML_TYPE_F32 && ggml_is_contiguous(p) &&
                    ggml_is_contiguous(u) && ggml_is_contiguous(bv) && p->ne[0] == D &&
                    p->ne[1] >= 2 * q->ne[1] - 1 && ggml_nrows(p) == p->ne[1] && ggml_nelements(u) == D &&
                    ggml_nelements(bv) == D;
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[6] = {q, k, v, p, u, bv};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, D, q->ne[1], q->ne[2], 1, args, 6, cr_relpos_attention_kernel,
                          GGML_N_TASKS_MAX, bf16 ? (void *)1 : NULL);
}

/* ------------------------------------------------------------------ linear */

/*
 * y = x W^T + b: x [K, N] (rows of K), W [K, M] in ggml's layout (M rows of K),
 * b [M] or absent -> y [M, N]. Per call (user: NULL for F32, else BF16), work
 * items are (panel of 64 output columns, block of 96 rows); a thread packs
 * each panel it visits once, as [K, 64] (columns contiguous, K*256 bytes: in L2
 * for K <= 2048), then sweeps its rows. With a packed weight (pk), items are
 * (block of rows, panel): a thread rounds its block of x to pairs once and
 * sweeps the panels.
 */
static void cr_linear_run(struct ggml_tensor *dst, int ith, int nth, bool bf16, const cr_packed *pk) {
    const struct ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const int64_t K = x->ne[0], N = ggml_nrows(x), M = w->ne[1], K2 = (K + 1) / 2;
    const int64_t P = (M + LN_PANEL - 1) / LN_PANEL, NB = (N + LN_NB - 1) / LN_NB, n = P * NB;
    const int64_t it0 = n * ith / nth, it1 = n * (ith + 1) / nth;
    const float *xd = (const float *)x->data, *wd = (const float *)w->data;
    const float *bd = b ? (const float *)b->data : NULL;
    float *yd = (float *)dst->data;
    float *wp = NULL;
#ifdef CR_OPS_AVX512
    /* F32: the panel [K, 64]. BF16: the block's rows [96, K2] in pairs, and
       unless packed, the panel [K2, 64] and one weight row rounded. */
    const size_t words = !bf16 ? (size_t)(K * LN_PANEL)
                         : pk  ? (size_t)(K2 * LN_NB)
                               : (size_t)(K2 * (LN_PANEL + LN_NB + 1) + 16);
    wp = (float *)aligned_alloc(64, (words * sizeof(float) + 63) & ~(size_t)63);
#endif
    int64_t packed = -1, converted = -1;
#ifndef CR_OPS_AVX512
    (void)bf16, (void)K2, (void)packed, (void)converted;
#endif
    for (int64_t it = it0; it < it1; it++) {
        const int64_t p = pk ? it % P : it / NB, m0 = p * LN_PANEL, n0 = (pk ? it / P : it % NB) * LN_NB;
        const int64_t width = M - m0 < LN_PANEL ? M - m0 : LN_PANEL, n1 = N - n0 < LN_NB ? N : n0 + LN_NB;
#ifdef CR_OPS_AVX512
        if (wp && bf16) {
            uint32_t *px = (uint32_t *)wp, *pw = pk ? pk->panels + p * K2 * LN_PANEL : px + K2 * LN_NB;
            if (!pk && packed != p) {
                bf_pack_panel(pw, (uint16_t *)(pw + K2 * LN_PANEL), wd, m0, width, K, 1);
                packed = p;
            }
            if (converted != n0) {
                for (int64_t r = n0; r < n1; r++) {
                    bf_convert_row(px + (r - n0) * K2, xd + r * K, K);
                }
                converted = n0;
            }
            bf_panel_rows(px, K2, 0, pw, K2, 1, bd ? bd + m0 : NULL, yd + n0 * M + m0, M, (int)(width / 16),
                          n1 - n0);
            continue;
        }
        if (wp) {
            if (packed != p) {
                at_pack_panel(wp, wd, m0, width, K, 1);
                packed = p;
            }
            at_panel_rows(xd + n0 * K, K, 0, wp, K, 1, bd ? bd + m0 : NULL, yd + n0 * M + m0, M, (int)(width / 16),
                          n1 - n0);
            continue;
        }
#endif
        for (int64_t r = n0; r < n1; r++) {
            for (int64_t j = m0; j < m0 + width; j++) {
                float acc = 0.0f;
                for (int64_t k = 0; k < K; k++) {
                    acc += xd[r * K + k] * wd[j * K + k];
                }
                yd[r * M + j] = acc + (bd ? bd[j] : 0.0f);
            }
        }
    }
    free(wp);
}

static void cr_linear_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    cr_linear_run(dst, ith, nth, user != NULL, NULL);
}

static void cr_linear_packed_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    cr_linear_run(dst, ith, nth, true, (const cr_packed *)user);
}

struct ggml_tensor *cr_linear_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16;
    const bool ok = cr_attention_cpu_available() && (!bf16 || cr_bf16_cpu_available()) &&
                    x->type == GGML_TYPE_F32 && w->type == GGML_TYPE_F32 && ggml_is_contiguous(x) &&
                    ggml_is_contiguous(w) && w->ne[2] == 1 && w->ne[3] == 1 && w->ne[0] == x->ne[0] &&
                    w->ne[1] % 16 == 0 &&
                    (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == w->ne[1]));
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[3] = {x, w, b};
    const cr_packed *pk = bf16 ? cr_packs_get(ops->packs, w, w->ne[0], 1, w->ne[1], 0, 0) : NULL;
    if (pk) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], x->ne[2], x->ne[3], args, b ? 3 : 2,
                              cr_linear_packed_kernel, GGML_N_TASKS_MAX, (void *)pk);
    }
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], x->ne[2], x->ne[3], args, b ? 3 : 2,
                          cr_linear_kernel, GGML_N_TASKS_MAX, bf16 ? (void *)1 : NULL);
}

/* ------------------------------------------------------------ convolution */

/*
 * Conv1d, stride 1: x [C, T, B] channels fastest, w ne [K, C, M] (PyTorch
 * (M, C, K)), b [M] or absent, dilation d, pad_left zero frames before x (and
 * as many after as the output length implies) -> y [M, T_out, B]. Work items
 * are (panel of 64 output channels, sequence, block of 96 output frames); each
 * copies its input window (96 + d(K-1) frames, zeros outside x) into scratch,
 * so taps never test bounds, and runs the implicit-im2col tile over it. This
 * replaces the im2col matrix (K copies of the input, several GB per HiFT
 * decode) with one copy of a window.
 */
static void cr_conv1d_run(struct ggml_tensor *dst, int ith, int nth, int64_t d, int64_t pl, bool bf16,
                          const cr_packed *pk) {
    const struct ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2], taps = w->ne[0], M = w->ne[2], To = dst->ne[1];
    const int64_t C2 = (C + 1) / 2;
    const int64_t span = d * (taps - 1);
    const int64_t P = (M + LN_PANEL - 1) / LN_PANEL, NB = (To + LN_NB - 1) / LN_NB, n = P * B * NB;
    const int64_t it0 = n * ith / nth, it1 = n * (ith + 1) / nth;
    const float *xd = (const float *)x->data, *wd = (const float *)w->data;
    const float *bd = b ? (const float *)b->data : NULL;
    float *yd = (float *)dst->data;
    float *wp = NULL;
#ifdef CR_OPS_AVX512
    /* the panel [taps, C, 64] (none if packed) and the input window [96 + span, C];
       in pairs for BF16, with the packer's rounded weight row */
    const size_t wfl = pk ? 0 : (size_t)(taps * (bf16 ? C2 : C) * LN_PANEL);
    const size_t xfl = (size_t)((LN_NB + span) * (bf16 ? C2 : C));
    const size_t rfl = bf16 && !pk ? (size_t)((C * taps + 1) / 2 + 16) : 0;
    wp = (float *)aligned_alloc(64, ((wfl + xfl + rfl) * sizeof(float) + 63) & ~(size_t)63);
#endif
    int64_t packed = -1, window = -1;
#ifndef CR_OPS_AVX512
    (void)bf16, (void)C2, (void)span, (void)packed, (void)window;
#endif
    for (int64_t it = it0; it < it1; it++) {
        /* per call: (panel, sequence, block of frames); packed: (sequence, block, panel) */
        const int64_t p = pk ? it % P : it / (B * NB), bb = pk ? it / (P * NB) : (it / NB) % B;
        const int64_t tb = pk ? (it / P) % NB : it % NB, t0 = tb * LN_NB;
        const int64_t m0 = p * LN_PANEL, width = M - m0 < LN_PANEL ? M - m0 : LN_PANEL;
        const int64_t nrow = To - t0 < LN_NB ? To - t0 : LN_NB;
        const float *xb = xd + bb * T * C;
        float *yb = yd + bb * To * M;
#ifdef CR_OPS_AVX512
        if (wp && bf16) {
            uint32_t *xs = (uint32_t *)wp + wfl;
            const uint32_t *pw = pk ? pk->panels + p * taps * C2 * LN_PANEL : (const uint32_t *)wp;
            if (!pk && packed != p) {
                bf_pack_panel((uint32_t *)wp, (uint16_t *)(xs + xfl), wd, m0, width, C, taps);
                packed = p;
            }
            if (window != bb * NB + tb) {
                for (int64_t i = 0; i < nrow + span; i++) {
                    const int64_t sf = t0 + i - pl;
                    if (sf >= 0 && sf < T) {
                        bf_convert_row(xs + i * C2, xb + sf * C, C);
                    } else {
                        memset(xs + i * C2, 0, (size_t)C2 * sizeof(uint32_t));
                    }
                }
                window = bb * NB + tb;
            }
            bf_panel_rows(xs, C2, d * C2, pw, C2, taps, bd ? bd + m0 : NULL, yb + t0 * M + m0, M, (int)(width / 16),
                          nrow);
            continue;
        }
        if (wp) {
            float *xs = wp + wfl;
            if (packed != p) {
                at_pack_panel(wp, wd, m0, width, C, taps);
                packed = p;
            }
            for (int64_t i = 0; i < nrow + span; i++) {
                const int64_t sf = t0 + i - pl;
                if (sf >= 0 && sf < T) {
                    memcpy(xs + i * C, xb + sf * C, (size_t)C * sizeof(float));
                } else {
                    memset(xs + i * C, 0, (size_t)C * sizeof(float));
                }
            }
            at_panel_rows(xs, C, d * C, wp, C, taps, bd ? bd + m0 : NULL, yb + t0 * M + m0, M, (int)(width / 16),
                          nrow);
            continue;
        }
#endif
        for (int64_t t = t0; t < t0 + nrow; t++) {
            for (int64_t j = m0; j < m0 + width; j++) {
                float acc = 0.0f;
                for (int64_t tap = 0; tap < taps; tap++) {
                    const int64_t sf = t + tap * d - pl;
                    if (sf < 0 || sf >= T) {
                        continue;
                    }
                    for (int64_t c = 0; c < C; c++) {
                        acc += xb[sf * C + c] * wd[(j * C + c) * taps + tap];
                    }
                }
                yb[t * M + j] = acc + (bd ? bd[j] : 0.0f);
            }
        }
    }
    free(wp);
}

/* user: pad_left << 16 | bf16 << 15 | dilation */
static void cr_conv1d_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const uintptr_t u = (uintptr_t)user;
    cr_conv1d_run(dst, ith, nth, (int64_t)(u & 0x7fff), (int64_t)(u >> 16), (u & 0x8000) != 0, NULL);
}

static void cr_conv1d_packed_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const cr_packed *pk = (const cr_packed *)user;
    cr_conv1d_run(dst, ith, nth, pk->dilation, pk->pad_left, true, pk);
}

struct ggml_tensor *cr_conv1d_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, int dilation, int pad_left, int pad_right,
                                  const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16;
    const int64_t To = x->ne[1] + pad_left + pad_right - (int64_t)dilation * (w->ne[0] - 1);
    const bool ok = cr_attention_cpu_available() && (!bf16 || cr_bf16_cpu_available()) &&
                    x->type == GGML_TYPE_F32 && w->type == GGML_TYPE_F32 &&
                    ggml_is_contiguous(x) && ggml_is_contiguous(w) && x->ne[3] == 1 && w->ne[3] == 1 &&
                    w->ne[1] == x->ne[0] && w->ne[2] % 16 == 0 && dilation >= 1 && dilation < 0x8000 &&
                    pad_left >= 0 && pad_left < 0x10000 && pad_right >= 0 && To >= 1 &&
                    (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == w->ne[2]));
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[3] = {x, w, b};
    const cr_packed *pk = bf16 ? cr_packs_get(ops->packs, w, w->ne[1], w->ne[0], w->ne[2], dilation, pad_left) : NULL;
    if (pk) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[2], To, x->ne[2], 1, args, b ? 3 : 2, cr_conv1d_packed_kernel,
                              GGML_N_TASKS_MAX, (void *)pk);
    }
    void *params = (void *)(((uintptr_t)pad_left << 16) | (bf16 ? 0x8000u : 0u) | (uintptr_t)dilation);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[2], To, x->ne[2], 1, args, b ? 3 : 2, cr_conv1d_kernel,
                          GGML_N_TASKS_MAX, params);
}
