/* Shared pieces of the structured API fuzz tests (tests/fuzz): seeded
 * random numbers, guarded buffers, and the checks every call gets.
 *
 * The promise checked: bad input always gets a clear status and message,
 * never a crash, a hang or a partial write, and nothing a caller hands the
 * library is lost or changed. Concretely, after every call:
 *   - the status is one of fp_status's values;
 *   - on an error, fp_last_error() is non-empty, and names the argument the
 *     fuzzer broke when it broke exactly one;
 *   - on an error, every output buffer is byte-for-byte what it was;
 *   - inputs are never modified, and the guard bytes around every buffer
 *     (outputs included) are intact, success or not.
 * Only the public headers are used, so the harness applies unchanged to a
 * new implementation behind them.
 *
 * Every test takes an optional seed (argv[1], default fixed) and an
 * iteration budget (argv[2]); FP_FUZZ_SECONDS caps the wall time (default a
 * few seconds) so CI stays bounded. A failure prints the seed and the
 * iteration, which reproduce it. */
#ifndef FP_FUZZ_UTIL_H
#define FP_FUZZ_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastpath/fastpath.h"
#include "fp_test.h"

#if defined(__SANITIZE_ADDRESS__)
/* The options fp_add_asan_test sets, also when a test is run by hand to
 * reproduce a seed: a huge request reaches the library's own out-of-memory
 * path instead of stopping in ASan's malloc. */
const char *__asan_default_options(void);
__attribute__((visibility("default"), used)) const char *__asan_default_options(void) {
    return "halt_on_error=1:detect_leaks=1:allocator_may_return_null=1:protect_shadow_gap=0";
}
#endif

/* ---- run control ---- */

typedef struct fz_run {
    uint64_t seed;
    long iters;      /* iteration budget */
    double deadline; /* monotonic seconds */
    long iter;       /* current iteration, for messages */
} fz_run;

static inline double fz_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline fz_run fz_run_init(int argc, char **argv, uint64_t default_seed, long default_iters,
                                 double default_seconds) {
    fz_run r;
    r.seed = argc > 1 ? strtoull(argv[1], NULL, 0) : default_seed;
    r.iters = argc > 2 ? strtol(argv[2], NULL, 0) : default_iters;
    const char *s = getenv("FP_FUZZ_SECONDS");
    double secs = s && *s ? atof(s) : default_seconds;
    r.deadline = fz_now() + secs;
    r.iter = 0;
    printf("fuzz: seed %llu, up to %ld iterations, %.1f s\n", (unsigned long long)r.seed, r.iters, secs);
    return r;
}

/* 1 while iterations and time are left. */
static inline int fz_more(fz_run *r) {
    if (r->iter >= r->iters) return 0;
    if (fz_now() > r->deadline) return 0;
    return 1;
}

/* ---- random numbers ---- */

static inline uint64_t fz_u64(uint64_t *s) { return fp_test_rand_u64(s); }
/* Uniform integer in [lo, hi]. */
static inline int64_t fz_range(uint64_t *s, int64_t lo, int64_t hi) {
    return lo + (int64_t)(fz_u64(s) % (uint64_t)(hi - lo + 1));
}
/* 1 with probability num/den. */
static inline int fz_chance(uint64_t *s, int num, int den) { return (int)(fz_u64(s) % (uint64_t)den) < num; }
static inline double fz_uniform(uint64_t *s, double lo, double hi) { return fp_test_rand_uniform(s, lo, hi); }

/* ---- dtype helpers (public conversions) ---- */

static inline float fz_load(const void *p, fp_dtype dt, size_t i) {
    if (dt == FP_F16) return fp_f16_to_f32(((const uint16_t *)p)[i]);
    if (dt == FP_BF16) return fp_bf16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}
static inline void fz_store(void *p, fp_dtype dt, size_t i, float v) {
    if (dt == FP_F16) ((uint16_t *)p)[i] = fp_f32_to_f16(v);
    else if (dt == FP_BF16) ((uint16_t *)p)[i] = fp_f32_to_bf16(v);
    else ((float *)p)[i] = v;
}
static inline float fz_round(fp_dtype dt, float v) {
    if (dt == FP_F16) return fp_f16_to_f32(fp_f32_to_f16(v));
    if (dt == FP_BF16) return fp_bf16_to_f32(fp_f32_to_bf16(v));
    return v;
}

