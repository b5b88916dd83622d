#define _POSIX_C_SOURCE 200809L /* fseeko, sysconf, clock_gettime */
/*
 * context.c: devices, weight placement, the decode entry point and stats.
 *
 * A context owns one primary backend (a GPU, or the CPU) plus the CPU backend
 * as the scheduler's fallback, a copy of the weights on the device (on the CPU
 * the model's tensors are used in place), and the graph manager. Validation of
 * every decode happens here, before any ggml call.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cuda_ops.h"
#include "ggml-cpu.h"
#include "internal.h"

codecrt_context_params codecrt_context_default_params(void) {
    codecrt_context_params p = {
        .device = "auto",
        .n_threads = 0,
        .max_frames = 1 << 20,
        .max_batch = 64,
        .frame_bucket = 0,
        .batch_bucket = 0,
        .stream_chunk_frames = 0,
        .max_streams = 64,
        .precision = CODECRT_PRECISION_F32,
    };
    return p;
}

codecrt_decode_params codecrt_decode_default_params(void) {
    codecrt_decode_params p = {
        .noise = 0, .seed = 0, .seeds = NULL, .voice = NULL, .n_steps = 0, .cfg_rate = -1.0f};
    return p;
}

static codecrt_status ctx_status(codecrt_context *ctx, codecrt_status st) {
    if (st == CODECRT_OK) {
        ctx->err.msg[0] = '\0';
    }
    return st;
}

/* ----------------------------------------------------------------- devices */

static bool cr_streq_ci(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) {
            return false;
        }
    }
    return *a == *b;
}

static bool cr_dev_is_gpu(ggml_backend_dev_t dev) {
    const enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
    return t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU;
}

static void cr_list_devices(char *buf, size_t size) {
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < ggml_backend_dev_count() && off < size; i++) {
        off += (size_t)snprintf(buf + off, size - off, "%s%s", i ? ", " : "",
                                ggml_backend_dev_name(ggml_backend_dev_get(i)));
    }
}

/* Resolve "cpu", "auto", "cuda", "cuda:N", "metal", "vulkan", "vulkan:N". */
static codecrt_status cr_pick_device(const char *spec, ggml_backend_dev_t *out, cr_err *err) {
    char family[32];
    long index = 0;
    const char *colon = strchr(spec, ':');
    const size_t flen = colon ? (size_t)(colon - spec) : strlen(spec);
    if (flen == 0 || flen >= sizeof(family)) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "bad device '%s'", spec);
    }
    memcpy(family, spec, flen);
    family[flen] = '\0';
    if (colon) {
        char *end = NULL;
        index = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || index < 0) {
            return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "bad device index in '%s'", spec);
        }
    }
    if (cr_streq_ci(family, "cpu")) {
        *out = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        return *out ? CODECRT_OK : cr_fail(err, CODECRT_E_BACKEND, "no CPU backend");
    }
    const bool any_gpu = cr_streq_ci(family, "auto");
    if (!any_gpu && !cr_streq_ci(family, "cuda") && !cr_streq_ci(family, "metal") &&
        !cr_streq_ci(family, "vulkan")) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT,
                       "unknown device '%s' (use cpu, cuda, cuda:N, metal, vulkan, vulkan:N or auto)", spec);
    }
    long seen = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (!cr_dev_is_gpu(dev)) {
            continue;
        }
        const char *reg = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
        const bool match = any_gpu || cr_streq_ci(reg, family) ||
                           (cr_streq_ci(family, "metal") && cr_streq_ci(reg, "MTL"));
        if (match && seen++ == index) {
            *out = dev;
            return CODECRT_OK;
        }
    }
    if (any_gpu) {
        *out = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        return *out ? CODECRT_OK : cr_fail(err, CODECRT_E_BACKEND, "no CPU backend");
    }
    char devs[256];
    cr_list_devices(devs, sizeof(devs));
    return cr_fail(err, CODECRT_E_BACKEND, "device '%s' is not available (this build has: %s)", spec, devs);
}

/* Copy every model tensor to a buffer of the primary device. */
static codecrt_status cr_upload_weights(codecrt_context *ctx, cr_err *err) {
    const cr_model *m = ctx->model;
    const int n = (int)(ggml_get_mem_size(m->weights) / ggml_tensor_overhead()) + 1;
    struct ggml_init_params ip = {
        .mem_size = ggml_tensor_overhead() * (size_t)n,
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    ctx->dev_weights_ctx = ggml_init(ip);
    if (!ctx->dev_weights_ctx) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    for (struct ggml_tensor *t = ggml_get_first_tensor(m->weights); t; t = ggml_get_next_tensor(m->weights, t)) {
        struct ggml_tensor *d = ggml_dup_tensor(ctx->dev_weights_ctx, t);
        ggml_set_name(d, ggml_get_name(t));
    }
    ctx->dev_weights_buf = ggml_backend_alloc_ctx_tensors(ctx->dev_weights_ctx, ctx->backend);
    if (!ctx->dev_weights_buf) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "cannot allocate the weights on %s", ctx->device_name);
    }
    ggml_backend_buffer_set_usage(ctx->dev_weights_buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    for (struct ggml_tensor *t = ggml_get_first_tensor(m->weights); t; t = ggml_get_next_tensor(m->weights, t)) {
        struct ggml_tensor *d = ggml_get_tensor(ctx->dev_weights_ctx, ggml_get_name(t));
        ggml_backend_tensor_set(d, t->data, 0, ggml_nbytes(t));
    }
    ctx->weights = ctx->dev_weights_ctx;
    return CODECRT_OK;
}

