/* Structured fuzz of fp_norm_forward / fp_norm_backward (and, now and then,
 * their validate calls) on a CPU context, through the public header only.
 *
 * Each iteration draws a valid call (kind, activation, dtype, shape, strides,
 * which optional tensors, buffer offsets, in-place aliasing), then either
 * runs it and compares every output element against a plain double
 * reference written here (tolerance by dtype) while checking that stride
 * gaps, guards and inputs were not touched, or breaks exactly one argument
 * and checks for FP_ERR_INVALID_ARGUMENT naming it with every buffer
 * unchanged. See fuzz_util.h for the checks. Usage: test_fuzz_norm [seed]
 * [iterations]. */
#include "fuzz_util.h"

typedef struct nz_ctx {
    fp_context *ctx;
    fz_run run;
    uint64_t rng;
    long ok_calls, bad_calls;
} nz_ctx;

/* ---- the reference ---- */

static double act_f(int act, double y) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF: return 0.5 * y * (1.0 + erf(y / sqrt(2.0)));
    case FP_NORM_ACT_GELU_TANH: return 0.5 * y * (1.0 + tanh(sqrt(2.0 / M_PI) * (y + 0.044715 * y * y * y)));
    case FP_NORM_ACT_RELU: return y > 0 ? y : 0.0;
    case FP_NORM_ACT_SILU: return y / (1.0 + exp(-y));
    }
    return y;
}

static double act_d(int act, double y) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF: return 0.5 * (1.0 + erf(y / sqrt(2.0))) + y * exp(-0.5 * y * y) / sqrt(2.0 * M_PI);
    case FP_NORM_ACT_GELU_TANH: {
        const double k = sqrt(2.0 / M_PI), t = tanh(k * (y + 0.044715 * y * y * y));
        return 0.5 * (1.0 + t) + 0.5 * y * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * y * y);
    }
    case FP_NORM_ACT_RELU: return y > 0 ? 1.0 : 0.0;
    case FP_NORM_ACT_SILU: {
        const double sg = 1.0 / (1.0 + exp(-y));
        return sg * (1.0 + y * (1.0 - sg));
    }
    }
    return 1.0;
}

static void tolerance(fp_dtype dt, double *atol, double *rtol) {
    /* f32: f32 accumulation over <= a few thousand elements; f16/bf16: one
     * rounding of the output plus the rounding of s = x + residual, with
     * headroom for f32 intermediates of values up to ~10. */
    if (dt == FP_F32) { *atol = 2e-4; *rtol = 2e-4; }
    else if (dt == FP_F16) { *atol = 6e-3; *rtol = 6e-3; }
    else { *atol = 4e-2; *rtol = 3e-2; }
}

/* ---- buffers of one call ---- */

enum { T_X, T_RES, T_GAMMA, T_BETA, T_BIAS, T_OUT, T_RES_OUT, T_MEAN, T_RSTD, T_COUNT };
static const char *const fwd_names[T_COUNT] = {"x", "residual", "gamma", "beta", "bias",
                                               "out", "residual_out", "mean", "rstd"};

typedef struct fwd_case {
    fp_norm_params p;
    fz_buf buf[T_COUNT];
    int is_out[T_COUNT];
    int out_in_place; /* out == x */
    int res_in_place; /* residual_out == residual */
} fwd_case;

static size_t shift_for(uint64_t *s, size_t es) { return fz_chance(s, 1, 2) ? 0 : (size_t)fz_range(s, 1, 16) * es; }

static int64_t draw_stride(uint64_t *s, int64_t cols) {
    return fz_chance(s, 1, 2) ? 0 : cols + fz_range(s, 0, 5);
}

