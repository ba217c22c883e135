/*
 * libfastpath tracing: spans of library ops and user ranges, recorded into a
 * bounded ring per context, exported as a Chrome trace (Perfetto loads it)
 * or a SQLite database that profiling queries run against.
 *
 * The model
 *   - A span is one timed interval on one context: a name ("norm_fwd"), a
 *     category ("op", "range", "collective", or any of the caller's), the
 *     device and stream it ran on, its start and end, the bytes it moved
 *     and the FLOPs it did, and three tags taken when it began: the step
 *     counter and the module and stage of the innermost open user range.
 *   - Times: on a CPU context the monotonic clock (CLOCK_MONOTONIC, seconds)
 *     read on the calling thread at begin and at end. On a CUDA context two
 *     CUDA events recorded on the span's stream, resolved lazily (when spans
 *     are read, counted or exported, never on the recording path): the
 *     duration is cudaEventElapsedTime between the span's own events; the
 *     start is the elapsed time from the previous span's begin event (any
 *     stream of the context) added to that span's start, so consecutive
 *     spans stay placed to well under a microsecond however long the trace
 *     runs (cudaEventElapsedTime is a float of milliseconds). The first span
 *     after fp_trace_enable, fp_trace_clear or a gap in the ring counts from
 *     a base event recorded then, at the clock reading taken when it
 *     completed: an offset all later spans share.
 *   - The CUPTI timer (fp_trace_set_timer, or FASTPATH_TRACE_TIMER=cupti in
 *     the environment at a context's first fp_trace_enable): a CUDA span
 *     records no event. Its begin pushes an external correlation id on
 *     CUPTI's per-thread stack and its end pops it (host work only, no
 *     driver call), and CUPTI's activity records of the kernels, copies and
 *     sets the thread enqueued in between give the span's device times:
 *     start = the earliest start, end = the latest end, of its own work and
 *     of the spans begun inside it (on its thread; on any thread for a user
 *     range, which pushes nothing). These are the times Nsight Systems
 *     shows: a span starts when its first kernel does, not when the stream
 *     reached its begin. A span that enqueued no device work keeps the host
 *     clock's begin and end. Reading a CUPTI-timed ring synchronizes the
 *     device and flushes CUPTI's buffers. CUPTI is loaded when first chosen
 *     (FASTPATH_CUPTI_LIB, a loaded libcupti, the library path, the
 *     toolkit's); one process-wide collector serves every context. It
 *     coexists with no other CUPTI client (Nsight Systems, the PyTorch
 *     profiler): choosing it then fails with FP_ERR_UNSUPPORTED. A span
 *     ended on another thread than the one that began it stays on the
 *     beginning thread's CUPTI stack until that thread next begins or ends
 *     a span of the context (its launches meanwhile count to it). While it
 *     runs, CUPTI records the runtime and driver API calls that enqueue
 *     work (launches, copies, sets; the others are switched off): on an
 *     H200 a span's begin / end pair cost 1.5-2.2 us of host time and a
 *     launch ~3 us more (session 41), against 2.8 us for the events.
 *     FASTPATH_CUPTI_DEBUG=1 prints, at each flush, the records the
 *     collector has seen (API, external correlation, device; filed to
 *     spans, pending, lost); FASTPATH_CUPTI_API_FILTER=0 records every API.
 *   - The kernel timer (fp_trace_set_timer, or FASTPATH_TRACE_TIMER=kernel at
 *     a context's first fp_trace_enable): the library's ops whose kernels
 *     can stamp (the norms, forward and backward; attention, every kernel of
 *     its flash and row-wise paths) record no event either:
 *     the span hands its kernels a record in device memory; the first CTA
 *     of the op's first kernel writes the GPU's global timer there when it
 *     starts (after a programmatic dependent launch's wait) and every CTA
 *     of every kernel of the op raises the end to its own end. Begin and
 *     end are then host work only (the current device and capture
 *     queries, the ring, two clock readings). The times are the kernels'
 *     own, as Nsight Systems shows them (no launch gap, unlike two
 *     events), placed on the event timer's time line by a calibration (a
 *     one-thread kernel reading the global timer between two events)
 *     taken when the timer is chosen and at each fp_trace_enable /
 *     fp_trace_clear: to within fp_trace_stats.clock_error_s of the
 *     event-timed spans (half the calibration's width: a few
 *     microseconds); among themselves exact to the timer's resolution (32
 *     ns on an H100). Other spans (copies, fills, graph replays,
 *     collectives, user ranges, the attention baseline's cuBLAS GEMMs)
 *     keep two events. A stamped span whose op launched no kernel
 *     keeps the host clock's begin and end (counted in
 *     fp_trace_stats.host_timed).
 *     Rings of more than 65536 spans share the records: a span whose
 *     record a later one took before the ring was read is dropped and
 *     counted in unresolved. Reading a kernel-timed ring synchronizes the
 *     device and copies the records back. No GPU figure yet: a pair's host
 *     cost there is predicted at 0.2-0.5 us (benchmarks/NOTES.md, session
 *     42), not measured.
 *   - User ranges (fp_trace_push / fp_trace_pop) label a model's structure:
 *     each is itself a span (category "range"), and every span begun while
 *     it is open carries its module and stage. They form one stack per
 *     context, on the context's default stream (CUDA) or the calling thread
 *     (CPU). fp_trace_step advances the step counter spans are tagged with.
 *   - The ring holds `capacity` spans in the order they began. When it is
 *     full the OLDEST span is overwritten (the newest are kept: the last
 *     steps of a long run are the ones worth reading) and counted in
 *     fp_trace_stats.dropped, so missing data is always known. A span still
 *     open when its slot is overwritten is lost the same way (counted once).
 *   - Tracing is off by default. fp_trace_enable turns it on with a ring
 *     capacity; while it is off, fp_trace_begin is a single branch and sets
 *     the span handle to 0, and fp_trace_end of 0 does nothing, so an op is
 *     instrumented with one begin/end pair around its launch at no cost.
 *   - Spans are not recorded while the stream is being captured into a CUDA
 *     graph (an event record would become a graph node): they are counted in
 *     fp_trace_stats.skipped_capturing.
 *   - The caching allocator's allocated bytes at a span's begin are recorded
 *     when an allocator was attached with fp_trace_set_allocator (-1 else).
 *
 * Export
 *   - fp_trace_export_chrome: Chrome trace event JSON: one complete event
 *     ("ph": "X") per span with ts and dur in microseconds (ts from the
 *     earliest span written), pid = the CUDA device ordinal (FP_TRACE_CPU_PID
 *     for the CPU), tid = a small stream number (per pid, in order of first
 *     appearance; on a CPU context one per recording thread), "cat" = the
 *     category, args with step, module, stage, bytes, flops, allocated_mb;
 *     plus "M" metadata events naming each process and thread.
 *   - fp_trace_export_sqlite: tables torch_trace (one row per span) and
 *     nccl_trace (one row per span of category "collective"), replaced at
 *     each export, and runs (timing-engine A/B results, appended by
 *     fp_trace_sqlite_add_run, kept across exports). Columns are listed at
 *     the functions.
 *
 * Instrumented ops (one span each, begun after the call's argument checks:
 * a refused call records nothing; bytes and flops are the library's own
 * roofline counts, 0 where it has none)
 *   norm_fwd                fp_norm_forward (and _version)       "op", bytes fp_norm_forward_bytes
 *   norm_bwd                fp_norm_backward (and _version)      "op", bytes fp_norm_backward_bytes
 *   norm_fwd_unfused, norm_bwd_unfused
 *                           fp_norm_validate's / fp_norm_backward_validate's baseline, as above
 *   attention_fwd           fp_attention_forward                 "op", bytes Q, K, V, O once each,
 *                                                                 flops fp_attention_flops
 *   attention_decode        fp_attention_forward with seqlen_q <= 16 and seqlen_k > seqlen_q: as above
 *   attention_fwd_baseline  fp_attention_forward_baseline        "op", as attention_fwd
 *   graph_replay            fp_graph_replay, the graph cache's replays   "graph"
 *   pipeline_h2d, pipeline_compute, pipeline_d2h
 *                           each chunk's stages, on their streams "pipeline", bytes in_bytes / 0 / out_bytes
 *   batch_execute           each executor call of a batcher whose config names a trace_context   "batch"
 *   allreduce, allgather, reduce_scatter, broadcast
 *                           fp_comm_* (and the buckets' all-reduces) "collective", bytes fp_coll_bytes, nranks
 *   h2d, d2h                fp_mem_upload, fp_mem_download        "transfer", bytes the copy's
 *   synchronize             fp_context_synchronize (CUDA)         "sync": the host's wait, host-timed
 * The timing engine (timing.h): while the context traces, each measured
 * sample of fp_ab_run runs inside a user range of stage "baseline" or
 * "optimized" (fp_time's: "timed"), so the ops of each side carry it and a
 * verdict by stage judges each side (warm-up and check runs carry none).
 * The "optimized" range's span carries the spec's bytes and flops times
 * the sample's calls (fp_ab_spec: the optimized side's roofline), so a
 * callable that runs no instrumented op can be judged by its samples.
 * The validate / A/B calls time these ops: their runs are spans
 * (fp_norm_validate's baseline: "norm_fwd_unfused" / "norm_bwd_unfused",
 * with the op's required bytes). Ops captured into
 * a CUDA graph record nothing during the capture (skipped_capturing): the
 * replay's span stands for them (a CPU context's graph re-runs its function,
 * whose ops then record spans inside it). Collectives inside
 * fp_comm_group_start / end are spans of their enqueue only.
 *
 * NVTX
 *   The same hooks push an NVTX range named as the span (nvtxRangePushA,
 *   popped at its end; the toolkit's header-only NVTX3, which does nothing
 *   until Nsight Systems or Nsight Compute attaches) while the context
 *   traces, or always when the environment has FASTPATH_NVTX=1 (read once,
 *   at the process's first context). So a profile shows every op and
 *   stage without a ring: FASTPATH_NVTX=1 nsys profile ./app. User ranges
 *   (fp_trace_push / pop) open one too, named as their span, under the same
 *   condition at the push; as start / end ranges (nvtxRangeStartA), they
 *   may be popped on another thread. With both off an instrumented op pays
 *   one branch; a span with its range costs about 0.1 us of host time on a
 *   CPU context (test_trace_ops prints it).
 *
 * Thread-safety: every function is thread-safe on one context (a mutex per
 * context ring); the user-range stack is shared by the context's threads, so
 * push/pop nest meaningfully only when one thread drives them. Reading,
 * counting and exporting a CUDA context's spans waits for their end events
 * (the CUPTI timer: synchronizes the device and flushes CUPTI) while holding
 * that mutex (recording on other threads waits too).
 */
