/* The five-dimension verdict (trace.h, "The verdict"): the spans laid on one
 * timeline, its window split into busy, exposed transfer, launch and sync
 * time, each group charged its share, and the bound with the numbers behind
 * it and the capability that addresses it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_FMA_KERNEL 1
#endif

enum { C_RANGE, C_OP, C_XFER, C_COLL, C_SYNC };

typedef struct ivl {
    double a, b;
    size_t idx; /* the span it came from (a merged block: the first to start) */
} ivl;

/* An idle interval of the timeline: the span whose start ends it (SIZE_MAX:
 * none, the window's tail), and the first sync span overlapping it (SIZE_MAX:
 * none: a launch gap). */
typedef struct gap {
    double a, b;
    size_t ender, syncer;
} gap;

/* Everything about the whole set that every group's verdict reads. */
typedef struct timeline {
    const char *base;
    size_t n, size;
    int *cls;
    ivl *busy;      /* the union of op spans, merged */
    size_t nbusy;
    gap *gaps;
    size_t ngaps;
    double lo, hi;  /* the window of the whole set (ranges included) */
} timeline;

static const fp_trace_span *span_at(const timeline *t, size_t i) {
    return (const fp_trace_span *)(const void *)(t->base + i * t->size);
}

const char *fp_bound_name(fp_bound bound) {
    switch (bound) {
    case FP_BOUND_UNKNOWN: return "unknown";
    case FP_BOUND_COMPUTE: return "compute";
    case FP_BOUND_MEMORY: return "memory";
    case FP_BOUND_LAUNCH: return "launch";
    case FP_BOUND_TRANSFER: return "transfer";
    case FP_BOUND_SYNC: return "sync";
    }
    return "?";
}

static const char *remedy_of(fp_bound b, int collectives) {
    switch (b) {
    case FP_BOUND_COMPUTE:
        return "tensor cores: flash attention (attention.h) and bf16/f16 tensor-core paths; fewer FLOPs "
               "(causal block skipping, no recomputation)";
    case FP_BOUND_MEMORY:
        return "fusion: the fused norm + residual + bias + activation (norm.h) moves each tensor once; "
               "flash attention never writes the score matrix";
    case FP_BOUND_LAUNCH:
        return "CUDA graphs (graph.h: capture / replay, the shape-bucketed graph cache) and larger batches "
               "(batcher.h)";
    case FP_BOUND_TRANSFER:
        return collectives ? "bucketed all-reduce overlapped with the backward pass (comm.h: fp_comm_buckets)"
                           : "the pinned async pipeline (pipeline.h): copies from pinned memory overlapped "
                             "with compute on separate streams";
    case FP_BOUND_SYNC:
        return "fewer host waits: order work with events across streams (the pipeline and the graph cache do), "
               "read results back once per step, the batcher's asynchronous requests (batcher.h)";
    case FP_BOUND_UNKNOWN: break;
    }
    return "trace more: spans with bytes and FLOPs (the library's ops count theirs), roofs from "
           "fp_trace_roofs_measure";
}

static int class_of(const fp_trace_span *s) {
    if (strcmp(s->category, "range") == 0) return C_RANGE;
    if (strcmp(s->category, FP_TRACE_SYNC) == 0) return C_SYNC;
    if (strcmp(s->category, "collective") == 0) return C_COLL;
    if (strcmp(s->category, FP_TRACE_TRANSFER) == 0 || strcmp(s->name, "pipeline_h2d") == 0 ||
        strcmp(s->name, "pipeline_d2h") == 0)
        return C_XFER;
    return C_OP;
}

static int by_start(const void *x, const void *y) {
    const ivl *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    if (p->b != q->b) return p->b < q->b ? -1 : 1;
    return p->idx < q->idx ? -1 : p->idx > q->idx;
}

/* Sorts v[0..n) and merges overlapping (or touching) intervals in place;
 * returns how many blocks remain. */
static size_t merge(ivl *v, size_t n) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, by_start);
    size_t k = 0;
    for (size_t i = 1; i < n; ++i) {
        if (v[i].a <= v[k].b) {
            if (v[i].b > v[k].b) v[k].b = v[i].b;
        } else {
            v[++k] = v[i];
        }
    }
    return k + 1;
}

static double measure(const ivl *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += v[i].b - v[i].a;
    return s;
}

