/* Waiting on request handles: the futex wait and the grouped wake-up.
 *
 * - Many threads waiting on one request, on many requests of one batch
 *   (several wake groups: the deliverer wakes at most 32 sleepers per
 *   wake syscall), with and without timeouts, and with ordering: every
 *   waiter returns once its request has completed, with the right status
 *   and output; a timed wait that expires leaves nothing behind (the same
 *   thread waits again and is woken).
 * - A completed handle outlives its batcher (wait, done, cancel, user).
 * - Each waiting client is woken once: a client thread doing submit + wait
 *   sleeps about once per request (voluntary context switches of the
 *   thread, with a wide margin for lock contention on a loaded machine).
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <sys/resource.h>

#include "batcher_test_util.h"

#define BIG 80 /* requests in the big batch: several wake groups (32 each) */

typedef struct waiter {
    pthread_t thread;
    fp_batch_request *req;
    int64_t step_us;      /* < 0: wait forever; else poll with this timeout */
    fp_status wait_rc;    /* last fp_batch_request_wait return */
    fp_status result;
    atomic_int timeouts;  /* timed waits that expired first */
    atomic_int returned;
} waiter;

static void *waiter_main(void *arg) {
    waiter *w = arg;
    w->result = FP_ERR_INTERNAL;
    double end = now_s() + 20;
    for (;;) {
        w->wait_rc = fp_batch_request_wait(w->req, w->step_us, &w->result);
        if (w->wait_rc != FP_ERR_TIMEOUT || now_s() > end) break;
        atomic_fetch_add(&w->timeouts, 1);
    }
    atomic_store(&w->returned, 1);
    return NULL;
}

static void start_waiter(waiter *w, fp_batch_request *req, int64_t step_us) {
    memset(w, 0, sizeof *w);
    w->req = req;
    w->step_us = step_us;
    atomic_init(&w->returned, 0);
    atomic_init(&w->timeouts, 0);
    CHECK(pthread_create(&w->thread, NULL, waiter_main, w) == 0);
}

static int count_returned(waiter *w, int n) {
    int k = 0;
    for (int i = 0; i < n; ++i) k += atomic_load(&w[i].returned);
    return k;
}

/* One held request with 4 waiters (2 forever, 2 polling with short
 * timeouts), then a batch of BIG requests each with a waiter. */
static void run_waiters(int ordered) {
    recorder rec;
    fp_batcher_config c = base_config(128, 0);
    c.preserve_ordering = ordered;
    fp_batcher *b;
    static payload p[1 + BIG];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 1 + BIG, &lg));
    fp_batch_request *r[1 + BIG];
    static waiter w[4 + BIG];

    CHECK(hold_first_batch(b, &rec, p, -1, &lg, &r[0])); /* r[0] is held in the executor */
    for (int k = 0; k < 4; ++k) start_waiter(&w[k], r[0], k < 2 ? -1 : (k == 2 ? 300 : 2000));
    for (int i = 1; i <= BIG; ++i) {
        CHECK_OK(submit_p(b, &p[i], -1, 0, &lg, &r[i]));
        /* Half wait forever, half poll (a timed wait may expire after the
         * deliverer moved it to its wake group). */
        start_waiter(&w[3 + i], r[i], i % 2 ? -1 : 150 + 37 * (i % 5));
    }
    sleep_ms(30);
    CHECK_MSG(count_returned(w, 4 + BIG) == 0, "%d waiters returned while held",
              count_returned(w, 4 + BIG));
    CHECK(atomic_load(&w[2].timeouts) > 0 && atomic_load(&w[3].timeouts) > 0); /* polled */
    rec_set_hold(&rec, 0);
    for (int k = 0; k < 4 + BIG; ++k) CHECK(pthread_join(w[k].thread, NULL) == 0);
    for (int k = 0; k < 4 + BIG; ++k) {
        CHECK_MSG(w[k].wait_rc == FP_OK && w[k].result == FP_OK,
                  "waiter %d: wait %s, result %s", k, fp_status_string(w[k].wait_rc),
                  fp_status_string(w[k].result));
    }
    for (int i = 0; i <= BIG; ++i) {
        CHECK(fp_batch_request_done(r[i]) == 1);
        CHECK(lg.calls[i] == 1 && p[i].out == 2.0f * p[i].in + 1.0f);
    }
    CHECK(rec.nbatch == 2 && rec.count[0] == 1 && rec.count[1] == BIG);
    if (ordered)
        for (int i = 0; i <= BIG; ++i) CHECK(lg.order[i] == i);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    fp_batcher_destroy(b);

    /* Completed handles outlive the batcher. */
    fp_status st = FP_ERR_INTERNAL;
    CHECK_OK(fp_batch_request_wait(r[0], 0, &st));
    CHECK_STATUS(st, FP_OK);
    CHECK_OK(fp_batch_request_wait(r[BIG], -1, &st));
    CHECK(fp_batch_request_done(r[1]) == 1);
    CHECK_STATUS(fp_batch_request_cancel(r[1]), FP_ERR_NOT_FOUND);
    CHECK(fp_batch_request_user(r[2]) == &p[2]);
    for (int i = 0; i <= BIG; ++i) fp_batch_request_release(r[i]);
    rec_free(&rec);
}

