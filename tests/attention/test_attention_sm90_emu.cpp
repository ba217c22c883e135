// CPU emulation of the Hopper flash attention kernels attention_flash_fwd_v3
// and v4 (kernels/attention/attention_flash_sm90.cu; v4 = v3 with the other
// schedule, pipelined <-> plain), label cpu: their index math is
// checked on machines without a GPU (no Hopper is needed to find a wrong
// descriptor, swizzle or fragment map).
//
// The kernel side is the kernel's own functions (attention_sm90_layout.h,
// attention_flash_layout.h). The hardware side is written here from the PTX
// ISA text, independently of those functions:
//   - wgmma's shared-memory operand reads: the matrix descriptor's fields
//     (start >> 4 in bits 0-13, LBO in 16-29, SBO in 32-45, base offset
//     49-51, swizzle mode 62-63), the canonical layouts of "Canonical
//     Layouts" (K-major 128B swizzle ((8,m),(T,2k)):((8T,SBO),(1,T)),
//     MN-major 128B swizzle ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), T = 8
//     16-bit elements), then the 128-byte swizzle (Swizzle<3,4,3>: address
//     bits [4:6] ^= bits [7:9], patterns starting on 1024-byte boundaries);
//   - the m64nNk16 fragments: accumulator D and register A (figures "WGMMA
//     .m64nNk16 register fragment layout").
// Checks:
//   (a) for every element of every operand of every wgmma the kernel issues,
//       the element wgmma reads (tile written by the kernel's cp.async
//       offsets) is the one the kernel means, for D = 64 and 128;
//   (b) the kernel's accumulator (lane, register) -> (row, col) map used by
//       the softmax row statistics and the output store, and the S -> P
//       register-A repacking, against the doc's fragment layouts;
//   (c) a warpgroup-level emulation of whole CTAs (cp.async into swizzled
//       shared memory, wgmma through the descriptors, masks, online softmax
//       with quad shuffles, epilogue, split-KV combine) against
//       fp_attn_reference on odd lengths, causal sq != sk, GQA, windows,
//       ragged / varlen batches and splits;
//   (d) during (c), the wgmma in-flight rules of the PTX ISA against the
//       schedule's order of issue / commit / wait_group, register accesses
//       (S, O, P) and cp.async prefetches: no access to a register of a
//       wgmma not yet waited for, no prefetch into a tile an unretired
//       wgmma reads, nothing in flight at exit.
// What it cannot see: races between threads (barrier / fence placement),
// whether ptxas keeps the PTX order (C7514 / C7517 and the SASS order are
// checked by hand: benchmarks/NOTES.md), PTX syntax, register allocation.
// Those need test_attention_gpu on an H100.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_sm90_layout.h"
#include "attn_emu_util.h"

static int g_failures = 0;

// ---- the hardware, from the PTX ISA ------------------------------------------

struct desc_fields {
    uint32_t start, lbo, sbo, base_offset, mode;
};
static desc_fields decode_desc(uint64_t d) {
    desc_fields f;
    f.start = (uint32_t)(d & 0x3FFF) << 4;
    f.lbo = (uint32_t)((d >> 16) & 0x3FFF) << 4;
    f.sbo = (uint32_t)((d >> 32) & 0x3FFF) << 4;
    f.base_offset = (uint32_t)((d >> 49) & 7);
    f.mode = (uint32_t)(d >> 62);
    return f;
}
// 128-byte swizzle of a shared-memory byte address (base offset 0).
static uint32_t swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7) << 4); }

// Byte address wgmma reads for element (mn, k) of a K-major operand (A: mn =
// row m; B: mn = column n), 16-bit elements, 128B swizzle.
static uint32_t kmajor_addr(uint64_t desc, int mn, int k) {
    const desc_fields f = decode_desc(desc);
    // ((8,m),(T,2k)):((8T,SBO),(1,T)) in elements, SBO in bytes; T = 8
    const uint32_t off = (uint32_t)((mn % 8) * 64 * 2 + (mn / 8) * f.sbo + (k % 8) * 2 + (k / 8) * 8 * 2);
    return swizzle128(f.start + off);
}
// ... of an MN-major B operand: element (k, n).
static uint32_t mnmajor_addr(uint64_t desc, int k, int n) {
    const desc_fields f = decode_desc(desc);
    // ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) in elements, LBO / SBO in bytes
    const uint32_t off =
        (uint32_t)((n % 8) * 2 + ((n / 8) % 8) * 8 * 2 + (n / 64) * f.lbo + (k % 8) * 64 * 2 + (k / 8) * f.sbo);
    return swizzle128(f.start + off);
}
static bool desc_ok(uint64_t desc) {
    const desc_fields f = decode_desc(desc);
    return f.mode == 1 && f.base_offset == 0;
}
// Accumulator D of m64nNk16, thread tid (0..127) of the warpgroup,
// register i: (row, col).
static int doc_d_row(int tid, int i) { return 16 * (tid / 32) + (tid % 32) / 4 + 8 * ((i % 4) / 2); }
static int doc_d_col(int tid, int i) { return 8 * (i / 4) + 2 * (tid % 4) + (i % 2); }
// Register A of m64nNk16 (f16 / bf16): half a_x (x = 0..7, register x / 2,
// low half when x is even): (row, col) in the 64 x 16 A tile.
static int doc_a_row(int tid, int x) { return 16 * (tid / 32) + (tid % 32) / 4 + 8 * ((x / 2) % 2); }
static int doc_a_col(int tid, int x) { return 2 * (tid % 4) + (x % 2) + 8 * (x / 4); }

