/* The PyTorch pluggable-allocator entry points (torch_allocator.c) on the
 * CPU: the per-device table driven with host-upstream instances (lazy
 * creation, configure-after-use, bad devices, size 0 / negative / huge,
 * foreign and double frees, record_stream, empty_cache, several threads
 * racing on first use and allocating on several 'devices'), then the exported
 * fp_torch_* symbols themselves on the process-wide table. Without a GPU the
 * process-wide table is first checked to fail cleanly (FP_ERR_NO_DEVICE),
 * then switched to host instances through the test hook. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "alloc/alloc_internal.h"
#include "fp_test.h"

#define NDEV 4

typedef struct host_factory {
    atomic_int created[FP_TORCH_MAX_DEVICES];
    atomic_int calls;
    size_t last_cap;       /* memory_cap_bytes of the last config seen */
    int slow;              /* sleep in the factory to widen creation races */
    int fail_device;       /* this device's creation fails (-1: none) */
} host_factory;

static fp_status make_host(void *user, int device, const fp_alloc_config *cfg, fp_allocator **out) {
    host_factory *f = user;
    atomic_fetch_add(&f->calls, 1);
    if (device == f->fail_device) return FP_ERR_OUT_OF_MEMORY;
    if (f->slow) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    f->last_cap = cfg->memory_cap_bytes;
    fp_alloc_upstream up = fp_alloc_upstream_host();
    fp_status st = fp_alloc_create(&up, NULL, cfg, out);
    if (st == FP_OK) atomic_fetch_add(&f->created[device], 1);
    return st;
}

static void factory_init(host_factory *f) {
    memset(f, 0, sizeof *f);
    f->fail_device = -1;
}

static int64_t allocated_now(fp_allocator *a) {
    fp_alloc_stats s;
    s.struct_size = sizeof s;
    if (fp_alloc_get_stats(a, &s) != FP_OK) return -1;
    return s.allocation_count.current;
}

static int error_mentions(const char *what) { return strstr(fp_last_error(), what) != NULL; }

static void test_lazy_creation(void) {
    host_factory f;
    factory_init(&f);
    fp_torch_table *t = NULL;
    CHECK_OK(fp_torch_table_create(NDEV, make_host, &f, &t));
    fp_allocator *a = NULL;
    CHECK_STATUS(fp_torch_table_get(t, 2, &a), FP_ERR_NOT_FOUND);
    CHECK(a == NULL);
    CHECK(fp_torch_table_instances(t) == 0);

    void *p = fp_torch_table_malloc(t, 1000, 2, NULL);
    CHECK(p != NULL);
    CHECK(((uintptr_t)p % FP_ALLOC_ALIGN) == 0);
    CHECK(fp_torch_table_instances(t) == 1);
    for (int d = 0; d < NDEV; ++d) CHECK(atomic_load(&f.created[d]) == (d == 2));
    CHECK_OK(fp_torch_table_get(t, 2, &a));
    CHECK(a != NULL);
    CHECK_STATUS(fp_torch_table_get(t, 0, &a), FP_ERR_NOT_FOUND);

    /* A second allocation on the same device reuses the instance. */
    void *q = fp_torch_table_malloc(t, 3000, 2, NULL);
    CHECK(q != NULL && q != p);
    CHECK(atomic_load(&f.calls) == 1);
    CHECK_OK(fp_torch_table_get(t, 2, &a));
    CHECK(allocated_now(a) == 2);
    size_t n = 0;
    CHECK_OK(fp_alloc_usable_size(a, q, &n));
    CHECK(n >= 3000);
    memset(p, 0xA5, 1000); /* the memory is really usable */
    memset(q, 0x5A, 3000);

    fp_torch_table_free(t, p, 2);
    fp_torch_table_free(t, q, 2);
    CHECK(allocated_now(a) == 0);
    CHECK_OK(fp_alloc_check_invariants(a));

    /* A failing factory creates nothing and leaves the next try open. */
    f.fail_device = 1;
    fp_clear_error();
    CHECK(fp_torch_table_malloc(t, 64, 1, NULL) == NULL);
    CHECK(fp_torch_table_instances(t) == 1);
    f.fail_device = -1;
    void *r = fp_torch_table_malloc(t, 64, 1, NULL);
    CHECK(r != NULL);
    CHECK(fp_torch_table_instances(t) == 2);
    fp_torch_table_free(t, r, 1);
    fp_torch_table_destroy(t);
}

