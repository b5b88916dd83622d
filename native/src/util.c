/* util.c: status names, error messages, version, ggml logging, tensor specs. */
#include <stdio.h>
#include <string.h>

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
