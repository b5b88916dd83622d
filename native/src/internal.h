/*
 * internal.h: types shared by the runtime's translation units. Not installed.
 *
 * Module map (native/src; docs/runtime.md has the same table)
 *   The runtime, codec-independent:
 *     util.c          status names, error messages, logging, GGUF readers, tensor lists
 *     model.c         GGUF loading and validation (architecture-independent part)
 *     arch.c          the table of architectures (one line per codec)
 *     context.c       devices, weight placement, the decode entry point (pieces,
 *                     sub-batches), stats
 *     stream.c        streams, the slot pool, batched ticks
 *     graph.c         the graph lifecycle manager (schedulers, reservation, reuse)
 *     guard.c         the shape guard: graphs checked against the backends' limits
 *     noise.c         counter-based Gaussian noise keyed by (seed, site, position)
 *     profile.c       per-op timing (CODECRT_PROFILE_OPS)
 *   Shared by the codecs' graph builders:
 *     layers.c/h        convolutions, transposed convolutions, Snake, norms,
 *                       residual units, layouts, the pad along time
 *     stream_state.c/h  per-slot state buffers and time inputs of tick graphs
 *   Fused CPU kernels (ggml custom ops, CPU backend only), ops/:
 *     ops_snake.c              the fused Snake
 *     ops_avx512.h             the register tiles and what the kernels share
 *     ops_avx512_core.c        CPU feature checks, panel products, BF16 packing
 *     ops_avx512_attention.c   attention, plain and relative-position
 *     ops_avx512_linear.c      linear layers and stride-1 convolutions
 *     ops_amx.c                BF16 products on AMX tiles (packed weights, attention)
 *     ops_avx2_products.c      the F32 panel product on AVX2 + FMA (no AVX-512)
 *     ops_avx2_attention.c     the F32 attention's steps on AVX2 + FMA (no AVX-512)
 *   One folder per codec, registered in arch.c:
 *     snac/    SNAC (snac.h maps its files)
 *     s3gen/   Chatterbox S3Gen (s3gen.h maps its files; its public calls
 *              are declared in include/codecrt_s3gen.h)
 *     vocos/   WavTokenizer, NeuCodec and XCodec2 on shared Vocos blocks (vocos.h:
 *              GroupNorm ResNet, attention, the iSTFT head)
 *     dac/     DAC (dac.h maps its files)
 */
#ifndef CODECRT_INTERNAL_H
#define CODECRT_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codecrt.h"
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "ops/res_unit.h"
#include "ops/upconv.h"
#include "ops/softmax.h"
#include "ops/cols.h"
#include "ops/attn.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/bias_act.h"

#define CR_ERR_SIZE 512
#define CR_MAX_TENSOR_SPECS 2048
#define CR_MAX_IO 64
#define CR_MAX_TIMES 64
#define CR_MAX_STATES 64
#define CR_MAX_WINDOWS 4
#define CR_MAX_TENSOR_ELEMENTS ((int64_t)INT32_MAX) /* ggml's CUDA kernels index with int */
/* An offline decode whose largest tensor would pass this runs in pieces (or
   sub-batches) under it: bounds a decode's compute buffers (a tensor of 2^27
   F32 is 512 MiB) whatever its length. S3Gen's batches use the same bound. */
#define CR_PIECE_ELEMENTS ((int64_t)1 << 27)
#define CR_GRAPH_SIZE 16384 /* most nodes (and tensors) of one graph */

/* A message buffer travelling with a call; set once, by the first failure. */
typedef struct cr_err {
    char msg[CR_ERR_SIZE];
} cr_err;

