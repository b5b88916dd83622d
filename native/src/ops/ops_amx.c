/*
 * ops_amx.c: the BF16 panel product on Intel AMX tiles (Sapphire Rapids and
 * later Xeons), for the linear layers and convolutions whose weights a
 * context packed once (cr_packs_get).
 *
 * Why: on this project's Xeon the AVX512-BF16 tile (ops_avx512.h, bf_tile)
 * decoded the Vocos codecs slower than the F32 one (docs/benchmarks.md; in a
 * loop of independent instructions vdpbf16ps did only 1.5x the F32 FMA's
 * multiply-adds per second there, before converting x), while one TDPBF16PS
 * multiplies a 16 x 32 BF16 tile by a 32 x 16 one into 16 x 16 F32 sums:
 * 3.0 to 3.3 TFLOP/s on one core of that Xeon in a loop of them (operands in
 * tiles), against the 85 GFLOP/s or so of the F32 kernels per core. The
 * BF16 attention's two products (ops_avx512_attention.c) take the same tiles:
 * Q [16 rows, 32 pairs] by the packed keys, P by the values in pairs.
 *
 * Layout: the pair packing is AMX's own. A weight panel [taps][K2p][64] of
 * BF16 pairs is, for each tap, block of 16 pair rows and 16 columns, a B tile
 * of 16 rows of 64 bytes, 256 bytes apart; 16 rows of x in pairs (lda pairs
 * apart) from pair k0 on are an A tile of 16 rows of 64 bytes. K2p, the pair
 * rows of a tap, is C2 rounded up to 16 with zero pairs (cr_packs_get), and
 * the x rows are zero there too, so a tap is whole tiles. C tiles 0..3 hold a
 * block of 16 rows x 64 columns; A is tile 4, B tiles 5, 6, 7 (5 again for the
 * fourth column tile).
 *
 * Every output row is computed by the same sequence of tile products whatever
 * the number of rows or threads (a row's sums depend on its own A row only),
 * so batch invariance holds as in the other product kernels. The result
 * differs from bf_tile's in the order of the F32 sums (and TDPBF16PS treats
 * BF16 denormals as zero), within the BF16 mode's error.
 *
 * The kernel asks Linux once per process for the tile state
 * (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)). Linux refuses it
 * (ENOSPC) while a thread's alternate signal stack is too small for the 8 KB
 * of tile data in a signal frame (an 8 KB sigaltstack was refused here, 16 KB
 * not; with Python's faulthandler on, as under pytest, the tiles were granted:
 * a one-thread BF16 NeuCodec decode took 0.18 s with or without it, 0.96 s
 * with CODECRT_NO_AMX=1), and a seccomp
 * filter may refuse the call: then, as with CODECRT_NO_AMX=1 in the
 * environment, the AVX512-BF16 tile serves every BF16 product. Once granted,
 * Linux refuses a later sigaltstack() too small for the tile state (about
 * 11 KB) in every thread of the process: a host that installs small alternate
 * signal stacks after the first BF16 context should set CODECRT_NO_AMX=1.
 *
 * Each call loads its tile configuration and releases the tiles at its end.
 * ggml's own AMX kernels (its AMX buffer type for quantized weights, not used
 * here) keep a per-thread configuration loaded across calls instead; using
 * that buffer type would mean not releasing the tiles here.
 */
#define _GNU_SOURCE /* syscall() under -std=c11 */
#include "ops_avx512.h"

#ifdef CR_OPS_AMX
#include <cpuid.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifdef CR_OPS_AMX

#define AMX_ARCH_REQ_XCOMP_PERM 0x1023
#define AMX_XFEATURE_XTILEDATA 18

static bool g_amx;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
    const char *off = getenv("CODECRT_NO_AMX");
    if ((off && *off && strcmp(off, "0") != 0) || !cr_bf16_cpu_available()) {
        return;
    }
    unsigned a, b, c, d;
    /* CPUID.7.0:EDX bit 24 AMX-TILE, bit 22 AMX-BF16 (gcc 12's __builtin_cpu_supports
       does not know them); CPUID.1:ECX bit 27 OSXSAVE, then XCR0 bits 17 and 18
       (XTILECFG, XTILEDATA) enabled by the OS */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) {
        return;
    }
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) {
        return;
    }
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17)) {
        return;
    }
    g_amx = syscall(SYS_arch_prctl, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) == 0;
}

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,fma")))

