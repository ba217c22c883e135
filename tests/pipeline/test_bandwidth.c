/* fp_copy_bandwidth on a CPU context (every kind is plain memory, the copy
 * memcpy): each kind and direction gives a positive figure that agrees with
 * its statistics, bad arguments give FP_ERR_INVALID_ARGUMENT and write
 * nothing, a size that cannot be allocated is FP_ERR_OUT_OF_MEMORY; and the
 * check pattern catches a wrong byte anywhere, sampled or not. Also built
 * with ASan (test_pipeline_bandwidth_asan): no error path leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fastpath/pipeline.h"
#include "fp_test.h"
#include "pipeline/bandwidth.h"

static const fp_host_memory_kind kinds[] = {FP_HOST_PAGEABLE, FP_HOST_PINNED, FP_HOST_REGISTERED,
                                            FP_HOST_WRITE_COMBINED};

static void test_names(void) {
    CHECK(strcmp(fp_host_memory_kind_name(FP_HOST_PAGEABLE), "pageable") == 0);
    CHECK(strcmp(fp_host_memory_kind_name(FP_HOST_PINNED), "pinned") == 0);
    CHECK(strcmp(fp_host_memory_kind_name(FP_HOST_REGISTERED), "registered") == 0);
    CHECK(strcmp(fp_host_memory_kind_name(FP_HOST_WRITE_COMBINED), "write_combined") == 0);
    CHECK(strcmp(fp_host_memory_kind_name((fp_host_memory_kind)4), "unknown") == 0);
    CHECK(strcmp(fp_host_memory_kind_name((fp_host_memory_kind)-1), "unknown") == 0);
}

static void test_every_kind(fp_context *ctx, const fp_timing_config *cfg) {
    /* not a multiple of 8: the pattern's tail bytes are checked too */
    const size_t bytes = ((size_t)1 << 20) + 13;
    for (int k = 0; k < 4; ++k) {
        for (int dir = 0; dir < 2; ++dir) {
            double gbps = -1;
            fp_stats st;
            memset(&st, 0, sizeof st);
            CHECK_OK(fp_copy_bandwidth(ctx, kinds[k], (fp_copy_direction)dir, bytes, cfg, &gbps, &st));
            CHECK_MSG(gbps > 0, "%s dir %d: %g GB/s", fp_host_memory_kind_name(kinds[k]), dir, gbps);
            CHECK(st.samples >= 3 && st.median_ms > 0 && st.min_ms <= st.median_ms);
            CHECK_NEAR(gbps, (double)bytes / (st.median_ms * 1e-3) / 1e9, 1e-9 * gbps);
            /* stats is optional */
            gbps = -1;
            CHECK_OK(fp_copy_bandwidth(ctx, kinds[k], (fp_copy_direction)dir, 4096, cfg, &gbps, NULL));
            CHECK(gbps > 0);
        }
    }
    /* bytes 1: the smallest copy (the pattern's tail only) */
    double gbps = -1;
    CHECK_OK(fp_copy_bandwidth(ctx, FP_HOST_PINNED, FP_COPY_D2H, 1, cfg, &gbps, NULL));
    CHECK(gbps > 0);
}

