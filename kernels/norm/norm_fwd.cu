// Fused forward of LayerNorm / RMSNorm with residual add, affine, bias and
// activation, plus the unfused baseline used by fp_norm_validate.
//
// Kernel versions (fp_norm_fwd_launch(desc, version, stream)): 0 = automatic
// (v2 where the row fits its registers, else v3, else v1); 1, 2, 3 ask for
// that kernel, v1 where it does not apply:
//   norm_fwd_v1  any shape, any alignment: a block per row, scalar loads, the
//                row re-read through L1/L2 for each of its three passes (sum,
//                squared deviations, output). Fallback for misaligned
//                pointers, cols or strides not a multiple of the vector width,
//                and rows too long for v2 and v3.
//   norm_fwd_v2  the row in registers: 16-byte vector loads, NV vectors per
//                thread, blockDim.x threads per row: a warp per row (4 rows
//                per block) when the row fits 32 threads x 4 vectors, else a
//                block per row (<= 512 threads). Two-pass variance over the
//                registers (a block per row: each thread's mean and squared
//                deviations, merged in one reduction: row_moments); one read
//                of x/residual, one write of out/res_out. The activation's
//                switch is taken once per 16-byte vector (act_vec).
//   norm_fwd_v3  rows beyond v2's registers (aligned, > 512 threads x 32
//                elements): the row's s = x (+ residual) staged in shared
//                memory in T (exact: s is rounded to T), 16-byte vectors, a
//                block of 512 threads per row; one read of x/residual, one
//                write of out/res_out as v2 (v1 reads the row three times).
//                Rows up to the device's opt-in shared memory (H100 227 KB:
//                ~116K 16-bit or ~58K f32 cols).
//   unfused      baseline: elementwise add (vectorized when aligned); norm
//                (norm_fwd_v2/v3/v1 with nothing fused); elementwise affine;
//                elementwise activation. Each step re-reads the tensor.
// Run: tests/norm/test_norm_gpu (correctness, every version), fastbench
// --scenario norm/... (timing, fused vs unfused).
#include <cstdlib>

#include "common/pdl.cuh"
#include "norm/norm_common.cuh"

namespace fpnorm {

// (rows, cols) row-major with row strides; gamma/beta/bias [cols].
constexpr int kV1Threads = 256;
constexpr int kV2MaxThreads = 512;
constexpr int kWarpRows = 4;  // rows per block in warp-per-row mode
constexpr int64_t kMaxGrid = 0x7fffffffLL;  // gridDim.x limit

// ---------------------------------------------------------------------------
// v1: scalar, any shape
// ---------------------------------------------------------------------------
template <typename T>
__device__ __forceinline__ void norm_fwd_v1_row(const fp_norm_fwd_desc &d, int64_t row, float *red_smem) {
    const int64_t n = d.cols;
    const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
    const T *res = d.res ? static_cast<const T *>(d.res) + row * d.res_stride : nullptr;
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);
    // s = round_T(x + res), recomputed in each pass (res_out is written only
    // in the last pass so that it may alias res).
    auto load_s = [&](int64_t j) {
        float v = to_f(x[j]);
        return res ? round_to<T>(v + to_f(res[j])) : v;
    };
    // LayerNorm sums s - shift with shift = x[0]: near the data, so the f32
    // sums carry no large offset (a mean of 1e4 with a spread of 1 keeps its
    // digits); mean = shift + delta.
    const float shift = d.kind == KIND_LAYERNORM ? to_f(x[0]) : 0.0f;
    float delta = 0.0f;
    if (d.kind == KIND_LAYERNORM) {
        float acc = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) acc += load_s(j) - shift;
        delta = row_sum(acc, red_smem) / (float)n;
    }
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float t = (load_s(j) - shift) - delta;
        acc += t * t;
    }
    const float rstd = rsqrtf(row_sum(acc, red_smem) / (float)n + d.eps);
    if (threadIdx.x == 0) {
        if (d.mean) d.mean[row] = shift + delta;
        if (d.rstd) d.rstd[row] = rstd;
    }
    T *out = static_cast<T *>(d.out) + row * d.out_stride;
    T *res_out = d.res_out ? static_cast<T *>(d.res_out) + row * d.res_out_stride : nullptr;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float s = load_s(j);
        if (res_out) res_out[j] = from_f<T>(s);
        float y = ((s - shift) - delta) * rstd;
        if (gamma) y *= to_f(gamma[j]);
        float sh = beta ? to_f(beta[j]) : 0.0f;
        if (bias) sh += to_f(bias[j]);
        out[j] = from_f<T>(act_f(d.act, y + sh));
    }
}

