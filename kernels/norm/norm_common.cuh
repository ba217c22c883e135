// Device helpers shared by the fused-norm kernels: dtype conversion, 16-byte
// vector pack/unpack, activations and their derivatives, row reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include <atomic>
#include <mutex>
#include <type_traits>

#include "common/fast_exp2.cuh"
#include "norm/norm_launch.h"

namespace fpnorm {

// Mirrors of the public enums (kernels do not include the C headers' enums).
enum { KIND_LAYERNORM = 0, KIND_RMSNORM = 1 };
enum { ACT_NONE = 0, ACT_GELU_ERF = 1, ACT_GELU_TANH = 2, ACT_RELU = 3, ACT_SILU = 4 };
enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
// v rounded to T and back: what storing and re-loading gives.
template <typename T> __device__ __forceinline__ float round_to(float v) { return to_f(from_f<T>(v)); }

// Elements per 16-byte vector.
template <typename T> struct Vec { static constexpr int N = 16 / (int)sizeof(T); };

template <typename T>
__device__ __forceinline__ void unpack(const uint4 &u, float (&f)[Vec<T>::N]) {
    const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int i = 0; i < Vec<T>::N; ++i) f[i] = to_f(e[i]);
}
template <typename T>
__device__ __forceinline__ uint4 pack(const float (&f)[Vec<T>::N]) {
    uint4 u;
    T *e = reinterpret_cast<T *>(&u);
#pragma unroll
    for (int i = 0; i < Vec<T>::N; ++i) e[i] = from_f<T>(f[i]);
    return u;
}
// 128-bit global load / store (LDG.E.128 / STG.E.128); p must be 16-byte aligned.
// The store is st.global.wb.v4 by intrinsic: a plain uint4 assignment came out
// of NVVM as 4 scalar st.global.f32 for some (f32, unrolled k >= 2) stores,
// the vector type lost when the packed floats were forwarded (seen in PTX).
__device__ __forceinline__ uint4 ldg16(const void *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }
__device__ __forceinline__ void stg16(void *p, const uint4 &v) { __stwb(reinterpret_cast<uint4 *>(p), v); }

constexpr float kSqrtHalf = 0.70710678118654752f;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

constexpr float kGeluKC = kGeluK * kGeluC;

// Activation codes inside the kernels: the public ones (ACT_NONE ..
// ACT_SILU), and the accurate forms of GELU (tanh) and SiLU that the fast
// forms below replaced (session 28), kept for the A/B: the launchers map
// ACT_GELU_TANH / ACT_SILU to them (kernel_act) for a version request with
// FP_NORM_VOPT_ACCURATE_ACT, or under FP_NORM_ACT_FAST=0.
enum { ACT_GELU_TANH_ACCURATE = 5, ACT_SILU_ACCURATE = 6 };

// The fast forms: sigmoid(z) from e = exp(-|z|) <= 1 (nothing overflows)
// and r = 1 / (1 + e), both MUFU approximations (ex2_ftz: ex2.approx of a
// rounded z log2(e); __fdividef: rcp.approx), then sigmoid(z) = r for z >= 0,
// e r below, and sigmoid(z) (1 - sigmoid(z)) = e r^2 for either sign, no
// cancellation. Relative error: the rounding of z log2(e) in the exponent,
// |z| 2^-24 in e, dominates (2^-19.7 at |z| = 20, where sigmoid is within
// 2e-9 of 0 or 1), against ~2^-23 for tanhf / expf; the emulation's ex2 is
// exp2f (tests/emu/emu_sm80.h), so CI checks the forms, the GPU check their
// error. GELU (tanh) is y sigmoid(2u), u = sqrt(2/pi) (y + 0.044715 y^3):
// exactly 0.5 y (1 + tanh(u)), without its cancellation for y < 0. Per
// element (sm_90 SASS, the vector forms below) 11.25 instructions for GELU,
// 19.5 for GELU', against 33 and 43 for the tanhf forms behind a switch per
// element (tests/sass/check_sass.py bounds them: act_fast_fwd / _bwd).
//
// 2^x by ex2.approx.ftz alone (kernels/common/fast_exp2.cuh): __expf would
// add exp2f's denormal-range fix-up; here results below 2^-126 only decide
// sigmoid values within 2^-126 of 0 or 1.
using fp_fast::ex2_ftz;
constexpr float kLog2e = 1.4426950408889634f;

