/* The batcher called back into from its own callbacks and around them:
 * - a callback releasing its request (with or without a handle) frees
 *   nothing the batcher still writes (run under ASan: test_batcher_reentry_asan);
 * - a callback waiting on its own request is refused instead of hanging;
 * - cancel with preserve_ordering of a request queued behind a running batch
 *   returns only once the request has completed (callback run), and from
 *   the batcher's own callback it is refused with nothing changed;
 * - cancel runs no other request's callback on the cancelling thread;
 * - fp_batcher_destroy from a callback is refused with a status and the
 *   batcher keeps working: nothing is lost;
 * - a timeout callback that blocks does not hold up other expiries.
 * Every wait for the batcher is a polled condition with a 10 s cap, never a
 * sleep that decides pass or fail. */
#include "batcher_test_util.h"

static int status_of(fp_batch_request *req, fp_status *st) {
    return fp_batch_request_wait(req, 10 * 1000000LL, st) == FP_OK;
}

/* Polls (1 ms) until *v >= n or 10 s pass; returns 1 if reached. */
static int wait_atomic(atomic_int *v, int n) {
    double end = now_s() + 10;
    while (atomic_load(v) < n && now_s() < end) sleep_ms(1);
    return atomic_load(v) >= n;
}

/* Polls (1 ms) until the int64_t stats field at offset `off` is >= n or
 * 10 s pass; returns 1 if reached. */
static int wait_stat(fp_batcher *b, size_t off, int64_t n) {
    double end = now_s() + 10;
    for (;;) {
        fp_batcher_stats st;
        int64_t v = -1;
        if (stats_get(b, &st) == FP_OK) memcpy(&v, (const char *)&st + off, sizeof v);
        if (v >= n) return 1;
        if (now_s() > end) return 0;
        sleep_ms(1);
    }
}
#define WAIT_STAT(b, field, n) wait_stat(b, offsetof(fp_batcher_stats, field), n)

/* Opens the executor's gate once the batcher has counted a cancel (so the
 * main thread is inside fp_batch_request_cancel, or back from it). */
typedef struct gate_arg {
    fp_batcher *b;
    recorder *rec;
    int opened;
    pthread_t thread;
} gate_arg;

static void *gate_main(void *arg) {
    gate_arg *g = arg;
    g->opened = WAIT_STAT(g->b, cancelled, 1);
    rec_set_hold(g->rec, 0);
    return NULL;
}

static void open_gate_after_cancel(gate_arg *g, fp_batcher *b, recorder *rec) {
    g->b = b;
    g->rec = rec;
    g->opened = 0;
    CHECK(pthread_create(&g->thread, NULL, gate_main, g) == 0);
}

/* ---- 1. release from the callback ---- */

static void release_done(fp_batch_request *req, fp_status st, void *user) {
    (void)st;
    fp_batch_request_release(req);
    atomic_fetch_add((atomic_int *)user, 1);
}

/* Requests with and without a handle whose callback releases them, through
 * every delivery path (executor, timeout, cancel). Without a handle the
 * release is a no-op; with one it gives the handle back (the submitter then
 * does not). */
static void test_release_in_callback(void) {
    for (int ordered = 0; ordered < 2; ++ordered) {
        recorder rec;
        fp_batcher_config c = base_config(4, 0);
        c.preserve_ordering = ordered;
        fp_batcher *b;
        payload p[12];
        atomic_int calls;
        atomic_init(&calls, 0);
        CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 12, NULL));
        fp_batch_request *h[12] = {NULL};
        rec_set_hold(&rec, 1);
        for (int i = 0; i < 12; ++i) {
            int64_t timeout_us = i >= 4 && i < 6 ? 1000 : 0; /* time out while held */
            /* with a handle: 6 (cancelled) and 7 (executed) */
            CHECK_OK(submit_cb(b, &p[i], -1, timeout_us, release_done, &calls,
                               i == 6 || i == 7 ? &h[i] : NULL));
            if (i == 0) CHECK(rec_wait_started(&rec, 1));
        }
        CHECK(WAIT_STAT(b, timed_out, 2));
        if (!ordered) CHECK(wait_atomic(&calls, 2)); /* the two timeouts */
        gate_arg g;
        open_gate_after_cancel(&g, b, &rec); /* ordered: cancel waits for 0..5 */
        CHECK_OK(fp_batch_request_cancel(h[6]));
        pthread_join(g.thread, NULL);
        CHECK(g.opened);
        CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
        CHECK_MSG(atomic_load(&calls) == 12, "%d callbacks", atomic_load(&calls));
        rec_batcher_destroy(b, &rec);
    }
}

