// CPU emulation of the CUDA execution model, to run the library's *own*
// kernel sources (kernels/**/*.cu) on a machine without a GPU.
//
// A kernel source is rewritten by tests/emu/cu2emu.py (launch syntax and
// `extern __shared__` only; every line keeps its number) and compiled by the
// host C++ compiler with this header first. Each CUDA thread of a block is a
// fiber (ucontext) on one OS thread; blocks run one after another (a block
// whose threads wait on another block's work, spin_yield_global, stays
// resident while the next ones run, up to what the device holds). Threads
// switch only at synchronization points, so everything between two of them
// runs as one piece, and the scheduler checks the rules a GPU does not:
//   - __syncthreads: every live thread of the block must reach it (a barrier
//     some threads skip, or threads split between a block barrier and a warp
//     collective, fails the launch as divergent);
//   - warp collectives (shuffles, __syncwarp, and the ones a test builds with
//     warp_exchange: mma.sync, ldmatrix, ...): every lane in the mask must
//     arrive with the same mask; a lane that exited is an error;
//   - launch configuration: block size, grid limits, dynamic shared memory
//     above 48 KiB only after cudaFuncSetAttribute, within the device limit.
// Each scheduling pass runs the runnable threads in thread order, or from
// the last one when the environment sets FP_EMU_REVERSE (read at each
// launch): another interleaving of producers and consumers. FP_EMU_GREEDY
// (read at each launch) runs one warp a pass instead, as far as it can go
// before the next warp moves: the warps skewed as far apart as the
// barriers allow (a shared buffer rewritten by one warp before another has
// read it, with no barrier between, then shows as a wrong result).
// Dynamic shared memory starts filled with 0xFF bytes (NaN in f32, f16, bf16),
// so a read of a word nobody wrote poisons the result.
// Global memory is host memory: device pointers are host pointers.
//
// What it cannot see: data races between threads on plain shared or global
// loads and stores as such (each thread runs from one sync point to the next
// alone; see smem_note_* for the hooks emulated async copies use; only the
// wrong values a race produces under some schedule, FP_EMU_GREEDY's or the
// default's), the memory model, register spills, the PTX itself.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu_runtime_counts.h"

