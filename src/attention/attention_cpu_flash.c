/* CPU flash attention on BLIS tile GEMMs: the fast CPU path when CMake found
 * BLIS (FP_HAVE_BLIS; else fp_attn_cpu_tiled_portable serves).
 *
 * One task = (batch, kv head, FL_BR GQA-packed query rows); row r of a
 * (batch, kv head) is query position r / group of head hk * group + r %
 * group, so a group's query heads share each K/V tile. Per key tile of FL_BC:
 *   S = Q_tile K_tile^T          BLIS sgemm (Q pre-scaled by scale * log2 e)
 *   mask                         only where the tile straddles a row's edge
 *   m, l, P = 2^(S - m)          vectorized online softmax (log2 domain)
 *   O = O * corr + P V_tile      BLIS sgemm (beta = 1 after the rescale)
 * f32 K / V without a block table are read in place (BLIS takes the row
 * stride); bf16 / f16 or paged keys are converted to f32 once per thread
 * and (batch, kv head) when a 2 MiB per-thread cache holds them
 * (kv_cache_cover), else once per tile. Tasks are claimed one at a time by
 * the pool's threads, each with its own scratch.
 * Every task's arithmetic depends only on its rows and tiles, and each BLIS
 * call runs on one thread, so the results do not depend on the thread count.
 *
 * Why BLIS and not OpenBLAS: BLIS's expert API (bli_sgemm_ex with a local
 * rntm_t) fixes one thread per call without touching global state, so the
 * tasks on our worker pool neither oversubscribe the cores nor change the
 * threading of a user's own BLAS calls. OpenBLAS's thread count is process
 * global (openblas_set_num_threads / OPENBLAS_NUM_THREADS): a library would
 * have to override the user's setting or run nested thread teams. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h"

#ifdef FP_HAVE_BLIS
#include <blis.h>

/* Tile sizes measured on a Zen 3 core (CPU time, 2-core VM): 128 x 512
 * beat 64 x 128 by ~15% on (1, 16, 1024, 128); 64 x 256 and 128 x 256 were
 * within the noise of 128 x 512. */
#define FL_BR 128            /* packed query rows per task */
#define FL_BC 512            /* keys per tile */
#define FL_S_PACKED_ROWS 32  /* S = Q K^T on BLIS's packed path from this many rows */
#define FL_KV_CACHE_FLOATS ((size_t)1 << 19) /* per thread: K + V of 2048 keys x 128 */

typedef struct flash_scratch {
    float *q; /* [br][D], pre-scaled by scale * log2(e) */
    float *o; /* [br][D] accumulators */
    float *s; /* [br][bc] scores, then probabilities */
    float *k; /* [bc][D] converted K tile (unless read in place) */
    float *v; /* [bc][D] */
} flash_scratch;

/* The tile scratch is sized to the call (a decode call's tiles are a few
 * rows, its keys maybe fewer than FL_BC): br rows, bc keys. */
static void flash_tile_dims(const fp_attn_args *a, int *br, int *bc) {
    const int64_t rows = (int64_t)a->seqlen_q * a->group;
    *br = rows < FL_BR ? (int)rows : FL_BR;
    *bc = a->seqlen_k < FL_BC ? a->seqlen_k : FL_BC;
}

static size_t flash_scratch_floats(const fp_attn_args *a) {
    int br, bc;
    flash_tile_dims(a, &br, &bc);
    return (size_t)a->head_dim * (2 * (size_t)br + 2 * (size_t)bc) + (size_t)br * bc;
}

/* K (or V) rows [j0, j0 + nk) of kv head hk as f32: a pointer into the
 * caller's tensor with its row stride when it is dense f32, else converted
 * into buf (row stride D). */
static const float *kv_tile(const fp_attn_args *a, const void *base, int b, int64_t seq0, int64_t ss,
                            int64_t page_stride, int64_t hoff, int j0, int nk, float *buf, int64_t *ld) {
    const int D = a->head_dim;
    if (a->kv_dtype == FP_F32 && !a->block_table) {
        *ld = ss;
        return (const float *)base + seq0 + (int64_t)j0 * ss + hoff;
    }
    for (int j = 0; j < nk; ++j)
        fp_attn_cvt_row(base, fp_attn_kv_row(a, b, seq0, j0 + j, ss, page_stride) + hoff, a->kv_dtype, D,
                        buf + (size_t)j * D);
    *ld = D;
    return buf;
}

