/* comm/... scenarios: NCCL collectives and bucketed all-reduce (comm.h).
 * CUDA contexts only, and only in a build with NCCL (FASTPATH_WITH_NCCL);
 * otherwise each is skipped with its reason.
 *
 *   comm/allreduce_buckets  the built-in A/B (fp_buckets_validate): 200
 *                           tensors of a transformer's gradients (they cycle
 *                           through a GPT-2 block's 12, listed in backward
 *                           order: norms, MLP down / up, attention output,
 *                           fused QKV, each weight with its bias), about
 *                           --mib 100 MiB in f32 (--quick: 8), all-reduced
 *                           one by one on the compute stream (baseline)
 *                           against buckets on the communicator's stream
 *                           overlapped with the compute (optimized). Each
 *                           tensor is produced by a device copy from a
 *                           source buffer and --passes (default 2) passes of
 *                           out = 0.5 src + 0.5 out over it. One row per
 *                           flat_views (0: flat buffers and copies, 1: the
 *                           tensors are views into their buckets); a row
 *                           fails if the two sides' results differ.
 *   comm/bucket_tuner       fp_buckets_tune on the same list (flat buffers):
 *                           a row per cap tried (1 .. 100 MiB and one bucket
 *                           for everything, cap_kib) and a "recommended" row
 *                           (the default cap's iteration against the
 *                           fastest's, with the tuner's verdict).
 *   comm/collectives        fp_comm_bench (nccl-tests' algbw / busbw) for
 *                           all-reduce, all-gather, reduce-scatter and
 *                           broadcast in f32, 8 KiB x 4^k up to --max_mib
 *                           (default 256, the last size that limit itself;
 *                           --quick: 2).
 *
 * Ranks: --ranks N (default 1). 1: one rank on the run's device (a
 * communicator of one, made with fp_comm_get_unique_id + fp_comm_init).
 * N > 1: devices 0 .. N-1, one context each, a communicator made with
 * fp_comm_init_all and one thread per rank; rows report rank 0's figures.
 * With one rank nothing crosses a bus: busbw is 0 except for broadcast.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "scenario.h"
#include "timing/probes.h"

#define MAX_RANKS 8

/* ------------------------------------------------------------------------ */
/*  Ranks: contexts, communicators, a thread per rank                      */
/* ------------------------------------------------------------------------ */

typedef struct ranks {
    int n;
    fp_context *ctx[MAX_RANKS];
    int own_ctx;                 /* contexts made here (n > 1) */
    fp_comm *comm[MAX_RANKS];
} ranks;

typedef struct rank_job rank_job;
struct rank_job {
    const ranks *rk;
    int rank;
    fp_status (*fn)(rank_job *job);
    void *data;                  /* the scenario's per-rank state */
    fp_status st;
    char err[512];
};

static void ranks_close(ranks *rk) {
    for (int r = 0; r < rk->n; ++r) {
        fp_comm_destroy(rk->comm[r]);
        rk->comm[r] = NULL;
        if (rk->own_ctx) fp_context_destroy(rk->ctx[r]);
        rk->ctx[r] = NULL;
    }
    rk->n = 0;
}

/* Checks what the scenario needs and opens the communicator: FP_OK, or a
 * skip (FP_ERR_UNSUPPORTED, reason given to fb_skip), or another status
 * with its message in err. */
