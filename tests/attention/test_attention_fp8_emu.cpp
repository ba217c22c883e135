// fp8 (e4m3) attention on the Hopper TMA kernels v5 / v8, their own source on
// the CUDA emulation (tests/emu: wgmma .m64n128k32.e4m3 from shared-memory
// descriptors and from registers, TMA of 8-bit elements, mbarriers, named
// barriers): fp8_transpose_v (V^T into the workspace, keys in the order of
// P's register bytes, zeros past each sequence's length), then the kernel,
// through the launcher fp_attn_cuda_flash_sm90 and the dispatch
// fp_attn_cuda_flash.
// Two checks of every output element:
//   - against a model of the kernel's arithmetic written here: the online
//     softmax over 128-key tiles in order, P = 2^(s - running max) rounded
//     to e4m3 before P V (the row sum from the unrounded P), O rounded to
//     bf16: within bf16 rounding plus a small slack. A wrong key order in
//     V^T, a wrong fragment byte or a wrong descriptor moves elements by a
//     good part of max |V| and fails it;
//   - against fp_attn_reference (double, P not rounded): within 2^-4 of the
//     row's max |V| (the most rounding P to e4m3 can move O) + bf16.
// lse against the reference within 1e-4 (it is formed from unrounded sums).
// The K / V rows no sequence owns hold e4m3 NaN; O starts NaN (bf16 0xFFFF)
// and is followed by guards. Refusals (head_dim 64, paged, varlen, splits,
// v3 / v4 / v9 / v10, devices other than 9.0) write nothing.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "attention/attention_internal.h"
#include "attn_emu_util.h"
#include "cuda_emu.h"
#include "half.h"

