// What the flash kernels of every version share (attention_flash.cu: v1 /
// v2 on mma.sync; attention_flash_sm90.cu: v3 / v4 on wgmma): the kernel
// parameters, small warp helpers, the split-KV combine kernel and the host
// side around a launch (parameters from fp_attn_args, the dynamic
// shared-memory opt-in, the partials' allocation, the combine launch).
// Included by both translation units (internal linkage: each gets its own
// copy for its own architectures).
#ifndef FP_ATTENTION_FLASH_COMMON_CUH
#define FP_ATTENTION_FLASH_COMMON_CUH

#include <atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_flash_layout.h"
#include "attention/attention_internal.h"
#include "common/fast_exp2.cuh"
#include "common/pdl.cuh"
#include "common/span_stamp.cuh"
#if defined(FP_CUDA_EMU) // the CPU emulation (tests/emu): the PTX below as C++
#include "emu_sm80.h"
#endif

namespace {

struct flash_params {
    const void *q, *k, *v;
    void *o;
    int64_t q_bs, q_ss, q_hs, k_bs, k_ss, k_hs, v_bs, v_ss, v_hs, o_bs, o_ss, o_hs;
    int batch, sq, sk, hq, hkv, group;
    int rows;           // sq * group: packed query rows per (batch, kv head), max
    int m_tiles;        // ceil(rows / kBr)
    float scale_log2;   // softmax_scale * log2(e)
    int wl, wr;         // window after fp_flash::clamp_window, -1 = unbounded (causal: wr = 0)
    float *lse;         // [batch, hq, sq] or NULL
    const int32_t *seqlens_k;
    const int32_t *cu_q, *cu_k; // varlen offsets [batch + 1] or NULL
    int kv_rows;        // the TMA kernels' K / V tensor maps: rows along the sequence dimension
                        // (seqlen_k; varlen: total_k, the packed tensor; fp_tma::kv_seq_rows)
    int num_splits;
    int b_off;          // batch of blockIdx.z = 0 (the launcher splits batch > 65535 over launches)
    float *o_part;      // [num_splits, batch, hq, sq, D] when num_splits > 1
    float *lse_part;    // [num_splits, batch, hq, sq]
    const int32_t *block_table; // paged KV: [batch, bt_stride] page of each page_size keys, or NULL
    int bt_stride, page_size, num_pages;
    int page_shift;     // log2(page_size) when a power of two, else -1 (FP_ATTN_PAGED_DIV=1: -1
                        // always, the division path, for the GPU check's A/B)
    int flat_loads;     // dense K / V copy loop (v1 / v2) over the flat chunk index, recomputing
                        // each copy's row and offset (FP_ATTN_FLAT_LOADS=1, for A/B runs); 0: the
                        // column loop where the head dim allows it (attention_flash.cu load_tile)
    int *counters;      // fused split combine (v1 / v2): [batch, hkv, m_tiles] arrivals, zero between
                        // launches; NULL: a separate combine kernel merges the partials
    int merge_release;  // fused combine's arrival: 1 = one acq_rel atomic by thread 0 after the CTA's
                        // barrier (the default: 0.2-0.5 us faster at 1024 keys on an H100, session
                        // 14); 0 = every thread's __threadfence (fence.sc.gpu, with an L1
                        // invalidate) before and after it (FP_ATTN_MERGE_FENCE=sc, for A/B runs)
    int merge_staged;   // fused combine: 1 = the merging CTA copies every split's partials of its
                        // rows into its shared memory (cp.async) while it loads their lse values,
                        // one L2 round trip for all, where they fit (fp_attn_merge_stage:
                        // FP_ATTN_MERGE_STAGE=1, until a GPU has measured it); 0: the lse values,
                        // then 16 splits' partials a round trip
    int *tickets;       // v9's item tickets ([2] ints, zero between launches: fp_tma::producer_items), else NULL
    float o_scale;      // fp8 inputs: O is multiplied by it (v_descale; fp_attn_args.o_scale)
    int o_tma;          // v5 / v8 / v10 (one split, 16-bit, dense): O leaves through shared memory and
                        // TMA stores (the kernel's tm_o; session 32), else 0: each thread's stores
    fp_cta_record *cta_trace; // the CTA timeline's records (kernels/common/cta_trace.cuh: one per CTA;
                              // v9: one per item), NULL: not traced (fp_attn_cuda_cta_trace_set)
    fp_span_stamp stamp;      // the call's span under the kernel timer (fp_attn_args.stamp; rec NULL:
                              // not stamped): every kernel of the call stamps it (span_stamp.cuh)
};

// The calling thread's CTA timeline (fp_attn_cuda_cta_trace_set) for a
// launch that writes `records` records (its CTAs; v9: its items): p traces
// into them when the launch is one (batch <= 65535) and they fit the
// capacity; otherwise nothing is recorded.
inline void cta_trace_for(const fp_attn_args *a, flash_params &p, int64_t records) {
    int64_t cap = 0;
    fp_cta_record *rec = fp_attn_cuda_cta_trace_get(&cap);
    if (!rec || a->batch > 65535 || records > cap) return;
    p.cta_trace = rec;
    fp_attn_cuda_cta_trace_note(records);
}

// Whether environment variable `name` is set to exactly `want` (the A/B
// switches below read it once, into a function-local static).
inline bool env_is(const char *name, const char *want) {
    const char *e = getenv(name);
    return e && strcmp(e, want) == 0;
}

// FP_ATTN_PAGED_DIV (read once): 1 finds pages by division for every page
// size (load_tile_paged's path before session 14), for the GPU check's A/B.
inline int paged_div_env() {
    static const int v = env_is("FP_ATTN_PAGED_DIV", "1");
    return v;
}

// FP_ATTN_FLAT_LOADS (read once): 1 selects the dense K / V copy loop over
// the flat chunk index (load_tile's path before session 14), for A/B runs.
inline int flat_loads_env() {
    static const int v = env_is("FP_ATTN_FLAT_LOADS", "1");
    return v;
}

// FP_ATTN_MERGE_FENCE (read once): "sc" selects the fused combine's former
// arrival, every thread's fence.sc.gpu (split_combine_fused), for A/B runs.
inline int merge_release_env() {
    static const int v = !env_is("FP_ATTN_MERGE_FENCE", "sc");
    return v;
}


// Parameters of a launch with br packed query rows per CTA.
inline flash_params make_flash_params(const fp_attn_args *a, int br, int num_splits) {
    flash_params p;
    p.merge_release = merge_release_env();
    p.merge_staged = fp_attn_merge_stage(); // FP_ATTN_MERGE_STAGE, or the A/B's switch
    p.flat_loads = flat_loads_env();
    p.o_scale = a->o_scale;
    p.o_tma = 0; // the TMA launchers set it (launch_v5)
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.o = a->o;
    p.q_bs = a->q_bs; p.q_ss = a->q_ss; p.q_hs = a->q_hs;
    p.k_bs = a->k_bs; p.k_ss = a->k_ss; p.k_hs = a->k_hs;
    p.v_bs = a->v_bs; p.v_ss = a->v_ss; p.v_hs = a->v_hs;
    p.o_bs = a->o_bs; p.o_ss = a->o_ss; p.o_hs = a->o_hs;
    p.batch = a->batch;
    p.sq = a->seqlen_q;
    p.sk = a->seqlen_k;
    p.hq = a->heads_q;
    p.hkv = a->heads_kv;
    p.group = a->group;
    p.rows = a->seqlen_q * a->group;
    p.m_tiles = (p.rows + br - 1) / br;
    p.scale_log2 = a->scale * 1.4426950408889634f;
    p.wl = fp_flash::clamp_window(a->window_left, a->seqlen_k);
    p.wr = fp_flash::clamp_window(a->window_right, a->seqlen_q);
    p.lse = a->lse;
    p.seqlens_k = a->seqlens_k;
    p.cu_q = a->cu_q;
    p.cu_k = a->cu_k;
    // varlen: total_k where given (the TMA launchers refuse varlen without
    // it, and above INT_MAX - seqlen_k - 256), else seqlen_k
    p.kv_rows = a->cu_k && a->total_k > 0 && a->total_k <= 2147483647 ? (int)a->total_k : a->seqlen_k;
    p.num_splits = num_splits;
    p.b_off = 0;
    p.o_part = nullptr;
    p.lse_part = nullptr;
    p.block_table = a->block_table;
    p.bt_stride = a->bt_stride;
    p.page_size = a->page_size;
    p.num_pages = a->num_pages;
    p.page_shift = -1;
    if (a->page_size > 0 && (a->page_size & (a->page_size - 1)) == 0 && !paged_div_env())
        for (p.page_shift = 0; (1 << p.page_shift) < a->page_size;) ++p.page_shift;
    p.counters = nullptr;
    p.tickets = nullptr;
    p.cta_trace = nullptr; // the recording kernels' launchers set it (cta_trace_for)
    p.stamp = a->stamp;
    return p;
}

template <typename T> struct pack_op;
template <> struct pack_op<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x = lo = lower 16 bits
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ __nv_bfloat16 cvt(float x) { return __float2bfloat16_rn(x); }
};
template <> struct pack_op<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    static __device__ __forceinline__ __half cvt(float x) { return __float2half_rn(x); }
};

