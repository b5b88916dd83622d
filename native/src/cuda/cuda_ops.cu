/*
 * cuda_ops.cu: codecrt's ops on a CUDA device, as a small ggml backend beside ggml's
 * CUDA backend (cuda_ops.h says how the scheduler hands it the nodes and how the two
 * streams are ordered). Compiled only in a CUDA build (-DGGML_CUDA=ON), with our
 * flags (not ggml's -use_fast_math: the Snake's sine is the precise sinf, as on the CPU).
 *
 * The ops of a Snake residual unit (ops/ops_res_unit.c has their definitions and CPU
 * implementations): the unit core (Snake1, a depthwise conv with its bias, Snake2 and a
 * transpose, in one kernel that reads the time-fastest input once and writes the
 * channels-fastest output once) and the unit tail (the 1x1 conv's bias and the residual
 * added in one pass), a transposed conv's tail (ops/ops_upconv.c: its product's two
 * halves, the bias and the mask, written time fastest, in one pass), a scaled softmax
 * over rows (ops/ops_softmax.c: one warp a row, its scores in registers), and a stride-1
 * convolution's column matrix read from a channels-fastest input, through a Snake if asked
 * (ops/ops_cols.c), the attention's scores and its weighted values with the heads
 * interleaved (ops/ops_attn.c) and a plain matrix product (ops/ops_matmul.c), all three
 * cuBLAS' products on this backend's stream, a norm over each row with its affine and an
 * optional Mish (ops/ops_norm.c), and a product's bias with an activation or a residual
 * (ops/ops_bias_act.c).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "cuda_ops.h"
#include "ggml-backend-impl.h"
#include "ggml-cuda.h"
#include "ggml.h"
#include "ops/attn.h"
#include "ops/bias_act.h"
#include "ops/cols.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/res_unit.h"
#include "ops/softmax.h"
#include "ops/upconv.h"

namespace {

/* ------------------------------------------------------------ the unit core */

/* A block computes TILE_T outputs of TILE_C channels of one sequence: the lanes of a warp are
   channels, so that each output row of the channels-fastest result is one 128-byte write;
   its ROWS warps share the input tile, which the lanes load along time (coalesced), Snake1
   applied once per input point. */
constexpr int TILE_C = 32;
constexpr int TILE_T = 64;
constexpr int ROWS = 8;
constexpr int MAX_GRID_Z = 65535; /* the grid's y and z extents */
constexpr int MAX_GRID_Y = 65535;

/* sin(x) by the hardware's approximation after reducing x modulo 2 pi in two steps (2 pi as
   a float plus its remainder): within about 1e-6 of sinf for |x| up to 1e4, where ggml's
   own Snake (built with -use_fast_math) takes __sinf of x unreduced. CUDA's sinf is some
   twenty instructions a call, and the unit core takes two and more a sample: it was
   compute-bound (an offline SNAC decode's core kernels moved a third of the H100's memory
   bandwidth, 2026-12-06). CODECRT_PRECISE_SIN=1 takes sinf (cr_cuda_ops_new's precise_sin). */
__device__ __forceinline__ float sin_reduced(float x) {
    const float k = rintf(x * 0.159154943091895336f);   /* 1 / (2 pi) */
    float r = fmaf(-k, 6.28318548202514648f, x);        /* 2 pi rounded to a float */
    r = fmaf(-k, -1.74845560007449e-07f, r);         /* 2 pi less that float */
    return __sinf(r);
}

/* x + inv sin(a x)^2, in the composed ops' order (mul, sin, sqr, mul, add) */
template <bool PRECISE>
__device__ __forceinline__ float snake(float x, float a, float inv) {
    const float s = PRECISE ? sinf(x * a) : sin_reduced(x * a);
    return x + (s * s) * inv;
}

/* The shared tile's row: the outputs' reach, odd so that the lanes (one row each) read
   32 different banks. */
__host__ __device__ inline int tile_stride(int span) {
    return (TILE_T + span) | 1;
}

inline size_t tile_bytes(int span) {
    return (size_t)TILE_C * (size_t)tile_stride(span) * sizeof(float);
}

/*
 * t [L, B, C] (time fastest) -> y [C, n, B] (channels fastest):
 *   y[c, i, b] = Snake2(bias[c] + sum_k w[c + k C] Snake1(t[i + k dil - lp, b, c])), zeros
 *   outside [0, L). KT: the taps when known at compile time (SNAC's 7), else 0 (K_rt taps).
 * Grid (ceil(n / TILE_T), ceil(C / TILE_C), min(B, 65535)); block (32, ROWS).
 */
template <int KT, bool PRECISE>
__global__ void __launch_bounds__(32 * ROWS)
    unit_core_kernel(const float *__restrict__ t, const float *__restrict__ w, const float *__restrict__ bias,
                     const float *__restrict__ a1, const float *__restrict__ i1, const float *__restrict__ a2,
                     const float *__restrict__ i2, float *__restrict__ y, int64_t L, int B, int C, int64_t n,
                     int K_rt, int dil, int64_t lp) {
    extern __shared__ float tile[]; /* [TILE_C][stride] */
    const int K = KT > 0 ? KT : K_rt;
    const int span = (K - 1) * dil, width = TILE_T + span, stride = tile_stride(span);
    const int c0 = blockIdx.y * TILE_C, lane = threadIdx.x, row = threadIdx.y;
    const int64_t t0 = (int64_t)blockIdx.x * TILE_T;
    const int c = c0 + lane;

    float wk[KT > 0 ? KT : CR_UNIT_CORE_MAX_TAPS];
    float bc = 0.0f, a2c = 0.0f, i2c = 0.0f;
    if (c < C) {
#pragma unroll
        for (int k = 0; k < (KT > 0 ? KT : CR_UNIT_CORE_MAX_TAPS); k++) {
            wk[k] = k < K ? w[c + (int64_t)k * C] : 0.0f;
        }
        bc = bias[c];
        a2c = a2[c];
        i2c = i2[c];
    }

    for (int b = blockIdx.z; b < B; b += gridDim.z) {
        /* the input tile: Snake1 of frames t0 - lp .. t0 - lp + width - 1 of 32 channels */
        for (int ci = row; ci < TILE_C && c0 + ci < C; ci += ROWS) {
            const int cc = c0 + ci;
            const float *x = t + ((int64_t)cc * B + b) * L;
            const float a = a1[cc], ia = i1[cc];
            for (int j = lane; j < width; j += 32) {
                const int64_t g = t0 - lp + j;
                tile[ci * stride + j] = g >= 0 && g < L ? snake<PRECISE>(x[g], a, ia) : 0.0f;
            }
        }
        __syncthreads();
        if (c < C) {
            const float *s = tile + lane * stride;
            for (int tt = row; tt < TILE_T && t0 + tt < n; tt += ROWS) {
                float acc = 0.0f;
#pragma unroll
                for (int k = 0; k < (KT > 0 ? KT : CR_UNIT_CORE_MAX_TAPS); k++) {
                    if (KT > 0 || k < K) {
                        acc += s[tt + k * dil] * wk[k];
                    }
                }
                y[((int64_t)b * n + t0 + tt) * C + c] = snake<PRECISE>(acc + bc, a2c, i2c);
            }
        }
        __syncthreads(); /* the tile is reloaded for the next sequence */
    }
}

