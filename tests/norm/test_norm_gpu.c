/* Fused norm on the GPU (label gpu; exits 77 without a device): every option
 * combination against the double reference at shapes that reach each kernel
 * version (v2 warp-per-row, v2 block-per-row, v1 for odd cols, misaligned
 * pointers and very long rows, v1 forced on aligned shapes), outputs
 * poisoned before each run and every element checked; the backward kernels
 * (dx v1/v2, dparams with many row chunks); validate (unfused baseline vs
 * fused) on the device; backward v3 (dx + dgamma/dbeta in one pass) against
 * the reference and v2 at rows 1, 7, 1000, 20000 and every cols class of v2
 * (warp per row, block per row, shared-memory sums, the staged row), run
 * twice for determinism, with v1 forced on the same shapes; dx aliasing
 * dout for every version.
 * --quick (or FP_TEST_QUICK=1): a reduced set (every kernel path, a few
 * option sets) for runs under compute-sanitizer. FP_NORM_TEST_HUGE=1 adds
 * rows > 2^31 - 1 (v1's row loop beyond gridDim.x; ~26 GB of device memory).
 * Every failure line starts with the case: kind, activation, dtype, shape,
 * pad/offset, options (and the backward version / v3 mode). */
#include "norm/norm_bwd_v3_plan.h"
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
                norm_case c = nt_case_at((fp_norm_kind)kind, all ? FP_NORM_ACT_GELU_TANH : FP_NORM_ACT_NONE, dts[di],
                                         rows, cols, pad);
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
        {5, 256, 1, 0, -1},   /* aligned base, stride not a multiple of the vector: v1 */
        {6, 264, 8, 0, 2},    /* v2 requested explicitly: block per row (16-bit), warp (f32) */
        {9, 4096, 0, 0, 1},   /* v1 forced on an aligned shape */
        {9, 4096, 0, 0, 3},   /* v3 (row staged in shared memory) forced on a v2 shape */
        {3, 18432, 0, 0, -1}, /* past v2's registers: v3 (f32: 72 KB, the opt-in) */
        {3, 7, 0, 0, -1},     /* tiny */
        /* the kernels' other forms, kept for the A/B (accurate GELU / SiLU,
         * LayerNorm's two reductions asked for by their bit, its one
         * reduction of the threads' moments): automatic version, block per
         * row (16-bit) and warp per row / block per row (f32) */
        {9, 4096, 0, 0, FP_NORM_VOPT_ACCURATE_ACT | FP_NORM_VOPT_TWO_REDUCTIONS},
        {37, 768, 0, 0, FP_NORM_VOPT_ACCURATE_ACT | FP_NORM_VOPT_TWO_REDUCTIONS},
        {9, 4096, 0, 0, FP_NORM_VOPT_ONE_REDUCTION},
        {37, 768, 0, 0, FP_NORM_VOPT_ONE_REDUCTION},
        /* v4 (v2's rows in persistent CTAs): a warp per row (16-bit) / a
         * block per row (f32), a block per row; the parameters in registers */
        {37, 768, 0, 0, 4},
        {9, 4096, 0, 0, 4},
        {9, 4096, 0, 0, 4 | FP_NORM_VOPT_V4_PARAMS | FP_NORM_VOPT_TWO_REDUCTIONS},
        {9, 4096, 0, 0, 4 | FP_NORM_VOPT_ONE_REDUCTION},
    };
    /* v4 walking many rows per CTA (a direct launch's desc has no SM count:
     * the grid is the CTAs that fit one SM, e.g. 8 of 4 warps, ~80 rows a
     * warp): the all-on and all-off sets only */
    fwd_quick_combos(ctx, 2500, 1024, 0, 0, 4, 900);
    fwd_quick_combos(ctx, 2500, 1024, 0, 0, 4 | FP_NORM_VOPT_V4_PARAMS, 950);
    for (size_t i = 0; i < sizeof combos / sizeof combos[0]; ++i) {
        if (g_quick)
            fwd_quick_combos(ctx, combos[i][0], combos[i][1], combos[i][2], (int)combos[i][3], (int)combos[i][4],
                             1000 * (i + 1));
        else
            nt_fwd_all_combos(ctx, combos[i][0], combos[i][1], combos[i][2], (int)combos[i][3], (int)combos[i][4],
                              1000 * (i + 1));
    }
}

