/*
 * test_stream.c: streaming through the public API on small random SNAC
 * models: streamed output equals the offline decode for any way of pushing the
 * codes, batched ticks equal single ticks, slots are reused without growth,
 * bad input leaves a stream in a defined state, packed pushes and pulls of
 * many streams (codecrt_streams_push, codecrt_streams_pull) equal one by one, and
 * pulls of any size between ticks give the samples in order.
 */
#define _POSIX_C_SOURCE 200809L
#include "test_common.h"

static codecrt_context *stream_ctx(codecrt_model *m, int32_t chunk, int32_t bucket) {
    codecrt_context_params p = codecrt_context_default_params();
    p.device = "cpu";
    p.n_threads = 2;
    p.max_frames = 512;
    p.max_batch = 8;
    p.batch_bucket = bucket;
    p.stream_chunk_frames = chunk;
    p.max_streams = 8;
    codecrt_context *ctx = NULL;
    char err[256];
    codecrt_status st = codecrt_context_init(m, &p, &ctx, err, sizeof(err));
    CHECK(st == CODECRT_OK, "context_init: %s", err);
    return ctx;
}

/* Push tc's codes into s in pieces: level-interleaved, piece sizes from rng. */
static void push_pieces(codecrt_stream *s, const test_codes *tc, const test_cfg *c, int max_piece) {
    int64_t pos[4] = {0, 0, 0, 0};
    bool left = true;
    while (left) {
        left = false;
        for (int l = 0; l < c->n_levels; l++) {
            const int64_t rem = tc->lengths[l] - pos[l];
            if (rem <= 0) {
                continue;
            }
            int64_t take = 1 + (int64_t)(frand() * (float)max_piece);
            take = take < rem ? take : rem;
            int64_t lens[4] = {0, 0, 0, 0};
            const int32_t *ptrs[4] = {NULL, NULL, NULL, NULL};
            lens[l] = take;
            ptrs[l] = tc->levels[l] + pos[l];
            codecrt_codes piece = {.n_batch = 1, .n_levels = c->n_levels, .levels = ptrs, .lengths = lens};
            CHECK_OK(codecrt_stream_push(s, &piece));
            pos[l] += take;
            left = left || pos[l] < tc->lengths[l];
        }
    }
}

static void drain(codecrt_context *ctx, codecrt_stream **ss, int n) {
    int32_t stepped = 1;
    while (stepped > 0) {
        CHECK_OK(codecrt_context_step(ctx, ss, n, &stepped));
    }
}

static float *pull_all(codecrt_stream *s, size_t *n) {
    codecrt_stream_info info;
    CHECK_OK(codecrt_stream_get_info(s, &info));
    float *pcm = malloc(sizeof(float) * (size_t)(info.samples_ready + 1));
    CHECK_OK(codecrt_stream_pull(s, pcm, (size_t)info.samples_ready, n));
    return pcm;
}

/* One stream, pushed in random pieces, equals offline, noise off and on. */
static void test_equal_offline(codecrt_model *m, const test_cfg *c, int32_t chunk) {
    codecrt_context *ctx = stream_ctx(m, chunk, 0);
    const int32_t frames[] = {4, 8, 28, 36};
    for (int f = 0; f < 4; f++) {
        for (int noise = 0; noise < 2; noise++) {
            test_codes tc;
            make_codes(&tc, c, frames[f], 1, (uint32_t)(f + 7));
            size_t n_off = 0;
            float *off = decode_alloc(ctx, &tc, noise, &n_off); /* seed 1234 */
            codecrt_stream_params sp = codecrt_stream_default_params();
            sp.noise = noise;
            sp.seed = 1234;
            codecrt_stream *s = NULL;
            CHECK_OK(codecrt_stream_init(ctx, &sp, &s));
            push_pieces(s, &tc, c, f == 0 ? 1 : 5);
            CHECK_OK(codecrt_stream_finish(s));
            drain(ctx, &s, 1);
            codecrt_stream_info info;
            CHECK_OK(codecrt_stream_get_info(s, &info));
            CHECK(info.done, "stream not done");
            size_t n_str = 0;
            float *str = pull_all(s, &n_str);
            CHECK(n_str == n_off, "[%s chunk %d] %d frames: streamed %zu samples, offline %zu", c->name, chunk,
                  frames[f], n_str, n_off);
            const double d = n_str == n_off ? max_abs_diff(str, off, n_off) : 1e9;
            CHECK(d < 1e-5, "[%s chunk %d] %d frames noise %d: streamed differs from offline by %g", c->name,
                  chunk, frames[f], noise, d);
            codecrt_stream_free(s);
            free(off);
            free(str);
            free_codes(&tc, c);
        }
    }
    codecrt_context_free(ctx);
}