static codecrt_status cr_check_params(const codecrt_context_params *p, cr_err *err) {
    if (p->n_threads < 0 || p->n_threads > 512) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "n_threads = %d is out of range", p->n_threads);
    }
    if (p->max_frames < 1 || p->max_frames > (1 << 22) || p->max_batch < 1 || p->max_batch > 65536) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "max_frames = %d, max_batch = %d out of range",
                       p->max_frames, p->max_batch);
    }
    if (p->frame_bucket < 0 || p->frame_bucket > (1 << 20) || p->batch_bucket < 0 || p->batch_bucket > 1) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "bad bucket parameters");
    }
    if (p->stream_chunk_frames < 0 || p->stream_chunk_frames > (1 << 16) || p->max_streams < 1 ||
        p->max_streams > (1 << 20)) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "stream_chunk_frames = %d, max_streams = %d out of range",
                       p->stream_chunk_frames, p->max_streams);
    }
    if (p->precision != CODECRT_PRECISION_F32 && p->precision != CODECRT_PRECISION_BF16 &&
        p->precision != CODECRT_PRECISION_BF16X3) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "precision = %d is not a codecrt_precision", p->precision);
    }
    return CODECRT_OK;
}


/* CODECRT_FUSED_UNIT unset: whether a CUDA context runs the residual unit's ops (cuda/cuda_ops.h).
   On: on an H100 they match the composed ops (3.8e-06 relative L2 TF32 off) and step 2,000
   SNAC streams' ticks in 83 ms p99 against 136 ms composed (docs/runtime.md, "The switch");
   CODECRT_FUSED_UNIT=0 turns them off. */
#define CR_FUSED_UNIT_AUTO 1

/* An environment switch of three values: auto (unset or empty too), on_name or
   off_name; *out gets -1, 1 or 0. Anything else is refused, naming the choices
   ("NAME is 'value': use auto, <help>"). */
static codecrt_status cr_env_switch(const char *name, const char *on_name, const char *off_name, const char *help,
                                    int *out, cr_err *err) {
    const char *v = getenv(name);
    *out = -1;
    if (!v || !*v || strcmp(v, "auto") == 0) {
        return CODECRT_OK;
    }
    if (strcmp(v, on_name) == 0 || strcmp(v, off_name) == 0) {
        *out = strcmp(v, on_name) == 0;
        return CODECRT_OK;
    }
    return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "%s is '%s': use auto, %s", name, v, help);
}

