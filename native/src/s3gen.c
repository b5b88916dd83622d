/*
 * s3gen.c: Chatterbox S3Gen, the architecture driver.
 *
 * S3 speech tokens (25 Hz) become 24 kHz PCM in two stages:
 *   flow     tokens (prompt + speech) -> encoder -> mu [2T, 80]; then Euler
 *            steps of dx/dt = estimator(x, mu, spks, cond, t) from x = noise,
 *            with classifier-free guidance (conditional and unconditional in
 *            one batch of 2) for the original model, none for Turbo
 *            (meanflow); the prompt's frames are dropped from the result.
 *   vocoder  mel -> F0 (graph) -> harmonic source (host, bit-for-bit the
 *            reference's arithmetic) -> HiFT decode (graph) -> PCM.
 * Each stage is its own graph kind in the lifecycle manager. The estimator's
 * graph is allocated once per shape and computed n_steps times with new
 * inputs (a graph is single-use for allocation, multi-use for computation).
 *
 * Noise is keyed by (seed, site, absolute position) (noise.c), so a chunked
 * decode sees the same noise as an offline one:
 *   site S3_SITE_FLOW + bin   the flow's starting sample, position = mel frame
 *                             counted from the start of the prompt
 *   site S3_SITE_PHASE        uniform draws for the 8 harmonics' initial phases
 *   site S3_SITE_SINE + h     the sine source's Gaussian noise of harmonic h,
 *                             position = output sample
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "s3gen.h"

#define S3_SITE_FLOW 1000u
#define S3_SITE_PHASE 2000u
#define S3_SITE_SINE 2100u

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

/* --------------------------------------------------------- hyperparameters */

static codecrt_status s3_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    s3gen_hparams *hp = hp_;
    codecrt_status st;
    int32_t vocab = 0, mels = 0, rate = 0, spk = 0;
    if ((st = cr_gguf_bool(g, "s3gen.meanflow", &hp->meanflow, err)) ||
        (st = cr_gguf_u32(g, "s3gen.n_steps", &hp->n_steps, err)) ||
        (st = cr_gguf_f32(g, "s3gen.cfg_rate", &hp->cfg_rate, err)) ||
        (st = cr_gguf_u32(g, "s3gen.vocab_size", &vocab, err)) ||
        (st = cr_gguf_u32(g, "s3gen.n_mels", &mels, err)) ||
        (st = cr_gguf_u32(g, "s3gen.sampling_rate", &rate, err)) ||
        (st = cr_gguf_u32(g, "s3gen.speaker_dim", &spk, err))) {
        return st;
    }
    /* the graphs are written for the released architecture; say which value differs */
    if (vocab != S3_VOCAB || mels != S3_MEL || rate != S3_SAMPLE_RATE || spk != S3_SPK) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS,
                       "s3gen: vocab %d, mels %d, rate %d, speaker %d; this runtime supports %d, %d, %d, %d",
                       vocab, mels, rate, spk, S3_VOCAB, S3_MEL, S3_SAMPLE_RATE, S3_SPK);
    }
    if (hp->n_steps < 1 || hp->n_steps > 100 || hp->cfg_rate < 0.0f || hp->cfg_rate > 10.0f) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "s3gen: n_steps = %d, cfg_rate = %g out of range",
                       hp->n_steps, (double)hp->cfg_rate);
    }
    return CODECRT_OK;
}

static void s3_fill_info(const void *hp_, codecrt_model_info *info) {
    const s3gen_hparams *hp = hp_;
    info->sample_rate = S3_SAMPLE_RATE;
    info->hop_length = S3_MEL_HOP * S3_TOKEN_MEL; /* one frame = one token */
    info->n_levels = 1;
    info->codebook_size[0] = S3_VOCAB;
    info->level_stride[0] = 1;
    info->frame_multiple = 1;
    info->n_mels = S3_MEL;
    info->mel_hop = S3_MEL_HOP;
    info->needs_voice = 1;
    info->default_steps = hp->n_steps;
}

static void s3_tensor_specs(const void *hp_, cr_spec_list *s) {
    const s3gen_hparams *hp = hp_;
    /* used on the host (voices), so never F16 */
    cr_spec_add(s, false, 2, S3_SPK, S3_MEL, "flow.spk_embed_affine_layer.weight");
    cr_spec_add(s, false, 1, S3_MEL, 1, "flow.spk_embed_affine_layer.bias");
    s3_encoder_specs(hp, s);
    s3_estimator_specs(hp, s);
    s3_hift_specs(hp, s);
}

/* --------------------------------------------------------------- voices */