// ---- (a) descriptors + swizzle vs cp.async ---------------------------------

// Simulated shared memory: the id of the element each 2-byte slot holds.
struct tag_smem {
    std::vector<int32_t> slot;
    explicit tag_smem(size_t bytes) : slot(bytes / 2, -1) {}
};

template <int D> static void check_descriptors() {
    using Tr = fp_sm90::traits<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, CH = D / 8;
    const uint32_t smem0 = 1024; // the kernel aligns its base up to 1024 bytes
    const uint32_t q_smem = smem0, k_smem = q_smem + fp_sm90::tile_bytes<D>(Br);
    const uint32_t v_smem = k_smem + 2 * fp_sm90::tile_bytes<D>(Bc);
    const uint32_t end = v_smem + 2 * fp_sm90::tile_bytes<D>(Bc);
    tag_smem sm(end + 1024);
    long bad = 0, conflicts = 0;
    // cp.async: every 16-byte chunk of each tile, once, inside its tile,
    // 16-byte aligned; 8 consecutive threads (one 128-byte wavefront) write 8
    // different 16-byte bank groups. Tag = tile * 2^24 + row * D + col.
    auto fill = [&](int tile_id, uint32_t base, int rows) {
        for (int idx = 0; idx < rows * CH; ++idx) {
            const int r = idx / CH, c = idx % CH;
            const uint32_t off = fp_sm90::tile_chunk_offset<D>(r, c, rows);
            if (off % 16 || off + 16 > fp_sm90::tile_bytes<D>(rows)) bad++;
            for (int x = 0; x < 8; ++x) {
                int32_t &s = sm.slot[(base + off) / 2 + x];
                if (s != -1) bad++; // written twice
                s = tile_id * (1 << 24) + r * D + c * 8 + x;
            }
        }
        for (int idx0 = 0; idx0 < rows * CH; idx0 += 8) {
            unsigned used = 0;
            for (int idx = idx0; idx < idx0 + 8; ++idx) {
                const uint32_t g = ((base + fp_sm90::tile_chunk_offset<D>(idx / CH, idx % CH, rows)) >> 4) & 7;
                if (used & (1u << g)) conflicts++;
                used |= 1u << g;
            }
        }
    };
    fill(1, q_smem, Br);
    for (int s = 0; s < 2; ++s) {
        fill(2 + s, k_smem + s * fp_sm90::tile_bytes<D>(Bc), Bc);
        fill(4 + s, v_smem + s * fp_sm90::tile_bytes<D>(Bc), Bc);
    }
    if (q_smem % 1024 || k_smem % 1024 || v_smem % 1024 || fp_sm90::tile_bytes<D>(Bc) % 1024) bad++;
    long checked = 0;
    auto expect = [&](uint32_t addr, int32_t want) {
        checked++;
        if (addr % 2 || addr / 2 >= sm.slot.size() || sm.slot[addr / 2] != want) {
            if (bad < 5)
                fprintf(stderr, "D=%d: wgmma reads addr %u holding %d, kernel means %d\n", D, addr,
                        addr / 2 < sm.slot.size() ? sm.slot[addr / 2] : -2, want);
            bad++;
        }
    };
    for (int wg = 0; wg < Tr::kWarpgroups; ++wg)
        for (int kk = 0; kk < D / 16; ++kk) {
            // A = Q rows 64 wg.., head dim 16 kk..
            const uint64_t da = fp_sm90::q_desc<D>(q_smem, Br, 64 * wg, kk);
            if (!desc_ok(da)) bad++;
            for (int m = 0; m < 64; ++m)
                for (int k = 0; k < 16; ++k)
                    expect(kmajor_addr(da, m, k), 1 * (1 << 24) + (64 * wg + m) * D + 16 * kk + k);
        }
    for (int s = 0; s < 2; ++s) {
        const uint32_t kt = k_smem + s * fp_sm90::tile_bytes<D>(Bc), vt = v_smem + s * fp_sm90::tile_bytes<D>(Bc);
        for (int kk = 0; kk < D / 16; ++kk) { // B = K^T: (k = head dim, n = key)
            const uint64_t db = fp_sm90::k_desc<D>(kt, Bc, kk);
            if (!desc_ok(db)) bad++;
            for (int n = 0; n < Bc; ++n)
                for (int k = 0; k < 16; ++k) expect(kmajor_addr(db, n, k), (2 + s) * (1 << 24) + n * D + 16 * kk + k);
        }
        for (int kk = 0; kk < Bc / 16; ++kk) { // B = V: (k = key, n = head dim)
            const uint64_t db = fp_sm90::v_desc<D>(vt, Bc, kk);
            if (!desc_ok(db)) bad++;
            for (int k = 0; k < 16; ++k)
                for (int n = 0; n < D; ++n) expect(mnmajor_addr(db, k, n), (4 + s) * (1 << 24) + (16 * kk + k) * D + n);
        }
    }
    printf("(a) D=%d: %ld operand elements read through descriptors, %ld wrong, %ld cp.async bank conflicts\n", D,
           checked, bad, conflicts);
    if (bad || conflicts) g_failures++;
}

