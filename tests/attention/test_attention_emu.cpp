// The sm_80 attention kernels themselves (kernels/attention/attention_flash.cu:
// flash v1 / v2 on mma.sync, split-KV and attention_split_combine_v1;
// kernels/attention/attention_simple.cu: the row-wise kernel, the
// materialized baseline's masked softmax, the page gather, the zero fill),
// compiled from their own sources for the CPU emulation of the CUDA
// execution model (tests/emu: a fiber per CUDA thread; barriers, warp
// collectives, ldmatrix / mma.sync / cp.async in tests/emu/emu_sm80.h, the
// async copies' shared-memory races and the launch limits checked), called
// through their launchers as the library calls them, on an A100 profile.
//
// Every case: inputs random only where the call has elements, NaN (0xFF)
// everywhere else (stride padding, keys past a sequence's length, unused
// pages, the guard bytes around them: a read there that reaches a result
// poisons it) and compared with a copy after; outputs poisoned with 0xFF
// (NaN in every dtype), behind guard bytes; the launcher's status,
// the emulation's verdict (a rule broken, a race, a read of never-written
// shared memory), then every output element against the double-precision
// reference (fp_attn_reference), every element the kernel must not write
// still poisoned, every guard intact. Split-KV partials come from the
// emulated cudaMallocAsync: NaN-filled, guarded, checked at cudaFreeAsync.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "emu_sm80.h"

#include "attention/attention_internal.h"
#include "attn_emu_util.h"

static int g_fail = 0;
static int g_cases = 0;

// ---------------------------------------------------------------------------
// Guarded device buffers
// ---------------------------------------------------------------------------
static const unsigned char kGuardByte = 0xA5;
static const size_t kGuard = 512;

struct Buf {
    std::vector<unsigned char> mem;
    unsigned char *p = nullptr;
    size_t n = 0;
    unsigned char guard = kGuardByte;
    void init(size_t bytes, unsigned char fill, unsigned char guard_byte = kGuardByte) {
        n = bytes;
        guard = guard_byte;
        mem.assign(bytes + 2 * kGuard + 256, guard);
        uintptr_t a = ((uintptr_t)(mem.data() + kGuard) + 255) & ~(uintptr_t)255;
        p = reinterpret_cast<unsigned char *>(a);
        memset(p, fill, n);
    }
    bool guards_ok() const {
        for (const unsigned char *c = mem.data(); c < p; ++c)
            if (*c != guard) return false;
        for (const unsigned char *c = p + n; c < mem.data() + mem.size(); ++c)
            if (*c != guard) return false;
        return true;
    }
    template <typename T> T *as() const { return reinterpret_cast<T *>(p); }
};

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------
enum Kernel {
    FLASH,       // fp_attn_cuda_flash_version(a, version, splits)
    FLASH_AUTO,  // fp_attn_cuda_flash(a, version, sm_count = splits, cc 8.0): the library's split choice
    ROWWISE,     // fp_attn_cuda_rowwise
};

struct Case {
    const char *name;
    Kernel kernel;
    int version, splits;
    int batch, sq, sk, hq, hkv, d;
    fp_dtype dt;
    int causal, wl, wr;
    int ragged;  // seqlens_k: per-sequence key counts (a cache filled to different lengths)
    int varlen;  // cu_seqlens: packed sequences of different lengths (2: all but a few empty)
    int page;    // paged KV: page_size (0: dense K/V)
    int layout;  // 0 packed; 1 padded rows and heads; 2 head-major (BHSD), padded
    int lse;     // request the log-sum-exp
    float scale; // 0: 1/sqrt(head_dim)
};

// Strides (elements) of a [nb, ns, nh, d] tensor in `layout`, and the
// elements it spans.
struct Strides {
    int64_t bs, ss, hs, span;
};
static Strides make_strides(int layout, int64_t nb, int64_t ns, int64_t nh, int64_t d) {
    Strides s;
    if (layout == 0) {
        s.hs = d;
        s.ss = nh * d;
        s.bs = ns * s.ss;
    } else if (layout == 1) {
        s.hs = d + 8;
        s.ss = nh * s.hs + 8;
        s.bs = ns * s.ss + 16;
    } else {
        s.ss = d + 8;
        s.hs = ns * s.ss + 8;
        s.bs = nh * s.hs + 24;
    }
    s.span = (nb - 1) * s.bs + (ns - 1) * s.ss + (nh - 1) * s.hs + d;
    return s;
}

static size_t elt_size(fp_dtype dt) { return dt == FP_F32 ? 4 : 2; }
static double unit_roundoff(fp_dtype dt) { return dt == FP_BF16 ? 1.0 / 256 : dt == FP_F16 ? 1.0 / 2048 : 1.0 / (1 << 24); }
static void store(void *base, int64_t i, fp_dtype dt, float x) {
    if (dt == FP_F32) static_cast<float *>(base)[i] = x;
    else static_cast<h16 *>(base)[i] = from_f(x, dt);
}
static double load(const void *base, int64_t i, fp_dtype dt) {
    return dt == FP_F32 ? (double)static_cast<const float *>(base)[i] : (double)to_f(static_cast<const h16 *>(base)[i], dt);
}

// One case's host tensors ("device" memory in the emulation).
struct Data {
    std::vector<int32_t> cu_q, cu_k, lens, bt;
    Buf q, k, v, o, lse, lens_b, cu_q_b, cu_k_b, bt_b;
    Strides sq_, sk_, so_;
    std::vector<unsigned char> q0, k0, v0;  // input copies
    int num_pages = 0, bt_stride = 0;
};


// Element offset of key j of sequence b (head 0, x 0) in X.k / X.v.
static int64_t kv_row(const Case &c, const Data &X, int b, int j) {
    if (c.page) return (int64_t)X.bt[(size_t)b * X.bt_stride + j / c.page] * X.sk_.bs + (j % c.page) * X.sk_.ss;
    if (c.varlen) return (int64_t)(X.cu_k[b] + j) * X.sk_.ss;
    return (int64_t)b * X.sk_.bs + (int64_t)j * X.sk_.ss;
}

