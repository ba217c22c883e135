/* The region upstream: segments carved out of one caller-provided range of
 * memory (best fit over the free ranges, coalesced on free). With
 * cudaHostRegister on top (upstream_cuda.c) it is the "register user memory"
 * flavour of pinned host memory: the caching policy then serves page-locked
 * memory the caller already owns. Host-only code, so the carving is tested
 * (and run under ThreadSanitizer) without a GPU.
 *
 * The allocator asks for few, large pieces (2 MiB, 20 MiB or bigger
 * segments), so the free ranges live in a small address-ordered array. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "internal.h"

typedef struct range {
    size_t off, len;
} range;

typedef struct region {
    pthread_mutex_t mu;
    uintptr_t base;       /* FP_ALLOC_ALIGN-aligned start of the usable part */
    size_t size;          /* usable bytes, a multiple of FP_ALLOC_ALIGN */
    range *free;          /* address-ordered, never touching (coalesced) */
    size_t n_free, cap_free;
    size_t n_live, used;
    void *user_base;      /* what the caller passed (for the release hook) */
    size_t user_bytes;
    int device;
    void (*release)(void *user_base, size_t user_bytes, int device);
} region;

static inline size_t round_up(size_t n) { return (n + FP_ALLOC_ALIGN - 1) & ~(FP_ALLOC_ALIGN - 1); }

static fp_status region_alloc(void *opaque, size_t bytes, void **out) {
    region *r = opaque;
    if (bytes == 0 || bytes > r->size) return FP_ERR_OUT_OF_MEMORY;
    size_t need = round_up(bytes);
    fp_status st = FP_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&r->mu);
    /* A free never needs memory: n_live + 1 ranges at most exist at once
     * (one more than live pieces), so reserve room for that now. */
    if (r->cap_free < r->n_live + 2) {
        size_t nc = r->cap_free * 2 > r->n_live + 2 ? r->cap_free * 2 : r->n_live + 2;
        range *nf = realloc(r->free, nc * sizeof *nf);
        if (!nf) goto done;
        r->free = nf;
        r->cap_free = nc;
    }
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < r->n_free; ++i)
        if (r->free[i].len >= need && (best == SIZE_MAX || r->free[i].len < r->free[best].len)) best = i;
    if (best == SIZE_MAX) goto done;
    range *f = &r->free[best];
    *out = (void *)(r->base + f->off);
    f->off += need;
    f->len -= need;
    if (f->len == 0) {
        memmove(f, f + 1, (r->n_free - best - 1) * sizeof *f);
        r->n_free--;
    }
    r->n_live++;
    r->used += need;
    st = FP_OK;
done:
    pthread_mutex_unlock(&r->mu);
    return st;
}

/* A pointer that is not the start of a live piece (outside the region, or
 * overlapping a free range) is ignored: the upstream interface has no way to
 * report it, and taking it would corrupt the range list. */
static void region_free(void *opaque, void *ptr, size_t bytes) {
    region *r = opaque;
    uintptr_t p = (uintptr_t)ptr;
    size_t len = round_up(bytes);
    if (!ptr || bytes == 0 || p < r->base || p - r->base > r->size || len > r->size - (p - r->base))
        return;
    size_t off = p - r->base;
    pthread_mutex_lock(&r->mu);
    size_t i = 0; /* first free range after the piece */
    while (i < r->n_free && r->free[i].off < off) ++i;
    int bad = r->n_live == 0 || (i > 0 && r->free[i - 1].off + r->free[i - 1].len > off) ||
              (i < r->n_free && off + len > r->free[i].off);
    if (!bad) {
        int merge_prev = i > 0 && r->free[i - 1].off + r->free[i - 1].len == off;
        int merge_next = i < r->n_free && off + len == r->free[i].off;
        if (merge_prev && merge_next) {
            r->free[i - 1].len += len + r->free[i].len;
            memmove(&r->free[i], &r->free[i + 1], (r->n_free - i - 1) * sizeof(range));
            r->n_free--;
        } else if (merge_prev) {
            r->free[i - 1].len += len;
        } else if (merge_next) {
            r->free[i].off = off;
            r->free[i].len += len;
        } else {
            memmove(&r->free[i + 1], &r->free[i], (r->n_free - i) * sizeof(range));
            r->free[i].off = off;
            r->free[i].len = len;
            r->n_free++;
        }
        r->n_live--;
        r->used -= len;
    }
    pthread_mutex_unlock(&r->mu);
}

static size_t region_total(void *opaque) { return ((region *)opaque)->size; }

fp_status fp_alloc_upstream_region(void *base, size_t bytes, fp_alloc_upstream *out) {
    FP_CHECK_NOT_NULL(base);
    FP_CHECK_NOT_NULL(out);
    uintptr_t b = (uintptr_t)base;
    uintptr_t start = (b + FP_ALLOC_ALIGN - 1) & ~(uintptr_t)(FP_ALLOC_ALIGN - 1);
    FP_CHECK_ARG(bytes <= UINTPTR_MAX - b, "argument 'bytes' (%zu) wraps around the address space", bytes);
    size_t usable = start - b < bytes ? (bytes - (start - b)) & ~(FP_ALLOC_ALIGN - 1) : 0;
    FP_CHECK_ARG(usable >= FP_ALLOC_MIN_BLOCK,
                 "argument 'bytes' (%zu): fewer than %zu usable bytes at %zu-byte alignment", bytes,
                 (size_t)FP_ALLOC_MIN_BLOCK, (size_t)FP_ALLOC_ALIGN);
    region *r = calloc(1, sizeof *r);
    range *f = r ? malloc(4 * sizeof *f) : NULL;
    if (!f || pthread_mutex_init(&r->mu, NULL) != 0) {
        free(f);
        free(r);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "region upstream state");
    }
    r->base = start;
    r->size = usable;
    r->free = f;
    r->cap_free = 4;
    r->free[0].off = 0;
    r->free[0].len = usable;
    r->n_free = 1;
    r->user_base = base;
    r->user_bytes = bytes;
    r->device = -1;
    fp_alloc_upstream u = {region_alloc, region_free, region_total, r};
    *out = u;
    return FP_OK;
}

void fp_alloc_region_set_release(fp_alloc_upstream *up, int device,
                                 void (*release)(void *user_base, size_t user_bytes, int device)) {
    region *r = up->opaque;
    r->device = device;
    r->release = release;
}

int fp_alloc_region_info(const fp_alloc_upstream *up, size_t *used, size_t *n_live, size_t *n_free) {
    if (!up || up->alloc != region_alloc) return 0;
    region *r = up->opaque;
    pthread_mutex_lock(&r->mu);
    if (used) *used = r->used;
    if (n_live) *n_live = r->n_live;
    if (n_free) *n_free = r->n_free;
    pthread_mutex_unlock(&r->mu);
    return 1;
}

void fp_alloc_upstream_release(fp_alloc_upstream *up) {
    if (!up || up->alloc != region_alloc) return;
    region *r = up->opaque;
    if (r->release) r->release(r->user_base, r->user_bytes, r->device);
    pthread_mutex_destroy(&r->mu);
    free(r->free);
    free(r);
    memset(up, 0, sizeof *up);
}
