/* AVX2 + FMA + F16C row kernels of the CPU fused norm (see norm_cpu_simd.h).
 *
 * One row at a time, 8 f32 lanes:
 *   forward   pass 1 loads x (+ residual, rounded to the dtype; res_out
 *             stored) into row scratch, shifted by its first element
 *             (LayerNorm), summing it; pass 2 sums the squared deviations
 *             from the mean over the scratch (two-pass: no E[x^2] - E[x]^2);
 *             pass 3 normalizes, applies gamma / beta + bias, the
 *             activation, and stores. Only pass 1 and pass 3 touch the
 *             tensors: the row scratch stays in L1 / L2.
 *   backward  pass 1: xn, act'(y), g = dout act'(y), the partial dgamma /
 *             dbeta, dn = g gamma and the two row sums; pass 2: dx.
 * The activations are the algorithms of norm_internal.h's scalar helpers
 * written on 8 lanes with FMA (same exp, same clamps), except Phi for GELU
 * erf: one branch-free erfc formula (vphi8) where the scalar helper computes
 * two; the accuracy test in tests/norm/test_norm_cpu.c holds both paths to
 * the same bounds. Conversions: F16C for f16 (RNE; its f32 -> f16 NaN rule is
 * fp_f2h's; f16 -> f32 quiets signalling NaNs, which h2f8 undoes), integer
 * RNE for bf16 (fp_f2b's); bit-exact, tested over every 16-bit input and a
 * dense f32 sweep.
 * The row tail (cols % 8) goes through an 8-element staging buffer, so the
 * same vector code computes every element. */
#include "norm/norm_cpu_simd.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

const int fp_norm_avx2_built = 1;

#define AI static inline __attribute__((always_inline))

typedef __m256 v8f;

AI v8f splat(float v) { return _mm256_set1_ps(v); }

/* ---- conversions: 8 elements ---- */

AI v8f b2f8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

/* fp_f2b on 8 lanes: x + 0x7fff + lsb, >> 16; NaN: (x >> 16) | 0x40. */
AI __m128i f2b8(v8f v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rnd = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i isnan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rnd, nan, isnan);
    /* values <= 0xffff: the signed-saturating pack keeps them; it packs per
     * 128-bit lane, so qwords 0 and 2 hold the 8 results in order */
    const __m256i p = _mm256_packus_epi32(r, r);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

/* fp_h2f on 8 lanes: F16C, except that it quiets a signalling NaN where
 * fp_h2f keeps the payload as it is: NaN lanes get fp_h2f's bits. */
AI v8f h2f8(__m128i h) {
    const v8f f = _mm256_cvtph_ps(h);
    const v8f isnan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    if (__builtin_expect(!_mm256_movemask_ps(isnan), 1)) return f; /* no NaN: the common case, 3 ops */
    const __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i nan = _mm256_or_si256(
        _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                        _mm256_set1_epi32(0x7f800000)),
        _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x3ff)), 13));
    return _mm256_blendv_ps(f, _mm256_castsi256_ps(nan), isnan);
}

AI v8f ld8(const void *p, int dt) {
    switch (dt) {
    case FP_F16: return h2f8(_mm_loadu_si128((const __m128i *)p));
    case FP_BF16: return b2f8(_mm_loadu_si128((const __m128i *)p));
    default: return _mm256_loadu_ps((const float *)p);
    }
}
/* v as the dtype's bits (16-bit dtypes) */
AI __m128i to16(v8f v, int dt) {
    return dt == FP_F16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC) : f2b8(v);
}
AI v8f from16(__m128i h, int dt) { return dt == FP_F16 ? h2f8(h) : b2f8(h); }
AI void st8(void *p, int dt, v8f v) {
    if (dt == FP_F32) _mm256_storeu_ps((float *)p, v);
    else _mm_storeu_si128((__m128i *)p, to16(v, dt));
}
/* v rounded to the dtype (what storing and reloading gives) */
AI v8f round8(v8f v, int dt) { return dt == FP_F32 ? v : from16(to16(v, dt), dt); }

