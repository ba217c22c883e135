// sm_80 warp-level instructions for the CUDA emulation (cuda_emu.h): a
// kernel source built with FP_CUDA_EMU routes its PTX wrappers here.
//   ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16   ldmatrix_x4
//   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}    mma_m16n8k16
//   ex2.approx.ftz.f32                                  ex2_approx_ftz
//   cp.async / commit_group / wait_group                emu_cp_async.h
// ldmatrix and mma are warp collectives over all 32 lanes (.aligned: every
// lane executes the same instruction; a lane that exited or diverged fails
// the launch). Fragment layouts: sm80_fragments.h (from the PTX ISA).
// ldmatrix checks each row address (16-byte aligned, inside the dynamic
// shared memory) and tells the shadow race checks which rows every lane
// consumes (smem_note_read), so a tile read before its cp.async landed, or
// without the barrier after another thread's copy, fails the launch.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda_emu.h"
#include "emu_cp_async.h"
#include "sm80_fragments.h"

namespace fp_emu {

// ldmatrix phases with a shared-memory bank conflict so far: each of the 4
// matrices is read in one phase, whose 8 rows (16 bytes, 4 banks each) must
// fall in 8 different 16-byte bank groups (address / 16 mod 8), else the
// hardware serializes the phase. Counted once per warp instruction; a
// performance finding, not an error.
inline long g_ldmatrix_conflicts = 0;

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r0..r3}, [addr]
inline void ldmatrix_x4(uint32_t r[4], uint32_t addr, bool trans) {
    const char *what = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
    if (addr % 16) kernel_fail("%s: row address %u of lane %u is not 16-byte aligned", what, addr, cur()->lane);
    const unsigned char *s = warp_exchange(0xffffffffu, &addr, sizeof addr, what);
    uint32_t rows[32];
    for (int l = 0; l < 32; ++l) std::memcpy(&rows[l], s + l * kSlotBytes, sizeof rows[l]);
    const int lane = (int)cur()->lane;
    if (lane == 0)
        for (int i = 0; i < 4; ++i) {
            unsigned groups = 0;
            bool conflict = false;
            for (int r = 0; r < 8; ++r) {
                const unsigned bit = 1u << ((rows[8 * i + r] / 16) % 8);
                conflict |= (groups & bit) != 0;
                groups |= bit;
            }
            if (conflict) g_ldmatrix_conflicts++;
        }
    // The rows this lane's registers come from, each noted once.
    bool noted[32] = {false};
    for (int i = 0; i < 4; ++i) {
        const fp_sm80::ldsm_source src = fp_sm80::ldmatrix_source(lane, i, trans);
        for (int row : {src.row_lo, src.row_hi})
            if (!noted[row]) {
                smem_note_read(rows[row], 16);
                noted[row] = true;
            }
        uint16_t lo, hi;
        std::memcpy(&lo, smem_at(rows[src.row_lo], 16) + 2 * src.col_lo, 2);
        std::memcpy(&hi, smem_at(rows[src.row_hi], 16) + 2 * src.col_hi, 2);
        r[i] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
// {c0..c3}, {a0..a3}, {b0, b1}, {c0..c3}
inline void mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, bool bf16) {
    const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    const unsigned char *s =
        warp_exchange(0xffffffffu, mine, sizeof mine, bf16 ? "mma.sync.m16n8k16.bf16" : "mma.sync.m16n8k16.f16");
    uint32_t A[32][4], B0[32], B1[32];
    for (int l = 0; l < 32; ++l) {
        uint32_t f[6];
        std::memcpy(f, s + l * kSlotBytes, sizeof f);
        for (int i = 0; i < 4; ++i) A[l][i] = f[i];
        B0[l] = f[4];
        B1[l] = f[5];
    }
    fp_sm80::mma_m16n8k16_lane((int)cur()->lane, A, B0, B1, bf16, c);
}

// ex2.approx.ftz.f32: 2^x; results below FLT_MIN flush to +0 (-inf gives 0),
// a subnormal x reads as 0. The exact exp2f stands in for the ~2 ulp
// approximation.
inline float ex2_approx_ftz(float x) {
    if (std::fabs(x) < FLT_MIN) x = 0.0f;
    const float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
}

}  // namespace fp_emu
