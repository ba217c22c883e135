/* fastbench internals shared by the CLI files (not by scenarios: they use
 * scenario.h only). */
#ifndef FASTBENCH_INTERNAL_H
#define FASTBENCH_INTERNAL_H

#include <stdio.h>

#include "scenario.h"

#define FB_MAX_DTYPES 8
#define FB_MAX_OPTS 64

typedef struct fb_opt {
    char name[64];
    char value[64];
} fb_opt;

typedef struct fb_options {
    fp_device_kind kind;
    int device_index;
    int device_given;
    fp_dtype dtypes[FB_MAX_DTYPES];
    int ndtypes;
    int quick;
    fp_timing_config timing;
    fb_opt opts[FB_MAX_OPTS];
    int nopts;
    const char *json_path;
    int profile;            /* --profile, and always for `trace` */
    const char *out_dir;    /* `trace --out DIR` */
} fb_options;

struct fb_result {
    char name[128];
    cJSON *params;   /* object */
    cJSON *metrics;  /* object */
    char note[320];
    int has_ab;
    fp_ab_report ab;
    fp_status status; /* FP_OK unless the row failed */
    char detail[256];
    struct fb_result *next;
};

struct fb_run {
    const fb_scenario *scenario;
    fp_context *ctx;
    fp_device_info device;
    const fb_options *options;
    fb_result *results, *last;
    char skip_reason[256];
    /* Where finished rows go (main.c: printed, added to the report and the
     * profile), each once and in order: at fb_rows_done and when the
     * scenario returns. emitted: the last row handed on (NULL: none). */
    void (*emit)(void *sink, const fb_result *r);
    void (*emitted_all)(void *sink); /* after each batch: flush, rewrite the report */
    void *sink;
    fb_result *emitted;
};

/* registry.c */
int fb_scenario_count(void);
const fb_scenario *fb_scenario_at(int i); /* sorted by name */
/* 1 if name matches any pattern: exact name, or a prefix ("norm", "norm/"). */
int fb_name_matches(const char *name, char *const *patterns, int npatterns);

/* run.c */
void fb_run_init(fb_run *run, const fb_scenario *s, fp_context *ctx, const fb_options *o);
void fb_run_free(fb_run *run);
/* Renders params as "k=v,k=v" into buf. */
void fb_params_string(const cJSON *params, char *buf, size_t n);

/* report.c */
void fb_print_header(FILE *f);
void fb_print_row(FILE *f, const fb_result *r);
void fb_print_skip(FILE *f, const char *name, const char *why);
cJSON *fb_result_json(const fb_result *r);
/* v as a JSON number, null when not finite (JSON has no Inf / NaN). */
void fb_json_number(cJSON *o, const char *k, double v);
cJSON *fb_device_json(const fp_device_info *dev);
char *fb_git_commit(char *buf, size_t n);
int fb_compare_files(const char *old_path, const char *new_path, double min_effect, FILE *out);
/* A fastbench/1 document, or NULL with "fastbench CMD: PATH ..." on out. */
cJSON *fb_load_json(const char *cmd, const char *path, FILE *out);

/* report_cmd.c: fastbench report RUN.json --out DIR (argv after "report") */
int fb_cmd_report(int argc, char **argv);

/* profile.c: `run --profile` and `trace --out DIR` */
typedef struct fb_profile_run {
    char label[400];
    fp_ab_report report;
} fb_profile_run;

typedef struct fb_profile {
    int on;
    fp_trace_roofs roofs;
    int step;                /* the scenario's number: its spans' step tag */
    uint64_t dropped_before;
    fb_profile_run *runs;    /* the A/B results, for the database's runs table */
    int nruns, cap_runs;
} fb_profile;

/* Measures the roofs and turns tracing on (a ring of `capacity` spans);
 * 0 with a message on failure. */
int fb_profile_start(fb_profile *p, fp_context *ctx, size_t capacity);
/* Tags what the scenario records with its number. */
void fb_profile_scenario_begin(fb_profile *p, fp_context *ctx, int index);
/* The scenario's profile object (the verdict of its measured samples), and
 * a line on stdout; NULL when profiling is off. */
cJSON *fb_profile_scenario_end(fb_profile *p, fp_context *ctx, const char *scenario);
void fb_profile_add_run(fb_profile *p, const fb_result *r);
/* DIR/trace.json and DIR/trace.sqlite (with the runs); 0 with a message on failure. */
int fb_profile_export(fb_profile *p, fp_context *ctx, const char *dir, const char *commit);
void fb_profile_stop(fb_profile *p, fp_context *ctx);
cJSON *fb_roofs_json(const fp_trace_roofs *r);
cJSON *fb_verdict_json(const fp_trace_verdict *v);
int fb_make_out_dir(const char *dir);

#endif