struct SigmoidParts {
    float s, e, r;  // sigmoid(z), exp(-|z|), 1 / (1 + e)
};
__device__ __forceinline__ SigmoidParts sigmoid_fast(float z) {
    SigmoidParts p;
    p.e = ex2_ftz(-fabsf(z) * kLog2e);
    p.r = __fdividef(1.0f, 1.0f + p.e);
    p.s = z >= 0.0f ? p.r : p.e * p.r;  // NaN: e * r, NaN
    return p;
}

// act(y) for a compile-time activation A.
template <int A> __device__ __forceinline__ float act_c(float y) {
    if constexpr (A == ACT_GELU_ERF) {
        return 0.5f * y * (1.0f + erff(y * kSqrtHalf));
    } else if constexpr (A == ACT_GELU_TANH) {
        return y * sigmoid_fast(2.0f * y * fmaf(kGeluKC, y * y, kGeluK)).s;
    } else if constexpr (A == ACT_GELU_TANH_ACCURATE) {
        return 0.5f * y * (1.0f + tanhf(kGeluK * (y + kGeluC * y * y * y)));
    } else if constexpr (A == ACT_RELU) {
        return y > 0.0f ? y : 0.0f;
    } else if constexpr (A == ACT_SILU) {
        return y * sigmoid_fast(y).s;
    } else if constexpr (A == ACT_SILU_ACCURATE) {
        return y / (1.0f + expf(-y));
    } else {
        return y;
    }
}
// act'(y) for a compile-time activation A.
template <int A> __device__ __forceinline__ float dact_c(float y) {
    if constexpr (A == ACT_GELU_ERF) {
        return 0.5f * (1.0f + erff(y * kSqrtHalf)) + y * kInvSqrt2Pi * expf(-0.5f * y * y);
    } else if constexpr (A == ACT_GELU_TANH || A == ACT_GELU_TANH_ACCURATE) {
        // |y| > 20 taken as 20: the derivative is 0 or 1 there to float
        // precision, and y^2 stays finite (unclamped, y^2 = inf past 1.8e19
        // met 1 - t^2 = 0, or e r^2 = 0: NaN). The compare keeps NaN.
        if (fabsf(y) > 20.0f) y = copysignf(20.0f, y);
        if constexpr (A == ACT_GELU_TANH) {
            // d/dy y sigmoid(2u) = sigmoid(2u) + 2 y u' sigmoid(2u) (1 - sigmoid(2u)),
            // u' = sqrt(2/pi) (1 + 3 0.044715 y^2)
            const float y2 = y * y;
            const SigmoidParts p = sigmoid_fast(2.0f * y * fmaf(kGeluKC, y2, kGeluK));
            return fmaf(2.0f * y * fmaf(3.0f * kGeluKC, y2, kGeluK), p.e * p.r * p.r, p.s);
        } else {
            float t = tanhf(kGeluK * (y + kGeluC * y * y * y));
            return 0.5f * (1.0f + t) + 0.5f * y * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * y * y);
        }
    } else if constexpr (A == ACT_RELU) {
        return y > 0.0f ? 1.0f : 0.0f;
    } else if constexpr (A == ACT_SILU) {
        const SigmoidParts p = sigmoid_fast(y);  // sigmoid + y sigmoid (1 - sigmoid)
        return fmaf(y, p.e * p.r * p.r, p.s);
    } else if constexpr (A == ACT_SILU_ACCURATE) {
        float sg = 1.0f / (1.0f + expf(-y));
        return sg * (1.0f + y * (1.0f - sg));
    } else {
        return 1.0f;
    }
}

