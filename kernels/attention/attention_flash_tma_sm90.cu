// Flash attention forward for Hopper (sm_90a only), version 5 of the flash
// kernel (1 / 2: mma.sync, attention_flash.cu; 3 / 4: wgmma with cp.async,
// attention_flash_sm90.cu):
//   attention_flash_fwd_v5      v3's math (one CTA = 128 packed query rows x
//                               one KV head, two consumer warpgroups of 64
//                               rows, Q K^T wgmma m64n128k16 from SW128
//                               shared-memory descriptors, P from registers,
//                               V MN-major, online softmax, v3's pipelined
//                               order: softmax of t+1 under P V of t) fed by
//                               TMA: a third warpgroup is the producer, one
//                               thread of it issues every K / V tile as
//                               cp.async.bulk.tensor boxes (64 columns x 128
//                               keys, 128-byte swizzle: the layout v3's
//                               descriptors read) into a ring of kStages
//                               stages tracked by full (expect-tx bytes) and
//                               empty (consumer releases) mbarriers; no
//                               CTA-wide barrier in the loop; setmaxnreg
//                               moves registers from the producer (24) to
//                               the consumers (240). Q: cp.async once, by
//                               each consumer warpgroup for its own rows.
// Same contract as v3: f16 / bf16, head_dim 64 / 128, causal / windows, GQA
// packing, seqlens_k, LSE, split-KV partials (run_with_partials).
// FP_ERR_UNSUPPORTED: varlen (cu_seqlens: a tensor map per sequence is a
// later step), paged KV, K / V layouts TMA cannot describe (base not 16-byte
// aligned, a seq / head / batch stride not a multiple of 16 bytes), devices
// other than compute capability 9.0, a driver without
// cuTensorMapEncodeTiled (looked up at run time through
// cudaGetDriverEntryPoint*: libfastpath does not link libcuda).
// The pipeline bookkeeping (ring indices, the producer and consumer barrier
// schedules, the tensor-map geometry) is attention_tma_sm90.h, shared with
// the CPU model tests/attention/test_attention_tma_emu.cpp (mbarrier / TMA
// semantics from the PTX ISA, broken variants must fail).
// STATUS: written and checked without a GPU (CPU model, ptxas -v, SASS);
// reached only through fp_attn_cuda_flash_version(a, 5, ...) (tests,
// fastbench attention/flash_versions) until a GPU run validates and times
// it. Not yet done: ping-pong of the consumer warpgroups (named barriers),
// an epilogue through shared memory + TMA store, varlen / paged tensor maps.
// The PTX wrappers and softmax helpers below are copies of v3's (that file
// keeps its own; a shared header is a refactor for after both are
// validated on a GPU).
#include <atomic>
#include <cuda.h> // CUtensorMap and its enums only (no libcuda symbol is referenced)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "attention/attention_flash_common.cuh"
#include "attention/attention_flash_layout.h"
#include "attention/attention_internal.h"
#include "attention/attention_sm90_layout.h"
#include "attention/attention_tma_sm90.h"

namespace {

// ---- PTX wrappers (sm_90a) -------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global -> shared; pred false zero-fills (src-size 0),
// which keeps rows past the sequence end finite.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool pred) {
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy, wgmma reads it
// through the async proxy: each writer fences after its copies landed and
// before the barrier that publishes them to the warpgroups.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Orders this thread's earlier register writes (accumulators, A fragments)
// before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// After wgmma_wait: an empty asm that "redefines" each accumulator, so the
// compiler cannot move a read of it above the wait (the wgmma asm statement
// itself "wrote" it when it was issued).
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Every wgmma below: f32 accumulate; operands after the descriptors are
// scale-d (a predicate, here the constant 1: D += A B; the S accumulators
// are zeroed first, which ptxas folds into the first HGMMA), imm-scale-a,
// imm-scale-b (1: no negation), then imm-trans-a (shared-memory A only) and
// imm-trans-b (1 for V: MN-major).
template <typename T> __device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b);
template <typename T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b);
// D[64 x 128] (+)= A[64 x 16] (shared, K-major) * B[16 x 128] (shared, K-major).
template <>
__device__ __forceinline__ void wgmma_ss_n128<__nv_bfloat16>(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, 1, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b));
}
template <>
__device__ __forceinline__ void wgmma_ss_n128<__half>(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, 1, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b));
}
// D[64 x N] += A[64 x 16] (registers) * B[16 x N] (shared, MN-major: transpose bit).
template <>
__device__ __forceinline__ void wgmma_rs<__nv_bfloat16, 64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
template <>
__device__ __forceinline__ void wgmma_rs<__half, 64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
template <>
__device__ __forceinline__ void wgmma_rs<__nv_bfloat16, 128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
template <>
__device__ __forceinline__ void wgmma_rs<__half, 128>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

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
// A fragment of P V's k step kk (attention_sm90_layout.h).
template <typename T, int Bc>
__device__ __forceinline__ void pack_p(uint32_t (&p)[Bc / 16][4], const float (&s)[Bc / 2]) {
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r)
            p[kk][r] = pack_op<T>::pack(s[fp_sm90::p_src(kk, r)], s[fp_sm90::p_src(kk, r) + 1]);
}