// 2^x by the SFU instruction alone (ex2.approx.ftz.f32: about 2 ulp; results
// below 2^-126 flush to 0; -inf gives 0). exp2f wraps the same instruction
// in a denormal range fix-up (a compare and two multiplies per call, a
// quarter of the instructions of v3's softmax); the probabilities the
// fix-up keeps are below 2^-126 of the row maximum's and cannot change an
// f32 row sum.
__device__ __forceinline__ float fast_exp2(float x) { return fp_fast::ex2_ftz(x); }

// Max / sum over the quad of lanes that share an accumulator row.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ fp_flash::seq_view seq_of(const flash_params &p, int b) {
    return fp_flash::make_seq(b, p.sq, p.sk, p.seqlens_k, p.cu_q, p.cu_k, p.q_bs, p.q_ss, p.k_bs, p.k_ss, p.v_bs,
                              p.v_ss, p.o_bs, p.o_ss);
}

// What one CTA of a flash kernel's grid (m_tiles * num_splits, heads_kv,
// batch) works on: its query tile and KV split (fp_flash::cta_coords: the
// last tiles first), KV head, batch (b_off + blockIdx.z), first packed row
// m0, its sequence, that sequence's packed rows (varlen: <= p.rows) and the
// key tiles it visits. Every flash kernel (v1-v9) starts here.
struct cta_work {
    int m_tile, split, hk, b, m0, rows;
    fp_flash::seq_view S;
    fp_flash::block_plan plan;
};
// false: the tile lies past its sequence's rows (varlen, short sequences):
// CTA-uniform, so the caller returns before any barrier.
// work_at: the same for given coordinates (v9's persistent CTAs run a
// sequence of them, fp_tma::order_item).
__device__ __forceinline__ bool work_at(const flash_params &p, int br, int bc, int m_tile, int split, int hk, int b,
                                        cta_work &w) {
    w.m_tile = m_tile;
    w.split = split;
    w.hk = hk;
    w.b = b;
    w.m0 = w.m_tile * br;
    w.S = seq_of(p, w.b);
    w.rows = w.S.sq * p.group;
    if (w.m0 >= w.rows) return false;
    w.plan = fp_flash::plan_block(w.m0, br, bc, w.rows, p.group, w.S.L, w.S.sq, p.wl, p.wr, w.split, p.num_splits);
    return true;
}
__device__ __forceinline__ bool cta_work_of(const flash_params &p, int br, int bc, int b_off, cta_work &w) {
    int m_tile, split;
    fp_flash::cta_coords(blockIdx.x, p.m_tiles, &m_tile, &split);
    return work_at(p, br, bc, m_tile, split, blockIdx.y, blockIdx.z + b_off, w);
}

