/*
 * test_graphs.c: the structure of the graphs that GPUs run. ggml's CUDA and
 * Vulkan backends fuse a Snake only when its five nodes (mul, sin, sqr, mul,
 * add) are consecutive in the graph, on a contiguous 2-D time-fastest input
 * with [1, C] parameters; anything else silently runs five kernels instead of
 * one. CI has no GPU, so this checks the pattern on the graphs themselves,
 * built as a GPU context builds them (cpu_ops = false), offline and streaming.
 */
#define _POSIX_C_SOURCE 200809L
#include "ggml.h"
#include "internal.h"
#include "test_common.h"

/* Snakes in gf that a backend can fuse: the five ops in a row, wired as one Snake. */
static int fusable_snakes(struct ggml_cgraph *gf) {
    int found = 0;
    const int n = ggml_graph_n_nodes(gf);
    for (int i = 0; i + 4 < n; i++) {
        struct ggml_tensor *m0 = ggml_graph_node(gf, i), *sn = ggml_graph_node(gf, i + 1),
                           *sq = ggml_graph_node(gf, i + 2), *m1 = ggml_graph_node(gf, i + 3),
                           *ad = ggml_graph_node(gf, i + 4);
        if (m0->op != GGML_OP_MUL || sn->op != GGML_OP_SIN || sq->op != GGML_OP_SQR || m1->op != GGML_OP_MUL ||
            ad->op != GGML_OP_ADD) {
            continue;
        }
        const struct ggml_tensor *x = m0->src[0], *a = m0->src[1], *ia = m1->src[1];
        const bool wired = sn->src[0] == m0 && sq->src[0] == sn && m1->src[0] == sq && ad->src[0] == x &&
                           ad->src[1] == m1;
        const bool shaped = ggml_is_contiguous(x) && x->ne[2] == 1 && x->ne[3] == 1 && a->ne[0] == 1 &&
                            a->ne[1] == x->ne[1] && ggml_are_same_shape(a, ia);
        CHECK(wired && shaped, "node %d: a Snake-like run that a backend would not fuse", i);
        found += wired && shaped;
        i += 4;
    }
    return found;
}

/*
 * Products whose second operand is batched ([K, T, B], B > 1) with T <= 16 go
 * to ggml CUDA's small-batch kernel once per sequence, rereading the weights
 * B times (1.4 ms of a 20 ms tick on an H200). Every such product must be
 * taken as one [K, T*B] product instead.
 */
static int small_batched_products(struct ggml_cgraph *gf) {
    int found = 0;
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        const struct ggml_tensor *t = ggml_graph_node(gf, i);
        if (t->op == GGML_OP_MUL_MAT && t->src[0]->ne[2] == 1 && t->src[1]->ne[2] > 1 && t->src[1]->ne[1] <= 16) {
            found++;
        }
    }
    return found;
}

/* Copies (GGML_OP_CONT) that transpose, or not: each is a pass over a tensor. */
static int copies(struct ggml_cgraph *gf, bool transposing) {
    int found = 0;
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        const struct ggml_tensor *t = ggml_graph_node(gf, i);
        found += t->op == GGML_OP_CONT && (t->src[0]->op == GGML_OP_TRANSPOSE) == transposing;
    }
    return found;
}

static int count_op(struct ggml_cgraph *gf, enum ggml_op op) {
    int found = 0;
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        found += ggml_graph_node(gf, i)->op == op;
    }
    return found;
}

static struct ggml_context *graph_ctx(void) {
    struct ggml_init_params ip = {
        .mem_size = ggml_tensor_overhead() * CR_GRAPH_SIZE + ggml_graph_overhead_custom(CR_GRAPH_SIZE, false),
        .no_alloc = true,
    };
    struct ggml_context *ctx = ggml_init(ip);
    CHECK(ctx != NULL, "ggml_init");
    return ctx;
}

