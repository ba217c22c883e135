/* Paged KV cache on a CUDA context (label gpu; exits 77 without a device).
 * The same case with K/V scattered over shuffled pages of a pool (NaN poison
 * everywhere no key maps to) through the flash kernel v1 (the forward's
 * choice and forced splits), the Hopper TMA kernels v5 / v8 / v9 / v10 (asked
 * directly and preferred by the context: on an sm_90a build and a 9.0
 * device they must take page sizes that are multiples of 8 and refuse the
 * others; elsewhere they refuse), the simple kernel (f32, head_dim 80) and
 * the baseline (which gathers the pages first), against the double
 * reference computed on the dense layout. Pass criterion as test_attention_gpu: at most 2x the
 * baseline's error plus a few output ulps. A table entry out of range must
 * not fault (compute-sanitizer checks the reads) and must not disturb the
 * other sequences. */
#include <stdlib.h>
#include <string.h>

#include "attn_test_util.h"

static fp_context *g_ctx;

typedef struct dev_paged {
    attn_host H;
    attn_paged P;
    fp_attention_params dp;
    void *d_q, *d_k, *d_v, *d_o;
    float *d_lse;
    int32_t *d_seqlens, *d_table;
    void *h_o;
    float *h_lse;
} dev_paged;

static int dev_make(const attn_case *c, int page_size, int pad, uint64_t seed, dev_paged *D, double **o_ref,
                    double **lse_ref) {
    memset(D, 0, sizeof *D);
    if (!attn_host_make(c, &D->H, seed)) return 0;
    if (!attn_reference(NULL, &D->H, o_ref, lse_ref)) return 0; /* on the dense layout */
    if (!attn_page(&D->H, page_size, pad, seed + 1, &D->P)) return 0;
    attn_host *H = &D->H;
    const size_t elt = fp_dtype_size(c->dtype);
    const size_t q_bytes = (size_t)c->batch * c->sq * c->hq * c->d * elt;
    const size_t t_bytes = sizeof(int32_t) * (size_t)c->batch * D->P.bt_stride;
    if (fp_mem_alloc(g_ctx, q_bytes, &D->d_q) != FP_OK || fp_mem_alloc(g_ctx, D->P.pool_bytes, &D->d_k) != FP_OK ||
        fp_mem_alloc(g_ctx, D->P.pool_bytes, &D->d_v) != FP_OK || fp_mem_alloc(g_ctx, H->o_bytes, &D->d_o) != FP_OK ||
        fp_mem_alloc(g_ctx, attn_n_lse(&H->p) * sizeof(float), (void **)&D->d_lse) != FP_OK ||
        fp_mem_alloc(g_ctx, sizeof(int32_t) * (size_t)c->batch, (void **)&D->d_seqlens) != FP_OK ||
        fp_mem_alloc(g_ctx, t_bytes, (void **)&D->d_table) != FP_OK)
        return 0;
    fp_mem_upload(g_ctx, D->d_q, H->q, q_bytes, NULL);
    fp_mem_upload(g_ctx, D->d_k, D->P.k_pool, D->P.pool_bytes, NULL);
    fp_mem_upload(g_ctx, D->d_v, D->P.v_pool, D->P.pool_bytes, NULL);
    fp_mem_upload(g_ctx, D->d_table, D->P.table, t_bytes, NULL);
    if (H->seqlens) fp_mem_upload(g_ctx, D->d_seqlens, H->seqlens, sizeof(int32_t) * (size_t)c->batch, NULL);
    D->dp = H->p;
    D->dp.q = D->d_q;
    D->dp.k = D->d_k;
    D->dp.v = D->d_v;
    D->dp.o = D->d_o;
    D->dp.lse = D->d_lse;
    D->dp.seqlens_k = H->seqlens ? D->d_seqlens : NULL;
    D->dp.block_table = D->d_table;
    D->h_o = malloc(H->o_bytes);
    D->h_lse = malloc(attn_n_lse(&H->p) * sizeof(float));
    return D->h_o && D->h_lse && fp_context_synchronize(g_ctx, NULL) == FP_OK;
}

