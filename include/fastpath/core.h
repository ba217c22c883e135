/*
 * libfastpath core API: version, status codes, dtypes, devices, contexts,
 * device memory helpers.
 *
 * API tiers
 *   1. Core (this header): everything else builds on it.
 *   2. Timing engine (timing.h): measure, A/B-compare, roofline.
 *   3. Capabilities (norm.h, attention.h, alloc.h, batcher.h, ...): each op
 *      takes a context and a stream and ships a validate call that proves its
 *      speedup over a baseline with the timing engine.
 *
 * Conventions (they hold for every function in every header)
 *   - Functions return fp_status. FP_OK is 0; on any other value a detail
 *     message for the calling thread is available from fp_last_error().
 *   - fp_last_error() follows one rule, as errno does: a call that fails
 *     records a (non-empty) message describing that failure; a call that
 *     succeeds never changes the message, even when it failed and recovered
 *     inside (a kernel fallback, a retry after releasing cache), so an
 *     earlier failure's message stays until the next failure or
 *     fp_clear_error(). The few functions that return no status (void ones
 *     such as fp_torch_free, and value-returning ones such as
 *     fp_norm_forward_bytes) say in their comment how they fail and follow
 *     the same rule: to tell whether such a call failed, call
 *     fp_clear_error() before it and read fp_last_error() after.
 *   - Versioned structs (those whose first field is struct_size) may grow:
 *     new fields are only ever appended. The library accepts any struct_size
 *     from the struct's first published size up to its own sizeof (a
 *     multiple of size_t's alignment, as every layout's sizeof is); the
 *     fields past a caller's struct_size take their defaults, and an output
 *     struct is written only up to it. A struct_size larger than the
 *     library's (a program built against a newer header than the library
 *     it runs with) or smaller than the first published size is
 *     FP_ERR_INVALID_ARGUMENT, nothing written. Initialize them with their
 *     *_default / *_init macro, which passes the caller's sizeof.
 *   - On error, outputs are left untouched unless the function says otherwise.
 *   - The library never prints, never calls exit()/abort().
 *   - destroy functions accept NULL.
 *   - Thread-safety is stated per function. "Thread-safe" means any number of
 *     threads may call it concurrently on the same object.
 */
#ifndef FASTPATH_CORE_H
#define FASTPATH_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "fastpath/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/*  Version                                                                 */
/* ======================================================================== */

#define FP_VERSION_MAJOR 0
#define FP_VERSION_MINOR 3
#define FP_VERSION_PATCH 0
#define FP_VERSION_NUMBER \
    (FP_VERSION_MAJOR * 10000 + FP_VERSION_MINOR * 100 + FP_VERSION_PATCH)

/* Version of the library actually linked, as FP_VERSION_NUMBER. Compare with
 * the macro to detect a header/library mismatch. Thread-safe. */
FP_API int fp_version(void);
/* "MAJOR.MINOR.PATCH". Static storage. Thread-safe. */
FP_API const char *fp_version_string(void);

/* ======================================================================== */
/*  Status                                                                  */
/* ======================================================================== */

/* Values are pinned: they never change between releases. */
typedef enum fp_status {
    FP_OK = 0,
    FP_ERR_INVALID_ARGUMENT = 1, /* a NULL, out-of-range or inconsistent argument */
    FP_ERR_UNSUPPORTED = 2,      /* valid request this build/device cannot do */
    FP_ERR_OUT_OF_MEMORY = 3,    /* host or device allocation failed */
    FP_ERR_NO_DEVICE = 4,        /* no CUDA device / driver, or bad index */
    FP_ERR_CUDA = 5,             /* a CUDA runtime call failed */
    FP_ERR_CUBLAS = 6,           /* a cuBLAS / cuBLASLt call failed */
    FP_ERR_NCCL = 7,             /* an NCCL call failed */
    FP_ERR_TIMEOUT = 8,          /* a deadline passed */
    FP_ERR_QUEUE_FULL = 9,       /* a bounded queue rejected the request */
    FP_ERR_SHUT_DOWN = 10,       /* the object is shutting down / shut down */
    FP_ERR_CANCELLED = 11,       /* the request was cancelled */
    FP_ERR_NOT_FOUND = 12,       /* a name, pointer or key is unknown */
    FP_ERR_MISMATCH = 13,        /* a numerical check failed (outputs differ) */
    FP_ERR_IO = 14,              /* reading or writing a file failed */
    FP_ERR_INTERNAL = 15         /* a bug in libfastpath: please report it */
} fp_status;

