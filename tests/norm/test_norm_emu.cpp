// The fused-norm CUDA kernels (kernels/norm/norm_fwd.cu, norm_bwd.cu) run on
// the CPU emulation of the CUDA execution model (tests/emu/cuda_emu.h): the
// launchers of kernels/norm/norm_launch.h called directly on host buffers,
// every output element checked against a double-precision reference written
// here (independent of src/norm/norm_ref.c).
//
// Each case: inputs random (never zero) including the stride gaps; outputs
// poisoned (0xFF: NaN in every dtype); every buffer inside guard bytes that
// must survive; inputs checked unchanged; the kernels the launcher ran
// (fp_emu::launch_log, by name) and fp_norm_bwd_version_used asserted, so a
// case meant for a kernel mode really runs it. Coverage (the case list of
// tests/norm/test_norm_gpu.c at small row counts):
//   forward v0/v1/v2 and the unfused baseline: v2 warp per row NV 1/2/4, v2
//   block per row NV 2/4/8, v1 (odd cols, misaligned pointers: all, and
//   each alone, strides not a vector multiple, rows past v2's 16384 cols,
//   forced), every option;
//   backward v0-v3 and the unfused baseline: dx v1/v2 (each NV), dparams
//   v1/v2 with several row chunks, v3 register sums (warp per row NV 1/2/4,
//   block per row), shared-memory sums, the staged row; the persistent grid
//   (more row groups than CTAs: a small sm_count); the opt-in limits of an
//   A100 and of a 99 KB device (v3 falls back to v2); determinism (two runs
//   bit-identical); in-place aliasing the API allows (out = x, residual_out =
//   residual; dx = dout); launcher errors (no partial buffer).
// ~6400 cases, ~16 s of one core (the emulation's fiber switches dominate).
// --long (or FP_NORM_EMU_LONG=1): every option combination at every shape,
// more rows, and rows > 65535 (the unfused steps' grid-stride row loop):
// ~34000 cases, ~6 minutes.
#include "cuda_emu.h"
#include "norm/norm_bwd_v3_plan.h"
#include "norm/norm_launch.h"

#include <chrono>
#include <cstdarg>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

enum { LN = FP_NORM_LAYERNORM, RMS = FP_NORM_RMSNORM };
enum { F32 = FP_F32, F16 = FP_F16, BF16 = FP_BF16 };
constexpr int kActs = FP_NORM_ACT_SILU + 1;
const int kDtypes[3] = {F32, F16, BF16};

bool g_long = false;
long g_cases = 0, g_failed = 0;

// ---- host data -------------------------------------------------------------

size_t esize(int dt) { return dt == F32 ? 4 : 2; }
const char *dt_name(int dt) { return dt == F32 ? "f32" : dt == F16 ? "f16" : "bf16"; }
// The kernels' T as the demangler spells it.
const char *dt_type(int dt) { return dt == F32 ? "float" : dt == F16 ? "__half" : "__nv_bfloat16"; }
const char *act_name(int a) {
    static const char *n[] = {"none", "gelu_erf", "gelu_tanh", "relu", "silu"};
    return n[a];
}

float ld(const void *p, int dt, size_t i) {
    switch (dt) {
    case F32: return static_cast<const float *>(p)[i];
    case F16: return __half2float(static_cast<const __half *>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    }
}
void st(void *p, int dt, size_t i, float v) {
    switch (dt) {
    case F32: static_cast<float *>(p)[i] = v; break;
    case F16: static_cast<__half *>(p)[i] = __float2half_rn(v); break;
    default: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v); break;
    }
}
float round_dt(int dt, float v) {
    unsigned char b[4];
    st(b, dt, 0, v);
    return ld(b, dt, 0);
}

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 12345) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // Uniform in [lo, hi), never within 1e-3 of 0 (a zero hides a missing term).
    float uni(float lo, float hi) {
        for (;;) {
            float v = lo + (hi - lo) * (float)((next() >> 40) * (1.0 / 16777216.0));
            if (std::fabs(v) >= 1e-3f) return v;
        }
    }
};

// A device buffer: `bytes` at ptr(), which is `mis` bytes past a 256-byte
// boundary, inside guard bytes that no kernel may touch. before: the bytes
// it held when the case started (poison for outputs, data for inputs).
constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0x5A;
struct Buf {
    unsigned char *base = nullptr;
    size_t bytes = 0, mis = 0, total = 0;
    std::vector<unsigned char> before;
    Buf() = default;
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    ~Buf() { free(base); }
    void alloc(size_t n, size_t misalign) {
        free(base);
        bytes = n;
        mis = misalign;
        total = (2 * kGuard + mis + bytes + 255) / 256 * 256;
        base = static_cast<unsigned char *>(aligned_alloc(256, total));
        memset(base, kGuardByte, total);
    }
    unsigned char *ptr() const { return base ? base + kGuard + mis : nullptr; }
    void poison() {
        memset(ptr(), 0xFF, bytes);
        snapshot();
    }
    void snapshot() { before.assign(ptr(), ptr() + bytes); }
    bool guards_ok() const {
        if (!base) return true;
        for (size_t i = 0; i < kGuard + mis; ++i)
            if (base[i] != kGuardByte) return false;
        for (size_t i = kGuard + mis + bytes; i < total; ++i)
            if (base[i] != kGuardByte) return false;
        return true;
    }
    bool unchanged() const { return memcmp(ptr(), before.data(), bytes) == 0; }
};

// Random tensor data of n elements of dt in [lo, hi) into b (allocated).
void fill_random(Buf &b, int dt, size_t n, size_t mis, uint64_t seed, float lo, float hi) {
    b.alloc(n * esize(dt), mis);
    Rng r(seed);
    for (size_t i = 0; i < n; ++i) st(b.ptr(), dt, i, r.uni(lo, hi));
    b.snapshot();
}

// ---- checks ----------------------------------------------------------------

struct Check {
    std::string desc;
    int errors = 0;
    void fail(const char *fmt, ...) __attribute__((format(printf, 2, 3))) {
        if (errors++ < 6) {
            char buf[512];
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(buf, sizeof buf, fmt, ap);
            va_end(ap);
            fprintf(stderr, "[%s] %s\n", desc.c_str(), buf);
        }
    }
};

// Compares a [rows, cols] tensor at stride (elements) in b with ref (double,
// rows x cols dense); the gap bytes must still hold what they held before.
// extra (optional, as ref): a per-element allowance added to atol.
void compare(Check &c, const char *what, const Buf &b, int dt, int64_t rows, int64_t cols, int64_t stride,
             const std::vector<double> &ref, double atol, double rtol, const std::vector<double> *extra = nullptr) {
    const size_t es = esize(dt);
    int bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
            const double want = ref[(size_t)(r * cols + j)];
            const double got = ld(b.ptr(), dt, (size_t)(r * stride + j));
            const double a = atol + (extra ? (*extra)[(size_t)(r * cols + j)] : 0.0);
            if (!(std::fabs(got - want) <= a + rtol * std::fabs(want))) {
                if (bad++ < 3)
                    c.fail("%s: row %lld col %lld got %.8g want %.8g (atol %.3g rtol %.3g)", what, (long long)r,
                           (long long)j, got, want, a, rtol);
            }
        }
        if (stride > cols) {
            const size_t o = (size_t)(r * stride + cols) * es, n = (size_t)(stride - cols) * es;
            if (o + n <= b.bytes && memcmp(b.ptr() + o, b.before.data() + o, n) != 0)
                c.fail("%s: row %lld: the stride gap was written", what, (long long)r);
        }
    }
    if (bad > 3) c.fail("%s: %d mismatches in all", what, bad);
    if (!b.guards_ok()) c.fail("%s: written outside its buffer (guard bytes changed)", what);
}

void check_input(Check &c, const char *what, const Buf &b) {
    if (!b.base) return;
    if (!b.unchanged()) c.fail("input %s was modified", what);
    if (!b.guards_ok()) c.fail("input %s: guard bytes changed", what);
}

// The launches since the log was cleared: all succeeded, and one of them ran
// a kernel whose name contains each of `want` (nullptr entries skipped).
void check_launches(Check &c, std::initializer_list<const std::string> want) {
    const auto &log = fp_emu::launch_log();
    std::vector<std::string> names;
    for (const auto &r : log) {
        names.push_back(fp_emu::kernel_name(r.func));
        if (r.result != cudaSuccess)
            c.fail("launch of %s (grid %u, block %ux%u, smem %zu) failed: %s", names.back().c_str(), r.grid.x,
                   r.block.x, r.block.y, r.smem, fp_emu::last_failure());
    }
    for (const std::string &w : want) {
        if (w.empty()) continue;
        bool found = false;
        for (const auto &n : names) found |= n.find(w) != std::string::npos;
        if (!found) {
            std::string all;
            for (const auto &n : names) all += "\n    " + n;
            c.fail("expected a launch of %s; ran:%s", w.c_str(), all.c_str());
        }
    }
}

void finish(Check &c) {
    g_cases++;
    if (c.errors) g_failed++;
}

// ---- double reference ------------------------------------------------------

