/* The CPU attention implementations called directly, each against the
 * double reference: the BLIS flash path and BLIS baseline (when built with
 * BLIS) and the portable fallbacks of both (always built, so every version
 * stays tested whatever fp_attention_forward / _baseline pick). Also: the
 * exp2 approximation's max error (portable and AVX2 versions), the row max,
 * the f16 / bf16 loads and stores bit for bit, and outputs bitwise
 * independent of the number of worker threads. */
#include "attn_test_util.h"

typedef fp_status (*cpu_impl_fn)(fp_thread_pool *, const fp_attn_args *);
typedef struct cpu_impl {
    const char *name;
    cpu_impl_fn fn;
} cpu_impl;

static cpu_impl g_impls[4];
static int g_nimpl;

/* exp2 on x <= 0: relative error against exp2() in double where the result
 * is a normal float, exactly 0 below -127 (and for -inf). */
static void test_exp2(void) {
    for (int simd = 0; simd <= fp_attn_simd_available(); ++simd) {
        enum { N = 1 << 16 };
        static float x[N], y[N];
        double max_rel = 0.0;
        int zero_bad = 0;
        for (int pass = 0; pass < 24; ++pass) { /* x over [-144, 0] in steps of 2^-12 */
            for (int i = 0; i < N; ++i) x[i] = -(float)(pass * N + i) / 4096.0f;
            memcpy(y, x, sizeof x);
            (void)fp_attn_exp2_sum(y, N, 0.0f, simd);
            for (int i = 0; i < N; ++i) {
                if (x[i] < -127.0f) {
                    zero_bad += y[i] != 0.0f;
                    continue;
                }
                if (x[i] < -126.0f) continue; /* subnormal range: flushed to 0 or not */
                double ref = exp2((double)x[i]);
                double rel = fabs(y[i] - ref) / ref;
                if (rel > max_rel) max_rel = rel;
            }
        }
        float t[9] = {-INFINITY, 0.0f, -1.0f, -0.5f, -126.5f, -1e30f, -0.25f, -3.0f, -INFINITY};
        float sum = fp_attn_exp2_sum(t, 9, 0.0f, simd);
        CHECK_MSG(t[0] == 0.0f && t[8] == 0.0f && t[5] == 0.0f && t[1] == 1.0f && t[2] == 0.5f,
                  "exp2 simd %d: special values %g %g %g %g %g", simd, t[0], t[8], t[5], t[1], t[2]);
        CHECK_NEAR(sum, 1.0 + 0.5 + exp2(-0.5) + exp2(-0.25) + 0.125, 1e-6);
        /* the header promises 4e-7; the Taylor polynomial reaches ~2e-7 */
        CHECK_MSG(max_rel < 4e-7, "exp2 simd %d: max relative error %.3g", simd, max_rel);
        CHECK_MSG(zero_bad == 0, "exp2 simd %d: %d inputs below -127 not 0", simd, zero_bad);
        printf("exp2 (simd %d): max relative error %.3g on [-126, 0]\n", simd, max_rel);
        /* row max over every length and position of the maximum */
        float s[37];
        uint64_t seed = 5;
        for (int n = 1; n <= 37; ++n)
            for (int at = 0; at < n; ++at) {
                for (int i = 0; i < n; ++i) s[i] = (float)fp_test_rand_uniform(&seed, -10.0, 1.0);
                s[at] = 2.0f;
                CHECK_MSG(fp_attn_row_max(s, n, simd) == 2.0f, "row max simd %d n %d at %d", simd, n, at);
            }
        CHECK(fp_attn_row_max(s, 0, simd) == -INFINITY);
    }
}

/* fp_attn_store_row / fp_attn_cvt_row against the library's scalar
 * conversions, bit for bit (NaN only as NaN): random bit patterns (every
 * class: subnormal, overflow, inf, NaN), ties, and lengths with tails. */
static void test_conversions(void) {
    enum { N = 4099 };
    static float x[N], back[N];
    static uint16_t h[N];
    uint64_t seed = 11;
    for (int i = 0; i < N; ++i) {
        uint32_t u = (uint32_t)(fp_test_rand_uniform(&seed, 0.0, 4294967296.0));
        if (i % 7 == 0) u = (u & 0xffff0000u) | 0x8000u; /* bf16 ties */
        if (i % 11 == 0) u = (u & 0xffffe000u) | 0x1000u; /* f16 ties (normal range) */
        memcpy(&x[i], &u, sizeof u);
    }
    x[0] = INFINITY; x[1] = -INFINITY; x[2] = 65520.0f; x[3] = 5.9604645e-8f; x[4] = -0.0f;
    for (int dt = 0; dt < 2; ++dt) {
        const fp_dtype d = dt ? FP_F16 : FP_BF16;
        size_t bad = 0;
        for (int n = N; n >= N - 9; --n) {
            fp_attn_store_row(h, 0, d, n, x);
            for (int i = 0; i < n; ++i) {
                const uint16_t want = d == FP_F16 ? fp_f32_to_f16(x[i]) : fp_f32_to_bf16(x[i]);
                const float gf = d == FP_F16 ? fp_f16_to_f32(h[i]) : fp_bf16_to_f32(h[i]);
                bad += x[i] != x[i] ? gf == gf : h[i] != want;
            }
            fp_attn_cvt_row(h, 0, d, n, back);
            for (int i = 0; i < n; ++i) {
                const float want = d == FP_F16 ? fp_f16_to_f32(h[i]) : fp_bf16_to_f32(h[i]);
                bad += want != want ? back[i] == back[i] : memcmp(&want, &back[i], sizeof want) != 0;
            }
        }
        CHECK_MSG(bad == 0, "%s store/load: %zu elements differ from the scalar conversions", fp_dtype_name(d), bad);
    }
}