static void dev_free(dev_paged *D) {
    fp_mem_free(g_ctx, D->d_q);
    fp_mem_free(g_ctx, D->d_k);
    fp_mem_free(g_ctx, D->d_v);
    fp_mem_free(g_ctx, D->d_o);
    fp_mem_free(g_ctx, D->d_lse);
    fp_mem_free(g_ctx, D->d_seqlens);
    fp_mem_free(g_ctx, D->d_table);
    free(D->h_o);
    free(D->h_lse);
    attn_paged_free(&D->P);
    attn_host_free(&D->H);
}

/* What a run asks for: fp_attention_forward (ATTN_RUN_FORWARD), the
 * baseline (ATTN_RUN_BASELINE) or flash version `version` with `splits`
 * forced splits. Outputs poisoned first, downloaded after. */
typedef struct run_kind {
    int version, splits;
} run_kind;
static fp_status dev_run(dev_paged *D, run_kind r) {
    return attn_dev_run(g_ctx, &D->dp, r.version, r.splits, D->d_o, D->h_o, D->H.o_bytes, D->d_lse, D->h_lse);
}

/* Whether this build and device run the Hopper kernels (an sm_90a build on
 * a compute capability 9.0 device). */
static int hopper(void) {
#if defined(FASTPATH_HAVE_SM90A) || defined(FP_CUDA_EMU) /* the emulation's library has them (an H100 profile) */
    return attn_device_cc90();
#else
    return 0;
#endif
}

/* Whether the TMA kernel `version` (5, 8, 9, 10) must take the case: on
 * Hopper, f16 / bf16, head_dim 64 / 128 (v10 64 only), page sizes that
 * are multiples of 8 (a page's rows load as TMA boxes of whole 8-row
 * swizzle groups). Elsewhere it must refuse (FP_ERR_UNSUPPORTED). */
static int tma_takes(const attn_case *c, int page_size, int version) {
    return hopper() && c->dtype != FP_F32 && (c->d == 64 || (c->d == 128 && version != 10)) && page_size % 8 == 0;
}

/* The forward with the context preferring `pref` (0: none): on Hopper a
 * preferred TMA kernel that takes the case must run it, and the default
 * runs the TMA kernel of the head dim (v5 at 128, v10 at 64) on the calls
 * with a 128-row tile per (batch, KV head); v1 elsewhere. */
static int forward_version(const attn_case *c, int page_size, int pref, int flash) {
    if (!flash) return 0;
    if ((pref == 5 || pref == 8 || pref == 9 || pref == 10) && tma_takes(c, page_size, pref)) return pref;
    /* a preferred kernel that refuses the call leaves it to the default */
    const int def = c->d == 64 ? 10 : 5;
    if ((int64_t)c->sq * (c->hq / c->hkv) >= 128 && tma_takes(c, page_size, def)) return def;
    return 1;
}