// The one switch over the kernel activation codes: f(std::integral_constant<
// int, A>{}) for act's A (ACT_NONE for any other code), so every runtime
// form below is a compile-time activation behind this switch.
template <typename F> __device__ __forceinline__ auto with_act(int act, F &&f) {
    switch (act) {
    case ACT_GELU_ERF: return f(std::integral_constant<int, ACT_GELU_ERF>{});
    case ACT_GELU_TANH: return f(std::integral_constant<int, ACT_GELU_TANH>{});
    case ACT_GELU_TANH_ACCURATE: return f(std::integral_constant<int, ACT_GELU_TANH_ACCURATE>{});
    case ACT_RELU: return f(std::integral_constant<int, ACT_RELU>{});
    case ACT_SILU: return f(std::integral_constant<int, ACT_SILU>{});
    case ACT_SILU_ACCURATE: return f(std::integral_constant<int, ACT_SILU_ACCURATE>{});
    default: return f(std::integral_constant<int, ACT_NONE>{});
    }
}

// Per element with a runtime activation (act is uniform across the grid:
// a predictable branch, but about 8 instructions per element: the scalar
// kernels and the elementwise baseline).
__device__ __forceinline__ float act_f(int act, float y) {
    return with_act(act, [&](auto a) { return act_c<decltype(a)::value>(y); });
}
__device__ __forceinline__ float dact_f(int act, float y) {
    return with_act(act, [&](auto a) { return dact_c<decltype(a)::value>(y); });
}

