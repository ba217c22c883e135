/* Test doubles for the caching allocator: a counting, capped upstream that
 * logs every call, and fake events whose completion the test decides (or
 * that complete only after some queries: a device running behind the host),
 * with a logging stream-wait op. */
#ifndef ALLOC_TEST_UTIL_H
#define ALLOC_TEST_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "fastpath/alloc.h"

/* ---- counting / capped upstream ---- */

typedef struct up_call {
    char kind;     /* 'A' alloc ok, 'X' alloc refused, 'F' free */
    size_t bytes;
} up_call;

typedef struct counting_upstream {
    size_t cap;    /* refuse allocations that would hold more (0: none) */
    size_t held, peak_held;
    size_t allocs, frees, refused;
    up_call log[256];
    size_t n_log;  /* calls logged (the log keeps the first 256) */
} counting_upstream;

static fp_status cu_alloc(void *opaque, size_t bytes, void **out) {
    counting_upstream *u = opaque;
    if ((u->cap && u->held + bytes > u->cap) || bytes > ((size_t)1 << 40)) {
        if (u->n_log < 256) u->log[u->n_log] = (up_call){'X', bytes};
        u->n_log++;
        u->refused++;
        return FP_ERR_OUT_OF_MEMORY;
    }
    void *p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!p) return FP_ERR_OUT_OF_MEMORY;
    if (u->n_log < 256) u->log[u->n_log] = (up_call){'A', bytes};
    u->n_log++;
    u->allocs++;
    u->held += bytes;
    if (u->held > u->peak_held) u->peak_held = u->held;
    *out = p;
    return FP_OK;
}

static void cu_free(void *opaque, void *ptr, size_t bytes) {
    counting_upstream *u = opaque;
    if (u->n_log < 256) u->log[u->n_log] = (up_call){'F', bytes};
    u->n_log++;
    u->frees++;
    u->held -= bytes;
    free(ptr);
}

static size_t cu_total(void *opaque) {
    counting_upstream *u = opaque;
    return u->cap;
}

static inline fp_alloc_upstream counting_upstream_table(counting_upstream *u) {
    fp_alloc_upstream t = {cu_alloc, cu_free, cu_total, u};
    return t;
}

/* ---- fake events ---- */

typedef struct fake_event {
    fp_stream stream;
    int done;
    unsigned queries;          /* times this event was queried */
    unsigned complete_after;   /* > 0: done from its complete_after-th query on */
    size_t id;                 /* 1, 2, ... in record order */
    struct fake_event *next;  /* all live events */
} fake_event;

typedef struct fake_wait {
    fp_stream waiter;   /* the stream made to wait */
    fp_stream on;       /* the stream the event was recorded on */
    size_t id;          /* the event's id */
} fake_wait;

typedef struct fake_events {
    fp_stream refuse;  /* record fails on this stream (like a capturing one) */
    fp_stream foreign; /* check_stream rejects this stream (another device's) */
    int foreign_status; /* what check_stream returns for it (0: FP_ERR_INVALID_ARGUMENT) */
    fp_stream refuse_wait; /* the stream-wait op refuses to make this stream wait */
    /* Events recorded while this is > 0 complete by themselves at their
     * complete_after-th query (a device that lags the host by that many
     * polls); 0: only fake_complete / synchronize complete them. */
    unsigned complete_after;
    fake_event *live;
    size_t records, queries, destroys, live_count;
    size_t waits, wait_refusals;
    fake_wait wait_log[64];   /* the first 64 waits */
    fake_wait recent[16];     /* the last 16: wait k (0-based) in recent[k % 16] */
} fake_events;

static fp_status fe_record(void *opaque, fp_stream stream, void **event) {
    fake_events *f = opaque;
    if (f->refuse && stream == f->refuse) return FP_ERR_UNSUPPORTED;
    fake_event *e = calloc(1, sizeof *e);
    if (!e) return FP_ERR_OUT_OF_MEMORY;
    e->stream = stream;
    e->complete_after = f->complete_after;
    e->id = f->records + 1;
    e->next = f->live;
    f->live = e;
    f->records++;
    f->live_count++;
    *event = e;
    return FP_OK;
}

static int fe_query(void *opaque, void *event) {
    fake_events *f = opaque;
    fake_event *e = event;
    f->queries++;
    e->queries++;
    if (e->complete_after && e->queries >= e->complete_after) e->done = 1;
    return e->done;
}

static void fe_sync(void *opaque, void *event) {
    (void)opaque;
    ((fake_event *)event)->done = 1;
}

static void fe_destroy(void *opaque, void *event) {
    fake_events *f = opaque;
    fake_event **link = &f->live;
    while (*link && *link != event) link = &(*link)->next;
    if (*link) *link = ((fake_event *)event)->next;
    f->destroys++;
    f->live_count--;
    free(event);
}

/* Completes every live event recorded on `stream` (NULL: all streams when
 * all != 0). */
static inline void fake_complete(fake_events *f, fp_stream stream, int all) {
    for (fake_event *e = f->live; e; e = e->next)
        if (all || e->stream == stream) e->done = 1;
}

/* Rejects f->foreign (like a stream of another device). */
static fp_status fe_check_stream(void *opaque, fp_stream stream) {
    fake_events *f = opaque;
    if (!f->foreign || stream != f->foreign) return FP_OK;
    return f->foreign_status ? (fp_status)f->foreign_status : FP_ERR_INVALID_ARGUMENT;
}

static inline fp_alloc_event_ops fake_event_ops(fake_events *f) {
    fp_alloc_event_ops ops = {fe_record, fe_query, fe_sync, fe_destroy, fe_check_stream, f};
    return ops;
}

/* The stream-wait op (fp_alloc_set_stream_wait) over fake events: logs who
 * waits on which stream's event; refuses f->refuse_wait. */
static fp_status fe_stream_wait(void *opaque, fp_stream stream, void *event) {
    fake_events *f = opaque;
    if (f->refuse_wait && stream == f->refuse_wait) {
        f->wait_refusals++;
        return FP_ERR_UNSUPPORTED;
    }
    const fake_event *e = event;
    if (f->waits < 64) f->wait_log[f->waits] = (fake_wait){stream, e->stream, e->id};
    f->recent[f->waits % 16] = (fake_wait){stream, e->stream, e->id};
    f->waits++;
    return FP_OK;
}

#endif /* ALLOC_TEST_UTIL_H */