double act_d(int act, double y) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF: return 0.5 * y * (1.0 + std::erf(y / std::sqrt(2.0)));
    case FP_NORM_ACT_GELU_TANH:
        return 0.5 * y * (1.0 + std::tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)));
    case FP_NORM_ACT_RELU: return y > 0.0 ? y : 0.0;
    case FP_NORM_ACT_SILU: return y / (1.0 + std::exp(-y));
    default: return y;
    }
}
double dact_d(int act, double y) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF:
        return 0.5 * (1.0 + std::erf(y / std::sqrt(2.0))) + y * std::exp(-0.5 * y * y) / std::sqrt(2.0 * M_PI);
    case FP_NORM_ACT_GELU_TANH: {
        const double k = 0.7978845608028654, cc = 0.044715;
        const double t = std::tanh(k * (y + cc * y * y * y));
        return 0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * k * (1.0 + 3.0 * cc * y * y);
    }
    case FP_NORM_ACT_RELU: return y > 0.0 ? 1.0 : 0.0;
    case FP_NORM_ACT_SILU: {
        const double s = 1.0 / (1.0 + std::exp(-y));
        return s * (1.0 + y * (1.0 - s));
    }
    default: return 1.0;
    }
}

void tolerance(int dt, double *atol, double *rtol) {  // fp_default_tolerance
    if (dt == F16) *atol = 1e-3, *rtol = 2e-3;
    else if (dt == BF16) *atol = 1e-2, *rtol = 1.6e-2;
    else *atol = 1e-5, *rtol = 1e-5;
}

// ---- forward ---------------------------------------------------------------

enum { kX, kRes, kGamma, kBeta, kBias, kOut, kResOut };  // forward tensors (FwdCase::off_mask)
struct FwdCase {
    int kind = LN, act = 0, dt = F32;
    int64_t rows = 1, cols = 1, pad = 0;
    int off = 0;  // elements added to the pointers in off_mask (misalignment)
    unsigned off_mask = ~0u;  // bits: kX, kRes, kGamma, kBeta, kBias, kOut, kResOut
    bool res = false, res_out = false, gamma = false, beta = false, bias = false, stats = false;
    bool in_place = false;  // out = x, residual_out = residual
    int version = 0;        // fp_norm_fwd_launch version; -1: the unfused baseline
    int sm_count = 0;       // the desc's SM count (0: unknown)
    float x_lo = -2.0f, x_hi = 3.0f;
    std::string expect;     // a kernel that must run ("" : not checked)
    std::string expect_ew;  // the unfused baseline: its elementwise kernel ("": not checked)
    unsigned expect_grid = 0;  // the grid (x) of expect's launch (0: not checked)
};

std::string fwd_desc(const FwdCase &f) {
    char b[320];
    snprintf(b, sizeof b,
             "fwd %s v%d %s act=%s %s %lldx%lld pad=%lld off=%d res=%d res_out=%d gamma=%d beta=%d bias=%d "
             "stats=%d%s",
             f.version < 0 ? "unfused" : "fused", f.version < 0 ? 0 : f.version, f.kind == LN ? "layernorm" : "rmsnorm",
             act_name(f.act), dt_name(f.dt), (long long)f.rows, (long long)f.cols, (long long)f.pad, f.off, f.res,
             f.res_out, f.gamma, f.beta, f.bias, f.stats, f.in_place ? " in-place" : "");
    std::string r = b;
    if (f.off && f.off_mask != ~0u) r += " off_mask=" + std::to_string(f.off_mask);
    return r;
}

void run_fwd(const FwdCase &f, uint64_t seed) {
    Check c;
    c.desc = fwd_desc(f);
    const int dt = f.dt;
    const size_t es = esize(dt);
    const int64_t stride = f.cols + f.pad;
    const size_t tn = (size_t)(f.rows * stride), vn = (size_t)f.cols;
    auto mis = [&](int t) { return (f.off_mask >> t & 1u) ? (size_t)f.off * es : 0; };
    Buf x, res, gamma, beta, bias, out, res_out, mean, rstd;
    fill_random(x, dt, tn, mis(kX), seed, f.x_lo, f.x_hi);
    if (f.res) fill_random(res, dt, tn, mis(kRes), seed + 1, -1.0f, 1.0f);
    if (f.gamma) fill_random(gamma, dt, vn, mis(kGamma), seed + 2, 0.5f, 1.5f);
    if (f.beta) fill_random(beta, dt, vn, mis(kBeta), seed + 3, -0.5f, 0.5f);
    if (f.bias) fill_random(bias, dt, vn, mis(kBias), seed + 4, -0.3f, 0.3f);
    const std::vector<unsigned char> x0 = x.before, res0 = res.before;  // the inputs, for the reference
    Buf *o = &out, *ro = &res_out;
    if (f.in_place) {
        o = &x;
        if (f.res_out) ro = &res;
    } else {
        out.alloc(tn * es, mis(kOut));
        out.poison();
    }
    if (f.res_out && ro == &res_out) {
        res_out.alloc(tn * es, mis(kResOut));
        res_out.poison();
    }
    if (f.stats) {
        mean.alloc((size_t)f.rows * 4, 0);
        mean.poison();
        rstd.alloc((size_t)f.rows * 4, 0);
        rstd.poison();
    }
    fp_norm_fwd_desc d;
    memset(&d, 0, sizeof d);
    d.kind = f.kind;
    d.act = f.act;
    d.dtype = dt;
    d.rows = f.rows;
    d.cols = f.cols;
    d.x_stride = d.res_stride = d.res_out_stride = d.out_stride = stride;
    d.x = x.ptr();
    d.res = res.ptr();
    d.gamma = gamma.ptr();
    d.beta = beta.ptr();
    d.bias = bias.ptr();
    d.out = o->ptr();
    d.res_out = f.res_out ? ro->ptr() : nullptr;
    d.mean = f.stats && f.kind == LN ? reinterpret_cast<float *>(mean.ptr()) : nullptr;  // as fp_norm_check_fwd
    d.rstd = f.stats ? reinterpret_cast<float *>(rstd.ptr()) : nullptr;
    d.eps = 1e-5f;
    d.sm_count = f.sm_count;

    fp_emu::clear_launch_log();
    const cudaError_t err = f.version < 0 ? fp_norm_fwd_unfused_launch(&d, 0) : fp_norm_fwd_launch(&d, f.version, 0);
    (void)cudaDeviceSynchronize();  // FP_EMU_ASYNC=1 runs kernels on a worker: wait before reading
    (void)cudaGetLastError();
    if (err != cudaSuccess) c.fail("launcher returned %d (%s)", (int)err, fp_emu::last_failure());
    check_launches(c, {f.expect, f.expect_ew});
    if (f.expect_grid) {
        for (const auto &r : fp_emu::launch_log())
            if (fp_emu::kernel_name(r.func).find(f.expect) != std::string::npos && r.grid.x != f.expect_grid)
                c.fail("%s ran on a grid of %u CTAs, expected %u", f.expect.c_str(), r.grid.x, f.expect_grid);
    }

    // Reference: s = round_T(x + residual), then double throughout.
    std::vector<double> r_out((size_t)(f.rows * f.cols)), r_s(r_out.size()), r_mean(f.rows), r_rstd(f.rows);
    std::vector<double> s(f.cols);
    // The unfused baseline stores each step in the dtype (unit roundoff u):
    // the normalized value n and the affine result y, each rounding then
    // scaled by gamma and the activation's slope (<= 1.13): an allowance of
    // 1.2 u (|n gamma| + |y|) per element.
    const double u = dt == F16 ? 1.0 / 2048 : dt == BF16 ? 1.0 / 256 : 0x1p-24;
    std::vector<double> e_out(f.version < 0 ? r_out.size() : 0);
    for (int64_t r = 0; r < f.rows; ++r) {
        double sum = 0.0;
        for (int64_t j = 0; j < f.cols; ++j) {
            const size_t i = (size_t)(r * stride + j);
            double v = ld(x0.data(), dt, i);
            if (f.res) v = round_dt(dt, (float)(v + (double)ld(res0.data(), dt, i)));
            s[j] = v;
            r_s[(size_t)(r * f.cols + j)] = v;
            sum += v;
        }
        const double mu = f.kind == LN ? sum / (double)f.cols : 0.0;
        double var = 0.0;
        for (int64_t j = 0; j < f.cols; ++j) var += (s[j] - mu) * (s[j] - mu);
        const double rs = 1.0 / std::sqrt(var / (double)f.cols + 1e-5);
        r_mean[r] = mu;
        r_rstd[r] = rs;
        for (int64_t j = 0; j < f.cols; ++j) {
            double y = (s[j] - mu) * rs;
            if (f.gamma) y *= ld(gamma.ptr(), dt, j);
            const double ng = std::fabs(y);
            if (f.beta) y += ld(beta.ptr(), dt, j);
            if (f.bias) y += ld(bias.ptr(), dt, j);
            r_out[(size_t)(r * f.cols + j)] = act_d(f.act, y);
            if (f.version < 0) e_out[(size_t)(r * f.cols + j)] = 1.2 * u * (ng + std::fabs(y));
        }
    }
    double atol, rtol;
    tolerance(dt, &atol, &rtol);
    compare(c, "out", *o, dt, f.rows, f.cols, stride, r_out, atol, rtol, f.version < 0 ? &e_out : nullptr);
    if (f.res_out) compare(c, "residual_out", *ro, dt, f.rows, f.cols, stride, r_s, atol, rtol);
    if (f.stats) {
        if (f.kind == LN) compare(c, "mean", mean, F32, 1, f.rows, f.rows, r_mean, 1e-5, 1e-4);
        else if (!mean.unchanged()) c.fail("RMSNorm wrote mean");
        compare(c, "rstd", rstd, F32, 1, f.rows, f.rows, r_rstd, 1e-5, 1e-4);
    }
    if (!f.in_place) check_input(c, "x", x);
    if (!(f.in_place && f.res_out)) check_input(c, "residual", res);
    check_input(c, "gamma", gamma);
    check_input(c, "beta", beta);
    check_input(c, "bias", bias);
    finish(c);
}

