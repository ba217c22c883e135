/* PyTorch pluggable-allocator entry points (fp_torch_malloc / fp_torch_free,
 * see alloc.h) over a table of caching allocators, one per device, created
 * lazily.
 *
 * The table is plain host code (tests drive it with the host upstream through
 * alloc_internal.h); only the process-wide table's default factory touches
 * CUDA (fp_alloc_create_device: device upstream, CUDA events, stream wait).
 *
 * Concurrency: instances are published with a release store into an array of
 * atomic pointers, so the hot path (device already has an instance) is one
 * acquire load and no lock. Creation, configuration and the first
 * device-count query happen under the table's mutex; `n_created` is only
 * written under it, so configure-after-first-use is race-free. Instances are
 * never destroyed while the table lives (the process-wide table lives
 * forever), so a pointer loaded from the array stays valid. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "alloc/alloc_internal.h"
#include "fastpath/alloc.h"
#include "internal.h"

struct fp_torch_table {
    pthread_mutex_t mu;
    int n_devices;            /* valid indices [0, n_devices); <= 0: ask fp_device_count */
    fp_torch_factory make;
    void *user;
    int n_created;            /* guarded by mu */
    fp_alloc_config cfg;      /* guarded by mu; read by make under mu */
    int has_cfg;
    _Atomic(fp_allocator *) inst[FP_TORCH_MAX_DEVICES];
};

/* ---- default factory: device memory + CUDA events ---- */

#ifdef FP_TSAN_BUILD
/* The ThreadSanitizer test build links no CUDA code: no devices. */
static fp_status make_cuda(void *user, int device, const fp_alloc_config *cfg, fp_allocator **out) {
    (void)user;
    (void)cfg;
    (void)out;
    return fp_set_error(FP_ERR_NO_DEVICE, "argument 'device' (%d): host-only build", device);
}
static fp_status device_count(int *n) {
    *n = 0;
    return FP_OK;
}
#else
static fp_status device_count(int *n) { return fp_device_count(n); }
static fp_status make_cuda(void *user, int device, const fp_alloc_config *cfg, fp_allocator **out) {
    (void)user;
    return fp_alloc_create_device(device, cfg, out);
}
#endif

static fp_torch_table g_table = {.mu = PTHREAD_MUTEX_INITIALIZER, .n_devices = 0,
                                 .make = make_cuda};

/* ---- config validation without touching CUDA ---- */

static fp_status probe_alloc(void *opaque, size_t bytes, void **out) {
    (void)opaque;
    (void)bytes;
    (void)out;
    return FP_ERR_OUT_OF_MEMORY;
}
static void probe_free(void *opaque, void *ptr, size_t bytes) {
    (void)opaque;
    (void)ptr;
    (void)bytes;
}
/* Any positive total so that memory_fraction is accepted here; the real
 * device total is applied when the instance is created. */
static size_t probe_total(void *opaque) {
    (void)opaque;
    return (size_t)1 << 40;
}

/* Validates cfg exactly as fp_alloc_create will, by creating (and
 * destroying) an allocator over an upstream that never hands out memory. */
static fp_status validate_config(const fp_alloc_config *cfg) {
    fp_alloc_upstream up = {probe_alloc, probe_free, probe_total, NULL};
    fp_allocator *a = NULL;
    FP_TRY(fp_alloc_create(&up, NULL, cfg, &a));
    fp_alloc_destroy(a);
    return FP_OK;
}

/* ---- the table ---- */

fp_status fp_torch_table_create(int n_devices, fp_torch_factory make, void *user, fp_torch_table **out) {
    FP_CHECK_NOT_NULL(make);
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(n_devices >= 1 && n_devices <= FP_TORCH_MAX_DEVICES,
                 "argument 'n_devices' (%d) must be in [1, %d]", n_devices, FP_TORCH_MAX_DEVICES);
    fp_torch_table *t = calloc(1, sizeof *t);
    if (!t) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "torch allocator table");
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t);
        return fp_set_error(FP_ERR_INTERNAL, "pthread_mutex_init failed");
    }
    t->n_devices = n_devices;
    t->make = make;
    t->user = user;
    for (int i = 0; i < FP_TORCH_MAX_DEVICES; ++i) atomic_init(&t->inst[i], NULL);
    *out = t;
    return FP_OK;
}

void fp_torch_table_destroy(fp_torch_table *t) {
    if (!t || t == &g_table) return;
    for (int i = 0; i < FP_TORCH_MAX_DEVICES; ++i)
        fp_alloc_destroy(atomic_load_explicit(&t->inst[i], memory_order_acquire));
    pthread_mutex_destroy(&t->mu);
    free(t);
}

