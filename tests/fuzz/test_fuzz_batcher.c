/* Structured fuzz of the dynamic batcher (batcher.h), public header only.
 *
 * Phase 1, configurations: random valid configs must validate and create;
 * each broken in exactly one field must be refused by validate and create
 * with FP_ERR_INVALID_ARGUMENT naming the field (create leaves *out alone).
 * Phase 2, runs: random valid configs under two submitting threads (random
 * priorities including invalid ones, timeouts, handles or fire-and-forget,
 * cancels, waits, releases) and a random end (drain, cancel, or destroy with
 * requests queued), against an executor that fails items or whole batches
 * and sleeps a little. Checked: every accepted request completes exactly
 * once with an allowed status, runs at most once and never after it
 * completed, gets its output exactly when it completed FP_OK (otherwise the
 * output is untouched); rejected requests never call back; batch sizes obey
 * max / allowed sizes; stats add up; shutdown returns in bounded time.
 * Usage: test_fuzz_batcher [seed] [rounds]. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "fuzz_util.h"

/* ---- phase 1: configurations ---- */

static void random_valid_config(uint64_t *s, fp_batcher_config *c) {
    fp_batcher_config_default(c);
    c->max_batch_size = (int)fz_range(s, 1, 16);
    c->max_queue_delay_us = fz_chance(s, 1, 3) ? 0 : fz_range(s, 1, 2000);
    int n = (int)fz_range(s, 0, c->max_batch_size < 4 ? c->max_batch_size : 4);
    int v = 0;
    for (int i = 0; i < n && v < c->max_batch_size; ++i) c->allowed_batch_sizes[c->num_allowed_batch_sizes++] = v += (int)fz_range(s, 1, 3);
    while (c->num_allowed_batch_sizes && c->allowed_batch_sizes[c->num_allowed_batch_sizes - 1] > c->max_batch_size)
        c->num_allowed_batch_sizes--;
    const int top = c->num_allowed_batch_sizes ? c->allowed_batch_sizes[c->num_allowed_batch_sizes - 1] : c->max_batch_size;
    n = (int)fz_range(s, 0, 3);
    v = 0;
    for (int i = 0; i < n; ++i) {
        v += (int)fz_range(s, 1, 4);
        if (v > top) break;
        c->preferred_batch_sizes[c->num_preferred_batch_sizes++] = v;
    }
    c->priority_levels = (int)fz_range(s, 1, 4);
    c->default_priority = (int)fz_range(s, 0, c->priority_levels - 1);
    for (int l = 0; l < c->priority_levels; ++l) {
        c->queue_policy[l].max_queue_size = fz_chance(s, 1, 2) ? 0 : (int)fz_range(s, 1, 20);
        c->queue_policy[l].default_timeout_us = fz_chance(s, 1, 2) ? 0 : fz_range(s, 50, 5000);
        c->queue_policy[l].timeout_action = (fp_batcher_timeout_action)fz_range(s, 0, 1);
    }
    c->preserve_ordering = fz_chance(s, 1, 3);
    c->executor_threads = (int)fz_range(s, 1, 3);
    c->stats_window = (int)fz_range(s, 16, 2000);
}

/* Breaks one field; returns the name the message must contain, or NULL if
 * the draw did not apply. */
