/* attention/... scenarios: flash attention (fp_attention_forward) against the
 * materialized baseline (fp_attention_forward_baseline) through
 * fp_attention_validate, i.e. fp_ab_run with the outputs compared.
 *
 *   attention/prefill  FlashAttention's benchmark grid: seqlen 512..16k,
 *                      batch = 16384 / seqlen, hidden 2048 (heads = 2048 /
 *                      head_dim), head_dim 64, 128, 256, causal and not, bf16
 *                      and f16. TFLOP/s (4 b h s^2 d, halved when causal) and
 *                      % of the bf16 tensor-core peak. Where the baseline's
 *                      score matrix does not fit, flash alone is timed
 *                      ("baseline OOM").
 *   attention/gqa      the same with 8 query heads per KV head (head_dim 128,
 *                      bf16 unless --head_dim / --dtype say otherwise).
 *   attention/flash_versions  flash kernel v1 vs v2, v1 vs v3 (Hopper
 *                      wgmma; sm_90a builds on H100/H200) and v1 vs v4 (v3
 *                      with its other schedule), v1 vs v5 (TMA producer
 *                      + mbarrier ring), v1 vs v7 (v1 over 8 warps:
 *                      128 x 64 tiles), CUDA only: which one
 *                      fp_attention_forward should run.
 *   attention/decode   seqlen_q 1 against a KV cache of 4k..128k, batch
 *                      1..64, 32 query / 8 KV heads, head_dim 128: KV-cache
 *                      read GB/s and % of HBM bandwidth.
 *   attention/decode_versions  the default decode kernel (v1) vs the
 *                      decode kernel v6 on decode shapes, CUDA only.
 *   attention/decode_anatomy  the same rows, and where each kernel's time
 *                      goes between its CTAs: every CTA of a traced call
 *                      stamps the GPU's global timer at its start, when Q
 *                      and its first K tile landed, after its KV loop, when
 *                      its partials are stored and at its end
 *                      (fp_attn_cuda_cta_trace_set; fp_attn_cta_anatomy);
 *                      CUDA only.
 *   attention/prefill_anatomy  the default prefill kernel (v5 / v10 on
 *                      Hopper) vs v9 (persistent CTAs), and where each
 *                      one's time goes between its SMs: busy, before the
 *                      first CTA, between CTAs, after the last (balance),
 *                      and the loop's time per key tile; CUDA only.
 *   attention/varlen   packed sequences of mixed lengths (cu_seqlens):
 *                      the call without total_k (v3 on Hopper) vs with it
 *                      (v5 / v10), CUDA only.
 *   attention/paged_prefill  prefill over a paged KV cache: v1 (the page
 *                      gather) vs the TMA kernel (v5 / v10, the default on
 *                      Hopper), the TMA kernel dense vs paged, and v5 /
 *                      v10 vs v9 (its persistent CTAs) paged, CUDA only.
 *   attention/fp8      fp8 (e4m3) inputs: bf16 on the same values vs fp8
 *                      (both v5), and fp8 on v5 vs v8, head_dim 128, CUDA
 *                      only (Hopper).
 *   attention/kv8      decode over an fp8 (e4m3) KV cache (kv_dtype) vs a
 *                      bf16 cache of the same values, dense and paged, KV
 *                      GB/s, CUDA only.
 * Options: --seqlen N, --head_dim N, --causal 0|1, --batch N, --kv N restrict
 * the grids (flash_versions: --seqlen N runs any length N, --batch N sets its
 * batch, --heads N its query (= KV) heads, default 2048 / head_dim, --version
 * N keeps that version's rows, --o_tma 1 runs the
 * TMA-store epilogue's rows instead of the others); --dtype picks dtypes; --kernel N (prefill, gqa,
 * decode) times fp_attention_forward with FP_CTX_ATTENTION_KERNEL = N (the
 * flash version it prefers; the row says which was asked). CPU contexts and
 * --quick run a few tiny shapes (the CPU tiled implementation vs the naive
 * one). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h" /* flash kernel versions (static link) */
#include "half.h"                         /* e4m3 <-> f32 (the fp8 scenario's host data) */
#include "fastpath/attention.h"
#include "scenario.h"

static double spec_flops_tflops(double flops, double ms) { return ms > 0.0 ? flops / (ms * 1e-3) / 1e12 : 0.0; }

typedef struct shape {
    int batch, sq, sk, hq, hkv, d, causal;
    fp_dtype dt;
} shape;

typedef struct flash_only {
    fp_context *ctx;
    const fp_attention_params *p;
} flash_only;

static fp_status flash_fn(void *user, fp_stream stream) {
    flash_only *f = user;
    return fp_attention_forward(f->ctx, stream, f->p);
}

/* One result row: validate (A/B) or, when the baseline runs out of memory,
 * flash alone. decode: also report KV-cache read bandwidth. */
static void run_shape(fb_run *run, const shape *s, int decode) {
    fp_context *ctx = fb_ctx(run);
    const int kernel = (int)fb_opt_int(run, "kernel", 0);
    const fp_device_info *dev = fb_device(run);
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "dtype", fp_dtype_name(s->dt));
    fb_param_int(r, "batch", s->batch);
    fb_param_int(r, "seqlen_q", s->sq);
    fb_param_int(r, "seqlen_k", s->sk);
    fb_param_int(r, "heads_q", s->hq);
    fb_param_int(r, "heads_kv", s->hkv);
    fb_param_int(r, "head_dim", s->d);
    fb_param_int(r, "causal", s->causal);
    if (kernel) fb_param_int(r, "kernel", kernel);
    /* --split_combine 1: split-KV merges in a separate kernel
     * (FP_CTX_ATTENTION_SPLIT_COMBINE; default 0, fused) */
    const int split_combine = (int)fb_opt_int(run, "split_combine", 0);
    if (fb_opt_given(run, "split_combine")) fb_param_int(r, "split_combine", split_combine);
    const size_t elt = fp_dtype_size(s->dt);
    const size_t nq = (size_t)s->batch * s->sq * s->hq * s->d;
    const size_t nk = (size_t)s->batch * s->sk * s->hkv * s->d;
    void *q = NULL, *k = NULL, *v = NULL, *o = NULL;
    fp_status st = fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, kernel);
    if (st == FP_OK) st = fp_context_set_option(ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, split_combine);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * elt, &q);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nk * elt, &k);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nk * elt, &v);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * elt, &o);
    if (st == FP_OK) st = fb_fill_random(ctx, q, nq, s->dt, 1, -1.0f, 1.0f);
    if (st == FP_OK) st = fb_fill_random(ctx, k, nk, s->dt, 2, -1.0f, 1.0f);
    if (st == FP_OK) st = fb_fill_random(ctx, v, nk, s->dt, 3, -1.0f, 1.0f);
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = s->batch; p.seqlen_q = s->sq; p.seqlen_k = s->sk;
    p.heads_q = s->hq; p.heads_kv = s->hkv; p.head_dim = s->d;
    p.dtype = s->dt; p.causal = s->causal;
    p.q = q; p.k = k; p.v = v; p.o = o;
    const double flops = fp_attention_flops(&p);
    const double kv_bytes = 2.0 * (double)nk * (double)elt;
    double flash_ms = 0.0;
    if (st == FP_OK) {
        fp_ab_report rep;
        st = fp_attention_validate(ctx, NULL, &p, fb_timing(run), &rep);
        if (st == FP_OK) {
            fb_result_set_ab(r, &rep);
            flash_ms = rep.optimized.median_ms;
        } else if (st == FP_ERR_OUT_OF_MEMORY) {
            /* the baseline's score matrix does not fit: flash alone */
            fp_stats stats;
            flash_only f = {ctx, &p};
            st = fp_time(ctx, NULL, flash_fn, &f, fb_timing(run), &stats);
            if (st == FP_OK) {
                flash_ms = stats.median_ms;
                fb_result_note(r, "baseline OOM (scores %.1f GB): flash only",
                               (double)s->batch * s->hq * (double)s->sq * s->sk * elt / 1e9);
                fb_result_metric(r, "flash_ms", flash_ms);
            }
        }
    }
    if (st == FP_OK && flash_ms > 0.0) {
        double tflops = flops / (flash_ms * 1e-3) / 1e12;
        if (decode) {
            double gbps = kv_bytes / (flash_ms * 1e-3) / 1e9;
            fb_result_metric(r, "kv_gbps", gbps);
            if (dev && dev->peak_gbps > 0) fb_result_metric(r, "pct_hbm", 100.0 * gbps / dev->peak_gbps);
        } else {
            fb_result_metric(r, "tflops", tflops);
            if (dev && dev->peak_tflops_bf16 > 0 && fb_kind(run) == FP_DEVICE_CUDA)
                fb_result_metric(r, "pct_tc_peak", 100.0 * tflops / dev->peak_tflops_bf16);
        }
    }
    if (st != FP_OK) fb_result_fail(r, st, fp_last_error());
    fp_mem_free(ctx, q);
    fp_mem_free(ctx, k);
    fp_mem_free(ctx, v);
    fp_mem_free(ctx, o);
    fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 0);
    fp_context_set_option(ctx, FP_CTX_ATTENTION_SPLIT_COMBINE, 0);
}

static int small_run(fb_run *run) { return fb_quick(run) || fb_kind(run) != FP_DEVICE_CUDA; }

/* One interleaved A/B of two callables that write o1 / o2 (n elements of
 * dt), outputs compared within atol / rtol (< 0: dt's default), on tensor
 * cores (flops, bytes: the roofline figures). */
static fp_status ab_outputs_tol(fb_run *run, fp_timed_fn base, void *base_user, fp_timed_fn opt, void *opt_user,
                                void *o1, void *o2, size_t n, fp_dtype dt, double atol, double rtol, double bytes,
                                double flops, fp_ab_report *rep) {
    fp_ab_spec spec;
    fp_ab_spec_init(&spec);
    spec.baseline = base;
    spec.baseline_user = base_user;
    spec.optimized = opt;
    spec.optimized_user = opt_user;
    spec.baseline_out = o1;
    spec.optimized_out = o2;
    spec.out_count = n;
    spec.out_dtype = dt;
    spec.atol = atol;
    spec.rtol = rtol;
    spec.bytes = bytes;
    spec.flops = flops;
    spec.flops_on_tensor_cores = 1;
    return fp_ab_run(fb_ctx(run), NULL, &spec, fb_timing(run), rep);
}
/* ... within dt's default tolerance */
static fp_status ab_outputs(fb_run *run, fp_timed_fn base, void *base_user, fp_timed_fn opt, void *opt_user, void *o1,
                            void *o2, size_t n, fp_dtype dt, double bytes, double flops, fp_ab_report *rep) {
    return ab_outputs_tol(run, base, base_user, opt, opt_user, o1, o2, n, dt, -1.0, -1.0, bytes, flops, rep);
}

static int dtypes_or(fb_run *run, fp_dtype *dts, int ndef) {
    int n = fb_dtypes(run, dts, 4);
    return n > 0 ? n : ndef;
}

/* The values of option `opt` to run: the one given (any value, not only one
 * of the defaults: a filter that matched none of them used to print no row
 * at all), else the n defaults. Returns the count, 0 when the given value is
 * outside [min, max] (the caller skips with bad_value's message). */
static int values_of(fb_run *run, const char *opt, const int *defs, int n, int min, int max, int *out) {
    if (fb_opt_given(run, opt)) {
        const int64_t v = fb_opt_int(run, opt, defs[0]);
        if (v < min || v > max) return 0;
        out[0] = (int)v;
        return 1;
    }
    for (int i = 0; i < n; ++i) out[i] = defs[i];
    return n;
}

/* FlashAttention's grid (head dims `dims`, default dtypes `dts`), or tiny
 * shapes on the CPU / with --quick. */