/* ------------------------------------------------------------ the unit tail */

/*
 * out (S + t, b, c) = ((y[t + n b, c] + bias[c]) + x(t, b, c)) * mask[t + n b], after
 * out (s, b, c) = prefix (s, b, c) for s < S (the next layer's state, where the op has one;
 * S = 0 else): y [n*B, C] and out [S+n, B, C] contiguous, x [n, B, C] and prefix [S, B, C]
 * with time contiguous and rows at (nb1, nb2), (pnb1, pnb2) bytes, mask [n, B] contiguous or
 * absent (a steady graph's units: no factor). Flat over
 * out, so that short rows (a tick's first decoder block: 32 frames) fill the warps; I:
 * uint32_t where out has fewer than 2^32 elements (cheaper divisions), else uint64_t.
 */
template <typename I>
__global__ void unit_tail_kernel(const float *__restrict__ y, const float *__restrict__ bias,
                                 const char *__restrict__ x, const float *__restrict__ mask,
                                 const char *__restrict__ pre, float *__restrict__ out, I n, I S, I B, I total,
                                 int64_t nb1, int64_t nb2, int64_t pnb1, int64_t pnb2) {
    const I L = S + n; /* a row of out: the prefix's S frames, then the tail's n */
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        const I r = i / L, u = i - r * L, b = r % B, c = r / B;
        if (u < S) {
            out[i] = *(const float *)(pre + (int64_t)b * pnb1 + (int64_t)c * pnb2 + (int64_t)u * sizeof(float));
            continue;
        }
        const I t = u - S;
        const float xv = *(const float *)(x + (int64_t)b * nb1 + (int64_t)c * nb2 + (int64_t)t * sizeof(float));
        const float v = (y[t + r * n] + bias[c]) + xv;
        out[i] = mask ? v * mask[t + b * n] : v; /* mask [n, B]: one factor per (t, b) */
    }
}

/* ------------------------------------------------------------ the upconv tail */

/*
 * z [2s*C, T, B] (channels fastest) -> out [S + n, B, C] (time fastest):
 *   out[S + o, b, c] = ((z[r C + c, j, b] + z[(s + r) C + c, j - 1, b]) + bias[c]) * mask[o, b],
 *   u = o + crop, j = u / s, r = u % s, frames -1 and T zeros; out[s', b, c] = prefix(s', b, c)
 * for s' < S (the next layer's state, rows at (pnb1, pnb2) bytes; S = 0 without one). A block
 * transposes a tile of TILE_T samples x 32 channels through shared memory: its lanes read
 * channels (128-byte rows of z), then write samples (128-byte rows of out); the blocks of the
 * first tile in time also copy the prefix of their rows.
 * Grid (ceil(n / TILE_T), ceil(C / 32), min(B, 65535)); block (32, ROWS).
 */
__global__ void __launch_bounds__(32 * ROWS)
    upconv_tail_kernel(const float *__restrict__ z, const float *__restrict__ bias, const float *__restrict__ mask,
                       const char *__restrict__ pre, float *__restrict__ out, int64_t n, int B, int C, int64_t T,
                       int s, int crop, int64_t S, int64_t pnb1, int64_t pnb2) {
    __shared__ float tile[TILE_C][TILE_T + 1];
    const int c0 = blockIdx.y * TILE_C, lane = threadIdx.x, row = threadIdx.y;
    const int64_t o0 = (int64_t)blockIdx.x * TILE_T;
    const int c = c0 + lane;
    const int64_t frame = 2 * (int64_t)s * C; /* z's floats per frame */
    const float bc = c < C ? bias[c] : 0.0f;
    for (int b = blockIdx.z; b < B; b += gridDim.z) {
        const float *zb = z + (int64_t)b * T * frame;
        if (c < C) {
            for (int oo = row; oo < TILE_T && o0 + oo < n; oo += ROWS) {
                const int64_t o = o0 + oo, u = o + crop, j = u / s;
                const int r = (int)(u - j * s);
                const float lo = j < T ? zb[j * frame + (int64_t)r * C + c] : 0.0f;
                const float hi = j >= 1 ? zb[(j - 1) * frame + (int64_t)(s + r) * C + c] : 0.0f;
                const float v = (lo + hi) + bc;
                tile[lane][oo] = mask ? v * mask[(int64_t)b * n + o] : v;
            }
        }
        __syncthreads();
        for (int cc = row; cc < TILE_C && c0 + cc < C; cc += ROWS) {
            float *dst = out + ((int64_t)(c0 + cc) * B + b) * (S + n);
            if (pre && blockIdx.x == 0) {
                const float *pr = (const float *)(pre + (int64_t)b * pnb1 + (int64_t)(c0 + cc) * pnb2);
                for (int64_t i = lane; i < S; i += 32) {
                    dst[i] = pr[i];
                }
            }
            dst += S;
            for (int oo = lane; oo < TILE_T && o0 + oo < n; oo += 32) {
                dst[o0 + oo] = tile[cc][oo];
            }
        }
        __syncthreads(); /* the tile is refilled for the next sequence */
    }
}

/* ggml's custom op parameters (ggml-impl.h, struct ggml_custom_op_params), read from
   op_params as ggml_custom_4d wrote them */
struct custom_op_params {
    ggml_custom_op_t fun;
    int n_tasks;
    void *userdata;
};

custom_op_params custom_params(const ggml_tensor *op) {
    custom_op_params p;
    std::memcpy(&p, op->op_params, sizeof(p));
    return p;
}

ggml_custom_op_t custom_fun(const ggml_tensor *op) {
    return op->op == GGML_OP_CUSTOM ? custom_params(op).fun : nullptr;
}

bool is_unit_core(const ggml_tensor *op) {
    return custom_fun(op) == cr_unit_core_cpu;
}

bool is_unit_tail(const ggml_tensor *op) {
    return custom_fun(op) == cr_unit_tail_cpu;
}

bool is_upconv_tail(const ggml_tensor *op) {
    return custom_fun(op) == cr_upconv_tail_cpu;
}

bool is_softmax_rows(const ggml_tensor *op) {
    return custom_fun(op) == cr_softmax_rows_cpu;
}

bool is_cols(const ggml_tensor *op) {
    return custom_fun(op) == cr_cols_cpu;
}

