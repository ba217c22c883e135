// The kernel timer's device side (src/core/span_stamp.h; trace.h,
// FP_TRACE_TIMER_KERNEL): a kernel of a traced op stamps its span's record
// with the GPU's global timer, so the span costs the host no event record.
//
//   begin(s)  right after fp_pdl::enter() (a PDL launch's CTAs may be
//             resident before the predecessor ends: the span starts when
//             this kernel may run): thread 0 of CTA 0 claims the record for
//             span s.seq and, if this is the span's first kernel to claim
//             it, writes the start.
//   end(s)    where thread 0 of each CTA finishes its work (every exit
//             thread 0 takes): an atomic max of the end; end_by(s, mine)
//             the same from the threads the kernel names (each warpgroup's
//             or warp's first, where they finish at their own times).
// Both are one uniform branch when s.rec is NULL (not traced).
#pragma once

#include "common/gtimer.cuh"
#include "core/span_stamp.h"

namespace fp_stamp {

__device__ __forceinline__ bool first_thread() { return (threadIdx.x | threadIdx.y | threadIdx.z) == 0; }

// The bodies are one asm block each on a GPU: the compiler keeps only the
// record's address (and the handle) live at that point, so a tight kernel
// keeps its register allocation (as C++ they cost the norm kernels up to 8
// registers and a spill at a launch bound).
__device__ __forceinline__ void claim_start(unsigned long long *rec, unsigned long long seq, bool on) {
#if defined(FP_CUDA_EMU)
    if (!on) return;
    const unsigned long long t = fp_gtimer::now_ns();
    if (atomicExch(&rec[0], seq) != seq) rec[1] = t;
#else
    // predicated, no branch: a branch at a kernel's top moved ptxas's
    // allocation of the tight ones (a spill at a launch bound)
    asm volatile("{\n\t.reg .u64 t, o;\n\t.reg .pred p, q;\n\t"
                 "setp.ne.u32 p, %2, 0;\n\t"
                 "@p mov.u64 t, %%globaltimer;\n\t"
                 "@p atom.global.exch.b64 o, [%0], %1;\n\t"
                 "@p setp.ne.u64 q, o, %1;\n\t"
                 "@!p setp.ne.u32 q, 0, 0;\n\t"
                 "@q st.global.u64 [%0+8], t;\n\t}"
                 :
                 : "l"(rec), "l"(seq), "r"((unsigned)on));
#endif
}

__device__ __forceinline__ void raise_end(unsigned long long *rec) {
#if defined(FP_CUDA_EMU)
    atomicMax(&rec[2], (unsigned long long)fp_gtimer::now_ns());
#else
    asm volatile("{\n\t.reg .u64 t;\n\t"
                 "mov.u64 t, %%globaltimer;\n\t"
                 "red.global.max.u64 [%0+16], t;\n\t}"
                 :
                 : "l"(rec)
                 :);
#endif
}

__device__ __forceinline__ void begin(const fp_span_stamp &s) {
    const bool on =
        s.rec != nullptr && (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) == 0;
    claim_start(s.rec, s.seq, on);
}

// The end stamp from thread 0 of the CTA.
__device__ __forceinline__ void end(const fp_span_stamp &s) {
    if (s.rec_end != nullptr && first_thread()) raise_end(s.rec_end);
}

// The end stamp from the threads the kernel names (thread_ends): each
// warpgroup's first in the warp-specialized kernels, whose warpgroups finish
// at different times (the producer before its consumers: thread 0 alone
// would end the span early), each warp's first where warps work on rows of
// their own. Where the caller already holds its thread index, pass the test
// on it, so that no register stays live for threadIdx.
__device__ __forceinline__ void end_by(const fp_span_stamp &s, bool thread_ends) {
    if (s.rec_end != nullptr && thread_ends) raise_end(s.rec_end);
}

} // namespace fp_stamp