codecrt_status cr_fail(cr_err *err, codecrt_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void cr_err_copy(const cr_err *err, char *dst, size_t dst_size);
/* CLOCK_MONOTONIC in milliseconds. */
double cr_now_ms(void);
/* Grow a malloc'd array *buf of *cap elements of elem bytes to hold need (contents kept). */
codecrt_status cr_grow(void **buf, size_t *cap, size_t need, size_t elem, cr_err *err);
void cr_logging_init(void);

/* ------------------------------------------------------------ tensor specs */

/* A tensor an architecture requires: name, ggml shape, and whether it is a
   large matrix that may be stored as F16 (all others must be F32). */
typedef struct cr_tensor_spec {
    char name[GGML_MAX_NAME];
    int n_dims;
    int64_t ne[4];
    bool mat;
} cr_tensor_spec;

typedef struct cr_spec_list {
    cr_tensor_spec items[CR_MAX_TENSOR_SPECS];
    int n;
    bool overflow;
} cr_spec_list;

void cr_spec_add(cr_spec_list *list, bool mat, int n_dims, int64_t ne0, int64_t ne1,
                 const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;
/* A tensor of up to three dims (conv kernels: ne [K, Cin, Cout]). */
void cr_spec_add3(cr_spec_list *list, bool mat, int64_t ne0, int64_t ne1, int64_t ne2,
                  const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* GGUF metadata readers: a missing or mistyped key is CODECRT_E_BAD_HPARAMS.
   u32 accepts UINT32 or non-negative INT32 up to 2^30; arrays: 1..max_n
   entries, each in [1, 64]. */
codecrt_status cr_gguf_u32(const struct gguf_context *g, const char *key, int32_t *out, cr_err *err);
codecrt_status cr_gguf_bool(const struct gguf_context *g, const char *key, bool *out, cr_err *err);
codecrt_status cr_gguf_f32(const struct gguf_context *g, const char *key, float *out, cr_err *err);
codecrt_status cr_gguf_i32_array(const struct gguf_context *g, const char *key, int32_t *out,
                                 int32_t max_n, int32_t *n_out, cr_err *err);

/* ------------------------------------------------------------ architecture */

struct cr_model;
struct cr_graph_key;

/*
 * Inputs whose values depend on absolute time, filled per stream and tick by
 * the context (graphs never see positions directly): the segment a tensor
 * holds at a point of the decoder starts at time k*chunk*rate - delay, where
 * rate is that point's samples per frame and k the stream's tick.
 */
typedef enum cr_time_kind {
    CR_TIME_MASK = 0,  /* 1 where 0 <= t < end, else 0: zero padding at both ends */
    CR_TIME_NOISE = 1, /* cr_noise_normal(seed, site, t) (0 for t < 0) */
    CR_TIME_POS = 2    /* I32 t mod site (rotary positions inside windows) */
} cr_time_kind;

typedef struct cr_time_input {
    struct ggml_tensor *tensor; /* [1, n, B] F32, or [n*B] I32 for positions; NULL for masks */
    int32_t kind;
    int32_t rate;
    int32_t delay;
    int32_t site;               /* noise site, window for positions, a mask's rows in bounds */
    int64_t len;                /* n: points per stream */
} cr_time_input;

/*
 * The index inputs of a tick's KV windows (stream_state.h: cr_states_window),
 * one pair per window shape, shared by every layer's keys and values: the
 * ring of each stream holds Q blocks of n steps (n: the tick's new steps).
 */
typedef struct cr_window_input {
    int64_t Q, n;
    struct ggml_tensor *read;  /* I32 [Q*B]: the blocks of each stream's window, oldest first */
    struct ggml_tensor *write; /* I32 [n*B]: the step rows its n new steps go to */
} cr_window_input;

/* What a graph builder leaves behind: its inputs and outputs. */
typedef struct cr_graph_io {
    struct ggml_tensor *t[CR_MAX_IO]; /* architecture-defined table */
    cr_time_input times[CR_MAX_TIMES];
    int n_times;
    bool overflow;
    /* streaming graphs */
    struct ggml_tensor *out;          /* [1, n, B] PCM */
    int32_t out_rate;
    int32_t out_delay;
    struct ggml_tensor *slot_read;    /* I32 [B] */
    struct ggml_tensor *slot_write;   /* I32 [B] */
    struct ggml_tensor *keep;         /* F32 [1, 1, B]: 0 on a stream's first tick */
    /* F32 [B, 2 * CR_MAX_TIMES]: per mask (CR_TIME_MASK, rows 2 site and 2 site + 1) each
       stream's first valid point minus one and its end, clamped to [-1, n + 1]; the graph
       turns them into the 0/1 mask (stream_state.c), so a tick copies a few bytes per
       stream and mask, not the masks */
    struct ggml_tensor *bounds;
    int n_bounds;                     /* masks registered (row pairs of bounds in use) */
    cr_window_input windows[CR_MAX_WINDOWS];
    int n_windows;
    struct ggml_tensor *codes[CODECRT_MAX_LEVELS]; /* I32 [chunk / stride_l * B] */
    int n_states;                     /* pool states the graph took (stream_state.c) */
} cr_graph_io;

void cr_io_add_time(cr_graph_io *io, struct ggml_tensor *t, int32_t kind, int32_t rate, int32_t delay,
                    int32_t site, int64_t len);

/* One per-stream state tensor: channels x frames of one layer's input tail, or
   (window > 0) a KV window ring of channels x `frames` kept steps that grows by
   window steps per code frame (stream_state.h: cr_states_window). */
typedef struct cr_state_spec {
    int64_t channels;
    int64_t frames;
    int32_t window;
} cr_state_spec;

/* Weights packed once for the BF16 kernels of ops/ops_avx512_linear.c, owned by the
   context whose graphs use them (freed after its graphs). */
typedef struct cr_packs cr_packs;
cr_packs *cr_packs_new(void);
void cr_packs_free(cr_packs *packs);
size_t cr_packs_bytes(const cr_packs *packs); /* 0 for NULL */

/* The fused CPU kernels a graph may use, passed as a pointer: NULL for none
   (another backend, or CODECRT_PORTABLE_OPS). bf16: the BF16 product mode
   (CODECRT_PRECISION_BF16), with its weights packed into packs (NULL: packed
   per call). x3 (with bf16): CODECRT_PRECISION_BF16X3, the products of packed
   weights as three BF16 products of split operands (ops/ops_avx512.h, cr_packed);
   every other product (attention, activations by activations, a weight without a
   pack) in F32. */
typedef struct cr_cpu_ops {
    bool bf16;
    cr_packs *packs;
    bool x3;
} cr_cpu_ops;

/* Streaming graph shape. */
typedef struct cr_stream_shape {
    int32_t chunk;       /* frames per tick */
    int32_t n_batch;     /* streams in the graph (bucketed) */
    bool cpu_ops;
    const cr_cpu_ops *ops; /* with cpu_ops: the context's fused kernels (BF16 mode, packs); else NULL */
    /* edge tick: some stream is at its first ticks or past its end, so states
       are gated by keep and tensors masked to [0, end). A steady tick (every
       point of every stream inside the utterance) needs neither. */
    bool masked;
    /* some stream of the tick has its noise on (codecrt_stream_params.noise): only then
       does a graph carry noise inputs and the layers that add them (SNAC's noise blocks
       add exactly 0 otherwise) */
    bool noise;
    bool fused_unit; /* the residual unit's ops (cr_unit_core, cr_unit_tail): codecrt_context.fused_unit */
} cr_stream_shape;

/* Shape of a decode, after bucketing. */
typedef struct cr_decode_shape {
    int32_t n_frames;   /* frames per sequence in the graph (bucketed) */
    int32_t n_batch;    /* sequences in the graph (bucketed) */
    bool noise;
    bool masked;        /* valid lengths may be shorter than n_frames / n_batch */
    bool cpu_ops;       /* graph runs on the CPU backend: fused custom ops allowed */
    const cr_cpu_ops *ops; /* with cpu_ops: the context's fused kernels (BF16 mode, packs); else NULL */
    bool time_fastest;  /* an architecture with both offline layouts builds its time-fastest one
                           (GPU graphs by default; CODECRT_OFFLINE_LAYOUT forces either) */
    bool frames_masked; /* masked, and frames are bucketed too (frame_bucket > 0): the valid frames may be
                           fewer than n_frames. Without it a masked graph pads the batch only; an
                           architecture whose sequences never mix can then ignore the padding */
    bool fused_unit;    /* the residual unit's ops (cr_unit_core, cr_unit_tail): codecrt_context.fused_unit */
} cr_decode_shape;

/* Per-decode host inputs the architecture copies into its graph. */
typedef struct cr_decode_inputs {
    const codecrt_codes *codes;  /* validated */
    int32_t n_frames;            /* valid frames per sequence */
    int64_t frame_offset;        /* absolute frame of the graph's first frame (a piece of a longer
                                    decode): position-keyed inputs (noise) use absolute positions */
    const uint64_t *seeds;       /* n_batch seeds (valid sequences) */
    float *scratch;              /* host staging, at least arch->scratch_floats(shape) */
} cr_decode_inputs;

typedef struct cr_arch {
    const char *name;
    /* its CPU graphs have a BF16 product mode (CODECRT_PRECISION_BF16) */
    bool bf16_products;
    /* codes may carry the first K levels only, 1 <= K <= n_levels (RVQ
       codecs: the rest count as absent, Mimi's 8 of 32 codebooks). A
       stream's K is fixed by its first push; its tick graphs read code
       codebook_size[l] at every absent level l (the architecture's zero row). */
    bool levels_prefix;
    size_t hparams_size;
    /* Read and check hyperparameters from the GGUF metadata into hp. */
    codecrt_status (*read_hparams)(const struct gguf_context *gguf, void *hp, cr_err *err);
    void (*fill_info)(const void *hp, codecrt_model_info *info);
    void (*tensor_specs)(const void *hp, cr_spec_list *list);
    /* Decode graph: build into ctx0 (no_alloc), remembering inputs in io[]. */
    struct ggml_cgraph *(*build_decode)(const struct cr_model *model, struct ggml_context *ctx0,
                                        struct ggml_context *weights, const cr_decode_shape *shape,
                                        cr_graph_io *io);
    size_t (*scratch_floats)(const struct cr_model *model, const cr_decode_shape *shape);
    /* Elements of the largest tensor of a graph over n_frames x n_batch, with
       `context` extra frames of state at every rate (streaming). ggml's kernels
       index some tensors with 32 bits (CUDA's broadcasts assert on it), so the
       context refuses shapes above CR_MAX_TENSOR_ELEMENTS before building. */
    int64_t (*max_tensor_elements)(const struct cr_model *model, int64_t n_frames, int64_t n_batch,
                                   int64_t context);
    void (*set_decode_inputs)(const struct cr_model *model, const cr_decode_shape *shape,
                              const cr_graph_io *io, const cr_decode_inputs *in);
    /* Streaming. chunk must be a multiple of stream_chunk_multiple. The state
       list and the latency depend on the model only, never on the chunk. */
    int32_t (*stream_chunk_multiple)(const struct cr_model *model);
    int (*stream_states)(const struct cr_model *model, cr_state_spec *specs, int max);
    int32_t (*stream_latency)(const struct cr_model *model);
    /* pool[i], i < n_pool: the i-th state as [channels*frames, n_slots+1] in a
       device buffer; the graph must take every state, in order
       (stream_state.h), or fail with io->overflow */
    struct ggml_cgraph *(*build_stream)(const struct cr_model *model, struct ggml_context *ctx0,
                                        struct ggml_context *weights, const cr_stream_shape *shape,
                                        struct ggml_tensor *const *pool, int n_pool, cr_graph_io *io);
    /* Frames of context a piece of an offline decode needs on each side so
       that its middle equals the same frames of the whole decode (the right
       and left receptive field, rounded up to stream_chunk_multiple); 0: the
       architecture cannot be decoded in pieces (any attention over the whole
       sequence). See codecrt_decode. */
    int32_t (*decode_context_frames)(const struct cr_model *model);
    /* Multi-stage models (S3Gen) run their own pipeline of graph kinds: the
       context validated the codes (range, lengths) and the output capacity;
       NULL means the single-graph path of build_decode. */
    codecrt_status (*decode)(struct codecrt_context *ctx, const codecrt_decode_params *params,
                             const codecrt_codes *codes, int32_t n_frames, float *pcm);
    /* Points a sequence of n_frames frames fills at a point of the decoder
       with rate samples per frame: where stream masks end. NULL: n_frames *
       rate. DAC's odd strides lose a sample each (dac/dac.h). */
    int64_t (*valid_points)(const struct cr_model *model, int64_t n_frames, int32_t rate);
} cr_arch;

const cr_arch *cr_arch_find(const char *name);
const char *cr_arch_names(void); /* "snac" etc., for messages */

extern const cr_arch cr_arch_snac;
extern const cr_arch cr_arch_s3gen;
extern const cr_arch cr_arch_wavtokenizer;
extern const cr_arch cr_arch_neucodec;
extern const cr_arch cr_arch_xcodec2;
extern const cr_arch cr_arch_dac;
extern const cr_arch cr_arch_mimi;
extern const cr_arch cr_arch_qwen3;

/* ------------------------------------------------------------------- model */

typedef struct cr_model {
    atomic_int refs;
    const cr_arch *arch;
    void *hparams;
    codecrt_model_info info;
    struct ggml_context *weights;      /* tensor metadata, data in cpu_buffer */
    ggml_backend_buffer_t cpu_buffer;
    char path[1024];
} cr_model;

struct codecrt_model {
    cr_model m;
};

void cr_model_retain(cr_model *m);
void cr_model_release(cr_model *m);

/* ----------------------------------------------------------------- CPU ops */

/* ELU (alpha 1) with a vectorized expm1 for F32 x (ops/ops_elu.c); CPU backend only
   (ggml_elu for other types or layouts). */
struct ggml_tensor *cr_elu_cpu(struct ggml_context *ctx, struct ggml_tensor *x);

/* Fused Snake for contiguous F32 x [C, ...]; CPU backend only. */
struct ggml_tensor *cr_snake_cpu(struct ggml_context *ctx, struct ggml_tensor *x,
                                 struct ggml_tensor *alpha, struct ggml_tensor *inv_alpha);

/* GroupNorm of x [C, T, B] (channels fastest) in n_groups groups of adjacent channels,
   statistics over each sequence's valid frames (mask [1, T, B] of ones and zeros, or
   NULL: all), times w [C] plus b [C]; a padded frame gives b (ops/ops_group_norm.c).
   CPU backend only; NULL where the shapes or types do not fit. */
struct ggml_tensor *cr_group_norm_cpu(struct ggml_context *ctx, struct ggml_tensor *x, int n_groups,
                                      struct ggml_tensor *w, struct ggml_tensor *b, struct ggml_tensor *mask,
                                      float eps);

/* LayerNorm (rms false) or RMSNorm (rms) over each row of x [C, ...], times w [C] plus b
   [C] (b may be NULL), then Mish if asked, in one pass per row (ops/ops_norm.c,
   ops/norm.h): the CPU backend's, and on CUDA codecrt's ops backend's. NULL where the
   shapes or types do not fit. */
struct ggml_tensor *cr_norm_rows(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                 struct ggml_tensor *b, float eps, bool rms, bool mish);

/* Depthwise convolution, stride 1, of x [C, T, B] by w ne [C, K], dilation d, zero
   padding pl and pr frames, plus b [C] or NULL -> [C, T + pl + pr - d (K-1), B]
   (ops/ops_dwconv.c). CPU backend only; NULL where the shapes or types do not fit. */
struct ggml_tensor *cr_dwconv_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, int dilation, int pl, int pr);

/* The core of a Snake residual unit as one op on the time-fastest layout:
   Snake2(dwconv_d(Snake1(t)) + b) of t [L, B, C], transposed to [C, n, B] for the unit's
   1x1 conv (ops/ops_res_unit.c, ops/res_unit.h): a "same" conv (n = L) or a valid one
   (n = L - d (K-1)). Its CPU function runs on the CPU backend; the codecrt CUDA ops
   backend runs it on a GPU (cuda/cuda_ops.cu). NULL where the shapes or types do not fit. */
struct ggml_tensor *cr_unit_core(struct ggml_context *ctx, struct ggml_tensor *t, struct ggml_tensor *w,
                                 struct ggml_tensor *b, struct ggml_tensor *alpha1, struct ggml_tensor *inv1,
                                 struct ggml_tensor *alpha2, struct ggml_tensor *inv2, int dil, bool same);

/* The unit's tail as one op: ((y + b) + x) * mask, y [n*B, C] the 1x1 conv's product (time
   fastest), b [C], x [n, B, C] the residual (time fastest, any strides: a view of the unit's
   input), mask [n, B] contiguous or NULL (a masked graph's 0/1 factor: one pass fewer than a
   product after the op), prefix [S, B, C] (time contiguous, any strides) or NULL: written
   first, so that the output is the next layer's concat(state, output) with no concat pass
   -> [S + n, B, C] contiguous (ops/ops_res_unit.c). NULL where the shapes or types do not fit. */
struct ggml_tensor *cr_unit_tail(struct ggml_context *ctx, struct ggml_tensor *y, struct ggml_tensor *b,
                                 struct ggml_tensor *x, struct ggml_tensor *mask, struct ggml_tensor *prefix);

/* A transposed conv's tail as one op (ops/ops_upconv.c, ops/upconv.h): z [2s*C, T, B], the
   kernel's product with the unpadded input, its halves added, the bias b [C] and an optional
   mask [n_out, B] applied -> [n_out, B, C] time fastest, the first `crop` samples dropped;
   with a prefix [S, B, C] (the next layer's state, any strides, time contiguous) written
   first -> [S + n_out, B, C], what the state's concat would hold, with no concat pass.
   NULL where the shapes or types do not fit. */
struct ggml_tensor *cr_upconv_tail(struct ggml_context *ctx, struct ggml_tensor *z, struct ggml_tensor *b,
                                   struct ggml_tensor *mask, int s, int crop, int64_t n_out,
                                   struct ggml_tensor *prefix);

/* The tail ops' prefix (cr_unit_tail, cr_upconv_tail): [S, B, C] F32, time contiguous, rows
   at whole floats (a gathered state's strided view). */
static inline bool cr_prefix_fits(const struct ggml_tensor *p, int64_t B, int64_t C) {
    return p->type == GGML_TYPE_F32 && p->nb[0] == sizeof(float) && p->ne[0] >= 1 && p->ne[1] == B &&
           p->ne[2] == C && p->ne[3] == 1 && p->nb[1] % sizeof(float) == 0 && p->nb[2] % sizeof(float) == 0;
}

/* Row (b, c) of a tail op's prefix written at o (its S frames); returns o + S, where the op's
   own output starts. */
static inline float *cr_prefix_row(float *o, const struct ggml_tensor *pre, int64_t b, int64_t c) {
    const float *pr = (const float *)((const char *)pre->data + b * pre->nb[1] + c * pre->nb[2]);
    for (int64_t t = 0; t < pre->ne[0]; t++) {
        o[t] = pr[t];
    }
    return o + pre->ne[0];
}

/* A scaled softmax over each row as one op (ops/ops_softmax.c, ops/softmax.h): a [n, ...]
   contiguous F32 -> a's shape, softmax(scale a) along ne0. NULL where the type or layout
   does not fit. */
struct ggml_tensor *cr_softmax_rows(struct ggml_context *ctx, struct ggml_tensor *a, float scale);

/* The column matrix of a stride-1 convolution as one op (ops/ops_cols.c, ops/cols.h): x
   [C, T, B] contiguous F32 (channels fastest) -> [C k, T + pl + pr - d (k - 1), B], rows
   c k + j = x[c, t + j d - pl] (zero outside the input), through a Snake first where alpha
   and inv ([C], 1/alpha) are given. Multiplied by a kernel (Cout, Cin, k) reshaped to
   [k Cin, Cout] it is the convolution. NULL where a type, layout or parameter does not fit. */
struct ggml_tensor *cr_cols(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *alpha,
                            struct ggml_tensor *inv, int k, int d, int pl, int pr);

/* The attention's two products as ops (ops/ops_attn.c, ops/attn.h). Scores: k [D, Tk, H, B]
   and q [D, Tq, H, B] F32 (channels fastest, any other strides) -> [Tk, Tq, H, B] contiguous,
   ggml_mul_mat(k, q). Values: v [Tk, D, H, B] F32 (keys fastest, any other strides) and p
   [Tk, Tq, H, B] contiguous F32 (softmax weights) -> [D, H, Tq, B] contiguous,
   sum_k v[k, d, h, b] p[k, t, h, b]: the heads of a query side by side, as the output
   projection reads them (reshaped to [D H, Tq, B]). NULL where a type, layout or shape does
   not fit. */
struct ggml_tensor *cr_attn_scores(struct ggml_context *ctx, struct ggml_tensor *k, struct ggml_tensor *q);
struct ggml_tensor *cr_attn_values(struct ggml_context *ctx, struct ggml_tensor *v, struct ggml_tensor *p);

/* A matrix product as codecrt's op (ops/ops_matmul.c, ops/matmul.h): a [K, N] and b [K, M,
   ...], both contiguous F32 -> [N, M, ...], ggml_mul_mat(a, b). NULL where a type, layout or
   shape does not fit. */
struct ggml_tensor *cr_matmul(struct ggml_context *ctx, struct ggml_tensor *a, struct ggml_tensor *b);

/* sum_i a[i] b[i] over n contiguous floats in eight interleaved partial sums (a compiler
   vectorises it without reassociating): the C functions of codecrt's product ops. */
static inline float cr_dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) {
            s[j] += a[i + j] * b[i + j];
        }
    }
    for (; i < n; i++) {
        s[0] += a[i] * b[i];
    }
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* A product's bias, an activation and a residual as one op (ops/ops_bias_act.c,
   ops/bias_act.h): y [C, ...] contiguous F32, b [C], r y's shape (contiguous) or NULL ->
   act(y + b) (+ r). NULL where a type, layout or shape does not fit. */
