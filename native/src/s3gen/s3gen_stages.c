/*
 * s3gen_stages.c: S3Gen's stages as graph kinds of the lifecycle manager, one
 * call each: encoder (tokens -> mu), one estimator evaluation (allocated once
 * per shape, computed once per Euler step with new inputs: a graph is
 * single-use for allocation, multi-use for computation), F0, HiFT.
 */
#include <string.h>

#include "s3gen.h"

/* Builders get the context through the lifecycle manager's user pointer. */
typedef struct s3_build {
    codecrt_context *ctx;
} s3_build;

#define S3_IO_STORE(io, x)                                                                         \
    do {                                                                                           \
        _Static_assert(sizeof(x) <= sizeof((io)->t) - sizeof((io)->t[0]), "io struct too large");  \
        memcpy(&(io)->t[1], &(x), sizeof(x));                                                      \
    } while (0)
#define S3_IO_LOAD(x, io) memcpy(&(x), &(io)->t[1], sizeof(x))

/* t[0] is every kind's output; t[1..] the component's io struct. */
static struct ggml_cgraph *s3_finish(struct ggml_context *ctx0, struct ggml_tensor *out, cr_graph_io *io) {
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx0, CR_GRAPH_SIZE, false);
    ggml_set_output(out);
    io->t[0] = out;
    ggml_build_forward_expand(gf, out);
    return gf;
}

static struct ggml_cgraph *s3_build_encode(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                           cr_graph_io *io) {
    codecrt_context *ctx = ((s3_build *)user)->ctx;
    s3_encoder_io e;
    memset(&e, 0, sizeof(e));
    struct ggml_tensor *mu =
        s3_encoder_build(ctx0, ctx->weights, s3_hp(ctx), key->n_frames, key->n_batch, s3_cpu_ops(ctx),
                         ctx->fused_unit, &e);
    S3_IO_STORE(io, e);
    return s3_finish(ctx0, mu, io);
}

static struct ggml_cgraph *s3_build_step(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                         cr_graph_io *io) {
    codecrt_context *ctx = ((s3_build *)user)->ctx;
    s3_estimator_io e;
    memset(&e, 0, sizeof(e));
    struct ggml_tensor *v =
        s3_estimator_build(ctx0, ctx->weights, s3_hp(ctx), key->n_frames, key->n_batch, s3_cpu_ops(ctx),
                           ctx->fused_unit, &e);
    S3_IO_STORE(io, e);
    return s3_finish(ctx0, v, io);
}

static struct ggml_cgraph *s3_build_f0(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                       cr_graph_io *io) {
    codecrt_context *ctx = ((s3_build *)user)->ctx;
    s3_f0_io e;
    memset(&e, 0, sizeof(e));
    struct ggml_tensor *f0 =
        s3_f0_build(ctx0, ctx->weights, s3_hp(ctx), key->n_frames, key->n_batch, ctx->fused_unit, &e);
    S3_IO_STORE(io, e);
    return s3_finish(ctx0, f0, io);
}

static struct ggml_cgraph *s3_build_vocode(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                           cr_graph_io *io) {
    codecrt_context *ctx = ((s3_build *)user)->ctx;
    s3_hift_io e;
    memset(&e, 0, sizeof(e));
    struct ggml_tensor *pcm =
        s3_hift_build(ctx0, ctx->weights, s3_hp(ctx), key->n_frames, key->n_batch, s3_cpu_ops(ctx),
                      ctx->fused_unit, &e);
    S3_IO_STORE(io, e);
    return s3_finish(ctx0, pcm, io);
}

/* Refuse shapes whose largest tensor ggml cannot index (checked before building). */
static codecrt_status s3_check_elements(codecrt_context *ctx, const char *what, int64_t elems) {
    if (elems > CR_MAX_TENSOR_ELEMENTS) {
        return cr_fail(&ctx->err, CODECRT_E_TOO_LARGE, "%s needs a tensor of %lld elements (limit %lld): "
                       "decode shorter sequences", what, (long long)elems, (long long)CR_MAX_TENSOR_ELEMENTS);
    }
    return CODECRT_OK;
}

/* Largest tensor of a kind's graph for (T, B), in elements. */
typedef int64_t (*s3_elements_fn)(int64_t T, int64_t B);

/*
 * Graph `what` of a kind for (T, B): refused past ggml's tensor size limit.
 * A kind's reservation grows per axis (the lifecycle manager's envelope), which
 * suits sizes linear in T and B; the estimator's attention is quadratic in T.
 * After a batch of short flows, one long flow alone would otherwise reserve
 * (the longest T) x (the largest batch), a shape that never runs: when that
 * envelope passes the batch budget, the kind's envelope is forgotten and the
 * request reserved alone (on the same scheduler, whose buffers only grow).
 */
static codecrt_status s3_acquire(codecrt_context *ctx, int32_t kind, const char *what, int64_t T, int64_t B,
                                 s3_elements_fn elems, cr_build_fn fn, cr_graph_slot **slot) {
    codecrt_status st = s3_check_elements(ctx, what, elems(T, B));
    if (st != CODECRT_OK) {
        return st;
    }
    const cr_graph_slot *cur = &ctx->graphs.slots[kind];
    if (cur->reserved) {
        const int64_t eT = T > cur->reserved_frames ? T : cur->reserved_frames;
        const int64_t eB = B > cur->reserved_batch ? B : cur->reserved_batch;
        const int64_t need = elems(T, B), env = elems(eT, eB);
        /* only where the envelope would grow: one already covering the request costs nothing */
        if ((T > cur->reserved_frames || B > cur->reserved_batch) && env > need && env > S3_BATCH_ELEMENTS) {
            cr_graphs_forget_envelope(&ctx->graphs, kind);
        }
    }
    const cr_graph_key key = {.kind = kind, .n_frames = (int32_t)T, .n_batch = (int32_t)B, .flags = 0};
    s3_build b = {ctx};
    return cr_graphs_acquire(&ctx->graphs, &key, fn, &b, slot, &ctx->err);
}

