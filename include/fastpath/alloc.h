/*
 * libfastpath caching allocator: one allocation policy over a pluggable
 * upstream (device memory, pinned host memory, plain host memory).
 *
 * Why: cudaMalloc/cudaFree cost microseconds to milliseconds per call and
 * cudaFree synchronizes the device. A caching allocator keeps freed blocks and
 * hands them out again; a split limit keeps large blocks from being chopped
 * into fragments nobody can use.
 *
 * API tiers
 *   1. Upstreams and event ops: where memory comes from (fp_alloc_upstream, a
 *      {alloc, free, opaque} table in the style of zstd's customMem) and how
 *      stream-ordered reuse learns that other streams are done with a block
 *      (fp_alloc_event_ops). Built-ins: host (malloc), device (cudaMalloc),
 *      pinned host (cudaHostAlloc, or user memory registered with
 *      cudaHostRegister), a caller-provided region, and CUDA events.
 *   2. The allocator: create/destroy, alloc/free/record_stream, empty_cache
 *      and trim, statistics, JSON snapshot, event ring, private pools for
 *      graph capture.
 *   3. Trace replay (A/B): a generated transformer-like trace or one recorded
 *      by the event ring, replayed through the allocator and through direct
 *      upstream calls, with per-op latency and upstream call counts.
 *
 * Policy (the numbers are fixed; the knobs are in fp_alloc_config)
 *   - Sizes: a request of n bytes becomes a block of round(n) bytes: at least
 *     FP_ALLOC_MIN_BLOCK (512), a multiple of FP_ALLOC_ALIGN (256), or a
 *     power-of-two division boundary when roundup_power2_divisions asks for
 *     it. Every returned pointer is FP_ALLOC_ALIGN-aligned (provided the
 *     upstream returns 256-aligned memory; the built-ins do).
 *   - Small pool: blocks <= FP_ALLOC_SMALL_SIZE (1 MiB) are carved from
 *     FP_ALLOC_SMALL_SEGMENT (2 MiB) segments.
 *   - Large pool: blocks < FP_ALLOC_MIN_LARGE_ALLOC (10 MiB) are carved from
 *     FP_ALLOC_LARGE_SEGMENT (20 MiB) segments; bigger requests get their own
 *     segment rounded up to FP_ALLOC_ROUND_LARGE (2 MiB).
 *   - Right-sized fallback: when the upstream or the cap refuses a segment
 *     of the size above, a segment of exactly the block size is asked for
 *     before anything else (so a 1 MiB + 1 byte request succeeds from a
 *     16 MiB region, and a 1.5 MiB one under a 2 MiB cap), at every step of
 *     the out-of-memory ladder below.
 *   - Best fit: each pool keeps its free blocks in an ordered set keyed by
 *     (stream, size, address); a lookup is O(log n). The best block is split
 *     when the remainder is >= 512 bytes (small pool) or > 1 MiB (large
 *     pool) and the block is not larger than max_split_size. On free a block
 *     is merged with its free neighbours.
 *   - Streams: a segment belongs to the stream that caused it; its blocks are
 *     reused only by allocations on that stream. A block used on other streams
 *     (fp_alloc_record_stream) is pending after its free: events are recorded
 *     on those streams then, and the block is reused only once they have
 *     completed, or, with a stream-wait op, once the allocating stream was
 *     made to wait on them (below). Pending blocks are not merged with their
 *     neighbours. Events are polled (non-blocking) on cache misses,
 *     empty_cache and trim, and, while any block waits on events, once every
 *     FP_ALLOC_EVENT_POLL_INTERVAL allocations even when they all hit the
 *     cache: a block whose events completed is reusable at the latest
 *     FP_ALLOC_EVENT_POLL_INTERVAL allocations (on any stream) later. With
 *     nothing pending a cache hit pays one test for this. Never while a
 *     private pool is active.
 *   - Pending blocks in the large pool: when the best free block for a
 *     large-pool request would have to be split and a pending block of the
 *     stream fits better, that block's events are queried (non-blocking, one
 *     call each) and it is taken if they completed. Without this, a block
 *     pending at the time of the request (a gradient bucket that a
 *     communication stream still reads, say) made the request carve the
 *     block kept for a larger request, which then missed and reserved a new
 *     segment: polling only on misses let the cache fragment and grow
 *     whenever events lag the host (on a GPU, whenever the host runs ahead
 *     of the device, the normal case).
 *   - Stream-ordered reuse (allocators with a stream-wait op:
 *     fp_alloc_set_stream_wait; fp_alloc_create_for_context installs
 *     cudaStreamWaitEvent for CUDA contexts): a pending block chosen as above
 *     whose events have not completed, if it fits without being split (a
 *     tensor of the same size, such as the next gradient bucket), and, on a
 *     cache miss that polling did
 *     not serve, the pending blocks of the stream that together with the
 *     free and pending blocks between them would serve the request (the
 *     smallest such run of address neighbours), are handed out after the
 *     allocating stream was made to wait on their outstanding events, instead
 *     of splitting a larger block or reserving a new segment (what
 *     cudaMallocAsync pools do under their default
 *     cudaMemPoolReuseAllowInternalDependencies). The host never blocks and a
 *     cache hit on a free block makes no call; the cost is a device-side
 *     dependency: work queued on the allocating stream after that allocation
 *     starts only once the other streams have passed the point where the
 *     block was freed (small-pool hits never do this: a small request takes
 *     a free block, split or not, before any pending one). Bounded: one
 *     block or run per allocation, at most FP_ALLOC_MAX_STREAM_WAITS events
 *     in it, no retry when the op refuses (the request then splits the free
 *     block or reserves a segment as without the op).
 *     Without the op, in particular for host, pinned and registered
 *     instances, whose memory the CPU reads and writes out of stream order so
 *     that no stream wait can protect it, a pending block is reused only once
 *     its events are found complete; until then requests split other blocks
 *     or reserve new segments (PyTorch's behaviour), so when the device runs
 *     behind the host, reserved memory grows by the pending blocks.
 *   - Out of memory (the upstream fails, or the cap would be exceeded):
 *     release cached unsplit segments of the same pool class and retry, then
 *     release the whole cache and retry (each try: the pool's segment size,
 *     then the right-sized one), then fail with FP_ERR_OUT_OF_MEMORY and a
 *     message giving the requested bytes and block, the segment sizes asked
 *     for and whether the cap or the upstream refused, allocated, reserved
 *     and inactive-split bytes, the bytes (and blocks) freed but waiting on
 *     stream events, the bytes other threads are reserving at that moment,
 *     and the cap. While a private pool is active (between fp_alloc_pool_begin and
 *     fp_alloc_pool_end) no cached segment goes back to the upstream, neither
 *     by the GC threshold nor by the retries: a request the upstream refuses
 *     fails with FP_ERR_OUT_OF_MEMORY (releasing would be a cudaFree inside a
 *     graph capture).
 *
 * Thread-safety: every fp_alloc_* call on an allocator is thread-safe (one
 * short lock per allocator: spin, then yield, then sleep); a cache hit on a
 * free block makes no upstream or CUDA call (taking a pending block makes the
 * event calls described above). The upstream's alloc is called with that
 * lock released (a slow cudaMalloc does not stall other threads' hits and
 * frees; its bytes count against the cap while it runs, and a concurrent
 * empty_cache/trim cannot release the segment being made); the upstream's
 * free and the event ops are called with the lock held. An allocator makes
 * one upstream call at a time (a second thread that misses waits for the
 * first one's cudaMalloc). None of them may call back into the same
 * allocator. fp_alloc_snapshot_json copies under the
 * lock and formats after releasing it.
 */
