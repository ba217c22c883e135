/* CPU attention (host memory, any dtype converted to f32 on load):
 *   fp_attn_reference           the oracle: double accumulation, two-pass
 *                                softmax, one query row at a time. Obviously
 *                                right, slow.
 *   fp_attn_cpu_naive_portable   the materialized baseline: a [seqlen_q x
 *                                seqlen_k] f32 score matrix per (batch, head),
 *                                softmax, P V, in plain loops.
 *   fp_attn_cpu_naive_blas       the same with its two GEMMs on BLIS
 *                                (attention_cpu_flash.c), as the GPU baseline
 *                                uses cuBLAS.
 *   fp_attn_cpu_naive            the baseline's dispatcher (BLIS if built).
 *   fp_attn_cpu_tiled_portable   flash attention's algorithm in plain C: 32
 *                                query rows x 64 keys tiles, online softmax
 *                                (running max and sum rescale the
 *                                accumulator), tasks = (batch, kv head, tile
 *                                of GQA-packed query rows) on the worker pool.
 *                                The fallback when the build has no BLIS.
 *   fp_attn_cpu_flash_blas       the same algorithm on BLIS tile GEMMs
 *                                (attention_cpu_flash.c), the fast path.
 *   fp_attn_cpu_tiled            the fast path's dispatcher (BLIS if built).
 * All share the mask rule fp_attn_row_range; tests/attention/
 * test_attention_cpu_impls.c runs each against the reference. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h"
#include "half.h"

#define CPU_BR 32 /* query rows per tile */
#define CPU_BC 64 /* keys per tile */

/* Dot product of n (a multiple of 8) floats with 8 independent partial sums,
 * so the compiler can keep them in one vector register. */
static inline float dot8(const float *a, const float *b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int d = 0; d < n; d += 8)
        for (int x = 0; x < 8; ++x) acc[x] += a[d + x] * b[d + x];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static inline float elt_f32(const void *base, int64_t idx, fp_dtype dt) {
    if (dt == FP_F32) return ((const float *)base)[idx];
    if (dt == FP_FP8_E4M3) return fp_e4m3_to_f32(((const uint8_t *)base)[idx]);
    uint16_t u = ((const uint16_t *)base)[idx];
    return dt == FP_F16 ? fp_f16_to_f32(u) : fp_bf16_to_f32(u);
}

/* ------------------------------------------------------------------------ */
/*  Reference                                                               */
/* ------------------------------------------------------------------------ */

typedef struct ref_job {
    const fp_attn_args *a;
    double *o_ref, *lse_ref;
    atomic_int oom;
} ref_job;

