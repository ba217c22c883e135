/* Attention on a CUDA context (label gpu; exits 77 without a device).
 * Flash kernel (f16/bf16, head_dim 32/64/96/128/256), forced split-KV + combine,
 * the simple kernel (f32, other head dims) and the cuBLAS baseline, against the
 * double reference on the same rounded inputs.
 *
 * Pass criterion (FlashAttention's): the flash output's max error vs the
 * reference is at most 2x the max error of the materialized baseline doing
 * the same math in the low precision (scores and P rounded to the dtype),
 * plus a small absolute slack of a few output ulps. Outputs are poisoned
 * (NaN) first; strided outputs must leave their padding untouched. */
#include <pthread.h>
#include <string.h>

#include "attn_test_util.h"

static fp_context *g_ctx;
/* FP_TEST_QUICK=1 (scripts/gpu-check.sh under compute-sanitizer): small
 * shapes only, short timing. */
static int g_quick;

typedef struct dev_case {
    attn_host H;               /* host data and params (host pointers) */
    fp_attention_params dp;    /* same params on device pointers */
    void *d_qkv, *d_o;
    float *d_lse;
    int32_t *d_seqlens;
    void *h_o;                 /* download buffer */
    float *h_lse;
} dev_case;

static int dev_make(const attn_case *c, dev_case *D, uint64_t seed) {
    memset(D, 0, sizeof *D);
    if (!attn_host_make(c, &D->H, seed)) return 0;
    attn_host *H = &D->H;
    size_t n_lse = (size_t)c->batch * c->hq * c->sq;
    if (fp_mem_alloc(g_ctx, H->qkv_bytes, &D->d_qkv) != FP_OK) return 0;
    if (fp_mem_alloc(g_ctx, H->o_bytes, &D->d_o) != FP_OK) return 0;
    if (fp_mem_alloc(g_ctx, n_lse * sizeof(float), (void **)&D->d_lse) != FP_OK) return 0;
    if (fp_mem_alloc(g_ctx, (size_t)c->batch * sizeof(int32_t), (void **)&D->d_seqlens) != FP_OK) return 0;
    fp_mem_upload(g_ctx, D->d_qkv, H->qkv, H->qkv_bytes, NULL);
    if (H->seqlens) fp_mem_upload(g_ctx, D->d_seqlens, H->seqlens, (size_t)c->batch * sizeof(int32_t), NULL);
    D->dp = H->p;
    D->dp.q = (char *)D->d_qkv + ((char *)H->q - (char *)H->qkv);
    D->dp.k = (char *)D->d_qkv + ((char *)H->k - (char *)H->qkv);
    D->dp.v = (char *)D->d_qkv + ((char *)H->v - (char *)H->qkv);
    D->dp.o = D->d_o;
    D->dp.lse = H->lse ? D->d_lse : NULL;
    D->dp.seqlens_k = H->seqlens ? D->d_seqlens : NULL;
    D->h_o = malloc(H->o_bytes);
    D->h_lse = malloc(n_lse * sizeof(float));
    fp_context_synchronize(g_ctx, NULL);
    return D->h_o && D->h_lse;
}

static void dev_free(dev_case *D) {
    fp_mem_free(g_ctx, D->d_qkv);
    fp_mem_free(g_ctx, D->d_o);
    fp_mem_free(g_ctx, D->d_lse);
    fp_mem_free(g_ctx, D->d_seqlens);
    free(D->h_o);
    free(D->h_lse);
    attn_host_free(&D->H);
}

/* Runs one implementation (0 forward, 1 baseline, n >= 2: flash kernel v1
 * with n - 1 forced splits, n <= -1: flash kernel v2 with -n splits, n >=
 * IMPL_V3: the Hopper kernel v3 with n - IMPL_V3 splits, n >= IMPL_V4: v4,
 * v3 with the other schedule, with n - IMPL_V4 splits, n >= IMPL_V5: v5, the
 * TMA producer / mbarrier kernel, with n - IMPL_V5 splits, n >= IMPL_V6: v6,
 * the decode kernel, any device, with n - IMPL_V6 splits, n >= IMPL_V7: v7,
 * v1 over 8 warps, with n - IMPL_V7 splits, n >= IMPL_V8: v8, v5 with
 * ping-pong consumer warpgroups, with n - IMPL_V8 splits, n >= IMPL_V9:
 * v9, v8 in persistent CTAs, with n - IMPL_V9 splits, n >= IMPL_V10: v10,
 * v8 with three consumer warpgroups, head_dim 64 only, with n - IMPL_V10
 * splits) on poisoned outputs and downloads them. */
enum {
    IMPL_V3 = 1000, IMPL_V4 = 2000, IMPL_V5 = 3000, IMPL_V6 = 4000, IMPL_V7 = 5000, IMPL_V8 = 6000, IMPL_V9 = 7000,
    IMPL_V10 = 8000
};
/* a TMA kernel (v5, v8, v9, v10): Hopper only, refuses varlen without total_k and what TMA cannot describe */
static int impl_tma(int impl) { return (impl >= IMPL_V5 && impl < IMPL_V6) || impl >= IMPL_V8; }
/* v3 / v4 exist only in sm_90a builds on compute capability 9.0 devices;
 * they answer FP_ERR_UNSUPPORTED elsewhere, which skips them (said once).
 * Where they must run (an sm_90a build on a 9.0 device), that answer is a
 * failure, not a skip. */
static int v3_unsupported(fp_status st, int impl) {
    static int said = 0;
    if (impl < IMPL_V3 || (impl >= IMPL_V6 && impl < IMPL_V8) || st != FP_ERR_UNSUPPORTED)
        return 0; /* v6, v7: every device */
#ifdef FASTPATH_HAVE_SM90A
    if (attn_device_cc90()) {
        const char *why = fp_last_error();
        int paged_or_shape = strstr(why, "paged") || strstr(why, "head_dim") || strstr(why, "dtype");
        /* v5 also refuses varlen without total_k and K / V layouts TMA cannot describe (it says which) */
        if (impl_tma(impl)) paged_or_shape |= strstr(why, "(TMA)") != NULL;
        CHECK_MSG(paged_or_shape, "flash kernel v%d refused on an sm_90a build and a 9.0 device: %s",
                  impl >= IMPL_V10  ? 10
                  : impl >= IMPL_V9 ? 9
                  : impl >= IMPL_V8 ? 8
                  : impl >= IMPL_V5 ? 5
                  : impl >= IMPL_V4 ? 4
                                    : 3,
                  why);
    }
#endif
    if (!(said & (impl_tma(impl) ? 2 : 1)))
        printf("flash kernel v%s skipped: %s\n", impl_tma(impl) ? "5/8/9/10" : "3/4", fp_last_error());
    said |= impl_tma(impl) ? 2 : 1;
    return 1;
}
/* impl's flash version and split count (ATTN_RUN_FORWARD / _BASELINE and
 * 0 splits for impl 0 / 1). */
static void impl_version(int impl, int *version, int *splits) {
    *version = impl > 0 ? 1 : 2;
    *splits = impl > 0 ? impl - 1 : -impl; /* v1: n >= 2, v2: n <= -1 */
    if (impl == 0 || impl == 1) {
        *version = impl == 0 ? ATTN_RUN_FORWARD : ATTN_RUN_BASELINE;
        *splits = 0;
    } else if (impl >= IMPL_V10) {
        *version = 10;
        *splits = impl - IMPL_V10;
    } else if (impl >= IMPL_V9) {
        *version = 9;
        *splits = impl - IMPL_V9;
    } else if (impl >= IMPL_V8) {
        *version = 8;
        *splits = impl - IMPL_V8;
    } else if (impl >= IMPL_V7) {
        *version = 7;
        *splits = impl - IMPL_V7;
    } else if (impl >= IMPL_V6) {
        *version = 6;
        *splits = impl - IMPL_V6;
    } else if (impl >= IMPL_V5) {
        *version = 5;
        *splits = impl - IMPL_V5;
    } else if (impl >= IMPL_V4) {
        *version = 4;
        *splits = impl - IMPL_V4;
    } else if (impl >= IMPL_V3) {
        *version = 3;
        *splits = impl - IMPL_V3;
    }
}
static fp_status dev_run(dev_case *D, int impl) {
    int version, splits;
    impl_version(impl, &version, &splits);
    return attn_dev_run(g_ctx, &D->dp, version, splits, D->d_o, D->h_o, D->H.o_bytes, D->d_lse, D->h_lse);
}

