/*
 * qwen3.h: the Qwen3-TTS 12 Hz speech tokenizer's decoder (qwen-tts
 * Qwen3TTSTokenizerV2Decoder): what its files share. Not installed.
 *
 *   qwen3.c         hyperparameters, tensor list, the architecture table, the
 *                   pieces both graphs use
 *   qwen3_decode.c  the offline decode graph and its inputs
 *   qwen3_stream.c  the streaming tick graph
 *
 * Activations are F32 [C, T, B], channels fastest. Decoder path per sequence
 * (released sizes: 16 codebooks of 2048 x 256, Q 512, latent L 1024, width D
 * 512, 8 layers x 16 heads of 64, window 72 frames, decoder 1536 -> 96
 * channels, rates 8 5 4 3):
 *
 *   codes [K, T] (K in 1..n_q; an absent codebook reads its zero row)
 *     -> Mimi's split RVQ (mimi_split_rvq: codebook 0, and 1..K-1, each
 *        group summed and projected 256 -> Q, the two added)     [Q, T]
 *   pre_conv: causal conv k3 Q -> L                               [L, T]
 *   transformer at 12.5 Hz: input_proj L -> D (bias); n_layers x
 *     x += Wo attn(RMSNorm1 x), x += Wd (silu(Wg h) * Wu h), h = RMSNorm2 x
 *     (LayerScale folded into Wo and Wd by the converter); H heads of hd
 *     (H hd need not be D), RoPE on q and k (NEOX halves, positions from the
 *     stream start), causal attention over a window of `context` frames
 *     (query q sees keys q-context+1 .. q); RMSNorm; output_proj D -> L
 *   per upsampling ratio f: ConvTranspose1d(L, L, k f, stride f) (no
 *     overlap: one product), then a ConvNeXt block x + gamma pw2(gelu(pw1(
 *     LN(dwconv_k7_causal(x))))) (gamma folded into pw2)       [L, 4T]
 *   decoder: causal conv k7 L -> C0; per rate r: SnakeBeta, causal
 *     ConvTranspose1d (k 2r, stride r, trim r) C -> C/2, three residual
 *     units x + pw(Snake(conv_k7_dil(Snake(x)))) of dilation 1, 3, 9
 *     (DAC's unit, causal); SnakeBeta, causal conv k7 to one channel,
 *     clamp to [-1, 1]                                          [1, T*1920]
 *
 * SnakeBeta x + 1/(e^beta + 1e-9) sin(e^alpha x)^2 is the Snake of
 * layers.h with alpha and inv_alpha precomputed by the converter.
 * Everything is causal: sample t depends on codes of frames <= t / 1920, so
 * bucketed decodes need no masks and a stream emits each frame's audio when
 * the frame arrives (latency 0 beyond the frame).
 */
#ifndef CODECRT_QWEN3_H
#define CODECRT_QWEN3_H

#include "layers.h"
#include "stream_state.h"

#define QWEN3_MAX_UP 4
#define QWEN3_MAX_RATES 8
#define QWEN3_MAX_LAYERS 32
#define QWEN3_K 7       /* the ConvNeXt, decoder and residual convs' kernel */
#define QWEN3_PRE_K 3   /* pre_conv's kernel */
#define QWEN3_N_RES 3   /* residual units per decoder block, dilations 1, 3, 9 */

typedef struct qwen3_hparams {
    int32_t sample_rate;
    int32_t n_q;
    int32_t n_q_sem;
    int32_t bins;
    int32_t cdim;        /* codebook entries (Q / 2) */
    int32_t qdim;        /* Q: the quantizer's output */
    int32_t latent;      /* L */
    int32_t dim;         /* D: the transformer's width */
    int32_t n_layers;
    int32_t n_heads;
    int32_t head_dim;
    int32_t ff;
    int32_t context;     /* attention window in frames */
    int32_t dec_dim;     /* C0 */
    int32_t n_up;
    int32_t up[QWEN3_MAX_UP];
    int32_t n_rates;
    int32_t rates[QWEN3_MAX_RATES];
    int32_t up_total;    /* prod(up): decoder steps per frame */
    int32_t hop;         /* samples per frame: up_total * prod(rates) */
    float rope_theta;
    float norm_eps;      /* the transformer's RMSNorm */
} qwen3_hparams;

/* The offline graph's io[] table is Mimi's (MIMI_IO_*: out, pos, mask, codes), and so are its inputs. */

