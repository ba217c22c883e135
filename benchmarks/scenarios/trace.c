/* trace/span_cost: what a span costs the host, by timer (trace.h).
 *
 * The op is fp_axpby on 256 floats (graph/chain's kernel: a call is all
 * launch) inside the span hook every instrumented op calls (internal.h:
 * fp_ctx_trace_begin / end, a span plus its NVTX range), called with
 * tracing off (the hook is one branch), then traced with the event timer, then
 * traced with the CUPTI timer; last, tracing off again while CUPTI still
 * records (what its instrumentation adds to every launch). Each is the
 * median host time of one call (fb_host_time: batches of 32 calls between
 * synchronizations). Baseline: the traced call with events; optimized: with
 * CUPTI. Metrics: op_us (untraced), span_ns_events and span_ns_cupti (the
 * traced call minus the untraced one), cupti_tax_ns (untraced with CUPTI
 * recording minus untraced without). It runs on a context of its own, made
 * and destroyed here, so CUPTI's recording ends with the scenario and no
 * later scenario pays it. On a CPU context both timers read the clock. */
#include <string.h>

#include "fastpath/trace.h"
#include "internal.h"
#include "scenario.h"
#include "timing/probes.h"

typedef struct span_case {
    fp_context *ctx;
    float *buf; /* 768 floats: x, y, out */
} span_case;

static fp_status traced_axpby(void *user, fp_stream stream) {
    span_case *c = user;
    const uint64_t span = fp_ctx_trace_begin(c->ctx, stream, "axpby", "op", 3 * 256 * sizeof(float), 2 * 256);
    const fp_status st = fp_axpby(c->ctx, stream, 1, FP_F32, 256, 1.0f, c->buf, 1.0f, c->buf + 256, c->buf + 512);
    fp_ctx_trace_end(c->ctx, span);
    return st;
}

static fp_status run_span_cost(fb_run *run) {
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "op", "axpby");
    const int cuda = fb_kind(run) == FP_DEVICE_CUDA;
    span_case c = {NULL, NULL};
    fp_status st = fp_context_create(cuda ? FP_DEVICE_CUDA : FP_DEVICE_CPU,
                                     cuda ? fp_context_device_index(fb_ctx(run)) : 0, &c.ctx);
    if (st == FP_OK) st = fb_alloc_random(c.ctx, 768, FP_F32, 5, 1.0f, 2.0f, (void **)&c.buf);
    fp_stats off, ev, cu, off_cupti;
    int have_cupti = 0;
    if (st == FP_OK) st = fb_host_time(run, c.ctx, traced_axpby, &c, &off);
    if (st == FP_OK) st = fp_trace_enable(c.ctx, 4096);
    if (st == FP_OK) st = fb_host_time(run, c.ctx, traced_axpby, &c, &ev);
    if (st == FP_OK) {
        if (!cuda) {
            /* nothing to compare: the row is the event side twice */
        } else if (fp_trace_set_timer(c.ctx, FP_TRACE_TIMER_CUPTI) == FP_OK) {
            have_cupti = 1;
            st = fp_trace_clear(c.ctx);
            if (st == FP_OK) st = fb_host_time(run, c.ctx, traced_axpby, &c, &cu);
            if (st == FP_OK) st = fp_trace_disable(c.ctx);
            if (st == FP_OK) st = fb_host_time(run, c.ctx, traced_axpby, &c, &off_cupti);
        } else {
            fb_result_note(r, "no CUPTI timer: %s", fp_last_error());
        }
    }
    fp_trace_stats ts;
    memset(&ts, 0, sizeof ts);
    ts.struct_size = sizeof ts;
    if (st == FP_OK) st = fp_trace_get_stats(c.ctx, &ts); /* resolves the CUPTI spans: their records read */
    if (st == FP_OK) {
        fp_ab_report rep;
        fb_host_report(run, &ev, have_cupti ? &cu : &ev, &rep);
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "op_us", off.median_ms * 1e3);
        fb_result_metric(r, "span_ns_events", (ev.median_ms - off.median_ms) * 1e6);
        if (have_cupti) {
            fb_result_metric(r, "span_ns_cupti", (cu.median_ms - off.median_ms) * 1e6);
            fb_result_metric(r, "cupti_tax_ns", (off_cupti.median_ms - off.median_ms) * 1e6);
        }
        if (ts.unresolved) fb_result_note(r, "%llu spans unresolved", (unsigned long long)ts.unresolved);
        if (!cuda) fb_result_note(r, "cpu: spans read the clock with either timer");
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    if (c.buf) fp_mem_free(c.ctx, c.buf);
    fp_context_destroy(c.ctx);
    return FP_OK;
}

FB_SCENARIO(fb_trace_span_cost, "trace/span_cost",
            "host cost of a traced op: spans timed by two CUDA events vs by CUPTI's activity records",
            run_span_cost)
