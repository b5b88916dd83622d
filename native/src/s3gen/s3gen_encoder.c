/*
 * s3gen_encoder.c: the text side of the S3Gen flow (CausalMaskedDiffWithXvec):
 * token embedding, the UpsampleConformerEncoder (CosyVoice2, ESPnet-style
 * Conformer without conv module or macaron FFN) and encoder_proj, giving the
 * flow's condition mu.
 *
 * Activations are F32 [C, T, B], channels fastest: Linear layers are plain
 * products with the (possibly F16) weight as src0, LayerNorm a row norm, and
 * per-channel parameters broadcast rows. Per sequence of T tokens:
 *
 *   tokens [T] -> get_rows(input_embedding) [512, T]
 *   embed: Linear -> LayerNorm(1e-5) -> * sqrt(512); rel-pos table [512, 2T-1]
 *   PreLookaheadLayer: right pad 3 -> conv k4 -> leaky_relu(0.01) -> left pad 2
 *     -> conv k3, + input
 *   6 x layer(T)
 *   Upsample1D: nearest x2 -> left pad 4 -> conv k5 [512, 2T]
 *   up_embed: Linear -> LayerNorm(1e-5) -> * sqrt(512); table [512, 4T-1]
 *   4 x layer(2T) -> after_norm (1e-5) -> encoder_proj [80, 2T] -> [2T, 80]
 *
 *   layer: x += MHA(LN_mha(x)); x += w_2(silu(w_1(LN_ff(x))))   (LN eps 1e-12)
 *
 * Attention (RelPositionMultiHeadedAttention, 8 heads of 64) with p =
 * linear_pos(table), no bias:
 *   scores = ((q + pos_bias_u) k^T + rel_shift((q + pos_bias_v) p^T)) / 8
 * Table row j holds relative position n-1-j (n queries), so rel_shift picks
 * bd[i][n-1-i+k] for query i, key k: with bd rows of L >= 2n-1 entries that
 * is a view at offset n-1 with row stride L-1 (torch's zero-pad-and-reshape
 * rel_shift reads exactly these). The mask is full: Chatterbox builds the
 * encoder with static_chunk_size 0 and use_dynamic_chunk false, and a batch
 * without padding has every position valid, so add_optional_chunk_mask's mask
 * is all ones (and the embedding's padding mask too).
 *
 * The tables depend only on the length, so the host fills one, for the 2T
 * frames after upsampling (relative positions 2T-1 .. -(2T-1)); the first
 * stage's table (T-1 .. -(T-1)) is a view into it. Both stages pad the keys
 * and the table for the CPU's fast matrix products (see enc_keys).
 */
#include <math.h>
#include <stdio.h>

#include "s3gen.h"

#define ENC_HEADS 8
#define ENC_HEAD_DIM (S3_D_MODEL / ENC_HEADS)
#define ENC_FF 2048
#define ENC_BLOCKS 6
#define ENC_UP_BLOCKS 4
#define ENC_UP 2           /* Upsample1D stride */
#define ENC_UP_K (2 * ENC_UP + 1)
#define ENC_LN_EPS 1e-12f  /* ConformerEncoderLayer norms */
#define ENC_EMB_EPS 1e-5f  /* LinearNoSubsampling and after_norm */
#define ENC_TABLE_ROWS 16  /* host rows per upload of the positional table */

/* io->in[] slots */
enum { ENC_IN_POS = 0, ENC_IN_MASK = 1 };

/* ------------------------------------------------------------ tensor specs */