/* The first m < 8 elements at p, zero-padded / stored, through a buffer. */
AI v8f ld8_tail(const void *p, int dt, int64_t m) {
    _Alignas(32) unsigned char buf[32] = {0};
    memcpy(buf, p, (size_t)m * (dt == FP_F32 ? 4u : 2u));
    return ld8(buf, dt);
}
AI void st8_tail(void *p, int dt, v8f v, int64_t m) {
    _Alignas(32) unsigned char buf[32];
    st8(buf, dt, v);
    memcpy(p, buf, (size_t)m * (dt == FP_F32 ? 4u : 2u));
}

/* ---- activations on 8 lanes (the scalar helpers' algorithms) ---- */

/* e^x, x clamped to [-87, 87] (NaN becomes -87: callers keep NaN through y) */
AI v8f vexp8(v8f x) {
    x = _mm256_min_ps(_mm256_max_ps(x, splat(-87.0f)), splat(87.0f));
    const v8f magic = splat(12582912.0f);
    const v8f t = _mm256_fmadd_ps(x, splat(1.44269504088896341f), magic);
    const v8f n = _mm256_sub_ps(t, magic);
    v8f r = _mm256_fnmadd_ps(n, splat(0.693359375f), x);
    r = _mm256_fmadd_ps(n, splat(2.12194440e-4f), r);
    v8f p = splat(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, splat(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, splat(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, splat(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, splat(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, splat(0.5f));
    p = _mm256_fmadd_ps(p, r, splat(1.0f));
    p = _mm256_fmadd_ps(p, r, splat(1.0f));
    const __m256i e = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B400000 - 127));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}
/* NaN-keeping clamps: max/min return their second operand when one is NaN */
AI v8f floor_neg(v8f y, float lim) { return _mm256_max_ps(splat(-lim), y); }
AI v8f clamp_abs(v8f y, float lim) { return _mm256_min_ps(splat(lim), _mm256_max_ps(splat(-lim), y)); }
AI v8f vabs(v8f y) { return _mm256_andnot_ps(splat(-0.0f), y); }

AI v8f vsilu8(v8f y) {
    y = floor_neg(y, 100.0f);
    return _mm256_div_ps(y, _mm256_add_ps(splat(1.0f), vexp8(_mm256_sub_ps(_mm256_setzero_ps(), y))));
}
AI v8f gelu_u(v8f y) { /* K (y + C y^3) = K y (1 + C y^2) */
    const v8f y2 = _mm256_mul_ps(y, y);
    return _mm256_mul_ps(_mm256_mul_ps(splat((float)FP_NORM_GELU_K), y),
                         _mm256_fmadd_ps(splat((float)FP_NORM_GELU_C), y2, splat(1.0f)));
}
AI v8f vgelu_tanh8(v8f y) {
    y = floor_neg(y, 20.0f);
    const v8f e = vexp8(_mm256_mul_ps(splat(-2.0f), gelu_u(y)));
    return _mm256_div_ps(y, _mm256_add_ps(splat(1.0f), e));
}
AI v8f vdsilu8(v8f y) {
    y = clamp_abs(y, 80.0f);
    const v8f e = vexp8(_mm256_sub_ps(_mm256_setzero_ps(), y));
    const v8f s = _mm256_div_ps(splat(1.0f), _mm256_add_ps(splat(1.0f), e));
    return _mm256_mul_ps(s, _mm256_fmadd_ps(y, _mm256_mul_ps(e, s), splat(1.0f)));
}
AI v8f vdgelu_tanh8(v8f y) {
    y = clamp_abs(y, 20.0f);
    const v8f e = vexp8(_mm256_mul_ps(splat(-2.0f), gelu_u(y)));
    const v8f s = _mm256_div_ps(splat(1.0f), _mm256_add_ps(splat(1.0f), e));
    const v8f q = _mm256_fmadd_ps(splat(3.0f * (float)FP_NORM_GELU_C), _mm256_mul_ps(y, y), splat(1.0f));
    const v8f t = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(splat(2.0f * (float)FP_NORM_GELU_K), y), s),
                                _mm256_mul_ps(_mm256_mul_ps(e, s), q));
    return _mm256_add_ps(s, t);
}
/* Phi(y) and *e = e^(-y^2 / 2) (0 where y^2 / 2 > 87, the exp clamp; NaN
 * kept), branch-free over the whole range in one formula (the scalar helper
 * computes two and selects; this one costs about 2/3 of that):
 * h = 0.5 erfc(|z|), z = y / sqrt(2), as e^(-z^2) Q(s), Q a degree-10 fit
 * of 0.5 erfc(z) e^(z^2) in s = 2.5208 / (1 + 0.4 z) - 1.5208 (z in
 * [0, 9.6] -> s in [-1, 1]; fit 1.4e-9 relative, weighted least squares
 * iterated toward minimax); Phi = h for y < 0 (relative accuracy in the
 * negative tail), 1 - h otherwise. y^2 = p + err exactly (err by FMA), so
 * e^(-y^2 / 2) = e^(-p / 2) (1 - err / 2) to 2e-11 relative: one exp. */