/* A callback waiting on its own request (it completes when the callback
 * returns) is refused at once instead of hanging or timing out. */
static void self_wait_done(fp_batch_request *req, fp_status st, void *user) {
    (void)st;
    fp_status *out = user;
    out[0] = fp_batch_request_wait(req, 200 * 1000, NULL);
    out[1] = strstr(fp_last_error(), "callback") != NULL ? FP_OK : FP_ERR_MISMATCH;
}

static void test_wait_in_own_callback(void) {
    recorder rec;
    fp_batcher_config c = base_config(4, 0);
    fp_batcher *b;
    payload p[1];
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 1, NULL));
    fp_status got[2] = {FP_ERR_INTERNAL, FP_ERR_INTERNAL};
    CHECK_OK(submit_cb(b, &p[0], -1, 0, self_wait_done, got, NULL));
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK_STATUS(got[0], FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(got[1], FP_OK);
    rec_batcher_destroy(b, &rec);
}

/* ---- 2. cancel with preserve_ordering ---- */

static void test_cancel_ordered_behind_running(void) {
    recorder rec;
    fp_batcher_config c = base_config(4, 0);
    c.preserve_ordering = 1;
    fp_batcher *b;
    payload p[3];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 3, &lg));
    fp_batch_request *r[3];
    CHECK(hold_first_batch(b, &rec, p, -1, &lg, &r[0]));
    CHECK_OK(submit_range(b, p, 1, 3, -1, &lg, r));
    gate_arg g;
    open_gate_after_cancel(&g, b, &rec);
    CHECK_OK(fp_batch_request_cancel(r[2]));
    /* The promise: completed, callback run, before cancel returned. */
    CHECK_MSG(fp_batch_request_done(r[2]) == 1, "cancel returned FP_OK, request not done");
    pthread_mutex_lock(&lg.mu);
    int calls2 = lg.calls[2], n = lg.n;
    pthread_mutex_unlock(&lg.mu);
    CHECK(calls2 == 1 && lg.status[2] == FP_ERR_CANCELLED);
    CHECK(n == 3 && lg.order[0] == 0 && lg.order[1] == 1 && lg.order[2] == 2);
    pthread_join(g.thread, NULL);
    CHECK(g.opened);
    for (int i = 0; i < 3; ++i) fp_batch_request_release(r[i]);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK(p[2].out == -12345.0f);
    rec_batcher_destroy(b, &rec);
}

/* From the batcher's own callback, with ordering, cancel cannot wait (the
 * request is delivered after this callback, by this thread): refused, the
 * request untouched. */
typedef struct inner_cancel {
    fp_batch_request *target;
    fp_status rc;
    int named;
    atomic_int ran;
} inner_cancel;

static void cancel_other_done(fp_batch_request *req, fp_status st, void *user) {
    (void)req, (void)st;
    inner_cancel *ic = user;
    ic->rc = fp_batch_request_cancel(ic->target);
    ic->named = strstr(fp_last_error(), "preserve_ordering") != NULL;
    atomic_store(&ic->ran, 1);
}

static void test_cancel_ordered_from_callback(void) {
    recorder rec;
    fp_batcher_config c = base_config(2, 60 * 1000000LL); /* p2 alone never dispatches */
    c.preserve_ordering = 1;
    fp_batcher *b;
    payload p[3];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 3, &lg));
    inner_cancel ic = {NULL, FP_OK, 0, 0};
    rec_set_hold(&rec, 1);
    CHECK_OK(submit_cb(b, &p[0], -1, 0, cancel_other_done, &ic, NULL));
    CHECK_OK(submit_p(b, &p[1], -1, 0, &lg, NULL)); /* a full batch: p0, p1 */
    CHECK(rec_wait_started(&rec, 1));
    CHECK_OK(submit_p(b, &p[2], -1, 0, &lg, &ic.target)); /* queued behind them */
    rec_set_hold(&rec, 0);
    CHECK(wait_atomic(&ic.ran, 1));
    CHECK_STATUS(ic.rc, FP_ERR_INVALID_ARGUMENT);
    CHECK(ic.named);
    CHECK(fp_batch_request_done(ic.target) == 0); /* untouched: still queued */
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN)); /* runs it */
    fp_status st;
    CHECK(status_of(ic.target, &st));
    CHECK_STATUS(st, FP_OK);
    fp_batch_request_release(ic.target);
    CHECK(lg.calls[1] == 1 && lg.calls[2] == 1);
    rec_batcher_destroy(b, &rec);
}