// A block per row; rows beyond the grid (rows > kMaxGrid) in a block-stride
// loop, uniform across the block (the barriers in row_sum stay convergent).
template <typename T>
__global__ void __launch_bounds__(kV1Threads) norm_fwd_v1(const fp_norm_fwd_desc d) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    __shared__ float red_smem[32];
    for (int64_t row = blockIdx.x; row < d.rows; row += gridDim.x) norm_fwd_v1_row<T>(d, row, red_smem);
}

// ---------------------------------------------------------------------------
// v2: row in registers, 16-byte vectors
// ---------------------------------------------------------------------------
// Three load orders (kOrder), chosen per launch by launch_v2:
//   1  every x / residual vector of the thread and, up to NV = 4, its
//      gamma / beta / bias vectors are issued before the first store and
//      before the reduction: a row waits on one DRAM round trip instead of
//      NV + 1. Costs registers (bf16 at NV = 2: 62 against 38), so fewer
//      CTAs per SM.
//   2  x / residual first, the parameters after the reduction: fewer
//      registers than 1, one round trip more.
//   0  x / residual vector k loaded after vector k - 1's residual_out store
//      (the compiler cannot move a load above a store that may alias it),
//      the parameters after the reduction: the order before these three.
// Each is exact: out may alias x and residual_out residual only element for
// element, and each thread reads its own elements before writing them.
template <typename T, int NV, int kOrder>
__global__ void __launch_bounds__(kV2MaxThreads) norm_fwd_v2(const fp_norm_fwd_desc d) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    constexpr int V = Vec<T>::N;
    constexpr bool kLoadsFirst = kOrder >= 1;
    // Parameters in registers from the start (kOrder 1): 4 more registers
    // per vector and parameter; past NV = 4 (f32 rows of > 4 vectors per
    // thread) they would spill, and load after the reduction as in kOrder 2.
    constexpr bool kParamsEarly = kOrder == 1 && NV <= 4;
    __shared__ float red_smem[48];  // row_moments: 48; row_sum: 32
    const int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    // Warp-per-row: a whole warp leaves together (no block barrier in that
    // mode). Block-per-row: blockDim.y == 1 and the whole block leaves.
    if (row >= d.rows) return;
    const int nvec = (int)(d.cols / V);
    const int tpr = blockDim.x;
    const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
    const T *res = d.res ? static_cast<const T *>(d.res) + row * d.res_stride : nullptr;
    T *res_out = d.res_out ? static_cast<T *>(d.res_out) + row * d.res_out_stride : nullptr;
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);

    // s_reg holds s - shift (see norm_fwd_v1). x[0] is read before any
    // thread writes out (which may alias x): the writes come after row_sum.
    const float shift = d.kind == KIND_LAYERNORM ? to_f(x[0]) : 0.0f;
    uint4 xr[kLoadsFirst ? NV : 1], rr[kLoadsFirst ? NV : 1];
    uint4 gr[kParamsEarly ? NV : 1], br[kParamsEarly ? NV : 1], cr[kParamsEarly ? NV : 1];
    if constexpr (kLoadsFirst) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int j = threadIdx.x + k * tpr;
            if (j < nvec) {
                xr[k] = ldg16(x + (int64_t)j * V);
                if (res) rr[k] = ldg16(res + (int64_t)j * V);
            }
        }
        if constexpr (kParamsEarly) {
#pragma unroll
            for (int k = 0; k < NV; ++k) {
                const int j = threadIdx.x + k * tpr;
                if (j < nvec) {
                    if (gamma) gr[k] = ldg16(gamma + (int64_t)j * V);
                    if (beta) br[k] = ldg16(beta + (int64_t)j * V);
                    if (bias) cr[k] = ldg16(bias + (int64_t)j * V);
                }
            }
        }
    }
    float s_reg[NV][V];
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int j = threadIdx.x + k * tpr;  // vector index in the row
        if (j < nvec) {
            unpack<T>(kLoadsFirst ? xr[k] : ldg16(x + (int64_t)j * V), s_reg[k]);
            if (res) {
                float r[V];
                unpack<T>(kLoadsFirst ? rr[k] : ldg16(res + (int64_t)j * V), r);
#pragma unroll
                for (int e = 0; e < V; ++e) s_reg[k][e] = round_to<T>(s_reg[k][e] + r[e]);
            }
            if (res_out) stg16(res_out + (int64_t)j * V, pack<T>(s_reg[k]));
#pragma unroll
            for (int e = 0; e < V; ++e) {
                s_reg[k][e] -= shift;
                acc += s_reg[k][e];
            }
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) s_reg[k][e] = 0.0f;
        }
    }
    const float inv_n = 1.0f / (float)d.cols;
    float mean = 0.0f;  // of s - shift
    float sq;           // sum of squared deviations from mean
    // this thread's squared deviations from c over its registers (no cancellation)
    auto sq_dev = [&](float c) {
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            if (threadIdx.x + k * tpr < nvec) {
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float t = s_reg[k][e] - c;
                    q += t * t;
                }
            }
        }
        return q;
    };
    if (d.kind == KIND_LAYERNORM && tpr > 32 && !d.ln_two_reductions) {
        // A block per row: this thread's moments (its mean, then squared
        // deviations from it), merged across the row in one reduction
        // (row_moments).
        int own = 0;
#pragma unroll
        for (int k = 0; k < NV; ++k) own += threadIdx.x + k * tpr < nvec;
        float n = (float)(own * V), m = own ? __fdividef(acc, n) : 0.0f, q = sq_dev(m);
        row_moments(n, m, q, red_smem);
        mean = m;
        sq = q;
    } else {
        if (d.kind == KIND_LAYERNORM) mean = row_sum(acc, red_smem) * inv_n;
        sq = row_sum(sq_dev(mean), red_smem); // a second pass over the registers
    }
    const float rstd = rsqrtf(sq * inv_n + d.eps);
    if (threadIdx.x == 0) {
        if (d.mean) d.mean[row] = shift + mean;
        if (d.rstd) d.rstd[row] = rstd;
    }
    T *out = static_cast<T *>(d.out) + row * d.out_stride;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int j = threadIdx.x + k * tpr;
        if (j < nvec) {
            float y[V], p[V];
#pragma unroll
            for (int e = 0; e < V; ++e) y[e] = (s_reg[k][e] - mean) * rstd;
            if (gamma) {
                unpack<T>(kParamsEarly ? gr[k] : ldg16(gamma + (int64_t)j * V), p);
#pragma unroll
                for (int e = 0; e < V; ++e) y[e] *= p[e];
            }
            if (beta || bias) {
                float sh[V];
#pragma unroll
                for (int e = 0; e < V; ++e) sh[e] = 0.0f;
                if (beta) {
                    unpack<T>(kParamsEarly ? br[k] : ldg16(beta + (int64_t)j * V), p);
#pragma unroll
                    for (int e = 0; e < V; ++e) sh[e] = p[e];
                }
                if (bias) {
                    unpack<T>(kParamsEarly ? cr[k] : ldg16(bias + (int64_t)j * V), p);
#pragma unroll
                    for (int e = 0; e < V; ++e) sh[e] += p[e];
                }
#pragma unroll
                for (int e = 0; e < V; ++e) y[e] += sh[e];
            }
            act_vec<V>(d.act, y);
            stg16(out + (int64_t)j * V, pack<T>(y));
        }
    }
}