bool is_attn_scores(const ggml_tensor *op) {
    return custom_fun(op) == cr_attn_scores_cpu;
}

bool is_attn_values(const ggml_tensor *op) {
    return custom_fun(op) == cr_attn_values_cpu;
}

bool is_matmul(const ggml_tensor *op) {
    return custom_fun(op) == cr_matmul_cpu;
}

/* The ops this backend runs on cuBLAS. */
bool is_blas(const ggml_tensor *op) {
    return is_attn_scores(op) || is_attn_values(op) || is_matmul(op);
}

bool is_norm_rows(const ggml_tensor *op) {
    return custom_fun(op) == cr_norm_rows_cpu;
}

bool is_bias_act(const ggml_tensor *op) {
    return custom_fun(op) == cr_bias_act_cpu;
}

cr_unit_core_params unit_core_params(const ggml_tensor *op) {
    return cr_unit_core_unpack(custom_params(op).userdata);
}

/* The reach of a unit-core node: dilation x (taps - 1). */
int unit_core_span(const ggml_tensor *op) {
    return unit_core_params(op).dil * (int)(op->src[1]->ne[1] - 1);
}

cudaError_t launch_unit_core(const ggml_tensor *dst, cudaStream_t stream, bool precise) {
    const ggml_tensor *t = dst->src[0], *w = dst->src[1];
    const cr_unit_core_params p = unit_core_params(dst);
    const int64_t L = t->ne[0], n = dst->ne[1];
    const int B = (int)t->ne[1], C = (int)t->ne[2], K = (int)w->ne[1];
    const int span = p.dil * (K - 1);
    const int64_t lp = p.same ? span / 2 : 0;
    const dim3 grid((unsigned)((n + TILE_T - 1) / TILE_T), (unsigned)((C + TILE_C - 1) / TILE_C),
                    (unsigned)(B < MAX_GRID_Z ? B : MAX_GRID_Z));
    const dim3 block(32, ROWS);
    const size_t smem = tile_bytes(span);
    const float *args[7];
    for (int i = 0; i < 7; i++) {
        args[i] = (const float *)dst->src[i]->data;
    }
    float *y = (float *)dst->data;
    /* SNAC's 7 taps unrolled; the sine reduced (the default) or CUDA's sinf */
    auto kernel = K == 7 ? (precise ? unit_core_kernel<7, true> : unit_core_kernel<7, false>)
                         : (precise ? unit_core_kernel<0, true> : unit_core_kernel<0, false>);
    kernel<<<grid, block, smem, stream>>>(args[0], args[1], args[2], args[3], args[4], args[5], args[6], y, L, B,
                                          C, n, K, p.dil, lp);
    return cudaGetLastError();
}

cudaError_t launch_unit_tail(const ggml_tensor *dst, cudaStream_t stream) {
    const ggml_tensor *y = dst->src[0], *b = dst->src[1], *x = dst->src[2], *m = dst->src[3], *p = dst->src[4];
    const int64_t S = p ? p->ne[0] : 0, n = dst->ne[0] - S, B = dst->ne[1], total = ggml_nelements(dst);
    const int threads = 256;
    const int64_t want = (total + threads - 1) / threads;
    const unsigned blocks = (unsigned)(want < (1 << 20) ? want : (1 << 20));
    const float *yd = (const float *)y->data, *bd = (const float *)b->data;
    const float *md = m ? (const float *)m->data : nullptr;
    const char *xd = (const char *)x->data, *pd = p ? (const char *)p->data : nullptr;
    const int64_t pnb1 = p ? (int64_t)p->nb[1] : 0, pnb2 = p ? (int64_t)p->nb[2] : 0;
    float *od = (float *)dst->data;
    if (total < ((int64_t)1 << 32) - (int64_t)blocks * threads) {
        unit_tail_kernel<uint32_t><<<blocks, threads, 0, stream>>>(yd, bd, xd, md, pd, od, (uint32_t)n, (uint32_t)S,
                                                                    (uint32_t)B, (uint32_t)total, x->nb[1], x->nb[2],
                                                                    pnb1, pnb2);
    } else {
        unit_tail_kernel<uint64_t><<<blocks, threads, 0, stream>>>(yd, bd, xd, md, pd, od, (uint64_t)n, (uint64_t)S,
                                                                    (uint64_t)B, (uint64_t)total, x->nb[1], x->nb[2],
                                                                    pnb1, pnb2);
    }
    return cudaGetLastError();
}

cudaError_t launch_upconv_tail(const ggml_tensor *dst, cudaStream_t stream) {
    const ggml_tensor *z = dst->src[0], *b = dst->src[1], *mask = dst->src[2], *pre = dst->src[3];
    const cr_upconv_params p = cr_upconv_unpack(custom_params(dst).userdata);
    const int64_t S = pre ? pre->ne[0] : 0, n = dst->ne[0] - S, T = z->ne[1];
    const int B = (int)dst->ne[1], C = (int)dst->ne[2];
    const dim3 grid((unsigned)((n + TILE_T - 1) / TILE_T), (unsigned)((C + TILE_C - 1) / TILE_C),
                    (unsigned)(B < MAX_GRID_Z ? B : MAX_GRID_Z));
    upconv_tail_kernel<<<grid, dim3(32, ROWS), 0, stream>>>(
        (const float *)z->data, (const float *)b->data, mask ? (const float *)mask->data : nullptr,
        pre ? (const char *)pre->data : nullptr, (float *)dst->data, n, B, C, T, p.s, p.crop, S,
        pre ? (int64_t)pre->nb[1] : 0, pre ? (int64_t)pre->nb[2] : 0);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ the rows' softmax */

constexpr int SM_WARPS = 4;          /* rows a block: a warp each */
constexpr int SM_PER_LANE = 32;      /* rows of up to 32 x 32 = 1,024 scores stay in registers */

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

/* y = softmax(scale x) along each row of n; a warp per row (threadIdx.y), lane i holding
   scores i, i + 32, ...: read once, written once (REG: n <= 1,024), else three passes. */
template <bool REG>
__global__ void softmax_rows_kernel(const float *__restrict__ x, float *__restrict__ y, int64_t n, int64_t rows,
                                    float scale) {
    const int lane = (int)threadIdx.x;
    const int64_t r = (int64_t)blockIdx.x * SM_WARPS + threadIdx.y;
    if (r >= rows) {
        return; /* the whole warp: its shuffles below are all or none */
    }
    const float *xr = x + r * n;
    float *yr = y + r * n;
    float m = -INFINITY;
    if constexpr (REG) {
        float v[SM_PER_LANE];
#pragma unroll
        for (int k = 0; k < SM_PER_LANE; k++) {
            const int64_t i = (int64_t)k * 32 + lane;
            v[k] = i < n ? scale * xr[i] : -INFINITY;
            m = fmaxf(m, v[k]);
        }
        m = warp_max(m);
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < SM_PER_LANE; k++) {
            v[k] = (int64_t)k * 32 + lane < n ? expf(v[k] - m) : 0.0f;
            sum += v[k];
        }
        const float inv = 1.0f / warp_sum(sum);
#pragma unroll
        for (int k = 0; k < SM_PER_LANE; k++) {
            const int64_t i = (int64_t)k * 32 + lane;
            if (i < n) {
                yr[i] = v[k] * inv;
            }
        }
    } else {
        for (int64_t i = lane; i < n; i += 32) {
            m = fmaxf(m, scale * xr[i]);
        }
        m = warp_max(m);
        float sum = 0.0f;
        for (int64_t i = lane; i < n; i += 32) {
            const float e = expf(scale * xr[i] - m);
            yr[i] = e;
            sum += e;
        }
        const float inv = 1.0f / warp_sum(sum);
        for (int64_t i = lane; i < n; i += 32) {
            yr[i] *= inv;
        }
    }
}