static void run_case(const attn_case *c, int page_size, int pad) {
    dev_paged D;
    double *o_ref = NULL, *lse_ref = NULL;
    if (!dev_make(c, page_size, pad, 500 + (uint64_t)c->sk, &D, &o_ref, &lse_ref)) {
        CHECK_MSG(0, "%s: setup", c->name);
        dev_free(&D);
        free(o_ref);
        free(lse_ref);
        return;
    }
    const run_kind baseline = {ATTN_RUN_BASELINE, 0};
    fp_status st = dev_run(&D, baseline);
    CHECK_MSG(st == FP_OK, "%s/baseline: %s (%s)", c->name, fp_status_string(st), fp_last_error());
    attn_err Eb = attn_compare(&D.H, D.h_o, NULL, o_ref, NULL, INFINITY, 0);
    CHECK_MSG(Eb.bad == 0, "%s/baseline: NaN (a wrong page read?)", c->name);
    const double slack = 4.0 * attn_eps(c->dtype) * (Eb.max_ref > 0 ? Eb.max_ref : 1.0) + 1e-6;
    const double allowed = 2.0 * Eb.max_abs + slack;
    const int flash = c->dtype != FP_F32 && fp_attn_cuda_flash_supported(c->dtype, c->d);
    /* the forward (default, then preferring v8: the TMA kernel on Hopper,
     * and v9: its persistent CTAs), v1 with 2 and 8 splits, the TMA kernels
     * v5 (1 and 3 splits), v8, v9 (1 and 3 splits), v10 */
    static const run_kind runs[] = {{ATTN_RUN_FORWARD, 0}, {ATTN_RUN_FORWARD, 8}, {ATTN_RUN_FORWARD, 9},
                                    {1, 2},                {1, 8},                {5, 1},
                                    {5, 3},                {8, 1},                {9, 1},
                                    {9, 3},                {10, 1}};
    /* FP_TEST_QUICK (the CPU emulation's runs): the TMA kernels on the
     * shorter caches only (the long decode's 157 tiles per CTA are the
     * emulation's minutes, not more coverage) */
    const int tma_here = !(getenv("FP_TEST_QUICK") && c->sk > 1000);
    for (size_t t = 0; t < (flash ? sizeof runs / sizeof runs[0] : 1); ++t) {
        const run_kind r = runs[t];
        if (!tma_here && (r.version >= 5 || (r.version == ATTN_RUN_FORWARD && r.splits))) continue;
        const int pref = r.version == ATTN_RUN_FORWARD ? r.splits : 0;
        const run_kind asked = {r.version, r.version == ATTN_RUN_FORWARD ? 0 : r.splits};
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, pref));
        st = dev_run(&D, asked);
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0));
        const int tma = r.version == 5 || r.version == 8 || r.version == 9 || r.version == 10;
        if (tma && !tma_takes(c, page_size, r.version)) { /* refused, nothing written */
            CHECK_MSG(st == FP_ERR_UNSUPPORTED, "%s/v%d page %d: %s, not refused (%s)", c->name, r.version, page_size,
                      fp_status_string(st), fp_last_error());
            if (hopper() && c->dtype != FP_F32 && (c->d == 64 || (c->d == 128 && r.version != 10)))
                CHECK_MSG(strstr(fp_last_error(), "page_size") != NULL, "%s/v%d page %d: refused for %s", c->name,
                          r.version, page_size, fp_last_error());
            continue;
        }
        CHECK_MSG(st == FP_OK, "%s/v%d x%d: %s (%s)", c->name, r.version, r.splits, fp_status_string(st),
                  fp_last_error());
        if (st != FP_OK) continue;
        attn_err E = attn_compare(&D.H, D.h_o, D.h_lse, o_ref, lse_ref, allowed, 0);
        CHECK_MSG(E.bad == 0 && E.lse_bad == 0,
                  "%s/v%d x%d: %zu bad (first at %zu: got %.6g ref %.6g), max err %.3g vs baseline %.3g, "
                  "lse bad %zu",
                  c->name, r.version, r.splits, E.bad, E.first_bad, E.first_got, E.first_ref, E.max_abs, Eb.max_abs,
                  E.lse_bad);
        /* which kernel ran (fp_attention_last_kernel): through the block
         * table, the version asked with its splits; the forward's choice */
        fp_attention_kernel_info k;
        CHECK_OK(fp_attention_last_kernel(&k));
        const int want = r.version == ATTN_RUN_FORWARD ? forward_version(c, page_size, pref, flash) : r.version;
        CHECK_MSG(k.paged == 1 && k.version == want && (r.version == ATTN_RUN_FORWARD || k.num_splits == r.splits),
                  "%s/v%d x%d: ran %s, %d splits, paged %d (wanted v%d)", c->name, r.version, r.splits, k.kernel,
                  k.num_splits, k.paged, want);
        printf("%-18s page %3d %s%d x%d: max err %.3g (baseline %.3g) ran %s x%d splits%s\n", c->name, page_size,
               r.version == ATTN_RUN_FORWARD ? "forward, preferring v" : "v", r.version == ATTN_RUN_FORWARD ? pref : r.version,
               r.version == ATTN_RUN_FORWARD ? 0 : r.splits, E.max_abs, Eb.max_abs, k.kernel, k.num_splits,
               k.paged ? " (paged)" : "");
    }
    /* Sequence 0's first page entry out of range (one far past the pool,
     * one negative): no fault, the other sequences unchanged (sequence 0's
     * result is unspecified); by the forward's default (v1, or where it
     * takes the case the TMA kernel of the head dim) and, where it
     * takes the case, the TMA kernel v8 (TMA's zeros for the page). */
    if (c->batch > 1) {
        static const int32_t bad_entries[2] = {1000, -7};
        for (int e = 0; e < 2; ++e)
            for (int pref = 0; pref <= 8; pref += 8) {
                if (pref && !(flash && tma_here && tma_takes(c, page_size, pref))) continue;
                const int32_t bad = e == 0 ? D.P.num_pages + bad_entries[0] : bad_entries[1];
                fp_mem_upload(g_ctx, D.d_table, &bad, sizeof bad, NULL);
                const run_kind fwd = {ATTN_RUN_FORWARD, 0};
                CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, pref));
                st = dev_run(&D, fwd);
                CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0));
                CHECK_MSG(st == FP_OK, "%s/bad entry %d (preferring v%d): %s (%s)", c->name, bad, pref,
                          fp_status_string(st), fp_last_error());
                if (st != FP_OK) continue;
                fp_attention_kernel_info k;
                CHECK_OK(fp_attention_last_kernel(&k));
                CHECK_MSG(!pref || k.version == pref, "%s/bad entry: preferring v%d ran %s", c->name, pref, k.kernel);
                const size_t per_b = (size_t)c->sq * c->hq * c->d;
                attn_host H1 = D.H; /* compare sequences 1.. only */
                H1.p.batch = c->batch - 1;
                const size_t elt = fp_dtype_size(c->dtype);
                attn_err E =
                    attn_compare(&H1, (const char *)D.h_o + per_b * elt, NULL, o_ref + per_b, NULL, allowed, 0);
                CHECK_MSG(E.bad == 0, "%s/bad entry %d (%s): %zu bad elements in the other sequences", c->name, bad,
                          k.kernel, E.bad);
            }
    }
    free(o_ref);
    free(lse_ref);
    dev_free(&D);
}