static fp_status run_grid(fb_run *run, int group, const int *dims, int ndims, int ndef_dtypes) {
    if (small_run(run)) {
        fp_dtype dts[4] = {FP_BF16};
        int ndt = dtypes_or(run, dts, 1);
        for (int i = 0; i < ndt; ++i)
            for (int causal = 0; causal < 2; ++causal) {
                shape s = {1, 128, 128, 8, 8 / group, 64, causal, dts[i]};
                s.sq = s.sk = (int)fb_opt_int(run, "seqlen", 128);
                run_shape(run, &s, 0);
            }
        return FP_OK;
    }
    static const int seqlen_defs[] = {512, 1024, 2048, 4096, 8192, 16384};
    static const int causal_defs[] = {0, 1};
    int seqlens[6], ds[8], causals[2];
    const int nsl = values_of(run, "seqlen", seqlen_defs, 6, 1, 1 << 24, seqlens);
    const int nd = values_of(run, "head_dim", dims, ndims, 1, 1024, ds);
    const int nc = values_of(run, "causal", causal_defs, 2, 0, 1, causals);
    if (!nsl || !nd || !nc)
        return fb_skip(run, "%s", !nsl  ? "--seqlen must be in [1, 16777216]"
                                 : !nd ? "--head_dim must be in [1, 1024]"
                                       : "--causal must be 0 or 1");
    fp_dtype dts[4] = {FP_BF16, FP_F16};
    int ndt = dtypes_or(run, dts, ndef_dtypes);
    for (int di = 0; di < nd; ++di) {
        int d = ds[di];
        for (int ci = 0; ci < nc; ++ci) {
            const int causal = causals[ci];
            for (int si = 0; si < nsl; ++si) {
                int sl = seqlens[si];
                for (int t = 0; t < ndt; ++t) {
                    const int hq = 2048 / d >= group ? 2048 / d : group;
                    shape s = {sl < 16384 ? 16384 / sl : 1, sl, sl, hq, hq / group, d, causal, dts[t]};
                    run_shape(run, &s, 0);
                }
            }
        }
    }
    return FP_OK;
}

/* prefill: head_dim 64, 128, 256 in bf16 and f16; gqa: head_dim 128 in bf16
 * (--head_dim / --dtype widen it), to keep a full run within minutes. */
static fp_status run_prefill(fb_run *run) {
    static const int dims[] = {64, 128, 256};
    return run_grid(run, 1, dims, 3, 2);
}
static fp_status run_gqa(fb_run *run) {
    static const int dims[] = {64, 128, 256};
    static const int dim128[] = {128};
    return fb_opt_given(run, "head_dim") ? run_grid(run, 8, dims, 3, 1) : run_grid(run, 8, dim128, 1, 1);
}

static fp_status run_decode(fb_run *run) {
    fp_dtype dts[4] = {FP_BF16};
    int ndt = dtypes_or(run, dts, 1);
    if (small_run(run)) {
        for (int t = 0; t < ndt; ++t) {
            shape s = {2, 1, (int)fb_opt_int(run, "kv", 1024), 8, 2, 64, 0, dts[t]};
            run_shape(run, &s, 1);
        }
        return FP_OK;
    }
    static const int kv_defs[] = {4096, 16384, 32768, 131072};
    static const int batch_defs[] = {1, 8, 64};
    int kvs[4], batches[3];
    const int nkv = values_of(run, "kv", kv_defs, 4, 1, 1 << 24, kvs);
    const int nb = values_of(run, "batch", batch_defs, 3, 1, 1 << 16, batches);
    if (!nkv || !nb)
        return fb_skip(run, "%s", !nkv ? "--kv must be in [1, 16777216]" : "--batch must be in [1, 65536]");
    for (int ki = 0; ki < nkv; ++ki) {
        for (int bi = 0; bi < nb; ++bi) {
            shape s = {batches[bi], 1, kvs[ki], 32, 8, 128, 0, FP_BF16};
            /* keep the cache (K + V) under 24 GB so it fits next to the baseline */
            if (2.0 * s.batch * (double)s.sk * s.hkv * s.d * 2.0 > 24e9) continue;
            for (int t = 0; t < ndt; ++t) {
                s.dt = dts[t];
                run_shape(run, &s, 1);
            }
        }
    }
    return FP_OK;
}

/* attention/flash_versions: flash kernel v1 (16 rows per warp) as the
 * baseline against v2 (32 rows per warp), v3 (Hopper wgmma, sm_90a builds on
 * compute capability 9.0 only) and v4 (v3 with the other schedule: plain at
 * head_dim 128, pipelined at 64; what the pipelining buys) and v5 (TMA
 * producer warp + mbarrier ring, setmaxnreg), v7 (v1 over 8 warps), and v5
 * as the baseline against v8 (v5 with ping-pong consumer warpgroups, the
 * kernel that would replace it), v8 as the baseline against v9 (v8 in
 * persistent CTAs: what the tile scheduler buys) and, at head_dim 64 (its
 * only one), against v10 (v8 with three consumer warpgroups: 192-row query
 * tiles), and at head_dim 128 v2's earlier 128 x 32 tile (FP_ATTN_V2_NARROW)
 * as the baseline against its 128 x 64 one (row "v2n_vs_v2") and v5 against
 * its 128 x 176 tile (FP_ATTN_V5_WIDE, row "v5_vs_v5w"), and the default
 * Hopper kernel of each head dim (v5 at 128, v8 at 64) against itself with
 * the epilogue through shared memory and TMA stores (FP_ATTN_O_TMA, rows
 * "v5_vs_v5o" / "v8_vs_v8o"), and v9 against its own ("v9_vs_v9o"): those
 * three rows with --o_tma 1 and only then; and v9 drawing each CTA's next
 * ticket when it starts an item (FP_ATTN_V9_EARLY, session 19's rule) as
 * the baseline against v9 drawing it a few key tiles before the item's end
 * (row "v9e_vs_v9", session 36); outputs
 * compared: the measurement that
 * decides which one fp_attention_forward should use (v5 / v3 on Hopper, v1
 * elsewhere). One result per shape and pair (param "versions"); where
 * v3 .. v5, v8, v9 or v10 are not available their result carries a note saying
 * why. */
typedef struct version_run {
    fp_attn_args a;
    int version;
    fp_context *ctx;
} version_run;

/* The launcher takes a raw CUDA stream: a NULL fp_stream (what fp_ab_run
 * hands its callables) is the context's stream, not CUDA's legacy stream 0,
 * which the context's non-blocking stream does not wait for (launched there,
 * the kernels ran outside the timing events and raced the output check:
 * found by the CUDA emulation's asynchronous streams). */
static fp_status version_fn(void *user, fp_stream stream) {
    version_run *v = user;
    return fp_attn_cuda_flash_version(&v->a, v->version, 1, fp_ctx_stream(v->ctx, stream));
}

static fp_status run_versions(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    fp_context *ctx = fb_ctx(run);
    static const int dims[] = {64, 128};
    static const int seqlens[] = {1024, 4096, 16384};
    fp_dtype dts[4] = {FP_BF16};
    int ndt = dtypes_or(run, dts, 1);
    /* --seqlen N (any N) runs that length only; --batch overrides the batch
     * (default 16384 / seqlen tokens per launch) */
    const int sl_opt = fb_opt_given(run, "seqlen") ? (int)fb_opt_int(run, "seqlen", 1024) : 0;
    if (fb_opt_given(run, "seqlen") && sl_opt < 1) return fb_skip(run, "--seqlen must be >= 1");
    /* --heads N: the heads of every shape (default 2048 / head_dim: a model
     * width of 2048) */
    const int64_t heads_arg = fb_opt_given(run, "heads") ? fb_opt_int(run, "heads", 1) : 0;
    if (fb_opt_given(run, "heads") && (heads_arg < 1 || heads_arg > 1024))
        return fb_skip(run, "--heads must be in [1, 1024]");
    const int heads_opt = (int)heads_arg;
    for (int di = 0; di < 2; ++di)
        for (int causal = 0; causal < 2; ++causal)
            for (int si = fb_quick(run) ? 1 : 0; si < (fb_quick(run) ? 2 : 3); ++si)
                for (int t = 0; t < ndt; ++t) {
                    if (sl_opt && si != (fb_quick(run) ? 1 : 0)) continue; /* one pass over the given length */
                    const int d = dims[di], sl = sl_opt ? sl_opt : seqlens[si], hq = heads_opt ? heads_opt : 2048 / d;
                    const int batch = (int)fb_opt_int(run, "batch", sl < 16384 ? 16384 / sl : 1);
                    if (fb_opt_given(run, "head_dim") && fb_opt_int(run, "head_dim", d) != d) continue;
                    if (batch < 1) continue;
                    const size_t elt = fp_dtype_size(dts[t]), n = (size_t)batch * sl * hq * d;
                    void *q = NULL, *k = NULL, *v = NULL, *o1 = NULL, *o2 = NULL;
                    fp_status st_alloc = fp_mem_alloc(ctx, n * elt, &q);
                    if (st_alloc == FP_OK) st_alloc = fp_mem_alloc(ctx, n * elt, &k);
                    if (st_alloc == FP_OK) st_alloc = fp_mem_alloc(ctx, n * elt, &v);
                    if (st_alloc == FP_OK) st_alloc = fp_mem_alloc(ctx, n * elt, &o1);
                    if (st_alloc == FP_OK) st_alloc = fp_mem_alloc(ctx, n * elt, &o2);
                    if (st_alloc == FP_OK) st_alloc = fb_fill_random(ctx, q, n, dts[t], 1, -1.0f, 1.0f);
                    if (st_alloc == FP_OK) st_alloc = fb_fill_random(ctx, k, n, dts[t], 2, -1.0f, 1.0f);
                    if (st_alloc == FP_OK) st_alloc = fb_fill_random(ctx, v, n, dts[t], 3, -1.0f, 1.0f);
                    fp_attention_params p;
                    fp_attention_params_default(&p);
                    p.batch = batch; p.seqlen_q = p.seqlen_k = sl; p.heads_q = p.heads_kv = hq;
                    p.head_dim = d; p.dtype = dts[t]; p.causal = causal;
                    p.q = q; p.k = k; p.v = v;
                    /* 11: v2 at head_dim 128 against its earlier 128 x 32 tile
                     * (FP_ATTN_V2_NARROW), the row that decides the tile; 12: v5
                     * against its 128 x 176 tile (FP_ATTN_V5_WIDE), head_dim 128;
                     * 13 / 14: v5 (head_dim 128) / v8 (64) against their TMA-store
                     * epilogue (FP_ATTN_O_TMA); 15: v9 against its own; 16: v9
                     * drawing its tickets at each item's start (FP_ATTN_V9_EARLY)
                     * against its draw a few tiles before the end */
                    for (int row = 2; row <= 16; ++row) {
                        const int ver = row == 11   ? 2
                                        : row == 12 ? FP_ATTN_V5_WIDE
                                        : row == 13 ? 5 | FP_ATTN_O_TMA
                                        : row == 14 ? 8 | FP_ATTN_O_TMA
                                        : row == 15 ? 9 | FP_ATTN_O_TMA
                                        : row == 16 ? 9
                                                    : row;
                        /* the version number (the wide tile is v5's, the bit v5's / v8's) */
                        const int vn = ver == FP_ATTN_V5_WIDE ? 5 : ver & ~FP_ATTN_O_TMA;
                        if (row == 6) continue; /* the decode kernel: attention/decode_versions */
                        if (row == 10 && d != 64) continue; /* v10: head_dim 64 only */
                        if ((row == 11 || row == 12 || row == 13) && d != 128)
                            continue; /* the tiles differ at head_dim 128 only; v5 is its default */
                        if (row == 14 && d != 64) continue; /* v8: head_dim 64's default until session 41 */
                        /* --o_tma 1: rows 13-15 alone; without it, none of them */
                        if (!!fb_opt_given(run, "o_tma") != (row >= 13 && row <= 15)) continue;
                        /* --version N: that version's rows only */
                        if (fb_opt_given(run, "version") && fb_opt_int(run, "version", vn) != vn) continue;
                        /* v8 against v5, v9 and v10 against v8 (each against the kernel it
                         * would replace: v8 was the head_dim 64 default until v10); the others
                         * against v1 */
                        static const char *pair[17] = {
                            NULL,       NULL,        "v1_vs_v2",  "v1_vs_v3",  "v1_vs_v4",  "v1_vs_v5", NULL,
                            "v1_vs_v7", "v5_vs_v8",  "v8_vs_v9",  "v8_vs_v10", "v2n_vs_v2", "v5_vs_v5w", "v5_vs_v5o",
                            "v8_vs_v8o", "v9_vs_v9o", "v9e_vs_v9"};
                        static const char *metric[17] = {
                            NULL,        NULL,        "v2_tflops",  "v3_tflops",  "v4_tflops",  "v5_tflops",
                            NULL,        "v7_tflops", "v8_tflops",  "v9_tflops",  "v10_tflops", "v2_tflops",
                            "v5w_tflops", "v5o_tflops", "v8o_tflops", "v9o_tflops", "v9_tflops"};
                        const int base = row == 11   ? FP_ATTN_V2_NARROW
                                         : row == 12 ? 5
                                         : row == 13 ? 5
                                         : row == 14 ? 8
                                         : row == 15 ? 9
                                         : row == 16 ? 9 | FP_ATTN_V9_EARLY
                                         : ver >= 9  ? 8
                                         : ver == 8  ? 5
                                                     : 1;
                        fb_result *r = fb_result_new(run);
                        fb_param_str(r, "versions", pair[row]);
                        fb_param_str(r, "dtype", fp_dtype_name(dts[t]));
                        fb_param_int(r, "batch", batch);
                        fb_param_int(r, "seqlen", sl);
                        fb_param_int(r, "heads", hq);
                        fb_param_int(r, "head_dim", d);
                        fb_param_int(r, "causal", causal);
                        version_run v1 = {.version = base, .ctx = ctx}, vx = {.version = ver, .ctx = ctx};
                        fp_status st = st_alloc;
                        p.o = o1;
                        if (st == FP_OK) st = fp_attn_check(&p, 1, &v1.a);
                        p.o = o2;
                        if (st == FP_OK) st = fp_attn_check(&p, 1, &vx.a);
                        /* scratch (split partials, v9's tickets) from the context's
                         * per-stream workspace, as fp_attention_forward gives it: without
                         * a context every call allocated, zeroed and freed it
                         * (stream-ordered), which the H100 run of session 20 timed into
                         * v9's rows */
                        v1.a.ctx = vx.a.ctx = ctx;
                        if (st == FP_OK && ((vn >= 3 && vn <= 5) || vn >= 8)) {
                            /* v3 .. v5, v8 .. v10 exist only in sm_90a builds on 9.0 devices: one probe call */
                            st = version_fn(&vx, fp_context_stream(ctx));
                            if (st == FP_ERR_UNSUPPORTED) {
                                fb_result_note(r, "v%d%s not available: %s", vn,
                                               ver == FP_ATTN_V5_WIDE  ? " (128 x 176 tile)"
                                               : ver & FP_ATTN_O_TMA ? " (TMA-store epilogue)"
                                                                     : "",
                                               fp_last_error());
                                continue;
                            }
                        }
                        fp_ab_report rep;
                        if (st == FP_OK)
                            st = ab_outputs(run, version_fn, &v1, version_fn, &vx, o1, o2, n, dts[t],
                                            4.0 * (double)n * (double)elt, fp_attention_flops(&p), &rep);
                        if (st == FP_OK) {
                            fb_result_set_ab(r, &rep);
                            fb_result_metric(r, metric[row], rep.achieved_tflops);
                            fb_result_metric(r,
                                             base == 8                        ? "v8_tflops"
                                             : base == 5                      ? "v5_tflops"
                                             : base == FP_ATTN_V2_NARROW      ? "v2n_tflops"
                                             : base == 9                      ? "v9_tflops"
                                             : base == (9 | FP_ATTN_V9_EARLY) ? "v9e_tflops"
                                                                              : "v1_tflops",
                                             spec_flops_tflops(fp_attention_flops(&p), rep.baseline.median_ms));
                        } else {
                            fb_result_fail(r, st, fp_last_error());
                        }
                    }
                    fp_mem_free(ctx, q);
                    fp_mem_free(ctx, k);
                    fp_mem_free(ctx, v);
                    fp_mem_free(ctx, o1);
                    fp_mem_free(ctx, o2);
                    fb_rows_done(run);
                }
    return FP_OK;
}

