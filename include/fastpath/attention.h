/*
 * libfastpath attention: softmax(Q K^T * scale + mask) V without materializing
 * the [seqlen_q x seqlen_k] score matrix (flash attention), prefill and
 * decode, with the materialized version as the baseline it is measured
 * against.
 *
 * What one call computes, for every batch b, query head h, query row i:
 *
 *     hk     = h / (heads_q / heads_kv)            (GQA / MQA head sharing)
 *     L      = seqlens_k ? seqlens_k[b] : seqlen_k (keys of this sequence)
 *     s_ij   = scale * dot(Q[b, i, h, :], K[b, j, hk, :])   for j < L
 *     keep j if  j <= i + (L - seqlen_q) + window_right   (window_right >= 0)
 *          and   j >= i + (L - seqlen_q) - window_left    (window_left >= 0)
 *     O[b, i, h, :] = sum_j softmax_j(s_ij) V[b, j, hk, :]   (over kept j)
 *     lse[b, h, i]  = log(sum_j exp(s_ij))                   (natural log)
 *
 * With cu_seqlens_q / cu_seqlens_k (varlen), L and seqlen_q above are the
 * sequence's own key and query counts.
 *
 * causal = 1 is window_right = 0: masks are aligned bottom-right, so the last
 * query row sees every key, as in FlashAttention >= 2.1 (flash_attn_func,
 * flash_attn_with_kvcache). PyTorch's scaled_dot_product_attention with
 * is_causal aligns top-left (j <= i) instead: the two agree only when
 * seqlen_q == seqlen_k (for seqlen_q > seqlen_k, top-left is causal = 0 with
 * window_right = seqlen_q - seqlen_k). A query row that keeps no key (e.g.
 * causal with seqlen_q > seqlen_k, its first rows) gets O = 0 and lse = -inf,
 * and so does a row whose kept scores are all -inf (torch's SDPA gives such
 * rows 0 too).
 *
 * Non-finite data propagates as in PyTorch: a NaN score (a NaN in Q or K,
 * inf * 0) or a +inf score among a row's kept keys makes that row's O and
 * lse NaN; a -inf score drops its key. Every implementation (CPU, baseline, each CUDA
 * kernel) follows this.
 *
 * API tiers
 *   fp_attention_forward          the op: flash attention on a CUDA context,
 *                                 a tiled online-softmax implementation on a
 *                                 CPU context
 *   fp_attention_forward_baseline the materialized version (scores in memory):
 *                                 cuBLAS GEMM, softmax kernel, cuBLAS GEMM on
 *                                 CUDA; a per-head score matrix on the CPU
 *   fp_attention_validate         baseline vs forward on your shapes, timed
 *                                 A/B by the timing engine with a numerical
 *                                 agreement check and a roofline figure
 *
 * Tensors
 *   Q [batch, seqlen_q, heads_q,  head_dim]   dtype
 *   K [batch, seqlen_k, heads_kv, head_dim]   dtype (or kv_dtype)
 *   V [batch, seqlen_k, heads_kv, head_dim]   dtype (or kv_dtype)
 *   O [batch, seqlen_q, heads_q,  head_dim]   dtype, bf16 for fp8 inputs (written)
 *   lse [batch, heads_q, seqlen_q]            f32, dense (optional, written)
 *   seqlens_k [batch]                         int32 (optional, read)
 *   cu_seqlens_q, cu_seqlens_k [batch + 1]    int32 (optional, read: varlen)
 *   block_table [batch, block_table_stride]   int32 (optional, read: paged KV
 *                                             cache; K and V are then pools
 *                                             [num_pages, page_size, heads_kv,
 *                                             head_dim], see the field)
 *   Every pointer is ctx memory (device memory on a CUDA context, host memory
 *   on a CPU context). Strides are in elements, per tensor, for the batch,
 *   sequence and head dimensions; head_dim is contiguous (stride 1). A stride
 *   of 0 selects the packed value of the layout above (head: head_dim, seq:
 *   heads * head_dim, batch: seqlen * heads * head_dim), so PyTorch views such
 *   as a slice of a fused QKV tensor or a (batch, heads, seq, dim) transpose
 *   are passed without copies by giving their strides.
 *
 * fp8 inputs (FlashAttention-3's fp8 forward)
 *   dtype FP_FP8_E4M3: Q, K and V hold e4m3 values (1 byte; core.h) whose
 *   real values are stored x q_descale / k_descale / v_descale (one float
 *   per tensor, fp_attention_params' 0.4 fields; 0 = 1). The scores use
 *   softmax_scale x q_descale x k_descale (lse is that of these real
 *   scores), O = softmax(...) V_stored x v_descale is written as bf16 (its
 *   strides in bf16 elements). On a CUDA context it runs on Hopper
 *   (compute capability 9.0, an sm_90a build) at head_dim 128 without
 *   cu_seqlens or block_table (else FP_ERR_UNSUPPORTED); on a CPU context
 *   every shape and option runs (values decoded exactly to f32). FP_FP8_E5M2
 *   is refused.
 *
 * fp8 KV cache (vLLM's kv_cache_dtype "fp8", e4m3)
 *   kv_dtype FP_FP8_E4M3 with dtype FP_F16, FP_BF16 or FP_F32 (0.5 field):
 *   K and V hold e4m3 values (real = stored x k_descale / v_descale), Q and
 *   O keep dtype, q_descale must be 0 or 1. Half the bytes of a 16-bit
 *   cache, which is what a decode step reads. On a CUDA context (f16 / bf16,
 *   head_dim 64, 128 or 256, compute capability 8.0 and up) the tensor-core
 *   kernel v1 runs it (the decode kernel v6 when preferred:
 *   FP_CTX_ATTENTION_KERNEL 6, calls of at most 64 packed query rows), dense
 *   or paged, split-KV included: each K / V tile lands in shared memory as
 *   e4m3 and is widened exactly to dtype there, so the products are dtype's
 *   (the e4m3 values are exact in f16 / bf16) and the error is the 16-bit
 *   path's; other head dims and f32 answer
 *   FP_ERR_UNSUPPORTED on CUDA. On Hopper (compute capability 9.0, sm_90a
 *   builds), a call whose context prefers a wgmma kernel
 *   (FP_CTX_ATTENTION_KERNEL 3, 4, 5, 8, 9 or 10), or with the environment
 *   variable FP_ATTN_KV8_WIDEN=1 any prefill-shaped call (a full 128-row
 *   query tile per batch and KV head), widens the cache first into a dense
 *   copy in dtype (one pass reading the e4m3 bytes once; paged and varlen
 *   caches included, varlen given total_k) and runs that kernel on the
 *   copy: O and lse bit-identical to the kernel on a 16-bit cache of the
 *   same values. The copy (2 x rows x heads_kv x head_dim elements of
 *   dtype; rows = batch x seqlen_k, or total_k) lives in the stream's
 *   workspace, grown once per shape class like the rest (so a first call
 *   must not be inside a capture), and is limited to FP_ATTN_KV8_WIDEN_MAX_MB
 *   (MiB, 1024 by default): a call needing more, f32 Q, other head dims,
 *   K / V strides that are not multiples of 16 bytes run v1
 *   (fp_attention_last_kernel says why). Opt-in until a GPU run has timed
 *   it against v1 (fastbench attention/kv8_prefill).
 *   On a CPU context every shape and option runs.
 *
 * Precision
 *   f16 / bf16: products on tensor cores with f32 accumulation, softmax in
 *   f32, P rounded to the input dtype before P V (as FlashAttention), O
 *   rounded once. Expect errors vs an exact result of the order of the
 *   materialized baseline's (which also rounds the scores), i.e. a few ulps of
 *   the dtype relative to max |V|.
 *   f32: accepted. On the GPU it runs a simple CUDA-core kernel (one warp per
 *   query row, f32 FMA, no tensor cores, several times slower than bf16 flash
 *   attention) whose error is that of f32 accumulation (~1e-6 relative).
 *   The CPU implementation converts every dtype to f32 on load and accumulates
 *   in f32.
 *   fp8 e4m3: the values are exact in f32; O is rounded once to bf16, so
 *   expect bf16's error relative to max |V| x v_descale.
 *
 * Supported shapes
 *   head_dim: a multiple of 8 in [8, 256]. On the GPU, f16/bf16 with head_dim
 *   32, 64, 96, 128 or 256 run the tensor-core flash kernel; other head dims
 *   (e.g. 80) and f32 run the simple CUDA-core kernel (correct, slower).
 *   batch, seqlen_q, seqlen_k, heads >= 1; heads_q a multiple of heads_kv.
 *
 * Thread-safety: every function is thread-safe for distinct contexts, and for
 * one CUDA context from several threads as long as outputs differ. A CPU
 * context's worker pool serializes concurrent calls. fp_attention_validate
 * times with the timing engine, which must not time two things at once on
 * one context: call it from one thread per context.
 */
