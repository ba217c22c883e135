// Shared pieces of the two CPU emulation tests of the flash kernels
// (test_attention_flash_emu.cpp: v1 / v2 on mma.sync; test_attention_sm90_emu.cpp:
// v3 / v4 on wgmma, v5's consumer math; test_attention_tma_emu.cpp uses the
// random generator only): the f16 / bf16 element type, the emulation's arguments,
// the split-KV combine and the grid loop around a test's own CTA emulation,
// and one case's host data (lengths, ragged / varlen arrays, random inputs,
// poisoned outputs, fp_attention_params) with its check against
// fp_attn_reference. Each test keeps its own CTA emulation, hardware model,
// cases and random seed; this header holds only what both do identically.
#ifndef ATTN_EMU_UTIL_H
#define ATTN_EMU_UTIL_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "attention/attention_flash_layout.h"
#include "attention/attention_internal.h"

typedef uint16_t h16;

static inline float to_f(h16 x, fp_dtype dt) { return dt == FP_F16 ? fp_f16_to_f32(x) : fp_bf16_to_f32(x); }
static inline h16 from_f(float x, fp_dtype dt) { return dt == FP_F16 ? fp_f32_to_f16(x) : fp_f32_to_bf16(x); }

struct emu_args {
    fp_attn_args a; // host pointers (h16 data)
    int num_splits;
    int wl, wr;     // windows as the launchers pass them (fp_flash::clamp_window)
    std::vector<float> o_part, lse_part;
};

// The split-KV combine (attention_split_combine): per row, the splits'
// partial O weighted by exp(lse_s - lse), written to O in the dtype.
template <int D> static void emulate_combine(emu_args &E) {
    const fp_attn_args &a = E.a;
    const int64_t rows_total = (int64_t)a.batch * a.heads_q * a.seqlen_q;
    for (int64_t row = 0; row < rows_total; ++row) {
        const int qi = (int)(row % a.seqlen_q), h = (int)(row / a.seqlen_q % a.heads_q);
        const int b = (int)(row / ((int64_t)a.seqlen_q * a.heads_q));
        const fp_flash::seq_view SV = fp_flash::make_seq(b, a.seqlen_q, a.seqlen_k, a.seqlens_k, a.cu_q, a.cu_k,
                                                         a.q_bs, a.q_ss, a.k_bs, a.k_ss, a.v_bs, a.v_ss, a.o_bs,
                                                         a.o_ss);
        if (qi >= SV.sq) continue;
        float mx = -INFINITY;
        for (int s = 0; s < E.num_splits; ++s) mx = fmaxf(mx, E.lse_part[s * rows_total + row]);
        float sum = 0.0f;
        if (mx != -INFINITY)
            for (int s = 0; s < E.num_splits; ++s) sum += expf(E.lse_part[s * rows_total + row] - mx);
        const float lse = mx == -INFINITY ? -INFINITY : mx + logf(sum);
        h16 *o = (h16 *)a.o + SV.o0 + (int64_t)qi * a.o_ss + (int64_t)h * a.o_hs;
        for (int col = 0; col < D; ++col) {
            float acc = 0.0f;
            if (mx != -INFINITY)
                for (int s = 0; s < E.num_splits; ++s) {
                    const float ls = E.lse_part[s * rows_total + row];
                    if (ls != -INFINITY) acc += expf(ls - lse) * E.o_part[(s * rows_total + row) * D + col];
                }
            o[col] = from_f(acc, a.dtype);
        }
        if (a.lse) a.lse[row] = lse;
    }
}

// The launch: windows clamped as the launchers clamp them, split partials
// NaN-poisoned, every CTA (blockIdx x = (m_tile, split), y = hk, z = b) of
// Br query rows through the test's own emulation `cta`, then the combine.
typedef void (*emu_cta_fn)(emu_args &E, int bx, int hk, int b);
template <int D> static void emulate_grid(emu_args &E, int Br, emu_cta_fn cta) {
    const int rows = E.a.seqlen_q * E.a.group;
    const int m_tiles = (rows + Br - 1) / Br;
    E.wl = fp_flash::clamp_window(E.a.window_left, E.a.seqlen_k);
    E.wr = fp_flash::clamp_window(E.a.window_right, E.a.seqlen_q);
    if (E.num_splits > 1) {
        const size_t n = (size_t)E.num_splits * E.a.batch * E.a.heads_q * E.a.seqlen_q;
        E.o_part.assign(n * D, NAN);
        E.lse_part.assign(n, NAN);
    }
    for (int b = 0; b < E.a.batch; ++b)
        for (int hk = 0; hk < E.a.heads_kv; ++hk)
            for (int bx = 0; bx < m_tiles * E.num_splits; ++bx) cta(E, bx, hk, b);
    if (E.num_splits > 1) emulate_combine<D>(E);
}

