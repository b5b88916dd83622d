/*
 * ops_avx512_attention.c: multi-head self-attention for the CPU backend on
 * x86-64 CPUs with AVX-512 (S3Gen's estimator and encoder), plain and with
 * ESPnet's relative positions, in F32 or (CODECRT_PRECISION_BF16, on CPUs
 * with AVX512-BF16) with bfloat16 operands, on the register tile of
 * ops_avx512.h.
 *
 * The S3Gen flow estimator spends about half of its time in
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
 * On CPUs with AVX2 and FMA but no AVX-512 the F32 kernel runs the same blocks
 * with ops_avx2_attention.c's scores, softmax and P V (the same floats).
 */
#include "ops_avx512.h"

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
    uint32_t *qs, *qs2, *ps; /* BF16: those (or q) [48, 32] in pairs; P [48, T2s] (BF16x3: three blocks a row) */
    bool amx;                /* BF16: both products on AMX tiles (ops_amx.c) */
    bool x3;                 /* BF16x3 on AMX: split operands, KT [hi; lo], V [hi; lo], q and P rows [hi | hi | lo] */
    int64_t t2s;             /* BF16: pairs of keys in a row of P and rows of V: Tp/2, for AMX to 16 */
} at_scratch;

static inline int64_t at_round16(int64_t n) { return (n + 15) & ~(int64_t)15; }
/* Columns of a head's packed position table: the band of block rows reads up
   to column 2T + 14 (see at_block). */
static inline int64_t at_pos_cols(int64_t T) { return at_round16(2 * T + 15); }

#ifdef CR_OPS_AVX512

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
static void at_block(const at_head *h, int64_t i0, int64_t nq, float scale, const at_scratch *w, int pack,
                     bool avx512) {
    const int64_t ld = h->ld, T = h->T, Tp = at_round16(T);
    /* the same floats either way (ops_avx2_attention.c); this function itself is plain C */
    void (*const scores)(const float *, int64_t, const float *, int64_t, int64_t, int64_t, float *, int64_t, float) =
        avx512 ? at_scores : at2_scores;
    void (*const finish)(float *, int64_t, int64_t, int64_t, const float *, int64_t, float *) =
        avx512 ? at_finish : at2_finish;
    if (pack) {
        at_pack_t(w->kt, h->k, ld, T, Tp);
        if (h->p) {
            at_pack_t(w->pt, h->p, ld, 2 * T - 1, at_pos_cols(T));
        }
    }
    if (!h->p) {
        scores(h->q + i0 * ld, ld, w->kt, Tp, Tp, nq, w->s, Tp, scale);
    } else {
        const int64_t Lp = at_pos_cols(T), Wp = at_round16(T + nq - 1), m0 = T - i0 - nq;
        at_biased_queries(h, i0, nq, w->qa, w->qb);
        scores(w->qa, AT_D, w->kt, Tp, Tp, nq, w->s, Tp, scale);
        scores(w->qb, AT_D, w->pt + m0, Lp, Wp, nq, w->bd, Wp, scale);
        at_add_band(w->s, Tp, w->bd, Wp, T, nq);
    }
    finish(w->s, Tp, T, nq, h->v, ld, h->o + i0 * ld);
}

/* kt [32, cols] pairs: kt[d2][j] = pair(x[j][2 d2], x[j][2 d2 + 1]) for j < n, zeros after.
   With lo (BF16x3's keys), the pairs of x - hi in lo [32, cols] alike (amx_rows' w blocks
   [hi; lo] when lo = kt + 32 cols). */
BF_AVX512 static void bf_pack_t(uint32_t *kt, uint32_t *lo, const float *x, int64_t ld, int64_t n, int64_t cols) {
    uint32_t row[3 * AT_D / 2]; /* pairs, or BF16x3's [hi | hi | lo] */
    for (int64_t j = 0; j < cols; j++) {
        if (j >= n) {
            memset(row, 0, sizeof row);
        } else if (lo) {
            bf_convert_row_x3(row, x + j * ld, AT_D, AT_D / 2);
        } else {
            bf_convert_row(row, x + j * ld, AT_D);
        }
        for (int d = 0; d < AT_D / 2; d++) {
            kt[d * cols + j] = row[d];
            if (lo) {
                lo[d * cols + j] = row[AT_D + d];
            }
        }
    }
}