static void fwd_case_make(nz_ctx *z, fwd_case *c) {
    uint64_t *s = &z->rng;
    memset(c, 0, sizeof *c);
    fp_norm_params *p = &c->p;
    fp_norm_params_default(p);
    p->kind = (fp_norm_kind)fz_range(s, 0, 1);
    p->activation = (fp_norm_activation)fz_range(s, 0, 4);
    fp_dtype dt = (fp_dtype)fz_range(s, 0, 2);
    p->x_dtype = p->residual_dtype = p->out_dtype = p->param_dtype = dt;
    p->rows = fz_range(s, 1, 9);
    p->cols = fz_chance(s, 1, 8) ? fz_range(s, 300, 2100) : fz_range(s, 1, 70);
    if (fz_chance(s, 1, 60)) { /* rows longer than the GPU keeps in registers */
        p->rows = fz_range(s, 1, 2);
        p->cols = fz_range(s, 16000, 40000);
    }
    p->eps = (float)pow(10.0, fz_uniform(s, -7, -1));
    const size_t es = fp_dtype_size(dt);
    const int64_t rows = p->rows, cols = p->cols;
    p->x_stride = draw_stride(s, cols);
    p->residual_stride = draw_stride(s, cols);
    p->residual_out_stride = draw_stride(s, cols);
    p->out_stride = draw_stride(s, cols);
    c->out_in_place = fz_chance(s, 1, 6);
    if (c->out_in_place) p->out_stride = p->x_stride;
    c->res_in_place = fz_chance(s, 1, 6);
    if (c->res_in_place) p->residual_out_stride = p->residual_stride;
    const int64_t xs = p->x_stride ? p->x_stride : cols;
    const int64_t rs = p->residual_stride ? p->residual_stride : cols;
    const int64_t ros = p->residual_out_stride ? p->residual_out_stride : cols;
    const int64_t os = p->out_stride ? p->out_stride : cols;
    const int has_res = c->res_in_place || fz_chance(s, 1, 2);
    const int has[T_COUNT] = {1, has_res, fz_chance(s, 2, 3), fz_chance(s, 1, 2), fz_chance(s, 1, 3),
                              !c->out_in_place, !c->res_in_place && fz_chance(s, 1, 2), fz_chance(s, 1, 2),
                              fz_chance(s, 1, 2)};
    const size_t elems[T_COUNT] = {(size_t)(rows * xs), (size_t)(rows * rs), (size_t)cols, (size_t)cols,
                                   (size_t)cols, (size_t)(rows * os), (size_t)(rows * ros), (size_t)rows,
                                   (size_t)rows};
    /* x with a large mean now and then (LayerNorm's cancellation case) */
    const double x_off = fz_chance(s, 1, 5) ? fz_uniform(s, -50, 50) : 0.0;
    for (int t = 0; t < T_COUNT; ++t) {
        if (!has[t]) continue;
        const int stat = t == T_MEAN || t == T_RSTD;
        const size_t e = stat ? 4 : es;
        c->buf[t] = fz_buf_new(elems[t] * e, shift_for(s, e));
        c->is_out[t] = t == T_OUT || t == T_RES_OUT || stat;
        if (!c->is_out[t]) {
            if (t == T_X) fz_fill(c->buf[t].data, dt, elems[t], s, x_off - 2, x_off + 2);
            else if (t == T_GAMMA) fz_fill(c->buf[t].data, dt, elems[t], s, 0.25, 2.0);
            else fz_fill(c->buf[t].data, dt, elems[t], s, -1.5, 1.5);
            fz_buf_snapshot(&c->buf[t]);
        }
    }
    p->x = c->buf[T_X].data;
    p->residual = c->buf[T_RES].data;
    p->gamma = c->buf[T_GAMMA].data;
    p->beta = c->buf[T_BETA].data;
    p->bias = c->buf[T_BIAS].data;
    p->out = c->out_in_place ? c->buf[T_X].data : c->buf[T_OUT].data;
    p->residual_out = c->res_in_place ? c->buf[T_RES].data : c->buf[T_RES_OUT].data;
    p->mean = (float *)c->buf[T_MEAN].data;
    p->rstd = (float *)c->buf[T_RSTD].data;
    if (c->out_in_place) c->is_out[T_X] = 1;
    if (c->res_in_place) c->is_out[T_RES] = 1;
}

static void fwd_case_free(fwd_case *c) {
    for (int t = 0; t < T_COUNT; ++t) fz_buf_free(&c->buf[t]);
}

/* Compares the rows x cols logical elements of an output against ref
 * (row-major dense) and checks every other byte (stride gaps) still holds
 * its snapshot. */
static void check_output(nz_ctx *z, const char *what, const fz_buf *b, fp_dtype dt, int64_t rows, int64_t cols,
                         int64_t stride, const double *ref, double atol, double rtol, int compare) {
    const size_t es = dt == FP_F32 ? 4 : 2;
    int reported = 0;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t cidx = 0; cidx < stride; ++cidx) {
            const size_t i = (size_t)(r * stride + cidx);
            if (i * es >= b->bytes) break;
            if (cidx >= cols) {
                if (memcmp(b->data + i * es, b->shadow + i * es, es) != 0 && reported++ < 3) {
                    fprintf(stderr, "seed %llu iter %ld: %s: element [%lld][%lld] past cols (%lld) was written\n",
                            (unsigned long long)z->run.seed, z->run.iter, what, (long long)r, (long long)cidx,
                            (long long)cols);
                    fp_test_failures++;
                }
                continue;
            }
            const double got = fz_load(b->data, dt, i), want = ref[r * cols + cidx];
            const int bad = !isfinite(got) || (compare && !(fabs(got - want) <= atol + rtol * fabs(want)));
            if (bad && reported++ < 3) {
                fprintf(stderr, "seed %llu iter %ld: %s[%lld][%lld] = %.7g, reference %.7g (atol %g rtol %g)\n",
                        (unsigned long long)z->run.seed, z->run.iter, what, (long long)r, (long long)cidx, got,
                        want, atol, rtol);
                fp_test_failures++;
            }
        }
    }
    FZ_CHECK_BUF(&z->run, what, b, 0);
}

