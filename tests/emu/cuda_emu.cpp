// The scheduler of the CUDA emulation (see cuda_emu.h) and the runtime API
// calls the library's launchers make, answered for the emulated device.
#include "cuda_emu.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fp_emu {

thread_local ThreadRegs *g_cur = nullptr;

// ---------------------------------------------------------------------------
// Fiber contexts. On x86-64 a switch saves the callee-saved registers on the
// old stack and swaps stack pointers (no system call: ucontext's
// swapcontext saves the signal mask with one, which made the switch most of
// the emulation's time). Elsewhere, ucontext.
// ---------------------------------------------------------------------------
#if defined(__x86_64__)
extern "C" void fp_emu_ctx_switch(void **save_sp, void *new_sp);
asm(R"(
    .text
    .p2align 4
    .globl fp_emu_ctx_switch
    .type fp_emu_ctx_switch, @function
fp_emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size fp_emu_ctx_switch, .-fp_emu_ctx_switch
    .section .note.GNU-stack, "", @progbits
    .text
)");
struct Context {
    void *sp = nullptr;
};
// A context that starts entry() on the stack [base, base + size).
static void ctx_make(Context *c, char *base, size_t size, void (*entry)()) {
    uintptr_t top = ((uintptr_t)(base + size)) & ~(uintptr_t)15;
    void **sp = reinterpret_cast<void **>(top);
    *--sp = nullptr;                           // entry's return address: never used
    *--sp = reinterpret_cast<void *>(entry);   // popped by the switch's ret
    for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12-r15
    c->sp = sp;
}
static inline void ctx_swap(Context *from, Context *to) { fp_emu_ctx_switch(&from->sp, to->sp); }
#else
struct Context {
    ucontext_t uc;
};
static void ctx_make(Context *c, char *base, size_t size, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = base;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}
static inline void ctx_swap(Context *from, Context *to) { swapcontext(&from->uc, &to->uc); }
#endif

namespace {

enum ThreadState { RUNNABLE, AT_BARRIER, AT_WARP, DONE };

struct Fiber {
    ThreadRegs regs;
    Context ctx;
    ThreadState state;
    unsigned mask;           // AT_WARP: the collective's mask
    const char *what;        // AT_WARP: the collective's name
    const char *barrier_at;  // AT_BARRIER: "__syncthreads"
    const unsigned char *result;
    unsigned char slot[kSlotBytes];
};

// Shadow of one arena byte.
struct Shadow {
    int32_t writer;        // thread that last wrote by an async copy (-1 none)
    uint32_t write_epoch;  // block barrier epoch of that write
    int32_t reader;        // last thread that read it by a collective (-1 none, -2 several)
    uint32_t read_epoch;
    uint16_t in_flight;    // async copies issued and not landed
};

}  // namespace

struct BlockState {
    std::vector<Fiber> fibers;
    Context sched;
    unsigned char *arena = nullptr;
    size_t arena_size = 0;
    std::vector<Shadow> shadow;
    uint32_t epoch = 0;
    unsigned nwarps = 0;
    std::vector<unsigned char> snap;  // per warp: 32 slots, copied at release
    BlockBody body = nullptr;
    void *ctx = nullptr;
    bool failed = false;
    std::string failure;
};

