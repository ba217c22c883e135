/*
 * libfastpath pipelines: move chunks of host data through the device with
 * host<->device copies overlapped with compute.
 *
 * Why
 *   A synchronous copy leaves the GPU idle while data crosses the link, and a
 *   copy from pageable memory runs at a fraction of the link's speed (the
 *   driver stages it through a small pinned buffer of its own). Overlapping
 *   needs pinned memory, separate streams per direction (H2D and D2H run on
 *   different copy engines), several buffers in flight and events that order
 *   the stages without the host waiting. Every serving or data-loading loop
 *   rewrites this; here it is one object.
 *
 * API tiers
 *   1. Copy bandwidth (fp_copy_bandwidth): what the link gives for pageable,
 *      pinned, registered and write-combined host memory, each direction:
 *      the roofline the pipeline's copies are judged against.
 *   2. The pipeline (fp_pipeline_*): submit chunks (host input, optional
 *      host output); each chunk goes
 *         stage     pageable input copied into a pinned staging buffer by
 *                   host threads (pinned or registered input skips it)
 *         h2d       pinned -> device, on the pipeline's H2D stream
 *         compute   your callback enqueues work (library ops, cuBLAS, your
 *                   kernels) on the compute stream: input d_in, output d_out
 *         d2h       d_out -> pinned (or straight into a pinned host_out), on
 *                   the D2H stream
 *         complete  pinned -> host_out for a pageable one, then your
 *                   completion callback, in submission order
 *      with `depth` chunks in flight, events between the stages (no host
 *      synchronization on the submitting thread or between stages), bounded
 *      chunks and bytes in flight (submit blocks, or fails with a timeout),
 *      cancellation, error propagation, flush and destroy with work in
 *      flight. Statistics: busy time per stage, achieved H2D / D2H GB/s,
 *      overlap efficiency, compute-stream idle time.
 *   3. The built-in A/B (fp_pipeline_validate): the same chunks pageable,
 *      synchronous, one stream (copy, compute, copy back) against the
 *      pipeline, timed, outputs compared.
 *
 * Memory
 *   Staging buffers come from a caching allocator over pinned memory (one
 *   you pass, such as a pinned pool's (pinned.h), or that of a pinned pool
 *   the pipeline makes for itself), each at the size asked for (no
 *   power-of-two rounding), taken on stream NULL (where a pool's reserve
 *   puts its segments), and go back to it on destroy, recorded on the copy
 *   streams so that a later user gets them only once those copies
 *   completed. Device
 *   buffers (depth x (max_in_bytes + max_out_bytes)) are allocated at create
 *   and never during a run.
 *
 * CPU contexts
 *   Everything works on a CPU context: "device" memory is host memory, the
 *   copies are memcpy done by the stage that would enqueue them, events are
 *   timestamps. Ordering, back-pressure, cancellation, errors and statistics
 *   are the same code, so they are tested without a GPU.
 *
 * Threads
 *   A pipeline runs a dispatcher thread (staging, enqueueing the copies and
 *   calling compute, in submission order), a completion thread (waits on
 *   each chunk's last event, calls complete, in submission order) and
 *   2 x (staging_threads - 1) helpers for large staging copies (inputs in,
 *   outputs out). fp_pipeline_submit,
 *   flush, cancel, close and stats are thread-safe. The compute callback runs
 *   on the dispatcher thread, the completion callback on the completion
 *   thread; neither may call fp_pipeline_flush / close / destroy of its own
 *   pipeline (FP_ERR_INVALID_ARGUMENT: it would wait for itself), nor submit
 *   to it when that could block (submit with timeout_ms = 0 is allowed).
 */
#ifndef FASTPATH_PIPELINE_H
#define FASTPATH_PIPELINE_H

#include "fastpath/alloc.h"
#include "fastpath/core.h"
#include "fastpath/pinned.h"
#include "fastpath/timing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/*  Copy bandwidth                                                          */
/* ======================================================================== */

typedef enum fp_host_memory_kind {
    FP_HOST_PAGEABLE = 0,       /* malloc'd: the driver stages it */
    FP_HOST_PINNED = 1,         /* cudaHostAlloc (portable) */
    FP_HOST_REGISTERED = 2,     /* malloc'd, then cudaHostRegister */
    FP_HOST_WRITE_COMBINED = 3  /* cudaHostAlloc write-combined: fast H2D, slow CPU reads */
} fp_host_memory_kind;

typedef enum fp_copy_direction { FP_COPY_H2D = 0, FP_COPY_D2H = 1 } fp_copy_direction;

