// Checks shared by the emulation's self-tests (test_emu_*.cu): EXPECT counts
// failures, failed_with(e, text) expects a refused or failed launch whose
// fp_emu::last_failure() names `text` (and clears the error), emu_test_end
// reports and gives the exit status.
#pragma once

#include <cstdio>
#include <cstring>

#include "cuda_emu.h"

static int g_fail = 0;
#define EXPECT(c)                                                                  \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "%s:%d: EXPECT failed: %s\n", __FILE__, __LINE__, #c); \
            g_fail++;                                                              \
        }                                                                          \
    } while (0)

static inline bool failed_with(cudaError_t e, const char *needle) {
    bool ok = e != cudaSuccess && std::strstr(fp_emu::last_failure(), needle) != nullptr;
    if (!ok) fprintf(stderr, "  (error %d, failure \"%s\", wanted \"%s\")\n", (int)e, fp_emu::last_failure(), needle);
    (void)cudaGetLastError();
    return ok;
}

static inline int emu_test_end(const char *name) {
    if (g_fail) fprintf(stderr, "%s: %d failures\n", name, g_fail);
    else printf("%s: ok (%ld launches)\n", name, fp_emu::launches());
    return g_fail ? 1 : 0;
}
