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
#include "layers.h"
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

/* m's stream graph for a 4-stream tick of two chunks, in ctx with its state
   pools; it must take every listed state, in order, and no other. */
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
    struct ggml_cgraph *gf = m->arch->build_stream(m, ctx, m->weights, &shape, pool, n_states, &io);
    CHECK(io.n_states == n_states && !io.overflow, "stream graph (cpu_ops %d, masked %d) took %d states of %d%s",
          cpu_ops, masked, io.n_states, n_states, io.overflow ? " and failed" : "");
    return gf;
}

static void check_model(const cr_model *m, const test_cfg *c) {
    const int want = c->n_rates * 7 + 1; /* per block: its Snake and 3 units of 2; the output Snake */
    for (int masked = 0; masked < 2; masked++) {
        for (int tf = 0; tf < 2; tf++) {
            struct ggml_context *ctx = graph_ctx();
            const cr_decode_shape shape = {.n_frames = 16, .n_batch = 3, .noise = true, .masked = masked,
                                           .cpu_ops = false, .time_fastest = tf};
            cr_graph_io io;
            memset(&io, 0, sizeof(io));
            struct ggml_cgraph *gf = m->arch->build_decode(m, ctx, m->weights, &shape, &io);
            const int got = fusable_snakes(gf);
            CHECK(got == want, "%s decode (masked %d, tf %d): %d fusable Snakes, want %d", c->name, masked, tf, got,
                  want);
            /* transposes: channels fastest, two around every Snake or Snake-conv-Snake core and the
               depthwise kernels' (11 per block, 2 for the output Snake); time fastest, as the stream:
               per block one into the residual stream, one before the upsampling product and one
               before each unit's 1x1 conv, plus the entry, the output Snake's and the kernels' */
            const int want_t = tf ? 1 + c->n_rates * (2 + 3 + 3) + 1 : c->n_rates * 11 + 2;
            CHECK(copies(gf, true) == want_t, "%s decode (masked %d, tf %d): %d transposes, want %d", c->name,
                  masked, tf, copies(gf, true), want_t);
            ggml_free(ctx);
        }
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
           and go back without a copy (a channels-fastest state's tail too:
           set_rows writes it as it lies); the rest is at the frame rate
           (attention's window, v and output) and the last conv's first column;
           an edge tick copies its mask bounds once into the graph
           (stream_state.c: one scheduler input) */
        const int want_c = (c == &k_attn ? 5 : 1) + (masked ? 1 : 4 * c->n_rates + 1);
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

/*
 * The shape guard, and the graphs GPUs run at lengths past ggml CUDA's launch
 * grid (65,535 blocks in y and z). A pad along time with time in ne1 is what
 * aborted decodes of 2.73 s and more at 24 kHz; the guard must see it, and no
 * graph the runtime builds may contain it, at any length or batch.
 */
static const test_cfg k_24k = {"24k", 32, 64, 0, 32, 8, 1, 4, {8, 8, 4, 2}, 3, {4, 2, 1}};
/* the 32 and 44.1 kHz models: hop 384, local attention in windows of 32 frames */
static const test_cfg k_44k = {"44k", 32, 64, 32, 32, 8, 1, 4, {8, 8, 3, 2}, 4, {8, 4, 2, 1}};

static void check_guard_refuses(void) {
    const cr_limits gpu = {.grid_yz = 65535, .max_elements = CR_MAX_TENSOR_ELEMENTS, .piece_elements = 0};
    const cr_limits cpu = {.grid_yz = 0, .max_elements = CR_MAX_TENSOR_ELEMENTS, .piece_elements = 0};
    struct ggml_context *ctx = graph_ctx();
    cr_err err = {{0}};
    /* [C, T, B] padded along T: ne1 = 70002 goes to grid y */
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 8, 70000, 1);
    struct ggml_tensor *p = ggml_pad_ext(ctx, x, 0, 0, 1, 1, 0, 0, 0, 0);
    CHECK(cr_guard_node(&gpu, p, &err) == CODECRT_E_TOO_LARGE && strstr(err.msg, "ne1 = 70002"),
          "guard: a pad with ne1 = 70002 passed (%s)", err.msg);
    CHECK(cr_guard_node(&cpu, p, &err) == CODECRT_OK, "guard: the CPU refused a pad it can run");
    /* the same pad with time in ne0 passes */
    struct ggml_tensor *q = ggml_pad_ext(ctx, ggml_reshape_2d(ctx, x, 8 * 70000, 1), 8, 8, 0, 0, 0, 0, 0, 0);
    CHECK(cr_guard_node(&gpu, q, &err) == CODECRT_OK, "guard: a pad along ne0 was refused: %s", err.msg);
    /* a softmax over 70000 heads, a norm over 70000 sequences */
    struct ggml_tensor *s = ggml_soft_max(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4, 4, 70000));
    CHECK(cr_guard_node(&gpu, s, &err) == CODECRT_E_TOO_LARGE, "guard: softmax with ne2 = 70000 passed");
    struct ggml_tensor *n = ggml_norm(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 4, 1, 1, 70000), 1e-5f);
    CHECK(cr_guard_node(&gpu, n, &err) == CODECRT_E_TOO_LARGE, "guard: norm with ne3 = 70000 passed");
    /* 2^31 elements: past int indexing, on every backend */
    struct ggml_tensor *big = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1 << 16, 1 << 15);
    CHECK(cr_guard_node(&cpu, big, &err) == CODECRT_E_TOO_LARGE && strstr(err.msg, "2147483648 elements"),
          "guard: a tensor of 2^31 elements passed (%s)", err.msg);
    ggml_free(ctx);
}

