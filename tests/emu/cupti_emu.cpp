// The emulated CUPTI activity API (the entry points src/trace/trace_cupti.c
// uses), over the emulated runtime: what the trace layer's CUPTI timer
// needs, so it runs in CI without a GPU.
//
// - Each kernel, copy and set the emulated runtime enqueues (submit_node,
//   and each node of a graph launch) is one traced API call on the calling
//   thread: a correlation id, an API record (RUNTIME: its kind on, its API
//   not switched off since), preceded by one external-correlation record
//   per kind whose stack is non-empty on that thread (as CUPTI does); and,
//   when the work runs, a device record (CONCURRENT_KERNEL, MEMCPY, MEMSET)
//   with its start and end read from the registered timestamp callback
//   (else CLOCK_REALTIME, as CUPTI on Linux).
// - Records go to the client's buffers (cuptiActivityRegisterCallbacks):
//   API records into one, device records into another, as CUPTI keeps
//   thread and context buffers. A full buffer is delivered at once from the
//   thread that filled it; cuptiActivityFlushAll delivers the device buffer
//   before the API buffer, so the client meets device records whose API
//   record comes later (the order CUPTI does not promise either way).
// - fp_emu_cupti_set_busy(1) makes cuptiActivityEnable fail as when another
//   tool owns CUPTI; fp_emu_cupti_counts reports what was recorded.
#include <cupti.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

#include "cuda_emu.h"
#include "cupti_emu.h"

namespace {

std::mutex g_mu;
CUpti_BuffersCallbackRequestFunc g_request;
CUpti_BuffersCallbackCompleteFunc g_complete;
CUpti_TimestampCallbackFunc g_clock;
bool g_kind[64];
// Per-API switches (cuptiActivityEnableRuntimeApi / DriverApi): an API is
// recorded when its domain's kind is on and it was not switched off since.
// With the kind off nothing is recorded, whatever the switches: what CUPTI
// 13 did on an H200 (session 41), whatever its header suggests. Enabling
// the kind clears the switches (the header: the kind overrides them).
bool g_runtime_off[CUPTI_RUNTIME_TRACE_CBID_SIZE], g_driver_off[CUPTI_DRIVER_TRACE_CBID_SIZE];
int g_busy;
std::atomic<uint32_t> g_corr{1};
long long g_device_records, g_api_records, g_external_records, g_buffers_delivered;

struct Buffer {
    uint8_t *p = nullptr;
    size_t size = 0, used = 0;
};
Buffer g_api_buf, g_dev_buf;
std::vector<Buffer> g_full; // filled, to deliver from the filling thread

thread_local std::vector<uint64_t> t_external[CUPTI_EXTERNAL_CORRELATION_KIND_SIZE];

uint64_t now_ns() {
    if (g_clock) return g_clock();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// A record is stored after its size (8 bytes), 8-byte aligned.
size_t slot_bytes(size_t n) { return 8 + ((n + 7) & ~(size_t)7); }

// Appends a record (g_mu held); false when no buffer could be had.
bool append_locked(Buffer &b, const void *rec, size_t n) {
    const size_t need = slot_bytes(n);
    if (b.p && b.used + need > b.size) {
        g_full.push_back(b);
        b = Buffer{};
    }
    if (!b.p) {
        uint8_t *p = nullptr;
        size_t size = 0, max_records = 0;
        if (!g_request) return false;
        g_request(&p, &size, &max_records);
        if (!p || size < need + 8) return false;
        b.p = p;
        b.size = size;
        b.used = 8; // the first record's size word sits at used - 8
    }
    uint64_t sz = need;
    memcpy(b.p + b.used - 8, &sz, 8);
    memcpy(b.p + b.used, rec, n);
    b.used += need;
    return true;
}

void deliver(std::vector<Buffer> &bufs) {
    for (Buffer &b : bufs)
        if (g_complete) g_complete(nullptr, 0, b.p, b.size, b.used > 8 ? b.used - 8 : 0), ++g_buffers_delivered;
    bufs.clear();
}

void deliver_full() {
    std::vector<Buffer> out;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        out.swap(g_full);
    }
    deliver(out);
}

bool recording() { return g_kind[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] || g_kind[CUPTI_ACTIVITY_KIND_MEMCPY] ||
                          g_kind[CUPTI_ACTIVITY_KIND_MEMSET]; }

// A device record of type R (g_mu held).
template <typename R> void put_device_locked(CUpti_ActivityKind kind, uint32_t corr, uint64_t start, uint64_t end) {
    R r;
    memset(&r, 0, sizeof r);
    r.kind = kind;
    r.start = start;
    r.end = end;
    r.correlationId = corr;
    if (append_locked(g_dev_buf, &r, sizeof r)) ++g_device_records;
}

void device_record(cudaGraphNodeType type, uint32_t corr, uint64_t start, uint64_t end) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (type == cudaGraphNodeTypeKernel && g_kind[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL])
        put_device_locked<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, corr, start, end);
    else if (type == cudaGraphNodeTypeMemcpy && g_kind[CUPTI_ACTIVITY_KIND_MEMCPY])
        put_device_locked<CUpti_ActivityMemcpy6>(CUPTI_ACTIVITY_KIND_MEMCPY, corr, start, end);
    else if (type == cudaGraphNodeTypeMemset && g_kind[CUPTI_ACTIVITY_KIND_MEMSET])
        put_device_locked<CUpti_ActivityMemset4>(CUPTI_ACTIVITY_KIND_MEMSET, corr, start, end);
}

