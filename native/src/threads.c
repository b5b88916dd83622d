/*
 * threads.c: how many CPU threads a graph is worth.
 *
 * ggml's CPU backend runs a graph with every thread it is given, and its
 * threads meet at a barrier after each node. With OpenMP's passive wait (what
 * codecrt asks for, docs/runtime.md) a barrier is a sleep and a wake-up: 17 to
 * 25 us of CPU per compute node on this project's 2-vCPU machine. A 4-frame
 * SNAC tick of one stream is 200 compute nodes of 2e6 multiply-adds each on
 * average, so a second thread adds 7 ms of CPU to a 14 ms tick and makes it
 * slower; at three streams a tick the second thread takes 19 % off the wall
 * time for 28 % more CPU, and from there on it pays more and more
 * (docs/benchmarks.md, "Threads per graph").
 *
 * So a graph gets one thread per CR_THREAD_WORK multiply-adds per compute node
 * (its work spread over the barriers that each thread adds), at least 1 and at
 * most the context's n_threads. The work is an estimate from shapes: a product
 * counts its output times the summed dimension, a depthwise convolution its
 * output times the kernel, codecrt's fused linear and conv kernels their output
 * times the weight's input size, any other op its output size. Views cost
 * nothing and add no barrier. CODECRT_THREAD_WORK=N overrides the constant
 * (0: always n_threads).
 */
#include <stdlib.h>

#include "internal.h"

/* two threads from 5e6 multiply-adds per node: a 4-frame tick of 3 SNAC streams
   (5.8e6), of 2 streams not (3.9e6: 10 % faster on two threads, for 41 % more CPU);
   a one-frame Mimi tick from about 6 streams (1e6 per stream) */
#define CR_THREAD_WORK 2.5e6

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

/* multiply-adds (or element passes) of one node */
static double cr_node_work(const struct ggml_tensor *t) {
    const double out = (double)ggml_nelements(t);
    switch (t->op) {
    case GGML_OP_MUL_MAT:
    case GGML_OP_OUT_PROD:
        return out * (double)t->src[0]->ne[t->op == GGML_OP_MUL_MAT ? 0 : 1];
    case GGML_OP_CONV_2D_DW:
        return out * (double)(t->src[0]->ne[0] * t->src[0]->ne[1]);
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