namespace {

DeviceProfile g_h100 = {9, 0, 132, 1024, 2048, 48 * 1024, 227 * 1024, 228 * 1024, 65536};
DeviceProfile g_a100 = {8, 0, 108, 1024, 2048, 48 * 1024, 163 * 1024, 164 * 1024, 65536};
DeviceProfile g_device = [] {
    const char *e = getenv("FP_EMU_SM");
    return (e && atoi(e) == 80) ? g_a100 : g_h100;
}();

thread_local std::string g_last_failure;
thread_local cudaError_t g_sticky = cudaSuccess;  // cudaGetLastError's error
long g_launches = 0;
std::vector<LaunchRecord> g_log;
std::map<const void *, int> g_max_dyn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize

size_t stack_bytes() {
    const char *e = getenv("FP_EMU_STACK_KB");
    long kb = e ? atol(e) : 128;
    if (kb < 16) kb = 16;
    return (size_t)kb * 1024;
}

thread_local BlockState *g_block = nullptr;
thread_local Fiber *g_fiber = nullptr;

void fiber_entry() {
    BlockState *b = g_block;
    b->body(b->ctx);
    Fiber *f = g_fiber;
    f->state = DONE;
    // Back to the scheduler for good (not through uc_link: a DONE fiber is
    // never resumed, and its stack is reused by the next block).
    ctx_swap(&f->ctx, &b->sched);
    abort();
}

// Back to the scheduler; returns when this fiber is resumed.
void yield_to_scheduler() {
    Fiber *f = g_fiber;
    ctx_swap(&f->ctx, &g_block->sched);
    g_fiber = f;
    g_cur = &f->regs;
}

Fiber *self(const char *what) {
    if (!g_fiber) {
        fprintf(stderr, "cuda_emu: %s called outside a kernel\n", what);
        abort();
    }
    return g_fiber;
}

std::string describe(const Fiber &f) {
    char buf[96];
    snprintf(buf, sizeof buf, "thread (%u,%u,%u)", f.regs.tid.x, f.regs.tid.y, f.regs.tid.z);
    return buf;
}

// After a pass in which every runnable fiber ran until it blocked: release
// the block barrier or warp collectives whose participants have all arrived.
// Returns false (and records why) on a deadlock.
bool resolve(BlockState &b) {
    size_t live = 0, at_bar = 0;
    for (const Fiber &f : b.fibers) {
        if (f.state != DONE) live++;
        if (f.state == AT_BARRIER) at_bar++;
    }
    if (live == 0) return true;
    bool released = false;
    if (at_bar == live) {
        // Threads that exited never reach this barrier: undefined behavior
        // (the programming guide's "conditional __syncthreads").
        if (live < b.fibers.size()) {
            b.failure = "divergent __syncthreads: " + std::to_string(at_bar) + " of " +
                        std::to_string(b.fibers.size()) + " threads reached it, the others had exited";
            return false;
        }
        for (Fiber &f : b.fibers)
            if (f.state == AT_BARRIER) f.state = RUNNABLE;
        b.epoch++;
        return true;
    }
    // Warp collectives, per warp, grouped by mask.
    for (unsigned w = 0; w < b.nwarps; ++w) {
        Fiber *lanes[32] = {nullptr};
        for (unsigned l = 0; l < 32; ++l) {
            size_t i = (size_t)w * 32 + l;
            if (i < b.fibers.size()) lanes[l] = &b.fibers[i];
        }
        for (unsigned l = 0; l < 32; ++l) {
            Fiber *f = lanes[l];
            if (!f || f->state != AT_WARP) continue;
            const unsigned mask = f->mask;
            bool all = true;
            for (unsigned k = 0; k < 32; ++k) {
                if (!(mask & (1u << k))) continue;
                Fiber *g = lanes[k];
                if (!g || g->state == DONE) {
                    b.failure = describe(*f) + ": " + f->what + " with lane " + std::to_string(k) +
                                " in its mask, but that lane " + (g ? "has exited" : "does not exist");
                    return false;
                }
                if (g->state != AT_WARP) {
                    all = false;
                    continue;
                }
                if (g->mask != mask || strcmp(g->what, f->what) != 0) {
                    b.failure = describe(*f) + ": " + f->what + " (mask " + std::to_string(mask) +
                                ") met lane " + std::to_string(k) + " at " + g->what + " (mask " +
                                std::to_string(g->mask) + ")";
                    return false;
                }
            }
            if (!all) continue;
            unsigned char *snap = &b.snap[(size_t)w * 32 * kSlotBytes];
            for (unsigned k = 0; k < 32; ++k)
                if (mask & (1u << k)) memcpy(snap + k * kSlotBytes, lanes[k]->slot, kSlotBytes);
            for (unsigned k = 0; k < 32; ++k)
                if (mask & (1u << k)) {
                    lanes[k]->state = RUNNABLE;
                    lanes[k]->result = snap;
                }
            released = true;
        }
    }
    if (released) return true;
    // Nobody can move: say who waits where.
    std::string why = "deadlock: ";
    size_t shown = 0;
    for (const Fiber &f : b.fibers) {
        if (f.state == DONE) continue;
        if (shown++ == 4) {
            why += ", ...";
            break;
        }
        if (shown > 1) why += ", ";
        why += describe(f) + (f.state == AT_BARRIER ? " at __syncthreads" : std::string(" at ") + f.what);
    }
    if (at_bar > 0 && at_bar < live)
        why = "divergent __syncthreads: " + std::to_string(at_bar) + " of " + std::to_string(live) +
              " live threads reached it (" + why + ")";
    b.failure = why;
    return false;
}

bool run_block(BlockState &b, dim3 grid, dim3 block, uint3 bid, char *stacks, size_t stack_sz) {
    const unsigned nthreads = block.x * block.y * block.z;
    b.fibers.assign(nthreads, Fiber{});
    b.nwarps = (nthreads + 31) / 32;
    b.snap.assign((size_t)b.nwarps * 32 * kSlotBytes, 0);
    b.epoch = 1;
    b.failed = false;
    memset(b.arena, 0xFF, b.arena_size);
    for (Shadow &s : b.shadow) s = Shadow{-1, 0, -1, 0, 0};
    for (unsigned i = 0; i < nthreads; ++i) {
        Fiber &f = b.fibers[i];
        f.regs.tid = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
        f.regs.bid = bid;
        f.regs.bdim = block;
        f.regs.gdim = grid;
        f.regs.linear = i;
        f.regs.lane = i % 32;
        f.regs.warp = i / 32;
        f.regs.block = &b;
        f.state = RUNNABLE;
        ctx_make(&f.ctx, &stacks[(size_t)i * stack_sz], stack_sz, fiber_entry);
    }
    g_block = &b;
    for (;;) {
        bool ran = false;
        for (Fiber &f : b.fibers) {
            if (f.state != RUNNABLE) continue;
            g_fiber = &f;
            g_cur = &f.regs;
            ctx_swap(&b.sched, &f.ctx);
            g_fiber = nullptr;
            g_cur = nullptr;
            ran = true;
            if (b.failed) return false;
        }
        bool all_done = true;
        for (const Fiber &f : b.fibers)
            if (f.state != DONE) all_done = false;
        if (all_done) return true;
        if (!resolve(b)) return false;
        (void)ran;
    }
}

}  // namespace

