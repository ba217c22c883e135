/* Internals of the fused-norm capability shared by the API layer (norm.c),
 * the CPU implementations (norm_cpu.c), the double-precision reference
 * (norm_ref.c) and the tests. Not installed. */
#ifndef FP_NORM_INTERNAL_H
#define FP_NORM_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fastpath/norm.h"
#include "half.h"
#include "internal.h"
#include "norm/norm_launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks params and fills the resolved descriptor (strides never 0). Records
 * a message naming the argument on failure. */
fp_status fp_norm_check_fwd(const fp_norm_params *p, fp_norm_fwd_desc *d);
fp_status fp_norm_check_bwd(const fp_norm_backward_params *p, fp_norm_bwd_desc *d);

/* CPU implementations (synchronous; pool may be NULL: run on the caller).
 * They return FP_ERR_OUT_OF_MEMORY before writing anything if scratch cannot
 * be allocated. */
fp_status fp_norm_fwd_cpu(fp_thread_pool *pool, const fp_norm_fwd_desc *d);
fp_status fp_norm_fwd_cpu_unfused(fp_thread_pool *pool, const fp_norm_fwd_desc *d);
fp_status fp_norm_bwd_cpu(fp_thread_pool *pool, const fp_norm_bwd_desc *d);
fp_status fp_norm_bwd_cpu_unfused(fp_thread_pool *pool, const fp_norm_bwd_desc *d);

/* The numerical oracle: plain loops, double accumulation, single thread,
 * host memory. Same rounding points as the op: the sum s is rounded to the
 * dtype, everything after it is double until the final store. */
fp_status fp_norm_ref_forward(const fp_norm_fwd_desc *d);
fp_status fp_norm_ref_backward(const fp_norm_bwd_desc *d);

/* ---- scalar helpers (host) ---- */

#define FP_NORM_GELU_K 0.7978845608028654   /* sqrt(2/pi) */
#define FP_NORM_GELU_C 0.044715

/* ---- branch-free activations for the CPU fused path (vectorizable) ----
 * glibc's expf / tanhf / erff are scalar calls here (its vector variants
 * need -ffast-math), 3-17 ns each: 5-20x the rest of the fused row. These
 * are plain arithmetic with no calls or branches, so GCC vectorizes the
 * row loops (SSE2 baseline: 4 lanes). Accuracy (tests/norm/test_norm_cpu.c,
 * against double): fp_norm_vexpf within 2 ulp over the clamped range; the
 * activations and derivatives within 1e-6 relative (1e-6 absolute near the
 * derivatives' zeros; GELU erf 2e-6 near y = -sqrt(2); GELU tanh times
 * 1 + |2u|, the f32 rounding of u), saturated for huge |y| and +-inf (the
 * limits y or 0, derivatives 1 or 0), NaN kept. The AVX2 kernels
 * (norm_cpu_avx2.c) run the same algorithms on 8 lanes. The GPU kernels
 * keep CUDA's erff / tanhf / expf (kernels/norm/norm_common.cuh). */

/* e^x for x clamped to [-87, 87] (so 2^n stays a normal float: the clamp
 * only changes results below 1.7e-38 or above 6e37, where every caller
 * divides by 1 + e^x or multiplies by a tiny factor; NaN becomes 87, the
 * callers' y keeps it). Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2,
 * then the degree-7 Taylor polynomial of e^r (truncation 5e-9 relative) and
 * 2^n by the exponent bits. The clamp works on the bits: a float compare
 * keeps GCC from vectorizing the loop under -ftrapping-math (the default). */
