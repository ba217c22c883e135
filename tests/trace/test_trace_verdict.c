/* The five-dimension verdict (trace.h, "The verdict") on synthetic spans of
 * known times, bytes and FLOPs: each workload built to be compute-, memory-,
 * launch-, transfer- or sync-bound gets that bound with the exact shares,
 * percentages and the remedy; transfers hidden under ops cost nothing;
 * collectives name the comm buckets; a user range's host time counts as
 * launch; groups by name and module each get their own verdict; and bad
 * input gets a status and a message. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fastpath/trace.h"
#include "fp_test.h"

#define EPS 1e-9
#define MAXS 256

static fp_trace_span g_s[MAXS];
static size_t g_n;

static void reset(void) { g_n = 0; }

static fp_trace_span *add(const char *name, const char *cat, double t0, double t1, double bytes, double flops) {
    fp_trace_span *s = &g_s[g_n++];
    CHECK_OK(fp_trace_span_init(s));
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->category, sizeof s->category, "%s", cat);
    s->start_s = t0;
    s->end_s = t1;
    s->bytes = bytes;
    s->flops = flops;
    return s;
}

static fp_trace_roofs roofs(double tflops, double fma, double copy, double pinned) {
    fp_trace_roofs r;
    CHECK_OK(fp_trace_roofs_init(&r));
    r.compute_tflops = tflops;
    r.fma_tflops = fma;
    r.copy_gbps = copy;
    r.pinned_gbps = pinned;
    return r;
}

static fp_trace_verdict verdict(fp_trace_group_by by, const char *key, const fp_trace_roofs *r) {
    fp_trace_verdict v;
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    CHECK_OK(fp_trace_verdict_spans(g_s, g_n, sizeof g_s[0], by, key, r, &v));
    return v;
}

static int near(double a, double b) { return fabs(a - b) <= EPS + 1e-9 * fabs(b); }

static void expect(const fp_trace_verdict *v, fp_bound b, const char *remedy_word) {
    CHECK_MSG(v->bound == b, "group %s: bound %s, want %s (%s)", v->group, fp_bound_name(v->bound),
              fp_bound_name(b), v->reason);
    CHECK_MSG(v->remedy && strstr(v->remedy, remedy_word), "group %s: remedy '%s' lacks '%s'", v->group,
              v->remedy ? v->remedy : "(null)", remedy_word);
    CHECK(near(v->busy_s + v->transfer_s + v->launch_s + v->sync_s, v->window_s));
    CHECK(near(v->busy_pct + v->transfer_pct + v->launch_pct + v->sync_pct, v->window_s > 0 ? 100 : 0));
    CHECK(v->reason[0] != '\0');
}

static void test_compute_and_memory(void) {
    fp_trace_roofs r = roofs(1.0, 0.5, 100, 20);
    /* ten back-to-back 1 ms ops at 0.8 TFLOP/s and 1 GB/s: compute-bound */
    reset();
    for (int i = 0; i < 10; ++i) add("gemm", "op", i * 1e-3, (i + 1) * 1e-3, 1e6, 0.8e9);
    fp_trace_verdict v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_COMPUTE, "tensor cores");
    CHECK(!strcmp(v.group, "all") && v.spans == 10);
    CHECK(near(v.window_s, 10e-3) && near(v.busy_s, 10e-3) && near(v.launch_s, 0) && near(v.busy_pct, 100));
    CHECK_MSG(near(v.compute_pct, 80) && near(v.memory_pct, 1), "compute %g memory %g", v.compute_pct,
              v.memory_pct);
    CHECK(near(v.flops, 8e9) && near(v.bytes, 1e7));
    /* the FMA roof when there is no tensor roof */
    fp_trace_roofs fma = roofs(0, 2.0, 100, 20);
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &fma);
    CHECK(near(v.compute_pct, 40));

    /* the same ops at 90 GB/s and few FLOPs: memory-bound */
    reset();
    for (int i = 0; i < 10; ++i) add("norm_fwd", "op", i * 1e-3, (i + 1) * 1e-3, 9e7, 1e6);
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_MEMORY, "fusion");
    CHECK(near(v.memory_pct, 90) && near(v.compute_pct, 0.1));
    /* no FLOPs counted: memory, the compute share unknown */
    for (size_t i = 0; i < g_n; ++i) g_s[i].flops = 0;
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_MEMORY, "fusion");
    CHECK(v.compute_pct == -1);
    /* no roofs: busy, but what bounds it is unknown */
    v = verdict(FP_TRACE_GROUP_ALL, NULL, NULL);
    CHECK(v.bound == FP_BOUND_UNKNOWN && v.memory_pct == -1 && v.compute_pct == -1 && v.remedy != NULL);
    CHECK_MSG(strstr(v.reason, "no bytes or FLOPs") != NULL, "%s", v.reason);
    /* two streams running at once: the busy time is their union */
    reset();
    add("a", "op", 0, 2e-3, 1e8, 0);
    add("b", "op", 1e-3, 3e-3, 1e8, 0);
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    CHECK(near(v.busy_s, 3e-3) && near(v.window_s, 3e-3));
    CHECK_MSG(near(v.memory_pct, 100 * 2e8 / 3e-3 / 100e9), "%g", v.memory_pct);
}