/* attention/decode_versions: the decode call fp_attention_forward makes by
 * default (baseline: v1's 64-row tiles, split-KV, the fused combine) against
 * the same call with FP_CTX_ATTENTION_KERNEL = 6 (optimized: the decode
 * kernel, its own split count), outputs compared: the measurement that
 * decides whether v6 becomes the decode default (rows default_vs_v6); and
 * the default call with its fused combine merging from registers
 * (baseline) against through shared memory (optimized: one L2 round trip
 * for all the splits' partials, fp_attn_merge_stage; rows
 * merge_reg_vs_staged), which decides FP_ATTN_MERGE_STAGE's default. Shapes: batch 1 x 1024,
 * 4096 and 32768 keys, batch 8 x 4096; 32 query / 8 KV heads of 128, bf16
 * (--kv, --batch, --head_dim, --dtype narrow or widen them; --quick: 8 / 2
 * heads, 1024 keys). Each row says which kernels ran with how many splits.
 * CUDA only. */
typedef struct pref_run {
    fp_context *ctx;
    const fp_attention_params *p;
    int kernel;
} pref_run;

static fp_status pref_fn(void *user, fp_stream stream) {
    pref_run *r = user;
    fp_status st = fp_context_set_option(r->ctx, FP_CTX_ATTENTION_KERNEL, r->kernel);
    return st == FP_OK ? fp_attention_forward(r->ctx, stream, r->p) : st;
}

/* What a call that returned st ran, from fp_attention_last_kernel:
 * "flash_v1 x16" ("?" when it failed). */
static void ran_text(fp_status st, char *buf, size_t n) {
    fp_attention_kernel_info k;
    snprintf(buf, n, "?");
    if (st == FP_OK && fp_attention_last_kernel(&k) == FP_OK)
        snprintf(buf, n, "%s x%d%s%s", k.kernel, k.num_splits, k.fallback[0] ? ", fallback: " : "", k.fallback);
}

/* What pref_fn ran (one more call): "flash_v1 x16". */
static void ran_with(pref_run *r, char *buf, size_t n) { ran_text(pref_fn(r, NULL), buf, n); }

/* The A/B of a row r: base against opt (pref_fn, outputs o1 / o2 of dt
 * compared within atol / rtol, < 0: dt's default) unless setup failed (st),
 * the kernels that ran in the note (base_tag after the baseline's). Returns
 * 1 with *rep filled when it ran, 0 with the row failed. */
static int pref_ab_rep(fb_run *run, fb_result *r, fp_status st, pref_run *base, pref_run *opt, void *o1, void *o2,
                       size_t n, fp_dtype dt, double atol, double rtol, double bytes, double flops,
                       const char *base_tag, fp_ab_report *rep) {
    if (st == FP_OK) st = ab_outputs_tol(run, pref_fn, base, pref_fn, opt, o1, o2, n, dt, atol, rtol, bytes, flops, rep);
    if (st != FP_OK) {
        fb_result_fail(r, st, fp_last_error());
        return 0;
    }
    char b[320], o[320];
    ran_with(base, b, sizeof b);
    ran_with(opt, o, sizeof o);
    fb_result_set_ab(r, rep);
    fb_result_note(r, "baseline %s%s, optimized %s", b, base_tag, o);
    return 1;
}
/* ... with the TFLOP/s of each side under base_metric / opt_metric */
static void pref_ab(fb_run *run, fb_result *r, fp_status st, pref_run *base, pref_run *opt, void *o1, void *o2,
                    size_t n, fp_dtype dt, double atol, double rtol, double bytes, double flops,
                    const char *base_metric, const char *opt_metric, const char *base_tag) {
    fp_ab_report rep;
    if (!pref_ab_rep(run, r, st, base, opt, o1, o2, n, dt, atol, rtol, bytes, flops, base_tag, &rep)) return;
    fb_result_metric(r, base_metric, spec_flops_tflops(flops, rep.baseline.median_ms));
    fb_result_metric(r, opt_metric, spec_flops_tflops(flops, rep.optimized.median_ms));
}

/* A shape's tensors: Q (nq elements) and K, V (nkv) random in [-1, 1) of
 * dt, two outputs of nq elements. attn_bufs_free frees what was allocated. */
typedef struct attn_bufs {
    void *q, *k, *v, *o1, *o2;
} attn_bufs;
static fp_status attn_bufs_alloc(fp_context *ctx, fp_dtype dt, size_t nq, size_t nkv, attn_bufs *b) {
    memset(b, 0, sizeof *b);
    fp_status st = fb_alloc_random(ctx, nq, dt, 1, -1.0f, 1.0f, &b->q);
    if (st == FP_OK) st = fb_alloc_random(ctx, nkv, dt, 2, -1.0f, 1.0f, &b->k);
    if (st == FP_OK) st = fb_alloc_random(ctx, nkv, dt, 3, -1.0f, 1.0f, &b->v);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * fp_dtype_size(dt), &b->o1);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * fp_dtype_size(dt), &b->o2);
    return st;
}
static void attn_bufs_free(fp_context *ctx, attn_bufs *b) {
    fp_mem_free(ctx, b->q);
    fp_mem_free(ctx, b->k);
    fp_mem_free(ctx, b->v);
    fp_mem_free(ctx, b->o1);
    fp_mem_free(ctx, b->o2);
}

/* --kv and --batch of the decode A/B scenarios (0 where not given). Returns
 * 0 when one is outside [1, max], its reason set by fb_skip: the scenario
 * then returns FP_ERR_UNSUPPORTED. */
static int decode_opts(fb_run *run, int kv_max, int b_max, int *kv, int *b) {
    *kv = fb_opt_given(run, "kv") ? (int)fb_opt_int(run, "kv", 0) : 0;
    *b = fb_opt_given(run, "batch") ? (int)fb_opt_int(run, "batch", 0) : 0;
    if (fb_opt_given(run, "kv") && (*kv < 1 || *kv > kv_max)) {
        fb_skip(run, "--kv must be in [1, %d]", kv_max);
        return 0;
    }
    if (fb_opt_given(run, "batch") && (*b < 1 || *b > b_max)) {
        fb_skip(run, "--batch must be in [1, %d]", b_max);
        return 0;
    }
    return 1;
}

/* Records for one traced call: 65536 CTAs (e.g. batch 64 x 8 KV heads x 128
 * splits, 3.7 MB); a larger grid is not traced (the row's note says so). */
#define ANATOMY_RECORDS 65536
/* Traced calls per kernel and row; each metric is their median. */
#define ANATOMY_CALLS 5

/* Under `fastbench trace --out DIR`: a traced call's records (n, of the
 * kernel r's last call ran) as DIR/cta-NN-<prefix>.json (Chrome / Perfetto:
 * fp_attn_cta_export_chrome; NN counts the files of the run), named on
 * stderr. */