namespace {

const int kGuard = 64;

struct fp8_case {
    const char *name;
    int batch, sq, sk, hq, hkv;
    int causal, wl, wr, ragged, pad; // pad: bytes after each K / V / Q row (multiples of 16 keep TMA's rules)
    float qd, kd, vd;                // descales (0: 1)
    float amp;                       // stored values drawn in [-amp, amp] (then rounded to e4m3)
};

struct fp8_data {
    int64_t q_ss, kv_ss, o_ss;
    std::vector<uint8_t> q, k, v;
    std::vector<uint16_t> o; // bf16, + kGuard
    std::vector<float> lse;  // + kGuard
    std::vector<int32_t> seqlens;
    fp_attn_args a;
};

const uint8_t kE4m3Nan = 0x7F;
const uint16_t kOGuard = 0x5A5A;

bool setup(const fp8_case &c, emu_rng &rng, fp8_data &X, int dtype_override = -1, int head_dim = 128) {
    const int D = head_dim;
    X.q_ss = (int64_t)c.hq * D + c.pad;
    X.kv_ss = (int64_t)c.hkv * D + c.pad;
    X.o_ss = (int64_t)c.hq * D + (c.pad ? 8 : 0); // bf16 elements: 16 bytes
    X.q.assign((size_t)(c.batch * c.sq * X.q_ss), 0);
    X.k.assign((size_t)(c.batch * c.sk * X.kv_ss), 0);
    X.v.assign(X.k.size(), 0);
    for (auto &x : X.q) x = fp_f2e4m3(rng.next() * c.amp);
    for (auto &x : X.k) x = fp_f2e4m3(rng.next() * c.amp);
    for (auto &x : X.v) x = fp_f2e4m3(rng.next() * c.amp);
    X.seqlens.assign((size_t)c.batch, c.sk);
    static const int rag[4] = {-1, 17, 0, 129};
    if (c.ragged)
        for (int b = 0; b < c.batch; ++b) X.seqlens[(size_t)b] = rag[b % 4] < 0 ? c.sk : std::min(rag[b % 4], c.sk);
    // rows no sequence owns: NaN
    for (int b = 0; b < c.batch; ++b)
        for (int j = X.seqlens[(size_t)b]; j < c.sk; ++j)
            for (int64_t x = 0; x < X.kv_ss; ++x) {
                X.k[(size_t)(((int64_t)b * c.sk + j) * X.kv_ss + x)] = kE4m3Nan;
                X.v[(size_t)(((int64_t)b * c.sk + j) * X.kv_ss + x)] = kE4m3Nan;
            }
    X.o.assign((size_t)(c.batch * c.sq * X.o_ss) + kGuard, 0xFFFF);
    std::fill(X.o.end() - kGuard, X.o.end(), kOGuard);
    X.lse.assign((size_t)c.batch * c.hq * c.sq + kGuard, NAN);
    for (int i = 0; i < kGuard; ++i) X.lse[X.lse.size() - 1 - (size_t)i] = 12345.0f;
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = c.batch; p.seqlen_q = c.sq; p.seqlen_k = c.sk; p.heads_q = c.hq; p.heads_kv = c.hkv;
    p.head_dim = D;
    p.dtype = dtype_override >= 0 ? (fp_dtype)dtype_override : FP_FP8_E4M3;
    p.causal = c.causal; p.window_left = c.wl; p.window_right = c.wr;
    p.q = X.q.data(); p.k = X.k.data(); p.v = X.v.data(); p.o = X.o.data(); p.lse = X.lse.data();
    p.q_seq_stride = X.q_ss; p.k_seq_stride = p.v_seq_stride = X.kv_ss; p.o_seq_stride = X.o_ss;
    p.q_batch_stride = X.q_ss * c.sq; p.k_batch_stride = p.v_batch_stride = X.kv_ss * c.sk;
    p.o_batch_stride = X.o_ss * c.sq;
    p.seqlens_k = c.ragged ? X.seqlens.data() : nullptr;
    p.q_descale = c.qd; p.k_descale = c.kd; p.v_descale = c.vd;
    if (fp_attn_check(&p, 1, &X.a) != FP_OK) {
        fprintf(stderr, "%s: bad params: %s\n", c.name, fp_last_error());
        return false;
    }
    return true;
}

// The kernel's arithmetic, in double except where the kernel rounds: for
// each row, 128-key tiles in order; m = running max of the kept scores; P =
// 2^((s - m) scale log2 e), rounded to e4m3 for P V, unrounded in the row
// sum; O rescaled by 2^((m_old - m) ...) per tile; O = acc / l x o_scale.
// P itself is formed in f32 as the kernel forms it (fma of the f32 score).
void model(const fp8_case &c, const fp8_data &X, std::vector<double> &o_model) {
    const fp_attn_args &a = X.a;
    const int D = a.head_dim;
    const double sl = (double)a.scale * 1.4426950408889634;
    o_model.assign((size_t)c.batch * c.sq * c.hq * D, 0.0);
    std::vector<double> s((size_t)c.sk), acc((size_t)D);
    for (int b = 0; b < c.batch; ++b) {
        const int L = X.seqlens[(size_t)b];
        for (int h = 0; h < c.hq; ++h) {
            const int hk = h / a.group;
            for (int i = 0; i < c.sq; ++i) {
                int lo, hi;
                fp_attn_row_range(&a, c.sq, L, i, &lo, &hi);
                const uint8_t *q = X.q.data() + (size_t)(((int64_t)b * c.sq + i) * X.q_ss + h * D);
                for (int j = lo; j <= hi; ++j) {
                    const uint8_t *k = X.k.data() + (size_t)(((int64_t)b * c.sk + j) * X.kv_ss + hk * D);
                    double dot = 0.0;
                    for (int x = 0; x < D; ++x) dot += (double)fp_e4m3_to_f32(q[x]) * fp_e4m3_to_f32(k[x]);
                    s[(size_t)j] = (double)(float)dot; // the accumulators are f32
                }
                double m = -INFINITY, l = 0.0;
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int t0 = 0; t0 < L; t0 += 128) {
                    const int a0 = std::max(t0, lo), a1 = std::min(t0 + 127, hi);
                    if (a0 > a1) continue;
                    double mt = m;
                    for (int j = a0; j <= a1; ++j) mt = std::max(mt, s[(size_t)j]);
                    const double corr = m == -INFINITY ? 0.0 : exp2((m - mt) * sl);
                    l *= corr;
                    for (double &y : acc) y *= corr;
                    m = mt;
                    // P as the kernel forms it, in f32: 2^(s sl - m sl) by one fma
                    // (scores of large magnitude lose bits there, which moves P's
                    // e4m3 rounding: the model must round the same number)
                    const float sl_f = a.scale * 1.4426950408889634f, m_scaled = (float)m * sl_f;
                    for (int j = a0; j <= a1; ++j) {
                        const float pf = exp2f(fmaf((float)s[(size_t)j], sl_f, -m_scaled));
                        l += pf;
                        const double p8 = fp_e4m3_to_f32(fp_f2e4m3(pf));
                        const uint8_t *v = X.v.data() + (size_t)(((int64_t)b * c.sk + j) * X.kv_ss + hk * D);
                        for (int x = 0; x < D; ++x) acc[(size_t)x] += p8 * fp_e4m3_to_f32(v[x]);
                    }
                }
                double *o = &o_model[(((size_t)b * c.sq + i) * c.hq + h) * D];
                for (int x = 0; x < D; ++x) o[x] = l > 0.0 ? acc[(size_t)x] / l * a.o_scale : 0.0;
            }
        }
    }
}

