/*
 * threads.c: how many CPU threads a graph is worth.
 *
 * ggml's CPU backend runs a graph with every thread it is given, and its
 * threads meet at a barrier after each node. With OpenMP's passive wait (what
 * codecrt asks for, docs/runtime.md) a barrier is a sleep and a wake-up: 17 to
 * 25 us of CPU per compute node on this project's 2-vCPU machine. A 4-frame
 * SNAC tick of one stream is 200 compute nodes of 2e6 multiply-adds each on
 * average, so a second thread adds 7 ms of CPU to a 14 ms tick and makes it
 * slower; from three streams a tick on it pays (docs/benchmarks.md, "Threads
 * per graph"; the measured trade-offs are beside CR_THREAD_WORK).
 *
 * So a graph gets one thread per CR_THREAD_WORK multiply-adds per compute node
 * (its work spread over the barriers that each thread adds), at least 1 and at
 * most the context's n_threads. The work is an estimate from shapes: a product
 * counts its output times the summed dimension, a depthwise convolution its
 * output times the kernel, codecrt's fused linear and conv kernels their output
 * times the weight's input size, a write into a view (set_rows, set, cpy) what
 * it writes, a unary op that ggml computes with libm 200 per element, any other
 * op its output size. Views cost nothing and add no barrier.
 * CODECRT_THREAD_WORK=N overrides the constant (0: always n_threads).
 */
#include <stdlib.h>

#include "internal.h"

/* two threads from 4.4e6 per node: a 4-frame tick of 3 SNAC streams (5.7e6, 21 to 24 %
   faster on two threads for 20 to 26 % more CPU), of 2 not (3.8e6: 7 to 10 % faster for
   41 to 45 % more CPU); a one-frame Mimi tick from 8 streams (29 % faster for 18 % more
   CPU), of 6 not (63.5 ms on one thread, under its 80 ms period) */
#define CR_THREAD_WORK 2.2e6

double cr_thread_work(void) {
    const char *e = getenv("CODECRT_THREAD_WORK");
    if (e && *e) {
        char *end = NULL;
        const double v = strtod(e, &end);
        if (end != e && v >= 0.0) {
            return v;
        }
    }
    return CR_THREAD_WORK;
}

static bool cr_is_layout_op(enum ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

/* ggml's CPU backend computes these element by element with libm (expm1f, erff,
   tanhf, expf): its ELU took 7 ns an element on one core in Mimi's ticks (before
   ops_elu.c), against 0.034 ns per multiply-add for a SNAC tick as a whole */
#define CR_LIBM_WORK 200.0

static bool cr_is_libm_unary(const struct ggml_tensor *t) {
    if (t->op == GGML_OP_GLU) {
        return true; /* the gated GELU/SiLU forms */
    }
    if (t->op != GGML_OP_UNARY) {
        return false;
    }
    switch (ggml_get_unary_op(t)) {
    case GGML_UNARY_OP_ELU:
    case GGML_UNARY_OP_GELU_ERF:
    case GGML_UNARY_OP_TANH:
    case GGML_UNARY_OP_EXP:
    case GGML_UNARY_OP_SIGMOID:
        return true;
    default:
        return false;
    }
}

/* multiply-adds (or their equivalent in time) of one node */
static double cr_node_work(const struct ggml_tensor *t) {
    const double out = (double)ggml_nelements(t);
    if (cr_is_libm_unary(t)) {
        return out * CR_LIBM_WORK;
    }
    switch (t->op) {
    case GGML_OP_MUL_MAT:
    case GGML_OP_OUT_PROD:
        return out * (double)t->src[0]->ne[t->op == GGML_OP_MUL_MAT ? 0 : 1];
    case GGML_OP_CONV_2D_DW:
        return out * (double)(t->src[0]->ne[0] * t->src[0]->ne[1]);
    case GGML_OP_SET_ROWS:
    case GGML_OP_SET:
    case GGML_OP_ACC:
        /* writes src[1] into a view of src[0] (a state pool, a buffer): the rows written count,
           not the destination's size, which grows with max_streams */
        return (double)ggml_nelements(t->src[1]);
    case GGML_OP_CPY:
        return (double)ggml_nelements(t->src[0]);
    case GGML_OP_CUSTOM:
        /* the fused linear/conv kernels: src[1] is the weight, out's rows are its outputs */
        if (t->src[1] && ggml_n_dims(t->src[1]) >= 2 && t->ne[0] > 0) {
            return out * (double)ggml_nelements(t->src[1]) / (double)t->ne[0];
        }
        return out;
    default:
        return out;
    }
}

int cr_threads_for(struct ggml_cgraph *gf, int n_threads, double work_per_thread) {
    if (n_threads <= 1 || work_per_thread <= 0.0) {
        return n_threads < 1 ? 1 : n_threads;
    }
    double work = 0.0;
    int64_t nodes = 0;
    const int n = ggml_graph_n_nodes(gf);
    for (int i = 0; i < n; i++) {
        const struct ggml_tensor *t = ggml_graph_node(gf, i);
        if (!cr_is_layout_op(t->op)) {
            work += cr_node_work(t);
            nodes++;
        }
    }
    if (nodes == 0) {
        return 1;
    }
    const double k = work / (double)nodes / work_per_thread;
    return k >= (double)n_threads ? n_threads : k < 1.0 ? 1 : (int)k;
}
