/* Shared pieces of the attention tests: a case description, host tensors
 * with random data (never zero) in an optional strided layout, the double
 * reference, and error measurement. Host-side only; the GPU test uploads the
 * same buffers. */
#ifndef ATTN_TEST_UTIL_H
#define ATTN_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h"
#include "fastpath/attention.h"
#include "fp_test.h"

typedef struct attn_case {
    const char *name;
    int batch, sq, sk, hq, hkv, d;
    fp_dtype dtype;
    int causal, wl, wr;
    float scale;    /* 0 = default */
    int want_lse;
    int ragged;     /* per-sequence key lengths (some 0, some short) */
    int strided;    /* Q/K/V slices of a fused [b, s, 3, h, d] buffer, O in (b, h, s, d) + padding */
} attn_case;

/* Host buffers for one case. Every tensor lives in its own allocation,
 * sized by its strides; the elements between rows (strided layouts) are
 * poison that must stay untouched for O. */
typedef struct attn_host {
    fp_attention_params p;     /* pointers into the buffers below */
    void *qkv;                 /* fused or separate storage */
    void *q, *k, *v, *o;       /* element 0 of each tensor */
    size_t qkv_bytes, o_bytes;
    float *lse;
    int32_t *seqlens;
    size_t n_o;                /* batch * sq * hq * d */
} attn_host;

static inline void attn_store(void *base, size_t idx, fp_dtype dt, float v) {
    if (dt == FP_F32) ((float *)base)[idx] = v;
    else if (dt == FP_F16) ((uint16_t *)base)[idx] = fp_f32_to_f16(v);
    else ((uint16_t *)base)[idx] = fp_f32_to_bf16(v);
}
static inline float attn_load(const void *base, size_t idx, fp_dtype dt) {
    if (dt == FP_F32) return ((const float *)base)[idx];
    uint16_t u = ((const uint16_t *)base)[idx];
    return dt == FP_F16 ? fp_f16_to_f32(u) : fp_bf16_to_f32(u);
}

/* Builds params and host data for c. Returns 0 on allocation failure. */
static inline int attn_host_make(const attn_case *c, attn_host *H, uint64_t seed) {
    memset(H, 0, sizeof *H);
    const size_t elt = fp_dtype_size(c->dtype);
    const int64_t d = c->d;
    fp_attention_params *p = &H->p;
    fp_attention_params_default(p);
    p->batch = c->batch; p->seqlen_q = c->sq; p->seqlen_k = c->sk;
    p->heads_q = c->hq; p->heads_kv = c->hkv; p->head_dim = c->d;
    p->dtype = c->dtype; p->causal = c->causal; p->window_left = c->wl; p->window_right = c->wr;
    p->softmax_scale = c->scale;
    size_t nq, nk, nv;
    if (c->strided) {
        /* Q, K, V: [b, s, 3, hmax, d] fused, padded to a 16-byte multiple of
         * 8 extra elements per seq row so strides are not packed values. */
        int hmax = c->hq;
        int64_t head = d, seq = 3 * hmax * d + 8;
        int smax = c->sq > c->sk ? c->sq : c->sk;
        int64_t bat = seq * smax + 8;
        size_t n = (size_t)(bat * c->batch);
        H->qkv_bytes = n * elt;
        H->qkv = malloc(H->qkv_bytes);
        if (!H->qkv) return 0;
        H->q = H->qkv;
        H->k = (char *)H->qkv + (size_t)(hmax * d) * elt;
        H->v = (char *)H->qkv + (size_t)(2 * hmax * d) * elt;
        p->q_batch_stride = p->k_batch_stride = p->v_batch_stride = bat;
        p->q_seq_stride = p->k_seq_stride = p->v_seq_stride = seq;
        p->q_head_stride = p->k_head_stride = p->v_head_stride = head;
        uint64_t s = seed;
        for (size_t i = 0; i < n; ++i) {
            float v = (float)fp_test_rand_uniform(&s, -1.0, 1.0);
            attn_store(H->qkv, i, c->dtype, v == 0.0f ? 1e-3f : v);
        }
        /* O in (b, h, s, d) with 8 elements of padding after each head */
        p->o_seq_stride = d;
        p->o_head_stride = d * c->sq + 8;
        p->o_batch_stride = p->o_head_stride * c->hq;
        H->o_bytes = (size_t)(p->o_batch_stride * c->batch) * elt;
        (void)nq; (void)nk; (void)nv;
    } else {
        nq = (size_t)c->batch * c->sq * c->hq * d;
        nk = nv = (size_t)c->batch * c->sk * c->hkv * d;
        H->qkv_bytes = (nq + nk + nv) * elt;
        H->qkv = malloc(H->qkv_bytes);
        if (!H->qkv) return 0;
        H->q = H->qkv;
        H->k = (char *)H->qkv + nq * elt;
        H->v = (char *)H->qkv + (nq + nk) * elt;
        uint64_t s = seed;
        for (size_t i = 0; i < nq + nk + nv; ++i) {
            float v = (float)fp_test_rand_uniform(&s, -1.0, 1.0);
            attn_store(H->qkv, i, c->dtype, v == 0.0f ? 1e-3f : v);
        }
        H->o_bytes = nq * elt;
    }
    H->n_o = (size_t)c->batch * c->sq * c->hq * d;
    H->o = malloc(H->o_bytes);
    if (!H->o) return 0;
    memset(H->o, 0xFF, H->o_bytes); /* NaN in every dtype */
    if (c->want_lse) {
        H->lse = malloc(sizeof(float) * (size_t)c->batch * c->hq * c->sq);
        if (!H->lse) return 0;
        memset(H->lse, 0xFF, sizeof(float) * (size_t)c->batch * c->hq * c->sq);
    }
    if (c->ragged) {
        H->seqlens = malloc(sizeof(int32_t) * (size_t)c->batch);
        if (!H->seqlens) return 0;
        for (int b = 0; b < c->batch; ++b) {
            static const int pat[4] = {-1, 17, 0, 3}; /* -1: full */
            int L = pat[b % 4] < 0 ? c->sk : pat[b % 4];
            H->seqlens[b] = L > c->sk ? c->sk : L;
        }
    }
    p->q = H->q; p->k = H->k; p->v = H->v; p->o = H->o;
    p->lse = H->lse;
    p->seqlens_k = H->seqlens;
    return 1;
}

