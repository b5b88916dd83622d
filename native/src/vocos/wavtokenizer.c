/*
 * wavtokenizer.c: the WavTokenizer decoder (jishengpeng/WavTokenizer, as
 * OuteTTS 0.2/0.3 run it): the 75-token (hop 320, n_fft 1280) and 40-token
 * (hop 600, n_fft 2400) models, 24 kHz, one codebook of 4096 x 512.
 *
 * Decoder path (shapes per sequence, D = dim):
 *
 *   codes [T] -> get_rows(codebook) [512, T] -> conv k7 [D, T]          (embed)
 *   pos_net: 2 x ResnetBlock, AttnBlock, 2 x ResnetBlock, GroupNorm      (GroupNorm 32, eps 1e-6)
 *     AttnBlock: x + proj(attention(q, k, v of GroupNorm(x))), one head of D channels, scale D^-1/2
 *   LayerNorm (AdaLayerNorm of bandwidth 0, folded by the converter to an affine)
 *   12 x ConvNeXt: x + pw2(gelu(pw1(LN(dwconv_k7(x)))))  (gamma folded into pw2)
 *   LayerNorm -> iSTFT head (vocos.c) -> [T * hop]
 *
 * Not causal (global attention, GroupNorm statistics over the utterance):
 * decode_context_frames = 0, no streaming graph here.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "layers.h"
#include "vocos.h"

#define WT_MAX_LAYERS 64
#define WT_MAX_DIM 16384

typedef struct wt_hparams {
    int32_t sample_rate;
    int32_t hop_length;
    int32_t n_fft;
    int32_t input_dim;     /* codebook vector width */
    int32_t dim;
    int32_t intermediate_dim;
    int32_t n_layers;
    int32_t codebook_size;
    int32_t n_groups;      /* pos_net GroupNorms */
} wt_hparams;

static codecrt_status wt_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    wt_hparams *hp = hp_;
    codecrt_status st;
    if ((st = cr_gguf_u32(g, "wavtokenizer.sample_rate", &hp->sample_rate, err)) ||
        (st = cr_gguf_u32(g, "wavtokenizer.hop_length", &hp->hop_length, err)) ||
        (st = cr_gguf_u32(g, "wavtokenizer.n_fft", &hp->n_fft, err)) ||
        (st = cr_gguf_u32(g, "wavtokenizer.input_dim", &hp->input_dim, err)) ||
        (st = cr_gguf_u32(g, "wavtokenizer.dim", &hp->dim, err)) ||
        (st = cr_gguf_u32(g, "wavtokenizer.intermediate_dim", &hp->intermediate_dim, err)) ||
        (st = cr_gguf_u32(g, "wavtokenizer.n_layers", &hp->n_layers, err)) ||
        (st = cr_gguf_u32(g, "wavtokenizer.codebook_size", &hp->codebook_size, err)) ||
        (st = cr_gguf_u32(g, "wavtokenizer.n_groups", &hp->n_groups, err))) {
        return st;
    }
    if (hp->sample_rate < 1000 || hp->input_dim < 1 || hp->input_dim > WT_MAX_DIM || hp->dim < 1 ||
        hp->dim > WT_MAX_DIM || hp->intermediate_dim < 1 || hp->intermediate_dim > 4 * WT_MAX_DIM ||
        hp->n_layers < 1 || hp->n_layers > WT_MAX_LAYERS || hp->codebook_size < 1 || hp->n_groups < 1) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "wavtokenizer hyperparameters out of range");
    }
    if (hp->dim % hp->n_groups != 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "wavtokenizer.dim = %d is not a multiple of n_groups = %d",
                       hp->dim, hp->n_groups);
    }
    return vc_check_istft(hp->n_fft, hp->hop_length, err);
}

static void wt_fill_info(const void *hp_, codecrt_model_info *info) {
    const wt_hparams *hp = hp_;
    info->sample_rate = hp->sample_rate;
    info->hop_length = hp->hop_length;
    info->n_levels = 1;
    info->codebook_size[0] = hp->codebook_size;
    info->level_stride[0] = 1;
    info->frame_multiple = 1;
}

/* The pos_net's ResnetBlocks sit at indices 0, 1, 3, 4 (2 is the attention, 5 the last GroupNorm). */
static const int k_wt_resnets[4] = {0, 1, 3, 4};