// ---- (b) fragment maps ------------------------------------------------------

static void check_fragments() {
    long bad = 0;
    for (int tid = 0; tid < 128; ++tid) {
        const int w = tid / 32, lane = tid % 32;
        for (int i = 0; i < 64; ++i) // m64n128 accumulator (S), a superset of m64n64 / O
            if (fp_sm90::acc_row(w, lane, i) != doc_d_row(tid, i) || fp_sm90::acc_col(lane, i) != doc_d_col(tid, i))
                bad++;
        // P for k step kk: A half x = 2 r + c comes from S register p_src(kk, r) + c,
        // which must hold (A row, key 16 kk + A col).
        for (int kk = 0; kk < 8; ++kk)
            for (int r = 0; r < 4; ++r)
                for (int c = 0; c < 2; ++c) {
                    const int i = fp_sm90::p_src(kk, r) + c, x = 2 * r + c;
                    if (doc_d_row(tid, i) != doc_a_row(tid, x) || doc_d_col(tid, i) != 16 * kk + doc_a_col(tid, x))
                        bad++;
                }
        // The softmax: registers 4 j + 2 h + c of a lane are row acc_row(w,
        // lane, 2 h); the quad (lanes xor 1, 2) shares it; the epilogue
        // writes register 4 j + 2 h + c to column 8 j + acc_col(lane, 2 h) + c.
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 16; ++j)
                for (int c = 0; c < 2; ++c) {
                    const int i = 4 * j + 2 * h + c;
                    if (doc_d_row(tid, i) != fp_sm90::acc_row(w, lane, 2 * h)) bad++;
                    if (doc_d_col(tid, i) != 8 * j + fp_sm90::acc_col(lane, 2 * h) + c) bad++;
                    for (int q = 1; q < 4; ++q)
                        if (doc_d_row(32 * w + (lane ^ q), i) != doc_d_row(tid, i)) bad++;
                }
    }
    // every (row, col) of a 64 x 128 accumulator held exactly once
    std::vector<int> seen(64 * 128, 0);
    for (int tid = 0; tid < 128; ++tid)
        for (int i = 0; i < 64; ++i)
            seen[fp_sm90::acc_row(tid / 32, tid % 32, i) * 128 + fp_sm90::acc_col(tid % 32, i)]++;
    for (int x : seen)
        if (x != 1) bad++;
    printf("(b) fragment maps: %ld mismatches\n", bad);
    if (bad) g_failures++;
}

// ---- (c) whole-CTA emulation ---------------------------------------------------

// Shared memory as bytes of h16 elements, NaN-poisoned (an element read
// before it was loaded poisons the result).
struct smem_h16 {
    std::vector<h16> e;
    explicit smem_h16(size_t bytes) : e(bytes / 2, 0x7FFF) {}
    h16 at(uint32_t addr) const { return e[addr / 2]; }
};

// wgmma m64nNk16, D += A B, A from shared memory (K-major descriptor) or
// from registers (a_reg[tid][4], doc layout), B K-major or MN-major.
static void wgmma_emu(float (*d)[64], int N, const smem_h16 &sm, fp_dtype dt, const uint64_t *desc_a,
                      const uint32_t (*a_reg)[4], uint64_t desc_b, bool b_mn_major) {
    float A[64][16], B[16][128];
    if (desc_a) {
        for (int m = 0; m < 64; ++m)
            for (int k = 0; k < 16; ++k) A[m][k] = to_f(sm.at(kmajor_addr(*desc_a, m, k)), dt);
    } else {
        for (int tid = 0; tid < 128; ++tid)
            for (int x = 0; x < 8; ++x) {
                const uint32_t r = a_reg[tid][x / 2];
                A[doc_a_row(tid, x)][doc_a_col(tid, x)] = to_f((h16)(x % 2 ? r >> 16 : r & 0xFFFF), dt);
            }
    }
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < N; ++n)
            B[k][n] = to_f(sm.at(b_mn_major ? mnmajor_addr(desc_b, k, n) : kmajor_addr(desc_b, n, k)), dt);
    for (int tid = 0; tid < 128; ++tid)
        for (int i = 0; i < N / 2; ++i) {
            const int row = doc_d_row(tid, i), col = doc_d_col(tid, i);
            float acc = 0.0f;
            for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
            d[tid][i] += acc;
        }
}