/* The activations' tails: gamma up to 25 puts y = n gamma + beta + bias at
 * |y| up to ~50 (GELU's sigmoid(2u) past exp's range, the derivative's
 * clamp at 20), forward and backward, block and warp per row, every dtype;
 * the fast forms (the default) and the accurate ones (FP_NORM_VOPT_*)
 * against the double reference. */
static void test_act_tails(fp_context *ctx) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    static const int64_t shapes[][2] = {{9, 4096}, {37, 768}};
    static const fp_norm_activation acts[] = {FP_NORM_ACT_GELU_TANH, FP_NORM_ACT_SILU, FP_NORM_ACT_GELU_ERF};
    uint64_t seed = 7000;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s)
        for (int kind = 0; kind < 2; ++kind)
            for (size_t a = 0; a < sizeof acts / sizeof acts[0]; ++a)
                for (int di = 0; di < 3; ++di) {
                    norm_case c = nt_case_at((fp_norm_kind)kind, acts[a], dts[di], shapes[s][0], shapes[s][1], 0);
                    c.res = c.res_out = c.gamma = c.beta = c.bias = c.stats = 1;
                    c.gamma_hi = 25.0f;
                    nt_run_fwd(ctx, &c, seed++, 0);
                    nt_run_fwd(ctx, &c, seed++, FP_NORM_VOPT_ACCURATE_ACT);
                    norm_bwd_case b = nt_bwd_case_opt((fp_norm_kind)kind, acts[a], dts[di], shapes[s][0],
                                                      shapes[s][1], 0, 0, 3);
                    b.gamma_hi = 25.0f;
                    nt_run_bwd(ctx, &b, seed++);
                }
}

static void test_forward_shapes(fp_context *ctx) {
    /* 16384: v2 block per row at its largest (512 threads x 32 elements);
     * 16392, 40000, 65536: v3 (the row staged in shared memory; f32 65536 =
     * 256 KB is past the opt-in: v1) */
    static const int64_t shapes[][3] = {{1, 1, 0},     {333, 1537, 0}, {2, 12288, 0}, {1000, 5120, 0},
                                        {4, 40000, 0}, {64, 768, 16},  {3, 65536, 0}, {17, 8192, 0},
                                        {5, 16384, 0}, {3, 16392, 0}};
    nt_fwd_shapes(ctx, shapes, sizeof shapes / sizeof shapes[0], FP_NORM_ACT_GELU_ERF, 77);
    /* large mean, small spread: the shifted two-pass variance keeps the digits */
    norm_case c = nt_large_mean_case();
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
                        norm_bwd_case c = nt_bwd_case_opt((fp_norm_kind)kind, (fp_norm_activation)act, dts[di],
                                                          shapes[s][0], shapes[s][1], shapes[s][2], (int)shapes[s][3], opt);
                        nt_run_bwd(ctx, &c, seed++);
                    }
}

/* ---- backward v3 (dx + dgamma/dbeta in one pass) vs the reference and v2 ---- */

typedef struct bwd_outs {
    void *dx, *dgamma, *dbeta, *dbias; /* host copies */
} bwd_outs;

static void bwd_outs_free(bwd_outs *o) {
    free(o->dx);
    free(o->dgamma);
    free(o->dbeta);
    free(o->dbias);
}

/* Runs fp_norm_backward_version(version) on p with freshly poisoned outputs
 * (tn / vn elements, outputs `off` bytes in) and downloads them. */
static int run_version(fp_context *ctx, const char *desc, const fp_norm_backward_params *p0, int version,
                       const norm_bwd_case *c, size_t tn, size_t vn, size_t off, bwd_outs *o) {
    const size_t es = fp_dtype_size(c->dtype);
    void *d_dx = nt_poisoned(ctx, tn * es);
    void *d_dg = c->dgamma ? nt_poisoned(ctx, vn * es) : NULL;
    void *d_db = c->dbeta ? nt_poisoned(ctx, vn * es) : NULL;
    void *d_dbi = c->dbias ? nt_poisoned(ctx, vn * es) : NULL;
    fp_norm_backward_params p = *p0;
    p.dx = NT_OFF(d_dx, off);
    p.dgamma = NT_OFF(d_dg, off);
    p.dbeta = NT_OFF(d_db, off);
    p.dbias = NT_OFF(d_dbi, off);
    fp_status st = fp_norm_backward_version(ctx, NULL, &p, version);
    if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
    if (st != FP_OK)
        fprintf(stderr, "[%s] backward version %d failed: %s (%s)\n", desc, version, fp_status_string(st),
                fp_last_error());
    o->dx = nt_download(ctx, d_dx, tn * es);
    o->dgamma = d_dg ? nt_download(ctx, d_dg, vn * es) : NULL;
    o->dbeta = d_db ? nt_download(ctx, d_db, vn * es) : NULL;
    o->dbias = d_dbi ? nt_download(ctx, d_dbi, vn * es) : NULL;
    void *ds[] = {d_dx, d_dg, d_db, d_dbi};
    for (int k = 0; k < 4; ++k) fp_mem_free(ctx, ds[k]);
    return st == FP_OK;
}

