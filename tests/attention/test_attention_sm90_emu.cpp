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
//   (e) version 5 (TMA): the K / V boxes of the kernel's tensor-map
//       geometry and coordinates, landed with TMA's 128-byte swizzle in
//       its ring stages, read through the same descriptors element by
//       element (OOB rows zero), and the layouts TMA cannot describe are
//       refused (its mbarrier pipeline: test_attention_tma_emu).
// What it cannot see: races between threads (barrier / fence placement),
// whether ptxas keeps the PTX order (C7514 / C7517 and the SASS order are
// checked by hand: benchmarks/NOTES.md), PTX syntax, register allocation.
// Those need test_attention_gpu on an H100.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/attention_sm90_layout.h"
#include "attention/attention_tma_sm90.h"
#include "attn_emu_util.h"
#include "sm90_isa.h"

static int g_failures = 0;

// ---- the hardware, from the PTX ISA ------------------------------------------
// tests/emu/sm90_isa.h (the same model the CUDA emulation's wgmma uses).
using sm90_isa::desc_ok;
using sm90_isa::doc_a_col;
using sm90_isa::doc_a_row;
using sm90_isa::doc_d_col;
using sm90_isa::doc_d_row;
using sm90_isa::kmajor_addr;
using sm90_isa::mnmajor_addr;
using sm90_isa::swizzle128;

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