/* LDTILECFG's 64-byte operand: palette 1, eight tiles of 16 rows x 64 bytes */
typedef struct amx_config {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* C tile J += A (tile 4) x the B tile of columns 16J.. from b, loaded into tile TB */
#define AMX_COL(J, TB)                                                                                               \
    do {                                                                                                             \
        _tile_loadd(TB, b + 16 * (J), ldb * (int64_t)sizeof(uint32_t));                                              \
        _tile_dpbf16ps(J, 4, TB);                                                                                    \
    } while (0)

/* BF16x3: C tile J += A_hi (tile 4) x B_hi + A_hi x B_lo + A_lo (tile 5) x B_hi, the column
   tile's B_hi and B_lo loaded into tiles 6 and 7 */
#define AMX_COL_X3(J)                                                                                                \
    do {                                                                                                             \
        _tile_loadd(6, b + 16 * (J), ldb * (int64_t)sizeof(uint32_t));                                               \
        _tile_loadd(7, bl + 16 * (J), ldb * (int64_t)sizeof(uint32_t));                                              \
        _tile_dpbf16ps(J, 4, 6);                                                                                     \
        _tile_dpbf16ps(J, 4, 7);                                                                                     \
        _tile_dpbf16ps(J, 5, 6);                                                                                     \
    } while (0)

/* One block's pair step k0 of one tap: the products into C tiles 0..nc-1. BF16x3 (part > 0;
   x's pair rows [hi | hi | lo], w's [hi | lo | hi], blocks of part): A_hi and A_lo loaded
   once for the three products of each column tile. Read a step at a time, the concatenated
   blocks moved 1.25 KB of tiles per product, 5 KB per 4: bound by L2 on this project's
   Xeon (0.9 TFLOP/s a core against 3.2 for the products alone); split this way, 10 KB
   per 12 (1.2 to 2.0x faster in a one-core loop over the Vocos codecs' shapes, 2026-12-08). */
AMX_TARGET static inline void amx_step(const uint32_t *at, int64_t lda, const uint32_t *bt, int64_t ldb,
                                       int64_t part, int64_t k0, int nc) {
    const uint32_t *b = bt + k0 * ldb;
    _tile_loadd(4, at + k0, lda * (int64_t)sizeof(uint32_t));
    if (part > 0) {
        const uint32_t *bl = bt + (part + k0) * ldb;
        _tile_loadd(5, at + 2 * part + k0, lda * (int64_t)sizeof(uint32_t));
        AMX_COL_X3(0);
        if (nc > 1) {
            AMX_COL_X3(1);
        }
        if (nc > 2) {
            AMX_COL_X3(2);
        }
        if (nc > 3) {
            AMX_COL_X3(3);
        }
        return;
    }
    AMX_COL(0, 5);
    if (nc > 1) {
        AMX_COL(1, 6);
    }
    if (nc > 2) {
        AMX_COL(2, 7);
    }
    if (nc > 3) {
        AMX_COL(3, 5);
    }
}

AMX_TARGET void amx_rows(const uint32_t *x, int64_t lda, int64_t atap, const uint32_t *w, int64_t ldb, int64_t btap,
                         int64_t K2p, int64_t part, int64_t taps, float scale, const float *bias, float *y,
                         int64_t ldc, int64_t ncols, int64_t n) {
    amx_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
    float cbuf[16 * 64] __attribute__((aligned(64))); /* a block's sums [16][64] */
    const __m512 sc = _mm512_set1_ps(scale);
    const int64_t steps = part > 0 ? part : K2p; /* pair rows a tap, split blocks counted once */
    for (int64_t c0 = 0; c0 < ncols; c0 += 64) {
        const int nc = ncols - c0 < 64 ? (int)((ncols - c0) / 16) : 4;
        for (int64_t r0 = 0; r0 < n; r0 += 16) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t t = 0; t < taps; t++) {
                const uint32_t *at = x + r0 * lda + t * atap, *bt = w + t * btap + c0;
                for (int64_t k0 = 0; k0 < steps; k0 += 16) {
                    amx_step(at, lda, bt, ldb, part, k0, nc);
                }
            }
            _tile_stored(0, cbuf, 64 * sizeof(float));
            _tile_stored(1, cbuf + 16, 64 * sizeof(float));
            _tile_stored(2, cbuf + 32, 64 * sizeof(float));
            _tile_stored(3, cbuf + 48, 64 * sizeof(float));
            /* the epilogue, as bf_tile's: scale * sum + bias, for the block's rows that exist */
            const int64_t rows = n - r0 < 16 ? n - r0 : 16;
            for (int64_t r = 0; r < rows; r++) {
                for (int j = 0; j < nc; j++) {
                    const __m512 bs = bias ? _mm512_loadu_ps(bias + c0 + 16 * j) : _mm512_setzero_ps();
                    _mm512_storeu_ps(y + (r0 + r) * ldc + c0 + 16 * j,
                                     _mm512_fmadd_ps(_mm512_load_ps(cbuf + r * 64 + 16 * j), sc, bs));
                }
            }
        }
    }
    _tile_release();
}

#endif /* CR_OPS_AMX */

bool cr_amx_cpu_available(void) {
#ifdef CR_OPS_AMX
    pthread_once(&g_amx_once, amx_probe);
    return g_amx;
#else
    return false;
#endif
}
