/*
 * vocos.h: graph blocks shared by the Vocos-style decoders (vocos.c):
 * WavTokenizer (wavtokenizer.c), NeuCodec and XCodec2 (neucodec.c).
 *
 * The three decode codes at a frame rate into a backbone of constant time
 * resolution (ConvNeXt blocks, or transformer blocks between GroupNorm ResNet
 * blocks) and turn each frame into hop samples with an iSTFT head: a linear
 * layer to log-magnitudes and phases, an inverse real DFT (a matrix product
 * with the synthesis window folded in), overlap-add and the division by the
 * summed squared window. None is causal: attention and GroupNorm see the whole
 * utterance, so an offline decode cannot be split into pieces
 * (decode_context_frames = 0) and streams are windowed (not here).
 *
 * Activations are F32 [C, T, B]: channels fastest, then frames, then
 * sequences, as in snac.c: linear layers are plain products, LayerNorm and
 * RMSNorm row norms.
 *
 * Masked graphs (frame buckets: a graph of T frames decoding sequences of
 * fewer valid frames) zero every tensor past a sequence's valid frames before
 * a time-mixing layer reads it, take GroupNorm statistics over valid frames
 * only, hide padded keys from attention and padded frames from the
 * overlap-add, so the valid samples equal those of an unpadded graph.
 */
#ifndef CODECRT_VOCOS_H
#define CODECRT_VOCOS_H

#include "internal.h"

#define VC_EPS 1e-6f     /* every norm of the three decoders (GroupNorm, LayerNorm, RMSNorm) */
#define VC_MAX_NFFT 16384

/* Indices into cr_graph_io.t shared by the three architectures. */
enum {
    VC_IO_OUT = 0,     /* F32 [T*hop, B] PCM */
    VC_IO_CODES = 1,   /* the architecture's code input */
    VC_IO_ENV = 2,     /* F32 [T*hop, 1] (or [T*hop, B] masked): 1 / window envelope, 0 past the valid samples */
    VC_IO_MASK = 3,    /* F32 [1, T, B]: 1 on valid frames (masked graphs) */
    VC_IO_MASK_BT = 4, /* F32 [1, B, T]: the same, sequences fastest (the iSTFT's layout) */
    VC_IO_KQ = 5,      /* F32 [T, T, 1, B]: 0 on valid keys, -inf on padded ones */
    VC_IO_COUNT = 6,   /* F32 [1, 1, 1, B]: 1 / valid frames (GroupNorm statistics) */
    VC_IO_END = 7
};

/* One graph under construction. */
typedef struct vc_graph {
    struct ggml_context *ctx;  /* graph tensors (no_alloc) */
    struct ggml_context *w;    /* weights */
    struct ggml_cgraph *gf;
    cr_graph_io *io;
    int64_t T, B;              /* frames and sequences in the graph */
    bool cpu_ops;              /* the fused CPU kernels of ops/ops_avx512_*.c may be used */
    const cr_cpu_ops *ops;     /* with cpu_ops: the context's (F32, or BF16 products); else NULL */
    bool dev;                  /* the full convs as cr_conv1d_cols (cr_conv_cols_on: codecrt's
                                  device ops, CODECRT_CONV=cols) */
    /* masked graphs only, else NULL */
    struct ggml_tensor *mask, *mask_bt, *kq_mask, *count;
} vc_graph;

/* Start a graph of shape's frames, sequences and kernels: the graph object and, when its frames are
   masked, the mask inputs. */
void vc_graph_begin(vc_graph *g, struct ggml_context *ctx, struct ggml_context *w, cr_graph_io *io,
                    const cr_decode_shape *shape);

/* A named input tensor (io->t[slot]). */
struct ggml_tensor *vc_input(vc_graph *g, int slot, enum ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                             int64_t ne3, const char *name);

