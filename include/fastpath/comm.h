/*
 * libfastpath communication: NCCL collectives with what frameworks add on
 * top of NCCL, in C: bucketed all-reduce overlapped with compute, a timer
 * on every collective, and a watchdog that names the rank a hung
 * collective waits for.
 *
 * Why
 *   A data-parallel step that all-reduces each gradient as it is produced
 *   pays NCCL's latency hundreds of times and makes compute wait for each;
 *   packing tensors into buckets reduced on a side stream while compute goes
 *   on (PyTorch DDP's design) hides most of it. And a collective that one
 *   rank never enters hangs every other rank forever: NCCL has no timeout
 *   of its own, and the hang names nobody.
 *
 * API tiers
 *   1. Communicators (fp_comm_init / fp_comm_init_all / fp_comm_split):
 *      one rank per fp_comm, on one CUDA context. Several processes share a
 *      unique id (fp_comm_id_write_file / _read_file, or the caller's own
 *      launcher); one process driving several GPUs uses fp_comm_init_all.
 *      Init never blocks past its timeout: NCCL's non-blocking mode, then
 *      ncclCommAbort when the other ranks do not come.
 *   2. Collectives (fp_comm_allreduce, _allgather, _reduce_scatter,
 *      _broadcast): NCCL's, each recorded in the communicator's ledger and
 *      timed with events; fp_comm_get_stats gives per-kind call counts,
 *      latency percentiles, algbw and busbw (nccl-tests' definitions).
 *   3. Buckets (fp_buckets_*): register a list of tensors once; each is
 *      marked ready as compute produces it; a bucket is all-reduced on the
 *      communicator's stream as soon as all its tensors are ready, while
 *      compute goes on; fp_buckets_wait makes the compute stream wait for
 *      the results and measures how much communication it did not hide.
 *   4. The built-in A/B (fp_buckets_validate): per-tensor all-reduce on the
 *      compute stream against buckets on the side stream, same inputs,
 *      results compared; and the bucket-size tuner (fp_buckets_tune).
 *
 * The ledger and the watchdog
 *   Each communicator numbers its collectives (seq 0, 1, ...) and records,
 *   for each: kind, dtype, count, op, root, and three times: enqueued (host
 *   clock), started and ended (events recorded on the collective's stream
 *   before and after it). One watchdog thread per process polls the
 *   ledgers. A collective that started (its rank entered it) and has not
 *   ended after the communicator's timeout is hung: the watchdog aborts the
 *   communicator (ncclCommAbort, so the stream drains and nothing hangs)
 *   and writes a report. Communicators of the same clique (same unique id)
 *   in one process see each other's ledgers, so the report says which
 *   ranks have not entered collective k and what each of them last did;
 *   and a collective whose kind, dtype, count, op or root differs from what
 *   another rank of the process enqueued as the same seq is refused
 *   (FP_ERR_MISMATCH, both named) and the clique aborted, instead of
 *   hanging. Ranks in other processes are reported as not visible.
 *   Every later call on an aborted communicator returns the failure that
 *   aborted it, with the report as its message.
 *
 * Testing without several GPUs
 *   NCCL is called through one internal table of function pointers. CI
 *   runs everything here with several ranks (threads) against an emulated
 *   NCCL on the emulated CUDA runtime (tests/emu/nccl_emu.cpp), with
 *   injected hangs, errors and mismatches. On a GPU, nranks = 1 runs real
 *   NCCL; tests with N ranks need N GPUs and skip otherwise.
 *
 * Threads
 *   A communicator is used by one thread at a time (as NCCL's are), except
 *   fp_comm_abort, fp_comm_get_stats and fp_comm_failure, which any thread
 *   may call at any time. Several communicators may be used from several
 *   threads. One thread driving several ranks wraps their calls in
 *   fp_comm_group_start / fp_comm_group_end (NCCL's group semantics).
 */
#ifndef FASTPATH_COMM_H
#define FASTPATH_COMM_H

#include "fastpath/core.h"
#include "fastpath/timing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/*  Communicators                                                           */
/* ======================================================================== */

typedef struct fp_comm fp_comm;

/* NCCL's unique id (ncclUniqueId: 128 bytes). */
#define FP_COMM_ID_BYTES 128
typedef struct fp_comm_id {
    unsigned char bytes[FP_COMM_ID_BYTES];
} fp_comm_id;