#ifndef FASTPATH_ALLOC_H
#define FASTPATH_ALLOC_H

#include "fastpath/core.h"
#include "fastpath/timing.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP_ALLOC_MIN_BLOCK ((size_t)512)
#define FP_ALLOC_ALIGN ((size_t)256)
#define FP_ALLOC_SMALL_SIZE ((size_t)1 << 20)
#define FP_ALLOC_SMALL_SEGMENT ((size_t)2 << 20)
#define FP_ALLOC_MIN_LARGE_ALLOC ((size_t)10 << 20)
#define FP_ALLOC_LARGE_SEGMENT ((size_t)20 << 20)
#define FP_ALLOC_ROUND_LARGE ((size_t)2 << 20)
/* While blocks wait on events, allocations poll them (non-blocking) at least
 * once per this many allocations, cache hits included (see Streams above). */
#define FP_ALLOC_EVENT_POLL_INTERVAL 32
/* Largest request accepted: anything bigger fails with
 * FP_ERR_INVALID_ARGUMENT (it would overflow when rounded). */
#define FP_ALLOC_MAX_REQUEST (((size_t)1 << 62))

/* ======================================================================== */
/*  Upstreams: where memory comes from                                      */
/* ======================================================================== */

typedef struct fp_alloc_upstream {
    /* Allocates `bytes` (> 0). Returns FP_OK and sets *out, or
     * FP_ERR_OUT_OF_MEMORY when memory is exhausted (the allocator then asks
     * for a right-sized segment, frees cache and retries), or another status
     * for other failures (reported as is). Called WITHOUT the allocator's
     * lock (other threads' cache hits and frees go on meanwhile), but one
     * upstream call at a time per allocator (alloc and free never overlap:
     * an upstream used by one allocator need not be thread-safe). It must
     * not call back into the same allocator. */
    fp_status (*alloc)(void *opaque, size_t bytes, void **out);
    /* Returns memory from alloc; `bytes` is the size that was asked for.
     * Called with the allocator's lock held. */
    void (*free)(void *opaque, void *ptr, size_t bytes);
    /* Optional: total memory behind this upstream (device memory for the
     * device upstream), used by fp_alloc_config.memory_fraction. NULL or 0:
     * unknown. */
    size_t (*total_bytes)(void *opaque);
    void *opaque;
} fp_alloc_upstream;

/* Host memory (aligned_alloc, 256-byte aligned). Thread-safe. */
FP_API fp_alloc_upstream fp_alloc_upstream_host(void);
/* Device memory of CUDA device `device` (cudaMalloc in the relaxed
 * stream-capture mode, so a segment can be added while another thread or a
 * private pool captures; cudaFree; the device is made current for each call
 * and the caller's current device restored afterwards). FP_ERR_NO_DEVICE
 * without that device. */
FP_API fp_status fp_alloc_upstream_device(int device, fp_alloc_upstream *out);
/* Pinned (page-locked) host memory through cudaHostAlloc(cudaHostAllocPortable)
 * / cudaFreeHost, registered while device `device` is current. */
FP_API fp_status fp_alloc_upstream_pinned(int device, fp_alloc_upstream *out);

/* Segments carved out of caller memory [base, base + bytes) (base rounded up
 * and the end down to FP_ALLOC_ALIGN): best fit over the free ranges, which
 * are coalesced on free; alloc returns FP_ERR_OUT_OF_MEMORY when no free range
 * is large enough (the allocator then releases cache and retries, which
 * coalesces the region). total_bytes is the usable size, so
 * memory_fraction works. The caller keeps owning the memory; release the
 * upstream's state with fp_alloc_upstream_release once every allocator over
 * it is destroyed. Its free takes only the exact start of a live piece with
 * the size that alloc was asked for; any other pointer or size (outside the
 * region, inside a live piece, a free range, a double free) changes nothing
 * and sets fp_last_error() of the calling thread (FP_ERR_INVALID_ARGUMENT,
 * naming the pointer and size). Thread-safe (its own lock: several
 * allocators may share one region).
 * FP_ERR_INVALID_ARGUMENT for NULL base/out or fewer than FP_ALLOC_MIN_BLOCK
 * usable bytes. */
