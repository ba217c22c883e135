/* pipeline/... scenarios: host data moved through the device with copies
 * overlapped with compute (pipeline.h).
 *
 *   pipeline/overlap   --mib total (default 1024 on CUDA, 64 on CPU, 4 with
 *                      --quick) in chunks of --chunk_mib (default 1, 8 and
 *                      64; 1 with --quick), with a compute that takes about
 *                      as long as the chunk's copies ("equal": passes of
 *                      out = 1.5 in + 0.5 in over the chunk, their number
 *                      calibrated against the measured pinned copy time) or
 *                      one pass ("short"). Baseline: pageable synchronous
 *                      copy, compute, copy back, chunk by chunk on one
 *                      stream; optimized: a pipeline of depth 3
 *                      (fp_pipeline_validate). Metrics: wall_over_bound
 *                      (the pipeline's wall time over max(total copy time,
 *                      total compute time), each measured alone),
 *                      h2d_pct_of_pinned (the pipeline's h2d GB/s over the
 *                      device's pinned h2d GB/s measured in the same run),
 *                      overlap efficiency, compute-stream idle time.
 *                      --registered 1: input and output registered
 *                      (cudaHostRegister) instead of pageable, so that
 *                      nothing is staged (param host).
 *                      --staging_threads N: the pipeline's staging threads
 *                      per direction (0, the default: its own choice).
 *                      --depth N: chunks in flight (default 3).
 *
 * pipeline/bandwidth (pipeline_bandwidth.c) and pipeline/pin_wait
 * (pipeline_pin.c) are in files of their own.
 */
#include <math.h>
#include <string.h>

#include "pipeline/bandwidth.h"
#include "scenario.h"
#include "timing/probes.h"

typedef struct overlap_compute {
    fp_context *ctx;
    int reps;
} overlap_compute;

/* out = 1.5 in + 0.5 in, `reps` times: the same output however many
 * passes, so the check does not depend on the calibration. */
static fp_status overlap_compute_fn(void *user, fp_stream stream, const fp_pipeline_chunk *c) {
    overlap_compute *oc = user;
    fp_status st = FP_OK;
    for (int i = 0; i < oc->reps && st == FP_OK; ++i)
        st = fp_axpby(oc->ctx, stream, 2, FP_F32, c->in_bytes / 4, 1.5f, c->d_in, 0.5f, c->d_in, c->d_out);
    return st;
}

typedef struct pass_case {
    fp_context *ctx;
    size_t n;
    void *x, *out;
} pass_case;

static fp_status pass_fn(void *user, fp_stream stream) {
    pass_case *p = user;
    return fp_axpby(p->ctx, stream, 2, FP_F32, p->n, 1.5f, p->x, 0.5f, p->x, p->out);
}

/* Milliseconds of one compute pass over `bytes`. */
static fp_status time_pass(fp_context *ctx, size_t bytes, const fp_timing_config *tc, double *ms) {
    pass_case p = {ctx, bytes / 4, NULL, NULL};
    fp_stats s;
    fp_status st = fb_alloc_random(ctx, p.n, FP_F32, 7, -1.0f, 1.0f, &p.x);
    if (st == FP_OK) st = fp_mem_alloc(ctx, bytes, &p.out);
    if (st == FP_OK) st = fp_time(ctx, NULL, pass_fn, &p, tc, &s);
    if (st == FP_OK) *ms = s.median_ms;
    fp_mem_free(ctx, p.x);
    fp_mem_free(ctx, p.out);
    return st;
}

static void fill_host(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int)(s >> 40) % 4001 - 2000) / 256.0f + 0.125f; /* never 0, exact in f32 */
    }
}

