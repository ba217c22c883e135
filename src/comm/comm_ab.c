/* Timing of communication: fp_comm_bench (nccl-tests' measurement of one
 * collective at one size), fp_buckets_validate (the built-in A/B:
 * per-tensor all-reduce on the compute stream against buckets overlapped
 * with compute) and fp_buckets_tune (the bucket cap for this list and this
 * machine). All three run on every rank at once: with nranks > 1 the
 * timing engine's schedule is made fixed (no adaptive stopping, no
 * calibrated batching), so every rank issues the same collectives. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

/* The timing config every rank can follow: the caller's, or the defaults,
 * made deterministic when nranks > 1. */
static fp_status timing_config(const fp_comm *comm, const fp_timing_config *user, fp_timing_config *out) {
    fp_timing_config_default(out);
    if (user) {
        fp_timing_config full;
        const fp_timing_config *p = user;
        FP_STRUCT_IN(&p, full, sizeof(fp_timing_config), fp_timing_config_default,
                     "fp_timing_config");
        *out = *p;
    }
    out->use_graph = 0; /* a capture would have to be collective too */
    if (comm->nranks > 1) {
        out->min_sample_ms = 0;
        out->max_samples = out->min_samples;
        out->max_time_s = 1e9;
        out->flush_l2 = 0;
    }
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  fp_comm_bench                                                           */
/* ------------------------------------------------------------------------ */

typedef struct bench_arg {
    fp_comm *comm;
    fp_coll_kind kind;
    void *send, *recv;
    size_t count;
    fp_dtype dtype;
} bench_arg;

static fp_status bench_fn(void *user, fp_stream stream) {
    bench_arg *a = user;
    return fp_comm_enqueue(a->comm, a->kind, a->send, a->recv, a->count, a->dtype, FP_REDUCE_SUM, 0,
                           (cudaStream_t)stream);
}

fp_status fp_comm_bench(fp_comm *comm, fp_coll_kind kind, size_t bytes, fp_dtype dtype, const fp_timing_config *cfg,
                        fp_coll_bench *out) {
    FP_CHECK_NOT_NULL(comm);
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(kind >= FP_COLL_ALLREDUCE && kind <= FP_COLL_BROADCAST, "unknown collective %d", (int)kind);
    FP_CHECK_ARG(dtype == FP_F32 || dtype == FP_F16 || dtype == FP_BF16, "dtype %s is not supported",
                 fp_dtype_name(dtype));
    const size_t es = fp_dtype_size(dtype);
    const size_t n = (size_t)comm->nranks;
    size_t total = bytes / es; /* elements of the larger buffer */
    if (kind == FP_COLL_ALLGATHER || kind == FP_COLL_REDUCE_SCATTER) total = total / n * n;
    FP_CHECK_ARG(total >= 1 && total >= ((kind == FP_COLL_ALLGATHER || kind == FP_COLL_REDUCE_SCATTER) ? n : 1),
                 "%zu bytes of %s is less than one element per rank", bytes, fp_dtype_name(dtype));
    fp_timing_config tc;
    FP_TRY(timing_config(comm, cfg, &tc));
    FP_TRY(fp_comm_failure_status(comm));
    FP_TRY(fp_ctx_activate(comm->ctx));
    /* nccl-tests' buffers: send and receive sized for the collective. */
    size_t send_n = total, recv_n = total, count = total;
    if (kind == FP_COLL_ALLGATHER) send_n = count = total / n;
    if (kind == FP_COLL_REDUCE_SCATTER) recv_n = count = total / n;
    bench_arg a = {.comm = comm, .kind = kind, .count = count, .dtype = dtype};
    cudaError_t e = cudaMalloc(&a.send, send_n * es);
    if (e == cudaSuccess) e = cudaMalloc(&a.recv, recv_n * es);
    if (e == cudaSuccess) e = cudaMemsetAsync(a.send, 0, send_n * es, comm->stream);
    fp_status st = e == cudaSuccess ? FP_OK : fp_cuda_status(e, "fp_comm_bench buffers", __FILE__, __LINE__);
    fp_stats lat;
    if (st == FP_OK) st = fp_time(comm->ctx, comm->stream, bench_fn, &a, &tc, &lat);
    if (st == FP_OK) st = fp_comm_synchronize(comm, -1);
    cudaStreamSynchronize(comm->stream);
    if (a.send) cudaFree(a.send);
    if (a.recv) cudaFree(a.recv);
    FP_TRY(st);
    memset(out, 0, sizeof *out);
    out->latency = lat;
    out->bytes = fp_coll_bytes(kind, count, dtype, comm->nranks);
    if (lat.median_ms > 0) {
        out->algbw_gbps = out->bytes / (lat.median_ms * 1e-3) / 1e9;
        out->busbw_gbps = out->algbw_gbps * fp_coll_busbw_factor(kind, comm->nranks);
    }
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  fp_buckets_validate                                                     */
/* ------------------------------------------------------------------------ */

#define AB_REPORT_SIZE_FIRST sizeof(fp_buckets_ab_report)
#define TUNE_RESULT_SIZE_FIRST sizeof(fp_buckets_tune_result)

fp_status fp_buckets_ab_report_init_sized(fp_buckets_ab_report *r, size_t struct_size) {
    return fp_struct_init(r, struct_size, NULL, AB_REPORT_SIZE_FIRST, sizeof(fp_buckets_ab_report),
                          "fp_buckets_ab_report");
}

fp_status fp_buckets_tune_result_init_sized(fp_buckets_tune_result *r, size_t struct_size) {
    return fp_struct_init(r, struct_size, NULL, TUNE_RESULT_SIZE_FIRST, sizeof(fp_buckets_tune_result),
                          "fp_buckets_tune_result");
}

typedef struct iter_arg {
    fp_comm *comm;
    const fp_comm_tensor *t;
    int n;
    fp_reduce_op op;
    fp_buckets *b;               /* optimized side */
    fp_comm_produce_fn produce;
    void *user;
} iter_arg;

/* Per tensor: produce it, then all-reduce it on the same stream. */
static fp_status baseline_iter(void *user, fp_stream stream) {
    iter_arg *a = user;
    for (int i = 0; i < a->n; ++i) {
        FP_TRY(a->produce(a->user, i, a->t[i].data, stream));
        FP_TRY(fp_comm_enqueue(a->comm, FP_COLL_ALLREDUCE, a->t[i].data, a->t[i].data, a->t[i].count, a->t[i].dtype,
                               a->op, 0, (cudaStream_t)stream));
    }
    return FP_OK;
}

/* Produce each, mark it ready (buckets reduce on the side), wait at the end. */
static fp_status buckets_iter(void *user, fp_stream stream) {
    iter_arg *a = user;
    for (int i = 0; i < a->n; ++i) {
        void *data;
        FP_TRY(fp_buckets_tensor_data(a->b, i, &data));
        FP_TRY(a->produce(a->user, i, data, stream));
        FP_TRY(fp_buckets_mark_ready(a->b, i, data, stream));
    }
    return fp_buckets_wait(a->b, stream);
}

static fp_status produce_iter(void *user, fp_stream stream) {
    iter_arg *a = user;
    for (int i = 0; i < a->n; ++i) {
        void *data;
        FP_TRY(fp_buckets_tensor_data(a->b, i, &data));
        FP_TRY(a->produce(a->user, i, data, stream));
    }
    return FP_OK;
}

/* Downloads every tensor (as the buckets see them, or the list's) to host. */
static fp_status download(fp_comm *comm, const fp_comm_tensor *t, const fp_buckets *b, int n, unsigned char *host,
                          const size_t *off) {
    for (int i = 0; i < n; ++i) {
        void *data = t[i].data;
        if (b) FP_TRY(fp_buckets_tensor_data(b, i, &data));
        FP_CUDA_TRY(cudaMemcpyAsync(host + off[i], data, t[i].count * fp_dtype_size(t[i].dtype),
                                    cudaMemcpyDeviceToHost, comm->ctx->stream));
    }
    FP_CUDA_TRY(cudaStreamSynchronize(comm->ctx->stream));
    return FP_OK;
}

static fp_status check_list(const fp_comm *comm, const fp_comm_tensor *tensors, int n, fp_comm_produce_fn produce) {
    FP_CHECK_NOT_NULL(comm);
    FP_CHECK_NOT_NULL(tensors);
    FP_CHECK_NOT_NULL(produce);
    FP_CHECK_ARG(n >= 1, "n must be >= 1 (got %d)", n);
    for (int i = 0; i < n; ++i)
        FP_CHECK_ARG(tensors[i].data != NULL, "tensors[%d].data is NULL (the baseline's memory)", i);
    return FP_OK;
}

fp_status fp_buckets_validate(fp_comm *comm, const fp_comm_tensor *tensors, int n, const fp_buckets_config *cfg,
                              fp_comm_produce_fn produce, void *user, const fp_timing_config *cfg_timing,
                              fp_buckets_ab_report *report) {
    FP_CHECK_NOT_NULL(report);
    FP_TRY(fp_struct_size_check(report->struct_size, AB_REPORT_SIZE_FIRST, sizeof(fp_buckets_ab_report),
                                "fp_buckets_ab_report"));
    FP_TRY(check_list(comm, tensors, n, produce));
    fp_timing_config tc;
    FP_TRY(timing_config(comm, cfg_timing, &tc));
    fp_buckets_config bc;
    FP_TRY(fp_buckets_config_read(cfg, &bc));
    fp_buckets *b = NULL;
    FP_TRY(fp_buckets_create(comm, tensors, n, &bc, &b));
    fp_buckets_ab_report r;
    fp_buckets_ab_report_init(&r);
    r.buckets = fp_buckets_count(b);
    iter_arg a = {.comm = comm, .t = tensors, .n = n, .op = bc.op, .b = b, .produce = produce, .user = user};
    /* Results: one run of each, every tensor compared. */
    size_t *off = malloc((size_t)(n + 1) * sizeof *off);
    fp_status st = off ? FP_OK : fp_set_error(FP_ERR_OUT_OF_MEMORY, "offsets");
    for (int i = 0; st == FP_OK && i <= n; ++i)
        off[i] = i == 0 ? 0 : off[i - 1] + tensors[i - 1].count * fp_dtype_size(tensors[i - 1].dtype);
    unsigned char *ha = st == FP_OK ? malloc(off[n]) : NULL, *hb = st == FP_OK ? malloc(off[n]) : NULL;
    if (st == FP_OK && (!ha || !hb)) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "result copies (%zu bytes)", off[n]);
    fp_stream s = comm->ctx->stream;
    if (st == FP_OK) st = baseline_iter(&a, s);
    if (st == FP_OK) st = download(comm, tensors, NULL, n, ha, off);
    if (st == FP_OK) st = buckets_iter(&a, s);
    if (st == FP_OK) st = download(comm, tensors, b, n, hb, off);
    if (st == FP_OK) {
        r.results_agree = 1;
        for (int i = 0; i < n && st == FP_OK; ++i) {
            fp_compare_result cr;
            st = fp_compare_host(ha + off[i], hb + off[i], tensors[i].count, tensors[i].dtype, -1, -1, &cr);
            if (st == FP_OK) {
                if (!cr.passed) r.results_agree = 0;
                if (cr.max_abs_err > r.max_abs_err) r.max_abs_err = cr.max_abs_err;
            }
        }
    }
    /* Timing, interleaved. */
    fp_comm_stats s0, s1;
    fp_comm_stats_init(&s0);
    fp_comm_stats_init(&s1);
    if (st == FP_OK) st = fp_comm_get_stats(comm, &s0);
    if (st == FP_OK) {
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = baseline_iter;
        spec.baseline_user = &a;
        spec.optimized = buckets_iter;
        spec.optimized_user = &a;
        fp_ab_report ab;
        st = fp_ab_run(comm->ctx, s, &spec, &tc, &ab);
        if (st == FP_OK) {
            r.baseline = ab.baseline;
            r.optimized = ab.optimized;
            r.speedup = ab.speedup;
            r.verdict = ab.verdict;
        }
    }
    if (st == FP_OK) st = fp_comm_synchronize(comm, -1);
    if (st == FP_OK) {
        cudaStreamSynchronize(comm->ctx->stream);
        st = fp_comm_get_stats(comm, &s1);
    }
    if (st == FP_OK && s1.iterations > s0.iterations)
        r.exposed_ms = (s1.exposed_ms - s0.exposed_ms) / (double)(s1.iterations - s0.iterations);
    if (st == FP_OK) {
        fp_stats ps;
        st = fp_time(comm->ctx, s, produce_iter, &a, &tc, &ps);
        if (st == FP_OK) r.produce_ms = ps.median_ms;
    }
    free(off);
    free(ha);
    free(hb);
    fp_buckets_destroy(b);
    FP_TRY(st);
    return fp_struct_write(report, &r, AB_REPORT_SIZE_FIRST, sizeof r, "fp_buckets_ab_report");
}

/* ------------------------------------------------------------------------ */
/*  fp_buckets_tune                                                         */
/* ------------------------------------------------------------------------ */

fp_status fp_buckets_tune(fp_comm *comm, const fp_comm_tensor *tensors, int n, const fp_buckets_config *cfg,
                          const size_t *caps, int ncaps, fp_comm_produce_fn produce, void *user,
                          const fp_timing_config *cfg_timing, fp_buckets_tune_result *result) {
    FP_CHECK_NOT_NULL(result);
    FP_TRY(fp_struct_size_check(result->struct_size, TUNE_RESULT_SIZE_FIRST, sizeof(fp_buckets_tune_result),
                                "fp_buckets_tune_result"));
    FP_TRY(check_list(comm, tensors, n, produce));
    FP_CHECK_ARG(caps == NULL || (ncaps >= 1 && ncaps <= 16), "ncaps must be in [1, 16] (got %d)", ncaps);
    fp_timing_config tc;
    FP_TRY(timing_config(comm, cfg_timing, &tc));
    fp_buckets_config bc;
    FP_TRY(fp_buckets_config_read(cfg, &bc));
    size_t total = 0;
    for (int i = 0; i < n; ++i) total += tensors[i].count * fp_dtype_size(tensors[i].dtype);
    size_t list[16];
    int m = 0;
    if (caps) {
        for (int i = 0; i < ncaps; ++i) {
            FP_CHECK_ARG(caps[i] > 0, "caps[%d] is 0", i);
            list[m++] = caps[i];
        }
    } else {
        static const size_t mib[] = {1, 4, 8, 16, 25, 50, 100};
        for (size_t i = 0; i < sizeof mib / sizeof *mib; ++i) list[m++] = mib[i] << 20;
        list[m++] = total > 0 ? total : 1; /* one bucket for everything */
    }
    /* The default cap is always measured (the verdict's reference). */
    const size_t def_cap = bc.bucket_cap_bytes;
    int def = -1;
    for (int i = 0; i < m; ++i)
        if (list[i] == def_cap) def = i;
    if (def < 0) {
        FP_CHECK_ARG(m < 16, "16 caps and none is the default (%zu bytes): leave room for it", def_cap);
        list[m] = def_cap;
        def = m++;
    }
    fp_buckets_tune_result r;
    fp_buckets_tune_result_init(&r);
    r.ncaps = m;
    fp_status st = FP_OK;
    for (int i = 0; i < m && st == FP_OK; ++i) {
        fp_buckets_config ci = bc;
        ci.bucket_cap_bytes = list[i];
        ci.first_bucket_cap_bytes = bc.first_bucket_cap_bytes < list[i] ? bc.first_bucket_cap_bytes : list[i];
        fp_buckets *b = NULL;
        st = fp_buckets_create(comm, tensors, n, &ci, &b);
        if (st != FP_OK) break;
        iter_arg a = {.comm = comm, .t = tensors, .n = n, .op = ci.op, .b = b, .produce = produce, .user = user};
        r.caps[i] = list[i];
        r.buckets[i] = fp_buckets_count(b);
        st = fp_time(comm->ctx, comm->ctx->stream, buckets_iter, &a, &tc, &r.iteration[i]);
        if (st == FP_OK) st = fp_comm_synchronize(comm, -1);
        fp_buckets_destroy(b);
    }
    FP_TRY(st);
    int best = 0;
    for (int i = 1; i < m; ++i)
        if (r.iteration[i].median_ms < r.iteration[best].median_ms) best = i;
    r.best = best;
    /* Two separate measurements (not interleaved): samples = 1 makes the
     * spread of each the noise (fp_verdict_decide). */
    fp_stats sd = r.iteration[def], sb = r.iteration[best];
    sd.samples = sb.samples = 1;
    r.verdict_vs_default = fp_verdict_decide(&sd, &sb, tc.min_effect, &r.speedup_vs_default);
    r.recommended_cap = r.verdict_vs_default == FP_VERDICT_FASTER ? list[best] : def_cap;
    return fp_struct_write(result, &r, TUNE_RESULT_SIZE_FIRST, sizeof r, "fp_buckets_tune_result");
}
