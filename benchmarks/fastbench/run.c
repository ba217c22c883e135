/* What a running scenario sees: its context, options, and result rows. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fastbench.h"

void fb_run_init(fb_run *run, const fb_scenario *s, fp_context *ctx, const fb_options *o) {
    memset(run, 0, sizeof *run);
    run->scenario = s;
    run->ctx = ctx;
    run->options = o;
    fp_device_info_init(&run->device);
    fp_context_device_info(ctx, &run->device);
}

void fb_run_free(fb_run *run) {
    fb_result *r = run->results;
    while (r) {
        fb_result *next = r->next;
        cJSON_Delete(r->params);
        cJSON_Delete(r->metrics);
        free(r);
        r = next;
    }
    run->results = run->last = NULL;
}

fp_context *fb_ctx(fb_run *run) { return run->ctx; }
fp_device_kind fb_kind(fb_run *run) { return fp_context_kind(run->ctx); }
const fp_device_info *fb_device(fb_run *run) { return &run->device; }
const fp_timing_config *fb_timing(fb_run *run) { return &run->options->timing; }
int fb_quick(fb_run *run) { return run->options->quick; }
const char *fb_out_dir(fb_run *run) { return run->options->out_dir; }

int fb_dtypes(fb_run *run, fp_dtype *out, int max) {
    int n = run->options->ndtypes < max ? run->options->ndtypes : max;
    for (int i = 0; i < n; ++i) out[i] = run->options->dtypes[i];
    return n;
}

static const fb_opt *find_opt(fb_run *run, const char *name) {
    for (int i = 0; i < run->options->nopts; ++i)
        if (strcmp(run->options->opts[i].name, name) == 0) return &run->options->opts[i];
    return NULL;
}

int fb_opt_given(fb_run *run, const char *name) { return find_opt(run, name) != NULL; }

/* A value checked by the CLI (a number with an optional k/K or m/M suffix:
 * --kv 32k). Parsed as a double so "1e6" is 1000000, not 1 as strtoll reads
 * it, and so a suffix cannot overflow an integer multiplication. */
static double opt_value(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end && (*end == 'k' || *end == 'K')) v *= 1024.0;
    else if (end && (*end == 'm' || *end == 'M')) v *= 1024.0 * 1024.0;
    return v;
}

int64_t fb_opt_int(fb_run *run, const char *name, int64_t def) {
    const fb_opt *o = find_opt(run, name);
    if (!o) return def;
    /* Plain integers stay exact (seeds above 2^53); 1e6, 2.5k go through
     * the double. */
    char *end = NULL;
    errno = 0;
    long long iv = strtoll(o->value, &end, 0);
    if (errno == 0 && end != o->value && *end == '\0') return (int64_t)iv;
    double v = trunc(opt_value(o->value));
    /* Clamped into int64 (a cast of an out-of-range double is undefined). */
    if (!(v == v)) return def;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

double fb_opt_double(fb_run *run, const char *name, double def) {
    const fb_opt *o = find_opt(run, name);
    return o ? opt_value(o->value) : def;
}

fp_status fb_skip(fb_run *run, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(run->skip_reason, sizeof run->skip_reason, fmt, ap);
    va_end(ap);
    return FP_ERR_UNSUPPORTED;
}

fb_result *fb_result_new(fb_run *run) {
    fb_result *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    snprintf(r->name, sizeof r->name, "%s", run->scenario->name);
    r->params = cJSON_CreateObject();
    r->metrics = cJSON_CreateObject();
    if (run->last) run->last->next = r;
    else run->results = r;
    run->last = r;
    return r;
}

void fb_rows_done(fb_run *run) {
    if (!run->emit) return;
    int any = 0;
    for (fb_result *r = run->emitted ? run->emitted->next : run->results; r; r = r->next) {
        run->emit(run->sink, r);
        run->emitted = r;
        any = 1;
    }
    if (any && run->emitted_all) run->emitted_all(run->sink);
}

void fb_param_int(fb_result *r, const char *key, int64_t v) {
    if (r) cJSON_AddNumberToObject(r->params, key, (double)v);
}

void fb_param_str(fb_result *r, const char *key, const char *v) {
    if (r) cJSON_AddStringToObject(r->params, key, v);
}

void fb_result_set_ab(fb_result *r, const fp_ab_report *rep) {
    if (!r || !rep) return;
    r->ab = *rep;
    r->has_ab = 1;
}

void fb_result_metric(fb_result *r, const char *key, double v) {
    if (r) cJSON_AddNumberToObject(r->metrics, key, v);
}

void fb_result_note(fb_result *r, const char *fmt, ...) {
    if (!r) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note, sizeof r->note, fmt, ap);
    va_end(ap);
}

void fb_result_fail(fb_result *r, fp_status st, const char *detail) {
    if (!r) return;
    r->status = st == FP_OK ? FP_ERR_INTERNAL : st;
    snprintf(r->detail, sizeof r->detail, "%s", detail ? detail : "");
}

void fb_params_string(const cJSON *params, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    const cJSON *it;
    cJSON_ArrayForEach(it, params) {
        char val[64];
        if (cJSON_IsString(it)) snprintf(val, sizeof val, "%s", it->valuestring);
        else snprintf(val, sizeof val, "%.15g", it->valuedouble);
        int w = snprintf(buf + used, n - used, "%s%s=%s", used ? "," : "", it->string, val);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}