cudaError_t launch_softmax_rows(const ggml_tensor *dst, cudaStream_t stream) {
    const ggml_tensor *a = dst->src[0];
    const int64_t n = a->ne[0], rows = ggml_nrows(a);
    const float scale = cr_softmax_unpack(custom_params(dst).userdata);
    const dim3 grid((unsigned)((rows + SM_WARPS - 1) / SM_WARPS)), block(32, SM_WARPS);
    auto kernel = n <= 32 * SM_PER_LANE ? softmax_rows_kernel<true> : softmax_rows_kernel<false>;
    kernel<<<grid, block, 0, stream>>>((const float *)a->data, (float *)dst->data, n, rows, scale);
    return cudaGetLastError();
}

/* ------------------------------------------------------- a convolution's columns */

constexpr int COLS_THREADS = 256;
constexpr int COLS_PER_BLOCK_ELEMENTS = 2048; /* a block writes about this many: 8 a thread */

/* dst [rows = C K, ncols = To B] from x [C, T, B]: a block writes `per` whole columns, which
   lie side by side in dst, so its threads write consecutive floats; thread e of them reads
   channel c = r / K of frame t + k d - pl (r = e mod rows, k = r mod K), K short runs of
   channels a warp. Indices within a block fit 32 bits (dev_supports_op). With the Snake each
   input value is gathered, so its sine taken, K times: the reduced sine (as the unit core's,
   CODECRT_PRECISE_SIN=1 for sinf) keeps that off the kernel's time (with sinf it was 57 ms of
   a 64-stream Turbo tick's 325 on an H100, where the cols without it were 6). */
template <bool SNAKE, bool PRECISE>
__global__ void cols_kernel(const float *__restrict__ x, const float *__restrict__ alpha,
                            const float *__restrict__ inv, float *__restrict__ dst, int C, int K, int d, int pl,
                            int T, int To, int ncols, int rows, int per) {
    const int j0 = (int)blockIdx.x * per;
    const int n = min(per, ncols - j0) * rows;
    float *out = dst + (int64_t)j0 * rows;
    for (int e = (int)threadIdx.x; e < n; e += COLS_THREADS) {
        const int jj = e / rows, r = e - jj * rows;
        const int c = r / K, k = r - c * K;
        const int j = j0 + jj, b = j / To, t = j - b * To;
        const int s = t + k * d - pl;
        float v = 0.0f;
        if (s >= 0 && s < T) {
            v = x[((int64_t)b * T + s) * C + c];
            if constexpr (SNAKE) {
                v = snake<PRECISE>(v, alpha[c], inv[c]);
            }
        }
        out[e] = v;
    }
}

cudaError_t launch_cols(const ggml_tensor *dst, cudaStream_t stream, bool precise_sin) {
    const ggml_tensor *x = dst->src[0];
    const cr_cols_params p = cr_cols_unpack(custom_params(dst).userdata);
    const int rows = (int)dst->ne[0], ncols = (int)(dst->ne[1] * dst->ne[2]);
    const int per = rows >= COLS_PER_BLOCK_ELEMENTS ? 1 : COLS_PER_BLOCK_ELEMENTS / rows;
    const dim3 grid((unsigned)(((int64_t)ncols + per - 1) / per));
    const float *xd = (const float *)x->data;
    const float *alpha = p.snake ? (const float *)dst->src[1]->data : nullptr;
    const float *inv = p.snake ? (const float *)dst->src[2]->data : nullptr;
    auto kernel = !p.snake ? cols_kernel<false, false> : precise_sin ? cols_kernel<true, true> : cols_kernel<true, false>;
    kernel<<<grid, COLS_THREADS, 0, stream>>>(xd, alpha, inv, (float *)dst->data, (int)x->ne[0], p.k, p.d, p.pl,
                                              (int)x->ne[1], (int)dst->ne[1], ncols, rows, per);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ the products */

/* Their handle takes ggml's math mode (TF32 allowed; NVIDIA_TF32_OVERRIDE=0 forbids it), so
   these products round as ggml's cuBLAS products would. (ggml runs an F32 product of 16
   columns or fewer in kernels of its own instead: cr_mm pads those to 17 for cuBLAS.) */

/* dst [N, M] = a^T b: ggml_mul_mat(a [K, N], b [K, M]) in cuBLAS' column-major terms,
   C (N x M, ldc N) = A^T (A: K x N, lda K) x B (K x M, ldb K), as ggml's own SGEMM call. */
cublasStatus_t launch_matmul(const ggml_tensor *dst, cublasHandle_t handle) {
    const ggml_tensor *a = dst->src[0], *b = dst->src[1];
    const int K = (int)a->ne[0], N = (int)a->ne[1], M = (int)ggml_nrows(b);
    const float one = 1.0f, zero = 0.0f;
    return cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, (const float *)a->data, K,
                       (const float *)b->data, K, &zero, (float *)dst->data, N);
}

/*
 * dst [Tk, Tq, H, B] = per head h and sequence b  K_hb^T [Tk, D] x Q_hb [D, Tq], with k and q
 * [D, T, H, B] views (channels fastest, rows nb1 apart). Per head a strided batch over the
 * sequences: C (Tk x Tq, ldc Tk) = A^T (A: D x Tk, lda k.nb1/4) x B (D x Tq, ldb q.nb1/4).
 */
