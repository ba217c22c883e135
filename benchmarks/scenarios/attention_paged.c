/* attention/decode_paged: what a paged KV cache costs. Baseline: decode
 * (seqlen_q 1, 32 query / 8 KV heads, head_dim 128) on a dense cache;
 * optimized: the same keys read through a block table of --page (16 and 256
 * by default) keys per page. The dense cache [batch, seqlen_k, 8, 128] is
 * itself a pool of pages laid out in order, so the table maps each sequence
 * onto the same memory and the two outputs must agree exactly (page order
 * does not matter to the kernel beyond page granularity: 16 keys x 8 heads
 * x 128 x 2 B = 32 KiB contiguous per page). Reports KV-read GB/s of the
 * paged side and % of HBM. Expect SAME or a few % slower (an extra table
 * read and an integer division per 16-byte load). Options: --batch, --kv,
 * --page. CPU contexts and --quick run one tiny shape. */
#include <stdlib.h>

#include "fastpath/attention.h"
#include "scenario.h"

typedef struct side {
    fp_context *ctx;
    fp_attention_params p;
} side;

static fp_status run_side(void *user, fp_stream stream) {
    side *s = user;
    return fp_attention_forward(s->ctx, stream, &s->p);
}

static void run_shape(fb_run *run, int batch, int sk, int page) {
    const int hq = 32, hkv = 8, d = 128;
    const fp_dtype dt = FP_BF16;
    fp_context *ctx = fb_ctx(run);
    const fp_device_info *dev = fb_device(run);
    fb_result *r = fb_result_new(run);
    fb_param_int(r, "batch", batch);
    fb_param_int(r, "seqlen_k", sk);
    fb_param_int(r, "page", page);
    const size_t elt = fp_dtype_size(dt);
    const size_t nq = (size_t)batch * hq * d, nk = (size_t)batch * sk * hkv * d;
    const int per_seq = (sk + page - 1) / page;
    /* the pool must hold whole pages: pad the cache to per_seq pages */
    const size_t nk_pool = (size_t)batch * per_seq * page * hkv * d;
    void *q = NULL, *k = NULL, *v = NULL, *o_dense = NULL, *o_paged = NULL;
    int32_t *table = NULL, *h_table = malloc(sizeof(int32_t) * (size_t)batch * per_seq);
    if (!h_table) {
        fb_result_fail(r, FP_ERR_OUT_OF_MEMORY, "host block table");
        return;
    }
    fp_status st = fp_mem_alloc(ctx, nq * elt, &q);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nk_pool * elt, &k);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nk_pool * elt, &v);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * elt, &o_dense);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * elt, &o_paged);
    if (st == FP_OK) st = fp_mem_alloc(ctx, sizeof(int32_t) * (size_t)batch * per_seq, (void **)&table);
    if (st == FP_OK) st = fb_fill_random(ctx, q, nq, dt, 1, -1.0f, 1.0f);
    if (st == FP_OK) st = fb_fill_random(ctx, k, nk_pool, dt, 2, -1.0f, 1.0f);
    if (st == FP_OK) st = fb_fill_random(ctx, v, nk_pool, dt, 3, -1.0f, 1.0f);
    if (st == FP_OK) {
        for (int e = 0; e < batch * per_seq; ++e) h_table[e] = e; /* sequence b: pages b*per_seq.. */
        st = fp_mem_upload(ctx, table, h_table, sizeof(int32_t) * (size_t)batch * per_seq, NULL);
    }
    if (st == FP_OK) {
        side dense = {ctx, {0}}, paged = {ctx, {0}};
        fp_attention_params_default(&dense.p);
        dense.p.batch = batch; dense.p.seqlen_q = 1; dense.p.seqlen_k = sk;
        dense.p.heads_q = hq; dense.p.heads_kv = hkv; dense.p.head_dim = d; dense.p.dtype = dt;
        dense.p.q = q; dense.p.k = k; dense.p.v = v; dense.p.o = o_dense;
        /* batch stride of the padded cache */
        dense.p.k_batch_stride = dense.p.v_batch_stride = (int64_t)per_seq * page * hkv * d;
        paged.p = dense.p;
        paged.p.o = o_paged;
        paged.p.k_batch_stride = paged.p.v_batch_stride = 0; /* packed pages */
        paged.p.block_table = table;
        paged.p.block_table_stride = per_seq;
        paged.p.page_size = page;
        paged.p.num_pages = batch * per_seq;
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = run_side;
        spec.baseline_user = &dense;
        spec.optimized = run_side;
        spec.optimized_user = &paged;
        spec.baseline_out = o_dense;
        spec.optimized_out = o_paged;
        spec.out_count = nq;
        spec.out_dtype = dt;
        spec.atol = spec.rtol = 0; /* same keys, same kernel: exact */
        spec.bytes = (double)elt * (2.0 * nq + 2.0 * nk);
        spec.flops = fp_attention_flops(&dense.p);
        spec.flops_on_tensor_cores = fb_kind(run) == FP_DEVICE_CUDA;
        fp_ab_report rep;
        st = fp_ab_run(ctx, NULL, &spec, fb_timing(run), &rep);
        if (st == FP_OK) {
            fb_result_set_ab(r, &rep);
            const double ms = rep.optimized.median_ms;
            if (ms > 0) {
                const double gbps = 2.0 * (double)nk * elt / (ms * 1e-3) / 1e9;
                fb_result_metric(r, "kv_gbps", gbps);
                if (dev && dev->peak_gbps > 0) fb_result_metric(r, "pct_hbm", 100.0 * gbps / dev->peak_gbps);
            }
        }
    }
    if (st != FP_OK) fb_result_fail(r, st, fp_last_error());
    free(h_table);
    fp_mem_free(ctx, q);
    fp_mem_free(ctx, k);
    fp_mem_free(ctx, v);
    fp_mem_free(ctx, o_dense);
    fp_mem_free(ctx, o_paged);
    fp_mem_free(ctx, table);
}

static fp_status run_decode_paged(fb_run *run) {
    /* --page N runs that page size (any N >= 1) instead of 16 and 256; 0 or
     * a negative value would divide by zero in run_shape */
    const int64_t page = fb_opt_int(run, "page", 16);
    if (page < 1 || page > (1 << 20)) {
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "page", page);
        fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--page must be in [1, 1048576]");
        return FP_OK;
    }
    if (fb_quick(run) || fb_kind(run) != FP_DEVICE_CUDA) {
        run_shape(run, 2, 300, (int)page);
        return FP_OK;
    }
    static const int shapes[][2] = {{1, 32768}, {8, 8192}, {32, 4096}, {1, 131072}};
    const int given = fb_opt_given(run, "page");
    const int pages[] = {given ? (int)page : 16, 256};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        if (fb_opt_given(run, "batch") && fb_opt_int(run, "batch", 0) != shapes[i][0]) continue;
        if (fb_opt_given(run, "kv") && fb_opt_int(run, "kv", 0) != shapes[i][1]) continue;
        for (size_t j = 0; j < (given ? 1u : sizeof pages / sizeof pages[0]); ++j)
            run_shape(run, shapes[i][0], shapes[i][1], pages[j]);
    }
    return FP_OK;
}

FB_SCENARIO(fb_attention_decode_paged, "attention/decode_paged",
            "decode through a paged KV cache (block table, 16/256 keys per page) vs the dense cache",
            run_decode_paged)