/* "pageable", "pinned", "registered", "write_combined"; "unknown" otherwise. */
FP_API const char *fp_host_memory_kind_name(fp_host_memory_kind kind);

/* Measures copies of `bytes` (0: 256 MiB) between host memory of `kind` and
 * device memory, in one direction, with the timing engine (cfg NULL:
 * defaults), and sets *gbps (bytes / median time, 1e9 bytes per GB) and, if
 * stats is not NULL, the timing statistics. Allocates and frees the host
 * buffer and one device buffer. On a CPU context every kind is plain memory
 * and the copy is memcpy (a figure for the host's memory, not a link).
 * One copy into a poisoned destination is checked against the source
 * before any is timed.
 * Errors: FP_ERR_INVALID_ARGUMENT (NULL ctx / gbps, unknown kind or
 * direction, a bad cfg), FP_ERR_OUT_OF_MEMORY, FP_ERR_CUDA, FP_ERR_MISMATCH
 * (the checked copy did not move the source's bytes). Not thread-safe with
 * other timing on the same context. */
FP_API fp_status fp_copy_bandwidth(fp_context *ctx, fp_host_memory_kind kind, fp_copy_direction dir,
                                   size_t bytes, const fp_timing_config *cfg, double *gbps,
                                   fp_stats *stats);

/* ======================================================================== */
/*  The pipeline                                                            */
/* ======================================================================== */

typedef struct fp_pipeline fp_pipeline;

/* One chunk as the callbacks see it. Written by the library, read by the
 * callbacks (fields are only ever appended). */
typedef struct fp_pipeline_chunk {
    uint64_t seq;          /* 0, 1, 2, ... in submission order */
    const void *host_in;   /* as submitted */
    size_t in_bytes;
    void *host_out;        /* as submitted (NULL: no output) */
    size_t out_bytes;
    const void *d_in;      /* compute: the input's device copy (in_bytes) */
    void *d_out;           /* compute: where the output goes (out_bytes, max_out_bytes
                              available); NULL when out_bytes is 0 */
    void *tag;             /* the caller's per-chunk pointer */
} fp_pipeline_chunk;

/* Enqueues the chunk's compute on `stream` (the pipeline's compute stream;
 * on a CPU context NULL, and the work is done in the call). It must not
 * synchronize the stream or read d_out on the host. Returning anything but
 * FP_OK fails this chunk (its d2h is skipped, complete gets the status and
 * the message the callback recorded); other chunks go on. */
typedef fp_status (*fp_pipeline_compute_fn)(void *user, fp_stream stream, const fp_pipeline_chunk *chunk);

/* Called once per submitted chunk, in submission order, on the completion
 * thread: status FP_OK (host_out holds the output), or why the chunk failed:
 * its compute's status, FP_ERR_CUDA (a copy or the device failed),
 * FP_ERR_CANCELLED (fp_pipeline_cancel or destroy before it started).
 * `message` is the failure's detail ("" on success). After it returns the
 * chunk's host memory is the caller's again. */
typedef void (*fp_pipeline_complete_fn)(void *user, const fp_pipeline_chunk *chunk, fp_status status,
                                        const char *message);

typedef struct fp_pipeline_config {
    size_t struct_size;          /* set by fp_pipeline_config_default */
    /* Chunks whose stages overlap: each has its own staging and device
     * buffers. 2 overlaps copy with compute; 3 (the default) also keeps
     * both copy engines busy while a chunk computes. 1 to 64. */
    int depth;
    /* Largest chunk input, and largest output (0: chunks have no output and
     * no d2h stage). Required: max_in_bytes > 0. */
    size_t max_in_bytes;
    size_t max_out_bytes;
    /* Back-pressure: submitted chunks not yet completed (0: 4 x depth) and
     * their input bytes (0: no byte limit beyond the chunk count). A chunk
     * larger than the byte limit is refused, not queued forever. */
    int max_chunks_in_flight;
    size_t max_bytes_in_flight;
    /* Host threads per direction that copy a pageable chunk into pinned
     * memory, and a staged output out of it (0: half the cores, 1 to 8;
     * 1: the dispatcher / completion thread alone). With pageable data
     * these memcpys set the pipeline's pace: on a 16-core H100 VM one
     * thread moved 8.6 GB/s, 4 threads 24, 8 threads 41 (fastbench
     * pipeline/host_memcpy), against a 55 GB/s link each way; 8 threads a
     * direction brought a 1 GiB overlap at 64 MiB chunks from 2.1-2.3x to
     * 1.5x its copy bound (benchmarks/NOTES.md, session 12). */
    int staging_threads;
    fp_pipeline_compute_fn compute;   /* required */
    fp_pipeline_complete_fn complete; /* optional (NULL: see flush's status) */
    void *user;                       /* passed to both callbacks */
    /* Staging memory: a caching allocator over pinned (or, on a CPU context,
     * host) memory, such as fp_pinned_pool_allocator's (pinned.h); NULL:
     * the pipeline creates a pinned pool of its own, whose chunk_bytes
     * covers the largest staging buffer. Borrowed: it must outlive the
     * pipeline. */
    fp_allocator *pinned;
} fp_pipeline_config;

