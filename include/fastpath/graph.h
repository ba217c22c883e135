/*
 * libfastpath CUDA graphs: capture a step once, replay it for the cost of one
 * launch, and a cache of captured steps keyed by batch-size bucket.
 *
 * Why
 *   A decode step or a small-batch forward is hundreds of short kernels; each
 *   launch costs about 3 us on the host (more through a framework), so such a
 *   step spends longer launching than computing. Captured into a CUDA graph,
 *   the whole step is one launch. A graph is fixed: the same kernels on the
 *   same addresses with the same scalars. Shapes change (the batch size), so
 *   a server keeps one graph per batch-size bucket and pads each batch up to
 *   its bucket (vLLM's scheme).
 *
 * API tiers
 *   1. Graphs: fp_graph_capture runs a callback that enqueues work on a
 *      stream (library ops, cuBLAS, your kernels) under stream capture and
 *      instantiates the result; fp_graph_replay launches it;
 *      fp_graph_recapture captures the callback again and updates the
 *      instantiated graph in place when only pointers or scalars changed
 *      (cudaGraphExecUpdate), or instantiates it anew when the topology
 *      changed. fp_graph_validate: the built-in A/B, eager vs replay.
 *   2. Graph pools: the memory of captured graphs. Buffers a graph reads and
 *      writes must keep their addresses for as long as it lives; a pool is a
 *      private pool of the caching allocator (alloc.h) whose memory only the
 *      pool's own allocations reuse. Static inputs and outputs come from
 *      fp_graph_pool_alloc; what the callback allocates during capture from
 *      the pool's allocator (fp_graph_pool_allocator) on the capturing stream
 *      lands in the pool too, so replays never allocate.
 *   3. The graph cache: a step callback that takes a batch size, a bucket
 *      list (default 1, 2, 4, 8, then steps of 8: vLLM's), and
 *      fp_graph_cache_run(n): n rounded up to its bucket, that bucket's graph
 *      replayed, captured first if it is not yet (lazy capture: the step runs
 *      eagerly on your stream, then is captured on it: the device runs the
 *      eager step while the host captures, and the ops find the per-stream
 *      workspace the eager step sized),
 *      sizes above the largest bucket run eagerly and are counted. The cache
 *      keeps the histogram of the sizes it was asked for, can save and load
 *      it, and fp_graph_buckets_choose picks the bucket list that minimises
 *      padding work plus graphs held for a histogram, so a restart captures
 *      what will be used instead of every size up front.
 *
 * What a callback may do while captured
 *   Enqueue work on the stream it is given (kernels, cudaMemcpyAsync /
 *   cudaMemsetAsync, cuBLAS / cuBLASLt, every op of this library: they make
 *   no host synchronization, allocation or device query after their first
 *   call on a context). Not allowed: synchronizing (cudaStreamSynchronize,
 *   fp_context_synchronize, blocking copies), reading device results on the
 *   host, cudaMalloc / cudaFree (in the global and thread-local modes),
 *   allocating from a caching allocator other than the pool's. An illegal
 *   call makes the capture fail: FP_ERR_UNSUPPORTED naming the failure, the
 *   capture ended and discarded (nothing half-captured stays behind, the
 *   stream is usable), and CUDA's sticky per-thread error cleared. Warm-up
 *   runs before the capture (fp_graph_config.warmup) let first-call setup
 *   (workspace growth, attribute caches, cuBLAS heuristics) happen eagerly.
 *
 * CPU contexts
 *   Every function works on a CPU context: a "graph" there records the
 *   callback and a replay calls it (same results, no launch saved;
 *   fp_graph_info.cpu says so). Code written once runs on both.
 *
 * Threads
 *   Functions on distinct graphs / caches are thread-safe. One graph must not
 *   be replayed, recaptured and destroyed concurrently; graphs that share a
 *   pool must not run concurrently (they may share intermediate memory).
 *   A cache is thread-safe: calls are serialized on its lock.
 */
#ifndef FASTPATH_GRAPH_H
#define FASTPATH_GRAPH_H

#include "fastpath/alloc.h"
#include "fastpath/batcher.h"
#include "fastpath/core.h"
#include "fastpath/timing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/*  Graph pools                                                             */
/* ======================================================================== */

typedef struct fp_graph_pool fp_graph_pool;

/* A pool on ctx: a caching allocator for the context (fp_alloc_create_for_
 * context) with one private pool. On a CPU context the allocator is a host
 * one. FP_ERR_INVALID_ARGUMENT (NULL ctx / out). Thread-safe. */
