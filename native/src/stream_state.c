/*
 * stream_state.c: per-slot state buffers of streaming tick graphs
 * (stream_state.h describes the scheme and both layouts).
 */
#include "stream_state.h"

void cr_states_init(cr_states *s, struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *const *pool,
                    int n_pool, cr_graph_io *io, int64_t B, bool masked, bool cpu) {
    /* the members not named (the mask and ramp caches, the bounds copy) start zeroed */
    *s = (cr_states){
        .ctx = ctx, .gf = gf, .pool = pool, .n_pool = n_pool, .io = io, .B = B, .masked = masked, .cpu = cpu};
    io->slot_read = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, B);
    io->slot_write = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, B);
    ggml_set_input(io->slot_read);
    ggml_set_input(io->slot_write);
    if (masked) {
        io->keep = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, 1, B);
        ggml_set_input(io->keep);
    }
}

/* x [C, n, B] * f [1, n or 1, B] on the CPU: one factor per row of C contiguous floats, tasks
   over the rows. ggml's CPU MUL broadcasts a src1 of one column element by element (an index
   computation per float): in a 24-stream SNAC tick of streams at their edges, 54 such products
   of the masks and the first tick's keep took 66 of the tick's 166 ms (CODECRT_PROFILE_OPS=1,
   this project's CPU; bench edges). The same products, so the same bits. */
static void cr_rows_scale_kernel(struct ggml_tensor *dst, const struct ggml_tensor *x, const struct ggml_tensor *f,
                                 int ith, int nth, void *user) {
    (void)user;
    const int64_t C = x->ne[0], n = x->ne[1], fn = f->ne[1];
    const int64_t rows = n * x->ne[2], r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    const float *xd = (const float *)x->data, *fd = (const float *)f->data;
    float *od = (float *)dst->data;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = r % n, b = r / n;
        const float k = fd[(fn == 1 ? 0 : t) + fn * b];
        const float *xr = xd + r * C;
        float *o = od + r * C;
        for (int64_t c = 0; c < C; c++) {
            o[c] = xr[c] * k;
        }
    }
}

/* x * f, f [1, n or 1, B] broadcast over x [C, n, B]'s channels (a mask, the first tick's keep):
   the row kernel above on the CPU, ggml's MUL elsewhere. */
static struct ggml_tensor *cr_states_scale(cr_states *s, struct ggml_tensor *x, struct ggml_tensor *f) {
    if (s->cpu && x->type == GGML_TYPE_F32 && f->type == GGML_TYPE_F32 && ggml_is_contiguous(x) &&
        ggml_is_contiguous(f) && f->ne[0] == 1 && (f->ne[1] == 1 || f->ne[1] == x->ne[1]) && f->ne[2] == x->ne[2] &&
        x->ne[3] == 1 && f->ne[3] == 1) {
        return ggml_map_custom2(s->ctx, x, f, cr_rows_scale_kernel, GGML_N_TASKS_MAX, NULL);
    }
    return ggml_mul(s->ctx, x, f);
}

/* The next state's pool tensor, [C*S, slots+1]. One that does not exist or
   has another size fails the graph (io->overflow) and is stood in for by an
   unallocated tensor of the right size, so that building goes on without
   ggml asserting; the failed graph is never allocated or computed. */
static struct ggml_tensor *cr_states_next(cr_states *s, int64_t CS) {
    struct ggml_tensor *pool = s->next < s->n_pool ? s->pool[s->next] : NULL;
    s->io->n_states = ++s->next;
    if (!pool || pool->type != GGML_TYPE_F32 || pool->ne[0] != CS || pool->ne[1] < 1 || ggml_n_dims(pool) > 2) {
        s->io->overflow = true;
        pool = ggml_new_tensor_2d(s->ctx, GGML_TYPE_F32, CS, s->B + 1);
    }
    return pool;
}

struct ggml_tensor *cr_states_append(cr_states *s, struct ggml_tensor *x, int64_t S) {
    struct ggml_context *ctx = s->ctx;
    const int64_t C = x->ne[0], n = x->ne[1], B = x->ne[2];
    struct ggml_tensor *pool = cr_states_next(s, C * S);                 /* [C*S, slots+1] */
    struct ggml_tensor *st = ggml_get_rows(ctx, pool, s->io->slot_read); /* [C*S, B] */
    st = ggml_reshape_3d(ctx, st, C, S, B);
    if (s->io->keep) {
        st = cr_states_scale(s, st, s->io->keep);
    }
    struct ggml_tensor *buf;                                             /* [C, S+n, B] */
    const size_t bytes = (size_t)C * (size_t)(S + n) * (size_t)B * sizeof(float);
    if (s->cpu && bytes <= (size_t)INT32_MAX && (size_t)S * (size_t)C * sizeof(float) < ((size_t)1 << 30)) {
        /* ggml's CPU concat copies element by element; two SETs (row memcpys, one task each)
           make the same buffer: 616 -> 203 ms of a 30 s one-thread SNAC streaming profile.
           ggml_set keeps its strides as int32 and asserts offset < 2^30: larger buffers
           take the concat */
        if (!ggml_is_contiguous(x)) {
            x = ggml_cont(ctx, x);
        }
        buf = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, S + n, B);
        buf = ggml_set_inplace(ctx, buf, st, buf->nb[1], buf->nb[2], buf->nb[3], 0);
        buf = ggml_set_inplace(ctx, buf, x, buf->nb[1], buf->nb[2], buf->nb[3], (size_t)S * buf->nb[1]);
    } else {
        buf = ggml_concat(ctx, st, x, 1);
    }
    /* each stream's last S frames are one run of C*S floats: rows strided by buf's sequence,
       written by set_rows as they lie (no copy into a contiguous tail first) */
    struct ggml_tensor *tail = ggml_view_2d(ctx, buf, C * S, B, buf->nb[2], (size_t)n * buf->nb[1]);
    ggml_build_forward_expand(s->gf, ggml_set_rows(ctx, pool, tail, s->io->slot_write));
    return buf;
}