// wgmma groups in flight, per warpgroup (PTX ISA, wgmma.mma_async /
// commit_group / wait_group): a wgmma's accumulator registers and its
// register-A fragment may not be accessed, nor the shared memory it reads be
// written, until a wgmma.wait_group retired its group; groups retire in
// commit order, wait_group N leaves at most the N newest pending. The
// emulation computes every wgmma when it is issued, which equals the hardware
// result only under these rules, so every step of the schedule declares what
// it touches and violations are counted as failures (the hazards ptxas
// answers with an injected wait, C7517, or with serialization, C7514).
enum : unsigned { REG_S = 1, REG_O = 2, REG_P = 4 };
struct wgmma_group {
    unsigned regs;       // accumulator / register-A arrays of its wgmmas
    uint32_t b_lo, b_hi; // shared bytes of its B tile (A = Q is never rewritten)
};
struct inflight_model {
    std::vector<wgmma_group> q[2];
    long violations = 0, checks = 0;
    const char *sched = "";
    void issue(int wg, unsigned regs, uint32_t b_tile, uint32_t bytes) {
        q[wg].push_back({regs, b_tile, b_tile + bytes});
    }
    void wait(int wg, size_t n) {
        while (q[wg].size() > n) q[wg].erase(q[wg].begin());
    }
    void touch(int wg, unsigned regs, const char *what) {
        checks++;
        for (const wgmma_group &g : q[wg])
            if (g.regs & regs) {
                if (violations++ < 3)
                    fprintf(stderr, "%s: %s touches registers of a wgmma still in flight\n", sched, what);
                return;
            }
    }
    void store(uint32_t lo, uint32_t hi, const char *what) {
        checks++;
        for (int wg = 0; wg < 2; ++wg)
            for (const wgmma_group &g : q[wg])
                if (lo < g.b_hi && g.b_lo < hi) {
                    if (violations++ < 3)
                        fprintf(stderr, "%s: %s overwrites a tile a wgmma still in flight reads\n", sched, what);
                    return;
                }
    }
};
static inflight_model g_inflight;

