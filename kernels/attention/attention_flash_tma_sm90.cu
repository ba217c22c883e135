// Flash attention forward for Hopper (sm_90a only), version 5 of the flash
// kernel (1 / 2: mma.sync, attention_flash.cu; 3 / 4: wgmma with cp.async,
// attention_flash_sm90.cu):
//   attention_flash_fwd_v5      v3's math (one CTA = 128 packed query rows x
//                               one KV head, two consumer warpgroups of 64
//                               rows, Q K^T wgmma m64n128k16 from SW128
//                               shared-memory descriptors, P from registers,
//                               V MN-major, online softmax, v3's pipelined
//                               order: softmax of t+1 under P V of t) fed by
//                               TMA: a third warpgroup is the producer, one
//                               thread of it issues every K / V tile as
//                               cp.async.bulk.tensor boxes (64 columns x 128
//                               keys, 128-byte swizzle: the layout v3's
//                               descriptors read) into a ring of kStages
//                               stages tracked by full (expect-tx bytes) and
//                               empty (consumer releases) mbarriers; no
//                               CTA-wide barrier in the loop; setmaxnreg
//                               moves registers from the producer (24) to
//                               the consumers (240). Q: cp.async once, by
//                               each consumer warpgroup for its own rows.
//   attention_flash_fwd_v8      v5 whose two consumer warpgroups take turns
//                               issuing their wgmmas (FlashAttention-3's
//                               ping-pong through named barriers: one's
//                               softmax under the other's wgmmas) and O's
//                               rescale under Q K^T
//                               (fp_tma::consumer_schedule_turns); opt-in
//                               (version 8) until a GPU run compares it
//                               with v5.
//   attention_flash_fwd_v9      v8 in persistent CTAs (one per SM): each
//                               runs a sequence of (query tile, split, KV
//                               head, batch) items handed out by tickets
//                               (a global atomic, drawn 3 key tiles before
//                               the item before ends: fp_tma::draw_tile,
//                               session 36; FP_ATTN_V9_EARLY: at its start)
//                               over a causal-aware order (L2-sized
//                               sections, longest tiles first), the K / V
//                               ring running on across items and the next
//                               item's Q loaded under this one
//                               (fp_tma::producer_items / consumer_items);
//                               the ticket counters come from the context's
//                               per-stream counters (a first call on a
//                               stream allocates them: not inside a
//                               capture); consecutive items with tiles
//                               chained (the next one's first Q K^T and
//                               softmax under this one's last P V, the
//                               epilogue after: session 30,
//                               fp_tma::consumer_schedule_chain); opt-in
//                               (version 9) until a GPU run compares it
//                               with v8.
//   attention_flash_fwd_v5w     v5 with a 128 x 176 tile (head_dim 128,
//                               FP_ATTN_V5_WIDE: session 30), measured
//                               against v5 before any default use.
//   attention_flash_fwd_v10     v8 with three consumer warpgroups (head_dim
//                               64 only: FlashAttention-3's tile there): a
//                               192-row query tile, 512 threads, the turns
//                               going round (0, 1, 2, 0, ...), registers
//                               split 32 (producer) / 160 (consumers); each
//                               K / V tile feeds 192 rows instead of 128;
//                               opt-in (version 10) until a GPU run compares
//                               it with v8.
// Same contract as v3: f16 / bf16, head_dim 64 / 128, causal / windows, GQA
// packing, seqlens_k, LSE, split-KV partials (run_with_partials), varlen given
// fp_attention_params.total_k (one tensor map over the packed K / V, each
// sequence's tiles at its offset: fp_tma::kv_seq_rows), paged KV on v5 / v8 /
// v9 / v10 (one map over the page pool; a tile loads as boxes of
// gcd(page_size, 128) rows, box j issued by lane j of the producer warp from
// the page its block-table entry names: producer_ops_paged,
// fp_tma::paged_box_at; v9's producer warp runs the item schedule, lane 0
// drawing the tickets: session 37); fp8 (e4m3) on v5 / v8 at head_dim 128
// (dense or seqlens_k K / V, one split): Q K^T and P V on wgmma
// .m64n128k32.e4m3, the tiles laid out as 16-bit tiles of 64 columns (128-byte
// rows: layout_cols), three ring stages, P rounded to e4m3 in registers
// (pack_p), V transposed first into the stream's workspace by fp8_transpose_v
// (the fp8 wgmma takes K-major B only), O bf16 scaled by v_descale (session
// 26; checked on the emulation only:
// tests/attention/test_attention_fp8_emu.cpp).
// FP_ERR_UNSUPPORTED: varlen without total_k (the map's extent is then
// unknown: the offsets are device memory), paged KV with a page_size that is
// not a multiple of 8, K / V layouts TMA cannot describe (base not 16-byte
// aligned, a seq / head / batch stride not a multiple of 16 bytes), devices
// other than compute capability 9.0, a driver without cuTensorMapEncodeTiled
// (looked up at run time through cudaGetDriverEntryPoint*: libfastpath does
// not link libcuda), a compiled register count the setmaxnreg split does not
// fit (check_entry_regs). FASTPATH_KERNEL_WATCHDOG builds bound the mbarrier
// waits (kernel_watchdog.cuh).
// The pipeline bookkeeping (ring indices, the producer and consumer barrier
// schedules, the tensor-map geometry) is attention_tma_sm90.h, shared with
// the CPU model tests/attention/test_attention_tma_emu.cpp (mbarrier / TMA
// semantics from the PTX ISA, broken variants must fail).
// STATUS: v5, v8 and v9 passed the GPU tests on H100s / H200s; v5 is the
// Hopper default at head_dim 128 and v8 at 64 (benchmarks/NOTES.md, session
// 20: v8 1.06-1.14x v5 at 64, 0.98-1.01x at 128; v9 v8's equal, opt-in).
// v10 is written and checked without a GPU (CPU model, ptxas -v, SASS; this
// source on the CUDA emulation, mbarrier / TMA / wgmma / named barriers
// emulated: tests/attention/test_attention_sm90_kernel_emu.cpp), reached
// only through FP_CTX_ATTENTION_KERNEL 10 and fp_attn_cuda_flash_version(a,
// 10, ...) until a GPU run times it against v8 (fastbench
// attention/flash_versions, rows v8_vs_v10: gpu-check's ab-v10 run).
// Varlen (session 24) and paged KV (session 25) are likewise checked on the
// emulation only, not yet timed on a GPU (fastbench attention/varlen: v3,
// what varlen calls ran before, against v5 / v8; attention/paged_prefill: v1
// against v5 / v8 on a paged cache). The epilogue through shared memory and
// TMA stores (store_rows_tma, session 32) is opt-in (FP_ATTN_O_TMA on a
// call, FP_ATTN_O_STORE=tma for a process) on v5 / v8 / v9 / v10 / v5w
// until the GPU check's ab-otma run times it against the stores from
// registers (rows v5_vs_v5o, v8_vs_v8o, v9_vs_v9o); checked on the
// emulation only. On v9 an item's O goes through its own Q buffer, which
// the item after next loads into: the warpgroup meets once more after the
// stores' reads. Paged KV on v9 (session 37) is checked on the emulation
// only (fastbench attention/paged_prefill's tma_vs_v9 rows time it).
// The PTX wrappers, the softmax helpers, the Q K^T / P V stages and the
// epilogue from registers are v3's, shared through attention_sm90_common.cuh.
#include <atomic>
#include <cuda.h> // CUtensorMap and its enums only (no libcuda symbol is referenced)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

#include "attention/attention_flash_common.cuh"
#include "attention/attention_flash_layout.h"
#include "attention/attention_internal.h"
#include "attention/attention_sm90_common.cuh"
#include "attention/attention_sm90_layout.h"
#include "attention/attention_tma_sm90.h"
#include "attention/kernel_watchdog.cuh"
#include "common/cta_trace.cuh" /* the CTA timeline (fastbench attention/prefill_anatomy) */

namespace {

// ---- mbarrier, TMA, register reallocation (PTX ISA 8.0, sm_90a) -------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if defined(FP_CUDA_EMU) // the CPU emulation (tests/emu/emu_sm90.h), here and below
    fp_emu::mbarrier_init(bar, count);
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// Makes the initialized barriers visible to the async proxy (TMA's
// complete_tx) and, with the __syncthreads after it, to every thread.
__device__ __forceinline__ void fence_mbar_init() {
#if !defined(FP_CUDA_EMU) // one proxy in the emulation: nothing to order
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if defined(FP_CUDA_EMU)
    fp_emu::mbarrier_arrive(bar);
#else
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// One arrival plus `bytes` expected transaction bytes for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(FP_CUDA_EMU)
    fp_emu::mbarrier_arrive(bar, bytes);
#else
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
// Blocks until the phase of parity `parity` has completed (try_wait itself
// suspends for a system-dependent time before it answers false). `kind` /
// `stage` name the barrier (fp_tma::barrier_kind, ring stage) for the
// checked build's watchdog (kernel_watchdog.cuh), the only use of them.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity, int kind, int stage) {
#if defined(FP_KERNEL_WATCHDOG)
    fp_watchdog::deadline dl;
#endif
    uint32_t done;
    do {
#if defined(FP_CUDA_EMU)
        done = fp_emu::mbarrier_try_wait_parity(bar, parity);
#else
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n"
                     "}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
#endif
#if defined(FP_KERNEL_WATCHDOG)
        if (!done && dl.poll())
            fp_watchdog::expired("attention_flash_fwd_v5 / v8 / v9 mbarrier", fp_tma::barrier_name(kind), stage, parity,
                                 dl.waited);
#endif
    } while (!done);
}
// One box of the 4-D tensor map at coordinates (c0 innermost .. c3) into
// shared memory at dst (1024-byte aligned: the 128-byte swizzle pattern),
// completing its bytes on barrier `bar`. Out-of-bounds elements are zeros.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
#if defined(FP_CUDA_EMU)
    const int coords[4] = {c0, c1, c2, c3};
    fp_emu::tma_load_tiled(dst, map, 4, coords, bar);
#else
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4, %5}], [%6];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
#endif
}
// The other direction: one box from shared memory at src (1024-byte
// aligned under the 128-byte swizzle) to the 5-D tensor map at (c0
// innermost .. c4), read asynchronously into this thread's open bulk
// async-group; elements past the map's bounds are not written (the
// hardware clips them). The source must be fenced (fence_proxy_async) by
// its writers and published to this thread before the issue.
__device__ __forceinline__ void tma_store_5d(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2, int c3,
                                             int c4) {
#if defined(FP_CUDA_EMU)
    const int coords[5] = {c0, c1, c2, c3, c4};
    fp_emu::tma_store_tiled(map, 5, coords, src);
#else
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
                 : "memory");