static codecrt_status cr_context_init(codecrt_model *model_, const codecrt_context_params *params,
                                      codecrt_context *ctx, cr_err *err) {
    cr_model *model = (cr_model *)model_;
    codecrt_status st = cr_check_params(params, err);
    if (st != CODECRT_OK) {
        return st;
    }
    ctx->params = *params;
    ctx->params.device = NULL; /* not kept: the caller's string may go */
    cr_model_retain(model);
    ctx->model = model;

    ggml_backend_dev_t dev = NULL;
    if ((st = cr_pick_device(params->device ? params->device : "auto", &dev, err)) != CODECRT_OK) {
        return st;
    }
    const char *portable = getenv("CODECRT_PORTABLE_OPS");
    const bool portable_ops = portable && *portable && strcmp(portable, "0") != 0;
    int layout = -1, graphs = -1, fused_unit = -1, inputs = -1, precise_sin = -1; /* CODECRT_OFFLINE_LAYOUT:
                                     time 1, channels 0; CODECRT_STREAM_GRAPHS: one 1, split 0;
                                     CODECRT_FUSED_UNIT: 1 or 0; CODECRT_GRAPH_INPUTS: device 1, host 0;
                                     CODECRT_PRECISE_SIN: 1 or 0 (auto: 0); -1: auto (decided below,
                                     once the backend is known) */
    if ((st = cr_env_switch("CODECRT_OFFLINE_LAYOUT", "time", "channels",
                            "time (time fastest) or channels (channels fastest)", &layout, err)) != CODECRT_OK ||
        (st = cr_env_switch("CODECRT_STREAM_GRAPHS", "one", "split",
                            "split (steady and edge streams in a graph each) or one", &graphs, err)) != CODECRT_OK ||
        (st = cr_env_switch("CODECRT_FUSED_UNIT", "1", "0",
                            "1 (the residual unit's ops) or 0 (composed from ggml ops)", &fused_unit, err)) !=
            CODECRT_OK ||
        (st = cr_env_switch("CODECRT_GRAPH_INPUTS", "device", "host",
                            "device (graph inputs in the device's buffer) or host (where ggml's scheduler "
                            "puts them)", &inputs, err)) != CODECRT_OK ||
        (st = cr_env_switch("CODECRT_PRECISE_SIN", "1", "0",
                            "1 (the CUDA ops' Snakes take sinf) or 0 (the sine reduced modulo 2 pi, then "
                            "the hardware's)", &precise_sin, err)) != CODECRT_OK) {
        return st;
    }
    if (params->precision != CODECRT_PRECISION_F32) {
        /* refused rather than ignored (a caller asking for the speed of BF16
           must not get F32's silently, nor BF16's rounding where it is
           untested), and before any weight is uploaded */
        const char *name = params->precision == CODECRT_PRECISION_BF16 ? "bf16" : "bf16x3";
        if (!model->arch->bf16_products) {
            return cr_fail(err, CODECRT_E_UNSUPPORTED, "precision %s is not implemented for %s models", name,
                           model->arch->name);
        }
        if (ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            return cr_fail(err, CODECRT_E_UNSUPPORTED, "precision %s is implemented for the CPU only, not %s", name,
                           ggml_backend_dev_name(dev));
        }
        if (portable_ops) {
            return cr_fail(err, CODECRT_E_UNSUPPORTED,
                           "precision %s needs the fused CPU kernels, which CODECRT_PORTABLE_OPS turns off", name);
        }
        if (!cr_bf16_cpu_available()) {
            return cr_fail(err, CODECRT_E_UNSUPPORTED,
                           "precision %s needs an x86-64 CPU with AVX512-BF16, which this one lacks", name);
        }
    }
    snprintf(ctx->device_name, sizeof(ctx->device_name), "%s", ggml_backend_dev_name(dev));
    ctx->cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    if (!ctx->cpu) {
        return cr_fail(err, CODECRT_E_BACKEND, "cannot initialize the CPU backend");
    }
    int n_threads = params->n_threads;
    if (n_threads == 0) {
        const long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    ggml_backend_cpu_set_n_threads(ctx->cpu, n_threads);
    ctx->host_threads = n_threads;

    ggml_backend_t backends[3];
    int n_backends = 0;
    if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        ctx->backend = ctx->cpu;
        ctx->weights = model->weights;
        backends[n_backends++] = ctx->cpu;
    } else {
        ctx->backend = ggml_backend_dev_init(dev, NULL);
        if (!ctx->backend) {
            return cr_fail(err, CODECRT_E_BACKEND, "cannot initialize device %s", ctx->device_name);
        }
        if ((st = cr_upload_weights(ctx, err)) != CODECRT_OK) {
            return st;
        }
        backends[n_backends++] = ctx->backend;
        /* codecrt's own ops on the device, between it and the CPU: the scheduler gives a node to
           the first backend that takes it, and the device backend takes none of them
           (cuda/cuda_ops.h). NULL where the build or the device has none. */
        if (fused_unit == 1 || (fused_unit < 0 && CR_FUSED_UNIT_AUTO)) {
            ctx->ops_backend = cr_cuda_ops_new(ctx->backend, precise_sin == 1);
        }
        if (ctx->ops_backend) {
            backends[n_backends++] = ctx->ops_backend;
        }
        backends[n_backends++] = ctx->cpu;
    }
    ctx->cpu_ops = ctx->backend == ctx->cpu && !portable_ops;
    /* Offline graphs: time fastest off the CPU (one transpose per residual unit,
       what the stream graphs run), channels fastest with the fused CPU kernels
       (their layout); CODECRT_OFFLINE_LAYOUT forces one (tests, benchmarks) */
    ctx->offline_tf = layout >= 0 ? layout == 1 : !ctx->cpu_ops;
    /* the residual unit's ops where a device backend runs them; CODECRT_FUSED_UNIT=1 also on the
       CPU backend's portable graphs (their C functions: how CI checks them against the composed
       ops), never in the fused CPU kernels' channels-fastest graphs, which have their own */
    ctx->fused_unit = fused_unit == 1 ? !ctx->cpu_ops : ctx->ops_backend != NULL;
    /* one masked graph a tick off the CPU, where a second graph's fixed cost
       (its launches) outweighs the masks on every stream (H200, 1,000 SNAC
       streams: 61 against 73 ms a tick); split on the CPU, whose ticks are
       arithmetic; CODECRT_STREAM_GRAPHS forces either */
    ctx->one_stream_graph = graphs >= 0 ? graphs == 1 : ctx->backend != ctx->cpu;
    /* weights packed once per context for the fused kernels: every BF16 product's, and
       in F32 those of products on few rows (ops/ops_avx512.h, LN_MIN_ROWS) */
    ctx->fused.bf16 = params->precision != CODECRT_PRECISION_F32;
    ctx->fused.x3 = params->precision == CODECRT_PRECISION_BF16X3;
    if (ctx->cpu_ops && !(ctx->fused.packs = cr_packs_new())) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    cr_graphs_init(&ctx->graphs, backends, n_backends, CR_GRAPH_SIZE);
    /* graph inputs in the device's buffer (graph.c, cr_inputs_to_device) off the CPU, where
       ggml's scheduler would copy each at the split that first reads it (H100, 1,000 SNAC
       streams with the unit ops: a tick's launch 2.5 against 37 ms); CODECRT_GRAPH_INPUTS=host
       keeps ggml's placement */
    ctx->graphs.inputs_on_device = ctx->backend != ctx->cpu && inputs != 0;
    if (ctx->backend == ctx->cpu) {
        cr_graphs_cpu_threads(&ctx->graphs, ctx->cpu, n_threads);
    }
    return CODECRT_OK;
}

