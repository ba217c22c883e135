/* Core and timing engine on a CUDA device (label gpu; exits 77 without one):
 * context, memory helpers, the probe kernels against the CPU versions on
 * poisoned outputs (odd sizes, misaligned pointers), event timing, A/B with L2
 * flush, copy bandwidth against the device peak; FASTPATH_PDL and
 * FP_CTX_LAUNCH_PDL. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "fp_test.h"
#include "internal.h"
#include "timing/probes.h"

static void check_axpby(fp_context *gpu, fp_context *cpu, fp_dtype dt, size_t n, size_t offset) {
    size_t es = fp_dtype_size(dt), bytes = (n + offset) * es;
    float *hx = malloc(n * 4), *hy = malloc(n * 4);
    void *cx = malloc(bytes), *cy = malloc(bytes), *cref = malloc(bytes), *cgot = malloc(bytes);
    fp_test_fill(hx, n, 11 + n, -2, 2);
    fp_test_fill(hy, n, 13 + n, -2, 2);
    CHECK_OK(fp_convert_host(hx, FP_F32, (char *)cx + offset * es, dt, n));
    CHECK_OK(fp_convert_host(hy, FP_F32, (char *)cy + offset * es, dt, n));
    CHECK_OK(fp_axpby(cpu, NULL, 1, dt, n, 1.5f, (char *)cx + offset * es, -0.75f, (char *)cy + offset * es, cref));
    void *dx, *dy, *dout;
    CHECK_OK(fp_mem_alloc(gpu, bytes, &dx));
    CHECK_OK(fp_mem_alloc(gpu, bytes, &dy));
    CHECK_OK(fp_mem_alloc(gpu, bytes, &dout));
    CHECK_OK(fp_mem_upload(gpu, dx, cx, bytes, NULL));
    CHECK_OK(fp_mem_upload(gpu, dy, cy, bytes, NULL));
    for (int version = 1; version <= 2; ++version) {
        CHECK_OK(fp_mem_fill(gpu, dout, 0xff, bytes, NULL)); /* poison: NaN */
        CHECK_OK(fp_axpby(gpu, NULL, version, dt, n, 1.5f, (char *)dx + offset * es, -0.75f,
                          (char *)dy + offset * es, (char *)dout + offset * es));
        CHECK_OK(fp_mem_download(gpu, cgot, dout, bytes, NULL));
        CHECK_OK(fp_context_synchronize(gpu, NULL));
        fp_compare_result r;
        /* exact: the kernels round alpha * x, beta * y and the sum separately,
         * as the CPU does (nvcc's default fma contraction made f32 differ in
         * the last bit for about half the elements) */
        CHECK_OK(fp_compare_host(cref, (char *)cgot + offset * es, n, dt, 0, 0, &r));
        CHECK_MSG(r.passed, "axpby v%d %s n=%zu offset=%zu: %zu mismatches, first at %zu (got %g want %g)",
                  version, fp_dtype_name(dt), n, offset, r.mismatches, r.first_bad, r.first_bad_got,
                  r.first_bad_ref);
    }
    fp_mem_free(gpu, dx);
    fp_mem_free(gpu, dy);
    fp_mem_free(gpu, dout);
    free(hx); free(hy); free(cx); free(cy); free(cref); free(cgot);
}

typedef struct copy_case {
    fp_context *ctx;
    int version;
    void *dst, *src;
    size_t bytes;
} copy_case;

static fp_status copy_fn(void *u, fp_stream s) {
    copy_case *c = u;
    return fp_copy(c->ctx, s, c->version, c->dst, c->src, c->bytes);
}

typedef struct small_axpby {
    fp_context *ctx;
    void *x, *y, *out;
    size_t n;
} small_axpby;

static fp_status small_axpby_fn(void *u, fp_stream s) {
    small_axpby *c = u;
    return fp_axpby(c->ctx, s, 2, FP_F32, c->n, 1.5f, c->x, -0.75f, c->y, c->out);
}

/* Synchronizes its stream: legal when run, illegal while being captured. */
static fp_status syncing_fn(void *u, fp_stream s) {
    fp_status st = small_axpby_fn(u, s);
    if (st != FP_OK) return st;
    return cudaStreamSynchronize((cudaStream_t)s) == cudaSuccess ? FP_OK : FP_ERR_CUDA;
}

/* use_graph: a small kernel timed through graph replays has no launch gaps,
 * so its median is not above the plain one; a callable that cannot be
 * captured gives FP_ERR_UNSUPPORTED and leaves the stream usable. */