static void test_bad_input(fp_context *ctx, const fp_timing_config *cfg) {
    double gbps = -7;
    fp_stats st;
    memset(&st, 0x5a, sizeof st);
    const fp_stats before = st;
    CHECK_STATUS(fp_copy_bandwidth(NULL, FP_HOST_PINNED, FP_COPY_H2D, 4096, cfg, &gbps, &st),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_copy_bandwidth(ctx, FP_HOST_PINNED, FP_COPY_H2D, 4096, cfg, NULL, &st),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_copy_bandwidth(ctx, (fp_host_memory_kind)4, FP_COPY_H2D, 4096, cfg, &gbps, &st),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "kind") != NULL);
    CHECK_STATUS(fp_copy_bandwidth(ctx, (fp_host_memory_kind)-1, FP_COPY_H2D, 4096, cfg, &gbps, &st),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_copy_bandwidth(ctx, FP_HOST_PINNED, (fp_copy_direction)2, 4096, cfg, &gbps, &st),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "dir") != NULL);
    /* a bad timing config fails the measurement; the buffers are released
     * (the ASan build checks) */
    fp_timing_config bad = *cfg;
    bad.min_samples = 0;
    CHECK_STATUS(fp_copy_bandwidth(ctx, FP_HOST_REGISTERED, FP_COPY_H2D, 4096, &bad, &gbps, &st),
                 FP_ERR_INVALID_ARGUMENT);
    bad = *cfg;
    bad.struct_size = 3;
    CHECK_STATUS(fp_copy_bandwidth(ctx, FP_HOST_PAGEABLE, FP_COPY_D2H, 4096, &bad, &gbps, &st),
                 FP_ERR_INVALID_ARGUMENT);
    /* more than can be allocated */
    CHECK_STATUS(fp_copy_bandwidth(ctx, FP_HOST_PAGEABLE, FP_COPY_H2D, SIZE_MAX, cfg, &gbps, &st),
                 FP_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(fp_copy_bandwidth(ctx, FP_HOST_WRITE_COMBINED, FP_COPY_D2H, SIZE_MAX - 100, cfg, &gbps, &st),
                 FP_ERR_OUT_OF_MEMORY);
    CHECK(gbps == -7);
    CHECK(memcmp(&st, &before, sizeof st) == 0);
}

static void test_pattern(void) {
    const size_t n = 3 * 4096 + 11;
    unsigned char *buf = malloc(n);
    CHECK(buf != NULL);
    if (!buf) return;
    size_t bad = 12345;
    fp_copy_pattern_fill(buf, 0, n);
    CHECK(fp_copy_pattern_check(buf, 0, n, 0, &bad) && bad == 12345);
    CHECK(fp_copy_pattern_check(buf, 0, n, 4096, NULL));
    for (size_t i = 0; i < n; i += 997) CHECK(buf[i] == fp_copy_pattern_byte(i));
    /* not a constant: a buffer of one repeated byte never passes */
    size_t distinct = 0;
    for (size_t i = 1; i < 256; ++i) distinct += buf[i] != buf[0];
    CHECK(distinct > 200);

    /* a wrong byte anywhere, found where it is (full check) */
    const size_t where[] = {0, 7, 8, 4095, 4096, 5000, n - 11, n - 1};
    for (size_t w = 0; w < sizeof where / sizeof where[0]; ++w) {
        buf[where[w]] ^= 0x40;
        CHECK_MSG(!fp_copy_pattern_check(buf, 0, n, 0, &bad) && bad == where[w], "byte %zu: bad %zu", where[w],
                  bad);
        buf[where[w]] ^= 0x40;
    }
    /* sampled: the word at each page start and the last 16 bytes */
    const size_t sampled[] = {0, 5, 4096, 8195, n - 16, n - 1};
    for (size_t w = 0; w < sizeof sampled / sizeof sampled[0]; ++w) {
        buf[sampled[w]] ^= 1;
        CHECK_MSG(!fp_copy_pattern_check(buf, 0, n, 4096, &bad) && bad == sampled[w], "byte %zu: bad %zu",
                  sampled[w], bad);
        buf[sampled[w]] ^= 1;
    }
    /* a copy that did nothing (the destination kept its poison) */
    memset(buf, 0xA5, n);
    CHECK(!fp_copy_pattern_check(buf, 0, n, 0, &bad) && bad == 0);
    CHECK(!fp_copy_pattern_check(buf, 0, n, 4096, &bad) && bad == 0);

    /* a piece at an offset is that part of the whole pattern; a piece one
     * word off (a shifted copy) does not match */
    fp_copy_pattern_fill(buf, 4096, 100);
    for (size_t i = 0; i < 100; ++i) CHECK(buf[i] == fp_copy_pattern_byte(4096 + i));
    CHECK(fp_copy_pattern_check(buf, 4096, 100, 0, NULL));
    CHECK(!fp_copy_pattern_check(buf, 4104, 100, 0, &bad) && bad == 4104);
    free(buf);
}

int main(void) {
    test_names();
    test_pattern();
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    if (!ctx) TEST_END();
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.warmup = 1;
    cfg.min_samples = 3;
    cfg.max_samples = 20;
    cfg.max_time_s = 0.05;
    test_every_kind(ctx, &cfg);
    test_bad_input(ctx, &cfg);
    fp_context_destroy(ctx);
    TEST_END();
}
