// An emulated NCCL (the entry points of NCCL 2.28's <nccl.h> that the
// library calls), so code written against NCCL and linked against this file
// runs N ranks as threads of one process on the emulated CUDA runtime
// (cudart_emu.cpp): no GPU, no driver, no libnccl.
//
// What is emulated:
//   - unique ids and cliques: ranks that init with the same id bytes form one
//     clique (a process-wide registry keyed by the bytes); blocking and
//     non-blocking init (ncclInProgress, then ncclCommGetAsyncError), init of
//     several ranks in one call (ncclCommInitAll), ncclCommSplit;
//   - AllReduce, AllGather, ReduceScatter and Broadcast as host work on the
//     caller's stream (fp_emu::submit): each communicator numbers its
//     collectives 0, 1, 2, ... in host call order, and the seq-th operation
//     of every rank meets the others' in a rendezvous. Operations that do not
//     match (kind, count, type, op, root) wait there until the clique is
//     aborted, as a real NCCL hangs (or corrupts memory): the code under test
//     must notice first. Every rank computes the result from every rank's
//     send buffer into private memory, in the same order (rank 0, 1, ...),
//     so all ranks get bit-identical results; after a second barrier each
//     writes its own receive buffer (in place works);
//   - abort: ncclCommAbort of any rank aborts the whole clique: every
//     pending and future rendezvous returns at once without writing receive
//     buffers, the other ranks' ncclCommGetAsyncError says ncclRemoteError.
//     Stream work holds the communicator's state by shared ownership, so a
//     communicator freed by an abort is never used after free;
//   - fault injection (nccl_emu.h): a rank that hangs, is late, fails the
//     call, or fails asynchronously.
//
// Arithmetic: floating types accumulate in float (double for f64) in rank
// order, f16 / bf16 rounded once at the end; integer types accumulate in
// their own type (sums and products wrap), ncclAvg is the sum divided by
// nranks (integer division for integer types). fp8 types are refused.
//
// Not emulated: point-to-point (ncclSend / ncclRecv), ncclReduce, custom
// reduction ops, buffer registration, ncclCommShrink / Revoke, collectives
// while a stream captures a graph (ncclInvalidUsage: a replay would reuse
// one sequence number), timing (everything is as fast as memcpy) and the
// interplay with other streams' work on the same communicator.
//
// Threads: every entry point may be called from any thread. One mutex and
// one condition variable guard all state (a few ranks: simplicity first).
// With FP_EMU_ASYNC=1 (how the tests run) each stream has a worker thread,
// so one host thread may drive several ranks (inside ncclGroupStart / End,
// as with a real NCCL). Without it fp_emu::submit runs the work inline in
// the calling thread, where the rendezvous blocks that thread: then every
// rank needs its own host thread.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_emu.h"
#include "nccl_emu.h"

// The emulated runtime may not provide cudaGetDevice: then every
// communicator says device 0.
#pragma weak cudaGetDevice

namespace {
struct CommState;
}  // namespace

// The opaque handle of <nccl.h>: one reference to the rank's state.
struct ncclComm {
    std::shared_ptr<CommState> st;
};

