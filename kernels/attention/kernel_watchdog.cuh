// The checked build's watchdog for device-side wait loops (CMake option
// FASTPATH_KERNEL_WATCHDOG=ON defines FP_KERNEL_WATCHDOG for the CUDA
// sources; the default build compiles none of this and its SASS does not
// change). A loop that polls for something another thread or the copy
// engine must do (v5's mbarrier try_wait loops, the only such loops in
// kernels/) gets a deadline: once kCycles SM cycles have passed since its
// first unsuccessful poll, the thread reports the wait (kernel, barrier,
// index, parity, blockIdx, threadIdx, cycles waited) and traps, so a
// schedule bug ends the kernel with an error (cudaErrorLaunchFailure)
// instead of holding the GPU until the process is killed.
//
// The report is not a device printf: printf is a call (vprintf), and a call
// anywhere in a kernel makes ptxas serialize all of its wgmmas (C7510: v5
// would lose its Q K^T / softmax overlap, as the checked build's timing)
// and spill around it; out of line, in the producer's 24-register region,
// it also makes ptxas drop setmaxnreg (C7507). Instead the first thread to
// time out on a device writes the fields into host-mapped memory (plain
// stores, __threadfence_system), the others wait for it (bounded) and every
// timed-out thread traps; the host prints the report on stderr as one line
// ("fastpath watchdog: ..."): at the launcher's next call (arm) and at
// process exit. arm() points the device at that memory before a watched
// kernel's first launch on each device (skipped while the stream is being
// captured: such a launch traps without a report). Checked on an H200
// (driver 580, nvcc 13.0) with a test kernel whose mbarrier never
// completes: the grid traps after 2.5 s (unspecified launch failure) and
// the line is printed at exit. The watched kernel keeps its pipeline: v5 in
// the checked build (sm_90a, nvcc 13.0) has the same wgmma grouping and
// waits, no stack or spills, 168 registers at entry, and its highest
// register goes from R195 to R202 (D = 128) and R160 to R165 (D = 64),
// below the consumers' 240.
//
// Not covered (hardware waits, no loop in the source to bound):
// __syncthreads and named barriers (bar.sync), cp.async / wgmma wait_group,
// and the retry loop ptxas itself emits for setmaxnreg.inc
// (USETMAXREG.TRY_ALLOC): launch_v5 guards that one on the host, by checking
// the kernel's register count before its first launch
// (fp_tma::reg_split_check).
// Under the CPU emulation (FP_CUDA_EMU) clock64() is the emulation's clock
// (host nanoseconds x 2, tests/emu/cuda_emu.cpp); the thread prints the line
// itself and the trap is fp_emu::kernel_fail (the launch fails with the
// line). The emulation's own deadlock detection (10000 passes without
// progress) often reports a true deadlock first.
#ifndef FP_KERNEL_WATCHDOG_CUH
#define FP_KERNEL_WATCHDOG_CUH

#if defined(FP_KERNEL_WATCHDOG)
#include <stdint.h>
#include <stdio.h>
#if !defined(FP_CUDA_EMU)
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <mutex>
#endif