/* Every stream finished, its samples equal to its decode alone; frees them. */
static void check_and_free(const test_cfg *c, const char *what, int n, codecrt_stream **ss, float **got,
                           const size_t *n_got, float **alone, const size_t *n_alone, test_codes *tc) {
    for (int i = 0; i < n; i++) {
        CHECK(ss[i] == NULL, "%s stream %d never finished", what, i);
        CHECK(n_got[i] == n_alone[i], "%s stream %d: %zu samples, alone %zu", what, i, n_got[i], n_alone[i]);
        const double d = max_abs_diff(got[i], alone[i], n_alone[i]);
        CHECK(d < 1e-5, "[%s] %s stream %d differs from its decode alone by %g", c->name, what, i, d);
        free(got[i]);
        free(alone[i]);
        free_codes(&tc[i], c);
    }
}

/* N streams stepped together with joins and leaves give what each gives alone. */
static void test_batched(codecrt_model *m, const test_cfg *c, int32_t chunk, int bucket) {
    codecrt_context *ctx = stream_ctx(m, chunk, bucket);
    enum { NS = 5 };
    const int32_t frames[NS] = {8, 20, 4, 32, 12};
    test_codes tc[NS];
    codecrt_stream *ss[NS] = {0};
    float *alone[NS];
    size_t n_alone[NS];
    for (int i = 0; i < NS; i++) {
        make_codes(&tc[i], c, frames[i], 1, (uint32_t)(i * 3 + 1));
        alone[i] = decode_alloc(ctx, &tc[i], 1, &n_alone[i]);
    }
    /* streams join at different ticks: stream i starts after i ticks */
    float *got[NS] = {0};
    size_t n_got[NS] = {0};
    for (int tick = 0; tick < 64; tick++) {
        if (tick < NS) {
            codecrt_stream_params sp = codecrt_stream_default_params();
            sp.noise = 1;
            sp.seed = 1234;
            CHECK_OK(codecrt_stream_init(ctx, &sp, &ss[tick]));
            push_pieces(ss[tick], &tc[tick], c, 3);
            CHECK_OK(codecrt_stream_finish(ss[tick]));
            got[tick] = malloc(sizeof(float) * n_alone[tick]);
        }
        codecrt_stream *live[NS];
        int nl = 0;
        for (int i = 0; i < NS; i++) {
            if (ss[i]) {
                live[nl++] = ss[i];
            }
        }
        int32_t stepped = 0;
        CHECK_OK(codecrt_context_step(ctx, live, nl, &stepped));
        for (int i = 0; i < NS; i++) {
            if (!ss[i]) {
                continue;
            }
            size_t k = 0;
            CHECK_OK(codecrt_stream_pull(ss[i], got[i] + n_got[i], n_alone[i] - n_got[i], &k));
            n_got[i] += k;
            codecrt_stream_info info;
            CHECK_OK(codecrt_stream_get_info(ss[i], &info));
            if (info.done) { /* leaves while others go on */
                codecrt_stream_free(ss[i]);
                ss[i] = NULL;
            }
        }
    }
    check_and_free(c, "batched", NS, ss, got, n_got, alone, n_alone, tc);
    codecrt_context_free(ctx);
}

/* The two-halves step: codes pushed, samples pulled, streams opened and
   finished between codecrt_context_step_begin and _end, each stream equal to
   its offline decode; a stream listed twice is refused and leaves no mark. */
