// Self-test of the emulated Hopper instructions (emu_sm90.h) on known
// matrices: wgmma with both operands from shared memory (K-major, 128-byte
// swizzle) and with A from registers and B MN-major, checked element by
// element against a double-precision product; and the asynchronous rules
// that must show in a kernel's results or fail its launch (reading
// accumulators before the wait, operands overwritten before the wait, async
// copies over operands in flight, a missing wgmma.fence, a warp missing from
// the warpgroup, wait_group N leaving the newest N in flight; a cp.async
// over retired operands ordered by its own warpgroup's wait, not by
// another's); a TMA box
// through the emulated cuTensorMapEncodeTiled (swizzle, out-of-bounds
// zeros) on an mbarrier, a named barrier, and the broken variants; a TMA
// store (clipped at the tensor's bounds, deferred to the bulk group's wait)
// and its broken variants (no proxy fence, no wait, no commit, the source
// rewritten before the wait); stmatrix.x4's layout; the
// checked build's watchdog (kernels/attention/kernel_watchdog.cuh) on a
// wait nobody ends.
// The shared-memory placement below is written from the swizzle's
// definition as 16-byte chunk c of row r stored at chunk c ^ (r % 8) of a
// 128-byte row (1024-byte aligned atoms), independently of sm90_isa.h's
// address formulas.
#include <cuda_runtime.h>

#include "emu_test.h"

#include "emu_cp_async.h"
#include "emu_sm90.h"
#ifndef FP_KERNEL_WATCHDOG // the checked build's helpers, in every build of this test
#define FP_KERNEL_WATCHDOG 1
#endif
#include "attention/kernel_watchdog.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

// Byte offset of element (r, x) in a tile of rows of 64 16-bit elements
// (128 bytes), swizzled.
static __device__ uint32_t sw_off(int r, int x) { return (uint32_t)(r * 128 + (((x / 8) ^ (r % 8)) * 16) + (x % 8) * 2); }
static __device__ uint64_t desc(uint32_t start, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)(start >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}
static __device__ uint16_t to_bf16(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return (uint16_t)(b >> 16); // exact for the test's values
}
// D register i of lane / warp (the figure of m64nNk16's accumulator).
static __device__ int d_row(int warp, int lane, int i) { return warp * 16 + lane / 4 + ((i & 2) ? 8 : 0); }
static __device__ int d_col(int lane, int i) { return (i / 4) * 8 + (lane % 4) * 2 + (i & 1); }

// Values: small integers / 8 (exact in bf16 and in the f32 sums).
static float a_val(int m, int k) { return (float)((m * 7 + k * 3) % 11 - 5) / 8.0f; }
static float b_val(int k, int n) { return (float)((k * 5 + n * 3) % 13 - 6) / 8.0f; }
static float c_val(int m, int n) { return (float)((m + 2 * n) % 9 - 4); }

enum Mode {
    SS = 0,          // D = C + A B, A and B K-major from shared memory, K = 32 (two wgmmas in one group)
    RS = 1,          // A from registers, B MN-major (N = 128: two 64-column blocks at LBO), K = 16
    READ_EARLY = 2,  // SS, accumulators read before the wait: NaN
    OVERWRITE = 3,   // SS, B zeroed (plain stores, barrier) after issue, before the wait: D = C
    CP_OVER = 4,     // SS, a cp.async issued over B before the wait: fails
    NO_FENCE = 5,    // SS without wgmma.fence: fails
    WARP_OUT = 6,    // warp 3 skips the wgmma: fails
    WAIT1 = 7,       // two groups (SS into d, SS into e), wait_group 1: d done, e still in flight (NaN)
    WRITE_ACC = 8,   // SS, then d written before the wait: fails
    NO_PROXY_FENCE = 9, // B partly rewritten by cp.async (generic proxy), waited, barrier, no fence.proxy.async: fails
    PROXY_FENCE = 10,   // the same with the writers' fence.proxy.async: runs
    EXIT_IN_FLIGHT = 11, // SS issued and committed, never waited: fails at exit
    CP_AFTER_WAIT = 12,  // SS, waited, then one thread's cp.async over B (read by the whole warpgroup's
                         // wgmma), no __syncthreads: runs (the retire is the warpgroup's)
    CP_OTHER_WG = 13,    // 256 threads: the same cp.async by a thread of warpgroup 1 (after a named
                         // barrier with warpgroup 0): fails (warpgroup 0's retire does not order it)
};

