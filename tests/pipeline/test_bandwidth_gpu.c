/* fp_copy_bandwidth on a CUDA context (label gpu; exits 77 without a
 * device; also run on the emulated runtime: test_pipeline_bandwidth_gpu_emu):
 * every kind and direction gives a figure that agrees with its statistics
 * (each call checks one copy against the source first: FP_OK means it
 * moved the right bytes), the registered kind unregisters its buffer (a
 * second call at the same size, which malloc most likely places at the same
 * address, registers it again), no device memory is left behind, and, where timings mean something, pinned memory is not
 * slower than pageable and the link gives a plausible figure. Prints the
 * figures. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "fastpath/pipeline.h"
#include "fp_test.h"

static const fp_host_memory_kind kinds[] = {FP_HOST_PAGEABLE, FP_HOST_PINNED, FP_HOST_REGISTERED,
                                            FP_HOST_WRITE_COMBINED};

static size_t device_free_bytes(void) {
    size_t free_b = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_b, &total) == cudaSuccess);
    return free_b;
}

int main(void) {
    fp_context *ctx = fp_test_cuda_context_or_skip();
    const int small = FP_TEST_EMULATED || fp_test_quick();
    /* not a multiple of 8 on the emulation: the check's tail bytes */
    const size_t bytes = small ? ((size_t)1 << 20) + 13 : (size_t)64 << 20;
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.max_time_s = small ? 0.05 : 0.5;
    if (small) {
        cfg.warmup = 1;
        cfg.min_samples = 2;
        cfg.max_samples = 5;
    }

    /* the first measurement may allocate for the timing engine (events, an
     * L2 buffer): the device-memory count starts after it */
    double g = 0;
    CHECK_OK(fp_copy_bandwidth(ctx, FP_HOST_PINNED, FP_COPY_H2D, 4096, &cfg, &g, NULL));
    CHECK_OK(fp_context_synchronize(ctx, NULL));
    const size_t free_before = device_free_bytes();

    double gbps[4][2];
    for (int k = 0; k < 4; ++k) {
        for (int dir = 0; dir < 2; ++dir) {
            fp_stats st;
            memset(&st, 0, sizeof st);
            gbps[k][dir] = -1;
            CHECK_OK(fp_copy_bandwidth(ctx, kinds[k], (fp_copy_direction)dir, bytes, &cfg, &gbps[k][dir], &st));
            CHECK(gbps[k][dir] > 0 && st.samples >= 1 && st.median_ms > 0);
            CHECK_NEAR(gbps[k][dir], (double)bytes / (st.median_ms * 1e-3) / 1e9, 1e-9 * gbps[k][dir]);
            printf("%-15s %s %8.2f GB/s (median %.3f ms, %d samples, noise %.3f)\n",
                   fp_host_memory_kind_name(kinds[k]), dir == FP_COPY_H2D ? "h2d" : "d2h", gbps[k][dir],
                   st.median_ms, st.samples, st.noise);
        }
    }
    /* registered again: the previous call's registration was released */
    CHECK_OK(fp_copy_bandwidth(ctx, FP_HOST_REGISTERED, FP_COPY_D2H, bytes, &cfg, &g, NULL));
    CHECK_OK(fp_context_synchronize(ctx, NULL));
    /* exact on the emulation; a real device's count can move with other
     * processes, so only a leak of the buffer's size counts there */
    const size_t free_after = device_free_bytes();
    if (FP_TEST_EMULATED) CHECK(free_after == free_before);
    else if (!fp_test_sanitized())
        CHECK_MSG(free_after + bytes / 2 > free_before, "free %zu -> %zu", free_before, free_after);

    /* bad arguments on a CUDA context too, before anything is allocated */
    CHECK_STATUS(fp_copy_bandwidth(ctx, (fp_host_memory_kind)9, FP_COPY_H2D, bytes, &cfg, &g, NULL),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_copy_bandwidth(ctx, FP_HOST_PINNED, (fp_copy_direction)-1, bytes, &cfg, &g, NULL),
                 FP_ERR_INVALID_ARGUMENT);
    /* more pinned memory than any host has: the allocation's failure, clean */
    fp_status big = fp_copy_bandwidth(ctx, FP_HOST_PINNED, FP_COPY_H2D, (size_t)1 << 60, &cfg, &g, NULL);
    CHECK_MSG(big == FP_ERR_OUT_OF_MEMORY || big == FP_ERR_CUDA, "status %s", fp_status_string(big));
    (void)cudaGetLastError();
#if FP_TEST_EMULATED
    /* the emulated runtime checks host-memory flags as CUDA documents them:
     * unknown bits are cudaErrorInvalidValue, write-combined is accepted */
    void *h = NULL;
    CHECK(cudaHostAlloc(&h, 4096, 0x80) == cudaErrorInvalidValue);
    CHECK(cudaHostRegister(&g, sizeof g, 0x40) == cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CHECK(cudaHostAlloc(&h, 4096, cudaHostAllocWriteCombined | cudaHostAllocPortable) == cudaSuccess);
    CHECK(cudaFreeHost(h) == cudaSuccess);
#endif

    if (fp_test_timing_meaningful()) {
        /* PCIe 3 x16 gives about 12 GB/s pinned; anything below 3 is a
         * broken measurement or link */
        for (int dir = 0; dir < 2; ++dir) {
            CHECK_MSG(gbps[1][dir] > 3.0, "pinned %s: %.2f GB/s", dir ? "d2h" : "h2d", gbps[1][dir]);
            /* pinned is the driver's fast path: never clearly slower than
             * the staged pageable copy */
            CHECK_MSG(gbps[1][dir] > 0.9 * gbps[0][dir], "%s: pinned %.2f vs pageable %.2f GB/s",
                      dir ? "d2h" : "h2d", gbps[1][dir], gbps[0][dir]);
        }
    }
    fp_context_destroy(ctx);
    TEST_END();
}
