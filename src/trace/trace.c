/* The span ring of a context (trace.h): enable / clear, begin / end of op
 * spans, user ranges and the step counter, explicit records, read-back.
 *
 * A span's handle is its begin number (seq, from 1, never reused on a
 * context); it lives in slot (seq - 1) % capacity, so a begin overwrites
 * the oldest span when the ring is full and an end finds its slot taken by
 * a newer span when that happened (then it was already counted as dropped).
 * CPU spans are final at their end; CUDA spans hold two events, or under
 * the CUPTI timer an external correlation id (trace_cupti.h), and are
 * resolved when read (resolve_locked, resolve_cupti_locked). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fastpath/alloc.h"
#include "trace/trace_cupti.h"
#include "trace/trace_internal.h"

#define MAX_CAPACITY ((size_t)1 << 26)

enum { SLOT_EMPTY = 0, SLOT_OPEN = 1, SLOT_DONE = 2 };

typedef struct trace_slot {
    uint64_t seq;          /* the span's handle; 0: never used since the ring was made */
    int state;             /* SLOT_* */
    int resolved;          /* end_s final (and start_s) */
    int start_known;       /* start_s final (CUDA: resolved, the span maybe still open) */
    int host;              /* timed by the host clock (CPU, "sync" spans, fp_trace_record): no events */
    cudaEvent_t ev[2];     /* CUDA: begin and end, created at the slot's first use */
    /* The CUPTI timer (trace_cupti.h): the span's own device work, from
     * its records; the host clock at begin and end; the last handle issued
     * before its end (spans begun inside it have handles up to it). */
    int cupti;             /* timed by CUPTI records instead of events */
    int kernel;            /* timed by its kernels' stamps (the kernel timer) */
    int pushed;            /* its external id was pushed on thread `tid` */
    uint64_t tid;
    uint64_t dev_start_ns, dev_end_ns; /* dev_end_ns 0: no device work filed */
    uint64_t end_mark;
    double host_start_s, host_end_s;
    fp_trace_span span;
} trace_slot;

typedef struct range_entry {
    uint64_t span;         /* the range's own span, 0 when not recorded */
    uint64_t nvtx_id;      /* its NVTX range (fp_nvtx_range_start) when nvtx */
    int nvtx;
    char module[FP_TRACE_MODULE_MAX];
    char stage[FP_TRACE_STAGE_MAX];
} range_entry;

struct fp_trace_state {
    pthread_mutex_t mu;
    trace_slot *slots;
    size_t cap;
    uint64_t next_seq;     /* the last handle issued */
    uint64_t lo_seq;       /* handles below it were cleared */
    size_t open;
    uint64_t recorded, dropped, skipped_capturing, unresolved;
    uint64_t host_timed; /* kernel-timed spans no kernel stamped (the host clock's times) */
    int64_t step;
    int depth;
    range_entry stack[FP_TRACE_MAX_DEPTH];
    fp_allocator *alloc;
    cudaEvent_t base;      /* CUDA: start times count from it */
    double base_s;         /* ... which completed at this clock reading */
    uint64_t anchor_seq;   /* CUDA: the newest span whose start is resolved (0: none) */
    fp_trace_timer timer;  /* for spans begun from now on (CUDA contexts) */
    int timer_chosen;      /* the environment's default applied (first enable) */
    uint32_t cupti_index;  /* the CUPTI collector's ring index, 0: not attached */
    /* The kernel timer (span_stamp.h): stamp_cap records of
     * FP_SPAN_STAMP_WORDS words in device memory (span q's at (q - 1) %
     * stamp_cap), then one word the calibration kernel writes; their host
     * copy; the global timer read calib_gt_ns at calib_host_s on the event
     * timer's time line (base_s + event time; to within calib_err_s). */
    unsigned long long *stamps, *stamps_host;
    size_t stamp_cap;
    cudaEvent_t calib_ev[2]; /* around the calibration kernel */
    uint64_t calib_gt_ns;
    double calib_host_s, calib_err_s;
};

/* The kernel timer's records at most (2 MiB of device memory): a ring of
 * more spans shares them, and a span whose record a later one took before
 * the spans were read counts as unresolved. */
#define MAX_STAMPS ((size_t)1 << 16)

/* ctx->trace, published once by create_state. */
static struct fp_trace_state *state_of(const fp_context *ctx) {
    return __atomic_load_n(&ctx->trace, __ATOMIC_ACQUIRE);
}

/* Errors of the quiet (op hook) path record no message: `quiet` selects. */
#define TRACE_FAIL(quiet, st, ...) ((quiet) ? (st) : fp_set_error((st), __VA_ARGS__))

static void copy_text(char *dst, size_t cap, const char *src) {
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

static uint64_t thread_id(void) {
    static _Thread_local uint64_t tid;
    if (!tid) tid = (uint64_t)syscall(SYS_gettid);
    return tid;
}

static void free_slots(trace_slot *slots, size_t cap) {
    if (!slots) return;
    for (size_t i = 0; i < cap; ++i)
        for (int k = 0; k < 2; ++k)
            if (slots[i].ev[k]) cudaEventDestroy(slots[i].ev[k]);
    free(slots);
}

static void state_destroy(fp_context *ctx) {
    struct fp_trace_state *t = state_of(ctx);
    if (!t) return;
    fp_cupti_detach(t->cupti_index);
    if (ctx->kind == FP_DEVICE_CUDA) (void)fp_ctx_activate(ctx); /* best effort: the context is going */
    free_slots(t->slots, t->cap);
    if (t->base) cudaEventDestroy(t->base);
    if (t->stamps) cudaFree(t->stamps);
    free(t->stamps_host);
    for (int k = 0; k < 2; ++k)
        if (t->calib_ev[k]) cudaEventDestroy(t->calib_ev[k]);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&t->mu);
    free(t);
    ctx->trace = NULL;
}

/* kernels/timing/bandwidth.h (declared here: the trace layer's host-only
 * builds, the sanitizers', do not see the kernels' headers): one thread
 * writes the GPU's global timer (ns) to *out. */
cudaError_t fp_launch_clock_read(unsigned long long *out, cudaStream_t stream);

/* The kernel timer's clock (t->mu held, t->stamps allocated, ctx's device
 * current): the global timer read by a one-thread kernel between two events
 * on the default stream, three times. The events are the event timer's
 * clock (the base event and base_s, rebase), so stamped and event-timed
 * spans share one time line: the tightest pair places the reading, to
 * within half its width (the kernel's launch and run on the device: a few
 * microseconds; the host's wake-up after a wait does not enter). Without a
 * base event (never enabled) nothing is calibrated. */