struct ggml_tensor *cr_bias_act(struct ggml_context *ctx, struct ggml_tensor *y, struct ggml_tensor *b,
                                struct ggml_tensor *r, cr_bias_act_kind act);

/*
 * Softmax attention with scale 1/8 over every key, per head of 64 channels:
 * q, k, v [H*64, T, B] contiguous F32 (head h in channels 64h .. 64h+63) ->
 * [H*64, T, B]. A fused CPU kernel (ops/ops_avx512_attention.c): in F32 where
 * cr_f32_products_cpu_available() (x86-64 with AVX-512, or AVX2 and FMA:
 * ops/ops_avx2_attention.c, the same floats), in BF16 where
 * cr_attention_cpu_available() (AVX-512) and cr_bf16_cpu_available(); NULL where
 * it does not apply (then use ggml's attention). CPU backend only.
 */
bool cr_attention_cpu_available(void);
/* Whether the F32 linear layers and stride-1 convolutions (cr_linear_cpu, cr_conv1d_cpu) run
   here: x86-64 with AVX-512, or with AVX2 and FMA (ops/ops_avx2_products.c). */
bool cr_f32_products_cpu_available(void);
struct ggml_tensor *cr_attention_cpu(struct ggml_context *ctx, struct ggml_tensor *q, struct ggml_tensor *k,
                                     struct ggml_tensor *v, const cr_cpu_ops *ops);

