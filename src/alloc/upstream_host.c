/* The host upstream: aligned_alloc/free. Used by CPU contexts, by the tests
 * (the whole policy runs on it without a GPU) and as the trace-replay
 * baseline on the CPU. */
#include <stdlib.h>

#include "fastpath/alloc.h"
#include "internal.h"

static fp_status host_alloc(void *opaque, size_t bytes, void **out) {
    (void)opaque;
    if (bytes > SIZE_MAX - (FP_ALLOC_ALIGN - 1)) return FP_ERR_OUT_OF_MEMORY;
    void *p = aligned_alloc(FP_ALLOC_ALIGN, (bytes + FP_ALLOC_ALIGN - 1) & ~(FP_ALLOC_ALIGN - 1));
    if (!p) return FP_ERR_OUT_OF_MEMORY;
    *out = p;
    return FP_OK;
}

static void host_free(void *opaque, void *ptr, size_t bytes) {
    (void)opaque;
    (void)bytes;
    free(ptr);
}

fp_alloc_upstream fp_alloc_upstream_host(void) {
    fp_alloc_upstream u = {host_alloc, host_free, NULL, NULL};
    return u;
}
