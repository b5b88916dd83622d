#define _POSIX_C_SOURCE 200809L /* fseeko, sysconf, clock_gettime */
/*
 * model.c: loading and validating a GGUF model.
 *
 * Order of checks (each failure has its own status):
 *   file opens (E_IO) -> GGUF magic (E_NOT_GGUF) -> header parses (E_CORRUPT)
 *   -> architecture known (E_UNKNOWN_ARCH) -> hyperparameters (E_BAD_HPARAMS)
 *   -> every tensor expected, known, of the right type and shape
 *      (E_MISSING_TENSOR, E_BAD_TENSOR) -> the data fits in the file
 *   (E_TRUNCATED) -> read the data into one CPU buffer.
 * Nothing reaches a ggml assert: gguf's parser returns NULL on malformed input,
 * and everything after it is checked here first.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "internal.h"

static void cr_shape_str(char *buf, size_t size, int n_dims, const int64_t *ne) {
    size_t off = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n_dims && off < size; i++) {
        off += (size_t)snprintf(buf + off, size - off, "%s%lld", i ? ", " : "", (long long)ne[i]);
    }
    if (off < size) {
        snprintf(buf + off, size - off, "]");
    }
}

static int cr_tensor_n_dims(const struct ggml_tensor *t) {
    int n = 1;
    for (int i = 1; i < GGML_MAX_DIMS; i++) {
        if (t->ne[i] != 1) {
            n = i + 1;
        }
    }
    return n;
}

/* Match the file's tensors against the architecture's list, both ways. */
static codecrt_status cr_check_tensors(const cr_arch *arch, const void *hp,
                                       const struct gguf_context *gguf,
                                       struct ggml_context *meta, int32_t *weight_type,
                                       cr_err *err) {
    cr_spec_list *specs = calloc(1, sizeof(*specs));
    if (!specs) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
    }
    arch->tensor_specs(hp, specs);
    codecrt_status st = CODECRT_OK;
    if (specs->overflow) {
        st = cr_fail(err, CODECRT_E_BAD_HPARAMS, "hyperparameters imply too many tensors");
        goto done;
    }
    enum ggml_type mat_type = GGML_TYPE_COUNT;
    for (int i = 0; i < specs->n; i++) {
        const cr_tensor_spec *s = &specs->items[i];
        struct ggml_tensor *t = ggml_get_tensor(meta, s->name);
        if (!t) {
            st = cr_fail(err, CODECRT_E_MISSING_TENSOR, "tensor '%s' is missing", s->name);
            goto done;
        }
        bool same = true;
        for (int d = 0; d < 4; d++) {
            same = same && t->ne[d] == s->ne[d];
        }
        if (!same) {
            char got[96], want[96];
            cr_shape_str(got, sizeof(got), cr_tensor_n_dims(t), t->ne);
            cr_shape_str(want, sizeof(want), s->n_dims, s->ne);
            st = cr_fail(err, CODECRT_E_BAD_TENSOR, "tensor '%s' has shape %s, expected %s",
                         s->name, got, want);
            goto done;
        }
        if (s->mat) {
            if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) {
                st = cr_fail(err, CODECRT_E_BAD_TENSOR, "tensor '%s' has type %s, expected F32 or F16",
                             s->name, ggml_type_name(t->type));
                goto done;
            }
            if (mat_type != GGML_TYPE_COUNT && t->type != mat_type) {
                st = cr_fail(err, CODECRT_E_BAD_TENSOR,
                             "tensor '%s' has type %s but other matrices are %s", s->name,
                             ggml_type_name(t->type), ggml_type_name(mat_type));
                goto done;
            }
            mat_type = t->type;
        } else if (t->type != GGML_TYPE_F32) {
            st = cr_fail(err, CODECRT_E_BAD_TENSOR, "tensor '%s' has type %s, expected F32",
                         s->name, ggml_type_name(t->type));
            goto done;
        }
    }
    const int64_t n_file = gguf_get_n_tensors(gguf);
    if (n_file != specs->n) {
        /* same count means no extras, since every expected name was found */
        for (int64_t i = 0; i < n_file; i++) {
            const char *name = gguf_get_tensor_name(gguf, i);
            bool known = false;
            for (int j = 0; j < specs->n && !known; j++) {
                known = strcmp(specs->items[j].name, name) == 0;
            }
            if (!known) {
                st = cr_fail(err, CODECRT_E_BAD_TENSOR, "unexpected tensor '%s' for architecture '%s'",
                             name, arch->name);
                goto done;
            }
        }
        st = cr_fail(err, CODECRT_E_BAD_TENSOR, "duplicate tensor names in file");
        goto done;
    }
    *weight_type = mat_type == GGML_TYPE_F16 ? CODECRT_WEIGHT_F16 : CODECRT_WEIGHT_F32;