/* |v \ w| for merged, sorted v and w. */
static double measure_minus(const ivl *v, size_t nv, const ivl *w, size_t nw) {
    double s = 0;
    size_t j = 0;
    for (size_t i = 0; i < nv; ++i) {
        double a = v[i].a, b = v[i].b, cover = 0;
        while (j < nw && w[j].b <= a) ++j;
        for (size_t k = j; k < nw && w[k].a < b; ++k) {
            double lo = w[k].a > a ? w[k].a : a, hi = w[k].b < b ? w[k].b : b;
            if (hi > lo) cover += hi - lo;
        }
        s += (b - a) - cover;
    }
    return s;
}

static void timeline_free(timeline *t) {
    free(t->cls);
    free(t->busy);
    free(t->gaps);
    memset(t, 0, sizeof *t);
}

static fp_status check_spans(const void *spans, size_t n, size_t span_size, const char *fn) {
    FP_CHECK_ARG(spans || n == 0, "%s: argument 'spans' is NULL with n %zu", fn, n);
    FP_TRY(fp_struct_size_check(span_size, sizeof(fp_trace_span), sizeof(fp_trace_span),
                                "fp_trace_span (span_size)"));
    for (size_t i = 0; i < n; ++i) {
        const fp_trace_span *s = (const fp_trace_span *)(const void *)((const char *)spans + i * span_size);
        FP_CHECK_ARG(isfinite(s->start_s) && isfinite(s->end_s) && s->end_s >= s->start_s,
                     "%s: span %zu ('%.*s') has non-finite times or ends before it starts", fn, i,
                     (int)sizeof s->name, s->name);
        FP_CHECK_ARG(memchr(s->name, 0, sizeof s->name) && memchr(s->category, 0, sizeof s->category) &&
                         memchr(s->module, 0, sizeof s->module) && memchr(s->stage, 0, sizeof s->stage),
                     "%s: span %zu has a text field that is not NUL-terminated", fn, i);
    }
    return FP_OK;
}

/* Builds the timeline of all n spans (checked). */
static fp_status timeline_build(const void *spans, size_t n, size_t span_size, timeline *t) {
    memset(t, 0, sizeof *t);
    t->base = spans;
    t->n = n;
    t->size = span_size;
    if (!n) return FP_OK;
    t->cls = malloc(n * sizeof *t->cls);
    ivl *act = malloc(n * sizeof *act), *syn = malloc(n * sizeof *syn);
    t->busy = malloc(n * sizeof *t->busy);
    t->gaps = malloc((n + 1) * sizeof *t->gaps);
    if (!t->cls || !act || !syn || !t->busy || !t->gaps) {
        free(act);
        free(syn);
        timeline_free(t);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace verdict: the timeline of %zu spans", n);
    }
    size_t nact = 0, nsyn = 0;
    t->lo = INFINITY;
    t->hi = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
        const fp_trace_span *s = span_at(t, i);
        int c = t->cls[i] = class_of(s);
        if (s->start_s < t->lo) t->lo = s->start_s;
        if (s->end_s > t->hi) t->hi = s->end_s;
        ivl v = {s->start_s, s->end_s, i};
        if (c == C_OP) t->busy[t->nbusy++] = v;
        if (c == C_OP || c == C_XFER || c == C_COLL) act[nact++] = v;
        if (c == C_SYNC) syn[nsyn++] = v;
    }
    t->nbusy = merge(t->busy, t->nbusy);
    /* The activity blocks, each keeping the span that starts it: the gaps
     * between them (and before the first, after the last) are idle. */
    nact = merge(act, nact);
    nsyn = merge(syn, nsyn);
    double at = t->lo;
    for (size_t i = 0; i <= nact; ++i) {
        double next = i < nact ? act[i].a : t->hi;
        if (next > at) t->gaps[t->ngaps++] = (gap){at, next, i < nact ? act[i].idx : SIZE_MAX, SIZE_MAX};
        if (i < nact && act[i].b > at) at = act[i].b;
    }
    /* A gap that a sync span overlaps or touches is the wait's. */
    size_t j = 0;
    for (size_t g = 0; g < t->ngaps; ++g) {
        gap *p = &t->gaps[g];
        while (j < nsyn && syn[j].b < p->a) ++j;
        if (j < nsyn && syn[j].a <= p->b) p->syncer = syn[j].idx;
    }
    free(act);
    free(syn);
    return FP_OK;
}

