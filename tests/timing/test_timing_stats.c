/* Timing engine: statistics on synthetic durations, the verdict rule,
 * numerical agreement, roofline arithmetic, and fp_time / fp_ab_run on a CPU
 * context with callables of known relative cost. */
#include <string.h>

#include "fp_test.h"

static void test_stats(void) {
    double s[10] = {10, 1, 9, 2, 8, 3, 7, 4, 6, 5}; /* unsorted on purpose */
    double copy[10];
    memcpy(copy, s, sizeof s);
    fp_stats st;
    CHECK_OK(fp_stats_compute(s, 10, &st));
    CHECK(memcmp(copy, s, sizeof s) == 0); /* input untouched */
    CHECK_NEAR(st.median_ms, 5.5, 1e-12);
    CHECK_NEAR(st.mean_ms, 5.5, 1e-12);
    CHECK_NEAR(st.min_ms, 1, 0);
    CHECK_NEAR(st.max_ms, 10, 0);
    CHECK_NEAR(st.p10_ms, 1.9, 1e-12); /* numpy.percentile(range(1,11), 10) */
    CHECK_NEAR(st.p90_ms, 9.1, 1e-12);
    CHECK_NEAR(st.stdev_ms, 3.0276503540974917, 1e-12);
    CHECK_NEAR(st.rel_stdev, 3.0276503540974917 / 5.5, 1e-12);
    CHECK_NEAR(st.noise, (9.1 - 1.9) / (2.5631 * 5.5), 1e-12);
    CHECK(st.samples == 10);

    double one = 3.25;
    CHECK_OK(fp_stats_compute(&one, 1, &st));
    CHECK(st.median_ms == 3.25 && st.p10_ms == 3.25 && st.stdev_ms == 0 && st.noise == 0);

    /* A robust spread: one huge outlier barely moves noise, unlike stdev. */
    double o[20];
    for (int i = 0; i < 20; ++i) o[i] = 1.0 + 0.001 * (i % 5);
    o[7] = 100.0;
    CHECK_OK(fp_stats_compute(o, 20, &st));
    CHECK(st.noise < 0.01 && st.rel_stdev > 1.0);

    fp_stats untouched = {.median_ms = 42};
    double bad[2] = {1, NAN};
    CHECK_STATUS(fp_stats_compute(bad, 2, &untouched), FP_ERR_INVALID_ARGUMENT);
    CHECK(untouched.median_ms == 42);
    double neg[1] = {-1};
    CHECK_STATUS(fp_stats_compute(neg, 1, &st), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_stats_compute(s, 0, &st), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_stats_compute(NULL, 3, &st), FP_ERR_INVALID_ARGUMENT);
}

static fp_stats mk(double median, double noise, int samples) {
    fp_stats s;
    memset(&s, 0, sizeof s);
    s.median_ms = median;
    s.noise = noise;
    s.samples = samples;
    return s;
}

static void test_verdict(void) {
    double sp = 0;
    fp_stats a = mk(2.0, 0.001, 100), b = mk(1.0, 0.001, 100);
    CHECK(fp_verdict_decide(&a, &b, 0.01, &sp) == FP_VERDICT_FASTER);
    CHECK_NEAR(sp, 2.0, 1e-12);
    CHECK(fp_verdict_decide(&b, &a, 0.01, &sp) == FP_VERDICT_SLOWER);
    CHECK_NEAR(sp, 0.5, 1e-12);
    CHECK(fp_verdict_decide(&a, &a, 0.01, &sp) == FP_VERDICT_SAME);
    /* Below min_effect: SAME even with no noise at all. */
    fp_stats c = mk(1.0, 0, 100), d = mk(1.005, 0, 100);
    CHECK(fp_verdict_decide(&d, &c, 0.01, NULL) == FP_VERDICT_SAME);
    CHECK(fp_verdict_decide(&d, &c, 0.001, NULL) == FP_VERDICT_FASTER);
    /* Medians known to 1.25 * 3% / sqrt(n): with 4 samples a side the 5% gap
     * is inside 3 standard errors (8%), with 100 samples (1.6%) it is not. */
    fp_stats e4 = mk(1.05, 0.03, 4), f4 = mk(1.0, 0.03, 4);
    CHECK(fp_verdict_decide(&e4, &f4, 0.01, NULL) == FP_VERDICT_SAME);
    fp_stats e100 = mk(1.05, 0.03, 100), f100 = mk(1.0, 0.03, 100);
    CHECK(fp_verdict_decide(&e100, &f100, 0.01, NULL) == FP_VERDICT_FASTER);
    CHECK(fp_verdict_decide(&f100, &e100, 0.01, NULL) == FP_VERDICT_SLOWER);
    /* samples = 1 (separate runs): the distributions' spread is the noise. */
    fp_stats e1 = mk(1.20, 0.05, 1), f1 = mk(1.0, 0.05, 1);
    CHECK(fp_verdict_decide(&e1, &f1, 0.01, NULL) == FP_VERDICT_SAME);
    /* A loaded machine: a huge spread, but 8x apart over 200 samples each. */
    fp_stats slow = mk(8.0, 2.5, 200), fast = mk(1.0, 2.5, 200);
    CHECK(fp_verdict_decide(&slow, &fast, 0.01, NULL) == FP_VERDICT_FASTER);
    /* Degenerate input never claims a win. */
    fp_stats z = mk(0, 0, 10);
    CHECK(fp_verdict_decide(&z, &f100, 0.01, &sp) == FP_VERDICT_SAME && sp == 0);
    CHECK(fp_verdict_decide(NULL, &f100, 0.01, NULL) == FP_VERDICT_SAME);
    CHECK(strcmp(fp_verdict_string(FP_VERDICT_FASTER), "FASTER") == 0);
}