// Expected forward kernel per dtype class: 0 = v1, NV > 0 = v2<T, NV, its
// load order (norm_fwd.cu)>, -1 = v3.
std::string fwd_kernel(int dt, int nv, int order = 1) {
    char b[96];
    if (nv == 0) snprintf(b, sizeof b, "norm_fwd_v1<%s>", dt_type(dt));
    else if (nv < 0) snprintf(b, sizeof b, "norm_fwd_v3<%s>", dt_type(dt));
    else snprintf(b, sizeof b, "norm_fwd_v2<%s, %d, %d>", dt_type(dt), nv, order);
    return b;
}

// The expected kernels of f at shape nv (see fwd_kernel): for the unfused
// baseline also its elementwise steps' kernel (vectorized where the fused
// one is: the same alignment check), when it has any step besides the norm.
void fwd_expect(FwdCase &f, int nv32, int nv16, int order = 1) {
    const int nv = f.dt == F32 ? nv32 : nv16;
    f.expect = fwd_kernel(f.dt, nv, order);
    f.expect_ew.clear();
    if (f.version < 0 && (f.res || f.res_out || f.gamma || f.beta || f.bias || f.act)) {
        const int V = f.dt == F32 ? 4 : 8;
        const bool vec = f.off == 0 && f.cols % V == 0 && (f.cols + f.pad) % V == 0;
        f.expect_ew = std::string("norm_unfused_elementwise<") + dt_type(f.dt) + (vec ? ", true>" : ", false>");
    }
}

struct FwdShape {
    int64_t rows, cols, pad;
    int off, version;
    int nv32, nv16;  // expected kernel: f32, 16-bit (0 = v1)
    const char *why;
};

// A case of kind and dtype dt at shape s (its rows, cols, pad, offset and
// version), every option off.
FwdCase fwd_case(const FwdShape &s, int kind, int dt) {
    FwdCase f;
    f.kind = kind;
    f.dt = dt;
    f.rows = s.rows;
    f.cols = s.cols;
    f.pad = s.pad;
    f.off = s.off;
    f.version = s.version;
    return f;
}

// Every option combination (2 kinds x residual x 3 affine x bias x 5
// activations x 3 dtypes x stats = 720 cases) at one shape.
void fwd_all_combos(const FwdShape &s, uint64_t &seed, int sm_count = 0, int order = 1) {
    for (int kind = 0; kind < 2; ++kind)
        for (int res = 0; res < 2; ++res)
            for (int aff = 0; aff < 3; ++aff)
                for (int bias = 0; bias < 2; ++bias)
                    for (int act = 0; act < kActs; ++act)
                        for (int di = 0; di < 3; ++di)
                            for (int stats = 0; stats < 2; ++stats) {
                                FwdCase f = fwd_case(s, kind, kDtypes[di]);
                                f.sm_count = sm_count;
                                f.act = act;
                                f.res = res;
                                f.res_out = res || (stats && act == 1);  // residual_out without a residual too
                                f.gamma = aff >= 1;
                                f.beta = aff >= 2;
                                f.bias = bias;
                                f.stats = stats;
                                fwd_expect(f, s.nv32, s.nv16, order);
                                run_fwd(f, seed++);
                            }
}

// Per kind and dtype: every option on (one activation per kind, rotating),
// every option off, and a mixed set.
void fwd_some_combos(const FwdShape &s, uint64_t &seed, int sm_count = 0, int order = 1) {
    for (int kind = 0; kind < 2; ++kind)
        for (int di = 0; di < 3; ++di)
            for (int set = 0; set < 3; ++set) {
                FwdCase f = fwd_case(s, kind, kDtypes[di]);
                f.sm_count = sm_count;
                if (set == 0) {
                    f.act = 1 + (int)((seed + kind) % 4);
                    f.res = f.res_out = f.gamma = f.beta = f.bias = f.stats = true;
                } else if (set == 2) {
                    f.act = FP_NORM_ACT_RELU;
                    f.res_out = f.gamma = f.stats = true;
                }
                fwd_expect(f, s.nv32, s.nv16, order);
                run_fwd(f, seed++);
            }
}

void test_forward() {
    // Expected kernels: f32 has 4 elements per 16-byte vector, f16/bf16 8; v2
    // takes a warp per row up to 128 vectors (NV 1/2/4), else a block per row
    // with the fewest NV in {2, 4, 8 (f32)} that fits 512 threads.
    static const FwdShape full[] = {
        {3, 768, 0, 0, 0, 2, 4, "f32 block per row NV 2 (192 threads); 16-bit warp per row NV 4"},
        {5, 24, 8, 0, 0, 1, 1, "strided short rows: warp per row NV 1, a partial block of 4 rows"},
        {2, 1537, 0, 0, 0, 0, 0, "odd cols: v1"},
    };
    static const FwdShape some[] = {
        {5, 256, 0, 0, 2, 2, 1, "v2 explicitly: warp NV 2 / NV 1"},
        {6, 512, 0, 0, 0, 4, 2, "warp NV 4 / NV 2"},
        {2, 4096, 0, 0, 0, 2, 2, "block NV 2: 512 / 256 threads"},
        {2, 2056, 0, 0, 0, 2, 2, "block NV 2, threads not a multiple of the row (288 / 160)"},
        {2, 8192, 0, 0, 0, 4, 2, "block NV 4 / NV 2 (512 threads)"},
        {2, 12288, 0, 0, 0, 8, 4, "block NV 8 / NV 4 (384 threads)"},
        {2, 16384, 0, 0, 0, 8, 4, "v2 at its largest: 512 threads x 32 elements"},
        {2, 16392, 0, 0, 0, -1, -1, "one vector more: v3, the row staged in shared memory"},
        {3, 18432, 0, 0, 0, -1, -1, "hidden 18432: v3 (f32 72 KB: the opt-in)"},
        {1, 40000, 0, 0, 0, -1, -1, "long rows: v3 (f32 160 KB, 16-bit 80 KB)"},
        {1, 59000, 0, 0, 0, 0, -1, "f32 236 KB beyond the 227 KB opt-in: v1; 16-bit 118 KB: v3"},
        {1, 120000, 0, 0, 0, 0, 0, "beyond shared memory (16-bit 240 KB): v1"},
        {2, 16392, 0, 0, 2, 0, 0, "v2 asked for on a row beyond it: v1"},
        {3, 4096, 0, 0, 3, -1, -1, "v3 asked for on a v2 shape"},
        {9, 24, 8, 0, 3, -1, -1, "v3 asked for: short strided rows (3 / 6 of 512 threads busy)"},
        {3, 2056, 0, 0, 3, -1, -1, "v3 asked for: vectors not a multiple of 512"},
        {3, 256, 0, 1, 3, 0, 0, "v3 asked for, misaligned: v1"},
        {3, 256, 0, 1, 0, 0, 0, "misaligned pointers: v1"},
        {3, 256, 1, 0, 0, 0, 0, "aligned base, stride not a vector multiple: v1"},
        {3, 264, 8, 0, 2, 4, 2, "v2 explicitly, strided: f32 warp NV 4, 16-bit NV 2"},
        {2, 4096, 0, 0, 1, 0, 0, "v1 forced on an aligned shape"},
        {1, 1, 0, 0, 0, 0, 0, "1 x 1"},
        {3, 7, 0, 0, 0, 0, 0, "tiny"},
        {1, 8, 0, 0, 0, 1, 1, "one row, 2 / 1 vectors"},
        {1, 4, 0, 0, 0, 1, 0, "one f32 vector; 16-bit: v1"},
        {9, 24, 0, 0, 0, 1, 1, "rows not a multiple of 4 (warp per row)"},
        {5, 24, 8, 0, 1, 0, 0, "v1 forced on a warp-per-row shape"},
        {2, 8192, 0, 0, 2, 4, 2, "v2 explicitly, block per row"},
    };
    // v2's load order by the grid: at most one block per SM order 1, more 2
    static const struct {
        FwdShape s;
        int sm_count, order;
    } order[] = {
        {{1, 4096, 0, 0, 0, 2, 2, "1 SM, 1 row of 512 / 256 threads"}, 1, 1},
        {{4, 4096, 0, 0, 0, 2, 2, "4 SMs, 4 rows of 512 / 256 threads"}, 4, 1},
        {{4, 4096, 0, 0, 0, 2, 2, "1 SM, 4 rows of 512 / 256 threads"}, 1, 2},
        {{4, 256, 0, 0, 0, 2, 1, "1 SM, warp per row: 1 block of 4 rows"}, 1, 1},
        {{64, 256, 0, 0, 2, 2, 1, "1 SM, warp per row, v2 asked for: 16 blocks"}, 1, 2},
        {{20, 4096, 0, 0, -1, 2, 2, "the unfused baseline's norm: the same rule"}, 1, 2},
    };
    uint64_t seed = 1000;
    for (const FwdShape &s : full) fwd_all_combos(s, seed);
    for (const FwdShape &s : some) {
        if (g_long) fwd_all_combos(s, seed);
        else fwd_some_combos(s, seed);
    }
    for (const auto &o : order) fwd_some_combos(o.s, seed, o.sm_count, o.order);
    // Unfused baseline: vectorized steps, scalar steps (odd cols, misaligned).
    static const FwdShape unfused[] = {
        {3, 768, 0, 0, -1, 2, 4, ""}, {5, 24, 8, 0, -1, 1, 1, ""}, {2, 1537, 0, 0, -1, 0, 0, ""},
        {3, 256, 0, 1, -1, 0, 0, ""}, {2, 4096, 0, 0, -1, 2, 2, ""}, {1, 1, 0, 0, -1, 0, 0, ""},
    };
    for (size_t i = 0; i < sizeof unfused / sizeof unfused[0]; ++i) {
        if (i == 0 || g_long) fwd_all_combos(unfused[i], seed);
        else fwd_some_combos(unfused[i], seed);
    }
    // --long: rows > 65535, beyond the unfused steps' gridDim.y (their
    // grid-stride row loop), 16.7 M emulated threads a step.
    if (g_long) {
        FwdCase f;
        f.rows = 65536 + 37;
        f.cols = 8;
        f.act = FP_NORM_ACT_SILU;
        f.res = f.res_out = f.gamma = f.beta = true;
        f.version = -1;
        run_fwd(f, seed++);
    }
    // Large mean, small spread (x in [9999, 10001)): the shifted two-pass
    // variance keeps the digits (v2, and v1 at odd cols).
    for (int64_t cols : {4096, 4095}) {
        FwdCase f;
        f.rows = 4;
        f.cols = cols;
        f.gamma = f.stats = true;
        f.x_lo = 9999.0f;
        f.x_hi = 10001.0f;
        f.expect = fwd_kernel(F32, cols == 4096 ? 2 : 0);
        run_fwd(f, seed++);
    }
}

