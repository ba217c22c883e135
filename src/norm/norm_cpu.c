/* CPU implementations of the fused norm.
 *
 *   fp_norm_fwd_cpu          fused: one pass over memory per row (the row is
 *                            held in a per-chunk f32 buffer), rows split over
 *                            the context's worker threads.
 *   fp_norm_fwd_cpu_unfused  the baseline: add; norm; affine; activation as
 *                            separate passes over the whole tensor, each
 *                            intermediate stored in the tensor dtype in out.
 *   fp_norm_bwd_cpu          fused backward; dgamma/dbeta are summed per
 *                            fixed chunk of rows, then over chunks in order,
 *                            so the result does not depend on the threads.
 *
 * The fused rows run in one of two versions, the same chunking around both:
 *   AVX2   norm_cpu_avx2.c (AVX2 + FMA + F16C, 8 lanes, its own flags), used
 *          when the CPU has them (fp_norm_cpu_simd());
 *   portable  the loops below (GCC vectorizes them for the baseline ISA);
 *          FASTPATH_NORM_CPU=portable forces it, test_norm_cpu_portable
 *          runs the suite on it.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "norm/norm_cpu_simd.h"

/* ---- path selection (portable code: runs before any AVX2 instruction) ---- */

static atomic_int g_env_portable = -1; /* FASTPATH_NORM_CPU=portable, read once */
static atomic_int g_force_portable = -1; /* -1: follow the environment */

/* AVX2, FMA and F16C, and an OS that saves the YMM state. */
int fp_norm_cpu_has_avx2(void) {
    const int need = FP_CPU_AVX2_FMA | FP_CPU_AVX2_F16C;
    return (fp_cpu_features() & need) == need;
}

int fp_norm_cpu_simd(void) {
    if (!fp_norm_avx2_built) return 0;
    int force = atomic_load(&g_force_portable);
    if (force < 0) {
        int env = atomic_load(&g_env_portable);
        if (env < 0) {
            const char *v = getenv("FASTPATH_NORM_CPU");
            env = v && strcmp(v, "portable") == 0;
            atomic_store(&g_env_portable, env);
        }
        force = env;
    }
    return !force && fp_norm_cpu_has_avx2();
}

void fp_norm_cpu_force_portable(int on) { atomic_store(&g_force_portable, on < 0 ? -1 : on != 0); }

/* ---- row helpers ---- */

static void load_row(float *dst, const void *src, int dt, int64_t n) {
    switch (dt) {
    case FP_F16: for (int64_t i = 0; i < n; ++i) dst[i] = fp_h2f(((const uint16_t *)src)[i]); break;
    case FP_BF16: for (int64_t i = 0; i < n; ++i) dst[i] = fp_b2f(((const uint16_t *)src)[i]); break;
    default: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    }
}
static void store_row(void *dst, int dt, const float *src, int64_t n) {
    switch (dt) {
    case FP_F16: for (int64_t i = 0; i < n; ++i) ((uint16_t *)dst)[i] = fp_f2h(src[i]); break;
    case FP_BF16: for (int64_t i = 0; i < n; ++i) ((uint16_t *)dst)[i] = fp_f2b(src[i]); break;
    default: memmove(dst, src, (size_t)n * sizeof(float)); break;
    }
}
static void round_row(float *v, int dt, int64_t n) {
    if (dt == FP_F32) return;
    for (int64_t i = 0; i < n; ++i) v[i] = fp_round_to(dt, v[i]);
}
static const char *row_c(const void *base, int64_t r, int64_t stride, size_t es) {
    return (const char *)base + (size_t)r * (size_t)stride * es;
}
static char *row_m(void *base, int64_t r, int64_t stride, size_t es) {
    return (char *)base + (size_t)r * (size_t)stride * es;
}

/* mean and rstd of a row held in f32: two passes over registers/cache, f32
 * accumulation in 8 independent partial sums (vectorizes, and the pairwise
 * sums keep the rounding error ~sqrt(n) smaller than a single chain). */