// ---- (e) version 5: TMA boxes vs the wgmma descriptors ----------------------
// cp.async.bulk.tensor with a 4-D tiled tensor map (CUDA driver API
// cuTensorMapEncodeTiled; PTX ISA "Tensor copy" / "tensor-map"): the box at
// coordinates (x0, y0, z, w) reads element (x0 + x, y0 + y, z, w) from
// global byte address base + (x0 + x) * 2 + (y0 + y) * stride[0] + z *
// stride[1] + w * stride[2], zero when any coordinate is >= its dim, and
// stores it at dst + y * (box[0] * 2) + x * 2 (the box is dense in shared
// memory) with the 128-byte swizzle applied to the address (dst on a
// 1024-byte boundary). K / V tiles of v5 through the kernel's geometry
// (fp_tma::kv_map_geometry), coordinates (fp_tma::box_coords), stage
// offsets, read back through v3's descriptors (fp_sm90::k_desc / v_desc).
template <int D> static void check_tma_boxes() {
    using Tr = fp_tma::traits_v5<D>;
    constexpr int Bc = Tr::kBc;
    const int batch = 2, sk = 200, hkv = 3; // 200 keys: tile 1 runs past the end (zero fill)
    const int64_t ss = hkv * D + 8, hs = D, bs = (int64_t)sk * ss; // padded rows (16 bytes)
    // global memory: each element holds its own index + 1 (0 = TMA's fill)
    std::vector<int32_t> gmem((size_t)(batch * bs));
    for (size_t i = 0; i < gmem.size(); ++i) gmem[i] = (int32_t)i + 1;
    const uintptr_t base = 4096; // pretend device address of element 0
    fp_tma::kv_map m;
    long bad = 0, checked = 0;
    if (fp_tma::kv_map_geometry(base, D, sk, hkv, batch, ss, hs, bs, Bc, &m) != fp_tma::KV_MAP_OK) bad++;
    const uint32_t smem0 = 1024;
    for (int b = 0; b < batch; ++b)
        for (int hk = 0; hk < hkv; ++hk)
            for (int t = 0; t < 2; ++t)
                for (int stage = 0; stage < Tr::kStages; ++stage)
                    for (int is_v = 0; is_v < 2; ++is_v) {
                        const uint32_t tile = smem0 + (is_v ? fp_tma::v_offset<D>(stage) : fp_tma::k_offset<D>(stage));
                        tag_smem sm(smem0 + fp_tma::smem_bytes<D>());
                        for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c) {
                            int xyzw[4];
                            fp_tma::box_coords<D>(c, t, hk, b, xyzw);
                            const uint32_t dst = tile + fp_tma::box_smem_offset(c, Bc);
                            if (dst % 1024) bad++;
                            for (uint32_t y = 0; y < m.box[1]; ++y)
                                for (uint32_t x = 0; x < m.box[0]; ++x) {
                                    const uint64_t g[4] = {(uint64_t)xyzw[0] + x, (uint64_t)xyzw[1] + y,
                                                           (uint64_t)xyzw[2], (uint64_t)xyzw[3]};
                                    int32_t v = 0;
                                    if (g[0] < m.dims[0] && g[1] < m.dims[1] && g[2] < m.dims[2] && g[3] < m.dims[3]) {
                                        const uint64_t addr = base + g[0] * 2 + g[1] * m.strides[0] +
                                                              g[2] * m.strides[1] + g[3] * m.strides[2];
                                        v = gmem[(addr - base) / 2];
                                    }
                                    sm.slot[swizzle128(dst + y * (m.box[0] * 2) + x * 2) / 2] = v;
                                }
                        }
                        // what the kernel means: K / V [b][key t Bc + n][hk][col]
                        auto want = [&](int key, int col) {
                            const int j = t * Bc + key;
                            return j < sk ? (int32_t)(b * bs + j * ss + hk * hs + col) + 1 : 0;
                        };
                        auto expect = [&](uint32_t addr, int32_t w) {
                            checked++;
                            if (addr / 2 >= sm.slot.size() || sm.slot[addr / 2] != w) {
                                if (bad < 5)
                                    fprintf(stderr, "(e) D=%d: wgmma reads addr %u holding %d, kernel means %d\n", D,
                                            addr, addr / 2 < sm.slot.size() ? sm.slot[addr / 2] : -2, w);
                                bad++;
                            }
                        };
                        if (!is_v) {
                            for (int kk = 0; kk < D / 16; ++kk) {
                                const uint64_t db = fp_sm90::k_desc<D>(tile, Bc, kk);
                                for (int n = 0; n < Bc; ++n)
                                    for (int k = 0; k < 16; ++k) expect(kmajor_addr(db, n, k), want(n, 16 * kk + k));
                            }
                        } else {
                            for (int kk = 0; kk < Bc / 16; ++kk) {
                                const uint64_t db = fp_sm90::v_desc<D>(tile, Bc, kk);
                                for (int k = 0; k < 16; ++k)
                                    for (int n = 0; n < D; ++n) expect(mnmajor_addr(db, k, n), want(16 * kk + k, n));
                            }
                        }
                    }
    // layouts TMA cannot describe are refused, unit dimensions' strides ignored
    fp_tma::kv_map m2;
    if (fp_tma::kv_map_geometry(base + 8, D, sk, hkv, batch, ss, hs, bs, Bc, &m2) != fp_tma::KV_MAP_BASE_ALIGN) bad++;
    if (fp_tma::kv_map_geometry(base, D, sk, hkv, batch, ss + 4, hs, bs, Bc, &m2) != fp_tma::KV_MAP_SEQ_STRIDE) bad++;
    if (fp_tma::kv_map_geometry(base, D, sk, hkv, batch, ss, hs + 4, bs, Bc, &m2) != fp_tma::KV_MAP_HEAD_STRIDE) bad++;
    if (fp_tma::kv_map_geometry(base, D, sk, hkv, batch, ss, hs, 0, Bc, &m2) != fp_tma::KV_MAP_BATCH_STRIDE) bad++;
    if (fp_tma::kv_map_geometry(base, D, sk, 1, 1, ss, 3, 5, Bc, &m2) != fp_tma::KV_MAP_OK) bad++;
    if (fp_tma::smem_bytes<D>() > 232448) bad++; // 227 KiB: the opt-in limit of a 9.0 device
    // O's map for the TMA-store epilogue (fp_tma::o_map_geometry): row j of
    // the box at (64 c, 0, m0 / group, hk, b) is packed row m0 + j of KV head
    // hk, i.e. O[b][(m0 + j) / group][hk group + (m0 + j) % group][64 c ..],
    // for the groups that divide 64; the others and bad layouts refused.
    for (int group : {1, 2, 8, 64}) {
        const int sq = 37, hq = hkv * group;
        const int64_t oss = (int64_t)hq * D + 8, ohs = D, obs = sq * oss;
        fp_tma::o_map om;
        if (fp_tma::o_map_geometry(base, D, sq, hkv, group, batch, oss, ohs, obs, &om) != fp_tma::KV_MAP_OK) {
            bad++;
            continue;
        }
        if (om.box[0] * 2 != 128 || om.box[1] * om.box[2] != 64 || om.box[3] != 1 || om.box[4] != 1) bad++;
        for (int b = 0; b < batch; ++b)
            for (int hk = 0; hk < hkv; ++hk)
                for (int m0 = 0; m0 < sq * group; m0 += 64)
                    for (int j = 0; j < 64; ++j) {
                        const int r = m0 + j;
                        // the box's element (x = 0, row j) through the map
                        const uint64_t g[5] = {0, (uint64_t)(j % group), (uint64_t)(m0 / group + j / group),
                                               (uint64_t)hk, (uint64_t)b};
                        bool in = true;
                        uint64_t addr = base;
                        for (int i = 0; i < 5; ++i) {
                            in &= g[i] < om.dims[i];
                            if (i) addr += g[i] * om.strides[i - 1];
                        }
                        const bool want_in = r < sq * group;
                        const uint64_t want = base + 2 * ((uint64_t)b * obs + (uint64_t)(r / group) * oss +
                                                          (uint64_t)(hk * group + r % group) * ohs);
                        checked++;
                        if (in != want_in || (in && addr != want)) {
                            if (bad < 5) fprintf(stderr, "(o) group %d: row %d of KV head %d maps wrong\n", group, r, hk);
                            bad++;
                        }
                    }
    }
    {
        fp_tma::o_map om;
        const int64_t oss = 2 * hkv * D;
        if (fp_tma::o_map_geometry(base, D, 9, hkv, 3, batch, oss, D, 9 * oss, &om) != fp_tma::KV_MAP_GROUP) bad++;
        if (fp_tma::o_map_geometry(base + 8, D, 9, hkv, 2, batch, oss, D, 9 * oss, &om) != fp_tma::KV_MAP_BASE_ALIGN)
            bad++;
        if (fp_tma::o_map_geometry(base, D, 9, hkv, 2, batch, oss + 4, D, 9 * oss, &om) != fp_tma::KV_MAP_SEQ_STRIDE)
            bad++;
        if (fp_tma::o_map_geometry(base, D, 9, hkv, 2, batch, oss, D + 4, 9 * oss, &om) != fp_tma::KV_MAP_HEAD_STRIDE)
            bad++;
        if (fp_tma::o_map_geometry(base, D, 9, hkv, 2, batch, oss, D, 0, &om) != fp_tma::KV_MAP_BATCH_STRIDE) bad++;
        if (fp_tma::o_map_geometry(base, D, 1, 1, 1, 1, 3, 5, 7, &om) != fp_tma::KV_MAP_OK) bad++; // unit dims
    }
    // varlen: one map over the packed rows (total_k, batch 1); sequence b's
    // tile t is the box at (64 c, cu[b] + t kBc, hk, 0) (kv_seq_rows,
    // box_coords): its own rows, then the next sequence's, TMA's zeros past
    // total_k. Offsets outside [0, total_k] read as a sequence at total_k.
    {
        const int total = 300, cu[4] = {0, 150, 150, 290}; // lengths 150, 0, 140; 10 spare rows
        fp_tma::kv_map mp;
        if (fp_tma::kv_map_geometry(base, D, total, hkv, 1, ss, hs, 0, Bc, &mp) != fp_tma::KV_MAP_OK) bad++;
        if (mp.dims[1] != (uint64_t)total || mp.dims[3] != 1) bad++;
        for (int b = 0; b < 3; ++b) {
            const fp_tma::seq_rows r = fp_tma::kv_seq_rows(cu, b, sk, total);
            if (r.row0 != cu[b] || r.bz != 0 || r.map_rows != total - cu[b]) bad++;
            for (int t = 0; t < 3; ++t)
                for (int hk = 0; hk < hkv; ++hk)
                    for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c) {
                        int xyzw[4];
                        fp_tma::box_coords<D>(c, t, hk, r.bz, xyzw, r.row0);
                        for (uint32_t y = 0; y < mp.box[1]; ++y)
                            for (uint32_t x = 0; x < mp.box[0]; x += 7) {
                                const uint64_t g0 = (uint64_t)xyzw[0] + x, g1 = (uint64_t)xyzw[1] + y;
                                const bool in = g0 < mp.dims[0] && g1 < mp.dims[1] && (uint64_t)xyzw[2] < mp.dims[2] &&
                                                (uint64_t)xyzw[3] < mp.dims[3];
                                const int64_t got = in ? (int64_t)(g0 + g1 * (mp.strides[0] / 2) +
                                                                   (uint64_t)xyzw[2] * (mp.strides[1] / 2)) + 1
                                                       : 0;
                                const int64_t row = (int64_t)cu[b] + (int64_t)t * Bc + y;
                                const int64_t want = row < total ? row * ss + hk * hs + 64 * c + x + 1 : 0;
                                checked++;
                                if (got != want) bad++;
                            }
                    }
        }
        const int cu_bad[3] = {-5, 400, 300};
        for (int b = 0; b < 3; ++b) {
            const fp_tma::seq_rows r = fp_tma::kv_seq_rows(cu_bad, b, sk, total);
            if (r.row0 != (b == 0 ? total : b == 1 ? total : 300) || r.map_rows != 0 || r.bz != 0) bad++;
        }
        const fp_tma::seq_rows rb = fp_tma::kv_seq_rows(nullptr, 1, sk, total); // batched: its own map batch
        if (rb.row0 != 0 || rb.bz != 1 || rb.map_rows != sk) bad++;
    }
    printf("(e) D=%d: v5 TMA boxes -> wgmma descriptors: %ld elements read, %ld wrong\n", D, checked, bad);
    if (bad) g_failures++;
}

