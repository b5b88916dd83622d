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

/* one column group g of the panel: 16 columns, rows LN_PANEL apart, taps K * LN_PANEL apart */
#define A2_TILE(R)                                                                                                   \
    at2_tile(R, a, lda, atap, wp + 16 * g, LN_PANEL, K * LN_PANEL, K, taps, c + 16 * g, ldc, 1.0f,                  \
             bias ? bias + 16 * g : NULL)

A2 void at2_panel_rows(const float *x, int64_t lda, int64_t atap, const float *wp, int64_t K, int64_t taps,
                       const float *bias, float *y, int64_t ldc, int nc, int64_t n) {
    for (int64_t r0 = 0; r0 < n; r0 += AT_R) {
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