static fp_status ranks_open(fb_run *run, ranks *rk, char *err, size_t err_size) {
    memset(rk, 0, sizeof *rk);
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device");
    if (!fp_comm_available()) return fb_skip(run, "built without NCCL (FASTPATH_WITH_NCCL=OFF)");
    int64_t n = fb_opt_int(run, "ranks", 1);
    if (n < 1 || n > MAX_RANKS) return fb_skip(run, "--ranks must be in [1, %d]", MAX_RANKS);
    fp_comm_config cfg;
    fp_comm_config_default(&cfg);
    cfg.init_timeout_ms = 60000;
    cfg.timeout_ms = 120000; /* a hung collective fails the row instead of the run */
    fp_status st;
    if (n == 1) {
        fp_comm_id id;
        rk->n = 1;
        rk->ctx[0] = fb_ctx(run);
        st = fp_comm_get_unique_id(&id);
        if (st == FP_OK) st = fp_comm_init(rk->ctx[0], &id, 1, 0, &cfg, &rk->comm[0]);
    } else {
        int have = 0;
        st = fp_device_count(&have);
        if (st == FP_OK && have < n) return fb_skip(run, "--ranks %d needs %d CUDA devices (%d here)", (int)n, (int)n, have);
        rk->own_ctx = 1;
        for (int r = 0; st == FP_OK && r < n; ++r) {
            st = fp_context_create(FP_DEVICE_CUDA, r, &rk->ctx[r]);
            if (st == FP_OK) rk->n = r + 1;
        }
        if (st == FP_OK) st = fp_comm_init_all(rk->ctx, (int)n, &cfg, rk->comm);
    }
    if (st != FP_OK) {
        snprintf(err, err_size, "communicator of %d rank(s): %s", (int)n, fp_last_error());
        ranks_close(rk);
    }
    return st;
}

static void *rank_thread(void *p) {
    rank_job *job = p;
    job->st = job->fn(job);
    if (job->st != FP_OK && !job->err[0]) snprintf(job->err, sizeof job->err, "rank %d: %s", job->rank, fp_last_error());
    return NULL;
}

/* Runs fn for every rank at once (a thread each when there are several:
 * the collectives inside wait for all ranks), data[r] its state. Returns
 * the first failure, its message in err. */
static fp_status ranks_each(const ranks *rk, fp_status (*fn)(rank_job *), void *const *data, char *err,
                            size_t err_size) {
    rank_job jobs[MAX_RANKS];
    pthread_t tid[MAX_RANKS];
    int started[MAX_RANKS] = {0};
    for (int r = 0; r < rk->n; ++r) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].rk = rk;
        jobs[r].rank = r;
        jobs[r].fn = fn;
        jobs[r].data = data[r];
    }
    if (rk->n == 1) {
        rank_thread(&jobs[0]);
    } else {
        for (int r = 0; r < rk->n; ++r) {
            started[r] = pthread_create(&tid[r], NULL, rank_thread, &jobs[r]) == 0;
            if (!started[r]) {
                /* the others would wait for this rank: abort the clique */
                jobs[r].st = FP_ERR_INTERNAL;
                snprintf(jobs[r].err, sizeof jobs[r].err, "rank %d: pthread_create failed", r);
                for (int q = 0; q < rk->n; ++q) fp_comm_abort(rk->comm[q]);
            }
        }
        for (int r = 0; r < rk->n; ++r)
            if (started[r]) pthread_join(tid[r], NULL);
    }
    for (int r = 0; r < rk->n; ++r) {
        if (jobs[r].st != FP_OK) {
            snprintf(err, err_size, "%s", jobs[r].err);
            return jobs[r].st;
        }
    }
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  The tensor list and its producer                                        */
/* ------------------------------------------------------------------------ */

#define BLOCK_TENSORS 12

/* Elements of tensor k of a GPT-2 block of width h, in backward order:
 * ln2 bias and weight (h), MLP down bias (h) and weight (4h x h), up bias
 * (4h) and weight (h x 4h), ln1 bias and weight (h), attention output
 * bias (h) and weight (h x h), fused QKV bias (3h) and weight (h x 3h). */
static size_t block_tensor(int k, size_t h) {
    static const int mult[BLOCK_TENSORS] = {1, 1, 1, 4, 4, 4, 1, 1, 1, 1, 3, 3};
    static const int square[BLOCK_TENSORS] = {0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1};
    return (size_t)mult[k] * h * (square[k] ? h : 1);
}

static size_t list_elems(int n, size_t h) {
    size_t total = 0;
    for (int i = 0; i < n; ++i) total += block_tensor(i % BLOCK_TENSORS, h);
    return total;
}

/* The block width (a multiple of 8) whose list of n tensors comes closest
 * to `bytes` of f32 without going past it (8 at least). */
static size_t width_for(int n, size_t bytes) {
    size_t h = 8;
    while (list_elems(n, h + 8) * 4 <= bytes) h += 8;
    return h;
}

/* One rank's tensors: the baseline's memory (and, without flat views, the
 * optimized side's), and the sources the producer copies from. */