/* 1 when this build and device must run the Hopper kernels (an sm_90a build
 * on a compute capability 9.0 device). */
static int must_run_sm90(void) {
#ifdef FASTPATH_HAVE_SM90A
    return attn_device_cc90();
#else
    return 0;
#endif
}

/* The kernel that ran for impl, from fp_attention_last_kernel, written into
 * buf for the result line. An explicit version must have run as asked (its
 * split count too). The forward reports what it chose; with a preferred
 * version (FP_CTX_ATTENTION_KERNEL) that the case fits (f16 / bf16, head_dim
 * 64 / 128; v3-v5: on an sm_90a build and a 9.0 device, v5 also not varlen
 * or paged), running another kernel is a failure of that version, not a
 * pass: a silent fallback would hide that it does not work. */
static const char *ran_kernel(const attn_case *c, int impl, char *buf, size_t n) {
    fp_attention_kernel_info k;
    CHECK_OK(fp_attention_last_kernel(&k));
    int version, splits;
    impl_version(impl, &version, &splits);
    if (impl != 0) {
        CHECK_MSG(k.version == version && k.num_splits == splits, "%s/impl %d: asked for v%d with %d splits, ran %s with %d",
                  c->name, impl, version, splits, k.kernel, k.num_splits);
    } else if (k.preferred == 0 && must_run_sm90() && c->dtype != FP_F32 && (c->d == 64 || c->d == 128) &&
               (int64_t)c->sq * (c->hq / c->hkv) >= 128) {
        /* the Hopper default (attention_flash.cu): v5 (v10 at head_dim 64),
         * or v3 where it refuses */
        const int tma_default = c->d == 64 ? 10 : 5;
        CHECK_MSG(k.version == tma_default || k.version == 3,
                  "%s: the default on this Hopper device should be v%d / v3, ran %s", c->name, tma_default, k.kernel);
    } else if (k.preferred >= 2) {
        /* v2 / v7: every such case; v6: at most 64 packed query rows per KV
         * head; v3 / v4 / v5 / v8 / v9 / v10: a Hopper build and device, the
         * TMA ones (v5, v8, v9, v10) not paged, v10 head_dim 64 only */
        const int sm90_version = k.preferred == 3 || k.preferred == 4 || k.preferred == 5 || k.preferred == 8 ||
                                 k.preferred == 9 || k.preferred == 10;
        const int tma_version = k.preferred == 5 || k.preferred == 8 || k.preferred == 9 || k.preferred == 10;
        const int fits = c->dtype != FP_F32 && (c->d == 64 || (c->d == 128 && k.preferred != 10)) &&
                         (k.preferred == 2 || k.preferred == 7 ||
                          (k.preferred == 6 && (int64_t)c->sq * (c->hq / c->hkv) <= 64) ||
                          (sm90_version && must_run_sm90() && !(tma_version && k.paged)));
        CHECK_MSG(!fits || k.version == k.preferred, "%s: preferred v%d fits the case but %s ran (fallback: %s)",
                  c->name, k.preferred, k.kernel, k.fallback[0] ? k.fallback : "none given");
        if (k.version != k.preferred)
            CHECK_MSG(k.fallback[0] != '\0', "%s: preferred v%d, %s ran with no reason given", c->name,
                      k.preferred, k.kernel);
    }
    char sp[48] = "";
    if (k.num_splits > 1) snprintf(sp, sizeof sp, " x%d splits + combine", k.num_splits);
    snprintf(buf, n, "%s%s%s%s%s", k.kernel, sp, k.paged ? " (paged)" : "", k.fallback[0] ? "; fallback: " : "",
             k.fallback);
    return buf;
}

/* The implementations run_case checks: every explicit version (and, with
 * IMPLS_SPLITS, forced split counts), or only the forward's own choice
 * (IMPLS_DEFAULT: the preferred-version test, where the explicit versions
 * would repeat test_cases' runs, which do not depend on the preference). */
enum { IMPLS_ALL = 0, IMPLS_SPLITS = 1, IMPLS_DEFAULT = 2 };

static void run_case(const attn_case *c, int which) {
    const int extra_splits = which == IMPLS_SPLITS;
    if (g_quick && (double)c->batch * c->hq * c->sq * c->sk > 2e6) return;
    dev_case D;
    if (!dev_make(c, &D, 77 + (uint64_t)c->sq * 3 + (uint64_t)c->sk)) {
        CHECK_MSG(0, "%s: allocation", c->name);
        dev_free(&D);
        return;
    }
    double *o_ref = NULL, *lse_ref = NULL;
    CHECK(attn_reference(NULL, &D.H, &o_ref, &lse_ref));
    /* baseline error: the low-precision materialized math */
    fp_status st = dev_run(&D, 1);
    CHECK_MSG(st == FP_OK, "%s/baseline: %s (%s)", c->name, fp_status_string(st), fp_last_error());
    attn_err Eb = attn_compare(&D.H, D.h_o, NULL, o_ref, NULL, INFINITY, 0);
    const double slack = 4.0 * attn_eps(c->dtype) * (Eb.max_ref > 0 ? Eb.max_ref : 1.0) + 1e-6;
    const double allowed = 2.0 * Eb.max_abs + slack;
    CHECK_MSG(Eb.bad == 0, "%s/baseline: NaN or padding written", c->name);
    int impls[28], n_impl = 0;
    impls[n_impl++] = 0;
    if (which != IMPLS_DEFAULT) {
        if (extra_splits) {
            impls[n_impl++] = 3; /* v1, 2 splits */
            impls[n_impl++] = 8; /* v1, 7 splits */
            /* the fused combine's merge: 40 splits read from two register slots
             * per lane, 140 (past its 128) by the loop that re-reads lse; many
             * of them are empty at these lengths (weight 0) */
            impls[n_impl++] = 41;
            impls[n_impl++] = 141;
        }
        if (c->dtype != FP_F32 && (c->d == 64 || c->d == 128)) {
            impls[n_impl++] = -1; /* v2 */
            if (extra_splits) impls[n_impl++] = -3; /* v2, 3 splits */
            impls[n_impl++] = IMPL_V3 + 1; /* v3 */
            if (extra_splits) impls[n_impl++] = IMPL_V3 + 3; /* v3, 3 splits */
            impls[n_impl++] = IMPL_V4 + 1; /* v4 = v3 with the other schedule */
            impls[n_impl++] = IMPL_V5 + 1; /* v5: TMA producer + mbarrier ring */
            if (extra_splits) impls[n_impl++] = IMPL_V5 + 3; /* v5, 3 splits */
            impls[n_impl++] = IMPL_V8 + 1; /* v8: v5 with ping-pong consumers */
            if (extra_splits) impls[n_impl++] = IMPL_V8 + 3; /* v8, 3 splits */
            impls[n_impl++] = IMPL_V9 + 1; /* v9: v8 in persistent CTAs */
            if (extra_splits) impls[n_impl++] = IMPL_V9 + 3; /* v9, 3 splits */
            if (c->d == 64) {
                impls[n_impl++] = IMPL_V10 + 1; /* v10: v8 with three consumer warpgroups */
                if (extra_splits) impls[n_impl++] = IMPL_V10 + 3; /* v10, 3 splits */
            }
        }
        if (c->dtype != FP_F32 && (c->d == 32 || c->d == 64 || c->d == 96 || c->d == 128 || c->d == 256)) {
            impls[n_impl++] = IMPL_V6 + 1; /* v6, the decode kernel (on prefill shapes too: correct, not fast) */
            if (extra_splits) impls[n_impl++] = IMPL_V6 + 5; /* v6, 5 splits */
            impls[n_impl++] = IMPL_V7 + 1; /* v7: v1 over 8 warps */
            if (extra_splits) impls[n_impl++] = IMPL_V7 + 3; /* v7, 3 splits */
        }
    }
    for (int t = 0; t < n_impl; ++t) {
        st = dev_run(&D, impls[t]);
        if (v3_unsupported(st, impls[t])) continue;
        CHECK_MSG(st == FP_OK, "%s/impl %d: %s (%s)", c->name, impls[t], fp_status_string(st), fp_last_error());
        if (st != FP_OK) continue;
        attn_err E = attn_compare(&D.H, D.h_o, D.H.lse ? D.h_lse : NULL, o_ref, lse_ref, allowed, 0);
        CHECK_MSG(E.bad == 0 && E.lse_bad == 0,
                  "%s/impl %d: %zu bad (first at %zu: got %.6g ref %.6g), max err %.3g vs baseline %.3g "
                  "(allowed %.3g), lse bad %zu (max err %.3g)",
                  c->name, impls[t], E.bad, E.first_bad, E.first_got, E.first_ref, E.max_abs, Eb.max_abs,
                  allowed, E.lse_bad, E.lse_max_abs);
        char ran[384];
        printf("%-20s impl %d: max err %.3g (baseline %.3g) ran %s\n", c->name, impls[t], E.max_abs, Eb.max_abs,
               ran_kernel(c, impls[t], ran, sizeof ran));
    }
    free(o_ref);
    free(lse_ref);
    dev_free(&D);
}