cublasStatus_t launch_attn_scores(const ggml_tensor *dst, cublasHandle_t handle) {
    const ggml_tensor *k = dst->src[0], *q = dst->src[1];
    const int D = (int)k->ne[0], Tk = (int)k->ne[1], Tq = (int)q->ne[1], H = (int)k->ne[2], B = (int)k->ne[3];
    const float one = 1.0f, zero = 0.0f;
    const long long sa = (long long)(k->nb[3] / sizeof(float)), sb = (long long)(q->nb[3] / sizeof(float)),
                    sc = (long long)H * Tk * Tq;
    for (int h = 0; h < H; h++) {
        const float *a = (const float *)((const char *)k->data + (size_t)h * k->nb[2]);
        const float *b = (const float *)((const char *)q->data + (size_t)h * q->nb[2]);
        float *c = (float *)dst->data + (size_t)h * Tk * Tq;
        const cublasStatus_t st = cublasSgemmStridedBatched(
            handle, CUBLAS_OP_T, CUBLAS_OP_N, Tk, Tq, D, &one, a, (int)(k->nb[1] / sizeof(float)), sa, b,
            (int)(q->nb[1] / sizeof(float)), sb, &zero, c, Tk, sc, B);
        if (st != CUBLAS_STATUS_SUCCESS) {
            return st;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}


/*
 * dst [D, H, Tq, B] = per head h and sequence b  V_hb [D, Tk] x P_hb [Tk, Tq], with
 * v [Tk, D, H, B] (keys fastest, rows nb1 apart) and p [Tk, Tq, H, B] contiguous. In
 * cuBLAS' column-major terms, per head a strided batch over the sequences:
 *   C (D x Tq, ldc D H) = A^T (A: Tk x D, lda nb1/4) x B (Tk x Tq, ldb Tk),
 * C starting at head h's D columns of each row: the interleaving is ldc, no copy. One call a
 * head (both attention ops): the heads' strides differ from the sequences' (H calls, 8 in
 * S3Gen, rather than B, two per stream there).
 */
cublasStatus_t launch_attn_values(const ggml_tensor *dst, cublasHandle_t handle) {
    const ggml_tensor *v = dst->src[0], *p = dst->src[1];
    const int Tk = (int)p->ne[0], Tq = (int)p->ne[1], H = (int)p->ne[2], B = (int)p->ne[3];
    const int D = (int)v->ne[1];
    const float one = 1.0f, zero = 0.0f;
    const int lda = (int)(v->nb[1] / sizeof(float));
    const long long sa = (long long)(v->nb[3] / sizeof(float)), sb = (long long)H * Tk * Tq,
                    sc = (long long)D * H * Tq;
    for (int h = 0; h < H; h++) {
        const float *a = (const float *)((const char *)v->data + (size_t)h * v->nb[2]);
        const float *b = (const float *)p->data + (size_t)h * Tk * Tq;
        float *c = (float *)dst->data + (size_t)h * D;
        const cublasStatus_t st = cublasSgemmStridedBatched(handle, CUBLAS_OP_T, CUBLAS_OP_N, D, Tq, Tk, &one, a,
                                                            lda, sa, b, Tk, sb, &zero, c, D * H, sc, B);
        if (st != CUBLAS_STATUS_SUCCESS) {
            return st;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---------------------------------------------------------- the rows' norm */

constexpr int NORM_WARPS = 4;   /* rows a block: a warp each */
constexpr int NORM_MAX_C = 512; /* channels a row: 16 registers a lane */

/* torch's Mish, x tanh(softplus(x)), softplus x above 20 (the C function's formula) */
__device__ __forceinline__ float mish(float x) {
    return x * tanhf(x > 20.0f ? x : log1pf(expf(x)));
}

/* y = norm(x) w (+ b) (then Mish) along each row of C <= 32 PER; a warp per row, lane i
   holding channels i, i + 32, ... in PER registers: read once, written once, two passes over
   the registers (the mean, then the squared deviations from it). PER fits the row (8 for
   S3Gen's estimator, 256 channels; 16 for its encoder, 512): registers for more channels than
   a row has would cut the warps an SM keeps in flight. Longer rows are not taken
   (dev_supports_op: NORM_MAX_C; no graph has them on a GPU). */
template <int PER>
__global__ void norm_rows_kernel(const float *__restrict__ x, const float *__restrict__ w,
                                 const float *__restrict__ b, float *__restrict__ y, int64_t C, int64_t rows,
                                 float eps, bool rms, bool do_mish) {
    const int lane = (int)threadIdx.x;
    const int64_t r = (int64_t)blockIdx.x * NORM_WARPS + threadIdx.y;
    if (r >= rows) {
        return; /* the whole warp: its shuffles below are all or none */
    }
    const float *xr = x + r * C;
    float *yr = y + r * C;
    float v[PER];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int64_t c = lane + 32 * j;
        v[j] = c < C ? xr[c] : 0.0f;
        sum += v[j];
    }
    const float mean = rms ? 0.0f : warp_sum(sum) / (float)C;
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const float d = lane + 32 * j < C ? v[j] - mean : 0.0f;
        sq += d * d;
    }
    const float inv = 1.0f / sqrtf(warp_sum(sq) / (float)C + eps);
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int64_t c = lane + 32 * j;
        if (c < C) {
            const float o = (v[j] - mean) * inv * w[c] + (b ? b[c] : 0.0f);
            yr[c] = do_mish ? mish(o) : o;
        }
    }
}

cudaError_t launch_norm_rows(const ggml_tensor *dst, cudaStream_t stream) {
    const ggml_tensor *x = dst->src[0], *w = dst->src[1], *b = dst->src[2];
    const cr_norm_params p = cr_norm_unpack(custom_params(dst).userdata);
    const int64_t C = x->ne[0], rows = ggml_nrows(x);
    const dim3 grid((unsigned)((rows + NORM_WARPS - 1) / NORM_WARPS)), block(32, NORM_WARPS);
    auto kernel = C <= 32 * 8 ? norm_rows_kernel<8> : norm_rows_kernel<NORM_MAX_C / 32>;
    kernel<<<grid, block, 0, stream>>>((const float *)x->data, (const float *)w->data,
                                       b ? (const float *)b->data : nullptr, (float *)dst->data, C, rows, p.eps,
                                       p.rms != 0, p.mish != 0);
    return cudaGetLastError();
}

/* ------------------------------------------------- a bias, an activation, a residual */

constexpr int BA_LANES = 64; /* threads along a row */
constexpr int BA_ROWS = 4;   /* rows a block */

template <bool GELU>
__device__ __forceinline__ float bias_act(float y, float b) {
    float v = y + b;
    if constexpr (GELU) {
        v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
    return v;
}

/* out[c, i] = act(y[c, i] + b[c]) (+ r[c, i]) over rows of C; VEC: four channels a thread
   (C a multiple of 4, every pointer 16-byte aligned). */
template <bool GELU, bool VEC>
__global__ void bias_act_kernel(const float *__restrict__ y, const float *__restrict__ b,
                                const float *__restrict__ r, float *__restrict__ out, int64_t C, int64_t rows) {
    const int64_t i = (int64_t)blockIdx.x * BA_ROWS + threadIdx.y;
    if (i >= rows) {
        return;
    }
    if constexpr (VEC) {
        const int64_t C4 = C / 4;
        const float4 *y4 = (const float4 *)(y + i * C), *b4 = (const float4 *)b;
        const float4 *r4 = r ? (const float4 *)(r + i * C) : nullptr;
        float4 *o4 = (float4 *)(out + i * C);
        for (int64_t c = threadIdx.x; c < C4; c += BA_LANES) {
            const float4 a = y4[c], bb = b4[c];
            float4 o = make_float4(bias_act<GELU>(a.x, bb.x), bias_act<GELU>(a.y, bb.y), bias_act<GELU>(a.z, bb.z),
                                   bias_act<GELU>(a.w, bb.w));
            if (r4) {
                const float4 q = r4[c];
                o = make_float4(q.x + o.x, q.y + o.y, q.z + o.z, q.w + o.w);
            }
            o4[c] = o;
        }
    } else {
        const float *yr = y + i * C, *rr = r ? r + i * C : nullptr;
        float *o = out + i * C;
        for (int64_t c = threadIdx.x; c < C; c += BA_LANES) {
            const float v = bias_act<GELU>(yr[c], b[c]);
            o[c] = rr ? rr[c] + v : v;
        }
    }
}

bool aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

cudaError_t launch_bias_act(const ggml_tensor *dst, cudaStream_t stream) {
    const ggml_tensor *y = dst->src[0], *b = dst->src[1], *r = dst->src[2];
    const bool gelu = cr_bias_act_unpack(custom_params(dst).userdata) == CR_ACT_GELU_ERF;
    const int64_t C = y->ne[0], rows = ggml_nrows(y);
    const bool vec = C % 4 == 0 && aligned16(y->data) && aligned16(b->data) && aligned16(dst->data) &&
                     (!r || aligned16(r->data));
    const dim3 grid((unsigned)((rows + BA_ROWS - 1) / BA_ROWS)), block(BA_LANES, BA_ROWS);
    auto kernel = gelu ? (vec ? bias_act_kernel<true, true> : bias_act_kernel<true, false>)
                       : (vec ? bias_act_kernel<false, true> : bias_act_kernel<false, false>);
    kernel<<<grid, block, 0, stream>>>((const float *)y->data, (const float *)b->data,
                                       r ? (const float *)r->data : nullptr, (float *)dst->data, C, rows);
    return cudaGetLastError();
}

/* ----------------------------------------------------------------- backend */

struct ops_context {
    ggml_backend_t device;    /* ggml's CUDA backend: its stream is the one ordered against */
    ggml_backend_dev_t cuda;  /* its device */
    int cuda_index;
    cudaStream_t stream;
    ggml_backend_event_t before, after; /* CUDA events of ggml's device (cudaEvent_t in context) */
    size_t smem_max;          /* shared memory a block may opt in to */
    bool precise_sin;         /* CODECRT_PRECISE_SIN=1: the unit core's Snakes take sinf */
    cublasHandle_t blas;      /* on `stream`, ggml's math mode: the products */
    char name[32];
    ggml_backend_device dev;  /* this backend's device: ggml's CUDA device for buffers and memory,
                                 its own ops */
};

ops_context *ctx_of(ggml_backend_dev_t dev) {
    return (ops_context *)dev->context;
}

ops_context *ctx_of(ggml_backend_t backend) {
    return (ops_context *)backend->context;
}

const char *dev_get_name(ggml_backend_dev_t dev) {
    return ctx_of(dev)->name;
}

void dev_get_memory(ggml_backend_dev_t dev, size_t *free, size_t *total) {
    ggml_backend_dev_memory(ctx_of(dev)->cuda, free, total);
}

enum ggml_backend_dev_type dev_get_type(ggml_backend_dev_t dev) {
    (void)dev;
    return GGML_BACKEND_DEVICE_TYPE_GPU;
}

void dev_get_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props) {
    ggml_backend_dev_get_props(ctx_of(dev)->cuda, props);
    props->name = ctx_of(dev)->name;
    props->description = ctx_of(dev)->name;
    props->caps.async = true;
    props->caps.host_buffer = false;
    props->caps.buffer_from_host_ptr = false;
    props->caps.events = false;
}

ggml_backend_buffer_type_t dev_get_buffer_type(ggml_backend_dev_t dev) {
    return ggml_backend_dev_buffer_type(ctx_of(dev)->cuda);
}

/* An operand cuBLAS reads where it lies (cr_attn_operand), whose extents and leading
   dimension (nb1, at least a row of ne0) fit cuBLAS' ints. */
bool blas_operand(const ggml_tensor *t) {
    bool ok = t && cr_attn_operand(t) && t->nb[1] / sizeof(float) >= (size_t)t->ne[0] &&
              t->nb[1] / sizeof(float) <= INT32_MAX;
    for (int i = 0; ok && i < 4; i++) {
        ok = t->ne[i] <= INT32_MAX;
    }
    return ok;
}

/* Only codecrt's ops, F32 and laid out as their builders make them (contiguous, or for the
   attention's products strided views whose strides and offsets are whole floats), and only
   extents their kernels and cuBLAS' int arguments hold. */
/* A tail op's optional mask (contiguous) and prefix (time contiguous), each F32 where present. */
bool tail_extras_ok(const ggml_tensor *mask, const ggml_tensor *prefix) {
    return (!mask || (mask->type == GGML_TYPE_F32 && ggml_is_contiguous(mask))) &&
           (!prefix || (prefix->type == GGML_TYPE_F32 && prefix->nb[0] == sizeof(float)));
}

bool dev_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor *op) {
    if (is_unit_tail(op)) {
        const ggml_tensor *y = op->src[0], *b = op->src[1], *x = op->src[2], *m = op->src[3], *p = op->src[4];
        return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && y && b && x && y->type == GGML_TYPE_F32 &&
               b->type == GGML_TYPE_F32 && x->type == GGML_TYPE_F32 && ggml_is_contiguous(y) &&
               ggml_is_contiguous(b) && x->nb[0] == sizeof(float) && tail_extras_ok(m, p);
    }
    if (is_upconv_tail(op)) {
        const ggml_tensor *z = op->src[0], *b = op->src[1], *m = op->src[2], *p = op->src[3];
        return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && z && b && z->type == GGML_TYPE_F32 &&
               b->type == GGML_TYPE_F32 && ggml_is_contiguous(z) && ggml_is_contiguous(b) && tail_extras_ok(m, p) &&
               op->ne[1] <= INT32_MAX &&
               (op->ne[2] + TILE_C - 1) / TILE_C <= MAX_GRID_Y && (op->ne[0] + TILE_T - 1) / TILE_T <= INT32_MAX;
    }
    if (is_cols(op)) {
        const ggml_tensor *x = op->src[0];
        const cr_cols_params p = cr_cols_unpack(custom_params(op).userdata);
        bool ok = op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && x && x->type == GGML_TYPE_F32 &&
                  ggml_is_contiguous(x) && op->ne[0] == x->ne[0] * p.k && op->ne[2] == x->ne[2] &&
                  x->ne[3] == 1 && op->ne[3] == 1 && op->ne[0] <= INT32_MAX &&
                  x->ne[1] + p.pl + p.pr <= INT32_MAX &&
                  op->ne[1] * op->ne[2] <= INT32_MAX && op->ne[0] * COLS_PER_BLOCK_ELEMENTS <= INT32_MAX;
        for (int i = 1; ok && p.snake && i < 3; i++) {
            const ggml_tensor *a = op->src[i];
            ok = a && a->type == GGML_TYPE_F32 && ggml_is_contiguous(a) && ggml_nelements(a) == x->ne[0];
        }
        return ok;
    }
    if (is_matmul(op)) {
        const ggml_tensor *a = op->src[0], *b = op->src[1];
        return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && a && b && a->type == GGML_TYPE_F32 &&
               b->type == GGML_TYPE_F32 && ggml_is_contiguous(a) && ggml_is_contiguous(b) && a->ne[2] == 1 &&
               a->ne[3] == 1 && a->ne[0] == b->ne[0] && op->ne[0] == a->ne[1] && op->ne[1] == b->ne[1] &&
               op->ne[2] == b->ne[2] && op->ne[3] == b->ne[3] && a->ne[0] <= INT32_MAX && a->ne[1] <= INT32_MAX &&
               ggml_nrows(b) <= INT32_MAX;
    }
    if (is_attn_scores(op)) {
        const ggml_tensor *k = op->src[0], *q = op->src[1];
        return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && blas_operand(k) && blas_operand(q) &&
               k->ne[0] == q->ne[0] && k->ne[2] == q->ne[2] && k->ne[3] == q->ne[3] && op->ne[0] == k->ne[1] &&
               op->ne[1] == q->ne[1] && op->ne[2] == q->ne[2] && op->ne[3] == q->ne[3];
    }
    if (is_attn_values(op)) {
        const ggml_tensor *v = op->src[0], *p = op->src[1];
        bool ok = op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && blas_operand(v) && p &&
                  p->type == GGML_TYPE_F32 && ggml_is_contiguous(p) && v->ne[0] == p->ne[0] &&
                  v->ne[2] == p->ne[2] && v->ne[3] == p->ne[3] && op->ne[0] == v->ne[1] && op->ne[1] == p->ne[2] &&
                  op->ne[2] == p->ne[1] && op->ne[3] == p->ne[3] && op->ne[0] * op->ne[1] <= INT32_MAX;
        for (int i = 0; ok && i < 4; i++) {
            ok = p->ne[i] <= INT32_MAX;
        }
        return ok;
    }
    if (is_norm_rows(op)) {
        const ggml_tensor *x = op->src[0], *w = op->src[1], *b = op->src[2];
        return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && x && w && x->type == GGML_TYPE_F32 &&
               ggml_is_contiguous(x) && ggml_are_same_shape(x, op) && w->type == GGML_TYPE_F32 &&
               ggml_is_contiguous(w) && ggml_nelements(w) == x->ne[0] && x->ne[0] <= NORM_MAX_C &&
               (!b || (b->type == GGML_TYPE_F32 && ggml_is_contiguous(b) && ggml_nelements(b) == x->ne[0])) &&
               (ggml_nrows(x) + NORM_WARPS - 1) / NORM_WARPS <= INT32_MAX;
    }
    if (is_bias_act(op)) {
        const ggml_tensor *y = op->src[0], *b = op->src[1], *r = op->src[2];
        return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && y && b && y->type == GGML_TYPE_F32 &&
               ggml_is_contiguous(y) && ggml_are_same_shape(y, op) && b->type == GGML_TYPE_F32 &&
               ggml_is_contiguous(b) && ggml_nelements(b) == y->ne[0] &&
               (!r || (r->type == GGML_TYPE_F32 && ggml_is_contiguous(r) && ggml_are_same_shape(r, y))) &&
               (ggml_nrows(y) + BA_ROWS - 1) / BA_ROWS <= INT32_MAX;
    }
    if (is_softmax_rows(op)) {
        const ggml_tensor *a = op->src[0];
        return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && a && a->type == GGML_TYPE_F32 &&
               ggml_is_contiguous(a) && ggml_are_same_shape(a, op) &&
               (ggml_nrows(a) + SM_WARPS - 1) / SM_WARPS <= INT32_MAX;
    }
    if (!is_unit_core(op)) {
        return false;
    }
    for (int i = 0; i < 7; i++) {
        const ggml_tensor *s = op->src[i];
        if (!s || s->type != GGML_TYPE_F32 || !ggml_is_contiguous(s)) {
            return false;
        }
    }
    const int K = (int)op->src[1]->ne[1];
    return op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && K >= 1 && K <= CR_UNIT_CORE_MAX_TAPS &&
           op->src[0]->ne[1] <= INT32_MAX && (op->src[0]->ne[2] + TILE_C - 1) / TILE_C <= MAX_GRID_Y &&
           tile_bytes(unit_core_span(op)) <= ctx_of(dev)->smem_max;
}

bool dev_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    return ggml_backend_dev_supports_buft(ctx_of(dev)->cuda, buft);
}