static void test_graph_timing(fp_context *gpu) {
    small_axpby c = {gpu, NULL, NULL, NULL, 4096};
    CHECK_OK(fp_mem_alloc(gpu, c.n * 4, &c.x));
    CHECK_OK(fp_mem_alloc(gpu, c.n * 4, &c.y));
    CHECK_OK(fp_mem_alloc(gpu, c.n * 4, &c.out));
    CHECK_OK(fp_mem_fill(gpu, c.x, 0x3f, c.n * 4, NULL));
    CHECK_OK(fp_mem_fill(gpu, c.y, 0x3e, c.n * 4, NULL));
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.max_time_s = 0.3;
    fp_stats plain, graph;
    CHECK_OK(fp_time(gpu, NULL, small_axpby_fn, &c, &cfg, &plain));
    cfg.use_graph = 1;
    CHECK_OK(fp_time(gpu, NULL, small_axpby_fn, &c, &cfg, &graph));
    if (fp_test_timing_meaningful()) /* emulated: launches cost CPU time either way, replays gain nothing to measure */
        CHECK_MSG(graph.median_ms <= plain.median_ms * 1.1, "graph %.4f ms vs plain %.4f ms per call",
                  graph.median_ms, plain.median_ms);
    CHECK(graph.samples >= 1 && graph.median_ms > 0 && plain.samples >= 1 && plain.median_ms > 0);
    printf("small axpby: plain %.2f us, graph replay %.2f us per call\n", plain.median_ms * 1e3, graph.median_ms * 1e3);
    CHECK_STATUS(fp_time(gpu, NULL, syncing_fn, &c, &cfg, &graph), FP_ERR_UNSUPPORTED);
    cfg.use_graph = 0;
    CHECK_OK(fp_time(gpu, NULL, small_axpby_fn, &c, &cfg, &plain)); /* the stream still works */
    fp_mem_free(gpu, c.x);
    fp_mem_free(gpu, c.y);
    fp_mem_free(gpu, c.out);
}

