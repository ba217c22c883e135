// Self-test of the emulated sm_80 instructions (emu_sm80.h): ldmatrix
// (.x4, .x4.trans), mma.sync m16n8k16 (f16, bf16) and ex2.approx.ftz, on
// known small matrices. The registers of a few lanes are checked against
// values read off the PTX ISA's fragment figures (written out here, not
// computed by the model), and the two instructions together must compute
// a 16x16 by 16x8 product the way kernels use them: A row-major through
// ldmatrix, B either as rows of B^T (ldmatrix) or row-major (ldmatrix.trans).
// Small integers and halves keep every sum exact, so products compare
// exactly. Then the rule violations the emulation must report, and the
// emulated device allocations (NaN-filled, guarded).
#include <cuda_runtime.h>

#include "emu_test.h"

#include "emu_sm80.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

static uint16_t to_b16(float x, bool bf16) {
    if (bf16) {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        return (uint16_t)(u >> 16);  // exact for the values used here
    }
    __half h = __float2half_rn(x);
    uint16_t r;
    std::memcpy(&r, &h, 2);
    return r;
}

// 32 rows of 8 b16 in shared memory (row r = lane r's address, the rows in
// a scrambled order), one ldmatrix.x4 (.trans), each lane's 4 registers to
// out[lane * 4 ..].
__global__ void ldsm_regs(const uint16_t *rows, uint32_t *out, int trans) {
    extern __shared__ __align__(16) uint16_t tile[];
    const int lane = threadIdx.x;
    for (int x = 0; x < 8; ++x) tile[((lane * 13) % 32) * 8 + x] = rows[lane * 8 + x];
    __syncthreads();
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(tile + ((lane * 13) % 32) * 8);
    uint32_t r[4];
    fp_emu::ldmatrix_x4(r, addr, trans != 0);
    for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

// C (16x8, f32, row-major, preloaded with c_in) += A (16x16 row-major) B
// (16x8): A through ldmatrix.x4 (lane l: row l % 16, k half l / 16), B
// either from B^T stored row-major [8][16] (ldmatrix.x4: lane l hands n =
// l % 8, k half (l / 8) % 2) or from B row-major [16][8] (ldmatrix.x4.trans:
// lane l hands k = l % 16).
__global__ void gemm16x8(const uint16_t *a, const uint16_t *b, const float *c_in, float *c_out, int b_trans_path,
                         int bf16) {
    extern __shared__ __align__(16) uint16_t sm[];
    uint16_t *sa = sm, *sb = sm + 256;  // A [16][16]; B^T [8][16] or B [16][8]
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) sa[i] = a[i];
    for (int i = lane; i < 128; i += 32) sb[i] = b[i];
    __syncthreads();
    uint32_t fa[4], fb[4];
    // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    fp_emu::ldmatrix_x4(fa, (uint32_t)__cvta_generic_to_shared(sa + (lane % 16) * 16 + (lane / 16) * 8), false);
    if (!b_trans_path) {
        // B^T [n][k]: matrices (n 0-7, k 0-7) = b0, (n 0-7, k 8-15) = b1 (lanes 16-31 repeat them)
        fp_emu::ldmatrix_x4(fb, (uint32_t)__cvta_generic_to_shared(sb + (lane % 8) * 16 + ((lane / 8) % 2) * 8), false);
    } else {
        // B [k][n]: matrices (k 0-7, n 0-7) = b0, (k 8-15, n 0-7) = b1, transposed
        fp_emu::ldmatrix_x4(fb, (uint32_t)__cvta_generic_to_shared(sb + (lane % 16) * 8), true);
    }
    const int g = lane / 4, t = lane % 4;
    float c[4] = {c_in[g * 8 + 2 * t], c_in[g * 8 + 2 * t + 1], c_in[(g + 8) * 8 + 2 * t], c_in[(g + 8) * 8 + 2 * t + 1]};
    fp_emu::mma_m16n8k16(c, fa, fb[0], fb[1], bf16 != 0);
    c_out[g * 8 + 2 * t] = c[0];
    c_out[g * 8 + 2 * t + 1] = c[1];
    c_out[(g + 8) * 8 + 2 * t] = c[2];
    c_out[(g + 8) * 8 + 2 * t + 1] = c[3];
}

