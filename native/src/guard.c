#define _POSIX_C_SOURCE 200809L
/*
 * guard.c: the shape guard. Every graph is checked against the limits of the
 * backends that will run it before ggml allocates or computes it, because
 * ggml's kernels assert (abort the process) or fail a launch on shapes beyond
 * those limits instead of returning an error.
 *
 * Limits checked, from ggml 0.15.3's sources:
 *   - every backend: a tensor of more than INT32_MAX elements. Several CUDA
 *     kernels index with int (conv_2d_dw, snake, the unary ops, cpy's block
 *     count) and the broadcast kernels assert on 32-bit products; the CPU is
 *     held to the same bound so that a graph the CPU accepts is one a GPU can
 *     run too.
 *   - GPU backends (CUDA, and the same bound for Vulkan and Metal, whose
 *     compute grids are as small or smaller): the launch grid's y and z
 *     dimensions, at most 65,535 blocks each. These ops put a tensor dimension
 *     straight into grid y/z without a fallback (the others loop over a
 *     clamped grid, or switch to a 1-D kernel past the limit):
 *       PAD                  ne1 -> y, ne2*ne3 -> z       (pad.cu)
 *       CONCAT (strided)     ne2 -> y, ne3 -> z           (concat.cu)
 *       NORM, RMS_NORM,
 *       L2_NORM              ne2 -> y, ne3 -> z           (norm.cu)
 *       SOFT_MAX             ne2 -> y, ne3 -> z           (softmax.cu)
 *       CUMSUM, TRI          ne2 -> y, ne3 -> z
 *       PAD_REFLECT_1D       ne2 -> y, ne3 -> z
 *       MUL_MAT              ne2 -> y, ne3 -> z           (mmvf/mmf kernels)
 *       FLASH_ATTN_EXT       ne2 -> y, ne3 -> z
 *     (CUDA's limit is exceeded, for example, by a pad along time at 24 kHz of
 *     more than 2.73 s: "PAD failed / invalid argument", then an abort.)
 *
 * Tests move the limits with environment variables read when a context is
 * created: CODECRT_GUARD_GRID=N applies the GPU grid rules with limit N on any
 * backend (the CPU included), CODECRT_GUARD_ELEMENTS=N lowers the element
 * bound, CODECRT_PIECE_ELEMENTS=N sets the size above which an offline decode
 * runs in pieces (CR_PIECE_ELEMENTS; at most the element bound). They exist so
 * that the refusals and the piecewise decode that avoids them can be exercised
 * on a machine without a GPU.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CR_GPU_GRID_YZ 65535

static int64_t cr_env_i64(const char *name, int64_t fallback) {
    const char *s = getenv(name);
    if (!s || !*s) {
        return fallback;
    }
    char *end = NULL;
    const long long v = strtoll(s, &end, 10);
    return (end && *end == '\0' && v > 0) ? (int64_t)v : fallback;
}

/*
 * The piece budget of a device: CR_PIECE_ELEMENTS, or on a GPU with more memory one
 * F32 tensor per 1/64 of it (an H200's 140 GiB: 2.2 GiB, 5.9e8 elements), since
 * pieces are small graphs that leave a large GPU idle: DAC 44.1 kHz at batch 16 of
 * 2 s ran as 64 graphs in 276 ms under 2^27 and as one in 210 ms under 2^30 (H200,
 * bench/gpu/profile_decode.py, 2026-12-04). A graph's compute buffer is a few such
 * tensors.
 */
static int64_t cr_device_piece_elements(ggml_backend_dev_t dev) {
    size_t free_b = 0, total_b = 0;
    ggml_backend_dev_memory(dev, &free_b, &total_b);
    const int64_t by_memory = (int64_t)(total_b / 64 / sizeof(float));
    return by_memory > CR_PIECE_ELEMENTS ? by_memory : CR_PIECE_ELEMENTS;
}

cr_limits cr_limits_for(ggml_backend_t const *backends, int n_backends) {
    cr_limits lim = {.grid_yz = 0, .max_elements = CR_MAX_TENSOR_ELEMENTS, .piece_elements = 0,
                     .backends = backends, .n_backends = n_backends};
    int64_t piece_default = CR_PIECE_ELEMENTS;
    for (int i = 0; i < n_backends; i++) {
        ggml_backend_dev_t dev = ggml_backend_get_device(backends[i]);
        if (dev && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
            lim.grid_yz = CR_GPU_GRID_YZ;
            const int64_t p = cr_device_piece_elements(dev);
            piece_default = p > piece_default ? p : piece_default;
        }
    }
    lim.grid_yz = cr_env_i64("CODECRT_GUARD_GRID", lim.grid_yz);
    const int64_t el = cr_env_i64("CODECRT_GUARD_ELEMENTS", lim.max_elements);
    lim.max_elements = el < lim.max_elements ? el : lim.max_elements;
    const int64_t piece = cr_env_i64("CODECRT_PIECE_ELEMENTS", piece_default);
    lim.piece_elements = piece < lim.max_elements ? piece : lim.max_elements;
    return lim;
}

