/* Helpers for the batcher tests: a recording executor that can be held at a
 * gate (so the test decides what is queued while a batch runs), request
 * payloads whose output is checkable, and a completion log. Timing asserts
 * use generous margins: the CI machine has two loaded cores. */
#ifndef BATCHER_TEST_UTIL_H
#define BATCHER_TEST_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "fastpath/batcher.h"
#include "fp_test.h"

#define REC_MAX_BATCHES 256
#define REC_MAX_ITEMS 64

typedef struct payload {
    int id;
    float in;
    float out;
    int exec_ms;        /* executor sleeps this long for this request */
    fp_status fail;     /* executor sets this status for this request */
} payload;

typedef struct recorder {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int hold;                       /* batches wait at the gate while set */
    int started;                    /* batches entered */
    int finished;                   /* batches left */
    int nbatch;
    int count[REC_MAX_BATCHES];
    int padded[REC_MAX_BATCHES];
    int ids[REC_MAX_BATCHES][REC_MAX_ITEMS];
    double t_start[REC_MAX_BATCHES];
    fp_status batch_rc;             /* returned by the executor */
} recorder;

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_ms(double ms) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static inline void rec_init(recorder *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
}

static inline void rec_free(recorder *r) {
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
}

static inline void rec_set_hold(recorder *r, int hold) {
    pthread_mutex_lock(&r->mu);
    r->hold = hold;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Waits (up to 10 s) until `n` batches have entered the executor. */
static inline int rec_wait_started(recorder *r, int n) {
    double end = now_s() + 10;
    pthread_mutex_lock(&r->mu);
    while (r->started < n && now_s() < end) {
        pthread_mutex_unlock(&r->mu);
        sleep_ms(1);
        pthread_mutex_lock(&r->mu);
    }
    int ok = r->started >= n;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* Executor: records the batch, waits at the gate, then computes
 * out = 2 * in + 1 for each request (after its exec_ms), applying `fail`. */
static inline fp_status rec_exec(void *user, fp_batch_item *items, int count, int padded) {
    recorder *r = user;
    pthread_mutex_lock(&r->mu);
    int b = r->nbatch < REC_MAX_BATCHES ? r->nbatch++ : REC_MAX_BATCHES - 1;
    r->count[b] = count;
    r->padded[b] = padded;
    r->t_start[b] = now_s();
    for (int i = 0; i < count && i < REC_MAX_ITEMS; ++i)
        r->ids[b][i] = ((payload *)items[i].input)->id;
    r->started++;
    while (r->hold) pthread_cond_wait(&r->cv, &r->mu);
    fp_status rc = r->batch_rc;
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < count; ++i) {
        payload *p = (payload *)items[i].input;
        if (p->exec_ms > 0) sleep_ms(p->exec_ms);
        if (p->fail != FP_OK) items[i].status = p->fail;
        *(float *)items[i].output = 2.0f * p->in + 1.0f;
    }
    pthread_mutex_lock(&r->mu);
    r->finished++;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* Completion log: order of callbacks and how often each id completed. */
#define LOG_MAX 4096
typedef struct done_log {
    pthread_mutex_t mu;
    int n;
    int order[LOG_MAX];
    fp_status status[LOG_MAX];  /* by id */
    int calls[LOG_MAX];         /* by id */
    double t_done[LOG_MAX];     /* by id */
} done_log;

static inline void log_init(done_log *l) {
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
}

static inline void log_done(fp_batch_request *req, fp_status st, void *user) {
    done_log *l = user;
    payload *p = fp_batch_request_user(req);
    pthread_mutex_lock(&l->mu);
    if (l->n < LOG_MAX) l->order[l->n++] = p->id;
    l->status[p->id] = st;
    l->calls[p->id]++;
    l->t_done[p->id] = now_s();
    pthread_mutex_unlock(&l->mu);
}

/* Fills `info` (after defaulting it) to run payload p: its input, its output
 * slot and p itself as the request's user pointer. */
static inline void payload_submit_info(fp_batch_submit_info *info, payload *p) {
    fp_batch_submit_info_default(info);
    info->input = p;
    info->input_size = sizeof *p;
    info->output = &p->out;
    info->output_size = sizeof p->out;
    info->user = p;
}

/* Submits payload p with callback on_done(on_done_user) (none if NULL). */
static inline fp_status submit_cb(fp_batcher *b, payload *p, int priority, int64_t timeout_us,
                                  fp_batch_done_fn on_done, void *on_done_user,
                                  fp_batch_request **out) {
    fp_batch_submit_info info;
    payload_submit_info(&info, p);
    info.priority = priority;
    info.timeout_us = timeout_us;
    info.on_done = on_done;
    info.on_done_user = on_done_user;
    return fp_batcher_submit(b, &info, out);
}

/* Submits payload p (id must be < LOG_MAX) with the log as callback. */
static inline fp_status submit_p(fp_batcher *b, payload *p, int priority, int64_t timeout_us,
                                 done_log *l, fp_batch_request **out) {
    return submit_cb(b, p, priority, timeout_us, l ? log_done : NULL, l, out);
}

/* Submits p[from] .. p[to - 1] at one priority (no timeout); with `out`, the
 * handle of p[i] goes to out[i]. Returns the first failure, else FP_OK. */
static inline fp_status submit_range(fp_batcher *b, payload *p, int from, int to, int priority,
                                     done_log *l, fp_batch_request **out) {
    fp_status rc = FP_OK;
    for (int i = from; i < to; ++i) {
        fp_status s = submit_p(b, &p[i], priority, 0, l, out ? &out[i] : NULL);
        if (rc == FP_OK) rc = s;
    }
    return rc;
}

/* Number of completions logged so far. */
static inline int log_count(done_log *l) {
    pthread_mutex_lock(&l->mu);
    int n = l->n;
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* Polls (every 2 ms) until `n` completions are logged or the clock passes
 * `end` (now_s() seconds); returns the count then. */
static inline int log_wait_count(done_log *l, int n, double end) {
    for (;;) {
        int done = log_count(l);
        if (done >= n || now_s() > end) return done;
        sleep_ms(2);
    }
}

static inline void payloads_init(payload *p, int n) {
    for (int i = 0; i < n; ++i) {
        memset(&p[i], 0, sizeof p[i]);
        p[i].id = i;
        p[i].in = 0.25f + (float)i;
        p[i].out = -12345.0f; /* poison */
    }
}

/* A batcher config: batches of up to max_batch, queue delay delay_us, the
 * rest default. */
static inline fp_batcher_config base_config(int max_batch, int64_t delay_us) {
    fp_batcher_config c;
    fp_batcher_config_default(&c);
    c.max_batch_size = max_batch;
    c.max_queue_delay_us = delay_us;
    return c;
}

/* The common fixture: initialises the recorder `rec`, creates *b over the
 * recording executor with config c, poisons n payloads and (when lg is
 * given) clears the completion log. Returns the create status. */
static inline fp_status rec_batcher_create(const fp_batcher_config *c, recorder *rec,
                                           fp_batcher **b, payload *p, int n, done_log *lg) {
    rec_init(rec);
    payloads_init(p, n);
    if (lg) log_init(lg);
    return fp_batcher_create(c, rec_exec, rec, b);
}

/* Closes the gate, submits p[0] at `priority` (handle to *out if given) and
 * waits until its batch is held in the executor, so what is submitted next
 * queues behind it. Returns 1 when both happened. */
static inline int hold_first_batch(fp_batcher *b, recorder *rec, payload *p, int priority,
                                   done_log *l, fp_batch_request **out) {
    rec_set_hold(rec, 1);
    fp_status rc = submit_p(b, &p[0], priority, 0, l, out);
    return rc == FP_OK && rec_wait_started(rec, 1);
}

/* Initialises *st and fills it with b's statistics. */
static inline fp_status stats_get(fp_batcher *b, fp_batcher_stats *st) {
    fp_batcher_stats_init(st);
    return fp_batcher_get_stats(b, st);
}

/* Destroys b and frees its recorder. */
static inline void rec_batcher_destroy(fp_batcher *b, recorder *rec) {
    CHECK_OK(fp_batcher_destroy(b));
    rec_free(rec);
}

#endif /* BATCHER_TEST_UTIL_H */