codecrt_status codecrt_voice_init(const codecrt_model *model_, const codecrt_voice_data *d, codecrt_voice **out,
                                  char *err_buf, size_t err_size) {
    cr_err err = {{0}};
    codecrt_status st = CODECRT_OK;
    codecrt_voice *v = NULL;
    if (out) {
        *out = NULL;
    }
    const cr_model *m = model_ ? &model_->m : NULL;
    if (!m || !d || !out) {
        st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "model, data and out must not be NULL");
        goto done;
    }
    if (!m->info.needs_voice) {
        st = cr_fail(&err, CODECRT_E_UNSUPPORTED, "model '%s' takes no voice", m->arch->name);
        goto done;
    }
    if (d->n_mels != S3_MEL || d->speaker_dim != S3_SPK) {
        st = cr_fail(&err, CODECRT_E_SHAPE, "voice has %d mel bins and a %d-d speaker embedding; the model "
                     "needs %d and %d", d->n_mels, d->speaker_dim, S3_MEL, S3_SPK);
        goto done;
    }
    if (d->n_prompt_tokens < 0 || d->n_prompt_tokens > 4096 || d->n_prompt_frames != S3_TOKEN_MEL * d->n_prompt_tokens) {
        st = cr_fail(&err, CODECRT_E_SHAPE, "voice prompt has %d tokens and %d mel frames; it needs %d mel "
                     "frames per token (and at most 4096 tokens)", d->n_prompt_tokens, d->n_prompt_frames,
                     S3_TOKEN_MEL);
        goto done;
    }
    if ((d->n_prompt_tokens > 0 && (!d->prompt_tokens || !d->prompt_mel)) || !d->speaker) {
        st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "voice arrays must not be NULL");
        goto done;
    }
    for (int32_t i = 0; i < d->n_prompt_tokens; i++) {
        if (d->prompt_tokens[i] < 0 || d->prompt_tokens[i] >= S3_VOCAB) {
            st = cr_fail(&err, CODECRT_E_CODE_RANGE, "voice prompt token %d at index %d is outside [0, %d)",
                         d->prompt_tokens[i], i, S3_VOCAB);
            goto done;
        }
    }
    const size_t n_mel = (size_t)d->n_prompt_frames * S3_MEL;
    for (size_t i = 0; i < n_mel; i++) {
        if (!isfinite(d->prompt_mel[i])) {
            st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "voice prompt mel has a non-finite value at %zu", i);
            goto done;
        }
    }
    double norm = 0.0;
    for (int i = 0; i < S3_SPK; i++) {
        if (!isfinite(d->speaker[i])) {
            st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "voice speaker embedding has a non-finite value");
            goto done;
        }
        norm += (double)d->speaker[i] * d->speaker[i];
    }
    v = calloc(1, sizeof(*v));
    if (!v || !(v->tokens = malloc(sizeof(int32_t) * (size_t)(d->n_prompt_tokens + 1))) ||
        !(v->mel = malloc(sizeof(float) * (n_mel + 1)))) {
        st = cr_fail(&err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
        goto done;
    }
    v->model = m;
    v->n_tokens = d->n_prompt_tokens;
    v->n_frames = d->n_prompt_frames;
    if (d->n_prompt_tokens > 0) {
        memcpy(v->tokens, d->prompt_tokens, sizeof(int32_t) * (size_t)d->n_prompt_tokens);
    }
    /* [T][80] (as Chatterbox stores prompt_feat) -> [80][T] */
    for (int32_t t = 0; t < d->n_prompt_frames; t++) {
        for (int c = 0; c < S3_MEL; c++) {
            v->mel[(size_t)c * (size_t)d->n_prompt_frames + (size_t)t] = d->prompt_mel[(size_t)t * S3_MEL + (size_t)c];
        }
    }
    /* spks = W normalize(x) + b, normalize as F.normalize (eps 1e-12) */
    const float inv = (float)(1.0 / fmax(sqrt(norm), 1e-12));
    const struct ggml_tensor *w = ggml_get_tensor(m->weights, "flow.spk_embed_affine_layer.weight");
    const struct ggml_tensor *b = ggml_get_tensor(m->weights, "flow.spk_embed_affine_layer.bias");
    const float *wd = w->data, *bd = b->data;
    for (int o = 0; o < S3_MEL; o++) {
        float acc = 0.0f;
        for (int i = 0; i < S3_SPK; i++) {
            acc += wd[(size_t)o * S3_SPK + (size_t)i] * (d->speaker[i] * inv);
        }
        v->spks[o] = acc + bd[o];
    }
    *out = v;
    v = NULL;
done:
    codecrt_voice_free(v);
    cr_err_copy(&err, err_buf, err_size);
    return st;
}

void codecrt_voice_free(codecrt_voice *v) {
    if (!v) {
        return;
    }
    free(v->tokens);
    free(v->mel);
    free(v);
}

/* ------------------------------------------------------------ graph kinds */

/* Builders get the context through the lifecycle manager's user pointer. */
typedef struct s3_build {
    codecrt_context *ctx;
} s3_build;

