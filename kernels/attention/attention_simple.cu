// Simple CUDA attention kernels (no tensor cores). Versions:
//   attention_rowwise_v0        one warp per query row, online softmax over
//                               32-key chunks (lane j scores key j0 + j, the
//                               warp then accumulates P V with each lane
//                               owning head_dim / 32 columns). f32 math: the
//                               f32 path and head dims the flash kernel is not
//                               instantiated for. Several times slower than
//                               the flash kernel; correct for any shape.
//   attention_zero_rows_v0      zeroes O rows (varlen baseline: a sequence
//                               without keys, where no GEMM runs).
//   attention_masked_softmax_v0 the materialized baseline's middle step: one
//                               CTA per score row, scale + mask + softmax in
//                               f32, P written back in place in the scores'
//                               dtype (and the row's log-sum-exp).
//   attention_gather_pages_v0   the paged baseline's first step: copies a
//                               paged K or V cache into a dense [batch,
//                               seqlen_k, heads_kv, head_dim] tensor (an
//                               entry out of range gives zero rows).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention/attention_flash_layout.h"
#include "attention/attention_internal.h"
#include "common/span_stamp.cuh"

namespace {

template <typename T> struct elt;
template <> struct elt<float> {
    static __device__ __forceinline__ float load(const float *p) { return *p; }
    static __device__ __forceinline__ float cvt(float x) { return x; }
};
template <> struct elt<__half> {
    static __device__ __forceinline__ float load(const __half *p) { return __half2float(*p); }
    static __device__ __forceinline__ __half cvt(float x) { return __float2half_rn(x); }
};
template <> struct elt<__nv_bfloat16> {
    static __device__ __forceinline__ float load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
    static __device__ __forceinline__ __nv_bfloat16 cvt(float x) { return __float2bfloat16_rn(x); }
};

struct simple_params {
    const void *q, *k, *v;
    void *o;
    int64_t q_bs, q_ss, q_hs, k_bs, k_ss, k_hs, v_bs, v_ss, v_hs, o_bs, o_ss, o_hs;
    int batch, sq, sk, hq, group, d;
    float scale;
    int wl, wr;
    float *lse;
    const int32_t *seqlens_k;
    const int32_t *cu_q, *cu_k;
    const int32_t *block_table; // paged KV or NULL
    int bt_stride, page_size, num_pages;
    fp_span_stamp stamp; // the call's span (kernel timer; the row-wise kernel's only: rec NULL elsewhere)
};

simple_params make_params(const fp_attn_args *a) {
    simple_params p;
    p.q = a->q; p.k = a->k; p.v = a->v; p.o = a->o;
    p.q_bs = a->q_bs; p.q_ss = a->q_ss; p.q_hs = a->q_hs;
    p.k_bs = a->k_bs; p.k_ss = a->k_ss; p.k_hs = a->k_hs;
    p.v_bs = a->v_bs; p.v_ss = a->v_ss; p.v_hs = a->v_hs;
    p.o_bs = a->o_bs; p.o_ss = a->o_ss; p.o_hs = a->o_hs;
    p.batch = a->batch; p.sq = a->seqlen_q; p.sk = a->seqlen_k; p.hq = a->heads_q;
    p.group = a->group; p.d = a->head_dim;
    p.scale = a->scale;
    p.wl = fp_flash::clamp_window(a->window_left, a->seqlen_k);
    p.wr = fp_flash::clamp_window(a->window_right, a->seqlen_q);
    p.lse = a->lse;
    p.seqlens_k = a->seqlens_k;
    p.cu_q = a->cu_q;
    p.cu_k = a->cu_k;
    p.block_table = a->block_table;
    p.bt_stride = a->bt_stride;
    p.page_size = a->page_size;
    p.num_pages = a->num_pages;
    p.stamp.rec = p.stamp.rec_end = nullptr; // fp_attn_cuda_rowwise sets it
    p.stamp.seq = 0;
    return p;
}

// Key j's row of K or V at this head: dense (base = the sequence's row 0) or
// paged (base = the pool at this head, bt = the sequence's table row);
// nullptr for a page entry out of range (the caller reads zeros).
template <typename T>
__device__ __forceinline__ const T *kv_row(const T *base, const int32_t *bt, const simple_params &p,
                                           int64_t page_stride, int64_t row_stride, int j) {
    if (!bt) return base + (int64_t)j * row_stride;
    const int pg = bt[j / p.page_size];
    if ((unsigned)pg >= (unsigned)p.num_pages) return nullptr;
    return base + (int64_t)pg * page_stride + (int64_t)(j % p.page_size) * row_stride;
}

__device__ __forceinline__ fp_flash::seq_view seq_of(const simple_params &p, int b) {
    return fp_flash::make_seq(b, p.sq, p.sk, p.seqlens_k, p.cu_q, p.cu_k, p.q_bs, p.q_ss, p.k_bs, p.k_ss, p.v_bs,
                              p.v_ss, p.o_bs, p.o_ss);
}

constexpr int kRowWarps = 4;
constexpr int kMaxDim = 256;

// grid: ceil(batch * hq * sq / 4); block: 128 (4 warps, a row each).
template <typename T> __device__ __forceinline__ void rowwise_body(const simple_params &p) {
    __shared__ float q_smem[kRowWarps][kMaxDim];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t row = (int64_t)blockIdx.x * kRowWarps + warp; // (b * hq + h) * sq + qi
    if (row >= (int64_t)p.batch * p.hq * p.sq) return;
    const int qi = (int)(row % p.sq), h = (int)(row / p.sq % p.hq), b = (int)(row / ((int64_t)p.sq * p.hq));
    const int hk = h / p.group;
    const fp_flash::seq_view S = seq_of(p, b);
    if (qi >= S.sq) return; // varlen: past this sequence's queries (whole warp)
    int lo, hi;
    fp_flash::row_keys(qi, 1, S.L, S.sq, p.wl, p.wr, &lo, &hi);
    const float scale_log2 = p.scale * 1.4426950408889634f;
    const T *q = static_cast<const T *>(p.q) + S.q0 + (int64_t)qi * p.q_ss + (int64_t)h * p.q_hs;
    for (int d = lane; d < p.d; d += 32) q_smem[warp][d] = elt<T>::load(q + d) * scale_log2;
    __syncwarp();
    const int32_t *bt = p.block_table ? p.block_table + (int64_t)b * p.bt_stride : nullptr;
    const T *kb = static_cast<const T *>(p.k) + (bt ? 0 : S.k0) + (int64_t)hk * p.k_hs;
    const T *vb = static_cast<const T *>(p.v) + (bt ? 0 : S.v0) + (int64_t)hk * p.v_hs;
    float o[kMaxDim / 32];
#pragma unroll
    for (int i = 0; i < kMaxDim / 32; ++i) o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = lo; j0 <= hi; j0 += 32) {
        const int j = j0 + lane;
        float s = -INFINITY;
        if (j <= hi) {
            const T *kr = kv_row(kb, bt, p, p.k_bs, p.k_ss, j);
            float dot = 0.0f;
            if (kr)
                for (int d = 0; d < p.d; ++d) dot = fmaf(q_smem[warp][d], elt<T>::load(kr + d), dot);
            s = dot;
        }
        float cmax = s;
        for (int w = 16; w > 0; w >>= 1) cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, w));
        const float m_new = fmaxf(m, cmax);
        // scores all -inf so far: keep exp2's arguments off -inf - -inf (a
        // NaN score, which fmaxf skips, still makes its pj and the row NaN)
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = exp2f(m - m_use);
        const float pj = j <= hi ? exp2f(s - m_use) : 0.0f;
        float psum = pj;
        for (int w = 16; w > 0; w >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, w);
        l = l * corr + psum;