static void test_split_step(codecrt_model *m, const test_cfg *c) {
    codecrt_context *ctx = stream_ctx(m, 4, 1);
    enum { NS = 4 };
    const int32_t frames[NS] = {16, 28, 8, 20};
    test_codes tc[NS];
    codecrt_stream *ss[NS] = {0};
    float *alone[NS], *got[NS];
    size_t n_alone[NS], n_got[NS] = {0};
    int64_t fed[NS] = {0}; /* frames pushed so far (all levels) */
    for (int i = 0; i < NS; i++) {
        make_codes(&tc[i], c, frames[i], 1, (uint32_t)(i * 7 + 2));
        alone[i] = decode_alloc(ctx, &tc[i], 1, &n_alone[i]);
        got[i] = malloc(sizeof(float) * n_alone[i]);
    }
    codecrt_stream_params sp = codecrt_stream_default_params();
    sp.noise = 1;
    sp.seed = 1234;
    CHECK_OK(codecrt_stream_init(ctx, &sp, &ss[0]));
    codecrt_stream *twice[2] = {ss[0], ss[0]};
    CHECK(codecrt_context_step_begin(ctx, twice, 2) == CODECRT_E_INVALID_ARGUMENT, "a stream twice is refused");
    for (int tick = 0; tick < 64; tick++) {
        codecrt_stream *live[NS];
        int nl = 0;
        for (int i = 0; i < NS; i++) {
            if (ss[i]) {
                live[nl++] = ss[i];
            }
        }
        CHECK_OK(codecrt_context_step_begin(ctx, live, nl));
        /* between the halves: 0, 1 or 2 more units of frames for each stream
           (so chunks are sometimes whole before the tick, sometimes not), a pull */
        int64_t unit = 1; /* frames that give every level whole codes */
        for (int l = 0; l < c->n_levels; l++) {
            unit = c->strides[l] > unit ? c->strides[l] : unit;
        }
        for (int i = 0; i < NS; i++) {
            if (!ss[i]) {
                continue;
            }
            const int64_t want = (int64_t)((tick + i) % 3) * unit;
            const int64_t take = fed[i] < 0 ? 0 : fed[i] + want <= frames[i] ? want : frames[i] - fed[i];
            if (take > 0) {
                const int32_t *ptrs[4] = {NULL, NULL, NULL, NULL};
                int64_t lens[4] = {0, 0, 0, 0};
                for (int l = 0; l < c->n_levels; l++) {
                    ptrs[l] = tc[i].levels[l] + fed[i] / c->strides[l];
                    lens[l] = take / c->strides[l];
                }
                codecrt_codes piece = {.n_batch = 1, .n_levels = c->n_levels, .levels = ptrs, .lengths = lens};
                CHECK_OK(codecrt_stream_push(ss[i], &piece));
                fed[i] += take;
            }
            size_t k = 0;
            CHECK_OK(codecrt_stream_pull(ss[i], got[i] + n_got[i], n_alone[i] - n_got[i], &k));
            n_got[i] += k;
        }
        if (tick % 3 == 1 && tick / 3 + 1 < NS && !ss[tick / 3 + 1]) { /* opens settle the tick first */
            CHECK_OK(codecrt_stream_init(ctx, &sp, &ss[tick / 3 + 1]));
        }
        for (int i = 0; i < NS; i++) {
            if (ss[i] && fed[i] == frames[i] && tick % 2 == 0) { /* finishes too */
                CHECK_OK(codecrt_stream_finish(ss[i]));
                fed[i]++; /* finished */
            }
        }
        int32_t stepped = -1;
        CHECK_OK(codecrt_context_step_end(ctx, &stepped));
        CHECK(stepped >= 0 && stepped <= nl, "stepped %d of %d", stepped, nl);
        for (int i = 0; i < NS; i++) {
            codecrt_stream_info info;
            if (!ss[i]) {
                continue;
            }
            size_t k = 0;
            CHECK_OK(codecrt_stream_pull(ss[i], got[i] + n_got[i], n_alone[i] - n_got[i], &k));
            n_got[i] += k;
            CHECK_OK(codecrt_stream_get_info(ss[i], &info));
            if (info.done) {
                codecrt_stream_free(ss[i]);
                ss[i] = (codecrt_stream *)1; /* done: not stepped again (never dereferenced) */
            }
        }
        for (int i = 0; i < NS; i++) {
            if (ss[i] == (codecrt_stream *)1) {
                ss[i] = NULL;
                fed[i] = -1000; /* never pushed again */
            }
        }
    }
    int32_t stepped = -1;
    CHECK_OK(codecrt_context_step_end(ctx, &stepped)); /* nothing in flight: a no-op */
    CHECK(stepped == 0, "an end with nothing in flight stepped %d", stepped);
    /* an open between the halves ends the tick early; end still reports it */
    codecrt_stream *x = NULL, *y = NULL;
    CHECK_OK(codecrt_stream_init(ctx, &sp, &x));
    CHECK_OK(codecrt_stream_push(x, &tc[0].codes));
    CHECK_OK(codecrt_context_step_begin(ctx, &x, 1));
    CHECK_OK(codecrt_stream_init(ctx, &sp, &y));
    CHECK_OK(codecrt_context_step_end(ctx, &stepped));
    CHECK(stepped == 1, "a tick settled by an open reported %d streams", stepped);
    codecrt_stream_free(x);
    codecrt_stream_free(y);
    check_and_free(c, "split-step", NS, ss, got, n_got, alone, n_alone, tc);
    codecrt_context_free(ctx);
}