/* 1 if this build has the communication module (built with NCCL), else 0:
 * then every fp_comm_* and fp_buckets_* call returns FP_ERR_UNSUPPORTED. */
FP_API int fp_comm_available(void);

/* The version of the NCCL in use (ncclGetVersion: 22809 for 2.28.9; loaded
 * at the first call, see above), and in *from (if not NULL) where it was
 * loaded from (a path or a description, static storage). 0 and *from NULL
 * when NCCL is absent or cannot be loaded (fp_comm_* calls then say why).
 * Thread-safe. */
FP_API int fp_comm_nccl_version(const char **from);

/* A fresh unique id (ncclGetUniqueId): rank 0 makes it, every rank of the
 * communicator passes the same to fp_comm_init. Errors: FP_ERR_INVALID_ARGUMENT,
 * FP_ERR_NCCL, FP_ERR_UNSUPPORTED. */
FP_API fp_status fp_comm_get_unique_id(fp_comm_id *id);

/* Exchanging an id through a file on a shared file system: write_file
 * writes it atomically (a temporary file renamed into place, so a reader
 * never sees half of it); read_file waits until the file exists and holds
 * a whole id, up to timeout_ms (< 0: no limit; FP_ERR_TIMEOUT). Errors:
 * FP_ERR_INVALID_ARGUMENT, FP_ERR_IO (with the path and errno's text). */
FP_API fp_status fp_comm_id_write_file(const fp_comm_id *id, const char *path);
FP_API fp_status fp_comm_id_read_file(const char *path, int64_t timeout_ms, fp_comm_id *id);

/* What the watchdog reports, to the config's on_failure callback and
 * fp_comm_failure. */
typedef struct fp_comm_failure_info {
    fp_status status;        /* FP_ERR_TIMEOUT (hung), FP_ERR_MISMATCH, FP_ERR_NCCL */
    uint64_t seq;            /* the collective that failed */
    int nranks;
    /* Ranks of this communicator that had not entered collective seq when
     * it was aborted (only ranks in this process are known: the others
     * count in not_visible), up to 64 of them. */
    int missing[64];
    int nmissing;
    int not_visible;         /* ranks in other processes */
    const char *message;     /* the whole report, one paragraph */
} fp_comm_failure_info;

/* Called once, on the watchdog's thread (or the thread that saw the
 * failure), when the communicator is aborted. It must not call fp_comm_*
 * on this communicator except fp_comm_rank / fp_comm_nranks. */
typedef void (*fp_comm_failure_fn)(void *user, fp_comm *comm, const fp_comm_failure_info *info);

typedef struct fp_comm_config {
    size_t struct_size;         /* set by fp_comm_config_default */
    /* Init waits up to this long for the other ranks (default 60000 ms;
     * < 0: no limit), then aborts: FP_ERR_TIMEOUT. */
    int64_t init_timeout_ms;
    /* A collective that has started and not ended after this long is hung
     * (default 300000 ms; < 0: no watchdog for this communicator). */
    int64_t timeout_ms;
    /* Collectives the ledger keeps (default 4096; at least 16). Older ones
     * are dropped once ended (their times are already in the statistics). */
    int ledger_entries;
    fp_comm_failure_fn on_failure; /* optional */
    void *user;
} fp_comm_config;

FP_API fp_status fp_comm_config_default_sized(fp_comm_config *cfg, size_t struct_size);
#define fp_comm_config_default(cfg) fp_comm_config_default_sized((cfg), sizeof *(cfg))

/* Joins the communicator `id` as rank `rank` of `nranks`, on ctx's device
 * (a CUDA context; one rank per device). Every rank must call it; it
 * returns once all have, or after cfg->init_timeout_ms (FP_ERR_TIMEOUT: the
 * NCCL communicator is aborted, nothing is left). The communicator gets a
 * non-blocking stream of its own (fp_comm_stream), used by buckets.
 * cfg NULL: defaults. Errors: FP_ERR_INVALID_ARGUMENT (NULL ctx / id / out,
 * nranks < 1, rank outside [0, nranks), a CPU context), FP_ERR_NO_DEVICE,
 * FP_ERR_TIMEOUT, FP_ERR_NCCL (NCCL's own message), FP_ERR_UNSUPPORTED. */
FP_API fp_status fp_comm_init(fp_context *ctx, const fp_comm_id *id, int nranks, int rank,
                              const fp_comm_config *cfg, fp_comm **out);

