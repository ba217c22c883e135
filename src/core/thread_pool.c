/* A fixed pool of worker threads for the CPU implementations of the ops.
 * The caller of fp_parallel_for works too, so a pool of size N has N-1
 * threads. Calls are serialized by a mutex; nesting is not supported. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

struct fp_thread_pool {
    int size;
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t call_mu; /* one parallel_for at a time */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    unsigned long generation;
    int pending; /* workers still running the current job */
    int stop;
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

static void *worker_main(void *arg) {
    fp_thread_pool *p = arg;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); return NULL; }
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done_cv);
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
    p->stop = 1;
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
    p->pending = p->nthreads;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->call_mu);
}