FP_API fp_status fp_alloc_upstream_region(void *base, size_t bytes, fp_alloc_upstream *out);
/* Pinned host memory by registering user memory: the region upstream over
 * [base, base + bytes) after cudaHostRegister(base, bytes,
 * cudaHostRegisterPortable) with device `device` current;
 * fp_alloc_upstream_release unregisters it (cudaHostUnregister). Pair it
 * with fp_alloc_event_ops_cuda(device) when blocks feed async copies, and
 * fp_alloc_record_stream every block on the stream of each async copy that
 * reads or writes it (its own allocation stream included) before freeing
 * it: host memory is reused by the CPU at once, not in stream order. The
 * same holds for fp_alloc_upstream_pinned. Never install a stream-wait op
 * (fp_alloc_set_stream_wait) on such an allocator.
 * Errors: those of fp_alloc_upstream_region, FP_ERR_NO_DEVICE without that
 * device, FP_ERR_CUDA when registration fails (e.g. the range is already
 * registered). Nothing is registered on error. */
FP_API fp_status fp_alloc_upstream_registered(int device, void *base, size_t bytes,
                                              fp_alloc_upstream *out);
/* Releases the state of an upstream made by fp_alloc_upstream_region or
 * fp_alloc_upstream_registered (and unregisters the latter's memory), then
 * zeroes *up. Other upstreams and NULL: no-op. Not while an allocator uses
 * it. */
FP_API void fp_alloc_upstream_release(fp_alloc_upstream *up);

/* ======================================================================== */
/*  Event ops: stream-ordered reuse across streams                          */
/* ======================================================================== */

typedef struct fp_alloc_event_ops {
    /* Records an event on `stream` and returns it in *event. A non-OK status
     * means "not now" (the CUDA ops refuse while `stream` is capturing): the
     * block stays unavailable and recording is retried on a later slow
     * path. */
    fp_status (*record)(void *opaque, fp_stream stream, void **event);
    /* 1 when all work before the event has completed, 0 if not yet. An
     * error counts as completed (the block must not leak). */
    int (*query)(void *opaque, void *event);
    /* Optional: blocks until the event completes (used when memory runs out
     * and by fp_alloc_synchronize_events). */
    void (*synchronize)(void *opaque, void *event);
    void (*destroy)(void *opaque, void *event);
    /* Optional: FP_OK if `stream` may be used with this allocator, else a
     * status with a message (the CUDA ops: FP_ERR_INVALID_ARGUMENT for a
     * stream of another device). Called when a stream needs a new segment
     * and by fp_alloc_record_stream, never on a cache hit. */
    fp_status (*check_stream)(void *opaque, fp_stream stream);
    void *opaque;
} fp_alloc_event_ops;

/* CUDA events (cudaEventDisableTiming) on device `device`; record refuses a
 * stream that is being captured or whose capture status cannot be read;
 * check_stream rejects streams of other devices (cudaStreamGetDevice, CUDA
 * >= 12.8) and does not query a stream that is being captured. Every call
 * restores the caller's current device. */
FP_API fp_status fp_alloc_event_ops_cuda(int device, fp_alloc_event_ops *out);

/* The optional stream-wait op (stream-ordered reuse, see the policy above):
 * makes work queued on `stream` after the call wait until `event` (one that
 * the event ops' record returned) has completed, without blocking the host
 * (cudaStreamWaitEvent). FP_OK when the dependency is in place; any other
 * status means "not now": the block is not handed out by this allocation
 * (waits already placed for its other events stay, harmlessly). Called with
 * the allocator's lock held, with the event ops' opaque, only when an
 * allocation is about to take a pending block (see the policy above), never
 * for a hit on a free block; the event stays owned by the allocator
 * (destroyed right after the waits, which the semantics of
 * cudaStreamWaitEvent allow).
 *
 * It is not a field of fp_alloc_event_ops: that struct has no struct_size
 * and callers copy and fill it by value (fp_alloc_create reads it,
 * fp_alloc_event_ops_cuda writes it), so it cannot grow without breaking
 * programs built against this header's earlier versions. */
typedef fp_status (*fp_alloc_stream_wait_fn)(void *opaque, fp_stream stream, void *event);

/* Most outstanding events a pending block, or a run of neighbouring pending
 * blocks, may have and still be reused by making the allocating stream wait
 * on them (one call of the op each). */
#define FP_ALLOC_MAX_STREAM_WAITS 16

/* The stream-wait op for events of fp_alloc_event_ops_cuda (pass it to
 * fp_alloc_set_stream_wait, below; its opaque is theirs): cudaStreamWaitEvent with
 * the ops' device current (the caller's device restored). Refuses
 * (FP_ERR_UNSUPPORTED, nothing enqueued) a stream that is being captured or
 * whose capture status cannot be read, as record does; FP_ERR_CUDA if
 * cudaStreamWaitEvent fails (its error is consumed, not left for the
 * caller's cudaGetLastError); the allocator then counts a refusal
 * ("stream_wait_refusals" in the snapshot) and does without the block. */
FP_API fp_status fp_alloc_stream_wait_cuda(void *opaque, fp_stream stream, void *event);

/* ======================================================================== */
/*  Configuration                                                           */
/* ======================================================================== */

#define FP_ALLOC_POW2_INTERVALS 64

typedef struct fp_alloc_config {
    size_t struct_size;            /* set by fp_alloc_config_default */
    /* Blocks larger than this are never split, and requests smaller than it
     * never get such a block (PyTorch's max_split_size_mb). Default SIZE_MAX:
     * no limit. Values below FP_ALLOC_LARGE_SEGMENT are raised to it. */
    size_t max_split_size;
    /* A cached block that will not be split (size > max_split_size) is
     * handed out only if it is at most this much larger than the request
     * (PyTorch's max_non_split_rounding_mb). Default 20 MiB. */
    size_t max_non_split_rounding;
    /* roundup_power2_divisions[k] = d (a power of two, 0 or 1: off): sizes in
     * [2^k, 2^(k+1)) are rounded up to the next multiple of 2^k / d (when that
     * step is >= 256). Fill ranges with fp_alloc_config_set_divisions. */
    uint32_t roundup_power2_divisions[FP_ALLOC_POW2_INTERVALS];
    /* Cap on reserved bytes: memory_cap_bytes (0: none) and/or
     * memory_fraction of upstream.total_bytes() (0: none); the smaller
     * applies. Exceeding it behaves like upstream out-of-memory. */
    size_t memory_cap_bytes;
    double memory_fraction;
    /* In (0, 1): before reserving a new segment that would take reserved
     * bytes above threshold * cap, release cached unsplit segments, least
     * recently freed first (needs a cap). 0: off. */
    double garbage_collection_threshold;
    /* Capacity of the ring of alloc/free events (0: off). */
    size_t event_ring_size;
} fp_alloc_config;

