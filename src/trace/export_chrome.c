/* Chrome trace event JSON of a context's spans (trace.h,
 * fp_trace_export_chrome): complete events ("ph": "X") and the metadata
 * events ("ph": "M") that name processes (devices) and threads (streams). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace_internal.h"

static int chrome_pid(int device) { return device >= 0 ? device : FP_TRACE_CPU_PID; }

/* The document is written event by event (each printed by cJSON, then
 * freed) into a memory stream, so a large ring costs its text, not a cJSON
 * tree of every span. */
typedef struct writer {
    FILE *f;
    int first;
    int ok;
} writer;

/* An event object with an empty "args" object (NULL: out of memory). */
static cJSON *new_event(cJSON **args) {
    cJSON *e = cJSON_CreateObject();
    *args = e ? cJSON_AddObjectToObject(e, "args") : NULL;
    if (!*args) {
        cJSON_Delete(e);
        return NULL;
    }
    return e;
}

/* Appends e (built when `built`) to the document and frees it. */
static void emit(writer *w, cJSON *e, int built) {
    char *text = built && w->ok ? cJSON_PrintUnformatted(e) : NULL;
    if (!text || fprintf(w->f, "%s%s", w->first ? "" : ",", text) < 0) w->ok = 0;
    w->first = 0;
    cJSON_free(text);
    cJSON_Delete(e);
}

/* {"name": meta, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}} */
static void add_meta(writer *w, const char *meta, int pid, int tid, const char *value) {
    cJSON *args, *e = new_event(&args);
    int ok = e && cJSON_AddStringToObject(e, "name", meta) && cJSON_AddStringToObject(e, "ph", "M") &&
             cJSON_AddNumberToObject(e, "pid", pid) && cJSON_AddNumberToObject(e, "tid", tid) &&
             cJSON_AddStringToObject(args, "name", value);
    emit(w, e, ok);
}

/* The metadata naming every process (device) and thread (stream) of the
 * spans. Stream numbers are given per device in order of first appearance
 * (fp_trace_export), so a thread is new when its number exceeds the
 * device's largest so far. */
static void add_names(writer *w, const fp_context *ctx, const fp_trace_export *x) {
    /* per device seen: its ordinal and its largest stream number so far */
    int *devices = x->n ? malloc(2 * x->n * sizeof *devices) : NULL, *top = devices ? devices + x->n : NULL;
    int nd = 0;
    if (x->n && !devices) w->ok = 0;
    char buf[320];
    for (size_t i = 0; i < x->n && w->ok; ++i) {
        const fp_trace_span *s = &x->spans[i];
        int d = 0;
        while (d < nd && devices[d] != s->device) ++d;
        if (d == nd) { /* a new process */
            devices[nd] = s->device;
            top[nd++] = 0;
            if (s->device >= 0)
                snprintf(buf, sizeof buf, "cuda:%d%s%s", s->device, s->device == ctx->device ? " " : "",
                         s->device == ctx->device ? ctx->info.name : "");
            else
                snprintf(buf, sizeof buf, "CPU");
            add_meta(w, "process_name", chrome_pid(s->device), 0, buf);
        }
        if (x->streams[i] > top[d]) { /* a new thread */
            top[d] = x->streams[i];
            if (s->device >= 0)
                snprintf(buf, sizeof buf, "stream 0x%llx%s", (unsigned long long)s->stream,
                         s->stream == (uint64_t)(uintptr_t)ctx->stream ? " (context default)" : "");
            else
                snprintf(buf, sizeof buf, "thread %llu", (unsigned long long)s->stream);
            add_meta(w, "thread_name", chrome_pid(s->device), x->streams[i], buf);
        }
    }
    free(devices);
}

static void add_span(writer *w, const fp_trace_span *s, int tid, double origin) {
    cJSON *args, *e = new_event(&args);
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
    emit(w, e, ok);
}

fp_status fp_trace_export_chrome(fp_context *ctx, const char *path) {
    fp_trace_export x;
    FP_TRY(fp_trace_export_begin(ctx, path, "fp_trace_export_chrome", &x));
    char *text = NULL;
    size_t len = 0;
    writer w = {open_memstream(&text, &len), 1, 1};
    if (w.f) {
        w.ok = fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", w.f) >= 0;
        add_names(&w, ctx, &x);
        for (size_t i = 0; i < x.n && w.ok; ++i) add_span(&w, &x.spans[i], x.streams[i], x.origin);
        w.ok = fputs("]}\n", w.f) >= 0 && w.ok;
        w.ok = fclose(w.f) == 0 && w.ok;
    }
    size_t n = x.n;
    fp_trace_export_end(&x);
    fp_status st = w.f && w.ok ? fp_write_file_atomic(path, text, len, "fp_trace_export_chrome")
                               : fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_trace_export_chrome: the JSON of %zu spans", n);
    free(text);
    return st;
}
