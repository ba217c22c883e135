/* A fixed pool of worker threads for the CPU implementations of the ops.
 * The caller of fp_parallel_for works too, so a pool of size N has N-1
 * threads. Calls are serialized by a mutex; nesting is not supported.
 *
 * A call costs no more than its work plus a wake-up: the caller runs chunks
 * itself from the start and, once every chunk is claimed, closes the job and
 * waits only for the workers that joined it (a worker that wakes late finds
 * the job closed and goes back to sleep; waiting for it cost tens to hundreds
 * of microseconds per call on a loaded host). Workers spin briefly after a
 * job before they sleep, so the next call of a sequence of ops finds them
 * awake (no wake-up syscall, no scheduling latency). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

/* How long an idle worker watches for the next job before it sleeps. */
#define POOL_SPIN_S 50e-6

struct fp_thread_pool {
    int size;
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t call_mu; /* one parallel_for at a time */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    atomic_ulong generation; /* written under mu; read by spinning workers */
    atomic_int stop;
    int open;     /* the current job accepts workers (under mu) */
    int running;  /* workers inside the current job (under mu) */
    int sleepers; /* workers blocked on work_cv (under mu) */
    int caller_waiting;
    void (*fn)(void *, size_t, size_t);
    void *arg;
    size_t n, grain;
    atomic_size_t next;
};

static void run_chunks(fp_thread_pool *p) {
    for (;;) {
        size_t begin = atomic_fetch_add(&p->next, p->grain);
        if (begin >= p->n) return;
        size_t end = begin + p->grain < p->n ? begin + p->grain : p->n;
        p->fn(p->arg, begin, end);
    }
}

/* Watches for a generation other than `seen` for up to POOL_SPIN_S. */
static void spin_for_work(fp_thread_pool *p, unsigned long seen) {
    const double t0 = fp_now_s();
    for (int i = 0;; ++i) {
        if (atomic_load_explicit(&p->generation, memory_order_relaxed) != seen ||
            atomic_load_explicit(&p->stop, memory_order_relaxed))
            return;
        fp_cpu_relax();
        if ((i & 63) == 63 && fp_now_s() - t0 > POOL_SPIN_S) return;
    }
}

static void *worker_main(void *arg) {
    fp_thread_pool *p = arg;
    unsigned long seen = 0;
    for (;;) {
        spin_for_work(p, seen);
        pthread_mutex_lock(&p->mu);
        while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen) {
            p->sleepers++;
            pthread_cond_wait(&p->work_cv, &p->mu);
            p->sleepers--;
        }
        if (atomic_load(&p->stop)) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = atomic_load(&p->generation);
        if (!p->open) { /* finished without this worker */
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        p->running++;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p);
        pthread_mutex_lock(&p->mu);
        if (--p->running == 0 && p->caller_waiting) pthread_cond_signal(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

fp_status fp_thread_pool_create(int threads, fp_thread_pool **out) {
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(threads >= 1, "threads must be >= 1 (got %d)", threads);
    fp_thread_pool *p = calloc(1, sizeof *p);
    if (!p) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "thread pool");
    p->size = threads;
    pthread_mutex_init(&p->call_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->generation, 0);
    atomic_init(&p->stop, 0);
    p->threads = calloc((size_t)threads, sizeof(pthread_t));
    if (!p->threads) { fp_thread_pool_destroy(p); return fp_set_error(FP_ERR_OUT_OF_MEMORY, "thread pool"); }
    for (int i = 0; i < threads - 1; ++i) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) break;
        p->nthreads++;
    }
    *out = p;
    return FP_OK;
}

void fp_thread_pool_destroy(fp_thread_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; ++i) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->call_mu);
    free(p);
}

int fp_thread_pool_size(const fp_thread_pool *p) { return p ? p->nthreads + 1 : 1; }

void fp_parallel_for(fp_thread_pool *p, size_t n, size_t grain,
                     void (*fn)(void *arg, size_t begin, size_t end), void *arg) {
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (!p || p->nthreads == 0 || n <= grain) { fn(arg, 0, n); return; }
    pthread_mutex_lock(&p->call_mu);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->next, 0);
    p->open = 1;
    atomic_fetch_add(&p->generation, 1);
    if (p->sleepers > 0) pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p);
    /* Every chunk is claimed: close the job, wait for the workers in it. */
    pthread_mutex_lock(&p->mu);
    p->open = 0;
    while (p->running > 0) {
        p->caller_waiting = 1;
        pthread_cond_wait(&p->done_cv, &p->mu);
    }
    p->caller_waiting = 0;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->call_mu);
}
