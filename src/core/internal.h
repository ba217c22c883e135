/* Internal helpers shared by every capability: error recording, CUDA/cuBLAS
 * check macros, the context layout and the CPU worker pool. Not installed. */
#ifndef FASTPATH_INTERNAL_H
#define FASTPATH_INTERNAL_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>

#include "fastpath/core.h"
#include "fastpath/timing.h"
#include "span_stamp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a detail message for the calling thread and returns `status`, so
 * error paths read `return fp_set_error(FP_ERR_..., "fmt", ...)`. The message
 * is prefixed with "file:line: ". */
fp_status fp_set_error_at(fp_status status, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define fp_set_error(status, ...) fp_set_error_at((status), __FILE__, __LINE__, __VA_ARGS__)

/* The rule of fp_last_error (core.h, "Conventions"): a failing call leaves a
 * message, a successful one never changes it. So a path that fails inside a
 * call and recovers (a fallback, a retry) saves the message first and
 * restores it once it has succeeded; and a check of whether a caller's
 * callback recorded a message compares fp_error_seq() around the call
 * instead of clearing the message first. */
#define FP_ERROR_MAX 1024
typedef struct fp_error_saved {
    unsigned seq;
    char msg[FP_ERROR_MAX];
} fp_error_saved;
void fp_error_save(fp_error_saved *s);
/* Puts the saved message back if one was recorded since the save. */
void fp_error_restore(const fp_error_saved *s);
/* Messages recorded on this thread so far (wraps). */
unsigned fp_error_seq(void);

/* Versioned structs (core.h, "Conventions"; struct_size.c says how to grow
 * one). `first` is the struct's first published size, `cur` this library's
 * sizeof, `what` names the struct in messages. Each returns
 * FP_ERR_INVALID_ARGUMENT with a message, nothing written, for a NULL
 * struct or a struct_size outside [first, cur]. */
fp_status fp_struct_size_check(size_t size, size_t first, size_t cur, const char *what);
/* An input struct: `full` (cur bytes) holds the defaults; the caller's
 * first struct_size bytes are copied over them, full's struct_size = cur. */
fp_status fp_struct_read(void *full, const void *user, size_t first, size_t cur, const char *what);
/* An output struct: the first struct_size (the caller's) bytes of `full`
 * are copied to `user`, whose struct_size stays. */
fp_status fp_struct_write(void *user, const void *full, size_t first, size_t cur, const char *what);
/* A table or array element (no struct_size field; the caller passes its
 * size): the caller's user_size bytes, checked as above, to `full` (cur
 * bytes), the rest zero (the callbacks an older table lacks are absent). */
fp_status fp_table_read(void *full, const void *user, size_t user_size, size_t first, size_t cur,
                        const char *what);
/* An initializer: the first `size` bytes of `defaults` (NULL: zeros) to p,
 * struct_size = size. */
fp_status fp_struct_init(void *p, size_t size, const void *defaults, size_t first, size_t cur,
                         const char *what);

/* The first published size of fp_device_info (0.2). */
#define FP_DEVICE_INFO_SIZE_FIRST sizeof(fp_device_info)

/* Reads a caller's versioned input struct *pp (a const T *, NULL checked by
 * the caller): *pp itself when it has this library's layout, else `full`
 * (a T) filled by default_fn and then the caller's fields, *pp pointed at
 * it. Returns the error of fp_struct_read. */
#define FP_STRUCT_IN(pp, full, first, default_fn, what)                               \
    do {                                                                              \
        if ((*(pp))->struct_size != sizeof(full)) {                                   \
            default_fn(&(full));                                                      \
            FP_TRY(fp_struct_read(&(full), *(pp), (first), sizeof(full), (what)));    \
            *(pp) = &(full);                                                          \
        }                                                                             \
    } while (0)

/* Argument checks that name the argument. */
#define FP_CHECK_ARG(cond, ...)                                                  \
    do {                                                                         \
        if (!(cond)) return fp_set_error(FP_ERR_INVALID_ARGUMENT, __VA_ARGS__);  \
    } while (0)
#define FP_CHECK_NOT_NULL(p) FP_CHECK_ARG((p) != NULL, "argument '%s' is NULL", #p)

/* Evaluates a CUDA runtime call; on failure records "file:line: call: error"
 * and returns FP_ERR_CUDA (FP_ERR_OUT_OF_MEMORY for allocation failures). */
fp_status fp_cuda_status(cudaError_t err, const char *expr, const char *file, int line);
#define FP_CUDA_TRY(expr)                                                         \
    do {                                                                          \
        cudaError_t fp_err_ = (expr);                                             \
        if (fp_err_ != cudaSuccess)                                               \
            return fp_cuda_status(fp_err_, #expr, __FILE__, __LINE__);            \
    } while (0)

/* Propagates a non-OK status (the callee already recorded the detail). */
#define FP_TRY(expr)                          \
    do {                                      \
        fp_status fp_st_ = (expr);            \
        if (fp_st_ != FP_OK) return fp_st_;   \
    } while (0)

/* CPU worker pool: a fixed set of threads that run parallel_for ranges. */
typedef struct fp_thread_pool fp_thread_pool;
fp_status fp_thread_pool_create(int threads, fp_thread_pool **out);
void fp_thread_pool_destroy(fp_thread_pool *pool);
int fp_thread_pool_size(const fp_thread_pool *pool);
/* Calls fn(arg, begin, end) over [0, n) split into chunks of `grain` (>= 1)
 * items, on the pool's threads and the caller. Returns when all are done.
 * Safe to call from several threads (calls are serialized). */
void fp_parallel_for(fp_thread_pool *pool, size_t n, size_t grain,
                     void (*fn)(void *arg, size_t begin, size_t end), void *arg);

/* Scratch that ops need between their kernels (split-KV partials, norm
 * partial sums, the baseline's score matrix): a workspace per stream, owned
 * by the context (fp_ctx_scratch_get below). Per stream because ops on one
 * context may run concurrently on different streams; work on one stream is
 * ordered, so consecutive ops on it share its workspace. */
#define FP_WS_STREAMS 8
/* The memory pool's default release threshold (FP_CTX_SCRATCH_KEEP_BYTES). */
#define FP_SCRATCH_KEEP_BYTES ((uint64_t)256 << 20)
typedef struct fp_ws_slot {
    cudaStream_t stream;
    void *ptr;                  /* cudaMalloc'd, bytes long */
    size_t bytes;
    unsigned long long last_use; /* ctx->ws_clock at the last use (eviction) */
    int used;
    void *counters;             /* cudaMalloc'd ints, counter_bytes long, zero between ops */
    size_t counter_bytes;
    void *aux;                  /* cudaMalloc'd, aux_bytes long (fp_ctx_scratch_get_aux) */
    size_t aux_bytes;
} fp_ws_slot;

struct fp_context {
    fp_device_kind kind;
    int device;                 /* CUDA ordinal or -1 */
    fp_device_info info;
    /* CUDA */
    cudaStream_t stream;
    void *cublaslt;             /* cublasLtHandle_t */
    void *cublas;               /* cublasHandle_t, created on first use */
    pthread_mutex_t cublas_mu;  /* guards cublas: creation, stream binding, use */
    void *workspace;            /* cuBLASLt workspace */
    size_t workspace_bytes;
    void *scratch_pool;         /* cudaMemPool_t (FP_CTX_SCRATCH_KEEP_BYTES), or NULL */
    int attn_kernel;            /* FP_CTX_ATTENTION_KERNEL: preferred flash version, 0 = default */
    int attn_split_combine;     /* FP_CTX_ATTENTION_SPLIT_COMBINE: 0 fused (default), 1 separate kernel */
    int launch_pdl;             /* FP_CTX_LAUNCH_PDL resolved: 1 = the library's kernels launch with
                                   programmatic dependent launch (asked for, and compute
                                   capability >= 9.0); read by the launchers (kernels/common/pdl.cuh) */
    pthread_mutex_t ws_mu;      /* guards ws*, held by a scratch user from get to put */
    pthread_mutex_t ws_aux_mu;  /* held by an aux scratch user from get to put (taken before ws_mu) */
    fp_ws_slot ws[FP_WS_STREAMS];
    unsigned long long ws_clock;
    void **ws_retired;          /* outgrown workspaces: graphs may still use them */
    int ws_nretired, ws_retired_cap;
    void *l2_flush_buf;         /* lazily allocated by the timing engine */
    size_t l2_flush_bytes;
    /* CPU */
    fp_thread_pool *pool;
    /* Tracing (trace.h): the trace layer's state and hooks, set by its first
     * fp_trace_enable (published with release stores; trace_on, which turns
     * recording on, is stored after them and read by fp_ctx_traced). */
    struct fp_trace_state *trace;
    const struct fp_trace_hooks *trace_hooks;
    int trace_on;
    int nvtx;                   /* FASTPATH_NVTX=1 when the context was made: NVTX ranges without tracing */
};

/* How ops reach the trace layer (src/trace) without depending on it: the
 * layer installs these in the context. begin returns a span handle, 0 when
 * nothing was recorded; neither records an error message (an op never fails
 * or changes fp_last_error because of its tracing: failures are counted in
 * fp_trace_stats). destroy frees the state (fp_context_destroy, after the
 * default stream is synchronized). */
typedef struct fp_trace_hooks {
    /* stamp non-NULL: the op's kernels can time the span (the kernel timer,
     * span_stamp.h); begin fills it (rec NULL when they are not to) */
    uint64_t (*begin)(fp_context *ctx, fp_stream stream, const char *name, const char *category, double bytes,
                      double flops, int nranks, fp_span_stamp *stamp);
    void (*end)(fp_context *ctx, uint64_t span);
    void (*destroy)(fp_context *ctx);
    /* a user range tagging what runs inside with `stage` (fp_trace_push with
     * no module: the timing engine's "baseline" / "optimized" samples, the
     * range's span carrying the sample's roofline bytes and flops); push
     * returns 1 when pushed, and only then is pop called */
    int (*push)(fp_context *ctx, const char *stage, double bytes, double flops);
    void (*pop)(fp_context *ctx);
} fp_trace_hooks;

/* 1 while ctx records spans. */
static inline int fp_ctx_traced(const fp_context *ctx) {
    return __atomic_load_n(&ctx->trace_on, __ATOMIC_ACQUIRE); /* a plain load on x86-64 */
}

/* The slow path of the hooks below (src/core/nvtx.c): an NVTX range
 * (nvtxRangePushA / nvtxRangePop) and, while ctx traces, a span through
 * ctx->trace_hooks. The handle it returns carries FP_SPAN_NVTX when a range
 * was pushed, so the end pops exactly what the begin pushed. */
#define FP_SPAN_NVTX ((uint64_t)1 << 63)
uint64_t fp_ctx_instrument_begin(fp_context *ctx, fp_stream stream, const char *name, const char *category,
                                 double bytes, double flops, int nranks, fp_span_stamp *stamp);
void fp_ctx_instrument_end(fp_context *ctx, uint64_t span);
/* FASTPATH_NVTX=1 in the environment, read once (fp_context_create copies
 * it into ctx->nvtx). */
int fp_nvtx_env_enabled(void);
/* A process-wide NVTX range (nvtxRangeStartA / nvtxRangeEnd: it may end
 * on another thread), for the trace layer's user ranges; the id to end it. */
uint64_t fp_nvtx_range_start(const char *name);
void fp_nvtx_range_end(uint64_t id);
/* NVTX ranges opened and closed (the hooks' pushes and pops, the user
 * ranges' starts and ends) since the process started (tests: they
 * balance). Either pointer may be NULL. */
void fp_nvtx_counts(uint64_t *pushed, uint64_t *popped);

/* Instrumenting an op is one pair around its launch:
 *     uint64_t span = fp_ctx_trace_begin(ctx, stream, "norm_fwd", "op", bytes, flops);
 *     ... enqueue the kernels ...
 *     fp_ctx_trace_end(ctx, span);
 * With tracing off and FASTPATH_NVTX unset, begin is one branch and end of 0
 * another. Begin only after the op's argument checks (a refused call records
 * nothing), and end on every path after it. */
static inline uint64_t fp_ctx_trace_begin(fp_context *ctx, fp_stream stream, const char *name,
                                          const char *category, double bytes, double flops) {
    if (!(fp_ctx_traced(ctx) | ctx->nvtx)) return 0;
    return fp_ctx_instrument_begin(ctx, stream, name, category, bytes, flops, 0, NULL);
}
/* The same for an op whose kernels time their span themselves when the
 * context's timer is the kernel timer (trace.h, FP_TRACE_TIMER_KERNEL): pass
 * *stamp to each of its kernels (kernels/common/span_stamp.cuh). *stamp is
 * all NULL / 0 unless they are to: tracing off, another timer, a capturing
 * stream; then the span (if any) is timed as fp_ctx_trace_begin's. */
static inline uint64_t fp_ctx_trace_begin_stamped(fp_context *ctx, fp_stream stream, const char *name,
                                                  const char *category, double bytes, double flops,
                                                  fp_span_stamp *stamp) {
    stamp->rec = stamp->rec_end = NULL;
    stamp->seq = 0;
    if (!(fp_ctx_traced(ctx) | ctx->nvtx)) return 0;
    return fp_ctx_instrument_begin(ctx, stream, name, category, bytes, flops, 0, stamp);
}
/* The same for a collective (category "collective", trace.h's
 * fp_trace_begin_collective): `op` its name, nranks the ranks taking part. */
static inline uint64_t fp_ctx_trace_begin_collective(fp_context *ctx, fp_stream stream, const char *op,
                                                     double bytes, int nranks) {
    if (!(fp_ctx_traced(ctx) | ctx->nvtx)) return 0;
    return fp_ctx_instrument_begin(ctx, stream, op, "collective", bytes, 0, nranks, NULL);
}
static inline void fp_ctx_trace_end(fp_context *ctx, uint64_t span) {
    if (span) fp_ctx_instrument_end(ctx, span);
}

/* Resolves a stream argument: NULL means the context's default stream. */
static inline cudaStream_t fp_ctx_stream(const fp_context *ctx, fp_stream s) {
    return s ? (cudaStream_t)s : ctx->stream;
}

/* Makes ctx's device current on the calling thread (CUDA contexts). */
fp_status fp_ctx_activate(const fp_context *ctx);

/* Scratch of `bytes` (256-byte aligned) for work an op enqueues on
 * `stream`. With a context: the stream's workspace, grown (grow-only) when
 * too small, so a warmed-up op makes no allocation; ctx->ws_mu stays held
 * until fp_ctx_scratch_put, so two threads enqueueing on one stream cannot
 * interleave their uses of it. A stream being captured cannot grow it
 * (cudaMalloc is not capturable): FP_ERR_UNSUPPORTED telling the caller to
 * run the op once on that stream before capturing. An outgrown workspace
 * is kept until the context is destroyed (a captured graph may use it).
 * Without a context (kernel-level tests calling launchers): a stream-ordered
 * allocation that put frees. `who` names the op in messages. On error
 * nothing is held. bytes 0: *s->ptr = NULL (still put it). */
typedef struct fp_scratch {
    void *ptr;
    fp_context *ctx;            /* NULL: ptr is a cudaMallocAsync allocation */
    cudaStream_t stream;
    int *counters;              /* fp_ctx_scratch_get_counted's, else NULL */
    int aux;                    /* 1: fp_ctx_scratch_get_aux's (put releases ws_aux_mu) */
} fp_scratch;
fp_status fp_ctx_scratch_get(fp_context *ctx, cudaStream_t stream, size_t bytes, const char *who, fp_scratch *s);
/* fp_ctx_scratch_get, and s->counters: `ncounters` ints of the stream's,
 * zero when the op's first kernel starts, which the op's kernels leave zero
 * again when they end (a kernel that counts arrivals resets its count): the
 * "last CTA finishes the work" pattern, with no memset per call. Grown like
 * the workspace (zeroed on the stream when allocated; not during a
 * capture). ncounters 0: s->counters is NULL. Without a context: one
 * stream-ordered allocation holds both (the counters zeroed on the stream),
 * freed by put. */
fp_status fp_ctx_scratch_get_counted(fp_context *ctx, cudaStream_t stream, size_t bytes, size_t ncounters,
                                     const char *who, fp_scratch *s);
/* A second scratch buffer of the stream's slot, for an op that holds
 * scratch across a call that takes the workspace itself (the fp8 KV cache
 * widened for the TMA attention kernels, whose launch takes split-KV
 * partials and ticket counters from the workspace): the same rules as
 * fp_ctx_scratch_get (grow-only, not grown during a capture, retired not
 * freed when outgrown; without a context a stream-ordered allocation), its
 * own buffer and lock. ctx->ws_aux_mu stays held until put, and is taken
 * before ws_mu, never while holding it: take the aux scratch first. */
fp_status fp_ctx_scratch_get_aux(fp_context *ctx, cudaStream_t stream, size_t bytes, const char *who, fp_scratch *s);
/* Ends the use (enqueued work may still run: the next user of the stream's
 * workspace is ordered after it). Returns an error only for a failed free of
 * a context-less allocation. */
fp_status fp_ctx_scratch_put(fp_scratch *s);
/* Frees every workspace (fp_context_destroy, after synchronizing). */
void fp_ctx_scratch_destroy(fp_context *ctx);

/* The context's cuBLAS handle (created on first use, destroyed with the
 * context), bound to `stream` (NULL: the default stream). Creation is
 * thread-safe, but the binding is not: a caller that may share the context
 * with other threads uses fp_ctx_cublas_lock instead. */
fp_status fp_ctx_cublas(fp_context *ctx, fp_stream stream, void **handle);
/* Same, returning with the handle locked (bound to `stream` until
 * fp_ctx_cublas_unlock): ops that enqueue cuBLAS calls and claim thread-safety
 * for one CUDA context hold it across the binding and their calls. On error
 * the lock is not held. */
fp_status fp_ctx_cublas_lock(fp_context *ctx, fp_stream stream, void **handle);
void fp_ctx_cublas_unlock(fp_context *ctx);

/* Checks a context argument; `want_kind` < 0 accepts either kind. */
fp_status fp_ctx_check(const fp_context *ctx, int want_kind);

/* Statistics helpers of the timing engine (src/timing/stats.c) for code that
 * needs more percentiles than fp_stats carries: sort once, then read both. */
void fp_sort_doubles(double *v, int n);
double fp_percentile_sorted(const double *sorted, int n, double q);
/* fp_stats of n >= 1 finite, non-negative, sorted durations (ms). */
void fp_stats_from_sorted(const double *sorted, int n, fp_stats *out);

/* Writes `len` bytes to `path` through a temporary file next to it that is
 * flushed and renamed over it, so a failure leaves neither a partial file
 * nor a changed one. `what` names the caller in messages. FP_ERR_IO with the
 * path and the system's reason; FP_ERR_INVALID_ARGUMENT for a NULL or empty
 * path. */
fp_status fp_write_file_atomic(const char *path, const void *data, size_t len, const char *what);

/* Monotonic clock in seconds. */
double fp_now_s(void);
/* pthread_cond_init on CLOCK_MONOTONIC (timed waits immune to wall-clock
 * changes, deadlines from fp_now_s' clock); pthread_cond_init's result. */
int fp_cond_init_monotonic(pthread_cond_t *cv);
/* The CLOCK_MONOTONIC time `ms` (>= 0) milliseconds from now, for timed
 * waits on such a condition variable. */
void fp_deadline_after_ms(struct timespec *ts, int64_t ms);

/* x86-64 SIMD features (0 elsewhere), each with AVX2 and OS support for the
 * YMM state: FP_CPU_AVX2_FMA, FP_CPU_AVX2_F16C bits. Cached after the first call. */
enum { FP_CPU_AVX2_FMA = 1, FP_CPU_AVX2_F16C = 2 };
int fp_cpu_features(void);

/* A spin-wait hint (pause / yield) for short busy loops. */
static inline void fp_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_INTERNAL_H */