namespace fp_watchdog {
namespace { // internal linkage, as the other kernel headers: one report per translation unit

// The deadline of every watched wait, in SM cycles (clock64): 2^32, about
// 2.2 s at the 1.98 GHz boost clock of H100 / H200 (2.9 s at 1.5 GHz). A
// healthy wait lasts microseconds; a kernel that legitimately runs for
// seconds still never waits that long on one barrier.
constexpr long long kCycles = 1ll << 32;

// One wait's clock: poll() after each unsuccessful try starts the clock on
// the first and answers true once `budget` cycles have passed since.
struct deadline {
    long long t0 = 0, waited = 0;
    bool started = false;
    __device__ __forceinline__ bool poll(long long budget = kCycles) {
        const long long now = clock64();
        if (!started) {
            started = true;
            t0 = now;
        }
        waited = now - t0;
        return waited > budget;
    }
};

#if defined(FP_CUDA_EMU)
__device__ __forceinline__ void expired(const char *kernel, const char *barrier, int index, unsigned parity,
                                        long long waited) {
    printf("fastpath watchdog: %s %s[%d] parity %u not completed after %lld cycles; block (%d,%d,%d) thread "
           "(%d,%d,%d): trap\n",
           kernel, barrier, index, parity, waited, (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z,
           (int)threadIdx.x, (int)threadIdx.y, (int)threadIdx.z);
    fp_emu::kernel_fail("fastpath watchdog: %s %s[%d] parity %u not completed after %lld cycles (thread %d)", kernel,
                        barrier, index, parity, waited, (int)threadIdx.x);
}
#else
// What the first timed-out thread of a device writes (host-mapped memory).
struct report {
    int valid; // written last
    int index;
    unsigned parity;
    int block[3], thread[3];
    long long waited;
    char kernel[64], barrier[16];
};
__device__ report *g_report; // set by arm(); null: trap without a report
__device__ unsigned g_claimed; // 0, 1: a thread is writing the report, 2: written

// Byte by byte, not unrolled: unrolled, the constant strings became one
// immediate store per character, and the registers they took in this cold
// path made ptxas spill v9's consumers (session 36).
__device__ __forceinline__ void copy_str(char *dst, const char *src, int n) {
    int i = 0;
#pragma unroll 1
    for (; i < n - 1 && src[i]; ++i) dst[i] = src[i];
    dst[i] = 0;
}
// blockIdx.x, .y, .z, threadIdx.x, .y, .z for k = 0 .. 5, read where
// called (asm volatile: not hoisted out of the caller's loop).
__device__ __forceinline__ int special_index(int k) {
    unsigned v;
    switch (k) {
    case 0: asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(v)); break;
    case 1: asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(v)); break;
    case 2: asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(v)); break;
    case 3: asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v)); break;
    case 4: asm volatile("mov.u32 %0, %%tid.y;" : "=r"(v)); break;
    default: asm volatile("mov.u32 %0, %%tid.z;" : "=r"(v)); break;
    }
    return (int)v;
}
// Reports (the device's first) and traps. Inlined: no call (see above).
// A thread that did not claim the report waits (bounded: 2^24 cycles) until
// the claimant has written it: any thread's trap ends the grid, and on an
// H200 the claimant's last stores were lost to the others' traps.
__device__ __forceinline__ void expired(const char *kernel, const char *barrier, int index, unsigned parity,
                                        long long waited) {
    report *r = *static_cast<report *volatile *>(&g_report);
    if (r && atomicCAS(&g_claimed, 0u, 1u) != 0u) {
        const long long t0 = clock64();
        while (*static_cast<volatile unsigned *>(&g_claimed) != 2u && clock64() - t0 < (1ll << 24)) {
        }
    } else if (r) {
        copy_str(r->kernel, kernel, (int)sizeof r->kernel);
        copy_str(r->barrier, barrier, (int)sizeof r->barrier);
        r->index = index;
        r->parity = parity;
        r->waited = waited;
        // the indices one at a time (read inside the loop: ptxas otherwise
        // reads all six first, six more registers in this cold path)
#pragma unroll 1
        for (int k = 0; k < 6; ++k) (k < 3 ? r->block : r->thread)[k % 3] = special_index(k);
        __threadfence_system();
        *static_cast<volatile int *>(&r->valid) = 1;
        __threadfence_system();
        atomicExch(&g_claimed, 2u);
    }
    __trap();
}

// ---- host ----
report *g_host_report;               // mapped, portable; null when the allocation failed
std::atomic<unsigned long long> g_armed{0}; // devices 0..63 whose g_report points at it
std::atomic<bool> g_printed{false};
std::once_flag g_once;

void print_report() {
    const report *r = g_host_report;
    if (!r || !*static_cast<const volatile int *>(&r->valid) || g_printed.exchange(true)) return;
    fprintf(stderr,
            "fastpath watchdog: %.64s %.16s[%d] parity %u not completed after %lld cycles; block (%d,%d,%d) "
            "thread (%d,%d,%d): trapped\n",
            r->kernel, r->barrier, r->index, r->parity, r->waited, r->block[0], r->block[1], r->block[2],
            r->thread[0], r->thread[1], r->thread[2]);
}

// Before a watched kernel's launch on `stream`: prints a report a previous
// launch left, and points the current device's g_report at the mapped
// report (once per device; not while `stream` is being captured, nor when
// a step fails: that launch then traps without a report). Never fails.
void arm(cudaStream_t stream) {
    std::call_once(g_once, [] {
        void *h = nullptr;
        if (cudaHostAlloc(&h, sizeof(report), cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
            std::memset(h, 0, sizeof(report));
            g_host_report = static_cast<report *>(h);
            std::atexit(print_report);
        } else {
            (void)cudaGetLastError();
        }
    });
    if (!g_host_report) return;
    print_report();
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        (void)cudaGetLastError();
        return;
    }
    const unsigned long long bit = 1ull << dev;
    if (g_armed.load(std::memory_order_acquire) & bit) return;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    void *d = nullptr;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone ||
        cudaHostGetDevicePointer(&d, g_host_report, 0) != cudaSuccess ||
        cudaMemcpyToSymbolAsync(g_report, &d, sizeof d, 0, cudaMemcpyHostToDevice, stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    g_armed.fetch_or(bit, std::memory_order_acq_rel);
}
#endif // FP_CUDA_EMU

} // namespace
} // namespace fp_watchdog
#endif // FP_KERNEL_WATCHDOG

#endif // FP_KERNEL_WATCHDOG_CUH
