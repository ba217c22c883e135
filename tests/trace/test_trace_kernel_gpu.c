/* The kernel timer (trace.h, FP_TRACE_TIMER_KERNEL) on a CUDA context (label
 * gpu; exits 77 without a device; also run on the emulated runtime as
 * test_trace_kernel_gpu_emu, which counts the event records):
 *   - the norms (forward, backward: two kernels) and axpby time their spans
 *     with their kernels' stamps and record no event; a fill in a plain
 *     span keeps its two events; a stamped span whose op launched nothing
 *     keeps the host clock;
 *   - every span inside the user range around them (events), in stream
 *     order, within the calibration's error of the host clock readings
 *     around the calls;
 *   - a capturing stream gets no stamp; switching back to events, clear
 *     (a new calibration), a smaller ring, bad input; a CPU context accepts
 *     the timer and keeps the clock;
 *   - the host cost of a stamped begin / end pair, printed. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "fp_test.h"
#include "trace_test_util.h"
#include "internal.h"
#include "fastpath/norm.h"
#include "timing/probes.h"

enum { ROWS = 64, COLS = 1024, N_AXPBY = 4096 };

/* axpby in a stamped span, as an instrumented op does it */
static void stamped_axpby(fp_context *ctx, fp_stream stream, const char *name, size_t n, float *buf,
                          fp_span_stamp *seen) {
    fp_span_stamp stamp;
    const uint64_t span = fp_ctx_trace_begin_stamped(ctx, stream, name, "op", 12.0 * (double)n, 2.0 * (double)n,
                                                     &stamp);
    CHECK_OK(fp_axpby_stamped(ctx, stream, 2, FP_F32, n, 2.0f, buf, 1.0f, buf + N_AXPBY, buf + 2 * N_AXPBY,
                              &stamp));
    fp_ctx_trace_end(ctx, span);
    if (seen) *seen = stamp;
}

static const fp_trace_span *find(const fp_trace_span *s, size_t n, const char *name) {
    for (size_t i = 0; i < n; ++i)
        if (!strcmp(s[i].name, name)) return &s[i];
    return NULL;
}

