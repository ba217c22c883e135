// cp.async (sm_80+ asynchronous global -> shared copies) and the 16-byte
// shared-memory read that goes with them, shared by the kernels that stage
// through shared memory (the Hopper flash kernels, norm backward v4). Built
// with FP_CUDA_EMU (tests/emu) they route to the CPU emulation, which keeps
// the hardware's rule that a copy is not in shared memory until the issuing
// thread waits for its group.
//
// Every asm here is volatile with a "memory" clobber (lds16: volatile): the
// compiler neither moves a shared-memory read of a staged cell above the
// wait that lands it nor below the copy that refills it. (attention_flash.cu
// keeps its own clobber-free copies for the mma.sync kernels, whose
// schedule was measured with them.)
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#if defined(FP_CUDA_EMU)
#include "emu_cp_async.h"
#endif

namespace fp_cp {

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// N bytes (4, 8 or 16) global -> shared; src N-byte aligned. pred false
// zero-fills the destination (src-size 0), which keeps rows past a
// sequence's end finite. 16 bytes go through L2 only (.cg); 4 and 8 can
// only be .ca.
template <int N = 16>
__device__ __forceinline__ void cp_async(uint32_t dst, const void *src, bool pred = true) {
    static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
    const int n = pred ? N : 0;
#if defined(FP_CUDA_EMU)
    fp_emu::cp_async(dst, src, N, n);
#else
    if constexpr (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(n)
                     : "memory");
#endif
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool pred) { cp_async<16>(dst, src, pred); }

__device__ __forceinline__ void cp_async_commit() {
#if defined(FP_CUDA_EMU)
    fp_emu::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// All but the newest N committed groups of this thread have landed.
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(FP_CUDA_EMU)
    fp_emu::cp_async_wait_group(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// 16-byte shared-memory read (LDS.128). A 16-bit row's cell read through an
// element pointer came out of ptxas as eight 2-byte LDS.
__device__ __forceinline__ uint4 lds16(const uint4 &c) {
#if defined(FP_CUDA_EMU)
    return c;
#else
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(smem_u32(&c)));
    return v;
#endif
}

}  // namespace fp_cp
