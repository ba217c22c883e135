// The Hopper flash attention kernels' own sources on the CUDA emulation
// (tests/emu/cuda_emu.h + emu_sm90.h): attention_flash_fwd_v3 / v4
// (kernels/attention/attention_flash_sm90.cu: cp.async double buffering,
// wgmma from shared-memory descriptors and register A, both schedules at
// both head dims) and v5 / v8 / v9 (attention_flash_tma_sm90.cu: TMA
// producer, mbarrier ring; v8's consumer warpgroups take turns through named
// barriers; v9 runs v8 in persistent CTAs, also on emulated devices of 2 and
// 3 SMs so that each CTA runs several items; v10 is v8 with three consumer
// warpgroups, head_dim 64 only: its 192-row tiles run with one, two and
// three warpgroups active, and it refuses head_dim 128 before writing
// anything) called through their launcher fp_attn_cuda_flash_sm90,
// every output element checked against fp_attn_reference (double
// accumulation). Unlike test_attention_sm90_emu (which re-implements the
// kernels' index math and schedule on an independent model), this runs the
// kernel code itself: a wrong descriptor, swizzle, fragment, mask, barrier or
// wait shows as a wrong element, a NaN (accumulators read before their
// wgmma retired, shared memory read before its copy landed) or a failed
// launch (races, collectives, in-flight rules: emu_sm90.h).
// Outputs start poisoned (NaN) and are followed by guard elements that must
// stay untouched. Cases: head_dim 64 / 128, f16 / bf16, causal, windows,
// GQA, seqlen_k / seqlen_q not multiples of the tiles, ragged seqlens_k,
// varlen (the TMA kernels given total_k; refused without it), paged KV (v5,
// v8, v9, v10: page sizes that are multiples of 8, boxes per page; v3, v4
// and v5's wide tile refuse), split-KV (the combine kernel runs too), LSE. The K / V rows no sequence owns hold NaN.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "attn_emu_util.h"
#include "cuda_emu.h"
#include "emu_sm90.h" // g_tma_stores
#include "internal.h" // fp_context: v9's tickets through a context's per-stream counters

static const int kGuard = 64; // elements after O and lse that must stay untouched

// After a refusal: whether O lost its poison (said on stderr).
static bool o_written(const emu_data &X, int version, const char *name) {
    for (h16 x : X.o)
        if (x != 0xFFFF) {
            fprintf(stderr, "v%d %s: refused, but O written\n", version, name);
            return true;
        }
    return false;
}

static bool run_case(const emu_case &c, int version, emu_rng &rng, fp_context *ctx = nullptr) {
    emu_data X;
    emu_args E;
    if (!emu_setup(c, rng, X, E)) return false;
    E.a.ctx = ctx;
    // The cache rows no sequence owns hold NaN: past a ragged sequence's
    // length, a varlen sequence's rows past seqlen_k and the spare row after
    // the packed ones (which the TMA kernels' last tiles load).
    emu_poison_unowned_kv(c, X);
    // O and lse in buffers with guards after them (the kernel writes through E.a)
    const h16 kOGuard = 0x5A5A;
    const uint32_t kLseGuard = 0x7F8A5A5Au;
    std::vector<h16> o(X.o.size() + kGuard, kOGuard);
    std::copy(X.o.begin(), X.o.end(), o.begin());
    std::vector<float> lse(X.lse.size() + kGuard);
    std::copy(X.lse.begin(), X.lse.end(), lse.begin());
    for (int i = 0; i < kGuard; ++i) std::memcpy(&lse[X.lse.size() + i], &kLseGuard, 4);
    E.a.o = o.data();
    E.a.lse = lse.data();
    fp_emu::clear_launch_log();
    const fp_status st = fp_attn_cuda_flash_sm90(&E.a, version, c.splits, nullptr);
    const int vb = version & ~(FP_ATTN_O_TMA | FP_ATTN_V9_EARLY); // the version without its bits
    const char *how = version & FP_ATTN_O_TMA      ? " (TMA-store epilogue)"
                      : version & FP_ATTN_V9_EARLY ? " (tickets drawn at each item's start)"
                                                   : "";
    if (st != FP_OK) {
        fprintf(stderr, "v%d%s %s: %s (%s)\n", vb, how, c.name, fp_last_error(), fp_emu::last_failure());
        return false;
    }
    // v5 and its 128 x 176 tile (FP_ATTN_V5_WIDE) told apart by the launch's
    // shared memory (1 KiB slack + Q + S stages of K and V + 4 S barriers: S
    // = 3 at head_dim 64, else 2; the kernels have internal linkage, so the
    // launch log cannot name them)
    if (vb == 5 || vb == FP_ATTN_V5_WIDE) {
        const int bc = vb == 5 ? 128 : 176, d = c.d, stages = d == 64 ? 3 : 2;
        const size_t want = 1024 + (size_t)(128 + 2 * stages * bc) * d * 2 + 4 * stages * 8;
        bool seen = false;
        for (const fp_emu::LaunchRecord &r : fp_emu::launch_log()) seen |= r.block.x == 384 && r.smem == want;
        if (!seen) {
            fprintf(stderr, "v%d%s %s: no launch of 384 threads with %zu bytes of shared memory (the 128 x %d tile)\n",
                    vb, how, c.name, want, bc);
            return false;
        }
    }
    bool guards = true;
    for (int i = 0; i < kGuard; ++i) {
        uint32_t b;
        std::memcpy(&b, &lse[X.lse.size() + i], 4);
        guards &= o[X.o.size() + i] == kOGuard && b == kLseGuard;
    }
    if (!guards) fprintf(stderr, "v%d%s %s: written past the end of O or lse\n", vb, how, c.name);
    std::copy(o.begin(), o.begin() + (long)X.o.size(), X.o.begin());
    std::copy(lse.begin(), lse.begin() + (long)X.lse.size(), X.lse.begin());
    E.a.o = X.o.data();
    E.a.lse = X.lse.data();
    return emu_verify(c, version & FP_ATTN_O_TMA ? "kernel, TMA-store epilogue, " : "kernel ", vb, X, E) && guards;
}