/* One process, n GPUs: a communicator of n ranks, rank i on ctxs[i] (each
 * on a different device), written to comms[i]. All or nothing. */
FP_API fp_status fp_comm_init_all(fp_context *const *ctxs, int n, const fp_comm_config *cfg, fp_comm **comms);

/* ncclCommSplit: every rank of `comm` calls it; ranks with the same color
 * form a new communicator, ranked by key (then by their rank in comm);
 * color < 0 joins none (*out = NULL, FP_OK). Same timeout as init (cfg
 * NULL: comm's config). One thread driving several ranks calls it for
 * each inside fp_comm_group_start / end: then *out is ready after
 * fp_comm_group_end. */
FP_API fp_status fp_comm_split(fp_comm *comm, int color, int key, const fp_comm_config *cfg, fp_comm **out);

/* NCCL's group semantics, for one thread driving several ranks: the calls
 * between start and end are issued together. Nestable. */
FP_API fp_status fp_comm_group_start(void);
FP_API fp_status fp_comm_group_end(void);

/* Aborts the communicator (ncclCommAbort): pending collectives are dropped,
 * their streams drain; every later call returns FP_ERR_SHUT_DOWN. In-process
 * ranks of the same clique are not aborted by this call. Thread-safe. */
FP_API fp_status fp_comm_abort(fp_comm *comm);

/* Waits for the communicator's collectives enqueued so far, then releases
 * it (a hung one is aborted by the watchdog first, so this returns). NULL
 * is a no-op. */
FP_API void fp_comm_destroy(fp_comm *comm);

FP_API int fp_comm_rank(const fp_comm *comm);
FP_API int fp_comm_nranks(const fp_comm *comm);
/* The communicator's own stream (cudaStream_t; buckets reduce on it). */
FP_API fp_stream fp_comm_stream(const fp_comm *comm);

/* Waits until every collective enqueued on the communicator so far has
 * ended: timeout_ms < 0 without limit, else up to that long
 * (FP_ERR_TIMEOUT; they go on). Returns the communicator's failure if it
 * was aborted (the report as message). */
FP_API fp_status fp_comm_synchronize(fp_comm *comm, int64_t timeout_ms);

/* FP_OK while healthy; else the status that aborted the communicator, and
 * its report copied into buf (NULL / 0: not copied). Thread-safe. */
FP_API fp_status fp_comm_failure(fp_comm *comm, char *buf, size_t buf_size);

/* ======================================================================== */
/*  Collectives                                                             */
/* ======================================================================== */

typedef enum fp_reduce_op {
    FP_REDUCE_SUM = 0,
    FP_REDUCE_AVG = 1,  /* sum / nranks */
    FP_REDUCE_MAX = 2,
    FP_REDUCE_MIN = 3
} fp_reduce_op;

typedef enum fp_coll_kind {
    FP_COLL_ALLREDUCE = 0,
    FP_COLL_ALLGATHER = 1,
    FP_COLL_REDUCE_SCATTER = 2,
    FP_COLL_BROADCAST = 3
} fp_coll_kind;
#define FP_COLL_KINDS 4

/* "allreduce", "allgather", "reduce_scatter", "broadcast"; "unknown". */
FP_API const char *fp_coll_kind_name(fp_coll_kind kind);
/* "sum", "avg", "max", "min"; "unknown". */
FP_API const char *fp_reduce_op_name(fp_reduce_op op);

/* nccl-tests' bus bandwidth factor: busbw = algbw x factor. All-reduce
 * 2(n-1)/n, reduce-scatter and all-gather (n-1)/n, broadcast 1 (0 for an
 * unknown kind or n < 1; 0 too for n = 1 except broadcast: nothing
 * crosses a bus). */
FP_API double fp_coll_busbw_factor(fp_coll_kind kind, int nranks);
/* The bytes algbw counts for a collective of `count` elements of `dtype`
 * (nccl-tests: all-reduce and broadcast count x size; all-gather the
 * receive buffer, count x nranks x size with count the send count;
 * reduce-scatter the send buffer, count x nranks x size with count the
 * receive count). */
FP_API double fp_coll_bytes(fp_coll_kind kind, size_t count, fp_dtype dtype, int nranks);