static const s3gen_hparams *s3_hp(const codecrt_context *ctx) { return ctx->model->hparams; }

static const cr_cpu_ops *s3_cpu_ops(const codecrt_context *ctx) { return ctx->cpu_ops ? &ctx->fused : NULL; }

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
        s3_encoder_build(ctx0, ctx->weights, s3_hp(ctx), key->n_frames, key->n_batch, s3_cpu_ops(ctx), &e);
    S3_IO_STORE(io, e);
    return s3_finish(ctx0, mu, io);
}

static struct ggml_cgraph *s3_build_step(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                         cr_graph_io *io) {
    codecrt_context *ctx = ((s3_build *)user)->ctx;
    s3_estimator_io e;
    memset(&e, 0, sizeof(e));
    struct ggml_tensor *v =
        s3_estimator_build(ctx0, ctx->weights, s3_hp(ctx), key->n_frames, key->n_batch, s3_cpu_ops(ctx), &e);
    S3_IO_STORE(io, e);
    return s3_finish(ctx0, v, io);
}

static struct ggml_cgraph *s3_build_f0(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                       cr_graph_io *io) {
    codecrt_context *ctx = ((s3_build *)user)->ctx;
    s3_f0_io e;
    memset(&e, 0, sizeof(e));
    struct ggml_tensor *f0 = s3_f0_build(ctx0, ctx->weights, s3_hp(ctx), key->n_frames, key->n_batch, &e);
    S3_IO_STORE(io, e);
    return s3_finish(ctx0, f0, io);
}

static struct ggml_cgraph *s3_build_vocode(void *user, struct ggml_context *ctx0, const cr_graph_key *key,
                                           cr_graph_io *io) {
    codecrt_context *ctx = ((s3_build *)user)->ctx;
    s3_hift_io e;
    memset(&e, 0, sizeof(e));
    struct ggml_tensor *pcm =
        s3_hift_build(ctx0, ctx->weights, s3_hp(ctx), key->n_frames, key->n_batch, s3_cpu_ops(ctx), &e);
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
 * envelope passes the batch budget, the kind's scheduler is dropped and
 * reserved for the request alone.
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
        if (env > need && env > S3_BATCH_ELEMENTS) {
            cr_graphs_drop_reservation(&ctx->graphs, kind);
        }
    }
    const cr_graph_key key = {.kind = kind, .n_frames = (int32_t)T, .n_batch = (int32_t)B, .flags = 0};
    s3_build b = {ctx};
    return cr_graphs_acquire(&ctx->graphs, &key, fn, &b, slot, &ctx->err);
}

/* ------------------------------------------------------------ the stages */