/* One case: v3 (checked to be the kernel that runs when expect_v3) against
 * the double reference and against v2; v3 run twice gives the same bytes. */
static void bwd_v3_case(fp_context *ctx, const norm_bwd_case *c, uint64_t seed, int expect_v3) {
    char desc[256];
    snprintf(desc, sizeof desc, "bwd v3 %s act=%s %s %lldx%lld pad=%lld gamma=%d beta=%d bias=%d dres=%d "
             "dgamma=%d dbeta=%d dbias=%d", fp_norm_kind_name(c->kind), fp_norm_activation_name(c->act),
             fp_dtype_name(c->dtype), (long long)c->rows, (long long)c->cols, (long long)c->pad, c->gamma, c->beta,
             c->bias, c->dres, c->dgamma, c->dbeta, c->dbias);
    const fp_dtype dt = c->dtype;
    const size_t es = fp_dtype_size(dt);
    const int64_t stride = c->cols + c->pad;
    const size_t tn = (size_t)c->rows * (size_t)stride, vn = (size_t)c->cols;
    nt_bwd_case_data in;
    nt_bwd_case_data_make(ctx, c, seed, tn, vn, 0, desc, &in);
    fp_norm_backward_params p;
    nt_bwd_case_data_params(c, &in, stride, 0, &p);
    static char dummy[16] __attribute__((aligned(16))); /* selects outputs for the version query only */
    p.dx = dummy;
    p.dgamma = c->dgamma ? dummy : NULL;
    p.dbeta = c->dbeta ? dummy : NULL;
    p.dbias = c->dbias ? dummy : NULL;
    int fail = 0;
    fp_norm_bwd_desc dd;
    CHECK_OK(fp_norm_check_bwd(&p, &dd));
    dd.dx = in.d_dy; /* alignment as the real runs (device buffers) */
    {
        const fp_norm_v3_plan pl = fp_norm_v3_plan_for(c->cols, dt == FP_F32 ? 4 : 8);
        size_t L = strlen(desc);
        snprintf(desc + L, sizeof desc - L, " [v3 %s]", !pl.ok ? "n/a" : pl.stage_row ? "staged row" :
                 pl.smem_acc ? "smem sums" : pl.rows_per_cta > 1 ? "warp/row" : "block/row");
    }
    if (expect_v3 && fp_norm_bwd_version_used(&dd, 3) != 3) {
        fprintf(stderr, "[%s] v3 does not apply (runs v%d)\n", desc, fp_norm_bwd_version_used(&dd, 3));
        fail = 1;
    }
    if (c->dgamma || c->dbeta || c->dbias)
        CHECK_MSG(fp_norm_bwd_version_used(&dd, 0) ==
                      (expect_v3 && c->dres ? fp_norm_bwd_version_used(&dd, 4) : expect_v3 ? 3
                                                                                  : fp_norm_bwd_version_used(&dd, 2)),
                  "[%s] automatic version", desc);

    /* v4 (v3 with the prefetch ring) wherever v3 keeps its sums in registers */
    const fp_norm_v3_plan plan = fp_norm_v3_plan_for(c->cols, dt == FP_F32 ? 4 : 8);
    /* ... and where its ring fits: certainly within the default 48 KB, never
     * past any device's opt-in (227 KB on sm_90; 163 KB on sm_80: between
     * the two, either answer is right) */
    const size_t ring_smem = fp_norm_v4_smem_bytes(&plan, c->cols, es, c->dres ? 3 : 2);
    const int used4 = fp_norm_bwd_version_used(&dd, 4);
    if (expect_v3 && !plan.smem_acc && !plan.stage_row && ring_smem <= 48 * 1024 - 128) {
        CHECK_MSG(used4 == 4, "[%s] version 4 runs v%d", desc, used4);
    } else if (!expect_v3 || plan.smem_acc || plan.stage_row || ring_smem > 227 * 1024 - 128) {
        CHECK_MSG(used4 == fp_norm_bwd_version_used(&dd, 3), "[%s] version 4 runs v%d", desc, used4);
    }

    /* the fused reduce runs where v3 / v4 run with partial sums to reduce
     * (but in f32 rows of 4 vectors a thread with register sums, left out
     * to avoid spills): checked for 16-bit */
    if (expect_v3 && dt != FP_F32 && (c->dgamma || c->dbeta || c->dbias)) {
        /* (the environment's A/B switches: reduce v1's order, the fused
         * reduce off for every call) */
        const char *r1 = getenv("FP_NORM_BWD_REDUCE"), *fr = getenv("FP_NORM_BWD_FUSED_REDUCE");
        const int want = !(r1 && strcmp(r1, "1") == 0) && !(fr && strcmp(fr, "0") == 0);
        CHECK_MSG(fp_norm_bwd_fused_reduce_used(&dd, 4 | FP_NORM_VOPT_FUSED_REDUCE) == want &&
                      fp_norm_bwd_fused_reduce_used(&dd, 3 | FP_NORM_VOPT_FUSED_REDUCE) == want,
                  "[%s] fused reduce used (want %d)", desc, want);
        if (!getenv("FP_NORM_BWD_FUSED_REDUCE") && !getenv("FP_NORM_BWD_REDUCE"))
            CHECK_MSG(!fp_norm_bwd_fused_reduce_used(&dd, 4), "[%s] fused reduce without the bit", desc);
    }

    bwd_outs v3 = {0}, v3b = {0}, v2 = {0}, v1 = {0}, v4 = {0}, v4e = {0}, v3f = {0}, v4f = {0}, v4fb = {0};
    fail |= !run_version(ctx, desc, &p, 4, c, tn, vn, 0, &v4);
    /* v3 / v4 with the fused reduce (the last CTAs sum the partial rows):
     * the same bytes as with the reduce kernel; twice in a row (the
     * arrival counts reset themselves) */
    fail |= !run_version(ctx, desc, &p, 3 | FP_NORM_VOPT_FUSED_REDUCE, c, tn, vn, 0, &v3f);
    fail |= !run_version(ctx, desc, &p, 4 | FP_NORM_VOPT_FUSED_REDUCE, c, tn, vn, 0, &v4f);
    fail |= !run_version(ctx, desc, &p, 4 | FP_NORM_VOPT_FUSED_REDUCE, c, tn, vn, 0, &v4fb);
    /* v4 with the earlier forms kept for the A/B (accurate GELU / SiLU,
     * LayerNorm's row sums one after the other) */
    fail |= !run_version(ctx, desc, &p, 4 | FP_NORM_VOPT_ACCURATE_ACT | FP_NORM_VOPT_TWO_REDUCTIONS, c, tn, vn, 0,
                         &v4e);
    fail |= !run_version(ctx, desc, &p, 3, c, tn, vn, 0, &v3);
    fail |= !run_version(ctx, desc, &p, 3, c, tn, vn, 0, &v3b);
    fail |= !run_version(ctx, desc, &p, 2, c, tn, vn, 0, &v2);
    fail |= !run_version(ctx, desc, &p, 1, c, tn, vn, 0, &v1); /* dx v1 + dparams v1, forced on any shape */

    void *r_dx = malloc(tn * es), *r_dg = malloc(vn * es), *r_db = malloc(vn * es), *r_dbi = malloc(vn * es);
    memset(r_dx, 0xFF, tn * es);
    fp_norm_backward_params hp = p;
    nt_bwd_case_data_host(&in, 0, &hp);
    hp.dx = r_dx;
    hp.dgamma = c->dgamma ? r_dg : NULL;
    hp.dbeta = c->dbeta ? r_db : NULL;
    hp.dbias = c->dbias ? r_dbi : NULL;
    fail |= nt_ref_bwd(&hp, desc);
    if (!fail) {
        /* as nt_run_bwd: f32 row sums in dx, f32 column sums in dgamma/dbeta */
        double dx_atol, p_atol, rtol;
        nt_bwd_tolerance(c, &dx_atol, &p_atol, &rtol);
        const int64_t cols = c->cols, rows = c->rows;
        fail |= nt_compare_tensor("dx vs ref", desc, r_dx, v3.dx, dt, rows, cols, stride, 0, dx_atol, rtol);
        fail |= nt_compare_tensor("dx vs v2", desc, v2.dx, v3.dx, dt, rows, cols, stride, 0, dx_atol, rtol);
        fail |= nt_compare_tensor("dx v4 vs ref", desc, r_dx, v4.dx, dt, rows, cols, stride, 0, dx_atol, rtol);
        fail |= nt_compare_tensor("dx v4 (earlier forms) vs ref", desc, r_dx, v4e.dx, dt, rows, cols, stride, 0,
                                  dx_atol, rtol);
        fail |= nt_compare_tensor("dx v1 vs ref", desc, r_dx, v1.dx, dt, rows, cols, stride, 0, dx_atol, rtol);
        const void *refs[3] = {r_dg, r_db, r_dbi};
        const void *g3[3] = {v3.dgamma, v3.dbeta, v3.dbias}, *g3b[3] = {v3b.dgamma, v3b.dbeta, v3b.dbias};
        const void *g2[3] = {v2.dgamma, v2.dbeta, v2.dbias}, *g1[3] = {v1.dgamma, v1.dbeta, v1.dbias};
        const void *g4[3] = {v4.dgamma, v4.dbeta, v4.dbias}, *g4e[3] = {v4e.dgamma, v4e.dbeta, v4e.dbias};
        const char *names[3] = {"dgamma", "dbeta", "dbias"};
        for (int k = 0; k < 3; ++k) {
            if (!g3[k]) continue;
            char what[32];
            snprintf(what, sizeof what, "%s vs ref", names[k]);
            fail |= nt_compare_tensor(what, desc, refs[k], g3[k], dt, 1, cols, cols, 0, p_atol, rtol);
            snprintf(what, sizeof what, "%s vs v2", names[k]);
            fail |= nt_compare_tensor(what, desc, g2[k], g3[k], dt, 1, cols, cols, 0, p_atol, rtol);
            snprintf(what, sizeof what, "%s v1 vs ref", names[k]);
            fail |= nt_compare_tensor(what, desc, refs[k], g1[k], dt, 1, cols, cols, 0, p_atol, rtol);
            snprintf(what, sizeof what, "%s v4 vs ref", names[k]);
            fail |= nt_compare_tensor(what, desc, refs[k], g4[k], dt, 1, cols, cols, 0, p_atol, rtol);
            snprintf(what, sizeof what, "%s v4 (earlier) vs ref", names[k]);
            fail |= nt_compare_tensor(what, desc, refs[k], g4e[k], dt, 1, cols, cols, 0, p_atol, rtol);
            if (memcmp(g3[k], g3b[k], vn * es) != 0) {
                fprintf(stderr, "[%s] %s differs between two v3 runs (not deterministic)\n", desc, names[k]);
                fail = 1;
            }
        }
        if (memcmp(v3.dx, v3b.dx, tn * es) != 0) {
            fprintf(stderr, "[%s] dx differs between two v3 runs\n", desc);
            fail = 1;
        }
        const bwd_outs *fa[3] = {&v3f, &v4f, &v4fb}, *fb[3] = {&v3, &v4, &v4};
        const char *fn[3] = {"v3 fused reduce", "v4 fused reduce", "v4 fused reduce (second run)"};
        for (int f = 0; f < 3; ++f) {
            const void *a[4] = {fa[f]->dx, fa[f]->dgamma, fa[f]->dbeta, fa[f]->dbias};
            const void *b[4] = {fb[f]->dx, fb[f]->dgamma, fb[f]->dbeta, fb[f]->dbias};
            const char *what[4] = {"dx", "dgamma", "dbeta", "dbias"};
            for (int k = 0; k < 4; ++k)
                if (a[k] && memcmp(a[k], b[k], (k ? vn : tn) * es) != 0) {
                    fprintf(stderr, "[%s] %s: %s differs from the reduce kernel's\n", desc, fn[f], what[k]);
                    fail = 1;
                }
        }
    }
    if (fail) fp_test_failures++;
    bwd_outs_free(&v3);
    bwd_outs_free(&v3b);
    bwd_outs_free(&v2);
    bwd_outs_free(&v1);
    bwd_outs_free(&v4);
    bwd_outs_free(&v4e);
    bwd_outs_free(&v3f);
    bwd_outs_free(&v4f);
    bwd_outs_free(&v4fb);
    void *hs[] = {r_dx, r_dg, r_db, r_dbi};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; ++i) free(hs[i]);
    nt_bwd_case_data_free(ctx, &in);
}

