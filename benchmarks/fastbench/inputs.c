/* Random inputs and host timing for scenarios (see scenario.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "scenario.h"

#define FB_CHUNK_BYTES ((size_t)8 << 20)

fp_status fb_fill_random(fp_context *ctx, void *dst, size_t n, fp_dtype dt, uint64_t seed, float lo,
                         float hi) {
    const size_t elt = fp_dtype_size(dt);
    if (elt == 0) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fb_fill_random: unknown dtype %d", (int)dt);
    /* n * elt wrapping would upload n elements' worth of chunks past dst. */
    if (n > SIZE_MAX / elt)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fb_fill_random: %zu elements of %s overflow size_t", n,
                            fp_dtype_name(dt));
    const size_t bytes = n * elt;
    size_t chunk_n = (bytes < FB_CHUNK_BYTES ? bytes : FB_CHUNK_BYTES) / elt;
    if (chunk_n == 0) return FP_OK;
    float *h = malloc(chunk_n * sizeof *h);
    void *hd = malloc(chunk_n * elt);
    fp_status st = (h && hd) ? FP_OK
                             : fp_set_error(FP_ERR_OUT_OF_MEMORY, "fb_fill_random: %zu-element host chunk", chunk_n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7; /* xorshift64* */
    for (size_t i = 0; st == FP_OK && i < chunk_n; ++i) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        float u = (float)((s * 0x2545F4914F6CDD1DULL) >> 40) / (float)(1 << 24);
        float v = lo + (hi - lo) * u;
        h[i] = v == 0.0f ? 0.5f * (lo + hi) + 1e-3f : v;
    }
    if (st == FP_OK) st = fp_convert_host(h, FP_F32, hd, dt, chunk_n);
    for (size_t off = 0; st == FP_OK && off < n; off += chunk_n) {
        size_t cnt = n - off < chunk_n ? n - off : chunk_n;
        st = fp_mem_upload(ctx, (char *)dst + off * elt, hd, cnt * elt, NULL);
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL); /* the host chunk is reused */
    }
    free(h);
    free(hd);
    return st;
}

fp_status fb_alloc_random(fp_context *ctx, size_t n, fp_dtype dt, uint64_t seed, float lo, float hi,
                          void **out) {
    *out = NULL;
    void *p = NULL;
    const size_t elt = fp_dtype_size(dt);
    if (elt == 0) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fb_alloc_random: unknown dtype %d", (int)dt);
    if (n > SIZE_MAX / elt)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fb_alloc_random: %zu elements of %s overflow size_t", n,
                            fp_dtype_name(dt));
    fp_status st = fp_mem_alloc(ctx, n * elt, &p);
    if (st == FP_OK) st = fb_fill_random(ctx, p, n, dt, seed, lo, hi);
    if (st != FP_OK) {
        fp_mem_free(ctx, p);
        return st;
    }
    *out = p;
    return FP_OK;
}

/* ---- host time (scenario.h) ---- */

static double host_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Calls per sample. A launch queue holds about a thousand launches; past it
 * a launch waits for the GPU, and the clock would read kernel time instead
 * of host time. 32 tiny launches per sample, then a synchronization outside
 * the clock, stay far below it. */
enum { HOST_CALLS = 32, HOST_MAX_SAMPLES = 2000 };

fp_status fb_host_time(fb_run *run, fp_context *ctx, fp_timed_fn fn, void *user, fp_stats *out) {
    const fp_timing_config *tc = fb_timing(run);
    const int max = tc->max_samples < HOST_MAX_SAMPLES ? tc->max_samples : HOST_MAX_SAMPLES;
    double *samples = malloc(HOST_MAX_SAMPLES * sizeof *samples);
    if (!samples) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fb_host_time: samples");
    fp_status st = fn(user, NULL); /* warm-up: first-call setup is not launch cost */
    if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
    const double t_end = host_now_ms() + tc->max_time_s * 1e3;
    int n = 0;
    while (st == FP_OK && n < max && (n < tc->min_samples || host_now_ms() < t_end)) {
        const double t0 = host_now_ms();
        for (int i = 0; i < HOST_CALLS && st == FP_OK; ++i) st = fn(user, NULL);
        samples[n++] = (host_now_ms() - t0) / HOST_CALLS;
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
    }
    if (st == FP_OK) st = fp_stats_compute(samples, n, out);
    free(samples);
    return st;
}

void fb_host_report(fb_run *run, const fp_stats *base, const fp_stats *opt, fp_ab_report *rep) {
    memset(rep, 0, sizeof *rep);
    rep->baseline = *base;
    rep->optimized = *opt;
    rep->pct_of_peak = -1;
    rep->bound = "unknown";
    rep->verdict = fp_verdict_decide(base, opt, fb_timing(run)->min_effect, &rep->speedup);
}