/* ------------------------------------------------------------ the stages */

/* tokens [B][n] -> mu [B][80][2n] */
codecrt_status s3_encode(codecrt_context *ctx, const int32_t *tokens, int64_t n, int64_t B, float *mu) {
    cr_graph_slot *slot = NULL;
    codecrt_status st = s3_acquire(ctx, CODECRT_GRAPH_ENCODE, "the encoder", n, B, s3_encoder_max_elements,
                                   s3_build_encode, &slot);
    if (st != CODECRT_OK) {
        return st;
    }
    s3_encoder_io e;
    S3_IO_LOAD(e, &slot->io);
    ggml_backend_tensor_set(e.tokens, tokens, 0, sizeof(int32_t) * (size_t)(n * B));
    s3_encoder_set_inputs(s3_hp(ctx), n, B, &e);
    if ((st = cr_graphs_compute(&ctx->graphs, slot, &ctx->err)) != CODECRT_OK) {
        return st;
    }
    ggml_backend_tensor_get(slot->io.t[0], mu, 0, sizeof(float) * (size_t)(2 * n * S3_MEL * B));
    return CODECRT_OK;
}

/* Allocate the estimator graph for [T, 80, B]. */
codecrt_status s3_step_graph(codecrt_context *ctx, int64_t T, int64_t B, cr_graph_slot **slot,
                             s3_estimator_io *e) {
    codecrt_status st = s3_acquire(ctx, CODECRT_GRAPH_FLOW_STEP, "the flow estimator", T, B,
                                   s3_estimator_max_elements, s3_build_step, slot);
    if (st != CODECRT_OK) {
        return st;
    }
    S3_IO_LOAD(*e, &(*slot)->io);
    return CODECRT_OK;
}

/* One evaluation. Every input is set before every compute: the allocator may
   reuse an input's memory for later tensors of the same graph once it is
   consumed, so step-invariant inputs do not survive a compute. */
codecrt_status s3_step_eval(codecrt_context *ctx, cr_graph_slot *slot, const s3_estimator_io *e, int64_t T,
                            int64_t B, const float *x, const float *mu, const float *cond, const float *spks,
                            const float *t, const float *r, float *out) {
    ggml_backend_tensor_set(e->mu, mu, 0, sizeof(float) * (size_t)(T * S3_MEL * B));
    ggml_backend_tensor_set(e->cond, cond, 0, sizeof(float) * (size_t)(T * S3_MEL * B));
    ggml_backend_tensor_set(e->spks, spks, 0, sizeof(float) * (size_t)(S3_MEL * B));
    ggml_backend_tensor_set(e->x, x, 0, sizeof(float) * (size_t)(T * S3_MEL * B));
    s3_estimator_set_inputs(s3_hp(ctx), T, B, t, r, e);
    codecrt_status st = cr_graphs_compute(&ctx->graphs, slot, &ctx->err);
    if (st == CODECRT_OK) {
        ggml_backend_tensor_get(slot->io.t[0], out, 0, sizeof(float) * (size_t)(T * S3_MEL * B));
    }
    return st;
}

/* mel [K][80][F] -> f0 [K][F] */
codecrt_status s3_f0(codecrt_context *ctx, const float *mel, int64_t F, int64_t K, float *f0) {
    cr_graph_slot *slot = NULL;
    codecrt_status st = s3_acquire(ctx, CODECRT_GRAPH_F0, "the F0 predictor", F, K, s3_hift_max_elements,
                                   s3_build_f0, &slot);
    if (st != CODECRT_OK) {
        return st;
    }
    s3_f0_io e;
    S3_IO_LOAD(e, &slot->io);
    ggml_backend_tensor_set(e.mel, mel, 0, sizeof(float) * (size_t)(F * S3_MEL * K));
    if ((st = cr_graphs_compute(&ctx->graphs, slot, &ctx->err)) == CODECRT_OK) {
        ggml_backend_tensor_get(slot->io.t[0], f0, 0, sizeof(float) * (size_t)(F * K));
    }
    return st;
}

/* mel [K][80][F] + source [K][F*480] -> pcm [K][F*480] */
codecrt_status s3_hift(codecrt_context *ctx, const float *mel, int64_t F, int64_t K, const float *source,
                       float *pcm) {
    cr_graph_slot *slot = NULL;
    codecrt_status st = s3_acquire(ctx, CODECRT_GRAPH_VOCODE, "the vocoder", F, K, s3_hift_max_elements,
                                   s3_build_vocode, &slot);
    if (st != CODECRT_OK) {
        return st;
    }
    s3_hift_io e;
    S3_IO_LOAD(e, &slot->io);
    ggml_backend_tensor_set(e.mel, mel, 0, sizeof(float) * (size_t)(F * S3_MEL * K));
    ggml_backend_tensor_set(e.source, source, 0, sizeof(float) * (size_t)(F * S3_MEL_HOP * K));
    s3_hift_set_inputs(s3_hp(ctx), F, K, &e);
    if ((st = cr_graphs_compute(&ctx->graphs, slot, &ctx->err)) == CODECRT_OK) {
        ggml_backend_tensor_get(slot->io.t[0], pcm, 0, sizeof(float) * (size_t)(F * S3_MEL_HOP * K));
    }
    return st;
}