codecrt_status codecrt_context_init(codecrt_model *model, const codecrt_context_params *params,
                                    codecrt_context **out, char *err_buf, size_t err_size) {
    cr_err err = {{0}};
    if (out) {
        *out = NULL;
    }
    if (!model || !out) {
        codecrt_status st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "model and out must not be NULL");
        cr_err_copy(&err, err_buf, err_size);
        return st;
    }
    codecrt_context_params defaults = codecrt_context_default_params();
    codecrt_context *ctx = calloc(1, sizeof(*ctx));
    if (!ctx) {
        codecrt_status st = cr_fail(&err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
        cr_err_copy(&err, err_buf, err_size);
        return st;
    }
    codecrt_status st = cr_context_init(model, params ? params : &defaults, ctx, &err);
    cr_err_copy(&err, err_buf, err_size);
    if (st != CODECRT_OK) {
        codecrt_context_free(ctx);
        return st;
    }
    *out = ctx;
    return CODECRT_OK;
}

void codecrt_context_free(codecrt_context *ctx) {
    if (!ctx) {
        return;
    }
    (void)cr_settle(ctx); /* the graphs go: nothing may be left on the device */
    /* a stream still open keeps its last tick's PCM; the staging (page-locked by the device's
       backend) goes before the backends */
    (void)cr_stream_keep_outputs(ctx, true);
    cr_out_stage_free(ctx);
    /* graphs first (they point into the weights and the state pool), then the
       pool, the weights, the backends */
    cr_graphs_free(&ctx->graphs);
    cr_packs_free(ctx->fused.packs); /* the graphs' kernels read them */
    cr_pool_free(&ctx->pool);
    if (ctx->dev_weights_buf) {
        ggml_backend_buffer_free(ctx->dev_weights_buf);
    }
    if (ctx->dev_weights_ctx) {
        ggml_free(ctx->dev_weights_ctx);
    }
    if (ctx->ops_backend) {
        ggml_backend_free(ctx->ops_backend); /* records events on the device backend: freed first */
    }
    if (ctx->backend && ctx->backend != ctx->cpu) {
        ggml_backend_free(ctx->backend);
    }
    if (ctx->cpu) {
        ggml_backend_free(ctx->cpu);
    }
    free(ctx->scratch);
    free(ctx->seed_scratch);
    free(ctx->piece_codes);
    cr_model_release(ctx->model);
    free(ctx);
}

const char *codecrt_context_last_error(const codecrt_context *ctx) { return ctx ? ctx->err.msg : ""; }

const char *codecrt_context_device(const codecrt_context *ctx) { return ctx ? ctx->device_name : ""; }

codecrt_status codecrt_context_set_recreate_policy(codecrt_context *ctx, int32_t graph_kind, int32_t enabled) {
    if (!ctx) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    codecrt_status settled = cr_settle(ctx);
    if (settled != CODECRT_OK) {
        return settled;
    }
    if (graph_kind < 0 || graph_kind >= CODECRT_GRAPH_KIND_COUNT) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "graph kind %d is out of range", graph_kind);
    }
    ctx->graphs.slots[graph_kind].recreate = enabled != 0;
    return ctx_status(ctx, CODECRT_OK);
}

/* ------------------------------------------------------------------ decode */

typedef struct cr_decode_build {
    codecrt_context *ctx;
} cr_decode_build;

static struct ggml_cgraph *cr_build_decode(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                           cr_graph_io *io) {
    codecrt_context *ctx = ((cr_decode_build *)user)->ctx;
    const cr_decode_shape shape = {
        .n_frames = key->n_frames,
        .n_batch = key->n_batch,
        .noise = (key->flags & CR_FLAG_NOISE) != 0,
        .masked = (key->flags & CR_FLAG_MASKED) != 0,
        .cpu_ops = ctx->cpu_ops,
        .ops = ctx->cpu_ops ? &ctx->fused : NULL,
        .time_fastest = ctx->offline_tf,
        .fused_unit = ctx->fused_unit,
        .frames_masked = (key->flags & CR_FLAG_MASKED) != 0 && ctx->params.frame_bucket > 0,
    };
    return ctx->model->arch->build_decode(ctx->model, ctx0, ctx->weights, &shape, io);
}

