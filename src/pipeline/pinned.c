/* Pinned pools (pinned.h): the caching allocator over an upstream that pins
 * mmap'd memory in chunks (pinned_pin.c), the budget, the background
 * reserve, registration of user memory, statistics. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "pinned_internal.h"

#define PINNED_CONFIG_SIZE_FIRST sizeof(fp_pinned_config)
#define PINNED_STATS_SIZE_FIRST sizeof(fp_pinned_stats)

/* The pool whose reserve runs on this thread: its upstream calls take the
 * stash, and its pin-lock waits are not foreground waits. */
static _Thread_local fp_pinned_pool *tl_reserving;

fp_status fp_pinned_config_default_sized(fp_pinned_config *cfg, size_t struct_size) {
    fp_pinned_config d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.chunk_bytes = FP_PINNED_DEFAULT_CHUNK;
    return fp_struct_init(cfg, struct_size, &d, PINNED_CONFIG_SIZE_FIRST, sizeof d, "fp_pinned_config");
}

fp_status fp_pinned_stats_init_sized(fp_pinned_stats *s, size_t struct_size) {
    return fp_struct_init(s, struct_size, NULL, PINNED_STATS_SIZE_FIRST, sizeof(fp_pinned_stats), "fp_pinned_stats");
}

/* The statistics of a new pool: zero, with the pool's fixed figures. */
static void stats_start(fp_pinned_pool *p) {
    memset(&p->st, 0, sizeof p->st);
    p->st.struct_size = sizeof p->st;
    p->st.host_mode = p->host_mode;
    p->st.chunk_bytes = p->chunk;
    p->st.budget_bytes = p->budget;
}

/* ---- the budget ---- */

static fp_status budget_take(fp_pinned_pool *p, size_t bytes, const char *what) {
    pthread_mutex_lock(&p->mu);
    if (p->budget && (bytes > p->budget || p->st.bytes_pinned > p->budget - bytes)) {
        p->st.budget_refusals++;
        const size_t now = p->st.bytes_pinned;
        pthread_mutex_unlock(&p->mu);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY,
                            "pinned pool budget: %zu bytes pinned, %s of %zu bytes would exceed the budget of "
                            "%zu bytes",
                            now, what, bytes, p->budget);
    }
    p->st.bytes_pinned += bytes;
    if (p->st.bytes_pinned > p->st.peak_bytes_pinned) p->st.peak_bytes_pinned = p->st.bytes_pinned;
    pthread_mutex_unlock(&p->mu);
    return FP_OK;
}

static void budget_give(fp_pinned_pool *p, size_t bytes) {
    pthread_mutex_lock(&p->mu);
    p->st.bytes_pinned -= bytes;
    pthread_mutex_unlock(&p->mu);
}

/* ---- pinned segments ---- */

/* A new pinned range of `bytes` (a multiple of the page): counted against
 * the budget, mmap'd, its pages touched before the pin lock is taken (CUDA;
 * in host mode the first touch is the pin), pinned in one call. Nothing is
 * left behind on error. */
static fp_status pin_new(fp_pinned_pool *p, size_t bytes, int background, void **out) {
    FP_TRY(budget_take(p, bytes, "a segment"));
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        const int err = errno;
        budget_give(p, bytes);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "mmap of %zu bytes for pinned memory failed (errno %d)", bytes,
                            err);
    }
    if (!p->host_mode) fp_pinned_touch(p, m, bytes);
    fp_status st = fp_pinned_pin_range(p, m, bytes, background);
    if (st != FP_OK) {
        munmap(m, bytes);
        budget_give(p, bytes);
        return st;
    }
    *out = m;
    return FP_OK;
}

static void unpin_free(fp_pinned_pool *p, void *m, size_t bytes) {
    (void)fp_pinned_unpin(p, m);
    munmap(m, bytes);
    budget_give(p, bytes);
}

