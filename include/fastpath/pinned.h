/*
 * libfastpath pinned memory: a pool of page-locked host memory that pins at
 * the size asked for, ahead of need in bounded segments on a thread of its
 * own, under a budget, with the cost of every pin measured.
 *
 * Why
 *   Async copies need pinned (page-locked) host memory, and pinning is slow
 *   in a way that hurts others: cudaHostAlloc / cudaHostRegister fault in
 *   and lock every page while holding a driver-wide lock, so one call that
 *   pins hundreds of GB stalls every other thread (and process) that needs
 *   the driver for minutes (TensorRT-LLM#17429). Caches of pinned blocks
 *   round requests to powers of two (PyTorch's, pytorch#150517), wasting up
 *   to half of what they pin.
 *
 * API tiers
 *   1. The pool (fp_pinned_pool_*): a caching allocator (alloc.h) whose
 *      upstream pins host memory at the size asked for, one segment per
 *      pin call. Take blocks with fp_alloc_alloc / fp_alloc_free on
 *      fp_pinned_pool_allocator(pool), or give that allocator to a pipeline
 *      (fp_pipeline_config.pinned) as its staging memory.
 *   2. Background pinning (fp_pinned_pool_reserve): a thread pins memory
 *      ahead of need into the pool's cache, one chunk-sized segment per pin
 *      call, while other threads go on allocating.
 *   3. Registering user memory (fp_pinned_register): existing host memory
 *      pinned in place (cudaHostRegister, one call), measured the same way.
 *   4. Statistics (fp_pinned_pool_get_stats): bytes pinned, the pin rate,
 *      the longest single pin call, the longest time a foreground thread
 *      waited to pin, refusals by the budget.
 *
 * How memory is pinned
 *   - Host memory comes from mmap (page-aligned, at its size rounded up to a
 *     page: never to a power of two). Its pages are touched first, one write
 *     per page, before the pin calls, so the page faults do not happen while
 *     the driver holds its lock; then one cudaHostRegister
 *     (cudaHostRegisterPortable) pins the whole segment, and
 *     cudaHostUnregister unpins it on release.
 *   - One registration per segment, never pieces: a copy whose host range
 *     spans two registrations fails (cudaErrorInvalidValue, measured on an
 *     H100 with driver 580), as one over registered and pageable memory
 *     does, and every block lies inside one segment.
 *   - A process-wide pin lock (one for every pool of the process, as the
 *     driver's lock is) is held for one pin call at a time and handed over
 *     in FIFO order: a thread that needs to pin waits at most for the call
 *     in progress and those of threads that asked before it. A reserve pins
 *     one segment of chunk_bytes per call, so a thread never waits for a
 *     whole reserve; a block larger than a chunk is pinned in one call of
 *     its own size (it must be one registration), which is then the longest
 *     wait it can impose.
 *   - Block sizes: the caching allocator rounds a request to 512 bytes (small
 *     blocks) or 2 MiB (blocks of 10 MiB and more get their own segment of
 *     that size); the pool adds nothing (a 129.5 MiB block reserves 130 MiB).
 *     Freed blocks are reused; one recorded with fp_alloc_record_stream on
 *     the streams of its async copies is reused only once those copies'
 *     events completed (CUDA event ops; never a stream wait: the CPU writes a
 *     reused host block at once).
 *   - Budget: bytes pinned by the pool (its segments, memory being pinned by
 *     a reserve, registered user memory) never exceed budget_bytes. A pin
 *     beyond it fails with FP_ERR_OUT_OF_MEMORY, giving the bytes pinned,
 *     the request and the budget; through the allocator, that is an upstream
 *     refusal: it releases cached segments and retries, and its
 *     out-of-memory message ends with the budget's.
 *   - Failures leave nothing behind: the memory is freed (and nothing stays
 *     pinned) before the error returns.
 *
 * CPU contexts ("host mode")
 *   On a CPU context the pool runs the same code with no CUDA call: a "pin
 *   call" is the first touch of the range's pages (the page faults that a
 *   real pin also pays), under the same process-wide lock, so the segments,
 *   the budget, reuse, registration rules, the background reserve and the
 *   wait bounds are all testable, and measured, without a GPU.
 *
 * Threads
 *   Every function is thread-safe, except fp_pinned_pool_destroy (no other
 *   thread may use the pool during or after it). A reserve runs on a thread
 *   of the pool's own; destroy cancels it (it stops after the segment it
 *   is pinning). Upstream calls of the pool's allocator happen one at a
 *   time (alloc.h), but the reserve pins outside them and only hands
 *   finished segments to the allocator, so a thread whose allocation misses
 *   the cache waits at most for one segment of the reserve's pinning.
 */
#ifndef FASTPATH_PINNED_H
#define FASTPATH_PINNED_H

#include "fastpath/alloc.h"
#include "fastpath/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* chunk_bytes when the config leaves it 0. */
#define FP_PINNED_DEFAULT_CHUNK ((size_t)64 << 20)

typedef struct fp_pinned_pool fp_pinned_pool;