#endif
}
// Closes this thread's open bulk async-group (the TMA stores since the last
// commit).
__device__ __forceinline__ void bulk_commit() {
#if defined(FP_CUDA_EMU)
    fp_emu::bulk_commit_group();
#else
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until every committed bulk group of this thread has read its shared
// source (the global writes may still be in flight: the kernel's end
// publishes them). A thread must not exit, nor its source be rewritten,
// before this.
__device__ __forceinline__ void bulk_wait_read0() {
#if defined(FP_CUDA_EMU)
    fp_emu::bulk_wait_group(0);
#else
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
// stmatrix.x4: four 8 x 8 matrices of 16-bit pairs, the layout of a wgmma
// accumulator's 8-column block (this lane: row lane / 4, columns 2 (lane %
// 4), + 1 of each); lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if defined(FP_CUDA_EMU)
    fp_emu::stmatrix_x4(addr, r);
#else
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                 "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
#endif
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap *map) {
#if !defined(FP_CUDA_EMU) // a cache hint: nothing to emulate
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
#if defined(FP_CUDA_EMU)
    fp_emu::setmaxnreg(N, false);
#else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
#if defined(FP_CUDA_EMU)
    fp_emu::setmaxnreg(N, true);
#else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
// Named barrier `id` among `count` threads (a multiple of 32): bar.sync
// (waits for the phase to complete) or, kWait false, bar.arrive (arrives
// without waiting).
template <bool kWait = true> __device__ __forceinline__ void named_barrier(int id, int count) {
#if defined(FP_CUDA_EMU)
    if (kWait) fp_emu::named_barrier_sync((unsigned)id, (unsigned)count);
    else fp_emu::named_barrier_arrive((unsigned)id, (unsigned)count);
#else
    if (kWait) asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
    else asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
#if defined(FP_CUDA_EMU)
    std::memset(fp_emu::smem_at(addr, 16), 0, 16);
    fp_emu::smem_note_generic_write(addr, 16);
#else
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
#endif
}

// ---- the two roles, as policies of the schedules in attention_tma_sm90.h ----

// The producer thread: one TMA box per 64 columns of a K / V tile. QB: the
// Q buffers of the shared-memory layout (fp_tma::k_offset; v9 has two); W:
// the consumer warpgroups (the Q tile's size: v10 has three). D: the
// layout's width in 16-bit columns (layout_cols: fp8 at head_dim 128 is 64,
// one 128-element box a row). kVt (fp8): tm_v is V^T (fp8_transpose_v), a
// tile one box of kBc keys (inner) x D rows at (t kBc, 0, hk, b).
// BC: the tile's keys (176: v5's wide tile).
template <int D, int QB = 1, int W = 2, bool kVt = false, int BC = 128> struct producer_ops {
    const CUtensorMap *tm_k, *tm_v;
    uint32_t smem0;
    int hk, bz, row0; // the sequence's place in the maps (fp_tma::kv_seq_rows)
    __device__ __forceinline__ void wait_empty_k(int st, uint32_t parity) {
        mbar_wait(smem0 + fp_tma::bar_offset<D, QB, W, BC>(fp_tma::BAR_EMPTY_K, st), parity, fp_tma::BAR_EMPTY_K, st);
    }
    __device__ __forceinline__ void wait_empty_v(int st, uint32_t parity) {
        mbar_wait(smem0 + fp_tma::bar_offset<D, QB, W, BC>(fp_tma::BAR_EMPTY_V, st), parity, fp_tma::BAR_EMPTY_V, st);
    }
    __device__ __forceinline__ void load(const CUtensorMap *map, uint32_t tile, uint32_t bar, int t) {
        mbar_arrive_expect_tx(bar, fp_tma::stage_tx_bytes<D, BC>()); // before the loads: tx never runs ahead
#pragma unroll
        for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c) {
            int xyzw[4];
            fp_tma::box_coords<D, BC>(c, t, hk, bz, xyzw, row0);
            tma_load_4d(tile + fp_tma::box_smem_offset(c, BC), map, xyzw[0], xyzw[1], xyzw[2], xyzw[3], bar);
        }
    }
    __device__ __forceinline__ void load_k(int st, int t) {
        load(tm_k, smem0 + fp_tma::k_offset<D, QB, W, BC>(st),
             smem0 + fp_tma::bar_offset<D, QB, W, BC>(fp_tma::BAR_FULL_K, st), t);
    }
    __device__ __forceinline__ void load_v(int st, int t) {
        if constexpr (kVt) {
            const uint32_t bar = smem0 + fp_tma::bar_offset<D, QB, W, BC>(fp_tma::BAR_FULL_V, st);
            mbar_arrive_expect_tx(bar, fp_tma::stage_tx_bytes<D>());
            tma_load_4d(smem0 + fp_tma::v_offset<D, QB, W, BC>(st), tm_v, t * BC, 0, hk, bz, bar);
        } else {
            load(tm_v, smem0 + fp_tma::v_offset<D, QB, W, BC>(st),
                 smem0 + fp_tma::bar_offset<D, QB, W, BC>(fp_tma::BAR_FULL_V, st), t);
        }
    }
};

// Paged KV: the producer warp (32 threads) instead of one thread. A tile is
// kBc / B boxes of B rows per 64 columns (fp_tma::paged_box_rows), each in
// its own page: lane j finds box j's page in the block table
// (fp_tma::paged_box_at, once per tile: K's load looks it up, V's reuses
// it) and issues that box's loads itself, so a tile's table reads are one
// round trip whatever the page size. Lane 0 announces the stage's bytes
// first (__syncwarp orders it before the other lanes' loads). QB, W: as
// producer_ops' (v9: two Q buffers).
template <int D, int QB = 1, int W = 2> struct producer_ops_paged : producer_ops<D, QB, W> {
    static constexpr int Bc = fp_tma::traits_v5<D>::kBc;
    const int32_t *bt; // the sequence's block-table row
    int L, page_size, page_shift, num_pages, box_rows, lane;
    int cur_t;         // the tile `box` was looked up for (-1: none yet)
    fp_tma::paged_box box;
    __device__ __forceinline__ void load(const CUtensorMap *map, uint32_t tile, uint32_t bar, int t) {
        if (lane == 0) mbar_arrive_expect_tx(bar, fp_tma::stage_tx_bytes<D>()); // before any box's bytes
        __syncwarp();
        const bool mine = lane * box_rows < Bc; // this lane has a box
        if (t != cur_t) {
            cur_t = t;
            if (mine) box = fp_tma::paged_box_at(bt, page_size, page_shift, num_pages, L, t, lane, box_rows);
        }
        if (mine) {
#pragma unroll
            for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c)
                tma_load_4d(tile + fp_tma::box_smem_offset(c, Bc) + (uint32_t)(lane * box_rows * 128), map,
                            c * fp_tma::kBoxCols, box.row, this->hk, box.page, bar);
        }
    }
    __device__ __forceinline__ void load_k(int st, int t) {
        load(this->tm_k, this->smem0 + fp_tma::k_offset<D, QB, W>(st),
             this->smem0 + fp_tma::bar_offset<D, QB, W>(fp_tma::BAR_FULL_K, st), t);
    }
    __device__ __forceinline__ void load_v(int st, int t) {
        load(this->tm_v, this->smem0 + fp_tma::v_offset<D, QB, W>(st),
             this->smem0 + fp_tma::bar_offset<D, QB, W>(fp_tma::BAR_FULL_V, st), t);
    }
};

// One consumer warpgroup's thread: its registers (S, O, P, softmax state)
// and the operations of the consumer schedule. Every member array is
// indexed by constants only, so the struct lives in registers.
// D: the head dim; DL: the shared-memory layout's width (layout_cols); BC:
// the tile's keys (176: v5's wide tile).
template <typename T, int D, int QB = 1, int W = 2, int BC = 128> struct consumer_ops {
    static constexpr int DL = layout_cols<T, D>();
    static constexpr int Br = fp_tma::traits_v5<DL, W, BC>::kBr, Bc = fp_tma::traits_v5<DL, W, BC>::kBc;
    float s_acc[Bc / 2], o_acc[D / 2], corr[2], m_run[2], l_run[2];
    uint32_t p_frag[Bc / wgmma_k<T>()][4];
    row_ctx rc;
    uint32_t smem0;
    uint32_t q_smem; // the Q tile this item's Q K^T reads (fp_tma::q_offset)
    int wrow, lane;
    int ctid, nthreads; // index among, and number of, the active consumer threads
    int map_rows;       // the maps' rows from the sequence's first (fp_tma::kv_seq_rows): V rows in
                        // [L, map_rows) are cleared

    __device__ __forceinline__ void wait_full_k(int st, uint32_t parity, int) {
        mbar_wait(smem0 + fp_tma::bar_offset<DL, QB, W, BC>(fp_tma::BAR_FULL_K, st), parity, fp_tma::BAR_FULL_K, st);
    }
    // V rows past a ragged sequence's length (fp_tma::v_tail_rows: at
    // most one tile per CTA) are cleared by all active consumer threads
    // before either warpgroup issues P V on the tile.
    __device__ __forceinline__ void wait_full_v(int st, uint32_t parity, int t) {
        mbar_wait(smem0 + fp_tma::bar_offset<DL, QB, W, BC>(fp_tma::BAR_FULL_V, st), parity, fp_tma::BAR_FULL_V, st);
        int r0, r1;
        fp_tma::v_tail_rows(rc.L, map_rows, t, Bc, &r0, &r1);
        if (r0 < r1) { // CTA-uniform
            const uint32_t tile = smem0 + fp_tma::v_offset<DL, QB, W, BC>(st);
            constexpr int CH = DL / 8; // 16-byte chunks per row; a row keeps its chunks under the swizzle
            for (int idx = ctid; idx < (r1 - r0) * CH; idx += nthreads) {
                const int r = r0 + idx / CH, c = idx % CH;
                st_shared_zero16(tile + fp_sm90::tile_chunk_offset<DL>(r, c, Bc));
            }
            fence_proxy_async(); // generic-proxy stores before the wgmmas' async-proxy reads
            named_barrier(1, nthreads);
        }
    }
    __device__ __forceinline__ void qk(int st) {
        issue_qk<T, D>(s_acc, q_smem, Br, wrow, smem0 + fp_tma::k_offset<DL, QB, W, BC>(st), Bc);
    }
    __device__ __forceinline__ void pv(int st) {
        issue_pv<T, D, Bc>(o_acc, p_frag, smem0 + fp_tma::v_offset<DL, QB, W, BC>(st));
    }
    __device__ __forceinline__ void wgmma_wait0() {
        wgmma_wait<0>();
        fence_regs(o_acc);
        fence_regs(s_acc);
    }
    __device__ __forceinline__ void wgmma_wait1() {
        wgmma_wait<1>();
        fence_regs(s_acc);
    }
    __device__ __forceinline__ void release_k(int st) {
        mbar_arrive(smem0 + fp_tma::bar_offset<DL, QB, W, BC>(fp_tma::BAR_EMPTY_K, st));
    }
    __device__ __forceinline__ void release_v(int st) {
        mbar_arrive(smem0 + fp_tma::bar_offset<DL, QB, W, BC>(fp_tma::BAR_EMPTY_V, st));
    }
    __device__ __forceinline__ void softmax(int t) {
        mask_tile<Bc>(s_acc, rc, t * Bc, lane);
        softmax_tile<Bc>(s_acc, m_run, l_run, corr, rc.scale_log2);
    }
    __device__ __forceinline__ void rescale_pack() {
        rescale_o<D>(o_acc, corr);
        pack_p<T, Bc>(p_frag, s_acc);
    }
    // v8's schedule: the two halves of rescale_pack apart, and the turns
    __device__ __forceinline__ void pack() { pack_p<T, Bc>(p_frag, s_acc); }
    __device__ __forceinline__ void rescale() { rescale_o<D>(o_acc, corr); }
    __device__ __forceinline__ void nb_sync(int id, int count) { named_barrier(id, count); }
    __device__ __forceinline__ void nb_arrive(int id, int count) { named_barrier<false>(id, count); }
};

// This warpgroup's 64 rows (wrow..) of w's query tile, unpacked from the
// GQA group, into the Q tile at q_smem by cp.async (rows past w.rows:
// zeros); the caller commits and waits.
template <typename T, int D, int W = 2>
__device__ __forceinline__ void load_q_rows(const flash_params &p, const cta_work &w, uint32_t q_smem, int wrow,
                                            int wtid) {
    // CH 16-byte chunks of EC elements a row
    constexpr int DL = layout_cols<T, D>(), Br = fp_tma::traits_v5<DL, W>::kBr, EC = 16 / (int)sizeof(T), CH = D / EC;
#pragma unroll 1
    for (int idx = wtid; idx < 64 * CH; idx += 128) {
        const int r = wrow + idx / CH, ch = idx % CH, gr = w.m0 + r;
        const bool ok = gr < w.rows;
        const T *src = static_cast<const T *>(p.q);
        if (ok)
            src += w.S.q0 + (int64_t)(gr / p.group) * p.q_ss + (int64_t)(w.hk * p.group + gr % p.group) * p.q_hs +
                   ch * EC;
        cp_async16(q_smem + fp_sm90::tile_chunk_offset<DL>(r, ch, Br), src, ok);
    }
}

