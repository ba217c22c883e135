/* Pinned pools (pinned.h) on a CUDA context (label gpu; exits 77 without a
 * device; also run on the emulated runtime: tests/emu, test_pinned_gpu_emu):
 * blocks larger than the chunk pinned as one registration, copies both ways
 * through them, a block freed while a copy on another stream still reads it
 * reused only once that copy's event completed, a registration that the
 * driver refuses leaving nothing registered, registration and
 * unregistration seen by the driver, copies over a registered range larger
 * than the chunk, the background reserve, and destroy unregistering what is
 * left. It also reports what the driver does with a copy over two adjacent
 * registrations (it failed on an H100, driver 580: why a block is never
 * pinned in pieces). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "fastpath/pinned.h"
#include "fp_test.h"

#define MiB ((size_t)1 << 20)

cudaError_t alloc_test_spin(void *p, long long cycles, cudaStream_t s);

static int is_pinned(const void *p) {
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return attr.type == cudaMemoryTypeHost;
}

static fp_pinned_stats pstats(fp_pinned_pool *p) {
    fp_pinned_stats s;
    fp_pinned_stats_init(&s);
    CHECK_OK(fp_pinned_pool_get_stats(p, &s));
    return s;
}

static long long spin_cycles(void) {
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    return (long long)khz * 200; /* ~200 ms */
}