/* ---- 4. work on the cancelling thread ---- */

static pthread_t g_main_thread;
static atomic_int g_on_main; /* callbacks of other requests run on main */

static void thread_done(fp_batch_request *req, fp_status st, void *user) {
    payload *p = fp_batch_request_user(req);
    if (p->id != 3 && pthread_equal(pthread_self(), g_main_thread)) atomic_fetch_add(&g_on_main, 1);
    log_done(req, st, user);
}

/* With ordering, p3 (low priority, alone, waiting for a 60 s delay) holds
 * back p4..p6, already executed. Cancelling p3 must not make the cancelling
 * thread deliver p4..p6's callbacks. */
static void test_cancel_runs_no_other_callback(void) {
    recorder rec;
    fp_batcher_config c = base_config(3, 60 * 1000000LL); /* full batches only */
    c.preserve_ordering = 1;
    c.priority_levels = 2;
    fp_batcher *b;
    payload p[7];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 7, &lg));
    g_main_thread = pthread_self();
    atomic_store(&g_on_main, 0);
    fp_batch_request *r3 = NULL;
    rec_set_hold(&rec, 1);
    for (int i = 0; i < 7; ++i) {
        CHECK_OK(submit_cb(b, &p[i], i == 3 ? 1 : 0, 0, thread_done, &lg, i == 3 ? &r3 : NULL));
        if (i == 2) CHECK(rec_wait_started(&rec, 1)); /* p0..p2 held */
    }
    rec_set_hold(&rec, 0); /* then p4..p6 run, level 0 first; p3 stays */
    CHECK(WAIT_STAT(b, completed_ok, 6));
    CHECK(log_wait_count(&lg, 3, now_s() + 10) == 3);
    CHECK(log_count(&lg) == 3); /* p4..p6 wait behind p3 */
    CHECK_OK(fp_batch_request_cancel(r3));
    CHECK(fp_batch_request_done(r3) == 1);
    CHECK(log_wait_count(&lg, 7, now_s() + 10) == 7);
    CHECK_MSG(atomic_load(&g_on_main) == 0, "%d other callbacks ran on the cancelling thread",
              atomic_load(&g_on_main));
    for (int i = 0; i < 7; ++i) CHECK(lg.order[i] == i && lg.calls[i] == 1);
    CHECK(lg.status[3] == FP_ERR_CANCELLED);
    fp_batch_request_release(r3);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    rec_batcher_destroy(b, &rec);
}

/* ---- 3. destroy from a callback ---- */

typedef struct destroy_ctx {
    fp_batcher *b;
    fp_status rc;
    int named;
    fp_status submit_rc; /* the batcher still accepts work afterwards */
    payload *next;
    done_log *lg;
    atomic_int ran;
} destroy_ctx;

static void destroy_done(fp_batch_request *req, fp_status st, void *user) {
    destroy_ctx *d = user;
    fp_clear_error();
    d->rc = fp_batcher_destroy(d->b);
    d->named = strstr(fp_last_error(), "fp_batcher_destroy") != NULL;
    d->submit_rc = submit_p(d->b, d->next, -1, 0, d->lg, NULL);
    log_done(req, st, d->lg);
    atomic_store(&d->ran, 1);
}

