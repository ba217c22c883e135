/* The CPU attention's elementwise kernels: tile loads (bf16 / f16 / fp8 e4m3
 * -> f32), output stores (f32 -> bf16 / f16), the row max and the online-softmax exponentials. Each has a portable C
 * version and, on x86-64 with GCC or Clang, an AVX2 + FMA (+ F16C) version
 * compiled with a target attribute (the rest of the build stays baseline
 * x86-64) and chosen at run time by the CPU's feature bits. Both versions
 * use the same exp2 approximation, tested against exp2() in double by
 * tests/attention/test_attention_cpu_impls.c. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention/attention_internal.h"
#include "half.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FP_ATTN_X86_SIMD 1
#else
#define FP_ATTN_X86_SIMD 0
#endif

/* 2^f on f in [-0.5, 0.5]: the Taylor series of e^(f ln 2) to degree 7
 * (c_k = ln2^k / k!). Truncation error below (0.347^8 / 8!) ~ 5e-9; the
 * float Horner steps add a few ulp. */
#define E2_C1 0.6931471805599453f
#define E2_C2 0.2402265069591007f
#define E2_C3 0.055504108664821576f
#define E2_C4 0.009618129107628477f
#define E2_C5 0.0013333558146428441f
#define E2_C6 0.00015403530393381606f
#define E2_C7 1.5252733804059838e-05f
/* Inputs below this give exactly 0 (2^-127 is below the smallest normal;
 * -inf, the masked scores, lands here too). */
#define E2_MIN (-127.0f)

/* 2^x for x <= 0 (x = -inf gives 0, NaN gives NaN: a NaN or +inf score
 * must not read as a masked one): x = n + f with n = round(x), 2^n built in
 * the exponent bits (n + 127 = 0 gives the float 0). */
static inline float exp2_neg_scalar(float x) {
    if (x != x) return x; /* before the float -> int conversion, undefined for NaN */
    x = x > E2_MIN ? x : E2_MIN;
    const float n = rintf(x), f = x - n;
    float p = E2_C7;
    p = p * f + E2_C6;
    p = p * f + E2_C5;
    p = p * f + E2_C4;
    p = p * f + E2_C3;
    p = p * f + E2_C2;
    p = p * f + E2_C1;
    p = p * f + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    return p * s;
}

static float row_max_scalar(const float *s, int n) {
    float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int j = 0;
    for (; j + 4 <= n; j += 4)
        for (int x = 0; x < 4; ++x) m[x] = s[j + x] > m[x] ? s[j + x] : m[x];
    for (; j < n; ++j) m[0] = s[j] > m[0] ? s[j] : m[0];
    const float a = m[0] > m[1] ? m[0] : m[1], b = m[2] > m[3] ? m[2] : m[3];
    return a > b ? a : b;
}

static float exp2_sum_scalar(float *s, int n, float mx) {
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
        s[j] = exp2_neg_scalar(s[j] - mx);
        sum += s[j];
    }
    return sum;
}

/* fp8 e4m3 -> f32 for all 256 codes, a constant table (no initialization
 * to race on): S.EEEE.MMM is (8 + M) 2^(E - 10) for E > 0, M 2^-9 for E = 0
 * (subnormals), NaN for S.1111.111 (e4m3fn has no infinity). Checked
 * against half.h's fp_e4m3_to_f32 for every code by
 * tests/attention/test_attention_fp8.c. */
#define E4M3_POS(c)                                                                                  \
    (((c) & 0x7f) == 0x7f ? NAN                                                                      \
     : ((c) & 0x78)       ? (float)(8 + ((c) & 7)) * (float)(1u << (((c) >> 3) & 15)) / 1024.0f     \
                          : (float)((c) & 7) / 512.0f)
#define E4M3(c) ((c) & 0x80 ? -E4M3_POS(c) : E4M3_POS(c))
#define E4M3_4(c) E4M3(c), E4M3((c) + 1), E4M3((c) + 2), E4M3((c) + 3)
#define E4M3_16(c) E4M3_4(c), E4M3_4((c) + 4), E4M3_4((c) + 8), E4M3_4((c) + 12)
#define E4M3_64(c) E4M3_16(c), E4M3_16((c) + 16), E4M3_16((c) + 32), E4M3_16((c) + 48)
static const float e4m3_f32[256] = {E4M3_64(0), E4M3_64(64), E4M3_64(128), E4M3_64(192)};

static void cvt_f16_scalar(const uint16_t *src, int n, float *dst) {
    for (int i = 0; i < n; ++i) dst[i] = fp_h2f(src[i]);
}

/* f32 -> bf16 rounded to nearest even, NaN kept quiet: half.h's fp_f2b
 * without its branch, so the loop vectorizes. */