/* Fills the defaults above. */
FP_API fp_status fp_alloc_config_default_sized(fp_alloc_config *cfg, size_t struct_size);
/* The exported fp_alloc_config_default writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_alloc_config_default)(fp_alloc_config *cfg);
#define fp_alloc_config_default(cfg) fp_alloc_config_default_sized((cfg), sizeof *(cfg))
/* Sets roundup_power2_divisions for every interval [2^k, 2^(k+1)) that
 * intersects [lo_bytes, hi_bytes]. FP_ERR_INVALID_ARGUMENT if divisions is not
 * 0 or a power of two <= 2^20, or lo > hi. */
FP_API fp_status fp_alloc_config_set_divisions(fp_alloc_config *cfg, size_t lo_bytes,
                                               size_t hi_bytes, uint32_t divisions);

/* ======================================================================== */
/*  The allocator                                                           */
/* ======================================================================== */

typedef struct fp_allocator fp_allocator;

/* Creates an allocator over `upstream` (copied). `events` NULL means streams
 * are synchronous (the host case): a block freed after record_stream is
 * reusable at once. No stream-wait op is installed (fp_alloc_set_stream_wait
 * adds one). cfg NULL means defaults. FP_ERR_INVALID_ARGUMENT for a bad
 * config (struct_size, divisions, memory_fraction outside [0, 1],
 * garbage_collection_threshold outside [0, 1)). */
FP_API fp_status fp_alloc_create_sized(const fp_alloc_upstream *upstream, size_t upstream_size,
                                       const fp_alloc_event_ops *events, size_t events_size,
                                       const fp_alloc_config *cfg, fp_allocator **out);
/* fp_alloc_create is a macro passing the caller's sizeof of both tables
 * (so they can grow: callbacks are only ever appended, and those an older
 * table lacks are absent; a table size this library does not know is
 * FP_ERR_INVALID_ARGUMENT). The exported function of that name reads 0.2's
 * tables. The functions that fill a table (fp_alloc_upstream_*,
 * fp_alloc_event_ops_cuda) fill this header's layout. */
FP_API fp_status(fp_alloc_create)(const fp_alloc_upstream *upstream,
                                  const fp_alloc_event_ops *events, const fp_alloc_config *cfg,
                                  fp_allocator **out);
#define fp_alloc_create(upstream, events, cfg, out) \
    fp_alloc_create_sized((upstream), sizeof(fp_alloc_upstream), (events), sizeof(fp_alloc_event_ops), \
                          (cfg), (out))
/* Device upstream + CUDA events + the CUDA stream-wait op
 * (fp_alloc_stream_wait_cuda: stream-ordered reuse) for a CUDA context, host
 * upstream for a CPU context. */
FP_API fp_status fp_alloc_create_for_context(fp_context *ctx, const fp_alloc_config *cfg,
                                             fp_allocator **out);
/* Installs `wait` as a's stream-wait op (NULL removes it: pending blocks are
 * then reused only once their events are found complete). ONLY for
 * allocators over device memory: memory the host touches (host, pinned,
 * registered upstreams) is written by the CPU as soon as fp_alloc_alloc
 * returns, before any stream reaches the wait, so reusing it that way would
 * race with the other streams' reads and writes. FP_ERR_INVALID_ARGUMENT
 * for an allocator created without event ops. Thread-safe; takes effect
 * from the next allocation. */
FP_API fp_status fp_alloc_set_stream_wait(fp_allocator *a, fp_alloc_stream_wait_fn wait);

/* Releases every segment to the upstream, including ones that still hold
 * live blocks (their pointers become invalid), and destroys pending events.
 * NULL is a no-op. No other thread may use the allocator during the call. */
FP_API void fp_alloc_destroy(fp_allocator *a);

/* Allocates `size` bytes for use on `stream` (an opaque handle, NULL is a
 * valid stream). size 0: *out = NULL and FP_OK, nothing changes. Errors:
 * FP_ERR_INVALID_ARGUMENT (NULL a/out, size > FP_ALLOC_MAX_REQUEST),
 * FP_ERR_OUT_OF_MEMORY (after the retries described above; the message gives
 * requested and block bytes, the segment sizes asked for and who refused
 * them, allocated, reserved, inactive-split bytes, bytes waiting on stream
 * events and the cap), the status of
 * events->check_stream for a stream it rejects (another device's), or the
 * upstream's status. *out is set only on success. Thread-safe. */
FP_API fp_status fp_alloc_alloc(fp_allocator *a, size_t size, fp_stream stream, void **out);
/* Frees a pointer returned by fp_alloc_alloc. NULL is a no-op. Errors:
 * FP_ERR_NOT_FOUND if the pointer is not a live allocation of this allocator:
 * its message says "double free" when the pointer lies inside one of this
 * allocator's segments (a block already freed, or the inside of a block),
 * "not owned" otherwise. Nothing changes on error. Thread-safe. */
FP_API fp_status fp_alloc_free(fp_allocator *a, void *ptr);
/* Marks that `ptr` is used on `stream`: when freed, it is reused only after
 * the work queued on `stream` at free time is done, or, with a stream-wait
 * op, by an allocation whose stream was first made to wait for that work
 * (stream-ordered reuse, see the policy at the top). With event ops this
 * includes the block's own allocation stream: device memory never needs
 * that (stream order protects it), but a pinned or registered HOST block
 * that an async copy on its own stream reads must be recorded on that
 * stream, since the CPU rewrites a reused host block at once, out of stream
 * order. Without event ops (synchronous streams) it only checks the
 * pointer. FP_ERR_NOT_FOUND for a pointer that is not live; check_stream's
 * status for a rejected stream. Thread-safe. */
