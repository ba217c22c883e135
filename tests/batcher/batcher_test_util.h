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

/* Submits payload p (id must be < LOG_MAX) with the log as callback. */
static inline fp_status submit_p(fp_batcher *b, payload *p, int priority, int64_t timeout_us,
                                 done_log *l, fp_batch_request **out) {
    fp_batch_submit_info info;
    fp_batch_submit_info_default(&info);
    info.input = p;
    info.input_size = sizeof *p;
    info.output = &p->out;
    info.output_size = sizeof p->out;
    info.user = p;
    info.priority = priority;
    info.timeout_us = timeout_us;
    if (l) {
        info.on_done = log_done;
        info.on_done_user = l;
    }
    return fp_batcher_submit(b, &info, out);
}

static inline void payloads_init(payload *p, int n) {
    for (int i = 0; i < n; ++i) {
        memset(&p[i], 0, sizeof p[i]);
        p[i].id = i;
        p[i].in = 0.25f + (float)i;
        p[i].out = -12345.0f; /* poison */
    }
}

#endif /* BATCHER_TEST_UTIL_H */
