// The rest of the CUDA runtime API the library's host code calls (contexts,
// memory, streams, events, graphs, memory pools, pinned memory), answered by
// the emulated device, so the library's own CUDA paths (src/**, fastbench,
// the `gpu` tests) run end to end on a machine without a GPU: libfastpath
// built with the emulated kernels (tests/emu/CMakeLists.txt: fastpath_emu).
//
// One device (FP_EMU_DEVICES=N for more), memory is host memory. Streams:
// with FP_EMU_ASYNC=1 (the library's `gpu` tests run so) every stream has a
// worker thread that runs its work in order while the host goes on, the
// legacy default stream synchronizes with the blocking streams as on a GPU,
// and events, cudaStreamWaitEvent and the synchronizing calls wait for real,
// so host code that reads a result before synchronizing, or reuses memory a
// stream still uses, meets the race it would meet on a GPU. Without it, work
// runs at once in the calling thread (kernel-level tests that call launchers
// and read the outputs straight after). Stream capture records launches,
// copies and event records into a graph that cudaGraphLaunch replays.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <set>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cuda_emu.h"

#undef warpSize  // the kernels' built-in; here the cudaDeviceProp field

namespace fp_emu {

namespace {

// A captured graph: its nodes in stream order (the capture of one stream is
// a chain), each with its CUDA node type, so cudaGraphGetNodes /
// cudaGraphNodeGetType / cudaGraphExecUpdate answer as for a chain on a GPU.
// Memory freed by cudaFreeAsync during the capture belongs to the graph (a
// graph's allocations keep their addresses across launches): released with
// the last graph or executable that shares it.
struct Node {
    cudaGraphNodeType type;
    const void *key;  // kernels: the function
    std::function<void()> op;
};
struct Owned {
    std::vector<void *> ptrs;
    ~Owned();
};
struct Graph {
    std::shared_ptr<std::vector<Node>> nodes = std::make_shared<std::vector<Node>>();
    std::shared_ptr<Owned> owned = std::make_shared<Owned>();
};
struct Stream {
    int device = 0;
    unsigned flags = 0;
    int priority = 0;
    bool capturing = false;
    bool capture_invalid = false;                      // an illegal call ended it
    cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
    std::thread::id capture_thread;
    Graph *graph = nullptr;  // capturing: the graph being built
    // Asynchronous mode: the worker runs q in order.
    std::mutex mu;
    std::condition_variable cv_work, cv_done;
    std::deque<std::function<void()>> q;
    uint64_t enqueued = 0, completed = 0;
    bool stop = false;
    std::thread worker;
};
struct Event {
    Stream *stream = nullptr;  // where it was last recorded (null: complete)
    uint64_t seq = 0;          // ... as that stream's seq-th operation
    std::atomic<double> t_ms{0};
    bool recorded = false;
    unsigned flags = 0;
    // The handle's reference and one per record not yet run (or held by a
    // captured graph): cudaEventDestroy of an event still pending in a
    // stream returns at once, as on a GPU, and the event goes with its last
    // record (the caching allocator destroys events it made a stream wait on).
    std::atomic<int> refs{1};
};
void event_release(Event *ev) {
    if (ev->refs.fetch_sub(1) == 1) delete ev;
}

std::mutex g_mu;
thread_local int g_device_current = 0;
std::unordered_map<void *, size_t> g_allocs;  // device allocations: size
std::map<const char *, size_t> g_host;         // page-locked host ranges (registered or cudaMallocHost)
size_t g_allocated = 0;
const size_t kTotalMem = (size_t)80 << 30;

int device_count() {
    const char *e = getenv("FP_EMU_DEVICES");
    int n = e ? atoi(e) : 1;
    return n < 0 ? 0 : n;
}

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::mutex g_streams_mu;
std::set<Stream *> g_streams;  // created streams (the legacy one is not in it)
// Live events, so that destroying a stream can detach the events last
// recorded on it: on a GPU an event outlives the stream it was recorded on
// (a caching allocator queries events recorded on streams destroyed since).
std::set<Event *> g_events;    // guarded by g_streams_mu

Stream *legacy() {
    static Stream *s = new Stream;  // never destroyed: its worker may outlive main
    return s;
}

// 0 and cudaStreamLegacy: the legacy stream; cudaStreamPerThread is taken
// as the legacy stream too (stronger ordering, never weaker).
Stream *as_stream(cudaStream_t s) {
    uintptr_t v = (uintptr_t)s;
    if (v <= 2) return legacy();
    return reinterpret_cast<Stream *>(s);
}

void worker_main(Stream *st) {
    std::unique_lock<std::mutex> lk(st->mu);
    for (;;) {
        st->cv_work.wait(lk, [st] { return st->stop || !st->q.empty(); });
        if (st->q.empty()) return;  // stop, and nothing left
        std::function<void()> op = std::move(st->q.front());
        st->q.pop_front();
        lk.unlock();
        op();
        lk.lock();
        st->completed++;
        st->cv_done.notify_all();
    }
}

// Appends op to st's queue; returns its sequence number.
uint64_t enqueue(Stream *st, std::function<void()> op) {
    std::lock_guard<std::mutex> lk(st->mu);
    if (!st->worker.joinable()) st->worker = std::thread(worker_main, st);
    st->q.push_back(std::move(op));
    st->cv_work.notify_one();
    return ++st->enqueued;
}
uint64_t mark(Stream *st) {
    std::lock_guard<std::mutex> lk(st->mu);
    return st->enqueued;
}
void wait_for(Stream *st, uint64_t seq) {
    std::unique_lock<std::mutex> lk(st->mu);
    st->cv_done.wait(lk, [&] { return st->completed >= seq; });
}
bool done(Stream *st, uint64_t seq) {
    std::lock_guard<std::mutex> lk(st->mu);
    return st->completed >= seq;
}
void drain(Stream *st) { wait_for(st, mark(st)); }

// Enqueues op on st with the legacy stream's implicit synchronization: work
// on the legacy stream waits for the blocking streams' earlier work, and
// work on a blocking stream for the legacy stream's. Returns op's sequence.
uint64_t enqueue_ordered(Stream *st, std::function<void()> op) {
    std::vector<std::pair<Stream *, uint64_t>> after;
    if (st == legacy()) {
        std::lock_guard<std::mutex> lk(g_streams_mu);
        for (Stream *o : g_streams)
            if (!(o->flags & cudaStreamNonBlocking)) after.emplace_back(o, mark(o));
    } else if (!(st->flags & cudaStreamNonBlocking)) {
        after.emplace_back(legacy(), mark(legacy()));
    }
    if (after.empty()) return enqueue(st, std::move(op));
    return enqueue(st, [after, op] {
        for (const auto &a : after) wait_for(a.first, a.second);
        op();
    });
}

cudaError_t device_error() { return cudaPeekAtLastError(); }

// The calling thread's device: its streams (and the legacy stream, shared
// by the emulated devices), as cudaDeviceSynchronize and cudaFree wait for
// on a GPU. Another device's streams are not waited for (with several
// ranks as threads, one blocked in a collective must not block the others'
// cudaFree).
void sync_device() {
    drain(legacy());
    std::vector<Stream *> all;
    {
        std::lock_guard<std::mutex> lk(g_streams_mu);
        for (Stream *o : g_streams)
            if (o->device == g_device_current) all.push_back(o);
    }
    for (Stream *o : all) drain(o);
}

// Device allocations are host allocations with guard bytes on both sides
// and 0xFF (NaN) contents, so a kernel that reads memory nobody wrote
// computes NaN; the free checks the guards (a write past either end fails it
// with cudaErrorIllegalAddress and a message in fp_emu::last_failure()).
const size_t kGuard = 256;

void *alloc_device(size_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_allocated + n > kTotalMem) return nullptr;
    unsigned char *m = static_cast<unsigned char *>(aligned_alloc(256, (n + 2 * kGuard + 255) / 256 * 256));
    if (!m) return nullptr;
    memset(m, 0xA5, kGuard);
    memset(m + kGuard, 0xFF, n);
    memset(m + kGuard + n, 0xA5, kGuard);
    g_allocs[m + kGuard] = n;
    g_allocated += n;
    return m + kGuard;
}
cudaError_t free_device(void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_allocs.find(p);
    if (it == g_allocs.end()) {
        note_failure("cudaFree of a pointer cudaMalloc did not return");
        return record_error(cudaErrorInvalidValue);
    }
    unsigned char *m = static_cast<unsigned char *>(p) - kGuard;
    const size_t n = it->second;
    g_allocated -= n;
    g_allocs.erase(it);
    for (size_t i = 0; i < kGuard; ++i)
        if (m[i] != 0xA5 || m[kGuard + n + i] != 0xA5) {
            char buf[160];
            snprintf(buf, sizeof buf, "cudaFree: the guard bytes %s an allocation of %zu bytes were overwritten",
                     m[i] != 0xA5 ? "before" : "after", n);
            note_failure(buf);
            free(m);
            return record_error(cudaErrorIllegalAddress);
        }
    free(m);
    return cudaSuccess;
}

Owned::~Owned() {
    for (void *p : ptrs) (void)free_device(p);
}

// Streams capturing now (the capture legality rules need all of them).
std::mutex g_capture_mu;
std::set<Stream *> g_capturing;

thread_local cudaStreamCaptureMode g_thread_mode = cudaStreamCaptureModeGlobal;

// CUDA's rule for "potentially unsafe" calls (cudaMalloc, cudaFree,
// synchronization, blocking copies) while captures run: prohibited on this
// thread unless its mode (cudaThreadExchangeStreamCaptureMode) is relaxed,
// if it began a capture that is not relaxed, or if its mode is global and
// another thread's capture is global. A prohibited call fails with
// cudaErrorStreamCaptureUnsupported and invalidates those captures (their
// cudaStreamEndCapture then fails with cudaErrorStreamCaptureInvalidated).
cudaError_t capture_check_unsafe_call(const char *what) {
    if (g_thread_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    std::lock_guard<std::mutex> lk(g_capture_mu);
    bool prohibited = false;
    const std::thread::id me = std::this_thread::get_id();
    for (Stream *st : g_capturing) {
        const bool mine = st->capture_thread == me && st->capture_mode != cudaStreamCaptureModeRelaxed;
        const bool global = g_thread_mode == cudaStreamCaptureModeGlobal && st->capture_thread != me &&
                            st->capture_mode == cudaStreamCaptureModeGlobal;
        if (mine || global) {
            st->capture_invalid = true;
            prohibited = true;
        }
    }
    if (!prohibited) return cudaSuccess;
    note_failure(what);
    return record_error(cudaErrorStreamCaptureUnsupported);
}

}  // namespace

int current_device() { return g_device_current; }
int emulated_devices() { return device_count(); }

bool async_streams() {
    static const bool on = [] {
        const char *e = getenv("FP_EMU_ASYNC");
        return e && *e && *e != '0';
    }();
    return on;
}

void submit(cudaStream_t s, std::function<void()> op) { submit_node(s, std::move(op), cudaGraphNodeTypeHost, nullptr); }

std::function<void()> (*g_activity_hook)(cudaGraphNodeType type, std::function<void()> op);

void submit_node(cudaStream_t s, std::function<void()> op, cudaGraphNodeType type, const void *key) {
    Stream *st = as_stream(s);
    if (st->capturing) {
        st->graph->nodes->push_back(Node{type, key, std::move(op)});
        return;
    }
    if (auto hook = g_activity_hook) op = hook(type, std::move(op));
    if (!async_streams()) {
        op();
        return;
    }
    enqueue_ordered(st, std::move(op));
}

}  // namespace fp_emu