int main(void) {
    g_ctx = fp_test_cuda_context_or_skip();
    static const struct {
        attn_case c;
        int page_size, pad;
    } cases[] = {
        /*  name            b  sq  sk     hq hkv d    dtype    causal wl  wr sc lse rag str  page pad */
        {{"decode_bf16",    4, 1,  4000,  8, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 1, 0}, 16, 0},
        {{"decode_f16_c",   4, 4,  1000,  4, 1, 64,  FP_F16,  1, -1, -1, 0, 1, 1, 0}, 7, 1},
        {{"decode_b1_long", 1, 1,  20000, 8, 8, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0}, 256, 0},
        {{"prefill_bf16",   2, 300, 300,  4, 2, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0}, 64, 0},
        {{"window_f16",     2, 17, 700,   2, 2, 32,  FP_F16,  0, 40, 3, 0, 1, 0, 0}, 100, 1},
        {{"d256_bf16",      2, 9,  333,   2, 1, 256, FP_BF16, 1, -1, -1, 0, 1, 1, 0}, 32, 0},
        {{"f32_rowwise",    3, 2,  500,   4, 2, 64,  FP_F32,  1, -1, -1, 0, 1, 1, 0}, 16, 1},
        {{"d80_rowwise",    2, 3,  300,   2, 2, 80,  FP_BF16, 0, -1, -1, 0, 1, 0, 0}, 17, 0},
        /* prefill over a paged cache (chunked prefill), for the TMA kernels
         * too: 16-row pages (8 boxes a tile), 48 (16-row boxes, pages by
         * division), ragged, GQA */
        {{"prefill_p16_d128", 2, 150, 300, 4, 2, 128, FP_BF16, 1, -1, -1, 0, 1, 1, 0}, 16, 0},
        {{"prefill_p48_f16",  3, 130, 333, 2, 1, 64,  FP_F16,  0, -1, -1, 0, 1, 1, 0}, 48, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        run_case(&cases[i].c, cases[i].page_size, cases[i].pad);
    fp_context_destroy(g_ctx);
    TEST_END();
}
