/*
 * layers.h: graph building blocks shared by the codecs' decoders (layers.c).
 *
 * Every function adds nodes to a graph under construction in ctx (a no_alloc
 * context) and returns the result; none reads tensor data, so they run at
 * graph build time on any backend. All activations are F32. Two layouts:
 *
 *   channels fastest  x [C, T, B]  (ne0 = C): the decoders' default. A 1x1
 *                     conv is one product, a norm over channels a row norm,
 *                     per-channel parameters [C] broadcast as rows.
 *   time fastest      t [T, B, C] or its 2-D view [T*B, C]: what ggml's GPU
 *                     backends fuse the Snake in, and the WHCN layout of its
 *                     direct depthwise conv.
 *
 * Weights are named by their ggml ne (ne0 first); the converter writes them
 * so. PyTorch's Conv1d weight (Cout, Cin, K) is ne [K, Cin, Cout].
 *
 * Shapes are not checked here: ggml asserts (aborts) on inconsistent ones, so
 * an architecture builds only shapes it validated before (hyperparameters at
 * load, lengths and batches per request).
 *
 * Backend limits (docs/runtime.md, guard.c): every pad here pads along time
 * in ne0 (as [C*T, B], or time fastest), never with time in ne1, which CUDA's
 * pad kernel puts into grid y (at most 65,535 blocks). A layer added here
 * must keep that property for any length; native/tests/test_graphs.c runs the
 * guard with CUDA's limits on the SNAC graphs up to 300 s.
 *
 * Activations with a ggml op of exactly PyTorch's definition are used
 * directly, with no wrapper: ggml_elu (ELU, alpha 1, via expm1), ggml_gelu_erf
 * (nn.GELU(); ggml_gelu is the tanh approximation), ggml_silu, ggml_tanh.
 * native/tests/test_layers.c checks each layer here (and those ops) on the
 * CPU against a plain C reference in double.
 */
#ifndef CODECRT_LAYERS_H
#define CODECRT_LAYERS_H

#include <stdarg.h>

#include "internal.h"

/* ---------------------------------------------------------------- products */

/*
 * w [K, M] times x [K, T, B] -> [M, T, B], as one [K, T*B] product when x is
 * contiguous. Left 3-D, a product whose T is 16 or less (a stream tick's first
 * layers) goes to ggml CUDA's small-batch kernel once per sequence, rereading
 * w B times (1.4 ms of a 20 ms tick at 256 streams against ~0.1 ms for one
 * GEMM). test_graphs.c checks that stream graphs have no such product.
 * With w in a device buffer and 4 to 16 columns in all, x is padded with zero
 * columns to 17 so that CUDA runs the product on cuBLAS, not on the TF32
 * tensor cores of its small-batch kernel (layers.c): a GPU stream tick then
 * rounds as the offline decode does, and NVIDIA_TF32_OVERRIDE=0 makes both f32.
 */
struct ggml_tensor *cr_mm(struct ggml_context *ctx, struct ggml_tensor *w, struct ggml_tensor *x);

/* cr_mm's device path, on any backend: x padded with zero columns to at least
   17, one product, the padding's columns dropped. Same result as cr_mm. */
struct ggml_tensor *cr_mm_padded(struct ggml_context *ctx, struct ggml_tensor *w, struct ggml_tensor *x);

/* t itself when contiguous, else a contiguous copy (ggml_cont always adds a copy node). */
struct ggml_tensor *cr_dense(struct ggml_context *ctx, struct ggml_tensor *t);

/* A weight as F32 (itself, or an F16 weight cast in the graph): for a product that takes the
   weight as its second operand (x^T w, time fastest), which ggml's CPU and CUDA backends run
   only with an F32 second operand beside an F32 first (their supports_op; the scheduler
   asserted on the F16 one). The cast costs a pass over the weight each graph. */
struct ggml_tensor *cr_f32(struct ggml_context *ctx, struct ggml_tensor *w);

/* A named graph input [ne0, ne1, ne2] of type (an offline decode's codes, masks, positions). */
struct ggml_tensor *cr_input(struct ggml_context *ctx, enum ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                             const char *name);

/* 1x1 conv: x [Cin, T, B], w [Cin, Cout], b [Cout] or NULL -> [Cout, T, B] (cr_mm + bias). */
struct ggml_tensor *cr_pwconv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                              struct ggml_tensor *b);

/*
 * The fused CPU kernels a graph of this shape uses: NULL off the CPU (cpu_ops false),
 * else the context's (shape_ops: its precision and packs) or, for a graph built without
 * a context (tests), F32 without packs.
 */
