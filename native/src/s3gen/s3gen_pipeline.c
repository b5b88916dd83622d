/*
 * s3gen_pipeline.c: Chatterbox S3Gen's decode pipeline and its public two-stage
 * entries (codecrt_s3gen.h): flows, vocoder calls and their batches.
 *
 * S3 speech tokens (25 Hz) become 24 kHz PCM in two stages:
 *   flow     tokens (prompt + speech) -> encoder -> mu [2T, 80]; then Euler
 *            steps of dx/dt = estimator(x, mu, spks, cond, t) from x = noise,
 *            with classifier-free guidance (conditional and unconditional in
 *            one batch of 2) for the original model, none for Turbo
 *            (meanflow); the prompt's frames are dropped from the result.
 *   vocoder  mel -> F0 (graph) -> harmonic source (host, bit-for-bit the
 *            reference's arithmetic) -> HiFT decode (graph) -> PCM.
 * Each stage is its own graph kind in the lifecycle manager (s3gen_stages.c).
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

/* Sequences per sub-batch for a per-sequence largest tensor of `one` elements. */
static int32_t s3_batch_fit(int64_t one) {
    const int64_t k = one > 0 ? S3_BATCH_ELEMENTS / one : CODECRT_MAX_FLOW_BATCH;
    return k < 1 ? 1 : (k > CODECRT_MAX_FLOW_BATCH ? CODECRT_MAX_FLOW_BATCH : (int32_t)k);
}

/* The flow's starting noise x [K][80][T]: task k*80 + c fills row c of sequence k. */
typedef struct s3_noise_job {
    const s3_flow_req *q;
    int64_t T;
    size_t plane;
    float *x;
} s3_noise_job;

static void s3_flow_noise_task(void *arg, int64_t i) {
    const s3_noise_job *j = arg;
    const int64_t k = i / S3_MEL, c = i % S3_MEL;
    float *row = j->x + (size_t)k * j->plane + (size_t)c * (size_t)j->T;
    codecrt_noise(j->q[k].seed, S3_SITE_FLOW + (uint32_t)c, 0, (size_t)j->T, 0, row);
}

/*
 * K sequences through the flow together: mel [K][80][s3_flow_frames] of the
 * speech after each prompt. The requests agree in shape (codecrt_flow_decode_batch checks):
 * the encoder once over all of them (in batches under the budget), the estimator
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
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n_all * (size_t)K);
    float *mu_enc = malloc(sizeof(float) * (size_t)T_enc * S3_MEL * (size_t)K);
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
    /* the encoder over every sequence's prompt and tokens, in batches under the budget */
    for (int32_t k = 0; k < K; k++) {
        const codecrt_voice *v = q[k].voice;
        memcpy(tok + (size_t)k * (size_t)n_all, v->tokens, sizeof(int32_t) * (size_t)v->n_tokens);
        memcpy(tok + (size_t)k * (size_t)n_all + v->n_tokens, q[k].tokens, sizeof(int32_t) * (size_t)q[k].n_tokens);
    }
    const int64_t per_graph = s3_batch_fit(s3_encoder_max_elements(n_all, 1));
    for (int64_t k0 = 0; k0 < K; k0 += per_graph) {
        const int64_t g = K - k0 < per_graph ? K - k0 : per_graph;
        if ((st = s3_encode(ctx, tok + (size_t)k0 * (size_t)n_all, n_all, g,
                            mu_enc + (size_t)k0 * (size_t)T_enc * S3_MEL)) != CODECRT_OK) {
            goto done;
        }
    }
    /* conditional entries: mu, the prompt's mel as cond, spks; the
       unconditional ones (guidance) keep zeros */
    for (int32_t k = 0; k < K; k++) {
        const codecrt_voice *v = q[k].voice;
        float *muk = mu + (size_t)k * plane, *condk = cond + (size_t)k * plane;
        const float *enck = mu_enc + (size_t)k * (size_t)T_enc * S3_MEL;
        for (int c = 0; c < S3_MEL; c++) {
            memcpy(muk + (size_t)c * (size_t)T, enck + (size_t)c * (size_t)T_enc, sizeof(float) * (size_t)T);
            memcpy(condk + (size_t)c * (size_t)T, v->mel + (size_t)c * (size_t)P, sizeof(float) * (size_t)P);
        }
        memcpy(spks + (size_t)k * S3_MEL, v->spks, sizeof(v->spks));
    }
    /* the starting noise, one (sequence, mel bin) row per task */
    s3_noise_job nj = {.q = q, .T = T, .plane = plane, .x = x};
    cr_parallel_for(ctx->host_threads, (int64_t)K * S3_MEL, s3_flow_noise_task, &nj);
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

/* One vocoder request of a batch (the public item, validated). */
typedef codecrt_vocode_item s3_voc_req;

/* Host memory for the harmonic terms of a group of vocoder items, [G][9][N] floats: a group
   is as many items as fit (at least one, whatever its length). */
#define S3_SOURCE_GROUP_BYTES ((size_t)64 << 20)