/* The forward reference from the inputs' snapshots. */
static void fwd_reference(const fwd_case *c, double *out, double *res_out, double *mean, double *rstd) {
    const fp_norm_params *p = &c->p;
    const fp_dtype dt = p->x_dtype;
    const int64_t rows = p->rows, cols = p->cols;
    const int64_t xs = p->x_stride ? p->x_stride : cols, rs = p->residual_stride ? p->residual_stride : cols;
    double *sv = malloc((size_t)cols * sizeof *sv);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
            float v = fz_load(c->buf[T_X].shadow, dt, (size_t)(r * xs + j));
            if (p->residual) v = fz_round(dt, v + fz_load(c->buf[T_RES].shadow, dt, (size_t)(r * rs + j)));
            sv[j] = v;
            res_out[r * cols + j] = v;
        }
        double mu = 0.0, var = 0.0;
        if (p->kind == FP_NORM_LAYERNORM) {
            for (int64_t j = 0; j < cols; ++j) mu += sv[j];
            mu /= (double)cols;
        }
        for (int64_t j = 0; j < cols; ++j) var += (sv[j] - mu) * (sv[j] - mu);
        var /= (double)cols;
        const double rs_ = 1.0 / sqrt(var + (double)p->eps);
        mean[r] = mu;
        rstd[r] = rs_;
        for (int64_t j = 0; j < cols; ++j) {
            double y = (sv[j] - mu) * rs_;
            if (p->gamma) y *= fz_load(c->buf[T_GAMMA].shadow, dt, (size_t)j);
            if (p->beta) y += fz_load(c->buf[T_BETA].shadow, dt, (size_t)j);
            if (p->bias) y += fz_load(c->buf[T_BIAS].shadow, dt, (size_t)j);
            out[r * cols + j] = act_f(p->activation, y);
        }
    }
    free(sv);
}

static void fwd_check_success(nz_ctx *z, fwd_case *c) {
    const fp_norm_params *p = &c->p;
    const int64_t rows = p->rows, cols = p->cols, n = rows * cols;
    double *out = malloc((size_t)n * sizeof(double)), *res_out = malloc((size_t)n * sizeof(double));
    double *mean = malloc((size_t)rows * sizeof(double)), *rstd = malloc((size_t)rows * sizeof(double));
    fwd_reference(c, out, res_out, mean, rstd);
    double atol, rtol;
    tolerance(p->x_dtype, &atol, &rtol);
    const int64_t os = p->out_stride ? p->out_stride : cols;
    check_output(z, c->out_in_place ? "out (in place of x)" : "out", c->out_in_place ? &c->buf[T_X] : &c->buf[T_OUT],
                 p->x_dtype, rows, cols, os, out, atol, rtol, 1);
    if (p->residual_out)
        check_output(z, c->res_in_place ? "residual_out (in place of residual)" : "residual_out",
                     c->res_in_place ? &c->buf[T_RES] : &c->buf[T_RES_OUT], p->x_dtype, rows, cols,
                     p->residual_out_stride ? p->residual_out_stride : cols, res_out, 0, 0, 1);
    if (p->rstd) check_output(z, "rstd", &c->buf[T_RSTD], FP_F32, rows, 1, 1, rstd, 1e-5, 2e-4, 1);
    if (p->mean) {
        if (p->kind == FP_NORM_LAYERNORM)
            check_output(z, "mean", &c->buf[T_MEAN], FP_F32, rows, 1, 1, mean, 1e-5, 2e-4, 1);
        else /* RMSNorm ignores mean: left as it was */
            FZ_CHECK_BUF(&z->run, "mean (RMSNorm: ignored)", &c->buf[T_MEAN], 1);
    }
    for (int t = 0; t < T_COUNT; ++t)
        if (!c->is_out[t]) FZ_CHECK_BUF(&z->run, fwd_names[t], &c->buf[t], 1);
    free(out);
    free(res_out);
    free(mean);
    free(rstd);
}

static void check_all_unchanged(nz_ctx *z, const char *what, fz_buf *bufs, int n) {
    (void)what;
    for (int t = 0; t < n; ++t) FZ_CHECK_BUF(&z->run, what, &bufs[t], 1);
}

/* The outcome of one call of `what`: a broken call must fail naming `names`
 * with every buffer unchanged, a valid one succeed. Returns 1 when the
 * caller should check a valid call's outputs. */
static int call_outcome(nz_ctx *z, const char *what, fp_status st, int broken, const char *names, fz_buf *bufs,
                        int n) {
    char label[96], changed[96];
    snprintf(changed, sizeof changed, "%s failed: a buffer changed", what);
    snprintf(label, sizeof label, "%s (%s)", what, broken ? "one bad argument" : "valid");
    if (broken) {
        z->bad_calls++;
        FZ_CHECK_CALL(&z->run, label, st, FP_ERR_INVALID_ARGUMENT, names);
        check_all_unchanged(z, changed, bufs, n);
        return 0;
    }
    z->ok_calls++;
    if (FZ_CHECK_CALL(&z->run, label, st, FP_OK, NULL) == FP_OK) return 1;
    check_all_unchanged(z, changed, bufs, n);
    return 0;
}

/* A validate run of one or two samples: only what it writes matters here. */
static void tiny_timing(fp_timing_config *cfg) {
    fp_timing_config_default(cfg);
    cfg->warmup = 0;
    cfg->min_samples = 1;
    cfg->max_samples = 2;
    cfg->max_time_s = 0.05;
    cfg->min_sample_ms = 0.0;
}

/* NULL params: the message names the caller's argument. */
static const char *null_params_name(void) { return "params"; }