/* Constant name of a status, e.g. "invalid argument". Unknown values give
 * "unknown status". Never NULL. Thread-safe. */
FP_API const char *fp_status_string(fp_status status);

/* Detail message of the last failure on the calling thread (what was wrong,
 * which argument, file:line of a failing CUDA/cuBLAS call), or "" if there
 * was none since the thread started or called fp_clear_error. Successful
 * calls leave it unchanged (see "Conventions" above). The pointer is to
 * thread-local storage that the next failure on this thread overwrites.
 * Thread-local. */
FP_API const char *fp_last_error(void);
/* Clears the calling thread's detail message (fp_last_error() then returns
 * ""). Thread-local. */
FP_API void fp_clear_error(void);

/* ======================================================================== */
/*  Data types                                                              */
/* ======================================================================== */

typedef enum fp_dtype {
    FP_F32 = 0,
    FP_F16 = 1,
    FP_BF16 = 2,
    FP_FP8_E4M3 = 3, /* Q, K, V of fp_attention_forward (attention.h); no other op yet */
    FP_FP8_E5M2 = 4  /* reserved: no op accepts it yet */
} fp_dtype;

/* Size of one element in bytes, 0 for an unknown dtype. Thread-safe. */
FP_API size_t fp_dtype_size(fp_dtype dtype);
/* "f32", "f16", "bf16", "fp8e4m3", "fp8e5m2"; "unknown" otherwise. */
FP_API const char *fp_dtype_name(fp_dtype dtype);
/* Parses a name as printed by fp_dtype_name (also "float32", "float16",
 * "half", "bfloat16"). FP_ERR_INVALID_ARGUMENT for an unknown name. */
FP_API fp_status fp_dtype_parse(const char *name, fp_dtype *out);

/* Scalar conversions, round-to-nearest-even; NaN and Inf preserved. */
FP_API float fp_f16_to_f32(uint16_t h);
FP_API uint16_t fp_f32_to_f16(float f);
FP_API float fp_bf16_to_f32(uint16_t b);
FP_API uint16_t fp_f32_to_bf16(float f);
/* Converts n elements between dtypes on the host (f32 <-> f16/bf16/f32).
 * FP_ERR_INVALID_ARGUMENT on NULL pointers or unknown dtypes. */
FP_API fp_status fp_convert_host(const void *src, fp_dtype src_dtype, void *dst,
                                 fp_dtype dst_dtype, size_t n);

/* ======================================================================== */
/*  Devices                                                                 */
/* ======================================================================== */

typedef enum fp_device_kind { FP_DEVICE_CPU = 0, FP_DEVICE_CUDA = 1 } fp_device_kind;

typedef struct fp_device_info {
    size_t struct_size;      /* set by fp_device_info_init */
    fp_device_kind kind;
    int index;               /* CUDA ordinal, -1 for the CPU */
    char name[256];
    int cc_major, cc_minor;  /* compute capability, 0.0 on CPU */
    int sm_count;            /* SMs (CUDA) or logical cores (CPU) */
    size_t total_mem_bytes;
    size_t l2_bytes;
    int mem_clock_khz, mem_bus_width_bits, sm_clock_khz;
    /* Datasheet-style peaks derived from clocks and a per-architecture
     * ops/clock table; 0 means unknown (always on CPU). */
    double peak_gbps;        /* 2 (DDR) * mem_clock * bus_width / 8 */
    double peak_tflops_fp32; /* FMA units: SMs * clock * fp32 ops/clk/SM */
    double peak_tflops_bf16; /* dense tensor-core bf16 */
    int driver_version;      /* CUDA driver API version, 0 if no driver */
    int runtime_version;     /* CUDA runtime version linked */
} fp_device_info;

/* Initializes info (zeroes it, sets struct_size). */
FP_API fp_status fp_device_info_init_sized(fp_device_info *info, size_t struct_size);
/* The exported fp_device_info_init writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_device_info_init)(fp_device_info *info);
#define fp_device_info_init(info) fp_device_info_init_sized((info), sizeof *(info))

/* Number of usable CUDA devices. Never fails for lack of a GPU or driver:
 * *count is 0 and FP_OK is returned. FP_ERR_INVALID_ARGUMENT if count is
 * NULL. Thread-safe. */
FP_API fp_status fp_device_count(int *count);

/* Describes CUDA device `index`. FP_ERR_NO_DEVICE if there is no such device
 * (including: no GPU, no driver). Thread-safe. */