#pragma unroll
        for (int i = 0; i < kMaxDim / 32; ++i) o[i] *= corr;
        const int n = min(32, hi - j0 + 1);
        for (int jj = 0; jj < n; ++jj) {
            const float pw = __shfl_sync(0xffffffffu, pj, jj);
            const T *vr = kv_row(vb, bt, p, p.v_bs, p.v_ss, j0 + jj);
            if (!vr) continue; // zero row (uniform across the warp)
#pragma unroll
            for (int i = 0; i < kMaxDim / 32; ++i) {
                const int d = lane + 32 * i;
                if (d < p.d) o[i] = fmaf(pw, elt<T>::load(vr + d), o[i]);
            }
        }
        m = m_new;
    }
    const float inv = l == 0.0f ? 0.0f : 1.0f / l; // NaN l (NaN / +inf score): NaN row
    T *out = static_cast<T *>(p.o) + S.o0 + (int64_t)qi * p.o_ss + (int64_t)h * p.o_hs;
#pragma unroll
    for (int i = 0; i < kMaxDim / 32; ++i) {
        const int d = lane + 32 * i;
        if (d < p.d) out[d] = elt<T>::cvt(o[i] * inv);
    }
    if (p.lse && lane == 0) p.lse[row] = l == 0.0f ? -INFINITY : (m + log2f(l)) * 0.69314718055994531f;
}
template <typename T>
__global__ void __launch_bounds__(kRowWarps * 32) attention_rowwise_v0(const __grid_constant__ simple_params p) {
    fp_stamp::begin(p.stamp);
    rowwise_body<T>(p);
    fp_stamp::end_by(p.stamp, threadIdx.x % 32 == 0); // each warp: its row ends on its own
}

constexpr int kSoftmaxThreads = 256;

