// Hopper (sm_90a) instructions for the CUDA emulation (cuda_emu.h): a kernel
// source built with FP_CUDA_EMU routes its inline-PTX wrappers here.
//
// wgmma (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//   - wgmma.mma_async is a warpgroup collective (the 128 threads
//     [128 k, 128 k + 128), all with the same instruction and, for shared
//     operands, the same descriptors). It is *recorded* at issue, not
//     applied: the operation runs when the issuing thread's
//     wgmma.wait_group retires its group, reading shared memory then. So a
//     kernel that overwrites an operand tile before the wait computes with
//     the new bytes, and an async copy issued over bytes an unretired wgmma
//     reads fails the launch (smem_note_pending_read).
//   - Accumulators: at the first issue on an array its values are taken as
//     the input and the registers are poisoned (a NaN pattern) until the
//     last wgmma in flight on them retires; reading them before the wait
//     reads NaN, and writing them while in flight fails the launch. A chain
//     of wgmmas on the same accumulators (same shape) accumulates in order,
//     as the ISA guarantees.
//   - Register A: the fragments of the 128 threads are taken at issue; a
//     thread that rewrites its fragment before the wait fails the launch.
//   - wgmma.fence / commit_group / wait_group are warpgroup collectives
//     (.sync.aligned). commit_group closes the thread's open wgmmas into a
//     group; wait_group N retires all but the newest N groups. A wgmma
//     issued with no wgmma.fence since the thread's last wait_group (or since
//     the start: "before the first wgmma.mma_async") fails the launch: the
//     registers it reads were accessed in between (the emulation cannot see
//     register accesses themselves, so this is the rule it can check).
//   - Shared operands through matrix descriptors, decoded by sm90_isa.h (the
//     PTX ISA's descriptor format and canonical layouts): 128-byte swizzle,
//     base offset 0, 16-bit elements (f16, bf16), K-major or MN-major
//     (transpose bit). Other modes fail the launch as not emulated.
// setmaxnreg: a warpgroup collective, counts checked (24..256, multiple of
// 8); otherwise no effect (the emulation has no register file).
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "cuda_emu.h"
#include "sm90_isa.h"

