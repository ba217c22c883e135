/* Caching allocator internals shared by the policy (caching_allocator.c), the
 * trace replay (trace.c) and the tests. Not installed. */
#ifndef FASTPATH_ALLOC_INTERNAL_H
#define FASTPATH_ALLOC_INTERNAL_H

#include "fastpath/alloc.h"

/* The first published size of fp_alloc_config (0.2): it stays when fields
 * are appended (src/core/struct_size.c). */
#define ALLOC_CONFIG_SIZE_FIRST sizeof(fp_alloc_config)
/* The tables' 0.2 sizes (sizeof then; they stay when callbacks are appended). */
#define ALLOC_UPSTREAM_SIZE_FIRST sizeof(fp_alloc_upstream)
#define ALLOC_EVENT_OPS_SIZE_FIRST sizeof(fp_alloc_event_ops)

/* Walks every segment, free tree and the pointer map and checks the
 * invariants: blocks tile each segment exactly, no two free neighbours, free
 * trees ordered by (stream, size, address) and heap-ordered, every free block
 * in exactly one tree, every allocated block in the map, and the current
 * statistics equal the sums recomputed from the blocks. FP_ERR_INTERNAL with
 * the first violation in the message. O(blocks). Thread-safe (takes the
 * lock). */
fp_status fp_alloc_check_invariants(fp_allocator *a);

/* Whether some thread holds a's lock at this moment (tests: that the
 * upstream's alloc and the snapshot's formatting run with it dropped). */
int fp_alloc_lock_held(fp_allocator *a);

/* The allocation stream of the live block at ptr (FP_ERR_NOT_FOUND as
 * fp_alloc_usable_size otherwise). Thread-safe. */
fp_status fp_alloc_block_stream(fp_allocator *a, const void *ptr, fp_stream *out);

/* The stream-ordered reuse counters ("stream_waits" and
 * "stream_wait_refusals" of the snapshot). Either pointer may be NULL.
 * Thread-safe. */
fp_status fp_alloc_stream_wait_counts(fp_allocator *a, uint64_t *waits, uint64_t *refusals);

/* An allocator over device memory of `device`: fp_alloc_upstream_device,
 * fp_alloc_event_ops_cuda and fp_alloc_stream_wait_cuda (upstream_cuda.c;
 * fp_alloc_create_for_context and the PyTorch instances). */
fp_status fp_alloc_create_device(int device, const fp_alloc_config *cfg, fp_allocator **out);

/* cudaHostRegister(base, bytes, cudaHostRegisterPortable) and
 * cudaHostUnregister(base) with `device` current (the caller's device
 * restored; upstream_cuda.c): the registered upstream and pinned pools
 * (src/pipeline/pinned.c). A failure's CUDA error is consumed (not left for
 * the caller's cudaGetLastError) and reported as FP_ERR_CUDA
 * (FP_ERR_OUT_OF_MEMORY for cudaErrorMemoryAllocation) with a message. */
fp_status fp_alloc_host_register(int device, void *base, size_t bytes);
fp_status fp_alloc_host_unregister(int device, void *base);

/* Region upstream (upstream_region.c). set_release installs the hook that
 * fp_alloc_upstream_release calls with the caller's base and bytes
 * (cudaHostUnregister for the registered flavour). region_info returns 0 for
 * an upstream that is not a region, else 1 with the bytes and pieces handed
 * out and the number of free ranges (1 when everything was given back: the
 * ranges coalesced). */
void fp_alloc_region_set_release(fp_alloc_upstream *up, int device,
                                 void (*release)(void *user_base, size_t user_bytes, int device));
int fp_alloc_region_info(const fp_alloc_upstream *up, size_t *used, size_t *n_live, size_t *n_free);

/* The per-device instance table behind fp_torch_malloc / fp_torch_free
 * (torch_allocator.c), exposed so tests drive the same code over the host
 * upstream. The exported fp_torch_* functions use one process-wide table
 * whose factory makes device-upstream + CUDA-event instances. A table holds
 * at most FP_TORCH_MAX_DEVICES instances. */
#define FP_TORCH_MAX_DEVICES 64
typedef struct fp_torch_table fp_torch_table;
/* Makes the instance of `device` with configuration `cfg` (never NULL).
 * Called with the table's lock held, at most once per device that
 * succeeds. */
typedef fp_status (*fp_torch_factory)(void *user, int device, const fp_alloc_config *cfg,
                                      fp_allocator **out);
/* n_devices in [1, FP_TORCH_MAX_DEVICES]: valid indices are [0, n_devices). */
fp_status fp_torch_table_create(int n_devices, fp_torch_factory make, void *user,
                                fp_torch_table **out);
/* Destroys every instance (their pointers become invalid). NULL: no-op. */
void fp_torch_table_destroy(fp_torch_table *t);
fp_status fp_torch_table_configure(fp_torch_table *t, const fp_alloc_config *cfg);
fp_status fp_torch_table_get(fp_torch_table *t, int device, fp_allocator **out);
void *fp_torch_table_malloc(fp_torch_table *t, ptrdiff_t size, int device, fp_stream stream);
void fp_torch_table_free(fp_torch_table *t, void *ptr, int device);
/* PyTorch's recordStream: a no-op on the block's own allocation stream
 * (device memory is protected by stream order there), else
 * fp_alloc_record_stream. */
fp_status fp_torch_table_record_stream(fp_torch_table *t, void *ptr, fp_stream stream);
void fp_torch_table_empty_cache(fp_torch_table *t);
/* Number of instances created so far. */
int fp_torch_table_instances(fp_torch_table *t);
/* Test hook: replaces the process-wide table's factory and device count
 * (n_devices <= 0: ask fp_device_count, the default). FP_ERR_INVALID_ARGUMENT
 * once an instance exists. */
fp_status fp_torch_global_set_factory(fp_torch_factory make, void *user, int n_devices);

#endif /* FASTPATH_ALLOC_INTERNAL_H */
