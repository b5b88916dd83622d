/*
 * ops_avx512.h: what the AVX-512 kernels of native/src/ops/ share: the CPU
 * check, the tile sizes, the F32 and BF16 register tiles (inlined into every
 * kernel: they unroll on their row and column counts), and the panel products
 * and packers and the BF16 weight packs of ops_avx512_core.c. Private to ops/.
 *
 *   ops_avx512_core.c       CPU feature checks, panel products, BF16 rounding
 *                           and packing, the weight packs
 *   ops_avx512_attention.c  attention, plain and relative-position, F32 and BF16
 *   ops_avx512_linear.c     linear layers and stride-1 convolutions, F32 and BF16
 *   ops_amx.c               the BF16 panel product on AMX tiles (packed weights)
 *   ops_avx2_products.c     the F32 panel product on AVX2 + FMA
 *   ops_avx2_attention.c    the F32 attention's scores, softmax and P V on AVX2 + FMA
 *
 * Without AVX-512 (other architectures, or CODECRT_NO_AVX512) the files
 * compile to the availability checks returning false and the ops returning
 * NULL (the graphs then use ggml's ops). On an x86-64 CPU with AVX2 and FMA
 * but no AVX-512, the F32 linear layers and convolutions (ops_avx2_products.c)
 * and the F32 attention (ops_avx2_attention.c) run on the AVX2 tile below, with
 * the same sums; BF16 does not.
 */
#ifndef CODECRT_OPS_AVX512_H
#define CODECRT_OPS_AVX512_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && !defined(CODECRT_NO_AVX512)
#define CR_OPS_AVX512 1
#include <immintrin.h>
/* AMX's tile state is granted by Linux's arch_prctl; amx-tile intrinsics since gcc 11, clang 12 */
#if defined(__linux__) && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define CR_OPS_AMX 1
#endif
#endif

#define AT_D 64  /* head dim */
#define AT_QB 48 /* queries per block: 8 tiles of 6 rows */
#define AT_R 6   /* rows per register tile: 6 x 4 accumulators of 16 floats */
#define LN_PANEL 64 /* linear: output columns per packed weight panel */
#define LN_NB 96    /* linear: rows of x per work item (16 register tiles) */
/* AMX reads x in blocks of 16 rows: a linear's block of LN_NB rows and the attention's
   AT_QB queries hold whole blocks, so no read passes their buffers */
_Static_assert(LN_NB % 16 == 0 && AT_QB % 16 == 0, "AMX reads 16-row blocks");
/* An F32 product of fewer rows than this (a linear's rows of x, a convolution's output
   steps times sequences) reads its weight panels from a copy packed once per context
   instead of packing each panel per call, which a few rows do not pay back: a one-frame
   Mimi tick of one stream (2 rows a product in its transformer) took 69 ms packing per
   call, 23 ms from the context's copy, on this project's AVX-512 Xeon. The kernel and its
   summation order are the same either way, so a product is bit-identical at any row
   count (streamed == offline, batched == alone); the copy costs memory, so products of
   many rows, which amortise the per-call packing, do without it. */
#define LN_MIN_ROWS 128

/* What a pack holds: F32 panels, BF16 pairs, or BF16x3's split pairs (below). */
typedef enum cr_pack_kind { CR_PACK_F32, CR_PACK_BF16, CR_PACK_BF16X3 } cr_pack_kind;

/* One weight packed for the product kernels: w [M][C][taps] (a linear layer's
   [M][K] is one tap) as panels [P][taps][K2p][64] of BF16 pairs or [P][taps][C][64]
   floats (CR_PACK_F32: the panels the F32 kernels otherwise pack per call),
   P = M/64 rounded up. For BF16, K2p is C2 = C/2 rounded up, and for the AMX
   kernel (amx: ops_amx.c) rounded up again to 16 with zero pairs, so that a tap is
   whole tiles; the x rows it multiplies are K2p pairs apart, zero past C.

   BF16x3 (CODECRT_PRECISION_BF16X3): w = hi + lo with hi = bf16(w) and lo =
   bf16(w - hi), 16 significant bits of w's 24; a tap's pair rows are three blocks
   of K2p/3 each, [hi; lo; hi], and x's rows are converted the same way into
   [hi | hi | lo] (bf_convert_row_x3), so that the one BF16 product over 3 blocks
   sums x_hi w_hi + x_hi w_lo + x_lo w_hi: an F32 product to about 2^-16 relative
   (x_lo w_lo, 2^-16 of it, is left out), in F32 sums, on the same kernels.

   Keyed by the weight's data and shape, the convolution's dilation and left pad
   and the kind, so views of one weight share it. */