/* The collectives, enqueued on `stream` (NULL: the context's default
 * stream), NCCL's semantics (in place when send == recv). dtype f32, f16
 * or bf16. Each gets the next seq in the ledger and its timing events.
 * Errors (nothing enqueued): FP_ERR_INVALID_ARGUMENT (NULL comm, NULL
 * buffers with count > 0, count 0, an unknown dtype or op, root out of
 * range), FP_ERR_MISMATCH (another rank of this process enqueued this seq
 * differently: the clique is aborted), FP_ERR_NCCL, or the failure that
 * aborted the communicator. */
FP_API fp_status fp_comm_allreduce(fp_comm *comm, const void *send, void *recv, size_t count, fp_dtype dtype,
                                   fp_reduce_op op, fp_stream stream);
/* recv holds nranks x send_count elements, rank r's at r x send_count. */
FP_API fp_status fp_comm_allgather(fp_comm *comm, const void *send, void *recv, size_t send_count,
                                   fp_dtype dtype, fp_stream stream);
/* send holds nranks x recv_count elements; rank r gets block r reduced. */
FP_API fp_status fp_comm_reduce_scatter(fp_comm *comm, const void *send, void *recv, size_t recv_count,
                                        fp_dtype dtype, fp_reduce_op op, fp_stream stream);
/* root's send (count elements) into every rank's recv (send unused elsewhere). */
FP_API fp_status fp_comm_broadcast(fp_comm *comm, const void *send, void *recv, size_t count, fp_dtype dtype,
                                   int root, fp_stream stream);

/* ======================================================================== */
/*  Ledger and statistics                                                   */
/* ======================================================================== */

typedef enum fp_coll_state {
    FP_COLL_ENQUEUED = 0, /* the stream has not reached it */
    FP_COLL_STARTED = 1,  /* the stream reached it: this rank entered it */
    FP_COLL_ENDED = 2,
    FP_COLL_ABORTED = 3   /* dropped by an abort */
} fp_coll_state;

typedef struct fp_coll_record {
    uint64_t seq;
    fp_coll_kind kind;
    fp_dtype dtype;
    size_t count;            /* as passed to the call */
    fp_reduce_op op;         /* reductions */
    int root;                /* broadcast */
    fp_coll_state state;
    double enqueue_ms;       /* host clock, ms since the communicator's creation */
    double start_ms;         /* when the watchdog saw it start (host clock; 0: not yet) */
    double duration_ms;      /* end - start on the stream (events; 0 until ended) */
} fp_coll_record;

/* The last (up to) max collectives of the ledger, oldest first, into out;
 * *n = how many. Refreshes their states. Thread-safe. */
FP_API fp_status fp_comm_ledger(fp_comm *comm, fp_coll_record *out, int max, int *n);

typedef struct fp_coll_stats {
    uint64_t calls;          /* ended since create / the last reset */
    double bytes;            /* fp_coll_bytes summed */
    double busy_ms;          /* durations summed */
    fp_stats latency;        /* of the durations (samples 0: none) */
    double p99_ms;
    double algbw_gbps;       /* bytes / busy time, 1e9 bytes per GB */
    double busbw_gbps;       /* algbw x fp_coll_busbw_factor */
} fp_coll_stats;

typedef struct fp_comm_stats {
    size_t struct_size;       /* set by fp_comm_stats_init */
    fp_coll_stats kind[FP_COLL_KINDS]; /* by fp_coll_kind */
    uint64_t enqueued, ended, aborted;
    /* Buckets: communication the compute stream waited for in
     * fp_buckets_wait (not hidden behind compute), summed, and the
     * iterations it sums over. */
    double exposed_ms;
    uint64_t iterations;
} fp_comm_stats;

FP_API fp_status fp_comm_stats_init_sized(fp_comm_stats *s, size_t struct_size);
#define fp_comm_stats_init(s) fp_comm_stats_init_sized((s), sizeof *(s))
/* Statistics of the collectives that ended since create or the last reset
 * (latencies from the last 4096 of each kind). Thread-safe. */
FP_API fp_status fp_comm_get_stats(fp_comm *comm, fp_comm_stats *out);
FP_API fp_status fp_comm_reset_stats(fp_comm *comm);

/* nccl-tests style measurement of one collective at one size: `bytes` of
 * dtype (rounded down to whole elements, and for all-gather /
 * reduce-scatter to a multiple of nranks), out of place, on the
 * communicator's stream, timed with the timing engine (cfg NULL:
 * defaults; with nranks > 1 the sample count is fixed at cfg's
 * min_samples so that every rank issues the same collectives). Every rank
 * calls it with the same arguments. Allocates and frees its buffers. The
 * result's `latency` is the per-call time. */