// q (v), which the compiler may no longer assume it knows: what is loaded
// through q (computed from v) is loaded (computed) where the code says,
// not hoisted out of the loop around it. v9's consumers, at their register
// limit, use them where hoisting held registers through every tile (their
// next item's order and parameters read once an item, inside the tile
// loop; the epilogue's addresses).
template <class P> __device__ __forceinline__ P *opaque(P *q) {
#if !defined(FP_CUDA_EMU)
    asm volatile("" : "+l"(q));
#endif
    return q;
}
__device__ __forceinline__ int opaque_value(int v) {
#if !defined(FP_CUDA_EMU)
    asm volatile("" : "+r"(v));
#endif
    return v;
}

// The epilogue through shared memory and TMA (p.o_tma: one split, 16-bit
// O, dense Q / O, group dividing 64; FlashAttention-3's, session 32; v5,
// v8, v10, v5w and v9, whose chained items overlap it with the next
// item's loads and first wgmmas): this
// consumer warpgroup's 64 rows of O, normalized and rounded to T, are
// written by stmatrix over its own rows of the Q tile (free: every wgmma of
// the warpgroup that read them has retired; the Q tile's layout, 64-column
// boxes of Br rows with the 128-byte swizzle, is the O tile's), fenced for
// the async proxy and published by the warpgroup's barrier; then one
// thread stores them as D / 64 boxes of the 5-D map tm_o (columns, the GQA
// group's heads, query positions, KV heads, batch: kernels/attention/
// attention_tma_sm90.h o_map_geometry) at (64 c, 0, (m0 + wrow) / group,
// hk, b); rows past the sequence (padding) fall outside the map and are
// not written (v9: then the warpgroup meets again, kReuse: the rows are a
// later item's Q buffer). lse as store_rows. Against store_rows: D / 16 stmatrix a
// thread instead of D / 4 4-byte global stores, and the global writes are
// whole 128-byte lines issued by one thread that does not wait for them.
// Box: the issuing thread's (m0, hk, b) after the barrier, box(&m0, &hk,
// &b) (v9 recomputes them from its ticket there: nothing of them stays
// live across the stmatrix loop, where its consumers are at their register
// limit).
template <typename T, int D, int Br, bool kReuse = false, class Box>
__device__ __forceinline__ void store_rows_tma(const flash_params &p, const CUtensorMap &tm_o, uint32_t q_smem,
                                               const float (&o_acc)[D / 2], const float (&m_run)[2],
                                               const float (&l_run)[2], int m0, int wrow, int rows, int warp,
                                               int lane, int hk, int b, int cw, int wtid, Box box) {
    static_assert(sizeof(T) == 2, "16-bit O: the Q tile's layout");
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float lse;
        inv[h] = row_inv_lse(p, quad_sum(l_run[h]), m_run[h], &lse) * p.o_scale; // 1 but for a widened fp8 cache
        const int r = m0 + wrow + fp_sm90::acc_row(warp, lane, 2 * h);
        if (p.lse && (lane & 3) == 0 && r < rows) {
            const int qi = r / p.group, head = hk * p.group + r % p.group;
            p.lse[((int64_t)b * p.hq + head) * p.sq + qi] = lse;
        }
    }
    // stmatrix j: 8-column blocks j, j + 1 (matrices: rows 0-7 / 8-15 of
    // the warp's 16, block j; then block j + 1); this lane's address: row
    // lane % 8 of matrix lane / 8. v9 (kReuse) computes the addresses here
    // from an opaque lane: hoisted to the kernel's start (they depend on
    // the thread alone), they held registers through every item's tile loop
    // and the checked build spilled two of them.
    if constexpr (kReuse) lane = opaque_value(lane);
    const int mi = lane / 8, srow = wrow + 16 * warp + 8 * (mi & 1) + lane % 8;
#pragma unroll
    for (int j = 0; j < D / 8; j += 2) {
        uint32_t r4[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int a = 4 * (j + (i >> 1)) + 2 * (i & 1);
            r4[i] = pack_op<T>::pack(o_acc[a] * inv[i & 1], o_acc[a + 1] * inv[i & 1]);
        }
        stmatrix_x4(q_smem + fp_sm90::tile_chunk_offset<D>(srow, j + (mi >> 1), Br), r4);
    }
    fence_proxy_async(); // the generic-proxy stores before the TMA's async-proxy reads
    named_barrier(2 + cw, 128);
    if (wtid == 0) {
        int bm0, bhk, bb;
        box(&bm0, &bhk, &bb);
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
            tma_store_5d(&tm_o, q_smem + fp_sm90::tile_chunk_offset<D>(wrow, 8 * c, Br), 64 * c, 0,
                         (bm0 + wrow) / p.group, bhk, bb);
        bulk_commit();
        bulk_wait_read0(); // before the thread exits: the CTA's shared memory goes with it
    }
    // v9: the rows are the Q buffer of a later item, which the warpgroup's
    // threads load next (prefetch_q): all of them wait for the stores' reads
    if constexpr (kReuse) named_barrier(2 + cw, 128);
}

// The body of v5, v8 and v10 (kTurns: the consumer warpgroups take turns,
// fp_tma::consumer_schedule_turns; W consumer warpgroups: 3 in v10). grid:
// (m_tiles * num_splits, heads_kv, batch); block: 128 (1 + W) (producer
// warpgroup + W consumer warpgroups); dynamic shared memory
// fp_tma::smem_bytes<D, 1, W>(). tm_k / tm_v: K and V as 4-D tensor maps
// (fp_tma::kv_map_geometry), box 64 x kBc, 128-byte swizzle.
template <typename T, int D, bool kTurns, int W = 2, int BC = 128>
__device__ __forceinline__ void flash_tma_body(const flash_params &p, const CUtensorMap &tm_k,
                                               const CUtensorMap &tm_v, const CUtensorMap &tm_o) {
    // fp8 (e4m3, head_dim 128): the layout of a 16-bit tile of DL = 64
    // columns (128-byte rows), V as V^T (fp8_transpose_v), O bf16
    constexpr bool kFp8 = sizeof(T) == 1;
    constexpr int DL = layout_cols<T, D>();
    using Tr = fp_tma::traits_v5<DL, W, BC>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, Stages = Tr::kStages;
    static_assert(Br == 64 * Tr::kConsumerWGs && Bc == BC &&
                      (Bc == 128 || (Bc == 176 && D == 128 && W == 2 && !kFp8 && !kTurns)),
                  "one m64 row block per consumer warpgroup, m64n128 Q K^T (m64n176: v5's wide tile)");
    static_assert(Tr::kThreads == 128 * (1 + Tr::kConsumerWGs) && Tr::kConsumerWGs == W,
                  "one producer warpgroup + the consumers");
    static_assert(W <= fp_tma::kMaxTurnWGs && 2 + W <= fp_tma::kTurnBar0, "named barrier ids: Q per warpgroup, turns");
    static_assert(128 * Tr::kProducerRegs + 128 * Tr::kConsumerWGs * Tr::kConsumerRegs <= fp_tma::kRegisterFile,
                  "register file");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u; // SW128 tiles start on 1024-byte boundaries

    // v10: the warpgroup index through a shuffle, which ptxas knows to be
    // warp-uniform (CUTLASS's canonical_warp_group_idx), so that a consumer
    // warpgroup's Q descriptor lives in uniform registers: from tid / 128
    // it took two of the 160 registers and the consumers spilled 24 bytes.
    // v5 / v8 keep their measured code.
    const int tid = threadIdx.x, wg = W == 3 ? __shfl_sync(0xffffffffu, tid / 128, 0) : tid / 128;
    const int warp = (tid / 32) % 4, lane = tid % 32;
    // The CTA timeline (traced launches only: rec is CTA-uniform): thread 0
    // stamps the start, consumer thread 0 the first K tile and the loop's
    // end, each active consumer warpgroup its epilogue's end (the latest).
    fp_cta_record *const rec = p.cta_trace ? p.cta_trace + fp_cta::linear_cta(0) : nullptr;
    if (rec && tid == 0) fp_cta::start_at(rec, fp_cta::linear_cta(0));
    cta_work w;
    if (!cta_work_of(p, Br, Bc, 0, w)) { // CTA-uniform, before any barrier
        if (rec && tid == 0) fp_cta::mark_at(rec, FP_CTA_END);
        return;
    }
    const int split = w.split, hk = w.hk, b = w.b, m0 = w.m0, rows = w.rows;
    const fp_flash::seq_view &S = w.S;
    const fp_tma::seq_rows kv = fp_tma::kv_seq_rows(p.cu_k, b, p.sk, p.kv_rows);
    const fp_flash::block_plan &plan = w.plan;
    const int s_begin = plan.s_begin, s_end = plan.s_end;
    // A consumer warpgroup whose 64 rows are all padding takes no part: the
    // empty barriers count the active ones' threads (the first warpgroup is
    // always active: the CTA has a row).
    // (W = 2: the same count written as v5 / v8 always had it, which keeps
    // their measured SASS instruction for instruction; test_attention_tma_emu
    // checks active_consumer_wgs agrees at W = 2)
    const int active_wgs = W == 2 ? (m0 + 64 < rows ? 2 : 1) : fp_tma::active_consumer_wgs(rows - m0, W);
    if (tid == 0) {
        for (int s = 0; s < Stages; ++s) {
            mbar_init(smem0 + fp_tma::bar_offset<DL, 1, W, BC>(fp_tma::BAR_FULL_K, s), 1);
            mbar_init(smem0 + fp_tma::bar_offset<DL, 1, W, BC>(fp_tma::BAR_FULL_V, s), 1);
            mbar_init(smem0 + fp_tma::bar_offset<DL, 1, W, BC>(fp_tma::BAR_EMPTY_K, s),
                      fp_tma::empty_count(active_wgs));
            mbar_init(smem0 + fp_tma::bar_offset<DL, 1, W, BC>(fp_tma::BAR_EMPTY_V, s),
                      fp_tma::empty_count(active_wgs));
        }
        fence_mbar_init();
    }
    __syncthreads(); // the only CTA-wide barrier

    if (wg == 0) { // producer warpgroup: one thread issues everything (paged: one warp)
        setmaxnreg_dec<Tr::kProducerRegs>();
        if (!kFp8 && BC == 128 && p.block_table) { // paged: 128-key tiles only (the launcher refuses the rest)
            if (tid < 32 && s_begin < s_end) {
                if (tid == 0) {
                    prefetch_tensormap(&tm_k);
                    prefetch_tensormap(&tm_v);
                }
                producer_ops_paged<DL, 1, W> ops;
                ops.tm_k = &tm_k;
                ops.tm_v = &tm_v;
                ops.smem0 = smem0;
                ops.hk = hk;
                ops.bz = ops.row0 = 0;
                ops.bt = p.block_table + (int64_t)b * p.bt_stride;
                ops.L = S.L;
                ops.page_size = p.page_size;
                ops.page_shift = p.page_shift;
                ops.num_pages = p.num_pages;
                ops.box_rows = fp_tma::paged_box_rows(p.page_size);
                ops.lane = tid;
                ops.cur_t = -1;
                fp_tma::producer_schedule<Stages>(s_begin, s_end, ops);
            }
        } else if (tid == 0 && s_begin < s_end) {
            prefetch_tensormap(&tm_k);
            prefetch_tensormap(&tm_v);
            producer_ops<DL, 1, W, kFp8, BC> ops = {&tm_k, &tm_v, smem0, hk, kv.bz, kv.row0};
            fp_tma::producer_schedule<Stages>(s_begin, s_end, ops);
        }
        return;
    }
    setmaxnreg_inc<Tr::kConsumerRegs>();
    const int cw = wg - 1, wrow = 64 * cw; // consumer warpgroup, its first tile row
    if (cw >= active_wgs) return;
    const int ctid = tid - 128; // 0 .. 128 active_wgs - 1

    consumer_ops<T, D, 1, W, BC> c;
    c.smem0 = smem0;
    c.q_smem = smem0 + fp_tma::q_offset<DL, 1, W>();
    c.wrow = wrow;
    c.lane = lane;
    c.ctid = ctid;
    c.nthreads = 128 * active_wgs;
    // paged: rows past L of the last real box are cleared, the boxes after it are zeros
    // fp8: V^T holds zeros past each sequence's length (fp8_transpose_v): nothing to clear
    c.map_rows = kFp8           ? 0
                 : p.block_table ? fp_tma::paged_map_rows(S.L, fp_tma::paged_box_rows(p.page_size))
                                 : kv.map_rows;
    c.rc = {m0 + wrow + fp_sm90::acc_row(warp, lane, 0), p.group, S.L, S.sq, p.wl, p.wr, p.scale_log2, plan};
#pragma unroll
    for (int i = 0; i < D / 2; ++i) c.o_acc[i] = 0.0f;
    c.m_run[0] = c.m_run[1] = -INFINITY;
    c.l_run[0] = c.l_run[1] = 0.0f;

    if (s_begin < s_end) {
        // Q: this warpgroup's 64 rows (unpacked from the GQA group), once,
        // by cp.async; published to its own wgmmas by a warpgroup barrier.
        {
            load_q_rows<T, D, W>(p, w, c.q_smem, wrow, tid % 128);
            cp_async_commit();
            cp_async_wait<0>();
            fence_proxy_async();
            named_barrier(2 + cw, 128);
        }
        if (rec && ctid < 32) { // traced: the first K tile, waited for by one warp before the schedule does
            mbar_wait(smem0 + fp_tma::bar_offset<DL, 1, W, BC>(fp_tma::BAR_FULL_K, fp_tma::ring_stage(0, Stages)),
                      fp_tma::full_parity(0, Stages), fp_tma::BAR_FULL_K, 0);
            if (ctid == 0) fp_cta::mark_at(rec, FP_CTA_LANDED);
        }
        if (kTurns)
            fp_tma::consumer_schedule_turns<Stages, W>(s_begin, s_end, cw, W == 2 && active_wgs < 2 ? 0 : active_wgs, c);
        else
            fp_tma::consumer_schedule<Stages>(s_begin, s_end, c);
        if (rec && ctid == 0) fp_cta::mark_at(rec, FP_CTA_LOOP, s_end - s_begin);
    }

    // Epilogue (attention_sm90_common.cuh, as v3): row sums over the quad,
    // normalize, write O (and lse) or the split partials; or through
    // shared memory and TMA stores.
    if constexpr (!kFp8) {
        if (p.o_tma) { // the launcher sets it for one split, dense Q / O only
            store_rows_tma<T, D, Br>(p, tm_o, c.q_smem, c.o_acc, c.m_run, c.l_run, m0, wrow, rows, warp, lane, hk, b,
                                     cw, tid % 128, [&](int *bm0, int *bhk, int *bb) {
                                         *bm0 = m0;
                                         *bhk = hk;
                                         *bb = b;
                                     });
            if (rec && tid % 128 == 0) fp_cta::end_max_at(rec);
            fp_stamp::end_by(p.stamp, tid % 128 == 0); // each consumer warpgroup: the last one's is the end
            return;
        }
    }
    store_rows<T, D>(p, S, c.o_acc, c.m_run, c.l_run, m0 + wrow, rows, warp, lane, hk, b, split);
    if (rec && tid % 128 == 0) fp_cta::end_max_at(rec);
    fp_stamp::end_by(p.stamp, tid % 128 == 0);
}

