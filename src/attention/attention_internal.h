/* Attention internals shared by the host code (src/attention) and the CUDA
 * launchers (kernels/attention): the checked, normalized arguments every
 * implementation takes, the mask rule, and the launchers. Not installed. */
#ifndef FP_ATTENTION_INTERNAL_H
#define FP_ATTENTION_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "fastpath/attention.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arguments after checking: strides resolved (no 0 = packed left), causal
 * folded into window_right, the scale resolved. Strides in elements. */
typedef struct fp_attn_args {
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    int group;                        /* heads_q / heads_kv */
    fp_dtype dtype;                   /* Q (and K, V unless kv_dtype says otherwise) */
    fp_dtype kv_dtype;                /* K, V: dtype, or FP_FP8_E4M3 (an fp8 KV cache with
                                       * 16-bit / f32 Q: kv_fp8_cache below) */
    fp_dtype o_dtype;                 /* O: dtype, or FP_BF16 for FP_FP8_E4M3 inputs */
    float o_scale;                    /* O is multiplied by this (v_descale; 1 unless fp8) */
    const void *q, *k, *v;
    void *o;
    int64_t q_bs, q_ss, q_hs;
    int64_t k_bs, k_ss, k_hs;
    int64_t v_bs, v_ss, v_hs;
    int64_t o_bs, o_ss, o_hs;
    float scale;                      /* > 0: softmax_scale x q_descale x k_descale */
    int kv_fp8_cache;                 /* 1: K, V e4m3 with Q / O in dtype (f16 / bf16 / f32);
                                       * o_scale is then v_descale, scale includes k_descale */
    int window_left, window_right;    /* -1 = unbounded; causal -> right = 0 */
    float *lse;                       /* [batch, heads_q, seqlen_q] or NULL */
    const int32_t *seqlens_k;         /* [batch] or NULL */
    const int32_t *cu_q, *cu_k;       /* [batch + 1] varlen offsets, or NULL */
    int64_t total_k;                  /* varlen: rows of K / V along the packed sequence
                                       * dimension (fp_attention_params.total_k), 0 not given */
    /* Paged KV (block_table != NULL): k_bs / v_bs are the page strides. */
    const int32_t *block_table;       /* [batch, bt_stride] or NULL */
    int bt_stride, page_size, num_pages;
    /* The context, for its per-stream workspace (fp_ctx_scratch_get); NULL
     * (kernel-level tests): scratch is allocated stream-ordered per call. */
    fp_context *ctx;
    /* The call's span under the kernel timer (span_stamp.h; rec NULL: not
     * stamped): fp_attention_forward fills it, every kernel of the flash
     * and row-wise paths stamps it (the baseline's cuBLAS GEMMs cannot: its
     * span keeps events). */
    fp_span_stamp stamp;
} fp_attn_args;

/* Keys kept by query row i of a sequence with sq queries and L keys: [lo,
 * hi] (inclusive; empty when lo > hi). The one definition of the mask, used
 * by every CPU implementation (the kernels share
 * kernels/attention/attention_flash_layout.h's row_keys, the same rule). */
static inline void fp_attn_row_range(const fp_attn_args *a, int sq, int L, int i, int *lo, int *hi) {
    int64_t diag = (int64_t)i + L - sq; /* bottom-right aligned */
    int64_t l = 0, h = (int64_t)L - 1;
    if (a->window_left >= 0 && diag - a->window_left > l) l = diag - a->window_left;
    if (a->window_right >= 0 && diag + a->window_right < h) h = diag + a->window_right;
    if (l > h) { l = 0; h = -1; }
    *lo = (int)l;
    *hi = (int)h;
}

/* Sequence b: its query and key counts and the element offsets of its row 0
 * in Q, K, V, O (batch strides, or the varlen offsets). */
typedef struct fp_attn_seq {
    int sq, L;
    int64_t q0, k0, v0, o0;
} fp_attn_seq;

static inline int fp_attn_clamp(int64_t x, int hi) { return x < 0 ? 0 : (x > hi ? hi : (int)x); }