// grid: batch * hq * sq (one CTA per query row); block: kCombineThreads.
// O = sum_s exp(lse_s - lse) O_s, lse = logsumexp_s(lse_s). The split
// weights are computed once per row into shared memory (one parallel load of
// the num_splits lse values, two block reductions), then each thread sums its
// columns over the splits with independent, branch-free loads: a per-split
// branch on lse_s made the loads a dependent chain (one L2 round trip per
// split and column, ~10 us at 33 splits: a quarter of a 32k-context decode).
// Every split writes every row of its CTA (an empty split writes O_s = 0,
// lse_s = -inf, i.e. weight 0), so the partials are finite.
// A split's weight exp(lse_s - lse_max) (lse_s = -inf, a split without
// keys: 0) and the row's lse from the weight sum, as both combines compute
// them: by ex2.approx.ftz and lg2.approx (fast_exp2 / __log2f), not __expf /
// __logf, whose denormal fix-up (FSETP against -126) the SASS check forbids
// in the flash kernels that fuse the combine (tests/sass/check_sass.py).
__device__ __forceinline__ float combine_weight(float ls, float mx) {
    return ls == -INFINITY ? 0.0f : fast_exp2((ls - mx) * 1.4426950408889634f);
}
__device__ __forceinline__ float combine_lse(float mx, float sum) {
    return sum == 0.0f ? -INFINITY : mx + __log2f(sum) * 0.69314718055994531f;
}