template <typename T, int D>
__global__ void __launch_bounds__(fp_tma::kThreads, 1)
    attention_flash_fwd_v5(const __grid_constant__ flash_params p, const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v,
        const __grid_constant__ CUtensorMap tm_o) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(FP_CUDA_EMU)
    flash_tma_body<T, D, false>(p, tm_k, tm_v, tm_o);
#else
    __trap(); // no sm_90a features in this compilation: never launched (the launcher checks the device)
#endif
}
// v8: v5 with turns (ping-pong consumers) and O's rescale under Q K^T
// (NOTES.md, session 18).
template <typename T, int D>
__global__ void __launch_bounds__(fp_tma::kThreads, 1)
    attention_flash_fwd_v8(const __grid_constant__ flash_params p, const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v,
        const __grid_constant__ CUtensorMap tm_o) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(FP_CUDA_EMU)
    flash_tma_body<T, D, true>(p, tm_k, tm_v, tm_o);
#else
    __trap();
#endif
}
// v5 with FlashAttention-3's non-causal tile at head_dim 128, 128 x 176
// (FP_ATTN_V5_WIDE, recorded as v5; NOTES.md, session 30): 16-bit types,
// dense or varlen K / V (no paged KV, no fp8). v5's schedule, not v8's
// turns: with turns ptxas spilled 28 bytes (196 in the checked build) at
// the 240 registers a consumer thread has; without, none.
template <typename T, int D>
__global__ void __launch_bounds__(fp_tma::kThreads, 1)
    attention_flash_fwd_v5w(const __grid_constant__ flash_params p, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v,
        const __grid_constant__ CUtensorMap tm_o) {
    static_assert(D == 128 && sizeof(T) == 2, "the wide tile: head_dim 128, 16-bit types");
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(FP_CUDA_EMU)
    flash_tma_body<T, D, false, 2, 176>(p, tm_k, tm_v, tm_o);
#else
    __trap();
#endif
}
// v10: v8 with three consumer warpgroups (192-row query tiles, turns going
// round), head_dim 64 only (NOTES.md, session 23).
template <typename T, int D>
__global__ void __launch_bounds__(fp_tma::threads_of<10>(), 1)
    attention_flash_fwd_v10(const __grid_constant__ flash_params p, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v,
        const __grid_constant__ CUtensorMap tm_o) {
    static_assert(D == 64, "v10 is head_dim 64 only");
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(FP_CUDA_EMU)
    flash_tma_body<T, D, true, 3>(p, tm_k, tm_v, tm_o);
#else
    __trap();
#endif
}

// ---- fp8 (e4m3): V^T ---------------------------------------------------------
// Hopper's fp8 wgmma reads B K-major only, and P V's B is V with the keys as
// its k dimension: V [keys][head_dim] is MN-major there (what the transpose
// bit serves for 16-bit types). So before the attention kernel, V is
// written transposed into scratch, Vt [batch][heads_kv][head_dim][skp]
// (skp: seqlen_k rounded up to kBc), each sequence's keys at or past its
// length L (seqlens_k) as zeros (the attention kernel then clears nothing:
// P = 0 there times 0), and the columns of each group of 16 keys in
// fp_sm90::vt_key's order, the order of P's bytes in its registers
// (pack_p). The attention kernel loads a V^T tile as one TMA box of kBc
// keys x head_dim rows, the layout of a K tile. One CTA per 128 keys x 128
// columns of one (batch, KV head): 16 KiB in through 16-byte loads, 16 KiB
// out in 16-byte stores. FlashAttention-3 transposes in the kernel
// (LDSM.T / STSM in the producer warpgroup); this pass costs a read and a
// write of V (NOTES.md, session 26).
constexpr int kVtThreads = 256, kVtPitch = 144; // tile rows of 128 bytes + 16 (a staggered bank start a row)
__global__ void __launch_bounds__(kVtThreads)
    fp8_transpose_v(const uint8_t *v, int64_t v_bs, int64_t v_ss, int64_t v_hs, const int32_t *seqlens_k, int sk,
                    int skp, int b_off, uint8_t *vt, fp_span_stamp stamp) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(stamp); // the call's first kernel (kernel timer)
    extern __shared__ __align__(16) unsigned char vt_smem[];
    const int k0 = blockIdx.x * 128, hk = blockIdx.y, hkv = gridDim.y, b = b_off + blockIdx.z;
    int L = sk;
    if (seqlens_k) L = min(max(seqlens_k[b], 0), sk);
    // in: key row r (k0 + r), 16-byte chunk c of its 128 columns
    for (int idx = threadIdx.x; idx < 128 * 8; idx += kVtThreads) {
        const int r = idx / 8, c = idx % 8, key = k0 + r;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (key < L) x = *reinterpret_cast<const uint4 *>(v + b * v_bs + (int64_t)key * v_ss + hk * v_hs + 16 * c);
        *reinterpret_cast<uint4 *>(vt_smem + r * kVtPitch + 16 * c) = x;
    }
    __syncthreads();
    // out: row d of V^T, 16 key slots from slot 16 c: keys vt_key(slot)
    uint8_t *out = vt + (((int64_t)b * hkv + hk) * 128) * skp + k0;
    for (int idx = threadIdx.x; idx < 128 * 8; idx += kVtThreads) {
        const int d = idx / 8, c = idx % 8;
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            uint32_t x = 0;
#pragma unroll
            for (int y = 0; y < 4; ++y)
                x |= (uint32_t)vt_smem[fp_sm90::vt_key(16 * c + 4 * q + y) * kVtPitch + d] << (8 * y);
            w[q] = x;
        }
        *reinterpret_cast<uint4 *>(out + (int64_t)d * skp + 16 * c) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    fp_stamp::end(stamp);
}

// ---- v9: persistent CTAs (fp_tma::producer_items / consumer_items) ------------

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
#if defined(FP_CUDA_EMU)
    std::memcpy(fp_emu::smem_at(addr, 4), &v, 4);
#else
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
    uint32_t v;
#if defined(FP_CUDA_EMU)
    std::memcpy(&v, fp_emu::smem_at(addr, 4), 4);
#else
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
#endif
    return v;
}

// Item (ticket) r of the order: false when it has no work (a varlen tile
// past its sequence's rows).
template <int D>
__device__ __forceinline__ bool item_work(const flash_params &p, const fp_tma::tile_order &o, int r, cta_work &w) {
    int m_tile, unit, split, hk, b;
    fp_tma::order_item(o, r, &m_tile, &unit);
    fp_tma::unit_coords(o, unit, &split, &hk, &b);
    return work_at(p, fp_tma::traits_v5<D>::kBr, fp_tma::traits_v5<D>::kBc, m_tile, split, hk, b, w);
}

