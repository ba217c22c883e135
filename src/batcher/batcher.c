/* The dynamic batcher: queues, batch formation, timeouts, completion.
 *
 * One mutex (b->mu) guards every queue, counter and request state. Threads:
 *   executors (cfg.executor_threads): when idle, form a batch under the lock
 *     (dispatch rule in batch_size_now), run the executor unlocked, then
 *     finish the batch's requests;
 *   timer: sleeps until the earliest queue deadline (a min-heap) and expires
 *     requests, so timeouts fire while every executor is busy; it runs no
 *     callback, so a slow one cannot delay the next expiry;
 *   completion: delivers what the timer expired, and what an executor
 *     finished when that executor has a next batch ready to run (else the
 *     executor delivers it itself).
 * A finished request is delivered (callback, then waiters woken) outside the
 * lock. With preserve_ordering, finished requests wait in submission order
 * and one thread at a time (the "pump") delivers the ready prefix.
 *
 * Waiting on a handle is a futex on the request's word (no lock): delivery
 * sets DONE and, only if a waiter announced itself, moves the waiters onto
 * the delivering thread's gate, woken together (see `waker`): each waiting
 * client is woken exactly once and the deliverer is not preempted per wake.
 * `live` counts accepted requests not yet delivered and `deliveries` threads
 * inside delivery: shutdown waits for both to reach 0, so the batcher
 * outlives every touch of it (a completed request's handle never touches
 * its batcher again).
 *
 * Per-request cost (64 closed-loop clients, no-op model, 2-core VM): about
 * 1 us of batcher work in user space; the rest is the kernel putting the
 * client to sleep and waking it (one context switch and one wake-up per
 * request, several us each on a VM), which no batcher design avoids for a
 * client that blocks.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "batcher_internal.h"
#include "internal.h"

enum { REQ_QUEUED = 0, REQ_EXECUTING = 1, REQ_FINISHED = 2 };

struct fp_batch_request {
    fp_batch_item item;          /* input/output/user as submitted */
    fp_batcher *owner;
    int level;
    int in_delayed;              /* in the level's delayed list (DELAY action) */
    int timeout_delay;           /* DELAY instead of REJECT on timeout */
    int state;                   /* REQ_*, under owner->mu */
    int heap_index;              /* in the deadline heap, -1 if not */
    double t_submit, deadline;   /* seconds; deadline 0 = none */
    fp_status result;            /* final status, set when finished */
    fp_batch_done_fn on_done;
    void *on_done_user;
    fp_batch_request *prev, *next;   /* queue list or a delivery list */
    fp_batch_request *onext;         /* submission-order list (ordering) */
    atomic_int refs;                 /* the batcher's + the handle's */
    atomic_int handle;               /* 1 while the submitter's handle is out */
    atomic_uint word;                /* futex word: WORD_DONE | WORD_WAITERS */
};

/* req->word: DONE is set once, after the callback returned (release: the
 * result is visible to whoever sees it). WAITERS is set by a thread about to
 * sleep in fp_batch_request_wait, so delivery makes the wake syscall only
 * when somebody sleeps. */
enum { WORD_DONE = 1u, WORD_WAITERS = 2u };

typedef struct req_list {
    fp_batch_request *head, *tail;
} req_list;

typedef struct exec_slot {
    fp_batcher *b;
    pthread_t thread;
    fp_batch_item *items;
    fp_batch_request **reqs;
} exec_slot;

struct fp_batcher {
    fp_batcher_config cfg;
    int max_batch;               /* effective: min(max, largest allowed) */
    int dispatch_threshold;      /* queue length that may dispatch at once */
    double delay_s;
    fp_batch_executor_fn exec;
    void *exec_user;

    pthread_mutex_t mu;
    pthread_cond_t cv_work;      /* idle executors */
    pthread_cond_t cv_timer;     /* timer thread */
    pthread_cond_t cv_idle;      /* shutdown: everything delivered */

    req_list main_q[FP_BATCHER_MAX_PRIORITIES];
    req_list delayed_q[FP_BATCHER_MAX_PRIORITIES];
    int level_count[FP_BATCHER_MAX_PRIORITIES];
    int queued, executing, idle_executors;

    fp_batch_request **heap;     /* min-heap on deadline */
    int heap_n, heap_cap;
    double timer_target;         /* what the timer sleeps until; 0 = awake */

    fp_batch_request *ohead, *otail; /* submission order (preserve_ordering) */
    int pumping;

    int64_t live;                /* accepted, not yet delivered */
    int deliveries;              /* threads delivering now */
    int accepting, draining, stopping;
    int shutdown_started, shutdown_done;

    exec_slot *slots;
    int slots_started;
    pthread_t timer_thread;
    int timer_started;
    /* Completion thread: delivers what executors finish, so an executor
     * starts its next batch at once instead of waking clients first. */
    req_list outbox;
    int deliverer_waiting;
    pthread_cond_t cv_deliver;
    pthread_t deliver_thread;
    int deliver_started;

    /* statistics */
    fp_batcher_stats counters;   /* counter fields only */
    fp_sample_ring ring_queue, ring_e2e, ring_exec;
    int64_t *hist;               /* [max_batch + 1] */
    int64_t real_slots;
};

/* The batcher whose executor or callback the calling thread is running. */
static _Thread_local fp_batcher *tl_inside;

/* The requests whose callbacks run on this thread now, innermost first (a
 * callback may cancel another request, whose callback then runs nested). */
typedef struct callback_frame {
    const fp_batch_request *req;
    const struct callback_frame *outer;
} callback_frame;
static _Thread_local const callback_frame *tl_callbacks;

/* ------------------------------------------------------------------------ */
/*  Small helpers                                                           */
/* ------------------------------------------------------------------------ */

static void abs_timespec(double t_s, struct timespec *ts) {
    if (t_s < 0) t_s = 0;
    ts->tv_sec = (time_t)t_s;
    ts->tv_nsec = (long)((t_s - (double)ts->tv_sec) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

/* The executors sleep until a queue delay expires and the timer thread until
 * a timeout: with Linux's default 50 us timer slack they would wake up to
 * 50 us late (an executor idling, a timeout firing late). 1 us instead, for
 * the batcher's own threads only. */
static void precise_timers(void) { prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0); }

static void list_push(req_list *l, fp_batch_request *r) {
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail) l->tail->next = r;
    else l->head = r;
    l->tail = r;
}