/* A node that no backend of the set runs (a product with an F16 second operand beside an
   F32 first: what an F16 model's time-fastest graphs once built, and ggml's scheduler
   asserted on) is refused, naming the op and types; the same product with the weight cast
   (cr_f32) passes. */
static void check_guard_unsupported(void) {
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    CHECK(cpu != NULL, "a CPU backend");
    if (!cpu) {
        return;
    }
    struct ggml_context *ctx = graph_ctx();
    cr_err err = {{0}};
    struct ggml_tensor *y = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 16, 40); /* [C, n*B] */
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 16, 8);  /* [C, Cout] */
    struct ggml_cgraph *bad = ggml_new_graph(ctx);
    ggml_build_forward_expand(bad, ggml_mul_mat(ctx, y, w));
    CHECK(cr_guard_supported(&cpu, 1, bad, &err) == CODECRT_E_UNSUPPORTED && strstr(err.msg, "MUL_MAT") &&
              strstr(err.msg, "f32, f16"),
          "guard: a product with an F16 second operand passed (%s)", err.msg);
    struct ggml_cgraph *good = ggml_new_graph(ctx);
    ggml_build_forward_expand(good, ggml_mul_mat(ctx, y, cr_f32(ctx, w)));
    CHECK(cr_guard_supported(&cpu, 1, good, &err) == CODECRT_OK, "guard: the cast product was refused (%s)",
          err.msg);
    ggml_free(ctx);
    ggml_backend_free(cpu);
}

/* m's GPU graphs (cpu_ops off) at n_frames x n_batch pass the GPU limits. */
static void check_gpu_decode_shapes(const cr_model *m, const char *name, int32_t n_frames, int32_t n_batch) {
    const cr_limits gpu = {.grid_yz = 65535, .max_elements = CR_MAX_TENSOR_ELEMENTS, .piece_elements = 0};
    for (int masked = 0; masked < 2; masked++) {
        for (int tf = 0; tf < 2; tf++) { /* both offline layouts */
            struct ggml_context *ctx = graph_ctx();
            const cr_decode_shape shape = {.n_frames = n_frames, .n_batch = n_batch, .noise = true,
                                           .masked = masked, .cpu_ops = false, .time_fastest = tf};
            cr_graph_io io;
            memset(&io, 0, sizeof(io));
            struct ggml_cgraph *gf = m->arch->build_decode(m, ctx, m->weights, &shape, &io);
            cr_err err = {{0}};
            const codecrt_status st = cr_guard_graph(&gpu, gf, &err);
            CHECK(st == CODECRT_OK, "%s GPU decode %d frames x %d (masked %d, tf %d): %s", name, n_frames, n_batch,
                  masked, tf, err.msg);
            ggml_free(ctx);
        }
    }
}

