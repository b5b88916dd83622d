/*
 * ops_avx2_attention.c: the F32 attention's per-block steps (ops_avx512_attention.c's
 * at_scores and at_finish) for x86-64 CPUs with AVX2 and FMA but no AVX-512: the scores
 * S = scale Q K^T of a block of queries, the softmax of S's rows, and O = P V.
 *
 * Why: without them such a CPU ran NeuCodec's and XCodec2's attention (12 blocks of 16
 * heads of 64 over every frame) as ggml's products around a softmax with the scores [T, T,
 * H] in memory and two copies per block: on an AMD EPYC Zen 1 at 2 threads (2026-12-07),
 * MUL_MAT, SOFT_MAX and CONT took 21 % of a NeuCodec decode's op time.
 *
 * The floats are the AVX-512 kernel's. Each score is one FMA chain over the head's 64
 * channels from zero, then times the scale (at2_tile, ops_avx512.h). The softmax keeps the
 * AVX-512 kernel's 16 lanes as two 8-lane halves (lo: columns j..j+7 of each 16, hi:
 * j+8..j+15), evaluates e^x with the same reduction and polynomial, and reduces the lanes'
 * sums in the order of GCC's _mm512_reduce_add_ps (hi + lo, then the 128-bit halves, then
 * lanes {0,1} + {2,3}, then lane 0 + lane 1). Each output of P V is one FMA chain over the
 * keys, then times 1/sum. So a decode gives the same samples on either instruction set.
 */
#include "ops_avx512.h"

#ifdef CR_OPS_AVX512

/* e^x for x <= 0: at_exp (ops_avx512_attention.c) on 8 lanes. 2^n is built in the
   exponent field, where at_exp scales by vscalefps: for n >= -126 (x >= -87) both are
   p * 2^n rounded once. */
A2_INLINE __m256 at2_exp(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* All-ones in lanes i < n (n clamped to 0..8), for the columns of a row's last 16. */
A2_INLINE __m256 at2_lanes_below(int64_t n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int32_t m = n < 0 ? 0 : n > 8 ? 8 : (int32_t)n;
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(m), idx));
}

/* _mm512_reduce_add_ps of the 16 lanes [lo | hi], in GCC's order. */
A2_INLINE float at2_sum16(__m256 lo, __m256 hi) {
    const __m256 t3 = _mm256_add_ps(hi, lo);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(1, 1, 1, 1))));
}

/* Row-wise softmax of S[nq, Tp] over the first T columns, in place; inv = 1/sum. Columns
   T..round16(T) come out 0, as at_softmax's. */
A2_INLINE void at2_softmax(float *s, int64_t Tp, int64_t T, int64_t nq, float *inv) {
    const int64_t tail = T & 15;
    const __m256 mlo = at2_lanes_below(tail), mhi = at2_lanes_below(tail - 8);
    for (int64_t r = 0; r < nq; r++) {
        float *sr = s + r * Tp;
        __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
        int64_t j = 0;
        for (; j + 16 <= T; j += 16) {
            m0 = _mm256_max_ps(m0, _mm256_loadu_ps(sr + j));
            m1 = _mm256_max_ps(m1, _mm256_loadu_ps(sr + j + 8));
        }
        if (j < T) { /* lanes past T keep the running max */
            m0 = _mm256_blendv_ps(m0, _mm256_max_ps(m0, _mm256_loadu_ps(sr + j)), mlo);
            m1 = _mm256_blendv_ps(m1, _mm256_max_ps(m1, _mm256_loadu_ps(sr + j + 8)), mhi);
        }
        __m256 m = _mm256_max_ps(m0, m1);
        __m128 h = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        h = _mm_max_ps(h, _mm_shuffle_ps(h, h, _MM_SHUFFLE(1, 0, 3, 2)));
        h = _mm_max_ps(h, _mm_shuffle_ps(h, h, _MM_SHUFFLE(2, 3, 0, 1))); /* the max in every lane */
        const __m256 mx = _mm256_set1_ps(_mm_cvtss_f32(h));
        __m256 s0 = _mm256_setzero_ps(), s1 = s0;
        for (j = 0; j + 16 <= T; j += 16) {
            const __m256 e0 = at2_exp(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mx));
            const __m256 e1 = at2_exp(_mm256_sub_ps(_mm256_loadu_ps(sr + j + 8), mx));
            _mm256_storeu_ps(sr + j, e0);
            _mm256_storeu_ps(sr + j + 8, e1);
            s0 = _mm256_add_ps(s0, e0);
            s1 = _mm256_add_ps(s1, e1);
        }
        if (j < T) { /* j + 16 <= Tp */
            const __m256 e0 = _mm256_and_ps(mlo, at2_exp(_mm256_sub_ps(_mm256_loadu_ps(sr + j), mx)));
            const __m256 e1 = _mm256_and_ps(mhi, at2_exp(_mm256_sub_ps(_mm256_loadu_ps(sr + j + 8), mx)));
            _mm256_storeu_ps(sr + j, e0);
            _mm256_storeu_ps(sr + j + 8, e1);
            s0 = _mm256_add_ps(s0, e0);
            s1 = _mm256_add_ps(s1, e1);
        }
        inv[r] = 1.0f / at2_sum16(s0, s1);
    }
}

