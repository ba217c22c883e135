/*
 * libfastpath dynamic batcher: many concurrent single requests into batches.
 *
 * Inference servers receive requests one at a time from many threads; run
 * alone, each leaves the device mostly idle. The batcher queues requests and
 * hands an executor callback batches sized for throughput within a latency
 * budget. Its policy knobs follow NVIDIA Triton's dynamic batcher.
 *
 * API tiers
 *   1. Batcher: fp_batcher_config_default / fp_batcher_create, then
 *      fp_batcher_submit from any thread, fp_batch_request_wait / _cancel /
 *      _release on the returned handle (or a completion callback),
 *      fp_batcher_shutdown and fp_batcher_destroy.
 *   2. Statistics: fp_batcher_get_stats, fp_batcher_get_batch_histogram,
 *      fp_batcher_reset_stats (queue time, end-to-end latency, executor time
 *      as timing-engine fp_stats plus p99).
 *   3. Built-in A/B: fp_batcher_bench runs one request stream through a
 *      batch-1 batcher (baseline) and through the dynamic batcher, closed
 *      loop (K clients) or open loop (Poisson arrivals), with a model whose
 *      batch cost grows sublinearly (a CPU compute callback by default).
 *
 * Life of a request
 *   submit -> QUEUED -> (batch formed) EXECUTING -> completed
 *                  \--> timed out / cancelled / shut down -> completed
 *   Every accepted request completes exactly once with one status:
 *     FP_OK                  the executor produced its output
 *     any other executor status (the executor failed this request)
 *     FP_ERR_TIMEOUT         its queue timeout passed before it was batched
 *     FP_ERR_CANCELLED       fp_batch_request_cancel removed it from the queue
 *     FP_ERR_SHUT_DOWN       fp_batcher_shutdown(FP_BATCHER_SHUTDOWN_CANCEL)
 *                            or fp_batcher_destroy removed it from the queue
 *   Completion means: the status is set, the on_done callback (if any) has
 *   returned, then waiters are woken. Timeouts and cancellation apply to
 *   queued requests only: once in a batch, a request runs to completion, so
 *   the executor never writes an output whose request has completed.
 *   A request rejected by fp_batcher_submit (queue full, shut down, bad
 *   argument) is never created: no handle, no callback.
 *
 * Threads
 *   The batcher owns `executor_threads` executor threads (each forms a batch
 *   when idle and runs the executor on it: that many batches in flight), one
 *   timer thread that expires queued requests on time even while every
 *   executor is busy, and one completion thread: it runs the callbacks of
 *   timed-out requests (the timer runs none, so a slow callback never delays
 *   another request's expiry), and when an executor finishes a batch while
 *   the next one is ready, it delivers the finished requests so the executor
 *   need not wake every client first.
 *   Completion callbacks run on one of these threads, or on a thread of
 *   yours: fp_batch_request_cancel runs the cancelled request's own callback
 *   on the calling thread (without preserve_ordering; never another
 *   request's), and fp_batcher_shutdown(CANCEL) / fp_batcher_destroy run the
 *   callbacks of the requests they take off the queue (with
 *   preserve_ordering, also of finished requests that were waiting behind
 *   them) on the calling thread. A slow callback delays only the
 *   completions delivered after it on the same thread. The executor and
 *   timer threads set a 1 us timer slack (Linux prctl), so queue delays
 *   and timeouts expire on time rather than up to 50 us late.
 *
 * Policy (Triton semantics)
 *   - max_batch_size caps a batch. A batch is dispatched as soon as an
 *     executor is free and (a) max_batch_size requests are queued, or (b) a
 *     preferred batch size can be formed (the largest one not above the
 *     queue length is taken), or (c) the oldest queued request has waited
 *     max_queue_delay_us (then everything queued, up to the max, goes; with
 *     a delay of 0 whatever is queued goes at once), or (d) the batcher is
 *     draining for shutdown.
 *   - allowed_batch_sizes: the executor is told the batch size rounded up to
 *     the next allowed size (padding, e.g. to match captured CUDA graphs);
 *     batches never exceed the largest allowed size.
 *   - priority_levels: level 0 is the highest; batches are filled from level
 *     0 first, FIFO within a level.
 *   - queue_policy[level]: max_queue_size (submit fails at once with
 *     FP_ERR_QUEUE_FULL), default_timeout_us and timeout_action: REJECT
 *     completes a request whose timeout passes with FP_ERR_TIMEOUT; DELAY
 *     keeps it but moves it behind every not-yet-timed-out request of its
 *     level. A request's own timeout can only shorten the level default.
 *   - preserve_ordering: completions are delivered in submission order
 *     (a completion waits for every earlier request to complete, including
 *     timeouts, so a timeout can be delivered late behind a running batch,
 *     and fp_batch_request_cancel waits for the earlier requests).
 */
