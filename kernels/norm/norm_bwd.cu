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
//   norm_bwd_dparams     per (column tile, chunk of rows) block: sums of
//                        g * n and g, written to partial[chunk][col]; re-reads
//                        dout and x (a second pass over them). <T, 1> is v1
//                        (scalar, any alignment), <T, V> is v2 (16-byte loads,
//                        V columns per lane).
//   norm_bwd_reduce_v1   sums the partials over chunks in a fixed order.
//   unfused              baseline: activation backward (g to dx); the same
//                        norm backward on g, in place; dx += dres.
// Run: tests/norm/test_norm_gpu, fastbench --scenario norm/layernorm_bwd.
#include "norm/norm_common.cuh"

namespace fpnorm {

constexpr int kBwdV1Threads = 256;
constexpr int kBwdV2MaxThreads = 512;
constexpr int kBwdWarpRows = 4;
constexpr int kParamTileCols = 32;
constexpr int kParamRowThreads = 8;

// Per-row backward state: mean, rstd and the per-column vectors.
template <typename T>
struct RowGrad {
    const fp_norm_bwd_desc &d;
    float mean, rstd;
    // n, dn of one element from x, dy and column j's vectors.
    __device__ __forceinline__ void at(float xv, float dy, float gam, float sh, float &xn, float &dn) const {
        xn = (xv - mean) * rstd;
        float g = dy;
        if (d.act != ACT_NONE) g *= dact_f(d.act, xn * gam + sh);
        dn = g * gam;
    }
};

// ---------------------------------------------------------------------------
// dx v1: scalar, any shape
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kBwdV1Threads) norm_bwd_dx_v1(const fp_norm_bwd_desc d) {
    __shared__ float red_smem[32];
    const int64_t row = blockIdx.x;
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
    const float a = d.kind == KIND_LAYERNORM ? row_sum(sa, red_smem) * inv_n : 0.0f;
    const float b = row_sum(sb, red_smem) * inv_n;
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

// ---------------------------------------------------------------------------
// dx v2: row in registers
// ---------------------------------------------------------------------------
template <typename T, int NV>
__global__ void __launch_bounds__(kBwdV2MaxThreads) norm_bwd_dx_v2(const fp_norm_bwd_desc d) {
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
            float xv[V], dv[V], gam[V], sh[V], p[V];
            unpack<T>(ldg16(x + (int64_t)j * V), xv);
            unpack<T>(ldg16(dy + (int64_t)j * V), dv);
#pragma unroll
            for (int e = 0; e < V; ++e) { gam[e] = 1.0f; sh[e] = 0.0f; }
            if (gamma) unpack<T>(ldg16(gamma + (int64_t)j * V), gam);
            if (d.act != ACT_NONE) {  // the shift matters only through act'
                if (beta) {
                    unpack<T>(ldg16(beta + (int64_t)j * V), p);
#pragma unroll
                    for (int e = 0; e < V; ++e) sh[e] = p[e];
                }
                if (bias) {
                    unpack<T>(ldg16(bias + (int64_t)j * V), p);
#pragma unroll
                    for (int e = 0; e < V; ++e) sh[e] += p[e];
                }
            }
#pragma unroll
            for (int e = 0; e < V; ++e) {
                rg.at(xv[e], dv[e], gam[e], sh[e], xn_reg[k][e], dn_reg[k][e]);
                sa += dn_reg[k][e];
                sb += dn_reg[k][e] * xn_reg[k][e];
            }
        }
    }
    const float inv_n = 1.0f / (float)d.cols;
    const float a = d.kind == KIND_LAYERNORM ? row_sum(sa, red_smem) * inv_n : 0.0f;
    const float b = row_sum(sb, red_smem) * inv_n;
    T *dx = static_cast<T *>(d.dx) + row * d.dx_stride;
    const T *dres = d.dres ? static_cast<const T *>(d.dres) + row * d.dres_stride : nullptr;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int j = threadIdx.x + k * tpr;
        if (j < nvec) {
            float v[V], r[V];
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = rg.rstd * (dn_reg[k][e] - a - xn_reg[k][e] * b);
            if (dres) {
                unpack<T>(ldg16(dres + (int64_t)j * V), r);
#pragma unroll
                for (int e = 0; e < V; ++e) v[e] += r[e];
            }
            stg16(dx + (int64_t)j * V, pack<T>(v));
        }
    }
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
#pragma unroll
            for (int e = 0; e < W; ++e) {
                const float xn = (xv[e] - mean) * rstd;
                float g = dv[e];
                if (d.act != ACT_NONE) g *= dact_f(d.act, xn * gam[e] + sh[e]);
                acc_g[e] += g * xn;
                acc_b[e] += g;
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
}

template <typename T>
__global__ void __launch_bounds__(256) norm_bwd_reduce_v1(const fp_norm_bwd_desc d, const float *partial,
                                                          int64_t nchunks) {
    const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= d.cols) return;
    float tg = 0.0f, tb = 0.0f;
    for (int64_t c = 0; c < nchunks; ++c) {
        tg += partial[c * d.cols + col];
        tb += partial[(nchunks + c) * d.cols + col];
    }
    if (d.dgamma) static_cast<T *>(d.dgamma)[col] = from_f<T>(tg);
    if (d.dbeta) static_cast<T *>(d.dbeta)[col] = from_f<T>(tb);
    if (d.dbias) static_cast<T *>(d.dbias)[col] = from_f<T>(tb);
}