// ---------------------------------------------------------------------------
// v3: the row staged in shared memory, 16-byte vectors
// ---------------------------------------------------------------------------
constexpr int kV3Threads = 512;

// A block per row (a block-stride loop beyond gridDim.x). Each thread owns
// the same vectors j = threadIdx.x + k * blockDim.x in all three passes, so
// its staged cells need no barrier; row_sum's barriers keep red_smem safe.
template <typename T>
__global__ void __launch_bounds__(kV3Threads) norm_fwd_v3(const fp_norm_fwd_desc d) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    constexpr int V = Vec<T>::N;
    extern __shared__ uint4 fwd_stage_smem[];  // cols / V vectors of s
    __shared__ float red_smem[32];
    const int nvec = (int)(d.cols / V);
    const float inv_n = 1.0f / (float)d.cols;
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);
    for (int64_t row = blockIdx.x; row < d.rows; row += gridDim.x) {
        const T *x = static_cast<const T *>(d.x) + row * d.x_stride;
        const T *res = d.res ? static_cast<const T *>(d.res) + row * d.res_stride : nullptr;
        T *res_out = d.res_out ? static_cast<T *>(d.res_out) + row * d.res_out_stride : nullptr;
        T *out = static_cast<T *>(d.out) + row * d.out_stride;
        // As v2: shift = x[0] before any write of this row (they follow row_sum).
        const float shift = d.kind == KIND_LAYERNORM ? to_f(x[0]) : 0.0f;
        float acc = 0.0f;
#pragma unroll 4
        for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
            float sv[V];
            unpack<T>(ldg16(x + (int64_t)j * V), sv);
            if (res) {
                float r[V];
                unpack<T>(ldg16(res + (int64_t)j * V), r);
#pragma unroll
                for (int e = 0; e < V; ++e) sv[e] = round_to<T>(sv[e] + r[e]);
            }
            const uint4 packed = pack<T>(sv);  // exact: sv holds T values
            if (res_out) stg16(res_out + (int64_t)j * V, packed);
            fwd_stage_smem[j] = packed;
#pragma unroll
            for (int e = 0; e < V; ++e) acc += sv[e] - shift;
        }
        float mean = 0.0f;  // of s - shift
        if (d.kind == KIND_LAYERNORM) mean = row_sum(acc, red_smem) * inv_n;
        acc = 0.0f;
