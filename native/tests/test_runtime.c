/*
 * test_runtime.c: the runtime through its public API, on small random SNAC
 * models written here with ggml's GGUF writer. Built with and without
 * AddressSanitizer (make asan). Exits non-zero on the first failed check.
 *
 * The model writer uses the architecture's own tensor list (a white-box
 * shortcut); numerical parity with the reference lives in the Python tests.
 */
#define _POSIX_C_SOURCE 200809L
#include "test_common.h"

static codecrt_context *new_ctx(codecrt_model *m, int32_t frame_bucket, int32_t batch_bucket) {
    codecrt_context_params p = codecrt_context_default_params();
    p.device = "cpu";
    p.n_threads = 2;
    p.max_frames = 256;
    p.max_batch = 8;
    p.frame_bucket = frame_bucket;
    p.batch_bucket = batch_bucket;
    codecrt_context *ctx = NULL;
    char err[256];
    codecrt_status st = codecrt_context_init(m, &p, &ctx, err, sizeof(err));
    CHECK(st == CODECRT_OK, "context_init: %s", err);
    return ctx;
}

static void test_two_decodes(codecrt_model *m, const test_cfg *c) {
    codecrt_context *ctx = new_ctx(m, 0, 0);
    test_codes tc;
    make_codes(&tc, c, 16, 2, 1);
    size_t n1 = 0, n2 = 0;
    float *a = decode_alloc(ctx, &tc, 1, &n1);
    float *b = decode_alloc(ctx, &tc, 1, &n2);
    CHECK(n1 == n2 && n1 == (size_t)(16 * 2 * codecrt_model_samples_for_frames(m, 1)), "sample count %zu", n1);
    CHECK(memcmp(a, b, n1 * sizeof(float)) == 0, "[%s] two decodes differ", c->name);
    CHECK(rms(a, n1) > 1e-3, "[%s] decode is silent (rms %g)", c->name, rms(a, n1));
    codecrt_stats s;
    CHECK_OK(codecrt_context_get_stats(ctx, &s));
    CHECK(s.graphs_built == 1 && s.graphs_reused == 1, "built %llu reused %llu",
          (unsigned long long)s.graphs_built, (unsigned long long)s.graphs_reused);
    free(a);
    free(b);
    free_codes(&tc, c);
    codecrt_context_free(ctx);
}

/* Interleaved decodes of mixed shapes through one context equal fresh decodes. */
static void test_interleaved(codecrt_model *m, const test_cfg *c, int rounds, int recreate, int bucket) {
    codecrt_context *ctx = new_ctx(m, bucket ? 16 : 0, bucket);
    if (recreate) {
        CHECK_OK(codecrt_context_set_recreate_policy(ctx, CODECRT_GRAPH_DECODE, 1));
    }
    const int32_t frames[] = {4, 8, 12, 24, 8, 4};
    const int32_t batches[] = {1, 3, 2, 1, 4, 1};
    /* warm-up: reserve the envelope of every shape below, once */
    CHECK_OK(codecrt_context_reserve(ctx, 24, 4));
    for (int r = 0; r < rounds; r++) {
        const int k = r % 6, noise = r % 2;
        test_codes tc;
        make_codes(&tc, c, frames[k], batches[k], (uint32_t)k);
        size_t n = 0, nf = 0;
        float *a = decode_alloc(ctx, &tc, noise, &n);
        codecrt_context *fresh = new_ctx(m, 0, 0);
        float *b = decode_alloc(fresh, &tc, noise, &nf);
        CHECK(n == nf, "length");
        const double d = max_abs_diff(a, b, n);
        CHECK(bucket ? d < 1e-5 : d == 0.0, "[%s] round %d differs from a fresh context by %g", c->name, r, d);
        codecrt_context_free(fresh);
        free(a);
        free(b);
        free_codes(&tc, c);
    }
    codecrt_stats s;
    CHECK_OK(codecrt_context_get_stats(ctx, &s));
    if (recreate) {
        CHECK(s.sched_recreations > 0, "recreate policy never ran");
    }
    if (recreate) {
        /* each new scheduler is reserved once, at its first use */
        CHECK(s.reservations == s.sched_recreations + 1 || s.reservations == s.sched_recreations,
              "reservations %llu, recreations %llu", (unsigned long long)s.reservations,
              (unsigned long long)s.sched_recreations);
    } else {
        CHECK(s.reservations == 1, "reservations %llu after a warm-up reserve",
              (unsigned long long)s.reservations);
    }
    CHECK(s.graphs_built + s.graphs_reused == (uint64_t)rounds, "built %llu + reused %llu != %d",
          (unsigned long long)s.graphs_built, (unsigned long long)s.graphs_reused, rounds);
    codecrt_context_free(ctx);
}

