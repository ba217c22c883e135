/* fastbench scenarios of the dynamic batcher (fp_batcher_bench):
 *
 *   batcher/closed_loop  K client threads (1, 8, 64, 256; --clients N for
 *                        one) submit, wait, repeat: batch 1 vs dynamic.
 *   batcher/open_loop    Poisson arrivals at --rate (default 30000 req/s).
 *   batcher/overhead     a no-op model: what the batcher itself costs per
 *                        request, closed loop at 64 clients and
 *                        fire-and-forget from 64 threads.
 *
 * The model is the CPU compute callback of fp_batcher_bench (fixed cost
 * --fixed_us plus --item_us per padded item, real arithmetic), on any
 * context: the batcher is host code. Options: --requests, --max_batch,
 * --delay_us, --executor_threads, --fixed_us, --item_us.
 *
 * The A/B timing is per-request time (wall time of a window of requests
 * divided by their count, 8 windows per side), so "speedup" is the
 * throughput ratio with a noise-aware verdict.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "fastpath/batcher.h"
#include "scenario.h"

static void bench_defaults(fb_run *run, fp_batcher_bench_config *c) {
    fp_batcher_bench_config_default(c);
    int quick = fb_quick(run);
    c->requests = (int)fb_opt_int(run, "requests", quick ? 600 : 8192);
    c->warmup_requests = quick ? 64 : 256;
    c->batcher.max_batch_size = (int)fb_opt_int(run, "max_batch", 64);
    c->batcher.max_queue_delay_us = fb_opt_int(run, "delay_us", 200);
    c->batcher.executor_threads = (int)fb_opt_int(run, "executor_threads", 1);
    c->model.fixed_us = fb_opt_double(run, "fixed_us", 100);
    c->model.item_us = fb_opt_double(run, "item_us", 8);
}

static void report_row(fb_run *run, const fp_batcher_bench_config *c,
                       const fp_batcher_bench_report *rep, fp_status st, const char *model) {
    fb_result *r = fb_result_new(run);
    if (c->load == FP_BATCHER_LOAD_CLOSED) fb_param_int(r, "clients", c->clients);
    else fb_param_int(r, "rate_rps", (int64_t)c->rate_rps);
    fb_param_int(r, "max_batch", c->batcher.max_batch_size);
    fb_param_int(r, "delay_us", c->batcher.max_queue_delay_us);
    fb_param_int(r, "requests", c->requests);
    char label[64];
    if (strcmp(model, "cpu") == 0) {
        snprintf(label, sizeof label, "cpu %g+%g/item us", c->model.fixed_us, c->model.item_us);
        model = label;
    }
    fb_param_str(r, "model", model);
    if (st != FP_OK && st != FP_ERR_MISMATCH) {
        fb_result_fail(r, st, fp_last_error());
        return;
    }
    fb_result_set_ab(r, &rep->ab);
    const fp_batcher_bench_side *b = &rep->batched, *a = &rep->baseline;
    fb_result_metric(r, "throughput_rps", b->throughput_rps);
    fb_result_metric(r, "p99_queue_us", b->stats.queue_time.p99_us);
    /* Closed loop: time per request that is not the model (batcher work,
     * waking the clients). Open loop: the executor idles by design. */
    if (c->load == FP_BATCHER_LOAD_CLOSED) {
        fb_result_metric(r, "sched_overhead_us", b->sched_overhead_us);
        fb_result_metric(r, "model_us_per_request", b->model_us_per_request);
    }
    fb_result_metric(r, "us_per_request", b->per_request_us);
    fb_result_metric(r, "throughput_speedup", rep->speedup);
    fb_result_metric(r, "baseline_rps", a->throughput_rps);
    fb_result_metric(r, "mean_batch", b->stats.mean_batch_size);
    fb_result_metric(r, "e2e_p50_us", b->stats.end_to_end.p50_us);
    fb_result_metric(r, "e2e_p99_us", b->stats.end_to_end.p99_us);
    fb_result_metric(r, "baseline_e2e_p99_us", a->stats.end_to_end.p99_us);
    fb_result_metric(r, "batch_exec_p99_us", b->stats.executor.p99_us);
    /* Target: p99 queue time <= max delay + one batch execution. */
    fb_result_metric(r, "queue_bound_us",
                     (double)c->batcher.max_queue_delay_us + b->stats.executor.p99_us);
    fb_result_metric(r, "padding_waste", b->stats.padding_waste);
    if (st == FP_ERR_MISMATCH) fb_result_fail(r, st, fp_last_error());
    else
        fb_result_note(r, "%.1fx req/s, batch %.1f, q99 %.0f us", rep->speedup,
                       b->stats.mean_batch_size, b->stats.queue_time.p99_us);
}

static fp_status run_closed_loop(fb_run *run) {
    static const int counts[] = {1, 8, 64, 256};
    int one = fb_opt_given(run, "clients");
    for (int i = 0; i < 4; ++i) {
        fp_batcher_bench_config c;
        bench_defaults(run, &c);
        c.load = FP_BATCHER_LOAD_CLOSED;
        c.clients = one ? (int)fb_opt_int(run, "clients", 64) : counts[i];
        fp_batcher_bench_report rep;
        memset(&rep, 0, sizeof rep);
        fp_status st = fp_batcher_bench(&c, &rep);
        report_row(run, &c, &rep, st, "cpu");
        if (one) break;
    }
    return FP_OK;
}