// ---------------------------------------------------------------------------
// Launchers
// ---------------------------------------------------------------------------
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
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

template <typename T>
static cudaError_t launch_dx(const fp_norm_bwd_desc &d, cudaStream_t stream) {
    constexpr int V = Vec<T>::N;
    constexpr int kMaxNV = 32 / V;  // n and dn: <= 64 floats per thread in all
    if (d.rows > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    if (bwd_vectorizable(d, V)) {
        const int64_t nvec = d.cols / V;
        int nv = 0;
        dim3 block, grid;
        if (nvec <= 32 * 4) {  // warp per row
            nv = nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
            block = dim3(32, kBwdWarpRows);
            grid = dim3((unsigned)ceil_div(d.rows, kBwdWarpRows));
        } else {  // block per row: the fewest vectors per thread that fit
            for (int c = 2; c <= kMaxNV; c *= 2)
                if (ceil_div(nvec, c) <= kBwdV2MaxThreads) { nv = c; break; }
            block = dim3(round_up32(ceil_div(nvec, nv ? nv : 1)), 1);
            grid = dim3((unsigned)d.rows);
        }
        if (nv) {
            switch (nv) {
            case 1: launch_dx_v2<T, 1>(d, grid, block, stream); break;
            case 2: launch_dx_v2<T, 2>(d, grid, block, stream); break;
            case 4: launch_dx_v2<T, 4>(d, grid, block, stream); break;
            default:
                if constexpr (kMaxNV >= 8) launch_dx_v2<T, kMaxNV>(d, grid, block, stream);
                break;
            }
            return cudaGetLastError();
        }
    }
    const int threads = (int)(d.cols < kBwdV1Threads ? round_up32(d.cols) : kBwdV1Threads);
    norm_bwd_dx_v1<T><<<(unsigned)d.rows, threads, 0, stream>>>(d);
    return cudaGetLastError();
}

// dgamma/dbeta first: they re-read dout, and dx may alias dout.
template <typename T>
static cudaError_t bwd_dispatch(const fp_norm_bwd_desc &d, float *partial, cudaStream_t stream) {
    cudaError_t err;
    if (d.dgamma || d.dbeta || d.dbias) {
        if (!partial) return cudaErrorInvalidValue;
        const int64_t rpc = bwd_rows_per_chunk(d.rows), nchunks = ceil_div(d.rows, rpc);
        constexpr int V = Vec<T>::N;
        const bool vec = bwd_vectorizable(d, V);
        const int64_t tiles = ceil_div(d.cols, (int64_t)kParamTileCols * (vec ? V : 1));
        if (tiles > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
        dim3 grid((unsigned)tiles, (unsigned)nchunks), block(kParamTileCols, kParamRowThreads);
        if (vec) norm_bwd_dparams<T, V><<<grid, block, 0, stream>>>(d, partial, rpc);
        else norm_bwd_dparams<T, 1><<<grid, block, 0, stream>>>(d, partial, rpc);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
        norm_bwd_reduce_v1<T><<<(unsigned)ceil_div(d.cols, 256), 256, 0, stream>>>(d, partial, nchunks);
        if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    return launch_dx<T>(d, stream);
}

// ---------------------------------------------------------------------------
// Unfused baseline: activation backward (g = dout * act'(y), written to dx);
// norm backward on g (dgamma/dbeta, dx in place); dx += dres. Each step is a
// separate pass over the tensor, as separate framework ops would run.
// ---------------------------------------------------------------------------
enum { EWB_DACT = 0, EWB_ADD = 1 };

template <typename T, bool VECTOR>
__global__ void __launch_bounds__(256) norm_bwd_unfused_elementwise(const fp_norm_bwd_desc d, int op) {
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
    if ((err = bwd_dispatch<T>(n, partial, stream)) != cudaSuccess) return err;
    if (d.dres) return bwd_unfused_step<T>(d, EWB_ADD, stream);
    return cudaSuccess;
}

}  // namespace fpnorm

using namespace fpnorm;

extern "C" size_t fp_norm_bwd_partial_floats(const fp_norm_bwd_desc *d) {
    if (!(d->dgamma || d->dbeta || d->dbias)) return 0;
    const int64_t nchunks = ceil_div(d->rows, bwd_rows_per_chunk(d->rows));
    return (size_t)(2 * nchunks * d->cols);
}

extern "C" cudaError_t fp_norm_bwd_unfused_launch(const fp_norm_bwd_desc *d, float *partial,
                                                  cudaStream_t stream) {
    switch (d->dtype) {
    case DT_F32: return bwd_unfused_dispatch<float>(*d, partial, stream);
    case DT_F16: return bwd_unfused_dispatch<__half>(*d, partial, stream);
    case DT_BF16: return bwd_unfused_dispatch<__nv_bfloat16>(*d, partial, stream);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t fp_norm_bwd_launch(const fp_norm_bwd_desc *d, float *partial, cudaStream_t stream) {
    switch (d->dtype) {
    case DT_F32: return bwd_dispatch<float>(*d, partial, stream);
    case DT_F16: return bwd_dispatch<__half>(*d, partial, stream);
    case DT_BF16: return bwd_dispatch<__nv_bfloat16>(*d, partial, stream);
    }
    return cudaErrorInvalidValue;
}