/* One task = one (batch, head, query row). */
static void ref_rows(void *arg, size_t begin, size_t end) {
    ref_job *J = arg;
    const fp_attn_args *a = J->a;
    const int D = a->head_dim;
    double *s = malloc(sizeof(double) * (size_t)a->seqlen_k);
    double *acc = malloc(sizeof(double) * (size_t)D);
    if (!s || !acc) {
        atomic_store(&J->oom, 1);
        free(s);
        free(acc);
        return;
    }
    for (size_t t = begin; t < end; ++t) {
        int i = (int)(t % (size_t)a->seqlen_q);
        int h = (int)(t / (size_t)a->seqlen_q % (size_t)a->heads_q);
        int b = (int)(t / ((size_t)a->seqlen_q * (size_t)a->heads_q));
        int hk = h / a->group;
        const fp_attn_seq S = fp_attn_seq_host(a, b);
        if (i >= S.sq) continue; /* varlen: past this sequence's queries */
        const int64_t qrow = S.q0 + i * a->q_ss + h * a->q_hs;
        int lo, hi;
        fp_attn_row_range(a, S.sq, S.L, i, &lo, &hi);
        double mx = -INFINITY;
        for (int j = lo; j <= hi; ++j) {
            double dot = 0.0;
            for (int d = 0; d < D; ++d)
                dot += (double)elt_f32(a->q, qrow + d, a->dtype) *
                       (double)elt_f32(a->k, fp_attn_kv_row(a, b, S.k0, j, a->k_ss, a->k_bs) + hk * a->k_hs + d, a->kv_dtype);
            s[j] = dot * (double)a->scale;
            if (s[j] > mx) mx = s[j];
        }
        /* every kept score -inf (or no key kept): a zero row, as torch's
         * safe softmax; a NaN or +inf score makes the row NaN through exp */
        if (mx == -INFINITY) mx = 0.0;
        double sum = 0.0;
        for (int d = 0; d < D; ++d) acc[d] = 0.0;
        for (int j = lo; j <= hi; ++j) {
            double p = exp(s[j] - mx);
            sum += p;
            for (int d = 0; d < D; ++d)
                acc[d] += p * (double)elt_f32(a->v, fp_attn_kv_row(a, b, S.v0, j, a->v_ss, a->v_bs) + hk * a->v_hs + d, a->kv_dtype);
        }
        if (J->o_ref) {
            double *o = J->o_ref + (((size_t)b * a->seqlen_q + i) * a->heads_q + h) * D;
            for (int d = 0; d < D; ++d) o[d] = sum == 0.0 ? 0.0 : acc[d] / sum * (double)a->o_scale;
        }
        if (J->lse_ref)
            J->lse_ref[((size_t)b * a->heads_q + h) * a->seqlen_q + i] = sum == 0.0 ? -INFINITY : mx + log(sum);
    }
    free(s);
    free(acc);
}

fp_status fp_attn_reference(fp_thread_pool *pool, const fp_attn_args *a, double *o_ref, double *lse_ref) {
    ref_job J = {.a = a, .o_ref = o_ref, .lse_ref = lse_ref};
    atomic_init(&J.oom, 0);
    size_t n = (size_t)a->batch * a->heads_q * a->seqlen_q;
    if (pool)
        fp_parallel_for(pool, n, 16, ref_rows, &J);
    else
        ref_rows(&J, 0, n);
    if (atomic_load(&J.oom)) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "attention reference scratch");
    return FP_OK;
}

/* ------------------------------------------------------------------------ */
/*  Naive (materialized) baseline                                           */
/* ------------------------------------------------------------------------ */

fp_status fp_attn_job_alloc(fp_attn_cpu_job *J, const char *what) {
    if (J->per == 0 || J->nchunks > SIZE_MAX / sizeof(float) / J->per)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "%s: %zu x %zu floats overflow size_t", what, J->nchunks,
                            J->per);
    J->scratch = malloc(J->nchunks * J->per * sizeof(float));
    if (!J->scratch)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "%s: %zu x %zu floats of scratch", what, J->nchunks, J->per);
    return FP_OK;
}

/* Balanced: the first ntasks % nchunks chunks take one task more; no c *
 * ntasks product that could overflow. */
size_t fp_attn_chunk_begin(const fp_attn_cpu_job *J, size_t c) {
    const size_t q = J->ntasks / J->nchunks, r = J->ntasks % J->nchunks;
    return c * q + (c < r ? c : r);
}

/* More chunks balance uneven tasks, fewer save scratch. */
size_t fp_attn_job_chunks(fp_thread_pool *pool, size_t ntasks, size_t per_thread) {
    size_t c = (size_t)fp_thread_pool_size(pool) * per_thread;
    return c < ntasks ? c : ntasks;
}

/* One task = one (batch, head): S = scale * Q K^T (masked to -inf), row
 * softmax into P, O = P V. Tasks [begin, end) with scratch S ([SQ x SK] then
 * 3 rows of D). */
