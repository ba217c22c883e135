/* Dynamic batcher: batch formation (max, preferred, delay), padding,
 * priorities, queue limits, timeouts during execution, cancel, shutdown
 * drain vs cancel, ordering, executor failures, statistics, bad input.
 * Batch composition is made deterministic by holding the executor at a gate
 * while the test queues requests; timing is asserted with wide margins. */
#include "batcher_test_util.h"

static int status_of(fp_batch_request *req, fp_status *st) {
    return fp_batch_request_wait(req, 10 * 1000000LL, st) == FP_OK;
}

/* ---------------------------------------------------------------------- */

static void test_bad_input(void) {
    recorder rec;
    rec_init(&rec);
    fp_batcher *b = (fp_batcher *)0x1;
    fp_batcher_config c = base_config(8, 100);

    CHECK_STATUS(fp_batcher_create(&c, NULL, NULL, &b), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "executor") != NULL);
    CHECK_STATUS(fp_batcher_create(&c, rec_exec, &rec, NULL), FP_ERR_INVALID_ARGUMENT);

#define BAD_CONFIG(field, stmt)                                                         \
    do {                                                                                \
        fp_batcher_config c2 = base_config(8, 100);                                     \
        stmt;                                                                           \
        CHECK_STATUS(fp_batcher_create(&c2, rec_exec, &rec, &b), FP_ERR_INVALID_ARGUMENT); \
        CHECK_MSG(strstr(fp_last_error(), field) != NULL, "detail '%s' lacks '%s'",      \
                  fp_last_error(), field);                                              \
    } while (0)
    BAD_CONFIG("max_batch_size", c2.max_batch_size = 0);
    BAD_CONFIG("max_batch_size", c2.max_batch_size = FP_BATCHER_MAX_BATCH + 1);
    BAD_CONFIG("max_queue_delay_us", c2.max_queue_delay_us = -1);
    BAD_CONFIG("preferred_batch_sizes", (c2.num_preferred_batch_sizes = 1,
                                         c2.preferred_batch_sizes[0] = 9));
    BAD_CONFIG("preferred_batch_sizes", (c2.num_preferred_batch_sizes = 2,
                                         c2.preferred_batch_sizes[0] = 4,
                                         c2.preferred_batch_sizes[1] = 2));
    BAD_CONFIG("allowed_batch_sizes", (c2.num_allowed_batch_sizes = 2,
                                       c2.allowed_batch_sizes[0] = 4,
                                       c2.allowed_batch_sizes[1] = 4));
    BAD_CONFIG("allowed_batch_sizes", (c2.num_allowed_batch_sizes = 1,
                                       c2.allowed_batch_sizes[0] = 0));
    BAD_CONFIG("num_allowed_batch_sizes", c2.num_allowed_batch_sizes = -1);
    BAD_CONFIG("preferred_batch_sizes", (c2.num_allowed_batch_sizes = 1,
                                         c2.allowed_batch_sizes[0] = 2,
                                         c2.num_preferred_batch_sizes = 1,
                                         c2.preferred_batch_sizes[0] = 4));
    BAD_CONFIG("priority_levels", c2.priority_levels = 0);
    BAD_CONFIG("default_priority", c2.default_priority = 1);
    BAD_CONFIG("max_queue_size", c2.queue_policy[0].max_queue_size = -1);
    BAD_CONFIG("default_timeout_us", c2.queue_policy[0].default_timeout_us = -5);
    BAD_CONFIG("timeout_action", c2.queue_policy[0].timeout_action = (fp_batcher_timeout_action)7);
    BAD_CONFIG("executor_threads", c2.executor_threads = 0);
    BAD_CONFIG("struct_size", c2.struct_size = 3);
    CHECK(b == (fp_batcher *)0x1); /* untouched on error */

    CHECK_OK(fp_batcher_create(&c, rec_exec, &rec, &b));
    payload p[4];
    payloads_init(p, 4);
    CHECK_STATUS(fp_batcher_submit(NULL, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_batcher_submit(b, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(submit_p(b, &p[0], 1, 0, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "priority") != NULL);
    CHECK_STATUS(submit_p(b, &p[0], -2, 0, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(submit_p(b, &p[0], 0, -1, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "timeout_us") != NULL);
    fp_batch_submit_info info;
    fp_batch_submit_info_default(&info);
    info.struct_size = 1;
    CHECK_STATUS(fp_batcher_submit(b, &info, NULL), FP_ERR_INVALID_ARGUMENT);

    CHECK_STATUS(fp_batch_request_wait(NULL, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_batch_request_cancel(NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK(fp_batch_request_done(NULL) == 0);
    CHECK(fp_batch_request_user(NULL) == NULL);
    fp_batch_request_release(NULL);
    CHECK_STATUS(fp_batcher_shutdown(NULL, FP_BATCHER_SHUTDOWN_DRAIN), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_batcher_shutdown(b, (fp_batcher_shutdown_mode)5), FP_ERR_INVALID_ARGUMENT);
    fp_batcher_stats st;
    memset(&st, 0, sizeof st);
    CHECK_STATUS(fp_batcher_get_stats(b, &st), FP_ERR_INVALID_ARGUMENT); /* struct_size 0 */
    CHECK_STATUS(fp_batcher_get_batch_histogram(b, NULL, 4), FP_ERR_INVALID_ARGUMENT);

    /* A request completes; then shutdown; then submit is refused. */
    fp_batch_request *req = NULL;
    CHECK_OK(submit_p(b, &p[1], -1, 0, NULL, &req));
    fp_status result = FP_ERR_INTERNAL;
    CHECK(status_of(req, &result));
    CHECK_STATUS(result, FP_OK);
    CHECK(p[1].out == 2.0f * p[1].in + 1.0f);
    CHECK(fp_batch_request_done(req) == 1);
    CHECK_STATUS(fp_batch_request_cancel(req), FP_ERR_NOT_FOUND);
    fp_batch_request_release(req);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_CANCEL)); /* second call: no-op */
    req = (fp_batch_request *)0x1;
    CHECK_STATUS(submit_p(b, &p[2], -1, 0, NULL, &req), FP_ERR_SHUT_DOWN);
    CHECK(req == (fp_batch_request *)0x1);
    fp_batcher_stats_init(&st);
    CHECK_OK(fp_batcher_get_stats(b, &st));
    CHECK(st.rejected_shut_down == 1);
    CHECK(st.submitted == 1 && st.completed_ok == 1);
    fp_batcher_destroy(b);
    fp_batcher_destroy(NULL);
    rec_free(&rec);
}

/* The executor's callback trying to shut down its own batcher is refused. */
static fp_status g_inner_status;
static fp_batcher *g_self;
static fp_status self_shutdown_exec(void *user, fp_batch_item *items, int count, int padded) {
    (void)user, (void)padded;
    g_inner_status = fp_batcher_shutdown(g_self, FP_BATCHER_SHUTDOWN_CANCEL);
    for (int i = 0; i < count; ++i) *(float *)items[i].output = 1.0f;
    return FP_OK;
}

static void test_shutdown_from_inside(void) {
    fp_batcher_config c = base_config(4, 0);
    CHECK_OK(fp_batcher_create(&c, self_shutdown_exec, NULL, &g_self));
    payload p[1];
    payloads_init(p, 1);
    fp_batch_request *req;
    CHECK_OK(submit_p(g_self, &p[0], -1, 0, NULL, &req));
    fp_status result;
    CHECK(status_of(req, &result));
    CHECK_STATUS(result, FP_OK);
    CHECK_STATUS(g_inner_status, FP_ERR_INVALID_ARGUMENT);
    fp_batch_request_release(req);
    fp_batcher_destroy(g_self);
}

/* ---------------------------------------------------------------------- */

static void test_max_batch(void) {
    recorder rec;
    fp_batcher_config c = base_config(4, 60 * 1000000LL); /* delay never expires */
    fp_batcher *b;
    payload p[8];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 8, &lg));
    rec_set_hold(&rec, 1);
    CHECK_OK(submit_range(b, p, 0, 8, -1, &lg, NULL));
    CHECK(rec_wait_started(&rec, 1));
    rec_set_hold(&rec, 0);
    CHECK(rec_wait_started(&rec, 2));
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK(rec.nbatch == 2);
    CHECK(rec.count[0] == 4 && rec.count[1] == 4);
    CHECK(rec.padded[0] == 4 && rec.padded[1] == 4);
    for (int i = 0; i < 8; ++i) {
        CHECK(rec.ids[i / 4][i % 4] == i); /* FIFO */
        CHECK(lg.calls[i] == 1 && lg.status[i] == FP_OK);
        CHECK(p[i].out == 2.0f * p[i].in + 1.0f);
    }
    rec_batcher_destroy(b, &rec);
}

static void test_delay(void) {
    recorder rec;
    fp_batcher_config c = base_config(8, 80 * 1000); /* 80 ms */
    fp_batcher *b;
    payload p[3];
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 3, NULL));
    double t0 = now_s();
    fp_batch_request *req[3];
    CHECK_OK(submit_range(b, p, 0, 3, -1, NULL, req));
    for (int i = 0; i < 3; ++i) {
        fp_status st;
        CHECK(status_of(req[i], &st));
        CHECK_STATUS(st, FP_OK);
        fp_batch_request_release(req[i]);
    }
    double waited = rec.t_start[0] - t0;
    CHECK(rec.nbatch == 1 && rec.count[0] == 3);
    CHECK_MSG(waited >= 0.075 && waited < 3.0, "dispatched after %.1f ms, delay 80 ms",
              waited * 1e3);
    rec_batcher_destroy(b, &rec);

    /* Delay 0: a lone request goes at once. */
    c = base_config(8, 0);
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 1, NULL));
    fp_batch_request *r1;
    CHECK_OK(submit_p(b, &p[0], -1, 0, NULL, &r1));
    fp_status st;
    CHECK(status_of(r1, &st));
    CHECK(rec.nbatch == 1 && rec.count[0] == 1);
    fp_batch_request_release(r1);
    rec_batcher_destroy(b, &rec);
}