const char *backend_get_name(ggml_backend_t backend) {
    return ctx_of(backend)->name;
}

void backend_free(ggml_backend_t backend) {
    ops_context *c = ctx_of(backend);
    cudaSetDevice(c->cuda_index);
    cudaStreamSynchronize(c->stream);
    cublasDestroy(c->blas);
    cudaStreamDestroy(c->stream);
    ggml_backend_event_free(c->before);
    ggml_backend_event_free(c->after);
    delete c;
    delete backend;
}

/* Both streams: ggml's scheduler synchronizes a split's backend alone before it overwrites a
   tensor copy of that split, and the compute buffer it writes is shared with ggml's stream,
   which may still be reading there what an earlier split left. */
void backend_synchronize(ggml_backend_t backend) {
    ops_context *c = ctx_of(backend);
    cudaSetDevice(c->cuda_index);
    cudaStreamSynchronize(c->stream);
    ggml_backend_synchronize(c->device);
}

bool is_view(const ggml_tensor *t) {
    switch (t->op) {
    case GGML_OP_NONE:
    case GGML_OP_RESHAPE:
    case GGML_OP_VIEW:
    case GGML_OP_PERMUTE:
    case GGML_OP_TRANSPOSE:
        return true;
    default:
        return false;
    }
}

/* A split of this backend's nodes: after what ggml's stream has queued, on our stream, and
   ggml's stream then waits for them; nothing waits on the host. */