static void naive_heads(const fp_attn_args *a, float *S, size_t begin, size_t end) {
    const int D = a->head_dim, SQ = a->seqlen_q, SK = a->seqlen_k;
    float *row = S + (size_t)SQ * SK;
    float *qv = row, *kv = row + D, *ov = row + 2 * D;
    for (size_t t = begin; t < end; ++t) {
        int h = (int)(t % (size_t)a->heads_q), b = (int)(t / (size_t)a->heads_q);
        int hk = h / a->group;
        const fp_attn_seq Q = fp_attn_seq_host(a, b);
        for (int i = 0; i < Q.sq; ++i) {
            float *s = S + (size_t)i * SK;
            int lo, hi;
            fp_attn_row_range(a, Q.sq, Q.L, i, &lo, &hi);
            fp_attn_cvt_row(a->q, Q.q0 + i * a->q_ss + h * a->q_hs, a->dtype, D, qv);
            for (int j = 0; j < SK; ++j) {
                if (j < lo || j > hi) { s[j] = -INFINITY; continue; }
                fp_attn_cvt_row(a->k, fp_attn_kv_row(a, b, Q.k0, j, a->k_ss, a->k_bs) + hk * a->k_hs, a->kv_dtype, D, kv);
                s[j] = dot8(qv, kv, D) * a->scale;
            }
            float mx = -INFINITY;
            for (int j = 0; j < SK; ++j) mx = s[j] > mx ? s[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j < SK; ++j) {
                s[j] = mx == -INFINITY ? 0.0f : expf(s[j] - mx);
                sum += s[j];
            }
            float inv = sum == 0.0f ? 0.0f : 1.0f / sum; /* NaN (a NaN / +inf score) stays NaN */
            for (int j = 0; j < SK; ++j) s[j] *= inv;
            if (a->lse) a->lse[((size_t)b * a->heads_q + h) * SQ + i] = sum == 0.0f ? -INFINITY : mx + logf(sum);
        }
        for (int i = 0; i < Q.sq; ++i) {
            const float *p = S + (size_t)i * SK;
            memset(ov, 0, sizeof(float) * (size_t)D);
            for (int j = 0; j < SK; ++j) {
                if (p[j] == 0.0f) continue;
                fp_attn_cvt_row(a->v, fp_attn_kv_row(a, b, Q.v0, j, a->v_ss, a->v_bs) + hk * a->v_hs, a->kv_dtype, D, kv);
                for (int d = 0; d < D; ++d) ov[d] += p[j] * kv[d];
            }
            fp_attn_store_o(a, Q.o0 + i * a->o_ss + h * a->o_hs, ov);
        }
    }
}

typedef struct heads_job {
    fp_attn_cpu_job J;
    fp_attn_heads_fn heads;
} heads_job;

static void heads_chunks(void *arg, size_t cbegin, size_t cend) {
    const heads_job *H = arg;
    for (size_t c = cbegin; c < cend; ++c)
        H->heads(H->J.a, H->J.scratch + c * H->J.per, fp_attn_chunk_begin(&H->J, c),
                 fp_attn_chunk_begin(&H->J, c + 1));
}

fp_status fp_attn_run_per_head(fp_thread_pool *pool, const fp_attn_args *a, size_t per, fp_attn_heads_fn heads) {
    heads_job H = {.J = {.a = a, .per = per}, .heads = heads};
    H.J.ntasks = (size_t)a->batch * a->heads_q;
    /* one score matrix per thread: it is the memory-hungry baseline */
    H.J.nchunks = fp_attn_job_chunks(pool, H.J.ntasks, 1);
    char what[96];
    snprintf(what, sizeof what, "materialized attention: score matrix of %d x %d floats", a->seqlen_q,
             a->seqlen_k);
    FP_TRY(fp_attn_job_alloc(&H.J, what));
    fp_parallel_for(pool, H.J.nchunks, 1, heads_chunks, &H);
    free(H.J.scratch);
    return FP_OK;
}