static void enc_layer_specs(cr_spec_list *s, const char *stack, int i) {
    const int64_t D = S3_D_MODEL;
    cr_spec_add(s, false, 2, ENC_HEAD_DIM, ENC_HEADS, "enc.%s.%d.self_attn.pos_bias_u", stack, i);
    cr_spec_add(s, false, 2, ENC_HEAD_DIM, ENC_HEADS, "enc.%s.%d.self_attn.pos_bias_v", stack, i);
    static const char *const proj[4] = {"q", "k", "v", "out"};
    for (int j = 0; j < 4; j++) {
        cr_spec_add(s, true, 2, D, D, "enc.%s.%d.self_attn.linear_%s.weight", stack, i, proj[j]);
        cr_spec_add(s, false, 1, D, 1, "enc.%s.%d.self_attn.linear_%s.bias", stack, i, proj[j]);
    }
    cr_spec_add(s, true, 2, D, D, "enc.%s.%d.self_attn.linear_pos.weight", stack, i);
    cr_spec_add(s, true, 2, D, ENC_FF, "enc.%s.%d.feed_forward.w_1.weight", stack, i);
    cr_spec_add(s, false, 1, ENC_FF, 1, "enc.%s.%d.feed_forward.w_1.bias", stack, i);
    cr_spec_add(s, true, 2, ENC_FF, D, "enc.%s.%d.feed_forward.w_2.weight", stack, i);
    cr_spec_add(s, false, 1, D, 1, "enc.%s.%d.feed_forward.w_2.bias", stack, i);
    cr_spec_add(s, false, 1, D, 1, "enc.%s.%d.norm_ff.weight", stack, i);
    cr_spec_add(s, false, 1, D, 1, "enc.%s.%d.norm_ff.bias", stack, i);
    cr_spec_add(s, false, 1, D, 1, "enc.%s.%d.norm_mha.weight", stack, i);
    cr_spec_add(s, false, 1, D, 1, "enc.%s.%d.norm_mha.bias", stack, i);
}

/* Linear + LayerNorm of LinearNoSubsampling ("embed" or "up_embed"). */
static void enc_embed_specs(cr_spec_list *s, const char *name) {
    const int64_t D = S3_D_MODEL;
    cr_spec_add(s, true, 2, D, D, "enc.%s.out.0.weight", name);
    cr_spec_add(s, false, 1, D, 1, "enc.%s.out.0.bias", name);
    cr_spec_add(s, false, 1, D, 1, "enc.%s.out.1.weight", name);
    cr_spec_add(s, false, 1, D, 1, "enc.%s.out.1.bias", name);
}

void s3_encoder_specs(const s3gen_hparams *hp, cr_spec_list *s) {
    (void)hp; /* the encoder is the same in both variants */
    const int64_t D = S3_D_MODEL;
    cr_spec_add(s, true, 2, D, S3_VOCAB, "flow.input_embedding.weight");
    enc_embed_specs(s, "embed");
    cr_spec_add(s, false, 1, D, 1, "enc.after_norm.weight");
    cr_spec_add(s, false, 1, D, 1, "enc.after_norm.bias");
    cr_spec_add3(s, true, S3_LOOKAHEAD + 1, D, D, "enc.pre_lookahead_layer.conv1.weight");
    cr_spec_add(s, false, 1, D, 1, "enc.pre_lookahead_layer.conv1.bias");
    cr_spec_add3(s, true, 3, D, D, "enc.pre_lookahead_layer.conv2.weight");
    cr_spec_add(s, false, 1, D, 1, "enc.pre_lookahead_layer.conv2.bias");
    for (int i = 0; i < ENC_BLOCKS; i++) {
        enc_layer_specs(s, "encoders", i);
    }
    cr_spec_add3(s, true, ENC_UP_K, D, D, "enc.up_layer.conv.weight");
    cr_spec_add(s, false, 1, D, 1, "enc.up_layer.conv.bias");
    enc_embed_specs(s, "up_embed");
    for (int i = 0; i < ENC_UP_BLOCKS; i++) {
        enc_layer_specs(s, "up_encoders", i);
    }
    cr_spec_add(s, true, 2, D, S3_MEL, "flow.encoder_proj.weight");
    cr_spec_add(s, false, 1, S3_MEL, 1, "flow.encoder_proj.bias");
}