// Paged KV: one map over the page pool, (D, page_size, heads_kv, pages),
// boxes of B = paged_box_rows(page_size) rows; tile t of sequence b is
// kBc / B boxes, box j at coordinates (64 c, row, hk, page) of
// fp_tma::paged_box_at(.., j, B), landing at row j B of the tile. Loaded
// as the hardware would (each box swizzled at its own destination) and
// read back through v3's descriptors, the tile must be K / V [b][key t kBc
// + n] as the block table maps it: keys past the sequence's length L
// rounded up to a box (paged_map_rows) and entries outside [0, pages)
// zeros. The table's entries past a sequence's
// pages hold a valid page, so a lookup there would show. Page sizes: 8,
// 16 (several boxes a tile), 48 (16-row boxes, found by division), 256 (a
// tile inside a page); pow2 sizes both by shift and by division.
template <int D> static void check_tma_paged_boxes() {
    constexpr int Bc = fp_tma::traits_v5<D>::kBc;
    const int batch = 2, sk = 300, hkv = 2, Ls[2] = {sk, 17};
    const int64_t ss = hkv * D + 8, hs = D;
    const uintptr_t base = 4096;
    const uint32_t smem0 = 1024;
    long bad = 0, checked = 0;
    for (int P : {8, 16, 48, 256})
        for (int by_div = 0; by_div < 2; ++by_div) {
            const int shift = by_div || (P & (P - 1)) ? -1 : __builtin_ctz((unsigned)P);
            const int B = fp_tma::paged_box_rows(P);
            if (B < 8 || Bc % B || P % B) bad++;
            const int per = (sk + P - 1) / P, np = batch * per + 1;
            const int64_t ps = (int64_t)P * ss + 8; // page stride, a gap between pages
            std::vector<int32_t> pool((size_t)(np * ps));
            for (size_t i = 0; i < pool.size(); ++i) pool[i] = (int32_t)i + 1;
            std::vector<int32_t> bt((size_t)batch * per, 0); // unused entries: page 0, valid
            for (int b = 0; b < batch; ++b) {
                const int used = (Ls[b] + P - 1) / P;
                for (int e = 0; e < used; ++e) bt[(size_t)b * per + e] = np - 1 - (b * per + e);
            }
            if (per > 2) bt[1] = np + 5; // sequence 0's second page out of range: zeros
            fp_tma::kv_map m = {};
            if (fp_tma::kv_map_geometry(base, D, P, hkv, np, ss, hs, ps, B, &m) != fp_tma::KV_MAP_OK) bad++;
            if (m.box[1] != (uint32_t)B || m.dims[1] != (uint64_t)P || m.dims[3] != (uint64_t)np) bad++;
            for (int b = 0; b < batch; ++b)
                for (int t = 0; t * Bc < sk; ++t)
                    for (int hk = 0; hk < hkv; ++hk)
                        for (int is_v = 0; is_v < 2; ++is_v) {
                            const uint32_t tile = smem0 + (is_v ? fp_tma::v_offset<D>(1) : fp_tma::k_offset<D>(1));
                            tag_smem sm(smem0 + fp_tma::smem_bytes<D>());
                            for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c)
                                for (int j = 0; j < Bc / B; ++j) {
                                    const fp_tma::paged_box x0 = fp_tma::paged_box_at(
                                        bt.data() + (size_t)b * per, P, shift, np, Ls[b], t, j, B);
                                    const uint32_t dst = tile + fp_tma::box_smem_offset(c, Bc) + (uint32_t)(j * B * 128);
                                    if (dst % 1024) bad++;
                                    for (int y = 0; y < B; ++y)
                                        for (int x = 0; x < 64; ++x) {
                                            const uint64_t g[4] = {(uint64_t)(64 * c + x), (uint64_t)(x0.row + y),
                                                                   (uint64_t)hk, (uint64_t)x0.page};
                                            int32_t v = 0;
                                            if (g[0] < m.dims[0] && g[1] < m.dims[1] && g[2] < m.dims[2] &&
                                                g[3] < m.dims[3])
                                                v = pool[(size_t)((g[0] * 2 + g[1] * m.strides[0] +
                                                                   g[2] * m.strides[1] + g[3] * m.strides[2]) / 2)];
                                            sm.slot[swizzle128(dst + y * 128 + x * 2) / 2] = v;
                                        }
                                }
                            auto want = [&](int key, int col) {
                                // rows past L up to the end of its box are the page's own (the
                                // kernel masks K there and clears V: paged_map_rows); then zeros
                                const int j = t * Bc + key;
                                if (j >= fp_tma::paged_map_rows(Ls[b], B)) return 0;
                                const int pg = bt[(size_t)b * per + j / P];
                                if (pg < 0 || pg >= np) return 0;
                                return (int)(pg * ps + (j % P) * ss + hk * hs + col) + 1;
                            };
                            auto expect = [&](uint32_t addr, int32_t w) {
                                checked++;
                                if (addr / 2 >= sm.slot.size() || sm.slot[addr / 2] != w) {
                                    if (bad < 5)
                                        fprintf(stderr, "(e) D=%d paged %d: addr %u holds %d, the table means %d\n",
                                                D, P, addr, addr / 2 < sm.slot.size() ? sm.slot[addr / 2] : -2, w);
                                    bad++;
                                }
                            };
                            if (!is_v) {
                                for (int kk = 0; kk < D / 16; ++kk) {
                                    const uint64_t db = fp_sm90::k_desc<D>(tile, Bc, kk);
                                    for (int n = 0; n < Bc; ++n)
                                        for (int k = 0; k < 16; ++k)
                                            expect(kmajor_addr(db, n, k), want(n, 16 * kk + k));
                                }
                            } else {
                                for (int kk = 0; kk < Bc / 16; ++kk) {
                                    const uint64_t db = fp_sm90::v_desc<D>(tile, Bc, kk);
                                    for (int k = 0; k < 16; ++k)
                                        for (int n = 0; n < D; ++n)
                                            expect(mnmajor_addr(db, k, n), want(16 * kk + k, n));
                                }
                            }
                        }
            // the rows the loads bring from real pages: L rounded up to a box
            if (fp_tma::paged_map_rows(17, B) != (17 + B - 1) / B * B || fp_tma::paged_map_rows(0, B) != 0) bad++;
        }
    printf("(e) D=%d: v5 paged TMA boxes -> wgmma descriptors: %ld elements read, %ld wrong\n", D, checked, bad);
    if (bad) g_failures++;
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

