/*
 * ops_avx512_core.c: the parts every AVX-512 kernel uses: the CPU feature
 * checks, the panel products (a packed weight panel times rows of x on the
 * register tile, for linear layers and convolutions alike), bfloat16 rounding
 * and packing, and the BF16 weight packs a context keeps.
 */
#include "ops_avx512.h"

#ifdef CR_OPS_AVX512

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
AT_AVX512 void at_panel_rows(const float *x, int64_t lda, int64_t atap, const float *wp, int64_t K,
                             int64_t taps, const float *bias, float *y, int64_t ldc, int nc, int64_t n) {
    for (int64_t r0 = 0; r0 < n; r0 += AT_R) {
        const float *a = x + r0 * lda;
        float *c = y + r0 * ldc;
        AT_ROWS(n - r0, PN_COLS);
    }
}

/* n floats -> ceil(n/2) pairs, the odd tail padded with a zero. */
BF_AVX512 void bf_convert_row(uint32_t *dst, const float *src, int64_t n) {
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

/* hi = bf16(src), lo = bf16(src - hi) as halves, ceil(n/2) pairs each (an odd tail's
   pair ends in zeros): BF16x3's split, 16 significant bits of each float's 24. Finite
   values only: inf - inf makes lo NaN. */
BF_AVX512 static void bf_split_halves(uint16_t *hi, uint16_t *lo, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i < n; i += 16) {
        const int64_t left = n - i;
        const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(m, src + i);
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
        const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        const __m256i l = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, back));
        const __mmask8 pm = left >= 16 ? (__mmask8)0xff : (__mmask8)((1u << ((left + 1) / 2)) - 1u);
        _mm256_mask_storeu_epi32(hi + i, pm, h);
        _mm256_mask_storeu_epi32(lo + i, pm, l);
    }
}

BF_AVX512 void bf_convert_row_x3(uint32_t *dst, const float *src, int64_t n, int64_t part) {
    bf_split_halves((uint16_t *)dst, (uint16_t *)(dst + 2 * part), src, n);
    memcpy(dst + part, dst, (size_t)((n + 1) / 2) * sizeof(uint32_t));
}