static void test_sizes_and_devices(void) {
    host_factory f;
    factory_init(&f);
    fp_torch_table *t = NULL;
    CHECK_OK(fp_torch_table_create(NDEV, make_host, &f, &t));

    /* size 0: NULL, no error, no instance (PyTorch never frees it). */
    fp_clear_error();
    CHECK(fp_torch_table_malloc(t, 0, 0, NULL) == NULL);
    CHECK(fp_last_error()[0] == '\0');
    CHECK(fp_torch_table_instances(t) == 0);

    CHECK(fp_torch_table_malloc(t, -5, 0, NULL) == NULL);
    CHECK_MSG(error_mentions("negative"), "detail: %s", fp_last_error());
    CHECK(fp_torch_table_malloc(t, (ptrdiff_t)(FP_ALLOC_MAX_REQUEST + 1), 0, NULL) == NULL);
    CHECK(fp_last_error()[0] != '\0');

    const int bad[] = {-1, NDEV, FP_TORCH_MAX_DEVICES, 1000, -1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        fp_clear_error();
        CHECK(fp_torch_table_malloc(t, 256, bad[i], NULL) == NULL);
        CHECK_MSG(error_mentions("device"), "device %d: detail: %s", bad[i], fp_last_error());
        fp_allocator *a = NULL;
        CHECK_STATUS(fp_torch_table_get(t, bad[i], &a), FP_ERR_NO_DEVICE);
        CHECK(a == NULL);
        fp_torch_table_free(t, (void *)(uintptr_t)0x1000, bad[i]); /* ignored, no crash */
    }
    CHECK(atomic_load(&f.calls) == 1); /* only the huge request reached the factory */
    CHECK(fp_torch_table_instances(t) == 1);
    CHECK_STATUS(fp_torch_table_get(t, 0, NULL), FP_ERR_INVALID_ARGUMENT);

    /* Bad table arguments. */
    fp_torch_table *t2 = NULL;
    CHECK_STATUS(fp_torch_table_create(0, make_host, &f, &t2), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_torch_table_create(FP_TORCH_MAX_DEVICES + 1, make_host, &f, &t2),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_torch_table_create(1, NULL, &f, &t2), FP_ERR_INVALID_ARGUMENT);
    CHECK(t2 == NULL);
    CHECK(fp_torch_table_malloc(NULL, 16, 0, NULL) == NULL);
    fp_torch_table_free(NULL, (void *)(uintptr_t)0x1000, 0);
    fp_torch_table_destroy(NULL);
    fp_torch_table_destroy(t);
}

static void test_configure(void) {
    host_factory f;
    factory_init(&f);
    fp_torch_table *t = NULL;
    CHECK_OK(fp_torch_table_create(NDEV, make_host, &f, &t));

    fp_alloc_config bad;
    fp_alloc_config_default(&bad);
    bad.struct_size = 3;
    CHECK_STATUS(fp_torch_table_configure(t, &bad), FP_ERR_INVALID_ARGUMENT);
    fp_alloc_config_default(&bad);
    bad.memory_fraction = 1.5;
    CHECK_STATUS(fp_torch_table_configure(t, &bad), FP_ERR_INVALID_ARGUMENT);
    fp_alloc_config_default(&bad);
    bad.garbage_collection_threshold = 0.5; /* needs a cap */
    CHECK_STATUS(fp_torch_table_configure(t, &bad), FP_ERR_INVALID_ARGUMENT);

    fp_alloc_config cfg;
    fp_alloc_config_default(&cfg);
    cfg.memory_cap_bytes = (size_t)7 << 20;
    CHECK_OK(fp_torch_table_configure(t, &cfg));
    cfg.memory_cap_bytes = (size_t)6 << 20; /* the last call before first use wins */
    CHECK_OK(fp_torch_table_configure(t, &cfg));
    CHECK_STATUS(fp_torch_table_configure(t, &bad), FP_ERR_INVALID_ARGUMENT); /* kept 6 MiB */

    void *p = fp_torch_table_malloc(t, 1 << 20, 3, NULL);
    CHECK(p != NULL);
    CHECK(f.last_cap == ((size_t)6 << 20));
    /* The cap is in force: 8 MiB more cannot fit. */
    fp_clear_error();
    CHECK(fp_torch_table_malloc(t, (ptrdiff_t)8 << 20, 3, NULL) == NULL);
    CHECK_MSG(error_mentions("out of memory"), "detail: %s", fp_last_error());
    fp_allocator *a = NULL;
    CHECK_OK(fp_torch_table_get(t, 3, &a));
    fp_alloc_stats s;
    s.struct_size = sizeof s;
    CHECK_OK(fp_alloc_get_stats(a, &s));
    CHECK(s.ooms == 1);

    /* After the first instance exists: rejected, with or without a config. */
    cfg.memory_cap_bytes = 0;
    CHECK_STATUS(fp_torch_table_configure(t, &cfg), FP_ERR_INVALID_ARGUMENT);
    CHECK_MSG(error_mentions("before the first allocation"), "detail: %s", fp_last_error());
    CHECK_STATUS(fp_torch_table_configure(t, NULL), FP_ERR_INVALID_ARGUMENT);
    /* A new device's instance still gets the configuration set before. */
    void *q = fp_torch_table_malloc(t, 100, 0, NULL);
    CHECK(q != NULL);
    CHECK(f.last_cap == ((size_t)6 << 20));
    fp_torch_table_free(t, p, 3);
    fp_torch_table_free(t, q, 0);
    CHECK_STATUS(fp_torch_table_configure(NULL, &cfg), FP_ERR_INVALID_ARGUMENT);
    fp_torch_table_destroy(t);
}

