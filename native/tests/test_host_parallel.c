/*
 * test_host_parallel.c: cr_parallel_for (host_parallel.c) runs every item exactly once for
 * any thread count, none for an empty loop, only on the calling thread when given one, and
 * on more than one thread when given several: there item 0 waits (at most 5 s) until another
 * thread has run an item, so the check neither passes by luck nor fails by timing, and a
 * serial loop fails it.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "test_common.h"

#define N_MAX 1000

typedef struct job {
    pthread_t who[N_MAX];   /* the thread that ran item i, written before runs[i] counts it */
    atomic_int runs[N_MAX];
    int64_t n;
    bool wait_for_others;
} job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* whether an item other than 0 has run on a thread other than `self` */
static bool ran_elsewhere(job *j, pthread_t self) {
    for (int64_t k = 1; k < j->n; k++) {
        if (atomic_load(&j->runs[k]) > 0 && !pthread_equal(j->who[k], self)) {
            return true;
        }
    }
    return false;
}

static void item(void *arg, int64_t i) {
    job *j = arg;
    j->who[i] = pthread_self();
    atomic_fetch_add(&j->runs[i], 1);
    if (i == 0 && j->wait_for_others) {
        const double t0 = now_s();
        while (!ran_elsewhere(j, j->who[0]) && now_s() - t0 < 5.0) {
        }
    }
}

static void check(int threads, int64_t n, bool wait_for_others) {
    static job j;
    for (int i = 0; i < N_MAX; i++) {
        atomic_init(&j.runs[i], 0);
    }
    j.n = n;
    j.wait_for_others = wait_for_others;
    cr_parallel_for(threads, n, item, &j);
    int once = 0, beyond = 0, off_caller = 0;
    for (int64_t i = 0; i < N_MAX; i++) {
        const int r = atomic_load(&j.runs[i]);
        once += i < n && r == 1;
        beyond += i >= n && r != 0;
        off_caller += i < n && r > 0 && !pthread_equal(j.who[i], pthread_self());
    }
    CHECK(once == n && beyond == 0, "%d threads, %lld items: %d ran once, %d past the end ran", threads,
          (long long)n, once, beyond);
    if (threads <= 1) {
        CHECK(off_caller == 0, "%d threads: %d items ran off the calling thread", threads, off_caller);
    }
    if (wait_for_others) {
        CHECK(n > 1 && ran_elsewhere(&j, j.who[0]), "%d threads, %lld items: all on one thread", threads,
              (long long)n);
    }
}

int main(void) {
    const int threads[] = {0, 1, 2, 3, 8, 200};
    const int64_t counts[] = {0, 1, 2, 9, 720, N_MAX};
    for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            check(threads[t], counts[c], false);
        }
    }
    check(2, 64, true);
    check(8, N_MAX, true);
    printf("test_host_parallel: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