const cr_cpu_ops *cr_graph_ops(bool cpu_ops, const cr_cpu_ops *shape_ops);

/*
 * Linear layer y = W x + b: x [K, ...], w [K, M] (PyTorch Linear (M, K)),
 * b [M] or NULL -> [M, ...]. With ops (a CPU graph) the fused kernel of
 * ops_avx512_linear.c where it applies (AVX-512, F32, M a multiple of 16; bias in
 * its epilogue); otherwise cr_mm (one product over the whole batch) and an add.
 */
struct ggml_tensor *cr_linear(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                              struct ggml_tensor *b, const cr_cpu_ops *ops);

/* ----------------------------------------------------------------- layouts */

/* [C, T, B] channels fastest -> [T*B, C] time fastest (ggml's tiled transpose copy). */
struct ggml_tensor *cr_to_tf(struct ggml_context *ctx, struct ggml_tensor *x);

/* [T*B, C] time fastest -> [C, T, B] channels fastest. */
struct ggml_tensor *cr_to_cf(struct ggml_context *ctx, struct ggml_tensor *t, int64_t T, int64_t B);

/*
 * Zero frames before and after each sequence of x [C, T, B]: [C, l+T+r, B].
 * Padded as x viewed [C*T, B] along its first dimension: ggml's CUDA pad
 * kernel puts ne1 into the launch grid's y (at most 65,535 blocks), so a pad
 * along time with time in ne1 aborts past 65,535 frames (2.73 s of SNAC at
 * 24 kHz); in ne0 time is unbounded and ne1 is the batch. On the CPU (cpu:
 * the graph runs on the CPU backend) that pad runs element by element on one
 * thread per sequence (24 ms of a 10 s SNAC decode's upsample input), so there
 * the frames are zeroed and x copied in by two row-parallel ops instead (fill,
 * then set): the same zeros and values.
 */
struct ggml_tensor *cr_pad_frames(struct ggml_context *ctx, struct ggml_tensor *x, int l, int r, bool cpu);

/* ------------------------------------------------------------------- Snake */

/*
 * Snake x + inv_alpha * sin(alpha x)^2 on t [T', C] (contiguous, time
 * fastest), alpha/inv_alpha [C], as the exact node sequence mul, sin, sqr,
 * mul, add that ggml's CUDA and Vulkan backends fuse into one kernel (composed
 * it is five passes over memory). The parameters' [1, C] views go into gf
 * first: a view node landing inside the five would break the pattern, and
 * the Snake would silently stay composed (test_graphs.c counts fusable ones).
 */
struct ggml_tensor *cr_snake_tf(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *t,
                                struct ggml_tensor *alpha, struct ggml_tensor *inv_alpha);

/* A weight by printf-style name (names were validated at load, so this cannot miss);
   cr_weightv takes the arguments as a va_list. Every codec's weight lookup. */
struct ggml_tensor *cr_weight(struct ggml_context *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
struct ggml_tensor *cr_weightv(struct ggml_context *w, const char *fmt, va_list ap);

/* Snake on x [C, T, B]: the fused CPU kernel when cpu_ops (the graph runs on
   the CPU backend), else cr_snake_tf between two tiled transposes. */
struct ggml_tensor *cr_snake(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *x,
                             struct ggml_tensor *alpha, struct ggml_tensor *inv_alpha, bool cpu_ops);

/* ------------------------------------------------------------------- norms */

/* LayerNorm over channels of x [C, T, B] (ggml_norm), times g [C], plus b [C]; g or b may be NULL. */
struct ggml_tensor *cr_layer_norm(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *g,
                                  struct ggml_tensor *b, float eps);

/* RMSNorm over channels of x [C, T, B]: x / sqrt(mean(x^2) + eps) * g [C] (g may be NULL). */
struct ggml_tensor *cr_rms_norm(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *g, float eps);

/*
 * GroupNorm of x [C, T, B] in n_groups groups of C / n_groups consecutive
 * channels, each normalized over its channels and every frame of its sequence
 * (PyTorch nn.GroupNorm on (B, C, T)), times g [C] plus b [C] (either NULL).
 * C must be a multiple of n_groups. Runs as ggml_group_norm on a copy with
 * each group's channels and frames together ([C/G, T, G, B]), and one copy back.
 */
struct ggml_tensor *cr_group_norm(struct ggml_context *ctx, struct ggml_tensor *x, int n_groups,
                                  struct ggml_tensor *g, struct ggml_tensor *b, float eps);

/* ------------------------------------------------------------ convolutions */

/*
 * Depthwise conv1d, stride 1, of x [C, T, B] (contiguous) with w [C, K] (tap
 * k of channel c at w[c + k*C]), b [C] or NULL, dilation d, zero padding pl
 * and pr frames -> [C, T + pl + pr - d (K-1), B]. "Same": pl = pr = d(K-1)/2;
 * valid: 0, 0; causal: d(K-1), 0. With cpu_ops (a CPU graph) the loop along the
 * channels of ops/ops_dwconv.c; otherwise ggml's direct depthwise 2-D conv (F32,
 * CPU and CUDA kernels) on a channels-last view, a symmetric pad the conv's own,
 * an asymmetric one cr_pad_frames first.
 */
struct ggml_tensor *cr_dwconv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                              struct ggml_tensor *b, int dilation, int pl, int pr, bool cpu_ops);

