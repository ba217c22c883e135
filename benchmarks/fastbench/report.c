/* Output: the aligned table, the fastbench/1 JSON document, and the
 * regression comparison of two JSON files. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fastbench.h"

static void fmt_time(double ms, char *buf, size_t n) {
    if (ms <= 0) snprintf(buf, n, "-");
    else if (ms < 1e-3) snprintf(buf, n, "%.1f ns", ms * 1e6);
    else if (ms < 1.0) snprintf(buf, n, "%.2f us", ms * 1e3);
    else if (ms < 1e3) snprintf(buf, n, "%.3f ms", ms);
    else snprintf(buf, n, "%.2f s", ms / 1e3);
}

void fb_print_header(FILE *f) {
    fprintf(f, "%-28s %-44s %11s %11s %8s %-7s %9s %8s %6s %9s %s\n", "scenario", "shape", "baseline",
            "optimized", "speedup", "verdict", "GB/s", "TFLOP/s", "%peak", "max_err", "check/notes");
}

void fb_print_row(FILE *f, const fb_result *r) {
    char shape[256], b[32], o[32], gbps[32], tf[32], pct[32], err[32];
    fb_params_string(r->params, shape, sizeof shape);
    if (r->status != FP_OK) {
        fprintf(f, "%-28s %-44s FAILED: %s: %s\n", r->name, shape, fp_status_string(r->status), r->detail);
        return;
    }
    char notes[448] = "";
    if (r->has_ab) {
        const fp_ab_report *a = &r->ab;
        fmt_time(a->baseline.median_ms, b, sizeof b);
        fmt_time(a->optimized.median_ms, o, sizeof o);
        snprintf(gbps, sizeof gbps, a->achieved_gbps > 0 ? "%.1f" : "-", a->achieved_gbps);
        snprintf(tf, sizeof tf, a->achieved_tflops > 0 ? "%.2f" : "-", a->achieved_tflops);
        if (a->pct_of_peak >= 0) snprintf(pct, sizeof pct, "%.1f%%", a->pct_of_peak);
        else snprintf(pct, sizeof pct, "-");
        if (a->compared) snprintf(err, sizeof err, "%.2e", a->agreement.max_abs_err);
        else snprintf(err, sizeof err, "-");
        snprintf(notes, sizeof notes, "%s", a->compared ? (a->agreement.passed ? "ok" : "MISMATCH") : "");
        fprintf(f, "%-28s %-44s %11s %11s %7.2fx %-7s %9s %8s %6s %9s ", r->name, shape, b, o,
                a->speedup, fp_verdict_string(a->verdict), gbps, tf, pct, err);
    } else {
        fprintf(f, "%-28s %-44s %11s %11s %8s %-7s %9s %8s %6s %9s ", r->name, shape, "-", "-", "-",
                "-", "-", "-", "-", "-");
    }
    int shown = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, r->metrics) {
        if (shown == 2) break;
        size_t used = strlen(notes);
        snprintf(notes + used, sizeof notes - used, "%s%s=%.4g", used ? " " : "", m->string, m->valuedouble);
        shown++;
    }
    if (r->note[0]) {
        size_t used = strlen(notes);
        snprintf(notes + used, sizeof notes - used, "%s%s", used ? " " : "", r->note);
    }
    fprintf(f, "%s\n", notes);
}

void fb_print_skip(FILE *f, const char *name, const char *why) {
    fprintf(f, "%-28s skipped: %s\n", name, why);
}

static cJSON *stats_json(const fp_stats *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "median_ms", s->median_ms);
    cJSON_AddNumberToObject(o, "p10_ms", s->p10_ms);
    cJSON_AddNumberToObject(o, "p90_ms", s->p90_ms);
    cJSON_AddNumberToObject(o, "mean_ms", s->mean_ms);
    cJSON_AddNumberToObject(o, "min_ms", s->min_ms);
    cJSON_AddNumberToObject(o, "max_ms", s->max_ms);
    cJSON_AddNumberToObject(o, "stdev_ms", s->stdev_ms);
    cJSON_AddNumberToObject(o, "noise", s->noise);
    cJSON_AddNumberToObject(o, "samples", s->samples);
    return o;
}

/* JSON has no Inf/NaN: such values become null. */
void fb_json_number(cJSON *o, const char *k, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

cJSON *fb_result_json(const fb_result *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", r->name);
    cJSON_AddItemToObject(o, "params", cJSON_Duplicate(r->params, 1));
    cJSON_AddStringToObject(o, "status", fp_status_string(r->status));
    if (r->status != FP_OK) cJSON_AddStringToObject(o, "detail", r->detail);
    if (r->has_ab) {
        const fp_ab_report *a = &r->ab;
        cJSON_AddItemToObject(o, "baseline", stats_json(&a->baseline));
        cJSON_AddItemToObject(o, "optimized", stats_json(&a->optimized));
        fb_json_number(o, "speedup", a->speedup);
        cJSON_AddStringToObject(o, "verdict", fp_verdict_string(a->verdict));
        cJSON_AddBoolToObject(o, "compared", a->compared);
        /* The agreement is only set when outputs were compared: a row that
         * compared nothing has no error and no pass/fail either way. */
        fb_json_number(o, "max_abs_err", a->compared ? a->agreement.max_abs_err : NAN);
        fb_json_number(o, "max_rel_err", a->compared ? a->agreement.max_rel_err : NAN);
        fb_json_number(o, "tolerance", a->compared ? a->agreement.atol : NAN);
        fb_json_number(o, "rtol", a->compared ? a->agreement.rtol : NAN);
        fb_json_number(o, "achieved_gbps", a->achieved_gbps);
        fb_json_number(o, "achieved_tflops", a->achieved_tflops);
        if (a->pct_of_peak >= 0) fb_json_number(o, "pct_of_peak", a->pct_of_peak);
        else cJSON_AddNullToObject(o, "pct_of_peak");
        cJSON_AddStringToObject(o, "bound", a->bound ? a->bound : "unknown");
    }
    /* "passed": the numerical check's verdict; a failed row never passes, and
     * a row that compared no outputs says null, not a verdict either way. */
    if (r->status != FP_OK) cJSON_AddFalseToObject(o, "passed");
    else if (r->has_ab && r->ab.compared) cJSON_AddBoolToObject(o, "passed", r->ab.agreement.passed);
    else cJSON_AddNullToObject(o, "passed");
    cJSON_AddItemToObject(o, "metrics", cJSON_Duplicate(r->metrics, 1));
    if (r->note[0]) cJSON_AddStringToObject(o, "note", r->note);
    return o;
}

cJSON *fb_device_json(const fp_device_info *d) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON_AddStringToObject(o, "kind", d->kind == FP_DEVICE_CUDA ? "cuda" : "cpu");
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
    if (d->kind == FP_DEVICE_CUDA) cJSON_AddStringToObject(o, "compute_capability", cc);
    else cJSON_AddNullToObject(o, "compute_capability");
    cJSON_AddNumberToObject(o, "index", d->index);
    cJSON_AddNumberToObject(o, "sm_count", d->sm_count);
    cJSON_AddNumberToObject(o, "total_mem_bytes", (double)d->total_mem_bytes);
    cJSON_AddNumberToObject(o, "l2_bytes", (double)d->l2_bytes);
    cJSON_AddNumberToObject(o, "peak_gbps", d->peak_gbps);
    cJSON_AddNumberToObject(o, "peak_tflops_fp32", d->peak_tflops_fp32);
    cJSON_AddNumberToObject(o, "peak_tflops_bf16", d->peak_tflops_bf16);
    cJSON_AddNumberToObject(o, "driver_version", d->driver_version);
    cJSON_AddNumberToObject(o, "runtime_version", d->runtime_version);
    return o;
}

