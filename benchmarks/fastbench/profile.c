/* fastbench's profiling: `run --profile` and `trace --out DIR` trace every
 * scenario on the context, judge what bounds each with the five-dimension
 * verdict (trace.h), and `trace` exports the spans (Chrome JSON, SQLite with
 * the A/B results in its runs table). The JSON's "roofs" and "profiles" are
 * described in the README (fastbench section). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fastbench.h"

/* The verdict's "unknown" (-1) is null. */
static void add_pct(cJSON *o, const char *k, double v) { fb_json_number(o, k, v >= 0 ? v : NAN); }

cJSON *fb_verdict_json(const fp_trace_verdict *v) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "group", v->group);
    cJSON_AddNumberToObject(o, "spans", (double)v->spans);
    cJSON_AddNumberToObject(o, "window_ms", v->window_s * 1e3);
    cJSON_AddNumberToObject(o, "busy_ms", v->busy_s * 1e3);
    cJSON_AddNumberToObject(o, "launch_gap_ms", v->launch_s * 1e3);
    cJSON_AddNumberToObject(o, "transfer_ms", v->transfer_s * 1e3);
    cJSON_AddNumberToObject(o, "sync_ms", v->sync_s * 1e3);
    add_pct(o, "compute_pct", v->compute_pct);
    add_pct(o, "memory_pct", v->memory_pct);
    cJSON_AddNumberToObject(o, "launch_pct", v->launch_pct);
    cJSON_AddNumberToObject(o, "transfer_pct", v->transfer_pct);
    add_pct(o, "transfer_gbps", v->transfer_gbps);
    add_pct(o, "transfer_pct_of_peak", v->transfer_pct_of_peak);
    cJSON_AddNumberToObject(o, "sync_pct", v->sync_pct);
    cJSON_AddStringToObject(o, "bound", fp_bound_name(v->bound));
    cJSON_AddStringToObject(o, "remedy", v->remedy ? v->remedy : "");
    cJSON_AddStringToObject(o, "reason", v->reason);
    return o;
}

cJSON *fb_roofs_json(const fp_trace_roofs *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "compute_tflops", r->compute_tflops);
    cJSON_AddNumberToObject(o, "fma_tflops", r->fma_tflops);
    cJSON_AddNumberToObject(o, "copy_gbps", r->copy_gbps);
    cJSON_AddNumberToObject(o, "pinned_gbps", r->pinned_gbps);
    return o;
}

int fb_profile_start(fb_profile *p, fp_context *ctx, size_t capacity) {
    memset(p, 0, sizeof *p);
    fp_trace_roofs_init(&p->roofs);
    fp_status st = fp_trace_roofs_measure(ctx, &p->roofs);
    if (st == FP_OK) st = fp_trace_enable(ctx, capacity);
    if (st != FP_OK) {
        fprintf(stderr, "fastbench: cannot profile: %s: %s\n", fp_status_string(st), fp_last_error());
        return 0;
    }
    p->on = 1;
    printf("roofs: tensor %.1f TFLOP/s, FMA %.3g TFLOP/s, copy %.1f GB/s, pinned transfer %.1f GB/s\n",
           p->roofs.compute_tflops, p->roofs.fma_tflops, p->roofs.copy_gbps, p->roofs.pinned_gbps);
    return 1;
}

void fb_profile_scenario_begin(fb_profile *p, fp_context *ctx, int index) {
    if (!p->on) return;
    fp_trace_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    fp_trace_get_stats(ctx, &st);
    p->dropped_before = st.dropped;
    p->step = index;
    fp_trace_set_step(ctx, index);
}

/* A span of a measured sample (the timing engine's stages, timing.h). */
static int in_sample(const fp_trace_span *s) {
    return strcmp(s->category, "range") != 0 &&
           (!strcmp(s->stage, "baseline") || !strcmp(s->stage, "optimized") || !strcmp(s->stage, "timed"));
}

static int has_stage(const fp_trace_span *s, size_t n, const char *stage) {
    for (size_t i = 0; i < n; ++i)
        if (!strcmp(s[i].stage, stage)) return 1;
    return 0;
}