typedef struct rank_list {
    fp_context *ctx;
    fp_comm *comm;
    int n;
    int passes;
    fp_comm_tensor *t;
    float *src;                  /* every tensor's source, back to back */
    size_t *off;                 /* elements */
    void *mem;                   /* the tensors' memory, back to back */
    /* what the job does with it */
    fp_buckets_config bc;
    const fp_timing_config *tc;
    fp_buckets_ab_report ab;
    fp_buckets_tune_result tune;
} rank_list;

static fp_status produce(void *user, int i, void *data, fp_stream stream) {
    rank_list *l = user;
    const fp_comm_tensor *t = &l->t[i];
    const float *src = l->src + l->off[i];
    FP_TRY(fp_copy(l->ctx, stream, 1, data, src, t->count * sizeof(float)));
    /* 0.5 src + 0.5 src: the same tensor however many passes */
    for (int p = 0; p < l->passes; ++p)
        FP_TRY(fp_axpby(l->ctx, stream, 2, FP_F32, t->count, 0.5f, src, 0.5f, data, data));
    return FP_OK;
}

static void list_free(rank_list *l) {
    if (!l->ctx) return;
    fp_mem_free(l->ctx, l->src);
    fp_mem_free(l->ctx, l->mem);
    free(l->t);
    free(l->off);
    memset(l, 0, sizeof *l);
}

static fp_status list_make(rank_list *l, fp_context *ctx, fp_comm *comm, int rank, int n, size_t h, int passes) {
    memset(l, 0, sizeof *l);
    l->ctx = ctx;
    l->comm = comm;
    l->n = n;
    l->passes = passes;
    l->t = calloc((size_t)n, sizeof *l->t);
    l->off = calloc((size_t)n + 1, sizeof *l->off);
    if (!l->t || !l->off) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "tensor list of %d", n);
    for (int i = 0; i < n; ++i) l->off[i + 1] = l->off[i] + block_tensor(i % BLOCK_TENSORS, h);
    const size_t total = l->off[n];
    FP_TRY(fb_alloc_random(ctx, total, FP_F32, 1000 + (uint64_t)rank, -1.0f, 1.0f, (void **)&l->src));
    FP_TRY(fp_mem_alloc(ctx, total * sizeof(float), &l->mem));
    for (int i = 0; i < n; ++i) {
        l->t[i].data = (float *)l->mem + l->off[i];
        l->t[i].count = l->off[i + 1] - l->off[i];
        l->t[i].dtype = FP_F32;
    }
    return FP_OK;
}

typedef struct list_shape {
    int64_t mib, tensors, passes;
    size_t h, total_bytes;
} list_shape;

/* The list's options; 0 and a failed row if they are out of range. */
static int list_shape_get(fb_run *run, list_shape *s) {
    s->mib = fb_opt_int(run, "mib", fb_quick(run) ? 8 : 100);
    s->tensors = fb_opt_int(run, "tensors", 200);
    s->passes = fb_opt_int(run, "passes", 2);
    if (s->mib < 1 || s->mib > 65536 || s->tensors < 1 || s->tensors > 100000 || s->passes < 0 || s->passes > 64) {
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "mib", s->mib);
        fb_param_int(r, "tensors", s->tensors);
        fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--mib must be in [1, 65536], --tensors in [1, 100000], --passes in [0, 64]");
        return 0;
    }
    s->h = width_for((int)s->tensors, (size_t)s->mib << 20);
    s->total_bytes = list_elems((int)s->tensors, s->h) * sizeof(float);
    return 1;
}

static void list_params(fb_result *r, const list_shape *s, int nranks) {
    fb_param_int(r, "ranks", nranks);
    fb_param_int(r, "tensors", s->tensors);
    fb_param_int(r, "mib", s->mib);
    fb_param_str(r, "dtype", "f32");
}

/* Makes every rank's list; frees them all on failure. */
static fp_status lists_make(const ranks *rk, const list_shape *s, rank_list *lists, void **data, char *err,
                            size_t err_size) {
    fp_status st = FP_OK;
    for (int r = 0; r < rk->n; ++r) {
        data[r] = &lists[r];
        if (st == FP_OK) {
            st = list_make(&lists[r], rk->ctx[r], rk->comm[r], r, (int)s->tensors, s->h, (int)s->passes);
            if (st != FP_OK) snprintf(err, err_size, "rank %d's tensors: %s", r, fp_last_error());
        }
    }
    if (st != FP_OK)
        for (int r = 0; r < rk->n; ++r) list_free(&lists[r]);
    return st;
}