using namespace fp_emu;

extern "C" {

// Per-kind call counters (emu_runtime_counts.h): each counted entry point
// counts itself once, and the ones that share an implementation call the
// uncounted helper, so a call is never counted twice.
static std::atomic<long long> g_call_counts[FP_EMU_CALL_KINDS];
void fp_emu_count_call(fp_emu_call_kind kind) { g_call_counts[kind].fetch_add(1, std::memory_order_relaxed); }
void fp_emu_runtime_counts_get(fp_emu_runtime_counts *out) {
    for (int k = 0; k < FP_EMU_CALL_KINDS; ++k) out->n[k] = g_call_counts[k].load(std::memory_order_relaxed);
}
void fp_emu_runtime_counts_reset(void) {
    for (auto &c : g_call_counts) c.store(0, std::memory_order_relaxed);
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = device_count();
    return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int d) {
    fp_emu_count_call(FP_EMU_CALL_SET_DEVICE);
    if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
    g_device_current = d;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    const DeviceProfile &dp = device();
    snprintf(p->name, sizeof p->name, "fastpath CPU emulation (sm_%d%d profile)", dp.major, dp.minor);
    p->totalGlobalMem = kTotalMem;
    p->sharedMemPerBlock = (size_t)dp.smem_per_block;
    p->sharedMemPerBlockOptin = (size_t)dp.smem_per_block_optin;
    p->sharedMemPerMultiprocessor = (size_t)dp.smem_per_sm;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = dp.regs_per_sm;
    p->warpSize = 32;
    p->maxThreadsPerBlock = dp.max_threads_per_block;
    p->maxThreadsPerMultiProcessor = dp.max_threads_per_sm;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = dp.major;
    p->minor = dp.minor;
    p->multiProcessorCount = dp.sm_count;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    p->pciBusID = d + 1;
    p->concurrentKernels = 1;
    p->unifiedAddressing = 1;
    p->managedMemory = 1;
    return cudaSuccess;
}

static cudaError_t malloc_uncounted(void **p, size_t n) {
    *p = alloc_device(n);
    return *p ? cudaSuccess : record_error(cudaErrorMemoryAllocation);
}
cudaError_t cudaMalloc(void **p, size_t n) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    if (cudaError_t e = capture_check_unsafe_call("cudaMalloc while a stream captures")) return e;
    return malloc_uncounted(p, n);
}
// cudaFree waits for the device (as the real one does, implicitly).
cudaError_t cudaFree(void *p) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    if (cudaError_t e = capture_check_unsafe_call("cudaFree while a stream captures")) return e;
    if (async_streams()) sync_device();
    return free_device(p);
}
// Stream-ordered allocation is legal during capture (an allocation node):
// here the memory is allocated at once and keeps its address for the graph.
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    return malloc_uncounted(p, n);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    if (as_stream(s)->capturing) {  // a free node: the graph releases it when destroyed
        if (p) as_stream(s)->graph->owned->ptrs.push_back(p);
        return cudaSuccess;
    }
    if (!async_streams()) return free_device(p);
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (p && !g_allocs.count(p)) {
            note_failure("cudaFreeAsync of a pointer cudaMalloc did not return");
            return record_error(cudaErrorInvalidValue);
        }
    }
    submit(s, [p] {
        if (free_device(p) != cudaSuccess) device_fault(cudaErrorIllegalAddress);
    });
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
    fp_emu_count_call(FP_EMU_CALL_SYNC);
    if (cudaError_t e = capture_check_unsafe_call("a blocking cudaMemcpy while a stream captures")) return e;
    submit(nullptr, [=] { memmove(d, s, n); });
    if (async_streams()) drain(legacy());
    return device_error();
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    fp_emu_count_call(FP_EMU_CALL_SYNC);
    if (cudaError_t e = capture_check_unsafe_call("a blocking cudaMemset while a stream captures")) return e;
    submit(nullptr, [=] { memset(p, v, n); });
    if (async_streams()) drain(legacy());
    return device_error();
}
cudaError_t cudaDeviceSynchronize(void) {
    fp_emu_count_call(FP_EMU_CALL_SYNC);
    if (cudaError_t e = capture_check_unsafe_call("cudaDeviceSynchronize while a stream captures")) return e;
    if (async_streams()) sync_device();
    return device_error();
}
cudaError_t cudaMallocFromPoolAsync(void **p, size_t n, cudaMemPool_t, cudaStream_t) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    return malloc_uncounted(p, n);
}
cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const cudaMemPoolProps *) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    *pool = reinterpret_cast<cudaMemPool_t>(new char[1]);
    return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    delete[] reinterpret_cast<char *>(pool);
    return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void *) { return cudaSuccess; }
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    std::lock_guard<std::mutex> lk(g_mu);
    *total = kTotalMem;
    *free_b = kTotalMem - g_allocated;
    return cudaSuccess;
}