__device__ float block_reduce(float x, bool is_max, float *red) {
    for (int w = 16; w > 0; w >>= 1) {
        float y = __shfl_xor_sync(0xffffffffu, x, w);
        x = is_max ? fmaxf(x, y) : x + y;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); // red is reused by consecutive reductions
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = red[0];
    for (int i = 1; i < kSoftmaxThreads / 32; ++i) x = is_max ? fmaxf(x, red[i]) : x + red[i];
    return x;
}

// grid: batch * hq * sq score rows; block: 256.
template <typename S>
__global__ void __launch_bounds__(kSoftmaxThreads)
    attention_masked_softmax_v0(const __grid_constant__ simple_params p, S *scores) {
    __shared__ float red[kSoftmaxThreads / 32];
    const int64_t row = blockIdx.x;
    const int qi = (int)(row % p.sq), b = (int)(row / ((int64_t)p.sq * p.hq));
    const fp_flash::seq_view sv = seq_of(p, b);
    if (qi >= sv.sq) return; // varlen: past this sequence's queries (whole CTA)
    int lo, hi;
    fp_flash::row_keys(qi, 1, sv.L, sv.sq, p.wl, p.wr, &lo, &hi);
    S *s = scores + row * p.sk;
    float mx = -INFINITY;
    for (int j = lo + threadIdx.x; j <= hi; j += kSoftmaxThreads) mx = fmaxf(mx, elt<S>::load(s + j) * p.scale);
    mx = block_reduce(mx, true, red);
    if (mx == -INFINITY) mx = 0.0f; // every score -inf: a zero row (NaN / +inf: a NaN row)
    float sum = 0.0f;
    for (int j = lo + threadIdx.x; j <= hi; j += kSoftmaxThreads) sum += __expf(elt<S>::load(s + j) * p.scale - mx);
    sum = block_reduce(sum, false, red);
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int j = threadIdx.x; j < p.sk; j += kSoftmaxThreads) {
        float v = (j >= lo && j <= hi) ? __expf(elt<S>::load(s + j) * p.scale - mx) * inv : 0.0f;
        s[j] = elt<S>::cvt(v);
    }
    if (p.lse && threadIdx.x == 0) p.lse[row] = sum == 0.0f ? -INFINITY : mx + __logf(sum);
}

// grid: ceil(sq * hq * d / 256); block 256: O[o0 + i * o_ss + h * o_hs + x] = 0.
template <typename T>
__global__ void __launch_bounds__(256) attention_zero_rows_v0(const __grid_constant__ simple_params p, int64_t o0, int sq) {
    const int64_t idx = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (idx >= (int64_t)sq * p.hq * p.d) return;
    const int x = (int)(idx % p.d), h = (int)(idx / p.d % p.hq), i = (int)(idx / ((int64_t)p.d * p.hq));
    static_cast<T *>(p.o)[o0 + (int64_t)i * p.o_ss + (int64_t)h * p.o_hs + x] = elt<T>::cvt(0.0f);
}

// grid: (batch * seqlen_k, 2); block 128: y = 0 copies K, y = 1 copies V
// key row (b, j) of every head into dst [batch, seqlen_k, heads_kv, d].
template <typename T>
__global__ void __launch_bounds__(128) attention_gather_pages_v0(const __grid_constant__ simple_params p, int hkv,
                                                                  T *k_dst, T *v_dst) {
    const int64_t key = blockIdx.x; // b * sk + j
    const int b = (int)(key / p.sk), j = (int)(key % p.sk);
    const bool is_v = blockIdx.y == 1;
    const T *pool = static_cast<const T *>(is_v ? p.v : p.k);
    const int64_t ps = is_v ? p.v_bs : p.k_bs, ss = is_v ? p.v_ss : p.k_ss, hs = is_v ? p.v_hs : p.k_hs;
    const T *row = kv_row(pool, p.block_table + (int64_t)b * p.bt_stride, p, ps, ss, j);
    T *dst = (is_v ? v_dst : k_dst) + key * hkv * p.d;
    for (int x = threadIdx.x; x < hkv * p.d; x += blockDim.x) {
        const int h = x / p.d, d = x % p.d;
        dst[x] = row ? row[(int64_t)h * hs + d] : elt<T>::cvt(0.0f);
    }
}

} // namespace