/* Host memory for seqlens_k / cu_seqlens (CPU implementations). */
static inline fp_attn_seq fp_attn_seq_host(const fp_attn_args *a, int b) {
    fp_attn_seq s;
    if (a->cu_q) {
        s.sq = fp_attn_clamp((int64_t)a->cu_q[b + 1] - a->cu_q[b], a->seqlen_q);
        s.L = fp_attn_clamp((int64_t)a->cu_k[b + 1] - a->cu_k[b], a->seqlen_k);
        s.q0 = (int64_t)a->cu_q[b] * a->q_ss;
        s.o0 = (int64_t)a->cu_q[b] * a->o_ss;
        s.k0 = (int64_t)a->cu_k[b] * a->k_ss;
        s.v0 = (int64_t)a->cu_k[b] * a->v_ss;
    } else {
        s.sq = a->seqlen_q;
        s.L = a->seqlens_k ? fp_attn_clamp(a->seqlens_k[b], a->seqlen_k) : a->seqlen_k;
        s.q0 = b * a->q_bs;
        s.o0 = b * a->o_bs;
        s.k0 = a->block_table ? 0 : b * a->k_bs; /* paged: see fp_attn_kv_row */
        s.v0 = a->block_table ? 0 : b * a->v_bs;
    }
    return s;
}

/* Element offset of key row j of sequence b in K (pass k0, k_ss, k_bs) or V
 * (v0, v_ss, v_bs), before the head offset: seq0 + j * ss when dense; with a
 * paged cache (host block table) page * page_stride + (j % page_size) * ss,
 * an entry out of range reading as page 0 (the CPU check refuses such tables
 * before any implementation runs). */
static inline int64_t fp_attn_kv_row(const fp_attn_args *a, int b, int64_t seq0, int j, int64_t ss,
                                     int64_t page_stride) {
    if (!a->block_table) return seq0 + (int64_t)j * ss;
    int32_t pg = a->block_table[(int64_t)b * a->bt_stride + j / a->page_size];
    if (pg < 0 || pg >= a->num_pages) pg = 0;
    return (int64_t)pg * page_stride + (int64_t)(j % a->page_size) * ss;
}

/* Copies a caller's params (struct_size of this or an older version, read
 * only up to its struct_size) into a current one, missing fields zero.
 * Call after fp_attn_check accepted `user`. */
void fp_attn_params_upgrade(const fp_attention_params *user, fp_attention_params *full);
/* Checks params and fills args. `cuda` selects the GPU alignment rules. */
/* Bytes an attention call moves at least (Q, O, K, V once each): the
 * roofline's figure (fp_attention_validate) and the op's span (trace.h). */
double fp_attn_bytes(const fp_attn_args *a);
fp_status fp_attn_check(const fp_attention_params *p, int cuda, fp_attn_args *out);

/* ---- CPU implementations (host memory) ---- */
/* The CPU fast path: fp_attn_cpu_flash_blas when the library was built with
 * BLIS (FP_HAVE_BLIS), else fp_attn_cpu_tiled_portable. */
fp_status fp_attn_cpu_tiled(fp_thread_pool *pool, const fp_attn_args *a);
/* Flash attention with BLIS tile GEMMs (attention_cpu_flash.c): tasks =
 * (batch, kv head, 128 GQA-packed query rows), keys in tiles of 512.
 * FP_ERR_UNSUPPORTED in a build without BLIS. */
fp_status fp_attn_cpu_flash_blas(fp_thread_pool *pool, const fp_attn_args *a);
/* 1 if this build has fp_attn_cpu_flash_blas. */
int fp_attn_cpu_have_blas(void);
/* The portable version (no dependency): scalar loops over (batch, kv head,
 * 32 GQA-packed rows) x 64-key tiles. */
fp_status fp_attn_cpu_tiled_portable(fp_thread_pool *pool, const fp_attn_args *a);
/* Materialized: one [seqlen_q x seqlen_k] f32 score matrix per (batch,
 * head): fp_attn_cpu_naive_blas when built with BLIS, else the portable one. */
fp_status fp_attn_cpu_naive(fp_thread_pool *pool, const fp_attn_args *a);
fp_status fp_attn_cpu_naive_portable(fp_thread_pool *pool, const fp_attn_args *a);
/* Its two GEMMs on BLIS (FP_ERR_UNSUPPORTED in a build without BLIS). */
fp_status fp_attn_cpu_naive_blas(fp_thread_pool *pool, const fp_attn_args *a);
/* The oracle: double accumulation, two-pass softmax. Writes o_ref packed
 * [batch, seqlen_q, heads_q, head_dim] (times a->o_scale) and lse_ref
 * [batch, heads_q, seqlen_q] (either may be NULL); ignores a->o and a->lse.
 * pool may be NULL. */
fp_status fp_attn_reference(fp_thread_pool *pool, const fp_attn_args *a, double *o_ref,
                            double *lse_ref);