/* Expected: v3 applies (the plan's budget) for the 16-bit / f32 vector widths
 * (the shared-memory sums of 12288 cols, 96 KB, fit every sm_80+ device). */
static int v3_applies(int64_t cols, fp_dtype dt) {
    const int vec = dt == FP_F32 ? 4 : 8;
    return fp_norm_v3_plan_for(cols, vec).ok;
}

static void test_backward_v3(fp_context *ctx) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    /* Every cols class of dx v2 (16-bit / f32 vectors): 24 warp NV1 / warp NV1;
     * 256 warp NV1 / warp NV2; 512 warp NV2 / warp NV4; 768 warp NV4 / block
     * NV2; 4096 block NV2 / block NV2; 8192 block NV2 / block NV4; 12288
     * block NV4 / NV8 (v3 with shared-memory sums, 384 threads); 12296 and
     * 16384 (416 / 512 threads: v3 with the row staged in shared memory);
     * 16392 beyond v2 and v3 (dx staged in shared memory); 1537 odd (v1). */
    static const int64_t cols_list[] = {24, 256, 512, 768, 4096, 8192, 12288, 12296, 16384, 16392, 1537};
    static const int64_t rows_list[] = {1, 7, 1000, 20000};
    uint64_t seed = 5000;
    for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ++ci)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ++ri) {
            const int64_t cols = cols_list[ci], rows = rows_list[ri];
            /* host reference time: big shapes with two option sets, the biggest skipped */
            const int big = rows * cols > 4000000;
            if (rows * cols > 16400000 && rows > 7) continue; /* 1000 x 16384 runs: many rows per CTA */
            if (g_quick && rows * cols > 1000000 && rows > 7) continue;
            for (int di = 0; di < 3; ++di)
                for (int opt = 0; opt < 4; ++opt) {
                    if ((g_quick || big) && opt != 3 && !(opt == 0 && di == 0)) continue;
                    norm_bwd_case c = {0};
                    c.kind = (opt & 1) ? FP_NORM_LAYERNORM : FP_NORM_RMSNORM;
                    c.act = opt == 3 ? FP_NORM_ACT_GELU_TANH : opt == 1 ? FP_NORM_ACT_SILU : FP_NORM_ACT_NONE;
                    c.dtype = dts[di];
                    c.rows = rows;
                    c.cols = cols;
                    c.pad = (opt == 2 && cols % 8 == 0) ? 8 : 0; /* strided rows keep 16-byte alignment */
                    c.gamma = opt != 0;
                    c.beta = c.bias = opt & 1;
                    c.dres = opt >= 2;
                    c.dgamma = 1;
                    c.dbeta = opt & 1;
                    c.dbias = opt == 3;
                    bwd_v3_case(ctx, &c, seed++, v3_applies(cols, c.dtype) && cols != 1537);
                }
        }
    /* no dgamma/dbeta/dbias: v3 forced still writes dx only */
    norm_bwd_case c = {0};
    c.kind = FP_NORM_LAYERNORM;
    c.dtype = FP_BF16;
    c.rows = 1000;
    c.cols = 768;
    c.gamma = 1;
    bwd_v3_case(ctx, &c, 77, 1);
}