/* The extent an op puts into a grid dimension without a fallback (0: none). */
static int64_t cr_grid_extent(const struct ggml_tensor *t, const char **which) {
    switch (t->op) {
    case GGML_OP_PAD:
        if (t->ne[1] >= t->ne[2] * t->ne[3]) {
            *which = "ne1";
            return t->ne[1];
        }
        *which = "ne2*ne3";
        return t->ne[2] * t->ne[3];
    case GGML_OP_CONCAT:
    case GGML_OP_NORM:
    case GGML_OP_RMS_NORM:
    case GGML_OP_L2_NORM:
    case GGML_OP_SOFT_MAX:
    case GGML_OP_CUMSUM:
    case GGML_OP_TRI:
    case GGML_OP_PAD_REFLECT_1D:
    case GGML_OP_MUL_MAT:
    case GGML_OP_FLASH_ATTN_EXT:
        if (t->ne[2] >= t->ne[3]) {
            *which = "ne2";
            return t->ne[2];
        }
        *which = "ne3";
        return t->ne[3];
    default:
        return 0;
    }
}

codecrt_status cr_guard_node(const cr_limits *lim, const struct ggml_tensor *t, cr_err *err) {
    const int64_t n = ggml_nelements(t);
    if (n > lim->max_elements) {
        return cr_fail(err, CODECRT_E_TOO_LARGE,
                       "a %s tensor [%lld, %lld, %lld, %lld] has %lld elements, above the backend limit of %lld",
                       ggml_op_desc(t), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3], (long long)n, (long long)lim->max_elements);
    }
    if (lim->grid_yz > 0) {
        const char *which = "";
        const int64_t e = cr_grid_extent(t, &which);
        if (e > lim->grid_yz) {
            return cr_fail(err, CODECRT_E_TOO_LARGE,
                           "a %s tensor [%lld, %lld, %lld, %lld] has %s = %lld, above the GPU launch-grid limit "
                           "of %lld",
                           ggml_op_desc(t), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                           (long long)t->ne[3], which, (long long)e, (long long)lim->grid_yz);
        }
    }
    return CODECRT_OK;
}

codecrt_status cr_guard_graph(const cr_limits *lim, struct ggml_cgraph *gf, cr_err *err) {
    const int n = ggml_graph_n_nodes(gf);
    for (int i = 0; i < n; i++) {
        const struct ggml_tensor *t = ggml_graph_node(gf, i);
        codecrt_status st = cr_guard_node(lim, t, err);
        if (st != CODECRT_OK) {
            return st;
        }
        for (int s = 0; s < GGML_MAX_SRC; s++) {
            /* leaves (inputs) are allocated too, and read with the same indexing; an op's
               optional source may be NULL before a later one (cr_unit_tail: no mask, a prefix) */
            if (t->src[s] && (st = cr_guard_node(lim, t->src[s], err)) != CODECRT_OK) {
                return st;
            }
        }
    }
    return lim->n_backends > 0 ? cr_guard_supported(lim->backends, lim->n_backends, gf, err) : CODECRT_OK;
}

codecrt_status cr_guard_supported(ggml_backend_t const *backends, int n_backends, struct ggml_cgraph *gf,
                                  cr_err *err) {
    const int n = ggml_graph_n_nodes(gf);
    for (int i = 0; i < n; i++) {
        const struct ggml_tensor *t = ggml_graph_node(gf, i);
        bool ok = false;
        for (int b = 0; b < n_backends && !ok; b++) {
            ok = ggml_backend_supports_op(backends[b], t);
        }
        if (!ok) {
            /* the scheduler would assert (ggml-backend.cpp, pass 4: no backend for the node) */
            char types[96] = "";
            size_t used = 0;
            for (int j = 0; j < GGML_MAX_SRC && used < sizeof(types); j++) {
                if (!t->src[j]) { /* an optional source before a later one (cr_unit_tail) */
                    continue;
                }
                const int k = snprintf(types + used, sizeof(types) - used, "%s%s", used ? ", " : "",
                                       ggml_type_name(t->src[j]->type));
                used += k > 0 ? (size_t)k : 0;
            }
            return cr_fail(err, CODECRT_E_UNSUPPORTED,
                           "no backend of this context runs a %s node [%lld, %lld, %lld, %lld] of %s (sources %s)",
                           ggml_op_desc(t), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                           (long long)t->ne[3], ggml_type_name(t->type), types);
        }
    }
    return CODECRT_OK;
}