#ifndef FASTPATH_ATTENTION_H
#define FASTPATH_ATTENTION_H

#include "fastpath/core.h"
#include "fastpath/timing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/*  Parameters                                                              */
/* ======================================================================== */

typedef struct fp_attention_params {
    size_t struct_size;      /* set by fp_attention_params_default */

    /* Shape */
    int batch;
    int seqlen_q;            /* 1..16 with a long seqlen_k is "decode" */
    int seqlen_k;            /* extent of K and V (max cache length) */
    int heads_q;
    int heads_kv;            /* heads_q % heads_kv == 0 */
    int head_dim;
    /* FP_F16, FP_BF16 or FP_F32 for Q, K, V and O; or FP_FP8_E4M3 for Q, K,
     * V (with the descales below), O then bf16 (see "fp8 inputs" above). */
    fp_dtype dtype;

    /* Tensors and their strides in elements (0 = packed, see the intro). */
    const void *q;
    int64_t q_batch_stride, q_seq_stride, q_head_stride;
    const void *k;
    int64_t k_batch_stride, k_seq_stride, k_head_stride;
    const void *v;
    int64_t v_batch_stride, v_seq_stride, v_head_stride;
    void *o;
    int64_t o_batch_stride, o_seq_stride, o_head_stride;

    /* Scores are scaled by softmax_scale (> 0); 0 selects 1/sqrt(head_dim). */
    float softmax_scale;
    /* 1: causal mask, bottom-right aligned (same as window_right = 0). */
    int causal;
    /* Sliding window in keys left / right of the (aligned) diagonal; -1 =
     * unbounded. With causal, window_right must be -1 or 0. */
    int window_left;
    int window_right;

    /* Optional f32 [batch, heads_q, seqlen_q] dense output: the log-sum-exp
     * of the scaled, masked scores (natural log), -inf for a row that keeps
     * no key. NULL: not computed. */
    float *lse;

    /* Optional int32 [batch]: keys actually present for each sequence (a KV
     * cache filled to different lengths; batched decode). Values are clamped
     * to [0, seqlen_k]; the masks align to each sequence's own length. NULL:
     * every sequence has seqlen_k keys. */
    const int32_t *seqlens_k;

    /* Optional int32 [batch + 1] offsets for variable-length packed batches
     * (both or neither; not with seqlens_k). Sequence b's queries are rows
     * cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of Q and O along the sequence
     * dimension, its keys rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1 of K
     * and V; the batch strides must then be 0 (unused). seqlen_q / seqlen_k
     * are the maximum lengths (a longer sequence is clipped to them), lse
     * keeps its [batch, heads_q, seqlen_q] layout with rows past a
     * sequence's length left unwritten. Offsets must be non-decreasing
     * (checked on a CPU context; on CUDA a decreasing pair reads as an empty
     * sequence). Strides are checked against the packed total
     * cu_seqlens[batch]; on a CUDA context, where the offsets are in device
     * memory, the sequence stride must be the outermost (largest) one (for K
     * and V, unless total_k is given), and offsets past the tensors' rows are
     * not detected: the kernels would access outside Q / O (and K / V, except
     * on the TMA kernels, which total_k bounds), as FlashAttention's varlen
     * kernels do. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;

    /* ---- Added in 0.2 (a struct_size from 0.1, ending at cu_seqlens_k, is
     * still accepted: the fields below then read as NULL / 0). ---- */

    /* Optional paged KV cache (the block tables of vLLM and FlashAttention's
     * flash_attn_with_kvcache). K and V are then pools of pages
     *     K, V [num_pages, page_size, heads_kv, head_dim]
     * whose batch stride is the page stride (0 = packed pages) and whose
     * sequence stride steps one key inside a page. Key j of sequence b lives
     * in page block_table[b * block_table_stride + j / page_size], row
     * j % page_size. seqlen_k is the longest sequence (keys), at most
     * block_table_stride * page_size; seqlens_k gives each sequence's own
     * length as without paging. Pages may be shared between sequences (a
     * common prefix) and appear in any order. Not with cu_seqlens.
     * The entries a sequence uses (the first ceil(L / page_size) of its row;
     * the rest may hold anything) must lie in [0, num_pages): checked on a CPU context
     * (FP_ERR_INVALID_ARGUMENT, nothing written); on a CUDA context the table
     * is device memory and is not read back: an entry out of range reads its
     * keys and values as zeros (never outside the pools) and the result of
     * that sequence is unspecified. NULL block_table: K and V are dense. */
    const int32_t *block_table;  /* int32 [batch, block_table_stride] */
    int block_table_stride;      /* entries per sequence, >= ceil(seqlen_k / page_size) */
    int page_size;               /* keys per page, >= 1 (any value; 16..256 typical) */
    int num_pages;               /* pages in the K and V pools, >= 1 */

    /* ---- Added in 0.3 (a struct_size from 0.1 or 0.2 is still accepted:
     * the field below then reads as 0). ---- */

    /* Optional, with cu_seqlens only: the rows of K and V along their packed
     * sequence dimension, flash_attn_varlen_func's total_k (K, V [total_k,
     * heads_kv, head_dim]). At least cu_seqlens_k[batch]; more (the rows
     * allocated: a fixed capacity) is fine. 0: not given.
     * On a CUDA context the offsets are in device memory, so without it the
     * library does not know where K and V end. With it:
     *   - Hopper's TMA kernels (v5 at head_dim 128, v8 at 64) take varlen
     *     calls: they describe K and V to the hardware as tensor maps, which
     *     need that extent (without it varlen runs v3, their cp.async form);
     *   - K's and V's strides are checked against it (without it the
     *     sequence stride must be the outermost).
     * Too small a value is FP_ERR_INVALID_ARGUMENT on a CPU context (the
     * offsets are host memory there). On a CUDA context it cannot be
     * checked: keys at or past row total_k read as zeros on the TMA kernels
     * (never a read outside [0, total_k)) and that sequence's result is
     * unspecified. */
    int64_t total_k;

    /* ---- Added in 0.4 (a struct_size from 0.1 to 0.3 is still accepted:
     * the fields below then read as 0). ---- */

    /* Per-tensor descales of fp8 inputs (FlashAttention-3's descale_q /
     * descale_k / descale_v): with dtype FP_FP8_E4M3 the real value of a
     * stored element of Q is stored x q_descale (K: k_descale, V:
     * v_descale). 0 means 1; otherwise finite and > 0. With any other dtype
     * each must be 0 or 1 (FP_ERR_INVALID_ARGUMENT otherwise). */
    float q_descale, k_descale, v_descale;

    /* ---- Added in 0.5 (a struct_size from 0.1 to 0.4 is still accepted:
     * the field below then reads as 0). ---- */

    /* 0.4's tail padding, named so that no 0.5 field lies inside a 0.4
     * caller's struct_size; never read. */
    int reserved_0_4;

    /* K's and V's dtype when it differs from Q's: FP_FP8_E4M3 with dtype
     * FP_F16 / FP_BF16 / FP_F32 is an fp8 KV cache (see "fp8 KV cache"
     * above; k_descale / v_descale apply, O has dtype). 0 (what a zeroed or
     * older struct holds) or dtype itself: K and V have dtype. Any other
     * value is FP_ERR_INVALID_ARGUMENT. */
    fp_dtype kv_dtype;
} fp_attention_params;