static void list_remove(req_list *l, fp_batch_request *r) {
    if (r->prev) r->prev->next = r->next;
    else l->head = r->next;
    if (r->next) r->next->prev = r->prev;
    else l->tail = r->prev;
    r->prev = r->next = NULL;
}

static void req_unref(fp_batch_request *r) {
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) free(r);
}

/* Private futex on a request word: sleep while *w == val (until the absolute
 * CLOCK_MONOTONIC time ts, or forever with ts NULL); wake every sleeper. */
static int futex_wait_abs(atomic_uint *w, unsigned val, const struct timespec *ts) {
    return (int)syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_BITSET_PRIVATE, val, ts, NULL,
                        FUTEX_BITSET_MATCH_ANY);
}

static void futex_wake_all(atomic_uint *w) {
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Moves every thread sleeping on `from` (whose value must be `val`) to sleep
 * on `to`, waking none. Returns how many moved, or -1 (value changed). */
static long futex_requeue_all(atomic_uint *from, unsigned val, atomic_uint *to) {
    return syscall(SYS_futex, (unsigned *)from, FUTEX_CMP_REQUEUE_PRIVATE, 0,
                   (void *)(uintptr_t)INT_MAX, (unsigned *)to, val);
}

/* Wakes the waiters of many requests with one wake syscall. Waking them one
 * syscall at a time lets each woken client preempt the delivering thread
 * (wake-up preemption): the deliverer and the clients then alternate, two
 * context switches per request. Instead, delivery moves each request's
 * sleepers onto this gate (a requeue wakes nobody) and wakes the gate once
 * at the end: at most one preemption, the clients then run back to back.
 * The gate lives on the delivering thread's stack: woken threads return from
 * the futex call and never touch it again. At most WAKER_MAX threads wait on
 * the gate, so the first client of a large batch is not kept waiting for the
 * whole batch's delivery (16, 32 and 64 measured alike on 2 cores; 4 is
 * slower). */
enum { WAKER_MAX = 32 };

typedef struct waker {
    atomic_uint gate;
    int pending;    /* threads moved onto the gate, not yet woken */
} waker;

static void waker_flush(waker *wk) {
    if (wk->pending > 0) futex_wake_all(&wk->gate);
    wk->pending = 0;
}

/* ---- deadline heap ---- */

static void heap_swap(fp_batcher *b, int i, int j) {
    fp_batch_request *t = b->heap[i];
    b->heap[i] = b->heap[j];
    b->heap[j] = t;
    b->heap[i]->heap_index = i;
    b->heap[j]->heap_index = j;
}

static void heap_up(fp_batcher *b, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (b->heap[p]->deadline <= b->heap[i]->deadline) break;
        heap_swap(b, i, p);
        i = p;
    }
}

static void heap_down(fp_batcher *b, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < b->heap_n && b->heap[l]->deadline < b->heap[m]->deadline) m = l;
        if (r < b->heap_n && b->heap[r]->deadline < b->heap[m]->deadline) m = r;
        if (m == i) break;
        heap_swap(b, i, m);
        i = m;
    }
}

static int heap_push(fp_batcher *b, fp_batch_request *r) {
    if (b->heap_n == b->heap_cap) {
        int cap = b->heap_cap ? 2 * b->heap_cap : 64;
        fp_batch_request **h = realloc(b->heap, (size_t)cap * sizeof *h);
        if (!h) return -1;
        b->heap = h;
        b->heap_cap = cap;
    }
    r->heap_index = b->heap_n;
    b->heap[b->heap_n++] = r;
    heap_up(b, r->heap_index);
    return 0;
}

static void heap_remove(fp_batcher *b, fp_batch_request *r) {
    int i = r->heap_index;
    if (i < 0) return;
    r->heap_index = -1;
    b->heap_n--;
    if (i == b->heap_n) return;
    b->heap[i] = b->heap[b->heap_n];
    b->heap[i]->heap_index = i;
    heap_down(b, i);
    heap_up(b, i);
}

/* ------------------------------------------------------------------------ */
/*  Finishing and delivery                                                  */
/* ------------------------------------------------------------------------ */

/* Takes a queued request out of its list and the heap (under mu). */
static void unqueue(fp_batcher *b, fp_batch_request *r) {
    list_remove(r->in_delayed ? &b->delayed_q[r->level] : &b->main_q[r->level], r);
    heap_remove(b, r);
    b->level_count[r->level]--;
    b->queued--;
}

/* Records the final status (under mu). Without ordering the request joins
 * `local`, delivered by the caller; with ordering it waits in the order list. */
static void finish(fp_batcher *b, fp_batch_request *r, fp_status st, double now, req_list *local) {
    r->result = st;
    r->state = REQ_FINISHED;
    fp_batcher_stats *c = &b->counters;
    switch (st) {
    case FP_OK:
        c->completed_ok++;
        fp_sample_ring_push(&b->ring_e2e, (now - r->t_submit) * 1e6);
        break;
    case FP_ERR_TIMEOUT: c->timed_out++; break;
    case FP_ERR_CANCELLED: c->cancelled++; break;
    case FP_ERR_SHUT_DOWN: c->shut_down++; break;
    default: c->failed++; break;
    }
    if (!b->cfg.preserve_ordering) list_push(local, r);
}

/* Completes one request outside the lock: callback, then DONE; its waiters
 * move to wk's gate (woken by waker_flush). */
static void deliver_one(fp_batcher *b, fp_batch_request *r, waker *wk) {
    if (r->on_done) {
        fp_batcher *outer = tl_inside;
        callback_frame frame = {r, tl_callbacks};
        tl_inside = b;
        tl_callbacks = &frame;
        r->on_done(r, r->result, r->on_done_user);
        tl_callbacks = frame.outer;
        tl_inside = outer;
    }
    /* Our reference keeps r alive until after the requeue (a release in
     * the callback drops only the handle's, see fp_batch_request_release).
     * A waiter that had not yet slept sees the changed word and does not
     * sleep. */
    unsigned prev = atomic_exchange_explicit(&r->word, WORD_DONE, memory_order_acq_rel);
    if (prev & WORD_WAITERS) {
        long moved = futex_requeue_all(&r->word, WORD_DONE, &wk->gate);
        if (moved > 0) wk->pending += (int)moved;
        else if (moved < 0) futex_wake_all(&r->word); /* cannot happen: be safe */
        if (wk->pending >= WAKER_MAX) waker_flush(wk);
    }
    req_unref(r);
}

