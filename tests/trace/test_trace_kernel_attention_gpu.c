/* The kernel timer (trace.h, FP_TRACE_TIMER_KERNEL) on attention: every
 * kernel of fp_attention_forward's flash and row-wise paths stamps the
 * call's span, so a traced call records no event and its span carries the
 * kernels' own times (label gpu; exits 77 without a device; also run on the
 * emulated runtime, which counts the event records: the H100 profile,
 * test_trace_kernel_attention_gpu_emu, and with one SM, H100 and A100:
 * ..._1sm_gpu_emu, ..._sm80_1sm_gpu_emu, where every call runs one split,
 * so that each version's kernel must claim the span itself).
 *
 * For each path (every preferred version 1-10, the default's choice, split-KV
 * decode with the combine in the split kernel and in its own kernel, paged
 * KV, an fp8 KV cache (widened first on Hopper), fp8 inputs (V transposed
 * first), f32 on the row-wise kernel), one call in a user range:
 *   - a call that ran records no event and leaves host_timed unchanged: its
 *     kernels stamped the span (a path whose first kernel did not claim the
 *     record shows as host_timed); a refused call (fp8 inputs off Hopper)
 *     launches nothing and is the one host-timed span;
 *   - each span ends after it starts, lies inside the range and the host
 *     clock readings around the calls, and the spans follow stream order.
 * The attention baseline (cuBLAS) keeps its two events. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "fp_test.h"
#include "trace_test_util.h"
#include "internal.h"
#include "fastpath/attention.h"

enum { BATCH = 2, HQ = 4, HKV = 2, SK = 256, PAGE = 16, MAX_CASES = 24 };

typedef struct acase {
    const char *what;
    int version;      /* FP_CTX_ATTENTION_KERNEL (0: the default's choice) */
    int combine;      /* FP_CTX_ATTENTION_SPLIT_COMBINE */
    fp_dtype dtype, kv_dtype;
    int head_dim, seqlen_q, causal, paged;
} acase;

typedef struct bufs {
    void *q, *k, *v, *o;
    int32_t *table;
} bufs;

static void params_of(const acase *c, const bufs *b, fp_attention_params *p) {
    fp_attention_params_default(p);
    p->batch = BATCH;
    p->seqlen_q = c->seqlen_q;
    p->seqlen_k = SK;
    p->heads_q = HQ;
    p->heads_kv = HKV;
    p->head_dim = c->head_dim;
    p->dtype = c->dtype;
    p->kv_dtype = c->kv_dtype;
    p->causal = c->causal;
    p->q = b->q;
    p->k = b->k;
    p->v = b->v;
    p->o = b->o;
    if (c->paged) {
        p->block_table = b->table;
        p->block_table_stride = SK / PAGE;
        p->page_size = PAGE;
        p->num_pages = BATCH * SK / PAGE;
    }
}

