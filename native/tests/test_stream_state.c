/*
 * test_stream_state.c: the per-slot state buffers of tick graphs
 * (native/src/stream_state.h), computed on the CPU over two ticks, in both
 * layouts: each stream reads its own slot's row (zeros on its first tick when
 * keep gates it), sees its state before its new input, and writes its
 * buffer's tail back to its slot only; other rows and the dummy row are left
 * alone; time inputs are registered with their rate and delay; a state list
 * that disagrees with the builder fails the graph instead of reaching ggml.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "stream_state.h"
#include "test_common.h"

#define SLOTS 3 /* + the dummy row */

static struct ggml_context *new_ctx(void) {
    struct ggml_init_params ip = {.mem_size = (size_t)16 << 20, .mem_buffer = NULL, .no_alloc = false};
    return ggml_init(ip);
}

static float *fdata(struct ggml_tensor *t) { return (float *)t->data; }

/*
 * One layout (tf: time fastest) with states of S frames and inputs of n
 * frames, C channels, B = 2 streams, masked or not, over two ticks.
 */
static void check_ticks(bool tf, bool masked, bool cpu, int64_t C, int64_t S, int64_t n) {
    const int64_t B = 2, rows = SLOTS + 1, W = C * S;
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *pool = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, W, rows);
    for (int64_t i = 0; i < W * rows; i++) {
        fdata(pool)[i] = 1000.0f * (float)(i / W) + (float)(i % W);
    }
    float *before = malloc(sizeof(float) * (size_t)(W * rows));
    struct ggml_tensor *pools[1] = {pool};
    cr_graph_io io;
    memset(&io, 0, sizeof(io));
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 1024, false);
    cr_states st;
    cr_states_init(&st, ctx, gf, pools, 1, &io, B, masked, cpu);
    CHECK((io.keep != NULL) == masked && io.slot_read && io.slot_write, "init: inputs");
    struct ggml_tensor *x = tf ? ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n, B, C)
                               : ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, n, B);
    struct ggml_tensor *buf = tf ? cr_states_append_tf(&st, x, S) : cr_states_append(&st, x, S);
    CHECK(io.n_states == 1 && !io.overflow, "append: %d states taken, overflow %d", io.n_states, io.overflow);
    CHECK(tf ? (buf->ne[0] == S + n && buf->ne[1] == B && buf->ne[2] == C)
             : (buf->ne[0] == C && buf->ne[1] == S + n && buf->ne[2] == B),
          "append: buffer shape");
    struct ggml_tensor *out = ggml_cont(ctx, buf);
    ggml_build_forward_expand(gf, out);

    /* tick 1: stream 0 in slot 2 (its first tick), stream 1 in slot 0; tick 2 swaps the order */
    const int32_t slots[2][2] = {{2, 0}, {0, 2}};
    const float keeps[2][2] = {{0.0f, 1.0f}, {1.0f, 1.0f}};
    for (int tick = 0; tick < 2; tick++) {
        memcpy(before, pool->data, sizeof(float) * (size_t)(W * rows));
        memcpy(io.slot_read->data, slots[tick], sizeof(slots[tick]));
        memcpy(io.slot_write->data, slots[tick], sizeof(slots[tick]));
        if (io.keep) {
            memcpy(io.keep->data, keeps[tick], sizeof(keeps[tick]));
        }
        for (int64_t i = 0; i < ggml_nelements(x); i++) {
            fdata(x)[i] = -(float)(tick * 10000 + i) - 1.0f;
        }
        CHECK(ggml_graph_compute_with_ctx(ctx, gf, 2) == GGML_STATUS_SUCCESS, "compute");
        int bad_buf = 0, bad_pool = 0;
        for (int64_t b = 0; b < B; b++) {
            const int32_t slot = slots[tick][b];
            const float keep = masked ? keeps[tick][b] : 1.0f;
            for (int64_t j = 0; j < S + n; j++) {
                for (int64_t c = 0; c < C; c++) {
                    /* the state row holds [C, S] (channels fastest) or [S, C] (time fastest) */
                    const float want = j < S ? keep * before[slot * W + (tf ? j + S * c : c + C * j)]
                                             : fdata(x)[tf ? (j - S) + n * (b + B * c) : c + C * ((j - S) + n * b)];
                    const float got = fdata(out)[tf ? j + (S + n) * (b + B * c) : c + C * (j + (S + n) * b)];
                    bad_buf += got != want;
                }
            }
            for (int64_t j = 0; j < S; j++) { /* the buffer's last S frames, back in the slot's row */
                for (int64_t c = 0; c < C; c++) {
                    const int64_t k = n + j;
                    const float want = fdata(out)[tf ? k + (S + n) * (b + B * c) : c + C * (k + (S + n) * b)];
                    bad_pool += fdata(pool)[slot * W + (tf ? j + S * c : c + C * j)] != want;
                }
            }
        }
        for (int64_t r = 0; r < rows; r++) { /* rows of other slots and the dummy: untouched */
            if (r == slots[tick][0] || r == slots[tick][1]) {
                continue;
            }
            bad_pool += memcmp(fdata(pool) + r * W, before + r * W, sizeof(float) * (size_t)W) != 0;
        }
        CHECK(!bad_buf && !bad_pool, "%s masked %d S %lld n %lld tick %d: %d buffer and %d state values wrong",
              tf ? "time fastest" : "channels fastest", masked, (long long)S, (long long)n, tick, bad_buf, bad_pool);
    }
    free(before);
    ggml_free(ctx);
}

