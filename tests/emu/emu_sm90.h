// Hopper (sm_90a) instructions for the CUDA emulation (cuda_emu.h): a kernel
// source built with FP_CUDA_EMU routes its inline-PTX wrappers here.
//
// wgmma (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//   - wgmma.mma_async is a warpgroup collective (the 128 threads
//     [128 k, 128 k + 128), all with the same instruction and, for shared
//     operands, the same descriptors). It is *recorded* at issue, not
//     applied: each thread's part runs when that thread arrives at the
//     wgmma.wait_group that retires its group, reading shared memory then.
//     So a kernel that overwrites an operand tile before the wait computes
//     with the new bytes; an async copy issued or landing over bytes an
//     unretired wgmma reads, a wgmma issued over bytes an async copy to
//     which is in flight, and a thread exiting with wgmmas not retired fail
//     the launch.
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
// 8, the same in all threads); otherwise no effect (the emulation has no
// register file).
//
// mbarrier (PTX ISA "Parallel Synchronization and Communication
// Instructions: mbarrier"), block state keyed by the shared address (8-byte
// aligned; use before mbarrier.init fails the launch): init sets the
// expected arrival count, pending = expected, tx-count 0, phase 0; arrive
// (and arrive.expect_tx, which first adds its bytes to tx-count) decrements
// pending; complete_tx subtracts bytes; the phase completes when pending and
// tx-count are both 0 (phase + 1, pending = expected). More arrivals than
// the phase expects fail the launch. A thread's plain arrive (a consumer
// releasing a buffer) yields before it goes on, so the threads the
// arrivals release run first (a thread that releases a buffer before it is
// done with it shows). try_wait.parity P answers whether the
// phase of parity P has completed, i.e. the current phase's parity differs
// from P; when not, the thread yields (spin_yield: a wait nobody can end
// fails the launch as a deadlock). fence.mbarrier_init orders nothing here
// (threads switch only at synchronization points): a no-op in the kernel's
// emu branch. fence.proxy.async: cuda_emu.h's proxy rule.
//
// TMA (cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx
// ::bytes, tiled mode) with tensor maps from the emulated
// cuTensorMapEncodeTiled (registered as the driver entry point, so a
// launcher's cudaGetDriverEntryPoint* finds it): the map's parameters are
// kept in the 128-byte CUtensorMap. A copy is recorded at issue (the bytes
// marked in flight) and lands when its mbarrier is next waited on (by any
// thread): the box is read from global memory then, out-of-bounds elements
// filled with zeros (or NaN for FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA), written
// densely (box[0] innermost) with the 128-byte swizzle applied to the shared
// address, and its bytes complete_tx on the barrier. A consumer that reads
// the tile without waiting reads the poison or fails on bytes in flight. A
// copy that would complete_tx in a later phase of its barrier than the one
// it was issued in (expect_tx and the copies' bytes disagree) fails, and so
// does a block that ends with copies nobody waited for.
// prefetch.tensormap: no-op.
//
// The other direction, TMA stores (cp.async.bulk.tensor.Nd.global.
// shared::cta.bulk_group, tiled mode): issue checks the source (aligned as
// a load's destination; written by the generic proxy only with a
// fence.proxy.async since, by the writer or the issuing thread; another
// thread's writes ordered before the issue by a barrier) and marks its
// bytes as pending async reads (a store or async copy over them fails the
// launch) in the issuing thread's open bulk group. cp.async.bulk
// .commit_group closes it; cp.async.bulk.wait_group[.read] N performs the
// thread's committed groups but the newest N then, at the latest moment the
// ISA allows: shared memory is read (the swizzle undone) and the in-bounds
// elements written to global memory (out-of-bounds ones dropped, as the
// hardware clips), so a kernel that rewrites the source before the wait
// stores the new bytes. A thread that exits with stores not waited for
// fails the launch (the CTA's shared memory may be gone before they read
// it). g_tma_stores counts the boxes stored, for tests.
// stmatrix.sync.aligned.m8n8.x4.shared.b16 (sm_90): a warp collective, the
// inverse of ldmatrix.x4 (each lane's four registers hold (row lane / 4,
// columns 2 (lane % 4), + 1) of matrices 0..3; lane l gives the address of
// row l % 8 of matrix l / 8); each row a synchronous store
// (smem_note_store).
#pragma once

