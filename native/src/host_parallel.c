/*
 * host_parallel.c: a host loop over independent items on several threads.
 *
 * Some per-sequence work stays on the host because it must match the reference
 * bit for bit in an order no graph op keeps (S3Gen's harmonic source: a running
 * phase summed in double, sample by sample) or because it is a pure function of
 * its key (counter-based noise). Done item after item, it grows with the batch
 * while the device's graph does not: on an H200 a tick of ten S3Gen streams spent
 * about as long on the host as on the device. Here the items are spread over up to
 * the context's CPU threads while the device waits anyway.
 *
 * Threads are created and joined per call (no pool outlives it, so a process may
 * fork between calls); items are taken from a shared counter, the calling thread
 * takes its share, and a thread that cannot be created only leaves more items to
 * the others. Each item's result does not depend on which thread ran it.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"

typedef struct cr_parallel_job {
    cr_parallel_fn fn;
    void *arg;
    int64_t n;
    atomic_llong next;
} cr_parallel_job;

static void *cr_parallel_worker(void *p) {
    cr_parallel_job *job = p;
    for (;;) {
        const int64_t i = (int64_t)atomic_fetch_add(&job->next, 1);
        if (i >= job->n) {
            return NULL;
        }
        job->fn(job->arg, i);
    }
}

void cr_parallel_for(int n_threads, int64_t n, cr_parallel_fn fn, void *arg) {
    if (n < 1) {
        return;
    }
    int helpers = n_threads > CR_PARALLEL_MAX_THREADS ? CR_PARALLEL_MAX_THREADS - 1 : n_threads - 1;
    if (helpers > n - 1) {
        helpers = (int)(n - 1);
    }
    cr_parallel_job job = {.fn = fn, .arg = arg, .n = n};
    atomic_init(&job.next, 0);
    pthread_t tid[CR_PARALLEL_MAX_THREADS];
    bool started[CR_PARALLEL_MAX_THREADS] = {false};
    for (int t = 0; t < helpers; t++) {
        started[t] = pthread_create(&tid[t], NULL, cr_parallel_worker, &job) == 0;
    }
    cr_parallel_worker(&job);
    for (int t = 0; t < helpers; t++) {
        if (started[t]) {
            pthread_join(tid[t], NULL);
        }
    }
}
