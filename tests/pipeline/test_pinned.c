/* Pinned pools (pinned.h) on a CPU context (host mode: a pin is the first
 * touch of a range's pages, under the same process-wide pin lock): blocks at
 * their real size, reuse, one pin call per segment, the budget (refusal,
 * its message through the allocator, cache released and retried, nothing
 * left behind), registration and its errors, the background reserve
 * (target, budget stop, timeout, destroy while it runs), statistics, a
 * small multi-threaded stress, and the timing target: while a reserve pins
 * in chunks, a thread whose allocations miss the cache waits for the pin
 * lock at most about one chunk's pin.
 * Built twice: normally and with ThreadSanitizer (FP_TSAN_BUILD: the pool,
 * the allocator and core's status code only, smaller sizes, no timing
 * assertion). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc/alloc_internal.h"
#include "fastpath/pinned.h"
#include "fp_test.h"

#define MiB ((size_t)1 << 20)

#ifdef FP_TSAN_BUILD
/* The TSan build links no context code and no CUDA: tsan_stand_ins.c. */
#define WAIT_RESERVE (128 * MiB)
#define FP_TEST_TSAN 1
#else
#define WAIT_RESERVE (512 * MiB)
#define FP_TEST_TSAN 0
#endif

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static fp_pinned_stats pstats(fp_pinned_pool *p) {
    fp_pinned_stats s;
    fp_pinned_stats_init(&s);
    CHECK_OK(fp_pinned_pool_get_stats(p, &s));
    return s;
}

static fp_alloc_stats astats(fp_allocator *a) {
    fp_alloc_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK_OK(fp_alloc_get_stats(a, &s));
    return s;
}

static fp_pinned_pool *make_pool(fp_context *ctx, size_t chunk, size_t budget) {
    fp_pinned_config cfg;
    CHECK_OK(fp_pinned_config_default(&cfg));
    cfg.chunk_bytes = chunk;
    cfg.budget_bytes = budget;
    fp_pinned_pool *p = NULL;
    CHECK_OK(fp_pinned_pool_create(ctx, &cfg, &p));
    if (!p) exit(1);
    return p;
}

static int contains(const char *hay, const char *needle) { return hay && strstr(hay, needle) != NULL; }

