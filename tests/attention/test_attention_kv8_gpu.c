/* An fp8 (e4m3) KV cache under an f16 / bf16 Q on a CUDA context
 * (kv_dtype FP_FP8_E4M3; label gpu, exits 77 without a device; its
 * emulation run, test_attention_kv8_gpu_emu, runs in CI).
 *
 * K and V are random e4m3 codes (dense, or pages of a pool in a shuffled
 * block table), rows past each ragged sequence's length e4m3 NaN (no kernel
 * may read them). Each case runs:
 *   - the forward (v1, its own split count; the split combine as a kernel
 *     and fused), and v1 with forced splits;
 *   - the same calls on a 16-bit cache holding the same values (e4m3 is
 *     exact in f16 / bf16) with softmax_scale x k_descale: the fp8 path
 *     widens each tile in shared memory and then runs v1's math, so O and
 *     lse must be bit-identical where v_descale is 1, and O within one
 *     rounding of O16 x v_descale otherwise;
 *   - against the double reference (fp_attn_reference) and the CPU
 *     context's forward on the fp8 parameters;
 *   - the decode kernel v6 (preferred, and asked with 3 splits) where it
 *     takes the call (at most 64 packed rows), against v6 on the 16-bit cache;
 *   - preferring v5, v8, v9 (v10 at head_dim 64): on a Hopper device the
 *     cache widened into Q's type (attention_kv8_widen_v0) and that kernel
 *     run on the copy, against the same kernel on the 16-bit cache
 *     (bit-identical where v_descale is 1), the reference and the CPU
 *     forward; elsewhere v1, said by fp_attention_last_kernel;
 *   - with FP_ATTN_KV8_WIDEN=1 the default forward of prefill shapes
 *     widened for v5 / v8 (test_attention_kv8_gpu_emu_widen, also with
 *     FP_ATTN_O_STORE=tma: the one-split case's O through TMA stores,
 *     scaled by v_descale there);
 *   - v2 / v5 / v7 asked directly: FP_ERR_UNSUPPORTED, O untouched.
 * And the refusals: head_dim 96, f32 Q, q_descale != 1, a kv_dtype of
 * another 16-bit type, the CUDA baseline. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_test_util.h"
#include "half.h"

static fp_context *g_ctx, *g_cpu;

typedef struct kv8_case {
    const char *name;
    int batch, sq, sk, hq, hkv, d;
    fp_dtype dt;
    int causal, ragged, page; /* page: 0 dense, else the page size */
    float kd, vd, amp;
} kv8_case;

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static float unit(uint64_t *s) { return (float)((rnd(s) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

static uint16_t to16(fp_dtype dt, float x) { return dt == FP_F16 ? fp_f32_to_f16(x) : fp_f32_to_bf16(x); }
static double from16(fp_dtype dt, uint16_t u) { return dt == FP_F16 ? fp_f16_to_f32(u) : fp_bf16_to_f32(u); }

typedef struct dev_bufs {
    void *q, *k8, *v8, *k16, *v16, *o;
    float *lse;
    int32_t *lens, *bt;
} dev_bufs;

/* Frees every buffer (those never allocated are NULL). */
static void dev_bufs_free(dev_bufs *d) {
    void *all[] = {d->q, d->k8, d->v8, d->k16, d->v16, d->o, d->lse, d->lens, d->bt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) fp_mem_free(g_ctx, all[i]);
    memset(d, 0, sizeof *d);
}

static int upload(void **d, const void *h, size_t n) {
    if (fp_mem_alloc(g_ctx, n, d) != FP_OK) return 0;
    return fp_mem_upload(g_ctx, *d, h, n, NULL) == FP_OK;
}

/* Whether this build and device run the Hopper kernels (an sm_90a build
 * on a compute capability 9.0 device; the emulation's library has them). */
static int hopper_device(void) {
#if defined(FASTPATH_HAVE_SM90A) || defined(FP_CUDA_EMU)
    return attn_device_cc90();
#else
    return 0;
#endif
}

/* O untouched (every byte still the poison 0xFF) after a refused call. */
static int untouched(void *d_o, uint16_t *h_o, size_t n) {
    fp_mem_download(g_ctx, h_o, d_o, n * 2, NULL);
    fp_context_synchronize(g_ctx, NULL);
    for (size_t i = 0; i < n; ++i)
        if (h_o[i] != 0xFFFF) return 0;
    return 1;
}

/* One run's O / lse (o8, lse8) against the 16-bit cache's (o16 x
 * o_scale, lse16: bitwise, or within a rounding), the double reference and
 * the CPU forward. */
static void compare(const kv8_case *c, const fp_attn_args *a, const char *kernel, int splits, const char *how,
                    int bitwise, const uint16_t *o8, const uint16_t *o16, const float *lse8, const float *lse16,
                    const uint16_t *cpu_o, const double *o_ref, const double *lse_ref, size_t nq, size_t lse_n,
                    double vmax) {
    size_t bad16 = 0, bad_ref = 0, bad_cpu = 0, bad_lse = 0;
    double err = 0.0;
    for (size_t i = 0; i < nq; ++i) {
        const double g = from16(c->dt, o8[i]), g16 = from16(c->dt, o16[i]) * a->o_scale;
        const double cpu = from16(c->dt, cpu_o[i]);
        if (bitwise ? o8[i] != o16[i] : !(fabs(g - g16) <= 2.0 * attn_eps(c->dt) * fabs(g16) + 1e-6 * vmax)) bad16++;
        const double e = fabs(g - o_ref[i]);
        if (!(e <= 1e-2 * vmax + 2.0 * attn_eps(c->dt) * fabs(o_ref[i]))) bad_ref++;
        if (!(fabs(g - cpu) <= 1e-2 * vmax + 4.0 * attn_eps(c->dt) * fabs(cpu))) bad_cpu++;
        if (!(e <= err)) err = e;
    }
    for (size_t i = 0; i < lse_n; ++i) {
        if (bitwise ? memcmp(&lse8[i], &lse16[i], 4) != 0
                    : !(lse8[i] == lse16[i] || fabs(lse8[i] - lse16[i]) <= 1e-5 + 1e-6 * fabs(lse16[i])))
            bad_lse++; /* == : both -inf (a row without keys) */
        const double lr = lse_ref[i], lg = lse8[i];
        if (isinf(lr) ? !(isinf(lg) && lg < 0) : !(fabs(lg - lr) <= 1e-4 + 1e-5 * fabs(lr))) bad_lse++;
    }
    CHECK_MSG(!bad16 && !bad_ref && !bad_cpu && !bad_lse,
              "%s/%s x%d: %zu differ from the 16-bit cache, %zu bad vs reference, %zu vs the CPU forward, %zu lse",
              c->name, kernel, splits, bad16, bad_ref, bad_cpu, bad_lse);
    printf("%-16s %-10s x%-3d %s max err %.3g vs reference (max|V| %.3g), %s the 16-bit cache\n", c->name, kernel,
           splits, how, err, vmax, bitwise ? "bit-identical to" : "within a rounding of");
}

static void run_case(const kv8_case *c) {
    const int paged = c->page > 0;
    const int pages_per_seq = paged ? (c->sk + c->page - 1) / c->page : 0;
    const int num_pages = paged ? c->batch * pages_per_seq + 3 : 0; /* a few unused pages */
    const size_t row = (size_t)c->hkv * c->d;                       /* one key of K or V */
    const size_t kv_keys = paged ? (size_t)num_pages * c->page : (size_t)c->batch * c->sk;
    const size_t nq = (size_t)c->batch * c->sq * c->hq * c->d, nkv = kv_keys * row;
    const size_t lse_n = (size_t)c->batch * c->hq * c->sq;
    uint16_t *q = malloc(nq * 2), *k16 = malloc(nkv * 2), *v16 = malloc(nkv * 2);
    uint8_t *k8 = malloc(nkv), *v8 = malloc(nkv);
    uint16_t *o8 = malloc(nq * 2), *o16 = malloc(nq * 2), *cpu_o = malloc(nq * 2);
    float *lse8 = malloc(lse_n * 4), *lse16 = malloc(lse_n * 4), *cpu_lse = malloc(lse_n * 4);
    double *o_ref = malloc(nq * sizeof(double)), *lse_ref = malloc(lse_n * sizeof(double));
    int32_t *lens = malloc(sizeof(int32_t) * (size_t)c->batch);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)(paged ? c->batch * pages_per_seq : 1));
    dev_bufs d;
    memset(&d, 0, sizeof d);
    if (!q || !k16 || !v16 || !k8 || !v8 || !o8 || !o16 || !cpu_o || !lse8 || !lse16 || !cpu_lse || !o_ref ||
        !lse_ref || !lens || !bt) {
        CHECK_MSG(0, "%s: host memory", c->name);
        goto out;
    }
    uint64_t seed = 0x243f6a8885a308d3ull ^ (uint64_t)c->sk * 7919u ^ (uint64_t)c->d;
    for (size_t i = 0; i < nq; ++i) q[i] = to16(c->dt, unit(&seed));
    for (size_t i = 0; i < nkv; ++i) {
        k8[i] = fp_f2e4m3(unit(&seed) * c->amp);
        v8[i] = fp_f2e4m3(unit(&seed) * c->amp);
    }
    static const int rag[4] = {-1, 17, 0, 129};
    for (int b = 0; b < c->batch; ++b)
        lens[b] = !c->ragged || rag[b % 4] < 0 ? c->sk : (rag[b % 4] < c->sk ? rag[b % 4] : c->sk);
    if (paged) { /* sequence b's pages: a shuffle of the pool (pages 0..2 never used) */
        for (int i = 0; i < c->batch * pages_per_seq; ++i) bt[i] = 3 + i;
        for (int i = c->batch * pages_per_seq - 1; i > 0; --i) {
            const int j = (int)(rnd(&seed) % (uint64_t)(i + 1));
            const int32_t t = bt[i];
            bt[i] = bt[j];
            bt[j] = t;
        }
    }
    /* keys past each sequence's length: e4m3 NaN */
    for (int b = 0; b < c->batch; ++b)
        for (int j = lens[b]; j < c->sk; ++j) {
            const size_t key = paged ? (size_t)bt[b * pages_per_seq + j / c->page] * c->page + j % c->page
                                     : (size_t)b * c->sk + j;
            memset(k8 + key * row, 0x7F, row);
            memset(v8 + key * row, 0x7F, row);
        }
    for (size_t i = 0; i < nkv; ++i) { /* the same values, 16-bit (exact) */
        k16[i] = to16(c->dt, fp_e4m3_to_f32(k8[i]));
        v16[i] = to16(c->dt, fp_e4m3_to_f32(v8[i]));
    }

    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = c->batch; p.seqlen_q = c->sq; p.seqlen_k = c->sk; p.heads_q = c->hq; p.heads_kv = c->hkv;
    p.head_dim = c->d; p.dtype = c->dt; p.kv_dtype = FP_FP8_E4M3; p.causal = c->causal;
    p.k_descale = c->kd; p.v_descale = c->vd;
    p.q = q; p.k = k8; p.v = v8; p.o = cpu_o; p.lse = cpu_lse;
    p.seqlens_k = c->ragged ? lens : NULL;
    if (paged) {
        p.block_table = bt; p.block_table_stride = pages_per_seq; p.page_size = c->page; p.num_pages = num_pages;
    }
    fp_attn_args a;
    CHECK_OK(fp_attn_check(&p, 0, &a));
    CHECK_OK(fp_attn_reference(NULL, &a, o_ref, lse_ref));
    CHECK_OK(fp_attention_forward(g_cpu, NULL, &p));
    double vmax = 0.0;
    for (size_t i = 0; i < nkv; ++i) {
        const double x = fabs((double)fp_e4m3_to_f32(v8[i]));
        if (x > vmax && !isnan(x)) vmax = x;
    }
    vmax *= a.o_scale;

    if (!upload(&d.q, q, nq * 2) || !upload(&d.k8, k8, nkv) || !upload(&d.v8, v8, nkv) ||
        !upload(&d.k16, k16, nkv * 2) || !upload(&d.v16, v16, nkv * 2) ||
        !upload((void **)&d.lens, lens, sizeof(int32_t) * (size_t)c->batch) ||
        !upload((void **)&d.bt, bt, sizeof(int32_t) * (size_t)(paged ? c->batch * pages_per_seq : 1)) ||
        fp_mem_alloc(g_ctx, nq * 2, &d.o) != FP_OK || fp_mem_alloc(g_ctx, lse_n * 4, (void **)&d.lse) != FP_OK) {
        CHECK_MSG(0, "%s: device memory", c->name);
        goto out;
    }
    fp_attention_params dp = p, dp16 = p;
    dp.q = d.q; dp.k = d.k8; dp.v = d.v8; dp.o = d.o; dp.lse = d.lse;
    dp.seqlens_k = c->ragged ? d.lens : NULL;
    dp.block_table = paged ? d.bt : NULL;
    dp16 = dp;
    dp16.k = d.k16; dp16.v = d.v16; dp16.kv_dtype = 0; dp16.k_descale = 0; dp16.v_descale = 0;
    /* the scale the fp8 call resolves (softmax_scale x k_descale, rounded once) */
    dp16.softmax_scale = a.scale;

    /* the forward (the combine kernel after the split kernel, then the
     * default fused combine), then v1 with 3 splits; each against the 16-bit
     * cache at the same split count (bitwise where both merge alike: the
     * fused combine sums a row over a warp, the kernel over a block) */
    /* ... and the same through the decode kernel v6 (preferred: it takes
     * calls of at most 64 packed rows, else v1 runs; asked directly with 3
     * splits) */
    const int v6_takes = (int64_t)c->sq * (c->hq / c->hkv) <= 64;
    /* FP_ATTN_KV8_WIDEN=1 (test_attention_kv8_gpu_emu_widen): the default
     * forward widens the cache for v5 / v8 on prefill shapes */
    const char *we = getenv("FP_ATTN_KV8_WIDEN");
    const int auto_widen = we && strcmp(we, "1") == 0 && hopper_device() && (c->d == 64 || c->d == 128) &&
                           (int64_t)c->sq * (c->hq / c->hkv) >= 128;
    static const struct {
        int version, splits, combine, pref;
    } runs[5] = {{ATTN_RUN_FORWARD, 0, 1, 0}, {ATTN_RUN_FORWARD, 0, 0, 0}, {1, 3, 1, 0}, {ATTN_RUN_FORWARD, 0, 0, 6},
                 {6, 3, 1, 0}};
    for (int r = 0; r < 5; ++r) {
        if (runs[r].version == 6 && !v6_takes) continue;
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, runs[r].combine));
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, runs[r].pref));
        fp_status st = attn_dev_run(g_ctx, &dp, runs[r].version, runs[r].splits, d.o, o8, nq * 2, d.lse, lse8);
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 0));
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0));
        CHECK_MSG(st == FP_OK, "%s/run %d: %s (%s)", c->name, r, fp_status_string(st), fp_last_error());
        if (st != FP_OK) continue;
        fp_attention_kernel_info info;
        CHECK_OK(fp_attention_last_kernel(&info));
        const int want = runs[r].version == 6 || (runs[r].pref == 6 && v6_takes) ? 6
                         : auto_widen && runs[r].version == ATTN_RUN_FORWARD && runs[r].pref == 0
                             ? (c->d == 64 ? 10 : 5)
                             : 1;
        CHECK_MSG(info.version == want, "%s/run %d: ran %s, wanted v%d", c->name, r, info.kernel, want);
        const int splits = info.num_splits;
        st = attn_dev_run(g_ctx, &dp16, want, splits, d.o, o16, nq * 2, d.lse, lse16);
        CHECK_MSG(st == FP_OK, "%s/16-bit x%d: %s (%s)", c->name, splits, fp_status_string(st), fp_last_error());
        if (st != FP_OK) continue;
        const int bitwise = a.o_scale == 1.0f && (runs[r].combine || splits == 1 || want != 1);
        compare(c, &a, info.kernel, splits, runs[r].combine ? "combine kernel" : "fused combine ", bitwise, o8, o16,
                lse8, lse16, cpu_o, o_ref, lse_ref, nq, lse_n, vmax);
    }

    /* preferring a Hopper kernel (v5, v8, v9; v10 at head_dim 64): on a
     * compute capability 9.0 device (sm_90a builds) the cache is widened
     * into Q's type and that kernel runs on the copy, which holds the
     * 16-bit cache's values: against the same kernel on the 16-bit cache
     * (the same splits: bit-identical where v_descale is 1; v9 takes no
     * 16-bit paged cache, v8 stands in, within a rounding), the reference
     * and the CPU forward. Elsewhere (other head dims, devices, builds) v1
     * runs and says why. */
    static const int hopper[4] = {5, 8, 9, 10};
    for (int i = 0; i < 4; ++i) {
        const int v = hopper[i];
        if (v == 10 && c->d != 64) continue;
        const int widened = hopper_device() && (c->d == 64 || c->d == 128);
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, v));
        fp_status st = attn_dev_run(g_ctx, &dp, ATTN_RUN_FORWARD, 0, d.o, o8, nq * 2, d.lse, lse8);
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0));
        fp_attention_kernel_info info;
        CHECK_OK(fp_attention_last_kernel(&info));
        CHECK_MSG(st == FP_OK && info.version == (widened ? v : 1) && info.paged == paged &&
                      (widened || strstr(info.fallback, "fp8 KV cache")),
                  "%s preferring v%d: %s, ran %s (paged %d; %s)", c->name, v, fp_status_string(st), info.kernel,
                  info.paged, info.fallback);
        if (st != FP_OK || !widened || info.version != v) continue;
        const int vb = v == 9 && paged ? 8 : v, splits = info.num_splits;
        st = attn_dev_run(g_ctx, &dp16, vb, splits, d.o, o16, nq * 2, d.lse, lse16);
        CHECK_MSG(st == FP_OK, "%s/16-bit v%d x%d: %s (%s)", c->name, vb, splits, fp_status_string(st),
                  fp_last_error());
        if (st != FP_OK) continue;
        compare(c, &a, info.kernel, splits, "widened      ", a.o_scale == 1.0f && vb == v, o8, o16, lse8, lse16,
                cpu_o, o_ref, lse_ref, nq, lse_n, vmax);
    }
    /* v2 / v5 / v7 asked directly (fp_attn_cuda_flash_version): refused, nothing written */
    fp_status st;
    static const int other[3] = {2, 5, 7};
    for (int i = 0; i < 3; ++i) {
        st = attn_dev_run(g_ctx, &dp, other[i], 1, d.o, o8, nq * 2, d.lse, lse8);
        CHECK_MSG(st == FP_ERR_UNSUPPORTED && untouched(d.o, o8, nq), "%s/v%d: %s (%s)", c->name, other[i],
                  fp_status_string(st), fp_last_error());
    }