static void test_destroy_from_callback(void) {
    recorder rec;
    fp_batcher_config c = base_config(4, 0);
    fp_batcher *b;
    payload p[2];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 2, &lg));
    destroy_ctx d = {b, FP_OK, 0, FP_ERR_INTERNAL, &p[1], &lg, 0};
    CHECK_OK(submit_cb(b, &p[0], -1, 0, destroy_done, &d, NULL));
    CHECK(wait_atomic(&d.ran, 1));
    CHECK_STATUS(d.rc, FP_ERR_INVALID_ARGUMENT);
    CHECK(d.named);
    CHECK_OK(d.submit_rc);
    CHECK(log_wait_count(&lg, 2, now_s() + 10) == 2); /* the one submitted after runs */
    CHECK(lg.calls[0] == 1 && lg.calls[1] == 1 && lg.status[1] == FP_OK);
    CHECK_OK(fp_batcher_destroy(b));
    CHECK_OK(fp_batcher_destroy(NULL));
    rec_free(&rec);
}

/* ---- 4. a blocking timeout callback ---- */

typedef struct slow_ctx {
    pthread_mutex_t mu;
    int open;
    atomic_int entered, returned;
    done_log *lg;
} slow_ctx;

static void slow_done(fp_batch_request *req, fp_status st, void *user) {
    slow_ctx *s = user;
    atomic_fetch_add(&s->entered, 1);
    pthread_mutex_lock(&s->mu);
    double end = now_s() + 30; /* beyond the test's 10 s waits: a cap, not a pass */
    while (!s->open && now_s() < end) {
        pthread_mutex_unlock(&s->mu);
        sleep_ms(1);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    log_done(req, st, s->lg);
    atomic_store(&s->returned, 1);
}

/* The executor is held; request 1 times out first and its callback blocks
 * until the test opens it. Request 2 and 3 time out later: they must expire
 * (leave the queue, be counted) while that callback is still blocked, and
 * run nowhere even when the executor is freed before the callback ends. */
static void test_slow_timeout_callback(void) {
    recorder rec;
    fp_batcher_config c = base_config(4, 0);
    fp_batcher *b;
    payload p[4];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 4, &lg));
    slow_ctx s;
    pthread_mutex_init(&s.mu, NULL);
    s.open = 0;
    atomic_init(&s.entered, 0);
    atomic_init(&s.returned, 0);
    s.lg = &lg;
    CHECK(hold_first_batch(b, &rec, p, -1, &lg, NULL));
    CHECK_OK(submit_cb(b, &p[1], -1, 20 * 1000, slow_done, &s, NULL));
    CHECK_OK(submit_p(b, &p[2], -1, 60 * 1000, &lg, NULL));
    CHECK_OK(submit_p(b, &p[3], -1, 80 * 1000, &lg, NULL));
    CHECK(wait_atomic(&s.entered, 1));
    CHECK_MSG(WAIT_STAT(b, timed_out, 3), "later timeouts held up by a blocked callback");
    fp_batcher_stats st;
    CHECK_OK(stats_get(b, &st));
    CHECK(st.queued == 0);
    CHECK(atomic_load(&s.returned) == 0); /* all that while the callback was blocked */
    rec_set_hold(&rec, 0); /* the executor is free: nothing timed out may run */
    CHECK(WAIT_STAT(b, completed_ok, 1));
    pthread_mutex_lock(&s.mu);
    s.open = 1;
    pthread_mutex_unlock(&s.mu);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    for (int i = 1; i < 4; ++i)
        CHECK_MSG(lg.calls[i] == 1 && lg.status[i] == FP_ERR_TIMEOUT, "id %d: %d calls, %s", i,
                  lg.calls[i], fp_status_string(lg.status[i]));
    for (int i = 1; i < 4; ++i) CHECK(p[i].out == -12345.0f); /* never executed */
    CHECK(rec.nbatch == 1);
    rec_batcher_destroy(b, &rec);
    pthread_mutex_destroy(&s.mu);
}

/* Usage: test_batcher_reentry [test name]: all tests, or the one named. */
int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"release_in_callback", test_release_in_callback},
        {"wait_in_own_callback", test_wait_in_own_callback},
        {"cancel_ordered_behind_running", test_cancel_ordered_behind_running},
        {"cancel_ordered_from_callback", test_cancel_ordered_from_callback},
        {"cancel_runs_no_other_callback", test_cancel_runs_no_other_callback},
        {"destroy_from_callback", test_destroy_from_callback},
        {"slow_timeout_callback", test_slow_timeout_callback},
    };
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; ++i)
        if (argc < 2 || strcmp(argv[1], tests[i].name) == 0) tests[i].fn();
    TEST_END();
}