/* decoder channels after i rates (0: the first conv's output) */
static inline int32_t qwen3_channels(const qwen3_hparams *hp, int i) { return hp->dec_dim >> i; }

/* ------------------------------------------------ graph pieces (qwen3.c) */

/* codes -> [Q, T, B] (mimi_split_rvq) */
struct ggml_tensor *qwen3_quantizer(struct ggml_context *ctx, struct ggml_context *w, const qwen3_hparams *hp,
                                    struct ggml_tensor *const *codes, int64_t T, int64_t B);

/* q, k, v of layer l from x [D, T, B] (RMSNorm1 and the fused product): [3 A, T, B], A = H hd. */
struct ggml_tensor *qwen3_qkv(struct ggml_context *ctx, struct ggml_context *w, const qwen3_hparams *hp,
                              struct ggml_tensor *x, int l, const cr_cpu_ops *ops);

/* RoPE (NEOX halves) on x [hd, H, N] at positions pos I32 [N]. */
struct ggml_tensor *qwen3_rope(struct ggml_context *ctx, const qwen3_hparams *hp, struct ggml_tensor *x,
                               struct ggml_tensor *pos);

/* x + Wo o (LayerScale folded), then the SwiGLU feed-forward half with its residual: x [D, T, B]. */
struct ggml_tensor *qwen3_layer_out(struct ggml_context *ctx, struct ggml_context *w, const qwen3_hparams *hp,
                                    struct ggml_tensor *x, struct ggml_tensor *o, int l, const cr_cpu_ops *ops);

/* ConvTranspose1d(L, L, k f, stride f) of upsampling stage i: x [L, n, B] -> [L, f n, B]. */
struct ggml_tensor *qwen3_upsample(struct ggml_context *ctx, struct ggml_context *w, const qwen3_hparams *hp,
                                   struct ggml_tensor *x, int i, const cr_cpu_ops *ops);

/* The ConvNeXt block of stage i after its k7 depthwise conv: x [L, n, B] the block's input, dw its
   conv's output -> x + pw2(gelu(pw1(LN(dw)))). */
struct ggml_tensor *qwen3_convnext(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                   struct ggml_tensor *dw, int i, const cr_cpu_ops *ops);

/* SnakeBeta by weight-name prefix on x [C, T, B]. */
struct ggml_tensor *qwen3_snake(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                struct ggml_tensor *x, bool cpu_ops, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* The branch pw(Snake2(conv_k7_dil(y))) of residual unit j of block i on y = Snake1(x): buf [C,
   6 dil + n, B] (a stream's state, then the n new frames; pad 0), or the whole sequence [C, n, B]
   with pad = 6 dil (its causal zero padding) -> [C, n, B]. The caller adds the residual. */
struct ggml_tensor *qwen3_res_branch(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                     struct ggml_tensor *buf, int i, int j, int pad, bool cpu_ops,
                                     const cr_cpu_ops *ops);

/* SnakeBeta by weight-name prefix on codecrt's device ops (cr_snake_cols: one pass). NULL
   where it does not fit. */
struct ggml_tensor *qwen3_snake_dev(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                    const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Residual unit j of block i on codecrt's device ops (the graphs a CUDA context runs):
   x + pw(Snake2(conv_k7_dil(Snake1(buf)))) (cr_res_unit_cols, layers.h). buf: x itself with pad = 6 dil (offline, causal zero padding), or a
   stream's state of 6 dil frames of x (before Snake1: the Snake is pointwise, so gathering it
   from the state is the same) then x, with pad 0. Returns [C, n, B]; NULL where an op does
   not fit (the caller composes the unit then). */
struct ggml_tensor *qwen3_res_unit_dev(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *buf,
                                       struct ggml_tensor *x, int i, int j, int pad);

/* ----------------------------------------------------- graphs (decode, stream) */

struct ggml_cgraph *qwen3_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                       const cr_decode_shape *shape, cr_graph_io *io);
int qwen3_stream_states(const cr_model *model, cr_state_spec *specs, int max);
struct ggml_cgraph *qwen3_build_stream(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                       const cr_stream_shape *shape, struct ggml_tensor *const *pool, int n_pool,
                                       cr_graph_io *io);
size_t qwen3_scratch_floats(const cr_model *model, const cr_decode_shape *shape);
int64_t qwen3_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context);
void qwen3_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *io,
                      const cr_decode_inputs *in);

#endif /* CODECRT_QWEN3_H */
