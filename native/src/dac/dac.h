/*
 * dac.h: the DAC decoder (descript-audio-codec 1.0.0: the 44.1, 24 and 16 kHz
 * releases, and IBM's DAC.speech 24 kHz that OuteTTS 1.0 uses): what its
 * files share. Not installed.
 *
 *   dac.c         hyperparameters, tensor list, stream states and latency,
 *                 the architecture table; the pieces both graphs use
 *   dac_decode.c  the offline decode graph and its inputs
 *   dac_stream.c  the streaming tick graph
 *
 * SNAC was derived from DAC; DAC's decoder is SNAC's without the noise
 * blocks, the attention and the depthwise convolutions: every k7 convolution
 * is full (C x C). Activations are F32 [C, T, B]. Decoder path (per sequence):
 *
 *   codes_q [T] -> get_rows(codebook_q) [8, T] -> out_proj_q [L, T]; sum over q
 *   conv k7 [L, T] -> [D, T]
 *   for each block i (stride s_i): Snake -> ConvTranspose(k 2s, stride s,
 *     padding ceil(s/2), no output padding) [C_{i+1}, n_{i+1}] -> 3 x
 *     ResidualUnit (Snake, conv k7 dilated 1/3/9, Snake, 1x1, + residual)
 *   Snake -> conv k7 to one channel -> tanh -> [1, n_N]
 *
 * Lengths: n_0 = T, n_{i+1} = s_i n_i - (s_i mod 2): an odd stride loses one
 * sample (its transposed conv has no output padding), so the 24 and 16 kHz
 * models give 320 T - 8 samples. The runtime promises T * hop samples per
 * decode (codecrt.h); DAC's graphs append hop T - n_N zero samples, so the
 * first n_N samples are DAC's and the rest are silence (8 samples, 0.33 ms at
 * 24 kHz). Masks and stream ends use the valid length n_i of each point
 * (dac_valid_points), which is what makes bucketed and streamed decodes equal
 * the exact one.
 */
#ifndef CODECRT_DAC_H
#define CODECRT_DAC_H

#include "layers.h"
#include "stream_state.h"

#define DAC_MAX_BLOCKS 8
#define DAC_MAX_CODEBOOKS CODECRT_MAX_LEVELS
#define DAC_K 7

typedef struct dac_hparams {
    int32_t sampling_rate;
    int32_t hop_length;
    int32_t latent_dim;
    int32_t decoder_dim;
    int32_t n_blocks;
    int32_t rates[DAC_MAX_BLOCKS];
    int32_t codebook_size;
    int32_t codebook_dim;
    int32_t n_codebooks;
} dac_hparams;

/* Indices into the graph's io[] table. */
enum {
    DAC_IO_OUT = 0,
    DAC_IO_CODES = 1,                                 /* + codebook */
    DAC_IO_MASK = DAC_IO_CODES + DAC_MAX_CODEBOOKS,   /* + point: 0 latent, 1+i block i, n_blocks+1 the output */
    DAC_IO_END = DAC_IO_MASK + DAC_MAX_BLOCKS + 2
};
_Static_assert(DAC_IO_END <= CR_MAX_IO, "io table too small");

static inline int32_t dac_channels(const dac_hparams *hp, int i) { return hp->decoder_dim >> i; }

/* Valid points of a sequence of T frames after block i (i = 0: the latent, T). */
int64_t dac_points(const dac_hparams *hp, int64_t T, int i);

/* ------------------------------------------------- graph pieces (dac.c) */

/* weight lookup by printf-style name (layers.h) */
#define dac_w cr_weight

/* Snake on x [C, T, B] by prefix's parameters: with dev (cr_conv_cols_on: codecrt's device
   ops, or their C functions in the portable graphs, and CODECRT_CONV=cols) one pass of the
   columns op (cr_snake_cols); else cr_snake (fused on the CPU, fusable elsewhere). */
struct ggml_tensor *dac_snake(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                              struct ggml_tensor *x, const char *prefix, bool cpu_ops, bool dev);
/*
 * ResidualUnit j of block i: res + pw(Snake2(conv_dil(Snake1(buf)))), buf [C, L, B]. same:
 * the k7 conv pads 3 dil frames on each side (L = n, an offline decode); otherwise it is
 * valid and buf holds 6 dil frames of left context before the n new ones (a stream). res:
 * the residual [C, n, B] (a view of buf in a stream), or NULL for the branch alone. dev: on
 * codecrt's device ops (cr_res_unit_cols), else the CPU kernels (ops) or ggml's composed
 * ops. Returns [C, n, B].
 */
struct ggml_tensor *dac_res_unit(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                 struct ggml_tensor *buf, int i, int j, bool same, struct ggml_tensor *res,
                                 const cr_cpu_ops *ops, bool dev);
/*
 * The quantizer's latent: sum over codebooks q of out_proj_q(codebook_q[codes[q]]), codes[q]
 * [N] -> [L, N], as ONE product: the codebook vectors side by side [H Q, N] times the
 * projections side by side [H Q, L] (both concatenated in the graph: 1 MB of weights for
 * 32 codebooks), plus the summed biases. One product per codebook and a sum (32 of each at
 * 24 kHz, each a pass over [L, N]) took 4 % of a 10 s F32 decode on 2 cores.
 */
struct ggml_tensor *dac_quantize(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *const *codes,
                                 int n_codebooks, const cr_cpu_ops *ops);

/* The k7 convolutions (input, residual units): with dev the columns op and a product
   (cr_conv1d_cols), else cr_conv1d (the fused CPU convolution where ops applies). */
struct ggml_tensor *dac_conv(struct ggml_context *ctx, struct ggml_cgraph *gf, struct ggml_tensor *x,
                             struct ggml_tensor *w, struct ggml_tensor *b, int dil, int pad, const cr_cpu_ops *ops,
                             bool dev);

/* ------------------------------------------------- offline (dac_decode.c) */

struct ggml_cgraph *dac_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                     const cr_decode_shape *shape, cr_graph_io *gio);
size_t dac_scratch_floats(const cr_model *model, const cr_decode_shape *shape);
int64_t dac_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context);
void dac_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *gio,
                    const cr_decode_inputs *in);

/* ------------------------------------------------ streaming (dac_stream.c) */

struct ggml_cgraph *dac_build_stream(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                     const cr_stream_shape *shape, struct ggml_tensor *const *pool, int n_pool,
                                     cr_graph_io *io);

#endif /* CODECRT_DAC_H */