namespace fp_emu {

constexpr int kSlotBytes = 64;  // bytes one lane may hand to a warp collective

struct BlockState;  // opaque: the scheduler's block

// What kernel code reads through threadIdx / blockIdx / blockDim / gridDim.
struct ThreadRegs {
    uint3 tid;
    uint3 bid;
    dim3 bdim;
    dim3 gdim;
    unsigned linear;  // tid.x + tid.y * bdim.x + tid.z * bdim.x * bdim.y
    unsigned lane, warp;
    BlockState *block;
};

extern thread_local ThreadRegs *g_cur;

// The calling CUDA thread's registers (abort if called outside a kernel).
ThreadRegs *cur();

// Block barrier (__syncthreads).
void syncthreads();
// Warp barrier (__syncwarp(mask)).
void syncwarp(unsigned mask);
// Warp collective: each lane in `mask` hands `n` <= kSlotBytes bytes. Returns
// the 32 lanes' slots (lane i's bytes at slots + i * kSlotBytes), valid until
// the calling lane's next synchronization point. `what` names the operation
// in error messages.
const unsigned char *warp_exchange(unsigned mask, const void *mine, size_t n, const char *what);

// Collective over the block's threads [first, first + count) (a warpgroup:
// first = 128 * k, count = 128): every one must arrive with the same range and
// name. Returns their slots (thread first + i at slots + i * kSlotBytes),
// valid until the caller's next synchronization point.
const unsigned char *group_exchange(unsigned first, unsigned count, const void *mine, size_t n, const char *what);

// For emulated spin-waits (mbarrier try_wait, flags in shared memory): back
// to the scheduler, runnable again at the next pass. A launch whose live
// threads only spin, over many passes in which nothing happened that could
// end a wait (note_progress), fails as a deadlock.
void spin_yield(const char *what);
// A spin-wait on another block's work (a grid-wide count of arrivals in
// global memory): when a block's live threads only wait like this, the
// launch keeps the block resident and runs other blocks (see launch_run),
// as many at once as the device holds (occupancy x SMs).
void spin_yield_global(const char *what);
// Something a spinner may be waiting for happened (an arrive, a copy landed).
void note_progress();

// Per-thread state of emulated instructions (cp.async groups, ...): the
// calling thread's object for `key`, made by make() on first use and
// destroyed by destroy() when the block ends.
void *thread_ext(const void *key, void *(*make)(), void (*destroy)(void *));
template <typename T> T &thread_state() {
    static const char key = 0;
    return *static_cast<T *>(thread_ext(
        &key, []() -> void * { return new T(); }, [](void *p) { delete static_cast<T *>(p); }));
}

// Fails the running launch with a message (the kernel broke a rule the
// hardware would punish). Does not return: the block's fibers are abandoned.
[[noreturn]] void kernel_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Shared memory: the block's arena holds the dynamic shared memory (offset
// 0). Static __shared__ variables are thread_local statics, outside it.
unsigned char *dynamic_smem();
size_t dynamic_smem_size();
// Offset of p in the arena (what __cvta_generic_to_shared returns); fails
// the launch if p is not in it.
uint32_t smem_offset(const void *p);
// The arena byte at a 32-bit shared address (fails the launch when the
// access [addr, addr + n) leaves the arena).
unsigned char *smem_at(uint32_t addr, size_t n);

// Shadow state of the arena for emulated asynchronous copies and warp-wide
// loads (cp.async, ldmatrix, ...): a read of bytes another thread wrote
// since the last block barrier, or of bytes with a copy still in flight, and
// an async write over bytes another thread read since the last barrier, fail
// the launch as a race.
void smem_note_async_issue(uint32_t addr, size_t n);     // copy in flight
void smem_note_async_complete(uint32_t addr, size_t n);  // copy landed (this thread)
// The same for copies whose readers are ordered by an mbarrier (TMA), not by
// __syncthreads: no barrier-epoch checks, only bytes in flight and the
// pending reads below.
void smem_note_async_issue_mbar(uint32_t addr, size_t n);
void smem_note_async_complete_mbar(uint32_t addr, size_t n);
void smem_note_read(uint32_t addr, size_t n);            // collective read by this thread
// A wgmma's read, noted by a thread of its warpgroup when it retires its part
// (emu_sm90.h), and its pending read (below) retired: recorded as the
// warpgroup's. The hardware's wgmma is one operation of the warpgroup,
// complete for all of it once any of its threads' wgmma.wait_group
// returned, so an async copy that a thread of the same warpgroup issues
// after that (no unretired reads left: the pending-read check) is ordered
// after the read without a __syncthreads; a thread of another warpgroup
// still needs one.
void smem_note_read_wgmma_retire(uint32_t addr, size_t n);
// Bytes an issued asynchronous operation (wgmma) will read before it retires
// (delta +1 at issue, -1 when it read them): an async copy issued or landing
// over them meanwhile fails the launch (write after read), and so does an
// issue (+1) over bytes an async copy to which is still in flight.
void smem_note_pending_read(uint32_t addr, size_t n, int delta);

// Proxies: cp.async landing and st.shared (smem_note_generic_write) write
// shared memory through the generic proxy, wgmma reads it through the async
// proxy; a wgmma issued over bytes written so, with no fence.proxy.async
// since the write by the writer or by the issuing thread, fails the launch.
// (TMA writes through the async proxy: no fence needed.)
void smem_note_generic_write(uint32_t addr, size_t n);
void fence_proxy_async();
// A synchronous store by this thread (stmatrix, st.shared through a
// wrapper that notes it): a generic-proxy write (above) that also records
// the writer for the read-after-write check (a thread reading it with no
// barrier between fails the launch); a store over bytes an async copy to
// which is in flight, or which an issued async-proxy read (a wgmma, a bulk
// store) has not yet read, fails the launch.
void smem_note_store(uint32_t addr, size_t n);
// An async-proxy read of shared memory other than a wgmma's (the source of
// cp.async.bulk.tensor's global <- shared store): at issue (delta +1) the
// read-after-write and proxy checks of a wgmma (a generic write with no
// fence.proxy.async since, by the writer or this thread, fails; so does a
// write by another thread no barrier orders before this one), then the
// bytes count as pending reads until delta -1 (the bulk group's wait),
// where the read is recorded as the waiting thread's: an async copy another
// thread issues over the bytes later needs a barrier with it in between.
void smem_note_async_read(uint32_t addr, size_t n, int delta, const char *what);

// Per-block state of emulated instructions (mbarriers, TMA copies in
// flight, ...): the block's object for `key`, made on first use, destroyed
// when the block ends.
void *block_ext(const void *key, void *(*make)(), void (*destroy)(void *));
template <typename T> T &block_state() {
    static const char key = 0;
    return *static_cast<T *>(block_ext(
        &key, []() -> void * { return new T(); }, [](void *p) { delete static_cast<T *>(p); }));
}

// Checks when the calling thread exits / the block's last thread exits, run
// in that thread's context (fn may kernel_fail): e.g. nothing of an
// emulated asynchronous unit left in flight.
void at_thread_exit(void (*fn)(void *), void *arg);
void at_block_exit(void (*fn)(void *), void *arg);

// Named barriers (bar.sync / bar.arrive id, count): barrier `id` (0..15)
// completes when `count` threads (a multiple of 32, the same for every
// arrival of the phase) arrived; bar.sync waits for that, bar.arrive does
// not. Threads that exited never arrive (the launch fails as a deadlock).
// A completed one orders its participants like __syncthreads for the shadow
// checks (an async copy's bytes read by another participant after it).
// Id 0 is not __syncthreads' barrier here: a kernel mixing them is not
// emulated.
void named_barrier_sync(unsigned id, unsigned count);
void named_barrier_arrive(unsigned id, unsigned count);

// Driver entry points (cudaGetDriverEntryPoint*) an emulation header
// provides, by name (e.g. cuTensorMapEncodeTiled from emu_sm90.h).
bool register_driver_symbol(const char *name, void *fn);

// Sets last_failure()'s message (an API call's reason, for a test to read).
void note_failure(const char *why);
// Work on a stream failed (a fault): the device's error from now on, as for
// a kernel that breaks a rule.
void device_fault(cudaError_t e);
// An API call failed: the error becomes cudaGetLastError's; returns e.
cudaError_t record_error(cudaError_t e);
// 0 when a copy over [p, p + n) would fail on a GPU: part of it page-locked
// (registered or cudaMallocHost) but not all of it inside one such range.
bool host_span_ok(const void *p, size_t n);

// The calling thread's device (cudaSetDevice), and how many there are
// (FP_EMU_DEVICES, default 1). All share the one device profile.
int current_device();
int emulated_devices();
// Work for a stream (cudart_emu.cpp): recorded into the graph when the
// stream captures; else run on the stream's worker thread in stream order
// when streams are asynchronous (FP_EMU_ASYNC=1: the library's own tests, so
// a missing synchronization shows), or at once in the calling thread.
void submit(cudaStream_t s, std::function<void()> op);
// The same, naming the CUDA graph node a capture records it as (submit
// records a host node): kernels, memsets and copies say what they are.
void submit_node(cudaStream_t s, std::function<void()> op, cudaGraphNodeType type, const void *key);
bool async_streams();
// The emulated CUPTI's hook (cupti_emu.cpp, set while it records): called
// on the enqueuing thread for each operation run outside a capture (each
// node of a graph launch too); returns the operation to run in its place.
extern std::function<void()> (*g_activity_hook)(cudaGraphNodeType type, std::function<void()> op);

// Launch: the configuration is checked at once (a refused launch is
// cudaGetLastError's error on the calling thread); the grid runs later.
typedef void (*BlockBody)(void *ctx);
// *record: the launch's entry in launch_log(); pdl: launched with
// programmatic stream serialization (kernels/common/pdl.cuh).
cudaError_t launch_check(const void *func, dim3 grid, dim3 block, size_t smem, size_t *record = nullptr,
                         bool pdl = false);
// Runs every block; a kernel that breaks a rule fails the launch: the error
// is then the device's (cudaGetLastError and the synchronizing calls report
// it, as a GPU reports a fault) and last_failure() says why.
// A pdl launch checks the rule of kernels/common/pdl.cuh: each thread calls
// pdl_enter() before it exits or issues an async copy (pdl_require).
cudaError_t launch_run(const void *func, dim3 grid, dim3 block, size_t smem, BlockBody body, void *ctx,
                       size_t record, bool pdl = false);
// griddepcontrol.launch_dependents + griddepcontrol.wait (fp_pdl::enter):
// the predecessor has run (the emulation runs a stream's work in order), so
// this notes that the calling thread waited.
void pdl_enter();
// An emulated global-memory access of kind `what` by the calling thread: in
// a pdl launch before pdl_enter(), the launch fails (on a GPU it could read
// the predecessor's outputs before they are written).
void pdl_require(const char *what);

template <typename... P> struct Launcher {
    void (*fn)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    bool pdl = false;  // cudaLaunchAttributeProgrammaticStreamSerialization
    Launcher with_pdl() const {
        Launcher l = *this;
        l.pdl = true;
        return l;
    }
    template <typename... A> void operator()(A &&...args) const {
        // The parameters' values now (the kernel parameter space).
        std::tuple<P...> params(std::forward<A>(args)...);
        size_t record = 0;
        if (launch_check(reinterpret_cast<const void *>(fn), grid, block, smem, &record, pdl) != cudaSuccess)
            return;
        const Launcher self = *this;
        submit_node(stream, [self, params, record] { self.run(params, record); }, cudaGraphNodeTypeKernel,
                    reinterpret_cast<const void *>(fn));
    }
    void run(const std::tuple<P...> &params, size_t record) const {
        struct Ctx {
            void (*fn)(P...);
            const std::tuple<P...> *params;
        } ctx{fn, &params};
        launch_run(reinterpret_cast<const void *>(fn), grid, block, smem,
                   [](void *c) {
                       // Every CUDA thread gets its own copy of the parameters.
                       Ctx *x = static_cast<Ctx *>(c);
                       std::tuple<P...> copy = *x->params;
                       std::apply(x->fn, copy);
                   },
                   &ctx, record, pdl);
    }
};
template <typename... P>
Launcher<P...> make_launch(void (*fn)(P...), dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0) {
    return Launcher<P...>{fn, grid, block, smem, stream, false};
}

// The emulated device (cudaDeviceGetAttribute and friends answer from it).
struct DeviceProfile {
    int major, minor;
    int sm_count;
    int max_threads_per_block;
    int max_threads_per_sm;
    int smem_per_block;        // without opt-in
    int smem_per_block_optin;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
    int smem_per_sm;
    int regs_per_sm;
};
// H100 SXM (sm_90) by default; FP_EMU_SM=80 picks an A100 profile.
const DeviceProfile &device();
void set_device(const DeviceProfile &p);
// Changes with every set_device: what host code that caches a device's
// answers (a GPU's never change) adds to its key under the emulation.
unsigned device_generation();

// The message of the last failed launch ("" if none), and launches so far.
const char *last_failure();
long launches();

// Every launch so far, in order (refused ones too): which kernels a launcher
// picked, with what shape. clear_launch_log() empties it.
struct LaunchRecord {
    const void *func;
    dim3 grid, block;
    size_t smem;
    cudaError_t result;
    bool pdl;  // launched with programmatic stream serialization
};
const std::vector<LaunchRecord> &launch_log();
void clear_launch_log();
// The demangled name of a kernel ("void ns::kernel<float, 4>(desc)"), from
// the executable's dynamic symbols (fp_add_emu_test links with
// ENABLE_EXPORTS); "?" when it is not found.
std::string kernel_name(const void *func);

// A shuffle: every lane hands v; lane l gets the value of lane src(l) (its
// own where src leaves its width-lane segment).
template <typename T, typename Src> T shfl_from(unsigned mask, T v, int width, const char *what, Src src) {
    static_assert(sizeof(T) <= (size_t)kSlotBytes, "shuffle of a type wider than a slot");
    const unsigned char *s = warp_exchange(mask, &v, sizeof v, what);
    const int lane = (int)cur()->lane;
    int from = src(lane);
    if (from < 0 || (from & ~(width - 1)) != (lane & ~(width - 1))) from = lane;
    T r;
    std::memcpy(&r, s + from * kSlotBytes, sizeof r);
    return r;
}
template <typename T> T shfl_xor(unsigned mask, T v, int lane_mask, int width) {
    return shfl_from(mask, v, width, "__shfl_xor_sync", [=](int l) { return l ^ lane_mask; });
}
template <typename T> T shfl_idx(unsigned mask, T v, int src_lane, int width) {
    return shfl_from(mask, v, width, "__shfl_sync",
                     [=](int l) { return (l & ~(width - 1)) + (src_lane & (width - 1)); });
}
template <typename T> T shfl_down(unsigned mask, T v, unsigned delta, int width) {
    return shfl_from(mask, v, width, "__shfl_down_sync", [=](int l) { return l + (int)delta; });
}
template <typename T> T shfl_up(unsigned mask, T v, unsigned delta, int width) {
    return shfl_from(mask, v, width, "__shfl_up_sync", [=](int l) { return l - (int)delta; });
}
unsigned ballot(unsigned mask, int pred);

// A kernel's __launch_bounds__(max_threads, ...), which cu2emu.py moves into
// the body as this call: a block above the bound is a launch the hardware
// refuses (too many resources requested), so it fails the launch here.
inline void check_launch_bounds(long long max_threads) {
    const ThreadRegs *r = cur();
    const long long n = (long long)r->bdim.x * r->bdim.y * r->bdim.z;
    if (n > max_threads)
        kernel_fail("a block of %lld threads exceeds the kernel's __launch_bounds__(%lld): a GPU refuses the launch "
                    "(too many resources requested)",
                    n, max_threads);
}

}  // namespace fp_emu

