// The emulated NCCL (nccl_emu.cpp) on the emulated runtime with asynchronous
// streams (FP_EMU_ASYNC=1): 4 ranks as threads, each with its own stream;
// every collective against a plain reference (bit-exact), in place and out
// of place, the same bits on every rank; one rank; one thread driving every
// rank inside a group (non-blocking init, ncclCommInitAll, deferred
// blocking init); init that never completes; injected hangs, delays, call
// and asynchronous errors; mismatched operations; aborts; splits; bad
// arguments; and no communicator left at the end.
//
// Buffers are allocated once up front and freed at the end: cudaFree
// synchronizes the device, which would wait for streams blocked in a
// rendezvous.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "nccl_emu.h"

static std::atomic<int> g_fail{0};
#define CHECK(c)                                                                 \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
            g_fail++;                                                            \
        }                                                                        \
    } while (0)

constexpr int N = 4;

static double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
static void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// Every stream's work done within `ms`?
static bool streams_done(const cudaStream_t *s, int n, double ms) {
    const double end = now_ms() + ms;
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; ++i) all = all && cudaStreamQuery(s[i]) == cudaSuccess;
        if (all) return true;
        if (now_ms() > end) return false;
        sleep_ms(1);
    }
}
static bool event_done(cudaEvent_t e, double ms) {
    const double end = now_ms() + ms;
    while (cudaEventQuery(e) != cudaSuccess)
        if (now_ms() > end) return false;
        else sleep_ms(1);
    return true;
}
static ncclResult_t async_error(ncclComm_t c) {
    ncclResult_t e = ncclInternalError;
    if (ncclCommGetAsyncError(c, &e) != ncclSuccess) return ncclInternalError;
    return e;
}
// Polls until every comm's async error is not ncclInProgress (5 s at most).
static bool wait_init(ncclComm_t *c, int n) {
    const double end = now_ms() + 5000;
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; ++i) all = all && async_error(c[i]) != ncclInProgress;
        if (all) return true;
        if (now_ms() > end) return false;
        sleep_ms(1);
    }
}
static bool last_error_set() {
    const char *m = ncclGetLastError(nullptr);
    return m && *m;
}

// Per-rank buffers (device memory is host memory on the emulated device).
constexpr size_t kMaxBytes = 8192 * 8;
static unsigned char *g_send[N], *g_recv[N], *g_aux[N];
static cudaStream_t g_stream[N];

// Element access as double, stores rounded to the type.
static size_t esize(ncclDataType_t t) {
    return t == ncclFloat16 || t == ncclBfloat16 ? 2 : t == ncclFloat64 || t == ncclInt64 ? 8 : 4;
}
static double load(ncclDataType_t t, const void *p, size_t i) {
    switch (t) {
    case ncclFloat32: return static_cast<const float *>(p)[i];
    case ncclInt32: return static_cast<const int32_t *>(p)[i];
    case ncclFloat16: return __half2float(static_cast<const __half *>(p)[i]);
    case ncclBfloat16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    default: abort();
    }
}
static void store(ncclDataType_t t, void *p, size_t i, double v) {
    switch (t) {
    case ncclFloat32: static_cast<float *>(p)[i] = (float)v; break;
    case ncclInt32: static_cast<int32_t *>(p)[i] = (int32_t)v; break;
    case ncclFloat16: static_cast<__half *>(p)[i] = __float2half_rn((float)v); break;
    case ncclBfloat16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn((float)v); break;
    default: abort();
    }
}
// Rank r's input of test case `salt` (values that round in f16 / bf16).
static double input(ncclDataType_t t, int r, size_t i, int salt) {
    if (t == ncclInt32) return (double)((r * 1000003 + (long)i * 7919 + salt * 31) % 20001 - 10000);
    return (((r * 7 + (long)i * 13 + salt) % 29) - 14) * 0.3711 + r * 0.0123 + salt * 0.001;
}
static void fill(ncclDataType_t t, void *p, size_t n, int r, int salt) {
    for (size_t i = 0; i < n; ++i) store(t, p, i, input(t, r, i, salt));
}
// The plain reference: ranks' stored inputs combined in rank order, in
// float (int64 for int32), rounded once.
static void reference(ncclDataType_t t, ncclRedOp_t op, size_t n, int nr, int salt, size_t offset, void *out) {
    std::vector<std::vector<unsigned char>> in(nr, std::vector<unsigned char>((offset + n) * 8));
    for (int r = 0; r < nr; ++r) fill(t, in[r].data(), offset + n, r, salt);
    for (size_t i = 0; i < n; ++i) {
        double v[N];
        for (int r = 0; r < nr; ++r) v[r] = load(t, in[r].data(), offset + i);
        if (t == ncclInt32) {
            long long a = (long long)v[0];
            for (int r = 1; r < nr; ++r) {
                const long long b = (long long)v[r];
                a = op == ncclMax ? (b > a ? b : a) : op == ncclMin ? (b < a ? b : a) : op == ncclProd ? a * b : a + b;
            }
            if (op == ncclAvg) a /= nr;
            store(t, out, i, (double)a);
        } else {
            float a = (float)v[0];
            for (int r = 1; r < nr; ++r) {
                const float b = (float)v[r];
                a = op == ncclMax ? (b > a ? b : a) : op == ncclMin ? (b < a ? b : a) : op == ncclProd ? a * b : a + b;
            }
            if (op == ncclAvg) a /= (float)nr;
            store(t, out, i, a);
        }
    }
}