ThreadRegs *cur() {
    if (!g_cur) {
        fprintf(stderr, "cuda_emu: a CUDA built-in used outside a kernel\n");
        abort();
    }
    return g_cur;
}

void syncthreads() {
    Fiber *f = self("__syncthreads");
    f->state = AT_BARRIER;
    yield_to_scheduler();
}

const unsigned char *warp_exchange(unsigned mask, const void *mine, size_t n, const char *what) {
    Fiber *f = self(what);
    if (!(mask & (1u << f->regs.lane)))
        kernel_fail("%s: %s called %s with a mask (0x%08x) that leaves out its own lane %u",
                    describe(*f).c_str(), what, what, mask, f->regs.lane);
    if (n > (size_t)kSlotBytes) kernel_fail("%s: %zu bytes exceed a slot", what, n);
    memcpy(f->slot, mine, n);
    f->mask = mask;
    f->what = what;
    f->state = AT_WARP;
    yield_to_scheduler();
    return f->result;
}

void syncwarp(unsigned mask) {
    unsigned char none = 0;
    (void)warp_exchange(mask, &none, 1, "__syncwarp");
}

unsigned ballot(unsigned mask, int pred) {
    int p = pred != 0;
    const unsigned char *s = warp_exchange(mask, &p, sizeof p, "__ballot_sync");
    unsigned r = 0;
    for (int k = 0; k < 32; ++k)
        if (mask & (1u << k)) {
            int v;
            memcpy(&v, s + k * kSlotBytes, sizeof v);
            if (v) r |= 1u << k;
        }
    return r;
}

void kernel_fail(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    Fiber *f = self("kernel_fail");
    BlockState *b = g_block;
    b->failed = true;
    b->failure = buf;
    f->state = DONE;  // never resumed
    ctx_swap(&f->ctx, &b->sched);
    abort();  // unreachable
}

unsigned char *dynamic_smem() { return self("dynamic shared memory")->regs.block->arena; }
size_t dynamic_smem_size() { return self("dynamic shared memory")->regs.block->arena_size; }

uint32_t smem_offset(const void *p) {
    BlockState *b = self("__cvta_generic_to_shared")->regs.block;
    const unsigned char *c = static_cast<const unsigned char *>(p);
    if (c < b->arena || c > b->arena + b->arena_size)
        kernel_fail("__cvta_generic_to_shared of %p: not in the block's dynamic shared memory "
                    "(static __shared__ variables have no shared address in the emulation)",
                    p);
    return (uint32_t)(c - b->arena);
}

unsigned char *smem_at(uint32_t addr, size_t n) {
    BlockState *b = self("shared memory access")->regs.block;
    if ((size_t)addr + n > b->arena_size)
        kernel_fail("shared access [%u, %zu) outside the %zu bytes of dynamic shared memory", addr,
                    (size_t)addr + n, b->arena_size);
    return b->arena + addr;
}

