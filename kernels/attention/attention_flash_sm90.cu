// Flash attention forward for Hopper (sm_90a only): version 3 of the flash
// kernel (versions 1 and 2, mma.sync for sm_80+, are in attention_flash.cu).
//   attention_flash_fwd_v3      one CTA = 128 packed query rows x one KV head
//                               (head_dim 64, 128; f16 / bf16), two
//                               warpgroups of 64 rows. Q K^T with
//                               wgmma.mma_async m64n128k16 (A = Q, B = K,
//                               both K-major from shared memory through
//                               matrix descriptors), P V with wgmma m64nDk16
//                               with A = P straight from registers (the f32
//                               S accumulators packed in pairs are the
//                               register-A fragment) and B = V (MN-major,
//                               transpose bit). Tiles of 128 keys in the
//                               128-byte swizzle layout, loaded by 16-byte
//                               cp.async, K and V double-buffered with the
//                               next tile issued a whole iteration ahead;
//                               online softmax in registers (exp2, scale *
//                               log2(e) folded into one FMA), masks on
//                               edge / diagonal tiles only. Same GQA
//                               packing, windows, seqlens_k, varlen, LSE and
//                               split-KV partial layout as v1.
//                               head_dim 128 (one CTA per SM) is software-
//                               pipelined: Q K^T of tile t+1 and P V of t
//                               are issued together and the softmax of t+1
//                               runs while P V of t is on the tensor cores
//                               (one barrier per tile); head_dim 64 runs the
//                               plain order with two CTAs per SM instead.
//   attention_flash_fwd_v4      v3 with the other schedule: plain order at
//                               head_dim 128, pipelined (one CTA per SM)
//                               at 64. The A/B of the pipelining at both
//                               head dims, and the triage run if v3 fails
//                               (descriptors or schedule?).
// Split partials are merged by attention_split_combine_v1
// (attention_flash_common.cuh, shared with v1 / v2: same partial layout).
// Not implemented (FP_ERR_UNSUPPORTED): paged KV, other head dims / dtypes,
// devices other than compute capability 9.0 (an sm_90a cubin runs nowhere
// else), builds without 90 in CMAKE_CUDA_ARCHITECTURES.
// STATUS: written and checked without a GPU (CPU emulation of its index
// math: tests/attention/test_attention_sm90_emu.cpp; this source itself on
// the CUDA emulation, wgmma / cp.async emulated (the FP_CUDA_EMU branches):
// tests/attention/test_attention_sm90_kernel_emu.cpp; ptxas / SASS checks).
// It is reached only through fp_attn_cuda_flash_version(a, 3 or 4, ...) (tests,
// fastbench attention/flash_versions) and stays off the default path (v1)
// until a GPU run validates and times it.
// TMA loads by a producer warpgroup with an mbarrier ring (setmaxnreg) are
// version 5 (attention_flash_tma_sm90.cu). Not yet done (next steps to
// FlashAttention-3 speed): ping-pong scheduling of the two warpgroups (one's
// softmax under the other's wgmmas) and an epilogue through shared memory
// (TMA store).
// Build: compiled only when 90 is in CMAKE_CUDA_ARCHITECTURES, as its own
// object set for arch 90a (see the top-level CMakeLists.txt); the device
// code below is also guarded by __CUDA_ARCH_FEAT_SM90_ALL.
// Index math: kernels/attention/attention_sm90_layout.h (shared with the
// emulation test). The PTX wrappers, softmax helpers, Q K^T / P V stages and
// the epilogue are shared with v5 (attention_sm90_common.cuh). Run: tests/attention/test_attention_gpu (label gpu),
// fastbench attention/flash_versions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention/attention_flash_common.cuh"
#include "attention/attention_flash_layout.h"
#include "attention/attention_internal.h"
#include "attention/attention_sm90_common.cuh"
#include "attention/attention_sm90_layout.h"

