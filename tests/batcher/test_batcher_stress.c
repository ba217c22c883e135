/* Stress: many producer threads, random priorities, timeouts, cancels and
 * queue limits; an executor with random delays and failures on several
 * threads; shutdown (drain, or cancel while producers still submit). Checks
 * that every accepted request completes exactly once with a status that
 * matches what happened to it and, when FP_OK, the right output; rejected
 * requests never complete; with ordering, each producer's completions come
 * in its submission order. */
#include "batcher_test_util.h"

#define PRODUCERS 8
#ifdef FP_TSAN_BUILD
#define PER_PRODUCER 250
#else
#define PER_PRODUCER 1500
#endif
#define NREQ (PRODUCERS * PER_PRODUCER)

typedef struct sreq {
    int id, producer, seq;
    float in, out;
    int want_fail;            /* executor fails it with FP_ERR_MISMATCH */
    int64_t timeout_us;
    int use_handle, cancel;
    fp_status submit_rc;      /* FP_OK: accepted */
    fp_status cancel_rc;
    fp_status wait_result;
    atomic_int calls;         /* completion callbacks */
    atomic_int executed;      /* times inside the executor */
    int batch_failed;         /* its batch returned FP_ERR_CUDA */
    fp_status status;         /* from the callback */
    int deliver_idx;
} sreq;

static sreq g_req[NREQ];
static atomic_int g_deliver_counter;

typedef struct round_cfg {
    fp_batcher *b;
    int ordered;
} round_cfg;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static fp_status stress_exec(void *user, fp_batch_item *items, int count, int padded) {
    (void)user;
    if (padded < count) return FP_ERR_INTERNAL;
    sreq *first = items[0].user;
    uint64_t h = mix((uint64_t)first->id * 7919 + (uint64_t)count);
    int batch_fails = h % 23 == 0;
    /* Random execution time: 0..800 us. */
    int us = (int)((h >> 20) % 800);
    if (us > 0) sleep_ms(us * 1e-3);
    for (int i = 0; i < count; ++i) {
        sreq *r = items[i].user;
        atomic_fetch_add(&r->executed, 1);
        r->batch_failed = batch_fails;
        if (r->want_fail) items[i].status = FP_ERR_MISMATCH;
        *(float *)items[i].output = 2.0f * *(const float *)items[i].input + 1.0f;
    }
    return batch_fails ? FP_ERR_CUDA : FP_OK;
}

static void stress_done(fp_batch_request *req, fp_status st, void *user) {
    (void)user;
    sreq *r = fp_batch_request_user(req);
    r->status = st;
    r->deliver_idx = atomic_fetch_add(&g_deliver_counter, 1);
    atomic_fetch_add(&r->calls, 1);
}

typedef struct prod_arg {
    fp_batcher *b;
    int p;
} prod_arg;

static void *producer(void *arg) {
    prod_arg *a = arg;
    uint64_t rng = mix((uint64_t)a->p + 12345);
    for (int s = 0; s < PER_PRODUCER; ++s) {
        sreq *r = &g_req[a->p * PER_PRODUCER + s];
        rng = mix(rng);
        fp_batch_submit_info info;
        fp_batch_submit_info_default(&info);
        info.input = &r->in;
        info.input_size = sizeof r->in;
        info.output = &r->out;
        info.output_size = sizeof r->out;
        info.user = r;
        info.priority = (int)(rng % 3);
        r->timeout_us = (rng >> 8) % 5 == 0 ? 20 + (int64_t)((rng >> 16) % 2000) : 0;
        info.timeout_us = r->timeout_us;
        info.on_done = stress_done;
        r->use_handle = (rng >> 24) % 3 == 0;
        r->cancel = r->use_handle && (rng >> 28) % 4 == 0;
        fp_batch_request *h = NULL;
        r->submit_rc = fp_batcher_submit(a->b, &info, r->use_handle ? &h : NULL);
        if (r->submit_rc != FP_OK) continue;
        if (r->cancel) r->cancel_rc = fp_batch_request_cancel(h);
        if (h) {
            /* Half the handles are polled with short timed waits, which
             * can expire just as delivery moves the waiter to its wake
             * group; the rest wait forever. */
            fp_status wr = FP_ERR_TIMEOUT;
            if ((rng >> 32) % 2 == 0) {
                int64_t step = 1 + (int64_t)((rng >> 33) % 300);
                double end = now_s() + 30;
                while (wr == FP_ERR_TIMEOUT && now_s() < end)
                    wr = fp_batch_request_wait(h, step, &r->wait_result);
            } else {
                wr = fp_batch_request_wait(h, -1, &r->wait_result);
            }
            if (wr != FP_OK) r->wait_result = FP_ERR_INTERNAL;
            fp_batch_request_release(h);
        }
        if ((rng >> 40) % 64 == 0) sleep_ms(0.2); /* bursts and gaps */
    }
    return NULL;
}

