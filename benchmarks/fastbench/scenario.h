/* fastbench scenario interface.
 *
 * A scenario is a named A/B measurement ("norm/layernorm_fwd", ...) whose name
 * starts with its module. Each module keeps its scenarios in
 * benchmarks/scenarios/<module>.c and registers them with FB_SCENARIO; the
 * registry is filled before main() runs, so adding a module touches no
 * shared file.
 *
 * A scenario's run function builds its inputs for the context in `run`, runs
 * fp_ab_run() (or measures by other means) and reports one or more results
 * with fb_result_new() / fb_result_set_ab() / fb_result_metric().
 */
#ifndef FASTBENCH_SCENARIO_H
#define FASTBENCH_SCENARIO_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "fastpath/fastpath.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fb_run fb_run;
typedef struct fb_result fb_result;

typedef struct fb_scenario {
    const char *name;        /* "<module>/<what>" */
    const char *description; /* one line */
    /* Runs the scenario. Return FP_ERR_UNSUPPORTED to have it listed as
     * skipped (e.g. a CUDA-only scenario on a CPU context), with a reason
     * set through fp_set_error-like detail (fb_skip). */
    fp_status (*run)(fb_run *run);
} fb_scenario;

void fb_register(const fb_scenario *s);

#define FB_SCENARIO(ident, name_, desc_, fn_)                                   \
    static const fb_scenario ident = {name_, desc_, fn_};                       \
    __attribute__((constructor)) static void ident##_register(void) { fb_register(&ident); }

/* ---- what a running scenario can ask for ---- */
fp_context *fb_ctx(fb_run *run);
fp_device_kind fb_kind(fb_run *run);
const fp_device_info *fb_device(fb_run *run);
const fp_timing_config *fb_timing(fb_run *run);
/* 1 with --quick: scenarios use smaller shapes and fewer variants. */
int fb_quick(fb_run *run);
/* `fastbench trace ... --out DIR`: DIR (it exists), where a scenario may
 * write files of its own next to run.json and trace.json; NULL otherwise. */
const char *fb_out_dir(fb_run *run);

/* dtypes requested with --dtype (default: the scenario's own list). Fills up
 * to `max` entries and returns how many; 0 means "scenario default". */
int fb_dtypes(fb_run *run, fp_dtype *out, int max);

/* Shape options given on the command line as --NAME VALUE (e.g. --rows 4096)
 * or --set NAME=VALUE. Returns `def` if absent. */
int64_t fb_opt_int(fb_run *run, const char *name, int64_t def);
double fb_opt_double(fb_run *run, const char *name, double def);
/* 1 if the option was given. */
int fb_opt_given(fb_run *run, const char *name);

/* Marks the scenario skipped with a reason; returns FP_ERR_UNSUPPORTED. */
fp_status fb_skip(fb_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- inputs ---- */
/* Fills n elements of dtype (f32/f16/bf16) at dst in ctx memory with
 * deterministic uniform values in [lo, hi), never exactly zero (never time or
 * test on zeros). Large buffers are filled by repeating an 8 MiB random chunk
 * so multi-GiB KV caches stay cheap to make. Synchronizes the context. */
fp_status fb_fill_random(fp_context *ctx, void *dst, size_t n, fp_dtype dt, uint64_t seed, float lo,
                         float hi);
/* fp_mem_alloc + fb_fill_random; *out is NULL on failure. */
fp_status fb_alloc_random(fp_context *ctx, size_t n, fp_dtype dt, uint64_t seed, float lo, float hi,
                          void **out);

/* ---- host time ---- */
/* Host time of one fn call on ctx (launch cost, not kernel time): samples
 * of 32 calls each, timed by a monotonic clock, ctx synchronized (untimed)
 * between samples so the launch queue never fills, until the run's timing
 * config's max_time_s or max_samples (at least min_samples; at most 2000);
 * one warm-up call first. Stats in ms per call. */
fp_status fb_host_time(fb_run *run, fp_context *ctx, fp_timed_fn fn, void *user, fp_stats *out);
/* An A/B report of two host-time measurements (nothing compared, no
 * roofline): the verdict by the run's min_effect. */
void fb_host_report(fb_run *run, const fp_stats *base, const fp_stats *opt, fp_ab_report *rep);

/* ---- reporting ---- */
/* Starts a result row named after the scenario plus an optional suffix
 * ("norm/layernorm_fwd" + "bf16" -> shown with its params). */
fb_result *fb_result_new(fb_run *run);
/* Every row made so far is finished: print them now (and write them to the
 * --json report) instead of when the scenario returns, so that a run
 * stopped by a time limit keeps them. Rows are never printed twice; a row
 * changed after this call keeps what it had. Long scenarios call it after
 * each shape. */
void fb_rows_done(fb_run *run);
/* Parameters shown in the "shape" column and written to "params". */
void fb_param_int(fb_result *r, const char *key, int64_t v);
void fb_param_str(fb_result *r, const char *key, const char *v);
/* Timing, verdict, agreement and roofline from an A/B report. */
void fb_result_set_ab(fb_result *r, const fp_ab_report *rep);
/* Extra named metrics (written under "metrics" in JSON; the first two are
 * also shown in the table's notes column). */
void fb_result_metric(fb_result *r, const char *key, double v);
/* A free-form note shown in the table (e.g. "baseline OOM"). */
void fb_result_note(fb_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Marks the row failed (e.g. a status from the op) with a message. */
void fb_result_fail(fb_result *r, fp_status st, const char *detail);

#ifdef __cplusplus
}
#endif

#endif /* FASTBENCH_SCENARIO_H */