static void test_bad_codes(codecrt_model *m, const test_cfg *c) {
    codecrt_context *ctx = new_ctx(m, 0, 0);
    float pcm[4096];
    test_codes tc;
    make_codes(&tc, c, 8, 1, 0);
    codecrt_status st;

    tc.levels[1][0] = c->codebook;
    st = codecrt_decode(ctx, NULL, &tc.codes, pcm, 4096, NULL);
    CHECK(st == CODECRT_E_CODE_RANGE, "out of range: %s", codecrt_status_name(st));
    CHECK(strstr(codecrt_context_last_error(ctx), "level 1") != NULL, "message: %s", codecrt_context_last_error(ctx));
    tc.levels[1][0] = -1;
    st = codecrt_decode(ctx, NULL, &tc.codes, pcm, 4096, NULL);
    CHECK(st == CODECRT_E_CODE_RANGE, "negative: %s", codecrt_status_name(st));
    tc.levels[1][0] = 0;

    tc.lengths[2] -= 1;
    st = codecrt_decode(ctx, NULL, &tc.codes, pcm, 4096, NULL);
    CHECK(st == CODECRT_E_SHAPE, "inconsistent: %s", codecrt_status_name(st));
    tc.lengths[2] += 1;

    tc.codes.n_levels = 2;
    st = codecrt_decode(ctx, NULL, &tc.codes, pcm, 4096, NULL);
    CHECK(st == CODECRT_E_SHAPE, "levels: %s", codecrt_status_name(st));
    tc.codes.n_levels = c->n_levels;

    st = codecrt_decode(ctx, NULL, &tc.codes, pcm, 10, NULL);
    CHECK(st == CODECRT_E_BUFFER_TOO_SMALL, "small buffer: %s", codecrt_status_name(st));

    tc.codes.n_batch = 9;
    st = codecrt_decode(ctx, NULL, &tc.codes, pcm, 4096, NULL);
    CHECK(st == CODECRT_E_TOO_LARGE, "batch: %s", codecrt_status_name(st));
    tc.codes.n_batch = 1;
    free_codes(&tc, c);

    make_codes(&tc, c, 6, 1, 0); /* 6 is not a multiple of 4 */
    tc.lengths[0] = 1;           /* make levels agree on 4 frames... */
    tc.lengths[1] = 3;           /* ...except this one (6 frames) */
    st = codecrt_decode(ctx, NULL, &tc.codes, pcm, 4096, NULL);
    CHECK(st == CODECRT_E_SHAPE, "misaligned: %s", codecrt_status_name(st));
    free_codes(&tc, c);

    make_codes(&tc, c, 260, 1, 0); /* beyond max_frames 256 */
    tc.lengths[0] = 65;
    tc.lengths[1] = 130;
    tc.lengths[2] = 260;
    st = codecrt_decode(ctx, NULL, &tc.codes, pcm, 4096, NULL);
    CHECK(st == CODECRT_E_TOO_LARGE || st == CODECRT_E_SHAPE, "too many frames: %s", codecrt_status_name(st));
    free_codes(&tc, c);

    int64_t zero[3] = {0, 0, 0};
    const int32_t *nulls[3] = {(const int32_t *)pcm, (const int32_t *)pcm, (const int32_t *)pcm};
    codecrt_codes empty = {.n_batch = 1, .n_levels = 3, .levels = nulls, .lengths = zero};
    st = codecrt_decode(ctx, NULL, &empty, pcm, 4096, NULL);
    CHECK(st == CODECRT_E_SHAPE, "zero frames: %s", codecrt_status_name(st));

    codecrt_stats s;
    CHECK_OK(codecrt_context_get_stats(ctx, &s));
    CHECK(s.graphs_built == 0, "a rejected decode built a graph");
    codecrt_context_free(ctx);
}

static codecrt_status load_status(const char *path, char *err, size_t n) {
    codecrt_model *m = NULL;
    codecrt_status st = codecrt_model_load(path, &m, err, n);
    codecrt_model_free(m);
    return st;
}

