/* Fused norm on a CPU context: every option combination against the double
 * reference, odd shapes, strides and misaligned pointers, the unfused
 * baseline through validate, backward against the reference backward and a
 * finite-difference check, determinism over thread counts, and bad input. */
#include "norm/norm_cpu_simd.h"
#include "norm_test_util.h"

static void test_forward_combos(fp_context *ctx) {
    nt_fwd_all_combos(ctx, 5, 37, 0, 0, -1, 100);
    nt_fwd_all_combos(ctx, 4, 64, 3, 1, -1, 20000);
}

static void test_forward_shapes(fp_context *ctx) {
    static const int64_t shapes[][3] = {{1, 1, 0}, {3, 3, 0}, {2, 1, 5}, {333, 1537, 0}, {17, 4096, 8},
                                        {2, 40000, 0}, {64, 768, 0}};
    nt_fwd_shapes(ctx, shapes, sizeof shapes / sizeof shapes[0], FP_NORM_ACT_GELU_TANH, 7);
}

/* A large mean over a small spread: E[x^2] - E[x]^2 in f32 would lose every
 * digit of the variance; the two-pass variance keeps it. */
static void test_stable_variance(fp_context *ctx) {
    norm_case c = nt_large_mean_case();
    nt_run_fwd(ctx, &c, 99, -1);
}

static void test_in_place(fp_context *ctx) {
    nt_in_place(ctx, FP_F32, 9, 100, FP_NORM_ACT_RELU);
    nt_in_place(ctx, FP_BF16, 5, 333, FP_NORM_ACT_GELU_ERF);
}

static void test_validate(fp_context *ctx) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.warmup = 1;
    cfg.min_samples = 3;
    cfg.max_samples = 10;
    cfg.max_time_s = 0.05;
    for (int di = 0; di < 3; ++di)
        for (int variant = 0; variant < 3; ++variant) {
            const int64_t rows = 64, cols = 333;
            const fp_dtype dt = dts[di];
            const size_t es = fp_dtype_size(dt), n = (size_t)(rows * cols);
            void *x = nt_random(dt, n, 5 + di, -2, 3), *res = nt_random(dt, n, 6, -1, 1);
            void *g = nt_random(dt, cols, 7, 0.5f, 1.5f), *b = nt_random(dt, cols, 8, -0.5f, 0.5f);
            void *bias = nt_random(dt, cols, 9, -0.2f, 0.2f);
            void *out = malloc(n * es), *ro = malloc(n * es);
            float mean[64], rstd[64];
            memset(out, 0xAB, n * es);
            fp_norm_params p;
            nt_fwd_params(&p, dt, rows, cols, variant == 0 ? FP_NORM_ACT_NONE : FP_NORM_ACT_GELU_ERF);
            p.kind = variant == 2 ? FP_NORM_RMSNORM : FP_NORM_LAYERNORM;
            p.x = x;
            p.out = out;
            if (variant >= 1) {
                p.residual = res;
                p.residual_out = ro;
                p.gamma = g;
                p.beta = b;
                p.bias = bias;
                p.mean = mean;
                p.rstd = rstd;
            }
            fp_ab_report rep;
            CHECK_OK(fp_norm_validate(ctx, NULL, &p, &cfg, &rep));
            CHECK_MSG(rep.compared && rep.agreement.passed, "validate %s variant %d: %zu mismatches, max abs %g",
                      fp_dtype_name(dt), variant, rep.agreement.mismatches, rep.agreement.max_abs_err);
            CHECK(rep.baseline.samples >= 3 && rep.optimized.samples >= 3);
            /* validate writes only its scratch */
            unsigned char *o = out;
            int untouched = 1;
            for (size_t i = 0; i < n * es; ++i) untouched &= o[i] == 0xAB;
            CHECK(untouched);
            /* out may be NULL for validate */
            p.out = NULL;
            CHECK_OK(fp_norm_validate(ctx, NULL, &p, &cfg, &rep));
            free(x); free(res); free(g); free(b); free(bias); free(out); free(ro);
        }
}

