/*
 * codecrt.h: the public C API of the codecd runtime.
 *
 * codecrt loads neural-audio-codec decoders stored as GGUF files and turns
 * discrete codec codes into float32 PCM, on the CPU or on a GPU through ggml.
 *
 * Objects and ownership
 *   codecrt_model    the weights and hyperparameters of one GGUF file. Immutable
 *                    once loaded: one model may be shared by any number of
 *                    contexts, on any threads.
 *   codecrt_context  one backend (device) plus its scheduler, compute buffers
 *                    and cached graphs. A context borrows its model: free every
 *                    context of a model before or after the model, in any order
 *                    (the model is reference counted; codecrt_model_free drops the
 *                    caller's reference, the memory goes with the last context).
 *
 *   Every *_init / *_load has one *_free, and every *_free accepts NULL.
 *   Pointers returned by getters stay valid until the object is freed.
 *
 * Threads
 *   A model may be used from many threads at once. A context must be used by one
 *   thread at a time (no internal locking); different contexts are independent.
 *
 * Errors
 *   Every fallible call returns a codecrt_status. Calls on a context also leave a
 *   message in that context (codecrt_context_last_error); calls that create an
 *   object take a caller buffer for the message, since there is no handle yet.
 *   Inputs are validated before any ggml call: a bad input never aborts the
 *   process.
 *
 * Codec families
 *   This header speaks of every model alike. What only one family has lives in
 *   its own header: codecrt_s3gen.h (voices, the two stages of flow-matching
 *   models, their batches and diagnostics).
 *
 * Codes
 *   A codec has n_levels code levels (SNAC: 3 or 4 levels; RVQ codecs: n
 *   codebooks). Level l has one code per level_stride[l] frames, where a frame is
 *   the finest time step of the model and lasts hop_length samples. A decode of
 *   n_frames frames yields exactly n_frames * hop_length samples per sequence.
 */
#ifndef CODECRT_H
#define CODECRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CODECRT_API_VERSION 9 /* 3: codecrt_context_params.precision; 4: CODECRT_MAX_LEVELS 32 (DAC 24 kHz, Mimi);
                                  5: codecrt_streams_push, codecrt_streams_pull;
                                  6: codecrt_context_step_begin, codecrt_context_step_end;
                                  7: codecrt_stats.last_acquire_ms, _inputs_ms, _enqueue_ms;
                                  8: codecrt_stats.last_threads;
                                  9: CODECRT_PRECISION_BF16X3 */
#define CODECRT_MAX_LEVELS 32
#define CODECRT_MAX_BACKENDS 4

typedef enum codecrt_status {
    CODECRT_OK = 0,
    CODECRT_E_INVALID_ARGUMENT = 1, /* NULL pointer, bad parameter value */
    CODECRT_E_IO = 2,               /* file missing or unreadable */
    CODECRT_E_NOT_GGUF = 3,         /* no GGUF magic at the start of the file */
    CODECRT_E_CORRUPT = 4,          /* GGUF header or metadata malformed */
    CODECRT_E_TRUNCATED = 5,        /* file shorter than its tensor data */
    CODECRT_E_UNKNOWN_ARCH = 6,     /* general.architecture not supported */
    CODECRT_E_BAD_HPARAMS = 7,      /* hyperparameter missing, mistyped or invalid */
    CODECRT_E_MISSING_TENSOR = 8,   /* a tensor the architecture needs is absent */
    CODECRT_E_BAD_TENSOR = 9,       /* a tensor has the wrong type or shape, or is unknown */
    CODECRT_E_BACKEND = 10,         /* requested device not available */
    CODECRT_E_OUT_OF_MEMORY = 11,   /* host or device allocation failed */
    CODECRT_E_CODE_RANGE = 12,      /* a code outside [0, codebook_size) */
    CODECRT_E_SHAPE = 13,           /* levels of inconsistent length, zero or misaligned frames */
    CODECRT_E_TOO_LARGE = 14,       /* more frames or sequences than the context allows */
    CODECRT_E_BUFFER_TOO_SMALL = 15,/* output buffer capacity below the decode's size */
    CODECRT_E_COMPUTE = 16,         /* the backend failed to allocate or compute a graph */
    CODECRT_E_STATE = 17,           /* call not valid in the object's current state */
    CODECRT_E_UNSUPPORTED = 18      /* valid request this build or model cannot serve */
} codecrt_status;