typedef struct cr_packed {
    const void *data;
    int64_t C, taps, M;
    int32_t dilation, pad_left;
    cr_pack_kind kind;
    bool amx;           /* BF16 products on AMX tiles */
    int64_t K2p;        /* BF16: pair rows per tap (BF16x3: the three blocks) */
    uint32_t *panels;   /* BF16 pairs, or floats when f32 */
} cr_packed;

/* The packed form of w (data in host memory), packed now if new; NULL if w is
   not in host memory, memory runs out, or without AVX-512 (the caller packs
   per call instead). */
const cr_packed *cr_packs_get(cr_packs *packs, const struct ggml_tensor *w, int64_t C, int64_t taps, int64_t M,
                              int dilation, int pad_left, cr_pack_kind kind);

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

/*
 * n output rows (ldc apart) of 16*nc columns from a packed panel wp
 * [taps][K][64] (ops_avx512_core.c).
 */
AT_AVX512 void at_panel_rows(const float *x, int64_t lda, int64_t atap, const float *wp, int64_t K, int64_t taps,
                             const float *bias, float *y, int64_t ldc, int nc, int64_t n);

/* ------------------------------------------------------------------- AVX2 */

#define A2 __attribute__((target("avx2,fma")))
#define A2_INLINE static inline __attribute__((always_inline)) A2
/* B rows ahead that at2_tile prefetches. A tile reads one 64-byte line of each 256-byte row
   of a packed panel (its 16 of the panel's 64 columns), a stride the hardware prefetchers
   of an EPYC Zen 1 followed poorly: a stream's tick, whose few rows read every weight panel
   from memory once, spent a quarter of its time on that load. Prefetching the line 16 rows
   ahead took a one-thread 10 s SNAC 24 kHz stream at 4-frame ticks from 5.3 to 3.7 CPU s
   (offline: 3.5, unchanged); 4, 8 or 32 rows ahead gave 3.8 to 4.5 s, 64 gave 4.3 to 4.5. */
#define A2_PF 16

/*
 * The tile on CPUs with AVX2 and FMA but no AVX-512: 16 columns of R rows (R <= AT_R = 6:
 * 12 accumulators, 2 loads of B and a broadcast in the 16 ymm registers). C[r][0..15] =
 * scale * sum over taps and k of A_t[r][k] B_t[k][0..15] + bias[0..15]; A [R, K] rows lda
 * apart, tap t at A + t*atap; B [K, 16] rows ldb apart, tap t at B + t*btap. The sums are
 * at_tile's: one FMA chain per output over (tap, k) from zero, then acc * scale + bias in
 * one FMA, so both instruction sets give the same floats.
 */