static bool cr_bucketed(const codecrt_context *ctx) {
    return ctx->params.frame_bucket > 0 || ctx->params.batch_bucket;
}

static int32_t cr_bucket_frames(const codecrt_context *ctx, int32_t n_frames) {
    const int32_t mult = ctx->model->info.frame_multiple;
    int32_t q = ctx->params.frame_bucket > 0 ? ctx->params.frame_bucket : mult;
    if (q % mult != 0) {
        q = (q / mult + 1) * mult;
    }
    return (n_frames + q - 1) / q * q;
}

static int32_t cr_bucket_batch(const codecrt_context *ctx, int32_t n_batch) {
    if (!ctx->params.batch_bucket) {
        return n_batch;
    }
    int32_t b = 1;
    while (b < n_batch) {
        b <<= 1;
    }
    return b;
}

static codecrt_status cr_validate_codes(const codecrt_context *ctx, const codecrt_codes *codes,
                                        int32_t *n_frames_out, cr_err *err) {
    const codecrt_model_info *info = &ctx->model->info;
    if (!codes || !codes->levels || !codes->lengths) {
        return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "codes, levels and lengths must not be NULL");
    }
    if (ctx->model->arch->levels_prefix ? codes->n_levels < 1 || codes->n_levels > info->n_levels
                                        : codes->n_levels != info->n_levels) {
        return cr_fail(err, CODECRT_E_SHAPE, "got %d code levels, model '%s' has %s%d", codes->n_levels,
                       info->arch, ctx->model->arch->levels_prefix ? "1 to " : "", info->n_levels);
    }
    if (codes->n_batch < 1) {
        return cr_fail(err, CODECRT_E_SHAPE, "batch of %d sequences", codes->n_batch);
    }
    if (codes->n_batch > ctx->params.max_batch) {
        return cr_fail(err, CODECRT_E_TOO_LARGE, "batch of %d sequences exceeds the context's max_batch %d",
                       codes->n_batch, ctx->params.max_batch);
    }
    int64_t n_frames = -1;
    for (int l = 0; l < codes->n_levels; l++) {
        const int64_t len = codes->lengths[l];
        if (len <= 0) {
            return cr_fail(err, CODECRT_E_SHAPE, "level %d has %lld codes: zero frames", l, (long long)len);
        }
        if (!codes->levels[l]) {
            return cr_fail(err, CODECRT_E_INVALID_ARGUMENT, "level %d is NULL", l);
        }
        const int64_t f = len * info->level_stride[l];
        if (n_frames >= 0 && f != n_frames) {
            return cr_fail(err, CODECRT_E_SHAPE,
                           "levels of inconsistent length: level 0 has %lld codes (%lld frames), level %d "
                           "has %lld codes (%lld frames); level l needs frames / %s",
                           (long long)codes->lengths[0], (long long)n_frames, l, (long long)len, (long long)f,
                           "stride[l]");
        }
        n_frames = f;
    }
    if (n_frames % info->frame_multiple != 0) {
        return cr_fail(err, CODECRT_E_SHAPE, "%lld frames is not a multiple of %d", (long long)n_frames,
                       info->frame_multiple);
    }
    if (n_frames > ctx->params.max_frames) {
        return cr_fail(err, CODECRT_E_TOO_LARGE, "%lld frames exceeds the context's max_frames %d",
                       (long long)n_frames, ctx->params.max_frames);
    }
    for (int l = 0; l < codes->n_levels; l++) {
        const int64_t n = codes->lengths[l] * codes->n_batch;
        const int32_t *c = codes->levels[l];
        const int32_t limit = info->codebook_size[l];
        for (int64_t i = 0; i < n; i++) {
            if (c[i] < 0 || c[i] >= limit) {
                return cr_fail(err, CODECRT_E_CODE_RANGE,
                               "code %d at level %d, sequence %lld, index %lld is outside [0, %d)", c[i], l,
                               (long long)(i / codes->lengths[l]), (long long)(i % codes->lengths[l]), limit);
            }
        }
    }
    *n_frames_out = (int32_t)n_frames;
    return CODECRT_OK;
}

static cr_graph_key cr_decode_key(const codecrt_context *ctx, int32_t n_frames, int32_t n_batch, bool noise) {
    const bool masked = cr_bucketed(ctx);
    cr_graph_key key = {
        .kind = CODECRT_GRAPH_DECODE,
        .n_frames = masked ? cr_bucket_frames(ctx, n_frames) : n_frames,
        .n_batch = masked ? cr_bucket_batch(ctx, n_batch) : n_batch,
        .flags = (noise ? CR_FLAG_NOISE : 0) | (masked ? CR_FLAG_MASKED : 0),
    };
    return key;
}

