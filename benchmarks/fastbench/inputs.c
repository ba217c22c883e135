/* Random inputs for scenarios (see scenario.h). */
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"
#include "scenario.h"

#define FB_CHUNK_BYTES ((size_t)8 << 20)

fp_status fb_fill_random(fp_context *ctx, void *dst, size_t n, fp_dtype dt, uint64_t seed, float lo,
                         float hi) {
    const size_t elt = fp_dtype_size(dt);
    if (elt == 0) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fb_fill_random: unknown dtype %d", (int)dt);
    /* n * elt wrapping would upload n elements' worth of chunks past dst. */
    if (n > SIZE_MAX / elt)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fb_fill_random: %zu elements of %s overflow size_t", n,
                            fp_dtype_name(dt));
    const size_t bytes = n * elt;
    size_t chunk_n = (bytes < FB_CHUNK_BYTES ? bytes : FB_CHUNK_BYTES) / elt;
    if (chunk_n == 0) return FP_OK;
    float *h = malloc(chunk_n * sizeof *h);
    void *hd = malloc(chunk_n * elt);
    fp_status st = (h && hd) ? FP_OK
                             : fp_set_error(FP_ERR_OUT_OF_MEMORY, "fb_fill_random: %zu-element host chunk", chunk_n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7; /* xorshift64* */
    for (size_t i = 0; st == FP_OK && i < chunk_n; ++i) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        float u = (float)((s * 0x2545F4914F6CDD1DULL) >> 40) / (float)(1 << 24);
        float v = lo + (hi - lo) * u;
        h[i] = v == 0.0f ? 0.5f * (lo + hi) + 1e-3f : v;
    }
    if (st == FP_OK) st = fp_convert_host(h, FP_F32, hd, dt, chunk_n);
    for (size_t off = 0; st == FP_OK && off < n; off += chunk_n) {
        size_t cnt = n - off < chunk_n ? n - off : chunk_n;
        st = fp_mem_upload(ctx, (char *)dst + off * elt, hd, cnt * elt, NULL);
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL); /* the host chunk is reused */
    }
    free(h);
    free(hd);
    return st;
}

fp_status fb_alloc_random(fp_context *ctx, size_t n, fp_dtype dt, uint64_t seed, float lo, float hi,
                          void **out) {
    *out = NULL;
    void *p = NULL;
    const size_t elt = fp_dtype_size(dt);
    if (elt == 0) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fb_alloc_random: unknown dtype %d", (int)dt);
    if (n > SIZE_MAX / elt)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "fb_alloc_random: %zu elements of %s overflow size_t", n,
                            fp_dtype_name(dt));
    fp_status st = fp_mem_alloc(ctx, n * elt, &p);
    if (st == FP_OK) st = fb_fill_random(ctx, p, n, dt, seed, lo, hi);
    if (st != FP_OK) {
        fp_mem_free(ctx, p);
        return st;
    }
    *out = p;
    return FP_OK;
}