cr_state_tf cr_states_take_tf(cr_states *s, int64_t S, int64_t C) {
    struct ggml_context *ctx = s->ctx;
    const int64_t B = s->B;
    struct ggml_tensor *pool = cr_states_next(s, S * C);                    /* [S*C, slots+1] */
    struct ggml_tensor *st = ggml_get_rows(ctx, pool, s->io->slot_read);    /* [S*C, B] */
    st = ggml_permute(ctx, ggml_reshape_3d(ctx, st, S, C, B), 0, 2, 1, 3); /* [S, B, C] view */
    if (s->io->keep) {
        st = ggml_mul(ctx, st, ggml_reshape_3d(ctx, s->io->keep, 1, B, 1));
    }
    return (cr_state_tf){pool, st, S};
}

struct ggml_tensor *cr_states_put_tf(cr_states *s, const cr_state_tf *t, struct ggml_tensor *buf) {
    struct ggml_context *ctx = s->ctx;
    const int64_t S = t->S, n = buf->ne[0] - S, B = buf->ne[1], C = buf->ne[2];
    struct ggml_tensor *tail = ggml_view_3d(ctx, buf, S, B, C, buf->nb[1], buf->nb[2], (size_t)n * sizeof(float));
    /* the pool viewed [S, slots+1, C]: rows strided by S*C, channels by S */
    struct ggml_tensor *rows =
        ggml_view_3d(ctx, t->pool, S, t->pool->ne[1], C, t->pool->nb[1], (size_t)S * sizeof(float), 0);
    ggml_build_forward_expand(s->gf, ggml_set_rows(ctx, rows, tail, s->io->slot_write));
    return buf;
}

struct ggml_tensor *cr_states_join_tf(cr_states *s, const cr_state_tf *t, struct ggml_tensor *x) {
    struct ggml_tensor *st = ggml_is_contiguous(t->st) ? t->st : ggml_cont(s->ctx, t->st);
    return cr_states_put_tf(s, t, ggml_concat(s->ctx, st, x, 0)); /* [S+n, B, C] */
}

struct ggml_tensor *cr_states_append_tf(cr_states *s, struct ggml_tensor *x, int64_t S) {
    cr_state_tf t = cr_states_take_tf(s, S, x->ne[2]);
    return cr_states_join_tf(s, &t, x);
}

/* The index inputs of rings of Q blocks of n steps, made on first use (one pair per shape). */
static cr_window_input *cr_states_window_io(cr_states *s, int64_t Q, int64_t n) {
    cr_graph_io *io = s->io;
    for (int i = 0; i < io->n_windows; i++) {
        if (io->windows[i].Q == Q && io->windows[i].n == n) {
            return &io->windows[i];
        }
    }
    if (io->n_windows >= CR_MAX_WINDOWS) {
        io->overflow = true; /* refused as "cannot build the graph", never computed */
        return NULL;
    }
    cr_window_input *w = &io->windows[io->n_windows++];
    *w = (cr_window_input){.Q = Q, .n = n};
    w->read = ggml_new_tensor_1d(s->ctx, GGML_TYPE_I32, Q * s->B);
    w->write = ggml_new_tensor_1d(s->ctx, GGML_TYPE_I32, n * s->B);
    ggml_set_input(w->read);
    ggml_set_input(w->write);
    return w;
}

struct ggml_tensor *cr_states_window(cr_states *s, struct ggml_tensor *x, int64_t S) {
    struct ggml_context *ctx = s->ctx;
    const int64_t C = x->ne[0], n = x->ne[1], B = x->ne[2], W = cr_window_steps(S, n), Q = W / n;
    struct ggml_tensor *pool = cr_states_next(s, C * W); /* [C*W, slots+1]: Q blocks [C, n] a slot */
    cr_window_input *w = cr_states_window_io(s, Q, n);
    if (!w) {
        return ggml_new_tensor_3d(ctx, GGML_TYPE_F32, C, W, B);
    }
    const int64_t slots = pool->ne[1];
    if (x->nb[0] != sizeof(float) || x->nb[2] != (size_t)n * x->nb[1]) {
        x = ggml_cont(ctx, x);
    }
    /* the n new steps of each stream, rows [C] (strided: a view of the qkv product needs no copy),
       into the pool viewed one step a row [C, slots * W] */
    struct ggml_tensor *steps = ggml_view_2d(ctx, pool, C, slots * W, (size_t)C * sizeof(float), 0);
    steps = ggml_set_rows(ctx, steps, ggml_view_2d(ctx, x, C, n * B, x->nb[1], 0), w->write);
    /* then (a view of the write: after it) the window, the pool viewed one block a row */
    struct ggml_tensor *blocks = ggml_view_2d(ctx, steps, C * n, slots * Q, (size_t)(C * n) * sizeof(float), 0);
    struct ggml_tensor *win = ggml_get_rows(ctx, blocks, w->read); /* [C*n, Q*B] */
    return ggml_reshape_3d(ctx, win, C, W, B);
}