typedef struct fp_coll_bench {
    fp_stats latency;
    double bytes;            /* what algbw counts (fp_coll_bytes) */
    double algbw_gbps, busbw_gbps;
} fp_coll_bench;
FP_API fp_status fp_comm_bench(fp_comm *comm, fp_coll_kind kind, size_t bytes, fp_dtype dtype,
                               const fp_timing_config *cfg, fp_coll_bench *out);

/* ======================================================================== */
/*  Buckets: all-reduce overlapped with compute                             */
/* ======================================================================== */

typedef struct fp_buckets fp_buckets;

/* A tensor in device memory of the communicator's device. */
typedef struct fp_comm_tensor {
    void *data;
    size_t count;            /* elements, >= 1 */
    fp_dtype dtype;          /* f32, f16, bf16 */
} fp_comm_tensor;

typedef struct fp_buckets_config {
    size_t struct_size;          /* set by fp_buckets_config_default */
    /* Packing, in the order the tensors are listed (list them in the order
     * they become ready: for a backward pass, the reverse of the forward
     * order): a bucket closes when the next tensor would take it past the
     * cap; the first bucket has its own, smaller cap so that communication
     * starts early; a tensor is never split (a larger one gets a bucket to
     * itself); a bucket holds one dtype (each dtype fills its own). Defaults
     * 25 MiB and 1 MiB (PyTorch DDP's). */
    size_t bucket_cap_bytes;
    size_t first_bucket_cap_bytes;
    fp_reduce_op op;             /* FP_REDUCE_SUM (default) or FP_REDUCE_AVG */
    /* 0 (default): each bucket has a flat buffer; a ready bucket's tensors
     * are copied into it (one kernel), all-reduced, and copied back into
     * the tensors. 1: the buckets own the tensors' memory: each tensor lives
     * at fp_buckets_tensor_data's address, a view into its bucket's flat
     * buffer, and the caller's pointers in `tensors` are ignored (may be
     * NULL); no copies. */
    int flat_views;
} fp_buckets_config;

FP_API fp_status fp_buckets_config_default_sized(fp_buckets_config *cfg, size_t struct_size);
#define fp_buckets_config_default(cfg) fp_buckets_config_default_sized((cfg), sizeof *(cfg))

/* Registers n tensors (copied: the list is the caller's again after the
 * call) and packs them into buckets; allocates the flat buffers. Every rank
 * registers the same list (counts and dtypes). Errors:
 * FP_ERR_INVALID_ARGUMENT (NULL comm / tensors / out, n < 1, a tensor with
 * count 0, an unsupported dtype, a NULL data pointer without flat_views,
 * a cap of 0, an op other than sum / avg), FP_ERR_OUT_OF_MEMORY, FP_ERR_CUDA. */
FP_API fp_status fp_buckets_create(fp_comm *comm, const fp_comm_tensor *tensors, int n,
                                   const fp_buckets_config *cfg, fp_buckets **out);

/* Buckets made, and the bucket of tensor i (its index, and the tensor's
 * offset in elements in it). */
FP_API int fp_buckets_count(const fp_buckets *b);
FP_API fp_status fp_buckets_tensor_bucket(const fp_buckets *b, int i, int *bucket, size_t *offset);
/* Where tensor i lives: its registered pointer, or with flat_views its view
 * into the bucket's buffer. */
FP_API fp_status fp_buckets_tensor_data(const fp_buckets *b, int i, void **data);
/* The index of the tensor whose data (as fp_buckets_tensor_data says) is
 * `data`: FP_ERR_NOT_FOUND for an unknown pointer. */
FP_API fp_status fp_buckets_find(const fp_buckets *b, const void *data, int *index);

/* Tensor i is ready once the work enqueued so far on `stream` (the
 * stream that produces it; NULL: the context's default stream) completes.
 * When it completes its bucket, the bucket's reduction is enqueued on the
 * communicator's stream, after that stream's work. Until fp_buckets_wait
 * the tensor must not be written. `data`, if not NULL, must equal
 * fp_buckets_tensor_data's pointer (a check that the caller's list did not
 * change since registration). Errors: FP_ERR_INVALID_ARGUMENT (i out of
 * range, marked twice in one iteration, a data pointer that differs),
 * FP_ERR_NOT_FOUND never (see fp_buckets_find), the communicator's. */
FP_API fp_status fp_buckets_mark_ready(fp_buckets *b, int i, const void *data, fp_stream stream);