static void test_config(fp_context *ctx) {
    fp_pinned_config cfg;
    CHECK_OK(fp_pinned_config_default(&cfg));
    CHECK(cfg.struct_size == sizeof cfg && cfg.chunk_bytes == FP_PINNED_DEFAULT_CHUNK && cfg.budget_bytes == 0 &&
          cfg.alloc_config == NULL);
    CHECK_STATUS(fp_pinned_config_default_sized(&cfg, sizeof cfg + 8), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pinned_config_default_sized(NULL, sizeof cfg), FP_ERR_INVALID_ARGUMENT);
    fp_pinned_pool *p = (fp_pinned_pool *)0x1;
    CHECK_STATUS(fp_pinned_pool_create(NULL, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pinned_pool_create(ctx, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    cfg.struct_size = 4;
    CHECK_STATUS(fp_pinned_pool_create(ctx, &cfg, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(p == (fp_pinned_pool *)0x1);
    /* A bad allocator config is the allocator's error. */
    fp_alloc_config ac;
    fp_alloc_config_default(&ac);
    ac.memory_fraction = 2.0;
    fp_pinned_config_default(&cfg);
    cfg.alloc_config = &ac;
    CHECK_STATUS(fp_pinned_pool_create(ctx, &cfg, &p), FP_ERR_INVALID_ARGUMENT);

    /* Defaults; chunk rounded up to the page. */
    CHECK_OK(fp_pinned_pool_create(ctx, NULL, &p));
    fp_pinned_stats s = pstats(p);
    CHECK(s.host_mode == 1 && s.chunk_bytes == FP_PINNED_DEFAULT_CHUNK && s.budget_bytes == 0 && s.bytes_pinned == 0);
    CHECK(fp_pinned_pool_reserve_segment(p) == FP_PINNED_DEFAULT_CHUNK);
    CHECK(fp_pinned_pool_allocator(p) != NULL && fp_pinned_pool_allocator(NULL) == NULL);
    fp_pinned_pool_destroy(p);
    p = make_pool(ctx, 16 * MiB + 1, 0);
    s = pstats(p);
    CHECK(s.chunk_bytes > 16 * MiB && s.chunk_bytes <= 16 * MiB + 65536 && s.chunk_bytes % 4096 == 0);
    CHECK(fp_pinned_pool_reserve_segment(p) == 16 * MiB);
    fp_pinned_pool_destroy(p);
    /* A small chunk: reserve segments of FP_ALLOC_MIN_LARGE_ALLOC. */
    p = make_pool(ctx, 3 * MiB, 0);
    CHECK(fp_pinned_pool_reserve_segment(p) == FP_ALLOC_MIN_LARGE_ALLOC);
    fp_pinned_pool_destroy(p);
    fp_pinned_pool_destroy(NULL);

    /* Statistics struct sizes. */
    fp_pinned_stats st;
    CHECK_STATUS(fp_pinned_stats_init_sized(&st, sizeof st + 8), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pinned_pool_get_stats(NULL, &st), FP_ERR_INVALID_ARGUMENT);
}

/* A 129.5 MiB block reserves 130 MiB (2 MiB rounding, never a power of
 * two: 256 MiB), pinned in one call (a block is one registration) although
 * it is larger than the chunk; freed, it comes back
 * from the cache without a pin. */
static void test_real_size_and_reuse(fp_context *ctx) {
    fp_pinned_pool *p = make_pool(ctx, 16 * MiB, 0);
    fp_allocator *a = fp_pinned_pool_allocator(p);
    const size_t req = 129 * MiB + MiB / 2;
    unsigned char *b = NULL;
    CHECK_OK(fp_alloc_alloc(a, req, NULL, (void **)&b));
    CHECK(b != NULL && ((uintptr_t)b % FP_ALLOC_ALIGN) == 0);
    if (!b) return;
    memset(b, 0x5A, req); /* usable end to end */
    fp_alloc_stats as = astats(a);
    CHECK_MSG((size_t)as.reserved_bytes.current < 132 * MiB, "reserved %lld bytes for a %zu-byte request",
              (long long)as.reserved_bytes.current, req);
    fp_pinned_stats s = pstats(p);
    CHECK(s.segment_bytes == 130 * MiB && s.bytes_pinned == 130 * MiB && s.segments == 1);
    CHECK_MSG(s.pin_calls == 1, "pin calls %llu (130 MiB in one call)", (unsigned long long)s.pin_calls);
    CHECK(s.pinned_bytes_total == 130 * MiB && s.pin_ms > 0 && s.pin_gbps > 0 && s.longest_pin_call_ms > 0 &&
          s.longest_pin_call_ms <= s.pin_ms);
    CHECK(s.peak_bytes_pinned == 130 * MiB && s.unpin_calls == 0 && s.touch_ms == 0); /* host mode: no pre-touch */

    /* Reuse: the same block back, no pin. */
    CHECK_OK(fp_alloc_record_stream(a, b, NULL));
    CHECK_OK(fp_alloc_free(a, b));
    void *again = NULL;
    CHECK_OK(fp_alloc_alloc(a, req, NULL, &again));
    CHECK(again == b);
    CHECK(pstats(p).pin_calls == 1);
    /* A smaller block is split from the cached segment: no pin either. */
    CHECK_OK(fp_alloc_free(a, again));
    void *small = NULL, *tiny = NULL;
    CHECK_OK(fp_alloc_alloc(a, 40 * MiB, NULL, &small));
    CHECK_OK(fp_alloc_alloc(a, 1000, NULL, &tiny)); /* the small pool: a 2 MiB segment */
    s = pstats(p);
    CHECK(s.pin_calls == 2 && s.segment_bytes == 132 * MiB && s.segments == 2);
    CHECK_OK(fp_alloc_check_invariants(a));
    CHECK_OK(fp_alloc_free(a, small));
    CHECK_OK(fp_alloc_free(a, tiny));
    CHECK_OK(fp_alloc_empty_cache(a));
    s = pstats(p);
    CHECK(s.bytes_pinned == 0 && s.segment_bytes == 0 && s.segments == 0 && s.peak_bytes_pinned == 132 * MiB);
    CHECK_OK(fp_pinned_pool_reset_stats(p));
    s = pstats(p);
    CHECK(s.pin_calls == 0 && s.pin_ms == 0 && s.longest_pin_call_ms == 0 && s.peak_bytes_pinned == 0);
    fp_pinned_pool_destroy(p);
}

static void test_budget(fp_context *ctx) {
    fp_pinned_pool *p = make_pool(ctx, 16 * MiB, 64 * MiB);
    fp_allocator *a = fp_pinned_pool_allocator(p);
    void *b1 = NULL, *b2 = (void *)0x1;
    CHECK_OK(fp_alloc_alloc(a, 40 * MiB, NULL, &b1));
    /* 40 + 40 > 64: refused by the budget, the allocator's message ends with
     * the budget's (pinned bytes, request, budget). */
    CHECK_STATUS(fp_alloc_alloc(a, 40 * MiB, NULL, &b2), FP_ERR_OUT_OF_MEMORY);
    CHECK(b2 == (void *)0x1);
    const char *msg = fp_last_error();
    CHECK_MSG(contains(msg, "caching allocator out of memory") && contains(msg, "pinned pool budget") &&
                  contains(msg, "41943040 bytes pinned") && contains(msg, "a segment of 41943040 bytes") &&
                  contains(msg, "budget of 67108864 bytes"),
              "message: %s", msg);
    fp_pinned_stats s = pstats(p);
    CHECK(s.bytes_pinned == 40 * MiB && s.budget_refusals >= 1 && s.budget_bytes == 64 * MiB);
    /* Freed, the 40 MiB stays cached (pinned); a 50 MiB request is refused
     * by the budget, the allocator releases the cache and retries. */
    CHECK_OK(fp_alloc_free(a, b1));
    CHECK(pstats(p).bytes_pinned == 40 * MiB);
    const uint64_t refusals = pstats(p).budget_refusals;
    void *b3 = NULL;
    CHECK_OK(fp_alloc_alloc(a, 50 * MiB, NULL, &b3));
    s = pstats(p);
    CHECK(s.bytes_pinned == 50 * MiB && s.budget_refusals == refusals + 1 && s.peak_bytes_pinned == 50 * MiB);
    CHECK(astats(a).retries >= 1);
    /* A registration over the budget pins nothing and leaves no entry. */
    const size_t ubytes = 20 * MiB;
    char *user = aligned_alloc(4096, ubytes);
    CHECK(user != NULL);
    CHECK_STATUS(fp_pinned_register(p, user, ubytes), FP_ERR_OUT_OF_MEMORY);
    CHECK_MSG(contains(fp_last_error(), "a registration of 20971520 bytes would exceed the budget of 67108864"),
              "message: %s", fp_last_error());
    s = pstats(p);
    CHECK(s.bytes_pinned == 50 * MiB && s.registered_bytes == 0 && s.register_calls == 0);
    CHECK_OK(fp_alloc_free(a, b3));
    CHECK_OK(fp_alloc_empty_cache(a));
    CHECK_OK(fp_pinned_register(p, user, ubytes)); /* it now fits: no stale entry refuses it */
    CHECK_OK(fp_pinned_unregister(p, user));
    CHECK(pstats(p).bytes_pinned == 0);
    fp_pinned_pool_destroy(p);
    free(user);
}

static void test_register(fp_context *ctx) {
    fp_pinned_pool *p = make_pool(ctx, 4 * MiB, 0), *q = make_pool(ctx, 4 * MiB, 0);
    const size_t n = 10 * MiB + 123;
    char *mem = malloc(n + 4 * MiB);
    CHECK(mem != NULL);
    if (!mem) return;
    for (size_t i = 0; i < n; ++i) mem[i] = (char)(i * 7);
    char *base = mem + 100; /* not page-aligned */

    CHECK_STATUS(fp_pinned_register(NULL, base, n), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pinned_register(p, NULL, n), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pinned_register(p, base, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pinned_register(p, (void *)(UINTPTR_MAX - 10), 100), FP_ERR_INVALID_ARGUMENT);

    CHECK_OK(fp_pinned_register(p, base, n));
    fp_pinned_stats s = pstats(p);
    CHECK(s.registered_bytes == n && s.bytes_pinned == n && s.register_calls == 1 && s.register_ms > 0);
    CHECK_MSG(s.pin_calls == 1, "pin calls %llu (10 MiB in one call, chunk 4 MiB)", (unsigned long long)s.pin_calls);
    CHECK(s.pinned_bytes_total == n);
    /* The touch kept the data. */
    size_t bad = 0;
    for (size_t i = 0; i < n; i += 997) bad += mem[i] != (char)(i * 7);
    CHECK(bad == 0);

    CHECK_STATUS(fp_pinned_register(p, base, n), FP_ERR_INVALID_ARGUMENT);
    CHECK_MSG(contains(fp_last_error(), "already registered with this pool"), "message: %s", fp_last_error());
    CHECK_STATUS(fp_pinned_register(p, base + n - 1, 4096), FP_ERR_INVALID_ARGUMENT);
    CHECK_MSG(contains(fp_last_error(), "overlaps") && contains(fp_last_error(), "this pool"), "message: %s",
              fp_last_error());
    CHECK_STATUS(fp_pinned_register(q, base - 50, 100), FP_ERR_INVALID_ARGUMENT); /* any pool of the process */
    CHECK_MSG(contains(fp_last_error(), "another pool"), "message: %s", fp_last_error());
    CHECK(pstats(q).bytes_pinned == 0 && pstats(p).register_calls == 1);
    /* Adjacent is fine. */
    CHECK_OK(fp_pinned_register(q, base + n, 4096));

    CHECK_STATUS(fp_pinned_unregister(p, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pinned_unregister(p, mem), FP_ERR_NOT_FOUND);
    CHECK_MSG(contains(fp_last_error(), "is not registered"), "message: %s", fp_last_error());
    CHECK_STATUS(fp_pinned_unregister(p, base + 5), FP_ERR_NOT_FOUND);
    CHECK_MSG(contains(fp_last_error(), "lies inside"), "message: %s", fp_last_error());
    CHECK_STATUS(fp_pinned_unregister(q, base), FP_ERR_INVALID_ARGUMENT);
    CHECK_MSG(contains(fp_last_error(), "another pool"), "message: %s", fp_last_error());
    CHECK_OK(fp_pinned_unregister(p, base));
    CHECK_STATUS(fp_pinned_unregister(p, base), FP_ERR_NOT_FOUND);
    s = pstats(p);
    CHECK(s.registered_bytes == 0 && s.bytes_pinned == 0 && s.register_calls == 1);
    /* Registered again after the unregister. */
    CHECK_OK(fp_pinned_register(p, base, n));
    /* Destroy unregisters what is left: the range can be registered again. */
    fp_pinned_pool_destroy(p);
    fp_pinned_pool_destroy(q);
    p = make_pool(ctx, 4 * MiB, 0);
    CHECK_OK(fp_pinned_register(p, base, n + 4096));
    CHECK_OK(fp_pinned_unregister(p, base));
    fp_pinned_pool_destroy(p);
    free(mem);
}

static void test_reserve(fp_context *ctx) {
    fp_pinned_pool *p = make_pool(ctx, 16 * MiB, 0);
    fp_allocator *a = fp_pinned_pool_allocator(p);
    CHECK_STATUS(fp_pinned_pool_reserve(NULL, 1), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_pinned_pool_reserve(p, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_pinned_pool_reserve_wait(p, 0)); /* none ran */
    CHECK_OK(fp_pinned_pool_reserve(p, 60 * MiB)); /* rounded up to 4 segments of 16 MiB */
    CHECK_OK(fp_pinned_pool_reserve_wait(p, -1));
    fp_pinned_stats s = pstats(p);
    CHECK(!s.reserve_running && s.reserve_target_bytes == 64 * MiB && s.reserve_done_bytes == 64 * MiB);
    CHECK(s.segments == 4 && s.segment_bytes == 64 * MiB && s.bytes_pinned == 64 * MiB && s.pin_calls == 4);
    CHECK(s.max_pin_lock_wait_ms == 0); /* only the reserve pinned: no foreground wait */
    fp_alloc_stats as = astats(a);
    CHECK(as.allocated_bytes.current == 0 && as.reserved_bytes.current == (int64_t)(64 * MiB));
    /* The reserve's segments serve later allocations on stream NULL. */
    void *b[4];
    for (int i = 0; i < 4; ++i) CHECK_OK(fp_alloc_alloc(a, 12 * MiB, NULL, &b[i]));
    CHECK(pstats(p).pin_calls == 4);
    for (int i = 0; i < 4; ++i) CHECK_OK(fp_alloc_free(a, b[i]));
    /* A second reserve counts the cached segments first. */
    CHECK_OK(fp_pinned_pool_reserve(p, 64 * MiB));
    CHECK_OK(fp_pinned_pool_reserve_wait(p, 10000));
    CHECK(pstats(p).segment_bytes == 64 * MiB);
    CHECK_OK(fp_alloc_check_invariants(a));
    fp_pinned_pool_destroy(p);

    /* Stopped by the budget: keeps what it pinned, says why. */
    p = make_pool(ctx, 16 * MiB, 40 * MiB);
    CHECK_OK(fp_pinned_pool_reserve(p, 64 * MiB));
    CHECK_STATUS(fp_pinned_pool_reserve_wait(p, -1), FP_ERR_OUT_OF_MEMORY);
    CHECK_MSG(contains(fp_last_error(), "reserve stopped after 33554432 of 67108864 bytes") &&
                  contains(fp_last_error(), "pinned pool budget"),
              "message: %s", fp_last_error());
    s = pstats(p);
    CHECK(s.bytes_pinned == 32 * MiB && s.segment_bytes == 32 * MiB && s.budget_refusals == 1);
    /* The status stays until the next reserve. */
    CHECK_STATUS(fp_pinned_pool_reserve_wait(p, 0), FP_ERR_OUT_OF_MEMORY);
    fp_pinned_pool_destroy(p);

    /* Timeout while running; a second call adds to the target; destroy
     * with a reserve running returns promptly (cancelled after a segment). */
    p = make_pool(ctx, 16 * MiB, 0);
    CHECK_OK(fp_pinned_pool_reserve(p, 256 * MiB));
    CHECK_OK(fp_pinned_pool_reserve(p, 16 * MiB));
    CHECK_STATUS(fp_pinned_pool_reserve_wait(p, 0), FP_ERR_TIMEOUT);
    CHECK_OK(fp_pinned_pool_reserve_wait(p, -1));
    s = pstats(p);
    CHECK_MSG(s.reserve_done_bytes == 272 * MiB && s.reserve_target_bytes == 272 * MiB, "done %zu target %zu",
              s.reserve_done_bytes, s.reserve_target_bytes);
    fp_pinned_pool_destroy(p);
    p = make_pool(ctx, 16 * MiB, 0);
    CHECK_OK(fp_pinned_pool_reserve(p, (size_t)4 << 30));
    const double t0 = now_ms();
    while (pstats(p).reserve_done_bytes == 0 && now_ms() - t0 < 5000) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    const double t1 = now_ms();
    fp_pinned_pool_destroy(p);
    const double destroy_ms = now_ms() - t1;
    CHECK_MSG(destroy_ms < 2000, "destroy with a 4 GiB reserve running took %.1f ms", destroy_ms);
}

/* ---- the timing target ---- */

typedef struct fg_arg {
    fp_pinned_pool *p;
    size_t bytes;
    int max_blocks;
    void *blocks[64];
    int n, during;       /* allocations, and those made while the reserve ran */
    double max_alloc_ms; /* longest fp_alloc_alloc (its own pin included) */
    fp_status st;
} fg_arg;

static void *fg_main(void *arg) {
    fg_arg *f = arg;
    fp_allocator *a = fp_pinned_pool_allocator(f->p);
    while (f->n < f->max_blocks && pstats(f->p).reserve_running) {
        const double t0 = now_ms();
        f->st = fp_alloc_alloc(a, f->bytes, NULL, &f->blocks[f->n]);
        const double ms = now_ms() - t0;
        if (f->st != FP_OK) break;
        f->n++;
        if (pstats(f->p).reserve_running) f->during++;
        if (ms > f->max_alloc_ms) f->max_alloc_ms = ms;
        struct timespec ts = {0, 500000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_wait_bound(fp_context *ctx) {
    const size_t chunk = 16 * MiB, reserve = WAIT_RESERVE;
    fp_pinned_pool *p = make_pool(ctx, chunk, 0);
    fg_arg f;
    memset(&f, 0, sizeof f);
    f.p = p;
    f.bytes = 12 * MiB; /* its own 12 MiB segment each time: every one a miss and a pin */
    f.max_blocks = 40;
    const double t0 = now_ms();
    CHECK_OK(fp_pinned_pool_reserve(p, reserve));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, fg_main, &f) == 0);
    pthread_join(th, NULL);
    CHECK_OK(fp_pinned_pool_reserve_wait(p, -1));
    const double wall = now_ms() - t0;
    CHECK_OK(f.st);
    fp_pinned_stats s = pstats(p);
    printf("wait bound (host mode): reserve %zu MiB in %zu MiB chunks, %.1f ms; foreground %d allocations of %zu "
           "MiB (%d during the reserve), %llu found the pin lock taken; longest pin call %.2f ms, max foreground "
           "wait %.2f ms (ratio %.2f), longest foreground alloc %.2f ms, pin rate %.2f GB/s\n",
           reserve >> 20, chunk >> 20, wall, f.n, f.bytes >> 20, f.during,
           (unsigned long long)s.pin_lock_contended, s.longest_pin_call_ms, s.max_pin_lock_wait_ms,
           s.longest_pin_call_ms > 0 ? s.max_pin_lock_wait_ms / s.longest_pin_call_ms : 0.0, f.max_alloc_ms,
           s.pin_gbps);
    /* One pin per reserve segment and per foreground block (the last
     * foreground allocation may have come after the reserve ended, from its
     * cache). */
    CHECK(s.reserve_done_bytes == reserve && s.pin_calls >= reserve / chunk &&
          s.pin_calls <= reserve / chunk + (uint64_t)f.n);
    if (!FP_TEST_TSAN) CHECK_MSG(f.during >= 3, "only %d foreground allocations overlapped the reserve", f.during);
    /* One chunk's pin, twice for a loaded 2-core machine, plus scheduling
     * slack (a woken waiter needs a core). */
    const double bound = 2.0 * s.longest_pin_call_ms + 5.0;
    if (!FP_TEST_TSAN)
        CHECK_MSG(s.max_pin_lock_wait_ms <= bound, "foreground waited %.2f ms for the pin lock (bound %.2f ms)",
                  s.max_pin_lock_wait_ms, bound);
    fp_allocator *a = fp_pinned_pool_allocator(p);
    for (int i = 0; i < f.n; ++i) CHECK_OK(fp_alloc_free(a, f.blocks[i]));
    CHECK_OK(fp_alloc_check_invariants(a));
    fp_pinned_pool_destroy(p);
}

/* ---- stress: threads allocating, freeing and registering under a budget ---- */

typedef struct stress_arg {
    fp_pinned_pool *p;
    unsigned seed;
    int ooms;
    int errors;
} stress_arg;

static void *stress_main(void *arg) {
    stress_arg *t = arg;
    fp_allocator *a = fp_pinned_pool_allocator(t->p);
    void *live[8] = {0};
    char *user = aligned_alloc(4096, 3 * MiB);
    for (int it = 0; it < 200; ++it) {
        t->seed = t->seed * 1103515245u + 12345u;
        const int k = (int)((t->seed >> 16) % 8);
        if (live[k]) {
            if (fp_alloc_free(a, live[k]) != FP_OK) t->errors++;
            live[k] = NULL;
        } else {
            const size_t sz = ((size_t)(t->seed >> 8) % (12 * MiB)) + 1;
            fp_status st = fp_alloc_alloc(a, sz, NULL, &live[k]);
            if (st == FP_ERR_OUT_OF_MEMORY) t->ooms++;
            else if (st != FP_OK) t->errors++;
        }
        if (user && it % 25 == 0) {
            fp_status st = fp_pinned_register(t->p, user, 3 * MiB);
            if (st == FP_OK) {
                if (fp_pinned_unregister(t->p, user) != FP_OK) t->errors++;
            } else if (st != FP_ERR_OUT_OF_MEMORY) {
                t->errors++;
            }
        }
    }
    for (int k = 0; k < 8; ++k)
        if (live[k] && fp_alloc_free(a, live[k]) != FP_OK) t->errors++;
    free(user);
    return NULL;
}

static void test_stress(fp_context *ctx) {
    fp_pinned_pool *p = make_pool(ctx, 8 * MiB, 160 * MiB);
    CHECK_OK(fp_pinned_pool_reserve(p, 64 * MiB));
    stress_arg t[4];
    pthread_t th[4];
    for (int i = 0; i < 4; ++i) {
        t[i] = (stress_arg){p, (unsigned)(i * 7919 + 1), 0, 0};
        CHECK(pthread_create(&th[i], NULL, stress_main, &t[i]) == 0);
    }
    for (int i = 0; i < 4; ++i) {
        pthread_join(th[i], NULL);
        CHECK_MSG(t[i].errors == 0, "thread %d: %d errors", i, t[i].errors);
    }
    fp_status rst = fp_pinned_pool_reserve_wait(p, -1);
    CHECK(rst == FP_OK || rst == FP_ERR_OUT_OF_MEMORY);
    fp_pinned_stats s = pstats(p);
    CHECK(s.bytes_pinned == s.segment_bytes + s.registered_bytes && s.registered_bytes == 0);
    CHECK(s.peak_bytes_pinned <= 160 * MiB);
    fp_allocator *a = fp_pinned_pool_allocator(p);
    CHECK(astats(a).allocated_bytes.current == 0);
    CHECK_OK(fp_alloc_check_invariants(a));
    CHECK_OK(fp_alloc_empty_cache(a));
    CHECK(pstats(p).bytes_pinned == 0);
    fp_pinned_pool_destroy(p);
}

int main(void) {
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    if (!ctx) return 1;
    test_config(ctx);
    test_real_size_and_reuse(ctx);
    test_budget(ctx);
    test_register(ctx);
    test_reserve(ctx);
    test_wait_bound(ctx);
    test_stress(ctx);
    fp_context_destroy(ctx);
    TEST_END();
}
