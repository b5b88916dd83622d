#define _POSIX_C_SOURCE 200809L
/*
 * stream.c: streams, the slot pool, and batched ticks.
 *
 * Host side of streaming. A stream holds the codes pushed but not yet
 * consumed, its tick count and the PCM not yet pulled; its layer states live
 * in its slot of the pool (device memory), one row per slot in each state
 * tensor. A tick gathers the states of the streams it advances by slot index,
 * computes one chunk for all of them, and scatters the new states back, in one
 * graph whose shape is (chunk, batch bucket) only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "stream_state.h"

#define CR_NO_END INT64_MAX

codecrt_stream_params codecrt_stream_default_params(void) {
    codecrt_stream_params p = {.noise = 0, .seed = 0};
    return p;
}

void cr_io_add_time(cr_graph_io *io, struct ggml_tensor *t, int32_t kind, int32_t rate, int32_t delay,
                    int32_t site, int64_t len) {
    if (io->n_times >= CR_MAX_TIMES) {
        io->overflow = true;
        return;
    }
    cr_time_input *ti = &io->times[io->n_times++];
    ti->tensor = t;
    ti->kind = kind;
    ti->rate = rate;
    ti->delay = delay;
    ti->site = site;
    ti->len = len;
}

/* --------------------------------------------------------------- vectors */

static bool cr_i32_push(cr_i32_vec *v, const int32_t *x, int64_t n) {
    if (v->n + n > v->cap) {
        /* drop the consumed prefix before growing */
        if (v->start > 0) {
            memmove(v->data, v->data + v->start, (size_t)(v->n - v->start) * sizeof(int32_t));
            v->n -= v->start;
            v->start = 0;
        }
        if (v->n + n > v->cap) {
            int64_t cap = v->cap ? v->cap : 256;
            while (cap < v->n + n) {
                cap *= 2;
            }
            int32_t *d = realloc(v->data, (size_t)cap * sizeof(int32_t));
            if (!d) {
                return false;
            }
            v->data = d;
            v->cap = cap;
        }
    }
    memcpy(v->data + v->n, x, (size_t)n * sizeof(int32_t));
    v->n += n;
    return true;
}

static float *cr_f32_reserve(cr_f32_vec *v, int64_t n) {
    if (v->n + n > v->cap) {
        if (v->start > 0) {
            memmove(v->data, v->data + v->start, (size_t)(v->n - v->start) * sizeof(float));
            v->n -= v->start;
            v->start = 0;
        }
        if (v->n + n > v->cap) {
            int64_t cap = v->cap ? v->cap : 4096;
            while (cap < v->n + n) {
                cap *= 2;
            }
            float *d = realloc(v->data, (size_t)cap * sizeof(float));
            if (!d) {
                return NULL;
            }
            v->data = d;
            v->cap = cap;
        }
    }
    return v->data + v->n;
}

/* ------------------------------------------------------------------ pool */

static codecrt_status cr_pool_init(codecrt_context *ctx, cr_err *err) {
    cr_stream_pool *pool = &ctx->pool;
    const cr_model *m = ctx->model;
    if (!m->arch->build_stream) {
        return cr_fail(err, CODECRT_E_UNSUPPORTED, "architecture '%s' cannot stream", m->arch->name);
    }
    const int32_t mult = m->arch->stream_chunk_multiple(m);
    int32_t chunk = ctx->params.stream_chunk_frames > 0 ? ctx->params.stream_chunk_frames : mult;
    if (chunk % mult != 0) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "stream_chunk_frames = %d is not a multiple of %d",
                       ctx->params.stream_chunk_frames, mult);
    }
    cr_state_spec specs[CR_MAX_STATES] = {0};
    const int n_states = m->arch->stream_states(m, specs, CR_MAX_STATES);
    if (n_states > CR_MAX_STATES) {
        return cr_fail(err, CODECRT_E_UNSUPPORTED, "too many stream states");
    }
    const int32_t n_slots = ctx->params.max_streams;
    /* the largest tick graph: a full batch, each buffer with up to 64 frames of state */
    const int64_t elems = m->arch->max_tensor_elements(m, chunk, ctx->params.max_batch, 64);
    if (elems > CR_MAX_TENSOR_ELEMENTS) {
        return cr_fail(err, CODECRT_E_TOO_LARGE, "a tick of %d frames for max_batch = %d streams needs a tensor "
                       "of %lld elements (limit %lld): lower max_batch", chunk, ctx->params.max_batch,
                       (long long)elems, (long long)CR_MAX_TENSOR_ELEMENTS);
    }
    struct ggml_init_params ip = {
        .mem_size = ggml_tensor_overhead() * (size_t)(n_states + 1),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    pool->ctx = ggml_init(ip);
    pool->owner = calloc((size_t)n_slots, sizeof(*pool->owner));
    if (!pool->ctx || !pool->owner) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    for (int i = 0; i < n_states; i++) {
        /* a KV window's ring: its kept steps in whole blocks of the tick's new steps, plus one block */
        const int64_t frames = specs[i].window > 0 ? cr_window_steps(specs[i].frames, (int64_t)chunk * specs[i].window)
                                                   : specs[i].frames;
        if (specs[i].window > 0 && frames * (int64_t)(n_slots + 1) > INT32_MAX) { /* its I32 step rows */
            return cr_fail(err, CODECRT_E_TOO_LARGE, "max_streams = %d is too many for attention windows of "
                           "%lld steps a stream (their step indices are 32-bit)", n_slots, (long long)frames);
        }
        pool->states[i] = ggml_new_tensor_2d(pool->ctx, GGML_TYPE_F32, specs[i].channels * frames, n_slots + 1);
        char name[32];
        snprintf(name, sizeof(name), "state.%d", i);
        ggml_set_name(pool->states[i], name);
    }
    pool->buffer = ggml_backend_alloc_ctx_tensors(pool->ctx, ctx->backend);
    if (!pool->buffer) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "cannot allocate stream state for %d slots on %s", n_slots,
                       ctx->device_name);
    }
    /* contents never matter before a stream's first tick (keep = 0), but start clean */
    ggml_backend_buffer_clear(pool->buffer, 0);
    pool->n_states = n_states;
    pool->n_slots = n_slots;
    pool->chunk = chunk;
    pool->latency = m->arch->stream_latency(m);
    return CODECRT_OK;
}