// The TMA stores the epilogue through shared memory makes for case c on
// version 5, 8, 9, 10 or FP_ATTN_V5_WIDE: one box per 64 columns of each
// active consumer warpgroup of each CTA (v9: both warpgroups of every item,
// padding or not) where it applies (one split, dense Q / O, a group dividing
// 64; paged K / V or not), else none.
static long tma_boxes(const emu_case &c, int version) {
    const int group = c.hq / c.hkv, w = version == 10 ? 3 : 2, rows = c.sq * group;
    if (c.splits != 1 || c.varlen || 64 % group) return 0;
    long n = 0;
    for (int m0 = 0; m0 < rows; m0 += 64 * w) {
        const int wgs = (rows - m0 + 63) / 64;
        n += version == 9 || wgs > w ? w : wgs;
    }
    return n * c.batch * c.hkv * (c.d / 64);
}

// run_case, then the TMA boxes stored against tma_boxes (expected when the
// call asks for the epilogue or FP_ATTN_O_STORE=tma is set, else none).
static bool run_counted(const emu_case &c, int version, emu_rng &rng, const char *how) {
    static const bool env = getenv("FP_ATTN_O_STORE") && std::strcmp(getenv("FP_ATTN_O_STORE"), "tma") == 0;
    const int vb = version & ~FP_ATTN_O_TMA;
    const bool tma = (vb == 5 || vb == 8 || vb == 9 || vb == 10 || vb == FP_ATTN_V5_WIDE) &&
                     (env || (version & FP_ATTN_O_TMA));
    const long before = fp_emu::g_tma_stores.load();
    if (!run_case(c, version, rng)) return false;
    const long got = fp_emu::g_tma_stores.load() - before, want = tma ? tma_boxes(c, vb) : 0;
    if (got != want) {
        fprintf(stderr, "v%d %s (%s): %ld TMA boxes stored, %ld expected\n", vb, c.name, how, got, want);
        return false;
    }
    return true;
}

