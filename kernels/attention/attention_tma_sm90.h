// Pipeline bookkeeping of the Hopper flash attention kernel version 5
// (attention_flash_fwd_v5, kernels/attention/attention_flash_tma_sm90.cu),
// shared (host + device) with its CPU model in
// tests/attention/test_attention_tma_emu.cpp:
//   - the configuration (tile sizes, ring stages, register split);
//   - the ring's stage / phase index functions;
//   - the producer's and the consumers' barrier schedules, written once as
//     templates over a policy: the kernel instantiates them with the PTX
//     operations (mbarrier, cp.async.bulk.tensor, wgmma), the test with a
//     recorder whose trace runs on an mbarrier / TMA model written from the
//     PTX ISA text (so the model checks the schedule the kernel runs, not a
//     copy of it);
//   - the TMA geometry of K and V (host): the tensor-map dims, byte strides
//     and box built from fp_attn_args, and the layouts TMA cannot describe.
//
// The ring (kStages stages each of K and V, separate barriers for K and V so
// that Q K^T of a tile can start before its V lands):
//   full_k[s] / full_v[s]: arrival count 1 (the producer's
//     mbarrier.arrive.expect_tx of the stage's bytes); the phase completes
//     when the TMA loads have delivered exactly those bytes (complete_tx).
//   empty_k[s] / empty_v[s]: arrival count 128 x (active consumer
//     warpgroups): every consumer thread arrives once it has retired (wgmma
//     wait_group) the wgmmas that read the stage.
//   Load i (tile s_begin + i) uses stage i % kStages; the phase it waits for
//   is its pass over the ring, (i / kStages) & 1. Consumers wait full with
//   that parity; the producer waits empty with the opposite parity (on its
//   first pass the "preceding phase" of a fresh barrier counts as complete,
//   so it does not block).
#ifndef FP_ATTENTION_TMA_SM90_H
#define FP_ATTENTION_TMA_SM90_H

#include <stdint.h>

#include "attention/attention_sm90_layout.h"

