// Backward of the fused LayerNorm / RMSNorm (+ residual, affine, bias,
// activation): dx per row, dgamma / dbeta / dbias by deterministic partial
// sums (no float atomics).
//
//   g = dout * act'(y), y = n * gamma + beta + bias recomputed from x, mean, rstd
//   dn = g * gamma; dx = rstd * (dn - avg(dn) [LayerNorm] - n * avg(dn * n)) + dres
//   dgamma = sum_rows g * n, dbeta = dbias = sum_rows g
//
// Kernel versions:
//   norm_bwd_dx_v1       any shape/alignment: a block per row, scalar loads,
//                        two passes over the row through L1/L2 (sums, then dx).
//   norm_bwd_dx_v2       row in registers (n and dn, <= 32 floats each per
//                        thread), 16-byte vector loads; a warp per row for
//                        short rows, else a block per row (<= 512 threads).
//   norm_bwd_dx_staged   rows past dx v2's registers (aligned, > 16384
//                        cols): x and dout staged in shared memory (as
//                        loaded) by the first pass and read back by the
//                        second, 16-byte vectors; x and dout read from device
//                        memory once (v1: twice, 2-byte loads). Rows up to the
//                        device's opt-in (H100: ~58K 16-bit, ~29K f32 cols).
//   norm_bwd_dparams     per (column tile, chunk of rows) block: sums of
//                        g * n and g, written to partial[chunk][col]; re-reads
//                        dout and x (a second pass over them). <T, 1> is v1
//                        (scalar, any alignment), <T, V> is v2 (16-byte loads,
//                        V columns per lane).
//   norm_bwd_v3          dx v2 (row in registers, 16-byte loads) that also
//                        sums g * n and g per column: a persistent grid (CTA c
//                        takes row groups c, c + grid, ...), a thread's columns
//                        fixed so its sums stay in registers; one partial row
//                        per CTA, then norm_bwd_reduce_v2. Reads dout and x
//                        once (3 tensors of traffic instead of 5). Rows that
//                        need 32 floats per thread in a block per row keep the
//                        sums in shared memory (<T, NV, true>, <= 384 threads:
//                        cols <= 12288). Partition: norm_bwd_v3_plan.h
//                        (unit-tested on the host).
//   norm_bwd_v3_staged   v3 for 12288 < cols <= 16384 (385-512 threads of
//                        32 elements): the row (x, g) staged in the thread's
//                        own shared-memory cells between its two passes, the
//                        sums in registers; still one read of dout and x.
//   norm_bwd_v3<.., kRing> (v4)  v3 (register-sum modes) with a prefetch ring:
//                        each thread copies its own part of the next rows
//                        (x, dout, dres, mean, rstd) into shared memory with
//                        cp.async, FP_NORM_V4_RING_STAGES deep, so two rows'
//                        loads stay in flight through a row's reductions and
//                        stores (v3 issues a row's loads only when it starts
//                        it: an SM idles on DRAM during each row's barriers).
//   norm_bwd_reduce_v1   sums the partials over chunks in a fixed order, a
//                        thread per column (FP_NORM_BWD_REDUCE=1 only).
//   norm_bwd_reduce_v2   the same with 8 chunk lanes per column (each walks
//                        every 8th chunk, then lane 0 adds the 8 in order).
//   fused reduce         (FP_NORM_VOPT_FUSED_REDUCE, FP_NORM_BWD_FUSED_REDUCE=1;
//                        session 33, opt-in until a GPU measures it) v3 / v4
//                        without the reduce kernel: the last CTAs to finish
//                        sum the partial rows in reduce v2's order
//                        (fused_reduce, below).
//   unfused              baseline: activation backward (g to dx); the same
//                        norm backward on g, in place; dx += dres.
// The vector kernels take the activation's switch once per 16-byte vector
// (grad_vec; the staged-row v3 per element: grad_elem), and GELU (tanh) /
// SiLU in their fast forms (norm_common.cuh, sigmoid_fast; session 28).
// Versions (fp_norm_bwd_launch(desc, version, ...)): 1 = dx v1 + dparams v1;
// 2 = dx v2 (dx staged for rows v2 cannot hold) + dparams v2 where aligned,
// else 1; 3 = v3 (any of its modes)
// where its plan applies (aligned, cols <= 16384), else 2; 4 = v4 where it
// applies (v3's register-sum modes, with or without dgamma/dbeta/dbias),
// else as 3; 0 = 4 when dgamma/dbeta/dbias and a dresidual are given and it
// applies, else 3 when dgamma/dbeta/dbias are requested, else 2
// (FP_NORM_BWD_RING=1: 4 wherever it applies; =0: never; for A/B runs).
// Run: tests/norm/test_norm_gpu, tests/norm/test_norm_bwd_v3_plan,
// fastbench --scenario norm/layernorm_bwd, norm/bwd_versions (v2 vs v3;
// --baseline 3 --optimized 4 for v3 vs v4).
#include "common/cp_async.cuh"
#include "common/grid_count.cuh"
#include "norm/norm_bwd_v3_plan.h"
#include "common/span_stamp.cuh"
#include "norm/norm_common.cuh"

namespace fpnorm {

// v4's prefetch ring stages through shared memory with cp.async.
using fp_cp::cp_async;
using fp_cp::cp_async_commit;
using fp_cp::cp_async_wait;
using fp_cp::lds16;
using fp_cp::smem_u32;

constexpr int kBwdV1Threads = 256;
constexpr int kBwdV2MaxThreads = 512;
constexpr int kBwdWarpRows = 4;
constexpr int kParamTileCols = 32;
constexpr int kParamRowThreads = 8;

// One element of a row: n = (x - mean) rstd, g = dy act'(n gamma + shift)
// (dy without an activation) and dn = g gamma.
__device__ __forceinline__ void grad_elem(const fp_norm_bwd_desc &d, float mean, float rstd, float xv, float dy,
                                          float gam, float sh, float &xn, float &g, float &dn) {
    xn = (xv - mean) * rstd;
    g = dy;
    if (d.act != ACT_NONE) g *= dact_f(d.act, xn * gam + sh);
    dn = g * gam;
}

// The same for the N elements of a vector, the activation's switch taken
// once for the vector (dact_mul_vec): the vector kernels' form.
template <int N>
__device__ __forceinline__ void grad_vec(const fp_norm_bwd_desc &d, float mean, float rstd, const float (&xv)[N],
                                         const float (&dy)[N], const float (&gam)[N], const float (&sh)[N],
                                         float (&xn)[N], float (&g)[N], float (&dn)[N]) {
    float h[N];
#pragma unroll
    for (int e = 0; e < N; ++e) {
        xn[e] = (xv[e] - mean) * rstd;
        g[e] = dy[e];
        h[e] = xn[e] * gam[e] + sh[e];
    }
    if (d.act != ACT_NONE) dact_mul_vec<N>(d.act, h, g);
#pragma unroll
    for (int e = 0; e < N; ++e) dn[e] = g[e] * gam[e];
}

// Per-row backward state: mean, rstd and the per-column vectors.
template <typename T>
struct RowGrad {
    const fp_norm_bwd_desc &d;
    float mean, rstd;
    // n, dn of one element from x, dy and column j's vectors.
    __device__ __forceinline__ void at(float xv, float dy, float gam, float sh, float &xn, float &dn) const {
        float g;
        grad_elem(d, mean, rstd, xv, dy, gam, sh, xn, g, dn);
    }
    // n, dn of a vector's N elements.
    template <int N>
    __device__ __forceinline__ void vec(const float (&xv)[N], const float (&dy)[N], const float (&gam)[N],
                                        const float (&sh)[N], float (&xn)[N], float (&dn)[N]) const {
        float g[N];
        grad_vec<N>(d, mean, rstd, xv, dy, gam, sh, xn, g, dn);
    }
};

// The row means of dn (LayerNorm only: 0 for RMSNorm) and of dn n, from this
// thread's partial sums sa, sb (block-wide: every thread of the row calls it).
__device__ __forceinline__ void row_means(const fp_norm_bwd_desc &d, float sa, float sb, float inv_n,
                                          float *red_smem, float &a, float &b) {
    if (d.kind == KIND_LAYERNORM && !d.sep_sums) {  // both sums through one reduction
        row_sum2(sa, sb, red_smem);
        a = sa * inv_n;
        b = sb * inv_n;
        return;
    }
    a = d.kind == KIND_LAYERNORM ? row_sum(sa, red_smem) * inv_n : 0.0f;
    b = row_sum(sb, red_smem) * inv_n;
}

// gamma of 16-byte vector j of the row (1 without).
template <typename T, int V>
__device__ __forceinline__ void load_gamma(const T *gamma, int64_t j, float (&gam)[V]) {
#pragma unroll
    for (int e = 0; e < V; ++e) gam[e] = 1.0f;
    if (gamma) unpack<T>(ldg16(gamma + j * V), gam);
}

// dx of 16-byte vector j of the row: v plus dresidual (when given), stored.
template <typename T, int V>
__device__ __forceinline__ void store_dx(T *dx, const T *dres, int64_t j, float (&v)[V]) {
    if (dres) {
        float r[V];
        unpack<T>(ldg16(dres + j * V), r);
#pragma unroll
        for (int e = 0; e < V; ++e) v[e] += r[e];
    }
    stg16(dx + j * V, pack<T>(v));
}

// v3: the raw 16-byte x and dout of this thread's vectors k0 .. k0 + B - 1,
// all B loads issued before any arithmetic (vectors past the row: left as
// they are).
template <typename T, int V, int B>
__device__ __forceinline__ void load_xdy_v3(const T *x, const T *dy, int k0, int tpr, int64_t nvec, uint4 (&xr)[B],
                                            uint4 (&dr)[B]) {
#pragma unroll
    for (int i = 0; i < B; ++i) {
        const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k0 + i, tpr);
        if (j < nvec) {
            xr[i] = ldg16(x + j * V);
            dr[i] = ldg16(dy + j * V);
        }
    }
}

// gamma (1 without) and the pre-activation shift beta + bias (0 without; it
// matters only through act', so it is not loaded without an activation) of
// 16-byte vector j of the row.
template <typename T, int V>
__device__ __forceinline__ void load_gamma_shift(const T *gamma, const T *beta, const T *bias, int act, int64_t j,
                                                 float (&gam)[V], float (&sh)[V]) {
    float p[V];
#pragma unroll
    for (int e = 0; e < V; ++e) sh[e] = 0.0f;
    load_gamma<T, V>(gamma, j, gam);
    if (act != ACT_NONE) {
        if (beta) {
            unpack<T>(ldg16(beta + j * V), p);
#pragma unroll
            for (int e = 0; e < V; ++e) sh[e] = p[e];
        }
        if (bias) {
            unpack<T>(ldg16(bias + j * V), p);
#pragma unroll
            for (int e = 0; e < V; ++e) sh[e] += p[e];
        }
    }
}