/* A group of vocoder items' harmonic sources, item by harmonic on the host threads. */
typedef struct s3_source_job {
    const s3_voc_req *items; /* the group's first item */
    const float *f0;         /* [G][F] */
    int64_t F, N;
    float lw[S3_HARMONICS], lb;
    float *terms;            /* [G][9][N] */
    float *source;           /* [G][N] */
} s3_source_job;

/* Task k*9 + h: harmonic h of item k, from its noise. */
static void s3_source_term_task(void *arg, int64_t i) {
    const s3_source_job *j = arg;
    const int64_t k = i / S3_HARMONICS;
    const int h = (int)(i % S3_HARMONICS);
    const s3_voc_req *it = &j->items[k];
    float *t = j->terms + ((size_t)k * S3_HARMONICS + (size_t)h) * (size_t)j->N;
    codecrt_noise(it->seed, S3_SITE_SINE + (uint32_t)h, (uint64_t)it->sample_offset, (size_t)j->N, 0, t);
    /* SineGen: the fundamental starts at phase 0, harmonics at U(-pi, pi) */
    const float phase =
        h == 0 ? 0.0f : (2.0f * cr_noise_uniform(it->seed, S3_SITE_PHASE, (uint64_t)h) - 1.0f) * (float)S3_PI;
    s3_source_term(j->f0 + (size_t)(k * j->F), j->F, h, phase, j->lw[h], t);
}

/* Task k: item k's terms summed into its source, then its cache and copy out. */
static void s3_source_combine_task(void *arg, int64_t k) {
    const s3_source_job *j = arg;
    const s3_voc_req *it = &j->items[k];
    float *src = j->source + (size_t)(k * j->N);
    s3_source_combine(j->terms + (size_t)k * S3_HARMONICS * (size_t)j->N, j->N, j->lb, src);
    if (it->cache_source && it->n_cache > 0) {
        memcpy(src, it->cache_source, sizeof(float) * (size_t)it->n_cache);
    }
    if (it->source_out) {
        memcpy(it->source_out, src, sizeof(float) * (size_t)j->N);
    }
}

/* K vocoder calls of F mel frames in one F0 and one HiFT graph, each with its
   host source: pcm [K][F*480]; every item's source_out may be NULL. */
static codecrt_status s3_vocode(codecrt_context *ctx, const float *mel, int64_t F, int64_t K,
                                const s3_voc_req *items, float *pcm) {
    const int64_t N = F * S3_MEL_HOP;
    const size_t per_item = sizeof(float) * S3_HARMONICS * (size_t)N;
    int64_t group = per_item >= S3_SOURCE_GROUP_BYTES ? 1 : (int64_t)(S3_SOURCE_GROUP_BYTES / per_item);
    group = group < K ? group : K;
    float *f0 = malloc(sizeof(float) * (size_t)(F * K));
    float *terms = malloc(per_item * (size_t)group);
    float *source = malloc(sizeof(float) * (size_t)(N * K));
    codecrt_status st = CODECRT_OK;
    if (!f0 || !terms || !source) {
        st = cr_fail(&ctx->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
        goto done;
    }
    if ((st = s3_f0(ctx, mel, F, K, f0)) != CODECRT_OK) {
        goto done;
    }
    s3_source_job job = {.F = F, .N = N, .terms = terms};
    s3_source_weights(ctx->model->weights, job.lw, &job.lb);
    for (int64_t k0 = 0; k0 < K; k0 += group) {
        const int64_t g = K - k0 < group ? K - k0 : group;
        job.items = items + k0;
        job.f0 = f0 + (size_t)(k0 * F);
        job.source = source + (size_t)(k0 * N);
        cr_parallel_for(ctx->host_threads, g * S3_HARMONICS, s3_source_term_task, &job);
        cr_parallel_for(ctx->host_threads, g, s3_source_combine_task, &job);
    }
    st = s3_hift(ctx, mel, F, K, source, pcm);
done:
    free(f0);
    free(terms);
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

codecrt_status s3_check_ctx(codecrt_context *ctx) {
    if (!ctx) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    if (ctx->model->arch != &cr_arch_s3gen) {
        return cr_fail(&ctx->err, CODECRT_E_UNSUPPORTED, "model '%s' is not a two-stage (s3gen) model",
                       ctx->model->arch->name);
    }
    return cr_settle(ctx); /* every entry point of the two stages checks ctx first */
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

codecrt_status s3_check_tokens(codecrt_context *ctx, const int32_t *tokens, int64_t n) {
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

codecrt_status s3_status(codecrt_context *ctx, codecrt_status st) {
    if (st == CODECRT_OK) {
        ctx->err.msg[0] = '\0';
    }
    return st;
}

/* ------------------------------------------------------------ public entry */

codecrt_status s3_decode(codecrt_context *ctx, const codecrt_decode_params *p, const codecrt_codes *codes,
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
codecrt_status s3_check_mel(codecrt_context *ctx, const float *mel, int64_t F, int64_t n_seq) {
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