// One warpgroup. smem: A at 0 (64 rows x 64 elements, K-major; k < 32
// used), B at 8192: K-major 128 rows (n) x 64 (k), or MN-major [2 blocks
// of 64 n][16 k rows], LBO 2048.
__global__ void wgmma_kernel(const float *bsrc, float *out, int mode) {
    extern __shared__ __align__(1024) unsigned char sm[];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t a_s = base, b_s = base + 8192;
    for (int idx = tid; idx < 64 * 64; idx += 128) { // A (m, k)
        const int m = idx / 64, k = idx % 64;
        const uint16_t v = to_bf16(a_val(m, k));
        std::memcpy(sm + sw_off(m, k), &v, 2);
    }
    if (mode == RS) {
        for (int idx = tid; idx < 16 * 128; idx += 128) { // B (k, n), MN-major
            const int k = idx / 128, n = idx % 128;
            const uint16_t v = to_bf16(b_val(k, n));
            std::memcpy(sm + 8192 + (n / 64) * 2048 + sw_off(k, n % 64), &v, 2);
        }
    } else {
        for (int idx = tid; idx < 128 * 64; idx += 128) { // B^T (n, k), K-major
            const int n = idx / 64, k = idx % 64;
            const uint16_t v = to_bf16(b_val(k, n));
            std::memcpy(sm + 8192 + sw_off(n, k), &v, 2);
        }
    }
    __syncthreads();
    if (tid >= 128) { // CP_OTHER_WG's second warpgroup
        if (warp == 4) {
            fp_emu::named_barrier_sync(1, 160); // after warpgroup 0's wait
            if (lane == 0) {
                fp_emu::cp_async(b_s, bsrc, 16, 16);
                fp_emu::cp_async_wait_all();
            }
        }
        return;
    }
    if (mode == NO_PROXY_FENCE || mode == PROXY_FENCE) {
        fp_emu::cp_async(b_s + 16 * tid, bsrc, 16, 16);
        fp_emu::cp_async_wait_all();
        if (mode == PROXY_FENCE) fp_emu::fence_proxy_async();
        __syncthreads();
    }
    float d[64], e[64];
    for (int i = 0; i < 64; ++i) d[i] = e[i] = c_val(d_row(warp, lane, i), d_col(lane, i));
    uint32_t a[4];
    if (mode == RS) {
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < 4; ++r) {
            const int row = warp * 16 + g + ((r & 1) ? 8 : 0), col = 2 * t + ((r & 2) ? 8 : 0);
            a[r] = (uint32_t)to_bf16(a_val(row, col)) | ((uint32_t)to_bf16(a_val(row, col + 1)) << 16);
        }
    }
    if (mode != NO_FENCE) fp_emu::wgmma_fence();
    if (mode == WARP_OUT && warp == 3) return;
    if (mode == RS) {
        fp_emu::wgmma_mma_async(d, 128, fp_emu::WGMMA_BF16, 0, a, 0, desc(b_s, 2048, 1024), 1, "test.rs");
    } else {
        for (int kk = 0; kk < 2; ++kk) // k 0..15, 16..31: the start moves 32 bytes inside the swizzled row
            fp_emu::wgmma_mma_async(d, 128, fp_emu::WGMMA_BF16, desc(a_s + 32 * kk, 16, 1024), nullptr, 0,
                                    desc(b_s + 32 * kk, 16, 1024), 0, "test.ss");
    }
    fp_emu::wgmma_commit_group();
    if (mode == WAIT1) {
        fp_emu::wgmma_fence();
        fp_emu::wgmma_mma_async(e, 128, fp_emu::WGMMA_BF16, desc(a_s, 16, 1024), nullptr, 0, desc(b_s, 16, 1024), 0,
                                "test.ss");
        fp_emu::wgmma_commit_group();
        fp_emu::wgmma_wait_group(1);
        for (int i = 0; i < 64; ++i) out[64 * 64 * 2 + tid * 64 + i] = e[i];
    }
    if (mode == READ_EARLY) out[64 * 128 + tid] = d[5];
    if (mode == WRITE_ACC) d[3] = 0.0f;
    if (mode == OVERWRITE) {
        for (int idx = tid; idx < 128 * 64; idx += 128) std::memset(sm + 8192 + idx * 2, 0, 2);
        __syncthreads();
    }
    if (mode == EXIT_IN_FLIGHT) return;
    if (mode == CP_OVER) {
        fp_emu::cp_async(b_s + 16 * tid, bsrc, 16, 16);
        fp_emu::cp_async_commit();
    }
    fp_emu::wgmma_wait_group(0);
    if (mode == CP_AFTER_WAIT && tid == 5) { // over B's first 16 bytes, which other threads' wgmma parts read
        fp_emu::cp_async(b_s, bsrc, 16, 16);
        fp_emu::cp_async_wait_all();
    }
    if (mode == CP_OTHER_WG) fp_emu::named_barrier_arrive(1, 160);
    for (int i = 0; i < 64; ++i) out[d_row(warp, lane, i) * 128 + d_col(lane, i)] = d[i];
}