static void wt_resnet_specs(cr_spec_list *s, int64_t D, const char *p) {
    cr_spec_add(s, false, 1, D, 1, "%s.norm1.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm1.bias", p);
    cr_spec_add3(s, true, 3, D, D, "%s.conv1.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.conv1.bias", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm2.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm2.bias", p);
    cr_spec_add3(s, true, 3, D, D, "%s.conv2.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.conv2.bias", p);
}

static void wt_tensor_specs(const void *hp_, cr_spec_list *s) {
    const wt_hparams *hp = hp_;
    const int64_t D = hp->dim, I = hp->intermediate_dim, E = hp->input_dim, N = hp->n_fft;
    char p[64];
    cr_spec_add(s, false, 2, E, hp->codebook_size, "codebook");
    cr_spec_add3(s, true, 7, E, D, "embed.weight");
    cr_spec_add(s, false, 1, D, 1, "embed.bias");
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof(p), "posnet.%d", k_wt_resnets[i]);
        wt_resnet_specs(s, D, p);
    }
    cr_spec_add(s, false, 1, D, 1, "posnet.attn.norm.weight");
    cr_spec_add(s, false, 1, D, 1, "posnet.attn.norm.bias");
    static const char *const qkvo[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; i++) {
        cr_spec_add(s, true, 2, D, D, "posnet.attn.%s.weight", qkvo[i]);
        cr_spec_add(s, false, 1, D, 1, "posnet.attn.%s.bias", qkvo[i]);
    }
    cr_spec_add(s, false, 1, D, 1, "posnet.norm.weight");
    cr_spec_add(s, false, 1, D, 1, "posnet.norm.bias");
    cr_spec_add(s, false, 1, D, 1, "norm.weight");
    cr_spec_add(s, false, 1, D, 1, "norm.bias");
    for (int i = 0; i < hp->n_layers; i++) {
        cr_spec_add(s, false, 2, D, 7, "convnext.%d.dw.weight", i);
        cr_spec_add(s, false, 1, D, 1, "convnext.%d.dw.bias", i);
        cr_spec_add(s, false, 1, D, 1, "convnext.%d.norm.weight", i);
        cr_spec_add(s, false, 1, D, 1, "convnext.%d.norm.bias", i);
        cr_spec_add(s, true, 2, D, I, "convnext.%d.pw1.weight", i);
        cr_spec_add(s, false, 1, I, 1, "convnext.%d.pw1.bias", i);
        cr_spec_add(s, true, 2, I, D, "convnext.%d.pw2.weight", i);
        cr_spec_add(s, false, 1, D, 1, "convnext.%d.pw2.bias", i);
    }
    cr_spec_add(s, false, 1, D, 1, "final_norm.weight");
    cr_spec_add(s, false, 1, D, 1, "final_norm.bias");
    cr_spec_add(s, true, 2, D, N + 2, "head.out.weight");
    cr_spec_add(s, false, 1, N + 2, 1, "head.out.bias");
    cr_spec_add(s, false, 2, N + 2, N, "head.basis");
    cr_spec_add(s, false, 1, N, 1, "head.window");
}

/* pos_net's AttnBlock: x + proj(softmax(q^T k / sqrt(D)) v) on GroupNorm(x), one head of D channels. */
static struct ggml_tensor *wt_attn_block(vc_graph *g, struct ggml_tensor *x, int n_groups) {
    struct ggml_tensor *h = vc_group_norm(g, x, n_groups, vc_w(g, "posnet.attn.norm.weight"),
                                          vc_w(g, "posnet.attn.norm.bias"));
    struct ggml_tensor *q = vc_linear(g, h, vc_w(g, "posnet.attn.q.weight"), vc_w(g, "posnet.attn.q.bias"));
    struct ggml_tensor *k = vc_linear(g, h, vc_w(g, "posnet.attn.k.weight"), vc_w(g, "posnet.attn.k.bias"));
    struct ggml_tensor *v = vc_linear(g, h, vc_w(g, "posnet.attn.v.weight"), vc_w(g, "posnet.attn.v.bias"));
    struct ggml_tensor *o = vc_attention(g, q, k, v, 1, 1.0f / sqrtf((float)x->ne[0]));
    o = vc_linear(g, o, vc_w(g, "posnet.attn.out.weight"), vc_w(g, "posnet.attn.out.bias"));
    return ggml_add(g->ctx, x, o);
}

static struct ggml_tensor *wt_convnext(vc_graph *g, struct ggml_tensor *x, int i) {
    struct ggml_context *ctx = g->ctx;
    struct ggml_tensor *h = vc_dwconv(g, x, vc_w(g, "convnext.%d.dw.weight", i), vc_w(g, "convnext.%d.dw.bias", i));
    h = vc_layer_norm(g, h, vc_w(g, "convnext.%d.norm.weight", i), vc_w(g, "convnext.%d.norm.bias", i));
    h = vc_linear(g, h, vc_w(g, "convnext.%d.pw1.weight", i), vc_w(g, "convnext.%d.pw1.bias", i));
    h = vc_gelu(g, h);
    h = vc_linear(g, h, vc_w(g, "convnext.%d.pw2.weight", i), vc_w(g, "convnext.%d.pw2.bias", i));
    return ggml_add(ctx, x, h);
}