/* ---- CPU helpers shared by the implementations ---- */
/* Scratch for CPU tasks: the pool's callbacks cannot fail and nothing may
 * be written on error, so all of it is allocated before any task runs, one
 * slice of `per` floats per chunk of tasks. */
typedef struct fp_attn_cpu_job {
    const fp_attn_args *a;
    float *scratch;      /* nchunks slices of `per` floats */
    size_t per, nchunks, ntasks;
    int simd;            /* fp_attn_simd_available(), read once per call */
} fp_attn_cpu_job;
/* Allocates J->nchunks slices of J->per floats (FP_ERR_OUT_OF_MEMORY naming
 * `what`, nothing allocated, on failure or overflow). */
fp_status fp_attn_job_alloc(fp_attn_cpu_job *J, const char *what);
/* First task of chunk c (balanced split of ntasks over nchunks). */
size_t fp_attn_chunk_begin(const fp_attn_cpu_job *J, size_t c);
/* Chunks for ntasks tasks: per_thread per pool thread, at most ntasks. */
size_t fp_attn_job_chunks(fp_thread_pool *pool, size_t ntasks, size_t per_thread);
/* The materialized baselines' driver: heads(a, mem, begin, end) for the
 * (batch, query head) tasks [begin, end), over one chunk per pool thread,
 * each with `per` floats of scratch (0: the size overflowed). */
typedef void (*fp_attn_heads_fn)(const fp_attn_args *a, float *mem, size_t begin, size_t end);
fp_status fp_attn_run_per_head(fp_thread_pool *pool, const fp_attn_args *a, size_t per, fp_attn_heads_fn heads);

/* Elementwise kernels (attention_cpu_simd.c): `simd` = 1 selects the AVX2
 * versions, only valid where fp_attn_simd_available() said 1. */
int fp_attn_simd_available(void);
/* Stores n f32 values to element offset off of base in dtype dt (rounded
 * to nearest even). */
void fp_attn_store_row(void *base, int64_t off, fp_dtype dt, int n, const float *src);
/* Row `row` (head_dim floats, scaled in place) as O's: multiplied by
 * a->o_scale where that is not 1, stored at element offset off of a->o in
 * a->o_dtype. Every CPU implementation stores O through it. */
void fp_attn_store_o(const fp_attn_args *a, int64_t off, float *row);
/* n elements at element offset off of base (dtype dt: f32, f16, bf16 or
 * fp8 e4m3) to f32. */
void fp_attn_cvt_row(const void *base, int64_t off, fp_dtype dt, int n, float *dst);
/* max of s[0..n) (-inf when n = 0). */
float fp_attn_row_max(const float *s, int n, int simd);
/* s[j] = 2^(s[j] - mx) for s[j] <= mx (exactly 0 for s[j] - mx < -127,
 * -inf included; relative error below 4e-7 otherwise); returns the sum. */
float fp_attn_exp2_sum(float *s, int n, float mx, int simd);

/* ---- Which kernel ran (src/attention/attention_kernel_info.c) ---- */
/* Starts the calling thread's record of one call (kernel "none"). */
void fp_attn_note_begin(int preferred);
/* A launch of flash version 1..10 with num_splits KV splits succeeded
 * (version 0: the row-wise kernel; -1: the CPU implementation). */
void fp_attn_note_kernel(const fp_attn_args *a, int version, int num_splits);
/* The preferred version was refused: why (copied, truncated). */
void fp_attn_note_fallback(const char *why);

/* ---- CUDA launchers (kernels/attention) ---- */
/* 1 if the tensor-core flash kernel handles this dtype / head_dim (fp8
 * e4m3: head_dim 128, on Hopper only: fp_attn_cuda_flash). */
int fp_attn_cuda_flash_supported(fp_dtype dtype, int head_dim);
/* 1 if the flash kernel v1 takes an fp8 KV cache (kv_fp8_cache, f16 / bf16
 * Q) at this head_dim. */
int fp_attn_cuda_flash_kv8_supported(int head_dim);
/* Flash attention: picks the number of KV splits from the grid size and
 * sm_count, the partials in a->ctx's workspace when splitting. version 0: the
 * default (v5 at head_dim 128, v8 at 64, else v3, on Hopper (cc 90, the
 * device's compute capability x 10) in an sm_90a build for head_dim 64 / 128
 * with >= 128 query rows per (batch, KV head) and no paged KV; v1
 * otherwise: paged calls reach v5 / v8 / v10 only as a preferred version
 * until a GPU run has timed them); 1: v1; 2..10: that version where it
 * supports the call (dtype,
 * head_dim, layout, build, device), else the default choice, with the
 * reason noted (fp_attention_last_kernel). fp8 (e4m3) inputs: v5, or v8
 * when preferred, at one split, on a 9.0 device in an sm_90a build; any
 * refusal is returned (no other kernel takes fp8). */