static size_t page_round(const fp_pinned_pool *p, size_t bytes) {
    return (bytes + p->page - 1) & ~(p->page - 1);
}

static void segment_count(fp_pinned_pool *p, size_t bytes, int sign) {
    pthread_mutex_lock(&p->mu);
    if (sign > 0) {
        p->st.segment_bytes += bytes;
        p->st.segments++;
    } else {
        p->st.segment_bytes -= bytes;
        p->st.segments--;
    }
    pthread_mutex_unlock(&p->mu);
}

/* ---- the allocator's upstream ---- */

static fp_status up_alloc(void *opaque, size_t bytes, void **out) {
    fp_pinned_pool *p = opaque;
    if (bytes > SIZE_MAX - p->page)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "a pinned segment of %zu bytes cannot be rounded to pages", bytes);
    const size_t len = page_round(p, bytes);
    const int reserving = tl_reserving == p;
    if (reserving && p->stash && p->stash_bytes == len) {
        /* The reserve pinned it outside the allocator's one-at-a-time
         * upstream calls: handing it over takes no time. */
        *out = p->stash;
        p->stash = NULL;
        segment_count(p, len, +1);
        return FP_OK;
    }
    void *m = NULL;
    FP_TRY(pin_new(p, len, reserving, &m));
    segment_count(p, len, +1);
    *out = m;
    return FP_OK;
}

static void up_free(void *opaque, void *ptr, size_t bytes) {
    fp_pinned_pool *p = opaque;
    const size_t len = page_round(p, bytes);
    /* A failed unregister must not become the message of the allocator call
     * that released the segment and succeeded. */
    fp_error_saved saved;
    fp_error_save(&saved);
    unpin_free(p, ptr, len);
    fp_error_restore(&saved);
    segment_count(p, len, -1);
}

/* The budget as the upstream's size, so fp_alloc_config.memory_fraction
 * means a share of it. */
static size_t up_total(void *opaque) { return ((fp_pinned_pool *)opaque)->budget; }

/* ---- create / destroy ---- */

fp_status fp_pinned_pool_create(fp_context *ctx, const fp_pinned_config *cfg, fp_pinned_pool **out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(out);
    fp_pinned_config full;
    if (!cfg) {
        fp_pinned_config_default(&full);
        cfg = &full;
    } else {
        FP_STRUCT_IN(&cfg, full, PINNED_CONFIG_SIZE_FIRST, fp_pinned_config_default, "fp_pinned_config");
    }
    long ps = sysconf(_SC_PAGESIZE);
    const size_t page = ps > 0 ? (size_t)ps : 4096;
    size_t chunk = cfg->chunk_bytes ? cfg->chunk_bytes : FP_PINNED_DEFAULT_CHUNK;
    FP_CHECK_ARG(chunk <= SIZE_MAX - page, "chunk_bytes (%zu) rounds past SIZE_MAX", chunk);
    chunk = (chunk + page - 1) & ~(page - 1);

    fp_pinned_pool *p = calloc(1, sizeof *p);
    if (!p) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_pinned_pool_create: %zu bytes", sizeof *p);
    p->host_mode = ctx->kind != FP_DEVICE_CUDA;
    p->device = ctx->device;
    p->page = page;
    p->chunk = chunk;
    p->budget = cfg->budget_bytes;
    /* At least FP_ALLOC_MIN_LARGE_ALLOC and a multiple of 2 MiB: the
     * allocator then asks its upstream for exactly this size, which is what
     * the reserve pinned ahead (the stash). */
    stats_start(p);
    p->step = chunk & ~(FP_ALLOC_ROUND_LARGE - 1);
    if (p->step < FP_ALLOC_MIN_LARGE_ALLOC) p->step = FP_ALLOC_MIN_LARGE_ALLOC;
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_pinned_pool_create: pthread_mutex_init failed");
    }
    if (pthread_mutex_init(&p->reserve_mu, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_pinned_pool_create: pthread_mutex_init failed");
    }
    if (fp_cond_init_monotonic(&p->reserve_cv) != 0) {
        pthread_mutex_destroy(&p->reserve_mu);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_pinned_pool_create: pthread_cond_init failed");
    }
    fp_alloc_upstream up = {up_alloc, up_free, up_total, p};
    fp_alloc_event_ops ev;
    fp_status st = p->host_mode ? FP_OK : fp_alloc_event_ops_cuda(p->device, &ev);
    if (st == FP_OK) st = fp_alloc_create(&up, p->host_mode ? NULL : &ev, cfg->alloc_config, &p->alloc);
    if (st != FP_OK) {
        pthread_cond_destroy(&p->reserve_cv);
        pthread_mutex_destroy(&p->reserve_mu);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return st;
    }
    *out = p;
    return FP_OK;
}