/* Graph kinds: each kind has its own scheduler and cached graph. */
typedef enum codecrt_graph_kind {
    CODECRT_GRAPH_DECODE = 0, /* offline decode of whole sequences */
    CODECRT_GRAPH_STREAM = 1, /* one streaming tick over a batch of stream slots */
    CODECRT_GRAPH_STREAM_EDGE = 2, /* a tick for streams at their start or end (masked) */
    /* two-stage models (S3Gen): */
    CODECRT_GRAPH_ENCODE = 3,     /* tokens to the flow's conditioning (mu) */
    CODECRT_GRAPH_FLOW_STEP = 4,  /* one estimator evaluation, computed once per Euler step */
    CODECRT_GRAPH_F0 = 5,         /* mel to F0 */
    CODECRT_GRAPH_VOCODE = 6,     /* mel + harmonic source to PCM */
    CODECRT_GRAPH_KIND_COUNT = 8
} codecrt_graph_kind;

typedef enum codecrt_weight_type {
    CODECRT_WEIGHT_F32 = 0,
    CODECRT_WEIGHT_F16 = 1
} codecrt_weight_type;

typedef struct codecrt_model codecrt_model;
typedef struct codecrt_context codecrt_context;

/* Static, never NULL. */
const char *codecrt_version(void);
const char *codecrt_status_name(codecrt_status status);

/* ggml's own log lines (stderr) are off by default; 1 turns them on. Process-wide. */
void codecrt_set_ggml_logging(int32_t enabled);

/* ------------------------------------------------------------------ model */

typedef struct codecrt_model_info {
    char arch[32];            /* "snac", ... */
    int32_t sample_rate;      /* Hz */
    int32_t hop_length;       /* samples per frame */
    int32_t n_levels;
    int32_t codebook_size[CODECRT_MAX_LEVELS];
    int32_t level_stride[CODECRT_MAX_LEVELS]; /* frames per code at each level */
    int32_t frame_multiple;   /* n_frames of a decode must be a multiple of this */
    int32_t n_mels;           /* two-stage models: mel bins between the stages (else 0) */
    int32_t mel_hop;          /* two-stage models: samples per mel frame (else 0) */
    int32_t needs_voice;      /* 1: decodes need a codecrt_voice (S3Gen) */
    int32_t default_steps;    /* flow models: Euler steps by default (else 0) */
    int32_t weight_type;      /* codecrt_weight_type of the large matrices */
    int64_t n_params;
    int64_t weight_bytes;
} codecrt_model_info;

/*
 * Load and validate a GGUF model: the file, its architecture, hyperparameters,
 * and every tensor's name, type and shape. On success *out owns a new model.
 * On failure *out is NULL and err (if not NULL) holds a message naming the
 * problem, truncated to err_size bytes including the terminator.
 */
codecrt_status codecrt_model_load(const char *path, codecrt_model **out,
                                  char *err, size_t err_size);

/* Drop the caller's reference. NULL is accepted. */
void codecrt_model_free(codecrt_model *model);

codecrt_status codecrt_model_get_info(const codecrt_model *model, codecrt_model_info *info);

/* Number of samples a decode of n_frames frames yields per sequence (0 on bad input: n_frames
 * negative, or so large that the count overflows int64). */
int64_t codecrt_model_samples_for_frames(const codecrt_model *model, int64_t n_frames);

/* ---------------------------------------------------------------- context */