/* Many streams opened and closed: slots reused, no new graphs after warm-up. */
static void test_slots(codecrt_model *m, const test_cfg *c, int rounds) {
    codecrt_context *ctx = stream_ctx(m, 4, 1);
    test_codes tc;
    make_codes(&tc, c, 8, 1, 5);
    codecrt_stats s0, s1;
    uint64_t built_after_warmup = 0;
    for (int r = 0; r < rounds; r++) {
        codecrt_stream *s = NULL;
        CHECK_OK(codecrt_stream_init(ctx, NULL, &s));
        CHECK_OK(codecrt_stream_push(s, &tc.codes));
        if (r % 3 != 2) {
            CHECK_OK(codecrt_stream_finish(s));
            drain(ctx, &s, 1);
        } else {
            int32_t k = 0; /* cancelled mid-stream */
            CHECK_OK(codecrt_context_step(ctx, &s, 1, &k));
        }
        codecrt_stream_free(s);
        if (r == 3) {
            CHECK_OK(codecrt_context_get_stats(ctx, &s0));
            built_after_warmup = s0.graphs_built;
        }
    }
    CHECK_OK(codecrt_context_get_stats(ctx, &s1));
    CHECK(s1.graphs_built == built_after_warmup, "graphs built grew from %llu to %llu",
          (unsigned long long)built_after_warmup, (unsigned long long)s1.graphs_built);
    CHECK(s1.state_bytes == s0.state_bytes && s1.streams_active == 0, "state %llu -> %llu, active %d",
          (unsigned long long)s0.state_bytes, (unsigned long long)s1.state_bytes, s1.streams_active);
    /* every slot can be taken, and one more is refused */
    codecrt_stream *all[9] = {0};
    for (int i = 0; i < 8; i++) {
        CHECK_OK(codecrt_stream_init(ctx, NULL, &all[i]));
    }
    CHECK(codecrt_stream_init(ctx, NULL, &all[8]) == CODECRT_E_TOO_LARGE, "ninth stream accepted");
    for (int i = 0; i < 8; i++) {
        codecrt_stream_free(all[i]);
    }
    free_codes(&tc, c);
    codecrt_context_free(ctx);
}

static void test_bad_input(codecrt_model *m, const test_cfg *c) {
    codecrt_context *ctx = stream_ctx(m, 4, 0);
    codecrt_stream *a = NULL, *b = NULL;
    CHECK_OK(codecrt_stream_init(ctx, NULL, &a));
    CHECK_OK(codecrt_stream_init(ctx, NULL, &b));
    test_codes tc;
    make_codes(&tc, c, 8, 1, 2);
    CHECK_OK(codecrt_stream_push(b, &tc.codes));
    const int32_t saved = tc.levels[2][3];
    tc.levels[2][3] = c->codebook + 5;
    CHECK(codecrt_stream_push(a, &tc.codes) == CODECRT_E_CODE_RANGE, "out of range accepted");
    CHECK(strstr(codecrt_stream_last_error(a), "level 2") != NULL, "message: %s", codecrt_stream_last_error(a));
    codecrt_stream_info info;
    CHECK_OK(codecrt_stream_get_info(a, &info));
    CHECK(info.frames_pushed == 0, "rejected push left %lld frames", (long long)info.frames_pushed);
    tc.levels[2][3] = saved;
    /* half a frame group then finish: refused, stream still usable */
    int64_t lens[3] = {1, 1, 0};
    const int32_t *ptrs[3] = {tc.levels[0], tc.levels[1], NULL};
    codecrt_codes part = {.n_batch = 1, .n_levels = 3, .levels = ptrs, .lengths = lens};
    CHECK_OK(codecrt_stream_push(a, &part));
    CHECK(codecrt_stream_finish(a) == CODECRT_E_SHAPE, "broken group accepted at finish");
    CHECK_OK(codecrt_stream_reset(a));
    CHECK_OK(codecrt_stream_push(a, &tc.codes));
    CHECK_OK(codecrt_stream_finish(a));
    CHECK(codecrt_stream_push(a, &tc.codes) == CODECRT_E_STATE, "push after finish accepted");
    CHECK(codecrt_stream_finish(a) == CODECRT_E_STATE, "finish twice accepted");
    /* b is untouched by all of that */
    CHECK_OK(codecrt_stream_finish(b));
    codecrt_stream *both[2] = {a, b};
    drain(ctx, both, 2);
    size_t na = 0, nb = 0;
    float *pa = pull_all(a, &na), *pb = pull_all(b, &nb);
    CHECK(na == nb && na > 0 && memcmp(pa, pb, na * sizeof(float)) == 0, "a and b differ after a's errors");
    free(pa);
    free(pb);
    codecrt_stream_free(a);
    codecrt_stream_free(b);
    free_codes(&tc, c);
    codecrt_context_free(ctx);
}