static const char *key_of(const fp_trace_span *s, fp_trace_group_by by) {
    switch (by) {
    case FP_TRACE_GROUP_NAME: return s->name;
    case FP_TRACE_GROUP_MODULE: return s->module;
    case FP_TRACE_GROUP_STAGE: return s->stage;
    case FP_TRACE_GROUP_CATEGORY: return s->category;
    case FP_TRACE_GROUP_ALL: break;
    }
    return "";
}

static void fmt_time(double s, char *buf, size_t n) {
    if (s >= 1) snprintf(buf, n, "%.3g s", s);
    else if (s >= 1e-3) snprintf(buf, n, "%.3g ms", s * 1e3);
    else snprintf(buf, n, "%.3g us", s * 1e6);
}

static void decide(fp_trace_verdict *v, size_t ngaps_launch, size_t nwaits) {
    char w[32];
    fmt_time(v->window_s, w, sizeof w);
    v->bound = FP_BOUND_UNKNOWN;
    if (!(v->window_s > 0)) {
        snprintf(v->reason, sizeof v->reason, "no time recorded: %zu span(s) of zero length", v->spans);
        v->remedy = remedy_of(v->bound, 0);
        return;
    }
    double shares[4] = {v->busy_s, v->transfer_s, v->launch_s, v->sync_s};
    int top = 0;
    for (int i = 1; i < 4; ++i)
        if (shares[i] > shares[top]) top = i;
    if (top == 0) {
        if (v->compute_pct < 0 && v->memory_pct < 0) {
            snprintf(v->reason, sizeof v->reason,
                     "ops busy %.0f%% of %s, but their spans carry no bytes or FLOPs (or the roofs are unknown)",
                     v->busy_pct, w);
        } else {
            v->bound = v->compute_pct >= v->memory_pct ? FP_BOUND_COMPUTE : FP_BOUND_MEMORY;
            char c[96] = "", m[96] = "";
            if (v->compute_pct >= 0)
                snprintf(c, sizeof c, "%.0f%% of the compute roof (%.3g TFLOP/s)", v->compute_pct,
                         v->flops / v->busy_s / 1e12);
            if (v->memory_pct >= 0)
                snprintf(m, sizeof m, "%.0f%% of copy bandwidth (%.4g GB/s)", v->memory_pct,
                         v->bytes / v->busy_s / 1e9);
            snprintf(v->reason, sizeof v->reason, "ops busy %.0f%% of %s at %s%s%s", v->busy_pct, w, c,
                     c[0] && m[0] ? " and " : "", m);
        }
    } else if (top == 1) {
        v->bound = FP_BOUND_TRANSFER;
        char g[64] = "";
        if (v->transfer_gbps >= 0 && v->transfer_pct_of_peak >= 0)
            snprintf(g, sizeof g, " at %.3g GB/s (%.0f%% of pinned peak)", v->transfer_gbps,
                     v->transfer_pct_of_peak);
        else if (v->transfer_gbps >= 0)
            snprintf(g, sizeof g, " at %.3g GB/s", v->transfer_gbps);
        snprintf(v->reason, sizeof v->reason, "%s not hidden under ops: %.0f%% of %s%s; ops busy %.0f%%",
                 v->collectives ? "collectives" : "host<->device copies", v->transfer_pct, w, g, v->busy_pct);
    } else if (top == 2) {
        v->bound = FP_BOUND_LAUNCH;
        char mean[32];
        fmt_time(ngaps_launch ? v->launch_s / (double)ngaps_launch : 0, mean, sizeof mean);
        snprintf(v->reason, sizeof v->reason,
                 "device idle between ops %.0f%% of %s (%zu gaps, mean %s) against %.0f%% busy", v->launch_pct, w,
                 ngaps_launch, mean, v->busy_pct);
    } else {
        v->bound = FP_BOUND_SYNC;
        snprintf(v->reason, sizeof v->reason,
                 "host waits on the device and the idle they leave: %.0f%% of %s (%zu wait(s)) against %.0f%% busy",
                 v->sync_pct, w, nwaits, v->busy_pct);
    }
    v->remedy = remedy_of(v->bound, v->collectives);
}