/*
 * The S3Gen encoder's relative-position attention, the same kernel with a
 * second score term: softmax over j of ((q_i + u) k_j + (q_i + bv) p_{T-1-i+j}) / 8,
 * per head of 64 channels. q, k, v [H*64, T, B], p [H*64, >= 2T-1] (its rows
 * the relative positions T-1 .. -(T-1), shared by the batch), u, bv [H*64]
 * (pos_bias_u, pos_bias_v), all F32 contiguous -> [H*64, T, B]; every key is
 * attended (no mask). NULL where it does not apply. CPU backend only.
 */
struct ggml_tensor *cr_relpos_attention_cpu(struct ggml_context *ctx, struct ggml_tensor *q, struct ggml_tensor *k,
                                            struct ggml_tensor *v, struct ggml_tensor *p, struct ggml_tensor *u,
                                            struct ggml_tensor *bv, const cr_cpu_ops *ops);

/*
 * ops (of the four ops here): NULL or !ops->bf16 for F32. ops->bf16 is their
 * BF16 product mode (CODECRT_PRECISION_BF16): operands rounded to bfloat16,
 * products summed in F32 (vdpbf16ps, twice the multiply-adds of an F32 FMA per
 * instruction); it needs AVX512-BF16 (with F, BW and VL):
 * cr_bf16_cpu_available(), and the ops return NULL without it. With
 * ops->packs, the linear and convolution ops pack their (host) weights into it
 * once, when the graph is built, instead of at every compute: the weights must
 * hold their values by then and keep them while the packs live (a context's
 * weights do: they are the model's, loaded before any graph).
 */