FP_API fp_status fp_device_get_info(int index, fp_device_info *info);

/* Describes the host CPU (name from the OS, logical core count, memory). */
FP_API fp_status fp_cpu_get_info(fp_device_info *info);

/* CUDA runtime and driver versions as integers (e.g. 13000); 0 when absent. */
FP_API void fp_cuda_versions(int *runtime_version, int *driver_version);

/* ======================================================================== */
/*  Execution context                                                       */
/* ======================================================================== */

/* A context binds work to the CPU or to one CUDA device. A CUDA context owns
 * a non-blocking default stream, a cuBLASLt handle, a workspace and a
 * stream-ordered memory pool for the ops' temporary buffers (split-KV
 * partials, norm partial sums, baseline scratch), which keeps up to 256 MiB
 * of device memory mapped between calls until the context is destroyed
 * (FP_CTX_SCRATCH_KEEP_BYTES changes the amount). A
 * CPU context owns a worker pool used by CPU implementations of the ops. */
typedef struct fp_context fp_context;

/* A CUDA stream (cudaStream_t) passed as void*. NULL means the context's
 * own (non-blocking) default stream, not CUDA's stream 0. To run on the
 * legacy default stream (stream 0, e.g. PyTorch's default stream) pass
 * cudaStreamLegacy ((fp_stream)0x1). Ignored by CPU contexts (CPU work is
 * synchronous). */
typedef void *fp_stream;

typedef enum fp_context_option {
    FP_CTX_CPU_THREADS = 1,        /* CPU contexts: worker count (0 = all cores) */
    FP_CTX_WORKSPACE_BYTES = 2,    /* CUDA contexts: cuBLASLt workspace (0 = 32 MiB) */
    FP_CTX_SCRATCH_KEEP_BYTES = 3, /* CUDA contexts: device memory the scratch pool keeps
                                      mapped between calls (0 = 256 MiB; -1 = none:
                                      released at every synchronization). Setting it
                                      also returns what the pool holds above it now. */
    FP_CTX_ATTENTION_KERNEL = 4,   /* CUDA contexts: the flash-attention kernel version
                                      fp_attention_forward prefers: 0 = the default (v5
                                      at head_dim 128 and v10 at 64, else v3, on Hopper
                                      where they apply; v1 elsewhere: attention.h), 1 = v1 (mma.sync, 64 rows per CTA),
                                      2 = v1 with 128 rows per CTA (32 per warp; at
                                      head_dim 128 FlashAttention-2's 128 x 64 tile,
                                      FP_ATTN_V2_TILE=128x32 its earlier 128 x 32 one;
                                      96 KiB of shared memory: one CTA per SM on an
                                      A100), 3 / 4 = Hopper wgmma
                                      (pipelined / plain schedule), 5 = Hopper wgmma fed
                                      by TMA (FP_ATTN_V5_TILE=128x176: at head_dim 128
                                      FlashAttention-3's 128 x 176 tile where it
                                      applies, 16-bit dense or varlen K / V; being
                                      measured, not a default), 6 = the decode kernel (16 query rows per
                                      CTA, warps split the keys, a 2-4 tile K/V ring;
                                      calls of at most 64 packed query rows per KV
                                      head: seqlen_q x heads_q / heads_kv), 7 = v1 over
                                      8 warps (128 query rows per CTA), 8 = v5 with its
                                      two consumer warpgroups taking turns (ping-pong:
                                      one's softmax under the other's wgmmas), 9 = v8
                                      in persistent CTAs (one per SM, the longest query
                                      tiles first under a causal mask), 10 = v8 with
                                      three consumer warpgroups (192 query rows per CTA,
                                      turns going round; head_dim 64 only). A version
                                      runs where it supports the call (dtype, head_dim,
                                      layout, build, device, rows), the default kernel
                                      elsewhere; fp_attention_last_kernel says which ran
                                      and why. 5, 8, 9 and 10 also take paged KV caches
                                      (page sizes that are multiples of 8), as does
                                      the default (attention.h).
                                      v1-v10 passed the GPU tests on H100s and H200s
                                      (benchmarks/results). */
    FP_CTX_ATTENTION_SPLIT_COMBINE = 5, /* CUDA contexts: how split-KV attention (decode,
                                      few query rows: the keys split over CTAs) merges
                                      its partial results with v1 / v2: 0 = in the split
                                      kernel itself (the default: the last CTA of each
                                      query tile to finish combines the tile's rows, so
                                      a decode call is one kernel launch), 1 = a separate
                                      combine kernel after it (two launches). v3 to v5
                                      always use the separate kernel. */
    FP_CTX_LAUNCH_PDL = 6,         /* CUDA contexts: programmatic dependent launch of the
                                      library's kernels (norm forward, flash attention
                                      and its split-KV combine, axpby): 1 = on, -1 = off,
                                      0 = the default (off until a GPU has measured it;
                                      FASTPATH_PDL=1 or 0 in the environment at a
                                      context's creation sets 1 or -1). On, a kernel may
                                      start while the kernel before it on the stream
                                      finishes: its CTAs become resident and wait on the
                                      device (griddepcontrol.wait, before they touch
                                      memory) instead of being launched after it, which
                                      shortens the gap between short kernels, eagerly
                                      and inside CUDA graphs (captured as programmatic
                                      edges). Compute capability 9.0 and later, and
                                      kernels built for it (a PTX JIT of sm_80 code runs
                                      without); elsewhere it is accepted and changes
                                      nothing. Results are bit for bit the same.
                                      Traced with the CUPTI timer (trace.h), a kernel's
                                      time then starts when its CTAs became resident, so
                                      an op's span may begin inside the previous op's; the
                                      event timer records an event between ops, which
                                      (expected, not yet measured) serializes them as
                                      without PDL. */
} fp_context_option;

