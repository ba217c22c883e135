/* fastbench: run libfastpath's built-in A/B timers from the command line.
 *
 *   fastbench list
 *   fastbench run [NAME-or-prefix ...] [--device cpu|cuda:N] [--dtype bf16,f16]
 *                 [--quick] [--json FILE] [--max-time S] [--min-samples N]
 *                 [--max-samples N] [--noise F] [--flush-l2] [--graph] [--NAME VALUE] [--set NAME=VALUE]
 *                 [--profile]
 *   fastbench trace NAME-or-prefix ... --out DIR [run options]
 *   fastbench compare OLD.json NEW.json [--min-effect F]
 *   fastbench report RUN.json --out DIR
 *   fastbench info [--json FILE]
 *
 * Exit codes: 0 ok; 1 a scenario failed, a numerical check failed, or
 * (compare) a regression was found; 2 usage or I/O error.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fastbench.h"
#include "internal.h" /* fp_now_s */

static void usage(FILE *f) {
    fprintf(f,
            "usage:\n"
            "  fastbench list                         list scenarios\n"
            "  fastbench run [NAME|PREFIX ...] [options]\n"
            "      --device cpu|cuda[:N]   default: cuda:0 if a GPU is present, else cpu\n"
            "      --dtype LIST            e.g. bf16 or bf16,f16,f32 (scenario default otherwise)\n"
            "      --quick                 small shapes and short timing (smoke test)\n"
            "      --json FILE             write the fastbench/1 JSON report\n"
            "      --max-time S            time cap per measured callable (default 2)\n"
            "      --min-samples N --max-samples N --noise F (target relative noise, default 0.005)\n"
            "      --flush-l2              flush L2 before every sample (cold cache)\n"
            "      --graph                 CUDA: time CUDA-graph replays (no launch gaps)\n"
            "      --NAME VALUE | --set NAME=VALUE   shape options (e.g. --rows 4096 --cols 768)\n"
            "      --profile               trace each scenario's timed samples and say what bounds them\n"
            "                              (compute, memory, launch, transfer, sync; JSON \"profiles\")\n"
            "  fastbench trace NAME|PREFIX ... --out DIR [run options]\n"
            "      run --profile, writing DIR/run.json, DIR/trace.json (Chrome / Perfetto) and\n"
            "      DIR/trace.sqlite (torch_trace, nccl_trace, runs); attention/*_anatomy also\n"
            "      DIR/cta-NN-<kernel>.json: each kernel's CTAs on a track per SM (Chrome / Perfetto)\n"
            "  fastbench compare OLD.json NEW.json [--min-effect F]   regression report\n"
            "  fastbench report RUN.json --out DIR    HTML page, roofline and speedup charts\n"
            "  fastbench info [--json FILE]           device, peaks, versions\n");
}

static int parse_device(const char *s, fb_options *o) {
    if (strcmp(s, "cpu") == 0) {
        o->kind = FP_DEVICE_CPU;
        o->device_index = -1;
    } else if (strncmp(s, "cuda", 4) == 0) {
        o->kind = FP_DEVICE_CUDA;
        o->device_index = 0;
        if (s[4] == ':') {
            char *end = NULL;
            long v = strtol(s + 5, &end, 10);
            if (!end || end == s + 5 || *end || v < 0 || v > INT_MAX) return 0;
            o->device_index = (int)v;
        } else if (s[4] != '\0') {
            return 0;
        }
    } else {
        return 0;
    }
    o->device_given = 1;
    return 1;
}

static int parse_dtypes(const char *s, fb_options *o) {
    char buf[128];
    if (strlen(s) >= sizeof buf) return 0; /* would be cut mid-name */
    snprintf(buf, sizeof buf, "%s", s);
    o->ndtypes = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (o->ndtypes == FB_MAX_DTYPES) return 0;
        if (fp_dtype_parse(tok, &o->dtypes[o->ndtypes]) != FP_OK) return 0;
        o->ndtypes++;
    }
    return o->ndtypes > 0;
}