AI v8f vphi8(v8f y, v8f *e_out) {
    const v8f p = _mm256_mul_ps(y, y);
    const v8f err = _mm256_fmsub_ps(y, y, p);
    v8f e = _mm256_mul_ps(vexp8(_mm256_mul_ps(splat(-0.5f), p)), _mm256_fnmadd_ps(splat(0.5f), err, splat(1.0f)));
    e = _mm256_andnot_ps(_mm256_cmp_ps(p, splat(174.0f), _CMP_GT_OQ), e);
    *e_out = e;
    /* z capped at 10 (h = 0 from 9.3 on: e = 0): +inf gives s finite */
    const v8f az = _mm256_min_ps(_mm256_mul_ps(vabs(y), splat(0.707106781186547524f)), splat(10.0f));
    /* s = (a + b (1 + 0.4 z)) / (1 + 0.4 z) with a + b = 1: no cancellation */
    const v8f sv = _mm256_div_ps(_mm256_fnmadd_ps(splat(0.608333349f), az, splat(1.0f)),
                                 _mm256_fmadd_ps(splat(0.4f), az, splat(1.0f)));
    v8f q = splat(-1.8954014e-06f);
    q = _mm256_fmadd_ps(q, sv, splat(2.05239644e-06f));
    q = _mm256_fmadd_ps(q, sv, splat(2.91758352e-05f));
    q = _mm256_fmadd_ps(q, sv, splat(-3.43083157e-05f));
    q = _mm256_fmadd_ps(q, sv, splat(-0.000443008961f));
    q = _mm256_fmadd_ps(q, sv, splat(1.13105343e-05f));
    q = _mm256_fmadd_ps(q, sv, splat(0.00834450033f));
    q = _mm256_fmadd_ps(q, sv, splat(0.0397568792f));
    q = _mm256_fmadd_ps(q, sv, splat(0.106918462f));
    q = _mm256_fmadd_ps(q, sv, splat(0.195650086f));
    q = _mm256_fmadd_ps(q, sv, splat(0.149766758f));
    const v8f h = _mm256_mul_ps(e, q);
    const v8f neg = _mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_sub_ps(splat(1.0f), h), h, neg);
}
/* GELU erf y Phi(y), y below -20 taken as -20 (-0 to float precision: so
 * -inf gives -0, not -inf * 0); its derivative with |y| <= 20. */
AI v8f vgelu_erf8(v8f y) {
    y = floor_neg(y, 20.0f);
    v8f e;
    return _mm256_mul_ps(y, vphi8(y, &e));
}
AI v8f vdgelu_erf8(v8f y) {
    y = clamp_abs(y, 20.0f);
    v8f e;
    const v8f phi = vphi8(y, &e);
    return _mm256_fmadd_ps(_mm256_mul_ps(y, e), splat(0.398942280401432678f), phi);
}