// ---------------------------------------------------------------------------
// dx v1: scalar, any shape
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void norm_bwd_dx_v1_row(const fp_norm_bwd_desc &d, int64_t row, float *red_smem) {
    const int64_t n = d.cols;
    const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
    const T *dy = static_cast<const T *>(d.dout) + row * d.dout_stride;
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);
    const RowGrad<T> rg{d, d.mean ? d.mean[row] : 0.0f, d.rstd[row]};
    auto elem = [&](int64_t j, float &xn, float &dn) {
        float gam = gamma ? to_f(gamma[j]) : 1.0f;
        float sh = (beta ? to_f(beta[j]) : 0.0f) + (bias ? to_f(bias[j]) : 0.0f);
        rg.at(to_f(x[j]), to_f(dy[j]), gam, sh, xn, dn);
    };
    float sa = 0.0f, sb = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float xn, dn;
        elem(j, xn, dn);
        sa += dn;
        sb += dn * xn;
    }
    const float inv_n = 1.0f / (float)n;
    float a, b;
    row_means(d, sa, sb, inv_n, red_smem, a, b);
    T *dx = static_cast<T *>(d.dx) + row * d.dx_stride;
    const T *dres = d.dres ? static_cast<const T *>(d.dres) + row * d.dres_stride : nullptr;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float xn, dn;
        elem(j, xn, dn);
        float v = rg.rstd * (dn - a - xn * b);
        if (dres) v += to_f(dres[j]);
        dx[j] = from_f<T>(v);
    }
}

// A block per row; rows beyond the grid (rows > 2^31 - 1) in a block-stride
// loop, uniform across the block (row_sum's barriers stay convergent).
template <typename T>
__global__ void __launch_bounds__(kBwdV1Threads) norm_bwd_dx_v1(const fp_norm_bwd_desc d) {
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    __shared__ float red_smem[32];
    for (int64_t row = blockIdx.x; row < d.rows; row += gridDim.x) norm_bwd_dx_v1_row<T>(d, row, red_smem);
    fp_stamp::end(d.stamp);
}

// ---------------------------------------------------------------------------
// dx v2: row in registers
// ---------------------------------------------------------------------------
template <typename T, int NV>
__global__ void __launch_bounds__(kBwdV2MaxThreads) norm_bwd_dx_v2(const fp_norm_bwd_desc d) {
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    constexpr int V = Vec<T>::N;
    __shared__ float red_smem[32];
    const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= d.rows) return;  // see norm_fwd_v2: whole warps / blocks leave
    const int nvec = (int)(d.cols / V);
    const int tpr = blockDim.x;
    const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
    const T *dy = static_cast<const T *>(d.dout) + row * d.dout_stride;
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);
    const RowGrad<T> rg{d, d.mean ? d.mean[row] : 0.0f, d.rstd[row]};

    float xn_reg[NV][V], dn_reg[NV][V];
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int j = threadIdx.x + k * tpr;
        if (j < nvec) {
            float xv[V], dv[V], gam[V], sh[V];
            unpack<T>(ldg16(x + (int64_t)j * V), xv);
            unpack<T>(ldg16(dy + (int64_t)j * V), dv);
            load_gamma_shift<T, V>(gamma, beta, bias, d.act, j, gam, sh);
            rg.template vec<V>(xv, dv, gam, sh, xn_reg[k], dn_reg[k]);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                sa += dn_reg[k][e];
                sb += dn_reg[k][e] * xn_reg[k][e];
            }
        }
    }
    const float inv_n = 1.0f / (float)d.cols;
    float a, b;
    row_means(d, sa, sb, inv_n, red_smem, a, b);
    T *dx = static_cast<T *>(d.dx) + row * d.dx_stride;
    const T *dres = d.dres ? static_cast<const T *>(d.dres) + row * d.dres_stride : nullptr;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int j = threadIdx.x + k * tpr;
        if (j < nvec) {
            float v[V];
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = rg.rstd * (dn_reg[k][e] - a - xn_reg[k][e] * b);
            // Inline, not store_dx: that costs this kernel up to 4 registers
            // (ptxas sm_80 / sm_90).
            if (dres) {
                float r[V];
                unpack<T>(ldg16(dres + (int64_t)j * V), r);
#pragma unroll
                for (int e = 0; e < V; ++e) v[e] += r[e];
            }
            stg16(dx + (int64_t)j * V, pack<T>(v));
        }
    }
    fp_stamp::end(d.stamp);
}

// ---------------------------------------------------------------------------
// dx staged: the row's x and dout in shared memory
// ---------------------------------------------------------------------------
constexpr int kBwdStagedThreads = 512;

// A block per row (a block-stride loop beyond gridDim.x). Pass 1 loads x and
// dout once, stages them (16-byte cells, as loaded) and sums dn and dn * n;
// pass 2 recomputes n, g and dn from the staged cells (the same arithmetic:
// the same values) and writes dx. Each thread owns the same vectors in both
// passes: no barrier for the cells (row_sum's keep red_smem safe). dx may
// alias dout: pass 2 reads the staged copy.
template <typename T>
__global__ void __launch_bounds__(kBwdStagedThreads) norm_bwd_dx_staged(const fp_norm_bwd_desc d) {
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    constexpr int V = Vec<T>::N;
    __shared__ float red_smem[32];
    extern __shared__ uint4 bwd_stage_smem[];  // x [nvec], then dout [nvec]
    const int nvec = (int)(d.cols / V);
    uint4 *x_s = bwd_stage_smem, *dy_s = bwd_stage_smem + nvec;
    const float inv_n = 1.0f / (float)d.cols;
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);
    for (int64_t row = blockIdx.x; row < d.rows; row += gridDim.x) {
        const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
        const T *dy = static_cast<const T *>(d.dout) + row * d.dout_stride;
        const RowGrad<T> rg{d, d.mean ? d.mean[row] : 0.0f, d.rstd[row]};
        // n and dn of vector j from its raw x and dout (both passes: the same values)
        auto grads = [&](int j, const uint4 &xr, const uint4 &dr, float(&xn)[V], float(&dn)[V]) {
            float xv[V], dv[V], gam[V], sh[V];
            unpack<T>(xr, xv);
            unpack<T>(dr, dv);
            load_gamma_shift<T, V>(gamma, beta, bias, d.act, j, gam, sh);
            rg.template vec<V>(xv, dv, gam, sh, xn, dn);
        };
        float sa = 0.0f, sb = 0.0f;
#pragma unroll 2
        for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
            const uint4 xr = ldg16(x + (int64_t)j * V), dr = ldg16(dy + (int64_t)j * V);
            x_s[j] = xr;
            dy_s[j] = dr;
            float xn[V], dn[V];
            grads(j, xr, dr, xn, dn);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                sa += dn[e];
                sb += dn[e] * xn[e];
            }
        }
        float a, b;
        row_means(d, sa, sb, inv_n, red_smem, a, b);
        T *dx = static_cast<T *>(d.dx) + row * d.dx_stride;
        const T *dres = d.dres ? static_cast<const T *>(d.dres) + row * d.dres_stride : nullptr;
#pragma unroll 2
        for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
            const uint4 xr = x_s[j], dr = dy_s[j];  // 16-byte shared loads (copies: see norm_bwd_v3_staged)
            float xn[V], dn[V], v[V];
            grads(j, xr, dr, xn, dn);
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = rg.rstd * (dn[e] - a - xn[e] * b);
            store_dx<T, V>(dx, dres, j, v);
        }
    }
    fp_stamp::end(d.stamp);
}