void smem_note_async_issue(uint32_t addr, size_t n) {
    Fiber *f = self("async copy");
    BlockState *b = f->regs.block;
    (void)smem_at(addr, n);
    const int32_t me = (int32_t)f->regs.linear;
    for (size_t i = addr; i < addr + n; ++i) {
        Shadow &s = b->shadow[i];
        if (s.read_epoch == b->epoch && s.reader != -1 && s.reader != me)
            kernel_fail("race: %s issues an async copy to shared byte %zu, which thread %d read since the last "
                        "__syncthreads (write after read: the copy may land before that read)",
                        describe(*f).c_str(), i, s.reader >= 0 ? s.reader : -1);
        s.in_flight++;
    }
}

void smem_note_async_complete(uint32_t addr, size_t n) {
    Fiber *f = self("async copy");
    BlockState *b = f->regs.block;
    for (size_t i = addr; i < addr + n; ++i) {
        Shadow &s = b->shadow[i];
        if (s.in_flight) s.in_flight--;
        s.writer = (int32_t)f->regs.linear;
        s.write_epoch = b->epoch;
    }
}

void smem_note_read(uint32_t addr, size_t n) {
    Fiber *f = self("shared read");
    BlockState *b = f->regs.block;
    (void)smem_at(addr, n);
    const int32_t me = (int32_t)f->regs.linear;
    for (size_t i = addr; i < addr + n; ++i) {
        Shadow &s = b->shadow[i];
        if (s.in_flight)
            kernel_fail("race: %s reads shared byte %zu while an async copy to it is in flight (no wait)",
                        describe(*f).c_str(), i);
        if (s.writer >= 0 && s.writer != me && s.write_epoch == b->epoch)
            kernel_fail("race: %s reads shared byte %zu, which thread %d's async copy wrote after the last "
                        "__syncthreads (read after write without a barrier)",
                        describe(*f).c_str(), i, s.writer);
        if (s.read_epoch != b->epoch) {
            s.reader = me;
            s.read_epoch = b->epoch;
        } else if (s.reader != me) {
            s.reader = -2;
        }
    }
}

const DeviceProfile &device() { return g_device; }
void set_device(const DeviceProfile &p) { g_device = p; }
const char *last_failure() { return g_last_failure.c_str(); }
long launches() { return g_launches; }
const std::vector<LaunchRecord> &launch_log() { return g_log; }
void clear_launch_log() { g_log.clear(); }

std::string kernel_name(const void *func) {
    Dl_info info;
    if (!dladdr(func, &info) || !info.dli_sname || info.dli_saddr != func) return "?";
    int st = 0;
    char *d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
    std::string r = (st == 0 && d) ? d : info.dli_sname;
    free(d);
    return r;
}