/* ----------------------------------------------------------- graph pieces */

/*
 * Conv1d, stride 1, zero padding pl/pr. x: [Cin, T, B], w: [K, Cin, Cout],
 * b: [Cout] -> [Cout, T + pl + pr - K + 1, B]. ops (codecrt's device ops): the
 * columns op reads x as it lies; else the F32 im2col, which reads time-fastest
 * rows, hence the transpose. Either way the columns' rows ic*K + k match the
 * kernel's memory order, and the product comes out channels fastest again.
 */
static struct ggml_tensor *enc_conv(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *w,
                                    struct ggml_tensor *b, int pl, int pr, const cr_cpu_ops *cpu, bool ops) {
    const int64_t K = w->ne[0], Cin = w->ne[1], Cout = w->ne[2];
    struct ggml_tensor *col = ops && !cpu ? cr_cols(ctx, x, NULL, NULL, (int)K, 1, pl, pr) : NULL;
    if (!col) {
        struct ggml_tensor *xt = ggml_cont(ctx, ggml_transpose(ctx, x));     /* [T, Cin, B] */
        xt = ggml_pad_ext(ctx, xt, pl, pr, 0, 0, 0, 0, 0, 0);                /* [T+pl+pr, Cin, B] */
        col = ggml_im2col(ctx, w, xt, 1, 0, 0, 0, 1, 0, false, GGML_TYPE_F32); /* [Cin*K, T', B] */
    }
    return cr_linear(ctx, col, ggml_reshape_2d(ctx, w, K * Cin, Cout), b, cpu); /* [Cout, T', B] */
}

/* LayerNorm over the channels of x [512, T, B]: with codecrt's device ops the norm and its
   affine in one op (cr_norm_rows), else ggml's norm, product and sum. */
static struct ggml_tensor *enc_norm(struct ggml_context *ctx, struct ggml_tensor *x, struct ggml_tensor *g,
                                    struct ggml_tensor *b, float eps, bool ops) {
    struct ggml_tensor *y = ops ? cr_norm_rows(ctx, x, g, b, eps, false, false) : NULL;
    return y ? y : cr_layer_norm(ctx, x, g, b, eps);
}

/* LinearNoSubsampling + EspnetRelPositionalEncoding's scaling: x [512, T, B]. */
static struct ggml_tensor *enc_embed(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                     const char *name, const cr_cpu_ops *cpu, bool ops) {
    x = cr_linear(ctx, x, s3_w(w, "enc.%s.out.0.weight", name), s3_w(w, "enc.%s.out.0.bias", name), cpu);
    x = enc_norm(ctx, x, s3_w(w, "enc.%s.out.1.weight", name), s3_w(w, "enc.%s.out.1.bias", name), ENC_EMB_EPS,
                 ops && !cpu);
    return ggml_scale(ctx, x, sqrtf((float)S3_D_MODEL));
}

/*
 * The CPU products take ggml's fast (llamafile sgemm) path only when src1 is
 * contiguous, src0 has a multiple of 4 rows and the shared dimension is a
 * multiple of 8. So the keys are padded to n8, a multiple of 8 (zero k and v
 * columns, scores masked to -inf, so their weights are exactly 0), and the
 * position table to a multiple of 4 rows, more than n8 so that the rel_shift
 * view over n8 keys stays inside each head's block (and inside ggml's view
 * bound, which counts the view as if it were contiguous).
 */
static int64_t enc_keys(int64_t n) { return (n + 7) / 8 * 8; }
static int64_t enc_pos_rows(int64_t n) {
    const int64_t need = 2 * n - 1 > enc_keys(n) + 1 ? 2 * n - 1 : enc_keys(n) + 1;
    return (need + 3) / 4 * 4;
}

/* Rows of the host table: the up stage's, and the first stage's view from row T. */
static int64_t enc_table_rows(int64_t T) {
    const int64_t up = enc_pos_rows(ENC_UP * T), first = T + enc_pos_rows(T);
    return up > first ? up : first;
}