// ---------------------------------------------------------------------------
// dgamma / dbeta: partial sums per chunk of rows, then a fixed-order reduce
// ---------------------------------------------------------------------------
// Block (32 column lanes, 8 row lanes); grid (column tiles, chunks). Each
// column lane owns W adjacent columns: W = 1 is dparams_v1 (scalar, any
// alignment), W = the vector width is dparams_v2 (16-byte loads; a warp reads
// 512 contiguous bytes of a row).
// partial: [2][nchunks][cols] (sum g*n, then sum g).
template <typename T, int W>
__global__ void __launch_bounds__(kParamTileCols * kParamRowThreads)
    norm_bwd_dparams(const fp_norm_bwd_desc d, float *partial, int64_t rows_per_chunk) {
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    constexpr int kTile = kParamTileCols * W;
    __shared__ float sg_smem[kParamRowThreads][kTile + 1];
    __shared__ float sb_smem[kParamRowThreads][kTile + 1];
    const int64_t col0 = (int64_t)blockIdx.x * kTile + threadIdx.x * W;
    const int64_t chunk = blockIdx.y, nchunks = gridDim.y;
    const int64_t r0 = chunk * rows_per_chunk;
    const int64_t r1 = r0 + rows_per_chunk < d.rows ? r0 + rows_per_chunk : d.rows;
    // For W > 1, cols is a multiple of W: a lane's columns are all valid or none.
    const bool valid = col0 < d.cols;
    auto load = [&](const void *p, int64_t off, float(&f)[W]) {
        const T *q = static_cast<const T *>(p) + off;
        if constexpr (W > 1) unpack<T>(ldg16(q), f);
        else f[0] = to_f(*q);
    };
    float acc_g[W], acc_b[W];
#pragma unroll
    for (int e = 0; e < W; ++e) acc_g[e] = acc_b[e] = 0.0f;
    if (valid) {
        float gam[W], sh[W], t[W];
#pragma unroll
        for (int e = 0; e < W; ++e) { gam[e] = 1.0f; sh[e] = 0.0f; }
        if (d.gamma) load(d.gamma, col0, gam);
        if (d.act != ACT_NONE) {
            if (d.beta) {
                load(d.beta, col0, t);
#pragma unroll
                for (int e = 0; e < W; ++e) sh[e] += t[e];
            }
            if (d.bias) {
                load(d.bias, col0, t);
#pragma unroll
                for (int e = 0; e < W; ++e) sh[e] += t[e];
            }
        }
        for (int64_t r = r0 + threadIdx.y; r < r1; r += kParamRowThreads) {
            const float mean = d.mean ? d.mean[r] : 0.0f, rstd = d.rstd[r];
            float xv[W], dv[W];
            load(d.x, r * d.x_stride + col0, xv);
            load(d.dout, r * d.dout_stride + col0, dv);
            float xn[W], g[W], dn[W];
            grad_vec<W>(d, mean, rstd, xv, dv, gam, sh, xn, g, dn);
#pragma unroll
            for (int e = 0; e < W; ++e) {
                acc_g[e] += g[e] * xn[e];
                acc_b[e] += g[e];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < W; ++e) {
        sg_smem[threadIdx.y][threadIdx.x * W + e] = acc_g[e];
        sb_smem[threadIdx.y][threadIdx.x * W + e] = acc_b[e];
    }
    __syncthreads();
    if (threadIdx.y == 0 && valid) {
#pragma unroll
        for (int e = 0; e < W; ++e) {
            float tg = 0.0f, tb = 0.0f;
#pragma unroll
            for (int i = 0; i < kParamRowThreads; ++i) {  // fixed order: deterministic
                tg += sg_smem[i][threadIdx.x * W + e];
                tb += sb_smem[i][threadIdx.x * W + e];
            }
            partial[chunk * d.cols + col0 + e] = tg;
            partial[(nchunks + chunk) * d.cols + col0 + e] = tb;
        }
    }
    fp_stamp::end(d.stamp);
}

// v2: block (32 columns, 8 chunk lanes): lane ty sums chunks ty, ty + 8,
// ... of its column in order, then lane 0 adds the 8 lane sums in order
// (a fixed order: deterministic). v1 gave each column one thread that
// walked all the chunks (264 dependent L2 round trips per thread in 16 CTAs
// at 4096 cols: latency-bound); v2 runs cols / 32 CTAs of 8 shorter walks.
constexpr int kReduceCols = 32, kReduceLanes = 8;
template <typename T>
__global__ void __launch_bounds__(kReduceCols * kReduceLanes) norm_bwd_reduce_v2(const fp_norm_bwd_desc d,
                                                                                 const float *partial,
                                                                                 int64_t nchunks) {
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    __shared__ float sg[kReduceLanes][kReduceCols], sb[kReduceLanes][kReduceCols];
    const int64_t col = (int64_t)blockIdx.x * kReduceCols + threadIdx.x;
    const bool want_g = d.dgamma != nullptr, want_b = d.dbeta || d.dbias;
    float tg = 0.0f, tb = 0.0f;
    if (col < d.cols) {
#pragma unroll 4
        for (int64_t c = threadIdx.y; c < nchunks; c += kReduceLanes) {
            if (want_g) tg += partial[c * d.cols + col];
            if (want_b) tb += partial[(nchunks + c) * d.cols + col];
        }
    }
    sg[threadIdx.y][threadIdx.x] = tg;
    sb[threadIdx.y][threadIdx.x] = tb;
    __syncthreads();
    if (threadIdx.y != 0 || col >= d.cols) return;
    tg = sg[0][threadIdx.x];
    tb = sb[0][threadIdx.x];
    for (int i = 1; i < kReduceLanes; ++i) {
        tg += sg[i][threadIdx.x];
        tb += sb[i][threadIdx.x];
    }
    if (d.dgamma) static_cast<T *>(d.dgamma)[col] = from_f<T>(tg);
    if (d.dbeta) static_cast<T *>(d.dbeta)[col] = from_f<T>(tb);
    if (d.dbias) static_cast<T *>(d.dbias)[col] = from_f<T>(tb);
    fp_stamp::end(d.stamp);
}

// FP_NORM_BWD_REDUCE (read once): "1" sums the partials with v1 (one thread
// per column), the reduce before session 15, for the GPU check's A/B;
// otherwise v2.
static bool reduce_v1_forced() {
    static const bool on = env_switch("FP_NORM_BWD_REDUCE", 1) == 1;
    return on;
}

template <typename T>
__global__ void __launch_bounds__(256) norm_bwd_reduce_v1(const fp_norm_bwd_desc d, const float *partial,
                                                          int64_t nchunks) {
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= d.cols) return;
    // Only the halves that were requested: v3 writes no dbeta half without dbeta/dbias.
    const bool want_g = d.dgamma != nullptr, want_b = d.dbeta || d.dbias;
    float tg = 0.0f, tb = 0.0f;
    for (int64_t c = 0; c < nchunks; ++c) {
        if (want_g) tg += partial[c * d.cols + col];
        if (want_b) tb += partial[(nchunks + c) * d.cols + col];
    }
    if (d.dgamma) static_cast<T *>(d.dgamma)[col] = from_f<T>(tg);
    if (d.dbeta) static_cast<T *>(d.dbeta)[col] = from_f<T>(tb);
    if (d.dbias) static_cast<T *>(d.dbias)[col] = from_f<T>(tb);
    fp_stamp::end(d.stamp);
}

// ---------------------------------------------------------------------------
// v3: dx and the dgamma/dbeta partial sums in one pass (persistent grid)
// ---------------------------------------------------------------------------
// Launch bound: the row (n, dn) and the register accumulators (g * n, g) are
// 4 x NV x V floats per thread. Register sums with NV x V = 32 run only as
// warp-per-row blocks of 128 threads (255 registers; a 384-thread bound
// spilled); shared-memory sums (NV x V = 32) as blocks of up to 384 (168
// registers; 512 spilled); register sums with NV x V <= 16 as blocks of up
// to 512 (128 registers).
constexpr int bwd_v3_bound(int nvv, bool smem_acc) {
    return smem_acc ? FP_NORM_V3_MAX_THREADS_SMEM
                    : nvv > FP_NORM_V3_MAX_NVV_BLOCK ? 32 * FP_NORM_V3_WARP_ROWS : FP_NORM_V3_MAX_THREADS;
}

// v4's prefetch ring (norm_bwd_v3 with kRing stages): per thread and stage,
// its NV vectors of x, dout and (nt = 3) dresidual as 16-byte cells, then
// the row's mean and rstd; fp_norm_v4_smem_bytes sizes it. Cell (stage s,
// vector k, tensor t) of thread tid: consecutive threads at consecutive
// 16-byte cells (a warp's copies and reads touch 512 contiguous bytes: no
// bank conflicts). Only the thread that copies a cell reads it, so the ring
// needs no barrier: cp.async.wait_group lands a thread's own copies for it.
struct BwdRing {
    uint4 *cells;
    float *stats;  // [kRing][2][nthr]: mean, rstd
    int nv, nt, nthr, tid;
    __device__ uint4 &cell(int s, int k, int t) const { return cells[((s * nv + k) * nt + t) * nthr + tid]; }
    __device__ float &stat(int s, int q) const { return stats[(s * 2 + q) * nthr + tid]; }
};

// Copies this thread's part of `row` (x, dout, dres; mean, rstd) into ring
// stage s and commits them as one group; past the last row the group is
// empty (committed all the same, so a wait's group count stays per step).
template <typename T, int NV>
__device__ __forceinline__ void ring_issue(const fp_norm_bwd_desc &d, const BwdRing &ring, int s, int64_t row,
                                           int tpr, int nvec) {
    constexpr int V = Vec<T>::N;
    if (row < d.rows) {
        const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
        const T *dy = static_cast<const T *>(d.dout) + row * d.dout_stride;
        const T *dres = ring.nt == 3 ? static_cast<const T *>(d.dres) + row * d.dres_stride : nullptr;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
            if (j < nvec) {
                cp_async(smem_u32(&ring.cell(s, k, 0)), x + j * V);
                cp_async(smem_u32(&ring.cell(s, k, 1)), dy + j * V);
                if (dres) cp_async(smem_u32(&ring.cell(s, k, 2)), dres + j * V);
            }
        }
        if (d.mean) cp_async<4>(smem_u32(&ring.stat(s, 0)), d.mean + row);
        cp_async<4>(smem_u32(&ring.stat(s, 1)), d.rstd + row);
    }
    cp_async_commit();
}

// The fused reduce (d.tail_ctas > 0: FP_NORM_VOPT_FUSED_REDUCE or
// FP_NORM_BWD_FUSED_REDUCE=1; the launcher's choice, fused_reduce_applies):
// v3 / v4 sum their own partial rows in the kernel's tail instead of
// norm_bwd_reduce_v2 after it. Every CTA, once its partial row is stored,
// counts its arrival (fp_grid::arrive on d.counters[0]: a release of the
// row, kernels/common/grid_count.cuh); the CTAs with the last tail_ctas
// tickets (tail_ctas = min(grid, SMs): at most that many CTAs are then
// unfinished or waiting, so they always fit on the device beside each
// other, whatever else runs there) wait until all gridDim.x arrived, then
// tail CTA j sums the columns of groups j, j + tail_ctas, ... of 32 columns,
// as norm_bwd_reduce_v2 does (lane l of 8 walks partial rows l, l + 8, ...
// in order, then the 8 lane sums are added in lane order): the same adds in
// the same order, so dgamma / dbeta / dbias are bit-identical to v3 / v4 +
// reduce v2 (tests/norm/test_norm_gpu checks it). The last tail CTA to
// leave the wait resets both counts (d.counters[1] counts the departures)
// for the next launch on the stream. What it saves: the reduce kernel's
// launch and its start on the GPU behind the last CTA of v4 (7 us on an
// H100 by ncu for 264 x 4096 partial rows; benchmarks/NOTES.md session 33),
// and the SM carveout change between the two kernels suspected in session
// 15. `smem`: fused_reduce_smem_bytes of dynamic shared memory, free.
constexpr int kTailUnit = kReduceCols * kReduceLanes;  // the slots of one 32-column group
// Not in f32 rows of 4 vectors a thread with the sums in registers (4097 to
// 8192 columns; v3 and v4): at their 512-thread bound of 128 registers
// ptxas spills 8 to 24 bytes with the tail inlined (and more with it
// called), so those keep the reduce kernel. (norm_bwd_v3_staged: always.)
template <typename T> FP_NORM_HD constexpr bool fused_reduce_compiled(int nv, bool smem_acc) {
    return !(sizeof(T) == 4 && nv == 4 && !smem_acc);
}
FP_NORM_HD constexpr int fused_reduce_groups_per_round(int nthr) { return nthr >= 2 * kTailUnit ? nthr / kTailUnit : 1; }
static size_t fused_reduce_smem_bytes(int nthr) {
    return (size_t)fused_reduce_groups_per_round(nthr) * kTailUnit * 2 * sizeof(float);
}
template <typename T>
__device__ __forceinline__ void fused_reduce_tail(const fp_norm_bwd_desc &d, const float *partial, int nchunks, int j,
                                                  float *smem) {
    // 32-bit indices: v3's partial rows hold 2 x grid x cols <= 2 x 2 x SMs x
    // 16384 floats.
    const int nthr = (int)(blockDim.x * blockDim.y), tid = (int)(threadIdx.y * blockDim.x + threadIdx.x);
    const int gr = fused_reduce_groups_per_round(nthr);
    const int cols = (int)d.cols, ngroups = (cols + kReduceCols - 1) / kReduceCols, k = d.tail_ctas;
    const bool want_g = d.dgamma != nullptr, want_b = d.dbeta || d.dbias;
    const float *pb = partial + nchunks * cols;
    float *sg = smem, *sb = smem + gr * kTailUnit;
    for (int base = j; base < ngroups; base += k * gr) {  // CTA-uniform
        for (int s = tid; s < gr * kTailUnit; s += nthr) {
            const int gi = s / kTailUnit, lane = s / kReduceCols % kReduceLanes, c = s % kReduceCols;
            const int grp = base + gi * k, col = grp * kReduceCols + c;
            float tg = 0.0f, tb = 0.0f;
            if (grp < ngroups && col < cols) {
#pragma unroll 8
                for (int ch = lane; ch < nchunks; ch += kReduceLanes) {
                    if (want_g) tg += __ldcg(partial + ch * cols + col);
                    if (want_b) tb += __ldcg(pb + ch * cols + col);
                }
            }
            sg[s] = tg;
            sb[s] = tb;
        }
        __syncthreads();
        if (tid < gr * kReduceCols) {
            const int gi = tid / kReduceCols, c = tid % kReduceCols;
            const int col = (base + gi * k) * kReduceCols + c;
            if (base + gi * k < ngroups && col < cols) {
                const int o = gi * kTailUnit + c;
                float tg = sg[o], tb = sb[o];
                for (int i = 1; i < kReduceLanes; ++i) {
                    tg += sg[o + i * kReduceCols];
                    tb += sb[o + i * kReduceCols];
                }
                if (d.dgamma) static_cast<T *>(d.dgamma)[col] = from_f<T>(tg);
                if (d.dbeta) static_cast<T *>(d.dbeta)[col] = from_f<T>(tb);
                if (d.dbias) static_cast<T *>(d.dbias)[col] = from_f<T>(tb);
            }
        }
        __syncthreads();
    }
}