BF_AVX512 void bf_convert_row_for(const cr_packed *pk, uint32_t *dst, const float *src, int64_t n) {
    if (pk && pk->kind == CR_PACK_BF16X3) {
        bf_convert_row_x3(dst, src, n, pk->K2p / 3);
    } else {
        bf_convert_row(dst, src, n);
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

/* at_panel_rows for pair-packed x (rows lda pairs apart) and panel wp [taps][K2][64]; on
   AMX tiles where pk was packed for them (its panels: K2 padded to 16, x's rows readable in
   blocks of 16). */
BF_AVX512 void bf_panel_rows(const cr_packed *pk, const uint32_t *x, int64_t lda, int64_t atap, const uint32_t *wp,
                             int64_t K2, int64_t taps, const float *bias, float *y, int64_t ldc, int nc, int64_t n) {
#ifdef CR_OPS_AMX
    if (pk && pk->amx) {
        const int64_t part = pk->kind == CR_PACK_BF16X3 ? K2 / 3 : 0;
        amx_rows(x, lda, atap, wp, LN_PANEL, K2 * LN_PANEL, K2, part, taps, 1.0f, bias, y, ldc, 16 * nc, n);
        return;
    }
#endif
    (void)pk;
    for (int64_t r0 = 0; r0 < n; r0 += AT_R) {
        const uint32_t *a = x + r0 * lda;
        float *c = y + r0 * ldc;
        AT_ROWS(n - r0, BF_COLS);
    }
}

/* Column j of a panel from one output channel's rounded weights row (C*taps halves,
   [c][t] as w lies): wp[t][base + c2][j] = pair(row[2c2][t], row[2c2+1][t]), a tap's
   rows K2p apart. */
static void bf_scatter_column(uint32_t *wp, const uint16_t *row, int64_t j, int64_t C, int64_t taps, int64_t K2p,
                              int64_t base) {
    const int64_t C2 = (C + 1) / 2;
    if (taps == 1) {
        const uint32_t *pairs = (const uint32_t *)row; /* odd C: the converter's zero ends the last pair */
        for (int64_t c2 = 0; c2 < C2; c2++) {
            wp[(base + c2) * LN_PANEL + j] = pairs[c2];
        }
        return;
    }
    for (int64_t c2 = 0; c2 < C2; c2++) {
        const uint16_t *lo = row + 2 * c2 * taps, *hi = lo + taps;
        const bool has_hi = 2 * c2 + 1 < C;
        for (int64_t t = 0; t < taps; t++) {
            wp[(t * K2p + base + c2) * LN_PANEL + j] = (uint32_t)lo[t] | (has_hi ? (uint32_t)hi[t] << 16 : 0u);
        }
    }
}

/* wp[t][c2][j] = pair(w[m0+j][2c2][t], w[m0+j][2c2+1][t]) for j < width, a tap's
   rows K2p apart: at_pack_panel in pairs. Each output channel's C*taps weights are
   rounded by the vector converter into row (C*taps + 1 halves), then paired; BF16x3
   (x3) splits them into hi and lo and writes the blocks [hi; lo; hi]. */
BF_AVX512 void bf_pack_panel(uint32_t *wp, uint16_t *row, const float *w, int64_t m0, int64_t width, int64_t C,
                             int64_t taps, int64_t K2p, bool x3) {
    const int64_t n = C * taps, part = x3 ? K2p / 3 : K2p;
    uint16_t *lo = row + ((n + 1) & ~(int64_t)1) + 32; /* whole pairs: read as uint32_t, 4-byte aligned */
    for (int64_t j = 0; j < width; j++) {
        if (!x3) {
            bf_convert_row((uint32_t *)row, w + (m0 + j) * n, n);
            bf_scatter_column(wp, row, j, C, taps, K2p, 0);
            continue;
        }
        bf_split_halves(row, lo, w + (m0 + j) * n, n);
        bf_scatter_column(wp, row, j, C, taps, K2p, 0);
        bf_scatter_column(wp, lo, j, C, taps, K2p, part);
        bf_scatter_column(wp, row, j, C, taps, K2p, 2 * part);
    }
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
const cr_packed *cr_packs_get(cr_packs *packs, const struct ggml_tensor *w, int64_t C, int64_t taps,
                              int64_t M, int dilation, int pad_left, cr_pack_kind kind) {
#ifdef CR_OPS_AVX512
    if (!packs || !w->data || (w->buffer && !ggml_backend_buffer_is_host(w->buffer))) {
        return NULL;
    }
    for (size_t i = 0; i < packs->n; i++) {
        const cr_packed *e = packs->items[i];
        if (e->data == w->data && e->C == C && e->taps == taps && e->M == M && e->dilation == dilation &&
            e->pad_left == pad_left && e->kind == kind) {
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
    /* a panel in 32-bit words: BF16 pairs along C (for AMX, a tap's pair rows padded with
       zeros to whole tiles; BF16x3: three such blocks a tap), or floats */
    const bool f32 = kind == CR_PACK_F32, x3 = kind == CR_PACK_BF16X3;
    const bool amx = !f32 && cr_amx_cpu_available();
    const int64_t C2 = (C + 1) / 2, part = amx ? (C2 + 15) / 16 * 16 : C2, K2p = x3 ? 3 * part : part;
    const int64_t P = (M + LN_PANEL - 1) / LN_PANEL;
    const int64_t panel = taps * (f32 ? C : K2p) * LN_PANEL;
    cr_packed *e = (cr_packed *)calloc(1, sizeof(*e));
    uint16_t *row = (uint16_t *)malloc((size_t)(x3 ? 3 : 1) * (size_t)(C * taps + 32) * sizeof(uint16_t));
    uint32_t *panels = (uint32_t *)aligned_alloc(64, ((size_t)(P * panel) * sizeof(uint32_t) + 63) & ~(size_t)63);
    if (!e || !row || !panels) {
        free(e);
        free(row);
        free(panels);
        return NULL;
    }
    for (int64_t p = 0; p < P; p++) {
        const int64_t m0 = p * LN_PANEL, width = M - m0 < LN_PANEL ? M - m0 : LN_PANEL;
        if (width < LN_PANEL || part > C2) { /* columns past M, pair rows past C2: zero */
            memset(panels + p * panel, 0, (size_t)panel * sizeof(uint32_t));
        }
        if (f32) {
            at_pack_panel((float *)(panels + p * panel), (const float *)w->data, m0, width, C, taps);
        } else {
            bf_pack_panel(panels + p * panel, row, (const float *)w->data, m0, width, C, taps, K2p, x3);
        }
    }
    free(row);
    *e = (cr_packed){w->data, C, taps, M, dilation, pad_left, kind, amx, K2p, panels};
    packs->items[packs->n++] = e;
    packs->bytes += (size_t)(P * panel) * sizeof(uint32_t);
    return e;
#else
    (void)packs, (void)w, (void)C, (void)taps, (void)M, (void)dilation, (void)pad_left, (void)kind;
    return NULL;
#endif
}