/*
 * Precision of a context's products (linear layers, convolutions, attention).
 * BF16 rounds both operands of each product to bfloat16 (8 bits of mantissa,
 * round to nearest even) and sums in F32: on CPUs with AVX512-BF16 about twice
 * the F32 product rate, on CPUs with AMX (TDPBF16PS) far more, at a relative
 * error of the decode's output of about 1e-2 (docs/runtime.md gives the measured
 * figures per codec). BF16X3 splits each operand of a weight's product into two
 * bfloat16 terms, x = x_hi + x_lo, and sums x_hi w_hi + x_hi w_lo + x_lo w_hi in
 * F32: three BF16 products for one F32-grade product (about 2^-16 relative; the
 * decode's output within about 1e-5 of F32's), worth it where BF16 products are
 * much faster than F32 ones (AMX); attention and activation-by-activation
 * products stay F32 in it. Both are implemented for the models whose
 * architecture has a BF16 product mode (S3Gen, DAC, WavTokenizer, NeuCodec,
 * XCodec2) on the CPU backend of x86-64 CPUs with AVX512-BF16; elsewhere
 * (another model, a GPU, a CPU without the instructions) codecrt_context_init
 * fails with CODECRT_E_UNSUPPORTED, never silently falls back.
 */
typedef enum codecrt_precision {
    CODECRT_PRECISION_F32 = 0, /* the default: F32 throughout */
    CODECRT_PRECISION_BF16 = 1,
    CODECRT_PRECISION_BF16X3 = 2
} codecrt_precision;

typedef struct codecrt_context_params {
    /* "cpu", "cuda", "cuda:N", "metal", "vulkan", "vulkan:N" or "auto" (a GPU if
       present, else the CPU). NULL means "auto". Copied by init. */
    const char *device;
    int32_t n_threads;    /* CPU threads; 0 = number of online cores */
    int32_t max_frames;   /* largest n_frames per sequence accepted by a decode (default 2^20: a decode's
                             memory does not grow with its length, see codecrt_decode) */
    int32_t max_batch;    /* largest batch accepted by a decode */
    /* Shape buckets. Graphs are keyed by (kind, frame bucket, batch bucket):
       frame_bucket > 0 rounds n_frames up to a multiple of it and batch_bucket = 1
       rounds the batch up to a power of two, so that nearby shapes share one
       graph (masked: padding never changes the samples). 0 and 0 = exact shapes. */
    int32_t frame_bucket;
    int32_t batch_bucket;
    /* Streaming (see codecrt_stream_*): frames each tick advances a stream by
       (0 = the model's default, its frame_multiple), and the size of the slot
       pool, i.e. the most streams alive at once on this context. The pool's
       state memory is allocated when the first stream is created. */
    int32_t stream_chunk_frames;
    int32_t max_streams;
    int32_t precision;    /* codecrt_precision; CODECRT_PRECISION_F32 by default */
} codecrt_context_params;

codecrt_context_params codecrt_context_default_params(void);

/*
 * Create a context for model on the requested device. The context takes its own
 * reference to the model. Weights are used in place on the CPU and copied once
 * to device memory on a GPU.
 */
codecrt_status codecrt_context_init(codecrt_model *model, const codecrt_context_params *params,
                                    codecrt_context **out, char *err, size_t err_size);

/* Free the context, its graphs, schedulers and buffers. NULL is accepted. */
void codecrt_context_free(codecrt_context *ctx);

/* Message of the last failed call on ctx ("" if none). Valid until the next call on ctx. */
const char *codecrt_context_last_error(const codecrt_context *ctx);

/* Name of the device actually used ("CPU", "CUDA0", ...). Valid for ctx's lifetime. */
const char *codecrt_context_device(const codecrt_context *ctx);

/*
 * Per-kind scheduler policy: when enabled, releasing a graph of this kind also
 * frees the kind's scheduler and creates a new one (which is reserved again at
 * its next use). This is the remedy for backends that keep stale allocations for
 * very large graphs. Off by default.
 */