static fp_status anatomy_export(fb_run *run, const pref_run *r, const char *prefix, const fp_cta_record *rec,
                                int64_t n) {
    static int files;
    fp_attention_kernel_info k;
    memset(&k, 0, sizeof k);
    fp_attention_last_kernel(&k);
    const fp_attention_params *p = r->p;
    char label[256], path[1024];
    snprintf(label, sizeof label,
             "%s: %s x%d, batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld / %lld, head_dim %lld%s",
             prefix, k.kernel ? k.kernel : "?", k.num_splits, (long long)p->batch, (long long)p->seqlen_q,
             (long long)p->seqlen_k, (long long)p->heads_q, (long long)p->heads_kv, (long long)p->head_dim,
             p->causal ? ", causal" : "");
    const int len = snprintf(path, sizeof path, "%s/cta-%02d-%s.json", fb_out_dir(run), ++files, prefix);
    if (len < 0 || (size_t)len >= sizeof path)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "attention anatomy: --out path too long");
    FP_TRY(fp_attn_cta_export_chrome(rec, n, k.version == 9, label, path));
    fprintf(stderr, "fastbench: CTA timeline %s (%s)\n", path, label);
    return FP_OK;
}

/* The CTA timeline of r's call (attention/decode_anatomy, prefill_anatomy):
 * ANATOMY_CALLS traced calls after the timed ones, each summarized by
 * fp_attn_cta_anatomy, into metrics <prefix>_span_us (first CTA start to
 * last CTA end), _outside_us (kernel_us, the timing engine's median, minus
 * the span: the launch and what the timer sees around the CTAs), _skew_us
 * (first to last CTA start), _landed_us (a CTA's start to its Q and first K
 * tile landed, median), _loop_us / _loop_max_us (the KV loop, median /
 * longest CTA), _merge_us (the merging CTA's combine), _tail_us (the median
 * CTA's end to the last), _ctas (v9: items) and _sms, _tile_ns (a record's
 * loop over its key tiles, median), _epilogue_us (the loop's end to the
 * record's, median), _busy_pct / _head_pct / _gap_pct /
 * _tail_pct (where the SMs' time goes over the span: inside a record,
 * before an SM's first, between its records, after its last); each the
 * median over the calls; `text` gets them in short for the row's note
 * (prefill: the SMs' time and the tile rate; decode: the marks). A kernel
 * that records nothing (v3 / v4) leaves `text` saying so. */
static fp_status anatomy_metrics(fb_run *run, fb_result *res, pref_run *r, const char *prefix, double kernel_us,
                                 int prefill, char *text, size_t text_n) {
    fp_context *ctx = fb_ctx(run);
    const size_t bytes = (size_t)ANATOMY_RECORDS * sizeof(fp_cta_record);
    fp_cta_record *d_rec = NULL, *h_rec = malloc(bytes);
    fp_status st = h_rec ? fp_mem_alloc(ctx, bytes, (void **)&d_rec) : FP_ERR_OUT_OF_MEMORY;
    enum { SPAN, SKEW, LANDED, LOOP, LOOP_MAX, MERGE, TAIL, CTAS, SMS, TILE, EPI, BUSY, HEAD, GAP, SM_TAIL, NM };
    static const char *const names[NM] = {"span_us",  "skew_us",  "landed_us", "loop_us", "loop_max_us", "merge_us",
                                          "tail_us",  "ctas",     "sms",       "tile_ns", "epilogue_us", "busy_pct",
                                          "head_pct", "gap_pct",  "tail_pct"};
    double v[NM][ANATOMY_CALLS];
    int calls = 0;
    int64_t ctas = 0;
    for (int c = 0; c < ANATOMY_CALLS && st == FP_OK; ++c) {
        st = fp_mem_fill(ctx, d_rec, 0, bytes, NULL);
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
        if (st != FP_OK) break;
        fp_attn_cuda_cta_trace_set(d_rec, ANATOMY_RECORDS);
        st = pref_fn(r, NULL);
        ctas = fp_attn_cuda_cta_trace_take();
        fp_attn_cuda_cta_trace_set(NULL, 0);
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
        if (st != FP_OK || ctas == 0) break;
        st = fp_mem_download(ctx, h_rec, d_rec, (size_t)ctas * sizeof(fp_cta_record), NULL);
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
        fp_cta_anatomy a;
        if (st == FP_OK) st = fp_attn_cta_anatomy(h_rec, ctas, &a);
        if (st != FP_OK) break;
        if (c == ANATOMY_CALLS - 1 && fb_out_dir(run)) st = anatomy_export(run, r, prefix, h_rec, ctas);
        if (st != FP_OK) break;
        const double row[NM] = {a.span_us,      a.start_skew_us, a.landed_p50_us,   a.loop_p50_us, a.loop_max_us,
                                a.merge_max_us, a.tail_us,       (double)a.ctas,    (double)a.sms, a.tile_ns_p50,
                                a.epilogue_p50_us, a.busy_pct,   a.head_pct,        a.gap_pct,     a.tail_pct};
        for (int m = 0; m < NM; ++m) v[m][calls] = row[m];
        ++calls;
    }
    snprintf(text, text_n, "%s: no CTA timeline (v3 / v4 record none; a grid of at most %d CTAs)", prefix,
             ANATOMY_RECORDS);
    char key[64];
    double med[NM];
    for (int m = 0; m < NM && calls > 0; ++m) {
        fp_sort_doubles(v[m], calls);
        med[m] = fp_percentile_sorted(v[m], calls, 0.5);
        snprintf(key, sizeof key, "%s_%s", prefix, names[m]);
        fb_result_metric(res, key, med[m]);
        if (m == SPAN) {
            snprintf(key, sizeof key, "%s_outside_us", prefix);
            fb_result_metric(res, key, kernel_us - med[m]);
        }
    }
    if (calls > 0 && prefill) { /* v9 has no landed mark: no first tile */
        char first[32] = "";
        if (med[LANDED] > 0.0) snprintf(first, sizeof first, "first %.2f us, ", med[LANDED]);
        snprintf(text, text_n,
                 "%s: span %.1f us (outside %.1f), busy %.1f%% head %.1f gap %.1f tail %.1f, %stile %.0f ns, "
                 "epi %.2f us",
                 prefix, med[SPAN], kernel_us - med[SPAN], med[BUSY], med[HEAD], med[GAP], med[SM_TAIL], first,
                 med[TILE], med[EPI]);
    } else if (calls > 0) {
        snprintf(text, text_n,
                 "%s: span %.1f (outside %.1f) skew %.1f first %.1f loop %.1f/%.1f merge %.1f tail %.1f us",
                 prefix, med[SPAN], kernel_us - med[SPAN], med[SKEW], med[LANDED], med[LOOP], med[LOOP_MAX],
                 med[MERGE], med[TAIL]);
    }
    if (d_rec) fp_mem_free(ctx, d_rec);
    free(h_rec);
    return st;
}

/* A new row with its versions, dtype and batch parameters. */
static fb_result *row_new(fb_run *run, const char *versions, fp_dtype dt, int batch) {
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "versions", versions);
    fb_param_str(r, "dtype", fp_dtype_name(dt));
    fb_param_int(r, "batch", batch);
    return r;
}

/* One side of a merge_reg_vs_staged row: the call (pref_fn) with the fused
 * combine's staged merge switched to `stage` (fp_attn_merge_stage_set). */
typedef struct merge_run {
    pref_run r;
    int stage;
} merge_run;

static fp_status merge_fn(void *user, fp_stream stream) {
    merge_run *m = user;
    fp_attn_merge_stage_set(m->stage);
    return pref_fn(&m->r, stream);
}

/* kind 0: default_vs_v6 (v1 against the decode kernel); 1:
 * merge_reg_vs_staged (the default call, its fused combine merging from
 * registers against through shared memory: fp_attn_merge_stage). */
static void run_decode_pair(fb_run *run, int batch, int sk, int d, fp_dtype dt, int anatomy, int kind) {
    fp_context *ctx = fb_ctx(run);
    const fp_device_info *dev = fb_device(run);
    const int hq = fb_quick(run) ? 8 : 32, hkv = fb_quick(run) ? 2 : 8;
    fb_result *r = row_new(run, kind ? "merge_reg_vs_staged" : "default_vs_v6", dt, batch);
    fb_param_int(r, "seqlen_k", sk);
    fb_param_int(r, "heads_q", hq);
    fb_param_int(r, "heads_kv", hkv);
    fb_param_int(r, "head_dim", d);
    const size_t elt = fp_dtype_size(dt), nq = (size_t)batch * hq * d, nk = (size_t)batch * sk * hkv * d;
    attn_bufs B;
    fp_status st = attn_bufs_alloc(ctx, dt, nq, nk, &B);
    void *o1 = B.o1, *o2 = B.o2;
    fp_attention_params p1, p2;
    fp_attention_params_default(&p1);
    p1.batch = batch; p1.seqlen_q = 1; p1.seqlen_k = sk;
    p1.heads_q = hq; p1.heads_kv = hkv; p1.head_dim = d; p1.dtype = dt;
    p1.q = B.q; p1.k = B.k; p1.v = B.v; p1.o = o1;
    p2 = p1;
    p2.o = o2;
    /* kind 1: both sides the default kernel, the merge switched per call */
    merge_run base = {{ctx, &p1, 0}, kind ? 0 : -1}, opt = {{ctx, &p2, kind ? 0 : 6}, kind ? 1 : -1};
    const char *bn = kind ? "reg" : "default", *on = kind ? "staged" : "v6";
    fp_ab_report rep;
    const double kv_bytes = 2.0 * (double)nk * (double)elt;
    if (st == FP_OK)
        st = ab_outputs(run, merge_fn, &base, merge_fn, &opt, o1, o2, nq, dt, kv_bytes + 2.0 * (double)nq * (double)elt,
                        fp_attention_flops(&p1), &rep);
    if (st == FP_OK) {
        char b[320], o[320], key[48];
        fp_attn_merge_stage_set(base.stage);
        ran_with(&base.r, b, sizeof b);
        fp_attn_merge_stage_set(opt.stage);
        ran_with(&opt.r, o, sizeof o);
        fb_result_set_ab(r, &rep);
        const double gb_base = kv_bytes / (rep.baseline.median_ms * 1e-3) / 1e9;
        const double gb_opt = kv_bytes / (rep.optimized.median_ms * 1e-3) / 1e9;
        snprintf(key, sizeof key, "%s_kv_gbps", bn);
        fb_result_metric(r, key, gb_base);
        snprintf(key, sizeof key, "%s_kv_gbps", on);
        fb_result_metric(r, key, gb_opt);
        snprintf(key, sizeof key, "%s_pct_hbm", on);
        if (dev && dev->peak_gbps > 0) fb_result_metric(r, key, 100.0 * gb_opt / dev->peak_gbps);
        fb_result_note(r, "baseline %s, optimized %s", b, o);
        if (anatomy) {
            char ta[144] = "", tb[144] = "";
            fp_attn_merge_stage_set(base.stage);
            st = anatomy_metrics(run, r, &base.r, bn, rep.baseline.median_ms * 1e3, 0, ta, sizeof ta);
            fp_attn_merge_stage_set(opt.stage);
            if (st == FP_OK) st = anatomy_metrics(run, r, &opt.r, on, rep.optimized.median_ms * 1e3, 0, tb, sizeof tb);
            if (st != FP_OK) fb_result_fail(r, st, fp_last_error());
            else fb_result_note(r, "baseline %s, optimized %s; %s; %s", b, o, ta, tb);
        }
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_attn_merge_stage_set(-1);
    fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 0);
    attn_bufs_free(ctx, &B);
}