static fp_status calibrate(fp_context *ctx, struct fp_trace_state *t) {
    if (!t->base) return FP_OK;
    unsigned long long *word = t->stamps + t->stamp_cap * FP_SPAN_STAMP_WORDS;
    for (int k = 0; k < 2; ++k)
        if (!t->calib_ev[k]) FP_CUDA_TRY(cudaEventCreate(&t->calib_ev[k]));
    double best = -1;
    for (int i = 0; i < 3; ++i) {
        unsigned long long g = 0;
        float a_ms = 0, b_ms = 0;
        FP_CUDA_TRY(cudaEventRecord(t->calib_ev[0], ctx->stream));
        FP_CUDA_TRY(fp_launch_clock_read(word, ctx->stream));
        FP_CUDA_TRY(cudaEventRecord(t->calib_ev[1], ctx->stream));
        FP_CUDA_TRY(cudaEventSynchronize(t->calib_ev[1]));
        FP_CUDA_TRY(cudaEventElapsedTime(&a_ms, t->base, t->calib_ev[0]));
        FP_CUDA_TRY(cudaEventElapsedTime(&b_ms, t->base, t->calib_ev[1]));
        FP_CUDA_TRY(cudaMemcpy(&g, word, sizeof g, cudaMemcpyDeviceToHost));
        const double a = (double)a_ms * 1e-3, b = (double)b_ms * 1e-3;
        if (best < 0 || b - a < best) {
            best = b - a;
            t->calib_gt_ns = g;
            t->calib_host_s = t->base_s + 0.5 * (a + b);
        }
    }
    t->calib_err_s = 0.5 * best;
    return FP_OK;
}

/* Gives t the kernel timer's records for a ring of `cap` spans (t->mu
 * held): min(cap, MAX_STAMPS) of them, zeroed (no span has handle 0), and
 * calibrates. A CUDA context whose timer is the kernel timer only; nothing
 * to do when they fit already. On error t's records are as they were. */
static fp_status fit_stamps(fp_context *ctx, struct fp_trace_state *t, size_t cap) {
    if (ctx->kind != FP_DEVICE_CUDA || t->timer != FP_TRACE_TIMER_KERNEL || cap == 0) return FP_OK;
    const size_t want = cap < MAX_STAMPS ? cap : MAX_STAMPS;
    if (t->stamps && t->stamp_cap == want) return FP_OK;
    FP_TRY(fp_ctx_activate(ctx));
    const size_t words = (want + 1) * FP_SPAN_STAMP_WORDS, bytes = words * sizeof(unsigned long long);
    unsigned long long *host = malloc(bytes);
    if (!host) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace: the kernel timer's %zu records", want);
    unsigned long long *dev = NULL;
    cudaError_t e = cudaMalloc((void **)&dev, bytes);
    if (e == cudaSuccess) e = cudaMemset(dev, 0, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (dev) cudaFree(dev);
        free(host);
        return fp_set_error(e == cudaErrorMemoryAllocation ? FP_ERR_OUT_OF_MEMORY : FP_ERR_CUDA,
                            "trace: the kernel timer's %zu records (%zu bytes of device memory): %s", want, bytes,
                            cudaGetErrorString(e));
    }
    if (t->stamps) cudaFree(t->stamps);
    free(t->stamps_host);
    t->stamps = dev;
    t->stamps_host = host;
    t->stamp_cap = want;
    return calibrate(ctx, t);
}

/* CUDA: records the base event on the default stream and waits for it. */
static fp_status rebase(fp_context *ctx, struct fp_trace_state *t) {
    if (ctx->kind != FP_DEVICE_CUDA) return FP_OK;
    FP_TRY(fp_ctx_activate(ctx));
    if (!t->base) FP_CUDA_TRY(cudaEventCreate(&t->base));
    FP_CUDA_TRY(cudaEventRecord(t->base, ctx->stream));
    FP_CUDA_TRY(cudaEventSynchronize(t->base));
    t->base_s = fp_now_s();
    t->anchor_seq = 0;
    return t->stamps ? calibrate(ctx, t) : FP_OK;
}

/* Empties the ring (t->mu held). */
static void reset_locked(struct fp_trace_state *t) {
    for (size_t i = 0; i < t->cap; ++i) {
        t->slots[i].state = SLOT_EMPTY;
        t->slots[i].seq = 0;
    }
    t->lo_seq = t->next_seq + 1;
    t->open = 0;
    t->recorded = t->dropped = t->skipped_capturing = t->unresolved = t->host_timed = 0;
}

/* The calls that need the ring a successful fp_trace_enable creates (a
 * failed first enable may leave a state without one). */
static fp_status need_state(const fp_context *ctx, const char *fn) {
    FP_TRY(fp_ctx_check(ctx, -1));
    struct fp_trace_state *t = state_of(ctx);
    size_t cap = 0;
    if (t) {
        pthread_mutex_lock(&t->mu);
        cap = t->cap;
        pthread_mutex_unlock(&t->mu);
    }
    if (!cap)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "%s: tracing was never enabled on this context (call fp_trace_enable first)", fn);
    return FP_OK;
}

static uint64_t hook_begin(fp_context *ctx, fp_stream stream, const char *name, const char *category,
                           double bytes, double flops, int nranks, fp_span_stamp *stamp);
static void hook_end(fp_context *ctx, uint64_t span);

static int hook_push(fp_context *ctx, const char *stage, double bytes, double flops);
static void hook_pop(fp_context *ctx);

static const fp_trace_hooks trace_hooks = {hook_begin, hook_end, state_destroy, hook_push, hook_pop};

/* The state is created once per context (under a process-wide lock, so two
 * first enables cannot race) and published with release semantics: readers
 * load ctx->trace with acquire (state_of). It lives until the context. */
static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;

