#define _POSIX_C_SOURCE 200809L /* fseeko, sysconf, clock_gettime */
/*
 * graph.c: the graph lifecycle manager.
 *
 * ggml's scheduler contract (ggml-backend.h): reserve a worst-case graph once;
 * then for each new graph reset the scheduler, allocate the graph, set its
 * inputs, compute. A graph is single-use for allocation and multi-use for
 * computation.
 *
 * Each graph kind owns one slot: a scheduler, the context holding the live
 * graph's tensors, and that graph. The rules that keep allocations fresh:
 *
 *  1. A graph whose key (kind, frames, batch, flags) equals the live graph's is
 *     computed again as it is: no rebuild, no re-plan (counted as a reuse).
 *  2. Releasing a graph always resets the scheduler *while the graph's context
 *     is still alive*, and frees the context after. The scheduler holds pointers
 *     into the graph until it is reset; freeing the context first (the seed's
 *     bug) leaves a large graph kind with a stale allocation, and the next
 *     decode through the same context came out silent.
 *  3. Compute buffers are reserved for an envelope (frames, batch) that only
 *     grows, built from the worst case of that envelope, so steady traffic
 *     never re-plans buffers; every reservation is counted. Where the grown
 *     envelope would break a limit (or a kind forgets it: S3Gen's quadratic
 *     attention), the key alone is reserved on the same scheduler, whose
 *     buffers ggml only grows (CPU and CUDA buffers are one chunk; where a
 *     backend caps a buffer's size, ggml re-plans the chunks, and a graph that
 *     then misses its room is reserved again when allocated).
 *  4. A kind may ask for its scheduler to be freed and created again after each
 *     release (the seed's remedy for very large graphs). The new scheduler is
 *     reserved again at its next use.
 *  5. No graph reaches ggml's allocator or a backend before the shape guard
 *     (guard.c) has checked every tensor of it against the backends' limits:
 *     ggml aborts the process on shapes it cannot run.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-cpu.h"
#include "internal.h"

void cr_graphs_init(cr_graphs *g, ggml_backend_t *backends, int n_backends, size_t graph_size) {
    memset(g, 0, sizeof(*g));
    g->n_backends = n_backends;
    for (int i = 0; i < n_backends; i++) {
        g->backends[i] = backends[i];
    }
    g->graph_size = graph_size;
    g->limits = cr_limits_for(g->backends, n_backends);
    g->profile = cr_profile_new_if_enabled();
    for (int k = 0; k < CODECRT_GRAPH_KIND_COUNT; k++) {
        g->slots[k].key.kind = k;
    }
}

void cr_graphs_cpu_threads(cr_graphs *g, ggml_backend_t cpu, int n_threads) {
    g->cpu_compute = cpu;
    g->max_threads = g->cur_threads = n_threads;
    g->last_threads = 0; /* no compute yet */
    g->thread_work = cr_thread_work();
    ggml_backend_cpu_set_n_threads(cpu, n_threads);
}

static codecrt_status cr_slot_ensure_sched(cr_graphs *g, cr_graph_slot *slot, cr_err *err) {
    if (slot->sched) {
        return CODECRT_OK;
    }
    slot->sched = ggml_backend_sched_new(g->backends, NULL, g->n_backends, g->graph_size, false, true);
    if (!slot->sched) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "cannot create a backend scheduler");
    }
    if (g->profile) {
        ggml_backend_sched_set_eval_callback(slot->sched, cr_profile_eval_cb, g->profile);
    }
    slot->reserved = false;
    slot->reserved_frames = 0;
    slot->reserved_batch = 0;
    slot->reserved_flags = 0;
    return CODECRT_OK;
}