codecrt_status codecrt_context_set_recreate_policy(codecrt_context *ctx, int32_t graph_kind,
                                                   int32_t enabled);

/*
 * Reserve the compute buffers of the decode kind for sequences of up to n_frames
 * frames in batches of up to n_batch, so that later decodes within that envelope
 * never grow a buffer. Decodes reserve on demand otherwise.
 */
codecrt_status codecrt_context_reserve(codecrt_context *ctx, int32_t n_frames, int32_t n_batch);

/* ----------------------------------------------------------------- decode */

typedef struct codecrt_codes {
    int32_t n_batch;                /* sequences, all of the same length */
    int32_t n_levels;               /* must equal the model's n_levels */
    const int32_t *const *levels;   /* levels[l]: n_batch * lengths[l] codes, row-major [b][t] */
    const int64_t *lengths;         /* codes per sequence at level l */
} codecrt_codes;

/* Conditioning for models that speak in a given voice (S3Gen): created and
   freed with codecrt_s3gen.h, passed to decodes by pointer. */
typedef struct codecrt_voice codecrt_voice;

typedef struct codecrt_decode_params {
    int32_t noise;                  /* 1: the model's noise injection on; 0: off (SNAC) */
    uint64_t seed;                  /* noise seed; noise is keyed by (seed, absolute position) */
    const uint64_t *seeds;          /* optional per-sequence seeds (n_batch), overrides seed */
    const codecrt_voice *voice;     /* models with needs_voice: the voice of every sequence
                                       (codecrt_s3gen.h) */
    int32_t n_steps;                /* flow models: Euler steps; 0 = the model's default */
    float cfg_rate;                 /* flow models: guidance rate; < 0 = the model's default */
} codecrt_decode_params;

codecrt_decode_params codecrt_decode_default_params(void);

/*
 * Decode codes to PCM. pcm receives n_batch * n_frames * hop_length float32
 * samples, row-major [b][sample]; pcm_capacity is its size in floats. *n_written
 * (may be NULL) receives the count written. The codes are only read during the
 * call. Validation (levels, lengths, frame alignment, code range, limits,
 * capacity) happens before any computation.
 *
 * Any length and batch within max_frames and max_batch decodes in bounded
 * memory: a decode whose graph would hold a tensor of more than 2^27 elements
 * runs in overlapping pieces (each with enough context on both sides to cover
 * the decoder's receptive field, of which only the middle is kept) and, if a
 * short piece is still too large, in sub-batches. The pieces join exactly: the
 * output is the samples of one whole-utterance graph (bit-identical on the
 * CPU). Every graph is checked against the backend's limits (tensor sizes,
 * GPU launch grids) before ggml sees it; a request that cannot be split to fit
 * (a model with attention over the whole sequence) fails with
 * CODECRT_E_TOO_LARGE naming the limit, never an abort.
 */
codecrt_status codecrt_decode(codecrt_context *ctx, const codecrt_decode_params *params,
                              const codecrt_codes *codes, float *pcm, size_t pcm_capacity,
                              size_t *n_written);

/* ---------------------------------------------------------------- streams */

/*
 * A stream decodes one utterance incrementally. Push codes as they arrive, in
 * any amounts per level; a tick (codecrt_context_step) advances every ready
 * stream by one chunk of stream_chunk_frames frames in one graph; pull the PCM
 * that is final. The output equals the offline decode of the whole utterance:
 * exactly n_frames * hop_length samples, none missing, none repeated.
 *
 * No window is decoded twice: each layer keeps the tail of its input (the
 * convolutions' left context, the transposed convolutions' overlap, the
 * attention window) in the stream's slot of a state pool on the device, so a
 * tick computes each output sample once. A layer that looks ahead emits only
 * outputs whose inputs are all present: the decoder's right receptive field
 * becomes a fixed algorithmic latency (codecrt_stream_info.latency_samples).
 * A causal codec has zero latency in the same scheme.
 *
 * A stream belongs to its context: same thread rules; free streams before or
 * after the context's other objects, but before the context itself.
 */