// The page-locked range containing p, or g_host.end().
static std::map<const char *, size_t>::iterator host_range(const void *p) {
    const char *c = static_cast<const char *>(p);
    auto it = g_host.upper_bound(c);
    if (it == g_host.begin()) return g_host.end();
    --it;
    return c < it->first + it->second ? it : g_host.end();
}
static cudaError_t malloc_host_uncounted(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    if (!*p) return record_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lk(g_mu);
    g_host[static_cast<const char *>(*p)] = n ? n : 1;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    return malloc_host_uncounted(p, n);
}
// Flags as the runtime checks them: an unknown bit is cudaErrorInvalidValue.
// Write-combined and mapped memory is host memory like any other here.
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return record_error(cudaErrorInvalidValue);
    return malloc_host_uncounted(p, n);
}
cudaError_t cudaFreeHost(void *p) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_host.find(static_cast<const char *>(p));
        if (it == g_host.end()) return record_error(cudaErrorInvalidValue);
        g_host.erase(it);
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    const unsigned known = cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterIoMemory |
                           cudaHostRegisterReadOnly;
    if (!p || n == 0 || (flags & ~known)) return record_error(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    const char *c = static_cast<const char *>(p);
    auto next = g_host.lower_bound(c);
    if (host_range(p) != g_host.end() || (next != g_host.end() && next->first < c + n))
        return record_error(cudaErrorHostMemoryAlreadyRegistered);
    g_host[c] = n;
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    fp_emu_count_call(FP_EMU_CALL_ALLOC);
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_host.find(static_cast<const char *>(p));
    if (it == g_host.end()) return record_error(cudaErrorHostMemoryNotRegistered);
    g_host.erase(it);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p) {
    fp_emu_count_call(FP_EMU_CALL_QUERY);
    memset(a, 0, sizeof *a);
    std::lock_guard<std::mutex> lk(g_mu);
    // The allocation containing p (small maps in tests: a linear scan).
    for (const auto &kv : g_allocs) {
        const char *b = static_cast<const char *>(kv.first);
        if ((const char *)p >= b && (const char *)p < b + kv.second) {
            a->type = cudaMemoryTypeDevice;
            a->device = 0;
            a->devicePointer = const_cast<void *>(p);
            return cudaSuccess;
        }
    }
    if (host_range(p) != g_host.end()) {
        a->type = cudaMemoryTypeHost;
        a->device = 0;
        a->devicePointer = a->hostPointer = const_cast<void *>(p);
        return cudaSuccess;
    }
    a->type = cudaMemoryTypeUnregistered;
    a->hostPointer = const_cast<void *>(p);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    Stream *st = new Stream;
    st->device = g_device_current;
    st->flags = flags;
    {
        std::lock_guard<std::mutex> lk(g_streams_mu);
        g_streams.insert(st);
    }
    *s = reinterpret_cast<cudaStream_t>(st);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int prio) {
    cudaError_t e = cudaStreamCreateWithFlags(s, flags);
    if (e == cudaSuccess) as_stream(*s)->priority = prio;
    return e;
}
// Returns at once on a GPU, the work finishing later: here after it finished.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    Stream *st = as_stream(s);
    if (st == legacy()) return record_error(cudaErrorInvalidResourceHandle);
    {
        std::lock_guard<std::mutex> lk(g_streams_mu);
        g_streams.erase(st);
    }
    {
        std::lock_guard<std::mutex> lk(st->mu);
        st->stop = true;
        st->cv_work.notify_one();
    }
    if (st->worker.joinable()) st->worker.join();
    {
        // Its work has all run: events recorded on it are complete.
        std::lock_guard<std::mutex> lk(g_streams_mu);
        for (Event *ev : g_events)
            if (ev->stream == st) ev->stream = nullptr;
    }
    delete st->graph;
    delete st;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    fp_emu_count_call(FP_EMU_CALL_SYNC);
    Stream *st = as_stream(s);
    if (st->capturing) {  // ends the capture's validity, as on a GPU
        std::lock_guard<std::mutex> lk(g_capture_mu);
        st->capture_invalid = true;
        note_failure("cudaStreamSynchronize of a capturing stream");
        return record_error(cudaErrorStreamCaptureUnsupported);
    }
    if (async_streams()) drain(st);
    return device_error();
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    Stream *st = as_stream(s);
    if (!async_streams()) return cudaSuccess;
    return done(st, mark(st)) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    Event *ev = reinterpret_cast<Event *>(e);
    Stream *on = ev->stream;
    const uint64_t seq = ev->seq;
    if (on) submit(s, [on, seq] { wait_for(on, seq); });
    return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t s, int *dev) {
    *dev = as_stream(s)->device;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    Stream *st = as_stream(s);
    if (st == legacy()) return record_error(cudaErrorStreamCaptureUnsupported);  // cannot capture
    if (st->capturing) return record_error(cudaErrorIllegalState);
    std::lock_guard<std::mutex> lk(g_capture_mu);
    st->capturing = true;
    st->capture_invalid = false;
    st->capture_mode = mode;
    st->capture_thread = std::this_thread::get_id();
    st->graph = new Graph;
    g_capturing.insert(st);
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    Stream *st = as_stream(s);
    if (!st->capturing) return record_error(cudaErrorIllegalState);
    std::lock_guard<std::mutex> lk(g_capture_mu);
    g_capturing.erase(st);
    st->capturing = false;
    if (st->capture_invalid) {
        delete st->graph;
        st->graph = nullptr;
        *g = nullptr;
        return record_error(cudaErrorStreamCaptureInvalidated);
    }
    *g = reinterpret_cast<cudaGraph_t>(st->graph);
    st->graph = nullptr;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status) {
    Stream *st = as_stream(s);
    *status = !st->capturing ? cudaStreamCaptureStatusNone
              : st->capture_invalid ? cudaStreamCaptureStatusInvalidated
                                    : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *mode) {
    cudaStreamCaptureMode old = g_thread_mode;
    g_thread_mode = *mode;
    *mode = old;
    return cudaSuccess;
}
// An executable graph: a copy of the node list (shared: a launch in flight
// keeps the list it was launched with, so an update or a destroy while it
// runs is safe, as CUDA promises).
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long) {
    const Graph *src = reinterpret_cast<Graph *>(g);
    Graph *e = new Graph;
    e->nodes = std::make_shared<std::vector<Node>>(*src->nodes);
    e->owned = src->owned;
    *exec = reinterpret_cast<cudaGraphExec_t>(e);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (as_stream(s)->capturing) return record_error(cudaErrorStreamCaptureUnsupported);
    const Graph *g = reinterpret_cast<const Graph *>(exec);
    std::shared_ptr<std::vector<Node>> nodes = g->nodes;
    std::shared_ptr<Owned> owned = g->owned;
    if (auto hook = g_activity_hook) { // each node one traced operation (CUPTI's per-kernel records)
        auto traced = std::make_shared<std::vector<Node>>(*nodes);
        for (Node &n : *traced) n.op = hook(n.type, std::move(n.op));
        nodes = traced;
    }
    submit(s, [nodes, owned] {
        for (const auto &n : *nodes) n.op();
    });
    return cudaSuccess;
}
// In place when the topology (a chain here: the node count and each node's
// type) is the same: the nodes' parameters (kernel arguments, copy and set
// operands) are replaced; else cudaErrorGraphExecUpdateFailure.
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
    Graph *e = reinterpret_cast<Graph *>(exec);
    const Graph *src = reinterpret_cast<const Graph *>(g);
    if (info) *info = cudaGraphExecUpdateResultInfo{};
    bool same = e->nodes->size() == src->nodes->size();
    for (size_t i = 0; same && i < src->nodes->size(); ++i) same = (*e->nodes)[i].type == (*src->nodes)[i].type;
    if (!same) {
        if (info) info->result = cudaGraphExecUpdateErrorTopologyChanged;
        return record_error(cudaErrorGraphExecUpdateFailure);
    }
    e->nodes = std::make_shared<std::vector<Node>>(*src->nodes);
    e->owned = src->owned;
    if (info) info->result = cudaGraphExecUpdateSuccess;
    return cudaSuccess;
}
cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) {
    Graph *gr = reinterpret_cast<Graph *>(g);
    if (!n) return record_error(cudaErrorInvalidValue);
    if (nodes)
        for (size_t i = 0; i < *n && i < gr->nodes->size(); ++i)
            nodes[i] = reinterpret_cast<cudaGraphNode_t>(&(*gr->nodes)[i]);
    *n = gr->nodes->size();
    return cudaSuccess;
}
cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType *type) {
    *type = reinterpret_cast<const Node *>(node)->type;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete reinterpret_cast<Graph *>(g);
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete reinterpret_cast<Graph *>(e);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    Event *ev = new Event;
    ev->flags = flags;
    {
        std::lock_guard<std::mutex> lk(g_streams_mu);
        g_events.insert(ev);
    }
    *e = reinterpret_cast<cudaEvent_t>(ev);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    Event *ev = reinterpret_cast<Event *>(e);
    {
        std::lock_guard<std::mutex> lk(g_streams_mu);
        g_events.erase(ev);
    }
    event_release(ev);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    fp_emu_count_call(FP_EMU_CALL_EVENT_RECORD);
    Stream *st = as_stream(s);
    Event *ev = reinterpret_cast<Event *>(e);
    ev->refs.fetch_add(1);
    std::shared_ptr<Event> hold(ev, event_release);  // released with the record's work
    auto stamp = [hold] { hold->t_ms.store(now_ms()); };
    ev->recorded = true;
    if (st->capturing) {
        st->graph->nodes->push_back(Node{cudaGraphNodeTypeEventRecord, nullptr, stamp});
        return cudaSuccess;
    }
    if (!async_streams()) {
        stamp();
        ev->stream = nullptr;
        return cudaSuccess;
    }
    ev->seq = enqueue_ordered(st, stamp);
    ev->stream = st;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    fp_emu_count_call(FP_EMU_CALL_SYNC);
    Event *ev = reinterpret_cast<Event *>(e);
    if (ev->stream) wait_for(ev->stream, ev->seq);
    return device_error();
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    Event *ev = reinterpret_cast<Event *>(e);
    return !ev->stream || done(ev->stream, ev->seq) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    Event *x = reinterpret_cast<Event *>(a), *y = reinterpret_cast<Event *>(b);
    if (!x->recorded || !y->recorded) return record_error(cudaErrorInvalidResourceHandle);
    if ((x->flags | y->flags) & cudaEventDisableTiming) return record_error(cudaErrorInvalidResourceHandle);
    if (cudaEventQuery(a) != cudaSuccess || cudaEventQuery(b) != cudaSuccess) return cudaErrorNotReady;
    *ms = (float)(y->t_ms.load() - x->t_ms.load());
    return cudaSuccess;
}

}  // extern "C"

// As the driver: a copy's host range must lie inside one page-locked range
// or touch none. One that spans two registrations, or a registration and
// pageable memory, fails with cudaErrorInvalidValue (seen on an H100,
// driver 580: a 10 MiB copy over a block registered in three pieces).
namespace fp_emu {
bool host_span_ok(const void *p, size_t n) {
    if (n == 0) return true;
    const char *c = static_cast<const char *>(p);
    std::lock_guard<std::mutex> lk(g_mu);
    auto in = host_range(p);
    if (in != g_host.end()) return c + n <= in->first + in->second;
    auto next = g_host.upper_bound(c);
    return next == g_host.end() || next->first >= c + n;
}
}  // namespace fp_emu