constexpr int kCombineThreads = 128;
constexpr int kMaxSplits = 1024; // fp_attn_cuda_flash_splits' limit

__device__ __forceinline__ float combine_reduce(float x, bool is_max, float *red) {
    for (int o = 16; o > 0; o >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = is_max ? fmaxf(x, y) : x + y;
    }
    __syncthreads(); // red is reused by consecutive reductions
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = red[0];
    for (int i = 1; i < kCombineThreads / 32; ++i) x = is_max ? fmaxf(x, red[i]) : x + red[i];
    return x;
}

template <typename T, int D>
__global__ void __launch_bounds__(kCombineThreads) attention_split_combine_v1(const __grid_constant__ flash_params p) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp); // (the split kernel claimed the span: no start written here)
    __shared__ float w[kMaxSplits];
    __shared__ float red[kCombineThreads / 32];
    const int64_t row = blockIdx.x; // (b * hq + h) * sq + qi
    const int64_t rows_total = (int64_t)p.batch * p.hq * p.sq;
    const int qi = (int)(row % p.sq), h = (int)(row / p.sq % p.hq), b = (int)(row / ((int64_t)p.sq * p.hq));
    const fp_flash::seq_view S = seq_of(p, b);
    if (qi >= S.sq) return; // varlen: past this sequence's queries (no partials written); CTA-uniform
    const int ns = p.num_splits;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < ns; s += kCombineThreads) {
        const float ls = p.lse_part[s * rows_total + row];
        w[s] = ls;
        mx = fmaxf(mx, ls);
    }
    mx = combine_reduce(mx, true, red);
    float sum = 0.0f;
    for (int s = threadIdx.x; s < ns; s += kCombineThreads) { // w[s] was written by this thread
        // lse_s = -inf (no key in the split): 0; a NaN lse_s (fmaxf skipped
        // it) makes the row NaN
        const float e = combine_weight(w[s], mx);
        w[s] = e;
        sum += e;
    }
    sum = combine_reduce(sum, false, red); // its barriers also publish w[]
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    const float lse = combine_lse(mx, sum);
    T *o = static_cast<T *>(p.o) + S.o0 + (int64_t)qi * p.o_ss + (int64_t)h * p.o_hs;
    const float *op = p.o_part + row * D;
    const int64_t split_stride = rows_total * D;
    for (int col = threadIdx.x; col < D; col += kCombineThreads) {
        float acc = 0.0f;
#pragma unroll 8
        for (int s = 0; s < ns; ++s) acc = fmaf(w[s], op[s * split_stride + col], acc);
        o[col] = pack_op<T>::cvt(acc * inv);
    }
    if (p.lse && threadIdx.x == 0) p.lse[row] = lse;
    fp_stamp::end(p.stamp);
}