static void run_threads(int n, const std::function<void(int)> &fn) {
    std::vector<std::thread> th;
    for (int r = 0; r < n; ++r) th.emplace_back(fn, r);
    for (auto &t : th) t.join();
}

// ---- 4 ranks as threads: every collective --------------------------------

struct Case {
    ncclDataType_t t;
    ncclRedOp_t op;
    bool in_place;
};
static std::vector<Case> allreduce_cases() {
    std::vector<Case> v;
    for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32})
        for (ncclRedOp_t op : {ncclSum, ncclAvg, ncclMax})
            for (bool ip : {false, true}) v.push_back(Case{t, op, ip});
    return v;
}

static void test_threads() {
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    const std::vector<Case> cases = allreduce_cases();
    const size_t cnt = 1003;
    // Every rank's output of every case, to compare across ranks.
    std::vector<std::vector<std::vector<unsigned char>>> outs(cases.size() + 3,
                                                              std::vector<std::vector<unsigned char>>(N));
    run_threads(N, [&](int r) {
        cudaStream_t s = g_stream[r];
        ncclComm_t c = nullptr;
        CHECK(ncclCommInitRank(&c, N, id, r) == ncclSuccess);
        if (!c) return;
        int v = -1;
        CHECK(ncclCommCount(c, &v) == ncclSuccess && v == N);
        CHECK(ncclCommUserRank(c, &v) == ncclSuccess && v == r);
        CHECK(ncclCommCuDevice(c, &v) == ncclSuccess && v == 0);
        CHECK(async_error(c) == ncclSuccess);
        std::vector<unsigned char> want(kMaxBytes);
        for (size_t k = 0; k < cases.size(); ++k) {
            const Case &cs = cases[k];
            const size_t bytes = cnt * esize(cs.t);
            fill(cs.t, g_send[r], cnt, r, (int)k);
            unsigned char *recv = cs.in_place ? g_send[r] : g_recv[r];
            if (!cs.in_place) memset(recv, 0xCD, bytes);
            CHECK(ncclAllReduce(g_send[r], recv, cnt, cs.t, cs.op, c, s) == ncclSuccess);
            CHECK(cudaStreamSynchronize(s) == cudaSuccess);
            reference(cs.t, cs.op, cnt, N, (int)k, 0, want.data());
            if (memcmp(recv, want.data(), bytes) != 0) {
                fprintf(stderr, "  all-reduce case %zu (type %d op %d in place %d) rank %d differs\n", k, (int)cs.t,
                        (int)cs.op, (int)cs.in_place, r);
                g_fail++;
            }
            outs[k][r].assign(recv, recv + bytes);
        }
        // All-gather (out of place, then in place: send = recv + r * count).
        const size_t ag = 257;
        const int base = (int)cases.size();
        fill(ncclFloat32, g_send[r], ag, r, 100);
        memset(g_recv[r], 0xCD, N * ag * 4);
        CHECK(ncclAllGather(g_send[r], g_recv[r], ag, ncclFloat32, c, s) == ncclSuccess);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess);
        for (int j = 0; j < N; ++j) {
            fill(ncclFloat32, want.data(), ag, j, 100);
            CHECK(memcmp(g_recv[r] + j * ag * 4, want.data(), ag * 4) == 0);
        }
        outs[base][r].assign(g_recv[r], g_recv[r] + N * ag * 4);
        memset(g_aux[r], 0xCD, N * ag * 4);
        fill(ncclFloat32, g_aux[r] + r * ag * 4, ag, r, 101);
        CHECK(ncclAllGather(g_aux[r] + r * ag * 4, g_aux[r], ag, ncclFloat32, c, s) == ncclSuccess);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess);
        for (int j = 0; j < N; ++j) {
            fill(ncclFloat32, want.data(), ag, j, 101);
            CHECK(memcmp(g_aux[r] + j * ag * 4, want.data(), ag * 4) == 0);
        }
        // Reduce-scatter (sum): rank r gets block r's reduction.
        const size_t rs = 300;
        fill(ncclFloat32, g_send[r], N * rs, r, 102);
        memset(g_recv[r], 0xCD, rs * 4);
        CHECK(ncclReduceScatter(g_send[r], g_recv[r], rs, ncclFloat32, ncclSum, c, s) == ncclSuccess);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess);
        reference(ncclFloat32, ncclSum, rs, N, 102, r * rs, want.data());
        CHECK(memcmp(g_recv[r], want.data(), rs * 4) == 0);
        outs[base + 1][r].assign(g_recv[r], g_recv[r] + rs * 4);
        // Broadcast from root 2 (the root in place, the others out of place).
        const size_t bc = 500;
        fill(ncclInt32, g_send[r], bc, r, 103);
        unsigned char *brecv = r == 2 ? g_send[r] : g_recv[r];
        if (r != 2) memset(brecv, 0xCD, bc * 4);
        CHECK(ncclBroadcast(g_send[r], brecv, bc, ncclInt32, 2, c, s) == ncclSuccess);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess);
        fill(ncclInt32, want.data(), bc, 2, 103);
        CHECK(memcmp(brecv, want.data(), bc * 4) == 0);
        outs[base + 2][r].assign(brecv, brecv + bc * 4);
        CHECK(ncclCommFinalize(c) == ncclSuccess);
        CHECK(ncclCommDestroy(c) == ncclSuccess);
    });
    // The same bits on every rank (but reduce-scatter's blocks: one per rank).
    for (size_t k = 0; k < outs.size(); ++k)
        for (int r = 1; r < N; ++r) CHECK(k == cases.size() + 1 || outs[k][r] == outs[k][0]);
}