static inline float fp_norm_vexpf(float x) {
    int32_t xb;
    memcpy(&xb, &x, sizeof xb);
    int32_t ab = xb & INT32_MAX;
    ab = ab < 0x42AE0000 ? ab : 0x42AE0000; /* |x| <= 87.0f */
    xb = (xb & INT32_MIN) | ab;
    memcpy(&x, &xb, sizeof x);
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float t = x * 1.44269504088896341f + magic;
    const float n = t - magic;
    float r = x - n * 0.693359375f;  /* ln2 high part: 9 bits, n * it exact */
    r = r + n * 2.12194440e-4f;      /* ln2 - high part = -2.12194440e-4 */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    const int32_t bits = (ti - 0x4B400000 + 127) * (1 << 23); /* (n + 127) << 23, n in [-126, 126] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* c ? a : b for c in {0, 1} as a blend of the bits: a float select whose
 * arms are computed keeps GCC from vectorizing under -ftrapping-math (it
 * sinks the arms' arithmetic into branches and then will not speculate it). */
static inline float fp_norm_vselect(int32_t c, float a, float b) {
    int32_t ab, bb;
    memcpy(&ab, &a, sizeof ab);
    memcpy(&bb, &b, sizeof bb);
    const int32_t m = -c, r = (ab & m) | (bb & ~m);
    float out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* y limited to >= -lim (lim_bits: the bits of lim > 0), or to |y| <= lim
 * keeping NaN, by integer compares on the bits (vectorizable, see above).
 * Where the activations saturate, so that e^x's clamp cannot leak into the
 * result for huge finite |y| (y / (1 + e^87) is not ~0 at y = -1e30). */
static inline float fp_norm_vfloor_neg(float y, int32_t lim_bits) {
    int32_t yb;
    memcpy(&yb, &y, sizeof yb);
    const int32_t c = (yb < 0) & ((yb & INT32_MAX) > lim_bits);
    int32_t nl = lim_bits | INT32_MIN;
    float neg_lim;
    memcpy(&neg_lim, &nl, sizeof neg_lim);
    return fp_norm_vselect(c, neg_lim, y);
}
static inline float fp_norm_vclamp_abs(float y, int32_t lim_bits) {
    int32_t yb;
    memcpy(&yb, &y, sizeof yb);
    const int32_t ab = yb & INT32_MAX;
    const int32_t c = (ab > lim_bits) & (ab <= 0x7F800000); /* inf clamps, NaN stays */
    const int32_t rb = (yb & INT32_MIN) | lim_bits;
    float r;
    memcpy(&r, &rb, sizeof r);
    return fp_norm_vselect(c, r, y);
}
#define FP_NORM_BITS_20F 0x41A00000  /* 20.0f */
#define FP_NORM_BITS_80F 0x42A00000  /* 80.0f */
#define FP_NORM_BITS_100F 0x42C80000 /* 100.0f */

/* SiLU y * sigmoid(y) = y / (1 + e^-y); y below -100 taken as -100 (both
 * ~0: |silu(-100)| < 2e-36). */
static inline float fp_norm_vsilu(float y) {
    y = fp_norm_vfloor_neg(y, FP_NORM_BITS_100F);
    return y / (1.0f + fp_norm_vexpf(-y));
}
/* GELU tanh: 0.5 y (1 + tanh(u)) = y * sigmoid(2u), u = K (y + C y^3): no
 * 1 + tanh cancellation for negative y; y below -20 taken as -20 (~0). */
static inline float fp_norm_vgelu_tanh(float y) {
    y = fp_norm_vfloor_neg(y, FP_NORM_BITS_20F);
    const float u = (float)FP_NORM_GELU_K * (y + (float)FP_NORM_GELU_C * y * y * y);
    return y / (1.0f + fp_norm_vexpf(-2.0f * u));
}
/* d SiLU / dy = s (1 + y (1 - s)), s = sigmoid(y), 1 - s = e^-y s; |y| > 80
 * taken as 80 (the derivative is 0 or 1 there to 1e-33). */
static inline float fp_norm_vdsilu(float y) {
    y = fp_norm_vclamp_abs(y, FP_NORM_BITS_80F);
    const float e = fp_norm_vexpf(-y), s = 1.0f / (1.0f + e);
    return s * (1.0f + y * (e * s));
}
/* d GELU tanh / dy = 0.5 (1 + t) + 0.5 y (1 - t^2) K (1 + 3 C y^2), t =
 * tanh(u): with s = sigmoid(2u), 1 + t = 2 s and 1 - t^2 = 4 s (1 - s),
 * 1 - s = e^-2u s. |y| > 20 taken as 20 (0 or 1 to 1e-34; y^2 cannot
 * overflow). */
static inline float fp_norm_vdgelu_tanh(float y) {
    y = fp_norm_vclamp_abs(y, FP_NORM_BITS_20F);
    const float u = (float)FP_NORM_GELU_K * (y + (float)FP_NORM_GELU_C * y * y * y);
    const float e = fp_norm_vexpf(-2.0f * u), s = 1.0f / (1.0f + e);
    return s + 2.0f * y * s * (e * s) * (float)FP_NORM_GELU_K * (1.0f + 3.0f * (float)FP_NORM_GELU_C * y * y);
}

/* Phi(y), the standard normal CDF, and *e = e^(-y^2 / 2), branch-free.
 * |y| < sqrt(2): 0.5 + 0.5 erf(y / sqrt(2)) with erf(z) = z P(z^2) (P: a
 * degree-6 least-squares fit, 8e-8 relative). Beyond: 0.5 erfc(|y| / sqrt(2))
 * (or 1 minus it) with erfc(z) = e^(-z^2) Q(t), t = 1 / (1 + z / 2) (Q: a
 * degree-10 fit in s = 4 (t - 5/12) for z in [1, 10], 3e-8 relative), so the
 * negative tail keeps its relative accuracy (1 + erf(y / sqrt(2)) in f32
 * loses it all below y = -5). e^(-y^2 / 2) from y split into 12 high bits
 * and the rest, so y^2 / 2 is carried exactly (rounded, its 81 x 6e-8
 * error at y = -13 would be the result's). */
static inline float fp_norm_vphi(float y, float *e) {
    int32_t yb;
    memcpy(&yb, &y, sizeof yb);
    const int32_t hb = yb & ~(int32_t)0xFFF;
    float yh;
    memcpy(&yh, &hb, sizeof yh);
    const float hi = 0.5f * yh * yh;           /* exact: 12-bit square */
    const float lo = 0.5f * (y - yh) * (y + yh); /* y^2 / 2 - hi, small */
    *e = fp_norm_vexpf(-hi) * fp_norm_vexpf(-lo);
    /* inner: erf(z) = z P(z^2), z = y / sqrt(2) */
    const float z = y * 0.707106781186547524f;
    const float w = fp_norm_vselect((yb & INT32_MAX) < 0x3FB504F3, z * z, 1.0f); /* outer lanes: no overflow */
    float pp = 7.847292e-05f;
    pp = pp * w - 0.00080082292f;
    pp = pp * w + 0.00518810749f;
    pp = pp * w - 0.0268536992f;
    pp = pp * w + 0.112835824f;
    pp = pp * w - 0.37612626f;
    pp = pp * w + 1.12837911f;
    const float inner = 0.5f + 0.5f * (z * pp);
    /* outer: 0.5 erfc(|z|) = 0.5 e^(-z^2) Q(t) */
    const float az = fabsf(z);
    const float t = 1.0f / (1.0f + 0.5f * az), sv = (t - 0.416666657f) * 4.0f;
    float q = -5.02051591e-08f;
    q = q * sv - 2.7097758e-07f;
    q = q * sv + 1.24513247e-06f;
    q = q * sv + 5.752996e-06f;
    q = q * sv - 2.95263071e-05f;
    q = q * sv - 0.000175178007f;
    q = q * sv + 0.000566086557f;
    q = q * sv + 0.00933131762f;
    q = q * sv + 0.0507756509f;
    q = q * sv + 0.176559672f;
    q = q * sv + 0.190548882f;
    const float half_erfc = 0.5f * *e * q;
    const float outer = fp_norm_vselect(yb < 0, half_erfc, 1.0f - half_erfc);
    return fp_norm_vselect((yb & INT32_MAX) < 0x3FB504F3, inner, outer); /* |y| < sqrt(2) */
}
/* GELU erf: y Phi(y); its derivative Phi(y) + y e^(-y^2 / 2) / sqrt(2 pi).
 * y below -20 taken as -20 (GELU 0 to float precision: -inf gives ~0, not
 * -inf * 0), and |y| > 20 as 20 in the derivative (0 or 1 there). */
static inline float fp_norm_vgelu_erf(float y) {
    float e;
    y = fp_norm_vfloor_neg(y, FP_NORM_BITS_20F);
    return y * fp_norm_vphi(y, &e);
}
static inline float fp_norm_vdgelu_erf(float y) {
    float e;
    y = fp_norm_vclamp_abs(y, FP_NORM_BITS_20F);
    const float phi = fp_norm_vphi(y, &e);
    return phi + y * e * 0.398942280401432678f;
}

#ifdef __cplusplus
}
#endif

#endif /* FP_NORM_INTERNAL_H */