bool verify(const fp8_case &c, const char *tag, const fp8_data &X) {
    const fp_attn_args &a = X.a;
    const int D = a.head_dim;
    std::vector<double> o_ref((size_t)c.batch * c.sq * c.hq * D), lse_ref((size_t)c.batch * c.hq * c.sq), o_mod;
    fp_attn_reference(nullptr, &a, o_ref.data(), lse_ref.data());
    model(c, X, o_mod);
    // max |V| in real units (the reference's bound)
    double vmax = 0.0;
    for (int b = 0; b < c.batch; ++b)
        for (int j = 0; j < X.seqlens[(size_t)b]; ++j)
            for (int64_t x = 0; x < (int64_t)c.hkv * D; ++x)
                vmax = std::max(vmax, (double)fabsf(fp_e4m3_to_f32(X.v[(size_t)(((int64_t)b * c.sk + j) * X.kv_ss + x)])));
    vmax *= a.o_scale;
    size_t bad_mod = 0, bad_ref = 0, bad_lse = 0, bad_pad = 0;
    double err_mod = 0.0, err_ref = 0.0;
    for (int b = 0; b < c.batch; ++b)
        for (int i = 0; i < c.sq; ++i)
            for (int h = 0; h < c.hq; ++h) {
                for (int x = 0; x < D; ++x) {
                    const size_t ri = (((size_t)b * c.sq + i) * c.hq + h) * D + (size_t)x;
                    const double got = fp_bf16_to_f32(X.o[(size_t)(((int64_t)b * c.sq + i) * X.o_ss + h * D + x)]);
                    const double em = fabs(got - o_mod[ri]), er = fabs(got - o_ref[ri]);
                    if (!(em <= 2e-3 * vmax + 8e-3 * fabs(o_mod[ri]))) {
                        if (bad_mod < 3)
                            fprintf(stderr, "%s: O[b %d, i %d, h %d, %d] = %.6g, model %.6g (ref %.6g)\n", c.name, b,
                                    i, h, x, got, o_mod[ri], o_ref[ri]);
                        bad_mod++;
                    }
                    if (!(er <= 0.0625 * vmax + 8e-3 * fabs(o_ref[ri]) + 1e-6)) bad_ref++;
                    if (!(em <= err_mod)) err_mod = em;
                    if (!(er <= err_ref)) err_ref = er;
                }
                const double lg = X.lse[((size_t)b * c.hq + h) * c.sq + i], lr = lse_ref[((size_t)b * c.hq + h) * c.sq + i];
                if (std::isinf(lr) ? !(std::isinf(lg) && lg < 0) : !(fabs(lg - lr) <= 1e-4 + 1e-5 * fabs(lr))) {
                    if (bad_lse < 3) fprintf(stderr, "%s: lse[b %d, h %d, i %d] = %.6g, ref %.6g\n", c.name, b, h, i, lg, lr);
                    bad_lse++;
                }
                for (int64_t x = (int64_t)c.hq * D; h == 0 && x < X.o_ss; ++x) // row padding keeps its poison
                    if (X.o[(size_t)(((int64_t)b * c.sq + i) * X.o_ss + x)] != 0xFFFF) bad_pad++;
            }
    for (int g = 0; g < kGuard; ++g)
        if (X.o[X.o.size() - 1 - (size_t)g] != kOGuard || X.lse[X.lse.size() - 1 - (size_t)g] != 12345.0f) bad_pad++;
    printf("%s%-26s max err %.3g vs model, %.3g vs reference (max|V| %.3g); bad %zu / %zu, lse %zu, pad %zu\n", tag,
           c.name, err_mod, err_ref, vmax, bad_mod, bad_ref, bad_lse, bad_pad);
    return !bad_mod && !bad_ref && !bad_lse && !bad_pad;
}