static void test_preferred(void) {
    recorder rec;
    fp_batcher_config c = base_config(16, 60 * 1000000LL);
    c.num_preferred_batch_sizes = 2;
    c.preferred_batch_sizes[0] = 2;
    c.preferred_batch_sizes[1] = 4;
    fp_batcher *b;
    payload p[9];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 9, &lg));
    rec_set_hold(&rec, 1);
    /* Two requests form the preferred size 2 at once. */
    CHECK_OK(submit_range(b, p, 0, 2, -1, &lg, NULL));
    CHECK(rec_wait_started(&rec, 1));
    /* Seven while busy: the largest preferred size (4), then 2, then 1 waits
     * for the delay (a minute) and goes only with the drain. */
    CHECK_OK(submit_range(b, p, 2, 9, -1, &lg, NULL));
    rec_set_hold(&rec, 0);
    CHECK(rec_wait_started(&rec, 3));
    log_wait_count(&lg, 8, now_s() + 10);
    sleep_ms(50); /* the ninth must still be waiting for its delay */
    int done_before_drain = log_count(&lg);
    CHECK_MSG(done_before_drain == 8, "%d done before drain, expected 8", done_before_drain);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK(rec.nbatch == 4);
    CHECK(rec.count[0] == 2 && rec.count[1] == 4 && rec.count[2] == 2 && rec.count[3] == 1);
    CHECK(rec.ids[3][0] == 8);
    for (int i = 0; i < 9; ++i) CHECK(lg.calls[i] == 1 && lg.status[i] == FP_OK);
    rec_batcher_destroy(b, &rec);
}