static struct ggml_context *cr_graph_ctx_new(size_t graph_size) {
    struct ggml_init_params ip = {
        .mem_size = ggml_tensor_overhead() * graph_size + ggml_graph_overhead_custom(graph_size, false),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    return ggml_init(ip);
}

void cr_graphs_release(cr_graphs *g, int32_t kind) {
    cr_graph_slot *slot = &g->slots[kind];
    if (slot->live || slot->ctx) {
        if (slot->sched) {
            /* rule 2: reset first, while slot->ctx (and so the graph) is alive */
            ggml_backend_sched_reset(slot->sched);
            g->resets++;
        }
        ggml_free(slot->ctx);
        slot->ctx = NULL;
        slot->graph = NULL;
        slot->live = false;
        memset(&slot->io, 0, sizeof(slot->io));
        if (slot->recreate && slot->sched) {
            ggml_backend_sched_free(slot->sched);
            slot->sched = NULL;
            slot->reserved = false;
            g->recreations++;
        }
    }
}

void cr_graphs_forget_envelope(cr_graphs *g, int32_t kind) {
    cr_graphs_release(g, kind);
    g->slots[kind].reserved = false; /* the scheduler and its buffers stay */
}

/*
 * Graph inputs into the device's buffer (backends[0]), where g->inputs_on_device.
 * ggml's scheduler gives a graph input the last backend (the CPU) and copies it into the
 * device at the first split that reads it, after synchronizing that split's backend
 * (ggml_backend_sched_compute_splits). A graph of one split pays nothing for that, but with
 * the residual unit's ops a SNAC tick has 49 splits, and an input first read by a late one
 * makes the launch wait there for the device (with the ops a tick's launch on an H100 grew
 * from 2.5 to 15-19 ms: docs/benchmarks.md). An input in the device's buffer is copied by
 * nobody: codecrt writes it with ggml_backend_tensor_set before the compute. A CPU split
 * that reads one gets it copied back, as any device tensor. Called after each reset and
 * before the scheduler plans a graph (reserve or alloc), since a reset forgets the
 * assignment. The default off the CPU; CODECRT_GRAPH_INPUTS=host is the way back.
 */
static void cr_inputs_to_device(const cr_graphs *g, ggml_backend_sched_t sched, struct ggml_cgraph *gf) {
    if (!g->inputs_on_device) {
        return;
    }
    const int n = ggml_graph_n_nodes(gf);
    for (int i = 0; i < n; i++) {
        const struct ggml_tensor *node = ggml_graph_node(gf, i);
        for (int j = 0; j < GGML_MAX_SRC; j++) {
            struct ggml_tensor *s = node->src[j];
            if (s && (s->flags & GGML_TENSOR_FLAG_INPUT) && !s->buffer && !s->view_src) {
                ggml_backend_sched_set_tensor_backend(sched, s, g->backends[0]);
            }
        }
    }
}

static bool cr_reserve_graph(const cr_graphs *g, ggml_backend_sched_t sched, struct ggml_cgraph *worst) {
    cr_inputs_to_device(g, sched, worst);
    return ggml_backend_sched_reserve(sched, worst);
}

static codecrt_status cr_reserve_envelope(cr_graphs *g, cr_graph_slot *slot, const cr_graph_key *env,
                                          cr_build_fn build, void *user, cr_err *err) {
    struct ggml_context *tmp = cr_graph_ctx_new(g->graph_size);
    if (!tmp) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "cannot allocate graph metadata");
    }
    cr_graph_io *io = calloc(1, sizeof(*io));
    struct ggml_cgraph *worst = io ? build(user, tmp, env, io) : NULL;
    const bool failed = !io || io->overflow;
    free(io);
    codecrt_status st = CODECRT_OK;
    if (!worst || failed) {
        st = cr_fail(err, CODECRT_E_COMPUTE, "cannot build the worst-case graph");
    } else if ((st = cr_guard_graph(&g->limits, worst, err)) != CODECRT_OK) {
        /* rule 5: refused before the scheduler sees it */
    } else if (!cr_reserve_graph(g, slot->sched, worst)) {
        /* ggml has freed the buffer it could not grow and kept the failed plan: nothing
           is covered any more, so the next graph of any size reserves again (a key inside
           the old envelope would otherwise be allocated into the freed buffer) */
        slot->reserved = false;
        st = cr_fail(err, CODECRT_E_OUT_OF_MEMORY,
                     "cannot reserve compute buffers for %d frames x %d sequences", env->n_frames,
                     env->n_batch);
    } else {
        slot->reserved = true;
        slot->reserved_frames = env->n_frames;
        slot->reserved_batch = env->n_batch;
        slot->reserved_flags = env->flags;
        g->reservations++;
    }
    /* rule 2 applies to the measuring graph too */
    ggml_backend_sched_reset(slot->sched);
    g->resets++;
    ggml_free(tmp);
    return st;
}

