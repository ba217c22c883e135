/* The caching allocator's stream-ordered reuse counters (alloc_internal.h),
 * read by the allocator tests: stream waits made, and waits the op refused. */
#ifndef ALLOC_WAIT_COUNTS_H
#define ALLOC_WAIT_COUNTS_H

#include <stdint.h>

#include "alloc/alloc_internal.h"
#include "fp_test.h"

static inline uint64_t waits_of(fp_allocator *a) {
    uint64_t w = 0;
    CHECK_OK(fp_alloc_stream_wait_counts(a, &w, NULL));
    return w;
}
static inline uint64_t refusals_of(fp_allocator *a) {
    uint64_t r = 0;
    CHECK_OK(fp_alloc_stream_wait_counts(a, NULL, &r));
    return r;
}

#endif /* ALLOC_WAIT_COUNTS_H */