// The vector kernels take the activation's switch once per 16-byte vector
// (issue 19: the activation a template parameter of the element code): each
// case is its own unrolled loop of act_c<A> / dact_c<A>.
// y[e] = act(y[e]) for the N values of a vector.
template <int N> __device__ __forceinline__ void act_vec(int act, float (&y)[N]) {
    with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        if constexpr (A != ACT_NONE) {
#pragma unroll
            for (int e = 0; e < N; ++e) y[e] = act_c<A>(y[e]);
        }
    });
}
// g[e] *= act'(h[e]) for the N values of a vector (nothing for ACT_NONE).
template <int N> __device__ __forceinline__ void dact_mul_vec(int act, const float (&h)[N], float (&g)[N]) {
    with_act(act, [&](auto a) {
        constexpr int A = decltype(a)::value;
        if constexpr (A != ACT_NONE) {
#pragma unroll
            for (int e = 0; e < N; ++e) g[e] *= dact_c<A>(h[e]);
        }
    });
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the blockDim.x threads that share a row. blockDim.x is 32 (a warp
// per row: shuffles only) or a multiple of 32 with blockDim.y == 1 (a block
// per row: shuffles, then one value per warp through shared memory). Every
// thread gets the same total, summed in the same order (deterministic).
// lead = false drops the leading barrier: for callers that alternate
// red_smem buffers between consecutive reductions (forward v4), where the
// reduction in between keeps a buffer's readers ahead of its next writers.
__device__ __forceinline__ float row_sum(float v, float *red_smem /* [32] */, bool lead = true) {
    v = warp_sum(v);
    if (blockDim.x == 32) return v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lead) __syncthreads();  // red_smem may still be read by a previous row_sum
    if (lane == 0) red_smem[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? red_smem[lane] : 0.0f;
    return warp_sum(t);
}

// row_sum of a and of b at once, each total bit-identical to its own row_sum
// (the same additions in the same order): the two warp reductions
// interleave, and a block per row pays one barrier pair instead of two, the
// warps' partials side by side in red_smem (a at [0, 16), b at [16, 32):
// blockDim.x <= 512; past that, two row_sums).
__device__ __forceinline__ void row_sum2(float &a, float &b, float *red_smem /* [32] */) {
    if (blockDim.x > 512) {
        a = row_sum(a, red_smem);
        b = row_sum(b, red_smem);
        return;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if (blockDim.x == 32) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();  // red_smem may still be read by a previous row_sum
    if (lane == 0) {
        red_smem[warp] = a;
        red_smem[16 + warp] = b;
    }
    __syncthreads();
    a = lane < nwarps ? red_smem[lane] : 0.0f;
    b = lane < nwarps ? red_smem[16 + lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
}

// LayerNorm's row mean and sum of squared deviations through one reduction
// (a block per row then pays one barrier pair, where a row_sum of the values
// and then one of the squared deviations pay two): each thread's moments
// (count n, mean m, sum q of squared deviations about m) merged pairwise
// (Chan, Golub and LeVeque): with d = mb - ma, m = ma + d nb / n and
// q = qa + qb + d^2 na nb / n, no cancellation. Counts are exact in float.
// A merge is not symmetric in its operands, so the two lanes of an xor pair
// may differ in the last bit: lane 0's result is broadcast, and every warp
// merges the warps' moments in the same order, so every thread of the row
// gets the same m and q. red_smem: [48] floats (blockDim.x <= 512).
__device__ __forceinline__ void moments_merge(float &n, float &m, float &q, float nb, float mb, float qb) {
    const float nt = n + nb;
    const float w = nt > 0.0f ? __fdividef(nb, nt) : 0.0f;
    const float d = mb - m;
    m = fmaf(d, w, m);
    q = q + qb + d * d * n * w;
    n = nt;
}
__device__ __forceinline__ void warp_moments(float &n, float &m, float &q) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float nb = __shfl_xor_sync(0xffffffffu, n, o);
        const float mb = __shfl_xor_sync(0xffffffffu, m, o);
        const float qb = __shfl_xor_sync(0xffffffffu, q, o);
        moments_merge(n, m, q, nb, mb, qb);
    }
    n = __shfl_sync(0xffffffffu, n, 0);
    m = __shfl_sync(0xffffffffu, m, 0);
    q = __shfl_sync(0xffffffffu, q, 0);
}
// lead: as row_sum's.
__device__ __forceinline__ void row_moments(float &n, float &m, float &q, float *red_smem /* [48] */,
                                            bool lead = true) {
    warp_moments(n, m, q);
    if (blockDim.x == 32) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lead) __syncthreads();  // red_smem may still be read by a previous reduction
    if (lane == 0) {
        red_smem[warp] = n;
        red_smem[16 + warp] = m;
        red_smem[32 + warp] = q;
    }
    __syncthreads();
    n = lane < nwarps ? red_smem[lane] : 0.0f;
    m = lane < nwarps ? red_smem[16 + lane] : 0.0f;
    q = lane < nwarps ? red_smem[32 + lane] : 0.0f;
    warp_moments(n, m, q);
}

// An A/B switch of the GPU check: the value 0 to max that environment
// variable `name` holds as one digit, else -1 (unset or anything else).
// Callers read it once into a static.
static inline int env_switch(const char *name, int max) {
    const char *e = getenv(name);
    return e && e[0] >= '0' && e[0] <= '0' + max && e[1] == 0 ? e[0] - '0' : -1;
}

// The activation code the kernels run for a public one: ACT_GELU_TANH and
// ACT_SILU take their accurate forms when a version request carries
// FP_NORM_VOPT_ACCURATE_ACT, or under FP_NORM_ACT_FAST=0 (read once): the
// A/B of the fast forms.
static inline int kernel_act(int act, int version) {
    static const bool env_accurate = env_switch("FP_NORM_ACT_FAST", 1) == 0;
    if (!env_accurate && !(version & FP_NORM_VOPT_ACCURATE_ACT)) return act;
    return act == ACT_GELU_TANH ? (int)ACT_GELU_TANH_ACCURATE : act == ACT_SILU ? (int)ACT_SILU_ACCURATE : act;
}

__host__ __device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// Dynamic shared memory for the kernels with the static red_smem (32 floats):
// a block gets 48 KB in all without the opt-in (kDynSmemDefault dynamic), and
// the current device's opt-in limit with it (optin_dyn_smem: *avail, or 0 and
// the error, cleared, when the query fails).
constexpr size_t kRedSmemBytes = 32 * sizeof(float);
constexpr size_t kDynSmemDefault = 48 * 1024 - kRedSmemBytes;
// A device's answers never change, but the CPU emulation's device can
// (fp_emu::set_device: the tests' "other devices"): its generation is part
// of every cached answer's key there.
static inline unsigned device_epoch() {
#if defined(FP_CUDA_EMU)
    return fp_emu::device_generation();
#else
    return 0;
#endif
}

// The limit is asked once per device (a driver query on every call
// otherwise; devices past 64 are asked every time).
static inline cudaError_t optin_dyn_smem(size_t *avail) {
    // per device: epoch << 32 | (limit + 1), 0: not asked yet
    static std::atomic<unsigned long long> cache[64];
    int dev = 0, limit = 0;
    cudaError_t err = cudaGetDevice(&dev);
    const bool cacheable = dev >= 0 && dev < 64;
    const unsigned long long c = err == cudaSuccess && cacheable ? cache[dev].load(std::memory_order_relaxed) : 0;
    const unsigned epoch = device_epoch();
    if (c && (unsigned)(c >> 32) == epoch) {
        limit = (int)(c & 0xffffffffu) - 1;
    } else {
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();  // not sticky: clear it so a later launch check does not see it
            *avail = 0;
            return err;
        }
        if (cacheable) cache[dev].store((unsigned long long)epoch << 32 | (unsigned)(limit + 1), std::memory_order_relaxed);
    }
    *avail = (size_t)limit > kRedSmemBytes ? (size_t)limit - kRedSmemBytes : 0;
    return cudaSuccess;
}