#ifndef FASTPATH_BATCHER_H
#define FASTPATH_BATCHER_H

#include "fastpath/core.h"
#include "fastpath/timing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/*  Types                                                                   */
/* ======================================================================== */

typedef struct fp_batcher fp_batcher;
typedef struct fp_batch_request fp_batch_request;

#define FP_BATCHER_MAX_SIZES 32       /* preferred / allowed size list length */
#define FP_BATCHER_MAX_PRIORITIES 16  /* priority levels */
#define FP_BATCHER_MAX_BATCH 4096     /* upper bound of max_batch_size */
#define FP_BATCHER_MAX_THREADS 64     /* upper bound of executor_threads */

/* One request as the executor sees it. */
typedef struct fp_batch_item {
    const void *input;   /* as given to fp_batcher_submit */
    size_t input_size;
    void *output;        /* caller-owned buffer the executor fills */
    size_t output_size;
    void *user;          /* per-request user pointer from submit */
    fp_status status;    /* FP_OK on entry; set another status to fail
                            this request alone */
} fp_batch_item;

/* The executor: runs one batch. items[0..count) are the real requests in
 * dispatch order (priority, then FIFO); padded_count >= count is the size to
 * run (count rounded up to an allowed batch size; == count without allowed
 * sizes). It fills each item's output and may set items[i].status to fail one
 * request. Returning a status other than FP_OK fails every request whose
 * item status is still FP_OK with that status. A value outside fp_status
 * (returned or set) completes the request with FP_ERR_INVALID_ARGUMENT.
 * Called on an executor thread; with executor_threads > 1 calls run
 * concurrently. fp_batcher_shutdown / fp_batcher_destroy on its own batcher
 * are refused (FP_ERR_INVALID_ARGUMENT, nothing done), and so is
 * fp_batch_request_cancel with preserve_ordering. */
typedef fp_status (*fp_batch_executor_fn)(void *user, fp_batch_item *items, int count,
                                          int padded_count);

/* Completion callback: called exactly once per accepted request, with its
 * final status, on a batcher thread or the thread that cancelled / shut down
 * (see Threads above). Callbacks of different requests may run concurrently
 * (one at a time, in submission order, with preserve_ordering). Keep it
 * short: the thread delivers other completions after it. It may submit
 * requests, cancel them (not with preserve_ordering: refused, see
 * fp_batch_request_cancel) and release handles, `req`'s included: the
 * batcher holds its own reference until the callback has returned, and
 * releasing a request submitted without a handle does nothing. `req` stays
 * valid during the call; waiters on `req` are woken after it returns, so
 * fp_batch_request_wait on `req` from here is refused
 * (FP_ERR_INVALID_ARGUMENT); do not wait without a timeout for other
 * requests of this batcher either (this thread may be the one to deliver
 * them). fp_batcher_shutdown / fp_batcher_destroy on its own batcher are
 * refused (FP_ERR_INVALID_ARGUMENT, nothing done). */
typedef void (*fp_batch_done_fn)(fp_batch_request *req, fp_status status, void *user);

typedef enum fp_batcher_timeout_action {
    FP_BATCHER_TIMEOUT_REJECT = 0, /* complete with FP_ERR_TIMEOUT */
    FP_BATCHER_TIMEOUT_DELAY = 1   /* keep, behind non-timed-out requests */
} fp_batcher_timeout_action;

typedef struct fp_batcher_queue_policy {
    int max_queue_size;          /* queued requests of this level; 0 = unbounded */
    int64_t default_timeout_us;  /* 0 = no timeout */
    fp_batcher_timeout_action timeout_action;
} fp_batcher_queue_policy;

/* ======================================================================== */
/*  Configuration                                                           */
/* ======================================================================== */

