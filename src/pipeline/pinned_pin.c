/* The pin primitives of pinned pools (pinned.h): the process-wide pin lock,
 * touching pages, and pinning / unpinning a range in one call, measured. The pool (pinned.c) builds on these. */
#include "alloc/alloc_internal.h"
#include "pinned_internal.h"

/* ---- the pin lock ----
 * One for the whole process, as the driver's is: every pool's pins take
 * turns here, one range each, so a pin waits for at most the ranges of the
 * threads that asked before it. A ticket lock, not a bare mutex: a reserve
 * that pins segment after segment would otherwise take the mutex back
 * before the waiter it just woke gets to run, and the waiter could wait for
 * every segment instead of one. */
static pthread_mutex_t g_pin_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_pin_cv = PTHREAD_COND_INITIALIZER;
static uint64_t g_pin_next, g_pin_serving;

/* Returns 1 when the lock was taken by another thread at the call. */
static int pin_lock(void) {
    pthread_mutex_lock(&g_pin_mu);
    const uint64_t me = g_pin_next++;
    const int contended = me != g_pin_serving;
    while (me != g_pin_serving) pthread_cond_wait(&g_pin_cv, &g_pin_mu);
    pthread_mutex_unlock(&g_pin_mu);
    return contended;
}

static void pin_unlock(void) {
    pthread_mutex_lock(&g_pin_mu);
    g_pin_serving++;
    pthread_cond_broadcast(&g_pin_cv);
    pthread_mutex_unlock(&g_pin_mu);
}

/* An atomic OR of 0 is a write (the page is faulted in writable, as pinning
 * needs) that never changes the data, even if another thread writes the
 * same byte meanwhile (user memory being registered). */
static void touch_pages(char *s, char *e, size_t page) {
    for (char *q = s; q < e; q = (char *)(((uintptr_t)q + page) & ~(uintptr_t)(page - 1)))
        (void)__atomic_fetch_or((volatile unsigned char *)q, (unsigned char)0, __ATOMIC_RELAXED);
}

void fp_pinned_touch(fp_pinned_pool *p, char *base, size_t bytes) {
    const double t0 = fp_now_s();
    touch_pages(base, base + bytes, p->page);
    const double ms = (fp_now_s() - t0) * 1e3;
    pthread_mutex_lock(&p->mu);
    p->st.touch_ms += ms;
    pthread_mutex_unlock(&p->mu);
}

static void record_pin(fp_pinned_pool *p, int background, int contended, double wait_s, double pin_s,
                       size_t bytes) {
    const double wait_ms = wait_s * 1e3, pin_ms = pin_s * 1e3;
    pthread_mutex_lock(&p->mu);
    p->st.pin_calls++;
    p->st.pinned_bytes_total += bytes;
    p->st.pin_ms += pin_ms;
    if (pin_ms > p->st.longest_pin_call_ms) p->st.longest_pin_call_ms = pin_ms;
    if (!background) {
        p->st.pin_lock_wait_ms += wait_ms;
        if (wait_ms > p->st.max_pin_lock_wait_ms) p->st.max_pin_lock_wait_ms = wait_ms;
        p->st.pin_lock_contended += (uint64_t)contended;
    }
    pthread_mutex_unlock(&p->mu);
}

/* One range, one registration: the driver fails a copy whose host range
 * spans two registrations (cudaErrorInvalidValue, as for one that spans
 * registered and pageable memory), so a block or a registration is never
 * pinned in pieces. What bounds a pin call is the size of what is pinned:
 * a reserve pins segments of one chunk each. */
fp_status fp_pinned_pin_range(fp_pinned_pool *p, char *base, size_t bytes, int background) {
    const double t0 = fp_now_s();
    const int contended = pin_lock();
    const double t1 = fp_now_s();
    fp_status st = FP_OK;
    if (p->host_mode) touch_pages(base, base + bytes, p->page);
    else st = fp_alloc_host_register(p->device, base, bytes);
    const double t2 = fp_now_s();
    pin_unlock();
    record_pin(p, background, contended, t1 - t0, t2 - t1, st == FP_OK ? bytes : 0);
    return st;
}

fp_status fp_pinned_unpin(fp_pinned_pool *p, char *base) {
    if (p->host_mode) return FP_OK; /* a touch leaves nothing to undo */
    (void)pin_lock(); /* cudaHostUnregister holds the driver's lock too */
    const double t0 = fp_now_s();
    fp_status st = fp_alloc_host_unregister(p->device, base);
    const double ms = (fp_now_s() - t0) * 1e3;
    pin_unlock();
    pthread_mutex_lock(&p->mu);
    p->st.unpin_calls++;
    p->st.unpin_ms += ms;
    pthread_mutex_unlock(&p->mu);
    return st;
}
