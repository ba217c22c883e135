/* The CTA timeline on a CUDA context (label gpu; exits 77 without a device;
 * its emulated twins test_attention_cta_trace_gpu_emu and, on 3 SMs with
 * argument "hopper", _emu_3sm run in CI): a traced launch of each recording
 * kernel (v1 on a split-KV decode, the decode kernel v6, v2 and v7 on a
 * prefill, as fp_attention_forward runs them; on Hopper v5, v8 and v9 at
 * head_dim 128 and v10 at 64) writes exactly one record per CTA of its grid
 * (v9: per item) (index, SM, marks in order, its key tiles, the partials'
 * mark on split calls, one merging CTA per query tile) and nothing past it;
 * its output is bit-identical to the untraced launch; a grid larger than
 * the records' capacity, or a thread with no trace set, records nothing.
 * fp_attn_cta_anatomy summarizes every traced launch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_test_util.h"

static fp_context *g_ctx;
static int g_sms;

typedef struct dev_case {
    attn_host H;
    fp_attention_params dp;
    void *d_qkv, *d_o;
    fp_cta_record *d_rec;
    int64_t cap;
} dev_case;

/* Whether records [from, to) are all zero bytes. */
static int all_zero(const fp_cta_record *rec, int64_t from, int64_t to) {
    const unsigned char *b = (const unsigned char *)(rec + from);
    for (size_t k = 0; k < (size_t)(to - from) * sizeof *rec; ++k)
        if (b[k]) return 0;
    return 1;
}

/* Packed query rows per CTA of each recording version. */
static int rows_per_cta(int version) {
    return version == 1 ? 64 : version == 6 ? 16 : version == 10 ? 192 : 128;
}
/* The Hopper kernels (warp-specialized, TMA): no partials' mark, their
 * combine a kernel of its own; v9 no landed mark. */
static int is_tma(int version) { return version == 5 || version == 8 || version == 9 || version == 10; }
/* Key tiles over the records of the last v5 run of each case (v8 and v9
 * cut the same work into the same 128 x 128 tiles: the same sum). */
static int64_t g_tma_tiles = -1;

/* Runs the forward (the context preferring `prefer`, 0: the default) and
 * downloads O into h_o; with records != NULL traced into them (capacity cap).
 * *ctas: the CTAs the launch recorded (fp_attn_cuda_cta_trace_take). */
static fp_status run(dev_case *D, int prefer, fp_cta_record *records, int64_t cap, void *h_o, int64_t *ctas) {
    FP_TRY(fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, prefer));
    FP_TRY(fp_mem_fill(g_ctx, D->d_o, 0xFF, D->H.o_bytes, NULL));
    fp_attn_cuda_cta_trace_set(records, cap);
    fp_status st = fp_attention_forward(g_ctx, NULL, &D->dp);
    *ctas = fp_attn_cuda_cta_trace_take();
    fp_attn_cuda_cta_trace_set(NULL, 0);
    fp_context_set_option(g_ctx, FP_CTX_ATTENTION_KERNEL, 0);
    if (st != FP_OK) return st;
    FP_TRY(fp_context_synchronize(g_ctx, NULL));
    FP_TRY(fp_mem_download(g_ctx, h_o, D->d_o, D->H.o_bytes, NULL));
    return fp_context_synchronize(g_ctx, NULL);
}