int main(int argc, char **argv) {
    // name, batch, sq, sk, hq, hkv, d, dtype, causal, wl, wr, ragged, splits, pad, varlen
    static const emu_case cases[] = {
        {"bf16_d64_17x17",     1, 17,  17,  2, 2, 64,  FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_d128_1x1",       2, 1,   1,   2, 1, 128, FP_F16,  0, -1, -1, 0, 1, 0, 0},
        {"bf16_d128_130x300",  1, 130, 300, 1, 1, 128, FP_BF16, 0, -1, -1, 0, 1, 8, 0},
        {"f16_d64_causal",     1, 150, 150, 1, 1, 64,  FP_F16,  1, -1, -1, 0, 1, 0, 0},
        {"bf16_causal_q<k",    1, 33,  290, 2, 1, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_causal_q>k",     1, 200, 40,  1, 1, 128, FP_F16,  1, -1, -1, 0, 1, 0, 0},
        {"bf16_gqa3_causal",   1, 70,  140, 6, 2, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_window",         1, 200, 270, 1, 1, 64,  FP_F16,  0, 30, 5,  0, 1, 0, 0},
        {"bf16_d128_win_c",    1, 130, 300, 1, 1, 128, FP_BF16, 1, 70, -1, 0, 1, 0, 0},
        {"f16_d128_dec_split3",2, 1,   400, 8, 1, 128, FP_F16,  0, -1, -1, 0, 3, 0, 0},
        {"bf16_dec_rag_s2",    4, 2,   333, 4, 2, 64,  FP_BF16, 1, -1, -1, 1, 2, 8, 0},
        {"f16_prefill_split2", 1, 100, 300, 1, 1, 64,  FP_F16,  1, -1, -1, 0, 2, 0, 0},
        {"bf16_varlen",        5, 70,  140, 2, 2, 64,  FP_BF16, 0, -1, -1, 0, 1, 0, 1},
        {"f16_d128_varlen_c",  4, 100, 60,  4, 2, 128, FP_F16,  1, -1, -1, 0, 1, 8, 1},
        {"bf16_d128_gqa4_c",   1, 30,  400, 4, 1, 128, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        // edges: one warpgroup's rows exactly (64), a CTA of one row (129),
        // seqlen_k a whole number of tiles, splits that get no tile, a
        // window of the diagonal alone
        {"f16_d128_rows64",    1, 64,  128, 1, 1, 128, FP_F16,  0, -1, -1, 0, 1, 0, 0},
        {"bf16_d64_rows129",   1, 129, 256, 1, 1, 64,  FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_d64_empty_split",2, 3,   128, 2, 1, 64,  FP_F16,  0, -1, -1, 0, 4, 0, 0},
        {"bf16_d128_diag_s3",  1, 40,  300, 2, 2, 128, FP_BF16, 0, 0,  0,  0, 3, 8, 0},
        // v10's 192-row tiles: a full one and one row more (a second tile
        // with one warpgroup active), GQA groups packed across them
        {"bf16_d64_rows193_c", 1, 193, 300, 1, 1, 64,  FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"f16_d64_gqa8_s2",    2, 40,  333, 16, 2, 64, FP_F16,  0, -1, -1, 1, 2, 8, 0},
        // varlen 2: a sequence of 17 queries over 340 keys clipped to 300
        // (rows 300..339 NaN), whose last tile reads the next sequence's
        // rows, the NaN spare row and TMA's zeros past total_k; 800 packed
        // rows (GQA 4) in 192- and 128-row tiles; splits over packed keys
        {"bf16_d64_varlen2_gqa4_c",5, 200, 300, 8, 2, 64, FP_BF16, 1, -1, -1, 0, 1, 0, 2},
        {"f16_d128_varlen2_s3",5, 30,  400, 2, 1, 128, FP_F16,  0, -1, -1, 0, 3, 8, 2},
        // paged KV (v5, v8, v9, v10; v3, v4 refuse): pages of 16 (8 boxes a
        // tile, ragged: a sequence of 17 keys whose second page is 1 key,
        // one of none, a shared first page), 48 (16-row boxes, pages found
        // by division), 256 (tiles inside a page: 128-row boxes), 8 (16
        // boxes of 8 rows) with a window, 64 over 3 splits; items of one
        // key tile each over 4 ragged sequences (v9 on 2 SMs: a CTA's next
        // item is tile 0 again, of another sequence, whose boxes the
        // producer must look up again)
        {"bf16_d64_paged16_rag_c", 3, 70, 300, 4, 2, 64, FP_BF16, 1, -1, -1, 1, 1, 0, 0, 16},
        {"f16_d128_paged48_pad",   2, 130, 333, 2, 1, 128, FP_F16, 0, -1, -1, 0, 1, 8, 0, 48},
        {"bf16_d128_paged256_rag", 2, 40,  600, 8, 2, 128, FP_BF16, 1, -1, -1, 1, 1, 0, 0, 256},
        {"f16_d64_paged8_win",     1, 200, 270, 1, 1, 64,  FP_F16, 0, 30, 5,  0, 1, 8, 0, 8},
        {"bf16_d64_paged64_s3",    2, 20,  500, 6, 2, 64,  FP_BF16, 0, -1, -1, 1, 3, 0, 0, 64},
        {"f16_d128_paged16_1tile", 4, 20,  100, 2, 1, 128, FP_F16, 0, -1, -1, 1, 1, 0, 0, 16},
        // v5's 128 x 176 tile (FP_ATTN_V5_WIDE): keys one whole tile, two
        // whole tiles and one key more under a causal mask (diagonal tiles
        // that 128-row query tiles cut across), three splits of one tile
        {"bf16_d128_k176",     1, 70,  176, 2, 1, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_d128_k353_c",    1, 353, 353, 1, 1, 128, FP_F16,  1, -1, -1, 0, 1, 8, 0},
        {"bf16_d128_k528_s3",  2, 5,   528, 4, 2, 128, FP_BF16, 0, -1, -1, 1, 3, 0, 0},
        // many key tiles in one split (8 of 128 / 6 of 176 keys at head_dim
        // 128, 5 of 128 causal at 64): the producer refills each ring stage
        // several times, the stages' parities past several wraps
        {"bf16_d128_k900",     1, 64,  900, 1, 1, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"f16_d64_k640_c",     1, 130, 640, 2, 1, 64,  FP_F16,  1, -1, -1, 0, 1, 0, 0},
        // the TMA-store epilogue's boxes (FP_ATTN_O_TMA): GQA 8 (8 heads x 8
        // query positions a box; 50 positions: the second box half past
        // seqlen_q) with padded rows, ragged, causal; GQA 2 over 3 batches
        {"bf16_d128_gqa8_pad_c", 2, 50, 300, 16, 2, 128, FP_BF16, 1, -1, -1, 1, 1, 8, 0},
        {"f16_d64_gqa2_b3",    3, 97,  200, 4, 2, 64,  FP_F16,  0, -1, -1, 0, 1, 8, 0},
    };
    // argv[1]: run only the cases whose name contains it
    const char *only = argc > 1 ? argv[1] : nullptr;
    emu_rng rng = {0x5eed90a7c0ffee01ull};
    int failures = 0, ran = 0;
    static const int versions[] = {3, 4, 5, 8, 9, 10, FP_ATTN_V5_WIDE};
    for (int version : versions)
        for (const emu_case &c : cases) {
            if (only && !std::strstr(c.name, only)) continue;
            if (version == 10 && c.d != 64) continue; // refused (head_dim 64 only): checked below
            if (version == FP_ATTN_V5_WIDE && (c.d != 128 || c.page)) continue; // refused: checked below
            if (c.page && version < 5) continue; // paged: refused, checked below
            ran++;
            if (!run_counted(c, version, rng, "stores from registers unless FP_ATTN_O_STORE=tma")) failures++;
        }
    // v9 on devices of 2 and 3 SMs: its persistent CTAs (one per SM) then
    // run several items each (at 132 SMs, above, most of these shapes give a
    // CTA one item), the K / V ring and the turns running on across them,
    // the next item's Q in the other buffer, the tickets drawn in turn: a few
    // tiles before each item's end (fp_tma::draw_tile; items of fewer tiles
    // than the lead draw at their start), and on 2 SMs also at every item's
    // start (FP_ATTN_V9_EARLY, session 19's rule).
    const fp_emu::DeviceProfile h100 = fp_emu::device();
    for (int sms = 2; sms <= 3; ++sms) {
        fp_emu::DeviceProfile small = h100;
        small.sm_count = sms;
        fp_emu::set_device(small);
        for (const emu_case &c : cases) {
            // paged: on 2 SMs, late draws (the paging is the producer's, the
            // draw's timing the same as dense)
            if ((c.page && sms != 2) || (only && !std::strstr(c.name, only))) continue;
            for (int early = 0; early < (sms == 2 && !c.page ? 2 : 1); ++early) {
                ran++;
                if (!run_case(c, early ? 9 | FP_ATTN_V9_EARLY : 9, rng)) failures++;
            }
        }
    }
    fp_emu::set_device(h100);
    // v5, v8 and v9 (on 2 SMs) again with the emulation's other thread order
    // (each pass runs the consumers before the producer, warpgroup 1 before
    // 0): other interleavings of the mbarrier rings and of the turns.
    setenv("FP_EMU_REVERSE", "1", 1);
    static const int reversed[] = {5, 8, 9, 10, FP_ATTN_V5_WIDE};
    for (int version : reversed) {
        fp_emu::DeviceProfile dev = h100;
        if (version == 9) dev.sm_count = 2;
        fp_emu::set_device(dev);
        for (const emu_case &c : cases) {
            if (!(c.ragged || c.varlen || c.page || c.splits > 1 || (version >= 8 && c.causal)) ||
                (version == 10 && c.d != 64) ||
                (version == FP_ATTN_V5_WIDE && (c.d != 128 || c.page)) || (only && !std::strstr(c.name, only)))
                continue;
            ran++;
            if (!run_case(c, version, rng)) failures++;
        }
    }
    fp_emu::set_device(h100);
    unsetenv("FP_EMU_REVERSE");
    // v9 with a context (what fp_attention_forward passes): the tickets come
    // from the stream's arrival counters, which the last CTA of each launch
    // must leave at zero, or the next launch's CTAs would draw tickets past
    // items they never ran. Every case on one stream of one context, 2 SMs
    // (several items per CTA), the counters read after each launch. The
    // context is the workspace's part of one (src/core/workspace.c, the
    // only part these launches touch).
    {
        static fp_context ctx; // zero: no workspace yet
        pthread_mutex_init(&ctx.ws_mu, nullptr);
        fp_emu::DeviceProfile small = h100;
        small.sm_count = 2;
        fp_emu::set_device(small);
        for (const emu_case &c : cases) {
            if (c.page || (only && !std::strstr(c.name, only))) continue; // paged: the same counters
            ran++;
            bool ok = run_case(c, 9, rng, &ctx);
            cudaDeviceSynchronize();
            const int *ctr = nullptr;
            for (const fp_ws_slot &w : ctx.ws)
                if (w.used && w.stream == nullptr) ctr = static_cast<const int *>(w.counters);
            if (!ctr || ctr[0] != 0 || ctr[1] != 0) {
                fprintf(stderr, "v9 %s (context): ticket counters %d, %d after the launch, not 0, 0\n", c.name,
                        ctr ? ctr[0] : -1, ctr ? ctr[1] : -1);
                ok = false;
            }
            if (!ok) failures++;
        }
        fp_ctx_scratch_destroy(&ctx);
        pthread_mutex_destroy(&ctx.ws_mu);
        fp_emu::set_device(h100);
    }
    // The TMA-store epilogue (FP_ATTN_O_TMA) on v5 / v5's wide tile (head_dim
    // 128), v8 / v10 (64) and v9 (both; on 2 SMs too, where a CTA runs
    // several items, each item's O staged in its Q buffer, which a later
    // item's Q then reuses), then v5 / v8 / v9 (2 SMs) in the other thread
    // order on the cases it applies to: the same outputs, pads and guards
    // untouched, and exactly the boxes expected stored (one per 64 columns
    // of each active consumer warpgroup of each CTA or item) where it
    // applies (one split, dense, a group dividing 64), none where it does
    // not (the stores from registers).
    {
        for (int pass = 0; pass < 2; ++pass) {
            if (pass) setenv("FP_EMU_REVERSE", "1", 1);
            static const int tma_versions[] = {5, FP_ATTN_V5_WIDE, 8, 10, 9, -9}; // -9: v9 on 2 SMs
            for (int tv : tma_versions)
                for (const emu_case &c : cases) {
                    const int version = tv < 0 ? -tv : tv;
                    const bool d64 = version == 8 || version == 10;
                    if ((version != 9 && (c.d == 64) != d64) || (version == FP_ATTN_V5_WIDE && c.page) ||
                        (tv == -9 && c.page) || (only && !std::strstr(c.name, only)))
                        continue;
                    // where it does not apply (no box): v5 / v8 once at 132 SMs, which
                    // must store none
                    if (!tma_boxes(c, version) && (pass || (version != 5 && version != 8))) continue;
                    if (pass && (version == 10 || version == FP_ATTN_V5_WIDE || tv == 9)) continue;
                    fp_emu::DeviceProfile dev = h100;
                    if (tv < 0) dev.sm_count = 2;
                    fp_emu::set_device(dev);
                    ran++;
                    if (!run_counted(c, version | FP_ATTN_O_TMA, rng,
                                     pass ? "TMA-store epilogue, reversed" : "TMA-store epilogue"))
                        failures++;
                }
            fp_emu::set_device(h100);
        }
        unsetenv("FP_EMU_REVERSE");
        // v3 / v4 refuse the bit as an argument error, writing nothing; so
        // does every version but 9 with FP_ATTN_V9_EARLY
        const emu_case &c0 = cases[0];
        struct bit_case {
            int version, bit;
            const char *name;
        };
        static const bit_case refused[] = {
            {3, FP_ATTN_O_TMA, "FP_ATTN_O_TMA"},        {4, FP_ATTN_O_TMA, "FP_ATTN_O_TMA"},
            {3, FP_ATTN_V9_EARLY, "FP_ATTN_V9_EARLY"},  {5, FP_ATTN_V9_EARLY, "FP_ATTN_V9_EARLY"},
            {8, FP_ATTN_V9_EARLY, "FP_ATTN_V9_EARLY"},  {10, FP_ATTN_V9_EARLY | FP_ATTN_O_TMA, "FP_ATTN_V9_EARLY"}};
        for (const bit_case &r : refused) {
            emu_data X;
            emu_args E;
            ran++;
            if (!emu_setup(c0, rng, X, E) ||
                fp_attn_cuda_flash_sm90(&E.a, r.version | r.bit, 1, nullptr) != FP_ERR_INVALID_ARGUMENT ||
                !std::strstr(fp_last_error(), r.name) || o_written(X, r.version, c0.name)) {
                fprintf(stderr, "v%d | %s: not refused as expected (%s)\n", r.version, r.name, fp_last_error());
                failures++;
            }
        }
    }
    // v5, v8, v9 and v10 refuse varlen without total_k (their tensor map
    // would have no extent), v10 head_dim 128 and v5's wide tile head_dim
    // 64, before writing anything.
    for (int version : reversed)
        for (const emu_case &c : cases) {
            const bool dim = (version == 10 && c.d != 64) || (version == FP_ATTN_V5_WIDE && c.d != 128);
            if (!(c.varlen || dim) || (only && !std::strstr(c.name, only))) continue;
            emu_data X;
            emu_args E;
            ran++;
            const bool setup = emu_setup(c, rng, X, E);
            E.a.total_k = 0;
            if (!setup || fp_attn_cuda_flash_sm90(&E.a, version, 1, nullptr) != FP_ERR_UNSUPPORTED ||
                !std::strstr(fp_last_error(), dim ? "head_dim" : "total_k")) {
                fprintf(stderr, "v%d %s: %s not refused (%s)\n", version, c.name,
                        c.varlen ? "varlen without total_k" : "head_dim", fp_last_error());
                failures++;
                continue;
            }
            if (o_written(X, version, c.name)) failures++;
        }
    // Paged KV: v3, v4 and v5's wide tile refuse it; v5, v8, v9 and v10
    // refuse page sizes that are not multiples of 8 (a TMA box of whole
    // 8-row swizzle groups); nothing written.
    for (const emu_case &pc : cases) {
        if (!pc.page || (only && !std::strstr(pc.name, only))) continue;
        static const int all[] = {3, 4, 5, 8, 9, 10, FP_ATTN_V5_WIDE};
        for (int version : all) {
            if (version == 10 && pc.d != 64) continue;
            if (version == FP_ATTN_V5_WIDE && pc.d != 128) continue;
            emu_case c = pc;
            const bool odd = version == 5 || version == 8 || version == 9 || version == 10;
            if (odd) c.page = 12;
            emu_data X;
            emu_args E;
            ran++;
            const bool setup = emu_setup(c, rng, X, E);
            const char *want = odd ? "page_size 12" : "paged";
            if (!setup || fp_attn_cuda_flash_sm90(&E.a, version, 1, nullptr) != FP_ERR_UNSUPPORTED ||
                !std::strstr(fp_last_error(), want)) {
                fprintf(stderr, "v%d %s (page_size %d): not refused (%s)\n", version, c.name, c.page,
                        fp_last_error());
                failures++;
                continue;
            }
            if (o_written(X, version, c.name)) failures++;
        }
    }
    if (failures) fprintf(stderr, "test_attention_sm90_kernel_emu: %d of %d cases failed\n", failures, ran);
    else printf("test_attention_sm90_kernel_emu: %d cases ok (%ld launches)\n", ran, fp_emu::launches());
    return failures ? 1 : 0;
}