/*
 * The same conv on a time-fastest t [L, B, C] (any tensor of L*B*C elements,
 * contiguous, read as [L, B, C]) in ggml's WHCN layout (width = time, height
 * = batch): -> [L + 2 pad - d (K-1), B, C, 1], symmetric zero padding pad.
 * The kernel [C, K] is transposed to [K, 1, 1, C] by a small copy per compute.
 */
struct ggml_tensor *cr_dwconv_tf(struct ggml_context *ctx, struct ggml_tensor *t, int64_t L, int64_t B,
                                 struct ggml_tensor *w, struct ggml_tensor *b, int dilation, int pad);

/*
 * Conv1d, stride 1: x [Cin, T, B], w [K, Cin, Cout] (PyTorch (Cout, Cin, K)),
 * b [Cout] or NULL, dilation d, zero padding pl, pr -> [Cout, T + pl + pr -
 * d (K-1), B]. "Same", valid and causal as for cr_dwconv. With ops (a CPU
 * graph) the fused convolution of ops_avx512_linear.c where it applies (no column
 * matrix). Otherwise (GPUs), by default, x is transposed to time fastest, padded,
 * unrolled by ggml's F32 im2col to [Cin*K, T', B] and multiplied (never the F16
 * im2col of ggml_conv_1d). ggml's CUDA im2col gathers each column across channels:
 * 48 % of a DAC decode's kernel time on an H200 (docs/benchmarks.md). With
 * CODECRT_CONV=taps (read when a graph is built), K shifted products instead,
 * channels fastest, no transpose and no column matrix: x padded along time (in
 * ne0), ONE product with the taps side by side (w copied to [Cin, K*Cout]) -> z
 * [K*Cout, T', B], and y[:, t] = sum_k z[k Cout : (k+1) Cout, t + k d], K views
 * of one layout summed by K-1 consecutive adds (in gf: its views go in first),
 * which ggml's CUDA backend runs as one fused kernel. Checked on the CPU against
 * double and against im2col; on the GPUs 1.5 to 1.7x faster than im2col for DAC
 * and Qwen3, but not the default while one GPU check fails with it now and then
 * (docs/benchmarks.md).
 */
struct ggml_tensor *cr_conv1d(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *x,
                              struct ggml_tensor *w, struct ggml_tensor *b, int dilation, int pl, int pr,
                              const cr_cpu_ops *ops);

/* Whether a graph of this shape takes the layers below for its full convs and Snakes (DAC,
   Qwen3, the Vocos codecs): codecrt's device ops run it (fused_unit, off the fused CPU kernels)
   and CODECRT_CONV=cols (read when a graph is built). Opt-in: on an H100 (2026-12-08) DAC
   decoded 1.65 to 2.0x faster with them, but one GPU check (a 30 s DAC 24 kHz decode in two
   pieces, TF32 off) came out at 7.1e-4 from the CPU where every other check is at 4e-6,
   unexplained (docs/benchmarks.md). */
bool cr_conv_cols_on(bool fused_unit, bool cpu_ops);

/*
 * A stride-1 conv on codecrt's device ops (the graphs a CUDA context runs, and their C
 * functions in the portable graphs: cr_decode_shape.fused_unit off the CPU kernels): x
 * [Cin, T, B] channels fastest, through a Snake (alpha, inv [Cin]) first where given, w
 * [K, Cin, Cout] (PyTorch's (Cout, Cin, K)), b [Cout], dilation d, zero padding pl, pr,
 * res [Cout, T', B] contiguous or NULL -> [Cout, T', B], T' = T + pl + pr - d (K-1). The
 * columns op gathers [K Cin, T', B] from the channels-fastest rows through the Snake
 * (cr_cols), one product (cr_matmul), then the bias and the residual in one pass
 * (cr_bias_act): no transpose, no pad, no time-fastest im2col gather, no Snake tensor.
 * NULL where an op does not fit.
 */