// v4 (version 4: v2's rows in persistent CTAs, the next row prefetched):
// every v2 row shape (a warp per row NV 1 / 2 / 4, a block per row NV 2 /
// 4, threads not a multiple of the row), rows many times the grid (each CTA
// or warp walks several rows: the prefetch, the alternating reduction
// buffers), the parameters in registers (FP_NORM_VOPT_V4_PARAMS), LayerNorm's
// two reductions (the second buffer), other SM counts, in place; and where v4
// does not apply (f32 NV 8, odd cols, misaligned, past v2): the automatic
// choice. The grid: at most the CTAs that fit the device (the emulation's
// occupancy times its SMs, an unknown count: 1), the fewest that give each
// as many rows as the most loaded one walks.
void test_forward_v4() {
    struct V4Shape {
        int64_t rows, cols, pad;
        int off, sm_count;
        int nv32, nv16;  // v4's NV (0: v4 does not apply)
        int auto32, auto16;  // otherwise the automatic choice's kernel, as FwdShape's nv (v2 NV, 0 v1, -1 v3)
        const char *why;
    };
    static const V4Shape shapes[] = {
        {100, 24, 8, 0, 0, 1, 1, 0, 0, "strided short rows: warp NV 1, 25 blocks of 4 rows on 8 CTAs"},
        {37, 256, 0, 0, 0, 2, 1, 0, 0, "warp NV 2 / NV 1, a partial block of rows"},
        {41, 768, 0, 0, 0, 2, 4, 0, 0, "f32 block NV 2 (96 threads), 16-bit warp NV 4"},
        {13, 4096, 0, 0, 0, 2, 2, 0, 0, "block NV 2 (512 / 256 threads): 4 or 2 CTAs walk 13 rows"},
        {11, 2056, 0, 0, 0, 2, 2, 0, 0, "block NV 2, threads not a multiple of the row (288 / 160)"},
        {7, 8192, 0, 0, 0, 4, 2, 0, 0, "block NV 4 / NV 2 (512 threads)"},
        {6, 12288, 0, 0, 0, 0, 4, 8, 0, "f32 NV 8: v2; 16-bit block NV 4 (384 threads)"},
        {50, 4096, 0, 0, 3, 2, 2, 0, 0, "3 SMs"},
        {9, 4096, 0, 0, 0, 2, 2, 0, 0, "16-bit: 4 CTAs fit, 3 run 3 rows each (not 3, 2, 2, 2)"},
        {3, 4096, 0, 0, 132, 2, 2, 0, 0, "more CTAs fit than rows: a CTA per row"},
        {1, 8, 0, 0, 0, 1, 1, 0, 0, "one row, 2 / 1 vectors"},
        {3, 1537, 0, 0, 0, 0, 0, 0, 0, "odd cols: v1"},
        {3, 256, 0, 1, 0, 0, 0, 0, 0, "misaligned: v1"},
        {2, 16392, 0, 0, 0, 0, 0, -1, -1, "past v2's registers: v3"},
    };
    static const int opts[] = {0, FP_NORM_VOPT_V4_PARAMS, FP_NORM_VOPT_ONE_REDUCTION,
                               FP_NORM_VOPT_V4_PARAMS | FP_NORM_VOPT_ACCURATE_ACT};
    uint64_t seed = 4000;
    for (const V4Shape &sh : shapes)
        for (int oi = 0; oi < 4; ++oi)
            for (int di = 0; di < 3; ++di) {
                const int dt = kDtypes[di], nv = dt == F32 ? sh.nv32 : sh.nv16;
                if (oi && (nv == 0 || sh.sm_count)) continue;  // the options where v4 runs, default SMs
                for (int set = 0; set < 3; ++set) {
                    FwdShape fs = {sh.rows, sh.cols, sh.pad, sh.off, 4 | opts[oi], 0, 0, sh.why};
                    FwdCase f = fwd_case(fs, (int)((seed + set) % 2), dt);
                    f.sm_count = sh.sm_count;
                    if (set == 0) {
                        f.act = 1 + (int)(seed % 4);
                        f.res = f.res_out = f.gamma = f.beta = f.bias = f.stats = true;
                    } else if (set == 2) {
                        f.act = FP_NORM_ACT_SILU;  // in place: out = x, residual_out = residual
                        f.res = f.res_out = f.gamma = f.bias = f.stats = true;
                        f.in_place = true;
                    }
                    if (nv == 0) {
                        const int a = dt == F32 ? sh.auto32 : sh.auto16;
                        f.expect = fwd_kernel(dt, a, 2);
                        if (a > 0) f.expect = f.expect.substr(0, f.expect.size() - 2);  // v2's order: either
                    } else {
                        const bool params = (opts[oi] & FP_NORM_VOPT_V4_PARAMS) && nv <= 2;
                        char b[96];
                        snprintf(b, sizeof b, "norm_fwd_v4<%s, %d, %s>", dt_type(dt), nv, params ? "true" : "false");
                        f.expect = b;
                        const int V = dt == F32 ? 4 : 8, nvec = (int)(sh.cols / V);
                        const bool warp = nvec <= 128;
                        int threads = warp ? 128 : (((nvec + nv - 1) / nv + 31) / 32) * 32, per_sm = 0;
                        (void)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)nullptr, threads, 0);
                        const int64_t units = warp ? (sh.rows + 3) / 4 : sh.rows;  // CTA-rows
                        const int64_t fit = (int64_t)(sh.sm_count > 0 ? sh.sm_count : 1) * per_sm;
                        const int64_t per = (units + fit - 1) / fit;  // the most a CTA walks
                        f.expect_grid = (unsigned)((units + per - 1) / per);
                    }
                    run_fwd(f, seed++);
                }
            }
}

// One pointer misaligned (by one element) at a time, every option on: each
// is in the vectorized kernels' alignment check (v1 runs).
void test_forward_misaligned_one() {
    uint64_t seed = 2000;
    for (int t = kX; t <= kResOut; ++t)
        for (int di = 0; di < 3; ++di)
            for (int version : {0, -1}) {
                FwdCase f;
                f.dt = kDtypes[di];
                f.rows = 3;
                f.cols = 768;
                f.off = 1;
                f.off_mask = 1u << t;
                f.act = FP_NORM_ACT_GELU_ERF;
                f.res = f.res_out = f.gamma = f.beta = f.bias = f.stats = true;
                f.version = version;
                if (version >= 0) f.expect = fwd_kernel(f.dt, 0);
                run_fwd(f, seed++);
            }
}

