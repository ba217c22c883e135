/* Built-in A/B of the batcher: one request stream through a batch-1 batcher
 * (baseline) and through the dynamic batcher, closed or open loop, with a
 * model whose batch cost grows sublinearly.
 *
 * The CPU model: a batch costs `fixed_us` (a launch plus a pass over the
 * weights, the part batching amortizes) plus `item_us` per padded item,
 * spent in a dependent floating-point chain calibrated once per process.
 * Outputs are out[j] = 2 * in[j] + 1, exact in float (2 * x is exact), so
 * every output is checked bit for bit.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "batcher_internal.h"
#include "internal.h"

/* ------------------------------------------------------------------------ */
/*  CPU model                                                               */
/* ------------------------------------------------------------------------ */

/* A dependent multiply-add chain: cannot be vectorized or skipped. The
 * coefficients are read through volatiles so the compiler cannot fold the
 * chain (with constants it proves x stays at its fixed point). */
static volatile double g_spin_mul = 0.99999;
static volatile double g_spin_add = 3e-6;
static double spin(double x, long iters) {
    const double mul = g_spin_mul, add = g_spin_add;
    for (long i = 0; i < iters; ++i) x = x * mul + add;
    return x;
}

static pthread_once_t g_calib_once = PTHREAD_ONCE_INIT;
static double g_iters_per_us = 500.0;

/* Best of a few timed runs: the least disturbed one on a shared machine. */
static void calibrate(void) {
    const long iters = 200000;
    double best = 1e30;
    volatile double sink = 0;
    for (int rep = 0; rep < 5; ++rep) {
        double t0 = fp_now_s();
        sink = spin(1.0 + sink * 1e-30, iters);
        double dt = fp_now_s() - t0;
        if (dt > 0 && dt < best) best = dt;
    }
    if (best < 1e29) g_iters_per_us = (double)iters / (best * 1e6);
}

typedef struct cpu_model_state {
    long fixed_iters, item_iters;
    int dim;
} cpu_model_state;