FP_API fp_status fp_graph_pool_create(fp_context *ctx, fp_graph_pool **out);
/* Destroys the pool and returns its memory. FP_ERR_INVALID_ARGUMENT (pool
 * kept) while graphs still use it: destroy them first. NULL: FP_OK. */
FP_API fp_status fp_graph_pool_destroy(fp_graph_pool *pool);
/* Static buffers for graphs on this pool: `bytes` (> 0) that keep their
 * address until freed; replays read and write them. The allocation is
 * stream-ordered on the context's default stream. Thread-safe. */
FP_API fp_status fp_graph_pool_alloc(fp_graph_pool *pool, size_t bytes, void **out);
/* Frees a buffer from fp_graph_pool_alloc (NULL: no-op). A graph that uses
 * it must not be replayed afterwards. FP_ERR_NOT_FOUND: not the pool's. */
FP_API fp_status fp_graph_pool_free(fp_graph_pool *pool, void *ptr);
/* The pool's allocator: allocate through it inside a capture callback
 * (fp_alloc_alloc(a, size, stream, ...) on the stream the callback was
 * given) and the memory comes from the pool. Outside a capture it is an
 * ordinary caching allocator. Owned by the pool. */
FP_API fp_allocator *fp_graph_pool_allocator(fp_graph_pool *pool);
/* Bytes the pool holds from the device (its private pool's segments). */
FP_API fp_status fp_graph_pool_reserved(fp_graph_pool *pool, size_t *bytes);

/* ======================================================================== */
/*  Graphs                                                                  */
/* ======================================================================== */

typedef struct fp_graph fp_graph;

/* Enqueues the work to capture on `stream`. Returning anything but FP_OK
 * fails the capture with that status. */
typedef fp_status (*fp_graph_fn)(void *user, fp_stream stream);

/* cudaStreamCaptureMode: which CUDA calls other threads (or this one) may
 * make while the capture runs. THREAD_LOCAL (default): unsafe calls
 * (cudaMalloc, synchronization) are refused on the capturing thread only;
 * GLOBAL: on every thread that has not opted out; RELAXED: nowhere (cudaMalloc
 * is then allowed, and its memory is not part of the graph: use a pool). */
typedef enum fp_graph_capture_mode {
    FP_GRAPH_CAPTURE_THREAD_LOCAL = 0,
    FP_GRAPH_CAPTURE_GLOBAL = 1,
    FP_GRAPH_CAPTURE_RELAXED = 2
} fp_graph_capture_mode;

typedef struct fp_graph_config {
    size_t struct_size;      /* set by fp_graph_config_default */
    int capture_mode;        /* fp_graph_capture_mode (default THREAD_LOCAL) */
    int warmup;              /* eager calls of the callback on the stream before
                                the capture (default 1; 0..100) */
    fp_graph_pool *pool;     /* memory for the capture (NULL: the graph makes a
                                pool of its own, destroyed with it) */
} fp_graph_config;

FP_API fp_status fp_graph_config_default_sized(fp_graph_config *cfg, size_t struct_size);
#define fp_graph_config_default(cfg) fp_graph_config_default_sized((cfg), sizeof *(cfg))

/* Runs fn `warmup` times on `stream`, then captures one call of fn on it
 * and instantiates the graph. stream NULL: the context's default stream; the
 * legacy stream 0 (cudaStreamLegacy) cannot be captured (FP_ERR_INVALID_
 * ARGUMENT). fn's own failure is returned as is; a capture CUDA refuses is
 * FP_ERR_UNSUPPORTED with CUDA's reason (see "What a callback may do").
 * On any failure nothing is kept and *out is untouched. cfg NULL: defaults. */
FP_API fp_status fp_graph_capture(fp_context *ctx, fp_stream stream, fp_graph_fn fn, void *user,
                                  const fp_graph_config *cfg, fp_graph **out);

/* Launches the graph on `stream` (NULL: the context's default stream; may
 * differ from the capture stream). Asynchronous, like a kernel launch.
 * FP_ERR_INVALID_ARGUMENT for a NULL or destroyed graph: every graph handle
 * is checked against the live ones, so a replay after fp_graph_destroy is an
 * error, not a crash (until the address is reused by a new graph). */
FP_API fp_status fp_graph_replay(fp_graph *g, fp_stream stream);

typedef enum fp_graph_update {
    FP_GRAPH_UPDATED_IN_PLACE = 1,  /* same topology: cudaGraphExecUpdate */
    FP_GRAPH_REINSTANTIATED = 2     /* topology changed: a new instantiation */
} fp_graph_update;

