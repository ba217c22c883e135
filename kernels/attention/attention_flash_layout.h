// Index math of the flash attention kernel, shared (host + device) with the
// warp-level CPU emulation in tests/attention/test_attention_flash_emu.cpp,
// which checks it without a GPU: tile shapes per head dim, the shared-memory
// swizzle, which row/chunk each lane hands to ldmatrix for every operand, and
// which key tiles a CTA (and each KV split) visits.
//
// MMA m16n8k16 fragments (PTX ISA; g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..),
//                      a2 (row g, k 2t+8..),  a3 (row g+8, k 2t+8..)
//   B 16x8 col-major:  b0 (k 2t..2t+1, col g), b1 (k 2t+8..2t+9, col g)
//   C 16x8 f32:        c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same cols)
// ldmatrix.x4: lanes 8i..8i+7 give the 8 row addresses of matrix i; register
// i of a lane then holds (row g, cols 2t, 2t+1) of matrix i, or with .trans
// (rows 2t, 2t+1; col g).
#ifndef FP_ATTENTION_FLASH_LAYOUT_H
#define FP_ATTENTION_FLASH_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define FLASH_HD __host__ __device__ __forceinline__
#else
#define FLASH_HD inline
#endif

namespace fp_flash {

// Per head-dim configuration of attention_flash_fwd_v1 (D = 32, 64, 96,
// 128, 256).
// kMT = 1: each warp owns one 16-row MMA block (kBr = 16 * kWarps), which
// keeps Q (D/4 registers), S (kBc/2) and O (D/2) in registers without
// spilling up to D = 128.
// kBc = 64: 4 k-steps of P V per tile, enough work between barriers.
// Shared memory: Q + 2 stages of K + 2 of V = (kBr + 4 kBc) * pitch * 2 bytes
// (20 / 40 / 65 / 80 / 96 KiB at D = 32 / 64 / 96 / 128 / 256: two CTAs per
// SM on H100, and on A100 up to D = 128).
template <int D> struct traits; // only the head dims below
template <> struct traits<32> {
    static constexpr int kWarps = 4, kMT = 1, kBr = 64, kBc = 64, kStages = 2;
    static constexpr bool kQInRegisters = true;
    static constexpr bool kTightRegs = false;
};
template <> struct traits<64> {
    static constexpr int kWarps = 4, kMT = 1, kBr = 64, kBc = 64, kStages = 2;
    static constexpr bool kQInRegisters = true;
    static constexpr bool kTightRegs = false;
};
template <> struct traits<96> {
    static constexpr int kWarps = 4, kMT = 1, kBr = 64, kBc = 64, kStages = 2;
    static constexpr bool kQInRegisters = true;
    static constexpr bool kTightRegs = false;
};
template <> struct traits<128> {
    static constexpr int kWarps = 4, kMT = 1, kBr = 64, kBc = 64, kStages = 2;
    static constexpr bool kQInRegisters = true;
    static constexpr bool kTightRegs = false;
};
// D = 256: O alone takes 128 registers per thread, so Q is re-read from
// shared memory at every k step, and 32-key tiles keep the CTA at 96 KiB.
template <> struct traits<256> {
    static constexpr int kWarps = 4, kMT = 1, kBr = 64, kBc = 32, kStages = 2;
    static constexpr bool kQInRegisters = false;
    static constexpr bool kTightRegs = false;
};

// attention_flash_fwd_v2 (D = 64, 128): each warp owns two 16-row blocks
// (kBr = 128), so every K / V fragment read from shared memory feeds two
// MMAs: half the ldmatrix traffic per MMA of v1, whose 16 rows per warp make
// shared-memory bandwidth, not the tensor cores, the likely limit on H100.
// Costs: twice the accumulator registers (at D = 128: Q re-read from shared
// memory), 48 / 96 KiB of shared memory, coarser query tiles for short or
// causal sequences. Not selected by default: measured on an H200 at 1.1-1.4x
// v1 (with 128 x 32 tiles at D = 128) and below the Hopper kernels
// (benchmarks/NOTES.md).
//
// kTightRegs (flash_fwd_body): O (D / 2 = 64 f32 registers per 16-row
// block) and S (kBc / 2) of two row blocks fill most of the 255 registers a
// thread may have, so the body keeps nothing else through the KV loop that
// it can do without: P is packed to 16 bits right after the softmax (32
// registers where S's f32 took 64, before the P V loop rather than inside
// it), the softmax runs outside the active-warp branch (ptxas then has no
// divergent fallback path for its shuffles, a path that carried as many live
// registers as the loop plus its call), the epilogue derives the CTA's
// coordinates again instead of holding them through the loop, the mask
// tests each score's column against an immediate, and the ldmatrix
// addresses are a lane offset XOR the step (ldsm_off below: v2's P V at
// D = 128 took ~124 address instructions per warp and tile on sm_90 with
// the swizzle recomputed per ldmatrix, 23 in this form).
template <int D> struct traits_v2;
template <> struct traits_v2<64> {
    static constexpr int kWarps = 4, kMT = 2, kBr = 128, kBc = 64, kStages = 2;
    static constexpr bool kQInRegisters = true;
    static constexpr bool kTightRegs = false;
};
// D = 128: FlashAttention-2's forward tile on mma.sync (128 x 64, 4 warps of
// 32 rows): per warp and tile 256 HMMA against 80 ldmatrix (Q 16, K 32, V
// 32), one K and one V barrier per 64 keys; O 128 + S 64 registers, so
// kTightRegs (no spill on sm_80 / sm_90 with nvcc 13; checked by
// tests/sass/check_sass.py). 2 x 48 KiB of K / V stages + 32 KiB of Q = 96
// KiB: two CTAs per SM on an H100 (and an A100's 164 KiB holds one).
template <> struct traits_v2<128> {
    static constexpr int kWarps = 4, kMT = 2, kBr = 128, kBc = 64, kStages = 2;
    static constexpr bool kQInRegisters = false;
    static constexpr bool kTightRegs = true;
};
// v2's earlier tile at D = 128 (128 x 32: S for 32 rows fits next to O
// without the tight-register measures), kept for the A/B
// (FP_ATTN_V2_TILE=128x32): measured at 241 TFLOP/s on an H100 at 4k
// (session 14), 1.08x v1.
template <int D> struct traits_v2_narrow {
    static_assert(D == 128, "the 128 x 32 tile is v2's at head_dim 128 only");
    static constexpr int kWarps = 4, kMT = 2, kBr = 128, kBc = 32, kStages = 2;
    static constexpr bool kQInRegisters = false;
    static constexpr bool kTightRegs = false;
};

// attention_flash_fwd_v7 (every head dim of v1): v1's body over 8 warps,
// FlashAttention-2's 128 x 64 tile on mma.sync (128 x 32 at D = 256): each
// warp still owns 16 rows, so its registers are v1's (~213 at D = 128: one
// CTA of 256 threads per SM, the same 8 warps per SM as v1's two CTAs), but
// a K / V tile loaded once feeds 8 warps instead of 4: half the cp.async
// issue instructions per MMA (session 14 counted ~240 of a warp's ~1100
// instructions per tile in copies) and half the tile bytes an SM reads from
// L2 per MMA; the two barriers per tile now wait on 8 warps. Shared memory
// (128 + 4 kBc) x pitch x 2: 30 / 48 / 78 / 96 / 128 KiB at D = 32 / 64 /
// 96 / 128 / 256.
template <int D> struct traits_w8 {
    static constexpr int kWarps = 8, kMT = 1, kBr = 128, kBc = traits<D>::kBc, kStages = 2;
    static constexpr bool kQInRegisters = traits<D>::kQInRegisters;
    static constexpr bool kTightRegs = false;
};

// attention_decode_fwd_v6, the decode kernel (any head dim of v1): one
// 16-row MMA block of packed query rows per CTA (a decode step's GQA group,
// seqlen_q * group <= 16, fills it; more rows take more query tiles), and
// its 4 warps split each 64-key tile, 16 keys apiece, instead of one warp
// doing a tile's math while three hold padding rows (v1's 64-row tile at
// seqlen_q 1). K / V stream through a ring of kStages tiles with one barrier
// per tile: kStages - 1 tiles (kStages - 1 x 2 x 64 x D x 2 bytes) in
// flight while a tile is worked on, where v1 prefetches one K or V tile
// behind the previous tile's math. The warps' softmax states merge through
// shared memory at the end. Shared memory (16 + 2 kStages 64) x pitch x 2
// bytes: 42 / 66 / 81 / 100 / 136 KiB at D = 32 / 64 / 96 / 128 / 256 (two
// CTAs per SM on an H100 up to D = 128).
template <int D> struct traits_decode {
    static constexpr int kWarps = 4, kMT = 1, kBr = 16, kBc = 16 * kWarps;
    static constexpr int kStages = D <= 64 ? 4 : D <= 128 ? 3 : 2;
    static constexpr bool kQInRegisters = D <= 128;
    static constexpr bool kTightRegs = false;
};

FLASH_HD int imin(int a, int b) { return a < b ? a : b; }
FLASH_HD int imax(int a, int b) { return a > b ? a : b; }

// Shared tiles are [rows][pitch] 16-bit elements read as 16-byte chunks by
// ldmatrix, 8 consecutive rows at the same logical chunk per phase; the
// layout must put those 8 rows in 8 different 16-byte bank groups.
//   D = 64, 128 (row = 8 or 16 chunks, a multiple of 128 bytes): XOR swizzle,
//     chunk c of row r stored at chunk c ^ (r & 7); no padding, so D = 128
//     stays at 80 KiB and two CTAs fit an A100 SM.
//   D = 32, 96: rows padded by one chunk (pitch D + 8 elements = 80 / 208
//     bytes = 20 / 52 words): 8 rows start 20 words (mod 32) apart, i.e. at
//     banks 0, 20, 8, 28, 16, 4, 24, 12: also conflict-free.
template <int D> struct smem_layout {
    static constexpr bool kSwizzle = D % 64 == 0;
    static constexpr int kPitch = kSwizzle ? D : D + 8; // elements per row
};
// Element offset of chunk c (8 elements) of row r.
template <int D> FLASH_HD int swz(int r, int c) {
    return smem_layout<D>::kSwizzle ? (r * (D / 8) + (c ^ (r & 7))) * 8 : r * smem_layout<D>::kPitch + c * 8;
}

// A fragments of Q (16-row block starting at tile row r0, k step kk):
// matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
// (rows 8-15, k 8-15) = a0..a3.
FLASH_HD int q_ldsm_row(int r0, int lane) { return r0 + (lane & 15); }
FLASH_HD int q_ldsm_chunk(int kk, int lane) { return kk * 2 + (lane >> 4); }
// B fragments of K^T for key blocks 2np, 2np+1: K rows are keys (= B
// columns), non-transposed: matrices (keys 0-7, k 0-7) = b0 and (keys 0-7,
// k 8-15) = b1 of block 2np, then the same for keys 8-15 (block 2np+1).
FLASH_HD int k_ldsm_row(int np, int lane) { return np * 16 + (lane & 7) + ((lane >> 4) << 3); }
FLASH_HD int k_ldsm_chunk(int kk, int lane) { return kk * 2 + ((lane >> 3) & 1); }
// B fragments of V for head-dim blocks 2dp, 2dp+1, keys kk*16..: V rows are
// keys (= B rows, the k dimension), so .trans: matrices (keys 0-7, d 0-7) =
// b0, (keys 8-15, d 0-7) = b1 of block 2dp, then d 8-15 for block 2dp+1.
FLASH_HD int v_ldsm_row(int kk, int lane) { return kk * 16 + (lane & 15); }
FLASH_HD int v_ldsm_chunk(int dp, int lane) { return dp * 2 + (lane >> 4); }

// The same addresses in bytes as a lane's offset XOR the step (kTightRegs,
// D % 64 == 0, the XOR swizzle): with c = 2 s + b (b = the lane's 0 / 1
// half) and x = r & 7 fixed per lane, c ^ x = 2 s ^ (b ^ x), so
//   2 * swz<D>(r, c) = r 2D + ((c ^ x) << 4) = (r 2D + ((b ^ x) << 4)) ^ (s << 5)
// as long as s << 5 < 2D (only chunk bits change; the row term r 2D has
// none of bits 4 .. log2(2D) - 1 set). One LOP3 per ldmatrix where the
// swizzle's per-step chunks took an address register each, or their
// recomputation (~4 instructions per ldmatrix in v2's P V at D = 128, with
// no register to spare). The kernel adds the 16-row block's first row
// (Q: the warp's rows; K: the key block np * 16; V: the k step's first
// key kk * 16) times 2D as an immediate: a multiple of 8 rows, so x is
// the lane's.
template <int D> FLASH_HD uint32_t ldsm_off(int r, int b) {
    static_assert(smem_layout<D>::kSwizzle, "the XOR form needs the XOR swizzle (D = 64, 128, 256)");
    return (uint32_t)(r * 2 * D + ((b ^ (r & 7)) << 4));
}
FLASH_HD uint32_t ldsm_step(uint32_t off, int s) { return off ^ ((uint32_t)s << 5); }
// A lane's offsets (first row 0) for Q (step kk), K (step kk), V (step dp).
template <int D> FLASH_HD uint32_t q_ldsm_off(int lane) { return ldsm_off<D>(lane & 15, lane >> 4); }
template <int D> FLASH_HD uint32_t k_ldsm_off(int lane) {
    return ldsm_off<D>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
}
template <int D> FLASH_HD uint32_t v_ldsm_off(int lane) { return ldsm_off<D>(lane & 15, lane >> 4); }

// blockIdx.x -> (query tile, KV split). Query tiles run last-first: with a
// causal mask the last tiles see the most keys, and starting them first
// keeps the tail of the grid short.
FLASH_HD void cta_coords(int bx, int m_tiles, int *m_tile, int *split) {
    *m_tile = m_tiles - 1 - bx % m_tiles;
    *split = bx / m_tiles;
}

// Sequence b: query count, key count, element offsets of its row 0 in Q, K,
// V, O. Plain batches use the batch strides (and seqlens_k, clamped to
// [0, sk]); varlen batches the cumulative offsets (lengths clamped to the
// maxima sq / sk, a decreasing pair reads as empty).
struct seq_view {
    int sq, L;
    int64_t q0, k0, v0, o0;
};

FLASH_HD int clamp_len(int64_t x, int hi) { return x < 0 ? 0 : (x > hi ? hi : (int)x); }

FLASH_HD seq_view make_seq(int b, int sq, int sk, const int32_t *seqlens_k, const int32_t *cu_q,
                           const int32_t *cu_k, int64_t q_bs, int64_t q_ss, int64_t k_bs, int64_t k_ss,
                           int64_t v_bs, int64_t v_ss, int64_t o_bs, int64_t o_ss) {
    seq_view s;
    if (cu_q) {
        s.sq = clamp_len((int64_t)cu_q[b + 1] - cu_q[b], sq);
        s.L = clamp_len((int64_t)cu_k[b + 1] - cu_k[b], sk);
        s.q0 = cu_q[b] * q_ss;
        s.o0 = cu_q[b] * o_ss;
        s.k0 = cu_k[b] * k_ss;
        s.v0 = cu_k[b] * v_ss;
    } else {
        s.sq = sq;
        s.L = seqlens_k ? clamp_len(seqlens_k[b], sk) : sk;
        s.q0 = b * q_bs;
        s.o0 = b * o_bs;
        s.k0 = b * k_bs;
        s.v0 = b * v_bs;
    }
    return s;
}

// The launchers pass windows through this first: window_left as
// clamp_window(wl, sk), window_right as clamp_window(wr, sq) (sq, sk: the
// maximum lengths). fp_attn_check accepts any window >= -1 (e.g. INT_MAX for
// "unbounded"), but row_keys / plan_block work in int, and diag - wl,
// diag + wr overflowed for such windows (rows then kept no key). Since diag
// = i + L - sq_b lies in [L - sq_b, L - 1], a left window >= sk or a right
// window >= sq keeps every key of every row: exactly the unbounded window,
// -1. What is left stays in int while sq + sk < 2^31.
FLASH_HD int clamp_window(int w, int reach) { return w >= reach ? -1 : w; }

// Keys kept by packed query row r (position r / group): [lo, hi].
FLASH_HD void row_keys(int r, int group, int L, int sq, int wl, int wr, int *lo, int *hi) {
    int diag = r / group + L - sq; // bottom-right aligned diagonal
    *lo = wl >= 0 ? imax(0, diag - wl) : 0;
    *hi = wr >= 0 ? imin(L - 1, diag + wr) : L - 1;
}

// What one CTA (packed rows m0..m0+Br-1, KV split `split`) visits.
struct block_plan {
    int full_lo, full_hi; // keys every row of the CTA keeps: tiles inside need no mask
    int s_begin, s_end;   // key tiles [s_begin, s_end) of this split
};

FLASH_HD block_plan plan_block(int m0, int Br, int Bc, int rows, int group, int L, int sq, int wl, int wr,
                               int split, int num_splits) {
    const int off = L - sq;
    const int qi_min = m0 / group;
    const int qi_max = (imin(m0 + Br, rows) - 1) / group;
    // union of the rows' key ranges: [kb, ke)
    const int kb = wl >= 0 ? imax(0, qi_min + off - wl) : 0;
    const int ke = wr >= 0 ? imin(L, qi_max + off + wr + 1) : L;
    block_plan p;
    p.full_lo = wl >= 0 ? imax(0, qi_max + off - wl) : 0;
    p.full_hi = wr >= 0 ? imin(L - 1, qi_min + off + wr) : L - 1;
    const int t_begin = kb / Bc;
    const int t_end = ke > kb ? (ke + Bc - 1) / Bc : t_begin;
    const int per_split = (t_end - t_begin + num_splits - 1) / num_splits;
    p.s_begin = imin(t_end, t_begin + split * per_split);
    p.s_end = imin(t_end, p.s_begin + per_split);
    return p;
}

// A tile needs the element mask unless all its keys are kept by every row.
FLASH_HD bool tile_needs_mask(const block_plan &p, int n0, int Bc) {
    return !(n0 >= p.full_lo && n0 + Bc - 1 <= p.full_hi);
}

} // namespace fp_flash

#endif // FP_ATTENTION_FLASH_LAYOUT_H