// ---- one warpgroup's math, the same in the v3 / v4 and v5 emulations ------
// (the test's own model of the kernels' mask_tile / softmax_tile / rescale_o /
// pack_p / epilogue, per thread of a warpgroup; the quad shuffles are the
// tid ^ 1, tid ^ 2 partners)

// The rows of one warpgroup: row0 is its first packed row (m0 + 64 wg).
struct emu_rows {
    const fp_flash::block_plan *plan;
    int row0, group, L, sq, wl, wr;
    float scale_log2;
};

// mask_tile + softmax_tile on the tile of keys n0 .. n0 + Bc - 1: S -> P in
// s, running max / sum updated, corr = the factor of O's rows.
template <int Bc>
static void emu_softmax(const emu_rows &R, int n0, float (*s)[64], float (*m_run)[2], float (*l_run)[2],
                        float (*corr)[2]) {
    for (int tid = 0; tid < 128; ++tid) {
        const int warp = tid / 32, lane = tid % 32;
        if (fp_flash::tile_needs_mask(*R.plan, n0, Bc))
            for (int h = 0; h < 2; ++h) {
                int lo, hi; // the kernel: row_ctx.row0 + 8 h
                fp_flash::row_keys(R.row0 + fp_sm90::acc_row(warp, lane, 0) + 8 * h, R.group, R.L, R.sq, R.wl, R.wr,
                                   &lo, &hi);
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
            mx[tid] = m_run[tid][h];
            for (int j = 0; j < Bc / 8; ++j)
                mx[tid] = fmaxf(mx[tid], fmaxf(s[tid][4 * j + 2 * h], s[tid][4 * j + 2 * h + 1]));
        }
        for (int tid = 0; tid < 128; ++tid) qm[tid] = fmaxf(mx[tid], mx[tid ^ 1]); // shfl_xor 1, 2
        for (int tid = 0; tid < 128; ++tid) mx[tid] = fmaxf(qm[tid], qm[tid ^ 2]);
        for (int tid = 0; tid < 128; ++tid) {
            const float m_scaled = mx[tid] == -INFINITY ? 0.0f : mx[tid] * R.scale_log2;
            corr[tid][h] = exp2f(m_run[tid][h] * R.scale_log2 - m_scaled);
            m_run[tid][h] = mx[tid];
            float rs = 0.0f;
            for (int j = 0; j < Bc / 8; ++j)
                for (int c = 0; c < 2; ++c) {
                    const float e = exp2f(fmaf(s[tid][4 * j + 2 * h + c], R.scale_log2, -m_scaled));
                    s[tid][4 * j + 2 * h + c] = e;
                    rs += e;
                }
            l_run[tid][h] = l_run[tid][h] * corr[tid][h] + rs;
        }
    }
}