#pragma unroll 4
        for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
            float sv[V];
            const uint4 u = fwd_stage_smem[j];  // one 16-byte LDS, not the vector's halves
            unpack<T>(u, sv);
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float t = (sv[e] - shift) - mean;
                acc += t * t;
            }
        }
        const float rstd = rsqrtf(row_sum(acc, red_smem) * inv_n + d.eps);
        if (threadIdx.x == 0) {
            if (d.mean) d.mean[row] = shift + mean;
            if (d.rstd) d.rstd[row] = rstd;
        }
        // The affine + activation tail is v2's, written out again: as one shared
        // helper it moved v2's register allocation (sm_80 NV 4: 54 -> 64).
#pragma unroll 2
        for (int j = threadIdx.x; j < nvec; j += blockDim.x) {
            float y[V], p[V];
            const uint4 u = fwd_stage_smem[j];
            unpack<T>(u, y);
#pragma unroll
            for (int e = 0; e < V; ++e) y[e] = ((y[e] - shift) - mean) * rstd;
            if (gamma) {
                unpack<T>(ldg16(gamma + (int64_t)j * V), p);
#pragma unroll
                for (int e = 0; e < V; ++e) y[e] *= p[e];
            }
            if (beta || bias) {
                float sh[V];
#pragma unroll
                for (int e = 0; e < V; ++e) sh[e] = 0.0f;
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
#pragma unroll
                for (int e = 0; e < V; ++e) y[e] += sh[e];
            }
            act_vec<V>(d.act, y);
            stg16(out + (int64_t)j * V, pack<T>(y));
        }
    }
}

// ---------------------------------------------------------------------------
// Unfused baseline: one elementwise kernel per step (op is uniform).
// ---------------------------------------------------------------------------
enum { EW_ADD = 0, EW_AFFINE = 1, EW_ACT = 2 };