#include <cuda.h> // CUtensorMap and its enums

#include <cstdint>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "cuda_emu.h"
#include "sm90_isa.h"

namespace fp_emu {

enum WgmmaType { WGMMA_F16 = 0, WGMMA_BF16 = 1, WGMMA_E4M3 = 2 };

template <typename T> constexpr WgmmaType wgmma_type();
template <> constexpr WgmmaType wgmma_type<__half>() { return WGMMA_F16; }
template <> constexpr WgmmaType wgmma_type<__nv_bfloat16>() { return WGMMA_BF16; }
template <> constexpr WgmmaType wgmma_type<__nv_fp8_e4m3>() { return WGMMA_E4M3; }
// Element bytes and the k extent of one wgmma: 16-bit types k16, 8-bit k32.
inline int wgmma_elem_bytes(WgmmaType ty) { return ty == WGMMA_E4M3 ? 1 : 2; }
inline int wgmma_k(WgmmaType ty) { return 32 / wgmma_elem_bytes(ty); }

// e4m3 (PTX ".e4m3", OCP FP8 E4M3): 1 sign, 4 exponent (bias 7), 3
// mantissa bits; exponent 0 subnormal (m x 2^-9); no infinities; S.1111.111
// NaN.
inline float e4m3_value(uint8_t v) {
    const int e = (v >> 3) & 15, m = v & 7;
    const float mag = (e == 15 && m == 7) ? NAN : e == 0 ? (float)m / 512.0f : std::ldexp(1.0f + m / 8.0f, e - 7);
    return (v & 0x80) ? -mag : mag;
}

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
    std::vector<uint32_t> a_addr; // shared A: [2 rows][K k] (K = wgmma_k: 16, or 32 for 8-bit types)
    std::vector<uint32_t> b_addr; // K-major: [col][K k]; MN-major: [k][col] (N / 4 columns)
};
struct WgmmaChain {
    float *d;
    int nregs, pending;
    std::vector<float> value;
};
struct WgmmaState {
    bool fenced = false;
    bool hooked = false; // the exit check is registered
    std::vector<WgmmaOp> open;
    std::deque<std::vector<WgmmaOp>> groups;
    std::vector<WgmmaChain> chains;
    std::vector<std::vector<uint32_t>> spare; // retired ops' address vectors, reused (no allocation per wgmma)
    std::vector<float> b_vals;                // wgmma_perform's B operand
};

inline unsigned warpgroup_first() { return cur()->linear / 128 * 128; }