bool cr_bf16_cpu_available(void);

/* Whether the BF16 products of packed weights (ops->packs) and of the fused attention
   run on AMX tiles (ops/ops_amx.c) instead of vdpbf16ps: an x86-64 CPU with AMX-BF16, Linux granting
   the tile state, CODECRT_NO_AMX unset or 0. Probed once per process. */
bool cr_amx_cpu_available(void);

/*
 * y = W x (+ b) for F32 x [K, ...] contiguous, W [K, M] F32 contiguous with M a
 * multiple of 16, b [M] or NULL -> [M, ...]: the fused kernel of
 * ops/ops_avx512_linear.c, bias in the product's epilogue. NULL where it does not
 * apply (other CPUs, other types or shapes): then use ggml_mul_mat. CPU only.
 */
struct ggml_tensor *cr_linear_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, const cr_cpu_ops *ops);

/*
 * Conv1d at stride 1 with zero padding: x [C, T, B] F32 contiguous (channels
 * fastest), w ne [K, C, M] F32 (PyTorch (M, C, K)) with M a multiple of 16,
 * b [M] or NULL -> [M, T + pad_left + pad_right - dilation (K-1), B]. The fused
 * kernel of ops/ops_avx512_linear.c, with no im2col matrix; NULL where it does not
 * apply (then use im2col and a product). CPU only.
 */
