// Fragment layouts of the sm_80 warp-level matrix instructions, written from
// the PTX ISA's tables (not from any kernel), shared by the CUDA emulation's
// ldmatrix / mma.sync (emu_sm80.h) and the warp-level model of the flash
// kernel in tests/attention/test_attention_flash_emu.cpp. Plain functions of
// the 32 lanes' operands: no emulation runtime needed.
//
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 hand the
// shared addresses of rows 0..7 of matrix i (16 bytes each). Register i of
// lane l (g = l / 4, t = l % 4) then holds, low half first:
//   plain:  row g, elements 2t and 2t + 1 of matrix i
//   .trans: element g of rows 2t and 2t + 1 of matrix i
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32:
//   A 16x16: a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..)
//   B 16x8:  b0 (k 2t..2t+1, col g), b1 (k 2t+8..2t+9, col g)
//   C 16x8:  c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, cols 2t, 2t+1)
#pragma once

#include <cstdint>
#include <cstring>

namespace fp_sm80 {

// f16 / bf16 bits to f32 (exact).
inline float b16_to_f32(uint16_t x, bool bf16) {
    uint32_t u;
    if (bf16) {
        u = (uint32_t)x << 16;
    } else {
        const uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
        uint32_t exp = (x >> 10) & 0x1fu, man = x & 0x3ffu;
        if (exp == 0x1f) {
            u = sign | 0x7f800000u | (man << 13);  // inf / NaN
        } else if (exp == 0) {
            if (man == 0) {
                u = sign;
            } else {  // subnormal: normalize
                int e = -1;
                do {
                    man <<= 1;
                    e++;
                } while (!(man & 0x400u));
                u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
            }
        } else {
            u = sign | ((exp + 127 - 15) << 23) | (man << 13);
        }
    }
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// Where register i of `lane` comes from after ldmatrix.x4: element `col_lo`
// of the row handed by lane `row_lo` (low half), element `col_hi` of the row
// handed by lane `row_hi` (high half).
struct ldsm_source {
    int row_lo, col_lo, row_hi, col_hi;
};
inline ldsm_source ldmatrix_source(int lane, int i, bool trans) {
    const int g = lane / 4, t = lane % 4;
    if (!trans) return ldsm_source{8 * i + g, 2 * t, 8 * i + g, 2 * t + 1};
    return ldsm_source{8 * i + 2 * t, g, 8 * i + 2 * t + 1, g};
}

// One lane's accumulators of mma.sync m16n8k16 (f32 accumulate): c += A B,
// with A, B assembled from all 32 lanes' fragments a[lane][0..3], b0[lane],
// b1[lane]. The 16 products of an element are summed in f32 (exact for
// 16-bit inputs) in k order, then added to c.
inline void mma_m16n8k16_lane(int lane, const uint32_t a[32][4], const uint32_t b0[32], const uint32_t b1[32],
                              bool bf16, float c[4]) {
    const int g = lane / 4, t = lane % 4;
    float A[2][16], B[2][16];  // rows g, g + 8 of A; columns 2t, 2t + 1 of B
    for (int r = 0; r < 2; ++r)
        for (int tt = 0; tt < 4; ++tt) {
            const int src = 4 * g + tt;  // the lane holding row g (+8), k 2tt.. and 2tt+8..
            const uint32_t lo = a[src][r], hi = a[src][2 + r];
            A[r][2 * tt] = b16_to_f32((uint16_t)(lo & 0xffffu), bf16);
            A[r][2 * tt + 1] = b16_to_f32((uint16_t)(lo >> 16), bf16);
            A[r][2 * tt + 8] = b16_to_f32((uint16_t)(hi & 0xffffu), bf16);
            A[r][2 * tt + 9] = b16_to_f32((uint16_t)(hi >> 16), bf16);
        }
    for (int cc = 0; cc < 2; ++cc)
        for (int tt = 0; tt < 4; ++tt) {
            const int src = 4 * (2 * t + cc) + tt;  // the lane holding column 2t + cc, k 2tt.. and 2tt+8..
            B[cc][2 * tt] = b16_to_f32((uint16_t)(b0[src] & 0xffffu), bf16);
            B[cc][2 * tt + 1] = b16_to_f32((uint16_t)(b0[src] >> 16), bf16);
            B[cc][2 * tt + 8] = b16_to_f32((uint16_t)(b1[src] & 0xffffu), bf16);
            B[cc][2 * tt + 9] = b16_to_f32((uint16_t)(b1[src] >> 16), bf16);
        }
    for (int e = 0; e < 4; ++e) {
        float acc = 0.0f;
        for (int k = 0; k < 16; ++k) acc += A[e / 2][k] * B[e % 2][k];
        c[e] += acc;
    }
}

}  // namespace fp_sm80
