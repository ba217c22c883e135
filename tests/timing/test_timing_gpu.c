/* Timing engine pieces that need a CUDA context: fp_compare's download path.
 * Exits 77 without a GPU. */
#include <stdint.h>
#include <string.h>

#include "fp_test.h"
#include "fastpath/timing.h"

/* n * element size wraps around (to 2 bytes for f16): fp_compare must reject
 * it instead of downloading 2 bytes and then comparing n elements of them. */
static void test_compare_size_overflow(fp_context *ctx) {
    void *a = NULL, *b = NULL;
    CHECK_OK(fp_mem_alloc(ctx, 256, &a));
    CHECK_OK(fp_mem_alloc(ctx, 256, &b));
    fp_compare_result res;
    memset(&res, 0x5a, sizeof res);
    unsigned char before[sizeof res];
    memcpy(before, &res, sizeof res);
    CHECK_STATUS(fp_compare(ctx, a, b, SIZE_MAX / 2 + 2, FP_F16, -1, -1, &res), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "'n'") != NULL);
    CHECK(memcmp(before, &res, sizeof res) == 0); /* untouched on error */
    /* A sane call still works. */
    CHECK_OK(fp_mem_fill(ctx, a, 0x3c, 256, NULL));
    CHECK_OK(fp_mem_fill(ctx, b, 0x3c, 256, NULL));
    CHECK_OK(fp_compare(ctx, a, b, 128, FP_F16, -1, -1, &res));
    CHECK(res.passed && res.count == 128);
    fp_mem_free(ctx, a);
    fp_mem_free(ctx, b);
}

int main(void) {
    fp_context *ctx = fp_test_cuda_context_or_skip();
    test_compare_size_overflow(ctx);
    fp_context_destroy(ctx);
    TEST_END();
}