// S = Q K^T for the warpgroup's 64 rows x 128 keys: issued, not waited.
template <typename T, int D>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t q_smem, int q_rows, int wrow, uint32_t k_tile,
                                         int k_rows) {
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.0f;
    wgmma_fence(); // the zeroed accumulators (and any register the next wgmmas read) are written
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        wgmma_ss_n128<T>(s, fp_sm90::q_desc<D>(q_smem, q_rows, wrow, kk), fp_sm90::k_desc<D>(k_tile, k_rows, kk));
    wgmma_commit();
}
// O += P V: A = P from registers, B = V (MN-major): issued, not waited.
template <typename T, int D, int Bc>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[Bc / 16][4], uint32_t v_tile) {
    wgmma_fence(); // O (rescaled) and P were written by this thread
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) wgmma_rs<T, D>(o, p[kk], fp_sm90::v_desc<D>(v_tile, Bc, kk));
    wgmma_commit();
}


// ---- mbarrier, TMA, register reallocation (PTX ISA 8.0, sm_90a) -------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA's
// complete_tx) and, with the __syncthreads after it, to every thread.
__device__ __forceinline__ void fence_mbar_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival plus `bytes` expected transaction bytes for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Blocks until the phase of parity `parity` has completed (try_wait itself
// suspends for a system-dependent time before it answers false).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n"
                     ".reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n"
                     "}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// One box of the 4-D tensor map at coordinates (c0 innermost .. c3) into
// shared memory at dst (1024-byte aligned: the 128-byte swizzle pattern),
// completing its bytes on barrier `bar`. Out-of-bounds elements are zeros.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
                 "%4, %5}], [%6];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Named barrier `id` among `count` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void st_shared_zero16(uint32_t addr) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
}

// ---- the two roles, as policies of the schedules in attention_tma_sm90.h ----

// The producer thread: one TMA box per 64 columns of a K / V tile.
template <int D> struct producer_ops {
    const CUtensorMap *tm_k, *tm_v;
    uint32_t smem0;
    int hk, b;
    __device__ __forceinline__ void wait_empty_k(int st, uint32_t parity) {
        mbar_wait(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_EMPTY_K, st), parity);
    }
    __device__ __forceinline__ void wait_empty_v(int st, uint32_t parity) {
        mbar_wait(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_EMPTY_V, st), parity);
    }
    __device__ __forceinline__ void load(const CUtensorMap *map, uint32_t tile, uint32_t bar, int t) {
        constexpr int Bc = fp_tma::traits_v5<D>::kBc;
        mbar_arrive_expect_tx(bar, fp_tma::stage_tx_bytes<D>()); // before the loads: tx never runs ahead
#pragma unroll
        for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c) {
            int xyzw[4];
            fp_tma::box_coords<D>(c, t, hk, b, xyzw);
            tma_load_4d(tile + fp_tma::box_smem_offset(c, Bc), map, xyzw[0], xyzw[1], xyzw[2], xyzw[3], bar);
        }
    }
    __device__ __forceinline__ void load_k(int st, int t) {
        load(tm_k, smem0 + fp_tma::k_offset<D>(st), smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_FULL_K, st), t);
    }
    __device__ __forceinline__ void load_v(int st, int t) {
        load(tm_v, smem0 + fp_tma::v_offset<D>(st), smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_FULL_V, st), t);
    }
};