/* Captures fn (with its user pointer: a callable that now enqueues the same
 * kernels on other buffers or scalars, or a different sequence) on `stream`
 * without warm-up and swaps it into g: in place when CUDA can update the
 * instantiated graph, else by instantiating anew. *how (optional) says
 * which. On failure g keeps its previous graph unchanged. */
FP_API fp_status fp_graph_recapture(fp_graph *g, fp_stream stream, fp_graph_fn fn, void *user,
                                    fp_graph_update *how);

/* Destroys g after its launches finished (waits for the stream of its last
 * replay). NULL: FP_OK. FP_ERR_INVALID_ARGUMENT for a handle that is not a
 * live graph (destroyed twice). */
FP_API fp_status fp_graph_destroy(fp_graph *g);

typedef struct fp_graph_info {
    size_t struct_size;      /* set by fp_graph_info_init */
    int cpu;                 /* 1: a CPU context's recorded callback */
    size_t nodes;            /* nodes of the captured graph */
    size_t kernel_nodes;     /* of which kernel launches */
    double capture_ms;       /* host time of the last capture (fn's calls + end) */
    double instantiate_ms;   /* host time of the last instantiation / update */
    uint64_t replays;
    uint64_t updates_in_place, reinstantiations;
} fp_graph_info;

FP_API fp_status fp_graph_info_init_sized(fp_graph_info *info, size_t struct_size);
#define fp_graph_info_init(info) fp_graph_info_init_sized((info), sizeof *(info))
FP_API fp_status fp_graph_get_info(const fp_graph *g, fp_graph_info *out);

/* Built-in A/B: fn called eagerly (baseline) against replays of g (which
 * must be fn's graph), interleaved by the timing engine (fp_ab_run): the
 * same outputs are compared when `out` is given (out_count elements of
 * out_dtype in ctx memory, written by fn from inputs it does not modify, so
 * that a replay after the eager call must reproduce it; NULL: no check). Fills report and,
 * if non-NULL, *saved_us_per_kernel: (eager - replay) / kernel_nodes, the
 * launch time saved per kernel. cfg NULL: timing defaults. */
FP_API fp_status fp_graph_validate(fp_graph *g, fp_stream stream, fp_graph_fn fn, void *user,
                                   const void *out, size_t out_count, fp_dtype out_dtype,
                                   const fp_timing_config *cfg, fp_ab_report *report,
                                   double *saved_us_per_kernel);

/* Fills rows [n, bucket) of a buffer of row_bytes-byte rows with byte
 * `value` on `stream` (cudaMemsetAsync / memset): padding a batch of n up to
 * its bucket, capturable. Nothing for n == bucket. FP_ERR_INVALID_ARGUMENT
 * for n < 0 or n > bucket. */
FP_API fp_status fp_graph_pad_rows(fp_context *ctx, fp_stream stream, void *base, size_t row_bytes,
                                   int64_t n, int64_t bucket, int value);

/* ======================================================================== */
/*  Bucket lists                                                            */
/* ======================================================================== */

#define FP_GRAPH_MAX_BUCKETS 1024

/* vLLM's capture sizes up to max_size: 1, 2, 4, then 8, 16, 24, ... (every
 * multiple of 8 up to max_size; max_size itself last if not a multiple).
 * Writes at most `max` sizes; *n is the full count. max_size in 1..1<<20. */
FP_API fp_status fp_graph_default_buckets(int64_t max_size, int64_t *out, size_t max, size_t *n);

/* The cost model of fp_graph_buckets_choose. Per step, a batch of s padded
 * to bucket b computes b - s rows for nothing; holding a graph costs
 * memory and capture time. The choice minimises
 *     E[b(s) - s] * row_cost  +  sum over buckets (graph_cost + graph_row_cost * b)
 * with E over the histogram. Units are the caller's: with row_cost 1, a
 * graph_cost of 0.25 says "a graph is worth keeping if it saves a quarter of a
 * padded row per step on average". */
typedef struct fp_graph_bucket_cost {
    size_t struct_size;      /* set by fp_graph_bucket_cost_default */
    double row_cost;         /* default 1 */
    double graph_cost;       /* default 0.25 */
    double graph_row_cost;   /* default 0 */
    size_t max_buckets;      /* 0: no limit (default 0); <= FP_GRAPH_MAX_BUCKETS */
} fp_graph_bucket_cost;

FP_API fp_status fp_graph_bucket_cost_default_sized(fp_graph_bucket_cost *c, size_t struct_size);
#define fp_graph_bucket_cost_default(c) fp_graph_bucket_cost_default_sized((c), sizeof *(c))