// Builds the tensors and the checked arguments (fp_attn_check, CUDA rules).
static bool setup(const Case &c, emu_rng &rng, Data &X, fp_attn_args &a) {
    const int B = c.batch;
    X.cu_q.assign(B + 1, 0);
    X.cu_k.assign(B + 1, 0);
    X.lens.assign(B, c.sk);
    for (int b = 0; b < B; ++b) {
        // varlen: lengths cycling through full, short, empty and near-full
        static const int qpat[4] = {-1, 5, 0, -3}, kpat[4] = {-9, -1, 17, 0};
        auto len = [](int pat, int full) {
            int n = pat < 0 ? full + pat + 1 : pat;
            return n < 0 ? 0 : (n > full ? full : n);
        };
        int nq = c.varlen ? len(qpat[b % 4], c.sq) : c.sq;
        int nk = c.varlen ? len(kpat[b % 4], c.sk) : c.sk;
        if (c.varlen == 2) {  // sparse: a few sequences around the launchers' 65535-batch chunks
            const bool used = b < 2 || b >= B - 2 || b == 65534 || b == 65535;
            nq = used ? (c.sq > 1 ? c.sq - b % 2 : 1) : 0;
            nk = used ? c.sk - b % 3 : 0;
        }
        X.cu_q[b + 1] = X.cu_q[b] + nq;
        X.cu_k[b + 1] = X.cu_k[b] + nk;
        // ragged: short, past seqlen_k (clamped), not a tile multiple, empty, negative (empty)
        const int rag[5] = {2, c.sk + 9, c.sk - 7, 0, -3};
        X.lens[b] = rag[b % 5];
    }
    const int64_t d = c.d;
    const size_t es = elt_size(c.dt);
    // Q / O: [batch, sq, hq, d] or varlen [1, total + 1 spare row, hq, d]
    const int64_t nb = c.varlen ? 1 : B;
    const int64_t nsq = c.varlen ? X.cu_q[B] + 1 : c.sq;
    X.sq_ = make_strides(c.layout, nb, nsq, c.hq, d);
    X.so_ = make_strides(c.layout, nb, nsq, c.hq, d);
    // K / V: dense [batch, sk, hkv, d] (varlen packed) or a page pool
    int64_t nkb = nb, nsk = c.varlen ? X.cu_k[B] + 1 : c.sk;
    if (c.page) {
        const int per_seq = (c.sk + c.page - 1) / c.page;
        X.bt_stride = per_seq + 1;
        X.num_pages = B * per_seq + 3;  // spare pages nobody uses
        nkb = X.num_pages;
        nsk = c.page;
        // pages of the sequences: a shuffled permutation; the table's
        // entries past a sequence's keys are out of range (must not be read)
        std::vector<int32_t> perm(X.num_pages);
        for (int i = 0; i < X.num_pages; ++i) perm[i] = i;
        for (int i = X.num_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.step() % (uint64_t)(i + 1)]);
        X.bt.assign((size_t)B * X.bt_stride, -1);
        for (int b = 0; b < B; ++b) {
            const int L = c.ragged ? fp_attn_clamp(X.lens[b], c.sk) : c.sk;
            const int used = (L + c.page - 1) / c.page;
            for (int j = 0; j < X.bt_stride; ++j)
                X.bt[(size_t)b * X.bt_stride + j] =
                    j < used ? perm[(size_t)b * per_seq + j] : (j % 2 ? X.num_pages + 7 : -1 - j);
        }
        X.bt_b.init(X.bt.size() * 4, 0);
        memcpy(X.bt_b.p, X.bt.data(), X.bt.size() * 4);
    }
    X.sk_ = make_strides(c.layout, nkb, nsk, c.hkv, d);
    // Inputs: random where the call's tensors have elements, NaN (0xFF) in
    // between (stride padding, keys past a sequence's length, unused pages,
    // the guards): a read there that reaches a result poisons it.
    X.q.init((size_t)X.sq_.span * es, 0xFF, 0xFF);
    X.k.init((size_t)X.sk_.span * es, 0xFF, 0xFF);
    X.v.init((size_t)X.sk_.span * es, 0xFF, 0xFF);
    for (int b = 0; b < B; ++b) {
        const int nq = c.varlen ? X.cu_q[b + 1] - X.cu_q[b] : c.sq;
        const int64_t q0 = c.varlen ? (int64_t)X.cu_q[b] * X.sq_.ss : (int64_t)b * X.sq_.bs;
        for (int i = 0; i < nq; ++i)
            for (int h = 0; h < c.hq; ++h)
                for (int64_t x = 0; x < d; ++x) store(X.q.p, q0 + i * X.sq_.ss + h * X.sq_.hs + x, c.dt, rng.next());
        const int L = c.varlen ? X.cu_k[b + 1] - X.cu_k[b] : c.ragged ? fp_attn_clamp(X.lens[b], c.sk) : c.sk;
        for (int j = 0; j < L; ++j) {
            const int64_t row = kv_row(c, X, b, j);
            for (int h = 0; h < c.hkv; ++h)
                for (int64_t x = 0; x < d; ++x) {
                    store(X.k.p, row + h * X.sk_.hs + x, c.dt, rng.next());
                    store(X.v.p, row + h * X.sk_.hs + x, c.dt, rng.next());
                }
        }
    }
    X.o.init((size_t)X.so_.span * es, 0xFF);
    X.lse.init((size_t)B * c.hq * c.sq * 4, 0xFF);
    X.q0.assign(X.q.p, X.q.p + X.q.n);
    X.k0.assign(X.k.p, X.k.p + X.k.n);
    X.v0.assign(X.v.p, X.v.p + X.v.n);
    X.lens_b.init((size_t)B * 4, 0);
    memcpy(X.lens_b.p, X.lens.data(), (size_t)B * 4);
    X.cu_q_b.init((size_t)(B + 1) * 4, 0);
    X.cu_k_b.init((size_t)(B + 1) * 4, 0);
    memcpy(X.cu_q_b.p, X.cu_q.data(), (size_t)(B + 1) * 4);
    memcpy(X.cu_k_b.p, X.cu_k.data(), (size_t)(B + 1) * 4);

    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = B; p.seqlen_q = c.sq; p.seqlen_k = c.sk; p.heads_q = c.hq; p.heads_kv = c.hkv;
    p.head_dim = c.d; p.dtype = c.dt; p.causal = c.causal; p.window_left = c.wl; p.window_right = c.wr;
    p.softmax_scale = c.scale;
    p.q = X.q.p; p.k = X.k.p; p.v = X.v.p; p.o = X.o.p;
    p.lse = c.lse ? X.lse.as<float>() : nullptr;
    p.q_seq_stride = X.sq_.ss; p.q_head_stride = X.sq_.hs;
    p.k_seq_stride = p.v_seq_stride = X.sk_.ss; p.k_head_stride = p.v_head_stride = X.sk_.hs;
    p.o_seq_stride = X.so_.ss; p.o_head_stride = X.so_.hs;
    if (!c.varlen) {
        p.q_batch_stride = X.sq_.bs; p.o_batch_stride = X.so_.bs;
    }
    if (!c.varlen || c.page) p.k_batch_stride = p.v_batch_stride = X.sk_.bs;
    if (c.varlen) {
        p.cu_seqlens_q = X.cu_q_b.as<int32_t>();
        p.cu_seqlens_k = X.cu_k_b.as<int32_t>();
    }
    if (c.ragged) p.seqlens_k = X.lens_b.as<int32_t>();
    if (c.page) {
        p.block_table = X.bt_b.as<int32_t>();
        p.block_table_stride = X.bt_stride;
        p.page_size = c.page;
        p.num_pages = X.num_pages;
    }
    if (fp_attn_check(&p, 1, &a) != FP_OK) {
        fprintf(stderr, "%s: params refused: %s\n", c.name, fp_last_error());
        return false;
    }
    return true;
}

// Inputs unchanged, guards intact.
static bool inputs_intact(const Data &X) {
    bool ok = X.q.guards_ok() && X.k.guards_ok() && X.v.guards_ok() && X.o.guards_ok() && X.lse.guards_ok() &&
              X.lens_b.guards_ok() && X.cu_q_b.guards_ok() && X.cu_k_b.guards_ok();
    ok = ok && !memcmp(X.q.p, X.q0.data(), X.q.n) && !memcmp(X.k.p, X.k0.data(), X.k.n) &&
         !memcmp(X.v.p, X.v0.data(), X.v.n);
    ok = ok && !memcmp(X.lens_b.p, X.lens.data(), X.lens.size() * 4) &&
         !memcmp(X.cu_q_b.p, X.cu_q.data(), X.cu_q.size() * 4) && !memcmp(X.cu_k_b.p, X.cu_k.data(), X.cu_k.size() * 4);
    if (!X.bt.empty()) ok = ok && X.bt_b.guards_ok() && !memcmp(X.bt_b.p, X.bt.data(), X.bt.size() * 4);
    return ok;
}

static const char *kernel_name(const Case &c) {
    return c.kernel == ROWWISE ? "rowwise" : c.kernel == FLASH_AUTO ? "flash(auto)" : c.version == 2 ? "flash v2" : c.version == 6 ? "decode v6" : c.version == 7 ? "flash v7" : "flash v1";
}

