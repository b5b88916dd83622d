/*
 * codecrt_s3gen.h: the public C API that only Chatterbox S3Gen (two-stage,
 * flow-matching models that speak in a given voice) uses, on top of codecrt.h:
 * voices, the flow and vocoder stages and their batches, the runtime's keyed
 * noise, and stage-by-stage diagnostics. Every call here on a context of
 * another model fails with CODECRT_E_UNSUPPORTED (voices: on another model).
 * Ownership, threads and errors are as in codecrt.h.
 */
#ifndef CODECRT_S3GEN_H
#define CODECRT_S3GEN_H

#include "codecrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- voices */
/*
 * Conditioning for models that speak in a given voice (S3Gen): a prompt (its
 * speech tokens and its mel spectrogram, mel_per_token frames per token) and a
 * speaker embedding. A voice is immutable once created and belongs to no
 * context: any number of decodes and streams on any contexts of its model may
 * use it at once, from any threads; free it after its last use.
 */
typedef struct codecrt_voice_data {
    const int32_t *prompt_tokens;   /* n_prompt_tokens ids in [0, codebook_size) */
    int32_t n_prompt_tokens;
    const float *prompt_mel;        /* [n_prompt_frames][n_mels], row-major (time major) */
    int32_t n_prompt_frames;        /* must be 2 * n_prompt_tokens for S3Gen */
    int32_t n_mels;                 /* must equal the model's n_mels */
    const float *speaker;           /* speaker embedding (x-vector) */
    int32_t speaker_dim;            /* 192 for S3Gen */
} codecrt_voice_data;

/* Validate and copy data (finite values, ranges, lengths). err as for model_load. */
codecrt_status codecrt_voice_init(const codecrt_model *model, const codecrt_voice_data *data,
                                  codecrt_voice **out, char *err, size_t err_size);
void codecrt_voice_free(codecrt_voice *voice);

/* --------------------------------------------------------------- stages */
/*
 * S3Gen decodes in two stages, exposed for streaming and for checking a port
 * stage by stage: tokens -> mel (flow matching) and mel -> PCM (vocoder).
 * codecrt_decode runs both plus the model's 40 ms fade-in. Mel arrays are
 * [n_mels][n_frames] row-major (PyTorch's (80, T)). Other models return
 * CODECRT_E_UNSUPPORTED.
 */
typedef struct codecrt_flow_params {
    const codecrt_voice *voice;     /* required */
    uint64_t seed;                  /* the flow's starting noise, keyed by (seed, bin, absolute frame) */
    int32_t n_steps;                /* 0 = the model's default */
    float cfg_rate;                 /* < 0 = the model's default */
    int32_t finalize;               /* 0: the last 3 tokens are lookahead only (no mel for them) */
} codecrt_flow_params;

codecrt_flow_params codecrt_flow_default_params(void);

/*
 * Tokens to the mel of the speech after the voice's prompt: 2 * n_tokens frames
 * when finalize, else 2 * (n_tokens - 3). *n_frames receives the count; mel
 * must hold n_mels times that.
 */
codecrt_status codecrt_flow_decode(codecrt_context *ctx, const codecrt_flow_params *params,
                                   const int32_t *tokens, int32_t n_tokens, float *mel, size_t mel_capacity,
                                   int32_t *n_frames);

/*
 * Mel to PCM: n_frames * mel_hop samples, clamped to +-0.99, no fade-in. The
 * vocoder's random source (harmonic phases, noise) is keyed by (seed, absolute
 * sample): sample_offset is the absolute index of this call's first sample. If
 * cache_source is not NULL its n_cache samples replace the start of the
 * harmonic source (streaming continuity). source_out, if not NULL, receives the
 * n_frames * mel_hop samples of the source actually used.
 */
codecrt_status codecrt_vocode(codecrt_context *ctx, const float *mel, int32_t n_frames, uint64_t seed,
                              int64_t sample_offset, const float *cache_source, int32_t n_cache,
                              float *pcm, size_t pcm_capacity, float *source_out);

/*
 * Batches for servers: n flows or vocoder calls (1..CODECRT_MAX_FLOW_BATCH,
 * and at most the context's max_batch, else CODECRT_E_TOO_LARGE) in one graph
 * per stage, each sequence's numbers those of its own call up to float
 * rounding (products of another shape may sum in another order). A batch whose
 * largest tensor would pass 2^27 elements runs in sub-batches under it.
 *
 * codecrt_flow_decode_batch: params[n] and tokens [n][n_tokens]; the flows must
 * agree in shape and schedule (the voices' prompt lengths, finalize, n_steps,
 * cfg_rate; else CODECRT_E_SHAPE): voices and seeds may differ. mel receives
 * n blocks of n_mels * *n_frames floats.
 *
 * codecrt_vocode_batch: mel [n][n_mels][n_frames]; items[k] holds call k's
 * seed, sample_offset, cache and source_out as for codecrt_vocode; pcm receives
 * n blocks of n_frames * mel_hop samples.
 */
#define CODECRT_MAX_FLOW_BATCH 64

codecrt_status codecrt_flow_decode_batch(codecrt_context *ctx, const codecrt_flow_params *params, int32_t n,
                                         const int32_t *tokens, int32_t n_tokens, float *mel, size_t mel_capacity,
                                         int32_t *n_frames);

typedef struct codecrt_vocode_item {
    uint64_t seed;
    int64_t sample_offset;
    const float *cache_source;      /* NULL, or n_cache samples replacing the source's start */
    int32_t n_cache;
    float *source_out;              /* NULL, or n_frames * mel_hop samples: the source used */
} codecrt_vocode_item;

codecrt_status codecrt_vocode_batch(codecrt_context *ctx, const float *mel, int32_t n_frames, int32_t n,
                                    const codecrt_vocode_item *items, float *pcm, size_t pcm_capacity);

/* The runtime's counter-based noise: out[i] = N(0, 1) (uniform: U[0, 1)) for
   the key (seed, site, start + i). Sites are listed in docs/gguf-format.md. */
void codecrt_noise(uint64_t seed, uint32_t site, uint64_t start, size_t n, int32_t uniform, float *out);

/*
 * Diagnostics: one stage of S3Gen through the context's lifecycle manager, for
 * verifying the port against the reference stage by stage. Unstable API.
 *   s3_encode:   tokens [n] -> mu [80][2n] (before the prompt is dropped)
 *   s3_estimate: x, mu, cond [B][80][T], spks [B][80], t[B] (r[B] for meanflow,
 *                else NULL) -> dx/dt [B][80][T]
 *   s3_f0:       mel [80][T] -> f0 [T]
 *   s3_source:   f0 [T], phases [9], noise [9][T*480] -> source [T*480] (host)
 *   s3_hift:     mel [80][T], source [T*480] -> pcm [T*480]
 */
codecrt_status codecrt_diag_s3_encode(codecrt_context *ctx, const int32_t *tokens, int32_t n, float *mu);
codecrt_status codecrt_diag_s3_estimate(codecrt_context *ctx, int32_t T, int32_t B, const float *x,
                                        const float *mu, const float *cond, const float *spks,
                                        const float *t, const float *r, float *out);
codecrt_status codecrt_diag_s3_f0(codecrt_context *ctx, const float *mel, int32_t T, float *f0);
codecrt_status codecrt_diag_s3_source(codecrt_context *ctx, const float *f0, int32_t T, const float *phases,
                                      const float *noise, float *source);
codecrt_status codecrt_diag_s3_hift(codecrt_context *ctx, const float *mel, int32_t T, const float *source,
                                    float *pcm);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_S3GEN_H */