/* ---- guarded buffers ---- */

#define FZ_GUARD 64             /* guard bytes each side */
#define FZ_POISON 0xFF          /* outputs: NaN in f32, f16 and bf16 */

typedef struct fz_buf {
    unsigned char *raw;   /* what was allocated */
    unsigned char *data;  /* what the library gets: raw + FZ_GUARD + shift */
    size_t bytes;         /* data bytes */
    size_t shift;         /* data's offset from a 256-byte boundary */
    unsigned char *shadow; /* the data's expected contents */
} fz_buf;

static inline unsigned char fz_guard_byte(size_t i) { return (unsigned char)(0xA5 ^ (i * 29)); }

/* A buffer of `bytes` (0 allowed) whose data starts `shift` bytes after a
 * 256-byte boundary, guarded both sides, contents poisoned. */
static inline fz_buf fz_buf_new(size_t bytes, size_t shift) {
    fz_buf b;
    size_t total = 256 + 256 + bytes + FZ_GUARD; /* leading guard, shift, data, guard */
    b.raw = aligned_alloc(256, (total + 255) & ~(size_t)255);
    b.shadow = malloc(bytes ? bytes : 1);
    if (!b.raw || !b.shadow) {
        fprintf(stderr, "fuzz: out of host memory for %zu bytes\n", bytes);
        exit(1);
    }
    /* data = raw + 256 + shift keeps >= FZ_GUARD bytes of guard before it */
    b.shift = shift % 256;
    b.data = b.raw + 256 + b.shift;
    b.bytes = bytes;
    size_t alloc = (total + 255) & ~(size_t)255;
    for (size_t i = 0; i < alloc; ++i) b.raw[i] = fz_guard_byte(i);
    memset(b.data, FZ_POISON, bytes);
    memcpy(b.shadow, b.data, bytes);
    return b;
}

static inline void fz_buf_free(fz_buf *b) {
    free(b->raw);
    free(b->shadow);
    memset(b, 0, sizeof *b);
}

/* Records the current contents as the expected ones. */
static inline void fz_buf_snapshot(fz_buf *b) {
    if (b->raw) memcpy(b->shadow, b->data, b->bytes);
}

/* 1 if the guard bytes around data are intact (FZ_GUARD each side). */
static inline int fz_buf_guards_ok(const fz_buf *b) {
    size_t lo = (size_t)(b->data - b->raw);
    for (size_t i = lo - FZ_GUARD; i < lo; ++i)
        if (b->raw[i] != fz_guard_byte(i)) return 0;
    for (size_t i = lo + b->bytes; i < lo + b->bytes + FZ_GUARD; ++i)
        if (b->raw[i] != fz_guard_byte(i)) return 0;
    return 1;
}

/* Index of the first byte that differs from the snapshot, or SIZE_MAX. */
static inline size_t fz_buf_first_change(const fz_buf *b) {
    if (b->bytes == 0 || memcmp(b->data, b->shadow, b->bytes) == 0) return SIZE_MAX;
    for (size_t i = 0; i < b->bytes; ++i)
        if (b->data[i] != b->shadow[i]) return i;
    return SIZE_MAX;
}

/* Fills n elements of dtype with values uniform in [lo, hi) (never 0). */
static inline void fz_fill(void *p, fp_dtype dt, size_t n, uint64_t *s, double lo, double hi) {
    for (size_t i = 0; i < n; ++i) {
        float v = (float)fz_uniform(s, lo, hi);
        if (fz_round(dt, v) == 0.0f) v = 0.125f;
        fz_store(p, dt, i, v);
    }
}

/* ---- the checks every call gets ---- */

/* 1 if st is one of fp_status's values. */
static inline int fz_status_known(fp_status st) { return (int)st >= FP_OK && (int)st <= FP_ERR_INTERNAL; }