FP_API fp_status fp_alloc_record_stream(fp_allocator *a, void *ptr, fp_stream stream);

/* Size of the block behind a live allocation (>= the rounded request: a
 * block is not split when the remainder would be too small to use).
 * FP_ERR_NOT_FOUND for a pointer that is not live. Thread-safe. */
FP_API fp_status fp_alloc_usable_size(fp_allocator *a, const void *ptr, size_t *out);

/* Block size a request of `size` bytes gets under a's rounding rules
 * (FP_ERR_INVALID_ARGUMENT if size is 0 or too large). Thread-safe. */
FP_API fp_status fp_alloc_round_size(const fp_allocator *a, size_t size, size_t *out);

/* Polls pending events (non-blocking) and returns every cached segment that
 * holds no live or pending block to the upstream, except segments of private
 * pools that are not released. FP_ERR_UNSUPPORTED, nothing released, while a
 * private pool is active (between fp_alloc_pool_begin and fp_alloc_pool_end:
 * a release would be a cudaFree inside a graph capture). Thread-safe. */
FP_API fp_status fp_alloc_empty_cache(fp_allocator *a);
/* Like empty_cache (the same refusal while a private pool is active) but
 * stops once reserved bytes are <= target_reserved; least recently freed
 * segments go first. Thread-safe. */
FP_API fp_status fp_alloc_trim(fp_allocator *a, size_t target_reserved);
/* Waits for every pending event (needs event ops with synchronize) and makes
 * the blocks behind them reusable. Thread-safe. */
FP_API fp_status fp_alloc_synchronize_events(fp_allocator *a);

/* ======================================================================== */
/*  Statistics                                                              */
/* ======================================================================== */

typedef struct fp_alloc_stat {
    int64_t current;
    int64_t peak;       /* since creation or fp_alloc_reset_peak */
    uint64_t total;     /* cumulative increments since creation */
    uint64_t freed;     /* cumulative decrements since creation */
} fp_alloc_stat;

/* Pool classes of the per-pool statistics (fp_alloc_stats.pools[]). */
typedef enum fp_alloc_pool_class {
    FP_ALLOC_POOL_LARGE = 0, /* large-pool segments and huge requests' own segments */
    FP_ALLOC_POOL_SMALL = 1  /* FP_ALLOC_SMALL_SEGMENT segments of blocks <= 1 MiB */
} fp_alloc_pool_class;

/* The statistics of one pool class, summed over the default pool and the
 * private pools. The first nine fields mean what the same fields of
 * fp_alloc_stats mean. For every field, current, total and freed of
 * pools[FP_ALLOC_POOL_LARGE] + pools[FP_ALLOC_POOL_SMALL] equal the aggregate;
 * peaks do not add up (the two classes peak at different times): the
 * aggregate peak lies between the larger class peak and their sum. */
typedef struct fp_alloc_pool_stats {
    fp_alloc_stat allocated_bytes;
    fp_alloc_stat requested_bytes;
    fp_alloc_stat reserved_bytes;
    fp_alloc_stat active_bytes;
    fp_alloc_stat inactive_split_bytes;
    fp_alloc_stat allocation_count;
    fp_alloc_stat segment_count;
    fp_alloc_stat active_count;
    fp_alloc_stat inactive_split_count;
    uint64_t upstream_allocs;
    uint64_t upstream_frees;
    uint64_t cache_hits;
    uint64_t cache_misses;
} fp_alloc_pool_stats;

typedef struct fp_alloc_stats {
    size_t struct_size;                 /* set by the caller: sizeof(fp_alloc_stats), or
                                           FP_ALLOC_STATS_SIZE_V1 for the fields before pools[] */
    fp_alloc_stat allocated_bytes;      /* rounded block bytes held by users */
    fp_alloc_stat requested_bytes;      /* bytes users asked for */
    fp_alloc_stat reserved_bytes;       /* bytes held from the upstream */
    fp_alloc_stat active_bytes;         /* allocated + freed but waiting on events */
    fp_alloc_stat inactive_split_bytes; /* free blocks inside split segments */
    fp_alloc_stat allocation_count;
    fp_alloc_stat segment_count;
    fp_alloc_stat active_count;
    fp_alloc_stat inactive_split_count;
    uint64_t upstream_allocs;           /* successful upstream alloc calls */
    uint64_t upstream_frees;
    uint64_t upstream_failures;         /* failed upstream alloc calls */
    uint64_t cache_hits;                /* allocations served from the cache */
    uint64_t cache_misses;              /* allocations that needed a new segment */
    uint64_t retries;                   /* retries after releasing cache on OOM */
    uint64_t ooms;                      /* FP_ERR_OUT_OF_MEMORY returned */
    uint64_t oversize_allocations;      /* blocks > max_split_size handed out */
    uint64_t gc_releases;               /* segments released by the GC threshold */
    uint64_t pending_event_blocks;      /* blocks waiting on events now */
    /* Appended in 0.x (callers built before it pass FP_ALLOC_STATS_SIZE_V1): */
    fp_alloc_pool_stats pools[2];       /* by class, indexed by fp_alloc_pool_class */
} fp_alloc_stats;

/* struct_size of fp_alloc_stats before pools[] was appended. */
#define FP_ALLOC_STATS_SIZE_V1 offsetof(fp_alloc_stats, pools)

/* Copies the statistics: the first out->struct_size bytes, which must be
 * sizeof(fp_alloc_stats) or FP_ALLOC_STATS_SIZE_V1 (FP_ERR_INVALID_ARGUMENT
 * otherwise, *out untouched). Thread-safe. */
FP_API fp_status fp_alloc_get_stats(fp_allocator *a, fp_alloc_stats *out);
/* Sets every peak to its current value. Thread-safe. */
FP_API fp_status fp_alloc_reset_peak(fp_allocator *a);

