/*
 * ops_upconv.c: the tail of a transposed conv (kernel 2s, stride s: SNAC's and DAC's
 * upsampling) on the time-fastest layout, as one op after its product. The product
 * z = W x [2s*C, T, B] holds, per input frame, the 2s output samples it reaches; output
 * sample u = s j + r is the lower half of frame j plus the upper half of frame j - 1.
 *
 * Composed from ggml ops this is four passes over the output (cr_upconv: the input
 * padded by a frame each side for the product, the halves added, the bias added, and
 * cr_to_tf's transpose copy). On an H100 an offline decode of 256 two-second SNAC items
 * spent 40 of its 230 ms of kernels on them (docs/benchmarks.md, offline profile). Here:
 * the product of the unpadded input, then one pass that reads both halves and writes
 * the time-fastest output with the bias and the bucket's mask.
 *
 * A ggml custom op (GGML_OP_CUSTOM) whose function below is its CPU implementation (the
 * portable graphs with CODECRT_FUSED_UNIT=1; tests/native/test_parity.py checks them
 * against the reference); on CUDA the codecrt ops backend (cuda/cuda_ops.cu) runs its
 * kernel, checked against this function (tests/native/test_gpu.py).
 */
#include "internal.h"

/* One task per range of (b, c) rows: the prefix's S frames where the op has one (the next
   layer's state: what ggml_concat(prefix, out) would hold), then the halves in the composed
   add's order (lower + upper), the bias, the mask, as cr_upconv and snac_mask compose them. */
void cr_upconv_tail_cpu(struct ggml_tensor *dst, int ith, int nth, void *user) {
    const struct ggml_tensor *z = dst->src[0], *bias = dst->src[1], *mask = dst->src[2], *pre = dst->src[3];
    const cr_upconv_params p = cr_upconv_unpack(user);
    const int64_t S = pre ? pre->ne[0] : 0, L = dst->ne[0], n = L - S, B = dst->ne[1], C = dst->ne[2];
    const int64_t T = z->ne[1], s = p.s;
    const float *zd = (const float *)z->data, *bd = (const float *)bias->data;
    const float *md = mask ? (const float *)mask->data : NULL;
    float *od = (float *)dst->data;
    const int64_t rows = B * C, r0 = rows * ith / nth, r1 = rows * (ith + 1) / nth;
    for (int64_t row = r0; row < r1; row++) {
        const int64_t c = row / B, b = row % B;
        const float *zb = zd + b * T * 2 * s * C;
        float *o = pre ? cr_prefix_row(od + row * L, pre, b, c) : od + row * L;
        for (int64_t i = 0; i < n; i++) {
            const int64_t u = i + p.crop, j = u / s, r = u % s;
            const float lo = j < T ? zb[j * 2 * s * C + r * C + c] : 0.0f;
            const float hi = j >= 1 ? zb[(j - 1) * 2 * s * C + (s + r) * C + c] : 0.0f;
            const float v = (lo + hi) + bd[c];
            o[i] = md ? v * md[b * n + i] : v;
        }
    }
}

struct ggml_tensor *cr_upconv_tail(struct ggml_context *ctx, struct ggml_tensor *z, struct ggml_tensor *b,
                                   struct ggml_tensor *mask, int s, int crop, int64_t n_out,
                                   struct ggml_tensor *prefix) {
    const int64_t C = b ? ggml_nelements(b) : 0, T = z->ne[1], B = z->ne[2];
    bool ok = b && z->type == GGML_TYPE_F32 && b->type == GGML_TYPE_F32 && ggml_is_contiguous(z) &&
              ggml_is_contiguous(b) && s >= 1 && s < CR_UPCONV_MAX_STRIDE && crop >= 0 &&
              crop < CR_UPCONV_MAX_STRIDE && z->ne[0] == 2 * s * C && z->ne[3] == 1 && n_out >= 1 &&
              n_out + crop <= s * (T + 1);
    if (ok && mask) {
        ok = mask->type == GGML_TYPE_F32 && ggml_is_contiguous(mask) && ggml_nelements(mask) == n_out * B;
    }
    if (ok && prefix) {
        ok = cr_prefix_fits(prefix, B, C);
    }
    if (!ok) {
        return NULL;
    }
    struct ggml_tensor *args[4] = {z, b, mask, prefix};
    const int64_t S = prefix ? prefix->ne[0] : 0;
    return ggml_custom_4d(ctx, GGML_TYPE_F32, S + n_out, B, C, 1, args, prefix ? 4 : mask ? 3 : 2,
                          cr_upconv_tail_cpu, GGML_N_TASKS_MAX,
                          cr_upconv_pack((cr_upconv_params){.s = s, .crop = crop}));
}