typedef struct fp_batcher_config {
    size_t struct_size;              /* set by fp_batcher_config_default */
    int max_batch_size;              /* 1..FP_BATCHER_MAX_BATCH (default 32) */
    int64_t max_queue_delay_us;      /* >= 0 (default 500); 0: dispatch at once */
    int preferred_batch_sizes[FP_BATCHER_MAX_SIZES]; /* strictly increasing, */
    int num_preferred_batch_sizes;   /* each in 1..max_batch_size (default 0) */
    int allowed_batch_sizes[FP_BATCHER_MAX_SIZES];   /* strictly increasing, */
    int num_allowed_batch_sizes;     /* each in 1..max_batch_size (default 0) */
    int priority_levels;             /* 1..FP_BATCHER_MAX_PRIORITIES (default 1) */
    int default_priority;            /* level used by submit's -1 (default 0) */
    fp_batcher_queue_policy queue_policy[FP_BATCHER_MAX_PRIORITIES]; /* default
                                        unbounded, no timeout, REJECT */
    int preserve_ordering;           /* 1: deliver in submission order (default 0) */
    int executor_threads;            /* 1..FP_BATCHER_MAX_THREADS (default 1) */
    int stats_window;                /* latest samples kept for percentiles,
                                        >= 16 (default 65536) */
    /* Appended after 0.3.0 (an older caller's struct ends before it: NULL).
     * Each batch execution (the executor's call) is a span of category
     * "batch" named "batch_execute" on this context's trace (trace.h; on a
     * CUDA context timed by events on its default stream, so work the
     * executor puts on other streams falls outside it), with an NVTX range.
     * NULL (default): none. The context must outlive the batcher. */
    fp_context *trace_context;
} fp_batcher_config;

/* Fills the defaults listed above and struct_size. NULL is a no-op. */
FP_API fp_status fp_batcher_config_default_sized(fp_batcher_config *config, size_t struct_size);
/* The exported fp_batcher_config_default writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_batcher_config_default)(fp_batcher_config *config);
#define fp_batcher_config_default(config) fp_batcher_config_default_sized((config), sizeof *(config))

/* Checks a configuration without creating anything. FP_OK, or
 * FP_ERR_INVALID_ARGUMENT naming the first bad field (e.g. "max_batch_size
 * must be in 1..4096 (got 0)"). Thread-safe, pure. */
FP_API fp_status fp_batcher_config_validate(const fp_batcher_config *config);

/* ======================================================================== */
/*  Batcher                                                                 */
/* ======================================================================== */

/* Creates a batcher and starts its threads. config NULL means defaults.
 * Errors: FP_ERR_INVALID_ARGUMENT (NULL executor or out, bad config field,
 * named in the detail), FP_ERR_OUT_OF_MEMORY, FP_ERR_INTERNAL if a thread
 * cannot be started. *out is set only on success. Thread-safe.
 * A macro passing sizeof(fp_batch_item), the layout of the items the
 * executor was built to read, to fp_batcher_create_sized (so fp_batch_item
 * can grow: FP_ERR_INVALID_ARGUMENT for an item_size this library does not
 * know); the exported fp_batcher_create assumes the 0.2 layout. */
FP_API fp_status fp_batcher_create_sized(const fp_batcher_config *config,
                                         fp_batch_executor_fn executor, void *executor_user,
                                         size_t item_size, fp_batcher **out);
FP_API fp_status(fp_batcher_create)(const fp_batcher_config *config, fp_batch_executor_fn executor,
                                    void *executor_user, fp_batcher **out);
#define fp_batcher_create(config, executor, executor_user, out) \
    fp_batcher_create_sized((config), (executor), (executor_user), sizeof(fp_batch_item), (out))

typedef struct fp_batch_submit_info {
    size_t struct_size;          /* set by fp_batch_submit_info_default */
    const void *input;           /* passed through to the executor */
    size_t input_size;
    void *output;                /* filled by the executor; must stay valid
                                    until the request completes */
    size_t output_size;
    void *user;                  /* passed through to the executor */
    int priority;                /* 0..levels-1, or -1 for the default (default -1) */
    int64_t timeout_us;          /* queue timeout; 0 = the level default; a
                                    value above a nonzero default is clamped
                                    to it (a request may only shorten it) */
    fp_batch_done_fn on_done;    /* optional completion callback */
    void *on_done_user;
} fp_batch_submit_info;