static void test_foreign_frees(void) {
    host_factory f;
    factory_init(&f);
    fp_torch_table *t = NULL;
    CHECK_OK(fp_torch_table_create(NDEV, make_host, &f, &t));
    char *p = fp_torch_table_malloc(t, 4096, 1, NULL);
    char *q = fp_torch_table_malloc(t, 4096, 1, NULL);
    CHECK(p && q);
    fp_allocator *a = NULL;
    CHECK_OK(fp_torch_table_get(t, 1, &a));
    fp_alloc_stats before, after;
    before.struct_size = after.struct_size = sizeof before;
    CHECK_OK(fp_alloc_get_stats(a, &before));

    char stack_buf[64];
    void *heap = malloc(512);
    void *foreign[] = {stack_buf, heap, p + 256, q + 1, (void *)(uintptr_t)16};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; ++i) {
        fp_clear_error();
        fp_torch_table_free(t, foreign[i], 1);
        CHECK_MSG(error_mentions("ignored"), "ptr %zu: detail: %s", i, fp_last_error());
        fp_torch_table_free(t, foreign[i], 0); /* a device with no instance */
    }
    fp_torch_table_free(t, NULL, 1);
    CHECK_OK(fp_alloc_get_stats(a, &after));
    CHECK(after.allocation_count.current == 2);
    CHECK(after.allocated_bytes.current == before.allocated_bytes.current);
    CHECK_OK(fp_alloc_check_invariants(a));

    /* A pointer freed with the wrong device index is freed by its owner. */
    fp_torch_table_free(t, p, 3);
    CHECK(allocated_now(a) == 1);
    /* Double free: ignored, nothing changes. */
    fp_clear_error();
    fp_torch_table_free(t, p, 1);
    CHECK(error_mentions("ignored"));
    CHECK(allocated_now(a) == 1);

    /* record_stream: live pointers only. */
    CHECK_OK(fp_torch_table_record_stream(t, q, (fp_stream)(uintptr_t)0x77));
    CHECK_STATUS(fp_torch_table_record_stream(t, p, (fp_stream)(uintptr_t)0x77), FP_ERR_NOT_FOUND);
    CHECK_STATUS(fp_torch_table_record_stream(t, heap, NULL), FP_ERR_NOT_FOUND);
    CHECK_STATUS(fp_torch_table_record_stream(t, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_torch_table_free(t, q, 1);
    CHECK(allocated_now(a) == 0);
    CHECK_OK(fp_alloc_check_invariants(a));

    /* empty_cache hands every cached segment back. */
    CHECK_OK(fp_alloc_get_stats(a, &after));
    CHECK(after.reserved_bytes.current > 0);
    fp_torch_table_empty_cache(t);
    CHECK_OK(fp_alloc_get_stats(a, &after));
    CHECK(after.reserved_bytes.current == 0);
    free(heap);
    fp_torch_table_destroy(t);
}

/* ---- several threads, several devices, racing on first use ---- */

#define NTHREADS 8
#ifdef FP_TSAN_BUILD
#define OPS_PER_THREAD 1500
#else
#define OPS_PER_THREAD 4000
#endif

typedef struct worker {
    fp_torch_table *t;
    pthread_barrier_t *start;
    int id;
    int errors;
} worker;

typedef struct live_block {
    unsigned char *p;
    size_t n;
    int device;
    unsigned char tag;
} live_block;

static int verify_block(const live_block *b) {
    for (size_t i = 0; i < b->n; i += 61)
        if (b->p[i] != b->tag) return 0;
    return b->p[b->n - 1] == b->tag;
}

static void *worker_run(void *arg) {
    worker *w = arg;
    uint64_t rng = 0x9E3779B97F4A7C15ULL * (uint64_t)(w->id + 1);
    live_block live[64];
    int n_live = 0;
    pthread_barrier_wait(w->start);
    for (int op = 0; op < OPS_PER_THREAD; ++op) {
        uint64_t r = fp_test_rand_u64(&rng);
        int do_alloc = n_live == 0 || (n_live < 64 && (r & 3) != 0 && op < OPS_PER_THREAD - 64);
        if (do_alloc) {
            /* Mostly small blocks, sometimes large-pool ones; the first op of
             * every thread targets device (id % NDEV) so all race on creation.
             * Two streams shared by the threads: the same free lists are
             * contended. */
            size_t n = (r >> 8) % 16 == 0 ? 1 + (size_t)((r >> 16) % (3u << 20))
                                          : 1 + (size_t)((r >> 16) % 20000);
            int dev = op == 0 ? w->id % NDEV : (int)((r >> 40) % NDEV);
            fp_stream stream = (fp_stream)(uintptr_t)(1 + w->id % 2);
            unsigned char *p = fp_torch_table_malloc(w->t, (ptrdiff_t)n, dev, stream);
            if (!p) {
                w->errors++;
                continue;
            }
            unsigned char tag = (unsigned char)(1 + (r >> 32) % 250);
            for (size_t i = 0; i < n; i += 61) p[i] = tag;
            p[n - 1] = tag;
            live[n_live++] = (live_block){p, n, dev, tag};
        } else {
            /* LIFO half the time, a random live block otherwise. */
            int k = (r >> 4) & 1 ? n_live - 1 : (int)((r >> 20) % (uint64_t)n_live);
            if (!verify_block(&live[k])) w->errors++; /* someone else wrote into it: overlap */
            fp_torch_table_free(w->t, live[k].p, live[k].device);
            live[k] = live[--n_live];
        }
    }
    while (n_live > 0) {
        --n_live;
        if (!verify_block(&live[n_live])) w->errors++;
        fp_torch_table_free(w->t, live[n_live].p, live[n_live].device);
    }
    return NULL;
}

static void test_threads(void) {
    host_factory f;
    factory_init(&f);
    f.slow = 1;
    fp_torch_table *t = NULL;
    CHECK_OK(fp_torch_table_create(NDEV, make_host, &f, &t));
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, NTHREADS);
    worker ws[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; ++i) {
        ws[i] = (worker){t, &start, i, 0};
        pthread_create(&th[i], NULL, worker_run, &ws[i]);
    }
    for (int i = 0; i < NTHREADS; ++i) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < NTHREADS; ++i) CHECK_MSG(ws[i].errors == 0, "thread %d: %d errors", i, ws[i].errors);
    CHECK(fp_torch_table_instances(t) == NDEV);
    for (int d = 0; d < NDEV; ++d) {
        CHECK_MSG(atomic_load(&f.created[d]) == 1, "device %d created %d times", d,
                  atomic_load(&f.created[d]));
        fp_allocator *a = NULL;
        CHECK_OK(fp_torch_table_get(t, d, &a));
        if (!a) continue;
        CHECK_OK(fp_alloc_check_invariants(a));
        fp_alloc_stats s;
        s.struct_size = sizeof s;
        CHECK_OK(fp_alloc_get_stats(a, &s));
        CHECK(s.allocation_count.current == 0);
        CHECK(s.allocated_bytes.current == 0);
        CHECK(s.allocation_count.total > 100); /* every device saw real traffic */
        CHECK(s.cache_hits > s.cache_misses);
    }
    fp_torch_table_destroy(t);
}