static fp_status run_open_loop(fb_run *run) {
    fp_batcher_bench_config c;
    bench_defaults(run, &c);
    c.load = FP_BATCHER_LOAD_OPEN;
    c.rate_rps = fb_opt_double(run, "rate", 30000);
    fp_batcher_bench_report rep;
    memset(&rep, 0, sizeof rep);
    fp_status st = fp_batcher_bench(&c, &rep);
    report_row(run, &c, &rep, st, "cpu");
    return FP_OK;
}

/* ---- batcher/overhead: a no-op model ---- */

static fp_status noop_exec(void *user, fp_batch_item *items, int count, int padded) {
    (void)user, (void)padded;
    for (int i = 0; i < count; ++i) {
        const float *in = items[i].input;
        float *out = items[i].output;
        for (size_t j = 0; j < items[i].output_size / sizeof(float); ++j)
            out[j] = 2.0f * in[j] + 1.0f;
    }
    return FP_OK;
}

typedef struct ff_state {
    fp_batcher *b;
    int per_thread;
    float in, out;
    atomic_int done;
} ff_state;

static void ff_done(fp_batch_request *req, fp_status st, void *user) {
    (void)req, (void)st;
    atomic_fetch_add_explicit(&((ff_state *)user)->done, 1, memory_order_relaxed);
}

static void *ff_producer(void *arg) {
    ff_state *s = arg;
    fp_batch_submit_info info;
    fp_batch_submit_info_default(&info);
    info.input = &s->in; /* outputs are not checked here: one shared slot */
    info.input_size = 0;
    info.output = &s->out;
    info.output_size = 0;
    info.on_done = ff_done;
    info.on_done_user = s;
    for (int i = 0; i < s->per_thread; ++i)
        if (fp_batcher_submit(s->b, &info, NULL) != FP_OK) break;
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Fire-and-forget from `threads` producers: wall time per request. */
static fp_status fire_and_forget(int threads, int per_thread, const fp_batcher_config *cfg,
                                 double *us_per_req, double *mean_batch) {
    ff_state s;
    memset(&s, 0, sizeof s);
    s.per_thread = per_thread;
    atomic_init(&s.done, 0);
    fp_status st = fp_batcher_create(cfg, noop_exec, NULL, &s.b);
    if (st != FP_OK) return st;
    pthread_t th[64];
    if (threads > 64) threads = 64;
    double t0 = now_s();
    int started = 0;
    for (int t = 0; t < threads; ++t)
        if (pthread_create(&th[t], NULL, ff_producer, &s) == 0) started++;
    for (int t = 0; t < started; ++t) pthread_join(th[t], NULL);
    st = fp_batcher_shutdown(s.b, FP_BATCHER_SHUTDOWN_DRAIN);
    double wall = now_s() - t0;
    fp_batcher_stats stats;
    fp_batcher_stats_init(&stats);
    if (st == FP_OK) st = fp_batcher_get_stats(s.b, &stats);
    fp_batcher_destroy(s.b);
    int n = atomic_load(&s.done);
    *us_per_req = n > 0 ? wall * 1e6 / n : 0;
    *mean_batch = stats.mean_batch_size;
    return st;
}

static fp_status run_overhead(fb_run *run) {
    fp_batcher_bench_config c;
    bench_defaults(run, &c);
    c.clients = (int)fb_opt_int(run, "clients", 64);
    c.model.fixed_us = 0;
    c.model.item_us = 0;
    c.executor = noop_exec;
    fp_batcher_bench_report rep;
    memset(&rep, 0, sizeof rep);
    fp_status st = fp_batcher_bench(&c, &rep);
    report_row(run, &c, &rep, st, "no-op");

    double ff_us = 0, ff_batch = 0;
    int per_thread = fb_quick(run) ? 500 : 4000;
    st = fire_and_forget(64, per_thread, &c.batcher, &ff_us, &ff_batch);
    fb_result *r = fb_result_new(run);
    fb_param_str(r, "load", "fire-and-forget");
    fb_param_int(r, "producers", 64);
    fb_param_int(r, "requests", 64 * per_thread);
    if (st != FP_OK) {
        fb_result_fail(r, st, fp_last_error());
        return FP_OK;
    }
    fb_result_metric(r, "sched_overhead_us", ff_us);
    fb_result_metric(r, "mean_batch", ff_batch);
    fb_result_note(r, "%.2f us/request of batcher work (2 cores: wall / requests)", ff_us);
    return FP_OK;
}

FB_SCENARIO(fb_batcher_closed_loop, "batcher/closed_loop",
            "dynamic batching vs batch 1, K clients submit-wait-repeat (1, 8, 64, 256)",
            run_closed_loop)
FB_SCENARIO(fb_batcher_open_loop, "batcher/open_loop",
            "dynamic batching vs batch 1, Poisson arrivals at --rate req/s", run_open_loop)
FB_SCENARIO(fb_batcher_overhead, "batcher/overhead",
            "batcher cost per request with a no-op model (closed loop and fire-and-forget)",
            run_overhead)