static float row_sum(const float *v, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += v[i + k];
    float s = 0.0f;
    for (; i < n; ++i) s += v[i];
    return s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
static float row_sq_dev(const float *v, int64_t n, float mean) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) {
            float t = v[i + k] - mean;
            acc[k] += t * t;
        }
    float s = 0.0f;
    for (; i < n; ++i) s += (v[i] - mean) * (v[i] - mean);
    return s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
/* LayerNorm subtracts shift = s[0] first: the f32 sums then carry no large
 * offset (a mean of 1e4 with a spread of 1 keeps its digits). s becomes
 * s - shift; the mean of that is *delta, the row's mean shift + *delta. */
static void row_stats(int kind, float *s, int64_t n, float eps, float *shift, float *delta, float *rstd) {
    float k = kind == FP_NORM_LAYERNORM ? s[0] : 0.0f, m = 0.0f;
    if (kind == FP_NORM_LAYERNORM) {
        for (int64_t j = 0; j < n; ++j) s[j] -= k;
        m = row_sum(s, n) / (float)n;
    }
    float var = row_sq_dev(s, n, m) / (float)n;
    *shift = k;
    *delta = m;
    *rstd = 1.0f / sqrtf(var + eps);
}

/* Activation / its derivative over a row, in place. The switch is outside
 * the loops, and each loop calls a branch-free helper of norm_internal.h,
 * which GCC vectorizes (the glibc erff / tanhf / expf calls they replace
 * were scalar: glibc's vector math needs -ffast-math; 5-7x on the fused
 * rows with an activation). */
static void act_row(float *v, int64_t n, int act) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF:
        for (int64_t j = 0; j < n; ++j) v[j] = fp_norm_vgelu_erf(v[j]);
        break;
    case FP_NORM_ACT_GELU_TANH:
        for (int64_t j = 0; j < n; ++j) v[j] = fp_norm_vgelu_tanh(v[j]);
        break;
    case FP_NORM_ACT_RELU:
        for (int64_t j = 0; j < n; ++j) v[j] = v[j] > 0.0f ? v[j] : 0.0f;
        break;
    case FP_NORM_ACT_SILU:
        for (int64_t j = 0; j < n; ++j) v[j] = fp_norm_vsilu(v[j]);
        break;
    default: break;
    }
}
static void dact_row(float *v, int64_t n, int act) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF:
        for (int64_t j = 0; j < n; ++j) v[j] = fp_norm_vdgelu_erf(v[j]);
        break;
    case FP_NORM_ACT_GELU_TANH:
        for (int64_t j = 0; j < n; ++j) v[j] = fp_norm_vdgelu_tanh(v[j]);
        break;
    case FP_NORM_ACT_RELU:
        for (int64_t j = 0; j < n; ++j) v[j] = v[j] > 0.0f ? 1.0f : 0.0f;
        break;
    case FP_NORM_ACT_SILU:
        for (int64_t j = 0; j < n; ++j) v[j] = fp_norm_vdsilu(v[j]);
        break;
    default:
        for (int64_t j = 0; j < n; ++j) v[j] = 1.0f;
        break;
    }
}

/* Row scratch length: cols rounded up to the AVX2 kernels' 8 lanes (they
 * run whole vectors over it; the padding is masked or never stored). */
static int64_t padded(int64_t cols) { return cols + (-cols & 7); }

/* Chunks of rows with their own scratch: fp_parallel_for's callbacks cannot
 * fail, so all scratch is allocated before any output is written. */
static int64_t chunk_count(fp_thread_pool *pool, int64_t rows) {
    int64_t threads = pool ? fp_thread_pool_size(pool) : 1;
    int64_t c = threads * 4;
    return c < rows ? c : rows;
}