/* The verdict of the spans flagged in `in` (NULL: all of them). */
static fp_status verdict_of(const timeline *t, const unsigned char *in, const char *label,
                            const fp_trace_roofs *roofs, fp_trace_verdict *v) {
    memset(v, 0, sizeof *v);
    v->struct_size = sizeof *v;
    snprintf(v->group, sizeof v->group, "%s", label);
    v->compute_pct = v->memory_pct = v->transfer_gbps = v->transfer_pct_of_peak = -1;
    size_t n = t->n;
    ivl *ops = n ? malloc(n * sizeof *ops) : NULL, *xf = n ? malloc(n * sizeof *xf) : NULL;
    ivl *co = n ? malloc(n * sizeof *co) : NULL;
    if (n && (!ops || !xf || !co)) {
        free(ops);
        free(xf);
        free(co);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace verdict: %zu spans", n);
    }
    size_t nops = 0, nxf = 0, nco = 0, nwaits = 0;
    for (size_t i = 0; i < n; ++i) {
        if (in && !in[i]) continue;
        const fp_trace_span *s = span_at(t, i);
        int c = t->cls[i];
        if (c == C_RANGE) continue;
        v->spans++;
        ivl x = {s->start_s, s->end_s, i};
        if (c == C_OP) {
            ops[nops++] = x;
            v->bytes += s->bytes;
            v->flops += s->flops;
        } else if (c == C_XFER) {
            xf[nxf++] = x;
            v->transfer_bytes += s->bytes;
        } else if (c == C_COLL) {
            co[nco++] = x;
        } else {
            nwaits++;
        }
    }
    nops = merge(ops, nops);
    v->busy_s = measure(ops, nops);
    nxf = merge(xf, nxf);
    double xfer_time = measure(xf, nxf);
    double xfer_exposed = measure_minus(xf, nxf, t->busy, t->nbusy);
    nco = merge(co, nco);
    double coll_exposed = measure_minus(co, nco, t->busy, t->nbusy);
    /* copies and collectives together, overlap between them counted once */
    size_t nall = 0;
    for (size_t i = 0; i < nxf; ++i) ops[nall++] = xf[i];
    for (size_t i = 0; i < nco; ++i) ops[nall++] = co[i];
    nall = merge(ops, nall);
    v->transfer_s = measure_minus(ops, nall, t->busy, t->nbusy);
    v->collectives = coll_exposed > xfer_exposed;
    free(ops);
    free(xf);
    free(co);

    size_t ngaps_launch = 0;
    for (size_t g = 0; g < t->ngaps; ++g) {
        const gap *p = &t->gaps[g];
        /* a launch gap is charged to the span that ends it, a wait's to
         * the wait */
        if (p->syncer != SIZE_MAX) {
            if (!in || in[p->syncer]) v->sync_s += p->b - p->a;
        } else if (!in || (p->ender != SIZE_MAX && in[p->ender])) {
            v->launch_s += p->b - p->a;
            ngaps_launch++;
        }
    }
    v->window_s = v->busy_s + v->transfer_s + v->launch_s + v->sync_s;
    if (v->window_s > 0) {
        v->busy_pct = 100 * v->busy_s / v->window_s;
        v->transfer_pct = 100 * v->transfer_s / v->window_s;
        v->launch_pct = 100 * v->launch_s / v->window_s;
        v->sync_pct = 100 * v->sync_s / v->window_s;
    }
    double tflops_roof = 0, copy = 0, pinned = 0;
    if (roofs) {
        tflops_roof = roofs->compute_tflops > 0 ? roofs->compute_tflops : roofs->fma_tflops;
        copy = roofs->copy_gbps;
        pinned = roofs->pinned_gbps;
    }
    if (v->busy_s > 0 && v->flops > 0 && tflops_roof > 0)
        v->compute_pct = 100 * v->flops / v->busy_s / (tflops_roof * 1e12);
    if (v->busy_s > 0 && v->bytes > 0 && copy > 0) v->memory_pct = 100 * v->bytes / v->busy_s / (copy * 1e9);
    if (xfer_time > 0 && v->transfer_bytes > 0) {
        v->transfer_gbps = v->transfer_bytes / xfer_time / 1e9;
        if (pinned > 0) v->transfer_pct_of_peak = 100 * v->transfer_gbps / pinned;
    }
    decide(v, ngaps_launch, nwaits);
    return FP_OK;
}