static const char *break_config(uint64_t *s, fp_batcher_config *c) {
    switch (fz_range(s, 0, 14)) {
    case 0: c->struct_size = fz_chance(s, 1, 2) ? 0 : sizeof *c + 4; return "struct_size";
    case 1: c->max_batch_size = fz_chance(s, 1, 2) ? (int)-fz_range(s, 0, 5) : FP_BATCHER_MAX_BATCH + 1; return "max_batch_size";
    case 2: c->max_queue_delay_us = fz_chance(s, 1, 2) ? -1 : INT64_MAX; return "max_queue_delay_us";
    case 3: c->num_preferred_batch_sizes = fz_chance(s, 1, 2) ? -1 : FP_BATCHER_MAX_SIZES + 1; return "preferred_batch_sizes";
    case 4: c->num_allowed_batch_sizes = 1; c->allowed_batch_sizes[0] = c->max_batch_size + 1;
        c->num_preferred_batch_sizes = 0; return "allowed_batch_sizes";
    case 5: /* not increasing */
        if (c->max_batch_size < 2) return NULL;
        c->num_preferred_batch_sizes = 2;
        c->preferred_batch_sizes[0] = 2;
        c->preferred_batch_sizes[1] = fz_chance(s, 1, 2) ? 2 : 1;
        c->num_allowed_batch_sizes = 0;
        return "preferred_batch_sizes";
    case 6: /* preferred above the largest allowed */
        if (c->max_batch_size < 2) return NULL;
        c->num_allowed_batch_sizes = 1;
        c->allowed_batch_sizes[0] = 1;
        c->num_preferred_batch_sizes = 1;
        c->preferred_batch_sizes[0] = 2;
        return "preferred_batch_sizes";
    case 7: c->priority_levels = fz_chance(s, 1, 2) ? 0 : FP_BATCHER_MAX_PRIORITIES + 1; return "priority_levels";
    case 8: c->default_priority = fz_chance(s, 1, 2) ? -1 : c->priority_levels; return "default_priority";
    case 9: c->queue_policy[fz_range(s, 0, c->priority_levels - 1)].max_queue_size = -1; return "max_queue_size";
    case 10: c->queue_policy[fz_range(s, 0, c->priority_levels - 1)].default_timeout_us = -5; return "default_timeout_us";
    case 11: c->queue_policy[fz_range(s, 0, c->priority_levels - 1)].timeout_action = (fp_batcher_timeout_action)7;
        return "timeout_action";
    case 12: c->preserve_ordering = fz_chance(s, 1, 2) ? 2 : -1; return "preserve_ordering";
    case 13: c->executor_threads = fz_chance(s, 1, 2) ? 0 : FP_BATCHER_MAX_THREADS + 1; return "executor_threads";
    default: c->stats_window = fz_chance(s, 1, 2) ? 15 : (1 << 24) + 1; return "stats_window";
    }
}

static fp_status noop_executor(void *user, fp_batch_item *items, int count, int padded) { return FP_OK; }


/* fp_batcher_bench with one bad field: refused naming it before anything
 * runs, the report untouched. */
static void bench_config_check(fz_run *run, uint64_t *s) {
    fp_batcher_bench_config c;
    fp_batcher_bench_config_default(&c);
    const char *name;
    switch (fz_range(s, 0, 9)) {
    case 0: c.struct_size = 0; name = "struct_size"; break;
    case 1: c.load = (fp_batcher_load)fz_range(s, 2, 9); name = "load"; break;
    case 2: c.load = FP_BATCHER_LOAD_CLOSED; c.clients = fz_chance(s, 1, 2) ? 0 : 4097; name = "clients"; break;
    case 3: {
        const double bad[] = {0.0, -1.0, NAN, INFINITY, 2e8};
        c.load = FP_BATCHER_LOAD_OPEN;
        c.rate_rps = bad[fz_range(s, 0, 4)];
        name = "rate_rps";
        break;
    }
    case 4: c.requests = fz_chance(s, 1, 2) ? 0 : -5; name = "requests"; break;
    case 5: c.warmup_requests = -1; name = "warmup_requests"; break;
    case 6: c.windows = fz_chance(s, 1, 2) ? 0 : 1025; name = "windows"; break;
    case 7: c.model.dim = fz_chance(s, 1, 2) ? 0 : 65537; name = "model.dim"; break;
    case 8: c.model.item_us = fz_chance(s, 1, 2) ? NAN : -1.0; name = "model"; break;
    default: {
        const char *field = break_config(s, &c.batcher);
        if (!field) return;
        name = field;
        break;
    }
    }
    fp_batcher_bench_report rep, keep;
    memset(&rep, 0x3E, sizeof rep);
    keep = rep;
    FZ_CHECK_CALL(run, "fp_batcher_bench (one bad field)", fp_batcher_bench(&c, &rep), FP_ERR_INVALID_ARGUMENT, name);
    CHECK(memcmp(&rep, &keep, sizeof rep) == 0);
}