/* Below this many elements a call runs on the calling thread: waking a
 * sleeping worker costs more (5-10 us on bare metal, 50-70 us measured on a
 * 2-core VM) than the work (about 1-2 ns per element). */
#define NORM_CPU_INLINE_ELEMS 16384

/* fp_parallel_for's grain for nchunks chunks of a rows x cols call: all of
 * them (the caller runs them inline) for a small call, else 1. The chunks
 * themselves are unchanged, so the results do not depend on it. */
static size_t chunk_grain(int64_t rows, int64_t cols, int64_t nchunks) {
    return rows * cols < NORM_CPU_INLINE_ELEMS ? (size_t)nchunks : 1;
}

/* ======================================================================== */
/*  Fused forward                                                           */
/* ======================================================================== */

typedef struct fwd_ctx {
    const fp_norm_fwd_desc *d;
    float *scratch;    /* gamma, beta+bias, then [nchunks] row s: padded(cols) floats each */
    int64_t nchunks;
    int simd;          /* fp_norm_cpu_simd() */
} fwd_ctx;

static void fwd_chunk(void *arg, size_t begin, size_t end) {
    const fwd_ctx *c = arg;
    const fp_norm_fwd_desc *d = c->d;
    const int64_t n = d->cols;
    const int dt = d->dtype;
    const size_t es = fp_dtype_size((fp_dtype)dt);
    const int64_t np = padded(n);
    const float *g = c->scratch, *b = g + np;
    for (size_t ch = begin; ch < end; ++ch) {
        float *s = c->scratch + (2 + ch) * (size_t)np;
        int64_t r0 = (int64_t)ch * d->rows / c->nchunks, r1 = ((int64_t)ch + 1) * d->rows / c->nchunks;
        if (c->simd) {
            for (int64_t r = r0; r < r1; ++r) fp_norm_avx2_fwd_row(d, r, s, g, b);
            continue;
        }
        for (int64_t r = r0; r < r1; ++r) {
            load_row(s, row_c(d->x, r, d->x_stride, es), dt, n);
            if (d->res) {
                const char *rp = row_c(d->res, r, d->res_stride, es);
                for (int64_t j = 0; j < n; ++j) s[j] += fp_load_f32(rp, dt, j);
                round_row(s, dt, n);
            }
            if (d->res_out) store_row(row_m(d->res_out, r, d->res_out_stride, es), dt, s, n);
            float shift, mean, rstd;
            row_stats(d->kind, s, n, d->eps, &shift, &mean, &rstd);
            if (d->mean) d->mean[r] = shift + mean;
            if (d->rstd) d->rstd[r] = rstd;
            for (int64_t j = 0; j < n; ++j) s[j] = (s[j] - mean) * rstd * g[j] + b[j];
            act_row(s, n, d->act);
            store_row(row_m(d->out, r, d->out_stride, es), dt, s, n);
        }
    }
}

/* malloc of nchunks * per_row * cols floats; NULL (not a short buffer) when
 * the size overflows: rows * cols is only bounded by the stride check
 * (rows * cols * 8 <= INT64_MAX), and e.g. 24 * cols can wrap for one row. */
static float *scratch_alloc(int64_t nchunks, size_t per_row, int64_t cols) {
    const size_t n = (size_t)nchunks, c = (size_t)cols;
    if (c > SIZE_MAX / sizeof(float) / per_row / n) return NULL;
    return malloc(n * per_row * c * sizeof(float));
}

/* The per-column vectors in f32, converted once per call and shared by
 * the chunks: g = gamma (NULL: 1), sh = beta + bias (bias is added after
 * beta by definition, and the f32 sum is what both paths add). Padding up
 * to np: g 1, sh 0. */
static void param_rows(const void *gamma, const void *beta, const void *bias, int dt, int64_t n, int64_t np,
                       float *g, float *sh) {
    for (int64_t j = 0; j < np; ++j) {
        const int in = j < n;
        g[j] = in && gamma ? fp_load_f32(gamma, (fp_dtype)dt, j) : 1.0f;
        const float b = in && beta ? fp_load_f32(beta, (fp_dtype)dt, j) : 0.0f;
        sh[j] = in && bias ? b + fp_load_f32(bias, (fp_dtype)dt, j) : b;
    }
}