static fp_status decode_versions(fb_run *run, int anatomy) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    fp_dtype dts[4] = {FP_BF16};
    const int ndt = dtypes_or(run, dts, 1);
    const int dim_defs[] = {fb_quick(run) ? 64 : 128};
    int dims[1];
    if (!values_of(run, "head_dim", dim_defs, 1, 1, 1024, dims)) return fb_skip(run, "--head_dim must be in [1, 1024]");
    static const int pairs[4][2] = {{1, 1024}, {1, 4096}, {1, 32768}, {8, 4096}}; /* batch, keys */
    const int quick = fb_quick(run);
    int kv_opt, b_opt;
    if (!decode_opts(run, 1 << 24, 65536, &kv_opt, &b_opt)) return FP_ERR_UNSUPPORTED; /* fb_skip said why */
    /* --kv / --batch: the given shape only (the other from the first default pair) */
    const int given[1][2] = {{b_opt ? b_opt : 1, kv_opt ? kv_opt : 1024}};
    const int(*shapes)[2] = kv_opt || b_opt ? given : pairs;
    const int nshapes = kv_opt || b_opt || quick ? 1 : 4;
    for (int t = 0; t < ndt; ++t)
        for (int i = 0; i < nshapes; ++i)
            for (int kind = 0; kind < 2; ++kind) {
                run_decode_pair(run, shapes[i][0], shapes[i][1], dims[0], dts[t], anatomy, kind);
                fb_rows_done(run);
            }
    return FP_OK;
}
static fp_status run_decode_versions(fb_run *run) { return decode_versions(run, 0); }
static fp_status run_decode_anatomy(fb_run *run) { return decode_versions(run, 1); }

/* attention/prefill_anatomy: where a prefill kernel's time goes between its
 * SMs: the default kernel (kernel 0: v5 at head_dim 128 and v10 at 64 on
 * Hopper, v1 elsewhere) against v9 preferred (its persistent CTAs; other
 * devices fall back, the note says to what), outputs compared, TFLOP/s of
 * each, and per kernel the CTA timeline's metrics (anatomy_metrics): the
 * SMs' busy / head / gap / tail shares of the span and the loop's time per
 * key tile, which separate the causal shapes' balance (tail), the CTAs'
 * turnaround (gap) and the tile rate (tile_ns against the tensor roof).
 * Shapes: FlashAttention's 16384 tokens, 2048 / head_dim heads, bf16:
 * head_dim 128 at 4k non-causal and causal and 16k causal, head_dim 64 at
 * 4k causal (--head_dim and --causal keep the shapes that have them;
 * --seqlen, --batch, --heads replace those of the shapes kept; --dtype;
 * --quick: 256 keys, 2 heads of 64, causal). CUDA only. */
static void run_prefill_anatomy_shape(fb_run *run, int batch, int sl, int hq, int d, int causal, fp_dtype dt) {
    fp_context *ctx = fb_ctx(run);
    fb_result *r = row_new(run, "default_vs_v9", dt, batch);
    fb_param_int(r, "seqlen", sl);
    fb_param_int(r, "heads", hq);
    fb_param_int(r, "head_dim", d);
    fb_param_int(r, "causal", causal);
    const size_t n = (size_t)batch * sl * hq * d, elt = fp_dtype_size(dt);
    attn_bufs B;
    fp_status st = attn_bufs_alloc(ctx, dt, n, n, &B);
    fp_attention_params p1, p2;
    fp_attention_params_default(&p1);
    p1.batch = batch; p1.seqlen_q = p1.seqlen_k = sl;
    p1.heads_q = p1.heads_kv = hq; p1.head_dim = d; p1.dtype = dt; p1.causal = causal;
    p1.q = B.q; p1.k = B.k; p1.v = B.v; p1.o = B.o1;
    p2 = p1;
    p2.o = B.o2;
    pref_run base = {ctx, &p1, 0}, v9 = {ctx, &p2, 9};
    const double flops = fp_attention_flops(&p1);
    fp_ab_report rep;
    if (st == FP_OK)
        st = ab_outputs(run, pref_fn, &base, pref_fn, &v9, B.o1, B.o2, n, dt, 4.0 * (double)n * (double)elt, flops, &rep);
    if (st != FP_OK) {
        fb_result_fail(r, st, fp_last_error());
    } else {
        fb_result_set_ab(r, &rep);
        fb_result_metric(r, "default_tflops", spec_flops_tflops(flops, rep.baseline.median_ms));
        fb_result_metric(r, "v9_tflops", spec_flops_tflops(flops, rep.optimized.median_ms));
        char b[320], o[320], ta[160] = "", tb[160] = "";
        ran_with(&base, b, sizeof b);
        ran_with(&v9, o, sizeof o);
        st = anatomy_metrics(run, r, &base, "default", rep.baseline.median_ms * 1e3, 1, ta, sizeof ta);
        if (st == FP_OK) st = anatomy_metrics(run, r, &v9, "v9", rep.optimized.median_ms * 1e3, 1, tb, sizeof tb);
        if (st != FP_OK) fb_result_fail(r, st, fp_last_error());
        else fb_result_note(r, "baseline %s, optimized %s; %s; %s", b, o, ta, tb);
    }
    fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 0);
    attn_bufs_free(ctx, &B);
}

static fp_status run_prefill_anatomy(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    fp_dtype dts[4] = {FP_BF16};
    const int ndt = dtypes_or(run, dts, 1);
    /* head_dim, seqlen, causal */
    static const int shapes[4][3] = {{128, 4096, 0}, {128, 4096, 1}, {128, 16384, 1}, {64, 4096, 1}};
    static const int quick_shape[3] = {64, 256, 1};
    const int quick = fb_quick(run);
    if (fb_opt_given(run, "seqlen") && (fb_opt_int(run, "seqlen", 1) < 1 || fb_opt_int(run, "seqlen", 1) > 1 << 20))
        return fb_skip(run, "--seqlen must be in [1, 1048576]");
    if (fb_opt_given(run, "batch") && (fb_opt_int(run, "batch", 1) < 1 || fb_opt_int(run, "batch", 1) > 65535))
        return fb_skip(run, "--batch must be in [1, 65535]");
    if (fb_opt_given(run, "heads") && (fb_opt_int(run, "heads", 1) < 1 || fb_opt_int(run, "heads", 1) > 1024))
        return fb_skip(run, "--heads must be in [1, 1024]");
    for (int t = 0; t < ndt; ++t)
        for (int i = 0; i < (quick ? 1 : 4); ++i) {
            const int *sh = quick ? quick_shape : shapes[i];
            const int d = sh[0], causal = sh[2];
            /* --head_dim / --causal keep the shapes that have it */
            if (fb_opt_given(run, "head_dim") && fb_opt_int(run, "head_dim", d) != d) continue;
            if (fb_opt_given(run, "causal") && !!fb_opt_int(run, "causal", causal) != causal) continue;
            const int sl = fb_opt_given(run, "seqlen") ? (int)fb_opt_int(run, "seqlen", sh[1]) : sh[1];
            const int hq = fb_opt_given(run, "heads") ? (int)fb_opt_int(run, "heads", 1) : quick ? 2 : 2048 / d;
            const int batch = fb_opt_given(run, "batch") ? (int)fb_opt_int(run, "batch", 1)
                              : quick || sl >= 16384 ? 1
                                                     : 16384 / sl;
            run_prefill_anatomy_shape(run, batch, sl, hq, d, causal, dts[t]);
        }
    return FP_OK;
}

/* attention/varlen: a packed batch of sequences of mixed lengths
 * (cu_seqlens: 4096, 1024, 2048, 512, 3072, 1536, 2560, 1536 = 16384 tokens,
 * --quick 150, 37, 0, 90), 2048 / head_dim heads (--quick 2), head_dim 64
 * and 128, causal and not, bf16: fp_attention_forward without total_k as the
 * baseline (on Hopper v3, the cp.async wgmma kernel: what every varlen call
 * ran before total_k) against the same call given total_k (on Hopper v5 at
 * head_dim 128, v10 at 64: the TMA kernels, which need the packed extent for
 * their tensor maps), outputs compared; elsewhere both run v1. TFLOP/s over
 * the sequences' own lengths (4 h Lq Lk d each, halved when causal); the
 * note says which kernels ran. CUDA only. */
static void run_varlen_shape(fb_run *run, const int *lens, int nseq, int d, int hq, int causal, fp_dtype dt) {
    fp_context *ctx = fb_ctx(run);
    int32_t cu[16] = {0};
    int maxlen = 1;
    double flops = 0.0;
    for (int b = 0; b < nseq; ++b) {
        cu[b + 1] = cu[b] + lens[b];
        if (lens[b] > maxlen) maxlen = lens[b];
        flops += 4.0 * hq * (double)lens[b] * lens[b] * d * (causal ? 0.5 : 1.0);
    }
    const int64_t total = cu[nseq];
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "versions", "no_total_k_vs_total_k");
    fb_param_str(r, "dtype", fp_dtype_name(dt));
    fb_param_int(r, "sequences", nseq);
    fb_param_int(r, "tokens", total);
    fb_param_int(r, "max_seqlen", maxlen);
    fb_param_int(r, "heads", hq);
    fb_param_int(r, "head_dim", d);
    fb_param_int(r, "causal", causal);
    const size_t elt = fp_dtype_size(dt), n = (size_t)total * hq * d;
    attn_bufs B;
    void *cu_d = NULL;
    fp_status st = attn_bufs_alloc(ctx, dt, n, n, &B);
    if (st == FP_OK) st = fp_mem_alloc(ctx, sizeof cu, &cu_d);
    if (st == FP_OK) st = fp_mem_upload(ctx, cu_d, cu, sizeof cu, NULL);
    if (st == FP_OK) st = fp_context_synchronize(ctx, NULL); /* cu lives on this frame */
    fp_attention_params p1, p2;
    fp_attention_params_default(&p1);
    p1.batch = nseq; p1.seqlen_q = p1.seqlen_k = maxlen; p1.heads_q = p1.heads_kv = hq;
    p1.head_dim = d; p1.dtype = dt; p1.causal = causal;
    p1.q = B.q; p1.k = B.k; p1.v = B.v; p1.o = B.o1;
    p1.cu_seqlens_q = p1.cu_seqlens_k = cu_d;
    p2 = p1;
    p2.o = B.o2;
    p2.total_k = total;
    pref_run base = {ctx, &p1, 0}, opt = {ctx, &p2, 0};
    pref_ab(run, r, st, &base, &opt, B.o1, B.o2, n, dt, -1.0, -1.0, 4.0 * (double)n * (double)elt, flops,
            "no_total_k_tflops", "total_k_tflops", "");
    attn_bufs_free(ctx, &B);
    fp_mem_free(ctx, cu_d);
}

static fp_status run_varlen(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    static const int full[] = {4096, 1024, 2048, 512, 3072, 1536, 2560, 1536};
    static const int quick[] = {150, 37, 0, 90};
    static const int dim_defs[] = {64, 128}, causal_defs[] = {0, 1};
    int dims[2], causals[2];
    const int nd = values_of(run, "head_dim", dim_defs, 2, 1, 1024, dims);
    const int nc = values_of(run, "causal", causal_defs, 2, 0, 1, causals);
    if (!nd || !nc) return fb_skip(run, "%s", !nd ? "--head_dim must be in [1, 1024]" : "--causal must be 0 or 1");
    fp_dtype dts[4] = {FP_BF16};
    const int ndt = dtypes_or(run, dts, 1);
    const int q = fb_quick(run);
    for (int di = 0; di < nd; ++di)
        for (int ci = 0; ci < nc; ++ci)
            for (int t = 0; t < ndt; ++t)
                run_varlen_shape(run, q ? quick : full, q ? 4 : 8, dims[di], q ? 2 : 2048 / dims[di], causals[ci],
                                 dts[t]);
    return FP_OK;
}