/* One broken argument of a valid forward call. Returns the name the message
 * must contain (NULL: any message), or "" if the mutation does not apply. */
static const char *fwd_break(nz_ctx *z, fwd_case *c, fp_context **ctx, const fp_norm_params **pp) {
    uint64_t *s = &z->rng;
    fp_norm_params *p = &c->p;
    const int64_t cols = p->cols;
    switch (fz_range(s, 0, 19)) {
    case 0: *pp = NULL; return null_params_name();
    case 1: *ctx = NULL; return "ctx";
    case 2: p->struct_size = fz_chance(s, 1, 2) ? 0 : sizeof *p + (size_t)fz_range(s, -16, 16) * 8;
        return p->struct_size == sizeof *p ? "" : "struct_size";
    case 3: p->kind = (fp_norm_kind)(fz_chance(s, 1, 2) ? -1 : fz_range(s, 2, 1000)); return "kind";
    case 4: p->activation = (fp_norm_activation)(fz_chance(s, 1, 2) ? -1 : fz_range(s, 5, 1 << 30)); return "activation";
    case 5: p->rows = fz_chance(s, 1, 2) ? 0 : (fz_chance(s, 1, 2) ? INT64_MIN : -fz_range(s, 1, 100)); return "rows";
    case 6: p->cols = fz_chance(s, 1, 2) ? 0 : -fz_range(s, 1, 100); return "cols";
    case 7: {
        const fp_dtype bad[] = {FP_FP8_E4M3, FP_FP8_E5M2, (fp_dtype)7, (fp_dtype)-1};
        p->x_dtype = bad[fz_range(s, 0, 3)];
        return "x_dtype";
    }
    case 8: { /* a valid dtype different from x_dtype on one of the others */
        fp_dtype other = (fp_dtype)((p->x_dtype + fz_range(s, 1, 2)) % 3);
        int which = (int)fz_range(s, 0, 2);
        if (which == 0) { p->residual_dtype = other; return "residual_dtype"; }
        if (which == 1) { p->out_dtype = other; return "out_dtype"; }
        p->param_dtype = other;
        return "param_dtype";
    }
    case 9: p->x = NULL; return "x";
    case 10: p->out = NULL; return "out";
    case 11: {
        const float bad[] = {0.0f, -1e-5f, NAN, INFINITY, -INFINITY, -0.0f};
        p->eps = bad[fz_range(s, 0, 5)];
        return "eps";
    }
    case 12: case 13: { /* a pointer one byte (or, for f32, 2 bytes) off its alignment */
        const void **slots[] = {&p->x, &p->residual, &p->gamma, &p->beta, &p->bias, (const void **)&p->out,
                                (const void **)&p->residual_out};
        const char *names[] = {"x", "residual", "gamma", "beta", "bias", "out", "residual_out"};
        int k = (int)fz_range(s, 0, 6);
        if (!*slots[k]) return "";
        *slots[k] = (const char *)*slots[k] + (p->x_dtype == FP_F32 ? fz_range(s, 1, 3) : 1);
        return names[k];
    }
    case 14: {
        if (!p->rstd && !(p->mean && p->kind == FP_NORM_LAYERNORM)) return "";
        if (p->rstd && (fz_chance(s, 1, 2) || !p->mean || p->kind != FP_NORM_LAYERNORM)) {
            p->rstd = (float *)((char *)p->rstd + fz_range(s, 1, 3));
            return "rstd";
        }
        p->mean = (float *)((char *)p->mean + fz_range(s, 1, 3));
        return "mean";
    }
    case 15: case 16: { /* a stride below cols, or negative */
        int64_t *slots[] = {&p->x_stride, &p->residual_stride, &p->residual_out_stride, &p->out_stride};
        const char *names[] = {"x_stride", "residual_stride", "residual_out_stride", "out_stride"};
        int k = (int)fz_range(s, 0, 3);
        if (cols > 1 && fz_chance(s, 1, 2)) *slots[k] = fz_range(s, 1, cols - 1);
        else *slots[k] = fz_chance(s, 1, 2) ? -1 : INT64_MIN;
        if (k == 3 && c->out_in_place) return ""; /* also an aliasing change: leave it */
        return names[k];
    }
    case 17: { /* a stride whose product with rows overflows */
        int64_t *slots[] = {&p->x_stride, &p->residual_stride, &p->residual_out_stride, &p->out_stride};
        const char *names[] = {"x_stride", "residual_stride", "residual_out_stride", "out_stride"};
        int k = (int)fz_range(s, 0, 3);
        if (k == 3 && c->out_in_place) return "";
        *slots[k] = fz_chance(s, 1, 2) ? INT64_MAX : INT64_MAX / fz_range(s, 1, 7);
        return names[k];
    }
    case 18: /* rows whose product with any stride overflows 8-byte element offsets */
        p->rows = INT64_MAX / fz_range(s, 1, 7);
        return "rows";
    default: /* cols whose row buffers cannot exist: rejected before any read */
        p->cols = INT64_MAX / fz_range(s, 1, 4);
        p->x_stride = p->residual_stride = p->residual_out_stride = p->out_stride = 0;
        p->rows = fz_range(s, 2, 9);
        return NULL;
    }
}