/* ======================================================================== */
/*  The pool                                                                */
/* ======================================================================== */

typedef struct fp_pinned_config {
    size_t struct_size;          /* set by fp_pinned_config_default */
    /* The size of a reserve's segments (fp_pinned_pool_reserve_segment),
     * so the most a thread waits for the reserve's pinning: one pin call of
     * this much. Rounded up to the page size. 0: FP_PINNED_DEFAULT_CHUNK. */
    size_t chunk_bytes;
    /* Cap on bytes pinned by this pool (segments, a reserve's segment in
     * progress, registered user memory). 0: none. */
    size_t budget_bytes;
    /* The caching allocator's configuration (NULL: alloc.h's defaults).
     * Borrowed during fp_pinned_pool_create only. Setting
     * roundup_power2_divisions brings back power-of-two style rounding:
     * leave it off unless you want that. */
    const fp_alloc_config *alloc_config;
} fp_pinned_config;

/* Fills the defaults above (chunk_bytes FP_PINNED_DEFAULT_CHUNK, no budget,
 * alloc_config NULL). FP_ERR_INVALID_ARGUMENT for NULL or a bad
 * struct_size. */
FP_API fp_status fp_pinned_config_default_sized(fp_pinned_config *cfg, size_t struct_size);
#define fp_pinned_config_default(cfg) fp_pinned_config_default_sized((cfg), sizeof *(cfg))

/* Creates a pool on ctx (cfg NULL: defaults). CUDA context: real pinning
 * with ctx's device current, CUDA event ops (fp_alloc_event_ops_cuda) in the
 * allocator. CPU context: host mode (see above), no event ops (streams are
 * synchronous). Pins nothing yet. Errors: FP_ERR_INVALID_ARGUMENT (NULL
 * ctx/out, struct_size, a chunk_bytes that rounds past SIZE_MAX, what
 * fp_alloc_create rejects in alloc_config), FP_ERR_OUT_OF_MEMORY,
 * FP_ERR_NO_DEVICE. Thread-safe. */
FP_API fp_status fp_pinned_pool_create(fp_context *ctx, const fp_pinned_config *cfg, fp_pinned_pool **out);

/* Cancels a running reserve (waits for the segment it is pinning), unregisters
 * the user memory still registered with the pool, destroys the allocator
 * (every segment unpinned and freed, including blocks still in use: their
 * pointers become invalid). NULL is a no-op. No other thread may use the
 * pool, or its allocator, during or after the call. */
FP_API void fp_pinned_pool_destroy(fp_pinned_pool *pool);

/* The pool's caching allocator (owned by the pool: do not destroy it). Use
 * fp_alloc_alloc / free / record_stream / empty_cache / get_stats on it,
 * or pass it as fp_pipeline_config.pinned. Blocks are 256-byte aligned
 * pinned host memory. NULL for a NULL pool. Thread-safe. */
FP_API fp_allocator *fp_pinned_pool_allocator(fp_pinned_pool *pool);

/* ======================================================================== */
/*  Background pinning                                                      */
/* ======================================================================== */

/* Size of the segments a reserve pins (one fp_alloc_alloc of this many
 * bytes each, on stream NULL): chunk_bytes rounded down to 2 MiB, at least
 * FP_ALLOC_MIN_LARGE_ALLOC (so that the allocator asks its upstream for
 * exactly this size). 0 for a NULL pool. Thread-safe. */
FP_API size_t fp_pinned_pool_reserve_segment(const fp_pinned_pool *pool);

/* Starts pinning `bytes` (rounded up to whole reserve segments) into the
 * pool's cache on a background thread and returns at once. The thread pins
 * one segment at a time outside the allocator (each under the pin
 * lock), hands it to the allocator as a block on stream NULL and holds the
 * blocks until the target is reached, then frees them all: they stay cached
 * for allocations on stream NULL of more than FP_ALLOC_SMALL_SIZE (1 MiB)
 * and up to one segment (a block is split from a cached segment; a larger
 * request reserves a segment of its own; 1 MiB and less comes from the
 * allocator's small pool, whose 2 MiB segments a reserve does not make).
 * A cached free segment that the allocator hands out meanwhile counts
 * towards the target. While a reserve runs, its blocks count as allocated.
 * A call while a reserve runs adds `bytes` to its target. The reserve stops
 * at the first failure (the budget: FP_ERR_OUT_OF_MEMORY; a reserve never
 * evicts cache to make room), keeping what it pinned; fp_pinned_pool_reserve_wait
 * reports it. Errors (of the call itself): FP_ERR_INVALID_ARGUMENT (NULL
 * pool, bytes 0), FP_ERR_OUT_OF_MEMORY (no thread could be started).
 * Thread-safe. */
FP_API fp_status fp_pinned_pool_reserve(fp_pinned_pool *pool, size_t bytes);

/* Waits for the reserve to finish: timeout_ms < 0 without limit, 0 not at
 * all, > 0 up to that long. Returns FP_OK when no reserve runs and the last
 * one (if any) reached its target; FP_ERR_TIMEOUT while it still runs; else
 * the status that stopped the last reserve, with a message giving the bytes
 * it pinned, its target and the cause. Thread-safe. */