/* Fills defaults (everything NULL/0, priority -1) and struct_size. */
FP_API fp_status fp_batch_submit_info_default_sized(fp_batch_submit_info *info, size_t struct_size);
/* The exported fp_batch_submit_info_default writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_batch_submit_info_default)(fp_batch_submit_info *info);
#define fp_batch_submit_info_default(info) fp_batch_submit_info_default_sized((info), sizeof *(info))

/* Queues one request. If out is non-NULL it receives a handle the caller
 * must give back with fp_batch_request_release (before or after completion);
 * with out NULL the request is fire-and-forget (use on_done).
 * Errors (no request is created, on_done is not called):
 *   FP_ERR_INVALID_ARGUMENT  NULL batcher/info, bad struct_size, priority
 *                            out of range, negative timeout
 *   FP_ERR_QUEUE_FULL        the level's max_queue_size is reached
 *   FP_ERR_SHUT_DOWN         fp_batcher_shutdown has been called
 *   FP_ERR_OUT_OF_MEMORY
 * Thread-safe (also from executor and completion callbacks). */
FP_API fp_status fp_batcher_submit(fp_batcher *batcher, const fp_batch_submit_info *info,
                                   fp_batch_request **out);

typedef enum fp_batcher_shutdown_mode {
    FP_BATCHER_SHUTDOWN_DRAIN = 0,  /* run every queued request (no more
                                       queue delay; timeouts still apply) */
    FP_BATCHER_SHUTDOWN_CANCEL = 1  /* complete queued requests with
                                       FP_ERR_SHUT_DOWN; running batches finish */
} fp_batcher_shutdown_mode;

/* Stops accepting requests (submit then fails with FP_ERR_SHUT_DOWN),
 * completes the queue as `mode` says, waits for running batches and for
 * every completion to be delivered, and joins the batcher's threads. Returns
 * FP_OK when all is done; a second call returns FP_OK at once (or waits for
 * the first). A DRAIN after a CANCEL is a no-op and vice versa.
 * With CANCEL the callbacks of the requests taken off the queue run on the
 * calling thread (see Threads above).
 * Errors: FP_ERR_INVALID_ARGUMENT for a NULL batcher or unknown mode, or
 * when called from the batcher's own executor / completion callback (it
 * would wait for itself; nothing is done). Thread-safe. */
FP_API fp_status fp_batcher_shutdown(fp_batcher *batcher, fp_batcher_shutdown_mode mode);

/* Shuts down with FP_BATCHER_SHUTDOWN_CANCEL if not done yet (queued
 * requests complete with FP_ERR_SHUT_DOWN, their callbacks on this thread),
 * then frees the batcher. Request handles stay valid until released.
 * Returns FP_OK (also for NULL, a no-op). FP_ERR_INVALID_ARGUMENT when
 * called from the batcher's own executor or callback: nothing is done, the
 * batcher keeps running and accepting requests; destroy it from another
 * thread. No other thread may use the batcher during or after the call.
 * (It returned void up to 0.2: callers that ignore the status are unchanged,
 * in source and, on the usual C ABIs, in binary.) */
FP_API fp_status fp_batcher_destroy(fp_batcher *batcher);

/* ======================================================================== */
/*  Request handles                                                         */
/* ======================================================================== */

/* Waits until the request completes or timeout_us passes (< 0: forever,
 * 0: poll). Returns FP_OK when it has completed and stores its final status
 * in *result (if non-NULL); FP_ERR_TIMEOUT if it is still pending when the
 * wait expires (*result untouched); FP_ERR_INVALID_ARGUMENT for NULL req.
 * Thread-safe (several threads may wait on one request). The waiting thread
 * sleeps (no spinning) and is woken once, when the request completes; the
 * waiters of requests completed together are woken together, with one
 * wake-up call per group of up to 32 (Linux futex). */
FP_API fp_status fp_batch_request_wait(fp_batch_request *req, int64_t timeout_us,
                                       fp_status *result);

/* 1 if the request has completed, else 0 (NULL: 0). Thread-safe. */
FP_API int fp_batch_request_done(const fp_batch_request *req);

