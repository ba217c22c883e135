// Flash attention forward on tensor cores (sm_80+), prefill and split-KV
// decode. Versions:
//   attention_flash_fwd_v1      one CTA = 64 packed query rows x one KV head
//                               (head_dim 32, 64, 96, 128, 256);
//                               4 warps, each owns 16 rows (one m16 MMA row
//                               block). Q K^T and P V with mma.sync m16n8k16
//                               (f16/bf16 in, f32 accumulate), fragments from
//                               bank-conflict-free (XOR-swizzled or padded)
//                               shared memory via ldmatrix (.trans for V),
//                               K/V tiles double-buffered with 16-byte
//                               cp.async, online softmax in registers (exp2,
//                               scale * log2(e) folded into one FMA), masks on
//                               edge/diagonal tiles only, no scores in global
//                               memory. With num_splits > 1 each CTA takes a
//                               slice of the KV tiles and writes an f32 partial
//                               O and its log-sum-exp. An fp8 KV cache
//                               (kv_fp8_cache: e4m3 K / V under f16 / bf16
//                               Q, head_dim 64 / 128 / 256) runs v1 with each
//                               tile copied as e4m3 and widened in shared
//                               memory (load_kv_tile8, widen_kv_tile8).
//   attention_flash_fwd_v2      the same body with two 16-row blocks per warp
//                               (128 rows per CTA, head_dim 64 / 128): each
//                               K / V fragment loaded from shared memory feeds
//                               two MMAs. At head_dim 128 FlashAttention-2's
//                               forward tile (128 x 64 over 4 warps, O and S
//                               in 192 registers: traits_v2<128>'s
//                               kTightRegs); its earlier 128 x 32 tile
//                               (attention_flash_fwd_v2n) stays for the A/B.
//                               Selected only through
//                               FP_CTX_ATTENTION_KERNEL = 2 and
//                               fp_attn_cuda_flash_version: measured on an
//                               H200 at 1.1-1.4x v1 (128 x 32), below v3 / v5.
//   attention_flash_fwd_v3, v4  Hopper only (sm_90a, wgmma + 128-byte
//                               swizzled tiles): attention_flash_sm90.cu.
//                               v3 is the Hopper default where v5 refuses
//                               (fp_attn_cuda_flash); v4 only when asked.
//   attention_flash_fwd_v5      Hopper only: v3's consumers fed by TMA loads
//                               from a producer warpgroup through an mbarrier
//                               ring (setmaxnreg): attention_flash_tma_sm90.cu.
//                               The Hopper default at head_dim 128
//                               (measured, NOTES.md); v10 (v5 with three
//                               consumer warpgroups taking turns,
//                               attention_flash_tma_sm90.cu) at 64.
//   attention_decode_fwd_v6     the decode kernel: 16 packed query rows per
//                               CTA, the 4 warps splitting each 64-key tile,
//                               K / V through a ring of 2 to 4 tiles, the
//                               warps' softmax states merged at the end
//                               (fp_flash::traits_decode); over an fp8 KV
//                               cache each warp copies and widens its own
//                               keys (no barrier a tile). Selected only
//                               through FP_CTX_ATTENTION_KERNEL = 6 (calls of
//                               at most 64 packed rows per KV head) and
//                               fp_attn_cuda_flash_version until a GPU run
//                               has measured it against v1.
//   attention_flash_fwd_v7      v1's body over 8 warps: FlashAttention-2's
//                               128 x 64 tile on mma.sync, a K / V tile
//                               shared by 8 warps (fp_flash::traits_w8).
//                               Selected only through FP_CTX_ATTENTION_KERNEL
//                               = 7 and fp_attn_cuda_flash_version until a
//                               GPU run has measured it against v1.
//   attention_split_combine_v1  merges the split partials: O = sum_s
//                               exp(lse_s - lse) O_s, lse = logsumexp(lse_s)
//                               (attention_flash_common.cuh, every version).
// Paged KV cache (block_table): K/V tiles are gathered row by row from the
// pages (load_tile_paged); everything after the load is unchanged.
// GQA: a CTA packs the group's query heads into its rows (row r of a (batch,
// kv head) is query position r / group, head hk * group + r % group), so K/V
// are loaded once for the whole group; this is what makes decode (seqlen_q 1)
// fill the MMA rows.
// Index math (tiles, swizzle, ldmatrix lanes, key ranges) lives in
// attention_flash_layout.h, shared with the warp-level CPU emulation
// tests/attention/test_attention_flash_emu.cpp that checks it without a GPU.
// Run: tests/attention/test_attention_gpu (label gpu), fastbench attention/...;
// without a GPU, tests/attention/test_attention_emu runs this file itself on
// the CPU emulation of the CUDA execution model (tests/emu; the PTX wrappers'
// FP_CUDA_EMU branches).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_flash_common.cuh"
#include "attention/attention_flash_layout.h"
#include "attention/attention_internal.h"
#include "common/cta_trace.cuh"  /* fp_cta::mark: the CTA timeline (fastbench attention/decode_anatomy) */
#include "common/grid_count.cuh" /* fp_grid::arrive: the split combine's acq_rel arrival */
#if defined(FP_CUDA_EMU) // the CPU emulation (tests/emu): the PTX below as C++
#include "emu_sm80.h"
#endif

namespace {

using fp_flash::traits;
using fp_flash::traits_v2;

// ---- PTX wrappers --------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; pred false zero-fills (src-size 0),
// which keeps rows past the sequence end finite (0 * garbage could be NaN).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool pred) {
    int n = pred ? 16 : 0;
#if defined(FP_CUDA_EMU)
    fp_emu::cp_async(dst, src, 16, n);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
#endif
}
#if defined(FP_CUDA_EMU)
__device__ __forceinline__ void cp_async_commit() { fp_emu::cp_async_commit(); }
template <int N> __device__ __forceinline__ void cp_async_wait() { fp_emu::cp_async_wait_group(N); }
#else
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
#if defined(FP_CUDA_EMU)
    fp_emu::ldmatrix_x4(r, addr, false);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
#if defined(FP_CUDA_EMU)
    fp_emu::ldmatrix_x4(r, addr, true);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// D (16x8 f32) += A (16x16 row-major) * B (16x8 col-major).
// Fragments (g = lane / 4, t = lane % 4):
//   A: a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..)
//   B: b0 (k 2t..2t+1, col g), b1 (k 2t+8..2t+9, col g)
//   C: c0,c1 (row g, cols 2t, 2t+1), c2,c3 (row g+8, cols 2t, 2t+1)
template <typename T> struct mma_op;
template <> struct mma_op<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(FP_CUDA_EMU)
        fp_emu::mma_m16n8k16(c, a, b0, b1, true);