/* tokens [B][n] -> mu [B][80][2n] */
static codecrt_status s3_encode(codecrt_context *ctx, const int32_t *tokens, int64_t n, int64_t B, float *mu) {
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
static codecrt_status s3_step_graph(codecrt_context *ctx, int64_t T, int64_t B, cr_graph_slot **slot,
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
static codecrt_status s3_step_eval(codecrt_context *ctx, cr_graph_slot *slot, const s3_estimator_io *e, int64_t T,
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

/* torch.linspace(0, 1, n + 1) in float32 (its two-sided formula), then the
   cosine schedule 1 - cos(t * pi / 2) unless meanflow. */
static void s3_t_span(int32_t n, bool cosine, float *t) {
    const float step = 1.0f / (float)n;
    const int32_t half = (n + 1) / 2;
    for (int32_t i = 0; i <= n; i++) {
        t[i] = i < half ? (float)i * step : 1.0f - step * (float)(n - i);
        if (cosine) {
            t[i] = 1.0f - cosf(t[i] * 0.5f * (float)S3_PI);
        }
    }
}

typedef struct s3_flow_req {
    const codecrt_voice *voice;
    const int32_t *tokens;
    int32_t n_tokens;
    uint64_t seed;
    int32_t n_steps;
    float cfg_rate;
    bool finalize;
} s3_flow_req;

/* Output frames of a flow request (after the prompt), or -1 if too short. */
static int64_t s3_flow_frames(const s3_flow_req *q) {
    const int64_t n = q->finalize ? q->n_tokens : q->n_tokens - S3_LOOKAHEAD;
    return n > 0 ? S3_TOKEN_MEL * n : -1;
}

/*
 * K sequences through the flow together: mel [K][80][s3_flow_frames] of the
 * speech after each prompt. The requests agree in shape (codecrt_flow_decode_batch checks):
 * the encoder runs per sequence (its cost is one evaluation), the estimator
 * once per step over all of them, in one batch of K (Turbo) or 2K (with
 * guidance: entries 0..K-1 conditional, K..2K-1 unconditional). Each
 * sequence's numbers are those of a flow of its own.
 */
static codecrt_status s3_flow(codecrt_context *ctx, const s3_flow_req *q, int32_t K, float *mel) {
    const s3gen_hparams *hp = s3_hp(ctx);
    const int64_t n_all = (int64_t)q[0].voice->n_tokens + q[0].n_tokens;
    const int64_t T_enc = S3_TOKEN_MEL * n_all;
    /* finalize = false: the last 3 tokens only look ahead (h[:, :-6]) */
    const int64_t T = q[0].finalize ? T_enc : T_enc - S3_TOKEN_MEL * S3_LOOKAHEAD;
    const int64_t P = q[0].voice->n_frames, F = T - P;
    const int64_t B = hp->meanflow ? K : 2 * (int64_t)K;
    const size_t plane = (size_t)T * S3_MEL;
    codecrt_status st = CODECRT_OK;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_all);
    float *mu_enc = malloc(sizeof(float) * (size_t)T_enc * S3_MEL);
    float *mu = calloc(plane * (size_t)B, sizeof(float));
    float *cond = calloc(plane * (size_t)B, sizeof(float));
    float *x = malloc(sizeof(float) * plane * (size_t)B);
    float *dx = malloc(sizeof(float) * plane * (size_t)B);
    float *spks = calloc(S3_MEL * (size_t)B, sizeof(float));
    float *tb = malloc(sizeof(float) * 2 * (size_t)B);
    float ts[101];
    if (!tok || !mu_enc || !mu || !cond || !x || !dx || !spks || !tb) {
        st = cr_fail(&ctx->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
        goto done;
    }
    /* conditional entries: mu, the prompt's mel as cond, spks; the
       unconditional ones (guidance) keep zeros */
    for (int32_t k = 0; k < K; k++) {
        const codecrt_voice *v = q[k].voice;
        memcpy(tok, v->tokens, sizeof(int32_t) * (size_t)v->n_tokens);
        memcpy(tok + v->n_tokens, q[k].tokens, sizeof(int32_t) * (size_t)q[k].n_tokens);
        if ((st = s3_encode(ctx, tok, n_all, 1, mu_enc)) != CODECRT_OK) {
            goto done;
        }
        float *muk = mu + (size_t)k * plane, *condk = cond + (size_t)k * plane, *xk = x + (size_t)k * plane;
        for (int c = 0; c < S3_MEL; c++) {
            memcpy(muk + (size_t)c * (size_t)T, mu_enc + (size_t)c * (size_t)T_enc, sizeof(float) * (size_t)T);
            memcpy(condk + (size_t)c * (size_t)T, v->mel + (size_t)c * (size_t)P, sizeof(float) * (size_t)P);
            for (int64_t t = 0; t < T; t++) {
                xk[(size_t)c * (size_t)T + (size_t)t] =
                    cr_noise_normal(q[k].seed, S3_SITE_FLOW + (uint32_t)c, (uint64_t)t);
            }
        }
        memcpy(spks + (size_t)k * S3_MEL, v->spks, sizeof(v->spks));
    }
    cr_graph_slot *slot = NULL;
    s3_estimator_io e;
    if ((st = s3_step_graph(ctx, T, B, &slot, &e)) != CODECRT_OK) {
        goto done;
    }
    s3_t_span(q[0].n_steps, !hp->meanflow, ts);
    const size_t half = plane * (size_t)K;
    for (int32_t i = 0; i < q[0].n_steps; i++) {
        const float t = ts[i], r = ts[i + 1], dt = r - t;
        for (int64_t b = 0; b < B; b++) {
            tb[b] = t;
            tb[B + b] = r;
        }
        if (B == 2 * (int64_t)K) {
            memcpy(x + half, x, sizeof(float) * half);
        }
        if ((st = s3_step_eval(ctx, slot, &e, T, B, x, mu, cond, spks, tb, hp->meanflow ? tb + B : NULL, dx)) !=
            CODECRT_OK) {
            goto done;
        }
        /* as solve_euler: v = (1 + cfg) v_c - cfg v_u; x = x + dt v (float32) */
        const float g = q[0].cfg_rate;
        for (size_t j = 0; j < half; j++) {
            const float vel = B == 2 * (int64_t)K ? (1.0f + g) * dx[j] - g * dx[half + j] : dx[j];
            x[j] = x[j] + dt * vel;
        }
    }
    for (int32_t k = 0; k < K; k++) {
        for (int c = 0; c < S3_MEL; c++) {
            memcpy(mel + ((size_t)k * S3_MEL + (size_t)c) * (size_t)F,
                   x + (size_t)k * plane + (size_t)c * (size_t)T + (size_t)P, sizeof(float) * (size_t)F);
        }
    }
done:
    free(tok);
    free(mu_enc);
    free(mu);
    free(cond);
    free(x);
    free(dx);
    free(spks);
    free(tb);
    return st;
}

/* mel [K][80][F] -> f0 [K][F] */
static codecrt_status s3_f0(codecrt_context *ctx, const float *mel, int64_t F, int64_t K, float *f0) {
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
static codecrt_status s3_hift(codecrt_context *ctx, const float *mel, int64_t F, int64_t K, const float *source,
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

/* One vocoder request of a batch (the public item, validated). */
typedef codecrt_vocode_item s3_voc_req;

/* K vocoder calls of F mel frames in one F0 and one HiFT graph, each with its
   host source: pcm [K][F*480]; every item's source_out may be NULL. */
static codecrt_status s3_vocode(codecrt_context *ctx, const float *mel, int64_t F, int64_t K,
                                const s3_voc_req *items, float *pcm) {
    const int64_t N = F * S3_MEL_HOP;
    float *f0 = malloc(sizeof(float) * (size_t)(F * K));
    float *noise = malloc(sizeof(float) * (size_t)N * S3_HARMONICS);
    float *source = malloc(sizeof(float) * (size_t)(N * K));
    codecrt_status st = CODECRT_OK;
    if (!f0 || !noise || !source) {
        st = cr_fail(&ctx->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
        goto done;
    }
    if ((st = s3_f0(ctx, mel, F, K, f0)) != CODECRT_OK) {
        goto done;
    }
    for (int64_t k = 0; k < K; k++) {
        const s3_voc_req *it = &items[k];
        float *src = source + (size_t)(k * N);
        /* SineGen: the fundamental starts at phase 0, harmonics at U(-pi, pi) */
        float phases[S3_HARMONICS];
        phases[0] = 0.0f;
        for (uint32_t h = 1; h < S3_HARMONICS; h++) {
            phases[h] = (2.0f * cr_noise_uniform(it->seed, S3_SITE_PHASE, h) - 1.0f) * (float)S3_PI;
        }
        for (uint32_t h = 0; h < S3_HARMONICS; h++) {
            for (int64_t i = 0; i < N; i++) {
                noise[(size_t)h * (size_t)N + (size_t)i] =
                    cr_noise_normal(it->seed, S3_SITE_SINE + h, (uint64_t)(it->sample_offset + i));
            }
        }
        s3_source_host(ctx->model->weights, f0 + (size_t)(k * F), F, phases, noise, src);
        if (it->cache_source && it->n_cache > 0) {
            memcpy(src, it->cache_source, sizeof(float) * (size_t)it->n_cache);
        }
        if (it->source_out) {
            memcpy(it->source_out, src, sizeof(float) * (size_t)N);
        }
    }
    st = s3_hift(ctx, mel, F, K, source, pcm);
done:
    free(f0);
    free(noise);
    free(source);
    return st;
}

/* The reference's trim_fade: 20 ms of silence, then a 20 ms raised cosine. */
static void s3_fade_in(float *pcm, int64_t n) {
    const int n_trim = S3_SAMPLE_RATE / 50;
    for (int i = 0; i < 2 * n_trim && i < n; i++) {
        float f = 0.0f;
        if (i >= n_trim) {
            /* torch.linspace(pi, 0, n_trim) in float32 */
            const int j = i - n_trim;
            const float step = -(float)S3_PI / (float)(n_trim - 1);
            const float a = j < n_trim / 2 ? (float)S3_PI + step * (float)j : 0.0f - step * (float)(n_trim - 1 - j);
            f = (cosf(a) + 1.0f) / 2.0f;
        }
        pcm[i] *= f;
    }
}

/* ------------------------------------------------------------ validation */

static codecrt_status s3_check_ctx(codecrt_context *ctx) {
    if (!ctx) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    if (ctx->model->arch != &cr_arch_s3gen) {
        return cr_fail(&ctx->err, CODECRT_E_UNSUPPORTED, "model '%s' is not a two-stage (s3gen) model",
                       ctx->model->arch->name);
    }
    return CODECRT_OK;
}

static codecrt_status s3_check_voice(codecrt_context *ctx, const codecrt_voice *v) {
    if (!v) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "this model needs a voice");
    }
    if (v->model != ctx->model) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "the voice was made for another model");
    }
    return CODECRT_OK;
}

static codecrt_status s3_resolve(codecrt_context *ctx, int32_t n_steps, float cfg_rate, int32_t *steps_out,
                                 float *cfg_out) {
    const s3gen_hparams *hp = s3_hp(ctx);
    if (n_steps < 0 || n_steps > 100 || !isfinite(cfg_rate) || cfg_rate > 10.0f) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "n_steps = %d (0..100), cfg_rate = %g (<= 10)",
                       n_steps, (double)cfg_rate);
    }
    *steps_out = n_steps > 0 ? n_steps : hp->n_steps;
    *cfg_out = cfg_rate >= 0.0f ? cfg_rate : hp->cfg_rate;
    return CODECRT_OK;
}

