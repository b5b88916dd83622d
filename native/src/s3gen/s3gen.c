/*
 * s3gen.c: Chatterbox S3Gen's architecture entry: hyperparameters, the tensor
 * list of its three graph builders, and the table the runtime dispatches on
 * (its decode runs the pipeline of s3gen_pipeline.c). s3gen.h maps the files.
 */
#include "s3gen.h"

/* --------------------------------------------------------- hyperparameters */

static codecrt_status s3_read_hparams(const struct gguf_context *g, void *hp_, cr_err *err) {
    s3gen_hparams *hp = hp_;
    codecrt_status st;
    int32_t vocab = 0, mels = 0, rate = 0, spk = 0;
    if ((st = cr_gguf_bool(g, "s3gen.meanflow", &hp->meanflow, err)) ||
        (st = cr_gguf_u32(g, "s3gen.n_steps", &hp->n_steps, err)) ||
        (st = cr_gguf_f32(g, "s3gen.cfg_rate", &hp->cfg_rate, err)) ||
        (st = cr_gguf_u32(g, "s3gen.vocab_size", &vocab, err)) ||
        (st = cr_gguf_u32(g, "s3gen.n_mels", &mels, err)) ||
        (st = cr_gguf_u32(g, "s3gen.sampling_rate", &rate, err)) ||
        (st = cr_gguf_u32(g, "s3gen.speaker_dim", &spk, err))) {
        return st;
    }
    /* the graphs are written for the released architecture; say which value differs */
    if (vocab != S3_VOCAB || mels != S3_MEL || rate != S3_SAMPLE_RATE || spk != S3_SPK) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS,
                       "s3gen: vocab %d, mels %d, rate %d, speaker %d; this runtime supports %d, %d, %d, %d",
                       vocab, mels, rate, spk, S3_VOCAB, S3_MEL, S3_SAMPLE_RATE, S3_SPK);
    }
    if (hp->n_steps < 1 || hp->n_steps > 100 || hp->cfg_rate < 0.0f || hp->cfg_rate > 10.0f) {
        return cr_fail(err, CODECRT_E_BAD_HPARAMS, "s3gen: n_steps = %d, cfg_rate = %g out of range",
                       hp->n_steps, (double)hp->cfg_rate);
    }
    return CODECRT_OK;
}

static void s3_fill_info(const void *hp_, codecrt_model_info *info) {
    const s3gen_hparams *hp = hp_;
    info->sample_rate = S3_SAMPLE_RATE;
    info->hop_length = S3_MEL_HOP * S3_TOKEN_MEL; /* one frame = one token */
    info->n_levels = 1;
    info->codebook_size[0] = S3_VOCAB;
    info->level_stride[0] = 1;
    info->frame_multiple = 1;
    info->n_mels = S3_MEL;
    info->mel_hop = S3_MEL_HOP;
    info->needs_voice = 1;
    info->default_steps = hp->n_steps;
}

static void s3_tensor_specs(const void *hp_, cr_spec_list *s) {
    const s3gen_hparams *hp = hp_;
    /* used on the host (voices), so never F16 */
    cr_spec_add(s, false, 2, S3_SPK, S3_MEL, "flow.spk_embed_affine_layer.weight");
    cr_spec_add(s, false, 1, S3_MEL, 1, "flow.spk_embed_affine_layer.bias");
    s3_encoder_specs(hp, s);
    s3_estimator_specs(hp, s);
    s3_hift_specs(hp, s);
}

/* ------------------------------------------------------------------ table */

static int64_t s3_max_tensor_elements(const cr_model *model, int64_t n_frames, int64_t n_batch, int64_t context) {
    (void)model;
    (void)context;
    const int64_t F = S3_TOKEN_MEL * n_frames;
    int64_t m = s3_encoder_max_elements(n_frames, n_batch);
    const int64_t e = s3_estimator_max_elements(F, 2 * n_batch), h = s3_hift_max_elements(F, n_batch);
    m = e > m ? e : m;
    return h > m ? h : m;
}

const cr_arch cr_arch_s3gen = {
    .name = "s3gen",
    .bf16_products = true,
    .hparams_size = sizeof(s3gen_hparams),
    .read_hparams = s3_read_hparams,
    .fill_info = s3_fill_info,
    .tensor_specs = s3_tensor_specs,
    .max_tensor_elements = s3_max_tensor_elements,
    .decode = s3_decode,
};