static void config_phase(fz_run *run, uint64_t *s, int iters) {
    for (int i = 0; i < iters; ++i, ++run->iter) {
        fp_batcher_config c;
        random_valid_config(s, &c);
        FZ_CHECK_CALL(run, "fp_batcher_config_validate (valid)", fp_batcher_config_validate(&c), FP_OK, NULL);
        const char *field = break_config(s, &c);
        if (!field) continue;
        FZ_CHECK_CALL(run, "fp_batcher_config_validate (one bad field)", fp_batcher_config_validate(&c),
                      FP_ERR_INVALID_ARGUMENT, field);
        if (i % 16 == 0) bench_config_check(run, s);
        if (i % 8 == 0) { /* create too: same verdict, *out untouched */
            fp_batcher *b = (fp_batcher *)(uintptr_t)0x5151;
            FZ_CHECK_CALL(run, "fp_batcher_create (one bad field)", fp_batcher_create(&c, noop_executor, NULL, &b),
                          FP_ERR_INVALID_ARGUMENT, field);
            CHECK(b == (fp_batcher *)(uintptr_t)0x5151);
        }
    }
    FZ_CHECK_CALL(run, "fp_batcher_config_validate(NULL)", fp_batcher_config_validate(NULL), FP_ERR_INVALID_ARGUMENT, NULL);
    fp_batcher *b = NULL;
    FZ_CHECK_CALL(run, "fp_batcher_create(NULL executor)", fp_batcher_create(NULL, NULL, NULL, &b),
                  FP_ERR_INVALID_ARGUMENT, "executor");
    FZ_CHECK_CALL(run, "fp_batcher_create(NULL out)", fp_batcher_create(NULL, noop_executor, NULL, NULL),
                  FP_ERR_INVALID_ARGUMENT, "out");
    fp_batcher_config_default(NULL);
    CHECK_OK(fp_batcher_destroy(NULL));
    fp_batch_request_release(NULL);
    CHECK(fp_batch_request_done(NULL) == 0);
    CHECK(fp_batch_request_user(NULL) == NULL);
    FZ_CHECK_CALL(run, "fp_batch_request_wait(NULL)", fp_batch_request_wait(NULL, 0, NULL), FP_ERR_INVALID_ARGUMENT, "req");
    FZ_CHECK_CALL(run, "fp_batch_request_cancel(NULL)", fp_batch_request_cancel(NULL), FP_ERR_INVALID_ARGUMENT, "req");
    FZ_CHECK_CALL(run, "fp_batcher_shutdown(NULL)", fp_batcher_shutdown(NULL, FP_BATCHER_SHUTDOWN_DRAIN),
                  FP_ERR_INVALID_ARGUMENT, "batcher");
}

/* ---- phase 2: runs ---- */

#define MAX_REQ 4096
#define OUT_POISON 0x7A7A7A7A7A7A7A7AULL

typedef struct req_rec {
    uint64_t id;
    uint64_t input;
    uint64_t output;           /* executor writes input * 3 + 1 */
    atomic_int executed;       /* times the executor saw it */
    atomic_int done;           /* on_done calls */
    atomic_int status;
    atomic_int done_before_exec; /* the executor saw it after completion */
    int accepted;
    fp_batch_request *handle;
} req_rec;

typedef struct round_state {
    fz_run *run;
    fp_batcher_config cfg;
    fp_batcher *b;
    req_rec *recs;
    atomic_int n_recs;
    atomic_int stop;
    int fail_items_per_mille, fail_batch_per_mille, sleep_us;
    atomic_long batches, bad_batch_shape;
    atomic_int self_shutdown_checked;
    uint64_t rng_seed;
    pthread_mutex_t rng_mu;
    uint64_t exec_rng;
} round_state;