/* Shape options are numbers, optionally with a k/K or m/M suffix (--kv 32k):
 * "12abc" or "" is a typo, not 12. A repeated option replaces the earlier
 * value (the last one wins, as in most CLIs). */
static int add_opt(fb_options *o, const char *name, const char *value) {
    if (strlen(name) >= sizeof o->opts[0].name || strlen(value) >= sizeof o->opts[0].value)
        return 0;
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (end == value || errno == ERANGE || !isfinite(v)) return 0;
    if (*end && (strchr("kKmM", *end) == NULL || end[1] != '\0')) return 0;
    fb_opt *slot = NULL;
    for (int i = 0; i < o->nopts && !slot; ++i)
        if (strcmp(o->opts[i].name, name) == 0) slot = &o->opts[i];
    if (!slot) {
        if (o->nopts == FB_MAX_OPTS) return 0;
        slot = &o->opts[o->nopts++];
    }
    snprintf(slot->name, sizeof slot->name, "%s", name);
    snprintf(slot->value, sizeof slot->value, "%s", value);
    return 1;
}

static int parse_num(const char *s, double *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (!end || *end || end == s) return 0;
    *out = v;
    return 1;
}

static int is_timing_option(const char *a) {
    return strcmp(a, "--max-time") == 0 || strcmp(a, "--min-samples") == 0 ||
           strcmp(a, "--max-samples") == 0 || strcmp(a, "--noise") == 0;
}

/* Parses run options; positional args go to patterns. Returns 0 on error. */
static int parse_run_args(int argc, char **argv, fb_options *o, char **patterns, int *npatterns) {
    for (int i = 0; i < argc; ++i) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double num;
        if (a[0] != '-') { patterns[(*npatterns)++] = argv[i]; continue; }
        if (strcmp(a, "--quick") == 0) { o->quick = 1; continue; }
        if (strcmp(a, "--flush-l2") == 0) { o->timing.flush_l2 = 1; continue; }
        if (strcmp(a, "--graph") == 0) { o->timing.use_graph = 1; continue; }
        if (strcmp(a, "--profile") == 0) { o->profile = 1; continue; }
        if (a[1] != '-' || a[2] == '\0') { fprintf(stderr, "fastbench: unknown option '%s'\n", a); return 0; }
        if (!v) { fprintf(stderr, "fastbench: option %s needs a value\n", a); return 0; }
        i++;
        if (strcmp(a, "--device") == 0) {
            if (!parse_device(v, o)) { fprintf(stderr, "fastbench: bad --device '%s' (cpu, cuda, cuda:N)\n", v); return 0; }
        } else if (strcmp(a, "--dtype") == 0) {
            if (!parse_dtypes(v, o)) { fprintf(stderr, "fastbench: bad --dtype '%s' (f32, f16, bf16)\n", v); return 0; }
        } else if (strcmp(a, "--json") == 0) {
            o->json_path = v;
        } else if (strcmp(a, "--out") == 0) {
            o->out_dir = v;
        } else if (is_timing_option(a)) {
            /* A bad value is an error: falling through would have made it a
             * shape option and silently kept the default. Sample counts are
             * ints (a cast of 1e20 would be undefined). */
            int ok = parse_num(v, &num) && isfinite(num);
            if (ok && strcmp(a, "--max-time") == 0) {
                ok = num > 0;
                if (ok) o->timing.max_time_s = num;
            } else if (ok && strcmp(a, "--noise") == 0) {
                ok = num >= 0;
                if (ok) o->timing.target_noise = num;
            } else if (ok) {
                ok = num >= 1 && num <= INT_MAX && num == floor(num);
                if (ok && strcmp(a, "--min-samples") == 0) {
                    o->timing.min_samples = (int)num;
                    if (o->timing.max_samples < o->timing.min_samples) o->timing.max_samples = (int)num;
                } else if (ok) {
                    o->timing.max_samples = (int)num;
                    if (o->timing.min_samples > o->timing.max_samples) o->timing.min_samples = (int)num;
                }
            }
            if (!ok) { fprintf(stderr, "fastbench: bad value '%s' for %s\n", v, a); return 0; }
        } else if (strcmp(a, "--set") == 0) {
            char name[64];
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof name) { fprintf(stderr, "fastbench: bad --set '%s' (NAME=VALUE)\n", v); return 0; }
            snprintf(name, sizeof name, "%.*s", (int)(eq - v), v);
            if (!add_opt(o, name, eq + 1)) { fprintf(stderr, "fastbench: bad --set '%s'\n", v); return 0; }
        } else if (strncmp(a, "--", 2) == 0 && a[2] && !add_opt(o, a + 2, v)) {
            fprintf(stderr, "fastbench: unknown option %s or bad value '%s'\n", a, v);
            return 0;
        } else if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "fastbench: unknown option %s\n", a);
            return 0;
        }
    }
    return 1;
}