/* Converted K / V rows kept across a thread's tasks: a (batch, kv head)'s
 * query tiles (8 for 1024 queries) otherwise each convert the same keys;
 * with tasks claimed in order a thread meets the same (batch, kv head)
 * again and converts each key once (bf16 / f16 / paged calls, 6% of a bf16
 * call). Rows [lo, hi) of (b, hk) are valid, at their key index. */
typedef struct flash_slot {
    float *mem;       /* the tile scratch */
    float *kc, *vc;   /* [seqlen_k][D] each, or NULL: convert per tile */
    int b, hk, lo, hi;
} flash_slot;

/* Makes rows [j0, j0 + nk) of (b, hk) valid in the slot's cache. */
static void kv_cache_cover(const fp_attn_args *a, flash_slot *c, int b, int hk, const fp_attn_seq *S, int j0,
                           int nk) {
    const int D = a->head_dim;
    if (c->b != b || c->hk != hk || j0 < c->lo || j0 > c->hi) { /* another head, or a gap: restart */
        c->b = b;
        c->hk = hk;
        c->lo = c->hi = j0;
    }
    for (int j = c->hi; j < j0 + nk; ++j) {
        fp_attn_cvt_row(a->k, fp_attn_kv_row(a, b, S->k0, j, a->k_ss, a->k_bs) + hk * a->k_hs, a->kv_dtype, D,
                        c->kc + (size_t)j * D);
        fp_attn_cvt_row(a->v, fp_attn_kv_row(a, b, S->v0, j, a->v_ss, a->v_bs) + hk * a->v_hs, a->kv_dtype, D,
                        c->vc + (size_t)j * D);
    }
    if (j0 + nk > c->hi) c->hi = j0 + nk;
}