/* Cancels a queued request: it completes with FP_ERR_CANCELLED before this
 * returns FP_OK (status set, callback returned, waiters woken). Without
 * preserve_ordering its callback runs on this thread, and no other callback
 * does. With preserve_ordering it completes in submission order: this
 * blocks until every earlier request has completed (e.g. a batch running
 * now) and the completion thread has run its callback; this thread runs
 * none.
 * Errors (nothing changes): FP_ERR_NOT_FOUND if it is executing or has
 * already completed; FP_ERR_INVALID_ARGUMENT for NULL, or with
 * preserve_ordering when called from the batcher's own executor or
 * callback (it could not complete before returning: cancel from another
 * thread). Thread-safe; not concurrently with fp_batcher_destroy. */
FP_API fp_status fp_batch_request_cancel(fp_batch_request *req);

/* The user pointer given at submit (NULL for NULL). Thread-safe. */
FP_API void *fp_batch_request_user(const fp_batch_request *req);

/* Gives the handle back. Does not cancel: a pending request still runs and
 * its callback is still called. NULL is a no-op. Call once per handle; also
 * allowed from the request's own callback. A request submitted without a
 * handle has nothing to give back: releasing it from its callback does
 * nothing (after the callback it may already be freed). */
FP_API void fp_batch_request_release(fp_batch_request *req);

/* ======================================================================== */
/*  Statistics                                                              */
/* ======================================================================== */

/* Distribution of a duration in the timing engine's format, plus p99. */
typedef struct fp_batcher_latency {
    fp_stats stats;   /* ms; samples = 0 when nothing was recorded */
    double p50_us, p90_us, p99_us, max_us, mean_us;
} fp_batcher_latency;

typedef struct fp_batcher_stats {
    size_t struct_size;            /* set by the caller or fp_batcher_stats_init */
    int64_t submitted;             /* accepted by submit */
    int64_t completed_ok;
    int64_t failed;                /* executor error */
    int64_t timed_out;             /* FP_ERR_TIMEOUT */
    int64_t delayed;               /* timeouts handled with DELAY */
    int64_t cancelled;
    int64_t shut_down;             /* completed with FP_ERR_SHUT_DOWN */
    int64_t rejected_queue_full;   /* submit returned FP_ERR_QUEUE_FULL */
    int64_t rejected_shut_down;    /* submit returned FP_ERR_SHUT_DOWN */
    int64_t queued;                /* in the queue now */
    int64_t executing;             /* in running batches now */
    int64_t batches;
    double mean_batch_size;        /* real requests per batch */
    int64_t padded_slots;          /* sum of padded_count over batches */
    double padding_waste;          /* 1 - real / padded slots (0..1) */
    double executor_busy_s;        /* total time inside the executor */
    fp_batcher_latency queue_time; /* submit -> dispatch, batched requests */
    fp_batcher_latency end_to_end; /* submit -> completion, FP_OK requests */
    fp_batcher_latency executor;   /* per batch */
} fp_batcher_stats;

/* Zeroes stats and sets struct_size. */
FP_API fp_status fp_batcher_stats_init_sized(fp_batcher_stats *stats, size_t struct_size);
/* The exported fp_batcher_stats_init writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_batcher_stats_init)(fp_batcher_stats *stats);
#define fp_batcher_stats_init(stats) fp_batcher_stats_init_sized((stats), sizeof *(stats))

/* Snapshot of the counters and of the latest stats_window samples.
 * FP_ERR_INVALID_ARGUMENT for NULL or a struct_size other than
 * sizeof(fp_batcher_stats); FP_ERR_OUT_OF_MEMORY. Thread-safe. */
FP_API fp_status fp_batcher_get_stats(fp_batcher *batcher, fp_batcher_stats *stats);

/* Batch-size histogram: counts[i] = batches run with i real requests, for
 * i < n (batches larger than n-1 are not reported). Thread-safe. */
FP_API fp_status fp_batcher_get_batch_histogram(fp_batcher *batcher, int64_t *counts, int n);

/* Zeroes the counters (not queued/executing), samples and histogram.
 * Thread-safe. */
FP_API fp_status fp_batcher_reset_stats(fp_batcher *batcher);