static fp_status run_overlap(fb_run *run) {
    fp_context *ctx = fb_ctx(run);
    int gpu = fb_kind(run) == FP_DEVICE_CUDA;
    int quick = fb_quick(run);
    int64_t mib = fb_opt_int(run, "mib", quick ? 4 : gpu ? 1024 : 64);
    int64_t chunks_all[3] = {1, 8, 64};
    int nchunk = quick ? 1 : 3;
    if (fb_opt_given(run, "chunk_mib")) {
        chunks_all[0] = fb_opt_int(run, "chunk_mib", 8);
        nchunk = 1;
    }
    if (mib < 1 || mib > ((int64_t)1 << 20)) {
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "mib", mib);
        fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--mib must be in [1, 2^20]");
        return FP_OK;
    }
    size_t bytes = (size_t)mib << 20;
    /* --registered 1: the input and output registered (page-locked in
     * place), so the pipeline stages nothing: its copies alone, without the
     * host memcpys that pageable memory costs (host=registered; on a CPU
     * context both kinds are plain memory). */
    const int registered = fb_opt_int(run, "registered", 0) != 0;
    /* --staging_threads N: the pipeline's host threads per direction (0:
     * its default, half the cores, 1 to 8). */
    const int64_t staging_threads = fb_opt_int(run, "staging_threads", 0);
    /* --depth N: chunks in flight (default 3). With staged data a slot is
     * busy from its staging to its copy-out, two host memcpys included. */
    const int64_t depth = fb_opt_int(run, "depth", 3);
    const fp_host_memory_kind kind = registered ? FP_HOST_REGISTERED : FP_HOST_PAGEABLE;
    fp_host_buf hin = {0}, hout = {0};
    fp_status st0 = fp_host_buf_alloc(ctx, kind, bytes, &hin);
    if (st0 == FP_OK) st0 = fp_host_buf_alloc(ctx, kind, bytes, &hout);
    if (st0 != FP_OK) {
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "mib", mib);
        fb_result_fail(r, st0, fp_last_error());
        fp_host_buf_free(&hin);
        return FP_OK;
    }
    float *in = (float *)hin.ptr, *out = (float *)hout.ptr;
    fill_host(in, bytes / 4, 42);

    /* The device's pinned copy bandwidth, both directions, at the run's
     * size (capped at 256 MiB): the roofline of the pipeline's copies. */
    size_t bw_bytes = bytes < ((size_t)256 << 20) ? bytes : ((size_t)256 << 20);
    double h2d_pinned = 0, d2h_pinned = 0;
    fp_status bw_st = fp_copy_bandwidth(ctx, FP_HOST_PINNED, FP_COPY_H2D, bw_bytes, fb_timing(run), &h2d_pinned, NULL);
    if (bw_st == FP_OK)
        bw_st = fp_copy_bandwidth(ctx, FP_HOST_PINNED, FP_COPY_D2H, bw_bytes, fb_timing(run), &d2h_pinned, NULL);

    for (int ci = 0; ci < nchunk; ++ci) {
        int64_t chunk_mib = chunks_all[ci];
        for (int mode = 0; mode < 2; ++mode) {
            fb_result *r = fb_result_new(run);
            fb_param_int(r, "mib", mib);
            fb_param_int(r, "chunk_mib", chunk_mib);
            fb_param_str(r, "compute", mode == 0 ? "equal" : "short");
            fb_param_str(r, "host", registered ? "registered" : "pageable");
            fb_param_int(r, "staging_threads", staging_threads);
            fb_param_int(r, "depth", depth);
            if (staging_threads < 0 || staging_threads > 256 || depth < 1 || depth > 64) {
                fb_result_fail(r, FP_ERR_INVALID_ARGUMENT,
                               "--staging_threads must be in [0, 256] and --depth in [1, 64]");
                continue;
            }
            if (bw_st != FP_OK) {
                fb_result_fail(r, bw_st, fp_last_error());
                continue;
            }
            if (chunk_mib < 1 || chunk_mib > mib) {
                fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--chunk_mib must be in [1, --mib]");
                continue;
            }
            size_t chunk = (size_t)chunk_mib << 20;
            overlap_compute oc = {ctx, 1};
            double pass_ms = 0;
            fp_status st = time_pass(ctx, chunk, fb_timing(run), &pass_ms);
            /* The chunk's copies at the pinned figures: h2d + d2h. */
            double copy_ms = (double)chunk / (h2d_pinned * 1e6) + (double)chunk / (d2h_pinned * 1e6);
            if (st == FP_OK && mode == 0 && pass_ms > 0) {
                double reps = floor(copy_ms / pass_ms + 0.5);
                oc.reps = reps < 1 ? 1 : reps > 256 ? 256 : (int)reps;
            }
            fp_pipeline_config cfg;
            fp_pipeline_config_default(&cfg);
            cfg.depth = (int)depth;
            cfg.max_in_bytes = chunk;
            cfg.staging_threads = (int)staging_threads;
            cfg.compute = overlap_compute_fn;
            cfg.user = &oc;
            fp_pipeline_ab_report rep;
            fp_pipeline_ab_report_init(&rep);
            if (st == FP_OK) st = fp_pipeline_validate(ctx, &cfg, in, bytes, out, fb_timing(run), &rep);
            if (st != FP_OK) {
                fb_result_fail(r, st, fp_last_error());
                continue;
            }
            fp_ab_report ab;
            memset(&ab, 0, sizeof ab);
            ab.baseline = rep.baseline;
            ab.optimized = rep.optimized;
            ab.speedup = rep.speedup;
            ab.verdict = rep.verdict;
            ab.pct_of_peak = -1;
            ab.bound = "transfer";
            ab.achieved_gbps = 2.0 * (double)bytes / (rep.optimized.median_ms * 1e6);
            fb_result_set_ab(r, &ab);
            fb_result_metric(r, "wall_over_bound", rep.overlap_bound_ms > 0 ? rep.optimized.median_ms / rep.overlap_bound_ms : 0);
            fb_result_metric(r, "h2d_pct_of_pinned", h2d_pinned > 0 ? 100.0 * rep.pipeline.h2d_gbps / h2d_pinned : 0);
            fb_result_metric(r, "copy_ms", rep.copy_ms);
            fb_result_metric(r, "compute_ms", rep.compute_ms);
            fb_result_metric(r, "bound_ms", rep.overlap_bound_ms);
            fb_result_metric(r, "compute_passes", oc.reps);
            fb_result_metric(r, "h2d_gbps", rep.pipeline.h2d_gbps);
            fb_result_metric(r, "d2h_gbps", rep.pipeline.d2h_gbps);
            fb_result_metric(r, "pinned_h2d_gbps", h2d_pinned);
            fb_result_metric(r, "pinned_d2h_gbps", d2h_pinned);
            fb_result_metric(r, "overlap_efficiency", rep.pipeline.overlap_efficiency);
            fb_result_metric(r, "compute_idle_ms", rep.pipeline.compute_idle_ms);
            /* Staging and copying out of pageable memory are host memcpys
             * that can set the pace (benchmarks/NOTES.md, session 10): the
             * staging rate, and the completion stage's time (its copy-out). */
            fb_result_metric(r, "stage_ms", rep.pipeline.stage_ms);
            fb_result_metric(r, "stage_gbps", rep.pipeline.stage_ms > 0
                                                  ? (double)rep.pipeline.bytes_h2d / (rep.pipeline.stage_ms * 1e6) : 0);
            fb_result_metric(r, "complete_ms", rep.pipeline.complete_ms);
            if (!rep.outputs_equal) fb_result_fail(r, FP_ERR_MISMATCH, "pipeline output differs from the baseline's");
        }
    }
    fp_host_buf_free(&hin);
    fp_host_buf_free(&hout);
    return FP_OK;
}

FB_SCENARIO(fb_pipeline_overlap, "pipeline/overlap",
            "host data through the device: pageable sync copy/compute/copy back vs a pipeline (depth 3)", run_overlap)