/* dx aliasing dout (documented as allowed) gives the same bytes as separate
 * buffers, for every backward version and dx kernel mode: versions 1 and 2
 * re-read dout for dgamma/dbeta, so that pass must run before dx is written. */
static void bwd_in_place(fp_context *ctx, fp_dtype dt, int64_t rows, int64_t cols, fp_norm_activation act,
                         int version) {
    const size_t es = fp_dtype_size(dt), n = (size_t)(rows * cols), bytes = n * es;
    nt_bwd_inputs in;
    nt_bwd_inputs_make(ctx, dt, rows, cols, 51, &in);
    void *dy2 = nt_upload(ctx, in.hdy, bytes);
    void *dx = nt_poisoned(ctx, bytes), *dg = nt_poisoned(ctx, (size_t)cols * es),
         *dg2 = nt_poisoned(ctx, (size_t)cols * es);
    void *db = nt_poisoned(ctx, (size_t)cols * es), *db2 = nt_poisoned(ctx, (size_t)cols * es);
    fp_norm_backward_params p;
    nt_bwd_inputs_params(&in, dt, rows, cols, act, &p);
    p.dresidual_out = in.dr;
    p.dx = dx;
    p.dgamma = dg;
    p.dbeta = db;
    char desc[160];
    snprintf(desc, sizeof desc, "bwd in place v%d (runs v%d) %s %lldx%lld act=%s", version,
             fp_norm_backward_version_used(&p, version), fp_dtype_name(dt), (long long)rows, (long long)cols,
             fp_norm_activation_name(act));
    fp_status st = fp_norm_backward_version(ctx, NULL, &p, version);
    CHECK_MSG(st == FP_OK, "[%s] separate dx: %s", desc, fp_last_error());
    p.dout = dy2;
    p.dx = dy2;
    p.dgamma = dg2;
    p.dbeta = db2;
    st = fp_norm_backward_version(ctx, NULL, &p, version);
    CHECK_MSG(st == FP_OK, "[%s] dx aliasing dout: %s", desc, fp_last_error());
    void *a = nt_download(ctx, dx, bytes), *a2 = nt_download(ctx, dy2, bytes);
    void *ga = nt_download(ctx, dg, (size_t)cols * es), *ga2 = nt_download(ctx, dg2, (size_t)cols * es);
    void *ba = nt_download(ctx, db, (size_t)cols * es), *ba2 = nt_download(ctx, db2, (size_t)cols * es);
    CHECK_MSG(!nt_all_ff(a, bytes) && memcmp(a, a2, bytes) == 0, "[%s] dx differs when it aliases dout", desc);
    CHECK_MSG(memcmp(ga, ga2, (size_t)cols * es) == 0, "[%s] dgamma differs when dx aliases dout", desc);
    CHECK_MSG(memcmp(ba, ba2, (size_t)cols * es) == 0, "[%s] dbeta differs when dx aliases dout", desc);
    void *hs[] = {a, a2, ga, ga2, ba, ba2};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; ++i) free(hs[i]);
    void *ds[] = {dy2, dx, dg, dg2, db, db2};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; ++i) fp_mem_free(ctx, ds[i]);
    nt_bwd_inputs_free(ctx, &in);
}