// Runs of consecutive eb-byte element addresses: f(start, bytes).
template <typename F> inline void wgmma_runs(const std::vector<uint32_t> &addr, int eb, F f) {
    size_t i = 0;
    while (i < addr.size()) {
        size_t j = i + 1;
        while (j < addr.size() && addr[j] == addr[j - 1] + (uint32_t)eb) ++j;
        f(addr[i], (size_t)(j - i) * (size_t)eb);
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

// wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16} and
// .m64nNk32.f32.e4m3.e4m3: D (+)= A B with scale-d = 1 (and, 16-bit,
// imm-scale-a = imm-scale-b = 1). A from shared memory (a_regs null:
// descriptor desc_a, trans_a) or from the thread's 4 registers a_regs; B
// from shared memory (desc_b, trans_b). 8-bit types: K-major A and B only
// (the ISA has no transpose for them). `what`: the instruction, the same
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
    const int eb = wgmma_elem_bytes(ty), K = wgmma_k(ty);
    if (eb == 1 && (trans_b || (!a_regs && trans_a)))
        kernel_fail("%s: an 8-bit type with a transposed (MN-major) operand: the ISA allows K-major only", what);

    WgmmaOp op;
    for (std::vector<uint32_t> *v : {&op.a_addr, &op.b_addr})
        if (!s.spare.empty()) {
            *v = std::move(s.spare.back());
            s.spare.pop_back();
            v->clear();
        }
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
        op.a_addr.resize((size_t)2 * K);
        for (int r = 0; r < 2; ++r)
            for (int k = 0; k < K; ++k)
                op.a_addr[r * K + k] = trans_a ? sm90_isa::mnmajor_addr(desc_a, k, row0 + 8 * r)
                                               : sm90_isa::kmajor_addr(desc_a, row0 + 8 * r, k, eb);
    }
    const int nc = n / 4;
    op.b_addr.resize((size_t)nc * K);
    for (int ci = 0; ci < nc; ++ci) {
        const int col = sm90_isa::doc_d_col((int)t, 4 * (ci / 2) + ci % 2);
        for (int k = 0; k < K; ++k) {
            if (trans_b) op.b_addr[(size_t)k * nc + ci] = sm90_isa::mnmajor_addr(desc_b, k, col);
            else op.b_addr[(size_t)ci * K + k] = sm90_isa::kmajor_addr(desc_b, col, k, eb);
        }
    }
    for (uint32_t a : op.a_addr)
        if (a % (uint32_t)eb) kernel_fail("%s: misaligned A element address %u", what, a);
    wgmma_runs(op.a_addr, eb, [](uint32_t a, size_t b) { smem_note_pending_read(a, b, +1); });
    wgmma_runs(op.b_addr, eb, [](uint32_t a, size_t b) { smem_note_pending_read(a, b, +1); });

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
    const int eb = wgmma_elem_bytes(op.ty), K = wgmma_k(op.ty);
    // the addresses' runs are checked against the arena's bounds (smem_at)
    // as they are noted below, before any is read
    const unsigned char *arena = smem_at(0, 0);
    auto rd = [&](uint32_t a) {
        if (eb == 1) return e4m3_value(arena[a]);
        uint16_t h;
        std::memcpy(&h, arena + a, 2);
        return wgmma_elem(h, op.ty);
    };
    wgmma_runs(op.a_addr, eb, [](uint32_t a, size_t b) {
        smem_note_read_wgmma_retire(a, b);
    });
    wgmma_runs(op.b_addr, eb, [](uint32_t a, size_t b) {
        smem_note_read_wgmma_retire(a, b);
    });
    const int w = (int)t / 32, g = ((int)t % 32) / 4, row0 = 16 * w + g;
    float A[2][32];
    if (op.a_regs) {
        for (int q = 0; q < 4; ++q) {
            const int tq = 32 * w + 4 * g + q;
            if (eb == 1) {
                for (int x = 0; x < 16; ++x) {
                    const uint32_t r = op.quad_a[q][x / 4];
                    const int row = sm90_isa::doc_a8_row(tq, x) - row0;
                    A[row / 8][sm90_isa::doc_a8_col(tq, x)] = e4m3_value((uint8_t)(r >> (8 * (x % 4))));
                }
                continue;
            }
            for (int x = 0; x < 8; ++x) {
                const uint32_t r = op.quad_a[q][x / 2];
                const int row = sm90_isa::doc_a_row(tq, x) - row0;
                A[row / 8][sm90_isa::doc_a_col(tq, x)] = wgmma_elem((uint16_t)(x % 2 ? r >> 16 : r & 0xFFFFu), op.ty);
            }
        }
    } else {
        for (int r = 0; r < 2; ++r)
            for (int k = 0; k < K; ++k) A[r][k] = rd(op.a_addr[r * K + k]);
    }
    const int nc = op.nregs / 2;
    std::vector<float> &B = s.b_vals;
    B.resize((size_t)nc * K);
    for (int ci = 0; ci < nc; ++ci)
        for (int k = 0; k < K; ++k)
            B[(size_t)ci * K + k] = rd(op.trans_b ? op.b_addr[(size_t)k * nc + ci] : op.b_addr[(size_t)ci * K + k]);
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
        for (int k = 0; k < K; ++k) acc += (double)A[r][k] * (double)B[(size_t)ci * K + k];
        c->value[i] = (float)((double)c->value[i] + acc);
    }
    if (--c->pending == 0) {
        if (!wgmma_is_poison(op.d, op.nregs))
            kernel_fail("thread %u: accumulator registers written while a wgmma on them was in flight", tid);
        std::memcpy(op.d, c->value.data(), sizeof(float) * (size_t)op.nregs);
        s.chains.erase(s.chains.begin() + (long)ci_chain);
    }
}

