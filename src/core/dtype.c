/* dtype names and host-side f16/bf16 conversions (round-to-nearest-even). */
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "half.h"
#include "internal.h"

size_t fp_dtype_size(fp_dtype dtype) {
    switch (dtype) {
    case FP_F32: return 4;
    case FP_F16: case FP_BF16: return 2;
    case FP_FP8_E4M3: case FP_FP8_E5M2: return 1;
    }
    return 0;
}

const char *fp_dtype_name(fp_dtype dtype) {
    switch (dtype) {
    case FP_F32: return "f32";
    case FP_F16: return "f16";
    case FP_BF16: return "bf16";
    case FP_FP8_E4M3: return "fp8e4m3";
    case FP_FP8_E5M2: return "fp8e5m2";
    }
    return "unknown";
}

fp_status fp_dtype_parse(const char *name, fp_dtype *out) {
    FP_CHECK_NOT_NULL(name);
    FP_CHECK_NOT_NULL(out);
    static const struct { const char *name; fp_dtype dtype; } names[] = {
        {"f32", FP_F32},       {"float32", FP_F32},  {"float", FP_F32},
        {"f16", FP_F16},       {"float16", FP_F16},  {"half", FP_F16},   {"fp16", FP_F16},
        {"bf16", FP_BF16},     {"bfloat16", FP_BF16},
        {"fp8e4m3", FP_FP8_E4M3}, {"fp8e5m2", FP_FP8_E5M2},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
        if (strcasecmp(name, names[i].name) == 0) {
            *out = names[i].dtype;
            return FP_OK;
        }
    }
    return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                        "unknown dtype '%s' (expected f32, f16 or bf16)", name);
}

float fp_f16_to_f32(uint16_t h) { return fp_h2f(h); }
uint16_t fp_f32_to_f16(float f) { return fp_f2h(f); }
float fp_bf16_to_f32(uint16_t b) { return fp_b2f(b); }
uint16_t fp_f32_to_bf16(float f) { return fp_f2b(f); }

static int convertible(fp_dtype d) { return d == FP_F32 || d == FP_F16 || d == FP_BF16; }

fp_status fp_convert_host(const void *src, fp_dtype src_dtype, void *dst, fp_dtype dst_dtype,
                          size_t n) {
    FP_CHECK_NOT_NULL(src);
    FP_CHECK_NOT_NULL(dst);
    FP_CHECK_ARG(convertible(src_dtype), "src_dtype %d is not f32, f16 or bf16", (int)src_dtype);
    FP_CHECK_ARG(convertible(dst_dtype), "dst_dtype %d is not f32, f16 or bf16", (int)dst_dtype);
    /* n * 4 must not wrap: a wrapped byte count would copy a few bytes and
     * report success (or run the element loop far past both buffers). */
    FP_CHECK_ARG(n <= SIZE_MAX / 4, "argument 'n' (%zu) is too large: n * element size overflows", n);
    if (src_dtype == dst_dtype) {
        memmove(dst, src, n * fp_dtype_size(src_dtype));
        return FP_OK;
    }
    for (size_t i = 0; i < n; ++i) fp_store_f32(dst, dst_dtype, i, fp_load_f32(src, src_dtype, i));
    return FP_OK;
}