int main(void) {
    fp_context *ctx = fp_test_cuda_context_or_skip();
    fp_device_info info;
    fp_device_info_init(&info);
    CHECK_OK(fp_context_device_info(ctx, &info));
    const int hopper = info.cc_major == 9;

    /* one buffer each, sized for the largest case (f32, head_dim 128, all
     * keys); filled with a small value in every type */
    const size_t elems = (size_t)BATCH * SK * HQ * 128, bytes = elems * sizeof(float);
    bufs b;
    void **all[] = {&b.q, &b.k, &b.v, &b.o};
    for (int i = 0; i < 4; ++i) {
        CHECK_OK(fp_mem_alloc(ctx, bytes, all[i]));
        CHECK_OK(fp_mem_fill(ctx, *all[i], 0x3c, bytes, NULL));
    }
    /* the block table: sequence s's pages in reverse order */
    int32_t table[BATCH * (SK / PAGE)];
    for (int s = 0; s < BATCH; ++s)
        for (int j = 0; j < SK / PAGE; ++j) table[s * (SK / PAGE) + j] = (s + 1) * (SK / PAGE) - 1 - j;
    CHECK_OK(fp_mem_alloc(ctx, sizeof table, (void **)&b.table));
    CHECK(cudaMemcpy(b.table, table, sizeof table, cudaMemcpyHostToDevice) == cudaSuccess);

    const acase cases[] = {
        {"default prefill", 0, 0, FP_BF16, FP_BF16, 128, 192, 1, 0},
        {"default prefill, head_dim 64", 0, 0, FP_BF16, FP_BF16, 64, 192, 0, 0},
        {"v1", 1, 0, FP_F16, FP_F16, 128, 128, 1, 0},
        {"v2", 2, 0, FP_BF16, FP_BF16, 128, 128, 0, 0},
        {"v3", 3, 0, FP_BF16, FP_BF16, 128, 128, 1, 0},
        {"v4", 4, 0, FP_BF16, FP_BF16, 64, 128, 0, 0},
        {"v5", 5, 0, FP_BF16, FP_BF16, 128, 128, 0, 0},
        {"v7", 7, 0, FP_BF16, FP_BF16, 128, 128, 0, 0},
        {"v8", 8, 0, FP_BF16, FP_BF16, 64, 128, 1, 0},
        {"v9", 9, 0, FP_BF16, FP_BF16, 128, 256, 1, 0},
        {"v10", 10, 0, FP_BF16, FP_BF16, 64, 192, 0, 0},
        {"decode, split combine in the split kernel", 0, 0, FP_BF16, FP_BF16, 128, 1, 0, 0},
        {"decode, the combine kernel", 0, 1, FP_BF16, FP_BF16, 128, 1, 0, 0},
        {"decode v6", 6, 1, FP_BF16, FP_BF16, 128, 1, 0, 0},
        {"paged decode", 0, 0, FP_BF16, FP_BF16, 128, 1, 0, 1},
        {"paged prefill", 0, 0, FP_BF16, FP_BF16, 128, 64, 1, 1},
        {"fp8 KV cache", 0, 0, FP_BF16, FP_FP8_E4M3, 128, 64, 1, 0},
        {"fp8 KV cache, paged decode", 0, 0, FP_F16, FP_FP8_E4M3, 128, 1, 0, 1},
        {"fp8 KV cache widened for v5", 5, 0, FP_BF16, FP_FP8_E4M3, 128, 64, 1, 1},
        {"fp8 inputs", 0, 0, FP_FP8_E4M3, FP_FP8_E4M3, 128, 128, 1, 0},
        {"f32 (row-wise)", 0, 0, FP_F32, FP_F32, 64, 16, 1, 0},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);

    /* warm-up, untraced: first-call setup (attributes, tensor maps,
     * workspace) is not what is checked */
    int ran[MAX_CASES];
    for (int i = 0; i < ncases; ++i) {
        fp_attention_params p;
        params_of(&cases[i], &b, &p);
        CHECK_OK(fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, cases[i].version));
        CHECK_OK(fp_context_set_option(ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, cases[i].combine));
        const fp_status st = fp_attention_forward(ctx, NULL, &p);
        ran[i] = st == FP_OK;
        /* fp8 inputs run on Hopper only; everything else everywhere */
        CHECK_MSG(ran[i] || (cases[i].dtype == FP_FP8_E4M3 && !hopper && st == FP_ERR_UNSUPPORTED),
                  "%s: %s (%s)", cases[i].what, fp_status_string(st), fp_last_error());
    }
    CHECK_OK(fp_context_synchronize(ctx, NULL));

    CHECK_OK(fp_trace_set_timer(ctx, FP_TRACE_TIMER_KERNEL));
    CHECK_OK(fp_trace_enable(ctx, 256));
    fp_trace_stats st = stats_of(ctx);
    const double tol = st.clock_error_s + 2e-6, tol_host = tol + 0.05;
    int refused = 0, splits_seen = 0, paged_seen = 0;
    const double t0 = fp_now_s();
    CHECK_OK(fp_trace_push(ctx, "attention", "forward"));
    for (int i = 0; i < ncases; ++i) {
        fp_attention_params p;
        params_of(&cases[i], &b, &p);
        CHECK_OK(fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, cases[i].version));
        CHECK_OK(fp_context_set_option(ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, cases[i].combine));
        const uint64_t before = stats_of(ctx).host_timed;
        (void)events_since();
        const fp_status s = fp_attention_forward(ctx, NULL, &p);
        const long long ev = events_since();
        CHECK_MSG((s == FP_OK) == ran[i], "%s: %s, then %s", cases[i].what, ran[i] ? "ran" : "refused",
                  fp_status_string(s));
        CHECK_MSG(ev <= 0, "%s: %lld event records", cases[i].what, ev);
        fp_attention_kernel_info k;
        CHECK_OK(fp_attention_last_kernel(&k));
        if (s == FP_OK) {
            CHECK_MSG(cases[i].version == 0 || k.version == cases[i].version || !hopper,
                      "%s: %s ran (%s)", cases[i].what, k.kernel, k.fallback);
            splits_seen += k.num_splits > 1;
            paged_seen += k.paged;
        } else {
            ++refused;
        }
        /* the span resolves now (the read synchronizes): a stamped call is
         * not host-timed */
        const uint64_t after = stats_of(ctx).host_timed;
        CHECK_MSG(after - before == (s == FP_OK ? 0u : 1u), "%s (%s, %d split%s): host_timed %llu -> %llu",
                  cases[i].what, k.kernel, k.num_splits, k.num_splits == 1 ? "" : "s", (unsigned long long)before,
                  (unsigned long long)after);
        printf("%-45s %-9s splits %d%s\n", cases[i].what, s == FP_OK ? k.kernel : "refused", k.num_splits,
               k.paged ? ", paged" : "");
    }
    /* split-KV (the combine) on a full device; on one SM (the emulation's
     * FP_EMU_SM_COUNT=1) every call one split: each version's own kernel
     * must claim the span (no combine after it to do so) */
    CHECK_MSG(paged_seen >= 2 && (info.sm_count > 1 ? splits_seen >= 3 : splits_seen == 0),
              "split-KV calls %d on %d SMs, paged %d", splits_seen, info.sm_count, paged_seen);
    /* the baseline: cuBLAS GEMMs, two events */
    fp_attention_params pb;
    params_of(&cases[0], &b, &pb);
    pb.seqlen_q = 64;
    CHECK_OK(fp_attention_forward_baseline(ctx, NULL, &pb));
    const long long ev = events_since();
    CHECK_MSG(ev == 2 || ev < 0, "%lld event records for the baseline's span", ev);
    CHECK_OK(fp_trace_pop(ctx));
    CHECK_OK(fp_context_synchronize(ctx, NULL));
    const double t1 = fp_now_s();

    fp_trace_span s[64];
    size_t n = 0;
    CHECK_OK(fp_trace_read(ctx, s, 64, &n, 0));
    st = stats_of(ctx);
    /* the range, each case, the baseline, the synchronize */
    CHECK_MSG(n == (size_t)ncases + 3, "%zu spans for %d cases", n, ncases);
    CHECK_MSG(st.unresolved == 0 && st.host_timed == (uint64_t)refused, "unresolved %llu, host-timed %llu (%d refused)",
              (unsigned long long)st.unresolved, (unsigned long long)st.host_timed, refused);
    /* in ring order: the range, the cases, the baseline, the synchronize */
    const fp_trace_span *range = n > 0 ? &s[0] : NULL, *prev = NULL;
    CHECK(range && !strcmp(range->category, "range"));
    for (int i = 0; i < ncases + 1 && range && (size_t)i + 1 < n; ++i) {
        const fp_trace_span *p = &s[i + 1];
        const char *what = i < ncases ? cases[i].what : "the baseline";
        CHECK_MSG(!strncmp(p->name, "attention_", 10), "%s: span %s", what, p->name);
        CHECK_MSG(p->end_s >= p->start_s, "%s: %.9f-%.9f", what, p->start_s, p->end_s);
        CHECK_MSG(p->start_s >= t0 - tol_host && p->end_s <= t1 + tol_host, "%s %.9f-%.9f outside the calls %.9f-%.9f",
                  what, p->start_s, p->end_s, t0, t1);
        CHECK(!strcmp(p->module, "attention") && !strcmp(p->stage, "forward"));
        if (i < ncases && !ran[i]) continue; /* the host clock: may precede the stream's work */
        CHECK_MSG(p->start_s >= range->start_s - tol && p->end_s <= range->end_s + tol,
                  "%s %.9f-%.9f outside the range %.9f-%.9f", what, p->start_s, p->end_s, range->start_s,
                  range->end_s);
        /* stream order: stamped spans exactly, the baseline's events within the calibration */
        if (prev)
            CHECK_MSG(p->start_s >= prev->end_s - (i < ncases ? 0.0 : tol),
                      "%s starts at %.9f before the previous span's end %.9f", what, p->start_s, prev->end_s);
        prev = p;
    }

    CHECK_OK(fp_trace_disable(ctx));
    for (int i = 0; i < 4; ++i) CHECK_OK(fp_mem_free(ctx, *all[i]));
    CHECK_OK(fp_mem_free(ctx, b.table));
    fp_context_destroy(ctx);
    TEST_END();
}