// Grid: x over column chunks of blockDim.x * (VECTOR ? V : 1) elements, y over
// rows (grid-stride when rows > gridDim.y).
template <typename T, bool VECTOR>
__global__ void __launch_bounds__(256) norm_unfused_elementwise(const fp_norm_fwd_desc d, int op) {
    constexpr int W = VECTOR ? Vec<T>::N : 1;
    const int64_t j0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (j0 >= d.cols) return;
    const T *gamma = static_cast<const T *>(d.gamma);
    const T *beta = static_cast<const T *>(d.beta);
    const T *bias = static_cast<const T *>(d.bias);
    for (int64_t row = blockIdx.y; row < d.rows; row += gridDim.y) {
        T *out = static_cast<T *>(d.out) + row * d.out_stride + j0;
        float a[W], b[W];
        auto load = [&](const T *p, float(&f)[W]) {
            if constexpr (VECTOR) unpack<T>(ldg16(p), f);
            else f[0] = to_f(*p);
        };
        auto store = [&](T *p, const float(&f)[W]) {
            if constexpr (VECTOR) stg16(p, pack<T>(f));
            else *p = from_f<T>(f[0]);
        };
        if (op == EW_ADD) {  // out = x + res (res may be absent: a copy to res_out)
            load(static_cast<const T *>(d.x) + row * d.x_stride + j0, a);
            if (d.res) {
                load(static_cast<const T *>(d.res) + row * d.res_stride + j0, b);
#pragma unroll
                for (int e = 0; e < W; ++e) a[e] += b[e];
                store(out, a);
            }
            if (d.res_out) store(static_cast<T *>(d.res_out) + row * d.res_out_stride + j0, a);
        } else if (op == EW_AFFINE) {
            load(out, a);
            if (gamma) {
                load(gamma + j0, b);
#pragma unroll
                for (int e = 0; e < W; ++e) a[e] *= b[e];
            }
            float sh[W];
#pragma unroll
            for (int e = 0; e < W; ++e) sh[e] = 0.0f;
            if (beta) {
                load(beta + j0, b);
#pragma unroll
                for (int e = 0; e < W; ++e) sh[e] = b[e];
            }
            if (bias) {
                load(bias + j0, b);
#pragma unroll
                for (int e = 0; e < W; ++e) sh[e] += b[e];
            }
#pragma unroll
            for (int e = 0; e < W; ++e) a[e] += sh[e];
            store(out, a);
        } else {
            load(out, a);
#pragma unroll
            for (int e = 0; e < W; ++e) a[e] = act_f(d.act, a[e]);
            store(out, a);
        }
    }
}

// ---------------------------------------------------------------------------
// Launchers
// ---------------------------------------------------------------------------
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int round_up32(int64_t v) { return (int)(ceil_div(v, 32) * 32); }
// v1's grid: a block per row up to gridDim.x's limit, the kernel loops beyond
// (rows > 2^31 - 1 happen with few cols, e.g. 3e9 x 1 f32 = 12 GB).
static unsigned v1_grid(int64_t rows) { return (unsigned)(rows < kMaxGrid ? rows : kMaxGrid); }

// Every tensor / vector pointer 16-byte aligned, cols and strides multiples of
// the vector width: the preconditions of the vectorized kernels.
static bool fwd_vectorizable(const fp_norm_fwd_desc &d, int V) {
    const void *ptrs[] = {d.x, d.res, d.res_out, d.out, d.gamma, d.beta, d.bias};
    for (const void *p : ptrs)
        if (p && !aligned16(p)) return false;
    if (d.cols % V) return false;
    if (d.x_stride % V || d.out_stride % V) return false;
    if (d.res && d.res_stride % V) return false;
    if (d.res_out && d.res_out_stride % V) return false;
    return true;
}

template <typename T>
static cudaError_t launch_v1(const fp_norm_fwd_desc &d, cudaStream_t stream) {
    const int threads = (int)(d.cols < kV1Threads ? round_up32(d.cols) : kV1Threads);
    return fp_pdl::launch<norm_fwd_v1<T>>(dim3(v1_grid(d.rows)), dim3(threads), 0, stream, d.pdl != 0, d);
}

// FP_NORM_FWD_V2_ORDER (read once): 0, 1 or 2 forces that order whatever
// the grid; unset (or anything else): launch_v2 chooses. For the A/B runs of
// the GPU check.
static int v2_order_forced() {
    static const int forced = env_switch("FP_NORM_FWD_V2_ORDER", 2);
    return forced;
}

// The order by the grid (an unknown SM count, 0 in direct launches of
// tests, counts as a small grid): 1 where the grid has at most one CTA per
// SM (latency-bound: each SM holds a row or a few; the decode step's rows),
// else 2. Measured on an H100 (bf16, 4096 cols, fastbench norm/* at 1, 1024,
// 2048 and 16384 rows, every order in one run, 2026-11-26, commit b0cb478;
// benchmarks/NOTES.md session 13):
//   1 row: 1 fastest (ncu, the decode step: 4.5 against 5.1-6.2 us for 0);
//   1024 rows: 2 fastest or tied with 1 (RMSNorm 7.8 against 8.4 and 8.7 us);
//   16384 rows with residual, residual_out, bias and GELU: 2 at 88.9% of
//     copy bandwidth (LayerNorm, 205 us) against 81.5% for 0 and 80.2% for 1;
//     RMSNorm 92.0%; without a residual 2 and 0 within 1% (1 loses 12%:
//     its registers).
// Order 0 stays for A/B runs (FP_NORM_FWD_V2_ORDER=0) only.
static int v2_order(const fp_norm_fwd_desc &d, int64_t ctas) {
    const int forced = v2_order_forced();
    if (forced >= 0) return forced;
    return d.sm_count <= 0 || ctas <= d.sm_count ? 1 : 2;
}