static void test_cases(void) {
    static const attn_case cases[] = {
        /* name            b  sq    sk    hq hkv d   dtype    causal wl  wr scale lse rag str */
        {"bf16_seq1",      2, 1,    1,    2, 2, 64, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"bf16_seq17",     2, 17,   17,   2, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_seq128",     1, 128,  128,  4, 4, 64, FP_F16, 0, -1, -1, 0, 1, 0, 0},
        {"bf16_seq333_c",  1, 333,  333,  2, 1, 128, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_seq1024",    1, 1024, 1024, 2, 2, 128, FP_F16, 0, -1, -1, 0, 1, 0, 0},
        {"bf16_1024_c",    2, 1024, 1024, 4, 2, 64, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_q<k_c",      2, 17,   333,  2, 2, 64, FP_F16, 1, -1, -1, 0, 1, 0, 0},
        {"bf16_q>k_c",     2, 333,  17,   2, 2, 128, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_gqa3",       2, 128,  200,  6, 2, 64, FP_F16, 0, -1, -1, 0, 1, 0, 0},
        {"bf16_window",    1, 333,  333,  2, 2, 64, FP_BF16, 0, 32, 8, 0, 1, 0, 0},
        {"f16_window_c",   1, 500,  700,  2, 2, 128, FP_F16, 1, 100, -1, 0, 1, 0, 0},
        {"bf16_scale",     1, 128,  128,  2, 2, 64, FP_BF16, 0, -1, -1, 0.05f, 1, 0, 0},
        {"bf16_strided",   2, 77,   77,   4, 2, 64, FP_BF16, 1, -1, -1, 0, 1, 0, 1},
        {"f16_strided_w",  2, 33,   129,  2, 1, 128, FP_F16, 0, 20, 4, 0, 1, 0, 1},
        {"f32_rowwise",    1, 200,  200,  2, 1, 64, FP_F32, 1, -1, -1, 0, 1, 0, 0},
        {"bf16_d96",       1, 100,  150,  2, 2, 96, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_d32",        2, 64,   64,   2, 2, 32, FP_F16, 1, -1, -1, 0, 1, 0, 0},
        {"bf16_d256",      1, 100,  130,  2, 1, 256, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_d40_rw",     1, 50,   70,   2, 2, 40, FP_F16, 0, 10, 10, 0, 1, 1, 0},
        {"f32_decode_rw",  4, 1,   1000,  4, 2, 128, FP_F32, 0, -1, -1, 0, 1, 1, 0},
    };
    static const attn_case decode[] = {
        {"bf16_decode",     2, 1,  4096, 8, 1, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_decode_rag",  8, 1,  2048, 8, 2, 128, FP_F16, 1, -1, -1, 0, 1, 1, 0},
        {"bf16_decode4_c",  4, 4,  1500, 4, 4, 64, FP_BF16, 1, -1, -1, 0, 1, 1, 0},
        {"bf16_dec_win",    2, 2,  3000, 4, 2, 64, FP_BF16, 1, 256, -1, 0, 1, 0, 0},
        {"f16_dec_strided", 4, 2,  600,  4, 4, 64, FP_F16, 1, -1, -1, 0, 1, 1, 1},
        {"bf16_prefill_sp", 1, 256, 512, 2, 1, 64, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_d256_decode", 3, 1,  2000, 4, 1, 256, FP_F16, 0, -1, -1, 0, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i], IMPLS_ALL);
    for (size_t i = 0; i < sizeof decode / sizeof decode[0]; ++i) run_case(&decode[i], IMPLS_SPLITS);
}

/* Windows that reach past every key (INT_MAX as "unbounded" passes
 * fp_attn_check) must give exactly the unbounded window's result. The
 * kernels' mask math (row_keys / plan_block) is int: diag +- window
 * overflowed and rows kept no key (O = 0, lse = -inf) in the flash kernel,
 * the rowwise kernel and the baseline's softmax alike, so the usual
 * criterion (2x the baseline's error) could not see it: compare each
 * implementation bit for bit with its own run at window -1, and the flash
 * output with the reference. */
static void test_huge_window_gpu(void) {
    static const attn_case cases[] = {
        /* name            b  sq  sk   hq hkv d    dtype    causal wl       wr             scale lse rag str */
        {"f16_win_intmax", 1, 70, 150, 2, 2, 64, FP_F16, 0, INT32_MAX, INT32_MAX, 0, 1, 0, 0},
        {"bf16_q>k_wlmax", 2, 90, 40, 4, 2, 128, FP_BF16, 1, INT32_MAX, -1, 0, 1, 0, 0},
        {"f32_rw_win_big", 2, 50, 300, 2, 1, 64, FP_F32, 0, INT32_MAX - 10, INT32_MAX - 100, 0, 1, 1, 0},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        const attn_case *c = &cases[ci];
        dev_case D;
        if (!dev_make(c, &D, 4242 + ci)) {
            CHECK_MSG(0, "%s: allocation", c->name);
            dev_free(&D);
            continue;
        }
        double *o_ref = NULL, *lse_ref = NULL;
        CHECK(attn_reference(NULL, &D.H, &o_ref, &lse_ref));
        const size_t n_lse = (size_t)c->batch * c->hq * c->sq;
        void *o_big = malloc(D.H.o_bytes);
        float *lse_big = malloc(n_lse * sizeof(float));
        int impls[10], n_impl = 0;
        impls[n_impl++] = 1; /* baseline */
        impls[n_impl++] = 0; /* forward: flash or rowwise */
        if (fp_attn_cuda_flash_supported(c->dtype, c->d)) impls[n_impl++] = 3; /* v1, 2 splits */
        if (c->dtype != FP_F32 && (c->d == 64 || c->d == 128)) {
            impls[n_impl++] = -1;          /* v2 */
            impls[n_impl++] = IMPL_V3 + 1; /* v3 */
            impls[n_impl++] = IMPL_V5 + 1; /* v5 */
            impls[n_impl++] = IMPL_V8 + 1; /* v8 */
            impls[n_impl++] = IMPL_V9 + 1; /* v9 */
            if (c->d == 64) impls[n_impl++] = IMPL_V10 + 1; /* v10 */
        }
        for (int t = 0; t < n_impl && o_big && lse_big; ++t) {
            D.dp.window_left = c->wl;
            D.dp.window_right = c->wr;
            fp_status st = dev_run(&D, impls[t]);
            if (v3_unsupported(st, impls[t])) continue;
            CHECK_MSG(st == FP_OK, "%s/impl %d: %s (%s)", c->name, impls[t], fp_status_string(st), fp_last_error());
            memcpy(o_big, D.h_o, D.H.o_bytes);
            memcpy(lse_big, D.h_lse, n_lse * sizeof(float));
            if (impls[t] == 0 || impls[t] >= IMPL_V3) {
                attn_err E = attn_compare(&D.H, D.h_o, D.h_lse, o_ref, lse_ref,
                                          8.0 * attn_eps(c->dtype) + 1e-5, 0);
                CHECK_MSG(E.bad == 0 && E.lse_bad == 0, "%s/forward vs reference: %zu bad (got %.6g ref %.6g), "
                          "lse bad %zu", c->name, E.bad, E.first_got, E.first_ref, E.lse_bad);
            }
            D.dp.window_left = -1;
            D.dp.window_right = -1;
            st = dev_run(&D, impls[t]);
            CHECK_MSG(st == FP_OK, "%s/impl %d, window -1: %s", c->name, impls[t], fp_status_string(st));
            CHECK_MSG(memcmp(o_big, D.h_o, D.H.o_bytes) == 0 && memcmp(lse_big, D.h_lse, n_lse * sizeof(float)) == 0,
                      "%s/impl %d: window (%d, %d) differs from the unbounded window", c->name, impls[t], c->wl,
                      c->wr);
        }
        free(o_big);
        free(lse_big);
        free(o_ref);
        free(lse_ref);
        dev_free(&D);
    }
}

/* Varlen on the device: flash (plain and forced 3 splits), v3, and with
 * total_k the TMA kernels (v5, v8, v9, v10 and fp_attention_forward's
 * choice, v5 / v8 on Hopper) and the baseline against each sequence's
 * reference computed as a batch of one. Sequence 0 holds 340 keys, clipped
 * to seqlen_k = 300: its rows 300..339 hold NaN, as do SPARE rows after the
 * packed ones (inside total_k: the TMA kernels' last tiles load them). */
static void test_varlen_gpu(fp_dtype dt, int d, int causal) {
    enum { B = 5, SQ = 200, SK = 300, HQ = 4, HKV = 2, SPARE = 3 };
    static const int nq[B] = {200, 5, 0, 17, 1}, nk[B] = {340, 40, 17, 0, 260};
    int32_t cu_q[B + 1] = {0}, cu_k[B + 1] = {0};
    for (int b = 0; b < B; ++b) {
        cu_q[b + 1] = cu_q[b] + nq[b];
        cu_k[b + 1] = cu_k[b] + nk[b];
    }
    const int64_t total_k = cu_k[B] + SPARE;
    const size_t elt = fp_dtype_size(dt);
    const size_t nq_el = (size_t)cu_q[B] * HQ * d, nk_el = (size_t)total_k * HKV * d;
    const size_t bytes = (nq_el + 2 * nk_el) * elt, o_bytes = nq_el * elt, lse_bytes = sizeof(float) * B * HQ * SQ;
    void *h = malloc(bytes), *h_o = malloc(o_bytes);
    float *h_lse = malloc(lse_bytes);
    uint64_t st = 5;
    for (size_t i = 0; i < nq_el + 2 * nk_el; ++i) attn_store(h, i, dt, (float)fp_test_rand_uniform(&st, -1, 1));
    for (int kv = 0; kv < 2; ++kv) { /* K, V rows no sequence owns: NaN */
        for (int64_t r = SK; r < nk[0]; ++r)
            for (int x = 0; x < HKV * d; ++x) attn_store(h, nq_el + kv * nk_el + (size_t)r * HKV * d + x, dt, NAN);
        for (int64_t r = cu_k[B]; r < total_k; ++r)
            for (int x = 0; x < HKV * d; ++x) attn_store(h, nq_el + kv * nk_el + (size_t)r * HKV * d + x, dt, NAN);
    }
    /* references, one sequence at a time */
    double *o_ref = calloc(nq_el, sizeof(double)), *lse_ref = malloc(sizeof(double) * B * HQ * SQ);
    for (int i = 0; i < B * HQ * SQ; ++i) lse_ref[i] = -INFINITY;
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = B; p.seqlen_q = SQ; p.seqlen_k = SK; p.heads_q = HQ; p.heads_kv = HKV; p.head_dim = d;
    p.dtype = dt; p.causal = causal;
    for (int b = 0; b < B; ++b) {
        if (nq[b] == 0 || nk[b] == 0) continue;
        fp_attention_params one = p;
        one.batch = 1; one.seqlen_q = nq[b]; one.seqlen_k = nk[b] < SK ? nk[b] : SK;
        one.q = (const char *)h + (size_t)cu_q[b] * HQ * d * elt;
        one.k = (const char *)h + (nq_el + (size_t)cu_k[b] * HKV * d) * elt;
        one.v = (const char *)h + (nq_el + nk_el + (size_t)cu_k[b] * HKV * d) * elt;
        one.o = h_o;
        fp_attn_args a1;
        double *lse1 = malloc(sizeof(double) * HQ * nq[b]);
        CHECK_OK(fp_attn_check(&one, 0, &a1));
        CHECK_OK(fp_attn_reference(NULL, &a1, o_ref + (size_t)cu_q[b] * HQ * d, lse1));
        for (int hh = 0; hh < HQ; ++hh)
            for (int i = 0; i < nq[b]; ++i) lse_ref[((size_t)b * HQ + hh) * SQ + i] = lse1[(size_t)hh * nq[b] + i];
        free(lse1);
    }
    void *d_in = NULL, *d_o = NULL, *d_lse = NULL, *d_cu = NULL;
    CHECK_OK(fp_mem_alloc(g_ctx, bytes, &d_in));
    CHECK_OK(fp_mem_alloc(g_ctx, o_bytes, &d_o));
    CHECK_OK(fp_mem_alloc(g_ctx, lse_bytes, &d_lse));
    CHECK_OK(fp_mem_alloc(g_ctx, sizeof cu_q + sizeof cu_k, &d_cu));
    fp_mem_upload(g_ctx, d_in, h, bytes, NULL);
    fp_mem_upload(g_ctx, d_cu, cu_q, sizeof cu_q, NULL);
    fp_mem_upload(g_ctx, (char *)d_cu + sizeof cu_q, cu_k, sizeof cu_k, NULL);
    fp_context_synchronize(g_ctx, NULL);
    p.q = d_in;
    p.k = (char *)d_in + nq_el * elt;
    p.v = (char *)d_in + (nq_el + nk_el) * elt;
    p.o = d_o;
    p.lse = d_lse;
    p.cu_seqlens_q = d_cu;
    p.cu_seqlens_k = (const int32_t *)((char *)d_cu + sizeof cu_q);
    double err_base = 0.0;
    /* 1 baseline, 0 forward, -1 forced 3 splits, -2 / -3: v3 with 1 / 3
     * splits; given total_k: -4 forward (v5 / v8 on Hopper), -5 / -6 v5
     * with 1 / 3 splits, -7 / -8 v8, -9 v9 with 2, -10 v10 with 1 (head_dim
     * 64) */
    static const int tma_version[11] = {0, 0, 0, 0, 0, 5, 5, 8, 8, 9, 10};
    static const int tma_splits[11] = {0, 0, 0, 0, 0, 1, 3, 1, 3, 2, 1};
    int fwd_version = 0; /* the kernel fp_attention_forward ran without total_k */
    for (int impl = 1; impl >= -10; --impl) {
        if (impl == -1 && !fp_attn_cuda_flash_supported(dt, d)) continue;
        if (impl <= -2 && (dt == FP_F32 || (d != 64 && d != 128))) continue;
        if (impl == -10 && d != 64) continue;
        fp_mem_fill(g_ctx, d_o, 0xFF, o_bytes, NULL);
        fp_mem_fill(g_ctx, d_lse, 0xFF, lse_bytes, NULL);
        p.total_k = impl <= -4 ? total_k : 0;
        fp_status rs;
        if (impl == 1) {
            rs = fp_attention_forward_baseline(g_ctx, NULL, &p);
        } else if (impl == 0 || impl == -4) {
            rs = fp_attention_forward(g_ctx, NULL, &p);
            fp_attention_kernel_info k;
            if (rs == FP_OK && fp_attention_last_kernel(&k) == FP_OK) {
                if (impl == 0) fwd_version = k.version;
                /* where v3 ran without total_k (Hopper, an sm_90a build), the TMA kernel of the head dim */
                else if (fwd_version == 3)
                    CHECK_MSG(k.version == (d == 64 ? 10 : 5), "varlen forward given total_k ran %s, not v%d",
                              k.kernel, d == 64 ? 10 : 5);
            }
        } else {
            fp_attn_args a;
            rs = fp_attn_check(&p, 1, &a);
            if (rs == FP_OK && impl == -1)
                rs = fp_attn_cuda_flash_splits(&a, 3, (cudaStream_t)fp_context_stream(g_ctx));
            else if (rs == FP_OK && impl >= -3)
                rs = fp_attn_cuda_flash_version(&a, 3, impl == -2 ? 1 : 3, (cudaStream_t)fp_context_stream(g_ctx));
            else if (rs == FP_OK)
                rs = fp_attn_cuda_flash_version(&a, tma_version[-impl], tma_splits[-impl],
                                                (cudaStream_t)fp_context_stream(g_ctx));
            const int iv = impl >= -3 ? IMPL_V3 : tma_version[-impl] == 5 ? IMPL_V5
                                                : tma_version[-impl] == 8 ? IMPL_V8
                                                : tma_version[-impl] == 9 ? IMPL_V9
                                                                          : IMPL_V10;
            /* given total_k, no TMA kernel may refuse the call for varlen */
            CHECK_MSG(impl >= -3 || rs != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "total_k"),
                      "varlen v%d given total_k: %s", tma_version[-impl], fp_last_error());
            if (impl <= -2 && v3_unsupported(rs, iv)) continue;
        }
        CHECK_MSG(rs == FP_OK, "varlen impl %d: %s (%s)", impl, fp_status_string(rs), fp_last_error());
        fp_context_synchronize(g_ctx, NULL);
        fp_mem_download(g_ctx, h_o, d_o, o_bytes, NULL);
        fp_mem_download(g_ctx, h_lse, d_lse, lse_bytes, NULL);
        fp_context_synchronize(g_ctx, NULL);
        double err = 0.0;
        size_t bad_lse = 0;
        for (size_t i = 0; i < nq_el; ++i) {
            double e = fabs(attn_load(h_o, i, dt) - o_ref[i]);
            if (e > err || e != e) err = e != e ? INFINITY : e;
        }
        for (int b = 0; b < B; ++b)
            for (int hh = 0; hh < HQ; ++hh)
                for (int i = 0; i < SQ; ++i) {
                    double lr = lse_ref[((size_t)b * HQ + hh) * SQ + i], lg = h_lse[((size_t)b * HQ + hh) * SQ + i];
                    if (i >= nq[b]) bad_lse += !isnan(lg);
                    else if (isinf(lr)) bad_lse += !(isinf(lg) && lg < 0);
                    else bad_lse += !(fabs(lg - lr) <= (impl == 1 ? 5e-2 : 1e-4) + 1e-4 * fabs(lr));
                }
        if (impl == 1) err_base = err;
        const double allowed = 2.0 * err_base + 4.0 * attn_eps(dt) + 1e-6;
        CHECK_MSG(err <= (impl == 1 ? INFINITY : allowed) && bad_lse == 0,
                  "varlen %s d%d causal %d impl %d: max err %.3g (baseline %.3g), lse bad %zu", fp_dtype_name(dt), d,
                  causal, impl, err, err_base, bad_lse);
        printf("varlen %s d%d causal %d impl %d: max err %.3g\n", fp_dtype_name(dt), d, causal, impl, err);
    }
    fp_mem_free(g_ctx, d_in);
    fp_mem_free(g_ctx, d_o);
    fp_mem_free(g_ctx, d_lse);
    fp_mem_free(g_ctx, d_cu);
    free(h);
    free(h_o);
    free(h_lse);
    free(o_ref);
    free(lse_ref);
}

static void test_bad_input_gpu(void) {
    attn_case c = {"bad", 1, 64, 64, 2, 2, 64, FP_BF16, 0, -1, -1, 0, 1, 0, 0};
    dev_case D;
    CHECK(dev_make(&c, &D, 3));
    fp_mem_fill(g_ctx, D.d_o, 0x5A, D.H.o_bytes, NULL);
    fp_attention_params p = D.dp;
    p.q = (const char *)p.q + 2; /* element-aligned, not 16-byte aligned */
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "'q'") != NULL);
    p = D.dp;
    p.v_seq_stride = 2 * 64 + 4; /* rows not 16-byte aligned */
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "v strides") != NULL);
    p = D.dp;
    p.head_dim = 20;
    CHECK_STATUS(fp_attention_forward_baseline(g_ctx, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "head_dim") != NULL);
    fp_context_synchronize(g_ctx, NULL);
    fp_mem_download(g_ctx, D.h_o, D.d_o, D.H.o_bytes, NULL);
    fp_context_synchronize(g_ctx, NULL);
    int untouched = 1;
    for (size_t b = 0; b < D.H.o_bytes; ++b) untouched &= ((unsigned char *)D.h_o)[b] == 0x5A;
    CHECK_MSG(untouched, "outputs written on bad input");
    dev_free(&D);
}

/* The baseline's score matrix (64 heads x 65536^2 x 2 B = 550 GB) cannot
 * fit: a clean FP_ERR_OUT_OF_MEMORY. */
static void test_baseline_oom(void) {
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = 1; p.seqlen_q = 65536; p.seqlen_k = 65536; p.heads_q = 64; p.heads_kv = 1; p.head_dim = 64;
    void *q = NULL, *kv = NULL, *o = NULL;
    size_t nq = (size_t)65536 * 64 * 64 * 2, nk = (size_t)65536 * 64 * 2;
    if (fp_mem_alloc(g_ctx, nq, &q) != FP_OK || fp_mem_alloc(g_ctx, 2 * nk, &kv) != FP_OK ||
        fp_mem_alloc(g_ctx, nq, &o) != FP_OK) {
        printf("baseline OOM test skipped: inputs do not fit\n");
    } else {
        p.q = q; p.k = kv; p.v = (char *)kv + nk; p.o = o;
        CHECK_STATUS(fp_attention_forward_baseline(g_ctx, NULL, &p), FP_ERR_OUT_OF_MEMORY);
        CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    }
    fp_mem_free(g_ctx, q);
    fp_mem_free(g_ctx, kv);
    fp_mem_free(g_ctx, o);
}

/* Ragged decode with NaN in the KV cache past each sequence's length (an
 * uninitialised cache): neither flash nor the baseline may read it. The
 * baseline's P V GEMM once spanned all seqlen_k keys (0 * NaN = NaN). */
static void test_ragged_nan_tail_gpu(void) {
    attn_case c = {"ragged_nan_tail", 4, 1, 512, 8, 2, 128, FP_BF16, 0, -1, -1, 0, 0, 1, 0};
    dev_case D;
    if (!dev_make(&c, &D, 5)) {
        CHECK_MSG(0, "ragged_nan_tail: allocation");
        dev_free(&D);
        return;
    }
    const fp_attention_params *p = &D.dp;
    const size_t elt = fp_dtype_size(c.dtype);
    int64_t kss = p->k_seq_stride ? p->k_seq_stride : (int64_t)c.hkv * c.d;
    int64_t kbs = p->k_batch_stride ? p->k_batch_stride : (int64_t)c.sk * kss;
    int64_t vss = p->v_seq_stride ? p->v_seq_stride : (int64_t)c.hkv * c.d;
    int64_t vbs = p->v_batch_stride ? p->v_batch_stride : (int64_t)c.sk * vss;
    for (int b = 0; b < c.batch; ++b) {
        int L = D.H.seqlens[b];
        if (L >= c.sk) continue;
        /* rows L..sk-1 of this sequence: contiguous in the packed layout */
        CHECK_OK(fp_mem_fill(g_ctx, (char *)p->k + (size_t)(b * kbs + L * kss) * elt, 0xFF,
                             (size_t)((c.sk - L) * kss) * elt, NULL));
        CHECK_OK(fp_mem_fill(g_ctx, (char *)p->v + (size_t)(b * vbs + L * vss) * elt, 0xFF,
                             (size_t)((c.sk - L) * vss) * elt, NULL));
    }
    double *o_ref = NULL, *lse_ref = NULL;
    CHECK(attn_reference(NULL, &D.H, &o_ref, &lse_ref));
    /* baseline, forward, then v3 and v5 (v5 loads whole 128-key tiles by TMA
     * and must clear the NaN rows past L itself before P V) */
    const int impls[6] = {1, 0, IMPL_V3 + 1, IMPL_V5 + 1, IMPL_V8 + 1, IMPL_V9 + 1};
    for (int t = 0; t < 6; ++t) {
        const int impl = impls[t];
        fp_status st = dev_run(&D, impl);
        if (v3_unsupported(st, impl)) continue;
        CHECK_MSG(st == FP_OK, "ragged_nan_tail/impl %d: %s (%s)", impl, fp_status_string(st), fp_last_error());
        if (st != FP_OK) continue;
        attn_err E = attn_compare(&D.H, D.h_o, NULL, o_ref, NULL, 0.05, 0);
        CHECK_MSG(E.bad == 0, "ragged_nan_tail/impl %d: %zu bad (first at %zu: got %.6g ref %.6g)", impl, E.bad,
                  E.first_bad, E.first_got, E.first_ref);
    }
    free(o_ref);
    free(lse_ref);
    dev_free(&D);
}

/* Non-finite scores from the data, on every kernel version: in each
 * sequence keys 0..69 get K[., 0] = +inf (scores +inf or -inf by the sign of
 * Q[., 0]: some rows NaN, others drop a leading run of -inf keys) and key 100
 * of even sequences K[., 0] = NaN. torch's rule (the reference's): a NaN or
 * +inf score makes its row NaN, O and lse; -inf scores are dropped. Outputs
 * start as a finite pattern, so a row left unwritten cannot pass for NaN.
 * The emulation runs this for v1 / v2 only; v3..v5 exist on sm_90a alone. */
static void test_nonfinite_scores_gpu(void) {
    static const attn_case cases[] = {
        /* name            b  sq   sk   hq hkv d    dtype    causal wl  wr scale lse rag str */
        {"nonfinite_bf16", 2, 200, 300, 4, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"nonfinite_f16_c", 2, 150, 260, 2, 2, 64, FP_F16, 1, -1, -1, 0, 1, 0, 0},
        {"nonfinite_dec",  4, 1,  2000, 8, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
    };
    const int impls[] = {0, 2, 4, -1, -3, IMPL_V3 + 1, IMPL_V3 + 3, IMPL_V4 + 1, IMPL_V5 + 1, IMPL_V5 + 3, IMPL_V8 + 1, IMPL_V9 + 1};
    attn_poison_byte = 0x3C; /* bf16 0.0115, f16 1.06, f32 0.0115: finite */
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        const attn_case *c = &cases[ci];
        if (g_quick && ci == 0) continue; /* the largest: 10 s of the emulation's time */
        dev_case D;
        if (!dev_make(c, &D, 9 + ci)) {
            CHECK_MSG(0, "%s: allocation", c->name);
            dev_free(&D);
            continue;
        }
        attn_host *H = &D.H;
        for (int b = 0; b < c->batch; ++b)
            for (int h = 0; h < c->hkv; ++h) {
                for (int j = 0; j < 70 && j < c->sk; ++j)
                    attn_store(H->k, (((size_t)b * c->sk + j) * c->hkv + h) * c->d, c->dtype, INFINITY);
                if (c->sk > 100 && b % 2 == 0)
                    attn_store(H->k, (((size_t)b * c->sk + 100) * c->hkv + h) * c->d, c->dtype, NAN);
            }
        CHECK_OK(fp_mem_upload(g_ctx, D.d_qkv, H->qkv, H->qkv_bytes, NULL));
        CHECK_OK(fp_context_synchronize(g_ctx, NULL));
        double *o_ref = NULL, *lse_ref = NULL;
        CHECK(attn_reference(NULL, H, &o_ref, &lse_ref));
        size_t n_lse = (size_t)c->batch * c->hq * c->sq, nan_rows = 0, finite_rows = 0;
        for (size_t i = 0; i < n_lse; ++i) {
            nan_rows += isnan(lse_ref[i]);
            finite_rows += isfinite(lse_ref[i]) != 0;
        }
        CHECK_MSG(nan_rows && finite_rows, "%s: the poisoned keys give %zu NaN rows and %zu finite ones", c->name,
                  nan_rows, finite_rows);
        /* finite rows: a few output ulps over |V| <= 1 sums (no baseline to
         * scale by: the materialized one is not under test here) */
        const double atol = 8.0 * attn_eps(c->dtype) + 1e-6;
        for (size_t t = 0; t < sizeof impls / sizeof impls[0]; ++t) {
            fp_status st = dev_run(&D, impls[t]);
            if (v3_unsupported(st, impls[t])) continue;
            CHECK_MSG(st == FP_OK, "%s/impl %d: %s (%s)", c->name, impls[t], fp_status_string(st), fp_last_error());
            if (st != FP_OK) continue;
            attn_err E = attn_compare(H, D.h_o, D.h_lse, o_ref, lse_ref, atol, 0);
            char ran[384];
            CHECK_MSG(E.bad == 0 && E.lse_bad == 0,
                      "%s/impl %d (%s): %zu bad (first at %zu: got %.6g ref %.6g), max err %.3g, lse bad %zu",
                      c->name, impls[t], ran_kernel(c, impls[t], ran, sizeof ran), E.bad, E.first_bad,
                      E.first_got, E.first_ref, E.max_abs, E.lse_bad);
            printf("%-20s impl %d: %zu NaN rows of %zu, finite max err %.3g ran %s\n", c->name, impls[t], nan_rows,
                   n_lse, E.max_abs, ran_kernel(c, impls[t], ran, sizeof ran));
        }
        free(o_ref);
        free(lse_ref);
        dev_free(&D);
    }
    attn_poison_byte = 0xFF;
}

/* Split-KV's two ways to merge the partials (FP_CTX_ATTENTION_SPLIT_COMBINE):
 * the combine fused into the split kernel (0, the default: the last CTA of a
 * query tile merges it, counted on a per-tile counter the kernel resets)
 * against the separate combine kernel (1). Both are checked against the
 * reference by test_cases; here: the two agree within one output rounding
 * (the same weights and fmaf order over the splits, the row sums reduced
 * over a warp instead of a block), and the fused one gives the same bytes
 * call after call on poisoned outputs: a counter left non-zero would make
 * the wrong CTA merge (before the other splits' partials) or none. */
static void test_split_combine_modes_gpu(void) {
    static const attn_case cases[] = {
        /* name            b  sq  sk    hq hkv d    dtype    causal wl  wr scale lse rag str */
        {"fused_dec_rag",  3, 1,  1500, 8, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 1, 0},
        {"fused_dec4_c",   2, 4,  700,  4, 4, 64,  FP_F16,  1, -1, -1, 0, 1, 1, 0},
        {"fused_d32",      2, 1,  900,  4, 1, 32,  FP_F16,  0, -1, -1, 0, 1, 0, 0},
        {"fused_d256",     1, 2,  600,  2, 1, 256, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        /* a prefill tile of 64 packed rows: its partials (24 splits under
         * the automatic choice) do not fit v1's shared memory, and the
         * staged merge falls back to the register path */
        {"fused_pre_c",    1, 48, 1500, 4, 2, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0},
    };
    const int impls[] = {0, 3, 8, -3}; /* auto, v1 with 2 / 7 splits, v2 with 3 */
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
        const attn_case *c = &cases[ci];
        dev_case D;
        if (!dev_make(c, &D, 31 + ci)) {
            CHECK_MSG(0, "%s: allocation", c->name);
            dev_free(&D);
            continue;
        }
        const size_t o_bytes = D.H.o_bytes, lse_bytes = attn_n_lse(&D.dp) * sizeof(float);
        const size_t elt = fp_dtype_size(c->dtype), n = o_bytes / elt;
        unsigned char *sep = malloc(o_bytes), *fused = malloc(o_bytes);
        float *sep_lse = malloc(lse_bytes), *fused_lse = malloc(lse_bytes);
        CHECK(sep && fused && sep_lse && fused_lse);
        for (size_t t = 0; sep && fused && sep_lse && fused_lse && t < sizeof impls / sizeof impls[0]; ++t) {
            if (impls[t] < 0 && c->d != 64 && c->d != 128) continue; /* v2: 64 / 128 only */
            CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 1));
            fp_status st = dev_run(&D, impls[t]);
            CHECK_MSG(st == FP_OK, "%s/impl %d separate: %s", c->name, impls[t], fp_last_error());
            fp_attention_kernel_info k;
            CHECK_OK(fp_attention_last_kernel(&k));
            CHECK_MSG(k.num_splits > 1, "%s/impl %d: ran %s without splits", c->name, impls[t], k.kernel);
            memcpy(sep, D.h_o, o_bytes);
            memcpy(sep_lse, D.h_lse, lse_bytes);
            CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 0));
            for (int rep = 0; rep < 3 && st == FP_OK; ++rep) {
                st = dev_run(&D, impls[t]);
                CHECK_MSG(st == FP_OK, "%s/impl %d fused: %s", c->name, impls[t], fp_last_error());
                if (st != FP_OK) break;
                if (rep == 0) {
                    memcpy(fused, D.h_o, o_bytes);
                    memcpy(fused_lse, D.h_lse, lse_bytes);
                    continue;
                }
                CHECK_MSG(memcmp(fused, D.h_o, o_bytes) == 0 && memcmp(fused_lse, D.h_lse, lse_bytes) == 0,
                          "%s/impl %d: fused call %d differs from the first", c->name, impls[t], rep + 1);
            }
            if (st != FP_OK) continue;
            /* the staged merge (the partials through shared memory,
             * fp_attn_merge_stage) does the register merge's arithmetic on
             * the same values: the same bytes, twice in a row (the counters
             * reset), where the tile's partials fit (decode rows) and where
             * they do not (the register path runs). Only impl 0 (the
             * context's call) fuses the combine: the forced-split launches
             * have no context, hence no counters, and run the combine
             * kernel, which these runs then compare with itself. */
            fp_attn_merge_stage_set(1);
            for (int rep = 0; rep < 2 && st == FP_OK; ++rep) {
                st = dev_run(&D, impls[t]);
                CHECK_MSG(st == FP_OK, "%s/impl %d staged: %s", c->name, impls[t], fp_last_error());
                CHECK_MSG(st != FP_OK || (memcmp(fused, D.h_o, o_bytes) == 0 && memcmp(fused_lse, D.h_lse, lse_bytes) == 0),
                          "%s/impl %d: staged merge call %d differs from the register merge", c->name, impls[t],
                          rep + 1);
            }
            fp_attn_merge_stage_set(-1);
            if (st != FP_OK) continue;
            size_t bad = 0, first = 0;
            double max_diff = 0;
            for (size_t i = 0; i < n; ++i) {
                const double a = attn_load(sep, i, c->dtype), b = attn_load(fused, i, c->dtype);
                if (isnan(a) && isnan(b)) continue;
                const double d = fabs(a - b), tol = 2.0 * attn_eps(c->dtype) * fmax(fabs(a), fabs(b)) + 1e-6;
                if (d > max_diff) max_diff = d;
                if (!(d <= tol) && bad++ == 0) first = i;
            }
            for (size_t i = 0; i < lse_bytes / sizeof(float); ++i) {
                const double a = sep_lse[i], b = fused_lse[i];
                if ((isnan(a) && isnan(b)) || a == b) continue;
                if (!(fabs(a - b) <= 1e-5 * fmax(1.0, fabs(a))) && bad++ == 0) first = n + i;
            }
            CHECK_MSG(bad == 0, "%s/impl %d: fused vs separate combine: %zu differ (first at %zu), max diff %.3g",
                      c->name, impls[t], bad, first, max_diff);
            printf("%-20s impl %d: fused vs separate combine max diff %.3g (%d splits)\n", c->name, impls[t],
                   max_diff, k.num_splits);
        }
        free(sep);
        free(fused);
        free(sep_lse);
        free(fused_lse);
        dev_free(&D);
    }
    CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 0));
}