#ifndef FASTPATH_TRACE_H
#define FASTPATH_TRACE_H

#include "fastpath/core.h"
#include "fastpath/timing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes of the span's text fields, terminating NUL included: longer names
 * are truncated. */
#define FP_TRACE_NAME_MAX 64
#define FP_TRACE_CATEGORY_MAX 32
#define FP_TRACE_MODULE_MAX 64
#define FP_TRACE_STAGE_MAX 32
/* Deepest user-range nesting (fp_trace_push). */
#define FP_TRACE_MAX_DEPTH 64
/* The Chrome trace's pid of CPU-context spans (CUDA spans: the device ordinal). */
#define FP_TRACE_CPU_PID 65535

typedef struct fp_trace_span {
    size_t struct_size;                  /* set by fp_trace_span_init */
    char name[FP_TRACE_NAME_MAX];        /* op or range name */
    char category[FP_TRACE_CATEGORY_MAX]; /* "op", "range", "collective", ... */
    char module[FP_TRACE_MODULE_MAX];    /* innermost open range's module, "" if none */
    char stage[FP_TRACE_STAGE_MAX];      /* innermost open range's stage, "" if none */
    int64_t step;                        /* step counter at begin */
    int device;                          /* CUDA ordinal, -1 for the CPU */
    int depth;                           /* user ranges open at begin (a range: its own level) */
    uint64_t stream;                     /* cudaStream_t as an integer (CUDA), the recording
                                            thread's id (CPU) */
    double start_s, end_s;               /* trace clock, seconds (see "The model") */
    double bytes;                        /* bytes moved (0: unknown) */
    double flops;                        /* floating-point operations (0: unknown) */
    double allocated_bytes;              /* allocator's allocated bytes at begin, -1: unknown */
    int nranks;                          /* collectives: ranks taking part (0: unknown) */
    int pad_;
} fp_trace_span;