static void unregister_all(fp_pinned_pool *p);

void fp_pinned_pool_destroy(fp_pinned_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->reserve_mu);
    pthread_mutex_lock(&p->mu);
    p->cancel = 1;
    pthread_mutex_unlock(&p->mu);
    if (p->thread_started) pthread_join(p->thread, NULL);
    p->thread_started = 0;
    pthread_mutex_unlock(&p->reserve_mu);
    unregister_all(p);
    fp_alloc_destroy(p->alloc);
    pthread_cond_destroy(&p->reserve_cv);
    pthread_mutex_destroy(&p->reserve_mu);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

fp_allocator *fp_pinned_pool_allocator(fp_pinned_pool *p) { return p ? p->alloc : NULL; }

size_t fp_pinned_pool_reserve_segment(const fp_pinned_pool *p) { return p ? p->step : 0; }

/* ---- the background reserve ---- */

/* One segment: pinned into the stash (outside the allocator: a thread
 * whose allocation misses meanwhile waits for one segment at the pin lock,
 * not for this whole segment at the allocator's upstream), then taken from
 * the allocator, whose upstream call hands the stash over. When the
 * allocator serves the request from its cache instead, the stash waits for
 * the next step (or is released at the end). */
static fp_status reserve_step(fp_pinned_pool *p, void **blk) {
    if (!p->stash) {
        void *m = NULL;
        FP_TRY(pin_new(p, p->step, 1, &m));
        p->stash = m;
        p->stash_bytes = p->step;
    }
    return fp_alloc_alloc(p->alloc, p->step, NULL, blk);
}

