/* The slow path of the op hooks (internal.h, fp_ctx_trace_begin / end): an
 * NVTX range per op and stage, so Nsight Systems and Nsight Compute show
 * them, and the span the trace layer records while the context traces.
 *
 * NVTX3 is header-only (the CUDA toolkit's nvtx3/nvToolsExt.h): its calls
 * do nothing until a tool injects itself (Nsight sets NVTX_INJECTION64_PATH),
 * so a range costs a few nanoseconds without a profiler. User ranges
 * (fp_trace_push / pop) are start / end ranges: not bound to a thread.  A build that cannot
 * see the header keeps the spans and drops the ranges (FP_HAVE_NVTX 0). */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#if defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#define FP_HAVE_NVTX 1
#endif
#endif
#ifndef FP_HAVE_NVTX
#define FP_HAVE_NVTX 0
#endif

#if FP_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

static uint64_t g_pushed, g_popped;

int fp_nvtx_env_enabled(void) {
    /* -1: not read yet; the environment is read once per process */
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("FASTPATH_NVTX");
        v = e && strcmp(e, "1") == 0;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

void fp_nvtx_counts(uint64_t *pushed, uint64_t *popped) {
    if (pushed) *pushed = __atomic_load_n(&g_pushed, __ATOMIC_RELAXED);
    if (popped) *popped = __atomic_load_n(&g_popped, __ATOMIC_RELAXED);
}

uint64_t fp_ctx_instrument_begin(fp_context *ctx, fp_stream stream, const char *name, const char *category,
                                 double bytes, double flops, int nranks, fp_span_stamp *stamp) {
#if FP_HAVE_NVTX
    nvtxRangePushA(name);
#endif
    __atomic_fetch_add(&g_pushed, 1, __ATOMIC_RELAXED);
    uint64_t span = 0;
    if (fp_ctx_traced(ctx)) span = ctx->trace_hooks->begin(ctx, stream, name, category, bytes, flops, nranks, stamp);
    return span | FP_SPAN_NVTX;
}

uint64_t fp_nvtx_range_start(const char *name) {
    __atomic_fetch_add(&g_pushed, 1, __ATOMIC_RELAXED);
#if FP_HAVE_NVTX
    return nvtxRangeStartA(name);
#else
    (void)name;
    return 0;
#endif
}

void fp_nvtx_range_end(uint64_t id) {
#if FP_HAVE_NVTX
    nvtxRangeEnd(id);
#else
    (void)id;
#endif
    __atomic_fetch_add(&g_popped, 1, __ATOMIC_RELAXED);
}

void fp_ctx_instrument_end(fp_context *ctx, uint64_t span) {
    const uint64_t trace_span = span & ~FP_SPAN_NVTX;
    /* trace_hooks is set before tracing first turns on, and never unset */
    if (trace_span) ctx->trace_hooks->end(ctx, trace_span);
    if (span & FP_SPAN_NVTX) {
#if FP_HAVE_NVTX
        nvtxRangePop();
#endif
        __atomic_fetch_add(&g_popped, 1, __ATOMIC_RELAXED);
    }
}
