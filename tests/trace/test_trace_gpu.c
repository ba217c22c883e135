/* Tracing on a CUDA context (label gpu; exits 77 without a device; also run
 * on the emulated runtime as test_trace_gpu_emu): spans timed by events on
 * their streams and resolved when read, ranges on the default stream with
 * the ops inside them, a second stream, a collective, spans skipped while a
 * stream is captured, both exports, and the op hook (internal.h).
 *
 * With the argument "cupti" (test_trace_cupti_gpu, _emu): the same under
 * the CUPTI timer: spans timed by their device work's activity records
 * (the emulated CUPTI, tests/emu/cupti_emu.cpp, on the emulation), device
 * work outside any span kept out of the spans, a span with no device work
 * on the host clock, and CUPTI refused (another tool owning it: emulation
 * only) leaving the event timer in place. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "fp_test.h"
#include "internal.h"
#if FP_TEST_EMULATED && defined(FP_HAVE_CUPTI)
#include "cupti_emu.h"
#endif

/* float milliseconds from the base event: allow their rounding */
#define TIME_TOL 2e-6

static int inside(const fp_trace_span *a, const fp_trace_span *b) {
    return b->start_s >= a->start_s - TIME_TOL && b->end_s <= a->end_s + TIME_TOL;
}

/* CUPTI: two threads at once, each a span per fill of its own size on its
 * own stream. */
typedef struct fill_thread {
    fp_context *ctx;
    void *buf;
    size_t bytes;
    cudaStream_t stream;
    const char *name;
    int reps, failed;
} fill_thread;

static void *fill_main(void *p) {
    fill_thread *a = p;
    for (int i = 0; i < a->reps; ++i) {
        uint64_t h = 0;
        a->failed |= fp_trace_begin(a->ctx, (fp_stream)a->stream, a->name, "op", (double)a->bytes, 0, &h) != FP_OK;
        a->failed |= fp_mem_fill(a->ctx, a->buf, i, a->bytes, (fp_stream)a->stream) != FP_OK;
        a->failed |= fp_trace_end(a->ctx, h) != FP_OK;
    }
    return NULL;
}

typedef struct end_thread {
    fp_context *ctx;
    uint64_t span;
    fp_status st;
} end_thread;

static void *end_main(void *p) {
    end_thread *e = p;
    e->st = fp_trace_end(e->ctx, e->span);
    return NULL;
}

static void test_cupti_threads(fp_context *ctx, void *buf, size_t bytes) {
    CHECK_OK(fp_trace_clear(ctx));
    const int reps = 6;
    fill_thread th[2] = {{ctx, buf, bytes, NULL, "big", reps, 0},
                         {ctx, (char *)buf + bytes - 4096, 4096, NULL, "small", reps, 0}};
    pthread_t tid[2];
    for (int i = 0; i < 2; ++i) {
        CHECK(cudaStreamCreateWithFlags(&th[i].stream, cudaStreamNonBlocking) == cudaSuccess);
        CHECK(pthread_create(&tid[i], NULL, fill_main, &th[i]) == 0);
    }
    for (int i = 0; i < 2; ++i) {
        pthread_join(tid[i], NULL);
        CHECK(!th[i].failed);
    }
    /* a span ended on another thread: recorded; this thread's next span
     * pops it as stale and is timed by its own work only */
    end_thread e = {ctx, 0, FP_ERR_INTERNAL};
    CHECK_OK(fp_trace_begin(ctx, NULL, "cross", "op", 0, 0, &e.span));
    pthread_t et;
    CHECK(pthread_create(&et, NULL, end_main, &e) == 0);
    pthread_join(et, NULL);
    CHECK_OK(e.st);
    uint64_t after = 0;
    CHECK_OK(fp_trace_begin(ctx, NULL, "after_cross", "op", 4096, 0, &after));
    CHECK_OK(fp_mem_fill(ctx, buf, 1, 4096, NULL));
    CHECK_OK(fp_trace_end(ctx, after));
    fp_trace_span s[2 * 6 + 2];
    size_t n = 0;
    CHECK_OK(fp_trace_read(ctx, s, sizeof s / sizeof *s, &n, 0));
    CHECK_MSG(n == 2 * (size_t)reps + 2, "%zu spans", n);
    if (n == 2 * (size_t)reps + 2)
        CHECK(!strcmp(s[n - 2].name, "cross") && !strcmp(s[n - 1].name, "after_cross") &&
              s[n - 1].start_s >= s[n - 2].start_s);
    double big_min = 1e30, small_max = 0;
    for (size_t i = 0; i < n; ++i) {
        const double d = s[i].end_s - s[i].start_s;
        CHECK(d >= 0);
        if (!strcmp(s[i].name, "big") && d < big_min) big_min = d;
        if (!strcmp(s[i].name, "small") && d > small_max) small_max = d;
    }
    /* each span is its own fill: 4 KiB fills are shorter than the large ones */
    CHECK_MSG(small_max < big_min, "small spans up to %.3g s, big ones from %.3g s", small_max, big_min);
    for (int i = 0; i < 2; ++i) {
        cudaStreamSynchronize(th[i].stream);
        cudaStreamDestroy(th[i].stream);
    }
}