AI v8f act8(v8f y, int act) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF: return vgelu_erf8(y);
    case FP_NORM_ACT_GELU_TANH: return vgelu_tanh8(y);
    case FP_NORM_ACT_RELU: return _mm256_max_ps(y, _mm256_setzero_ps()); /* NaN -> 0, as y > 0 ? y : 0 */
    case FP_NORM_ACT_SILU: return vsilu8(y);
    default: return y;
    }
}
AI v8f dact8(v8f y, int act) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF: return vdgelu_erf8(y);
    case FP_NORM_ACT_GELU_TANH: return vdgelu_tanh8(y);
    case FP_NORM_ACT_RELU: return _mm256_and_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GT_OQ), splat(1.0f));
    case FP_NORM_ACT_SILU: return vdsilu8(y);
    default: return splat(1.0f);
    }
}

AI float hsum8(v8f v) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* ======================================================================== */
/*  Forward row                                                             */
/* ======================================================================== */

/* Pass 1 on 8 elements at j: s = round(x + res) (stored to res_out), minus
 * the shift k; stored to the scratch and returned for the sum. */
AI v8f fwd_sum8(const char *x, const char *rs, char *ro, float *s, v8f kv, int64_t j, size_t es, const int dt,
                const int layer, const int has_res) {
    v8f v = ld8(x + (size_t)j * es, dt);
    if (has_res) v = round8(_mm256_add_ps(v, ld8(rs + (size_t)j * es, dt)), dt);
    if (ro) st8(ro + (size_t)j * es, dt, v);
    if (layer) v = _mm256_sub_ps(v, kv);
    _mm256_storeu_ps(s + j, v);
    return v;
}

/* dt, act and the optional pointers' presence are compile-time constants in
 * each instantiation below (the switch in fp_norm_avx2_fwd_row), so the
 * inner loops carry no dtype / activation branches. */