static inline void attn_host_free(attn_host *H) {
    free(H->qkv);
    free(H->o);
    free(H->lse);
    free(H->seqlens);
}

/* A paged copy of a dense (non-strided) case's K and V: pools of num_pages
 * pages [page_size, hkv, d] with page stride page_stride (padded when asked),
 * sequence b's pages at shuffled positions of the pool, and poison (NaN) in
 * every pool element no key maps to (spare pages, the tail of a sequence's
 * last page, the padding), so a read of a wrong page shows up as NaN. The
 * table has one spare entry per sequence, set out of range, and entries
 * past a ragged sequence's used pages are out of range too: an
 * implementation reading them would fail the CPU check or read zeros. */
typedef struct attn_paged {
    void *k_pool, *v_pool;
    int32_t *table;
    int page_size, num_pages, bt_stride;
    int64_t page_stride;
    size_t pool_bytes;
} attn_paged;

static inline int attn_page(attn_host *H, int page_size, int pad, uint64_t seed, attn_paged *P) {
    memset(P, 0, sizeof *P);
    fp_attention_params *p = &H->p;
    const size_t elt = fp_dtype_size(p->dtype);
    const int hkv = p->heads_kv, d = p->head_dim, sk = p->seqlen_k;
    const int per_seq = (sk + page_size - 1) / page_size;
    P->page_size = page_size;
    P->bt_stride = per_seq + 1;
    P->num_pages = p->batch * per_seq + 3; /* 3 spare pages, never mapped */
    P->page_stride = (int64_t)page_size * hkv * d + (pad ? 8 : 0);
    P->pool_bytes = (size_t)P->num_pages * (size_t)P->page_stride * elt;
    P->k_pool = malloc(P->pool_bytes);
    P->v_pool = malloc(P->pool_bytes);
    P->table = malloc(sizeof(int32_t) * (size_t)p->batch * P->bt_stride);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)P->num_pages);
    if (!P->k_pool || !P->v_pool || !P->table || !perm) { free(perm); return 0; }
    memset(P->k_pool, 0xFF, P->pool_bytes); /* NaN poison */
    memset(P->v_pool, 0xFF, P->pool_bytes);
    for (int i = 0; i < P->num_pages; ++i) perm[i] = i;
    uint64_t s = seed;
    for (int i = P->num_pages - 1; i > 0; --i) { /* Fisher-Yates */
        int j = (int)(fp_test_rand_uniform(&s, 0.0, 1.0) * (i + 1));
        if (j > i) j = i;
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    const int64_t kss = (int64_t)hkv * d; /* dense source strides (packed) */
    const int64_t kbs = (int64_t)sk * kss;
    for (int b = 0; b < p->batch; ++b) {
        int L = H->seqlens ? H->seqlens[b] : sk;
        int used = (L + page_size - 1) / page_size;
        for (int e = 0; e < P->bt_stride; ++e)
            P->table[(size_t)b * P->bt_stride + e] = e < used ? perm[b * per_seq + e] : P->num_pages + 5 + e;
        for (int j = 0; j < L; ++j) {
            int64_t dst = (int64_t)perm[b * per_seq + j / page_size] * P->page_stride + (int64_t)(j % page_size) * kss;
            memcpy((char *)P->k_pool + (size_t)dst * elt, (const char *)H->k + (size_t)(b * kbs + j * kss) * elt,
                   (size_t)kss * elt);
            memcpy((char *)P->v_pool + (size_t)dst * elt, (const char *)H->v + (size_t)(b * kbs + j * kss) * elt,
                   (size_t)kss * elt);
        }
    }
    free(perm);
    p->k = P->k_pool;
    p->v = P->v_pool;
    p->k_batch_stride = p->v_batch_stride = pad ? P->page_stride : 0;
    p->k_seq_stride = p->v_seq_stride = 0;
    p->k_head_stride = p->v_head_stride = 0;
    p->block_table = P->table;
    p->block_table_stride = P->bt_stride;
    p->page_size = page_size;
    p->num_pages = P->num_pages;
    return 1;
}