/* [512, n, B] -> per-head [64, n, 8, B] (a view). */
static struct ggml_tensor *enc_heads(struct ggml_context *ctx, struct ggml_tensor *x) {
    const int64_t n = x->ne[1], B = x->ne[2];
    return ggml_permute(ctx, ggml_reshape_4d(ctx, x, ENC_HEAD_DIM, ENC_HEADS, n, B), 0, 2, 1, 3);
}

/*
 * RelPositionMultiHeadedAttention. x: [512, n, B] (normed), pos: table
 * [512, enc_pos_rows(n)] whose first 2n-1 rows are relative positions
 * n-1 .. -(n-1), mask: [n8, n], 0 for keys < n, -inf after. Returns [512, n, B].
 */
static struct ggml_tensor *enc_attention(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                         struct ggml_tensor *pos, struct ggml_tensor *mask, const char *pre, const cr_cpu_ops *cpu) {
    const int64_t D = S3_D_MODEL, n = x->ne[1], B = x->ne[2], L = pos->ne[1], n8 = enc_keys(n);
    struct ggml_tensor *q =
        cr_linear(ctx, x, s3_w(w, "%s.linear_q.weight", pre), s3_w(w, "%s.linear_q.bias", pre), cpu);
    struct ggml_tensor *k =
        cr_linear(ctx, x, s3_w(w, "%s.linear_k.weight", pre), s3_w(w, "%s.linear_k.bias", pre), cpu);
    struct ggml_tensor *v =
        cr_linear(ctx, x, s3_w(w, "%s.linear_v.weight", pre), s3_w(w, "%s.linear_v.bias", pre), cpu);
    struct ggml_tensor *p = cr_linear(ctx, pos, s3_w(w, "%s.linear_pos.weight", pre), NULL, cpu); /* [512, L] */
    if (cpu) {
        /* AVX-512 CPUs: the fused kernel takes both score terms, the shift, the
           softmax and the product with v, over the n real keys (no padding, no mask) */
        struct ggml_tensor *o = cr_relpos_attention_cpu(ctx, q, k, v, p, s3_w(w, "%s.pos_bias_u", pre),
                                                        s3_w(w, "%s.pos_bias_v", pre), cpu);
        if (o) {
            return cr_linear(ctx, o, s3_w(w, "%s.linear_out.weight", pre), s3_w(w, "%s.linear_out.bias", pre),
                              cpu);
        }
    }
    k = ggml_pad_ext(ctx, k, 0, 0, 0, (int)(n8 - n), 0, 0, 0, 0);                        /* [512, n8, B] */
    v = ggml_pad_ext(ctx, v, 0, 0, 0, (int)(n8 - n), 0, 0, 0, 0);

    /* pos_bias_u/v [64, 8] broadcast over positions and batch; queries [64, n, 8, B] */
    q = ggml_reshape_4d(ctx, q, ENC_HEAD_DIM, ENC_HEADS, n, B);
    struct ggml_tensor *qu = ggml_add(ctx, q, s3_w(w, "%s.pos_bias_u", pre));
    struct ggml_tensor *qv = ggml_add(ctx, q, s3_w(w, "%s.pos_bias_v", pre));
    qu = ggml_cont(ctx, ggml_permute(ctx, qu, 0, 2, 1, 3));
    qv = ggml_cont(ctx, ggml_permute(ctx, qv, 0, 2, 1, 3));