static void test_backward_in_place(fp_context *ctx) {
    static const fp_dtype dts[] = {FP_F32, FP_F16, FP_BF16};
    /* v1 (odd cols), warp per row, block per row, shared-memory sums, the
     * staged row with more rows than CTAs */
    static const int64_t shapes[][2] = {{9, 100}, {37, 768}, {9, 4096}, {5, 12288}, {300, 16384}, {5, 1537}};
    for (int di = 0; di < 3; ++di)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; ++si)
            for (int version = 0; version <= 4; ++version) {
                if (g_quick && version == 0) continue;
                /* --quick: 140 rows of 16384 still give some CTAs (<= 132 SMs) two rows */
                const int64_t rows = g_quick && shapes[si][0] == 300 ? 140 : shapes[si][0];
                bwd_in_place(ctx, dts[di], rows, shapes[si][1], version & 1 ? FP_NORM_ACT_GELU_ERF : FP_NORM_ACT_NONE,
                             version);
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
            nt_fwd_params(&p, dt, rows, cols, FP_NORM_ACT_GELU_TANH);
            nt_fwd_set_ptrs(&p, 0, x, r, g, b, b, out, ro, NULL, NULL);
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
    nt_bwd_validate_dtypes(ctx, 512, 4096, 300, 1537, &cfg, 1);
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
    /* a version request with an unknown option bit, or past the versions */
    p.eps = 1e-5f;
    CHECK_STATUS(fp_norm_forward_version(ctx, NULL, &p, 0x800), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_norm_forward_version(ctx, NULL, &p, 5 | FP_NORM_VOPT_ACCURATE_ACT), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_norm_forward_version(ctx, NULL, &p, 4 | FP_NORM_VOPT_V4_PARAMS), FP_OK);
    CHECK_STATUS(fp_norm_forward_version(ctx, NULL, &p, -1), FP_ERR_INVALID_ARGUMENT);
    fp_mem_free(ctx, x);
}

