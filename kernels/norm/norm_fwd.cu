// Fused forward of LayerNorm / RMSNorm with residual add, affine, bias and
// activation, plus the unfused baseline used by fp_norm_validate.
//
// Kernel versions (fp_norm_fwd_launch(desc, version, stream)): 0 = automatic
// (v2 where the row fits its registers, else v3, else v1; v4 instead of v2
// under FP_NORM_FWD_PERSIST=1); 1, 2, 3 ask for that kernel, v1 where it does
// not apply; 4 asks for v4, the automatic choice where it does not apply:
//   norm_fwd_v1  any shape, any alignment: a block per row, scalar loads, the
//                row re-read through L1/L2 for each of its three passes (sum,
//                squared deviations, output). Fallback for misaligned
//                pointers, cols or strides not a multiple of the vector width,
//                and rows too long for v2 and v3.
//   norm_fwd_v2  the row in registers: 16-byte vector loads, NV vectors per
//                thread, blockDim.x threads per row: a warp per row (4 rows
//                per block) when the row fits 32 threads x 4 vectors, else a
//                block per row (<= 512 threads). Two-pass variance over the
//                registers (LayerNorm in a block per row: the mean, then the
//                squared deviations, two reductions; one reduction of each
//                thread's moments, row_moments, is opt-in: kernel_desc); one read
//                of x/residual, one write of out/res_out. The activation's
//                switch is taken once per 16-byte vector (act_vec).
//   norm_fwd_v3  rows beyond v2's registers (aligned, > 512 threads x 32
//                elements): the row's s = x (+ residual) staged in shared
//                memory in T (exact: s is rounded to T), 16-byte vectors, a
//                block of 512 threads per row; one read of x/residual, one
//                write of out/res_out as v2 (v1 reads the row three times).
//                Rows up to the device's opt-in shared memory (H100 227 KB:
//                ~116K 16-bit or ~58K f32 cols).
//   norm_fwd_v4  v2's rows in persistent CTAs (a grid of the CTAs that fit
//                the device at once): the next row's x / residual loaded
//                during this row's reduction and stores, gamma / beta /
//                bias optionally kept in registers (NV <= 2), streaming
//                loads, one barrier per reduction. v2's shapes up to NV 4
//                (f32: cols <= 8192). Opt-in until a GPU measures it
//                against v2 (gpu-check ab-nfwd4).
//   unfused      baseline: elementwise add (vectorized when aligned); norm
//                (norm_fwd_v2/v3/v1 with nothing fused); elementwise affine;
//                elementwise activation. Each step re-reads the tensor.
// Run: tests/norm/test_norm_gpu (correctness, every version), fastbench
// --scenario norm/... (timing, fused vs unfused).
#include <cstdlib>

#include "common/pdl.cuh"
#include "common/span_stamp.cuh"
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
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    __shared__ float red_smem[32];
    for (int64_t row = blockIdx.x; row < d.rows; row += gridDim.x) norm_fwd_v1_row<T>(d, row, red_smem);
    fp_stamp::end(d.stamp);
}

// ---------------------------------------------------------------------------
// A row in registers, 16-byte vectors: v2's and v4's steps
// ---------------------------------------------------------------------------
// Thread threadIdx.x of a row owns its vectors j = threadIdx.x + k * tpr,
// k < NV (tpr = blockDim.x threads per row); past the row (j >= nvec) it
// holds zeros and stores nothing.