/* Fills the defaults above (compute NULL: set it). */
FP_API fp_status fp_pipeline_config_default_sized(fp_pipeline_config *cfg, size_t struct_size);
#define fp_pipeline_config_default(cfg) fp_pipeline_config_default_sized((cfg), sizeof *(cfg))

/* Creates a pipeline on ctx (CUDA: three non-blocking streams, H2D, compute
 * and D2H, on ctx's device; CPU: none). Allocates every staging and device
 * buffer now. Errors: FP_ERR_INVALID_ARGUMENT (NULL ctx/cfg/out/compute,
 * depth outside [1, 64], max_in_bytes 0, max_bytes_in_flight below
 * max_in_bytes, negative counts, struct_size), FP_ERR_OUT_OF_MEMORY (the
 * buffers; nothing is left allocated), FP_ERR_CUDA. Thread-safe. */
FP_API fp_status fp_pipeline_create(fp_context *ctx, const fp_pipeline_config *cfg, fp_pipeline **out);

/* Submits a chunk: in_bytes (1 to max_in_bytes) of host_in, pageable or
 * pinned, and, when out_bytes > 0 (at most max_out_bytes), host_out to
 * receive the output. Both must stay valid, and host_in unchanged, until
 * the chunk's completion callback has returned (or flush returned). The
 * chunk's seq is written to *seq if seq is not NULL.
 * Back-pressure: while max_chunks_in_flight chunks, or max_bytes_in_flight
 * bytes, are in flight, waits: timeout_ms < 0 without limit, 0 not at all
 * (FP_ERR_QUEUE_FULL), > 0 up to that long (FP_ERR_TIMEOUT). Nothing is
 * queued on any error.
 * Errors: FP_ERR_INVALID_ARGUMENT (NULL p / host_in, in_bytes 0 or above
 * max_in_bytes, out_bytes above max_out_bytes, out_bytes > 0 with a NULL
 * host_out, a blocking submit from the pipeline's own callback),
 * FP_ERR_QUEUE_FULL, FP_ERR_TIMEOUT, FP_ERR_SHUT_DOWN (after close, or
 * destroy began). Thread-safe: chunks submitted concurrently get seqs in
 * the order their submits took the pipeline's lock. */
FP_API fp_status fp_pipeline_submit(fp_pipeline *p, const void *host_in, size_t in_bytes, void *host_out,
                                    size_t out_bytes, void *tag, int64_t timeout_ms, uint64_t *seq);

/* Waits until every chunk submitted before the call has completed (its
 * callback returned): timeout_ms < 0 without limit, else up to that long
 * (FP_ERR_TIMEOUT; the chunks go on). Returns FP_OK when all chunks that
 * completed since the previous flush succeeded, else the status of the
 * first that failed, with a message naming its seq and cause (cancelled
 * chunks count as failed: FP_ERR_CANCELLED). FP_ERR_INVALID_ARGUMENT from
 * the pipeline's own callbacks. Thread-safe. */
FP_API fp_status fp_pipeline_flush(fp_pipeline *p, int64_t timeout_ms);

/* Cancels every chunk submitted so far that has not started (its h2d not
 * enqueued): each completes, in order, with FP_ERR_CANCELLED. Chunks already
 * on the device finish normally. The pipeline stays usable. Sets *cancelled
 * (if not NULL) to how many were cancelled. Thread-safe. */
FP_API fp_status fp_pipeline_cancel(fp_pipeline *p, uint64_t *cancelled);

/* Refuses further submits (FP_ERR_SHUT_DOWN); chunks in flight go on.
 * Idempotent. Thread-safe. */
FP_API fp_status fp_pipeline_close(fp_pipeline *p);

/* Cancels chunks that have not started, waits for those on the device, calls
 * every remaining completion callback, then releases threads, streams and
 * buffers. NULL is a no-op. No other thread may use p during or after the
 * call, and not from p's own callbacks (that is refused: p stays alive, and
 * fp_last_error says so). */
FP_API void fp_pipeline_destroy(fp_pipeline *p);