static void test_padding(void) {
    recorder rec;
    fp_batcher_config c = base_config(16, 0);
    c.num_allowed_batch_sizes = 2;
    c.allowed_batch_sizes[0] = 4;
    c.allowed_batch_sizes[1] = 8; /* batches never exceed 8 */
    fp_batcher *b;
    payload p[12];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 12, &lg));
    CHECK(hold_first_batch(b, &rec, p, -1, &lg, NULL));
    CHECK_OK(submit_range(b, p, 1, 12, -1, &lg, NULL));
    rec_set_hold(&rec, 0);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK(rec.nbatch == 3);
    CHECK(rec.count[0] == 1 && rec.padded[0] == 4);
    CHECK(rec.count[1] == 8 && rec.padded[1] == 8);
    CHECK(rec.count[2] == 3 && rec.padded[2] == 4);
    fp_batcher_stats st;
    CHECK_OK(stats_get(b, &st));
    CHECK(st.batches == 3 && st.padded_slots == 16);
    CHECK_NEAR(st.padding_waste, 1.0 - 12.0 / 16.0, 1e-12);
    CHECK_NEAR(st.mean_batch_size, 4.0, 1e-12);
    int64_t hist[10];
    CHECK_OK(fp_batcher_get_batch_histogram(b, hist, 10));
    CHECK(hist[1] == 1 && hist[3] == 1 && hist[8] == 1 && hist[2] == 0 && hist[9] == 0);
    for (int i = 0; i < 12; ++i) CHECK(lg.calls[i] == 1 && p[i].out == 2.0f * p[i].in + 1.0f);
    rec_batcher_destroy(b, &rec);
}