static codecrt_status s3_check_tokens(codecrt_context *ctx, const int32_t *tokens, int64_t n) {
    if (!tokens && n > 0) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "tokens must not be NULL");
    }
    if (n > ctx->params.max_frames) {
        return cr_fail(&ctx->err, CODECRT_E_TOO_LARGE, "%lld tokens exceed the context's max_frames = %d",
                       (long long)n, ctx->params.max_frames);
    }
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= S3_VOCAB) {
            return cr_fail(&ctx->err, CODECRT_E_CODE_RANGE, "token %d at index %lld is outside [0, %d)",
                           tokens[i], (long long)i, S3_VOCAB);
        }
    }
    return CODECRT_OK;
}

static codecrt_status s3_status(codecrt_context *ctx, codecrt_status st) {
    if (st == CODECRT_OK) {
        ctx->err.msg[0] = '\0';
    }
    return st;
}

/* ------------------------------------------------------------ public entry */

static codecrt_status s3_decode(codecrt_context *ctx, const codecrt_decode_params *p, const codecrt_codes *codes,
                                int32_t n_frames, float *pcm) {
    codecrt_status st;
    int32_t steps = 0;
    float cfg = 0.0f;
    if ((st = s3_check_voice(ctx, p->voice)) || (st = s3_resolve(ctx, p->n_steps, p->cfg_rate, &steps, &cfg))) {
        return st;
    }
    const int64_t F = (int64_t)S3_TOKEN_MEL * n_frames;
    const int64_t N = F * S3_MEL_HOP;
    float *mel = malloc(sizeof(float) * (size_t)F * S3_MEL);
    if (!mel) {
        return cr_fail(&ctx->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    /* one sequence at a time: each has its own noise, and its own prompt
       length when voices differ (padding masks would be needed to batch) */
    for (int32_t b = 0; b < codes->n_batch && st == CODECRT_OK; b++) {
        const uint64_t seed = p->seeds ? p->seeds[b] : p->seed;
        const s3_flow_req q = {
            .voice = p->voice,
            .tokens = codes->levels[0] + (size_t)b * (size_t)n_frames,
            .n_tokens = n_frames,
            .seed = seed,
            .n_steps = steps,
            .cfg_rate = cfg,
            .finalize = true,
        };
        float *out = pcm + (size_t)b * (size_t)N;
        if ((st = s3_flow(ctx, &q, 1, mel)) == CODECRT_OK &&
            (st = s3_vocode(ctx, mel, F, 1, &(s3_voc_req){.seed = seed}, out)) == CODECRT_OK) {
            s3_fade_in(out, N);
        }
    }
    free(mel);
    return st;
}

codecrt_flow_params codecrt_flow_default_params(void) {
    codecrt_flow_params p = {.voice = NULL, .seed = 0, .n_steps = 0, .cfg_rate = -1.0f, .finalize = 1};
    return p;
}

static codecrt_status s3_check_batch(codecrt_context *ctx, int32_t n) {
    if (n > ctx->params.max_batch) {
        return cr_fail(&ctx->err, CODECRT_E_TOO_LARGE, "batch of %d sequences exceeds the context's max_batch %d",
                       n, ctx->params.max_batch);
    }
    return CODECRT_OK;
}

/* Sequences per sub-batch for a per-sequence largest tensor of `one` elements. */
static int32_t s3_batch_fit(int64_t one) {
    const int64_t k = one > 0 ? S3_BATCH_ELEMENTS / one : CODECRT_MAX_FLOW_BATCH;
    return k < 1 ? 1 : (k > CODECRT_MAX_FLOW_BATCH ? CODECRT_MAX_FLOW_BATCH : (int32_t)k);
}

codecrt_status codecrt_flow_decode_batch(codecrt_context *ctx, const codecrt_flow_params *params, int32_t n,
                                         const int32_t *tokens, int32_t n_tokens, float *mel, size_t mel_capacity,
                                         int32_t *n_frames) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK) {
        return st;
    }
    if (n_frames) {
        *n_frames = 0;
    }
    if (!params || !mel || n < 1 || n > CODECRT_MAX_FLOW_BATCH) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "params and mel must not be NULL and n = %d "
                       "must be in 1..%d", n, CODECRT_MAX_FLOW_BATCH);
    }
    if ((st = s3_check_batch(ctx, n)) != CODECRT_OK) {
        return st;
    }
    if (n_tokens < 1) {
        return cr_fail(&ctx->err, CODECRT_E_SHAPE, "%d tokens give no mel frame", n_tokens);
    }
    s3_flow_req q[CODECRT_MAX_FLOW_BATCH];
    for (int32_t k = 0; k < n; k++) {
        const codecrt_flow_params *p = &params[k];
        q[k] = (s3_flow_req){.voice = p->voice, .tokens = tokens ? tokens + (size_t)k * (size_t)n_tokens : NULL,
                             .n_tokens = n_tokens, .seed = p->seed, .finalize = p->finalize != 0};
        if ((st = s3_check_voice(ctx, p->voice)) ||
            (st = s3_resolve(ctx, p->n_steps, p->cfg_rate, &q[k].n_steps, &q[k].cfg_rate)) ||
            (st = s3_check_tokens(ctx, q[k].tokens, n_tokens))) {
            return st;
        }
        /* one batch needs one shape and one schedule */
        if (k > 0 && (p->voice->n_tokens != q[0].voice->n_tokens || q[k].finalize != q[0].finalize ||
                      q[k].n_steps != q[0].n_steps || q[k].cfg_rate != q[0].cfg_rate)) {
            return cr_fail(&ctx->err, CODECRT_E_SHAPE, "flow %d of the batch differs from flow 0 in prompt length, "
                           "finalize, n_steps or cfg_rate", k);
        }
    }
    const int64_t F = s3_flow_frames(&q[0]);
    if (F < 1) {
        return cr_fail(&ctx->err, CODECRT_E_SHAPE, "%d tokens give no mel frame%s", n_tokens,
                       q[0].finalize ? "" : " (without finalize the last 3 only look ahead)");
    }
    if (mel_capacity < (size_t)F * S3_MEL * (size_t)n) {
        return cr_fail(&ctx->err, CODECRT_E_BUFFER_TOO_SMALL, "mel buffer holds %zu floats, %lld needed",
                       mel_capacity, (long long)F * S3_MEL * n);
    }
    /* sub-batches under the budget (one flow always runs, as a single call would) */
    const int64_t T = F + q[0].voice->n_frames, per = s3_hp(ctx)->meanflow ? 1 : 2;
    const int32_t step = s3_batch_fit(s3_estimator_max_elements(T, per));
    for (int32_t k = 0; k < n && st == CODECRT_OK; k += step) {
        st = s3_flow(ctx, q + k, n - k < step ? n - k : step, mel + (size_t)k * (size_t)F * S3_MEL);
    }
    if (st == CODECRT_OK && n_frames) {
        *n_frames = (int32_t)F;
    }
    return s3_status(ctx, st);
}