static void run_case(const attn_case *c, int prefer, int want_version) {
    dev_case D;
    memset(&D, 0, sizeof D);
    if (!attn_host_make(c, &D.H, 77)) {
        CHECK_MSG(0, "%s: host data", c->name);
        return;
    }
    attn_host *H = &D.H;
    void *o_plain = malloc(H->o_bytes), *o_traced = malloc(H->o_bytes);
    CHECK_OK(fp_mem_alloc(g_ctx, H->qkv_bytes, &D.d_qkv));
    CHECK_OK(fp_mem_alloc(g_ctx, H->o_bytes, &D.d_o));
    CHECK_OK(fp_mem_upload(g_ctx, D.d_qkv, H->qkv, H->qkv_bytes, NULL));
    D.dp = H->p;
    D.dp.q = (char *)D.d_qkv + ((char *)H->q - (char *)H->qkv);
    D.dp.k = (char *)D.d_qkv + ((char *)H->k - (char *)H->qkv);
    D.dp.v = (char *)D.d_qkv + ((char *)H->v - (char *)H->qkv);
    D.dp.o = D.d_o;
    D.dp.lse = NULL;
    D.dp.seqlens_k = NULL;

    /* Untraced: the reference output, the kernel and its split count. */
    int64_t ctas = -1;
    CHECK_OK(run(&D, prefer, NULL, 0, o_plain, &ctas));
    CHECK_MSG(ctas == 0, "%s: an untraced launch noted %lld CTAs", c->name, (long long)ctas);
    fp_attention_kernel_info info;
    fp_attention_last_kernel(&info);
    if (is_tma(want_version) && info.version != want_version) { /* not a Hopper device or build */
        printf("%-14s v%d: not run here (ran %s)\n", c->name, want_version, info.kernel);
        free(o_plain);
        free(o_traced);
        fp_mem_free(g_ctx, D.d_qkv);
        fp_mem_free(g_ctx, D.d_o);
        attn_host_free(&D.H);
        return;
    }
    CHECK_MSG(info.version == want_version, "%s: ran %s, wanted v%d", c->name, info.kernel, want_version);
    const int tma = is_tma(info.version);
    const int splits = info.num_splits > 0 ? info.num_splits : 1;
    const int64_t rows = (int64_t)c->sq * (c->hq / c->hkv);
    const int64_t m_tiles = (rows + rows_per_cta(info.version) - 1) / rows_per_cta(info.version);
    const int64_t grid = m_tiles * splits * c->hkv * c->batch, tiles = m_tiles * c->hkv * c->batch;

    /* Traced, with 5 records to spare: they must stay zero. */
    const int64_t cap = grid + 5;
    fp_cta_record *rec = calloc((size_t)cap, sizeof *rec);
    CHECK_OK(fp_mem_alloc(g_ctx, (size_t)cap * sizeof *rec, (void **)&D.d_rec));
    CHECK_OK(fp_mem_fill(g_ctx, D.d_rec, 0, (size_t)cap * sizeof *rec, NULL));
    CHECK_OK(run(&D, prefer, D.d_rec, cap, o_traced, &ctas));
    CHECK_MSG(ctas == grid, "%s: %lld CTAs recorded, the grid has %lld", c->name, (long long)ctas, (long long)grid);
    CHECK_MSG(memcmp(o_plain, o_traced, H->o_bytes) == 0, "%s: the traced output differs", c->name);
    CHECK_OK(fp_mem_download(g_ctx, rec, D.d_rec, (size_t)cap * sizeof *rec, NULL));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    /* v9: a record per item, written by whichever of its min(items, SMs)
     * persistent CTAs ran it */
    const int64_t v9_ctas = grid < g_sms ? grid : g_sms;
    const int64_t full_tiles = c->causal ? 0 : (c->sk / splits + 127) / 128; /* non-causal, one split: each CTA's */
    int64_t bad = 0, merged = 0, stored = 0, looped = 0, tiles_sum = 0;
    uint32_t v9_cta_max = 0;
    for (int64_t i = 0; i < grid; ++i) {
        const fp_cta_record *r = &rec[i];
        /* a split with no key tile (causal: a query tile's last splits) has
         * neither the landed nor the loop mark, and no tiles */
        int ok = (info.version == 9 ? (int64_t)r->cta < v9_ctas : r->cta == (uint32_t)i) && r->smid < 4096u &&
                 r->t_ns[FP_CTA_START] && r->t_ns[FP_CTA_END] && !r->t_ns[FP_CTA_LOOP] == !r->tiles;
        if (info.version == 9) ok = ok && !r->t_ns[FP_CTA_LANDED];
        else ok = ok && !r->t_ns[FP_CTA_LANDED] == !r->t_ns[FP_CTA_LOOP];
        if (tma && full_tiles && splits == 1 && r->tiles != (uint32_t)full_tiles) ok = 0;
        if (info.version == 9 && r->cta > v9_cta_max) v9_cta_max = r->cta;
        tiles_sum += r->tiles;
        if (r->t_ns[FP_CTA_LOOP]) ++looped;
        for (int k = 1; k < FP_CTA_MARKS; ++k)
            if (r->t_ns[k] && r->t_ns[k] < r->t_ns[FP_CTA_START]) ok = 0;
        if (r->t_ns[FP_CTA_LOOP] < r->t_ns[FP_CTA_LANDED] || r->t_ns[FP_CTA_END] < r->t_ns[FP_CTA_LOOP]) ok = 0;
        if (r->t_ns[FP_CTA_STORED]) {
            ++stored;
            if (r->t_ns[FP_CTA_STORED] < r->t_ns[FP_CTA_LOOP] || r->t_ns[FP_CTA_END] < r->t_ns[FP_CTA_STORED]) ok = 0;
        }
        if (r->flags & ~FP_CTA_MERGED) ok = 0;
        if (r->flags & FP_CTA_MERGED) ++merged;
        if (!ok && bad++ < 3)
            fprintf(stderr, "%s: record %lld: cta %u sm %u flags %u marks %llu %llu %llu %llu %llu\n", c->name,
                    (long long)i, r->cta, r->smid, r->flags, (unsigned long long)r->t_ns[0],
                    (unsigned long long)r->t_ns[1], (unsigned long long)r->t_ns[2], (unsigned long long)r->t_ns[3],
                    (unsigned long long)r->t_ns[4]);
    }
    CHECK_MSG(bad == 0, "%s: %lld of %lld records malformed", c->name, (long long)bad, (long long)grid);
    /* split calls: every CTA stores partials and one per query tile merges */
    /* split calls (v1 / v2 / v7 / v6): every CTA stores partials and one
     * per query tile merges; the Hopper kernels' combine is its own kernel */
    CHECK_MSG(stored == (splits > 1 && !tma ? grid : 0), "%s: %lld CTAs stored partials (%d splits, %lld CTAs)",
              c->name, (long long)stored, splits, (long long)grid);
    CHECK_MSG(merged == (splits > 1 && !tma ? tiles : 0), "%s: %lld merging CTAs for %lld query tiles (%d splits)",
              c->name, (long long)merged, (long long)tiles, splits);
    if (info.version == 5) g_tma_tiles = tiles_sum;
    if (info.version == 8 || info.version == 9)
        CHECK_MSG(g_tma_tiles < 0 || tiles_sum == g_tma_tiles, "%s: v%d's records ran %lld key tiles, v5's %lld",
                  c->name, info.version, (long long)tiles_sum, (long long)g_tma_tiles);
    /* v9 on a device of fewer SMs than items: its CTAs each ran several */
    if (info.version == 9)
        CHECK_MSG((int64_t)v9_cta_max == v9_ctas - 1, "%s: v9's items ran on CTAs 0..%u, its grid has %lld", c->name,
                  v9_cta_max, (long long)v9_ctas);
    CHECK_MSG(looped >= tiles, "%s: %lld CTAs ran the KV loop, fewer than the %lld query tiles", c->name,
              (long long)looped, (long long)tiles);
    CHECK_MSG(all_zero(rec, grid, cap), "%s: a record past the grid was written", c->name);
    fp_cta_anatomy a;
    CHECK_OK(fp_attn_cta_anatomy(rec, cap, &a));
    CHECK(a.ctas == grid && a.merged == merged && a.sms >= 1 && a.sms <= g_sms && a.span_us >= a.start_skew_us);
    CHECK_MSG(a.tiles == tiles_sum && a.busy_pct > 0.0 &&
                  fabs(a.busy_pct + a.head_pct + a.gap_pct + a.tail_pct - 100.0) < 1e-6,
              "%s: anatomy tiles %lld (records %lld), busy %.2f + head %.2f + gap %.2f + tail %.2f %%", c->name,
              (long long)a.tiles, (long long)tiles_sum, a.busy_pct, a.head_pct, a.gap_pct, a.tail_pct);
    printf("%-14s v%d %d split(s) %lld %s on %lld SMs: span %.1f us, skew %.1f, landed p50 %.1f, loop p50 %.1f "
           "max %.1f, merge %.1f, tail %.1f; %lld tiles, %.0f ns a tile; busy %.0f%%, head %.0f, gap %.0f, "
           "tail %.0f\n",
           c->name, info.version, splits, (long long)a.ctas, info.version == 9 ? "items" : "CTAs", (long long)a.sms,
           a.span_us, a.start_skew_us, a.landed_p50_us, a.loop_p50_us, a.loop_max_us, a.merge_max_us, a.tail_us,
           (long long)a.tiles, a.tile_ns_p50, a.busy_pct, a.head_pct, a.gap_pct, a.tail_pct);

    /* A capacity one short of the grid: nothing recorded, nothing written. */
    CHECK_OK(fp_mem_fill(g_ctx, D.d_rec, 0, (size_t)cap * sizeof *rec, NULL));
    CHECK_OK(run(&D, prefer, D.d_rec, grid - 1, o_traced, &ctas));
    CHECK_MSG(ctas == 0, "%s: a grid over the capacity noted %lld CTAs", c->name, (long long)ctas);
    CHECK_MSG(memcmp(o_plain, o_traced, H->o_bytes) == 0, "%s: output differs (capacity short)", c->name);
    memset(rec, 0x5A, (size_t)cap * sizeof *rec);
    CHECK_OK(fp_mem_download(g_ctx, rec, D.d_rec, (size_t)cap * sizeof *rec, NULL));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    CHECK_MSG(all_zero(rec, 0, cap), "%s: records written by a launch over the capacity", c->name);

    fp_mem_free(g_ctx, D.d_rec);
    fp_mem_free(g_ctx, D.d_qkv);
    fp_mem_free(g_ctx, D.d_o);
    free(rec);
    free(o_plain);
    free(o_traced);
    attn_host_free(&D.H);
}