// out aliasing x, residual_out aliasing residual: as separate buffers
// (checked against the reference with the original inputs).
void test_forward_in_place() {
    static const int64_t shapes[][2] = {{9, 100}, {3, 768}, {2, 4096}, {3, 1537}, {2, 16384}, {2, 20000}};
    uint64_t seed = 3000;
    for (const auto &sh : shapes)
        for (int di = 0; di < 3; ++di)
            for (int version = -1; version <= 3; ++version) {
                FwdCase f;
                f.dt = kDtypes[di];
                f.rows = sh[0];
                f.cols = sh[1];
                f.version = version;
                f.act = 1 + (int)(seed % 4);
                f.res = f.res_out = f.gamma = f.beta = f.stats = true;
                f.in_place = true;
                run_fwd(f, seed++);
                f.res = f.res_out = false;  // out = x alone
                f.kind = RMS;
                run_fwd(f, seed++);
            }
}

// ---- backward --------------------------------------------------------------

enum { kBx, kBdy, kBgamma, kBbeta, kBbias, kBdres, kBdx, kBdgamma, kBdbeta, kBdbias };  // BwdCase::off_mask
struct BwdCase {
    int kind = LN, act = 0, dt = F32;
    int64_t rows = 1, cols = 1, pad = 0;
    int off = 0;              // elements added to the pointers in off_mask (misalignment)
    unsigned off_mask = ~0u;  // bits: kBx ... kBdbias
    bool gamma = false, beta = false, bias = false, dres = false;
    bool dgamma = false, dbeta = false, dbias = false;
    bool in_place = false;  // dx = dout
    int version = 0;        // fp_norm_bwd_launch version; -1: the unfused baseline
    int sm_count = 132;     // passed to the launcher (sizes v3's persistent grid)
    int expect_used = 0;    // fp_norm_bwd_version_used(d, version); 0: not checked
    int expect_used0 = 0;   // fp_norm_bwd_version_used(d, 0) (automatic); 0: not checked
    bool twice = false;     // run again: bit-identical outputs (with parameter gradients)
    std::string expect_dx, expect_dparams;  // kernels that must run ("": not checked)
};

std::string bwd_desc(const BwdCase &b) {
    char s[360];
    snprintf(s, sizeof s,
             "bwd %s v%d %s act=%s %s %lldx%lld pad=%lld off=%d sm=%d gamma=%d beta=%d bias=%d dres=%d dgamma=%d "
             "dbeta=%d dbias=%d%s",
             b.version < 0 ? "unfused" : "fused", b.version < 0 ? 0 : b.version,
             b.kind == LN ? "layernorm" : "rmsnorm", act_name(b.act), dt_name(b.dt), (long long)b.rows,
             (long long)b.cols, (long long)b.pad, b.off, b.sm_count, b.gamma, b.beta, b.bias, b.dres, b.dgamma,
             b.dbeta, b.dbias, b.in_place ? " in-place" : "");
    std::string r = s;
    if (b.off && b.off_mask != ~0u) r += " off_mask=" + std::to_string(b.off_mask);
    return r;
}

// The outputs of one launch (host copies), for the determinism check.
struct BwdOuts {
    std::vector<unsigned char> dx, dg, db, dbi;
};

void run_bwd(const BwdCase &b, uint64_t seed) {
    Check c;
    c.desc = bwd_desc(b);
    const int dt = b.dt;
    const size_t es = esize(dt);
    const int64_t stride = b.cols + b.pad, rows = b.rows, cols = b.cols;
    const size_t tn = (size_t)(rows * stride), vn = (size_t)cols;
    auto mis = [&](int t) { return (b.off_mask >> t & 1u) ? (size_t)b.off * es : 0; };
    Buf x, dy, gamma, beta, bias, dres, mean, rstd, dx, dg, db, dbi, partial;
    fill_random(x, dt, tn, mis(kBx), seed, -2.0f, 3.0f);
    fill_random(dy, dt, tn, mis(kBdy), seed + 1, -1.0f, 1.0f);
    if (b.gamma) fill_random(gamma, dt, vn, mis(kBgamma), seed + 2, 0.5f, 1.5f);
    if (b.beta) fill_random(beta, dt, vn, mis(kBbeta), seed + 3, -0.5f, 0.5f);
    if (b.bias) fill_random(bias, dt, vn, mis(kBbias), seed + 4, -0.3f, 0.3f);
    if (b.dres) fill_random(dres, dt, tn, mis(kBdres), seed + 5, -1.0f, 1.0f);
    const std::vector<unsigned char> dy0 = dy.before;
    // mean / rstd of x, as the forward saved them (f32).
    mean.alloc((size_t)rows * 4, 0);
    rstd.alloc((size_t)rows * 4, 0);
    float *h_mean = reinterpret_cast<float *>(mean.ptr()), *h_rstd = reinterpret_cast<float *>(rstd.ptr());
    auto row_stats = [&](int64_t r) {
        double sum = 0.0, sq = 0.0;
        for (int64_t j = 0; j < cols; ++j) sum += ld(x.ptr(), dt, (size_t)(r * stride + j));
        const double mu = b.kind == LN ? sum / (double)cols : 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            const double t = ld(x.ptr(), dt, (size_t)(r * stride + j)) - mu;
            sq += t * t;
        }
        h_mean[r] = (float)mu;
        h_rstd[r] = (float)(1.0 / std::sqrt(sq / (double)cols + 1e-5));
    };
    for (int64_t r = 0; r < rows; ++r) row_stats(r);
    // ReLU's derivative jumps at y = 0: an element whose pre-activation is
    // within float rounding of 0 may take either side in the kernel (f32 y)
    // and the reference (double y). Such x elements are redrawn (and the
    // row's stats recomputed) until no |y| < 1e-4 is left.
    if (b.act == FP_NORM_ACT_RELU) {
        Rng redraw(seed + 99);
        for (int64_t r = 0; r < rows; ++r)
            for (int round = 0; round < 20; ++round) {
                bool moved = false;
                for (int64_t j = 0; j < cols; ++j) {
                    const size_t i = (size_t)(r * stride + j);
                    double y = (ld(x.ptr(), dt, i) - (b.kind == LN ? h_mean[r] : 0.0f)) * h_rstd[r];
                    if (b.gamma) y *= ld(gamma.ptr(), dt, j);
                    if (b.beta) y += ld(beta.ptr(), dt, j);
                    if (b.bias) y += ld(bias.ptr(), dt, j);
                    if (std::fabs(y) < 1e-4) {
                        st(x.ptr(), dt, i, redraw.uni(-2.0f, 3.0f));
                        moved = true;
                    }
                }
                if (!moved) break;
                row_stats(r);
            }
        x.snapshot();
    }
    mean.snapshot();
    rstd.snapshot();
    Buf *dxb = &dx;
    if (b.in_place) {
        dxb = &dy;
    } else {
        dx.alloc(tn * es, mis(kBdx));
        dx.poison();
    }
    if (b.dgamma) dg.alloc(vn * es, mis(kBdgamma)), dg.poison();
    if (b.dbeta) db.alloc(vn * es, mis(kBdbeta)), db.poison();
    if (b.dbias) dbi.alloc(vn * es, mis(kBdbias)), dbi.poison();

    fp_norm_bwd_desc d;
    memset(&d, 0, sizeof d);
    d.kind = b.kind;
    d.act = b.act;
    d.dtype = dt;
    d.rows = rows;
    d.cols = cols;
    d.dout_stride = d.x_stride = d.dres_stride = d.dx_stride = stride;
    d.dout = dy.ptr();
    d.x = x.ptr();
    d.gamma = gamma.ptr();
    d.beta = beta.ptr();
    d.bias = bias.ptr();
    d.mean = b.kind == LN ? h_mean : nullptr;  // as fp_norm_check_bwd
    d.rstd = h_rstd;
    d.dres = dres.ptr();
    d.dx = dxb->ptr();
    d.dgamma = dg.ptr();
    d.dbeta = db.ptr();
    d.dbias = dbi.ptr();

    if (b.version >= 0 && b.expect_used) {
        const int used = fp_norm_bwd_version_used(&d, b.version);
        if (used != b.expect_used) c.fail("fp_norm_bwd_version_used: %d, expected %d", used, b.expect_used);
    }
    if (b.expect_used0 && fp_norm_bwd_version_used(&d, 0) != b.expect_used0)
        c.fail("fp_norm_bwd_version_used(automatic): %d, expected %d", fp_norm_bwd_version_used(&d, 0),
               b.expect_used0);
    const size_t nfloat = fp_norm_bwd_partial_floats(&d, b.version < 0 ? 2 : b.version, b.sm_count);
    const bool params = b.dgamma || b.dbeta || b.dbias;
    if (params != (nfloat > 0)) c.fail("fp_norm_bwd_partial_floats: %zu", nfloat);
    if (nfloat) partial.alloc(nfloat * 4, 0);
    auto launch = [&](BwdOuts *o) {
        if (partial.base) partial.poison();
        fp_emu::clear_launch_log();
        float *pp = reinterpret_cast<float *>(partial.ptr());
        const cudaError_t err = b.version < 0 ? fp_norm_bwd_unfused_launch(&d, pp, 0)
                                              : fp_norm_bwd_launch(&d, b.version, b.sm_count, pp, 0);
        (void)cudaDeviceSynchronize();
        (void)cudaGetLastError();
        if (err != cudaSuccess) c.fail("launcher returned %d (%s)", (int)err, fp_emu::last_failure());
        check_launches(c, {b.expect_dx, b.expect_dparams});
        if (!partial.guards_ok()) c.fail("partial: written outside its %zu floats", nfloat);
        if (o) {
            o->dx.assign(dxb->ptr(), dxb->ptr() + dxb->bytes);
            if (dg.base) o->dg.assign(dg.ptr(), dg.ptr() + dg.bytes);
            if (db.base) o->db.assign(db.ptr(), db.ptr() + db.bytes);
            if (dbi.base) o->dbi.assign(dbi.ptr(), dbi.ptr() + dbi.bytes);
        }
    };
    BwdOuts first;
    launch(&first);

    // Reference (double): g = dout act'(y), dn = g gamma, dx = rstd (dn -
    // mean(dn) [LayerNorm] - n mean(dn n)) + dres; dgamma = sum g n, dbeta = sum g.
    // The unfused baseline rounds to the dtype (unit roundoff u) what it
    // stores between its steps: g (with an activation), and dx before adding
    // dres. Their errors, random in sign, are allowed per element: dx gets
    // 2 u rstd (|dn| + mean |dn| + |n| mean |dn n|) + u |dx - dres|, the
    // column sums 6 u sqrt(sum of squares) (6 sigma of a random walk).
    const double u = dt == F16 ? 1.0 / 2048 : dt == BF16 ? 1.0 / 256 : 0x1p-24;
    const bool unfused = b.version < 0;
    std::vector<double> r_dx((size_t)(rows * cols)), r_dg(cols, 0.0), r_db(cols, 0.0), xn(cols), dn(cols);
    std::vector<double> e_dx(unfused ? r_dx.size() : 0), q_dg(cols, 0.0), q_db(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
        const double mu = b.kind == LN ? h_mean[r] : 0.0, rs = h_rstd[r];
        double sa = 0.0, sb = 0.0, abs_a = 0.0, abs_b = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            const size_t i = (size_t)(r * stride + j);
            const double v = (ld(x.ptr(), dt, i) - mu) * rs;
            const double gam = b.gamma ? ld(gamma.ptr(), dt, j) : 1.0;
            const double y = v * gam + (b.beta ? ld(beta.ptr(), dt, j) : 0.0) + (b.bias ? ld(bias.ptr(), dt, j) : 0.0);
            const double g = ld(dy0.data(), dt, i) * dact_d(b.act, y);
            r_dg[j] += g * v;
            r_db[j] += g;
            q_dg[j] += g * v * g * v;
            q_db[j] += g * g;
            xn[j] = v;
            dn[j] = g * gam;
            sa += dn[j];
            sb += dn[j] * v;
            abs_a += std::fabs(dn[j]);
            abs_b += std::fabs(dn[j] * v);
        }
        const double a = b.kind == LN ? sa / (double)cols : 0.0, bb = sb / (double)cols;
        for (int64_t j = 0; j < cols; ++j) {
            double v = rs * (dn[j] - a - xn[j] * bb);
            if (unfused) {
                double e = u * std::fabs(v);
                if (b.act != FP_NORM_ACT_NONE)
                    e += 2.0 * u * rs *
                         (std::fabs(dn[j]) + abs_a / (double)cols + std::fabs(xn[j]) * abs_b / (double)cols);
                e_dx[(size_t)(r * cols + j)] = e;
            }
            if (b.dres) v += ld(dres.ptr(), dt, (size_t)(r * stride + j));
            r_dx[(size_t)(r * cols + j)] = v;
        }
    }
    std::vector<double> e_dg(unfused ? cols : 0), e_db(unfused ? cols : 0);
    for (int64_t j = 0; unfused && b.act != FP_NORM_ACT_NONE && j < cols; ++j) {
        e_dg[j] = 6.0 * u * std::sqrt(q_dg[j]);
        e_db[j] = 6.0 * u * std::sqrt(q_db[j]);
    }
    // As tests/norm/norm_test_util.h (nt_bwd_tolerance): f32 row sums in dx
    // (~cols x 2^-24 relative into a difference of O(1) terms), f32 column
    // sums of rows terms of size <= ~4 in dgamma / dbeta.
    double atol, rtol;
    tolerance(dt, &atol, &rtol);
    const double dx_atol = atol + 4.0 * (double)cols * 6e-8, p_atol = atol + 4.0 * (double)rows * 6e-8 * 4.0;
    compare(c, "dx", *dxb, dt, rows, cols, stride, r_dx, dx_atol, rtol, unfused ? &e_dx : nullptr);
    if (b.dgamma) compare(c, "dgamma", dg, dt, 1, cols, cols, r_dg, p_atol, rtol, unfused ? &e_dg : nullptr);
    if (b.dbeta) compare(c, "dbeta", db, dt, 1, cols, cols, r_db, p_atol, rtol, unfused ? &e_db : nullptr);
    if (b.dbias) compare(c, "dbias", dbi, dt, 1, cols, cols, r_db, p_atol, rtol, unfused ? &e_db : nullptr);
    check_input(c, "x", x);
    if (!b.in_place) check_input(c, "dout", dy);
    check_input(c, "gamma", gamma);
    check_input(c, "beta", beta);
    check_input(c, "bias", bias);
    check_input(c, "dresidual_out", dres);
    check_input(c, "mean", mean);
    check_input(c, "rstd", rstd);

    // Determinism of the parameter gradients (partial sums reduced in a
    // fixed order): a second run on freshly poisoned outputs, bit-identical,
    // dx too (dx aliasing dout has consumed its input: not rerun).
    if (b.twice && params && b.version >= 0 && !b.in_place && c.errors == 0) {
        dx.poison();
        if (dg.base) dg.poison();
        if (db.base) db.poison();
        if (dbi.base) dbi.poison();
        BwdOuts second;
        launch(&second);
        if (second.dx != first.dx) c.fail("dx differs between two runs");
        if (second.dg != first.dg) c.fail("dgamma differs between two runs");
        if (second.db != first.db) c.fail("dbeta differs between two runs");
        if (second.dbi != first.dbi) c.fail("dbias differs between two runs");
    }
    finish(c);
}