// The dynamic shared-memory opt-in above 48 KiB is per device and kernel:
// set once per (Kernel, device), not on every launch (a driver call per
// decode step otherwise). cudaDeviceReset drops the attribute while this
// flag stays set: launch_smem sets it again when a launch is refused.
template <auto Kernel> fp_status smem_opt_in(size_t smem) {
    if (smem <= 48 * 1024) return FP_OK;
    static std::atomic<unsigned long long> configured{0};
    int dev = 0;
    FP_CUDA_TRY(cudaGetDevice(&dev));
    const unsigned long long dev_bit = dev < 64 ? (1ull << dev) : 0ull;
    if (!(configured.load(std::memory_order_acquire) & dev_bit) || !dev_bit) {
        FP_CUDA_TRY(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured.fetch_or(dev_bit, std::memory_order_release);
    }
    return FP_OK;
}

// Whether the call's context launches with programmatic dependent launch
// (FP_CTX_LAUNCH_PDL: kernels/common/pdl.cuh).
inline bool pdl_of(const fp_attn_args *a) { return a->ctx && a->ctx->launch_pdl; }

// Kernel<<<grid, block, smem, stream>>>(args...) (with programmatic stream
// serialization when pdl: fp_pdl::launch) and its launch error. A
// launch refused with cudaErrorInvalidValue above 48 KiB is the opt-in lost
// to a cudaDeviceReset: set it again and launch once more (nothing is paid
// on the launches that succeed).
template <auto Kernel, typename... Args>
cudaError_t launch_smem(dim3 grid, unsigned block, size_t smem, cudaStream_t stream, bool pdl, Args... args) {
    cudaError_t err = fp_pdl::launch<Kernel>(grid, dim3(block), smem, stream, pdl, args...);
    if (err == cudaErrorInvalidValue && smem > 48 * 1024) {
        if (cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
            (void)cudaGetLastError();
            return err;
        }
        err = fp_pdl::launch<Kernel>(grid, dim3(block), smem, stream, pdl, args...);
    }
    return err;
}

// Runs launch(p) (which enqueues the flash kernel(s) and returns
// cudaGetLastError) with p.num_splits split partials when p.num_splits > 1:
// both partials in the stream's workspace of the context (a->ctx;
// fp_ctx_scratch_get: no allocation once warmed up, capturable), then the
// combine kernel, or none where the split kernel combines itself: `fused`
// (a kernel with the fused epilogue: v1 / v2), a context that asks for it
// (FP_CTX_ATTENTION_SPLIT_COMBINE 0, the default) and gives the arrival
// counters (p.counters, [batch, hkv, m_tiles]). `tickets` > 0: the kernel's
// own counters (p.tickets, zero at launch, left zero: v9's), from the same
// per-stream pool. `who` names the kernel in messages.
template <typename T, int D, typename Launch>
fp_status run_with_partials(const fp_attn_args *a, flash_params &p, cudaStream_t stream, const char *who,
                            bool fused, Launch launch, int tickets = 0) {
    const int64_t rows_total = (int64_t)a->batch * a->heads_q * a->seqlen_q;
    fp_scratch scratch = {nullptr, nullptr, nullptr, nullptr, 0};
    const bool held = p.num_splits > 1 || tickets > 0;
    if (held) {
        size_t n = 0, ncounters = 0;
        if (p.num_splits > 1) {
            if (rows_total > 2147483647LL)
                return fp_set_error(FP_ERR_UNSUPPORTED, "%s: too many query rows for split-KV", who);
            n = (size_t)p.num_splits * rows_total;
            ncounters =
                fused && a->ctx && a->ctx->attn_split_combine == 0 ? (size_t)a->batch * a->heads_kv * p.m_tiles : 0;
        }
        FP_TRY(fp_ctx_scratch_get_counted(a->ctx, stream, n * (D + 1) * sizeof(float), ncounters + (size_t)tickets,
                                          who, &scratch));
        if (p.num_splits > 1) {
            p.o_part = static_cast<float *>(scratch.ptr);
            p.lse_part = p.o_part + n * D; // one buffer for both
            p.counters = ncounters ? scratch.counters : nullptr;
        }
        p.tickets = tickets > 0 ? scratch.counters + ncounters : nullptr;
    }
    cudaError_t err = launch(p);
    // launch may leave p.b_off at its last batch chunk (batch > 65535): the
    // combine indexes the whole batch from blockIdx.x and must not see it
    p.b_off = 0;
    if (err == cudaSuccess && p.num_splits > 1 && !p.counters) {
        err = fp_pdl::launch<attention_split_combine_v1<T, D>>(dim3((unsigned)rows_total), dim3(kCombineThreads), 0,
                                                              stream, pdl_of(a), p);
    }
    const fp_status put = held ? fp_ctx_scratch_put(&scratch) : FP_OK;
    FP_CUDA_TRY(err);
    return put;
}

} // namespace

#endif // FP_ATTENTION_FLASH_COMMON_CUH