// After a CTA stored its partial row: its arrival, and for the last
// d.tail_ctas CTAs the wait and the fused reduce (every thread of the CTA
// calls it; `ticket`: a free shared word).
template <typename T>
__device__ __forceinline__ void fused_reduce(const fp_norm_bwd_desc &d, const float *partial, int *ticket,
                                             float *smem) {
    __syncthreads();  // the CTA's partial stores before thread 0's arrival (its release covers them)
    const bool lead = threadIdx.x == 0 && threadIdx.y == 0;
    if (lead) *ticket = fp_grid::arrive(d.counters);
    __syncthreads();
    const int first = (int)gridDim.x - d.tail_ctas;
    const int t = *ticket;
    if (t < first) return;  // CTA-uniform
    if (lead) {
        fp_grid::wait_at_least(d.counters, (int)gridDim.x);
        // Every tail CTA has seen the count complete before the last one
        // resets it.
        if (atomicAdd(d.counters + 1, 1) == d.tail_ctas - 1) {
            d.counters[0] = 0;
            d.counters[1] = 0;
        }
    }
    __syncthreads();  // hands the acquired partial rows on to the CTA's threads (read through L2)
    fused_reduce_tail<T>(d, partial, (int)gridDim.x, t - first, smem);
}

// Whether v3 / v4's kernel stamps its span (the kernel timer). Not v4's of
// f32 rows at NV 4: at its launch bound, the stamps' few instructions spill
// it (24 bytes); a call the kernel timer times runs v3 there (v4_applies).
template <typename T, int NV, int kRing> constexpr bool v3_stamps() {
    return !(kRing > 0 && sizeof(T) == 4 && NV == 4);
}

