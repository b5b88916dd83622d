/*
 * ops_avx2_products.c: the F32 panel product (at_panel_rows, ops_avx512_core.c) for x86-64
 * CPUs with AVX2 and FMA but no AVX-512, so that the linear layers and stride-1
 * convolutions of ops_avx512_linear.c run there too instead of ggml's products.
 *
 * Why: on such a CPU (an AMD EPYC Zen 1, 2 threads, 2026-12-07) every CPU model fell back to
 * ggml's products, and codecrt decoded WavTokenizer, NeuCodec and XCodec2 at 0.75x to 0.89x
 * PyTorch's speed (docs/benchmarks.md). And ggml's summation order follows the shapes, so a
 * stream's samples were not bit-identical to the offline decode's there.
 *
 * The sums are the AVX-512 tile's: each output is one FMA chain over (tap, k) from zero, then
 * acc * scale + bias in one FMA, so a product gives the same floats on both instruction sets,
 * at any row count and packed or not (streamed == offline, batched == alone).
 */
#include "ops_avx512.h"

#ifdef CR_OPS_AVX512

#define A2 __attribute__((target("avx2,fma")))
#define A2_INLINE static inline __attribute__((always_inline)) A2
#define A2_R AT_R /* rows per tile, 6: 12 accumulators, 2 loads of B and a broadcast in the 16 ymm registers */

/*
 * 16 columns of R rows (R <= 6): C[r][0..15] = scale * sum over taps and k of A_t[r][k]
 * B_t[k][0..15] + bias[0..15]. A [R, K] rows lda apart, tap t at A + t*atap; B the panel's
 * 16 columns, rows LN_PANEL apart, tap t at B + t*btap (at_tile's operands, one column group).
 */
A2_INLINE void at2_tile(int R, const float *a, int64_t lda, int64_t atap, const float *b, int64_t btap, int64_t K,
                        int64_t taps, float *c, int64_t ldc, float scale, const float *bias) {
    __m256 acc[A2_R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm256_setzero_ps();
        acc[r][1] = _mm256_setzero_ps();
    }
    for (int64_t t = 0; t < taps; t++) {
        const float *at = a + t * atap, *bt = b + t * btap;
        for (int64_t k = 0; k < K; k++) {
            const __m256 b0 = _mm256_loadu_ps(bt + k * LN_PANEL), b1 = _mm256_loadu_ps(bt + k * LN_PANEL + 8);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                const __m256 ab = _mm256_set1_ps(at[r * lda + k]);
                acc[r][0] = _mm256_fmadd_ps(ab, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(ab, b1, acc[r][1]);
            }
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
    const __m256 bs0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    const __m256 bs1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(c + r * ldc, _mm256_fmadd_ps(acc[r][0], sc, bs0));
        _mm256_storeu_ps(c + r * ldc + 8, _mm256_fmadd_ps(acc[r][1], sc, bs1));
    }
}

#define A2_TILE(R)                                                                                                   \
    at2_tile(R, a, lda, atap, wp + 16 * g, K * LN_PANEL, K, taps, c + 16 * g, ldc, 1.0f, bias ? bias + 16 * g : NULL)

A2 void at2_panel_rows(const float *x, int64_t lda, int64_t atap, const float *wp, int64_t K, int64_t taps,
                       const float *bias, float *y, int64_t ldc, int nc, int64_t n) {
    for (int64_t r0 = 0; r0 < n; r0 += A2_R) {
        const float *a = x + r0 * lda;
        float *c = y + r0 * ldc;
        for (int g = 0; g < nc; g++) {
            AT_ROWS(n - r0, A2_TILE); /* the AVX-512 tiles' row dispatch (ops_avx512.h) */
        }
    }
}

bool cr_f32_products_cpu_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

#else

bool cr_f32_products_cpu_available(void) {
    return false;
}

#endif /* CR_OPS_AVX512 */