/* Packed pushes and one-buffer pulls of several streams: the same samples as one by one,
   a bad stream fails alone, bad packing is refused whole, a short buffer keeps the rest. */
static void test_many(codecrt_model *m, const test_cfg *c) {
    codecrt_context *ctx = stream_ctx(m, 4, 0);
    codecrt_stream *ss[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(codecrt_stream_init(ctx, NULL, &ss[i]));
    }
    test_codes tc;
    make_codes(&tc, c, 8, 1, 3);
    int64_t per = 0;
    for (int l = 0; l < c->n_levels; l++) {
        per += tc.lengths[l];
    }
    /* streams 0 and 1 get tc's codes, packed; a NULL entry between them is skipped */
    int32_t *flat = malloc(sizeof(int32_t) * (size_t)(2 * per));
    uint32_t lens[8], nlev[3] = {(uint32_t)c->n_levels, 0, (uint32_t)c->n_levels};
    int64_t at = 0;
    for (int k = 0; k < 2; k++) {
        for (int l = 0; l < c->n_levels; l++) {
            lens[k * c->n_levels + l] = (uint32_t)tc.lengths[l];
            memcpy(flat + at, tc.levels[l], sizeof(int32_t) * (size_t)tc.lengths[l]);
            at += tc.lengths[l];
        }
    }
    codecrt_stream *packed[3] = {ss[0], NULL, ss[1]};
    codecrt_status status[3];
    const size_t nl = (size_t)(2 * c->n_levels);
    CHECK(codecrt_streams_push(packed, 3, nlev, lens, nl, flat, (size_t)(2 * per - 1), status) ==
              CODECRT_E_INVALID_ARGUMENT, "lengths past the codes accepted");
    CHECK(codecrt_streams_push(packed, 3, nlev, lens, nl - 1, flat, (size_t)(2 * per), status) ==
              CODECRT_E_INVALID_ARGUMENT, "level counts and lengths that disagree accepted");
    flat[per + tc.lengths[0]] = c->codebook + 1; /* stream 1, level 1: out of range */
    CHECK_OK(codecrt_streams_push(packed, 3, nlev, lens, nl, flat, (size_t)(2 * per), status));
    CHECK(status[0] == CODECRT_OK && status[1] == CODECRT_E_INVALID_ARGUMENT &&
              status[2] == CODECRT_E_CODE_RANGE, "statuses %d %d %d", status[0], status[1], status[2]);
    CHECK(strstr(codecrt_stream_last_error(ss[1]), "level 1") != NULL, "message: %s",
          codecrt_stream_last_error(ss[1]));
    CHECK_OK(codecrt_stream_push(ss[1], &tc.codes)); /* then one by one */
    CHECK_OK(codecrt_stream_push(ss[2], &tc.codes));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(codecrt_stream_finish(ss[i]));
    }
    drain(ctx, ss, 3);
    size_t n_ref = 0;
    float *ref = pull_all(ss[2], &n_ref);
    float *buf = malloc(sizeof(float) * (n_ref * 2 + 1));
    int64_t counts[3];
    int32_t flags[3];
    CHECK_OK(codecrt_streams_pull(ss, 2, buf, n_ref / 2, counts, flags));
    CHECK(counts[0] == (int64_t)(n_ref / 2) && counts[1] == 0 && (flags[0] & CODECRT_PULL_MORE) &&
              (flags[1] & CODECRT_PULL_MORE), "short pull: counts %lld %lld flags %d %d",
          (long long)counts[0], (long long)counts[1], flags[0], flags[1]);
    CHECK(memcmp(buf, ref, sizeof(float) * (n_ref / 2)) == 0, "first half of stream 0 differs");
    CHECK_OK(codecrt_streams_pull(ss, 2, buf + n_ref / 2, n_ref * 2 - n_ref / 2 + 1, counts, flags));
    CHECK(counts[0] == (int64_t)(n_ref - n_ref / 2) && counts[1] == (int64_t)n_ref &&
              flags[0] == CODECRT_PULL_DONE && flags[1] == CODECRT_PULL_DONE,
          "rest: counts %lld %lld flags %d %d", (long long)counts[0], (long long)counts[1], flags[0], flags[1]);
    CHECK(memcmp(buf, ref, sizeof(float) * n_ref) == 0, "stream 0 differs from one by one");
    CHECK(memcmp(buf + n_ref, ref, sizeof(float) * n_ref) == 0, "stream 1 differs from one by one");
    free(buf);
    free(ref);
    free(flat);
    for (int i = 0; i < 3; i++) {
        codecrt_stream_free(ss[i]);
    }
    free_codes(&tc, c);
    codecrt_context_free(ctx);
}