done:
    free(specs);
    return st;
}

static codecrt_status cr_read_data(FILE *f, const struct gguf_context *gguf,
                                   struct ggml_context *meta, long long file_size, cr_err *err) {
    const size_t data_offset = gguf_get_data_offset(gguf);
    const int64_t n = gguf_get_n_tensors(gguf);
    /* first: everything fits (a truncated download is the common failure) */
    for (int64_t i = 0; i < n; i++) {
        struct ggml_tensor *t = ggml_get_tensor(meta, gguf_get_tensor_name(gguf, i));
        const unsigned long long end =
            (unsigned long long)data_offset + gguf_get_tensor_offset(gguf, i) + ggml_nbytes(t);
        if (end > (unsigned long long)file_size) {
            return cr_fail(err, CODECRT_E_TRUNCATED,
                           "file is truncated: %lld bytes, tensor '%s' needs %llu", file_size,
                           ggml_get_name(t), end);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        struct ggml_tensor *t = ggml_get_tensor(meta, gguf_get_tensor_name(gguf, i));
        const size_t off = data_offset + gguf_get_tensor_offset(gguf, i);
        if (fseeko(f, (off_t)off, SEEK_SET) != 0 || fread(t->data, 1, ggml_nbytes(t), f) != ggml_nbytes(t)) {
            return cr_fail(err, CODECRT_E_IO, "read error in tensor '%s'", ggml_get_name(t));
        }
    }
    return CODECRT_OK;
}

static void cr_model_destroy(cr_model *m) {
    if (m->cpu_buffer) {
        ggml_backend_buffer_free(m->cpu_buffer);
    }
    if (m->weights) {
        ggml_free(m->weights);
    }
    free(m->hparams);
    free(m);
}

void cr_model_retain(cr_model *m) { atomic_fetch_add(&m->refs, 1); }

void cr_model_release(cr_model *m) {
    if (m && atomic_fetch_sub(&m->refs, 1) == 1) {
        cr_model_destroy(m);
    }
}

static codecrt_status cr_model_load(const char *path, cr_model **out, cr_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        return cr_fail(err, CODECRT_E_IO, "cannot open '%s': %s", path, strerror(errno));
    }
    char magic[4] = {0};
    const size_t got = fread(magic, 1, 4, f);
    if (got != 4 || memcmp(magic, "GGUF", 4) != 0) {
        fclose(f);
        return cr_fail(err, CODECRT_E_NOT_GGUF, "'%s' is not a GGUF file (bad magic)", path);
    }
    fseeko(f, 0, SEEK_END);
    const long long file_size = (long long)ftello(f);

    codecrt_status st = CODECRT_OK;
    struct ggml_context *meta = NULL;
    struct gguf_init_params gp = {.no_alloc = true, .ctx = &meta};
    struct gguf_context *gguf = gguf_init_from_file(path, gp);
    cr_model *m = NULL;
    if (!gguf) {
        st = cr_fail(err, CODECRT_E_CORRUPT, "'%s': malformed or truncated GGUF header", path);
        goto fail;
    }
    const int64_t arch_key = gguf_find_key(gguf, "general.architecture");
    if (arch_key < 0 || gguf_get_kv_type(gguf, arch_key) != GGUF_TYPE_STRING) {
        st = cr_fail(err, CODECRT_E_UNKNOWN_ARCH, "'%s': no general.architecture string", path);
        goto fail;
    }
    const char *arch_name = gguf_get_val_str(gguf, arch_key);
    const cr_arch *arch = cr_arch_find(arch_name);
    if (!arch) {
        st = cr_fail(err, CODECRT_E_UNKNOWN_ARCH, "architecture '%s' is not supported (known: %s)",
                     arch_name, cr_arch_names());
        goto fail;
    }
    m = calloc(1, sizeof(*m));
    if (!m || !(m->hparams = calloc(1, arch->hparams_size))) {
        st = cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
        goto fail;
    }
    atomic_init(&m->refs, 1);
    m->arch = arch;
    snprintf(m->path, sizeof(m->path), "%s", path);
    if ((st = arch->read_hparams(gguf, m->hparams, err)) != CODECRT_OK) {
        goto fail;
    }
    int32_t weight_type = CODECRT_WEIGHT_F32;
    if ((st = cr_check_tensors(arch, m->hparams, gguf, meta, &weight_type, err)) != CODECRT_OK) {
        goto fail;
    }
    m->cpu_buffer = ggml_backend_alloc_ctx_tensors_from_buft(meta, ggml_backend_cpu_buffer_type());
    if (!m->cpu_buffer) {
        st = cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "cannot allocate %zu bytes of weights",
                     ggml_get_mem_size(meta));
        goto fail;
    }
    ggml_backend_buffer_set_usage(m->cpu_buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    if ((st = cr_read_data(f, gguf, meta, file_size, err)) != CODECRT_OK) {
        goto fail;
    }
    m->weights = meta;
    meta = NULL;
    memset(&m->info, 0, sizeof(m->info));
    snprintf(m->info.arch, sizeof(m->info.arch), "%s", arch->name);
    arch->fill_info(m->hparams, &m->info);
    m->info.weight_type = weight_type;
    m->info.weight_bytes = (int64_t)ggml_backend_buffer_get_size(m->cpu_buffer);
    int64_t n_params = 0;
    for (struct ggml_tensor *t = ggml_get_first_tensor(m->weights); t;
         t = ggml_get_next_tensor(m->weights, t)) {
        n_params += ggml_nelements(t);
    }
    m->info.n_params = n_params;
    gguf_free(gguf);
    fclose(f);
    *out = m;
    return CODECRT_OK;

fail:
    if (m) {
        m->weights = meta; /* destroy frees buffer, then the context */
        meta = NULL;
        cr_model_destroy(m);
    }
    if (meta) {
        ggml_free(meta);
    }
    if (gguf) {
        gguf_free(gguf);
    }
    fclose(f);
    return st;
}

