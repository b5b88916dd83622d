/*
 * test_graph_inputs.c: where the graph lifecycle manager puts a graph's inputs.
 *
 * ggml's scheduler gives a graph input the last backend (the CPU) and copies it into the
 * device at the first split that reads it, after synchronizing that split's backend; in a
 * graph of many splits that stalls the launch (graph.c, cr_inputs_to_device). A context off
 * the CPU therefore asks for its inputs in backends[0]'s buffer (inputs_on_device). CI has
 * no GPU: a second CPU backend stands in for the device, which the scheduler plans the same
 * way (backends[0] first, the CPU last).
 */
#define _POSIX_C_SOURCE 200809L
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "internal.h"
#include "layers.h"
#include "test_common.h"

enum { IN_A, IN_B };

/* y = 2 a + b, a and b inputs [n] */
static struct ggml_cgraph *build(void *user, struct ggml_context *ctx0, const cr_graph_key *key, cr_graph_io *io) {
    (void)user;
    struct ggml_tensor *a = cr_input(ctx0, GGML_TYPE_F32, key->n_frames, 1, 1, "a");
    struct ggml_tensor *b = cr_input(ctx0, GGML_TYPE_F32, key->n_frames, 1, 1, "b");
    struct ggml_tensor *y = ggml_add(ctx0, ggml_scale(ctx0, a, 2.0f), b);
    ggml_set_output(y);
    io->t[IN_A] = a;
    io->t[IN_B] = b;
    io->out = y;
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx0, CR_GRAPH_SIZE, false);
    ggml_build_forward_expand(gf, y);
    return gf;
}

/* One graph of n points through the manager: its inputs' backend, and y. */
static void decode(cr_graphs *g, int32_t n, ggml_backend_t want, const char *what) {
    const cr_graph_key key = {.kind = 0, .n_frames = n, .n_batch = 1};
    cr_graph_slot *slot = NULL;
    cr_err err = {{0}};
    CHECK_OK(cr_graphs_acquire(g, &key, build, NULL, &slot, &err));
    if (!slot) {
        return;
    }
    for (int i = IN_A; i <= IN_B; i++) {
        const ggml_backend_t got = ggml_backend_sched_get_tensor_backend(slot->sched, slot->io.t[i]);
        CHECK(got == want, "%s, %d points: input %d on %s", what, n, i, got ? ggml_backend_name(got) : "none");
    }
    float a[256], b[256], y[256];
    for (int i = 0; i < n; i++) {
        a[i] = (float)i;
        b[i] = 0.5f * (float)(n - i);
    }
    ggml_backend_tensor_set(slot->io.t[IN_A], a, 0, (size_t)n * sizeof(float));
    ggml_backend_tensor_set(slot->io.t[IN_B], b, 0, (size_t)n * sizeof(float));
    CHECK_OK(cr_graphs_compute(g, slot, &err));
    ggml_backend_tensor_get(slot->io.out, y, 0, (size_t)n * sizeof(float));
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        wrong += y[i] != 2.0f * a[i] + b[i];
    }
    CHECK(wrong == 0, "%s, %d points: %d wrong", what, n, wrong);
}

static void check(bool on_device) {
    ggml_backend_t dev = ggml_backend_cpu_init(), cpu = ggml_backend_cpu_init();
    CHECK(dev && cpu, "ggml_backend_cpu_init");
    ggml_backend_t backends[2] = {dev, cpu};
    cr_graphs g;
    cr_graphs_init(&g, backends, 2, CR_GRAPH_SIZE);
    g.inputs_on_device = on_device;
    const char *what = on_device ? "inputs on the device" : "inputs where ggml puts them";
    const ggml_backend_t want = on_device ? dev : cpu;
    /* the reserved envelope, then graphs inside it (rebuilt: the key changes) and one reused */
    const cr_graph_key env = {.kind = 0, .n_frames = 256, .n_batch = 1};
    cr_err err = {{0}};
    CHECK_OK(cr_graphs_reserve(&g, &env, build, NULL, &err));
    decode(&g, 256, want, what);
    decode(&g, 100, want, what);
    decode(&g, 100, want, what);
    CHECK(g.reservations == 1 && g.built == 2 && g.reused == 1, "%s: %llu reservations, %llu built, %llu reused",
          what, (unsigned long long)g.reservations, (unsigned long long)g.built, (unsigned long long)g.reused);
    cr_graphs_free(&g);
    ggml_backend_free(dev);
    ggml_backend_free(cpu);
}

int main(void) {
    check(true);
    check(false);
    printf("test_graph_inputs: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