/* ---- the exported symbols on the process-wide table ---- */

static void test_global(void) {
    int n_gpus = 0;
#ifndef FP_TSAN_BUILD
    CHECK_OK(fp_device_count(&n_gpus));
#endif
    fp_allocator *a = NULL;
    if (n_gpus == 0) {
        /* The real factory fails cleanly without a GPU. */
        fp_clear_error();
        CHECK(fp_torch_malloc(1024, 0, NULL) == NULL);
        CHECK_MSG(error_mentions("device"), "detail: %s", fp_last_error());
        CHECK_STATUS(fp_torch_allocator_get(0, &a), FP_ERR_NO_DEVICE);
        fp_torch_free((void *)(uintptr_t)0x1000, 1024, 0, NULL);
        fp_torch_record_stream((void *)(uintptr_t)0x1000, NULL);
        fp_torch_empty_cache();
    } else {
        CHECK_STATUS(fp_torch_allocator_get(0, &a), FP_ERR_NOT_FOUND);
    }
    CHECK_STATUS(fp_torch_allocator_get(-1, &a), FP_ERR_NO_DEVICE);
    CHECK(a == NULL);

    host_factory f;
    factory_init(&f);
    CHECK_OK(fp_torch_global_set_factory(make_host, &f, 2));
    fp_alloc_config cfg;
    fp_alloc_config_default(&cfg);
    cfg.max_split_size = (size_t)64 << 20;
    CHECK_OK(fp_torch_allocator_configure(&cfg));
    CHECK_OK(fp_torch_allocator_configure(NULL)); /* back to defaults */
    CHECK_OK(fp_torch_allocator_configure(&cfg));

    CHECK(fp_torch_malloc(0, 0, NULL) == NULL);
    void *p = fp_torch_malloc(5000, 1, NULL);
    CHECK(p != NULL);
    CHECK_STATUS(fp_torch_allocator_get(0, &a), FP_ERR_NOT_FOUND);
    CHECK_OK(fp_torch_allocator_get(1, &a));
    CHECK(allocated_now(a) == 1);
    CHECK_STATUS(fp_torch_allocator_get(2, &a), FP_ERR_NO_DEVICE);
    fp_torch_record_stream(p, (struct CUstream_st *)(uintptr_t)0x42);
    CHECK_STATUS(fp_torch_allocator_configure(&cfg), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_torch_global_set_factory(make_host, &f, 2), FP_ERR_INVALID_ARGUMENT);
    fp_torch_free(p, 5000, 1, NULL);
    fp_torch_free(p, 5000, 1, NULL); /* double free: ignored */
    CHECK_OK(fp_torch_allocator_get(1, &a));
    CHECK(allocated_now(a) == 0);
    fp_torch_empty_cache();
    fp_alloc_stats s;
    s.struct_size = sizeof s;
    CHECK_OK(fp_alloc_get_stats(a, &s));
    CHECK(s.reserved_bytes.current == 0);
    CHECK(s.allocation_count.total == 1);
    CHECK_OK(fp_alloc_check_invariants(a));
}