namespace {

enum Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast };
const char *const kKindNames[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast"};

// One rank's collective as called (op and root only where they matter).
struct OpDesc {
    Kind kind;
    size_t count;  // per rank: AllGather's sendcount, ReduceScatter's recvcount
    ncclDataType_t dtype;
    ncclRedOp_t op;  // ncclSum for AllGather / Broadcast
    int root;        // 0 but for Broadcast
    const void *send;
    void *recv;
    bool matches(const OpDesc &o) const {
        return kind == o.kind && count == o.count && dtype == o.dtype && op == o.op && root == o.root;
    }
};

// The rendezvous of every rank's seq-th collective.
struct Round {
    std::vector<const OpDesc *> ops;  // by rank, null until it arrived
    int arrived = 0, computed = 0, left = 0;
};

// One ncclCommSplit of a clique: every rank's color and key.
struct SplitEntry {
    int color = 0, key = 0;
    std::shared_ptr<CommState> child;  // null: NCCL_SPLIT_NOCOLOR
};
struct SplitRound {
    std::vector<SplitEntry> entries;
    int arrived = 0;
};

// The ranks of one communicator.
struct Clique {
    int nranks = 0;
    std::vector<bool> joined;
    int njoined = 0;
    bool aborted = false;
    std::map<uint64_t, Round> rounds;       // by sequence number
    std::map<uint64_t, SplitRound> splits;  // by split number
};

// A rank's communicator. The ncclComm handle owns one reference; each
// operation enqueued on a stream holds another until it ran.
struct CommState {
    std::shared_ptr<Clique> clique;  // null while a split has not formed it
    std::weak_ptr<Clique> parent;    // ... the parent's clique meanwhile
    int rank = -1, nranks = 0, device = 0;
    bool blocking = true;
    ncclResult_t async_err = ncclSuccess;  // its own failure (an injected async error)
    bool aborted_self = false;             // aborted / destroyed before its split formed
    bool finalized = false;
    uint64_t seq = 0;        // the next collective's number
    uint64_t split_seq = 0;  // the next split's number
    int pending = 0;         // operations enqueued and not finished
    std::set<uint64_t> call_errors_fired;
};

struct Injection {
    int rank;
    unsigned long long seq;
    int fault, arg;
};

std::mutex g_mu;  // guards everything below and every Clique / CommState
std::condition_variable g_cv;
std::map<std::string, std::weak_ptr<Clique>> g_registry;  // by unique id bytes
std::vector<Injection> g_injections;
std::atomic<int> g_live{0};
std::atomic<unsigned long long> g_id_counter{0};

thread_local std::string g_last_error;
thread_local int g_group_depth = 0;
// Blocking inits / splits called inside a group: ncclGroupEnd waits for them.
thread_local std::vector<std::shared_ptr<CommState>> g_group_waits;
// Splits called inside a group: as NCCL, the child's handle is written to
// the caller's pointer when the split's job runs, at the group's end (a
// caller that reads it before then finds what it left there).
thread_local std::vector<std::pair<ncclComm_t *, ncclComm_t>> g_group_writes;

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_last_error = buf;
    return r;
}

bool clique_aborted(const CommState &st) {
    if (st.clique) return st.clique->aborted;
    std::shared_ptr<Clique> p = st.parent.lock();
    return p && p->aborted;
}

// What ncclCommGetAsyncError says (g_mu held).
ncclResult_t status_locked(const CommState &st) {
    if (st.async_err != ncclSuccess) return st.async_err;
    if (st.aborted_self || clique_aborted(st)) return ncclRemoteError;
    if (!st.clique || st.clique->njoined < st.clique->nranks) return ncclInProgress;
    if (st.finalized && st.pending > 0) return ncclInProgress;
    return ncclSuccess;
}

ncclComm_t new_handle(std::shared_ptr<CommState> st);
void free_handle(ncclComm_t comm);

// Waits (g_mu held through lk) until st's init or split finished: its status.
ncclResult_t wait_ready(std::unique_lock<std::mutex> &lk, const CommState &st) {
    g_cv.wait(lk, [&] { return status_locked(st) != ncclInProgress; });
    return status_locked(st);
}

size_t elem_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;  // fp8 and unknown types: not emulated
    }
}

// Element codecs: load as the accumulation type, store rounded back.
template <typename T> struct Plain {
    using Acc = T;
    static Acc load(const unsigned char *p, size_t i) {
        T v;
        memcpy(&v, p + i * sizeof(T), sizeof v);
        return v;
    }
    static void store(unsigned char *p, size_t i, Acc v) { memcpy(p + i * sizeof(T), &v, sizeof v); }
};
struct Half {
    using Acc = float;
    static Acc load(const unsigned char *p, size_t i) {
        __half_raw r;
        memcpy(&r.x, p + 2 * i, 2);
        return __half2float(__half(r));
    }
    static void store(unsigned char *p, size_t i, Acc v) {
        __half_raw r = __half_raw(__float2half_rn(v));
        memcpy(p + 2 * i, &r.x, 2);
    }
};
struct BFloat16 {
    using Acc = float;
    static Acc load(const unsigned char *p, size_t i) {
        __nv_bfloat16_raw r;
        memcpy(&r.x, p + 2 * i, 2);
        return __bfloat162float(__nv_bfloat16(r));
    }
    static void store(unsigned char *p, size_t i, Acc v) {
        __nv_bfloat16_raw r = __nv_bfloat16_raw(__float2bfloat16_rn(v));
        memcpy(p + 2 * i, &r.x, 2);
    }
};