fp_status fp_norm_fwd_cpu(fp_thread_pool *pool, const fp_norm_fwd_desc *d) {
    fwd_ctx c = {d, NULL, chunk_count(pool, d->rows), fp_norm_cpu_simd()};
    const int64_t np = padded(d->cols);
    c.scratch = scratch_alloc(1, (size_t)c.nchunks + 2, np);
    if (!c.scratch)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "norm: %lld x %lld floats of row scratch",
                            (long long)c.nchunks + 2, (long long)d->cols);
    param_rows(d->gamma, d->beta, d->bias, d->dtype, d->cols, np, c.scratch, c.scratch + np);
    if (pool) fp_parallel_for(pool, (size_t)c.nchunks, chunk_grain(d->rows, d->cols, c.nchunks), fwd_chunk, &c);
    else fwd_chunk(&c, 0, (size_t)c.nchunks);
    free(c.scratch);
    return FP_OK;
}

/* ======================================================================== */
/*  Unfused forward (baseline): one pass over the tensor per step           */
/* ======================================================================== */

enum { STEP_ADD, STEP_NORM, STEP_AFFINE, STEP_ACT };

/* The baseline's activation passes use the fused path's row helpers (AVX2
 * or portable, as the fused op), so validate's speedup measures the fusion,
 * not two activation implementations; UNF_BLOCK floats on the stack. */
enum { UNF_BLOCK = 512 };

typedef struct unf_ctx {
    const fp_norm_fwd_desc *d;
    int step;
} unf_ctx;

static void unf_rows(void *arg, size_t begin, size_t end) {
    const unf_ctx *c = arg;
    const fp_norm_fwd_desc *d = c->d;
    const int dt = d->dtype;
    const size_t es = fp_dtype_size((fp_dtype)dt);
    const int64_t n = d->cols;
    for (size_t r = begin; r < end; ++r) {
        char *o = row_m(d->out, (int64_t)r, d->out_stride, es);
        switch (c->step) {
        case STEP_ADD: { /* out = x + res; res_out = out */
            const char *x = row_c(d->x, (int64_t)r, d->x_stride, es);
            const char *rs = d->res ? row_c(d->res, (int64_t)r, d->res_stride, es) : NULL;
            char *ro = d->res_out ? row_m(d->res_out, (int64_t)r, d->res_out_stride, es) : NULL;
            for (int64_t j = 0; j < n; ++j) {
                float v = fp_load_f32(x, dt, j) + (rs ? fp_load_f32(rs, dt, j) : 0.0f);
                if (rs) fp_store_f32(o, dt, j, v);
                if (ro) fp_store_f32(ro, dt, j, v);
            }
            break;
        }
        case STEP_NORM: { /* reads the sum from out (or x without residual) */
            const char *in = d->res ? o : row_c(d->x, (int64_t)r, d->x_stride, es);
            /* shifted by the first element, as the fused version */
            float k = d->kind == FP_NORM_LAYERNORM ? fp_load_f32(in, dt, 0) : 0.0f, m = 0.0f;
            if (d->kind == FP_NORM_LAYERNORM) {
                float acc = 0.0f;
                for (int64_t j = 0; j < n; ++j) acc += fp_load_f32(in, dt, j) - k;
                m = acc / (float)n;
            }
            float acc = 0.0f;
            for (int64_t j = 0; j < n; ++j) {
                float t = (fp_load_f32(in, dt, j) - k) - m;
                acc += t * t;
            }
            float rstd = 1.0f / sqrtf(acc / (float)n + d->eps);
            if (d->mean) d->mean[r] = k + m;
            if (d->rstd) d->rstd[r] = rstd;
            for (int64_t j = 0; j < n; ++j) fp_store_f32(o, dt, j, ((fp_load_f32(in, dt, j) - k) - m) * rstd);
            break;
        }
        case STEP_AFFINE:
            for (int64_t j = 0; j < n; ++j) {
                float v = fp_load_f32(o, dt, j);
                if (d->gamma) v *= fp_load_f32(d->gamma, dt, j);
                float sh = d->beta ? fp_load_f32(d->beta, dt, j) : 0.0f;
                if (d->bias) sh += fp_load_f32(d->bias, dt, j);
                fp_store_f32(o, dt, j, v + sh);
            }
            break;
        case STEP_ACT: /* through the fused path's row helpers, a block at a time */
            for (int64_t j = 0; j < n; j += UNF_BLOCK) {
                float buf[UNF_BLOCK];
                const int64_t m = n - j < UNF_BLOCK ? n - j : UNF_BLOCK;
                fp_norm_cpu_load_row(buf, o + (size_t)j * es, dt, m);
                fp_norm_cpu_act_row(d->act, 0, buf, m);
                fp_norm_cpu_store_row(o + (size_t)j * es, dt, buf, m);
            }
            break;
        }
    }
}