static fp_status check_roofs(const fp_trace_roofs *roofs, fp_trace_roofs *copy) {
    memset(copy, 0, sizeof *copy);
    if (!roofs) return FP_OK;
    FP_TRY(fp_struct_size_check(roofs->struct_size, sizeof *roofs, sizeof *roofs,
                                "fp_trace_roofs (roofs)"));
    *copy = *roofs;
    FP_CHECK_ARG(isfinite(copy->compute_tflops) && isfinite(copy->fma_tflops) && isfinite(copy->copy_gbps) &&
                     isfinite(copy->pinned_gbps),
                 "trace verdict: the roofs must be finite (0: unknown)");
    return FP_OK;
}

static fp_status write_verdict(fp_trace_verdict *out, const fp_trace_verdict *v) {
    return fp_struct_write(out, v, sizeof *v, sizeof *v, "fp_trace_verdict (out)");
}

fp_status fp_trace_verdict_spans(const fp_trace_span *spans, size_t n, size_t span_size, fp_trace_group_by by,
                                 const char *key, const fp_trace_roofs *roofs, fp_trace_verdict *out) {
    FP_CHECK_NOT_NULL(out);
    FP_TRY(fp_struct_size_check(out->struct_size, sizeof *out, sizeof *out, "fp_trace_verdict (out)"));
    FP_CHECK_ARG(by >= FP_TRACE_GROUP_ALL && by <= FP_TRACE_GROUP_CATEGORY,
                 "fp_trace_verdict_spans: bad group_by %d", (int)by);
    FP_CHECK_ARG(by == FP_TRACE_GROUP_ALL || key, "fp_trace_verdict_spans: argument 'key' is NULL");
    fp_trace_roofs r;
    FP_TRY(check_roofs(roofs, &r));
    FP_TRY(check_spans(spans, n, span_size, "fp_trace_verdict_spans"));
    timeline t;
    FP_TRY(timeline_build(spans, n, span_size, &t));
    unsigned char *in = NULL;
    fp_status st = FP_OK;
    if (by != FP_TRACE_GROUP_ALL) {
        in = calloc(n ? n : 1, 1);
        if (!in) {
            timeline_free(&t);
            return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace verdict: %zu spans", n);
        }
        size_t hits = 0;
        for (size_t i = 0; i < n; ++i) {
            in[i] = t.cls[i] != C_RANGE && strcmp(key_of(span_at(&t, i), by), key) == 0;
            hits += in[i];
        }
        if (!hits)
            st = fp_set_error(FP_ERR_NOT_FOUND, "fp_trace_verdict_spans: no span (of %zu) has the key '%s'", n,
                              key);
    }
    fp_trace_verdict v;
    if (st == FP_OK) st = verdict_of(&t, in, by == FP_TRACE_GROUP_ALL ? "all" : key, roofs ? &r : NULL, &v);
    if (st == FP_OK) st = write_verdict(out, &v);
    free(in);
    timeline_free(&t);
    return st;
}

static int by_window(const void *x, const void *y) {
    const fp_trace_verdict *p = x, *q = y;
    if (p->window_s != q->window_s) return p->window_s > q->window_s ? -1 : 1;
    return strcmp(p->group, q->group);
}

