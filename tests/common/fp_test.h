/* Minimal test helpers for CTest-driven C tests: checks that report
 * file:line and fp_last_error(), a GPU-skip helper (exit 77), and random
 * inputs (never zeros). */
#ifndef FP_TEST_H
#define FP_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fastpath/fastpath.h"

#define FP_SKIP_CODE 77

static int fp_test_failures = 0;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            fp_test_failures++;                                                     \
        }                                                                           \
    } while (0)

#define CHECK_MSG(cond, ...)                                                        \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
            fp_test_failures++;                                                     \
        }                                                                           \
    } while (0)

/* Expects an exact status; prints the detail message when it differs. */
#define CHECK_STATUS(expr, want)                                                     \
    do {                                                                             \
        fp_status got_ = (expr);                                                     \
        if (got_ != (want)) {                                                        \
            fprintf(stderr, "%s:%d: %s returned '%s', expected '%s' (detail: %s)\n",  \
                    __FILE__, __LINE__, #expr, fp_status_string(got_),               \
                    fp_status_string(want), fp_last_error());                        \
            fp_test_failures++;                                                      \
        }                                                                            \
    } while (0)
#define CHECK_OK(expr) CHECK_STATUS(expr, FP_OK)

#define CHECK_NEAR(a, b, tol)                                                        \
    do {                                                                             \
        double a_ = (a), b_ = (b);                                                   \
        if (!(fabs(a_ - b_) <= (tol))) {                                             \
            fprintf(stderr, "%s:%d: %s = %.9g, expected %.9g (tol %g)\n", __FILE__,  \
                    __LINE__, #a, a_, b_, (double)(tol));                            \
            fp_test_failures++;                                                      \
        }                                                                            \
    } while (0)

/* Ends main(): prints a summary line and returns the exit code. */
#define TEST_END()                                                                   \
    do {                                                                             \
        if (fp_test_failures) fprintf(stderr, "%d check(s) failed\n", fp_test_failures); \
        return fp_test_failures ? 1 : 0;                                             \
    } while (0)

/* Wall-clock seconds (monotonic). */
static inline double fp_test_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
/* Runs a statement and prints its wall-clock time: long tests (the emulated
 * ones take minutes) say in their log where the time goes, the measure to
 * keep CI's run short by. */
#define FP_TEST_TIMED(stmt)                                                      \
    do {                                                                         \
        const double t0_ = fp_test_seconds();                                    \
        stmt;                                                                    \
        printf("[time] %7.1f s  %s\n", fp_test_seconds() - t0_, #stmt);          \
        fflush(stdout);                                                          \
    } while (0)

/* 1 when FP_TEST_QUICK is set (scripts/gpu-check.sh sets it for the runs
 * under compute-sanitizer, which are 10-100x slower): tests shrink sizes. */
static inline int fp_test_quick(void) {
    const char *q = getenv("FP_TEST_QUICK");
    return q && *q && *q != '0';
}

/* 1 in a `gpu` test built against the CPU emulation of the GPU (tests/emu:
 * fastpath_emu, label emu): the CUDA paths run for real but kernels run some
 * 1e5 times slower, so tests shrink big shapes and skip performance checks
 * (what a GPU run measures). */
#ifdef FP_CUDA_EMU
#define FP_TEST_EMULATED 1
#else
#define FP_TEST_EMULATED 0
#endif

/* 1 when a GPU test's timings mean something: not on the CPU emulation, and
 * not under compute-sanitizer (scripts/gpu-check.sh sets FP_TEST_QUICK there:
 * instrumented kernels run 10-100x slower, seen on an H200: a copy kernel at
 * 1.6% of peak under memcheck). Performance checks are skipped otherwise. */
static inline int fp_test_timing_meaningful(void) { return !FP_TEST_EMULATED && !fp_test_quick(); }

/* 1 under compute-sanitizer (scripts/gpu-check.sh sets FP_TEST_SANITIZER=1
 * there): it takes device memory of its own (free memory fell by 860 MB in
 * a run on an H100) and slows host teardown of NCCL (an aborted init took
 * 15 s), so checks of free memory and of wall-clock bounds are skipped. */
static inline int fp_test_sanitized(void) {
    const char *e = getenv("FP_TEST_SANITIZER");
    return e && *e && *e != '0';
}

/* Returns a CUDA context on device 0, or exits 77 when there is no GPU. */
static inline fp_context *fp_test_cuda_context_or_skip(void) {
    int n = 0;
    fp_device_count(&n);
    if (n == 0) {
        printf("SKIP: no CUDA device\n");
        exit(FP_SKIP_CODE);
    }
    fp_context *ctx = NULL;
    if (fp_context_create(FP_DEVICE_CUDA, 0, &ctx) != FP_OK) {
        fprintf(stderr, "cannot create CUDA context: %s\n", fp_last_error());
        exit(1);
    }
    return ctx;
}

/* xorshift64*: deterministic per seed, fast. */
static inline uint64_t fp_test_rand_u64(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}
/* Uniform in [lo, hi). */
static inline double fp_test_rand_uniform(uint64_t *state, double lo, double hi) {
    return lo + (hi - lo) * ((double)(fp_test_rand_u64(state) >> 11) * (1.0 / 9007199254740992.0));
}
/* Fills n floats uniform in [lo, hi), never exactly zero. */
static inline void fp_test_fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t i = 0; i < n; ++i) {
        float v = (float)fp_test_rand_uniform(&s, lo, hi);
        x[i] = v == 0.0f ? 1e-3f : v;
    }
}

#endif /* FP_TEST_H */