// ---------------------------------------------------------------------------
// CUDA C++ keywords and built-ins for the host compiler
// ---------------------------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __restrict__
#undef __grid_constant__
#define __global__
#define __device__
#define __host__
#define __constant__ static const
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __grid_constant__
// One copy per OS thread: the fibers of a block share it, as a CTA does.
#define __shared__ static thread_local

#define threadIdx (fp_emu::g_cur->tid)
#define blockIdx (fp_emu::g_cur->bid)
#define blockDim (fp_emu::g_cur->bdim)
#define gridDim (fp_emu::g_cur->gdim)
#ifndef warpSize
#define warpSize 32
#endif

inline void __syncthreads() { fp_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { fp_emu::syncwarp(mask); }
inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return fp_emu::shfl_xor(mask, v, lane_mask, width);
}
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return fp_emu::shfl_idx(mask, v, src, width);
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return fp_emu::shfl_down(mask, v, delta, width);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return fp_emu::shfl_up(mask, v, delta, width);
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return fp_emu::ballot(mask, pred); }
inline int __any_sync(unsigned mask, int pred) { return fp_emu::ballot(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return fp_emu::ballot(mask, pred) == mask; }

// The runtime's C++ overloads taking a kernel (cuda_runtime.h declares them
// for nvcc only).
template <typename T> inline cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void *>(entry), attr, value);
}
template <typename T> inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, T *entry) {
    return ::cudaFuncGetAttributes(a, reinterpret_cast<const void *>(entry));
}
template <typename T>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, T *entry, int threads, size_t smem) {
    return ::cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, reinterpret_cast<const void *>(entry), threads, smem);
}