fp_status fp_trace_verdict_groups(const fp_trace_span *spans, size_t n, size_t span_size, fp_trace_group_by by,
                                  const fp_trace_roofs *roofs, fp_trace_verdict *out, size_t verdict_size,
                                  size_t max, size_t *count) {
    FP_CHECK_NOT_NULL(count);
    FP_CHECK_ARG(out || max == 0, "fp_trace_verdict_groups: argument 'out' is NULL with max %zu", max);
    FP_CHECK_ARG(by > FP_TRACE_GROUP_ALL && by <= FP_TRACE_GROUP_CATEGORY,
                 "fp_trace_verdict_groups: bad group_by %d (name, module, stage or category)", (int)by);
    FP_TRY(fp_struct_size_check(verdict_size, sizeof(fp_trace_verdict), sizeof(fp_trace_verdict),
                                "fp_trace_verdict (verdict_size)"));
    fp_trace_roofs r;
    FP_TRY(check_roofs(roofs, &r));
    FP_TRY(check_spans(spans, n, span_size, "fp_trace_verdict_groups"));
    timeline t;
    FP_TRY(timeline_build(spans, n, span_size, &t));
    /* The distinct keys, by a first-seen scan (groups are few). */
    size_t *first = n ? malloc(n * sizeof *first) : NULL;
    unsigned char *in = n ? calloc(n, 1) : NULL;
    fp_trace_verdict *all = NULL;
    size_t nkeys = 0;
    fp_status st = FP_OK;
    if (n && (!first || !in)) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace verdict: %zu spans", n);
    for (size_t i = 0; st == FP_OK && i < n; ++i) {
        const char *k = key_of(span_at(&t, i), by);
        if (t.cls[i] == C_RANGE || !k[0]) continue;
        size_t g = 0;
        while (g < nkeys && strcmp(key_of(span_at(&t, first[g]), by), k) != 0) ++g;
        if (g == nkeys) first[nkeys++] = i;
    }
    if (st == FP_OK && nkeys) {
        all = malloc(nkeys * sizeof *all);
        if (!all) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace verdict: %zu groups", nkeys);
    }
    for (size_t g = 0; st == FP_OK && g < nkeys; ++g) {
        const char *k = key_of(span_at(&t, first[g]), by);
        for (size_t i = 0; i < n; ++i) in[i] = t.cls[i] != C_RANGE && strcmp(key_of(span_at(&t, i), by), k) == 0;
        st = verdict_of(&t, in, k, roofs ? &r : NULL, &all[g]);
    }
    if (st == FP_OK) {
        if (nkeys > 1) qsort(all, nkeys, sizeof *all, by_window);
        for (size_t g = 0; g < nkeys && g < max; ++g) out[g] = all[g];
        *count = nkeys;
    }
    free(all);
    free(first);
    free(in);
    timeline_free(&t);
    return st;
}

fp_status fp_trace_verdict_context(fp_context *ctx, fp_trace_group_by by, const char *key,
                                   const fp_trace_roofs *roofs, fp_trace_verdict *out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(out);
    size_t n = 0;
    FP_TRY(fp_trace_read(ctx, NULL, 0, &n, 0));
    fp_trace_span *spans = n ? malloc(n * sizeof *spans) : NULL;
    if (n && !spans) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_trace_verdict_context: a copy of %zu spans", n);
    fp_status st = n ? fp_trace_read(ctx, spans, n, &n, 0) : FP_OK;
    if (st == FP_OK) st = fp_trace_verdict_spans(spans, n, sizeof *spans, by, key, roofs, out);
    free(spans);
    return st;
}

/* ------------------------------------------------------------------------ */
/*  Roofs                                                                   */
/* ------------------------------------------------------------------------ */

fp_status fp_trace_roofs_init_sized(fp_trace_roofs *roofs, size_t struct_size) {
    fp_trace_roofs d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    return fp_struct_init(roofs, struct_size, &d, sizeof d, sizeof d, "fp_trace_roofs");
}

/* The CPU's FMA roof: each worker runs independent chains of fused
 * multiply-adds (AVX2 + FMA when the CPU has them, else scalar mul + add)
 * long enough to swamp the start-up; the best of three. */
#define FMA_CHAINS 10
#define FMA_ITERS 2000000

typedef struct fma_job {
    double flops_per_worker;
    float sink[64];
} fma_job;

#ifdef HAVE_AVX2_FMA_KERNEL
__attribute__((target("avx2,fma"))) static float fma_avx2(void) {
    __m256 acc[FMA_CHAINS];
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < FMA_CHAINS; ++k) acc[k] = _mm256_set1_ps(1.0f + (float)k);
    for (long i = 0; i < FMA_ITERS; ++i)
        for (int k = 0; k < FMA_CHAINS; ++k) acc[k] = _mm256_fmadd_ps(acc[k], m, c);
    __m256 s = acc[0];
    for (int k = 1; k < FMA_CHAINS; ++k) s = _mm256_add_ps(s, acc[k]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}
#endif