fp_status fp_norm_fwd_cpu_unfused(fp_thread_pool *pool, const fp_norm_fwd_desc *d) {
    int steps[4], ns = 0;
    if (d->res || d->res_out) steps[ns++] = STEP_ADD;
    steps[ns++] = STEP_NORM;
    if (d->gamma || d->beta || d->bias) steps[ns++] = STEP_AFFINE;
    if (d->act != FP_NORM_ACT_NONE) steps[ns++] = STEP_ACT;
    size_t grain = d->cols >= 4096 ? 1 : (size_t)(4096 / d->cols);
    for (int k = 0; k < ns; ++k) {
        unf_ctx c = {d, steps[k]};
        if (pool) fp_parallel_for(pool, (size_t)d->rows, grain, unf_rows, &c);
        else unf_rows(&c, 0, (size_t)d->rows);
    }
    return FP_OK;
}

/* ======================================================================== */
/*  Fused backward                                                          */
/* ======================================================================== */

typedef struct bwd_ctx {
    const fp_norm_bwd_desc *d;
    float *scratch;  /* gamma, shift, then [nchunks][4]: xn, dn, partial dgamma, partial dbeta;
                        padded(cols) floats each */
    int64_t nchunks;
    int want_params;
    int simd;        /* fp_norm_cpu_simd() */
} bwd_ctx;