static void fuzz_forward(nz_ctx *z) {
    fwd_case c;
    fwd_case_make(z, &c);
    fp_context *ctx = z->ctx;
    const fp_norm_params *pp = &c.p;
    const int broken = fz_chance(&z->rng, 1, 2);
    const char *names = broken ? fwd_break(z, &c, &ctx, &pp) : NULL;
    if (broken && names && !*names) {
        fwd_case_free(&c);
        return;
    }
    if (getenv("FP_FUZZ_VERBOSE"))
        printf("iter %ld forward%s: kind %d act %d dtype %d rows %lld cols %lld strides %lld/%lld/%lld/%lld "
               "res %d gamma %d beta %d bias %d res_out %d mean %d rstd %d in_place %d\n",
               z->run.iter, broken ? " (broken)" : "", c.p.kind, c.p.activation, c.p.x_dtype, (long long)c.p.rows,
               (long long)c.p.cols, (long long)c.p.x_stride, (long long)c.p.residual_stride,
               (long long)c.p.residual_out_stride, (long long)c.p.out_stride, !!c.p.residual, !!c.p.gamma, !!c.p.beta,
               !!c.p.bias, !!c.p.residual_out, !!c.p.mean, !!c.p.rstd, c.out_in_place);
    fflush(stdout);
    fp_clear_error();
    fp_status st = fp_norm_forward(ctx, NULL, pp);
    if (call_outcome(z, "fp_norm_forward", st, broken, names, c.buf, T_COUNT)) fwd_check_success(z, &c);
    /* now and then: validate writes only its own scratch */
    if (!broken && fz_chance(&z->rng, 1, 40) && c.p.rows * c.p.cols <= 4096) {
        for (int t = 0; t < T_COUNT; ++t) fz_buf_snapshot(&c.buf[t]);
        fp_timing_config cfg;
        tiny_timing(&cfg);
        fp_ab_report rep;
        memset(&rep, 0, sizeof rep);
        st = fp_norm_validate(z->ctx, NULL, &c.p, &cfg, &rep);
        FZ_CHECK_CALL(&z->run, "fp_norm_validate", st, FP_OK, NULL);
        if (st == FP_OK) CHECK_MSG(rep.compared && rep.agreement.passed, "validate disagreement (seed %llu iter %ld)",
                                   (unsigned long long)z->run.seed, z->run.iter);
        check_all_unchanged(z, "fp_norm_validate wrote a caller buffer", c.buf, T_COUNT);
    }
    fwd_case_free(&c);
}

/* ---- backward ---- */

enum { B_DOUT, B_X, B_GAMMA, B_BETA, B_BIAS, B_MEAN, B_RSTD, B_DRES, B_DX, B_DGAMMA, B_DBETA, B_DBIAS, B_COUNT };
static const char *const bwd_names[B_COUNT] = {"dout", "x", "gamma", "beta", "bias", "mean",
                                               "rstd", "dresidual_out", "dx", "dgamma", "dbeta", "dbias"};

typedef struct bwd_case {
    fp_norm_backward_params p;
    fz_buf buf[B_COUNT];
    int is_out[B_COUNT];
    int dx_in_place; /* dx == dout */
} bwd_case;