/* The stream compute callbacks get (cudaStream_t; NULL on a CPU context). */
FP_API fp_stream fp_pipeline_compute_stream(const fp_pipeline *p);

typedef struct fp_pipeline_stats {
    size_t struct_size;          /* set by fp_pipeline_stats_init */
    /* completed: chunks whose completion ran, the failed and cancelled ones
     * included (failed: any status but FP_OK and FP_ERR_CANCELLED). */
    uint64_t submitted, completed, failed, cancelled;
    uint64_t staged;             /* chunks that went through a staging copy (pageable input) */
    uint64_t bytes_h2d, bytes_d2h;
    /* Busy time per stage summed over chunks, ms: staging memcpy (host),
     * h2d and d2h copies and compute (device events; host clock on CPU),
     * completion (output memcpy + callback, host). */
    double stage_ms, h2d_ms, compute_ms, d2h_ms, complete_ms;
    /* From the first chunk's start (after the previous reset) to the last
     * completion, ms. */
    double wall_ms;
    double h2d_gbps, d2h_gbps;   /* bytes / busy time of that stage (0: none yet) */
    /* (stage + h2d + compute + d2h busy) / wall: 1 for stages that run one
     * after another, up to 4 when all four overlap fully. */
    double overlap_efficiency;
    /* wall - compute busy: time the compute stream had nothing to do. */
    double compute_idle_ms;
    /* Time submitters spent waiting on back-pressure, ms, and the most
     * chunks in flight at once. */
    double submit_wait_ms;
    uint64_t max_in_flight;
} fp_pipeline_stats;

FP_API fp_status fp_pipeline_stats_init_sized(fp_pipeline_stats *s, size_t struct_size);
#define fp_pipeline_stats_init(s) fp_pipeline_stats_init_sized((s), sizeof *(s))
/* Copies the statistics (counted since create or the last reset). Thread-safe. */
FP_API fp_status fp_pipeline_get_stats(fp_pipeline *p, fp_pipeline_stats *out);
/* Zeroes them (max_in_flight too); chunks in flight at the time count in
 * the new period when they complete. Thread-safe. */
FP_API fp_status fp_pipeline_reset_stats(fp_pipeline *p);

/* ======================================================================== */
/*  Built-in A/B                                                            */
/* ======================================================================== */

typedef struct fp_pipeline_ab_report {
    size_t struct_size;          /* set by fp_pipeline_ab_report_init */
    fp_stats baseline, optimized; /* wall time of the whole input, ms */
    double speedup;
    fp_verdict verdict;
    int outputs_equal;           /* 1: both wrote the same bytes to every output */
    fp_pipeline_stats pipeline;  /* the optimized runs' statistics (the last run) */
    double copy_ms, compute_ms;  /* one chunk at a time on one stream: total copy time
                                    (h2d + d2h, pinned) and compute time, measured apart */
    double overlap_bound_ms;     /* max(copy_ms, compute_ms): what full overlap would take */
} fp_pipeline_ab_report;

FP_API fp_status fp_pipeline_ab_report_init_sized(fp_pipeline_ab_report *r, size_t struct_size);
#define fp_pipeline_ab_report_init(r) fp_pipeline_ab_report_init_sized((r), sizeof *(r))

/* Moves `bytes` of host_in (pageable) through cfg's compute in chunks of
 * cfg->max_in_bytes (the last one shorter) and, when host_out is not NULL,
 * the outputs back into host_out: each chunk's output is as long as its
 * input, at the same offset (the compute must write all of it; the config's
 * max_out_bytes is taken as max_in_bytes). Baseline: per chunk a synchronous
 * copy from the pageable input, the compute on one stream, a synchronous
 * copy back. Optimized: a pipeline with cfg (cfg->complete is ignored).
 * Timed with the timing engine (cfg_timing NULL: defaults), interleaved;
 * the outputs of one run of each are compared byte for byte (host_out keeps
 * the pipeline's). Also measures, one chunk at a time on one stream with
 * pinned memory, the total copy time and the total compute time (copy_ms,
 * compute_ms). Errors: FP_ERR_INVALID_ARGUMENT (NULL ctx / cfg / host_in /
 * report, bytes 0), those of fp_pipeline_create and of the compute
 * callback. A disagreement is not an error: see outputs_equal. */
FP_API fp_status fp_pipeline_validate(fp_context *ctx, const fp_pipeline_config *cfg, const void *host_in,
                                      size_t bytes, void *host_out, const fp_timing_config *cfg_timing,
                                      fp_pipeline_ab_report *report);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_PIPELINE_H */