static void delivered(fp_batcher *b, int64_t n) {
    b->live -= n;
    b->deliveries--;
    if (b->live == 0 && b->deliveries == 0) pthread_cond_broadcast(&b->cv_idle);
}

/* Delivers what finish() produced. Called and returns with mu held; drops it
 * around callbacks. */
static void deliver_pending(fp_batcher *b, req_list *local) {
    if (!b->cfg.preserve_ordering) {
        if (!local->head) return;
        fp_batch_request *r = local->head;
        local->head = local->tail = NULL;
        b->deliveries++;
        pthread_mutex_unlock(&b->mu);
        int64_t n = 0;
        waker wk = {0, 0};
        while (r) {
            fp_batch_request *next = r->next;
            r->prev = r->next = NULL;
            deliver_one(b, r, &wk);
            r = next;
            ++n;
        }
        waker_flush(&wk);
        pthread_mutex_lock(&b->mu);
        delivered(b, n);
        return;
    }
    /* Ordered: one pump at a time delivers the finished prefix; a thread that
     * finds the pump busy leaves its requests to it. */
    if (b->pumping) return;
    b->pumping = 1;
    b->deliveries++;
    waker wk = {0, 0};
    for (;;) {
        while (b->ohead && b->ohead->state == REQ_FINISHED) {
            fp_batch_request *r = b->ohead;
            b->ohead = r->onext;
            if (!b->ohead) b->otail = NULL;
            r->onext = NULL;
            pthread_mutex_unlock(&b->mu);
            deliver_one(b, r, &wk);
            pthread_mutex_lock(&b->mu);
            b->live--;
        }
        if (wk.pending == 0) break;
        /* Wake unlocked; then look again: requests finished meanwhile were
         * left to this pump. The pump stops only when, under the lock, the
         * head is not finished and nobody is left to wake. */
        pthread_mutex_unlock(&b->mu);
        waker_flush(&wk);
        pthread_mutex_lock(&b->mu);
    }
    b->pumping = 0;
    delivered(b, 0);
}

/* Leaves what finish() produced to the completion thread (under mu): the
 * calling thread runs no callback. With ordering `local` is empty and the
 * completion thread delivers the ready prefix unless a pump is running. */
static void hand_to_deliverer(fp_batcher *b, req_list *local) {
    if (local->head) {
        if (b->outbox.tail) {
            b->outbox.tail->next = local->head;
            local->head->prev = b->outbox.tail;
        } else {
            b->outbox.head = local->head;
        }
        b->outbox.tail = local->tail;
        local->head = local->tail = NULL;
    }
    if (b->deliverer_waiting) pthread_cond_signal(&b->cv_deliver);
}

/* ------------------------------------------------------------------------ */
/*  Batch formation                                                         */
/* ------------------------------------------------------------------------ */

/* How many requests to dispatch now (0: none), and if 0 with a non-empty
 * queue, the time at which the oldest request's delay expires. */
static int batch_size_now(fp_batcher *b, double now, double *wake_at) {
    *wake_at = 0;
    if (b->queued == 0) return 0;
    int avail = b->queued < b->max_batch ? b->queued : b->max_batch;
    if (avail == b->max_batch || b->draining || b->delay_s <= 0) return avail;
    for (int i = b->cfg.num_preferred_batch_sizes - 1; i >= 0; --i)
        if (b->cfg.preferred_batch_sizes[i] <= avail) return b->cfg.preferred_batch_sizes[i];
    double oldest = 0;
    int have = 0;
    for (int l = 0; l < b->cfg.priority_levels; ++l) {
        const fp_batch_request *h[2] = {b->main_q[l].head, b->delayed_q[l].head};
        for (int k = 0; k < 2; ++k)
            if (h[k] && (!have || h[k]->t_submit < oldest)) {
                oldest = h[k]->t_submit;
                have = 1;
            }
    }
    double due = oldest + b->delay_s;
    if (now >= due) return avail;
    *wake_at = due;
    return 0;
}

static int padded_size(const fp_batcher *b, int n) {
    for (int i = 0; i < b->cfg.num_allowed_batch_sizes; ++i)
        if (b->cfg.allowed_batch_sizes[i] >= n) return b->cfg.allowed_batch_sizes[i];
    return n;
}

/* Pops n requests in dispatch order (priority, main before delayed, FIFO). */
static void take_batch(fp_batcher *b, int n, double now, fp_batch_request **out) {
    int k = 0;
    for (int l = 0; l < b->cfg.priority_levels && k < n; ++l) {
        req_list *lists[2] = {&b->main_q[l], &b->delayed_q[l]};
        for (int q = 0; q < 2 && k < n; ++q)
            while (lists[q]->head && k < n) {
                fp_batch_request *r = lists[q]->head;
                unqueue(b, r);
                r->state = REQ_EXECUTING;
                fp_sample_ring_push(&b->ring_queue, (now - r->t_submit) * 1e6);
                out[k++] = r;
            }
    }
}