/* ======================================================================== */
/*  Built-in A/B: batch-1 baseline vs dynamic batching                      */
/* ======================================================================== */

typedef enum fp_batcher_load {
    FP_BATCHER_LOAD_CLOSED = 0, /* `clients` threads: submit, wait, repeat */
    FP_BATCHER_LOAD_OPEN = 1    /* one generator, Poisson arrivals at rate_rps */
} fp_batcher_load;

/* The built-in CPU model: a batch costs a fixed part (launch + weight pass)
 * plus a part per padded item, both real floating-point arithmetic
 * calibrated to microseconds once per process. Item i's output is
 * out[j] = 2 * in[j] + 1 (j < dim), which the benchmark checks. */
typedef struct fp_batcher_cpu_model {
    double fixed_us;   /* default 100 */
    double item_us;    /* default 8 */
    int dim;           /* floats per request input and output (default 16) */
} fp_batcher_cpu_model;

typedef struct fp_batcher_bench_config {
    size_t struct_size;           /* set by fp_batcher_bench_config_default */
    fp_batcher_load load;         /* default CLOSED */
    int clients;                  /* closed loop (default 64) */
    double rate_rps;              /* open loop arrival rate (default 30000) */
    int requests;                 /* measured requests per side (default 8192) */
    int warmup_requests;          /* unmeasured, before them (default 256) */
    int windows;                  /* throughput samples per side (default 8) */
    fp_batcher_config batcher;    /* dynamic side; the baseline uses the same
                                     with max_batch_size 1, no delay, no
                                     preferred/allowed sizes */
    fp_batcher_cpu_model model;   /* used when executor is NULL */
    fp_batch_executor_fn executor;/* custom model (NULL: the CPU model); it
                                     must fill out[j] = 2 * in[j] + 1 for
                                     model.dim floats */
    void *executor_user;
    uint64_t seed;                /* inputs and arrivals (default 1) */
} fp_batcher_bench_config;

FP_API fp_status fp_batcher_bench_config_default_sized(fp_batcher_bench_config *config, size_t struct_size);
/* The exported fp_batcher_bench_config_default writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_batcher_bench_config_default)(fp_batcher_bench_config *config);
#define fp_batcher_bench_config_default(config) fp_batcher_bench_config_default_sized((config), sizeof *(config))

typedef struct fp_batcher_bench_side {
    double wall_s;                /* first submit to last completion */
    double throughput_rps;
    double per_request_us;        /* wall / requests */
    fp_stats per_request;         /* per-window per-request time (ms) */
    fp_batcher_stats stats;       /* the side's batcher statistics */
    double model_us_per_request;  /* model cost per executed request: the
                                     CPU model's nominal cost of the batches
                                     run (fixed + item * padded) / requests;
                                     a custom executor's busy time / threads
                                     / requests */
    double sched_overhead_us;     /* per_request_us - model_us_per_request
                                     (>= 0): everything per request that is
                                     not the model (batcher work, waking
                                     clients, CPU the clients take from the
                                     model on a shared host) */
    int64_t wrong_outputs;        /* outputs that failed the check */
    int64_t failed;               /* requests not completed with FP_OK */
} fp_batcher_bench_side;

typedef struct fp_batcher_bench_report {
    fp_batcher_bench_side baseline, batched;
    double speedup;               /* batched / baseline throughput */
    fp_ab_report ab;              /* per-request time A/B (speedup, verdict) */
    double batch1_cost_us;        /* model cost of a batch of 1 (executor p50,
                                     baseline) */
    double batch_cost_us;         /* executor p50 of the batched side */
} fp_batcher_bench_report;

/* Runs the request stream on the baseline then the batched side and fills
 * report. FP_OK: both sides completed every request with the right output.
 * FP_ERR_MISMATCH: an output was wrong or a request failed (report is still
 * filled: see wrong_outputs / failed). FP_ERR_INVALID_ARGUMENT for a bad
 * field (named); FP_ERR_OUT_OF_MEMORY; errors of fp_batcher_create or of a
 * submit (report untouched).
 * Thread-safe; starts the client threads (or one generator) plus the
 * batcher's own threads (executors, timer, completion) for each side. */
FP_API fp_status fp_batcher_bench(const fp_batcher_bench_config *config,
                                  fp_batcher_bench_report *report);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_BATCHER_H */
