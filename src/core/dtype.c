/* dtype names and host-side f16/bf16 conversions (round-to-nearest-even). */
#include <math.h>
#include <string.h>
#include <strings.h>

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

static uint32_t f32_bits(float f) { uint32_t x; memcpy(&x, &f, 4); return x; }
static float bits_f32(uint32_t x) { float f; memcpy(&f, &x, 4); return f; }

float fp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        float v = ldexpf((float)mant, -24); /* zero or subnormal */
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t fp_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign; /* below half the smallest subnormal */
        mant |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry may reach Inf: correct */
    return (uint16_t)h;
}

float fp_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

uint16_t fp_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float load_f32(const void *p, fp_dtype dt, size_t i) {
    switch (dt) {
    case FP_F16: return fp_f16_to_f32(((const uint16_t *)p)[i]);
    case FP_BF16: return fp_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void store_f32(void *p, fp_dtype dt, size_t i, float v) {
    switch (dt) {
    case FP_F16: ((uint16_t *)p)[i] = fp_f32_to_f16(v); break;
    case FP_BF16: ((uint16_t *)p)[i] = fp_f32_to_bf16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

static int convertible(fp_dtype d) { return d == FP_F32 || d == FP_F16 || d == FP_BF16; }

fp_status fp_convert_host(const void *src, fp_dtype src_dtype, void *dst, fp_dtype dst_dtype,
                          size_t n) {
    FP_CHECK_NOT_NULL(src);
    FP_CHECK_NOT_NULL(dst);
    FP_CHECK_ARG(convertible(src_dtype), "src_dtype %d is not f32, f16 or bf16", (int)src_dtype);
    FP_CHECK_ARG(convertible(dst_dtype), "dst_dtype %d is not f32, f16 or bf16", (int)dst_dtype);
    if (src_dtype == dst_dtype) {
        memmove(dst, src, n * fp_dtype_size(src_dtype));
        return FP_OK;
    }
    for (size_t i = 0; i < n; ++i) store_f32(dst, dst_dtype, i, load_f32(src, src_dtype, i));
    return FP_OK;
}