/* Initializes a span for fp_trace_record: zeroes it, sets struct_size,
 * device -1, allocated_bytes -1. FP_ERR_INVALID_ARGUMENT on NULL or a bad
 * size. */
FP_API fp_status fp_trace_span_init_sized(fp_trace_span *span, size_t struct_size);
#define fp_trace_span_init(span) fp_trace_span_init_sized((span), sizeof *(span))

typedef struct fp_trace_stats {
    size_t struct_size;       /* set by the caller: sizeof(fp_trace_stats) */
    size_t capacity;          /* the ring's capacity (0: never enabled) */
    size_t count;             /* spans in the ring now, open ones included */
    size_t open;              /* spans begun and not ended, user ranges included */
    uint64_t recorded;        /* spans completed since enable / clear */
    uint64_t dropped;         /* spans overwritten when the ring was full */
    uint64_t skipped_capturing; /* spans not recorded: their stream was capturing */
    uint64_t unresolved;      /* CUDA spans whose events could not be read (dropped) */
    int64_t step;             /* the step counter */
    int depth;                /* user ranges open now */
    int enabled;              /* 1 while recording */
    int timer;                /* fp_trace_timer of spans begun now (added in 0.3.x: a smaller struct_size omits it) */
    double clock_error_s;     /* the kernel timer: how far its spans may be placed off the event-timed ones
                                 (half the calibration's width; 0 until calibrated; added in 0.4) */
    uint64_t host_timed;      /* the kernel timer: spans of stamping ops that no kernel stamped (the op
                                 launched none: an error, empty work), timed by the host clock around
                                 the call instead (added in 0.4) */
} fp_trace_stats;