/*
 * Offline decodes in pieces. A decode runs as one graph when that graph's
 * largest tensor stays under CR_PIECE_ELEMENTS (and the backend's own limit);
 * otherwise, for an architecture with a finite receptive field, in pieces of
 * P frames, each decoded with C frames of context on both sides (fewer at the
 * utterance's ends, where the graph's own zero padding is the utterance's),
 * of which only the middle P frames are kept: every kept sample sees exactly
 * the inputs it sees in the whole decode, so pieces join with nothing missing
 * or repeated. Position-keyed inputs (noise) take absolute positions. Batches
 * too wide for even a short piece run in sub-batches. The cost is the 2C
 * frames of context per piece (P is chosen at least 8C where memory allows).
 */
typedef struct cr_plan {
    int32_t piece;   /* frames kept per piece (== n_frames: one graph) */
    int32_t context; /* frames of context each side */
    int32_t batch;   /* sequences per graph */
} cr_plan;

static int64_t cr_graph_elements(const codecrt_context *ctx, int32_t n_frames, int32_t n_batch) {
    const cr_graph_key key = cr_decode_key(ctx, n_frames, n_batch, true);
    return ctx->model->arch->max_tensor_elements(ctx->model, key.n_frames, key.n_batch, 0);
}

static codecrt_status cr_plan_decode(codecrt_context *ctx, int32_t n_frames, int32_t n_batch, cr_plan *plan,
                                     cr_err *err) {
    const cr_model *m = ctx->model;
    const int64_t budget = ctx->graphs.limits.piece_elements;
    plan->piece = n_frames;
    plan->context = 0;
    plan->batch = n_batch;
    if (cr_graph_elements(ctx, n_frames, n_batch) <= budget) {
        return CODECRT_OK;
    }
    const int32_t C = m->arch->decode_context_frames ? m->arch->decode_context_frames(m) : 0;
    const int32_t mult = m->info.frame_multiple;
    if (C <= 0) {
        /* No pieces along time (attention over the whole sequence, or a receptive field longer than
           any piece): sub-batches while a batch is above the budget; one sequence above it is
           refused, since the budget is what bounds a decode's memory (a released Qwen3 decoder
           passes it at 104 frames, 8.3 s: longer ones are streamed, exactly, or decoded under a
           larger CODECRT_PIECE_ELEMENTS that the caller chooses knowingly). */
        int32_t b = n_batch;
        while (b > 1 && cr_graph_elements(ctx, n_frames, b) > budget) {
            b = (b + 1) / 2;
        }
        const int64_t need = cr_graph_elements(ctx, n_frames, b);
        if (need > budget) {
            return cr_fail(err, CODECRT_E_TOO_LARGE,
                           "%d frames x %d sequences needs a tensor of %lld elements (limit %lld) and '%s' cannot "
                           "be decoded in pieces: decode shorter sequences, or stream them", n_frames, b,
                           (long long)need, (long long)budget, m->arch->name);
        }
        plan->batch = b;
        return CODECRT_OK;
    }
    /* the shortest piece worth its context, then the widest batch that fits it */
    int32_t want = 8 * C > mult ? 8 * C : mult;
    want = want < n_frames ? want : n_frames;
    int32_t b = n_batch;
    while (b > 1 && cr_graph_elements(ctx, want + 2 * C, b) > budget) {
        b = (b + 1) / 2;
    }
    /* the longest piece (a multiple of mult) that fits b sequences */
    int32_t lo = 0, hi = n_frames / mult; /* in units of mult */
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        if (cr_graph_elements(ctx, mid * mult + 2 * C, b) <= budget) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if (lo == 0) {
        return cr_fail(err, CODECRT_E_TOO_LARGE,
                       "even one sequence of %d frames (a piece of %d frames with %d of context on each side) needs "
                       "a tensor of %lld elements, above the limit of %lld", mult + 2 * C, mult, C,
                       (long long)cr_graph_elements(ctx, mult + 2 * C, 1), (long long)budget);
    }
    plan->piece = lo * mult;
    plan->context = C;
    plan->batch = b;
    return CODECRT_OK;
}

codecrt_status codecrt_context_reserve(codecrt_context *ctx, int32_t n_frames, int32_t n_batch) {
    if (!ctx) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    codecrt_status settled = cr_settle(ctx);
    if (settled != CODECRT_OK) {
        return settled;
    }
    if (n_frames < 1 || n_batch < 1 || n_frames > ctx->params.max_frames || n_batch > ctx->params.max_batch) {
        return cr_fail(&ctx->err, CODECRT_E_TOO_LARGE, "reserve(%d frames, %d sequences) is outside the "
                       "context's limits (%d, %d)", n_frames, n_batch, ctx->params.max_frames,
                       ctx->params.max_batch);
    }
    if (!ctx->model->arch->build_decode) {
        return cr_fail(&ctx->err, CODECRT_E_UNSUPPORTED, "reserve is not supported for model '%s'",
                       ctx->model->arch->name);
    }
    const int32_t mult = ctx->model->info.frame_multiple;
    n_frames = (n_frames + mult - 1) / mult * mult;
    /* the largest graph a decode within (n_frames, n_batch) builds */
    cr_plan plan;
    codecrt_status st = cr_plan_decode(ctx, n_frames, n_batch, &plan, &ctx->err);
    if (st != CODECRT_OK) {
        return st;
    }
    const int32_t graph_frames = plan.piece + 2 * plan.context < n_frames ? plan.piece + 2 * plan.context : n_frames;
    cr_graph_key env = cr_decode_key(ctx, graph_frames, plan.batch, true);
    cr_decode_build b = {ctx};
    return ctx_status(ctx, cr_graphs_reserve(&ctx->graphs, &env, cr_build_decode, &b, &ctx->err));
}