int main(void) {
    fp_context *ctx = fp_test_cuda_context_or_skip();
    fp_pinned_config cfg;
    CHECK_OK(fp_pinned_config_default(&cfg));
    cfg.chunk_bytes = 4 * MiB;
    fp_pinned_pool *p = NULL;
    CHECK_OK(fp_pinned_pool_create(ctx, &cfg, &p));
    if (!p) return 1;
    fp_allocator *a = fp_pinned_pool_allocator(p);
    CHECK(pstats(p).host_mode == 0);
    cudaStream_t s1 = NULL, s2 = NULL;
    CHECK(cudaSuccess == cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaSuccess == cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    const size_t bytes = 10 * MiB;
    unsigned char *d = NULL;
    CHECK(cudaSuccess == cudaMalloc((void **)&d, bytes));
    if (!d) return 1;

    /* A 10 MiB block (chunk 4 MiB): its own 10 MiB segment, one registration. */
    unsigned char *blk = NULL;
    CHECK_OK(fp_alloc_alloc(a, bytes, NULL, (void **)&blk));
    if (!blk) return 1;
    CHECK(is_pinned(blk) && is_pinned(blk + 5 * MiB) && is_pinned(blk + bytes - 1));
    fp_pinned_stats s = pstats(p);
    CHECK_MSG(s.pin_calls == 1 && s.segment_bytes == bytes && s.bytes_pinned == bytes,
              "pin calls %llu, segment bytes %zu", (unsigned long long)s.pin_calls, s.segment_bytes);

    /* Round trip through the device. */
    for (size_t i = 0; i < bytes; ++i) blk[i] = (unsigned char)(i * 13 + 1);
    CHECK(cudaSuccess == cudaMemcpyAsync(d, blk, bytes, cudaMemcpyHostToDevice, s1));
    unsigned char *back = NULL;
    CHECK_OK(fp_alloc_alloc(a, bytes, NULL, (void **)&back));
    if (!back) return 1;
    memset(back, 0, bytes);
    CHECK(cudaSuccess == cudaMemcpyAsync(back, d, bytes, cudaMemcpyDeviceToHost, s1));
    CHECK(cudaSuccess == cudaStreamSynchronize(s1));
    size_t bad = 0;
    for (size_t i = 0; i < bytes; ++i) bad += back[i] != (unsigned char)(i * 13 + 1);
    CHECK_MSG(bad == 0, "%zu bytes differ after the round trip", bad);
    CHECK_OK(fp_alloc_free(a, back));

    /* Freed while a copy on s2 (behind a ~200 ms kernel) still reads it:
     * not handed out again until that copy's event completed. */
    CHECK(cudaSuccess == alloc_test_spin(d, spin_cycles(), s2));
    CHECK(cudaSuccess == cudaMemcpyAsync(d, blk, bytes, cudaMemcpyHostToDevice, s2));
    CHECK_OK(fp_alloc_record_stream(a, blk, (fp_stream)s2));
    CHECK_OK(fp_alloc_free(a, blk));
    void *other = NULL;
    CHECK_OK(fp_alloc_alloc(a, bytes, NULL, &other));
    CHECK_MSG(other != blk, "a block still read by a pending copy was handed out again");
    CHECK(cudaSuccess == cudaStreamSynchronize(s2));
    CHECK_OK(fp_alloc_synchronize_events(a));
    void *again = NULL;
    CHECK_OK(fp_alloc_alloc(a, bytes, NULL, &again));
    CHECK(again == blk);
    CHECK_OK(fp_alloc_free(a, again));
    CHECK_OK(fp_alloc_free(a, other));
    CHECK_OK(fp_alloc_empty_cache(a));
    s = pstats(p);
    CHECK(s.bytes_pinned == 0 && s.segments == 0 && s.unpin_calls == s.pin_calls);

    /* Registration refused (the driver refuses memory pinned otherwise, here
     * 1 MiB in the middle): nothing stays registered. */
    const size_t ubytes = 24 * MiB;
    unsigned char *user = aligned_alloc(4096, ubytes);
    CHECK(user != NULL);
    if (!user) return 1;
    memset(user, 0x21, ubytes);
    CHECK(cudaSuccess == cudaHostRegister(user + 10 * MiB, MiB, cudaHostRegisterPortable));
    CHECK_STATUS(fp_pinned_register(p, user, ubytes), FP_ERR_CUDA);
    CHECK_MSG(strstr(fp_last_error(), "cudaHostRegister") != NULL, "message: %s", fp_last_error());
    CHECK(cudaGetLastError() == cudaSuccess); /* the failure's error was consumed */
    CHECK(!is_pinned(user) && !is_pinned(user + 4 * MiB) && !is_pinned(user + 20 * MiB));
    s = pstats(p);
    CHECK(s.registered_bytes == 0 && s.bytes_pinned == 0 && s.register_calls == 0);
    CHECK(cudaSuccess == cudaHostUnregister(user + 10 * MiB));
    /* Now it registers, the driver sees all of it, a copy over more than a
     * chunk works from it. */
    CHECK_OK(fp_pinned_register(p, user, ubytes));
    CHECK(is_pinned(user) && is_pinned(user + 10 * MiB) && is_pinned(user + ubytes - 1));
    s = pstats(p);
    CHECK(s.registered_bytes == ubytes && s.register_calls == 1 && s.register_ms > 0);
    CHECK(cudaSuccess == cudaMemcpyAsync(d, user + 8 * MiB, bytes, cudaMemcpyHostToDevice, s1));
    CHECK(cudaSuccess == cudaStreamSynchronize(s1));
    CHECK_OK(fp_pinned_unregister(p, user));
    CHECK(!is_pinned(user) && !is_pinned(user + ubytes - 1));

    /* The reserve: 10 MiB segments (4 MiB chunks: 4 + 4 + 2), pinned. */
    CHECK(fp_pinned_pool_reserve_segment(p) == 10 * MiB);
    CHECK_OK(fp_pinned_pool_reserve(p, 30 * MiB));
    CHECK_OK(fp_pinned_pool_reserve_wait(p, -1));
    s = pstats(p);
    CHECK(s.reserve_done_bytes == 30 * MiB && s.segment_bytes == 30 * MiB && s.segments == 3);
    void *r = NULL;
    CHECK_OK(fp_alloc_alloc(a, 8 * MiB, NULL, &r));
    CHECK(is_pinned(r) && pstats(p).segments == 3); /* from the reserve's cache */
    CHECK_OK(fp_alloc_free(a, r));
    CHECK_OK(fp_alloc_check_invariants(a));

    /* Destroy unregisters user memory still registered. */
    CHECK_OK(fp_pinned_register(p, user, ubytes));
    CHECK(is_pinned(user));
    fp_pinned_pool_destroy(p);
    CHECK(!is_pinned(user));
    CHECK(cudaGetLastError() == cudaSuccess);

    /* What the driver does with a copy over two adjacent registrations
     * (reported, not asserted: it is the driver's rule, not the pool's). */
    CHECK(cudaSuccess == cudaHostRegister(user, 4 * MiB, cudaHostRegisterPortable));
    CHECK(cudaSuccess == cudaHostRegister(user + 4 * MiB, 4 * MiB, cudaHostRegisterPortable));
    cudaError_t across = cudaMemcpyAsync(d, user + 2 * MiB, 4 * MiB, cudaMemcpyHostToDevice, s1);
    (void)cudaGetLastError();
    CHECK(cudaSuccess == cudaStreamSynchronize(s1));
    printf("driver: a copy over two adjacent registrations returns %s\n", cudaGetErrorName(across));
    CHECK(cudaSuccess == cudaHostUnregister(user));
    CHECK(cudaSuccess == cudaHostUnregister(user + 4 * MiB));

    free(user);
    cudaFree(d);
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    fp_context_destroy(ctx);
    TEST_END();
}