static fp_status create_state(fp_context *ctx, struct fp_trace_state **out) {
    pthread_mutex_lock(&create_mu);
    struct fp_trace_state *t = state_of(ctx);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (t && pthread_mutex_init(&t->mu, NULL) != 0) {
            free(t);
            pthread_mutex_unlock(&create_mu);
            return fp_set_error(FP_ERR_INTERNAL, "fp_trace_enable: pthread_mutex_init failed");
        }
        if (t) {
            ctx->trace_hooks = &trace_hooks;
            __atomic_store_n(&ctx->trace, t, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&create_mu);
    if (!t) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_trace_enable: trace state");
    *out = t;
    return FP_OK;
}

static void default_timer(fp_context *ctx, struct fp_trace_state *t);

fp_status fp_trace_enable(fp_context *ctx, size_t capacity) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_ARG(capacity > 0, "fp_trace_enable: capacity 0: the ring must hold at least one span");
    FP_CHECK_ARG(capacity <= MAX_CAPACITY, "fp_trace_enable: capacity %zu is above the limit %zu", capacity,
                 MAX_CAPACITY);
    struct fp_trace_state *t = NULL;
    FP_TRY(create_state(ctx, &t));
    pthread_mutex_lock(&t->mu);
    const int first = !t->timer_chosen;
    t->timer_chosen = 1;
    pthread_mutex_unlock(&t->mu);
    if (first) default_timer(ctx, t);
    trace_slot *slots = NULL;
    if (t->cap != capacity) {
        slots = calloc(capacity, sizeof *slots);
        if (!slots)
            return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_trace_enable: a ring of %zu spans (%zu bytes)",
                                capacity, capacity * sizeof *slots);
    }
    pthread_mutex_lock(&t->mu);
    fp_status st = FP_OK;
    if (slots || !t->base) st = rebase(ctx, t);
    if (st == FP_OK) st = fit_stamps(ctx, t, capacity); /* before the ring changes: an error leaves it */
    if (st == FP_OK && slots) {
        free_slots(t->slots, t->cap);
        t->slots = slots;
        t->cap = capacity;
        slots = NULL;
        reset_locked(t);
    }
    if (st == FP_OK) __atomic_store_n(&ctx->trace_on, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&t->mu);
    free(slots); /* only on error: never used, no events */
    return st;
}

fp_status fp_trace_disable(fp_context *ctx) {
    FP_TRY(fp_ctx_check(ctx, -1));
    __atomic_store_n(&ctx->trace_on, 0, __ATOMIC_RELAXED);
    return FP_OK;
}

int fp_trace_is_enabled(const fp_context *ctx) { return ctx ? fp_ctx_traced(ctx) : 0; }

fp_status fp_trace_clear(fp_context *ctx) {
    FP_TRY(fp_ctx_check(ctx, -1));
    struct fp_trace_state *t = state_of(ctx);
    if (!t) return FP_OK;
    pthread_mutex_lock(&t->mu);
    reset_locked(t);
    fp_status st = rebase(ctx, t);
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* Switches t to `timer` (t->mu not held): attaches to the CUPTI collector
 * the first time. */
static fp_status set_timer(fp_context *ctx, struct fp_trace_state *t, fp_trace_timer timer) {
    if (timer == FP_TRACE_TIMER_CUPTI && ctx->kind == FP_DEVICE_CUDA) {
        pthread_mutex_lock(&t->mu);
        uint32_t have = t->cupti_index;
        pthread_mutex_unlock(&t->mu);
        if (!have) {
            uint32_t idx = 0;
            FP_TRY(fp_cupti_attach(&idx));
            pthread_mutex_lock(&t->mu);
            if (!t->cupti_index) {
                t->cupti_index = idx;
                idx = 0;
            }
            pthread_mutex_unlock(&t->mu);
            if (idx) fp_cupti_detach(idx); /* another thread attached first */
        }
    }
    pthread_mutex_lock(&t->mu);
    const fp_trace_timer was = t->timer;
    t->timer = timer;
    const fp_status st = fit_stamps(ctx, t, t->cap);
    if (st != FP_OK) t->timer = was;
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* FASTPATH_TRACE_TIMER=cupti|kernel|events: the timer of a context's
 * first enable; one that cannot be used falls back to events with a line on
 * stderr (once per process). */
static void default_timer(fp_context *ctx, struct fp_trace_state *t) {
    const char *e = getenv("FASTPATH_TRACE_TIMER");
    if (!e || ctx->kind != FP_DEVICE_CUDA) return;
    fp_trace_timer timer;
    if (strcmp(e, "cupti") == 0)
        timer = FP_TRACE_TIMER_CUPTI;
    else if (strcmp(e, "kernel") == 0)
        timer = FP_TRACE_TIMER_KERNEL;
    else
        return;
    if (set_timer(ctx, t, timer) != FP_OK) {
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "libfastpath: FASTPATH_TRACE_TIMER=%s: %s; spans are timed by CUDA events\n", e,
                    fp_last_error());
    }
}

fp_status fp_trace_set_timer(fp_context *ctx, fp_trace_timer timer) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_ARG(timer == FP_TRACE_TIMER_EVENTS || timer == FP_TRACE_TIMER_CUPTI || timer == FP_TRACE_TIMER_KERNEL,
                 "fp_trace_set_timer: unknown timer %d (FP_TRACE_TIMER_EVENTS, _CUPTI or _KERNEL)", (int)timer);
    struct fp_trace_state *t = NULL;
    FP_TRY(create_state(ctx, &t));
    FP_TRY(set_timer(ctx, t, timer));
    pthread_mutex_lock(&t->mu);
    t->timer_chosen = 1;
    pthread_mutex_unlock(&t->mu);
    return FP_OK;
}

fp_trace_timer fp_trace_get_timer(const fp_context *ctx) {
    struct fp_trace_state *t = ctx ? state_of(ctx) : NULL;
    if (!t) return FP_TRACE_TIMER_EVENTS;
    pthread_mutex_lock(&t->mu);
    fp_trace_timer v = t->timer;
    pthread_mutex_unlock(&t->mu);
    return v;
}