template <typename A> A combine(ncclRedOp_t op, A a, A b) {
    if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;  // wrapping arithmetic, no signed overflow
        switch (op) {
        case ncclProd: return (A)(U)((U)a * (U)b);
        case ncclMax: return a < b ? b : a;
        case ncclMin: return b < a ? b : a;
        default: return (A)(U)((U)a + (U)b);  // ncclSum, ncclAvg
        }
    } else {
        switch (op) {
        case ncclProd: return a * b;
        case ncclMax: return a != a ? a : b != b ? b : (a < b ? b : a);  // NaN propagates
        case ncclMin: return a != a ? a : b != b ? b : (b < a ? b : a);
        default: return a + b;
        }
    }
}

// out[i] = op over ranks 0, 1, ... of src[r][i], in that order.
template <typename C>
void reduce_as(const std::vector<const unsigned char *> &src, size_t count, ncclRedOp_t op, unsigned char *out) {
    using A = typename C::Acc;
    const int n = (int)src.size();
    for (size_t i = 0; i < count; ++i) {
        A acc = C::load(src[0], i);
        for (int r = 1; r < n; ++r) acc = combine<A>(op, acc, C::load(src[r], i));
        if (op == ncclAvg) acc = (A)(acc / (A)n);
        C::store(out, i, acc);
    }
}

void reduce(ncclDataType_t t, const std::vector<const unsigned char *> &src, size_t count, ncclRedOp_t op,
            unsigned char *out) {
    switch (t) {
    case ncclInt8: return reduce_as<Plain<int8_t>>(src, count, op, out);
    case ncclUint8: return reduce_as<Plain<uint8_t>>(src, count, op, out);
    case ncclInt32: return reduce_as<Plain<int32_t>>(src, count, op, out);
    case ncclUint32: return reduce_as<Plain<uint32_t>>(src, count, op, out);
    case ncclInt64: return reduce_as<Plain<int64_t>>(src, count, op, out);
    case ncclUint64: return reduce_as<Plain<uint64_t>>(src, count, op, out);
    case ncclFloat16: return reduce_as<Half>(src, count, op, out);
    case ncclFloat32: return reduce_as<Plain<float>>(src, count, op, out);
    case ncclFloat64: return reduce_as<Plain<double>>(src, count, op, out);
    case ncclBfloat16: return reduce_as<BFloat16>(src, count, op, out);
    default: return;  // refused by the call
    }
}

// Rank `rank`'s result of the round (every rank's operation has arrived and
// matches; their send buffers stay untouched until every rank computed).
std::vector<unsigned char> compute(const Round &r, const OpDesc &d, int rank) {
    const int n = (int)r.ops.size();
    const size_t es = elem_size(d.dtype), bytes = d.count * es;
    std::vector<unsigned char> out(d.kind == kAllGather ? bytes * n : bytes);
    if (bytes == 0) return out;
    std::vector<const unsigned char *> src(n);
    switch (d.kind) {
    case kAllReduce:
    case kReduceScatter: {
        const size_t off = d.kind == kReduceScatter ? (size_t)rank * bytes : 0;
        for (int i = 0; i < n; ++i) src[i] = static_cast<const unsigned char *>(r.ops[i]->send) + off;
        reduce(d.dtype, src, d.count, d.op, out.data());
        break;
    }
    case kAllGather:
        for (int i = 0; i < n; ++i) memcpy(out.data() + i * bytes, r.ops[i]->send, bytes);
        break;
    case kBroadcast: memcpy(out.data(), r.ops[d.root]->send, bytes); break;
    }
    return out;
}