static void flash_tasks(const fp_attn_cpu_job *J, flash_slot *slot, size_t begin, size_t end) {
    const fp_attn_args *a = J->a;
    const int D = a->head_dim, SQ = a->seqlen_q, G = a->group, simd = J->simd;
    const int qtiles = (SQ * G + FL_BR - 1) / FL_BR;
    int br, bc;
    flash_tile_dims(a, &br, &bc);
    float *mem = slot->mem;
    flash_scratch T = {mem, mem + (size_t)br * D, mem + (size_t)2 * br * D, mem + (size_t)2 * br * D + (size_t)br * bc,
                       mem + (size_t)(2 * br + bc) * D + (size_t)br * bc};
    const float scale_log2 = a->scale * 1.4426950408889634f;
    /* One thread per BLIS call through local runtime objects (no global
     * state). BLIS's small-matrix path ("sup": no packing) suits P V (k =
     * FL_BC) and the short S = Q K^T of decode; a full tile's S (k =
     * head_dim, n = FL_BC) runs faster on its packed path. Measured per Zen 3
     * core (CPU time): S 55-66 vs 42-48 GFLOP/s packed vs sup, P V 66-75 vs
     * 53-64 sup vs packed. */
    rntm_t rntm_packed = BLIS_RNTM_INITIALIZER, rntm_sup = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm_packed);
    bli_rntm_set_num_threads(1, &rntm_sup);
    bli_rntm_disable_l3_sup(&rntm_packed);
    float one = 1.0f, zero = 0.0f;
    float m[FL_BR], l[FL_BR];
    int lo[FL_BR], hi[FL_BR], qi[FL_BR], hq[FL_BR];
    for (size_t t = begin; t < end; ++t) {
        const int qt = (int)(t % (size_t)qtiles);
        const int hk = (int)(t / (size_t)qtiles % (size_t)a->heads_kv);
        const int b = (int)(t / ((size_t)qtiles * a->heads_kv));
        const fp_attn_seq S = fp_attn_seq_host(a, b);
        const int rows_b = S.sq * G, r0 = qt * FL_BR;
        const int rows = rows_b - r0 < FL_BR ? rows_b - r0 : FL_BR;
        if (rows <= 0) continue; /* varlen: a shorter sequence */
        int klo = S.L, khi = -1;
        for (int r = 0; r < rows; ++r) {
            qi[r] = (r0 + r) / G;
            hq[r] = hk * G + (r0 + r) % G;
            fp_attn_row_range(a, S.sq, S.L, qi[r], &lo[r], &hi[r]);
            float *qr = T.q + (size_t)r * D;
            fp_attn_cvt_row(a->q, S.q0 + qi[r] * a->q_ss + hq[r] * a->q_hs, a->dtype, D, qr);
            for (int d = 0; d < D; ++d) qr[d] *= scale_log2;
            memset(T.o + (size_t)r * D, 0, sizeof(float) * (size_t)D);
            m[r] = -INFINITY;
            l[r] = 0.0f;
            if (lo[r] <= hi[r]) {
                klo = lo[r] < klo ? lo[r] : klo;
                khi = hi[r] > khi ? hi[r] : khi;
            }
        }
        for (int j0 = klo; j0 <= khi; j0 += FL_BC) {
            const int nk = khi + 1 - j0 < FL_BC ? khi + 1 - j0 : FL_BC;
            int64_t ldk, ldv = D;
            const float *kt, *vt = NULL;
            if (slot->kc) {
                kv_cache_cover(a, slot, b, hk, &S, j0, nk);
                kt = slot->kc + (size_t)j0 * D;
                vt = slot->vc + (size_t)j0 * D;
                ldk = D;
            } else {
                kt = kv_tile(a, a->k, b, S.k0, a->k_ss, a->k_bs, hk * a->k_hs, j0, nk, T.k, &ldk);
            }
            /* S[rows x nk] = Q[rows x D] K[nk x D]^T */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_TRANSPOSE, rows, nk, D, &one, T.q, D, 1, (float *)kt, ldk, 1,
                         &zero, T.s, bc, 1, NULL, rows >= FL_S_PACKED_ROWS ? &rntm_packed : &rntm_sup);
            for (int r = 0; r < rows; ++r) {
                float *s = T.s + (size_t)r * bc;
                /* keys of this tile kept by row r: [jb, je) */
                const int jb = lo[r] - j0 > 0 ? lo[r] - j0 : 0;
                const int je = hi[r] - j0 + 1 < nk ? hi[r] - j0 + 1 : nk;
                if (jb >= je) { /* none: a zero row of P, the state unchanged */
                    memset(s, 0, sizeof(float) * (size_t)nk);
                    continue;
                }
                for (int j = 0; j < jb; ++j) s[j] = -INFINITY;
                for (int j = je; j < nk; ++j) s[j] = -INFINITY;
                const float mt = fp_attn_row_max(s + jb, je - jb, simd);
                /* the SIMD max may return a NaN score: it makes the row NaN */
                const float m_new = mt > m[r] || mt != mt ? mt : m[r];
                /* scores all -inf so far: keep exp2's arguments off -inf - -inf */
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                const float corr = exp2f(m[r] - m_use); /* 0 on the row's first tile */
                l[r] = l[r] * corr + fp_attn_exp2_sum(s, nk, m_use, simd);
                m[r] = m_new;
                if (corr != 1.0f) {
                    float *orow = T.o + (size_t)r * D;
                    for (int d = 0; d < D; ++d) orow[d] *= corr;
                }
            }
            if (!vt) vt = kv_tile(a, a->v, b, S.v0, a->v_ss, a->v_bs, hk * a->v_hs, j0, nk, T.v, &ldv);
            /* O[rows x D] += P[rows x nk] V[nk x D] */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, rows, D, nk, &one, T.s, bc, 1, (float *)vt, ldv,
                         1, &one, T.o, D, 1, NULL, &rntm_sup);
        }
        for (int r = 0; r < rows; ++r) {
            float *orow = T.o + (size_t)r * D;
            const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r]; /* NaN: a NaN / +inf score */
            for (int d = 0; d < D; ++d) orow[d] *= inv;
            fp_attn_store_o(a, S.o0 + qi[r] * a->o_ss + hq[r] * a->o_hs, orow);
            if (a->lse)
                a->lse[((size_t)b * a->heads_q + hq[r]) * SQ + qi[r]] =
                    l[r] == 0.0f ? -INFINITY : (m[r] + log2f(l[r])) * 0.69314718055994531f;
        }
    }
}