// O, lse and everything around them against fp_attn_reference.
static bool verify(const Case &c, const Data &X, const fp_attn_args &a, double secs) {
    const int64_t d = c.d;
    const size_t es = elt_size(c.dt);
    std::vector<double> o_ref((size_t)c.batch * c.sq * c.hq * d), lse_ref((size_t)c.batch * c.hq * c.sq);
    fp_attn_reference(nullptr, &a, o_ref.data(), lse_ref.data());
    // Flash: P is rounded to the dtype before P V (an error up to u |V|,
    // |V| < 1, mostly averaging out), O once at the end; the row-wise
    // kernel keeps P in f32.
    const double u = unit_roundoff(c.dt);
    const double atol = c.kernel == ROWWISE ? 4e-6 : 0.5 * u, rtol = c.kernel == ROWWISE ? u + 4e-6 : u;
    std::vector<char> written((size_t)X.so_.span, 0);
    size_t bad = 0, lse_bad = 0, poison_bad = 0;
    double worst = 0.0;  // max err / tolerance
    for (int b = 0; b < c.batch; ++b) {
        const int nq = c.varlen ? X.cu_q[b + 1] - X.cu_q[b] : c.sq;
        const int64_t o0 = c.varlen ? (int64_t)X.cu_q[b] * X.so_.ss : (int64_t)b * X.so_.bs;
        for (int i = 0; i < c.sq; ++i)
            for (int h = 0; h < c.hq; ++h) {
                const size_t li = ((size_t)b * c.hq + h) * c.sq + i;
                uint32_t lbits;
                memcpy(&lbits, X.lse.as<float>() + li, 4);
                if (i >= nq || !c.lse) {  // lse past a varlen sequence (or not requested): untouched
                    if (lbits != 0xFFFFFFFFu) lse_bad++;
                    if (i >= nq) continue;
                }
                for (int64_t x = 0; x < d; ++x) {
                    const int64_t off = o0 + (int64_t)i * X.so_.ss + (int64_t)h * X.so_.hs + x;
                    written[(size_t)off] = 1;
                    const double ref = o_ref[(((size_t)b * c.sq + i) * c.hq + h) * d + x];
                    const double got = load(X.o.p, off, c.dt);
                    const double tol = atol + rtol * (std::isnan(ref) ? 0.0 : fabs(ref));
                    const double err = std::isnan(ref) ? (std::isnan(got) ? 0.0 : INFINITY) : fabs(got - ref);
                    if (!(err <= tol)) {
                        if (bad < 4)
                            fprintf(stderr, "  %s: O[b %d, i %d, h %d, x %lld] = %.7g, ref %.7g\n", c.name, b, i, h,
                                    (long long)x, got, ref);
                        bad++;
                    }
                    if (!(err / tol <= worst)) worst = err / tol;
                }
                if (c.lse) {
                    const double lr = lse_ref[li], lg = X.lse.as<float>()[li];
                    const bool ok = std::isnan(lr)   ? std::isnan(lg)
                                    : std::isinf(lr) ? (std::isinf(lg) && lg < 0)
                                                     : fabs(lg - lr) <= 2e-5 * (1 + fabs(lr));
                    if (!ok) {
                        if (lse_bad < 4)
                            fprintf(stderr, "  %s: lse[b %d, h %d, i %d] = %.9g, ref %.9g\n", c.name, b, h, i, lg, lr);
                        lse_bad++;
                    }
                }
            }
    }
    // Everything else of O (padding, heads' gaps, rows past the sequences) untouched.
    for (int64_t e = 0; e < X.so_.span; ++e)
        if (!written[(size_t)e])
            for (size_t k = 0; k < es; ++k)
                if (X.o.p[(size_t)e * es + k] != 0xFF) {
                    poison_bad++;
                    break;
                }
    const bool intact = inputs_intact(X);
    const bool ok = !bad && !lse_bad && !poison_bad && intact;
    printf("%-9s %-28s %-11s max err/tol %.3f%s%s%s%s  (%.2f s)\n", ok ? "ok" : "FAIL", c.name, kernel_name(c), worst,
           bad ? " [O mismatch]" : "", lse_bad ? " [lse]" : "", poison_bad ? " [wrote outside O's elements]" : "",
           intact ? "" : " [guards/inputs changed]", secs);
    return ok;
}

static double now_s() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Non-finite scores from the data (nonfinite = 1): in every sequence, key 0
// .. min(L, 70) - 1 get K[x 0] = +inf (scores +inf or -inf by the sign of
// Q[x 0]: a leading key tile of -inf scores, then finite ones) and key 100 (if
// present, in even sequences) gets K[x 0] = NaN. torch's rule, as the reference's: a NaN or
// +inf score makes its row NaN (O and lse), -inf scores are dropped, a row
// whose scores are all -inf is O = 0, lse = -inf. Both kinds of rows must occur.
static bool poison_keys(const Case &c, Data &X, const fp_attn_args &a) {
    for (int b = 0; b < c.batch; ++b) {
        const int L = c.varlen ? X.cu_k[b + 1] - X.cu_k[b] : c.ragged ? fp_attn_clamp(X.lens[b], c.sk) : c.sk;
        for (int j = 0; j < L && j < 70; ++j) store(X.k.p, kv_row(c, X, b, j), c.dt, INFINITY);
        if (L > 100 && b % 2 == 0) store(X.k.p, kv_row(c, X, b, 100), c.dt, NAN);
    }
    X.k0.assign(X.k.p, X.k.p + X.k.n);
    std::vector<double> lse_ref((size_t)c.batch * c.hq * c.sq);
    fp_attn_reference(nullptr, &a, nullptr, lse_ref.data());
    size_t nan_rows = 0, finite_rows = 0;
    for (double l : lse_ref) {
        nan_rows += std::isnan(l);
        finite_rows += std::isfinite(l);
    }
    if (!nan_rows || !finite_rows) printf("FAIL      %-28s poisoned keys: %zu NaN rows, %zu finite\n", c.name, nan_rows, finite_rows);
    return nan_rows && finite_rows;
}

