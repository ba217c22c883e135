/* pipeline/... scenarios: the link the pipeline's copies are judged against.
 *
 *   pipeline/bandwidth  host <-> device copy bandwidth (fp_copy_bandwidth)
 *                       for pageable, pinned, registered and write-combined
 *                       host memory, each direction: one row per (kind,
 *                       direction) with its GB/s and its share of the pinned
 *                       figure of that direction measured in the same run.
 *                       --mib N (default 256 on CUDA, 16 on CPU, 4 with
 *                       --quick there). On a CPU context every kind is plain
 *                       memory and the copy memcpy: a figure for the host's
 *                       memory, not for a link.
 *   pipeline/host_memcpy
 *                       the host's memcpy GB/s from pageable into pinned
 *                       memory by the pipeline's own staging copy
 *                       (fp_stage_copy, 1 MiB pieces) with 1, 2, 4, 8 and
 *                       16 threads (up to the cores), --mib N (default
 *                       256, 16 with --quick).
 *                       A pageable pipeline's roofline: each byte staged in
 *                       and copied out costs the host 2 + 2 bytes of
 *                       memory traffic on top of the DMA's 2.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "fastpath/pipeline.h"
#include "pipeline/bandwidth.h"
#include "scenario.h"

static const fp_host_memory_kind kinds[] = {FP_HOST_PAGEABLE, FP_HOST_PINNED, FP_HOST_REGISTERED,
                                            FP_HOST_WRITE_COMBINED};
#define NKINDS (int)(sizeof kinds / sizeof kinds[0])

typedef struct measured {
    fp_status st;
    char detail[512];
    double gbps;
    fp_stats stats;
} measured;

static fp_status run_bandwidth(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    const int gpu = fb_kind(run) == FP_DEVICE_CUDA;
    const int64_t mib_opt = fb_opt_int(run, "mib", gpu ? 256 : (fb_quick(run) ? 4 : 16));
    /* mib << 20 must not wrap (timing/copy's rule) */
    const size_t mib = mib_opt > 0 && mib_opt <= ((int64_t)1 << 40) ? (size_t)mib_opt : 0;
    if (mib == 0) {
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "mib", mib_opt);
        fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--mib must be in [1, 2^40]");
        return FP_OK;
    }
    /* Every figure first: each row's share needs the pinned one of its direction. */
    measured m[2][NKINDS];
    for (int dir = 0; dir < 2; ++dir) {
        for (int k = 0; k < NKINDS; ++k) {
            measured *x = &m[dir][k];
            x->st = fp_copy_bandwidth(ctx, kinds[k], (fp_copy_direction)dir, mib << 20, fb_timing(run), &x->gbps,
                                      &x->stats);
            if (x->st != FP_OK) snprintf(x->detail, sizeof x->detail, "%s", fp_last_error());
        }
    }
    for (int dir = 0; dir < 2; ++dir) {
        const measured *pinned = &m[dir][1];
        for (int k = 0; k < NKINDS; ++k) {
            const measured *x = &m[dir][k];
            fb_result *r = fb_result_new(run);
            fb_param_str(r, "kind", fp_host_memory_kind_name(kinds[k]));
            fb_param_str(r, "direction", dir == FP_COPY_H2D ? "h2d" : "d2h");
            fb_param_int(r, "mib", mib_opt);
            if (x->st != FP_OK) {
                fb_result_fail(r, x->st, x->detail);
                continue;
            }
            fb_result_metric(r, "gbps", x->gbps);
            if (pinned->st == FP_OK) fb_result_metric(r, "pct_of_pinned", 100.0 * x->gbps / pinned->gbps);
            else fb_result_note(r, "no pinned figure to compare with");
            fb_result_metric(r, "median_ms", x->stats.median_ms);
            fb_result_metric(r, "noise", x->stats.noise);
            if (!gpu) fb_result_note(r, "CPU: memcpy, no link");
        }
    }
    return FP_OK;
}

FB_SCENARIO(fb_pipeline_bandwidth, "pipeline/bandwidth",
            "host<->device copy GB/s per host memory kind (pageable, pinned, registered, write-combined) "
            "and direction, as % of pinned",
            run_bandwidth)

/* ---- pipeline/host_memcpy ---- */

typedef struct host_copy {
    fp_thread_pool *pool;
    void *dst;
    const void *src;
    size_t bytes;
} host_copy;

/* The pipeline's own staging copy, timed. */
static fp_status host_copy_fn(void *user, fp_stream stream) {
    (void)stream;
    host_copy *h = user;
    fp_stage_copy(h->pool, h->dst, h->src, h->bytes);
    return FP_OK;
}

static fp_status run_host_memcpy(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    const int64_t mib_opt = fb_opt_int(run, "mib", fb_quick(run) ? 16 : 256);
    const size_t mib = mib_opt > 0 && mib_opt <= ((int64_t)1 << 30) ? (size_t)mib_opt : 0;
    if (mib == 0) {
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "mib", mib_opt);
        fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--mib must be in [1, 2^30]");
        return FP_OK;
    }
    const size_t bytes = mib << 20;
    /* The destination pinned (plain memory on a CPU context), the source
     * pageable; both touched (resident) before anything is timed. */
    fp_host_buf dst = {0}, src = {0};
    fp_context *cpu = NULL;
    fp_status st = fp_host_buf_alloc(ctx, FP_HOST_PINNED, bytes, &dst);
    if (st == FP_OK) st = fp_host_buf_alloc(ctx, FP_HOST_PAGEABLE, bytes, &src);
    if (st == FP_OK) st = fp_context_create(FP_DEVICE_CPU, 0, &cpu);
    char why[512] = ""; /* kept: later calls overwrite fp_last_error */
    if (st != FP_OK) snprintf(why, sizeof why, "%s", fp_last_error());
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const int threads[] = {1, 2, 4, 8, 16};
    for (int i = 0; i < (int)(sizeof threads / sizeof threads[0]); ++i) {
        if (i > 0 && threads[i] > ncpu) break;
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "threads", threads[i]);
        fb_param_int(r, "mib", mib_opt);
        if (st != FP_OK) {
            fb_result_fail(r, st, why);
            continue;
        }
        host_copy h = {NULL, dst.ptr, src.ptr, bytes};
        /* the pool counts the caller as one of its threads */
        fp_status s2 = threads[i] > 1 ? fp_thread_pool_create(threads[i], &h.pool) : FP_OK;
        fp_stats stats;
        memset(&stats, 0, sizeof stats);
        /* timed on a CPU context: wall clock around the host calls */
        if (s2 == FP_OK) s2 = fp_time(cpu, NULL, host_copy_fn, &h, fb_timing(run), &stats);
        fp_thread_pool_destroy(h.pool);
        if (s2 != FP_OK) {
            fb_result_fail(r, s2, fp_last_error());
            continue;
        }
        const double gbps = stats.median_ms > 0 ? (double)bytes / (stats.median_ms * 1e6) : 0;
        fb_result_metric(r, "gbps", gbps);
        fb_result_metric(r, "median_ms", stats.median_ms);
        fb_result_metric(r, "noise", stats.noise);
        /* bytes read + written by the CPU per second */
        fb_result_metric(r, "traffic_gbps", 2 * gbps);
    }
    fp_host_buf_free(&dst);
    fp_host_buf_free(&src);
    fp_context_destroy(cpu);
    return FP_OK;
}

FB_SCENARIO(fb_pipeline_host_memcpy, "pipeline/host_memcpy",
            "host memcpy GB/s, pageable into pinned memory, by thread count: the staging rate a pageable "
            "pipeline can reach",
            run_host_memcpy)