static void check_gpu_stream_shapes(const cr_model *m, const char *name, int32_t n_batch) {
    const cr_limits gpu = {.grid_yz = 65535, .max_elements = CR_MAX_TENSOR_ELEMENTS, .piece_elements = 0};
    cr_state_spec specs[CR_MAX_STATES];
    const int n_states = m->arch->stream_states(m, specs, CR_MAX_STATES);
    for (int masked = 0; masked < 2; masked++) {
        struct ggml_context *ctx = graph_ctx();
        struct ggml_tensor *pool[CR_MAX_STATES];
        for (int s = 0; s < n_states; s++) {
            pool[s] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, specs[s].channels * specs[s].frames, n_batch + 1);
        }
        const cr_stream_shape shape = {.chunk = m->info.frame_multiple, .n_batch = n_batch, .cpu_ops = false,
                                       .masked = masked};
        cr_graph_io io;
        memset(&io, 0, sizeof(io));
        struct ggml_cgraph *gf = m->arch->build_stream(m, ctx, m->weights, &shape, pool, n_states, &io);
        cr_err err = {{0}};
        CHECK(cr_guard_graph(&gpu, gf, &err) == CODECRT_OK, "%s GPU stream tick of %d streams (masked %d): %s", name,
              n_batch, masked, err.msg);
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
    check_guard_refuses();
    check_guard_unsupported();
    {
        /* the 24 kHz model's rates and strides (hop 512), narrow channels: the
           shapes that matter here are time and batch */
        char path[512], err[512];
        snprintf(path, sizeof(path), "%s/24k.gguf", dir);
        write_model(path, &k_24k, "snac", NULL, NULL);
        codecrt_model *m = NULL;
        CHECK_OK(codecrt_model_load(path, &m, err, sizeof(err)));
        if (m) {
            /* 124 frames decoded on CUDA, 128 (65,536 samples) aborted; 300 s is 14,064 frames */
            const int32_t frames[] = {124, 128, 132, 240, 2816, 14064};
            for (size_t i = 0; i < sizeof(frames) / sizeof(frames[0]); i++) {
                check_gpu_decode_shapes(&m->m, "24k", frames[i], 1);
            }
            check_gpu_decode_shapes(&m->m, "24k", 128, 64);
            check_gpu_decode_shapes(&m->m, "24k", 2816, 16);
            check_gpu_stream_shapes(&m->m, "24k", 4096);
            codecrt_model_free(m);
        }
        remove(path);
        snprintf(path, sizeof(path), "%s/44k.gguf", dir);
        write_model(path, &k_44k, "snac", NULL, NULL);
        m = NULL;
        CHECK_OK(codecrt_model_load(path, &m, err, sizeof(err)));
        if (m) {
            /* 44.1 kHz aborted from 1.95 s (224 frames); 300 s is 34,464 frames */
            const int32_t frames[] = {160, 224, 256, 7008, 34464};
            for (size_t i = 0; i < sizeof(frames) / sizeof(frames[0]); i++) {
                check_gpu_decode_shapes(&m->m, "44k", frames[i], 1);
            }
            check_gpu_decode_shapes(&m->m, "44k", 224, 64);
            check_gpu_stream_shapes(&m->m, "44k", 4096);
            codecrt_model_free(m);
        }
        remove(path);
    }
    rmdir(dir);
    printf("test_graphs: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
