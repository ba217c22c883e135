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
    range *live;          /* the pieces handed out, address-ordered */
    size_t n_live, cap_live, used;
    void *user_base;      /* what the caller passed (for the release hook) */
    size_t user_bytes;
    int device;
    void (*release)(void *user_base, size_t user_bytes, int device);
} region;

static inline size_t round_up(size_t n) { return (n + FP_ALLOC_ALIGN - 1) & ~(FP_ALLOC_ALIGN - 1); }

/* Index of the first live piece at or after offset off. */
static size_t live_lower_bound(const region *r, size_t off) {
    size_t lo = 0, hi = r->n_live;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->live[mid].off < off) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static fp_status region_alloc(void *opaque, size_t bytes, void **out) {
    region *r = opaque;
    if (bytes == 0 || bytes > r->size) return FP_ERR_OUT_OF_MEMORY;
    size_t need = round_up(bytes);
    fp_status st = FP_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&r->mu);
    /* A free never needs memory: n_live + 1 ranges at most exist at once
     * (one more than live pieces), so reserve room for that now, and for
     * the new live piece. */
    if (r->cap_free < r->n_live + 2) {
        size_t nc = r->cap_free * 2 > r->n_live + 2 ? r->cap_free * 2 : r->n_live + 2;
        range *nf = realloc(r->free, nc * sizeof *nf);
        if (!nf) goto done;
        r->free = nf;
        r->cap_free = nc;
    }
    if (r->cap_live < r->n_live + 1) {
        size_t nc = r->cap_live ? r->cap_live * 2 : 8;
        range *nl = realloc(r->live, nc * sizeof *nl);
        if (!nl) goto done;
        r->live = nl;
        r->cap_live = nc;
    }
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < r->n_free; ++i)
        if (r->free[i].len >= need && (best == SIZE_MAX || r->free[i].len < r->free[best].len)) best = i;
    if (best == SIZE_MAX) goto done;
    range *f = &r->free[best];
    *out = (void *)(r->base + f->off);
    size_t li = live_lower_bound(r, f->off);
    memmove(&r->live[li + 1], &r->live[li], (r->n_live - li) * sizeof *r->live);
    r->live[li] = (range){f->off, need};
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

/* Only the exact start of a live piece, with the size it was asked for, is
 * taken. Anything else (outside the region, inside a piece, a free range, a
 * double free, another size) changes nothing: the upstream interface cannot
 * return a status, so the refusal is recorded in fp_last_error() of the
 * calling thread (FP_ERR_INVALID_ARGUMENT). */
static void region_free(void *opaque, void *ptr, size_t bytes) {
    region *r = opaque;
    const uintptr_t p = (uintptr_t)ptr;
    const size_t off = p - r->base; /* wraps for p < base: no piece there */
    pthread_mutex_lock(&r->mu);
    const size_t li = live_lower_bound(r, off);
    const size_t len = li < r->n_live ? r->live[li].len : 0;
    if (!ptr || p < r->base || li == r->n_live || r->live[li].off != off || round_up(bytes) != len) {
        pthread_mutex_unlock(&r->mu);
        fp_set_error(FP_ERR_INVALID_ARGUMENT,
                     "region upstream: free of %p (%zu bytes) is not the start of a live piece of "
                     "that size: ignored, nothing changed",
                     ptr, bytes);
        return;
    }
    memmove(&r->live[li], &r->live[li + 1], (r->n_live - li - 1) * sizeof *r->live);
    size_t i = 0; /* first free range after the piece */
    while (i < r->n_free && r->free[i].off < off) ++i;
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
    free(r->live);
    free(r);
    memset(up, 0, sizeof *up);
}
