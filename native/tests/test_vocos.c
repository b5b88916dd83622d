/*
 * test_vocos.c: the Vocos-style decoders (WavTokenizer, NeuCodec, XCodec2)
 * without a GPU or a reference:
 *   - the fused CPU GELU against erf in double precision;
 *   - the graphs GPUs run (cpu_ops off), built at the longest decode the
 *     context accepts (these codecs attend over the whole utterance, so a
 *     decode is one graph: its largest tensor, the attention scores, bounded
 *     by the piece budget), unmasked and masked, batch 1 to 64: every node
 *     passes the shape guard with CUDA's limits (launch grid 65,535 in y and
 *     z, INT32_MAX elements);
 *   - the architectures' max_tensor_elements, which the context plans with,
 *     bound every tensor of both the GPU and the CPU graphs;
 *   - small decodes on the CPU, exact and bucketed (masked), one frame to a
 *     batch of three: finite and equal.
 */
#define _POSIX_C_SOURCE 200809L
#include "ggml.h"
#include "gguf.h"
#include "internal.h"
#include "test_common.h"
#include "vocos/vocos.h"

typedef struct hp_kv {
    const char *key;
    uint32_t value;
} hp_kv;

/* Write a model of arch with the given u32 hyperparameters (and FSQ levels), tensors from the
   architecture's own list, filled with small deterministic values (a Hann window). */