/* attention/paged_prefill: prefill over a paged KV cache (vLLM-style block
 * tables: chunked prefill, prefix caching), the rows a serving engine's
 * prefill runs. B sequences of sk cached keys each, the last sq of them the
 * chunk's own queries (causal: bottom-right aligned), K / V in a pool of
 * pages of page_size keys handed out in shuffled order. Three rows per shape:
 *   v1_vs_tma       v1 preferred (the row-by-row page gather: what every
 *                   paged call ran before session 41) against the same
 *                   call preferring the TMA kernel (v5 at head_dim 128, v10
 *                   at 64, the Hopper default: FP_CTX_ATTENTION_KERNEL, one
 *                   box per page run);
 *   dense_vs_paged  the TMA kernel on the same keys gathered into a dense
 *                   cache (fp_attn_cuda_gather_pages) against it paged: what
 *                   the block table costs the TMA kernel;
 *   tma_vs_v9       the TMA kernel paged against v9 paged (v8 in persistent
 *                   CTAs over a causal-aware order, its producer warp
 *                   loading the pages' boxes: session 37).
 * Outputs compared. Shapes (batch x chunk over cache): 4 x 4096 over 4096
 * and 4 x 1024 over 8192; 32 query / 8 KV heads; head_dim 128 and 64;
 * pages of 16 and 64 keys; causal; bf16 (--head_dim, --page_size, --dtype,
 * --causal narrow them; --quick: 2 x 130 over 300, 4 / 2 heads, head_dim 64,
 * pages of 16). TFLOP/s
 * count the keys each query sees (4 h d per query-key pair); the note says
 * which kernels ran. CUDA only. */
typedef struct paged_shape {
    int batch, sq, sk, hq, hkv, d, page, causal;
    fp_dtype dt;
} paged_shape;

static double paged_flops(const paged_shape *s) {
    /* query i (0-based) of the chunk sees sk - sq + i + 1 keys when causal */
    const double pairs = s->causal ? (double)s->sq * (s->sk - s->sq) + 0.5 * (double)s->sq * (s->sq + 1)
                                   : (double)s->sq * s->sk;
    return 4.0 * s->batch * s->hq * (double)s->d * pairs;
}

/* One row of the scenario: base against opt (pref_fn, outputs o1 / o2
 * compared) unless setup failed (st), the TFLOP/s of each side under
 * base_metric / opt_metric, the kernels that ran in the note (base_tag after
 * the baseline's). */
static void paged_ab(fb_run *run, const paged_shape *s, const char *versions, fp_status st, pref_run *base,
                     pref_run *opt, void *o1, void *o2, size_t n, double tol, double bytes, double flops,
                     const char *base_metric, const char *opt_metric, const char *base_tag) {
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "versions", versions);
    fb_param_str(r, "dtype", fp_dtype_name(s->dt));
    fb_param_int(r, "batch", s->batch);
    fb_param_int(r, "seqlen_q", s->sq);
    fb_param_int(r, "seqlen_k", s->sk);
    fb_param_int(r, "heads_q", s->hq);
    fb_param_int(r, "heads_kv", s->hkv);
    fb_param_int(r, "head_dim", s->d);
    fb_param_int(r, "page_size", s->page);
    fb_param_int(r, "causal", s->causal);
    pref_ab(run, r, st, base, opt, o1, o2, n, s->dt, tol, tol, bytes, flops, base_metric, opt_metric, base_tag);
}

/* table[i] = a shuffle of 0 .. n - 1 (Fisher-Yates over xorshift, one
 * fixed seed): sequence b's page j is a random page of the pool. */
static void shuffled_pages(int32_t *table, int n) {
    for (int i = 0; i < n; ++i) table[i] = i;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = n - 1; i > 0; --i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const int j = (int)(x % (uint64_t)(i + 1));
        const int32_t t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
}

static void run_paged_shape(fb_run *run, const paged_shape *s) {
    fp_context *ctx = fb_ctx(run);
    const int per_seq = (s->sk + s->page - 1) / s->page, num_pages = s->batch * per_seq;
    const size_t elt = fp_dtype_size(s->dt), nq = (size_t)s->batch * s->sq * s->hq * s->d;
    const size_t n_pool = (size_t)num_pages * s->page * s->hkv * s->d, n_dense = (size_t)s->batch * s->sk * s->hkv * s->d;
    const double flops = paged_flops(s);
    /* the table: sequence b's page j is a shuffled page of the pool */
    int32_t *table = malloc(sizeof(int32_t) * (size_t)num_pages);
    attn_bufs B = {NULL, NULL, NULL, NULL, NULL}; /* K, V: the page pools */
    void *kd = NULL, *vd = NULL, *bt = NULL;
    fp_status st = table ? FP_OK : FP_ERR_OUT_OF_MEMORY;
    if (st == FP_OK) {
        shuffled_pages(table, num_pages);
        st = attn_bufs_alloc(ctx, s->dt, nq, n_pool, &B);
    }
    if (st == FP_OK) st = fp_mem_alloc(ctx, n_dense * elt, &kd);
    if (st == FP_OK) st = fp_mem_alloc(ctx, n_dense * elt, &vd);
    void *o1 = B.o1, *o2 = B.o2;
    if (st == FP_OK) st = fp_mem_alloc(ctx, sizeof(int32_t) * (size_t)num_pages, &bt);
    if (st == FP_OK) st = fp_mem_upload(ctx, bt, table, sizeof(int32_t) * (size_t)num_pages, NULL);
    fp_attention_params pp, pd;
    fp_attention_params_default(&pp);
    pp.batch = s->batch; pp.seqlen_q = s->sq; pp.seqlen_k = s->sk; pp.heads_q = s->hq; pp.heads_kv = s->hkv;
    pp.head_dim = s->d; pp.dtype = s->dt; pp.causal = s->causal;
    pp.q = B.q; pp.k = B.k; pp.v = B.v; pp.o = o1;
    pp.block_table = bt; pp.block_table_stride = per_seq; pp.page_size = s->page; pp.num_pages = num_pages;
    pd = pp;
    pd.k = kd; pd.v = vd;
    pd.block_table = NULL; pd.block_table_stride = pd.page_size = pd.num_pages = 0;
    if (st == FP_OK) { /* the dense copy of the same keys */
        fp_attn_args a;
        st = fp_attn_check(&pp, 1, &a);
        if (st == FP_OK) st = fp_attn_cuda_gather_pages(&a, kd, vd, (cudaStream_t)fp_context_stream(ctx));
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL); /* table lives on the heap until then */
    }
    const int tma = s->d == 64 ? 10 : 5; /* the Hopper default's kernel (v1: preferred) */
    fp_attention_params pp2 = pp, pd1 = pd;
    pp2.o = o2;
    pd1.o = o1;
    pref_run v1 = {ctx, &pp, 1}, opt = {ctx, &pp2, tma}, dense = {ctx, &pd1, tma}, tma1 = {ctx, &pp, tma},
             v9 = {ctx, &pp2, 9};
    const double bytes = 2.0 * (double)nq * elt + 2.0 * (double)n_dense * elt;
    paged_ab(run, s, "v1_vs_tma", st, &v1, &opt, o1, o2, nq, -1.0, bytes, flops, "v1_tflops", "tma_tflops", "");
    paged_ab(run, s, "dense_vs_paged", st, &dense, &opt, o1, o2, nq, -1.0, bytes, flops, "dense_tflops",
             "paged_tflops", " (dense)");
    paged_ab(run, s, "tma_vs_v9", st, &tma1, &v9, o1, o2, nq, -1.0, bytes, flops, "tma_tflops", "v9_tflops", "");
    fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 0);
    free(table);
    attn_bufs_free(ctx, &B);
    fp_mem_free(ctx, kd);
    fp_mem_free(ctx, vd);
    fp_mem_free(ctx, bt);
}

static fp_status run_paged_prefill(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    const int q = fb_quick(run);
    static const int dim_defs[] = {128, 64}, causal_defs[] = {1}, page_defs[] = {16, 64};
    static const int shapes[2][3] = {{4, 4096, 4096}, {4, 1024, 8192}}; /* batch, chunk, cache */
    int dims[2], causals[2], pages[2];
    const int dim_q[] = {64};
    const int nd = values_of(run, "head_dim", q ? dim_q : dim_defs, q ? 1 : 2, 1, 1024, dims);
    const int nc = values_of(run, "causal", causal_defs, 1, 0, 1, causals);
    const int np = values_of(run, "page_size", page_defs, q ? 1 : 2, 1, 1 << 20, pages);
    if (!nd || !nc || !np)
        return fb_skip(run, "%s", !nd   ? "--head_dim must be in [1, 1024]"
                                  : !nc ? "--causal must be 0 or 1"
                                        : "--page_size must be in [1, 1048576]");
    fp_dtype dts[4] = {FP_BF16};
    const int ndt = dtypes_or(run, dts, 1);
    for (int si = 0; si < (q ? 1 : 2); ++si)
        for (int di = 0; di < nd; ++di)
            for (int pi = 0; pi < np; ++pi)
                for (int ci = 0; ci < nc; ++ci)
                    for (int t = 0; t < ndt; ++t) {
                        paged_shape sh = {q ? 2 : shapes[si][0], q ? 130 : shapes[si][1], q ? 300 : shapes[si][2],
                                          q ? 4 : 32, q ? 2 : 8, dims[di], pages[pi], causals[ci], dts[t]};
                        run_paged_shape(run, &sh);
                        fb_rows_done(run);
                    }
    return FP_OK;
}

/* attention/fp8: fp8 (e4m3) inputs with per-tensor descales, FlashAttention-3's
 * fp8 forward. Q, K, V random e4m3 codes (Q, K in [-4, 4], V in [-1, 1]:
 * scores of a few units, a peaked softmax), descales 1; the bf16 side holds
 * the same values exactly (e4m3 fits in bf16). Two rows per shape:
 *   bf16_vs_fp8  fp_attention_forward on the bf16 copy (v5) against the fp8
 *                call (v5 + its V^T pass): what fp8 buys at the same math;
 *                outputs compared within 0.04 + 2% (fp8 rounds P to e4m3
 *                before P V, 2^-4 relative at most);
 *   v5_vs_v8     fp8 on v5 (the default) against fp8 preferring v8.
 * Shapes: FlashAttention's grid at head_dim 128: seqlen 1k, 4k, 16k, batch
 * 16384 / seqlen, 16 heads, causal and not (--seqlen, --causal narrow it;
 * --quick: 2 x 200, 2 heads). TFLOP/s count as attention/prefill; % of peak
 * is of the bf16 tensor peak (fp8's is twice it). The note says which
 * kernels ran. CUDA only. */
/* n e4m3 codes of values uniform in [-amp, amp), rounded to e4m3: 16 bits
 * of an xorshift draw a value (four values a draw), through a table of what
 * each of the 65536 bins' centres rounds to; the bf16 twins through a table
 * of the 256 codes. Converting each value with fp_f2e4m3 cost ~25 ns on the
 * 2-core VM: the 1.5 G values of attention/kv8's rows alone outran the GPU
 * check's 45 s a run (session 41); the tables take ~1-2 ns. */
static fp_status fp8_fill(uint8_t *x, size_t n, float amp, uint64_t seed) {
    uint8_t *lut = malloc(65536);
    if (!lut) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp8_fill: 64 KiB for the code table");
    for (int u = 0; u < 65536; ++u) lut[u] = fp_f2e4m3((float)(((u + 0.5) / 32768.0 - 1.0) * amp));
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 4) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        for (size_t k = 0; k < 4 && i + k < n; ++k) x[i + k] = lut[(s >> (16 * k)) & 0xffffu];
    }
    free(lut);
    return FP_OK;
}

/* n e4m3 codes (fp8_fill with amp, seed) to a new device buffer *d8 and
 * their bf16 values (exact) to a new *d16, through the host buffers h8 /
 * h16, which are free again on return. */
static fp_status fp8_twins_upload(fp_context *ctx, size_t n, float amp, uint64_t seed, uint8_t *h8, uint16_t *h16,
                                  void **d8, void **d16) {
    uint16_t to_bf16[256];
    for (int c = 0; c < 256; ++c) to_bf16[c] = fp_f32_to_bf16(fp_e4m3_to_f32((uint8_t)c));
    fp_status st = fp8_fill(h8, n, amp, seed);
    for (size_t i = 0; st == FP_OK && i < n; ++i) h16[i] = to_bf16[h8[i]];
    if (st == FP_OK) st = fp_mem_alloc(ctx, n, d8);
    if (st == FP_OK) st = fp_mem_alloc(ctx, n * 2, d16);
    if (st == FP_OK) st = fp_mem_upload(ctx, *d8, h8, n, NULL);
    if (st == FP_OK) st = fp_mem_upload(ctx, *d16, h16, n * 2, NULL);
    return st == FP_OK ? fp_context_synchronize(ctx, NULL) : st;
}