codecrt_status codecrt_model_load(const char *path, codecrt_model **out, char *err_buf,
                                  size_t err_size) {
    cr_err err = {{0}};
    if (out) {
        *out = NULL;
    }
    if (!path || !out) {
        codecrt_status st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "path and out must not be NULL");
        cr_err_copy(&err, err_buf, err_size);
        return st;
    }
    cr_logging_init();
    cr_model *m = NULL;
    codecrt_status st = cr_model_load(path, &m, &err);
    if (st != CODECRT_OK) {
        cr_err_copy(&err, err_buf, err_size);
        return st;
    }
    /* codecrt_model is the public name of cr_model (same first member) */
    *out = (codecrt_model *)m;
    cr_err_copy(&err, err_buf, err_size);
    return CODECRT_OK;
}

void codecrt_model_free(codecrt_model *model) { cr_model_release((cr_model *)model); }

codecrt_status codecrt_model_get_info(const codecrt_model *model, codecrt_model_info *info) {
    if (!model || !info) {
        return CODECRT_E_INVALID_ARGUMENT;
    }
    *info = ((const cr_model *)model)->info;
    return CODECRT_OK;
}

int64_t codecrt_model_samples_for_frames(const codecrt_model *model, int64_t n_frames) {
    const int64_t hop = model ? ((const cr_model *)model)->info.hop_length : 0;
    if (!model || n_frames < 0 || hop <= 0 || n_frames > INT64_MAX / hop) {
        return 0; /* n_frames * hop would overflow int64 */
    }
    return n_frames * hop;
}
