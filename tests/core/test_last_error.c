/* The rule of fp_last_error (core.h, "Conventions"): a failing call leaves
 * a message; a successful one never changes it, including the paths that
 * fail inside and recover; value-returning functions that fail record one
 * too. And the tolerance checks: a NaN tolerance is an invalid argument. */
#include <math.h>
#include <string.h>

#include "fastpath/fastpath.h"
#include "fp_test.h"

static char earlier[1024];

/* Makes a call fail, keeps its message. */
static void fail_once(void) {
    fp_dtype d;
    CHECK_STATUS(fp_dtype_parse("no-such-dtype", &d), FP_ERR_INVALID_ARGUMENT);
    snprintf(earlier, sizeof earlier, "%s", fp_last_error());
    CHECK(earlier[0] != '\0');
}

#define CHECK_UNCHANGED(what) CHECK_MSG(strcmp(fp_last_error(), earlier) == 0, "%s changed it to '%s'", what, fp_last_error())

static int calls;
static fp_status ok_callable(void *user, fp_stream stream) {
    calls++;
    return FP_OK;
}
static fp_status silent_failure(void *user, fp_stream stream) { return FP_ERR_CUDA; }

int main(void) {
    fail_once();
    fp_context *cpu = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &cpu));
    CHECK_UNCHANGED("fp_context_create");

    /* fp_time's callable: the check of whether it left a message used to
     * clear the caller's. */
    fp_timing_config tc;
    fp_timing_config_default(&tc);
    tc.warmup = 0;
    tc.min_samples = tc.max_samples = 2;
    fp_stats st;
    CHECK_OK(fp_time(cpu, NULL, ok_callable, NULL, &tc, &st));
    CHECK(calls > 0);
    CHECK_UNCHANGED("fp_time");
    /* a callable that fails without a message gets one naming it */
    CHECK_STATUS(fp_time(cpu, NULL, silent_failure, NULL, &tc, &st), FP_ERR_CUDA);
    CHECK(strstr(fp_last_error(), "timed callable failed") != NULL);
    fail_once();

    /* Comparison: fine, then a NaN tolerance refused. */
    float ref[4] = {1, 2, 3, 4}, got[4] = {1, 2, 3, 4};
    fp_compare_result cr;
    CHECK_OK(fp_compare_host(ref, got, 4, FP_F32, -1, -1, &cr));
    CHECK(cr.passed);
    CHECK_UNCHANGED("fp_compare_host");
    memset(&cr, 0x5a, sizeof cr);
    CHECK_STATUS(fp_compare_host(ref, got, 4, FP_F32, NAN, -1, &cr), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "NaN") != NULL);
    CHECK_STATUS(fp_compare_host(ref, got, 4, FP_F32, 1e-3, NAN, &cr), FP_ERR_INVALID_ARGUMENT);
    const unsigned char *raw = (const unsigned char *)&cr;
    CHECK(raw[0] == 0x5a && raw[sizeof cr - 1] == 0x5a); /* untouched */
    fp_ab_spec spec;
    fp_ab_spec_init(&spec);
    spec.baseline = spec.optimized = ok_callable;
    spec.baseline_out = ref;
    spec.optimized_out = got;
    spec.out_count = 4;
    spec.out_dtype = FP_F32;
    spec.atol = NAN;
    fp_ab_report rep;
    calls = 0;
    CHECK_STATUS(fp_ab_run(cpu, NULL, &spec, &tc, &rep), FP_ERR_INVALID_ARGUMENT);
    CHECK(calls == 0); /* refused before running anything */

    /* A value-returning function records why it returned 0. */
    fp_norm_params np;
    fp_norm_params_default(&np); /* no tensors: invalid */
    fp_clear_error();
    CHECK(fp_norm_forward_bytes(&np) == 0.0);
    CHECK(fp_last_error()[0] != '\0');

    /* Successful ops of each capability leave the earlier message. */
    fail_once();
    float x[2 * 8], out[2 * 8], gamma[8], beta[8];
    for (int i = 0; i < 16; ++i) x[i] = (float)i;
    for (int i = 0; i < 8; ++i) gamma[i] = 1, beta[i] = 0;
    np.rows = 2;
    np.cols = 8;
    np.x = x;
    np.out = out;
    np.gamma = gamma;
    np.beta = beta;
    CHECK_OK(fp_norm_forward(cpu, NULL, &np));
    CHECK(fp_norm_forward_bytes(&np) > 0);
    CHECK_UNCHANGED("fp_norm_forward");

    fp_alloc_upstream up = fp_alloc_upstream_host();
    fp_allocator *a = NULL;
    fp_alloc_config ac;
    fp_alloc_config_default(&ac);
    ac.memory_cap_bytes = (size_t)24 << 20;
    CHECK_OK(fp_alloc_create(&up, NULL, &ac, &a));
    void *p1 = NULL, *p2 = NULL;
    CHECK_OK(fp_alloc_alloc(a, (size_t)12 << 20, NULL, &p1));
    CHECK_OK(fp_alloc_free(a, p1));
    /* needs the cached segment released first (an internal OOM, then a retry) */
    CHECK_OK(fp_alloc_alloc(a, (size_t)22 << 20, NULL, &p2));
    CHECK_OK(fp_alloc_free(a, p2));
    CHECK_UNCHANGED("fp_alloc_alloc after a release-and-retry");
    fp_alloc_destroy(a);

    fp_clear_error();
    CHECK(fp_last_error()[0] == '\0');
    fp_context_destroy(cpu);
    TEST_END();
}