// Violations: a misaligned row address; a lane that left before the
// collective; a tile read by ldmatrix before its cp.async was waited for;
// read after another thread's copy without a barrier; a row past the
// dynamic shared memory. (Mode 5: no violation, a bank-conflicted pattern.)
__global__ void ldsm_bad(int mode) {
    extern __shared__ __align__(16) uint16_t tile[];
    const int lane = threadIdx.x;
    uint32_t base = (uint32_t)__cvta_generic_to_shared(tile);
    uint32_t r[4];
    if (mode == 0) {
        fp_emu::ldmatrix_x4(r, base + 16 * lane + (lane == 7 ? 8 : 0), false);
    } else if (mode == 1) {
        if (lane == 3) return;
        fp_emu::ldmatrix_x4(r, base + 16 * lane, false);
    } else if (mode == 5) {
        fp_emu::ldmatrix_x4(r, base + 128 * lane, false);  // every row in bank group 0
    } else if (mode == 4) {
        fp_emu::ldmatrix_x4(r, base + 16 * lane + 16, false);  // lane 31's row past the arena
    } else {
        static const uint16_t src[8 * 32] = {0};
        fp_emu::cp_async(base + 16 * lane, src + 8 * lane, 16, 16);
        fp_emu::cp_async_commit();
        if (mode == 3) fp_emu::cp_async_wait_group(0);  // waited, but no barrier: the rows of other lanes
        fp_emu::ldmatrix_x4(r, base + 16 * lane, mode == 3);
    }
}
__global__ void mma_divergent(float *out) {
    float c[4] = {0, 0, 0, 0};
    const uint32_t a[4] = {0, 0, 0, 0};
    if (threadIdx.x < 16) fp_emu::mma_m16n8k16(c, a, 0, 0, true);
    else __syncwarp();
    out[threadIdx.x] = c[0];
}

__global__ void ex2_kernel(const float *x, float *y, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = fp_emu::ex2_approx_ftz(x[i]);
}