/* A scenario on the tensor list: its ranks, options, every rank's tensors. */
typedef struct list_run {
    ranks rk;
    list_shape s;
    rank_list lists[MAX_RANKS];
    void *data[MAX_RANKS];
    char err[512];
} list_run;

/* Its start. 0: the scenario is over (*st FP_ERR_UNSUPPORTED: skipped;
 * FP_OK: an option was out of range, its row failed); 1: go on, *st the
 * status so far (its message in lr->err). */
static int lists_open(fb_run *run, list_run *lr, fp_status *st) {
    memset(lr, 0, sizeof *lr);
    *st = ranks_open(run, &lr->rk, lr->err, sizeof lr->err);
    if (*st == FP_ERR_UNSUPPORTED) return 0;
    if (!list_shape_get(run, &lr->s)) {
        ranks_close(&lr->rk);
        *st = FP_OK;
        return 0;
    }
    if (*st == FP_OK) *st = lists_make(&lr->rk, &lr->s, lr->lists, lr->data, lr->err, sizeof lr->err);
    return 1;
}

/* ------------------------------------------------------------------------ */
/*  comm/allreduce_buckets                                                  */
/* ------------------------------------------------------------------------ */

static fp_status validate_job(rank_job *job) {
    rank_list *l = job->data;
    fp_buckets_ab_report_init(&l->ab);
    return fp_buckets_validate(l->comm, l->t, l->n, &l->bc, produce, l, l->tc, &l->ab);
}

