/*
 * test_common.h: helpers for the C tests: checks, a random SNAC model writer
 * (using the architecture's own tensor list), code patterns. Header-only.
 */
#ifndef CODECRT_TEST_COMMON_H
#define CODECRT_TEST_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codecrt.h"
#include "../src/internal.h"

static int g_failures = 0;
static int g_checks = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        g_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            g_failures++;                                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        codecrt_status st_ = (expr);                                                               \
        CHECK(st_ == CODECRT_OK, "%s -> %s", #expr, codecrt_status_name(st_));                     \
    } while (0)

typedef struct test_cfg {
    const char *name;
    int32_t latent, dim, window, codebook, cbdim, noise;
    int32_t n_rates, rates[4];
    int32_t n_levels, strides[4];
} test_cfg;

static const test_cfg k_plain = {"plain", 32, 64, 0, 32, 8, 1, 2, {2, 2}, 3, {4, 2, 1}};
static const test_cfg k_attn = {"attn", 32, 128, 4, 32, 8, 1, 2, {2, 3}, 3, {4, 2, 1}};

static uint64_t g_rng = 88172645463325252ull;
static inline float frand(void) { /* xorshift64, uniform [0, 1) */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xFFFFFF) / 16777216.0f;
}

/* Write a random model; skip_tensor / bad_tensor break one tensor on purpose. */
static inline void write_model(const char *path, const test_cfg *c, const char *arch, const char *skip_tensor,
                        const char *bad_tensor) {
    struct gguf_context *g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", arch);
    gguf_set_val_u32(g, "codecd.format_version", 1);
    int32_t hop = 1;
    for (int i = 0; i < c->n_rates; i++) {
        hop *= c->rates[i];
    }
    gguf_set_val_u32(g, "snac.sampling_rate", 24000);
    gguf_set_val_u32(g, "snac.hop_length", (uint32_t)hop);
    gguf_set_val_u32(g, "snac.latent_dim", (uint32_t)c->latent);
    gguf_set_val_u32(g, "snac.decoder_dim", (uint32_t)c->dim);
    gguf_set_arr_data(g, "snac.decoder_rates", GGUF_TYPE_INT32, c->rates, (size_t)c->n_rates);
    gguf_set_val_u32(g, "snac.attn_window_size", (uint32_t)c->window);
    gguf_set_val_u32(g, "snac.codebook_size", (uint32_t)c->codebook);
    gguf_set_val_u32(g, "snac.codebook_dim", (uint32_t)c->cbdim);
    gguf_set_arr_data(g, "snac.vq_strides", GGUF_TYPE_INT32, c->strides, (size_t)c->n_levels);
    gguf_set_val_bool(g, "snac.noise", c->noise != 0);
    gguf_set_val_bool(g, "snac.depthwise", true);

    char err[256];
    void *hp = calloc(1, cr_arch_snac.hparams_size);
    cr_err e = {{0}};
    if (cr_arch_snac.read_hparams(g, hp, &e) != CODECRT_OK) {
        fprintf(stderr, "test model hparams: %s (%s)\n", e.msg, err);
        exit(2);
    }
    cr_spec_list *specs = calloc(1, sizeof(*specs));
    cr_arch_snac.tensor_specs(hp, specs);
    struct ggml_init_params ip = {.mem_size = 64u << 20, .mem_buffer = NULL, .no_alloc = false};
    struct ggml_context *ctx = ggml_init(ip);
    for (int i = 0; i < specs->n; i++) {
        const cr_tensor_spec *s = &specs->items[i];
        if (skip_tensor && strcmp(s->name, skip_tensor) == 0) {
            continue;
        }
        int64_t ne0 = s->ne[0], ne1 = s->ne[1];
        if (bad_tensor && strcmp(s->name, bad_tensor) == 0) {
            ne0 += 1;
        }
        struct ggml_tensor *t = s->n_dims == 1 ? ggml_new_tensor_1d(ctx, GGML_TYPE_F32, ne0)
                                               : ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ne0, ne1);
        ggml_set_name(t, s->name);
        float *d = t->data;
        const int64_t n = ggml_nelements(t);
        const bool is_alpha = strstr(s->name, ".alpha") != NULL;
        const bool is_inv = strstr(s->name, ".inv_alpha") != NULL;
        const float scale = 1.0f / sqrtf((float)ne0);
        for (int64_t k = 0; k < n; k++) {
            d[k] = is_alpha || is_inv ? 0.5f + frand() : (2.0f * frand() - 1.0f) * scale;
        }
        if (is_inv) { /* pair with the alpha written just before */
            struct ggml_tensor *a = ggml_get_tensor(ctx, s[-1].name);
            for (int64_t k = 0; k < n; k++) {
                d[k] = 1.0f / (((float *)a->data)[k] + 1e-9f);
            }
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

/* Codes for n_batch sequences of n_frames frames, from a fixed pattern + salt. */
typedef struct test_codes {
    int32_t *levels[4];
    int64_t lengths[4];
    const int32_t *ptrs[4];
    codecrt_codes codes;
} test_codes;

static inline void make_codes(test_codes *tc, const test_cfg *c, int32_t n_frames, int32_t n_batch, uint32_t salt) {
    for (int l = 0; l < c->n_levels; l++) {
        tc->lengths[l] = n_frames / c->strides[l];
        tc->levels[l] = malloc(sizeof(int32_t) * (size_t)(tc->lengths[l] * n_batch));
        for (int64_t i = 0; i < tc->lengths[l] * n_batch; i++) {
            tc->levels[l][i] = (int32_t)((i * 7 + l * 13 + salt * 31 + (i * i) % 17) % c->codebook);
        }
        tc->ptrs[l] = tc->levels[l];
    }
    tc->codes.n_batch = n_batch;
    tc->codes.n_levels = c->n_levels;
    tc->codes.levels = tc->ptrs;
    tc->codes.lengths = tc->lengths;
}

static inline void free_codes(test_codes *tc, const test_cfg *c) {
    for (int l = 0; l < c->n_levels; l++) {
        free(tc->levels[l]);
    }
}

static inline float *decode_alloc(codecrt_context *ctx, const test_codes *tc, int noise, size_t *n) {
    codecrt_model_info info;
    (void)info;
    const size_t cap = 1u << 20;
    float *pcm = malloc(cap * sizeof(float));
    codecrt_decode_params p = codecrt_decode_default_params();
    p.noise = noise;
    p.seed = 1234;
    codecrt_status st = codecrt_decode(ctx, &p, &tc->codes, pcm, cap, n);
    CHECK(st == CODECRT_OK, "decode: %s %s", codecrt_status_name(st), codecrt_context_last_error(ctx));
    return pcm;
}

static inline double rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        s += (double)x[i] * x[i];
    }
    return n ? sqrt(s / (double)n) : 0.0;
}

static inline double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        m = d > m ? d : m;
    }
    return m;
}


#endif
