// The scheduler of the CUDA emulation (see cuda_emu.h) and the runtime API
// calls the library's launchers make, answered for the emulated device.
#include "cuda_emu.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <thread>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
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

enum ThreadState { RUNNABLE, AT_BARRIER, AT_WARP, AT_GROUP, SPINNING, AT_NAMED, DONE };

struct ExtState {
    const void *key;
    void *ptr;
    void (*destroy)(void *);
};

struct Fiber {
    ThreadRegs regs;
    Context ctx;
    ThreadState state;
    unsigned mask;           // AT_WARP: the collective's mask
    const char *what;        // AT_WARP: the collective's name
    const char *barrier_at;  // AT_BARRIER: "__syncthreads"
    unsigned group_first, group_count;  // AT_GROUP: the threads [first, first + count)
    unsigned named_id;                  // AT_NAMED: the named barrier
    uint32_t proxy_fence;               // the block's proxy clock at this thread's last fence.proxy.async
    const unsigned char *result;
    unsigned char slot[kSlotBytes];
    std::vector<ExtState> ext;  // thread_ext
    std::vector<std::pair<void (*)(void *), void *>> exit_hooks;  // at_thread_exit
    bool pdl_entered;  // called pdl_enter (griddepcontrol.wait)
    bool spun;         // its last run ended in a spin-wait (FP_EMU_GREEDY skips it
                       // until an event that may end the wait: spun_at != wakes)
    unsigned long spun_at;  // the block's wakes when it spun
    bool global_wait;       // SPINNING in spin_yield_global: waits on another block
};

// Shadow of one arena byte. Threads are numbered within the block (at most
// 1024): 16 bits, so that a record is 32 bytes, two to a cache line (the
// shadow walks of a wgmma's operands are the emulation's hottest loops).
struct Shadow {
    uint32_t write_epoch = 0;   // block barrier epoch of the async copy's write
    uint32_t read_epoch = 0;
    uint32_t write_named = 0;   // named-barrier completions in the block before that write
    uint32_t gwrite_clock = 0;  // the block's proxy clock at the generic write
    uint32_t read_named = 0;    // named-barrier completions in the block before the (latest) read
    int16_t writer = -1;        // thread that last wrote by an async copy (-1 none)
    int16_t reader = -1;        // last thread that read it by a collective (-1 none, -2 several,
                                // -(3 + w) a wgmma of warpgroup w)
    int16_t gwriter = -1;       // last generic-proxy writer (cp.async, st.shared), -1 none
    uint16_t in_flight = 0;     // async copies issued and not landed
    uint16_t pending_reads = 0; // reads an issued, unretired async operation (wgmma) will make
};
static_assert(sizeof(Shadow) == 32, "a shadow record: two to a cache line");

// A completed named barrier: its sequence number and the threads that took
// part (bitset), which it orders.
struct NamedEvent {
    uint32_t seq;
    std::vector<uint64_t> members;
};

}  // namespace

struct BlockState {
    std::vector<Fiber> fibers;
    size_t live = 0;  // fibers not DONE (start_block sets it, mark_done counts down)
    Context sched;
    unsigned char *arena = nullptr;
    size_t arena_size = 0;
    std::vector<Shadow> shadow;
    size_t shadow_used = 0;            // shadow[shadow_used..] untouched since the block began
    uint32_t epoch = 0;
    unsigned nwarps = 0;
    std::vector<unsigned char> snap;   // per warp: 32 slots, copied at release
    std::vector<unsigned char> gsnap;  // per thread: its slot, copied at a group release
    unsigned long progress = 0;        // events that may satisfy a spin-wait
    unsigned long idle_passes = 0;     // passes in which only spinners ran, without progress
    unsigned long wakes = 0;           // events a spin-wait may wait for (note_progress, a thread's
                                       // exit, a named barrier's completion): FP_EMU_GREEDY's spinners
    unsigned nb_count[16] = {0}, nb_arrived[16] = {0};  // named barriers
    std::vector<uint64_t> nb_members[16];               // threads arrived in the current phase
    uint32_t nb_seq = 0;                                // named-barrier completions so far
    uint32_t proxy_clock = 0;                           // generic writes and proxy fences so far
    std::vector<NamedEvent> nb_log;                     // completions since the last __syncthreads
    std::vector<ExtState> ext;                          // block_ext
    std::vector<std::pair<void (*)(void *), void *>> exit_hooks;  // at_block_exit
    BlockBody body = nullptr;
    void *ctx = nullptr;
    bool reverse = false;  // FP_EMU_REVERSE: each pass runs the threads from the last
    bool greedy = false;   // FP_EMU_GREEDY: a pass runs one warp (run_block)
    bool pdl = false;      // the launch has programmatic stream serialization (pdl_require)
    bool failed = false;
    std::string failure;
};