// Answers about a kernel on a device that do not change while the process
// runs (its dynamic shared-memory opt-in once set, its occupancy at a block
// size and shared memory), kept so that a call pays a table lookup instead
// of a driver call: the launchers ran cudaFuncSetAttribute and
// cudaOccupancyMaxActiveBlocksPerMultiprocessor on every call. A full table
// replaces its oldest entry (that answer is then asked again). A
// cudaDeviceReset drops the opt-in while the entry stays: the launch then
// fails with its error (as before the reset for a new process).
enum { FUNC_OPT_IN = 0, FUNC_OCCUPANCY = 1 };
struct func_answer {
    const void *fn;
    int what, dev, threads;
    unsigned epoch;
    size_t smem;
    int value;
};
constexpr int kFuncAnswers = 64;
struct func_answers {
    std::mutex mu;
    func_answer e[kFuncAnswers];
    int n = 0, next = 0;
};
static inline func_answers &func_table() {
    static func_answers t;
    return t;
}
static inline bool func_lookup(const func_answer &k, int *value) {
    func_answers &t = func_table();
    std::lock_guard<std::mutex> lk(t.mu);
    for (int i = 0; i < t.n; ++i) {
        const func_answer &e = t.e[i];
        if (e.fn == k.fn && e.what == k.what && e.dev == k.dev && e.threads == k.threads && e.epoch == k.epoch &&
            e.smem == k.smem) {
            *value = e.value;
            return true;
        }
    }
    return false;
}
static inline void func_store(const func_answer &k) {
    func_answers &t = func_table();
    std::lock_guard<std::mutex> lk(t.mu);
    if (t.n < kFuncAnswers) {
        t.e[t.n++] = k;
    } else {
        t.e[t.next] = k;
        t.next = (t.next + 1) % kFuncAnswers;
    }
}

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) once per
// (kernel, current device, bytes).
template <typename K> static inline cudaError_t opt_in_once(K kernel, int bytes) {
    func_answer k = {reinterpret_cast<const void *>(kernel), FUNC_OPT_IN, 0, 0, device_epoch(), (size_t)bytes, 1};
    cudaError_t err = cudaGetDevice(&k.dev);
    if (err != cudaSuccess) return err;
    int done = 0;
    if (func_lookup(k, &done)) return cudaSuccess;
    if ((err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) != cudaSuccess)
        return err;
    func_store(k);
    return cudaSuccess;
}

// cudaOccupancyMaxActiveBlocksPerMultiprocessor, asked once per (kernel,
// current device, threads, smem).
template <typename K> static inline cudaError_t occupancy_once(int *per_sm, K kernel, int threads, size_t smem) {
    func_answer k = {reinterpret_cast<const void *>(kernel), FUNC_OCCUPANCY, 0, threads, device_epoch(), smem, 0};
    cudaError_t err = cudaGetDevice(&k.dev);
    if (err != cudaSuccess) return err;
    if (func_lookup(k, per_sm)) return cudaSuccess;
    if ((err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k.value, kernel, threads, smem)) != cudaSuccess)
        return err;
    func_store(k);
    *per_sm = k.value;
    return cudaSuccess;
}

}  // namespace fpnorm