/* Zeroes the first struct_size bytes of p and sets struct_size, dtype =
 * FP_BF16, softmax_scale = 0 (default scale), causal = 0, window_left =
 * window_right = -1. struct_size is sizeof(fp_attention_params) of the
 * caller's header: from 0.1's up to this library's (core.h, "Versioned
 * structs"). Errors: FP_ERR_INVALID_ARGUMENT for a NULL p or another size
 * (nothing written). Call it through fp_attention_params_default. */
FP_API fp_status fp_attention_params_init(fp_attention_params *p, size_t struct_size);

/* Zeroes p and sets struct_size, dtype = FP_BF16, softmax_scale = 0 (default
 * scale), causal = 0, window_left = window_right = -1. The caller then sets
 * the shape and pointers.
 * A macro: fp_attention_params_init(p, sizeof *p), so a library never writes
 * more than the caller's struct holds. The exported function of this name is
 * what programs built against 0.1 call: it writes the 0.1 layout only. */
FP_API void(fp_attention_params_default)(fp_attention_params *p);
#define fp_attention_params_default(p) ((void)fp_attention_params_init((p), sizeof *(p)))

/* ======================================================================== */
/*  The op                                                                  */
/* ======================================================================== */

/* Computes O (and lse if requested) as described above, enqueued on `stream`
 * (CUDA; NULL = the context's default stream) or run before returning (CPU).
 *
 * On a CUDA context, f16/bf16 with head_dim 32, 64, 96, 128, 256 run the flash
 * kernel
 * (tensor-core mma.sync, cp.async double buffering, online softmax in
 * registers). On Hopper (compute capability 9.0, in a build with 90 among
 * CMAKE_CUDA_ARCHITECTURES), head_dim 64 / 128 with at least 128 query rows
 * per (batch, KV head) (seqlen_q x heads_q / heads_kv) run the wgmma kernel
 * fed by TMA loads instead (v5 at head_dim 128, v10 at 64: three consumer
 * warpgroups over 192-row query tiles; v3, their cp.async form, where TMA
 * cannot describe the K / V layout or with varlen offsets but no total_k):
 * 2.3-3.6x faster than v1 on an H200 at seqlen 4k-16k, v10 1.06-1.40x
 * faster than v8 (v5 with its two consumer warpgroups taking turns) at
 * head_dim 64 (H200), varlen calls given total_k 1.04-1.74x faster than
 * without it (v3). A paged KV cache (block_table) whose page_size is a
 * multiple of 8 runs the same TMA kernel (a tile of 128 keys loads as
 * boxes of gcd(page_size, 128) rows, each from its page): 2.45-4.65x
 * faster than v1's page gather on an H200, 0.87-1.04x the dense cache;
 * other page sizes, and decode, run v1. A context may prefer v5, v8, v9
 * or v10 (FP_CTX_ATTENTION_KERNEL, core.h) on these calls.
 * fp_attention_last_kernel says which ran. When the grid would not fill the GPU (decode: small seqlen_q,
 * few heads, long seqlen_k) the keys are split over several thread blocks
 * whose partial results are merged through their log-sum-exp (split-KV).
 * With the default kernel (v1) the merge happens inside the split kernel:
 * the last thread block of each query tile to finish merges the tile, so a
 * decode call is one kernel launch (one launch's host time, about 3 to 4 us
 * on an H100, less than with a separate combine kernel:
 * FP_CTX_ATTENTION_SPLIT_COMBINE in core.h chooses; v3 to v5 always use
 * the separate kernel). The partials and the arrival counters live in the
 * context's workspace of the call's stream (below).
 *
 * Errors (nothing is written):
 *   FP_ERR_INVALID_ARGUMENT: NULL ctx / params / q / k / v / o; struct_size
 *     mismatch; batch, seqlen_q, seqlen_k, heads <= 0; heads_q not a multiple
 *     of heads_kv; head_dim not a multiple of 8 in [8, 256]; an unknown dtype;
 *     FP_FP8_E5M2; kv_dtype other than 0, dtype or FP_FP8_E4M3 (with
 *     dtype f16 / bf16 / f32); softmax_scale < 0 or not finite; a descale
 *     negative, not finite, or (not fp8) other than 0 / 1 (with an fp8 KV
 *     cache: q_descale 0 / 1); softmax_scale x q_descale x
 *     k_descale not a finite float > 0; window_left / window_right < -1, or
 *     window_right > 0 with causal; only one of cu_seqlens_q / _k given, or
 *     them with seqlens_k or non-zero batch strides, or (CPU) decreasing
 *     offsets / a sequence longer than seqlen_q / seqlen_k; negative strides
 *     or strides under which
 *     two rows of a tensor overlap; pointers not aligned to the element size
 *     (CPU) or to 16 bytes, with row strides not multiples of 16 bytes (CUDA;
 *     16 elements of fp8 Q / K / V, 8 of their bf16 O);
 *     block_table with page_size, num_pages or block_table_stride out of
 *     range, with cu_seqlens, or (CPU) with an entry outside [0, num_pages);
 *     total_k < 0, without cu_seqlens, or (CPU) below cu_seqlens_k[batch].
 *     The message names the argument.
 *   FP_ERR_OUT_OF_MEMORY: scratch for split-KV partials or CPU tiles.
 *   FP_ERR_UNSUPPORTED: fp8 inputs on a CUDA context other than Hopper at
 *     head_dim 128 without cu_seqlens / block_table; also when the stream
 *     is being captured and its workspace is too small for the split
 *     partials (run the call once on that stream first).
 *   FP_ERR_CUDA: a launch failed.
 * CUDA graphs: capturable. Scratch (split partials and counters; the baseline's scores)
 * lives in the context's workspace of the call's stream, grown on first
 * need and kept: once a call ran on a stream at a shape, the same call there
 * makes no allocation, synchronization or device query. A graph captured
 * on a stream uses that stream's workspace: replay it on that stream, or
 * not while calls on that stream run.
 * Thread-safety: see the header introduction. */