static void *executor_main(void *arg) {
    exec_slot *s = arg;
    fp_batcher *b = s->b;
    tl_inside = b;
    precise_timers();
    pthread_mutex_lock(&b->mu);
    while (!b->stopping) {
        double now = fp_now_s(), wake_at;
        int n = batch_size_now(b, now, &wake_at);
        if (n == 0) {
            b->idle_executors++;
            if (wake_at > 0) {
                struct timespec ts;
                abs_timespec(wake_at, &ts);
                pthread_cond_timedwait(&b->cv_work, &b->mu, &ts);
            } else {
                pthread_cond_wait(&b->cv_work, &b->mu);
            }
            b->idle_executors--;
            continue;
        }
        take_batch(b, n, now, s->reqs);
        b->executing += n;
        int padded = padded_size(b, n);
        /* Another idle executor may form the next batch meanwhile. */
        if (b->queued > 0 && b->idle_executors > 0) pthread_cond_signal(&b->cv_work);
        pthread_mutex_unlock(&b->mu);

        for (int i = 0; i < n; ++i) {
            s->items[i] = s->reqs[i]->item;
            s->items[i].status = FP_OK;
        }
        fp_context *tctx = b->cfg.trace_context;
        const uint64_t span = tctx ? fp_ctx_trace_begin(tctx, NULL, "batch_execute", "batch", 0, 0) : 0;
        double t0 = fp_now_s();
        fp_status rc = b->exec(b->exec_user, s->items, n, padded);
        double t1 = fp_now_s();
        if (span) fp_ctx_trace_end(tctx, span);

        pthread_mutex_lock(&b->mu);
        fp_batcher_stats *c = &b->counters;
        c->batches++;
        c->padded_slots += padded;
        b->real_slots += n;
        c->executor_busy_s += t1 - t0;
        b->hist[n]++;
        fp_sample_ring_push(&b->ring_exec, (t1 - t0) * 1e6);
        req_list local = {NULL, NULL};
        for (int i = 0; i < n; ++i) {
            fp_status st = s->items[i].status;
            if (st == FP_OK && rc != FP_OK) st = rc;
            /* The executor is the caller's code: a value outside fp_status
             * would reach on_done, waiters and the stats as is. */
            if ((int)st < FP_OK || (int)st > FP_ERR_INTERNAL) st = FP_ERR_INVALID_ARGUMENT;
            finish(b, s->reqs[i], st, t1, &local);
        }
        b->executing -= n;
        /* A batch is ready: hand the completions to the completion thread
         * and run it. Otherwise deliver here (the executor would idle). */
        double ignored;
        if (batch_size_now(b, t1, &ignored) == 0) {
            deliver_pending(b, &local);
            continue;
        }
        hand_to_deliverer(b, &local);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static void *deliverer_main(void *arg) {
    fp_batcher *b = arg;
    tl_inside = b;
    pthread_mutex_lock(&b->mu);
    while (!b->stopping) {
        if (b->outbox.head) {
            req_list list = b->outbox;
            b->outbox.head = b->outbox.tail = NULL;
            deliver_pending(b, &list);
            continue;
        }
        if (b->cfg.preserve_ordering && !b->pumping && b->ohead &&
            b->ohead->state == REQ_FINISHED) {
            req_list none = {NULL, NULL};
            deliver_pending(b, &none);
            continue;
        }
        b->deliverer_waiting = 1;
        pthread_cond_wait(&b->cv_deliver, &b->mu);
        b->deliverer_waiting = 0;
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/*  Timer                                                                   */
/* ------------------------------------------------------------------------ */

static void *timer_main(void *arg) {
    fp_batcher *b = arg;
    tl_inside = b;
    precise_timers();
    pthread_mutex_lock(&b->mu);
    while (!b->stopping) {
        double now = fp_now_s();
        req_list local = {NULL, NULL};
        int expired = 0;
        while (b->heap_n > 0 && b->heap[0]->deadline <= now) {
            fp_batch_request *r = b->heap[0];
            heap_remove(b, r);
            if (r->timeout_delay) {
                /* DELAY: behind every request of its level not yet timed out. */
                list_remove(&b->main_q[r->level], r);
                r->in_delayed = 1;
                list_push(&b->delayed_q[r->level], r);
                b->counters.delayed++;
            } else {
                unqueue(b, r);
                finish(b, r, FP_ERR_TIMEOUT, now, &local);
                expired = 1;
            }
        }
        b->timer_target = 0; /* awake: submit need not signal */
        /* The completion thread runs the callbacks: one that is slow here
         * would hold up every later expiry (requests past their deadline
         * would stay queued, even be batched). */
        if (expired) hand_to_deliverer(b, &local);
        if (b->heap_n > 0) {
            b->timer_target = b->heap[0]->deadline;
            struct timespec ts;
            abs_timespec(b->timer_target, &ts);
            pthread_cond_timedwait(&b->cv_timer, &b->mu, &ts);
        } else {
            b->timer_target = 1e300;
            pthread_cond_wait(&b->cv_timer, &b->mu);
        }
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/*  Configuration                                                           */
/* ------------------------------------------------------------------------ */

/* The first published size of fp_batcher_config (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define BATCHER_CONFIG_SIZE_FIRST offsetof(fp_batcher_config, trace_context)

fp_status fp_batcher_config_default_sized(fp_batcher_config *out, size_t struct_size) {
    fp_batcher_config defaults, *config = &defaults;
    memset(config, 0, sizeof *config);
    config->struct_size = sizeof *config;
    config->max_batch_size = 32;
    config->max_queue_delay_us = 500;
    config->priority_levels = 1;
    config->executor_threads = 1;
    config->stats_window = 65536;
    return fp_struct_init(out, struct_size, config, BATCHER_CONFIG_SIZE_FIRST, sizeof *config, "fp_batcher_config");
}

void(fp_batcher_config_default)(fp_batcher_config *config) {
    if (config) (void)fp_batcher_config_default_sized(config, BATCHER_CONFIG_SIZE_FIRST);
}

static fp_status check_sizes(const char *name, const int *v, int n, int max_batch) {
    FP_CHECK_ARG(n >= 0 && n <= FP_BATCHER_MAX_SIZES, "config field 'num_%s' must be in 0..%d (got %d)",
                 name, FP_BATCHER_MAX_SIZES, n);
    for (int i = 0; i < n; ++i) {
        FP_CHECK_ARG(v[i] >= 1 && v[i] <= max_batch,
                     "config field '%s[%d]' = %d must be in 1..max_batch_size (%d)", name, i, v[i],
                     max_batch);
        FP_CHECK_ARG(i == 0 || v[i] > v[i - 1],
                     "config field '%s' must be strictly increasing (%s[%d] = %d after %d)", name,
                     name, i, v[i], v[i - 1]);
    }
    return FP_OK;
}

fp_status fp_batcher_config_validate(const fp_batcher_config *c) {
    FP_CHECK_NOT_NULL(c);
    fp_batcher_config full;
    FP_STRUCT_IN(&c, full, BATCHER_CONFIG_SIZE_FIRST, fp_batcher_config_default, "fp_batcher_config (config)");
    FP_CHECK_ARG(c->max_batch_size >= 1 && c->max_batch_size <= FP_BATCHER_MAX_BATCH,
                 "config field 'max_batch_size' must be in 1..%d (got %d)", FP_BATCHER_MAX_BATCH,
                 c->max_batch_size);
    FP_CHECK_ARG(c->max_queue_delay_us >= 0 && c->max_queue_delay_us <= 3600LL * 1000000,
                 "config field 'max_queue_delay_us' must be in 0..3.6e9 (got %lld)",
                 (long long)c->max_queue_delay_us);
    FP_TRY(check_sizes("preferred_batch_sizes", c->preferred_batch_sizes,
                       c->num_preferred_batch_sizes, c->max_batch_size));
    FP_TRY(check_sizes("allowed_batch_sizes", c->allowed_batch_sizes, c->num_allowed_batch_sizes,
                       c->max_batch_size));
    if (c->num_allowed_batch_sizes > 0 && c->num_preferred_batch_sizes > 0) {
        int top = c->allowed_batch_sizes[c->num_allowed_batch_sizes - 1];
        int pref = c->preferred_batch_sizes[c->num_preferred_batch_sizes - 1];
        FP_CHECK_ARG(pref <= top,
                     "config field 'preferred_batch_sizes' has %d, above the largest allowed batch "
                     "size %d (batches never exceed it)", pref, top);
    }
    FP_CHECK_ARG(c->priority_levels >= 1 && c->priority_levels <= FP_BATCHER_MAX_PRIORITIES,
                 "config field 'priority_levels' must be in 1..%d (got %d)",
                 FP_BATCHER_MAX_PRIORITIES, c->priority_levels);
    FP_CHECK_ARG(c->default_priority >= 0 && c->default_priority < c->priority_levels,
                 "config field 'default_priority' must be in 0..%d (got %d)",
                 c->priority_levels - 1, c->default_priority);
    for (int l = 0; l < c->priority_levels; ++l) {
        const fp_batcher_queue_policy *p = &c->queue_policy[l];
        FP_CHECK_ARG(p->max_queue_size >= 0,
                     "config field 'queue_policy[%d].max_queue_size' must be >= 0 (got %d)", l,
                     p->max_queue_size);
        FP_CHECK_ARG(p->default_timeout_us >= 0,
                     "config field 'queue_policy[%d].default_timeout_us' must be >= 0 (got %lld)",
                     l, (long long)p->default_timeout_us);
        FP_CHECK_ARG(p->timeout_action == FP_BATCHER_TIMEOUT_REJECT ||
                         p->timeout_action == FP_BATCHER_TIMEOUT_DELAY,
                     "config field 'queue_policy[%d].timeout_action' is %d, not REJECT or DELAY",
                     l, (int)p->timeout_action);
    }
    FP_CHECK_ARG(c->preserve_ordering == 0 || c->preserve_ordering == 1,
                 "config field 'preserve_ordering' must be 0 or 1 (got %d)", c->preserve_ordering);
    FP_CHECK_ARG(c->executor_threads >= 1 && c->executor_threads <= FP_BATCHER_MAX_THREADS,
                 "config field 'executor_threads' must be in 1..%d (got %d)",
                 FP_BATCHER_MAX_THREADS, c->executor_threads);
    FP_CHECK_ARG(c->stats_window >= 16 && c->stats_window <= (1 << 24),
                 "config field 'stats_window' must be in 16..16777216 (got %d)", c->stats_window);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Create / shutdown / destroy                                             */
/* ------------------------------------------------------------------------ */

static void free_batcher(fp_batcher *b) {
    if (b->slots) {
        for (int i = 0; i < b->cfg.executor_threads; ++i) {
            free(b->slots[i].items);
            free(b->slots[i].reqs);
        }
        free(b->slots);
    }
    fp_sample_ring_free(&b->ring_queue);
    fp_sample_ring_free(&b->ring_e2e);
    fp_sample_ring_free(&b->ring_exec);
    free(b->hist);
    free(b->heap);
    pthread_cond_destroy(&b->cv_deliver);
    pthread_cond_destroy(&b->cv_idle);
    pthread_cond_destroy(&b->cv_timer);
    pthread_cond_destroy(&b->cv_work);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

/* Stops and joins the threads (no request may be queued or running). */
static void stop_threads(fp_batcher *b) {
    pthread_mutex_lock(&b->mu);
    b->stopping = 1;
    pthread_cond_broadcast(&b->cv_work);
    pthread_cond_broadcast(&b->cv_timer);
    pthread_cond_broadcast(&b->cv_deliver);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->slots_started; ++i) pthread_join(b->slots[i].thread, NULL);
    if (b->timer_started) pthread_join(b->timer_thread, NULL);
    if (b->deliver_started) pthread_join(b->deliver_thread, NULL);
    b->slots_started = 0;
    b->timer_started = 0;
    b->deliver_started = 0;
}

/* The first published size of fp_batch_item (0.2), the executor's array
 * element. */
#define BATCH_ITEM_SIZE_FIRST sizeof(fp_batch_item)

fp_status fp_batcher_create_sized(const fp_batcher_config *config, fp_batch_executor_fn executor,
                                  void *executor_user, size_t item_size, fp_batcher **out) {
    FP_CHECK_ARG(executor != NULL, "argument 'executor' is NULL");
    FP_CHECK_NOT_NULL(out);
    /* Every executor has the one item layout so far; once fp_batch_item
     * grows, a batch for an executor built against an older header is
     * handed over in its layout (item_size apart). */
    FP_TRY(fp_struct_size_check(item_size, BATCH_ITEM_SIZE_FIRST, sizeof(fp_batch_item),
                                "fp_batch_item (the executor's item_size)"));
    fp_batcher_config def;
    if (!config) {
        fp_batcher_config_default(&def);
        config = &def;
    }
    FP_STRUCT_IN(&config, def, BATCHER_CONFIG_SIZE_FIRST, fp_batcher_config_default, "fp_batcher_config (config)");
    FP_TRY(fp_batcher_config_validate(config));

    fp_batcher *b = calloc(1, sizeof *b);
    if (!b) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "batcher");
    b->cfg = *config;
    b->exec = executor;
    b->exec_user = executor_user;
    b->max_batch = config->max_batch_size;
    if (config->num_allowed_batch_sizes > 0) {
        int top = config->allowed_batch_sizes[config->num_allowed_batch_sizes - 1];
        if (top < b->max_batch) b->max_batch = top;
    }
    b->dispatch_threshold = config->num_preferred_batch_sizes > 0
                                ? config->preferred_batch_sizes[0]
                                : b->max_batch;
    b->delay_s = (double)config->max_queue_delay_us * 1e-6;
    b->accepting = 1;
    b->counters.struct_size = sizeof b->counters;
    if (pthread_mutex_init(&b->mu, NULL) != 0 || fp_cond_init_monotonic(&b->cv_work) != 0 ||
        fp_cond_init_monotonic(&b->cv_timer) != 0 || fp_cond_init_monotonic(&b->cv_idle) != 0 ||
        fp_cond_init_monotonic(&b->cv_deliver) != 0) {
        free(b);
        return fp_set_error(FP_ERR_INTERNAL, "cannot initialize the batcher's mutex/condvars");
    }
    fp_status st = FP_OK;
    b->hist = calloc((size_t)b->max_batch + 1, sizeof *b->hist);
    b->slots = calloc((size_t)config->executor_threads, sizeof *b->slots);
    if (!b->hist || !b->slots) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "batcher tables");
    for (int i = 0; st == FP_OK && i < config->executor_threads; ++i) {
        b->slots[i].b = b;
        b->slots[i].items = malloc((size_t)b->max_batch * sizeof *b->slots[i].items);
        b->slots[i].reqs = malloc((size_t)b->max_batch * sizeof *b->slots[i].reqs);
        if (!b->slots[i].items || !b->slots[i].reqs)
            st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "batch buffers of %d requests", b->max_batch);
    }
    if (st == FP_OK) st = fp_sample_ring_init(&b->ring_queue, config->stats_window);
    if (st == FP_OK) st = fp_sample_ring_init(&b->ring_e2e, config->stats_window);
    if (st == FP_OK) st = fp_sample_ring_init(&b->ring_exec, config->stats_window);
    if (st == FP_OK) {
        if (pthread_create(&b->timer_thread, NULL, timer_main, b) != 0)
            st = fp_set_error(FP_ERR_INTERNAL, "cannot start the batcher's timer thread");
        else
            b->timer_started = 1;
    }
    if (st == FP_OK) {
        if (pthread_create(&b->deliver_thread, NULL, deliverer_main, b) != 0)
            st = fp_set_error(FP_ERR_INTERNAL, "cannot start the batcher's completion thread");
        else
            b->deliver_started = 1;
    }
    for (int i = 0; st == FP_OK && i < config->executor_threads; ++i) {
        if (pthread_create(&b->slots[i].thread, NULL, executor_main, &b->slots[i]) != 0)
            st = fp_set_error(FP_ERR_INTERNAL, "cannot start executor thread %d of %d", i,
                              config->executor_threads);
        else
            b->slots_started++;
    }
    if (st != FP_OK) {
        stop_threads(b);
        free_batcher(b);
        return st;
    }
    *out = b;
    return FP_OK;
}

fp_status(fp_batcher_create)(const fp_batcher_config *config, fp_batch_executor_fn executor,
                             void *executor_user, fp_batcher **out) {
    return fp_batcher_create_sized(config, executor, executor_user, BATCH_ITEM_SIZE_FIRST, out);
}

fp_status fp_batcher_shutdown(fp_batcher *b, fp_batcher_shutdown_mode mode) {
    FP_CHECK_ARG(b != NULL, "argument 'batcher' is NULL");
    FP_CHECK_ARG(mode == FP_BATCHER_SHUTDOWN_DRAIN || mode == FP_BATCHER_SHUTDOWN_CANCEL,
                 "argument 'mode' is %d, not DRAIN (0) or CANCEL (1)", (int)mode);
    FP_CHECK_ARG(tl_inside != b,
                 "fp_batcher_shutdown called from the batcher's own executor or callback");
    pthread_mutex_lock(&b->mu);
    if (b->shutdown_started) {
        while (!b->shutdown_done) pthread_cond_wait(&b->cv_idle, &b->mu);
        pthread_mutex_unlock(&b->mu);
        return FP_OK;
    }
    b->shutdown_started = 1;
    b->accepting = 0;
    if (mode == FP_BATCHER_SHUTDOWN_CANCEL) {
        double now = fp_now_s();
        req_list local = {NULL, NULL};
        for (int l = 0; l < b->cfg.priority_levels; ++l) {
            req_list *lists[2] = {&b->main_q[l], &b->delayed_q[l]};
            for (int q = 0; q < 2; ++q)
                while (lists[q]->head) {
                    fp_batch_request *r = lists[q]->head;
                    unqueue(b, r);
                    finish(b, r, FP_ERR_SHUT_DOWN, now, &local);
                }
        }
        deliver_pending(b, &local);
    } else {
        b->draining = 1;
        pthread_cond_broadcast(&b->cv_work);
    }
    while (b->live > 0 || b->deliveries > 0) pthread_cond_wait(&b->cv_idle, &b->mu);
    pthread_mutex_unlock(&b->mu);
    stop_threads(b);
    pthread_mutex_lock(&b->mu);
    b->shutdown_done = 1;
    pthread_cond_broadcast(&b->cv_idle);
    pthread_mutex_unlock(&b->mu);
    return FP_OK;
}

fp_status fp_batcher_destroy(fp_batcher *b) {
    if (!b) return FP_OK;
    /* From its own thread it would wait for itself, then free what that
     * thread still runs on: refused, the batcher left as it was. */
    FP_CHECK_ARG(tl_inside != b,
                 "fp_batcher_destroy called from the batcher's own executor or callback: nothing "
                 "done, the batcher keeps running (destroy it from another thread)");
    FP_TRY(fp_batcher_shutdown(b, FP_BATCHER_SHUTDOWN_CANCEL));
    free_batcher(b);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Submit                                                                  */
/* ------------------------------------------------------------------------ */

/* The first published size of fp_batch_submit_info (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define BATCH_SUBMIT_INFO_SIZE_FIRST sizeof(fp_batch_submit_info)

fp_status fp_batch_submit_info_default_sized(fp_batch_submit_info *out, size_t struct_size) {
    fp_batch_submit_info defaults, *info = &defaults;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    info->priority = -1;
    return fp_struct_init(out, struct_size, info, BATCH_SUBMIT_INFO_SIZE_FIRST, sizeof *info, "fp_batch_submit_info");
}

void(fp_batch_submit_info_default)(fp_batch_submit_info *info) {
    if (info) (void)fp_batch_submit_info_default_sized(info, BATCH_SUBMIT_INFO_SIZE_FIRST);
}

fp_status fp_batcher_submit(fp_batcher *b, const fp_batch_submit_info *info,
                            fp_batch_request **out) {
    FP_CHECK_ARG(b != NULL, "argument 'batcher' is NULL");
    FP_CHECK_NOT_NULL(info);
    fp_batch_submit_info full;
    FP_STRUCT_IN(&info, full, BATCH_SUBMIT_INFO_SIZE_FIRST, fp_batch_submit_info_default, "fp_batch_submit_info (info)");
    FP_CHECK_ARG(info->priority >= -1 && info->priority < b->cfg.priority_levels,
                 "info field 'priority' must be -1 or in 0..%d (got %d)",
                 b->cfg.priority_levels - 1, info->priority);
    FP_CHECK_ARG(info->timeout_us >= 0, "info field 'timeout_us' must be >= 0 (got %lld)",
                 (long long)info->timeout_us);

    fp_batch_request *r = malloc(sizeof *r);
    if (!r) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "batch request");
    memset(r, 0, sizeof *r);
    r->item.input = info->input;
    r->item.input_size = info->input_size;
    r->item.output = info->output;
    r->item.output_size = info->output_size;
    r->item.user = info->user;
    r->owner = b;
    r->level = info->priority < 0 ? b->cfg.default_priority : info->priority;
    r->heap_index = -1;
    r->on_done = info->on_done;
    r->on_done_user = info->on_done_user;
    atomic_init(&r->refs, out ? 2 : 1);
    atomic_init(&r->handle, out ? 1 : 0);
    atomic_init(&r->word, 0);
    const fp_batcher_queue_policy *pol = &b->cfg.queue_policy[r->level];
    int64_t timeout_us = pol->default_timeout_us;
    if (info->timeout_us > 0 && (timeout_us == 0 || info->timeout_us < timeout_us))
        timeout_us = info->timeout_us;
    r->timeout_delay = pol->timeout_action == FP_BATCHER_TIMEOUT_DELAY;

    fp_status st = FP_OK;
    pthread_mutex_lock(&b->mu);
    double now = fp_now_s();
    r->t_submit = now;
    if (!b->accepting) {
        b->counters.rejected_shut_down++;
        st = fp_set_error(FP_ERR_SHUT_DOWN, "batcher is shut down: request not accepted");
    } else if (pol->max_queue_size > 0 && b->level_count[r->level] >= pol->max_queue_size) {
        b->counters.rejected_queue_full++;
        st = fp_set_error(FP_ERR_QUEUE_FULL, "queue of priority level %d is full (%d requests)",
                          r->level, pol->max_queue_size);
    } else if (timeout_us > 0) {
        r->deadline = now + (double)timeout_us * 1e-6;
        if (heap_push(b, r) != 0) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "timeout heap");
    }
    if (st != FP_OK) {
        pthread_mutex_unlock(&b->mu);
        free(r);
        return st;
    }
    r->state = REQ_QUEUED;
    list_push(&b->main_q[r->level], r);
    b->level_count[r->level]++;
    b->queued++;
    b->live++;
    b->counters.submitted++;
    if (b->cfg.preserve_ordering) {
        if (b->otail) b->otail->onext = r;
        else b->ohead = r;
        b->otail = r;
    }
    if (r->deadline > 0 && r->deadline < b->timer_target) pthread_cond_signal(&b->cv_timer);
    /* Wake an idle executor when it must start the delay clock (first
     * request) or may dispatch at once. */
    if (b->idle_executors > 0 &&
        (b->queued == 1 || b->queued >= b->dispatch_threshold || b->delay_s <= 0 || b->draining))
        pthread_cond_signal(&b->cv_work);
    if (out) *out = r;
    pthread_mutex_unlock(&b->mu);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Request handles                                                         */
/* ------------------------------------------------------------------------ */

/* Sleeps until req is DONE (1) or the absolute CLOCK_MONOTONIC time ts
 * passes (0; NULL: no limit). */
static int wait_done(fp_batch_request *req, const struct timespec *ts) {
    unsigned w = atomic_load_explicit(&req->word, memory_order_acquire);
    while (!(w & WORD_DONE)) {
        /* Announce the sleep, then sleep only while the word is still
         * exactly that (delivery swaps in DONE and wakes). */
        if (!(w & WORD_WAITERS) &&
            !atomic_compare_exchange_weak_explicit(&req->word, &w, w | WORD_WAITERS,
                                                   memory_order_acquire, memory_order_acquire))
            continue;
        w |= WORD_WAITERS;
        int rc = futex_wait_abs(&req->word, w, ts);
        w = atomic_load_explicit(&req->word, memory_order_acquire);
        if (rc != 0 && errno == ETIMEDOUT && !(w & WORD_DONE)) return 0;
    }
    return 1;
}

fp_status fp_batch_request_wait(fp_batch_request *req, int64_t timeout_us, fp_status *result) {
    FP_CHECK_ARG(req != NULL, "argument 'req' is NULL");
    if (!(atomic_load_explicit(&req->word, memory_order_acquire) & WORD_DONE)) {
        /* It completes when its callback returns: waiting in it never ends. */
        for (const callback_frame *f = tl_callbacks; f; f = f->outer)
            FP_CHECK_ARG(f->req != req,
                         "fp_batch_request_wait called from the request's own completion "
                         "callback (it completes when that callback returns)");
        if (timeout_us == 0) return fp_set_error(FP_ERR_TIMEOUT, "request still pending");
        struct timespec ts;
        if (timeout_us > 0) abs_timespec(fp_now_s() + (double)timeout_us * 1e-6, &ts);
        if (!wait_done(req, timeout_us > 0 ? &ts : NULL))
            return fp_set_error(FP_ERR_TIMEOUT, "request still pending after %lld us",
                                (long long)timeout_us);
    }
    if (result) *result = req->result;
    return FP_OK;
}

int fp_batch_request_done(const fp_batch_request *req) {
    return req ? (int)(atomic_load_explicit(&((fp_batch_request *)req)->word,
                                            memory_order_acquire) &
                       WORD_DONE)
               : 0;
}

void *fp_batch_request_user(const fp_batch_request *req) { return req ? req->item.user : NULL; }

void fp_batch_request_release(fp_batch_request *req) {
    /* Drops the handle's reference, once. A request submitted without a
     * handle, or released again while the batcher still holds it (e.g. from
     * its callback), keeps the batcher's reference: delivery goes on. */
    if (req && atomic_exchange_explicit(&req->handle, 0, memory_order_acq_rel)) req_unref(req);
}

fp_status fp_batch_request_cancel(fp_batch_request *req) {
    FP_CHECK_ARG(req != NULL, "argument 'req' is NULL");
    /* A completed request may outlive its batcher: look at it alone. One not
     * yet completed keeps the batcher alive (shutdown waits for it, and
     * destroy may not run concurrently with cancel). */
    if (atomic_load_explicit(&req->word, memory_order_acquire) & WORD_DONE)
        return fp_set_error(FP_ERR_NOT_FOUND, "request already completed");
    fp_batcher *b = req->owner;
    pthread_mutex_lock(&b->mu);
    if (req->state != REQ_QUEUED) {
        pthread_mutex_unlock(&b->mu);
        return fp_set_error(FP_ERR_NOT_FOUND, "request is executing or completed: not cancelled");
    }
    if (b->cfg.preserve_ordering && tl_inside == b) {
        /* It would complete behind earlier requests, which this thread (the
         * one delivering in order, or an executor) may be the one to finish. */
        pthread_mutex_unlock(&b->mu);
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "fp_batch_request_cancel with preserve_ordering called from the "
                            "batcher's own executor or callback: it cannot complete the request "
                            "before returning; nothing cancelled (cancel from another thread)");
    }
    req_list local = {NULL, NULL};
    unqueue(b, req);
    finish(b, req, FP_ERR_CANCELLED, fp_now_s(), &local);
    if (!b->cfg.preserve_ordering) {
        deliver_pending(b, &local); /* its own callback only */
        pthread_mutex_unlock(&b->mu);
        return FP_OK;
    }
    /* In order: the completion thread (or the pump running now) delivers it
     * after every earlier request; wait for that here, running no callback.
     * Our reference keeps it alive if its callback releases the handle. */
    atomic_fetch_add_explicit(&req->refs, 1, memory_order_relaxed);
    hand_to_deliverer(b, &local);
    pthread_mutex_unlock(&b->mu);
    wait_done(req, NULL);
    req_unref(req);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Statistics                                                              */
/* ------------------------------------------------------------------------ */

/* The first published size of fp_batcher_stats (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define BATCHER_STATS_SIZE_FIRST sizeof(fp_batcher_stats)

fp_status fp_batcher_stats_init_sized(fp_batcher_stats *out, size_t struct_size) {
    fp_batcher_stats defaults, *stats = &defaults;
    memset(stats, 0, sizeof *stats);
    stats->struct_size = sizeof *stats;
    return fp_struct_init(out, struct_size, stats, BATCHER_STATS_SIZE_FIRST, sizeof *stats, "fp_batcher_stats");
}

static double *ring_copy(const fp_sample_ring *r) {
    double *v = malloc((size_t)(r->n > 0 ? r->n : 1) * sizeof *v);
    if (v && r->n > 0) memcpy(v, r->v, (size_t)r->n * sizeof *v); /* order is irrelevant */
    return v;
}

void(fp_batcher_stats_init)(fp_batcher_stats *stats) {
    if (stats) (void)fp_batcher_stats_init_sized(stats, BATCHER_STATS_SIZE_FIRST);
}

fp_status fp_batcher_get_stats(fp_batcher *b, fp_batcher_stats *stats) {
    FP_CHECK_ARG(b != NULL, "argument 'batcher' is NULL");
    FP_CHECK_NOT_NULL(stats);
    FP_TRY(fp_struct_size_check(stats->struct_size, BATCHER_STATS_SIZE_FIRST, sizeof *stats, "fp_batcher_stats (stats)"));
    pthread_mutex_lock(&b->mu);
    fp_batcher_stats s = b->counters;
    s.queued = b->queued;
    s.executing = b->executing;
    int64_t real = b->real_slots;
    int nq = b->ring_queue.n, ne = b->ring_e2e.n, nx = b->ring_exec.n;
    double *q = ring_copy(&b->ring_queue), *e = ring_copy(&b->ring_e2e),
           *x = ring_copy(&b->ring_exec);
    pthread_mutex_unlock(&b->mu);
    fp_status st = FP_OK;
    if (!q || !e || !x) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "stats snapshot");
    s.mean_batch_size = s.batches > 0 ? (double)real / (double)s.batches : 0.0;
    s.padding_waste = s.padded_slots > 0 ? 1.0 - (double)real / (double)s.padded_slots : 0.0;
    if (st == FP_OK) st = fp_latency_summarize(q, nq, &s.queue_time);
    if (st == FP_OK) st = fp_latency_summarize(e, ne, &s.end_to_end);
    if (st == FP_OK) st = fp_latency_summarize(x, nx, &s.executor);
    free(q);
    free(e);
    free(x);
    if (st == FP_OK) {
        s.struct_size = sizeof s;
        st = fp_struct_write(stats, &s, BATCHER_STATS_SIZE_FIRST, sizeof s, "fp_batcher_stats (stats)");
    }
    return st;
}

fp_status fp_batcher_get_batch_histogram(fp_batcher *b, int64_t *counts, int n) {
    FP_CHECK_ARG(b != NULL, "argument 'batcher' is NULL");
    FP_CHECK_NOT_NULL(counts);
    FP_CHECK_ARG(n >= 1, "argument 'n' must be >= 1 (got %d)", n);
    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < n; ++i) counts[i] = i <= b->max_batch ? b->hist[i] : 0;
    pthread_mutex_unlock(&b->mu);
    return FP_OK;
}

fp_status fp_batcher_reset_stats(fp_batcher *b) {
    FP_CHECK_ARG(b != NULL, "argument 'batcher' is NULL");
    pthread_mutex_lock(&b->mu);
    memset(&b->counters, 0, sizeof b->counters);
    b->counters.struct_size = sizeof b->counters;
    b->real_slots = 0;
    memset(b->hist, 0, ((size_t)b->max_batch + 1) * sizeof *b->hist);
    fp_sample_ring_clear(&b->ring_queue);
    fp_sample_ring_clear(&b->ring_e2e);
    fp_sample_ring_clear(&b->ring_exec);
    pthread_mutex_unlock(&b->mu);
    return FP_OK;
}