fp_status fp_attn_cuda_flash(const fp_attn_args *a, int version, int sm_count, int cc, cudaStream_t stream);
/* Same with an explicit split count (>= 1; tests force split-KV with it). */
fp_status fp_attn_cuda_flash_splits(const fp_attn_args *a, int num_splits, cudaStream_t stream);
/* v2 with its earlier 128 x 32 tile at head_dim 128 (the A/B of fastbench
 * attention/flash_versions against the 128 x 64 tile v2 has there since
 * session 29); recorded as v2. Only fp_attn_cuda_flash_version takes it. */
#define FP_ATTN_V2_NARROW 102
/* v5 with FlashAttention-3's 128 x 176 tile at head_dim 128 (16-bit types,
 * dense or varlen K / V, sm_90a builds on 9.0 devices; the A/B of fastbench
 * attention/flash_versions against v5's 128 x 128 tile, session 30);
 * recorded as v5. Only fp_attn_cuda_flash_version takes it; with
 * FP_ATTN_V5_TILE=128x176 in the environment every v5 call it supports runs
 * it. */
#define FP_ATTN_V5_WIDE 105
/* OR'd into version 5, 8, 9, 10 or FP_ATTN_V5_WIDE given to
 * fp_attn_cuda_flash_version: O leaves through shared memory and TMA stores
 * (FlashAttention-3's epilogue, session 32) where that applies (f16 / bf16,
 * one split, dense Q / O, a GQA group dividing 64, an O layout TMA can
 * describe), else through each thread's stores as without it; recorded as
 * the version alone. FP_ATTN_O_STORE=tma in the environment does the same
 * for every call of those versions. The A/B of fastbench
 * attention/flash_versions rows v5_vs_v5o / v8_vs_v8o / v9_vs_v9o; other
 * versions refuse it (FP_ERR_INVALID_ARGUMENT). */
#define FP_ATTN_O_TMA 0x100
/* OR'd into version 9 (with or without FP_ATTN_O_TMA) given to
 * fp_attn_cuda_flash_version: each persistent CTA draws its next item's
 * ticket when it starts an item (session 19's rule) instead of a few key
 * tiles before the item's end (fp_tma::draw_tile, FP_ATTN_V9_LEAD tiles,
 * default fp_tma::kV9Lead): the A/B of fastbench attention/flash_versions
 * row v9e_vs_v9; the same outputs. Other versions refuse it
 * (FP_ERR_INVALID_ARGUMENT). */
#define FP_ATTN_V9_EARLY 0x200
/* A numbered version of the flash kernel (1 = the default, 2 = two 16-row
 * blocks per warp, head_dim 64 / 128, 3 = Hopper wgmma kernel, 4 = the same
 * with its other schedule (pipelined <-> plain), 5 = Hopper TMA + mbarrier
 * pipeline (varlen only given total_k), 6 = the decode kernel, 7 = v1 over 8 warps,
 * 8 = v5 with ping-pong consumer warpgroups, 9 = v8 in persistent CTAs,
 * 10 = v8 with three consumer warpgroups, head_dim 64 only
 * (3-5, 8-10: sm_90a builds on compute
 * capability 9.0 devices only, head_dim 64 / 128, paged KV only on 5, 8
 * and 10 with page sizes that are multiples of 8, else
 * FP_ERR_UNSUPPORTED; v5 (v8 at head_dim 64) / v3 are the Hopper default: fp_attn_cuda_flash)
 * with an explicit split count. */
fp_status fp_attn_cuda_flash_version(const fp_attn_args *a, int version, int num_splits, cudaStream_t stream);
/* Versions 3, 4, 5, 8, 9 and 10 (kernels/attention/attention_flash_sm90.cu; built only
 * when 90 is among CMAKE_CUDA_ARCHITECTURES, which defines
 * FASTPATH_HAVE_SM90A). */