#else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};
template <> struct mma_op<__half> {
    static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(FP_CUDA_EMU)
        fp_emu::mma_m16n8k16(c, a, b0, b1, false);
#else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};

using fp_flash::swz;

// The dense K / V copy loop by column, when a thread's chunk column is the
// same on every pass (NT a multiple of the D / 8 chunks of a row: every head
// dim but 96): thread tid copies chunk tid % CH of rows tid / CH, + NT / CH,
// ... and the row's address advances by a pointer add per copy (15 SASS
// instructions), where the loop over the flat index (head_dim 96, and
// FP_ATTN_FLAT_LOADS=1 for A/B runs) recomputes row, chunk and a 64-bit row
// offset for each 16-byte copy (33; with 16 copies per KV tile over half of
// a decode warp's instructions, ncu, session 14). Measured on an H100
// (session 14): the mma.sync prefill at 4k, head_dim 128, 222-224 TFLOP/s
// against 170-172 (v1; causal 206 / 161, head_dim 64 211 / 171; v2 +12-13%),
// decode at 1k keys 9.4-9.6 us against 10.0-10.7, decode at 32k unchanged.
// Not unrolled: unrolled, the compiler holds every copy's offsets through
// the KV loop in registers the accumulators need.
template <int D, int NT> constexpr bool kColumnLoop = NT % (D / 8) == 0;

// Copies `rows` x D elements (row r at base + r * row_stride) into a
// swizzled tile; rows >= valid are zero-filled. All threads take part.
template <typename T, int D, int NT>
__device__ __forceinline__ void load_tile(T *tile, const T *base, int64_t row_stride, int rows, int valid,
                                          int tid, bool flat = false) {
    constexpr int CH = D / 8;
    if (kColumnLoop<D, NT> && !flat) {
        constexpr int RS = NT / CH; // rows per pass
        const int c = tid % CH;
        const int64_t step = (int64_t)RS * row_stride;
        const T *src = base + (int64_t)(tid / CH) * row_stride + c * 8;
#pragma unroll 1
        for (int r = tid / CH; r < rows; r += RS, src += step) {
            const bool ok = r < valid;
            cp_async16(smem_u32(tile + swz<D>(r, c)), ok ? src : base, ok);
        }
    } else {
#pragma unroll 1
        for (int idx = tid; idx < rows * CH; idx += NT) {
            int r = idx / CH, c = idx % CH;
            bool ok = r < valid;
            const T *src = ok ? base + r * row_stride + c * 8 : base;
            cp_async16(smem_u32(tile + swz<D>(r, c)), src, ok);
        }
    }
}

// The page of a key and its row in that page: shift and mask for a
// power-of-two page size (page_shift >= 0), else a division.
__device__ __forceinline__ void page_of(int key, int page_size, int page_shift, int *page, int *in_page) {
    if (page_shift >= 0) {
        *page = key >> page_shift;
        *in_page = key & (page_size - 1);
    } else {
        *page = key / page_size;
        *in_page = key - *page * page_size;
    }
}

// Paged KV cache: row r of the tile is key n0 + r of the sequence, found in
// page bt[(n0 + r) / page_size]; base is the pool plus the head offset and
// page_stride the pool's page stride. An entry outside [0, num_pages) (the
// table is device memory and is not checked on the host) zero-fills the
// row instead of reading outside the pool. The table entry is read through
// the read-only path. A power-of-two page size finds the page and the row in
// it by a shift and a mask (page_of): the division and the remainder by a
// runtime page_size were two ~25-instruction sequences per 16-byte copy, and
// with them the paged decode ran at 0.61-0.64x of the dense one on an H100
// at 32k keys (sessions 9-14), 0.81-0.84x with the shift. Measured and
// dropped (session 14, H100, 32k keys): a tile's table reads issued before
// its copies (with the divisions: 111 us against 93), and the column loop
// of load_tile reading the table once per page a thread's rows enter (page
// 16: 76.5 us against 71.3-72.0 for this loop; page 256: the same).
template <typename T, int D, int NT>
__device__ __forceinline__ void load_tile_paged(T *tile, const T *base, int64_t page_stride, int64_t row_stride,
                                                const int32_t *bt, int page_size, int page_shift, int num_pages,
                                                int n0, int rows, int valid, int tid) {
    constexpr int CH = D / 8;
#pragma unroll 1
    for (int idx = tid; idx < rows * CH; idx += NT) {
        int r = idx / CH, c = idx % CH;
        bool ok = r < valid;
        const T *src = base;
        if (ok) {
            int page, in_page;
            page_of(n0 + r, page_size, page_shift, &page, &in_page);
            const int pg = __ldg(bt + page);
            ok = (unsigned)pg < (unsigned)num_pages;
            if (ok) src = base + (int64_t)pg * page_stride + (int64_t)in_page * row_stride + c * 8;
        }
        cp_async16(smem_u32(tile + swz<D>(r, c)), src, ok);
    }
}

// A stride the compiler must take as computed here: kept from being hoisted
// out of the KV loop, where multiples of it would hold registers.
__device__ __forceinline__ int64_t opaque_stride(int64_t x) {
#if !defined(FP_CUDA_EMU)
    asm volatile("" : "+l"(x));
#endif
    return x;
}

// K or V tile of keys [n0, n0 + BC): dense (base = the sequence's row 0 of
// this head) or paged (base = the pool at this head, bt = the sequence's
// block-table row).
// kUnrolled (kTightRegs): a tile whose BC keys all exist (every tile but a
// sequence's last) is copied by an unrolled column loop: the thread's rows
// tid / CH + i RS all have the same row mod 8 (RS a multiple of 8), hence
// the same swizzled chunk, so every shared address is the first one plus an
// immediate, and the source advances by one 64-bit add a copy: ~3
// instructions a 16-byte copy where the predicated loop took ~15 (v2 at
// head_dim 128 on sm_90: 8 copies a thread for each of K and V per tile).
template <typename T, int D, int NT, int BC, bool kUnrolled = false>
__device__ __forceinline__ void load_kv_tile(T *tile, const flash_params &p, const T *base, int64_t page_stride,
                                             int64_t row_stride, const int32_t *bt, int n0, int valid, int tid) {
    constexpr int rows = BC;
    if (bt) {
        load_tile_paged<T, D, NT>(tile, base, page_stride, row_stride, bt, p.page_size, p.page_shift, p.num_pages,
                                  n0, rows, valid, tid);
        return;
    }
    if constexpr (kUnrolled && kColumnLoop<D, NT>) {
        constexpr int CH = D / 8, RS = NT / CH;
        static_assert(RS % 8 == 0 && rows % RS == 0, "a thread's rows share their swizzled chunk");
        if (valid >= rows && !p.flat_loads) {
            const int r = tid / CH, c = tid % CH;
            const int64_t step = opaque_stride((int64_t)RS * row_stride);
            const T *src = base + ((int64_t)n0 + r) * row_stride + c * 8;
            const uint32_t dst = smem_u32(tile + swz<D>(r, c));
#pragma unroll
            for (int i = 0; i < rows / RS; ++i, src += step)
                cp_async16(dst + (uint32_t)(i * RS * D * sizeof(T)), src, true);
            return;
        }
    }
    load_tile<T, D, NT>(tile, base + (int64_t)n0 * row_stride, row_stride, rows, valid, tid, p.flat_loads);
}

// ---- fp8 KV cache (kv_fp8_cache: K / V e4m3 under an f16 / bf16 Q) ----
// A K or V tile lands as e4m3 bytes in a staging buffer (key r at r * D,
// not swizzled), and after its cp.async group completed each thread widens
// the 16-byte chunks it copied itself into the swizzled 16-bit tile the
// MMA path reads (16 e4m3 -> two 16-byte chunks of T). The chunk -> thread
// map is the same in both (chunk idx = r * D / 16 + c, thread idx % NT), so
// no barrier sits between a thread's copy and its widening, and one staging
// buffer each for K and V suffices: the next tile's copies into it are
// issued after the barrier every thread reaches only once it has widened
// its chunks of this one. e4m3 values are exact in f16 and bf16, so the
// products are those of a 16-bit cache holding the same values.
using kv8_t = __nv_fp8_e4m3;
template <typename TK> constexpr bool kIsKv8 = sizeof(TK) == 1;

template <int D, int NT, int BC>
__device__ __forceinline__ void load_kv_tile8(uint8_t *stage, const flash_params &p, const uint8_t *base,
                                              int64_t page_stride, int64_t row_stride, const int32_t *bt, int n0,
                                              int valid, int tid) {
    constexpr int CH = D / 16; // 16-byte chunks per key row
    static_assert(BC * CH % NT == 0, "every thread copies the same number of chunks");
#pragma unroll 1
    for (int idx = tid; idx < BC * CH; idx += NT) {
        const int r = idx / CH, c = idx % CH;
        bool ok = r < valid;
        const uint8_t *src = base;
        if (ok) {
            if (bt) {
                int page, in_page;
                page_of(n0 + r, p.page_size, p.page_shift, &page, &in_page);
                const int pg = __ldg(bt + page);
                ok = (unsigned)pg < (unsigned)p.num_pages;
                if (ok) src = base + (int64_t)pg * page_stride + (int64_t)in_page * row_stride + c * 16;
            } else {
                src = base + (int64_t)(n0 + r) * row_stride + c * 16;
            }
        }
        cp_async16(smem_u32(stage + r * D + c * 16), src, ok); // !ok: zeros (e4m3 0 = +0)
    }
}

// Two e4m3 (byte 0 the lower element) as a packed pair of T (low half the
// lower element): exact (cvt.rn.f16x2.e4m3x2 on sm_89+, cuda_fp8.h's
// integer form before).
template <typename T> __device__ __forceinline__ uint32_t e4m3x2_to(uint32_t two);
template <> __device__ __forceinline__ uint32_t e4m3x2_to<__half>(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
template <> __device__ __forceinline__ uint32_t e4m3x2_to<__nv_bfloat16>(uint32_t two) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    __half_raw lo, hi;
    lo.x = h.x;
    hi.x = h.y;
    return pack_op<__nv_bfloat16>::pack(__half2float(__half(lo)), __half2float(__half(hi)));
}

// 16 e4m3 (a 16-byte chunk) as 16 elements of T: lo the first 8, hi the rest.
template <typename T> __device__ __forceinline__ void widen_chunk(const uint4 &in, uint4 &lo, uint4 &hi) {
    lo.x = e4m3x2_to<T>(in.x);
    lo.y = e4m3x2_to<T>(in.x >> 16);
    lo.z = e4m3x2_to<T>(in.y);
    lo.w = e4m3x2_to<T>(in.y >> 16);
    hi.x = e4m3x2_to<T>(in.z);
    hi.y = e4m3x2_to<T>(in.z >> 16);
    hi.z = e4m3x2_to<T>(in.w);
    hi.w = e4m3x2_to<T>(in.w >> 16);
}

// Unrolled: with NT / CH a multiple of 8 (v1: 128 threads) a thread's
// chunks are rows tid / CH + i NT / CH of one chunk column, so every address
// after the first is an immediate offset (the swizzle depends on the row
// mod 8); v6 widens a warp's 16 keys (NT 32).
template <typename T, int D, int NT, int BC>
__device__ __forceinline__ void widen_kv_tile8(T *tile, const uint8_t *stage, int tid) {
    constexpr int CH = D / 16;
    static_assert(BC * CH % NT == 0, "every thread widens the same number of chunks");
#pragma unroll
    for (int i = 0; i < BC * CH / NT; ++i) {
        const int idx = tid + i * NT, r = idx / CH, c = idx % CH;
        const uint4 in = *reinterpret_cast<const uint4 *>(stage + r * D + c * 16);
        uint4 lo, hi;
        widen_chunk<T>(in, lo, hi);
        *reinterpret_cast<uint4 *>(tile + swz<D>(r, 2 * c)) = lo;
        *reinterpret_cast<uint4 *>(tile + swz<D>(r, 2 * c + 1)) = hi;
    }
}

// ---- an fp8 KV cache widened for the Hopper kernels (session 34) ----
// The TMA kernels (v5 / v8 / v9 / v10) and v3 / v4 read 16-bit K / V tiles
// (tensor maps, wgmma descriptors); a call over an fp8 cache that prefers
// one of them widens the cache first, into Q's type, dense: K16 / V16
// [rows][heads_kv][head_dim], rows = batch x seqlen_k (key j of sequence b
// at row b seqlen_k + j, pages resolved through the block table) or, varlen,
// the packed rows (total_k). e4m3 is exact in f16 and bf16, so the kernel
// multiplies the values v1 would. Keys at or past a sequence's length
// (seqlens_k) and pages outside [0, num_pages) are zeros; the table is not
// read past a sequence's length. One thread a 16-byte chunk (16 e4m3 ->
// two 16-byte chunks of T). grid (ceil(rows / kWidenRows), 2: K, V); block
// kWidenThreads.
constexpr int kWidenRows = 8, kWidenThreads = 128;
struct widen_params {
    const uint8_t *src[2];       // K, V: the fp8 cache
    int64_t bs[2], ss[2], hs[2]; // element (= byte) strides; bs: the page stride when paged
    void *dst[2];                // K16, V16
    const int32_t *seqlens_k, *block_table;
    int64_t rows;                // output rows
    int sk, hkv, d, varlen;
    int bt_stride, page_size, num_pages;
    fp_span_stamp stamp;         // the call's span (kernel timer): the widening is its first kernel
};
template <typename T>
__global__ void __launch_bounds__(kWidenThreads) attention_kv8_widen_v0(const __grid_constant__ widen_params w) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(w.stamp);
    const int t = blockIdx.y;
    const int cpr = w.d / 16, ch = w.hkv * cpr; // 16-byte chunks: a head's row, a key's row
    const int64_t r0 = (int64_t)blockIdx.x * kWidenRows;
    for (int idx = threadIdx.x; idx < kWidenRows * ch; idx += kWidenThreads) {
        const int64_t r = r0 + idx / ch;
        if (r >= w.rows) break; // r grows with idx
        const int c = idx % ch, h = c / cpr, x = (c % cpr) * 16;
        const uint8_t *src = nullptr;
        if (w.varlen) {
            src = w.src[t] + r * w.ss[t];
        } else {
            const int b = (int)(r / w.sk), key = (int)(r % w.sk);
            int L = w.sk;
            if (w.seqlens_k) L = min(max(w.seqlens_k[b], 0), w.sk);
            if (key < L) {
                if (w.block_table) {
                    const int pg = w.block_table[(int64_t)b * w.bt_stride + key / w.page_size];
                    if ((unsigned)pg < (unsigned)w.num_pages)
                        src = w.src[t] + pg * w.bs[t] + (int64_t)(key % w.page_size) * w.ss[t];
                } else {
                    src = w.src[t] + b * w.bs[t] + (int64_t)key * w.ss[t];
                }
            }
        }
        uint4 in = make_uint4(0u, 0u, 0u, 0u); // e4m3 0 = +0
        if (src) in = *reinterpret_cast<const uint4 *>(src + h * w.hs[t] + x);
        uint4 lo, hi;
        widen_chunk<T>(in, lo, hi);
        T *dst = static_cast<T *>(w.dst[t]) + (r * w.hkv + h) * w.d + x;
        *reinterpret_cast<uint4 *>(dst) = lo;
        *reinterpret_cast<uint4 *>(dst + 8) = hi;
    }
    fp_stamp::end(w.stamp);
}

// The fused split combine (p.counters set, p.num_splits > 1), after a CTA
// wrote its split's partials for the packed rows [m0, rows_end) of its
// query tile: the CTA counts its arrival on the tile's counter, and the last
// of the tile's num_splits CTAs merges the tile's rows as
// attention_split_combine_v1 does (same weights, the same fmaf order over
// the splits; the row sums reduce over a warp instead of a block), then
// resets the counter to 0 for the next launch. One kernel instead of two:
// a launch less on the host (about 3 us on an H100) and no dependent
// kernel's start on the GPU. Every CTA of a tile reaches here or none does
// (the m0 >= rows exit is the same for all splits of a tile). Memory order:
// the CTA's partial stores are released by its arrival (a barrier, then
// thread 0's acq_rel atomic), the last CTA acquires the others' by the same
// atomic and reads the partials through L2 (__ldcg), where the other SMs'
// stores are (FP_ATTN_MERGE_FENCE=sc: every thread's fence.sc.gpu before and
// after the arrival, as before session 14).
// `flag`: a word of the CTA's dynamic shared memory, free once every thread
// passed the first barrier here (the tiles are dead after the KV loop). Not a
// static __shared__ variable: it would add to the dynamic size (v2 at
// head_dim 64 uses exactly the 48 KiB a launch gets without the opt-in, and
// 4 bytes more made every v2 launch fail with cudaErrorInvalidValue on an
// H100; the CPU emulation does not count static shared memory).
constexpr int kTailLseRegs = 4; // splits up to 128 (split_count's cap) merge from registers