// The stream work of one collective: st's seq-th operation.
void run(const std::shared_ptr<CommState> &st, const OpDesc &d, uint64_t seq, int fault, int arg) {
    std::unique_lock<std::mutex> lk(g_mu);
    Clique &c = *st->clique;
    const int n = c.nranks, rank = st->rank;
    std::vector<unsigned char> result;
    bool write = false;
    [&] {
        if (fault == FP_NCCL_EMU_ASYNC_ERROR) {
            st->async_err = ncclSystemError;
            c.aborted = true;
            g_cv.notify_all();
            return;
        }
        if (fault == FP_NCCL_EMU_DELAY)
            g_cv.wait_for(lk, std::chrono::milliseconds(arg), [&] { return c.aborted; });
        if (fault == FP_NCCL_EMU_HANG) {
            g_cv.wait(lk, [&] { return c.aborted; });
            return;
        }
        if (c.aborted) return;
        Round &r = c.rounds[seq];
        if (r.ops.empty()) r.ops.assign(n, nullptr);
        r.ops[rank] = &d;
        r.arrived++;
        g_cv.notify_all();
        g_cv.wait(lk, [&] { return c.aborted || r.arrived == n; });
        if (c.aborted) return;
        for (const OpDesc *o : r.ops)
            if (!o->matches(d)) {  // a real NCCL hangs or corrupts: wait for the abort
                g_cv.wait(lk, [&] { return c.aborted; });
                return;
            }
        lk.unlock();
        result = compute(r, d, rank);
        lk.lock();
        r.computed++;
        g_cv.notify_all();
        g_cv.wait(lk, [&] { return c.aborted || r.computed == n; });
        if (c.aborted) return;  // (nobody reads the send buffers any more, but an abort writes nothing)
        if (++r.left == n) c.rounds.erase(seq);
        write = true;
    }();
    if (write && !result.empty()) {
        lk.unlock();
        memcpy(d.recv, result.data(), result.size());
        lk.lock();
    }
    st->pending--;
    g_cv.notify_all();
}

// Checks a collective's arguments and enqueues it on `stream`.
ncclResult_t enqueue(const OpDesc &d0, ncclComm_t comm, cudaStream_t stream) {
    OpDesc d = d0;
    const char *name = kKindNames[d.kind];
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", name);
    if ((int)d.dtype < 0 || (int)d.dtype >= (int)ncclNumTypes)
        return fail(ncclInvalidArgument, "%s: invalid datatype %d", name, (int)d.dtype);
    if (elem_size(d.dtype) == 0)
        return fail(ncclInvalidArgument, "%s: datatype %d is not emulated (fp8)", name, (int)d.dtype);
    if ((d.kind == kAllReduce || d.kind == kReduceScatter) && ((int)d.op < 0 || (int)d.op >= (int)ncclNumOps))
        return fail(ncclInvalidArgument, "%s: invalid reduction op %d", name, (int)d.op);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone)
        return fail(ncclInvalidUsage, "%s: collectives in a captured graph are not emulated", name);
    std::shared_ptr<CommState> st = comm->st;
    int fault = 0, arg = 0;
    uint64_t seq;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (!st->clique || st->clique->njoined < st->clique->nranks)
            return fail(ncclInvalidUsage, "%s: the communicator's init has not completed", name);
        const int n = st->nranks, rank = st->rank;
        if (d.kind == kBroadcast && (d.root < 0 || d.root >= n))
            return fail(ncclInvalidArgument, "%s: root %d out of range [0, %d)", name, d.root, n);
        if ((d.kind == kAllGather || d.kind == kReduceScatter) && d.count > SIZE_MAX / 16 / (size_t)n)
            return fail(ncclInvalidArgument, "%s: count %zu too large", name, d.count);
        if (d.count > SIZE_MAX / 16) return fail(ncclInvalidArgument, "%s: count %zu too large", name, d.count);
        const bool needs_send = d.kind != kBroadcast || rank == d.root;
        if (d.count > 0 && (!d.recv || (needs_send && !d.send)))
            return fail(ncclInvalidArgument, "%s: NULL %s buffer with count %zu", name, d.recv ? "send" : "recv",
                        d.count);
        if (ncclResult_t e = status_locked(*st); e != ncclSuccess)
            return fail(e, "%s: the communicator has failed (%s)", name, ncclGetErrorString(e));
        for (const Injection &in : g_injections)
            if ((in.rank < 0 || in.rank == rank) && in.seq == st->seq) {
                if (in.fault == FP_NCCL_EMU_CALL_ERROR) {
                    if (!st->call_errors_fired.insert(st->seq).second) continue;  // once per comm
                    return fail(ncclSystemError, "%s: injected call error (rank %d, seq %llu)", name, rank,
                                (unsigned long long)st->seq);
                }
                fault = in.fault;
                arg = in.arg;
                break;
            }
        seq = st->seq++;
        st->pending++;
    }
    fp_emu::submit(stream, [st, d, seq, fault, arg] { run(st, d, seq, fault, arg); });
    return ncclSuccess;
}

