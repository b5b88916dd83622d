/*
 * snac.h: the SNAC decoder (hubertsiuzdak/snac), 24, 32 and 44 kHz models:
 * what its files share. Not installed.
 *
 *   snac.c         hyperparameters, tensor list, stream states and latency, the
 *                  architecture table; the pieces both graphs use (weights by
 *                  name, Snake, residual units, the local attention)
 *   snac_decode.c  the offline decode graph and its inputs
 *   snac_stream.c  the streaming tick graph
 *
 * Activations are F32 [C, T, B]: channels fastest, then time, then batch. That
 * makes 1x1 convolutions plain matrix products, LayerNorm a row norm, and
 * per-channel parameters broadcast rows. Decoder path (shapes per sequence):
 *
 *   codes_l [T/s_l] -> get_rows(codebook) [H, T/s_l] -> out_proj [L, T/s_l]
 *     -> repeat each frame s_l times [L, T]; sum over levels      (quantizer)
 *   depthwise conv k7 [L, T] -> 1x1 conv [D, T]
 *   (32/44 kHz) LocalMHA over windows of W frames, rotary NEOX positions t % W
 *   for each block i: Snake -> ConvTranspose(stride s_i) [C_{i+1}, T*s_0..s_i]
 *     -> NoiseBlock x + n * (Wn x) -> 3 x ResidualUnit (Snake, depthwise k7
 *     dilated 1/3/9, Snake, 1x1, + residual)
 *   Snake -> conv k7 to one channel -> tanh -> [1, T*hop]
 *
 * Off the CPU both graphs keep the decoder blocks' residual stream time fastest
 * instead, [t, B, C] (the stream always, the offline decode unless
 * CODECRT_OFFLINE_LAYOUT=channels): one transpose per residual unit
 * (cr_res_unit_tf), products read channels fastest.
 *
 * When the graph is bucketed (masked), every tensor is multiplied by a 0/1 time
 * mask after each operation that could make padded positions non-zero before a
 * time-mixing operation reads them. With zeros beyond the valid length, every
 * convolution sees exactly the zero padding of an unpadded decode, so padding
 * never changes the valid samples.
 *
 * The pieces are the shared layers (layers.h: convolutions, the transposed
 * convolution, Snake, residual units) and the stream state buffers
 * (stream_state.h); these files hold what is SNAC's own: hyperparameters,
 * tensor names, the local attention, the wiring, the stream's delays.
 */
#ifndef CODECRT_SNAC_H
#define CODECRT_SNAC_H

#include "layers.h"
#include "stream_state.h"

#define SNAC_MAX_BLOCKS 8
#define SNAC_MAX_LEVELS 8
#define SNAC_HEAD_DIM 64
#define SNAC_DW_K 7

typedef struct snac_hparams {
    int32_t sampling_rate;
    int32_t hop_length;
    int32_t latent_dim;
    int32_t decoder_dim;
    int32_t n_blocks;
    int32_t rates[SNAC_MAX_BLOCKS];
    int32_t window;        /* attention window in frames, 0 = none */
    int32_t codebook_size;
    int32_t codebook_dim;
    int32_t n_levels;
    int32_t strides[SNAC_MAX_LEVELS];
    bool noise;
    bool depthwise;
} snac_hparams;

/* Indices into the graph's io[] table. */
enum {
    SNAC_IO_OUT = 0,
    SNAC_IO_POS = 1,
    SNAC_IO_CODES = 2,                              /* + level */
    SNAC_IO_NOISE = SNAC_IO_CODES + SNAC_MAX_LEVELS, /* + block */
    SNAC_IO_MASK = SNAC_IO_NOISE + SNAC_MAX_BLOCKS,  /* + resolution: 0 latent, 1+i block i */
    SNAC_IO_END = SNAC_IO_MASK + SNAC_MAX_BLOCKS + 1
};
_Static_assert(SNAC_IO_END <= CR_MAX_IO, "io table too small");

static inline int32_t snac_channels(const snac_hparams *hp, int i) { return hp->decoder_dim >> i; }

/* ------------------------------------------------- graph pieces (snac.c) */

/* weight lookup by printf-style name (layers.h) */
#define snac_w cr_weight

/* Snake on x [C, T, B] by prefix's parameters (cr_snake: fused on the CPU, fusable elsewhere). */
struct ggml_tensor *snac_snake(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                               struct ggml_tensor *x, const char *prefix, bool cpu_ops);

/* Snake on a time-fastest x [n, B, C] by prefix's parameters (fusable form), then one
   transpose: [C, n, B] channels fastest, what a product (transposed conv, last conv) reads. */
struct ggml_tensor *snac_snake_tf_to_cf(struct ggml_context *ctx, struct ggml_context *w, struct ggml_cgraph *gf,
                                        struct ggml_tensor *x, const char *prefix);

/* ResidualUnit (i, j)'s weights: Snake, depthwise k7, Snake, 1x1. */
cr_res_unit snac_res_unit(struct ggml_context *w, int i, int j);

/* Local windowed attention with rotary positions pos (I32 [T*B], t mod window).
   x: [D, T, B] -> [D, T, B], T a multiple of window. */
struct ggml_tensor *snac_attention(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                   struct ggml_tensor *pos, int window);

/* ------------------------------------------------- offline (snac_decode.c) */

struct ggml_cgraph *snac_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                      const cr_decode_shape *shape, cr_graph_io *gio);
size_t snac_scratch_floats(const cr_model *model, const cr_decode_shape *shape);
int64_t snac_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context);
void snac_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *gio,
                     const cr_decode_inputs *in);

/* ------------------------------------------------ streaming (snac_stream.c) */

struct ggml_cgraph *snac_build_stream(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                      const cr_stream_shape *shape, struct ggml_tensor *const *pool, int n_pool,
                                      cr_graph_io *io);

#endif /* CODECRT_SNAC_H */