static fp_status fuzz_executor(void *user, fp_batch_item *items, int count, int padded) {
    round_state *r = user;
    atomic_fetch_add(&r->batches, 1);
    int ok_shape = count >= 1 && count <= r->cfg.max_batch_size && padded >= count;
    if (r->cfg.num_allowed_batch_sizes) {
        int found = 0;
        for (int i = 0; i < r->cfg.num_allowed_batch_sizes; ++i) found |= r->cfg.allowed_batch_sizes[i] == padded;
        ok_shape &= found;
    } else {
        ok_shape &= padded == count;
    }
    if (!ok_shape) atomic_fetch_add(&r->bad_batch_shape, 1);
    if (!atomic_exchange(&r->self_shutdown_checked, 1)) {
        /* shutting down from inside would wait for itself: refused */
        FZ_CHECK_CALL(r->run, "fp_batcher_shutdown from the executor", fp_batcher_shutdown(r->b, FP_BATCHER_SHUTDOWN_DRAIN),
                      FP_ERR_INVALID_ARGUMENT, NULL);
    }
    pthread_mutex_lock(&r->rng_mu);
    uint64_t x = fz_u64(&r->exec_rng);
    pthread_mutex_unlock(&r->rng_mu);
    for (int i = 0; i < count; ++i) {
        req_rec *rec = items[i].user;
        atomic_fetch_add(&rec->executed, 1);
        if (atomic_load(&rec->done)) atomic_fetch_add(&rec->done_before_exec, 1);
        CHECK(items[i].input == &rec->input && items[i].output == &rec->output && items[i].status == FP_OK);
        if ((int)((x >> (i % 48)) % 1000) < r->fail_items_per_mille) {
            /* this request alone fails, now and then with a value outside fp_status */
            items[i].status = (x >> 7) % 8 == 0 ? (fp_status)(42 + (int)(x % 3)) : (x >> 7) % 8 == 1 ? (fp_status)-3
                                                                                                 : FP_ERR_MISMATCH;
            continue;
        }
        *(uint64_t *)items[i].output = rec->input * 3 + 1;
    }
    if (r->sleep_us) usleep((useconds_t)(x % (uint64_t)r->sleep_us));
    if ((int)(x % 1000) < r->fail_batch_per_mille) /* fails every item still FP_OK */
        return (x >> 11) % 6 == 0 ? (fp_status)1000 : FP_ERR_CUDA;
    return FP_OK;
}

static void on_done(fp_batch_request *req, fp_status status, void *user) {
    req_rec *rec = user;
    atomic_store(&rec->status, (int)status);
    atomic_fetch_add(&rec->done, 1);
}

typedef struct submitter {
    round_state *r;
    uint64_t rng;
    int id;
} submitter;