ncclComm_t new_handle(std::shared_ptr<CommState> st) {
    ncclComm_t c = new ncclComm;
    c->st = std::move(st);
    g_live.fetch_add(1);
    return c;
}
void free_handle(ncclComm_t comm) {
    delete comm;
    g_live.fetch_sub(1);
}

// Whether a config asks for a blocking communicator (`dflt` when it leaves
// it undefined); false with *err set for a config not made by
// NCCL_CONFIG_INITIALIZER.
bool config_blocking(const ncclConfig_t *config, bool dflt, ncclResult_t *err, const char *name) {
    *err = ncclSuccess;
    if (!config) return dflt;
    if (config->magic != 0xcafebeef) {
        *err = fail(ncclInvalidArgument, "%s: config not initialized with NCCL_CONFIG_INITIALIZER", name);
        return dflt;
    }
    return config->blocking == NCCL_CONFIG_UNDEF_INT ? dflt : config->blocking != 0;
}

int current_device() {
    int dev = 0;
    if (&cudaGetDevice != nullptr && cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    return dev;
}

// Adds `rank` to the clique of `id` (g_mu held): the new communicator's
// state, or null with the error in *err.
std::shared_ptr<CommState> join_locked(int nranks, const ncclUniqueId &id, int rank, bool blocking, int device,
                                       ncclResult_t *err) {
    *err = ncclSuccess;
    if (nranks < 1) {
        *err = fail(ncclInvalidArgument, "ncclCommInitRank: nranks %d < 1", nranks);
        return nullptr;
    }
    if (rank < 0 || rank >= nranks) {
        *err = fail(ncclInvalidArgument, "ncclCommInitRank: rank %d out of range [0, %d)", rank, nranks);
        return nullptr;
    }
    for (auto it = g_registry.begin(); it != g_registry.end();)  // forget cliques nobody holds
        it = it->second.expired() ? g_registry.erase(it) : std::next(it);
    const std::string key(id.internal, sizeof id.internal);
    std::shared_ptr<Clique> c = g_registry[key].lock();
    if (!c) {
        c = std::make_shared<Clique>();
        c->nranks = nranks;
        c->joined.assign(nranks, false);
        g_registry[key] = c;
    }
    if (c->nranks != nranks) {
        *err = fail(ncclInvalidArgument, "ncclCommInitRank: nranks %d differs from the clique's %d", nranks,
                    c->nranks);
        return nullptr;
    }
    if (c->joined[rank]) {
        *err = fail(ncclInvalidArgument, "ncclCommInitRank: rank %d joined this unique id twice", rank);
        return nullptr;
    }
    c->joined[rank] = true;
    c->njoined++;
    g_cv.notify_all();
    auto st = std::make_shared<CommState>();
    st->clique = c;
    st->rank = rank;
    st->nranks = nranks;
    st->device = device;
    st->blocking = blocking;
    return st;
}

// Forms the cliques of a split every rank arrived at (g_mu held).
void form_split(SplitRound &sr) {
    std::map<int, std::vector<std::pair<std::pair<int, int>, CommState *>>> by_color;  // (key, parent rank)
    for (size_t r = 0; r < sr.entries.size(); ++r)
        if (sr.entries[r].child)
            by_color[sr.entries[r].color].push_back({{sr.entries[r].key, (int)r}, sr.entries[r].child.get()});
    for (auto &kv : by_color) {
        auto &members = kv.second;
        std::sort(members.begin(), members.end(),
                  [](const auto &a, const auto &b) { return a.first < b.first; });
        auto c = std::make_shared<Clique>();
        c->nranks = c->njoined = (int)members.size();
        c->joined.assign(members.size(), true);
        for (size_t i = 0; i < members.size(); ++i) {
            CommState *m = members[i].second;
            if (m->aborted_self) c->aborted = true;  // a member gave up before it formed
            m->clique = c;
            m->parent.reset();
            m->rank = (int)i;
            m->nranks = (int)members.size();
        }
    }
    g_cv.notify_all();
}

ncclResult_t init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId &id, int rank, const ncclConfig_t *config) {
    if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    ncclResult_t e;
    const bool blocking = config_blocking(config, true, &e, "ncclCommInitRankConfig");
    if (e != ncclSuccess) return e;
    const int device = current_device();
    std::unique_lock<std::mutex> lk(g_mu);
    std::shared_ptr<CommState> st = join_locked(nranks, id, rank, blocking, device, &e);
    if (!st) return e;
    *comm = new_handle(st);
    if (!blocking) return ncclInProgress;
    if (g_group_depth > 0) {  // ncclGroupEnd waits
        g_group_waits.push_back(st);
        return ncclSuccess;
    }
    if ((e = wait_ready(lk, *st)) != ncclSuccess) {
        free_handle(*comm);
        *comm = nullptr;
        return fail(e, "ncclCommInitRank: the clique was aborted during init");
    }
    return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    static const unsigned long long salt = [] {
        std::random_device rd;
        return ((unsigned long long)rd() << 32) ^ rd();
    }();
    memset(uniqueId, 0, sizeof *uniqueId);
    snprintf(uniqueId->internal, sizeof uniqueId->internal, "fp-nccl-emu:%d:%llu:%016llx", (int)getpid(),
             g_id_counter.fetch_add(1) + 1, salt);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    return init_rank(comm, nranks, commId, rank, config);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return init_rank(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
    if (!comm) return fail(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
    if (ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: ndev %d < 1", ndev);
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    std::lock_guard<std::mutex> lk(g_mu);
    for (int r = 0; r < ndev; ++r) {
        ncclResult_t e;
        std::shared_ptr<CommState> st = join_locked(ndev, id, r, true, devlist ? devlist[r] : r, &e);
        comm[r] = new_handle(st);  // (a fresh id: joins cannot fail)
    }
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || !asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    std::lock_guard<std::mutex> lk(g_mu);
    *asyncError = status_locked(*comm->st);
    return ncclSuccess;
}

// Aborts the clique (every rank's pending and future operations return at
// once) and frees the handle at once; stream work still queued holds the
// state by its own reference.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        CommState &st = *comm->st;
        if (st.clique) st.clique->aborted = true;
        else st.aborted_self = true;  // a split not formed yet: its clique starts aborted
        g_cv.notify_all();
    }
    free_handle(comm);
    return ncclSuccess;
}

// Frees the handle after the work enqueued on it ran (at once if the clique
// was aborted: that work returns without doing anything).
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    {
        std::unique_lock<std::mutex> lk(g_mu);
        CommState &st = *comm->st;
        if (!st.clique) {
            st.aborted_self = true;  // leaving a split before it formed: its peers must not wait for it
            g_cv.notify_all();
        }
        g_cv.wait(lk, [&] { return st.pending == 0 || clique_aborted(st); });
    }
    free_handle(comm);
    return ncclSuccess;
}