static void fp8_row(fb_run *run, const char *versions, const shape *s, fp_status st, pref_run *base, pref_run *opt,
                    void *o1, void *o2, size_t n, double bytes, double flops, const char *bm, const char *om) {
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "versions", versions);
    fb_param_int(r, "batch", s->batch);
    fb_param_int(r, "seqlen", s->sq);
    fb_param_int(r, "heads", s->hq);
    fb_param_int(r, "head_dim", s->d);
    fb_param_int(r, "causal", s->causal);
    /* |V| <= 1: P's e4m3 rounding moves O by at most 2^-4 */
    pref_ab(run, r, st, base, opt, o1, o2, n, FP_BF16, 0.04, 0.02, bytes, flops, bm, om, "");
}

static void run_fp8_shape(fb_run *run, const shape *s) {
    fp_context *ctx = fb_ctx(run);
    const size_t n = (size_t)s->batch * s->sq * s->hq * s->d;
    uint8_t *h8 = malloc(n);
    uint16_t *h16 = malloc(n * 2);
    void *q8 = NULL, *k8 = NULL, *v8 = NULL, *q16 = NULL, *k16 = NULL, *v16 = NULL, *o1 = NULL, *o2 = NULL;
    fp_status st = h8 && h16 ? FP_OK : FP_ERR_OUT_OF_MEMORY;
    void **d8[3] = {&q8, &k8, &v8}, **d16[3] = {&q16, &k16, &v16};
    for (int t = 0; t < 3 && st == FP_OK; ++t) /* Q, K, V: e4m3 codes and their bf16 copies */
        st = fp8_twins_upload(ctx, n, t == 2 ? 1.0f : 4.0f, 0x9e3779b97f4a7c15ull + (uint64_t)t, h8, h16, d8[t],
                              d16[t]);
    if (st == FP_OK) st = fp_mem_alloc(ctx, n * 2, &o1);
    if (st == FP_OK) st = fp_mem_alloc(ctx, n * 2, &o2);
    fp_attention_params p8, p16;
    fp_attention_params_default(&p8);
    p8.batch = s->batch; p8.seqlen_q = s->sq; p8.seqlen_k = s->sk; p8.heads_q = s->hq; p8.heads_kv = s->hkv;
    p8.head_dim = s->d; p8.causal = s->causal; p8.dtype = FP_FP8_E4M3;
    p8.q = q8; p8.k = k8; p8.v = v8; p8.o = o2;
    p16 = p8;
    p16.dtype = FP_BF16;
    p16.q = q16; p16.k = k16; p16.v = v16; p16.o = o1;
    fp_attention_params p8b = p8;
    p8b.o = o1;
    const double flops = fp_attention_flops(&p8);
    pref_run bf = {ctx, &p16, 0}, f8 = {ctx, &p8, 0}, f8_v5 = {ctx, &p8b, 0}, f8_v8 = {ctx, &p8, 8};
    fp8_row(run, "bf16_vs_fp8", s, st, &bf, &f8, o1, o2, n, 4.0 * 2.0 * (double)n, flops, "bf16_tflops",
            "fp8_tflops");
    fp8_row(run, "v5_vs_v8", s, st, &f8_v5, &f8_v8, o1, o2, n, 5.0 * (double)n, flops, "v5_tflops", "v8_tflops");
    fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 0);
    free(h8);
    free(h16);
    for (int t = 0; t < 3; ++t) {
        fp_mem_free(ctx, *d8[t]);
        fp_mem_free(ctx, *d16[t]);
    }
    fp_mem_free(ctx, o1);
    fp_mem_free(ctx, o2);
    fb_rows_done(run); /* a shape's rows, before the next shape's inputs are made */
}

static fp_status run_fp8(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    const int q = fb_quick(run);
    static const int seq_defs[] = {1024, 4096, 16384}, causal_defs[] = {0, 1};
    int seqs[3], causals[2];
    const int ns = values_of(run, "seqlen", seq_defs, 3, 1, 1 << 20, seqs);
    const int nc = values_of(run, "causal", causal_defs, 2, 0, 1, causals);
    if (!ns || !nc) return fb_skip(run, "%s", !ns ? "--seqlen must be in [1, 1048576]" : "--causal must be 0 or 1");
    for (int si = 0; si < (q ? 1 : ns); ++si)
        for (int ci = 0; ci < nc; ++ci) {
            const int sl = q ? 200 : seqs[si];
            const shape sh = {q ? 2 : (sl < 16384 ? 16384 / sl : 1), sl, sl, q ? 2 : 16, q ? 2 : 16, 128, causals[ci],
                              FP_FP8_E4M3};
            run_fp8_shape(run, &sh);
        }
    return FP_OK;
}

/* The device buffers of the fp8 KV cache scenarios (attention/kv8,
 * attention/kv8_prefill): Q (nq bf16 in [-1, 1)), K and V as nkv e4m3
 * codes in [-1, 1] and their bf16 copies (exact), the block table (npages
 * entries of `table`; none when NULL) and two outputs of nq bf16. On
 * return nothing is in flight (the host table may be freed); kv8_bufs_free
 * frees what was allocated, also after a failure. */
typedef struct kv8_bufs {
    void *q, *k8, *v8, *k16, *v16, *o1, *o2, *bt;
} kv8_bufs;
static fp_status kv8_bufs_alloc(fp_context *ctx, size_t nq, size_t nkv, const int32_t *table, int npages,
                                kv8_bufs *B) {
    uint8_t *h8 = malloc(nkv);
    uint16_t *h16 = malloc(nkv * 2);
    fp_status st = h8 && h16 ? FP_OK : FP_ERR_OUT_OF_MEMORY;
    if (st == FP_OK) st = fb_alloc_random(ctx, nq, FP_BF16, 1, -1.0f, 1.0f, &B->q);
    void **d8[2] = {&B->k8, &B->v8}, **d16[2] = {&B->k16, &B->v16};
    for (int t = 0; t < 2 && st == FP_OK; ++t)
        st = fp8_twins_upload(ctx, nkv, 1.0f, 0x2545f4914f6cdd1dull + (uint64_t)t, h8, h16, d8[t], d16[t]);
    if (st == FP_OK && table) {
        st = fp_mem_alloc(ctx, sizeof(int32_t) * (size_t)npages, &B->bt);
        if (st == FP_OK) st = fp_mem_upload(ctx, B->bt, table, sizeof(int32_t) * (size_t)npages, NULL);
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
    }
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * 2, &B->o1);
    if (st == FP_OK) st = fp_mem_alloc(ctx, nq * 2, &B->o2);
    free(h8);
    free(h16);
    return st;
}
static void kv8_bufs_free(fp_context *ctx, kv8_bufs *B) {
    void *bufs[8] = {B->q, B->k8, B->v8, B->k16, B->v16, B->o1, B->o2, B->bt};
    for (int i = 0; i < 8; ++i) fp_mem_free(ctx, bufs[i]);
}

/* attention/kv8: decode (seqlen_q 1, 32 query / 8 KV heads of 128, bf16 Q)
 * over an fp8 (e4m3) KV cache. Two rows a shape:
 *   bf16_kv_vs_fp8_kv  a bf16 cache holding the same values (e4m3 is exact
 *                      in bf16) against the fp8 cache, both on v1 with
 *                      split-KV and its fused combine: the same math on
 *                      half the bytes, so the outputs must agree bit for
 *                      bit (compared exactly);
 *   fp8_kv_v1_vs_v6    the fp8 cache on v1 against the decode kernel v6
 *                      (each warp widening its own keys, no barrier per
 *                      tile): which one the fp8 cache should default to
 *                      (within bf16's tolerance: v6 sums in another order). Rows: batch x keys 1 x 4k, 1 x 32k, 1 x 128k, 8 x 4k,
 * 8 x 32k dense, and 1 x 32k, 8 x 32k paged (16-key pages in reverse pool
 * order); --batch / --kv give one shape (dense and paged), --quick 1 x 1024
 * with 8 / 2 heads. Metrics: each side's KV read rate (its own bytes over
 * its median), the optimized side's % of the HBM datasheet. CUDA only. */
static fb_result *kv8_row(fb_run *run, const char *versions, int batch, int sk, int hq, int hkv, int d, int page) {
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "versions", versions);
    fb_param_int(r, "batch", batch);
    fb_param_int(r, "seqlen_k", sk);
    fb_param_int(r, "heads_q", hq);
    fb_param_int(r, "heads_kv", hkv);
    fb_param_int(r, "head_dim", d);
    fb_param_int(r, "page_size", page);
    return r;
}

/* The A/B of one kv8 row: base against opt (outputs compared within tol,
 * 0: exactly; < 0: bf16's default), each side's KV read rate from its
 * cache's bytes (kv_base, kv_opt) under bm / om, the optimized side's % of
 * HBM. */
static void kv8_ab(fb_run *run, fb_result *r, fp_status st, pref_run *base, pref_run *opt, void *o1, void *o2,
                   size_t nq, double tol, double kv_base, double kv_opt, const char *bm, const char *om) {
    const fp_device_info *dev = fb_device(run);
    fp_ab_report rep;
    if (!pref_ab_rep(run, r, st, base, opt, o1, o2, nq, FP_BF16, tol, tol, kv_opt + 4.0 * (double)nq,
                     fp_attention_flops(opt->p), "", &rep))
        return;
    const double gb_o = kv_opt / (rep.optimized.median_ms * 1e-3) / 1e9;
    fb_result_metric(r, bm, kv_base / (rep.baseline.median_ms * 1e-3) / 1e9);
    fb_result_metric(r, om, gb_o);
    if (dev && dev->peak_gbps > 0) fb_result_metric(r, "opt_pct_hbm", 100.0 * gb_o / dev->peak_gbps);
}

static void run_kv8_shape(fb_run *run, int batch, int sk, int page) {
    fp_context *ctx = fb_ctx(run);
    const int hq = fb_quick(run) ? 8 : 32, hkv = fb_quick(run) ? 2 : 8, d = 128;
    fb_result *r = kv8_row(run, "bf16_kv_vs_fp8_kv", batch, sk, hq, hkv, d, page);
    fb_result *r6 = kv8_row(run, "fp8_kv_v1_vs_v6", batch, sk, hq, hkv, d, page);
    const int pps = page ? (sk + page - 1) / page : 0, npages = batch * pps;
    const size_t nq = (size_t)batch * hq * d, nkv = (size_t)(page ? (int64_t)npages * page : (int64_t)batch * sk) * hkv * d;
    int32_t *bt = page ? malloc(sizeof(int32_t) * (size_t)npages) : NULL;
    kv8_bufs B;
    memset(&B, 0, sizeof B);
    fp_status st = !page || bt ? FP_OK : FP_ERR_OUT_OF_MEMORY;
    if (st == FP_OK) {
        for (int i = 0; i < npages; ++i) bt[i] = npages - 1 - i; /* the pool in reverse order */
        st = kv8_bufs_alloc(ctx, nq, nkv, bt, npages, &B);
    }
    void *q = B.q, *k8 = B.k8, *v8 = B.v8, *k16 = B.k16, *v16 = B.v16, *o1 = B.o1, *o2 = B.o2, *dbt = B.bt;
    fp_attention_params p16, p8;
    fp_attention_params_default(&p16);
    p16.batch = batch; p16.seqlen_q = 1; p16.seqlen_k = sk; p16.heads_q = hq; p16.heads_kv = hkv; p16.head_dim = d;
    p16.q = q; p16.k = k16; p16.v = v16; p16.o = o1;
    if (page) {
        p16.block_table = dbt; p16.block_table_stride = pps; p16.page_size = page; p16.num_pages = npages;
    }
    p8 = p16;
    p8.kv_dtype = FP_FP8_E4M3;
    p8.k = k8; p8.v = v8; p8.o = o2;
    fp_attention_params p8b = p8;
    p8b.o = o1;
    pref_run base = {ctx, &p16, 0}, opt = {ctx, &p8, 0}, f8_v1 = {ctx, &p8b, 0}, f8_v6 = {ctx, &p8, 6};
    const double kv16 = 2.0 * 2.0 * (double)batch * sk * hkv * d, kv8 = kv16 / 2.0;
    kv8_ab(run, r, st, &base, &opt, o1, o2, nq, 0.0, kv16, kv8, "bf16_kv_gbps", "fp8_kv_gbps");
    kv8_ab(run, r6, st, &f8_v1, &f8_v6, o1, o2, nq, -1.0, kv8, kv8, "v1_kv_gbps", "v6_kv_gbps");
    fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 0);
    free(bt);
    kv8_bufs_free(ctx, &B);
    fb_rows_done(run); /* a shape's rows, before the next shape's inputs are made */
}