static void test_launch(void) {
    fp_trace_roofs r = roofs(1.0, 0.5, 100, 20);
    /* 10 us ops with 90 us of host time between them */
    reset();
    for (int i = 0; i < 10; ++i) add("tiny", "op", i * 100e-6, i * 100e-6 + 10e-6, 1e3, 0);
    fp_trace_verdict v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_LAUNCH, "CUDA graphs");
    CHECK(near(v.window_s, 910e-6) && near(v.busy_s, 100e-6) && near(v.launch_s, 810e-6) && near(v.sync_s, 0));
    CHECK_MSG(strstr(v.reason, "9 gaps") != NULL, "%s", v.reason);
    /* a user range around one op: the range's host time is the workload's */
    reset();
    fp_trace_span *range = add("model/step", "range", 0, 2e-3, 0, 0);
    snprintf(range->module, sizeof range->module, "model");
    add("norm_fwd", "op", 0.2e-3, 0.7e-3, 4.5e7, 0)->depth = 1;
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_LAUNCH, "CUDA graphs");
    CHECK(v.spans == 1 && near(v.window_s, 2e-3) && near(v.launch_s, 1.5e-3) && near(v.busy_s, 0.5e-3));
    CHECK(near(v.memory_pct, 90));
}

static void test_transfer(void) {
    fp_trace_roofs r = roofs(1.0, 0.5, 100, 20);
    /* 1 ms copies of 10 MB (10 GB/s, half the pinned peak), each followed
     * by a 0.2 ms op */
    reset();
    for (int i = 0; i < 4; ++i) {
        double t = i * 1.2e-3;
        add("h2d", FP_TRACE_TRANSFER, t, t + 1e-3, 1e7, 0);
        add("norm_fwd", "op", t + 1e-3, t + 1.2e-3, 1e7, 0);
    }
    fp_trace_verdict v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_TRANSFER, "pinned async pipeline");
    CHECK(near(v.transfer_s, 4e-3) && near(v.busy_s, 0.8e-3) && near(v.window_s, 4.8e-3) && !v.collectives);
    CHECK(near(v.transfer_bytes, 4e7) && near(v.transfer_gbps, 10) && near(v.transfer_pct_of_peak, 50));
    CHECK(near(v.bytes, 4e7)); /* the ops' bytes only */
    /* the pipeline's stage names count as transfers too */
    for (size_t i = 0; i < g_n; i += 2) {
        snprintf(g_s[i].name, sizeof g_s[i].name, "pipeline_h2d");
        snprintf(g_s[i].category, sizeof g_s[i].category, "pipeline");
    }
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    CHECK(v.bound == FP_BOUND_TRANSFER && near(v.transfer_s, 4e-3));
    /* the same copies hidden under a long op on another stream cost nothing */
    add("gemm", "op", 0, 4.8e-3, 0, 3.84e9);
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_COMPUTE, "tensor cores");
    CHECK(near(v.transfer_s, 0) && near(v.busy_s, 4.8e-3) && near(v.transfer_gbps, 10));
    /* collectives: the comm buckets */
    reset();
    add("backward", "op", 0, 1e-3, 1e8, 0);
    add("allreduce", "collective", 1e-3, 4e-3, 1e8, 0)->nranks = 8;
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_TRANSFER, "bucketed all-reduce");
    CHECK(v.collectives == 1 && near(v.transfer_s, 3e-3) && v.transfer_gbps == -1);
    CHECK_MSG(strstr(v.reason, "collectives") != NULL, "%s", v.reason);
}

