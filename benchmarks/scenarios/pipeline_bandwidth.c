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
 */
#include <stdio.h>

#include "scenario.h"
#include "fastpath/pipeline.h"

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
