/*
 * mimi.h: the Mimi decoder (Kyutai; the codec of Moshi and Sesame CSM): what
 * its files share. Not installed.
 *
 *   mimi.c         hyperparameters, tensor list, the architecture table, the
 *                  pieces both graphs use (quantizer, upsample, transformer
 *                  layer, SEANet decoder)
 *   mimi_decode.c  the offline decode graph and its inputs
 *   mimi_stream.c  the streaming tick graph
 *
 * Activations are F32 [C, T, B], channels fastest. Decoder path per sequence
 * (released sizes: D 512, 32 codebooks of 2048 x 256, 8 layers x 8 heads,
 * window 250 steps, SEANet 1024 -> 64 channels, ratios 8 6 5 4):
 *
 *   codes [K, T] (K in 1..n_q; an absent codebook reads code `bins`: the
 *     zero row that follows each codebook)
 *     -> get_rows(codebooks) summed within the semantic group (codebooks
 *        0..n_sem-1) and the acoustic group (the rest), each group's
 *        output_proj (1x1, no bias), summed                      [D, T]
 *   depthwise ConvTranspose1d k4 stride 2, causal (trim 2)       [D, 2T]
 *   n_layers x pre-LN transformer layer at 25 Hz: x += Wo attn(LN1 x),
 *     x += W2 gelu(W1 LN2 x) (LayerScale folded into Wo and W2 by the
 *     converter); 64-channel heads, RoPE on q and k (interleaved pairs,
 *     absolute positions from the stream start), causal attention over a
 *     window of `context` steps: query q sees keys q-context+1 .. q
 *   SEANet: causal conv k7 [C0, 2T]; per ratio r: ELU, causal
 *     ConvTranspose1d (k 2r, stride r, trim r) [C/2, .. x r], residual
 *     block(s) x + conv1x1(ELU(conv_k3_dil(ELU(x)))); ELU, causal conv k3
 *     to one channel -> [1, T * 1920]. No tanh.
 *
 * Everything is causal: sample t depends on codes of frames <= t / 1920, so
 * bucketed (right-padded) decodes need no masks, and a stream emits each
 * frame's audio as soon as the frame arrives (latency 0 beyond the frame).
 */
#ifndef CODECRT_MIMI_H
#define CODECRT_MIMI_H

#include "layers.h"
#include "stream_state.h"

#define MIMI_MAX_RATIOS 8
#define MIMI_MAX_RES 4
#define MIMI_MAX_LAYERS 32

typedef struct mimi_hparams {
    int32_t sample_rate;
    int32_t dim;            /* D: quantizer output, transformer width, SEANet input */
    int32_t n_filters;
    int32_t n_res;          /* residual blocks per ratio */
    int32_t kernel;         /* first conv */
    int32_t last_kernel;
    int32_t res_kernel;
    int32_t dil_base;
    int32_t compress;
    int32_t n_q;
    int32_t n_q_sem;
    int32_t bins;
    int32_t cdim;
    int32_t n_layers;
    int32_t n_heads;
    int32_t ff;
    int32_t context;        /* attention window in transformer steps */
    int32_t up_stride;      /* transformer steps per code frame (2) */
    int32_t hop;            /* samples per transformer step: prod(ratios) */
    int32_t n_ratios;
    int32_t ratios[MIMI_MAX_RATIOS];
    float rope_theta;
    float norm_eps;
} mimi_hparams;

/* Indices into the graph's io[] table. */
enum {
    MIMI_IO_OUT = 0,
    MIMI_IO_POS = 1,      /* I32 [2T * B]: absolute transformer step */
    MIMI_IO_MASK = 2,     /* F32 [2T, 2T] (keys, queries): 0 inside the causal window, else -INF */
    MIMI_IO_CODES = 3,    /* + codebook: I32 [T * B], `bins` for an absent codebook */
    MIMI_IO_END = MIMI_IO_CODES + CODECRT_MAX_LEVELS
};
_Static_assert(MIMI_IO_END <= CR_MAX_IO, "io table too small");

static inline int32_t mimi_head_dim(const mimi_hparams *hp) { return hp->dim / hp->n_heads; }
/* SEANet channels after i ratios (0: the first conv's output) */
static inline int32_t mimi_channels(const mimi_hparams *hp, int i) {
    return hp->n_filters << (hp->n_ratios - i);
}

/* ------------------------------------------------- graph pieces (mimi.c) */

/* weight lookup by printf-style name (layers.h) */
#define mimi_w cr_weight

/*
 * The split RVQ (Mimi's and the Qwen3-TTS 12 Hz tokenizer's): codes[k], I32
 * [T*B] codes of codebook k of n_q, `bins` where the codebook is absent (its
 * zero row) -> [D, T, B]: codebooks 0..n_sem-1 and the rest each summed and
 * projected (weights quant.codebooks [cdim, n_q*(bins+1)], quant.first.proj
 * and quant.rest.proj [cdim, D]), the two groups added.
 */
struct ggml_tensor *mimi_split_rvq(struct ggml_context *ctx, struct ggml_context *w, int n_q, int n_sem, int bins,
                                   int cdim, struct ggml_tensor *const *codes, int64_t T, int64_t B);
static inline struct ggml_tensor *mimi_quantizer(struct ggml_context *ctx, struct ggml_context *w,
                                                 const mimi_hparams *hp, struct ggml_tensor *const *codes, int64_t T,
                                                 int64_t B) {
    return mimi_split_rvq(ctx, w, hp->n_q, hp->n_q_sem, hp->bins, hp->cdim, codes, T, B);
}