/* Counting event ops: every event completes at once. */
static atomic_int g_records;
static fp_status count_record(void *opaque, fp_stream stream, void **event) {
    (void)opaque;
    (void)stream;
    atomic_fetch_add(&g_records, 1);
    *event = (void *)(uintptr_t)1;
    return FP_OK;
}
static int done_query(void *opaque, void *event) { (void)opaque; (void)event; return 1; }
static void no_destroy(void *opaque, void *event) { (void)opaque; (void)event; }

static fp_status make_host_events(void *user, int device, const fp_alloc_config *cfg, fp_allocator **out) {
    (void)user;
    (void)device;
    fp_alloc_upstream up = fp_alloc_upstream_host();
    fp_alloc_event_ops ev = {count_record, done_query, NULL, no_destroy, NULL, NULL};
    return fp_alloc_create(&up, &ev, cfg, out);
}

/* record_stream on the block's own stream is a no-op, as in PyTorch; another
 * stream is recorded (one event when the block is freed). */
static void test_record_own_stream(void) {
    fp_torch_table *t = NULL;
    CHECK_OK(fp_torch_table_create(1, make_host_events, NULL, &t));
    const fp_stream s1 = (fp_stream)(uintptr_t)0x11, s2 = (fp_stream)(uintptr_t)0x22;
    void *p = fp_torch_table_malloc(t, 4096, 0, s1);
    CHECK(p != NULL);
    atomic_store(&g_records, 0);
    CHECK_OK(fp_torch_table_record_stream(t, p, s1));
    fp_torch_table_free(t, p, 0);
    CHECK(atomic_load(&g_records) == 0);
    p = fp_torch_table_malloc(t, 4096, 0, s1);
    CHECK(p != NULL);
    CHECK_OK(fp_torch_table_record_stream(t, p, s2));
    fp_torch_table_free(t, p, 0);
    CHECK(atomic_load(&g_records) == 1);
    fp_torch_table_destroy(t);
}

int main(void) {
    test_record_own_stream();
    test_lazy_creation();
    test_sizes_and_devices();
    test_configure();
    test_foreign_frees();
    test_threads();
    test_global();
    TEST_END();
}