codecrt_status cr_graphs_reserve(cr_graphs *g, const cr_graph_key *envelope, cr_build_fn build,
                                 void *user, cr_err *err) {
    cr_graph_slot *slot = &g->slots[envelope->kind];
    cr_graphs_release(g, envelope->kind);
    codecrt_status st = cr_slot_ensure_sched(g, slot, err);
    if (st != CODECRT_OK) {
        return st;
    }
    cr_graph_key env = *envelope;
    if (slot->reserved) {
        env.n_frames = env.n_frames > slot->reserved_frames ? env.n_frames : slot->reserved_frames;
        env.n_batch = env.n_batch > slot->reserved_batch ? env.n_batch : slot->reserved_batch;
        env.flags |= slot->reserved_flags;
        if (env.n_frames == slot->reserved_frames && env.n_batch == slot->reserved_batch &&
            env.flags == slot->reserved_flags) {
            return CODECRT_OK;
        }
    }
    return cr_reserve_envelope(g, slot, &env, build, user, err);
}

static codecrt_status cr_graphs_take(cr_graphs *g, const cr_graph_key *key, cr_build_fn build, void *user,
                                     cr_graph_slot **out, cr_err *err);

codecrt_status cr_graphs_acquire(cr_graphs *g, const cr_graph_key *key, cr_build_fn build,
                                 void *user, cr_graph_slot **out, cr_err *err) {
    const double t0 = cr_now_ms();
    const codecrt_status st = cr_graphs_take(g, key, build, user, out, err);
    g->acquire_ms = cr_now_ms() - t0;
    g->inputs_ms = 0.0; /* until a stream launch fills them */
    return st;
}

static codecrt_status cr_graphs_take(cr_graphs *g, const cr_graph_key *key, cr_build_fn build, void *user,
                                     cr_graph_slot **out, cr_err *err) {
    cr_graph_slot *slot = &g->slots[key->kind];
    if (slot->live && memcmp(&slot->key, key, sizeof(*key)) == 0) {
        g->reused++; /* rule 1 */
        *out = slot;
        return CODECRT_OK;
    }
    cr_graphs_release(g, key->kind);
    codecrt_status st = cr_slot_ensure_sched(g, slot, err);
    if (st != CODECRT_OK) {
        return st;
    }
    if (!slot->reserved || key->n_frames > slot->reserved_frames || key->n_batch > slot->reserved_batch ||
        (key->flags & ~slot->reserved_flags) != 0) {
        /* rule 3: the envelope grows to cover this key; reserve its worst case (a flag adds
           parts to a graph, so the envelope's flags are the union of the keys') */
        cr_graph_key env = *key;
        if (slot->reserved) {
            env.n_frames = key->n_frames > slot->reserved_frames ? key->n_frames : slot->reserved_frames;
            env.n_batch = key->n_batch > slot->reserved_batch ? key->n_batch : slot->reserved_batch;
            env.flags = key->flags | slot->reserved_flags;
        }
        st = cr_reserve_envelope(g, slot, &env, build, user, err);
        if (st == CODECRT_E_TOO_LARGE && slot->reserved) {
            /* the grown envelope (frames of one key, batch of another) breaks a
               backend limit that this key alone may not: reserve for the key, on the
               same scheduler. ggml's allocator only grows its buffers (one chunk each on
               the CPU and CUDA: no size cap), so they keep covering the earlier envelope
               too, and keys that alternate between the two re-plan on the host instead of
               reallocating device buffers each time (as cr_graphs_forget_envelope) */
            st = cr_reserve_envelope(g, slot, key, build, user, err);
        }
        if (st != CODECRT_OK) {
            return st;
        }
    }
    slot->ctx = cr_graph_ctx_new(g->graph_size);
    if (!slot->ctx) {
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "cannot allocate graph metadata");
    }
    slot->graph = build(user, slot->ctx, key, &slot->io);
    if (!slot->graph || slot->io.overflow) {
        cr_graphs_release(g, key->kind);
        return cr_fail(err, CODECRT_E_COMPUTE, "cannot build the graph");
    }
    if ((st = cr_guard_graph(&g->limits, slot->graph, err)) != CODECRT_OK) {
        cr_graphs_release(g, key->kind); /* rule 5 */
        return st;
    }
    /* a fresh graph: the scheduler was reset by the release above */
    cr_inputs_to_device(g, slot->sched, slot->graph);
    if (!ggml_backend_sched_alloc_graph(slot->sched, slot->graph)) {
        slot->live = true; /* so that release resets and frees it */
        cr_graphs_release(g, key->kind);
        return cr_fail(err, CODECRT_E_OUT_OF_MEMORY, "cannot allocate the graph (%d frames x %d sequences)",
                       key->n_frames, key->n_batch);
    }
    slot->n_threads = g->cpu_compute ? cr_threads_for(slot->graph, g->max_threads, g->thread_work) : 0;
    slot->key = *key;
    slot->live = true;
    g->built++;
    *out = slot;
    return CODECRT_OK;
}

