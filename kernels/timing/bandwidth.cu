// Memory-bound probe kernels: out = alpha * x + beta * y, and a copy.
//
// Versions (fastbench run timing/elementwise):
//   axpby_v1  one element per thread, scalar 2- or 4-byte loads (the naive baseline)
//   axpby_v2  16-byte vector loads/stores, grid-stride loop sized to the SMs
//   copy_v1   16-byte vector copy, grid-stride, byte tail
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <atomic>
#include <mutex>

#include "common/pdl.cuh"
#include "common/span_stamp.cuh"
#include "timing/bandwidth.h"

namespace {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// alpha * x + beta * y with every product and the sum rounded separately,
// as the CPU implementations compute it (fp_axpby on a CPU context, the
// reference of tests/core/test_core_gpu, which compares exactly): left to
// itself nvcc contracts the expression into fma(alpha, x, beta * y), one
// rounding fewer, which differs in the last bit for f32 data.
__device__ __forceinline__ float axpby1(float alpha, float x, float beta, float y) {
    return __fadd_rn(__fmul_rn(alpha, x), __fmul_rn(beta, y));
}

// (n) elements, one per thread.
template <typename T>
__global__ void axpby_v1(const T *__restrict__ x, const T *__restrict__ y, T *__restrict__ out,
                         size_t n, float alpha, float beta, const fp_span_stamp stamp) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(stamp);
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = from_f32<T>(axpby1(alpha, to_f32(x[i]), beta, to_f32(y[i])));
    fp_stamp::end(stamp);
}

// (n) elements as n / VEC 16-byte vectors plus a scalar tail.
template <typename T>
__global__ void axpby_v2(const T *__restrict__ x, const T *__restrict__ y, T *__restrict__ out,
                         size_t n, float alpha, float beta, const fp_span_stamp stamp) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(stamp);
    constexpr int VEC = 16 / sizeof(T);
    const size_t nvec = n / VEC;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t v = (size_t)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride) {
        uint4 xr = reinterpret_cast<const uint4 *>(x)[v];
        uint4 yr = reinterpret_cast<const uint4 *>(y)[v];
        uint4 orr;
        const T *xe = reinterpret_cast<const T *>(&xr);
        const T *ye = reinterpret_cast<const T *>(&yr);
        T *oe = reinterpret_cast<T *>(&orr);
#pragma unroll
        for (int k = 0; k < VEC; ++k) oe[k] = from_f32<T>(axpby1(alpha, to_f32(xe[k]), beta, to_f32(ye[k])));
        reinterpret_cast<uint4 *>(out)[v] = orr;
    }
    // Tail: fewer than VEC elements, handled by the first threads.
    size_t t = nvec * VEC + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) out[t] = from_f32<T>(axpby1(alpha, to_f32(x[t]), beta, to_f32(y[t])));
    fp_stamp::end(stamp);
}

__global__ void copy_v1(uint8_t *__restrict__ dst, const uint8_t *__restrict__ src, size_t bytes) {
    const size_t nvec = bytes / 16, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t v = (size_t)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += stride)
        reinterpret_cast<uint4 *>(dst)[v] = reinterpret_cast<const uint4 *>(src)[v];
    size_t t = nvec * 16 + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < bytes) dst[t] = src[t];
}

constexpr int kThreads = 256;

// Enough resident blocks to cover every SM several times; the grid-stride
// loop does the rest.
unsigned grid_for(size_t work_items, int sm_count) {
    size_t want = (work_items + kThreads - 1) / kThreads;
    size_t cap = (size_t)(sm_count > 0 ? sm_count : 1) * 16;
    if (want < 1) want = 1;
    return (unsigned)(want < cap ? want : cap);
}

// Launch probes: kernels that do nothing (fp_launch_empty).
struct big_params {
    unsigned long long w[64];  // 512 bytes
};
__global__ void empty_small(unsigned long long) {}
__global__ void clock_read(unsigned long long *out) { *out = fp_gtimer::now_ns(); }
__global__ void empty_big(const __grid_constant__ big_params) {}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <typename T>
cudaError_t launch_axpby(int version, size_t n, float alpha, const void *x, float beta, const void *y,
                         void *out, int sm_count, bool pdl, const fp_span_stamp &st, cudaStream_t stream) {
    const T *xt = static_cast<const T *>(x), *yt = static_cast<const T *>(y);
    T *ot = static_cast<T *>(out);
    if (version == 2 && aligned16(x) && aligned16(y) && aligned16(out))
        return fp_pdl::launch<axpby_v2<T>>(dim3(grid_for(n / (16 / sizeof(T)) + 1, sm_count)), dim3(kThreads), 0,
                                           stream, pdl, xt, yt, ot, n, alpha, beta, st);
    size_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > 0x7fffffffu) return cudaErrorInvalidValue;
    return fp_pdl::launch<axpby_v1<T>>(dim3((unsigned)blocks), dim3(kThreads), 0, stream, pdl, xt, yt, ot, n, alpha,
                                       beta, st);
}

}  // namespace

