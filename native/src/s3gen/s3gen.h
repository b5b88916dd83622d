/*
 * s3gen.h: Chatterbox S3Gen (CosyVoice2 flow matching + HiFT vocoder): what
 * its files share. Not installed.
 *
 *   s3gen.c            hyperparameters, tensor list, the architecture table
 *   s3gen_voice.c      voices: prompt and speaker conditioning
 *   s3gen_stages.c     each stage as a graph kind of the lifecycle manager
 *   s3gen_pipeline.c   the decode pipeline (encoder, the Euler loop over the
 *                      estimator with guidance, F0, host source, vocoder,
 *                      fade-in), the public flow/vocode calls and batches
 *   s3gen_diag.c       the stage-by-stage diagnostics
 *   s3gen_encoder.c    token embedding + UpsampleConformerEncoder + encoder_proj
 *   s3gen_estimator.c  the ConditionalDecoder (Matcha U-Net), one evaluation
 *   s3gen_hift.c       HiFTGenerator: F0 predictor, sine source, iSTFT decoder
 *
 * Tensor names: the PyTorch state-dict keys of the released s3gen.safetensors
 * with weight norm folded ("…parametrizations.weight.original0/1" and
 * "…weight_g/weight_v" become "….weight") and these prefixes shortened (GGUF
 * names are at most 63 bytes):
 *     "flow.decoder.estimator."  ->  "est."
 *     "flow.encoder."            ->  "enc."
 *     "mel2wav."                 ->  "hift."
 *     "flow."                    ->  "flow."   (input_embedding, encoder_proj, spk_embed_affine_layer)
 * Every tensor keeps its PyTorch shape, so its ggml ne is the reverse:
 * Linear weight (out, in) -> ne [in, out]; Conv1d weight (Cout, Cin, K) ->
 * ne [K, Cin, Cout]; ConvTranspose1d weight (Cin, Cout, K) -> ne [K, Cout, Cin].
 * Matrices flagged `mat` in the specs may be F16 (converter --dtype f16);
 * everything else is F32.
 *
 * Interface tensors between the stages are time-fastest like PyTorch's
 * (B, C, T): ggml ne [T, C, B]. Mel frames run at 50 Hz, tokens at 25 Hz.
 * Graphs built here must use only ops every backend has (no CPU custom ops
 * unless `cpu_ops`), F32 im2col (never ggml_conv_1d's F16 im2col), and no
 * ggml call that asserts on shapes the driver can produce.
 */
#ifndef CODECRT_S3GEN_INTERNAL_H
#define CODECRT_S3GEN_INTERNAL_H

#include "codecrt_s3gen.h"
#include "layers.h"

#define S3_VOCAB 6561          /* speech token ids 0..6560 */
#define S3_SOS 6561            /* Chatterbox LM start-of-speech id (dropped) */
#define S3_EOS 6562            /* Chatterbox LM stop-of-speech id (ends a stream) */
#define S3_D_MODEL 512         /* encoder width */
#define S3_MEL 80              /* mel bins */
#define S3_SPK 192             /* x-vector width */
#define S3_TOKEN_MEL 2         /* mel frames per token */
#define S3_LOOKAHEAD 3         /* PreLookaheadLayer tokens */
#define S3_SAMPLE_RATE 24000
#define S3_MEL_HOP 480         /* output samples per mel frame */
#define S3_HARMONICS 9         /* SineGen: fundamental + 8 harmonics */
#define S3_NFFT 16
#define S3_ISTFT_HOP 4
#define S3_TEMB 320            /* sinusoidal time-embedding width of the estimator */
#define S3_PI 3.14159265358979323846 /* M_PI is not C11 */

typedef struct s3gen_hparams {
    bool meanflow;      /* Turbo: mean flow, no CFG, time mixer in the estimator */
    int32_t n_steps;    /* default Euler steps (10 original, 2 meanflow) */
    float cfg_rate;     /* classifier-free guidance rate (0.7; unused for meanflow) */
} s3gen_hparams;

/* ------------------------------------------------------------- encoder */

/* Graph inputs of the encoder besides the tokens, filled by set_inputs. */
typedef struct s3_encoder_io {
    struct ggml_tensor *tokens;  /* I32 [T, B]: prompt tokens then speech tokens */
    struct ggml_tensor *in[8];   /* builder-defined extra inputs (positional tables, ...) */
} s3_encoder_io;