// The producer thread of v9: v5's loads plus the tickets (p->tickets: [2],
// zero between launches) and the item ring. It runs on 40 registers
// (setmaxnreg, fp_tma::producer_regs): the grid and block indices are read
// where needed, not kept.
// kPaged: the producer warp over a paged KV cache (producer_ops_paged's
// boxes, each lane its own); every lane runs the schedule, lane 0 alone
// draws (its ticket passed to the warp by a shuffle), publishes and counts
// the CTA done. Lane 0 publishes before the arrive.expect_tx of the draw
// tile's K, which that tile's completion needs: the consumers' read, after
// that K, never waits on the draw (as with the one thread).
template <int D, bool kPaged = false>
struct producer_item_ops : std::conditional_t<kPaged, producer_ops_paged<D, 2>, producer_ops<D, 2>> {
    const flash_params *p;
    const fp_tma::tile_order *ord;
    __device__ __forceinline__ bool leader() const {
        if constexpr (kPaged) return this->lane == 0;
        return true;
    }
    __device__ __forceinline__ int first_ticket() { return (int)blockIdx.x; }
    __device__ __forceinline__ int next_ticket() {
        if constexpr (kPaged) {
            int t = 0;
            if (this->lane == 0) t = atomicAdd(p->tickets, 1);
            return (int)gridDim.x + __shfl_sync(0xffffffffu, t, 0);
        }
        return (int)gridDim.x + atomicAdd(p->tickets, 1);
    }
    __device__ __forceinline__ bool valid(int t) { return t < ord->items; }
    __device__ __forceinline__ int lead() { return ord->lead; }
    __device__ __forceinline__ void wait_item_empty(int s, uint32_t parity) {
        mbar_wait(this->smem0 + fp_tma::item_bar_offset<D>(fp_tma::BAR_ITEM_EMPTY, s), parity, fp_tma::BAR_ITEM_EMPTY,
                  s);
    }
    // the ticket, then the arrival (release): the consumers' wait acquires it
    __device__ __forceinline__ void publish(int s, int t) {
        if (!leader()) return;
        st_shared_u32(this->smem0 + fp_tma::item_slot_offset<D>(s), (uint32_t)t);
        mbar_arrive(this->smem0 + fp_tma::item_bar_offset<D>(fp_tma::BAR_ITEM_FULL, s));
    }
    __device__ __forceinline__ bool item(int t, int *sb, int *se) {
        cta_work w;
        if (!item_work<D>(*p, *ord, t, w)) return false;
        this->hk = w.hk;
        if constexpr (kPaged) { // the sequence's block-table row; no box looked up for it yet
            this->bt = p->block_table + (int64_t)w.b * p->bt_stride;
            this->L = w.S.L;
            this->cur_t = -1;
        } else {
            const fp_tma::seq_rows kv = fp_tma::kv_seq_rows(p->cu_k, w.b, p->sk, p->kv_rows);
            this->bz = kv.bz;
            this->row0 = kv.row0;
        }
        *sb = w.plan.s_begin;
        *se = w.plan.s_end;
        return true;
    }
    // Every CTA draws past the end exactly once, after its last real draw;
    // the last CTA to do so (all draws done) resets both counters for the
    // next launch (stream order publishes them).
    __device__ __forceinline__ void done() {
        if (!leader()) return;
        __threadfence();
        if (atomicAdd(p->tickets + 1, 1) == (int)gridDim.x - 1) {
            __threadfence();
            atomicExch(p->tickets, 0);
            atomicExch(p->tickets + 1, 0);
        }
    }
};

// v9's last kernel parameter: O's tensor map (the TMA-store epilogue) and
// the order, together so that a consumer thread keeps one pointer to both
// (a pointer of its own to the map spilled the checked build's consumers).
struct v9_args {
    CUtensorMap tm_o; // zero unless p.o_tma
    fp_tma::tile_order ord;
};

// A consumer thread of v9: v8's registers and operations plus the items'.
template <typename T, int D> struct consumer_item_ops : consumer_ops<T, D, 2> {
    const flash_params *p;
    const v9_args *x; // the order, and O's map for the TMA-store epilogue (p->o_tma)
    int ticket; // the current item (its work is recomputed for the epilogue: fewer live registers)
    int cw, warp, wtid;
    // chained items (fp_tma::consumer_schedule_chain): the finishing item's
    // softmax state, kept for its epilogue, and the next item's ticket
    float end_m[2], end_l[2];
    int next_ticket;
    __device__ __forceinline__ bool valid(int t) { return t < x->ord.items; }
    __device__ __forceinline__ int lead() { return x->ord.lead; }
    __device__ __forceinline__ int read_item(int s, uint32_t parity) {
        mbar_wait(this->smem0 + fp_tma::item_bar_offset<D>(fp_tma::BAR_ITEM_FULL, s), parity, fp_tma::BAR_ITEM_FULL,
                  s);
        const int t = (int)ld_shared_u32(this->smem0 + fp_tma::item_slot_offset<D>(s));
        mbar_arrive(this->smem0 + fp_tma::item_bar_offset<D>(fp_tma::BAR_ITEM_EMPTY, s));
        return t;
    }
    __device__ __forceinline__ bool prefetch_q(int t, int qb, int *sb, int *se) {
        cta_work wn;
        const bool work = item_work<D>(*opaque(p), opaque(x)->ord, t, wn);
        if (work) {
            load_q_rows<T, D>(*p, wn, this->smem0 + fp_tma::q_offset<D, 2>(qb), this->wrow, wtid);
            *sb = wn.plan.s_begin;
            *se = wn.plan.s_end;
        }
        cp_async_commit();
        return work;
    }
    // Item t's Q (buffer qb) published to this warpgroup's wgmmas, its rows'
    // softmax context and V bound; `ticket` stays the finishing item's.
    // The CTA timeline (p->cta_trace: traced launches only): record t is
    // item t's; consumer thread 0 stamps its start here (its Q about to be
    // published), its loop's end and the CTA's number and SM; each warpgroup
    // the end of its epilogue (the latest: end_item).
    __device__ __forceinline__ void use_item(int t, int qb, const cta_work &w) {
        if (p->cta_trace && cw == 0 && wtid == 0) fp_cta::start_at(p->cta_trace + t, blockIdx.x);
        // paged: rows past L of the last real box are cleared, the boxes after it are zeros
        this->map_rows = p->block_table ? fp_tma::paged_map_rows(w.S.L, fp_tma::paged_box_rows(p->page_size))
                                        : fp_tma::kv_seq_rows(p->cu_k, w.b, p->sk, p->kv_rows).map_rows;
        fence_proxy_async();
        named_barrier(2 + cw, 128); // Q published to this warpgroup's wgmmas
        this->q_smem = this->smem0 + fp_tma::q_offset<D, 2>(qb);
        this->rc = {w.m0 + this->wrow + fp_sm90::acc_row(warp, this->lane, 0), p->group, w.S.L, w.S.sq, p->wl, p->wr,
                    p->scale_log2, w.plan};
        this->m_run[0] = this->m_run[1] = -INFINITY;
        this->l_run[0] = this->l_run[1] = 0.0f;
    }
    __device__ __forceinline__ bool begin_item(int t, int qb, int *sb, int *se) {
        cp_async_wait<0>(); // this item's Q landed (the next one's is loaded later, under this item)
        cta_work w;
        if (!item_work<D>(*p, x->ord, t, w)) return false;
        ticket = t;
        use_item(t, qb, w);
#pragma unroll
        for (int i = 0; i < D / 2; ++i) this->o_acc[i] = 0.0f;
        *sb = w.plan.s_begin;
        *se = w.plan.s_end;
        return true;
    }
    // Chained: the next item (t, which has tiles: prefetch_q) begins inside
    // this one's last iteration; no cp.async group was committed after its
    // Q's. O is this item's until end_item(true).
    __device__ __forceinline__ void begin_next(int t, int qb) {
        cp_async_wait<0>();
        cta_work w;
        item_work<D>(*p, x->ord, t, w); // true: prefetch_q said so
        end_m[0] = this->m_run[0];
        end_m[1] = this->m_run[1];
        end_l[0] = this->l_run[0];
        end_l[1] = this->l_run[1];
        next_ticket = t;
        use_item(t, qb, w);
    }
    __device__ __forceinline__ void end_item(bool chained) {
        if (!chained) { // the state is this item's own
            end_m[0] = this->m_run[0];
            end_m[1] = this->m_run[1];
            end_l[0] = this->l_run[0];
            end_l[1] = this->l_run[1];
        }
        cta_work w;
        item_work<D>(*p, x->ord, ticket, w); // true: begin_item / prefetch_q said so
        fp_cta_record *const rec = p->cta_trace ? p->cta_trace + ticket : nullptr;
        if (rec && cw == 0 && wtid == 0 && w.plan.s_begin < w.plan.s_end)
            fp_cta::mark_at(rec, FP_CTA_LOOP, w.plan.s_end - w.plan.s_begin); // its last P V retired
        if (p->o_tma) {
            // O through the finishing item's Q buffer: q_smem, or when chained
            // the other one (q_smem is the next item's already)
            const uint32_t kQ = fp_tma::q_offset<D, 2>(1); // the second buffer's offset
            const uint32_t q = chained ? this->smem0 + kQ - (this->q_smem - this->smem0) : this->q_smem;
            const int t = ticket;
            store_rows_tma<T, D, 128, true>(*p, x->tm_o, q, this->o_acc, end_m, end_l, w.m0, this->wrow, w.rows, warp,
                                            this->lane, w.hk, w.b, cw, wtid, [&](int *bm0, int *bhk, int *bb) {
                                                cta_work wb;
                                                item_work<D>(*p, x->ord, t, wb);
                                                *bm0 = wb.m0;
                                                *bhk = wb.hk;
                                                *bb = wb.b;
                                            });
        } else {
            store_rows<T, D>(*p, w.S, this->o_acc, end_m, end_l, w.m0 + this->wrow, w.rows, warp, this->lane, w.hk,
                             w.b, w.split);
        }
        if (rec && wtid == 0) fp_cta::end_max_at(rec);
        if (chained) {
#pragma unroll
            for (int i = 0; i < D / 2; ++i) this->o_acc[i] = 0.0f;
            ticket = next_ticket;
        }
    }
};

// The body of v9: v8 (turns, O's rescale under Q K^T) in persistent CTAs,
// consecutive items chained (fp_tma::consumer_schedule_chain).
// grid: fp_tma::persistent_ctas(items, SMs); block: 384; dynamic shared
// memory fp_tma::smem_bytes_v9<D>() (two Q buffers, the item ring).
// The barriers are initialized once; the producer runs the K / V ring on
// across the CTA's items, so it loads the next item's first tiles as soon as
// the consumers release stages of this one. Both consumer warpgroups run
// every item (a warpgroup whose 64 rows are padding computes on zero rows
// and stores nothing), so the empty barriers count 256 arrivals throughout
// and the turns are always on. p.tickets: [2] ints, zero at launch.
template <typename T, int D>
__device__ __forceinline__ void flash_tma_persistent_body(const flash_params &p, const CUtensorMap &tm_k,
                                                          const CUtensorMap &tm_v, const v9_args &x) {
    const fp_tma::tile_order &ord = x.ord;
    using Tr = fp_tma::traits_v5<D>;
    constexpr int Stages = Tr::kStages;
    static_assert(Tr::kBr == 128 && Tr::kConsumerWGs == 2, "two consumer warpgroups of 64 rows");
    static_assert(128 * fp_tma::producer_regs<D, 9>() + 256 * fp_tma::consumer_regs<D, 9>() <= fp_tma::kRegisterFile,
                  "register file");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;

    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0) {
        for (int s = 0; s < Stages; ++s) {
            mbar_init(smem0 + fp_tma::bar_offset<D, 2>(fp_tma::BAR_FULL_K, s), 1);
            mbar_init(smem0 + fp_tma::bar_offset<D, 2>(fp_tma::BAR_FULL_V, s), 1);
            mbar_init(smem0 + fp_tma::bar_offset<D, 2>(fp_tma::BAR_EMPTY_K, s), fp_tma::empty_count(2));
            mbar_init(smem0 + fp_tma::bar_offset<D, 2>(fp_tma::BAR_EMPTY_V, s), fp_tma::empty_count(2));
        }
        for (int s = 0; s < 2; ++s) {
            mbar_init(smem0 + fp_tma::item_bar_offset<D>(fp_tma::BAR_ITEM_FULL, s), 1);
            mbar_init(smem0 + fp_tma::item_bar_offset<D>(fp_tma::BAR_ITEM_EMPTY, s), fp_tma::empty_count(2));
        }
        fence_mbar_init();
    }
    __syncthreads(); // the only CTA-wide barrier

    if (wg == 0) {
        setmaxnreg_dec<fp_tma::producer_regs<D, 9>()>();
        if (p.block_table) { // paged: the producer warp (producer_item_ops<D, true>)
            if (tid < 32) {
                if (tid == 0) {
                    prefetch_tensormap(&tm_k);
                    prefetch_tensormap(&tm_v);
                }
                producer_item_ops<D, true> ops;
                ops.tm_k = &tm_k;
                ops.tm_v = &tm_v;
                ops.smem0 = smem0;
                ops.hk = ops.bz = ops.row0 = 0;
                ops.page_size = p.page_size;
                ops.page_shift = p.page_shift;
                ops.num_pages = p.num_pages;
                ops.box_rows = fp_tma::paged_box_rows(p.page_size);
                ops.lane = tid;
                ops.p = &p;
                ops.ord = &ord;
                fp_tma::producer_items<Stages>(ops);
            }
        } else if (tid == 0) {
            prefetch_tensormap(&tm_k);
            prefetch_tensormap(&tm_v);
            producer_item_ops<D> ops;
            ops.tm_k = &tm_k;
            ops.tm_v = &tm_v;
            ops.smem0 = smem0;
            ops.hk = ops.bz = ops.row0 = 0;
            ops.p = &p;
            ops.ord = &ord;
            fp_tma::producer_items<Stages>(ops);
        }
        return;
    }
    setmaxnreg_inc<fp_tma::consumer_regs<D, 9>()>();
    consumer_item_ops<T, D> c;
    c.smem0 = smem0;
    c.cw = wg - 1;
    c.wrow = 64 * c.cw;
    c.warp = (tid / 32) % 4;
    c.lane = tid % 32;
    c.wtid = tid % 128;
    c.ctid = tid - 128;
    c.nthreads = 256;
    c.map_rows = p.sk; // per item: begin_item
    c.p = &p;
    c.x = &x;
    fp_tma::consumer_items<Stages>(c.cw, c);
}