AI void fwd_row_t(const fp_norm_fwd_desc *d, int64_t r, float *s, const float *g, const float *b, const int dt,
                  const int act, const int layer, const int has_res) {
    const int64_t n = d->cols, nv = n & ~(int64_t)7;
    const size_t es = dt == FP_F32 ? 4 : 2;
    const char *x = (const char *)d->x + (size_t)r * (size_t)d->x_stride * es;
    const char *rs = has_res ? (const char *)d->res + (size_t)r * (size_t)d->res_stride * es : NULL;
    char *ro = d->res_out ? (char *)d->res_out + (size_t)r * (size_t)d->res_out_stride * es : NULL;
    char *o = (char *)d->out + (size_t)r * (size_t)d->out_stride * es;

    /* the shift: s[0] as the sum computes it */
    float k = 0.0f;
    if (layer) {
        k = fp_load_f32(x, (fp_dtype)dt, 0);
        if (has_res) k = fp_round_to((fp_dtype)dt, k + fp_load_f32(rs, (fp_dtype)dt, 0));
    }
    const v8f kv = splat(k);
    v8f acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(); /* two chains: the add latency */
    int64_t j = 0;
    for (; j + 16 <= nv; j += 16) {
        acc0 = _mm256_add_ps(acc0, fwd_sum8(x, rs, ro, s, kv, j, es, dt, layer, has_res));
        acc1 = _mm256_add_ps(acc1, fwd_sum8(x, rs, ro, s, kv, j + 8, es, dt, layer, has_res));
    }
    if (j < nv) {
        acc0 = _mm256_add_ps(acc0, fwd_sum8(x, rs, ro, s, kv, j, es, dt, layer, has_res));
        j += 8;
    }
    const int64_t m = n - nv;
    const v8f tail = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    if (m) {
        v8f v = ld8_tail(x + (size_t)j * es, dt, m);
        if (has_res) v = round8(_mm256_add_ps(v, ld8_tail(rs + (size_t)j * es, dt, m)), dt);
        if (ro) st8_tail(ro + (size_t)j * es, dt, v, m);
        if (layer) v = _mm256_sub_ps(v, kv);
        v = _mm256_and_ps(v, tail);
        _mm256_storeu_ps(s + j, v); /* scratch is padded to a multiple of 8 */
        acc0 = _mm256_add_ps(acc0, v);
    }
    const int64_t nt = nv + (m ? 8 : 0);
    const float inv_n = 1.0f / (float)n;
    float mean = 0.0f;
    if (layer) mean = hsum8(_mm256_add_ps(acc0, acc1)) * inv_n;
    /* pass 2: squared deviations (padding masked out) */
    const v8f mv = splat(mean);
    acc0 = acc1 = _mm256_setzero_ps();
    for (j = 0; j + 16 <= nv; j += 16) {
        const v8f t0 = _mm256_sub_ps(_mm256_loadu_ps(s + j), mv), t1 = _mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mv);
        acc0 = _mm256_fmadd_ps(t0, t0, acc0);
        acc1 = _mm256_fmadd_ps(t1, t1, acc1);
    }
    if (j < nv) {
        const v8f t = _mm256_sub_ps(_mm256_loadu_ps(s + j), mv);
        acc0 = _mm256_fmadd_ps(t, t, acc0);
        j += 8;
    }
    if (m) {
        const v8f t = _mm256_and_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv), tail);
        acc0 = _mm256_fmadd_ps(t, t, acc0);
    }
    const float var = hsum8(_mm256_add_ps(acc0, acc1)) * inv_n;
    const float rstd = 1.0f / sqrtf(var + d->eps);
    if (d->mean) d->mean[r] = k + mean;
    if (d->rstd) d->rstd[r] = rstd;
    /* pass 3: normalize, affine, activation, store. The transcendental
     * activations run as a loop of their own over y in the scratch: fused
     * into the normalize loop, GCC kept the row pointers and the affine
     * operands live across the activation's ~15 constants and spilled
     * (GELU erf took 2x its standalone time). */
    const v8f rv = splat(rstd);
    const int split = act == FP_NORM_ACT_GELU_ERF || act == FP_NORM_ACT_GELU_TANH || act == FP_NORM_ACT_SILU;
    /* The next row's x and residual are prefetched while this one computes
     * (pass 1 is the only one reading memory: without it the activation's
     * arithmetic and the loads never overlap). */
    const int pf = r + 1 < d->rows;
    const char *xn1 = pf ? x + (size_t)d->x_stride * es : x;
    const char *rn1 = pf && has_res ? rs + (size_t)d->res_stride * es : xn1;
    for (j = 0; j < nt; j += 8) {
        const v8f xn = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv), rv);
        const v8f y = _mm256_fmadd_ps(xn, _mm256_loadu_ps(g + j), _mm256_loadu_ps(b + j));
        if (split) {
            _mm256_storeu_ps(s + j, y);
            continue;
        }
        if (pf) {
            _mm_prefetch(xn1 + (size_t)j * es, _MM_HINT_T0);
            _mm_prefetch(rn1 + (size_t)j * es, _MM_HINT_T0);
        }
        if (j < nv) st8(o + (size_t)j * es, dt, act8(y, act));
        else st8_tail(o + (size_t)j * es, dt, act8(y, act), m);
    }
    if (split)
        for (j = 0; j < nt; j += 8) {
            if (pf) {
                _mm_prefetch(xn1 + (size_t)j * es, _MM_HINT_T0);
                _mm_prefetch(rn1 + (size_t)j * es, _MM_HINT_T0);
            }
            const v8f y = act8(_mm256_loadu_ps(s + j), act);
            if (j < nv) st8(o + (size_t)j * es, dt, y);
            else st8_tail(o + (size_t)j * es, dt, y, m);
        }
}

#define FWD_ACTS(dt, layer, has_res)                                                          \
    switch (d->act) {                                                                         \
    case FP_NORM_ACT_GELU_ERF: fwd_row_t(d, r, s, g, b, dt, FP_NORM_ACT_GELU_ERF, layer, has_res); break; \
    case FP_NORM_ACT_GELU_TANH: fwd_row_t(d, r, s, g, b, dt, FP_NORM_ACT_GELU_TANH, layer, has_res); break; \
    case FP_NORM_ACT_RELU: fwd_row_t(d, r, s, g, b, dt, FP_NORM_ACT_RELU, layer, has_res); break; \
    case FP_NORM_ACT_SILU: fwd_row_t(d, r, s, g, b, dt, FP_NORM_ACT_SILU, layer, has_res); break; \
    default: fwd_row_t(d, r, s, g, b, dt, FP_NORM_ACT_NONE, layer, has_res); break;           \
    }