static void test_priorities(void) {
    recorder rec;
    fp_batcher_config c = base_config(4, 0);
    c.priority_levels = 3;
    c.default_priority = 2;
    fp_batcher *b;
    payload p[7];
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 7, NULL));
    CHECK(hold_first_batch(b, &rec, p, -1, NULL, NULL));
    const int prio[7] = {0, 2, 1, 0, -1, 0, 1}; /* ids 1..6 */
    for (int i = 1; i < 7; ++i) CHECK_OK(submit_p(b, &p[i], prio[i], 0, NULL, NULL));
    rec_set_hold(&rec, 0);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK(rec.nbatch == 3 && rec.count[1] == 4 && rec.count[2] == 2);
    /* Level 0: 3, 5; level 1: 2, 6; level 2: 1, 4 (FIFO within a level). */
    const int want[6] = {3, 5, 2, 6, 1, 4};
    for (int i = 0; i < 6; ++i)
        CHECK_MSG(rec.ids[1 + i / 4][i % 4] == want[i], "position %d: id %d, expected %d", i,
                  rec.ids[1 + i / 4][i % 4], want[i]);
    rec_batcher_destroy(b, &rec);
}

static void test_queue_limits(void) {
    recorder rec;
    fp_batcher_config c = base_config(8, 0);
    c.priority_levels = 2;
    c.queue_policy[0].max_queue_size = 3;
    fp_batcher *b;
    payload p[10];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 10, &lg));
    CHECK(hold_first_batch(b, &rec, p, 0, &lg, NULL)); /* executing: no longer queued */
    CHECK_OK(submit_range(b, p, 1, 4, 0, &lg, NULL));
    fp_batch_request *rej = (fp_batch_request *)0x1;
    double t0 = now_s();
    CHECK_STATUS(submit_p(b, &p[4], 0, 0, &lg, &rej), FP_ERR_QUEUE_FULL);
    CHECK(now_s() - t0 < 1.0); /* at once */
    CHECK(rej == (fp_batch_request *)0x1);
    CHECK(strstr(fp_last_error(), "full") != NULL);
    CHECK_OK(submit_range(b, p, 5, 10, 1, &lg, NULL)); /* unbounded */
    rec_set_hold(&rec, 0);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK(lg.calls[4] == 0); /* a rejected request never completes */
    for (int i = 0; i < 10; ++i)
        if (i != 4) CHECK(lg.calls[i] == 1 && lg.status[i] == FP_OK);
    fp_batcher_stats st;
    CHECK_OK(stats_get(b, &st));
    CHECK(st.rejected_queue_full == 1 && st.submitted == 9 && st.completed_ok == 9);
    rec_batcher_destroy(b, &rec);
}

