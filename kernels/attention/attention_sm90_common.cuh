// What the Hopper flash kernels share: version 3 / 4 (cp.async,
// attention_flash_sm90.cu) and version 5 (TMA producer warpgroup,
// attention_flash_tma_sm90.cu) run the same per-warpgroup math: the PTX
// wrappers (cp.async, proxy fence, wgmma and its fences / waits), the wgmma
// shapes both use, the row masks, the online softmax, the O rescale, the
// packing of P into wgmma's register A fragment, the Q K^T and P V stages
// and the epilogue (normalize, write O and lse or the split partials).
// Each kernel file keeps its own kernel body, schedule and launcher.
// sm_90a only (wgmma): included only by the *_sm90.cu sources, which are
// compiled for arch 90a alone (see the top-level CMakeLists.txt).
// Internal linkage like attention_flash_common.cuh: each translation unit
// gets its own copy. Index math: attention_sm90_layout.h (shared with the
// emulation tests, which model the hardware independently of this file).
#ifndef FP_ATTENTION_SM90_COMMON_CUH
#define FP_ATTENTION_SM90_COMMON_CUH

#include <atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <type_traits>

#include "attention/attention_flash_common.cuh"
#include "attention/attention_flash_layout.h"
#include "attention/attention_internal.h"
#include "attention/attention_sm90_layout.h"
#include "common/cp_async.cuh"
#if defined(FP_CUDA_EMU) // the CPU emulation (tests/emu) of the PTX wrappers below
#include "emu_cp_async.h"
#include "emu_sm90.h"
#endif

namespace {

// ---- PTX wrappers (sm_90a) -------------------------------------------------

// smem_u32, cp.async of 16 bytes (pred false zero-fills: rows past the
// sequence end stay finite), its commit and wait: kernels/common/cp_async.cuh.
using fp_cp::cp_async16;
using fp_cp::cp_async_commit;
using fp_cp::cp_async_wait;
using fp_cp::smem_u32;
// cp.async writes shared memory through the generic proxy, wgmma reads it
// through the async proxy: each writer fences after its copies landed and
// before the barrier that publishes them to the warpgroups.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(FP_CUDA_EMU)
    fp_emu::fence_proxy_async();
#else
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Orders this thread's earlier register writes (accumulators, A fragments)
// before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() {
#if defined(FP_CUDA_EMU)
    fp_emu::wgmma_fence();
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(FP_CUDA_EMU)
    fp_emu::wgmma_commit_group();
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
#if defined(FP_CUDA_EMU)
    fp_emu::wgmma_wait_group(N);
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// After wgmma_wait: an empty asm that "redefines" each accumulator, so the
// compiler cannot move a read of it above the wait (the wgmma asm statement
// itself "wrote" it when it was issued).
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N]) {
#if !defined(FP_CUDA_EMU) // a compiler barrier only: the emulation's wgmmas write at the wait
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
#endif
}

// Every wgmma below: f32 accumulate; operands after the descriptors are
// scale-d (a predicate, here the constant 1: D += A B; the S accumulators
// are zeroed first, which ptxas folds into the first HGMMA), imm-scale-a,
// imm-scale-b (1: no negation), then imm-trans-a (shared-memory A only) and
// imm-trans-b (1 for V: MN-major). fp8 (e4m3): m64nNk32, no transpose
// operands (the ISA takes K-major A and B only: V comes as V^T, see
// fp_sm90::vt_key).
// One wgmma's k extent for element type T: 16 (16-bit), 32 (8-bit).
template <typename T> __host__ __device__ constexpr int wgmma_k() { return sizeof(T) == 1 ? 32 : 16; }
// The shared-memory layout's width in 16-bit columns (attention_sm90_layout.h
// and attention_tma_sm90.h count tiles in 16-bit elements): a row of D
// elements of T is D sizeof(T) bytes, the row of a 16-bit tile of D_L
// columns. fp8 at head_dim 128: 64 (one 128-byte swizzle span a row).
template <typename T, int D> __host__ __device__ constexpr int layout_cols() { return D * (int)sizeof(T) / 2; }
template <typename T> __device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b);
template <typename T> __device__ __forceinline__ void wgmma_ss_n176(float (&d)[88], uint64_t desc_a, uint64_t desc_b);
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b);