// Pipelined: the kernel's schedule (version 3: traits<D>::kPipelined;
// version 4: the other one).
template <int D, bool Pipelined> static void emulate_cta(emu_args &E, int bx, int hk, int b) {
    using Tr = fp_sm90::traits<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, NT = Tr::kWarpgroups * 128, CH = D / 8;
    const fp_attn_args &a = E.a;
    const fp_dtype dt = a.dtype;
    const int m_tiles = (a.seqlen_q * a.group + Br - 1) / Br;
    int m_tile, split;
    fp_flash::cta_coords(bx, m_tiles, &m_tile, &split);
    const int m0 = m_tile * Br;
    const fp_flash::seq_view S = fp_flash::make_seq(b, a.seqlen_q, a.seqlen_k, a.seqlens_k, a.cu_q, a.cu_k, a.q_bs,
                                                    a.q_ss, a.k_bs, a.k_ss, a.v_bs, a.v_ss, a.o_bs, a.o_ss);
    const int L = S.L, rows = S.sq * a.group;
    if (m0 >= rows) return;
    const fp_flash::block_plan plan =
        fp_flash::plan_block(m0, Br, Bc, rows, a.group, L, S.sq, E.wl, E.wr, split, E.num_splits);
    const float scale_log2 = a.scale * 1.4426950408889634f;
    const uint32_t kQ = Br * D * 2, kKV = Bc * D * 2;
    const uint32_t q_smem = 1024, k_smem = q_smem + kQ, v_smem = k_smem + 2 * kKV;
    smem_h16 sm(v_smem + 2 * kKV);
    const h16 *Q = (const h16 *)a.q;
    const h16 *k_base = (const h16 *)a.k + S.k0 + hk * a.k_hs, *v_base = (const h16 *)a.v + S.v0 + hk * a.v_hs;
    auto cp16 = [&](uint32_t dst, const h16 *src, bool ok) {
        for (int x = 0; x < 8; ++x) sm.e[dst / 2 + x] = ok ? src[x] : (h16)0;
    };
    inflight_model &F = g_inflight;
    F.sched = Pipelined ? "pipelined schedule" : "plain schedule";
    F.q[0].clear();
    F.q[1].clear();
    auto load_tile = [&](uint32_t tile, const h16 *base, int64_t stride, int nrows, int valid) {
        F.store(tile, tile + fp_sm90::tile_bytes<D>(nrows), "cp.async prefetch");
        for (int tid = 0; tid < NT; ++tid)
            for (int idx = tid; idx < nrows * CH; idx += NT) {
                const int r = idx / CH, c = idx % CH;
                const bool ok = r < valid;
                cp16(tile + fp_sm90::tile_chunk_offset<D>(r, c, nrows), ok ? base + r * stride + c * 8 : base, ok);
            }
    };
    // registers, per warpgroup and thread
    static float o_acc[2][128][64], s_acc[2][128][64];
    static float m_run[2][128][2], l_run[2][128][2];
    for (int wg = 0; wg < 2; ++wg)
        for (int tid = 0; tid < 128; ++tid) {
            for (int i = 0; i < D / 2; ++i) o_acc[wg][tid][i] = 0.0f;
            for (int h = 0; h < 2; ++h) m_run[wg][tid][h] = -INFINITY, l_run[wg][tid][h] = 0.0f;
        }
    // One warpgroup's steps, as the kernel's helpers do them.
    static uint32_t p_frag[2][Bc / 16][128][4];
    static float corr[2][128][2];
    auto qk = [&](int wg, uint32_t k_tile) { // issue_qk: zero S, issue, commit
        F.touch(wg, REG_S, "zeroing S");
        F.issue(wg, REG_S, k_tile, kKV);
        for (int tid = 0; tid < 128; ++tid)
            for (int i = 0; i < 64; ++i) s_acc[wg][tid][i] = 0.0f;
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint64_t da = fp_sm90::q_desc<D>(q_smem, Br, 64 * wg, kk);
            wgmma_emu(s_acc[wg], Bc, sm, dt, &da, nullptr, fp_sm90::k_desc<D>(k_tile, Bc, kk), false);
        }
    };
    auto softmax = [&](int wg, int n0) { // mask_tile + softmax_tile -> corr
        F.touch(wg, REG_S, "softmax");
        float(*s)[64] = s_acc[wg];
        for (int tid = 0; tid < 128; ++tid) {
            const int warp = tid / 32, lane = tid % 32;
            if (fp_flash::tile_needs_mask(plan, n0, Bc))
                for (int h = 0; h < 2; ++h) {
                    int lo, hi; // the kernel: row_ctx.row0 + 8 h
                    fp_flash::row_keys(m0 + 64 * wg + fp_sm90::acc_row(warp, lane, 0) + 8 * h, a.group, L, S.sq,
                                       E.wl, E.wr, &lo, &hi);
                    for (int j = 0; j < Bc / 8; ++j)
                        for (int c = 0; c < 2; ++c) {
                            const int col = n0 + fp_sm90::acc_col(lane, 4 * j + 2 * h + c);
                            if (col < lo || col > hi) s[tid][4 * j + 2 * h + c] = -INFINITY;
                        }
                }
        }
        for (int h = 0; h < 2; ++h) {
            float mx[128], qm[128];
            for (int tid = 0; tid < 128; ++tid) {
                mx[tid] = m_run[wg][tid][h];
                for (int j = 0; j < Bc / 8; ++j)
                    mx[tid] = fmaxf(mx[tid], fmaxf(s[tid][4 * j + 2 * h], s[tid][4 * j + 2 * h + 1]));
            }
            for (int tid = 0; tid < 128; ++tid) qm[tid] = fmaxf(mx[tid], mx[tid ^ 1]); // shfl_xor 1, 2
            for (int tid = 0; tid < 128; ++tid) mx[tid] = fmaxf(qm[tid], qm[tid ^ 2]);
            for (int tid = 0; tid < 128; ++tid) {
                const float m_scaled = mx[tid] == -INFINITY ? 0.0f : mx[tid] * scale_log2;
                corr[wg][tid][h] = exp2f(m_run[wg][tid][h] * scale_log2 - m_scaled);
                m_run[wg][tid][h] = mx[tid];
                float rs = 0.0f;
                for (int j = 0; j < Bc / 8; ++j)
                    for (int c = 0; c < 2; ++c) {
                        const float e = exp2f(fmaf(s[tid][4 * j + 2 * h + c], scale_log2, -m_scaled));
                        s[tid][4 * j + 2 * h + c] = e;
                        rs += e;
                    }
                l_run[wg][tid][h] = l_run[wg][tid][h] * corr[wg][tid][h] + rs;
            }
        }
    };
    auto rescale = [&](int wg) {
        F.touch(wg, REG_O, "O rescale");
        for (int tid = 0; tid < 128; ++tid)
            for (int j = 0; j < D / 8; ++j)
                for (int h = 0; h < 2; ++h) {
                    o_acc[wg][tid][4 * j + 2 * h] *= corr[wg][tid][h];
                    o_acc[wg][tid][4 * j + 2 * h + 1] *= corr[wg][tid][h];
                }
    };
    auto pack = [&](int wg) {
        F.touch(wg, REG_S | REG_P, "P pack");
        for (int tid = 0; tid < 128; ++tid)
            for (int kk = 0; kk < Bc / 16; ++kk)
                for (int r = 0; r < 4; ++r) {
                    const int i = fp_sm90::p_src(kk, r);
                    p_frag[wg][kk][tid][r] =
                        (uint32_t)from_f(s_acc[wg][tid][i], dt) | ((uint32_t)from_f(s_acc[wg][tid][i + 1], dt) << 16);
                }
    };
    auto pv = [&](int wg, uint32_t v_tile) { // issue_pv: issue, commit (reads O and P)
        F.issue(wg, REG_O | REG_P, v_tile, kKV);
        for (int kk = 0; kk < Bc / 16; ++kk)
            wgmma_emu(o_acc[wg], D, sm, dt, nullptr, p_frag[wg][kk], fp_sm90::v_desc<D>(v_tile, Bc, kk), true);
    };
    const int s_begin = plan.s_begin, s_end = plan.s_end;
    // K / V tile x lives in stage (x - s_begin) & 1, as the kernel's load_k / load_v put it.
    auto k_stage = [&](int x) { return k_smem + ((x - s_begin) & 1) * kKV; };
    auto v_stage = [&](int x) { return v_smem + ((x - s_begin) & 1) * kKV; };
    auto load_k = [&](int x) { load_tile(k_stage(x), k_base + (int64_t)x * Bc * a.k_ss, a.k_ss, Bc, L - x * Bc); };
    auto load_v = [&](int x) { load_tile(v_stage(x), v_base + (int64_t)x * Bc * a.v_ss, a.v_ss, Bc, L - x * Bc); };
    // The prefetch at the top of an iteration must leave the tiles that
    // iteration's wgmmas read untouched.
    auto snapshot = [&](uint32_t tile) {
        return std::vector<h16>(sm.e.begin() + tile / 2, sm.e.begin() + (tile + kKV) / 2);
    };
    auto unchanged = [&](const std::vector<h16> &snap, uint32_t tile) {
        if (!std::equal(snap.begin(), snap.end(), sm.e.begin() + tile / 2)) {
            fprintf(stderr, "prefetch overwrote a tile in use\n");
            g_failures++;
        }
    };
    if (s_begin < s_end) {
        for (int tid = 0; tid < NT; ++tid)
            for (int idx = tid; idx < Br * CH; idx += NT) {
                const int r = idx / CH, c = idx % CH, gr = m0 + r;
                const bool ok = gr < rows;
                const h16 *src = Q;
                if (ok)
                    src += S.q0 + (int64_t)(gr / a.group) * a.q_ss + (int64_t)(hk * a.group + gr % a.group) * a.q_hs +
                           c * 8;
                cp16(q_smem + fp_sm90::tile_chunk_offset<D>(r, c, Br), src, ok);
            }
        load_k(s_begin);
        load_v(s_begin);
        if (Pipelined) {
            if (s_begin + 1 < s_end) load_k(s_begin + 1);
            for (int wg = 0; wg < 2; ++wg)
                if (m0 + 64 * wg < rows) {
                    qk(wg, k_stage(s_begin));
                    F.wait(wg, 0);
                    softmax(wg, s_begin * Bc); // O = 0: the first rescale keeps it 0
                }
            for (int t = s_begin; t < s_end; ++t) {
                const bool has_next = t + 1 < s_end;
                for (int wg = 0; wg < 2; ++wg) {
                    F.wait(wg, 0); // P V of t-1 (every warpgroup, before the barrier)
                    if (!(m0 + 64 * wg < rows)) continue;
                    rescale(wg); // corr of t
                    pack(wg);    // P of t
                }
                const std::vector<h16> k_use = snapshot(k_stage(t + 1)), v_use = snapshot(v_stage(t));
                if (t + 2 < s_end) load_k(t + 2);
                if (has_next) load_v(t + 1);
                if (has_next) unchanged(k_use, k_stage(t + 1));
                unchanged(v_use, v_stage(t));
                for (int wg = 0; wg < 2; ++wg) {
                    if (!(m0 + 64 * wg < rows)) continue;
                    if (has_next) {
                        qk(wg, k_stage(t + 1)); // committed before P V of t, retired first
                        pv(wg, v_stage(t));
                        F.wait(wg, 1);             // Q K^T of t+1 retired, P V of t in flight
                        softmax(wg, (t + 1) * Bc); // under P V of t
                    } else {
                        pv(wg, v_stage(t));
                    }
                }
            }
            for (int wg = 0; wg < 2; ++wg) F.wait(wg, 0);
        } else {
            for (int t = s_begin; t < s_end; ++t) {
                const std::vector<h16> k_use = snapshot(k_stage(t)), v_use = snapshot(v_stage(t));
                if (t + 1 < s_end) {
                    load_k(t + 1);
                    load_v(t + 1);
                }
                unchanged(k_use, k_stage(t));
                unchanged(v_use, v_stage(t));
                for (int wg = 0; wg < 2; ++wg) {
                    if (!(m0 + 64 * wg < rows)) continue;
                    qk(wg, k_stage(t));
                    F.wait(wg, 0);
                    softmax(wg, t * Bc);
                    rescale(wg);
                    pack(wg);
                    pv(wg, v_stage(t)); // after the second barrier
                    F.wait(wg, 0);
                }
            }
        }
    }
    for (int wg = 0; wg < 2; ++wg) {
        F.touch(wg, REG_O, "epilogue");
        if (!F.q[wg].empty()) F.violations++; // the CTA exits with wgmmas in flight
    }
    for (int wg = 0; wg < 2; ++wg)
        for (int h = 0; h < 2; ++h) {
            float lq[128], ls[128];
            for (int tid = 0; tid < 128; ++tid) lq[tid] = l_run[wg][tid][h] + l_run[wg][tid ^ 1][h];
            for (int tid = 0; tid < 128; ++tid) ls[tid] = lq[tid] + lq[tid ^ 2];
            for (int tid = 0; tid < 128; ++tid) {
                const int warp = tid / 32, lane = tid % 32;
                const float l = ls[tid];
                const int r = m0 + 64 * wg + fp_sm90::acc_row(warp, lane, 2 * h);
                if (r >= rows) continue;
                const int qi = r / a.group, head = hk * a.group + r % a.group;
                const float inv = l > 0.0f ? 1.0f / l : 0.0f;
                const float lse =
                    l > 0.0f ? (m_run[wg][tid][h] * scale_log2 + log2f(l)) * 0.69314718055994531f : -INFINITY;
                const int col0 = fp_sm90::acc_col(lane, 2 * h);
                const float *oa = o_acc[wg][tid];
                if (E.num_splits == 1) {
                    h16 *o = (h16 *)a.o + S.o0 + (int64_t)qi * a.o_ss + (int64_t)head * a.o_hs;
                    for (int j = 0; j < D / 8; ++j) {
                        o[j * 8 + col0] = from_f(oa[4 * j + 2 * h] * inv, dt);
                        o[j * 8 + col0 + 1] = from_f(oa[4 * j + 2 * h + 1] * inv, dt);
                    }
                    if (a.lse && (lane & 3) == 0) a.lse[((int64_t)b * a.heads_q + head) * a.seqlen_q + qi] = lse;
                } else {
                    const int64_t prow = (((int64_t)split * a.batch + b) * a.heads_q + head) * a.seqlen_q + qi;
                    float *o = E.o_part.data() + prow * D;
                    for (int j = 0; j < D / 8; ++j) {
                        o[j * 8 + col0] = oa[4 * j + 2 * h] * inv;
                        o[j * 8 + col0 + 1] = oa[4 * j + 2 * h + 1] * inv;
                    }
                    if ((lane & 3) == 0) E.lse_part[prow] = lse;
                }
            }
        }
}