static void *reserve_main(void *arg) {
    fp_pinned_pool *p = arg;
    tl_reserving = p;
    void **blocks = NULL;
    size_t n = 0, cap = 0;
    fp_status st = FP_OK;
    pthread_mutex_lock(&p->mu);
    while (!p->cancel && p->done < p->target) {
        pthread_mutex_unlock(&p->mu);
        void *b = NULL;
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 64;
            void **nb = realloc(blocks, ncap * sizeof *nb);
            if (nb) {
                blocks = nb;
                cap = ncap;
            } else {
                st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "reserve: a list of %zu blocks", ncap);
            }
        }
        if (st == FP_OK) st = reserve_step(p, &b);
        pthread_mutex_lock(&p->mu);
        if (st != FP_OK) break;
        blocks[n++] = b;
        p->done += p->step;
    }
    if (st != FP_OK) {
        p->reserve_status = st;
        snprintf(p->reserve_msg, sizeof p->reserve_msg, "%s", fp_last_error());
    }
    p->running = 0;
    pthread_mutex_unlock(&p->mu);
    /* Held until now so that no step got an earlier step's block back. */
    for (size_t i = 0; i < n; ++i) (void)fp_alloc_free(p->alloc, blocks[i]);
    free(blocks);
    if (p->stash) {
        unpin_free(p, p->stash, p->stash_bytes);
        p->stash = NULL;
    }
    pthread_mutex_lock(&p->mu);
    p->busy = 0;
    pthread_cond_broadcast(&p->reserve_cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

fp_status fp_pinned_pool_reserve(fp_pinned_pool *p, size_t bytes) {
    FP_CHECK_NOT_NULL(p);
    FP_CHECK_ARG(bytes > 0, "argument 'bytes' is 0");
    const size_t segs = bytes / p->step + (bytes % p->step != 0);
    FP_CHECK_ARG(segs <= SIZE_MAX / p->step, "argument 'bytes' (%zu) rounds past SIZE_MAX", bytes);
    const size_t add = segs * p->step;
    pthread_mutex_lock(&p->reserve_mu);
    pthread_mutex_lock(&p->mu);
    if (p->running) {
        const int fits = p->target <= SIZE_MAX - add;
        if (fits) p->target += add;
        pthread_mutex_unlock(&p->mu);
        pthread_mutex_unlock(&p->reserve_mu);
        FP_CHECK_ARG(fits, "argument 'bytes' (%zu): the running reserve's target would pass SIZE_MAX", bytes);
        return FP_OK;
    }
    pthread_mutex_unlock(&p->mu);
    if (p->thread_started) pthread_join(p->thread, NULL); /* finished: running was 0 */
    p->thread_started = 0;
    pthread_mutex_lock(&p->mu);
    p->target = add;
    p->done = 0;
    p->reserve_status = FP_OK;
    p->reserve_msg[0] = '\0';
    p->running = p->busy = 1;
    pthread_mutex_unlock(&p->mu);
    int rc = pthread_create(&p->thread, NULL, reserve_main, p);
    if (rc != 0) {
        pthread_mutex_lock(&p->mu);
        p->running = p->busy = 0;
        pthread_mutex_unlock(&p->mu);
        pthread_mutex_unlock(&p->reserve_mu);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_pinned_pool_reserve: pthread_create failed (%d)", rc);
    }
    p->thread_started = 1;
    pthread_mutex_unlock(&p->reserve_mu);
    return FP_OK;
}

fp_status fp_pinned_pool_reserve_wait(fp_pinned_pool *p, int64_t timeout_ms) {
    FP_CHECK_NOT_NULL(p);
    struct timespec deadline;
    fp_deadline_after_ms(&deadline, timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&p->mu);
    while (p->busy) {
        int rc = 0;
        if (timeout_ms < 0) pthread_cond_wait(&p->reserve_cv, &p->mu);
        else if (timeout_ms > 0) rc = pthread_cond_timedwait(&p->reserve_cv, &p->mu, &deadline);
        if (p->busy && (timeout_ms == 0 || rc == ETIMEDOUT)) {
            const size_t done = p->done, target = p->target;
            pthread_mutex_unlock(&p->mu);
            return fp_set_error(FP_ERR_TIMEOUT, "pinned pool reserve still running: %zu of %zu bytes after %lld ms",
                                done, target, (long long)timeout_ms);
        }
    }
    const fp_status st = p->reserve_status;
    const size_t done = p->done, target = p->target;
    char msg[FP_ERROR_MAX];
    snprintf(msg, sizeof msg, "%s", p->reserve_msg);
    pthread_mutex_unlock(&p->mu);
    if (st != FP_OK)
        return fp_set_error(st, "pinned pool reserve stopped after %zu of %zu bytes: %s", done, target, msg);
    return FP_OK;
}

/* ---- registering user memory ----
 * One registry for the process (the driver's registrations are per process
 * too): overlapping registrations are refused whichever pools they go
 * through, in host mode as CUDA refuses them. An entry is added before the
 * pins (PENDING), so a concurrent overlapping call is refused rather than
 * racing, and stays until its unpins are done (REMOVING). */
enum { REG_PENDING, REG_LIVE, REG_REMOVING };
typedef struct reg_entry {
    char *base;
    size_t bytes;
    fp_pinned_pool *owner;
    int state;
} reg_entry;
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static reg_entry *g_regs;
static size_t g_nregs, g_regs_cap;

/* Index of the entry at exactly base, or of the one containing it (contains
 * set), or -1. Under g_reg_mu. */
static long reg_find(const char *base, int *contains) {
    *contains = 0;
    for (size_t i = 0; i < g_nregs; ++i)
        if (g_regs[i].base == base) return (long)i;
    for (size_t i = 0; i < g_nregs; ++i)
        if (base > g_regs[i].base && base < g_regs[i].base + g_regs[i].bytes) {
            *contains = 1;
            return (long)i;
        }
    return -1;
}

static void reg_remove(const char *base) {
    pthread_mutex_lock(&g_reg_mu);
    for (size_t i = 0; i < g_nregs; ++i)
        if (g_regs[i].base == base) {
            g_regs[i] = g_regs[--g_nregs];
            break;
        }
    if (g_nregs == 0) {
        free(g_regs);
        g_regs = NULL;
        g_regs_cap = 0;
    }
    pthread_mutex_unlock(&g_reg_mu);
}

/* Adds a PENDING entry for [base, base + bytes) unless it overlaps one. */
static fp_status reg_add(fp_pinned_pool *p, char *base, size_t bytes) {
    pthread_mutex_lock(&g_reg_mu);
    for (size_t i = 0; i < g_nregs; ++i) {
        const reg_entry e = g_regs[i];
        if (base < e.base + e.bytes && e.base < base + bytes) {
            pthread_mutex_unlock(&g_reg_mu);
            if (e.base == base && e.bytes == bytes && e.owner == p)
                return fp_set_error(FP_ERR_INVALID_ARGUMENT, "[%p, %p) is already registered with this pool",
                                    (void *)base, (void *)(base + bytes));
            return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                                "[%p, %p) overlaps [%p, %p), registered with %s pool: pinned memory cannot be "
                                "registered twice",
                                (void *)base, (void *)(base + bytes), (void *)e.base, (void *)(e.base + e.bytes),
                                e.owner == p ? "this" : "another");
        }
    }
    if (g_nregs == g_regs_cap) {
        size_t ncap = g_regs_cap ? 2 * g_regs_cap : 16;
        reg_entry *n = realloc(g_regs, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&g_reg_mu);
            return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_pinned_register: a registry of %zu entries", ncap);
        }
        g_regs = n;
        g_regs_cap = ncap;
    }
    g_regs[g_nregs++] = (reg_entry){base, bytes, p, REG_PENDING};
    pthread_mutex_unlock(&g_reg_mu);
    return FP_OK;
}

