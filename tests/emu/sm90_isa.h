// The Hopper wgmma operand rules, written from the PTX ISA text (not from the
// kernels' attention_sm90_layout.h): the shared-memory matrix descriptor,
// the canonical 128-byte-swizzle layouts of 16-bit elements, and the
// m64nNk16 register fragments. One copy, used by the CUDA emulation's wgmma
// (emu_sm90.h) and by the index-math test tests/attention/
// test_attention_sm90_emu.cpp.
//   - Matrix descriptor ("Matrix Descriptor Format"): start address >> 4 in
//     bits 0-13, leading dimension byte offset (LBO) >> 4 in 16-29, stride
//     dimension byte offset (SBO) >> 4 in 32-45, matrix base offset in
//     49-51, swizzle mode in 62-63 (0 none, 1 128B, 2 64B, 3 32B).
//   - Canonical layouts ("Shared Memory Matrix Layout"), T = 8 16-bit
//     elements (16 bytes), 128B swizzle:
//       K-major  ((8,m),(T,2k)):((8T,SBO),(1,T))
//       MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))
//     then the swizzle (Swizzle<3,4,3>: address bits [4:6] ^= bits [7:9]),
//     its pattern starting on a 1024-byte boundary when the base offset is 0.
//   - Fragments (figures "WGMMA .m64nNk16 register fragment layout"), thread
//     tid (0..127) of the warpgroup: accumulator D register i, register A
//     half x (x = 0..7: register x / 2, low half when x is even); for 8-bit
//     types (.m64nNk32) register A byte x.
//   - 8-bit elements (e4m3, k32): the same canonical K-major layout in
//     bytes (T = 16 elements); the ISA allows only K-major for them.
#ifndef FP_TESTS_EMU_SM90_ISA_H
#define FP_TESTS_EMU_SM90_ISA_H

#include <stdint.h>

namespace sm90_isa {

struct desc_fields {
    uint32_t start, lbo, sbo, base_offset, mode;
};
inline desc_fields decode_desc(uint64_t d) {
    desc_fields f;
    f.start = (uint32_t)(d & 0x3FFF) << 4;
    f.lbo = (uint32_t)((d >> 16) & 0x3FFF) << 4;
    f.sbo = (uint32_t)((d >> 32) & 0x3FFF) << 4;
    f.base_offset = (uint32_t)((d >> 49) & 7);
    f.mode = (uint32_t)(d >> 62);
    return f;
}
// Bits the format leaves reserved (14-15, 30-31, 46-48, 52-61).
inline uint64_t desc_reserved_bits(uint64_t d) {
    return d & ((3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3FFull << 52));
}
// 128-byte swizzle of a shared-memory byte address (base offset 0).
inline uint32_t swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7) << 4); }

// Byte address read for element (mn, k) of a K-major operand (A: mn = row
// m; B: mn = column n), elements of eb bytes (2: f16 / bf16, k16; 1: e4m3,
// k32), 128B swizzle.
inline uint32_t kmajor_addr(uint64_t desc, int mn, int k, int eb = 2) {
    const desc_fields f = decode_desc(desc);
    // ((8,m),(T,2k)):((8T,SBO),(1,T)) in elements, SBO in bytes; T = 16 / eb
    // elements (16 bytes), a row of the swizzle atom 8T elements (128 bytes)
    const int T = 16 / eb;
    const uint32_t off = (uint32_t)((mn % 8) * 128 + (mn / 8) * f.sbo + (k % T) * eb + (k / T) * 16);
    return swizzle128(f.start + off);
}
// ... of an MN-major operand: element (k, mn).
inline uint32_t mnmajor_addr(uint64_t desc, int k, int mn) {
    const desc_fields f = decode_desc(desc);
    // ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) in elements, LBO / SBO in bytes
    const uint32_t off =
        (uint32_t)((mn % 8) * 2 + ((mn / 8) % 8) * 8 * 2 + (mn / 64) * f.lbo + (k % 8) * 64 * 2 + (k / 8) * f.sbo);
    return swizzle128(f.start + off);
}
// The only mode the models above describe: 128B swizzle, base offset 0.
inline bool desc_ok(uint64_t desc) {
    const desc_fields f = decode_desc(desc);
    return f.mode == 1 && f.base_offset == 0;
}

// Accumulator D of m64nNk16, thread tid (0..127) of the warpgroup,
// register i: (row, col).
inline int doc_d_row(int tid, int i) { return 16 * (tid / 32) + (tid % 32) / 4 + 8 * ((i % 4) / 2); }
inline int doc_d_col(int tid, int i) { return 8 * (i / 4) + 2 * (tid % 4) + (i % 2); }
// Register A of m64nNk16 (f16 / bf16): half x: (row, col) in the 64 x 16 A
// tile.
inline int doc_a_row(int tid, int x) { return 16 * (tid / 32) + (tid % 32) / 4 + 8 * ((x / 2) % 2); }
inline int doc_a_col(int tid, int x) { return 2 * (tid % 4) + (x % 2) + 8 * (x / 4); }
// Register A of m64nNk32 (.e4m3 / .e5m2: 4 registers of 4 bytes), byte x
// (0..15: register x / 4, byte x % 4 from the least significant): (row,
// col) in the 64 x 32 A tile (figure "WGMMA .m64nNk32 register fragment
// layout for matrix A").
inline int doc_a8_row(int tid, int x) { return 16 * (tid / 32) + (tid % 32) / 4 + 8 * ((x / 4) % 2); }
inline int doc_a8_col(int tid, int x) { return 4 * (tid % 4) + (x % 4) + 16 * (x / 8); }

} // namespace sm90_isa

#endif // FP_TESTS_EMU_SM90_ISA_H
