/*
 * cffi declarations mirroring native/include/codecrt.h and codecrt_s3gen.h
 * (API version 3), in that order: the sections after "codecrt_s3gen.h" below
 * are that header's.
 *
 * Parsed by cffi (bindings/codecrt/_build.py), never by a C compiler directly:
 * no preprocessor conditionals, no includes. cffi compiles the generated module
 * against the real headers, so every declaration here is checked by the C
 * compiler and every struct layout by cffi at import time. Keep struct fields
 * exactly as in the headers, in the same order.
 */

#define CODECRT_API_VERSION 9
#define CODECRT_MAX_LEVELS 32
#define CODECRT_MAX_BACKENDS 4

typedef enum codecrt_status {
    CODECRT_OK = 0,
    CODECRT_E_INVALID_ARGUMENT = 1,
    CODECRT_E_IO = 2,
    CODECRT_E_NOT_GGUF = 3,
    CODECRT_E_CORRUPT = 4,
    CODECRT_E_TRUNCATED = 5,
    CODECRT_E_UNKNOWN_ARCH = 6,
    CODECRT_E_BAD_HPARAMS = 7,
    CODECRT_E_MISSING_TENSOR = 8,
    CODECRT_E_BAD_TENSOR = 9,
    CODECRT_E_BACKEND = 10,
    CODECRT_E_OUT_OF_MEMORY = 11,
    CODECRT_E_CODE_RANGE = 12,
    CODECRT_E_SHAPE = 13,
    CODECRT_E_TOO_LARGE = 14,
    CODECRT_E_BUFFER_TOO_SMALL = 15,
    CODECRT_E_COMPUTE = 16,
    CODECRT_E_STATE = 17,
    CODECRT_E_UNSUPPORTED = 18
} codecrt_status;

typedef enum codecrt_graph_kind {
    CODECRT_GRAPH_DECODE = 0,
    CODECRT_GRAPH_STREAM = 1,
    CODECRT_GRAPH_STREAM_EDGE = 2,
    CODECRT_GRAPH_ENCODE = 3,
    CODECRT_GRAPH_FLOW_STEP = 4,
    CODECRT_GRAPH_F0 = 5,
    CODECRT_GRAPH_VOCODE = 6,
    CODECRT_GRAPH_KIND_COUNT = 8
} codecrt_graph_kind;

typedef enum codecrt_weight_type {
    CODECRT_WEIGHT_F32 = 0,
    CODECRT_WEIGHT_F16 = 1
} codecrt_weight_type;

typedef enum codecrt_precision {
    CODECRT_PRECISION_F32 = 0,
    CODECRT_PRECISION_BF16 = 1,
    CODECRT_PRECISION_BF16X3 = 2
} codecrt_precision;

typedef struct codecrt_model codecrt_model;
typedef struct codecrt_context codecrt_context;

const char *codecrt_version(void);
const char *codecrt_status_name(codecrt_status status);
void codecrt_set_ggml_logging(int32_t enabled);

/* ------------------------------------------------------------------ model */

typedef struct codecrt_model_info {
    char arch[32];
    int32_t sample_rate;
    int32_t hop_length;
    int32_t n_levels;
    int32_t codebook_size[CODECRT_MAX_LEVELS];
    int32_t level_stride[CODECRT_MAX_LEVELS];
    int32_t frame_multiple;
    int32_t n_mels;
    int32_t mel_hop;
    int32_t needs_voice;
    int32_t default_steps;
    int32_t weight_type;
    int64_t n_params;
    int64_t weight_bytes;
} codecrt_model_info;

codecrt_status codecrt_model_load(const char *path, codecrt_model **out,
                                  char *err, size_t err_size);
void codecrt_model_free(codecrt_model *model);
codecrt_status codecrt_model_get_info(const codecrt_model *model, codecrt_model_info *info);
int64_t codecrt_model_samples_for_frames(const codecrt_model *model, int64_t n_frames);

/* ---------------------------------------------------------------- context */

