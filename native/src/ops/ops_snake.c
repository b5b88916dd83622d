/*
 * ops_snake.c: the fused CPU Snake, an element-wise chain that dominates a
 * decoder's time when composed from ggml ops (each op is a full pass over
 * memory). It runs as a ggml custom op, so only when the graph runs on the
 * CPU backend; GPU graphs use the composed, fusable form (layers.h).
 */
#include <math.h>

#include "internal.h"

/* sin(u)^2 for any finite u: Cody-Waite reduction by pi (the sign of the
   reduced sine does not matter once squared), then an odd Taylor polynomial of
   degree 11 on [-pi/2, pi/2] (truncation error < 6e-10). Written branch-free so
   that the compiler vectorizes the loop that calls it. */
static inline float cr_sin2f(float u) {
    const float k = rintf(u * 0.31830988618379067f);
    float r = fmaf(-k, 3.140625f, u);
    r = fmaf(-k, 9.67502593994140625e-4f, r);
    r = fmaf(-k, 1.509957990978376432e-7f, r);
    const float r2 = r * r;
    float p = -2.5052108385441720e-08f;
    p = fmaf(p, r2, 2.7557319223985893e-06f);
    p = fmaf(p, r2, -1.9841269841269841e-04f);
    p = fmaf(p, r2, 8.3333333333333333e-03f);
    p = fmaf(p, r2, -1.6666666666666667e-01f);
    const float s = fmaf(r * r2, p, r);
    return s * s;
}

/* Snake: dst = x + inv_alpha * sin(alpha * x)^2, x [C, rows], alpha/inv [C]. */
static void cr_snake_kernel(struct ggml_tensor *dst, const struct ggml_tensor *x,
                            const struct ggml_tensor *alpha, const struct ggml_tensor *inv, int ith,
                            int nth, void *user) {
    (void)user;
    const int64_t C = x->ne[0];
    const int64_t rows = ggml_nrows(x);
    const int64_t per = (rows + nth - 1) / nth;
    const int64_t r0 = per * ith;
    const int64_t r1 = r0 + per < rows ? r0 + per : rows;
    const float *a = (const float *)alpha->data;
    const float *ia = (const float *)inv->data;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = (const float *)x->data + r * C;
        float *yr = (float *)dst->data + r * C;
        for (int64_t c = 0; c < C; c++) {
            yr[c] = fmaf(ia[c], cr_sin2f(a[c] * xr[c]), xr[c]);
        }
    }
}

struct ggml_tensor *cr_snake_cpu(struct ggml_context *ctx, struct ggml_tensor *x,
                                 struct ggml_tensor *alpha, struct ggml_tensor *inv_alpha) {
    return ggml_map_custom3(ctx, x, alpha, inv_alpha, cr_snake_kernel, GGML_N_TASKS_MAX, NULL);
}