static struct ggml_cgraph *wt_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                           const cr_decode_shape *shape, cr_graph_io *io) {
    const wt_hparams *hp = model->hparams;
    const int64_t T = shape->n_frames, B = shape->n_batch;
    vc_graph g;
    vc_graph_begin(&g, ctx, w, io, shape);
    struct ggml_tensor *codes = vc_input(&g, VC_IO_CODES, GGML_TYPE_I32, T * B, 1, 1, 1, "codes");
    struct ggml_tensor *x = ggml_get_rows(ctx, vc_w(&g, "codebook"), codes); /* [E, T*B] */
    x = ggml_reshape_3d(ctx, x, hp->input_dim, T, B);
    x = vc_conv(&g, x, vc_w(&g, "embed.weight"), vc_w(&g, "embed.bias")); /* [D, T, B] */
    char p[32];
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof(p), "posnet.%d", k_wt_resnets[i]);
        x = vc_resnet_block(&g, x, hp->n_groups, p);
        if (i == 1) {
            x = wt_attn_block(&g, x, hp->n_groups);
        }
    }
    x = vc_group_norm(&g, x, hp->n_groups, vc_w(&g, "posnet.norm.weight"), vc_w(&g, "posnet.norm.bias"));
    x = vc_layer_norm(&g, x, vc_w(&g, "norm.weight"), vc_w(&g, "norm.bias"));
    for (int i = 0; i < hp->n_layers; i++) {
        x = wt_convnext(&g, x, i);
    }
    x = vc_layer_norm(&g, x, vc_w(&g, "final_norm.weight"), vc_w(&g, "final_norm.bias"));
    return vc_graph_end(&g, vc_istft_head(&g, x, hp->n_fft, hp->hop_length));
}

static size_t wt_scratch_floats(const cr_model *model, const cr_decode_shape *shape) {
    const wt_hparams *hp = model->hparams;
    const size_t n = vc_scratch_floats(shape->n_frames, shape->n_batch, hp->hop_length, shape->frames_masked);
    const size_t codes = (size_t)shape->n_frames * (size_t)shape->n_batch;
    return n > codes ? n : codes;
}

static int64_t wt_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context) {
    const wt_hparams *hp = model->hparams;
    T += context;
    int64_t best = vc_max_elements(T, B, 1, hp->n_fft, hp->hop_length);
    /* the CPU's one-head attention: scores over keys padded to a multiple of 16 (vocos.c) */
    const int64_t scores = (T + 15) / 16 * 16 * T * B;
    best = scores > best ? scores : best;
    /* the embed conv (k7) and a pos_net conv (k3), "same" padded, and the ConvNeXt's hidden layer */
    const int64_t cols = cr_conv1d_max_elements(7, hp->input_dim, hp->dim, T + 6, B);
    const int64_t res = cr_conv1d_max_elements(3, hp->dim, hp->dim, T + 2, B);
    const int64_t hid = (int64_t)hp->intermediate_dim * T * B;
    best = cols > best ? cols : best;
    best = hid > best ? hid : best;
    return res > best ? res : best;
}

static void wt_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *io,
                          const cr_decode_inputs *in) {
    const wt_hparams *hp = model->hparams;
    const int64_t Tg = shape->n_frames, Bg = shape->n_batch, Tv = in->n_frames, Bv = in->codes->n_batch;
    int32_t *iv = (int32_t *)in->scratch;
    const int32_t *src = in->codes->levels[0];
    for (int64_t b = 0; b < Bg; b++) {
        for (int64_t t = 0; t < Tg; t++) {
            iv[b * Tg + t] = (b < Bv && t < Tv) ? src[b * Tv + t] : 0;
        }
    }
    ggml_backend_tensor_set(io->t[VC_IO_CODES], iv, 0, (size_t)(Tg * Bg) * sizeof(int32_t));
    const struct ggml_tensor *window = ggml_get_tensor(model->weights, "head.window");
    /* padded sequences (b >= Bv) decode their zero codes in full: finite, discarded */
    vc_set_common_inputs(io, Tg, Bg, Bv, Tv, NULL, (const float *)window->data, hp->n_fft, hp->hop_length, in->scratch);
}

const cr_arch cr_arch_wavtokenizer = {
    .name = "wavtokenizer",
    .bf16_products = true,
    .hparams_size = sizeof(wt_hparams),
    .read_hparams = wt_read_hparams,
    .fill_info = wt_fill_info,
    .tensor_specs = wt_tensor_specs,
    .build_decode = wt_build_decode,
    .scratch_floats = wt_scratch_floats,
    .max_tensor_elements = wt_max_tensor_elements,
    .set_decode_inputs = wt_set_inputs,
};
