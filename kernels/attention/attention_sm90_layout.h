// Index math of the Hopper flash attention kernel (attention_flash_fwd_v3,
// kernels/attention/attention_flash_sm90.cu), shared (host + device) with the
// CPU emulation tests/attention/test_attention_sm90_emu.cpp: the tile shapes,
// where cp.async puts each 16-byte chunk of a Q / K / V tile in shared memory
// (the 128-byte swizzle layout), the wgmma matrix descriptors that describe
// those tiles to the tensor cores, and the accumulator / register-A fragment
// maps used by the softmax and the output store. The test re-derives what
// wgmma reads from each descriptor from the PTX ISA text independently and
// checks that it is the element the kernel meant.
//
// Shared-memory tile layout ("SW128 rows"): a tile of R rows x D 16-bit
// elements (Q: R = query rows, K / V: R = keys; D = head dim) is stored as
// D / 64 column blocks, each R rows of 128 bytes (64 elements); inside a
// block, 16-byte chunk c (0..7) of row r sits at chunk c ^ (r % 8). Every
// block starts on a 1024-byte boundary, so the XOR pattern is the one the
// hardware applies to address bits [4:6] ^= [7:9] (the "128B swizzle"
// mode, matrix base offset 0).
//   - Q K^T: A = Q rows, B = K rows: both K-major (head dim contiguous);
//     one 8-row group = 1024 bytes (SBO), the k16 step moves the start
//     address 32 bytes inside the 128-byte row (the swizzle is applied to the
//     final address, so this stays consistent), and every 4 steps to the
//     next column block.
//   - P V: B = V[keys][D] = K x N with N (head dim) contiguous: MN-major
//     (transpose bit set). 64 N-elements per swizzle atom, the next 64 at
//     LBO (= the next column block, R * 128 bytes); 8 keys per atom, the
//     next 8 at SBO (1024 bytes); the k16 step moves 16 rows (2048 bytes).
//
// Fragments (PTX ISA, wgmma .m64nNk16, warpgroup of 4 warps; w = warp in
// the warpgroup, g = lane / 4, t = lane % 4):
//   D (f32, N/2 registers): register i = 4 j + 2 h + c holds
//     (row 16 w + g + 8 h, col 8 j + 2 t + c).
//   A (registers, 4 x .b32 = 8 halves a0..a7): half 2 r + c holds
//     (row 16 w + g + 8 (r % 2), col 8 (r / 2) + 2 t + c).
//   So the D registers 8 kk .. 8 kk + 7 of S (keys 16 kk .. 16 kk + 15),
//   packed in pairs, are exactly A register r = pair r of P for k step kk.
#ifndef FP_ATTENTION_SM90_LAYOUT_H
#define FP_ATTENTION_SM90_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define SM90_HD __host__ __device__ __forceinline__
#else
#define SM90_HD inline
#endif