static inline void attn_paged_free(attn_paged *P) {
    free(P->k_pool);
    free(P->v_pool);
    free(P->table);
}

/* Element offset of O[b, i, h, 0] under H's strides. */
static inline size_t attn_o_off(const fp_attention_params *p, int b, int i, int h) {
    int64_t d = p->head_dim;
    int64_t hs = p->o_head_stride ? p->o_head_stride : d;
    int64_t ss = p->o_seq_stride ? p->o_seq_stride : d * p->heads_q;
    int64_t bs = p->o_batch_stride ? p->o_batch_stride : d * p->heads_q * p->seqlen_q;
    return (size_t)(b * bs + i * ss + h * hs);
}

typedef struct attn_err {
    double max_abs;      /* max |got - ref| over O */
    double max_ref;      /* max |ref| */
    size_t bad;          /* elements outside tol (NaN included) */
    size_t first_bad;
    double first_got, first_ref;
    double lse_max_abs;
    size_t lse_bad;
} attn_err;

/* Compares O (host copy, H's layout) and lse against the reference with
 * tolerance |err| <= atol + rtol * |ref|. Also checks the padding of strided
 * O stayed poison (counted in bad). */
static inline attn_err attn_compare(const attn_host *H, const void *o_host, const float *lse_host,
                                    const double *o_ref, const double *lse_ref, double atol, double rtol) {
    attn_err E;
    memset(&E, 0, sizeof E);
    E.first_bad = SIZE_MAX;
    const fp_attention_params *p = &H->p;
    const int D = p->head_dim;
    for (int b = 0; b < p->batch; ++b)
        for (int i = 0; i < p->seqlen_q; ++i)
            for (int h = 0; h < p->heads_q; ++h) {
                size_t off = attn_o_off(p, b, i, h);
                const double *r = o_ref + (((size_t)b * p->seqlen_q + i) * p->heads_q + h) * D;
                for (int d = 0; d < D; ++d) {
                    double got = attn_load(o_host, off + d, p->dtype);
                    if (isnan(r[d])) { /* torch's rule: a NaN / +inf score makes the row NaN */
                        if (!isnan(got)) {
                            if (E.bad == 0) {
                                E.first_bad = off + d;
                                E.first_got = got;
                                E.first_ref = r[d];
                            }
                            E.bad++;
                        }
                        continue;
                    }
                    double err = fabs(got - r[d]);
                    if (fabs(r[d]) > E.max_ref) E.max_ref = fabs(r[d]);
                    if (!(err <= atol + rtol * fabs(r[d]))) {
                        if (E.bad == 0) {
                            E.first_bad = off + d;
                            E.first_got = got;
                            E.first_ref = r[d];
                        }
                        E.bad++;
                    }
                    if (err > E.max_abs || err != err) E.max_abs = err != err ? INFINITY : err;
                }
            }
    if (p->o_seq_stride) { /* strided: padding after each head must be poison */
        const size_t elt = fp_dtype_size(p->dtype);
        for (int b = 0; b < p->batch; ++b)
            for (int h = 0; h < p->heads_q; ++h) {
                size_t pad = attn_o_off(p, b, 0, h) + (size_t)p->seqlen_q * D;
                for (int x = 0; x < 8; ++x)
                    if (((const unsigned char *)o_host)[(pad + x) * elt] != 0xFF) E.bad++;
            }
    }
    if (lse_host && lse_ref) {
        size_t n = (size_t)p->batch * p->heads_q * p->seqlen_q;
        for (size_t i = 0; i < n; ++i) {
            double r = lse_ref[i], g = lse_host[i];
            if (isnan(r)) {
                if (!isnan(g)) E.lse_bad++;
                continue;
            }
            if (isinf(r) && r < 0) {
                if (!(isinf(g) && g < 0)) E.lse_bad++;
                continue;
            }
            double err = fabs(g - r);
            if (!(err <= 1e-4 + 1e-5 * fabs(r))) E.lse_bad++;
            if (err > E.lse_max_abs || err != err) E.lse_max_abs = err != err ? INFINITY : err;
        }
    }
    return E;
}