// A thread may not exit with wgmmas in flight (their results and reads
// would be lost).
inline void wgmma_exit_check(void *p) {
    const WgmmaState &s = *static_cast<const WgmmaState *>(p);
    size_t k = s.open.size();
    for (const auto &g : s.groups) k += g.size();
    if (k) kernel_fail("thread %u exits with %zu wgmma(s) not retired (wgmma.wait_group)", cur()->linear, k);
}

// wgmma.fence.sync.aligned
inline void wgmma_fence() {
    unsigned char none = 0;
    (void)group_exchange(warpgroup_first(), 128, &none, 1, "wgmma.fence");
    WgmmaState &s = thread_state<WgmmaState>();
    s.fenced = true;
    if (!s.hooked) {
        at_thread_exit(wgmma_exit_check, &s);
        s.hooked = true;
    }
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
        for (WgmmaOp &op : s.groups.front()) {
            wgmma_perform(s, op);
            s.spare.push_back(std::move(op.a_addr));
            s.spare.push_back(std::move(op.b_addr));
        }
        s.groups.pop_front();
    }
    s.fenced = false;
    unsigned char none = 0;
    (void)group_exchange(warpgroup_first(), 128, &none, 1, names[n]);
}

// setmaxnreg.{inc,dec}.sync.aligned.u32 count
inline void setmaxnreg(int count, bool inc) {
    if (count < 24 || count > 256 || count % 8)
        kernel_fail("setmaxnreg.%s %d: the count must be in [24, 256] and a multiple of 8", inc ? "inc" : "dec",
                    count);
    const unsigned first = warpgroup_first();
    const unsigned char *slots =
        group_exchange(first, 128, &count, sizeof count, inc ? "setmaxnreg.inc" : "setmaxnreg.dec");
    for (int k = 0; k < 128; ++k) {
        int c;
        std::memcpy(&c, slots + k * kSlotBytes, sizeof c);
        if (c != count) kernel_fail("setmaxnreg: threads of warpgroup %u pass %d and %d", first / 128, count, c);
    }
}

// ---- tensor maps (the emulated cuTensorMapEncodeTiled) ----------------------

struct EmuTensorMap {
    uint32_t magic;
    uint8_t rank, elem_bytes, swizzle, oob_nan;
    const unsigned char *base;
    uint64_t dims[5];
    uint64_t strides[5]; // bytes; strides[0] = elem_bytes
    uint16_t box[5];
};
static_assert(sizeof(EmuTensorMap) <= sizeof(CUtensorMap), "the emulated map fits a CUtensorMap");
constexpr uint32_t kTensorMapMagic = 0x544D4150u;