/* m's stream graph for a 4-stream tick of two chunks, in ctx with its state pools. */
static struct ggml_cgraph *stream_graph(struct ggml_context *ctx, const cr_model *m, const cr_state_spec *specs,
                                        int n_states, bool cpu_ops, bool masked) {
    struct ggml_tensor *pool[CR_MAX_STATES];
    for (int s = 0; s < n_states; s++) {
        pool[s] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, specs[s].channels * specs[s].frames, 5);
    }
    const cr_stream_shape shape = {.chunk = m->info.frame_multiple * 2, .n_batch = 4, .cpu_ops = cpu_ops,
                                   .masked = masked};
    cr_graph_io io;
    memset(&io, 0, sizeof(io));
    return m->arch->build_stream(m, ctx, m->weights, &shape, pool, &io);
}

static void check_model(const cr_model *m, const test_cfg *c) {
    const int want = c->n_rates * 7 + 1; /* per block: its Snake and 3 units of 2; the output Snake */
    for (int masked = 0; masked < 2; masked++) {
        struct ggml_context *ctx = graph_ctx();
        const cr_decode_shape shape = {.n_frames = 16, .n_batch = 3, .noise = true, .masked = masked,
                                       .cpu_ops = false};
        cr_graph_io io;
        memset(&io, 0, sizeof(io));
        struct ggml_cgraph *gf = m->arch->build_decode(m, ctx, m->weights, &shape, &io);
        const int got = fusable_snakes(gf);
        CHECK(got == want, "%s decode (masked %d): %d fusable Snakes, want %d", c->name, masked, got, want);
        ggml_free(ctx);
    }
    cr_state_spec specs[CR_MAX_STATES];
    const int n_states = m->arch->stream_states(m, specs, CR_MAX_STATES);
    CHECK(n_states <= CR_MAX_STATES, "states");
    for (int masked = 0; masked < 2; masked++) {
        struct ggml_context *ctx = graph_ctx();
        struct ggml_cgraph *gf = stream_graph(ctx, m, specs, n_states, false, masked);
        const int got = fusable_snakes(gf);
        CHECK(got == want, "%s stream (masked %d): %d fusable Snakes, want %d", c->name, masked, got, want);
        CHECK(small_batched_products(gf) == 0, "%s stream: %d products per sequence", c->name,
              small_batched_products(gf));
        /* the residual stream stays time fastest: per block one transpose into
           it, one before the upsampling product and one before each unit's 1x1
           conv, plus the entry, the last conv's and the 3-per-block weight views */
        const int want_t = 1 + c->n_rates * (2 + 3 + 3) + 1;
        CHECK(copies(gf, true) == want_t, "%s stream: %d transposes, want %d", c->name, copies(gf, true), want_t);
        /* the blocks' states (4 per block and the last conv's) come in with
           one small reorder each (folded into keep's product on edge ticks)
           and go back without a copy; the rest is at the frame rate (the
           entry conv's state tail; attention's window, state, v and output)
           and the last conv's first column */
        const int want_c = (c == &k_attn ? 7 : 2) + (masked ? 0 : 4 * c->n_rates + 1);
        CHECK(copies(gf, false) == want_c, "%s stream: %d other copies, want %d", c->name, copies(gf, false),
              want_c);
        ggml_free(ctx);
    }
    /* the CPU's stream graphs use the fused CPU Snake: no composed sines */
    for (int masked = 0; masked < 2; masked++) {
        struct ggml_context *ctx = graph_ctx();
        struct ggml_cgraph *gf = stream_graph(ctx, m, specs, n_states, true, masked);
        CHECK(count_op(gf, GGML_OP_SIN) == 0, "%s CPU stream (masked %d): %d composed Snakes", c->name, masked,
              count_op(gf, GGML_OP_SIN));
        ggml_free(ctx);
    }
}

int main(void) {
    char dir[] = "/tmp/codecrt-graphs-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    const test_cfg *cfgs[] = {&k_plain, &k_attn};
    for (int i = 0; i < 2; i++) {
        char path[512], err[512];
        snprintf(path, sizeof(path), "%s/%s.gguf", dir, cfgs[i]->name);
        write_model(path, cfgs[i], "snac", NULL, NULL);
        codecrt_model *m = NULL;
        codecrt_status st = codecrt_model_load(path, &m, err, sizeof(err));
        CHECK(st == CODECRT_OK, "load %s: %s", cfgs[i]->name, err);
        if (st == CODECRT_OK) {
            check_model(&m->m, cfgs[i]);
            codecrt_model_free(m);
        }
        remove(path);
    }
    rmdir(dir);
    printf("test_graphs: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