cudaError_t launch(const void *func, dim3 grid, dim3 block, size_t smem, cudaStream_t, BlockBody body, void *ctx) {
    g_launches++;
    g_log.push_back(LaunchRecord{func, grid, block, smem, cudaSuccess});
    const size_t rec = g_log.size() - 1;
    auto refuse = [&](cudaError_t e, const std::string &why) {
        g_last_failure = why;
        g_log[rec].result = e;
        if (g_sticky == cudaSuccess) g_sticky = e;
        return e;
    };
    const unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0)
        return refuse(cudaErrorInvalidConfiguration, "launch with a zero grid or block dimension");
    if (nthreads > (unsigned long long)g_device.max_threads_per_block || block.z > 64)
        return refuse(cudaErrorInvalidConfiguration, "block of " + std::to_string(nthreads) + " threads");
    if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
        return refuse(cudaErrorInvalidConfiguration, "grid beyond the device's limits");
    int limit = g_device.smem_per_block;
    auto it = g_max_dyn_smem.find(func);
    if (it != g_max_dyn_smem.end()) limit = it->second;
    if (smem > (size_t)limit)
        return refuse(cudaErrorInvalidValue, std::to_string(smem) + " bytes of dynamic shared memory, " +
                                                 "above the function's limit of " + std::to_string(limit) +
                                                 " (cudaFuncSetAttribute)");
    // A grid of more blocks than anyone tests with: a test shape error.
    const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    if (nblocks * nthreads > (1ull << 26))
        return refuse(cudaErrorInvalidConfiguration, "grid too large for the emulation (shape a test smaller)");

    const size_t stack_sz = stack_bytes();
    // Untouched until used (no zero fill of nthreads x 128 KiB per launch),
    // and kept for the next launch on this thread: a fresh allocation is an
    // mmap whose pages fault in again (page faults were half the time of
    // launch-heavy tests). A launch made while one runs gets its own.
    thread_local std::unique_ptr<char[]> cached;
    thread_local size_t cached_bytes = 0;
    std::unique_ptr<char[]> own;
    char *stacks;
    if (g_fiber) {
        own.reset(new char[nthreads * stack_sz]);
        stacks = own.get();
    } else {
        if (cached_bytes < nthreads * stack_sz) {
            cached.reset();
            cached.reset(new char[nthreads * stack_sz]);
            cached_bytes = nthreads * stack_sz;
        }
        stacks = cached.get();
    }
    BlockState b;
    b.body = body;
    b.ctx = ctx;
    b.arena_size = smem;
    b.arena = static_cast<unsigned char *>(aligned_alloc(1024, (smem + 1023) / 1024 * 1024 + 1024));
    b.shadow.resize(smem);
    BlockState *saved_block = g_block;
    Fiber *saved_fiber = g_fiber;
    ThreadRegs *saved_cur = g_cur;
    bool ok = true;
    for (unsigned z = 0; z < grid.z && ok; ++z)
        for (unsigned y = 0; y < grid.y && ok; ++y)
            for (unsigned x = 0; x < grid.x && ok; ++x) {
                if (!run_block(b, grid, block, make_uint3(x, y, z), stacks, stack_sz)) {
                    char where[96];
                    snprintf(where, sizeof where, "block (%u,%u,%u): ", x, y, z);
                    g_last_failure = where + b.failure;
                    ok = false;
                }
            }
    g_block = saved_block;
    g_fiber = saved_fiber;
    g_cur = saved_cur;
    free(b.arena);
    if (!ok) {
        if (getenv("FP_EMU_VERBOSE")) fprintf(stderr, "cuda_emu: launch failed: %s\n", g_last_failure.c_str());
        if (g_sticky == cudaSuccess) g_sticky = cudaErrorLaunchFailure;
        g_log[rec].result = cudaErrorLaunchFailure;
        return cudaErrorLaunchFailure;
    }
    return cudaSuccess;
}

}  // namespace fp_emu

// ---------------------------------------------------------------------------
// The runtime API the launchers call, for the emulated device
// ---------------------------------------------------------------------------
using fp_emu::g_device;
using fp_emu::g_sticky;

extern "C" {

cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_sticky;
    g_sticky = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_sticky; }

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error (emulated)";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulated)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated)";
    default: return "error (emulated)";
    }
}
const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }

cudaError_t cudaGetDevice(int *dev) {
    *dev = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int dev) {
    if (dev != 0) return g_sticky = cudaErrorInvalidDevice;
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = g_device.sm_count; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = g_device.smem_per_block_optin; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = g_device.smem_per_block; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = g_device.smem_per_sm; break;
    case cudaDevAttrComputeCapabilityMajor: *value = g_device.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = g_device.minor; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = g_device.max_threads_per_block; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = g_device.max_threads_per_sm; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    default: return g_sticky = cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > g_device.smem_per_block_optin) return g_sticky = cudaErrorInvalidValue;
        fp_emu::g_max_dyn_smem[func] = value;
    }
    return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, const void *func) {
    memset(a, 0, sizeof *a);
    auto it = fp_emu::g_max_dyn_smem.find(func);
    a->maxDynamicSharedSizeBytes = it != fp_emu::g_max_dyn_smem.end() ? it->second : g_device.smem_per_block;
    a->maxThreadsPerBlock = g_device.max_threads_per_block;
    a->numRegs = 64;
    a->ptxVersion = a->binaryVersion = g_device.major * 10 + g_device.minor;
    return cudaSuccess;
}

// Occupancy: threads, shared memory and an assumed 64 registers a thread.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *, int threads, size_t smem,
                                                                   unsigned) {
    if (threads <= 0) return g_sticky = cudaErrorInvalidValue;
    int by_threads = g_device.max_threads_per_sm / threads;
    int by_regs = g_device.regs_per_sm / (threads * 64);
    int by_smem = smem ? (int)((size_t)g_device.smem_per_sm / (smem + 1024)) : 32;
    int r = by_threads < by_regs ? by_threads : by_regs;
    if (by_smem < r) r = by_smem;
    if (r > 32) r = 32;
    *n = r;
    return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *f, int threads, size_t smem) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, threads, smem, 0);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t) {
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

}  // extern "C"