namespace {

DeviceProfile g_h100 = {9, 0, 132, 1024, 2048, 48 * 1024, 227 * 1024, 228 * 1024, 65536};
DeviceProfile g_a100 = {8, 0, 108, 1024, 2048, 48 * 1024, 163 * 1024, 164 * 1024, 65536};
// FP_EMU_SM=80: the A100 profile; FP_EMU_SM_COUNT=n (1..1024): n SMs
// instead of the profile's (persistent kernels then run several items a CTA)
DeviceProfile g_device = [] {
    const char *e = getenv("FP_EMU_SM");
    DeviceProfile d = (e && atoi(e) == 80) ? g_a100 : g_h100;
    const char *n = getenv("FP_EMU_SM_COUNT");
    if (n && atoi(n) >= 1 && atoi(n) <= 1024) d.sm_count = atoi(n);
    return d;
}();

std::mutex g_state_mu;  // the three below: kernels run on stream worker threads
std::string g_last_failure;
std::vector<LaunchRecord> g_log;  // under g_state_mu
std::map<const void *, int> g_max_dyn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize
thread_local cudaError_t g_sticky = cudaSuccess;  // cudaGetLastError's error (per host thread)
std::atomic<int> g_device_error{cudaSuccess};    // a kernel failed (any thread)
std::atomic<long> g_launches{0};

void set_failure(const std::string &why) {
    std::lock_guard<std::mutex> lk(g_state_mu);
    g_last_failure = why;
}

size_t stack_bytes() {
    const char *e = getenv("FP_EMU_STACK_KB");
    long kb = e ? atol(e) : 128;
    if (kb < 16) kb = 16;
    return (size_t)kb * 1024;
}

thread_local BlockState *g_block = nullptr;
thread_local Fiber *g_fiber = nullptr;

// A thread's end (its body returned, or it failed): DONE, counted.
void mark_done(BlockState *b, Fiber *f) {
    if (f->state != DONE) b->live--;
    f->state = DONE;
}

void fiber_entry() {
    BlockState *b = g_block;
    b->body(b->ctx);
    Fiber *f = g_fiber;
    if (b->pdl && !f->pdl_entered)
        kernel_fail("launched with programmatic dependent launch, a thread exited without fp_pdl::enter() "
                    "(griddepcontrol.wait): whatever it read may have been its predecessor's output before "
                    "it was written (kernels/common/pdl.cuh)");
    // Exit checks, in the thread's context (they may fail the launch): its
    // own, then the block's when it is the last thread to exit.
    std::vector<std::pair<void (*)(void *), void *>> hooks;
    hooks.swap(f->exit_hooks);
    for (auto &h : hooks) h.first(h.second);
    if (b->live == 1) {
        hooks.clear();
        hooks.swap(b->exit_hooks);
        for (auto &h : hooks) h.first(h.second);
    }
    mark_done(b, f);
    b->progress++;
    b->wakes++;
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

void clear_ext(BlockState &b) {
    for (Fiber &f : b.fibers) {
        for (ExtState &e : f.ext) e.destroy(e.ptr);
        f.ext.clear();
        f.exit_hooks.clear();
    }
    b.exit_hooks.clear();
    for (ExtState &e : b.ext) e.destroy(e.ptr);
    b.ext.clear();
}

// After a pass in which every runnable fiber ran until it blocked: release
// the block barrier or warp collectives whose participants have all arrived.
// Returns false (and records why) on a deadlock.
std::string deadlock_message(const BlockState &b, size_t live, size_t at_bar);
bool resolve(BlockState &b) {
    const size_t live = b.live;
    if (live == 0) return true;
    size_t at_bar = 0;
    for (const Fiber &f : b.fibers)
        if (f.state == AT_BARRIER) at_bar++;
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
        b.nb_log.clear(); // the epoch orders everything before it
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
    // Group collectives (a warpgroup, ...): every thread of the range.
    for (size_t i = 0; i < b.fibers.size(); ++i) {
        Fiber &f = b.fibers[i];
        if (f.state != AT_GROUP || f.group_first != i) continue;
        bool all = true;
        for (unsigned k = f.group_first; k < f.group_first + f.group_count; ++k) {
            Fiber &g = b.fibers[k];
            if (g.state == DONE) {
                b.failure = describe(f) + ": " + f.what + " over threads [" + std::to_string(f.group_first) + ", " +
                            std::to_string(f.group_first + f.group_count) + "), but thread " + std::to_string(k) +
                            " has exited";
                return false;
            }
            if (g.state != AT_GROUP) {
                all = false;
                continue;
            }
            if (g.group_first != f.group_first || g.group_count != f.group_count || strcmp(g.what, f.what) != 0) {
                b.failure = describe(f) + ": " + f.what + " met thread " + std::to_string(k) + " at " + g.what +
                            " over another range";
                return false;
            }
        }
        if (!all) continue;
        for (unsigned k = f.group_first; k < f.group_first + f.group_count; ++k) {
            memcpy(&b.gsnap[(size_t)k * kSlotBytes], b.fibers[k].slot, kSlotBytes);
            b.fibers[k].state = RUNNABLE;
            b.fibers[k].result = &b.gsnap[(size_t)f.group_first * kSlotBytes];
        }
        released = true;
    }
    for (const Fiber &f : b.fibers)
        if (f.state == RUNNABLE) released = true; // released during the pass (a named barrier)
    if (released) {
        b.progress++;
        for (Fiber &f : b.fibers)
            if (f.state == SPINNING) f.state = RUNNABLE;
        return true;
    }
    // Spinners may wait on something another thread will do: let them spin,
    // until a long run of passes saw no event that could end a wait.
    size_t spinning = 0;
    for (Fiber &f : b.fibers)
        if (f.state == SPINNING) spinning++;
    if (spinning > 0 && b.idle_passes < 10000) {
        for (Fiber &f : b.fibers)
            if (f.state == SPINNING) f.state = RUNNABLE;
        return true;
    }
    b.failure = deadlock_message(b, live, at_bar);
    return false;
}

// Who waits where in a block nobody can move.
std::string deadlock_message(const BlockState &b, size_t live, size_t at_bar) {
    std::string why = "deadlock: ";
    size_t shown = 0;
    for (const Fiber &f : b.fibers) {
        if (f.state == DONE) continue;
        if (shown++ == 4) {
            why += ", ...";
            break;
        }
        if (shown > 1) why += ", ";
        why += describe(f) + (f.state == AT_BARRIER ? " at __syncthreads"
                              : f.state == SPINNING ? std::string(" spinning in ") + f.what
                                                    : std::string(" at ") + f.what);
    }
    if (at_bar > 0 && at_bar < live)
        why = "divergent __syncthreads: " + std::to_string(at_bar) + " of " + std::to_string(live) +
              " live threads reached it (" + why + ")";
    return why;
}

// Sets b up to run block bid (its threads' fibers on `stacks`).
void start_block(BlockState &b, dim3 grid, dim3 block, uint3 bid, char *stacks, size_t stack_sz) {
    const unsigned nthreads = block.x * block.y * block.z;
    clear_ext(b);
    // Sized once per launch (every block of a grid has the same shape); the
    // per-thread fields are set below.
    if (b.fibers.size() != nthreads) b.fibers.resize(nthreads);
    b.live = nthreads;
    if (b.gsnap.size() != (size_t)nthreads * kSlotBytes) b.gsnap.resize((size_t)nthreads * kSlotBytes);
    b.progress = 0;
    b.idle_passes = 0;
    b.nwarps = (nthreads + 31) / 32;
    if (b.snap.size() != (size_t)b.nwarps * 32 * kSlotBytes) b.snap.resize((size_t)b.nwarps * 32 * kSlotBytes);
    b.epoch = 1;
    b.failed = false;
    for (int i = 0; i < 16; ++i) {
        b.nb_count[i] = b.nb_arrived[i] = 0;
        b.nb_members[i].assign((nthreads + 63) / 64, 0);
    }
    b.nb_seq = 0;
    b.nb_log.clear();
    b.proxy_clock = 0;
    memset(b.arena, 0xFF, b.arena_size);
    // (only what the last block touched, as far as smem_at saw: most blocks
    // of a large grid of short sequences never copy asynchronously)
    for (size_t i = 0; i < b.shadow_used; ++i) b.shadow[i] = Shadow{};
    b.shadow_used = 0;
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
        f.pdl_entered = false;
        f.spun = false;
        f.spun_at = 0;
        f.global_wait = false;
        f.mask = 0;
        f.what = "";
        f.result = nullptr;
        ctx_make(&f.ctx, &stacks[(size_t)i * stack_sz], stack_sz, fiber_entry);
    }
}

// Passes a block that waits on another block (spin_yield_global) makes with
// no progress before the grid's scheduler runs another block.
constexpr unsigned long kStallPasses = 64;
enum class Slice { DONE, FAILED, STALLED };

// Runs b (started by start_block, or stalled before) until it ends, fails
// (b.failure says why), or, when every live thread that is not at a barrier
// spins on another block's work (spin_yield_global) and kStallPasses passes
// went by with no progress, stalls: the launch runs another block and comes
// back. *moved: whether anything happened in the block this time.
Slice run_slice(BlockState &b, bool *moved) {
    *moved = false;
    b.idle_passes = 0;
    g_block = &b;
    for (;;) {
        bool ran = false;
        const unsigned long progress_before = b.progress;
        bool only_spinners = true;
        const bool reverse = b.reverse;
        // FP_EMU_GREEDY: the pass runs only the first warp (in the pass's
        // order) with a runnable thread that did not just spin, so each warp
        // runs as far as it can (through its own collectives, to a block or
        // named barrier or a wait on another warp) before the next moves:
        // the most skew between warps, where the passes otherwise keep them
        // in lock step from one sync point to the next. A warp that
        // reads a shared word after another warp rewrote it without a
        // barrier between (a buffer reused too early) then reads the new
        // value. A spinner is passed over until an event that may end its
        // wait (an arrival, a release), then runs first if it is the lowest
        // warp (a producer released early overwrites the stage at once).
        // Only spinners left: a full pass.
        long only_warp = -1;
        if (b.greedy) {
            for (size_t k = 0; k < b.fibers.size() && only_warp < 0; ++k) {
                const Fiber &f = b.fibers[reverse ? b.fibers.size() - 1 - k : k];
                if (f.state == RUNNABLE && (!f.spun || f.spun_at != b.wakes))
                    only_warp = (long)(f.regs.linear / 32);
            }
        }
        for (size_t k = 0; k < b.fibers.size(); ++k) {
            Fiber &f = b.fibers[reverse ? b.fibers.size() - 1 - k : k];
            if (f.state != RUNNABLE) continue;
            if (only_warp >= 0 && (long)(f.regs.linear / 32) != only_warp) continue;
            g_fiber = &f;
            g_cur = &f.regs;
            ctx_swap(&b.sched, &f.ctx);
            g_fiber = nullptr;
            g_cur = nullptr;
            ran = true;
            f.spun = f.state == SPINNING;
            f.spun_at = b.wakes;
            if (f.state != SPINNING) only_spinners = false;
            if (b.failed) return Slice::FAILED;
        }
        if (b.live == 0) {
            // A named barrier left with a phase begun (bar.arrive without
            // the matching bar.sync, or the reverse): a schedule whose
            // arrivals do not balance, which on a GPU carries over into
            // whatever the SM runs next with that barrier.
            for (unsigned id = 0; id < 16; ++id)
                if (b.nb_arrived[id]) {
                    b.failure = "named barrier " + std::to_string(id) + " left with " +
                                std::to_string(b.nb_arrived[id]) + " of " + std::to_string(b.nb_count[id]) +
                                " threads arrived when the block exited";
                    return Slice::FAILED;
                }
            *moved = true;
            return Slice::DONE;
        }
        if (only_spinners && b.progress == progress_before) {
            b.idle_passes++;
        } else {
            b.idle_passes = 0;
            *moved = true;
        }
        if (b.idle_passes >= kStallPasses) {
            // Only spinners: if every one waits on another block, let the
            // launch run other blocks (their work may end the wait).
            bool global = true, any = false;
            for (const Fiber &f : b.fibers)
                if (f.state == SPINNING) {
                    any = true;
                    if (!f.global_wait) global = false;
                }
            if (any && global) return Slice::STALLED;
        }
        if (!resolve(b)) return Slice::FAILED;
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

const unsigned char *group_exchange(unsigned first, unsigned count, const void *mine, size_t n, const char *what) {
    Fiber *f = self(what);
    BlockState *b = f->regs.block;
    if (count == 0 || (size_t)first + count > b->fibers.size() || f->regs.linear < first ||
        f->regs.linear >= first + count)
        kernel_fail("%s: %s over threads [%u, %u) that do not include it (block of %zu)", describe(*f).c_str(), what,
                    first, first + count, b->fibers.size());
    if (n > (size_t)kSlotBytes) kernel_fail("%s: %zu bytes exceed a slot", what, n);
    memcpy(f->slot, mine, n);
    f->group_first = first;
    f->group_count = count;
    f->what = what;
    f->state = AT_GROUP;
    yield_to_scheduler();
    return f->result;
}

void spin_yield(const char *what) {
    Fiber *f = self(what);
    f->what = what;
    f->state = SPINNING;
    f->global_wait = false;
    yield_to_scheduler();
}

void spin_yield_global(const char *what) {
    Fiber *f = self(what);
    f->what = what;
    f->state = SPINNING;
    f->global_wait = true;
    yield_to_scheduler();
    f->global_wait = false;
}

void note_progress() {
    Fiber *f = self("note_progress");
    f->regs.block->progress++;
    f->regs.block->wakes++;
}

void *thread_ext(const void *key, void *(*make)(), void (*destroy)(void *)) {
    Fiber *f = self("thread_ext");
    for (ExtState &e : f->ext)
        if (e.key == key) return e.ptr;
    f->ext.push_back(ExtState{key, make(), destroy});
    return f->ext.back().ptr;
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
    mark_done(b, f);  // never resumed
    ctx_swap(&f->ctx, &b->sched);
    abort();  // unreachable
}

void pdl_enter() { self("fp_pdl::enter")->pdl_entered = true; }

void pdl_require(const char *what) {
    Fiber *f = self(what);
    if (f->regs.block->pdl && !f->pdl_entered)
        kernel_fail("launched with programmatic dependent launch, a thread issued %s before fp_pdl::enter() "
                    "(griddepcontrol.wait): it may read its predecessor's output before it is written "
                    "(kernels/common/pdl.cuh)",
                    what);
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
    // Every shadow update goes through here first: the next block resets
    // the shadow up to the highest byte touched.
    if ((size_t)addr + n > b->shadow_used) b->shadow_used = (size_t)addr + n;
    return b->arena + addr;
}

// The two races of an async copy against an unretired wgmma's reads.
[[noreturn]] static void fail_copy_over_pending_read(const Fiber &f, size_t byte) {
    kernel_fail("race: %s issues an async copy to shared byte %zu, which a wgmma not yet retired "
                "(wgmma.wait_group) reads",
                describe(f).c_str(), byte);
}
[[noreturn]] static void fail_landing_under_pending_read(size_t byte) {
    kernel_fail("race: an async copy lands on shared byte %zu, which a wgmma issued before it landed reads", byte);
}

// The reader recorded for a wgmma's reads (smem_note_read_wgmma_retire): its
// warpgroup, -(3 + warpgroup), not the thread.
static int32_t wgmma_reader(int32_t linear) { return -(3 + linear / 128); }
static std::string describe_reader(int32_t r) {
    if (r >= 0) return "thread " + std::to_string(r);
    if (r == -2) return "several threads";
    return "a wgmma of warpgroup " + std::to_string(-r - 3);
}

static bool named_orders(const BlockState *b, uint32_t since, int32_t w, int32_t r);

// An async copy issued / landed. Copies ordered by __syncthreads (cp.async)
// also check and record against the block's barrier epochs; the mbarrier
// variants (TMA) only track bytes in flight and unretired wgmma reads.
static void async_issue(uint32_t addr, size_t n, bool barrier_ordered) {
    Fiber *f = self("async copy");
    BlockState *b = f->regs.block;
    (void)smem_at(addr, n);
    const int32_t me = (int32_t)f->regs.linear;
    for (size_t i = addr; i < addr + n; ++i) {
        Shadow &s = b->shadow[i];
        if (barrier_ordered && s.read_epoch == b->epoch && s.reader != -1 && s.reader != me &&
            s.reader != wgmma_reader(me) && !(s.reader >= 0 && named_orders(b, s.read_named, s.reader, me)))
            kernel_fail("race: %s issues an async copy to shared byte %zu, which %s read since the last "
                        "__syncthreads (write after read: the copy may land before that read)",
                        describe(*f).c_str(), i, describe_reader(s.reader).c_str());
        if (s.pending_reads) fail_copy_over_pending_read(*f, i);
        s.in_flight++;
    }
}
static void async_complete(uint32_t addr, size_t n, bool barrier_ordered) {
    Fiber *f = self("async copy");
    BlockState *b = f->regs.block;
    for (size_t i = addr; i < addr + n; ++i) {
        Shadow &s = b->shadow[i];
        if (s.pending_reads) fail_landing_under_pending_read(i);
        if (s.in_flight) s.in_flight--;
        // the bytes' earlier reads were ordered before the copy's issue (its
        // write-after-read check) or fail there: later reads are of these bytes
        s.reader = -1;
        if (!barrier_ordered) continue;
        s.writer = (int16_t)f->regs.linear;
        s.write_epoch = b->epoch;
        s.write_named = b->nb_seq;
    }
}

void smem_note_async_issue(uint32_t addr, size_t n) { async_issue(addr, n, true); }

void smem_note_async_complete(uint32_t addr, size_t n) {
    async_complete(addr, n, true);
    smem_note_generic_write(addr, n); // cp.async writes through the generic proxy
}

void smem_note_generic_write(uint32_t addr, size_t n) {
    Fiber *f = self("generic shared write");
    BlockState *b = f->regs.block;
    (void)smem_at(addr, n);
    const uint32_t clock = ++b->proxy_clock;
    for (size_t i = addr; i < addr + n; ++i) {
        b->shadow[i].gwriter = (int16_t)f->regs.linear;
        b->shadow[i].gwrite_clock = clock;
    }
}

void fence_proxy_async() {
    Fiber *f = self("fence.proxy.async");
    f->proxy_fence = ++f->regs.block->proxy_clock;
}

// Whether a named barrier completed after `since` orders thread w's accesses
// before thread r's (both took part).
// (The log is in completion order: walked from the newest back to `since`.)
static bool named_orders(const BlockState *b, uint32_t since, int32_t w, int32_t r) {
    for (auto it = b->nb_log.rbegin(); it != b->nb_log.rend() && it->seq > since; ++it)
        if ((it->members[(size_t)w / 64] >> (w % 64) & 1) && (it->members[(size_t)r / 64] >> (r % 64) & 1))
            return true;
    return false;
}

void smem_note_async_issue_mbar(uint32_t addr, size_t n) { async_issue(addr, n, false); }

void smem_note_async_complete_mbar(uint32_t addr, size_t n) { async_complete(addr, n, false); }

static void note_read(uint32_t addr, size_t n, bool wgmma, bool check = true, bool record = true,
                      const char *retire = nullptr);
static void pending_read(uint32_t addr, size_t n, int delta, const char *what) {
    Fiber *f = self("pending shared read");
    BlockState *b = f->regs.block;
    (void)smem_at(addr, n);
    for (size_t i = addr; i < addr + n; ++i) {
        Shadow &s = b->shadow[i];
        if (delta > 0 && s.in_flight)
            kernel_fail("race: %s issues %s reading shared byte %zu while an async copy to it is in flight",
                        describe(*f).c_str(), what, i);
        if (delta > 0 && s.gwriter >= 0 && b->fibers[(size_t)s.gwriter].proxy_fence < s.gwrite_clock &&
            f->proxy_fence < s.gwrite_clock)
            kernel_fail("%s issues %s (async proxy) reading shared byte %zu, which thread %d wrote through the "
                        "generic proxy with no fence.proxy.async after it (by the writer or this thread)",
                        describe(*f).c_str(), what, i, s.gwriter);
        if (delta < 0 && s.pending_reads == 0)
            kernel_fail("%s: %s retires a read of shared byte %zu never issued", describe(*f).c_str(), what, i);
        s.pending_reads = (uint16_t)(s.pending_reads + delta);
    }
}
void smem_note_pending_read(uint32_t addr, size_t n, int delta) { pending_read(addr, n, delta, "a wgmma"); }

void smem_note_async_read(uint32_t addr, size_t n, int delta, const char *what) {
    // issue: the read-after-write checks; retire: the read recorded as this
    // thread's (a thread that waited for it), for later async copies' checks
    if (delta < 0) return note_read(addr, n, false, false, true, what);
    note_read(addr, n, false, true, false);
    pending_read(addr, n, delta, what);
}

void smem_note_store(uint32_t addr, size_t n) {
    Fiber *f = self("shared store");
    BlockState *b = f->regs.block;
    (void)smem_at(addr, n);
    for (size_t i = addr; i < addr + n; ++i) {
        Shadow &s = b->shadow[i];
        if (s.in_flight)
            kernel_fail("race: %s stores to shared byte %zu while an async copy to it is in flight",
                        describe(*f).c_str(), i);
        if (s.pending_reads)
            kernel_fail("race: %s stores to shared byte %zu, which an issued async-proxy read (a wgmma not yet "
                        "retired, a bulk store not yet waited for) still reads",
                        describe(*f).c_str(), i);
        s.writer = (int16_t)f->regs.linear;
        s.write_epoch = b->epoch;
        s.write_named = b->nb_seq;
    }
    smem_note_generic_write(addr, n);
}

void at_thread_exit(void (*fn)(void *), void *arg) { self("at_thread_exit")->exit_hooks.emplace_back(fn, arg); }
void at_block_exit(void (*fn)(void *), void *arg) {
    self("at_block_exit")->regs.block->exit_hooks.emplace_back(fn, arg);
}

void *block_ext(const void *key, void *(*make)(), void (*destroy)(void *)) {
    BlockState *b = self("block_ext")->regs.block;
    for (ExtState &e : b->ext)
        if (e.key == key) return e.ptr;
    b->ext.push_back(ExtState{key, make(), destroy});
    return b->ext.back().ptr;
}

static void named_barrier(unsigned id, unsigned count, bool wait, const char *what) {
    Fiber *f = self(what);
    BlockState *b = f->regs.block;
    if (id >= 16) kernel_fail("%s: %s with barrier id %u (0..15)", describe(*f).c_str(), what, id);
    if (count == 0 || count % 32 || count > b->fibers.size())
        kernel_fail("%s: %s %u, %u: the thread count must be a multiple of 32 within the block (%zu)",
                    describe(*f).c_str(), what, id, count, b->fibers.size());
    if (b->nb_arrived[id] == 0) b->nb_count[id] = count;
    else if (b->nb_count[id] != count)
        kernel_fail("%s: %s %u with %u threads while the barrier's phase counts %u", describe(*f).c_str(), what, id,
                    count, b->nb_count[id]);
    b->nb_members[id][f->regs.linear / 64] |= 1ull << (f->regs.linear % 64);
    if (++b->nb_arrived[id] == count) {
        b->nb_arrived[id] = 0;
        for (Fiber &g : b->fibers)
            if (g.state == AT_NAMED && g.named_id == id) g.state = RUNNABLE;
        b->nb_log.push_back(NamedEvent{++b->nb_seq, b->nb_members[id]});
        std::fill(b->nb_members[id].begin(), b->nb_members[id].end(), 0);
        b->progress++;
        b->wakes++;
        return;
    }
    if (!wait) return;
    f->named_id = id;
    f->what = what;
    f->state = AT_NAMED;
    yield_to_scheduler();
}
void named_barrier_sync(unsigned id, unsigned count) { named_barrier(id, count, true, "bar.sync"); }
void named_barrier_arrive(unsigned id, unsigned count) { named_barrier(id, count, false, "bar.arrive"); }

static std::map<std::string, void *> &driver_symbols() {
    static std::map<std::string, void *> m;
    return m;
}
bool register_driver_symbol(const char *name, void *fn) {
    driver_symbols()[name] = fn;
    return true;
}
void *driver_symbol(const char *name) {
    auto it = driver_symbols().find(name);
    return it == driver_symbols().end() ? nullptr : it->second;
}

// check: the read-after-write checks; record: the read noted for the
// write-after-read check of later async copies (one reader per byte and
// epoch, forgotten when an async copy lands on the byte; a second reader
// makes the byte read by several threads, except that a thread's read (not a
// wgmma's) replaces an earlier reader a named barrier orders before it (an
// earlier wgmma read: its warpgroup's first thread stands for it): the
// reuse of a Q buffer through a TMA store's read). retire (not null): also
// retires a pending read of each byte by `retire` (pending_read's -1, in the
// same pass over the shadow: a wgmma's operands are noted by each of the
// warpgroup's 128 threads, the emulation's hottest loop).
static void note_read(uint32_t addr, size_t n, bool wgmma, bool check, bool record, const char *retire) {
    Fiber *f = self("shared read");
    BlockState *b = f->regs.block;
    (void)smem_at(addr, n);
    const int32_t me = (int32_t)f->regs.linear, reader = wgmma ? wgmma_reader(me) : me;
    for (size_t i = addr; i < addr + n; ++i) {
        Shadow &s = b->shadow[i];
        if (check && s.in_flight)
            kernel_fail("race: %s reads shared byte %zu while an async copy to it is in flight (no wait)",
                        describe(*f).c_str(), i);
        if (check && s.writer >= 0 && s.writer != me && s.write_epoch == b->epoch &&
            !named_orders(b, s.write_named, s.writer, me))
            kernel_fail("race: %s reads shared byte %zu, which thread %d's async copy or store wrote after the "
                        "last __syncthreads (read after write without a barrier)",
                        describe(*f).c_str(), i, s.writer);
        if (retire) {
            if (s.pending_reads == 0)
                kernel_fail("%s: %s retires a read of shared byte %zu never issued", describe(*f).c_str(), retire, i);
            s.pending_reads--;
        }
        if (!record) continue;
        if (s.read_epoch != b->epoch || s.reader == -1 || s.reader == reader) {
            s.reader = (int16_t)reader;
            s.read_epoch = b->epoch;
            s.read_named = b->nb_seq;
        } else if (!wgmma && s.reader != -2 &&
                   named_orders(b, s.read_named, s.reader >= 0 ? s.reader : (-s.reader - 3) * 128, me)) {
            s.reader = (int16_t)reader;
            s.read_named = b->nb_seq;
        } else {
            s.reader = -2;
        }
    }
}
void smem_note_read(uint32_t addr, size_t n) { note_read(addr, n, false); }
void smem_note_read_wgmma_retire(uint32_t addr, size_t n) { note_read(addr, n, true, true, true, "a wgmma"); }

}  // namespace fp_emu

long long clock64() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 2 * ((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
}

namespace fp_emu {

void note_failure(const char *why) { set_failure(why); }

void device_fault(cudaError_t e) {
    int none = cudaSuccess;
    g_device_error.compare_exchange_strong(none, (int)e);
}

cudaError_t record_error(cudaError_t e) {
    if (e != cudaSuccess && g_sticky == cudaSuccess) g_sticky = e;
    return e;
}

const DeviceProfile &device() { return g_device; }
std::atomic<unsigned> g_device_generation{0};
void set_device(const DeviceProfile &p) {
    g_device = p;
    g_device_generation.fetch_add(1);
}
unsigned device_generation() { return g_device_generation.load(); }
const char *last_failure() {
    static thread_local std::string copy;
    std::lock_guard<std::mutex> lk(g_state_mu);
    copy = g_last_failure;
    return copy.c_str();
}
long launches() { return g_launches; }
const std::vector<LaunchRecord> &launch_log() { return g_log; }
void clear_launch_log() {
    std::lock_guard<std::mutex> lk(g_state_mu);
    g_log.clear();
}

std::string kernel_name(const void *func) {
    Dl_info info;
    if (!dladdr(func, &info) || !info.dli_sname || info.dli_saddr != func) return "?";
    int st = 0;
    char *d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &st);
    std::string r = (st == 0 && d) ? d : info.dli_sname;
    free(d);
    return r;
}

cudaError_t launch_check(const void *func, dim3 grid, dim3 block, size_t smem, size_t *record, bool pdl) {
    g_launches++;
    fp_emu_count_call(FP_EMU_CALL_LAUNCH);
    if (pdl) fp_emu_count_call(FP_EMU_CALL_LAUNCH_PDL);
    size_t rec;
    {
        std::lock_guard<std::mutex> lk(g_state_mu);
        g_log.push_back(LaunchRecord{func, grid, block, smem, cudaSuccess, pdl});
        rec = g_log.size() - 1;
    }
    if (record) *record = rec;
    auto refuse = [&](cudaError_t e, const std::string &why) {
        set_failure(why);
        {
            std::lock_guard<std::mutex> lk(g_state_mu);
            g_log[rec].result = e;
        }
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
    {
        std::lock_guard<std::mutex> lk(g_state_mu);
        auto it = g_max_dyn_smem.find(func);
        if (it != g_max_dyn_smem.end()) limit = it->second;
    }
    if (smem > (size_t)limit)
        return refuse(cudaErrorInvalidValue, std::to_string(smem) + " bytes of dynamic shared memory, " +
                                                 "above the function's limit of " + std::to_string(limit) +
                                                 " (cudaFuncSetAttribute)");
    // A grid of more blocks than anyone tests with: a test shape error.
    const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    if (nblocks * nthreads > (1ull << 26))
        return refuse(cudaErrorInvalidConfiguration, "grid too large for the emulation (shape a test smaller)");
    return cudaSuccess;
}

// Occupancy: threads, shared memory and an assumed 64 registers a thread.
static cudaError_t occupancy_uncounted(int *n, int threads, size_t smem) {
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
// An OS thread that runs what it is handed, one job at a time, while the
// handing thread waits: a resident block's own thread, so that its static
// __shared__ variables (thread_local statics) are its own while other
// blocks of the grid run (on other threads, never at the same time).
class Host {
  public:
    Host() : th_([this] { loop(); }) {}
    ~Host() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            quit_ = true;
        }
        cv_.notify_all();
        th_.join();
    }
    void run(const std::function<void()> &f) {
        std::unique_lock<std::mutex> lk(mu_);
        job_ = &f;
        cv_.notify_all();
        cv_.wait(lk, [this] { return job_ == nullptr; });
    }

  private:
    void loop() {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
            cv_.wait(lk, [this] { return quit_ || job_ != nullptr; });
            if (job_) {
                (*job_)();
                job_ = nullptr;
                cv_.notify_all();
                continue;
            }
            return;
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    const std::function<void()> *job_ = nullptr;
    bool quit_ = false;
    std::thread th_;  // last: started once the members above exist
};

cudaError_t launch_run(const void *, dim3 grid, dim3 block, size_t smem, BlockBody body, void *ctx, size_t rec,
                       bool pdl) {
    const unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
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
    const char *rev = getenv("FP_EMU_REVERSE");
    const bool reverse = rev && *rev && strcmp(rev, "0") != 0;
    const char *greedy_env = getenv("FP_EMU_GREEDY");
    const bool greedy = greedy_env && *greedy_env && strcmp(greedy_env, "0") != 0;
    // Blocks run one after another, each to its end, unless one stalls
    // waiting on another block's work (spin_yield_global: a grid-wide count
    // of arrivals): then it stays resident and the next block starts, up to
    // the blocks the device holds at once (the occupancy query's answer x
    // SMs), and the resident ones take turns until each ends. A wait no
    // resident block's work can end, with no room for the next block, is a
    // deadlock, as on a GPU.
    int per_sm = 1;
    (void)occupancy_uncounted(&per_sm, (int)nthreads, smem);
    const size_t capacity = (size_t)(per_sm < 1 ? 1 : per_sm) * (size_t)(g_device.sm_count < 1 ? 1 : g_device.sm_count);
    struct Resident {
        std::unique_ptr<BlockState> b;
        char *stacks;
        std::unique_ptr<char[]> own_stacks;  // all but the first resident block's
        Host *host;                           // its OS thread (nullptr: this one)
        uint3 bid;
    };
    std::vector<std::unique_ptr<Host>> hosts;  // made when a second block is resident
    std::vector<Host *> free_hosts;
    std::vector<Resident> resident;  // in start order
    std::vector<std::unique_ptr<char[]>> spare_stacks;
    auto new_state = [&]() {
        std::unique_ptr<BlockState> b(new BlockState);
        b->body = body;
        b->ctx = ctx;
        b->reverse = reverse;
        b->greedy = greedy;
        b->pdl = pdl;
        b->arena_size = smem;
        b->arena = static_cast<unsigned char *>(aligned_alloc(1024, (smem + 1023) / 1024 * 1024 + 1024));
        b->shadow.assign(smem, Shadow{});
        return b;
    };
    std::vector<std::unique_ptr<BlockState>> spare_states;
    BlockState *saved_block = g_block;
    Fiber *saved_fiber = g_fiber;
    ThreadRegs *saved_cur = g_cur;
    bool ok = true;
    const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    unsigned long long next = 0;
    unsigned long idle_rounds = 0;
    bool first_stacks_free = true;
    auto on_host = [](const Resident &r, const std::function<void()> &f) {
        if (r.host) r.host->run(f);
        else f();
    };
    auto start_next = [&]() {
        Resident r;
        if (!spare_states.empty()) {
            r.b = std::move(spare_states.back());
            spare_states.pop_back();
        } else {
            r.b = new_state();
        }
        if (first_stacks_free) {
            r.stacks = stacks;
            r.host = nullptr;
            first_stacks_free = false;
        } else {
            if (free_hosts.empty()) {
                hosts.emplace_back(new Host);
                free_hosts.push_back(hosts.back().get());
            }
            r.host = free_hosts.back();
            free_hosts.pop_back();
            if (!spare_stacks.empty()) {
                r.own_stacks = std::move(spare_stacks.back());
                spare_stacks.pop_back();
            } else {
                r.own_stacks.reset(new char[nthreads * stack_sz]);
            }
            r.stacks = r.own_stacks.get();
        }
        const unsigned long long i = next++;
        r.bid = make_uint3((unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y), (unsigned)(i / grid.x / grid.y));
        on_host(r, [&] { start_block(*r.b, grid, block, r.bid, r.stacks, stack_sz); });
        resident.push_back(std::move(r));
    };
    auto fail_at = [&](const Resident &r, const std::string &why) {
        char where[96];
        snprintf(where, sizeof where, "block (%u,%u,%u): ", r.bid.x, r.bid.y, r.bid.z);
        set_failure(where + why);
        ok = false;
    };
    // One slice of resident[k]: false when the launch failed; *done when the
    // block ended (then removed).
    auto slice = [&](size_t k, bool *moved, bool *done) {
        Resident &r = resident[k];
        Slice sl = Slice::FAILED;
        on_host(r, [&] { sl = run_slice(*r.b, moved); });
        *done = sl == Slice::DONE;
        if (sl == Slice::FAILED) {
            fail_at(r, r.b->failure);
            return false;
        }
        if (sl == Slice::DONE) {
            on_host(r, [&] { clear_ext(*r.b); });
            if (r.own_stacks) spare_stacks.push_back(std::move(r.own_stacks));
            else first_stacks_free = true;
            if (r.host) free_hosts.push_back(r.host);
            spare_states.push_back(std::move(r.b));
            resident.erase(resident.begin() + (long)k);
        }
        return true;
    };
    auto can_start = [&] { return next < nblocks && resident.size() < capacity; };
    // A block just started runs alone (to its end, as without waits, or
    // until it stalls, and then the next one starts): the stalled blocks are
    // run again only when no block can start, in turns, until each ends.
    bool fresh = false;  // resident.back() started and not yet run
    while (ok && (next < nblocks || !resident.empty())) {
        if (resident.empty()) {
            start_next();
            fresh = true;
        }
        if (fresh) {
            fresh = false;
            bool moved = false, done = false;
            if (!slice(resident.size() - 1, &moved, &done)) break;
            idle_rounds = 0;
            if (can_start()) {
                start_next();
                fresh = true;
            }
            continue;
        }
        bool moved_any = false;
        for (size_t k = 0; k < resident.size() && ok;) {
            bool moved = false, done = false;
            if (!slice(k, &moved, &done)) break;
            moved_any = moved_any || moved;
            if (!done) ++k;
        }
        if (!ok) break;
        if (resident.empty()) continue;
        // Every resident block is stalled on another block's work.
        if (can_start()) {
            start_next();
            fresh = true;
            idle_rounds = 0;
        } else if (moved_any) {
            idle_rounds = 0;
        } else if (++idle_rounds > 10000 / kStallPasses) {
            const BlockState &b0 = *resident.front().b;
            fail_at(resident.front(),
                    deadlock_message(b0, b0.live, 0) + " (waiting on other blocks: " + std::to_string(resident.size()) +
                        " resident, " + std::to_string(nblocks - next) + " not started, the device holds " +
                        std::to_string(capacity) + " at once)");
        }
    }
    for (Resident &r : resident) on_host(r, [&] { clear_ext(*r.b); });
    g_block = saved_block;
    g_fiber = saved_fiber;
    g_cur = saved_cur;
    for (Resident &r : resident) free(r.b->arena);
    for (auto &b : spare_states) free(b->arena);
    if (!ok) {
        if (getenv("FP_EMU_VERBOSE")) fprintf(stderr, "cuda_emu: launch failed: %s\n", last_failure());
        int none = cudaSuccess;
        g_device_error.compare_exchange_strong(none, cudaErrorLaunchFailure);
        {
            std::lock_guard<std::mutex> lk(g_state_mu);
            if (rec < g_log.size()) g_log[rec].result = cudaErrorLaunchFailure;
        }
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

// A failed kernel's error is the device's (every thread sees it), cleared by
// the first cudaGetLastError that reports it (on a GPU it would stay: the
// emulation lets a test go on after a launch it expects to fail).
cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_sticky;
    g_sticky = cudaSuccess;
    if (e == cudaSuccess) e = (cudaError_t)fp_emu::g_device_error.exchange(cudaSuccess);
    return e;
}
cudaError_t cudaPeekAtLastError(void) {
    return g_sticky != cudaSuccess ? g_sticky : (cudaError_t)fp_emu::g_device_error.load();
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error (emulated)";
    case cudaErrorInvalidValue: return "invalid argument (emulated)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulated)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (emulated)";
    case cudaErrorMemoryAllocation: return "out of memory (emulated)";
    default: return "error (emulated)";
    }
}
const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }

cudaError_t cudaGetDevice(int *dev) {
    fp_emu_count_call(FP_EMU_CALL_GET_DEVICE);
    *dev = fp_emu::current_device();
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int dev) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    if (dev < 0 || dev >= fp_emu::emulated_devices()) return cudaErrorInvalidDevice; /* not sticky, as CUDA's */
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
    case cudaDevAttrL2CacheSize: *value = 50 << 20; break;
    // H100 SXM: HBM3 at 2619 MHz on 5120 bits (3.35 TB/s), SMs at 1980 MHz.
    case cudaDevAttrMemoryClockRate: *value = 2619000; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = 5120; break;
    case cudaDevAttrClockRate: *value = 1980000; break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    default: return g_sticky = cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > g_device.smem_per_block_optin) return g_sticky = cudaErrorInvalidValue;
        std::lock_guard<std::mutex> lk(fp_emu::g_state_mu);
        fp_emu::g_max_dyn_smem[func] = value;
    }
    return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, const void *func) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    memset(a, 0, sizeof *a);
    std::lock_guard<std::mutex> lk(fp_emu::g_state_mu);
    auto it = fp_emu::g_max_dyn_smem.find(func);
    a->maxDynamicSharedSizeBytes = it != fp_emu::g_max_dyn_smem.end() ? it->second : g_device.smem_per_block;
    a->maxThreadsPerBlock = g_device.max_threads_per_block;
    a->numRegs = 64;
    a->ptxVersion = a->binaryVersion = g_device.major * 10 + g_device.minor;
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *, int threads, size_t smem,
                                                                   unsigned) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    return fp_emu::occupancy_uncounted(n, threads, smem);
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *, int threads, size_t smem) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    return fp_emu::occupancy_uncounted(n, threads, smem);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    fp_emu::submit_node(s, [=] { memset(p, v, n); }, cudaGraphNodeTypeMemset, nullptr);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t st) {
    if (!fp_emu::host_span_ok(d, n) || !fp_emu::host_span_ok(s, n)) return fp_emu::record_error(cudaErrorInvalidValue);
    fp_emu::submit_node(st, [=] { memmove(d, s, n); }, cudaGraphNodeTypeMemcpy, nullptr);
    return cudaSuccess;
}
// Driver entry points: the ones an emulation header registered
// (register_driver_symbol), else "symbol not found".
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult *status) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    *fn = fp_emu::driver_symbol(symbol);
    if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

}  // extern "C"