/* Timeouts fire while the only executor is busy with a long batch. */
static void test_timeouts_during_execution(void) {
    recorder rec;
    fp_batcher_config c = base_config(8, 0);
    c.priority_levels = 2;
    c.queue_policy[0].default_timeout_us = 300 * 1000;     /* REJECT */
    c.queue_policy[1].default_timeout_us = 200 * 1000;
    c.queue_policy[1].timeout_action = FP_BATCHER_TIMEOUT_DELAY;
    fp_batcher *b;
    payload p[8];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 8, &lg));
    CHECK(hold_first_batch(b, &rec, p, 0, &lg, NULL));
    double t0 = now_s();
    CHECK_OK(submit_p(b, &p[1], 0, 100 * 1000, &lg, NULL));       /* 100 ms */
    CHECK_OK(submit_p(b, &p[2], 0, 0, &lg, NULL));                /* default 300 ms */
    CHECK_OK(submit_p(b, &p[3], 0, 60 * 1000000LL, &lg, NULL));   /* clamped to 300 ms */
    CHECK_OK(submit_p(b, &p[4], 1, 0, &lg, NULL));                /* DELAY after 200 ms */
    /* Wait for the three timeouts while the batch is still held. */
    log_wait_count(&lg, 3, t0 + 10);
    sleep_ms(200); /* the DELAY request's timeout passes too */
    fp_batcher_stats st;
    CHECK_OK(stats_get(b, &st));
    CHECK(st.timed_out == 3 && st.delayed == 1 && st.executing == 1 && st.queued == 1);
    CHECK(rec.finished == 0); /* the batch is still running */
    for (int i = 1; i <= 3; ++i) CHECK(lg.calls[i] == 1 && lg.status[i] == FP_ERR_TIMEOUT);
    CHECK(p[1].out == -12345.0f); /* never executed */
    double e1 = lg.t_done[1] - t0, e2 = lg.t_done[2] - t0, e3 = lg.t_done[3] - t0;
    CHECK_MSG(e1 >= 0.095 && e1 < 0.095 + 1.5, "100 ms timeout fired after %.1f ms", e1 * 1e3);
    CHECK_MSG(e2 >= 0.295 && e2 < 0.295 + 1.5, "300 ms timeout fired after %.1f ms", e2 * 1e3);
    CHECK_MSG(e3 >= 0.295 && e3 < 0.295 + 1.5, "clamped timeout fired after %.1f ms", e3 * 1e3);
    CHECK(e1 < e2);
    /* DELAY: a later level-1 request, not timed out, goes before it. */
    CHECK_OK(submit_p(b, &p[5], 1, 0, &lg, NULL));
    rec_set_hold(&rec, 0);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK(lg.calls[4] == 1 && lg.status[4] == FP_OK);
    CHECK(lg.calls[5] == 1 && lg.status[5] == FP_OK);
    CHECK(rec.nbatch == 2 && rec.count[1] == 2);
    CHECK(rec.ids[1][0] == 5 && rec.ids[1][1] == 4);
    rec_batcher_destroy(b, &rec);
}