// The specializations, one macro per shape: the PTX strings spell every
// operand (%0 .. the descriptors) as before; FP_SM90_D32 / FP_SM90_D64 are
// the accumulator operand lists "+f"(d[0]) .. "+f"(d[N / 2 - 1]).
#define FP_SM90_D8(i)                                                                                                  \
    "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]),        \
        "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define FP_SM90_D32 FP_SM90_D8(0), FP_SM90_D8(8), FP_SM90_D8(16), FP_SM90_D8(24)
#define FP_SM90_D64 FP_SM90_D32, FP_SM90_D8(32), FP_SM90_D8(40), FP_SM90_D8(48), FP_SM90_D8(56)
#define FP_SM90_D88 FP_SM90_D64, FP_SM90_D8(64), FP_SM90_D8(72), FP_SM90_D8(80)
#define FP_SM90_ACC32                                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FP_SM90_ACC64                                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FP_SM90_ACC88                                                                                                  \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                          \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                 \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                                 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                                 \
    "%80, %81, %82, %83, %84, %85, %86, %87}"

// D[64 x 176] (+)= A[64 x 16] (shared, K-major) * B[16 x 176] (shared,
// K-major): v5's wide tile (176 keys).
#define FP_SM90_WGMMA_SS_N176(T, TY)                                                                                   \
    template <>                                                                                                        \
    __device__ __forceinline__ void wgmma_ss_n176<T>(float(&d)[88], uint64_t desc_a, uint64_t desc_b) {                \
        asm volatile("{\n"                                                                                             \
                     "wgmma.mma_async.sync.aligned.m64n176k16.f32." TY "." TY " " FP_SM90_ACC88                        \
                     ", %88, %89, 1, 1, 1, 0, 0;\n"                                                                    \
                     "}\n"                                                                                             \
                     : FP_SM90_D88                                                                                     \
                     : "l"(desc_a), "l"(desc_b));                                                                      \
    }