// The driver's parameter rules (cuTensorMapEncodeTiled's documentation):
// rank 1..5, address 16-byte aligned, dims in [1, 2^32], strides multiples
// of 16 below 2^40, box dims in [1, 256] with the inner one a multiple of 16
// bytes (and at most the swizzle span), element strides 1..8 (only 1 is
// emulated), no interleave.
inline CUresult emu_tensor_map_encode_tiled(CUtensorMap *map, CUtensorMapDataType dt, cuuint32_t rank, void *addr,
                                            const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                            const cuuint32_t *estr, CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob) {
    int eb = 0;
    switch (dt) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: eb = 1; break;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: eb = 2; break;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: eb = 4; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    if (!map || rank < 1 || rank > 5 || !addr || (uintptr_t)addr % 16 || il != CU_TENSOR_MAP_INTERLEAVE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    if (sw != CU_TENSOR_MAP_SWIZZLE_NONE && sw != CU_TENSOR_MAP_SWIZZLE_128B) return CUDA_ERROR_NOT_SUPPORTED;
    EmuTensorMap m;
    std::memset(&m, 0, sizeof m);
    m.magic = kTensorMapMagic;
    m.rank = (uint8_t)rank;
    m.elem_bytes = (uint8_t)eb;
    m.swizzle = sw == CU_TENSOR_MAP_SWIZZLE_128B;
    m.oob_nan = oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
    m.base = static_cast<const unsigned char *>(addr);
    m.strides[0] = (uint64_t)eb;
    for (cuuint32_t i = 0; i < rank; ++i) {
        if (dims[i] == 0 || dims[i] > (1ull << 32)) return CUDA_ERROR_INVALID_VALUE;
        if (box[i] == 0 || box[i] > 256) return CUDA_ERROR_INVALID_VALUE;
        if (estr[i] != 1) return estr[i] >= 1 && estr[i] <= 8 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
        m.dims[i] = dims[i];
        m.box[i] = (uint16_t)box[i];
        if (i > 0) {
            if (strides[i - 1] % 16 || strides[i - 1] >= (1ull << 40)) return CUDA_ERROR_INVALID_VALUE;
            m.strides[i] = strides[i - 1];
        }
    }
    if ((box[0] * (uint32_t)eb) % 16) return CUDA_ERROR_INVALID_VALUE;
    if (m.swizzle && box[0] * (uint32_t)eb > 128) return CUDA_ERROR_INVALID_VALUE;
    if (m.swizzle && box[0] * (uint32_t)eb != 128) return CUDA_ERROR_NOT_SUPPORTED; // rows narrower than the span
    std::memset(map, 0, sizeof *map);
    std::memcpy(map, &m, sizeof m);
    return CUDA_SUCCESS;
}
inline const bool g_tensor_map_registered =
    register_driver_symbol("cuTensorMapEncodeTiled", reinterpret_cast<void *>(&emu_tensor_map_encode_tiled));

// ---- mbarrier + TMA ----------------------------------------------------------

struct Mbarrier {
    uint32_t expected, pending;
    int64_t tx;
    uint32_t phase; // phases completed
};
struct TmaCopy {
    uint32_t dst, bar, phase; // phase: the barrier's phase at issue
    EmuTensorMap map;
    int coords[5];
    uint32_t bytes;
};
struct TmaStore {
    uint32_t src;
    EmuTensorMap map;
    int coords[5];
    uint32_t bytes;
};
struct BulkThread { // one thread's bulk async-groups of TMA stores
    std::vector<TmaStore> open;
    std::deque<std::vector<TmaStore>> groups; // committed, oldest first
};
struct Sm90Block {
    std::map<uint32_t, Mbarrier> bars;
    std::vector<TmaCopy> tma; // issued, not landed
    bool hooked = false;      // the exit check is registered
    std::map<unsigned, BulkThread> bulk; // by the thread's linear index
};
inline std::atomic<long> g_tma_stores{0};
// A block may not end with TMA copies nobody waited for (shared memory
// written after the CTA is gone; a load no consumer used).
inline void tma_exit_check(void *p) {
    const Sm90Block &B = *static_cast<const Sm90Block *>(p);
    if (!B.tma.empty())
        kernel_fail("the block ends with %zu TMA copies never waited for (the first to shared %u on the mbarrier at "
                    "%u)",
                    B.tma.size(), B.tma[0].dst, B.tma[0].bar);
}

inline Mbarrier &mbarrier_at(uint32_t addr, const char *what) {
    Sm90Block &B = block_state<Sm90Block>();
    auto it = B.bars.find(addr);
    if (it == B.bars.end()) kernel_fail("%s on shared address %u: no mbarrier.init there", what, addr);
    return it->second;
}

inline void mbarrier_check_phase(Mbarrier &m) {
    if (m.pending == 0 && m.tx == 0) {
        m.phase++;
        m.pending = m.expected;
        note_progress();
    }
}

// mbarrier.init.shared::cta.b64 [addr], count
inline void mbarrier_init(uint32_t addr, uint32_t count) {
    if (addr % 8) kernel_fail("mbarrier.init at shared address %u: not 8-byte aligned", addr);
    if (count < 1 || count > (1u << 20) - 1) kernel_fail("mbarrier.init with count %u", count);
    (void)smem_at(addr, 8);
    block_state<Sm90Block>().bars[addr] = Mbarrier{count, count, 0, 0};
}

// mbarrier.arrive[.expect_tx].shared::cta.b64 _, [addr][, tx]
inline void mbarrier_arrive(uint32_t addr, uint32_t expect_tx = 0) {
    Mbarrier &m = mbarrier_at(addr, "mbarrier.arrive");
    m.tx += expect_tx;
    if (m.tx > (1 << 20) - 1) kernel_fail("mbarrier at %u: tx-count %lld out of range", addr, (long long)m.tx);
    if (m.pending == 0)
        kernel_fail("mbarrier at %u: more arrivals than its count (%u) in one phase", addr, m.expected);
    m.pending--;
    note_progress();
    mbarrier_check_phase(m);
    if (!expect_tx) spin_yield("mbarrier.arrive");
}

// The tensor map a cp.async.bulk.tensor names, checked: made by the
// emulated encoder, of the instruction's rank, its shared side aligned
// (1024 bytes under the 128-byte swizzle, else 128).
inline EmuTensorMap tensor_map_checked(const void *map_ptr, int rank, uint32_t smem, const char *what) {
    EmuTensorMap m;
    std::memcpy(&m, map_ptr, sizeof m);
    if (m.magic != kTensorMapMagic)
        kernel_fail("%s with a tensor map not made by (the emulated) cuTensorMapEncodeTiled", what);
    if (m.rank != rank) kernel_fail("%s (%dd) with a tensor map of rank %d", what, rank, m.rank);
    if (smem % (m.swizzle ? 1024u : 128u))
        kernel_fail("%s at shared address %u: not %u-byte aligned", what, smem, m.swizzle ? 1024u : 128u);
    return m;
}
// A box's coordinates (zero past the rank) into out; returns its bytes.
inline uint32_t box_coords(const EmuTensorMap &m, int rank, const int *coords, int (&out)[5]) {
    uint32_t elems = 1;
    for (int i = 0; i < 5; ++i) out[i] = i < rank ? coords[i] : 0;
    for (int i = 0; i < rank; ++i) elems *= m.box[i];
    return elems * m.elem_bytes;
}
// f(global address of the element, or nullptr out of the map's bounds; its
// byte offset in the box's shared copy at smem, swizzle applied) for every
// element of the box at coords, box[0] innermost.
template <class F>
inline void box_for_each(const EmuTensorMap &m, const int (&coords)[5], uint32_t smem, uint32_t bytes, F f) {
    const uint32_t eb = m.elem_bytes, total = bytes / eb;
    for (uint32_t n = 0; n < total; ++n) {
        uint32_t rem = n;
        bool in = true;
        const unsigned char *g = m.base;
        for (int i = 0; i < m.rank; ++i) {
            const int64_t x = (int64_t)coords[i] + (int64_t)(rem % m.box[i]);
            rem /= m.box[i];
            if (x < 0 || (uint64_t)x >= m.dims[i]) in = false;
            else g += (uint64_t)x * m.strides[i];
        }
        uint32_t off = n * eb;
        if (m.swizzle) off = sm90_isa::swizzle128(smem + off) - smem;
        f(in ? g : nullptr, off);
    }
}

// Lands the TMA copies in flight that complete on barrier `bar`.
inline void tma_land(uint32_t bar) {
    Sm90Block &B = block_state<Sm90Block>();
    std::vector<TmaCopy> keep, land;
    for (TmaCopy &c : B.tma) (c.bar == bar ? land : keep).push_back(c);
    if (land.empty()) return;
    B.tma.swap(keep);
    for (const TmaCopy &c : land) {
        const EmuTensorMap &m = c.map;
        unsigned char *d = smem_at(c.dst, c.bytes);
        const size_t eb = m.elem_bytes;
        box_for_each(m, c.coords, c.dst, c.bytes, [&](const unsigned char *g, uint32_t off) {
            if (g) std::memcpy(d + off, g, eb);
            else std::memset(d + off, m.oob_nan ? 0xFF : 0, eb);
        });
        smem_note_async_complete_mbar(c.dst, c.bytes);
        Mbarrier &b = mbarrier_at(c.bar, "cp.async.bulk.tensor (complete_tx)");
        if (b.phase != c.phase)
            kernel_fail("cp.async.bulk.tensor to %u completes its %u bytes on the mbarrier at %u in phase %u, but "
                        "was issued in phase %u, which completed without it (expect_tx and the copies disagree)",
                        c.dst, c.bytes, c.bar, b.phase, c.phase);
        b.tx -= c.bytes;
        if (b.tx < -((1 << 20) - 1)) kernel_fail("mbarrier at %u: tx-count %lld out of range", c.bar, (long long)b.tx);
        mbarrier_check_phase(b);
    }
    note_progress();
}

// mbarrier.try_wait.parity.shared::cta.b64 p, [addr], parity: lands the TMA
// copies on this barrier first; when the phase of that parity has not
// completed, yields before answering false.
inline bool mbarrier_try_wait_parity(uint32_t addr, uint32_t parity) {
    tma_land(addr);
    Mbarrier &m = mbarrier_at(addr, "mbarrier.try_wait.parity");
    if ((m.phase & 1u) != (parity & 1u)) return true;
    spin_yield("mbarrier.try_wait.parity");
    return false;
}

// cp.async.bulk.tensor.<rank>d.shared::cluster.global.mbarrier::complete_tx::bytes
// [dst], [map, {coords}], [bar]
inline void tma_load_tiled(uint32_t dst, const void *map_ptr, int rank, const int *coords, uint32_t bar) {
    pdl_require("cp.async.bulk.tensor");
    TmaCopy c;
    c.map = tensor_map_checked(map_ptr, rank, dst, "cp.async.bulk.tensor");
    c.phase = mbarrier_at(bar, "cp.async.bulk.tensor").phase;
    c.dst = dst;
    c.bar = bar;
    c.bytes = box_coords(c.map, rank, coords, c.coords);
    for (const auto &b : block_state<Sm90Block>().bars)
        if (b.first + 8 > dst && b.first < dst + c.bytes)
            kernel_fail("cp.async.bulk.tensor to [%u, %u) overwrites the mbarrier at %u", dst, dst + c.bytes, b.first);
    smem_note_async_issue_mbar(dst, c.bytes);
    Sm90Block &B = block_state<Sm90Block>();
    B.tma.push_back(c);
    if (!B.hooked) {
        at_block_exit(tma_exit_check, &B);
        B.hooked = true;
    }
}


// ---- the store direction: stmatrix, TMA stores, bulk async-groups ---------

// stmatrix.sync.aligned.m8n8.x4.shared.b16 [addr], {r0, r1, r2, r3}
inline void stmatrix_x4(uint32_t addr, const uint32_t r[4]) {
    struct Slot {
        uint32_t addr, r[4];
    } mine = {addr, {r[0], r[1], r[2], r[3]}};
    static_assert(sizeof(Slot) <= kSlotBytes, "one lane's slot");
    if (addr % 16) kernel_fail("stmatrix.x4: row address %u of lane %u is not 16-byte aligned", addr, cur()->lane);
    const unsigned char *s = warp_exchange(0xffffffffu, &mine, sizeof mine, "stmatrix.x4");
    Slot all[32];
    for (int l = 0; l < 32; ++l) std::memcpy(&all[l], s + l * kSlotBytes, sizeof(Slot));
    // this lane's row: row l % 8 of matrix l / 8, from lanes 4 (l % 8) + c, c = 0..3
    const int lane = (int)cur()->lane, m = lane / 8, row = lane % 8;
    uint32_t out[4];
    for (int c = 0; c < 4; ++c) out[c] = all[4 * row + c].r[m];
    smem_note_store(addr, 16);
    std::memcpy(smem_at(addr, 16), out, 16);
}

// Writes one TMA store's box from shared memory to global memory.
inline void tma_store_perform(const TmaStore &c) {
    const unsigned char *src = smem_at(c.src, c.bytes);
    const size_t eb = c.map.elem_bytes;
    box_for_each(c.map, c.coords, c.src, c.bytes, [&](const unsigned char *g, uint32_t off) {
        if (g) std::memcpy(const_cast<unsigned char *>(g), src + off, eb); // out of bounds: dropped
    });
    smem_note_async_read(c.src, c.bytes, -1, "cp.async.bulk.tensor (store)");
    g_tma_stores.fetch_add(1, std::memory_order_relaxed);
}

inline void bulk_exit_check(void *p) {
    const BulkThread &t = *static_cast<const BulkThread *>(p);
    if (!t.open.empty())
        kernel_fail("the thread exits with %zu TMA stores never committed (cp.async.bulk.commit_group) nor waited "
                    "for (the first from shared %u)",
                    t.open.size(), t.open[0].src);
    if (!t.groups.empty())
        kernel_fail("the thread exits with %zu bulk async-groups of TMA stores not waited for "
                    "(cp.async.bulk.wait_group.read): their shared source may be gone before it is read",
                    t.groups.size());
}

inline BulkThread &bulk_thread() {
    Sm90Block &B = block_state<Sm90Block>();
    auto it = B.bulk.find(cur()->linear);
    if (it == B.bulk.end()) {
        it = B.bulk.emplace(cur()->linear, BulkThread()).first;
        at_thread_exit(bulk_exit_check, &it->second);
    }
    return it->second;
}

// cp.async.bulk.tensor.<rank>d.global.shared::cta.bulk_group [map, {coords}], [src]
inline void tma_store_tiled(const void *map_ptr, int rank, const int *coords, uint32_t src) {
    pdl_require("cp.async.bulk.tensor (store)");
    TmaStore c;
    c.map = tensor_map_checked(map_ptr, rank, src, "cp.async.bulk.tensor (store)");
    c.src = src;
    c.bytes = box_coords(c.map, rank, coords, c.coords);
    smem_note_async_read(src, c.bytes, +1, "a TMA store");
    bulk_thread().open.push_back(c);
}

// cp.async.bulk.commit_group
inline void bulk_commit_group() {
    BulkThread &t = bulk_thread();
    if (t.open.empty()) return; // an empty group: nothing to wait for
    t.groups.push_back(std::move(t.open));
    t.open.clear();
}

// cp.async.bulk.wait_group[.read] n: all of the thread's committed groups
// but the newest n complete (here: are performed).
inline void bulk_wait_group(int n) {
    if (n < 0 || n > 63) kernel_fail("cp.async.bulk.wait_group %d (0..63)", n);
    BulkThread &t = bulk_thread();
    while ((int)t.groups.size() > n) {
        for (const TmaStore &c : t.groups.front()) tma_store_perform(c);
        t.groups.pop_front();
    }
    note_progress();
}

} // namespace fp_emu