fp_status fp_pinned_register(fp_pinned_pool *p, void *base, size_t bytes) {
    FP_CHECK_NOT_NULL(p);
    FP_CHECK_NOT_NULL(base);
    FP_CHECK_ARG(bytes > 0, "argument 'bytes' is 0");
    FP_CHECK_ARG((uintptr_t)base <= UINTPTR_MAX - bytes, "[%p, +%zu bytes) wraps around the address space", base,
                 bytes);
    const double t0 = fp_now_s();
    char *b = base;
    FP_TRY(reg_add(p, b, bytes));
    fp_status st = budget_take(p, bytes, "a registration");
    if (st == FP_OK) {
        if (!p->host_mode) fp_pinned_touch(p, b, bytes);
        st = fp_pinned_pin_range(p, b, bytes, 0);
        if (st != FP_OK) budget_give(p, bytes);
    }
    if (st != FP_OK) {
        reg_remove(b);
        return st;
    }
    pthread_mutex_lock(&g_reg_mu);
    int contains;
    long i = reg_find(b, &contains);
    if (i >= 0) g_regs[i].state = REG_LIVE;
    pthread_mutex_unlock(&g_reg_mu);
    const double ms = (fp_now_s() - t0) * 1e3;
    pthread_mutex_lock(&p->mu);
    p->st.registered_bytes += bytes;
    p->st.register_calls++;
    p->st.register_ms += ms;
    pthread_mutex_unlock(&p->mu);
    return FP_OK;
}