    struct ggml_tensor *ac = ggml_mul_mat(ctx, enc_heads(ctx, k), qu); /* [n8 keys, n queries, 8, B] */
    struct ggml_tensor *bd = ggml_mul_mat(ctx, enc_heads(ctx, ggml_reshape_3d(ctx, p, D, L, 1)), qv);
    /* bd [L, n, 8, B]: rel_shift, see the file comment (row stride L-1); the
       padded keys read finite entries past row 2n-2, masked below */
    bd = ggml_view_4d(ctx, bd, n8, n, ENC_HEADS, B, (size_t)(L - 1) * sizeof(float), bd->nb[2], bd->nb[3],
                      (size_t)(n - 1) * sizeof(float));
    struct ggml_tensor *att = ggml_add(ctx, ac, bd);
    att = ggml_soft_max_ext(ctx, att, mask, 1.0f / sqrtf((float)ENC_HEAD_DIM), 0.0f); /* [n8, n, 8, B] */

    /* v as [n8 keys, 64, 8, B] so the product is [64, n queries, 8, B] */
    v = ggml_reshape_4d(ctx, v, ENC_HEAD_DIM, ENC_HEADS, n8, B);
    v = ggml_cont(ctx, ggml_permute(ctx, v, 1, 2, 0, 3));
    struct ggml_tensor *o = ggml_mul_mat(ctx, v, att);
    o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3)); /* [64, 8, n, B] */
    o = ggml_reshape_3d(ctx, o, D, n, B);
    return cr_linear(ctx, o, s3_w(w, "%s.linear_out.weight", pre), s3_w(w, "%s.linear_out.bias", pre), cpu);
}

/* ConformerEncoderLayer, normalize_before, no macaron, no conv module. */
static struct ggml_tensor *enc_layer(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                     struct ggml_tensor *pos, struct ggml_tensor *mask, const char *stack, int i,
                                     const cr_cpu_ops *cpu, bool ops) {
    char pre[GGML_MAX_NAME];
    snprintf(pre, sizeof(pre), "enc.%s.%d.self_attn", stack, i);
    struct ggml_tensor *h = enc_norm(ctx, x, s3_w(w, "enc.%s.%d.norm_mha.weight", stack, i),
                                     s3_w(w, "enc.%s.%d.norm_mha.bias", stack, i), ENC_LN_EPS, ops && !cpu);
    x = ggml_add(ctx, x, enc_attention(ctx, w, h, pos, mask, pre, cpu));
    h = enc_norm(ctx, x, s3_w(w, "enc.%s.%d.norm_ff.weight", stack, i), s3_w(w, "enc.%s.%d.norm_ff.bias", stack, i),
                 ENC_LN_EPS, ops && !cpu);
    h = cr_linear(ctx, h, s3_w(w, "enc.%s.%d.feed_forward.w_1.weight", stack, i),
                   s3_w(w, "enc.%s.%d.feed_forward.w_1.bias", stack, i), cpu); /* [2048, n, B] */
    h = ggml_silu(ctx, h);
    h = cr_linear(ctx, h, s3_w(w, "enc.%s.%d.feed_forward.w_2.weight", stack, i),
                   s3_w(w, "enc.%s.%d.feed_forward.w_2.bias", stack, i), cpu);
    return ggml_add(ctx, x, h);
}

/* PreLookaheadLayer: each token sees the next 3. x: [512, T, B]. */
static struct ggml_tensor *enc_lookahead(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                         const cr_cpu_ops *cpu, bool ops) {
    struct ggml_tensor *h = enc_conv(ctx, x, s3_w(w, "enc.pre_lookahead_layer.conv1.weight"),
                                     s3_w(w, "enc.pre_lookahead_layer.conv1.bias"), 0, S3_LOOKAHEAD, cpu, ops);
    h = ggml_leaky_relu(ctx, h, 0.01f, false);
    h = enc_conv(ctx, h, s3_w(w, "enc.pre_lookahead_layer.conv2.weight"),
                 s3_w(w, "enc.pre_lookahead_layer.conv2.bias"), 2, 0, cpu, ops);
    return ggml_add(ctx, x, h);
}

