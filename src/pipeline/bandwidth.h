/* Pieces of bandwidth.c shared with the pipeline's A/B and the tests: host
 * buffers of each fp_host_memory_kind, and the copy-bandwidth check pattern
 * (a position-dependent byte pattern, so that a copy that did nothing, moved
 * the wrong range or was cut short is caught); and the pipeline's staging
 * memcpy (pipeline.c), which fastbench's pipeline/host_memcpy times. Not
 * installed. */
#ifndef FP_PIPELINE_BANDWIDTH_H
#define FP_PIPELINE_BANDWIDTH_H

#include <stddef.h>

#include "fastpath/pipeline.h"

/* A host buffer of one kind: pinned and write-combined by cudaHostAlloc
 * (portable) on a CUDA context; otherwise page-aligned host memory, touched
 * (so no timed copy pays its first-touch faults), cudaHostRegister'd for
 * FP_HOST_REGISTERED on a CUDA context. On a CPU context every kind is plain
 * memory. */
typedef struct fp_host_buf {
    unsigned char *ptr;
    int cuda_alloc;   /* cudaHostAlloc'd: cudaFreeHost */
    int registered;   /* cudaHostRegister'd: unregister, then free */
} fp_host_buf;
/* FP_ERR_OUT_OF_MEMORY / FP_ERR_CUDA with a message; h->ptr NULL on error. */
fp_status fp_host_buf_alloc(fp_context *ctx, fp_host_memory_kind kind, size_t bytes, fp_host_buf *h);
/* Frees it (NULL ptr: no-op) and sets ptr to NULL. */
void fp_host_buf_free(fp_host_buf *h);

/* Writes the pattern's bytes [offset, offset + n) to dst (dst holds byte
 * `offset` of the pattern at dst[0]). offset must be a multiple of 8. */
void fp_copy_pattern_fill(void *dst, size_t offset, size_t n);

/* Checks p against the pattern's bytes [offset, offset + n): all of them
 * when stride is 0, else the 8-byte word at every stride-th byte (stride a
 * multiple of 8) and the last n % 8 + 8 bytes. Returns 1 when they match;
 * 0 with *bad (if not NULL) the pattern offset of the first wrong byte.
 * offset must be a multiple of 8. */
int fp_copy_pattern_check(const void *p, size_t offset, size_t n, size_t stride, size_t *bad);

/* Byte `pos` of the pattern. */
unsigned char fp_copy_pattern_byte(size_t pos);

/* The pipeline's staging copy (pipeline.c): dst <- src in 1 MiB pieces on
 * the pool's threads and the caller; one memcpy when pool is NULL or bytes
 * is under 2 MiB. */
struct fp_thread_pool;
void fp_stage_copy(struct fp_thread_pool *pool, void *dst, const void *src, size_t bytes);

#endif /* FP_PIPELINE_BANDWIDTH_H */