// mbarrier + TMA + named barriers: thread 0 loads a 3-D box (64 x 8 x 2
// elements of a 64 x 5 x 3 tensor at (0, 2, 1): rows 5.. out of bounds,
// zero) with the 128-byte swizzle on a barrier; threads 32..63 wait and
// copy the box out (un-swizzling by the definition); a named barrier
// orders a second copy-out by warp 2. Modes break one rule each.
enum TmaMode {
    TMA_OK = 0,
    TMA_NO_WAIT = 1,    // the consumers read without waiting: bytes in flight
    TMA_EXTRA_COPY = 2, // a second box on the barrier, not announced by expect_tx
    TMA_EXTRA_ARRIVE = 3, // two arrivals on a barrier of count 1
    TMA_NAMED_SHORT = 4,  // the named barrier counts 96 threads, 64 arrive
    TMA_UNUSED = 5,       // nobody waits for the copy: fails when the block ends
    TMA_NAMED_DANGLING = 6, // warp 1 also bar.arrive's on barrier 2, nobody syncs: a phase left begun
};
__global__ void tma_kernel(const CUtensorMap *map_in, uint16_t *out, int mode) {
    extern __shared__ __align__(1024) unsigned char sm[];
    const CUtensorMap map = *map_in;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t box = base + 1024, bar = base;
    const int tid = threadIdx.x;
    const uint32_t bytes = 64 * 8 * 2 * 2;
    if (tid == 0) fp_emu::mbarrier_init(bar, 1);
    __syncthreads();
    if (tid == 0) {
        fp_emu::mbarrier_arrive(bar, bytes);
        if (mode == TMA_EXTRA_ARRIVE) fp_emu::mbarrier_arrive(bar);
        const int c[3] = {0, 2, 1};
        fp_emu::tma_load_tiled(box, &map, 3, c, bar);
        if (mode == TMA_EXTRA_COPY) fp_emu::tma_load_tiled(box + 4096, &map, 3, c, bar);
    } else if (mode == TMA_UNUSED) {
        return;
    } else if (tid >= 32 && tid < 64) {
        if (mode != TMA_NO_WAIT)
            while (!fp_emu::mbarrier_try_wait_parity(bar, 0)) {
            }
        for (int e = tid - 32; e < 64 * 8 * 2; e += 32) {
            const int x = e % 64, r = e / 64; // row r of 16 (y + 8 z)
            const uint32_t a = (uint32_t)(r * 128 + (((x / 8) ^ (r % 8)) * 16) + (x % 8) * 2);
            fp_emu::smem_note_read(box + a, 2);
            std::memcpy(&out[e], sm + 1024 + a, 2);
        }
        fp_emu::named_barrier_sync(1, mode == TMA_NAMED_SHORT ? 96 : 64);
        if (mode == TMA_NAMED_DANGLING) fp_emu::named_barrier_arrive(2, 64);
    } else if (tid >= 64 && tid < 96) {
        fp_emu::named_barrier_sync(1, mode == TMA_NAMED_SHORT ? 96 : 64);
        for (int e = tid - 64; e < 64 * 8 * 2; e += 32) out[1024 + e] = out[e];
    }
}