/* How a CUDA context's spans are timed (CPU contexts: the clock, always). */
typedef enum fp_trace_timer {
    FP_TRACE_TIMER_EVENTS = 0, /* two CUDA events per span (the default) */
    FP_TRACE_TIMER_CUPTI = 1,  /* CUPTI activity records, no driver call per span */
    FP_TRACE_TIMER_KERNEL = 2  /* the library's kernels stamp their spans: no driver call per span */
} fp_trace_timer;

/* ======================================================================== */
/*  Switching on and off                                                    */
/* ======================================================================== */

/* Starts recording on ctx into a ring of `capacity` spans (each about 300
 * bytes of host memory; on a CUDA context also two CUDA events per slot,
 * created at the slot's first use and kept until the context goes). If a ring exists with another capacity it is
 * replaced (its spans are discarded, counters reset); with the same capacity
 * it is kept. CUDA contexts record a base event on the default stream and
 * wait for it. Errors: FP_ERR_INVALID_ARGUMENT (NULL ctx, capacity 0 or
 * above 2^26), FP_ERR_OUT_OF_MEMORY, FP_ERR_CUDA; on error the previous
 * state (on or off, its ring) stays. */
FP_API fp_status fp_trace_enable(fp_context *ctx, size_t capacity);
/* Stops recording; the ring stays readable and exportable. Spans open now
 * are still completed by their fp_trace_end. Idempotent.
 * FP_ERR_INVALID_ARGUMENT for a NULL ctx. */
FP_API fp_status fp_trace_disable(fp_context *ctx);
/* 1 while ctx records spans, 0 otherwise (and for NULL). */
FP_API int fp_trace_is_enabled(const fp_context *ctx);
/* Empties the ring and resets the counters (not the step counter, not the
 * open user ranges, whose spans are lost: their pops still succeed).
 * CUDA: re-bases the clock (waits for the default stream). FP_OK when
 * tracing was never enabled. Errors: FP_ERR_INVALID_ARGUMENT, FP_ERR_CUDA. */
FP_API fp_status fp_trace_clear(fp_context *ctx);

/* Attaches the caching allocator (alloc.h) whose allocated bytes every span
 * records at its begin (read with fp_alloc_get_stats: adds its lock and
 * about 50 ns to each begin); NULL detaches. The allocator must outlive its
 * use: detach it before destroying it. FP_ERR_INVALID_ARGUMENT for a NULL
 * ctx or when fp_trace_enable was never called on it. */
struct fp_allocator;
/* Chooses the timer of the spans begun from now on (spans already recorded
 * keep theirs); may be called before fp_trace_enable. FP_TRACE_TIMER_CUPTI
 * on a CUDA context loads CUPTI and starts its collector;
 * FP_TRACE_TIMER_KERNEL allocates its records (32 bytes of device memory a
 * span, up to 65536) and calibrates its clock (three one-thread kernels,
 * each waited for). On a CPU context any is accepted and spans keep the
 * clock. Errors: FP_ERR_INVALID_ARGUMENT (NULL ctx, unknown timer),
 * FP_ERR_UNSUPPORTED (CUPTI not found, of another major version, or in use
 * by another tool: the message says which), FP_ERR_OUT_OF_MEMORY,
 * FP_ERR_CUDA; on error the timer is unchanged. */
FP_API fp_status fp_trace_set_timer(fp_context *ctx, fp_trace_timer timer);
/* The timer of spans begun now (FP_TRACE_TIMER_EVENTS for NULL or a context
 * that never traced). */
