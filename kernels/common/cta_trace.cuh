// The CTA timeline's device side (src/attention/attention_internal.h,
// fp_cta_record): thread 0 of a CTA stamps the GPU's global timer into the
// CTA's record at fixed points of the kernel. A kernel takes the records'
// base pointer as a parameter (NULL: not traced, the usual case), so that an
// untraced launch pays one uniform branch at each mark and nothing inside
// its loops.
//
// Record index: x + gx (y + gy (z + b_off)), b_off the batch the launch
// starts at (the launcher traces only single launches, b_off = 0).
// Under the CPU emulation (FP_CUDA_EMU) the timer is the host's steady clock
// (gtimer.cuh) and the SM is the block's linear index modulo the emulated
// device's SM count: the records' structure is checked there, not their
// times.
#pragma once

#include <stdint.h>

#include "attention/attention_internal.h" /* fp_cta_record, FP_CTA_* */
#include "common/gtimer.cuh"

namespace fp_cta {

__device__ __forceinline__ uint64_t now_ns() { return fp_gtimer::now_ns(); }

__device__ __forceinline__ uint32_t linear_cta(int b_off) {
    return (uint32_t)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * ((uint32_t)b_off + blockIdx.z)));
}

__device__ __forceinline__ uint32_t sm_id(int b_off) {
#if defined(FP_CUDA_EMU)
    return linear_cta(b_off) % (uint32_t)fp_emu::device().sm_count;
#else
    (void)b_off;
    uint32_t s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
#endif
}

// Mark `which` (FP_CTA_*) of this CTA; thread 0 only. FP_CTA_START also
// writes the CTA's index and SM; tiles >= 0 (at FP_CTA_LOOP) the key tiles
// its loop ran. No-op when rec is NULL.
__device__ __forceinline__ void mark(fp_cta_record *rec, int b_off, int which, int tiles = -1) {
    if (rec == nullptr || threadIdx.x != 0) return;
    fp_cta_record *r = rec + linear_cta(b_off);
    if (which == FP_CTA_START) {
        r->cta = linear_cta(b_off);
        r->smid = sm_id(b_off);
    }
    if (tiles >= 0) r->tiles = (uint32_t)tiles;
    r->t_ns[which] = now_ns();
}

// ---- Records written by a chosen thread (the warp-specialized Hopper
// kernels: their producer warpgroup leaves early, so no CTA-wide barrier
// follows the loop; the caller picks the thread, r is its record) --------

// The record's start: `cta` (the CTA's linear index; v9: blockIdx.x, the
// persistent CTA that ran the item), its SM and FP_CTA_START.
__device__ __forceinline__ void start_at(fp_cta_record *r, uint32_t cta) {
    r->cta = cta;
    r->smid = sm_id(0);
    r->t_ns[FP_CTA_START] = now_ns();
}
// Mark `which` of record r now (tiles >= 0: the key tiles of its loop).
__device__ __forceinline__ void mark_at(fp_cta_record *r, int which, int tiles = -1) {
    if (tiles >= 0) r->tiles = (uint32_t)tiles;
    r->t_ns[which] = now_ns();
}
// FP_CTA_END as the latest of several writers' ends (each consumer
// warpgroup after its epilogue): an atomic max on the 64-bit stamp.
__device__ __forceinline__ void end_max_at(fp_cta_record *r) {
    atomicMax((unsigned long long *)&r->t_ns[FP_CTA_END], (unsigned long long)now_ns());
}

// This CTA merged its tile's splits (thread 0 only).
__device__ __forceinline__ void merged(fp_cta_record *rec, int b_off) {
    if (rec == nullptr || threadIdx.x != 0) return;
    rec[linear_cta(b_off)].flags |= FP_CTA_MERGED;
}

// The end: after every thread of the CTA is done (a barrier, taken only when
// traced: rec is the same for the whole CTA).
__device__ __forceinline__ void end(fp_cta_record *rec, int b_off) {
    if (rec == nullptr) return;
    __syncthreads();
    mark(rec, b_off, FP_CTA_END);
}

} // namespace fp_cta