static void test_waiters(void) {
    run_waiters(0);
    run_waiters(1);
}

/* A timed wait that expires while the request is queued, then a cancel: the
 * waiter that comes back finds it completed. */
static void test_wait_then_cancel(void) {
    recorder rec;
    fp_batcher_config c = base_config(4, 0);
    fp_batcher *b;
    payload p[2];
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 2, NULL));
    fp_batch_request *r[2];
    CHECK(hold_first_batch(b, &rec, p, -1, NULL, &r[0]));
    CHECK_OK(submit_p(b, &p[1], -1, 0, NULL, &r[1]));
    waiter w;
    start_waiter(&w, r[1], -1);
    fp_status st;
    CHECK_STATUS(fp_batch_request_wait(r[1], 5000, &st), FP_ERR_TIMEOUT);
    CHECK_OK(fp_batch_request_cancel(r[1]));
    CHECK(pthread_join(w.thread, NULL) == 0);
    CHECK(w.wait_rc == FP_OK && w.result == FP_ERR_CANCELLED);
    rec_set_hold(&rec, 0);
    CHECK(fp_batch_request_wait(r[0], 10 * 1000000LL, &st) == FP_OK && st == FP_OK);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    for (int i = 0; i < 2; ++i) fp_batch_request_release(r[i]);
    rec_batcher_destroy(b, &rec);
}

/* ---- woken once ---- */

#define CLIENTS 8
#ifdef FP_TSAN_BUILD
#define PER_CLIENT 60
#define MAX_SLEEPS 1.7 /* instrumented locks are held longer: more contention */
#else
#define PER_CLIENT 300
#define MAX_SLEEPS 1.5
#endif

static fp_status echo_exec(void *user, fp_batch_item *items, int count, int padded) {
    (void)user, (void)padded;
    for (int i = 0; i < count; ++i)
        *(float *)items[i].output = 2.0f * *(const float *)items[i].input + 1.0f;
    return FP_OK;
}

typedef struct client {
    pthread_t thread;
    fp_batcher *b;
    int bad;
    long nvcsw;     /* voluntary context switches of this thread */
} client;

static void *client_main(void *arg) {
    client *cl = arg;
    struct rusage u0, u1;
    getrusage(RUSAGE_THREAD, &u0);
    for (int i = 0; i < PER_CLIENT; ++i) {
        float in = 0.5f + (float)i, out = -1.0f;
        fp_batch_submit_info info;
        fp_batch_submit_info_default(&info);
        info.input = &in;
        info.input_size = sizeof in;
        info.output = &out;
        info.output_size = sizeof out;
        fp_batch_request *req;
        if (fp_batcher_submit(cl->b, &info, &req) != FP_OK) {
            cl->bad++;
            continue;
        }
        fp_status st = FP_ERR_INTERNAL;
        if (fp_batch_request_wait(req, -1, &st) != FP_OK || st != FP_OK ||
            out != 2.0f * in + 1.0f)
            cl->bad++;
        fp_batch_request_release(req);
    }
    getrusage(RUSAGE_THREAD, &u1);
    cl->nvcsw = u1.ru_nvcsw - u0.ru_nvcsw;
    return NULL;
}

static void test_woken_once(void) {
    for (int delay = 0; delay < 2; ++delay) {
        fp_batcher_config c = base_config(CLIENTS, delay ? 200 : 0);
        fp_batcher *b;
        CHECK_OK(fp_batcher_create(&c, echo_exec, NULL, &b));
        client cl[CLIENTS];
        memset(cl, 0, sizeof cl);
        for (int k = 0; k < CLIENTS; ++k) {
            cl[k].b = b;
            CHECK(pthread_create(&cl[k].thread, NULL, client_main, &cl[k]) == 0);
        }
        long total = 0, worst = 0;
        for (int k = 0; k < CLIENTS; ++k) {
            CHECK(pthread_join(cl[k].thread, NULL) == 0);
            CHECK(cl[k].bad == 0);
            total += cl[k].nvcsw;
            if (cl[k].nvcsw > worst) worst = cl[k].nvcsw;
        }
        /* One sleep per request at most, plus lock contention: a client
         * woken twice per request (a shared broadcast, a lost grouping)
         * would be at 2 or more. */
        double per_req = (double)total / (CLIENTS * PER_CLIENT);
        printf("woken once (delay %d us): %.2f voluntary switches per request, worst client %ld "
               "for %d requests\n", delay ? 200 : 0, per_req, worst, PER_CLIENT);
        CHECK_MSG(per_req <= MAX_SLEEPS, "%.2f voluntary context switches per request", per_req);
        CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
        fp_batcher_destroy(b);
    }
}

int main(void) {
    test_waiters();
    test_wait_then_cancel();
    test_woken_once();
    TEST_END();
}