static void test_compare(void) {
    float ref[6] = {1, -2, 3, 1e-6f, 100, -0.5f}, got[6];
    memcpy(got, ref, sizeof ref);
    fp_compare_result r;
    CHECK_OK(fp_compare_host(ref, got, 6, FP_F32, -1, -1, &r));
    CHECK(r.passed && r.mismatches == 0 && r.max_abs_err == 0 && r.first_bad == SIZE_MAX);
    CHECK(r.atol == 1e-5 && r.rtol == 1e-5);
    got[4] = 100.5f;
    got[2] = NAN;
    CHECK_OK(fp_compare_host(ref, got, 6, FP_F32, -1, -1, &r));
    CHECK(!r.passed && r.mismatches == 2 && r.first_bad == 2 && isnan(r.first_bad_got));
    /* Explicit tolerance admits the 0.5 error but never the NaN. */
    CHECK_OK(fp_compare_host(ref, got, 6, FP_F32, 1.0, 0, &r));
    CHECK(r.mismatches == 1);
    /* bf16: 1 ulp at 1.0 is 2^-7; default tolerance accepts it. */
    uint16_t rb[2] = {fp_f32_to_bf16(1.0f), fp_f32_to_bf16(-3.0f)};
    uint16_t gb[2] = {fp_f32_to_bf16(1.0078125f), fp_f32_to_bf16(-3.0f)};
    CHECK_OK(fp_compare_host(rb, gb, 2, FP_BF16, -1, -1, &r));
    CHECK(r.passed);
    CHECK_NEAR(r.max_abs_err, 0.0078125, 1e-12);
    CHECK_NEAR(r.max_rel_err, 0.0078125, 1e-12);
    gb[1] = fp_f32_to_bf16(-3.5f);
    CHECK_OK(fp_compare_host(rb, gb, 2, FP_BF16, -1, -1, &r));
    CHECK(!r.passed && r.first_bad == 1);
    CHECK_STATUS(fp_compare_host(rb, gb, 2, FP_FP8_E4M3, -1, -1, &r), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_compare_host(NULL, gb, 2, FP_BF16, -1, -1, &r), FP_ERR_INVALID_ARGUMENT);
}

static void test_roofline(void) {
    fp_device_info dev;
    fp_device_info_init(&dev);
    dev.peak_gbps = 1000;
    dev.peak_tflops_fp32 = 10;
    dev.peak_tflops_bf16 = 100;
    fp_ab_report rep;
    /* 1 GB in 2 ms = 500 GB/s = 50% of a 1000 GB/s peak. */
    fp_roofline(&dev, 2.0, 1e9, 1e9, 0, &rep);
    CHECK_NEAR(rep.achieved_gbps, 500, 1e-9);
    CHECK_NEAR(rep.achieved_tflops, 0.5, 1e-12);
    CHECK(strcmp(rep.bound, "memory") == 0);
    CHECK_NEAR(rep.pct_of_peak, 50, 1e-9);
    /* 100 TFLOP on tensor cores in 2 s: 50 TFLOP/s = 50% of 100, compute bound. */
    fp_roofline(&dev, 2000.0, 1e6, 1e14, 1, &rep);
    CHECK(strcmp(rep.bound, "compute") == 0);
    CHECK_NEAR(rep.pct_of_peak, 50, 1e-9);
    fp_device_info cpu;
    fp_device_info_init(&cpu);
    fp_roofline(&cpu, 1.0, 1e9, 0, 0, &rep);
    CHECK(rep.pct_of_peak < 0 && strcmp(rep.bound, "unknown") == 0 && rep.achieved_gbps > 0);
}

/* A callable whose cost is proportional to `work`; writes out[i] = i * k. */
typedef struct busy {
    int work;
    float *out;
    int n;
    float k;
    int calls;
    fp_status fail_with;
} busy;

static volatile double sink;