int main() {
    // ldmatrix: element x of the row handed by lane l is 100 * l + x.
    {
        std::vector<uint16_t> rows(32 * 8);
        for (int l = 0; l < 32; ++l)
            for (int x = 0; x < 8; ++x) rows[l * 8 + x] = (uint16_t)(100 * l + x);
        std::vector<uint32_t> out(128);
        auto reg = [&](int lane, int i, uint16_t lo, uint16_t hi) { return out[lane * 4 + i] == (lo | ((uint32_t)hi << 16)); };
        ldsm_regs<<<1, 32, 32 * 16>>>(rows.data(), out.data(), 0);
        EXPECT(cudaGetLastError() == cudaSuccess);
        // PTX ISA, ldmatrix fragment figure: lane l holds row l / 4, elements
        // 2 (l % 4), +1 of each matrix; matrix i's rows from lanes 8i..8i+7.
        EXPECT(reg(0, 0, 0, 1));
        EXPECT(reg(5, 0, 100 + 2, 100 + 3));          // row 1, elements 2, 3
        EXPECT(reg(31, 3, 3100 + 6, 3100 + 7));       // matrix 3 row 7 = lane 31's row
        EXPECT(reg(14, 2, 1900 + 4, 1900 + 5));       // matrix 2 row 3 = lane 19's row
        ldsm_regs<<<1, 32, 32 * 16>>>(rows.data(), out.data(), 1);
        EXPECT(cudaGetLastError() == cudaSuccess);
        // .trans: lane l holds element l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1
        EXPECT(reg(0, 0, 0, 100));
        EXPECT(reg(5, 0, 200 + 1, 300 + 1));          // rows 2, 3, element 1
        EXPECT(reg(31, 3, 3000 + 7, 3100 + 7));       // matrix 3 rows 6, 7 (lanes 30, 31), element 7
        EXPECT(reg(9, 1, 1000 + 2, 1100 + 2));        // matrix 1 rows 2, 3 (lanes 10, 11), element 2
        EXPECT(fp_emu::g_ldmatrix_conflicts == 0);    // 8 rows of a phase 16 bytes apart (scrambled)
    }
    // mma through ldmatrix, both B paths, f16 and bf16, C accumulated.
    for (int bf16 = 0; bf16 < 2; ++bf16)
        for (int path = 0; path < 2; ++path) {
            float A[16][16], B[16][8], C[16][8];
            std::vector<uint16_t> a(256), b(128);
            for (int i = 0; i < 16; ++i)
                for (int k = 0; k < 16; ++k) {
                    A[i][k] = (float)((i * 7 + k * 3) % 11 - 5) * 0.5f;
                    a[i * 16 + k] = to_b16(A[i][k], bf16);
                }
            for (int k = 0; k < 16; ++k)
                for (int n = 0; n < 8; ++n) {
                    B[k][n] = (float)((k * 5 + n * 11) % 9 - 4);
                    // path 0: B^T [n][k]; path 1: B [k][n]
                    b[path ? k * 8 + n : n * 16 + k] = to_b16(B[k][n], bf16);
                }
            std::vector<float> cin(128), cout(128, NAN);
            for (int i = 0; i < 16; ++i)
                for (int n = 0; n < 8; ++n) C[i][n] = cin[i * 8 + n] = (float)(i - n) * 0.25f;
            gemm16x8<<<1, 32, 384 * 2>>>(a.data(), b.data(), cin.data(), cout.data(), path, bf16);
            EXPECT(cudaGetLastError() == cudaSuccess);
            bool ok = true;
            for (int i = 0; i < 16; ++i)
                for (int n = 0; n < 8; ++n) {
                    double want = C[i][n];
                    for (int k = 0; k < 16; ++k) want += (double)A[i][k] * B[k][n];
                    ok &= cout[i * 8 + n] == (float)want;
                }
            if (!ok) fprintf(stderr, "  gemm16x8 %s, B %s: wrong\n", bf16 ? "bf16" : "f16", path ? "ldmatrix.trans" : "ldmatrix");
            EXPECT(ok);
        }
    // f16 subnormals and values above bf16's reach convert exactly.
    {
        EXPECT(fp_sm80::b16_to_f32(0x0001, false) == std::ldexp(1.0f, -24));
        EXPECT(fp_sm80::b16_to_f32(0x03ff, false) == std::ldexp(1023.0f, -24));
        EXPECT(fp_sm80::b16_to_f32(0x7bff, false) == 65504.0f);
        EXPECT(fp_sm80::b16_to_f32(0xfc00, false) == -INFINITY);
        EXPECT(std::isnan(fp_sm80::b16_to_f32(0x7e00, false)));
        EXPECT(fp_sm80::b16_to_f32(0x3f80, true) == 1.0f);
        EXPECT(fp_sm80::b16_to_f32(0xc040, true) == -3.0f);
    }
    // ex2.approx.ftz
    {
        const float x[] = {0.0f, 3.0f, -1.0f, -126.0f, -127.0f, -INFINITY, NAN, 1e-40f};
        std::vector<float> y(8, -1.0f);
        ex2_kernel<<<1, 32>>>(x, y.data(), 8);
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT(y[0] == 1.0f && y[1] == 8.0f && y[2] == 0.5f);
        EXPECT(y[3] == std::ldexp(1.0f, -126));
        EXPECT(y[4] == 0.0f && y[5] == 0.0f);  // subnormal results flush
        EXPECT(std::isnan(y[6]));
        EXPECT(y[7] == 1.0f);                  // subnormal input reads as 0
    }
    // Bank conflicts: rows 128 bytes apart all hit one bank group.
    {
        fp_emu::g_ldmatrix_conflicts = 0;
        ldsm_bad<<<1, 32, 32 * 128>>>(5);
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT(fp_emu::g_ldmatrix_conflicts == 4);
        fp_emu::g_ldmatrix_conflicts = 0;
    }
    // Violations.
    {
        ldsm_bad<<<1, 32, 32 * 16>>>(0);
        EXPECT(failed_with(cudaGetLastError(), "not 16-byte aligned"));
        ldsm_bad<<<1, 32, 32 * 16>>>(1);
        EXPECT(failed_with(cudaGetLastError(), "has exited"));
        ldsm_bad<<<1, 32, 32 * 16>>>(2);
        EXPECT(failed_with(cudaGetLastError(), "in flight"));
        ldsm_bad<<<1, 32, 32 * 16>>>(3);
        EXPECT(failed_with(cudaGetLastError(), "without a barrier"));
        std::vector<float> out(32);
        mma_divergent<<<1, 32>>>(out.data());
        EXPECT(failed_with(cudaGetLastError(), "met lane"));
        ldsm_bad<<<1, 32, 32 * 16>>>(4);
        EXPECT(failed_with(cudaGetLastError(), "outside"));
    }
    // Emulated device allocations (split-KV partials): NaN-filled, and a
    // write past the end fails the free.
    {
        float *p = nullptr;
        EXPECT(cudaMallocAsync(reinterpret_cast<void **>(&p), 40, 0) == cudaSuccess);
        EXPECT(p && std::isnan(p[0]) && std::isnan(p[9]) && (uintptr_t)p % 256 == 0);
        EXPECT(cudaFreeAsync(p, 0) == cudaSuccess);
        EXPECT(cudaMallocAsync(reinterpret_cast<void **>(&p), 40, 0) == cudaSuccess);
        p[10] = 1.0f;
        EXPECT(failed_with(cudaFreeAsync(p, 0), "guard bytes after"));
    }
    return emu_test_end("test_emu_sm80");
}