// One consumer warpgroup's thread: its registers (S, O, P, softmax state)
// and the operations of the consumer schedule. Every member array is
// indexed by constants only, so the struct lives in registers.
template <typename T, int D> struct consumer_ops {
    static constexpr int Br = fp_tma::traits_v5<D>::kBr, Bc = fp_tma::traits_v5<D>::kBc;
    float s_acc[Bc / 2], o_acc[D / 2], corr[2], m_run[2], l_run[2];
    uint32_t p_frag[Bc / 16][4];
    row_ctx rc;
    uint32_t smem0;
    int wrow, lane;
    int ctid, nthreads; // index among, and number of, the active consumer threads
    int map_rows;       // rows of the tensor maps (seqlen_k): V rows in [L, map_rows) are cleared

    __device__ __forceinline__ void wait_full_k(int st, uint32_t parity, int) {
        mbar_wait(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_FULL_K, st), parity);
    }
    // V rows past a ragged sequence's length (fp_tma::v_tail_rows: at
    // most one tile per CTA) are cleared by all active consumer threads
    // before either warpgroup issues P V on the tile.
    __device__ __forceinline__ void wait_full_v(int st, uint32_t parity, int t) {
        mbar_wait(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_FULL_V, st), parity);
        int r0, r1;
        fp_tma::v_tail_rows(rc.L, map_rows, t, Bc, &r0, &r1);
        if (r0 < r1) { // CTA-uniform
            const uint32_t tile = smem0 + fp_tma::v_offset<D>(st);
            constexpr int CH = D / 8; // 16-byte chunks per row; a row keeps its chunks under the swizzle
            for (int idx = ctid; idx < (r1 - r0) * CH; idx += nthreads) {
                const int r = r0 + idx / CH, c = idx % CH;
                st_shared_zero16(tile + fp_sm90::tile_chunk_offset<D>(r, c, Bc));
            }
            fence_proxy_async(); // generic-proxy stores before the wgmmas' async-proxy reads
            named_barrier(1, nthreads);
        }
    }
    __device__ __forceinline__ void qk(int st) {
        issue_qk<T, D>(s_acc, smem0 + fp_tma::q_offset<D>(), Br, wrow, smem0 + fp_tma::k_offset<D>(st), Bc);
    }
    __device__ __forceinline__ void pv(int st) { issue_pv<T, D, Bc>(o_acc, p_frag, smem0 + fp_tma::v_offset<D>(st)); }
    __device__ __forceinline__ void wgmma_wait0() {
        wgmma_wait<0>();
        fence_regs(o_acc);
        fence_regs(s_acc);
    }
    __device__ __forceinline__ void wgmma_wait1() {
        wgmma_wait<1>();
        fence_regs(s_acc);
    }
    __device__ __forceinline__ void release_k(int st) {
        mbar_arrive(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_EMPTY_K, st));
    }
    __device__ __forceinline__ void release_v(int st) {
        mbar_arrive(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_EMPTY_V, st));
    }
    __device__ __forceinline__ void softmax(int t) {
        mask_tile<Bc>(s_acc, rc, t * Bc, lane);
        softmax_tile<Bc>(s_acc, m_run, l_run, corr, rc.scale_log2);
    }
    __device__ __forceinline__ void rescale_pack() {
        rescale_o<D>(o_acc, corr);
        pack_p<T, Bc>(p_frag, s_acc);
    }
};