static void test_sync(void) {
    fp_trace_roofs r = roofs(1.0, 0.5, 100, 20);
    /* a 0.1 ms op; the host waits for it, then spends 50 us before the
     * next: the wait and the bubble after it are the sync's */
    reset();
    for (int i = 0; i < 5; ++i) {
        double t = i * 1.05e-3;
        add("norm_fwd", "op", t, t + 0.1e-3, 9e6, 0);
        add("synchronize", FP_TRACE_SYNC, t + 0.05e-3, t + 1e-3, 0, 0);
    }
    fp_trace_verdict v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    expect(&v, FP_BOUND_SYNC, "host waits");
    CHECK_MSG(near(v.busy_s, 0.5e-3) && near(v.sync_s, 4 * 0.95e-3 + 0.9e-3) && near(v.launch_s, 0),
              "busy %g sync %g launch %g", v.busy_s, v.sync_s, v.launch_s);
    CHECK_MSG(strstr(v.reason, "5 wait(s)") != NULL, "%s", v.reason);
    /* the same gaps without the waits are launch gaps */
    size_t k = 0;
    for (size_t i = 0; i < g_n; ++i)
        if (strcmp(g_s[i].category, FP_TRACE_SYNC) != 0) g_s[k++] = g_s[i];
    g_n = k;
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    CHECK(v.bound == FP_BOUND_LAUNCH && near(v.launch_s, 4 * 0.95e-3) && near(v.sync_s, 0));
}

/* A step of four parts, grouped by name and by module. */
static void test_groups(void) {
    fp_trace_roofs r = roofs(1.0, 0.5, 100, 20);
    reset();
    double t = 0;
    fp_trace_span *s;
    /* attention: 2 ms compute-bound */
    s = add("attention_fwd", "op", t, t + 2e-3, 1e6, 1.6e9);
    snprintf(s->module, sizeof s->module, "attn");
    t += 2e-3;
    /* norm: 1 ms memory-bound */
    s = add("norm_fwd", "op", t, t + 1e-3, 8e7, 0);
    snprintf(s->module, sizeof s->module, "mlp");
    t += 1e-3;
    /* 20 tiny ops, each after 40 us of host time */
    for (int i = 0; i < 20; ++i) {
        t += 40e-6;
        s = add("bias_add", "op", t, t + 5e-6, 1e3, 0);
        snprintf(s->module, sizeof s->module, "mlp");
        t += 5e-6;
    }
    /* a wait and a readback */
    s = add("synchronize", FP_TRACE_SYNC, t, t + 0.5e-3, 0, 0);
    snprintf(s->module, sizeof s->module, "loss");
    t += 0.6e-3;
    s = add("d2h", FP_TRACE_TRANSFER, t, t + 0.2e-3, 2e6, 0);
    snprintf(s->module, sizeof s->module, "loss");

    fp_trace_verdict g[8];
    size_t count = 0;
    CHECK_OK(fp_trace_verdict_groups(g_s, g_n, sizeof g_s[0], FP_TRACE_GROUP_NAME, &r, g, sizeof g[0], 8, &count));
    CHECK_MSG(count == 5, "%zu groups", count);
    for (size_t i = 1; i < count && i < 8; ++i) CHECK(g[i - 1].window_s >= g[i].window_s);
    const fp_bound want[5] = {FP_BOUND_COMPUTE, FP_BOUND_MEMORY, FP_BOUND_LAUNCH, FP_BOUND_SYNC, FP_BOUND_TRANSFER};
    const char *names[5] = {"attention_fwd", "norm_fwd", "bias_add", "synchronize", "d2h"};
    for (int k = 0; k < 5; ++k) {
        const fp_trace_verdict *hit = NULL;
        for (size_t i = 0; i < count && i < 8; ++i)
            if (!strcmp(g[i].group, names[k])) hit = &g[i];
        CHECK_MSG(hit != NULL, "no group %s", names[k]);
        if (hit) CHECK_MSG(hit->bound == want[k], "%s: %s (%s)", names[k], fp_bound_name(hit->bound), hit->reason);
    }
    /* bias_add is charged the 40 us before each of its 20 launches */
    fp_trace_verdict v = verdict(FP_TRACE_GROUP_NAME, "bias_add", &r);
    CHECK(v.spans == 20 && near(v.launch_s, 20 * 40e-6) && near(v.busy_s, 20 * 5e-6));
    /* the sync group: the wait, and the 0.1 ms until the readback */
    v = verdict(FP_TRACE_GROUP_NAME, "synchronize", &r);
    CHECK_MSG(near(v.sync_s, 0.6e-3) && v.bound == FP_BOUND_SYNC, "sync %g", v.sync_s);
    /* by module: mlp holds the norm and the tiny ops */
    v = verdict(FP_TRACE_GROUP_MODULE, "mlp", &r);
    CHECK(v.spans == 21 && near(v.busy_s, 1e-3 + 20 * 5e-6) && near(v.launch_s, 20 * 40e-6));
    CHECK(v.bound == FP_BOUND_MEMORY);
    CHECK_OK(fp_trace_verdict_groups(g_s, g_n, sizeof g_s[0], FP_TRACE_GROUP_MODULE, &r, NULL, sizeof g[0], 0,
                                     &count));
    CHECK(count == 3);
    /* the whole step */
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    CHECK(near(v.window_s, t + 0.2e-3) && v.spans == g_n);
}