/* O[r][16 g .. 16 g + 16) = inv[r] * sum_j P[r][j] V[j][.] for R rows: per key, 2 loads
   of V, R broadcasts of P, 2R FMAs; the four column groups of the head in turn. */
A2_INLINE void at2_pv_tile(int R, const float *p, int64_t ldp, const float *v, int64_t ldv, int64_t T, float *o,
                           int64_t ldo, const float *inv) {
    for (int g = 0; g < AT_D; g += 16) {
        __m256 acc[AT_R][2];
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            acc[r][0] = _mm256_setzero_ps();
            acc[r][1] = _mm256_setzero_ps();
        }
        for (int64_t j = 0; j < T; j++) {
            const __m256 v0 = _mm256_loadu_ps(v + j * ldv + g), v1 = _mm256_loadu_ps(v + j * ldv + g + 8);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                const __m256 pb = _mm256_set1_ps(p[r * ldp + j]);
                acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 sc = _mm256_set1_ps(inv[r]);
            _mm256_storeu_ps(o + r * ldo + g, _mm256_mul_ps(acc[r][0], sc));
            _mm256_storeu_ps(o + r * ldo + g + 8, _mm256_mul_ps(acc[r][1], sc));
        }
    }
}

/* Score rows (R constant after inlining) against ncols packed columns, 16 at a time. */
#define AT2_SCORE_ROWS(R)                                                                                            \
    do {                                                                                                             \
        for (int64_t j = 0; j < ncols; j += 16) {                                                                    \
            at2_tile(R, ar, lda, 0, b + j, ldb, 0, AT_D, 1, sr + j, lds, scale, NULL);                               \
        }                                                                                                            \
    } while (0)

A2 void at2_scores(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t ncols, int64_t nq, float *s,
                   int64_t lds, float scale) {
    for (int64_t r0 = 0; r0 < nq; r0 += AT_R) {
        const float *ar = a + r0 * lda;
        float *sr = s + r0 * lds;
        AT_ROWS(nq - r0, AT2_SCORE_ROWS);
    }
}

A2 void at2_finish(float *s, int64_t Tp, int64_t T, int64_t nq, const float *v, int64_t ld, float *o) {
    float inv[AT_QB];
    at2_softmax(s, Tp, T, nq, inv);
#define AT2_PV_ROWS(R) at2_pv_tile(R, pr, Tp, v, ld, T, orow, ld, inv + r0)
    for (int64_t r0 = 0; r0 < nq; r0 += AT_R) {
        const float *pr = s + r0 * Tp;
        float *orow = o + r0 * ld;
        AT_ROWS(nq - r0, AT2_PV_ROWS);
    }
#undef AT2_PV_ROWS
}

#endif /* CR_OPS_AVX512 */