/* Snapshot of config, stats, segments and their blocks as JSON:
 *   {"config": {...},
 *    "stats": {..., "stream_waits": N, "stream_wait_refusals": N,
 *              "pools": {"large": {...}, "small": {...}}},
 *    "segments": [{"address": "0x..", "size": N, "stream": "0x..",
 *                  "pool": id (0: default), "kind": "small"|"large",
 *                  "blocks": [{"address": "0x..", "size": N, "requested": N,
 *                              "state": "allocated"|"free"|"pending"}]}]}
 * Segments are sorted by address. "stream_waits" counts the pending blocks
 * reclaimed by stream-ordered reuse (the allocations that took them count as
 * cache hits), "stream_wait_refusals" the calls of the stream-wait op that
 * refused; both stay 0 without the op. (They are not fields of
 * fp_alloc_stats, whose layout programs and the Python bindings mirror.)
 * *out is a NUL-terminated string to release with fp_alloc_json_free.
 * Thread-safe: the records are copied under the allocator's lock and the
 * document is built after releasing it (other threads wait only for the
 * copy, O(blocks) but no formatting). */
FP_API fp_status fp_alloc_snapshot_json(fp_allocator *a, char **out);
FP_API void fp_alloc_json_free(char *json);

/* ======================================================================== */
/*  Event ring                                                              */
/* ======================================================================== */

typedef enum fp_alloc_event_kind {
    FP_ALLOC_EV_ALLOC = 0,
    FP_ALLOC_EV_FREE = 1,
    FP_ALLOC_EV_RECORD_STREAM = 2, /* stream = the stream recorded */
    FP_ALLOC_EV_SEGMENT_ALLOC = 3, /* size = segment bytes */
    FP_ALLOC_EV_SEGMENT_FREE = 4,
    FP_ALLOC_EV_OOM = 5            /* ptr NULL, size = requested */
} fp_alloc_event_kind;

/* An array element, so it has no struct_size: the functions that read or
 * write arrays of it take the element size (the macros below pass the
 * caller's sizeof), and fields are only ever appended. */
typedef struct fp_alloc_event {
    uint64_t seq;        /* 0, 1, 2, ... over the allocator's life */
    uint32_t kind;       /* fp_alloc_event_kind */
    uint32_t pool_low;   /* the low 32 bits of `pool` (0.2's field, kept for its layout) */
    uintptr_t ptr;
    size_t size;         /* requested bytes for ALLOC/FREE */
    fp_stream stream;
    /* ---- Added in 0.3 ---- */
    uint64_t pool;       /* 0: default pool, else the private pool's id */
} fp_alloc_event;

/* sizeof(fp_alloc_event) in 0.2, which ended at `stream`. */
#define FP_ALLOC_EVENT_SIZE_0_2 offsetof(fp_alloc_event, pool)

/* Copies up to `max` of the most recent events, oldest first, into out (an
 * array of elements of event_size bytes: from FP_ALLOC_EVENT_SIZE_0_2 to
 * sizeof(fp_alloc_event); each gets the fields its layout has); sets *n.
 * With clear != 0 the ring is emptied. FP_ERR_UNSUPPORTED when the ring is
 * off (event_ring_size 0); FP_ERR_INVALID_ARGUMENT for another event_size.
 * Thread-safe. Call it through the fp_alloc_read_events macro; the exported
 * function of that name writes 0.2's layout. */
FP_API fp_status fp_alloc_read_events_sized(fp_allocator *a, fp_alloc_event *out,
                                            size_t event_size, size_t max, size_t *n, int clear);
FP_API fp_status(fp_alloc_read_events)(fp_allocator *a, fp_alloc_event *out, size_t max,
                                       size_t *n, int clear);
#define fp_alloc_read_events(a, out, max, n, clear) \
    fp_alloc_read_events_sized((a), (out), sizeof(fp_alloc_event), (max), (n), (clear))

/* ======================================================================== */
/*  Private pools (graph capture)                                           */
/* ======================================================================== */

/* From now on, allocations on `stream` come from private pool `pool_id`
 * (nonzero; created on first use). Memory of a private pool is reused only by
 * allocations into that pool, and empty_cache leaves it alone until the pool
 * is released: a captured graph keeps its addresses valid. While any pool is
 * active, events are neither recorded nor polled (frees needing events are
 * deferred until capture ends). FP_ERR_INVALID_ARGUMENT if pool_id is 0 or
 * was ever released (with or without segments left: an allocator remembers
 * every released id, 8 bytes each), or if `stream` is already directed to a
 * pool. Thread-safe. */
FP_API fp_status fp_alloc_pool_begin(fp_allocator *a, uint64_t pool_id, fp_stream stream);
/* Stops directing allocations on the streams mapped to pool_id.
 * FP_ERR_NOT_FOUND if pool_id is not active. Thread-safe. */
FP_API fp_status fp_alloc_pool_end(fp_allocator *a, uint64_t pool_id);
/* The owner (graph) is gone: the pool's free segments go back to the
 * upstream now, the rest as soon as their blocks are freed; the id cannot be
 * used again (fp_alloc_pool_begin refuses it). FP_ERR_NOT_FOUND for an
 * unknown or already released pool; FP_ERR_INVALID_ARGUMENT if still active;
 * FP_ERR_OUT_OF_MEMORY (nothing released) if the id cannot be recorded. */
FP_API fp_status fp_alloc_pool_release(fp_allocator *a, uint64_t pool_id);

/* ======================================================================== */
/*  Trace replay (A/B)                                                      */
/* ======================================================================== */

typedef enum fp_alloc_trace_kind {
    FP_ALLOC_TRACE_ALLOC = 0,         /* slot <- alloc(size) on stream */
    FP_ALLOC_TRACE_FREE = 1,          /* free(slot) */
    FP_ALLOC_TRACE_RECORD_STREAM = 2  /* record_stream(slot, stream) */
} fp_alloc_trace_kind;

typedef struct fp_alloc_trace_op {
    uint8_t kind;      /* fp_alloc_trace_kind */
    uint8_t stream;    /* index into the replay's stream table */
    uint16_t reserved;
    uint32_t slot;     /* which live pointer */
    uint64_t size;
} fp_alloc_trace_op;