void cr_pool_free(cr_stream_pool *pool) {
    if (pool->buffer) {
        ggml_backend_buffer_free(pool->buffer);
    }
    if (pool->ctx) {
        ggml_free(pool->ctx);
    }
    free(pool->owner);
    memset(pool, 0, sizeof(*pool));
}

/* --------------------------------------------------------------- streams */

static void cr_stream_clear(codecrt_stream *s) {
    for (int l = 0; l < CODECRT_MAX_LEVELS; l++) {
        s->levels[l].n = 0;
        s->levels[l].start = 0;
        s->level_base[l] = 0;
    }
    s->n_levels = s->ctx->model->arch->levels_prefix ? 0 : s->ctx->model->info.n_levels;
    s->ticks = 0;
    s->total_frames = -1;
    s->samples_pulled = 0;
    s->done = false;
    s->out.n = 0;
    s->out.start = 0;
    s->lazy = NULL;
    s->lazy_n = 0;
}

codecrt_status codecrt_stream_init(codecrt_context *ctx, const codecrt_stream_params *params,
                                   codecrt_stream **out) {
    if (!ctx || !out) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    codecrt_status settled = cr_settle(ctx);
    if (settled != CODECRT_OK) {
        return settled;
    }
    *out = NULL;
    cr_stream_pool *pool = &ctx->pool;
    codecrt_status st;
    if (!pool->ctx && (st = cr_pool_init(ctx, &ctx->err)) != CODECRT_OK) {
        cr_pool_free(pool);
        return st;
    }
    int32_t slot = -1;
    for (int32_t i = 0; i < pool->n_slots && slot < 0; i++) {
        if (!pool->owner[i]) {
            slot = i;
        }
    }
    if (slot < 0) {
        return cr_fail(&ctx->err, CODECRT_E_TOO_LARGE, "all %d stream slots are taken", pool->n_slots);
    }
    codecrt_stream *s = calloc(1, sizeof(*s));
    if (!s) {
        return cr_fail(&ctx->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    s->ctx = ctx;
    s->slot = slot;
    s->params = params ? *params : codecrt_stream_default_params();
    cr_stream_clear(s);
    pool->owner[slot] = s;
    pool->n_active++;
    *out = s;
    return CODECRT_OK;
}

void codecrt_stream_free(codecrt_stream *s) {
    if (!s) {
        return;
    }
    (void)cr_settle(s->ctx); /* its slot and graph inputs may be in the tick on the device */
    cr_stream_pool *pool = &s->ctx->pool;
    if (pool->owner && pool->owner[s->slot] == s) {
        pool->owner[s->slot] = NULL;
        pool->n_active--;
    }
    for (int l = 0; l < CODECRT_MAX_LEVELS; l++) {
        free(s->levels[l].data);
    }
    free(s->out.data);
    free(s);
}

const char *codecrt_stream_last_error(const codecrt_stream *s) { return s ? s->err.msg : ""; }

static int64_t cr_stream_level_len(const codecrt_stream *s, int l) {
    return s->level_base[l] + s->levels[l].n - s->levels[l].start;
}

/* Frames for which every level has its codes. */
static int64_t cr_stream_frames_complete(const codecrt_stream *s) {
    const codecrt_model_info *info = &s->ctx->model->info;
    int64_t f = s->n_levels > 0 ? INT64_MAX : 0;
    for (int l = 0; l < s->n_levels; l++) {
        const int64_t fl = cr_stream_level_len(s, l) * info->level_stride[l];
        f = fl < f ? fl : f;
    }
    return f;
}

static int64_t cr_stream_end_samples(const codecrt_stream *s) {
    return s->total_frames < 0 ? CR_NO_END : s->total_frames * s->ctx->model->info.hop_length;
}

static bool cr_stream_ready(const codecrt_stream *s) {
    if (s->done) {
        return false;
    }
    if (s->total_frames >= 0) {
        return true; /* flushing */
    }
    return cr_stream_frames_complete(s) >= (s->ticks + 1) * s->ctx->pool.chunk;
}

codecrt_status codecrt_stream_push(codecrt_stream *s, const codecrt_codes *codes) {
    if (!s) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    const codecrt_model_info *info = &s->ctx->model->info;
    if (s->total_frames >= 0) {
        return cr_fail(&s->err, CODECRT_E_STATE, "push after finish");
    }
    if (!codes || !codes->lengths || !codes->levels) {
        return cr_fail(&s->err, CODECRT_E_INVALID_ARGUMENT, "codes, levels and lengths must not be NULL");
    }
    if (codes->n_batch != 1) {
        return cr_fail(&s->err, CODECRT_E_SHAPE, "a stream takes one sequence, got a batch of %d", codes->n_batch);
    }
    if (s->n_levels == 0) { /* a levels_prefix architecture: the first push fixes the stream's levels */
        if (codes->n_levels < 1 || codes->n_levels > info->n_levels) {
            return cr_fail(&s->err, CODECRT_E_SHAPE, "got %d code levels, model has 1 to %d", codes->n_levels,
                           info->n_levels);
        }
    } else if (codes->n_levels != s->n_levels) {
        return cr_fail(&s->err, CODECRT_E_SHAPE, "got %d code levels, %s %d", codes->n_levels,
                       s->ctx->model->arch->levels_prefix ? "the stream started with" : "model has", s->n_levels);
    }
    for (int l = 0; l < codes->n_levels; l++) {
        const int64_t n = codes->lengths[l];
        if (n < 0 || n > (1 << 24)) {
            return cr_fail(&s->err, CODECRT_E_SHAPE, "level %d: bad length %lld", l, (long long)n);
        }
        if (n > 0 && !codes->levels[l]) {
            return cr_fail(&s->err, CODECRT_E_INVALID_ARGUMENT, "level %d is NULL", l);
        }
        for (int64_t i = 0; i < n; i++) {
            const int32_t c = codes->levels[l][i];
            if (c < 0 || c >= info->codebook_size[l]) {
                return cr_fail(&s->err, CODECRT_E_CODE_RANGE,
                               "code %d at level %d, position %lld is outside [0, %d)", c, l,
                               (long long)(cr_stream_level_len(s, l) + i), info->codebook_size[l]);
            }
        }
    }
    for (int l = 0; l < codes->n_levels; l++) {
        if (codes->lengths[l] > 0 && !cr_i32_push(&s->levels[l], codes->levels[l], codes->lengths[l])) {
            /* cannot happen after partial appends: grow failed on level l, roll back earlier levels */
            for (int k = 0; k < l; k++) {
                s->levels[k].n -= codes->lengths[k];
            }
            return cr_fail(&s->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
        }
    }
    s->n_levels = codes->n_levels;
    return CODECRT_OK;
}

codecrt_status codecrt_stream_finish(codecrt_stream *s) {
    if (!s) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    codecrt_status settled = cr_settle(s->ctx);
    if (settled != CODECRT_OK) {
        return settled;
    }
    const codecrt_model_info *info = &s->ctx->model->info;
    if (s->total_frames >= 0) {
        return cr_fail(&s->err, CODECRT_E_STATE, "finish called twice");
    }
    const int64_t f0 = cr_stream_level_len(s, 0) * info->level_stride[0];
    for (int l = 1; l < s->n_levels; l++) {
        const int64_t fl = cr_stream_level_len(s, l) * info->level_stride[l];
        if (fl != f0) {
            return cr_fail(&s->err, CODECRT_E_SHAPE,
                           "incomplete frame at finish: level 0 covers %lld frames, level %d covers %lld",
                           (long long)f0, l, (long long)fl);
        }
    }
    if (f0 % info->frame_multiple != 0) {
        return cr_fail(&s->err, CODECRT_E_SHAPE, "%lld frames at finish is not a multiple of %d", (long long)f0,
                       info->frame_multiple);
    }
    s->total_frames = f0;
    if (f0 == 0) {
        s->done = true;
    }
    return CODECRT_OK;
}

codecrt_status codecrt_stream_reset(codecrt_stream *s) {
    if (!s) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    codecrt_status settled = cr_settle(s->ctx);
    if (settled != CODECRT_OK) {
        return settled;
    }
    cr_stream_clear(s);
    return CODECRT_OK;
}

codecrt_status codecrt_stream_pull(codecrt_stream *s, float *pcm, size_t capacity, size_t *n_out) {
    if (!s || (!pcm && capacity > 0)) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    /* the older samples first (out), then the last tick's where they landed (lazy) */
    if (capacity > (size_t)INT64_MAX) {
        capacity = (size_t)INT64_MAX;
    }
    const int64_t avail = s->out.n - s->out.start;
    const int64_t n = avail < (int64_t)capacity ? avail : (int64_t)capacity;
    if (n > 0) {
        memcpy(pcm, s->out.data + s->out.start, (size_t)n * sizeof(float));
        s->out.start += n;
    }
    if (s->out.start == s->out.n) {
        s->out.start = s->out.n = 0;
    }
    const int64_t room = (int64_t)capacity - n, m = s->lazy_n < room ? s->lazy_n : room;
    if (m > 0) {
        memcpy(pcm + n, s->lazy, (size_t)m * sizeof(float));
        s->lazy += m;
        s->lazy_n -= m;
    }
    s->samples_pulled += n + m;
    if (n_out) {
        *n_out = (size_t)(n + m);
    }
    return CODECRT_OK;
}

codecrt_status codecrt_streams_push(codecrt_stream *const *streams, int32_t n, const uint32_t *n_levels,
                                    const uint32_t *lengths, size_t n_lengths, const int32_t *codes,
                                    size_t n_codes, codecrt_status *status) {
    if (n < 0 || (n > 0 && (!streams || !n_levels || !status)) || (n_lengths > 0 && !lengths) ||
        (n_codes > 0 && !codes)) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    size_t nl = 0, nc = 0;
    for (int32_t i = 0; i < n; i++) {
        if (n_levels[i] > CODECRT_MAX_LEVELS) {
            return CODECRT_E_INVALID_ARGUMENT;
        }
        nl += n_levels[i];
    }
    if (nl != n_lengths) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    for (size_t j = 0; j < n_lengths; j++) {
        nc += lengths[j];
    }
    if (nc > n_codes) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    const int32_t *at = codes;
    const uint32_t *len = lengths;
    for (int32_t i = 0; i < n; i++) {
        const int32_t *levels[CODECRT_MAX_LEVELS];
        int64_t lens[CODECRT_MAX_LEVELS];
        for (uint32_t l = 0; l < n_levels[i]; l++) {
            levels[l] = at;
            lens[l] = len[l];
            at += len[l];
        }
        len += n_levels[i];
        const codecrt_codes c = {.n_batch = 1, .n_levels = (int32_t)n_levels[i], .levels = levels, .lengths = lens};
        status[i] = streams[i] ? codecrt_stream_push(streams[i], &c) : CODECRT_E_INVALID_ARGUMENT;
    }
    return CODECRT_OK;
}

codecrt_status codecrt_streams_pull(codecrt_stream *const *streams, int32_t n, float *pcm, size_t capacity,
                                    int64_t *counts, int32_t *flags) {
    if (n < 0 || (n > 0 && (!streams || !counts || !flags)) || (!pcm && capacity > 0)) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        codecrt_stream *s = streams[i];
        counts[i] = 0;
        flags[i] = 0;
        if (!s) {
            continue;
        }
        size_t got = 0;
        codecrt_stream_pull(s, pcm ? pcm + at : NULL, capacity - at, &got);
        at += got;
        counts[i] = (int64_t)got;
        flags[i] = (cr_stream_ready(s) ? CODECRT_PULL_READY : 0) | (s->done ? CODECRT_PULL_DONE : 0) |
                   (s->out.n > s->out.start || s->lazy_n > 0 ? CODECRT_PULL_MORE : 0);
    }
    return CODECRT_OK;
}

codecrt_status codecrt_stream_get_info(const codecrt_stream *s, codecrt_stream_info *info) {
    if (!s || !info) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    const cr_stream_pool *pool = &s->ctx->pool;
    memset(info, 0, sizeof(*info));
    info->frames_pushed = cr_stream_frames_complete(s);
    info->frames_decoded = s->ticks * pool->chunk;
    info->samples_ready = s->out.n - s->out.start + s->lazy_n;
    info->samples_pulled = s->samples_pulled;
    info->total_samples = s->total_frames < 0 ? -1 : s->total_frames * s->ctx->model->info.hop_length;
    info->chunk_frames = pool->chunk;
    info->latency_samples = pool->latency;
    info->slot = s->slot;
    info->finished = s->total_frames >= 0;
    info->done = s->done;
    info->ready = cr_stream_ready(s);
    return CODECRT_OK;
}

/* ------------------------------------------------------------------ tick */

typedef struct cr_stream_build {
    codecrt_context *ctx;
} cr_stream_build;

static struct ggml_cgraph *cr_build_stream_graph(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                                 cr_graph_io *io) {
    codecrt_context *ctx = ((cr_stream_build *)user)->ctx;
    const cr_stream_shape shape = {
        .chunk = key->n_frames,
        .n_batch = key->n_batch,
        .cpu_ops = ctx->cpu_ops,
        .ops = ctx->cpu_ops ? &ctx->fused : NULL,
        .masked = key->kind == CODECRT_GRAPH_STREAM_EDGE,
        .noise = (key->flags & CR_FLAG_NOISE) != 0,
        .fused_unit = ctx->fused_unit,
    };
    struct ggml_cgraph *gf = ctx->model->arch->build_stream(ctx->model, ctx0, ctx->weights, &shape,
                                                            ctx->pool.states, ctx->pool.n_states, io);
    if (io->n_states != ctx->pool.n_states) {
        io->overflow = true; /* the builder and its state list disagree: refused, never computed */
    }
    return gf;
}

static int32_t cr_stream_bucket(const codecrt_context *ctx, int32_t n) {
    if (!ctx->params.batch_bucket) {
        return n;
    }
    int32_t b = 1;
    while (b < n) {
        b <<= 1;
    }
    return b;
}

codecrt_status cr_stream_keep_outputs(codecrt_context *ctx, bool or_drop) {
    const cr_stream_pool *pool = &ctx->pool;
    codecrt_status st = CODECRT_OK;
    for (int32_t i = 0; pool->owner && i < pool->n_slots; i++) {
        codecrt_stream *s = pool->owner[i];
        if (!s || s->lazy_n == 0) {
            continue;
        }
        float *dst = st == CODECRT_OK ? cr_f32_reserve(&s->out, s->lazy_n) : NULL;
        if (!dst) {
            if (st == CODECRT_OK) {
                st = cr_fail(&ctx->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
            }
            if (!or_drop) {
                return st; /* the staging stays as it is: every lazy output still valid */
            }
            s->lazy = NULL; /* the staging goes: never left pointing into it */
            s->lazy_n = 0;
            continue;
        }
        memcpy(dst, s->lazy, (size_t)s->lazy_n * sizeof(float));
        s->out.n += s->lazy_n;
        s->lazy = NULL;
        s->lazy_n = 0;
    }
    return st;
}

void cr_out_stage_free(codecrt_context *ctx) {
    if (ctx->out_stage_buf) {
        ggml_backend_buffer_free(ctx->out_stage_buf);
    } else {
        free(ctx->out_stage);
    }
    ctx->out_stage_buf = NULL;
    ctx->out_stage = NULL;
    ctx->out_stage_cap = 0;
}

/* ctx->out_stage for at least `floats`, with no stream's lazy output in it (the caller kept
   them): page-locked memory from the device's host buffer type where it has one. */
static codecrt_status cr_out_stage_reserve(codecrt_context *ctx, size_t floats, cr_err *err) {
    if (floats <= ctx->out_stage_cap) {
        return CODECRT_OK;
    }
    cr_out_stage_free(ctx);
    const size_t cap = floats + floats / 4; /* room for a few more streams without a new one */
    ggml_backend_dev_t dev = ctx->backend && ctx->backend != ctx->cpu ? ggml_backend_get_device(ctx->backend) : NULL;
    ggml_backend_buffer_type_t host = dev ? ggml_backend_dev_host_buffer_type(dev) : NULL;
    if (host && (ctx->out_stage_buf = ggml_backend_buft_alloc_buffer(host, cap * sizeof(float))) != NULL) {
        ctx->out_stage = ggml_backend_buffer_get_base(ctx->out_stage_buf);
    } else if ((ctx->out_stage = malloc(cap * sizeof(float))) == NULL) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    ctx->out_stage_cap = cap;
    return CODECRT_OK;
}

/* Fill every input of the tick graph for the streams in ready[0..n). */
static codecrt_status cr_stream_set_inputs(codecrt_context *ctx, const cr_graph_io *io, codecrt_stream **ready,
                                           int32_t n, int32_t B, cr_err *err) {
    const cr_model *m = ctx->model;
    const codecrt_model_info *info = &m->info;
    const int64_t chunk = ctx->pool.chunk;
    size_t need = (size_t)B * 4;
    for (int t = 0; t < io->n_times; t++) {
        const size_t sz = io->times[t].tensor ? (size_t)ggml_nelements(io->times[t].tensor) : 0;
        need = sz > need ? sz : need;
    }
    if (io->bounds) {
        const size_t sz = (size_t)ggml_nelements(io->bounds);
        need = sz > need ? sz : need;
    }
    for (int i = 0; i < io->n_windows; i++) {
        const size_t r = (size_t)ggml_nelements(io->windows[i].read), w = (size_t)ggml_nelements(io->windows[i].write);
        need = r > need ? r : need;
        need = w > need ? w : need;
    }
    for (int l = 0; l < info->n_levels; l++) {
        const size_t sz = (size_t)ggml_nelements(io->codes[l]);
        need = sz > need ? sz : need;
    }
    /* the output's staging too, before the graph runs (its states are written then): grown
       now, and what an earlier tick left there (not pulled) moved into its stream's own
       buffer, so that a failure leaves every stream as it was */
    codecrt_status st = cr_stream_keep_outputs(ctx, false);
    if (st != CODECRT_OK || (st = cr_out_stage_reserve(ctx, (size_t)ggml_nelements(io->out), err)) != CODECRT_OK ||
        (st = cr_grow((void **)&ctx->scratch, &ctx->scratch_cap, need, sizeof(float), err)) != CODECRT_OK) {
        return st;
    }
    float *f = ctx->scratch;
    int32_t *iv = (int32_t *)ctx->scratch;

    for (int32_t b = 0; b < B; b++) {
        iv[b] = b < n ? ready[b]->slot : ctx->pool.n_slots; /* padding reads the dummy row */
    }
    ggml_backend_tensor_set(io->slot_read, iv, 0, (size_t)B * sizeof(int32_t));
    ggml_backend_tensor_set(io->slot_write, iv, 0, (size_t)B * sizeof(int32_t));
    if (io->keep) {
        for (int32_t b = 0; b < B; b++) {
            f[b] = b < n && ready[b]->ticks > 0 ? 1.0f : 0.0f;
        }
        ggml_backend_tensor_set(io->keep, f, 0, (size_t)B * sizeof(float));
    }
    for (int i = 0; i < io->n_windows; i++) { /* KV window rings (stream_state.h) */
        const cr_window_input *w = &io->windows[i];
        const int64_t Q = w->Q, per = w->n;
        /* tick k of a stream reads its slot's blocks k+1 .. k+Q (mod Q), oldest first, after
           writing its new steps into block k mod Q (the last one read) */
        for (int32_t b = 0; b < B; b++) {
            const int64_t slot = b < n ? ready[b]->slot : ctx->pool.n_slots, k = b < n ? ready[b]->ticks : 0;
            for (int64_t j = 0; j < Q; j++) {
                iv[(size_t)(b * Q + j)] = (int32_t)(slot * Q + (k + 1 + j) % Q);
            }
        }
        ggml_backend_tensor_set(w->read, iv, 0, (size_t)(Q * B) * sizeof(int32_t));
        for (int32_t b = 0; b < B; b++) {
            const int64_t slot = b < n ? ready[b]->slot : ctx->pool.n_slots, k = b < n ? ready[b]->ticks : 0;
            for (int64_t j = 0; j < per; j++) {
                iv[(size_t)(b * per + j)] = (int32_t)((slot * Q + k % Q) * per + j);
            }
        }
        ggml_backend_tensor_set(w->write, iv, 0, (size_t)(per * B) * sizeof(int32_t));
    }

    for (int l = 0; l < info->n_levels; l++) {
        const int64_t per = chunk / info->level_stride[l];
        for (int32_t b = 0; b < B; b++) {
            int32_t *dst = iv + (size_t)b * (size_t)per;
            if (b >= n) {
                memset(dst, 0, (size_t)per * sizeof(int32_t));
                continue;
            }
            codecrt_stream *s = ready[b];
            if (l >= s->n_levels) { /* absent level (levels_prefix): the architecture's zero row */
                for (int64_t i = 0; i < per; i++) {
                    dst[i] = info->codebook_size[l];
                }
                continue;
            }
            const cr_i32_vec *v = &s->levels[l];
            const int64_t first = s->ticks * per; /* absolute code index */
            for (int64_t i = 0; i < per; i++) {
                const int64_t abs = first + i;
                const int64_t rel = abs - s->level_base[l] + v->start;
                dst[i] = rel < v->n ? v->data[rel] : 0; /* beyond the end: masked */
            }
        }
        ggml_backend_tensor_set(io->codes[l], iv, 0, (size_t)(per * B) * sizeof(int32_t));
    }
    if (io->bounds) { /* every mask's [lo, hi) per stream: the graph makes the 0/1 masks */
        for (int t = 0; t < io->n_times; t++) {
            const cr_time_input *ti = &io->times[t];
            if (ti->kind != CR_TIME_MASK) {
                continue;
            }
            const int64_t len = ti->len;
            float *lo1 = f + (size_t)(2 * ti->site) * (size_t)B, *hi = lo1 + B;
            for (int32_t b = 0; b < B; b++) {
                const codecrt_stream *s = b < n ? ready[b] : NULL;
                int64_t a = len + 1, z = 0; /* padding: no valid point */
                if (s) {
                    const int64_t t0 = s->ticks * chunk * ti->rate - ti->delay;
                    const int64_t end = s->total_frames < 0 ? CR_NO_END
                                        : m->arch->valid_points ? m->arch->valid_points(m, s->total_frames, ti->rate)
                                                                : s->total_frames * ti->rate;
                    a = t0 < 0 ? -t0 : 0;
                    z = end == CR_NO_END ? len + 1 : end - t0;
                }
                /* points 0 <= i < len: clamped to [0, len + 1] they stay exact in F32 */
                a = a < 0 ? 0 : a > len + 1 ? len + 1 : a;
                z = z < 0 ? 0 : z > len + 1 ? len + 1 : z;
                lo1[b] = (float)(a - 1);
                hi[b] = (float)z;
            }
        }
        ggml_backend_tensor_set(io->bounds, f, 0, (size_t)(2 * io->n_bounds) * (size_t)B * sizeof(float));
    }
    for (int t = 0; t < io->n_times; t++) {
        const cr_time_input *ti = &io->times[t];
        if (ti->kind == CR_TIME_MASK) {
            continue; /* in bounds, above */
        }
        const int64_t len = ti->len;
        for (int32_t b = 0; b < B; b++) {
            const codecrt_stream *s = b < n ? ready[b] : NULL;
            const int64_t t0 = s ? s->ticks * chunk * ti->rate - ti->delay : 0;
            for (int64_t i = 0; i < len; i++) {
                const int64_t tt = t0 + i;
                const size_t k = (size_t)b * (size_t)len + (size_t)i;
                switch (ti->kind) {
                case CR_TIME_NOISE:
                    f[k] = s && s->params.noise && tt >= 0 ? cr_noise_normal(s->params.seed, (uint32_t)ti->site,
                                                                             (uint64_t)tt)
                                                           : 0.0f;
                    break;
                default: iv[k] = (int32_t)(((tt % ti->site) + ti->site) % ti->site); break;
                }
            }
        }
        ggml_backend_tensor_set(ti->tensor, ctx->scratch, 0, (size_t)(len * B) * sizeof(float));
    }
    return CODECRT_OK;
}

/* Append the final samples of the tick's output to each stream: left where they land
   (lazy) for a stream with nothing else to pull, copied into its buffer otherwise. */
static codecrt_status cr_stream_collect(codecrt_context *ctx, const cr_graph_io *io, codecrt_stream **ready,
                                        int32_t n, cr_err *err) {
    const int64_t len = io->out->ne[1];
    /* the staging takes this tick's PCM: cr_stream_set_inputs sized it and moved what an
       earlier tick left there into its stream's own buffer, before the graph ran */
    if ((size_t)n * (size_t)len > ctx->out_stage_cap) {
        return cr_fail(err, CODECRT_E_COMPUTE, "output staging smaller than the tick's output");
    }
    /* one device-to-host copy for the tick (a copy per stream costs a
       synchronisation each: 256 of them were 2 ms of a 37 ms CUDA tick) */
    ggml_backend_tensor_get(io->out, ctx->out_stage, 0, (size_t)n * (size_t)len * sizeof(float));
    for (int32_t b = 0; b < n; b++) {
        codecrt_stream *s = ready[b];
        const int64_t t0 = s->ticks * ctx->pool.chunk * io->out_rate - io->out_delay;
        const int64_t end = cr_stream_end_samples(s);
        int64_t lo = t0 < 0 ? -t0 : 0;
        int64_t hi = end == CR_NO_END ? len : (end - t0 < len ? end - t0 : len);
        if (hi > lo) {
            const float *src = ctx->out_stage + (size_t)b * (size_t)len + (size_t)lo;
            if (s->out.n == s->out.start) { /* nothing older to pull: pulled from here */
                s->lazy = src;
                s->lazy_n = hi - lo;
            } else {
                float *dst = cr_f32_reserve(&s->out, hi - lo);
                if (!dst) {
                    return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
                }
                memcpy(dst, src, (size_t)(hi - lo) * sizeof(float));
                s->out.n += hi - lo;
            }
        }
        s->ticks++;
        if (end != CR_NO_END && s->ticks * ctx->pool.chunk * io->out_rate - io->out_delay >= end) {
            s->done = true;
        }
        /* drop codes that no later tick reads */
        const codecrt_model_info *info = &ctx->model->info;
        for (int l = 0; l < s->n_levels; l++) {
            cr_i32_vec *v = &s->levels[l];
            const int64_t consumed = s->ticks * ctx->pool.chunk / info->level_stride[l] - s->level_base[l];
            const int64_t drop = consumed < v->n - v->start ? consumed : v->n - v->start;
            if (drop > 0) {
                v->start += drop;
                s->level_base[l] += drop;
            }
        }
    }
    return CODECRT_OK;
}

/* A stream needs the masked graph while any point of the decoder still sees
   times before 0 (its first ticks: the output lags by the latency), and once
   finished (times past the end). */
static bool cr_stream_is_edge(const codecrt_stream *s) {
    const cr_stream_pool *pool = &s->ctx->pool;
    return s->total_frames >= 0 ||
           s->ticks * pool->chunk * (int64_t)s->ctx->model->info.hop_length < (int64_t)pool->latency ||
           s->ticks == 0;
}

/* Launch one graph over ready[0..n) (at most max_batch of them), of the given
   kind: *slot and *n_in get the graph and how many streams it holds. */
static codecrt_status cr_stream_launch(codecrt_context *ctx, int32_t kind, codecrt_stream **ready, int32_t n,
                                       cr_graph_slot **slot, int32_t *n_in) {
    /* more ready streams than one graph may hold: the rest wait for the next tick */
    n = n < ctx->params.max_batch ? n : ctx->params.max_batch;
    const int32_t bucket = cr_stream_bucket(ctx, n);
    bool noise = false;
    for (int32_t i = 0; i < n && !noise; i++) {
        noise = ready[i]->params.noise != 0;
    }
    const cr_graph_key key = {
        .kind = kind,
        .n_frames = ctx->pool.chunk,
        .n_batch = bucket < ctx->params.max_batch ? bucket : ctx->params.max_batch,
        .flags = noise ? CR_FLAG_NOISE : 0,
    };
    cr_stream_build build = {ctx};
    codecrt_status st;
    if ((st = cr_graphs_acquire(&ctx->graphs, &key, cr_build_stream_graph, &build, slot, &ctx->err)) != CODECRT_OK) {
        return st;
    }
    const double t0 = cr_now_ms();
    st = cr_stream_set_inputs(ctx, &(*slot)->io, ready, n, key.n_batch, &ctx->err);
    ctx->graphs.inputs_ms = cr_now_ms() - t0;
    if (st != CODECRT_OK || (st = cr_graphs_launch(&ctx->graphs, *slot, &ctx->err)) != CODECRT_OK) {
        return st;
    }
    *n_in = n;
    return CODECRT_OK;
}

/* Wait for a launched graph and advance its n streams. */
static codecrt_status cr_stream_land(codecrt_context *ctx, cr_graph_slot *slot, codecrt_stream **ready, int32_t n) {
    cr_graphs_wait(&ctx->graphs, slot);
    return cr_stream_collect(ctx, &slot->io, ready, n, &ctx->err);
}

codecrt_status cr_settle(codecrt_context *ctx) {
    if (!ctx || !ctx->inflight.active) {
        return CODECRT_OK;
    }
    int32_t k = 0;
    const codecrt_status st = codecrt_context_step_end(ctx, &k);
    ctx->inflight.settled = k; /* for the caller's own step_end */
    ctx->inflight.settled_st = st;
    return st;
}

codecrt_status codecrt_context_step_begin(codecrt_context *ctx, codecrt_stream *const *streams, int32_t n) {
    if (!ctx || (n > 0 && !streams) || n < 0) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    codecrt_status st = cr_settle(ctx);
    ctx->inflight.settled = 0;
    ctx->inflight.settled_st = CODECRT_OK;
    if (st != CODECRT_OK) {
        return st;
    }
    codecrt_stream **ready = malloc(sizeof(*ready) * (size_t)(n > 0 ? n : 1));
    if (!ready) {
        return cr_fail(&ctx->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    int32_t k = 0, marked = 0;
    for (int32_t i = 0; i < n; i++, marked++) {
        codecrt_stream *s = streams[i];
        if (!s || s->ctx != ctx || ctx->pool.owner[s->slot] != s) {
            st = cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "stream %d does not belong to this context", i);
            goto fail;
        }
        if (s->stepping) {
            st = cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "stream %d appears twice", i);
            goto fail;
        }
        s->stepping = true; /* a mark, cleared below: duplicates found in O(n), not O(n^2) */
        if (cr_stream_ready(s)) {
            ready[k++] = s;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        streams[i]->stepping = false;
    }
    marked = 0;
    /* steady streams first, edge streams (start, end) after: one graph each.
       The smaller graph runs to completion here, the larger is left on the
       device for step_end, so that the caller's host work overlaps it. */
    int32_t n_steady = 0;
    for (int32_t i = 0; i < k; i++) {
        if (!cr_stream_is_edge(ready[i])) {
            codecrt_stream *t = ready[n_steady];
            ready[n_steady++] = ready[i];
            ready[i] = t;
        }
    }
    if (ctx->one_stream_graph && n_steady < k) {
        n_steady = 0; /* the masked graph is exact for steady streams too: all in it */
    }
    const int32_t n_edge = k - n_steady;
    codecrt_stream **first = ready, **last = ready + n_steady;
    int32_t n_first = n_steady, n_last = n_edge, kind_first = CODECRT_GRAPH_STREAM,
            kind_last = CODECRT_GRAPH_STREAM_EDGE;
    if (n_edge > 0 && n_edge < n_steady) {
        first = ready + n_steady, last = ready;
        n_first = n_edge, n_last = n_steady;
        kind_first = CODECRT_GRAPH_STREAM_EDGE, kind_last = CODECRT_GRAPH_STREAM;
    }
    int32_t stepped = 0, n_in = 0;
    cr_graph_slot *slot = NULL;
    if (n_first > 0 && n_last > 0) {
        if ((st = cr_stream_launch(ctx, kind_first, first, n_first, &slot, &n_in)) != CODECRT_OK ||
            (st = cr_stream_land(ctx, slot, first, n_in)) != CODECRT_OK) {
            goto fail;
        }
        stepped = n_in;
    } else if (n_first > 0) {
        last = first, n_last = n_first, kind_last = kind_first;
    }
    slot = NULL, n_in = 0;
    if (n_last > 0 && (st = cr_stream_launch(ctx, kind_last, last, n_last, &slot, &n_in)) != CODECRT_OK) {
        goto fail;
    }
    /* the launched streams move to the front of ready, which the step keeps */
    memmove(ready, last, sizeof(*ready) * (size_t)n_in);
    ctx->inflight.active = true;
    ctx->inflight.stepped = stepped;
    ctx->inflight.slot = slot;
    ctx->inflight.ready = ready;
    ctx->inflight.n = n_in;
    return CODECRT_OK;
fail:
    for (int32_t i = 0; i < marked; i++) {
        streams[i]->stepping = false;
    }
    free(ready);
    return st;
}

codecrt_status codecrt_context_step_end(codecrt_context *ctx, int32_t *n_stepped) {
    if (n_stepped) {
        *n_stepped = 0;
    }
    if (!ctx) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    if (!ctx->inflight.active) { /* never begun, or ended early by a cr_settle: what it did */
        const codecrt_status st = ctx->inflight.settled_st;
        if (n_stepped) {
            *n_stepped = ctx->inflight.settled;
        }
        ctx->inflight.settled = 0;
        ctx->inflight.settled_st = CODECRT_OK;
        return st;
    }
    codecrt_status st = CODECRT_OK;
    int32_t total = ctx->inflight.stepped;
    if (ctx->inflight.slot) {
        st = cr_stream_land(ctx, ctx->inflight.slot, ctx->inflight.ready, ctx->inflight.n);
        total += st == CODECRT_OK ? ctx->inflight.n : 0;
    }
    free(ctx->inflight.ready);
    ctx->inflight.active = false;
    ctx->inflight.slot = NULL;
    ctx->inflight.ready = NULL;
    ctx->inflight.n = 0;
    if (n_stepped) {
        *n_stepped = total;
    }
    return st;
}

codecrt_status codecrt_context_step(codecrt_context *ctx, codecrt_stream *const *streams, int32_t n,
                                    int32_t *n_stepped) {
    if (n_stepped) {
        *n_stepped = 0;
    }
    codecrt_status st = codecrt_context_step_begin(ctx, streams, n);
    return st == CODECRT_OK ? codecrt_context_step_end(ctx, n_stepped) : st;
}