struct ggml_tensor *cr_conv1d_cpu(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, int dilation, int pad_left, int pad_right,
                                  const cr_cpu_ops *ops);

/* ------------------------------------------------------------------- noise */

/* Standard normal sample for (seed, stream, position): the same triple always
   gives the same value, whatever the chunking or batching of the decode. */
float cr_noise_normal(uint64_t seed, uint32_t stream, uint64_t position);
/* Uniform in [0, 1) for the same key scheme. */
float cr_noise_uniform(uint64_t seed, uint32_t stream, uint64_t position);

/* ---------------------------------------------------------- host threads */

/* Item i of a host loop (host_parallel.c): items are independent of each other. */
typedef void (*cr_parallel_fn)(void *arg, int64_t i);
#define CR_PARALLEL_MAX_THREADS 64
/* fn(arg, i) for i in [0, n) on up to n_threads threads (the caller's included),
   returning when every item is done; n_threads <= 1 runs them in order here. */
void cr_parallel_for(int n_threads, int64_t n, cr_parallel_fn fn, void *arg);

/* ------------------------------------------------------------- shape guard */

/* What the backends of a context can run (guard.c). */
typedef struct cr_limits {
    int64_t grid_yz;      /* GPU launch grid: most blocks in y and z (0: no GPU rules) */
    int64_t max_elements; /* most elements of one tensor */
    int64_t piece_elements; /* an offline decode above this runs in pieces (CR_PIECE_ELEMENTS) */
    ggml_backend_t const *backends; /* the set that runs the graphs (none: no support check) */
    int n_backends;
} cr_limits;

/* The limits of a backend set (GPU rules if any backend is not the CPU), with
   the test overrides CODECRT_GUARD_GRID and CODECRT_GUARD_ELEMENTS applied. */
cr_limits cr_limits_for(ggml_backend_t const *backends, int n_backends);
/* CODECRT_E_TOO_LARGE, naming the op, shape and limit, if t breaks a limit. */
codecrt_status cr_guard_node(const cr_limits *lim, const struct ggml_tensor *t, cr_err *err);
/* Every node of gf and its sources against the limits, then every node against the limits'
   backends (cr_guard_supported); call before ggml allocates or computes gf. */
codecrt_status cr_guard_graph(const cr_limits *lim, struct ggml_cgraph *gf, cr_err *err);
/* CODECRT_E_UNSUPPORTED, naming the op and its types, where no backend of the set runs a node
   of gf (ggml's scheduler asserts on such a node: an op and type pairing that a build or an
   environment switch leaves without a kernel). */
codecrt_status cr_guard_supported(ggml_backend_t const *backends, int n_backends, struct ggml_cgraph *gf,
                                  cr_err *err);

/* --------------------------------------------------------- graph lifecycle */

typedef struct cr_graph_key {
    int32_t kind;
    int32_t n_frames;
    int32_t n_batch;
    int32_t flags;
} cr_graph_key;

/* cr_graph_key.flags: each adds parts to a graph (an envelope reserves their union) */
enum { CR_FLAG_NOISE = 1, CR_FLAG_MASKED = 2 };

/* Builds the graph for key into ctx0 and stores its inputs and outputs in io. */
typedef struct ggml_cgraph *(*cr_build_fn)(void *user, struct ggml_context *ctx0,
                                           const cr_graph_key *key, cr_graph_io *io);