static void run_case(const Case &c, emu_rng &rng, int nonfinite = 0) {
    g_cases++;
    Data X;
    fp_attn_args a;
    if (!setup(c, rng, X, a) || (nonfinite && !poison_keys(c, X, a))) {
        g_fail++;
        return;
    }
    const double t0 = now_s();
    // An earlier failure's message, which a successful call must leave as
    // it is even when a preferred version refused inside it (core.h's rule).
    fp_dtype unused_dtype;
    (void)fp_dtype_parse("no-such-dtype", &unused_dtype);
    const std::string earlier_error = fp_last_error();
    fp_status st;
    fp_attn_note_begin(c.kernel == FLASH_AUTO ? c.version : 0);
    fp_emu::clear_launch_log();
    if (c.kernel == FLASH) st = fp_attn_cuda_flash_version(&a, c.version, c.splits, 0);
    else if (c.kernel == FLASH_AUTO) st = fp_attn_cuda_flash(&a, c.version, c.splits, 80, 0);
    else st = fp_attn_cuda_rowwise(&a, 0);
    const double secs = now_s() - t0;
    if (st != FP_OK) {
        printf("FAIL      %-28s %-11s status %s: %s\n", c.name, kernel_name(c), fp_status_string(st), fp_last_error());
        printf("          emulation: %s\n", fp_emu::last_failure());
        g_fail++;
        return;
    }
    if (!verify(c, X, a, secs)) g_fail++;
    // fp_attention_last_kernel: what ran. An explicit version as asked; the
    // automatic choice v1 or the preferred version, and a fallback only with
    // its reason (this emulation build has no sm_90a kernels: v3..v5 fall back).
    fp_attention_kernel_info k;
    fp_attention_last_kernel(&k);
    bool ran_ok = true;
    if (c.kernel == FLASH) ran_ok = k.version == c.version && k.num_splits == c.splits && !k.fallback[0];
    else if (c.kernel == FLASH_AUTO && c.version == 6) // the decode kernel: rows per KV head <= 64, else v1 and why
        ran_ok = (int64_t)c.sq * (c.hq / c.hkv) <= 64 ? k.version == 6 && !k.fallback[0]
                                                      : k.version == 1 && strstr(k.fallback, "v6") != nullptr;
    else if (c.kernel == FLASH_AUTO)
        ran_ok = c.version >= 2 ? (k.version == c.version) != (k.fallback[0] != '\0') && (k.version == c.version || k.version == 1)
                                : k.version == 1 && !k.fallback[0];
    else if (c.kernel == ROWWISE) ran_ok = strcmp(k.kernel, "none") == 0; // recorded by fp_attention_forward only
    if (!ran_ok) {
        printf("FAIL      %-28s %-11s fp_attention_last_kernel: %s, %d splits, fallback '%s'\n", c.name, kernel_name(c),
               k.kernel, k.num_splits, k.fallback);
        g_fail++;
    }
    // v2 at head_dim 128: the 128 x 64 tile, or the 128 x 32 one under
    // FP_ATTN_V2_TILE=128x32, told apart by the launch's shared memory (Q
    // and two stages of K and V: (128 + 4 Bc) rows of 256 bytes; the kernels
    // have internal linkage, so the launch log cannot name them)
    if (c.kernel == FLASH && c.version == 2 && c.d == 128) {
        const char *tile = getenv("FP_ATTN_V2_TILE");
        const bool narrow = tile && strcmp(tile, "128x32") == 0;
        const size_t want = (size_t)(128 + 4 * (narrow ? 32 : 64)) * 128 * 2;
        bool seen = false;
        for (const fp_emu::LaunchRecord &r : fp_emu::launch_log()) seen |= r.block.x == 128 && r.smem == want;
        if (!seen) {
            printf("FAIL      %-28s %-11s no launch of 128 threads with %zu bytes of shared memory (the %s tile; "
                   "FP_ATTN_V2_TILE %s)\n",
                   c.name, kernel_name(c), want, narrow ? "128 x 32" : "128 x 64", tile ? tile : "unset");
            g_fail++;
        }
    }
    if (earlier_error != fp_last_error()) {
        printf("FAIL      %-28s %-11s a successful call changed fp_last_error to '%s' (fallback '%s')\n", c.name,
               kernel_name(c), fp_last_error(), k.fallback);
        g_fail++;
    }
}

// ---------------------------------------------------------------------------
// The materialized baseline's softmax, the page gather, the zero fill
// ---------------------------------------------------------------------------

// fp_attn_cuda_masked_softmax over scores [batch * hq, sq, sk] in dtype: per
// row, P = softmax(scale * s) over the row's kept keys, 0 elsewhere, and the
// lse; rows past a varlen sequence untouched. Score cells past a sequence's
// keys are NaN (the real baseline leaves them unwritten): never read.
static void softmax_case(const char *name, fp_dtype dt, int batch, int sq, int sk, int hq, int causal, int wl,
                         int wr, int ragged, int varlen, float scale, emu_rng &rng) {
    g_cases++;
    Case c = {name, ROWWISE, 0, 1, batch, sq, sk, hq, 1, 16, dt, causal, wl, wr, ragged, varlen, 0, 0, 1, scale};
    Data X;
    fp_attn_args a;
    if (!setup(c, rng, X, a)) {
        g_fail++;
        return;
    }
    const size_t es = elt_size(dt);
    const int64_t rows = (int64_t)batch * hq * sq;
    Buf s;
    s.init((size_t)(rows * sk) * es, 0xFF);
    for (int64_t r = 0; r < rows; ++r) {
        const int b = (int)(r / ((int64_t)sq * hq));
        const fp_attn_seq S = fp_attn_seq_host(&a, b);
        for (int j = 0; j < S.L; ++j) store(s.p, r * sk + j, dt, 6.0f * rng.next());
    }
    std::vector<unsigned char> s0(s.p, s.p + s.n);
    const double t0 = now_s();
    const fp_status st = fp_attn_cuda_masked_softmax(&a, s.p, 0);
    const double secs = now_s() - t0;
    size_t bad = 0;
    double worst = 0.0;
    const double u = unit_roundoff(dt);
    for (int64_t r = 0; r < rows && st == FP_OK; ++r) {
        const int qi = (int)(r % sq), b = (int)(r / ((int64_t)sq * hq));
        const fp_attn_seq S = fp_attn_seq_host(&a, b);
        if (qi >= S.sq) {  // untouched, lse too
            if (memcmp(s.p + (size_t)(r * sk) * es, s0.data() + (size_t)(r * sk) * es, (size_t)sk * es)) bad++;
            uint32_t lb;
            memcpy(&lb, X.lse.as<float>() + r, 4);
            if (lb != 0xFFFFFFFFu) bad++;
            continue;
        }
        int lo, hi;
        fp_attn_row_range(&a, S.sq, S.L, qi, &lo, &hi);
        double mx = -INFINITY, sum = 0.0;
        for (int j = lo; j <= hi; ++j) mx = fmax(mx, scale * load(s0.data(), r * sk + j, dt));
        for (int j = lo; j <= hi; ++j) sum += exp(scale * load(s0.data(), r * sk + j, dt) - mx);
        for (int j = 0; j < sk; ++j) {
            const double ref = (j >= lo && j <= hi) ? exp(scale * load(s0.data(), r * sk + j, dt) - mx) / sum : 0.0;
            const double got = load(s.p, r * sk + j, dt);
            const double tol = 1e-6 + (u + 2e-6) * fabs(ref);
            if (!(fabs(got - ref) <= tol)) {
                if (bad < 4) fprintf(stderr, "  %s: P[row %lld, %d] = %.7g, ref %.7g\n", name, (long long)r, j, got, ref);
                bad++;
            }
            if (!(fabs(got - ref) / tol <= worst)) worst = fabs(got - ref) / tol;
        }
        const double lr = lo <= hi ? mx + log(sum) : -INFINITY, lg = X.lse.as<float>()[r];
        if (!(std::isinf(lr) ? (std::isinf(lg) && lg < 0) : fabs(lg - lr) <= 2e-5 * (1 + fabs(lr)))) {
            if (bad < 4) fprintf(stderr, "  %s: lse[%lld] = %.9g, ref %.9g\n", name, (long long)r, lg, lr);
            bad++;
        }
    }
    const bool ok = st == FP_OK && !bad && s.guards_ok() && inputs_intact(X);
    if (st != FP_OK) fprintf(stderr, "  %s: %s (emulation: %s)\n", name, fp_last_error(), fp_emu::last_failure());
    printf("%-9s %-28s %-11s max err/tol %.3f%s  (%.2f s)\n", ok ? "ok" : "FAIL", name, "softmax", worst,
           s.guards_ok() ? "" : " [guards]", secs);
    if (!ok) g_fail++;
}

