/*
 * s3gen_diag.c: the S3Gen diagnostics (codecrt_diag_s3_*, codecrt_s3gen.h):
 * one stage through the context's lifecycle manager, for checking the port
 * against the reference stage by stage.
 */
#include "s3gen.h"

codecrt_status codecrt_diag_s3_encode(codecrt_context *ctx, const int32_t *tokens, int32_t n, float *mu) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK || (st = s3_check_tokens(ctx, tokens, n))) {
        return st;
    }
    if (n < 1 || !mu) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "need n >= 1 tokens and an output");
    }
    return s3_status(ctx, s3_encode(ctx, tokens, n, 1, mu));
}

codecrt_status codecrt_diag_s3_estimate(codecrt_context *ctx, int32_t T, int32_t B, const float *x, const float *mu,
                                        const float *cond, const float *spks, const float *t, const float *r,
                                        float *out) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK) {
        return st;
    }
    if (T < 1 || T > 2 * ctx->params.max_frames || B < 1 || B > 64 || !x || !mu || !cond || !spks || !t || !out ||
        (s3_hp(ctx)->meanflow && !r)) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "bad estimator diagnostic arguments");
    }
    cr_graph_slot *slot = NULL;
    s3_estimator_io e;
    if ((st = s3_step_graph(ctx, T, B, &slot, &e)) == CODECRT_OK) {
        st = s3_step_eval(ctx, slot, &e, T, B, x, mu, cond, spks, t, s3_hp(ctx)->meanflow ? r : NULL, out);
    }
    return s3_status(ctx, st);
}

codecrt_status codecrt_diag_s3_f0(codecrt_context *ctx, const float *mel, int32_t T, float *f0) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK || (st = s3_check_mel(ctx, mel, T, 1))) {
        return st;
    }
    if (!f0) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "f0 must not be NULL");
    }
    return s3_status(ctx, s3_f0(ctx, mel, T, 1, f0));
}

codecrt_status codecrt_diag_s3_source(codecrt_context *ctx, const float *f0, int32_t T, const float *phases,
                                      const float *noise, float *source) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK) {
        return st;
    }
    if (T < 1 || !f0 || !phases || !noise || !source) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "bad source diagnostic arguments");
    }
    if (!s3_source_host(ctx->model->weights, f0, T, phases, noise, source)) {
        return s3_status(ctx, cr_fail(&ctx->err, CODECRT_E_OUT_OF_MEMORY, "out of host memory"));
    }
    return s3_status(ctx, CODECRT_OK);
}

codecrt_status codecrt_diag_s3_hift(codecrt_context *ctx, const float *mel, int32_t T, const float *source,
                                    float *pcm) {
    codecrt_status st = s3_check_ctx(ctx);
    if (st != CODECRT_OK || (st = s3_check_mel(ctx, mel, T, 1))) {
        return st;
    }
    if (!source || !pcm) {
        return cr_fail(&ctx->err, CODECRT_E_INVALID_ARGUMENT, "source and pcm must not be NULL");
    }
    return s3_status(ctx, s3_hift(ctx, mel, T, 1, source, pcm));
}
