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
} fb_options;

struct fb_result {
    char name[128];
    cJSON *params;   /* object */
    cJSON *metrics;  /* object */
    char note[160];
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
cJSON *fb_device_json(const fp_device_info *dev);
char *fb_git_commit(char *buf, size_t n);
int fb_compare_files(const char *old_path, const char *new_path, double min_effect, FILE *out);
/* A fastbench/1 document, or NULL with "fastbench CMD: PATH ..." on out. */
cJSON *fb_load_json(const char *cmd, const char *path, FILE *out);

/* report_cmd.c: fastbench report RUN.json --out DIR (argv after "report") */
int fb_cmd_report(int argc, char **argv);

#endif