/* Runs impl on H (outputs poisoned first) on pool and compares. */
static void check_impl(const cpu_impl *I, const attn_case *c, attn_host *H, fp_thread_pool *pool,
                       const double *o_ref, const double *lse_ref) {
    const double atol = 2e-5, rtol = attn_eps(c->dtype) + 2e-5; /* test_attention_cpu's */
    memset(H->o, 0xFF, H->o_bytes);
    if (H->lse) memset(H->lse, 0xFF, sizeof(float) * attn_n_lse(&H->p));
    fp_attn_args a;
    CHECK_OK(fp_attn_check(&H->p, 0, &a));
    fp_status st = I->fn(pool, &a);
    CHECK_MSG(st == FP_OK, "%s/%s: %s (%s)", c->name, I->name, fp_status_string(st), fp_last_error());
    if (st != FP_OK) return;
    attn_err E = attn_compare(H, H->o, H->lse, o_ref, lse_ref, atol, rtol);
    CHECK_MSG(E.bad == 0 && E.lse_bad == 0,
              "%s/%s: %zu of %zu bad (first at %zu: %g vs %g), max abs %g, lse bad %zu (max %g)", c->name, I->name,
              E.bad, H->n_o, E.first_bad, E.first_got, E.first_ref, E.max_abs, E.lse_bad, E.lse_max_abs);
}

