/*
 * s3gen_voice.c: voices (codecrt_voice), S3Gen's conditioning: a prompt's
 * tokens and mel and the projected speaker embedding, validated and copied
 * once, immutable after, shared by any decodes and streams of the model.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "s3gen.h"

codecrt_status codecrt_voice_init(const codecrt_model *model_, const codecrt_voice_data *d, codecrt_voice **out,
                                  char *err_buf, size_t err_size) {
    cr_err err = {{0}};
    codecrt_status st = CODECRT_OK;
    codecrt_voice *v = NULL;
    if (out) {
        *out = NULL;
    }
    const cr_model *m = model_ ? &model_->m : NULL;
    if (!m || !d || !out) {
        st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "model, data and out must not be NULL");
        goto done;
    }
    if (!m->info.needs_voice) {
        st = cr_fail(&err, CODECRT_E_UNSUPPORTED, "model '%s' takes no voice", m->arch->name);
        goto done;
    }
    if (d->n_mels != S3_MEL || d->speaker_dim != S3_SPK) {
        st = cr_fail(&err, CODECRT_E_SHAPE, "voice has %d mel bins and a %d-d speaker embedding; the model "
                     "needs %d and %d", d->n_mels, d->speaker_dim, S3_MEL, S3_SPK);
        goto done;
    }
    if (d->n_prompt_tokens < 0 || d->n_prompt_tokens > 4096 || d->n_prompt_frames != S3_TOKEN_MEL * d->n_prompt_tokens) {
        st = cr_fail(&err, CODECRT_E_SHAPE, "voice prompt has %d tokens and %d mel frames; it needs %d mel "
                     "frames per token (and at most 4096 tokens)", d->n_prompt_tokens, d->n_prompt_frames,
                     S3_TOKEN_MEL);
        goto done;
    }
    if ((d->n_prompt_tokens > 0 && (!d->prompt_tokens || !d->prompt_mel)) || !d->speaker) {
        st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "voice arrays must not be NULL");
        goto done;
    }
    for (int32_t i = 0; i < d->n_prompt_tokens; i++) {
        if (d->prompt_tokens[i] < 0 || d->prompt_tokens[i] >= S3_VOCAB) {
            st = cr_fail(&err, CODECRT_E_CODE_RANGE, "voice prompt token %d at index %d is outside [0, %d)",
                         d->prompt_tokens[i], i, S3_VOCAB);
            goto done;
        }
    }
    const size_t n_mel = (size_t)d->n_prompt_frames * S3_MEL;
    for (size_t i = 0; i < n_mel; i++) {
        if (!isfinite(d->prompt_mel[i])) {
            st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "voice prompt mel has a non-finite value at %zu", i);
            goto done;
        }
    }
    double norm = 0.0;
    for (int i = 0; i < S3_SPK; i++) {
        if (!isfinite(d->speaker[i])) {
            st = cr_fail(&err, CODECRT_E_INVALID_ARGUMENT, "voice speaker embedding has a non-finite value");
            goto done;
        }
        norm += (double)d->speaker[i] * d->speaker[i];
    }
    v = calloc(1, sizeof(*v));
    if (!v || !(v->tokens = malloc(sizeof(int32_t) * (size_t)(d->n_prompt_tokens + 1))) ||
        !(v->mel = malloc(sizeof(float) * (n_mel + 1)))) {
        st = cr_fail(&err, CODECRT_E_OUT_OF_MEMORY, "out of host memory");
        goto done;
    }
    v->model = m;
    v->n_tokens = d->n_prompt_tokens;
    v->n_frames = d->n_prompt_frames;
    if (d->n_prompt_tokens > 0) {
        memcpy(v->tokens, d->prompt_tokens, sizeof(int32_t) * (size_t)d->n_prompt_tokens);
    }
    /* [T][80] (as Chatterbox stores prompt_feat) -> [80][T] */
    for (int32_t t = 0; t < d->n_prompt_frames; t++) {
        for (int c = 0; c < S3_MEL; c++) {
            v->mel[(size_t)c * (size_t)d->n_prompt_frames + (size_t)t] = d->prompt_mel[(size_t)t * S3_MEL + (size_t)c];
        }
    }
    /* spks = W normalize(x) + b, normalize as F.normalize (eps 1e-12) */
    const float inv = (float)(1.0 / fmax(sqrt(norm), 1e-12));
    const struct ggml_tensor *w = ggml_get_tensor(m->weights, "flow.spk_embed_affine_layer.weight");
    const struct ggml_tensor *b = ggml_get_tensor(m->weights, "flow.spk_embed_affine_layer.bias");
    const float *wd = w->data, *bd = b->data;
    for (int o = 0; o < S3_MEL; o++) {
        float acc = 0.0f;
        for (int i = 0; i < S3_SPK; i++) {
            acc += wd[(size_t)o * S3_SPK + (size_t)i] * (d->speaker[i] * inv);
        }
        v->spks[o] = acc + bd[o];
    }
    *out = v;
    v = NULL;
done:
    codecrt_voice_free(v);
    cr_err_copy(&err, err_buf, err_size);
    return st;
}

void codecrt_voice_free(codecrt_voice *v) {
    if (!v) {
        return;
    }
    free(v->tokens);
    free(v->mel);
    free(v);
}