static void test_cancel(void) {
    recorder rec;
    fp_batcher_config c = base_config(8, 0);
    fp_batcher *b;
    payload p[4];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 4, &lg));
    fp_batch_request *r[4];
    CHECK(hold_first_batch(b, &rec, p, -1, &lg, &r[0]));
    CHECK_OK(submit_range(b, p, 1, 4, -1, &lg, r));
    CHECK_OK(fp_batch_request_cancel(r[2]));
    CHECK(fp_batch_request_done(r[2]) == 1);         /* completed before returning */
    CHECK(lg.calls[2] == 1 && lg.status[2] == FP_ERR_CANCELLED);
    CHECK_STATUS(fp_batch_request_cancel(r[2]), FP_ERR_NOT_FOUND); /* already done */
    CHECK_STATUS(fp_batch_request_cancel(r[0]), FP_ERR_NOT_FOUND); /* executing */
    fp_status st;
    CHECK_STATUS(fp_batch_request_wait(r[1], 0, &st), FP_ERR_TIMEOUT); /* still queued */
    CHECK_STATUS(fp_batch_request_wait(r[1], 20000, &st), FP_ERR_TIMEOUT);
    rec_set_hold(&rec, 0);
    for (int i = 0; i < 4; ++i) {
        CHECK(status_of(r[i], &st));
        CHECK_STATUS(st, i == 2 ? FP_ERR_CANCELLED : FP_OK);
        fp_batch_request_release(r[i]);
    }
    CHECK(p[2].out == -12345.0f);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    for (int i = 0; i < 4; ++i) CHECK(lg.calls[i] == 1);
    CHECK(rec.nbatch == 2 && rec.count[1] == 2);
    rec_batcher_destroy(b, &rec);
}

typedef struct shut_arg {
    fp_batcher *b;
    fp_batcher_shutdown_mode mode;
    fp_status st;
    atomic_int returned;
} shut_arg;

static void *shut_thread(void *arg) {
    shut_arg *a = arg;
    a->st = fp_batcher_shutdown(a->b, a->mode);
    atomic_store(&a->returned, 1);
    return NULL;
}

static void test_shutdown_modes(void) {
    for (int mode = 0; mode < 2; ++mode) {
        recorder rec;
        fp_batcher_config c = base_config(8, 60 * 1000000LL);
        fp_batcher *b;
        payload p[6];
        done_log lg;
        CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 6, &lg));
        fp_batch_request *r[6];
        rec_set_hold(&rec, 1);
        CHECK_OK(submit_range(b, p, 0, 6, -1, &lg, r));
        /* Six queued, the delay never expires: nothing runs until shutdown. */
        sleep_ms(20);
        CHECK(rec.started == 0);
        shut_arg a = {b, (fp_batcher_shutdown_mode)mode, FP_ERR_INTERNAL, 0};
        pthread_t th;
        pthread_create(&th, NULL, shut_thread, &a);
        fp_status st;
        if (mode == FP_BATCHER_SHUTDOWN_CANCEL) {
            /* Completed with SHUT_DOWN at once, the executor never ran. */
            for (int i = 0; i < 6; ++i) {
                CHECK(status_of(r[i], &st));
                CHECK_STATUS(st, FP_ERR_SHUT_DOWN);
            }
            CHECK(rec.started == 0);
        } else {
            /* Drain dispatches without waiting for the delay. */
            CHECK(rec_wait_started(&rec, 1));
            sleep_ms(20);
            CHECK(atomic_load(&a.returned) == 0); /* waits for the running batch */
            rec_set_hold(&rec, 0);
            for (int i = 0; i < 6; ++i) {
                CHECK(status_of(r[i], &st));
                CHECK_STATUS(st, FP_OK);
            }
        }
        rec_set_hold(&rec, 0);
        pthread_join(th, NULL);
        CHECK_OK(a.st);
        CHECK_STATUS(submit_p(b, &p[0], -1, 0, NULL, NULL), FP_ERR_SHUT_DOWN);
        for (int i = 0; i < 6; ++i) {
            CHECK(lg.calls[i] == 1);
            fp_batch_request_release(r[i]);
        }
        rec_batcher_destroy(b, &rec);
    }

    /* destroy with requests queued and one running: all complete once. */
    recorder rec;
    fp_batcher_config c = base_config(2, 0);
    fp_batcher *b;
    payload p[5];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 5, &lg));
    CHECK(hold_first_batch(b, &rec, p, -1, &lg, NULL));
    CHECK_OK(submit_range(b, p, 1, 5, -1, &lg, NULL));
    shut_arg a = {b, FP_BATCHER_SHUTDOWN_CANCEL, FP_ERR_INTERNAL, 0};
    pthread_t th;
    pthread_create(&th, NULL, shut_thread, &a);
    sleep_ms(30);
    rec_set_hold(&rec, 0);
    pthread_join(th, NULL);
    fp_batcher_destroy(b);
    CHECK(lg.calls[0] == 1 && lg.status[0] == FP_OK);
    for (int i = 1; i < 5; ++i) CHECK(lg.calls[i] == 1 && lg.status[i] == FP_ERR_SHUT_DOWN);
    rec_free(&rec);
}