// v9: v8 in persistent CTAs over fp_tma's causal-aware order (NOTES.md,
// session 19).
template <typename T, int D>
__global__ void __launch_bounds__(fp_tma::kThreads, 1)
    attention_flash_fwd_v9(const __grid_constant__ flash_params p, const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ v9_args x) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(FP_CUDA_EMU)
    flash_tma_persistent_body<T, D>(p, tm_k, tm_v, x);
    fp_stamp::end_by(p.stamp, threadIdx.x % 128 == 0); // each warpgroup as it leaves: the last one's is the end
#else
    __trap();
#endif
}

// ---- host ---------------------------------------------------------------------

typedef PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_fn;

// cuTensorMapEncodeTiled from the driver, looked up once (libfastpath does
// not link libcuda). NULL with an error set when the driver lacks it.
encode_tiled_fn encode_tiled(fp_status *st) {
    static std::atomic<encode_tiled_fn> cached{nullptr};
    encode_tiled_fn fn = cached.load(std::memory_order_acquire);
    if (fn) return fn;
    void *f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !f) {
        (void)cudaGetLastError();
        *st = fp_set_error(FP_ERR_UNSUPPORTED,
                           "attention flash kernel v5: the driver does not provide cuTensorMapEncodeTiled (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found");
        return nullptr;
    }
    fn = reinterpret_cast<encode_tiled_fn>(f);
    cached.store(fn, std::memory_order_release);
    return fn;
}

// The TMA layout checks for K or V (`which`), without a device: what
// kv_map_geometry refuses becomes FP_ERR_UNSUPPORTED naming the tensor.
// The box rows are kBc, the same at both head dims.
// Varlen: one map over the packed sequence dimension, whose extent only
// the caller knows (the offsets are device memory): refused without
// fp_attention_params.total_k (the dispatch then runs v3), and where
// total_k + seqlen_k + 2 kBc would not stay below 2^31 (the int
// coordinates of fp_tma::kv_seq_rows / box_coords).
static_assert(fp_tma::traits_v5<64>::kBc == fp_tma::traits_v5<128>::kBc, "one box height for both head dims");
// Paged KV: one map over the pool, (D, page_size, heads_kv, num_pages),
// boxes of fp_tma::paged_box_rows(page_size) rows; page sizes that are not
// multiples of 8 are refused (a box must fill whole 8-row swizzle groups),
// and seqlen_k above 2^31 - 2 kBc - 1 (fp_tma::paged_box_at's int keys).
// Bc: the tile's keys, the box rows of a dense / varlen map (176: v8's
// wide tile, which takes no paged KV).
fp_status kv_layout(const fp_attn_args *a, int version, const void *base, int64_t ss, int64_t hs, int64_t bs,
                    const char *which, fp_tma::kv_map *m, int Bc = fp_tma::traits_v5<128>::kBc) {
    const bool varlen = a->cu_k != nullptr;
    if (a->block_table) {
        if (a->page_size % 8)
            return fp_set_error(FP_ERR_UNSUPPORTED,
                                "attention flash kernel v%d (TMA): paged KV with page_size %d, not a multiple of 8 "
                                "(a page's rows load as TMA boxes of whole 8-row swizzle groups)",
                                version, a->page_size);
        if (a->seqlen_k > 2147483647 - 2 * Bc)
            return fp_set_error(FP_ERR_UNSUPPORTED,
                                "attention flash kernel v%d (TMA): paged seqlen_k %d above 2^31 - %d (int keys)",
                                version, a->seqlen_k, 2 * Bc + 1);
        const int s = fp_tma::kv_map_geometry(reinterpret_cast<uintptr_t>(base), a->head_dim, a->page_size,
                                              a->heads_kv, a->num_pages, ss, hs, bs,
                                              fp_tma::paged_box_rows(a->page_size), m);
        if (s != fp_tma::KV_MAP_OK)
            return fp_set_error(FP_ERR_UNSUPPORTED,
                                "attention flash kernel v%d (TMA): paged %s: %s (the batch stride is the page "
                                "stride; seq stride %lld, head stride %lld, page stride %lld elements)",
                                version, which, fp_tma::kv_map_status_text(s), (long long)ss, (long long)hs,
                                (long long)bs);
        return FP_OK;
    }
    if (varlen && a->total_k <= 0)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d (TMA): varlen (cu_seqlens) without total_k: a tensor map "
                            "needs the rows of K / V (set fp_attention_params.total_k)",
                            version);
    if (varlen && a->total_k > 2147483647LL - a->seqlen_k - 2 * Bc)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d (TMA): varlen total_k %lld + seqlen_k %d above 2^31 - %d "
                            "(int tensor-map coordinates)",
                            version, (long long)a->total_k, a->seqlen_k, 2 * Bc + 1);
    const int rows = varlen ? (int)a->total_k : a->seqlen_k, nb = varlen ? 1 : a->batch;
    const int s = fp_tma::kv_map_geometry(reinterpret_cast<uintptr_t>(base), a->head_dim, rows, a->heads_kv, nb, ss,
                                          hs, varlen ? 0 : bs, Bc, m, a->dtype == FP_FP8_E4M3 ? 1 : 2);
    if (s != fp_tma::KV_MAP_OK)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d (TMA): %s: %s (seq stride %lld, head stride %lld, batch "
                            "stride %lld elements)",
                            version, which, fp_tma::kv_map_status_text(s), (long long)ss, (long long)hs, (long long)bs);
    return FP_OK;
}

// A tensor map's parameters (rank <= 5; zero past the rank), compared
// bytewise as the cache's key.
struct tmap_key {
    const void *base;
    int dtype, rank;
    uint64_t dims[5];
    uint64_t strides[4]; // bytes, of dims 1..rank - 1
    uint32_t box[5];
};
tmap_key make_key(const void *base, fp_dtype dtype, int rank, const uint64_t *dims, const uint64_t *strides,
                  const uint32_t *box) {
    tmap_key k;
    memset(&k, 0, sizeof k); // compared bytewise, padding included
    k.base = base;
    k.dtype = (int)dtype;
    k.rank = rank;
    for (int i = 0; i < rank; ++i) {
        k.dims[i] = dims[i];
        k.box[i] = box[i];
        if (i + 1 < rank) k.strides[i] = strides[i];
    }
    return k;
}

// 128-byte swizzle, no interleave, out-of-bounds elements zero-filled on
// loads (and not written by stores).
fp_status encode_map(encode_tiled_fn enc, const tmap_key &k, const char *which, CUtensorMap *out) {
    cuuint64_t dims[5], strides[4];
    cuuint32_t box[5], estr[5] = {1, 1, 1, 1, 1};
    for (int i = 0; i < k.rank; ++i) {
        dims[i] = k.dims[i];
        box[i] = k.box[i];
        if (i + 1 < k.rank) strides[i] = k.strides[i];
    }
    const CUtensorMapDataType dt = k.dtype == FP_BF16        ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : k.dtype == FP_FP8_E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const CUresult r = enc(out, dt, (cuuint32_t)k.rank, const_cast<void *>(k.base), dims, strides, box, estr,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v5: cuTensorMapEncodeTiled(%s) failed (%d)",
                            which, (int)r);
    return FP_OK;
}

struct tmap_entry {
    CUtensorMap map;
    tmap_key key;
    bool used;
};
// encode_map through a small per-thread cache keyed by everything the map
// encodes (base address, dtype, rank, dims, strides, box): the encoding is
// a pure function of those, and a decode loop or a graph-capture warm-up
// passes the same K / V (and O) buffers every step, so the host work (a
// driver encoding per map per call) is paid once. Per thread: no lock on
// the hot path and nothing shared to race on.
constexpr int kTmapCache = 12; // K, V and O of a few layers
fp_status encode_cached(encode_tiled_fn enc, const tmap_key &k, const char *which, CUtensorMap *out) {
    static thread_local tmap_entry cache[kTmapCache];
    static thread_local int next = 0;
    for (const tmap_entry &e : cache)
        if (e.used && memcmp(&e.key, &k, sizeof k) == 0) {
            *out = e.map;
            return FP_OK;
        }
    FP_TRY(encode_map(enc, k, which, out));
    tmap_entry &e = cache[next];
    next = (next + 1) % kTmapCache;
    e.key = k;
    e.map = *out;
    e.used = true;
    return FP_OK;
}
fp_status encode_kv_cached(encode_tiled_fn enc, const fp_attn_args *a, const void *base, const fp_tma::kv_map &m,
                           const char *which, CUtensorMap *out) {
    return encode_cached(enc, make_key(base, a->dtype, 4, m.dims, m.strides, m.box), which, out);
}

// FP_ATTN_O_STORE=tma (read once): every v5 / v8 / v9 / v10 call takes the
// TMA-store epilogue where it applies.
inline bool o_tma_store_env() {
    static const bool v = env_is("FP_ATTN_O_STORE", "tma");
    return v;
}

// The TMA-store epilogue's map of O (fp_tma::o_map_geometry) into *tm_o
// (zeroed first: the kernel reads it only when this returns 1), where the
// call asks for it (FP_ATTN_O_TMA: `asked`, or o_tma_store_env()) and it
// applies: 16-bit, one split, dense (no cu_seqlens), a group dividing 64, a
// layout TMA describes. 0: the call writes O from registers (store_rows).
int o_map_of(const fp_attn_args *a, int num_splits, encode_tiled_fn enc, bool asked, CUtensorMap *tm_o) {
    memset(tm_o, 0, sizeof *tm_o);
    if (!(asked || o_tma_store_env()) || num_splits != 1 || a->cu_q || (a->dtype != FP_BF16 && a->dtype != FP_F16))
        return 0;
    fp_tma::o_map m;
    if (fp_tma::o_map_geometry(reinterpret_cast<uintptr_t>(a->o), a->head_dim, a->seqlen_q, a->heads_kv, a->group,
                               a->batch, a->o_ss, a->o_hs, a->o_bs, &m) != fp_tma::KV_MAP_OK)
        return 0;
    const fp_status st = encode_cached(enc, make_key(a->o, a->dtype, 5, m.dims, m.strides, m.box), "O", tm_o);
    if (st != FP_OK) fp_clear_error(); // the driver refused it: the stores from registers
    return st == FP_OK;
}