// D[64 x 128] (+)= A[64 x 16] (shared, K-major) * B[16 x 128] (shared, K-major).
#define FP_SM90_WGMMA_SS_N128(T, TY)                                                                                   \
    template <>                                                                                                        \
    __device__ __forceinline__ void wgmma_ss_n128<T>(float(&d)[64], uint64_t desc_a, uint64_t desc_b) {                \
        asm volatile("{\n"                                                                                             \
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " FP_SM90_ACC64                        \
                     ", %64, %65, 1, 1, 1, 0, 0;\n"                                                                    \
                     "}\n"                                                                                             \
                     : FP_SM90_D64                                                                                     \
                     : "l"(desc_a), "l"(desc_b));                                                                      \
    }
// D[64 x N] += A[64 x 16] (registers) * B[16 x N] (shared, MN-major: transpose
// bit). A_DESC: the operand numbers of A's four registers and of desc_b.
#define FP_SM90_WGMMA_RS(T, TY, N, ACC, D_OPS, A_DESC)                                                                 \
    template <>                                                                                                        \
    __device__ __forceinline__ void wgmma_rs<T, N>(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t desc_b) {         \
        asm volatile("{\n"                                                                                             \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " ACC ", " A_DESC                   \
                     ", 1, 1, 1, 1;\n"                                                                                 \
                     "}\n"                                                                                             \
                     : D_OPS                                                                                           \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));                                       \
    }
#if defined(FP_CUDA_EMU) // the same operands, to the emulated wgmma (tests/emu/emu_sm90.h)
template <typename T> __device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    fp_emu::wgmma_mma_async(d, 128, fp_emu::wgmma_type<T>(), desc_a, nullptr, 0, desc_b, 0,
                            sizeof(T) == 1 ? "wgmma.mma_async.m64n128k32.e4m3 (A, B shared)"
                                           : "wgmma.mma_async.m64n128k16 (A, B shared)");
}
template <typename T> __device__ __forceinline__ void wgmma_ss_n176(float (&d)[88], uint64_t desc_a, uint64_t desc_b) {
    static_assert(sizeof(T) == 2, "16-bit types only");
    fp_emu::wgmma_mma_async(d, 176, fp_emu::wgmma_type<T>(), desc_a, nullptr, 0, desc_b, 0,
                            "wgmma.mma_async.m64n176k16 (A, B shared)");
}
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b) {
    fp_emu::wgmma_mma_async(d, N, fp_emu::wgmma_type<T>(), 0, a, 0, desc_b, sizeof(T) == 1 ? 0 : 1,
                            sizeof(T) == 1 ? "wgmma.mma_async.m64n128k32.e4m3 (A registers, B shared K-major)"
                            : N == 64      ? "wgmma.mma_async.m64n64k16 (A registers, B shared MN-major)"
                                           : "wgmma.mma_async.m64n128k16 (A registers, B shared MN-major)");
}
#else
FP_SM90_WGMMA_SS_N128(__nv_bfloat16, "bf16")
FP_SM90_WGMMA_SS_N128(__half, "f16")
FP_SM90_WGMMA_SS_N176(__nv_bfloat16, "bf16")
FP_SM90_WGMMA_SS_N176(__half, "f16")
FP_SM90_WGMMA_RS(__nv_bfloat16, "bf16", 64, FP_SM90_ACC32, FP_SM90_D32, "{%32, %33, %34, %35}, %36")
FP_SM90_WGMMA_RS(__half, "f16", 64, FP_SM90_ACC32, FP_SM90_D32, "{%32, %33, %34, %35}, %36")
FP_SM90_WGMMA_RS(__nv_bfloat16, "bf16", 128, FP_SM90_ACC64, FP_SM90_D64, "{%64, %65, %66, %67}, %68")
FP_SM90_WGMMA_RS(__half, "f16", 128, FP_SM90_ACC64, FP_SM90_D64, "{%64, %65, %66, %67}, %68")
// e4m3: D[64 x 128] (+)= A[64 x 32] (shared, K-major) * B[32 x 128] (shared,
// K-major), and A from registers (4 x 4 bytes) with B = V^T (K-major).
template <>
__device__ __forceinline__ void wgmma_ss_n128<__nv_fp8_e4m3>(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile("{\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FP_SM90_ACC64 ", %64, %65, 1, 1, 1;\n"
                 "}\n"
                 : FP_SM90_D64
                 : "l"(desc_a), "l"(desc_b));
}
template <>
__device__ __forceinline__ void wgmma_rs<__nv_fp8_e4m3, 128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile("{\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FP_SM90_ACC64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
                 "}\n"
                 : FP_SM90_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
#endif
#undef FP_SM90_WGMMA_RS
#undef FP_SM90_WGMMA_SS_N128
#undef FP_SM90_WGMMA_SS_N176
#undef FP_SM90_ACC88
#undef FP_SM90_D88
#undef FP_SM90_ACC64
#undef FP_SM90_ACC32
#undef FP_SM90_D64
#undef FP_SM90_D32
#undef FP_SM90_D8

// What the softmax of one warpgroup's thread needs to know about its rows.
struct row_ctx {
    int row0;          // packed row of this thread's accumulator row h = 0 (h = 1: + 8)
    int group, L, sq, wl, wr;
    float scale_log2;
    fp_flash::block_plan plan;
};

// Scores of keys outside a row's range -> -inf; only on tiles that cross
// some row's range (edges, diagonal): the check is CTA-uniform.
template <int Bc> __device__ __forceinline__ void mask_tile(float (&s)[Bc / 2], const row_ctx &c, int n0, int lane) {
    if (!fp_flash::tile_needs_mask(c.plan, n0, Bc)) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        int lo, hi;
        fp_flash::row_keys(c.row0 + 8 * h, c.group, c.L, c.sq, c.wl, c.wr, &lo, &hi);
#pragma unroll
        for (int j = 0; j < Bc / 8; ++j)
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                const int col = n0 + fp_sm90::acc_col(lane, 4 * j + 2 * h + x);
                if (col < lo || col > hi) s[4 * j + 2 * h + x] = -INFINITY;
            }
    }
}