static int open_context(fb_options *o, fp_context **ctx) {
    if (!o->device_given) {
        int n = 0;
        fp_device_count(&n);
        o->kind = n > 0 ? FP_DEVICE_CUDA : FP_DEVICE_CPU;
        o->device_index = n > 0 ? 0 : -1;
        fprintf(stderr, "fastbench: %s\n", n > 0 ? "using cuda:0 (a CUDA device was found)"
                                                 : "no CUDA device found: running on the CPU");
    }
    fp_status st = fp_context_create(o->kind, o->device_index, ctx);
    if (st != FP_OK) {
        fprintf(stderr, "fastbench: cannot open %s device: %s: %s\n",
                o->kind == FP_DEVICE_CUDA ? "CUDA" : "CPU", fp_status_string(st), fp_last_error());
        return 0;
    }
    return 1;
}

static cJSON *report_doc(const fp_device_info *dev) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "schema", "fastbench/1");
    char date[64], commit[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON_AddStringToObject(doc, "date", date);
    cJSON_AddStringToObject(doc, "git_commit", fb_git_commit(commit, sizeof commit));
    cJSON_AddStringToObject(doc, "library_version", fp_version_string());
    cJSON_AddItemToObject(doc, "device", fb_device_json(dev));
    return doc;
}

/* Writes through a temporary file and a rename, so a run killed mid-write
 * leaves the previous complete document, never a truncated one. */
static int write_json(const char *path, cJSON *doc) {
    char tmp[4096];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char *text = cJSON_Print(doc);
    FILE *f = (text && n > 0 && (size_t)n < sizeof tmp) ? fopen(tmp, "w") : NULL;
    int ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok && f) remove(tmp);
    cJSON_free(text);
    if (!ok) fprintf(stderr, "fastbench: cannot write %s\n", path);
    return ok;
}

/* Where a scenario's finished rows go (fb_run.emit, in order, each once):
 * stdout, the report's results and the profile, the failures counted; after
 * each batch a scenario hands on mid-run (fb_rows_done) stdout is flushed
 * and the report rewritten, so a run stopped by a time limit keeps them. */
typedef struct row_sink {
    cJSON *doc, *results;
    fb_profile *prof;
    const char *json_path;
    int tty, failures;
} row_sink;

static void sink_row(void *user, const fb_result *r) {
    row_sink *k = user;
    if (k->tty) fprintf(stderr, "\r\033[K"); /* the progress line */
    fb_print_row(stdout, r);
    cJSON_AddItemToArray(k->results, fb_result_json(r));
    fb_profile_add_run(k->prof, r);
    if (r->status != FP_OK || (r->has_ab && r->ab.compared && !r->ab.agreement.passed)) k->failures++;
}

static void sink_flush(void *user) {
    row_sink *k = user;
    fflush(stdout);
    if (k->json_path) write_json(k->json_path, k->doc);
}

static int cmd_list(void) {
    for (int i = 0; i < fb_scenario_count(); ++i) {
        const fb_scenario *s = fb_scenario_at(i);
        printf("%-30s %s\n", s->name, s->description);
    }
    return 0;
}

/* The progress line (stderr, when stdout and stderr are terminals): the
 * scenario, how long the run has taken and, after the first scenario, an
 * estimate of what is left at the mean pace so far. */
