/* Chrome trace event JSON of a context's spans (trace.h,
 * fp_trace_export_chrome): complete events ("ph": "X") and the metadata
 * events ("ph": "M") that name processes (devices) and threads (streams). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace_internal.h"

static int chrome_pid(int device) { return device >= 0 ? device : FP_TRACE_CPU_PID; }

/* {"name": meta, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}} */
/* A new event object appended to events, with an empty "args" object. */
static cJSON *new_event(cJSON *events, cJSON **args) {
    cJSON *e = cJSON_CreateObject();
    if (!e) return NULL;
    cJSON_AddItemToArray(events, e);
    *args = cJSON_AddObjectToObject(e, "args");
    return *args ? e : NULL;
}

static int add_meta(cJSON *events, const char *meta, int pid, int tid, const char *value) {
    cJSON *args, *e = new_event(events, &args);
    return e && cJSON_AddStringToObject(e, "name", meta) && cJSON_AddStringToObject(e, "ph", "M") &&
           cJSON_AddNumberToObject(e, "pid", pid) && cJSON_AddNumberToObject(e, "tid", tid) &&
           cJSON_AddStringToObject(args, "name", value);
}

/* The metadata of every process and thread spans[] use (first appearance). */
static int add_names(cJSON *events, const fp_context *ctx, const fp_trace_span *spans, const int *tids,
                     size_t n) {
    char buf[320];
    for (size_t i = 0; i < n; ++i) {
        int first_pid = 1, first_tid = 1;
        for (size_t j = 0; j < i && (first_pid || first_tid); ++j) {
            if (spans[j].device != spans[i].device) continue;
            first_pid = 0;
            if (tids[j] == tids[i]) first_tid = 0;
        }
        int pid = chrome_pid(spans[i].device);
        if (first_pid) {
            if (spans[i].device >= 0)
                snprintf(buf, sizeof buf, "cuda:%d%s%s", spans[i].device,
                         spans[i].device == ctx->device ? " " : "",
                         spans[i].device == ctx->device ? ctx->info.name : "");
            else
                snprintf(buf, sizeof buf, "CPU");
            if (!add_meta(events, "process_name", pid, 0, buf)) return 0;
        }
        if (first_tid) {
            if (spans[i].device >= 0)
                snprintf(buf, sizeof buf, "stream 0x%llx%s", (unsigned long long)spans[i].stream,
                         spans[i].stream == (uint64_t)(uintptr_t)ctx->stream ? " (context default)" : "");
            else
                snprintf(buf, sizeof buf, "thread %llu", (unsigned long long)spans[i].stream);
            if (!add_meta(events, "thread_name", pid, tids[i], buf)) return 0;
        }
    }
    return 1;
}

static int add_span(cJSON *events, const fp_trace_span *s, int tid, double origin) {
    cJSON *args, *e = new_event(events, &args);
    int ok = e && cJSON_AddStringToObject(e, "name", s->name) && cJSON_AddStringToObject(e, "cat", s->category) &&
             cJSON_AddStringToObject(e, "ph", "X") &&
             cJSON_AddNumberToObject(e, "ts", (s->start_s - origin) * 1e6) &&
             cJSON_AddNumberToObject(e, "dur", (s->end_s - s->start_s) * 1e6) &&
             cJSON_AddNumberToObject(e, "pid", chrome_pid(s->device)) && cJSON_AddNumberToObject(e, "tid", tid) &&
             cJSON_AddNumberToObject(args, "step", (double)s->step) &&
             cJSON_AddNumberToObject(args, "depth", s->depth);
    if (ok && s->module[0]) ok = cJSON_AddStringToObject(args, "module", s->module) != NULL;
    if (ok && s->stage[0]) ok = cJSON_AddStringToObject(args, "stage", s->stage) != NULL;
    if (ok && s->bytes > 0) ok = cJSON_AddNumberToObject(args, "bytes", s->bytes) != NULL;
    if (ok && s->flops > 0) ok = cJSON_AddNumberToObject(args, "flops", s->flops) != NULL;
    if (ok && s->allocated_bytes >= 0)
        ok = cJSON_AddNumberToObject(args, "allocated_mb", s->allocated_bytes / (1024.0 * 1024.0)) != NULL;
    if (ok && s->nranks > 0) ok = cJSON_AddNumberToObject(args, "nranks", s->nranks) != NULL;
    return ok;
}

fp_status fp_trace_export_chrome(fp_context *ctx, const char *path) {
    fp_trace_export x;
    FP_TRY(fp_trace_export_begin(ctx, path, "fp_trace_export_chrome", &x));
    cJSON *root = cJSON_CreateObject();
    cJSON *events = cJSON_CreateArray();
    int ok = root && events;
    if (ok) {
        cJSON_AddItemToObject(root, "traceEvents", events);
        ok = cJSON_AddStringToObject(root, "displayTimeUnit", "ms") != NULL &&
             add_names(events, ctx, x.spans, x.streams, x.n);
    } else {
        cJSON_Delete(events);
    }
    for (size_t i = 0; ok && i < x.n; ++i) ok = add_span(events, &x.spans[i], x.streams[i], x.origin);
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    size_t n = x.n;
    fp_trace_export_end(&x);
    if (!text) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_trace_export_chrome: the JSON of %zu spans", n);
    fp_status st = fp_write_file_atomic(path, text, strlen(text), "fp_trace_export_chrome");
    cJSON_free(text);
    return st;
}