// stmatrix.x4 (one warp): lane l's register i holds (l << 8 | i) in its
// low half and (l << 8 | i | 0x80) in its high one; matrix i's rows are 16
// bytes at a 128-byte pitch from row 0 of the buffer, row r of matrix i at
// 128 i + 16 r (lane 8 i + r's address). TMA store (mode >= 1, 64 threads):
// the box (64, 8, 2) of a (64, 5, 3) bf16 tensor at (0, 2, 1), element e
// (x = e % 64, y = e / 64 % 8, z = e / 512) holding e + 1, written swizzled
// by the 64 threads, then fenced, published, stored by thread 0.
enum StoreMode {
    STSM = 0,
    STORE_OK,
    STORE_NO_FENCE,   // the writers and the issuer skip fence.proxy.async
    STORE_NO_WAIT,    // thread 0 exits without cp.async.bulk.wait_group.read
    STORE_UNCOMMITTED, // ... and without the commit
    STORE_REWRITE,    // thread 0 rewrites a source byte between the commit and the wait
};
__global__ void store_kernel(const CUtensorMap *map_in, uint16_t *out, int mode) {
    extern __shared__ __align__(1024) unsigned char sm[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(sm) + 1024;
    const int tid = threadIdx.x;
    if (mode == STSM) {
        uint32_t r[4];
        for (int i = 0; i < 4; ++i) r[i] = (uint32_t)(tid << 8 | i) | (uint32_t)(tid << 8 | i | 0x80) << 16;
        fp_emu::stmatrix_x4(base + 128 * (tid / 8) + 16 * (tid % 8), r);
        __syncwarp();
        if (tid == 0) std::memcpy(out, fp_emu::smem_at(base, 512), 512);
        return;
    }
    const CUtensorMap map = *map_in;
    for (int e = tid; e < 1024; e += 64) {
        const int x = e % 64, r = e / 64; // row r of 16 (y + 8 z)
        const uint32_t a = base + (uint32_t)(r * 128 + (((x / 8) ^ (r % 8)) * 16) + (x % 8) * 2);
        const uint16_t v = (uint16_t)(e + 1);
        fp_emu::smem_note_store(a, 2);
        std::memcpy(fp_emu::smem_at(a, 2), &v, 2);
    }
    if (mode != STORE_NO_FENCE) fp_emu::fence_proxy_async();
    __syncthreads();
    if (tid != 0) return;
    const int c[3] = {0, 2, 1};
    fp_emu::tma_store_tiled(&map, 3, c, base);
    if (mode == STORE_UNCOMMITTED) return;
    fp_emu::bulk_commit_group();
    if (mode == STORE_REWRITE) fp_emu::smem_note_store(base + 64, 2);
    if (mode != STORE_NO_WAIT) fp_emu::bulk_wait_group(0);
}

static void run(int mode, std::vector<float> &out, cudaError_t *err) {
    std::vector<float> bsrc(64, 1.0f);
    out.assign(64 * 128 * 2 + 128 * 64, -7.0f);
    wgmma_kernel<<<1, mode == CP_OTHER_WG ? 256 : 128, 8192 + 16384>>>(bsrc.data(), out.data(), mode);
    *err = cudaGetLastError();
}

// D = C + A B over k < K (K = 0: D = C).
static long check(const std::vector<float> &out, int K, const char *what) {
    long bad = 0;
    for (int m = 0; m < 64; ++m)
        for (int n = 0; n < 128; ++n) {
            double want = c_val(m, n);
            for (int k = 0; k < K; ++k) want += (double)a_val(m, k) * b_val(k, n);
            if (out[m * 128 + n] != (float)want) {
                if (bad < 3) fprintf(stderr, "%s: D[%d][%d] = %g, want %g\n", what, m, n, out[m * 128 + n], want);
                bad++;
            }
        }
    return bad;
}

// The watchdog on an mbarrier wait (as v5's mbar_wait in the checked
// build): the barrier expects 2 arrivals, 1 comes (`arrivals` 1) and the
// waiters' deadline of `budget` emulated cycles must end the launch with the
// watchdog's line, before the emulation's own deadlock detection; with both
// arrivals (after the waiters started polling) nothing fires.
__global__ void watchdog_kernel(int arrivals, long long budget) {
    extern __shared__ __align__(1024) unsigned char sm[];
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(sm);
    if (threadIdx.x == 0) fp_emu::mbarrier_init(bar, 2);
    __syncthreads();
    if (threadIdx.x < (unsigned)arrivals) {
        for (int i = 0; i < 100; ++i) fp_emu::spin_yield("watchdog_kernel: later"); // after the waiters' first polls
        fp_emu::mbarrier_arrive(bar);
        return;
    }
    fp_watchdog::deadline dl;
    while (!fp_emu::mbarrier_try_wait_parity(bar, 0))
        if (dl.poll(budget)) fp_watchdog::expired("watchdog_kernel mbarrier", "bar", 0, 0, dl.waited);
}

int main() {
    // the checked build's watchdog (its deadline: 2^32 cycles; here 2^20, ~0.5 ms emulated)
    watchdog_kernel<<<1, 64, 1024>>>(1, 1ll << 20);
    EXPECT(failed_with(cudaGetLastError(), "fastpath watchdog: watchdog_kernel mbarrier bar[0] parity 0 not completed"));
    watchdog_kernel<<<1, 64, 1024>>>(2, fp_watchdog::kCycles);
    EXPECT(cudaGetLastError() == cudaSuccess);
    std::vector<float> out;
    cudaError_t e;
    run(SS, out, &e);
    EXPECT(e == cudaSuccess);
    EXPECT(check(out, 32, "SS") == 0);
    run(RS, out, &e);
    EXPECT(e == cudaSuccess);
    EXPECT(check(out, 16, "RS") == 0);
    run(READ_EARLY, out, &e);
    EXPECT(e == cudaSuccess);
    {
        bool nan = true;
        for (int t = 0; t < 128; ++t) nan &= std::isnan(out[64 * 128 + t]);
        EXPECT(nan);
        EXPECT(check(out, 32, "READ_EARLY") == 0);
    }
    run(OVERWRITE, out, &e);
    EXPECT(e == cudaSuccess);
    EXPECT(check(out, 0, "OVERWRITE") == 0); // the wgmma read B at the wait: zeros
    run(CP_OVER, out, &e);
    EXPECT(failed_with(e, "not yet retired"));
    run(NO_FENCE, out, &e);
    EXPECT(failed_with(e, "without a wgmma.fence"));
    run(WARP_OUT, out, &e);
    EXPECT(failed_with(e, "has exited"));
    run(WAIT1, out, &e);
    EXPECT(e == cudaSuccess);
    {
        EXPECT(check(out, 32, "WAIT1") == 0);
        bool nan = true; // e: still in flight after wait_group 1
        for (int i = 0; i < 128 * 64; ++i) nan &= std::isnan(out[64 * 64 * 2 + i]);
        EXPECT(nan);
    }
    run(WRITE_ACC, out, &e);
    EXPECT(failed_with(e, "written while a wgmma"));
    run(NO_PROXY_FENCE, out, &e);
    EXPECT(failed_with(e, "no fence.proxy.async"));
    run(PROXY_FENCE, out, &e);
    EXPECT(e == cudaSuccess);
    run(EXIT_IN_FLIGHT, out, &e);
    EXPECT(failed_with(e, "not retired"));
    run(CP_AFTER_WAIT, out, &e);
    EXPECT(e == cudaSuccess);
    EXPECT(check(out, 32, "CP_AFTER_WAIT") == 0);
    run(CP_OTHER_WG, out, &e);
    EXPECT(failed_with(e, "a wgmma of warpgroup 0 read"));
    // TMA through the driver entry point the launchers use.
    {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        EXPECT(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                   cudaSuccess &&
               q == cudaDriverEntryPointSuccess && fn);
        auto enc = reinterpret_cast<CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                                 const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                                 const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill)>(fn);
        // tensor (64, 5, 3), rows padded to 72 elements, planes of 6 rows
        std::vector<uint16_t> g(72 * 6 * 3);
        for (size_t i = 0; i < g.size(); ++i) g[i] = (uint16_t)(i + 1);
        const cuuint64_t dims[3] = {64, 5, 3}, strides[2] = {72 * 2, 72 * 6 * 2};
        const cuuint32_t boxd[3] = {64, 8, 2}, estr[3] = {1, 1, 1};
        CUtensorMap map;
        EXPECT(enc(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, g.data(), dims, strides, boxd, estr,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
        const cuuint64_t bad_strides[2] = {72 * 2 + 2, 72 * 6 * 2};
        CUtensorMap bad;
        EXPECT(enc(&bad, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, g.data(), dims, bad_strides, boxd, estr,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS);
        std::vector<uint16_t> o(2048, 0xEEEE);
        tma_kernel<<<1, 96, 1024 + 4096>>>(&map, o.data(), TMA_OK);
        EXPECT(cudaGetLastError() == cudaSuccess);
        long bad_el = 0;
        for (int e = 0; e < 1024; ++e) {
            const int x = e % 64, y = e / 64 % 8, z = e / 512;
            const int gy = 2 + y, gz = 1 + z;
            const uint16_t want = gy < 5 && gz < 3 ? g[(size_t)(gz * 6 + gy) * 72 + x] : 0;
            bad_el += o[e] != want || o[1024 + e] != want;
        }
        EXPECT(bad_el == 0);
        tma_kernel<<<1, 96, 1024 + 4096>>>(&map, o.data(), TMA_NO_WAIT);
        EXPECT(failed_with(cudaGetLastError(), "in flight"));
        tma_kernel<<<1, 96, 1024 + 8192>>>(&map, o.data(), TMA_EXTRA_COPY);
        EXPECT(failed_with(cudaGetLastError(), "expect_tx and the copies disagree"));
        tma_kernel<<<1, 96, 1024 + 4096>>>(&map, o.data(), TMA_EXTRA_ARRIVE);
        EXPECT(failed_with(cudaGetLastError(), "more arrivals than its count"));
        tma_kernel<<<1, 96, 1024 + 4096>>>(&map, o.data(), TMA_NAMED_SHORT);
        EXPECT(failed_with(cudaGetLastError(), "deadlock"));
        tma_kernel<<<1, 96, 1024 + 4096>>>(&map, o.data(), TMA_UNUSED);
        EXPECT(failed_with(cudaGetLastError(), "never waited for"));
        tma_kernel<<<1, 96, 1024 + 4096>>>(&map, o.data(), TMA_NAMED_DANGLING);
        EXPECT(failed_with(cudaGetLastError(), "named barrier 2 left with 32 of 64 threads arrived"));
        // the store direction into a copy of g: the box's in-bounds elements
        // (y < 3) written, every other element (and the row pads) untouched
        std::vector<uint16_t> g2(g.size(), 0xEEEE);
        CUtensorMap smap;
        EXPECT(enc(&smap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, g2.data(), dims, strides, boxd, estr,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS);
        const long stores = fp_emu::g_tma_stores.load();
        store_kernel<<<1, 64, 1024 + 2048>>>(&smap, nullptr, STORE_OK);
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT(fp_emu::g_tma_stores.load() == stores + 1);
        long bad_st = 0;
        for (size_t i = 0; i < g2.size(); ++i) {
            const int x = (int)(i % 72), gy = (int)(i / 72 % 6), gz = (int)(i / (72 * 6));
            const int y = gy - 2, z = gz - 1;
            const bool in = x < 64 && y >= 0 && y < 3 && z >= 0 && gy < 5;
            bad_st += g2[i] != (in ? (uint16_t)(x + 64 * (y + 8 * z) + 1) : 0xEEEE);
        }
        EXPECT(bad_st == 0);
        store_kernel<<<1, 64, 1024 + 2048>>>(&smap, nullptr, STORE_NO_FENCE);
        EXPECT(failed_with(cudaGetLastError(), "no fence.proxy.async"));
        store_kernel<<<1, 64, 1024 + 2048>>>(&smap, nullptr, STORE_NO_WAIT);
        EXPECT(failed_with(cudaGetLastError(), "not waited for"));
        store_kernel<<<1, 64, 1024 + 2048>>>(&smap, nullptr, STORE_UNCOMMITTED);
        EXPECT(failed_with(cudaGetLastError(), "never committed"));
        store_kernel<<<1, 64, 1024 + 2048>>>(&smap, nullptr, STORE_REWRITE);
        EXPECT(failed_with(cudaGetLastError(), "a bulk store not yet waited for"));
    }
    // stmatrix.x4: the inverse of ldmatrix's fragment layout
    {
        std::vector<uint16_t> m(256, 0);
        store_kernel<<<1, 32, 1024 + 512>>>(nullptr, m.data(), STSM);
        EXPECT(cudaGetLastError() == cudaSuccess);
        long bad_m = 0;
        for (int i = 0; i < 4; ++i)
            for (int r = 0; r < 8; ++r)
                for (int col = 0; col < 8; ++col) {
                    const int src = 4 * r + col / 2; // the lane holding (r, col) of every matrix
                    const uint16_t want = (uint16_t)(src << 8 | i | (col % 2 ? 0x80 : 0));
                    bad_m += m[64 * i + 8 * r + col] != want;
                }
        EXPECT(bad_m == 0);
    }
    return emu_test_end("test_emu_sm90");
}