fp_status fp_attn_cpu_naive_portable(fp_thread_pool *pool, const fp_attn_args *a) {
    const size_t sq_sk = (size_t)a->seqlen_q * (size_t)a->seqlen_k;
    const size_t per = sq_sk <= SIZE_MAX / 2 - 3 * (size_t)a->head_dim ? sq_sk + 3 * (size_t)a->head_dim : 0;
    return fp_attn_run_per_head(pool, a, per, naive_heads);
}

/* ------------------------------------------------------------------------ */
/*  Tiled online softmax                                                    */
/* ------------------------------------------------------------------------ */

typedef struct tile_scratch {
    float *q;   /* [CPU_BR][D], pre-scaled by scale * log2(e) */
    float *k;   /* [CPU_BC][D] */
    float *v;   /* [CPU_BC][D] */
    float *o;   /* [CPU_BR][D] accumulators */
    float *s;   /* [CPU_BC] scores of one row */
} tile_scratch;

/* One task = (batch, kv head, tile of CPU_BR packed query rows): row r of a
 * (batch, kv head) is query position r / group of head hk * group + r %
 * group, so the group's query heads share each converted K/V tile (decode
 * with GQA converts the cache once per kv head, not once per query head).
 * Keys are visited in CPU_BC tiles over the union of the rows' ranges; per
 * row the running max m (log2 domain) and sum l rescale the accumulator when
 * the max grows. */
static void tiled_tasks(const fp_attn_args *a, float *mem, size_t begin, size_t end) {
    const int D = a->head_dim, SQ = a->seqlen_q, G = a->group;
    const int prow_n = SQ * G;
    const int qtiles = (prow_n + CPU_BR - 1) / CPU_BR;
    tile_scratch T = {mem, mem + CPU_BR * D, mem + (CPU_BR + CPU_BC) * D,
                      mem + (CPU_BR + 2 * CPU_BC) * D, mem + (2 * CPU_BR + 2 * CPU_BC) * D};
    const float scale_log2 = a->scale * 1.4426950408889634f;
    float m[CPU_BR], l[CPU_BR];
    int lo[CPU_BR], hi[CPU_BR], qi[CPU_BR], hq[CPU_BR];
    for (size_t t = begin; t < end; ++t) {
        int qt = (int)(t % (size_t)qtiles);
        int hk = (int)(t / (size_t)qtiles % (size_t)a->heads_kv);
        int b = (int)(t / ((size_t)qtiles * a->heads_kv));
        const fp_attn_seq S = fp_attn_seq_host(a, b);
        const int rows_b = S.sq * G; /* packed rows of this sequence */
        int r0 = qt * CPU_BR, rows = rows_b - r0 < CPU_BR ? rows_b - r0 : CPU_BR;
        if (rows <= 0) continue; /* varlen: a shorter sequence */
        int klo = S.L, khi = -1;
        for (int r = 0; r < rows; ++r) {
            qi[r] = (r0 + r) / G;
            hq[r] = hk * G + (r0 + r) % G;
            fp_attn_row_range(a, S.sq, S.L, qi[r], &lo[r], &hi[r]);
            fp_attn_cvt_row(a->q, S.q0 + qi[r] * a->q_ss + hq[r] * a->q_hs, a->dtype, D, T.q + r * D);
            for (int d = 0; d < D; ++d) T.q[r * D + d] *= scale_log2;
            memset(T.o + r * D, 0, sizeof(float) * (size_t)D);
            m[r] = -INFINITY;
            l[r] = 0.0f;
            if (lo[r] <= hi[r]) {
                klo = lo[r] < klo ? lo[r] : klo;
                khi = hi[r] > khi ? hi[r] : khi;
            }
        }
        for (int j0 = klo; j0 <= khi; j0 += CPU_BC) {
            int nk = khi + 1 - j0 < CPU_BC ? khi + 1 - j0 : CPU_BC;
            for (int j = 0; j < nk; ++j) {
                fp_attn_cvt_row(a->k, fp_attn_kv_row(a, b, S.k0, j0 + j, a->k_ss, a->k_bs) + hk * a->k_hs, a->kv_dtype, D, T.k + j * D);
                fp_attn_cvt_row(a->v, fp_attn_kv_row(a, b, S.v0, j0 + j, a->v_ss, a->v_bs) + hk * a->v_hs, a->kv_dtype, D, T.v + j * D);
            }
            for (int r = 0; r < rows; ++r) {
                /* keys of this tile kept by row r */
                int jb = lo[r] - j0 > 0 ? lo[r] - j0 : 0;
                int je = hi[r] - j0 + 1 < nk ? hi[r] - j0 + 1 : nk;
                if (jb >= je) continue;
                const float *qr = T.q + r * D;
                float mt = -INFINITY;
                for (int j = jb; j < je; ++j) {
                    float dot = dot8(qr, T.k + j * D, D);
                    T.s[j] = dot;
                    mt = dot > mt ? dot : mt;
                }
                float m_new = mt > m[r] ? mt : m[r];
                /* scores all -inf so far: keep exp2's arguments off -inf - -inf */
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                float corr = exp2f(m[r] - m_use); /* 0 on the first tile (m = -inf) */
                float *orow = T.o + r * D;
                if (corr != 1.0f)
                    for (int d = 0; d < D; ++d) orow[d] *= corr;
                float lsum = 0.0f;
                for (int j = jb; j < je; ++j) {
                    float p = exp2f(T.s[j] - m_use);
                    lsum += p;
                    const float *vr = T.v + j * D;
                    for (int d = 0; d < D; ++d) orow[d] += p * vr[d];
                }
                l[r] = l[r] * corr + lsum;
                m[r] = m_new;
            }
        }
        for (int r = 0; r < rows; ++r) {
            float *orow = T.o + r * D;
            float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
            for (int d = 0; d < D; ++d) orow[d] *= inv;
            fp_attn_store_o(a, S.o0 + qi[r] * a->o_ss + hq[r] * a->o_hs, orow);
            if (a->lse)
                a->lse[((size_t)b * a->heads_q + hq[r]) * SQ + qi[r]] =
                    l[r] == 0.0f ? -INFINITY : (m[r] + log2f(l[r])) * 0.69314718055994531f;
        }
    }
}