fp_status fp_trace_set_allocator(fp_context *ctx, struct fp_allocator *allocator) {
    FP_TRY(need_state(ctx, "fp_trace_set_allocator"));
    __atomic_store_n(&state_of(ctx)->alloc, allocator, __ATOMIC_RELEASE);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Begin / end                                                             */
/* ------------------------------------------------------------------------ */

/* The innermost non-empty module and stage of the open ranges (t->mu held). */
static void current_tags(const struct fp_trace_state *t, const char **module, const char **stage) {
    *module = "";
    *stage = "";
    for (int i = t->depth - 1; i >= 0 && (!**module || !**stage); --i) {
        if (!**module && t->stack[i].module[0]) *module = t->stack[i].module;
        if (!**stage && t->stack[i].stage[0]) *stage = t->stack[i].stage;
    }
}

/* The slot for the next span, its previous occupant counted as dropped
 * (t->mu held). */
static trace_slot *take_slot(struct fp_trace_state *t, uint64_t *seq) {
    *seq = ++t->next_seq;
    trace_slot *s = &t->slots[(*seq - 1) % t->cap];
    if (s->state != SLOT_EMPTY) {
        ++t->dropped;
        if (s->state == SLOT_OPEN) --t->open;
    }
    s->seq = *seq;
    return s;
}

/* The allocator's allocated bytes now, -1 without one. */
static double allocated_now(fp_allocator *a) {
    if (!a) return -1;
    fp_alloc_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    if (fp_alloc_get_stats(a, &st) != FP_OK) return -1;
    return (double)st.allocated_bytes.current;
}

/* The external ids this thread pushed on CUPTI's stack (the CUPTI timer),
 * innermost last. A span ended on another thread, or out of order, stays
 * pushed until it reaches the top and its owner thread next begins or ends
 * a span of that ring: then it is popped as stale. */
#define PUSHED_MAX 64
static _Thread_local struct pushed_id {
    uint32_t index;
    uint64_t seq;
} g_pushed[PUSHED_MAX];
static _Thread_local int g_npushed;

/* Pops this thread's stale ids of ring t from the top (t->mu held). */
static void pop_stale_locked(const struct fp_trace_state *t) {
    while (g_npushed > 0) {
        const struct pushed_id *p = &g_pushed[g_npushed - 1];
        if (p->index != t->cupti_index) return;
        const trace_slot *s = p->seq >= t->lo_seq && p->seq <= t->next_seq ? &t->slots[(p->seq - 1) % t->cap] : NULL;
        if (s && s->seq == p->seq && s->state == SLOT_OPEN) return;
        fp_cupti_pop();
        --g_npushed;
    }
}

/* Begins a span (validated arguments). `tag_module` / `tag_stage` non-NULL
 * override the open ranges' tags (a range's own). */
static fp_status begin_span(fp_context *ctx, fp_stream stream, const char *name, const char *category,
                            double bytes, double flops, int nranks, const char *tag_module,
                            const char *tag_stage, int quiet, fp_span_stamp *stamp, uint64_t *out) {
    struct fp_trace_state *t = state_of(ctx);
    *out = 0;
    cudaStream_t cs = NULL;
    if (ctx->kind == FP_DEVICE_CUDA) {
        cs = fp_ctx_stream(ctx, stream);
        int cur = -1;
        if (cudaGetDevice(&cur) != cudaSuccess || (cur != ctx->device && cudaSetDevice(ctx->device) != cudaSuccess)) {
            (void)cudaGetLastError();
            return TRACE_FAIL(quiet, FP_ERR_CUDA, "trace: cannot make device %d current", ctx->device);
        }
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(cs, &cap) != cudaSuccess) {
            (void)cudaGetLastError();
            cap = cudaStreamCaptureStatusNone;
        }
        if (cap != cudaStreamCaptureStatusNone) {
            pthread_mutex_lock(&t->mu);
            ++t->skipped_capturing;
            pthread_mutex_unlock(&t->mu);
            return FP_OK;
        }
    }
    /* before t->mu: the allocator has its own lock */
    double allocated = allocated_now(__atomic_load_n(&t->alloc, __ATOMIC_ACQUIRE));
    pthread_mutex_lock(&t->mu);
    uint64_t seq;
    trace_slot *s = take_slot(t, &seq);
    fp_trace_span *sp = &s->span;
    sp->struct_size = sizeof *sp;
    copy_text(sp->name, sizeof sp->name, name);
    copy_text(sp->category, sizeof sp->category, category);
    const char *module, *stage;
    current_tags(t, &module, &stage);
    copy_text(sp->module, sizeof sp->module, tag_module ? tag_module : module);
    copy_text(sp->stage, sizeof sp->stage, tag_stage ? tag_stage : stage);
    sp->step = t->step;
    sp->depth = t->depth;
    sp->device = ctx->device;
    sp->bytes = bytes;
    sp->flops = flops;
    sp->allocated_bytes = allocated;
    sp->nranks = nranks;
    sp->end_s = 0;
    s->resolved = 0;
    /* A host wait ("sync") is the host's time, not the stream's: the clock
     * at both ends, on a CUDA context too (the trace clock is the host's). */
    s->host = ctx->kind != FP_DEVICE_CUDA || strcmp(category, FP_TRACE_SYNC) == 0;
    s->start_known = s->host;
    s->cupti = !s->host && t->timer == FP_TRACE_TIMER_CUPTI && t->cupti_index != 0;
    s->kernel = !s->host && stamp && t->timer == FP_TRACE_TIMER_KERNEL && t->stamps;
    s->pushed = 0;
    s->dev_start_ns = UINT64_MAX;
    s->dev_end_ns = 0;
    s->end_mark = 0;
    fp_status st = FP_OK;
    if (s->kernel) {
        /* no driver call: the op's kernels stamp the record (span_stamp.h) */
        sp->stream = (uint64_t)(uintptr_t)cs;
        sp->start_s = 0;
        s->host_start_s = fp_now_s();
        stamp->rec = t->stamps + ((seq - 1) % t->stamp_cap) * FP_SPAN_STAMP_WORDS;
        stamp->seq = seq;
        stamp->rec_end = stamp->rec;
    } else if (s->cupti) {
        /* no driver call: the span's device work is found by its external
         * id (a range's, from the spans inside it: it may end on another
         * thread, so it pushes nothing) */
        sp->stream = (uint64_t)(uintptr_t)cs;
        sp->start_s = 0;
        s->tid = thread_id();
        s->host_start_s = fp_now_s();
        if (strcmp(category, "range") != 0) {
            pop_stale_locked(t);
            if (g_npushed < PUSHED_MAX && fp_cupti_push(t->cupti_index, seq)) {
                g_pushed[g_npushed++] = (struct pushed_id){t->cupti_index, seq};
                s->pushed = 1;
            }
        }
    } else if (!s->host) {
        sp->stream = (uint64_t)(uintptr_t)cs;
        sp->start_s = 0;
        cudaError_t e = cudaSuccess;
        if (!s->ev[0]) e = cudaEventCreate(&s->ev[0]);
        if (e == cudaSuccess && !s->ev[1]) e = cudaEventCreate(&s->ev[1]);
        if (e == cudaSuccess) e = cudaEventRecord(s->ev[0], cs);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            s->state = SLOT_EMPTY;
            ++t->unresolved;
            st = TRACE_FAIL(quiet, FP_ERR_CUDA, "trace: recording the begin event of '%s' failed: %s", name,
                            cudaGetErrorString(e));
        }
    } else {
        sp->stream = ctx->kind == FP_DEVICE_CUDA ? (uint64_t)(uintptr_t)cs : thread_id();
        sp->start_s = fp_now_s();
    }
    if (st == FP_OK) {
        s->state = SLOT_OPEN;
        ++t->open;
        *out = seq;
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* Ends span `seq`. A handle never issued, or already ended, is
 * FP_ERR_INVALID_ARGUMENT; a span overwritten meanwhile is FP_OK. */
static fp_status end_span(fp_context *ctx, uint64_t seq, int quiet) {
    struct fp_trace_state *t = state_of(ctx);
    if (!t)
        return TRACE_FAIL(quiet, FP_ERR_INVALID_ARGUMENT, "fp_trace_end: span %llu was never begun on this context",
                          (unsigned long long)seq);
    double now = ctx->kind == FP_DEVICE_CPU ? fp_now_s() : 0; /* before the lock; CUDA "sync" spans read it below */
    fp_status st = FP_OK;
    pthread_mutex_lock(&t->mu);
    trace_slot *s = seq <= t->next_seq ? &t->slots[(seq - 1) % t->cap] : NULL; /* issued: cap > 0 */
    if (!s) {
        st = TRACE_FAIL(quiet, FP_ERR_INVALID_ARGUMENT, "fp_trace_end: span %llu was never begun on this context",
                        (unsigned long long)seq);
    } else if (s->seq != seq || seq < t->lo_seq) {
        st = FP_OK; /* overwritten or cleared: counted already */
    } else if (s->state != SLOT_OPEN) {
        st = TRACE_FAIL(quiet, FP_ERR_INVALID_ARGUMENT, "fp_trace_end: span %llu ('%s') was already ended",
                        (unsigned long long)seq, s->span.name);
    } else if (s->kernel) {
        --t->open;
        s->host_end_s = fp_now_s();
        s->state = SLOT_DONE;
        ++t->recorded;
    } else if (s->cupti) {
        --t->open;
        s->host_end_s = fp_now_s();
        s->end_mark = t->next_seq;
        if (s->pushed && g_npushed > 0 && g_pushed[g_npushed - 1].index == t->cupti_index &&
            g_pushed[g_npushed - 1].seq == seq) {
            fp_cupti_pop();
            --g_npushed;
        }
        s->state = SLOT_DONE;
        ++t->recorded;
        pop_stale_locked(t);
    } else if (!s->host) {
        --t->open;
        cudaError_t e = cudaEventRecord(s->ev[1], (cudaStream_t)(uintptr_t)s->span.stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            s->state = SLOT_EMPTY;
            ++t->unresolved;
            st = TRACE_FAIL(quiet, FP_ERR_CUDA, "trace: recording the end event of '%s' failed: %s", s->span.name,
                            cudaGetErrorString(e));
        } else {
            s->state = SLOT_DONE;
            ++t->recorded;
        }
    } else {
        --t->open;
        s->span.end_s = ctx->kind == FP_DEVICE_CPU ? now : fp_now_s();
        s->resolved = 1;
        s->state = SLOT_DONE;
        ++t->recorded;
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

static uint64_t hook_begin(fp_context *ctx, fp_stream stream, const char *name, const char *category,
                           double bytes, double flops, int nranks, fp_span_stamp *stamp) {
    uint64_t span = 0;
    (void)begin_span(ctx, stream, name, category, bytes, flops, nranks, NULL, NULL, 1, stamp, &span);
    return span;
}

static void hook_end(fp_context *ctx, uint64_t span) { (void)end_span(ctx, span, 1); }

static fp_status check_begin_args(const char *name, const char *category, double bytes, double flops,
                                  uint64_t *span) {
    FP_CHECK_NOT_NULL(span);
    *span = 0;
    FP_CHECK_ARG(name && name[0], "fp_trace_begin: argument 'name' is NULL or empty");
    FP_CHECK_ARG(category && category[0], "fp_trace_begin: argument 'category' is NULL or empty");
    FP_CHECK_ARG(isfinite(bytes) && bytes >= 0, "fp_trace_begin: bytes must be finite and >= 0 (got %g)", bytes);
    FP_CHECK_ARG(isfinite(flops) && flops >= 0, "fp_trace_begin: flops must be finite and >= 0 (got %g)", flops);
    return FP_OK;
}

fp_status fp_trace_begin(fp_context *ctx, fp_stream stream, const char *name, const char *category,
                         double bytes, double flops, uint64_t *span) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_TRY(check_begin_args(name, category, bytes, flops, span));
    if (!fp_ctx_traced(ctx)) return FP_OK;
    return begin_span(ctx, stream, name, category, bytes, flops, 0, NULL, NULL, 0, NULL, span);
}

fp_status fp_trace_begin_collective(fp_context *ctx, fp_stream stream, const char *op, double bytes, int nranks,
                                    uint64_t *span) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_TRY(check_begin_args(op, "collective", bytes, 0, span));
    FP_CHECK_ARG(nranks >= 0, "fp_trace_begin_collective: nranks must be >= 0 (got %d)", nranks);
    if (!fp_ctx_traced(ctx)) return FP_OK;
    return begin_span(ctx, stream, op, "collective", bytes, 0, nranks, NULL, NULL, 0, NULL, span);
}

fp_status fp_trace_end(fp_context *ctx, uint64_t span) {
    FP_TRY(fp_ctx_check(ctx, -1));
    if (!span) return FP_OK;
    return end_span(ctx, span, 0);
}

/* ------------------------------------------------------------------------ */
/*  User ranges and the step counter                                        */
/* ------------------------------------------------------------------------ */

static fp_status push_range(fp_context *ctx, const char *module, const char *stage, double bytes, double flops,
                            int quiet) {
    if (!module) module = "";
    if (!stage) stage = "";
    FP_CHECK_ARG(module[0] || stage[0], "fp_trace_push: both 'module' and 'stage' are NULL or empty");
    FP_TRY(need_state(ctx, "fp_trace_push"));
    struct fp_trace_state *t = state_of(ctx);
    pthread_mutex_lock(&t->mu);
    int depth = t->depth;
    const char *in_module, *in_stage;
    current_tags(t, &in_module, &in_stage);
    range_entry e;
    copy_text(e.module, sizeof e.module, module[0] ? module : in_module);
    copy_text(e.stage, sizeof e.stage, stage[0] ? stage : in_stage);
    pthread_mutex_unlock(&t->mu);
    if (depth >= FP_TRACE_MAX_DEPTH)
        return TRACE_FAIL(quiet, FP_ERR_INVALID_ARGUMENT, "fp_trace_push: more than %d user ranges open",
                          FP_TRACE_MAX_DEPTH);
    char name[FP_TRACE_NAME_MAX];
    if (module[0] && stage[0]) {
        size_t nm = strlen(module);
        if (nm > sizeof name - 2) nm = sizeof name - 2;
        memcpy(name, module, nm);
        name[nm] = '/';
        copy_text(name + nm + 1, sizeof name - nm - 1, stage);
    } else {
        copy_text(name, sizeof name, module[0] ? module : stage);
    }
    e.span = 0;
    const int traced = fp_ctx_traced(ctx);
    if (traced) FP_TRY(begin_span(ctx, NULL, name, "range", bytes, flops, 0, e.module, e.stage, quiet, NULL, &e.span));
    /* an NVTX range as the ops' hooks open one (internal.h) */
    e.nvtx = traced || ctx->nvtx;
    e.nvtx_id = e.nvtx ? fp_nvtx_range_start(name) : 0;
    pthread_mutex_lock(&t->mu);
    if (t->depth >= FP_TRACE_MAX_DEPTH) { /* another thread pushed meanwhile */
        pthread_mutex_unlock(&t->mu);
        if (e.span) (void)end_span(ctx, e.span, 1);
        if (e.nvtx) fp_nvtx_range_end(e.nvtx_id);
        return TRACE_FAIL(quiet, FP_ERR_INVALID_ARGUMENT, "fp_trace_push: more than %d user ranges open",
                          FP_TRACE_MAX_DEPTH);
    }
    t->stack[t->depth++] = e;
    pthread_mutex_unlock(&t->mu);
    return FP_OK;
}

fp_status fp_trace_push(fp_context *ctx, const char *module, const char *stage) {
    FP_TRY(fp_ctx_check(ctx, -1));
    return push_range(ctx, module, stage, 0, 0, 0);
}

static fp_status pop_range(fp_context *ctx, int quiet) {
    struct fp_trace_state *t = state_of(ctx);
    range_entry e;
    memset(&e, 0, sizeof e);
    int ok = 0;
    if (t) {
        pthread_mutex_lock(&t->mu);
        if (t->depth > 0) {
            e = t->stack[--t->depth];
            ok = 1;
        }
        pthread_mutex_unlock(&t->mu);
    }
    if (!ok)
        return TRACE_FAIL(quiet, FP_ERR_INVALID_ARGUMENT, "fp_trace_pop: unbalanced pop: no user range is open "
                                                          "(each fp_trace_pop closes one fp_trace_push)");
    const fp_status st = e.span ? end_span(ctx, e.span, quiet) : FP_OK;
    if (e.nvtx) fp_nvtx_range_end(e.nvtx_id);
    return st;
}

fp_status fp_trace_pop(fp_context *ctx) {
    FP_TRY(fp_ctx_check(ctx, -1));
    return pop_range(ctx, 0);
}

/* The timing engine's ranges around its samples (internal.h): quiet. */
static int hook_push(fp_context *ctx, const char *stage, double bytes, double flops) {
    return push_range(ctx, NULL, stage, bytes, flops, 1) == FP_OK;
}
static void hook_pop(fp_context *ctx) { (void)pop_range(ctx, 1); }

fp_status fp_trace_step(fp_context *ctx, int64_t *step) {
    FP_TRY(need_state(ctx, "fp_trace_step"));
    struct fp_trace_state *t = state_of(ctx);
    pthread_mutex_lock(&t->mu);
    int64_t v = ++t->step;
    pthread_mutex_unlock(&t->mu);
    if (step) *step = v;
    return FP_OK;
}

fp_status fp_trace_set_step(fp_context *ctx, int64_t step) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_ARG(step >= 0, "fp_trace_set_step: step must be >= 0 (got %lld)", (long long)step);
    FP_TRY(need_state(ctx, "fp_trace_set_step"));
    struct fp_trace_state *t = state_of(ctx);
    pthread_mutex_lock(&t->mu);
    t->step = step;
    pthread_mutex_unlock(&t->mu);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Explicit records                                                        */
/* ------------------------------------------------------------------------ */

/* The first published sizes of fp_trace_span and fp_trace_stats (0.3). */
#define SPAN_SIZE_FIRST sizeof(fp_trace_span)
#define STATS_SIZE_FIRST offsetof(fp_trace_stats, timer)

static void span_defaults(fp_trace_span *s) {
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    s->device = -1;
    s->allocated_bytes = -1;
}

fp_status fp_trace_span_init_sized(fp_trace_span *span, size_t struct_size) {
    fp_trace_span d;
    span_defaults(&d);
    return fp_struct_init(span, struct_size, &d, SPAN_SIZE_FIRST, sizeof d, "fp_trace_span");
}

static int has_nul(const char *s, size_t cap) { return memchr(s, '\0', cap) != NULL; }

fp_status fp_trace_record(fp_context *ctx, const fp_trace_span *span) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(span);
    fp_trace_span full;
    FP_STRUCT_IN(&span, full, SPAN_SIZE_FIRST, span_defaults, "fp_trace_span (span)");
    const fp_trace_span *s = span;
    FP_CHECK_ARG(has_nul(s->name, sizeof s->name) && has_nul(s->category, sizeof s->category) &&
                     has_nul(s->module, sizeof s->module) && has_nul(s->stage, sizeof s->stage),
                 "fp_trace_record: a text field of the span is not NUL-terminated");
    FP_CHECK_ARG(s->name[0] && s->category[0], "fp_trace_record: the span's name and category must be non-empty");
    FP_CHECK_ARG(isfinite(s->start_s) && isfinite(s->end_s) && s->end_s >= s->start_s,
                 "fp_trace_record: span '%s': times must be finite with end_s >= start_s (got %g, %g)", s->name,
                 s->start_s, s->end_s);
    FP_CHECK_ARG(isfinite(s->bytes) && s->bytes >= 0 && isfinite(s->flops) && s->flops >= 0,
                 "fp_trace_record: span '%s': bytes and flops must be finite and >= 0", s->name);
    FP_CHECK_ARG(s->step >= 0 && s->nranks >= 0 && s->depth >= 0 && s->device >= -1,
                 "fp_trace_record: span '%s': step, nranks and depth must be >= 0, device >= -1", s->name);
    FP_CHECK_ARG(isfinite(s->allocated_bytes), "fp_trace_record: span '%s': allocated_bytes is not finite",
                 s->name);
    FP_TRY(need_state(ctx, "fp_trace_record"));
    struct fp_trace_state *t = state_of(ctx);
    pthread_mutex_lock(&t->mu);
    uint64_t seq;
    trace_slot *slot = take_slot(t, &seq);
    slot->span = *s;
    slot->span.struct_size = sizeof slot->span;
    slot->resolved = 1;
    slot->start_known = 1;
    slot->host = 1;
    slot->state = SLOT_DONE;
    ++t->recorded;
    pthread_mutex_unlock(&t->mu);
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Reading                                                                 */
/* ------------------------------------------------------------------------ */

/* Reads the events of CUDA spans (t->mu held), in begin order. A start is
 * the elapsed time from the previous span's begin event added to that
 * span's start: consecutive begins are close, so the float milliseconds of
 * cudaEventElapsedTime keep sub-microsecond resolution however long the
 * trace runs; only the first span of the chain (after an enable, a clear or
 * an overwritten anchor) counts from the base event, an offset every later
 * span shares. Durations are between the span's own two events. A span
 * whose events cannot be read is dropped and counted in unresolved. */
static uint64_t first_seq(const struct fp_trace_state *t);

/* Whether an ended span timed by `timer` (CUPTI or kernel) awaits its
 * times (t->mu held). */
static int unresolved_locked(const struct fp_trace_state *t, fp_trace_timer timer) {
    for (uint64_t q = first_seq(t); q <= t->next_seq; ++q) {
        const trace_slot *s = &t->slots[(q - 1) % t->cap];
        const int by = timer == FP_TRACE_TIMER_CUPTI ? s->cupti : s->kernel;
        if (s->seq == q && s->state == SLOT_DONE && by && !s->resolved) return 1;
    }
    return 0;
}

/* The CUPTI timer's spans (t->mu held): once the device has finished the
 * work of every ended span (a device synchronize) and CUPTI has delivered
 * its records (a forced flush), a span's times are the earliest start and
 * latest end of its own device work and that of the spans begun inside it
 * (on its thread; any thread for a user range); a span with no device work
 * keeps the host clock's begin and end. */
static void resolve_cupti_locked(fp_context *ctx, struct fp_trace_state *t) {
    if (!unresolved_locked(t, FP_TRACE_TIMER_CUPTI)) return;
    (void)fp_ctx_activate(ctx);
    if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    fp_cupti_flush();
    size_t n = 0;
    fp_cupti_rec *recs = fp_cupti_take(t->cupti_index, &n);
    for (size_t i = 0; i < n; ++i) {
        const uint64_t q = recs[i].seq;
        if (q < t->lo_seq || q > t->next_seq || q == 0) continue;
        trace_slot *s = &t->slots[(q - 1) % t->cap];
        if (s->seq != q || s->state == SLOT_EMPTY || !s->cupti) continue;
        if (recs[i].start_ns < s->dev_start_ns) s->dev_start_ns = recs[i].start_ns;
        if (recs[i].end_ns > s->dev_end_ns) s->dev_end_ns = recs[i].end_ns;
    }
    free(recs);
    for (uint64_t q = first_seq(t); q <= t->next_seq; ++q) {
        trace_slot *s = &t->slots[(q - 1) % t->cap];
        if (s->seq != q || s->state != SLOT_DONE || !s->cupti || s->resolved) continue;
        uint64_t lo = s->dev_start_ns, hi = s->dev_end_ns;
        const int range = strcmp(s->span.category, "range") == 0;
        for (uint64_t r = q + 1; r <= s->end_mark && r <= t->next_seq; ++r) {
            const trace_slot *in = &t->slots[(r - 1) % t->cap];
            if (in->seq != r || in->state == SLOT_EMPTY || !in->cupti || !in->dev_end_ns) continue;
            if (!range && in->tid != s->tid) continue;
            if (in->dev_start_ns < lo) lo = in->dev_start_ns;
            if (in->dev_end_ns > hi) hi = in->dev_end_ns;
        }
        if (hi) {
            s->span.start_s = (double)lo * 1e-9;
            s->span.end_s = (double)hi * 1e-9;
        } else {
            s->span.start_s = s->host_start_s;
            s->span.end_s = s->host_end_s;
        }
        s->start_known = 1;
        s->resolved = 1;
    }
}

/* The kernel timer's spans (t->mu held): once the device has finished
 * (a device synchronize), the records are copied back. A span whose record
 * carries its handle gets the record's start and end on the host clock
 * (calibrate); one whose record was never claimed (its op launched no
 * kernel) keeps the host clock's begin and end; one whose record a later
 * span took (rings of more than MAX_STAMPS spans), or that reads an end
 * before its start, is dropped and counted in unresolved. */
static void resolve_kernel_locked(fp_context *ctx, struct fp_trace_state *t) {
    if (!unresolved_locked(t, FP_TRACE_TIMER_KERNEL)) return;
    (void)fp_ctx_activate(ctx);
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaMemcpy(t->stamps_host, t->stamps, t->stamp_cap * FP_SPAN_STAMP_WORDS * sizeof *t->stamps,
                       cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) (void)cudaGetLastError();
    for (uint64_t q = first_seq(t); q <= t->next_seq; ++q) {
        trace_slot *s = &t->slots[(q - 1) % t->cap];
        if (s->seq != q || s->state != SLOT_DONE || !s->kernel || s->resolved) continue;
        const unsigned long long *r = t->stamps_host + ((q - 1) % t->stamp_cap) * FP_SPAN_STAMP_WORDS;
        if (e == cudaSuccess && r[0] == q && r[2] >= r[1]) {
            s->span.start_s = t->calib_host_s + (double)(int64_t)(r[1] - t->calib_gt_ns) * 1e-9;
            s->span.end_s = t->calib_host_s + (double)(int64_t)(r[2] - t->calib_gt_ns) * 1e-9;
        } else if (e == cudaSuccess && r[0] < q) {
            s->span.start_s = s->host_start_s;
            s->span.end_s = s->host_end_s;
            ++t->host_timed;
        } else {
            s->state = SLOT_EMPTY;
            ++t->unresolved;
            continue;
        }
        s->start_known = 1;
        s->resolved = 1;
    }
}

static void resolve_locked(fp_context *ctx, struct fp_trace_state *t) {
    if (ctx->kind != FP_DEVICE_CUDA) return;
    resolve_cupti_locked(ctx, t);
    resolve_kernel_locked(ctx, t);
    int activated = 0;
    for (uint64_t q = first_seq(t); q <= t->next_seq; ++q) {
        trace_slot *s = &t->slots[(q - 1) % t->cap];
        if (s->seq != q || s->state == SLOT_EMPTY || s->cupti || s->kernel) continue;
        if (s->start_known && (s->resolved || s->state == SLOT_OPEN)) {
            if (!s->host) t->anchor_seq = q; /* a host-timed span has no begin event to count from */
            continue;
        }
        if (!activated) {
            (void)fp_ctx_activate(ctx);
            activated = 1;
        }
        cudaError_t e = cudaSuccess;
        if (!s->start_known) {
            const trace_slot *a = t->anchor_seq ? &t->slots[(t->anchor_seq - 1) % t->cap] : NULL;
            if (a && (a->seq != t->anchor_seq || a->state == SLOT_EMPTY || !a->start_known)) a = NULL;
            float ms = 0;
            e = cudaEventSynchronize(s->ev[0]);
            if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a ? a->ev[0] : t->base, s->ev[0]);
            if (e == cudaSuccess) {
                s->span.start_s = (a ? a->span.start_s : t->base_s) + (double)ms * 1e-3;
                s->start_known = 1;
            }
        }
        if (e == cudaSuccess && s->state == SLOT_DONE) {
            float dur = 0;
            e = cudaEventSynchronize(s->ev[1]);
            if (e == cudaSuccess) e = cudaEventElapsedTime(&dur, s->ev[0], s->ev[1]);
            if (e == cudaSuccess) {
                s->span.end_s = s->span.start_s + (double)dur * 1e-3;
                s->resolved = 1;
            }
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            if (s->state == SLOT_OPEN) --t->open;
            s->state = SLOT_EMPTY;
            ++t->unresolved;
            continue;
        }
        t->anchor_seq = q;
    }
}

