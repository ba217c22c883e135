/* Pinned pools (pinned.h): the pool's layout, shared by the pool
 * (pinned.c) and the pin primitives below it (pinned_pin.c). Not installed. */
#ifndef FASTPATH_PINNED_INTERNAL_H
#define FASTPATH_PINNED_INTERNAL_H

#include <pthread.h>

#include "fastpath/pinned.h"
#include "internal.h"

struct fp_pinned_pool {
    int host_mode;             /* CPU context: a pin is a first touch */
    int device;                /* CUDA ordinal (CUDA contexts) */
    size_t page, chunk, budget;
    size_t step;               /* a reserve's segment (fp_pinned_pool_reserve_segment) */
    fp_allocator *alloc;
    pthread_mutex_t mu;        /* st, the reserve's state */
    /* The statistics as they accumulate (the reserve's figures are filled
     * in by fp_pinned_pool_get_stats). */
    fp_pinned_stats st;
    /* A segment the reserve thread pinned and is about to hand to the
     * allocator (its upstream alloc takes it on that thread). Only the
     * reserve thread touches it (destroy after joining it). */
    void *stash;
    size_t stash_bytes;
    /* The reserve. reserve_mu serializes starting and joining its thread;
     * the fields below it are guarded by mu. */
    pthread_mutex_t reserve_mu;
    pthread_cond_t reserve_cv; /* CLOCK_MONOTONIC; signalled when busy drops */
    pthread_t thread;
    int thread_started;
    int running;               /* the thread still takes target increases */
    int busy;                  /* the thread has not finished its clean-up */
    int cancel;
    size_t target, done;
    fp_status reserve_status;
    char reserve_msg[FP_ERROR_MAX];
};

/* Pins [base, base + bytes) in one call under the process-wide pin lock
 * (cudaHostRegister, or a first touch of its pages in host mode), measured
 * into the counters (the lock wait as a foreground one unless
 * `background`). One registration per range: a copy over two registrations
 * fails on a GPU. Returns the pin's status (nothing pinned on failure). */
fp_status fp_pinned_pin_range(fp_pinned_pool *p, char *base, size_t bytes, int background);
/* Undoes fp_pinned_pin_range of the range at base: cudaHostUnregister under
 * the pin lock; nothing in host mode. */
fp_status fp_pinned_unpin(fp_pinned_pool *p, char *base);
/* One atomic OR of 0 per page of [base, base + bytes): faults every page in
 * writable, keeping its data. Counted as touch time. No lock held. */
void fp_pinned_touch(fp_pinned_pool *p, char *base, size_t bytes);

#endif /* FASTPATH_PINNED_INTERNAL_H */