// grid: (m_tiles * num_splits, heads_kv, batch); block: 384 (producer
// warpgroup + 2 consumer warpgroups); dynamic shared memory
// fp_tma::smem_bytes<D>(). tm_k / tm_v: K and V as 4-D tensor maps
// (fp_tma::kv_map_geometry), box 64 x kBc, 128-byte swizzle.
template <typename T, int D>
__global__ void __launch_bounds__(fp_tma::kThreads, 1)
    attention_flash_fwd_v5(const __grid_constant__ flash_params p, const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Tr = fp_tma::traits_v5<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, Stages = Tr::kStages;
    static_assert(Br == 64 * Tr::kConsumerWGs && Bc == 128, "one m64 row block per consumer warpgroup, m64n128 Q K^T");
    static_assert(128 * Tr::kProducerRegs + 256 * Tr::kConsumerRegs <= 65536, "register file");
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u; // SW128 tiles start on 1024-byte boundaries

    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    int m_tile, split;
    fp_flash::cta_coords(blockIdx.x, p.m_tiles, &m_tile, &split);
    const int hk = blockIdx.y, b = blockIdx.z;
    const int m0 = m_tile * Br;
    const fp_flash::seq_view S = seq_of(p, b);
    const int L = S.L;
    const int rows = S.sq * p.group;
    if (m0 >= rows) return; // CTA-uniform, before any barrier
    const fp_flash::block_plan plan =
        fp_flash::plan_block(m0, Br, Bc, rows, p.group, L, S.sq, p.wl, p.wr, split, p.num_splits);
    const int s_begin = plan.s_begin, s_end = plan.s_end;
    // A consumer warpgroup whose 64 rows are all padding takes no part: the
    // empty barriers count the active ones' threads.
    const int active_wgs = m0 + 64 < rows ? 2 : 1;
    if (tid == 0) {
        for (int s = 0; s < Stages; ++s) {
            mbar_init(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_FULL_K, s), 1);
            mbar_init(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_FULL_V, s), 1);
            mbar_init(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_EMPTY_K, s), fp_tma::empty_count(active_wgs));
            mbar_init(smem0 + fp_tma::bar_offset<D>(fp_tma::BAR_EMPTY_V, s), fp_tma::empty_count(active_wgs));
        }
        fence_mbar_init();
    }
    __syncthreads(); // the only CTA-wide barrier

    if (wg == 0) { // producer warpgroup: one thread issues everything
        setmaxnreg_dec<Tr::kProducerRegs>();
        if (tid == 0 && s_begin < s_end) {
            prefetch_tensormap(&tm_k);
            prefetch_tensormap(&tm_v);
            producer_ops<D> ops = {&tm_k, &tm_v, smem0, hk, b};
            fp_tma::producer_schedule<Stages>(s_begin, s_end, ops);
        }
        return;
    }
    setmaxnreg_inc<Tr::kConsumerRegs>();
    const int cw = wg - 1, wrow = 64 * cw; // consumer warpgroup, its first tile row
    if (cw >= active_wgs) return;
    const int ctid = tid - 128; // 0 .. 128 active_wgs - 1

    consumer_ops<T, D> c;
    c.smem0 = smem0;
    c.wrow = wrow;
    c.lane = lane;
    c.ctid = ctid;
    c.nthreads = 128 * active_wgs;
    c.map_rows = p.sk;
    c.rc = {m0 + wrow + fp_sm90::acc_row(warp, lane, 0), p.group, L, S.sq, p.wl, p.wr, p.scale_log2, plan};