// A backward shape and the kernels it must run. f32 / 16-bit: nv = dx v2's
// NV (0: v2 does not apply, -1: dx staged, version 2's kernel for rows past
// v2's registers), v3 = v3's mode ('r' register sums, 's'
// shared-memory sums, 't' staged row; 0: v3 does not apply; v3 uses dx v2's NV).
struct BwdShape {
    int64_t rows, cols, pad;
    int off;
    int nv32, nv16;
    char v3_32, v3_16;
    const char *why;
};

// The version a request runs and the kernels it must launch.
void bwd_expect(BwdCase &b, const BwdShape &s) {
    const bool f32 = b.dt == F32;
    const int V = f32 ? 4 : 8, nv = f32 ? s.nv32 : s.nv16;
    const char m = f32 ? s.v3_32 : s.v3_16;
    const bool params = b.dgamma || b.dbeta || b.dbias;
    const bool vec = s.off == 0 && s.cols % V == 0 && (s.cols + s.pad) % V == 0;  // bwd_vectorizable
    // v4 (the prefetch ring): v3's register-sum mode where the ring fits the
    // device's opt-in shared memory (less the kernel's static 128 bytes)
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    const fp_norm_v3_plan plan = fp_norm_v3_plan_for(s.cols, V);
    const bool ring_fits = fp_norm_v4_smem_bytes(&plan, s.cols, (size_t)(16 / V), b.dres ? 3 : 2) + 128 <=
                           (size_t)optin;
    int used;
    if (b.version == 1) used = 1;
    else if ((b.version == 4 || (b.version == 0 && params && b.dres)) && m == 'r' && ring_fits) used = 4;
    else if ((b.version == 3 || b.version == 4 || (b.version == 0 && params)) && m) used = 3;
    else used = nv ? 2 : 1;
    b.expect_used = b.version >= 0 ? used : 0;
    // Automatic: v3 for parameter gradients, else v2. (For the unfused
    // baseline the shape describes its norm step, not d: not checked.)
    // Automatic: v4 where parameter gradients and a dresidual are given and
    // the ring fits, else v3 for parameter gradients, else v2.
    b.expect_used0 = b.version < 0                              ? 0
                     : params && b.dres && m == 'r' && ring_fits ? 4
                     : params && m                               ? 3
                     : nv                                        ? 2
                                                                 : 1;
    const char *T = dt_type(b.dt);
    char k[128];
    if (used == 4) {
        snprintf(k, sizeof k, "norm_bwd_v3<%s, %d, false, %d>", T, nv, (int)FP_NORM_V4_RING_STAGES);
    } else if (used == 3) {
        if (m == 't') snprintf(k, sizeof k, "norm_bwd_v3_staged<%s, %d>", T, nv);
        else snprintf(k, sizeof k, "norm_bwd_v3<%s, %d, %s, 0>", T, nv, m == 's' ? "true" : "false");
    } else if (used == 2 && nv < 0) {
        snprintf(k, sizeof k, "norm_bwd_dx_staged<%s>", T);
    } else if (used == 2) {
        snprintf(k, sizeof k, "norm_bwd_dx_v2<%s, %d>", T, nv);
    } else {
        snprintf(k, sizeof k, "norm_bwd_dx_v1<%s>", T);
    }
    b.expect_dx = k;
    b.expect_dparams.clear();
    if (params) {
        if (used >= 3) snprintf(k, sizeof k, "norm_bwd_reduce_v2<%s>", T);
        else  // dparams v1 when asked for (version 1) or not aligned; v2 beside dx v1 on rows > 16384 cols
            snprintf(k, sizeof k, "norm_bwd_dparams<%s, %d>", T, (b.version == 1 || !vec) ? 1 : V);
        b.expect_dparams = k;
    }
}