// The register split's precondition (fp_tma::reg_split_check) against the
// register count ptxas gave the kernel, before its first launch on each
// device: the count is asked once per device and instantiation (cached,
// thread-safe; devices past 64 are asked on every launch) and the verdict
// recomputed from it (a few comparisons). A count the split does not fit
// refuses the launch (FP_ERR_UNSUPPORTED) instead of a hang in
// setmaxnreg.inc (USETMAXREG.TRY_ALLOC in the SASS: a retry loop of the
// hardware, which no watchdog in the source can bound) or a launch failure.
template <auto Kernel, typename T, int D, int V> fp_status check_entry_regs() {
    const char *dt = std::is_same<T, __half>::value ? "f16" : sizeof(T) == 1 ? "fp8e4m3" : "bf16";
    // the version and kernel names in the messages (FP_ATTN_V5_WIDE: v5, attention_flash_fwd_v5w)
    constexpr int vn = V == FP_ATTN_V5_WIDE ? 5 : V;
    const char *kw = V == FP_ATTN_V5_WIDE ? "w" : "";
    static std::atomic<int> cache[64]; // numRegs per device, 0: not asked yet
    int dev = 0;
    FP_CUDA_TRY(cudaGetDevice(&dev));
    int regs = dev >= 0 && dev < 64 ? cache[dev].load(std::memory_order_relaxed) : 0;
    if (!regs) {
        cudaFuncAttributes fa;
        const cudaError_t e = cudaFuncGetAttributes(&fa, Kernel);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return fp_set_error(FP_ERR_CUDA, "attention flash kernel v%d (attention_flash_fwd_v%d%s<%s, %d>): "
                                "cudaFuncGetAttributes: %s", vn, vn, kw, dt, D, cudaGetErrorString(e));
        }
        regs = fa.numRegs;
        if (dev >= 0 && dev < 64) cache[dev].store(regs, std::memory_order_relaxed);
    }
#if defined(FP_CUDA_EMU)
    // The CPU emulation has no register allocator: its cudaFuncGetAttributes
    // answers a fixed 64 registers (tests/emu/cuda_emu.cpp, the figure its
    // occupancy answers assume), not ptxas' choice, so the verdict is not
    // taken there (setmaxnreg is emulated without a register file). The
    // decision itself is tested on the CPU: test_attention_tma_emu.
    return FP_OK;
#else
    const int s = fp_tma::split_check<D, V>(regs);
    if (s != fp_tma::REG_SPLIT_OK)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d (attention_flash_fwd_v%d%s<%s, %d>): the compiled kernel uses %d "
                            "registers a thread, the setmaxnreg split expects %d "
                            "(%d threads x %d allocated must hold producer 128 x %d + consumers %d x %d within the "
                            "%d-register file; set by __launch_bounds__(%d, 1)): %s; not launched",
                            vn, vn, kw, dt, D, regs, fp_tma::entry_regs<D, V>(), fp_tma::threads_of<V>(),
                            fp_tma::reg_alloc_per_thread(regs), fp_tma::producer_regs<D, V>(),
                            128 * fp_tma::consumer_wgs<V>(), fp_tma::consumer_regs<D, V>(), fp_tma::kRegisterFile,
                            fp_tma::threads_of<V>(), fp_tma::reg_split_status_text(s));
    return FP_OK;
#endif
}

// The kernel of version V (5, 8, 10) for T, D (v10: head_dim 64 only;
// if constexpr: fp8 has no v10 instantiation).
template <typename T, int D, int V> constexpr auto tma_kernel() {
    static_assert(V == 5 || V == 8 || (V == 10 && D == 64) || (V == FP_ATTN_V5_WIDE && D == 128),
                  "v5, v8, v10 (head_dim 64) and v5's wide tile (head_dim 128)");
    if constexpr (V == FP_ATTN_V5_WIDE) return attention_flash_fwd_v5w<T, 128>;
    else if constexpr (V == 10) return attention_flash_fwd_v10<T, 64>;
    else if constexpr (V == 8) return attention_flash_fwd_v8<T, D>;
    else return attention_flash_fwd_v5<T, D>;
}
// What a launch runs before the kernel (after every check): nothing.
struct no_prologue {
    cudaError_t operator()() const { return cudaSuccess; }
};

// v5, v8 or v10 (V), the same launch (v10: three consumer warpgroups,
// 192-row query tiles, 512 threads). fp8 (T e4m3): V is V^T at v_base (its
// map mv), which `prologue` writes first (launch_fp8); O bf16.
// o_tma: the call asks for the TMA-store epilogue (FP_ATTN_O_TMA; o_map_of).
template <typename T, int D, int V, class Prologue = no_prologue>
fp_status launch_v5(const fp_attn_args *a, int num_splits, const fp_tma::kv_map &mk, const fp_tma::kv_map &mv,
                    encode_tiled_fn enc, cudaStream_t stream, bool o_tma = false, const void *v_base = nullptr,
                    Prologue prologue = {}) {
    constexpr int W = fp_tma::consumer_wgs<V>(), BC = V == FP_ATTN_V5_WIDE ? 176 : 128;
    using Tr = fp_tma::traits_v5<layout_cols<T, D>(), W, BC>;
    using To = typename std::conditional<sizeof(T) == 1, __nv_bfloat16, T>::type;
    flash_params p = make_flash_params(a, Tr::kBr, num_splits);
    if ((int64_t)p.m_tiles * num_splits > 2147483647LL || a->heads_kv > 65535 || a->batch > 65535)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash v%d: grid too large (m_tiles %d x splits %d, heads_kv %d, batch %d)", V,
                            p.m_tiles, num_splits, a->heads_kv, a->batch);
    CUtensorMap tm_k, tm_v, tm_o;
    FP_TRY(encode_kv_cached(enc, a, a->k, mk, "K", &tm_k));
    FP_TRY(encode_kv_cached(enc, a, v_base ? v_base : a->v, mv, v_base ? "V^T" : "V", &tm_v));
    p.o_tma = o_map_of(a, num_splits, enc, o_tma, &tm_o); // fp8 calls: 0 (16-bit dtypes only)
    const size_t smem = fp_tma::smem_bytes<layout_cols<T, D>(), 1, W, BC>();
    constexpr auto kernel = tma_kernel<T, D, V>();
    FP_TRY((check_entry_regs<kernel, T, D, V>()));
    FP_TRY(smem_opt_in<kernel>(smem));
#if defined(FP_KERNEL_WATCHDOG) && !defined(FP_CUDA_EMU)
    fp_watchdog::arm(stream); // the checked build: where a timed-out wait reports (kernel_watchdog.cuh)
#endif
    const char *what = sizeof(T) == 1 ? (V == 8 ? "attention flash v8 (fp8)" : "attention flash v5 (fp8)")
                       : V == FP_ATTN_V5_WIDE ? "attention flash v5 (128 x 176 tile)"
                       : V == 10      ? "attention flash v10"
                       : V == 8       ? "attention flash v8"
                                      : "attention flash v5";
    const cudaError_t pe = prologue();
    if (pe != cudaSuccess) return fp_set_error(FP_ERR_CUDA, "%s: V^T launch: %s", what, cudaGetErrorString(pe));
    cta_trace_for(a, p, (int64_t)p.m_tiles * num_splits * a->heads_kv * a->batch); // a record per CTA
    return run_with_partials<To, D>(a, p, stream, what, false, [&](flash_params &q) {
        dim3 grid((unsigned)(q.m_tiles * num_splits), (unsigned)a->heads_kv, (unsigned)a->batch);
        return launch_smem<kernel>(grid, Tr::kThreads, smem, stream, pdl_of(a), q, tm_k, tm_v, tm_o);
    });
}

// The current device's SMs and L2 bytes, asked once per device (devices
// past 64 every launch; the CPU emulation's device can change: its
// generation is part of the key there).
fp_status device_shape(int *sms, int64_t *l2) {
    static std::atomic<unsigned long long> cache[64]; // epoch 16 | sms 16 | L2 KiB 32; 0: not asked
#if defined(FP_CUDA_EMU)
    const unsigned long long epoch = fp_emu::device_generation() & 0xffffu;
#else
    const unsigned long long epoch = 0;
#endif
    int dev = 0;
    FP_CUDA_TRY(cudaGetDevice(&dev));
    const bool cacheable = dev >= 0 && dev < 64;
    const unsigned long long c = cacheable ? cache[dev].load(std::memory_order_relaxed) : 0;
    if (c && (c >> 48) == epoch) {
        *sms = (int)((c >> 32) & 0xffffu);
        *l2 = (int64_t)(c & 0xffffffffu) * 1024;
        return FP_OK;
    }
    int n = 0, l2b = 0;
    FP_CUDA_TRY(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    FP_CUDA_TRY(cudaDeviceGetAttribute(&l2b, cudaDevAttrL2CacheSize, dev));
    if (n < 1) n = 1;
    if (n > 0xffff) n = 0xffff;
    if (l2b < 0) l2b = 0;
    *sms = n;
    *l2 = l2b;
    if (cacheable)
        cache[dev].store(epoch << 48 | (unsigned long long)n << 32 | (unsigned long long)(l2b / 1024),
                         std::memory_order_relaxed);
    return FP_OK;
}

// v9: as launch_v5, with min(items, SMs) persistent CTAs over the order.
template <typename T, int D>
fp_status launch_v9(const fp_attn_args *a, int num_splits, const fp_tma::kv_map &mk, const fp_tma::kv_map &mv,
                    encode_tiled_fn enc, cudaStream_t stream, bool o_tma = false, bool early = false) {
    using Tr = fp_tma::traits_v5<D>;
    flash_params p = make_flash_params(a, Tr::kBr, num_splits);
    const int64_t units = (int64_t)num_splits * a->heads_kv * a->batch;
    const int64_t items = units * p.m_tiles;
    // tickets run to items + CTAs - 1 in int (fp_tma::producer_items)
    if (items > 2147483647LL - 65536)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash v9: %lld work items (m_tiles %d x splits %d x heads_kv %d x batch %d) "
                            "above 2^31 - 65537",
                            (long long)items, p.m_tiles, num_splits, a->heads_kv, a->batch);
    int sms = 1;
    int64_t l2 = 0;
    FP_TRY(device_shape(&sms, &l2));
    // a unit's K and V: its split's share of the keys, both tensors
    const int64_t unit_kv_bytes = 2 * ((int64_t)a->seqlen_k + num_splits - 1) / num_splits * a->head_dim * 2;
    // FP_ATTN_V9_SECTION=n (read once, n >= 1): n units per section instead
    // of order_section's choice, for the GPU check's sweep
    static const int section_env = [] {
        const char *e = getenv("FP_ATTN_V9_SECTION");
        const int v = e ? atoi(e) : 0;
        return v > 0 ? v : 0;
    }();
    // banded (causal or a right window): items of one unit differ in length
    const bool banded = a->window_right >= 0;
    const int section =
        section_env ? section_env : fp_tma::order_section(l2, unit_kv_bytes, (int)units, sms, banded);
    // FP_ATTN_V9_LEAD=n (read once, 0 to 64): the next ticket drawn n key
    // tiles before an item's end (0: at its start, as `early` asks),
    // instead of fp_tma::kV9Lead, for the GPU check's sweep
    static const int lead_env = [] {
        const char *e = getenv("FP_ATTN_V9_LEAD");
        const int v = e && *e ? atoi(e) : -1;
        return v >= 0 && v <= 64 ? v : -1;
    }();
    const int lead = early ? 0 : lead_env >= 0 ? lead_env : fp_tma::kV9Lead;
    const fp_tma::tile_order ord =
        fp_tma::make_tile_order(p.m_tiles, num_splits, a->heads_kv, a->batch, section, lead);
    CUtensorMap tm_k, tm_v;
    FP_TRY(encode_kv_cached(enc, a, a->k, mk, "K", &tm_k));
    FP_TRY(encode_kv_cached(enc, a, a->v, mv, "V", &tm_v));
    v9_args x;
    p.o_tma = o_map_of(a, num_splits, enc, o_tma, &x.tm_o);
    x.ord = ord;
    const size_t smem = fp_tma::smem_bytes_v9<D>();
    constexpr auto kernel = attention_flash_fwd_v9<T, D>;
    FP_TRY((check_entry_regs<kernel, T, D, 9>()));
    FP_TRY(smem_opt_in<kernel>(smem));
#if defined(FP_KERNEL_WATCHDOG) && !defined(FP_CUDA_EMU)
    fp_watchdog::arm(stream);
#endif
    if (ord.items > 0) cta_trace_for(a, p, ord.items); // a record per item (its ticket)
    return run_with_partials<T, D>(
        a, p, stream, "attention flash v9", false,
        [&](flash_params &q) {
            if (ord.items < 1) return cudaSuccess; // no query rows: nothing to run
            const dim3 grid((unsigned)fp_tma::persistent_ctas(ord.items, sms));
            return launch_smem<kernel>(grid, fp_tma::kThreads, smem, stream, pdl_of(a), q, tm_k, tm_v, x);
        },
        2);
}