// Block (threads_x, rows_per_cta) from fp_norm_v3_plan_for; grid from
// fp_norm_v3_grid. partial: [2][gridDim.x][cols] (sum g * n, then sum g), or
// NULL when no dgamma/dbeta/dbias is requested. Dynamic shared memory:
//   kSmemAcc (block per row): the sums, [2][cols] f32;
//   else 2 x (blockDim.y - 1) x cols floats (warp per row: the other warps'
//   sums for the combine; 0 for a block per row); with kRing (v4) the ring
//   after it.
template <typename T, int NV, bool kSmemAcc, int kRing = 0>
__global__ void __launch_bounds__(bwd_v3_bound(NV * Vec<T>::N, kSmemAcc))
    norm_bwd_v3(const fp_norm_bwd_desc d, float *partial) {
    if constexpr (v3_stamps<T, NV, kRing>()) fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    constexpr int V = Vec<T>::N;
    static_assert(V % 4 == 0, "float4 access to the sums");
    static_assert(kRing == 0 || (kRing >= 2 && !kSmemAcc), "the ring (v4): register sums, >= 2 stages");
    __shared__ float red_smem[32];
    extern __shared__ float4 comb_smem4[];
    float *comb_smem = reinterpret_cast<float *>(comb_smem4);
    const int nvec = (int)(d.cols / V);
    const int tpr = blockDim.x;
    const int64_t grid = gridDim.x;
    // v4: the ring after the warps' combine area (2 x (rows_per_cta - 1) x
    // cols floats; none in a block per row), its first kRing - 1 rows in
    // flight before the loop.
    [[maybe_unused]] BwdRing ring = {nullptr, nullptr, NV, d.dres ? 3 : 2, tpr * (int)blockDim.y,
                                     (int)(threadIdx.y * blockDim.x + threadIdx.x)};
    [[maybe_unused]] int ring_read = 0, ring_write = kRing - 1;  // the stages this step reads and refills
    if constexpr (kRing > 0) {
        const int ry = (int)blockDim.y;
        ring.cells = reinterpret_cast<uint4 *>(comb_smem4 + (ry > 1 ? 2 * (int64_t)(ry - 1) * d.cols / 4 : 0));
        ring.stats = reinterpret_cast<float *>(ring.cells + (int64_t)kRing * NV * ring.nt * ring.nthr);
        for (int s = 0; s < kRing - 1; ++s)
            ring_issue<T, NV>(d, ring, s, fp_norm_v3_row(blockIdx.x, s, (int)threadIdx.y, grid, ry), tpr, nvec);
    }
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);

    // This thread's columns, summed over its rows: registers, or (kSmemAcc)
    // its own cells of comb_smem: written and read only by this thread, so
    // no barrier is needed.
    float acc_g_reg[kSmemAcc ? 1 : NV][V], acc_b_reg[kSmemAcc ? 1 : NV][V];
    if constexpr (kSmemAcc) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
            if (j < nvec) {
#pragma unroll
                for (int q = 0; q < V / 4; ++q) {
                    comb_smem4[(j * V) / 4 + q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    comb_smem4[(d.cols + j * V) / 4 + q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
            }
        }
    } else {
#pragma unroll
        for (int k = 0; k < NV; ++k)
#pragma unroll
            for (int e = 0; e < V; ++e) acc_g_reg[k][e] = acc_b_reg[k][e] = 0.0f;
    }

    // Block per row: every thread of the CTA sees the same row, so the exit is
    // uniform (row_sum synchronizes). Warp per row: a warp leaves on its own.
    for (int64_t step = 0;; ++step) {
        const int64_t row = fp_norm_v3_row(blockIdx.x, step, (int)threadIdx.y, grid, (int)blockDim.y);
        if (row >= d.rows) break;
        [[maybe_unused]] const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
        [[maybe_unused]] const T *dy = static_cast<const T *>(d.dout) + row * d.dout_stride;
        float mean, rstd;
        if constexpr (kRing > 0) {
            // Refill the stage the previous step finished with (its last reads,
            // dres at the dx stores, are behind us in program order and were
            // consumed), then land this step's row: kRing - 1 rows stay in
            // flight through this row's arithmetic, reductions and stores.
            ring_issue<T, NV>(d, ring, ring_write,
                              fp_norm_v3_row(blockIdx.x, step + kRing - 1, (int)threadIdx.y, grid, (int)blockDim.y),
                              tpr, nvec);
            cp_async_wait<kRing - 1>();
            mean = d.mean ? ring.stat(ring_read, 0) : 0.0f;
            rstd = ring.stat(ring_read, 1);
        } else {
            mean = d.mean ? d.mean[row] : 0.0f;
            rstd = d.rstd[row];
        }
        float xn_reg[NV][V], dn_reg[NV][V];
        float sa = 0.0f, sb = 0.0f;
        // One vector of the row from its raw 16-byte x and dout: n, dn (or g),
        // the row sums and the register column sums.
        auto first_pass = [&](int k, int64_t j, const uint4 &xraw, const uint4 &draw) {
            float xv[V], dv[V], gam[V], sh[V];
            unpack<T>(xraw, xv);
            unpack<T>(draw, dv);
            load_gamma_shift<T, V>(gamma, beta, bias, d.act, j, gam, sh);
            float xn[V], g[V], dn[V];
            grad_vec<V>(d, mean, rstd, xv, dv, gam, sh, xn, g, dn);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                xn_reg[k][e] = xn[e];
                sa += dn[e];
                sb += dn[e] * xn[e];
                if constexpr (kSmemAcc) {
                    dn_reg[k][e] = g[e];  // g kept: the sums are added in the second pass
                } else {
                    dn_reg[k][e] = dn[e];
                    acc_g_reg[k][e] += g[e] * xn[e];
                    acc_b_reg[k][e] += g[e];
                }
            }
        };
        // The loads of kPF vectors issued before their arithmetic (the
        // activation's switch keeps the compiler from hoisting the next
        // vector's loads): all NV, except f32 with shared-memory sums (2:
        // spilled with 8) and f32 NV 4 with register sums (1, loads
        // interleaved as before: spilled with 2 or 4 at its 512-thread
        // register bound); ptxas sm_80 / sm_90.
        constexpr int kPF = V != 4 || NV < 4 ? NV : kSmemAcc ? 2 : 1;
        if constexpr (kRing > 0) {  // v4: the row from this thread's ring cells
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
                if (j < nvec) first_pass(k, j, lds16(ring.cell(ring_read, k, 0)), lds16(ring.cell(ring_read, k, 1)));
            }
        } else if constexpr (kPF == 1) {
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
                if (j < nvec) first_pass(k, j, ldg16(x + j * V), ldg16(dy + j * V));
            }
        } else {
#pragma unroll
            for (int k0 = 0; k0 < NV; k0 += kPF) {
                uint4 xr[kPF], dr[kPF];
                load_xdy_v3<T, V, kPF>(x, dy, k0, tpr, nvec, xr, dr);
#pragma unroll
                for (int i = 0; i < kPF; ++i) {
                    const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k0 + i, tpr);
                    if (j < nvec) first_pass(k0 + i, j, xr[i], dr[i]);
                }
            }
        }
        const float inv_n = 1.0f / (float)d.cols;
        float a, b;
        row_means(d, sa, sb, inv_n, red_smem, a, b);
        T *dx = static_cast<T *>(d.dx) + row * d.dx_stride;
        [[maybe_unused]] const T *dres = d.dres ? static_cast<const T *>(d.dres) + row * d.dres_stride : nullptr;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
            if (j < nvec) {
                float v[V];
                if constexpr (kSmemAcc) {
                    // dn_reg holds g: dn = g * gamma (gamma re-read from L1/L2:
                    // fewer live registers than a second row array), and the
                    // sums g * n, g go to this thread's shared-memory cells.
                    float gam[V];
                    load_gamma<T, V>(gamma, j, gam);
#pragma unroll
                    for (int q = 0; q < V / 4; ++q) {
                        float4 &ag = comb_smem4[(j * V) / 4 + q], &ab = comb_smem4[(d.cols + j * V) / 4 + q];
                        const float *gq = &dn_reg[k][4 * q], *xq = &xn_reg[k][4 * q];
                        ag = make_float4(ag.x + gq[0] * xq[0], ag.y + gq[1] * xq[1], ag.z + gq[2] * xq[2],
                                         ag.w + gq[3] * xq[3]);
                        ab = make_float4(ab.x + gq[0], ab.y + gq[1], ab.z + gq[2], ab.w + gq[3]);
                    }
#pragma unroll
                    for (int e = 0; e < V; ++e) dn_reg[k][e] *= gam[e];
                }
#pragma unroll
                for (int e = 0; e < V; ++e) v[e] = rstd * (dn_reg[k][e] - a - xn_reg[k][e] * b);
                if constexpr (kRing > 0) {
                    if (ring.nt == 3) {
                        float r[V];
                        unpack<T>(lds16(ring.cell(ring_read, k, 2)), r);
#pragma unroll
                        for (int e = 0; e < V; ++e) v[e] += r[e];
                    }
                    stg16(dx + j * V, pack<T>(v));
                } else {
                    store_dx<T, V>(dx, dres, j, v);
                }
            }
        }
        if constexpr (kRing > 0) {
            ring_read = ring_read + 1 == kRing ? 0 : ring_read + 1;
            ring_write = ring_write + 1 == kRing ? 0 : ring_write + 1;
        }
    }
    if (!partial) {  // uniform: no dgamma/dbeta/dbias requested
        if constexpr (v3_stamps<T, NV, kRing>()) fp_stamp::end(d.stamp);
        return;
    }

    const bool want_g = d.dgamma != nullptr, want_b = d.dbeta || d.dbias;
    const int64_t cols = d.cols;
    constexpr bool kFused = fused_reduce_compiled<T>(NV, kSmemAcc);
    if constexpr (kRing > 0 && kFused) {
        if (d.tail_ctas > 0) cp_async_wait<0>();  // the ring's cells become the reduce's (groups past the rows: empty)
    }
    if constexpr (kSmemAcc) {  // a block per row: this thread's cells straight out
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
            if (j < nvec) {
                float4 *pg = reinterpret_cast<float4 *>(partial + fp_norm_v3_partial_index(0, blockIdx.x, j * V, grid, cols));
                float4 *pb = reinterpret_cast<float4 *>(partial + fp_norm_v3_partial_index(1, blockIdx.x, j * V, grid, cols));
#pragma unroll
                for (int q = 0; q < V / 4; ++q) {
                    if (want_g) __stwb(pg + q, comb_smem4[(j * V) / 4 + q]);
                    if (want_b) __stwb(pb + q, comb_smem4[(cols + j * V) / 4 + q]);
                }
            }
        }
    } else {  // register sums
        const int ry = (int)blockDim.y;
        if (ry > 1) {
            // Warp per row: warps 1..ry-1 hand their sums to warp 0, which adds
            // them in thread-row order (fixed: deterministic).
            float *cg = comb_smem, *cb = comb_smem + (int64_t)(ry - 1) * cols;
            if (threadIdx.y > 0) {
#pragma unroll
                for (int k = 0; k < NV; ++k) {
                    const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
                    if (j < nvec) {
                        const int64_t o = (int64_t)(threadIdx.y - 1) * cols + j * V;
#pragma unroll
                        for (int e = 0; e < V; ++e) {
                            cg[o + e] = acc_g_reg[k][e];
                            cb[o + e] = acc_b_reg[k][e];
                        }
                    }
                }
            }
            __syncthreads();
            if (threadIdx.y == 0) {
                for (int i = 0; i < ry - 1; ++i) {
#pragma unroll
                    for (int k = 0; k < NV; ++k) {
                        const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
                        if (j < nvec) {
                            const int64_t o = (int64_t)i * cols + j * V;
#pragma unroll
                            for (int e = 0; e < V; ++e) {
                                acc_g_reg[k][e] += cg[o + e];
                                acc_b_reg[k][e] += cb[o + e];
                            }
                        }
                    }
                }
            }
        }
        if constexpr (!kFused) {
            if (threadIdx.y != 0) return;
        }
        if (threadIdx.y == 0) {  // (the other warps: on to the fused reduce, or done)
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
                if (j < nvec) {
                    // cols and V are multiples of 4 and partial is 16-byte aligned: float4 stores.
                    float4 *pg = reinterpret_cast<float4 *>(partial + fp_norm_v3_partial_index(0, blockIdx.x, j * V, grid, cols));
                    float4 *pb = reinterpret_cast<float4 *>(partial + fp_norm_v3_partial_index(1, blockIdx.x, j * V, grid, cols));
#pragma unroll
                    for (int q = 0; q < V / 4; ++q) {
                        if (want_g)
                            __stwb(pg + q, make_float4(acc_g_reg[k][4 * q], acc_g_reg[k][4 * q + 1],
                                                       acc_g_reg[k][4 * q + 2], acc_g_reg[k][4 * q + 3]));
                        if (want_b)
                            __stwb(pb + q, make_float4(acc_b_reg[k][4 * q], acc_b_reg[k][4 * q + 1],
                                                       acc_b_reg[k][4 * q + 2], acc_b_reg[k][4 * q + 3]));
                    }
                }
            }
        }
    }
    if constexpr (kFused) {
        if (d.tail_ctas > 0) fused_reduce<T>(d, partial, reinterpret_cast<int *>(red_smem), comb_smem);
    }
    if constexpr (v3_stamps<T, NV, kRing>()) fp_stamp::end(d.stamp);
}

// v3 with the row staged in shared memory (plan.stage_row: a block per row,
// NV x V = 32, 385-512 threads, 12288 < cols <= 16384). The row does not fit
// the registers next to the sums, so pass 1 keeps x (as loaded, T) and
// g = dout * act'(y) (f32) in this thread's own shared-memory cells, and pass
// 2 reads them back (no barrier: no thread reads another's cells). The
// dgamma sums stay in registers, and so do the dbeta sums for f32; for 16-bit
// types (8 elements per vector: twice the per-vector temporaries) the dbeta
// sums live in the thread's own shared-memory cells too, or the kernel would
// spill under the 128-register bound of 512 threads. x and dout are read from
// device memory once. Loads are issued kLB vectors at a time before any
// arithmetic (the activation's switch keeps the compiler from hoisting the
// next vector's loads), so a thread keeps 2 x kLB x 16 bytes in flight
// (registers: 124 f32, 127-128 16-bit, sm_90; no spills on sm_80 or sm_90).
// Dynamic shared memory (fp_norm_v3_smem_bytes): g f32[cols], the dbeta sums
// f32[cols] (16-bit only), x T[cols].
template <typename T, int NV>
__global__ void __launch_bounds__(FP_NORM_V3_MAX_THREADS) norm_bwd_v3_staged(const fp_norm_bwd_desc d, float *partial) {
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    constexpr int V = Vec<T>::N;
    constexpr bool kAccBSmem = V == 8;
    constexpr int kLB = 2;
    static_assert(V % 4 == 0 && NV % kLB == 0, "float4 cells, whole load batches");
    __shared__ float red_smem[32];
    extern __shared__ float4 stage_smem4[];
    const int64_t cols = d.cols;
    float4 *g_s = stage_smem4;                                                    // [cols / 4]
    float4 *accb_s = stage_smem4 + cols / 4;                                      // [cols / 4] if kAccBSmem
    uint4 *x_s = reinterpret_cast<uint4 *>(stage_smem4 + (kAccBSmem ? 2 : 1) * (cols / 4));  // [cols / V]
    const int nvec = (int)(cols / V);
    const int tpr = blockDim.x;
    const int64_t grid = gridDim.x;
    const float inv_n = 1.0f / (float)cols;  // once: the IEEE division's slow path is a call
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);

    float acc_g[NV][V], acc_b[kAccBSmem ? 1 : NV][V];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