static void test_bad_files(const char *dir) {
    char path[512], err[512];
    snprintf(path, sizeof(path), "%s/none.gguf", dir);
    CHECK(load_status(path, err, sizeof(err)) == CODECRT_E_IO, "missing file: %s", err);

    snprintf(path, sizeof(path), "%s/text.gguf", dir);
    FILE *f = fopen(path, "wb");
    fputs("this is not a model\n", f);
    fclose(f);
    CHECK(load_status(path, err, sizeof(err)) == CODECRT_E_NOT_GGUF, "text file: %s", err);

    snprintf(path, sizeof(path), "%s/arch.gguf", dir);
    write_model(path, &k_plain, "wavenet", NULL, NULL);
    CHECK(load_status(path, err, sizeof(err)) == CODECRT_E_UNKNOWN_ARCH, "unknown arch: %s", err);

    snprintf(path, sizeof(path), "%s/missing.gguf", dir);
    write_model(path, &k_plain, "snac", "decoder.block.1.res.2.dw.weight", NULL);
    CHECK(load_status(path, err, sizeof(err)) == CODECRT_E_MISSING_TENSOR, "missing tensor: %s", err);
    CHECK(strstr(err, "decoder.block.1.res.2.dw.weight") != NULL, "message names the tensor: %s", err);

    snprintf(path, sizeof(path), "%s/shape.gguf", dir);
    write_model(path, &k_plain, "snac", NULL, "decoder.in_pw.weight");
    CHECK(load_status(path, err, sizeof(err)) == CODECRT_E_BAD_TENSOR, "bad shape: %s", err);

    /* truncations: in the data, and in the header */
    snprintf(path, sizeof(path), "%s/good.gguf", dir);
    write_model(path, &k_plain, "snac", NULL, NULL);
    f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size);
    CHECK(fread(buf, 1, (size_t)size, f) == (size_t)size, "read back");
    fclose(f);
    const long cuts[] = {size - 40, size / 2, 200, 30, 8, 3}; /* the last bytes may be alignment padding */
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        snprintf(path, sizeof(path), "%s/cut%zu.gguf", dir, i);
        f = fopen(path, "wb");
        fwrite(buf, 1, (size_t)cuts[i], f);
        fclose(f);
        const codecrt_status st = load_status(path, err, sizeof(err));
        CHECK(st == CODECRT_E_TRUNCATED || st == CODECRT_E_CORRUPT || st == CODECRT_E_NOT_GGUF,
              "cut at %ld: %s (%s)", cuts[i], codecrt_status_name(st), err);
        if (cuts[i] > size / 4) {
            CHECK(st == CODECRT_E_TRUNCATED, "cut at %ld in the data: %s", cuts[i], codecrt_status_name(st));
        }
    }
    /* flipped bytes in the header must never crash */
    for (int i = 4; i < 64; i++) {
        snprintf(path, sizeof(path), "%s/flip.gguf", dir);
        buf[i] ^= 0x5A;
        f = fopen(path, "wb");
        fwrite(buf, 1, (size_t)size, f);
        fclose(f);
        buf[i] ^= 0x5A;
        (void)load_status(path, err, sizeof(err));
    }
    free(buf);
}

static void test_free_orders(const char *path, const test_cfg *c) {
    char err[256];
    codecrt_model *m = NULL;
    CHECK_OK(codecrt_model_load(path, &m, err, sizeof(err)));
    codecrt_context *a = new_ctx(m, 0, 0);
    codecrt_context *b = new_ctx(m, 0, 0);
    codecrt_model_free(m); /* contexts keep the model alive */
    test_codes tc;
    make_codes(&tc, c, 8, 1, 3);
    size_t n = 0;
    float *x = decode_alloc(a, &tc, 0, &n);
    codecrt_context_free(a);
    float *y = decode_alloc(b, &tc, 0, &n);
    CHECK(memcmp(x, y, n * sizeof(float)) == 0, "contexts of one model differ");
    codecrt_context_free(b);
    codecrt_context_free(NULL);
    codecrt_model_free(NULL);
    free(x);
    free(y);
    free_codes(&tc, c);
}

int main(void) {
    char dir[] = "/tmp/codecrt-test-XXXXXX";
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
        codecrt_status st = codecrt_model_load(path, &m, err, sizeof(err));
        CHECK(st == CODECRT_OK, "load %s: %s", c->name, err);
        if (st != CODECRT_OK) {
            continue;
        }
        codecrt_model_info info;
        CHECK_OK(codecrt_model_get_info(m, &info));
        CHECK(strcmp(info.arch, "snac") == 0 && info.n_levels == 3 && info.level_stride[0] == 4, "info");
        test_two_decodes(m, c);
        test_interleaved(m, c, 24, 0, 0);
        test_interleaved(m, c, 12, 1, 0);
        test_interleaved(m, c, 12, 0, 1);
        test_bad_codes(m, c);
        codecrt_model_free(m);
        test_free_orders(path, c);
    }
    test_bad_files(dir);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", dir);
    }
    printf("%d passed, %d failed\n", g_checks - g_failures, g_failures);
    return g_failures ? 1 : 0;
}
