/* The CPU worker pool (src/core/thread_pool.c): every index of every call
 * visited exactly once, whatever the mix of call sizes, grains, concurrent
 * callers and worker states (spinning, asleep, waking late into a job the
 * caller already finished), and destroy in each of those states. Built twice:
 * plainly and under ThreadSanitizer (test_thread_pool_tsan). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp_test.h"
#include "internal.h"

typedef struct job {
    int *hits;
    unsigned delay_every; /* 0: none; else sleep ~20 us on every k-th item */
} job;

static void mark(void *arg, size_t b, size_t e) {
    job *j = arg;
    for (size_t i = b; i < e; ++i) {
        __atomic_fetch_add(&j->hits[i], 1, __ATOMIC_RELAXED);
        if (j->delay_every && i % j->delay_every == 0) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* One call of n items; returns the number of items not visited once. */
static int one_call(fp_thread_pool *pool, int *hits, size_t n, size_t grain, unsigned delay_every) {
    memset(hits, 0, n * sizeof *hits);
    job j = {hits, delay_every};
    fp_parallel_for(pool, n, grain, mark, &j);
    int bad = 0;
    for (size_t i = 0; i < n; ++i) bad += hits[i] != 1;
    return bad;
}

enum { MAXN = 5000 };

static void random_calls(fp_thread_pool *pool, uint64_t seed, int calls) {
    int *hits = malloc(MAXN * sizeof *hits);
    CHECK(hits != NULL);
    uint64_t s = seed;
    for (int c = 0; c < calls; ++c) {
        size_t n = (size_t)(next_rand(&s) % MAXN) + 1;
        size_t grain = (size_t)(next_rand(&s) % 300); /* 0 means 1 */
        unsigned delay = next_rand(&s) % 8 == 0 ? 997u : 0u;
        if (c % 5 == 0) { /* let the workers fall asleep between calls */
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
        int bad = one_call(pool, hits, n, grain, delay);
        CHECK_MSG(bad == 0, "seed %llu call %d (n %zu grain %zu): %d items not visited exactly once",
                  (unsigned long long)seed, c, n, grain, bad);
    }
    free(hits);
}

typedef struct caller_arg {
    fp_thread_pool *pool;
    uint64_t seed;
} caller_arg;

static void *caller_main(void *arg) {
    caller_arg *a = arg;
    random_calls(a->pool, a->seed, 150);
    return NULL;
}

int main(void) {
    for (int threads = 1; threads <= 4; ++threads) {
        fp_thread_pool *pool = NULL;
        CHECK_OK(fp_thread_pool_create(threads, &pool));
        CHECK(fp_thread_pool_size(pool) == threads);
        random_calls(pool, 0x9E3779B97F4A7C15ULL + (uint64_t)threads, 300);

        /* Tiny jobs back to back: the caller usually finishes before a
         * worker wakes, so late workers must find the job closed. */
        int hits[4];
        for (int c = 0; c < 2000; ++c)
            CHECK_MSG(one_call(pool, hits, 2 + (size_t)(c % 3), 1, 0) == 0, "tiny call %d", c);

        /* Three callers at once (calls are serialized inside). */
        pthread_t th[3];
        caller_arg ca[3];
        for (int t = 0; t < 3; ++t) {
            ca[t].pool = pool;
            ca[t].seed = 1000u + (uint64_t)(threads * 3 + t);
            CHECK(pthread_create(&th[t], NULL, caller_main, &ca[t]) == 0);
        }
        for (int t = 0; t < 3; ++t) pthread_join(th[t], NULL);

        /* Destroy right after a call, with the workers still spinning. */
        CHECK(one_call(pool, hits, 4, 1, 0) == 0);
        fp_thread_pool_destroy(pool);
    }
    /* Destroy with the workers asleep, and with no call ever made. */
    fp_thread_pool *pool = NULL;
    CHECK_OK(fp_thread_pool_create(3, &pool));
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    fp_thread_pool_destroy(pool);
    fp_thread_pool_destroy(NULL);
    TEST_END();
}