#pragma unroll
        for (int e = 0; e < V; ++e) acc_g[k][e] = 0.0f;
        if constexpr (kAccBSmem) {
            const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
            if (j < nvec)
#pragma unroll
                for (int q = 0; q < V / 4; ++q) accb_s[(j * V) / 4 + q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) acc_b[k][e] = 0.0f;
        }
    }

    // Every thread of the CTA sees the same row: the exit is uniform.
    for (int64_t step = 0;; ++step) {
        const int64_t row = fp_norm_v3_row(blockIdx.x, step, 0, grid, 1);
        if (row >= d.rows) break;
        const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
        const T *dy = static_cast<const T *>(d.dout) + row * d.dout_stride;
        const float mean = d.mean ? d.mean[row] : 0.0f, rstd = d.rstd[row];
        float sa = 0.0f, sb = 0.0f;
        // Pass 1: load, stage x and g, the row sums of dn and dn * n.
#pragma unroll
        for (int k0 = 0; k0 < NV; k0 += kLB) {
            uint4 xr[kLB], dr[kLB];
            load_xdy_v3<T, V, kLB>(x, dy, k0, tpr, nvec, xr, dr);
#pragma unroll
            for (int i = 0; i < kLB; ++i) {
                const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k0 + i, tpr);
                if (j < nvec) {
                    x_s[j] = xr[i];
                    float xv[V], dv[V], gam[V], sh[V], g[V];
                    unpack<T>(xr[i], xv);
                    unpack<T>(dr[i], dv);
                    load_gamma_shift<T, V>(gamma, beta, bias, d.act, j, gam, sh);
                    // Per element (grad_elem), not grad_vec: its vector of
                    // pre-activations spilled the f32 kernel at its 128-register
                    // bound (ptxas sm_90).
#pragma unroll
                    for (int e = 0; e < V; ++e) {
                        float xn, dn;
                        grad_elem(d, mean, rstd, xv[e], dv[e], gam[e], sh[e], xn, g[e], dn);
                        sa += dn;
                        sb += dn * xn;
                    }
#pragma unroll
                    for (int q = 0; q < V / 4; ++q)
                        g_s[(j * V) / 4 + q] = make_float4(g[4 * q], g[4 * q + 1], g[4 * q + 2], g[4 * q + 3]);
                }
            }
        }
        float a, b;
        row_means(d, sa, sb, inv_n, red_smem, a, b);
        // Pass 2: dx from this thread's staged cells; the column sums.
        T *dx = static_cast<T *>(d.dx) + row * d.dx_stride;
        const T *dres = d.dres ? static_cast<const T *>(d.dres) + row * d.dres_stride : nullptr;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
            if (j < nvec) {
                float xv[V], g[V], gam[V], v[V];
                const uint4 xr = x_s[j];  // one 16-byte shared load (unpacking the reference would not be)
                unpack<T>(xr, xv);
#pragma unroll
                for (int q = 0; q < V / 4; ++q) {
                    const float4 t = g_s[(j * V) / 4 + q];
                    g[4 * q] = t.x;
                    g[4 * q + 1] = t.y;
                    g[4 * q + 2] = t.z;
                    g[4 * q + 3] = t.w;
                }
                load_gamma<T, V>(gamma, j, gam);  // L1-resident across rows
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float xn = (xv[e] - mean) * rstd;  // bitwise pass 1's
                    v[e] = rstd * (g[e] * gam[e] - a - xn * b);
                    acc_g[k][e] += g[e] * xn;
                    if constexpr (!kAccBSmem) acc_b[k][e] += g[e];
                }
                if constexpr (kAccBSmem) {
#pragma unroll
                    for (int q = 0; q < V / 4; ++q) {
                        float4 &ab = accb_s[(j * V) / 4 + q];
                        ab =
                            make_float4(ab.x + g[4 * q], ab.y + g[4 * q + 1], ab.z + g[4 * q + 2], ab.w + g[4 * q + 3]);
                    }
                }
                store_dx<T, V>(dx, dres, j, v);
            }
        }
    }
    if (!partial) {  // uniform: no dgamma/dbeta/dbias requested
        fp_stamp::end(d.stamp);
        return;
    }
    const bool want_g = d.dgamma != nullptr, want_b = d.dbeta || d.dbias;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int64_t j = fp_norm_v3_vec((int)threadIdx.x, k, tpr);
        if (j < nvec) {
            float4 *pg =
                reinterpret_cast<float4 *>(partial + fp_norm_v3_partial_index(0, blockIdx.x, j * V, grid, cols));
            float4 *pb =
                reinterpret_cast<float4 *>(partial + fp_norm_v3_partial_index(1, blockIdx.x, j * V, grid, cols));
#pragma unroll
            for (int q = 0; q < V / 4; ++q) {
                if (want_g)
                    __stwb(pg + q,
                           make_float4(acc_g[k][4 * q], acc_g[k][4 * q + 1], acc_g[k][4 * q + 2], acc_g[k][4 * q + 3]));
                if (want_b) {
                    if constexpr (kAccBSmem)
                        __stwb(pb + q, accb_s[(j * V) / 4 + q]);
                    else
                        __stwb(pb + q, make_float4(acc_b[k][4 * q], acc_b[k][4 * q + 1], acc_b[k][4 * q + 2],
                                                   acc_b[k][4 * q + 3]));
                }
            }
        }
    }
    // (the stage's cells, the reduce's after the barrier in fused_reduce)
    if (d.tail_ctas > 0) fused_reduce<T>(d, partial, reinterpret_cast<int *>(red_smem), reinterpret_cast<float *>(stage_smem4));
    fp_stamp::end(d.stamp);
}

// ---------------------------------------------------------------------------
// Launchers
// ---------------------------------------------------------------------------
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The fixed-order sum of the partials ([2][nchunks][cols]) into dgamma /
// dbeta / dbias: v2, or v1 under FP_NORM_BWD_REDUCE=1.
template <typename T>
static cudaError_t launch_reduce(const fp_norm_bwd_desc &d, const float *partial, int64_t nchunks,
                                 cudaStream_t stream) {
    if (reduce_v1_forced()) {
        norm_bwd_reduce_v1<T><<<(unsigned)ceil_div(d.cols, 256), 256, 0, stream>>>(d, partial, nchunks);
    } else {
        const int64_t tiles = ceil_div(d.cols, kReduceCols);
        if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
        norm_bwd_reduce_v2<T><<<(unsigned)tiles, dim3(kReduceCols, kReduceLanes), 0, stream>>>(d, partial, nchunks);
    }
    return cudaGetLastError();
}
static int round_up32(int64_t v) { return (int)(ceil_div(v, 32) * 32); }

// Rows per dparams chunk: >= 32 so each of the 8 row lanes sums >= 4 rows,
// and at most 256 chunks so the partial buffer stays small.
static int64_t bwd_rows_per_chunk(int64_t rows) {
    int64_t rpc = ceil_div(rows, 256);
    return rpc < 32 ? 32 : rpc;
}

static bool bwd_vectorizable(const fp_norm_bwd_desc &d, int V) {
    const void *ptrs[] = {d.x, d.dout, d.dres, d.dx, d.gamma, d.beta, d.bias};
    for (const void *p : ptrs)
        if (p && !aligned16(p)) return false;
    if (d.cols % V || d.x_stride % V || d.dout_stride % V || d.dx_stride % V) return false;
    if (d.dres && d.dres_stride % V) return false;
    return true;
}

template <typename T, int NV>
static void launch_dx_v2(const fp_norm_bwd_desc &d, dim3 grid, dim3 block, cudaStream_t stream) {
    norm_bwd_dx_v2<T, NV><<<grid, block, 0, stream>>>(d);
}

// dx v2's launch shape for d (NV, grid, block); nv = 0 where v2 does not
// apply (not vectorizable, the row beyond 512 threads x 32 / V vectors, or
// the grid beyond gridDim.x: rows > 2^31 - 1 in a block per row). Shared by
// launch_dx and bwd_resolve, so fp_norm_bwd_version_used tells the truth.
template <typename T>
static int dx_v2_shape(const fp_norm_bwd_desc &d, dim3 *grid, dim3 *block) {
    constexpr int V = Vec<T>::N;
    constexpr int kMaxNV = 32 / V;  // n and dn: <= 64 floats per thread in all
    if (!bwd_vectorizable(d, V)) return 0;
    const int64_t nvec = d.cols / V;
    if (nvec <= 32 * 4) {  // warp per row
        if (ceil_div(d.rows, kBwdWarpRows) > 0x7fffffffLL) return 0;
        *block = dim3(32, kBwdWarpRows);
        *grid = dim3((unsigned)ceil_div(d.rows, kBwdWarpRows));
        return nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
    }
    if (d.rows > 0x7fffffffLL) return 0;
    for (int c = 2; c <= kMaxNV; c *= 2)  // block per row: the fewest vectors per thread that fit
        if (ceil_div(nvec, c) <= kBwdV2MaxThreads) {
            *block = dim3(round_up32(ceil_div(nvec, c)), 1);
            *grid = dim3((unsigned)d.rows);
            return c;
        }
    return 0;
}

// force_v1: the scalar kernel even where v2 applies (version 1).
// dx staged applies to d (aligned; x and dout staged within the device's
// opt-in shared memory less the static red_smem, returned in *avail). For
// rows dx v2 does not take; shared by launch_dx and bwd_resolve.
template <typename T>
static bool dx_staged_fits(const fp_norm_bwd_desc &d, size_t *avail) {
    if (!bwd_vectorizable(d, Vec<T>::N)) return false;
    const size_t smem = 2 * (size_t)d.cols * sizeof(T);
    *avail = kDynSmemDefault;
    if (smem <= *avail) return true;
    return optin_dyn_smem(avail) == cudaSuccess && smem <= *avail;  // else v1 runs
}

template <typename T>
static cudaError_t launch_dx(const fp_norm_bwd_desc &d, bool force_v1, cudaStream_t stream) {
    constexpr int kMaxNV = 32 / Vec<T>::N;
    dim3 grid, block;
    const int nv = force_v1 ? 0 : dx_v2_shape<T>(d, &grid, &block);
    switch (nv) {
    case 0: break;
    case 1: launch_dx_v2<T, 1>(d, grid, block, stream); return cudaGetLastError();
    case 2: launch_dx_v2<T, 2>(d, grid, block, stream); return cudaGetLastError();
    case 4: launch_dx_v2<T, 4>(d, grid, block, stream); return cudaGetLastError();
    default:
        if constexpr (kMaxNV >= 8) {
            launch_dx_v2<T, kMaxNV>(d, grid, block, stream);
            return cudaGetLastError();
        }
        break;
    }
    size_t avail = 0;
    if (!force_v1 && dx_staged_fits<T>(d, &avail)) {
        const size_t smem = 2 * (size_t)d.cols * sizeof(T);
        if (smem > kDynSmemDefault) {
            // Always the device's whole opt-in: a per-call value would race with
            // another host thread launching this kernel for other cols.
            cudaError_t err = opt_in_once(norm_bwd_dx_staged<T>, (int)avail);
            if (err != cudaSuccess) return err;
        }
        norm_bwd_dx_staged<T><<<(unsigned)(d.rows < 0x7fffffffLL ? d.rows : 0x7fffffffLL), kBwdStagedThreads, smem,
                                stream>>>(d);
        return cudaGetLastError();
    }
    const int threads = (int)(d.cols < kBwdV1Threads ? round_up32(d.cols) : kBwdV1Threads);
    norm_bwd_dx_v1<T><<<(unsigned)(d.rows < 0x7fffffffLL ? d.rows : 0x7fffffffLL), threads, 0, stream>>>(d);
    return cudaGetLastError();
}