template <int D, bool Pipelined> static void emulate(emu_args &E) {
    emulate_grid<D>(E, fp_sm90::traits<D>::kBr, emulate_cta<D, Pipelined>);
}

// version 3: the kernel's schedule (traits<D>::kPipelined), 4: the other one.
static void launch(emu_args &E, int d, int version) {
    const bool flip = version == 4;
    if (d == 64) fp_sm90::traits<64>::kPipelined != flip ? emulate<64, true>(E) : emulate<64, false>(E);
    else fp_sm90::traits<128>::kPipelined != flip ? emulate<128, true>(E) : emulate<128, false>(E);
}

// fp_attn_cuda_flash_version(a, 3, ...) answers before touching a device:
// without an sm_90a build always FP_ERR_UNSUPPORTED; with one, for what the
// kernel does not handle (checked before the device query).
static void check_dispatch() {
    std::vector<h16> buf(4 * 64 * 128, 0x3C00);
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = 1; p.seqlen_q = p.seqlen_k = 64; p.heads_q = p.heads_kv = 1; p.head_dim = 128; p.dtype = FP_BF16;
    p.q = buf.data(); p.k = buf.data() + 64 * 128; p.v = buf.data() + 2 * 64 * 128; p.o = buf.data() + 3 * 64 * 128;
    fp_attn_args a;
    long bad = 0;
    if (fp_attn_check(&p, 1, &a) != FP_OK) bad++;
#ifdef FASTPATH_HAVE_SM90A
    fp_attn_args a96 = a;
    a96.head_dim = 96;
    fp_attn_args af32 = a;
    af32.dtype = FP_F32;
    if (fp_attn_cuda_flash_version(&a96, 3, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    if (fp_attn_cuda_flash_version(&af32, 3, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    if (fp_attn_cuda_flash_version(&a, 3, 0, nullptr) != FP_ERR_INVALID_ARGUMENT) bad++;
    if (fp_attn_cuda_flash_version(&a96, 4, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    if (fp_attn_cuda_flash_version(&a, 5, 1, nullptr) != FP_ERR_INVALID_ARGUMENT) bad++;
    printf("dispatch (sm_90a build): unsupported shapes refused before any device call: %s\n", bad ? "NO" : "yes");
#else
    if (fp_attn_cuda_flash_version(&a, 4, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    const fp_status st = fp_attn_cuda_flash_version(&a, 3, 1, nullptr);
    if (st != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "sm_90a")) bad++;
    printf("dispatch (no sm_90a build): version 3 -> %s (%s)\n", fp_status_string(st), fp_last_error());
#endif
    if (bad) g_failures++;
}

int main() {
    check_dispatch();
    check_descriptors<64>();
    check_descriptors<128>();
    check_fragments();
    static const emu_case cases[] = {
        /* name               b  sq   sk   hq hkv d    dtype    causal wl  wr rag splits pad varlen */
        {"bf16_d64_17x17",    1, 17,  17,  2, 2, 64,  FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_d128_1x1",      2, 1,   1,   2, 1, 128, FP_F16,  0, -1, -1, 0, 1, 0, 0},
        {"bf16_d128_130x300", 1, 130, 300, 1, 1, 128, FP_BF16, 0, -1, -1, 0, 1, 8, 0},
        {"f16_d64_causal",    1, 150, 150, 1, 1, 64,  FP_F16,  1, -1, -1, 0, 1, 0, 0},
        {"bf16_causal_q<k",   1, 33,  290, 2, 1, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_causal_q>k",    1, 200, 40,  1, 1, 128, FP_F16,  1, -1, -1, 0, 1, 0, 0},
        {"bf16_gqa3_causal",  1, 70,  140, 6, 2, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_window",        1, 200, 270, 1, 1, 64,  FP_F16,  0, 30, 5, 0, 1, 0, 0},
        {"bf16_win_causal",   1, 190, 300, 1, 1, 128, FP_BF16, 1, 70, -1, 0, 1, 0, 0},
        {"f16_decode_split3", 2, 1,   700, 8, 1, 128, FP_F16,  0, -1, -1, 0, 3, 0, 0},
        {"bf16_dec_rag_s2",   4, 2,   333, 4, 2, 64,  FP_BF16, 1, -1, -1, 1, 2, 8, 0},
        {"f16_prefill_split2",1, 100, 300, 1, 1, 64,  FP_F16,  1, -1, -1, 0, 2, 0, 0},
        {"bf16_varlen",       5, 70,  140, 2, 2, 64,  FP_BF16, 0, -1, -1, 0, 1, 0, 1},
        {"f16_varlen_causal", 4, 100, 60,  4, 2, 128, FP_F16,  1, -1, -1, 0, 1, 8, 1},
        {"f16_window_intmax", 1, 70,  150, 2, 2, 64,  FP_F16,  0, 2147483647, 2147483647, 0, 1, 0, 0},
        /* D = 128 runs the pipelined schedule: several tiles, masks mid-way */
        {"f16_d128_win_5t",   1, 300, 600, 1, 1, 128, FP_F16,  0, 150, 20, 0, 1, 0, 0},
        {"bf16_d128_gqa4_c",  1, 60,  520, 4, 1, 128, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"bf16_d128_rag_s2",  3, 40,  700, 2, 1, 128, FP_BF16, 0, -1, -1, 1, 2, 8, 0},
    };
    emu_rng rng = {0x9E3779B97F4A7C15ULL};
    for (const emu_case &c : cases) {
        if (!emu_run_case(c, rng, "(c) ", 3, launch)) g_failures++;
        if (!emu_run_case(c, rng, "(c) ", 4, launch)) g_failures++; /* v4: the other schedule */
    }
    printf("(d) wgmma in-flight rules (both schedules, all cases): %ld register / shared-memory accesses checked, "
           "%ld violations\n",
           g_inflight.checks, g_inflight.violations);
    if (g_inflight.violations || !g_inflight.checks) g_failures++;
    if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
    return g_failures ? 1 : 0;
}