/* The sequence numbers still in the ring: [first, t->next_seq]. */
static uint64_t first_seq(const struct fp_trace_state *t) {
    uint64_t first = t->next_seq >= t->cap ? t->next_seq - t->cap + 1 : 1;
    return first > t->lo_seq ? first : t->lo_seq;
}

static size_t count_done_locked(const struct fp_trace_state *t) {
    size_t n = 0;
    for (uint64_t q = first_seq(t); q <= t->next_seq; ++q) {
        const trace_slot *s = &t->slots[(q - 1) % t->cap];
        n += s->seq == q && s->state == SLOT_DONE;
    }
    return n;
}

/* Copies the newest `want` finished spans, oldest first (t->mu held). */
static size_t copy_done_locked(const struct fp_trace_state *t, size_t want, void *out, size_t span_size) {
    size_t have = count_done_locked(t), skip = have > want ? have - want : 0, k = 0;
    for (uint64_t q = first_seq(t); q <= t->next_seq && k < want; ++q) {
        const trace_slot *s = &t->slots[(q - 1) % t->cap];
        if (s->seq != q || s->state != SLOT_DONE) continue;
        if (skip) {
            --skip;
            continue;
        }
        memcpy((char *)out + k * span_size, &s->span, span_size);
        memcpy((char *)out + k * span_size, &span_size, sizeof span_size);
        ++k;
    }
    return k;
}