// s = x (+ residual) into s_reg as s - shift, residual_out stored; returns
// the thread's sum of s - shift. kIn: the vectors are in xr / rr; else
// vector k is loaded here, after vector k - 1's residual_out store (v2's
// order 0).
template <typename T, int NV, bool kIn>
__device__ __forceinline__ float row_s(const T *x, const T *res, T *res_out, const uint4 (&xr)[kIn ? NV : 1],
                                       const uint4 (&rr)[kIn ? NV : 1], float shift, int nvec, int tpr,
                                       float (&s_reg)[NV][Vec<T>::N]) {
    constexpr int V = Vec<T>::N;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int j = threadIdx.x + k * tpr;  // vector index in the row
        if (j < nvec) {
            unpack<T>(kIn ? xr[k] : ldg16(x + (int64_t)j * V), s_reg[k]);
            if (res) {
                float r[V];
                unpack<T>(kIn ? rr[k] : ldg16(res + (int64_t)j * V), r);
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
    return acc;
}

// The row's mean (of s - shift; 0 for RMSNorm) and rstd from s_reg and acc
// (row_s's sum). A block per row reduces through shared memory: red0, and
// red1 for LayerNorm's second reduction (d.ln_two_reductions); lead: each
// reduction starts with a barrier (row_sum). Returns the count of reductions
// through shared memory (0 for a warp per row).
template <int NV, int V>
__device__ __forceinline__ int row_stats(const fp_norm_fwd_desc &d, const float (&s_reg)[NV][V], float acc, int nvec,
                                         int tpr, float *red0, float *red1, bool lead, float &mean, float &rstd) {
    const float inv_n = 1.0f / (float)d.cols;
    float sq;  // sum of squared deviations from mean
    mean = 0.0f;
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
    int nred = 1;
    if (d.kind == KIND_LAYERNORM && tpr > 32 && !d.ln_two_reductions) {
        // A block per row: this thread's moments (its mean, then squared
        // deviations from it), merged across the row in one reduction
        // (row_moments).
        int own = 0;
#pragma unroll
        for (int k = 0; k < NV; ++k) own += threadIdx.x + k * tpr < nvec;
        float n = (float)(own * V), m = own ? __fdividef(acc, n) : 0.0f, q = sq_dev(m);
        row_moments(n, m, q, red0, lead);
        mean = m;
        sq = q;
    } else {
        if (d.kind == KIND_LAYERNORM) {
            mean = row_sum(acc, red0, lead) * inv_n;
            nred = 2;
        }
        sq = row_sum(sq_dev(mean), nred == 2 ? red1 : red0, lead); // a second pass over the registers
    }
    rstd = rsqrtf(sq * inv_n + d.eps);
    return tpr > 32 ? nred : 0;
}

// gamma / beta / bias of a desc (nullptr: not given).
template <typename T> struct Params {
    const T *gamma, *beta, *bias;
    __device__ __forceinline__ explicit Params(const fp_norm_fwd_desc &d)
        : gamma(static_cast<const T *>(d.gamma)), beta(static_cast<const T *>(d.beta)),
          bias(static_cast<const T *>(d.bias)) {}
};

// out = act((s - mean) rstd gamma + beta + bias) for the thread's vectors.
// kIn: gamma / beta / bias vectors in gr / br / cr; else loaded here.
template <typename T, int NV, bool kIn>
__device__ __forceinline__ void row_out(const fp_norm_fwd_desc &d, const float (&s_reg)[NV][Vec<T>::N], float mean,
                                        float rstd, int nvec, int tpr, T *out, const uint4 (&gr)[kIn ? NV : 1],
                                        const uint4 (&br)[kIn ? NV : 1], const uint4 (&cr)[kIn ? NV : 1]) {
    constexpr int V = Vec<T>::N;
    const auto [gamma, beta, bias] = Params<T>(d);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int j = threadIdx.x + k * tpr;
        if (j < nvec) {
            float y[V], p[V];
#pragma unroll
            for (int e = 0; e < V; ++e) y[e] = (s_reg[k][e] - mean) * rstd;
            if (gamma) {
                unpack<T>(kIn ? gr[k] : ldg16(gamma + (int64_t)j * V), p);
#pragma unroll
                for (int e = 0; e < V; ++e) y[e] *= p[e];
            }
            if (beta || bias) {
                float sh[V];
#pragma unroll
                for (int e = 0; e < V; ++e) sh[e] = 0.0f;
                if (beta) {
                    unpack<T>(kIn ? br[k] : ldg16(beta + (int64_t)j * V), p);
#pragma unroll
                    for (int e = 0; e < V; ++e) sh[e] = p[e];
                }
                if (bias) {
                    unpack<T>(kIn ? cr[k] : ldg16(bias + (int64_t)j * V), p);
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

// gamma / beta / bias vectors of the thread into gr / br / cr.
template <typename T, int NV>
__device__ __forceinline__ void load_params(const fp_norm_fwd_desc &d, int nvec, int tpr, uint4 (&gr)[NV],
                                            uint4 (&br)[NV], uint4 (&cr)[NV]) {
    constexpr int V = Vec<T>::N;
    const Params<T> p(d);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int j = threadIdx.x + k * tpr;
        if (j < nvec) {
            if (p.gamma) gr[k] = ldg16(p.gamma + (int64_t)j * V);
            if (p.beta) br[k] = ldg16(p.beta + (int64_t)j * V);
            if (p.bias) cr[k] = ldg16(p.bias + (int64_t)j * V);
        }
    }
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
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
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
        if constexpr (kParamsEarly) load_params<T, NV>(d, nvec, tpr, gr, br, cr);
    }
    float s_reg[NV][V];
    const float acc = row_s<T, NV, kLoadsFirst>(x, res, res_out, xr, rr, shift, nvec, tpr, s_reg);
    float mean, rstd;
    row_stats(d, s_reg, acc, nvec, tpr, red_smem, red_smem, true, mean, rstd);
    if (threadIdx.x == 0) {
        if (d.mean) d.mean[row] = shift + mean;
        if (d.rstd) d.rstd[row] = rstd;
    }
    row_out<T, NV, kParamsEarly>(d, s_reg, mean, rstd, nvec, tpr, static_cast<T *>(d.out) + row * d.out_stride, gr,
                                 br, cr);
    fp_stamp::end(d.stamp); // thread (0, 0): its row is this CTA's first, always in range
}

// Hides the packed parameters' values from the compiler (an empty asm that
// "writes" them): their conversion to f32 is not hoisted out of v4's row
// loop, which would hold 2 floats a register in place of 2 packed 16-bit
// values (ptxas: bf16 NV 2 at 124 registers with it hoisted).
template <int N>
__device__ __forceinline__ void keep_packed(uint4 (&a)[N], uint4 (&b)[N], uint4 (&c)[N]) {
#if !defined(FP_CUDA_EMU)
#pragma unroll
    for (int k = 0; k < N; ++k) {
        asm volatile("" : "+r"(a[k].x), "+r"(a[k].y), "+r"(a[k].z), "+r"(a[k].w));
        asm volatile("" : "+r"(b[k].x), "+r"(b[k].y), "+r"(b[k].z), "+r"(b[k].w));
        asm volatile("" : "+r"(c[k].x), "+r"(c[k].y), "+r"(c[k].z), "+r"(c[k].w));
    }
#endif
}

// ---------------------------------------------------------------------------
// v4: v2's row in registers in persistent CTAs
// ---------------------------------------------------------------------------
// The grid is at most the CTAs that fit the device at once, each walking
// the same count of rows (launch_v4_nv); a CTA (a warp, four to a CTA, where
// v2 takes a warp per row) walks rows blockIdx.x, + gridDim.x, ... (rows of
// a CTA: blockDim.y apart). Per row, against v2:
//   - the next row's x / residual vectors are issued as soon as this row's
//     are in s_reg, before its reduction and its stores: a row's DRAM
//     round trip hides under the previous row's work (v2 overlaps rows
//     only across CTAs, each CTA waiting on its own row's loads);
//   - gamma / beta / bias can stay in registers for the whole grid walk at
//     NV <= 2 (kParams, FP_NORM_FWD_V4_PARAMS=1), where v2 reloads them from
//     L1 every row; not by default: they halve the CTAs an SM holds
//     (v4_params_in_regs);
//   - x / residual read with the streaming hint (ld.global.cs: evict first
//     in L1 and L2; each is read once), the stores left as they are (the
//     next op reads out and residual_out);
//   - one barrier per reduction: red_smem alternates between two buffers
//     (row_sum's lead = false), the reduction in between keeping a buffer's
//     readers ahead of its next writers.
// Exact as v2: the next row's loads touch another row than the stores of
// this one (out may alias x, residual_out residual, element for element),
// and x[0] (LayerNorm's shift) of a row is read before the row is written.
// No CTA launch per row; rows past gridDim.x * blockDim.y (v2's grid limit)
// are walked too.
template <typename T, int NV, bool kParams>
__global__ void __launch_bounds__(kV2MaxThreads) norm_fwd_v4(const fp_norm_fwd_desc d) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
    constexpr int V = Vec<T>::N;
    __shared__ float red_smem[2][48];
    int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
    const int64_t step = (int64_t)gridDim.x * blockDim.y;
    // As v2: a warp per row leaves per warp, a block per row as a block
    // (blockDim.y == 1: row and step are uniform across the block).
    if (row >= d.rows) return;
    const int nvec = (int)(d.cols / V);
    const int tpr = blockDim.x;
    uint4 gr[kParams ? NV : 1], br[kParams ? NV : 1], cr[kParams ? NV : 1];
    if constexpr (kParams) load_params<T, NV>(d, nvec, tpr, gr, br, cr);
    uint4 xr[NV], rr[NV];
    float shift_next = 0.0f;
    auto load_row = [&](int64_t r) {
        const T *x = static_cast<const T *>(d.x) + r * d.x_stride;
        const T *res = d.res ? static_cast<const T *>(d.res) + r * d.res_stride : nullptr;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const int j = threadIdx.x + k * tpr;
            if (j < nvec) {
                xr[k] = __ldcs(reinterpret_cast<const uint4 *>(x + (int64_t)j * V));
                if (res) rr[k] = __ldcs(reinterpret_cast<const uint4 *>(res + (int64_t)j * V));
            }
        }
        if (d.kind == KIND_LAYERNORM) shift_next = to_f(x[0]);
    };
    load_row(row);
    int buf = 0;
    for (; row < d.rows; row += step) {
        if constexpr (kParams) keep_packed(gr, br, cr);
        const float shift = shift_next;
        T *res_out = d.res_out ? static_cast<T *>(d.res_out) + row * d.res_out_stride : nullptr;
        float s_reg[NV][V];
        // (x and residual: the vectors are in xr / rr; res only says whether a residual is added)
        const float acc = row_s<T, NV, true>(nullptr, static_cast<const T *>(d.res), res_out, xr, rr, shift, nvec,
                                             tpr, s_reg);
        if (row + step < d.rows) load_row(row + step);  // in flight through this row's reduction and stores
        float mean, rstd;
        const int nred = row_stats(d, s_reg, acc, nvec, tpr, red_smem[buf], red_smem[buf ^ 1], false, mean, rstd);
        buf ^= nred & 1;
        if (threadIdx.x == 0) {
            if (d.mean) d.mean[row] = shift + mean;
            if (d.rstd) d.rstd[row] = rstd;
        }
        row_out<T, NV, kParams>(d, s_reg, mean, rstd, nvec, tpr, static_cast<T *>(d.out) + row * d.out_stride, gr,
                                br, cr);
    }
    fp_stamp::end(d.stamp); // thread (0, 0): its first row is in range
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
    fp_stamp::begin(d.stamp); // the kernel timer (span_stamp.cuh)
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
    fp_stamp::end(d.stamp);
}

// ---------------------------------------------------------------------------
// Unfused baseline: one elementwise kernel per step (op is uniform).
// ---------------------------------------------------------------------------
enum { EW_ADD = 0, EW_AFFINE = 1, EW_ACT = 2 };

// Grid: x over column chunks of blockDim.x * (VECTOR ? V : 1) elements, y over
// rows (grid-stride when rows > gridDim.y).
template <typename T, bool VECTOR>
__global__ void __launch_bounds__(256) norm_unfused_elementwise(const fp_norm_fwd_desc d, int op) {
    fp_stamp::begin(d.stamp);
    constexpr int W = VECTOR ? Vec<T>::N : 1;
    const int64_t j0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
    if (j0 >= d.cols) return; // not thread 0: the grid's x covers cols
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
    fp_stamp::end(d.stamp);
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

// v2's and v4's shape of a row: NV (vectors per thread) and the block (a
// warp per row, kWarpRows to a block, or a block of <= 512 threads per row);
// false if the row does not fit the registers of one block.
template <typename T>
static bool row_shape(const fp_norm_fwd_desc &d, int *nv, dim3 *block) {
    constexpr int V = Vec<T>::N;
    constexpr int kMaxNV = 32 / V;  // <= 32 floats of row per thread: no spills
    const int64_t nvec = d.cols / V;
    if (nvec <= 32 * 4) {  // warp per row
        *nv = nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
        *block = dim3(32, kWarpRows);
        return true;
    }
    // block per row: the fewest vectors per thread that fit 512 threads
    for (int c = 2; c <= kMaxNV; c *= 2)
        if (ceil_div(nvec, c) <= kV2MaxThreads) {
            *nv = c;
            *block = dim3(round_up32(ceil_div(nvec, c)), 1);
            return true;
        }
    return false;
}

// Picks NV and threads per row (row_shape); false if the row does not fit
// the registers of one block, or the grid (a CTA per row or per kWarpRows
// rows) passes gridDim.x (then v3 or v1 runs).
template <typename T>
static bool launch_v2(const fp_norm_fwd_desc &d, cudaStream_t stream, cudaError_t *err) {
    constexpr int kMaxNV = 32 / Vec<T>::N;
    int nv;
    dim3 block;
    if (!row_shape<T>(d, &nv, &block)) return false;
    const int64_t ctas = ceil_div(d.rows, (int64_t)block.y);
    if (ctas > kMaxGrid) return false;
    const dim3 grid((unsigned)ctas);
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

// FP_NORM_FWD_PERSIST (read once): 1 makes the automatic choice (version 0)
// take v4 wherever it applies, for the GPU check's A/B against v2; unset,
// 0 or anything else: the automatic choice as before v4 (v2, v3, v1).
static bool v4_forced() {
    static const bool forced = env_switch("FP_NORM_FWD_PERSIST", 1) == 1;
    return forced;
}

// FP_NORM_FWD_V4_PARAMS (read once): 1 keeps gamma / beta / bias in
// registers across v4's rows at NV <= 2 for every call (a version request's
// FP_NORM_VOPT_V4_PARAMS for one: kernel_desc sets d.v4_params); else they
// are loaded per row (L1 hits) as in v2. Kept in registers they cost ~36
// registers (sm_90, bf16 NV 2: 100 against 64, so 2 CTAs of 256 threads per
// SM instead of 4, half the rows in flight): the GPU check measures both
// (ab-nfwd4, ab-nfwd4p).
static bool v4_params_in_regs() {
    static const bool on = env_switch("FP_NORM_FWD_V4_PARAMS", 1) == 1;
    return on;
}

template <typename T, int NV, bool kParams>
static cudaError_t launch_v4_nv(const fp_norm_fwd_desc &d, dim3 block, cudaStream_t stream) {
    constexpr auto kernel = norm_fwd_v4<T, NV, kParams>;
    const int threads = (int)(block.x * block.y);
    int per_sm = 0;
    cudaError_t err = occupancy_once(&per_sm, kernel, threads, 0);
    if (err != cudaSuccess) return err;
    // At most as many CTAs as fit the device at once (an unknown SM count,
    // 0 in direct launches of tests, counts as one SM), and the fewest that
    // give each the same count of rows (of CTA-rows: blockDim.y rows) as the
    // most loaded one: 16384 rows on 528 CTAs would leave 16 CTAs a 32nd row
    // while 512 wait (3% of the time at a fraction of the bandwidth); 512
    // CTAs of 32 rows end together.
    const int64_t fit = (int64_t)(d.sm_count > 0 ? d.sm_count : 1) * (per_sm > 0 ? per_sm : 1);
    const int64_t units = ceil_div(d.rows, (int64_t)block.y);
    const int64_t ctas = ceil_div(units, ceil_div(units, fit));
    return fp_pdl::launch<kernel>(dim3((unsigned)ctas), block, 0, stream, d.pdl != 0, d);
}

// v4 (persistent CTAs) on v2's row shape: false (the automatic choice runs)
// where the row does not fit v2, or NV > 4 (f32 rows of 8193 to 16384 cols:
// the prefetched row would spill).
template <typename T>
static bool launch_v4(const fp_norm_fwd_desc &d, cudaStream_t stream, cudaError_t *err) {
    int nv;
    dim3 block;
    if (!row_shape<T>(d, &nv, &block)) return false;
    const bool params = d.v4_params != 0;
    switch (nv) {
    case 1:
        *err = params ? launch_v4_nv<T, 1, true>(d, block, stream) : launch_v4_nv<T, 1, false>(d, block, stream);
        return true;
    case 2:
        *err = params ? launch_v4_nv<T, 2, true>(d, block, stream) : launch_v4_nv<T, 2, false>(d, block, stream);
        return true;
    case 4: *err = launch_v4_nv<T, 4, false>(d, block, stream); return true;
    default: return false;
    }
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
        if ((version == 4 || (version == 0 && v4_forced())) && launch_v4<T>(d, stream, &err)) return err;
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
// v2's / v4's block per row through two reductions (the mean, then the
// squared deviations: two barrier pairs), or through one reduction of the
// threads' moments (row_moments) under FP_NORM_VOPT_ONE_REDUCTION or
// FP_NORM_FWD_LN_STATS=1 (read once; FP_NORM_VOPT_TWO_REDUCTIONS or
// FP_NORM_FWD_LN_STATS=2 keep two). One reduction was session 28's default
// (half the barriers, predicted 86-89% of copy bandwidth for the plain
// LayerNorm); the H200 measured it at 0.87x / 0.90x the two reductions
// without a residual at 16384 x 4096 / 8192 x 8192, bf16 (session 41,
// norm/kernel_ab, interleaved), so two are the default again. v4 keeps
// gamma / beta / bias in registers under FP_NORM_VOPT_V4_PARAMS or
// FP_NORM_FWD_V4_PARAMS=1.
static fp_norm_fwd_desc kernel_desc(const fp_norm_fwd_desc *d, int version) {
    static const int env_stats = env_switch("FP_NORM_FWD_LN_STATS", 2);
    fp_norm_fwd_desc r = *d;
    r.act = kernel_act(d->act, version);
    const bool one = (env_stats == 1 || (version & FP_NORM_VOPT_ONE_REDUCTION)) && env_stats != 2 &&
                     !(version & FP_NORM_VOPT_TWO_REDUCTIONS);
    r.ln_two_reductions = !one;
    r.v4_params = v4_params_in_regs() || (version & FP_NORM_VOPT_V4_PARAMS);
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
