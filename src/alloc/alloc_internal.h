/* Caching allocator internals shared by the policy (caching_allocator.c), the
 * trace replay (trace.c) and the tests. Not installed. */
#ifndef FASTPATH_ALLOC_INTERNAL_H
#define FASTPATH_ALLOC_INTERNAL_H

#include "fastpath/alloc.h"

/* Walks every segment, free tree and the pointer map and checks the
 * invariants: blocks tile each segment exactly, no two free neighbours, free
 * trees ordered by (stream, size, address) and heap-ordered, every free block
 * in exactly one tree, every allocated block in the map, and the current
 * statistics equal the sums recomputed from the blocks. FP_ERR_INTERNAL with
 * the first violation in the message. O(blocks). Thread-safe (takes the
 * lock). */
fp_status fp_alloc_check_invariants(fp_allocator *a);

#endif /* FASTPATH_ALLOC_INTERNAL_H */