void s3_encoder_specs(const s3gen_hparams *hp, cr_spec_list *s);
/* tokens -> mu = encoder_proj(encoder(embedding(tokens))): F32 ne [2T, 80, B]
   (time fastest), for the whole sequence (finalize semantics: nothing trimmed).
   ops: codecrt's device ops (the context's fused_unit) build the convs' columns. */
struct ggml_tensor *s3_encoder_build(struct ggml_context *ctx, struct ggml_context *w,
                                     const s3gen_hparams *hp, int64_t T, int64_t B, const cr_cpu_ops *cpu_ops,
                                     bool ops, s3_encoder_io *io);
/* Fill io->in[] (not the tokens) after allocation. */
void s3_encoder_set_inputs(const s3gen_hparams *hp, int64_t T, int64_t B, const s3_encoder_io *io);
/* Largest tensor of the encoder graph over T tokens x B, in elements. */
int64_t s3_encoder_max_elements(int64_t T, int64_t B);

/* ----------------------------------------------------------- estimator */

typedef struct s3_estimator_io {
    struct ggml_tensor *x;     /* F32 [T, 80, B] current sample */
    struct ggml_tensor *mu;    /* F32 [T, 80, B] */
    struct ggml_tensor *cond;  /* F32 [T, 80, B] prompt mel, zero after it */
    struct ggml_tensor *spks;  /* F32 [80, B] projected speaker embedding */
    struct ggml_tensor *in[8]; /* builder-defined (time embeddings, ...) */
} s3_estimator_io;

void s3_estimator_specs(const s3gen_hparams *hp, cr_spec_list *s);
/* One evaluation of the ConditionalDecoder: returns dx/dt F32 [T, 80, B].
   No padding mask: every one of the T frames is valid. ops: codecrt's ops
   (the context's fused_unit) take the attention's softmax off ggml's graphs. */
struct ggml_tensor *s3_estimator_build(struct ggml_context *ctx, struct ggml_context *w,
                                       const s3gen_hparams *hp, int64_t T, int64_t B, const cr_cpu_ops *cpu_ops,
                                       bool ops, s3_estimator_io *io);
/* Fill io->in[] for flow times t[b] (and r[b], meanflow only; NULL otherwise). */
void s3_estimator_set_inputs(const s3gen_hparams *hp, int64_t T, int64_t B, const float *t,
                             const float *r, const s3_estimator_io *io);
int64_t s3_estimator_max_elements(int64_t T, int64_t B);

/* ---------------------------------------------------------------- HiFT */

void s3_hift_specs(const s3gen_hparams *hp, cr_spec_list *s);

typedef struct s3_f0_io {
    struct ggml_tensor *mel;   /* F32 [T, 80, B] */
} s3_f0_io;
/* mel -> f0 in Hz per mel frame, F32 ne [T, B] (ConvRNNF0Predictor). ops: codecrt's
   device ops (the context's fused_unit, off the CPU backend) build the convs' columns. */
struct ggml_tensor *s3_f0_build(struct ggml_context *ctx, struct ggml_context *w,
                                const s3gen_hparams *hp, int64_t T, int64_t B, bool ops, s3_f0_io *io);

/*
 * The harmonic source on the host, exactly as the reference computes it
 * (SourceModuleHnNSF): f0 upsampled x480 (nearest), SineGen with the given
 * initial phases (phases[0] is 0) and Gaussian noise, then l_linear and tanh.
 * In parts, so that a batch's harmonics run on several threads:
 *   s3_source_weights  l_linear's weight [9] and bias, read from the model's weights w
 *                      (host memory)
 *   s3_source_term     harmonic h's part (lw_h times its sine plus noise) over the
 *                      T*480 samples: term holds the harmonic's noise on entry and
 *                      the part on return
 *   s3_source_combine  terms [9][N] summed in harmonic order, plus the bias, tanh -> source [N]
 * s3_source_host is the three in a row (f0 [T], phases [9], noise [9][T*480],
 * source [T*480]); false when out of host memory.
 */
void s3_source_weights(struct ggml_context *w, float lw[S3_HARMONICS], float *lb);
void s3_source_term(const float *f0, int64_t T, int h, float phase, float lw_h, float *term);
void s3_source_combine(const float *terms, int64_t N, float lb, float *source);
bool s3_source_host(struct ggml_context *w, const float *f0, int64_t T, const float *phases,
                    const float *noise, float *source);