static void test_ordering(void) {
    for (int ordered = 0; ordered < 2; ++ordered) {
        recorder rec;
        fp_batcher_config c = base_config(1, 0);
        c.executor_threads = 2;
        c.preserve_ordering = ordered;
        fp_batcher *b;
        payload p[6];
        done_log lg;
        CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 6, &lg));
        p[0].exec_ms = 300; /* the first request is slow, the rest fast */
        p[3].fail = FP_ERR_MISMATCH;
        CHECK_OK(submit_range(b, p, 0, 6, -1, &lg, NULL));
        CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
        CHECK(lg.n == 6);
        for (int i = 0; i < 6; ++i) CHECK(lg.calls[i] == 1);
        CHECK(lg.status[3] == FP_ERR_MISMATCH);
        if (ordered) {
            for (int i = 0; i < 6; ++i) CHECK_MSG(lg.order[i] == i, "position %d got id %d", i,
                                                 lg.order[i]);
        } else if (lg.order[0] == 0) {
            /* Not asserted (scheduling), but expected: fast ones overtake. */
            fprintf(stderr, "note: unordered run delivered the slow request first\n");
        }
        rec_batcher_destroy(b, &rec);
    }
}

static void test_executor_failures(void) {
    recorder rec;
    fp_batcher_config c = base_config(4, 0);
    fp_batcher *b;
    payload p[8];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 8, &lg));
    /* Batch A: one request fails alone. */
    CHECK(hold_first_batch(b, &rec, p, -1, &lg, NULL));
    p[2].fail = FP_ERR_MISMATCH;
    CHECK_OK(submit_range(b, p, 1, 4, -1, &lg, NULL));
    rec_set_hold(&rec, 0);
    CHECK(rec_wait_started(&rec, 2));
    sleep_ms(20);
    /* Batch B: the executor fails the batch; one item keeps its own status. */
    pthread_mutex_lock(&rec.mu);
    rec.batch_rc = FP_ERR_CUDA;
    rec.hold = 1;
    pthread_mutex_unlock(&rec.mu);
    p[5].fail = FP_ERR_IO;
    CHECK_OK(submit_range(b, p, 4, 8, -1, &lg, NULL));
    CHECK(rec_wait_started(&rec, 3));
    rec_set_hold(&rec, 0);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    const fp_status want[8] = {FP_OK, FP_OK, FP_ERR_MISMATCH, FP_OK,
                               FP_ERR_CUDA, FP_ERR_IO, FP_ERR_CUDA, FP_ERR_CUDA};
    for (int i = 0; i < 8; ++i)
        CHECK_MSG(lg.calls[i] == 1 && lg.status[i] == want[i], "id %d: %d calls, status %s", i,
                  lg.calls[i], fp_status_string(lg.status[i]));
    fp_batcher_stats st;
    CHECK_OK(stats_get(b, &st));
    CHECK(st.completed_ok == 3 && st.failed == 5 && st.submitted == 8);
    CHECK(st.end_to_end.stats.samples == 3 && st.queue_time.stats.samples == 8);
    CHECK(st.executor.stats.samples >= 3 && st.executor_busy_s > 0);
    CHECK(st.queue_time.p99_us >= st.queue_time.p50_us && st.queue_time.max_us >= st.queue_time.p99_us);
    CHECK_OK(fp_batcher_reset_stats(b));
    CHECK_OK(stats_get(b, &st));
    CHECK(st.batches == 0 && st.submitted == 0 && st.queue_time.stats.samples == 0);
    rec_batcher_destroy(b, &rec);
}