static fp_status run_allreduce_buckets(fb_run *run) {
    list_run lr;
    fp_status st;
    if (!lists_open(run, &lr, &st)) return st;
    for (int fv = 0; fv < 2; ++fv) {
        fb_result *r = fb_result_new(run);
        list_params(r, &lr.s, lr.rk.n > 0 ? lr.rk.n : (int)fb_opt_int(run, "ranks", 1));
        fb_param_int(r, "flat_views", fv);
        if (st != FP_OK) {
            fb_result_fail(r, st, lr.err);
            continue;
        }
        for (int q = 0; q < lr.rk.n; ++q) {
            fp_buckets_config_default(&lr.lists[q].bc);
            lr.lists[q].bc.flat_views = fv;
            lr.lists[q].tc = fb_timing(run);
        }
        fp_status rst = ranks_each(&lr.rk, validate_job, lr.data, lr.err, sizeof lr.err);
        if (rst != FP_OK) {
            fb_result_fail(r, rst, lr.err);
            continue;
        }
        const fp_buckets_ab_report *rep = &lr.lists[0].ab;
        fp_ab_report ab;
        memset(&ab, 0, sizeof ab);
        ab.baseline = rep->baseline;
        ab.optimized = rep->optimized;
        ab.speedup = rep->speedup;
        ab.verdict = rep->verdict;
        ab.compared = 1;
        ab.agreement.max_abs_err = rep->max_abs_err;
        ab.agreement.passed = rep->results_agree;
        ab.pct_of_peak = -1;
        ab.bound = "unknown";
        fb_result_set_ab(r, &ab);
        fb_result_metric(r, "speedup", rep->speedup);
        fb_result_metric(r, "exposed_ms", rep->exposed_ms);
        fb_result_metric(r, "buckets", rep->buckets);
        fb_result_metric(r, "baseline_ms", rep->baseline.median_ms);
        fb_result_metric(r, "optimized_ms", rep->optimized.median_ms);
        fb_result_metric(r, "produce_ms", rep->produce_ms);
        fb_result_metric(r, "results_agree", rep->results_agree);
        fb_result_metric(r, "max_abs_err", rep->max_abs_err);
        fb_result_metric(r, "total_mib", (double)lr.s.total_bytes / (1 << 20));
        fb_result_metric(r, "hidden", (double)lr.s.h);
        fb_result_metric(r, "passes", (double)lr.s.passes);
        if (!rep->results_agree)
            fb_result_fail(r, FP_ERR_MISMATCH, "bucketed all-reduce results differ from the per-tensor all-reduce's");
    }
    for (int q = 0; q < lr.rk.n; ++q) list_free(&lr.lists[q]);
    ranks_close(&lr.rk);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  comm/bucket_tuner                                                       */
/* ------------------------------------------------------------------------ */

static fp_status tune_job(rank_job *job) {
    rank_list *l = job->data;
    fp_buckets_tune_result_init(&l->tune);
    return fp_buckets_tune(l->comm, l->t, l->n, &l->bc, NULL, 0, produce, l, l->tc, &l->tune);
}

static void tuner_rows(fb_run *run, const list_shape *s, int nranks, const fp_buckets_tune_result *t,
                       const fp_buckets_config *bc) {
    int def = -1;
    for (int i = 0; i < t->ncaps; ++i)
        if (t->caps[i] == bc->bucket_cap_bytes) def = i;
    for (int i = 0; i < t->ncaps; ++i) {
        fb_result *r = fb_result_new(run);
        list_params(r, s, nranks);
        fb_param_int(r, "cap_kib", (int64_t)(t->caps[i] >> 10));
        fb_result_metric(r, "median_ms", t->iteration[i].median_ms);
        fb_result_metric(r, "p10_ms", t->iteration[i].p10_ms);
        fb_result_metric(r, "p90_ms", t->iteration[i].p90_ms);
        fb_result_metric(r, "buckets", t->buckets[i]);
        fb_result_metric(r, "best", i == t->best);
        if (def >= 0 && t->iteration[i].median_ms > 0)
            fb_result_metric(r, "vs_default", t->iteration[def].median_ms / t->iteration[i].median_ms);
        if (t->caps[i] == s->total_bytes) fb_result_note(r, "one bucket for everything");
        else if (i == def) fb_result_note(r, "the default cap");
    }
    fb_result *r = fb_result_new(run);
    list_params(r, s, nranks);
    fb_param_str(r, "cap_kib", "recommended");
    if (def >= 0) {
        fp_ab_report ab;
        memset(&ab, 0, sizeof ab);
        ab.baseline = t->iteration[def];
        ab.optimized = t->iteration[t->best];
        ab.speedup = t->speedup_vs_default;
        ab.verdict = t->verdict_vs_default;
        ab.pct_of_peak = -1;
        ab.bound = "unknown";
        fb_result_set_ab(r, &ab);
    }
    fb_result_metric(r, "recommended_cap_kib", (double)(t->recommended_cap >> 10));
    fb_result_metric(r, "best_cap_kib", (double)(t->caps[t->best] >> 10));
    fb_result_metric(r, "speedup_vs_default", t->speedup_vs_default);
    fb_result_metric(r, "default_cap_kib", (double)(bc->bucket_cap_bytes >> 10));
    fb_result_note(r, "baseline: the default cap; optimized: the fastest cap (%zu KiB), %s", t->caps[t->best] >> 10,
                   fp_verdict_string(t->verdict_vs_default));
}

static fp_status run_bucket_tuner(fb_run *run) {
    list_run lr;
    fp_status st;
    if (!lists_open(run, &lr, &st)) return st;
    if (st == FP_OK) {
        for (int q = 0; q < lr.rk.n; ++q) {
            fp_buckets_config_default(&lr.lists[q].bc);
            lr.lists[q].tc = fb_timing(run);
        }
        st = ranks_each(&lr.rk, tune_job, lr.data, lr.err, sizeof lr.err);
    }
    if (st == FP_OK) {
        tuner_rows(run, &lr.s, lr.rk.n, &lr.lists[0].tune, &lr.lists[0].bc);
    } else {
        fb_result *r = fb_result_new(run);
        list_params(r, &lr.s, lr.rk.n > 0 ? lr.rk.n : (int)fb_opt_int(run, "ranks", 1));
        fb_result_fail(r, st, lr.err);
    }
    for (int q = 0; q < lr.rk.n; ++q) list_free(&lr.lists[q]);
    ranks_close(&lr.rk);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  comm/collectives                                                        */
/* ------------------------------------------------------------------------ */

typedef struct bench_job {
    fp_comm *comm;
    fp_coll_kind kind;
    size_t bytes;
    const fp_timing_config *tc;
    fp_coll_bench out;
} bench_job;

static fp_status bench_one(rank_job *job) {
    bench_job *b = job->data;
    return fp_comm_bench(b->comm, b->kind, b->bytes, FP_F32, b->tc, &b->out);
}

static fp_status run_collectives(fb_run *run) {
    char err[512] = "";
    ranks rk;
    fp_status st = ranks_open(run, &rk, err, sizeof err);
    if (st == FP_ERR_UNSUPPORTED) return st;
    const int64_t max_mib = fb_opt_int(run, "max_mib", fb_quick(run) ? 2 : 256);
    if (max_mib < 1 || max_mib > 65536) {
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "max_mib", max_mib);
        fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--max_mib must be in [1, 65536]");
        ranks_close(&rk);
        return FP_OK;
    }
    const size_t max_bytes = (size_t)max_mib << 20;
    size_t sizes[16];
    int nsizes = 0;
    for (size_t b = (size_t)8 << 10; b <= max_bytes && nsizes < 15; b *= 4) sizes[nsizes++] = b;
    if (sizes[nsizes - 1] != max_bytes) sizes[nsizes++] = max_bytes;
    const int nranks = rk.n > 0 ? rk.n : (int)fb_opt_int(run, "ranks", 1);
    for (int k = 0; k < FP_COLL_KINDS; ++k) {
        for (int i = 0; i < nsizes; ++i) {
            fb_result *r = fb_result_new(run);
            fb_param_str(r, "kind", fp_coll_kind_name((fp_coll_kind)k));
            fb_param_int(r, "bytes", (int64_t)sizes[i]);
            fb_param_int(r, "ranks", nranks);
            fb_param_str(r, "dtype", "f32");
            if (st != FP_OK) {
                fb_result_fail(r, st, err);
                continue;
            }
            bench_job jobs[MAX_RANKS];
            void *data[MAX_RANKS];
            for (int q = 0; q < rk.n; ++q) {
                memset(&jobs[q], 0, sizeof jobs[q]);
                jobs[q].comm = rk.comm[q];
                jobs[q].kind = (fp_coll_kind)k;
                jobs[q].bytes = sizes[i];
                jobs[q].tc = fb_timing(run);
                data[q] = &jobs[q];
            }
            fp_status rst = ranks_each(&rk, bench_one, data, err, sizeof err);
            if (rst != FP_OK) {
                fb_result_fail(r, rst, err);
                continue;
            }
            const fp_coll_bench *b = &jobs[0].out;
            fb_result_metric(r, "busbw_gbps", b->busbw_gbps);
            fb_result_metric(r, "algbw_gbps", b->algbw_gbps);
            fb_result_metric(r, "median_us", b->latency.median_ms * 1e3);
            fb_result_metric(r, "p10_us", b->latency.p10_ms * 1e3);
            fb_result_metric(r, "p90_us", b->latency.p90_ms * 1e3);
            fb_result_metric(r, "nranks", rk.n);
            fb_result_metric(r, "algbw_bytes", b->bytes);
            fb_result_metric(r, "samples", b->latency.samples);
            if (rk.n == 1 && k != FP_COLL_BROADCAST) fb_result_note(r, "one rank: nothing crosses a bus (busbw 0)");
        }
    }
    ranks_close(&rk);
    return FP_OK;
}

FB_SCENARIO(fb_comm_allreduce_buckets, "comm/allreduce_buckets",
            "200 gradient tensors (~100 MiB f32) with compute: per-tensor all-reduce vs buckets overlapped "
            "(fp_buckets_validate), flat buffers and flat views",
            run_allreduce_buckets)
FB_SCENARIO(fb_comm_bucket_tuner, "comm/bucket_tuner",
            "bucket cap tuner (fp_buckets_tune) on the 200-tensor list: iteration time per cap, recommended cap",
            run_bucket_tuner)
FB_SCENARIO(fb_comm_collectives, "comm/collectives",
            "all-reduce / all-gather / reduce-scatter / broadcast at 8 KiB .. 256 MiB: algbw, busbw, latency "
            "(fp_comm_bench)",
            run_collectives)
