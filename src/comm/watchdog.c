/* The watchdog: one thread per process, running while communicators exist.
 * Every few milliseconds it refreshes each communicator's ledger (event
 * queries: the stream reached a collective, or finished it) and polls
 * NCCL's asynchronous error. A collective that started and has not ended
 * within the communicator's timeout_ms is hung: the watchdog aborts every
 * rank of its clique in this process with a report naming the ranks that
 * have not entered it (fp_comm_fail_clique). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"

static pthread_mutex_t g_wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wd_cv;
static pthread_once_t g_wd_once = PTHREAD_ONCE_INIT;
static fp_comm *g_wd_list;
static int g_wd_running;

static void wd_init(void) { fp_cond_init_monotonic(&g_wd_cv); }

/* Poll period: a tenth of the smallest timeout, between 2 and 100 ms. */
static int64_t period_ms(void) {
    int64_t p = 100;
    for (fp_comm *c = g_wd_list; c; c = c->wd_next)
        if (c->cfg.timeout_ms >= 0 && c->cfg.timeout_ms / 10 < p) p = c->cfg.timeout_ms / 10;
    return p < 2 ? 2 : p;
}

static void check(fp_comm *c) {
    pthread_mutex_lock(&c->mu);
    if (c->failed != FP_OK) {
        pthread_mutex_unlock(&c->mu);
        fp_comm_run_callback(c);
        return;
    }
    fp_comm_refresh_locked(c);
    const double now_ms = (fp_now_s() - c->t0) * 1e3;
    int hung = 0;
    uint64_t seq = 0;
    char msg[512];
    if (c->cfg.timeout_ms >= 0) {
        for (uint64_t s = c->first_open; s < c->next_seq; ++s) {
            coll_entry *e = &c->ring[s % (uint64_t)c->ring_cap];
            if (e->rec.seq == s && e->rec.state == FP_COLL_STARTED &&
                now_ms - e->rec.start_ms > (double)c->cfg.timeout_ms) {
                hung = 1;
                seq = s;
                snprintf(msg, sizeof msg,
                         "Collective %llu (%s %s x %zu) timed out on rank %d of %d: it started %.0f ms ago and has "
                         "not ended (timeout_ms %lld).",
                         (unsigned long long)s, fp_coll_kind_name(e->rec.kind), fp_dtype_name(e->rec.dtype),
                         e->rec.count, c->rank, c->nranks, now_ms - e->rec.start_ms, (long long)c->cfg.timeout_ms);
                break;
            }
        }
    }
    const int nccl_err = !hung && fp_comm_async_error_locked(c, msg, sizeof msg);
    if (nccl_err) seq = c->first_open;
    pthread_mutex_unlock(&c->mu);
    if (hung) fp_comm_fail_clique(c, FP_ERR_TIMEOUT, seq, msg);
    else if (nccl_err) fp_comm_fail_clique(c, FP_ERR_NCCL, seq, msg);
}

static void *wd_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_wd_mu);
    while (g_wd_list) {
        struct timespec ts;
        fp_deadline_after_ms(&ts, period_ms());
        pthread_cond_timedwait(&g_wd_cv, &g_wd_mu, &ts);
        for (fp_comm *c = g_wd_list; c; c = c->wd_next) check(c);
    }
    g_wd_running = 0;
    pthread_mutex_unlock(&g_wd_mu);
    return NULL;
}

void fp_watchdog_add(fp_comm *c) {
    pthread_once(&g_wd_once, wd_init);
    pthread_mutex_lock(&g_wd_mu);
    c->wd_next = g_wd_list;
    g_wd_list = c;
    c->watched = 1;
    if (!g_wd_running) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &attr, wd_main, NULL) == 0) g_wd_running = 1;
        else fprintf(stderr, "libfastpath: cannot start the communication watchdog thread: hung collectives "
                             "will not be aborted\n");
        pthread_attr_destroy(&attr);
    }
    pthread_cond_signal(&g_wd_cv); /* a shorter timeout: a shorter period */
    pthread_mutex_unlock(&g_wd_mu);
}

void fp_watchdog_remove(fp_comm *c) {
    pthread_mutex_lock(&g_wd_mu);
    if (c->watched) {
        fp_comm **pp = &g_wd_list;
        while (*pp && *pp != c) pp = &(*pp)->wd_next;
        if (*pp) *pp = c->wd_next;
        c->watched = 0;
    }
    pthread_cond_signal(&g_wd_cv);
    pthread_mutex_unlock(&g_wd_mu);
}
