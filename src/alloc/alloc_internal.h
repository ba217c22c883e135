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

/* Region upstream (upstream_region.c). set_release installs the hook that
 * fp_alloc_upstream_release calls with the caller's base and bytes
 * (cudaHostUnregister for the registered flavour). region_info returns 0 for
 * an upstream that is not a region, else 1 with the bytes and pieces handed
 * out and the number of free ranges (1 when everything was given back: the
 * ranges coalesced). */
void fp_alloc_region_set_release(fp_alloc_upstream *up, int device,
                                 void (*release)(void *user_base, size_t user_bytes, int device));
int fp_alloc_region_info(const fp_alloc_upstream *up, size_t *used, size_t *n_live, size_t *n_free);

#endif /* FASTPATH_ALLOC_INTERNAL_H */