struct emu_case {
    const char *name;
    int batch, sq, sk, hq, hkv, d;
    fp_dtype dtype;
    int causal, wl, wr, ragged, splits, pad; // pad: extra elements per seq row (strided)
    int varlen; // packed sequences of lengths cycling through (sq|sk, 5, 0, 17) via cu_seqlens;
                // 2: the full sequences hold 40 keys more than seqlen_k (clipped: rows the
                // kernels must not read into the result); total_k given (the packed rows)
    int page = 0; // paged KV: page_size (0: dense K / V): a pool of shuffled pages, K / V rows no
                // sequence owns NaN, table entries past a sequence's pages pointing at a NaN page
                // or out of range, sequence 1 sharing sequence 0's first page where both fill it
};

// xorshift64 in [-1, 1), never 0; each test seeds its own.
// next_u32: the high half of the next state (test_attention_tma_emu's
// interleaving choices).
struct emu_rng {
    uint64_t state;
    uint64_t step() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        return state;
    }
    float next() {
        const float v = (float)((step() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
        return v == 0.0f ? 1e-3f : v;
    }
    uint32_t next_u32() { return (uint32_t)(step() >> 32); }
};

// One case's host tensors. O starts as 0xFFFF (NaN) and lse as NaN: what
// the emulation does not write must stay so.
struct emu_data {
    int64_t q_ss, kv_ss, o_ss, rows_q, rows_k;
    std::vector<int32_t> cu_q, cu_k, seqlens;
    std::vector<int32_t> bt; // paged: [batch, bt_stride]
    int bt_stride = 0, num_pages = 0;
    int64_t page_stride = 0;
    std::vector<h16> q, k, v, o;
    std::vector<float> lse;
};

// Lengths, random Q, K, V (drawn in that order from rng), params, and
// fp_attn_check into E.a (pointers into X, which must outlive E). Prints
// and returns false when the params are refused.
static inline bool emu_setup(const emu_case &c, emu_rng &rng, emu_data &X, emu_args &E) {
    const int64_t d = c.d;
    X.q_ss = c.hq * d + c.pad;
    X.kv_ss = c.hkv * d + c.pad;
    X.o_ss = c.hq * d + c.pad;
    // per-sequence lengths and the row where each starts (varlen: packed)
    X.cu_q.assign(c.batch + 1, 0);
    X.cu_k.assign(c.batch + 1, 0);
    X.seqlens.assign(c.batch, 0);
    for (int b = 0; b < c.batch; ++b) {
        static const int pat[4] = {-1, 5, 0, 17}; /* -1: full */
        const int nq = c.varlen ? (pat[b % 4] < 0 ? c.sq : (pat[b % 4] > c.sq ? c.sq : pat[b % 4])) : c.sq;
        const int nk = c.varlen ? (pat[(b + 1) % 4] < 0 ? c.sk + (c.varlen == 2 ? 40 : 0)
                                                        : (pat[(b + 1) % 4] > c.sk ? c.sk : pat[(b + 1) % 4]))
                                : c.sk;
        X.cu_q[b + 1] = X.cu_q[b] + nq;
        X.cu_k[b + 1] = X.cu_k[b] + nk;
        static const int rag[4] = {-1, 17, 0, 3};
        X.seqlens[b] = rag[b % 4] < 0 ? c.sk : (rag[b % 4] > c.sk ? c.sk : rag[b % 4]);
    }
    X.rows_q = c.varlen ? X.cu_q[c.batch] + 1 : (int64_t)c.batch * c.sq; /* +1: never empty */
    X.rows_k = c.varlen ? X.cu_k[c.batch] + 1 : (int64_t)c.batch * c.sk;
    size_t kv_elems = (size_t)(X.rows_k * X.kv_ss);
    if (c.page) { /* a pool of pages: the sequences' in shuffled order, 3 spare; gaps between pages with pad */
        const int per_seq = (c.sk + c.page - 1) / c.page;
        X.bt_stride = per_seq + 1;
        X.num_pages = c.batch * per_seq + 3;
        X.page_stride = (int64_t)c.page * X.kv_ss + (c.pad ? 8 : 0);
        kv_elems = (size_t)(X.num_pages * X.page_stride);
        std::vector<int32_t> perm((size_t)X.num_pages);
        for (int i = 0; i < X.num_pages; ++i) perm[(size_t)i] = i;
        for (int i = X.num_pages - 1; i > 0; --i) std::swap(perm[(size_t)i], perm[rng.step() % (uint64_t)(i + 1)]);
        const int spare = perm[(size_t)c.batch * per_seq]; /* a page no sequence owns: NaN */
        X.bt.assign((size_t)c.batch * X.bt_stride, 0);
        for (int b = 0; b < c.batch; ++b) {
            const int L = c.ragged ? X.seqlens[b] : c.sk, used = (L + c.page - 1) / c.page;
            for (int j = 0; j < X.bt_stride; ++j)
                X.bt[(size_t)b * X.bt_stride + j] =
                    j < used ? perm[(size_t)b * per_seq + j] : (j % 2 ? spare : j % 4 ? X.num_pages + j : -1 - j);
        }
        const int L0 = c.ragged ? X.seqlens[0] : c.sk, L1 = c.batch > 1 ? (c.ragged ? X.seqlens[1] : c.sk) : 0;
        if (L0 >= c.page && L1 >= c.page) X.bt[(size_t)X.bt_stride] = X.bt[0]; /* a shared prefix page */
    }
    X.q.assign((size_t)(X.rows_q * X.q_ss), 0);
    X.k.assign(kv_elems, 0);
    X.v.assign(kv_elems, 0);
    X.o.assign((size_t)(X.rows_q * X.o_ss), 0xFFFF);
    for (auto &x : X.q) x = from_f(rng.next(), c.dtype);
    for (auto &x : X.k) x = from_f(rng.next(), c.dtype);
    for (auto &x : X.v) x = from_f(rng.next(), c.dtype);
    X.lse.assign((size_t)c.batch * c.hq * c.sq, NAN);
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = c.batch; p.seqlen_q = c.sq; p.seqlen_k = c.sk; p.heads_q = c.hq; p.heads_kv = c.hkv;
    p.head_dim = c.d; p.dtype = c.dtype; p.causal = c.causal; p.window_left = c.wl; p.window_right = c.wr;
    p.q = X.q.data(); p.k = X.k.data(); p.v = X.v.data(); p.o = X.o.data(); p.lse = X.lse.data();
    p.q_seq_stride = X.q_ss; p.k_seq_stride = p.v_seq_stride = X.kv_ss; p.o_seq_stride = X.o_ss;
    if (c.varlen) {
        p.cu_seqlens_q = X.cu_q.data();
        p.cu_seqlens_k = X.cu_k.data();
        p.total_k = X.rows_k; // the packed rows and the spare one (the TMA kernels' map extent)
    } else {
        p.q_batch_stride = X.q_ss * c.sq; p.k_batch_stride = p.v_batch_stride = X.kv_ss * c.sk;
        p.o_batch_stride = X.o_ss * c.sq;
    }
    if (c.page) {
        p.k_batch_stride = p.v_batch_stride = X.page_stride;
        p.block_table = X.bt.data();
        p.block_table_stride = X.bt_stride;
        p.page_size = c.page;
        p.num_pages = X.num_pages;
    }
    p.seqlens_k = c.ragged ? X.seqlens.data() : nullptr;
    if (fp_attn_check(&p, 1, &E.a) != FP_OK) {
        fprintf(stderr, "%s: bad params: %s\n", c.name, fp_last_error());
        return false;
    }
    E.num_splits = c.splits;
    return true;
}

// The K / V rows no sequence owns become NaN: past each ragged sequence's
// length (seqlens_k), and with varlen the rows of a sequence past seqlen_k
// (clipped) and the spare row after the last; paged, every pool element
// outside the sequences' keys. Another part of a caller's
// cache may hold anything there; no kernel may let it into the result (P =
// 0 does not help: 0 * NaN = NaN).
static inline void emu_poison_unowned_kv(const emu_case &c, emu_data &X) {
    auto poison = [&](int64_t row) {
        for (int64_t x = 0; x < X.kv_ss; ++x) {
            X.k[(size_t)(row * X.kv_ss + x)] = 0xFFFF;
            X.v[(size_t)(row * X.kv_ss + x)] = 0xFFFF;
        }
    };
    if (c.page) { /* every pool element no sequence's key owns (gaps, spare pages, rows past L) */
        std::vector<char> owned(X.k.size(), 0);
        for (int b = 0; b < c.batch; ++b) {
            const int L = c.ragged ? X.seqlens[b] : c.sk;
            for (int j = 0; j < L; ++j) {
                const int64_t r = X.bt[(size_t)b * X.bt_stride + j / c.page] * X.page_stride +
                                  (int64_t)(j % c.page) * X.kv_ss;
                std::fill(owned.begin() + r, owned.begin() + r + X.kv_ss, 1);
            }
        }
        for (size_t i = 0; i < owned.size(); ++i)
            if (!owned[i]) X.k[i] = X.v[i] = 0xFFFF;
    } else if (c.varlen) {
        for (int b = 0; b < c.batch; ++b)
            for (int64_t j = X.cu_k[b] + std::min(X.cu_k[b + 1] - X.cu_k[b], c.sk); j < X.cu_k[b + 1]; ++j) poison(j);
        for (int64_t j = X.cu_k[c.batch]; j < X.rows_k; ++j) poison(j);
    } else if (c.ragged)
        for (int b = 0; b < c.batch; ++b)
            for (int j = X.seqlens[b]; j < c.sk; ++j) poison((int64_t)b * c.sk + j);
}

// The emulated O and lse against fp_attn_reference: O within a few ulps of
// the dtype (P is rounded to the dtype before P V, O once at the end), lse
// within 1e-4 + 1e-5 |ref|, -inf exactly; rows past a varlen sequence keep
// lse NaN; every O element outside the written rows' head_dim columns (row
// padding, the spare varlen row) keeps its poison. Prints
// "<tag>v<version> <case> max err ..." and returns true when all held.
static inline bool emu_verify(const emu_case &c, const char *tag, int version, const emu_data &X,
                              const emu_args &E) {
    const int64_t d = c.d;
    std::vector<double> o_ref((size_t)c.batch * c.sq * c.hq * d), lse_ref((size_t)c.batch * c.hq * c.sq);
    fp_attn_reference(nullptr, &E.a, o_ref.data(), lse_ref.data());
    const double eps = c.dtype == FP_F16 ? 4.9e-4 : 3.9e-3;
    const double atol = 2.0 * eps, rtol = 2.0 * eps;
    size_t bad = 0, lse_bad = 0;
    double max_err = 0.0;
    for (int b = 0; b < c.batch; ++b) {
        const int nq = X.cu_q[b + 1] - X.cu_q[b];
        const int64_t row0 = c.varlen ? X.cu_q[b] : (int64_t)b * c.sq;
        for (int i = 0; i < c.sq; ++i)
            for (int h = 0; h < c.hq; ++h) {
                const double lg = X.lse[((size_t)b * c.hq + h) * c.sq + i];
                if (i >= nq) { /* varlen: past the sequence: lse untouched */
                    if (!std::isnan(lg)) lse_bad++;
                    continue;
                }
                for (int x = 0; x < c.d; ++x) {
                    const double ref = o_ref[(((size_t)b * c.sq + i) * c.hq + h) * d + x];
                    const double got = to_f(X.o[(size_t)((row0 + i) * X.o_ss + h * d + x)], c.dtype);
                    const double err = fabs(got - ref);
                    if (!(err <= atol + rtol * fabs(ref))) {
                        if (bad < 3)
                            fprintf(stderr, "%s: O[b %d, i %d, h %d, %d] = %.6g, ref %.6g\n", c.name, b, i, h, x, got,
                                    ref);
                        bad++;
                    }
                    if (err > max_err || err != err) max_err = err;
                }
                const double lr = lse_ref[((size_t)b * c.hq + h) * c.sq + i];
                if (std::isinf(lr) ? !(std::isinf(lg) && lg < 0) : !(fabs(lg - lr) <= 1e-4 + 1e-5 * fabs(lr))) {
                    if (lse_bad < 3)
                        fprintf(stderr, "%s: lse[b %d, h %d, i %d] = %.6g, ref %.6g\n", c.name, b, h, i, lg, lr);
                    lse_bad++;
                }
            }
    }
    const int64_t written = c.varlen ? X.cu_q[c.batch] : X.rows_q;
    for (int64_t r = 0; r < X.rows_q; ++r)
        for (int64_t x = (r < written ? c.hq * d : 0); x < X.o_ss; ++x)
            if (X.o[(size_t)(r * X.o_ss + x)] != 0xFFFF) bad++;
    printf("%sv%d %-22s max err %.3g, %zu bad, %zu lse bad\n", tag, version, c.name, max_err, bad, lse_bad);
    return !bad && !lse_bad;
}

// One case end to end: emu_setup, the test's own `launch` (its emulation
// for head dim d and kernel version), emu_verify. False on any failure.
typedef void (*emu_launch_fn)(emu_args &E, int d, int version);
static inline bool emu_run_case(const emu_case &c, emu_rng &rng, const char *tag, int version, emu_launch_fn launch) {
    emu_data X;
    emu_args E;
    if (!emu_setup(c, rng, X, E)) return false;
    launch(E, c.d, version);
    return emu_verify(c, tag, version, X, E);
}

#endif /* ATTN_EMU_UTIL_H */