fp_status fp_trace_get_stats(fp_context *ctx, fp_trace_stats *out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(out);
    FP_TRY(fp_struct_size_check(out->struct_size, STATS_SIZE_FIRST, sizeof *out, "fp_trace_stats (out)"));
    fp_trace_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    st.enabled = fp_ctx_traced(ctx);
    struct fp_trace_state *t = state_of(ctx);
    if (t) {
        pthread_mutex_lock(&t->mu);
        resolve_locked(ctx, t);
        st.capacity = t->cap;
        for (uint64_t q = first_seq(t); q <= t->next_seq; ++q) {
            const trace_slot *s = &t->slots[(q - 1) % t->cap];
            st.count += s->seq == q && s->state != SLOT_EMPTY;
        }
        st.open = t->open;
        st.recorded = t->recorded;
        st.dropped = t->dropped;
        st.skipped_capturing = t->skipped_capturing;
        st.unresolved = t->unresolved;
        st.step = t->step;
        st.depth = t->depth;
        st.timer = (int)t->timer;
        st.clock_error_s = t->stamps ? t->calib_err_s : 0;
        st.host_timed = t->host_timed;
        pthread_mutex_unlock(&t->mu);
    }
    return fp_struct_write(out, &st, STATS_SIZE_FIRST, sizeof st, "fp_trace_stats (out)");
}