namespace {

// Copies `rows` x D elements (row r at base + r * row_stride) into the
// swizzled tile at shared address `tile`; rows >= valid are zero-filled.
// Not unrolled: unrolled, the compiler hoists every chunk's offsets out of
// the KV loop into registers the accumulators need.
template <typename T, int D, int NT>
__device__ __forceinline__ void load_tile(uint32_t tile, const T *base, int64_t row_stride, int rows, int valid,
                                          int tid) {
    constexpr int CH = D / 8;
#pragma unroll 1
    for (int idx = tid; idx < rows * CH; idx += NT) {
        const int r = idx / CH, c = idx % CH;
        const bool ok = r < valid;
        cp_async16(tile + fp_sm90::tile_chunk_offset<D>(r, c, rows), ok ? base + r * row_stride + c * 8 : base, ok);
    }
}

// grid: (m_tiles * num_splits, heads_kv, batch); block: 128 * kWarpgroups.
// Dynamic shared memory: 1 KiB of alignment slack + Q + 2 x K + 2 x V.
// Pipelined: the schedule (traits<D>::kPipelined for version 3, the other
// one for version 4). The pipelined one needs a CTA's worth of registers
// per SM (one CTA per SM), the plain one takes traits<D>::kMinBlocks.
template <typename T, int D, bool Pipelined>
__global__ void __launch_bounds__(fp_sm90::traits<D>::kWarpgroups * 128,
                                  Pipelined ? 1 : fp_sm90::traits<D>::kMinBlocks)
    attention_flash_fwd_v3(const __grid_constant__ flash_params p) {
    fp_pdl::enter(); // first: kernels/common/pdl.cuh
    fp_stamp::begin(p.stamp);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || defined(FP_CUDA_EMU)
    using Tr = fp_sm90::traits<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, NT = Tr::kWarpgroups * 128;
    static_assert(Br == 64 * Tr::kWarpgroups, "one m64 row block per warpgroup");
    static_assert(Bc == 128, "Q K^T is one m64n128 wgmma per k step");
    constexpr uint32_t kQBytes = Br * D * 2, kKVBytes = Bc * D * 2;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // The 128-byte swizzle pattern must start on 1024-byte boundaries (base
    // offset 0 in every descriptor): align the base explicitly rather than
    // trust where the dynamic window starts.
    const uint32_t smem0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t q_smem = smem0;                       // [Br x D]
    const uint32_t k_smem = q_smem + kQBytes;            // [2][Bc x D]
    const uint32_t v_smem = k_smem + 2 * kKVBytes;       // [2][Bc x D]

    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    cta_work w;
    if (!cta_work_of(p, Br, Bc, 0, w)) return; // CTA-uniform, before any barrier
    const int split = w.split, hk = w.hk, b = w.b, m0 = w.m0, rows = w.rows, L = w.S.L;
    const fp_flash::seq_view &S = w.S;
    const fp_flash::block_plan &plan = w.plan;
    const int s_begin = plan.s_begin, s_end = plan.s_end;
    // wgmma is warpgroup-collective: a warpgroup whose 64 rows are all
    // padding skips the math (uniformly) but still loads and syncs.
    const int wrow = 64 * wg; // first tile row of this warpgroup
    const bool wg_active = m0 + wrow < rows;
    const row_ctx rc = {m0 + wrow + fp_sm90::acc_row(warp, lane, 0), p.group, L, S.sq, p.wl, p.wr, p.scale_log2, plan};

    const T *k_base = static_cast<const T *>(p.k) + S.k0 + hk * p.k_hs;
    const T *v_base = static_cast<const T *>(p.v) + S.v0 + hk * p.v_hs;
    // K / V tile x (first = s_begin) lives in stage (x - s_begin) & 1.
    auto load_k = [&](int x) {
        load_tile<T, D, NT>(k_smem + ((x - s_begin) & 1) * kKVBytes, k_base + (int64_t)x * Bc * p.k_ss, p.k_ss, Bc,
                            L - x * Bc, tid);
    };
    auto load_v = [&](int x) {
        load_tile<T, D, NT>(v_smem + ((x - s_begin) & 1) * kKVBytes, v_base + (int64_t)x * Bc * p.v_ss, p.v_ss, Bc,
                            L - x * Bc, tid);
    };

    float o_acc[D / 2]; // m64nD accumulator fragment: register i = (acc_row, acc_col)
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o_acc[i] = 0.0f;
    // running max of raw scores and this thread's part of the row sums, for
    // its rows acc_row(warp, lane, 2 h), h = 0, 1
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

    if (s_begin < s_end) {
        // Stage 0: Q (rows unpacked from the GQA group) and K[first] in one
        // group, V[first] in a second, so Q K^T can start before V lands.
        {
            constexpr int CH = D / 8;
#pragma unroll 1
            for (int idx = tid; idx < Br * CH; idx += NT) {
                const int r = idx / CH, c = idx % CH, gr = m0 + r;
                const bool ok = gr < rows;
                const T *src = static_cast<const T *>(p.q);
                if (ok)
                    src += S.q0 + (int64_t)(gr / p.group) * p.q_ss + (int64_t)(hk * p.group + gr % p.group) * p.q_hs +
                           c * 8;
                cp_async16(q_smem + fp_sm90::tile_chunk_offset<D>(r, c, Br), src, ok);
            }
        }
        load_k(s_begin);
        cp_async_commit();
        load_v(s_begin);
        cp_async_commit();
        uint32_t p_frag[Bc / 16][4]; // P as the register A operand of P V, one per k16 step

        if constexpr (Pipelined) {
            // Software pipeline (per warpgroup): iteration t issues Q K^T of
            // tile t+1 and P V of tile t back to back, then runs the softmax
            // of t+1 while P V of t is still on the tensor cores. The wait for
            // P V of t, the rescale of O by corr(t+1) and the packing of
            // P(t+1) happen at the top of iteration t+1 (after the wait,
            // before P V of t+1 is issued). Costs a second score tile in
            // registers (S of t+1 next to P of t and O). One barrier per
            // tile: at its top K[t+1] and V[t] have landed, and the stages
            // the prefetch overwrites were last read by wgmmas every
            // warpgroup waited for before that barrier.
            //
            // Register discipline (what ptxas checks, C7514 / C7517): while
            // P V of t is in flight (issue .. the wait at the top of t+1) only
            // s_acc, corr, m_run, l_run are touched, never o_acc or p_frag;
            // s_acc is read only after wait<1> retired its Q K^T. The waits
            // run unconditionally (a no-op for a warpgroup without wgmmas in
            // flight) so that on every control path each read of o_acc /
            // p_frag follows a wait ptxas can see. The P V wait sits in a
            // different basic block (the loop head) from the softmax: ptxas
            // hoists WARPGROUP.DEPBAR to the top of its own block, which with
            // both in one block put the wait above the softmax (seen in SASS).
            // (An earlier never-taken __trap() before the wait split the block
            // too, but ptxas retires all wgmmas before a trap and reported
            // that injected wait as C7517.) Check after any change: no C7514 /
            // C7517 from ptxas -v, and every MUFU.EX2 of the loop's softmax
            // between the P V HGMMAs and the loop head's WARPGROUP.DEPBAR
            // (benchmarks/NOTES.md, "attention v3: ... injected wait").
            float s_acc[Bc / 2], corr[2]; // S (then P, f32) and O's factor of the next tile
            if (s_begin + 1 < s_end) load_k(s_begin + 1);
            cp_async_commit();  // (possibly empty) third group: K[first + 1]
            cp_async_wait<2>(); // Q and K[first] landed
            fence_proxy_async();
            __syncthreads();
            if (wg_active) {
                issue_qk<T, D>(s_acc, q_smem, Br, wrow, k_smem, Bc);
                wgmma_wait<0>();
                fence_regs(s_acc);
                mask_tile<Bc>(s_acc, rc, s_begin * Bc, lane);
                // O = 0, m_run = -inf: corr = exp2(-inf) = 0, the rescale at
                // the loop top leaves O = 0
                softmax_tile<Bc>(s_acc, m_run, l_run, corr, p.scale_log2);
            }
            for (int t = s_begin; t < s_end; ++t) {
                const int stage = (t - s_begin) & 1; // of K[t], V[t]
                const bool has_next = t + 1 < s_end;
                wgmma_wait<0>(); // P V of t-1 retired: O and P may be rewritten
                fence_regs(o_acc);
                if (wg_active) {
                    fence_regs(s_acc);         // the packing below stays after the wait
                    rescale_o<D>(o_acc, corr); // corr of tile t
                    pack_p<T, Bc>(p_frag, s_acc);
                }
                cp_async_wait<0>(); // V[t], K[t+1]: everything issued so far
                fence_proxy_async();
                __syncthreads();
                // K[t+2] goes to K[t]'s stage (Q K^T of t retired in the
                // previous iteration), V[t+1] to V[t-1]'s (P V of t-1 retired
                // above, in every warpgroup).
                if (t + 2 < s_end) load_k(t + 2);
                if (has_next) load_v(t + 1);
                cp_async_commit();
                // Each branch holds whole Q K^T stages (issue .. wait): with
                // the Q K^T issue alone made conditional, ptxas could not
                // prove the softmax reads no in-flight accumulator and
                // serialized every wgmma of the kernel (C7514).
                if (wg_active && has_next) {
                    issue_qk<T, D>(s_acc, q_smem, Br, wrow, k_smem + (stage ^ 1) * kKVBytes, Bc);
                    issue_pv<T, D, Bc>(o_acc, p_frag, v_smem + stage * kKVBytes);
                    wgmma_wait<1>(); // Q K^T of t+1 retired; P V of t may still run
                    fence_regs(s_acc);
                    mask_tile<Bc>(s_acc, rc, (t + 1) * Bc, lane);
                    softmax_tile<Bc>(s_acc, m_run, l_run, corr, p.scale_log2);
                } else if (wg_active) { // the last tile: P V only, waited below the loop
                    issue_pv<T, D, Bc>(o_acc, p_frag, v_smem + stage * kKVBytes);
                }
            }
            wgmma_wait<0>(); // P V of the last tile
            fence_regs(o_acc);
        } else {
            // Plain order, two barriers per tile: S = Q K^T, softmax, O += P V.
            // The next tile is prefetched one whole iteration ahead.
            for (int t = s_begin; t < s_end; ++t) {
                const int stage = (t - s_begin) & 1;
                // Outstanding copy groups here: K[t] (with Q at t = first), V[t].
                cp_async_wait<1>(); // K[t] landed
                fence_proxy_async();
                __syncthreads();
                // Tile t+1 into the other stage: its K was last read by Q K^T
                // of t-1 and its V by P V of t-1, both waited for by every
                // warpgroup before the barrier above. Always two groups, so
                // the counts stay fixed.
                if (t + 1 < s_end) load_k(t + 1);
                cp_async_commit();
                if (t + 1 < s_end) load_v(t + 1);
                cp_async_commit();
                if (wg_active) {
                    float s_acc[Bc / 2], corr[2];
                    issue_qk<T, D>(s_acc, q_smem, Br, wrow, k_smem + stage * kKVBytes, Bc);
                    wgmma_wait<0>();
                    fence_regs(s_acc);
                    mask_tile<Bc>(s_acc, rc, t * Bc, lane);
                    softmax_tile<Bc>(s_acc, m_run, l_run, corr, p.scale_log2);
                    rescale_o<D>(o_acc, corr);
                    pack_p<T, Bc>(p_frag, s_acc);
                }
                // Outstanding: V[t], K[t+1], V[t+1].
                cp_async_wait<2>(); // V[t] landed
                fence_proxy_async();
                __syncthreads();
                if (wg_active) {
                    issue_pv<T, D, Bc>(o_acc, p_frag, v_smem + stage * kKVBytes);
                    wgmma_wait<0>();
                    fence_regs(o_acc);
                }
            }
        }
        cp_async_wait<0>();
    }

    // Epilogue: row sums over the quad, normalize, write O (and lse) or the
    // split partials (attention_sm90_common.cuh).
    store_rows<T, D>(p, S, o_acc, m_run, l_run, m0 + wrow, rows, warp, lane, hk, b, split);
    fp_stamp::end_by(p.stamp, threadIdx.x % 128 == 0); // each warpgroup
#else
    __trap(); // no sm_90a features in this compilation: never launched (the launcher checks the device)
#endif
}

template <typename T, int D, bool Pipelined>
fp_status launch_v3(const fp_attn_args *a, int num_splits, cudaStream_t stream) {
    using Tr = fp_sm90::traits<D>;
    flash_params p = make_flash_params(a, Tr::kBr, num_splits);
    if ((int64_t)p.m_tiles * num_splits > 2147483647LL || a->heads_kv > 65535 || a->batch > 65535)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention flash v3: grid too large (m_tiles %d x splits %d, heads_kv %d, batch %d)",
                            p.m_tiles, num_splits, a->heads_kv, a->batch);
    const size_t smem = 1024 + (size_t)(Tr::kBr + 2 * Tr::kStages * Tr::kBc) * D * 2;
    constexpr auto kernel = attention_flash_fwd_v3<T, D, Pipelined>;
    FP_TRY(smem_opt_in<kernel>(smem));
    return run_with_partials<T, D>(a, p, stream, "attention flash v3", false, [&](flash_params &q) {
        dim3 grid((unsigned)(q.m_tiles * num_splits), (unsigned)a->heads_kv, (unsigned)a->batch);
        return launch_smem<kernel>(grid, Tr::kWarpgroups * 128, smem, stream, pdl_of(a), q);
    });
}