// Online softmax of one tile, in place: the 4 lanes of a quad share a row
// (registers 4 j + 2 h + x, all j, x, are row h of this thread); new max
// over the quad, s becomes P = exp2(s * scale_log2 - max * scale_log2), the
// row sum is rescaled, and corr[h] is the factor O's row h must be
// multiplied by before P V of this tile is added.
template <int Bc>
__device__ __forceinline__ void softmax_tile(float (&s)[Bc / 2], float (&m_run)[2], float (&l_run)[2],
                                             float (&corr)[2], float scale_log2) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float mx = m_run[h];
#pragma unroll
        for (int j = 0; j < Bc / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
        mx = quad_max(mx);
        // a row with no key kept so far: keep exp2 arguments finite
        const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
        corr[h] = fast_exp2(m_run[h] * scale_log2 - m_scaled);
        m_run[h] = mx;
        float rs = 0.0f;
#pragma unroll
        for (int j = 0; j < Bc / 8; ++j)
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                const float e = fast_exp2(fmaf(s[4 * j + 2 * h + x], scale_log2, -m_scaled));
                s[4 * j + 2 * h + x] = e;
                rs += e;
            }
        l_run[h] = l_run[h] * corr[h] + rs;
    }
}

template <int D> __device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&corr)[2]) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            o[4 * j + 2 * h] *= corr[h];
            o[4 * j + 2 * h + 1] *= corr[h];
        }
}

// P of keys 16 kk .. 16 kk + 15 (S accumulators in pairs) is the register
// A fragment of P V's k step kk (attention_sm90_layout.h). fp8: k step kk
// covers keys 32 kk .. 32 kk + 31; register r packs the 4 accumulators
// fp_sm90::p8_src(kk, r, 0..3) (byte 0 lowest), rounded to e4m3 (round to
// nearest even, saturating: P <= 1 never saturates). Those are the keys
// fp_sm90::vt_key names for the register's k slots, which is why V^T's
// columns are stored in that order (fp8_transpose_v).
template <typename T, int Bc>
__device__ __forceinline__ void pack_p(uint32_t (&p)[Bc / wgmma_k<T>()][4], const float (&s)[Bc / 2]) {
    if constexpr (sizeof(T) == 1) {
#pragma unroll
        for (int kk = 0; kk < Bc / 32; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(
                    make_float2(s[fp_sm90::p8_src(kk, r, 0)], s[fp_sm90::p8_src(kk, r, 1)]), __NV_SATFINITE, __NV_E4M3);
                const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
                    make_float2(s[fp_sm90::p8_src(kk, r, 2)], s[fp_sm90::p8_src(kk, r, 3)]), __NV_SATFINITE, __NV_E4M3);
                p[kk][r] = (uint32_t)lo | (uint32_t)hi << 16; // .x in the low byte of each pair
            }
    } else {
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
            for (int r = 0; r < 4; ++r)
                p[kk][r] = pack_op<T>::pack(s[fp_sm90::p_src(kk, r)], s[fp_sm90::p_src(kk, r) + 1]);
    }
}