// Cache-hinted loads and stores: plain accesses.
template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename T> inline T __ldcg(const T *p) { return *p; }
template <typename T> inline T __ldcs(const T *p) { return *p; }
template <typename T> inline T __ldlu(const T *p) { return *p; }
template <typename T> inline void __stwb(T *p, T v) { *p = v; }
template <typename T> inline void __stcg(T *p, T v) { *p = v; }
template <typename T> inline void __stcs(T *p, T v) { *p = v; }
template <typename T> inline void __stwt(T *p, T v) { *p = v; }

// The SM clock: host nanoseconds at the profile's ~2 GHz.
long long clock64();

inline size_t __cvta_generic_to_shared(const void *p) { return fp_emu::smem_offset(p); }

// Fast-math intrinsics: the precise host functions (the emulation checks
// index math and data flow, not the last bits of the approximations).
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
// Rounded, never contracted: volatile keeps the host compiler from fusing
// an intrinsic multiply into a following add (as nvcc does not).
inline float __fmul_rn(float a, float b) {
    volatile float r = a * b;
    return r;
}
inline float __fadd_rn(float a, float b) {
    volatile float r = a + b;
    return r;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// min / max of the device math library (nvcc declares its overloads, mixed
// signedness included, for CUDA compilations only): the usual arithmetic
// conversions, fminf / fmaxf for floating point (a NaN loses).
template <typename A, typename B> inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    if constexpr (std::is_floating_point<C>::value) return std::fmin((C)a, (C)b);
    return (C)b < (C)a ? (C)b : (C)a;
}
template <typename A, typename B> inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    if constexpr (std::is_floating_point<C>::value) return std::fmax((C)a, (C)b);
    return (C)a < (C)b ? (C)b : (C)a;
}

// Atomics: fibers switch only at synchronization points, so a plain
// read-modify-write is atomic here.
template <typename T> inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T> inline T atomicMax(T *p, T v) {
    T old = *p;
    if (v > old) *p = v;
    return old;
}
template <typename T> inline T atomicMin(T *p, T v) {
    T old = *p;
    if (v < old) *p = v;
    return old;
}
template <typename T> inline T atomicExch(T *p, T v) {
    T old = *p;
    *p = v;
    return old;
}
template <typename T> inline T atomicCAS(T *p, T cmp, T v) {
    T old = *p;
    if (old == cmp) *p = v;
    return old;
}