extern "C" cudaError_t fp_launch_axpby(int version, int dtype, size_t n, float alpha, const void *x,
                                       float beta, const void *y, void *out, int sm_count, int pdl,
                                       const fp_span_stamp *stamp, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const bool p = pdl != 0;
    const fp_span_stamp st = stamp ? *stamp : fp_span_stamp{nullptr, 0, nullptr};
    switch (dtype) {
    case 0: return launch_axpby<float>(version, n, alpha, x, beta, y, out, sm_count, p, st, stream);
    case 1: return launch_axpby<__half>(version, n, alpha, x, beta, y, out, sm_count, p, st, stream);
    case 2: return launch_axpby<__nv_bfloat16>(version, n, alpha, x, beta, y, out, sm_count, p, st, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t fp_launch_clock_read(unsigned long long *out, cudaStream_t stream) {
    clock_read<<<1, 1, 0, stream>>>(out);
    return cudaGetLastError();
}

extern "C" cudaError_t fp_launch_copy(void *dst, const void *src, size_t bytes, int sm_count,
                                      cudaStream_t stream) {
    if (bytes == 0) return cudaSuccess;
    if (!aligned16(dst) || !aligned16(src)) return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
    copy_v1<<<grid_for(bytes / 16 + 1, sm_count), kThreads, 0, stream>>>(
        static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src), bytes);
    return cudaGetLastError();
}

#ifndef FP_CUDA_EMU
namespace {
// cuLaunchKernel's signature (cuda.h's CUfunction / CUstream are the
// runtime's cudaFunction_t / cudaStream_t): the library links no libcuda,
// so the driver function comes from the runtime's entry-point query.
typedef int (*cu_launch_kernel_fn)(cudaFunction_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned smem, cudaStream_t stream, void **params,
                                   void **extra);
struct driver_launch {
    std::atomic<bool> ready{false};
    std::mutex mu;
    cu_launch_kernel_fn launch = nullptr;
    cudaFunction_t fn = nullptr;
};
driver_launch g_driver[64];

cudaError_t driver_launch_empty(cudaStream_t stream) {
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 0 || dev >= 64) return cudaErrorNotSupported;
    driver_launch &d = g_driver[dev];
    if (!d.ready.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lk(d.mu);
        if (!d.ready.load(std::memory_order_relaxed)) {
            void *fn = nullptr;
            cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
            err = cudaGetDriverEntryPointByVersion("cuLaunchKernel", &fn, 12000, cudaEnableDefault, &q);
            if (err != cudaSuccess) return err;
            if (q != cudaDriverEntryPointSuccess || !fn) return cudaErrorNotSupported;
            err = cudaGetFuncBySymbol(&d.fn, reinterpret_cast<const void *>(empty_small));
            if (err != cudaSuccess) return err;
            d.launch = reinterpret_cast<cu_launch_kernel_fn>(fn);
            d.ready.store(true, std::memory_order_release);
        }
    }
    unsigned long long arg = 0;
    void *params[] = {&arg};
    return d.launch(d.fn, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr) == 0 ? cudaSuccess : cudaErrorLaunchFailure;
}
}  // namespace
#endif

extern "C" cudaError_t fp_launch_empty(int variant, cudaStream_t stream) {
    switch (variant) {
    case 0: empty_small<<<1, 32, 0, stream>>>(0ull); return cudaGetLastError();
    case 1: {
        big_params p;
        for (int i = 0; i < 64; ++i) p.w[i] = (unsigned long long)i;
        empty_big<<<1, 32, 0, stream>>>(p);
        return cudaGetLastError();
    }
    case 2:
#ifdef FP_CUDA_EMU
        return cudaErrorNotSupported;
#else
        return driver_launch_empty(stream);
#endif
    default: return cudaErrorInvalidValue;
    }
}