char *fb_git_commit(char *buf, size_t n) {
    const char *env = getenv("FASTPATH_GIT_COMMIT");
    snprintf(buf, n, "unknown");
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return buf;
    }
#ifdef FB_SOURCE_DIR
    FILE *p = popen("git -C '" FB_SOURCE_DIR "' rev-parse HEAD 2>/dev/null", "r");
    if (p) {
        char line[128];
        if (fgets(line, sizeof line, p)) {
            line[strcspn(line, "\n")] = '\0';
            if (line[0]) snprintf(buf, n, "%s", line);
        }
        pclose(p);
    }
#endif
    return buf;
}

/* ---- compare ---- */

/* Reads a fastbench/1 document for command cmd ("compare", "report"):
 * NULL, with one line on out naming the file and the fault, when it cannot
 * be opened or read, is not a regular file, is not JSON, or is not a
 * fastbench report (no "fastbench/..." schema or no results array). */
cJSON *fb_load_json(const char *cmd, const char *path, FILE *out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(out, "fastbench %s: cannot open %s: %s\n", cmd, path, strerror(errno));
        return NULL;
    }
    /* A directory opens fine on Linux and reports an absurd size at
     * SEEK_END (ext4: LLONG_MAX); a pipe reports -1. Only regular files. */
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        fprintf(out, "fastbench %s: %s is not a regular file\n", cmd, path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!text || got != (size_t)len) {
        free(text);
        fprintf(out, "fastbench %s: cannot read %s\n", cmd, path);
        return NULL;
    }
    text[len] = '\0';
    cJSON *doc = cJSON_Parse(text);
    free(text);
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(doc, "schema");
    if (!doc) {
        fprintf(out, "fastbench %s: %s is %s\n", cmd, path, len ? "not valid JSON (truncated?)" : "empty");
    } else if (!cJSON_IsString(schema) || strncmp(schema->valuestring, "fastbench/", 10) != 0) {
        fprintf(out, "fastbench %s: %s is not a fastbench JSON report (no fastbench/ schema)\n", cmd, path);
    } else if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(doc, "results"))) {
        fprintf(out, "fastbench %s: %s is not a fastbench JSON report (results is not an array)\n", cmd, path);
    } else {
        return doc;
    }
    cJSON_Delete(doc);
    return NULL;
}