/* Time inputs: registered with kind, rate, delay and site; masks only on edge ticks, built in the graph from
   each stream's bounds (one row pair per distinct mask), oriented per layout. */
static void check_times(void) {
    const int64_t B = 3, n = 4, C = 2;
    for (int masked = 0; masked < 2; masked++) {
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *pool = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, 4);
        cr_graph_io io;
        memset(&io, 0, sizeof(io));
        struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 256, false);
        cr_states st;
        cr_states_init(&st, ctx, gf, &pool, 1, &io, B, masked, false);
        struct ggml_tensor *pos = cr_states_time(&st, CR_TIME_POS, n, 2, 7, 32);
        struct ggml_tensor *nz = cr_states_time(&st, CR_TIME_NOISE, n, 8, 5, 3);
        CHECK(pos->type == GGML_TYPE_I32 && ggml_nelements(pos) == n * B && nz->ne[0] == 1 && nz->ne[1] == n &&
                  nz->ne[2] == B,
              "time input shapes");
        CHECK(io.n_times == 2 && io.times[0].tensor == pos && io.times[0].kind == CR_TIME_POS &&
                  io.times[0].rate == 2 && io.times[0].delay == 7 && io.times[0].site == 32 &&
                  io.times[1].kind == CR_TIME_NOISE && io.times[1].rate == 8 && io.times[1].site == 3,
              "time inputs registered");
        struct ggml_tensor *xc = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, n, B);
        struct ggml_tensor *xt = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n, B, C);
        struct ggml_tensor *mc = cr_states_mask(&st, xc, 4, 9), *m = cr_states_mask_of(&st, n, 4, 9); /* [n, B] */
        struct ggml_tensor *mt = m ? ggml_mul(ctx, xt, ggml_reshape_3d(ctx, m, n, B, 1)) : xt;
        if (!masked) {
            CHECK(mc == xc && mt == xt && io.n_times == 2, "steady tick: masks are no-ops");
            ggml_free(ctx);
            continue;
        }
        /* both layouts ask for the same mask: built once, from the first row pair of bounds */
        CHECK(io.n_times == 3 && io.times[2].kind == CR_TIME_MASK && io.times[2].rate == 4 &&
                  io.times[2].delay == 9 && io.times[2].tensor == NULL && io.times[2].len == n &&
                  io.times[2].site == 0 && io.n_bounds == 1 && io.bounds && io.bounds->ne[0] == B,
              "edge tick: one mask registered for both layouts");
        struct ggml_tensor *mc2 = cr_states_mask(&st, xc, 4, 2); /* another delay: its own rows */
        CHECK(io.n_times == 4 && io.n_bounds == 2 && io.times[3].site == 1, "a second mask");
        for (int64_t b = 0; b < B; b++) {
            fdata(io.bounds)[b] = -1.0f;                    /* mask 0: valid from 0 ... */
            fdata(io.bounds)[B + b] = (float)(b + 1);       /* ... to b + 1 */
            fdata(io.bounds)[2 * B + b] = (float)(b - 1);   /* mask 1: valid from b ... */
            fdata(io.bounds)[3 * B + b] = (float)(n + 1);   /* ... on */
        }
        for (int64_t i = 0; i < C * n * B; i++) {
            fdata(xc)[i] = fdata(xt)[i] = 1.0f + (float)i;
        }
        ggml_build_forward_expand(gf, mc);
        ggml_build_forward_expand(gf, mt);
        ggml_build_forward_expand(gf, mc2);
        CHECK(ggml_graph_compute_with_ctx(ctx, gf, 1) == GGML_STATUS_SUCCESS, "compute");
        int bad = 0;
        for (int64_t b = 0; b < B; b++) {
            for (int64_t t = 0; t < n; t++) {
                for (int64_t c = 0; c < C; c++) {
                    const int64_t ic = c + C * (t + n * b), it = t + n * (b + B * c);
                    bad += fdata(mc)[ic] != (t <= b ? fdata(xc)[ic] : 0.0f);
                    bad += fdata(mt)[it] != (t <= b ? fdata(xt)[it] : 0.0f);
                    bad += fdata(mc2)[ic] != (t >= b ? fdata(xc)[ic] : 0.0f);
                }
            }
        }
        CHECK(!bad, "masks: %d values wrong", bad);
        ggml_free(ctx);
    }
}