static void *submit_main(void *arg) {
    submitter *sub = arg;
    round_state *r = sub->r;
    uint64_t *s = &sub->rng;
    fp_batch_request *held[32];
    req_rec *held_rec[32];
    int n_held = 0;
    while (!atomic_load(&r->stop)) {
        const int k = atomic_fetch_add(&r->n_recs, 1);
        if (k >= MAX_REQ) break;
        req_rec *rec = &r->recs[k];
        rec->id = (uint64_t)k;
        rec->input = fz_u64(s) >> 8;
        rec->output = OUT_POISON;
        fp_batch_submit_info info;
        fp_batch_submit_info_default(&info);
        info.input = &rec->input;
        info.input_size = sizeof rec->input;
        info.output = &rec->output;
        info.output_size = sizeof rec->output;
        info.user = rec;
        info.on_done = on_done;
        info.on_done_user = rec;
        const int bad = fz_chance(s, 1, 20);
        info.priority = bad ? (fz_chance(s, 1, 2) ? -2 : r->cfg.priority_levels) : (int)fz_range(s, -1, r->cfg.priority_levels - 1);
        info.timeout_us = fz_chance(s, 1, 3) ? fz_range(s, 1, 3000) : 0;
        if (fz_chance(s, 1, 40)) info.timeout_us = -1;
        const int want_handle = n_held < 32 && fz_chance(s, 1, 2);
        fp_batch_request *h = NULL;
        fp_clear_error();
        fp_status st = fp_batcher_submit(r->b, &info, want_handle ? &h : NULL);
        if (bad || info.timeout_us < 0) {
            FZ_CHECK_CALL(r->run, "fp_batcher_submit (bad priority / timeout)", st, FP_ERR_INVALID_ARGUMENT,
                          bad ? "priority" : "timeout_us");
            CHECK(h == NULL);
        } else if (st == FP_OK) {
            rec->accepted = 1;
            if (want_handle) {
                CHECK(h != NULL && fp_batch_request_user(h) == rec);
                held[n_held] = h;
                held_rec[n_held++] = rec;
            }
        } else {
            FZ_CHECK_CALL(r->run, "fp_batcher_submit", st, -1, NULL);
            CHECK_MSG(st == FP_ERR_QUEUE_FULL || st == FP_ERR_SHUT_DOWN, "submit failed with '%s': %s",
                      fp_status_string(st), fp_last_error());
            CHECK(h == NULL);
        }
        /* act on a held handle now and then */
        if (n_held && fz_chance(s, 1, 3)) {
            int i = (int)fz_range(s, 0, n_held - 1);
            fp_status res = FP_ERR_INTERNAL;
            switch (fz_range(s, 0, 3)) {
            case 0: {
                fp_status cs = fp_batch_request_cancel(held[i]);
                FZ_CHECK_CALL(r->run, "fp_batch_request_cancel", cs, -2, NULL);
                if (cs == FP_OK) {
                    /* completed before cancel returns (with ordering, cancel
                     * waits for the earlier requests) */
                    CHECK_MSG(fp_batch_request_done(held[i]) == 1 && atomic_load(&held_rec[i]->done) == 1,
                              "seed %llu: cancel returned FP_OK before the request completed", (unsigned long long)r->run->seed);
                } else {
                    CHECK_MSG(cs == FP_ERR_NOT_FOUND, "cancel returned '%s'", fp_status_string(cs));
                }
                break;
            }
            case 1: {
                fp_status ws = fp_batch_request_wait(held[i], fz_range(s, 0, 500), &res);
                FZ_CHECK_CALL(r->run, "fp_batch_request_wait", ws, -2, NULL);
                if (ws == FP_OK) CHECK(atomic_load(&held_rec[i]->done) == 1 && (int)res == atomic_load(&held_rec[i]->status));
                else CHECK_MSG(ws == FP_ERR_TIMEOUT, "wait returned '%s'", fp_status_string(ws));
                break;
            }
            default:
                held_rec[i]->handle = NULL;
                fp_batch_request_release(held[i]);
                held[i] = held[--n_held];
                held_rec[i] = held_rec[n_held];
                break;
            }
        }
        if (fz_chance(s, 1, 8)) usleep((useconds_t)fz_range(s, 0, 300));
    }
    /* hand the rest to the main thread, which waits on them after shutdown */
    for (int i = 0; i < n_held; ++i) held_rec[i]->handle = held[i];
    return NULL;
}