#define FWD_KIND(dt)                                              \
    do {                                                          \
        if (d->kind == FP_NORM_LAYERNORM) {                       \
            if (d->res) { FWD_ACTS(dt, 1, 1) } else { FWD_ACTS(dt, 1, 0) } \
        } else {                                                  \
            if (d->res) { FWD_ACTS(dt, 0, 1) } else { FWD_ACTS(dt, 0, 0) } \
        }                                                         \
    } while (0)

void fp_norm_avx2_fwd_row(const fp_norm_fwd_desc *d, int64_t r, float *s, const float *g, const float *b) {
    switch (d->dtype) {
    case FP_F16: FWD_KIND(FP_F16); break;
    case FP_BF16: FWD_KIND(FP_BF16); break;
    default: FWD_KIND(FP_F32); break;
    }
}

/* ======================================================================== */
/*  Backward row                                                            */
/* ======================================================================== */

AI void bwd_row_t(const fp_norm_bwd_desc *d, int64_t r, float *xn_s, float *dn_s, const float *g, const float *sh,
                  float *pg, float *pb, const int dt, const int act, const int layer) {
    const int64_t n = d->cols, nv = n & ~(int64_t)7, m = n - nv, nt = nv + (m ? 8 : 0);
    const size_t es = dt == FP_F32 ? 4 : 2;
    const char *x = (const char *)d->x + (size_t)r * (size_t)d->x_stride * es;
    const char *dy = (const char *)d->dout + (size_t)r * (size_t)d->dout_stride * es;
    const char *dr = d->dres ? (const char *)d->dres + (size_t)r * (size_t)d->dres_stride * es : NULL;
    char *dx = (char *)d->dx + (size_t)r * (size_t)d->dx_stride * es;
    const v8f mv = splat(layer && d->mean ? d->mean[r] : 0.0f), rv = splat(d->rstd[r]);
    v8f sdn = _mm256_setzero_ps(), sdnn = _mm256_setzero_ps();
    /* pass 1. The tail's padding reads dout = 0, so g = 0 there and it adds
     * nothing to the sums or the partials (xn and act'(y) stay finite: g = 1
     * and sh = 0 in the padding). A transcendental act'(y) is first computed
     * into dn_s by a loop of its own (fused, GCC spilled: see the forward). */
    const int split = act == FP_NORM_ACT_GELU_ERF || act == FP_NORM_ACT_GELU_TANH || act == FP_NORM_ACT_SILU;
    if (split) {
        for (int64_t j = 0; j < nt; j += 8) {
            const v8f xv = j < nv ? ld8(x + (size_t)j * es, dt) : ld8_tail(x + (size_t)j * es, dt, m);
            const v8f xn = _mm256_mul_ps(_mm256_sub_ps(xv, mv), rv);
            _mm256_storeu_ps(xn_s + j, xn);
            _mm256_storeu_ps(dn_s + j, _mm256_fmadd_ps(xn, _mm256_loadu_ps(g + j), _mm256_loadu_ps(sh + j)));
        }
        /* the next row's inputs prefetched under the arithmetic (as in the
         * forward) */
        const int pf = r + 1 < d->rows;
        const char *x1 = pf ? x + (size_t)d->x_stride * es : x;
        const char *dy1 = pf ? dy + (size_t)d->dout_stride * es : x;
        const char *dr1 = pf && dr ? dr + (size_t)d->dres_stride * es : x1;
        for (int64_t j = 0; j < nt; j += 8) {
            if (pf) {
                _mm_prefetch(x1 + (size_t)j * es, _MM_HINT_T0);
                _mm_prefetch(dy1 + (size_t)j * es, _MM_HINT_T0);
                _mm_prefetch(dr1 + (size_t)j * es, _MM_HINT_T0);
            }
            _mm256_storeu_ps(dn_s + j, dact8(_mm256_loadu_ps(dn_s + j), act));
        }
    }
    for (int64_t j = 0; j < nt; j += 8) {
        const int full = j < nv;
        v8f gr = full ? ld8(dy + (size_t)j * es, dt) : ld8_tail(dy + (size_t)j * es, dt, m);
        const v8f gv = _mm256_loadu_ps(g + j);
        v8f xn;
        if (split) {
            xn = _mm256_loadu_ps(xn_s + j);
            gr = _mm256_mul_ps(gr, _mm256_loadu_ps(dn_s + j));
        } else {
            const v8f xv = full ? ld8(x + (size_t)j * es, dt) : ld8_tail(x + (size_t)j * es, dt, m);
            xn = _mm256_mul_ps(_mm256_sub_ps(xv, mv), rv);
            if (act != FP_NORM_ACT_NONE)
                gr = _mm256_mul_ps(gr, dact8(_mm256_fmadd_ps(xn, gv, _mm256_loadu_ps(sh + j)), act));
            _mm256_storeu_ps(xn_s + j, xn);
        }
        _mm256_storeu_ps(pg + j, _mm256_fmadd_ps(gr, xn, _mm256_loadu_ps(pg + j)));
        _mm256_storeu_ps(pb + j, _mm256_add_ps(_mm256_loadu_ps(pb + j), gr));
        const v8f dn = _mm256_mul_ps(gr, gv);
        _mm256_storeu_ps(dn_s + j, dn);
        sdn = _mm256_add_ps(sdn, dn);
        sdnn = _mm256_fmadd_ps(dn, xn, sdnn);
    }
    const float inv_n = 1.0f / (float)n;
    const v8f a = splat(layer ? hsum8(sdn) * inv_n : 0.0f), bb = splat(hsum8(sdnn) * inv_n);
    /* pass 2: dx = rstd (dn - a - xn b) (+ dres) */
    for (int64_t j = 0; j < nt; j += 8) {
        const int full = j < nv;
        v8f v = _mm256_sub_ps(_mm256_loadu_ps(dn_s + j), a);
        v = _mm256_mul_ps(rv, _mm256_fnmadd_ps(_mm256_loadu_ps(xn_s + j), bb, v));
        if (dr) v = _mm256_add_ps(v, full ? ld8(dr + (size_t)j * es, dt) : ld8_tail(dr + (size_t)j * es, dt, m));
        if (full) st8(dx + (size_t)j * es, dt, v);
        else st8_tail(dx + (size_t)j * es, dt, v, m);
    }
}