/* Creates a context. kind FP_DEVICE_CPU ignores device_index. For
 * FP_DEVICE_CUDA, FP_ERR_NO_DEVICE if the device does not exist (no GPU, no
 * driver or index out of range), FP_ERR_CUDA/FP_ERR_CUBLAS if setting up
 * fails. *out is set only on success. Thread-safe. */
FP_API fp_status fp_context_create(fp_device_kind kind, int device_index, fp_context **out);
/* Destroys a context after waiting for its default stream. NULL is a no-op.
 * No other thread may use ctx during or after the call. */
FP_API void fp_context_destroy(fp_context *ctx);

/* Sets an option (see fp_context_option; value 0 restores the default).
 * Not thread-safe with concurrent use of the same context. */
FP_API fp_status fp_context_set_option(fp_context *ctx, fp_context_option opt, int64_t value);

/* Accessors. Thread-safe. fp_context_kind of NULL is FP_DEVICE_CPU. */
FP_API fp_device_kind fp_context_kind(const fp_context *ctx);
FP_API int fp_context_device_index(const fp_context *ctx);
FP_API fp_stream fp_context_stream(const fp_context *ctx);
/* Copies the context's device description (peaks used by roofline). */
FP_API fp_status fp_context_device_info(const fp_context *ctx, fp_device_info *info);

/* Waits for all work queued on `stream` (NULL: the default stream).
 * FP_ERR_CUDA if queued work failed. Thread-safe. */
FP_API fp_status fp_context_synchronize(fp_context *ctx, fp_stream stream);

/* ======================================================================== */
/*  Memory helpers (device memory for CUDA contexts, host memory for CPU)  */
/* ======================================================================== */
/* These are plain cudaMalloc/cudaMemcpyAsync (or malloc/memcpy) wrappers so
 * that code can be written once for both context kinds; alloc.h has the
 * caching allocator for hot paths. All are thread-safe. Errors:
 * FP_ERR_INVALID_ARGUMENT (NULL ctx/pointers), FP_ERR_CUDA (a failing call,
 * with file:line in the detail). */

/* Allocates `bytes` (> 0) of memory usable by ops on ctx, 256-byte aligned.
 * FP_ERR_OUT_OF_MEMORY with requested size in the detail message. */
FP_API fp_status fp_mem_alloc(fp_context *ctx, size_t bytes, void **out);
/* Frees memory from fp_mem_alloc. NULL is a no-op. */
FP_API fp_status fp_mem_free(fp_context *ctx, void *ptr);
/* Copies host -> context memory / context memory -> host, stream-ordered;
 * the host side must stay valid until the stream is synchronized. */
FP_API fp_status fp_mem_upload(fp_context *ctx, void *dst, const void *host_src, size_t bytes,
                               fp_stream stream);
FP_API fp_status fp_mem_download(fp_context *ctx, void *host_dst, const void *src, size_t bytes,
                                 fp_stream stream);
/* Fills `bytes` of context memory with byte `value` (poisoning, zeroing). */
FP_API fp_status fp_mem_fill(fp_context *ctx, void *dst, int value, size_t bytes, fp_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_CORE_H */