static void test_backward_validate(fp_context *ctx) {
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.warmup = 1;
    cfg.min_samples = 3;
    cfg.max_samples = 10;
    cfg.max_time_s = 0.05;
    nt_bwd_validate_dtypes(ctx, 40, 257, 40, 256, &cfg, 0);
}

static void test_backward_combos(fp_context *ctx) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    static const int64_t shapes[][3] = {{6, 37, 0}, {70, 300, 5}, {3, 1, 0}};
    uint64_t seed = 500;
    for (size_t s = 0; s < 3; ++s)
        for (int kind = 0; kind < 2; ++kind)
            for (int act = 0; act <= FP_NORM_ACT_SILU; ++act)
                for (int di = 0; di < 3; ++di)
                    for (int opt = 0; opt < 4; ++opt) {
                        norm_bwd_case c = nt_bwd_case_opt((fp_norm_kind)kind, (fp_norm_activation)act, dts[di],
                                                          shapes[s][0], shapes[s][1], shapes[s][2], (int)s & 1, opt);
                        nt_run_bwd(ctx, &c, seed++);
                    }
}

/* Loss L = sum(out * w); checks dx, dgamma, dbeta of the op's backward
 * against central differences of the op's own forward, f32. */
static double fd_loss(fp_context *ctx, fp_norm_params *p, const float *w, float *out, size_t n) {
    CHECK_OK(fp_norm_forward(ctx, NULL, p));
    double l = 0.0;
    for (size_t i = 0; i < n; ++i) l += (double)out[i] * (double)w[i];
    return l;
}

static void test_finite_differences(fp_context *ctx) {
    for (int kind = 0; kind < 2; ++kind)
        for (int act = 0; act <= FP_NORM_ACT_SILU; ++act) {
            if (act == FP_NORM_ACT_RELU) continue; /* kink at 0: differences are not derivatives there */
            const int64_t rows = 3, cols = 7;
            const size_t n = (size_t)(rows * cols);
            float x[21], res[21], g[7], b[7], bias[7], w[21], out[21], s[21], mean[3], rstd[3];
            float dx[21], dg[7], db[7];
            fp_test_fill(x, n, 11 + act, -2, 2);
            fp_test_fill(res, n, 12, -1, 1);
            fp_test_fill(g, 7, 13, 0.5f, 1.5f);
            fp_test_fill(b, 7, 14, -0.5f, 0.5f);
            fp_test_fill(bias, 7, 15, -0.3f, 0.3f);
            fp_test_fill(w, n, 16, -1, 1);
            fp_norm_params p;
            fp_norm_params_default(&p);
            p.kind = (fp_norm_kind)kind;
            p.activation = (fp_norm_activation)act;
            p.rows = rows;
            p.cols = cols;
            p.x = x;
            p.residual = res;
            p.residual_out = s;
            p.gamma = g;
            p.beta = b;
            p.bias = bias;
            p.out = out;
            p.mean = mean;
            p.rstd = rstd;
            fd_loss(ctx, &p, w, out, n);
            fp_norm_backward_params bp;
            fp_norm_backward_params_default(&bp);
            bp.kind = p.kind;
            bp.activation = p.activation;
            bp.rows = rows;
            bp.cols = cols;
            bp.dout = w;
            bp.x = s;
            bp.gamma = g;
            bp.beta = b;
            bp.bias = bias;
            bp.mean = mean;
            bp.rstd = rstd;
            bp.dx = dx;
            bp.dgamma = dg;
            bp.dbeta = db;
            CHECK_OK(fp_norm_backward(ctx, NULL, &bp));
            /* Copies so that the saved stats above are not overwritten. */
            p.residual_out = NULL;
            p.mean = p.rstd = NULL;
            const float h = 1e-2f;
            struct { float *v; const float *grad; int n; const char *name; } vars[] = {
                {x, dx, 21, "x"}, {res, dx, 21, "residual"}, {g, dg, 7, "gamma"}, {b, db, 7, "beta"},
                {bias, db, 7, "bias"}};
            for (size_t k = 0; k < sizeof vars / sizeof vars[0]; ++k)
                for (int i = 0; i < vars[k].n; ++i) {
                    float keep = vars[k].v[i];
                    vars[k].v[i] = keep + h;
                    double lp = fd_loss(ctx, &p, w, out, n);
                    vars[k].v[i] = keep - h;
                    double lm = fd_loss(ctx, &p, w, out, n);
                    vars[k].v[i] = keep;
                    double fd = (lp - lm) / (2.0 * h), an = vars[k].grad[i];
                    CHECK_MSG(fabs(fd - an) <= 5e-3 + 5e-3 * fabs(fd), "%s act %s: d%s[%d] analytic %.6g fd %.6g",
                              fp_norm_kind_name(p.kind), fp_norm_activation_name(p.activation), vars[k].name, i,
                              an, fd);
                }
        }
}