static void write_vocos_model(const char *path, const char *arch, const hp_kv *kv, int n_kv, const int32_t *levels,
                              int n_levels) {
    struct gguf_context *g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", arch);
    gguf_set_val_u32(g, "codecd.format_version", 1);
    char key[96];
    for (int i = 0; i < n_kv; i++) {
        snprintf(key, sizeof(key), "%s.%s", arch, kv[i].key);
        gguf_set_val_u32(g, key, kv[i].value);
    }
    if (levels) {
        snprintf(key, sizeof(key), "%s.fsq_levels", arch);
        gguf_set_arr_data(g, key, GGUF_TYPE_INT32, levels, (size_t)n_levels);
    }
    const cr_arch *a = cr_arch_find(arch);
    void *hp = calloc(1, a->hparams_size);
    cr_err e = {{0}};
    if (a->read_hparams(g, hp, &e) != CODECRT_OK) {
        fprintf(stderr, "test model hparams: %s\n", e.msg);
        exit(2);
    }
    cr_spec_list *specs = calloc(1, sizeof(*specs));
    a->tensor_specs(hp, specs);
    size_t bytes = 0;
    for (int i = 0; i < specs->n; i++) {
        bytes += (size_t)(specs->items[i].ne[0] * specs->items[i].ne[1] * specs->items[i].ne[2]) * sizeof(float) + 64;
    }
    struct ggml_init_params ip = {.mem_size = bytes + ggml_tensor_overhead() * (size_t)(specs->n + 1),
                                  .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(ip);
    for (int i = 0; i < specs->n; i++) {
        const cr_tensor_spec *s = &specs->items[i];
        struct ggml_tensor *t = ggml_new_tensor(ctx, GGML_TYPE_F32, s->n_dims, s->ne);
        ggml_set_name(t, s->name);
        float *d = t->data;
        const int64_t n = ggml_nelements(t);
        const bool window = strcmp(s->name, "head.window") == 0;
        for (int64_t k = 0; k < n; k++) {
            d[k] = window ? 0.5f - 0.5f * cosf(6.28318530718f * (float)k / (float)n) : (frand() - 0.5f) * 0.1f;
        }
        gguf_add_tensor(g, t);
    }
    if (!gguf_write_to_file(g, path, false)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    ggml_free(ctx);
    gguf_free(g);
    free(specs);
    free(hp);
}

/* GELU against 0.5 x erfc(-x / sqrt 2) in double over [-12, 12]. The rounding of z = |x|/sqrt 2
   alone moves exp(-z^2) by z^2 * 2^-23 relative, so the bound is 5e-7 (1 + x^2 / 2) relative (1.5e-6
   relative at |x| = 2, 1.7e-5 at 8, where GELU is below 1e-15); PyTorch's own float GELU, 1 + erf(.),
   loses all relative precision there. */
static void check_gelu(void) {
    double worst = 0.0, at = 0.0;
    for (int i = -12 * 4096; i <= 12 * 4096; i++) {
        const float x = (float)i / 4096.0f;
        const double want = 0.5 * (double)x * erfc(-(double)x / sqrt(2.0));
        if (want == 0.0) {
            continue;
        }
        const double r = fabs((double)vc_gelu_ref(x) - want) / fabs(want) / (1.0 + 0.5 * (double)x * x);
        if (r > worst) {
            worst = r;
            at = x;
        }
    }
    printf("fused GELU: worst relative error / (1 + x^2/2) %.2e at x = %.4f\n", worst, at);
    CHECK(worst < 5e-7, "fused GELU: relative error / (1 + x^2/2) %.2e at x = %g", worst, at);
}

/* The head's sine and cosine against double over [-2000, 2000] (phases out of a linear layer):
   absolute error below 3e-7 (a float's rounding of sin near 1 is 6e-8). */
static void check_sincos(void) {
    double worst = 0.0, at = 0.0;
    for (int i = -2000 * 1024; i <= 2000 * 1024; i += 7) {
        const float x = (float)i / 1024.0f;
        float s, c;
        vc_sincos_ref(x, &s, &c);
        const double e = fmax(fabs((double)s - sin((double)x)), fabs((double)c - cos((double)x)));
        if (e > worst) {
            worst = e;
            at = x;
        }
    }
    printf("fused sincos: worst absolute error %.2e at x = %.4f\n", worst, at);
    CHECK(worst < 3e-7, "fused sincos: absolute error %.2e at x = %g", worst, at);
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

/* Largest computed tensor of gf: nodes and their sources, but not weights or views of them (the
   weights are allocated already; a graph's own tensors are not). */
static bool is_weight(const struct ggml_tensor *t) {
    return t->buffer != NULL || (t->view_src && t->view_src->buffer != NULL);
}

static int64_t graph_max_elements(struct ggml_cgraph *gf) {
    int64_t best = 0;
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        const struct ggml_tensor *t = ggml_graph_node(gf, i);
        for (int s = -1; s < GGML_MAX_SRC; s++) {
            const struct ggml_tensor *u = s < 0 ? t : t->src[s];
            if (u && !is_weight(u) && ggml_nelements(u) > best) {
                best = ggml_nelements(u);
            }
        }
    }
    return best;
}

/* The decode graphs of m at T x B (GPU and CPU, unmasked and masked): the GPU ones pass CUDA's
   limits, and the architecture's estimate bounds every tensor. */
static void check_shape(const cr_model *m, const char *name, int32_t T, int32_t B) {
    const cr_limits gpu = {.grid_yz = 65535, .max_elements = CR_MAX_TENSOR_ELEMENTS, .piece_elements = 0};
    const int64_t est = m->arch->max_tensor_elements(m, T, B, 0);
    for (int cpu_ops = 0; cpu_ops < 2; cpu_ops++) {
        for (int masked = 0; masked < 2; masked++) {
            struct ggml_context *ctx = graph_ctx();
            const cr_decode_shape shape = {.n_frames = T, .n_batch = B, .masked = masked, .cpu_ops = cpu_ops,
                                           .frames_masked = masked};
            cr_graph_io io;
            memset(&io, 0, sizeof(io));
            struct ggml_cgraph *gf = m->arch->build_decode(m, ctx, m->weights, &shape, &io);
            if (!cpu_ops) {
                cr_err err = {{0}};
                CHECK(cr_guard_graph(&gpu, gf, &err) == CODECRT_OK, "%s GPU decode %d frames x %d (masked %d): %s",
                      name, T, B, masked, err.msg);
            }
            const int64_t big = graph_max_elements(gf);
            CHECK(big <= est, "%s %s decode %d x %d (masked %d): a tensor of %lld elements, estimate %lld", name,
                  cpu_ops ? "CPU" : "GPU", T, B, masked, (long long)big, (long long)est);
            CHECK(io.t[VC_IO_OUT] && io.t[VC_IO_OUT]->ne[0] == (int64_t)T * m->info.hop_length &&
                      io.t[VC_IO_OUT]->ne[1] == B,
                  "%s decode %d x %d: output shape", name, T, B);
            ggml_free(ctx);
        }
    }
}

/* The longest decode of B sequences the context plans as one graph (estimate <= the piece budget). */
static int32_t longest(const cr_model *m, int32_t B) {
    int32_t lo = 1, hi = 1 << 20;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo + 1) / 2;
        if (m->arch->max_tensor_elements(m, mid, B, 0) <= CR_PIECE_ELEMENTS) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

/* Decode on the CPU (fused kernels, or with CODECRT_PORTABLE_OPS the graphs GPUs run): finite,
   exactly hop samples per frame, and a bucketed context (masked graphs, padded frames and
   sequences) gives the exact-shape samples up to rounding. Exercises the host inputs (envelope,
   masks, FSQ vectors) under the sanitizers. */
static void check_decode(const char *path, const char *label) {
    char err[512];
    codecrt_model *m = NULL;
    CHECK_OK(codecrt_model_load(path, &m, err, sizeof(err)));
    if (!m) {
        return;
    }
    codecrt_model_info info;
    codecrt_model_get_info(m, &info);
    codecrt_context_params p = codecrt_context_default_params();
    p.device = "cpu";
    p.n_threads = 1; /* small graphs: no thread barriers to wait on (the machine is shared) */
    codecrt_context *exact = NULL, *bucketed = NULL;
    CHECK_OK(codecrt_context_init(m, &p, &exact, err, sizeof(err)));
    p.frame_bucket = 16;
    p.batch_bucket = 1;
    CHECK_OK(codecrt_context_init(m, &p, &bucketed, err, sizeof(err)));
    const int32_t shapes[][2] = {{1, 1}, {3, 1}, {37, 3}, {16, 2}};
    for (size_t s = 0; exact && bucketed && s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const int32_t T = shapes[s][0], B = shapes[s][1];
        int32_t *codes = malloc(sizeof(int32_t) * (size_t)(T * B));
        for (int32_t i = 0; i < T * B; i++) {
            codes[i] = (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)info.codebook_size[0]);
        }
        const int32_t *levels[1] = {codes};
        const int64_t lengths[1] = {T};
        const codecrt_codes c = {.n_batch = B, .n_levels = 1, .levels = levels, .lengths = lengths};
        const size_t n = (size_t)T * (size_t)B * (size_t)info.hop_length;
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        size_t na = 0, nb = 0;
        CHECK_OK(codecrt_decode(exact, NULL, &c, a, n, &na));
        CHECK_OK(codecrt_decode(bucketed, NULL, &c, b, n, &nb));
        double d2 = 0.0, a2 = 0.0;
        bool finite = na == n && nb == n;
        for (size_t i = 0; i < n && finite; i++) {
            finite = isfinite(a[i]) && isfinite(b[i]);
            d2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            a2 += (double)a[i] * a[i];
        }
        CHECK(finite && a2 > 0.0, "%s decode %d x %d: %zu / %zu samples, finite %d", label, T, B, na, nb, finite);
        CHECK(sqrt(d2 / (a2 + 1e-30)) < 1e-5, "%s decode %d x %d: bucketed differs, relative %.2e", label, T, B,
              sqrt(d2 / (a2 + 1e-30)));
        free(a);
        free(b);
        free(codes);
    }
    codecrt_context_free(bucketed);
    codecrt_context_free(exact);
    codecrt_model_free(m);
}

static void check_model(const char *dir, const char *arch, const char *label, const hp_kv *kv, int n_kv,
                        const int32_t *levels, int n_levels) {
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/%s.gguf", dir, label);
    write_vocos_model(path, arch, kv, n_kv, levels, n_levels);
    check_decode(path, label);
    codecrt_model *m = NULL;
    CHECK_OK(codecrt_model_load(path, &m, err, sizeof(err)));
    if (m) {
        const int32_t batches[] = {1, 4, 64};
        for (size_t i = 0; i < sizeof(batches) / sizeof(batches[0]); i++) {
            const int32_t B = batches[i], T = longest(&m->m, B);
            printf("%s: longest one-graph decode at batch %d: %d frames (%.1f s)\n", label, B, T,
                   (double)T * m->m.info.hop_length / m->m.info.sample_rate);
            check_shape(&m->m, label, T, B);
            check_shape(&m->m, label, 1, B);
            check_shape(&m->m, label, 37, B);
        }
        codecrt_model_free(m);
    }
    remove(path);
}

int main(void) {
    check_gelu();
    check_sincos();
    char dir[] = "/tmp/codecrt-vocos-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    /* the released iSTFT shapes and head counts; narrow channels (time and batch are what matter) */
    const hp_kv wt75[] = {{"sample_rate", 24000}, {"hop_length", 320}, {"n_fft", 1280}, {"input_dim", 32},
                          {"dim", 64}, {"intermediate_dim", 96}, {"n_layers", 2}, {"codebook_size", 4096},
                          {"n_groups", 32}};
    check_model(dir, "wavtokenizer", "wavtokenizer-75", wt75, 9, NULL, 0);
    const hp_kv wt40[] = {{"sample_rate", 24000}, {"hop_length", 600}, {"n_fft", 2400}, {"input_dim", 32},
                          {"dim", 64}, {"intermediate_dim", 96}, {"n_layers", 1}, {"codebook_size", 4096},
                          {"n_groups", 32}};
    check_model(dir, "wavtokenizer", "wavtokenizer-40", wt40, 9, NULL, 0);
    const int32_t fsq[8] = {4, 4, 4, 4, 4, 4, 4, 4};
    const hp_kv ncp[] = {{"sample_rate", 24000}, {"hop_length", 480}, {"n_fft", 1920}, {"dim", 256},
                         {"n_layers", 2}, {"n_heads", 16}, {"ffn_dim", 1024}, {"n_groups", 32}};
    check_model(dir, "neucodec", "neucodec", ncp, 8, fsq, 8);
    const hp_kv xcp[] = {{"sample_rate", 16000}, {"hop_length", 320}, {"n_fft", 1280}, {"dim", 256},
                         {"n_layers", 1}, {"n_heads", 16}, {"ffn_dim", 1024}, {"n_groups", 32}};
    check_model(dir, "xcodec2", "xcodec2", xcp, 8, fsq, 8);
    rmdir(dir);
    printf("test_vocos: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