/* rows > 2^31 - 1 (gridDim.x's limit): v1 loops over the rows beyond its
 * grid. Opt-in (FP_NORM_TEST_HUGE=1: ~26 GB of device memory, seconds):
 * RMSNorm, cols 1 (v1: not a vector multiple), every element of x 0x3F3F3F3F
 * (0.7470...), so out = x / sqrt(x^2 + eps) everywhere; the forward and the
 * backward (dx v1, dgamma) checked on the last rows. */
static void test_huge_rows(fp_context *ctx) {
    const char *env = getenv("FP_NORM_TEST_HUGE");
    if (!env || strcmp(env, "1") != 0) return;
    const int64_t rows = ((int64_t)1 << 31) + 37;
    const size_t bytes = (size_t)rows * sizeof(float);
    void *x = NULL, *out = NULL, *rstd = NULL;
    if (fp_mem_alloc(ctx, bytes, &x) != FP_OK || fp_mem_alloc(ctx, bytes, &out) != FP_OK ||
        fp_mem_alloc(ctx, bytes, &rstd) != FP_OK) {
        printf("huge rows: skipped (%s)\n", fp_last_error());
        fp_mem_free(ctx, x);
        fp_mem_free(ctx, out);
        return;
    }
    CHECK_OK(fp_mem_fill(ctx, x, 0x3F, bytes, NULL));
    CHECK_OK(fp_mem_fill(ctx, out, 0xFF, bytes, NULL));
    fp_norm_params p;
    fp_norm_params_default(&p);
    p.kind = FP_NORM_RMSNORM;
    p.rows = rows;
    p.cols = 1;
    p.x = x;
    p.out = out;
    p.rstd = rstd;
    CHECK_OK(fp_norm_forward(ctx, NULL, &p));
    CHECK_OK(fp_context_synchronize(ctx, NULL));
    const size_t tail = 4096;
    float *h = nt_download(ctx, (char *)out + bytes - tail * 4, tail * 4);
    float xv;
    memset(&xv, 0x3F, sizeof xv);
    const float want = (float)((double)xv / sqrt((double)xv * xv + 1e-5));
    size_t bad = 0;
    for (size_t i = 0; i < tail; ++i) bad += !(fabsf(h[i] - want) <= 1e-6f);
    CHECK_MSG(bad == 0, "huge rows forward: %zu of the last %zu rows wrong (got %g want %g)", bad, tail, h[0], want);
    free(h);
    /* backward: dout = x's bytes, dx into out, dgamma (a sum over 2^31 rows) */
    void *dg = nt_poisoned(ctx, 4);
    fp_norm_backward_params b;
    fp_norm_backward_params_default(&b);
    b.kind = FP_NORM_RMSNORM;
    b.rows = rows;
    b.cols = 1;
    b.dout = x;
    b.x = x;
    b.rstd = rstd;
    b.dx = out;
    b.dgamma = dg;
    CHECK_OK(fp_mem_fill(ctx, out, 0xFF, bytes, NULL));
    CHECK_OK(fp_norm_backward(ctx, NULL, &b));
    CHECK_OK(fp_context_synchronize(ctx, NULL));
    h = nt_download(ctx, (char *)out + bytes - tail * 4, tail * 4);
    /* cols 1: n = x rstd, dn = dout, dx = rstd (dn - n dn n) */
    const double r = 1.0 / sqrt((double)xv * xv + 1e-5), n = xv * r, dxw = r * (xv - n * xv * n);
    bad = 0;
    for (size_t i = 0; i < tail; ++i) bad += !(fabs(h[i] - dxw) <= 1e-5 + 1e-4 * fabs(dxw));
    CHECK_MSG(bad == 0, "huge rows backward: %zu of the last %zu rows wrong (got %g want %g)", bad, tail, h[0], dxw);
    free(h);
    float *g = nt_download(ctx, dg, 4);
    /* dparams v1: each of a chunk's 8 row lanes sums 2^31 / 256 / 8 = 1M
     * equal terms serially in f32 (~0.4% drift): a sanity bound only */
    const double gw = (double)rows * xv * n;
    CHECK_MSG(fabs(g[0] - gw) <= 2e-2 * gw, "huge rows dgamma %g want %g", g[0], gw);
    free(g);
    fp_mem_free(ctx, dg);
    fp_mem_free(ctx, x);
    fp_mem_free(ctx, out);
    fp_mem_free(ctx, rstd);
}

int main(int argc, char **argv) {
    g_quick = (argc > 1 && strcmp(argv[1], "--quick") == 0) || fp_test_quick();
    fp_context *ctx = fp_test_cuda_context_or_skip();
    test_bad_input_gpu(ctx);
    test_forward(ctx);
    test_act_tails(ctx);
    if (!g_quick) test_forward_shapes(ctx);
    test_in_place(ctx);
    test_backward(ctx);
    test_backward_v3(ctx);
    test_backward_in_place(ctx);
    test_huge_rows(ctx);
    if (!g_quick) {
        test_validate(ctx);
        test_backward_validate(ctx);
    }
    fp_context_destroy(ctx);
    TEST_END();
}
