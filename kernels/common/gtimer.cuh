// The GPU's global timer (%globaltimer, ns), read by the CTA timeline
// (cta_trace.cuh) and the kernel timer's span stamps (span_stamp.cuh).
// Under the CPU emulation (FP_CUDA_EMU) it is the host's steady clock,
// CLOCK_MONOTONIC: the clock the trace layer reads (fp_now_s).
#pragma once

#include <stdint.h>

#if defined(FP_CUDA_EMU)
#include <chrono>
#endif

namespace fp_gtimer {

__device__ __forceinline__ uint64_t now_ns() {
#if defined(FP_CUDA_EMU)
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
#else
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#endif
}

} // namespace fp_gtimer