struct ggml_tensor *cr_conv1d_cols(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *alpha,
                                   struct ggml_tensor *inv, struct ggml_tensor *w, struct ggml_tensor *b, int d,
                                   int pl, int pr, struct ggml_tensor *res);

/* A Snake x + inv sin(alpha x)^2 on codecrt's device ops: the columns of a 1-tap conv, one
   pass where the composed Snake is five between two transposes. NULL where it does not fit. */
struct ggml_tensor *cr_snake_cols(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *alpha,
                                  struct ggml_tensor *inv);

/* A 1x1 conv w [Cin, Cout] with its bias and the residual res (contiguous, the output's
   shape, or NULL) on codecrt's device ops: cr_matmul, then cr_bias_act. NULL where an op
   does not fit. */
struct ggml_tensor *cr_linear_ops(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                  struct ggml_tensor *b, struct ggml_tensor *res);

/* The largest tensor cr_conv1d makes off the CPU for a conv of K taps, Cin -> Cout, over T
   input frames (padding included) of B sequences, on either path: im2col's columns
   [K*Cin, T, B], the tap products [K*Cout, T, B], or the weight's taps side by side
   [Cin, K*Cout] (a copy per compute). For the architectures' max_tensor_elements. */
int64_t cr_conv1d_max_elements(int64_t K, int64_t Cin, int64_t Cout, int64_t T, int64_t B);

/*
 * Conv1d of K taps with few output channels (the decoders' last conv to PCM):
 * x [Cin, T, B], w [Cin, K*Cout] (row k*Cout + oc), b [Cout] or NULL, zero
 * padding pl, pr -> [Cout, T + pl + pr - K + 1, B]. One product [K*Cout, T, B] over
 * the unpadded input, the product padded (K*Cout rows rather than Cin), then
 * the K shifted diagonals summed.
 */
struct ggml_tensor *cr_conv_narrow(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                   struct ggml_tensor *b, int K, int pl, int pr);

/*
 * ConvTranspose1d with kernel 2s and stride s, as one product and an overlap
 * of two views. x [Cin, T, B], w [Cin, 2s*Cout] (row k*Cout + oc, PyTorch
 * weight (Cin, Cout, 2s) element [ic][oc][k]), b [Cout] or NULL -> [Cout,
 * n_out, B]: samples crop .. crop + n_out of the uncropped output, whose
 * sample t*s + k (k < 2s) receives input frame t through tap k.
 *
 * The uncropped output has (T+1)*s samples in T+1 blocks of s; block j is
 * cols_lo[:, j] + cols_hi[:, j-1] where cols = w^T x. Padding the input with
 * one zero frame on each side makes both terms plain views of one product
 * (the output, s times larger, is never padded). PyTorch's padding p and
 * output_padding op: crop = p, n_out = (T-1)*s - 2p + 2s + op (SNAC and DAC:
 * p = ceil(s/2), SNAC adds op = s % 2 for T*s samples); a causal one trimmed
 * of its last s samples (Mimi): crop 0, n_out = T*s. Needs crop + n_out <=
 * (T+1)*s. ops: NULL for ggml's product (cr_mm), or a CPU graph's fused
 * kernels (cr_linear: F32 or BF16 products where they apply).
 */
struct ggml_tensor *cr_upconv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                              struct ggml_tensor *b, int s, int crop, int64_t n_out, const cr_cpu_ops *ops, bool cpu);

/*
 * The same transposed conv into the time-fastest layout, for graphs that run the
 * codecrt ops (fused_unit): the product of the unpadded input, then the tail op
 * (cr_upconv_tail: both halves, the bias and the mask [n_out, B] or NULL in one pass)
 * -> [n_out, B, Cout], what cr_to_tf of cr_upconv's output (masked) holds. NULL where
 * the op does not apply (no bias, shapes), for cr_upconv instead.
 */
struct ggml_tensor *cr_upconv_tf(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                 struct ggml_tensor *b, struct ggml_tensor *mask, int s, int crop, int64_t n_out);

/*
 * The same transposed conv in a stream tick: buf [Cin, 1+n, B] holds the
 * previous input frame (the layer's state, zeros before the first) and n new
 * ones -> [Cout, n*s, B], uncropped output blocks 1..n of buf (block j is
 * tap 0..s-1 of frame j plus tap s..2s-1 of frame j-1, every input of it
 * present). The crop becomes a delay: output sample t of the tick is
 * uncropped sample t + s of buf, i.e. t + s - crop of the cropped layer.
 */