static void bwd_case_make(nz_ctx *z, bwd_case *c) {
    uint64_t *s = &z->rng;
    memset(c, 0, sizeof *c);
    fp_norm_backward_params *p = &c->p;
    fp_norm_backward_params_default(p);
    p->kind = (fp_norm_kind)fz_range(s, 0, 1);
    p->activation = (fp_norm_activation)fz_range(s, 0, 4);
    fp_dtype dt = (fp_dtype)fz_range(s, 0, 2);
    p->dtype = p->param_dtype = dt;
    p->rows = fz_range(s, 1, 9);
    p->cols = fz_chance(s, 1, 8) ? fz_range(s, 300, 1100) : fz_range(s, 1, 70);
    const size_t es = fp_dtype_size(dt);
    const int64_t rows = p->rows, cols = p->cols;
    p->dout_stride = draw_stride(s, cols);
    p->x_stride = draw_stride(s, cols);
    p->dresidual_out_stride = draw_stride(s, cols);
    p->dx_stride = draw_stride(s, cols);
    c->dx_in_place = fz_chance(s, 1, 6);
    if (c->dx_in_place) p->dx_stride = p->dout_stride;
    const int64_t ds = p->dout_stride ? p->dout_stride : cols, xs = p->x_stride ? p->x_stride : cols;
    const int64_t rs = p->dresidual_out_stride ? p->dresidual_out_stride : cols, dxs = p->dx_stride ? p->dx_stride : cols;
    const int has[B_COUNT] = {1, 1, fz_chance(s, 2, 3), fz_chance(s, 1, 2), fz_chance(s, 1, 3), 1, 1,
                              fz_chance(s, 1, 2), !c->dx_in_place, fz_chance(s, 1, 2), fz_chance(s, 1, 2),
                              fz_chance(s, 1, 3)};
    const size_t elems[B_COUNT] = {(size_t)(rows * ds), (size_t)(rows * xs), (size_t)cols, (size_t)cols, (size_t)cols,
                                   (size_t)rows, (size_t)rows, (size_t)(rows * rs), (size_t)(rows * dxs), (size_t)cols,
                                   (size_t)cols, (size_t)cols};
    for (int t = 0; t < B_COUNT; ++t) {
        if (!has[t] || (t == B_MEAN && p->kind == FP_NORM_RMSNORM && fz_chance(s, 1, 2))) continue;
        const int stat = t == B_MEAN || t == B_RSTD;
        const size_t e = stat ? 4 : es;
        c->buf[t] = fz_buf_new(elems[t] * e, shift_for(s, e));
        c->is_out[t] = t >= B_DX;
        if (!c->is_out[t] && !stat) {
            if (t == B_GAMMA) fz_fill(c->buf[t].data, dt, elems[t], s, 0.25, 2.0);
            else fz_fill(c->buf[t].data, dt, elems[t], s, -1.5, 1.5);
        }
    }
    /* mean / rstd: the forward's statistics of x (f32) */
    for (int64_t r = 0; r < rows; ++r) {
        double mu = 0.0, var = 0.0;
        for (int64_t j = 0; j < cols; ++j) mu += fz_load(c->buf[B_X].data, dt, (size_t)(r * xs + j));
        mu = p->kind == FP_NORM_LAYERNORM ? mu / (double)cols : 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            double d = fz_load(c->buf[B_X].data, dt, (size_t)(r * xs + j)) - mu;
            var += d * d;
        }
        if (c->buf[B_MEAN].raw) ((float *)c->buf[B_MEAN].data)[r] = (float)mu;
        ((float *)c->buf[B_RSTD].data)[r] = (float)(1.0 / sqrt(var / (double)cols + 1e-5));
    }
    for (int t = 0; t < B_COUNT; ++t)
        if (c->buf[t].raw && !c->is_out[t]) fz_buf_snapshot(&c->buf[t]);
    p->dout = c->buf[B_DOUT].data;
    p->x = c->buf[B_X].data;
    p->gamma = c->buf[B_GAMMA].data;
    p->beta = c->buf[B_BETA].data;
    p->bias = c->buf[B_BIAS].data;
    p->mean = (const float *)c->buf[B_MEAN].data;
    p->rstd = (const float *)c->buf[B_RSTD].data;
    p->dresidual_out = c->buf[B_DRES].data;
    p->dx = c->dx_in_place ? c->buf[B_DOUT].data : c->buf[B_DX].data;
    p->dgamma = c->buf[B_DGAMMA].data;
    p->dbeta = c->buf[B_DBETA].data;
    p->dbias = c->buf[B_DBIAS].data;
    if (c->dx_in_place) c->is_out[B_DOUT] = 1;
}

static void bwd_case_free(bwd_case *c) {
    for (int t = 0; t < B_COUNT; ++t) fz_buf_free(&c->buf[t]);
}

/* Reference gradients from the snapshots; returns 0 when a ReLU input sits
 * so close to 0 that f32 and double may disagree on its side (the values
 * are then not compared). */
static int bwd_reference(const bwd_case *c, double *dx, double *dgamma, double *dbeta) {
    const fp_norm_backward_params *p = &c->p;
    const fp_dtype dt = p->dtype;
    const int64_t rows = p->rows, cols = p->cols;
    const int64_t ds = p->dout_stride ? p->dout_stride : cols, xs = p->x_stride ? p->x_stride : cols;
    const int64_t rs = p->dresidual_out_stride ? p->dresidual_out_stride : cols;
    double *n = malloc((size_t)cols * sizeof *n), *dn = malloc((size_t)cols * sizeof *dn);
    int clear = 1;
    for (int64_t j = 0; j < cols; ++j) dgamma[j] = dbeta[j] = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
        const double mu = p->kind == FP_NORM_LAYERNORM ? ((const float *)c->buf[B_MEAN].shadow)[r] : 0.0;
        const double rstd = ((const float *)c->buf[B_RSTD].shadow)[r];
        double s_dn = 0.0, s_dnn = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            const double xv = fz_load(c->buf[B_X].shadow, dt, (size_t)(r * xs + j));
            const double gm = p->gamma ? fz_load(c->buf[B_GAMMA].shadow, dt, (size_t)j) : 1.0;
            n[j] = (xv - mu) * rstd;
            double y = n[j] * gm;
            if (p->beta) y += fz_load(c->buf[B_BETA].shadow, dt, (size_t)j);
            if (p->bias) y += fz_load(c->buf[B_BIAS].shadow, dt, (size_t)j);
            if (p->activation == FP_NORM_ACT_RELU && fabs(y) < 1e-3) clear = 0;
            const double g = fz_load(c->buf[B_DOUT].shadow, dt, (size_t)(r * ds + j)) * act_d(p->activation, y);
            dgamma[j] += g * n[j];
            dbeta[j] += g;
            dn[j] = g * gm;
            s_dn += dn[j];
            s_dnn += dn[j] * n[j];
        }
        s_dn /= (double)cols;
        s_dnn /= (double)cols;
        for (int64_t j = 0; j < cols; ++j) {
            double v = rstd * (dn[j] - (p->kind == FP_NORM_LAYERNORM ? s_dn : 0.0) - n[j] * s_dnn);
            if (p->dresidual_out) v += fz_load(c->buf[B_DRES].shadow, dt, (size_t)(r * rs + j));
            dx[r * cols + j] = v;
        }
    }
    free(n);
    free(dn);
    return clear;
}