FP_API fp_trace_timer fp_trace_get_timer(const fp_context *ctx);

FP_API fp_status fp_trace_set_allocator(fp_context *ctx, struct fp_allocator *allocator);

/* ======================================================================== */
/*  Recording                                                               */
/* ======================================================================== */

/* Begins a span of an op about to run on `stream` (NULL: the context's
 * default stream; ignored on a CPU context). name and category must be
 * non-empty (copied, truncated to the sizes above); bytes and flops finite
 * and >= 0. *span is the handle to pass to fp_trace_end: 0 when tracing is
 * off or the stream is capturing (nothing recorded, FP_OK). Errors:
 * FP_ERR_INVALID_ARGUMENT (NULL ctx / name / category / span, bad bytes or
 * flops), FP_ERR_CUDA (the event record failed); *span is 0 after any
 * error. */
FP_API fp_status fp_trace_begin(fp_context *ctx, fp_stream stream, const char *name, const char *category,
                                double bytes, double flops, uint64_t *span);
/* fp_trace_begin of a collective: category "collective", name = the
 * operation ("allreduce", "allgather", "reduce_scatter", "broadcast",
 * "reduce", ...), `bytes` its size as nccl-tests count it, `nranks` the
 * ranks taking part (>= 1; 0: unknown). nccl_trace's busbw uses both. */
FP_API fp_status fp_trace_begin_collective(fp_context *ctx, fp_stream stream, const char *op, double bytes,
                                           int nranks, uint64_t *span);
/* Ends a span from fp_trace_begin (its end time: clock or an event on its
 * stream). 0 is a no-op. A span whose slot was overwritten meanwhile is
 * already counted as dropped: FP_OK. Errors: FP_ERR_INVALID_ARGUMENT (NULL
 * ctx, a handle this ring never issued, a span already ended),
 * FP_ERR_CUDA (the event record failed: the span is dropped). */
FP_API fp_status fp_trace_end(fp_context *ctx, uint64_t span);

/* Opens a user range: a span of category "range" named "module/stage"
 * (or whichever is non-empty), whose module and stage tag every span begun
 * until the matching fp_trace_pop. NULL or "" for module or stage inherits
 * the enclosing range's. Ranges are recorded only while tracing is on, but
 * the stack is kept either way, so a pop always matches its push.
 * Errors: FP_ERR_INVALID_ARGUMENT (NULL ctx, both names empty, deeper than
 * FP_TRACE_MAX_DEPTH, fp_trace_enable never called on ctx), FP_ERR_CUDA; on
 * error nothing was pushed. */
FP_API fp_status fp_trace_push(fp_context *ctx, const char *module, const char *stage);
/* Closes the innermost user range. FP_ERR_INVALID_ARGUMENT ("unbalanced
 * pop") when none is open (or tracing was never enabled): nothing changes and
 * recording goes on.
 * FP_ERR_CUDA if the end event failed (the range is popped and dropped). */
FP_API fp_status fp_trace_pop(fp_context *ctx);

/* Advances the step counter by one (a training or decode step); *step
 * (optional) receives the new value. FP_ERR_INVALID_ARGUMENT for NULL ctx or
 * when fp_trace_enable was never called on it (as for fp_trace_set_step). */
FP_API fp_status fp_trace_step(fp_context *ctx, int64_t *step);
/* Sets the step counter (>= 0; 0 after fp_trace_enable first creates the
 * ring). FP_ERR_INVALID_ARGUMENT for NULL ctx, a negative step, or no ring. */
FP_API fp_status fp_trace_set_step(fp_context *ctx, int64_t step);

/* Records a complete span given in full: times, tags, device and stream as
 * the caller sets them (so a test or an importer controls every value). It
 * goes into the ring as a finished span whether recording is on or off,
 * once fp_trace_enable has created the ring. Errors: FP_ERR_INVALID_ARGUMENT
 * (NULL, a bad struct_size, empty name or category, non-finite times, end
 * before start, negative bytes / flops / step / nranks, no ring yet). */
FP_API fp_status fp_trace_record(fp_context *ctx, const fp_trace_span *span);

/* ======================================================================== */
/*  Reading                                                                 */
/* ======================================================================== */

/* Counters and sizes (CUDA: after resolving finished spans); all zero when
 * tracing was never enabled. out->struct_size must be set (versioned
 * struct, core.h "Conventions"). Errors: FP_ERR_INVALID_ARGUMENT (NULL, a
 * bad struct_size: *out untouched). */