// S = Q K^T for the warpgroup's 64 rows x 128 keys (NS = 64 accumulators a
// thread; 88: 176 keys, v5's wide tile): issued, not waited.
template <typename T, int D, int NS>
__device__ __forceinline__ void issue_qk(float (&s)[NS], uint32_t q_smem, int q_rows, int wrow, uint32_t k_tile,
                                         int k_rows) {
    static_assert(NS == 64 || (NS == 88 && sizeof(T) == 2), "m64n128 (any type) or m64n176 (16-bit) Q K^T");
#pragma unroll
    for (int i = 0; i < NS; ++i) s[i] = 0.0f;
    wgmma_fence(); // the zeroed accumulators (and any register the next wgmmas read) are written
    // k steps of 32 bytes (16 bf16 / f16 or 32 e4m3 elements) through the
    // rows of the 16-bit layout of layout_cols columns
    constexpr int DL = layout_cols<T, D>();
#pragma unroll
    for (int kk = 0; kk < D / wgmma_k<T>(); ++kk)
        if constexpr (NS == 64)
            wgmma_ss_n128<T>(s, fp_sm90::q_desc<DL>(q_smem, q_rows, wrow, kk), fp_sm90::k_desc<DL>(k_tile, k_rows, kk));
        else
            wgmma_ss_n176<T>(s, fp_sm90::q_desc<DL>(q_smem, q_rows, wrow, kk), fp_sm90::k_desc<DL>(k_tile, k_rows, kk));
    wgmma_commit();
}
// O += P V: A = P from registers, B = V (MN-major): issued, not waited.
// fp8: B = V^T, a K-major tile of D rows (head-dim columns of V) x Bc keys
// (Bc bytes: one 128-byte swizzle span at Bc = 128), keys in vt_key order.
template <typename T, int D, int Bc>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[Bc / wgmma_k<T>()][4],
                                         uint32_t v_tile) {
    wgmma_fence(); // O (rescaled) and P were written by this thread
    if constexpr (sizeof(T) == 1) {
        static_assert(Bc == 128, "V^T rows of one 128-byte swizzle span");
#pragma unroll
        for (int kk = 0; kk < Bc / 32; ++kk) wgmma_rs<T, D>(o, p[kk], fp_sm90::k_desc<64>(v_tile, D, kk));
    } else {
#pragma unroll
        for (int kk = 0; kk < Bc / 16; ++kk) wgmma_rs<T, D>(o, p[kk], fp_sm90::v_desc<D>(v_tile, Bc, kk));
    }
    wgmma_commit();
}

// A row's normalizer 1 / l (l: the quad-summed row sum; 0 when no key was
// kept, a NaN l, from a NaN or +inf score, stays NaN) and its lse (-inf
// when no key was kept), m the running max in score units.
__device__ __forceinline__ float row_inv_lse(const flash_params &p, float l, float m, float *lse) {
    *lse = l == 0.0f ? -INFINITY : (m * p.scale_log2 + __log2f(l)) * 0.69314718055994531f;
    return l == 0.0f ? 0.0f : 1.0f / l;
}