extern "C" fp_status fp_attn_cuda_gather_pages(const fp_attn_args *a, void *k_dense, void *v_dense,
                                               cudaStream_t stream) {
    if (!a->block_table) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "attention gather: no block table");
    simple_params p = make_params(a);
    const int64_t keys = (int64_t)a->batch * a->seqlen_k;
    if (keys > 2147483647LL) return fp_set_error(FP_ERR_UNSUPPORTED, "attention gather: %lld keys", (long long)keys);
    const dim3 grid((unsigned)keys, 2);
    switch (a->dtype) {
    case FP_F32:
        attention_gather_pages_v0<float><<<grid, 128, 0, stream>>>(p, a->heads_kv, (float *)k_dense, (float *)v_dense);
        break;
    case FP_F16:
        attention_gather_pages_v0<__half><<<grid, 128, 0, stream>>>(p, a->heads_kv, (__half *)k_dense,
                                                                    (__half *)v_dense);
        break;
    case FP_BF16:
        attention_gather_pages_v0<__nv_bfloat16>
            <<<grid, 128, 0, stream>>>(p, a->heads_kv, (__nv_bfloat16 *)k_dense, (__nv_bfloat16 *)v_dense);
        break;
    default: return fp_set_error(FP_ERR_UNSUPPORTED, "attention: dtype %s", fp_dtype_name(a->dtype));
    }
    FP_CUDA_TRY(cudaGetLastError());
    return FP_OK;
}

extern "C" fp_status fp_attn_cuda_rowwise(const fp_attn_args *a, cudaStream_t stream) {
    if (a->kv_fp8_cache)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention rowwise kernel: an fp8 KV cache (the flash kernel v1 "
                                                "takes it)");
    if (a->head_dim > kMaxDim)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention rowwise kernel: head_dim %d > %d", a->head_dim, kMaxDim);
    simple_params p = make_params(a);
    p.stamp = a->stamp;
    const int64_t rows = (int64_t)a->batch * a->heads_q * a->seqlen_q;
    const int64_t blocks = (rows + kRowWarps - 1) / kRowWarps;
    if (blocks > 2147483647LL) return fp_set_error(FP_ERR_UNSUPPORTED, "attention: %lld rows", (long long)rows);
    switch (a->dtype) {
    case FP_F32: attention_rowwise_v0<float><<<(unsigned)blocks, kRowWarps * 32, 0, stream>>>(p); break;
    case FP_F16: attention_rowwise_v0<__half><<<(unsigned)blocks, kRowWarps * 32, 0, stream>>>(p); break;
    case FP_BF16: attention_rowwise_v0<__nv_bfloat16><<<(unsigned)blocks, kRowWarps * 32, 0, stream>>>(p); break;
    default: return fp_set_error(FP_ERR_UNSUPPORTED, "attention: dtype %s", fp_dtype_name(a->dtype));
    }
    FP_CUDA_TRY(cudaGetLastError());
    return FP_OK;
}

extern "C" fp_status fp_attn_cuda_masked_softmax(const fp_attn_args *a, void *scores, cudaStream_t stream) {
    simple_params p = make_params(a);
    const int64_t rows = (int64_t)a->batch * a->heads_q * a->seqlen_q;
    if (rows > 2147483647LL) return fp_set_error(FP_ERR_UNSUPPORTED, "attention: %lld score rows", (long long)rows);
    switch (a->dtype) {
    case FP_F32:
        attention_masked_softmax_v0<float><<<(unsigned)rows, kSoftmaxThreads, 0, stream>>>(p, (float *)scores);
        break;
    case FP_F16:
        attention_masked_softmax_v0<__half><<<(unsigned)rows, kSoftmaxThreads, 0, stream>>>(p, (__half *)scores);
        break;
    case FP_BF16:
        attention_masked_softmax_v0<__nv_bfloat16>
            <<<(unsigned)rows, kSoftmaxThreads, 0, stream>>>(p, (__nv_bfloat16 *)scores);
        break;
    default: return fp_set_error(FP_ERR_UNSUPPORTED, "attention: dtype %s", fp_dtype_name(a->dtype));
    }
    FP_CUDA_TRY(cudaGetLastError());
    return FP_OK;
}

extern "C" fp_status fp_attn_cuda_zero_rows(const fp_attn_args *a, int64_t o0, int sq, cudaStream_t stream) {
    simple_params p = make_params(a);
    const int64_t n = (int64_t)sq * a->heads_q * a->head_dim;
    if (n <= 0) return FP_OK;
    const unsigned blocks = (unsigned)((n + 255) / 256);
    switch (a->dtype) {
    case FP_F32: attention_zero_rows_v0<float><<<blocks, 256, 0, stream>>>(p, o0, sq); break;
    case FP_F16: attention_zero_rows_v0<__half><<<blocks, 256, 0, stream>>>(p, o0, sq); break;
    case FP_BF16: attention_zero_rows_v0<__nv_bfloat16><<<blocks, 256, 0, stream>>>(p, o0, sq); break;
    default: return fp_set_error(FP_ERR_UNSUPPORTED, "attention: dtype %s", fp_dtype_name(a->dtype));
    }
    FP_CUDA_TRY(cudaGetLastError());
    return FP_OK;
}