template <typename T, int NV>
static cudaError_t launch_v2_nv(const fp_norm_fwd_desc &d, dim3 grid, dim3 block, cudaStream_t stream) {
    const bool pdl = d.pdl != 0;
    switch (v2_order(d, (int64_t)grid.x)) {
    case 1: return fp_pdl::launch<norm_fwd_v2<T, NV, 1>>(grid, block, 0, stream, pdl, d);
    case 2: return fp_pdl::launch<norm_fwd_v2<T, NV, 2>>(grid, block, 0, stream, pdl, d);
    default: return fp_pdl::launch<norm_fwd_v2<T, NV, 0>>(grid, block, 0, stream, pdl, d);
    }
}

// Picks NV (vectors per thread) and threads per row; false if the row does
// not fit the registers of one block (then v3 or v1 runs).
template <typename T>
static bool launch_v2(const fp_norm_fwd_desc &d, cudaStream_t stream, cudaError_t *err) {
    constexpr int V = Vec<T>::N;
    constexpr int kMaxNV = 32 / V;  // <= 32 floats of row per thread: no spills
    const int64_t nvec = d.cols / V;
    dim3 grid, block;
    int nv;
    if (nvec <= 32 * 4) {  // warp per row
        nv = nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
        block = dim3(32, kWarpRows);
        grid = dim3((unsigned)ceil_div(d.rows, kWarpRows));
        if (ceil_div(d.rows, kWarpRows) > 0x7fffffffLL) return false;
    } else {  // block per row: the fewest vectors per thread that fit 512 threads
        nv = 0;
        for (int c = 2; c <= kMaxNV; c *= 2)
            if (ceil_div(nvec, c) <= kV2MaxThreads) { nv = c; break; }
        if (nv == 0 || d.rows > 0x7fffffffLL) return false;
        block = dim3(round_up32(ceil_div(nvec, nv)), 1);
        grid = dim3((unsigned)d.rows);
    }
    switch (nv) {
    case 1: *err = launch_v2_nv<T, 1>(d, grid, block, stream); break;
    case 2: *err = launch_v2_nv<T, 2>(d, grid, block, stream); break;
    case 4: *err = launch_v2_nv<T, 4>(d, grid, block, stream); break;
    default:
        if constexpr (kMaxNV >= 8) *err = launch_v2_nv<T, kMaxNV>(d, grid, block, stream);
        else *err = cudaErrorInvalidValue;  // unreachable: nv is 1, 2, 4 or kMaxNV
        break;
    }
    return true;
}

// v3 for an aligned d: false (v1 runs) when the staged row exceeds the
// device's opt-in shared memory (less the static red_smem).
template <typename T>
static bool launch_v3(const fp_norm_fwd_desc &d, cudaStream_t stream, cudaError_t *err) {
    const size_t smem = (size_t)d.cols * sizeof(T);
    // Without the opt-in a block gets 48 KB, the static red_smem included
    // (16-bit rows of 24576 cols need exactly 48 KB of staged row: opt in).
    if (smem > kDynSmemDefault) {
        size_t avail;
        if (optin_dyn_smem(&avail) != cudaSuccess || smem > avail) return false;  // v1 runs instead
        // Always the device's whole opt-in: a per-call value would race with
        // another host thread launching this kernel for other cols.
        if ((*err = opt_in_once(norm_fwd_v3<T>, (int)avail)) != cudaSuccess)
            return true;
    }
    *err = fp_pdl::launch<norm_fwd_v3<T>>(dim3(v1_grid(d.rows)), dim3(kV3Threads), smem, stream, d.pdl != 0, d);
    return true;
}