// Epilogue of one consumer thread: row sums over the quad, normalize, write
// O (and lse) or the split partials. row_base: the packed row of the
// warpgroup's first tile row (m0 + wrow); rows past `rows` are padding.
// fp8 inputs (T e4m3): O is bf16. O is scaled by p.o_scale (v_descale of
// fp8 inputs or of a widened fp8 KV cache; 1 otherwise).
template <typename T, int D, typename To = typename std::conditional<sizeof(T) == 1, __nv_bfloat16, T>::type>
__device__ __forceinline__ void store_rows(const flash_params &p, const fp_flash::seq_view &S,
                                           const float (&o_acc)[D / 2], const float (&m_run)[2],
                                           const float (&l_run)[2], int row_base, int rows, int warp, int lane, int hk,
                                           int b, int split) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float l = quad_sum(l_run[h]);
        const int r = row_base + fp_sm90::acc_row(warp, lane, 2 * h);
        if (r >= rows) continue;
        const int qi = r / p.group, head = hk * p.group + r % p.group;
        float lse;
        float inv = row_inv_lse(p, l, m_run[h], &lse);
        inv *= p.o_scale; // v_descale: fp8 inputs, or an fp8 KV cache widened for this kernel; else 1
        const int col0 = fp_sm90::acc_col(lane, 2 * h); // 2 t
        if (p.num_splits == 1) {
            To *o = static_cast<To *>(p.o) + S.o0 + (int64_t)qi * p.o_ss + (int64_t)head * p.o_hs;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                *reinterpret_cast<uint32_t *>(o + j * 8 + col0) =
                    pack_op<To>::pack(o_acc[4 * j + 2 * h] * inv, o_acc[4 * j + 2 * h + 1] * inv);
            if (p.lse && (lane & 3) == 0) p.lse[((int64_t)b * p.hq + head) * p.sq + qi] = lse;
        } else {
            const int64_t prow = (((int64_t)split * p.batch + b) * p.hq + head) * p.sq + qi;
            float *o = p.o_part + prow * D;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                *reinterpret_cast<float2 *>(o + j * 8 + col0) =
                    make_float2(o_acc[4 * j + 2 * h] * inv, o_acc[4 * j + 2 * h + 1] * inv);
            if ((lane & 3) == 0) p.lse_part[prow] = lse;
        }
    }
}

// ---- host ---------------------------------------------------------------------

// Compute capability of device `dev`, queried once per device (0 unknown,
// with the error set naming kernel version `version`).
inline int device_cc(int dev, fp_status *st, int version) {
    static std::atomic<int> cache[64];
    if (dev >= 0 && dev < 64) {
        const int c = cache[dev].load(std::memory_order_relaxed);
        if (c) return c;
    }
    int major = 0, minor = 0;
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *st = fp_set_error(FP_ERR_CUDA, "attention flash v%d: device query: %s", version, cudaGetErrorString(e));
        return 0;
    }
    const int c = major * 10 + minor;
    if (dev >= 0 && dev < 64) cache[dev].store(c, std::memory_order_relaxed);
    return c;
}

// What every sm_90a kernel version refuses before any device call: splits
// out of [1, 1024], paged KV where `paged_ok` is false (v3, v4; v5 / v8 /
// v9 / v10 check the page size in kv_layout), varlen where `varlen_ok` is
// false, dtypes other than f16 / bf16, head dims other than 64 / 128.
inline fp_status sm90_check_args(const fp_attn_args *a, int version, int num_splits, bool varlen_ok,
                                 bool paged_ok = false) {
    if (num_splits < 1 || num_splits > 1024)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "num_splits %d out of [1, 1024]", num_splits);
    if (a->block_table && !paged_ok)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: paged KV cache not supported", version);
    if (!varlen_ok && (a->cu_q || a->cu_k))
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d: varlen (cu_seqlens) not supported (tensor maps per sequence)",
                            version);
    if (a->dtype != FP_BF16 && a->dtype != FP_F16)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: dtype %s (f16, bf16)", version,
                            fp_dtype_name(a->dtype));
    if (a->head_dim != 64 && a->head_dim != 128)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: head_dim %d not instantiated (64, 128)",
                            version, a->head_dim);
    return FP_OK;
}

// The current device must be compute capability 9.0 (an sm_90a cubin runs
// nowhere else). `features`: what the version uses, for the message.
inline fp_status sm90_check_device(int version, const char *features) {
    int dev = 0;
    FP_CUDA_TRY(cudaGetDevice(&dev));
    fp_status st = FP_OK;
    const int cc = device_cc(dev, &st, version);
    if (st != FP_OK) return st;
    if (cc != 90)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v%d (%s) needs compute capability 9.0 (sm_90a); device %d is %d.%d",
                            version, features, dev, cc / 10, cc % 10);
    return FP_OK;
}

} // namespace

#endif // FP_ATTENTION_SM90_COMMON_CUH