/* Checks a call's status and message. `want` >= 0: that status expected;
 * -1: any error; -2: any status. `names`: when non-NULL, on error the
 * message must contain it (the argument broken). Returns the status. */
#define FZ_CHECK_CALL(run, what, st, want, names) \
    fz_check_call_at(__FILE__, __LINE__, (run), (what), (st), (want), (names))
static inline fp_status fz_check_call_at(const char *file, int line, const fz_run *run, const char *what,
                                         fp_status st, int want, const char *names) {
    const char *msg = fp_last_error();
    if (!fz_status_known(st)) {
        fprintf(stderr, "%s:%d: seed %llu iter %ld: %s returned %d, not an fp_status\n", file, line,
                (unsigned long long)run->seed, run->iter, what, (int)st);
        fp_test_failures++;
        return st;
    }
    if ((want >= 0 && (int)st != want) || (want == -1 && st == FP_OK)) {
        fprintf(stderr, "%s:%d: seed %llu iter %ld: %s returned '%s', expected %s (detail: %s)\n", file,
                line, (unsigned long long)run->seed, run->iter, what, fp_status_string(st),
                want >= 0 ? fp_status_string((fp_status)want) : "an error", msg);
        fp_test_failures++;
        return st;
    }
    if (st != FP_OK) {
        if (!msg || !*msg) {
            fprintf(stderr, "%s:%d: seed %llu iter %ld: %s returned '%s' with an empty message\n", file,
                    line, (unsigned long long)run->seed, run->iter, what, fp_status_string(st));
            fp_test_failures++;
        } else if (names && !strstr(msg, names)) {
            fprintf(stderr, "%s:%d: seed %llu iter %ld: %s: the message does not name '%s': %s\n", file,
                    line, (unsigned long long)run->seed, run->iter, what, names, msg);
            fp_test_failures++;
        }
    }
    return st;
}

/* Checks that a buffer's guards are intact and, when `unchanged`, that its
 * data equals the snapshot. */
#define FZ_CHECK_BUF(run, what, b, unchanged) \
    fz_check_buf_at(__FILE__, __LINE__, (run), (what), (b), (unchanged))
static inline void fz_check_buf_at(const char *file, int line, const fz_run *run, const char *what,
                                   const fz_buf *b, int unchanged) {
    if (!b->raw) return;
    if (!fz_buf_guards_ok(b)) {
        fprintf(stderr, "%s:%d: seed %llu iter %ld: %s: guard bytes around the buffer were written\n",
                file, line, (unsigned long long)run->seed, run->iter, what);
        fp_test_failures++;
    }
    if (unchanged) {
        size_t i = fz_buf_first_change(b);
        if (i != SIZE_MAX) {
            fprintf(stderr, "%s:%d: seed %llu iter %ld: %s: byte %zu of %zu changed (0x%02x -> 0x%02x)\n",
                    file, line, (unsigned long long)run->seed, run->iter, what, i, b->bytes,
                    b->shadow[i], b->data[i]);
            fp_test_failures++;
        }
    }
}

/* Known bugs outside the fuzzer's reach to fix (another capability's
 * code), each reported with its reproducer: the check that finds it is
 * relaxed and the issue printed once, unless FP_FUZZ_STRICT=1, which makes it
 * a failure again. Remove an entry when its fix lands. */
static inline int fz_known_issue(const char *id, const char *what) {
    const char *strict = getenv("FP_FUZZ_STRICT");
    if (strict && *strict && *strict != '0') return 0;
    static const char *seen[32];
    static int n_seen;
    for (int i = 0; i < n_seen; ++i)
        if (strcmp(seen[i], id) == 0) return 1;
    if (n_seen < 32) seen[n_seen++] = id;
    printf("KNOWN ISSUE %s (not counted; FP_FUZZ_STRICT=1 counts it): %s\n", id, what);
    return 1;
}

/* Stops a test after this many failures: one bug tends to repeat. */
static inline int fz_too_many_failures(void) { return fp_test_failures >= 20; }

#endif /* FP_FUZZ_UTIL_H */
