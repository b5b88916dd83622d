/*
 * neucodec.c: the NeuCodec decoder (neuphonic; NeuTTS Air / Nano, 24 kHz,
 * hop 480) and the XCodec2 decoder (HKUST-Audio; Llasa, 16 kHz, hop 320):
 * one network, registered as two architectures ("neucodec", "xcodec2") so
 * that a model says which codec it is; hyperparameters are read under the
 * architecture's own prefix.
 *
 * Decoder path (shapes per sequence, D = dim, codes at 50 Hz):
 *
 *   FSQ index [T] -> digits of the levels' mixed radix, least significant
 *     first, (d - L/2) / (L/2) [8, T]                          (on the host)
 *   fsq.proj: project_out then fc_post_a, one affine map folded by the
 *     converter [D, T]
 *   conv k7 -> 2 x ResnetBlock (GroupNorm 32, eps 1e-6)         (prior_net)
 *   n_layers x transformer: x + attn(RMSNorm(x)), x + MLP(RMSNorm(x))
 *     attention: heads of D/H channels, no bias, non-causal, scale hd^-1/2;
 *     the reference's rotary embedding is applied over the head axis (its
 *     "positions" are head indices), which rotates q and k of a head alike:
 *     scores unchanged, so it is left out (measured: 1e-7)
 *     MLP: fc1 (D -> ffn) SiLU fc2, no bias
 *   2 x ResnetBlock (post_net) -> LayerNorm -> iSTFT head (vocos.c)
 *
 * Not causal: decode_context_frames = 0, no streaming graph here.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "layers.h"
#include "vocos.h"

#define NC_MAX_LAYERS 64
#define NC_MAX_DIM 16384
#define NC_MAX_FSQ 16

typedef struct nc_hparams {
    char prefix[16];       /* "neucodec" or "xcodec2" */
    int32_t sample_rate;
    int32_t hop_length;
    int32_t n_fft;
    int32_t dim;
    int32_t n_layers;
    int32_t n_heads;
    int32_t ffn_dim;
    int32_t n_groups;
    int32_t n_fsq;                    /* FSQ dimensions */
    int32_t fsq_levels[NC_MAX_FSQ];
    int32_t codebook_size;            /* prod(fsq_levels) */
} nc_hparams;

static codecrt_status nc_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    nc_hparams *hp = hp_;
    const int64_t ak = gguf_find_key(g, "general.architecture"); /* checked by the loader */
    snprintf(hp->prefix, sizeof(hp->prefix), "%s", gguf_get_val_str(g, ak));
    char key[64];
#define NC_U32(name, field)                                                                            \
    (snprintf(key, sizeof(key), "%s." name, hp->prefix), cr_gguf_u32(g, key, &hp->field, err))
    codecrt_status st;
    if ((st = NC_U32("sample_rate", sample_rate)) || (st = NC_U32("hop_length", hop_length)) ||
        (st = NC_U32("n_fft", n_fft)) || (st = NC_U32("dim", dim)) || (st = NC_U32("n_layers", n_layers)) ||
        (st = NC_U32("n_heads", n_heads)) || (st = NC_U32("ffn_dim", ffn_dim)) ||
        (st = NC_U32("n_groups", n_groups))) {
        return st;
    }
#undef NC_U32
    snprintf(key, sizeof(key), "%s.fsq_levels", hp->prefix);
    if ((st = cr_gguf_i32_array(g, key, hp->fsq_levels, NC_MAX_FSQ, &hp->n_fsq, err)) != CODECRT_OK) {
        return st;
    }
    int64_t size = 1;
    for (int i = 0; i < hp->n_fsq; i++) {
        if (hp->fsq_levels[i] < 2) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "%s: FSQ level %d is %d, must be >= 2", key, i,
                           hp->fsq_levels[i]);
        }
        size *= hp->fsq_levels[i];
        if (size > (1 << 30)) {
            return cr_fail(err, CODECRT_E_BAD_HPARAMS, "%s: more than 2^30 codes", key);
        }
    }
    hp->codebook_size = (int32_t)size;
    if (hp->sample_rate < 1000 || hp->dim < 1 || hp->dim > NC_MAX_DIM || hp->n_layers < 0 ||
        hp->n_layers > NC_MAX_LAYERS || hp->n_heads < 1 || hp->ffn_dim < 1 || hp->ffn_dim > 4 * NC_MAX_DIM ||
        hp->n_groups < 1) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "%s hyperparameters out of range", hp->prefix);
    }
    if (hp->dim % hp->n_heads != 0 || hp->dim % hp->n_groups != 0) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "%s.dim = %d is not a multiple of n_heads = %d and n_groups = %d",
                       hp->prefix, hp->dim, hp->n_heads, hp->n_groups);
    }
    return vc_check_istft(hp->n_fft, hp->hop_length, err);
}