int main(void) {
    fp_context *gpu = fp_test_cuda_context_or_skip(), *cpu = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &cpu));
    CHECK(fp_context_kind(gpu) == FP_DEVICE_CUDA && fp_context_stream(gpu) != NULL);
    fp_device_info info;
    fp_device_info_init(&info);
    CHECK_OK(fp_context_device_info(gpu, &info));
    CHECK(info.sm_count > 0 && info.peak_gbps > 100 && info.peak_tflops_bf16 > info.peak_tflops_fp32);
    printf("device %s cc %d.%d, %d SMs, peak %.0f GB/s, %.0f bf16 TFLOP/s\n", info.name, info.cc_major,
           info.cc_minor, info.sm_count, info.peak_gbps, info.peak_tflops_bf16);

    /* the scratch pool's threshold: none, 64 MiB, default */
    CHECK_OK(fp_context_set_option(gpu, FP_CTX_SCRATCH_KEEP_BYTES, -1));
    CHECK_OK(fp_context_set_option(gpu, FP_CTX_SCRATCH_KEEP_BYTES, 64 << 20));
    CHECK_OK(fp_context_set_option(gpu, FP_CTX_SCRATCH_KEEP_BYTES, 0));

    /* programmatic dependent launch: FASTPATH_PDL at a context's creation
     * (1 on, 0 off, anything else ignored with a line on stderr) and
     * FP_CTX_LAUNCH_PDL; on only where the device has it (cc 9.0+) */
    const int has_pdl = info.cc_major >= 9;
    static const char *env_vals[] = {"1", "0", "yes", ""};
    const int env_want[] = {has_pdl, 0, 0, 0};
    for (int i = 0; i < 4; ++i) {
        setenv("FASTPATH_PDL", env_vals[i], 1);
        fp_context *c = NULL;
        CHECK_OK(fp_context_create(FP_DEVICE_CUDA, fp_context_device_index(gpu), &c));
        CHECK_MSG(c && c->launch_pdl == env_want[i], "FASTPATH_PDL=%s: launch_pdl %d, expected %d", env_vals[i],
                  c ? c->launch_pdl : -1, env_want[i]);
        if (!c) continue;
        CHECK_OK(fp_context_set_option(c, FP_CTX_LAUNCH_PDL, 1));
        CHECK(c->launch_pdl == has_pdl);
        CHECK_OK(fp_context_set_option(c, FP_CTX_LAUNCH_PDL, -1));
        CHECK(c->launch_pdl == 0);
        CHECK_STATUS(fp_context_set_option(c, FP_CTX_LAUNCH_PDL, 2), FP_ERR_INVALID_ARGUMENT);
        fp_context_destroy(c);
    }
    unsetenv("FASTPATH_PDL");

    fp_dtype dts[3] = {FP_F32, FP_F16, FP_BF16};
    size_t sizes[5] = {1, 7, 1000, 4099, (1 << 20) + 3};
    for (int pdl = -1; pdl <= 1; pdl += 2) { /* without and with programmatic dependent launch */
        CHECK_OK(fp_context_set_option(gpu, FP_CTX_LAUNCH_PDL, pdl));
        for (int d = 0; d < 3; ++d)
            for (int s = 0; s < 5; ++s) {
                check_axpby(gpu, cpu, dts[d], sizes[s], 0);
                check_axpby(gpu, cpu, dts[d], sizes[s], 1); /* misaligned: takes the scalar path */
            }
    }
    CHECK_OK(fp_context_set_option(gpu, FP_CTX_LAUNCH_PDL, 0));

    /* A/B on the device: vector copy vs cudaMemcpy, with and without L2 flush. */
    size_t bytes = FP_TEST_EMULATED ? 1u << 20 : 256u << 20;
    void *src, *d1, *d2;
    CHECK_OK(fp_mem_alloc(gpu, bytes, &src));
    CHECK_OK(fp_mem_alloc(gpu, bytes, &d1));
    CHECK_OK(fp_mem_alloc(gpu, bytes, &d2));
    CHECK_OK(fp_mem_fill(gpu, src, 0x3c, bytes, NULL));
    copy_case a = {gpu, 1, d1, src, bytes}, b = {gpu, 2, d2, src, bytes};
    for (int flush = 0; flush <= 1; ++flush) {
        fp_timing_config cfg;
        fp_timing_config_default(&cfg);
        cfg.flush_l2 = flush;
        cfg.max_time_s = 0.5;
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = copy_fn;
        spec.baseline_user = &a;
        spec.optimized = copy_fn;
        spec.optimized_user = &b;
        spec.baseline_out = d1;
        spec.optimized_out = d2;
        spec.out_count = bytes / 4;
        spec.out_dtype = FP_F32;
        spec.atol = 0;
        spec.rtol = 0;
        spec.bytes = 2.0 * bytes;
        fp_ab_report rep;
        CHECK_OK(fp_ab_run(gpu, NULL, &spec, &cfg, &rep));
        CHECK(rep.agreement.passed);
        CHECK(rep.optimized.samples >= 1 && rep.optimized.median_ms > 0);
        if (fp_test_timing_meaningful())
            CHECK_MSG(rep.pct_of_peak > 30 && rep.pct_of_peak < 110, "copy at %.1f%% of peak", rep.pct_of_peak);
        printf("copy flush=%d: cudaMemcpy %.3f ms, kernel %.3f ms (%.0f GB/s, %.1f%% of peak) %s\n", flush,
               rep.baseline.median_ms, rep.optimized.median_ms, rep.achieved_gbps, rep.pct_of_peak,
               fp_verdict_string(rep.verdict));
    }
    double gbps = 0;
    CHECK_OK(fp_measure_copy_bandwidth(gpu, FP_TEST_EMULATED ? 1u << 20 : 0, &gbps));
    CHECK(!fp_test_timing_meaningful() ? gbps > 0 : gbps > 0.3 * info.peak_gbps && gbps < 1.1 * info.peak_gbps);
    printf("measured copy bandwidth %.0f GB/s (%.1f%% of %.0f)\n", gbps, 100 * gbps / info.peak_gbps, info.peak_gbps);
    fp_mem_free(gpu, src);
    fp_mem_free(gpu, d1);
    fp_mem_free(gpu, d2);

    test_graph_timing(gpu);

    /* Out-of-memory is a status, not a crash. */
    void *huge = NULL;
    CHECK_STATUS(fp_mem_alloc(gpu, (size_t)1 << 50, &huge), FP_ERR_OUT_OF_MEMORY);
    CHECK(huge == NULL);
    CHECK_STATUS(fp_context_create(FP_DEVICE_CUDA, 4096, &cpu), FP_ERR_NO_DEVICE);
    fp_context_destroy(gpu);
    fp_context_destroy(cpu);
    TEST_END();
}
