/* Pinned host memory by registering user memory (label gpu; exits 77 without
 * a device): fp_alloc_upstream_registered over an aligned_alloc'd region, the
 * caching policy carving from it until FP_ERR_OUT_OF_MEMORY, blocks that the
 * driver sees as registered host memory, async copies device <-> pinned block
 * with stream-ordered reuse through CUDA events, and unregistration on
 * release (the range can be registered again afterwards). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "fastpath/alloc.h"
#include "fp_test.h"

#define MiB ((size_t)1 << 20)

static fp_alloc_stats get_stats(fp_allocator *a) {
    fp_alloc_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK_OK(fp_alloc_get_stats(a, &s));
    return s;
}

static int is_registered_host(const void *p) {
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return attr.type == cudaMemoryTypeHost;
}

int main(void) {
    fp_context *ctx = fp_test_cuda_context_or_skip();
    const size_t bytes = 48 * MiB;
    unsigned char *mem = aligned_alloc(4096, bytes);
    CHECK(mem != NULL);
    if (!mem) return 1;
    memset(mem, 0x11, bytes);
    CHECK(!is_registered_host(mem));

    fp_alloc_upstream up;
    memset(&up, 0, sizeof up);
    CHECK_STATUS(fp_alloc_upstream_registered(0, NULL, bytes, &up), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_alloc_upstream_registered(1 << 20, mem, bytes, &up), FP_ERR_NO_DEVICE);
    CHECK(!is_registered_host(mem)); /* nothing registered on error */
    CHECK_OK(fp_alloc_upstream_registered(0, mem, bytes, &up));
    CHECK(is_registered_host(mem) && is_registered_host(mem + bytes - 1));
    /* Registering the same range twice is a CUDA error, and leaves the first. */
    fp_alloc_upstream twice;
    CHECK_STATUS(fp_alloc_upstream_registered(0, mem, bytes, &twice), FP_ERR_CUDA);
    CHECK(is_registered_host(mem));

    fp_alloc_event_ops ev;
    CHECK_OK(fp_alloc_event_ops_cuda(0, &ev));
    fp_allocator *a = NULL;
    CHECK_OK(fp_alloc_create(&up, &ev, NULL, &a));
    cudaStream_t s1 = NULL, s2 = NULL;
    CHECK(cudaSuccess == cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaSuccess == cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    void *d = NULL;
    CHECK(cudaSuccess == cudaMalloc(&d, 16 * MiB));
    if (!a || !d) return 1;

    /* Carve: three 14 MiB blocks (own segments) and a small one fill 44 of
     * 48 MiB; the next 14 MiB does not fit. Every block is pinned memory
     * inside the region, and round trips through the device. */
    unsigned char *blk[3];
    for (int i = 0; i < 3; ++i) {
        CHECK_OK(fp_alloc_alloc(a, 14 * MiB, (fp_stream)s1, (void **)&blk[i]));
        CHECK(blk[i] >= mem && blk[i] + 14 * MiB <= mem + bytes && is_registered_host(blk[i]));
        for (size_t k = 0; k < 14 * MiB; k += 4096) blk[i][k] = (unsigned char)(k / 4096 + 3 * i + 1);
        CHECK(cudaSuccess == cudaMemcpyAsync(d, blk[i], 14 * MiB, cudaMemcpyHostToDevice, s1));
    }
    unsigned char *sm = NULL;
    CHECK_OK(fp_alloc_alloc(a, 4096, (fp_stream)s1, (void **)&sm));
    void *none = (void *)0x1;
    CHECK_STATUS(fp_alloc_alloc(a, 14 * MiB, (fp_stream)s1, &none), FP_ERR_OUT_OF_MEMORY);
    CHECK(none == (void *)0x1);
    CHECK(cudaSuccess == cudaStreamSynchronize(s1));

    /* Device -> pinned block, checked on the host. */
    CHECK(cudaSuccess == cudaMemsetAsync(d, 0x3C, 14 * MiB, s1));
    CHECK(cudaSuccess == cudaMemcpyAsync(blk[1], d, 14 * MiB, cudaMemcpyDeviceToHost, s1));
    CHECK(cudaSuccess == cudaStreamSynchronize(s1));
    size_t bad = 0;
    for (size_t k = 0; k < 14 * MiB; ++k) bad += blk[1][k] != 0x3C;
    CHECK_MSG(bad == 0, "%zu bytes of the pinned block not written by the copy", bad);

    /* Stream-ordered reuse: blk[0] is read by a copy on s2, freed; it comes
     * back only after s2 has passed that copy. */
    CHECK(cudaSuccess == cudaMemcpyAsync(d, blk[0], 14 * MiB, cudaMemcpyHostToDevice, s2));
    CHECK_OK(fp_alloc_record_stream(a, blk[0], (fp_stream)s2));
    CHECK_OK(fp_alloc_free(a, blk[0]));
    CHECK(cudaSuccess == cudaStreamSynchronize(s2));
    CHECK_OK(fp_alloc_synchronize_events(a));
    void *again = NULL;
    CHECK_OK(fp_alloc_alloc(a, 14 * MiB, (fp_stream)s1, &again));
    CHECK(again == blk[0]);
    fp_alloc_stats s = get_stats(a);
    CHECK(s.upstream_allocs == 4 && s.ooms == 1 && s.pending_event_blocks == 0);
    CHECK_OK(fp_alloc_check_invariants(a));

    /* Free all: a 40 MiB block needs the cache released and the region
     * coalesced. */
    CHECK_OK(fp_alloc_free(a, again));
    CHECK_OK(fp_alloc_free(a, blk[1]));
    CHECK_OK(fp_alloc_free(a, blk[2]));
    CHECK_OK(fp_alloc_free(a, sm));
    void *huge = NULL;
    CHECK_OK(fp_alloc_alloc(a, 40 * MiB, (fp_stream)s1, &huge));
    CHECK(huge != NULL && is_registered_host(huge));
    CHECK_OK(fp_alloc_free(a, huge));
    CHECK_OK(fp_alloc_check_invariants(a));
    fp_alloc_destroy(a);

    size_t used = 1;
    CHECK(fp_alloc_region_info(&up, &used, NULL, NULL) && used == 0);
    fp_alloc_upstream_release(&up);
    CHECK(up.alloc == NULL && !is_registered_host(mem));
    /* Unregistered: it can be registered again. */
    CHECK_OK(fp_alloc_upstream_registered(0, mem, bytes, &up));
    fp_alloc_upstream_release(&up);

    cudaFree(d);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    free(mem);
    fp_context_destroy(ctx);
    TEST_END();
}