// Versions 1 and 2: dgamma/dbeta first (they re-read dout, and dx may alias
// dout), then dx.
template <typename T>
static cudaError_t bwd_dispatch(const fp_norm_bwd_desc &d, bool force_v1, float *partial, cudaStream_t stream) {
    cudaError_t err;
    if (d.dgamma || d.dbeta || d.dbias) {
        if (!partial) return cudaErrorInvalidValue;
        const int64_t rpc = bwd_rows_per_chunk(d.rows), nchunks = ceil_div(d.rows, rpc);
        constexpr int V = Vec<T>::N;
        const bool vec = !force_v1 && bwd_vectorizable(d, V);
        const int64_t tiles = ceil_div(d.cols, (int64_t)kParamTileCols * (vec ? V : 1));
        if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
        dim3 grid((unsigned)tiles, (unsigned)nchunks), block(kParamTileCols, kParamRowThreads);
        if (vec) norm_bwd_dparams<T, V><<<grid, block, 0, stream>>>(d, partial, rpc);
        else norm_bwd_dparams<T, 1><<<grid, block, 0, stream>>>(d, partial, rpc);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        if ((err = launch_reduce<T>(d, partial, nchunks, stream)) != cudaSuccess) return err;
    }
    return launch_dx<T>(d, force_v1, stream);
}

// ---- v3 ----
using BwdV3Kernel = void (*)(fp_norm_bwd_desc, float *);

// dx v2's NV set with register sums (1, 2, 4) and its largest NV (32 / V: 4
// for 16-bit, 8 for f32) with shared-memory sums: 4 kernels per dtype; v4
// (ring): the register-sum ones again with the prefetch ring, 3 more.
template <typename T>
static BwdV3Kernel v3_kernel(int nv, bool smem_acc, bool stage_row, bool ring = false) {
    constexpr int kMaxNV = 32 / Vec<T>::N;
    constexpr int R = FP_NORM_V4_RING_STAGES;
    if (stage_row) return nv == kMaxNV && !ring ? norm_bwd_v3_staged<T, kMaxNV> : nullptr;
    if (smem_acc) return nv == kMaxNV && !ring ? norm_bwd_v3<T, kMaxNV, true> : nullptr;
    switch (nv) {
    case 1: return ring ? norm_bwd_v3<T, 1, false, R> : norm_bwd_v3<T, 1, false>;
    case 2: return ring ? norm_bwd_v3<T, 2, false, R> : norm_bwd_v3<T, 2, false>;
    case 4: return ring ? norm_bwd_v3<T, 4, false, R> : norm_bwd_v3<T, 4, false>;
    default: return nullptr;
    }
}

// The v3 plan for d, or plan.ok == 0 where v3 does not apply (not aligned,
// odd cols, rows too long, shared-memory sums beyond the device's limit).
template <typename T>
static fp_norm_v3_plan v3_plan(const fp_norm_bwd_desc &d) {
    fp_norm_v3_plan none = {0, 0, 0, 0, 0, 0};
    if (!bwd_vectorizable(d, Vec<T>::N)) return none;
    fp_norm_v3_plan p = fp_norm_v3_plan_for(d.cols, Vec<T>::N);
    if (p.ok && !v3_kernel<T>(p.nv, p.smem_acc != 0, p.stage_row != 0)) p.ok = 0;
    const size_t smem = fp_norm_v3_smem_bytes(&p, d.cols, sizeof(T));
    if (p.ok && smem > 48 * 1024) {  // needs the opt-in: within the device's limit?
        size_t avail;
        if (optin_dyn_smem(&avail) != cudaSuccess || smem > avail) return none;
    }
    return p;
}

// v4's dynamic shared memory for d and plan p (v3's + the ring).
template <typename T>
static size_t v4_smem(const fp_norm_bwd_desc &d, const fp_norm_v3_plan &p) {
    return fp_norm_v4_smem_bytes(&p, d.cols, sizeof(T), d.dres ? 3 : 2);
}

// v4 applies to d: v3's plan keeps the sums in registers and the ring fits
// the device's opt-in shared memory (a block of 512 f32 threads with NV 4
// does not: 288 KB).
template <typename T>
static bool v4_applies(const fp_norm_bwd_desc &d) {
    const fp_norm_v3_plan p = v3_plan<T>(d);
    if (!p.ok || p.smem_acc || p.stage_row || !v3_kernel<T>(p.nv, false, false, true)) return false;
    if (d.stamp.rec && sizeof(T) == 4 && p.nv == 4) return false; // its v4 kernel stamps nothing (v3_stamps)
    const size_t smem = v4_smem<T>(d, p);
    size_t avail;
    return smem <= kDynSmemDefault || (optin_dyn_smem(&avail) == cudaSuccess && smem <= avail);
}

// The automatic choice takes v4 where a dresidual is given (and v4 applies).
// Measured on an H100 (bf16, fastbench norm/bwd_versions --baseline 3
// --optimized 4 and norm/*_bwd, five calls, 2026-11-26, commits bf2398d to
// 5c9edbf; benchmarks/NOTES.md session 15): with a dresidual (three tensors
// in the ring) v4 ran 1.13-1.23x faster than v3 at every shape it takes
// (16384 x 4096 with reduce v2: LayerNorm + GELU 366 -> 313 us, RMSNorm +
// SiLU 353 -> 293 us); without one the op was 0.93-1.12x of v3 (16384 x
// 4096: LayerNorm 180 against 181-185 us, RMSNorm 174.5 against 186) while
// ncu timed the two kernels alone within 2% (free clocks, warm caches:
// 166 / 169 us): the loss is between the kernels, not understood (an SM
// carveout reconfiguration is suspected: with v4 and the reduce both
// preferring the largest carveout RMSNorm's op went 183 -> 173 us, but the
// fused ones lost 30 us with the smaller L1, so that was not kept).
// FP_NORM_BWD_RING (read once) for A/B runs: "1" takes v4 wherever it
// applies (with or without a dresidual and parameter gradients), "0" never.
static int ring_forced() {
    static const int forced = env_switch("FP_NORM_BWD_RING", 1);
    return forced;
}
static bool ring_auto(const fp_norm_bwd_desc &d) {
    const int forced = ring_forced();
    if (forced >= 0) return forced == 1;
    return d.dres != nullptr && (d.dgamma || d.dbeta || d.dbias);
}

// Which dx kernel a version request runs: 1, 2, 3 or 4 (see the header comment).
template <typename T>
static int bwd_resolve(const fp_norm_bwd_desc &d, int version) {
    const bool params = d.dgamma || d.dbeta || d.dbias;
    if (version == 1) return 1;
    if ((version == 4 || (version == 0 && ring_auto(d))) && v4_applies<T>(d)) return 4;
    if ((version == 3 || version == 4 || (version == 0 && params)) && v3_plan<T>(d).ok) return 3;
    dim3 grid, block;
    size_t avail;
    return dx_v2_shape<T>(d, &grid, &block) || dx_staged_fits<T>(d, &avail) ? 2 : 1;  // as launch_dx
}

// Whether v3 / v4 on plan p sum their partial rows in their tail: asked
// (kernel_desc marks the ask with tail_ctas -1), partial sums requested,
// counters given, and not: FP_NORM_BWD_REDUCE=1 (the A/B asks for reduce
// v1's order), the f32 kernels fused_reduce_compiled leaves out (the
// staged-row kernel, norm_bwd_v3_staged, has the tail in every type).
template <typename T>
static bool fused_reduce_applies(const fp_norm_bwd_desc &d, const fp_norm_v3_plan &p) {
    return d.tail_ctas < 0 && (d.dgamma || d.dbeta || d.dbias) && d.counters != nullptr && !reduce_v1_forced() &&
           p.ok && (p.stage_row || fused_reduce_compiled<T>(p.nv, p.smem_acc != 0));
}

// Partial rows v3 may write: the grid's upper bound (SMs x the CTA cap), so
// the buffer never depends on the occupancy query.
static int64_t v3_max_grid(const fp_norm_bwd_desc &d, const fp_norm_v3_plan &p, int sm_count) {
    return fp_norm_v3_grid(d.rows, p.rows_per_cta, sm_count, FP_NORM_V3_MAX_CTAS_PER_SM);
}

// v3, or v4 (ring: v3 with the prefetch ring; the caller checked v4_applies).
template <typename T>
static cudaError_t bwd_v3_dispatch(const fp_norm_bwd_desc &d, int sm_count, float *partial, bool ring,
                                   cudaStream_t stream) {
    const fp_norm_v3_plan p = v3_plan<T>(d);
    const BwdV3Kernel kernel = p.ok ? v3_kernel<T>(p.nv, p.smem_acc != 0, p.stage_row != 0, ring) : nullptr;
    if (!kernel) return cudaErrorInvalidConfiguration;
    const bool params = d.dgamma || d.dbeta || d.dbias;
    if (params && (!partial || !aligned16(partial))) return cudaErrorInvalidValue;
    const int threads = p.threads_x * p.rows_per_cta;
    // The fused reduce where asked and possible. Its shared memory is the
    // kernel's own after the rows (at least fused_reduce_smem_bytes).
    fp_norm_bwd_desc kd = d;
    const bool fused = fused_reduce_applies<T>(d, p);
    kd.tail_ctas = 0;
    size_t smem = ring ? v4_smem<T>(d, p) : fp_norm_v3_smem_bytes(&p, d.cols, sizeof(T));
    if (fused && smem < fused_reduce_smem_bytes(threads)) smem = fused_reduce_smem_bytes(threads);
    cudaError_t err;
    if (ring && smem > kDynSmemDefault) {
        // The device's whole opt-in (a fixed value: see below); v4_applies
        // checked this call's need against it.
        size_t avail;
        if ((err = optin_dyn_smem(&avail)) != cudaSuccess) return err;
        if (smem > avail) return cudaErrorInvalidConfiguration;  // cannot happen: v4_applies checked
        if ((err = opt_in_once(kernel, (int)avail)) != cudaSuccess) return err;
    } else if (smem > 48 * 1024) {
        // Opt in above the default limit (v3_plan checked this call's need
        // against the device's), always to the mode's fixed cap (within the
        // device's limit): a per-call value would race with another host
        // thread launching this kernel for other cols.
        size_t avail;
        if ((err = optin_dyn_smem(&avail)) != cudaSuccess) return err;
        size_t attr = fp_norm_v3_smem_cap(&p, Vec<T>::N, sizeof(T));
        if (attr > avail) attr = avail;
        if (attr < smem) return cudaErrorInvalidConfiguration;  // cannot happen: v3_plan checked
        err = opt_in_once(kernel, (int)attr);
        if (err != cudaSuccess) return err;
    }
    int per_sm = 0;
    err = occupancy_once(&per_sm, kernel, threads, smem);
    if (err != cudaSuccess) return err;
    if (per_sm < 1) return cudaErrorInvalidConfiguration;
    const int64_t grid = fp_norm_v3_grid(d.rows, p.rows_per_cta, sm_count, per_sm);
    if (grid > v3_max_grid(d, p, sm_count)) return cudaErrorInvalidConfiguration;  // cannot happen
    if (fused) kd.tail_ctas = (int)(grid < sm_count ? grid : sm_count);
    kernel<<<(unsigned)grid, dim3((unsigned)p.threads_x, (unsigned)p.rows_per_cta), smem, stream>>>(
        kd, params ? partial : nullptr);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
    if (params && kd.tail_ctas == 0) {
        if ((err = launch_reduce<T>(d, partial, grid, stream)) != cudaSuccess) return err;
    }
    return cudaSuccess;
}