fp_status fp_trace_read_sized(fp_context *ctx, fp_trace_span *out, size_t span_size, size_t max, size_t *n,
                              int clear) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(n);
    FP_CHECK_ARG(out || max == 0, "fp_trace_read: argument 'out' is NULL with max %zu", max);
    FP_TRY(fp_struct_size_check(span_size, SPAN_SIZE_FIRST, sizeof *out, "fp_trace_span (span_size)"));
    struct fp_trace_state *t = state_of(ctx);
    if (!t) {
        *n = 0;
        return FP_OK;
    }
    fp_status st = FP_OK;
    pthread_mutex_lock(&t->mu);
    resolve_locked(ctx, t);
    *n = max ? copy_done_locked(t, max, out, span_size) : count_done_locked(t);
    if (clear) {
        reset_locked(t);
        st = rebase(ctx, t);
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* The newest finished spans, oldest first, in a malloc'd array. */
static fp_status snapshot(fp_context *ctx, fp_trace_span **out, size_t *n) {
    *out = NULL;
    *n = 0;
    struct fp_trace_state *t = state_of(ctx);
    if (!t) return FP_OK;
    pthread_mutex_lock(&t->mu);
    resolve_locked(ctx, t);
    size_t have = count_done_locked(t);
    fp_trace_span *spans = have ? malloc(have * sizeof *spans) : NULL;
    if (have && !spans) {
        pthread_mutex_unlock(&t->mu);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace export: a copy of %zu spans", have);
    }
    *n = have ? copy_done_locked(t, have, spans, sizeof *spans) : 0;
    pthread_mutex_unlock(&t->mu);
    *out = spans;
    return FP_OK;
}

static fp_status stream_ids(const fp_trace_span *spans, size_t n, int *ids) {
    /* Distinct (device, stream) pairs are few: a linear table. */
    size_t cap = 16, used = 0;
    struct key {
        int device;
        uint64_t stream;
        int id;
    } *keys = malloc(cap * sizeof *keys);
    if (!keys) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace export: stream table");
    for (size_t i = 0; i < n; ++i) {
        size_t k = 0;
        while (k < used && (keys[k].device != spans[i].device || keys[k].stream != spans[i].stream)) ++k;
        if (k == used) {
            if (used == cap) {
                void *p = realloc(keys, 2 * cap * sizeof *keys);
                if (!p) {
                    free(keys);
                    return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace export: stream table");
                }
                keys = p;
                cap *= 2;
            }
            int next = 1;
            for (size_t j = 0; j < used; ++j)
                if (keys[j].device == spans[i].device) ++next;
            keys[used].device = spans[i].device;
            keys[used].stream = spans[i].stream;
            keys[used].id = next;
            ++used;
        }
        ids[i] = keys[k].id;
    }
    free(keys);
    return FP_OK;
}

fp_status fp_trace_export_begin(fp_context *ctx, const char *path, const char *what, fp_trace_export *x) {
    memset(x, 0, sizeof *x);
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_ARG(path && path[0], "%s: argument 'path' is NULL or empty", what);
    FP_TRY(snapshot(ctx, &x->spans, &x->n));
    x->streams = x->n ? malloc(x->n * sizeof *x->streams) : NULL;
    fp_status st = FP_OK;
    if (x->n && !x->streams) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "%s: %zu stream ids", what, x->n);
    if (st == FP_OK) st = stream_ids(x->spans, x->n, x->streams);
    if (st != FP_OK) {
        fp_trace_export_end(x);
        return st;
    }
    x->origin = x->n ? x->spans[0].start_s : 0;
    for (size_t i = 1; i < x->n; ++i)
        if (x->spans[i].start_s < x->origin) x->origin = x->spans[i].start_s;
    return FP_OK;
}

void fp_trace_export_end(fp_trace_export *x) {
    free(x->spans);
    free(x->streams);
    memset(x, 0, sizeof *x);
}