#define BWD_ACTS(dt, layer)                                                                   \
    switch (d->act) {                                                                         \
    case FP_NORM_ACT_GELU_ERF: bwd_row_t(d, r, xn, dn, g, sh, pg, pb, dt, FP_NORM_ACT_GELU_ERF, layer); break; \
    case FP_NORM_ACT_GELU_TANH: bwd_row_t(d, r, xn, dn, g, sh, pg, pb, dt, FP_NORM_ACT_GELU_TANH, layer); break; \
    case FP_NORM_ACT_RELU: bwd_row_t(d, r, xn, dn, g, sh, pg, pb, dt, FP_NORM_ACT_RELU, layer); break; \
    case FP_NORM_ACT_SILU: bwd_row_t(d, r, xn, dn, g, sh, pg, pb, dt, FP_NORM_ACT_SILU, layer); break; \
    default: bwd_row_t(d, r, xn, dn, g, sh, pg, pb, dt, FP_NORM_ACT_NONE, layer); break;    \
    }
#define BWD_KIND(dt)                                                      \
    do {                                                                  \
        if (d->kind == FP_NORM_LAYERNORM) { BWD_ACTS(dt, 1) } else { BWD_ACTS(dt, 0) } \
    } while (0)

void fp_norm_avx2_bwd_row(const fp_norm_bwd_desc *d, int64_t r, float *xn, float *dn, const float *g,
                          const float *sh, float *pg, float *pb) {
    switch (d->dtype) {
    case FP_F16: BWD_KIND(FP_F16); break;
    case FP_BF16: BWD_KIND(FP_BF16); break;
    default: BWD_KIND(FP_F32); break;
    }
}

/* ======================================================================== */
/*  Row helpers for the tests                                               */
/* ======================================================================== */