// fp_attn_cuda_gather_pages: the paged pools into dense [batch, sk, hkv, d]
// (exact; an entry out of range gives zero rows) and fp_attn_cuda_zero_rows.
static void gather_case(const char *name, fp_dtype dt, int batch, int sk, int hkv, int d, int page, int layout,
                        emu_rng &rng) {
    g_cases++;
    Case c = {name, ROWWISE, 0, 1, batch, 1, sk, hkv, hkv, d, dt, 0, -1, -1, 1, 0, page, layout, 0, 0};
    Data X;
    fp_attn_args a;
    if (!setup(c, rng, X, a)) {
        g_fail++;
        return;
    }
    const size_t es = elt_size(dt);
    const size_t n = (size_t)batch * sk * hkv * d;
    Buf kd, vd;
    kd.init(n * es, 0xFF);
    vd.init(n * es, 0xFF);
    const fp_status st = fp_attn_cuda_gather_pages(&a, kd.p, vd.p, 0);
    size_t bad = 0;
    for (int b = 0; b < batch && st == FP_OK; ++b)
        for (int j = 0; j < sk; ++j) {
            const int pg = X.bt[(size_t)b * X.bt_stride + j / page];
            const bool in = pg >= 0 && pg < X.num_pages;
            for (int h = 0; h < hkv; ++h)
                for (int x = 0; x < d; ++x) {
                    const size_t di = (((size_t)b * sk + j) * hkv + h) * d + x;
                    const int64_t si = (int64_t)pg * X.sk_.bs + (int64_t)(j % page) * X.sk_.ss + (int64_t)h * X.sk_.hs + x;
                    for (int kv = 0; kv < 2; ++kv) {
                        const unsigned char *got = (kv ? vd.p : kd.p) + di * es;
                        const unsigned char *src = (kv ? X.v.p : X.k.p) + (size_t)si * es;
                        static const unsigned char zero[4] = {0, 0, 0, 0};
                        if (memcmp(got, in ? src : zero, es)) bad++;
                    }
                }
        }
    // zero_rows: sequence 1's rows of O (all heads), nothing else
    const int64_t o0 = X.so_.bs;
    const fp_status st2 = fp_attn_cuda_zero_rows(&a, o0, 1, 0);
    for (int64_t e = 0; e < X.so_.span && st2 == FP_OK; ++e) {
        const int64_t r = e - o0;
        bool zeroed = false;
        for (int h = 0; h < hkv && r >= 0; ++h)
            if (r >= h * X.so_.hs && r < h * X.so_.hs + d) zeroed = true;
        for (size_t k = 0; k < es; ++k)
            if (X.o.p[(size_t)e * es + k] != (zeroed ? 0 : 0xFF)) {
                bad++;
                break;
            }
    }
    const bool ok = st == FP_OK && st2 == FP_OK && !bad && kd.guards_ok() && vd.guards_ok() && inputs_intact(X);
    if (st != FP_OK || st2 != FP_OK) fprintf(stderr, "  %s: %s (emulation: %s)\n", name, fp_last_error(), fp_emu::last_failure());
    printf("%-9s %-28s %-11s %zu wrong\n", ok ? "ok" : "FAIL", name, "gather/zero", bad);
    if (!ok) g_fail++;
}

// Refusals: the status, nothing launched, nothing written.
static void refusal(const char *name, int version, int splits, fp_dtype dt, int d, fp_status want, emu_rng &rng) {
    g_cases++;
    Case c = {name, FLASH, version, splits, 1, 5, 9, 2, 1, d, dt, 0, -1, -1, 0, 0, 0, 0, 1, 0};
    Data X;
    fp_attn_args a;
    if (!setup(c, rng, X, a)) {
        g_fail++;
        return;
    }
    const long before = fp_emu::launches();
    const fp_status st = fp_attn_cuda_flash_version(&a, version, splits, 0);
    bool untouched = true;
    for (size_t i = 0; i < X.o.n; ++i) untouched &= X.o.p[i] == 0xFF;
    for (size_t i = 0; i < X.lse.n; ++i) untouched &= X.lse.p[i] == 0xFF;
    const bool ok = st == want && fp_emu::launches() == before && untouched && inputs_intact(X) && *fp_last_error();
    printf("%-9s %-28s %-11s %s: %s\n", ok ? "ok" : "FAIL", name, "refusal", fp_status_string(st), fp_last_error());
    if (!ok) g_fail++;
}