// The runtime's hook (cuda_emu.h): an API call enqueueing `op` on this thread.
std::function<void()> hook(cudaGraphNodeType type, std::function<void()> op) {
    if (type != cudaGraphNodeTypeKernel && type != cudaGraphNodeTypeMemcpy && type != cudaGraphNodeTypeMemset)
        return op;
    const uint32_t corr = g_corr.fetch_add(1);
    {
        std::lock_guard<std::mutex> lock(g_mu);
        if (!recording()) return op;
        const CUpti_CallbackId cbid = type == cudaGraphNodeTypeKernel   ? CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000
                                      : type == cudaGraphNodeTypeMemset ? CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020
                                                                        : CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020;
        if (g_kind[CUPTI_ACTIVITY_KIND_RUNTIME] && !g_runtime_off[cbid]) {
            if (g_kind[CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION])
                for (int k = 0; k < CUPTI_EXTERNAL_CORRELATION_KIND_SIZE; ++k)
                    if (!t_external[k].empty()) {
                        CUpti_ActivityExternalCorrelation x;
                        memset(&x, 0, sizeof x);
                        x.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
                        x.externalKind = (CUpti_ExternalCorrelationKind)k;
                        x.externalId = t_external[k].back();
                        x.correlationId = corr;
                        if (append_locked(g_api_buf, &x, sizeof x)) ++g_external_records;
                    }
            CUpti_ActivityAPI a;
            memset(&a, 0, sizeof a);
            a.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
            a.cbid = cbid;
            a.start = a.end = now_ns();
            a.correlationId = corr;
            if (append_locked(g_api_buf, &a, sizeof a)) ++g_api_records;
        }
    }
    deliver_full();
    return [type, corr, op] {
        const uint64_t start = now_ns();
        op();
        const uint64_t end = now_ns();
        device_record(type, corr, start, end > start ? end : start + 1);
        deliver_full();
    };
}

void update_hook_locked() { fp_emu::g_activity_hook = recording() ? &hook : nullptr; }

}  // namespace

extern "C" {

void fp_emu_cupti_set_busy(int busy) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_busy = busy;
}