/* Reference for the case on host data (always in H's own layout). */
static inline int attn_reference(fp_thread_pool *pool, const attn_host *H, double **o_ref, double **lse_ref) {
    fp_attn_args a;
    if (fp_attn_check(&H->p, 0, &a) != FP_OK) {
        fprintf(stderr, "reference: bad params: %s\n", fp_last_error());
        return 0;
    }
    *o_ref = malloc(sizeof(double) * H->n_o);
    *lse_ref = malloc(sizeof(double) * (size_t)a.batch * a.heads_q * a.seqlen_q);
    if (!*o_ref || !*lse_ref) return 0;
    return fp_attn_reference(pool, &a, *o_ref, *lse_ref) == FP_OK;
}

/* Elements of lse: batch * heads_q * seqlen_q. */
static inline size_t attn_n_lse(const fp_attention_params *p) {
    return (size_t)p->batch * p->heads_q * p->seqlen_q;
}

/* GPU tests: one implementation on ctx's stream, d_o (o_bytes) and d_lse
 * (attn_n_lse floats) poisoned (NaN) first, then both downloaded to h_o and
 * h_lse. version 0: fp_attention_forward, -1: fp_attention_forward_baseline,
 * otherwise flash kernel `version` with num_splits forced splits
 * (fp_attn_cuda_flash_version). A refusal is returned before any sync. */
enum { ATTN_RUN_FORWARD = 0, ATTN_RUN_BASELINE = -1 };
/* The byte outputs are filled with before each run: 0xFF (NaN) by default;
 * a test whose reference has NaN rows sets a finite pattern, so that an
 * unwritten row cannot pass for a NaN one. */
static int attn_poison_byte __attribute__((unused)) = 0xFF;
static inline fp_status attn_dev_run(fp_context *ctx, const fp_attention_params *dp, int version, int num_splits,
                                     void *d_o, void *h_o, size_t o_bytes, float *d_lse, float *h_lse) {
    const size_t lse_bytes = attn_n_lse(dp) * sizeof(float);
    fp_mem_fill(ctx, d_o, attn_poison_byte, o_bytes, NULL);
    fp_mem_fill(ctx, d_lse, attn_poison_byte, lse_bytes, NULL);
    fp_status st;
    if (version == ATTN_RUN_FORWARD) {
        st = fp_attention_forward(ctx, NULL, dp);
    } else if (version == ATTN_RUN_BASELINE) {
        st = fp_attention_forward_baseline(ctx, NULL, dp);
    } else {
        fp_attn_args a;
        fp_attn_note_begin(0); /* fp_attention_last_kernel: this launch alone */
        st = fp_attn_check(dp, 1, &a);
        if (st == FP_OK) st = fp_attn_cuda_flash_version(&a, version, num_splits, (cudaStream_t)fp_context_stream(ctx));
    }
    if (st != FP_OK) return st;
    FP_TRY(fp_context_synchronize(ctx, NULL));
    FP_TRY(fp_mem_download(ctx, h_o, d_o, o_bytes, NULL));
    FP_TRY(fp_mem_download(ctx, h_lse, d_lse, lse_bytes, NULL));
    return fp_context_synchronize(ctx, NULL);
}

/* Whether the current CUDA device is compute capability 9.0 (where an
 * sm_90a build runs the Hopper kernels). */
static inline int attn_device_cc90(void) {
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;
}

/* Output rounding of the dtype (relative). */
static inline double attn_eps(fp_dtype dt) {
    return dt == FP_F32 ? 1.2e-7 : dt == FP_F16 ? 4.9e-4 : 3.9e-3;
}

#endif /* ATTN_TEST_UTIL_H */