/* Scratch per worker slot (one per pool thread, allocated up front), tasks
 * claimed one at a time from a shared counter: the load stays balanced to
 * within one task whatever the tasks' costs (causal) or the threads' speeds
 * (a shared machine), where fixed chunks of tasks left up to one chunk's
 * work on one thread at the end. Which thread computes a task does not
 * change its result. */
typedef struct flash_job {
    fp_attn_cpu_job J;  /* J.nchunks = worker slots, J.per = floats per slot */
    size_t cache_rows;  /* rows of each slot's K / V cache (0: none) */
    atomic_size_t next; /* first unclaimed task */
} flash_job;

static void flash_worker(void *arg, size_t slot_begin, size_t slot_end) {
    flash_job *F = arg;
    const size_t tile = flash_scratch_floats(F->J.a), cache = F->cache_rows * F->J.a->head_dim;
    for (size_t i = slot_begin; i < slot_end; ++i) {
        float *mem = F->J.scratch + i * F->J.per;
        flash_slot slot = {mem, cache ? mem + tile : NULL, cache ? mem + tile + cache : NULL, -1, -1, 0, 0};
        for (;;) {
            const size_t t = atomic_fetch_add(&F->next, 1);
            if (t >= F->J.ntasks) break;
            flash_tasks(&F->J, &slot, t, t + 1);
        }
    }
}

int fp_attn_cpu_have_blas(void) { return 1; }

/* ---- The materialized baseline on BLIS (the A/B baseline, as cuBLAS is
 * on the GPU): per (batch, query head) Q, K, V converted (or gathered from
 * pages) to f32, S = scale Q K^T [sq x L] in one sgemm, masked row softmax
 * (expf), O = P V in one sgemm. */

static size_t naive_blas_floats(const fp_attn_args *a) {
    const size_t sq_sk = (size_t)a->seqlen_q * (size_t)a->seqlen_k;
    const size_t rows = 2 * ((size_t)a->seqlen_q + (size_t)a->seqlen_k) * (size_t)a->head_dim;
    return sq_sk <= SIZE_MAX / 4 - rows ? sq_sk + rows : 0;
}

static void naive_blas_heads(const fp_attn_args *a, float *mem, size_t begin, size_t end) {
    const int D = a->head_dim, SQ = a->seqlen_q, SK = a->seqlen_k;
    float *S = mem, *qf = S + (size_t)SQ * SK, *kf = qf + (size_t)SQ * D;
    float *vf = kf + (size_t)SK * D, *of = vf + (size_t)SK * D;
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    float scale = a->scale, one = 1.0f, zero = 0.0f;
    for (size_t t = begin; t < end; ++t) {
        const int h = (int)(t % (size_t)a->heads_q), b = (int)(t / (size_t)a->heads_q), hk = h / a->group;
        const fp_attn_seq Q = fp_attn_seq_host(a, b);
        if (Q.sq == 0) continue;
        for (int i = 0; i < Q.sq; ++i)
            fp_attn_cvt_row(a->q, Q.q0 + i * a->q_ss + h * a->q_hs, a->dtype, D, qf + (size_t)i * D);
        for (int j = 0; j < Q.L; ++j) {
            fp_attn_cvt_row(a->k, fp_attn_kv_row(a, b, Q.k0, j, a->k_ss, a->k_bs) + hk * a->k_hs, a->kv_dtype, D,
                            kf + (size_t)j * D);
            fp_attn_cvt_row(a->v, fp_attn_kv_row(a, b, Q.v0, j, a->v_ss, a->v_bs) + hk * a->v_hs, a->kv_dtype, D,
                            vf + (size_t)j * D);
        }
        if (Q.L > 0) /* S [sq x L] = scale Q K^T */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_TRANSPOSE, Q.sq, Q.L, D, &scale, qf, D, 1, kf, D, 1, &zero, S, Q.L,
                         1, NULL, &rntm);
        for (int i = 0; i < Q.sq; ++i) {
            float *s = S + (size_t)i * Q.L;
            int lo, hi;
            fp_attn_row_range(a, Q.sq, Q.L, i, &lo, &hi);
            float mx = -INFINITY, sum = 0.0f;
            for (int j = lo; j <= hi; ++j) mx = s[j] > mx ? s[j] : mx;
            if (mx == -INFINITY) mx = 0.0f; /* all -inf: a zero row; NaN / +inf make it NaN */
            for (int j = 0; j < Q.L; ++j) {
                s[j] = j >= lo && j <= hi ? expf(s[j] - mx) : 0.0f;
                sum += s[j];
            }
            const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
            for (int j = lo; j <= hi; ++j) s[j] *= inv;
            if (a->lse) a->lse[((size_t)b * a->heads_q + h) * SQ + i] = sum == 0.0f ? -INFINITY : mx + logf(sum);
        }
        if (Q.L > 0) /* O [sq x D] = P V */
            bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, Q.sq, D, Q.L, &one, S, Q.L, 1, vf, D, 1, &zero, of, D,
                         1, NULL, &rntm);
        else
            memset(of, 0, sizeof(float) * (size_t)Q.sq * D);
        for (int i = 0; i < Q.sq; ++i)
            fp_attn_store_o(a, Q.o0 + i * a->o_ss + h * a->o_hs, of + (size_t)i * D);
    }
}