// The merge of one packed row r of a tile (a warp; lane: columns lane +
// 32 j) from its splits' lse values lse_at(s) and partial columns
// o_at(s, j), wherever they are (L2 or the staged copy): the same weights
// and the same fmaf order over the splits either way.
// row: r's index in lse_part / o_part (split 0) and in p.lse.
template <typename T, int D, typename LseAt, typename OAt>
__device__ __forceinline__ void merge_row(const flash_params &p, const fp_flash::seq_view &S, int hk, int r,
                                          int64_t row, int lane, LseAt lse_at, OAt o_at) {
    const int qi = r / p.group, h = hk * p.group + r % p.group;
    const int ns = p.num_splits;
    float acc[D / 32];
#pragma unroll
    for (int j = 0; j < D / 32; ++j) acc[j] = 0.0f;
    float mx = -INFINITY, sum = 0.0f;
    if (ns <= 32 * kTailLseRegs) {
        // The row's lse values read once, kTailLseRegs per lane (split
        // lane + 32 i), all loads issued together: one L2 round trip
        // where re-reading them for the max, the sum and each split's
        // weight cost three (about 1 us of the tail on an H100).
        float ls[kTailLseRegs];
#pragma unroll
        for (int i = 0; i < kTailLseRegs; ++i) ls[i] = lane + 32 * i < ns ? lse_at(lane + 32 * i) : -INFINITY;
#pragma unroll
        for (int i = 0; i < kTailLseRegs; ++i) mx = fmaxf(mx, ls[i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float w[kTailLseRegs];
#pragma unroll
        for (int i = 0; i < kTailLseRegs; ++i) {
            // lse_s = -inf (no key in the split): weight 0; a NaN lse_s
            // (fmaxf skipped it) makes the row NaN. The same sum order
            // as the loop below (lane-strided, then the shuffles).
            w[i] = combine_weight(ls[i], mx);
            if (lane + 32 * i < ns) sum += w[i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        // each lane: columns lane + 32 j; split s's weight from lane s % 32;
        // the partial loads do not depend on the weights (unrolled by 16:
        // 16 splits x D / 32 loads in flight per lane)
#pragma unroll
        for (int i = 0; i < kTailLseRegs; ++i) {
            if (32 * i >= ns) break;
            const int n_i = ns - 32 * i < 32 ? ns - 32 * i : 32;
#pragma unroll 16
            for (int l = 0; l < n_i; ++l) {
                const float wl = __shfl_sync(0xffffffffu, w[i], l);
                const int s = 32 * i + l;
#pragma unroll
                for (int j = 0; j < D / 32; ++j) acc[j] = fmaf(wl, o_at(s, j), acc[j]);
            }
        }
    } else {
        for (int s = lane; s < ns; s += 32) mx = fmaxf(mx, lse_at(s));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        for (int s = lane; s < ns; s += 32) sum += combine_weight(lse_at(s), mx);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll 4
        for (int s = 0; s < ns; ++s) {
            const float w = combine_weight(lse_at(s), mx);
#pragma unroll
            for (int j = 0; j < D / 32; ++j) acc[j] = fmaf(w, o_at(s, j), acc[j]);
        }
    }
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    T *o = static_cast<T *>(p.o) + S.o0 + (int64_t)qi * p.o_ss + (int64_t)h * p.o_hs;
#pragma unroll
    for (int j = 0; j < D / 32; ++j) o[lane + j * 32] = pack_op<T>::cvt(acc[j] * inv);
    if (p.lse && lane == 0) p.lse[row] = combine_lse(mx, sum);
}

// The fused split combine (p.counters set, p.num_splits > 1), after a CTA
// wrote its split's partials for the packed rows [m0, rows_end) of its
// query tile: the CTA counts its arrival on the tile's counter, and the last
// of the tile's num_splits CTAs merges the tile's rows as
// attention_split_combine_v1 does (same weights, the same fmaf order over
// the splits; the row sums reduce over a warp instead of a block), then
// resets the counter to 0 for the next launch. One kernel instead of two:
// a launch less on the host (about 3 us on an H100) and no dependent
// kernel's start on the GPU. Every CTA of a tile reaches here or none does
// (the m0 >= rows exit is the same for all splits of a tile). Memory order:
// the CTA's partial stores are released by its arrival (a barrier, then
// thread 0's acq_rel atomic), the last CTA acquires the others' by the same
// atomic and reads the partials through L2 (__ldcg, or cp.async.cg), where
// the other SMs' stores are (FP_ATTN_MERGE_FENCE=sc: every thread's
// fence.sc.gpu before and after the arrival, as before session 14).
// `flag`: a word of the CTA's dynamic shared memory, free once every thread
// passed the first barrier here (the tiles are dead after the KV loop). Not a
// static __shared__ variable: it would add to the dynamic size (v2 at
// head_dim 64 uses exactly the 48 KiB a launch gets without the opt-in, and
// 4 bytes more made every v2 launch fail with cudaErrorInvalidValue on an
// H100; the CPU emulation does not count static shared memory).
//
// Staged (p.merge_staged, where the tile's rows x splits fit the kernel's
// kSmem bytes of dynamic shared memory past the flag): the merging CTA's
// threads copy every split's partial rows into shared memory with cp.async
// and load the lse values (four in flight a thread) at once, then one
// barrier: one L2 round trip for all of them, where the register path waits
// for the lse values' round trip, then one per 16 splits' partials (at 1024
// keys, 16 splits: two round trips become one; 32 splits, three; about a
// third of a microsecond each on an H100, of the ~2.5-3.7 us a merge took on
// an H200, session 41). kSmem 0: never (no room known).
constexpr size_t kMergeStageOff = 16; // past the flag word, 16-byte aligned

template <typename T, int D, int NT, size_t kSmem>
__device__ __forceinline__ void split_combine_fused(const flash_params &p, const fp_flash::seq_view &S, int b,
                                                    int hk, int m_tile, int m0, int rows_end, int *flag) {
    const int64_t tile = ((int64_t)b * p.hkv + hk) * p.m_tiles + m_tile;
    if (p.merge_release) {
        // The barrier orders every thread's partial stores before thread 0's
        // arrival at CTA scope; its acq_rel atomic releases them at GPU scope
        // (cumulative) and acquires the other CTAs' (the counter's RMW chain
        // carries their releases); the second barrier hands that on to the
        // threads of the last CTA, whose __ldcg reads go to L2. One fence by
        // one thread where the default path below has every thread run two
        // fence.sc.gpu.
        __syncthreads();
        fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_STORED);
        if (threadIdx.x == 0) *flag = fp_grid::arrive(p.counters + tile) == p.num_splits - 1;
        __syncthreads();
        if (!*flag) return; // CTA-uniform
    } else {
        __threadfence();
        __syncthreads();
        fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_STORED);
        if (threadIdx.x == 0) *flag = atomicAdd(p.counters + tile, 1) == p.num_splits - 1;
        __syncthreads();
        if (!*flag) return; // CTA-uniform
        __threadfence();
    }
    fp_cta::merged(p.cta_trace, p.b_off);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t rows_total = (int64_t)p.batch * p.hq * p.sq;
    const int ns = p.num_splits, nrows = rows_end - m0;
    const int64_t split_stride = rows_total * D;
    // row index (into lse_part / o_part of split 0) of the tile's packed row r
    auto row_of = [&](int r) {
        const int qi = r / p.group, h = hk * p.group + r % p.group;
        return ((int64_t)b * p.hq + h) * p.sq + qi;
    };
    const int64_t staged_bytes = (int64_t)ns * nrows * (D + 1) * (int64_t)sizeof(float);
    if (kSmem > 0 && p.merge_staged && staged_bytes + (int64_t)kMergeStageOff <= (int64_t)kSmem) { // CTA-uniform
        // [split][row][D] partials, then [split][row] lse values
        float *st_o = reinterpret_cast<float *>(reinterpret_cast<unsigned char *>(flag) + kMergeStageOff);
        float *st_l = st_o + (int64_t)ns * nrows * D;
        constexpr int CH = D / 4; // 16-byte chunks a row
        const int chunks = ns * nrows * CH, cells = ns * nrows;
        for (int idx = threadIdx.x; idx < chunks; idx += NT) {
            const int c = idx % CH, sr = idx / CH, r = sr % nrows, s = sr / nrows;
            cp_async16(smem_u32(st_o + (int64_t)sr * D + c * 4), p.o_part + s * split_stride + row_of(m0 + r) * D + c * 4,
                       true);
        }
        cp_async_commit();
        for (int base = threadIdx.x; base < cells; base += 4 * NT) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int i = base + u * NT;
                v[u] = i < cells ? __ldcg(p.lse_part + (int64_t)(i / nrows) * rows_total + row_of(m0 + i % nrows))
                                 : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (base + u * NT < cells) st_l[base + u * NT] = v[u];
        }
        cp_async_wait<0>();
        __syncthreads();
        for (int r = m0 + warp; r < rows_end; r += NT / 32) { // a warp per packed row
            const int rr = r - m0;
            merge_row<T, D>(
                p, S, hk, r, row_of(r), lane, [&](int s) { return st_l[s * nrows + rr]; },
                [&](int s, int j) { return st_o[((int64_t)s * nrows + rr) * D + lane + j * 32]; });
        }
    } else {
        for (int r = m0 + warp; r < rows_end; r += NT / 32) { // a warp per packed row
            const int64_t row = row_of(r);
            const float *lse_s = p.lse_part + row;
            const float *op = p.o_part + row * D + lane;
            merge_row<T, D>(
                p, S, hk, r, row, lane, [&](int s) { return __ldcg(lse_s + (int64_t)s * rows_total); },
                [&](int s, int j) { return __ldcg(op + (int64_t)s * split_stride + j * 32); });
        }
    }
    if (threadIdx.x == 0) p.counters[tile] = 0; // stream order publishes it to the next launch
}

// Q rows [m0, m0 + BR) of a (batch, KV head) into a swizzled tile: packed
// row r is query position r / group of head hk * group + r % group; rows
// past `rows` are zero-filled. All threads take part.
template <typename T, int D, int NT, int BR>
__device__ __forceinline__ void load_q_tile(T *q_smem, const flash_params &p, const fp_flash::seq_view &S, int hk,
                                            int m0, int rows, int tid) {
    constexpr int CH = D / 8;
    for (int idx = tid; idx < BR * CH; idx += NT) {
        const int r = idx / CH, c = idx % CH, gr = m0 + r;
        const bool ok = gr < rows;
        const T *src = static_cast<const T *>(p.q);
        if (ok)
            src += S.q0 + (int64_t)(gr / p.group) * p.q_ss + (int64_t)(hk * p.group + gr % p.group) * p.q_hs + c * 8;
        cp_async16(smem_u32(q_smem + swz<D>(r, c)), src, ok);
    }
}

// The element mask of one 16-row block's scores over NJ n8 key blocks from
// key n0: a score outside its row's kept keys becomes -inf. r0: the packed
// row of this lane's first C-fragment row (lane / 4 of the block).
// kRel (kTightRegs): each test against an immediate, the column's offset
// from this lane's first one (one subtraction and one unsigned compare per
// score, two registers per row: with every register taken by O and S, the
// absolute form's column values spilled).
template <int NJ, bool kRel = false>
__device__ __forceinline__ void mask_scores(float (*s)[4], const flash_params &p, const fp_flash::seq_view &S,
                                            int r0, int n0, int lane) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        int lo, hi;
        fp_flash::row_keys(r0 + 8 * e, p.group, S.L, S.sq, p.wl, p.wr, &lo, &hi);
        if constexpr (kRel) {
            // kept: 0 <= col - lo <= hi - lo, as one unsigned compare; a row
            // that keeps no key (hi < lo) masks every column (x - 2^31 > 0
            // for the x < 2^31 here)
            const bool none = hi < lo;
            const unsigned lo_rel = none ? 0x80000000u : (unsigned)(lo - (n0 + 2 * (lane & 3)));
            const unsigned span = none ? 0u : (unsigned)(hi - lo);
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    if ((unsigned)(j * 8 + c) - lo_rel > span) s[j][2 * e + c] = -INFINITY;
        } else {
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int col = n0 + j * 8 + 2 * (lane & 3) + c;
                    if (col < lo || col > hi) s[j][2 * e + c] = -INFINITY;
                }
        }
    }
}

// The A fragment of P V's k step kk (keys 16 kk .. 16 kk + 15): the S
// accumulators of n8 key blocks 2 kk and 2 kk + 1, packed to T.
template <typename T>
__device__ __forceinline__ void pack_p(const float (*s)[4], int kk, uint32_t pa[4]) {
    pa[0] = pack_op<T>::pack(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack_op<T>::pack(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack_op<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack_op<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// One online-softmax step of a 16-row block over NJ n8 key blocks, per row
// (e: rows g and g + 8 of the C fragment): the new max over the quad (the 4
// lanes that share a row), the scores replaced by P = exp2(s * scale_log2 -
// max * scale_log2), the row sum and O rescaled by exp2(old - new).
template <int NJ, int D>
__device__ __forceinline__ void online_softmax(float (*s)[4], float (*o)[4], float m_run[2], float l_run[2],
                                               float scale_log2) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        float mx = m_run[e];
#pragma unroll
        for (int j = 0; j < NJ; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * e], s[j][2 * e + 1]));
        mx = quad_max(mx);
        // a row with no key kept so far: keep exp2 arguments finite
        const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
        const float corr = fast_exp2(m_run[e] * scale_log2 - m_scaled);
        m_run[e] = mx;
        float rs = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const float p0 = fast_exp2(fmaf(s[j][2 * e], scale_log2, -m_scaled));
            const float p1 = fast_exp2(fmaf(s[j][2 * e + 1], scale_log2, -m_scaled));
            s[j][2 * e] = p0;
            s[j][2 * e + 1] = p1;
            rs += p0 + p1;
        }
        l_run[e] = l_run[e] * corr + rs;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            o[j][2 * e] *= corr;
            o[j][2 * e + 1] *= corr;
        }
    }
}

// The dynamic shared memory of flash_fwd_body's launch: the Q tile and the
// K / V stages (kKv8: and the e4m3 staging tiles of K and V, Bc x D bytes
// each).
template <typename T, int D, typename Tr, bool kKv8> constexpr size_t flash_smem_bytes() {
    return (size_t)(Tr::kBr + 2 * Tr::kStages * Tr::kBc) * fp_flash::smem_layout<D>::kPitch * sizeof(T) +
           (kKv8 ? 2 * (size_t)Tr::kBc * D : 0);
}

