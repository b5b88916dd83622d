/*
 * ops_avx512_linear.c: linear layers and stride-1 convolutions for the CPU
 * backend on x86-64 CPUs with AVX-512 (S3Gen's estimator, encoder and
 * vocoder), in F32 or (CODECRT_PRECISION_BF16) with bfloat16 operands.
 *
 * Linear layers. ggml's F32 products (llamafile's tinyBLAS) reach 80 to 108
 * GFLOP/s on these shapes here; the same register tile on a packed weight panel
 * reaches about 150 (bench: native/tests/test_ops_cpu.c prints both), with the
 * bias added in the tile's epilogue instead of in a pass of its own.
 *
 * BF16 (ops_avx512.h): the same tiles on vdpbf16ps, which
 * does two multiply-adds per F32 lane, with operands packed as bfloat16 pairs
 * along the summed dimension; 1.5x (Turbo) to 1.9x (original) the F32 speed
 * on S3Gen end to end.
 *
 * F32 products also run on x86-64 CPUs with AVX2 and FMA only (the tile of
 * ops_avx2_products.c, the same sums). Elsewhere (other CPUs, other backends)
 * the graphs use ggml's ops; cr_f32_products_cpu_available() and
 * cr_bf16_cpu_available() say which.
 */
#include "ops_avx512.h"

/* whether this CPU runs these products: BF16 on AVX-512 with BF16, F32 on AVX-512 or on AVX2
   and FMA (ops_avx2_products.c) */
static bool cpu_products_available(bool bf16) {
    return bf16 ? cr_attention_cpu_available() && cr_bf16_cpu_available() : cr_f32_products_cpu_available();
}

/* the pack a product of these ops reads: F32 panels for F32 products on few rows, else
   the context's BF16 mode's */
static cr_pack_kind cr_ops_pack_kind(const cr_cpu_ops *ops, bool f32_few) {
    return f32_few || !ops || !ops->bf16 ? CR_PACK_F32 : ops->x3 ? CR_PACK_BF16X3 : CR_PACK_BF16;
}

#ifdef CR_OPS_AVX512

/* wp[t][c][j] = w[m0 + j][c][t] for j < width: the panel of output columns
   m0 .. m0+width of w [M][C][taps] (a linear layer's W [M][C] is one tap). */
void at_pack_panel(float *wp, const float *w, int64_t m0, int64_t width, int64_t C, int64_t taps) {
    for (int64_t j = 0; j < width; j++) {
        for (int64_t c = 0; c < C; c++) {
            const float *wr = w + ((m0 + j) * C + c) * taps;
            for (int64_t t = 0; t < taps; t++) {
                wp[(t * C + c) * LN_PANEL + j] = wr[t];
            }
        }
    }
}

#endif /* CR_OPS_AVX512 */

/* ------------------------------------------------------------------ linear */

/*
 * y = x W^T + b: x [K, N] (rows of K), W [K, M] in ggml's layout (M rows of K),
 * b [M] or absent -> y [M, N]. Per call (user: NULL for F32, else BF16), work
 * items are (panel of 64 output columns, block of 96 rows); a thread packs
 * each panel it visits once, as [K, 64] (columns contiguous, K*256 bytes: in L2
 * for K <= 2048), then sweeps its rows. With a packed weight (pk), items are
 * (block of rows, panel): a thread rounds its block of x to pairs once and
 * sweeps the panels. BF16 with a pack and rows for every thread: each thread
 * takes its own rows (whole blocks of 16, as the tiles read them) and all the
 * panels, so that the threads' shares differ by at most 16 rows: split by items,
 * a short last block left them uneven (400 frames of WavTokenizer 40 went as
 * 240 rows to one thread and 160 to the other; evened out, its BF16x3 decode ran
 * 1.2x faster on this project's AMX Xeon, 2026-12-08).
 */
/* A thread's rows [*lo, *hi) of n when packed BF16 products are split by rows (every thread
   gets 32 or more; whole blocks of 16 but the last thread's): false, and all n, otherwise. */