/* Chooses buckets for a histogram (n_sizes sizes >= 1 with their counts;
 * any order; a size listed twice: its counts add up; zero counts ignored): an exact dynamic program over the
 * observed sizes, so every observed size is covered and the largest is a
 * bucket. Writes the increasing list to out (capacity max_out), its length
 * to *n_out and, if non-NULL, the objective to *cost. O(max_buckets * n^2);
 * n_sizes <= 4096. cost NULL: defaults. FP_ERR_INVALID_ARGUMENT for bad
 * sizes / counts / costs, an empty histogram, max_out too small. */
FP_API fp_status fp_graph_buckets_choose(const int64_t *sizes, const uint64_t *counts, size_t n_sizes,
                                         const fp_graph_bucket_cost *cost, int64_t *out, size_t max_out,
                                         size_t *n_out, double *objective);

/* ======================================================================== */
/*  The graph cache                                                         */
/* ======================================================================== */

typedef struct fp_graph_cache fp_graph_cache;

/* One step at batch size `size` (a bucket, or the request's own size when it
 * runs eagerly above the largest bucket): enqueue it on `stream`, reading and
 * writing the same (static) buffers for every size, rows [0, size). The
 * cache calls it eagerly and under capture, on the stream it names. */
typedef fp_status (*fp_graph_step_fn)(void *user, fp_stream stream, int64_t size);

typedef struct fp_graph_cache_config {
    size_t struct_size;          /* set by fp_graph_cache_config_default */
    const int64_t *buckets;      /* strictly increasing sizes >= 1; NULL: the */
    size_t n_buckets;            /* defaults up to max_size (copied at create) */
    int64_t max_size;            /* for the default list (default 256) */
    int lazy;                    /* 1 (default): capture a bucket on its first
                                    use; 0: fp_graph_cache_create captures
                                    every bucket, largest first */
    int capture_mode;            /* fp_graph_capture_mode */
    int warmup;                  /* eager calls before each capture (default 1) */
    fp_graph_pool *pool;         /* shared by the cache's graphs (NULL: one
                                    of the cache's own) */
} fp_graph_cache_config;

FP_API fp_status fp_graph_cache_config_default_sized(fp_graph_cache_config *cfg, size_t struct_size);
#define fp_graph_cache_config_default(cfg) fp_graph_cache_config_default_sized((cfg), sizeof *(cfg))

/* Creates a cache over `step` on ctx. Lazy captures happen on the stream of
 * the run that needs them (a stream of the cache's for the legacy stream);
 * fp_graph_cache_capture and lazy 0 capture on a non-blocking stream of the
 * cache's, after `warmup` eager calls there. cfg NULL: defaults. With lazy 0,
 * every bucket is captured here (a failure destroys what was captured and is
 * returned). FP_ERR_INVALID_ARGUMENT for a bad bucket list (empty, not
 * increasing, a size < 1, more than FP_GRAPH_MAX_BUCKETS). */
FP_API fp_status fp_graph_cache_create(fp_context *ctx, fp_graph_step_fn step, void *user,
                                       const fp_graph_cache_config *cfg, fp_graph_cache **out);
/* Waits for the cache's work and destroys its graphs (and its own pool).
 * NULL: no-op. */
FP_API void fp_graph_cache_destroy(fp_graph_cache *c);

/* The bucket n (>= 1) runs at: the smallest bucket >= n. FP_ERR_NOT_FOUND
 * (with *bucket = n) above the largest bucket. Thread-safe. */
FP_API fp_status fp_graph_cache_bucket(const fp_graph_cache *c, int64_t n, int64_t *bucket);

typedef enum fp_graph_run {
    FP_GRAPH_RUN_REPLAYED = 0,       /* the bucket's graph was replayed */
    FP_GRAPH_RUN_CAPTURED = 1,       /* first use: ran eagerly at the bucket's
                                        size, and the graph was captured */
    FP_GRAPH_RUN_EAGER = 2,          /* above the largest bucket: ran eagerly
                                        at n (counted) */
    FP_GRAPH_RUN_CAPTURE_FAILED = 3  /* ran eagerly at the bucket's size; the
                                        bucket cannot be captured (the reason:
                                        fp_graph_cache_capture_error) and runs
                                        eagerly from now on */
} fp_graph_run;

/* One step for a batch of n on `stream` (NULL: the context's default
 * stream): counted in the histogram, then replayed / captured / run eagerly
 * as fp_graph_run says (*how, optional); *size (optional) is the size the
 * step ran at (the bucket, or n). The step's own failure is returned (the
 * bucket is not captured then). Pad rows [n, bucket) yourself
 * (fp_graph_pad_rows) before or inside the step. */