codecrt_status cr_graphs_launch(cr_graphs *g, cr_graph_slot *slot, cr_err *err) {
    if (g->cpu_compute && slot->n_threads != g->cur_threads) {
        ggml_backend_cpu_set_n_threads(g->cpu_compute, slot->n_threads);
        g->cur_threads = slot->n_threads;
    }
    g->last_threads = slot->n_threads; /* 0 off the CPU backend (set when built) */
    g->launch_ms = cr_now_ms();
    cr_profile_start(g->profile);
    const enum ggml_status gs = ggml_backend_sched_graph_compute_async(slot->sched, slot->graph);
    g->enqueue_ms = cr_now_ms() - g->launch_ms;
    g->computes++;
    if (gs != GGML_STATUS_SUCCESS) {
        g->last_compute_ms = cr_now_ms() - g->launch_ms;
        const int32_t kind = slot->key.kind;
        cr_graphs_release(g, kind);
        return cr_fail(err, gs == GGML_STATUS_ALLOC_FAILED ? CODECRT_E_OUT_OF_MEMORY : CODECRT_E_COMPUTE,
                       "graph computation failed (ggml status %d)", (int)gs);
    }
    return CODECRT_OK;
}

void cr_graphs_wait(cr_graphs *g, cr_graph_slot *slot) {
    ggml_backend_sched_synchronize(slot->sched);
    g->last_compute_ms = cr_now_ms() - g->launch_ms;
}

codecrt_status cr_graphs_compute(cr_graphs *g, cr_graph_slot *slot, cr_err *err) {
    const codecrt_status st = cr_graphs_launch(g, slot, err);
    if (st == CODECRT_OK) {
        cr_graphs_wait(g, slot);
    }
    return st;
}

size_t cr_graphs_buffer_size(const cr_graphs *g, int backend_index) {
    size_t total = 0;
    for (int k = 0; k < CODECRT_GRAPH_KIND_COUNT; k++) {
        if (g->slots[k].sched) {
            total += ggml_backend_sched_get_buffer_size(g->slots[k].sched, g->backends[backend_index]);
        }
    }
    return total;
}

void cr_graphs_free(cr_graphs *g) {
    for (int k = 0; k < CODECRT_GRAPH_KIND_COUNT; k++) {
        cr_graph_slot *slot = &g->slots[k];
        const bool recreate = slot->recreate;
        slot->recreate = false; /* do not count the final teardown as a recreation */
        cr_graphs_release(g, k);
        slot->recreate = recreate;
        if (slot->sched) {
            ggml_backend_sched_free(slot->sched);
            slot->sched = NULL;
        }
    }
    cr_profile_free(g->profile, g->n_backends > 0 ? ggml_backend_name(g->backends[0]) : "?");
    g->profile = NULL;
}