typedef struct codecrt_stream codecrt_stream;

typedef struct codecrt_stream_params {
    int32_t noise;      /* as codecrt_decode_params.noise */
    uint64_t seed;      /* noise keyed by (seed, absolute position): equal to offline */
} codecrt_stream_params;

codecrt_stream_params codecrt_stream_default_params(void);

typedef struct codecrt_stream_info {
    int64_t frames_pushed;    /* complete frames received (all levels) */
    int64_t frames_decoded;   /* frames consumed by ticks (includes flush padding) */
    int64_t samples_ready;    /* final samples waiting to be pulled */
    int64_t samples_pulled;
    int64_t total_samples;    /* after finish: n_frames * hop; -1 before */
    int32_t chunk_frames;
    int32_t latency_samples;  /* algorithmic latency: output lags input by this */
    int32_t slot;
    int32_t finished;         /* finish() called */
    int32_t done;             /* finished and every sample produced */
    int32_t ready;            /* a tick would advance it */
} codecrt_stream_info;

/* Create a stream on ctx, taking a free slot (E_TOO_LARGE when all are taken). */
codecrt_status codecrt_stream_init(codecrt_context *ctx, const codecrt_stream_params *params,
                                   codecrt_stream **out);

/* Release the slot at once. NULL is accepted. */
void codecrt_stream_free(codecrt_stream *stream);

/*
 * Append codes: codes->n_batch must be 1; lengths[l] may be anything >= 0 and
 * differ between levels (codes arrive interleaved). Validated whole before
 * anything is appended: on error the stream is unchanged. E_STATE after finish.
 */
codecrt_status codecrt_stream_push(codecrt_stream *stream, const codecrt_codes *codes);

/* No more codes: the tail is flushed by the next ticks. Every level must have
   ended on the same frame, a multiple of frame_multiple (else E_SHAPE, stream
   unchanged). E_STATE if already finished. */
codecrt_status codecrt_stream_finish(codecrt_stream *stream);

/* Start a new utterance in the same slot, dropping everything pending. */
codecrt_status codecrt_stream_reset(codecrt_stream *stream);

/* Move up to capacity final samples into pcm; *n_out receives the count. */
codecrt_status codecrt_stream_pull(codecrt_stream *stream, float *pcm, size_t capacity, size_t *n_out);

codecrt_status codecrt_stream_get_info(const codecrt_stream *stream, codecrt_stream_info *info);

/*
 * Many streams in one call (a server's tick: the codes of every stream that sent
 * some, the PCM of every stream that was stepped), so that a caller in another
 * language pays one crossing per tick, not one per stream.
 *
 * codecrt_streams_push: stream i receives n_levels[i] levels; their lengths are
 * the next n_levels[i] entries of lengths[0..n_lengths), their codes the next
 * sum of those lengths of codes[0..n_codes), in order (the layout of a packed
 * batch: one length array, one code array). The arrays are checked first
 * (n_levels sum to n_lengths, lengths sum to at most n_codes: else
 * E_INVALID_ARGUMENT and nothing is pushed). Then each stream is validated and
 * appended exactly as by codecrt_stream_push; status[i] receives its result
 * (its message: codecrt_stream_last_error), and one stream's bad codes never
 * touch another. A NULL stream is skipped (status E_INVALID_ARGUMENT). Returns
 * CODECRT_OK once the arrays were valid, whatever the streams' statuses.
 */
codecrt_status codecrt_streams_push(codecrt_stream *const *streams, int32_t n, const uint32_t *n_levels,
                                    const uint32_t *lengths, size_t n_lengths, const int32_t *codes,
                                    size_t n_codes, codecrt_status *status);

#define CODECRT_PULL_READY 1 /* a tick would advance the stream */
#define CODECRT_PULL_DONE 2  /* finished and every sample produced */
#define CODECRT_PULL_MORE 4  /* samples are left: capacity ran out before they all fit */