int main(int argc, char **argv) {
    const int cupti = argc > 1 && strcmp(argv[1], "cupti") == 0;
    fp_context *ctx = fp_test_cuda_context_or_skip();
    const size_t bytes = (size_t)4 << 20;
    void *buf = NULL;
    CHECK_OK(fp_mem_alloc(ctx, bytes, &buf));
    CHECK(fp_trace_get_timer(ctx) == FP_TRACE_TIMER_EVENTS);
    if (cupti) {
#if FP_TEST_EMULATED && defined(FP_HAVE_CUPTI)
        /* another tool owns CUPTI: refused with a message, events stay */
        fp_emu_cupti_set_busy(1);
        CHECK_STATUS(fp_trace_set_timer(ctx, FP_TRACE_TIMER_CUPTI), FP_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(fp_last_error(), "CUPTI") != NULL, "message: %s", fp_last_error());
        CHECK(fp_trace_get_timer(ctx) == FP_TRACE_TIMER_EVENTS);
        fp_emu_cupti_set_busy(0);
#endif
        CHECK_STATUS(fp_trace_set_timer(ctx, (fp_trace_timer)7), FP_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(fp_trace_set_timer(NULL, FP_TRACE_TIMER_CUPTI), FP_ERR_INVALID_ARGUMENT);
        const fp_status ts = fp_trace_set_timer(ctx, FP_TRACE_TIMER_CUPTI);
        if (ts != FP_OK) printf("CUPTI timer unavailable: %s\n", fp_last_error());
        CHECK_OK(ts);
        CHECK(fp_trace_get_timer(ctx) == FP_TRACE_TIMER_CUPTI);
        /* device work outside any span: in no span's times */
        CHECK_OK(fp_mem_fill(ctx, buf, 5, bytes, NULL));
    }
    CHECK_OK(fp_trace_enable(ctx, 256));
    CHECK_OK(fp_trace_set_step(ctx, 7));

    CHECK_OK(fp_trace_push(ctx, "decoder", "forward"));
    uint64_t a = 0;
    CHECK_OK(fp_trace_begin(ctx, NULL, "fill", "op", (double)bytes, 0, &a));
    CHECK(a != 0);
    for (int i = 0; i < 4; ++i) CHECK_OK(fp_mem_fill(ctx, buf, i, bytes, NULL));
    CHECK_OK(fp_trace_end(ctx, a));
    /* the op hook, as an instrumented op calls it */
    uint64_t h = fp_ctx_trace_begin(ctx, NULL, "hooked", "op", 1, 2);
    CHECK(h != 0);
    CHECK_OK(fp_mem_fill(ctx, buf, 1, bytes, NULL));
    fp_ctx_trace_end(ctx, h);
    uint64_t c = 0;
    CHECK_OK(fp_trace_begin_collective(ctx, NULL, "allreduce", 1e6, 2, &c));
    CHECK_OK(fp_trace_end(ctx, c));
    CHECK_OK(fp_trace_pop(ctx));

    /* another stream */
    cudaStream_t s2 = NULL;
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
    uint64_t b = 0;
    CHECK_OK(fp_trace_begin(ctx, (fp_stream)s2, "side", "op", 0, 0, &b));
    CHECK_OK(fp_mem_fill(ctx, buf, 3, bytes, (fp_stream)s2));
    CHECK_OK(fp_trace_end(ctx, b));

    /* a capturing stream: not recorded, counted */
    cudaStream_t cap = NULL;
    CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    uint64_t g = 9;
    CHECK_OK(fp_trace_begin(ctx, (fp_stream)cap, "captured", "op", 0, 0, &g));
    CHECK(g == 0);
    /* the hook records no span (only its NVTX range, host-side) */
    const uint64_t hc = fp_ctx_trace_begin(ctx, (fp_stream)cap, "captured", "op", 0, 0);
    CHECK(hc == FP_SPAN_NVTX);
    fp_ctx_trace_end(ctx, hc);
    cudaGraph_t graph = NULL;
    CHECK(cudaStreamEndCapture(cap, &graph) == cudaSuccess);
    if (graph) cudaGraphDestroy(graph);

    fp_trace_span s[8];
    size_t n = 0;
    CHECK_OK(fp_trace_read(ctx, s, 8, &n, 0));
    CHECK_MSG(n == 5, "%zu spans", n);
    fp_trace_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_OK(fp_trace_get_stats(ctx, &st));
    CHECK(st.skipped_capturing == 2 && st.unresolved == 0 && st.open == 0 && st.recorded == 5);
    CHECK(st.timer == (cupti ? FP_TRACE_TIMER_CUPTI : FP_TRACE_TIMER_EVENTS));
#if FP_TEST_EMULATED && defined(FP_HAVE_CUPTI)
    if (cupti) { /* only the work-enqueuing APIs traced (names with Launch / Memcpy / Memset) */
        fp_emu_cupti_count cc;
        fp_emu_cupti_counts(&cc);
        CHECK_MSG(cc.runtime_apis == 3 && cc.driver_apis == 1 && cc.device_records >= 7 && cc.external_records >= 6 &&
                      cc.buffers_delivered > 0,
                  "runtime apis %d, driver apis %d, device records %lld, external %lld, buffers %lld",
                  cc.runtime_apis, cc.driver_apis, cc.device_records, cc.external_records, cc.buffers_delivered);
    }
#endif
    if (n == 5) {
        const char *names[5] = {"decoder/forward", "fill", "hooked", "allreduce", "side"};
        for (int i = 0; i < 5; ++i) {
            CHECK_MSG(!strcmp(s[i].name, names[i]), "span %d is '%s', expected '%s'", i, s[i].name, names[i]);
            CHECK(s[i].device == fp_context_device_index(ctx));
            CHECK(s[i].end_s >= s[i].start_s);
            CHECK(s[i].step == 7);
        }
        uint64_t def = (uint64_t)(uintptr_t)fp_context_stream(ctx);
        CHECK(s[0].stream == def && s[1].stream == def && s[4].stream == (uint64_t)(uintptr_t)s2);
        CHECK(!strcmp(s[1].module, "decoder") && !strcmp(s[1].stage, "forward") && s[1].depth == 1);
        CHECK(!strcmp(s[3].category, "collective") && s[3].nranks == 2);
        CHECK(inside(&s[0], &s[1]) && inside(&s[0], &s[2]));
        /* a collective with no device work: the host clock (CUPTI), outside
         * the range's device times */
        if (!cupti) CHECK(inside(&s[0], &s[3]));
        CHECK(s[2].start_s >= s[1].end_s - TIME_TOL); /* in stream order */
        if (cupti) { /* the range is exactly the device work inside it */
            CHECK_MSG(s[0].start_s == s[1].start_s && s[0].end_s == s[2].end_s, "range %.9f-%.9f, fill %.9f, "
                      "hooked end %.9f", s[0].start_s, s[0].end_s, s[1].start_s, s[2].end_s);
            CHECK(s[3].end_s >= s[3].start_s && s[3].start_s > 0);
        }
        if (fp_test_timing_meaningful()) /* 16 MB of fills take microseconds on a GPU */
            CHECK_MSG(s[1].end_s - s[1].start_s > 1e-6, "fill span %g s", s[1].end_s - s[1].start_s);
    }

    char dir[] = "/tmp/fp_trace_gpu_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char pj[128], pd[128];
    snprintf(pj, sizeof pj, "%s/t.json", dir);
    snprintf(pd, sizeof pd, "%s/t.db", dir);
    CHECK_OK(fp_trace_export_chrome(ctx, pj));
    CHECK_OK(fp_trace_export_sqlite(ctx, pd));
    CHECK(access(pj, R_OK) == 0 && access(pd, R_OK) == 0);
    unlink(pj);
    unlink(pd);
    rmdir(dir);

    /* clear re-bases; recording goes on */
    CHECK_OK(fp_trace_clear(ctx));
    CHECK_OK(fp_trace_begin(ctx, NULL, "after_clear", "op", 0, 0, &a));
    CHECK_OK(fp_trace_end(ctx, a));
    CHECK_OK(fp_trace_read(ctx, s, 8, &n, 0));
    CHECK(n == 1 && !strcmp(s[0].name, "after_clear"));

    if (cupti) test_cupti_threads(ctx, buf, bytes);

    /* host cost of a span pair on a CUDA context: two event records, the
     * capture query, the ring; printed (the target is 1 us) */
    CHECK_OK(fp_trace_enable(ctx, 1 << 14));
    const int pairs = FP_TEST_EMULATED ? 2000 : 50000;
    for (int rep = 0; rep < 2; ++rep) { /* the first pass creates the slots' events */
        double t0 = fp_now_s();
        for (int i = 0; i < pairs; ++i) {
            uint64_t sp = fp_ctx_trace_begin(ctx, NULL, "empty", "op", 0, 0);
            fp_ctx_trace_end(ctx, sp);
        }
        double ns = (fp_now_s() - t0) * 1e9 / pairs;
        if (rep)
            printf("CUDA context, %s timer: %.0f ns of host time per span begin/end pair (%d pairs%s)\n",
                   cupti ? "CUPTI" : "event", ns, pairs, FP_TEST_EMULATED ? ", emulated runtime" : "");
        if (rep && fp_test_timing_meaningful()) CHECK_MSG(ns < 20000, "a span pair costs %.0f ns", ns);
    }
    CHECK_OK(fp_context_synchronize(ctx, NULL));
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_OK(fp_trace_get_stats(ctx, &st));
    /* the pairs of both passes and the synchronize's own "sync" span */
    const size_t made = 2 * (size_t)pairs + 1;
    size_t want = made < ((size_t)1 << 14) ? made : (size_t)1 << 14;
    CHECK_MSG(st.unresolved == 0 && st.count == want && st.recorded == made,
              "unresolved %llu count %zu recorded %llu", (unsigned long long)st.unresolved, st.count,
              (unsigned long long)st.recorded);

    cudaStreamDestroy(cap);
    cudaStreamSynchronize(s2);
    cudaStreamDestroy(s2);
    CHECK_OK(fp_mem_free(ctx, buf));
    fp_context_destroy(ctx);
    TEST_END();
}