FP_API fp_status fp_trace_get_stats(fp_context *ctx, fp_trace_stats *out);
/* Copies the finished spans, oldest first, at most `max` (the newest `max`
 * when there are more), into out[] (elements of span_size bytes: pass
 * sizeof(fp_trace_span)); *n receives how many. CUDA: waits for their end
 * events, and for the begin events of spans still open (the CUPTI timer:
 * synchronizes the device when a finished span is unresolved, then reads
 * CUPTI's records). With clear != 0 the ring is emptied afterwards as
 * fp_trace_clear does. Errors: FP_ERR_INVALID_ARGUMENT (NULL ctx / n, out NULL with max >
 * 0, a bad span_size), FP_ERR_CUDA (clear's re-base). max 0 gives *n = the
 * number of finished spans. */
FP_API fp_status fp_trace_read_sized(fp_context *ctx, fp_trace_span *out, size_t span_size, size_t max,
                                     size_t *n, int clear);
#define fp_trace_read(ctx, out, max, n, clear) \
    fp_trace_read_sized((ctx), (out), sizeof(fp_trace_span), (max), (n), (clear))

/* ======================================================================== */
/*  Export                                                                  */
/* ======================================================================== */

/* Writes the finished spans as Chrome trace event JSON to `path`, atomically:
 * a temporary file in the same directory renamed over path, so a failure
 * never leaves a partial file (nor touches an existing one). The ring is
 * unchanged. Errors: FP_ERR_INVALID_ARGUMENT (NULL), FP_ERR_IO (the
 * directory is missing or not writable, a write failed: path and the
 * system's reason in the message), FP_ERR_OUT_OF_MEMORY. */
FP_API fp_status fp_trace_export_chrome(fp_context *ctx, const char *path);

/* Writes the finished spans into the SQLite database `path` (created if
 * missing), in one transaction (a failure leaves the database as it was,
 * and removes it if this call created it):
 *   torch_trace(id, name, category, step, module, stage, duration, bytes,
 *               flops, allocated, device, stream, start, depth)
 *       one row per span; duration in seconds; start in seconds from the
 *       earliest span written; allocated in MB (2^20 bytes), NULL when
 *       unknown; module / stage NULL outside user ranges; stream the same
 *       small number as the Chrome trace's tid.
 *   nccl_trace(id, operation, bytes, duration, algbw, busbw, nranks, step,
 *              device, stream, start)
 *       one row per span of category "collective"; duration in ms; algbw =
 *       bytes / duration in GB/s (1e9 bytes); busbw = algbw times the NCCL
 *       convention's factor for the operation and nranks n: allreduce
 *       2(n-1)/n, allgather and reduce_scatter (n-1)/n, broadcast / reduce /
 *       others 1 (fp_coll_busbw_factor's, comm.h, matched on the name,
 *       case and '_' ignored); equal to algbw when nranks is unknown; both
 *       NULL for a zero-length span.
 *   runs (see fp_trace_sqlite_add_run): created if missing, never emptied.
 * torch_trace and nccl_trace are replaced at every export. Attached as
 * `python` (ATTACH 'path' AS python) the tables answer queries written
 * against python.torch_trace / python.nccl_trace. Sums over module or stage
 * count a range and the spans inside it both: select a category (or a
 * depth) to sum one level. Errors: FP_ERR_INVALID_ARGUMENT (NULL), FP_ERR_IO
 * (cannot open or write the database: SQLite's message), FP_ERR_OUT_OF_MEMORY. */
FP_API fp_status fp_trace_export_sqlite(fp_context *ctx, const char *path);

/* Appends one timing-engine A/B result (fp_ab_run's report) to the table
 * runs of the SQLite database `path` (created if missing):
 *   runs(id, time, label, git_commit, baseline_median_ms, baseline_p10_ms,
 *        baseline_p90_ms, baseline_noise, baseline_samples,
 *        optimized_median_ms, optimized_p10_ms, optimized_p90_ms,
 *        optimized_noise, optimized_samples, speedup, verdict, compared,
 *        max_abs_err, passed, achieved_gbps, achieved_tflops, pct_of_peak,
 *        bound)
 * time is UTC ISO 8601; git_commit may be NULL (stored NULL); max_abs_err
 * and passed are NULL when the outputs were not compared. Thread-safe
 * (SQLite's locking; a database busy for 5 s is FP_ERR_IO). Errors:
 * FP_ERR_INVALID_ARGUMENT (NULL path / label / report), FP_ERR_IO. */