static void bwd_chunk(void *arg, size_t begin, size_t end) {
    const bwd_ctx *c = arg;
    const fp_norm_bwd_desc *d = c->d;
    const int64_t n = d->cols;
    const int dt = d->dtype;
    const size_t es = fp_dtype_size((fp_dtype)dt);
    const int64_t np = padded(n);
    const float *g = c->scratch, *sh = g + np;
    for (size_t ch = begin; ch < end; ++ch) {
        float *xn = c->scratch + (2 + 4 * ch) * (size_t)np;
        float *dn = xn + np, *pg = dn + np, *pb = pg + np;
        memset(pg, 0, 2 * (size_t)np * sizeof(float));
        int64_t r0 = (int64_t)ch * d->rows / c->nchunks, r1 = ((int64_t)ch + 1) * d->rows / c->nchunks;
        if (c->simd) {
            for (int64_t r = r0; r < r1; ++r) fp_norm_avx2_bwd_row(d, r, xn, dn, g, sh, pg, pb);
            continue;
        }
        for (int64_t r = r0; r < r1; ++r) {
            const char *x = row_c(d->x, r, d->x_stride, es);
            const char *dy = row_c(d->dout, r, d->dout_stride, es);
            float mean = d->mean ? d->mean[r] : 0.0f, rstd = d->rstd[r];
            float sum_dn = 0.0f, sum_dnn = 0.0f;
            load_row(xn, x, dt, n);
            for (int64_t j = 0; j < n; ++j) xn[j] = (xn[j] - mean) * rstd;
            /* dn first holds act'(y), then g * gamma */
            if (d->act != FP_NORM_ACT_NONE) {
                for (int64_t j = 0; j < n; ++j) dn[j] = xn[j] * g[j] + sh[j];
                dact_row(dn, n, d->act);
            } else {
                for (int64_t j = 0; j < n; ++j) dn[j] = 1.0f;
            }
            for (int64_t j = 0; j < n; ++j) {
                float gr = fp_load_f32(dy, dt, j) * dn[j];
                pg[j] += gr * xn[j];
                pb[j] += gr;
                dn[j] = gr * g[j];
                sum_dn += dn[j];
                sum_dnn += dn[j] * xn[j];
            }
            float a = d->kind == FP_NORM_LAYERNORM ? sum_dn / (float)n : 0.0f, b = sum_dnn / (float)n;
            const char *dr = d->dres ? row_c(d->dres, r, d->dres_stride, es) : NULL;
            for (int64_t j = 0; j < n; ++j) {
                float v = rstd * (dn[j] - a - xn[j] * b);
                if (dr) v += fp_load_f32(dr, dt, j);
                dn[j] = v;
            }
            store_row(row_m(d->dx, r, d->dx_stride, es), dt, dn, n);
        }
    }
}

fp_status fp_norm_bwd_cpu(fp_thread_pool *pool, const fp_norm_bwd_desc *d) {
    bwd_ctx c = {d, NULL, chunk_count(pool, d->rows), d->dgamma || d->dbeta || d->dbias, fp_norm_cpu_simd()};
    /* The chunk count must not depend on the thread count for dgamma/dbeta to
     * be reproducible: use a fixed count there. */
    if (c.want_params) c.nchunks = d->rows < 64 ? d->rows : 64;
    const int64_t n = d->cols, np = padded(n);
    c.scratch = scratch_alloc(1, 4 * (size_t)c.nchunks + 2, np);
    if (!c.scratch)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "norm backward: %lld x %lld floats of scratch",
                            (long long)c.nchunks * 4 + 2, (long long)d->cols);
    param_rows(d->gamma, d->beta, d->bias, d->dtype, n, np, c.scratch, c.scratch + np);
    if (pool) fp_parallel_for(pool, (size_t)c.nchunks, chunk_grain(d->rows, n, c.nchunks), bwd_chunk, &c);
    else bwd_chunk(&c, 0, (size_t)c.nchunks);
    if (c.want_params) {
        /* the partials summed over the chunks in chunk order, column by
         * column (into chunk 0's partials: one sequential sweep per chunk) */
        float *sg = c.scratch + 4 * (size_t)np, *sb = sg + np;
        for (int64_t ch = 1; ch < c.nchunks; ++ch) {
            const float *pg = c.scratch + (2 + 4 * (size_t)ch + 2) * (size_t)np, *pb = pg + np;
            for (int64_t j = 0; j < n; ++j) {
                sg[j] += pg[j];
                sb[j] += pb[j];
            }
        }
        const int dt = d->dtype;
        if (d->dgamma) store_row(d->dgamma, dt, sg, n);
        if (d->dbeta) store_row(d->dbeta, dt, sb, n);
        if (d->dbias) store_row(d->dbias, dt, sb, n);
    }
    free(c.scratch);
    return FP_OK;
}

/* ======================================================================== */
/*  Unfused backward (baseline)                                             */
/* ======================================================================== */

typedef struct bwd_unf_ctx {
    const fp_norm_bwd_desc *d;
    int step; /* 0: dx = dout * act'(y), 1: dx += dres */
} bwd_unf_ctx;