typedef struct codecrt_context_params {
    const char *device;
    int32_t n_threads;
    int32_t max_frames;
    int32_t max_batch;
    int32_t frame_bucket;
    int32_t batch_bucket;
    int32_t stream_chunk_frames;
    int32_t max_streams;
    int32_t precision;
} codecrt_context_params;

codecrt_context_params codecrt_context_default_params(void);
codecrt_status codecrt_context_init(codecrt_model *model, const codecrt_context_params *params,
                                    codecrt_context **out, char *err, size_t err_size);
void codecrt_context_free(codecrt_context *ctx);
const char *codecrt_context_last_error(const codecrt_context *ctx);
const char *codecrt_context_device(const codecrt_context *ctx);
codecrt_status codecrt_context_set_recreate_policy(codecrt_context *ctx, int32_t graph_kind,
                                                   int32_t enabled);
codecrt_status codecrt_context_reserve(codecrt_context *ctx, int32_t n_frames, int32_t n_batch);

/* ----------------------------------------------------------------- decode */

typedef struct codecrt_codes {
    int32_t n_batch;
    int32_t n_levels;
    const int32_t *const *levels;
    const int64_t *lengths;
} codecrt_codes;

typedef struct codecrt_voice codecrt_voice;

typedef struct codecrt_decode_params {
    int32_t noise;
    uint64_t seed;
    const uint64_t *seeds;
    const codecrt_voice *voice;
    int32_t n_steps;
    float cfg_rate;
} codecrt_decode_params;

codecrt_decode_params codecrt_decode_default_params(void);
codecrt_status codecrt_decode(codecrt_context *ctx, const codecrt_decode_params *params,
                              const codecrt_codes *codes, float *pcm, size_t pcm_capacity,
                              size_t *n_written);

/* ---------------------------------------------------------------- streams */

typedef struct codecrt_stream codecrt_stream;

typedef struct codecrt_stream_params {
    int32_t noise;
    uint64_t seed;
} codecrt_stream_params;

codecrt_stream_params codecrt_stream_default_params(void);

typedef struct codecrt_stream_info {
    int64_t frames_pushed;
    int64_t frames_decoded;
    int64_t samples_ready;
    int64_t samples_pulled;
    int64_t total_samples;
    int32_t chunk_frames;
    int32_t latency_samples;
    int32_t slot;
    int32_t finished;
    int32_t done;
    int32_t ready;
} codecrt_stream_info;

codecrt_status codecrt_stream_init(codecrt_context *ctx, const codecrt_stream_params *params,
                                   codecrt_stream **out);
void codecrt_stream_free(codecrt_stream *stream);
codecrt_status codecrt_stream_push(codecrt_stream *stream, const codecrt_codes *codes);
codecrt_status codecrt_stream_finish(codecrt_stream *stream);
codecrt_status codecrt_stream_reset(codecrt_stream *stream);
codecrt_status codecrt_stream_pull(codecrt_stream *stream, float *pcm, size_t capacity, size_t *n_out);
codecrt_status codecrt_stream_get_info(const codecrt_stream *stream, codecrt_stream_info *info);
codecrt_status codecrt_streams_push(codecrt_stream *const *streams, int32_t n, const uint32_t *n_levels,
                                    const uint32_t *lengths, size_t n_lengths, const int32_t *codes,
                                    size_t n_codes, codecrt_status *status);
#define CODECRT_PULL_READY 1
#define CODECRT_PULL_DONE 2
#define CODECRT_PULL_MORE 4
codecrt_status codecrt_streams_pull(codecrt_stream *const *streams, int32_t n, float *pcm, size_t capacity,
                                    int64_t *counts, int32_t *flags);
const char *codecrt_stream_last_error(const codecrt_stream *stream);
codecrt_status codecrt_context_step(codecrt_context *ctx, codecrt_stream *const *streams, int32_t n,
                                    int32_t *n_stepped);
codecrt_status codecrt_context_step_begin(codecrt_context *ctx, codecrt_stream *const *streams, int32_t n);
codecrt_status codecrt_context_step_end(codecrt_context *ctx, int32_t *n_stepped);

