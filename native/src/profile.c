/*
 * profile.c: where a graph's time goes, op by op (a development aid).
 *
 * With CODECRT_PROFILE_OPS=1 in the environment when a context is created,
 * its schedulers get an eval callback that observes every node, so ggml
 * computes the graph node by node; each node is charged the time since the
 * previous callback (or since the compute began), which on the CPU backend,
 * where computes are synchronous, is its compute plus the scheduler's own
 * work around it (input copies between backends land on the next node). View
 * nodes show up with about no time; all CPU custom ops share one entry.
 * Totals per op (unary ops by their own name) are printed to stderr when the
 * context is freed. It slows the compute it measures: never on in production.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CR_PROFILE_MAX_OPS 160

struct cr_profile {
    double last_ms;
    int n;
    const char *name[CR_PROFILE_MAX_OPS];
    double ms[CR_PROFILE_MAX_OPS];
    int64_t count[CR_PROFILE_MAX_OPS];
    int64_t elements[CR_PROFILE_MAX_OPS];
};

cr_profile *cr_profile_new_if_enabled(void) {
    const char *e = getenv("CODECRT_PROFILE_OPS");
    if (!e || !*e || strcmp(e, "0") == 0) {
        return NULL;
    }
    return calloc(1, sizeof(cr_profile));
}

void cr_profile_start(cr_profile *p) {
    if (p) {
        p->last_ms = cr_now_ms();
    }
}

bool cr_profile_eval_cb(struct ggml_tensor *t, bool ask, void *user) {
    cr_profile *p = user;
    if (ask) {
        return true; /* observe every node: ggml then computes them one at a time */
    }
    const double now = cr_now_ms();
    const char *name = ggml_op_desc(t); /* static strings: pointer equality is name equality */
    int i = 0;
    while (i < p->n && p->name[i] != name) {
        i++;
    }
    if (i == p->n && p->n < CR_PROFILE_MAX_OPS) {
        p->name[p->n++] = name;
    }
    if (i < p->n) {
        p->ms[i] += now - p->last_ms;
        p->count[i]++;
        p->elements[i] += ggml_nelements(t);
    }
    p->last_ms = now;
    return true;
}

void cr_profile_free(cr_profile *p, const char *device) {
    if (!p) {
        return;
    }
    double total = 0.0;
    for (int i = 0; i < p->n; i++) {
        total += p->ms[i];
    }
    fprintf(stderr, "codecrt op profile (%s): %.1f ms in %d op kinds\n", device, total, p->n);
    for (int done = 0; done < p->n; done++) { /* largest first, selection order */
        int best = -1;
        for (int i = 0; i < p->n; i++) {
            if (p->count[i] >= 0 && (best < 0 || p->ms[i] > p->ms[best])) {
                best = i;
            }
        }
        fprintf(stderr, "  %-16s %10.1f ms %5.1f %%  %8lld nodes  %12.3g elements/node\n", p->name[best],
                p->ms[best], total > 0 ? 100.0 * p->ms[best] / total : 0.0, (long long)p->count[best],
                (double)p->elements[best] / (double)(p->count[best] ? p->count[best] : 1));
        p->count[best] = -1;
    }
    free(p);
}