FP_API fp_status fp_attention_forward(fp_context *ctx, fp_stream stream,
                                      const fp_attention_params *params);

/* The materialized baseline, same contract and result (to rounding) as
 * fp_attention_forward: scores for every (batch, head) are written to a
 * scratch buffer of batch * heads_q * seqlen_q * seqlen_k elements of dtype
 * (f32 on the CPU), softmax-ed in place, then multiplied by V. On CUDA the two
 * products are cuBLAS strided-batched GEMMs with f32 compute (scores rounded
 * to dtype, as PyTorch's math path) on the context's cuBLAS handle (created
 * on first use, destroyed with the context; calls from several threads on
 * one context take turns on it).
 * With cu_seqlens or seqlens_k on CUDA it reads them back to size its GEMMs
 * (a stream synchronization: it is a baseline; during a stream capture it
 * refuses with FP_ERR_UNSUPPORTED). With a paged KV cache on
 * CUDA it first gathers the pages into dense K and V scratch tensors (2 x
 * batch * seqlen_k * heads_kv * head_dim elements more), then runs as dense.
 * fp8 inputs (FP_FP8_E4M3) run on a CPU context (the CPU version decodes
 * them to f32); on a CUDA context they are FP_ERR_UNSUPPORTED (cuBLAS runs
 * the baseline in bf16 / f16 / f32), nothing written.
 * Errors: as fp_attention_forward, plus FP_ERR_OUT_OF_MEMORY when the score
 * buffer (it grows as seqlen_q * seqlen_k) or the gathered K / V do not fit,
 * FP_ERR_CUBLAS. */