FP_API fp_status fp_graph_cache_run(fp_graph_cache *c, fp_stream stream, int64_t n, int64_t *size,
                                    fp_graph_run *how);

/* Captures the buckets not captured yet that cover sizes in the histogram
 * (all_buckets 0), or every bucket (1), largest first, on the cache's
 * capture stream: after fp_graph_cache_load_histogram, a restart captures
 * what will be used. The first failure is returned (graphs captured before
 * it are kept). */
FP_API fp_status fp_graph_cache_capture(fp_graph_cache *c, int all_buckets);

/* Replaces the bucket list (same rules as the config's). Graphs of buckets
 * that remain are kept; the others are destroyed. The histogram is kept. */
FP_API fp_status fp_graph_cache_set_buckets(fp_graph_cache *c, const int64_t *buckets, size_t n);
/* The current bucket list: writes at most `max`, *n the full count. */
FP_API fp_status fp_graph_cache_buckets(fp_graph_cache *c, int64_t *out, size_t max, size_t *n);
/* fp_graph_buckets_choose over the cache's histogram, then
 * fp_graph_cache_set_buckets with the result (sizes above every current
 * bucket are included: they stop running eagerly). */
FP_API fp_status fp_graph_cache_rebucket(fp_graph_cache *c, const fp_graph_bucket_cost *cost);

/* The allowed batch sizes of a batcher (batcher.h) set to the cache's
 * buckets, so batches arrive padded to a captured size: writes
 * allowed_batch_sizes / num_allowed_batch_sizes and max_batch_size (the
 * largest bucket). FP_ERR_INVALID_ARGUMENT (cfg untouched) for more than
 * FP_BATCHER_MAX_SIZES buckets or a bucket above INT_MAX: choose fewer
 * (fp_graph_bucket_cost.max_buckets). */
FP_API fp_status fp_graph_cache_to_batcher(fp_graph_cache *c, fp_batcher_config *batcher_cfg);

typedef struct fp_graph_cache_stats {
    size_t struct_size;          /* set by fp_graph_cache_stats_init */
    uint64_t runs;               /* fp_graph_cache_run calls that succeeded */
    uint64_t replays;            /* ... that replayed a graph */
    uint64_t captures;           /* graphs captured (lazily or not) */
    uint64_t eager_above;        /* runs above the largest bucket */
    uint64_t eager_uncapturable; /* runs of buckets whose capture failed */
    uint64_t capture_failures;
    uint64_t padded_rows;        /* sum of bucket - n over runs */
    uint64_t rows;               /* sum of n over runs */
    size_t graphs;               /* graphs held now */
    size_t pool_bytes;           /* device memory of the pool */
    double capture_ms_total;     /* host time spent capturing + instantiating */
    double lookup_ns;            /* mean host time of a run's lookup (lock,
                                    histogram, bucket), excluding the launch */
} fp_graph_cache_stats;

FP_API fp_status fp_graph_cache_stats_init_sized(fp_graph_cache_stats *s, size_t struct_size);
#define fp_graph_cache_stats_init(s) fp_graph_cache_stats_init_sized((s), sizeof *(s))
FP_API fp_status fp_graph_cache_get_stats(fp_graph_cache *c, fp_graph_cache_stats *out);
/* Why the last failed capture failed ("" if none). Valid until the next
 * call on the cache. */
FP_API const char *fp_graph_cache_capture_error(fp_graph_cache *c);

/* The histogram of sizes passed to fp_graph_cache_run (and loaded), sorted
 * by size: writes at most `max` pairs, *n the number of distinct sizes. */
FP_API fp_status fp_graph_cache_histogram(fp_graph_cache *c, int64_t *sizes, uint64_t *counts, size_t max,
                                          size_t *n);
/* Saves the histogram to a text file ("fastpath-graph-histogram 1" then one
 * "size count" line per size), written to a temporary file and renamed:
 * never a partial file. FP_ERR_IO with the reason. */
FP_API fp_status fp_graph_cache_save_histogram(fp_graph_cache *c, const char *path);
/* Adds the counts of a saved histogram to the cache's. FP_ERR_IO (cannot
 * read) or FP_ERR_INVALID_ARGUMENT (not such a file: the line that is
 * wrong), the histogram unchanged on any error. */
FP_API fp_status fp_graph_cache_load_histogram(fp_graph_cache *c, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_GRAPH_H */