/* dgamma/dbeta must not depend on the worker count. */
static void test_backward_deterministic(void) {
    const int64_t rows = 300, cols = 129;
    const size_t n = (size_t)(rows * cols);
    float *x = malloc(n * 4), *dy = malloc(n * 4), *dx = malloc(n * 4), mean[300], rstd[300];
    float g[129], dg1[129], db1[129], dg2[129], db2[129];
    fp_test_fill(x, n, 3, -2, 2);
    fp_test_fill(dy, n, 4, -1, 1);
    fp_test_fill(g, (size_t)cols, 5, 0.5f, 1.5f);
    for (int64_t r = 0; r < rows; ++r) {
        mean[r] = 0.1f;
        rstd[r] = 1.2f;
    }
    for (int t = 0; t < 2; ++t) {
        fp_context *ctx = NULL;
        CHECK_OK(fp_context_create(FP_DEVICE_CPU, -1, &ctx));
        CHECK_OK(fp_context_set_option(ctx, FP_CTX_CPU_THREADS, t ? 5 : 1));
        fp_norm_backward_params bp;
        fp_norm_backward_params_default(&bp);
        bp.activation = FP_NORM_ACT_GELU_ERF;
        bp.rows = rows;
        bp.cols = cols;
        bp.dout = dy;
        bp.x = x;
        bp.gamma = g;
        bp.mean = mean;
        bp.rstd = rstd;
        bp.dx = dx;
        bp.dgamma = t ? dg2 : dg1;
        bp.dbeta = t ? db2 : db1;
        CHECK_OK(fp_norm_backward(ctx, NULL, &bp));
        fp_context_destroy(ctx);
    }
    CHECK(memcmp(dg1, dg2, sizeof dg1) == 0);
    CHECK(memcmp(db1, db2, sizeof db1) == 0);
    free(x); free(dy); free(dx);
}

/* Bad input: the right status, the argument named, outputs untouched. */
#define EXPECT_BAD(ctx, p, name)                                                             \
    do {                                                                                     \
        memset(out, 0x5A, sizeof out);                                                       \
        CHECK_STATUS(fp_norm_forward((ctx), NULL, &(p)), FP_ERR_INVALID_ARGUMENT);           \
        CHECK_MSG(strstr(fp_last_error(), (name)) != NULL, "message '%s' does not name %s",   \
                  fp_last_error(), (name));                                                  \
        int same_ = 1;                                                                       \
        for (size_t i_ = 0; i_ < sizeof out; ++i_) same_ &= ((unsigned char *)out)[i_] == 0x5A; \
        CHECK_MSG(same_, "output written on bad input (%s)", (name));                        \
    } while (0)