static void test_validate_gpu(void) {
    attn_case c = {"validate", 4, 1024, 1024, 16, 16, 128, FP_BF16, 1, -1, -1, 0, 0, 0, 0};
    if (g_quick) {
        c.batch = 1; c.sq = c.sk = 128; c.hq = c.hkv = 2;
    }
    dev_case D;
    CHECK(dev_make(&c, &D, 11));
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.max_time_s = 0.5;
    if (g_quick) {
        cfg.warmup = 1;
        cfg.min_samples = 2;
        cfg.max_samples = 3;
    }
    fp_ab_report rep;
    CHECK_OK(fp_attention_validate(g_ctx, NULL, &D.dp, &cfg, &rep));
    CHECK(rep.compared == 1);
    CHECK_MSG(rep.agreement.passed, "validate: %zu mismatches, max abs err %g", rep.agreement.mismatches,
              rep.agreement.max_abs_err);
    printf("validate b%d s%d h%d d128 causal bf16: baseline %.3f ms, flash %.3f ms, %.1f TFLOP/s, speedup %.2f\n",
           c.batch, c.sq, c.hq, rep.baseline.median_ms, rep.optimized.median_ms, rep.achieved_tflops, rep.speedup);
    dev_free(&D);
}

/* Validate with varlen offsets read back from the device: the scratch O must
 * cover every sequence's rows, not only up to cu_seqlens_q[batch]. With
 * {0, 48, 16} the second pair decreases (an empty sequence on CUDA), so
 * sequence 0 writes 48 rows while the last offset is 16: a 16-row scratch
 * was overrun (compute-sanitizer: out-of-bounds writes). Negative offsets
 * are rejected. */