AI void act_row_t(float *v, int64_t n, const int act, const int deriv) {
    const int64_t nv = n & ~(int64_t)7;
    int64_t j = 0;
    for (; j < nv; j += 8) {
        const v8f y = _mm256_loadu_ps(v + j);
        _mm256_storeu_ps(v + j, deriv ? dact8(y, act) : act8(y, act));
    }
    if (n > nv) {
        const v8f y = ld8_tail(v + j, FP_F32, n - nv);
        st8_tail(v + j, FP_F32, deriv ? dact8(y, act) : act8(y, act), n - nv);
    }
}

void fp_norm_avx2_act_row(int act, int deriv, float *v, int64_t n) {
#define ACT_CASE(a)                                  \
    case a:                                          \
        if (deriv) act_row_t(v, n, a, 1);            \
        else act_row_t(v, n, a, 0);                  \
        break;
    switch (act) {
        ACT_CASE(FP_NORM_ACT_GELU_ERF)
        ACT_CASE(FP_NORM_ACT_GELU_TANH)
        ACT_CASE(FP_NORM_ACT_RELU)
        ACT_CASE(FP_NORM_ACT_SILU)
        ACT_CASE(FP_NORM_ACT_NONE)
    default: break;
    }
#undef ACT_CASE
}

AI void load_row_t(float *dst, const void *src, int64_t n, const int dt) {
    const size_t es = dt == FP_F32 ? 4 : 2;
    const int64_t nv = n & ~(int64_t)7;
    int64_t j = 0;
    for (; j < nv; j += 8) _mm256_storeu_ps(dst + j, ld8((const char *)src + (size_t)j * es, dt));
    if (n > nv) st8_tail(dst + j, FP_F32, ld8_tail((const char *)src + (size_t)j * es, dt, n - nv), n - nv);
}
AI void store_row_t(void *dst, const float *src, int64_t n, const int dt) {
    const size_t es = dt == FP_F32 ? 4 : 2;
    const int64_t nv = n & ~(int64_t)7;
    int64_t j = 0;
    for (; j < nv; j += 8) st8((char *)dst + (size_t)j * es, dt, _mm256_loadu_ps(src + j));
    if (n > nv) st8_tail((char *)dst + (size_t)j * es, dt, ld8_tail(src + j, FP_F32, n - nv), n - nv);
}

void fp_norm_avx2_load_row(float *dst, const void *src, int dt, int64_t n) {
    switch (dt) {
    case FP_F16: load_row_t(dst, src, n, FP_F16); break;
    case FP_BF16: load_row_t(dst, src, n, FP_BF16); break;
    default: load_row_t(dst, src, n, FP_F32); break;
    }
}
void fp_norm_avx2_store_row(void *dst, int dt, const float *src, int64_t n) {
    switch (dt) {
    case FP_F16: store_row_t(dst, src, n, FP_F16); break;
    case FP_BF16: store_row_t(dst, src, n, FP_BF16); break;
    default: store_row_t(dst, src, n, FP_F32); break;
    }
}

#else /* no AVX2 build: the portable path only */

const int fp_norm_avx2_built = 0;

void fp_norm_avx2_fwd_row(const fp_norm_fwd_desc *d, int64_t r, float *s, const float *g, const float *b) {
    (void)d, (void)r, (void)s, (void)g, (void)b;
}
void fp_norm_avx2_bwd_row(const fp_norm_bwd_desc *d, int64_t r, float *xn, float *dn, const float *g,
                          const float *sh, float *pg, float *pb) {
    (void)d, (void)r, (void)xn, (void)dn, (void)g, (void)sh, (void)pg, (void)pb;
}
void fp_norm_avx2_act_row(int act, int deriv, float *v, int64_t n) { (void)act, (void)deriv, (void)v, (void)n; }
void fp_norm_avx2_load_row(float *dst, const void *src, int dt, int64_t n) { (void)dst, (void)src, (void)dt, (void)n; }
void fp_norm_avx2_store_row(void *dst, int dt, const float *src, int64_t n) { (void)dst, (void)dt, (void)src, (void)n; }

#endif
