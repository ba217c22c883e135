/* Inline f16/bf16 <-> f32 conversions (round-to-nearest-even, NaN/Inf kept)
 * and dtype-generic element access for host code in hot loops. The public
 * fp_f16_to_f32() & co. in core.h are these, out of line. */
#ifndef FASTPATH_HALF_H
#define FASTPATH_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fastpath/core.h"

static inline float fp_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f); /* zero or subnormal: mant * 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((exp + 112u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t fp_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, mant = x & 0x7fffffu;
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

static inline float fp_b2f(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline uint16_t fp_f2b(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* fp8 e4m3 ("e4m3fn", OCP FP8 / PTX .e4m3): sign, 4 exponent bits (bias 7),
 * 3 mantissa bits; no infinity, S.1111.111 is NaN, the largest finite value
 * 448, subnormals m * 2^-9. fp_e4m3_to_f32 is exact; fp_f2e4m3 rounds to
 * nearest even and saturates to +-448 (infinities included), NaN -> 0x7f
 * with the sign kept: PTX's cvt.rn.satfinite.e4m3x2.f32. */
static inline float fp_e4m3_to_f32(uint8_t v) {
    const int e = (v >> 3) & 0xf, m = v & 7;
    float f;
    if (e == 15 && m == 7) f = NAN;
    else if (e == 0) f = ldexpf((float)m, -9);
    else f = ldexpf((float)(8 + m), e - 10);
    return (v & 0x80u) ? -f : f;
}

static inline uint8_t fp_f2e4m3(float f) {
    const uint8_t sign = signbit(f) ? 0x80u : 0;
    float a = fabsf(f);
    if (a != a) return (uint8_t)(sign | 0x7fu);
    if (a >= 448.0f) return (uint8_t)(sign | 0x7eu);
    if (a < 0.015625f) return (uint8_t)(sign | (uint8_t)rintf(a * 512.0f)); /* below 2^-6: 8 -> 2^-6 itself */
    int e;
    (void)frexpf(a, &e); /* a = f 2^e, f in [0.5, 1): a in [2^(e-1), 2^e) */
    int q = (int)rintf((ldexpf(a, 1 - e) - 1.0f) * 8.0f), ue = e - 1;
    if (q == 8) { q = 0; ++ue; }
    unsigned code = (unsigned)(ue + 7) << 3 | (unsigned)q;
    if (code > 0x7eu) code = 0x7eu;
    return (uint8_t)(sign | code);
}

/* Element i of an f32/f16/bf16 array as f32, and stored from f32. */
static inline float fp_load_f32(const void *p, fp_dtype dt, size_t i) {
    switch (dt) {
    case FP_F16: return fp_h2f(((const uint16_t *)p)[i]);
    case FP_BF16: return fp_b2f(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline void fp_store_f32(void *p, fp_dtype dt, size_t i, float v) {
    switch (dt) {
    case FP_F16: ((uint16_t *)p)[i] = fp_f2h(v); break;
    case FP_BF16: ((uint16_t *)p)[i] = fp_f2b(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* v rounded to dtype and back (what storing and reloading would give). */
static inline float fp_round_to(fp_dtype dt, float v) {
    switch (dt) {
    case FP_F16: return fp_h2f(fp_f2h(v));
    case FP_BF16: return fp_b2f(fp_f2b(v));
    default: return v;
    }
}

#endif /* FASTPATH_HALF_H */