/* Upsample1D: nearest x2 (each frame twice), left pad 4, conv k5. [512, T, B] -> [512, 2T, B]. */
static struct ggml_tensor *enc_upsample(struct ggml_context *ctx, struct ggml_context *w, struct ggml_tensor *x,
                                        const cr_cpu_ops *cpu, bool ops) {
    const int64_t C = x->ne[0], T = x->ne[1], B = x->ne[2];
    x = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, x, C, 1, T, B), C, ENC_UP, T, B);
    x = ggml_reshape_3d(ctx, x, C, ENC_UP * T, B);
    return enc_conv(ctx, x, s3_w(w, "enc.up_layer.conv.weight"), s3_w(w, "enc.up_layer.conv.bias"),
                    2 * ENC_UP, 0, cpu, ops);
}

/* [n8, n] score mask of one stage from its row (0 for the n keys, -inf for the padding) */
static struct ggml_tensor *enc_mask(struct ggml_context *ctx, struct ggml_tensor *rows, int64_t off, int64_t n) {
    struct ggml_tensor *row = ggml_view_1d(ctx, rows, enc_keys(n), (size_t)off * sizeof(float));
    return ggml_repeat_4d(ctx, row, enc_keys(n), n, 1, 1);
}

struct ggml_tensor *s3_encoder_build(struct ggml_context *ctx, struct ggml_context *w, const s3gen_hparams *hp,
                                     int64_t T, int64_t B, const cr_cpu_ops *cpu_ops, bool ops,
                                     s3_encoder_io *io) {
    (void)hp;
    const cr_cpu_ops *cpu = cpu_ops; /* the fused linear op where it applies, else ggml's */
    const int64_t D = S3_D_MODEL, T2 = ENC_UP * T; /* frames after upsampling */
    io->tokens = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, T, B);
    ggml_set_name(io->tokens, "tokens");
    ggml_set_input(io->tokens);
    /* F32 [512, enc_table_rows(T)]: row j is relative position 2T-1-j */
    struct ggml_tensor *tab = io->in[ENC_IN_POS] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, D, enc_table_rows(T));
    ggml_set_name(tab, "enc.pos");
    ggml_set_input(tab);
    /* the stages' tables start at positions 2T-1 (row 0) and T-1 (row T) */
    struct ggml_tensor *pos2 = ggml_view_2d(ctx, tab, D, enc_pos_rows(T2), tab->nb[1], 0);
    struct ggml_tensor *pos1 = ggml_view_2d(ctx, tab, D, enc_pos_rows(T), tab->nb[1], (size_t)T * tab->nb[1]);
    /* F32 [n8(T) + n8(2T)]: the two stages' mask rows, see enc_keys */
    struct ggml_tensor *rows = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, enc_keys(T) + enc_keys(T2));
    io->in[ENC_IN_MASK] = rows;
    ggml_set_name(rows, "enc.mask");
    ggml_set_input(rows);
    struct ggml_tensor *mask1 = enc_mask(ctx, rows, 0, T), *mask2 = enc_mask(ctx, rows, enc_keys(T), T2);

    struct ggml_tensor *x = ggml_get_rows(ctx, s3_w(w, "flow.input_embedding.weight"),
                                          ggml_reshape_1d(ctx, io->tokens, T * B)); /* [512, T*B] */
    x = ggml_reshape_3d(ctx, x, D, T, B);
    x = enc_embed(ctx, w, x, "embed", cpu, ops);
    x = enc_lookahead(ctx, w, x, cpu, ops);
    for (int i = 0; i < ENC_BLOCKS; i++) {
        x = enc_layer(ctx, w, x, pos1, mask1, "encoders", i, cpu, ops);
    }
    x = enc_upsample(ctx, w, x, cpu, ops); /* [512, 2T, B] */
    x = enc_embed(ctx, w, x, "up_embed", cpu, ops);
    for (int i = 0; i < ENC_UP_BLOCKS; i++) {
        x = enc_layer(ctx, w, x, pos2, mask2, "up_encoders", i, cpu, ops);
    }
    x = enc_norm(ctx, x, s3_w(w, "enc.after_norm.weight"), s3_w(w, "enc.after_norm.bias"), ENC_EMB_EPS, ops && !cpu);
    x = cr_linear(ctx, x, s3_w(w, "flow.encoder_proj.weight"), s3_w(w, "flow.encoder_proj.bias"),
                   cpu); /* [80, 2T, B] */
    return ggml_cont(ctx, ggml_transpose(ctx, x)); /* [2T, 80, B] */
}