static void test_validate_varlen_offsets_gpu(void) {
    enum { B = 2, SQ = 48, SK = 64, H = 2, D = 64 };
    const fp_dtype dt = FP_BF16;
    const size_t elt = fp_dtype_size(dt);
    const size_t nq_el = (size_t)SQ * H * D, nk_el = (size_t)SK * H * D;
    const size_t bytes = (nq_el + 2 * nk_el) * elt;
    void *h = malloc(bytes);
    uint64_t st = 11;
    for (size_t i = 0; i < nq_el + 2 * nk_el; ++i) attn_store(h, i, dt, (float)fp_test_rand_uniform(&st, -1, 1));
    const int32_t cu[2][B + 1] = {{0, SQ, 16}, {0, SK, SK}};
    const int32_t cu_neg[B + 1] = {-16, 0, 16};
    void *d_in = NULL, *d_o = NULL, *d_cu = NULL;
    CHECK_OK(fp_mem_alloc(g_ctx, bytes, &d_in));
    CHECK_OK(fp_mem_alloc(g_ctx, nq_el * elt, &d_o));
    CHECK_OK(fp_mem_alloc(g_ctx, sizeof cu + sizeof cu_neg, &d_cu));
    CHECK_OK(fp_mem_upload(g_ctx, d_in, h, bytes, NULL));
    CHECK_OK(fp_mem_upload(g_ctx, d_cu, cu, sizeof cu, NULL));
    CHECK_OK(fp_mem_upload(g_ctx, (char *)d_cu + sizeof cu, cu_neg, sizeof cu_neg, NULL));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = B; p.seqlen_q = SQ; p.seqlen_k = SK; p.heads_q = H; p.heads_kv = H; p.head_dim = D;
    p.dtype = dt;
    p.q = d_in;
    p.k = (char *)d_in + nq_el * elt;
    p.v = (char *)d_in + (nq_el + nk_el) * elt;
    p.o = d_o;
    p.cu_seqlens_q = d_cu;
    p.cu_seqlens_k = (const int32_t *)d_cu + (B + 1);
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.warmup = 0;
    cfg.min_samples = 1;
    cfg.max_samples = 2;
    fp_ab_report rep;
    CHECK_OK(fp_attention_validate(g_ctx, NULL, &p, &cfg, &rep));
    CHECK(rep.compared == 1 && rep.agreement.count == nq_el);
    CHECK_MSG(rep.agreement.passed, "varlen validate: %zu mismatches", rep.agreement.mismatches);
    p.cu_seqlens_q = (const int32_t *)d_cu + 2 * (B + 1);
    CHECK_STATUS(fp_attention_validate(g_ctx, NULL, &p, &cfg, &rep), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "cu_seqlens_q") != NULL);
    fp_mem_free(g_ctx, d_in);
    fp_mem_free(g_ctx, d_o);
    fp_mem_free(g_ctx, d_cu);
    free(h);
}