static void run_phase_round(fz_run *run, uint64_t *s) {
    round_state *r = calloc(1, sizeof *r);
    r->run = run;
    r->recs = calloc(MAX_REQ, sizeof *r->recs);
    random_valid_config(s, &r->cfg);
    r->fail_items_per_mille = fz_chance(s, 1, 2) ? 0 : (int)fz_range(s, 1, 300);
    r->fail_batch_per_mille = fz_chance(s, 1, 2) ? 0 : (int)fz_range(s, 1, 200);
    r->sleep_us = fz_chance(s, 1, 2) ? 0 : (int)fz_range(s, 1, 400);
    r->exec_rng = fz_u64(s);
    pthread_mutex_init(&r->rng_mu, NULL);
    if (FZ_CHECK_CALL(run, "fp_batcher_create", fp_batcher_create(&r->cfg, fuzz_executor, r, &r->b), FP_OK, NULL) != FP_OK) {
        free(r->recs);
        free(r);
        return;
    }
    pthread_t th[2];
    submitter subs[2];
    for (int i = 0; i < 2; ++i) {
        subs[i].r = r;
        subs[i].rng = fz_u64(s);
        subs[i].id = i;
        pthread_create(&th[i], NULL, submit_main, &subs[i]);
    }
    usleep((useconds_t)fz_range(s, 1000, 30000));
    const int end = (int)fz_range(s, 0, 2);
    const double t0 = fz_now();
    if (end < 2) {
        /* shut down while the submitters may still be submitting */
        FZ_CHECK_CALL(run, "fp_batcher_shutdown (bad mode)", fp_batcher_shutdown(r->b, (fp_batcher_shutdown_mode)5),
                      FP_ERR_INVALID_ARGUMENT, "mode");
        FZ_CHECK_CALL(run, "fp_batcher_shutdown", fp_batcher_shutdown(r->b, (fp_batcher_shutdown_mode)end), FP_OK, NULL);
        FZ_CHECK_CALL(run, "fp_batcher_shutdown (again)", fp_batcher_shutdown(r->b, (fp_batcher_shutdown_mode)(1 - end)), FP_OK, NULL);
    }
    atomic_store(&r->stop, 1);
    for (int i = 0; i < 2; ++i) pthread_join(th[i], NULL);
    if (end == 2) { /* destroy with requests queued: they complete (SHUT_DOWN), handles stay valid */
        CHECK_OK(fp_batcher_destroy(r->b));
        r->b = NULL;
    }
    const double took = fz_now() - t0;
    CHECK_MSG(took < 10.0, "seed %llu iter %ld: shutdown took %.1f s", (unsigned long long)run->seed, run->iter, took);
    fp_batcher_stats st;
    fp_batcher_stats_init(&st);
    /* a submit after shutdown is refused and never calls back */
    if (r->b) {
        req_rec late;
        memset(&late, 0, sizeof late);
        fp_batch_submit_info info;
        fp_batch_submit_info_default(&info);
        info.user = &late;
        info.on_done = on_done;
        info.on_done_user = &late;
        FZ_CHECK_CALL(run, "fp_batcher_submit after shutdown", fp_batcher_submit(r->b, &info, NULL), FP_ERR_SHUT_DOWN, NULL);
        CHECK(atomic_load(&late.done) == 0);
        FZ_CHECK_CALL(run, "fp_batcher_get_stats", fp_batcher_get_stats(r->b, &st), FP_OK, NULL);
        fp_batcher_stats bad_st;
        memset(&bad_st, 0x33, sizeof bad_st);
        bad_st.struct_size = sizeof bad_st - 8;
        FZ_CHECK_CALL(run, "fp_batcher_get_stats (bad struct_size)", fp_batcher_get_stats(r->b, &bad_st),
                      FP_ERR_INVALID_ARGUMENT, "struct_size");
        int64_t hist[4];
        FZ_CHECK_CALL(run, "fp_batcher_get_batch_histogram (n 0)", fp_batcher_get_batch_histogram(r->b, hist, 0),
                      FP_ERR_INVALID_ARGUMENT, "'n'");
    }
    /* every accepted request completed exactly once, consistently */
    const int n = atomic_load(&r->n_recs) < MAX_REQ ? atomic_load(&r->n_recs) : MAX_REQ;
    int64_t accepted = 0, ok = 0, reported = 0;
    for (int i = 0; i < n; ++i) {
        req_rec *rec = &r->recs[i];
        if (rec->handle) {
            fp_status res = FP_ERR_INTERNAL;
            FZ_CHECK_CALL(run, "fp_batch_request_wait (after shutdown)", fp_batch_request_wait(rec->handle, 0, &res), FP_OK, NULL);
            CHECK((int)res == atomic_load(&rec->status));
            fp_batch_request_release(rec->handle);
        }
        const int done = atomic_load(&rec->done), status = atomic_load(&rec->status), exec = atomic_load(&rec->executed);
        if (!rec->accepted) {
            if (done && reported++ < 5) {
                fprintf(stderr, "seed %llu iter %ld: a rejected request called back\n", (unsigned long long)run->seed, run->iter);
                fp_test_failures++;
            }
            continue;
        }
        accepted++;
        ok += status == FP_OK;
        /* an executor status outside fp_status arrives as FP_ERR_INVALID_ARGUMENT */
        const int exec_failed = status == FP_ERR_MISMATCH || status == FP_ERR_CUDA || status == FP_ERR_INVALID_ARGUMENT;
        const int allowed = status == FP_OK || exec_failed || status == FP_ERR_TIMEOUT || status == FP_ERR_CANCELLED ||
                            status == FP_ERR_SHUT_DOWN;
        const int out_ok = status == FP_OK ? rec->output == rec->input * 3 + 1 : exec_failed ? 1 : rec->output == OUT_POISON;
        const int exec_ok = (status == FP_ERR_TIMEOUT || status == FP_ERR_CANCELLED || status == FP_ERR_SHUT_DOWN) ? exec == 0 : exec == 1;
        if ((done != 1 || !allowed || !out_ok || !exec_ok || atomic_load(&rec->done_before_exec)) && reported++ < 5) {
            fprintf(stderr,
                    "seed %llu iter %ld: request %d: %d completions, status '%s', executed %d times%s, output %s\n",
                    (unsigned long long)run->seed, run->iter, i, done, fp_status_string((fp_status)status), exec,
                    atomic_load(&rec->done_before_exec) ? " (after it completed)" : "", out_ok ? "right" : "wrong");
            fp_test_failures++;
        }
    }
    CHECK_MSG(atomic_load(&r->bad_batch_shape) == 0, "seed %llu iter %ld: %ld batches broke max/allowed sizes",
              (unsigned long long)run->seed, run->iter, atomic_load(&r->bad_batch_shape));
    CHECK_MSG(!r->b || (st.submitted == accepted && st.completed_ok == ok &&
                  st.completed_ok + st.failed + st.timed_out + st.cancelled + st.shut_down == st.submitted &&
                  st.queued == 0 && st.executing == 0),
              "seed %llu iter %ld: stats: submitted %lld (model %lld), ok %lld (%lld), failed %lld, timed out %lld, "
              "cancelled %lld, shut down %lld, queued %lld, executing %lld",
              (unsigned long long)run->seed, run->iter, (long long)st.submitted, (long long)accepted,
              (long long)st.completed_ok, (long long)ok, (long long)st.failed, (long long)st.timed_out,
              (long long)st.cancelled, (long long)st.shut_down, (long long)st.queued, (long long)st.executing);
    CHECK_OK(fp_batcher_destroy(r->b));
    pthread_mutex_destroy(&r->rng_mu);
    free(r->recs);
    free(r);
}

/* A hang must fail the test with its seed, not only at CTest's timeout. */
static fz_run *watch_run;
static void *watchdog(void *arg) {
    sleep(60);
    fprintf(stderr, "test_fuzz_batcher: still running after 60 s (seed %llu iter %ld): a hang\n",
            (unsigned long long)watch_run->seed, watch_run->iter);
    _exit(2);
}

int main(int argc, char **argv) {
    fz_run run = fz_run_init(argc, argv, 0x62617463ULL, 40, 4.0);
    uint64_t s = run.seed * 0x9E3779B97F4A7C15ULL + 17;
    watch_run = &run;
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    pthread_detach(wd);
    config_phase(&run, &s, 3000);
    const long config_iters = run.iter;
    run.iter = 0;
    for (; fz_more(&run) && !fz_too_many_failures(); ++run.iter) run_phase_round(&run, &s);
    printf("batcher fuzz: %ld configurations, %ld runs\n", config_iters, run.iter);
    TEST_END();
}