typedef struct s3_hift_io {
    struct ggml_tensor *mel;     /* F32 [T, 80, B] */
    struct ggml_tensor *source;  /* F32 [T*480, B] */
    struct ggml_tensor *in[8];   /* builder-defined (STFT bases, windows, ...) */
} s3_hift_io;
/* mel + source -> PCM F32 [T*480, B], clamped to +-0.99 (HiFTGenerator.decode;
   the 40 ms fade-in is the driver's). ops: codecrt's device ops (the context's
   fused_unit) build the convs' columns, through the ResBlocks' Snakes. */
struct ggml_tensor *s3_hift_build(struct ggml_context *ctx, struct ggml_context *w,
                                  const s3gen_hparams *hp, int64_t T, int64_t B, const cr_cpu_ops *cpu_ops,
                                  bool ops, s3_hift_io *io);
void s3_hift_set_inputs(const s3gen_hparams *hp, int64_t T, int64_t B, const s3_hift_io *io);
int64_t s3_hift_max_elements(int64_t T, int64_t B);

/* ---------------------------------------------------------------- driver */

/* Batches (codecrt_flow_decode_batch, codecrt_vocode_batch) run in sub-batches
   whose largest tensor stays under this many elements (512 MiB of F32): past
   it a batch gains nothing on any device, and memory would grow with it. */
#define S3_BATCH_ELEMENTS ((int64_t)1 << 27)

struct codecrt_voice {
    const cr_model *model;      /* the model it was made for (identity check only) */
    int32_t n_tokens;
    int32_t n_frames;           /* 2 * n_tokens */
    int32_t *tokens;            /* [n_tokens] */
    float *mel;                 /* [80][n_frames], channel major like the graphs' [T, 80] */
    float spks[S3_MEL];         /* spk_embed_affine_layer(normalize(x-vector)) */
};

static inline const s3gen_hparams *s3_hp(const codecrt_context *ctx) { return ctx->model->hparams; }

static inline const cr_cpu_ops *s3_cpu_ops(const codecrt_context *ctx) {
    return ctx->cpu_ops ? &ctx->fused : NULL;
}

/* The stages (s3gen_stages.c). tokens [B][n] -> mu [B][80][2n]. */
codecrt_status s3_encode(codecrt_context *ctx, const int32_t *tokens, int64_t n, int64_t B, float *mu);
/* Allocate the estimator graph for [T, 80, B]; its inputs in *e. */
codecrt_status s3_step_graph(codecrt_context *ctx, int64_t T, int64_t B, cr_graph_slot **slot, s3_estimator_io *e);
/* One evaluation of that graph: dx/dt [B][80][T] into out. */
codecrt_status s3_step_eval(codecrt_context *ctx, cr_graph_slot *slot, const s3_estimator_io *e, int64_t T,
                            int64_t B, const float *x, const float *mu, const float *cond, const float *spks,
                            const float *t, const float *r, float *out);
/* mel [K][80][F] -> f0 [K][F] */
codecrt_status s3_f0(codecrt_context *ctx, const float *mel, int64_t F, int64_t K, float *f0);
/* mel [K][80][F] + source [K][F*480] -> pcm [K][F*480] */
codecrt_status s3_hift(codecrt_context *ctx, const float *mel, int64_t F, int64_t K, const float *source,
                       float *pcm);

/* Validation shared by the pipeline and the diagnostics (s3gen_pipeline.c);
   each leaves its message in ctx. */
codecrt_status s3_check_ctx(codecrt_context *ctx);
codecrt_status s3_check_tokens(codecrt_context *ctx, const int32_t *tokens, int64_t n);
/* n_seq mels of F frames each: F within the context's limit, every value finite */
codecrt_status s3_check_mel(codecrt_context *ctx, const float *mel, int64_t F, int64_t n_seq);
/* st, with ctx's message cleared on success. */
codecrt_status s3_status(codecrt_context *ctx, codecrt_status st);
/* cr_arch.decode: tokens to PCM, both stages and the fade-in. */
codecrt_status s3_decode(codecrt_context *ctx, const codecrt_decode_params *p, const codecrt_codes *codes,
                         int32_t n_frames, float *pcm);

/* weight lookup by printf-style name (layers.h) */
#define s3_w cr_weight

#endif /* CODECRT_S3GEN_INTERNAL_H */