/* fp_attention_forward_baseline from two threads on one CUDA context, each
 * with its own stream and output: the header promises thread-safety. Both
 * share the context's cuBLAS handle; without holding it across
 * cublasSetStream and the GEMMs, one thread's GEMMs could land on the other
 * thread's stream, and its own stream synchronization would then return
 * before its O was written (poison read back). A race: this test can pass by
 * luck on unfixed code, but must never fail on fixed code. */
typedef struct baseline_thread {
    dev_case *D;
    const void *ref;      /* expected O bytes */
    int iters, bad;
    fp_status st;
} baseline_thread;

static void *baseline_thread_main(void *arg) {
    baseline_thread *T = arg;
    const size_t bytes = T->D->H.o_bytes;
    cudaStream_t s = NULL;
    void *d_o = NULL, *h_o = malloc(bytes);
    T->st = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess ? FP_OK : FP_ERR_CUDA;
    if (T->st == FP_OK) T->st = fp_mem_alloc(g_ctx, bytes, &d_o);
    fp_attention_params p = T->D->dp;
    p.o = d_o;
    p.lse = NULL;
    for (int i = 0; i < T->iters && T->st == FP_OK && h_o; ++i) {
        T->st = fp_mem_fill(g_ctx, d_o, 0xFF, bytes, (fp_stream)s);
        if (T->st == FP_OK) T->st = fp_attention_forward_baseline(g_ctx, (fp_stream)s, &p);
        if (T->st == FP_OK) T->st = fp_mem_download(g_ctx, h_o, d_o, bytes, (fp_stream)s);
        if (T->st == FP_OK) T->st = cudaStreamSynchronize(s) == cudaSuccess ? FP_OK : FP_ERR_CUDA;
        if (T->st == FP_OK && memcmp(h_o, T->ref, bytes) != 0) T->bad++;
    }
    fp_mem_free(g_ctx, d_o);
    if (s) cudaStreamDestroy(s);
    free(h_o);
    return NULL;
}

