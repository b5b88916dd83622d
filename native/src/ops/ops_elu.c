/*
 * ops_elu.c: the CPU ELU (alpha 1), x > 0 ? x : expm1(x). ggml's CPU ELU calls
 * libm's expm1f element by element, 7 ns an element here: 28 % of a Mimi tick's
 * CPU time (its SEANet decoder applies ELU at every resolution up to 24 kHz).
 * This one is branch-free arithmetic the compiler vectorizes. It runs as a ggml
 * custom op, so only when the graph runs on the CPU backend; GPU graphs keep
 * ggml's ELU.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

/* expm1(x) for x <= 0: x = k ln2 + r with |r| <= ln2/2 (Cody-Waite, two parts of
   ln2), expm1(r) by its Taylor polynomial to degree 8 (truncation < 1e-9
   relative), then expm1(x) = 2^k expm1(r) + (2^k - 1), exact for k = 0 (no loss
   near zero). x is clamped at -87, where 2^k is still a normal float and the
   result is -1 in float. */
static inline float cr_expm1_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float k = rintf(x * 1.44269504088896341f);
    float r = fmaf(-k, 0.693145751953125f, x);
    r = fmaf(-k, 1.428606765330187045e-6f, r);
    float p = 2.48015873015873016e-05f; /* 1/8! */
    p = fmaf(p, r, 1.98412698412698413e-04f);
    p = fmaf(p, r, 1.38888888888888889e-03f);
    p = fmaf(p, r, 8.33333333333333333e-03f);
    p = fmaf(p, r, 4.16666666666666667e-02f);
    p = fmaf(p, r, 1.66666666666666667e-01f);
    p = fmaf(p, r, 0.5f);
    const float em1 = fmaf(p * r, r, r); /* expm1(r) */
    const int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof(two_k));
    return fmaf(two_k, em1, two_k - 1.0f);
}

static void cr_elu_kernel(struct ggml_tensor *dst, const struct ggml_tensor *x, int ith, int nth, void *user) {
    (void)user;
    const int64_t n = ggml_nelements(x);
    const int64_t per = (n + nth - 1) / nth;
    const int64_t i0 = per * ith;
    const int64_t i1 = i0 + per < n ? i0 + per : n;
    const float *xd = (const float *)x->data;
    float *yd = (float *)dst->data;
    for (int64_t i = i0; i < i1; i++) {
        const float v = xd[i];
        const float e = cr_expm1_neg(v < 0.0f ? v : 0.0f);
        yd[i] = v > 0.0f ? v : (v == v ? e : v); /* NaN stays NaN, as expm1f gives */
    }
}

struct ggml_tensor *cr_elu_cpu(struct ggml_context *ctx, struct ggml_tensor *x) {
#if defined(__FMA__)
    if (x->type == GGML_TYPE_F32 && ggml_is_contiguous(x)) {
        return ggml_map_custom1(ctx, x, cr_elu_kernel, GGML_N_TASKS_MAX, NULL);
    }
#else
    /* without hardware FMA in the build's target, fmaf and rintf are library calls and
       the kernel is slower than libm's expm1f (12.9 against 5.2 ns an element, gcc 12) */
    (void)cr_elu_kernel;
#endif
    return ggml_elu(ctx, x);
}