int main() {
    // An A100 (sm_80): 108 SMs, 163 KiB of opt-in shared memory per block.
    fp_emu::set_device(fp_emu::DeviceProfile{8, 0, 108, 1024, 2048, 48 * 1024, 163 * 1024, 164 * 1024, 65536});
    emu_rng rng = {0x9E3779B97F4A7C15ULL};
    const fp_dtype BF = FP_BF16, F16 = FP_F16, F32 = FP_F32;
    const int NO = -1;
    // clang-format off
    static const Case cases[] = {
        // name                        kernel  ver spl  b  sq   sk   hq hkv  d    dt  causal wl  wr rag var page lay lse scale
        // every head dim of v1, both dtypes: prefill with edges (rows and keys
        // not tile multiples), GQA, causal, padded and head-major strides
        {"v1_d32_bf16_gqa2",          FLASH,    1, 1,   1, 70,  100, 2, 1,  32, BF,  0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v1_d32_f16_causal_bhsd",    FLASH,    1, 1,   2, 45,  45,  2, 2,  32, F16, 1, NO, NO, 0, 0,  0,  2,  1, 0},
        {"v1_d64_f16_gqa2",           FLASH,    1, 1,   1, 70,  100, 2, 1,  64, F16, 0, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v1_d64_bf16_causal",        FLASH,    1, 1,   1, 90,  90,  2, 2,  64, BF,  1, NO, NO, 0, 0,  0,  0,  1, 1.0f},
        {"v1_d96_bf16_gqa2",          FLASH,    1, 1,   1, 70,  100, 2, 1,  96, BF,  0, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v1_d96_f16_causal_bhsd",    FLASH,    1, 1,   1, 66,  80,  2, 2,  96, F16, 1, NO, NO, 0, 0,  0,  2,  1, 0},
        {"v1_d128_f16_gqa2",          FLASH,    1, 1,   1, 70,  100, 2, 1, 128, F16, 0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v1_d128_bf16_causal_pad",   FLASH,    1, 1,   1, 80,  130, 2, 2, 128, BF,  1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v1_d256_bf16_gqa2",         FLASH,    1, 1,   1, 40,  70,  2, 1, 256, BF,  0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v1_d256_f16_causal_bhsd",   FLASH,    1, 1,   1, 50,  50,  1, 1, 256, F16, 1, NO, NO, 0, 0,  0,  2,  1, 0},
        // v2 (128 rows per CTA, head dims 64 / 128)
        {"v2_d64_bf16_gqa2",          FLASH,    2, 1,   1, 70,  100, 2, 1,  64, BF,  0, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v2_d64_f16_causal",         FLASH,    2, 1,   1, 150, 150, 1, 1,  64, F16, 1, NO, NO, 0, 0,  0,  0,  1, 1.0f},
        {"v2_d128_f16_gqa2",          FLASH,    2, 1,   1, 70,  70,  2, 1, 128, F16, 0, NO, NO, 0, 0,  0,  2,  1, 0},
        {"v2_d128_bf16_causal",       FLASH,    2, 1,   1, 60,  100, 2, 2, 128, BF,  1, NO, NO, 0, 0,  0,  1,  1, 0},
        // many key tiles (the double buffers cycle several times); GQA groups
        // of 3 and 5 (a query position's heads split across query tiles)
        {"v1_long_kv_d64",            FLASH,    1, 1,   1, 64,  600, 1, 1,  64, BF,  0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v2_long_kv_d128_causal",    FLASH,    2, 1,   1, 40,  330, 1, 1, 128, F16, 1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v1_long_kv_d256_causal",    FLASH,    1, 1,   1, 33,  260, 1, 1, 256, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v1_gqa3_causal_f16",        FLASH,    1, 1,   1, 40,  70,  6, 2,  64, F16, 1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v2_gqa3_decode_rag_s2",     FLASH,    2, 2,   3, 2,   150, 6, 2, 128, BF,  1, NO, NO, 1, 0,  0,  0,  1, 0},
        {"v1_gqa5_prefill_bhsd",      FLASH,    1, 1,   1, 30,  50, 10, 2,  32, BF,  0, NO, NO, 0, 0,  0,  2,  1, 0},
        {"v2_gqa5_causal_d64",        FLASH,    2, 1,   1, 30,  90,  5, 1,  64, F16, 1, NO, NO, 0, 0,  0,  0,  1, 0},
        // sliding windows (both sides, with causal, q > k, windows past every key)
        {"v1_win_30_5_f16",           FLASH,    1, 1,   1, 100, 160, 1, 1,  64, F16, 0, 30, 5,  0, 0,  0,  0,  1, 0},
        {"v1_win_causal_40_bf16",     FLASH,    1, 1,   1, 90,  150, 2, 1, 128, BF,  1, 40, NO, 0, 0,  0,  1,  1, 1.0f},
        {"v2_win_20_20_bf16",         FLASH,    2, 1,   1, 130, 130, 1, 1,  64, BF,  0, 20, 20, 0, 0,  0,  0,  1, 0},
        {"v2_win_causal_50_f16",      FLASH,    2, 1,   1, 70,  140, 2, 2, 128, F16, 1, 50, NO, 0, 0,  0,  0,  1, 0},
        // v2 at head_dim 128 (128 x 64 tiles, kTightRegs' relative mask):
        // both-sided windows (rows whose keys lie inside one tile, rows that
        // keep none past the last key), paged, a scale
        {"v2_win_30_5_d128_bf16",     FLASH,    2, 1,   1, 150, 200, 1, 1, 128, BF,  0, 30, 5,  0, 0,  0,  1,  1, 0},
        {"v2_win_0_0_d128_s2",        FLASH,    2, 2,   1, 70,  150, 2, 2, 128, F16, 0, 0,  0,  0, 0,  0,  0,  1, 2.0f},
        {"v2_paged16_d128_rag",       FLASH,    2, 1,   3, 40,  140, 4, 2, 128, BF,  1, NO, NO, 1, 0, 16,  0,  1, 0},
        {"v1_win_right_only_d32",     FLASH,    1, 1,   1, 64,  64,  2, 2,  32, BF,  0, NO, 3,  0, 0,  0,  0,  1, 0},
        {"v1_win_intmax_d96",         FLASH,    1, 1,   1, 40,  90,  2, 2,  96, F16, 0, 2147483647, 2147483647, 0, 0, 0, 0, 1, 0},
        {"v1_win_reach_edge",         FLASH,    1, 2,   1, 37,  150, 2, 2,  64, F16, 0, 148, 35, 0, 0,  0,  0,  1, 0},
        {"v1_win_d256_split",         FLASH,    1, 3,   1, 20,  120, 2, 1, 256, BF,  0, 60, 0,  0, 0,  0,  1,  1, 0},
        // causal with seqlen_q > seqlen_k: the first rows keep no key (O = 0, lse = -inf)
        {"v1_causal_q>k_f16",         FLASH,    1, 1,   1, 100, 40,  2, 2,  64, F16, 1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v2_causal_q>k_bf16",        FLASH,    2, 1,   1, 140, 70,  1, 1, 128, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        // chunked prefill (seqlen_q < seqlen_k, causal: bottom-right)
        {"v1_chunk_prefill_bf16",     FLASH,    1, 1,   2, 20,  150, 4, 2,  64, BF,  1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v2_chunk_prefill_f16",      FLASH,    2, 1,   1, 24,  140, 4, 1, 128, F16, 1, NO, NO, 0, 0,  0,  0,  1, 0},
        // decode (seqlen_q 1): MQA, GQA, ragged caches (incl. an empty one), split-KV
        {"v1_decode_mqa8_d128",       FLASH,    1, 1,   2, 1,   200, 8, 1, 128, BF,  0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v1_decode_mqa8_split3",     FLASH,    1, 3,   2, 1,   200, 8, 1, 128, F16, 0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v1_decode_gqa4_rag_s4",     FLASH,    1, 4,   4, 1,   300, 8, 2,  64, BF,  1, NO, NO, 1, 0,  0,  1,  1, 0},
        {"v1_decode_d256_rag_s2",     FLASH,    1, 2,   4, 2,   100, 4, 2, 256, F16, 1, NO, NO, 1, 0,  0,  0,  1, 0},
        {"v1_decode_d96_s5_nolse",    FLASH,    1, 5,   1, 3,   330, 6, 2,  96, BF,  1, NO, NO, 0, 0,  0,  2,  0, 0},
        {"v2_decode_gqa8_rag_s3",     FLASH,    2, 3,   4, 2,   250, 8, 1,  64, F16, 1, NO, NO, 1, 0,  0,  0,  1, 0},
        {"v2_decode_d128_s2",         FLASH,    2, 2,   1, 1,   130, 4, 1, 128, BF,  0, NO, NO, 0, 0,  0,  1,  1, 0},
        // v6, the decode kernel (16 rows per CTA, warps split each 64-key
        // tile, a ring of 2-4 K / V tiles): every head dim and dtype; decode
        // with GQA / MQA, ragged caches, splits (fused combine: the counters
        // come from no context here, so the separate combine kernel), more
        // splits than tiles; many tiles (the ring wraps); several query
        // tiles (rows > 16), causal chunks, windows, paged, varlen
        {"v6_decode_gqa4_d128_bf16",  FLASH,    6, 1,   2, 1,   300, 8, 2, 128, BF,  0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v6_decode_mqa8_d128_s3",    FLASH,    6, 3,   2, 1,   400, 8, 1, 128, F16, 0, NO, NO, 1, 0,  0,  1,  1, 0},
        {"v6_decode_d32_rag_s2",      FLASH,    6, 2,   3, 1,   150, 4, 2,  32, F16, 1, NO, NO, 1, 0,  0,  0,  1, 0},
        {"v6_decode_d64_s4_nolse",    FLASH,    6, 4,   2, 1,   500, 8, 2,  64, BF,  0, NO, NO, 0, 0,  0,  2,  0, 0},
        {"v6_decode_d96_bhsd",        FLASH,    6, 1,   1, 1,   200, 6, 2,  96, F16, 0, NO, NO, 0, 0,  0,  2,  1, 0},
        {"v6_decode_d256_s2",         FLASH,    6, 2,   2, 1,   260, 4, 1, 256, BF,  0, NO, NO, 1, 0,  0,  1,  1, 0},
        {"v6_long_kv_d64_ring",       FLASH,    6, 1,   1, 1,   900, 4, 1,  64, F16, 0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v6_long_kv_d128_ring",      FLASH,    6, 1,   1, 2,   700, 4, 2, 128, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v6_split8_of_3tiles",       FLASH,    6, 8,   2, 1,   150, 2, 1,  64, BF,  0, NO, NO, 1, 0,  0,  0,  1, 0},
        {"v6_gqa16_two_qtiles",       FLASH,    6, 2,   1, 2,   200, 16, 1, 128, F16, 1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v6_prefill_causal_gqa3",    FLASH,    6, 1,   1, 30,  70,  6, 2,  64, BF,  1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v6_chunk_prefill_d32",      FLASH,    6, 1,   2, 9,   150, 4, 2,  32, F16, 1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v6_win_causal_40_d128",     FLASH,    6, 2,   1, 3,   300, 4, 1, 128, BF,  1, 40, NO, 0, 0,  0,  0,  1, 1.0f},
        {"v6_win_30_5_d96",           FLASH,    6, 1,   1, 20,  90,  2, 2,  96, BF,  0, 30, 5,  0, 0,  0,  1,  1, 0},
        {"v6_causal_q>k",             FLASH,    6, 1,   1, 40,  20,  2, 2,  64, F16, 1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v6_paged16_decode_s3",      FLASH,    6, 3,   3, 1,   150, 8, 2, 128, BF,  0, NO, NO, 1, 0, 16,  0,  1, 0},
        {"v6_paged40_d64_rag",        FLASH,    6, 1,   2, 4,   100, 2, 1,  64, F16, 1, NO, NO, 1, 0, 40,  1,  1, 0},
        {"v6_paged1_d32",             FLASH,    6, 1,   2, 1,   20,  2, 1,  32, F16, 0, NO, NO, 1, 0,  1,  0,  1, 0},
        {"v6_varlen_split2_d128",     FLASH,    6, 2,   4, 5,   100, 4, 2, 128, BF,  0, NO, NO, 0, 1,  0,  0,  1, 0},
        {"v6_varlen_d256_causal",     FLASH,    6, 1,   4, 6,   40,  2, 1, 256, F16, 1, NO, NO, 0, 1,  0,  1,  1, 0},
        {"v6_1x1_mqa",                FLASH,    6, 1,   2, 1,   1,   4, 1,  64, F16, 0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v6_1x1_s2",                 FLASH,    6, 2,   1, 1,   1,   2, 2, 128, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v6_scale4_f16",             FLASH,    6, 1,   1, 2,   200, 4, 1, 128, F16, 0, NO, NO, 0, 0,  0,  0,  1, 4.0f},
        // v7 (v1's body over 8 warps, 128-row tiles): every head dim, prefill
        // with edges, causal, GQA groups across tiles, windows, splits,
        // paged, varlen, decode
        {"v7_d32_bf16_gqa2",          FLASH,    7, 1,   1, 70,  100, 2, 1,  32, BF,  0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v7_d64_f16_causal",         FLASH,    7, 1,   1, 150, 150, 1, 1,  64, F16, 1, NO, NO, 0, 0,  0,  0,  1, 1.0f},
        {"v7_d96_bf16_causal_bhsd",   FLASH,    7, 1,   1, 66,  80,  2, 2,  96, BF,  1, NO, NO, 0, 0,  0,  2,  1, 0},
        {"v7_d128_bf16_long_causal",  FLASH,    7, 1,   1, 140, 330, 2, 1, 128, BF,  1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"v7_d256_f16_gqa2",          FLASH,    7, 1,   1, 40,  70,  2, 1, 256, F16, 0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v7_gqa5_causal_d64",        FLASH,    7, 1,   1, 30,  90,  5, 1,  64, F16, 1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v7_win_causal_50_f16",      FLASH,    7, 1,   1, 70,  140, 2, 2, 128, F16, 1, 50, NO, 0, 0,  0,  0,  1, 0},
        {"v7_prefill_split3_win",     FLASH,    7, 3,   1, 40,  200, 2, 1,  64, BF,  1, 90, NO, 0, 0,  0,  0,  1, 0},
        {"v7_decode_gqa8_rag_s3",     FLASH,    7, 3,   4, 2,   250, 8, 1,  64, F16, 1, NO, NO, 1, 0,  0,  0,  1, 0},
        {"v7_paged16_gqa_rag",        FLASH,    7, 1,   3, 4,   140, 8, 2, 128, F16, 1, NO, NO, 1, 0, 16,  1,  1, 0},
        {"v7_varlen_d128_split2",     FLASH,    7, 2,   4, 5,   100, 4, 2, 128, BF,  0, NO, NO, 0, 1,  0,  0,  1, 0},
        {"v7_causal_q>k_bf16",        FLASH,    7, 1,   1, 140, 70,  1, 1, 128, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        // more splits than key tiles (empty splits), a ragged cache
        {"v1_split8_of_3tiles",       FLASH,    1, 8,   2, 4,   150, 2, 1,  32, F16, 0, NO, NO, 1, 0,  0,  0,  1, 0},
        {"v1_prefill_split2_causal",  FLASH,    1, 2,   1, 70,  200, 2, 2,  64, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v2_prefill_split3_win",     FLASH,    2, 3,   1, 40,  200, 2, 1,  64, BF,  1, 90, NO, 0, 0,  0,  0,  1, 0},
        // ragged caches with prefill-sized queries
        {"v1_ragged_prefill_f16",     FLASH,    1, 1,   4, 30,  100, 2, 1, 128, F16, 1, NO, NO, 1, 0,  0,  1,  1, 0},
        // varlen (cu_seqlens; a sequence without queries, one without keys)
        {"v1_varlen_bf16",            FLASH,    1, 1,   4, 70,  90,  2, 2,  64, BF,  0, NO, NO, 0, 1,  0,  0,  1, 0},
        {"v1_varlen_causal_gqa_f16",  FLASH,    1, 1,   4, 50,  80,  4, 2, 128, F16, 1, NO, NO, 0, 1,  0,  1,  1, 0},
        {"v1_varlen_d32_split3_win",  FLASH,    1, 3,   4, 9,   140, 4, 1,  32, BF,  1, 50, NO, 0, 1,  0,  0,  1, 0},
        {"v2_varlen_f16",             FLASH,    2, 1,   4, 60,  70,  2, 1,  64, F16, 1, NO, NO, 0, 1,  0,  1,  1, 0},
        {"v2_varlen_d128_split2",     FLASH,    2, 2,   4, 5,   100, 4, 2, 128, BF,  0, NO, NO, 0, 1,  0,  0,  1, 0},
        {"v1_varlen_d256",            FLASH,    1, 1,   4, 20,  40,  2, 1, 256, F16, 1, NO, NO, 0, 1,  0,  0,  1, 0},
        // batch > 65535: the launcher runs it as several launches (grid.z)
        {"v1_varlen_batch65537_s2",   FLASH,    1, 2, 65537, 1, 40, 1, 1,  32, F16, 0, NO, NO, 0, 2,  0,  0,  1, 0},
        // paged KV (shuffled pages; table entries past the keys out of range)
        {"v1_paged16_decode_s3",      FLASH,    1, 3,   3, 1,   150, 8, 2, 128, BF,  0, NO, NO, 1, 0, 16,  0,  1, 0},
        {"v1_paged40_prefill_causal", FLASH,    1, 1,   2, 50,  100, 2, 1,  64, F16, 1, NO, NO, 0, 0, 40,  1,  1, 0},
        {"v1_paged24_d96_rag",        FLASH,    1, 1,   2, 8,   90,  2, 2,  96, BF,  0, NO, NO, 1, 0, 24,  2,  1, 0},
        {"v1_paged64_d256_win",       FLASH,    1, 2,   2, 3,   130, 2, 1, 256, F16, 1, 70, NO, 1, 0, 64,  0,  1, 0},
        {"v1_paged1_d32",             FLASH,    1, 1,   2, 3,   20,  2, 1,  32, F16, 0, NO, NO, 1, 0,  1,  0,  1, 0},
        {"v2_paged16_gqa_rag",        FLASH,    2, 1,   3, 4,   140, 8, 2,  64, F16, 1, NO, NO, 1, 0, 16,  1,  1, 0},
        {"v2_paged32_d128_s2",        FLASH,    2, 2,   2, 2,   100, 4, 1, 128, BF,  0, NO, NO, 0, 0, 32,  0,  1, 0},
        // tiny and degenerate: one query and one key, the diagonal key only
        // (causal with window_left 0), 1024 splits (the combine's limit)
        {"v1_1x1_mqa",                FLASH,    1, 1,   2, 1,   1,   4, 1,  64, F16, 0, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v2_1x1_s2",                 FLASH,    2, 2,   1, 1,   1,   2, 2, 128, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"v1_diagonal_only",          FLASH,    1, 1,   1, 70,  90,  2, 1,  32, BF,  1, 0,  NO, 0, 0,  0,  0,  1, 0},
        {"v2_diagonal_only_q>k",      FLASH,    2, 1,   1, 90,  70,  1, 1,  64, F16, 1, 0,  NO, 0, 0,  0,  0,  1, 0},
        {"v1_splits1024",             FLASH,    1, 1024, 1, 1,  70,  2, 1,  64, BF,  0, NO, NO, 0, 0,  0,  0,  1, 0},
        // large scale: scores of hundreds (exp2 arguments far below -126 flush to 0)
        {"v1_scale4_f16",             FLASH,    1, 1,   1, 20,  100, 2, 2,  64, F16, 0, NO, NO, 0, 0,  0,  0,  1, 4.0f},
        // the library's own dispatch: split count from the grid and SM count,
        // a preferred v2, a Hopper version falling back to v1 (no sm_90a here)
        {"auto_decode_sm108",         FLASH_AUTO, 0, 108, 2, 1, 400, 4, 1, 128, BF,  0, NO, NO, 1, 0,  0,  0,  1, 0},
        {"auto_v2_decode_sm108",      FLASH_AUTO, 2, 108, 1, 1, 300, 4, 2,  64, F16, 0, NO, NO, 0, 0, 16,  0,  1, 0},
        {"auto_decode_4096_keys",     FLASH_AUTO, 0, 108, 1, 1, 4096, 2, 1,  64, F16, 1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"auto_v2_d96_falls_back_v1", FLASH_AUTO, 2, 108, 1, 20, 100, 2, 1,  96, F16, 1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"auto_v1_prefill_varlen",    FLASH_AUTO, 1, 108, 4, 30, 70,  2, 2,  64, BF,  1, NO, NO, 0, 1,  0,  0,  1, 0},
        {"auto_v6_decode_sm108",      FLASH_AUTO, 6, 108, 2, 1, 700, 8, 2, 128, BF,  0, NO, NO, 1, 0,  0,  0,  1, 0},
        {"auto_v6_paged_sm108",       FLASH_AUTO, 6, 108, 1, 1, 300, 4, 1,  64, F16, 0, NO, NO, 0, 0, 16,  0,  1, 0},
        {"auto_v7_prefill_sm108",     FLASH_AUTO, 7, 108, 1, 130, 200, 2, 1, 128, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"auto_v6_prefill_falls_back",FLASH_AUTO, 6, 108, 1, 40, 60, 4, 2,  64, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"auto_v3_fallback_prefill",  FLASH_AUTO, 3, 108, 1, 30, 60, 2, 2,  64, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        // the row-wise kernel: f32, head dims the flash kernel lacks, every feature
        {"rowwise_f32_d80_causal",    ROWWISE,  0, 1,   2, 20,  50,  4, 2,  80, F32, 1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"rowwise_f16_d256_win",      ROWWISE,  0, 1,   1, 9,   70,  2, 1, 256, F16, 0, 20, 4,  0, 0,  0,  2,  1, 0},
        {"rowwise_bf16_d8_paged_rag", ROWWISE,  0, 1,   3, 2,   45,  3, 1,   8, BF,  1, NO, NO, 1, 0,  8,  0,  1, 0},
        {"rowwise_f32_varlen_q>k",    ROWWISE,  0, 1,   4, 12,  10,  2, 2,  40, F32, 1, NO, NO, 0, 1,  0,  1,  1, 0},
        {"rowwise_bf16_d64_nolse",    ROWWISE,  0, 1,   1, 5,   33,  2, 2,  64, BF,  0, NO, NO, 0, 0,  0,  1,  0, 1.0f},
    };
    // clang-format on
    const double t0 = now_s();
    for (const Case &c : cases) run_case(c, rng);
    // NaN / +inf scores from the data propagate (poison_keys): prefill with
    // several key tiles, split-KV decode (a NaN split's lse), paged, row-wise
    // clang-format off
    static const Case nonfinite[] = {
        {"nonfinite_v1_causal",       FLASH,    1, 1,   1, 120, 200, 2, 1,  64, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"nonfinite_v2_f16",          FLASH,    2, 1,   1, 30,  150, 2, 2, 128, F16, 0, NO, NO, 0, 0,  0,  1,  1, 0},
        {"nonfinite_v1_decode_s4",    FLASH,    1, 4,   3, 1,   300, 8, 1,  64, BF,  0, NO, NO, 1, 0,  0,  0,  1, 0},
        {"nonfinite_v6_decode_s3",    FLASH,    6, 3,   3, 1,   300, 8, 2, 128, BF,  0, NO, NO, 1, 0,  0,  0,  1, 0},
        {"nonfinite_v6_prefill",      FLASH,    6, 1,   1, 20,  90,  2, 1,  64, F16, 1, NO, NO, 0, 0,  0,  1,  1, 0},
        {"nonfinite_v7_causal",       FLASH,    7, 1,   1, 120, 200, 2, 1,  64, BF,  1, NO, NO, 0, 0,  0,  0,  1, 0},
        {"nonfinite_v1_paged_s2",     FLASH,    1, 2,   2, 3,   150, 4, 2,  64, F16, 1, NO, NO, 0, 0, 16,  0,  1, 0},
        {"nonfinite_rowwise_f32",     ROWWISE,  0, 1,   1, 12,  140, 4, 2,  80, F32, 1, NO, NO, 0, 0,  0,  0,  1, 0},
    };
    // clang-format on
    for (const Case &c : nonfinite) run_case(c, rng, 1);
    // The flash kernels' tiles (XOR-swizzled at head_dim 64 / 128 / 256,
    // padded at 32 / 96) must keep every ldmatrix phase conflict-free.
    g_cases++;
    printf("%-9s ldmatrix phases with shared-memory bank conflicts: %ld\n", fp_emu::g_ldmatrix_conflicts ? "FAIL" : "ok",
           fp_emu::g_ldmatrix_conflicts);
    if (fp_emu::g_ldmatrix_conflicts) g_fail++;

    softmax_case("softmax_f32_causal", F32, 2, 7, 20, 2, 1, NO, NO, 0, 0, 1.0f, rng);
    softmax_case("softmax_f16_window_rag", F16, 4, 5, 40, 2, 0, 10, 3, 1, 0, 0.5f, rng);
    softmax_case("softmax_bf16_varlen", BF, 4, 6, 30, 3, 1, NO, NO, 0, 1, 1.0f, rng);
    softmax_case("softmax_f16_long_row", F16, 1, 2, 600, 1, 0, NO, NO, 0, 0, 1.0f, rng);

    gather_case("gather_f16_page16", F16, 2, 40, 2, 64, 16, 0, rng);
    gather_case("gather_bf16_page7_padded", BF, 3, 30, 1, 32, 7, 1, rng);
    gather_case("gather_f32_page8_bhsd", F32, 2, 20, 3, 16, 8, 2, rng);

    refusal("refuse_head_dim_80", 1, 1, BF, 80, FP_ERR_UNSUPPORTED, rng);
    refusal("refuse_v2_head_dim_96", 2, 1, F16, 96, FP_ERR_UNSUPPORTED, rng);
    refusal("refuse_f32", 1, 1, F32, 64, FP_ERR_UNSUPPORTED, rng);
    refusal("refuse_splits_0", 1, 0, BF, 64, FP_ERR_INVALID_ARGUMENT, rng);
    refusal("refuse_v2_splits_1025", 2, 1025, BF, 64, FP_ERR_INVALID_ARGUMENT, rng);
    refusal("refuse_version_11", 11, 1, BF, 64, FP_ERR_INVALID_ARGUMENT, rng);
    refusal("refuse_v7_head_dim_80", 7, 1, F16, 80, FP_ERR_UNSUPPORTED, rng);
    refusal("refuse_v6_head_dim_80", 6, 1, BF, 80, FP_ERR_UNSUPPORTED, rng);
    refusal("refuse_v6_splits_0", 6, 0, F16, 64, FP_ERR_INVALID_ARGUMENT, rng);
    refusal("refuse_v3_without_sm90a", 3, 1, BF, 64, FP_ERR_UNSUPPORTED, rng);
    refusal("refuse_v8_without_sm90a", 8, 1, BF, 64, FP_ERR_UNSUPPORTED, rng);
    refusal("refuse_v9_without_sm90a", 9, 1, BF, 64, FP_ERR_UNSUPPORTED, rng);
    refusal("refuse_v10_without_sm90a", 10, 1, BF, 64, FP_ERR_UNSUPPORTED, rng);

    printf("%d cases, %d failed, %ld launches, %.1f s\n", g_cases, g_fail, fp_emu::launches(), now_s() - t0);
    return g_fail ? 1 : 0;
}