typedef struct fp_alloc_trace {
    fp_alloc_trace_op *ops;
    size_t n_ops;
    uint32_t n_slots;
    uint32_t n_streams;
} fp_alloc_trace;

typedef struct fp_alloc_trace_config {
    size_t struct_size;
    int layers;        /* transformer blocks (default 12) */
    int steps;         /* training steps (default 4) */
    int streams;       /* 1..8 (default 3: compute, communication, data) */
    int batch;         /* default 8 */
    int hidden;        /* default 1024 */
    int heads;         /* default 16 */
    int max_seq;       /* sequence lengths vary per step in [max/4, max] (default 1024) */
    double random_free_fraction; /* share of temporaries freed out of order (default 0.3) */
    uint64_t seed;     /* default 1 */
} fp_alloc_trace_config;

FP_API fp_status fp_alloc_trace_config_default_sized(fp_alloc_trace_config *cfg, size_t struct_size);
/* The exported fp_alloc_trace_config_default writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_alloc_trace_config_default)(fp_alloc_trace_config *cfg);
#define fp_alloc_trace_config_default(cfg) fp_alloc_trace_config_default_sized((cfg), sizeof *(cfg))
/* Generates a training-like trace: persistent weights, per-layer forward
 * activations kept for backward (LIFO frees), temporaries freed at once or
 * out of order, gradient buckets on a communication stream with
 * record_stream, small input batches on a data stream, sequence length
 * varying per step. Every allocation is freed by the end, so replaying it
 * again reaches a steady state. Release with fp_alloc_trace_destroy. */
FP_API fp_status fp_alloc_trace_generate(const fp_alloc_trace_config *cfg, fp_alloc_trace **out);
/* Builds a trace from events read from the ring (ALLOC, FREE and
 * RECORD_STREAM; frees of pointers allocated before the window are dropped,
 * pointers still live at the end are freed at the end). Streams are numbered
 * in order of appearance (at most 256). */
FP_API fp_status fp_alloc_trace_from_events_sized(const fp_alloc_event *events, size_t event_size,
                                                  size_t n, fp_alloc_trace **out);
/* The exported function reads 0.2's layout; the macro passes the caller's sizeof. */
FP_API fp_status(fp_alloc_trace_from_events)(const fp_alloc_event *events, size_t n,
                                             fp_alloc_trace **out);
#define fp_alloc_trace_from_events(events, n, out) \
    fp_alloc_trace_from_events_sized((events), sizeof(fp_alloc_event), (n), (out))
FP_API void fp_alloc_trace_destroy(fp_alloc_trace *t);

typedef struct fp_alloc_replay_result {
    size_t struct_size;
    fp_stats alloc_latency;   /* per alloc call, milliseconds (time_ops != 0) */
    fp_stats free_latency;    /* per free call */
    double total_ms;          /* wall time of the whole replay */
    uint64_t upstream_allocs; /* during this replay */
    uint64_t upstream_frees;
    size_t peak_requested;    /* peak of live requested bytes */
    size_t peak_allocated;    /* caching: peak of allocated (rounded) bytes */
    size_t peak_reserved;     /* peak bytes held from the upstream */
} fp_alloc_replay_result;

/* Replays t through a (streams[i] is the stream of trace stream i; NULL
 * streams means trace stream i is the handle (void*)(i + 1), usable only
 * without CUDA events). With time_ops each call is timed. The replay resets
 * a's peaks (fp_alloc_reset_peak) at its start, so the peaks are this
 * replay's (peak_reserved includes what a already held). Ends with every
 * trace pointer freed; a's cache is kept, so a second replay shows the
 * steady state. FP_ERR_INVALID_ARGUMENT for a malformed trace (slot or
 * stream out of range, a slot allocated twice). */
FP_API fp_status fp_alloc_trace_replay(fp_allocator *a, const fp_alloc_trace *t,
                                       const fp_stream *streams, int time_ops,
                                       fp_alloc_replay_result *out);
/* The baseline: the same trace straight through upstream alloc/free. */
FP_API fp_status fp_alloc_trace_replay_direct_sized(const fp_alloc_upstream *up, size_t upstream_size,
                                                    const fp_alloc_trace *t, int time_ops,
                                                    fp_alloc_replay_result *out);
/* A macro passing sizeof(fp_alloc_upstream); the exported function reads 0.2's table. */
FP_API fp_status(fp_alloc_trace_replay_direct)(const fp_alloc_upstream *up, const fp_alloc_trace *t,
                                               int time_ops, fp_alloc_replay_result *out);
#define fp_alloc_trace_replay_direct(up, t, time_ops, out) \
    fp_alloc_trace_replay_direct_sized((up), sizeof(fp_alloc_upstream), (t), (time_ops), (out))

