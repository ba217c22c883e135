/* fastbench scenarios of the dynamic batcher (fp_batcher_bench):
 *
 *   batcher/closed_loop  K client threads (1, 8, 64, 256; --clients N for
 *                        one) submit, wait, repeat: batch 1 vs dynamic.
 *   batcher/open_loop    Poisson arrivals at --rate (default 30000 req/s).
 *   batcher/overhead     a no-op model: what the batcher itself costs per
 *                        request, closed loop at 64 clients and
 *                        fire-and-forget from 64 threads; beside them the
 *                        floor of a closed loop on this host (the same
 *                        clients blocking on a bare hand-off server, no
 *                        batcher) and how late the host's timers wake.
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
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

/* ---- the floor of a closed loop on this host ----
 *
 * The same K blocking clients with no batcher: each client queues its id
 * under one mutex, signals the server and sleeps on one shared futex word (a
 * round counter); the server takes everything queued, marks those clients
 * served and wakes all sleepers with one call (clients queued after it took
 * the round go back to sleep). Every closed-loop request pays at least this
 * (a futex sleep, a wake-up, two context switches); on a host with fewer
 * cores than clients it is most of the per-request time. */

typedef struct floor_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *queue, queued, clients;
    atomic_int *served;
    atomic_uint round;
    atomic_int stop;
} floor_state;

typedef struct floor_client {
    floor_state *s;
    int id;
} floor_client;

static void floor_futex_wait(atomic_uint *w, unsigned v) {
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void floor_futex_wake(atomic_uint *w) {
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void *floor_client_main(void *arg) {
    floor_client *c = arg;
    floor_state *s = c->s;
    atomic_int *served = &s->served[c->id];
    while (!atomic_load(&s->stop)) {
        atomic_store(served, 0);
        pthread_mutex_lock(&s->mu);
        s->queue[s->queued++] = c->id;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        for (;;) {
            unsigned r = atomic_load(&s->round);
            if (atomic_load(served)) break;
            floor_futex_wait(&s->round, r);
        }
    }
    return NULL;
}

/* Wall time per request of `requests` closed-loop round trips. */
static fp_status closed_loop_floor(int clients, int requests, double *us_per_req) {
    floor_state s;
    memset(&s, 0, sizeof s);
    s.clients = clients;
    s.queue = malloc((size_t)clients * sizeof *s.queue);
    s.served = malloc((size_t)clients * sizeof *s.served);
    floor_client *cl = malloc((size_t)clients * sizeof *cl);
    int *local = malloc((size_t)clients * sizeof *local);
    pthread_t *th = malloc((size_t)clients * sizeof *th);
    if (!s.queue || !s.served || !cl || !local || !th) {
        free(s.queue), free(s.served), free(cl), free(local), free(th);
        return FP_ERR_OUT_OF_MEMORY;
    }
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    atomic_init(&s.stop, 0);
    atomic_init(&s.round, 0);
    for (int i = 0; i < clients; ++i) atomic_init(&s.served[i], 0);
    int started = 0;
    for (; started < clients; ++started) {
        cl[started].s = &s;
        cl[started].id = started;
        if (pthread_create(&th[started], NULL, floor_client_main, &cl[started]) != 0) break;
    }
    double t0 = now_s(), t_warm = t0;
    int served = 0, warm = requests / 8;
    while (started > 0 && served < warm + requests) {
        pthread_mutex_lock(&s.mu);
        while (s.queued == 0) pthread_cond_wait(&s.cv, &s.mu);
        int n = s.queued;
        memcpy(local, s.queue, (size_t)n * sizeof *local);
        s.queued = 0;
        pthread_mutex_unlock(&s.mu);
        for (int i = 0; i < n; ++i) atomic_store(&s.served[local[i]], 1);
        atomic_fetch_add(&s.round, 1);
        floor_futex_wake(&s.round);
        if (served < warm && served + n >= warm) t_warm = now_s();
        served += n;
    }
    double wall = now_s() - t_warm;
    atomic_store(&s.stop, 1);
    for (int i = 0; i < started; ++i) atomic_store(&s.served[i], 1); /* asleep or about to queue */
    atomic_fetch_add(&s.round, 1);
    floor_futex_wake(&s.round);
    for (int i = 0; i < started; ++i) pthread_join(th[i], NULL);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    int counted = served - warm;
    *us_per_req = counted > 0 ? wall * 1e6 / counted : 0;
    free(s.queue), free(s.served), free(cl), free(local), free(th);
    return started == clients ? FP_OK : FP_ERR_INTERNAL;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* How late an absolute 200 us sleep wakes (1 us timer slack, as the
 * batcher's threads set): the part of a queue delay the host adds. */
static void timer_lateness(int n, double *p50_us, double *p99_us) {
    double *late = malloc((size_t)n * sizeof *late);
    *p50_us = *p99_us = 0;
    if (!late) return;
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    for (int i = 0; i < n; ++i) {
        double t = now_s() + 200e-6;
        struct timespec ts;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
        }
        late[i] = (now_s() - t) * 1e6;
    }
    qsort(late, (size_t)n, sizeof *late, cmp_dbl);
    *p50_us = late[n / 2];
    *p99_us = late[(n * 99) / 100];
    free(late);
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
    fb_result_note(r, "%.2f us/request of batcher work (wall / requests)", ff_us);

    double floor_us = 0;
    st = closed_loop_floor(c.clients, c.requests, &floor_us);
    r = fb_result_new(run);
    fb_param_str(r, "load", "closed-loop floor, no batcher");
    fb_param_int(r, "clients", c.clients);
    fb_param_int(r, "requests", c.requests);
    if (st != FP_OK) {
        fb_result_fail(r, st, "cannot start the floor's client threads");
        return FP_OK;
    }
    double batched_us = rep.batched.per_request_us;
    fb_result_metric(r, "floor_us_per_request", floor_us);
    fb_result_metric(r, "batcher_us_per_request", batched_us);
    fb_result_metric(r, "batcher_over_floor_us", batched_us - floor_us);
    fb_result_note(r, "bare hand-off %.2f us/request; the batcher's closed loop %+.2f us over it", floor_us,
                   batched_us - floor_us);

    double late50 = 0, late99 = 0;
    timer_lateness(fb_quick(run) ? 300 : 2000, &late50, &late99);
    r = fb_result_new(run);
    fb_param_str(r, "load", "host timer: absolute 200 us sleeps");
    fb_result_metric(r, "timer_late_p50_us", late50);
    fb_result_metric(r, "timer_late_p99_us", late99);
    fb_result_note(r, "wakes %.0f us late (p50), %.0f us (p99): added to queue delays at low load", late50,
                   late99);
    return FP_OK;
}

FB_SCENARIO(fb_batcher_closed_loop, "batcher/closed_loop",
            "dynamic batching vs batch 1, K clients submit-wait-repeat (1, 8, 64, 256)",
            run_closed_loop)
FB_SCENARIO(fb_batcher_open_loop, "batcher/open_loop",
            "dynamic batching vs batch 1, Poisson arrivals at --rate req/s", run_open_loop)
FB_SCENARIO(fb_batcher_overhead, "batcher/overhead",
            "batcher cost per request with a no-op model (closed loop, fire-and-forget), "
            "the host's closed-loop floor and timer lateness",
            run_overhead)