/*
 * codecrt_streams_pull: the final samples of n streams into one buffer, stream
 * after stream, as by codecrt_stream_pull with what is left of capacity:
 * counts[i] receives stream i's count, flags[i] its CODECRT_PULL_* bits after
 * the pull. A stream whose samples do not all fit keeps the rest (nothing is
 * lost; pull again). A NULL stream gets count 0 and flags 0.
 */
codecrt_status codecrt_streams_pull(codecrt_stream *const *streams, int32_t n, float *pcm, size_t capacity,
                                    int64_t *counts, int32_t *flags);

/* Message of the last failed call on the stream ("" if none). */
const char *codecrt_stream_last_error(const codecrt_stream *stream);

/*
 * One tick: every stream of streams[0..n) that is ready (a whole chunk pushed,
 * or finished with samples left) advances by one chunk, all in one graph whose
 * shape depends only on (chunk, batch bucket). *n_stepped (may be NULL) gets
 * how many advanced. Streams must belong to ctx and appear once.
 */
codecrt_status codecrt_context_step(codecrt_context *ctx, codecrt_stream *const *streams, int32_t n,
                                    int32_t *n_stepped);

/*
 * codecrt_context_step in two halves, so that the caller's host work overlaps
 * the device's: begin validates, sets the tick's inputs and launches its graph
 * (a tick of both steady and edge streams runs its smaller graph to the end
 * first), returning once the device has the work; end waits for it and
 * advances the streams (*n_stepped as codecrt_context_step's). Between them
 * the streams' codes may be pushed (codecrt_stream_push, codecrt_streams_push)
 * and their samples pulled and info read, which see the state before the
 * tick; any other call on the context or one of its streams (stream init,
 * free, finish, reset, decode, reserve, step) ends the tick first, as end
 * would, and end then reports that tick's count and status. On the CPU
 * backend begin computes the graph, and end only collects.
 */
codecrt_status codecrt_context_step_begin(codecrt_context *ctx, codecrt_stream *const *streams, int32_t n);
codecrt_status codecrt_context_step_end(codecrt_context *ctx, int32_t *n_stepped);

/* ------------------------------------------------------------------ stats */

typedef struct codecrt_stats {
    uint64_t graphs_built;       /* graphs constructed and allocated */
    uint64_t graphs_reused;      /* computes that reused the previous graph untouched */
    uint64_t sched_resets;       /* scheduler resets (one per graph release) */
    uint64_t sched_recreations;  /* schedulers freed and created again by the policy */
    uint64_t reservations;       /* worst-case reservations */
    uint64_t computes;           /* graph computations */
    int32_t n_backends;
    char backend_names[CODECRT_MAX_BACKENDS][32];
    uint64_t compute_buffer_bytes[CODECRT_MAX_BACKENDS]; /* summed over graph kinds */
    uint64_t weight_bytes;       /* weights this context holds besides the model's: a device copy,
                                    or the CPU kernels' packed panels (BF16: every product's; F32:
                                    those of products of few rows), 0 when none */
    uint64_t state_bytes;        /* stream slot pool */
    int32_t streams_active;
    int32_t graph_splits;        /* most backend splits of a live graph (1 = all on one device) */
    double last_compute_ms;      /* wall time of the last graph computation */
    /* the host's part of the last launch, in the order it runs: taking its graph (reused, or
       built and allocated), filling its inputs (streams only), handing it to the backend (on a
       GPU: enqueueing its kernels; where ggml must wait for the device, e.g. between backend
       splits, that wait lands here) */
    double last_acquire_ms;
    double last_inputs_ms;
    double last_enqueue_ms;
    int32_t last_threads;        /* CPU threads the last graph computed with: up to n_threads, fewer
                                    for a graph too small to pay for them (0 off the CPU backend) */
} codecrt_stats;

codecrt_status codecrt_context_get_stats(const codecrt_context *ctx, codecrt_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* CODECRT_H */