static void test_baseline_two_threads_gpu(void) {
    const attn_case c = {"threads", 2, 256, 256, 8, 8, 64, FP_BF16, 1, -1, -1, 0, 0, 0, 0};
    dev_case D;
    if (!dev_make(&c, &D, 21)) {
        CHECK_MSG(0, "threads: device allocation");
        dev_free(&D);
        return;
    }
    CHECK_OK(dev_run(&D, 1)); /* reference: the baseline alone */
    baseline_thread T[2];
    pthread_t th[2];
    for (int t = 0; t < 2; ++t) {
        T[t] = (baseline_thread){&D, D.h_o, g_quick ? 4 : 40, 0, FP_OK};
        CHECK(pthread_create(&th[t], NULL, baseline_thread_main, &T[t]) == 0);
    }
    for (int t = 0; t < 2; ++t) {
        pthread_join(th[t], NULL);
        CHECK_MSG(T[t].st == FP_OK, "thread %d: %s (%s)", t, fp_status_string(T[t].st), fp_last_error());
        CHECK_MSG(T[t].bad == 0, "thread %d: %d of %d outputs differ from the single-thread baseline", t,
                  T[t].bad, T[t].iters);
    }
    dev_free(&D);
}

/* batch > 65535 (grid.z): the flash kernel runs as several launches (b_off)
 * and with forced splits the combine covers every row. Flash only (the
 * baseline issues GEMMs per sequence: 140k cuBLAS calls). */
