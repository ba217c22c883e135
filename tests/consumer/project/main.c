/* An out-of-tree program using the installed library: version check, device
 * discovery, a CPU context, the timing engine on a small callable. */
#include <fastpath/fastpath.h>
#include <stdio.h>
#include <string.h>

static volatile double sink;

static fp_status work(void *user, fp_stream stream) {
    (void)stream;
    double acc = 0;
    for (int i = 0; i < *(int *)user; ++i) acc += i * 0.5;
    sink = acc;
    return FP_OK;
}

int main(void) {
    if (fp_version() != FP_VERSION_NUMBER) {
        fprintf(stderr, "header/library mismatch: %d vs %d\n", FP_VERSION_NUMBER, fp_version());
        return 1;
    }
    int n = -1;
    if (fp_device_count(&n) != FP_OK || n < 0) return 1;
    fp_context *ctx = NULL;
    if (fp_context_create(FP_DEVICE_CPU, 0, &ctx) != FP_OK) {
        fprintf(stderr, "cpu context: %s\n", fp_last_error());
        return 1;
    }
    int iters = 10000;
    fp_stats st;
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.max_time_s = 0.2;
    if (fp_time(ctx, NULL, work, &iters, &cfg, &st) != FP_OK || st.samples < 1 || st.median_ms <= 0) {
        fprintf(stderr, "fp_time: %s\n", fp_last_error());
        return 1;
    }
    fp_context_destroy(ctx);
    if (fp_context_create(FP_DEVICE_CPU, 0, NULL) != FP_ERR_INVALID_ARGUMENT) return 1;
    printf("libfastpath %s: %d CUDA device(s), median %.4f ms over %d samples (%s)\n",
           fp_version_string(), n, st.median_ms, st.samples, fp_status_string(FP_OK));
    return 0;
}