enum ggml_status backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph *cgraph) {
    ops_context *c = ctx_of(backend);
    if (cudaSetDevice(c->cuda_index) != cudaSuccess) {
        return GGML_STATUS_FAILED;
    }
    ggml_backend_event_record(c->before, c->device);
    if (cudaStreamWaitEvent(c->stream, (cudaEvent_t)c->before->context, 0) != cudaSuccess) {
        return GGML_STATUS_FAILED;
    }
    const int n = ggml_graph_n_nodes(cgraph);
    for (int i = 0; i < n; i++) {
        const ggml_tensor *node = ggml_graph_node(cgraph, i);
        if (is_view(node) || ggml_is_empty(node) || (node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            continue;
        }
        cudaError_t e;
        if (is_unit_core(node)) {
            e = launch_unit_core(node, c->stream, c->precise_sin);
        } else if (is_unit_tail(node)) {
            e = launch_unit_tail(node, c->stream);
        } else if (is_upconv_tail(node)) {
            e = launch_upconv_tail(node, c->stream);
        } else if (is_softmax_rows(node)) {
            e = launch_softmax_rows(node, c->stream);
        } else if (is_cols(node)) {
            e = launch_cols(node, c->stream, c->precise_sin);
        } else if (is_norm_rows(node)) {
            e = launch_norm_rows(node, c->stream);
        } else if (is_bias_act(node)) {
            e = launch_bias_act(node, c->stream);
        } else if (is_blas(node)) {
            const cublasStatus_t st = is_matmul(node)        ? launch_matmul(node, c->blas)
                                      : is_attn_scores(node) ? launch_attn_scores(node, c->blas)
                                                             : launch_attn_values(node, c->blas);
            if (st != CUBLAS_STATUS_SUCCESS) {
                std::fprintf(stderr, "codecrt: %s: a product failed: %s\n", c->name, cublasGetStatusString(st));
                return GGML_STATUS_FAILED;
            }
            e = cudaGetLastError();
        } else {
            std::fprintf(stderr, "codecrt: %s was given a %s node, which it cannot compute\n", c->name,
                         ggml_op_desc(node));
            return GGML_STATUS_FAILED;
        }
        if (e != cudaSuccess) {
            std::fprintf(stderr, "codecrt: %s: a kernel failed to launch: %s\n", c->name, cudaGetErrorString(e));
            return GGML_STATUS_FAILED;
        }
    }
    if (cudaEventRecord((cudaEvent_t)c->after->context, c->stream) != cudaSuccess) {
        return GGML_STATUS_FAILED;
    }
    ggml_backend_event_wait(c->device, c->after);
    return GGML_STATUS_SUCCESS;
}

/* generated once by uuidgen: "codecrt cuda ops" */
ggml_guid guid = {0x5e, 0x2c, 0x61, 0x0f, 0x8b, 0x47, 0x4d, 0x2a, 0x9c, 0x13, 0xd4, 0x6e, 0x70, 0xa1, 0x3b, 0x58};

} // namespace