/* Ends an iteration: every tensor must have been marked ready
 * (FP_ERR_INVALID_ARGUMENT names the first that was not, nothing waited
 * for, the marks kept); `stream` (NULL: the context's default) then waits,
 * on the device, for every bucket's reduction. The marks are cleared for
 * the next iteration. The time the stream waited (communication not hidden
 * behind the work enqueued on it before) counts in fp_comm_stats'
 * exposed_ms once it is known. */
FP_API fp_status fp_buckets_wait(fp_buckets *b, fp_stream stream);

/* Frees the flat buffers (after the work enqueued on them). NULL: no-op. */
FP_API void fp_buckets_destroy(fp_buckets *b);

/* ======================================================================== */
/*  Built-in A/B and the bucket-size tuner                                  */
/* ======================================================================== */

/* Produces tensor i (writes its data; `data` is where it lives) on `stream`:
 * the compute that communication should overlap with, such as the backward
 * pass of one layer. Called in list order, n times per iteration. */
typedef fp_status (*fp_comm_produce_fn)(void *user, int i, void *data, fp_stream stream);

typedef struct fp_buckets_ab_report {
    size_t struct_size;          /* set by fp_buckets_ab_report_init */
    fp_stats baseline, optimized; /* one iteration (produce all + reduce all), ms */
    double speedup;
    fp_verdict verdict;
    int results_agree;           /* 1: every tensor's result within the dtype's tolerance */
    double max_abs_err;
    int buckets;
    double exposed_ms;           /* optimized: mean exposed communication per iteration */
    double produce_ms;           /* the compute alone, per iteration */
} fp_buckets_ab_report;

FP_API fp_status fp_buckets_ab_report_init_sized(fp_buckets_ab_report *r, size_t struct_size);
#define fp_buckets_ab_report_init(r) fp_buckets_ab_report_init_sized((r), sizeof *(r))

/* Baseline: per tensor, produce then all-reduce it on the compute stream
 * (the compute waits for each). Optimized: buckets (cfg; flat_views is
 * honoured: the optimized side then produces into the views), produce,
 * mark ready, and wait at the end. Every rank calls it with the same
 * arguments; tensors are the baseline's (and, without flat_views, the
 * optimized side's) memory. Results after one run of each are compared.
 * Timed interleaved with the timing engine on the context's default
 * stream (cfg_timing NULL: defaults; nranks > 1 fixes the sample count as
 * fp_comm_bench does). */
FP_API fp_status fp_buckets_validate(fp_comm *comm, const fp_comm_tensor *tensors, int n,
                                     const fp_buckets_config *cfg, fp_comm_produce_fn produce, void *user,
                                     const fp_timing_config *cfg_timing, fp_buckets_ab_report *report);

typedef struct fp_buckets_tune_result {
    size_t struct_size;          /* set by fp_buckets_tune_result_init */
    size_t caps[16];             /* the caps tried (bytes) */
    fp_stats iteration[16];      /* one iteration with each */
    int buckets[16];
    int ncaps;
    int best;                    /* index of the fastest */
    size_t recommended_cap;      /* caps[best], or the default's when they are the SAME */
    double speedup_vs_default;   /* default cap's median / best's */
    fp_verdict verdict_vs_default;
} fp_buckets_tune_result;

FP_API fp_status fp_buckets_tune_result_init_sized(fp_buckets_tune_result *r, size_t struct_size);
#define fp_buckets_tune_result_init(r) fp_buckets_tune_result_init_sized((r), sizeof *(r))

/* Times an iteration (produce + bucketed all-reduce, as the optimized side
 * of fp_buckets_validate) under each bucket cap in caps[0..ncaps) (NULL:
 * 1, 4, 8, 16, 25, 50, 100 MiB and one bucket for everything), the first
 * bucket's cap min(cfg's, cap), and recommends the fastest; a cap that is
 * not faster than the default (25 MiB, or cfg's bucket_cap_bytes) by more
 * than the noise is not recommended over it. ncaps at most 16. Every rank
 * calls it with the same arguments. */
FP_API fp_status fp_buckets_tune(fp_comm *comm, const fp_comm_tensor *tensors, int n,
                                 const fp_buckets_config *cfg, const size_t *caps, int ncaps,
                                 fp_comm_produce_fn produce, void *user, const fp_timing_config *cfg_timing,
                                 fp_buckets_tune_result *result);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_COMM_H */
