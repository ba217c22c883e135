/* trace/span_cost: what a span costs the host, by timer (trace.h).
 *
 * The op is fp_axpby on 256 floats (graph/chain's kernel: a call is all
 * launch) inside the span hook every stamping op calls (internal.h:
 * fp_ctx_trace_begin_stamped / end, a span plus its NVTX range, its stamp
 * handed to the kernel), called with tracing off (the hook is one branch),
 * then traced with the event timer, then with the kernel timer (the kernel
 * stamps the span: no event), then with the CUPTI timer; last, tracing off
 * again while CUPTI still records (what its instrumentation adds to every
 * launch). Each is the median host time of one call (fb_host_time: batches
 * of 32 calls between synchronizations). Baseline: the traced call with
 * events; optimized: with the kernel timer. Metrics: op_us (untraced),
 * span_ns_events, span_ns_kernel and span_ns_cupti (the traced call minus
 * the untraced one), cupti_tax_ns (untraced with CUPTI recording minus
 * untraced without), kernel_clock_error_us (the kernel timer's placement
 * error: fp_trace_stats.clock_error_s). It runs on a context of its own,
 * made and destroyed here, so CUPTI's recording ends with the scenario and
 * no later scenario pays it. On a CPU context every timer reads the clock. */
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
    fp_span_stamp stamp;
    const uint64_t span =
        fp_ctx_trace_begin_stamped(c->ctx, stream, "axpby", "op", 3 * 256 * sizeof(float), 2 * 256, &stamp);
    const fp_status st =
        fp_axpby_stamped(c->ctx, stream, 1, FP_F32, 256, 1.0f, c->buf, 1.0f, c->buf + 256, c->buf + 512, &stamp);
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
    fp_stats off, ev, kt, cu, off_cupti;
    int have_cupti = 0;
    double clock_err_s = 0;
    if (st == FP_OK) st = fb_host_time(run, c.ctx, traced_axpby, &c, &off);
    if (st == FP_OK) st = fp_trace_enable(c.ctx, 4096);
    if (st == FP_OK) st = fb_host_time(run, c.ctx, traced_axpby, &c, &ev);
    if (st == FP_OK) st = fp_trace_set_timer(c.ctx, FP_TRACE_TIMER_KERNEL);
    if (st == FP_OK) st = fp_trace_clear(c.ctx);
    if (st == FP_OK) st = fb_host_time(run, c.ctx, traced_axpby, &c, &kt);
    if (st == FP_OK) {
        fp_trace_stats ks;
        memset(&ks, 0, sizeof ks);
        ks.struct_size = sizeof ks;
        st = fp_trace_get_stats(c.ctx, &ks); /* resolves the stamped spans */
        clock_err_s = ks.clock_error_s;
        if (st == FP_OK && ks.unresolved)
            fb_result_note(r, "kernel timer: %llu spans unresolved", (unsigned long long)ks.unresolved);
    }
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
        fb_host_report(run, &ev, &kt, &rep);
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "op_us", off.median_ms * 1e3);
        fb_result_metric(r, "span_ns_events", (ev.median_ms - off.median_ms) * 1e6);
        fb_result_metric(r, "span_ns_kernel", (kt.median_ms - off.median_ms) * 1e6);
        fb_result_metric(r, "kernel_clock_error_us", clock_err_s * 1e6);
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
            "host cost of a traced op: spans timed by two CUDA events vs by the op's kernel (and by CUPTI)",
            run_span_cost)