static void progress(int done, int selected, const char *name, double elapsed) {
    char left[48] = "";
    if (done > 1) snprintf(left, sizeof left, ", about %.0f s left", elapsed / (done - 1) * (selected - done + 1));
    fprintf(stderr, "\r\033[K[%d/%d] %s (%.0f s elapsed%s) ...", done, selected, name, elapsed, left);
    fflush(stderr);
}

static int cmd_run(int argc, char **argv, int trace_cmd) {
    fb_options o;
    memset(&o, 0, sizeof o);
    fp_timing_config_default(&o.timing);
    char **patterns = calloc((size_t)argc + 1, sizeof *patterns);
    int npatterns = 0;
    if (!patterns || !parse_run_args(argc, argv, &o, patterns, &npatterns)) {
        free(patterns);
        usage(stderr);
        return 2;
    }
    char run_json[4096];
    if (trace_cmd) {
        if (!o.out_dir || npatterns == 0) {
            fprintf(stderr, "fastbench trace: name the scenarios and give --out DIR\n");
            free(patterns);
            usage(stderr);
            return 2;
        }
        int n = snprintf(run_json, sizeof run_json, "%s/run.json", o.out_dir);
        if (n < 0 || (size_t)n >= sizeof run_json || !fb_make_out_dir(o.out_dir)) {
            free(patterns);
            return 2;
        }
        if (!o.json_path) o.json_path = run_json;
        o.profile = 1;
    } else if (o.out_dir) {
        fprintf(stderr, "fastbench run: --out is for 'fastbench trace' (run takes --json FILE)\n");
        free(patterns);
        return 2;
    }
    /* Samples of at least 1 ms while profiling: the timing engine's
     * boundary between two samples (an event wait) is then a small part of
     * the window the verdict reads. */
    if (o.profile && o.timing.min_sample_ms < 1.0) o.timing.min_sample_ms = 1.0;
    /* An unwritable --json path is found now, not after minutes of runs: by
     * creating the temporary file write_json renames into place, which
     * leaves an existing report untouched and creates no empty one. */
    if (o.json_path) {
        char tmp[4096];
        int n = snprintf(tmp, sizeof tmp, "%s.tmp", o.json_path);
        FILE *f = (n > 0 && (size_t)n < sizeof tmp) ? fopen(tmp, "w") : NULL;
        if (!f) {
            fprintf(stderr, "fastbench: cannot write --json %s: %s\n", o.json_path, strerror(errno));
            free(patterns);
            return 2;
        }
        fclose(f);
        remove(tmp);
    }
    int selected = 0;
    for (int i = 0; i < fb_scenario_count(); ++i)
        selected += fb_name_matches(fb_scenario_at(i)->name, patterns, npatterns);
    if (selected == 0) {
        fprintf(stderr, "fastbench: no scenario matches; see 'fastbench list'\n");
        free(patterns);
        return 2;
    }
    if (o.quick) {
        o.timing.max_time_s = o.timing.max_time_s < 0.25 ? o.timing.max_time_s : 0.25;
        o.timing.min_samples = o.timing.min_samples < 5 ? o.timing.min_samples : 5;
        o.timing.warmup = 1;
    }
    fp_context *ctx = NULL;
    if (!open_context(&o, &ctx)) { free(patterns); return 2; }
    fp_device_info dev;
    fp_device_info_init(&dev);
    fp_context_device_info(ctx, &dev);
    cJSON *doc = report_doc(&dev);
    /* false in the copies written after each scenario, true at the end */
    cJSON_AddFalseToObject(doc, "complete");
    cJSON *results = cJSON_AddArrayToObject(doc, "results");
    cJSON *skipped = cJSON_AddArrayToObject(doc, "skipped");
    int tty = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO), done = 0;
    printf("device: %s (%s)\n", dev.name, dev.kind == FP_DEVICE_CUDA ? "cuda" : "cpu");
    fb_profile prof;
    memset(&prof, 0, sizeof prof);
    cJSON *profiles = NULL;
    if (o.profile) {
        /* a ring per run: spans beyond it overwrite the oldest (counted) */
        if (!fb_profile_start(&prof, ctx, (size_t)1 << 17)) {
            cJSON_Delete(doc);
            fp_context_destroy(ctx);
            free(patterns);
            return 2;
        }
        cJSON_AddItemToObject(doc, "roofs", fb_roofs_json(&prof.roofs));
        profiles = cJSON_AddArrayToObject(doc, "profiles");
    }
    const double t_start = fp_now_s();
    row_sink sink = {doc, results, &prof, o.json_path, tty, 0};
    fb_print_header(stdout);
    for (int i = 0; i < fb_scenario_count(); ++i) {
        const fb_scenario *s = fb_scenario_at(i);
        if (!fb_name_matches(s->name, patterns, npatterns)) continue;
        done++;
        if (tty) progress(done, selected, s->name, fp_now_s() - t_start);
        fb_run run;
        fb_run_init(&run, s, ctx, &o);
        run.emit = sink_row;
        run.emitted_all = sink_flush;
        run.sink = &sink;
        fp_clear_error();
        fb_profile_scenario_begin(&prof, ctx, done);
        fp_status st = s->run(&run);
        if (tty) fprintf(stderr, "\r\033[K");
        run.emitted_all = NULL; /* the rows not yet handed on; the report is written below */
        fb_rows_done(&run);
        if (st == FP_ERR_UNSUPPORTED && !run.results) {
            const char *why = run.skip_reason[0] ? run.skip_reason : fp_last_error();
            fb_print_skip(stdout, s->name, why);
            cJSON *sk = cJSON_CreateObject();
            cJSON_AddStringToObject(sk, "name", s->name);
            cJSON_AddStringToObject(sk, "reason", why);
            cJSON_AddItemToArray(skipped, sk);
        } else if (st != FP_OK && st != FP_ERR_UNSUPPORTED) {
            fprintf(stdout, "%-28s FAILED: %s: %s\n", s->name, fp_status_string(st), fp_last_error());
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "name", s->name);
            cJSON_AddItemToObject(r, "params", cJSON_CreateObject());
            cJSON_AddStringToObject(r, "status", fp_status_string(st));
            cJSON_AddStringToObject(r, "detail", fp_last_error());
            cJSON_AddBoolToObject(r, "passed", 0);
            cJSON_AddItemToArray(results, r);
            sink.failures++;
        }
        /* a skipped scenario ran nothing to judge */
        cJSON *pj = run.results || st != FP_ERR_UNSUPPORTED ? fb_profile_scenario_end(&prof, ctx, s->name) : NULL;
        if (pj) cJSON_AddItemToArray(profiles, pj);
        fflush(stdout);
        fb_run_free(&run);
        /* Rewrite the report after every scenario: a run stopped by a time
         * limit (the GPU check's) still leaves every finished result. */
        if (o.json_path && done < selected) write_json(o.json_path, doc);
    }
    const int failures = sink.failures;
    int rc = failures ? 1 : 0;
    if (trace_cmd) {
        char commit[64];
        if (!fb_profile_export(&prof, ctx, o.out_dir, fb_git_commit(commit, sizeof commit))) rc = 2;
    }
    fb_profile_stop(&prof, ctx);
    cJSON_ReplaceItemInObjectCaseSensitive(doc, "complete", cJSON_CreateTrue());
    if (o.json_path && !write_json(o.json_path, doc)) rc = 2;
    if (failures) fprintf(stderr, "fastbench: %d failure(s)\n", failures);
    cJSON_Delete(doc);
    fp_context_destroy(ctx);
    free(patterns);
    return rc;
}