// The body of both versions; Tr = traits<D> (v1) or traits_v2<D> (v2).
// TK: K's and V's storage, T or kv8_t (an fp8 KV cache, v1 only: staged
// and widened, load_kv_tile8 / widen_kv_tile8; O x p.o_scale).
// grid: (m_tiles * num_splits, heads_kv, batch); block: kWarps * 32.
template <typename T, int D, typename Tr, typename TK = T>
__device__ __forceinline__ void flash_fwd_body(const flash_params &p) {
    constexpr bool kKv8 = kIsKv8<TK>;
    using Mma = mma_op<T>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, NT = Tr::kWarps * 32, MT = Tr::kMT;
    constexpr bool kTight = Tr::kTightRegs; // fp_flash::traits_v2<128>: see attention_flash_layout.h
    constexpr int RW = 16 * MT; // rows per warp
    static_assert(Br == RW * Tr::kWarps, "kMT 16-row MMA blocks per warp");
    constexpr int P = fp_flash::smem_layout<D>::kPitch; // tile row pitch (elements)
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *q_smem = reinterpret_cast<T *>(smem_raw); // [Br][P]
    T *k_smem = q_smem + Br * P;                 // [2][Bc][P]
    T *v_smem = k_smem + 2 * Bc * P;             // [2][Bc][P]
    // fp8 KV cache: one e4m3 staging tile each for K and V ([Bc][D] bytes)
    uint8_t *k8 = reinterpret_cast<uint8_t *>(v_smem + 2 * Bc * P);
    uint8_t *v8 = k8 + Bc * D;
    (void)k8;
    (void)v8;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    cta_work w;
    if (!cta_work_of(p, Br, Bc, p.b_off, w)) return; // CTA-uniform, before any barrier
    const int hk = w.hk, b = w.b, m0 = w.m0, rows = w.rows, L = w.S.L;
    const fp_flash::seq_view &S = w.S;
    const fp_flash::block_plan &plan = w.plan; // key tiles this CTA (and split) visits, the keys each row keeps
    const int s_begin = plan.s_begin, s_end = plan.s_end;

    // This thread's rows: g and g + 8 of each of its warp's 16-row blocks
    // (their key ranges are recomputed in the rare masked tiles rather than
    // held in registers through the loop).
    const int wrow = warp * RW; // first tile row of this warp
    // A warp whose rows are all padding (the last query tile; decode, where
    // seqlen_q * group < kBr) skips the math but still loads and syncs.
    const bool warp_active = m0 + wrow < rows;

    // Paged: the pools at this head and the sequence's block-table row.
    const int32_t *bt = p.block_table ? p.block_table + (int64_t)b * p.bt_stride : nullptr;
    const TK *k_base = static_cast<const TK *>(p.k) + (bt ? 0 : S.k0) + hk * p.k_hs;
    const TK *v_base = static_cast<const TK *>(p.v) + (bt ? 0 : S.v0) + hk * p.v_hs;
    // K or V tile of keys [n0, n0 + Bc) into a 16-bit stage (fp8: into its
    // staging tile k8 / v8, widened into `stage` by widen_kv_tile8 once landed)
    auto load_kv = [&](T *stage, uint8_t *staging, const TK *base, int64_t bs, int64_t ss, int n0) {
        if constexpr (kKv8)
            load_kv_tile8<D, NT, Bc>(staging, p, reinterpret_cast<const uint8_t *>(base), bs, ss, bt, n0, L - n0, tid);
        else
            load_kv_tile<T, D, NT, Bc, kTight>(stage, p, base, bs, ss, bt, n0, L - n0, tid);
    };
    auto load_k = [&](T *stage, int n0) { load_kv(stage, k8, k_base, p.k_bs, p.k_ss, n0); };
    auto load_v = [&](T *stage, int n0) { load_kv(stage, v8, v_base, p.v_bs, p.v_ss, n0); };

    float o_acc[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < D / 8; ++j) o_acc[mt][j][0] = o_acc[mt][j][1] = o_acc[mt][j][2] = o_acc[mt][j][3] = 0.0f;
    float m_run[MT][2], l_run[MT][2]; // running max of raw scores; this thread's part of the row sums
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        m_run[mt][0] = m_run[mt][1] = -INFINITY;
        l_run[mt][0] = l_run[mt][1] = 0.0f;
    }
    // Q A-fragments: kept in registers for the whole KV loop when they fit;
    // otherwise (D = 256, v2 at D = 128) re-read per k step from shared
    // memory, where Q stays for the CTA's lifetime.
    constexpr bool kQRegs = Tr::kQInRegisters;
    uint32_t q_frag[MT][kQRegs ? D / 16 : 1][4];
    // ldmatrix addresses: swz per k step, or under kTight a lane offset XOR
    // the step (fp_flash::ldsm_off: one LOP3 an ldmatrix; Q, K, V)
    [[maybe_unused]] uint32_t xoff[3] = {0, 0, 0};
    if constexpr (kTight) {
        xoff[0] = fp_flash::q_ldsm_off<D>(lane);
        xoff[1] = fp_flash::k_ldsm_off<D>(lane);
        xoff[2] = fp_flash::v_ldsm_off<D>(lane);
    }
    constexpr uint32_t kRowBytes = D * sizeof(T);
    // Q's 16-row block at tile row r0, K's key block np of a stage, V's k
    // step kk of a stage
    auto q_addr = [&](int r0, int kk) -> uint32_t {
        if constexpr (kTight) return smem_u32(q_smem) + r0 * kRowBytes + fp_flash::ldsm_step(xoff[0], kk);
        else return smem_u32(q_smem + swz<D>(fp_flash::q_ldsm_row(r0, lane), fp_flash::q_ldsm_chunk(kk, lane)));
    };
    auto k_addr = [&](const T *tile, int np, int kk) -> uint32_t {
        if constexpr (kTight) return smem_u32(tile) + np * 16 * kRowBytes + fp_flash::ldsm_step(xoff[1], kk);
        else return smem_u32(tile + swz<D>(fp_flash::k_ldsm_row(np, lane), fp_flash::k_ldsm_chunk(kk, lane)));
    };
    auto v_addr = [&](const T *tile, int kk, int dp) -> uint32_t {
        if constexpr (kTight) return smem_u32(tile) + kk * 16 * kRowBytes + fp_flash::ldsm_step(xoff[2], dp);
        else return smem_u32(tile + swz<D>(fp_flash::v_ldsm_row(kk, lane), fp_flash::v_ldsm_chunk(dp, lane)));
    };

    if (s_begin < s_end) {
        // Stage 0: Q (rows unpacked from the GQA group) and K[first] in one
        // group, V[first] in a second, so Q K^T can start before V lands.
        load_q_tile<T, D, NT, Br>(q_smem, p, S, hk, m0, rows, tid);
        load_k(k_smem, s_begin * Bc);
        cp_async_commit();
        load_v(v_smem, s_begin * Bc);
        cp_async_commit();

        cp_async_wait<1>(); // all but the newest group (V[first]): Q and K landed
        __syncthreads();
        fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_LANDED);
        if constexpr (kQRegs) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk)
                    ldmatrix_x4(q_frag[mt][kk], q_addr(wrow + mt * 16, kk));
        }

        for (int t = s_begin; t < s_end; ++t) {
            const int buf = (t - s_begin) & 1;
            const int n0 = t * Bc;
            const bool has_next = t + 1 < s_end;
            cp_async_wait<1>(); // all but the newest group (V[t]): K[t] landed
            if constexpr (kKv8) widen_kv_tile8<T, D, NT, Bc>(k_smem + buf * Bc * P, k8, tid); // this thread's chunks
            __syncthreads();

            // S = Q K^T: B fragments are K rows (keys) read non-transposed;
            // one ldmatrix.x4 feeds two n8 key blocks of every row block.
            float s_acc[MT][Bc / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < Bc / 8; ++j)
                    s_acc[mt][j][0] = s_acc[mt][j][1] = s_acc[mt][j][2] = s_acc[mt][j][3] = 0.0f;
            if (warp_active) {
                const T *k_tile = k_smem + buf * Bc * P;
                // With Q re-read from shared memory nothing is indexed by kk, so
                // a partial unroll bounds the live shared-memory addresses.
                constexpr int kUnrollK = kQRegs ? D / 16 : 2;
#pragma unroll kUnrollK
                for (int kk = 0; kk < D / 16; ++kk) {
                    const int qk = kQRegs ? kk : 0;
                    if constexpr (!kQRegs) {
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(q_frag[mt][0], q_addr(wrow + mt * 16, kk));
                    }
#pragma unroll
                    for (int np = 0; np < Bc / 16; ++np) {
                        uint32_t bf[4];
                        ldmatrix_x4(bf, k_addr(k_tile, np, kk));
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            Mma::run(s_acc[mt][2 * np], q_frag[mt][qk], bf[0], bf[1]);
                            Mma::run(s_acc[mt][2 * np + 1], q_frag[mt][qk], bf[2], bf[3]);
                        }
                    }
                }
            }

            // Prefetch K[t+1] into the other stage (its last reader, Q K^T of
            // t-1, finished before the barrier above). Always commit so the
            // group count stays fixed.
            if (has_next) load_k(k_smem + (buf ^ 1) * Bc * P, n0 + Bc);
            cp_async_commit();

            if (warp_active) {
                // Masks only on tiles crossing a row's range (edges, diagonal).
                if (fp_flash::tile_needs_mask(plan, n0, Bc)) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        mask_scores<Bc / 8, kTight>(s_acc[mt], p, S, m0 + wrow + mt * 16 + lane / 4, n0, lane);
                }
                if constexpr (!kTight) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        online_softmax<Bc / 8, D>(s_acc[mt], o_acc[mt], m_run[mt], l_run[mt], p.scale_log2);
                }
            }
            // kTight: every warp (a padding warp's zero scores are harmless:
            // its rows are never written), P packed to 16 bits here
            [[maybe_unused]] uint32_t p_frag[MT][kTight ? Bc / 16 : 1][4];
            if constexpr (kTight) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    online_softmax<Bc / 8, D>(s_acc[mt], o_acc[mt], m_run[mt], l_run[mt], p.scale_log2);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int kk = 0; kk < Bc / 16; ++kk) pack_p<T>(s_acc[mt], kk, p_frag[mt][kk]);
            }

            cp_async_wait<1>(); // all but K[t+1]: V[t] landed
            if constexpr (kKv8) widen_kv_tile8<T, D, NT, Bc>(v_smem + buf * Bc * P, v8, tid);
            __syncthreads();

            // O += P V: the S accumulator layout of two n8 key blocks is the
            // A fragment of one k16 step; V read with ldmatrix.trans gives
            // the col-major B fragment, shared by every row block.
            if (warp_active) {
                const T *v_tile = v_smem + buf * Bc * P;
#pragma unroll
                for (int kk = 0; kk < Bc / 16; ++kk) {
                    uint32_t pa[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        if constexpr (kTight) {
#pragma unroll
                            for (int i = 0; i < 4; ++i) pa[mt][i] = p_frag[mt][kk][i]; // packed after the softmax
                        } else {
                            pack_p<T>(s_acc[mt], kk, pa[mt]);
                        }
                    }
#pragma unroll
                    for (int dp = 0; dp < D / 16; ++dp) {
                        uint32_t bf[4];
                        ldmatrix_x4_trans(bf, v_addr(v_tile, kk, dp));
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            Mma::run(o_acc[mt][2 * dp], pa[mt], bf[0], bf[1]);
                            Mma::run(o_acc[mt][2 * dp + 1], pa[mt], bf[2], bf[3]);
                        }
                    }
                }
            }

            // Prefetch V[t+1] (its stage was last read by P V of t-1).
            if (has_next) load_v(v_smem + (buf ^ 1) * Bc * P, n0 + Bc);
            cp_async_commit();
        }
        cp_async_wait<0>();
        fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_LOOP, s_end - s_begin);
    }

    // Epilogue: row sums over the quad, normalize, write O (and lse) or the
    // split partials. Rows past `rows` are padding. kTight: the CTA's
    // coordinates derived again here (cta_work_of reads what it read at the
    // start) rather than held in registers through the KV loop.
    auto epilogue = [&](const cta_work &we) {
        const int m_tile = we.m_tile, split = we.split, hk = we.hk, b = we.b, m0 = we.m0, rows = we.rows;
        const fp_flash::seq_view &S = we.S;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float l = quad_sum(l_run[mt][e]);
                const int r = m0 + wrow + mt * 16 + lane / 4 + 8 * e;
                if (r >= rows) continue;
                const int qi = r / p.group, h = hk * p.group + r % p.group;
                // l == 0: no key kept (or all scores -inf); a NaN l (a NaN or
                // +inf score) stays NaN in O and lse, as in torch
                const float inv = (l == 0.0f ? 0.0f : 1.0f / l) * (kKv8 ? p.o_scale : 1.0f); // fp8: x v_descale
                const float lse =
                    l == 0.0f ? -INFINITY : (m_run[mt][e] * p.scale_log2 + __log2f(l)) * 0.69314718055994531f;
                const int col0 = 2 * (lane & 3);
                if (p.num_splits == 1) {
                    T *o = static_cast<T *>(p.o) + S.o0 + (int64_t)qi * p.o_ss + (int64_t)h * p.o_hs;
#pragma unroll
                    for (int j = 0; j < D / 8; ++j)
                        *reinterpret_cast<uint32_t *>(o + j * 8 + col0) =
                            pack_op<T>::pack(o_acc[mt][j][2 * e] * inv, o_acc[mt][j][2 * e + 1] * inv);
                    if (p.lse && (lane & 3) == 0) p.lse[((int64_t)b * p.hq + h) * p.sq + qi] = lse;
                } else {
                    const int64_t prow = (((int64_t)split * p.batch + b) * p.hq + h) * p.sq + qi;
                    float *o = p.o_part + prow * D;
#pragma unroll
                    for (int j = 0; j < D / 8; ++j)
                        *reinterpret_cast<float2 *>(o + j * 8 + col0) =
                            make_float2(o_acc[mt][j][2 * e] * inv, o_acc[mt][j][2 * e + 1] * inv);
                    if ((lane & 3) == 0) p.lse_part[prow] = lse;
                }
            }
        // the staged merge: not in the kernels at the register file's cap
        // (kTightRegs: v2 at head_dim 128)
        constexpr size_t kStage = Tr::kTightRegs ? 0 : flash_smem_bytes<T, D, Tr, kKv8>();
        if (p.num_splits > 1 && p.counters)
            split_combine_fused<T, D, NT, kStage>(p, S, b, hk, m_tile, m0, rows < m0 + Br ? rows : m0 + Br,
                                                  reinterpret_cast<int *>(smem_raw));
    };
    if constexpr (kTight) {
        cta_work again;
        cta_work_of(p, Br, Bc, p.b_off, again);
        epilogue(again);
    } else {
        epilogue(w);
    }
}