/* Unpins a LIVE entry already marked REMOVING and forgets it. */
static fp_status unregister_entry(fp_pinned_pool *p, char *base, size_t bytes) {
    fp_status st = fp_pinned_unpin(p, base);
    budget_give(p, bytes);
    pthread_mutex_lock(&p->mu);
    p->st.registered_bytes -= bytes;
    pthread_mutex_unlock(&p->mu);
    reg_remove(base);
    return st;
}

fp_status fp_pinned_unregister(fp_pinned_pool *p, void *base) {
    FP_CHECK_NOT_NULL(p);
    FP_CHECK_NOT_NULL(base);
    pthread_mutex_lock(&g_reg_mu);
    int contains;
    long i = reg_find(base, &contains);
    if (i < 0) {
        pthread_mutex_unlock(&g_reg_mu);
        return fp_set_error(FP_ERR_NOT_FOUND, "%p is not registered (fp_pinned_register)", base);
    }
    const reg_entry e = g_regs[i];
    if (contains) {
        pthread_mutex_unlock(&g_reg_mu);
        return fp_set_error(FP_ERR_NOT_FOUND,
                            "%p is not the base of a registration: it lies inside [%p, %p) (unregister that base)",
                            base, (void *)e.base, (void *)(e.base + e.bytes));
    }
    if (e.owner != p || e.state != REG_LIVE) {
        pthread_mutex_unlock(&g_reg_mu);
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "[%p, %p) %s", base, (void *)(e.base + e.bytes),
                            e.owner != p ? "is registered with another pool"
                                         : "is being registered or unregistered by another thread");
    }
    g_regs[i].state = REG_REMOVING;
    pthread_mutex_unlock(&g_reg_mu);
    return unregister_entry(p, e.base, e.bytes);
}

static void unregister_all(fp_pinned_pool *p) {
    for (;;) {
        reg_entry e = {NULL, 0, NULL, 0};
        pthread_mutex_lock(&g_reg_mu);
        for (size_t i = 0; i < g_nregs; ++i)
            if (g_regs[i].owner == p && g_regs[i].state == REG_LIVE) {
                g_regs[i].state = REG_REMOVING;
                e = g_regs[i];
                break;
            }
        pthread_mutex_unlock(&g_reg_mu);
        if (!e.base) return;
        (void)unregister_entry(p, e.base, e.bytes);
    }
}

/* ---- statistics ---- */

fp_status fp_pinned_pool_get_stats(fp_pinned_pool *p, fp_pinned_stats *out) {
    FP_CHECK_NOT_NULL(p);
    FP_CHECK_NOT_NULL(out);
    pthread_mutex_lock(&p->mu);
    fp_pinned_stats s = p->st;
    s.reserve_running = p->busy;
    s.reserve_target_bytes = p->target;
    s.reserve_done_bytes = p->done;
    pthread_mutex_unlock(&p->mu);
    s.pin_gbps = s.pin_ms > 0 ? (double)s.pinned_bytes_total / (s.pin_ms * 1e-3) / 1e9 : 0.0;
    return fp_struct_write(out, &s, PINNED_STATS_SIZE_FIRST, sizeof s, "fp_pinned_stats");
}

fp_status fp_pinned_pool_reset_stats(fp_pinned_pool *p) {
    FP_CHECK_NOT_NULL(p);
    pthread_mutex_lock(&p->mu);
    const fp_pinned_stats now = p->st;
    stats_start(p);
    p->st.bytes_pinned = p->st.peak_bytes_pinned = now.bytes_pinned;
    p->st.segment_bytes = now.segment_bytes;
    p->st.registered_bytes = now.registered_bytes;
    p->st.segments = now.segments;
    pthread_mutex_unlock(&p->mu);
    return FP_OK;
}