FP_API fp_status fp_trace_sqlite_add_run(const char *path, const char *label, const char *git_commit,
                                         const fp_ab_report *report);

/* ======================================================================== */
/*  The verdict: what bounds a workload                                     */
/* ======================================================================== */
/*
 * Five things bound a GPU workload, each with its own fix. The verdict reads
 * them off a set of spans (a context's ring, or spans read or built by the
 * caller) and the device's roofs:
 *   compute    the ops' FLOP rate near the compute roof (tensor or FMA peak)
 *   memory     the ops' byte rate near the measured copy bandwidth
 *   launch     the device idle between ops: the host cannot issue work fast
 *              enough (launch overhead, host work between launches)
 *   transfer   host<->device copies and collectives not hidden under ops
 *   sync       the host blocked waiting on the device, and the device idle
 *              that wait leaves behind it
 *
 * How spans are read
 *   - Classes: category "range" (user ranges) is structure: it widens the
 *     window of the whole set (a step range's host time is the workload's)
 *     but is no work. Category FP_TRACE_SYNC ("sync") is a host wait
 *     (fp_context_synchronize records one; callers record their own: it is
 *     timed by the host clock, on CUDA contexts too). Category
 *     FP_TRACE_TRANSFER ("transfer": fp_mem_upload / fp_mem_download record
 *     "h2d" / "d2h"), the pipeline's "pipeline_h2d" / "pipeline_d2h" and
 *     category "collective" are transfers. Everything else is an op: the
 *     device busy.
 *   - The timeline of the whole set: busy = the union of op spans; exposed
 *     transfer = the union of transfer spans outside it; the rest of the
 *     window is idle. An idle interval that a sync span overlaps or touches
 *     is sync (the wait, and the drain-and-refill bubble after it: the host
 *     could not run ahead); any other idle interval is launch. So busy +
 *     transfer + launch + sync = the window, and each share is a fraction
 *     of it.
 *   - A group (the spans of one name, module, stage or category) is charged
 *     its own busy and transfer time, the launch gaps its spans end
 *     (the gap before each of its spans) and the sync gaps its sync spans
 *     overlap: its window is their sum.
 *   - compute_pct = the group's FLOPs / busy time, as a % of the compute
 *     roof (compute_tflops, or fma_tflops when that is 0); memory_pct = its
 *     bytes / busy time, % of copy_gbps. Unknown (-1) without FLOPs / bytes
 *     or the roof. Multi-stream overlap counts once (the union).
 *   - The bound is the largest of the shares busy, transfer, launch, sync
 *     (ties in that order); a busy group is compute-bound when compute_pct
 *     >= memory_pct, else memory-bound; unknown when neither is known or the
 *     group has no time. The reason states the numbers; the remedy names
 *     the library capability that addresses it.
 *   - Limits: a CUDA context's op spans are event times on the device and
 *     its sync spans host-clock times, aligned at the ring's base event (the
 *     host clock read just after the base event completed: ops appear late
 *     by that wake-up latency, typically 5-20 us). Spans carry no roofline
 *     figures for ops that count none (graph replays, batch executions:
 *     their ops inside do, on CPU contexts).
 */

/* Categories the verdict reads (fp_trace_begin's category). */
#define FP_TRACE_SYNC "sync"         /* a host wait: host-timed on every context */
#define FP_TRACE_TRANSFER "transfer" /* a host<->device copy */

typedef enum fp_bound {
    FP_BOUND_UNKNOWN = 0,
    FP_BOUND_COMPUTE = 1,
    FP_BOUND_MEMORY = 2,
    FP_BOUND_LAUNCH = 3,
    FP_BOUND_TRANSFER = 4,
    FP_BOUND_SYNC = 5,
} fp_bound;

/* "unknown", "compute", "memory", "launch", "transfer", "sync" ("?" out of range). */
FP_API const char *fp_bound_name(fp_bound bound);

/* What a workload is measured against. 0 (or less) means unknown. */
typedef struct fp_trace_roofs {
    size_t struct_size;     /* set by fp_trace_roofs_init */
    double compute_tflops;  /* tensor-core (bf16 dense) peak; 0 on a CPU */
    double fma_tflops;      /* FP32 FMA peak (CUDA: from the clocks; CPU: measured) */
    double copy_gbps;       /* measured device copy bandwidth, read + write (fp_measure_copy_bandwidth) */
    double pinned_gbps;     /* measured host->device copy from pinned memory (CPU: memcpy) */
} fp_trace_roofs;