codecrt_status codecrt_flow_decode(codecrt_context *ctx, const codecrt_flow_params *params, const int32_t *tokens,
                                   int32_t n_tokens, float *mel, size_t mel_capacity, int32_t *n_frames) {
    return codecrt_flow_decode_batch(ctx, params, 1, tokens, n_tokens, mel, mel_capacity, n_frames);
}

/* n_seq mels of F frames each: F within the context's limit, every value finite */
static codecrt_status s3_check_mel(codecrt_context *ctx, const float *mel, int64_t F, int64_t n_seq) {
    if (!mel) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "mel must not be NULL");
    }
    if (F < 1 || F > (int64_t)S3_TOKEN_MEL * ctx->params.max_frames) {
        return cr_fail(&ctx->err, CODECRT_E_SHAPE, "%lld mel frames: 1..%lld allowed", (long long)F,
                       (long long)S3_TOKEN_MEL * ctx->params.max_frames);
    }
    for (size_t i = 0; i < (size_t)(F * S3_MEL * n_seq); i++) {
        if (!isfinite(mel[i])) {
            return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "mel has a non-finite value at %zu", i);
        }
    }
    return CODECRT_OK;
}

codecrt_status codecrt_vocode_batch(codecrt_context *ctx, const float *mel, int32_t n_frames, int32_t n,
                                    const codecrt_vocode_item *items, float *pcm, size_t pcm_capacity) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK) {
        return st;
    }
    if (!items || n < 1 || n > CODECRT_MAX_FLOW_BATCH) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "items must not be NULL and n = %d must be in 1..%d",
                       n, CODECRT_MAX_FLOW_BATCH);
    }
    if ((st = s3_check_batch(ctx, n)) != CODECRT_OK) {
        return st;
    }
    if ((st = s3_check_mel(ctx, mel, n_frames, n)) != CODECRT_OK) {
        return st;
    }
    const int64_t N = (int64_t)n_frames * S3_MEL_HOP;
    if (!pcm || pcm_capacity < (size_t)(N * n)) {
        return cr_fail(&ctx->err, pcm ? CODECRT_E_BUFFER_TOO_SMALL : CODECRT_E_INVALID_ARGUMENT,
                       "pcm must hold %lld samples", (long long)(N * n));
    }
    for (int32_t k = 0; k < n; k++) {
        const codecrt_vocode_item *it = &items[k];
        if (it->sample_offset < 0 || it->n_cache < 0 || it->n_cache > N || (it->n_cache > 0 && !it->cache_source)) {
            return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "item %d: sample_offset = %lld, n_cache = %d "
                           "(0..%lld)", k, (long long)it->sample_offset, it->n_cache, (long long)N);
        }
    }
    const int32_t step = s3_batch_fit(s3_hift_max_elements(n_frames, 1));
    for (int32_t k = 0; k < n && st == CODECRT_OK; k += step) {
        st = s3_vocode(ctx, mel + (size_t)k * (size_t)n_frames * S3_MEL, n_frames, n - k < step ? n - k : step,
                       items + k, pcm + (size_t)k * (size_t)N);
    }
    return s3_status(ctx, st);
}