// The decode kernel (v6; fp_flash::traits_decode): 16 packed query rows per
// CTA, each 64-key tile split over the 4 warps (warp w: keys 16 w .. 16 w +
// 15 of the tile), K / V through a ring of kStages tiles. Every warp keeps
// its own online softmax over its keys (the same fragments and exp2 steps as
// flash_fwd_body); after the KV loop the four (max, sum, O) states merge
// through shared memory, and the result is written as flash_fwd_body writes
// it (O and lse, or the split partials and the fused combine).
// TK = kv8_t (an fp8 KV cache): the ring holds e4m3 tiles ([ST][K, V][Bc][D]
// bytes) and each warp copies, widens (into one 16-bit K / V tile after the
// ring) and reads only its own 16 keys of a tile, so past the first tile
// (Q) the warps meet no barrier until the merge; O x p.o_scale.
// grid: (m_tiles * num_splits, heads_kv, batch); block: 128.
template <typename T, int D> constexpr size_t decode_smem_bytes(bool kv8) {
    using Tr = fp_flash::traits_decode<D>;
    constexpr size_t P = fp_flash::smem_layout<D>::kPitch;
    return kv8 ? (Tr::kBr * P + 2 * Tr::kBc * P) * sizeof(T) + (size_t)Tr::kStages * 2 * Tr::kBc * D
               : (Tr::kBr + 2 * Tr::kStages * Tr::kBc) * P * sizeof(T);
}
template <typename T, int D, typename TK = T>
__device__ __forceinline__ void decode_fwd_body(const flash_params &p) {
    using Tr = fp_flash::traits_decode<D>;
    using Mma = mma_op<T>;
    constexpr bool kKv8 = kIsKv8<TK>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, NW = Tr::kWarps, NT = NW * 32, ST = Tr::kStages;
    static_assert(Br == 16 && Bc == 16 * NW, "one 16-row block; 16 keys per warp and tile");
    constexpr int P = fp_flash::smem_layout<D>::kPitch;
    constexpr int RP = D + 8; // merge rows (f32): float2 stores of 4 rows x 4 lanes per 32 banks
    static_assert(decode_smem_bytes<T, D>(kKv8) >= (size_t)NW * Br * (RP + 2) * sizeof(float),
                  "the merge fits in the dead ring");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *q_smem = reinterpret_cast<T *>(smem_raw); // [Br][P]
    T *ring = q_smem + Br * P;                   // [ST][K, V][Bc][P]; fp8: the 16-bit K, V tiles [2][Bc][P]
    uint8_t *ring8 = reinterpret_cast<uint8_t *>(ring + 2 * Bc * P); // fp8: [ST][K, V][Bc][D] bytes
    (void)ring8;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    cta_work w;
    if (!cta_work_of(p, Br, Bc, p.b_off, w)) return; // CTA-uniform, before any barrier
    const int m_tile = w.m_tile, split = w.split, hk = w.hk, b = w.b, m0 = w.m0, rows = w.rows, L = w.S.L;
    const fp_flash::seq_view &S = w.S;
    const fp_flash::block_plan &plan = w.plan;
    const int s_begin = plan.s_begin, s_end = plan.s_end;
    const int32_t *bt = p.block_table ? p.block_table + (int64_t)b * p.bt_stride : nullptr;
    const TK *k_base = static_cast<const TK *>(p.k) + (bt ? 0 : S.k0) + hk * p.k_hs;
    const TK *v_base = static_cast<const TK *>(p.v) + (bt ? 0 : S.v0) + hk * p.v_hs;
    // Tile t's K and V into ring stage st: all threads, or (fp8) each warp
    // its own 16 keys as e4m3 (load_kv_tile8 over a warp)
    auto load_stage = [&](int st, int t) {
        if constexpr (kKv8) {
            uint8_t *s8 = ring8 + (size_t)st * 2 * Bc * D + warp * 16 * D;
            const int n0 = t * Bc + warp * 16;
            load_kv_tile8<D, 32, 16>(s8, p, reinterpret_cast<const uint8_t *>(k_base), p.k_bs, p.k_ss, bt, n0,
                                     L - n0, lane);
            load_kv_tile8<D, 32, 16>(s8 + Bc * D, p, reinterpret_cast<const uint8_t *>(v_base), p.v_bs, p.v_ss, bt,
                                     n0, L - n0, lane);
        } else {
            T *sp = ring + st * 2 * Bc * P;
            load_kv_tile<T, D, NT, Bc>(sp, p, k_base, p.k_bs, p.k_ss, bt, t * Bc, L - t * Bc, tid);
            load_kv_tile<T, D, NT, Bc>(sp + Bc * P, p, v_base, p.v_bs, p.v_ss, bt, t * Bc, L - t * Bc, tid);
        }
    };

    float o_acc[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    constexpr bool kQRegs = Tr::kQInRegisters;
    uint32_t q_frag[kQRegs ? D / 16 : 1][4];

    if (s_begin < s_end) {
        // Group 0: Q and tile s_begin; groups 1 .. ST - 2: the next tiles
        // (empty groups past s_end keep the count fixed).
        load_q_tile<T, D, NT, Br>(q_smem, p, S, hk, m0, rows, tid);
#pragma unroll 1
        for (int i = 0; i < ST - 1; ++i) {
            const int t = s_begin + i;
            if (t < s_end) load_stage(i, t);
            cp_async_commit();
        }

#pragma unroll 1
        for (int t = s_begin; t < s_end; ++t) {
            const int i = t - s_begin;
            cp_async_wait<ST - 2>(); // groups 0 .. i landed: tile t (and Q)
            if constexpr (kKv8) {    // this warp's keys of tile t, widened where it reads them
                __syncwarp();        // its reads of tile t - 1 there are done
                const uint8_t *s8 = ring8 + (size_t)(i % ST) * 2 * Bc * D + warp * 16 * D;
                widen_kv_tile8<T, D, 32, 16>(ring + warp * 16 * P, s8, lane);
                widen_kv_tile8<T, D, 32, 16>(ring + Bc * P + warp * 16 * P, s8 + Bc * D, lane);
                __syncwarp();
            }
            // everyone's copies visible; tile t - 1's stage free (fp8: only Q,
            // at the first tile, is shared between warps)
            if (!kKv8 || i == 0) __syncthreads();
            if (i == 0) fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_LANDED);
            if (kQRegs && i == 0) {
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk)
                    ldmatrix_x4(q_frag[kQRegs ? kk : 0], smem_u32(q_smem + swz<D>(fp_flash::q_ldsm_row(0, lane),
                                                                                 fp_flash::q_ldsm_chunk(kk, lane))));
            }
            {
                const int tn = t + ST - 1; // into the stage tile t - 1 used
                if (tn < s_end) load_stage((i + ST - 1) % ST, tn);
                cp_async_commit();
            }
            const T *k_tile = kKv8 ? ring : ring + (i % ST) * 2 * Bc * P;
            const T *v_tile = k_tile + Bc * P;

            // S = Q K^T over this warp's 16 keys (key block `warp` of the tile).
            float s_acc[2][4];
#pragma unroll
            for (int j = 0; j < 2; ++j) s_acc[j][0] = s_acc[j][1] = s_acc[j][2] = s_acc[j][3] = 0.0f;
            constexpr int kUnrollK = kQRegs ? D / 16 : 2;
#pragma unroll kUnrollK
            for (int kk = 0; kk < D / 16; ++kk) {
                if constexpr (!kQRegs)
                    ldmatrix_x4(q_frag[0], smem_u32(q_smem + swz<D>(fp_flash::q_ldsm_row(0, lane),
                                                                    fp_flash::q_ldsm_chunk(kk, lane))));
                uint32_t bf[4];
                ldmatrix_x4(bf, smem_u32(k_tile + swz<D>(fp_flash::k_ldsm_row(warp, lane),
                                                         fp_flash::k_ldsm_chunk(kk, lane))));
                Mma::run(s_acc[0], q_frag[kQRegs ? kk : 0], bf[0], bf[1]);
                Mma::run(s_acc[1], q_frag[kQRegs ? kk : 0], bf[2], bf[3]);
            }

            const int n0 = t * Bc + warp * 16; // this warp's first key
            if (fp_flash::tile_needs_mask(plan, n0, 16)) mask_scores<2>(s_acc, p, S, m0 + lane / 4, n0, lane);
            online_softmax<2, D>(s_acc, o_acc, m_run, l_run, p.scale_log2); // this warp's keys

            // O += P V over the same 16 keys: P's two n8 blocks are one k16 A fragment.
            uint32_t pa[4];
            pa[0] = pack_op<T>::pack(s_acc[0][0], s_acc[0][1]);
            pa[1] = pack_op<T>::pack(s_acc[0][2], s_acc[0][3]);
            pa[2] = pack_op<T>::pack(s_acc[1][0], s_acc[1][1]);
            pa[3] = pack_op<T>::pack(s_acc[1][2], s_acc[1][3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t bf[4];
                ldmatrix_x4_trans(bf, smem_u32(v_tile + swz<D>(fp_flash::v_ldsm_row(warp, lane),
                                                               fp_flash::v_ldsm_chunk(dp, lane))));
                Mma::run(o_acc[2 * dp], pa, bf[0], bf[1]);
                Mma::run(o_acc[2 * dp + 1], pa, bf[2], bf[3]);
            }
        }
        cp_async_wait<0>();
        fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_LOOP, s_end - s_begin);
    }

    // The warps' states into the dead ring: O unnormalized [NW][Br][RP], then
    // each row's max (raw score) and sum [NW][Br].
    __syncthreads(); // every warp is past its last tile read
    float *red_o = reinterpret_cast<float *>(smem_raw);
    float *red_m = red_o + NW * Br * RP;
    float *red_l = red_m + NW * Br;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int r = lane / 4 + 8 * e;
        float *orow = red_o + (warp * Br + r) * RP + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<float2 *>(orow + j * 8) = make_float2(o_acc[j][2 * e], o_acc[j][2 * e + 1]);
        const float l = quad_sum(l_run[e]);
        if ((lane & 3) == 0) {
            red_m[warp * Br + r] = m_run[e];
            red_l[warp * Br + r] = l;
        }
    }
    __syncthreads();

    // Merge: 8 threads per row, D / 8 columns each. Warp w's weight is
    // exp2((m_w - M) * scale_log2), M the row's max over the warps (a warp
    // without a kept key: m_w = -inf, weight 0; M = +inf, a +inf score: NaN).
    {
        constexpr int CW = D / 8;
        const int r = tid / 8, c0 = (tid % 8) * CW;
        float mw[NW], mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            mw[w] = red_m[w * Br + r];
            mx = fmaxf(mx, mw[w]);
        }
        const float m_scaled = mx == -INFINITY ? 0.0f : mx * p.scale_log2;
        float wt[NW], l = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            wt[w] = fast_exp2(mw[w] * p.scale_log2 - m_scaled);
            l = fmaf(wt[w], red_l[w * Br + r], l);
        }
        const int gr = m0 + r;
        if (gr < rows) {
            const int qi = gr / p.group, h = hk * p.group + gr % p.group;
            // l == 0: no key kept; a NaN l stays NaN in O and lse (as flash_fwd_body)
            const float inv = (l == 0.0f ? 0.0f : 1.0f / l) * (kKv8 ? p.o_scale : 1.0f); // fp8: x v_descale
            const float lse = l == 0.0f ? -INFINITY : (m_scaled + __log2f(l)) * 0.69314718055994531f;
            float acc[CW];
#pragma unroll
            for (int c = 0; c < CW; ++c) {
                float s = 0.0f;
#pragma unroll
                for (int w = 0; w < NW; ++w) s = fmaf(wt[w], red_o[(w * Br + r) * RP + c0 + c], s);
                acc[c] = s * inv;
            }
            if (p.num_splits == 1) {
                T *o = static_cast<T *>(p.o) + S.o0 + (int64_t)qi * p.o_ss + (int64_t)h * p.o_hs + c0;
#pragma unroll
                for (int c = 0; c < CW; c += 2)
                    *reinterpret_cast<uint32_t *>(o + c) = pack_op<T>::pack(acc[c], acc[c + 1]);
                if (p.lse && tid % 8 == 0) p.lse[((int64_t)b * p.hq + h) * p.sq + qi] = lse;
            } else {
                const int64_t prow = (((int64_t)split * p.batch + b) * p.hq + h) * p.sq + qi;
                float *o = p.o_part + prow * D + c0;
#pragma unroll
                for (int c = 0; c < CW; c += 2) *reinterpret_cast<float2 *>(o + c) = make_float2(acc[c], acc[c + 1]);
                if (tid % 8 == 0) p.lse_part[prow] = lse;
            }
        }
    }
    // The fused combine's flag is word 0 of the merge buffer: its first
    // barrier comes before the flag is written, after every read above.
    if (p.num_splits > 1 && p.counters)
        split_combine_fused<T, D, NT, decode_smem_bytes<T, D>(kKv8)>(p, S, b, hk, m_tile, m0,
                                                                    rows < m0 + Br ? rows : m0 + Br,
                                                                    reinterpret_cast<int *>(smem_raw));
}