#pragma unroll
    for (int i = 0; i < D / 2; ++i) c.o_acc[i] = 0.0f;
    c.m_run[0] = c.m_run[1] = -INFINITY;
    c.l_run[0] = c.l_run[1] = 0.0f;

    if (s_begin < s_end) {
        // Q: this warpgroup's 64 rows (unpacked from the GQA group), once,
        // by cp.async; published to its own wgmmas by a warpgroup barrier.
        {
            constexpr int CH = D / 8;
            const int wtid = tid % 128;
#pragma unroll 1
            for (int idx = wtid; idx < 64 * CH; idx += 128) {
                const int r = wrow + idx / CH, ch = idx % CH, gr = m0 + r;
                const bool ok = gr < rows;
                const T *src = static_cast<const T *>(p.q);
                if (ok)
                    src += S.q0 + (int64_t)(gr / p.group) * p.q_ss + (int64_t)(hk * p.group + gr % p.group) * p.q_hs +
                           ch * 8;
                cp_async16(smem0 + fp_tma::q_offset<D>() + fp_sm90::tile_chunk_offset<D>(r, ch, Br), src, ok);
            }
            cp_async_commit();
            cp_async_wait<0>();
            fence_proxy_async();
            named_barrier(2 + cw, 128);
        }
        fp_tma::consumer_schedule<Stages>(s_begin, s_end, c);
    }

    // Epilogue (v3's): row sums over the quad, normalize, write O (and lse)
    // or the split partials. Rows past `rows` are padding.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float l = quad_sum(c.l_run[h]);
        const int r = m0 + wrow + fp_sm90::acc_row(warp, lane, 2 * h);
        if (r >= rows) continue;
        const int qi = r / p.group, head = hk * p.group + r % p.group;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const float lse = l > 0.0f ? (c.m_run[h] * p.scale_log2 + __log2f(l)) * 0.69314718055994531f : -INFINITY;
        const int col0 = fp_sm90::acc_col(lane, 2 * h);
        if (p.num_splits == 1) {
            T *o = static_cast<T *>(p.o) + S.o0 + (int64_t)qi * p.o_ss + (int64_t)head * p.o_hs;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                *reinterpret_cast<uint32_t *>(o + j * 8 + col0) =
                    pack_op<T>::pack(c.o_acc[4 * j + 2 * h] * inv, c.o_acc[4 * j + 2 * h + 1] * inv);
            if (p.lse && (lane & 3) == 0) p.lse[((int64_t)b * p.hq + head) * p.sq + qi] = lse;
        } else {
            const int64_t prow = (((int64_t)split * p.batch + b) * p.hq + head) * p.sq + qi;
            float *o = p.o_part + prow * D;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                *reinterpret_cast<float2 *>(o + j * 8 + col0) =
                    make_float2(c.o_acc[4 * j + 2 * h] * inv, c.o_acc[4 * j + 2 * h + 1] * inv);
            if ((lane & 3) == 0) p.lse_part[prow] = lse;
        }
    }
#else
    __trap(); // no sm_90a features in this compilation: never launched (the launcher checks the device)
#endif
}

// ---- host ---------------------------------------------------------------------

typedef PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_fn;

// cuTensorMapEncodeTiled from the driver, looked up once (libfastpath does
// not link libcuda). NULL with an error set when the driver lacks it.
encode_tiled_fn encode_tiled(fp_status *st) {
    static std::atomic<encode_tiled_fn> cached{nullptr};
    encode_tiled_fn fn = cached.load(std::memory_order_acquire);
    if (fn) return fn;
    void *f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !f) {
        (void)cudaGetLastError();
        *st = fp_set_error(FP_ERR_UNSUPPORTED,
                           "attention flash kernel v5: the driver does not provide cuTensorMapEncodeTiled (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found");
        return nullptr;
    }
    fn = reinterpret_cast<encode_tiled_fn>(f);
    cached.store(fn, std::memory_order_release);
    return fn;
}

// The TMA layout checks for K or V (`which`), without a device: what
// kv_map_geometry refuses becomes FP_ERR_UNSUPPORTED naming the tensor.
// The box rows are kBc, the same at both head dims.
static_assert(fp_tma::traits_v5<64>::kBc == fp_tma::traits_v5<128>::kBc, "one box height for both head dims");
fp_status kv_layout(const fp_attn_args *a, const void *base, int64_t ss, int64_t hs, int64_t bs, const char *which,
                    fp_tma::kv_map *m) {
    const int s = fp_tma::kv_map_geometry(reinterpret_cast<uintptr_t>(base), a->head_dim, a->seqlen_k, a->heads_kv,
                                          a->batch, ss, hs, bs, fp_tma::traits_v5<128>::kBc, m);
    if (s != fp_tma::KV_MAP_OK)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v5 (TMA): %s: %s (seq stride %lld, head stride %lld, batch "
                            "stride %lld elements)",
                            which, fp_tma::kv_map_status_text(s), (long long)ss, (long long)hs, (long long)bs);
    return FP_OK;
}

fp_status encode_kv(encode_tiled_fn enc, const fp_attn_args *a, const void *base, const fp_tma::kv_map &m,
                    const char *which, CUtensorMap *out) {
    cuuint64_t dims[4];
    cuuint64_t strides[3];
    cuuint32_t box[4], estr[4] = {1, 1, 1, 1};
    for (int i = 0; i < 4; ++i) {
        dims[i] = m.dims[i];
        box[i] = m.box[i];
    }
    for (int i = 0; i < 3; ++i) strides[i] = m.strides[i];
    const CUtensorMapDataType dt =
        a->dtype == FP_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const CUresult r = enc(out, dt, 4, const_cast<void *>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                           CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v5: cuTensorMapEncodeTiled(%s) failed (%d)",
                            which, (int)r);
    return FP_OK;
}