// ---- one rank: local copies, still through the stream --------------------

static void test_one_rank() {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t c = nullptr;
    CHECK(ncclCommInitRank(&c, 1, id, 0) == ncclSuccess);
    if (!c) return;
    cudaStream_t s = g_stream[0];
    const size_t n = 777;
    fill(ncclFloat32, g_send[0], n, 0, 7);
    memset(g_recv[0], 0xCD, n * 4);
    CHECK(ncclAllReduce(g_send[0], g_recv[0], n, ncclFloat32, ncclAvg, c, s) == ncclSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(memcmp(g_send[0], g_recv[0], n * 4) == 0);
    memset(g_recv[0], 0xCD, n * 4);
    CHECK(ncclAllGather(g_send[0], g_recv[0], n, ncclFloat32, c, s) == ncclSuccess);
    CHECK(ncclReduceScatter(g_send[0], g_aux[0], n, ncclFloat32, ncclMax, c, s) == ncclSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(memcmp(g_send[0], g_recv[0], n * 4) == 0);
    CHECK(memcmp(g_send[0], g_aux[0], n * 4) == 0);
    memset(g_recv[0], 0xCD, n * 4);
    CHECK(ncclBroadcast(g_send[0], g_recv[0], n, ncclFloat32, 0, c, s) == ncclSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(memcmp(g_send[0], g_recv[0], n * 4) == 0);
    CHECK(ncclCommDestroy(c) == ncclSuccess);
}

// ---- one thread driving every rank ---------------------------------------

// An all-reduce (sum, f32) of every rank inside a group; checks the results.
static void group_allreduce(ncclComm_t *c, int salt) {
    const size_t n = 513;
    for (int r = 0; r < N; ++r) {
        fill(ncclFloat32, g_send[r], n, r, salt);
        memset(g_recv[r], 0xCD, n * 4);
    }
    CHECK(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < N; ++r)
        CHECK(ncclAllReduce(g_send[r], g_recv[r], n, ncclFloat32, ncclSum, c[r], g_stream[r]) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclSuccess);
    CHECK(streams_done(g_stream, N, 5000));
    std::vector<unsigned char> want(n * 4);
    reference(ncclFloat32, ncclSum, n, N, salt, 0, want.data());
    for (int r = 0; r < N; ++r) CHECK(memcmp(g_recv[r], want.data(), n * 4) == 0);
}

static void destroy_all(ncclComm_t *c, int n) {
    for (int r = 0; r < n; ++r)
        if (c[r]) CHECK(ncclCommDestroy(c[r]) == ncclSuccess);
}

static void test_one_thread() {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t c[N] = {};
    CHECK(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < N; ++r) {
        const ncclResult_t e = ncclCommInitRankConfig(&c[r], N, id, r, &cfg);
        CHECK(e == ncclInProgress || e == ncclSuccess);
    }
    const ncclResult_t ge = ncclGroupEnd();
    CHECK(ge == ncclSuccess || ge == ncclInProgress);
    CHECK(wait_init(c, N));
    for (int r = 0; r < N; ++r) CHECK(async_error(c[r]) == ncclSuccess);
    group_allreduce(c, 11);
    destroy_all(c, N);

    // ncclCommInitAll: ready at once.
    CHECK(ncclCommInitAll(c, N, nullptr) == ncclSuccess);
    for (int r = 0; r < N; ++r) {
        int v = -1;
        CHECK(async_error(c[r]) == ncclSuccess);
        CHECK(ncclCommUserRank(c[r], &v) == ncclSuccess && v == r);
    }
    group_allreduce(c, 12);
    destroy_all(c, N);

    // Blocking init inside a group: ncclGroupEnd waits for it.
    ncclGetUniqueId(&id);
    CHECK(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < N; ++r) CHECK(ncclCommInitRank(&c[r], N, id, r) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclSuccess);
    for (int r = 0; r < N; ++r) CHECK(async_error(c[r]) == ncclSuccess);
    group_allreduce(c, 13);
    destroy_all(c, N);
}

// ---- init that never completes -------------------------------------------

static void test_missing_rank() {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    const int live = fp_nccl_emu_live_comms();
    ncclComm_t c[N - 1] = {};
    for (int r = 0; r < N - 1; ++r) CHECK(ncclCommInitRankConfig(&c[r], N, id, r, &cfg) == ncclInProgress);
    const double end = now_ms() + 200;
    while (now_ms() < end) {
        for (int r = 0; r < N - 1; ++r) CHECK(async_error(c[r]) == ncclInProgress);
        sleep_ms(10);
    }
    const double t0 = now_ms();
    CHECK(ncclCommAbort(c[0]) == ncclSuccess);
    for (int r = 1; r < N - 1; ++r) {
        CHECK(async_error(c[r]) == ncclRemoteError);
        CHECK(ncclCommAbort(c[r]) == ncclSuccess);
    }
    CHECK(now_ms() - t0 < 1000);
    CHECK(fp_nccl_emu_live_comms() == live);
}

// ---- faults ---------------------------------------------------------------

static void init_all(ncclComm_t *c) {
    for (int r = 0; r < N; ++r) c[r] = nullptr;
    CHECK(ncclCommInitAll(c, N, nullptr) == ncclSuccess);
}
static bool untouched(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != 0xCD) return false;
    return true;
}

// Rank 2 hangs in seq 1: the others finish seq 0, block in seq 1 until rank
// 0 aborts, then drain at once with ncclRemoteError and untouched buffers.
static void test_hang() {
    fp_nccl_emu_reset();
    fp_nccl_emu_inject(2, 1, FP_NCCL_EMU_HANG, 0);
    ncclComm_t c[N];
    init_all(c);
    const size_t n = 300;
    cudaEvent_t ev[N];
    for (int r = 0; r < N; ++r) {
        CHECK(cudaEventCreate(&ev[r]) == cudaSuccess);
        fill(ncclFloat32, g_send[r], n, r, 20);
        memset(g_recv[r], 0xCD, n * 4);
        memset(g_aux[r], 0xCD, n * 4);
    }
    for (int r = 0; r < N; ++r) {
        CHECK(ncclAllReduce(g_send[r], g_recv[r], n, ncclFloat32, ncclSum, c[r], g_stream[r]) == ncclSuccess);
        CHECK(cudaEventRecord(ev[r], g_stream[r]) == cudaSuccess);
        CHECK(ncclAllReduce(g_send[r], g_aux[r], n, ncclFloat32, ncclSum, c[r], g_stream[r]) == ncclSuccess);
    }
    std::vector<unsigned char> want(n * 4);
    reference(ncclFloat32, ncclSum, n, N, 20, 0, want.data());
    for (int r = 0; r < N; ++r) {
        CHECK(event_done(ev[r], 5000));  // seq 0 completes everywhere
        CHECK(memcmp(g_recv[r], want.data(), n * 4) == 0);
    }
    sleep_ms(100);
    for (int r = 0; r < N; ++r) {
        CHECK(cudaStreamQuery(g_stream[r]) == cudaErrorNotReady);  // blocked in seq 1
        CHECK(async_error(c[r]) == ncclSuccess);
    }
    const double t0 = now_ms();
    CHECK(ncclCommAbort(c[0]) == ncclSuccess);
    CHECK(streams_done(g_stream, N, 1000));
    CHECK(now_ms() - t0 < 1000);
    for (int r = 1; r < N; ++r) CHECK(async_error(c[r]) == ncclRemoteError);
    for (int r = 0; r < N; ++r) CHECK(untouched(g_aux[r], n * 4));
    for (int r = 1; r < N; ++r) CHECK(ncclCommDestroy(c[r]) == ncclSuccess);
    for (int r = 0; r < N; ++r) CHECK(cudaEventDestroy(ev[r]) == cudaSuccess);
    fp_nccl_emu_reset();
}

// Rank 3 calls with another count: every rank blocks until the abort.
static void test_mismatch() {
    ncclComm_t c[N];
    init_all(c);
    for (int r = 0; r < N; ++r) memset(g_recv[r], 0xCD, 65 * 4);
    for (int r = 0; r < N; ++r) {
        fill(ncclFloat32, g_send[r], 65, r, 30);
        CHECK(ncclAllReduce(g_send[r], g_recv[r], r == 3 ? 65 : 64, ncclFloat32, ncclSum, c[r], g_stream[r]) ==
              ncclSuccess);
    }
    sleep_ms(100);
    for (int r = 0; r < N; ++r) CHECK(cudaStreamQuery(g_stream[r]) == cudaErrorNotReady);
    CHECK(ncclCommAbort(c[3]) == ncclSuccess);
    CHECK(streams_done(g_stream, N, 1000));
    for (int r = 0; r < N - 1; ++r) CHECK(async_error(c[r]) == ncclRemoteError);
    for (int r = 0; r < N; ++r) CHECK(untouched(g_recv[r], 65 * 4));
    destroy_all(c, N - 1);
}

static void test_delay() {
    fp_nccl_emu_reset();
    fp_nccl_emu_inject(1, 0, FP_NCCL_EMU_DELAY, 150);
    ncclComm_t c[N];
    init_all(c);
    const double t0 = now_ms();
    group_allreduce(c, 40);
    CHECK(now_ms() - t0 >= 140);
    for (int r = 0; r < N; ++r) CHECK(async_error(c[r]) == ncclSuccess);
    destroy_all(c, N);
    fp_nccl_emu_reset();
}

// Rank 3's first call fails (nothing enqueued, seq not consumed); its retry
// completes the collective.
static void test_call_error() {
    fp_nccl_emu_reset();
    fp_nccl_emu_inject(3, 0, FP_NCCL_EMU_CALL_ERROR, 0);
    ncclComm_t c[N];
    init_all(c);
    const size_t n = 100;
    for (int r = 0; r < N; ++r) {
        fill(ncclInt32, g_send[r], n, r, 50);
        memset(g_recv[r], 0xCD, n * 4);
    }
    for (int r = 0; r < N - 1; ++r)
        CHECK(ncclAllReduce(g_send[r], g_recv[r], n, ncclInt32, ncclSum, c[r], g_stream[r]) == ncclSuccess);
    CHECK(ncclAllReduce(g_send[3], g_recv[3], n, ncclInt32, ncclSum, c[3], g_stream[3]) == ncclSystemError);
    CHECK(last_error_set());
    CHECK(cudaStreamQuery(g_stream[3]) == cudaSuccess);  // nothing enqueued
    sleep_ms(50);
    for (int r = 0; r < N - 1; ++r) CHECK(cudaStreamQuery(g_stream[r]) == cudaErrorNotReady);
    CHECK(ncclAllReduce(g_send[3], g_recv[3], n, ncclInt32, ncclSum, c[3], g_stream[3]) == ncclSuccess);
    CHECK(streams_done(g_stream, N, 5000));
    std::vector<unsigned char> want(n * 4);
    reference(ncclInt32, ncclSum, n, N, 50, 0, want.data());
    for (int r = 0; r < N; ++r) {
        CHECK(memcmp(g_recv[r], want.data(), n * 4) == 0);
        CHECK(async_error(c[r]) == ncclSuccess);
    }
    destroy_all(c, N);
    fp_nccl_emu_reset();
}

// Rank 1's op fails at run time: its comm says ncclSystemError, the others
// ncclRemoteError, nothing is written, the streams drain.
static void test_async_error() {
    fp_nccl_emu_reset();
    fp_nccl_emu_inject(1, 0, FP_NCCL_EMU_ASYNC_ERROR, 0);
    ncclComm_t c[N];
    init_all(c);
    const size_t n = 100;
    for (int r = 0; r < N; ++r) {
        fill(ncclFloat32, g_send[r], n, r, 60);
        memset(g_recv[r], 0xCD, n * 4);
    }
    // Rank 1 last: once its op ran, calls on the clique's comms fail.
    for (int r : {0, 2, 3, 1})
        CHECK(ncclAllReduce(g_send[r], g_recv[r], n, ncclFloat32, ncclSum, c[r], g_stream[r]) == ncclSuccess);
    CHECK(streams_done(g_stream, N, 1000));
    CHECK(async_error(c[1]) == ncclSystemError);
    for (int r : {0, 2, 3}) CHECK(async_error(c[r]) == ncclRemoteError);
    for (int r = 0; r < N; ++r) CHECK(untouched(g_recv[r], n * 4));
    CHECK(ncclAllReduce(g_send[0], g_recv[0], n, ncclFloat32, ncclSum, c[0], g_stream[0]) != ncclSuccess);
    destroy_all(c, N);
    fp_nccl_emu_reset();
}

// ---- split ------------------------------------------------------------------

// 2 x 2 by color r % 2 with keys 3 - r: new rank = 1 for parent ranks 0, 1,
// 0 for 2, 3. Checks ranks and an all-gather + all-reduce in each half
// (values by parent rank). One thread for all ranks when `one_thread`.
static void check_halves(ncclComm_t *h, bool one_thread) {
    const size_t n = 64;
    for (int r = 0; r < N; ++r) {
        int v = -1;
        CHECK(ncclCommCount(h[r], &v) == ncclSuccess && v == 2);
        CHECK(ncclCommUserRank(h[r], &v) == ncclSuccess && v == (r < 2 ? 1 : 0));
        fill(ncclInt32, g_send[r], n, r, 70);
        memset(g_recv[r], 0xCD, 2 * n * 4);
        memset(g_aux[r], 0xCD, n * 4);
    }
    auto issue = [&](int r) {
        CHECK(ncclAllGather(g_send[r], g_recv[r], n, ncclInt32, h[r], g_stream[r]) == ncclSuccess);
        CHECK(ncclAllReduce(g_send[r], g_aux[r], n, ncclInt32, ncclSum, h[r], g_stream[r]) == ncclSuccess);
    };
    if (one_thread) {
        CHECK(ncclGroupStart() == ncclSuccess);
        for (int r = 0; r < N; ++r) issue(r);
        CHECK(ncclGroupEnd() == ncclSuccess);
    } else {
        run_threads(N, issue);
    }
    CHECK(streams_done(g_stream, N, 5000));
    std::vector<int32_t> a(n), b(n);
    for (int r = 0; r < N; ++r) {
        const int first = r % 2 + 2, second = r % 2;  // parent ranks of new ranks 0 and 1
        fill(ncclInt32, a.data(), n, first, 70);
        fill(ncclInt32, b.data(), n, second, 70);
        CHECK(memcmp(g_recv[r], a.data(), n * 4) == 0);
        CHECK(memcmp(g_recv[r] + n * 4, b.data(), n * 4) == 0);
        bool ok = true;
        for (size_t i = 0; i < n; ++i) ok = ok && reinterpret_cast<int32_t *>(g_aux[r])[i] == a[i] + b[i];
        CHECK(ok);
    }
}

static void test_split() {
    // Each rank its own thread, blocking.
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t c[N] = {}, h[N] = {}, g[N] = {};
    run_threads(N, [&](int r) {
        CHECK(ncclCommInitRank(&c[r], N, id, r) == ncclSuccess);
        CHECK(ncclCommSplit(c[r], r % 2, 3 - r, &h[r], nullptr) == ncclSuccess);
        CHECK(h[r] != nullptr);
    });
    check_halves(h, false);
    destroy_all(h, N);
    // NOCOLOR: rank 3 gets no communicator, the others one of 3 ranks.
    run_threads(N, [&](int r) {
        CHECK(ncclCommSplit(c[r], r == 3 ? NCCL_SPLIT_NOCOLOR : 0, r, &g[r], nullptr) == ncclSuccess);
    });
    CHECK(g[3] == nullptr);
    for (int r = 0; r < N - 1; ++r) {
        int v = -1;
        CHECK(g[r] && ncclCommCount(g[r], &v) == ncclSuccess && v == 3);
        CHECK(g[r] && ncclCommUserRank(g[r], &v) == ncclSuccess && v == r);
    }
    destroy_all(g, N - 1);
    destroy_all(c, N);

    // One thread, inside a group, non-blocking.
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    init_all(c);
    CHECK(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < N; ++r) {
        h[r] = nullptr;
        const ncclResult_t e = ncclCommSplit(c[r], r % 2, 3 - r, &h[r], &cfg);
        CHECK(e == ncclInProgress || e == ncclSuccess);
    }
    // As NCCL: the handles are written when the group's jobs run, at its end.
    for (int r = 0; r < N; ++r) CHECK(h[r] == nullptr);
    CHECK(ncclGroupEnd() == ncclSuccess);
    CHECK(wait_init(h, N));
    for (int r = 0; r < N; ++r) CHECK(async_error(h[r]) == ncclSuccess);
    check_halves(h, true);
    destroy_all(h, N);
    destroy_all(c, N);
}

// ---- bad arguments ------------------------------------------------------

static void test_bad_args() {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t x = nullptr;
    CHECK(ncclCommInitRank(&x, 0, id, 0) == ncclInvalidArgument && last_error_set());
    CHECK(ncclCommInitRank(&x, N, id, N) == ncclInvalidArgument && last_error_set());
    CHECK(ncclCommInitRank(&x, N, id, -1) == ncclInvalidArgument && last_error_set());
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    CHECK(ncclCommInitRankConfig(&x, N, id, 0, &bad) == ncclInvalidArgument && last_error_set());
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t a = nullptr, b = nullptr;
    CHECK(ncclCommInitRankConfig(&a, N, id, 0, &cfg) == ncclInProgress);
    CHECK(ncclCommInitRankConfig(&b, N, id, 0, &cfg) == ncclInvalidArgument && last_error_set());  // twice
    CHECK(ncclCommInitRankConfig(&b, 3, id, 1, &cfg) == ncclInvalidArgument && last_error_set());  // nranks
    CHECK(ncclCommAbort(a) == ncclSuccess);
    CHECK(ncclCommGetAsyncError(nullptr, nullptr) == ncclInvalidArgument);
    CHECK(ncclCommInitAll(nullptr, N, nullptr) == ncclInvalidArgument);

    ncclComm_t c[N];
    init_all(c);
    void *s = g_send[0], *r = g_recv[0];
    cudaStream_t st = g_stream[0];
    CHECK(ncclAllReduce(s, r, 8, ncclFloat32, ncclSum, nullptr, st) == ncclInvalidArgument && last_error_set());
    CHECK(ncclAllReduce(s, r, 8, ncclNumTypes, ncclSum, c[0], st) == ncclInvalidArgument && last_error_set());
    CHECK(ncclAllReduce(s, r, 8, (ncclDataType_t)15, ncclSum, c[0], st) == ncclInvalidArgument);
    CHECK(ncclAllReduce(s, r, 8, ncclFloat32, ncclNumOps, c[0], st) == ncclInvalidArgument && last_error_set());
    CHECK(ncclReduceScatter(s, r, 8, ncclFloat32, (ncclRedOp_t)1000, c[0], st) == ncclInvalidArgument);
    CHECK(ncclBroadcast(s, r, 8, ncclFloat32, N, c[0], st) == ncclInvalidArgument && last_error_set());
    CHECK(ncclBroadcast(s, r, 8, ncclFloat32, -1, c[0], st) == ncclInvalidArgument);
    CHECK(ncclAllReduce(nullptr, r, 8, ncclFloat32, ncclSum, c[0], st) == ncclInvalidArgument && last_error_set());
    CHECK(ncclAllReduce(s, nullptr, 8, ncclFloat32, ncclSum, c[0], st) == ncclInvalidArgument);
    CHECK(ncclAllGather(nullptr, r, 8, ncclFloat32, c[0], st) == ncclInvalidArgument);
    CHECK(ncclCommSplit(c[0], -5, 0, &x, nullptr) == ncclInvalidArgument && last_error_set());
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    CHECK(cudaStreamQuery(st) == cudaSuccess);  // nothing enqueued
    // No sequence number consumed: a valid collective still matches.
    group_allreduce(c, 80);
    destroy_all(c, N);
    int v = 0;
    CHECK(ncclGetVersion(&v) == ncclSuccess && v == NCCL_VERSION_CODE);
    for (int e = 0; e <= (int)ncclNumResults; ++e) CHECK(ncclGetErrorString((ncclResult_t)e)[0] != 0);
}

int main() {
    const char *async = getenv("FP_EMU_ASYNC");
    if (!async || *async != '1') {
        fprintf(stderr, "test_nccl_emu: needs FP_EMU_ASYNC=1 (one thread drives several ranks)\n");
        return 77;
    }
    for (int r = 0; r < N; ++r) {
        CHECK(cudaMalloc((void **)&g_send[r], kMaxBytes) == cudaSuccess);
        CHECK(cudaMalloc((void **)&g_recv[r], kMaxBytes) == cudaSuccess);
        CHECK(cudaMalloc((void **)&g_aux[r], kMaxBytes) == cudaSuccess);
        CHECK(cudaStreamCreateWithFlags(&g_stream[r], cudaStreamNonBlocking) == cudaSuccess);
    }
    struct {
        const char *name;
        void (*fn)();
    } tests[] = {{"threads", test_threads},       {"one_rank", test_one_rank},   {"one_thread", test_one_thread},
                 {"missing_rank", test_missing_rank}, {"hang", test_hang},     {"mismatch", test_mismatch},
                 {"delay", test_delay},           {"call_error", test_call_error}, {"async_error", test_async_error},
                 {"split", test_split},           {"bad_args", test_bad_args}};
    for (const auto &t : tests) {
        const int before = g_fail.load();
        const double t0 = now_ms();
        t.fn();
        printf("  %-13s %s (%.0f ms)\n", t.name, g_fail.load() == before ? "ok" : "FAILED", now_ms() - t0);
        fflush(stdout);
    }
    CHECK(fp_nccl_emu_live_comms() == 0);
    for (int r = 0; r < N; ++r) {
        CHECK(cudaStreamDestroy(g_stream[r]) == cudaSuccess);
        CHECK(cudaFree(g_send[r]) == cudaSuccess);  // (the guard bytes: nothing written out of bounds)
        CHECK(cudaFree(g_recv[r]) == cudaSuccess);
        CHECK(cudaFree(g_aux[r]) == cudaSuccess);
    }
    if (g_fail) fprintf(stderr, "test_nccl_emu: %d failures\n", g_fail.load());
    else printf("test_nccl_emu: ok\n");
    return g_fail ? 1 : 0;
}
