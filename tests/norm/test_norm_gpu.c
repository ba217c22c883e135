/* Fused norm on the GPU (label gpu; exits 77 without a device): every option
 * combination against the double reference at shapes that reach each kernel
 * version (v2 warp-per-row, v2 block-per-row, v1 for odd cols, misaligned
 * pointers and very long rows, v1 forced on aligned shapes), outputs
 * poisoned before each run and every element checked; the backward kernels
 * (dx v1/v2, dparams with many row chunks); validate (unfused baseline vs
 * fused) on the device.
 * --quick: a reduced set (every kernel path, a few option sets) for runs
 * under compute-sanitizer. */
#include "norm_test_util.h"

static int g_quick = 0;

/* --quick: all options on / all off, per kind and dtype, instead of every
 * combination. */
static void fwd_quick_combos(fp_context *ctx, int64_t rows, int64_t cols, int64_t pad, int offset, int version,
                             uint64_t seed) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    for (int kind = 0; kind < 2; ++kind)
        for (int di = 0; di < 3; ++di)
            for (int all = 0; all < 2; ++all) {
                norm_case c = {0};
                c.kind = (fp_norm_kind)kind;
                c.act = all ? FP_NORM_ACT_GELU_TANH : FP_NORM_ACT_NONE;
                c.dtype = dts[di];
                c.rows = rows;
                c.cols = cols;
                c.pad = pad;
                c.offset = offset;
                c.res = c.res_out = c.gamma = c.beta = c.bias = c.stats = all;
                nt_run_fwd(ctx, &c, seed++, version);
            }
}

static void test_forward(fp_context *ctx) {
    /* rows, cols, pad, offset, version */
    static const int64_t combos[][5] = {
        {37, 768, 0, 0, -1},  /* 16-bit: warp per row (NV 4); f32: block per row */
        {9, 4096, 0, 0, -1},  /* block per row */
        {5, 1537, 0, 0, -1},  /* odd cols: v1 */
        {6, 256, 0, 1, -1},   /* misaligned pointers: v1 */
        {7, 24, 8, 0, -1},    /* strided, short rows: warp per row NV 1 */
        {9, 4096, 0, 0, 1},   /* v1 forced on an aligned shape */
        {3, 7, 0, 0, -1},     /* tiny */
    };
    for (size_t i = 0; i < sizeof combos / sizeof combos[0]; ++i) {
        if (g_quick)
            fwd_quick_combos(ctx, combos[i][0], combos[i][1], combos[i][2], (int)combos[i][3], (int)combos[i][4],
                             1000 * (i + 1));
        else
            nt_fwd_all_combos(ctx, combos[i][0], combos[i][1], combos[i][2], (int)combos[i][3], (int)combos[i][4],
                              1000 * (i + 1));
    }
}

static void test_forward_shapes(fp_context *ctx) {
    static const int64_t shapes[][3] = {{1, 1, 0},     {333, 1537, 0}, {2, 12288, 0}, {1000, 5120, 0},
                                        {4, 40000, 0}, {64, 768, 16},  {3, 65536, 0}, {17, 8192, 0}};
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    uint64_t seed = 77;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (int kind = 0; kind < 2; ++kind)
            for (int di = 0; di < 3; ++di) {
                norm_case c = {0};
                c.kind = (fp_norm_kind)kind;
                c.act = kind ? FP_NORM_ACT_SILU : FP_NORM_ACT_GELU_ERF;
                c.dtype = dts[di];
                c.rows = shapes[s][0];
                c.cols = shapes[s][1];
                c.pad = shapes[s][2];
                c.res = c.res_out = c.gamma = c.beta = c.bias = c.stats = 1;
                nt_run_fwd(ctx, &c, seed++, -1);
                c.res = c.res_out = c.bias = 0;
                c.act = FP_NORM_ACT_NONE;
                nt_run_fwd(ctx, &c, seed++, -1);
            }
    /* large mean, small spread: the shifted two-pass variance keeps the digits */
    norm_case c = {0};
    c.kind = FP_NORM_LAYERNORM;
    c.dtype = FP_F32;
    c.rows = 8;
    c.cols = 4096;
    c.lo = 9999.0f;
    c.hi = 10001.0f;
    c.stats = c.gamma = 1;
    nt_run_fwd(ctx, &c, 5, -1);
    c.cols = 4095; /* v1 */
    nt_run_fwd(ctx, &c, 6, -1);
}

static void test_backward(fp_context *ctx) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    static const int64_t shapes[][4] = {
        {37, 768, 0, 0},  {9, 4096, 0, 0}, {5, 1537, 0, 0}, {6, 256, 0, 1}, {7, 24, 8, 0},
        {2, 12288, 0, 0}, {1000, 64, 0, 0}, {20000, 16, 0, 0}, {3, 40000, 0, 0}};
    uint64_t seed = 900;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (int kind = 0; kind < 2; ++kind)
            for (int act = 0; act <= FP_NORM_ACT_SILU; ++act)
                for (int di = 0; di < 3; ++di)
                    for (int opt = 0; opt < 4; ++opt) {
                        if (g_quick && !((act == 0 && opt == 0) || (act == FP_NORM_ACT_GELU_TANH && opt == 3)))
                            continue;
                        norm_bwd_case c = {0};
                        c.kind = (fp_norm_kind)kind;
                        c.act = (fp_norm_activation)act;
                        c.dtype = dts[di];
                        c.rows = shapes[s][0];
                        c.cols = shapes[s][1];
                        c.pad = shapes[s][2];
                        c.offset = (int)shapes[s][3];
                        c.gamma = c.beta = c.bias = opt & 1;
                        c.dres = (opt >> 1) & 1;
                        c.dgamma = opt != 2;
                        c.dbeta = opt & 1;
                        c.dbias = opt == 3;
                        nt_run_bwd(ctx, &c, seed++);
                    }
}