cJSON *fb_profile_scenario_end(fb_profile *p, fp_context *ctx, const char *scenario) {
    if (!p->on) return NULL;
    size_t n = 0, kept = 0;
    fp_trace_span *spans = NULL;
    fp_status st = fp_trace_read(ctx, NULL, 0, &n, 0);
    if (st == FP_OK && n) {
        spans = malloc(n * sizeof *spans);
        st = spans ? fp_trace_read(ctx, spans, n, &n, 0) : FP_ERR_OUT_OF_MEMORY;
    }
    /* this scenario's measured samples only: setup (inputs, uploads) and
     * the untimed check runs are not the workload */
    for (size_t i = 0; st == FP_OK && i < n; ++i)
        if (spans[i].step == p->step && in_sample(&spans[i])) spans[kept++] = spans[i];
    /* A scenario whose callables run no instrumented op (its own kernels, the
     * timing probes): its samples are the work, each range's span carrying
     * the A/B's roofline bytes and FLOPs (trace.h, "The timing engine"). */
    const int from_samples = st == FP_OK && kept == 0;
    for (size_t i = 0; from_samples && i < n; ++i) {
        fp_trace_span *x = &spans[i];
        if (x->step != p->step || strcmp(x->category, "range") != 0) continue;
        if (strcmp(x->stage, "baseline") && strcmp(x->stage, "optimized") && strcmp(x->stage, "timed")) continue;
        snprintf(x->category, sizeof x->category, "op");
        spans[kept++] = *x;
    }
    fp_trace_stats ts;
    memset(&ts, 0, sizeof ts);
    ts.struct_size = sizeof ts;
    fp_trace_get_stats(ctx, &ts);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "scenario", scenario);
    cJSON_AddNumberToObject(o, "step", p->step);
    cJSON_AddNumberToObject(o, "spans", (double)kept);
    cJSON_AddNumberToObject(o, "dropped", (double)(ts.dropped - p->dropped_before));
    cJSON_AddBoolToObject(o, "from_samples", from_samples);
    /* overall: the optimized side (what ships), else fp_time's samples */
    fp_trace_verdict v;
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    const char *side = has_stage(spans, kept, "optimized") ? "optimized" : "timed";
    if (st == FP_OK) {
        st = kept && has_stage(spans, kept, side)
                 ? fp_trace_verdict_spans(spans, kept, sizeof *spans, FP_TRACE_GROUP_STAGE, side, &p->roofs, &v)
                 : fp_trace_verdict_spans(NULL, 0, sizeof *spans, FP_TRACE_GROUP_ALL, NULL, &p->roofs, &v);
    }
    if (st == FP_OK && kept == 0)
        snprintf(v.reason, sizeof v.reason, "no spans in timed samples: the scenario does not time through the "
                                            "timing engine");
    cJSON *groups = cJSON_CreateArray();
    if (st == FP_OK) {
        cJSON_AddItemToObject(o, "overall", fb_verdict_json(&v));
        /* the baseline side (when the samples stand in for ops, the groups
         * by name below are the sides already) */
        if (!from_samples && has_stage(spans, kept, "baseline")) {
            fp_trace_verdict b = v;
            if (fp_trace_verdict_spans(spans, kept, sizeof *spans, FP_TRACE_GROUP_STAGE, "baseline", &p->roofs,
                                       &b) == FP_OK)
                cJSON_AddItemToArray(groups, fb_verdict_json(&b));
        }
        size_t count = 0;
        fp_trace_verdict g[16];
        if (fp_trace_verdict_groups(spans, kept, sizeof *spans, FP_TRACE_GROUP_NAME, &p->roofs, g, sizeof g[0], 16,
                                    &count) == FP_OK)
            for (size_t i = 0; i < count && i < 16; ++i) cJSON_AddItemToArray(groups, fb_verdict_json(&g[i]));
        printf("%-28s profile: %s-bound (%s)\n", scenario, fp_bound_name(v.bound), v.reason);
    } else {
        cJSON_AddStringToObject(o, "error", fp_last_error());
        printf("%-28s profile failed: %s: %s\n", scenario, fp_status_string(st), fp_last_error());
    }
    cJSON_AddItemToObject(o, "groups", groups);
    free(spans);
    return o;
}

void fb_profile_add_run(fb_profile *p, const fb_result *r) {
    if (!p->on || !r->has_ab || r->status != FP_OK) return;
    if (p->nruns == p->cap_runs) {
        int cap = p->cap_runs ? 2 * p->cap_runs : 16;
        fb_profile_run *runs = realloc(p->runs, (size_t)cap * sizeof *runs);
        if (!runs) return; /* the run is left out of the database: reported at the export */
        p->runs = runs;
        p->cap_runs = cap;
    }
    fb_profile_run *x = &p->runs[p->nruns++];
    char params[256];
    fb_params_string(r->params, params, sizeof params);
    snprintf(x->label, sizeof x->label, "%s%s%s", r->name, params[0] ? " " : "", params);
    x->report = r->ab;
}

int fb_profile_export(fb_profile *p, fp_context *ctx, const char *dir, const char *commit) {
    if (!p->on) return 1;
    char chrome[4096], db[4096];
    int ok = snprintf(chrome, sizeof chrome, "%s/trace.json", dir) < (int)sizeof chrome &&
             snprintf(db, sizeof db, "%s/trace.sqlite", dir) < (int)sizeof db;
    if (!ok) {
        fprintf(stderr, "fastbench trace: the output path is too long\n");
        return 0;
    }
    fp_status st = fp_trace_export_chrome(ctx, chrome);
    if (st == FP_OK) {
        remove(db); /* a fresh database: its runs table is appended to */
        st = fp_trace_export_sqlite(ctx, db);
    }
    /* the A/B results, one row each, in the same database */
    for (int i = 0; st == FP_OK && i < p->nruns; ++i)
        st = fp_trace_sqlite_add_run(db, p->runs[i].label, commit, &p->runs[i].report);
    if (st != FP_OK) {
        fprintf(stderr, "fastbench trace: %s: %s\n", fp_status_string(st), fp_last_error());
        return 0;
    }
    printf("trace: %s (Chrome / Perfetto), %s (SQLite: torch_trace, nccl_trace, runs: %d)\n", chrome, db,
           p->nruns);
    return 1;
}

void fb_profile_stop(fb_profile *p, fp_context *ctx) {
    if (p->on) fp_trace_disable(ctx);
    free(p->runs);
    memset(p, 0, sizeof *p);
}

/* `trace --out DIR`: DIR made if missing (its parent must exist). */
int fb_make_out_dir(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "fastbench: --out %s exists and is not a directory\n", dir);
            return 0;
        }
        return 1;
    }
    if (mkdir(dir, 0777) != 0) {
        fprintf(stderr, "fastbench: cannot create --out %s: %s\n", dir, strerror(errno));
        return 0;
    }
    return 1;
}