out:
    dev_bufs_free(&d);
    free(q); free(k16); free(v16); free(k8); free(v8); free(o8); free(o16); free(cpu_o);
    free(lse8); free(lse16); free(cpu_lse); free(o_ref); free(lse_ref); free(lens); free(bt);
}

/* Varlen (cu_seqlens) over a packed fp8 cache, the TMA kernels preferred
 * (v5 at head_dim 128, v8 at 64): widened with total_k (the packed rows,
 * NaN rows no sequence owns among them) against the same kernel on the
 * 16-bit copy (bit-identical: v_descale 1) and the CPU context's forward;
 * without total_k the widening refuses (its extent is device memory) and v1
 * runs, saying so. */
static void varlen_case(int d) {
    enum { B = 3, SQ = 150, SK = 260, HQ = 4, HKV = 2, SPARE = 5 };
    static const int nq[B] = {150, 1, 40}, nk[B] = {260, 17, 131};
    int32_t cu[2 * (B + 1)] = {0}; /* cu_q, then cu_k */
    for (int b = 0; b < B; ++b) {
        cu[b + 1] = cu[b] + nq[b];
        cu[B + 1 + b + 1] = cu[B + 1 + b] + nk[b];
    }
    const int64_t total_k = cu[2 * B + 1] + SPARE;
    const size_t nqe = (size_t)cu[B] * HQ * d, nke = (size_t)total_k * HKV * d, lse_n = (size_t)B * HQ * SQ;
    uint16_t *q = malloc(nqe * 2), *k16 = malloc(nke * 2), *v16 = malloc(nke * 2), *o8 = malloc(nqe * 2);
    uint16_t *o16 = malloc(nqe * 2), *cpu_o = malloc(nqe * 2);
    uint8_t *k8 = malloc(nke), *v8 = malloc(nke);
    float *lse8 = malloc(lse_n * 4), *lse16 = malloc(lse_n * 4), *cpu_lse = malloc(lse_n * 4);
    dev_bufs dv;
    memset(&dv, 0, sizeof dv);
    void *d_cu = NULL;
    if (!q || !k16 || !v16 || !o8 || !o16 || !cpu_o || !k8 || !v8 || !lse8 || !lse16 || !cpu_lse) {
        CHECK_MSG(0, "varlen: host memory");
        goto out;
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)d;
    for (size_t i = 0; i < nqe; ++i) q[i] = fp_f32_to_bf16(unit(&seed));
    for (size_t i = 0; i < nke; ++i) {
        const int spare = i >= (size_t)cu[2 * B + 1] * HKV * d; /* rows past the packed ones: NaN */
        k8[i] = spare ? 0x7F : fp_f2e4m3(unit(&seed) * 8.0f);
        v8[i] = spare ? 0xFF : fp_f2e4m3(unit(&seed) * 8.0f);
        k16[i] = fp_f32_to_bf16(fp_e4m3_to_f32(k8[i]));
        v16[i] = fp_f32_to_bf16(fp_e4m3_to_f32(v8[i]));
    }
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = B; p.seqlen_q = SQ; p.seqlen_k = SK; p.heads_q = HQ; p.heads_kv = HKV; p.head_dim = d;
    p.dtype = FP_BF16; p.kv_dtype = FP_FP8_E4M3; p.causal = 1; p.k_descale = 0.125f;
    p.q = q; p.k = k8; p.v = v8; p.o = cpu_o; p.lse = cpu_lse;
    p.cu_seqlens_q = cu; p.cu_seqlens_k = cu + B + 1;
    for (size_t i = 0; i < lse_n; ++i) cpu_lse[i] = lse8[i] = lse16[i] = -INFINITY;
    CHECK_OK(fp_attention_forward(g_cpu, NULL, &p));
    if (!upload(&dv.q, q, nqe * 2) || !upload(&dv.k8, k8, nke) || !upload(&dv.v8, v8, nke) ||
        !upload(&dv.k16, k16, nke * 2) || !upload(&dv.v16, v16, nke * 2) || !upload(&d_cu, cu, sizeof cu) ||
        fp_mem_alloc(g_ctx, nqe * 2, &dv.o) != FP_OK || fp_mem_alloc(g_ctx, lse_n * 4, (void **)&dv.lse) != FP_OK) {
        CHECK_MSG(0, "varlen: device memory");
        goto out;
    }
    fp_attention_params dp = p;
    dp.q = dv.q; dp.k = dv.k8; dp.v = dv.v8; dp.o = dv.o; dp.lse = dv.lse;
    dp.cu_seqlens_q = d_cu; dp.cu_seqlens_k = (const int32_t *)d_cu + B + 1;
    dp.total_k = total_k;
    fp_attention_params dp16 = dp;
    dp16.kv_dtype = 0; dp16.k = dv.k16; dp16.v = dv.v16; dp16.k_descale = 0;
    fp_attn_args a;
    CHECK_OK(fp_attn_check(&p, 0, &a));
    dp16.softmax_scale = a.scale;
    const int v = d == 64 ? 8 : 5, widened = hopper_device();
    for (int with_total = 1; with_total >= 0; --with_total) {
        dp.total_k = with_total ? total_k : 0;
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, v));
        fp_status st = attn_dev_run(g_ctx, &dp, ATTN_RUN_FORWARD, 0, dv.o, o8, nqe * 2, dv.lse, lse8);
        fp_attention_kernel_info info;
        CHECK_OK(fp_attention_last_kernel(&info));
        const int want = widened && with_total ? v : 1;
        CHECK_MSG(st == FP_OK && info.version == want && (want != 1 || strstr(info.fallback, "fp8 KV cache")),
                  "varlen d%d total_k %d: %s, ran %s (wanted v%d; %s)", d, with_total, fp_status_string(st),
                  info.kernel, want, info.fallback);
        if (st == FP_OK && want == v)
            st = attn_dev_run(g_ctx, &dp16, ATTN_RUN_FORWARD, 0, dv.o, o16, nqe * 2, dv.lse, lse16);
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0));
        if (st != FP_OK) continue;
        size_t bad16 = 0, bad_cpu = 0;
        for (size_t i = 0; i < nqe; ++i) {
            const double g = fp_bf16_to_f32(o8[i]), cpu = fp_bf16_to_f32(cpu_o[i]);
            if (want == v && o8[i] != o16[i]) bad16++;
            if (!(fabs(g - cpu) <= 1e-2 * 8.0 + 4.0 * attn_eps(FP_BF16) * fabs(cpu))) bad_cpu++;
        }
        for (int b = 0; b < B; ++b) /* lse of the real rows (the rest is not written) */
            for (int h = 0; h < HQ; ++h)
                for (int i = 0; i < nq[b]; ++i) {
                    const size_t x = ((size_t)b * HQ + h) * SQ + i;
                    if (want == v && memcmp(&lse8[x], &lse16[x], 4) != 0) bad16++;
                    if (!(fabs(lse8[x] - cpu_lse[x]) <= 1e-4 + 1e-5 * fabs(cpu_lse[x]))) bad_cpu++;
                }
        CHECK_MSG(!bad16 && !bad_cpu, "varlen d%d %s: %zu differ from the 16-bit cache, %zu from the CPU forward", d,
                  info.kernel, bad16, bad_cpu);
        printf("varlen d%-3d      %-10s x%-3d %s\n", d, info.kernel, info.num_splits,
               want == v ? "widened, bit-identical to the 16-bit cache" : "(no total_k: v1)");
    }