/* Weight by name; names were validated at load, so this cannot miss. */
struct ggml_tensor *vc_w(const vc_graph *g, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* x [C, T, B] times the valid-frame mask (identity when unmasked). */
struct ggml_tensor *vc_mask(vc_graph *g, struct ggml_tensor *x);

/* y = W x + b: x [K, T, B] contiguous, w [K, M], b [M] or NULL -> [M, T, B]. In the context's precision
   (BF16 products with CODECRT_PRECISION_BF16 on the CPU), as are vc_conv and the 64-channel-head
   attention; everything else, the iSTFT's inverse DFT included, is F32. */
struct ggml_tensor *vc_linear(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b);

/* Conv1d, stride 1, "same" zero padding (K odd): x [C, T, B], w ne [K, C, M] (PyTorch (M, C, K)), b [M] ->
   [M, T, B]. Masks its input. */
struct ggml_tensor *vc_conv(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b);

/* Depthwise conv, "same": x [C, T, B], w ne [C, K] (taps channels fastest), b [C]. Masks its input. */
struct ggml_tensor *vc_dwconv(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b);

/* GroupNorm (n_groups over the channels, statistics over the group's channels and the valid frames, eps
   VC_EPS) with affine w, b [C]: x [C, T, B] -> [C, T, B]. */
struct ggml_tensor *vc_group_norm(vc_graph *g, struct ggml_tensor *x, int n_groups, struct ggml_tensor *w,
                                  struct ggml_tensor *b);

/* PyTorch's exact GELU (erf): a fused CPU kernel under cpu_ops, else ggml's GELU_ERF. */
struct ggml_tensor *vc_gelu(vc_graph *g, struct ggml_tensor *x);
/* The fused kernel's scalar function, for tests. */
float vc_gelu_ref(float x);
/* The iSTFT head's fused spectrum kernel's sine and cosine (CPU), for tests. */
void vc_sincos_ref(float x, float *s, float *c);

/* RMSNorm over channels (eps VC_EPS) times w [C]; one fused pass on the CPU. */
struct ggml_tensor *vc_rms_norm(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w);

/* LayerNorm over channels (eps VC_EPS) with affine w, b [C] (b may be NULL); one fused pass on the CPU. */
struct ggml_tensor *vc_layer_norm(vc_graph *g, struct ggml_tensor *x, struct ggml_tensor *w, struct ggml_tensor *b);

/* ResnetBlock of the Vocos decoders, prefix "<p>": x + conv2(silu(GN2(conv1(silu(GN1(x)))))), convs k3. */
struct ggml_tensor *vc_resnet_block(vc_graph *g, struct ggml_tensor *x, int n_groups, const char *p);

/* Non-causal softmax attention over every (valid) key: q, k, v [H*hd, T, B] (head h in channels
   h*hd .. h*hd+hd-1) -> [H*hd, T, B], scores scaled by `scale`. */
struct ggml_tensor *vc_attention(vc_graph *g, struct ggml_tensor *q, struct ggml_tensor *k, struct ggml_tensor *v,
                                 int n_heads, float scale);

/*
 * The iSTFT head ("same" padding), prefix "head": x [D, T, B] -> PCM [T*hop, B]. head.out (Linear D ->
 * n_fft+2) gives log-magnitudes (rows 0..n_fft/2) and phases; S = min(exp(m), 100) (cos p + i sin p);
 * frames = head.basis S (the inverse real DFT times the window, [n_fft] per frame); overlap-add at hop
 * cropping (n_fft-hop)/2 samples at both ends; times the envelope input (VC_IO_ENV).
 */
struct ggml_tensor *vc_istft_head(vc_graph *g, struct ggml_tensor *x, int32_t n_fft, int32_t hop);

/* Finish: name and mark the output, expand the graph. */
struct ggml_cgraph *vc_graph_end(vc_graph *g, struct ggml_tensor *pcm);

/* --------------------------------------------------------------- host side */

/* Scratch floats the common inputs of a graph of T frames x B sequences need. */
size_t vc_scratch_floats(int64_t T, int64_t B, int32_t hop, bool masked);

/*
 * Fill the common inputs (envelope and masks) of a graph of T frames x B sequences. Sequence b has lens[b]
 * valid frames (1..T), or with lens NULL: n_frames for b < n_seqs, T for the padding sequences after them
 * (they decode their zero codes in full: finite, and discarded). window [n_fft] is the synthesis window
 * (host memory). scratch holds vc_scratch_floats(T, B, hop, masked) floats.
 */
void vc_set_common_inputs(const cr_graph_io *io, int64_t T, int64_t B, int64_t n_seqs, int64_t n_frames,
                          const int32_t *lens, const float *window, int32_t n_fft, int32_t hop, float *scratch);

/* Largest tensor of the shared blocks for T frames x B sequences: the attention scores (heads), the head's
   spectrum and frames, the envelope. */
int64_t vc_max_elements(int64_t T, int64_t B, int64_t heads, int32_t n_fft, int32_t hop);

/* Checks shared by the architectures' hyperparameters. */
codecrt_status vc_check_istft(int32_t n_fft, int32_t hop, cr_err *err);

#endif /* CODECRT_VOCOS_H */