/* A tick's PCM stays where it landed until pulled (codecrt_stream's lazy output): pulls of
   every size between ticks, none for a few ticks, and a short pull that spans the older
   samples and the last tick's, all give the offline decode's samples in order, with
   samples_ready and PULL_MORE telling what is left. */
static void test_pull_where_it_landed(codecrt_model *m, const test_cfg *c) {
    codecrt_context *ctx = stream_ctx(m, 4, 0);
    test_codes tc;
    make_codes(&tc, c, 36, 1, 21);
    size_t n_off = 0;
    float *off = decode_alloc(ctx, &tc, 0, &n_off);
    codecrt_stream *s = NULL;
    CHECK_OK(codecrt_stream_init(ctx, NULL, &s));
    CHECK_OK(codecrt_stream_push(s, &tc.codes));
    CHECK_OK(codecrt_stream_finish(s));
    float *got = malloc(sizeof(float) * (n_off + 1));
    size_t have = 0;
    const size_t caps[] = {0, 1, 0, 0, 37, (size_t)-1, 5000, 3, (size_t)-1};
    int32_t stepped = 1;
    for (int t = 0; stepped > 0 || t < 9; t++) {
        CHECK_OK(codecrt_context_step(ctx, &s, 1, &stepped));
        codecrt_stream_info info;
        CHECK_OK(codecrt_stream_get_info(s, &info));
        const size_t cap = caps[t % 9] == (size_t)-1 ? (size_t)info.samples_ready : caps[t % 9];
        const size_t room = n_off - have, ask = cap < room ? cap : room;
        size_t n = 0;
        int64_t count = 0;
        int32_t flags = 0;
        if (t % 2) { /* the packed pull, then the one-stream pull */
            CHECK_OK(codecrt_streams_pull(&s, 1, got + have, ask, &count, &flags));
            n = (size_t)count;
            CHECK(((flags & CODECRT_PULL_MORE) != 0) == ((int64_t)n < info.samples_ready),
                  "tick %d: PULL_MORE %d after %zu of %lld", t, flags, n, (long long)info.samples_ready);
        } else {
            CHECK_OK(codecrt_stream_pull(s, got + have, ask, &n));
        }
        CHECK((int64_t)n == (info.samples_ready < (int64_t)ask ? info.samples_ready : (int64_t)ask),
              "tick %d: pulled %zu of %lld ready, asked %zu", t, n, (long long)info.samples_ready, ask);
        have += n;
        codecrt_stream_info after;
        CHECK_OK(codecrt_stream_get_info(s, &after));
        CHECK(after.samples_ready == info.samples_ready - (int64_t)n, "tick %d: %lld left, want %lld", t,
              (long long)after.samples_ready, (long long)(info.samples_ready - (int64_t)n));
        if (stepped == 0 && after.samples_ready == 0) {
            break;
        }
    }
    CHECK(have == n_off, "pulled %zu samples, offline %zu", have, n_off);
    CHECK(have == n_off && max_abs_diff(got, off, n_off) < 1e-5, "pulled samples differ from offline");
    codecrt_stream_free(s);
    free(got);
    free(off);
    free_codes(&tc, c);
    codecrt_context_free(ctx);
}