// O's row h times corr[h].
template <int D> static void emu_rescale(float (*o)[64], const float (*corr)[2]) {
    for (int tid = 0; tid < 128; ++tid)
        for (int j = 0; j < D / 8; ++j)
            for (int h = 0; h < 2; ++h) {
                o[tid][4 * j + 2 * h] *= corr[tid][h];
                o[tid][4 * j + 2 * h + 1] *= corr[tid][h];
            }
}

// P (f32 in s) as the register A fragments p[kk][tid][0..3] of P V.
template <int Bc> static void emu_pack(uint32_t (*p)[128][4], const float (*s)[64], fp_dtype dt) {
    for (int tid = 0; tid < 128; ++tid)
        for (int kk = 0; kk < Bc / 16; ++kk)
            for (int r = 0; r < 4; ++r) {
                const int i = fp_sm90::p_src(kk, r);
                p[kk][tid][r] = (uint32_t)from_f(s[tid][i], dt) | ((uint32_t)from_f(s[tid][i + 1], dt) << 16);
            }
}

// The epilogue of one warpgroup (rows R.row0 ..): quad row sums, normalize,
// O and lse, or the split partials.
template <int D>
static void emu_epilogue(emu_args &E, const fp_flash::seq_view &S, const emu_rows &R, int rows, int hk, int b,
                         int split, fp_dtype dt, const float (*o_acc)[64], const float (*m_run)[2],
                         const float (*l_run)[2]) {
    const fp_attn_args &a = E.a;
    for (int h = 0; h < 2; ++h) {
        float lq[128], ls[128];
        for (int tid = 0; tid < 128; ++tid) lq[tid] = l_run[tid][h] + l_run[tid ^ 1][h];
        for (int tid = 0; tid < 128; ++tid) ls[tid] = lq[tid] + lq[tid ^ 2];
        for (int tid = 0; tid < 128; ++tid) {
            const int warp = tid / 32, lane = tid % 32;
            const float l = ls[tid];
            const int r = R.row0 + fp_sm90::acc_row(warp, lane, 2 * h);
            if (r >= rows) continue;
            const int qi = r / a.group, head = hk * a.group + r % a.group;
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            const float lse = l > 0.0f ? (m_run[tid][h] * R.scale_log2 + log2f(l)) * 0.69314718055994531f : -INFINITY;
            const int col0 = fp_sm90::acc_col(lane, 2 * h);
            const float *oa = o_acc[tid];
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
    auto rows_of = [&](int wg) {
        return emu_rows{&plan, m0 + 64 * wg, a.group, L, S.sq, E.wl, E.wr, scale_log2};
    };
    auto softmax = [&](int wg, int n0) { // mask_tile + softmax_tile -> corr
        F.touch(wg, REG_S, "softmax");
        emu_softmax<Bc>(rows_of(wg), n0, s_acc[wg], m_run[wg], l_run[wg], corr[wg]);
    };
    auto rescale = [&](int wg) {
        F.touch(wg, REG_O, "O rescale");
        emu_rescale<D>(o_acc[wg], corr[wg]);
    };
    auto pack = [&](int wg) {
        F.touch(wg, REG_S | REG_P, "P pack");
        emu_pack<Bc>(p_frag[wg], s_acc[wg], dt);
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
        emu_epilogue<D>(E, S, rows_of(wg), rows, hk, b, split, dt, o_acc[wg], m_run[wg], l_run[wg]);
}

template <int D, bool Pipelined> static void emulate(emu_args &E) {
    emulate_grid<D>(E, fp_sm90::traits<D>::kBr, emulate_cta<D, Pipelined>);
}

// ---- (c) / (d) for version 5: the kernel's consumer schedule on TMA tiles ----
// attention_flash_fwd_v5 runs v3's math in the order of
// fp_tma::consumer_schedule (attention_tma_sm90.h), on K / V tiles that TMA
// boxes put in its ring. Here that very schedule is instantiated with an
// emulation policy: every full wait lands the tile it waits for through the
// TMA box model of (e) (tensor-map geometry, coordinates, OOB zero fill,
// 128-byte swizzle) from the case's real host arrays, then clears the V rows
// fp_tma::v_tail_rows names (the kernel's rule); the wgmmas, masks, softmax
// and epilogue are (c)'s, and (d)'s in-flight model checks the schedule's
// register and stage accesses. Ragged cases get NaN in the K / V rows past
// each sequence's length first: only the clearing keeps O finite. (The
// ring's timing, which the emulation does not have, is
// test_attention_tma_emu's.)
template <int D> struct v5_cta {
    using Tr = fp_tma::traits_v5<D>;
    static constexpr int Br = Tr::kBr, Bc = Tr::kBc;
    const fp_attn_args *a;
    fp_dtype dt;
    smem_h16 *sm;
    uint32_t smem0;
    fp_tma::kv_map mk, mv;
    int hk, b, m0, L, sq, rows, wl, wr;
    fp_tma::seq_rows kv; // where the sequence's keys lie in the maps (varlen: one packed map)
    float scale_log2;
    fp_flash::block_plan plan;
    // TMA: tile t of K or V into the stage at `tile`
    void tma_tile(const fp_tma::kv_map &m, const void *base, uint32_t tile, int t) {
        for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c) {
            int xyzw[4];
            fp_tma::box_coords<D>(c, t, hk, kv.bz, xyzw, kv.row0);
            const uint32_t dst = tile + fp_tma::box_smem_offset(c, Bc);
            for (uint32_t y = 0; y < m.box[1]; ++y)
                for (uint32_t x = 0; x < m.box[0]; ++x) {
                    const uint64_t g[4] = {(uint64_t)xyzw[0] + x, (uint64_t)xyzw[1] + y, (uint64_t)xyzw[2],
                                           (uint64_t)xyzw[3]};
                    h16 v = 0;
                    if (g[0] < m.dims[0] && g[1] < m.dims[1] && g[2] < m.dims[2] && g[3] < m.dims[3])
                        v = *(const h16 *)((const char *)base + g[0] * 2 + g[1] * m.strides[0] + g[2] * m.strides[1] +
                                           g[3] * m.strides[2]);
                    sm->e[swizzle128(dst + y * (m.box[0] * 2) + x * 2) / 2] = v;
                }
        }
    }
};
static float v5_o[2][128][64], v5_s[2][128][64], v5_m[2][128][2], v5_l[2][128][2], v5_corr[2][128][2];
static uint32_t v5_p[2][8][128][4];

template <int D> struct v5_consumer_emu {
    v5_cta<D> *C;
    int wg;
    inflight_model &F;
    static constexpr int Br = v5_cta<D>::Br, Bc = v5_cta<D>::Bc;
    uint32_t k_tile(int st) const { return C->smem0 + fp_tma::k_offset<D>(st); }
    uint32_t v_tile(int st) const { return C->smem0 + fp_tma::v_offset<D>(st); }
    void wait_full_k(int st, uint32_t, int t) {
        F.store(k_tile(st), k_tile(st) + fp_tma::kv_tile_bytes<D>(), "TMA K load");
        C->tma_tile(C->mk, C->a->k, k_tile(st), t);
    }
    void wait_full_v(int st, uint32_t, int t) {
        F.store(v_tile(st), v_tile(st) + fp_tma::kv_tile_bytes<D>(), "TMA V load");
        C->tma_tile(C->mv, C->a->v, v_tile(st), t);
        int r0, r1;
        fp_tma::v_tail_rows(C->L, C->kv.map_rows, t, Bc, &r0, &r1);
        for (int r = r0; r < r1; ++r)
            for (int c = 0; c < D / 8; ++c)
                for (int x = 0; x < 8; ++x)
                    C->sm->e[(v_tile(st) + fp_sm90::tile_chunk_offset<D>(r, c, Bc)) / 2 + x] = 0;
    }
    void qk(int st) {
        F.touch(wg, REG_S, "zeroing S");
        F.issue(wg, REG_S, k_tile(st), fp_tma::kv_tile_bytes<D>());
        for (int tid = 0; tid < 128; ++tid)
            for (int i = 0; i < 64; ++i) v5_s[wg][tid][i] = 0.0f;
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint64_t da = fp_sm90::q_desc<D>(C->smem0 + fp_tma::q_offset<D>(), Br, 64 * wg, kk);
            wgmma_emu(v5_s[wg], Bc, *C->sm, C->dt, &da, nullptr, fp_sm90::k_desc<D>(k_tile(st), Bc, kk), false);
        }
    }
    void pv(int st) {
        F.issue(wg, REG_O | REG_P, v_tile(st), fp_tma::kv_tile_bytes<D>());
        for (int kk = 0; kk < Bc / 16; ++kk)
            wgmma_emu(v5_o[wg], D, *C->sm, C->dt, nullptr, v5_p[wg][kk], fp_sm90::v_desc<D>(v_tile(st), Bc, kk), true);
    }
    void wgmma_wait0() { F.wait(wg, 0); }
    void wgmma_wait1() { F.wait(wg, 1); }
    void release_k(int) {}
    void release_v(int) {}
    emu_rows rows() const {
        return emu_rows{&C->plan, C->m0 + 64 * wg, C->a->group, C->L, C->sq, C->wl, C->wr, C->scale_log2};
    }
    void softmax(int t) {
        F.touch(wg, REG_S, "softmax");
        emu_softmax<Bc>(rows(), t * Bc, v5_s[wg], v5_m[wg], v5_l[wg], v5_corr[wg]);
    }
    void rescale_pack() {
        F.touch(wg, REG_O, "O rescale");
        F.touch(wg, REG_S | REG_P, "P pack");
        emu_rescale<D>(v5_o[wg], v5_corr[wg]);
        emu_pack<Bc>(v5_p[wg], v5_s[wg], C->dt);
    }
};

template <int D> static void emulate_cta_v5(emu_args &E, int bx, int hk, int b) {
    using Tr = fp_tma::traits_v5<D>;
    constexpr int Br = Tr::kBr, Bc = Tr::kBc, CH = D / 8;
    const fp_attn_args &a = E.a;
    const int m_tiles = (a.seqlen_q * a.group + Br - 1) / Br;
    int m_tile, split;
    fp_flash::cta_coords(bx, m_tiles, &m_tile, &split);
    const fp_flash::seq_view S = fp_flash::make_seq(b, a.seqlen_q, a.seqlen_k, a.seqlens_k, a.cu_q, a.cu_k, a.q_bs,
                                                    a.q_ss, a.k_bs, a.k_ss, a.v_bs, a.v_ss, a.o_bs, a.o_ss);
    v5_cta<D> C;
    C.a = &a;
    C.dt = a.dtype;
    C.smem0 = 1024;
    smem_h16 sm(C.smem0 + fp_tma::smem_bytes<D>());
    C.sm = &sm;
    C.hk = hk;
    C.b = b;
    C.m0 = m_tile * Br;
    C.L = S.L;
    C.sq = S.sq;
    C.rows = S.sq * a.group;
    C.wl = E.wl;
    C.wr = E.wr;
    C.scale_log2 = a.scale * 1.4426950408889634f;
    if (C.m0 >= C.rows) return;
    // varlen: one map over the packed rows (total_k), batch 1
    const int map_rows = a.cu_k ? (int)a.total_k : a.seqlen_k, map_batch = a.cu_k ? 1 : a.batch;
    C.kv = fp_tma::kv_seq_rows(a.cu_k, b, a.seqlen_k, map_rows);
    if (fp_tma::kv_map_geometry((uintptr_t)a.k, D, map_rows, a.heads_kv, map_batch, a.k_ss, a.k_hs, a.k_bs, Bc,
                                &C.mk) ||
        fp_tma::kv_map_geometry((uintptr_t)a.v, D, map_rows, a.heads_kv, map_batch, a.v_ss, a.v_hs, a.v_bs, Bc,
                                &C.mv)) {
        fprintf(stderr, "v5 emulation: layout refused\n");
        g_failures++;
        return;
    }
    C.plan = fp_flash::plan_block(C.m0, Br, Bc, C.rows, a.group, C.L, S.sq, E.wl, E.wr, split, E.num_splits);
    const int active = C.m0 + 64 < C.rows ? 2 : 1;
    inflight_model &F = g_inflight;
    F.sched = "v5 consumer schedule";
    for (int wg = 0; wg < 2; ++wg) {
        F.q[wg].clear();
        for (int tid = 0; tid < 128; ++tid) {
            for (int i = 0; i < D / 2; ++i) v5_o[wg][tid][i] = 0.0f;
            for (int h = 0; h < 2; ++h) v5_m[wg][tid][h] = -INFINITY, v5_l[wg][tid][h] = 0.0f;
        }
    }
    if (C.plan.s_begin < C.plan.s_end) {
        for (int wg = 0; wg < active; ++wg) // Q: each warpgroup its 64 rows, by cp.async
            for (int idx = 0; idx < 64 * CH; ++idx) {
                const int r = 64 * wg + idx / CH, c = idx % CH, gr = C.m0 + r;
                const bool ok = gr < C.rows;
                const h16 *src = (const h16 *)a.q;
                if (ok)
                    src += S.q0 + (int64_t)(gr / a.group) * a.q_ss + (int64_t)(hk * a.group + gr % a.group) * a.q_hs +
                           c * 8;
                for (int x = 0; x < 8; ++x)
                    sm.e[(C.smem0 + fp_tma::q_offset<D>() + fp_sm90::tile_chunk_offset<D>(r, c, Br)) / 2 + x] =
                        ok ? src[x] : (h16)0;
            }
        for (int wg = 0; wg < active; ++wg) {
            v5_consumer_emu<D> ops = {&C, wg, F};
            fp_tma::consumer_schedule<Tr::kStages>(C.plan.s_begin, C.plan.s_end, ops);
        }
    }
    for (int wg = 0; wg < 2; ++wg) {
        F.touch(wg, REG_O, "epilogue");
        if (!F.q[wg].empty()) F.violations++;
    }
    for (int wg = 0; wg < active; ++wg) {
        const emu_rows R = {&C.plan, C.m0 + 64 * wg, a.group, C.L, C.sq, C.wl, C.wr, C.scale_log2};
        emu_epilogue<D>(E, S, R, C.rows, hk, b, split, C.dt, v5_o[wg], v5_m[wg], v5_l[wg]);
    }
}

// Version 5 on one case: K / V rows past each ragged sequence's length, and
// the varlen rows no sequence owns, become NaN first (the reference never
// reads them).
static void launch_v5(emu_args &E, int d, int) {
    fp_attn_args &a = E.a;
    if (a.seqlens_k)
        for (int b = 0; b < a.batch; ++b)
            for (int j = a.seqlens_k[b] < 0 ? 0 : a.seqlens_k[b]; j < a.seqlen_k; ++j)
                for (int h = 0; h < a.heads_kv; ++h)
                    for (int x = 0; x < d; ++x) {
                        ((h16 *)a.k)[b * a.k_bs + j * a.k_ss + h * a.k_hs + x] = 0xFFFF;
                        ((h16 *)a.v)[b * a.v_bs + j * a.v_ss + h * a.v_hs + x] = 0xFFFF;
                    }
    // varlen: a sequence's rows past seqlen_k (clipped) and the rows after
    // the last sequence up to total_k (the spare row), which its last tiles
    // load
    if (a.cu_k) {
        auto poison = [&](int64_t j) {
            for (int h = 0; h < a.heads_kv; ++h)
                for (int x = 0; x < d; ++x) {
                    ((h16 *)a.k)[j * a.k_ss + h * a.k_hs + x] = 0xFFFF;
                    ((h16 *)a.v)[j * a.v_ss + h * a.v_hs + x] = 0xFFFF;
                }
        };
        for (int b = 0; b < a.batch; ++b)
            for (int64_t j = a.cu_k[b] + std::min(a.cu_k[b + 1] - a.cu_k[b], a.seqlen_k); j < a.cu_k[b + 1]; ++j)
                poison(j);
        for (int64_t j = a.cu_k[a.batch]; j < a.total_k; ++j) poison(j);
    }
    if (d == 64) emulate_grid<64>(E, fp_tma::traits_v5<64>::kBr, emulate_cta_v5<64>);
    else emulate_grid<128>(E, fp_tma::traits_v5<128>::kBr, emulate_cta_v5<128>);
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
    if (fp_attn_cuda_flash_version(&a, 11, 1, nullptr) != FP_ERR_INVALID_ARGUMENT) bad++;
    // v10: head_dim 64 only (a is 128), the rest as v8
    if (fp_attn_cuda_flash_version(&a, 10, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "64 only"))
        bad++;
    if (fp_attn_cuda_flash_version(&a96, 10, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    if (fp_attn_cuda_flash_version(&a, 10, 0, nullptr) != FP_ERR_INVALID_ARGUMENT) bad++;
    if (fp_attn_cuda_flash_version(&a96, 8, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    if (fp_attn_cuda_flash_version(&a, 8, 0, nullptr) != FP_ERR_INVALID_ARGUMENT) bad++;
    if (fp_attn_cuda_flash_version(&a96, 9, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    if (fp_attn_cuda_flash_version(&a, 9, 0, nullptr) != FP_ERR_INVALID_ARGUMENT) bad++;
    // version 5 (TMA): what it cannot describe is refused before the device query
    if (fp_attn_cuda_flash_version(&a96, 5, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    if (fp_attn_cuda_flash_version(&a, 5, 0, nullptr) != FP_ERR_INVALID_ARGUMENT) bad++;
    fp_attn_args avar = a;
    int32_t cu[2] = {0, 64};
    avar.cu_q = avar.cu_k = cu;
    if (fp_attn_cuda_flash_version(&avar, 5, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "varlen"))
        bad++;
    if (fp_attn_cuda_flash_version(&avar, 8, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "varlen"))
        bad++;
    if (fp_attn_cuda_flash_version(&avar, 9, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "varlen"))
        bad++;
    fp_attn_args avar64 = avar;
    avar64.head_dim = 64;
    if (fp_attn_cuda_flash_version(&avar64, 10, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "varlen"))
        bad++;
    // varlen is refused for want of total_k (the map's extent), and where
    // total_k + seqlen_k + 256 would not fit the int tensor-map coordinates
    if (fp_attn_cuda_flash_version(&avar, 5, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "total_k"))
        bad++;
    fp_attn_args abig = avar;
    abig.total_k = 2147483648LL - abig.seqlen_k - 256; // one above the largest accepted
    for (int v : {5, 8, 9})
        if (fp_attn_cuda_flash_version(&abig, v, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "2^31"))
            bad++;
    fp_attn_args aodd = a;
    aodd.k_ss = 128 + 4; // 264 bytes: not a multiple of 16
    if (fp_attn_cuda_flash_version(&aodd, 5, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "K: seq"))
        bad++;
    fp_attn_args amis = a;
    amis.v = (const char *)a.v + 2; // V base 2 bytes off 16-byte alignment
    if (fp_attn_cuda_flash_version(&amis, 5, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "V: base"))
        bad++;
    printf("dispatch (sm_90a build): unsupported shapes refused before any device call: %s\n", bad ? "NO" : "yes");
#else
    if (fp_attn_cuda_flash_version(&a, 4, 1, nullptr) != FP_ERR_UNSUPPORTED) bad++;
    if (fp_attn_cuda_flash_version(&a, 5, 1, nullptr) != FP_ERR_UNSUPPORTED || !strstr(fp_last_error(), "sm_90a"))
        bad++;
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
    check_tma_boxes<64>();
    check_tma_boxes<128>();
    check_tma_paged_boxes<64>();
    check_tma_paged_boxes<128>();
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
        /* varlen 2: 340 keys clipped to 300 (NaN rows), the next sequence's rows and the NaN spare row in a last tile */
        {"bf16_varlen2_c",    5, 100, 300, 2, 1, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 2},
        {"f16_d128_varlen2_s2",5, 40, 300, 2, 2, 128, FP_F16,  0, -1, -1, 0, 2, 8, 2},
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
        if (!emu_run_case(c, rng, "(c) ", 5, launch_v5)) g_failures++; /* varlen: given total_k */
    }
    printf("(d) wgmma in-flight rules (v3 / v4 schedules, v5's consumer schedule, all cases): %ld register / "
           "shared-memory accesses checked, "
           "%ld violations\n",
           g_inflight.checks, g_inflight.violations);
    if (g_inflight.violations || !g_inflight.checks) g_failures++;
    if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
    return g_failures ? 1 : 0;
}