/*
 * One graph: sequences [b0, b0 + nb) of codes, frames [g0, g1) of each, decoded
 * as a graph of (g1 - g0) frames; the samples of frames [k0, k1) (absolute,
 * within [g0, g1)) go to pcm + b * seq_samples + k0 * hop for each sequence b.
 */
static codecrt_status cr_decode_graph(codecrt_context *ctx, const codecrt_decode_params *p,
                                      const codecrt_codes *codes, int32_t b0, int32_t nb, int32_t g0, int32_t g1,
                                      int32_t k0, int32_t k1, float *pcm, size_t seq_samples) {
    const cr_model *m = ctx->model;
    const codecrt_model_info *info = &m->info;
    const int32_t n = g1 - g0;
    const bool whole = g0 == 0 && b0 == 0 && nb == codes->n_batch && codes->lengths[0] * info->level_stride[0] == n;
    /* the piece's codes: a copy unless the graph decodes all of them */
    const int32_t *levels[CODECRT_MAX_LEVELS];
    int64_t lengths[CODECRT_MAX_LEVELS];
    codecrt_codes piece = {.n_batch = nb, .n_levels = codes->n_levels, .levels = levels, .lengths = lengths};
    codecrt_status st;
    if (whole) {
        piece = *codes;
    } else {
        size_t total = 0;
        for (int l = 0; l < codes->n_levels; l++) {
            total += (size_t)(n / info->level_stride[l]) * (size_t)nb;
        }
        if ((st = cr_grow((void **)&ctx->piece_codes, &ctx->piece_codes_cap, total, sizeof(int32_t), &ctx->err)) !=
            CODECRT_OK) {
            return st;
        }
        int32_t *dst = ctx->piece_codes;
        for (int l = 0; l < codes->n_levels; l++) {
            const int32_t s = info->level_stride[l], len = n / s;
            for (int32_t b = 0; b < nb; b++) {
                memcpy(dst + (size_t)b * (size_t)len,
                       codes->levels[l] + (size_t)(b0 + b) * (size_t)codes->lengths[l] + (size_t)(g0 / s),
                       (size_t)len * sizeof(int32_t));
            }
            levels[l] = dst;
            lengths[l] = len;
            dst += (size_t)len * (size_t)nb;
        }
    }
    const cr_graph_key key = cr_decode_key(ctx, n, nb, p->noise != 0);
    const cr_decode_shape shape = {
        .n_frames = key.n_frames,
        .n_batch = key.n_batch,
        .noise = p->noise != 0,
        .masked = (key.flags & CR_FLAG_MASKED) != 0,
        .cpu_ops = ctx->cpu_ops,
        .ops = ctx->cpu_ops ? &ctx->fused : NULL,
        .time_fastest = ctx->offline_tf,
        .fused_unit = ctx->fused_unit,
        .frames_masked = (key.flags & CR_FLAG_MASKED) != 0 && ctx->params.frame_bucket > 0,
    };
    if ((st = cr_grow((void **)&ctx->scratch, &ctx->scratch_cap, m->arch->scratch_floats(m, &shape),
                      sizeof(float), &ctx->err)) != CODECRT_OK ||
        (st = cr_grow((void **)&ctx->seed_scratch, &ctx->seed_cap, (size_t)nb, sizeof(uint64_t), &ctx->err)) !=
            CODECRT_OK) {
        return st;
    }
    for (int32_t b = 0; b < nb; b++) {
        ctx->seed_scratch[b] = p->seeds ? p->seeds[b0 + b] : p->seed;
    }
    cr_decode_build build = {ctx};
    cr_graph_slot *slot = NULL;
    if ((st = cr_graphs_acquire(&ctx->graphs, &key, cr_build_decode, &build, &slot, &ctx->err)) != CODECRT_OK) {
        return st;
    }
    const cr_decode_inputs in = {
        .codes = &piece,
        .n_frames = n,
        .frame_offset = g0,
        .seeds = ctx->seed_scratch,
        .scratch = ctx->scratch,
    };
    m->arch->set_decode_inputs(m, &shape, &slot->io, &in);
    if ((st = cr_graphs_compute(&ctx->graphs, slot, &ctx->err)) != CODECRT_OK) {
        return st;
    }
    /* output [1, T_graph * hop, B_graph]: each sequence's kept frames */
    struct ggml_tensor *out = slot->io.t[0];
    const size_t hop = (size_t)info->hop_length, graph_seq = (size_t)key.n_frames * hop;
    for (int32_t b = 0; b < nb; b++) {
        ggml_backend_tensor_get(out, pcm + (size_t)(b0 + b) * seq_samples + (size_t)k0 * hop,
                                ((size_t)b * graph_seq + (size_t)(k0 - g0) * hop) * sizeof(float),
                                (size_t)(k1 - k0) * hop * sizeof(float));
    }
    return CODECRT_OK;
}