static void print_device(const fp_device_info *d) {
    printf("  %-24s %s\n", "name", d->name);
    if (d->kind == FP_DEVICE_CUDA) {
        printf("  %-24s %d.%d\n", "compute capability", d->cc_major, d->cc_minor);
        printf("  %-24s %d\n", "SMs", d->sm_count);
        printf("  %-24s %.1f GiB\n", "memory", d->total_mem_bytes / 1073741824.0);
        printf("  %-24s %.1f MiB\n", "L2", d->l2_bytes / 1048576.0);
        printf("  %-24s %.0f GB/s (%d MHz x %d bit)\n", "peak bandwidth", d->peak_gbps,
               d->mem_clock_khz / 1000, d->mem_bus_width_bits);
        printf("  %-24s %.1f TFLOP/s\n", "peak fp32", d->peak_tflops_fp32);
        printf("  %-24s %.1f TFLOP/s (dense)\n", "peak bf16 tensor", d->peak_tflops_bf16);
    } else {
        printf("  %-24s %d\n", "logical cores", d->sm_count);
        printf("  %-24s %.1f GiB\n", "memory", d->total_mem_bytes / 1073741824.0);
    }
}

static int cmd_info(int argc, char **argv) {
    const char *json_path = NULL;
    for (int i = 0; i < argc; ++i) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
        else { usage(stderr); return 2; }
    }
    int rt = 0, drv = 0, n = 0;
    fp_cuda_versions(&rt, &drv);
    fp_device_count(&n);
    printf("libfastpath %s (header %d, library %d)\n", fp_version_string(), FP_VERSION_NUMBER, fp_version());
    printf("CUDA runtime %d.%d, driver %s\n", rt / 1000, (rt % 1000) / 10,
           drv ? "present" : "absent (no GPU work possible)");
    if (drv) printf("CUDA driver API %d.%d\n", drv / 1000, (drv % 1000) / 10);
    printf("CUDA devices: %d\n", n);
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "schema", "fastbench-info/1");
    cJSON_AddStringToObject(doc, "library_version", fp_version_string());
    cJSON_AddNumberToObject(doc, "cuda_runtime_version", rt);
    cJSON_AddNumberToObject(doc, "cuda_driver_version", drv);
    cJSON *devs = cJSON_AddArrayToObject(doc, "devices");
    for (int i = 0; i < n; ++i) {
        fp_device_info d;
        fp_device_info_init(&d);
        if (fp_device_get_info(i, &d) != FP_OK) {
            printf("cuda:%d: %s\n", i, fp_last_error());
            continue;
        }
        printf("cuda:%d\n", i);
        print_device(&d);
        cJSON_AddItemToArray(devs, fb_device_json(&d));
    }
    fp_device_info cpu;
    fp_device_info_init(&cpu);
    fp_cpu_get_info(&cpu);
    printf("cpu\n");
    print_device(&cpu);
    cJSON_AddItemToArray(devs, fb_device_json(&cpu));
    int rc = 0;
    if (json_path && !write_json(json_path, doc)) rc = 2;
    cJSON_Delete(doc);
    return rc;
}