static void test_bad_input(fp_context *ctx) {
    float x[12], out[12], g[4], mean[3], rstd[3];
    fp_test_fill(x, 12, 1, -1, 1);
    fp_test_fill(g, 4, 2, -1, 1);
    fp_norm_params ok;
    fp_norm_params_default(&ok);
    ok.rows = 3;
    ok.cols = 4;
    ok.x = x;
    ok.out = out;
    ok.gamma = g;
    ok.mean = mean;
    ok.rstd = rstd;
    CHECK_OK(fp_norm_forward(ctx, NULL, &ok));
    fp_norm_params p;
    p = ok; p.x = NULL; EXPECT_BAD(ctx, p, "x");
    p = ok; p.out = NULL;
    CHECK_STATUS(fp_norm_forward(ctx, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "out") != NULL);
    p = ok; p.rows = 0; EXPECT_BAD(ctx, p, "rows");
    p = ok; p.rows = -3; EXPECT_BAD(ctx, p, "rows");
    p = ok; p.cols = 0; EXPECT_BAD(ctx, p, "cols");
    p = ok; p.eps = 0.0f; EXPECT_BAD(ctx, p, "eps");
    p = ok; p.eps = -1e-5f; EXPECT_BAD(ctx, p, "eps");
    p = ok; p.eps = NAN; EXPECT_BAD(ctx, p, "eps");
    p = ok; p.eps = INFINITY; EXPECT_BAD(ctx, p, "eps");
    p = ok; p.x_stride = 3; EXPECT_BAD(ctx, p, "x_stride");
    p = ok; p.out_stride = 2; EXPECT_BAD(ctx, p, "out_stride");
    p = ok; p.residual = x; p.residual_stride = 1; EXPECT_BAD(ctx, p, "residual_stride");
    p = ok; p.out_dtype = FP_BF16; EXPECT_BAD(ctx, p, "out_dtype");
    p = ok; p.residual_dtype = FP_F16; EXPECT_BAD(ctx, p, "residual_dtype");
    p = ok; p.param_dtype = FP_F16; EXPECT_BAD(ctx, p, "param_dtype");
    p = ok; p.x_dtype = FP_FP8_E4M3; EXPECT_BAD(ctx, p, "x_dtype");
    p = ok; p.kind = (fp_norm_kind)7; EXPECT_BAD(ctx, p, "kind");
    p = ok; p.activation = (fp_norm_activation)9; EXPECT_BAD(ctx, p, "activation");
    p = ok; p.struct_size = 8; EXPECT_BAD(ctx, p, "struct_size");
    p = ok; p.x = (const char *)x + 1; EXPECT_BAD(ctx, p, "x");
    p = ok; p.gamma = (const char *)g + 2; EXPECT_BAD(ctx, p, "gamma");
    p = ok; p.rstd = (float *)((char *)rstd + 1); EXPECT_BAD(ctx, p, "rstd");
    CHECK_STATUS(fp_norm_forward(NULL, NULL, &ok), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_norm_forward(ctx, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK(fp_norm_forward_bytes(&ok) > 0.0);
    p = ok; p.cols = 0;
    CHECK(fp_norm_forward_bytes(&p) == 0.0);

    /* backward */
    float dy[12], dx[12], dg[4];
    fp_test_fill(dy, 12, 3, -1, 1);
    for (int i = 0; i < 3; ++i) rstd[i] = 1.0f, mean[i] = 0.0f;
    fp_norm_backward_params bok;
    fp_norm_backward_params_default(&bok);
    bok.rows = 3;
    bok.cols = 4;
    bok.dout = dy;
    bok.x = x;
    bok.mean = mean;
    bok.rstd = rstd;
    bok.dx = dx;
    bok.dgamma = dg;
    CHECK_OK(fp_norm_backward(ctx, NULL, &bok));
    struct { fp_norm_backward_params p; const char *name; } bads[9];
    for (int i = 0; i < 9; ++i) bads[i].p = bok;
    bads[0].p.dout = NULL; bads[0].name = "dout";
    bads[1].p.x = NULL; bads[1].name = "x";
    bads[2].p.rstd = NULL; bads[2].name = "rstd";
    bads[3].p.mean = NULL; bads[3].name = "mean";
    bads[4].p.dx = NULL; bads[4].name = "dx";
    bads[5].p.cols = -1; bads[5].name = "cols";
    bads[6].p.dx_stride = 2; bads[6].name = "dx_stride";
    bads[7].p.param_dtype = FP_BF16; bads[7].name = "param_dtype";
    bads[8].p.rows = 0; bads[8].name = "rows";
    for (int i = 0; i < 9; ++i) {
        memset(dx, 0x5A, sizeof dx);
        memset(dg, 0x5A, sizeof dg);
        CHECK_STATUS(fp_norm_backward(ctx, NULL, &bads[i].p), FP_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(fp_last_error(), bads[i].name) != NULL, "message '%s' does not name %s",
                  fp_last_error(), bads[i].name);
        int same = 1;
        for (size_t k = 0; k < sizeof dx; ++k) same &= ((unsigned char *)dx)[k] == 0x5A;
        for (size_t k = 0; k < sizeof dg; ++k) same &= ((unsigned char *)dg)[k] == 0x5A;
        CHECK_MSG(same, "backward output written on bad input (%s)", bads[i].name);
    }
    /* RMSNorm needs no mean */
    fp_norm_backward_params rms = bok;
    rms.kind = FP_NORM_RMSNORM;
    rms.mean = NULL;
    CHECK_OK(fp_norm_backward(ctx, NULL, &rms));
    fp_ab_report rep;
    CHECK_STATUS(fp_norm_validate(ctx, NULL, &ok, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    p = ok; p.cols = 0;
    CHECK_STATUS(fp_norm_validate(ctx, NULL, &p, NULL, &rep), FP_ERR_INVALID_ARGUMENT);
}

/* One row of (2^61 + 1) / 3 columns passes the stride check (rows * cols
 * * 8 <= INT64_MAX) but the backward's scratch of 6 * cols floats is
 * 2^64 + 8 bytes: it wrapped to an 8-byte malloc that the first chunk then
 * filled with 6 * cols floats (heap overflow before any pointer argument is
 * read: gamma NULL means 1). Now FP_ERR_OUT_OF_MEMORY, nothing touched. The
 * pointers are a small buffer: the call must fail before using them. */
static void test_backward_scratch_overflow(fp_context *ctx) {
    static float buf[64];
    for (int i = 0; i < 64; ++i) buf[i] = 1.0f;
    fp_norm_backward_params b;
    fp_norm_backward_params_default(&b);
    b.rows = 1;
    b.cols = (int64_t)((((uint64_t)1 << 61) + 1) / 3);
    b.kind = FP_NORM_RMSNORM;
    b.dout = b.x = buf;
    b.rstd = buf;
    b.dx = buf + 16;
    b.dgamma = buf + 32;
    CHECK_STATUS(fp_norm_backward(ctx, NULL, &b), FP_ERR_OUT_OF_MEMORY);
    int untouched = 1;
    for (int i = 0; i < 64; ++i) untouched &= buf[i] == 1.0f;
    CHECK(untouched);
}

static void test_names(void) {
    CHECK(strcmp(fp_norm_kind_name(FP_NORM_RMSNORM), "rmsnorm") == 0);
    CHECK(strcmp(fp_norm_activation_name(FP_NORM_ACT_GELU_TANH), "gelu_tanh") == 0);
    CHECK(strcmp(fp_norm_activation_name((fp_norm_activation)42), "unknown") == 0);
}

/* One activation (deriv 0) or derivative (deriv 1) over ys[0..n) through the
 * current path's row helper (fp_norm_cpu_act_row: the AVX2 kernels' 8-lane
 * code or the portable scalar helpers), into out. */
static void act_sweep(int act, int deriv, const float *ys, float *out, size_t n) {
    memcpy(out, ys, n * sizeof *out);
    fp_norm_cpu_act_row(act, deriv, out, (int64_t)n);
}
static float act1(int act, int deriv, float y) {
    float v[3] = {y, y, y}; /* a row of 3: the AVX2 tail path */
    fp_norm_cpu_act_row(act, deriv, v, 3);
    return v[1];
}
/* y in [lo, hi] by step, as an array */
static float *sweep(float lo, float hi, float step, size_t *n) {
    size_t cap = (size_t)((hi - lo) / step) + 2, k = 0;
    float *ys = malloc(cap * sizeof *ys);
    for (float y = lo; y <= hi && k < cap; y += step) ys[k++] = y;
    *n = k;
    return ys;
}

/* The CPU fused path's activations (the current path: run once portable,
 * once AVX2) against double libm over y in [-30, 30] (and exp over its
 * whole clamped range): exp within 2 ulp; the activations within 1e-6
 * relative; the derivatives within 1e-6 relative or 1e-6 absolute (they
 * cross zero); GELU tanh's bound scaled by 1 + |2u| (the f32 rounding of u
 * itself); GELU erf within 2e-6 relative, its derivative 1e-6. Saturation
 * for huge finite |y| and +-inf (the limits: y or 0, derivatives 1 or 0),
 * NaN propagated. */
static void test_vector_activations(void) {
    double worst_exp = 0.0;
    for (float x = -87.0f; x <= 87.0f; x += 0.00731f) {
        const double ref = exp((double)x), got = (double)fp_norm_vexpf(x);
        const double ulp = ldexp(1.0, ilogb(ref) - 23);
        const double e = fabs(got - ref) / ulp;
        if (e > worst_exp) worst_exp = e;
    }
    CHECK_MSG(worst_exp <= 2.0, "fp_norm_vexpf: %.2f ulp", worst_exp);
    /* beyond the clamp: finite, tiny / huge, never NaN or inf */
    CHECK(fp_norm_vexpf(-1000.0f) > 0.0f && fp_norm_vexpf(-1000.0f) < 2e-38f);
    CHECK(fp_norm_vexpf(1000.0f) > 1e37f && isfinite(fp_norm_vexpf(1000.0f)));
    const int acts[4] = {FP_NORM_ACT_SILU, FP_NORM_ACT_GELU_TANH, FP_NORM_ACT_GELU_ERF, FP_NORM_ACT_RELU};
    for (int a = 0; a < 4; ++a)
        for (int dv = 0; dv < 2; ++dv) {
            const int act = acts[a];
            if (act != FP_NORM_ACT_RELU) CHECK_MSG(isnan(act1(act, dv, NAN)), "act %d deriv %d: NaN not kept", act, dv);
            /* huge finite |y| and inf: saturated, the exp clamp does not leak
             * (y / (1 + e^87) would be -1.6e-8 at -1e30) */
            for (float big = 1e3f;; big *= 1e5f) {
                if (big > 3e38f) big = INFINITY;
                const float hi = act1(act, dv, big), lo = act1(act, dv, -big);
                CHECK_MSG(hi == (dv ? 1.0f : big) && fabsf(lo) < 1e-30f, "act %d deriv %d at +-%g: %g, %g", act, dv,
                          (double)big, (double)hi, (double)lo);
                if (isinf(big)) break;
            }
        }
    size_t n;
    float *ys = sweep(-30.0f, 30.0f, 0.000917f, &n);
    float *got[4];
    const int sw_act[4] = {FP_NORM_ACT_SILU, FP_NORM_ACT_GELU_TANH, FP_NORM_ACT_SILU, FP_NORM_ACT_GELU_TANH};
    for (int i = 0; i < 4; ++i) {
        got[i] = malloc(n * sizeof(float));
        act_sweep(sw_act[i], i >= 2, ys, got[i], n);
    }
    double worst[4] = {0, 0, 0, 0};
    const double k = FP_NORM_GELU_K, c = FP_NORM_GELU_C;
    for (size_t q = 0; q < n; ++q) {
        /* 0.5 (1 + tanh(u)) as sigmoid(2u) and 1 - tanh(u)^2 as
         * 4 s (1 - s) in double: 1 + tanh(u) itself loses every digit in
         * double below u = -19 */
        const double yd = (double)ys[q], u = k * (yd + c * yd * yd * yd), sg = 1.0 / (1.0 + exp(-yd));
        const double s2 = 1.0 / (1.0 + exp(-2.0 * u)), oms2 = exp(-2.0 * u) * s2;
        const double ref[4] = {yd * sg, yd * s2, sg * (1.0 + yd * (1.0 - sg)),
                               s2 + 2.0 * yd * s2 * oms2 * k * (1.0 + 3.0 * c * yd * yd)};
        if (fabs(u) < 5.0) /* where tanh is accurate: the textbook forms agree */
            CHECK(fabs(ref[1] - 0.5 * yd * (1.0 + tanh(u))) <= 1e-12 * fmax(1.0, fabs(yd)));
        for (int i = 0; i < 4; ++i) {
            double e = fabs((double)got[i][q] - ref[i]);
            /* activations: relative (tiny values for negative y included);
             * derivatives: relative, or absolute near their zeros */
            e = i < 2 ? (ref[i] != 0.0 ? e / fabs(ref[i]) : e) : e / fmax(fabs(ref[i]), 1.0);
            /* GELU tanh: u = K (y + C y^3) rounded to f32 is off by ~|u| 2^-24, and the
             * tail is ~e^2u: |2u| 6e-8 relative is the float input's conditioning */
            if (i & 1) e /= 1.0 + fabs(2.0 * u);
            if (ref[i] != 0.0 && fabs(ref[i]) < 1e-30) continue; /* below the clamp's reach */
            if (e > worst[i]) worst[i] = e;
        }
    }
    const char *names[4] = {"silu", "gelu_tanh", "d silu", "d gelu_tanh"};
    for (int i = 0; i < 4; ++i) CHECK_MSG(worst[i] <= 1e-6, "%s: worst error %.3g", names[i], worst[i]);
    for (int i = 0; i < 4; ++i) free(got[i]);
    free(ys);
    /* GELU erf against double erfc (accurate in the negative tail, where
     * 1 + erf would not be); the inner/outer switch at |y| = sqrt(2) and
     * the tail down to the clamp included */
    ys = sweep(-14.0f, 14.0f, 0.000613f, &n);
    float *g = malloc(n * sizeof(float)), *dg = malloc(n * sizeof(float));
    act_sweep(FP_NORM_ACT_GELU_ERF, 0, ys, g, n);
    act_sweep(FP_NORM_ACT_GELU_ERF, 1, ys, dg, n);
    double worst_g = 0.0, worst_dg = 0.0;
    float at_g = 0.0f, at_dg = 0.0f;
    for (size_t q = 0; q < n; ++q) {
        const double yd = (double)ys[q], phi = 0.5 * erfc(-yd / sqrt(2.0));
        const double gr = yd * phi, dgr = phi + yd * exp(-0.5 * yd * yd) / sqrt(2.0 * M_PI);
        if (fabs(gr) > 1e-30) {
            const double e = fabs((double)g[q] - gr) / fabs(gr);
            if (e > worst_g) { worst_g = e; at_g = ys[q]; }
        }
        const double e2 = fabs((double)dg[q] - dgr) / fmax(fabs(dgr), 1.0);
        if (e2 > worst_dg) { worst_dg = e2; at_dg = ys[q]; }
    }
    /* worst near y = -sqrt(2), where 0.5 + 0.5 erf(y / sqrt(2)) = 0.08 cancels ~3 bits (1.0e-6 measured) */
    CHECK_MSG(worst_g <= 2e-6, "gelu_erf: worst relative error %.3g at y = %g", worst_g, (double)at_g);
    CHECK_MSG(worst_dg <= 1e-6, "d gelu_erf: worst error %.3g at y = %g", worst_dg, (double)at_dg);
    free(g);
    free(dg);
    free(ys);
}

static uint32_t bits_of(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

/* The current path's f16 / bf16 row conversions against half.h's scalar
 * RNE ones, bit for bit: every 16-bit input loaded; stored: every float
 * rounding boundary between two 16-bit values (the midpoint and its
 * neighbours), and one float in 61 over the whole 32-bit space (NaN payloads,
 * infinities, subnormals included). Rows of 1001 elements: the AVX2 tail
 * path too. */
static void test_conversions(void) {
    enum { ROW = 1001 };
    uint16_t *h = malloc(65536 * sizeof *h), *h2 = malloc(65536 * 3 * sizeof *h2);
    float *f = malloc(65536 * 3 * sizeof *f);
    for (int dt = FP_F16; dt <= FP_BF16; ++dt) {
        if (dt != FP_F16 && dt != FP_BF16) continue;
        for (int i = 0; i < 65536; ++i) h[i] = (uint16_t)i;
        for (int i = 0; i < 65536; i += ROW)
            fp_norm_cpu_load_row(f + i, h + i, dt, 65536 - i < ROW ? 65536 - i : ROW);
        int bad = 0;
        for (int i = 0; i < 65536 && bad < 5; ++i) {
            const float want = dt == FP_F16 ? fp_h2f(h[i]) : fp_b2f(h[i]);
            if (memcmp(&want, &f[i], 4) != 0) {
                fprintf(stderr, "load dt %d: 0x%04x -> %08x, want %08x\n", dt, i, bits_of(f[i]), bits_of(want));
                ++bad;
            }
        }
        CHECK_MSG(bad == 0, "dtype %d: load not bit-exact", dt);
        /* the boundaries between h and h + 1 (same sign, finite) */
        size_t k = 0;
        for (int i = 0; i < 65536; ++i) {
            const float a = dt == FP_F16 ? fp_h2f((uint16_t)i) : fp_b2f((uint16_t)i);
            const float b = dt == FP_F16 ? fp_h2f((uint16_t)(i + 1)) : fp_b2f((uint16_t)(i + 1));
            if (!isfinite(a) || ((i + 1) & 0x7fff) == 0) continue;
            const float mid = (float)(((double)a + (double)b) * 0.5);
            f[k++] = mid;
            f[k++] = nextafterf(mid, -INFINITY);
            f[k++] = nextafterf(mid, INFINITY);
        }
        for (size_t i = 0; i < k; i += ROW)
            fp_norm_cpu_store_row(h2 + i, dt, f + i, (int64_t)(k - i < ROW ? k - i : ROW));
        bad = 0;
        for (size_t i = 0; i < k; ++i) {
            const uint16_t want = dt == FP_F16 ? fp_f2h(f[i]) : fp_f2b(f[i]);
            if (want != h2[i] && bad++ < 5)
                fprintf(stderr, "store dt %d: %a -> 0x%04x, want 0x%04x\n", dt, (double)f[i], h2[i], want);
        }
        CHECK_MSG(bad == 0, "dtype %d: store not bit-exact at %d rounding boundaries", dt, bad);
        /* a dense sweep of the bit patterns */
        bad = 0;
        for (uint64_t base = 0; base < (1ull << 32); base += 61ull * 65536 * 3) {
            size_t m = 0;
            for (uint64_t b = base; b < base + 61ull * 65536 * 3 && b < (1ull << 32); b += 61) {
                const uint32_t bits = (uint32_t)b;
                memcpy(&f[m++], &bits, 4);
            }
            for (size_t i = 0; i < m; i += ROW)
                fp_norm_cpu_store_row(h2 + i, dt, f + i, (int64_t)(m - i < ROW ? m - i : ROW));
            for (size_t i = 0; i < m; ++i) {
                const uint16_t want = dt == FP_F16 ? fp_f2h(f[i]) : fp_f2b(f[i]);
                if (want != h2[i] && bad++ < 5)
                    fprintf(stderr, "store dt %d: bits %08x -> 0x%04x, want 0x%04x\n", dt, bits_of(f[i]), h2[i], want);
            }
        }
        CHECK_MSG(bad == 0, "dtype %d: store not bit-exact at %d of the swept floats", dt, bad);
    }
    free(h);
    free(h2);
    free(f);
}

/* argv[1] "--portable": the whole suite on the portable path (ctest runs
 * both: test_norm_cpu, test_norm_cpu_portable). */
int main(int argc, char **argv) {
    const int portable = argc > 1 && strcmp(argv[1], "--portable") == 0;
    fp_norm_cpu_force_portable(portable);
    printf("CPU norm path: %s\n", fp_norm_cpu_simd() ? "AVX2" : "portable");
    if (portable) CHECK(fp_norm_cpu_simd() == 0);
    /* the AVX2 path must be the one taken where it can be (else it would go untested) */
    else if (fp_norm_avx2_built && getenv("FASTPATH_NORM_CPU") == NULL && fp_norm_cpu_has_avx2())
        CHECK(fp_norm_cpu_simd() == 1);
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, -1, &ctx));
    if (!ctx) return 1;
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_CPU_THREADS, 4));
    test_names();
    test_vector_activations();
    test_conversions();
    test_bad_input(ctx);
    test_backward_scratch_overflow(ctx);
    test_forward_combos(ctx);
    test_forward_shapes(ctx);
    test_stable_variance(ctx);
    test_in_place(ctx);
    test_validate(ctx);
    test_backward_combos(ctx);
    test_backward_validate(ctx);
    test_finite_differences(ctx);
    test_backward_deterministic();
    fp_context_destroy(ctx);
    TEST_END();
}