/* ------------------------------------------------------------------ stats */

typedef struct codecrt_stats {
    uint64_t graphs_built;
    uint64_t graphs_reused;
    uint64_t sched_resets;
    uint64_t sched_recreations;
    uint64_t reservations;
    uint64_t computes;
    int32_t n_backends;
    char backend_names[CODECRT_MAX_BACKENDS][32];
    uint64_t compute_buffer_bytes[CODECRT_MAX_BACKENDS];
    uint64_t weight_bytes;
    uint64_t state_bytes;
    int32_t streams_active;
    int32_t graph_splits;
    double last_compute_ms;
    double last_acquire_ms;
    double last_inputs_ms;
    double last_enqueue_ms;
    int32_t last_threads;
} codecrt_stats;

codecrt_status codecrt_context_get_stats(const codecrt_context *ctx, codecrt_stats *stats);

/* ========================================================= codecrt_s3gen.h */

#define CODECRT_MAX_FLOW_BATCH 64

/* ----------------------------------------------------------------- voices */

typedef struct codecrt_voice_data {
    const int32_t *prompt_tokens;
    int32_t n_prompt_tokens;
    const float *prompt_mel;
    int32_t n_prompt_frames;
    int32_t n_mels;
    const float *speaker;
    int32_t speaker_dim;
} codecrt_voice_data;

codecrt_status codecrt_voice_init(const codecrt_model *model, const codecrt_voice_data *data,
                                  codecrt_voice **out, char *err, size_t err_size);
void codecrt_voice_free(codecrt_voice *voice);

/* ----------------------------------------------------------------- stages */

typedef struct codecrt_flow_params {
    const codecrt_voice *voice;
    uint64_t seed;
    int32_t n_steps;
    float cfg_rate;
    int32_t finalize;
} codecrt_flow_params;

codecrt_flow_params codecrt_flow_default_params(void);
codecrt_status codecrt_flow_decode(codecrt_context *ctx, const codecrt_flow_params *params,
                                   const int32_t *tokens, int32_t n_tokens, float *mel, size_t mel_capacity,
                                   int32_t *n_frames);
codecrt_status codecrt_vocode(codecrt_context *ctx, const float *mel, int32_t n_frames, uint64_t seed,
                              int64_t sample_offset, const float *cache_source, int32_t n_cache,
                              float *pcm, size_t pcm_capacity, float *source_out);
codecrt_status codecrt_flow_decode_batch(codecrt_context *ctx, const codecrt_flow_params *params, int32_t n,
                                         const int32_t *tokens, int32_t n_tokens, float *mel, size_t mel_capacity,
                                         int32_t *n_frames);
typedef struct codecrt_vocode_item {
    uint64_t seed;
    int64_t sample_offset;
    const float *cache_source;
    int32_t n_cache;
    float *source_out;
} codecrt_vocode_item;
codecrt_status codecrt_vocode_batch(codecrt_context *ctx, const float *mel, int32_t n_frames, int32_t n,
                                    const codecrt_vocode_item *items, float *pcm, size_t pcm_capacity);
void codecrt_noise(uint64_t seed, uint32_t site, uint64_t start, size_t n, int32_t uniform, float *out);
codecrt_status codecrt_diag_s3_encode(codecrt_context *ctx, const int32_t *tokens, int32_t n, float *mu);
codecrt_status codecrt_diag_s3_estimate(codecrt_context *ctx, int32_t T, int32_t B, const float *x,
                                        const float *mu, const float *cond, const float *spks,
                                        const float *t, const float *r, float *out);
codecrt_status codecrt_diag_s3_f0(codecrt_context *ctx, const float *mel, int32_t T, float *f0);
codecrt_status codecrt_diag_s3_source(codecrt_context *ctx, const float *f0, int32_t T, const float *phases,
                                      const float *noise, float *source);
codecrt_status codecrt_diag_s3_hift(codecrt_context *ctx, const float *mel, int32_t T, const float *source,
                                    float *pcm);