/* The point indices 0..n-1 of every stream, F32 [n, B] (one per length). */
static struct ggml_tensor *cr_states_ramp(cr_states *s, int64_t n) {
    for (int i = 0; i < s->n_ramps; i++) {
        if (s->ramps[i].n == n) {
            return s->ramps[i].t;
        }
    }
    struct ggml_tensor *t = ggml_repeat_4d(s->ctx, ggml_arange(s->ctx, 0.0f, (float)n, 1.0f), n, s->B, 1, 1);
    if (s->n_ramps < CR_MAX_TIMES) {
        s->ramps[s->n_ramps++] = (struct cr_states_ramp){n, t};
    }
    return t;
}

/* The 0/1 mask [1, n, B] of the points inside each stream's utterance, built in the graph
   from the stream's bounds (one row pair of io->bounds, filled per tick by stream.c). */
static struct ggml_tensor *cr_states_valid(cr_states *s, int64_t n, int32_t rate, int32_t delay) {
    for (int i = 0; i < s->n_masks; i++) {
        if (s->masks[i].rate == rate && s->masks[i].delay == delay && s->masks[i].n == n) {
            return s->masks[i].t;
        }
    }
    struct ggml_context *ctx = s->ctx;
    cr_graph_io *io = s->io;
    const int64_t B = s->B;
    if (io->n_bounds >= CR_MAX_TIMES || s->n_masks >= CR_MAX_TIMES) {
        io->overflow = true; /* refused as "cannot build the graph", never computed */
        return ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, n, B);
    }
    if (!io->bounds) {
        io->bounds = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, B, 2 * CR_MAX_TIMES);
        ggml_set_input(io->bounds);
        s->bounds = ggml_cont(ctx, io->bounds);
    }
    const int k = io->n_bounds++;
    cr_io_add_time(io, NULL, CR_TIME_MASK, rate, delay, k, n);
    const size_t row = (size_t)B * sizeof(float);
    struct ggml_tensor *lo1 = ggml_reshape_2d(ctx, ggml_view_1d(ctx, s->bounds, B, (size_t)(2 * k) * row), 1, B);
    struct ggml_tensor *hi = ggml_reshape_2d(ctx, ggml_view_1d(ctx, s->bounds, B, (size_t)(2 * k + 1) * row), 1, B);
    struct ggml_tensor *i = cr_states_ramp(s, n);                                   /* [n, B] */
    struct ggml_tensor *from = ggml_clamp(ctx, ggml_sub(ctx, i, lo1), 0.0f, 1.0f);   /* i >= lo */
    struct ggml_tensor *to = ggml_clamp(ctx, ggml_scale(ctx, ggml_sub(ctx, i, hi), -1.0f), 0.0f, 1.0f); /* i < hi */
    struct ggml_tensor *t = ggml_reshape_3d(ctx, ggml_mul(ctx, from, to), 1, n, B);
    s->masks[s->n_masks++] = (struct cr_states_mask){rate, delay, n, t};
    return t;
}

struct ggml_tensor *cr_states_time(cr_states *s, int32_t kind, int64_t n, int32_t rate, int32_t delay,
                                   int32_t site) {
    if (kind == CR_TIME_MASK) {
        return cr_states_valid(s, n, rate, delay);
    }
    struct ggml_tensor *t = kind == CR_TIME_POS ? ggml_new_tensor_1d(s->ctx, GGML_TYPE_I32, n * s->B)
                                                : ggml_new_tensor_3d(s->ctx, GGML_TYPE_F32, 1, n, s->B);
    ggml_set_input(t);
    cr_io_add_time(s->io, t, kind, rate, delay, site, n);
    return t;
}

struct ggml_tensor *cr_states_mask(cr_states *s, struct ggml_tensor *x, int32_t rate, int32_t delay) {
    if (!s->masked) {
        return x;
    }
    return cr_states_scale(s, x, cr_states_time(s, CR_TIME_MASK, x->ne[1], rate, delay, 0));
}

struct ggml_tensor *cr_states_mask_of(cr_states *s, int64_t n, int32_t rate, int32_t delay) {
    if (!s->masked) {
        return NULL;
    }
    return ggml_reshape_2d(s->ctx, cr_states_time(s, CR_TIME_MASK, n, rate, delay, 0), n, s->B);
}