FP_API fp_status fp_pinned_pool_reserve_wait(fp_pinned_pool *pool, int64_t timeout_ms);

/* ======================================================================== */
/*  Registering user memory                                                 */
/* ======================================================================== */

/* Pins existing host memory [base, base + bytes) in place: its pages
 * touched first (an atomic OR of 0 per page: a write that keeps the data,
 * even against concurrent writers; the memory must be writable), then
 * one cudaHostRegister(cudaHostRegisterPortable) over the whole range (a
 * copy over two registrations fails on a GPU, so the range is never cut;
 * host mode: the touch is the pin). The time of the whole call
 * is counted (register_calls, register_ms), its pins in the pin statistics,
 * its bytes against the budget. The memory stays the caller's: it must
 * stay allocated until fp_pinned_unregister (or the pool's destroy).
 * Errors: FP_ERR_INVALID_ARGUMENT (NULL pool / base, bytes 0, a range that
 * wraps, a range overlapping one registered through any pool of this
 * process, or registered twice: the message names the registration),
 * FP_ERR_OUT_OF_MEMORY (the budget), FP_ERR_CUDA (cudaHostRegister refused,
 * e.g. memory that CUDA pinned otherwise). Nothing stays pinned on error.
 * Thread-safe. */
FP_API fp_status fp_pinned_register(fp_pinned_pool *pool, void *base, size_t bytes);

/* Unpins memory registered by fp_pinned_register with this pool; `base` is
 * the base it was registered with. Errors: FP_ERR_INVALID_ARGUMENT (NULL
 * pool, a registration of another pool, one still being registered or
 * unregistered), FP_ERR_NOT_FOUND (not registered: the message says whether
 * the pointer lies inside a registration, and which), FP_ERR_CUDA
 * (cudaHostUnregister failed; the registration is forgotten anyway).
 * Thread-safe. */
FP_API fp_status fp_pinned_unregister(fp_pinned_pool *pool, void *base);

/* ======================================================================== */
/*  Statistics                                                              */
/* ======================================================================== */

typedef struct fp_pinned_stats {
    size_t struct_size;           /* set by fp_pinned_stats_init */
    int host_mode;                /* 1: CPU context, a pin is a first touch */
    int reserve_running;          /* 1: a reserve's thread is at work */
    size_t chunk_bytes;           /* the pool's (rounded) */
    size_t budget_bytes;          /* 0: none */
    /* Now: bytes pinned by the pool (segments + a reserve's segment in
     * progress + registered user memory), their peak (since create or
     * reset), and the parts: the allocator's segments, user memory. */
    size_t bytes_pinned, peak_bytes_pinned, segment_bytes, registered_bytes;
    uint64_t segments;            /* the allocator's segments now */
    /* Pin calls (one segment or registration each: cudaHostRegister, or a
     * first touch in host mode), the bytes they pinned and the time inside
     * them; pin_gbps = pinned_bytes_total / pin time (1e9 bytes per GB);
     * the longest single call. Counted since create or
     * fp_pinned_pool_reset_stats. */
    uint64_t pin_calls;
    uint64_t pinned_bytes_total;
    double pin_ms;
    double pin_gbps;
    double longest_pin_call_ms;
    double touch_ms;              /* CUDA: pages touched before pinning (no lock held) */
    uint64_t unpin_calls;         /* cudaHostUnregister calls (host mode: none) */
    double unpin_ms;
    /* fp_pinned_register calls that succeeded and their whole time (touch,
     * waits, pins), ms. */
    uint64_t register_calls;
    double register_ms;
    /* The current or last reserve: its target and the bytes it holds so far. */
    size_t reserve_target_bytes, reserve_done_bytes;
    /* Waits for the pin lock of pins made by foreground threads (every
     * thread but a reserve's): the longest, their total, and how many pins
     * found the lock taken. */
    double max_pin_lock_wait_ms;
    double pin_lock_wait_ms;
    uint64_t pin_lock_contended;
    uint64_t budget_refusals;     /* pins refused by the budget */
} fp_pinned_stats;

FP_API fp_status fp_pinned_stats_init_sized(fp_pinned_stats *s, size_t struct_size);
#define fp_pinned_stats_init(s) fp_pinned_stats_init_sized((s), sizeof *(s))
/* Copies the statistics (up to out->struct_size). FP_ERR_INVALID_ARGUMENT
 * for NULL arguments or a bad struct_size. Thread-safe. */
FP_API fp_status fp_pinned_pool_get_stats(fp_pinned_pool *pool, fp_pinned_stats *out);
/* Zeroes the counters that accumulate (pin, unpin, touch, register, wait
 * and refusal figures) and sets the peak to the current bytes pinned; the
 * current figures and the reserve's stay. Thread-safe. */
FP_API fp_status fp_pinned_pool_reset_stats(fp_pinned_pool *pool);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_PINNED_H */