template <typename T>
static size_t bwd_partial_floats(const fp_norm_bwd_desc &d, int version, int sm_count) {
    if (!(d.dgamma || d.dbeta || d.dbias)) return 0;
    if (bwd_resolve<T>(d, version) >= 3) return (size_t)(2 * v3_max_grid(d, v3_plan<T>(d), sm_count) * d.cols);
    const int64_t nchunks = ceil_div(d.rows, bwd_rows_per_chunk(d.rows));
    return (size_t)(2 * nchunks * d.cols);
}

template <typename T>
static cudaError_t bwd_versioned(const fp_norm_bwd_desc &d, int version, int sm_count, float *partial,
                                 cudaStream_t stream) {
    if (version == 1) return bwd_dispatch<T>(d, true, partial, stream);  // v1 throughout, as asked
    // Otherwise v3 where it applies; else dparams v2 where aligned (also for
    // rows dx v2 cannot hold, > 16384 cols: launch_dx then takes v1 for dx alone).
    const int v = bwd_resolve<T>(d, version);
    if (v >= 3) return bwd_v3_dispatch<T>(d, sm_count, partial, v == 4, stream);
    return bwd_dispatch<T>(d, false, partial, stream);
}

// ---------------------------------------------------------------------------
// Unfused baseline: activation backward (g = dout * act'(y), written to dx);
// norm backward on g (dgamma/dbeta, dx in place); dx += dres. Each step is a
// separate pass over the tensor, as separate framework ops would run.
// ---------------------------------------------------------------------------
enum { EWB_DACT = 0, EWB_ADD = 1 };

template <typename T, bool VECTOR>
__global__ void __launch_bounds__(256) norm_bwd_unfused_elementwise(const fp_norm_bwd_desc d, int op) {
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    constexpr int W = VECTOR ? Vec<T>::N : 1;
    const int64_t j0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (j0 >= d.cols) return;
    auto load = [&](const void *p, int64_t off, float(&f)[W]) {
        const T *q = static_cast<const T *>(p) + off;
        if constexpr (VECTOR) unpack<T>(ldg16(q), f);
        else f[0] = to_f(*q);
    };
    for (int64_t row = blockIdx.y; row < d.rows; row += gridDim.y) {
        T *dx = static_cast<T *>(d.dx) + row * d.dx_stride + j0;
        float a[W], b[W];
        if (op == EWB_DACT) {
            float xv[W], gam[W], sh[W];
            load(d.x, row * d.x_stride + j0, xv);
            load(d.dout, row * d.dout_stride + j0, a);
#pragma unroll
            for (int e = 0; e < W; ++e) { gam[e] = 1.0f; sh[e] = 0.0f; }
            if (d.gamma) load(d.gamma, j0, gam);
            if (d.beta) {
                load(d.beta, j0, b);
#pragma unroll
                for (int e = 0; e < W; ++e) sh[e] += b[e];
            }
            if (d.bias) {
                load(d.bias, j0, b);
#pragma unroll
                for (int e = 0; e < W; ++e) sh[e] += b[e];
            }
            const float mean = d.mean ? d.mean[row] : 0.0f, rstd = d.rstd[row];
#pragma unroll
            for (int e = 0; e < W; ++e) a[e] *= dact_f(d.act, (xv[e] - mean) * rstd * gam[e] + sh[e]);
        } else {
            load(d.dx, row * d.dx_stride + j0, a);
            load(d.dres, row * d.dres_stride + j0, b);
#pragma unroll
            for (int e = 0; e < W; ++e) a[e] += b[e];
        }
        if constexpr (VECTOR) stg16(dx, pack<T>(a));
        else *dx = from_f<T>(a[0]);
    }
    fp_stamp::end(d.stamp);
}

template <typename T>
static cudaError_t bwd_unfused_step(const fp_norm_bwd_desc &d, int op, cudaStream_t stream) {
    constexpr int V = Vec<T>::N;
    const bool vec = bwd_vectorizable(d, V);
    const int64_t gx = ceil_div(d.cols, 256LL * (vec ? V : 1));
    if (gx > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    dim3 grid((unsigned)gx, (unsigned)(d.rows < 65535 ? d.rows : 65535));
    if (vec) norm_bwd_unfused_elementwise<T, true><<<grid, 256, 0, stream>>>(d, op);
    else norm_bwd_unfused_elementwise<T, false><<<grid, 256, 0, stream>>>(d, op);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t bwd_unfused_dispatch(const fp_norm_bwd_desc &d, float *partial, cudaStream_t stream) {
    cudaError_t err;
    fp_norm_bwd_desc n = d;
    if (d.act != ACT_NONE) {
        if ((err = bwd_unfused_step<T>(d, EWB_DACT, stream)) != cudaSuccess) return err;
        n.dout = d.dx;
        n.dout_stride = d.dx_stride;
    }
    n.act = ACT_NONE;
    n.beta = n.bias = nullptr;
    n.dres = nullptr;
    if ((err = bwd_dispatch<T>(n, false, partial, stream)) != cudaSuccess) return err;
    if (d.dres) return bwd_unfused_step<T>(d, EWB_ADD, stream);
    return cudaSuccess;
}

}  // namespace fpnorm

using namespace fpnorm;

extern "C" size_t fp_norm_bwd_partial_floats(const fp_norm_bwd_desc *d, int version, int sm_count) {
    version &= FP_NORM_VERSION_MASK;
    switch (d->dtype) {
    case DT_F32: return bwd_partial_floats<float>(*d, version, sm_count);
    case DT_F16: return bwd_partial_floats<__half>(*d, version, sm_count);
    case DT_BF16: return bwd_partial_floats<__nv_bfloat16>(*d, version, sm_count);
    }
    return 0;
}

extern "C" int fp_norm_bwd_version_used(const fp_norm_bwd_desc *d, int version) {
    version &= FP_NORM_VERSION_MASK;
    switch (d->dtype) {
    case DT_F32: return bwd_resolve<float>(*d, version);
    case DT_F16: return bwd_resolve<__half>(*d, version);
    case DT_BF16: return bwd_resolve<__nv_bfloat16>(*d, version);
    }
    return 0;
}

// The desc the kernels get for a version request (its FP_NORM_VOPT_* bits):
// the activation's kernel code (kernel_act), and LayerNorm's two row sums
// one after the other (two barrier pairs per row in a block per row, as
// before session 15) under FP_NORM_VOPT_TWO_REDUCTIONS or
// FP_NORM_BWD_SEP_SUMS=1 (read once), else through row_sum2.
// The fused reduce: asked by FP_NORM_VOPT_FUSED_REDUCE, or for every call by
// FP_NORM_BWD_FUSED_REDUCE=1 (=0: never; read once); r.tail_ctas = -1 marks
// the ask for bwd_v3_dispatch, which runs it where it applies.
static fp_norm_bwd_desc kernel_desc(const fp_norm_bwd_desc *d, int version) {
    static const int sep = env_switch("FP_NORM_BWD_SEP_SUMS", 1) == 1;
    static const int fused_env = env_switch("FP_NORM_BWD_FUSED_REDUCE", 1);
    fp_norm_bwd_desc r = *d;
    r.sep_sums = sep || (version & FP_NORM_VOPT_TWO_REDUCTIONS);
    r.act = kernel_act(d->act, version);
    const bool fused = fused_env >= 0 ? fused_env == 1 : (version & FP_NORM_VOPT_FUSED_REDUCE) != 0;
    r.tail_ctas = fused ? -1 : 0;
    return r;
}

template <typename T>
static bool fused_reduce_used(const fp_norm_bwd_desc &d, int version) {
    return bwd_resolve<T>(d, version) >= 3 && fused_reduce_applies<T>(d, v3_plan<T>(d));
}

extern "C" int fp_norm_bwd_fused_reduce_used(const fp_norm_bwd_desc *d, int version) {
    fp_norm_bwd_desc dd = kernel_desc(d, version);
    static int some_counters[2];
    dd.counters = some_counters;  // as the op gives them
    version &= FP_NORM_VERSION_MASK;
    switch (dd.dtype) {
    case DT_F32: return fused_reduce_used<float>(dd, version);
    case DT_F16: return fused_reduce_used<__half>(dd, version);
    case DT_BF16: return fused_reduce_used<__nv_bfloat16>(dd, version);
    }
    return 0;
}

extern "C" cudaError_t fp_norm_bwd_unfused_launch(const fp_norm_bwd_desc *d, float *partial,
                                                  cudaStream_t stream) {
    const fp_norm_bwd_desc dd = kernel_desc(d, 0);
    switch (dd.dtype) {
    case DT_F32: return bwd_unfused_dispatch<float>(dd, partial, stream);
    case DT_F16: return bwd_unfused_dispatch<__half>(dd, partial, stream);
    case DT_BF16: return bwd_unfused_dispatch<__nv_bfloat16>(dd, partial, stream);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t fp_norm_bwd_launch(const fp_norm_bwd_desc *d, int version, int sm_count, float *partial,
                                          cudaStream_t stream) {
    const fp_norm_bwd_desc dd = kernel_desc(d, version);
    version &= FP_NORM_VERSION_MASK;
    switch (dd.dtype) {
    case DT_F32: return bwd_versioned<float>(dd, version, sm_count, partial, stream);
    case DT_F16: return bwd_versioned<__half>(dd, version, sm_count, partial, stream);
    case DT_BF16: return bwd_versioned<__nv_bfloat16>(dd, version, sm_count, partial, stream);
    }
    return cudaErrorInvalidValue;
}