typedef struct cr_graph_slot {
    ggml_backend_sched_t sched;  /* NULL until first use, or after a recreation */
    struct ggml_context *ctx;    /* owns the live graph's tensors; NULL if none */
    struct ggml_cgraph *graph;   /* the live graph, allocated by sched */
    cr_graph_key key;
    bool live;
    bool reserved;
    int32_t reserved_frames;     /* envelope the compute buffers are sized for */
    int32_t reserved_batch;
    int32_t reserved_flags;      /* the union of the flags reserved for (a flag adds graph parts) */
    bool recreate;               /* policy: new scheduler after each release */
    int n_threads;               /* CPU threads the live graph is computed with (threads.c) */
    cr_graph_io io;
} cr_graph_slot;

/* Per-op compute time, for CODECRT_PROFILE_OPS=1 (profile.c). */
typedef struct cr_profile cr_profile;
cr_profile *cr_profile_new_if_enabled(void); /* NULL unless the variable is set */
void cr_profile_start(cr_profile *p);       /* before a compute; p may be NULL */
bool cr_profile_eval_cb(struct ggml_tensor *t, bool ask, void *user);
void cr_profile_free(cr_profile *p, const char *device); /* prints the table; p may be NULL */

typedef struct cr_graphs {
    ggml_backend_t backends[CODECRT_MAX_BACKENDS];
    int n_backends;
    size_t graph_size;           /* max nodes per graph */
    cr_graph_slot slots[CODECRT_GRAPH_KIND_COUNT];
    cr_limits limits;            /* every graph is checked against these before allocation */
    uint64_t built, reused, resets, recreations, reservations, computes;
    double last_compute_ms;
    double launch_ms; /* cr_now_ms() at the last launch */
    double acquire_ms, inputs_ms, enqueue_ms; /* the host's parts of the last launch (codecrt_stats) */
    cr_profile *profile;         /* NULL unless CODECRT_PROFILE_OPS is set */
    /* threads per graph (threads.c), when the graphs compute on the CPU backend: each
       graph gets what its work per node is worth, up to max_threads */
    ggml_backend_t cpu_compute;  /* the CPU backend if it computes the graphs, else NULL */
    int max_threads, cur_threads, last_threads;
    double thread_work;          /* multiply-adds per node per thread (CR_THREAD_WORK) */
    bool inputs_on_device;       /* graph inputs allocated in backends[0]'s buffer (graph.c) */
} cr_graphs;

/* threads.c */
double cr_thread_work(void); /* CR_THREAD_WORK, or CODECRT_THREAD_WORK from the environment */
int cr_threads_for(struct ggml_cgraph *gf, int n_threads, double work_per_thread);

void cr_graphs_init(cr_graphs *g, ggml_backend_t *backends, int n_backends, size_t graph_size);
/* graphs computed on the CPU backend get threads per graph, at most n_threads */
void cr_graphs_cpu_threads(cr_graphs *g, ggml_backend_t cpu, int n_threads);
void cr_graphs_free(cr_graphs *g);

/*
 * Make the graph for key live in its kind's slot and return it in *out.
 * If the slot's live graph has the same key it is returned untouched (reuse).
 * Otherwise the old graph is released, the compute buffers are reserved for
 * the envelope max(reserved, key) when that grew (worst = that envelope), and
 * a new graph is built and allocated. slot->io holds its inputs.
 */
codecrt_status cr_graphs_acquire(cr_graphs *g, const cr_graph_key *key, cr_build_fn build,
                                 void *user, cr_graph_slot **out, cr_err *err);

/* Release the kind's graph and forget its envelope: the next acquire reserves for its
   own key rather than the union with the envelope, on the same scheduler. ggml's
   allocator only grows the buffers (CPU and CUDA), so no device memory is freed or reallocated for a
   key the buffers already hold: a new scheduler each time (as this once did) costs a
   device allocation and a cold first compute at every switch between long flows and wide
   batches (an S3Gen row of 30 streams on an H100 recreated its schedulers 4 times). */
void cr_graphs_forget_envelope(cr_graphs *g, int32_t kind);

/* Reserve the kind's buffers for an envelope (n_frames, n_batch, flags). */
codecrt_status cr_graphs_reserve(cr_graphs *g, const cr_graph_key *envelope, cr_build_fn build,
                                 void *user, cr_err *err);

codecrt_status cr_graphs_compute(cr_graphs *g, cr_graph_slot *slot, cr_err *err);
/* cr_graphs_compute in two halves: launch (returns once the device has the
   work; on the CPU backend, once it is done) and wait (until the device is
   done; outputs may then be read). Between them the graph's inputs may not be
   set and no other graph of g may be acquired, reserved or computed. */
codecrt_status cr_graphs_launch(cr_graphs *g, cr_graph_slot *slot, cr_err *err);
void cr_graphs_wait(cr_graphs *g, cr_graph_slot *slot);

/* Release the kind's live graph: reset the scheduler while the graph is still
   alive, then free its context; recreate the scheduler if the policy says so. */
void cr_graphs_release(cr_graphs *g, int32_t kind);

size_t cr_graphs_buffer_size(const cr_graphs *g, int backend_index);

/* ----------------------------------------------------------------- streams */

/* Growable host arrays. */
typedef struct cr_i32_vec {
    int32_t *data;
    int64_t n, cap, start; /* live elements are data[start, n) */
} cr_i32_vec;

typedef struct cr_f32_vec {
    float *data;
    int64_t n, cap, start;
} cr_f32_vec;

