/* pipeline/pin_wait: how long a thread that needs pinned memory waits while
 * a pinned pool (pinned.h) pins memory ahead in the background.
 *
 *   A pool reserves --reserve_mib (default 1024 on CUDA, 256 on a CPU
 *   context; --quick: 256 / 128) on its background thread while a
 *   foreground thread allocates fresh blocks of --fg_mib (default 12: each
 *   its own segment) until the reserve is done, freeing each and emptying
 *   the cache after it, so that every allocation misses and pins (the
 *   reserve's blocks are allocated until it ends: they stay). Two rows, told apart by their params:
 *     mode=chunked  the pool pins in chunks of --chunk_mib (default 64 on
 *                   CUDA, 16 on a CPU context): the foreground waits for at
 *                   most one chunk's pin
 *     mode=whole    one pin call for the whole reserve (chunk = reserve):
 *                   what a naive cudaHostAlloc of that size does; the
 *                   foreground waits for all of it
 *   and upstream=pinned (CUDA context: cudaHostRegister) or upstream=host
 *   (CPU context: a pin is the first touch of the pages, pinned.h's host
 *   mode), reserve_mib, chunk_mib.
 *
 * Metrics: max_wait_ms (the longest foreground wait for the pin lock),
 * chunk_pin_ms (the longest single pin call), wait_over_chunk (their ratio),
 * pin_gbps (bytes pinned / time in pin calls), reserve_mib, max_alloc_ms
 * (the longest foreground fp_alloc_alloc: its wait plus its own pin),
 * fg_allocs, contended (foreground pins that found the lock taken).
 * A row fails when the reserve did not complete, the foreground made no
 * allocation, or the pin counts do not add up.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "scenario.h"

#define MiB ((size_t)1 << 20)

typedef struct fg_state {
    fp_pinned_pool *pool;
    size_t bytes;
    int n;
    double max_alloc_ms;
    fp_status st;
    char msg[200];
} fg_state;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int reserve_running(fp_pinned_pool *pool) {
    fp_pinned_stats s;
    fp_pinned_stats_init(&s);
    return fp_pinned_pool_get_stats(pool, &s) == FP_OK && s.reserve_running;
}

/* Fresh blocks while the reserve runs: each freed and its segment released
 * (unpinned) at once, so the next one pins again and memory stays bounded
 * however long the reserve takes. */