namespace fp_sm90 {

// Per head-dim configuration. Two consumer warpgroups of 64 rows each
// (kBr = 128): each issues its own wgmma m64 and owns its softmax rows; the
// K / V tiles in shared memory feed both. kBc = 128 keys per tile: the
// Q K^T wgmma is m64n128 (the widest N that leaves room for the O
// accumulator: S = 64 + O = D / 2 f32 registers per thread). Shared memory:
// Q + 2 stages of K and V = (kBr + 4 kBc) * D * 2 bytes = 80 KiB (D = 64,
// two CTAs per SM) / 160 KiB (D = 128, one CTA per SM).
// How the softmax hides behind the tensor cores:
//   D = 64: two CTAs per SM (kMinBlocks = 2: <= 128 registers per thread;
//     ptxas fits the plain schedule in 128 without spills), so one CTA's
//     softmax overlaps the other's wgmmas.
//   D = 128: one CTA per SM (160 KiB), so the overlap has to come from
//     inside: kPipelined issues Q K^T of tile t+1 and P V of tile t
//     together and runs the softmax of t+1 while P V of t executes, at the
//     cost of a second score tile in registers (S 64 + O 64 + P 32 f32 /
//     b32 per thread), which the 255-register budget of a 256-thread CTA
//     alone on its SM allows.
template <int D> struct traits;
template <> struct traits<64> {
    static constexpr int kWarpgroups = 2, kBr = 128, kBc = 128, kStages = 2, kMinBlocks = 2;
    static constexpr bool kPipelined = false;
};
template <> struct traits<128> {
    static constexpr int kWarpgroups = 2, kBr = 128, kBc = 128, kStages = 2, kMinBlocks = 1;
    static constexpr bool kPipelined = true;
};

// Byte offset, inside a tile of `rows` rows x D elements, of the 16-byte
// chunk c (elements 8 c .. 8 c + 7) of row r: what cp.async writes.
template <int D> SM90_HD uint32_t tile_chunk_offset(int r, int c, int rows) {
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
// Bytes of one tile.
template <int D> SM90_HD uint32_t tile_bytes(int rows) { return (uint32_t)(rows * D * 2); }

// wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor
// Format"): bits 0-13 start address >> 4, 16-29 leading dimension byte
// offset >> 4, 32-45 stride dimension byte offset >> 4, 49-51 base offset
// (0: every swizzle pattern starts on a 1024-byte boundary), 62-63 swizzle
// mode (1 = 128-byte swizzle).
SM90_HD uint64_t make_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo_bytes & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// A = Q (K-major): rows row0 .. row0 + 63 of the Q tile at q_addr (kBr
// rows), head-dim step kk (elements 16 kk .. 16 kk + 15). LBO is unused for
// K-major swizzled layouts ("assumed 1"): pass 16 bytes (encoded 1).
template <int D> SM90_HD uint64_t q_desc(uint32_t q_addr, int q_rows, int row0, int kk) {
    return make_desc(q_addr + (uint32_t)((kk >> 2) * q_rows * 128 + row0 * 128 + (kk & 3) * 32), 16, 1024);
}
// B = K^T (K-major: K tile rows are the N = kBc keys), head-dim step kk.
template <int D> SM90_HD uint64_t k_desc(uint32_t k_addr, int k_rows, int kk) {
    return make_desc(k_addr + (uint32_t)((kk >> 2) * k_rows * 128 + (kk & 3) * 32), 16, 1024);
}
// B = V (MN-major, transpose bit): keys 16 kk .. 16 kk + 15 (the k
// dimension) x all D columns (N). LBO: the next 64 columns (column block);
// SBO: the next 8 keys.
template <int D> SM90_HD uint64_t v_desc(uint32_t v_addr, int v_rows, int kk) {
    return make_desc(v_addr + (uint32_t)(kk * 16 * 128), (uint32_t)(v_rows * 128), 1024);
}

// Accumulator register i of lane (warp w of the warpgroup) -> (row, col) in
// the m64 x N tile.
SM90_HD int acc_row(int w, int lane, int i) { return 16 * w + (lane >> 2) + 8 * ((i >> 1) & 1); }
SM90_HD int acc_col(int lane, int i) { return 8 * (i >> 2) + 2 * (lane & 3) + (i & 1); }
// P (k step kk) as the register A operand: .b32 register r packs S
// accumulators p_src(kk, r) (low half) and p_src(kk, r) + 1 (high half).
SM90_HD int p_src(int kk, int r) { return 8 * kk + 2 * r; }

// fp8 (e4m3, wgmma .m64nNk32): register A's byte x = 4 r + y of a thread
// (quad lane t = lane % 4) holds (row g + 8 (r % 2), k 4 t + y + 16 (r / 2))
// (the ISA's "m64nNk32 register fragment layout for matrix A"), while the
// thread's S accumulators of keys 32 kk .. 32 kk + 31 are columns 8 j' + 2 t
// + c. Instead of moving bytes between lanes, P's k slots are filled from
// the thread's own accumulators: byte y of register r of k step kk is the
// accumulator p8_src(kk, r, y), key 32 kk + vt_key(16 (r / 2) + 4 t + y);
// V^T's columns (keys) are stored in that same order, so the product sums
// matching keys. vt_key permutes each group of 16 keys: slot 4 t + y holds
// key 2 t + (y % 2) + 8 (y / 2).
SM90_HD int p8_src(int kk, int r, int y) {
    const int j = 4 * kk + 2 * (r / 2) + y / 2; // the 8-column group of S
    return 4 * j + 2 * (r % 2) + (y % 2);
}
SM90_HD int vt_key(int slot) {
    const int s = slot % 16, t = s / 4, y = s % 4;
    return slot - s + 2 * t + (y % 2) + 8 * (y / 2);
}

} // namespace fp_sm90

#endif // FP_ATTENTION_SM90_LAYOUT_H