static fp_status busy_fn(void *user, fp_stream stream) {
    busy *b = user;
    b->calls++;
    if (b->fail_with != FP_OK) return b->fail_with;
    double acc = 0;
    for (int i = 0; i < b->work; ++i) acc += (double)i * 1e-9;
    sink = acc;
    for (int i = 0; i < b->n; ++i) b->out[i] = (float)i * b->k + 1.0f;
    return FP_OK;
}

static void test_time_and_ab(void) {
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.max_time_s = 0.5;
    float o1[64], o2[64];
    busy a = {200000, o1, 64, 0.5f, 0, FP_OK};
    fp_stats st;
    CHECK_OK(fp_time(ctx, NULL, busy_fn, &a, &cfg, &st));
    CHECK(st.samples >= cfg.min_samples && st.median_ms > 0 && st.min_ms <= st.median_ms);
    CHECK(a.calls >= cfg.warmup + st.samples);

    /* Bad configs are refused before anything runs. */
    fp_timing_config bad = cfg;
    bad.struct_size = 3;
    CHECK_STATUS(fp_time(ctx, NULL, busy_fn, &a, &bad, &st), FP_ERR_INVALID_ARGUMENT);
    bad = cfg;
    bad.max_samples = 1;
    CHECK_STATUS(fp_time(ctx, NULL, busy_fn, &a, &bad, &st), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_time(ctx, NULL, NULL, &a, &cfg, &st), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_time(NULL, NULL, busy_fn, &a, &cfg, &st), FP_ERR_INVALID_ARGUMENT);

    /* use_graph is a CUDA mode: ignored on a CPU context; only 0 or 1. */
    fp_timing_config graph_cfg = cfg;
    graph_cfg.use_graph = 1;
    CHECK_OK(fp_time(ctx, NULL, busy_fn, &a, &graph_cfg, &st));
    CHECK(st.samples >= 1 && st.median_ms > 0);
    graph_cfg.use_graph = 2;
    CHECK_STATUS(fp_time(ctx, NULL, busy_fn, &a, &graph_cfg, &st), FP_ERR_INVALID_ARGUMENT);

    /* A callable failing propagates its status. */
    busy f = {10, o1, 64, 1, 0, FP_ERR_UNSUPPORTED};
    CHECK_STATUS(fp_time(ctx, NULL, busy_fn, &f, &cfg, &st), FP_ERR_UNSUPPORTED);

    /* Baseline does 8x the work: FASTER with speedup well above 2. */
    busy slow = {800000, o1, 64, 0.5f, 0, FP_OK}, fast = {100000, o2, 64, 0.5f, 0, FP_OK};
    fp_ab_spec spec;
    fp_ab_spec_init(&spec);
    spec.baseline = busy_fn;
    spec.baseline_user = &slow;
    spec.optimized = busy_fn;
    spec.optimized_user = &fast;
    spec.baseline_out = o1;
    spec.optimized_out = o2;
    spec.out_count = 64;
    spec.out_dtype = FP_F32;
    spec.bytes = 1e6;
    fp_ab_report rep;
    CHECK_OK(fp_ab_run(ctx, NULL, &spec, &cfg, &rep));
    CHECK_MSG(rep.verdict == FP_VERDICT_FASTER, "verdict %s speedup %.2f", fp_verdict_string(rep.verdict), rep.speedup);
    CHECK_MSG(rep.speedup > 2.0 && rep.speedup < 32.0, "speedup %.2f", rep.speedup);
    CHECK(rep.compared && rep.agreement.passed && rep.agreement.count == 64);
    CHECK(rep.achieved_gbps > 0 && rep.pct_of_peak < 0); /* CPU: peak unknown */
    /* Interleaving: both sides sampled, neither starved. */
    CHECK(rep.baseline.samples >= cfg.min_samples || rep.optimized.samples >= cfg.min_samples);

    /* A wrong optimized output is reported, not hidden. */
    fast.k = 0.25f;
    CHECK_OK(fp_ab_run(ctx, NULL, &spec, &cfg, &rep));
    CHECK(rep.compared && !rep.agreement.passed && rep.agreement.first_bad == 1);

    fp_ab_spec half = spec;
    half.optimized_out = NULL;
    CHECK_STATUS(fp_ab_run(ctx, NULL, &half, &cfg, &rep), FP_ERR_INVALID_ARGUMENT);
    fp_ab_spec uninit = spec;
    uninit.struct_size = 0;
    CHECK_STATUS(fp_ab_run(ctx, NULL, &uninit, &cfg, &rep), FP_ERR_INVALID_ARGUMENT);

    double gbps = 0;
    CHECK_OK(fp_measure_copy_bandwidth(ctx, 8 << 20, &gbps));
    CHECK(gbps > 0.1);
    fp_context_destroy(ctx);
}

int main(void) {
    test_stats();
    test_verdict();
    test_compare();
    test_roofline();
    test_time_and_ab();
    TEST_END();
}