codecrt_status codecrt_decode(codecrt_context *ctx, const codecrt_decode_params *params,
                              const codecrt_codes *codes, float *pcm, size_t pcm_capacity, size_t *n_written) {
    if (!ctx) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    codecrt_status settled = cr_settle(ctx);
    if (settled != CODECRT_OK) {
        return settled;
    }
    if (n_written) {
        *n_written = 0;
    }
    const codecrt_decode_params defaults = codecrt_decode_default_params();
    const codecrt_decode_params *p = params ? params : &defaults;
    int32_t n_frames = 0;
    codecrt_status st = cr_validate_codes(ctx, codes, &n_frames, &ctx->err);
    if (st != CODECRT_OK) {
        return st;
    }
    const cr_model *m = ctx->model;
    const size_t per_seq = (size_t)n_frames * (size_t)m->info.hop_length;
    const size_t need = per_seq * (size_t)codes->n_batch;
    cr_plan plan = {.piece = n_frames, .context = 0, .batch = codes->n_batch};
    if (!m->arch->decode && (st = cr_plan_decode(ctx, n_frames, codes->n_batch, &plan, &ctx->err)) != CODECRT_OK) {
        return st;
    }
    if (!pcm) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "pcm must not be NULL");
    }
    if (pcm_capacity < need) {
        return cr_fail(&ctx->err, CODECRT_E_BUFFER_TOO_SMALL, "output buffer holds %zu samples, decode needs %zu",
                       pcm_capacity, need);
    }
    if (m->arch->decode) {
        st = m->arch->decode(ctx, p, codes, n_frames, pcm);
    } else {
        for (int32_t b0 = 0; b0 < codes->n_batch && st == CODECRT_OK; b0 += plan.batch) {
            const int32_t nb = codes->n_batch - b0 < plan.batch ? codes->n_batch - b0 : plan.batch;
            for (int32_t k0 = 0; k0 < n_frames && st == CODECRT_OK; k0 += plan.piece) {
                const int32_t k1 = k0 + plan.piece < n_frames ? k0 + plan.piece : n_frames;
                const int32_t g0 = k0 - plan.context > 0 ? k0 - plan.context : 0;
                const int32_t g1 = k1 + plan.context < n_frames ? k1 + plan.context : n_frames;
                st = cr_decode_graph(ctx, p, codes, b0, nb, g0, g1, k0, k1, pcm, per_seq);
            }
        }
    }
    if (st != CODECRT_OK) {
        return st;
    }
    if (n_written) {
        *n_written = need;
    }
    return ctx_status(ctx, CODECRT_OK);
}

/* ------------------------------------------------------------------- stats */

codecrt_status codecrt_context_get_stats(const codecrt_context *ctx, codecrt_stats *stats) {
    if (!ctx || !stats) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    memset(stats, 0, sizeof(*stats));
    const cr_graphs *g = &ctx->graphs;
    stats->graphs_built = g->built;
    stats->graphs_reused = g->reused;
    stats->sched_resets = g->resets;
    stats->sched_recreations = g->recreations;
    stats->reservations = g->reservations;
    stats->computes = g->computes;
    stats->n_backends = g->n_backends;
    for (int i = 0; i < g->n_backends && i < CODECRT_MAX_BACKENDS; i++) {
        snprintf(stats->backend_names[i], sizeof(stats->backend_names[i]), "%s", ggml_backend_name(g->backends[i]));
        stats->compute_buffer_bytes[i] = cr_graphs_buffer_size(g, i);
    }
    stats->weight_bytes = (ctx->dev_weights_buf ? ggml_backend_buffer_get_size(ctx->dev_weights_buf) : 0) +
                          cr_packs_bytes(ctx->fused.packs);
    stats->last_compute_ms = g->last_compute_ms;
    stats->last_acquire_ms = g->acquire_ms;
    stats->last_inputs_ms = g->inputs_ms;
    stats->last_enqueue_ms = g->enqueue_ms;
    stats->last_threads = g->last_threads;
    stats->state_bytes = ctx->pool.buffer ? ggml_backend_buffer_get_size(ctx->pool.buffer) : 0;
    stats->streams_active = ctx->pool.n_active;
    for (int k = 0; k < CODECRT_GRAPH_KIND_COUNT; k++) {
        const cr_graph_slot *slot = &g->slots[k];
        if (slot->live && slot->sched) {
            const int n = ggml_backend_sched_get_n_splits(slot->sched);
            stats->graph_splits = n > stats->graph_splits ? n : stats->graph_splits;
        }
    }
    return CODECRT_OK;
}