void fp_emu_cupti_counts(fp_emu_cupti_count *out) {
    std::lock_guard<std::mutex> lock(g_mu);
    out->device_records = g_device_records;
    out->api_records = g_api_records;
    out->external_records = g_external_records;
    out->buffers_delivered = g_buffers_delivered;
    out->runtime_apis = out->driver_apis = 0;
    for (int i = 1; i < CUPTI_RUNTIME_TRACE_CBID_SIZE; ++i)
        out->runtime_apis += g_kind[CUPTI_ACTIVITY_KIND_RUNTIME] && !g_runtime_off[i];
    for (int i = 1; i < CUPTI_DRIVER_TRACE_CBID_SIZE; ++i)
        out->driver_apis += g_kind[CUPTI_ACTIVITY_KIND_DRIVER] && !g_driver_off[i];
}

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *version) {
    if (!version) return CUPTI_ERROR_INVALID_PARAMETER;
    *version = CUPTI_API_VERSION;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str) {
    if (!str) return CUPTI_ERROR_INVALID_PARAMETER;
    switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"; break;
    case CUPTI_ERROR_QUEUE_EMPTY: *str = "CUPTI_ERROR_QUEUE_EMPTY"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; break;
    }
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_busy) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    if ((int)kind <= 0 || (int)kind >= 64) return CUPTI_ERROR_INVALID_KIND;
    g_kind[kind] = true;
    if (kind == CUPTI_ACTIVITY_KIND_RUNTIME) memset(g_runtime_off, 0, sizeof g_runtime_off);
    if (kind == CUPTI_ACTIVITY_KIND_DRIVER) memset(g_driver_off, 0, sizeof g_driver_off);
    update_hook_locked();
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) {
    std::lock_guard<std::mutex> lock(g_mu);
    if ((int)kind <= 0 || (int)kind >= 64) return CUPTI_ERROR_INVALID_KIND;
    g_kind[kind] = false;
    update_hook_locked();
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnableRuntimeApi(CUpti_CallbackId cbid, uint8_t enable) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_busy) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    if (cbid == 0 || cbid >= CUPTI_RUNTIME_TRACE_CBID_SIZE) return CUPTI_ERROR_INVALID_PARAMETER;
    g_runtime_off[cbid] = !enable;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnableDriverApi(CUpti_CallbackId cbid, uint8_t enable) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_busy) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    if (cbid == 0 || cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE) return CUPTI_ERROR_INVALID_PARAMETER;
    g_driver_off[cbid] = !enable;
    return CUPTI_SUCCESS;
}

// A few real names, so the client's filter (Launch / Memcpy / Memset) picks
// some and skips the rest.
CUptiResult CUPTIAPI cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char **name) {
    if (!name) return CUPTI_ERROR_INVALID_PARAMETER;
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        switch (cbid) {
        case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000: *name = "cudaLaunchKernel_v7000"; break;
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020: *name = "cudaMemcpyAsync_v3020"; break;
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020: *name = "cudaMemsetAsync_v3020"; break;
        default: *name = "cudaGetDevice_v3020"; break;
        }
        return CUPTI_SUCCESS;
    }
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
        *name = cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel ? "cuLaunchKernel" : "cuCtxGetCurrent";
        return CUPTI_SUCCESS;
    }
    return CUPTI_ERROR_INVALID_PARAMETER;
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                    CUpti_BuffersCallbackCompleteFunc complete) {
    if (!request || !complete) return CUPTI_ERROR_INVALID_PARAMETER;
    std::lock_guard<std::mutex> lock(g_mu);
    g_request = request;
    g_complete = complete;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc fn) {
    if (!fn) return CUPTI_ERROR_INVALID_PARAMETER;
    std::lock_guard<std::mutex> lock(g_mu);
    g_clock = fn;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp) {
    if (!timestamp) return CUPTI_ERROR_INVALID_PARAMETER;
    *timestamp = now_ns();
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t) {
    std::vector<Buffer> out;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        out.swap(g_full);
        // device records first, API records after: the client must keep
        // device records until their correlation arrives
        if (g_dev_buf.p) out.push_back(g_dev_buf);
        if (g_api_buf.p) out.push_back(g_api_buf);
        g_dev_buf = Buffer{};
        g_api_buf = Buffer{};
    }
    deliver(out);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **record) {
    if (!buffer || !record) return CUPTI_ERROR_INVALID_PARAMETER;
    size_t off;
    if (!*record) {
        off = 8;
    } else {
        off = (size_t)((uint8_t *)*record - buffer);
        uint64_t sz = 0;
        memcpy(&sz, buffer + off - 8, 8);
        off += sz;
    }
    if (off >= valid + 8) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)(buffer + off);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id) {
    if ((int)kind <= 0 || (int)kind >= CUPTI_EXTERNAL_CORRELATION_KIND_SIZE) return CUPTI_ERROR_INVALID_PARAMETER;
    t_external[kind].push_back(id);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t *last) {
    if ((int)kind <= 0 || (int)kind >= CUPTI_EXTERNAL_CORRELATION_KIND_SIZE) return CUPTI_ERROR_INVALID_PARAMETER;
    if (t_external[kind].empty()) return CUPTI_ERROR_QUEUE_EMPTY;
    if (last) *last = t_external[kind].back();
    t_external[kind].pop_back();
    return CUPTI_SUCCESS;
}

}  // extern "C"