/* A builder that takes more states than listed, or one of another size: the graph fails, nothing aborts. */
static void check_mismatch(void) {
    for (int tf = 0; tf < 2; tf++) {
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *pool = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4 * 3, SLOTS + 1);
        cr_graph_io io;
        memset(&io, 0, sizeof(io));
        struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 256, false);
        cr_states st;
        cr_states_init(&st, ctx, gf, &pool, 1, &io, 2, true, false);
        struct ggml_tensor *x = tf ? ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 5, 2, 4)
                                   : ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4, 5, 2);
        struct ggml_tensor *b1 = tf ? cr_states_append_tf(&st, x, 3) : cr_states_append(&st, x, 3);
        CHECK(!io.overflow && io.n_states == 1, "the listed state is taken");
        struct ggml_tensor *b2 = tf ? cr_states_append_tf(&st, x, 3) : cr_states_append(&st, x, 3);
        CHECK(io.overflow && io.n_states == 2 && b2 && b2->ne[tf ? 0 : 1] == 8,
              "a state past the list fails the graph");
        (void)b1;
        ggml_free(ctx);

        ctx = new_ctx();
        pool = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4 * 6, SLOTS + 1); /* listed as 6 frames, taken as 3 */
        memset(&io, 0, sizeof(io));
        gf = ggml_new_graph_custom(ctx, 256, false);
        cr_states_init(&st, ctx, gf, &pool, 1, &io, 2, false, false);
        x = tf ? ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 5, 2, 4) : ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4, 5, 2);
        b1 = tf ? cr_states_append_tf(&st, x, 3) : cr_states_append(&st, x, 3);
        CHECK(io.overflow && b1, "a state of another size fails the graph");
        ggml_free(ctx);
    }
}

int main(void) {
    for (int path = 0; path < 3; path++) { /* channels fastest: concat, or the CPU's copies; time fastest */
        const bool tf = path == 2, cpu = path == 1;
        for (int masked = 0; masked < 2; masked++) {
            check_ticks(tf, masked, cpu, 3, 5, 3); /* the state longer than the input */
            check_ticks(tf, masked, cpu, 4, 2, 5);
            check_ticks(tf, masked, cpu, 1, 1, 1);
        }
    }
    check_times();
    check_mismatch();
    printf("test_stream_state: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