out:
    dev_bufs_free(&dv);
    fp_mem_free(g_ctx, d_cu);
    free(q); free(k16); free(v16); free(o8); free(o16); free(cpu_o); free(k8); free(v8);
    free(lse8); free(lse16); free(cpu_lse);
}

/* Calls the CUDA context refuses with nothing written. */
static void refusals(void) {
    const int b = 1, sq = 4, sk = 64, h = 2, d = 96;
    const size_t nq = (size_t)b * sq * h * 128, nkv = (size_t)b * sk * h * 128;
    void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
    uint16_t *h_o = malloc(nq * 4);
    if (!h_o || fp_mem_alloc(g_ctx, nq * 4, &dq) != FP_OK || fp_mem_alloc(g_ctx, nkv, &dk) != FP_OK ||
        fp_mem_alloc(g_ctx, nkv, &dv) != FP_OK || fp_mem_alloc(g_ctx, nq * 4, &dout) != FP_OK) {
        CHECK_MSG(0, "refusals: memory");
        goto out;
    }
    fp_mem_fill(g_ctx, dq, 0, nq * 4, NULL);
    fp_mem_fill(g_ctx, dk, 0, nkv, NULL);
    fp_mem_fill(g_ctx, dv, 0, nkv, NULL);
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = b; p.seqlen_q = sq; p.seqlen_k = sk; p.heads_q = h; p.heads_kv = h; p.head_dim = d;
    p.dtype = FP_BF16; p.kv_dtype = FP_FP8_E4M3; p.q = dq; p.k = dk; p.v = dv; p.o = dout;
    struct {
        const char *what;
        fp_status want;
        int d;
        fp_dtype dt, kv;
        float qd;
        int baseline;
    } cases[] = {
        {"head_dim 96", FP_ERR_UNSUPPORTED, 96, FP_BF16, FP_FP8_E4M3, 0, 0},
        {"f32 Q", FP_ERR_UNSUPPORTED, 128, FP_F32, FP_FP8_E4M3, 0, 0},
        {"q_descale 2", FP_ERR_INVALID_ARGUMENT, 128, FP_BF16, FP_FP8_E4M3, 2.0f, 0},
        {"kv_dtype f16 under bf16", FP_ERR_INVALID_ARGUMENT, 128, FP_BF16, FP_F16, 0, 0},
        {"kv_dtype e5m2", FP_ERR_INVALID_ARGUMENT, 128, FP_BF16, FP_FP8_E5M2, 0, 0},
        {"the CUDA baseline", FP_ERR_UNSUPPORTED, 128, FP_BF16, FP_FP8_E4M3, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        fp_attention_params c = p;
        c.head_dim = cases[i].d; c.dtype = cases[i].dt; c.kv_dtype = cases[i].kv; c.q_descale = cases[i].qd;
        fp_mem_fill(g_ctx, dout, 0xFF, nq * 4, NULL);
        const fp_status st =
            cases[i].baseline ? fp_attention_forward_baseline(g_ctx, NULL, &c) : fp_attention_forward(g_ctx, NULL, &c);
        fp_mem_download(g_ctx, h_o, dout, nq * 4, NULL);
        fp_context_synchronize(g_ctx, NULL);
        int clean = 1;
        for (size_t j = 0; j < nq * 2; ++j) clean &= h_o[j] == 0xFFFF;
        CHECK_MSG(st == cases[i].want && clean, "%s: %s (wanted %s), O %s (%s)", cases[i].what, fp_status_string(st),
                  fp_status_string(cases[i].want), clean ? "untouched" : "written", fp_last_error());
    }
out:
    fp_mem_free(g_ctx, dq);
    fp_mem_free(g_ctx, dk);
    fp_mem_free(g_ctx, dv);
    fp_mem_free(g_ctx, dout);
    free(h_o);
}

int main(void) {
    g_ctx = fp_test_cuda_context_or_skip();
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &g_cpu));
    const int quick = getenv("FP_TEST_QUICK") != NULL; /* the emulation: smaller shapes */
    static const kv8_case full[] = {
        /* name           b   sq    sk     hq  hkv d    dtype    causal rag page kd     vd     amp */
        {"decode",        2,  1,    4000,  32, 8,  128, FP_BF16, 0, 1, 0,   0,     0,     448.0f},
        {"decode_paged",  3,  1,    3000,  32, 8,  128, FP_BF16, 0, 1, 16,  0.01f, 0.02f, 448.0f},
        {"decode_p256",   2,  2,    5000,  16, 2,  128, FP_F16,  1, 0, 256, 0.5f,  0,     16.0f},
        {"prefill_c",     2,  300,  700,   8,  2,  128, FP_BF16, 1, 1, 0,   0.05f, 1.0f,  100.0f},
        {"hd64",          2,  1,    2000,  8,  8,  64,  FP_F16,  0, 0, 32,  0,     0.25f, 4.0f},
        {"hd256",         1,  3,    1500,  8,  1,  256, FP_BF16, 1, 1, 0,   0,     0,     2.0f},
        {"prefill_1tile", 1,  100,  120,   4,  2,  128, FP_BF16, 1, 0, 0,   0.1f,  0.5f,  8.0f},
    };
    static const kv8_case small[] = {
        {"decode",        2,  1,    300,   8,  2,  128, FP_BF16, 0, 1, 0,   0,     0,     448.0f},
        {"decode_paged",  3,  1,    200,   8,  2,  128, FP_BF16, 0, 1, 16,  0.01f, 0.02f, 448.0f},
        {"prefill_c",     1,  70,   150,   2,  1,  128, FP_F16,  1, 0, 0,   0.05f, 1.0f,  100.0f},
        {"hd64_p32",      1,  1,    150,   4,  4,  64,  FP_F16,  0, 0, 32,  0,     0.25f, 4.0f},
        {"hd256",         1,  3,    100,   2,  1,  256, FP_BF16, 1, 1, 0,   0,     0,     2.0f},
        {"prefill_1tile", 1,  100,  120,   4,  2,  128, FP_BF16, 1, 0, 0,   0.1f,  0.5f,  8.0f},
    };
    const kv8_case *cases = quick ? small : full;
    const size_t n = quick ? sizeof small / sizeof small[0] : sizeof full / sizeof full[0];
    for (size_t i = 0; i < n; ++i) run_case(&cases[i]);
    varlen_case(64);
    varlen_case(128);
    refusals();
    fp_context_destroy(g_cpu);
    fp_context_destroy(g_ctx);
    TEST_END();
}
