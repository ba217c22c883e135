/* fp_compare: numerical agreement of two arrays in context memory
 * (downloaded, then fp_compare_host). */
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"
#include "fastpath/timing.h"

fp_status fp_compare(fp_context *ctx, const void *ref, const void *got, size_t n, fp_dtype dtype,
                     double atol, double rtol, fp_compare_result *out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    if (ctx->kind == FP_DEVICE_CPU) return fp_compare_host(ref, got, n, dtype, atol, rtol, out);
    FP_CHECK_NOT_NULL(ref);
    FP_CHECK_NOT_NULL(got);
    FP_CHECK_NOT_NULL(out);
    const size_t elt = fp_dtype_size(dtype);
    FP_CHECK_ARG(elt > 0, "dtype %d unknown", (int)dtype);
    FP_CHECK_ARG(n <= SIZE_MAX / elt, "argument 'n' (%zu) times the element size overflows", n);
    size_t bytes = n * elt;
    void *h_ref = malloc(bytes ? bytes : 1), *h_got = malloc(bytes ? bytes : 1);
    fp_status st = FP_OK;
    if (!h_ref || !h_got) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "%zu bytes for comparison", bytes);
    if (st == FP_OK) st = fp_mem_download(ctx, h_ref, ref, bytes, NULL);
    if (st == FP_OK) st = fp_mem_download(ctx, h_got, got, bytes, NULL);
    if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
    if (st == FP_OK) st = fp_compare_host(h_ref, h_got, n, dtype, atol, rtol, out);
    free(h_ref);
    free(h_got);
    return st;
}