fp_status fp_attn_cuda_flash_sm90(const fp_attn_args *a, int version, int num_splits, cudaStream_t stream);
/* Versions 5, 8, 9 and 10 (kernels/attention/attention_flash_tma_sm90.cu,
 * sm_90a builds: TMA producer + mbarrier ring; 8 = 5 with its consumer
 * warpgroups taking turns (ping-pong); 9 = 8 in persistent CTAs (one per
 * SM, items drawn by tickets over a causal-aware order); 10 = 8 with three
 * consumer warpgroups (192-row query tiles, head_dim 64 only); varlen only
 * given total_k (one tensor map over the packed K / V); paged KV (not 9)
 * with page sizes that are multiples of 8 (one map over the page pool,
 * a tile loaded as boxes of gcd(page_size, 128) rows, each from its page);
 * reached through fp_attn_cuda_flash_sm90(a, 5, 8, 9 or 10, ...)). */
fp_status fp_attn_cuda_flash_v5(const fp_attn_args *a, int version, int num_splits, cudaStream_t stream);
/* ---- The CTA timeline (fastbench attention/decode_anatomy, prefill_anatomy)
 * Where a kernel's time goes between its CTAs: each CTA of a traced launch
 * writes one record, one of its threads reading the GPU's global timer
 * (%globaltimer, nanoseconds, the same clock on every SM; its resolution is
 * the GPU's, 32 ns to 1 us) at fixed points of the kernel. Kernels that
 * record: v1, v2, v7 (flash_fwd_body) and the decode kernel v6, with their
 * fused split combine; the Hopper kernels v5 / v8 / v10 (and v5's wide tile)
 * per CTA, v9 per item (record t: ticket t, whichever persistent CTA ran
 * it). A mark not reached stays 0. */
enum {
    FP_CTA_START = 0,  /* the CTA begins (after the PDL wait; v9: the item's Q is about to be published) */
    FP_CTA_LANDED = 1, /* Q and the first K tile are in shared memory (v9: not marked) */
    FP_CTA_LOOP = 2,   /* the KV loop is done (thread 0's warp; Hopper: the first consumer warpgroup's) */
    FP_CTA_STORED = 3, /* split calls of v1 / v2 / v7 / v6: the CTA's partials are stored (before its arrival) */
    FP_CTA_END = 4,    /* every thread is done, the merge included (Hopper: each consumer warpgroup's epilogue) */
    FP_CTA_MARKS = 5
};
#define FP_CTA_MERGED 1u /* flags: this CTA was its tile's last and merged the splits */
typedef struct fp_cta_record {
    uint64_t t_ns[FP_CTA_MARKS]; /* %globaltimer at each mark, 0: not reached */
    uint32_t cta;                /* x + gx (y + gy z) of the grid (z counting from batch 0) */
    uint32_t smid;               /* the SM it ran on (%smid) */
    uint32_t flags;              /* FP_CTA_MERGED */
    uint32_t tiles;              /* key tiles its KV loop ran (written with FP_CTA_LOOP) */
} fp_cta_record;                 /* 56 bytes */
/* The fused split combine's staged merge (split_combine_fused in
 * kernels/attention/attention_flash.cu: the merging CTA copies the splits'
 * partials into shared memory, one L2 round trip for all): 1 on, 0 off, -1
 * as the environment says (FP_ATTN_MERGE_STAGE=1: on; else off, the merge
 * before session 44). Process-wide, read by each launch: the tests and
 * fastbench's interleaved A/B switch it between calls. */
void fp_attn_merge_stage_set(int on);
int fp_attn_merge_stage(void);

/* Sets the calling thread's trace: while records != NULL, each launch of a
 * recording kernel from this thread whose grid has at most `capacity` CTAs
 * (v9: items; one launch: batch <= 65535) writes records[cta] (device
 * memory, which the caller zeroes first); a larger grid records nothing.
 * NULL (or capacity 0) stops it. */
void fp_attn_cuda_cta_trace_set(fp_cta_record *records, int64_t capacity);
/* Records of the calling thread's last launch that recorded (its CTAs; v9:
 * its items; 0: none did since the trace was set), and resets it to 0. */
int64_t fp_attn_cuda_cta_trace_take(void);
/* The launchers' side: the calling thread's records and capacity (NULL when
 * not set), and the CTAs of a launch that records into them. */
fp_cta_record *fp_attn_cuda_cta_trace_get(int64_t *capacity);
void fp_attn_cuda_cta_trace_note(int64_t ctas);

/* The summary of one traced launch (fp_attn_cta_anatomy); times in
 * microseconds, from the records of the CTAs that started. */