/* Elements [off, off + count) of the F32 tensor t := value. */
static void enc_fill(struct ggml_tensor *t, int64_t off, int64_t count, float value) {
    float buf[256];
    for (int i = 0; i < 256; i++) {
        buf[i] = value;
    }
    for (int64_t i = 0; i < count; i += 256) {
        const int64_t m = count - i < 256 ? count - i : 256;
        ggml_backend_tensor_set(t, buf, (size_t)(off + i) * sizeof(float), (size_t)m * sizeof(float));
    }
}

static void enc_set_masks(int64_t T, struct ggml_tensor *rows) {
    const int64_t n[2] = {T, ENC_UP * T};
    int64_t off = 0;
    for (int s = 0; s < 2; s++) {
        enc_fill(rows, off, n[s], 0.0f);
        enc_fill(rows, off + n[s], enc_keys(n[s]) - n[s], -INFINITY);
        off += enc_keys(n[s]);
    }
}

/*
 * EspnetRelPositionalEncoding.extend_pe: row j holds relative position
 * r = 2T-1-j as [sin(r w_0), cos(r w_0), sin(r w_1), ...] with
 * w_i = exp(2i * -(ln 10000 / 512)); rows past 4T-2 are padding (finite, never
 * weighted). torch computes the exponent, w_i and r * w_i in float32: the same
 * float roundings here, then sin and cos in double of that float argument
 * (torch's float sin is within 1 ulp of it).
 */
void s3_encoder_set_inputs(const s3gen_hparams *hp, int64_t T, int64_t B, const s3_encoder_io *io) {
    (void)hp;
    (void)B;
    enum { H = S3_D_MODEL / 2 };
    float freq[H];
    const float c = (float)(-(log(10000.0) / S3_D_MODEL));
    for (int i = 0; i < H; i++) {
        freq[i] = (float)exp((double)((float)(2 * i) * c));
    }
    const int64_t n = ENC_UP * T, rows = enc_table_rows(T);
    float buf[ENC_TABLE_ROWS][S3_D_MODEL];
    for (int64_t j0 = 0; j0 < rows; j0 += ENC_TABLE_ROWS) {
        const int64_t m = rows - j0 < ENC_TABLE_ROWS ? rows - j0 : ENC_TABLE_ROWS;
        for (int64_t j = 0; j < m; j++) {
            const float r = (float)(n - 1 - (j0 + j));
            for (int i = 0; i < H; i++) {
                const double a = (double)(r * freq[i]);
                buf[j][2 * i] = (float)sin(a);
                buf[j][2 * i + 1] = (float)cos(a);
            }
        }
        ggml_backend_tensor_set(io->in[ENC_IN_POS], buf, (size_t)j0 * sizeof(buf[0]), (size_t)m * sizeof(buf[0]));
    }
    if (io->in[ENC_IN_MASK]->buffer) { /* absent from the graph when every layer runs the fused CPU attention */
        enc_set_masks(T, io->in[ENC_IN_MASK]);
    }
}

/* The up-stage position scores bd [~4T, 2T, 8, B] are the largest tensor
   unless T is small, when the up conv's im2col [5*512, 2T, B] is. */
int64_t s3_encoder_max_elements(int64_t T, int64_t B) {
    const int64_t n = ENC_UP * T;
    const int64_t bd = enc_pos_rows(n) * n * ENC_HEADS * B, col = ENC_UP_K * S3_D_MODEL * n * B;
    return bd > col ? bd : col;
}