A2_INLINE void at2_tile(int R, const float *a, int64_t lda, int64_t atap, const float *b, int64_t ldb, int64_t btap,
                        int64_t K, int64_t taps, float *c, int64_t ldc, float scale, const float *bias) {
    __m256 acc[AT_R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        acc[r][0] = _mm256_setzero_ps();
        acc[r][1] = _mm256_setzero_ps();
    }
    for (int64_t t = 0; t < taps; t++) {
        const float *at = a + t * atap, *bt = b + t * btap;
        for (int64_t k = 0; k < K; k++) {
            _mm_prefetch((const char *)(bt + (k + A2_PF) * ldb), _MM_HINT_T0); /* past the end: harmless */
            const __m256 b0 = _mm256_loadu_ps(bt + k * ldb), b1 = _mm256_loadu_ps(bt + k * ldb + 8);
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

/* at_panel_rows on AVX2 and FMA, the same sums (ops_avx2_products.c) */
A2 void at2_panel_rows(const float *x, int64_t lda, int64_t atap, const float *wp, int64_t K, int64_t taps,
                       const float *bias, float *y, int64_t ldc, int nc, int64_t n);

/* The F32 attention's two steps on AVX2 and FMA (ops_avx2_attention.c), the same floats as
   ops_avx512_attention.c's at_scores and at_finish: S[nq, ncols] = scale * A B (A [nq, 64]
   rows lda apart, B [64, ncols] packed, ncols a multiple of 16); then the softmax of S's
   rows over the first T of Tp columns and O's rows = P V (V rows ld apart, O rows ld apart). */
A2 void at2_scores(const float *a, int64_t lda, const float *b, int64_t ldb, int64_t ncols, int64_t nq, float *s,
                   int64_t lds, float scale);
A2 void at2_finish(float *s, int64_t Tp, int64_t T, int64_t nq, const float *v, int64_t ld, float *o);

/* The F32 panel product of the CPU at hand: at_panel_rows with AVX-512, else
   at2_panel_rows (cr_f32_products_cpu_available: one of the two). */
static inline void at_panel_rows_any(const float *x, int64_t lda, int64_t atap, const float *wp, int64_t K,
                                     int64_t taps, const float *bias, float *y, int64_t ldc, int nc, int64_t n) {
    if (cr_attention_cpu_available()) {
        at_panel_rows(x, lda, atap, wp, K, taps, bias, y, ldc, nc, n);
    } else {
        at2_panel_rows(x, lda, atap, wp, K, taps, bias, y, ldc, nc, n);
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

/* n floats -> ceil(n/2) pairs, the odd tail padded with a zero (ops_avx512_core.c). */
BF_AVX512 void bf_convert_row(uint32_t *dst, const float *src, int64_t n);
/* BF16x3's row of x (cr_packed): n floats -> [hi | hi | lo] pairs, each block part
   pairs long (part >= ceil(n/2); the pairs past ceil(n/2) in each block untouched). */
BF_AVX512 void bf_convert_row_x3(uint32_t *dst, const float *src, int64_t n, int64_t part);
/* A row of x as the product with packed weight pk (or, pk NULL, with per-call panels)
   reads it: bf_convert_row_x3 into pk's three blocks for BF16x3, else bf_convert_row. */
BF_AVX512 void bf_convert_row_for(const cr_packed *pk, uint32_t *dst, const float *src, int64_t n);
/* at_panel_rows for pair-packed x and panel wp [taps][K2][64], on AMX tiles where pk (the
   weight's pack, or NULL) was packed for them (amx_rows' conditions) (ops_avx512_core.c). */
BF_AVX512 void bf_panel_rows(const cr_packed *pk, const uint32_t *x, int64_t lda, int64_t atap, const uint32_t *wp, int64_t K2,
                             int64_t taps, const float *bias, float *y, int64_t ldc, int nc, int64_t n);
/* the F32 panel [taps][C][64] of output columns m0 .. m0+width (ops_avx512_linear.c) */
void at_pack_panel(float *wp, const float *w, int64_t m0, int64_t width, int64_t C, int64_t taps);
/* The panel [taps][K2p][64] of output columns m0 .. m0+width of w [M][C][taps] in pairs
   (K2p >= C2 pair rows a tap; the rows past C2 are left as they are); row: scratch of
   C*taps + 32 halves. x3: BF16x3's [hi; lo; hi] blocks of K2p/3 pair rows (cr_packed), row
   then scratch of 3 (C*taps + 32) halves. */
BF_AVX512 void bf_pack_panel(uint32_t *wp, uint16_t *row, const float *w, int64_t m0, int64_t width, int64_t C,
                             int64_t taps, int64_t K2p, bool x3);

#ifdef CR_OPS_AMX
/* y[r][c] = scale * sum over taps t, pairs k < K2p of x[r*lda + t*atap + k] . w[t*btap +
   k*ldb + c] + bias[c] (bias may be NULL) for r < n, c < ncols, on AMX tiles
   (ops_amx.c): K2p and ncols multiples of 16, w's rows of pairs ldb apart. x's rows are
   read in blocks of 16, so up to 15 rows past the n-th (and past each tap's shift) must
   be readable; what they hold only reaches the rows not written. part > 0: BF16x3's
   blocks (cr_packed; K2p = 3 part, x [hi | hi | lo], w [hi | lo | hi]), the same three
   products summed per pair step rather than block after block; 0 otherwise. */
void amx_rows(const uint32_t *x, int64_t lda, int64_t atap, const uint32_t *w, int64_t ldb, int64_t btap,
              int64_t K2p, int64_t part, int64_t taps, float scale, const float *bias, float *y, int64_t ldc,
              int64_t ncols, int64_t n);
#endif

#endif /* CR_OPS_AVX512 */

#endif /* CODECRT_OPS_AVX512_H */