/* bf16 halves (the low ones of 32-bit lanes) back to floats */
BF_AVX512 static inline __m512 bf_widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* vp[j2][c] = pair(v[2 j2][c], v[2 j2 + 1][c]) for j2 < Tp/2 (rows from T on are
   zero): two rows interleaved, then rounded. With lo (BF16x3's values), the pairs of
   v - hi in lo's rows alike (lo = vp + T2s rows: amx_rows' w blocks [hi; lo]). */
BF_AVX512 static void bf_pack_v(uint32_t *vp, uint32_t *lo, const float *v, int64_t ld, int64_t T, int64_t Tp) {
    const __m512i il = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i ih = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int64_t j2 = 0; j2 < Tp / 2; j2++) {
        const int64_t j = 2 * j2;
        for (int c = 0; c < AT_D; c += 16) {
            const __m512 v0 = j < T ? _mm512_loadu_ps(v + j * ld + c) : _mm512_setzero_ps();
            const __m512 v1 = j + 1 < T ? _mm512_loadu_ps(v + (j + 1) * ld + c) : _mm512_setzero_ps();
            const __m512 a = _mm512_permutex2var_ps(v0, il, v1), b = _mm512_permutex2var_ps(v0, ih, v1);
            const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* a's pairs low, b's high */
            _mm512_storeu_si512(vp + j2 * AT_D + c, h);
            if (lo) { /* a - float(bf16(a)), exactly, then rounded */
                const __m512 ra = _mm512_sub_ps(a, bf_widen(_mm512_castsi512_si256(h)));
                const __m512 rb = _mm512_sub_ps(b, bf_widen(_mm512_extracti64x4_epi64(h, 1)));
                _mm512_storeu_si512(lo + j2 * AT_D + c, (__m512i)_mm512_cvtne2ps_pbh(rb, ra));
            }
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

/* bf_scores for queries [nq, 32] pairs (48 rows readable), on AMX tiles where the scratch says. */
BF_AVX512 static void bf_scores_any(const at_scratch *w, const uint32_t *a, const uint32_t *b, int64_t ldb,
                                    int64_t ncols, int64_t nq, float *s, int64_t lds, float scale) {
#ifdef CR_OPS_AMX
    if (w->amx) {
        amx_rows(a, AT_D / 2, 0, b, ldb, 0, AT_D / 2, 0, 1, scale, NULL, s, lds, ncols, nq);
        return;
    }
#endif
    (void)w;
    bf_scores(a, AT_D / 2, b, ldb, ncols, nq, s, lds, scale);
}

/*
 * at_block with BF16 products. The softmax is normalized before P is rounded,
 * so that P V needs no per-row scale; q (or q + u, q + bv) is rounded after
 * the bias is added, as the reference adds it in F32.
 */
BF_AVX512 static void bf_block(const at_head *h, int64_t i0, int64_t nq, float scale, const at_scratch *w,
                               int pack) {
    const int64_t ld = h->ld, T = h->T, Tp = at_round16(T), T2 = w->t2s;
    uint32_t *kt = (uint32_t *)w->kt, *pt = (uint32_t *)w->pt;
#ifdef CR_OPS_AMX
    if (w->x3) { /* plain attention only (the caller's condition): both products split, on AMX */
        if (pack) {
            bf_pack_t(kt, kt + (AT_D / 2) * Tp, h->k, ld, T, Tp);
            bf_pack_v(w->vp, w->vp + T2 * AT_D, h->v, ld, T, Tp);
        }
        for (int64_t r = 0; r < nq; r++) {
            bf_convert_row_x3(w->qs + r * (3 * AT_D / 2), h->q + (i0 + r) * ld, AT_D, AT_D / 2);
        }
        amx_rows(w->qs, 3 * AT_D / 2, 0, kt, Tp, 0, 3 * AT_D / 2, AT_D / 2, 1, scale, NULL, w->s, Tp, Tp, nq);
        float inv[AT_QB];
        at_softmax(w->s, Tp, T, nq, inv);
        for (int64_t r = 0; r < nq; r++) {
            float *sr = w->s + r * Tp;
            const __m512 sc = _mm512_set1_ps(inv[r]);
            for (int64_t j = 0; j < Tp; j += 16) {
                _mm512_storeu_ps(sr + j, _mm512_mul_ps(_mm512_loadu_ps(sr + j), sc));
            }
            bf_convert_row_x3(w->ps + r * 3 * T2, sr, Tp, T2);
        }
        amx_rows(w->ps, 3 * T2, 0, w->vp, AT_D, 0, 3 * T2, T2, 1, 1.0f, NULL, h->o + i0 * ld, ld, AT_D, nq);
        return;
    }
#endif
    if (pack) {
        bf_pack_t(kt, NULL, h->k, ld, T, Tp);
        bf_pack_v(w->vp, NULL, h->v, ld, T, Tp);
        if (h->p) {
            bf_pack_t(pt, NULL, h->p, ld, 2 * T - 1, at_pos_cols(T));
        }
    }
    if (!h->p) {
        for (int64_t r = 0; r < nq; r++) {
            bf_convert_row(w->qs + r * (AT_D / 2), h->q + (i0 + r) * ld, AT_D);
        }
        bf_scores_any(w, w->qs, kt, Tp, Tp, nq, w->s, Tp, scale);
    } else {
        const int64_t Lp = at_pos_cols(T), Wp = at_round16(T + nq - 1), m0 = T - i0 - nq;
        at_biased_queries(h, i0, nq, w->qa, w->qb);
        for (int64_t r = 0; r < nq; r++) {
            bf_convert_row(w->qs + r * (AT_D / 2), w->qa + r * AT_D, AT_D);
            bf_convert_row(w->qs2 + r * (AT_D / 2), w->qb + r * AT_D, AT_D);
        }
        bf_scores_any(w, w->qs, kt, Tp, Tp, nq, w->s, Tp, scale);
        bf_scores_any(w, w->qs2, pt + m0, Lp, Wp, nq, w->bd, Wp, scale);
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
#ifdef CR_OPS_AMX
    if (w->amx) { /* P's 48 rows [T2s] pairs and V's T2s rows are zero past the keys */
        amx_rows(w->ps, T2, 0, w->vp, AT_D, 0, T2, 0, 1, 1.0f, NULL, h->o + i0 * ld, ld, AT_D, nq);
        return;
    }
#endif
#define BF_PV_ROWS(R) bf_tile(R, 4, pr, T2, 0, w->vp, AT_D, 0, T2, 1, orow, ld, 1.0f, NULL)
    for (int64_t r0 = 0; r0 < nq; r0 += AT_R) {
        const uint32_t *pr = w->ps + r0 * T2;
        float *orow = h->o + (i0 + r0) * ld;
        AT_ROWS(nq - r0, BF_PV_ROWS);
    }
#undef BF_PV_ROWS
}

#endif /* CR_OPS_AVX512 */

/*
 * Both attention ops: o, q, k, v [H*64, T, B] contiguous F32, scale 1/sqrt(64);
 * p [H*64, >= 2T-1] (shared by the batch), u and bv [H*64], or p NULL. Work
 * items are (sequence, head, block of 48 queries).
 */
static void cr_attention_run(float *od, const float *qd, const float *kd, const float *vd, const float *pd,
                             const float *ud, const float *bvd, int64_t ld, int64_t T, int64_t B, bool bf16, bool x3,
                             int ith, int nth) {
    const float scale = 0.125f;
    const int64_t H = ld / AT_D, nblk = (T + AT_QB - 1) / AT_QB, n = B * H * nblk;
    const int64_t it0 = n * ith / nth, it1 = n * (ith + 1) / nth;
    float *mem = NULL;
    at_scratch w = {0};
#ifdef CR_OPS_AVX512
    /* F32: KT [64, Tp], PT [64, Lp], S [48, Tp], BD [48, Tp + 64], QA and QB
       [48, 64]. BF16: KT and PT in pairs (half), V [Tp/2, 64] pairs, the same S,
       BD, QA and QB, their pairs [48, 32] twice, P [48, Tp/2] pairs. */
    /* BF16x3 (AMX, plain attention: the caller's conditions): KT [hi; lo] pairs (64 rows), V
       [hi; lo] (2 T2s rows), q's and P's rows three blocks each */
    const int64_t Tp = at_round16(T), Lp = pd ? at_pos_cols(T) : 0, kd_rows = bf16 && !x3 ? AT_D / 2 : AT_D;
    const int64_t blocks = x3 ? 3 : 1;
    w.amx = bf16 && cr_amx_cpu_available();
    w.x3 = x3 && w.amx && !pd;
    w.t2s = w.amx ? at_round16(Tp / 2) : Tp / 2; /* AMX sums whole tiles of 16 pairs */
    const size_t sizes[] = {(size_t)(kd_rows * Tp), (size_t)(kd_rows * Lp),
                            bf16 ? (size_t)((x3 ? 2 : 1) * w.t2s * AT_D) : 0, (size_t)(AT_QB * Tp),
                            pd ? (size_t)(AT_QB * (Tp + 64)) : 0, pd ? (size_t)(AT_QB * AT_D) : 0,
                            pd ? (size_t)(AT_QB * AT_D) : 0, bf16 ? (size_t)(blocks * AT_QB * AT_D / 2) : 0,
                            bf16 && pd ? (size_t)(AT_QB * AT_D / 2) : 0,
                            bf16 ? (size_t)(blocks * AT_QB * w.t2s) : 0};
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
        if (w.amx) { /* V's rows and P's pairs past Tp/2 are never written: zero, for AMX's whole tiles */
            memset(w.vp, 0, sizes[2] * sizeof(float));
            memset(w.ps, 0, sizes[9] * sizeof(float));
            memset(w.qs, 0, sizes[7] * sizeof(float)); /* rows past a block's queries: read, never used */
            if (w.qs2) {
                memset(w.qs2, 0, sizes[8] * sizeof(float));
            }
        }
    }
#endif
    int64_t packed = -1;
#ifdef CR_OPS_AVX512
    const bool avx512 = cr_attention_cpu_available(); /* else AVX2 + FMA: the operands' check asked for one */
#else
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
                at_block(&hd, i0, nq, scale, &w, packed != bh, avx512);
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
    /* user: NULL F32, 1 BF16, 2 BF16x3 on AMX (cr_attention_cpu) */
    cr_attention_run((float *)dst->data, (const float *)q->data, (const float *)k->data, (const float *)v->data, NULL,
                     NULL, NULL, q->ne[0], q->ne[1], q->ne[2], user != NULL, (uintptr_t)user == 2, ith, nth);
}

static void cr_relpos_attention_kernel(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *q = dst->src[0];
    cr_attention_run((float *)dst->data, (const float *)q->data, (const float *)dst->src[1]->data,
                     (const float *)dst->src[2]->data, (const float *)dst->src[3]->data,
                     (const float *)dst->src[4]->data, (const float *)dst->src[5]->data, q->ne[0], q->ne[1], q->ne[2],
                     user != NULL, false, ith, nth);
}

static bool cr_attention_operands_ok(const struct ggml_tensor *q, const struct ggml_tensor *k,
                                     const struct ggml_tensor *v, bool bf16) {
    const bool cpu = bf16 ? cr_attention_cpu_available() && cr_bf16_cpu_available() : cr_f32_products_cpu_available();
    return cpu && q->type == GGML_TYPE_F32 &&
           k->type == GGML_TYPE_F32 && v->type == GGML_TYPE_F32 && ggml_is_contiguous(q) && ggml_is_contiguous(k) &&
           ggml_is_contiguous(v) && ggml_are_same_shape(q, k) && ggml_are_same_shape(q, v) && q->ne[0] > 0 &&
           q->ne[0] % AT_D == 0 && q->ne[3] == 1;
}

struct ggml_tensor *cr_attention_cpu(struct ggml_context *ctx, struct ggml_tensor *q, struct ggml_tensor *k,
                                     struct ggml_tensor *v, const cr_cpu_ops *ops) {
    /* BF16x3: both products split on AMX tiles where the CPU has them, else F32 (three BF16
       products of vdpbf16ps cost more than the F32 one) */
    const bool x3 = ops && ops->bf16 && ops->x3 && cr_amx_cpu_available();
    const bool bf16 = ops && ops->bf16 && (!ops->x3 || x3);
    if (!cr_attention_operands_ok(q, k, v, bf16)) {
        return NULL;
    }
    return ggml_map_custom3(ctx, q, k, v, cr_attention_kernel, GGML_N_TASKS_MAX,
                            x3 ? (void *)2 : bf16 ? (void *)1 : NULL);
}

struct ggml_tensor *cr_relpos_attention_cpu(struct ggml_context *ctx, struct ggml_tensor *q, struct ggml_tensor *k,
                                            struct ggml_tensor *v, struct ggml_tensor *p, struct ggml_tensor *u,
                                            struct ggml_tensor *bv, const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16 && !ops->x3; /* BF16x3: relative-position attention in F32 */
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