static void run_round(int ordered, int cancel_shutdown) {
    memset(g_req, 0, sizeof g_req);
    atomic_store(&g_deliver_counter, 0);
    for (int i = 0; i < NREQ; ++i) {
        sreq *r = &g_req[i];
        r->id = i;
        r->producer = i / PER_PRODUCER;
        r->seq = i % PER_PRODUCER;
        r->in = (float)(i % 1000) * 0.5f + 0.25f;
        r->out = -1.0f;
        r->want_fail = mix((uint64_t)i) % 17 == 0;
        r->cancel_rc = FP_ERR_INTERNAL;
        atomic_init(&r->calls, 0);
        atomic_init(&r->executed, 0);
    }
    fp_batcher_config c;
    fp_batcher_config_default(&c);
    c.max_batch_size = 16;
    c.max_queue_delay_us = 200;
    c.num_preferred_batch_sizes = 2;
    c.preferred_batch_sizes[0] = 4;
    c.preferred_batch_sizes[1] = 8;
    c.num_allowed_batch_sizes = 4;
    c.allowed_batch_sizes[0] = 2;
    c.allowed_batch_sizes[1] = 4;
    c.allowed_batch_sizes[2] = 8;
    c.allowed_batch_sizes[3] = 16;
    c.priority_levels = 3;
    c.queue_policy[1].default_timeout_us = 3000;
    c.queue_policy[1].timeout_action = FP_BATCHER_TIMEOUT_DELAY;
    c.queue_policy[2].max_queue_size = 8;
    c.executor_threads = 3;
    c.preserve_ordering = ordered;
    fp_batcher *b;
    CHECK_OK(fp_batcher_create(&c, stress_exec, NULL, &b));
    pthread_t th[PRODUCERS];
    prod_arg args[PRODUCERS];
    for (int p = 0; p < PRODUCERS; ++p) {
        args[p].b = b;
        args[p].p = p;
        pthread_create(&th[p], NULL, producer, &args[p]);
    }
    if (cancel_shutdown) {
        sleep_ms(30); /* shut down while the producers are still submitting */
        CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_CANCEL));
    }
    for (int p = 0; p < PRODUCERS; ++p) pthread_join(th[p], NULL);
    CHECK_OK(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_DRAIN));

    int64_t accepted = 0, n_ok = 0, n_fail = 0, n_timeout = 0, n_cancel = 0, n_shut = 0;
    int64_t rej_full = 0, rej_shut = 0, bad = 0;
    for (int i = 0; i < NREQ && bad < 10; ++i) {
        sreq *r = &g_req[i];
        int calls = atomic_load(&r->calls), executed = atomic_load(&r->executed);
        if (r->submit_rc != FP_OK) {
            if (r->submit_rc == FP_ERR_QUEUE_FULL) rej_full++;
            else if (r->submit_rc == FP_ERR_SHUT_DOWN) rej_shut++;
            else CHECK_MSG(0, "id %d: submit returned %s", i, fp_status_string(r->submit_rc));
            if (calls != 0 || executed != 0) {
                CHECK_MSG(0, "rejected id %d completed %d / executed %d times", i, calls, executed);
                bad++;
            }
            continue;
        }
        accepted++;
        int ok = calls == 1 && executed <= 1;
        switch (r->status) {
        case FP_OK:
            n_ok++;
            ok = ok && executed == 1 && !r->want_fail && !r->batch_failed &&
                 r->out == 2.0f * r->in + 1.0f;
            break;
        case FP_ERR_MISMATCH:
            n_fail++;
            ok = ok && executed == 1 && r->want_fail;
            break;
        case FP_ERR_CUDA:
            n_fail++;
            ok = ok && executed == 1 && !r->want_fail && r->batch_failed;
            break;
        case FP_ERR_TIMEOUT:
            n_timeout++;
            ok = ok && executed == 0 && r->timeout_us > 0 && r->out == -1.0f;
            break;
        case FP_ERR_CANCELLED:
            n_cancel++;
            ok = ok && executed == 0 && r->cancel && r->cancel_rc == FP_OK && r->out == -1.0f;
            break;
        case FP_ERR_SHUT_DOWN:
            n_shut++;
            ok = ok && executed == 0 && cancel_shutdown && r->out == -1.0f;
            break;
        default: ok = 0; break;
        }
        if (r->cancel) ok = ok && ((r->cancel_rc == FP_OK) == (r->status == FP_ERR_CANCELLED));
        if (r->use_handle) ok = ok && r->wait_result == r->status;
        if (!ok) {
            CHECK_MSG(0, "id %d: status %s, calls %d, executed %d, want_fail %d, batch_failed %d, "
                      "timeout %lld, cancel %d (rc %s), out %g for in %g",
                      i, fp_status_string(r->status), calls, executed, r->want_fail,
                      r->batch_failed, (long long)r->timeout_us, r->cancel,
                      fp_status_string(r->cancel_rc), r->out, r->in);
            bad++;
        }
    }
    if (ordered) {
        /* Each producer submits in sequence, so its completions are in order. */
        for (int p = 0; p < PRODUCERS; ++p) {
            int last = -1;
            for (int s = 0; s < PER_PRODUCER; ++s) {
                sreq *r = &g_req[p * PER_PRODUCER + s];
                if (r->submit_rc != FP_OK) continue;
                CHECK_MSG(r->deliver_idx > last, "producer %d: seq %d delivered at %d after %d",
                          p, s, r->deliver_idx, last);
                last = r->deliver_idx;
            }
        }
    }
    fp_batcher_stats st;
    fp_batcher_stats_init(&st);
    CHECK_OK(fp_batcher_get_stats(b, &st));
    CHECK(st.submitted == accepted);
    CHECK(st.completed_ok == n_ok && st.failed == n_fail && st.timed_out == n_timeout);
    CHECK(st.cancelled == n_cancel && st.shut_down == n_shut);
    CHECK(st.completed_ok + st.failed + st.timed_out + st.cancelled + st.shut_down == st.submitted);
    CHECK(st.rejected_queue_full == rej_full && st.rejected_shut_down == rej_shut);
    CHECK(st.queued == 0 && st.executing == 0);
    CHECK(atomic_load(&g_deliver_counter) == accepted);
    int64_t hist[17];
    CHECK_OK(fp_batcher_get_batch_histogram(b, hist, 17));
    int64_t hb = 0, hr = 0;
    for (int i = 0; i < 17; ++i) hb += hist[i], hr += i * hist[i];
    CHECK(hb == st.batches && hist[0] == 0);
    CHECK(hr == n_ok + n_fail);
    printf("round ordered=%d cancel_shutdown=%d: accepted %lld ok %lld failed %lld timeout %lld "
           "cancelled %lld shut_down %lld rejected(full %lld, shut %lld) batches %lld mean %.2f "
           "delayed %lld\n",
           ordered, cancel_shutdown, (long long)accepted, (long long)n_ok, (long long)n_fail,
           (long long)n_timeout, (long long)n_cancel, (long long)n_shut, (long long)rej_full,
           (long long)rej_shut, (long long)st.batches, st.mean_batch_size, (long long)st.delayed);
    if (!cancel_shutdown) CHECK(n_ok > accepted / 2 && rej_shut == 0);
    fp_batcher_destroy(b);
}

int main(void) {
    run_round(0, 0);
    run_round(1, 0);
    run_round(0, 1);
    run_round(1, 1);
    TEST_END();
}