FP_API fp_status fp_trace_roofs_init_sized(fp_trace_roofs *roofs, size_t struct_size);
#define fp_trace_roofs_init(roofs) fp_trace_roofs_init_sized((roofs), sizeof *(roofs))

/* Fills the roofs of ctx's device: peaks from fp_context_device_info and
 * three short measurements (copy bandwidth over 256 MiB on CUDA / 64 MiB on
 * a CPU; a 64 MiB pinned host->device copy; on a CPU, an FMA loop on the
 * context's worker threads). About 0.1-0.5 s. Records no span (it calls
 * the runtime directly). Errors: FP_ERR_INVALID_ARGUMENT, FP_ERR_OUT_OF_MEMORY,
 * FP_ERR_CUDA; *out untouched on error. */
FP_API fp_status fp_trace_roofs_measure(fp_context *ctx, fp_trace_roofs *out);

typedef enum fp_trace_group_by {
    FP_TRACE_GROUP_ALL = 0,      /* every span (key ignored): the group "all" */
    FP_TRACE_GROUP_NAME = 1,
    FP_TRACE_GROUP_MODULE = 2,
    FP_TRACE_GROUP_STAGE = 3,
    FP_TRACE_GROUP_CATEGORY = 4,
} fp_trace_group_by;

typedef struct fp_trace_verdict {
    size_t struct_size;             /* set by the caller: sizeof(fp_trace_verdict) */
    char group[FP_TRACE_MODULE_MAX]; /* the key, "all" for FP_TRACE_GROUP_ALL */
    size_t spans;                   /* spans in the group (ranges not counted) */
    double window_s;                /* the group's time: busy + transfer + launch + sync */
    double busy_s, transfer_s, launch_s, sync_s;
    double busy_pct, transfer_pct, launch_pct, sync_pct; /* of window_s, each 0..100 */
    double bytes, flops;            /* summed over the group's op spans */
    double compute_pct;             /* FLOP rate over busy_s, % of the compute roof; -1 unknown */
    double memory_pct;              /* byte rate over busy_s, % of copy_gbps; -1 unknown */
    double transfer_bytes;          /* of its host<->device copies (collectives not counted) */
    double transfer_gbps;           /* transfer_bytes / their time; -1 without copies */
    double transfer_pct_of_peak;    /* of pinned_gbps; -1 unknown */
    int collectives;                /* 1: collectives took more of transfer_s than copies */
    fp_bound bound;
    const char *remedy;             /* static text: the capability that addresses the bound */
    char reason[256];               /* the numbers behind the bound */
} fp_trace_verdict;

/* The verdict of one group of `spans` (n elements of span_size bytes: pass
 * sizeof(fp_trace_span)), the timeline built from all of them. by / key
 * select the group (key ignored for FP_TRACE_GROUP_ALL). roofs may be NULL
 * (all unknown). n 0 or an empty window: bound unknown, FP_OK. Errors:
 * FP_ERR_INVALID_ARGUMENT (NULL out / key, spans NULL with n > 0, a bad
 * struct or span size, a bad `by`, a span with end before start or
 * non-finite times), FP_ERR_NOT_FOUND (no span has that key),
 * FP_ERR_OUT_OF_MEMORY. Pure: thread-safe. */
FP_API fp_status fp_trace_verdict_spans(const fp_trace_span *spans, size_t n, size_t span_size,
                                        fp_trace_group_by by, const char *key, const fp_trace_roofs *roofs,
                                        fp_trace_verdict *out);

/* One verdict per distinct key of `by` among the spans (ranges excluded; for
 * MODULE / STAGE, spans with an empty key are left out), largest window
 * first, at most `max` into out[] (elements of verdict_size bytes: pass
 * sizeof(fp_trace_verdict)); *count receives how many groups there are (max
 * 0 counts only). Errors as fp_trace_verdict_spans, and FP_ERR_INVALID_ARGUMENT
 * for FP_TRACE_GROUP_ALL or out NULL with max > 0. */
FP_API fp_status fp_trace_verdict_groups(const fp_trace_span *spans, size_t n, size_t span_size,
                                         fp_trace_group_by by, const fp_trace_roofs *roofs,
                                         fp_trace_verdict *out, size_t verdict_size, size_t max, size_t *count);

/* fp_trace_verdict_spans over ctx's finished spans (fp_trace_read). */
FP_API fp_status fp_trace_verdict_context(fp_context *ctx, fp_trace_group_by by, const char *key,
                                          const fp_trace_roofs *roofs, fp_trace_verdict *out);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_TRACE_H */
