/* The buckets' gather and scatter (src/comm/buckets.c): one launch copies
 * every tensor of a bucket into its flat buffer, or back out of it. The
 * launcher is extern "C". */
#ifndef FASTPATH_KERNELS_COMM_COPY_H
#define FASTPATH_KERNELS_COMM_COPY_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One copy: bytes from src to dst (device memory, not overlapping). */
typedef struct fp_copy_desc {
    const void *src;
    void *dst;
    size_t bytes;
} fp_copy_desc;

/* Runs the n copies described by d_descs (device memory) on `stream`, one
 * grid row per copy; max_bytes (the largest copy) sizes the grid. Each copy
 * moves 16-byte vectors when its pointers and size allow, else bytes.
 * n in [1, 65535]. Returns the launch's cudaError_t. */
cudaError_t fp_launch_copies(const fp_copy_desc *d_descs, int n, size_t max_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