/* executor_threads = N: N batches in flight at once. */
static void test_batches_in_flight(void) {
    recorder rec;
    fp_batcher_config c = base_config(2, 0);
    c.executor_threads = 3;
    fp_batcher *b;
    payload p[8];
    done_log lg;
    CHECK_OK(rec_batcher_create(&c, &rec, &b, p, 8, &lg));
    rec_set_hold(&rec, 1);
    CHECK_OK(submit_range(b, p, 0, 8, -1, &lg, NULL));
    CHECK(rec_wait_started(&rec, 3)); /* three batches held at the gate together */
    sleep_ms(20);
    pthread_mutex_lock(&rec.mu);
    int started = rec.started;
    pthread_mutex_unlock(&rec.mu);
    CHECK_MSG(started == 3, "%d batches in flight, expected 3", started);
    rec_set_hold(&rec, 0);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));
    int total = 0;
    for (int i = 0; i < rec.nbatch; ++i) total += rec.count[i];
    CHECK(total == 8);
    for (int i = 0; i < 8; ++i) CHECK(lg.calls[i] == 1 && p[i].out == 2.0f * p[i].in + 1.0f);
    rec_batcher_destroy(b, &rec);
}

/* Callbacks may submit (re-entrancy) and must see a valid request. */
typedef struct chain {
    fp_batcher *b;
    payload p[16];
    atomic_int done;
} chain;

static void chain_done(fp_batch_request *req, fp_status st, void *user) {
    chain *ch = user;
    payload *p = fp_batch_request_user(req);
    if (st == FP_OK && p->id + 1 < 16) {
        fp_batch_submit_info info;
        payload_submit_info(&info, &ch->p[p->id + 1]);
        info.on_done = chain_done;
        info.on_done_user = ch;
        if (fp_batcher_submit(ch->b, &info, NULL) == FP_OK) return;
    }
    atomic_fetch_add(&ch->done, 1); /* the chain ended (or a submit failed) */
}

static void test_resubmit_from_callback(void) {
    recorder rec;
    rec_init(&rec);
    fp_batcher_config c = base_config(4, 100);
    chain ch;
    payloads_init(ch.p, 16);
    atomic_init(&ch.done, 0);
    CHECK_OK(fp_batcher_create(&c, rec_exec, &rec, &ch.b));
    fp_batch_submit_info info;
    payload_submit_info(&info, &ch.p[0]);
    info.on_done = chain_done;
    info.on_done_user = &ch;
    CHECK_OK(fp_batcher_submit(ch.b, &info, NULL));
    double end = now_s() + 10;
    while (atomic_load(&ch.done) < 1 && now_s() < end) sleep_ms(1);
    CHECK_OK(fp_batcher_shutdown(ch.b, FP_BATCHER_SHUTDOWN_DRAIN));
    CHECK(atomic_load(&ch.done) == 1);
    for (int i = 0; i < 16; ++i) CHECK(ch.p[i].out == 2.0f * ch.p[i].in + 1.0f);
    fp_batcher_destroy(ch.b);
    rec_free(&rec);
}

int main(void) {
    test_bad_input();
    test_shutdown_from_inside();
    test_max_batch();
    test_delay();
    test_preferred();
    test_padding();
    test_priorities();
    test_queue_limits();
    test_timeouts_during_execution();
    test_cancel();
    test_shutdown_modes();
    test_ordering();
    test_batches_in_flight();
    test_executor_failures();
    test_resubmit_from_callback();
    TEST_END();
}