template <typename T, int D, typename TK = T>
__global__ void __launch_bounds__(traits<D>::kWarps * 32, 2)
    attention_flash_fwd_v1(const __grid_constant__ flash_params p) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
    fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_START);
    flash_fwd_body<T, D, traits<D>, TK>(p);
    fp_cta::end(p.cta_trace, p.b_off);
    fp_stamp::end(p.stamp);
}

template <typename T, int D>
__global__ void __launch_bounds__(traits_v2<D>::kWarps * 32, 2)
    attention_flash_fwd_v2(const __grid_constant__ flash_params p) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
    fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_START);
    flash_fwd_body<T, D, traits_v2<D>>(p);
    fp_cta::end(p.cta_trace, p.b_off);
    fp_stamp::end(p.stamp);
}

// v2's earlier 128 x 32 tile at head_dim 128 (fp_flash::traits_v2_narrow),
// for the A/B: FP_ATTN_V2_TILE=128x32 (v2_tile_narrow).
template <typename T, int D>
__global__ void __launch_bounds__(fp_flash::traits_v2_narrow<D>::kWarps * 32, 2)
    attention_flash_fwd_v2n(const __grid_constant__ flash_params p) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
    fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_START);
    flash_fwd_body<T, D, fp_flash::traits_v2_narrow<D>>(p);
    fp_cta::end(p.cta_trace, p.b_off);
    fp_stamp::end(p.stamp);
}

// v1's body over 8 warps (fp_flash::traits_w8): one CTA of 256 threads per
// SM (v1's registers per thread).
template <typename T, int D>
__global__ void __launch_bounds__(fp_flash::traits_w8<D>::kWarps * 32, 1)
    attention_flash_fwd_v7(const __grid_constant__ flash_params p) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
    fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_START);
    flash_fwd_body<T, D, fp_flash::traits_w8<D>>(p);
    fp_cta::end(p.cta_trace, p.b_off);
    fp_stamp::end(p.stamp);
}

// The decode kernel: two CTAs per SM up to head_dim 128 (100 KiB of shared
// memory at 128 on an H100), one at 256.
template <typename T, int D, typename TK = T>
__global__ void __launch_bounds__(fp_flash::traits_decode<D>::kWarps * 32, D <= 128 ? 2 : 1)
    attention_decode_fwd_v6(const __grid_constant__ flash_params p) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
    fp_cta::mark(p.cta_trace, p.b_off, FP_CTA_START);
    decode_fwd_body<T, D, TK>(p);
    fp_cta::end(p.cta_trace, p.b_off);
    fp_stamp::end(p.stamp);
}

// Version V of the flash kernel: its traits and entry point.
template <typename T, int D, int V> struct flash_version;
template <typename T, int D> struct flash_version<T, D, 1> {
    using Tr = traits<D>;
    static constexpr void (*kernel)(flash_params) = attention_flash_fwd_v1<T, D>;
};
template <typename T, int D> struct flash_version<T, D, 2> {
    using Tr = traits_v2<D>;
    static constexpr void (*kernel)(flash_params) = attention_flash_fwd_v2<T, D>;
};
// (FP_ATTN_V2_NARROW: v2 with its earlier tile; launches record v2)
constexpr int kV2Narrow = FP_ATTN_V2_NARROW;
template <typename T, int D> struct flash_version<T, D, kV2Narrow> {
    using Tr = fp_flash::traits_v2_narrow<D>;
    static constexpr void (*kernel)(flash_params) = attention_flash_fwd_v2n<T, D>;
};
template <typename T, int D> struct flash_version<T, D, 7> {
    using Tr = fp_flash::traits_w8<D>;
    static constexpr void (*kernel)(flash_params) = attention_flash_fwd_v7<T, D>;
};
template <typename T, int D> struct flash_version<T, D, 6> {
    using Tr = fp_flash::traits_decode<D>;
    static constexpr void (*kernel)(flash_params) = attention_decode_fwd_v6<T, D>;
};

// Version V's kernel, or with TK = kv8_t (an fp8 KV cache) v1's or v6's
// fp8 form.
template <typename T, int D, int V, typename TK> constexpr auto flash_kernel() {
    if constexpr (kIsKv8<TK>) {
        static_assert(V == 1 || V == 6, "the fp8 KV cache runs on v1 and v6");
        if constexpr (V == 6) return attention_decode_fwd_v6<T, D, TK>;
        else return attention_flash_fwd_v1<T, D, TK>;
    } else {
        return flash_version<T, D, V>::kernel;
    }
}

template <typename T, int D, int V = 1, typename TK = T>
fp_status launch_flash(const fp_attn_args *a, int num_splits, cudaStream_t stream) {
    using Tr = typename flash_version<T, D, V>::Tr;
    flash_params p = make_flash_params(a, Tr::kBr, num_splits);
    // batch > 65535 (grid.z) runs as several launches (b_off), so that a large
    // batch (e.g. many short varlen sequences) is not refused
    if ((int64_t)p.m_tiles * num_splits > 2147483647LL || a->heads_kv > 65535)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention: grid too large (m_tiles %d x splits %d, heads_kv %d)",
                            p.m_tiles, num_splits, a->heads_kv);
    // fp8 KV cache: v1 + the e4m3 staging tiles of K and V (Bc x D bytes
    // each); v6 its own layout (decode_smem_bytes)
    const size_t smem = V == 6 ? decode_smem_bytes<T, D>(kIsKv8<TK>) : flash_smem_bytes<T, D, Tr, kIsKv8<TK>>();
    constexpr auto kernel = flash_kernel<T, D, V, TK>();
    FP_TRY(smem_opt_in<kernel>(smem));
    cta_trace_for(a, p, (int64_t)p.m_tiles * num_splits * a->heads_kv * a->batch);
    return run_with_partials<T, D>(a, p, stream, kIsKv8<TK> ? "attention flash (fp8 KV cache)" : "attention flash",
                                   true, [&](flash_params &q) {
        cudaError_t err = cudaSuccess;
        for (int64_t b0 = 0; b0 < a->batch && err == cudaSuccess; b0 += 65535) {
            q.b_off = (int)b0;
            const int nb = (int)(a->batch - b0 < 65535 ? a->batch - b0 : 65535);
            dim3 grid((unsigned)(q.m_tiles * num_splits), (unsigned)a->heads_kv, (unsigned)nb);
            err = launch_smem<kernel>(grid, Tr::kWarps * 32, smem, stream, pdl_of(a), q);
        }
        return err;
    });
}

// FP_ATTN_V2_TILE=128x32 (read once): v2 at head_dim 128 with its earlier
// 128 x 32 tile instead of 128 x 64 (the GPU check's A/B, session 29).
static bool v2_tile_narrow() {
    static const bool v = [] {
        const char *e = getenv("FP_ATTN_V2_TILE");
        return e && strcmp(e, "128x32") == 0;
    }();
    return v;
}

template <typename T>
fp_status dispatch_v2(const fp_attn_args *a, int num_splits, cudaStream_t stream) {
    switch (a->head_dim) {
    case 64: return launch_flash<T, 64, 2>(a, num_splits, stream);
    case 128:
        return v2_tile_narrow() ? launch_flash<T, 128, kV2Narrow>(a, num_splits, stream)
                                : launch_flash<T, 128, 2>(a, num_splits, stream);
    default: break;
    }
    return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v2: head_dim %d not instantiated (64, 128)",
                        a->head_dim);
}

// Versions instantiated at every head dim: 1, 6 (the decode kernel) and 7
// (v1 over 8 warps).
template <typename T, int V>
fp_status dispatch_all_dims(const fp_attn_args *a, int num_splits, cudaStream_t stream) {
    switch (a->head_dim) {
    case 32: return launch_flash<T, 32, V>(a, num_splits, stream);
    case 64: return launch_flash<T, 64, V>(a, num_splits, stream);
    case 96: return launch_flash<T, 96, V>(a, num_splits, stream);
    case 128: return launch_flash<T, 128, V>(a, num_splits, stream);
    case 256: return launch_flash<T, 256, V>(a, num_splits, stream);
    default: break;
    }
    return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: head_dim %d not instantiated", V,
                        a->head_dim);
}

// An fp8 KV cache (a->kv_fp8_cache): v1 at head_dim 64, 128 and 256, f16 /
// bf16 Q. Recorded as v1 by the caller.
template <int V>
fp_status flash_kv8_dims(const fp_attn_args *a, int num_splits, cudaStream_t stream) {
    const bool bf = a->dtype == FP_BF16;
    switch (a->head_dim) {
    case 64: return bf ? launch_flash<__nv_bfloat16, 64, V, kv8_t>(a, num_splits, stream)
                       : launch_flash<__half, 64, V, kv8_t>(a, num_splits, stream);
    case 128: return bf ? launch_flash<__nv_bfloat16, 128, V, kv8_t>(a, num_splits, stream)
                        : launch_flash<__half, 128, V, kv8_t>(a, num_splits, stream);
    case 256: return bf ? launch_flash<__nv_bfloat16, 256, V, kv8_t>(a, num_splits, stream)
                        : launch_flash<__half, 256, V, kv8_t>(a, num_splits, stream);
    default: break;
    }
    return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: an fp8 KV cache at head_dim %d (64, 128, 256)",
                        V, a->head_dim);
}
fp_status flash_kv8(const fp_attn_args *a, int version, int num_splits, cudaStream_t stream) {
    if (version != 1 && version != 6)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: an fp8 KV cache runs on v1 and v6 only",
                            version);
    if (a->dtype != FP_BF16 && a->dtype != FP_F16)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: an fp8 KV cache under %s Q (f16, bf16)",
                            version, fp_dtype_name(a->dtype));
    return version == 6 ? flash_kv8_dims<6>(a, num_splits, stream) : flash_kv8_dims<1>(a, num_splits, stream);
}

// An sm_80-path version (1, 2, 6, 7 or FP_ATTN_V2_NARROW) with num_splits KV splits, recorded
// for fp_attention_last_kernel when it launched.
fp_status flash_sm80(const fp_attn_args *a, int version, int num_splits, cudaStream_t stream) {
    if (num_splits < 1 || num_splits > 1024)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "num_splits %d out of [1, 1024]", num_splits);
    const bool bf = a->dtype == FP_BF16;
    if (a->kv_fp8_cache) {
        const fp_status st = flash_kv8(a, version, num_splits, stream);
        if (st == FP_OK) fp_attn_note_kernel(a, version, num_splits);
        return st;
    }
    if (!bf && a->dtype != FP_F16)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: dtype %s (f16, bf16%s)", version,
                            fp_dtype_name(a->dtype),
                            a->dtype == FP_FP8_E4M3 ? "; fp8 e4m3 runs on the Hopper kernels v5 / v8" : "");
    fp_status st;
    switch (version) {
    case 1: st = bf ? dispatch_all_dims<__nv_bfloat16, 1>(a, num_splits, stream)
                    : dispatch_all_dims<__half, 1>(a, num_splits, stream); break;
    case 2: st = bf ? dispatch_v2<__nv_bfloat16>(a, num_splits, stream) : dispatch_v2<__half>(a, num_splits, stream);
        break;
    case kV2Narrow:
        st = a->head_dim != 128 ? fp_set_error(FP_ERR_UNSUPPORTED,
                                               "attention flash kernel v2 (128 x 32 tile): head_dim %d (128 only)",
                                               a->head_dim)
             : bf               ? launch_flash<__nv_bfloat16, 128, kV2Narrow>(a, num_splits, stream)
                                : launch_flash<__half, 128, kV2Narrow>(a, num_splits, stream);
        break;
    case 6: st = bf ? dispatch_all_dims<__nv_bfloat16, 6>(a, num_splits, stream)
                    : dispatch_all_dims<__half, 6>(a, num_splits, stream); break;
    default: st = bf ? dispatch_all_dims<__nv_bfloat16, 7>(a, num_splits, stream)
                     : dispatch_all_dims<__half, 7>(a, num_splits, stream); break;
    }
    if (st == FP_OK) fp_attn_note_kernel(a, version == kV2Narrow ? 2 : version, num_splits);
    return st;
}

} // namespace