int main(void) {
    /* a CPU context: accepted, spans keep the clock */
    fp_context *cpu = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &cpu));
    CHECK_OK(fp_trace_set_timer(cpu, FP_TRACE_TIMER_KERNEL));
    CHECK(fp_trace_get_timer(cpu) == FP_TRACE_TIMER_KERNEL);
    CHECK_OK(fp_trace_enable(cpu, 8));
    fp_span_stamp cs;
    uint64_t h = fp_ctx_trace_begin_stamped(cpu, NULL, "cpu_op", "op", 0, 0, &cs);
    CHECK(h != 0 && cs.rec == NULL);
    fp_ctx_trace_end(cpu, h);
    fp_trace_span one;
    size_t n = 0;
    CHECK_OK(fp_trace_read(cpu, &one, 1, &n, 0));
    CHECK(n == 1 && one.end_s >= one.start_s && stats_of(cpu).clock_error_s == 0);
    fp_context_destroy(cpu);

    fp_context *ctx = fp_test_cuda_context_or_skip();
    CHECK_STATUS(fp_trace_set_timer(ctx, (fp_trace_timer)9), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "_KERNEL") != NULL);
    CHECK_STATUS(fp_trace_set_timer(NULL, FP_TRACE_TIMER_KERNEL), FP_ERR_INVALID_ARGUMENT);

    /* buffers: axpby x, y, out; the norm's tensors */
    float *ab = NULL, *x = NULL, *res = NULL, *out = NULL, *gamma = NULL, *dout = NULL, *dx = NULL, *dgamma = NULL;
    float *mean = NULL, *rstd = NULL;
    const size_t tn = (size_t)ROWS * COLS * sizeof(float);
    CHECK_OK(fp_mem_alloc(ctx, 3 * N_AXPBY * sizeof(float), (void **)&ab));
    CHECK_OK(fp_mem_fill(ctx, ab, 0x3c, 3 * N_AXPBY * sizeof(float), NULL));
    void **bufs[] = {(void **)&x, (void **)&res, (void **)&out, (void **)&dout, (void **)&dx};
    for (int i = 0; i < 5; ++i) {
        CHECK_OK(fp_mem_alloc(ctx, tn, bufs[i]));
        CHECK_OK(fp_mem_fill(ctx, *bufs[i], 0x3c + i, tn, NULL));
    }
    CHECK_OK(fp_mem_alloc(ctx, COLS * sizeof(float), (void **)&gamma));
    CHECK_OK(fp_mem_fill(ctx, gamma, 0x3f, COLS * sizeof(float), NULL));
    CHECK_OK(fp_mem_alloc(ctx, COLS * sizeof(float), (void **)&dgamma));
    CHECK_OK(fp_mem_alloc(ctx, ROWS * sizeof(float), (void **)&mean));
    CHECK_OK(fp_mem_alloc(ctx, ROWS * sizeof(float), (void **)&rstd));
    fp_norm_params fp;
    fp_norm_params_default(&fp);
    fp.kind = FP_NORM_RMSNORM;
    fp.rows = ROWS;
    fp.cols = COLS;
    fp.x = x;
    fp.residual = res;
    fp.gamma = gamma;
    fp.out = out;
    fp.rstd = rstd;
    fp_norm_backward_params bp;
    fp_norm_backward_params_default(&bp);
    bp.kind = FP_NORM_RMSNORM;
    bp.rows = ROWS;
    bp.cols = COLS;
    bp.dout = dout;
    bp.x = out;
    bp.gamma = gamma;
    bp.rstd = rstd;
    bp.dx = dx;
    bp.dgamma = dgamma;
    /* warm-up, untraced: first-call setup is not what is timed */
    CHECK_OK(fp_norm_forward(ctx, NULL, &fp));
    CHECK_OK(fp_norm_backward(ctx, NULL, &bp));
    CHECK_OK(fp_context_synchronize(ctx, NULL));

    CHECK_OK(fp_trace_set_timer(ctx, FP_TRACE_TIMER_KERNEL));
    CHECK(fp_trace_get_timer(ctx) == FP_TRACE_TIMER_KERNEL);
    CHECK_OK(fp_trace_enable(ctx, 64));
    fp_trace_stats st = stats_of(ctx);
    CHECK_MSG(st.timer == FP_TRACE_TIMER_KERNEL && st.clock_error_s > 0 && st.clock_error_s < 0.05,
              "timer %d, clock error %g s", st.timer, st.clock_error_s);
    /* kernel times against event-timed spans: the calibration's error (the
     * events' own resolution, 2 us, on top); against host clock readings
     * also the event time line's own offset (its base is read after a wait
     * on the base event: late by that wake-up, microseconds, or a
     * millisecond and more on a loaded CI machine; a sanity bound) */
    const double tol = st.clock_error_s + 2e-6, tol_host = tol + 0.05;

    const double t0 = fp_now_s();
    CHECK_OK(fp_trace_push(ctx, "layer", "forward"));
    (void)events_since();
    CHECK_OK(fp_norm_forward(ctx, NULL, &fp));
    fp_span_stamp seen;
    stamped_axpby(ctx, NULL, "axpby", N_AXPBY, ab, &seen);
    CHECK(seen.rec != NULL && seen.seq != 0);
    CHECK_OK(fp_norm_backward(ctx, NULL, &bp));
    long long ev = events_since();
    CHECK_MSG(ev <= 0, "%lld event records for three stamped ops", ev);
    uint64_t f = fp_ctx_trace_begin(ctx, NULL, "fill", "op", (double)tn, 0); /* not stamped: events */
    CHECK_OK(fp_mem_fill(ctx, out, 0, tn, NULL));
    fp_ctx_trace_end(ctx, f);
    ev = events_since();
    CHECK_MSG(ev == 2 || ev < 0, "%lld event records for the fill's span", ev);
    stamped_axpby(ctx, NULL, "nothing", 0, ab, NULL); /* launches no kernel: the host clock */
    CHECK_OK(fp_trace_pop(ctx));
    CHECK_OK(fp_context_synchronize(ctx, NULL));
    const double t1 = fp_now_s();

    /* axpby's record: claimed by its span, started and ended by its kernel */
    unsigned long long rec[FP_SPAN_STAMP_WORDS] = {0};
    CHECK(cudaMemcpy(rec, seen.rec, sizeof rec, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK_MSG(rec[0] == seen.seq && rec[1] > 0 && rec[2] >= rec[1], "record: span %llu, %llu-%llu (span %llu)",
              rec[0], rec[1], rec[2], seen.seq);

    /* a capturing stream: no span, no stamp */
    cudaStream_t cap = NULL;
    CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    fp_span_stamp cst;
    const uint64_t hc = fp_ctx_trace_begin_stamped(ctx, (fp_stream)cap, "captured", "op", 0, 0, &cst);
    CHECK((hc & ~FP_SPAN_NVTX) == 0 && cst.rec == NULL);
    fp_ctx_trace_end(ctx, hc);
    cudaGraph_t graph = NULL;
    CHECK(cudaStreamEndCapture(cap, &graph) == cudaSuccess);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(cap);

    fp_trace_span s[16];
    CHECK_OK(fp_trace_read(ctx, s, 16, &n, 0));
    CHECK_MSG(n == 7, "%zu spans", n); /* the range, norm fwd, axpby, norm bwd, fill, nothing, the sync */
    st = stats_of(ctx);
    /* host-timed: "nothing" alone (the others' kernels stamped them) */
    CHECK_MSG(st.unresolved == 0 && st.skipped_capturing == 1 && st.open == 0 && st.host_timed == 1,
              "unresolved %llu, skipped %llu, host-timed %llu", (unsigned long long)st.unresolved,
              (unsigned long long)st.skipped_capturing, (unsigned long long)st.host_timed);
    const fp_trace_span *range = find(s, n, "layer/forward"), *nf = find(s, n, "norm_fwd"),
                        *ax = find(s, n, "axpby"), *nb = find(s, n, "norm_bwd"), *fill = find(s, n, "fill"),
                        *none = find(s, n, "nothing");
    CHECK(range && nf && ax && nb && fill && none);
    if (range && nf && ax && nb && fill && none) {
        const fp_trace_span *timed[] = {nf, ax, nb, fill, none};
        for (int i = 0; i < 5; ++i) {
            const fp_trace_span *p = timed[i];
            CHECK_MSG(p->end_s >= p->start_s, "%s: %.9f-%.9f", p->name, p->start_s, p->end_s);
            /* (a span on the host clock may precede the range's device start: the
             * stream can lag the host) */
            CHECK_MSG(p == none || (p->start_s >= range->start_s - tol && p->end_s <= range->end_s + tol),
                      "%s %.9f-%.9f outside the range %.9f-%.9f (tolerance %g)", p->name, p->start_s, p->end_s,
                      range->start_s, range->end_s, tol);
            CHECK_MSG(p->start_s >= t0 - tol_host && p->end_s <= t1 + tol_host,
                      "%s %.9f-%.9f outside the calls %.9f-%.9f", p->name, p->start_s, p->end_s, t0, t1);
            CHECK(!strcmp(p->module, "layer") && !strcmp(p->stage, "forward"));
        }
        /* in stream order: the stamped spans among themselves exactly */
        CHECK_MSG(nf->end_s <= ax->start_s && ax->end_s <= nb->start_s, "norm_fwd %.9f-%.9f axpby %.9f-%.9f "
                  "norm_bwd %.9f-%.9f", nf->start_s, nf->end_s, ax->start_s, ax->end_s, nb->start_s, nb->end_s);
        CHECK(fill->start_s >= nb->end_s - tol);
    }

    /* back to events: the same op records two */
    CHECK_OK(fp_trace_set_timer(ctx, FP_TRACE_TIMER_EVENTS));
    (void)events_since();
    CHECK_OK(fp_norm_forward(ctx, NULL, &fp));
    ev = events_since();
    CHECK_MSG(ev == 2 || ev < 0, "%lld event records under the event timer", ev);
    /* and kernel again, after a clear (a new calibration) and on a smaller ring */
    CHECK_OK(fp_trace_set_timer(ctx, FP_TRACE_TIMER_KERNEL));
    CHECK_OK(fp_trace_clear(ctx));
    CHECK_OK(fp_trace_enable(ctx, 4));
    for (int i = 0; i < 6; ++i) stamped_axpby(ctx, NULL, "again", N_AXPBY, ab, NULL);
    CHECK_OK(fp_trace_read(ctx, s, 16, &n, 0));
    st = stats_of(ctx);
    CHECK_MSG(n == 4 && st.dropped == 2 && st.unresolved == 0 && st.host_timed == 0,
              "%zu spans, dropped %llu, unresolved %llu, host-timed %llu", n, (unsigned long long)st.dropped,
              (unsigned long long)st.unresolved, (unsigned long long)st.host_timed);
    for (size_t i = 1; i < n; ++i) CHECK(s[i].start_s >= s[i - 1].end_s && s[i].end_s >= s[i].start_s);

    /* host cost of a stamped pair (no kernel: begin, end, the ring) */
    CHECK_OK(fp_trace_enable(ctx, 1 << 14));
    const int pairs = FP_TEST_EMULATED ? 5000 : 50000;
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
        const double a = fp_now_s();
        for (int i = 0; i < pairs; ++i) {
            fp_span_stamp sp;
            const uint64_t k = fp_ctx_trace_begin_stamped(ctx, NULL, "empty", "op", 0, 0, &sp);
            fp_ctx_trace_end(ctx, k);
        }
        const double ns = (fp_now_s() - a) * 1e9 / pairs;
        if (ns < best) best = ns;
    }
    printf("CUDA context, kernel timer: %.0f ns of host time per stamped span begin/end pair (%d pairs, best of 3%s)\n",
           best, pairs, FP_TEST_EMULATED ? ", emulated runtime" : "");
    if (fp_test_timing_meaningful()) CHECK_MSG(best < 20000, "a span pair costs %.0f ns", best);
    st = stats_of(ctx);
    CHECK(st.unresolved == 0);

    void *all[] = {ab, x, res, out, gamma, dout, dx, dgamma, mean, rstd};
    for (int i = 0; i < 10; ++i) CHECK_OK(fp_mem_free(ctx, all[i]));
    fp_context_destroy(ctx);
    TEST_END();
}