static fp_status cpu_model_exec(void *user, fp_batch_item *items, int count, int padded) {
    const cpu_model_state *m = user;
    volatile double sink;
    double acc = spin(1.0, m->fixed_iters);
    for (int i = 0; i < padded; ++i) {
        acc = spin(acc, m->item_iters);
        if (i >= count) continue; /* padding: the cost without an output */
        fp_batch_item *it = &items[i];
        if (it->input_size < (size_t)m->dim * sizeof(float) ||
            it->output_size < (size_t)m->dim * sizeof(float)) {
            it->status = FP_ERR_INVALID_ARGUMENT;
            continue;
        }
        const float *in = it->input;
        float *out = it->output;
        for (int j = 0; j < m->dim; ++j) out[j] = 2.0f * in[j] + 1.0f;
    }
    sink = acc;
    (void)sink;
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Config                                                                  */
/* ------------------------------------------------------------------------ */

/* The first published size of fp_batcher_bench_config (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define BATCHER_BENCH_CONFIG_SIZE_FIRST sizeof(fp_batcher_bench_config)

fp_status fp_batcher_bench_config_default_sized(fp_batcher_bench_config *out, size_t struct_size) {
    fp_batcher_bench_config defaults, *c = &defaults;
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->load = FP_BATCHER_LOAD_CLOSED;
    c->clients = 64;
    c->rate_rps = 30000;
    c->requests = 8192;
    c->warmup_requests = 256;
    c->windows = 8;
    fp_batcher_config_default(&c->batcher);
    c->batcher.max_batch_size = 64;
    c->batcher.max_queue_delay_us = 200;
    c->model.fixed_us = 100;
    c->model.item_us = 8;
    c->model.dim = 16;
    c->seed = 1;
    return fp_struct_init(out, struct_size, c, BATCHER_BENCH_CONFIG_SIZE_FIRST, sizeof *c, "fp_batcher_bench_config");
}

void(fp_batcher_bench_config_default)(fp_batcher_bench_config *c) {
    if (c) (void)fp_batcher_bench_config_default_sized(c, BATCHER_BENCH_CONFIG_SIZE_FIRST);
}

/* ------------------------------------------------------------------------ */
/*  One side                                                                */
/* ------------------------------------------------------------------------ */

typedef struct side_run {
    const fp_batcher_bench_config *cfg;
    fp_batcher *b;
    int total, warmup, dim;
    float *in, *out;
    double *t_submit, *t_done;
    fp_status *status;
    atomic_int next;       /* closed loop: next request index */
    atomic_int errors;     /* submit failures */
    fp_status first_error;
    pthread_mutex_t err_mu;
} side_run;

static void note_error(side_run *s, fp_status st) {
    pthread_mutex_lock(&s->err_mu);
    if (s->first_error == FP_OK) s->first_error = st;
    pthread_mutex_unlock(&s->err_mu);
    atomic_fetch_add(&s->errors, 1);
}

static void fill_info(side_run *s, int i, fp_batch_submit_info *info) {
    fp_batch_submit_info_default(info);
    info->input = s->in + (size_t)i * s->dim;
    info->input_size = (size_t)s->dim * sizeof(float);
    info->output = s->out + (size_t)i * s->dim;
    info->output_size = (size_t)s->dim * sizeof(float);
    info->user = (void *)(intptr_t)i;
}

static void *closed_client(void *arg) {
    side_run *s = arg;
    for (;;) {
        int i = atomic_fetch_add(&s->next, 1);
        if (i >= s->total) break;
        if (i == s->warmup) fp_batcher_reset_stats(s->b);
        fp_batch_submit_info info;
        fill_info(s, i, &info);
        fp_batch_request *req = NULL;
        s->t_submit[i] = fp_now_s();
        fp_status st = fp_batcher_submit(s->b, &info, &req);
        if (st != FP_OK) {
            s->status[i] = st;
            s->t_done[i] = fp_now_s();
            note_error(s, st);
            continue;
        }
        fp_status result = FP_ERR_INTERNAL;
        fp_batch_request_wait(req, -1, &result);
        s->t_done[i] = fp_now_s();
        s->status[i] = result;
        fp_batch_request_release(req);
    }
    return NULL;
}

static void open_done(fp_batch_request *req, fp_status st, void *user) {
    side_run *s = user;
    int i = (int)(intptr_t)fp_batch_request_user(req);
    s->t_done[i] = fp_now_s();
    s->status[i] = st;
}

static void *open_generator(void *arg) {
    side_run *s = arg;
    /* Wake-ups within a microsecond or so instead of the default 50 us slack. */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    uint64_t rng = s->cfg->seed * 0x9E3779B97F4A7C15ULL + 7;
    double t = fp_now_s();
    for (int i = 0; i < s->total; ++i) {
        /* Exponential inter-arrival times: a Poisson process at rate_rps. */
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        double u = (double)((rng * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
        t += -log(1.0 - u) / s->cfg->rate_rps;
        if (t > fp_now_s() + 20e-6) {
            struct timespec ts;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
            }
        }
        if (i == s->warmup) fp_batcher_reset_stats(s->b);
        fp_batch_submit_info info;
        fill_info(s, i, &info);
        info.on_done = open_done;
        info.on_done_user = s;
        s->t_submit[i] = fp_now_s();
        fp_status st = fp_batcher_submit(s->b, &info, NULL);
        if (st != FP_OK) {
            s->status[i] = st;
            s->t_done[i] = fp_now_s();
            note_error(s, st);
        }
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static fp_status run_side(const fp_batcher_bench_config *cfg, const fp_batcher_config *bcfg,
                          fp_batch_executor_fn exec, void *exec_user, const float *inputs,
                          fp_batcher_bench_side *side) {
    side_run s;
    memset(&s, 0, sizeof s);
    s.cfg = cfg;
    s.warmup = cfg->warmup_requests;
    s.total = cfg->warmup_requests + cfg->requests;
    s.dim = cfg->model.dim;
    s.first_error = FP_OK;
    atomic_init(&s.next, 0);
    atomic_init(&s.errors, 0);
    pthread_mutex_init(&s.err_mu, NULL);
    size_t nf = (size_t)s.total * (size_t)s.dim;
    s.in = (float *)inputs;
    s.out = malloc(nf * sizeof *s.out);
    s.t_submit = calloc((size_t)s.total, sizeof *s.t_submit);
    s.t_done = calloc((size_t)s.total, sizeof *s.t_done);
    s.status = calloc((size_t)s.total, sizeof *s.status);
    double *done_sorted = malloc((size_t)cfg->requests * sizeof *done_sorted);
    double *window_ms = malloc((size_t)cfg->windows * sizeof *window_ms);
    fp_status st = FP_OK;
    if (!s.out || !s.t_submit || !s.t_done || !s.status || !done_sorted || !window_ms)
        st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "benchmark buffers for %d requests", s.total);
    if (st == FP_OK) {
        for (size_t k = 0; k < nf; ++k) s.out[k] = NAN; /* poison */
        st = fp_batcher_create(bcfg, exec, exec_user, &s.b);
    }
    int nthreads = cfg->load == FP_BATCHER_LOAD_CLOSED ? cfg->clients : 1;
    pthread_t *th = NULL;
    int started = 0;
    if (st == FP_OK) {
        th = malloc((size_t)nthreads * sizeof *th);
        if (!th) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "client threads");
    }
    if (st == FP_OK) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        for (int t = 0; t < nthreads; ++t) {
            void *(*fn)(void *) = cfg->load == FP_BATCHER_LOAD_CLOSED ? closed_client : open_generator;
            if (pthread_create(&th[t], &attr, fn, &s) != 0) {
                st = fp_set_error(FP_ERR_INTERNAL, "cannot start client thread %d", t);
                atomic_store(&s.next, s.total); /* stop the started ones */
                break;
            }
            started++;
        }
        pthread_attr_destroy(&attr);
    }
    for (int t = 0; t < started; ++t) pthread_join(th[t], NULL);
    if (s.b) {
        /* Drain: every callback has run when it returns. */
        fp_status sd = fp_batcher_shutdown(s.b, FP_BATCHER_SHUTDOWN_DRAIN);
        if (st == FP_OK) st = sd;
        fp_batcher_stats_init(&side->stats);
        fp_status gs = fp_batcher_get_stats(s.b, &side->stats);
        if (st == FP_OK) st = gs;
    }
    if (st == FP_OK) {
        double t_first = 1e300, t_last = 0;
        int m = 0;
        for (int i = s.warmup; i < s.total; ++i) {
            if (s.t_submit[i] < t_first) t_first = s.t_submit[i];
            if (s.t_done[i] > t_last) t_last = s.t_done[i];
            done_sorted[m++] = s.t_done[i];
            if (s.status[i] != FP_OK) {
                side->failed++;
                continue;
            }
            const float *in = s.in + (size_t)i * s.dim;
            const float *out = s.out + (size_t)i * s.dim;
            for (int j = 0; j < s.dim; ++j)
                if (!(out[j] == 2.0f * in[j] + 1.0f)) {
                    side->wrong_outputs++;
                    break;
                }
        }
        qsort(done_sorted, (size_t)m, sizeof *done_sorted, cmp_double);
        side->wall_s = t_last - t_first;
        side->throughput_rps = side->wall_s > 0 ? m / side->wall_s : 0;
        side->per_request_us = m > 0 ? side->wall_s * 1e6 / m : 0;
        /* Per-window per-request time: the spread of throughput over the run. */
        int w = cfg->windows < m ? cfg->windows : m;
        double prev = t_first;
        for (int k = 0; k < w; ++k) {
            int end = (int)((int64_t)m * (k + 1) / w) - 1;
            int begin = (int)((int64_t)m * k / w);
            double dt = done_sorted[end] - prev;
            window_ms[k] = (dt > 0 ? dt : 0) * 1e3 / (end - begin + 1);
            prev = done_sorted[end];
        }
        st = fp_stats_compute(window_ms, w, &side->per_request);
        const fp_batcher_stats *bs = &side->stats;
        double executed = (double)(bs->completed_ok + bs->failed);
        if (executed > 0) {
            if (cfg->executor)
                side->model_us_per_request =
                    bs->executor_busy_s * 1e6 / bcfg->executor_threads / executed;
            else
                side->model_us_per_request = (cfg->model.fixed_us * (double)bs->batches +
                                              cfg->model.item_us * (double)bs->padded_slots) /
                                             executed;
        }
        double ovh = side->per_request_us - side->model_us_per_request;
        side->sched_overhead_us = ovh > 0 ? ovh : 0;
    }
    if (st == FP_OK && s.first_error != FP_OK)
        st = fp_set_error(s.first_error, "%d submit(s) failed during the benchmark",
                          atomic_load(&s.errors));
    fp_batcher_destroy(s.b);
    free(th);
    free(s.out);
    free(s.t_submit);
    free(s.t_done);
    free(s.status);
    free(done_sorted);
    free(window_ms);
    pthread_mutex_destroy(&s.err_mu);
    return st;
}

/* ------------------------------------------------------------------------ */
/*  The A/B                                                                 */
/* ------------------------------------------------------------------------ */

fp_status fp_batcher_bench(const fp_batcher_bench_config *cfg, fp_batcher_bench_report *report) {
    FP_CHECK_NOT_NULL(cfg);
    FP_CHECK_NOT_NULL(report);
    fp_batcher_bench_config full;
    FP_STRUCT_IN(&cfg, full, BATCHER_BENCH_CONFIG_SIZE_FIRST, fp_batcher_bench_config_default,
                 "fp_batcher_bench_config (config)");
    FP_CHECK_ARG(cfg->load == FP_BATCHER_LOAD_CLOSED || cfg->load == FP_BATCHER_LOAD_OPEN,
                 "config field 'load' is %d, not CLOSED (0) or OPEN (1)", (int)cfg->load);
    FP_CHECK_ARG(cfg->load != FP_BATCHER_LOAD_CLOSED || (cfg->clients >= 1 && cfg->clients <= 4096),
                 "config field 'clients' must be in 1..4096 (got %d)", cfg->clients);
    FP_CHECK_ARG(cfg->load != FP_BATCHER_LOAD_OPEN || (cfg->rate_rps > 0 && cfg->rate_rps <= 1e8),
                 "config field 'rate_rps' must be in (0, 1e8] (got %g)", cfg->rate_rps);
    FP_CHECK_ARG(cfg->requests >= 1 && cfg->requests <= 10000000,
                 "config field 'requests' must be in 1..1e7 (got %d)", cfg->requests);
    FP_CHECK_ARG(cfg->warmup_requests >= 0 && cfg->warmup_requests <= 10000000,
                 "config field 'warmup_requests' must be in 0..1e7 (got %d)",
                 cfg->warmup_requests);
    FP_CHECK_ARG(cfg->windows >= 1 && cfg->windows <= 1024,
                 "config field 'windows' must be in 1..1024 (got %d)", cfg->windows);
    FP_CHECK_ARG(cfg->model.dim >= 1 && cfg->model.dim <= 65536,
                 "config field 'model.dim' must be in 1..65536 (got %d)", cfg->model.dim);
    FP_CHECK_ARG(cfg->model.fixed_us >= 0 && cfg->model.item_us >= 0 &&
                     cfg->model.fixed_us <= 1e6 && cfg->model.item_us <= 1e6,
                 "config fields 'model.fixed_us' / 'model.item_us' must be in 0..1e6 (got %g, %g)",
                 cfg->model.fixed_us, cfg->model.item_us);
    FP_TRY(fp_batcher_config_validate(&cfg->batcher));

    fp_batcher_config base = cfg->batcher;
    base.max_batch_size = 1;
    base.max_queue_delay_us = 0;
    base.num_preferred_batch_sizes = 0;
    base.num_allowed_batch_sizes = 0;

    cpu_model_state model;
    pthread_once(&g_calib_once, calibrate);
    model.fixed_iters = (long)(cfg->model.fixed_us * g_iters_per_us);
    model.item_iters = (long)(cfg->model.item_us * g_iters_per_us);
    model.dim = cfg->model.dim;
    fp_batch_executor_fn exec = cfg->executor ? cfg->executor : cpu_model_exec;
    void *exec_user = cfg->executor ? cfg->executor_user : &model;

    int total = cfg->warmup_requests + cfg->requests;
    size_t nf = (size_t)total * (size_t)cfg->model.dim;
    float *inputs = malloc(nf * sizeof *inputs);
    if (!inputs) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "benchmark inputs (%zu floats)", nf);
    uint64_t rng = cfg->seed * 0x9E3779B97F4A7C15ULL + 1;
    for (size_t k = 0; k < nf; ++k) {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        float v = (float)((double)((rng * 0x2545F4914F6CDD1DULL) >> 40) / 16777216.0 * 2.0 - 1.0);
        inputs[k] = v == 0.0f ? 0.5f : v;
    }

    fp_batcher_bench_report rep;
    memset(&rep, 0, sizeof rep);
    fp_status st = run_side(cfg, &base, exec, exec_user, inputs, &rep.baseline);
    if (st == FP_OK) st = run_side(cfg, &cfg->batcher, exec, exec_user, inputs, &rep.batched);
    free(inputs);
    if (st != FP_OK) return st;

    rep.speedup = rep.baseline.throughput_rps > 0
                      ? rep.batched.throughput_rps / rep.baseline.throughput_rps
                      : 0;
    rep.ab.baseline = rep.baseline.per_request;
    rep.ab.optimized = rep.batched.per_request;
    rep.ab.verdict = fp_verdict_decide(&rep.ab.baseline, &rep.ab.optimized, 0.01, &rep.ab.speedup);
    rep.ab.compared = 1;
    rep.ab.agreement.count = (size_t)cfg->requests * 2;
    rep.ab.agreement.mismatches = (size_t)(rep.baseline.wrong_outputs + rep.batched.wrong_outputs);
    rep.ab.agreement.first_bad = rep.ab.agreement.mismatches ? 0 : SIZE_MAX;
    rep.ab.agreement.passed = rep.ab.agreement.mismatches == 0 && rep.baseline.failed == 0 &&
                              rep.batched.failed == 0;
    rep.ab.pct_of_peak = -1;
    rep.ab.bound = "unknown";
    rep.batch1_cost_us = rep.baseline.stats.executor.p50_us;
    rep.batch_cost_us = rep.batched.stats.executor.p50_us;
    *report = rep;
    if (!rep.ab.agreement.passed)
        return fp_set_error(FP_ERR_MISMATCH,
                            "batcher benchmark: %lld wrong output(s), %lld failed request(s)",
                            (long long)(rep.baseline.wrong_outputs + rep.batched.wrong_outputs),
                            (long long)(rep.baseline.failed + rep.batched.failed));
    return FP_OK;
}