// Version 4 is version 3 with the other schedule.
template <typename T>
fp_status dispatch_v3(const fp_attn_args *a, int version, int num_splits, cudaStream_t stream) {
    constexpr bool p64 = fp_sm90::traits<64>::kPipelined, p128 = fp_sm90::traits<128>::kPipelined;
    switch (a->head_dim) {
    case 64:
        return version == 4 ? launch_v3<T, 64, !p64>(a, num_splits, stream)
                            : launch_v3<T, 64, p64>(a, num_splits, stream);
    case 128:
        return version == 4 ? launch_v3<T, 128, !p128>(a, num_splits, stream)
                            : launch_v3<T, 128, p128>(a, num_splits, stream);
    default: break;
    }
    return fp_set_error(FP_ERR_UNSUPPORTED, "attention flash kernel v%d: head_dim %d not instantiated (64, 128)",
                        version, a->head_dim);
}

} // namespace

extern "C" fp_status fp_attn_cuda_flash_sm90(const fp_attn_args *a, int version, int num_splits,
                                             cudaStream_t stream) {
    // the TMA-store bit and v9's early draws: fp_attn_cuda_flash_v5's
    const int vb = version & ~(FP_ATTN_O_TMA | FP_ATTN_V9_EARLY);
    if (vb == 5 || vb == 8 || vb == 9 || vb == 10 || vb == FP_ATTN_V5_WIDE)
        return fp_attn_cuda_flash_v5(a, version, num_splits, stream); // attention_flash_tma_sm90.cu
    if (version & FP_ATTN_O_TMA)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "FP_ATTN_O_TMA with flash kernel version %d (the TMA-store epilogue is v5's, v8's, v9's "
                            "and v10's)",
                            vb);
    if (version & FP_ATTN_V9_EARLY)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "FP_ATTN_V9_EARLY with flash kernel version %d (the ticket draw is v9's)", vb);
    if (version != 3 && version != 4)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "flash kernel version %d (the sm_90a kernels are 3, 4, 5, 8, 9 and 10)", version);
    FP_TRY(sm90_check_args(a, version, num_splits, true));
    FP_TRY(sm90_check_device(version, "wgmma"));
    if (a->dtype == FP_BF16) return dispatch_v3<__nv_bfloat16>(a, version, num_splits, stream);
    return dispatch_v3<__half>(a, version, num_splits, stream);
}