static int cmd_compare(int argc, char **argv) {
    const char *paths[2];
    int np = 0;
    double min_effect = 0.01;
    for (int i = 0; i < argc; ++i) {
        if (strcmp(argv[i], "--min-effect") == 0 && i + 1 < argc) {
            if (!parse_num(argv[++i], &min_effect) || min_effect < 0) { usage(stderr); return 2; }
        } else if (np < 2 && argv[i][0] != '-') {
            paths[np++] = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (np != 2) { usage(stderr); return 2; }
    return fb_compare_files(paths[0], paths[1], min_effect, stdout);
}

int main(int argc, char **argv) {
    if (fp_version() != FP_VERSION_NUMBER)
        fprintf(stderr, "fastbench: warning: header version %d, library %d\n", FP_VERSION_NUMBER, fp_version());
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
    if (strcmp(cmd, "list") == 0) return cmd_list();
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2, 0);
    if (strcmp(cmd, "trace") == 0) return cmd_run(argc - 2, argv + 2, 1);
    if (strcmp(cmd, "compare") == 0) return cmd_compare(argc - 2, argv + 2);
    if (strcmp(cmd, "report") == 0) return fb_cmd_report(argc - 2, argv + 2);
    if (strcmp(cmd, "info") == 0) return cmd_info(argc - 2, argv + 2);
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) { usage(stdout); return 0; }
    fprintf(stderr, "fastbench: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