static void bwd_check_success(nz_ctx *z, bwd_case *c) {
    const fp_norm_backward_params *p = &c->p;
    const int64_t rows = p->rows, cols = p->cols;
    double *dx = malloc((size_t)(rows * cols) * sizeof(double));
    double *dg = malloc((size_t)cols * sizeof(double)), *db = malloc((size_t)cols * sizeof(double));
    const int compare = bwd_reference(c, dx, dg, db);
    double atol, rtol;
    tolerance(p->dtype, &atol, &rtol);
    /* dx mixes row averages: scale the absolute part by the row's gradient
     * magnitude (rstd can be large) */
    double dx_max = 0.0, dg_max = 0.0;
    for (int64_t i = 0; i < rows * cols; ++i) dx_max = fmax(dx_max, fabs(dx[i]));
    for (int64_t j = 0; j < cols; ++j) dg_max = fmax(dg_max, fmax(fabs(dg[j]), fabs(db[j])));
    check_output(z, c->dx_in_place ? "dx (in place of dout)" : "dx", c->dx_in_place ? &c->buf[B_DOUT] : &c->buf[B_DX],
                 p->dtype, rows, cols, p->dx_stride ? p->dx_stride : cols, dx, atol * (1.0 + dx_max), rtol, compare);
    if (p->dgamma)
        check_output(z, "dgamma", &c->buf[B_DGAMMA], p->dtype, 1, cols, cols, dg, atol * (1.0 + dg_max), rtol, compare);
    if (p->dbeta)
        check_output(z, "dbeta", &c->buf[B_DBETA], p->dtype, 1, cols, cols, db, atol * (1.0 + dg_max), rtol, compare);
    if (p->dbias)
        check_output(z, "dbias", &c->buf[B_DBIAS], p->dtype, 1, cols, cols, db, atol * (1.0 + dg_max), rtol, compare);
    for (int t = 0; t < B_COUNT; ++t)
        if (!c->is_out[t]) FZ_CHECK_BUF(&z->run, bwd_names[t], &c->buf[t], 1);
    free(dx);
    free(dg);
    free(db);
}

static const char *bwd_break(nz_ctx *z, bwd_case *c, fp_context **ctx, const fp_norm_backward_params **pp) {
    uint64_t *s = &z->rng;
    fp_norm_backward_params *p = &c->p;
    const int64_t cols = p->cols;
    switch (fz_range(s, 0, 15)) {
    case 0: *pp = NULL; return null_params_name();
    case 1: *ctx = NULL; return "ctx";
    case 2: p->struct_size = sizeof *p - 8; return "struct_size";
    case 3: p->kind = (fp_norm_kind)fz_range(s, 2, 9); return "kind";
    case 4: p->activation = (fp_norm_activation)-fz_range(s, 1, 9); return "activation";
    case 5: p->rows = -fz_range(s, 0, 9); return "rows";
    case 6: p->cols = -fz_range(s, 0, 9); return "cols";
    case 7: p->dtype = FP_FP8_E5M2; return "dtype";
    case 8: p->param_dtype = (fp_dtype)((p->dtype + 1) % 3); return "param_dtype";
    case 9: {
        const int k = (int)fz_range(s, 0, 3);
        if (k == 0) { p->dout = NULL; return "dout"; }
        if (k == 1) { p->x = NULL; return "x"; }
        if (k == 2) { p->rstd = NULL; return "rstd"; }
        p->dx = NULL;
        return "dx";
    }
    case 10:
        if (p->kind != FP_NORM_LAYERNORM) return "";
        p->mean = NULL;
        return "mean";
    case 11: case 12: {
        const void **slots[] = {&p->dout, &p->x, &p->gamma, &p->beta, &p->bias, &p->dresidual_out,
                                (const void **)&p->dx, (const void **)&p->dgamma, (const void **)&p->dbeta,
                                (const void **)&p->dbias};
        const char *names[] = {"dout", "x", "gamma", "beta", "bias", "dresidual_out", "dx", "dgamma", "dbeta", "dbias"};
        int k = (int)fz_range(s, 0, 9);
        if (!*slots[k] || (c->dx_in_place && (k == 0 || k == 6))) return "";
        *slots[k] = (const char *)*slots[k] + 1;
        return names[k];
    }
    case 13: p->rstd = (const float *)((const char *)p->rstd + 2); return "rstd";
    case 14: {
        int64_t *slots[] = {&p->dout_stride, &p->x_stride, &p->dresidual_out_stride, &p->dx_stride};
        const char *names[] = {"dout_stride", "x_stride", "dresidual_out_stride", "dx_stride"};
        int k = (int)fz_range(s, 0, 3);
        if (c->dx_in_place && (k == 0 || k == 3)) return "";
        *slots[k] = cols > 1 ? fz_range(s, 1, cols - 1) : -1;
        return names[k];
    }
    default: {
        int64_t *slots[] = {&p->dout_stride, &p->x_stride, &p->dresidual_out_stride, &p->dx_stride};
        const char *names[] = {"dout_stride", "x_stride", "dresidual_out_stride", "dx_stride"};
        int k = (int)fz_range(s, 0, 3);
        if (c->dx_in_place && (k == 0 || k == 3)) return "";
        *slots[k] = INT64_MAX - fz_range(s, 0, 9);
        return names[k];
    }
    }
}