static void bwd_unf_rows(void *arg, size_t begin, size_t end) {
    const bwd_unf_ctx *c = arg;
    const fp_norm_bwd_desc *d = c->d;
    const int dt = d->dtype;
    const size_t es = fp_dtype_size((fp_dtype)dt);
    for (size_t r = begin; r < end; ++r) {
        char *dx = row_m(d->dx, (int64_t)r, d->dx_stride, es);
        if (c->step == 0) {
            const char *x = row_c(d->x, (int64_t)r, d->x_stride, es);
            const char *dy = row_c(d->dout, (int64_t)r, d->dout_stride, es);
            float mean = d->mean ? d->mean[r] : 0.0f, rstd = d->rstd[r];
            for (int64_t j0 = 0; j0 < d->cols; j0 += UNF_BLOCK) {
                float buf[UNF_BLOCK];
                const int64_t m = d->cols - j0 < UNF_BLOCK ? d->cols - j0 : UNF_BLOCK;
                for (int64_t k = 0; k < m; ++k) {
                    const int64_t j = j0 + k;
                    float y = (fp_load_f32(x, dt, j) - mean) * rstd;
                    if (d->gamma) y *= fp_load_f32(d->gamma, dt, j);
                    if (d->beta) y += fp_load_f32(d->beta, dt, j);
                    if (d->bias) y += fp_load_f32(d->bias, dt, j);
                    buf[k] = y;
                }
                fp_norm_cpu_act_row(d->act, 1, buf, m);
                for (int64_t k = 0; k < m; ++k)
                    fp_store_f32(dx, dt, j0 + k, fp_load_f32(dy, dt, j0 + k) * buf[k]);
            }
        } else {
            const char *dr = row_c(d->dres, (int64_t)r, d->dres_stride, es);
            for (int64_t j = 0; j < d->cols; ++j)
                fp_store_f32(dx, dt, j, fp_load_f32(dx, dt, j) + fp_load_f32(dr, dt, j));
        }
    }
}

fp_status fp_norm_bwd_cpu_unfused(fp_thread_pool *pool, const fp_norm_bwd_desc *d) {
    size_t grain = d->cols >= 4096 ? 1 : (size_t)(4096 / d->cols);
    fp_norm_bwd_desc n = *d;
    if (d->act != FP_NORM_ACT_NONE) {
        bwd_unf_ctx c = {d, 0};
        if (pool) fp_parallel_for(pool, (size_t)d->rows, grain, bwd_unf_rows, &c);
        else bwd_unf_rows(&c, 0, (size_t)d->rows);
        n.dout = d->dx;
        n.dout_stride = d->dx_stride;
    }
    n.act = FP_NORM_ACT_NONE;
    n.beta = n.bias = NULL;
    n.dres = NULL;
    FP_TRY(fp_norm_bwd_cpu(pool, &n));
    if (d->dres) {
        bwd_unf_ctx c = {d, 1};
        if (pool) fp_parallel_for(pool, (size_t)d->rows, grain, bwd_unf_rows, &c);
        else bwd_unf_rows(&c, 0, (size_t)d->rows);
    }
    return FP_OK;
}

/* ======================================================================== */
/*  The current path's row helpers (tests)                                  */
/* ======================================================================== */

void fp_norm_cpu_act_row(int act, int deriv, float *v, int64_t n) {
    if (fp_norm_cpu_simd()) fp_norm_avx2_act_row(act, deriv, v, n);
    else if (deriv) dact_row(v, n, act);
    else act_row(v, n, act);
}
void fp_norm_cpu_load_row(float *dst, const void *src, int dt, int64_t n) {
    if (fp_norm_cpu_simd()) fp_norm_avx2_load_row(dst, src, dt, n);
    else load_row(dst, src, dt, n);
}
void fp_norm_cpu_store_row(void *dst, int dt, const float *src, int64_t n) {
    if (fp_norm_cpu_simd()) fp_norm_avx2_store_row(dst, dt, src, n);
    else store_row(dst, dt, src, n);
}