static void result_key(const cJSON *r, char *buf, size_t n) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(r, "name");
    char params[256];
    fb_params_string(cJSON_GetObjectItemCaseSensitive(r, "params"), params, sizeof params);
    snprintf(buf, n, "%s|%s", cJSON_IsString(name) ? name->valuestring : "?", params);
}

/* The identity of a result for matching: its name and its full params as
 * JSON (malloc'ed; NULL on allocation failure). The display key above is cut
 * at 256 characters, so two shapes differing only late in a long params
 * string would otherwise match each other. */
static char *match_key(const cJSON *r) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(r, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(r, "params");
    char *pj = params ? cJSON_PrintUnformatted(params) : NULL;
    const char *n = cJSON_IsString(name) ? name->valuestring : "?";
    size_t len = strlen(n) + (pj ? strlen(pj) : 0) + 2;
    char *key = malloc(len);
    if (key) snprintf(key, len, "%s|%s", n, pj ? pj : "");
    cJSON_free(pj);
    return key;
}

/* Rebuilds the statistics the verdict needs from a JSON "optimized" block. */
static int stats_from_json(const cJSON *o, fp_stats *s) {
    memset(s, 0, sizeof *s);
    const cJSON *med = cJSON_GetObjectItemCaseSensitive(o, "median_ms");
    const cJSON *p10 = cJSON_GetObjectItemCaseSensitive(o, "p10_ms");
    const cJSON *p90 = cJSON_GetObjectItemCaseSensitive(o, "p90_ms");
    if (!cJSON_IsNumber(med) || !cJSON_IsNumber(p10) || !cJSON_IsNumber(p90)) return 0;
    s->median_ms = med->valuedouble;
    s->p10_ms = p10->valuedouble;
    s->p90_ms = p90->valuedouble;
    /* Two separate runs: drift between them is not cancelled by interleaving,
     * so each distribution's own spread is the noise (samples = 1). */
    s->samples = 1;
    s->noise = s->median_ms > 0 ? (s->p90_ms - s->p10_ms) / (2.5631 * s->median_ms) : 0;
    return s->median_ms > 0;
}

int fb_compare_files(const char *old_path, const char *new_path, double min_effect, FILE *out) {
    cJSON *old_doc = fb_load_json("compare", old_path, out), *new_doc = fb_load_json("compare", new_path, out);
    if (!old_doc || !new_doc) {
        cJSON_Delete(old_doc);
        cJSON_Delete(new_doc);
        return 2;
    }
    const cJSON *old_res = cJSON_GetObjectItemCaseSensitive(old_doc, "results");
    const cJSON *new_res = cJSON_GetObjectItemCaseSensitive(new_doc, "results");
    int slower = 0, faster = 0, same = 0, unmatched = 0;
    fprintf(out, "%-50s %11s %11s %8s %s\n", "scenario|shape", "old", "new", "speedup", "verdict");
    const cJSON *nr;
    cJSON_ArrayForEach(nr, new_res) {
        char key[400];
        result_key(nr, key, sizeof key);
        char *mkey = match_key(nr);
        const cJSON *match = NULL, *orr;
        cJSON_ArrayForEach(orr, old_res) {
            char *okey = mkey ? match_key(orr) : NULL;
            int eq = okey && strcmp(mkey, okey) == 0;
            free(okey);
            if (eq) { match = orr; break; }
        }
        free(mkey);
        fp_stats so, sn;
        if (!match || !stats_from_json(cJSON_GetObjectItemCaseSensitive(match, "optimized"), &so) ||
            !stats_from_json(cJSON_GetObjectItemCaseSensitive(nr, "optimized"), &sn)) {
            fprintf(out, "%-50s %11s %11s %8s %s\n", key, "-", "-", "-", match ? "no timing" : "new");
            unmatched++;
            continue;
        }
        double sp = 0;
        /* Old plays the baseline: speedup > 1 means the new run is faster. */
        fp_verdict v = fp_verdict_decide(&so, &sn, min_effect, &sp);
        char a[32], b[32];
        fmt_time(so.median_ms, a, sizeof a);
        fmt_time(sn.median_ms, b, sizeof b);
        fprintf(out, "%-50s %11s %11s %7.3fx %s\n", key, a, b, sp,
                v == FP_VERDICT_SLOWER ? "SLOWER (regression)" : fp_verdict_string(v));
        slower += v == FP_VERDICT_SLOWER;
        faster += v == FP_VERDICT_FASTER;
        same += v == FP_VERDICT_SAME;
    }
    fprintf(out, "\n%d faster, %d slower, %d same, %d unmatched\n", faster, slower, same, unmatched);
    cJSON_Delete(old_doc);
    cJSON_Delete(new_doc);
    return slower ? 1 : 0;
}