codecrt_status codecrt_vocode(codecrt_context *ctx, const float *mel, int32_t n_frames, uint64_t seed,
                              int64_t sample_offset, const float *cache_source, int32_t n_cache, float *pcm,
                              size_t pcm_capacity, float *source_out) {
    const codecrt_vocode_item item = {.seed = seed, .sample_offset = sample_offset, .cache_source = cache_source,
                                      .n_cache = n_cache, .source_out = source_out};
    return codecrt_vocode_batch(ctx, mel, n_frames, 1, &item, pcm, pcm_capacity);
}

/* ------------------------------------------------------------ diagnostics */

codecrt_status codecrt_diag_s3_encode(codecrt_context *ctx, const int32_t *tokens, int32_t n, float *mu) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK || (st = s3_check_tokens(ctx, tokens, n))) {
        return st;
    }
    if (n < 1 || !mu) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "need n >= 1 tokens and an output");
    }
    return s3_status(ctx, s3_encode(ctx, tokens, n, 1, mu));
}

codecrt_status codecrt_diag_s3_estimate(codecrt_context *ctx, int32_t T, int32_t B, const float *x, const float *mu,
                                        const float *cond, const float *spks, const float *t, const float *r,
                                        float *out) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK) {
        return st;
    }
    if (T < 1 || T > 2 * ctx->params.max_frames || B < 1 || B > 64 || !x || !mu || !cond || !spks || !t || !out ||
        (s3_hp(ctx)->meanflow && !r)) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "bad estimator diagnostic arguments");
    }
    cr_graph_slot *slot = NULL;
    s3_estimator_io e;
    if ((st = s3_step_graph(ctx, T, B, &slot, &e)) == CODECRT_OK) {
        st = s3_step_eval(ctx, slot, &e, T, B, x, mu, cond, spks, t, s3_hp(ctx)->meanflow ? r : NULL, out);
    }
    return s3_status(ctx, st);
}