// Blocking: waits for the enqueued work (or an abort). Non-blocking:
// ncclInProgress, then ncclCommGetAsyncError says ncclInProgress until the
// work ran.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    std::unique_lock<std::mutex> lk(g_mu);
    CommState &st = *comm->st;
    st.finalized = true;
    if (!st.blocking) return ncclInProgress;
    g_cv.wait(lk, [&] { return st.pending == 0 || clique_aborted(st) || st.async_err != ncclSuccess; });
    const ncclResult_t e = status_locked(st);
    return e == ncclSuccess ? e : fail(e, "ncclCommFinalize: the communicator has failed");
}

// Every rank of the parent calls it; ranks of one color form a clique, in
// the order of (key, parent rank). The last rank to arrive forms them, so
// one thread may call it for several ranks (non-blocking config, or inside a
// group); a blocking call outside a group waits for the others.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
    if (!comm || !newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: NULL argument");
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return fail(ncclInvalidArgument, "ncclCommSplit: invalid color %d", color);
    std::shared_ptr<CommState> parent = comm->st;
    std::unique_lock<std::mutex> lk(g_mu);
    ncclResult_t e;
    const bool blocking = config_blocking(config, parent->blocking, &e, "ncclCommSplit");
    if (e != ncclSuccess) return e;
    if ((e = status_locked(*parent)) != ncclSuccess)
        return fail(e == ncclInProgress ? ncclInvalidUsage : e, "ncclCommSplit: the parent communicator is %s",
                    e == ncclInProgress ? "not initialized" : "failed");
    Clique &pc = *parent->clique;
    SplitRound &sr = pc.splits[parent->split_seq];
    if (sr.entries.empty()) sr.entries.resize(pc.nranks);
    std::shared_ptr<CommState> child;
    if (color != NCCL_SPLIT_NOCOLOR) {
        child = std::make_shared<CommState>();
        child->parent = parent->clique;
        child->blocking = blocking;
        child->device = parent->device;
    }
    sr.entries[parent->rank] = SplitEntry{color, key, child};
    if (++sr.arrived == pc.nranks) {
        form_split(sr);
        pc.splits.erase(parent->split_seq);
    }
    parent->split_seq++;
    if (g_group_depth > 0) {
        g_group_writes.emplace_back(newcomm, child ? new_handle(child) : nullptr);
        if (!child) return ncclSuccess;
        if (!blocking) return ncclInProgress;
        g_group_waits.push_back(child);
        return ncclSuccess;
    }
    if (!child) {
        *newcomm = nullptr;
        return ncclSuccess;
    }
    *newcomm = new_handle(child);
    if (!blocking) return ncclInProgress;
    if ((e = wait_ready(lk, *child)) != ncclSuccess) {
        free_handle(*newcomm);
        *newcomm = nullptr;
        return fail(e, "ncclCommSplit: the parent clique was aborted during the split");
    }
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: NULL argument");
    std::lock_guard<std::mutex> lk(g_mu);
    if (!comm->st->clique) return fail(ncclInvalidUsage, "ncclCommCount: the split has not completed");
    *count = comm->st->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!comm || !device) return fail(ncclInvalidArgument, "ncclCommCuDevice: NULL argument");
    *device = comm->st->device;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    std::lock_guard<std::mutex> lk(g_mu);
    if (!comm->st->clique) return fail(ncclInvalidUsage, "ncclCommUserRank: the split has not completed");
    *rank = comm->st->rank;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return enqueue(OpDesc{kAllReduce, count, datatype, op, 0, sendbuff, recvbuff}, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return enqueue(OpDesc{kAllGather, sendcount, datatype, ncclSum, 0, sendbuff, recvbuff}, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return enqueue(OpDesc{kReduceScatter, recvcount, datatype, op, 0, sendbuff, recvbuff}, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return enqueue(OpDesc{kBroadcast, count, datatype, ncclSum, root, sendbuff, recvbuff}, comm, stream);
}

// Collectives never block the caller here, so a group only defers the wait
// of blocking inits and splits called inside it to its end.
ncclResult_t ncclGroupStart() {
    g_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
    if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--g_group_depth > 0) return ncclSuccess;
    std::vector<std::pair<ncclComm_t *, ncclComm_t>> writes;
    writes.swap(g_group_writes);
    for (const auto &w : writes) *w.first = w.second;
    std::vector<std::shared_ptr<CommState>> waits;
    waits.swap(g_group_waits);
    std::unique_lock<std::mutex> lk(g_mu);
    ncclResult_t first = ncclSuccess;
    for (const auto &st : waits) {
        const ncclResult_t e = wait_ready(lk, *st);
        if (first == ncclSuccess) first = e;
    }
    return first == ncclSuccess ? first : fail(first, "ncclGroupEnd: an init or split in the group failed");
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

// The calling thread's last error message (whatever the communicator).
const char *ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

void fp_nccl_emu_inject(int rank, unsigned long long seq, int fault, int arg) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_injections.push_back(Injection{rank, seq, fault, arg});
}

void fp_nccl_emu_reset(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_injections.clear();
}

int fp_nccl_emu_live_comms(void) { return g_live.load(); }

}  // extern "C"
