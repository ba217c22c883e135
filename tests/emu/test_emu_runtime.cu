// Self-test of the CUDA emulation (cuda_emu.h): this file is CUDA C++ that
// cu2emu.py rewrites and the host compiler builds, as the kernels are.
// Each kernel has a known answer or a known rule violation that the
// emulation must report (a broken emulation must fail here, not pass the
// kernels' tests by accident).
#include <cuda_runtime.h>

#include "common/grid_count.cuh"
#include "common/pdl.cuh"
#include "emu_cp_async.h"
#include "emu_test.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// Block sum through shuffles and shared memory; writes one value per block.
__global__ void block_sum(const float *x, float *out, int n) {
    __shared__ float part[32];
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) out[blockIdx.x] = t;
    }
}

// Reverses each block's segment through dynamic shared memory: wrong without
// the barrier's ordering (a thread reads a slot another thread writes).
__global__ void reverse_dyn(const int *in, int *out) {
    extern __shared__ __align__(16) int buf[];
    const int base = blockIdx.x * blockDim.x;
    buf[threadIdx.x] = in[base + threadIdx.x];
    __syncthreads();
    out[base + threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

// 2-D blocks, shfl_sync broadcast within 8-lane segments, shfl_down/up, ballot.
__global__ void lanes(int *out) {
    const int t = threadIdx.x + threadIdx.y * blockDim.x;
    int lane = t & 31;
    int b = __shfl_sync(0xffffffffu, lane * 10, 3, 8);  // lane 3 of each 8-lane segment
    int d = __shfl_down_sync(0xffffffffu, lane, 1);
    int u = __shfl_up_sync(0xffffffffu, lane, 2);
    unsigned bal = __ballot_sync(0xffffffffu, lane & 1);
    out[4 * t + 0] = b;
    out[4 * t + 1] = d;
    out[4 * t + 2] = u;
    out[4 * t + 3] = (int)bal;
}

// Two sums through one shared buffer, one barrier each: the second round's
// write may overtake a read of the first (a race). Right (9 everywhere)
// while the warps move in lock step, wrong for warp 1 (10) once warp 0 runs
// ahead to its next write (FP_EMU_GREEDY).
__global__ void early_reuse(int *out) {
    __shared__ int part[2];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int total = 0;
    for (int r = 0; r < 2; ++r) {
        const int v = __shfl_sync(0xffffffffu, (r + 1) * (w + 1), 0);
        if (lane == 0) part[w] = v;
        __syncthreads();
        total += part[0] + part[1];
    }
    out[threadIdx.x] = total;
}

// __launch_bounds__ (cu2emu.py moves it into the body as a check).
template <int N>
__global__ void __launch_bounds__(N * 32, 1)
    bounded(int *out) {
    out[threadIdx.x] = N;
}

// Rule violations the emulation must catch.
__global__ void divergent_barrier(int *out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void shuffle_after_exit(int *out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}
__global__ void mixed_collectives(int *out) {
    int v = threadIdx.x;
    if (threadIdx.x < 32) v = __shfl_xor_sync(0xffffffffu, v, 1);
    else __syncthreads();
    out[threadIdx.x] = v;
}
__global__ void poisoned_read(float *out) {
    extern __shared__ float fbuf[];
    if (threadIdx.x == 0) fbuf[0] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = fbuf[threadIdx.x];  // fbuf[1..]: never written
}
__global__ void async_race(int *out) {
    extern __shared__ unsigned char raw[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(raw);
    // Thread 0 "copies" 16 bytes; thread 1 reads them without a barrier.
    if (threadIdx.x == 0) {
        fp_emu::smem_note_async_issue(base, 16);
        std::memset(fp_emu::smem_at(base, 16), 0, 16);
        fp_emu::smem_note_async_complete(base, 16);
    }
    __syncwarp();
    if (threadIdx.x == 1) fp_emu::smem_note_read(base, 16);
    out[threadIdx.x] = 0;
}
__global__ void async_ok(int *out) {
    extern __shared__ unsigned char raw[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(raw);
    if (threadIdx.x == 0) {
        fp_emu::smem_note_async_issue(base, 16);
        std::memset(fp_emu::smem_at(base, 16), 0, 16);
        fp_emu::smem_note_async_complete(base, 16);
    }
    __syncthreads();
    fp_emu::smem_note_read(base, 16);
    out[threadIdx.x] = 0;
}

// A warpgroup collective (threads 128k..128k+127 exchange their ids), a
// spin-wait on a shared flag another warp sets later, per-thread state.
struct Counter {
    int n = 0;
};
__global__ void groups(int *out) {
    __shared__ int flag;
    const unsigned t = threadIdx.x, first = t / 128 * 128;
    if (t == 0) flag = 0;
    __syncthreads();
    int mine = (int)t * 7;
    const unsigned char *s = fp_emu::group_exchange(first, 128, &mine, sizeof mine, "test.group");
    int other;
    std::memcpy(&other, s + (127 - (t - first)) * fp_emu::kSlotBytes, sizeof other);
    out[t] = other;
    fp_emu::thread_state<Counter>().n += 1;
    fp_emu::thread_state<Counter>().n += 1;
    if (t == 255) {
        flag = 1;
        fp_emu::note_progress();
    } else if (t == 0) {
        while (flag == 0) fp_emu::spin_yield("test.spin");
    }
    out[256 + t] = fp_emu::thread_state<Counter>().n;
}
__global__ void spin_forever(int *out) {
    __shared__ int flag;
    if (threadIdx.x == 0) flag = 0;
    __syncthreads();
    if (threadIdx.x == 0)
        while (flag == 0) fp_emu::spin_yield("test.spin");
    out[threadIdx.x] = 1;
}

// cp.async: a tile of 64 floats copied by 16 threads (16 bytes each, the
// last 4 zero-filled), waited, barrier, read by other threads; and the two
// broken variants (no wait; no barrier).
__global__ void cp_tile(const float *src, float *out, int mode) {
    extern __shared__ __align__(16) float tile[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(tile);
    if (threadIdx.x < 16) fp_emu::cp_async(base + 16 * threadIdx.x, src + 4 * threadIdx.x, 16, threadIdx.x == 15 ? 0 : 16);
    fp_emu::cp_async_commit();
    if (mode != 1) fp_emu::cp_async_wait_group(0);
    if (mode != 2) __syncthreads();
    const uint32_t mine = base + 16 * ((threadIdx.x + 5) % 16);
    fp_emu::smem_note_read(mine, 16);
    std::memcpy(out + 4 * threadIdx.x, fp_emu::smem_at(mine, 16), 16);
}

// Programmatic dependent launch (kernels/common/pdl.cuh): a kernel that
// enters first; one that never does; one that copies before it does.
__global__ void pdl_scale(const float *x, float *y) {
    fp_pdl::enter();
    y[threadIdx.x] = 2.0f * x[threadIdx.x];
}
__global__ void pdl_no_enter(const float *x, float *y) { y[threadIdx.x] = x[threadIdx.x]; }
__global__ void pdl_copy_first(const float *src, float *out) {
    extern __shared__ __align__(16) float stage[];
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(stage);
    fp_emu::cp_async(base + 16 * threadIdx.x, src + 4 * threadIdx.x, 16, 16);
    fp_pdl::enter();
    fp_emu::cp_async_commit();
    fp_emu::cp_async_wait_group(0);
    out[threadIdx.x] = src[threadIdx.x];
}

// groups<<<2, 256>>>'s answer: each 128-thread group reversed (x 7), and the
// per-thread counter each thread bumped twice (thread 0 spun on thread 255).
// Grid-wide count (kernels/common/grid_count.cuh): every block writes its
// part and arrives; the blocks with the last `tail` tickets wait until all
// arrived, then each sums every part (in block order) into out[its place in
// the tail]; the last of them to leave resets the counts for the next launch.
// Runs only if the emulation keeps a waiting block resident while later
// blocks run; with tail above what the device holds at once it deadlocks,
// as on a GPU.
__global__ void grid_tail(int *parts, int *count, int *out, int tail) {
    __shared__ int ticket;
    if (threadIdx.x == 0) parts[blockIdx.x] = (int)blockIdx.x + 1;
    __syncthreads();
    if (threadIdx.x == 0) ticket = fp_grid::arrive(count);
    __syncthreads();
    const int first = (int)gridDim.x - tail;
    if (ticket < first) return;  // block-uniform
    if (threadIdx.x == 0) fp_grid::wait_at_least(count, (int)gridDim.x);
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (unsigned b = 0; b < gridDim.x; ++b) s += parts[b];
        out[ticket - first] = s;
        if (atomicAdd(count + 1, 1) == tail - 1) count[0] = count[1] = 0;
    }
}

static bool groups_ok(const std::vector<int> &out) {
    bool ok = true;
    for (int t = 0; t < 256; ++t) {
        int first = t / 128 * 128;
        ok &= out[t] == (first + 127 - (t - first)) * 7;
        ok &= out[256 + t] == 2;
    }
    return ok;
}

int main() {
    // block_sum: 3 blocks of 96 threads (3 warps; the last partial warp).
    {
        const int n = 1000;
        std::vector<float> x(n), out(3, -1.0f);
        double want = 0;
        for (int i = 0; i < n; ++i) x[i] = (float)(i % 7) - 2.5f, want += x[i];
        block_sum<<<3, 96>>>(x.data(), out.data(), n);
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT((double)out[0] + out[1] + out[2] == want);
        // The launch log names the kernel and keeps its shape.
        const fp_emu::LaunchRecord &r = fp_emu::launch_log().back();
        EXPECT(fp_emu::kernel_name(r.func).find("block_sum") != std::string::npos);
        EXPECT(r.grid.x == 3 && r.block.x == 96 && r.result == cudaSuccess);
    }
    // reverse_dyn: dynamic shared memory, 4 blocks.
    {
        std::vector<int> in(4 * 64), out(4 * 64, -1);
        for (int i = 0; i < 256; ++i) in[i] = i * 3;
        reverse_dyn<<<4, 64, 64 * sizeof(int)>>>(in.data(), out.data());
        EXPECT(cudaGetLastError() == cudaSuccess);
        bool ok = true;
        for (int b = 0; b < 4; ++b)
            for (int t = 0; t < 64; ++t) ok &= out[b * 64 + t] == in[b * 64 + 63 - t];
        EXPECT(ok);
    }
    // lanes: 16 x 4 threads = 2 warps.
    {
        std::vector<int> out(4 * 64, -1);
        lanes<<<1, dim3(16, 4)>>>(out.data());
        EXPECT(cudaGetLastError() == cudaSuccess);
        bool ok = true;
        for (int t = 0; t < 64; ++t) {
            int lane = t & 31;
            ok &= out[4 * t + 0] == ((lane & ~7) + 3) * 10;
            ok &= out[4 * t + 1] == (lane + 1 < 32 ? lane + 1 : lane);
            ok &= out[4 * t + 2] == (lane >= 2 ? lane - 2 : lane);
            ok &= (unsigned)out[4 * t + 3] == 0xaaaaaaaau;
        }
        EXPECT(ok);
    }
    // Launch configuration.
    {
        std::vector<int> in(64), out(64);
        reverse_dyn<<<1, 2048>>>(in.data(), out.data());
        EXPECT(failed_with(cudaGetLastError(), "block of 2048"));
        reverse_dyn<<<1, 64, 64 * 1024>>>(in.data(), out.data());
        EXPECT(failed_with(cudaGetLastError(), "cudaFuncSetAttribute"));
        EXPECT(cudaFuncSetAttribute(reverse_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) ==
               cudaSuccess);
        reverse_dyn<<<1, 64, 64 * 1024>>>(in.data(), out.data());
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT(cudaFuncSetAttribute(reverse_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 1 << 20) !=
               cudaSuccess);
        (void)cudaGetLastError();
    }
    // Violations.
    {
        std::vector<int> out(128);
        divergent_barrier<<<1, 64>>>(out.data());
        EXPECT(failed_with(cudaGetLastError(), "divergent __syncthreads"));
        shuffle_after_exit<<<1, 32>>>(out.data());
        EXPECT(failed_with(cudaGetLastError(), "has exited"));
        bounded<2><<<1, 64>>>(out.data());
        EXPECT(cudaGetLastError() == cudaSuccess && out[63] == 2);
        bounded<2><<<1, 96>>>(out.data());
        EXPECT(failed_with(cudaGetLastError(), "__launch_bounds__(64)"));
        mixed_collectives<<<1, 64>>>(out.data());
        EXPECT(failed_with(cudaGetLastError(), "divergent __syncthreads"));
        async_race<<<1, 32, 64>>>(out.data());
        EXPECT(failed_with(cudaGetLastError(), "read after write"));
        async_ok<<<1, 32, 64>>>(out.data());
        EXPECT(cudaGetLastError() == cudaSuccess);
        std::vector<float> f(32, 0.0f);
        poisoned_read<<<1, 32, 32 * sizeof(float)>>>(f.data());
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT(f[0] == 1.0f && f[1] != f[1]);  // never-written shared memory reads as NaN
    }
    // Group collectives, spinning, per-thread state.
    {
        std::vector<int> out(512, -1);
        groups<<<2, 256>>>(out.data());
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT(groups_ok(out));
        spin_forever<<<1, 64>>>(out.data());
        EXPECT(failed_with(cudaGetLastError(), "spinning in test.spin"));
    }
    // Blocks waiting on other blocks: resident while the next ones run, up to
    // what the device holds (2 SMs x 2 blocks of 512 threads here).
    {
        const fp_emu::DeviceProfile saved = fp_emu::device();
        fp_emu::DeviceProfile small = saved;
        small.sm_count = 2;
        fp_emu::set_device(small);
        std::vector<int> parts(16, 0), count(2, 0), out(16, -1);
        grid_tail<<<4, 512>>>(parts.data(), count.data(), out.data(), 4);  // every block waits
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT(out[0] == 10 && out[3] == 10 && count[0] == 0 && count[1] == 0);
        for (int round = 0; round < 2; ++round) {  // 16 blocks, the last 4 wait; the counts reset
            std::fill(out.begin(), out.end(), -1);
            grid_tail<<<16, 512>>>(parts.data(), count.data(), out.data(), 4);
            EXPECT(cudaGetLastError() == cudaSuccess);
            EXPECT(out[0] == 136 && out[3] == 136 && out[4] == -1 && count[0] == 0 && count[1] == 0);
        }
        // 5 waiters where 4 blocks fit: the fifth never starts.
        grid_tail<<<16, 512>>>(parts.data(), count.data(), out.data(), 5);
        EXPECT(strstr(fp_emu::last_failure(), "spinning in fp_grid::wait_at_least") != nullptr);
        EXPECT(failed_with(cudaGetLastError(), "waiting on other blocks: 4 resident"));
        fp_emu::set_device(saved);
    }
    // The greedy schedule (FP_EMU_GREEDY, read at each launch): a shared
    // buffer reused one barrier too early shows; spin-waits across warps
    // and group collectives still complete.
    {
        std::vector<int> out(512, -1);
        early_reuse<<<1, 64>>>(out.data());
        EXPECT(cudaGetLastError() == cudaSuccess && out[0] == 9 && out[63] == 9);
        setenv("FP_EMU_GREEDY", "1", 1);
        early_reuse<<<1, 64>>>(out.data());
        EXPECT(cudaGetLastError() == cudaSuccess && out[0] == 9 && out[32] == 10 && out[63] == 10);
        std::vector<float> ones(96, 1.0f), sum(1, -1.0f);
        block_sum<<<1, 96>>>(ones.data(), sum.data(), 96);
        EXPECT(cudaGetLastError() == cudaSuccess && sum[0] == 96.0f);
        groups<<<2, 256>>>(out.data());
        EXPECT(cudaGetLastError() == cudaSuccess);
        EXPECT(groups_ok(out));
        unsetenv("FP_EMU_GREEDY");
    }
    // cp.async
    {
        std::vector<float> src(64), out(64, -1.0f);
        for (int i = 0; i < 64; ++i) src[i] = (float)i + 0.5f;
        cp_tile<<<1, 16, 256>>>(src.data(), out.data(), 0);
        EXPECT(cudaGetLastError() == cudaSuccess);
        bool ok = true;
        for (int t = 0; t < 16; ++t)
            for (int e = 0; e < 4; ++e) {
                int s = (t + 5) % 16;
                ok &= out[4 * t + e] == (s == 15 ? 0.0f : src[4 * s + e]);
            }
        EXPECT(ok);
        cp_tile<<<1, 16, 256>>>(src.data(), out.data(), 1);
        EXPECT(failed_with(cudaGetLastError(), "in flight"));
        cp_tile<<<1, 16, 256>>>(src.data(), out.data(), 2);  // thread 0 reads thread 5's bytes first
        EXPECT(failed_with(cudaGetLastError(), "race: thread (5,0,0) issues an async copy"));
    }
    // Programmatic dependent launch: the attribute is recorded and counted;
    // a thread that exits or copies before fp_pdl::enter fails the launch.
    {
        std::vector<float> x(32), y(32, -1.0f);
        for (int i = 0; i < 32; ++i) x[i] = (float)i;
        fp_emu_runtime_counts c0, c1;
        fp_emu_runtime_counts_get(&c0);
        EXPECT((fp_pdl::launch<pdl_scale>(dim3(1), dim3(32), 0, 0, true, x.data(), y.data())) == cudaSuccess);
        fp_emu_runtime_counts_get(&c1);
        EXPECT(y[31] == 62.0f && fp_emu::launch_log().back().pdl);
        EXPECT(c1.n[FP_EMU_CALL_LAUNCH_PDL] == c0.n[FP_EMU_CALL_LAUNCH_PDL] + 1);
        EXPECT((fp_pdl::launch<pdl_scale>(dim3(1), dim3(32), 0, 0, false, x.data(), y.data())) == cudaSuccess);
        EXPECT(!fp_emu::launch_log().back().pdl);
        EXPECT((fp_pdl::launch<pdl_no_enter>(dim3(1), dim3(32), 0, 0, false, x.data(), y.data())) == cudaSuccess);
        EXPECT(failed_with(fp_pdl::launch<pdl_no_enter>(dim3(1), dim3(32), 0, 0, true, x.data(), y.data()),
                           "exited without fp_pdl::enter()"));
        std::vector<float> src(64, 1.0f), out(16);
        EXPECT((fp_pdl::launch<pdl_copy_first>(dim3(1), dim3(16), 256, 0, false, src.data(), out.data())) ==
               cudaSuccess);
        EXPECT(failed_with(fp_pdl::launch<pdl_copy_first>(dim3(1), dim3(16), 256, 0, true, src.data(), out.data()),
                           "issued cp.async before fp_pdl::enter()"));
    }
    return emu_test_end("test_emu_runtime");
}