// v5's wide tile (FP_ATTN_V5_WIDE) where it takes the call: head_dim 128,
// 16-bit Q / K / V, no paged KV; `version` as asked, or with
// FP_ATTN_V5_TILE=128x176 (read once) any v5 call it takes.
static bool v5_wide(const fp_attn_args *a, int version) {
    static const bool env = [] {
        const char *e = getenv("FP_ATTN_V5_TILE");
        return e && strcmp(e, "128x176") == 0;
    }();
    if (version != FP_ATTN_V5_WIDE && !(version == 5 && env)) return false;
    return a->head_dim == 128 && (a->dtype == FP_BF16 || a->dtype == FP_F16) && !a->block_table &&
           !a->kv_fp8_cache;
}

extern "C" fp_status fp_attn_cuda_flash_version(const fp_attn_args *a, int version, int num_splits,
                                                cudaStream_t stream) {
    // the TMA-store epilogue and v9's early draws: passed on to the TMA kernels
    const int o_tma = version & FP_ATTN_O_TMA, early = version & FP_ATTN_V9_EARLY;
    version &= ~(FP_ATTN_O_TMA | FP_ATTN_V9_EARLY);
    if (o_tma && version != 5 && version != 8 && version != 9 && version != 10 && version != FP_ATTN_V5_WIDE)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "FP_ATTN_O_TMA with flash kernel version %d (the TMA-store epilogue is v5's, v8's, v9's "
                            "and v10's)",
                            version);
    if (early && version != 9)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "FP_ATTN_V9_EARLY with flash kernel version %d (the ticket draw is v9's)", version);
    if (version == 1) return fp_attn_cuda_flash_splits(a, num_splits, stream);
    if (version == 5 && v5_wide(a, version)) version = FP_ATTN_V5_WIDE;
    const int vn = version == FP_ATTN_V5_WIDE ? 5 : version; // the version messages and records name
    if (a->kv_fp8_cache && vn >= 2 && vn <= 10 && vn != 6) // no other kernel reads e4m3 K / V under a 16-bit Q
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d: an fp8 KV cache runs on v1 and v6 only (the Hopper kernels "
                            "take it widened first, when preferred: FP_CTX_ATTENTION_KERNEL)",
                            vn);
    if ((vn >= 3 && vn <= 5) || (vn >= 8 && vn <= 10)) { // Hopper kernels (attention_flash_sm90.cu, _tma_sm90.cu)
#ifdef FASTPATH_HAVE_SM90A
        const fp_status st = fp_attn_cuda_flash_sm90(a, version | o_tma | early, num_splits, stream);
        if (st == FP_OK) fp_attn_note_kernel(a, vn, num_splits);
        return st;
#else
        return fp_set_error(FP_ERR_UNSUPPORTED, "flash kernel version %d needs an sm_90a build (90 was not among "
                                                "CMAKE_CUDA_ARCHITECTURES)", vn);
#endif
    }
    if (version != 2 && version != 6 && version != 7 && version != kV2Narrow)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "flash kernel version %d (1 to 10)", version);
    return flash_sm80(a, version, num_splits, stream);
}

extern "C" int fp_attn_cuda_flash_supported(fp_dtype dtype, int head_dim) {
    if (dtype == FP_FP8_E4M3) return head_dim == 128; // v5 / v8 on Hopper (fp_attn_cuda_flash)
    return (dtype == FP_F16 || dtype == FP_BF16) &&
           (head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256);
}

extern "C" int fp_attn_cuda_flash_kv8_supported(int head_dim) {
    return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

extern "C" fp_status fp_attn_cuda_flash_splits(const fp_attn_args *a, int num_splits, cudaStream_t stream) {
    return flash_sm80(a, 1, num_splits, stream);
}

// Split the keys when the grid would leave SMs idle (decode, few heads):
// as many splits as keep the whole grid resident in one wave (two CTAs per SM:
// registers / shared memory of traits<D> at D >= 64), at least
// split_min_tiles() KV tiles per split, at most 128 splits. Rounding the split
// count up instead overshoots the resident slots (e.g. 32 KV heads:
// ceil(264 / 32) = 9 splits = 288 CTAs for 264 slots), and the 24-CTA second
// wave, too few to saturate HBM, costs about as long as the first. The count
// is then trimmed so that no split is empty (plan_block hands out
// ceil(tiles / splits) tiles per split).
//
// Tiles per split: a split of one tile issues Q, K and V together and waits
// on one DRAM round trip; each further tile adds a K and a V load behind the
// previous tile's math. A short decode (batch 1, 8 KV heads, 1024 keys:
// 16 tiles) ran 8 splits of 2 tiles on 64 of 132 SMs; one tile per split
// runs 16 splits on 128. FP_ATTN_SPLIT_MIN_TILES (read once, 1 to 64) sets
// the minimum for the GPU check's A/B; 2 was the rule before.
static int split_min_tiles() {
    static const int v = [] {
        const char *e = getenv("FP_ATTN_SPLIT_MIN_TILES");
        const int n = e ? atoi(e) : 0;
        return n >= 1 && n <= 64 ? n : 1;
    }();
    return v;
}

static int64_t split_count(const fp_attn_args *a, int br, int bc, int64_t slots) {
    const int64_t rows = (int64_t)a->seqlen_q * a->group;
    const int64_t ctas = (rows + br - 1) / br * a->heads_kv * a->batch;
    const int64_t kv_tiles = (a->seqlen_k + bc - 1) / bc;
    const int64_t min_tiles = split_min_tiles();
    int64_t splits = 1;
    if (ctas < slots && kv_tiles >= 2 * min_tiles) {
        splits = slots / ctas; // >= 1: ctas < slots
        if (splits > kv_tiles / min_tiles) splits = kv_tiles / min_tiles;
        if (splits > 128) splits = 128;
        if (splits < 1) splits = 1;
        const int64_t per_split = (kv_tiles + splits - 1) / splits;
        splits = (kv_tiles + per_split - 1) / per_split; // no empty split
    }
    return splits;
}

#ifdef FASTPATH_HAVE_SM90A
// The Hopper default's TMA kernel for a call, tried before v3 (varlen
// without total_k, layouts TMA cannot describe): head_dim 64 v10 (three
// consumer warpgroups), which ran 1.22-1.40x faster than v8 non-causal and
// 1.06-1.31x causal (H200, session 41: 1k / 4k / 16k keys; 481-527 TFLOP/s
// at 4k-16k non-causal); head_dim 128 v5. v10 refuses what v8 refuses at
// 64 (the same checks).
static int hopper_tma_default(const fp_attn_args *a) { return a->head_dim == 64 ? 10 : 5; }
#endif

// The default kernel (v1): its tile of head_dim's traits, two CTAs per SM.
static fp_status flash_v1_auto(const fp_attn_args *a, int sm_count, cudaStream_t stream) {
    int br = traits<64>::kBr, bc = traits<64>::kBc;
    switch (a->head_dim) {
    case 32: br = traits<32>::kBr; bc = traits<32>::kBc; break;
    case 96: br = traits<96>::kBr; bc = traits<96>::kBc; break;
    case 128: br = traits<128>::kBr; bc = traits<128>::kBc; break;
    case 256: br = traits<256>::kBr; bc = traits<256>::kBc; break;
    default: break;
    }
    const int64_t slots = 2 * (int64_t)(sm_count > 0 ? sm_count : 1);
    return fp_attn_cuda_flash_splits(a, (int)split_count(a, br, bc, slots), stream);
}

// The decode kernel takes calls of at most this many packed query rows per
// (batch, KV head) when preferred (4 of its 16-row query tiles: a decode
// step, speculative decoding's few queries); past it each CTA's K / V reads
// would be repeated over more query tiles than v1's 64-row tiles need, and
// the default kernel runs instead (fp_attention_last_kernel says so).
constexpr int64_t kDecodeMaxRows = 64;

// A numbered version with the split count fp_attn_cuda_flash picks for it:
// v2 128 x 32/64 tiles at two CTAs per SM, v3-v5 128 x 128 at one
// (conservative: v3 at head_dim 64 fits two), v6 16 x 64 at two (one at
// head_dim 256: its grid then runs in two waves where it would fill both),
// v7 128 x 64 (x 32 at 256) at one, v8 and v9 as v5, v10 192 x 128 at one.
static fp_status flash_version_auto(const fp_attn_args *a, int version, int sm_count, cudaStream_t stream) {
    const int sm = sm_count > 0 ? sm_count : 1;
    int64_t splits;
    if (version == 2)
        splits = split_count(a, traits_v2<128>::kBr,
                             a->head_dim == 64   ? traits_v2<64>::kBc
                             : v2_tile_narrow() ? fp_flash::traits_v2_narrow<128>::kBc
                                                : traits_v2<128>::kBc,
                             2 * (int64_t)sm);
    else if (version == 6) {
        if ((int64_t)a->seqlen_q * a->group > kDecodeMaxRows)
            return fp_set_error(FP_ERR_UNSUPPORTED,
                                "decode kernel v6: %lld packed query rows per KV head (seqlen_q %d x group %d) "
                                "above its %lld",
                                (long long)a->seqlen_q * a->group, a->seqlen_q, a->group, (long long)kDecodeMaxRows);
        splits = split_count(a, fp_flash::traits_decode<64>::kBr, fp_flash::traits_decode<64>::kBc, 2 * (int64_t)sm);
    } else if (version == 7)
        splits = split_count(a, fp_flash::traits_w8<64>::kBr, a->head_dim == 256 ? traits<256>::kBc : traits<64>::kBc,
                             sm);
    else if (version == 10)
        splits = split_count(a, 192, 128, sm);
    else if (v5_wide(a, version))
        splits = split_count(a, 128, 176, sm);
    else
        splits = split_count(a, 128, 128, sm);
    return fp_attn_cuda_flash_version(a, version, (int)splits, stream);
}

// FP_ATTN_KV8_WIDEN=1 (read once): the automatic choice widens an fp8 KV
// cache for the Hopper kernels (flash_kv8_widened) on the calls it would
// give them with a 16-bit cache (prefill shapes: a full 128-row query tile
// per (batch, KV head), head_dim 64 / 128), instead of v1. Off by default
// until a GPU run has timed it (fastbench attention/kv8_prefill).
static bool kv8_widen_env() {
    static const bool v = env_is("FP_ATTN_KV8_WIDEN", "1");
    return v;
}
#ifdef FASTPATH_HAVE_SM90A // the Hopper kernels' builds (fp_attn_cuda_flash calls these for cc 9.0 only)
// The widened copy's limit in bytes: FP_ATTN_KV8_WIDEN_MAX_MB (read once,
// MiB, >= 1), 1024 by default. A call needing more runs v1.
static int64_t kv8_widen_max_bytes() {
    static const int64_t v = [] {
        const char *e = getenv("FP_ATTN_KV8_WIDEN_MAX_MB");
        const long long n = e ? atoll(e) : 0;
        return (n >= 1 && n <= (1LL << 30) ? n : 1024LL) << 20;
    }();
    return v;
}

// Whether an fp8 cache can be widened for `version` (0: the Hopper default
// order), and the copy's rows; FP_ERR_UNSUPPORTED (nothing launched) when
// not: a Q other than f16 / bf16, head_dim other than 64 / 128 (v10: 64),
// varlen without total_k, K / V not readable by 16-byte loads (base or a
// stride not a multiple of 16 bytes), a copy above kv8_widen_max_bytes().
static fp_status kv8_widen_check(const fp_attn_args *a, int version, int64_t *rows) {
    const char *why = nullptr;
    if (a->dtype != FP_BF16 && a->dtype != FP_F16) why = "a Q other than f16 / bf16";
    else if (a->head_dim != 64 && a->head_dim != 128) why = "a head_dim other than 64 / 128";
    else if (version == 10 && a->head_dim != 64) why = "v10 at a head_dim other than 64";
    else if (a->cu_k && a->total_k <= 0) why = "varlen (cu_seqlens) without total_k";
    if (why)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention: an fp8 KV cache widened for the Hopper kernels: %s", why);
    const bool paged = a->block_table != nullptr, batched = paged || (!a->cu_k && a->batch > 1);
    const void *base[2] = {a->k, a->v};
    const int64_t bs[2] = {a->k_bs, a->v_bs}, ss[2] = {a->k_ss, a->v_ss}, hs[2] = {a->k_hs, a->v_hs};
    for (int t = 0; t < 2; ++t)
        if (reinterpret_cast<uintptr_t>(base[t]) % 16 || ss[t] % 16 || (a->heads_kv > 1 && hs[t] % 16) ||
            (batched && bs[t] % 16))
            return fp_set_error(FP_ERR_UNSUPPORTED,
                                "attention: an fp8 KV cache widened for the Hopper kernels: %s not read by 16-byte "
                                "loads (base %% 16 = %d; seq / head / %s strides %lld / %lld / %lld bytes: "
                                "multiples of 16)",
                                t ? "V" : "K", (int)(reinterpret_cast<uintptr_t>(base[t]) % 16),
                                paged ? "page" : "batch", (long long)ss[t], (long long)hs[t], (long long)bs[t]);
    const int64_t n = a->cu_k ? a->total_k : (int64_t)a->batch * a->seqlen_k;
    const int64_t bytes = n * 2 * a->heads_kv * a->head_dim * 2; // K and V, 2-byte elements
    if (n < 1 || n / kWidenRows >= 2147483647LL || bytes > kv8_widen_max_bytes())
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention: an fp8 KV cache widened for the Hopper kernels: %lld rows (%lld MiB widened; "
                            "FP_ATTN_KV8_WIDEN_MAX_MB: %lld)",
                            (long long)n, (long long)(bytes >> 20), (long long)(kv8_widen_max_bytes() >> 20));
    *rows = n;
    return FP_OK;
}

template <typename T>
static cudaError_t launch_kv8_widen(const fp_attn_args *a, int64_t rows, void *k16, void *v16, cudaStream_t stream) {
    widen_params w;
    w.src[0] = static_cast<const uint8_t *>(a->k);
    w.src[1] = static_cast<const uint8_t *>(a->v);
    w.bs[0] = a->k_bs; w.ss[0] = a->k_ss; w.hs[0] = a->k_hs;
    w.bs[1] = a->v_bs; w.ss[1] = a->v_ss; w.hs[1] = a->v_hs;
    w.dst[0] = k16;
    w.dst[1] = v16;
    w.seqlens_k = a->cu_k ? nullptr : a->seqlens_k;
    w.block_table = a->block_table;
    w.rows = rows;
    w.sk = a->seqlen_k > 0 ? a->seqlen_k : 1;
    w.hkv = a->heads_kv;
    w.d = a->head_dim;
    w.varlen = a->cu_k != nullptr;
    w.bt_stride = a->bt_stride;
    w.page_size = a->page_size > 0 ? a->page_size : 1;
    w.num_pages = a->num_pages;
    w.stamp = a->stamp;
    const dim3 grid((unsigned)((rows + kWidenRows - 1) / kWidenRows), 2);
    return fp_pdl::launch<attention_kv8_widen_v0<T>>(grid, dim3(kWidenThreads), 0, stream, pdl_of(a), w);
}

// An fp8 KV cache on a Hopper kernel: widened into the stream's aux scratch
// (fp_ctx_scratch_get_aux: the kernel's launch takes split partials and v9's
// tickets from the workspace itself), then `version` (3, 4, 5, 8, 9, 10; 0:
// v8 at head_dim 64, v5 at 128, v3 where those refuse) on the dense 16-bit
// copy with the call's scale (k_descale folded in) and O x v_descale
// (p.o_scale, applied by the Hopper epilogues). fp_attention_last_kernel
// names that kernel, paged as the call was. FP_ERR_UNSUPPORTED from
// kv8_widen_check before any launch; a kernel refusing after the widening
// (not expected: the copy is a layout every Hopper kernel takes) too, the
// widening then wasted.
static fp_status flash_kv8_widened(const fp_attn_args *a, int version, int sm_count, cudaStream_t stream) {
    int64_t rows = 0;
    FP_TRY(kv8_widen_check(a, version, &rows));
    const size_t one = (size_t)rows * a->heads_kv * a->head_dim * 2;
    fp_scratch s = {nullptr, nullptr, nullptr, nullptr, 0};
    FP_TRY(fp_ctx_scratch_get_aux(a->ctx, stream, 2 * one, "attention (fp8 KV cache widened)", &s));
    void *k16 = s.ptr, *v16 = static_cast<char *>(s.ptr) + one;
    const cudaError_t e = a->dtype == FP_BF16 ? launch_kv8_widen<__nv_bfloat16>(a, rows, k16, v16, stream)
                                              : launch_kv8_widen<__half>(a, rows, k16, v16, stream);
    fp_status st;
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = fp_set_error(FP_ERR_CUDA, "attention (fp8 KV cache widened): launch: %s", cudaGetErrorString(e));
    } else {
        fp_attn_args w = *a;
        w.kv_fp8_cache = 0;
        w.kv_dtype = a->dtype;
        w.k = k16;
        w.v = v16;
        w.k_hs = w.v_hs = a->head_dim;
        w.k_ss = w.v_ss = (int64_t)a->heads_kv * a->head_dim;
        w.k_bs = w.v_bs = a->cu_k ? 0 : (int64_t)a->seqlen_k * a->heads_kv * a->head_dim;
        w.block_table = nullptr;
        w.bt_stride = w.page_size = w.num_pages = 0;
        if (version) {
            st = flash_version_auto(&w, version, sm_count, stream);
        } else {
            const int order[2] = {hopper_tma_default(a), 3};
            st = FP_ERR_UNSUPPORTED;
            for (int i = 0; i < 2 && st == FP_ERR_UNSUPPORTED; ++i) st = flash_version_auto(&w, order[i], sm_count, stream);
        }
        fp_attention_kernel_info k;
        if (st == FP_OK && fp_attention_last_kernel(&k) == FP_OK) fp_attn_note_kernel(a, k.version, k.num_splits);
    }
    const fp_status put = fp_ctx_scratch_put(&s); // stream-ordered: the kernels above still read the copy
    return st != FP_OK ? st : put;
}
#endif // FASTPATH_HAVE_SM90A