static fp_status run_kv8(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    int kv_opt, b_opt;
    if (!decode_opts(run, 1 << 22, 256, &kv_opt, &b_opt)) return FP_ERR_UNSUPPORTED; /* fb_skip said why */
    if (fb_quick(run)) {
        run_kv8_shape(run, 1, 1024, 0);
        run_kv8_shape(run, 1, 1024, 16);
        return FP_OK;
    }
    if (kv_opt || b_opt) {
        run_kv8_shape(run, b_opt ? b_opt : 1, kv_opt ? kv_opt : 32768, 0);
        run_kv8_shape(run, b_opt ? b_opt : 1, kv_opt ? kv_opt : 32768, 16);
        return FP_OK;
    }
    static const int rows[7][3] = {{1, 4096, 0}, {1, 32768, 0}, {1, 131072, 0}, {8, 4096, 0},
                                   {8, 32768, 0}, {1, 32768, 16}, {8, 32768, 16}}; /* batch, keys, page */
    for (int i = 0; i < 7; ++i) run_kv8_shape(run, rows[i][0], rows[i][1], rows[i][2]);
    return FP_OK;
}

/* attention/kv8_prefill: prefill over an fp8 (e4m3) KV cache under a bf16
 * Q (chunked prefill or prefix caching in a serving engine whose cache is
 * fp8: vLLM's kv_cache_dtype fp8_e4m3): B sequences of sk cached keys, the
 * last sq of them the chunk's queries (causal, bottom-right aligned), K / V
 * dense or in a pool of page_size-key pages in shuffled order. Two rows a
 * shape:
 *   fp8_kv_v1_vs_tma     fp_attention_forward's default on the fp8 cache
 *                        (v1, each tile widened in shared memory) against
 *                        the call preferring the TMA kernel (v5 at head_dim
 *                        128, v8 at 64), which widens the cache into a
 *                        dense bf16 copy first (attention_kv8_widen_v0):
 *                        what decides FP_ATTN_KV8_WIDEN's default; outputs
 *                        within bf16's tolerance;
 *   bf16_kv_vs_fp8_kv    the TMA kernel on a bf16 cache holding the same
 *                        values (e4m3 is exact in bf16) against it on the
 *                        fp8 cache widened: the widening's cost; outputs
 *                        compared exactly (the same kernel on the same
 *                        values, v_descale 1).
 * Shapes (batch x chunk over cache): 4 x 4096 over 4096 and 4 x 1024 over
 * 8192; 32 query / 8 KV heads; head_dim 128 and 64; dense and pages of 16
 * (--head_dim, --page_size (0: dense) narrow them; --quick: 2 x 130 over
 * 300, 4 / 2 heads, head_dim 64). TFLOP/s count the keys each query sees;
 * bytes: Q and O in bf16, K and V once in e4m3. The note says which kernels
 * ran. CUDA only. */
static void run_kv8_prefill_shape(fb_run *run, const paged_shape *s) {
    fp_context *ctx = fb_ctx(run);
    const int paged = s->page > 0, per_seq = paged ? (s->sk + s->page - 1) / s->page : 0;
    const int num_pages = s->batch * per_seq;
    const size_t nq = (size_t)s->batch * s->sq * s->hq * s->d;
    const size_t nkv = (size_t)(paged ? (int64_t)num_pages * s->page : (int64_t)s->batch * s->sk) * s->hkv * s->d;
    int32_t *table = paged ? malloc(sizeof(int32_t) * (size_t)num_pages) : NULL;
    kv8_bufs B;
    memset(&B, 0, sizeof B);
    fp_status st = !paged || table ? FP_OK : FP_ERR_OUT_OF_MEMORY;
    if (st == FP_OK) {
        if (paged) shuffled_pages(table, num_pages);
        st = kv8_bufs_alloc(ctx, nq, nkv, table, num_pages, &B);
    }
    void *q = B.q, *k8 = B.k8, *v8 = B.v8, *k16 = B.k16, *v16 = B.v16, *o1 = B.o1, *o2 = B.o2, *bt = B.bt;
    fp_attention_params p8, p8t, p16;
    fp_attention_params_default(&p8);
    p8.batch = s->batch; p8.seqlen_q = s->sq; p8.seqlen_k = s->sk; p8.heads_q = s->hq; p8.heads_kv = s->hkv;
    p8.head_dim = s->d; p8.dtype = FP_BF16; p8.kv_dtype = FP_FP8_E4M3; p8.causal = s->causal;
    p8.q = q; p8.k = k8; p8.v = v8; p8.o = o1;
    if (paged) {
        p8.block_table = bt; p8.block_table_stride = per_seq; p8.page_size = s->page; p8.num_pages = num_pages;
    }
    p8t = p8;
    p8t.o = o2;
    p16 = p8;
    p16.kv_dtype = 0; p16.k = k16; p16.v = v16;
    const int tma = s->d == 64 ? 8 : 5;
    pref_run v1 = {ctx, &p8, 0}, widened = {ctx, &p8t, tma}, bf16 = {ctx, &p16, tma};
    const double bytes = 2.0 * 2.0 * (double)nq + 2.0 * (double)s->batch * s->sk * s->hkv * s->d;
    const double flops = paged_flops(s);
    paged_ab(run, s, "fp8_kv_v1_vs_tma", st, &v1, &widened, o1, o2, nq, -1.0, bytes, flops, "v1_tflops",
             "tma_tflops", "");
    paged_ab(run, s, "bf16_kv_vs_fp8_kv", st, &bf16, &widened, o1, o2, nq, 0.0, bytes, flops, "bf16_kv_tflops",
             "fp8_kv_tflops", " (bf16 cache)");
    fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 0);
    free(table);
    kv8_bufs_free(ctx, &B);
    fb_rows_done(run); /* a shape's rows, before the next shape's inputs are made */
}

static fp_status run_kv8_prefill(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    const int q = fb_quick(run);
    static const int dim_defs[] = {128, 64}, page_defs[] = {0, 16};
    static const int shapes[2][3] = {{4, 4096, 4096}, {4, 1024, 8192}}; /* batch, chunk, cache */
    int dims[2], pages[2];
    const int dim_q[] = {64};
    const int nd = values_of(run, "head_dim", q ? dim_q : dim_defs, q ? 1 : 2, 64, 128, dims);
    const int np = values_of(run, "page_size", page_defs, 2, 0, 1 << 20, pages);
    if (nd && dims[0] != 64 && dims[0] != 128) return fb_skip(run, "--head_dim must be 64 or 128");
    if (!nd || !np)
        return fb_skip(run, "%s", !nd ? "--head_dim must be 64 or 128" : "--page_size must be in [0, 1048576]");
    for (int si = 0; si < (q ? 1 : 2); ++si)
        for (int di = 0; di < nd; ++di)
            for (int pi = 0; pi < np; ++pi) {
                const paged_shape sh = {q ? 2 : shapes[si][0], q ? 130 : shapes[si][1], q ? 300 : shapes[si][2],
                                        q ? 4 : 32, q ? 2 : 8, dims[di], pages[pi], 1, FP_BF16};
                run_kv8_prefill_shape(run, &sh);
            }
    return FP_OK;
}

FB_SCENARIO(fb_attention_prefill, "attention/prefill",
            "flash attention vs materialized (cuBLAS + softmax): FlashAttention's seqlen/head_dim grid",
            run_prefill)
FB_SCENARIO(fb_attention_gqa, "attention/gqa", "flash attention vs materialized with GQA 8:1", run_gqa)
FB_SCENARIO(fb_attention_decode, "attention/decode",
            "seqlen_q 1 vs a 4k..128k KV cache, batch 1..64: split-KV flash vs materialized, KV GB/s",
            run_decode)
FB_SCENARIO(fb_attention_flash_versions, "attention/flash_versions",
            "flash kernel v1 (16 rows/warp) vs v2 (32 rows/warp), v3 / v4 (Hopper wgmma), v5 (TMA + mbarrier), v7 "
            "(8 warps); v5 vs v8 (ping-pong warpgroups); v8 vs v9 (persistent CTAs); v5 / v8 vs their TMA-store "
            "epilogue on prefill shapes (CUDA only)",
            run_versions)
FB_SCENARIO(fb_attention_varlen, "attention/varlen",
            "varlen prefill (cu_seqlens, mixed lengths): the call without total_k (v3 on Hopper) vs with it (the TMA "
            "kernels v5 / v10), TFLOP/s (CUDA only)",
            run_varlen)
FB_SCENARIO(fb_attention_paged_prefill, "attention/paged_prefill",
            "prefill over a paged KV cache (chunked prefill): v1 (page gather) vs the TMA kernel (v5 / v10, the "
            "Hopper default, a box per page run), the TMA kernel dense vs paged, and v5 / v10 vs v9 paged, TFLOP/s "
            "(CUDA only)",
            run_paged_prefill)
FB_SCENARIO(fb_attention_fp8, "attention/fp8",
            "fp8 (e4m3) inputs with descales: bf16 vs fp8 on the same values (v5), fp8 on v5 vs v8, head_dim 128, "
            "TFLOP/s (CUDA only: Hopper)",
            run_fp8)
FB_SCENARIO(fb_attention_kv8, "attention/kv8",
            "decode over an fp8 (e4m3) KV cache vs a bf16 cache of the same values (v1, split-KV), dense and paged, "
            "KV GB/s (CUDA only)",
            run_kv8)
FB_SCENARIO(fb_attention_kv8_prefill, "attention/kv8_prefill",
            "prefill over an fp8 (e4m3) KV cache, dense and paged: the default (v1, tiles widened in shared memory) "
            "vs the TMA kernel on the cache widened to bf16 first, and that kernel on a bf16 cache of the same "
            "values vs the fp8 one widened, TFLOP/s (CUDA only: the TMA kernels on Hopper)",
            run_kv8_prefill)
FB_SCENARIO(fb_attention_decode_versions, "attention/decode_versions",
            "decode: the default kernel (v1, split-KV) vs the decode kernel v6 (16-row tiles, K/V ring), KV GB/s "
            "(CUDA only)",
            run_decode_versions)
FB_SCENARIO(fb_attention_decode_anatomy, "attention/decode_anatomy",
            "decode_versions' rows and where each kernel's time goes between its CTAs: start skew, first tile, "
            "KV loop, merge, tail, time outside the CTAs (CUDA only)",
            run_decode_anatomy)
FB_SCENARIO(fb_attention_prefill_anatomy, "attention/prefill_anatomy",
            "where a prefill kernel's time goes between its SMs: the default vs v9, per-CTA timelines",
            run_prefill_anatomy)