namespace fp_tma {

// Per head-dim configuration. One CTA per SM: warpgroup 0 is the producer
// (one thread issues every TMA load; setmaxnreg.dec to kProducerRegs),
// warpgroups 1 .. W are the consumers, 64 query rows each (setmaxnreg.inc
// to kConsumerRegs). W = 2 (v5, v8, v9): 128 x 24 + 256 x 240 = 64512 <=
// 65536 registers. Shared memory: 1 KiB alignment slack + Q + kStages x
// (K + V) + barriers: D = 128: 1 + 32 + 2 x 64 KiB = 161 KiB; D = 64: 1 +
// 16 + 3 x 32 = 113 KiB.
// Two stages at D = 128 already put the next K load a whole tile ahead of
// its use (see NOTES.md); D = 64 tiles take half the time, hence three.
// W = 3 (v10, D = 64 only: FlashAttention-3's tile at head_dim 64): three
// consumer warpgroups, a 192-row query tile, 512 threads: 128 x 32 + 384 x
// 160 = 65536 registers (a consumer thread holds S 64, O 32 and P 32 of
// them); shared memory 1 + 24 + 3 x 32 = 121 KiB. Each K / V tile loaded
// feeds 192 query rows instead of 128, and three warpgroups take turns at
// the tensor cores, so two softmaxes can run under one warpgroup's wgmmas
// (at D = 64 a tile's softmax, 512 cycles of MUFU per warp, is as long as
// its wgmmas: NOTES.md, session 23).
// BC = 176 (v5's wide tile, FP_ATTN_V5_WIDE, head_dim 128 only):
// FlashAttention-3's non-causal tile at head_dim 128, 128 x 176. Each tile
// carries 1.375x the keys of a 128-key tile for the same per-tile costs
// (stage waits, wgmma issue and waits, O's rescale: 64 FMUL a thread);
// S grows to 88 f32 registers and P to 44 a consumer thread, within its
// 240 under v5's schedule (with v8's turns ptxas spilled). Shared memory:
// 1 + 32 + 2 x 88 KiB = 209 KiB (one CTA per SM, as the 128-key tile).
template <int D, int W = 2, int BC = 128> struct traits_v5; // D = 64, 128 with W = 2; D = 64 with W = 3
template <> struct traits_v5<64, 2> {
    static constexpr int kBr = 128, kBc = 128, kConsumerWGs = 2, kStages = 3;
    static constexpr int kProducerRegs = 24, kConsumerRegs = 240, kThreads = 384;
};
template <> struct traits_v5<128, 2> {
    static constexpr int kBr = 128, kBc = 128, kConsumerWGs = 2, kStages = 2;
    static constexpr int kProducerRegs = 24, kConsumerRegs = 240, kThreads = 384;
};
template <> struct traits_v5<64, 3> {
    static constexpr int kBr = 192, kBc = 128, kConsumerWGs = 3, kStages = 3;
    static constexpr int kProducerRegs = 32, kConsumerRegs = 160, kThreads = 512;
};
template <> struct traits_v5<128, 2, 176> {
    static constexpr int kBr = 128, kBc = 176, kConsumerWGs = 2, kStages = 2;
    static constexpr int kProducerRegs = 24, kConsumerRegs = 240, kThreads = 384;
};
constexpr int kThreads = 128 * 3; // W = 2: producer warpgroup + 2 consumer warpgroups
// Consumer warpgroups of kernel version V (10: three; 5, 8, 9: two), and
// its threads.
template <int V> SM90_HD constexpr int consumer_wgs() { return V == 10 ? 3 : 2; }
template <int V> SM90_HD constexpr int threads_of() { return 128 * (1 + consumer_wgs<V>()); }
// Registers of the register file of a compute capability 9.0 SM, also the
// most one CTA may hold (cudaDevAttrMaxRegistersPerBlock).
constexpr int kRegisterFile = 65536;

// ---- the register split's precondition (host) --------------------------------
// setmaxnreg moves registers between the warpgroups of one CTA through a
// per-CTA pool (PTX ISA, setmaxnreg): the CTA starts with what the launch
// allocated, threads x the kernel's register count (ptxas' choice, what
// cudaFuncGetAttributes reports as numRegs, allocated in units of 8 a
// thread); .dec returns the difference to the pool, .inc blocks until the
// pool can supply it, so a split that needs more than the launch allocated
// waits forever (a hang, not an error). Sound when:
//   - the targets are valid setmaxnreg counts: multiples of 8 in [24, 256];
//   - the split fits the register file: producer_threads x producer_regs +
//     consumer_threads x consumer_regs <= regfile;
//   - the kernel can launch at all: threads x alloc(numRegs) <= regfile;
//   - .dec decreases and .inc increases: producer_regs <= alloc(numRegs) <=
//     consumer_regs;
//   - the pool covers the split: threads x alloc(numRegs) >= the split's sum
//     (otherwise the consumers' .inc never returns).
// v5 (384 threads, 128 x 24 + 256 x 240 = 64512 = 384 x 168): the launch
// must allocate exactly 168 a thread (numRegs 161..168), the most
// __launch_bounds__(384, 1) lets ptxas use and what it gives a kernel that
// uses setmaxnreg (ptxas -v: 168 for each v5 instantiation; on an H200,
// cudaFuncGetAttributes answered 168 for a test kernel of the same shape).
enum reg_split_status {
    REG_SPLIT_OK = 0,
    REG_SPLIT_BAD_TARGET = 1,  // a target not a multiple of 8 in [24, 256], or no threads
    REG_SPLIT_OVER_FILE = 2,   // the split's sum exceeds the register file
    REG_SPLIT_LAUNCH = 3,      // threads x numRegs exceeds the register file: the launch fails
    REG_SPLIT_DEC = 4,         // numRegs below the producer's target: .dec would increase
    REG_SPLIT_INC = 5,         // numRegs above the consumers' target: .inc would decrease
    REG_SPLIT_POOL_SHORT = 6,  // threads x numRegs below the split's sum: .inc waits forever
};
inline const char *reg_split_status_text(int s) {
    switch (s) {
    case REG_SPLIT_OK: return "ok";
    case REG_SPLIT_BAD_TARGET: return "a setmaxnreg target is not a multiple of 8 in [24, 256]";
    case REG_SPLIT_OVER_FILE: return "the split's registers exceed the register file";
    case REG_SPLIT_LAUNCH: return "threads x registers exceeds the register file: the launch would fail";
    case REG_SPLIT_DEC: return "fewer registers than the producer's target: setmaxnreg.dec would have to grow";
    case REG_SPLIT_INC: return "more registers than the consumers' target: setmaxnreg.inc would have to shrink";
    case REG_SPLIT_POOL_SHORT:
        return "the CTA's register pool is smaller than the split: setmaxnreg.inc would wait forever (a hang)";
    default: return "?";
    }
}
inline int reg_alloc_per_thread(int num_regs) { return (num_regs + 7) / 8 * 8; }
inline int reg_split_check(int num_regs, int producer_threads, int producer_regs, int consumer_threads,
                           int consumer_regs, int regfile) {
    const auto target_ok = [](int r) { return r >= 24 && r <= 256 && r % 8 == 0; };
    if (!target_ok(producer_regs) || !target_ok(consumer_regs) || producer_threads <= 0 || consumer_threads <= 0)
        return REG_SPLIT_BAD_TARGET;
    const int64_t split = (int64_t)producer_threads * producer_regs + (int64_t)consumer_threads * consumer_regs;
    if (split > regfile) return REG_SPLIT_OVER_FILE;
    const int alloc = reg_alloc_per_thread(num_regs);
    const int64_t pool = (int64_t)(producer_threads + consumer_threads) * alloc;
    if (pool > regfile) return REG_SPLIT_LAUNCH;
    if (alloc < producer_regs) return REG_SPLIT_DEC;
    if (alloc > consumer_regs) return REG_SPLIT_INC;
    if (pool < split) return REG_SPLIT_POOL_SHORT;
    return REG_SPLIT_OK;
}
// The one entry count v5's split of head dim D works with (the least the
// pool allows; with the constants above also the most the file allows).
template <int D> inline int v5_entry_regs() {
    using Tr = traits_v5<D>;
    const int split = 128 * Tr::kProducerRegs + 128 * Tr::kConsumerWGs * Tr::kConsumerRegs;
    return reg_alloc_per_thread((split + kThreads - 1) / kThreads);
}
template <int D> inline int v5_reg_split_check(int num_regs) {
    using Tr = traits_v5<D>;
    return reg_split_check(num_regs, 128, Tr::kProducerRegs, 128 * Tr::kConsumerWGs, Tr::kConsumerRegs,
                           kRegisterFile);
}
// v9's split (version V: 9; v5 / v8 keep traits_v5's). Its producer thread
// runs the item loop (tickets, the item ring, the ring's running position)
// on top of v5's loads: 24 registers fit the default build but not the
// checked build's watchdog paths (ptxas spilled 16 bytes), so 32, and 40
// since the TMA-store epilogue's parameter (session 32: the checked build
// spilled 8 bytes in the producer's watchdog report at 32); the consumers
// give 8 (v9's peak at R204 at head_dim 128, R215 in the checked build):
// 128 x 40 + 256 x 232 = 64512 = 384 x 168, the same entry count.
// v10's is traits_v5<D, 3>'s: 128 x 32 + 384 x 160 = 65536 = 512 x 128.
template <int D, int V> SM90_HD constexpr int producer_regs() {
    return V == 9 ? 40 : traits_v5<D, consumer_wgs<V>()>::kProducerRegs;
}
template <int D, int V> SM90_HD constexpr int consumer_regs() {
    return V == 9 ? 232 : traits_v5<D, consumer_wgs<V>()>::kConsumerRegs;
}
template <int D, int V> inline int entry_regs() {
    const int split = 128 * producer_regs<D, V>() + 128 * consumer_wgs<V>() * consumer_regs<D, V>();
    return reg_alloc_per_thread((split + threads_of<V>() - 1) / threads_of<V>());
}
template <int D, int V> inline int split_check(int num_regs) {
    return reg_split_check(num_regs, 128, producer_regs<D, V>(), 128 * consumer_wgs<V>(), consumer_regs<D, V>(),
                           kRegisterFile);
}

// A TMA box is 64 elements (128 bytes: the 128-byte swizzle span) x kBc
// rows; a K / V tile of D columns is D / 64 boxes, box c landing at byte
// c * kBc * 128 of the tile: exactly the column blocks of the SW128 tile
// layout (attention_sm90_layout.h), whose wgmma descriptors v3 already uses.
constexpr int kBoxCols = 64;
template <int D> SM90_HD int boxes_per_tile() { return D / kBoxCols; }
// Tensor-map coordinates (innermost first) of box c of K / V tile t of kv
// head hk, for the sequence whose keys start at map row row0 of map batch
// bz (seq_rows below: batched calls row0 0, bz the batch; varlen calls one
// packed map, row0 cu_seqlens_k[b], bz 0).
template <int D, int BC = 128> SM90_HD void box_coords(int c, int t, int hk, int bz, int (&xyzw)[4], int row0 = 0) {
    xyzw[0] = c * kBoxCols;
    xyzw[1] = row0 + t * BC;
    xyzw[2] = hk;
    xyzw[3] = bz;
}

// Where sequence b's keys lie in the K / V tensor maps (kv_map_geometry):
// row0, the map batch bz, and map_rows, the map's rows from row0 on (the
// rows a tile may load before TMA fills zeros; v_tail_rows' bound).
//   batched (cu_k NULL): one map batch per sequence of sk rows: 0, b, sk;
//   varlen: one packed map of kv_rows rows (fp_attention_params.total_k):
//     cu_k[b], 0, kv_rows - cu_k[b]. An offset outside [0, kv_rows] (bad
//     device input, which the host cannot check) reads as a sequence at
//     kv_rows: every row TMA's zeros, none cleared, nothing read outside
//     the map, and no int overflow in row0 + t * kBc (the launcher keeps
//     kv_rows + seqlen_k + 2 kBc below 2^31).
struct seq_rows {
    int row0, bz, map_rows;
};
SM90_HD seq_rows kv_seq_rows(const int32_t *cu_k, int b, int sk, int kv_rows) {
    seq_rows r;
    if (!cu_k) {
        r.row0 = 0;
        r.bz = b;
        r.map_rows = sk;
        return r;
    }
    const int o = cu_k[b];
    r.row0 = o >= 0 && o <= kv_rows ? o : kv_rows;
    r.bz = 0;
    r.map_rows = kv_rows - r.row0;
    return r;
}
SM90_HD uint32_t box_smem_offset(int c, int rows) { return (uint32_t)(c * rows * 128); }

// ---- paged KV (fp_attention_params.block_table) ------------------------------
// K and V are pools of pages [num_pages, page_size, heads_kv, D]: one 4-D
// map each, (D, page_size, heads_kv, num_pages) with byte strides (seq,
// head, page) (kv_map_geometry with the page as the batch). A tile's kBc
// keys cover several pages (or part of one), so it loads as kBc / B boxes
// of B = paged_box_rows(page_size) rows per 64 columns: B is the largest
// power of two dividing both page_size and kBc. The launcher takes page
// sizes that are multiples of 8 only, so B >= 8 and every box starts on an
// 8-row (1024-byte) boundary of the tile: the 128-byte swizzle TMA applies
// to a box is then the whole tile's (the pattern repeats every 8 rows).
// The box of keys [k, k + B) lies in one page (B divides k and
// page_size): row k % page_size of page block_table[k / page_size].
SM90_HD int paged_box_rows(int page_size) {
    const int low = page_size & -page_size; // the largest power of two dividing page_size
    return low < traits_v5<128>::kBc ? low : traits_v5<128>::kBc;
}
struct paged_box {
    int row, page; // map coordinates 1 (row in the page) and 3 (page)
};
// Box j (rows [j B, j B + B) of the tile) of tile t of a sequence of L keys
// whose block-table row is bt (page_shift: log2(page_size) for a power of
// two, else -1). A box at or past L is not looked up (entries past the
// first ceil(L / page_size) may hold anything) and an entry outside [0,
// num_pages) (device memory the host cannot check) is not followed: both
// read page num_pages, outside the map, which TMA fills with zeros. The
// launcher keeps seqlen_k + 2 kBc below 2^31 (no int overflow in k).
SM90_HD paged_box paged_box_at(const int32_t *bt, int page_size, int page_shift, int num_pages, int L, int t, int j,
                               int box_rows) {
    const int k = t * traits_v5<128>::kBc + j * box_rows;
    paged_box r;
    r.row = 0;
    r.page = num_pages;
    if (k >= L) return r;
    int pi;
    if (page_shift >= 0) {
        pi = k >> page_shift;
        r.row = k & (page_size - 1);
    } else {
        pi = k / page_size;
        r.row = k - pi * page_size;
    }
    const int pg = bt[pi];
    if ((unsigned)pg < (unsigned)num_pages) r.page = pg;
    return r;
}
// The rows from the sequence's first that the loads of a paged sequence of
// L keys bring from real pages: L rounded up to a whole box (v_tail_rows'
// map_rows: V rows [L, that) of the box holding key L - 1 are another part
// of the pool and are cleared; boxes past it are TMA's zeros).
SM90_HD int paged_map_rows(int L, int box_rows) { return L <= 0 ? 0 : (L + box_rows - 1) / box_rows * box_rows; }
// Bytes the producer announces (expect_tx) for one K or V stage.
template <int D, int BC = 128> SM90_HD uint32_t stage_tx_bytes() { return (uint32_t)(BC * D * 2); }

// Shared memory (offsets from the 1024-aligned base): QB Q buffers (v5 /
// v8: one; v9: two, the next item's Q loads while this one's runs), K
// stages, V stages, then the 4 x kStages barriers (8 bytes each).
template <int D, int W = 2> SM90_HD uint32_t q_tile_bytes() { return (uint32_t)(traits_v5<D, W>::kBr * D * 2); }
template <int D, int QB = 1, int W = 2> SM90_HD uint32_t q_offset(int qb = 0) {
    return (uint32_t)qb * q_tile_bytes<D, W>();
}
// BC: the tile's keys (traits_v5<D, W, BC>; 176 only for v5's wide tile).
template <int D, int BC = 128> SM90_HD uint32_t kv_tile_bytes() { return (uint32_t)(BC * D * 2); }
template <int D, int QB = 1, int W = 2, int BC = 128> SM90_HD uint32_t k_offset(int stage) {
    return (uint32_t)QB * q_tile_bytes<D, W>() + (uint32_t)stage * kv_tile_bytes<D, BC>();
}
template <int D, int QB = 1, int W = 2, int BC = 128> SM90_HD uint32_t v_offset(int stage) {
    return k_offset<D, QB, W, BC>(traits_v5<D, W, BC>::kStages) + (uint32_t)stage * kv_tile_bytes<D, BC>();
}
enum barrier_kind { BAR_FULL_K = 0, BAR_EMPTY_K = 1, BAR_FULL_V = 2, BAR_EMPTY_V = 3 };
SM90_HD const char *barrier_name(int kind) {
    return kind == BAR_FULL_K    ? "full_k"
           : kind == BAR_EMPTY_K ? "empty_k"
           : kind == BAR_FULL_V  ? "full_v"
           : kind == BAR_EMPTY_V ? "empty_v"
           : kind == 4           ? "item_full"
                                 : "item_empty";
}
template <int D, int QB = 1, int W = 2, int BC = 128> SM90_HD uint32_t bar_offset(int kind, int stage) {
    constexpr int S = traits_v5<D, W, BC>::kStages;
    return v_offset<D, QB, W, BC>(S) + (uint32_t)(8 * (kind * S + stage));
}
template <int D, int QB = 1, int W = 2, int BC = 128> SM90_HD uint32_t smem_bytes() {
    return 1024 + bar_offset<D, QB, W, BC>(4, 0);
}
// v9 (two Q buffers) adds its item ring after the K / V ring's barriers:
// item_full[2], item_empty[2] (8 bytes each), then the two ticket slots
// (4 bytes each).
enum item_barrier_kind { BAR_ITEM_FULL = 4, BAR_ITEM_EMPTY = 5 };
template <int D> SM90_HD uint32_t item_bar_offset(int kind, int slot) {
    return bar_offset<D, 2>(4, 0) + (uint32_t)(8 * (2 * (kind - BAR_ITEM_FULL) + slot));
}
template <int D> SM90_HD uint32_t item_slot_offset(int slot) {
    return item_bar_offset<D>(BAR_ITEM_EMPTY, 2) + (uint32_t)(4 * slot);
}
template <int D> SM90_HD uint32_t smem_bytes_v9() { return 1024 + item_slot_offset<D>(2); }

// The ring: load i -> stage, the parity of the phase it belongs to.
SM90_HD int ring_stage(int i, int stages) { return i % stages; }
SM90_HD uint32_t ring_phase(int i, int stages) { return (uint32_t)((i / stages) & 1); }
SM90_HD uint32_t full_parity(int i, int stages) { return ring_phase(i, stages); }
SM90_HD uint32_t empty_parity(int i, int stages) { return ring_phase(i, stages) ^ 1u; }
// Arrivals that complete an empty barrier's phase.
SM90_HD uint32_t empty_count(int active_consumer_wgs) { return (uint32_t)(128 * active_consumer_wgs); }
// Consumer warpgroups of a CTA with rows_left query rows from its first
// (rows_left >= 1): one per 64 rows, at most W; the rest hold only padding
// rows and take no part.
SM90_HD int active_consumer_wgs(int rows_left, int w) {
    const int n = (rows_left + 63) / 64;
    return n < 1 ? 1 : n > w ? w : n;
}

// V rows [*r0, *r1) of tile t (kBc = bc rows) that the consumers clear
// after it lands: the rows at or past the sequence's length L (a ragged
// seqlens_k[b] < seqlen_k) that are still inside the tensor map (rows <
// map_rows = seqlen_k; beyond, TMA filled zeros). They hold another part of
// the caller's cache, possibly Inf / NaN, and P = 0 there does not help:
// 0 * NaN = NaN in P V. Keys need nothing (their scores are masked to -inf
// whatever they hold). Empty (r0 = r1 = 0) for every other tile.
SM90_HD void v_tail_rows(int L, int map_rows, int t, int bc, int *r0, int *r1) {
    int a = L - t * bc, e = map_rows - t * bc;
    if (e > bc) e = bc;
    if (a <= 0 || a >= e) a = e = 0;
    *r0 = a;
    *r1 = e;
}

// ---- the schedules ----------------------------------------------------------
// Producer (one thread): K then V of every tile of [s_begin, s_end), each
// into its ring stage once the consumers released it. P provides
// wait_empty_k / wait_empty_v (stage, parity) and load_k / load_v (stage,
// tile): arrive.expect_tx(full_x[stage], stage_tx_bytes) + the boxes.
// i0: the ring's loads before tile s_begin (0 for a CTA's only range; v9's
// persistent CTAs run the ring on across their items, see below).
template <int Stages, class P> SM90_HD void producer_schedule(int s_begin, int s_end, P &p, int i0 = 0) {
    for (int t = s_begin; t < s_end; ++t) {
        const int i = i0 + t - s_begin, st = ring_stage(i, Stages);
        p.wait_empty_k(st, empty_parity(i, Stages));
        p.load_k(st, t);
        p.wait_empty_v(st, empty_parity(i, Stages));
        p.load_v(st, t);
    }
}

// One active consumer warpgroup, v3's pipelined order: iteration t issues
// Q K^T of tile t+1 and P V of tile t together and runs the softmax of t+1
// under P V of t; the wait for P V of t, O's rescale and P's packing open
// iteration t+1. Each stage is released (empty arrive) right after the
// wgmma wait that retired its last reader: K[t+1] after wait_group 1 in
// iteration t, V[t] after wait_group 0 at the top of t+1.
// C provides: wait_full_k / wait_full_v (stage, parity, tile) (wait_full_v
// also clears V rows a ragged sequence does not own, see the kernel),
// qk(stage) / pv(stage) (issue + commit), wgmma_wait0 / wgmma_wait1,
// release_k / release_v (stage), softmax(tile) (mask + online softmax of
// the S accumulators), rescale_pack() (O *= corr, P = S packed).
// Branch shapes as in v3 (each issue .. wait inside one branch; the P V
// wait in the loop head, another basic block from the softmax), which is
// what keeps ptxas from serializing or injecting waits (NOTES.md).
template <int Stages, class C> SM90_HD void consumer_schedule(int s_begin, int s_end, C &c) {
    c.wait_full_k(ring_stage(0, Stages), full_parity(0, Stages), s_begin);
    c.qk(ring_stage(0, Stages));
    c.wgmma_wait0();
    c.release_k(ring_stage(0, Stages));
    c.softmax(s_begin); // O = 0, m = -inf: corr = 0 keeps O = 0 at the first rescale
    for (int t = s_begin; t < s_end; ++t) {
        const int i = t - s_begin;
        c.wgmma_wait0(); // P V of t-1 retired: its V stage is free, O and P may be rewritten
        if (i > 0) c.release_v(ring_stage(i - 1, Stages));
        c.rescale_pack();
        c.wait_full_v(ring_stage(i, Stages), full_parity(i, Stages), t);
        if (t + 1 < s_end) {
            c.wait_full_k(ring_stage(i + 1, Stages), full_parity(i + 1, Stages), t + 1);
            c.qk(ring_stage(i + 1, Stages));
            c.pv(ring_stage(i, Stages));
            c.wgmma_wait1(); // Q K^T of t+1 retired; P V of t may still run
            c.release_k(ring_stage(i + 1, Stages));
            c.softmax(t + 1);
        } else {
            c.pv(ring_stage(i, Stages));
        }
    }
    c.wgmma_wait0();
    c.release_v(ring_stage(s_end - 1 - s_begin, Stages));
}

// ---- v8: the consumer warpgroups take turns (ping-pong) -------------------------
// FlashAttention-3's warpgroup scheduling. In v5 both consumer warpgroups
// issue their Q K^T / P V wgmmas at about the same time and then both run
// their softmax, so the tensor cores idle through every softmax. In v8 the
// issue sections take turns: warpgroup 0 issues its wgmmas, hands the turn
// to warpgroup 1 and runs its softmax while the tensor cores work through
// warpgroup 1's wgmmas, and the other way round. With n warpgroups taking
// turns (v10: three) the turn goes round: 0, 1, .., n - 1, 0, ...
// Each warpgroup has a named barrier, "my turn" (kTurnBar0 + cw), of
// kTurnThreads = 256 threads: its own 128 wait on it (bar.sync) before
// issuing, the previous warpgroup's 128 (cw - 1, or n - 1 for warpgroup 0)
// arrive on it (bar.arrive) after issuing theirs. Warpgroup n - 1 arrives
// on warpgroup 0's barrier once before its first turn (warpgroup 0 goes
// first), and does not pass the turn after its last issue: then every
// barrier ends every phase complete (each warpgroup issues the same number
// of times: all run all of the CTA's tiles), nothing pending at exit. At
// most one arrival is ever ahead on a barrier: warpgroup cw - 1 passes
// again only after the turn came round through cw. Only with two or more
// active warpgroups (n < 2: no turns; a CTA whose last warpgroups hold only
// padding rows takes turns among the active ones). Named barrier ids 0
// (__syncthreads), 1 (the V tail clear) and 2 .. 4 (Q published per
// warpgroup) are taken.
constexpr int kTurnBar0 = 5;
constexpr int kTurnThreads = 256;
constexpr int kMaxTurnWGs = 3;
SM90_HD int turn_bar(int cw) { return kTurnBar0 + cw; }
// Before the first turn (n: warpgroups taking turns, W: the kernel's
// consumer warpgroups; with W = 2 the expressions are v8's own, n being 2
// or 0, so its code stays the code measured).
template <int W, class C> SM90_HD void turns_start(C &c, int cw, int n) {
    if (W == 2 ? n == 2 && cw == 1 : n >= 2 && cw == n - 1) c.nb_arrive(turn_bar(0), kTurnThreads);
}
// Wait for this warpgroup's turn.
template <int W, class C> SM90_HD void turn_wait(C &c, int cw, int n) {
    if (n >= 2) c.nb_sync(turn_bar(cw), kTurnThreads);
}
// Hand the turn to the next warpgroup (`last`: this warpgroup's last issue).
template <int W, class C> SM90_HD void turn_pass(C &c, int cw, int n, bool last) {
    if (W == 2) {
        if (n == 2 && !(last && cw == 1)) c.nb_arrive(turn_bar(1 - cw), kTurnThreads);
    } else if (n >= 2 && !(last && cw == n - 1)) {
        c.nb_arrive(turn_bar(cw + 1 < n ? cw + 1 : 0), kTurnThreads);
    }
}

// v8's consumer schedule: v5's pipelined order, in turns, with O's rescale
// moved under Q K^T. Iteration t packs P of tile t (S is then free for Q K^T
// of t + 1), waits for V[t] and K[t + 1], and in its turn issues Q K^T of
// t + 1, rescales O (O *= corr of tile t: P V of t - 1 retired at the end of
// the previous iteration, so O is no wgmma's operand now) while that runs,
// and issues P V of t; then, after the turn, waits for Q K^T of t + 1, runs
// its softmax and waits for P V of t (P and O are P V's operands until
// then). The waits for full stages stay outside the turns: wait_full_v may
// clear V rows behind a barrier of the active warpgroups (named barrier 1),
// which inside a turn would wait for a warpgroup waiting for the turn.
// C provides what consumer_schedule uses (rescale_pack split into pack()
// and rescale()) plus nb_sync / nb_arrive (named barrier id, threads).
// W: the kernel's consumer warpgroups (v8, v9: 2; v10: 3); turns: how many
// take turns (turns_start's n).
// i0: as producer_schedule's (v9 passes the loads of the CTA's earlier
// items; the turns start and end at rest within each call, so calls
// compose).
template <int Stages, int W = 2, class C>
SM90_HD void consumer_schedule_turns(int s_begin, int s_end, int cw, int turns, C &c, int i0 = 0) {
    turns_start<W>(c, cw, turns);
    c.wait_full_k(ring_stage(i0, Stages), full_parity(i0, Stages), s_begin);
    turn_wait<W>(c, cw, turns);
    c.qk(ring_stage(i0, Stages));
    turn_pass<W>(c, cw, turns, false); // tile s_begin's P V issues later: never the last turn
    c.wgmma_wait0();
    c.release_k(ring_stage(i0, Stages));
    c.softmax(s_begin); // O = 0, m = -inf: corr = 0 keeps O = 0 at the first rescale
    for (int t = s_begin; t < s_end; ++t) {
        const int i = i0 + t - s_begin;
        c.pack();
        c.wait_full_v(ring_stage(i, Stages), full_parity(i, Stages), t);
        if (t + 1 < s_end) {
            c.wait_full_k(ring_stage(i + 1, Stages), full_parity(i + 1, Stages), t + 1);
            turn_wait<W>(c, cw, turns);
            c.qk(ring_stage(i + 1, Stages));
            c.rescale();
            c.pv(ring_stage(i, Stages));
            turn_pass<W>(c, cw, turns, false);
            c.wgmma_wait1(); // Q K^T of t+1 retired; P V of t may still run
            c.release_k(ring_stage(i + 1, Stages));
            c.softmax(t + 1);
        } else {
            c.rescale();
            turn_wait<W>(c, cw, turns);
            c.pv(ring_stage(i, Stages));
            turn_pass<W>(c, cw, turns, true);
        }
        c.wgmma_wait0(); // P V of t retired: its V stage is free, O and P may be rewritten
        c.release_v(ring_stage(i, Stages));
    }
}

// ---- v9: persistent CTAs, items handed out by tickets ----------------------
// v5 / v8 launch one CTA per (query tile, split, KV head, batch): each CTA
// initializes its barriers, loads Q and fills the ring from empty, and the
// hardware's block order decides which tiles end up in the last wave. v9
// launches min(items, SMs) CTAs that each run a sequence of such items,
// the ring running on from one item into the next (the producer loads the
// next item's first K / V tiles while the consumers finish this one:
// loads i0.. of the schedules above) and the next item's Q loaded (cp.async,
// a second Q buffer) under this one's wgmmas.
// The order of the items (r = 0 .. items - 1, fp_tma::order_item):
//   - units u = (split, KV head, batch), u = hk + heads_kv (b + batch split);
//   - sections of `section` consecutive units (order_section: 1 without a
//     mask, so the CTAs running at one time read few units' K / V through
//     L2, as the hardware order gives v5 / v8, its consecutive CTAs being
//     the query tiles of one head; under a causal mask, more: their K and V
//     within the L2, at least 4 CTAs of a full grid on each unit);
//   - within a section, rank-major: the last query tile of every unit
//     first, then the one before it, ... (under a causal mask the last
//     tiles see the most keys: longest first).
// Tickets: CTA c's first item is r = c; each later one is gridDim.x +
// atomicAdd(&tickets[0], 1), taken `lead` key tiles before the end of the
// item before it (draw_tile; lead 0: when that item starts, session 19's
// rule): the CTAs that finish first take the next items (greedy list
// scheduling, which with longest first stays within a few percent of a
// perfect balance where a static assignment lost 20-60% on causal shapes:
// NOTES.md, session 19). Drawn at an item's start, a CTA commits to its
// next item a whole item early, which cost balance in the tail (session
// 20); drawn `lead` tiles before its end, the next item's Q and first K / V
// tiles still load under this one (session 36). tickets[1] counts the CTAs
// that drew past the end; the last of them sets both back to 0, so the
// counters are zero between launches (the context's per-stream arrival
// counters: fp_ctx_scratch_get_counted).
struct tile_order {
    int m_tiles; // query tiles per unit
    int units;   // num_splits x heads_kv x batch
    int section; // units per section, in [1, units]
    int heads_kv, batch;
    int items;   // m_tiles x units (< 2^31: the host checks)
    int lead;    // key tiles before an item's end at which the next ticket is drawn (0: at its start)
};
// The default lead: the consumers read the next ticket at that tile and
// load its Q under the item's last lead - 1 tiles (~2 us at head_dim 128),
// while the producer, a ring's depth ahead of them, draws it lead + kStages
// tiles of consumer time before the item ends (NOTES.md, session 36).
constexpr int kV9Lead = 3;
// The key tile of an item [s_begin, s_end) (s_begin < s_end) at which the
// next ticket is drawn (the producer, before that tile's loads) and read
// (the consumers, at the top of that tile's iteration, after its K wait):
// lead tiles before the end, the item's first tile when it has no more or
// lead is 0. Both sides compute it from the same item, so the consumers'
// read never waits on a draw the producer makes only after loads the
// consumers have yet to release.
SM90_HD int draw_tile(int s_begin, int s_end, int lead) {
    return lead > 0 && s_end - lead > s_begin ? s_end - lead : s_begin;
}
// Item r -> its query tile and unit.
SM90_HD void order_item(const tile_order &o, int r, int *m_tile, int *unit) {
    const int per_section = o.section * o.m_tiles; // <= items: no overflow
    const int s = r / per_section, j = r - s * per_section;
    const int first = s * o.section;
    const int n = o.units - first < o.section ? o.units - first : o.section; // units of section s
    const int rank = j / n;
    *unit = first + (j - rank * n);
    *m_tile = o.m_tiles - 1 - rank;
}
SM90_HD void unit_coords(const tile_order &o, int u, int *split, int *hk, int *b) {
    *hk = u % o.heads_kv;
    const int rest = u / o.heads_kv;
    *b = rest % o.batch;
    *split = rest / o.batch;
}
// Units per section. Unmasked (every item of a unit as long as the others:
// no order balances better than another) 1: the CTAs running at one time
// read the fewest units' K / V, as v5 / v8's hardware order does. Under a
// causal mask (or any right window: `banded`): at most what keeps the
// section's K and V within l2_bytes (unit_kv_bytes a unit), at most sms / 4
// (a full grid then runs at least 4 CTAs on each unit at a time), at least
// 1; then evened out (a short last section would start its longest tiles
// last).
// Measured (H100, bf16, session 20: v8_vs_v9 rows, FP_ATTN_V9_SECTION swept
// over 1, 4, 16, 64 and this rule): unmasked, sections sized to the L2 (22
// units of 2 MiB at 4k x 64 units) ran at a 71.6% L2 hit rate and 3.3x v8's
// DRAM bytes (ncu) and 3% behind section 1 at head_dim 128 (64 units: 13%);
// causal, section 1 ran 1-7% behind this rule (its last unit's longest tiles
// start last: the balance test below puts 16k x 4 heads at 1.23x the perfect
// balance with the tickets drawn one item ahead).
inline int order_section(int64_t l2_bytes, int64_t unit_kv_bytes, int units, int sms, bool banded) {
    if (units < 1 || !banded) return 1;
    int64_t n = unit_kv_bytes > 0 ? l2_bytes / unit_kv_bytes : units;
    if (n > sms / 4) n = sms / 4;
    if (n > units) n = units;
    if (n < 1) n = 1;
    const int64_t sections = (units + n - 1) / n;
    return (int)((units + sections - 1) / sections);
}
inline tile_order make_tile_order(int m_tiles, int num_splits, int heads_kv, int batch, int section,
                                  int lead = kV9Lead) {
    tile_order o;
    o.lead = lead < 0 ? 0 : lead;
    o.m_tiles = m_tiles;
    o.units = num_splits * heads_kv * batch;
    o.section = section < 1 ? 1 : (section > o.units ? o.units : section);
    o.heads_kv = heads_kv;
    o.batch = batch;
    o.items = m_tiles * o.units;
    return o;
}
// CTAs of a v9 launch: one per SM, fewer when there are fewer items.
inline int persistent_ctas(int items, int sms) {
    const int g = sms > 0 ? sms : 1;
    return items < g ? items : g;
}

// The item protocol. Item j of a CTA (its j-th ticket) goes through slot
// j % 2 of a two-slot ring in shared memory, guarded like the K / V ring:
// item_full[s] (1 arrival: the producer thread's, after it stored the
// ticket) and item_empty[s] (256: every consumer thread, after reading it),
// parities as ring_phase(j, 2). The producer takes ticket j + 1 and
// publishes it while it loads item j, before the loads of item j's
// draw_tile (at once when item j has no tiles or no work); the consumers
// read ticket j + 1 in their iteration of that tile (at once likewise) and
// load its Q rows under the rest of item j (Q buffer (j + 1) % 2). A
// ticket >= items ends the sequence (the consumers read it, the producer
// stops drawing).
// P provides (besides producer_schedule's): first_ticket(), next_ticket()
// (the atomic), valid(ticket), lead() (tile_order::lead),
// wait_item_empty(slot, parity), publish(slot, ticket) (store + arrive on
// item_full[slot]), item(ticket, &s_begin, &s_end) (false: no work: a
// varlen tile past its sequence), done() (the ticket counters' reset).
template <int Stages, class P> SM90_HD void producer_items(P &p) {
    int cur = p.first_ticket();
    p.wait_item_empty(ring_stage(0, 2), empty_parity(0, 2));
    p.publish(ring_stage(0, 2), cur);
    int i0 = 0; // loads so far: the ring's position
    for (int j = 0; p.valid(cur); ++j) {
        int nxt = 0;
        const auto draw = [&] {
            nxt = p.next_ticket();
            p.wait_item_empty(ring_stage(j + 1, 2), empty_parity(j + 1, 2));
            p.publish(ring_stage(j + 1, 2), nxt);
        };
        int sb = 0, se = 0;
        if (p.item(cur, &sb, &se) && sb < se) {
            const int d = draw_tile(sb, se, p.lead());
            producer_schedule<Stages>(sb, d, p, i0);
            draw();
            producer_schedule<Stages>(d, se, p, i0 + d - sb);
            i0 += se - sb;
        } else {
            draw();
        }
        cur = nxt;
    }
    p.done();
}
// What a consumer warpgroup knows of its next item once it has read the
// ticket (consumer_items' fetch): the ticket, its tiles [sb, se) (none
// when the ticket is past the end or the item has no work) and chain
// (this item and that one both have tiles).
struct next_item {
    int ticket, sb, se;
    bool chain;
};
// v9's consumer schedule over one item's tiles [s_begin, s_end):
// consumer_schedule_turns with two warpgroups always taking turns, where
// items may be chained. started: the item's first tile was issued, waited
// for and its softmax run by the previous item's last iteration (the turns
// are then running: no turns_start). At the top of tile t_read's iteration
// (draw_tile: its K was waited for, so the producer has published the next
// ticket) fetch() reads the next ticket into nx and loads its Q (buffer
// next_qb). nx.chain: this item's last iteration issues the next item's
// first Q K^T (S is free once the last P is packed) before this item's
// last P V, passes the turn on, and runs the next item's first softmax
// while that P V executes; then the epilogue (end_item(true)) runs while
// the other warpgroup issues. Unchained, the consumers restarted at every
// item: the first Q K^T waited for alone and the first softmax under
// nothing, both warpgroups at once (they share the item's K / V), ~1.5
// tiles an item by the count of NOTES.md, session 30.
// C provides (besides consumer_schedule_turns'): begin_next(ticket, qbuf)
// (waits for the next item's Q and publishes it, keeps this item's softmax
// state for its epilogue and resets it for the next item's rows).
template <int Stages, class C, class F>
SM90_HD void consumer_schedule_chain(int s_begin, int s_end, int cw, C &c, int i0, bool started, int t_read,
                                     F &fetch, const next_item &nx, int next_qb) {
    constexpr int W = 2;
    if (!started) {
        turns_start<W>(c, cw, 2);
        c.wait_full_k(ring_stage(i0, Stages), full_parity(i0, Stages), s_begin);
        turn_wait<W>(c, cw, 2);
        c.qk(ring_stage(i0, Stages));
        turn_pass<W>(c, cw, 2, false);
        c.wgmma_wait0();
        c.release_k(ring_stage(i0, Stages));
        c.softmax(s_begin);
    }
    for (int t = s_begin; t < s_end; ++t) {
        const int i = i0 + t - s_begin;
        if (t == t_read) fetch(true);
        c.pack();
        c.wait_full_v(ring_stage(i, Stages), full_parity(i, Stages), t);
        if (t + 1 < s_end || nx.chain) {
            const bool last = t + 1 == s_end; // chained: the next item's first tile
            if (last) c.begin_next(nx.ticket, next_qb);
            c.wait_full_k(ring_stage(i + 1, Stages), full_parity(i + 1, Stages), last ? nx.sb : t + 1);
            turn_wait<W>(c, cw, 2);
            c.qk(ring_stage(i + 1, Stages));
            c.rescale();
            c.pv(ring_stage(i, Stages));
            turn_pass<W>(c, cw, 2, false);
            c.wgmma_wait1();
            c.release_k(ring_stage(i + 1, Stages));
            c.softmax(last ? nx.sb : t + 1);
        } else {
            c.rescale();
            turn_wait<W>(c, cw, 2);
            c.pv(ring_stage(i, Stages));
            turn_pass<W>(c, cw, 2, true);
        }
        c.wgmma_wait0();
        c.release_v(ring_stage(i, Stages));
    }
}
// One consumer warpgroup (cw): C provides (besides
// consumer_schedule_chain's): read_item(slot, parity) (wait item_full, load
// the ticket, arrive on item_empty), valid(ticket), lead()
// (tile_order::lead), prefetch_q(ticket, qbuf, &s_begin, &s_end) (cp.async
// of its Q rows + commit, a group even when there is nothing to load; its
// tiles; false: no work), begin_item(ticket, qbuf, &s_begin, &s_end)
// (waits for its Q: every cp.async group; publishes it to the warpgroup's
// wgmmas, resets O and the softmax state; false: no work),
// end_item(chained) (the epilogue; chained: with the state begin_next
// kept, then O reset for the next item). An item chains to the next when
// both have tiles.
template <int Stages, class C> SM90_HD void consumer_items(int cw, C &c) {
    int cur = c.read_item(ring_stage(0, 2), full_parity(0, 2));
    if (!c.valid(cur)) return;
    int i0 = 0, sb = 0, se = 0, j = 0;
    c.prefetch_q(cur, 0, &sb, &se);
    bool started = false; // cur chained from the previous item (sb, se: its tiles)
    next_item nx = {0, 0, 0, false};
    // the next ticket: read, its Q loaded, chained when this item has tiles
    // (`tiles`) and it has too
    const auto fetch = [&](bool tiles) {
        nx.ticket = c.read_item(ring_stage(j + 1, 2), full_parity(j + 1, 2));
        nx.sb = nx.se = 0;
        nx.chain = c.valid(nx.ticket) && c.prefetch_q(nx.ticket, (j + 1) & 1, &nx.sb, &nx.se) && tiles &&
                   nx.sb < nx.se;
    };
    for (;; ++j) {
        if (started || c.begin_item(cur, j & 1, &sb, &se)) {
            if (sb < se) {
                consumer_schedule_chain<Stages>(sb, se, cw, c, i0, started, draw_tile(sb, se, c.lead()), fetch, nx,
                                                (j + 1) & 1);
                i0 += se - sb;
            } else {
                fetch(false);
            }
            c.end_item(nx.chain);
            started = nx.chain;
            sb = nx.sb;
            se = nx.se;
        } else {
            fetch(false);
        }
        if (!c.valid(nx.ticket)) return;
        cur = nx.ticket;
    }
}

// ---- TMA geometry (host) ------------------------------------------------------
// K (or V) as a 4-D tensor for cuTensorMapEncodeTiled, innermost first:
// (head_dim, seqlen_k, heads_kv, batch), byte strides (seq, head, batch).
// Tile t of kv head hk, batch b, column box c is the box at coordinates
// (64 c, t kBc, hk, b); rows >= seqlen_k are out of bounds (zero-filled by
// TMA), so a tile never reads another batch's rows. Varlen: one packed
// sequence dimension of total_k rows, batch 1; sequence b's tile t is at
// (64 c, cu_k[b] + t kBc, hk, 0) (kv_seq_rows), so its last tile may read
// the next sequence's first rows: masked for K, cleared for V
// (v_tail_rows with map_rows = total_k - cu_k[b]), zeros past total_k.
// A rank-R tensor map's geometry (o_map below is rank 5).
template <int R> struct map_geometry {
    uint64_t dims[R];
    uint64_t strides[R - 1]; // bytes, of dims 1..R - 1
    uint32_t box[R];
};
using kv_map = map_geometry<4>;
enum kv_map_status {
    KV_MAP_OK = 0,
    KV_MAP_BASE_ALIGN = 1,   // base address not 16-byte aligned
    KV_MAP_SEQ_STRIDE = 2,   // seq stride x 2 bytes not a positive multiple of 16 below 2^40
    KV_MAP_HEAD_STRIDE = 3,  // (heads_kv > 1) head stride likewise
    KV_MAP_BATCH_STRIDE = 4, // (batch > 1) batch stride likewise
    KV_MAP_GROUP = 5,        // (o_map_geometry) the GQA group does not divide 64
};
inline const char *kv_map_status_text(int s) {
    switch (s) {
    case KV_MAP_OK: return "ok";
    case KV_MAP_BASE_ALIGN: return "base address not 16-byte aligned";
    case KV_MAP_SEQ_STRIDE: return "seq stride not a positive multiple of 16 bytes (below 2^40)";
    case KV_MAP_HEAD_STRIDE: return "head stride not a positive multiple of 16 bytes (below 2^40)";
    case KV_MAP_BATCH_STRIDE: return "batch stride not a positive multiple of 16 bytes (below 2^40)";
    case KV_MAP_GROUP: return "GQA group does not divide 64 (a 64-row box would split a query position)";
    default: return "?";
    }
}
inline bool tma_stride_ok(int64_t elems, int eb = 2) {
    const int64_t bytes = elems * eb;
    return elems > 0 && bytes % 16 == 0 && bytes < (int64_t(1) << 40);
}
// Elements of eb bytes (2: f16 / bf16, 64-element boxes; 1: fp8, 128-element
// boxes: one 128-byte swizzle span a row either way). A dimension of extent 1 never steps: its stride is
// replaced by a harmless valid one (any multiple of 16) so broadcast / odd
// strides of unit dimensions are not refused.
// seqlen_k: the map's rows per batch (varlen: the packed total_k, batch 1,
// kv_seq_rows placing each sequence).
inline int kv_map_geometry(uintptr_t base, int head_dim, int seqlen_k, int heads_kv, int batch, int64_t ss,
                           int64_t hs, int64_t bs, int box_rows, kv_map *m, int eb = 2) {
    if (base % 16) return KV_MAP_BASE_ALIGN;
    if (!tma_stride_ok(ss, eb)) return KV_MAP_SEQ_STRIDE;
    if (heads_kv > 1 && !tma_stride_ok(hs, eb)) return KV_MAP_HEAD_STRIDE;
    if (batch > 1 && !tma_stride_ok(bs, eb)) return KV_MAP_BATCH_STRIDE;
    m->dims[0] = (uint64_t)head_dim;
    m->dims[1] = (uint64_t)seqlen_k;
    m->dims[2] = (uint64_t)heads_kv;
    m->dims[3] = (uint64_t)batch;
    m->strides[0] = (uint64_t)ss * eb;
    m->strides[1] = heads_kv > 1 ? (uint64_t)hs * eb : 16;
    m->strides[2] = batch > 1 ? (uint64_t)bs * eb : 16;
    m->box[0] = (uint32_t)(kBoxCols * 2 / eb);
    m->box[1] = (uint32_t)box_rows;
    m->box[2] = 1;
    m->box[3] = 1;
    return KV_MAP_OK;
}

// O as a 5-D tensor for the TMA-store epilogue (store_rows_tma), innermost
// first: (head_dim, group, seqlen_q, heads_kv, batch), byte strides (head,
// seq, head x group, batch). Packed query row r of KV head hk is query
// position r / group of head hk group + r % group, so a head index splits
// into (r % group, hk) and 64 packed rows from a multiple of 64 are the box
// (64 columns, group, 64 / group, 1, 1) at (64 c, 0, first row / group, hk,
// b): the Q tile's row order. Rows past seqlen_q fall outside the map (not
// written). Dense only: varlen's packed extent is on the device (cu_seqlens)
// and a tile's last rows may be the next sequence's.
using o_map = map_geometry<5>;
// 16-bit O; kv_map_status codes. A dimension of extent 1 gets a harmless
// valid stride (as kv_map_geometry).
inline int o_map_geometry(uintptr_t base, int head_dim, int seqlen_q, int heads_kv, int group, int batch,
                          int64_t ss, int64_t hs, int64_t bs, o_map *m) {
    if (group < 1 || 64 % group) return KV_MAP_GROUP;
    if (base % 16) return KV_MAP_BASE_ALIGN;
    if (seqlen_q > 1 && !tma_stride_ok(ss)) return KV_MAP_SEQ_STRIDE;
    if (heads_kv * group > 1 && !tma_stride_ok(hs)) return KV_MAP_HEAD_STRIDE;
    if (heads_kv > 1 && !tma_stride_ok(hs * group)) return KV_MAP_HEAD_STRIDE;
    if (batch > 1 && !tma_stride_ok(bs)) return KV_MAP_BATCH_STRIDE;
    m->dims[0] = (uint64_t)head_dim;
    m->dims[1] = (uint64_t)group;
    m->dims[2] = (uint64_t)seqlen_q;
    m->dims[3] = (uint64_t)heads_kv;
    m->dims[4] = (uint64_t)batch;
    m->strides[0] = group > 1 ? (uint64_t)hs * 2 : 16;
    m->strides[1] = seqlen_q > 1 ? (uint64_t)ss * 2 : 16;
    m->strides[2] = heads_kv > 1 ? (uint64_t)(hs * group) * 2 : 16;
    m->strides[3] = batch > 1 ? (uint64_t)bs * 2 : 16;
    m->box[0] = (uint32_t)kBoxCols;
    m->box[1] = (uint32_t)group;
    m->box[2] = (uint32_t)(64 / group);
    m->box[3] = 1;
    m->box[4] = 1;
    return KV_MAP_OK;
}

} // namespace fp_tma

#endif // FP_ATTENTION_TMA_SM90_H