namespace fp_emu {

enum WgmmaType { WGMMA_F16 = 0, WGMMA_BF16 = 1 };

template <typename T> constexpr WgmmaType wgmma_type();
template <> constexpr WgmmaType wgmma_type<__half>() { return WGMMA_F16; }
template <> constexpr WgmmaType wgmma_type<__nv_bfloat16>() { return WGMMA_BF16; }

inline float wgmma_elem(uint16_t h, WgmmaType ty) {
    uint32_t bits;
    if (ty == WGMMA_BF16) {
        bits = (uint32_t)h << 16;
    } else {
        const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
        if (e == 0) {
            const float v = (float)m * 5.9604644775390625e-8f; // m * 2^-24 (subnormal or zero)
            return sign ? -v : v;
        }
        bits = sign | (e == 31 ? 0x7F800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

constexpr uint32_t kAccPoison = 0x7FE0DEADu; // accumulator registers while a wgmma on them is in flight

struct WgmmaOp {
    float *d;
    int nregs; // N / 2 accumulator registers
    WgmmaType ty;
    bool a_regs;           // A from registers
    bool trans_b;          // B MN-major
    uint32_t quad_a[4][4]; // register A: the fragments of this thread's quad (A rows of this thread)
    const uint32_t *a_mine;
    uint32_t a_saved[4];
    std::vector<uint32_t> a_addr; // shared A: [2 rows][16 k]
    std::vector<uint32_t> b_addr; // K-major: [col][16 k]; MN-major: [k][col] (N / 4 columns)
};
struct WgmmaChain {
    float *d;
    int nregs, pending;
    std::vector<float> value;
};
struct WgmmaState {
    bool fenced = false;
    std::vector<WgmmaOp> open;
    std::deque<std::vector<WgmmaOp>> groups;
    std::vector<WgmmaChain> chains;
};

inline unsigned warpgroup_first() { return cur()->linear / 128 * 128; }

// Runs of consecutive 2-byte element addresses: f(start, bytes).
template <typename F> inline void wgmma_runs(const std::vector<uint32_t> &addr, F f) {
    size_t i = 0;
    while (i < addr.size()) {
        size_t j = i + 1;
        while (j < addr.size() && addr[j] == addr[j - 1] + 2) ++j;
        f(addr[i], (size_t)(j - i) * 2);
        i = j;
    }
}

inline bool wgmma_is_poison(const float *d, int n) {
    for (int i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, &d[i], sizeof b);
        if (b != kAccPoison) return false;
    }
    return true;
}

inline void wgmma_check_desc(uint64_t desc, const char *what, const char *which) {
    const sm90_isa::desc_fields f = sm90_isa::decode_desc(desc);
    if (sm90_isa::desc_reserved_bits(desc))
        kernel_fail("%s: %s descriptor 0x%016llx sets reserved bits", what, which, (unsigned long long)desc);
    if (f.mode != 1 || f.base_offset != 0)
        kernel_fail("%s: %s descriptor 0x%016llx: swizzle mode %u, base offset %u (only the 128-byte swizzle with "
                    "base offset 0 is emulated)",
                    what, which, (unsigned long long)desc, f.mode, f.base_offset);
}

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}: D (+)= A B with
// scale-d = 1, imm-scale-a = imm-scale-b = 1. A from shared memory (a_regs
// null: descriptor desc_a, trans_a) or from the thread's 4 registers a_regs;
// B from shared memory (desc_b, trans_b). `what`: the instruction, the same
// string literal for every thread of the warpgroup.
inline void wgmma_mma_async(float *d, int n, WgmmaType ty, uint64_t desc_a, const uint32_t *a_regs, int trans_a,
                            uint64_t desc_b, int trans_b, const char *what) {
    WgmmaState &s = thread_state<WgmmaState>();
    const unsigned tid = cur()->linear, first = warpgroup_first(), t = tid - first;
    if (!s.fenced)
        kernel_fail("thread %u: %s without a wgmma.fence since its last wgmma.wait_group (or the start)", tid, what);
    struct {
        uint64_t da, db;
        uint32_t a[4];
    } mine = {a_regs ? 0 : desc_a, desc_b, {0, 0, 0, 0}};
    if (a_regs) std::memcpy(mine.a, a_regs, sizeof mine.a);
    const unsigned char *slots = group_exchange(first, 128, &mine, sizeof mine, what);
    for (int k = 0; k < 128; ++k) {
        decltype(mine) o;
        std::memcpy(&o, slots + k * kSlotBytes, sizeof o);
        if (o.da != mine.da || o.db != mine.db)
            kernel_fail("%s: thread %u and thread %u of the warpgroup pass different descriptors", what, tid,
                        first + k);
    }
    if (!a_regs) wgmma_check_desc(desc_a, what, "A");
    wgmma_check_desc(desc_b, what, "B");
    if (n % 8 || n < 8 || n > 256) kernel_fail("%s: N = %d", what, n);

    WgmmaOp op;
    op.d = d;
    op.nregs = n / 2;
    op.ty = ty;
    op.a_regs = a_regs != nullptr;
    op.trans_b = trans_b != 0;
    op.a_mine = a_regs;
    const int w = (int)t / 32, g = ((int)t % 32) / 4;
    const int row0 = 16 * w + g; // this thread's accumulator rows: row0, row0 + 8
    if (a_regs) {
        std::memcpy(op.a_saved, a_regs, sizeof op.a_saved);
        for (int q = 0; q < 4; ++q)
            std::memcpy(op.quad_a[q], slots + (32 * w + 4 * g + q) * kSlotBytes + 16, 16);
    } else {
        op.a_addr.resize(32);
        for (int r = 0; r < 2; ++r)
            for (int k = 0; k < 16; ++k)
                op.a_addr[r * 16 + k] = trans_a ? sm90_isa::mnmajor_addr(desc_a, k, row0 + 8 * r)
                                                : sm90_isa::kmajor_addr(desc_a, row0 + 8 * r, k);
    }
    const int nc = n / 4;
    op.b_addr.resize((size_t)nc * 16);
    for (int ci = 0; ci < nc; ++ci) {
        const int col = sm90_isa::doc_d_col((int)t, 4 * (ci / 2) + ci % 2);
        for (int k = 0; k < 16; ++k) {
            if (trans_b) op.b_addr[(size_t)k * nc + ci] = sm90_isa::mnmajor_addr(desc_b, k, col);
            else op.b_addr[(size_t)ci * 16 + k] = sm90_isa::kmajor_addr(desc_b, col, k);
        }
    }
    for (uint32_t a : op.a_addr)
        if (a % 2) kernel_fail("%s: misaligned A element address %u", what, a);
    wgmma_runs(op.a_addr, [](uint32_t a, size_t b) { smem_note_pending_read(a, b, +1); });
    wgmma_runs(op.b_addr, [](uint32_t a, size_t b) { smem_note_pending_read(a, b, +1); });

    // The accumulator chain.
    WgmmaChain *c = nullptr;
    for (WgmmaChain &x : s.chains)
        if (x.d == d) c = &x;
    if (c) {
        if (c->nregs != op.nregs) kernel_fail("%s: accumulators in flight with another shape", what);
        if (!wgmma_is_poison(d, op.nregs))
            kernel_fail("thread %u: %s on accumulator registers the thread wrote while a wgmma on them was in flight",
                        tid, what);
    } else {
        s.chains.push_back(WgmmaChain{d, op.nregs, 0, std::vector<float>(d, d + op.nregs)});
        c = &s.chains.back();
        for (int i = 0; i < op.nregs; ++i) std::memcpy(&d[i], &kAccPoison, sizeof(float));
    }
    c->pending++;
    s.open.push_back(std::move(op));
}

// The retired wgmma `op` of the calling thread: reads shared memory now.
inline void wgmma_perform(WgmmaState &s, WgmmaOp &op) {
    const unsigned tid = cur()->linear, t = tid - warpgroup_first();
    if (op.a_regs && std::memcmp(op.a_mine, op.a_saved, sizeof op.a_saved) != 0)
        kernel_fail("thread %u: register-A fragment rewritten while its wgmma was in flight", tid);
    auto rd = [&](uint32_t a) {
        uint16_t h;
        std::memcpy(&h, smem_at(a, 2), 2);
        return wgmma_elem(h, op.ty);
    };
    wgmma_runs(op.a_addr, [](uint32_t a, size_t b) {
        smem_note_read(a, b);
        smem_note_pending_read(a, b, -1);
    });
    wgmma_runs(op.b_addr, [](uint32_t a, size_t b) {
        smem_note_read(a, b);
        smem_note_pending_read(a, b, -1);
    });
    const int w = (int)t / 32, g = ((int)t % 32) / 4, row0 = 16 * w + g;
    float A[2][16];
    if (op.a_regs) {
        for (int q = 0; q < 4; ++q) {
            const int tq = 32 * w + 4 * g + q;
            for (int x = 0; x < 8; ++x) {
                const uint32_t r = op.quad_a[q][x / 2];
                const int row = sm90_isa::doc_a_row(tq, x) - row0;
                A[row / 8][sm90_isa::doc_a_col(tq, x)] = wgmma_elem((uint16_t)(x % 2 ? r >> 16 : r & 0xFFFFu), op.ty);
            }
        }
    } else {
        for (int r = 0; r < 2; ++r)
            for (int k = 0; k < 16; ++k) A[r][k] = rd(op.a_addr[r * 16 + k]);
    }
    const int nc = op.nregs / 2;
    std::vector<float> B((size_t)nc * 16);
    for (int ci = 0; ci < nc; ++ci)
        for (int k = 0; k < 16; ++k)
            B[(size_t)ci * 16 + k] = rd(op.trans_b ? op.b_addr[(size_t)k * nc + ci] : op.b_addr[(size_t)ci * 16 + k]);
    WgmmaChain *c = nullptr;
    size_t ci_chain = 0;
    for (size_t x = 0; x < s.chains.size(); ++x)
        if (s.chains[x].d == op.d) c = &s.chains[x], ci_chain = x;
    if (!c) kernel_fail("thread %u: wgmma accumulator chain lost (emulation bug)", tid);
    for (int i = 0; i < op.nregs; ++i) {
        const int r = (sm90_isa::doc_d_row((int)t, i) - row0) / 8;
        const int col = sm90_isa::doc_d_col((int)t, i);
        const int ci = 2 * (col / 8) + col % 2; // columns 8 j + 2 t + c of this thread, in order
        double acc = 0.0;
        for (int k = 0; k < 16; ++k) acc += (double)A[r][k] * (double)B[(size_t)ci * 16 + k];
        c->value[i] = (float)((double)c->value[i] + acc);
    }
    if (--c->pending == 0) {
        if (!wgmma_is_poison(op.d, op.nregs))
            kernel_fail("thread %u: accumulator registers written while a wgmma on them was in flight", tid);
        std::memcpy(op.d, c->value.data(), sizeof(float) * (size_t)op.nregs);
        s.chains.erase(s.chains.begin() + (long)ci_chain);
    }
}

// wgmma.fence.sync.aligned
inline void wgmma_fence() {
    unsigned char none = 0;
    (void)group_exchange(warpgroup_first(), 128, &none, 1, "wgmma.fence");
    thread_state<WgmmaState>().fenced = true;
}

// wgmma.commit_group.sync.aligned
inline void wgmma_commit_group() {
    unsigned char none = 0;
    (void)group_exchange(warpgroup_first(), 128, &none, 1, "wgmma.commit_group");
    WgmmaState &s = thread_state<WgmmaState>();
    s.groups.push_back(std::move(s.open));
    s.open.clear();
}

// wgmma.wait_group.sync.aligned n: every committed group but the newest n
// retires (its wgmmas run now, in issue order), then the warpgroup meets.
inline void wgmma_wait_group(int n) {
    static const char *const names[8] = {"wgmma.wait_group 0", "wgmma.wait_group 1", "wgmma.wait_group 2",
                                         "wgmma.wait_group 3", "wgmma.wait_group 4", "wgmma.wait_group 5",
                                         "wgmma.wait_group 6", "wgmma.wait_group 7"};
    if (n < 0 || n > 7) kernel_fail("wgmma.wait_group %d (0..7)", n);
    WgmmaState &s = thread_state<WgmmaState>();
    while ((int)s.groups.size() > n) {
        for (WgmmaOp &op : s.groups.front()) wgmma_perform(s, op);
        s.groups.pop_front();
    }
    s.fenced = false;
    unsigned char none = 0;
    (void)group_exchange(warpgroup_first(), 128, &none, 1, names[n]);
}

// Accumulators / A fragments of this thread that wgmmas in flight still
// hold (a kernel may end with none).
inline size_t wgmma_in_flight() {
    WgmmaState &s = thread_state<WgmmaState>();
    size_t k = s.open.size();
    for (const auto &g : s.groups) k += g.size();
    return k;
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 count
inline void setmaxnreg(int count, bool inc) {
    if (count < 24 || count > 256 || count % 8)
        kernel_fail("setmaxnreg.%s %d: the count must be in [24, 256] and a multiple of 8", inc ? "inc" : "dec",
                    count);
    unsigned char none = 0;
    (void)group_exchange(warpgroup_first(), 128, &none, 1, inc ? "setmaxnreg.inc" : "setmaxnreg.dec");
}

} // namespace fp_emu