struct ggml_tensor *cr_upconv_step(struct ggml_context *ctx, struct ggml_tensor *buf, struct ggml_tensor *w,
                                   struct ggml_tensor *b, int s, const cr_cpu_ops *ops);

/* ---------------------------------------------------------- residual units */

/*
 * The weights of a Snake residual unit (SNAC's ResidualUnit with a depthwise
 * conv): Snake1, a depthwise conv of K taps (w [C, K], b [C]), Snake2, a 1x1
 * conv (w [C, C], b [C]). cr_res_unit_cols takes a full conv in dw_w, dw_b
 * (w [K, C, C], PyTorch's (Cout, Cin, K); DAC's and Qwen3's units).
 */
typedef struct cr_res_unit {
    struct ggml_tensor *alpha1, *inv_alpha1;
    struct ggml_tensor *dw_w, *dw_b;
    struct ggml_tensor *alpha2, *inv_alpha2;
    struct ggml_tensor *pw_w, *pw_b;
} cr_res_unit;

/* The unit's weights as the converters name them under unit (e.g. "decoder.block.1.res.0"):
   unit.snake1.alpha, .inv_alpha, unit.CONV.weight, .bias, unit.snake2.*, unit.pw.weight, .bias;
   conv is "dw" (SNAC) or "conv" (DAC, Qwen3). */
cr_res_unit cr_res_unit_weights(struct ggml_context *w, const char *unit, const char *conv);

/*
 * The unit's branch pw(Snake2(dw_dil(Snake1(buf)))) on buf [C, L, B]; ops: a CPU
 * graph's (cr_graph_ops), whose fused Snake, depthwise loop and product it takes, or NULL,
 * channels fastest. same: the conv pads P = dil (K-1)/2 on each side (L = n,
 * an offline decode); otherwise it is valid and buf holds 2P frames of left
 * context (a stream's state) before the n new ones (L = n + 2P). Returns
 * [C, n, B]; the caller adds the residual. Off the CPU the Snake-conv-Snake
 * core runs time fastest ([L*B, C]) between two tiled transposes, each Snake
 * in fusable form.
 */
struct ggml_tensor *cr_res_branch(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *buf,
                                  const cr_res_unit *u, int dil, bool same, const cr_cpu_ops *ops);

/*
 * The whole unit on a time-fastest buf [L, B, C] (contiguous), off the CPU:
 * residual + pw(Snake2(dw_dil(Snake1(buf)))) -> [n, B, C], time fastest. The
 * only transpose feeds the 1x1 conv, whose product is taken as y^T w so that
 * it lands time fastest again. same (an offline decode): the conv pads P =
 * dil (K-1)/2 zero frames on each side, n = L, the residual is buf; otherwise
 * (a stream tick) buf holds 2P frames of state before the n = L - 2P new ones,
 * the conv is valid and the residual is buf[P : P+n]. fused: Snake1, the conv,
 * Snake2 and the transpose as ONE op (cr_unit_core, ops/ops_res_unit.c; a device
 * kernel on CUDA), and the product's bias and the residual as another (cr_unit_tail);
 * else composed from ggml ops (seven passes over memory besides the product). mask
 * [n, B] (contiguous) or NULL: the output times a masked graph's 0/1 factor, in the
 * tail's pass when fused. prefix [S, B, C] (time contiguous) or NULL: the output is
 * concat(prefix, unit) [S + n, B, C] (a stream tick's next layer's buffer, its state
 * first), written by the tail op itself when fused.
 */
struct ggml_tensor *cr_res_unit_tf(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *buf,
                                   const cr_res_unit *u, int dil, bool same, bool fused, struct ggml_tensor *mask,
                                   struct ggml_tensor *prefix);

/*
 * A unit with a full conv on codecrt's device ops (cr_conv_cols_on): res +
 * pw(Snake2(conv_dil(Snake1(buf)))) with u's conv in dw_w [K, C, C], zero padding pl, pr
 * (buf [C, L, B] -> [C, L + pl + pr - dil (K-1), B]). Snake1 gathered into the conv's
 * columns (cr_conv1d_cols), Snake2 one pass (cr_snake_cols), the 1x1 product with its bias
 * and, where res is contiguous, the residual in one pass (cr_linear_ops); a strided res (a
 * stream's delay line, a view of its buffer) is added after. res NULL: the branch alone.
 * NULL where an op does not fit (the caller composes the unit then).
 */
struct ggml_tensor *cr_res_unit_cols(struct ggml_context *ctx, struct ggml_tensor *buf, const cr_res_unit *u,
                                     int dil, int pl, int pr, struct ggml_tensor *res);

#endif /* CODECRT_LAYERS_H */