typedef struct fp_cta_anatomy {
    int64_t ctas;          /* records with a start */
    int64_t sms;           /* distinct SMs among them */
    int64_t merged;        /* CTAs that merged a tile's splits */
    double span_us;        /* first start -> last end: the kernel as its CTAs saw it */
    double start_skew_us;  /* first start -> last start */
    double landed_p50_us;  /* start -> Q and the first K tile landed, median over CTAs */
    double landed_max_us;
    double loop_p50_us;    /* landed -> the KV loop done, median over CTAs */
    double loop_max_us;
    double store_max_us;   /* loop done -> partials stored, max (split calls) */
    double epilogue_p50_us; /* loop done -> end (O or the partials stored, the merge), median over CTAs */
    double merge_max_us;   /* the merging CTAs: stored -> end, max */
    double end_p50_us;     /* first start -> a CTA's end, median over CTAs */
    double tail_us;        /* the median CTA's end -> the last end */
    /* The loop's rate: */
    int64_t tiles;         /* key tiles over all records (fp_cta_record.tiles) */
    double tile_ns_p50;    /* a record's loop (landed, or its start where it has no landed mark, to
                            * the loop done) over its tiles, median over the records with tiles */
    /* Where the SMs' time goes over the span (first start -> last end),
     * summed over the SMs that ran a record (these four add up to 100): */
    double busy_pct;       /* inside an SM's records (their union: two CTAs on one SM count once) */
    double head_pct;       /* before an SM's first record starts (launch ramp, start skew) */
    double gap_pct;        /* between an SM's records (a CTA's turnaround; v9: between items) */
    double tail_pct;       /* after an SM's last record ends, while others still run (balance) */
    double sm_end_p50_us;  /* first start -> an SM's last end, median over the SMs */
} fp_cta_anatomy;
/* Fills *out from n records (a record per CTA; v9: per item, ordered by
 * ticket, its cta the persistent CTA that ran it; those with
 * t_ns[FP_CTA_START] == 0 are skipped:
 * CTAs of a smaller grid, or never run). FP_ERR_INVALID_ARGUMENT for NULL
 * pointers, n < 0, no record with a start, or a record whose marks go
 * backwards or that ends before it starts (a mark not reached, 0, is
 * skipped); *out is then zeroed. */
fp_status fp_attn_cta_anatomy(const fp_cta_record *records, int64_t n, fp_cta_anatomy *out);
/* Writes n records as Chrome trace event JSON (Perfetto's UI,
 * chrome://tracing) to path, atomically (fp_write_file_atomic): process
 * `label`; a track per SM ("SM 12"; records overlapping on an SM, two
 * resident CTAs or v9's chained items, on its next tracks: "SM 12 (2)");
 * each started record an event "cta N" ("item N" when `items`, v9's
 * records) from its start to its end (args: cta, sm, tiles, merged) with
 * its phases nested: "first tile" (start -> landed), "loop" (landed, or
 * the start, -> loop done; args: tiles, ns_per_tile), then "epilogue"
 * (-> end), or on split calls "store" (-> partials stored) and "merge" (the
 * merging CTA) or "arrive" (-> end). Times in microseconds from the first
 * start. Refuses (FP_ERR_INVALID_ARGUMENT) what fp_attn_cta_anatomy
 * refuses, and a NULL label; FP_ERR_IO from the write (no file is left). */
fp_status fp_attn_cta_export_chrome(const fp_cta_record *records, int64_t n, int items, const char *label,
                                    const char *path);

/* Simple CUDA-core kernel: one warp per query row, any dtype and head_dim. */
fp_status fp_attn_cuda_rowwise(const fp_attn_args *a, cudaStream_t stream);
/* Masked, scaled softmax in place over materialized scores
 * [batch * heads_q, seqlen_q, seqlen_k] of dtype (f32 for FP_F32), also
 * writes a->lse if set. */
fp_status fp_attn_cuda_masked_softmax(const fp_attn_args *a, void *scores, cudaStream_t stream);
/* Paged baseline: copies the paged K and V caches of a (block_table set)
 * into dense [batch, seqlen_k, heads_kv, head_dim] tensors k_dense /
 * v_dense of dtype; an entry out of range gives zero rows. */
fp_status fp_attn_cuda_gather_pages(const fp_attn_args *a, void *k_dense, void *v_dense, cudaStream_t stream);
/* Zeroes O for the sq query rows (all heads) of sequence b starting at
 * element offset o0 (varlen baseline: a sequence with no keys). */
fp_status fp_attn_cuda_zero_rows(const fp_attn_args *a, int64_t o0, int sq, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* FP_ATTENTION_INTERNAL_H */