int main(int argc, char **argv) {
    /* "hopper": the Hopper kernels' cases only (the emulation's 3-SM run) */
    const int hopper_only = argc > 1 && strcmp(argv[1], "hopper") == 0;
    g_ctx = fp_test_cuda_context_or_skip();
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev);
    const int quick = fp_test_quick();
    static const attn_case decode = {"decode_bf16", 1, 1, 4096, 8, 2, 128, FP_BF16, 0, -1, -1, 0, 0, 0, 0};
    static const attn_case decode_q = {"decode_bf16", 1, 1, 1024, 8, 2, 128, FP_BF16, 0, -1, -1, 0, 0, 0, 0};
    static const attn_case prefill = {"prefill_f16", 2, 200, 200, 4, 2, 64, FP_F16, 1, -1, -1, 0, 0, 0, 0};
    /* Hopper: causal head_dim 128 over 2 KV heads of 384 packed rows (6
     * query tiles of 128); non-causal, every CTA of one split 3 key tiles */
    static const attn_case hop = {"prefill_d128_c", 1, 192, 256, 4, 2, 128, FP_BF16, 1, -1, -1, 0, 0, 0, 0};
    static const attn_case hop_nc = {"prefill_d128", 1, 128, 320, 4, 2, 128, FP_BF16, 0, -1, -1, 0, 0, 0, 0};
    const attn_case *dc = quick ? &decode_q : &decode;
    if (!hopper_only) {
        run_case(dc, 0, 1);       /* the default: v1 over split-KV, the fused combine */
        run_case(dc, 6, 6);       /* the decode kernel */
        run_case(&prefill, 2, 2); /* v2, 128-row tiles */
        run_case(&prefill, 7, 7); /* v7, 8 warps */
    }
    run_case(&hop, 5, 5);      /* v5: a record per CTA */
    run_case(&hop, 8, 8);      /* v8 */
    run_case(&hop, 9, 9);      /* v9: a record per item */
    run_case(&hop_nc, 5, 5);
    run_case(&hop_nc, 9, 9);
    run_case(&prefill, 10, 10); /* v10 (head_dim 64): 192-row tiles */
    fp_context_destroy(g_ctx);
    TEST_END();
}