FP_API fp_status fp_attention_forward_baseline(fp_context *ctx, fp_stream stream,
                                               const fp_attention_params *params);

/* ======================================================================== */
/*  Which kernel ran                                                        */
/* ======================================================================== */

/* What the calling thread's last fp_attention_forward on a CUDA context
 * launched: a preferred version (FP_CTX_ATTENTION_KERNEL) that does not
 * support the call runs the default kernel instead, and this says so and
 * why. Per thread, so that concurrent callers each read their own; the
 * internal numbered-version entry points the tests and fastbench use record
 * here too. */
typedef struct fp_attention_kernel_info {
    /* "flash_v1" .. "flash_v10", "rowwise" (the CUDA-core kernel: f32 or a
     * head_dim without a flash kernel), "cpu" (a CPU context), or "none"
     * (nothing ran on this thread yet, or the last call failed before a
     * launch). A static string. */
    const char *kernel;
    int version;       /* 1..10 for flash_v1..v10, 0 otherwise */
    int num_splits;    /* KV splits: > 1 means split partials, merged in the split kernel (v1 / v2,
                          FP_CTX_ATTENTION_SPLIT_COMBINE 0) or by the combine kernel */
    int paged;         /* 1: K / V read through a block table */
    int preferred;     /* the context's FP_CTX_ATTENTION_KERNEL at the call (0: none) */
    /* Why `preferred` did not run ("" when it ran or none was preferred). */
    char fallback[256];
} fp_attention_kernel_info;