static float fma_scalar(void) {
    volatile float seed = 0.999999f;
    float m = seed, acc[FMA_CHAINS];
    for (int k = 0; k < FMA_CHAINS; ++k) acc[k] = 1.0f + (float)k;
    for (long i = 0; i < FMA_ITERS / 4; ++i)
        for (int k = 0; k < FMA_CHAINS; ++k) acc[k] = acc[k] * m + 1e-7f;
    float s = 0;
    for (int k = 0; k < FMA_CHAINS; ++k) s += acc[k];
    return s;
}

static void fma_worker(void *arg, size_t begin, size_t end) {
    fma_job *job = arg;
    for (size_t i = begin; i < end; ++i) {
        float r;
#ifdef HAVE_AVX2_FMA_KERNEL
        if (fp_cpu_features() & FP_CPU_AVX2_FMA) r = fma_avx2();
        else
#endif
            r = fma_scalar();
        job->sink[i % 64] = r;
    }
}

static double cpu_fma_tflops(fp_context *ctx) {
    int workers = ctx->pool ? fp_thread_pool_size(ctx->pool) + 1 : 1;
    fma_job job;
    memset(&job, 0, sizeof job);
    int wide = 0;
#ifdef HAVE_AVX2_FMA_KERNEL
    wide = (fp_cpu_features() & FP_CPU_AVX2_FMA) != 0;
#endif
    const double per = wide ? 2.0 * 8 * FMA_CHAINS * (double)FMA_ITERS : 2.0 * FMA_CHAINS * (double)(FMA_ITERS / 4);
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        double t0 = fp_now_s();
        if (ctx->pool) fp_parallel_for(ctx->pool, (size_t)workers, 1, fma_worker, &job);
        else fma_worker(&job, 0, 1);
        double dt = fp_now_s() - t0;
        if (dt > 0 && per * workers / dt > best) best = per * workers / dt;
    }
    return best / 1e12;
}

/* Host->device copies from pinned memory: 64 MiB, one warm-up and five timed. */
static fp_status pinned_gbps(fp_context *ctx, double *out) {
    const size_t bytes = (size_t)64 << 20;
    void *h = NULL, *d = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    FP_TRY(fp_ctx_activate(ctx));
    cudaError_t e = cudaMallocHost(&h, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&d, bytes);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    if (e == cudaSuccess) memset(h, 0x3c, bytes);
    if (e == cudaSuccess) e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, ctx->stream);
    if (e == cudaSuccess) e = cudaEventRecord(e0, ctx->stream);
    for (int i = 0; e == cudaSuccess && i < 5; ++i)
        e = cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, ctx->stream);
    if (e == cudaSuccess) e = cudaEventRecord(e1, ctx->stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(e1);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
    fp_status st = FP_OK;
    if (e != cudaSuccess) {
        st = fp_set_error(e == cudaErrorMemoryAllocation ? FP_ERR_OUT_OF_MEMORY : FP_ERR_CUDA,
                          "fp_trace_roofs_measure: the pinned copy: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
    } else {
        *out = ms > 0 ? 5.0 * (double)bytes / (ms * 1e-3) / 1e9 : 0;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (d) cudaFree(d);
    if (h) cudaFreeHost(h);
    return st;
}

fp_status fp_trace_roofs_measure(fp_context *ctx, fp_trace_roofs *out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(out);
    FP_TRY(fp_struct_size_check(out->struct_size, sizeof *out, sizeof *out, "fp_trace_roofs (out)"));
    fp_trace_roofs r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    fp_device_info dev;
    fp_device_info_init(&dev);
    FP_TRY(fp_context_device_info(ctx, &dev));
    if (ctx->kind == FP_DEVICE_CUDA) {
        r.compute_tflops = dev.peak_tflops_bf16;
        r.fma_tflops = dev.peak_tflops_fp32;
        FP_TRY(fp_measure_copy_bandwidth(ctx, (size_t)256 << 20, &r.copy_gbps));
        FP_TRY(pinned_gbps(ctx, &r.pinned_gbps));
    } else {
        r.fma_tflops = cpu_fma_tflops(ctx);
        FP_TRY(fp_measure_copy_bandwidth(ctx, 0, &r.copy_gbps));
        /* a host "transfer" is a memcpy: bytes moved once at half the
         * read + write rate */
        r.pinned_gbps = r.copy_gbps / 2;
    }
    return fp_struct_write(out, &r, sizeof r, sizeof r, "fp_trace_roofs (out)");
}