static void test_batch_over_grid_limit_gpu(void) {
    const attn_case c = {"batch70000", 70000, 2, 5, 2, 1, 64, FP_BF16, 1, -1, -1, 0, 1, 0, 0};
    dev_case D;
    if (!dev_make(&c, &D, 4242)) {
        CHECK_MSG(0, "%s: allocation", c.name);
        dev_free(&D);
        return;
    }
    double *o_ref = NULL, *lse_ref = NULL;
    CHECK(attn_reference(NULL, &D.H, &o_ref, &lse_ref));
    /* 5 keys of |v| <= 1: bf16 rounding of P and O, a few ulps */
    const double tol = 4.0 * attn_eps(FP_BF16);
    const int impls[] = {0, 3};
    for (int t = 0; t < 2; ++t) {
        fp_status st = dev_run(&D, impls[t]);
        CHECK_MSG(st == FP_OK, "%s/impl %d: %s (%s)", c.name, impls[t], fp_status_string(st), fp_last_error());
        if (st != FP_OK) continue;
        attn_err E = attn_compare(&D.H, D.h_o, D.h_lse, o_ref, lse_ref, tol, 0);
        CHECK_MSG(E.bad == 0 && E.lse_bad == 0, "%s/impl %d: %zu bad (first at %zu: got %.6g ref %.6g), lse bad %zu",
                  c.name, impls[t], E.bad, E.first_bad, E.first_got, E.first_ref, E.lse_bad);
    }
    free(o_ref);
    free(lse_ref);
    dev_free(&D);
}

/* FP_CTX_ATTENTION_KERNEL: fp_attention_forward with each preferred version
 * against the reference, by run_case's criterion, on cases each version
 * supports (GQA, windows, ragged decode with splits) and one it does not
 * (head_dim 96: the default kernel runs instead). */
static void test_preferred_kernel_gpu(void) {
    static const attn_case cases[] = {
        /* name              b  sq   sk    hq hkv d    dtype    causal wl  wr scale lse rag str */
        {"pref_bf16_d128_c", 2, 333, 333,  4, 2, 128, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"pref_f16_d64",     1, 200, 700,  4, 4, 64,  FP_F16,  0, 30, 5, 0, 1, 0, 0},
        {"pref_decode",      4, 1,   3000, 8, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 1, 0},
        {"pref_d96",         1, 77,  77,   2, 2, 96,  FP_F16,  1, -1, -1, 0, 1, 0, 0},
        /* what the decode kernel (v6) takes: MQA with a group of 16 (one
         * full 16-row tile), speculative decoding's 4 queries x a group of
         * 4, head_dim 64 */
        {"pref_decode_mqa",  1, 1,   1500, 16, 1, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"pref_spec4_c",     2, 4,   2000, 16, 4, 64,  FP_F16,  1, -1, -1, 0, 1, 1, 0},
    };
    for (int v = 2; v <= 10; ++v) {
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, v));
        printf("FP_CTX_ATTENTION_KERNEL = %d\n", v);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i], IMPLS_DEFAULT);
    }
    CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0));
}

int main(void) {
    g_ctx = fp_test_cuda_context_or_skip();
    g_quick = getenv("FP_TEST_QUICK") != NULL && atoi(getenv("FP_TEST_QUICK")) != 0;
    FP_TEST_TIMED(test_cases());
    FP_TEST_TIMED(test_varlen_gpu(FP_BF16, 64, 1));
    FP_TEST_TIMED(test_huge_window_gpu());
    FP_TEST_TIMED(test_ragged_nan_tail_gpu());
    FP_TEST_TIMED(test_nonfinite_scores_gpu());
    FP_TEST_TIMED(test_split_combine_modes_gpu());
    if (!g_quick) {
        FP_TEST_TIMED(test_varlen_gpu(FP_F16, 128, 0));
        FP_TEST_TIMED(test_varlen_gpu(FP_F32, 64, 1));
    }
    FP_TEST_TIMED(test_bad_input_gpu());
    FP_TEST_TIMED(test_baseline_oom());
    FP_TEST_TIMED(test_validate_gpu());
    FP_TEST_TIMED(test_validate_varlen_offsets_gpu());
    FP_TEST_TIMED(test_baseline_two_threads_gpu());
    if (!g_quick) FP_TEST_TIMED(test_batch_over_grid_limit_gpu());
    FP_TEST_TIMED(test_preferred_kernel_gpu());
    fp_context_destroy(g_ctx);
    TEST_END();
}