/* The slot pool: every state tensor has one row per slot, plus a dummy row
   that padded batch entries read and write. */
typedef struct cr_stream_pool {
    struct ggml_context *ctx;
    ggml_backend_buffer_t buffer;
    struct ggml_tensor *states[CR_MAX_STATES];
    int n_states;
    int32_t n_slots;                 /* real slots; row n_slots is the dummy */
    struct codecrt_stream **owner;   /* owner[slot] or NULL */
    int32_t n_active;
    int32_t chunk;
    int32_t latency;
} cr_stream_pool;

struct codecrt_stream {
    struct codecrt_context *ctx;
    int32_t slot;
    codecrt_stream_params params;
    cr_i32_vec levels[CODECRT_MAX_LEVELS]; /* pending codes; start = consumed prefix dropped */
    int64_t level_base[CODECRT_MAX_LEVELS]; /* codes dropped from the front so far */
    int32_t n_levels;                       /* levels this stream carries: the model's, or (levels_prefix
                                               architectures) those of its first push; 0 until then */
    int64_t ticks;                          /* chunks consumed */
    int64_t total_frames;                   /* -1 until finish */
    int64_t samples_pulled;
    bool done;
    bool stepping;                          /* set while codecrt_context_step_begin checks its list */
    cr_f32_vec out;                         /* final PCM not pulled yet */
    /* the last tick's PCM where it landed, in the context's output staging (out_stage), when
       out was empty then: pulled from there after out (one host copy fewer for a caller that
       pulls every tick), or copied into out before the next tick's PCM lands there
       (cr_stream_keep_outputs). lazy_n = 0: none. */
    const float *lazy;
    int64_t lazy_n;
    cr_err err;
};

void cr_pool_free(cr_stream_pool *pool);
/* Every stream's lazy output (the last tick's PCM left in ctx->out_stage) copied into its own
   buffer: before the staging takes another tick's PCM or is freed. Out of memory: the error,
   every lazy output left as it was (or_drop false: the staging stays), or dropped (or_drop:
   the staging goes, and no stream may point into it). */
codecrt_status cr_stream_keep_outputs(codecrt_context *ctx, bool or_drop);
/* The output staging freed (after cr_stream_keep_outputs). */
void cr_out_stage_free(codecrt_context *ctx);

/* ----------------------------------------------------------------- context */

struct codecrt_context {
    cr_model *model;
    char device_name[64];
    ggml_backend_t backend;          /* primary (GPU or CPU) */
    ggml_backend_t cpu;              /* always present; == backend on CPU */
    bool cpu_ops;                    /* graphs may use the fused CPU custom ops: the backend is the CPU and
                                        CODECRT_PORTABLE_OPS is unset (tests set it to check, on the CPU,
                                        the graphs that GPUs run) */
    bool offline_tf;                 /* offline decode graphs time fastest (cr_decode_shape.time_fastest) */
    bool fused_unit;                 /* time-fastest graphs run the residual unit's ops (cr_unit_core,
                                        cr_unit_tail; S3Gen's estimator its softmax, cr_softmax_rows):
                                        where the ops backend runs them (ops_backend),
                                        or everywhere off the fused CPU kernels with
                                        CODECRT_FUSED_UNIT=1; CODECRT_FUSED_UNIT=0: never */
    ggml_backend_t ops_backend;      /* the codecrt ops backend beside a CUDA backend, or NULL */
    bool one_stream_graph;           /* a tick with edge streams runs every stream in the masked graph,
                                        not steady and edge in one each (off the CPU by default;
                                        CODECRT_STREAM_GRAPHS=one or split forces either) */
    cr_cpu_ops fused;                /* what cpu_ops graphs use: BF16 products (params.precision, checked
                                        at init) and their weight packs */
    int host_threads;                /* threads for host loops over sequences (cr_parallel_for): the
                                        CPU backend's n_threads */
    struct ggml_context *weights;    /* model->weights on CPU, device copy otherwise */
    struct ggml_context *dev_weights_ctx;
    ggml_backend_buffer_t dev_weights_buf;
    cr_graphs graphs;
    cr_stream_pool pool;
    codecrt_context_params params;
    float *scratch;
    size_t scratch_cap;
    /* a tick's PCM from the device (cr_stream_collect), which streams' lazy outputs point into:
       page-locked where the device's backend offers a host buffer (CUDA: the copy is one DMA
       at the bus' speed, not staged through the driver's own pinned pages), else malloc'd */
    float *out_stage;
    size_t out_stage_cap;                /* floats */
    ggml_backend_buffer_t out_stage_buf; /* the page-locked buffer, or NULL */
    uint64_t *seed_scratch;
    size_t seed_cap;
    int32_t *piece_codes;            /* the codes of one piece of a long decode */
    size_t piece_codes_cap;
    /* the tick codecrt_context_step_begin started and codecrt_context_step_end
       collects; active from begin to end (cr_settle ends it early) */
    struct {
        bool active;
        int32_t stepped;             /* streams already stepped (collected) by begin */
        cr_graph_slot *slot;         /* the graph on the device; NULL if none */
        codecrt_stream **ready;      /* its streams [0, n): owned */
        int32_t n;
        int32_t settled;             /* streams stepped by a cr_settle since the last begin, */
        codecrt_status settled_st;   /* and its status: what the caller's end then reports */
    } inflight;
    cr_err err;
};

/* Collect a tick that codecrt_context_step_begin left on the device, if any:
   called first by every entry point that touches the context's graphs,
   slots or streams other than push, pull and info (stream.c). */
codecrt_status cr_settle(codecrt_context *ctx);

#endif /* CODECRT_INTERNAL_H */