codecrt_status codecrt_diag_s3_f0(codecrt_context *ctx, const float *mel, int32_t T, float *f0) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK || (st = s3_check_mel(ctx, mel, T, 1))) {
        return st;
    }
    if (!f0) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "f0 must not be NULL");
    }
    return s3_status(ctx, s3_f0(ctx, mel, T, 1, f0));
}

codecrt_status codecrt_diag_s3_source(codecrt_context *ctx, const float *f0, int32_t T, const float *phases,
                                      const float *noise, float *source) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK) {
        return st;
    }
    if (T < 1 || !f0 || !phases || !noise || !source) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "bad source diagnostic arguments");
    }
    s3_source_host(ctx->model->weights, f0, T, phases, noise, source);
    return s3_status(ctx, CODECRT_OK);
}

codecrt_status codecrt_diag_s3_hift(codecrt_context *ctx, const float *mel, int32_t T, const float *source,
                                    float *pcm) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK || (st = s3_check_mel(ctx, mel, T, 1))) {
        return st;
    }
    if (!source || !pcm) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "source and pcm must not be NULL");
    }
    return s3_status(ctx, s3_hift(ctx, mel, T, 1, source, pcm));
}

/* ------------------------------------------------------------------ table */

static int64_t s3_max_tensor_elements(const cr_model *model, int64_t n_frames, int64_t n_batch, int64_t context) {
    (void)model;
    (void)context;
    const int64_t F = S3_TOKEN_MEL * n_frames;
    int64_t m = s3_encoder_max_elements(n_frames, n_batch);
    const int64_t e = s3_estimator_max_elements(F, 2 * n_batch), h = s3_hift_max_elements(F, n_batch);
    m = e > m ? e : m;
    return h > m ? h : m;
}

const cr_arch cr_arch_s3gen = {
    .name = "s3gen",
    .bf16_products = true,
    .hparams_size = sizeof(s3gen_hparams),
    .read_hparams = s3_read_hparams,
    .fill_info = s3_fill_info,
    .tensor_specs = s3_tensor_specs,
    .max_tensor_elements = s3_max_tensor_elements,
    .decode = s3_decode,
};