// Option set opt (0..3), as nt_bwd_case_opt: bit 0 gamma, beta, bias and
// dbeta; bit 1 dresidual_out; dgamma unless opt == 2 (opt 2: no parameter
// gradients at all); dbias when opt == 3.
void bwd_opts(BwdCase &b, int opt) {
    b.gamma = b.beta = b.bias = opt & 1;
    b.dres = (opt >> 1) & 1;
    b.dgamma = opt != 2;
    b.dbeta = opt & 1;
    b.dbias = opt == 3;
}

BwdCase bwd_case(const BwdShape &s, int kind, int act, int dt, int opt, int version) {
    BwdCase b;
    b.kind = kind;
    b.act = act;
    b.dt = dt;
    b.rows = s.rows;
    b.cols = s.cols;
    b.pad = s.pad;
    b.off = s.off;
    b.version = version;
    bwd_opts(b, opt);
    bwd_expect(b, s);
    return b;
}

// Every kind x activation x dtype x option set x version (1-4, unfused;
// version 0 runs the kernels of 2 or 3, which each case checks it picks by
// fp_norm_bwd_version_used; --long runs it too).
void bwd_all_combos(const BwdShape &s, uint64_t &seed) {
    for (int kind = 0; kind < 2; ++kind)
        for (int act = 0; act < kActs; ++act)
            for (int di = 0; di < 3; ++di)
                for (int opt = 0; opt < 4; ++opt)
                    for (int version = -1; version <= 4; ++version)
                        if (version != 0 || g_long) {
                            BwdCase b = bwd_case(s, kind, act, kDtypes[di], opt, version);
                            b.twice = g_long;  // the other sets check determinism at every shape
                            run_bwd(b, seed++);
                        }
}

// Per dtype and version: everything on (LayerNorm, an activation, every
// gradient); RMSNorm with no parameter gradients; and one of dbeta / dbias
// alone (kernels that write or reduce only the requested halves of the
// partial sums), alternating.
void bwd_some_combos(const BwdShape &s, uint64_t &seed, int sm_count = 132, int first_version = -1) {
    for (int di = 0; di < 3; ++di)
        for (int version = first_version; version <= 4; ++version)
            for (int set = 0; set < 3; ++set) {
                if (set == 2 && version < 2 && !g_long) continue;  // v1's dparams: v2's code at width 1
                BwdCase b = set == 0   ? bwd_case(s, LN, 1 + (int)(seed % 4), kDtypes[di], 3, version)
                            : set == 1 ? bwd_case(s, RMS, FP_NORM_ACT_NONE, kDtypes[di], 2, version)
                                       : bwd_case(s, LN, FP_NORM_ACT_RELU, kDtypes[di], 1, version);
                if (set == 2) {
                    b.dgamma = false;
                    b.dbeta = (seed & 1) != 0;
                    b.dbias = !b.dbeta;
                    bwd_expect(b, s);
                }
                b.sm_count = sm_count;
                b.twice = true;
                run_bwd(b, seed++);
            }
}

void test_backward() {
    static const BwdShape full[] = {
        {7, 24, 8, 0, 1, 1, 'r', 'r', "strided, warp per row NV 1; 7 rows: a partial CTA of 4"},
        {5, 256, 0, 0, 2, 1, 'r', 'r', "warp per row NV 2 / NV 1"},
        {3, 768, 0, 0, 2, 4, 'r', 'r', "f32 block per row (register sums); 16-bit warp NV 4"},
        {3, 37, 0, 0, 0, 0, 0, 0, "odd cols: v1"},
    };
    static const BwdShape some[] = {
        {3, 1537, 0, 0, 0, 0, 0, 0, "odd cols: v1 (49 dparams tiles)"},
        {6, 512, 0, 0, 4, 2, 'r', 'r', "warp per row NV 4 / NV 2"},
        {2, 4096, 0, 0, 2, 2, 'r', 'r', "block per row NV 2 (512 / 256 threads)"},
        {2, 2056, 0, 0, 2, 2, 'r', 'r', "block per row, threads past the row's vectors (288 / 160)"},
        {2, 8192, 0, 0, 4, 2, 'r', 'r', "block per row NV 4 / NV 2 (512 threads, 16 register sums)"},
        {2, 9000, 0, 0, 8, 4, 's', 's', "shared-memory sums, 288 threads"},
        {2, 12288, 0, 0, 8, 4, 's', 's', "shared-memory sums at 384 threads"},
        {2, 12296, 0, 0, 8, 4, 't', 't', "staged row, 416 threads"},
        {2, 16384, 0, 0, 8, 4, 't', 't', "staged row, 512 threads"},
        {2, 16392, 0, 0, -1, -1, 0, 0, "beyond v2 and v3: dx staged, dparams v2"},
        {3, 18432, 0, 0, -1, -1, 0, 0, "hidden 18432: dx staged (f32 147 KB, 16-bit 74 KB)"},
        {1, 40000, 0, 0, 0, -1, 0, 0, "long rows: f32 320 KB: v1; 16-bit 160 KB: dx staged"},
        {1, 60000, 0, 0, 0, 0, 0, 0, "beyond shared memory (16-bit 240 KB): v1"},
        {3, 256, 0, 1, 0, 0, 0, 0, "misaligned pointers: v1"},
        {3, 256, 1, 0, 0, 0, 0, 0, "stride not a vector multiple: v1"},
        {1, 1, 0, 0, 0, 0, 0, 0, "1 x 1"},
        {3, 7, 0, 0, 0, 0, 0, 0, "tiny"},
        {1, 8, 0, 0, 1, 1, 'r', 'r', "one row of 2 / 1 vectors"},
        {1, 4, 0, 0, 1, 0, 'r', 0, "one f32 vector; 16-bit: v1"},
    };
    uint64_t seed = 5000;
    if (g_long) {  // rows > 65535: the unfused steps' grid-stride row loop (see test_forward)
        const BwdShape s = {65536 + 37, 8, 0, 0, 1, 1, 'r', 'r', ""};
        run_bwd(bwd_case(s, LN, FP_NORM_ACT_GELU_TANH, F32, 3, -1), seed++);
    }
    for (const BwdShape &s : full) bwd_all_combos(s, seed);
    for (const BwdShape &s : some) {
        if (s.cols == 40000 && !g_long) continue;  // 1250 dparams v1 blocks of 256 threads: seconds
        if (g_long) bwd_all_combos(s, seed);
        else bwd_some_combos(s, seed);
    }
}

// Restores the default emulated device when it goes out of scope.
struct DeviceScope {
    fp_emu::DeviceProfile saved = fp_emu::device();
    explicit DeviceScope(const fp_emu::DeviceProfile &p) { fp_emu::set_device(p); }
    ~DeviceScope() { fp_emu::set_device(saved); }
};

// v3's persistent grid with more row groups than CTAs (a 2-SM device: grid
// <= 4 CTAs), and dparams v1/v2 over several row chunks (rows > 32 x ...).
void test_backward_persistent() {
    fp_emu::DeviceProfile p = fp_emu::device();
    p.sm_count = 2;
    DeviceScope scope(p);
    static const BwdShape shapes[] = {
        {37, 24, 8, 0, 1, 1, 'r', 'r', "warp per row: 10 row groups, the last partial"},
        {37, 512, 0, 0, 4, 2, 'r', 'r', "warp per row NV 4 / NV 2"},
        {21, 768, 0, 0, 2, 4, 'r', 'r', "f32 block per row, 16-bit warp NV 4"},
        {9, 4096, 0, 0, 2, 2, 'r', 'r', "block per row"},
        {9, 9000, 0, 0, 8, 4, 's', 's', "shared-memory sums"},
        {5, 16384, 0, 0, 8, 4, 't', 't', "staged row (1 CTA per SM)"},
        {100, 256, 0, 0, 2, 1, 'r', 'r', "dparams: 4 row chunks"},
        {100, 100, 0, 0, 0, 0, 0, 0, "16-bit v1, dparams v1: 4 chunks (f32: warp NV 1)"},
    };
    uint64_t seed = 7000;
    for (BwdShape s : shapes) {
        if (s.cols == 100) s.nv32 = 1, s.v3_32 = 'r';
        if (g_long) s.rows *= 4;
        bwd_some_combos(s, seed, 2, g_long ? -1 : 1);  // v0 = v3, the unfused norm step = v2
    }
}