template <int V>
fp_status dispatch_tma(const fp_attn_args *a, int num_splits, const fp_tma::kv_map &mk, const fp_tma::kv_map &mv,
                       encode_tiled_fn enc, cudaStream_t stream, bool o_tma = false, bool v9_early = false) {
    const bool bf = a->dtype == FP_BF16;
    if constexpr (V == 9) {
        if (a->head_dim == 64)
            return bf ? launch_v9<__nv_bfloat16, 64>(a, num_splits, mk, mv, enc, stream, o_tma, v9_early)
                      : launch_v9<__half, 64>(a, num_splits, mk, mv, enc, stream, o_tma, v9_early);
        return bf ? launch_v9<__nv_bfloat16, 128>(a, num_splits, mk, mv, enc, stream, o_tma, v9_early)
                  : launch_v9<__half, 128>(a, num_splits, mk, mv, enc, stream, o_tma, v9_early);
    } else if constexpr (V == 10) { // head_dim 64 only: refused in fp_attn_cuda_flash_v5
        return bf ? launch_v5<__nv_bfloat16, 64, 10>(a, num_splits, mk, mv, enc, stream, o_tma)
                  : launch_v5<__half, 64, 10>(a, num_splits, mk, mv, enc, stream, o_tma);
    } else if constexpr (V == FP_ATTN_V5_WIDE) { // head_dim 128 only: refused in fp_attn_cuda_flash_v5
        return bf ? launch_v5<__nv_bfloat16, 128, V>(a, num_splits, mk, mv, enc, stream, o_tma)
                  : launch_v5<__half, 128, V>(a, num_splits, mk, mv, enc, stream, o_tma);
    } else {
        if (a->head_dim == 64)
            return bf ? launch_v5<__nv_bfloat16, 64, V>(a, num_splits, mk, mv, enc, stream, o_tma)
                      : launch_v5<__half, 64, V>(a, num_splits, mk, mv, enc, stream, o_tma);
        return bf ? launch_v5<__nv_bfloat16, 128, V>(a, num_splits, mk, mv, enc, stream, o_tma)
                  : launch_v5<__half, 128, V>(a, num_splits, mk, mv, enc, stream, o_tma);
    }
}

// fp8 (e4m3) inputs, head_dim 128, v5 or v8 (V): V^T into the stream's
// workspace (fp8_transpose_v), then the kernel with K by TMA as for 16-bit
// types (128-element boxes: 128 bytes a row) and V^T tiles of one box.
// One split (no split-KV partials for fp8 yet). O bf16.
template <int V>
fp_status launch_fp8(const fp_attn_args *a, const fp_tma::kv_map &mk, encode_tiled_fn enc, cudaStream_t stream) {
    using T = __nv_fp8_e4m3;
    constexpr int D = 128, DL = layout_cols<T, D>();
    using Tr = fp_tma::traits_v5<DL>;
    static_assert(Tr::kBc == 128 && DL == 64, "V^T tiles of 128 keys (bytes) x 128 rows");
    const int64_t skp = ((int64_t)a->seqlen_k + Tr::kBc - 1) / Tr::kBc * Tr::kBc;
    const int64_t head_bytes = skp * D; // one (batch, KV head) of V^T
    if (skp > 2147483647LL - 2 * Tr::kBc || head_bytes * a->heads_kv >= (int64_t(1) << 40))
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash v%d (fp8): seqlen_k %d too long for V^T's tensor map",
                            V, a->seqlen_k);
    fp_tma::kv_map mv; // V^T: (skp keys, D rows, heads_kv, batch), byte strides
    mv.dims[0] = (uint64_t)skp;
    mv.dims[1] = (uint64_t)D;
    mv.dims[2] = (uint64_t)a->heads_kv;
    mv.dims[3] = (uint64_t)a->batch;
    mv.strides[0] = (uint64_t)skp;
    mv.strides[1] = (uint64_t)head_bytes;
    mv.strides[2] = (uint64_t)(head_bytes * a->heads_kv);
    mv.box[0] = (uint32_t)Tr::kBc;
    mv.box[1] = (uint32_t)D;
    mv.box[2] = mv.box[3] = 1;
    fp_scratch vt = {nullptr, nullptr, nullptr, nullptr, 0};
    FP_TRY(fp_ctx_scratch_get(a->ctx, stream, (size_t)(head_bytes * a->heads_kv * a->batch),
                              "attention flash (fp8 V^T)", &vt));
    const fp_status st = launch_v5<T, D, V>(a, 1, mk, mv, enc, stream, false, vt.ptr, [&] {
        return fp_pdl::launch<fp8_transpose_v>(
            dim3((unsigned)(skp / Tr::kBc), (unsigned)a->heads_kv, (unsigned)a->batch), dim3(kVtThreads),
            (size_t)128 * kVtPitch, stream, pdl_of(a), static_cast<const uint8_t *>(a->v), a->v_bs, a->v_ss,
            a->v_hs, a->seqlens_k, a->seqlen_k, (int)skp, 0, static_cast<uint8_t *>(vt.ptr), a->stamp);
    });
    const fp_status put = fp_ctx_scratch_put(&vt); // stream-ordered: the kernels above still read it
    return st != FP_OK ? st : put;
}

// fp8 (e4m3) calls: v5 / v8 at head_dim 128, dense or ragged (seqlens_k)
// K / V, one split; the rest FP_ERR_UNSUPPORTED before any device work.
fp_status fp8_check_args(const fp_attn_args *a, int version, int num_splits) {
    if (version != 5 && version != 8)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d: fp8 e4m3 inputs run on v5 and v8 only (head_dim 128)",
                            version);
    if (a->head_dim != 128)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: fp8 e4m3 at head_dim %d (128 only)",
                            version, a->head_dim);
    if (a->block_table || a->cu_q || a->cu_k)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d: fp8 e4m3 with %s (dense or seqlens_k K / V only)", version,
                            a->block_table ? "a paged KV cache" : "varlen (cu_seqlens)");
    if (num_splits != 1)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d: fp8 e4m3 with %d KV splits (one only: no split-KV for fp8 "
                            "yet)",
                            version, num_splits);
    // V is read by 16-byte loads (fp8_transpose_v): the TMA rules' alignment
    fp_tma::kv_map unused;
    const int s = fp_tma::kv_map_geometry(reinterpret_cast<uintptr_t>(a->v), a->head_dim, a->seqlen_k, a->heads_kv,
                                          a->batch, a->v_ss, a->v_hs, a->v_bs, 128, &unused, 1);
    if (s != fp_tma::KV_MAP_OK)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d (fp8): V: %s (seq stride %lld, head stride %lld, batch stride "
                            "%lld elements)",
                            version, fp_tma::kv_map_status_text(s), (long long)a->v_ss, (long long)a->v_hs,
                            (long long)a->v_bs);
    return FP_OK;
}

} // namespace

extern "C" fp_status fp_attn_cuda_flash_v5(const fp_attn_args *a, int version, int num_splits, cudaStream_t stream) {
    const bool o_tma = (version & FP_ATTN_O_TMA) != 0, early = (version & FP_ATTN_V9_EARLY) != 0;
    version &= ~(FP_ATTN_O_TMA | FP_ATTN_V9_EARLY);
    if (version != 5 && version != 8 && version != 9 && version != 10 && version != FP_ATTN_V5_WIDE)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "flash kernel version %d (the TMA kernels are 5, 8, 9 and 10)", version);
    if (early && version != 9)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "FP_ATTN_V9_EARLY with flash kernel version %d (the ticket draw is v9's)", version);
    const bool fp8 = a->dtype == FP_FP8_E4M3; // V as V^T (launch_fp8): its own checks
    const bool wide = version == FP_ATTN_V5_WIDE; // v5's 128 x 176 tile: messages name v5
    const int vn = wide ? 5 : version;
    if (wide && (fp8 || a->block_table || a->head_dim != 128))
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v5 (128 x 176 tile): %s (16-bit types, head_dim 128, dense or "
                            "varlen K / V only)",
                            fp8 ? "fp8 e4m3 inputs" : a->block_table ? "a paged KV cache" : "another head_dim");
    if (fp8) {
        FP_TRY(fp8_check_args(a, version, num_splits));
    } else {
        // varlen: with total_k; paged: page sizes of multiples of 8 (kv_layout)
        FP_TRY(sm90_check_args(a, vn, num_splits, true, true));
        if (version == 10 && a->head_dim != 64)
            return fp_set_error(FP_ERR_UNSUPPORTED,
                                "attention flash kernel v10 (three consumer warpgroups) takes head_dim 64 only (got "
                                "%d): at 128 a consumer thread's S, O and P do not fit its 160 registers",
                                a->head_dim);
    }
    const int bc = wide ? 176 : fp_tma::traits_v5<128>::kBc; // the box rows of the K / V maps
    fp_tma::kv_map mk, mv;
    FP_TRY(kv_layout(a, vn, a->k, a->k_ss, a->k_hs, a->k_bs, "K", &mk, bc));
    if (!fp8) FP_TRY(kv_layout(a, vn, a->v, a->v_ss, a->v_hs, a->v_bs, "V", &mv, bc));
    FP_TRY(sm90_check_device(vn, "wgmma, TMA"));
    fp_status st = FP_OK;
    const encode_tiled_fn enc = encode_tiled(&st);
    if (!enc) return st;
    if (wide) return dispatch_tma<FP_ATTN_V5_WIDE>(a, num_splits, mk, mv, enc, stream, o_tma);
    if (fp8) return version == 8 ? launch_fp8<8>(a, mk, enc, stream) : launch_fp8<5>(a, mk, enc, stream);
    if (version == 9) return dispatch_tma<9>(a, num_splits, mk, mv, enc, stream, o_tma, early);
    if (version == 10) return dispatch_tma<10>(a, num_splits, mk, mv, enc, stream, o_tma);
    return version == 8 ? dispatch_tma<8>(a, num_splits, mk, mv, enc, stream, o_tma)
                        : dispatch_tma<5>(a, num_splits, mk, mv, enc, stream, o_tma);
}