extern "C" ggml_backend_t cr_cuda_ops_new(ggml_backend_t device, bool precise_sin) {
    if (!device || !ggml_backend_is_cuda(device)) {
        return nullptr;
    }
    ggml_backend_dev_t cuda = ggml_backend_get_device(device);
    int index = -1;
    if (!cuda || std::sscanf(ggml_backend_dev_name(cuda), "CUDA%d", &index) != 1 || index < 0) {
        return nullptr;
    }
    ops_context *c = new (std::nothrow) ops_context();
    ggml_backend_t backend = new (std::nothrow) ggml_backend();
    if (!c || !backend) {
        delete c;
        delete backend;
        return nullptr;
    }
    c->device = device;
    c->cuda = cuda;
    c->precise_sin = precise_sin;
    c->cuda_index = index;
    std::snprintf(c->name, sizeof(c->name), "%s+codecrt", ggml_backend_dev_name(cuda));
    c->before = ggml_backend_event_new(cuda);
    c->after = ggml_backend_event_new(cuda);
    int optin = 0;
    bool ok = c->before && c->after && cudaSetDevice(index) == cudaSuccess &&
              cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, index) == cudaSuccess &&
              cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) == cudaSuccess;
    if (ok) {
        /* the widest tile the op allows, where the device has it (all of them since Volta) */
        c->smem_max = tile_bytes(CR_UNIT_CORE_MAX_SPAN) <= (size_t)optin ? tile_bytes(CR_UNIT_CORE_MAX_SPAN)
                                                                          : 48 * 1024;
        const int smem = (int)c->smem_max;
        ok = cudaFuncSetAttribute(unit_core_kernel<7, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
                 cudaSuccess &&
             cudaFuncSetAttribute(unit_core_kernel<0, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
                 cudaSuccess &&
             cudaFuncSetAttribute(unit_core_kernel<7, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
                 cudaSuccess &&
             cudaFuncSetAttribute(unit_core_kernel<0, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
                 cudaSuccess;
        /* cuBLAS on our stream, with ggml's math mode (ggml-cuda/common.cuh: TF32 allowed).
           Without a handle there is no ops backend at all: graphs built for it would put
           its products on the CPU, where the composed graphs run all on ggml's CUDA. */
        ok = ok && cublasCreate(&c->blas) == CUBLAS_STATUS_SUCCESS;
        if (ok && (cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
                   cublasSetMathMode(c->blas, CUBLAS_TF32_TENSOR_OP_MATH) != CUBLAS_STATUS_SUCCESS)) {
            cublasDestroy(c->blas);
            ok = false;
        }
        if (!ok) {
            cudaStreamDestroy(c->stream);
        }
    }
    if (!ok) {
        (void)cudaGetLastError(); /* clear it: ggml's next check must not see ours */
        if (c->before) {
            ggml_backend_event_free(c->before);
        }
        if (c->after) {
            ggml_backend_event_free(c->after);
        }
        delete c;
        delete backend;
        return nullptr;
    }
    c->dev.iface = ggml_backend_device_i{};
    c->dev.iface.get_name = dev_get_name;
    c->dev.iface.get_description = dev_get_name;
    c->dev.iface.get_memory = dev_get_memory;
    c->dev.iface.get_type = dev_get_type;
    c->dev.iface.get_props = dev_get_props;
    c->dev.iface.get_buffer_type = dev_get_buffer_type;
    c->dev.iface.supports_op = dev_supports_op;
    c->dev.iface.supports_buft = dev_supports_buft;
    c->dev.reg = cuda->reg;
    c->dev.context = c;

    backend->guid = &guid;
    backend->iface = ggml_backend_i{};
    backend->iface.get_name = backend_get_name;
    backend->iface.free = backend_free;
    backend->iface.synchronize = backend_synchronize;
    backend->iface.graph_compute = backend_graph_compute;
    backend->device = &c->dev;
    backend->context = c;
    return backend;
}