static void *fg_main(void *arg) {
    fg_state *f = arg;
    fp_allocator *a = fp_pinned_pool_allocator(f->pool);
    while (reserve_running(f->pool)) {
        void *b = NULL;
        const double t0 = now_ms();
        f->st = fp_alloc_alloc(a, f->bytes, NULL, &b);
        const double ms = now_ms() - t0;
        if (f->st == FP_OK) f->st = fp_alloc_free(a, b);
        if (f->st == FP_OK) f->st = fp_alloc_empty_cache(a);
        if (f->st != FP_OK) {
            snprintf(f->msg, sizeof f->msg, "%s", fp_last_error());
            break;
        }
        f->n++;
        if (ms > f->max_alloc_ms) f->max_alloc_ms = ms;
        struct timespec ts = {0, 500000}; /* let the reserve run between them */
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void run_mode(fb_run *run, const char *mode, size_t reserve_mib, size_t chunk_mib, size_t fg_mib) {
    const int gpu = fb_kind(run) == FP_DEVICE_CUDA;
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "upstream", gpu ? "pinned" : "host");
    fb_param_str(r, "mode", mode);
    fb_param_int(r, "reserve_mib", (int64_t)reserve_mib);
    fb_param_int(r, "chunk_mib", (int64_t)chunk_mib);
    fp_pinned_config cfg;
    fp_pinned_config_default(&cfg);
    cfg.chunk_bytes = chunk_mib * MiB;
    fp_pinned_pool *pool = NULL;
    fp_status st = fp_pinned_pool_create(fb_ctx(run), &cfg, &pool);
    if (st != FP_OK) {
        fb_result_fail(r, st, fp_last_error());
        return;
    }
    fg_state f;
    memset(&f, 0, sizeof f);
    f.pool = pool;
    f.bytes = fg_mib * MiB;
    const double t0 = now_ms();
    st = fp_pinned_pool_reserve(pool, reserve_mib * MiB);
    pthread_t th;
    int started = 0;
    if (st == FP_OK) started = pthread_create(&th, NULL, fg_main, &f) == 0;
    if (started) pthread_join(th, NULL);
    fp_status wst = fp_pinned_pool_reserve_wait(pool, -1);
    const double wall_ms = now_ms() - t0;
    if (st == FP_OK && wst != FP_OK) st = wst;
    fp_pinned_stats s;
    fp_pinned_stats_init(&s);
    if (st == FP_OK) st = fp_pinned_pool_get_stats(pool, &s);

    const size_t seg = fp_pinned_pool_reserve_segment(pool);
    const uint64_t reserve_pins = s.reserve_target_bytes / (seg ? seg : 1); /* one pin call per segment */
    char why[256] = "";
    if (st != FP_OK) snprintf(why, sizeof why, "%s", fp_last_error());
    else if (!started) snprintf(why, sizeof why, "the foreground thread did not start");
    else if (f.st != FP_OK) snprintf(why, sizeof why, "foreground allocation failed: %s", f.msg);
    else if (s.reserve_done_bytes != s.reserve_target_bytes || s.reserve_target_bytes < reserve_mib * MiB)
        snprintf(why, sizeof why, "reserve holds %zu of %zu bytes", s.reserve_done_bytes, s.reserve_target_bytes);
    else if (f.n == 0) snprintf(why, sizeof why, "the foreground made no allocation during the reserve");
    else if (s.pin_calls < reserve_pins || s.longest_pin_call_ms <= 0)
        snprintf(why, sizeof why, "%llu pin calls, expected at least %llu for the reserve",
                 (unsigned long long)s.pin_calls, (unsigned long long)reserve_pins);
    if (why[0]) {
        fb_result_fail(r, st != FP_OK ? st : FP_ERR_INTERNAL, why);
    } else {
        fb_result_metric(r, "max_wait_ms", s.max_pin_lock_wait_ms);
        fb_result_metric(r, "chunk_pin_ms", s.longest_pin_call_ms);
        fb_result_metric(r, "wait_over_chunk", s.max_pin_lock_wait_ms / s.longest_pin_call_ms);
        fb_result_metric(r, "pin_gbps", s.pin_gbps);
        fb_result_metric(r, "reserve_mib", (double)reserve_mib);
        fb_result_metric(r, "max_alloc_ms", f.max_alloc_ms);
        fb_result_metric(r, "fg_allocs", (double)f.n);
        fb_result_metric(r, "contended", (double)s.pin_lock_contended);
        fb_result_metric(r, "wall_ms", wall_ms);
        fb_result_note(r, "%d fg allocs of %zu MiB; wait %.1f ms vs pin %.1f ms", f.n, fg_mib, s.max_pin_lock_wait_ms,
                       s.longest_pin_call_ms);
    }
    fp_pinned_pool_destroy(pool);
}

static size_t opt_mib(fb_run *run, const char *name, int64_t def) {
    const int64_t v = fb_opt_int(run, name, def);
    return v > 0 && v <= ((int64_t)1 << 30) ? (size_t)v : 0;
}

static fp_status run_pin_wait(fb_run *run) {
    const int gpu = fb_kind(run) == FP_DEVICE_CUDA, quick = fb_quick(run);
    const size_t reserve_mib = opt_mib(run, "reserve_mib", gpu ? (quick ? 256 : 1024) : (quick ? 128 : 256));
    const size_t chunk_mib = opt_mib(run, "chunk_mib", gpu ? 64 : 16);
    const size_t fg_mib = opt_mib(run, "fg_mib", 12);
    if (!reserve_mib || !chunk_mib || !fg_mib) {
        fb_result *r = fb_result_new(run);
        fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--reserve_mib, --chunk_mib and --fg_mib must be in [1, 2^30]");
        return FP_OK;
    }
    run_mode(run, "chunked", reserve_mib, chunk_mib, fg_mib);
    run_mode(run, "whole", reserve_mib, reserve_mib, fg_mib);
    return FP_OK;
}

FB_SCENARIO(pipeline_pin_wait, "pipeline/pin_wait",
            "foreground wait for the pin lock while a pinned pool reserves in chunks vs in one pin call",
            run_pin_wait)