/* The same with several streams that start at different ticks, so that the CPU's ticks run
   two graphs (streams at their edges, steady ones) and the staging takes two graphs' PCM in
   one step; pulls of varied sizes between step_begin and step_end and after it, some ticks
   none. Each stream's samples equal its offline decode. */
static void test_pull_across_split_ticks(codecrt_model *m, const test_cfg *c) {
    codecrt_context *ctx = stream_ctx(m, 4, 0);
    enum { NS = 4 };
    const int start[NS] = {0, 2, 5, 7};
    test_codes tc[NS];
    float *off[NS], *got[NS];
    size_t n_off[NS], have[NS] = {0};
    codecrt_stream *ss[NS] = {0};
    for (int i = 0; i < NS; i++) {
        make_codes(&tc[i], c, 36 + 4 * i, 1, (uint32_t)(40 + i));
        off[i] = decode_alloc(ctx, &tc[i], 0, &n_off[i]);
        got[i] = malloc(sizeof(float) * (n_off[i] + 1));
    }
    for (int t = 0; t < 200; t++) {
        codecrt_stream *live[NS];
        int k = 0;
        for (int i = 0; i < NS; i++) {
            if (t == start[i]) {
                CHECK_OK(codecrt_stream_init(ctx, NULL, &ss[i]));
                CHECK_OK(codecrt_stream_push(ss[i], &tc[i].codes));
                CHECK_OK(codecrt_stream_finish(ss[i]));
            }
            if (ss[i]) {
                live[k++] = ss[i];
            }
        }
        CHECK_OK(codecrt_context_step_begin(ctx, live, k));
        for (int half = 0; half < 2; half++) { /* between begin and end, then after end */
            int32_t stepped = 0;
            if (half == 1) {
                CHECK_OK(codecrt_context_step_end(ctx, &stepped));
                if (stepped == 0 && t > start[NS - 1]) {
                    t = 200;
                }
                if (t % 3 == 0) {
                    continue; /* no pull: the next tick keeps these samples */
                }
            }
            for (int i = 0; i < NS; i++) {
                const size_t want = (size_t)((t * (half ? 11 : 7) + i * (half ? 5 : 3)) % (half ? 300 : 50));
                const size_t room = n_off[i] - have[i], cap = want < room ? want : room;
                size_t n = 0;
                if (ss[i]) {
                    CHECK_OK(codecrt_stream_pull(ss[i], got[i] + have[i], cap, &n));
                }
                have[i] += n;
            }
        }
    }
    for (int i = 0; i < NS; i++) {
        size_t n = 0;
        CHECK_OK(codecrt_stream_pull(ss[i], got[i] + have[i], n_off[i] - have[i], &n));
        have[i] += n;
        CHECK(have[i] == n_off[i], "stream %d: pulled %zu samples, offline %zu", i, have[i], n_off[i]);
        CHECK(have[i] == n_off[i] && max_abs_diff(got[i], off[i], n_off[i]) < 1e-5,
              "stream %d: pulled samples differ from offline", i);
        codecrt_stream_free(ss[i]);
        free(got[i]);
        free(off[i]);
        free_codes(&tc[i], c);
    }
    codecrt_context_free(ctx);
}

int main(void) {
    char dir[] = "/tmp/codecrt-stream-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    const test_cfg *cfgs[] = {&k_plain, &k_attn};
    for (int i = 0; i < 2; i++) {
        const test_cfg *c = cfgs[i];
        char path[512], err[512];
        snprintf(path, sizeof(path), "%s/%s.gguf", dir, c->name);
        write_model(path, c, "snac", NULL, NULL);
        codecrt_model *m = NULL;
        CHECK_OK(codecrt_model_load(path, &m, err, sizeof(err)));
        if (!m) {
            continue;
        }
        test_equal_offline(m, c, 4);
        test_equal_offline(m, c, 12);
        test_batched(m, c, 4, 0);
        test_batched(m, c, 8, 1);
        test_split_step(m, c);
        test_slots(m, c, 60);
        test_bad_input(m, c);
        test_many(m, c);
        test_pull_where_it_landed(m, c);
        test_pull_across_split_ticks(m, c);
        codecrt_model_free(m);
        unlink(path);
    }
    rmdir(dir);
    printf("%d passed, %d failed\n", g_checks - g_failures, g_failures);
    return g_failures ? 1 : 0;
}
