// Counting a grid's CTAs in global memory: the "last CTAs finish the work"
// pattern, without a second kernel.
//
// arrive(count): a fetch-add that is a release and an acquire at GPU scope
// (atom.acq_rel.gpu; no fence.sc). Called by one thread after a barrier
// that orders the CTA's stores before it, it publishes them to whoever
// acquires the count later, and acquires the stores of every CTA that
// arrived before (the RMW chain carries their releases). Returns the ticket
// (0, 1, ... in arrival order).
//
// wait_at_least(count, target): one thread polls the count with
// ld.acquire.gpu until it reaches target (then a barrier hands the
// acquired stores on to the CTA's other threads, whose loads of them go to
// L2: __ldcg, since L1 is not coherent across SMs). Backs off with
// __nanosleep between polls.
//
// Forward progress: a CTA that waits occupies its SM slot until the count
// reaches target, so the CTAs it waits for must be able to run beside it.
// The safe form (kernels/norm/norm_bwd.cu's fused reduce): every CTA arrives
// once; only those whose ticket is among the last `tail` wait; at most
// `tail` CTAs are then unfinished or waiting, so tail <= the number of CTAs
// the device holds at once (SMs, one each) cannot deadlock, whatever the
// grid's size and whatever else runs on the device.
//
// The CPU emulation (tests/emu) runs a waiting CTA's wait as
// spin_yield_global: the block stays resident and the next blocks run, up to
// what the emulated device holds, and a wait nobody can end fails the launch
// as a deadlock.
#pragma once

#include <cuda_runtime.h>

namespace fp_grid {

__device__ __forceinline__ int arrive(int *count) {
#if defined(FP_CUDA_EMU)
    return atomicAdd(count, 1);  // fibers switch only at synchronization points
#else
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(count) : "memory");
    return old;
#endif
}

__device__ __forceinline__ int load_acquire(const int *p) {
#if defined(FP_CUDA_EMU)
    return *reinterpret_cast<const volatile int *>(p);
#else
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}

__device__ __forceinline__ void wait_at_least(const int *count, int target) {
#if defined(FP_CUDA_EMU)
    while (load_acquire(count) < target) fp_emu::spin_yield_global("fp_grid::wait_at_least");
#else
    unsigned ns = 32;
    while (load_acquire(count) < target) {
        __nanosleep(ns);
        if (ns < 256) ns *= 2;
    }
#endif
}

}  // namespace fp_grid