static bool ln_thread_rows(bool packed_bf16, int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    const bool by_rows = packed_bf16 && n >= 32 * (int64_t)nth;
    *lo = by_rows ? n * ith / nth / 16 * 16 : 0;
    *hi = by_rows && ith + 1 < nth ? n * (ith + 1) / nth / 16 * 16 : n;
    return by_rows;
}

static void cr_linear_run(struct ggml_tensor *dst, int ith, int nth, bool bf16, const cr_packed *pk) {
    const struct ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const int64_t K = x->ne[0], N = ggml_nrows(x), M = w->ne[1], K2 = (K + 1) / 2;
    int64_t r_lo, r_hi; /* this thread's rows (all of them when split by items) */
    const bool by_rows = ln_thread_rows(pk && bf16, N, ith, nth, &r_lo, &r_hi);
    const int64_t P = (M + LN_PANEL - 1) / LN_PANEL, NB = (r_hi - r_lo + LN_NB - 1) / LN_NB, n = P * NB;
    const int64_t it0 = by_rows ? 0 : n * ith / nth, it1 = by_rows ? n : n * (ith + 1) / nth;
    const float *xd = (const float *)x->data, *wd = (const float *)w->data;
    const float *bd = b ? (const float *)b->data : NULL;
    float *yd = (float *)dst->data;
    float *wp = NULL;
#ifdef CR_OPS_AVX512
    /* F32: the panel [K, 64]. BF16: the block's rows [96, K2] in pairs, and
       unless packed, the panel [K2, 64] and one weight row rounded. */
    const int64_t K2s = pk && bf16 ? pk->K2p : K2; /* pairs from one row of x to the next */
    const size_t words = !bf16 ? (pk ? 16 : (size_t)(K * LN_PANEL)) /* F32 packed: none needed */
                         : pk  ? (size_t)(K2s * LN_NB)
                               : (size_t)(K2 * (LN_PANEL + LN_NB + 1) + 16);
    wp = (float *)aligned_alloc(64, (words * sizeof(float) + 63) & ~(size_t)63);
    if (wp && pk && pk->kind != CR_PACK_F32) {
        memset(wp, 0, words * sizeof(float)); /* the rows' pairs past K2 (AMX's padding, BF16x3's blocks) stay zero */
    }
#endif
    int64_t packed = -1, converted = -1;
#ifndef CR_OPS_AVX512
    (void)bf16, (void)K2, (void)packed, (void)converted;
#endif
    for (int64_t it = it0; it < it1; it++) {
        const int64_t p = pk ? it % P : it / NB, m0 = p * LN_PANEL, n0 = r_lo + (pk ? it / P : it % NB) * LN_NB;
        const int64_t width = M - m0 < LN_PANEL ? M - m0 : LN_PANEL, n1 = r_hi - n0 < LN_NB ? r_hi : n0 + LN_NB;
#ifdef CR_OPS_AVX512
        if (wp && bf16) {
            uint32_t *px = (uint32_t *)wp, *pw = pk ? pk->panels + p * K2s * LN_PANEL : px + K2 * LN_NB;
            if (!pk && packed != p) {
                bf_pack_panel(pw, (uint16_t *)(pw + K2 * LN_PANEL), wd, m0, width, K, 1, K2, false);
                packed = p;
            }
            if (converted != n0) {
                for (int64_t r = n0; r < n1; r++) {
                    bf_convert_row_for(pk, px + (r - n0) * K2s, xd + r * K, K);
                }
                converted = n0;
            }
            /* AMX: px holds LN_NB rows, whole blocks of 16 */
            bf_panel_rows(pk, px, K2s, 0, pw, K2s, 1, bd ? bd + m0 : NULL, yd + n0 * M + m0, M,
                          (int)(width / 16), n1 - n0);
            continue;
        }
        if (wp) {
            const float *pw = pk ? (const float *)pk->panels + p * K * LN_PANEL : wp;
            if (!pk && packed != p) {
                at_pack_panel(wp, wd, m0, width, K, 1);
                packed = p;
            }
            at_panel_rows_any(xd + n0 * K, K, 0, pw, K, 1, bd ? bd + m0 : NULL, yd + n0 * M + m0, M, (int)(width / 16),
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
    const cr_packed *pk = (const cr_packed *)user;
    cr_linear_run(dst, ith, nth, pk->kind != CR_PACK_F32, pk);
}

struct ggml_tensor *cr_linear_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16;
    const bool ok = cpu_products_available(bf16) &&
                    x->type == GGML_TYPE_F32 && w->type == GGML_TYPE_F32 && ggml_is_contiguous(x) &&
                    ggml_is_contiguous(w) && w->ne[2] == 1 && w->ne[3] == 1 && w->ne[0] == x->ne[0] &&
                    w->ne[1] % 16 == 0 &&
                    (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == w->ne[1]));
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[3] = {x, w, b};
    const bool f32_few = !bf16 && ggml_nrows(x) < LN_MIN_ROWS;
    const cr_packed *pk = bf16 || f32_few ? cr_packs_get(ops ? ops->packs : NULL, w, w->ne[0], 1, w->ne[1], 0, 0,
                                                         cr_ops_pack_kind(ops, f32_few))
                                          : NULL;
    if (pk) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], x->ne[2], x->ne[3], args, b ? 3 : 2,
                              cr_linear_packed_kernel, GGML_N_TASKS_MAX, (void *)pk);
    }
    /* BF16x3 splits packed weights only: without a pack, F32 */
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], x->ne[2], x->ne[3], args, b ? 3 : 2,
                          cr_linear_kernel, GGML_N_TASKS_MAX, bf16 && !ops->x3 ? (void *)1 : NULL);
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
    /* BF16 with a pack, one sequence: this thread's frames [t_lo, t_hi) in whole blocks of 16
       and all the panels, as cr_linear_run's rows */
    int64_t t_lo, t_hi;
    const bool by_rows = ln_thread_rows(pk && bf16 && B == 1, To, ith, nth, &t_lo, &t_hi);
    const int64_t P = (M + LN_PANEL - 1) / LN_PANEL, NB = (t_hi - t_lo + LN_NB - 1) / LN_NB, n = P * B * NB;
    const int64_t it0 = by_rows ? 0 : n * ith / nth, it1 = by_rows ? n : n * (ith + 1) / nth;
    const float *xd = (const float *)x->data, *wd = (const float *)w->data;
    const float *bd = b ? (const float *)b->data : NULL;
    float *yd = (float *)dst->data;
    float *wp = NULL;