/* Depthwise causal upsample: buf [D, 1+n, B] (the previous frame, then n new
   ones) -> [D, 2n, B]. Offline, buf is the input padded with one zero frame. */
struct ggml_tensor *mimi_upsample(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *buf,
                                  int64_t n);

/* RoPE (interleaved pairs) on x [hd, H, N] at positions pos I32 [N]. */
struct ggml_tensor *mimi_rope(struct ggml_context *ctx, const mimi_hparams *hp, struct ggml_tensor *x,
                              struct ggml_tensor *pos);

/*
 * Attention of queries q [hd, H, Tq*B] over keys and values k, v [hd, H,
 * Tk*B] (views allowed), mask F32 [Tk, Tq, 1 or B] of 0 / -INF, scores
 * scaled by 1/sqrt(hd) -> [hd*H, Tq, B].
 */
struct ggml_tensor *mimi_attend(struct ggml_context *ctx, int64_t hd, int64_t H, struct ggml_tensor *q,
                                struct ggml_tensor *k, struct ggml_tensor *v, struct ggml_tensor *mask,
                                int64_t Tq, int64_t Tk, int64_t B);

/*
 * The same with the values already time fastest, vt [Tk, hd*H, B] contiguous
 * (a stream keeps them so: no transpose of the window per tick), and k also
 * as [hd*H, Tk, B]; a contiguous q or k is not copied.
 */
struct ggml_tensor *mimi_attend_vt(struct ggml_context *ctx, int64_t hd, int64_t H, struct ggml_tensor *q,
                                   struct ggml_tensor *k, struct ggml_tensor *vt, struct ggml_tensor *mask,
                                   int64_t Tq, int64_t Tk, int64_t B);

/*
 * A stream tick's causal attention with a KV window (Mimi, Qwen3): the n new
 * queries q [hd, H, n*B], keys k [A, n, B] (post-RoPE) and values v [A, n, B]
 * (A = hd*H; views allowed) over the window of S = W-1 kept steps plus the n
 * new ones, mask [Tk, n, 1, B] (mimi_stream_mask, Tk = cr_window_steps(S, n))
 * -> [A, n, B]. Takes two window rings (cr_states_window), in this order: the
 * keys and the values (the stream-states list gives each as
 * cr_state_spec_add_window(A, S, steps per frame)).
 */
struct ggml_tensor *mimi_stream_attend(cr_states *st, int64_t hd, int64_t H, struct ggml_tensor *q,
                                       struct ggml_tensor *k, struct ggml_tensor *v, struct ggml_tensor *mask,
                                       int64_t S);

/*
 * A stream tick's attention mask [Tk, n, 1, B] over a ring's window of Tk =
 * cr_window_steps(S, n) steps (E = Tk - n - S older steps, the S kept ones,
 * then the n new ones): 0 where key j is in the window of new query i
 * (E + i <= j <= E + S + i) and valid (at or after the stream's start; rate:
 * transformer steps per code frame), else -1e30.
 */
struct ggml_tensor *mimi_stream_mask(cr_states *st, int64_t S, int32_t rate, int64_t n);

/* The offline window mask [S, S] (keys, queries) into f: 0 iff 0 <= q - k < context, else -INF. */
void mimi_window_mask(float *f, int64_t S, int64_t context);

/*
 * An offline decode's inputs (io[MIMI_IO_*]) for a transformer at `rate` steps per
 * frame: the code rows of n_q codebooks (`bins`, the zero row, where a codebook is
 * absent or the frame is padding), absolute positions, the window mask of `context`
 * steps. Staged through in->scratch, mimi_inputs_scratch floats.
 */
/* Those inputs, created in io[MIMI_IO_*] for T frames x B sequences (S = T * rate steps). */
void mimi_new_inputs(struct ggml_context *ctx, struct ggml_tensor **io, int n_q, int64_t T, int64_t B, int32_t rate);

void mimi_fill_inputs(const cr_graph_io *io, int n_q, int32_t bins, int32_t rate, int32_t context,
                      const cr_decode_shape *shape, const cr_decode_inputs *in);
size_t mimi_inputs_scratch(int n_q, int32_t rate, const cr_decode_shape *shape);

/* The feed-forward half of layer l, residual included: x [D, T, B]. */
struct ggml_tensor *mimi_ff(struct ggml_context *ctx, struct ggml_context *w, const mimi_hparams *hp,
                            struct ggml_tensor *x, int l, const cr_cpu_ops *ops);

/* ELU (SEANet's activation): the vectorized CPU op in CPU graphs (cpu_ops), ggml's elsewhere. */
struct ggml_tensor *mimi_elu(struct ggml_context *ctx, bool cpu_ops, struct ggml_tensor *x);

/* ----------------------------------------------------- graphs (decode, stream) */

struct ggml_cgraph *mimi_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                      const cr_decode_shape *shape, cr_graph_io *io);
int mimi_stream_states(const cr_model *model, cr_state_spec *specs, int max);
struct ggml_cgraph *mimi_build_stream(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                      const cr_stream_shape *shape, struct ggml_tensor *const *pool, int n_pool,
                                      cr_graph_io *io);
size_t mimi_scratch_floats(const cr_model *model, const cr_decode_shape *shape);
int64_t mimi_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context);
void mimi_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *io,
                     const cr_decode_inputs *in);

#endif /* CODECRT_MIMI_H */