bool o_untouched(const fp8_data &X) {
    for (size_t i = 0; i + kGuard < X.o.size(); ++i)
        if (X.o[i] != 0xFFFF) return false;
    return true;
}

} // namespace

int main(int argc, char **argv) {
    // name, batch, sq, sk, hq, hkv, causal, wl, wr, ragged, pad, qd, kd, vd, amp
    static const fp8_case cases[] = {
        {"d128_130x300",          1, 130, 300, 2, 2, 0, -1, -1, 0, 0,  0,     0,    0,    1.0f},
        {"d128_gqa4_causal",      2, 70,  200, 8, 2, 1, -1, -1, 0, 16, 0,     0,    0,    2.0f},
        {"d128_ragged_c_desc",    4, 33,  300, 2, 1, 1, -1, -1, 1, 0,  0.05f, 0.1f, 0.02f, 200.0f},
        {"d128_window",           1, 200, 270, 1, 1, 0, 40, 3,  0, 16, 0,     0,    0,    1.0f},
        {"d128_decode",           2, 1,   400, 8, 1, 0, -1, -1, 0, 0,  0.5f,  2.0f, 4.0f, 8.0f},
        {"d128_rows129_tile256",  1, 129, 256, 1, 1, 0, -1, -1, 0, 0,  0,     0,    0,    448.0f},
        {"d128_q>k_causal",       1, 200, 40,  1, 1, 1, -1, -1, 0, 0,  0.01f, 0.01f, 1.0f, 100.0f},
    };
    const char *only = argc > 1 ? argv[1] : nullptr;
    emu_rng rng = {0xf8e4a3b2c1d0e9f7ull};
    int failures = 0, ran = 0;
    for (int pass = 0; pass < 2; ++pass) { // pass 1: the emulation's other thread order
        if (pass) setenv("FP_EMU_REVERSE", "1", 1);
        for (int version : {5, 8})
            for (const fp8_case &c : cases) {
                if (only && !std::strstr(c.name, only)) continue;
                fp8_data X;
                ran++;
                if (!setup(c, rng, X)) {
                    failures++;
                    continue;
                }
                fp_status st = fp_attn_cuda_flash_sm90(&X.a, version, 1, nullptr);
                if (cudaDeviceSynchronize() != cudaSuccess && st == FP_OK) st = FP_ERR_CUDA;
                char tag[32];
                snprintf(tag, sizeof tag, "v%d%s ", version, pass ? " rev" : "");
                if (st != FP_OK) {
                    fprintf(stderr, "%s%s: %s (%s)\n", tag, c.name, fp_last_error(), fp_emu::last_failure());
                    failures++;
                } else if (!verify(c, tag, X))
                    failures++;
            }
    }
    unsetenv("FP_EMU_REVERSE");
    // The dispatch: version 0 -> v5, 8 -> v8, another preference -> v5 (a
    // fallback noted); a device other than 9.0 refuses (no other kernel
    // takes fp8).
    for (int pref : {0, 8, 1}) {
        const fp8_case &c = cases[2];
        fp8_data X;
        ran++;
        fp_attn_note_begin(pref);
        if (!setup(c, rng, X) || fp_attn_cuda_flash(&X.a, pref, 132, 90, nullptr) != FP_OK ||
            cudaDeviceSynchronize() != cudaSuccess) {
            fprintf(stderr, "dispatch (preferring %d): %s\n", pref, fp_last_error());
            failures++;
            continue;
        }
        fp_attention_kernel_info info;
        fp_attention_last_kernel(&info);
        const int want = pref == 8 ? 8 : 5;
        if (info.version != want) {
            fprintf(stderr, "dispatch (preferring %d): ran v%d, not v%d\n", pref, info.version, want);
            failures++;
        } else if (!verify(c, "dispatch ", X))
            failures++;
    }
    {
        fp8_data X;
        ran++;
        if (!setup(cases[0], rng, X) || fp_attn_cuda_flash(&X.a, 0, 108, 80, nullptr) != FP_ERR_UNSUPPORTED ||
            !std::strstr(fp_last_error(), "9.0") || !o_untouched(X)) {
            fprintf(stderr, "fp8 on a cc 8.0 device: not refused cleanly (%s)\n", fp_last_error());
            failures++;
        }
    }
    // Refusals, nothing written: other versions, head_dim 64, paged, varlen,
    // splits, a V layout whose rows are not 16-byte aligned.
    struct refusal {
        const char *what;
        int version, splits, head_dim, pad;
        const char *want;
    };
    static const refusal refusals[] = {
        {"v3", 3, 1, 128, 0, "dtype"},          {"v4", 4, 1, 128, 0, "dtype"},
        {"v9", 9, 1, 128, 0, "v5 and v8"},      {"v10", 10, 1, 128, 0, "v5 and v8"},
        {"head_dim 64", 5, 1, 64, 0, "head_dim"}, {"2 splits", 8, 2, 128, 0, "splits"},
    };
    for (const refusal &r : refusals) {
        fp8_case c = cases[0];
        c.pad = r.pad;
        fp8_data X;
        ran++;
        const bool ok = setup(c, rng, X, -1, r.head_dim);
        if (!ok || fp_attn_cuda_flash_sm90(&X.a, r.version, r.splits, nullptr) != FP_ERR_UNSUPPORTED ||
            !std::strstr(fp_last_error(), r.want) || !o_untouched(X)) {
            fprintf(stderr, "refusal (%s): %s\n", r.what, ok ? fp_last_error() : "setup failed");
            failures++;
        }
    }
    for (int kind = 0; kind < 2; ++kind) { // paged, varlen: the args only
        fp8_data X;
        ran++;
        if (!setup(cases[0], rng, X)) {
            failures++;
            continue;
        }
        int32_t bt[3] = {0, 1, 2}, cu[2] = {0, 130}, cuk[2] = {0, 300};
        if (kind == 0) {
            X.a.block_table = bt;
            X.a.bt_stride = 3;
            X.a.page_size = 128;
            X.a.num_pages = 3;
        } else {
            X.a.cu_q = cu;
            X.a.cu_k = cuk;
            X.a.total_k = 300;
        }
        if (fp_attn_cuda_flash_sm90(&X.a, 5, 1, nullptr) != FP_ERR_UNSUPPORTED ||
            !std::strstr(fp_last_error(), kind ? "varlen" : "paged") || !o_untouched(X)) {
            fprintf(stderr, "refusal (%s): %s\n", kind ? "varlen" : "paged", fp_last_error());
            failures++;
        }
    }
    if (failures) fprintf(stderr, "test_attention_fp8_emu: %d of %d cases failed\n", failures, ran);
    else printf("test_attention_fp8_emu: %d cases ok (%ld launches)\n", ran, fp_emu::launches());
    return failures ? 1 : 0;
}