#ifdef CR_OPS_AVX512
    /* the panel [taps, C, 64] (none if packed) and the input window [96 + span, C];
       in pairs for BF16, with the packer's rounded weight row */
    const int64_t C2s = pk && bf16 ? pk->K2p : C2; /* pairs from one frame of x to the next */
    const size_t wfl = pk ? 0 : (size_t)(taps * (bf16 ? C2 : C) * LN_PANEL);
    /* AMX reads the window in blocks of 16 frames: at most LN_NB (a multiple of 16) + span */
    const size_t xfl = (size_t)((LN_NB + span) * (bf16 ? C2s : C));
    const size_t rfl = bf16 && !pk ? (size_t)((C * taps + 1) / 2 + 16) : 0;
    wp = (float *)aligned_alloc(64, ((wfl + xfl + rfl) * sizeof(float) + 63) & ~(size_t)63);
    if (wp && pk && pk->kind != CR_PACK_F32) {
        memset(wp + wfl, 0, xfl * sizeof(float)); /* the frames' pairs past C2 (AMX's padding, BF16x3's blocks) stay zero */
    }
#endif
    int64_t packed = -1, window = -1;
#ifndef CR_OPS_AVX512
    (void)bf16, (void)C2, (void)span, (void)packed, (void)window;
#endif
    for (int64_t it = it0; it < it1; it++) {
        /* per call: (panel, sequence, block of frames); packed: (sequence, block, panel) */
        const int64_t p = pk ? it % P : it / (B * NB), bb = pk ? it / (P * NB) : (it / NB) % B;
        const int64_t tb = pk ? (it / P) % NB : it % NB, t0 = t_lo + tb * LN_NB;
        const int64_t m0 = p * LN_PANEL, width = M - m0 < LN_PANEL ? M - m0 : LN_PANEL;
        const int64_t nrow = t_hi - t0 < LN_NB ? t_hi - t0 : LN_NB;
        const float *xb = xd + bb * T * C;
        float *yb = yd + bb * To * M;
#ifdef CR_OPS_AVX512
        if (wp && bf16) {
            uint32_t *xs = (uint32_t *)wp + wfl;
            const uint32_t *pw = pk ? pk->panels + p * taps * C2s * LN_PANEL : (const uint32_t *)wp;
            if (!pk && packed != p) {
                bf_pack_panel((uint32_t *)wp, (uint16_t *)(xs + xfl), wd, m0, width, C, taps, C2, false);
                packed = p;
            }
            if (window != bb * NB + tb) {
                for (int64_t i = 0; i < nrow + span; i++) {
                    const int64_t sf = t0 + i - pl;
                    if (sf >= 0 && sf < T) {
                        bf_convert_row_for(pk, xs + i * C2s, xb + sf * C, C);
                    } else {
                        memset(xs + i * C2s, 0, (size_t)C2s * sizeof(uint32_t));
                    }
                }
                window = bb * NB + tb;
            }
            bf_panel_rows(pk, xs, C2s, d * C2s, pw, C2s, taps, bd ? bd + m0 : NULL, yb + t0 * M + m0, M,
                          (int)(width / 16), nrow);
            continue;
        }
        if (wp) {
            float *xs = wp + wfl;
            const float *pw = pk ? (const float *)pk->panels + p * taps * C * LN_PANEL : wp;
            if (!pk && packed != p) {
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
            at_panel_rows_any(xs, C, d * C, pw, C, taps, bd ? bd + m0 : NULL, yb + t0 * M + m0, M, (int)(width / 16),
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
    cr_conv1d_run(dst, ith, nth, pk->dilation, pk->pad_left, pk->kind != CR_PACK_F32, pk);
}

struct ggml_tensor *cr_conv1d_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, int dilation, int pad_left, int pad_right,
                                  const cr_cpu_ops *ops) {
    const bool bf16 = ops && ops->bf16;
    const int64_t To = x->ne[1] + pad_left + pad_right - (int64_t)dilation * (w->ne[0] - 1);
    const bool ok = cpu_products_available(bf16) &&
                    x->type == GGML_TYPE_F32 && w->type == GGML_TYPE_F32 &&
                    ggml_is_contiguous(x) && ggml_is_contiguous(w) && x->ne[3] == 1 && w->ne[3] == 1 &&
                    w->ne[1] == x->ne[0] && w->ne[2] % 16 == 0 && dilation >= 1 && dilation < 0x8000 &&
                    pad_left >= 0 && pad_left < 0x10000 && pad_right >= 0 && To >= 1 &&
                    (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == w->ne[2]));
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[3] = {x, w, b};
    const bool f32_few = !bf16 && To * x->ne[2] < LN_MIN_ROWS;
    const cr_packed *pk = bf16 || f32_few ? cr_packs_get(ops ? ops->packs : NULL, w, w->ne[1], w->ne[0], w->ne[2],
                                                         dilation, pad_left, cr_ops_pack_kind(ops, f32_few))
                                          : NULL;
    if (pk) {
        return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[2], To, x->ne[2], 1, args, b ? 3 : 2, cr_conv1d_packed_kernel,
                              GGML_N_TASKS_MAX, (void *)pk);
    }
    void *params = (void *)(((uintptr_t)pad_left << 16) | (bf16 && !ops->x3 ? 0x8000u : 0u) | (uintptr_t)dilation);
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[2], To, x->ne[2], 1, args, b ? 3 : 2, cr_conv1d_kernel,
                          GGML_N_TASKS_MAX, params);
}