static void nc_fill_info(const void *hp_, codecrt_model_info *info) {
    const nc_hparams *hp = hp_;
    info->sample_rate = hp->sample_rate;
    info->hop_length = hp->hop_length;
    info->n_levels = 1;
    info->codebook_size[0] = hp->codebook_size;
    info->level_stride[0] = 1;
    info->frame_multiple = 1;
}

static void nc_resnet_specs(cr_spec_list *s, int64_t D, const char *p) {
    cr_spec_add(s, false, 1, D, 1, "%s.norm1.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm1.bias", p);
    cr_spec_add3(s, true, 3, D, D, "%s.conv1.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.conv1.bias", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm2.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.norm2.bias", p);
    cr_spec_add3(s, true, 3, D, D, "%s.conv2.weight", p);
    cr_spec_add(s, false, 1, D, 1, "%s.conv2.bias", p);
}

static const char *const k_nc_resnets[4] = {"prior.0", "prior.1", "post.0", "post.1"};

static void nc_tensor_specs(const void *hp_, cr_spec_list *s) {
    const nc_hparams *hp = hp_;
    const int64_t D = hp->dim, F = hp->ffn_dim, N = hp->n_fft;
    cr_spec_add(s, false, 2, hp->n_fsq, D, "fsq.proj.weight");
    cr_spec_add(s, false, 1, D, 1, "fsq.proj.bias");
    cr_spec_add3(s, true, 7, D, D, "embed.weight");
    cr_spec_add(s, false, 1, D, 1, "embed.bias");
    for (int i = 0; i < 4; i++) {
        nc_resnet_specs(s, D, k_nc_resnets[i]);
    }
    static const char *const qkvo[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < hp->n_layers; i++) {
        cr_spec_add(s, false, 1, D, 1, "blk.%d.att_norm.weight", i);
        for (int j = 0; j < 4; j++) {
            cr_spec_add(s, true, 2, D, D, "blk.%d.attn.%s.weight", i, qkvo[j]);
        }
        cr_spec_add(s, false, 1, D, 1, "blk.%d.ffn_norm.weight", i);
        cr_spec_add(s, true, 2, D, F, "blk.%d.fc1.weight", i);
        cr_spec_add(s, true, 2, F, D, "blk.%d.fc2.weight", i);
    }
    cr_spec_add(s, false, 1, D, 1, "final_norm.weight");
    cr_spec_add(s, false, 1, D, 1, "final_norm.bias");
    cr_spec_add(s, true, 2, D, N + 2, "head.out.weight");
    cr_spec_add(s, false, 1, N + 2, 1, "head.out.bias");
    cr_spec_add(s, false, 2, N + 2, N, "head.basis");
    cr_spec_add(s, false, 1, N, 1, "head.window");
}

static struct ggml_tensor *nc_transformer(vc_graph *g, struct ggml_tensor *x, const nc_hparams *hp, int i) {
    struct ggml_context *ctx = g->ctx;
    struct ggml_tensor *h = vc_rms_norm(g, x, vc_w(g, "blk.%d.att_norm.weight", i));
    struct ggml_tensor *q = vc_linear(g, h, vc_w(g, "blk.%d.attn.q.weight", i), NULL);
    struct ggml_tensor *k = vc_linear(g, h, vc_w(g, "blk.%d.attn.k.weight", i), NULL);
    struct ggml_tensor *v = vc_linear(g, h, vc_w(g, "blk.%d.attn.v.weight", i), NULL);
    const int64_t hd = hp->dim / hp->n_heads;
    struct ggml_tensor *o = vc_attention(g, q, k, v, hp->n_heads, 1.0f / sqrtf((float)hd));
    x = ggml_add(ctx, x, vc_linear(g, o, vc_w(g, "blk.%d.attn.out.weight", i), NULL));
    h = vc_rms_norm(g, x, vc_w(g, "blk.%d.ffn_norm.weight", i));
    h = ggml_silu(ctx, vc_linear(g, h, vc_w(g, "blk.%d.fc1.weight", i), NULL));
    return ggml_add(ctx, x, vc_linear(g, h, vc_w(g, "blk.%d.fc2.weight", i), NULL));
}

static struct ggml_cgraph *nc_build_decode(const cr_model *model, struct ggml_context *ctx, struct ggml_context *w,
                                           const cr_decode_shape *shape, cr_graph_io *io) {
    const nc_hparams *hp = model->hparams;
    const int64_t T = shape->n_frames, B = shape->n_batch;
    vc_graph g;
    vc_graph_begin(&g, ctx, w, io, shape);
    struct ggml_tensor *fsq = vc_input(&g, VC_IO_CODES, GGML_TYPE_F32, hp->n_fsq, T, B, 1, "fsq");
    struct ggml_tensor *x = vc_linear(&g, fsq, vc_w(&g, "fsq.proj.weight"), vc_w(&g, "fsq.proj.bias")); /* [D, T, B] */
    x = vc_conv(&g, x, vc_w(&g, "embed.weight"), vc_w(&g, "embed.bias"));
    x = vc_resnet_block(&g, x, hp->n_groups, k_nc_resnets[0]);
    x = vc_resnet_block(&g, x, hp->n_groups, k_nc_resnets[1]);
    for (int i = 0; i < hp->n_layers; i++) {
        x = nc_transformer(&g, x, hp, i);
    }
    x = vc_resnet_block(&g, x, hp->n_groups, k_nc_resnets[2]);
    x = vc_resnet_block(&g, x, hp->n_groups, k_nc_resnets[3]);
    x = vc_layer_norm(&g, x, vc_w(&g, "final_norm.weight"), vc_w(&g, "final_norm.bias"));
    return vc_graph_end(&g, vc_istft_head(&g, x, hp->n_fft, hp->hop_length));
}

static size_t nc_scratch_floats(const cr_model *model, const cr_decode_shape *shape) {
    const nc_hparams *hp = model->hparams;
    const size_t n = vc_scratch_floats(shape->n_frames, shape->n_batch, hp->hop_length, shape->frames_masked);
    const size_t fsq = (size_t)hp->n_fsq * (size_t)shape->n_frames * (size_t)shape->n_batch;
    return n > fsq ? n : fsq;
}

static int64_t nc_max_tensor_elements(const cr_model *model, int64_t T, int64_t B, int64_t context) {
    const nc_hparams *hp = model->hparams;
    T += context;
    int64_t best = vc_max_elements(T, B, hp->n_heads, hp->n_fft, hp->hop_length);
    /* the embed conv (k7, "same" padded) */
    const int64_t cols = cr_conv1d_max_elements(7, hp->dim, hp->dim, T + 6, B), hid = (int64_t)hp->ffn_dim * T * B;
    best = cols > best ? cols : best;
    return hid > best ? hid : best;
}

static void nc_set_inputs(const cr_model *model, const cr_decode_shape *shape, const cr_graph_io *io,
                          const cr_decode_inputs *in) {
    const nc_hparams *hp = model->hparams;
    const int64_t Tg = shape->n_frames, Bg = shape->n_batch, Tv = in->n_frames, Bv = in->codes->n_batch;
    const int64_t L = hp->n_fsq;
    float *f = in->scratch;
    const int32_t *src = in->codes->levels[0];
    for (int64_t b = 0; b < Bg; b++) {
        for (int64_t t = 0; t < Tg; t++) {
            int64_t code = (b < Bv && t < Tv) ? src[b * Tv + t] : 0;
            float *row = f + (b * Tg + t) * L;
            /* ResidualFSQ.get_output_from_indices: digit i = (code / prod(levels[:i])) % levels[i],
               value (digit - levels[i]/2) / (levels[i]/2), times the single quantizer's scale 1 */
            for (int64_t i = 0; i < L; i++) {
                const int32_t lv = hp->fsq_levels[i], half = lv / 2;
                row[i] = (float)((code % lv) - half) / (float)half;
                code /= lv;
            }
        }
    }
    ggml_backend_tensor_set(io->t[VC_IO_CODES], f, 0, (size_t)(L * Tg * Bg) * sizeof(float));
    const struct ggml_tensor *window = ggml_get_tensor(model->weights, "head.window");
    vc_set_common_inputs(io, Tg, Bg, Bv, Tv, NULL, (const float *)window->data, hp->n_fft, hp->hop_length, f);
}

const cr_arch cr_arch_neucodec = {
    .name = "neucodec",
    .bf16_products = true,
    .hparams_size = sizeof(nc_hparams),
    .read_hparams = nc_read_hparams,
    .fill_info = nc_fill_info,
    .tensor_specs = nc_tensor_specs,
    .build_decode = nc_build_decode,
    .scratch_floats = nc_scratch_floats,
    .max_tensor_elements = nc_max_tensor_elements,
    .set_decode_inputs = nc_set_inputs,
};

const cr_arch cr_arch_xcodec2 = {
    .name = "xcodec2",
    .bf16_products = true,
    .hparams_size = sizeof(nc_hparams),
    .read_hparams = nc_read_hparams,
    .fill_info = nc_fill_info,
    .tensor_specs = nc_tensor_specs,
    .build_decode = nc_build_decode,
    .scratch_floats = nc_scratch_floats,
    .max_tensor_elements = nc_max_tensor_elements,
    .set_decode_inputs = nc_set_inputs,
};
