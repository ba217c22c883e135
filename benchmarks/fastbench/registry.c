/* The scenario registry, filled by FB_SCENARIO constructors before main(). */
#include <stdlib.h>
#include <string.h>

#include "fastbench.h"

#define FB_MAX_SCENARIOS 256

static const fb_scenario *g_scenarios[FB_MAX_SCENARIOS];
static int g_count;
static int g_sorted;

void fb_register(const fb_scenario *s) {
    if (g_count < FB_MAX_SCENARIOS) g_scenarios[g_count++] = s;
    g_sorted = 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const fb_scenario *const *)a)->name, (*(const fb_scenario *const *)b)->name);
}

int fb_scenario_count(void) { return g_count; }

const fb_scenario *fb_scenario_at(int i) {
    if (!g_sorted) {
        qsort(g_scenarios, (size_t)g_count, sizeof g_scenarios[0], by_name);
        g_sorted = 1;
    }
    return (i >= 0 && i < g_count) ? g_scenarios[i] : NULL;
}

int fb_name_matches(const char *name, char *const *patterns, int npatterns) {
    if (npatterns == 0) return 1;
    for (int i = 0; i < npatterns; ++i) {
        const char *p = patterns[i];
        size_t n = strlen(p);
        if (n == 0) continue;
        if (strcmp(name, p) == 0) return 1;
        /* "norm" and "norm/" both select the module; "norm/layer" a prefix. */
        if (strncmp(name, p, n) == 0) return 1;
    }
    return 0;
}