static void tiled_chunks(void *arg, size_t cbegin, size_t cend) {
    const fp_attn_cpu_job *J = arg;
    for (size_t c = cbegin; c < cend; ++c)
        tiled_tasks(J->a, J->scratch + c * J->per, fp_attn_chunk_begin(J, c), fp_attn_chunk_begin(J, c + 1));
}

fp_status fp_attn_cpu_tiled_portable(fp_thread_pool *pool, const fp_attn_args *a) {
    fp_attn_cpu_job J = {.a = a};
    size_t qtiles = ((size_t)a->seqlen_q * a->group + CPU_BR - 1) / CPU_BR;
    J.ntasks = (size_t)a->batch * a->heads_kv * qtiles;
    J.nchunks = fp_attn_job_chunks(pool, J.ntasks, 8); /* tiles are small: balance causal's uneven tasks */
    J.per = (size_t)a->head_dim * (2 * CPU_BR + 2 * CPU_BC) + CPU_BC;
    FP_TRY(fp_attn_job_alloc(&J, "attention CPU tile scratch"));
    fp_parallel_for(pool, J.nchunks, 1, tiled_chunks, &J);
    free(J.scratch);
    return FP_OK;
}

fp_status fp_attn_cpu_naive(fp_thread_pool *pool, const fp_attn_args *a) {
    if (fp_attn_cpu_have_blas()) return fp_attn_cpu_naive_blas(pool, a);
    return fp_attn_cpu_naive_portable(pool, a);
}

fp_status fp_attn_cpu_tiled(fp_thread_pool *pool, const fp_attn_args *a) {
    if (fp_attn_cpu_have_blas()) return fp_attn_cpu_flash_blas(pool, a);
    return fp_attn_cpu_tiled_portable(pool, a);
}