/* ======================================================================== */
/*  PyTorch pluggable allocator                                             */
/* ======================================================================== */
/* Entry points for torch.cuda.memory.CUDAPluggableAllocator(path,
 * "fp_torch_malloc_or_throw", "fp_torch_free") followed by
 * torch.cuda.memory.change_current_allocator(...) (before the process makes
 * its first CUDA allocation; fastpath.torch_alloc.use_fastpath_allocator()
 * does both). PyTorch then gets every CUDA tensor's memory from a caching
 * allocator of this library: one instance per device, created on the first
 * fp_torch_malloc on that device, over fp_alloc_upstream_device(device) and
 * fp_alloc_event_ops_cuda(device) with fp_alloc_stream_wait_cuda (stream-ordered
 * reuse of blocks passed to fp_torch_record_stream), with the configuration given to
 * fp_torch_allocator_configure (defaults otherwise). Instances live until
 * the process exits (PyTorch may free tensors during interpreter shutdown).
 *
 * What PyTorch (2.x) routes to the plugin and what it does not:
 *   - Tensor allocation and release: fp_torch_malloc / fp_torch_free, with
 *     the current device and current stream at allocation time; the free
 *     gets the same device and stream back.
 *   - Tensor.record_stream(s): NOT routed. The Python CUDAPluggableAllocator
 *     sets no record-stream hook, so the call is a no-op. Consequence: a
 *     tensor used on a second stream and freed on the host while that stream
 *     still works on it goes back to the cache for its allocation stream at
 *     once, and the next allocation on that stream may get the same memory
 *     while the second stream still reads or writes it (a silent data
 *     race). Either order the streams yourself before dropping the last
 *     reference (alloc_stream.wait_stream(other_stream)), or call
 *     fp_torch_record_stream (fastpath.torch_alloc.record_stream(t, s))
 *     where you would call t.record_stream(s); a C++ extension can install
 *     fp_torch_record_stream as the allocator's record_stream_fn.
 *   - torch.cuda.empty_cache(): NOT routed from Python (no reset hook is
 *     set); call fp_torch_empty_cache (fastpath.torch_alloc.empty_cache()).
 *   - torch.cuda.memory_stats() / memory_snapshot() / reset_peak_memory_stats:
 *     PyTorch raises for pluggable allocators; read the instance with
 *     fp_torch_allocator_get and fp_alloc_get_stats / fp_alloc_snapshot_json.
 *   - CUDA graph capture (private pools): NOT routed; memory allocated during
 *     capture comes from the ordinary per-stream cache, so a captured graph's
 *     addresses can be reused by later allocations. Do not capture graphs
 *     with this allocator installed.
 */

/* For struct CUstream_st (cudaStream_t is `struct CUstream_st *`, so callers
 * may pass a cudaStream_t without this header including CUDA's) and
 * ssize_t. */
#include <sys/types.h>
struct CUstream_st;

/* The allocation function PyTorch calls (its signature for alloc_fn_name).
 * Returns a block of at least `size` bytes of device memory of CUDA device
 * `device`, ordered on `stream` (stream-ordered reuse as fp_alloc_alloc),
 * FP_ALLOC_ALIGN-aligned. size 0: returns NULL, records no error and
 * creates no instance (PyTorch's own allocator also returns NULL for 0
 * bytes; such a pointer is never passed to the free function). On failure
 * returns NULL and the detail is in fp_last_error(): a negative size or one
 * above FP_ALLOC_MAX_REQUEST (FP_ERR_INVALID_ARGUMENT), a device that does
 * not exist (FP_ERR_NO_DEVICE), out of memory after the cache was released
 * (FP_ERR_OUT_OF_MEMORY, message with requested/allocated/reserved bytes).
 * PyTorch (2.x) does not check alloc_fn's result (a NULL for size > 0
 * would become a tensor with a null data pointer), so PyTorch is given
 * fp_torch_malloc_or_throw (below), which throws instead.
 * Thread-safe; after the first call on a device the cost is one atomic
 * load plus fp_alloc_alloc. */
FP_API void *fp_torch_malloc(ssize_t size, int device, struct CUstream_st *stream);
/* What fastpath.torch_alloc gives PyTorch as alloc_fn: fp_torch_malloc, but
 * a failure (size > 0 and no memory, a bad size or device) throws a C++
 * std::runtime_error whose what() is "libfastpath: fp_torch_malloc of N
 * bytes on device D failed: " + fp_last_error() (for out of memory: "caching
 * allocator out of memory: requested ..."). PyTorch's
 * CUDAPluggableAllocator calls alloc_fn from C++ and does not check the
 * pointer; the exception unwinds through it and its Python bindings raise it
 * as RuntimeError at the allocating call (not torch.OutOfMemoryError: that
 * needs c10::OutOfMemoryError, a libtorch type this library does not link).
 * size 0: NULL, no throw. ONLY for C++ callers that catch (a C caller cannot:
 * the exception would terminate the process). Thread-safe. */
FP_API void *fp_torch_malloc_or_throw(ssize_t size, int device, struct CUstream_st *stream);
/* The release function PyTorch calls. `size` and `stream` are ignored (the
 * block knows its size and stream). A pointer that no instance owns (not
 * allocated here, already freed) and NULL are ignored: nothing changes, the
 * detail of the former is in fp_last_error(). A pointer owned by another
 * device's instance than `device` is freed there. Thread-safe. */
FP_API void fp_torch_free(void *ptr, ssize_t size, int device, struct CUstream_st *stream);
/* Marks that `ptr` (a live fp_torch_malloc block) is used on `stream` as
 * fp_alloc_record_stream does (the signature of PyTorch's C++
 * record_stream_fn). Unknown pointers and NULL are ignored (detail in
 * fp_last_error()). Thread-safe. */
FP_API void fp_torch_record_stream(void *ptr, struct CUstream_st *stream);
/* fp_alloc_empty_cache on every instance created so far (the signature of
 * PyTorch's reset_fn). Thread-safe. */
FP_API void fp_torch_empty_cache(void);

/* Sets the configuration every instance will be created with (copied;
 * NULL: defaults). May be called any number of times before the first
 * instance is created (the last call wins). FP_ERR_INVALID_ARGUMENT once an
 * instance exists (the first fp_torch_malloc with size > 0 on an existing
 * device creates one, even if that allocation then fails), or for a bad
 * config (what fp_alloc_create rejects: struct_size, divisions, fractions);
 * the configuration in force is unchanged then.
 * Touches no CUDA state. Thread-safe. */
FP_API fp_status fp_torch_allocator_configure(const fp_alloc_config *cfg);
/* The instance of device `device`, for fp_alloc_get_stats,
 * fp_alloc_snapshot_json, fp_alloc_reset_peak, fp_alloc_trim... (not
 * fp_alloc_destroy: the library owns it). Does not create one: FP_ERR_NOT_FOUND
 * while nothing was allocated on that device; FP_ERR_NO_DEVICE for a
 * negative index or one >= the number of CUDA devices;
 * FP_ERR_INVALID_ARGUMENT for NULL out. *out is set only on success.
 * Thread-safe. */
FP_API fp_status fp_torch_allocator_get(int device, fp_allocator **out);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_ALLOC_H */