// v3 where the opt-in shared memory is smaller: an A100 (163 KB: the staged
// row of 16384 16-bit cols, 160 KB, still fits) and a 99 KB device (sm_86:
// the staged row does not fit, v3 falls back to v2; the 96 KB shared-memory
// sums of 12288 cols do).
void test_backward_devices() {
    uint64_t seed = 8000;
    {
        fp_emu::DeviceProfile p = {8, 0, 108, 1024, 2048, 48 * 1024, 163 * 1024, 164 * 1024, 65536};
        DeviceScope scope(p);
        for (int di = 0; di < 3; ++di) {
            const BwdShape s = {3, 16384, 0, 0, 8, 4, 't', 't', ""};
            BwdCase b = bwd_case(s, LN, FP_NORM_ACT_GELU_TANH, kDtypes[di], 3, 3);
            b.sm_count = 108;
            b.twice = true;
            run_bwd(b, seed++);
            const BwdShape w = {2, 18432, 0, 0, -1, -1, 0, 0, "dx staged: f32 147 KB fits 163 KB"};
            b = bwd_case(w, LN, FP_NORM_ACT_GELU_TANH, kDtypes[di], 3, 2);
            b.sm_count = 108;
            run_bwd(b, seed++);
        }
    }
    {
        fp_emu::DeviceProfile p = {8, 6, 84, 1024, 1536, 48 * 1024, 99 * 1024, 100 * 1024, 65536};
        DeviceScope scope(p);
        const BwdShape shapes[] = {{3, 16384, 0, 0, 8, 4, 0, 0, "staged row beyond the opt-in: v2"},
                                   {3, 12288, 0, 0, 8, 4, 's', 's', "96 KB of sums: v3"},
                                   {2, 18432, 0, 0, 0, -1, 0, 0, "dx staged: f32 147 KB beyond: v1; 16-bit 74 KB"}};
        for (const BwdShape &s : shapes)
            for (int di = 0; di < 3; ++di)
                for (int version : {0, 3}) {
                    BwdCase b = bwd_case(s, RMS, FP_NORM_ACT_SILU, kDtypes[di], 1, version);
                    b.sm_count = 84;
                    run_bwd(b, seed++);
                }
    }
}

// Forward v3 where the opt-in shared memory is smaller: an A100 (163 KB: a
// staged f32 row of 40000 cols, 160 KB, fits) and a 99 KB device (it does
// not: v1; the 16-bit row, 80 KB, still takes v3).
void test_forward_devices() {
    uint64_t seed = 8500;
    const fp_emu::DeviceProfile a100 = {8, 0, 108, 1024, 2048, 48 * 1024, 163 * 1024, 164 * 1024, 65536};
    const fp_emu::DeviceProfile sm86 = {8, 6, 84, 1024, 1536, 48 * 1024, 99 * 1024, 100 * 1024, 65536};
    for (int dev = 0; dev < 2; ++dev) {
        DeviceScope scope(dev == 0 ? a100 : sm86);
        for (int di = 0; di < 3; ++di) {
            FwdCase f;
            f.dt = kDtypes[di];
            f.rows = 2;
            f.cols = 40000;
            f.act = FP_NORM_ACT_GELU_TANH;
            f.res = f.res_out = f.gamma = f.beta = f.stats = true;
            f.expect = fwd_kernel(f.dt, (f.dt == F32 && dev == 1) ? 0 : -1);
            run_fwd(f, seed++);
        }
    }
}

// dx aliasing dout (documented as allowed) for every version and dx kernel
// mode: versions 1 and 2 re-read dout for dgamma/dbeta, so that pass must
// run before dx is written.
void test_backward_in_place() {
    fp_emu::DeviceProfile p = fp_emu::device();
    p.sm_count = 2;
    DeviceScope scope(p);
    static const BwdShape shapes[] = {
        {9, 100, 0, 0, 1, 0, 'r', 0, ""},         {7, 24, 8, 0, 1, 1, 'r', 'r', ""},
        {3, 768, 0, 0, 2, 4, 'r', 'r', ""},       {2, 4096, 0, 0, 2, 2, 'r', 'r', ""},
        {2, 12288, 0, 0, 8, 4, 's', 's', ""},     {5, 16384, 0, 0, 8, 4, 't', 't', ""},
        {3, 1537, 0, 0, 0, 0, 0, 0, ""},          {2, 20000, 0, 0, -1, -1, 0, 0, ""},
    };
    uint64_t seed = 9000;
    for (const BwdShape &s : shapes)
        for (int di = 0; di < 3; ++di)
            for (int version = -1; version <= 4; ++version) {
                BwdCase b = bwd_case(s, version & 1 ? LN : RMS, version & 1 ? FP_NORM_ACT_GELU_ERF : FP_NORM_ACT_NONE,
                                     kDtypes[di], 1, version);
                b.in_place = true;
                b.sm_count = 2;
                run_bwd(b, seed++);
            }
}

// One pointer misaligned (by one element) at a time, every option on: the
// tensors and vectors the kernels load or store by 16 bytes send every
// version to v1; the parameter gradients (written by the scalar reduce) do not.
void test_backward_misaligned_one() {
    uint64_t seed = 9500;
    for (int t = kBx; t <= kBdbias; ++t)
        for (int di = 0; di < 3; ++di)
            for (int version : {2, 3, 4, -1}) {
                // The unfused norm step drops beta, bias, dresidual_out and
                // (after the activation step) reads dx for dout.
                const bool vec_ptr = version >= 0 ? t <= kBdx : (t == kBx || t == kBgamma || t == kBdx);
                const BwdShape s = vec_ptr ? BwdShape{3, 768, 0, 1, 0, 0, 0, 0, ""}
                                           : BwdShape{3, 768, 0, 0, 2, 4, 'r', 'r', ""};
                BwdCase b = bwd_case(s, LN, FP_NORM_ACT_SILU, kDtypes[di], 3, version);
                b.off = 1;
                b.off_mask = 1u << t;
                run_bwd(b, seed++);
            }
}

// Launcher errors: parameter gradients without a partial buffer, or with a
// misaligned one (v3 stores float4): refused before any launch, nothing written.
void test_backward_errors() {
    const int64_t rows = 4, cols = 256;
    Buf x, dy, rstd, dx, dg;
    fill_random(x, F32, rows * cols, 0, 1, -2.0f, 3.0f);
    fill_random(dy, F32, rows * cols, 0, 2, -1.0f, 1.0f);
    fill_random(rstd, F32, rows, 0, 3, 0.5f, 1.0f);
    dx.alloc(rows * cols * 4, 0);
    dx.poison();
    dg.alloc(cols * 4, 0);
    dg.poison();
    fp_norm_bwd_desc d;
    memset(&d, 0, sizeof d);
    d.kind = RMS;
    d.dtype = F32;
    d.rows = rows;
    d.cols = cols;
    d.dout_stride = d.x_stride = d.dres_stride = d.dx_stride = cols;
    d.dout = dy.ptr();
    d.x = x.ptr();
    d.rstd = reinterpret_cast<const float *>(rstd.ptr());
    d.dx = dx.ptr();
    d.dgamma = dg.ptr();
    std::vector<float> partial(fp_norm_bwd_partial_floats(&d, 3, 132) + 8);
    float *mis = reinterpret_cast<float *>(((uintptr_t)partial.data() + 15) / 16 * 16 + 4);
    struct {
        int version;
        float *partial;
        const char *what;
    } cases[] = {{3, nullptr, "v3 without partial"}, {3, mis, "v3 with a misaligned partial"},
                 {2, nullptr, "v2 without partial"}, {1, nullptr, "v1 without partial"}};
    for (const auto &e : cases) {
        Check c;
        c.desc = std::string("bwd error: ") + e.what;
        fp_emu::clear_launch_log();
        const cudaError_t err = fp_norm_bwd_launch(&d, e.version, 132, e.partial, 0);
        (void)cudaDeviceSynchronize();
        (void)cudaGetLastError();
        if (err != cudaErrorInvalidValue) c.fail("returned %d, expected cudaErrorInvalidValue", (int)err);
        if (!fp_emu::launch_log().empty()) c.fail("%zu kernels launched", fp_emu::launch_log().size());
        if (!dx.unchanged() || !dg.unchanged()) c.fail("an output was written");
        finish(c);
    }
}

}  // namespace

int main(int argc, char **argv) {
    const char *env = getenv("FP_NORM_EMU_LONG");
    g_long = (argc > 1 && strcmp(argv[1], "--long") == 0) || (env && *env && *env != '0');
    const auto t0 = std::chrono::steady_clock::now();
    auto lap = [&](const char *what) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("%-28s %6ld cases, %4ld failed, %8.2f s\n", what, g_cases, g_failed, s);
        fflush(stdout);
    };
    test_forward();
    lap("forward");
    test_forward_misaligned_one();
    lap("forward one misaligned");
    test_forward_in_place();
    lap("forward in place");
    test_forward_v4();
    lap("forward v4");
    test_forward_devices();
    lap("forward other devices");
    test_backward();
    lap("backward");
    test_backward_persistent();
    lap("backward persistent grid");
    test_backward_devices();
    lap("backward other devices");
    test_backward_misaligned_one();
    lap("backward one misaligned");
    test_backward_in_place();
    lap("backward in place");
    test_backward_errors();
    lap("backward errors");
    printf("test_norm_emu: %ld cases, %ld failed, %ld launches\n", g_cases, g_failed, fp_emu::launches());
    return g_failed ? 1 : 0;
}