static void test_validate(fp_context *ctx) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.max_time_s = 0.2;
    static const int64_t shapes[][2] = {{256, 768}, {64, 4096}, {33, 1537}};
    for (size_t s = 0; s < 3; ++s)
        for (int di = 0; di < 3; ++di) {
            const fp_dtype dt = dts[di];
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            const size_t es = fp_dtype_size(dt), n = (size_t)(rows * cols);
            void *hx = nt_random(dt, n, 1, -2, 3), *hr = nt_random(dt, n, 2, -1, 1);
            void *hg = nt_random(dt, (size_t)cols, 3, 0.5f, 1.5f), *hb = nt_random(dt, (size_t)cols, 4, -0.5f, 0.5f);
            void *x = nt_upload(ctx, hx, n * es), *r = nt_upload(ctx, hr, n * es);
            void *g = nt_upload(ctx, hg, (size_t)cols * es), *b = nt_upload(ctx, hb, (size_t)cols * es);
            void *out = nt_poisoned(ctx, n * es), *ro = nt_poisoned(ctx, n * es);
            fp_norm_params p;
            fp_norm_params_default(&p);
            p.activation = FP_NORM_ACT_GELU_TANH;
            p.rows = rows;
            p.cols = cols;
            p.x_dtype = p.residual_dtype = p.out_dtype = p.param_dtype = dt;
            p.x = x;
            p.residual = r;
            p.gamma = g;
            p.beta = b;
            p.bias = b;
            p.out = out;
            p.residual_out = ro;
            fp_ab_report rep;
            CHECK_OK(fp_norm_validate(ctx, NULL, &p, &cfg, &rep));
            CHECK_MSG(rep.compared && rep.agreement.passed, "validate %lldx%lld %s: %zu mismatches (max abs %g)",
                      (long long)rows, (long long)cols, fp_dtype_name(dt), rep.agreement.mismatches,
                      rep.agreement.max_abs_err);
            printf("validate %lldx%lld %s: unfused %.4f ms fused %.4f ms speedup %.2fx %s, %.0f GB/s\n",
                   (long long)rows, (long long)cols, fp_dtype_name(dt), rep.baseline.median_ms,
                   rep.optimized.median_ms, rep.speedup, fp_verdict_string(rep.verdict), rep.achieved_gbps);
            void *h = nt_download(ctx, out, n * es);
            CHECK(nt_all_ff(h, n * es)); /* validate does not write params' outputs */
            free(h);
            free(hx); free(hr); free(hg); free(hb);
            void *ds[] = {x, r, g, b, out, ro};
            for (int k = 0; k < 6; ++k) fp_mem_free(ctx, ds[k]);
        }
}

static void test_backward_validate(fp_context *ctx) {
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.max_time_s = 0.2;
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    for (int di = 0; di < 3; ++di) {
        nt_bwd_validate(ctx, FP_NORM_LAYERNORM, FP_NORM_ACT_GELU_TANH, dts[di], 512, 4096, 1, &cfg, 1);
        nt_bwd_validate(ctx, FP_NORM_RMSNORM, FP_NORM_ACT_NONE, dts[di], 300, 1537, 0, &cfg, 1);
    }
}

static void test_in_place(fp_context *ctx) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    for (int di = 0; di < 3; ++di) {
        nt_in_place(ctx, dts[di], 9, 100, FP_NORM_ACT_RELU);        /* v1 for 16-bit (100 % 8) */
        nt_in_place(ctx, dts[di], 9, 4096, FP_NORM_ACT_GELU_ERF);   /* v2 block per row */
        nt_in_place(ctx, dts[di], 37, 768, FP_NORM_ACT_SILU);       /* v2 warp per row (16-bit) */
        nt_in_place(ctx, dts[di], 5, 1537, FP_NORM_ACT_NONE);       /* v1 */
    }
}

static void test_bad_input_gpu(fp_context *ctx) {
    fp_norm_params p;
    fp_norm_params_default(&p);
    p.rows = 4;
    p.cols = 8;
    void *x = nt_poisoned(ctx, 4 * 8 * 4);
    p.x = x;
    p.out = NULL;
    CHECK_STATUS(fp_norm_forward(ctx, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    p.out = x;
    p.eps = -1.0f;
    CHECK_STATUS(fp_norm_forward(ctx, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    fp_mem_free(ctx, x);
}

int main(int argc, char **argv) {
    g_quick = (argc > 1 && strcmp(argv[1], "--quick") == 0) || fp_test_quick();
    fp_context *ctx = fp_test_cuda_context_or_skip();
    test_bad_input_gpu(ctx);
    test_forward(ctx);
    if (!g_quick) test_forward_shapes(ctx);
    test_in_place(ctx);
    test_backward(ctx);
    if (!g_quick) {
        test_validate(ctx);
        test_backward_validate(ctx);
    }
    fp_context_destroy(ctx);
    TEST_END();
}