static void store_bf16(uint16_t *d, const float *src, int n) {
    for (int i = 0; i < n; ++i) {
        uint32_t x;
        memcpy(&x, src + i, sizeof x);
        const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, nan = (x >> 16) | 0x40u;
        d[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
    }
}

static void store_f16_scalar(uint16_t *d, const float *src, int n) {
    for (int i = 0; i < n; ++i) d[i] = fp_f2h(src[i]);
}

#if FP_ATTN_X86_SIMD
#define FP_AVX2 __attribute__((target("avx2,fma")))

FP_AVX2 static inline __m256 exp2_neg_avx2(__m256 x) {
    /* max_ps(c, -inf) = c; max_ps returns its second operand when either is
     * NaN, so a NaN x stays NaN (cvtps gives the integer indefinite, p NaN) */
    x = _mm256_max_ps(_mm256_set1_ps(E2_MIN), x);
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(E2_C7);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(E2_C6));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(E2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(E2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(E2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(E2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(E2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

FP_AVX2 static float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

FP_AVX2 static float row_max_avx2(const float *s, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
    float r = hmax256(m);
    for (; j < n; ++j) r = s[j] > r ? s[j] : r;
    return r;
}

FP_AVX2 static float exp2_sum_avx2(float *s, int n, float mx) {
    const __m256 m = _mm256_set1_ps(mx);
    __m256 acc = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 p = exp2_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
        _mm256_storeu_ps(s + j, p);
        acc = _mm256_add_ps(acc, p);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float sum = _mm_cvtss_f32(h);
    for (; j < n; ++j) {
        s[j] = exp2_neg_scalar(s[j] - mx);
        sum += s[j];
    }
    return sum;
}

__attribute__((target("avx2,f16c"))) static void cvt_f16_f16c(const uint16_t *src, int n, float *dst) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; ++i) dst[i] = fp_h2f(src[i]);
}

/* vcvtps2ph rounds to nearest even like fp_f2h (NaN payloads may differ). */
__attribute__((target("avx2,f16c"))) static void store_f16_f16c(uint16_t *d, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) d[i] = fp_f2h(src[i]);
}

static int have_avx2_fma(void) { return (fp_cpu_features() & FP_CPU_AVX2_FMA) != 0; }
static int have_f16c(void) { return (fp_cpu_features() & FP_CPU_AVX2_F16C) != 0; }
#endif

int fp_attn_simd_available(void) {
#if FP_ATTN_X86_SIMD
    return have_avx2_fma();
#else
    return 0;
#endif
}

float fp_attn_row_max(const float *s, int n, int simd) {
#if FP_ATTN_X86_SIMD
    if (simd) return row_max_avx2(s, n);
#endif
    (void)simd;
    return row_max_scalar(s, n);
}

float fp_attn_exp2_sum(float *s, int n, float mx, int simd) {
#if FP_ATTN_X86_SIMD
    if (simd) return exp2_sum_avx2(s, n, mx);
#endif
    (void)simd;
    return exp2_sum_scalar(s, n, mx);
}

void fp_attn_cvt_row(const void *base, int64_t off, fp_dtype dt, int n, float *dst) {
    switch (dt) {
    case FP_F32: memcpy(dst, (const float *)base + off, (size_t)n * sizeof(float)); break;
    case FP_F16: {
        const uint16_t *s = (const uint16_t *)base + off;
#if FP_ATTN_X86_SIMD
        if (have_f16c()) {
            cvt_f16_f16c(s, n, dst);
            break;
        }
#endif
        cvt_f16_scalar(s, n, dst);
        break;
    }
    case FP_FP8_E4M3: {
        const uint8_t *s = (const uint8_t *)base + off;
        for (int i = 0; i < n; ++i) dst[i] = e4m3_f32[s[i]];
        break;
    }
    default: { /* bf16: the top half of an f32 (vectorizes as is) */
        const uint16_t *s = (const uint16_t *)base + off;
        for (int i = 0; i < n; ++i) {
            const uint32_t u = (uint32_t)s[i] << 16;
            memcpy(dst + i, &u, sizeof u);
        }
        break;
    }
    }
}

void fp_attn_store_row(void *base, int64_t off, fp_dtype dt, int n, const float *src) {
    switch (dt) {
    case FP_F32: memcpy((float *)base + off, src, (size_t)n * sizeof(float)); break;
    case FP_F16: {
        uint16_t *d = (uint16_t *)base + off;
#if FP_ATTN_X86_SIMD
        if (have_f16c()) {
            store_f16_f16c(d, src, n);
            break;
        }
#endif
        store_f16_scalar(d, src, n);
        break;
    }
    default: store_bf16((uint16_t *)base + off, src, n); break;
    }
}

void fp_attn_store_o(const fp_attn_args *a, int64_t off, float *row) {
    const int n = a->head_dim;
    if (a->o_scale != 1.0f) /* fp8's v_descale; other dtypes are stored unchanged */
        for (int d = 0; d < n; ++d) row[d] *= a->o_scale;
    fp_attn_store_row(a->o, off, a->o_dtype, n, row);
}