template <typename T, int D>
fp_status launch_v5(const fp_attn_args *a, int num_splits, const fp_tma::kv_map &mk, const fp_tma::kv_map &mv,
                    encode_tiled_fn enc, cudaStream_t stream) {
    using Tr = fp_tma::traits_v5<D>;
    flash_params p = make_flash_params(a, Tr::kBr, num_splits);
    if ((int64_t)p.m_tiles * num_splits > 2147483647LL || a->heads_kv > 65535 || a->batch > 65535)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash v5: grid too large (m_tiles %d x splits %d, heads_kv %d, batch %d)",
                            p.m_tiles, num_splits, a->heads_kv, a->batch);
    CUtensorMap tm_k, tm_v;
    FP_TRY(encode_kv(enc, a, a->k, mk, "K", &tm_k));
    FP_TRY(encode_kv(enc, a, a->v, mv, "V", &tm_v));
    const size_t smem = fp_tma::smem_bytes<D>();
    constexpr auto kernel = attention_flash_fwd_v5<T, D>;
    FP_TRY(smem_opt_in<kernel>(smem));
    return run_with_partials<T, D>(a, p, stream, "attention flash v5", [&](flash_params &q) {
        dim3 grid((unsigned)(q.m_tiles * num_splits), (unsigned)a->heads_kv, (unsigned)a->batch);
        kernel<<<grid, fp_tma::kThreads, smem, stream>>>(q, tm_k, tm_v);
        return cudaGetLastError();
    });
}

int device_cc_v5(int dev, fp_status *st) {
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
        *st = fp_set_error(FP_ERR_CUDA, "attention flash v5: device query: %s", cudaGetErrorString(e));
        return 0;
    }
    const int c = major * 10 + minor;
    if (dev >= 0 && dev < 64) cache[dev].store(c, std::memory_order_relaxed);
    return c;
}

} // namespace

extern "C" fp_status fp_attn_cuda_flash_v5(const fp_attn_args *a, int num_splits, cudaStream_t stream) {
    if (num_splits < 1 || num_splits > 1024)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "num_splits %d out of [1, 1024]", num_splits);
    if (a->block_table)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v5: paged KV cache not supported");
    if (a->cu_q || a->cu_k)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v5: varlen (cu_seqlens) not supported (tensor maps per sequence)");
    if (a->dtype != FP_BF16 && a->dtype != FP_F16)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v5: dtype %s (f16, bf16)",
                            fp_dtype_name(a->dtype));
    if (a->head_dim != 64 && a->head_dim != 128)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v5: head_dim %d not instantiated (64, 128)",
                            a->head_dim);
    fp_tma::kv_map mk, mv;
    FP_TRY(kv_layout(a, a->k, a->k_ss, a->k_hs, a->k_bs, "K", &mk));
    FP_TRY(kv_layout(a, a->v, a->v_ss, a->v_hs, a->v_bs, "V", &mv));
    int dev = 0;
    FP_CUDA_TRY(cudaGetDevice(&dev));
    fp_status st = FP_OK;
    const int cc = device_cc_v5(dev, &st);
    if (st != FP_OK) return st;
    if (cc != 90)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash kernel v5 (wgmma, TMA) needs compute capability 9.0 (sm_90a); device %d "
                            "is %d.%d",
                            dev, cc / 10, cc % 10);
    const encode_tiled_fn enc = encode_tiled(&st);
    if (!enc) return st;
    const bool bf = a->dtype == FP_BF16;
    if (a->head_dim == 64)
        return bf ? launch_v5<__nv_bfloat16, 64>(a, num_splits, mk, mv, enc, stream)
                  : launch_v5<__half, 64>(a, num_splits, mk, mv, enc, stream);
    return bf ? launch_v5<__nv_bfloat16, 128>(a, num_splits, mk, mv, enc, stream)
              : launch_v5<__half, 128>(a, num_splits, mk, mv, enc, stream);
}