template <typename T>
static cudaError_t fwd_dispatch(const fp_norm_fwd_desc &d, int version, cudaStream_t stream) {
    if (version != 1 && fwd_vectorizable(d, Vec<T>::N)) {
        cudaError_t err = cudaSuccess;
        if (version != 3 && launch_v2<T>(d, stream, &err)) return err;
        if (version != 2 && launch_v3<T>(d, stream, &err)) return err;
    }
    return launch_v1<T>(d, stream);
}

template <typename T>
static cudaError_t unfused_step(const fp_norm_fwd_desc &d, int op, cudaStream_t stream) {
    constexpr int V = Vec<T>::N;
    const bool vec = fwd_vectorizable(d, V);
    const int64_t per_block = 256LL * (vec ? V : 1);
    const int64_t gx = ceil_div(d.cols, per_block);
    if (gx > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
    dim3 grid((unsigned)gx, (unsigned)(d.rows < 65535 ? d.rows : 65535));
    if (vec) norm_unfused_elementwise<T, true><<<grid, 256, 0, stream>>>(d, op);
    else norm_unfused_elementwise<T, false><<<grid, 256, 0, stream>>>(d, op);
    return cudaGetLastError();
}

template <typename T>
static cudaError_t unfused_dispatch(const fp_norm_fwd_desc &d, cudaStream_t stream) {
    cudaError_t err;
    if (d.res || d.res_out) {
        if ((err = unfused_step<T>(d, EW_ADD, stream)) != cudaSuccess) return err;
    }
    // Norm alone: input is the sum (in out) or x, output out, stats saved.
    fp_norm_fwd_desc n = d;
    n.res = nullptr;
    n.res_out = nullptr;
    n.gamma = n.beta = n.bias = nullptr;
    n.act = ACT_NONE;
    if (d.res) {
        n.x = d.out;
        n.x_stride = d.out_stride;
    }
    if ((err = fwd_dispatch<T>(n, 0, stream)) != cudaSuccess) return err;
    if (d.gamma || d.beta || d.bias) {
        if ((err = unfused_step<T>(d, EW_AFFINE, stream)) != cudaSuccess) return err;
    }
    if (d.act != ACT_NONE) {
        if ((err = unfused_step<T>(d, EW_ACT, stream)) != cudaSuccess) return err;
    }
    return cudaSuccess;
}

}  // namespace fpnorm

using namespace fpnorm;

// The desc the kernels get for a version request (its FP_NORM_VOPT_* bits):
// the activation's kernel code (kernel_act), and LayerNorm's statistics in
// v2's block per row through one reduction of the threads' moments
// (row_moments), or through two (the mean, then the squared deviations: two
// barrier pairs, as before session 28) under FP_NORM_VOPT_TWO_REDUCTIONS or
// FP_NORM_FWD_LN_STATS=2 (read once).
static fp_norm_fwd_desc kernel_desc(const fp_norm_fwd_desc *d, int version) {
    static const bool env_two = env_switch("FP_NORM_FWD_LN_STATS", 2) == 2;
    fp_norm_fwd_desc r = *d;
    r.act = kernel_act(d->act, version);
    r.ln_two_reductions = env_two || (version & FP_NORM_VOPT_TWO_REDUCTIONS);
    return r;
}

extern "C" cudaError_t fp_norm_fwd_launch(const fp_norm_fwd_desc *d, int version, cudaStream_t stream) {
    const fp_norm_fwd_desc dd = kernel_desc(d, version);
    version &= FP_NORM_VERSION_MASK;
    switch (dd.dtype) {
    case DT_F32: return fwd_dispatch<float>(dd, version, stream);
    case DT_F16: return fwd_dispatch<__half>(dd, version, stream);
    case DT_BF16: return fwd_dispatch<__nv_bfloat16>(dd, version, stream);
    }
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t fp_norm_fwd_unfused_launch(const fp_norm_fwd_desc *d, cudaStream_t stream) {
    const fp_norm_fwd_desc dd = kernel_desc(d, 0);
    switch (dd.dtype) {
    case DT_F32: return unfused_dispatch<float>(dd, stream);
    case DT_F16: return unfused_dispatch<__half>(dd, stream);
    case DT_BF16: return unfused_dispatch<__nv_bfloat16>(dd, stream);
    }
    return cudaErrorInvalidValue;
}