static void fuzz_backward(nz_ctx *z) {
    bwd_case c;
    bwd_case_make(z, &c);
    fp_context *ctx = z->ctx;
    const fp_norm_backward_params *pp = &c.p;
    const int broken = fz_chance(&z->rng, 1, 2);
    const char *names = broken ? bwd_break(z, &c, &ctx, &pp) : NULL;
    if (broken && names && !*names) {
        bwd_case_free(&c);
        return;
    }
    fp_clear_error();
    fp_status st = fp_norm_backward(ctx, NULL, pp);
    if (call_outcome(z, "fp_norm_backward", st, broken, names, c.buf, B_COUNT)) bwd_check_success(z, &c);
    if (!broken && fz_chance(&z->rng, 1, 40) && c.p.rows * c.p.cols <= 4096) {
        for (int t = 0; t < B_COUNT; ++t) fz_buf_snapshot(&c.buf[t]);
        fp_timing_config cfg;
        tiny_timing(&cfg);
        fp_ab_report rep;
        memset(&rep, 0, sizeof rep);
        st = fp_norm_backward_validate(z->ctx, NULL, &c.p, &cfg, &rep);
        FZ_CHECK_CALL(&z->run, "fp_norm_backward_validate", st, FP_OK, NULL);
        check_all_unchanged(z, "fp_norm_backward_validate wrote a caller buffer", c.buf, B_COUNT);
    }
    bwd_case_free(&c);
}

/* Names, byte counts and validate on bad input. */
static void helpers(nz_ctx *z) {
    CHECK(strcmp(fp_norm_kind_name((fp_norm_kind)7), "unknown") == 0);
    CHECK(strcmp(fp_norm_activation_name((fp_norm_activation)-1), "unknown") == 0);
    fp_norm_params p;
    fp_norm_params_default(&p);
    fp_norm_params_default(NULL);
    fp_norm_backward_params_default(NULL);
    CHECK(fp_norm_forward_bytes(NULL) == 0.0 && fp_norm_forward_bytes(&p) == 0.0); /* rows 0: invalid */
    CHECK(fp_norm_backward_bytes(NULL) == 0.0);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    p.rows = 2;
    p.cols = 4;
    p.x = x;
    p.out = out;
    CHECK(fp_norm_forward_bytes(&p) > 0.0);
    fp_ab_report rep;
    FZ_CHECK_CALL(&z->run, "fp_norm_validate(NULL report)", fp_norm_validate(z->ctx, NULL, &p, NULL, NULL),
                  FP_ERR_INVALID_ARGUMENT, "report");
    fp_timing_config bad;
    fp_timing_config_default(&bad);
    bad.min_samples = 0;
    memset(out, 0x7F, sizeof out);
    FZ_CHECK_CALL(&z->run, "fp_norm_validate(bad timing config)", fp_norm_validate(z->ctx, NULL, &p, &bad, &rep),
                  FP_ERR_INVALID_ARGUMENT, "min_samples");
    for (int i = 0; i < 8; ++i) CHECK(((unsigned char *)out)[i] == 0x7F);
    fp_norm_backward_params b;
    fp_norm_backward_params_default(&b);
    FZ_CHECK_CALL(&z->run, "fp_norm_backward_validate(NULL params)", fp_norm_backward_validate(z->ctx, NULL, NULL, NULL, &rep),
                  FP_ERR_INVALID_ARGUMENT, NULL);
    FZ_CHECK_CALL(&z->run, "fp_norm_backward_validate(rows 0)", fp_norm_backward_validate(z->ctx, NULL, &b, NULL, &rep),
                  FP_ERR_INVALID_ARGUMENT, "rows");
}

int main(int argc, char **argv) {
    nz_ctx z;
    memset(&z, 0, sizeof z);
    z.run = fz_run_init(argc, argv, 0x6e6f726dULL, 1500, 4.0);
    z.rng = z.run.seed * 0x9E3779B97F4A7C15ULL + 7;
    if (fp_context_create(FP_DEVICE_CPU, -1, &z.ctx) != FP_OK) {
        fprintf(stderr, "CPU context: %s\n", fp_last_error());
        return 1;
    }
    CHECK_OK(fp_context_set_option(z.ctx, FP_CTX_CPU_THREADS, 2));
    helpers(&z);
    for (; fz_more(&z.run) && !fz_too_many_failures(); ++z.run.iter) {
        if (fz_chance(&z.rng, 1, 2)) fuzz_forward(&z);
        else fuzz_backward(&z);
    }
    printf("norm fuzz: %ld iterations, %ld valid calls, %ld with a broken argument\n", z.run.iter, z.ok_calls,
           z.bad_calls);
    fp_context_destroy(z.ctx);
    TEST_END();
}