extern "C" fp_status fp_attn_cuda_flash(const fp_attn_args *a, int version, int sm_count, int cc,
                                        cudaStream_t stream) {
    // fp8 (e4m3) runs on v5, or v8 when preferred, at one split: no other
    // kernel takes it, so a refusal is the call's answer (no fallback).
    if (a->dtype == FP_FP8_E4M3) {
        (void)sm_count;
        if (version != 0 && version != 5 && version != 8)
            fp_attn_note_fallback("fp8 e4m3 runs on the Hopper kernels v5 / v8 only");
#ifdef FASTPATH_HAVE_SM90A
        if (cc != 90)
            return fp_set_error(FP_ERR_UNSUPPORTED,
                                "attention: fp8 e4m3 inputs need a compute capability 9.0 device (Hopper; this "
                                "device is %d.%d)",
                                cc / 10, cc % 10);
        return fp_attn_cuda_flash_version(a, version == 8 ? 8 : 5, 1, stream);
#else
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention: fp8 e4m3 inputs need an sm_90a build (90 was not among "
                                                "CMAKE_CUDA_ARCHITECTURES) and a Hopper device");
#endif
    }
    // An fp8 KV cache runs on v1 (every device from compute capability 8.0),
    // or the decode kernel v6 when preferred (calls of at most 64 packed
    // rows); another preferred version falls back to v1, as for a shape it
    // refuses.
    if (a->kv_fp8_cache) {
        // widened for a Hopper kernel (flash_kv8_widened): preferred (3, 4,
        // 5, 8, 9, 10), or by the automatic choice under FP_ATTN_KV8_WIDEN=1
        // on the prefill calls the Hopper default takes with a 16-bit cache
        const bool hopper_pref = (version >= 3 && version <= 5) || (version >= 8 && version <= 10);
        const bool auto_widen = version == 0 && kv8_widen_env() && (a->head_dim == 64 || a->head_dim == 128) &&
                                (int64_t)a->seqlen_q * a->group >= 128;
        if (hopper_pref || auto_widen) {
#ifdef FASTPATH_HAVE_SM90A
            if (cc == 90) {
                fp_error_saved saved;
                fp_error_save(&saved);
                const fp_status st = flash_kv8_widened(a, version, sm_count, stream);
                if (st != FP_ERR_UNSUPPORTED) return st;
                if (hopper_pref) fp_attn_note_fallback(fp_last_error());
                fp_error_restore(&saved);
            } else if (hopper_pref) {
                fp_attn_note_fallback("an fp8 KV cache is widened for the Hopper kernels on a compute capability "
                                      "9.0 device only");
            }
#else
            if (hopper_pref)
                fp_attn_note_fallback("an fp8 KV cache is widened for the Hopper kernels in sm_90a builds only");
#endif
            return flash_v1_auto(a, sm_count, stream);
        }
        if (version == 6) {
            fp_error_saved saved;
            fp_error_save(&saved);
            const fp_status st = flash_version_auto(a, 6, sm_count, stream);
            if (st != FP_ERR_UNSUPPORTED) return st;
            fp_attn_note_fallback(fp_last_error());
            fp_error_restore(&saved);
        } else if (version == 2 || version == 7) {
            fp_attn_note_fallback("an fp8 KV cache runs on v1 and v6 (and widened on the Hopper kernels), not v2 / v7");
        }
        return flash_v1_auto(a, sm_count, stream);
    }
    if (version >= 2 && version <= 10) {
        // A preferred version (FP_CTX_ATTENTION_KERNEL), where it supports the call.
        fp_error_saved saved; // a refusal then v1's success must not leave a message
        fp_error_save(&saved);
        fp_status st = flash_version_auto(a, version, sm_count, stream);
        if (st != FP_ERR_UNSUPPORTED) return st;
        // this shape / build / device: the default choice below instead
        // (e.g. v5 on Hopper for the prefill calls of a context that prefers
        // the decode kernel), and fp_attention_last_kernel says why
        fp_attn_note_fallback(fp_last_error());
        fp_error_restore(&saved);
        version = 0;
    }
#ifdef FASTPATH_HAVE_SM90A
    // The default on Hopper (compute capability 9.0, sm_90a builds), chosen
    // from the first GPU run (H200, 2026-11-26, benchmarks/NOTES.md): v5 (TMA
    // + mbarrier ring) ran 2.3-3.6x faster than v1 on every prefill shape
    // measured (head_dim 64 / 128, seqlen 4k / 16k, causal and not; 602-661
    // TFLOP/s at head_dim 128 non-causal), v3 1.65-2.1x. So: v5, else v3
    // where v5 refuses (varlen without total_k, K / V layouts TMA cannot
    // describe), else v1
    // (paged KV, other head dims, other devices answer FP_ERR_UNSUPPORTED).
    // At head_dim 64, v8 (v5 with its consumer warpgroups taking turns) ran
    // 1.08-1.14x faster than v5 on every shape measured (H100, session 20:
    // seqlen 4k / 16k, causal and not), and v10 (three consumer warpgroups)
    // 1.06-1.40x faster than v8 (H200, session 41): v10 there
    // (hopper_tma_default); at 128 v8 ran 0.98-1.01x v5, so v5 stays.
    // Only with at least one full 128-row tile per (batch, KV head): decode
    // (a few query rows) keeps v1's 64-row tiles and split-KV, measured there.
    // What the Hopper kernels refuse for any layout (another device, other
    // head dims) is ruled out here, so such calls do not pay two refusals
    // per call on their way to v1. Paged KV (page sizes that are multiples
    // of 8: a page's rows are whole TMA boxes) goes the same way: the TMA
    // kernels ran 2.45-4.65x faster than v1's page gather on every paged
    // prefill measured (H200, session 41, ab-pprefill: 4 x 4096 over 4096
    // and 4 x 1024 over 8192, pages of 16 and 64, head_dim 64 / 128,
    // causal), within 0.87-1.04x of the same kernel on a dense cache. v3
    // takes no paged cache: v1 after a refusal.
    if (version == 0 && cc == 90 && (!a->block_table || a->page_size % 8 == 0) &&
        (a->head_dim == 64 || a->head_dim == 128) && (int64_t)a->seqlen_q * a->group >= 128) {
        const int order[2] = {hopper_tma_default(a), 3};
        fp_error_saved saved;
        fp_error_save(&saved);
        for (int v : order) {
            if (v == 3 && a->block_table) break;
            fp_status st = flash_version_auto(a, v, sm_count, stream);
            if (st != FP_ERR_UNSUPPORTED) return st;
        }
        fp_error_restore(&saved);
    }
#endif
    return flash_v1_auto(a, sm_count, stream);
}