fp_status fp_attn_cpu_naive_blas(fp_thread_pool *pool, const fp_attn_args *a) {
    return fp_attn_run_per_head(pool, a, naive_blas_floats(a), naive_blas_heads);
}

fp_status fp_attn_cpu_flash_blas(fp_thread_pool *pool, const fp_attn_args *a) {
    flash_job F = {.J = {.a = a, .simd = fp_attn_simd_available()}};
    const size_t qtiles = ((size_t)a->seqlen_q * a->group + FL_BR - 1) / FL_BR;
    F.J.ntasks = (size_t)a->batch * a->heads_kv * qtiles;
    F.J.nchunks = fp_attn_job_chunks(pool, F.J.ntasks, 1);
    /* A small call (decode of a short cache: under ~2 MFLOP, tens of us)
     * runs on the calling thread: waking a sleeping worker costs about as
     * much. Tasks are independent, so the result does not change. */
    if (4.0 * a->batch * a->heads_q * (double)a->seqlen_q * a->seqlen_k * a->head_dim < 2e6) F.J.nchunks = 1;
    /* the K / V cache pays when a (batch, kv head) has several query tiles
     * and the keys need converting; capped at 2 MiB per thread */
    const size_t kv_floats = 2 * (size_t)a->seqlen_k * (size_t)a->head_dim;
    if (qtiles > 1 && (a->kv_dtype != FP_F32 || a->block_table) && kv_floats <= FL_KV_CACHE_FLOATS)
        F.cache_rows = (size_t)a->seqlen_k;
    F.J.per = flash_scratch_floats(a) + 2 * F.cache_rows * (size_t)a->head_dim;
    FP_TRY(fp_attn_job_alloc(&F.J, "attention CPU flash tile scratch"));
    atomic_init(&F.next, 0);
    fp_parallel_for(pool, F.J.nchunks, 1, flash_worker, &F);
    free(F.J.scratch);
    return FP_OK;
}

#else /* no BLIS: fp_attn_cpu_tiled uses the portable version */

int fp_attn_cpu_have_blas(void) { return 0; }

fp_status fp_attn_cpu_naive_blas(fp_thread_pool *pool, const fp_attn_args *a) {
    (void)pool;
    (void)a;
    return fp_set_error(FP_ERR_UNSUPPORTED, "CPU attention baseline on BLIS: this build has no BLIS");
}

fp_status fp_attn_cpu_flash_blas(fp_thread_pool *pool, const fp_attn_args *a) {
    (void)pool;
    (void)a;
    return fp_set_error(FP_ERR_UNSUPPORTED, "CPU flash attention: this build has no BLIS (see CMake's message)");
}

#endif