/* Copies the calling thread's record into *info. Errors:
 * FP_ERR_INVALID_ARGUMENT for a NULL info. */
FP_API fp_status fp_attention_last_kernel(fp_attention_kernel_info *info);

/* ======================================================================== */
/*  Validation: run it on your own shapes                                   */
/* ======================================================================== */

/* Runs the baseline and fp_attention_forward on params' inputs through
 * fp_ab_run: both outputs go to packed scratch buffers (params->o and
 * params->lse are not written), are compared with the default tolerance of
 * O's dtype (bf16 for fp8 inputs: both sides decode the same e4m3 values
 * and round O to bf16), then both are timed interleaved. FLOPs declared:
 * 4 * batch * heads_q * seqlen_q * seqlen_k * head_dim, halved with causal,
 * on tensor cores; bytes: Q, K, V read and O written once (fp8: 1 byte per
 * element of Q, K, V and 2 per element of O). fp8 inputs on a CUDA context:
 * FP_ERR_UNSUPPORTED (no baseline there), nothing run.
 * cfg NULL = timing defaults. FP_OK means the measurement ran: read
 * report->agreement.passed for the numerical verdict.
 * Errors: those of the two implementations (FP_ERR_OUT_OF_MEMORY when the
 * baseline's score matrix does not fit: nothing is timed), FP_ERR_INVALID_ARGUMENT
 * for a NULL report. */
FP_API fp_status fp_attention_validate(fp_context *ctx, fp_stream stream,
                                       const fp_attention_params *params,
                                       const fp_timing_config *cfg, fp_ab_report *report);

/* FLOPs counted for params (the formula above); 0 for NULL. Pure. */
FP_API double fp_attention_flops(const fp_attention_params *params);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_ATTENTION_H */
