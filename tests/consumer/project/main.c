/* An out-of-tree program using the installed library: version check, device
 * discovery, a CPU context, the timing engine on a small callable, and (when
 * the library has the attention capability: FP_CONSUMER_ATTENTION) a small
 * CPU attention, which links the library's BLAS dependency into a static
 * consumer. */
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

#ifdef FP_CONSUMER_ATTENTION
/* One query row over 3 keys, head_dim 8: V's rows are constants 1, 2, 3,
 * so every output element is the softmax-weighted mean, inside (1, 3). */
static int attention_ok(fp_context *ctx) {
    float q[8], k[24], v[24], o[8];
    for (int i = 0; i < 8; ++i) q[i] = 0.1f * (float)(i + 1);
    for (int j = 0; j < 3; ++j)
        for (int i = 0; i < 8; ++i) {
            k[j * 8 + i] = 0.2f * (float)(j - i);
            v[j * 8 + i] = (float)(j + 1);
        }
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = 1; p.seqlen_q = 1; p.seqlen_k = 3; p.heads_q = 1; p.heads_kv = 1; p.head_dim = 8;
    p.dtype = FP_F32; p.q = q; p.k = k; p.v = v; p.o = o;
    if (fp_attention_forward(ctx, NULL, &p) != FP_OK) {
        fprintf(stderr, "attention: %s\n", fp_last_error());
        return 0;
    }
    for (int i = 0; i < 8; ++i)
        if (!(o[i] > 1.0f && o[i] < 3.0f && o[i] == o[0])) return 0;
    return 1;
}
#endif

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
#ifdef FP_CONSUMER_ATTENTION
    if (!attention_ok(ctx)) {
        fprintf(stderr, "CPU attention gave a wrong result\n");
        return 1;
    }
#endif
    fp_context_destroy(ctx);
    if (fp_context_create(FP_DEVICE_CPU, 0, NULL) != FP_ERR_INVALID_ARGUMENT) return 1;
    printf("libfastpath %s: %d CUDA device(s), median %.4f ms over %d samples (%s)\n",
           fp_version_string(), n, st.median_ms, st.samples, fp_status_string(FP_OK));
    return 0;
}