static void test_cases(fp_thread_pool *pool) {
    /* name, batch, sq, sk, hq, hkv, d, dtype, causal, wl, wr, scale, lse, ragged, strided */
    static const attn_case cases[] = {
        {"f32 plain", 2, 70, 200, 4, 4, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0},
        {"f32 causal gqa sq<sk", 1, 100, 300, 8, 2, 128, FP_F32, 1, -1, -1, 0, 1, 0, 0},
        {"bf16 causal sq>sk", 2, 150, 90, 2, 1, 32, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16 window lse", 1, 130, 260, 4, 2, 64, FP_F16, 0, 40, 7, 0.3f, 1, 0, 0},
        {"f32 strided", 2, 65, 129, 3, 3, 40, FP_F32, 0, -1, -1, 0, 0, 0, 1},
        {"bf16 strided causal", 1, 80, 80, 2, 2, 256, FP_BF16, 1, -1, -1, 0, 1, 0, 1},
        {"f16 ragged", 4, 33, 150, 4, 1, 16, FP_F16, 0, -1, -1, 0, 1, 1, 0},
        {"f32 decode gqa", 3, 1, 700, 8, 2, 128, FP_F32, 0, -1, -1, 0, 1, 1, 0},
        {"f32 left window only", 1, 200, 200, 2, 2, 8, FP_F32, 0, 0, -1, 0, 1, 0, 0},
        /* K + V of 2100 x 128 keys exceed the BLIS path's per-thread
         * conversion cache: bf16 tiles converted per tile, 3 query tiles */
        {"bf16 keys past the cache", 1, 130, 2100, 2, 1, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        const attn_case *c = &cases[ci];
        attn_host H;
        CHECK(attn_host_make(c, &H, 1000 + ci));
        double *o_ref = NULL, *lse_ref = NULL;
        CHECK(attn_reference(pool, &H, &o_ref, &lse_ref));
        for (int i = 0; i < g_nimpl; ++i) check_impl(&g_impls[i], c, &H, pool, o_ref, c->want_lse ? lse_ref : NULL);
        if (!c->strided && c->sq <= 100) { /* the same keys through a block table (f32 tiles converted) */
            attn_paged P;
            CHECK(attn_page(&H, 48, 1, 77 + ci, &P));
            attn_case pc = *c;
            pc.name = "paged";
            for (int i = 0; i < g_nimpl; ++i)
                check_impl(&g_impls[i], &pc, &H, pool, o_ref, c->want_lse ? lse_ref : NULL);
            attn_paged_free(&P);
        }
        free(o_ref);
        free(lse_ref);
        attn_host_free(&H);
    }
}

/* cu_seqlens: 3 sequences packed in one batch row, one with a single key. */
static void test_varlen(fp_thread_pool *pool) {
    const attn_case c = {"varlen", 1, 62, 100, 4, 2, 64, FP_BF16, 1, -1, -1, 0, 1, 0, 0};
    attn_host H;
    CHECK(attn_host_make(&c, &H, 31));
    int32_t cu_q[4] = {0, 40, 45, 62}, cu_k[4] = {0, 70, 71, 100};
    H.p.batch = 3;
    H.p.seqlen_q = 40;
    H.p.seqlen_k = 70;
    H.p.cu_seqlens_q = cu_q;
    H.p.cu_seqlens_k = cu_k;
    H.p.lse = NULL; /* sized for the one-row layout; lse is checked by the other cases */
    fp_attn_args a;
    CHECK_OK(fp_attn_check(&H.p, 0, &a));
    double *o_ref = calloc((size_t)3 * 40 * 4 * 64, sizeof(double));
    CHECK(o_ref && fp_attn_reference(pool, &a, o_ref, NULL) == FP_OK);
    for (int i = 0; i < g_nimpl; ++i) {
        memset(H.o, 0xFF, H.o_bytes);
        CHECK_OK(g_impls[i].fn(pool, &a));
        size_t bad = 0;
        for (int b = 0; b < 3; ++b) {
            fp_attn_seq S = fp_attn_seq_host(&a, b);
            for (int r = 0; r < S.sq; ++r)
                for (int h = 0; h < 4; ++h)
                    for (int x = 0; x < 64; ++x) {
                        double ref = o_ref[(((size_t)b * 40 + r) * 4 + h) * 64 + x];
                        double got = attn_load(H.o, (size_t)(S.o0 + r * a.o_ss + h * a.o_hs + x), FP_BF16);
                        bad += !(fabs(got - ref) <= 2e-5 + (attn_eps(FP_BF16) + 2e-5) * fabs(ref));
                    }
        }
        CHECK_MSG(bad == 0, "varlen/%s: %zu bad", g_impls[i].name, bad);
    }
    free(o_ref);
    attn_host_free(&H);
}

/* The same call on pools of 1, 2 and 3 threads: O and lse bit for bit. */
static void test_thread_independence(void) {
    static const attn_case cases[] = {
        {"threads bf16 causal gqa", 2, 150, 260, 8, 2, 64, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"threads f32 window", 1, 200, 333, 4, 4, 128, FP_F32, 0, 50, 10, 0, 1, 0, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        attn_host H;
        CHECK(attn_host_make(&cases[ci], &H, 500 + ci));
        const size_t lse_bytes = sizeof(float) * attn_n_lse(&H.p);
        void *o1 = malloc(H.o_bytes);
        float *l1 = malloc(lse_bytes);
        CHECK(o1 && l1);
        fp_attn_args a;
        CHECK_OK(fp_attn_check(&H.p, 0, &a));
        for (int i = 0; i < g_nimpl; ++i)
            for (int threads = 1; threads <= 3; ++threads) {
                fp_thread_pool *pool = NULL;
                CHECK_OK(fp_thread_pool_create(threads, &pool));
                memset(H.o, 0xFF, H.o_bytes);
                memset(H.lse, 0xFF, lse_bytes);
                CHECK_OK(g_impls[i].fn(pool, &a));
                fp_thread_pool_destroy(pool);
                if (threads == 1) {
                    memcpy(o1, H.o, H.o_bytes);
                    memcpy(l1, H.lse, lse_bytes);
                } else {
                    CHECK_MSG(memcmp(o1, H.o, H.o_bytes) == 0 && memcmp(l1, H.lse, lse_bytes) == 0,
                              "%s/%s: %d threads differ from 1", cases[ci].name, g_impls[i].name, threads);
                }
            }
        free(o1);
        free(l1);
        attn_host_free(&H);
    }
}

int main(void) {
    g_impls[g_nimpl++] = (cpu_impl){"portable", fp_attn_cpu_tiled_portable};
    g_impls[g_nimpl++] = (cpu_impl){"naive portable", fp_attn_cpu_naive_portable};
    if (fp_attn_cpu_have_blas()) {
        g_impls[g_nimpl++] = (cpu_impl){"blis", fp_attn_cpu_flash_blas};
        g_impls[g_nimpl++] = (cpu_impl){"naive blis", fp_attn_cpu_naive_blas};
    } else {
        fp_attn_args a;
        memset(&a, 0, sizeof a);
        CHECK_STATUS(fp_attn_cpu_flash_blas(NULL, &a), FP_ERR_UNSUPPORTED);
        CHECK_STATUS(fp_attn_cpu_naive_blas(NULL, &a), FP_ERR_UNSUPPORTED);
    }
    printf("implementations: %d (blis: %d); simd: %d\n", g_nimpl, fp_attn_cpu_have_blas(), fp_attn_simd_available());
    fp_thread_pool *pool = NULL;
    CHECK_OK(fp_thread_pool_create(2, &pool));
    test_exp2();
    test_conversions();
    test_cases(pool);
    test_varlen(pool);
    fp_thread_pool_destroy(pool);
    test_thread_independence();
    TEST_END();
}
