/* util.c: status names, error messages, version, ggml logging, tensor specs. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define CODECRT_VERSION_STRING "0.1.0"

const char *codecrt_version(void) { return CODECRT_VERSION_STRING; }

const char *codecrt_status_name(codecrt_status status) {
    switch (status) {
    case CODECRT_OK: return "CODECRT_OK";
    case CODECRT_E_INVALID_ARGUMENT: return "CODECRT_E_INVALID_ARGUMENT";
    case CODECRT_E_IO: return "CODECRT_E_IO";
    case CODECRT_E_NOT_GGUF: return "CODECRT_E_NOT_GGUF";
    case CODECRT_E_CORRUPT: return "CODECRT_E_CORRUPT";
    case CODECRT_E_TRUNCATED: return "CODECRT_E_TRUNCATED";
    case CODECRT_E_UNKNOWN_ARCH: return "CODECRT_E_UNKNOWN_ARCH";
    case CODECRT_E_BAD_HPARAMS: return "CODECRT_E_BAD_HPARAMS";
    case CODECRT_E_MISSING_TENSOR: return "CODECRT_E_MISSING_TENSOR";
    case CODECRT_E_BAD_TENSOR: return "CODECRT_E_BAD_TENSOR";
    case CODECRT_E_BACKEND: return "CODECRT_E_BACKEND";
    case CODECRT_E_OUT_OF_MEMORY: return "CODECRT_E_OUT_OF_MEMORY";
    case CODECRT_E_CODE_RANGE: return "CODECRT_E_CODE_RANGE";
    case CODECRT_E_SHAPE: return "CODECRT_E_SHAPE";
    case CODECRT_E_TOO_LARGE: return "CODECRT_E_TOO_LARGE";
    case CODECRT_E_BUFFER_TOO_SMALL: return "CODECRT_E_BUFFER_TOO_SMALL";
    case CODECRT_E_COMPUTE: return "CODECRT_E_COMPUTE";
    case CODECRT_E_STATE: return "CODECRT_E_STATE";
    case CODECRT_E_UNSUPPORTED: return "CODECRT_E_UNSUPPORTED";
    }
    return "CODECRT_E_UNKNOWN";
}

codecrt_status cr_fail(cr_err *err, codecrt_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return status;
}

void cr_err_copy(const cr_err *err, char *dst, size_t dst_size) {
    if (!dst || dst_size == 0) {
        return;
    }
    snprintf(dst, dst_size, "%s", err ? err->msg : "");
}

/* ggml logs through a process-wide callback; silence it unless asked. */
static atomic_int g_ggml_logging = 0;

static void cr_ggml_log(enum ggml_log_level level, const char *text, void *user) {
    (void)level;
    (void)user;
    if (atomic_load(&g_ggml_logging)) {
        fputs(text, stderr);
    }
}

void codecrt_set_ggml_logging(int32_t enabled) {
    atomic_store(&g_ggml_logging, enabled ? 1 : 0);
    ggml_log_set(cr_ggml_log, NULL);
}

void cr_logging_init(void) {
    /* idempotent; ggml's default logger writes to stderr, which a service must not spam */
    static atomic_flag done = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&done)) {
        ggml_log_set(cr_ggml_log, NULL);
    }
}

void cr_spec_add(cr_spec_list *list, bool mat, int n_dims, int64_t ne0, int64_t ne1,
                 const char *fmt, ...) {
    if (list->n >= CR_MAX_TENSOR_SPECS) {
        list->overflow = true;
        return;
    }
    cr_tensor_spec *s = &list->items[list->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof(s->name), fmt, ap);
    va_end(ap);
    s->mat = mat;
    s->n_dims = n_dims;
    s->ne[0] = ne0;
    s->ne[1] = n_dims > 1 ? ne1 : 1;
    s->ne[2] = 1;
    s->ne[3] = 1;
}

void cr_spec_add3(cr_spec_list *list, bool mat, int64_t ne0, int64_t ne1, int64_t ne2,
                  const char *fmt, ...) {
    if (list->n >= CR_MAX_TENSOR_SPECS) {
        list->overflow = true;
        return;
    }
    cr_tensor_spec *s = &list->items[list->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof(s->name), fmt, ap);
    va_end(ap);
    s->mat = mat;
    s->n_dims = ne2 > 1 ? 3 : (ne1 > 1 ? 2 : 1);
    s->ne[0] = ne0;
    s->ne[1] = ne1;
    s->ne[2] = ne2;
    s->ne[3] = 1;
}

/* ------------------------------------------------ GGUF metadata readers */

codecrt_status cr_gguf_u32(const struct gguf_context *g, const char *key, int32_t *out,
                            cr_err *err) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is missing", key);
    }
    const enum gguf_type t = gguf_get_kv_type(g, id);
    uint64_t v;
    switch (t) {
    case GGUF_TYPE_UINT32: v = gguf_get_val_u32(g, id); break;
    case GGUF_TYPE_INT32: {
        const int32_t s = gguf_get_val_i32(g, id);
        if (s < 0) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is negative", key);
        }
        v = (uint64_t)s;
        break;
    }
    default:
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' has type %s, expected u32", key,
                       gguf_type_name(t));
    }
    if (v > (1u << 30)) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' = %llu is out of range", key,
                       (unsigned long long)v);
    }
    *out = (int32_t)v;
    return CODECRT_OK;
}

codecrt_status cr_gguf_bool(const struct gguf_context *g, const char *key, bool *out,
                             cr_err *err) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is missing", key);
    }
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_BOOL) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' must be a bool", key);
    }
    *out = gguf_get_val_bool(g, id);
    return CODECRT_OK;
}

codecrt_status cr_gguf_i32_array(const struct gguf_context *g, const char *key, int32_t *out,
                                  int32_t max_n, int32_t *n_out, cr_err *err) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is missing", key);
    }
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_ARRAY ||
        (gguf_get_arr_type(g, id) != GGUF_TYPE_INT32 && gguf_get_arr_type(g, id) != GGUF_TYPE_UINT32)) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' must be an array of int32", key);
    }
    const size_t n = gguf_get_arr_n(g, id);
    if (n == 0 || n > (size_t)max_n) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' has %zu entries (1..%d allowed)",
                       key, n, max_n);
    }
    const int32_t *data = gguf_get_arr_data(g, id);
    for (size_t i = 0; i < n; i++) {
        if (data[i] < 1 || data[i] > 64) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s'[%zu] = %d is out of range",
                           key, i, data[i]);
        }
        out[i] = data[i];
    }
    *n_out = (int32_t)n;
    return CODECRT_OK;
}

codecrt_status cr_gguf_f32(const struct gguf_context *g, const char *key, float *out, cr_err *err) {
    const int64_t id = gguf_find_key(g, key);
    if (id < 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is missing", key);
    }
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_FLOAT32) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' must be a float32", key);
    }
    *out = gguf_get_val_f32(g, id);
    if (!isfinite(*out)) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameter '%s' is not finite", key);
    }
    return CODECRT_OK;
}

codecrt_status cr_grow(void **buf, size_t *cap, size_t need, size_t elem, cr_err *err) {
    if (need <= *cap) {
        return CODECRT_OK;
    }
    void *p = realloc(*buf, need * elem);
    if (!p) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    *buf = p;
    *cap = need;
    return CODECRT_OK;
}

double cr_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