fp_status fp_torch_table_configure(fp_torch_table *t, const fp_alloc_config *cfg) {
    FP_CHECK_NOT_NULL(t);
    if (cfg) FP_TRY(validate_config(cfg));
    pthread_mutex_lock(&t->mu);
    fp_status st = FP_OK;
    if (t->n_created > 0) {
        st = fp_set_error(FP_ERR_INVALID_ARGUMENT,
                          "torch allocator: configure must be called before the first allocation "
                          "(%d device instance(s) already exist)", t->n_created);
    } else if (cfg) {
        /* an older caller's struct is shorter: copy only its fields */
        fp_alloc_config_default(&t->cfg);
        st = fp_struct_read(&t->cfg, cfg, ALLOC_CONFIG_SIZE_FIRST, sizeof t->cfg, "fp_alloc_config (cfg)");
        t->has_cfg = st == FP_OK;
    } else {
        t->has_cfg = 0;
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* Number of valid device indices; resolves the process-wide table's count
 * on first use. Called with t->mu held. */
static fp_status device_limit_locked(fp_torch_table *t, int *n) {
    if (t->n_devices <= 0) {
        int count = 0;
        FP_TRY(device_count(&count));
        if (count <= 0) return fp_set_error(FP_ERR_NO_DEVICE, "torch allocator: no CUDA device");
        t->n_devices = count < FP_TORCH_MAX_DEVICES ? count : FP_TORCH_MAX_DEVICES;
    }
    *n = t->n_devices;
    return FP_OK;
}

static fp_status check_device_locked(fp_torch_table *t, int device) {
    int n = 0;
    FP_TRY(device_limit_locked(t, &n));
    if (device < 0 || device >= n)
        return fp_set_error(FP_ERR_NO_DEVICE, "argument 'device' (%d): %d device(s) usable", device, n);
    return FP_OK;
}

/* The instance of `device`, created on first use. */
static fp_status instance(fp_torch_table *t, int device, fp_allocator **out) {
    if (device >= 0 && device < FP_TORCH_MAX_DEVICES) {
        fp_allocator *a = atomic_load_explicit(&t->inst[device], memory_order_acquire);
        if (a) {
            *out = a;
            return FP_OK;
        }
    }
    pthread_mutex_lock(&t->mu);
    fp_status st = check_device_locked(t, device);
    fp_allocator *a = NULL;
    if (st == FP_OK) {
        a = atomic_load_explicit(&t->inst[device], memory_order_acquire);
        if (!a) {
            fp_alloc_config def;
            if (!t->has_cfg) fp_alloc_config_default(&def);
            st = t->make(t->user, device, t->has_cfg ? &t->cfg : &def, &a);
            if (st == FP_OK && !a)
                st = fp_set_error(FP_ERR_INTERNAL, "torch allocator: factory returned no allocator");
            if (st == FP_OK) {
                atomic_store_explicit(&t->inst[device], a, memory_order_release);
                t->n_created++;
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (st == FP_OK) *out = a;
    return st;
}

fp_status fp_torch_table_get(fp_torch_table *t, int device, fp_allocator **out) {
    FP_CHECK_NOT_NULL(t);
    FP_CHECK_NOT_NULL(out);
    pthread_mutex_lock(&t->mu);
    fp_status st = check_device_locked(t, device);
    fp_allocator *a = NULL;
    if (st == FP_OK) {
        a = atomic_load_explicit(&t->inst[device], memory_order_acquire);
        if (!a)
            st = fp_set_error(FP_ERR_NOT_FOUND,
                              "torch allocator: nothing was allocated on device %d yet", device);
    }
    pthread_mutex_unlock(&t->mu);
    if (st == FP_OK) *out = a;
    return st;
}

void *fp_torch_table_malloc(fp_torch_table *t, ptrdiff_t size, int device, fp_stream stream) {
    if (size == 0) return NULL;
    if (!t) {
        fp_set_error(FP_ERR_INVALID_ARGUMENT, "argument 't' is NULL");
        return NULL;
    }
    if (size < 0) {
        fp_set_error(FP_ERR_INVALID_ARGUMENT, "argument 'size' (%td) is negative", size);
        return NULL;
    }
    fp_allocator *a = NULL;
    if (instance(t, device, &a) != FP_OK) return NULL;
    void *p = NULL;
    if (fp_alloc_alloc(a, (size_t)size, stream, &p) != FP_OK) return NULL;
    return p;
}

void fp_torch_table_free(fp_torch_table *t, void *ptr, int device) {
    if (!ptr || !t) return;
    fp_allocator *own = NULL;
    if (device >= 0 && device < FP_TORCH_MAX_DEVICES) {
        own = atomic_load_explicit(&t->inst[device], memory_order_acquire);
        if (own && fp_alloc_free(own, ptr) == FP_OK) return;
    }
    /* Not the named device's (a C caller's mistake, or a foreign pointer):
     * try the other instances; fp_alloc_free changes nothing on a miss. */
    for (int i = 0; i < FP_TORCH_MAX_DEVICES; ++i) {
        fp_allocator *a = atomic_load_explicit(&t->inst[i], memory_order_acquire);
        if (a && a != own && fp_alloc_free(a, ptr) == FP_OK) return;
    }
    fp_set_error(FP_ERR_NOT_FOUND, "torch allocator: free of %p (device %d) ignored: not a live "
                 "allocation of any instance", ptr, device);
}

fp_status fp_torch_table_record_stream(fp_torch_table *t, void *ptr, fp_stream stream) {
    FP_CHECK_NOT_NULL(t);
    FP_CHECK_NOT_NULL(ptr);
    for (int i = 0; i < FP_TORCH_MAX_DEVICES; ++i) {
        fp_allocator *a = atomic_load_explicit(&t->inst[i], memory_order_acquire);
        if (!a) continue;
        size_t n = 0;
        /* usable_size tells ownership without side effects; a different
         * error from record_stream (a rejected stream) is reported as is. */
        if (fp_alloc_usable_size(a, ptr, &n) == FP_OK) {
            /* PyTorch's recordStream returns at once for the block's own
             * stream; fp_alloc_record_stream now records it too (for host
             * blocks), which for this device memory would only hold the
             * block back until that stream catches up (and, under capture,
             * until the capture ends). */
            fp_stream own = NULL;
            if (fp_alloc_block_stream(a, ptr, &own) == FP_OK && own == stream) return FP_OK;
            return fp_alloc_record_stream(a, ptr, stream);
        }
    }
    return fp_set_error(FP_ERR_NOT_FOUND, "torch allocator: record_stream of %p ignored: not a live "
                        "allocation of any instance", ptr);
}

void fp_torch_table_empty_cache(fp_torch_table *t) {
    if (!t) return;
    for (int i = 0; i < FP_TORCH_MAX_DEVICES; ++i) {
        fp_allocator *a = atomic_load_explicit(&t->inst[i], memory_order_acquire);
        if (a) (void)fp_alloc_empty_cache(a);
    }
}

int fp_torch_table_instances(fp_torch_table *t) {
    if (!t) return 0;
    pthread_mutex_lock(&t->mu);
    int n = t->n_created;
    pthread_mutex_unlock(&t->mu);
    return n;
}

fp_status fp_torch_global_set_factory(fp_torch_factory make, void *user, int n_devices) {
    FP_CHECK_NOT_NULL(make);
    FP_CHECK_ARG(n_devices <= FP_TORCH_MAX_DEVICES, "argument 'n_devices' (%d) above %d", n_devices,
                 FP_TORCH_MAX_DEVICES);
    pthread_mutex_lock(&g_table.mu);
    fp_status st = FP_OK;
    if (g_table.n_created > 0) {
        st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "torch allocator: instances already exist");
    } else {
        g_table.make = make;
        g_table.user = user;
        g_table.n_devices = n_devices > 0 ? n_devices : 0;
    }
    pthread_mutex_unlock(&g_table.mu);
    return st;
}

/* ---- exported entry points ---- */

void *fp_torch_malloc(ssize_t size, int device, struct CUstream_st *stream) {
    return fp_torch_table_malloc(&g_table, (ptrdiff_t)size, device, (fp_stream)stream);
}

void fp_torch_free(void *ptr, ssize_t size, int device, struct CUstream_st *stream) {
    (void)size;
    (void)stream;
    fp_torch_table_free(&g_table, ptr, device);
}

void fp_torch_record_stream(void *ptr, struct CUstream_st *stream) {
    if (ptr) (void)fp_torch_table_record_stream(&g_table, ptr, (fp_stream)stream);
}

void fp_torch_empty_cache(void) { fp_torch_table_empty_cache(&g_table); }

fp_status fp_torch_allocator_configure(const fp_alloc_config *cfg) {
    return fp_torch_table_configure(&g_table, cfg);
}

fp_status fp_torch_allocator_get(int device, fp_allocator **out) {
    return fp_torch_table_get(&g_table, device, out);
}
