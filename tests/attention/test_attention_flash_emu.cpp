// Warp-level CPU emulation of attention_flash_fwd_v1 + attention_split_combine_v1
// (kernels/attention/attention_flash.cu), so the kernel's index math is
// tested on machines without a GPU (label cpu).
//
// The emulation follows the kernel step by step with the *same* index
// functions (kernels/attention/attention_flash_layout.h): cp.async tile
// loads into the swizzled layout, ldmatrix (.trans) per-lane addresses,
// mma.sync m16n8k16 fragment layouts (tests/emu/sm80_fragments.h, written
// independently from the PTX ISA tables), quad shuffles of the online
// softmax, P repacked from the S accumulators, the epilogue and the split-KV
// combine. Shared memory
// starts as NaN so a read of an unloaded element poisons the result.
// What it cannot see: races (barrier placement), PTX syntax, register
// allocation. Those need the GPU test (test_attention_gpu).
#include <cstdint>
#include <cstring>
#include <vector>

#include "../emu/sm80_fragments.h"
#include "attn_emu_util.h"

using namespace fp_flash;

static int g_failures = 0;

static uint32_t pack(h16 lo, h16 hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

// ldmatrix.sync.aligned.m8n8.x4(.trans).b16: addr[lane] = element offset of
// the row lane hands in (lanes 8i..8i+7: rows 0..7 of matrix i).
// Also audits the addresses: each row must be 16-byte aligned, and the 8
// rows of one matrix (one shared-memory phase) must fall in 8 different
// 4-bank groups, else the hardware serializes the phase (bank conflict).
static long g_ldsm_conflicts = 0, g_ldsm_misaligned = 0;

static void ldsm_x4(const h16 *smem, const int addr[32], bool trans, uint32_t out[32][4]) {
    for (int i = 0; i < 4; ++i) {
        unsigned used = 0;
        for (int r = 0; r < 8; ++r) {
            int a = addr[8 * i + r];
            if (a % 8) g_ldsm_misaligned++;
            int quad = (a * 2 / 16) % 8; /* 16-byte bank group within 128 bytes */
            if (used & (1u << quad)) g_ldsm_conflicts++;
            used |= 1u << quad;
        }
    }
    for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
            const fp_sm80::ldsm_source s = fp_sm80::ldmatrix_source(lane, i, trans);
            out[lane][i] = pack(smem[addr[s.row_lo] + s.col_lo], smem[addr[s.row_hi] + s.col_hi]);
        }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: C[lane][4] += A B with
// the PTX ISA fragment layouts (tests/emu/sm80_fragments.h, which the CUDA
// emulation's mma.sync uses too).
static void mma(float c[32][4], const uint32_t a[32][4], const uint32_t b0[32], const uint32_t b1[32],
                fp_dtype dt) {
    for (int lane = 0; lane < 32; ++lane) fp_sm80::mma_m16n8k16_lane(lane, a, b0, b1, dt == FP_BF16, c[lane]);
}

template <int D> struct warp_state {
    float o_acc[32][D / 8][4];
    float m_run[32][2], l_run[32][2];
    uint32_t q_frag[D / 16][32][4]; // the kernel re-reads them from shared memory when !kQInRegisters
    int lo[32][2], hi[32][2];
};

// One CTA of attention_flash_fwd_v1<T, D>: (m_tile, split) = blockIdx.x,
// hk = blockIdx.y, b = blockIdx.z.
// Tr = traits<D> (v1) or traits_v2<D> (v2). A warp of v2 owns kMT 16-row
// blocks that share every K / V fragment; the blocks' math is independent,
// so each is emulated as its own "virtual warp" w (rows w * 16 ..), which is
// where the kernel puts block mt of warp: warp * 16 * kMT + mt * 16.
template <int D, typename Tr> static void emulate_cta(emu_args &E, int bx, int hk, int b) {
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, NT = Tr::kWarps * 32, W = Tr::kWarps * Tr::kMT, CH = D / 8;
    constexpr int P = smem_layout<D>::kPitch;
    const fp_attn_args &a = E.a;
    const fp_dtype dt = a.dtype;
    const int m_tiles = (a.seqlen_q * a.group + Br - 1) / Br;
    int m_tile, split;
    cta_coords(bx, m_tiles, &m_tile, &split);
    const int m0 = m_tile * Br;
    const seq_view SV = make_seq(b, a.seqlen_q, a.seqlen_k, a.seqlens_k, a.cu_q, a.cu_k, a.q_bs, a.q_ss, a.k_bs,
                                 a.k_ss, a.v_bs, a.v_ss, a.o_bs, a.o_ss);
    const int L = SV.L;
    const int rows = SV.sq * a.group;
    if (m0 >= rows) return;
    const block_plan plan =
        plan_block(m0, Br, Bc, rows, a.group, L, SV.sq, E.wl, E.wr, split, E.num_splits);
    const float scale_log2 = a.scale * 1.4426950408889634f;

    std::vector<h16> q_smem(Br * P, 0xFFFF), k_smem(2 * Bc * P, 0xFFFF), v_smem(2 * Bc * P, 0xFFFF);
    std::vector<warp_state<D>> ws(W);
    for (int w = 0; w < W; ++w)
        for (int lane = 0; lane < 32; ++lane) {
            for (int j = 0; j < D / 8; ++j)
                for (int e = 0; e < 4; ++e) ws[w].o_acc[lane][j][e] = 0.0f;
            for (int e = 0; e < 2; ++e) {
                ws[w].m_run[lane][e] = -INFINITY;
                ws[w].l_run[lane][e] = 0.0f;
                row_keys(m0 + w * 16 + lane / 4 + 8 * e, a.group, L, SV.sq, E.wl, E.wr, &ws[w].lo[lane][e],
                         &ws[w].hi[lane][e]);
            }
        }
    const h16 *Q = (const h16 *)a.q, *K = (const h16 *)a.k, *V = (const h16 *)a.v;
    auto cp16 = [](h16 *dst, const h16 *src, bool ok) {
        for (int x = 0; x < 8; ++x) dst[x] = ok ? src[x] : (h16)0;
    };
    auto load_tile = [&](h16 *tile, const h16 *base, int64_t row_stride, int nrows, int valid) {
        for (int tid = 0; tid < NT; ++tid)
            for (int idx = tid; idx < nrows * CH; idx += NT) {
                int r = idx / CH, c = idx % CH;
                bool ok = r < valid;
                cp16(tile + swz<D>(r, c), ok ? base + r * row_stride + c * 8 : base, ok);
            }
    };
    const h16 *k_base = K + SV.k0 + hk * a.k_hs;
    const h16 *v_base = V + SV.v0 + hk * a.v_hs;

    if (plan.s_begin < plan.s_end) {
        for (int tid = 0; tid < NT; ++tid)
            for (int idx = tid; idx < Br * CH; idx += NT) {
                int r = idx / CH, c = idx % CH, gr = m0 + r;
                bool ok = gr < rows;
                const h16 *src = Q;
                if (ok)
                    src += SV.q0 + (int64_t)(gr / a.group) * a.q_ss +
                           (int64_t)(hk * a.group + gr % a.group) * a.q_hs + c * 8;
                cp16(&q_smem[swz<D>(r, c)], src, ok);
            }
        load_tile(k_smem.data(), k_base + (int64_t)plan.s_begin * Bc * a.k_ss, a.k_ss, Bc, L - plan.s_begin * Bc);
        load_tile(v_smem.data(), v_base + (int64_t)plan.s_begin * Bc * a.v_ss, a.v_ss, Bc, L - plan.s_begin * Bc);
        for (int w = 0; w < W; ++w)
            for (int kk = 0; kk < D / 16; ++kk) {
                int addr[32];
                for (int lane = 0; lane < 32; ++lane) addr[lane] = swz<D>(q_ldsm_row(w * 16, lane), q_ldsm_chunk(kk, lane));
                ldsm_x4(q_smem.data(), addr, false, ws[w].q_frag[kk]);
            }
        for (int t = plan.s_begin; t < plan.s_end; ++t) {
            const int buf = (t - plan.s_begin) & 1;
            const int n0 = t * Bc;
            const bool has_next = t + 1 < plan.s_end;
            const h16 *k_tile = k_smem.data() + buf * Bc * P;
            const h16 *v_tile = v_smem.data() + buf * Bc * P;
            static float s_acc[W][32][Bc / 8][4];
            for (int w = 0; w < W; ++w) {
                memset(s_acc[w], 0, sizeof s_acc[w]);
                for (int kk = 0; kk < D / 16; ++kk) {
                    if (!Tr::kQInRegisters) { /* re-read Q's A fragment from shared memory */
                        int qaddr[32];
                        for (int lane = 0; lane < 32; ++lane)
                            qaddr[lane] = swz<D>(q_ldsm_row(w * 16, lane), q_ldsm_chunk(kk, lane));
                        ldsm_x4(q_smem.data(), qaddr, false, ws[w].q_frag[kk]);
                    }
                    for (int np = 0; np < Bc / 16; ++np) {
                        int addr[32];
                        uint32_t bf[32][4], b0[32], b1[32], b2[32], b3[32];
                        for (int lane = 0; lane < 32; ++lane)
                            addr[lane] = swz<D>(k_ldsm_row(np, lane), k_ldsm_chunk(kk, lane));
                        ldsm_x4(k_tile, addr, false, bf);
                        for (int lane = 0; lane < 32; ++lane) {
                            b0[lane] = bf[lane][0]; b1[lane] = bf[lane][1];
                            b2[lane] = bf[lane][2]; b3[lane] = bf[lane][3];
                        }
                        float c0[32][4], c1[32][4];
                        for (int lane = 0; lane < 32; ++lane)
                            for (int e = 0; e < 4; ++e) {
                                c0[lane][e] = s_acc[w][lane][2 * np][e];
                                c1[lane][e] = s_acc[w][lane][2 * np + 1][e];
                            }
                        mma(c0, ws[w].q_frag[kk], b0, b1, dt);
                        mma(c1, ws[w].q_frag[kk], b2, b3, dt);
                        for (int lane = 0; lane < 32; ++lane)
                            for (int e = 0; e < 4; ++e) {
                                s_acc[w][lane][2 * np][e] = c0[lane][e];
                                s_acc[w][lane][2 * np + 1][e] = c1[lane][e];
                            }
                    }
                }
            }
            if (has_next)
                load_tile(k_smem.data() + (buf ^ 1) * Bc * P, k_base + (int64_t)(n0 + Bc) * a.k_ss, a.k_ss, Bc,
                          L - (n0 + Bc));
            for (int w = 0; w < W; ++w) {
                warp_state<D> &S = ws[w];
                if (tile_needs_mask(plan, n0, Bc))
                    for (int lane = 0; lane < 32; ++lane)
                        for (int j = 0; j < Bc / 8; ++j)
                            for (int c = 0; c < 2; ++c) {
                                int col = n0 + j * 8 + 2 * (lane & 3) + c;
                                for (int e = 0; e < 2; ++e)
                                    if (col < S.lo[lane][e] || col > S.hi[lane][e]) s_acc[w][lane][j][2 * e + c] = -INFINITY;
                            }
                for (int e = 0; e < 2; ++e) {
                    float mx[32];
                    for (int lane = 0; lane < 32; ++lane) {
                        mx[lane] = S.m_run[lane][e];
                        for (int j = 0; j < Bc / 8; ++j)
                            mx[lane] = fmaxf(mx[lane], fmaxf(s_acc[w][lane][j][2 * e], s_acc[w][lane][j][2 * e + 1]));
                    }
                    float qm[32]; // quad_max: shfl_xor 1 then 2
                    for (int lane = 0; lane < 32; ++lane) qm[lane] = fmaxf(mx[lane], mx[lane ^ 1]);
                    for (int lane = 0; lane < 32; ++lane) mx[lane] = fmaxf(qm[lane], qm[lane ^ 2]);
                    for (int lane = 0; lane < 32; ++lane) {
                        const float m_scaled = mx[lane] == -INFINITY ? 0.0f : mx[lane] * scale_log2;
                        const float corr = exp2f(S.m_run[lane][e] * scale_log2 - m_scaled);
                        S.m_run[lane][e] = mx[lane];
                        float rs = 0.0f;
                        for (int j = 0; j < Bc / 8; ++j) {
                            float p0 = exp2f(fmaf(s_acc[w][lane][j][2 * e], scale_log2, -m_scaled));
                            float p1 = exp2f(fmaf(s_acc[w][lane][j][2 * e + 1], scale_log2, -m_scaled));
                            s_acc[w][lane][j][2 * e] = p0;
                            s_acc[w][lane][j][2 * e + 1] = p1;
                            rs += p0 + p1;
                        }
                        S.l_run[lane][e] = S.l_run[lane][e] * corr + rs;
                        for (int j = 0; j < D / 8; ++j) {
                            S.o_acc[lane][j][2 * e] *= corr;
                            S.o_acc[lane][j][2 * e + 1] *= corr;
                        }
                    }
                }
                // O += P V
                for (int kk = 0; kk < Bc / 16; ++kk) {
                    uint32_t pa[32][4];
                    for (int lane = 0; lane < 32; ++lane) {
                        float(*s)[4] = s_acc[w][lane];
                        pa[lane][0] = pack(from_f(s[2 * kk][0], dt), from_f(s[2 * kk][1], dt));
                        pa[lane][1] = pack(from_f(s[2 * kk][2], dt), from_f(s[2 * kk][3], dt));
                        pa[lane][2] = pack(from_f(s[2 * kk + 1][0], dt), from_f(s[2 * kk + 1][1], dt));
                        pa[lane][3] = pack(from_f(s[2 * kk + 1][2], dt), from_f(s[2 * kk + 1][3], dt));
                    }
                    for (int dp = 0; dp < D / 16; ++dp) {
                        int addr[32];
                        uint32_t bf[32][4], b0[32], b1[32], b2[32], b3[32];
                        for (int lane = 0; lane < 32; ++lane)
                            addr[lane] = swz<D>(v_ldsm_row(kk, lane), v_ldsm_chunk(dp, lane));
                        ldsm_x4(v_tile, addr, true, bf);
                        for (int lane = 0; lane < 32; ++lane) {
                            b0[lane] = bf[lane][0]; b1[lane] = bf[lane][1];
                            b2[lane] = bf[lane][2]; b3[lane] = bf[lane][3];
                        }
                        float c0[32][4], c1[32][4];
                        for (int lane = 0; lane < 32; ++lane)
                            for (int e = 0; e < 4; ++e) {
                                c0[lane][e] = S.o_acc[lane][2 * dp][e];
                                c1[lane][e] = S.o_acc[lane][2 * dp + 1][e];
                            }
                        mma(c0, pa, b0, b1, dt);
                        mma(c1, pa, b2, b3, dt);
                        for (int lane = 0; lane < 32; ++lane)
                            for (int e = 0; e < 4; ++e) {
                                S.o_acc[lane][2 * dp][e] = c0[lane][e];
                                S.o_acc[lane][2 * dp + 1][e] = c1[lane][e];
                            }
                    }
                }
            }
            if (has_next)
                load_tile(v_smem.data() + (buf ^ 1) * Bc * P, v_base + (int64_t)(n0 + Bc) * a.v_ss, a.v_ss, Bc,
                          L - (n0 + Bc));
        }
    }
    // Epilogue
    for (int w = 0; w < W; ++w)
        for (int e = 0; e < 2; ++e) {
            float lq[32], ls[32];
            for (int lane = 0; lane < 32; ++lane) lq[lane] = ws[w].l_run[lane][e] + ws[w].l_run[lane ^ 1][e];
            for (int lane = 0; lane < 32; ++lane) ls[lane] = lq[lane] + lq[lane ^ 2];
            for (int lane = 0; lane < 32; ++lane) {
                const float l = ls[lane];
                const int r = m0 + w * 16 + lane / 4 + 8 * e;
                if (r >= rows) continue;
                const int qi = r / a.group, h = hk * a.group + r % a.group;
                const float inv = l > 0.0f ? 1.0f / l : 0.0f;
                const float lse = l > 0.0f ? (ws[w].m_run[lane][e] * scale_log2 + log2f(l)) * 0.69314718055994531f
                                           : -INFINITY;
                const int col0 = 2 * (lane & 3);
                if (E.num_splits == 1) {
                    h16 *o = (h16 *)a.o + SV.o0 + (int64_t)qi * a.o_ss + (int64_t)h * a.o_hs;
                    for (int j = 0; j < D / 8; ++j) {
                        o[j * 8 + col0] = from_f(ws[w].o_acc[lane][j][2 * e] * inv, dt);
                        o[j * 8 + col0 + 1] = from_f(ws[w].o_acc[lane][j][2 * e + 1] * inv, dt);
                    }
                    if (a.lse && (lane & 3) == 0) a.lse[((int64_t)b * a.heads_q + h) * a.seqlen_q + qi] = lse;
                } else {
                    const int64_t prow = (((int64_t)split * a.batch + b) * a.heads_q + h) * a.seqlen_q + qi;
                    float *o = E.o_part.data() + prow * D;
                    for (int j = 0; j < D / 8; ++j) {
                        o[j * 8 + col0] = ws[w].o_acc[lane][j][2 * e] * inv;
                        o[j * 8 + col0 + 1] = ws[w].o_acc[lane][j][2 * e + 1] * inv;
                    }
                    if ((lane & 3) == 0) E.lse_part[prow] = lse;
                }
            }
        }
}

template <int D, typename Tr = traits<D>> static void emulate(emu_args &E) {
    emulate_grid<D>(E, Tr::kBr, emulate_cta<D, Tr>);
}

static void launch(emu_args &E, int d, int version) {
    switch (d) {
    case 32: emulate<32>(E); break;
    case 64: version == 2 ? emulate<64, traits_v2<64>>(E) : emulate<64>(E); break;
    case 96: emulate<96>(E); break;
    case 256: emulate<256>(E); break;
    default: version == 2 ? emulate<128, traits_v2<128>>(E) : emulate<128>(E); break;
    }
}

// The decode kernel's (v6) budget, what its prediction rests on (NOTES.md,
// session 17): a regression in these fails here, not on a GPU.
//  - shared memory (16 + 2 kStages 64) x pitch x 2 bytes within two CTAs per
//    H100 SM up to head_dim 128 (228 KiB per SM, 1 KiB reserved per CTA)
//    and within an A100's 163 KiB opt-in at every head dim;
//  - K / V bytes in flight per CTA while a tile is worked on, (kStages - 1)
//    x 2 x 64 x D x 2: at least two tiles up to head_dim 128 (v1 prefetches
//    one K or one V tile behind the previous tile's math), one at 256;
//  - the merge of the 4 warps' f32 states, 4 x 16 x (D + 8) x 4 + 512 bytes,
//    fits in the dead ring it reuses.
template <int D> static int decode_budget() {
    using Tr = fp_flash::traits_decode<D>;
    const long pitch = fp_flash::smem_layout<D>::kPitch;
    const long smem = (long)(Tr::kBr + 2 * Tr::kStages * Tr::kBc) * pitch * 2;
    const long in_flight = (long)(Tr::kStages - 1) * 2 * Tr::kBc * D * 2;
    const long merge = (long)Tr::kWarps * Tr::kBr * (D + 8) * 4 + Tr::kWarps * Tr::kBr * 2 * 4;
    const bool ok = (D > 128 || 2 * (smem + 1024) <= 228 * 1024) && smem <= 163 * 1024 &&
                    Tr::kStages - 1 >= (D <= 128 ? 2 : 1) && merge <= smem;
    printf("%-4s decode v6 head_dim %3d: %3ld KiB shared, %3ld KiB of K/V in flight per CTA, merge %2ld KiB\n",
           ok ? "ok" : "FAIL", D, smem / 1024, in_flight / 1024, merge / 1024);
    return ok ? 0 : 1;
}

// The XOR form of the ldmatrix addresses (kTightRegs: attention_flash_layout.h,
// ldsm_off) against swz for every lane, step and row block: Q (16-row
// blocks of a 128-row tile), K (key blocks np), V (k steps kk).
template <int D> static int xor_offsets() {
    int bad = 0;
    for (int lane = 0; lane < 32; ++lane)
        for (int s = 0; s < D / 16; ++s)
            for (int blk = 0; blk < 8; ++blk) {
                const uint32_t row0 = (uint32_t)(blk * 16 * 2 * D);
                bad += 2u * (uint32_t)swz<D>(q_ldsm_row(blk * 16, lane), q_ldsm_chunk(s, lane)) !=
                       row0 + ldsm_step(q_ldsm_off<D>(lane), s);
                bad += 2u * (uint32_t)swz<D>(k_ldsm_row(blk, lane), k_ldsm_chunk(s, lane)) !=
                       row0 + ldsm_step(k_ldsm_off<D>(lane), s);
                bad += 2u * (uint32_t)swz<D>(v_ldsm_row(blk, lane), v_ldsm_chunk(s, lane)) !=
                       row0 + ldsm_step(v_ldsm_off<D>(lane), s);
            }
    printf("%-4s ldmatrix XOR offsets, head_dim %d: %d differ from swz\n", bad ? "FAIL" : "ok", D, bad);
    return bad != 0;
}

int main() {
    g_failures += decode_budget<32>() + decode_budget<64>() + decode_budget<96>() + decode_budget<128>() +
                  decode_budget<256>();
    g_failures += xor_offsets<64>() + xor_offsets<128>() + xor_offsets<256>();
    static const emu_case cases[] = {
        /* name              b  sq   sk   hq hkv d    dtype    causal wl  wr rag splits pad varlen */
        {"bf16_d64_17x17",   1, 17,  17,  2, 2, 64,  FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_d128_1x1",     2, 1,   1,   2, 1, 128, FP_F16,  0, -1, -1, 0, 1, 0, 0},
        {"bf16_d128_130x200",1, 130, 200, 2, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 8, 0},
        {"f16_d64_causal",   1, 150, 150, 2, 2, 64,  FP_F16,  1, -1, -1, 0, 1, 0, 0},
        {"bf16_causal_q<k",  1, 33,  250, 2, 1, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_causal_q>k",   1, 200, 40,  2, 2, 128, FP_F16,  1, -1, -1, 0, 1, 0, 0},
        {"bf16_gqa3_causal", 1, 70,  70,  6, 2, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_window",       1, 200, 200, 2, 2, 64,  FP_F16,  0, 30, 5, 0, 1, 0, 0},
        {"bf16_window_causal",1,190, 300, 2, 2, 128, FP_BF16, 1, 70, -1, 0, 1, 0, 0},
        {"f16_decode_split3",2, 1,   700, 8, 1, 128, FP_F16,  0, -1, -1, 0, 3, 0, 0},
        {"bf16_decode_rag_s5",4, 2,  333, 4, 2, 64,  FP_BF16, 1, -1, -1, 1, 5, 8, 0},
        {"f16_prefill_split4",1, 100, 300, 2, 2, 64, FP_F16,  1, -1, -1, 0, 4, 0, 0},
        {"bf16_split_win",   1, 3,   500, 8, 2, 64,  FP_BF16, 1, 100, -1, 0, 6, 0, 0},
        {"f16_d32_causal",   2, 90,  90,  2, 1, 32,  FP_F16,  1, -1, -1, 0, 1, 0, 0},
        {"bf16_d96_window",  1, 130, 170, 2, 2, 96,  FP_BF16, 0, 40, 10, 0, 1, 8, 0},
        {"f16_d96_decode_s3",3, 2,   400, 4, 1, 96,  FP_F16,  1, -1, -1, 1, 3, 0, 0},
        {"bf16_d256_causal", 1, 100, 130, 2, 1, 256, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_d256_dec_s4",  2, 1,   500, 4, 2, 256, FP_F16,  0, -1, -1, 1, 4, 0, 0},
        {"bf16_varlen",      5, 70,  90,  2, 2, 64,  FP_BF16, 0, -1, -1, 0, 1, 0, 1},
        {"f16_varlen_causal",4, 100, 60,  4, 2, 128, FP_F16,  1, -1, -1, 0, 1, 8, 1},
        {"bf16_varlen_split",6, 3,   400, 8, 2, 64,  FP_BF16, 1, 50, -1, 0, 4, 0, 1},
        /* windows past every key (e.g. INT_MAX for "unbounded") are accepted
         * by fp_attn_check: diag +- window must not overflow int */
        {"f16_window_intmax",1, 70,  150, 2, 2, 64,  FP_F16,  0, 2147483647, 2147483647, 0, 1, 0, 0},
        {"bf16_win_big_split",2, 3,  300, 4, 2, 128, FP_BF16, 0, 2147483600, 2147483547, 1, 3, 0, 0},
        {"f16_causal_q>k_wlmax",1, 90, 40,  2, 1, 32,  FP_F16,  1, 2147483647, -1, 0, 1, 0, 0},
        /* clamp_window's edges: left >= sk, right >= sq read as unbounded */
        {"bf16_win_reach",   1, 37,  150, 2, 2, 64,  FP_BF16, 0, 150, 37, 0, 1, 0, 0},
        {"f16_win_reach-2",  1, 37,  150, 2, 2, 64,  FP_F16,  0, 148, 35, 0, 2, 0, 0}, /* binding */
        {"f16_win_q>k_reach",1, 150, 37,  2, 2, 64,  FP_F16,  0, 37, 150, 0, 1, 0, 0},
        {"bf16_varlen_reach",5, 70,  90,  2, 2, 64,  FP_BF16, 0, 90, 70, 0, 2, 0, 1},
    };
    emu_rng rng = {88172645463325252ULL};
    for (const emu_case &c : cases) {
        if (!emu_run_case(c, rng, "", 1, launch)) g_failures++;
        /* attention_flash_fwd_v2 */
        if ((c.d == 64 || c.d == 128) && !emu_run_case(c, rng, "", 2, launch)) g_failures++;
    }
    printf("ldmatrix phases with bank conflicts: %ld, misaligned rows: %ld\n", g_ldsm_conflicts, g_ldsm_misaligned);
    if (g_ldsm_conflicts || g_ldsm_misaligned) g_failures++;
    if (g_failures) fprintf(stderr, "%d case(s) failed\n", g_failures);
    return g_failures ? 1 : 0;
}