static void test_bad_input(void) {
    fp_trace_roofs r = roofs(1.0, 0.5, 100, 20);
    fp_trace_verdict v;
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    reset();
    add("a", "op", 0, 1e-3, 1, 0);
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, sizeof g_s[0], FP_TRACE_GROUP_ALL, NULL, &r, NULL),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_verdict_spans(NULL, 1, sizeof g_s[0], FP_TRACE_GROUP_ALL, NULL, &r, &v),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, 8, FP_TRACE_GROUP_ALL, NULL, &r, &v), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, sizeof g_s[0], (fp_trace_group_by)9, "a", &r, &v),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, sizeof g_s[0], FP_TRACE_GROUP_NAME, NULL, &r, &v),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, sizeof g_s[0], FP_TRACE_GROUP_NAME, "nope", &r, &v),
                 FP_ERR_NOT_FOUND);
    CHECK(strstr(fp_last_error(), "nope") != NULL);
    fp_trace_verdict bad = v;
    bad.struct_size = 3;
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, sizeof g_s[0], FP_TRACE_GROUP_ALL, NULL, &r, &bad),
                 FP_ERR_INVALID_ARGUMENT);
    fp_trace_roofs nan_roof = r;
    nan_roof.copy_gbps = NAN;
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, sizeof g_s[0], FP_TRACE_GROUP_ALL, NULL, &nan_roof, &v),
                 FP_ERR_INVALID_ARGUMENT);
    g_s[0].end_s = -1;
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, sizeof g_s[0], FP_TRACE_GROUP_ALL, NULL, &r, &v),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "span 0") != NULL);
    g_s[0].end_s = NAN;
    CHECK_STATUS(fp_trace_verdict_spans(g_s, 1, sizeof g_s[0], FP_TRACE_GROUP_ALL, NULL, &r, &v),
                 FP_ERR_INVALID_ARGUMENT);
    size_t count = 7;
    CHECK_STATUS(fp_trace_verdict_groups(g_s, 1, sizeof g_s[0], FP_TRACE_GROUP_ALL, &r, &v, sizeof v, 1, &count),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_verdict_groups(g_s, 0, sizeof g_s[0], FP_TRACE_GROUP_NAME, &r, NULL, sizeof v, 1, &count),
                 FP_ERR_INVALID_ARGUMENT);
    /* nothing to judge is not an error: the bound is unknown */
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    CHECK_OK(fp_trace_verdict_spans(NULL, 0, sizeof g_s[0], FP_TRACE_GROUP_ALL, NULL, &r, &v));
    CHECK(v.bound == FP_BOUND_UNKNOWN && v.spans == 0 && v.window_s == 0 && v.remedy != NULL);
    reset();
    add("instant", "op", 1, 1, 0, 0);
    v = verdict(FP_TRACE_GROUP_ALL, NULL, &r);
    CHECK(v.bound == FP_BOUND_UNKNOWN && v.spans == 1);
    CHECK_OK(fp_trace_verdict_groups(NULL, 0, sizeof g_s[0], FP_TRACE_GROUP_NAME, &r, NULL, sizeof v, 0, &count));
    CHECK(count == 0);
    /* the names */
    const char *want[] = {"unknown", "compute", "memory", "launch", "transfer", "sync"};
    for (int b = 0; b <= 5; ++b) CHECK(!strcmp(fp_bound_name((fp_bound)b), want[b]));
    CHECK(!strcmp(fp_bound_name((fp_bound)42), "?"));
}

static void test_roofs_measure(void) {
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, -1, &ctx));
    fp_trace_roofs r;
    CHECK_OK(fp_trace_roofs_init(&r));
    CHECK_OK(fp_trace_roofs_measure(ctx, &r));
    printf("CPU roofs: FMA %.3f TFLOP/s, copy %.1f GB/s, memcpy transfer %.1f GB/s\n", r.fma_tflops, r.copy_gbps,
           r.pinned_gbps);
    CHECK(r.compute_tflops == 0 && r.fma_tflops > 0 && r.copy_gbps > 0 && r.pinned_gbps > 0);
    fp_trace_roofs bad = r;
    bad.struct_size = 1;
    CHECK_STATUS(fp_trace_roofs_measure(ctx, &bad), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_roofs_measure(NULL, &r), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_roofs_measure(ctx, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_context_destroy(ctx);
}

int main(void) {
    test_compute_and_memory();
    test_launch();
    test_transfer();
    test_sync();
    test_groups();
    test_bad_input();
    test_roofs_measure();
    TEST_END();
}
