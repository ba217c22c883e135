/* Structured fuzz of fp_attention_forward / fp_attention_forward_baseline
 * (and, now and then, fp_attention_validate) on a CPU context, through the
 * public header only.
 *
 * Each iteration draws a valid call: dtype, GQA shape, head_dim, masks
 * (causal, windows up to INT_MAX), scale, lse, and one of dense / ragged
 * seqlens_k (values outside [0, seqlen_k] included: they are clamped) /
 * varlen cu_seqlens / paged KV (shared and shuffled pages, garbage in the
 * unused block-table entries), each tensor packed or in a random padded
 * layout (any dimension order). It then either runs it and compares O and
 * lse element by element with a double reference written here, checking
 * that nothing else in O / lse (padding, rows past a varlen sequence) and
 * no input changed, or breaks exactly one argument and expects
 * FP_ERR_INVALID_ARGUMENT naming it with every buffer unchanged.
 * Usage: test_fuzz_attention [seed] [iterations]. */
#include <limits.h>
#include <stddef.h>

#include "fuzz_util.h"

/* struct_size of the 0.1 layout, which ended at cu_seqlens_k */
#define FZ_ATTN_V1_SIZE (offsetof(fp_attention_params, cu_seqlens_k) + sizeof(const int32_t *))

typedef struct az_ctx {
    fp_context *ctx;
    fz_run run;
    uint64_t rng;
    long ok_calls, bad_calls;
} az_ctx;

/* Resolved strides of one tensor (elements) and its element extent. */
typedef struct layout {
    int64_t bs, ss, hs;
    size_t elems;
} layout;

/* A layout of extents (nb, ns, nh) x d: packed (*explicit_ = 0, strides
 * the header's defaults) or the three dimensions in a random order with
 * random padding after each. nb = 0: no batch dimension (varlen). */
static layout make_layout(uint64_t *s, int nb, int ns, int nh, int d, int *explicit_, int seq_outer) {
    layout l;
    *explicit_ = fz_chance(s, 1, 2);
    const int ext[3] = {nb > 0 ? nb : 1, ns, nh};
    int64_t st[3];
    if (!*explicit_) {
        st[2] = d;
        st[1] = (int64_t)d * nh;
        st[0] = (int64_t)d * nh * ns;
    } else {
        int order[3] = {0, 1, 2}; /* innermost first after shuffling */
        for (int i = 2; i > 0; --i) {
            int j = (int)fz_range(s, 0, i);
            int t = order[i]; order[i] = order[j]; order[j] = t;
        }
        if (seq_outer && nb <= 0) { /* varlen: heads inside the packed rows */
            order[0] = 2;
            order[1] = 0;
            order[2] = 1;
        }
        int64_t span = d;
        for (int k = 0; k < 3; ++k) {
            int dim = order[k];
            st[dim] = span + (fz_chance(s, 1, 2) ? fz_range(s, 0, 9) : 0);
            span = st[dim] * ext[dim];
        }
    }
    l.bs = nb > 0 ? st[0] : 0;
    l.ss = st[1];
    l.hs = st[2];
    l.elems = (size_t)((int64_t)(ext[0] - 1) * (nb > 0 ? st[0] : 0) + (int64_t)(ext[1] - 1) * st[1] +
                       (int64_t)(ext[2] - 1) * st[2] + d);
    return l;
}

enum { A_Q, A_K, A_V, A_O, A_LSE, A_SEQLENS, A_CUQ, A_CUK, A_BT, A_COUNT };
static const char *const buf_names[A_COUNT] = {"q", "k", "v", "o", "lse", "seqlens_k", "cu_seqlens_q",
                                               "cu_seqlens_k", "block_table"};

typedef struct acase {
    fp_attention_params p;
    fz_buf buf[A_COUNT];
    layout lq, lk, lv, lo;
    int mode; /* 0 dense, 1 seqlens_k, 2 varlen, 3 paged */
    int total_q, total_k; /* varlen: packed rows */
} acase;

static void acase_make(az_ctx *z, acase *c) {
    uint64_t *s = &z->rng;
    memset(c, 0, sizeof *c);
    fp_attention_params *p = &c->p;
    fp_attention_params_default(p);
    p->dtype = (fp_dtype)fz_range(s, 0, 2);
    p->batch = (int)fz_range(s, 1, 3);
    p->heads_kv = (int)fz_range(s, 1, 3);
    p->heads_q = p->heads_kv * (int)fz_range(s, 1, 3);
    p->head_dim = fz_chance(s, 1, 10) ? 256 : 8 * (int)fz_range(s, 1, 8);
    p->seqlen_q = fz_chance(s, 1, 3) ? 1 : (int)fz_range(s, 1, 9);
    p->seqlen_k = (int)fz_range(s, 1, 40);
    if (fz_chance(s, 1, 10)) { /* longer sequences: several key tiles and query blocks */
        p->batch = 1;
        p->heads_kv = (int)fz_range(s, 1, 2);
        p->heads_q = p->heads_kv * (int)fz_range(s, 1, 4);
        p->head_dim = 8 * (int)fz_range(s, 1, 8);
        p->seqlen_q = (int)fz_range(s, 1, 80);
        p->seqlen_k = (int)fz_range(s, 40, 300);
    }
    p->softmax_scale = fz_chance(s, 1, 2) ? 0.0f : (float)fz_uniform(s, 0.01, 1.0);
    p->causal = fz_chance(s, 1, 3);
    const int wins[] = {-1, -1, 0, 1, 3, 8, INT_MAX, INT_MAX - 1};
    p->window_left = fz_chance(s, 1, 3) ? wins[fz_range(s, 0, 7)] : -1;
    p->window_right = p->causal ? (fz_chance(s, 1, 2) ? 0 : -1) : (fz_chance(s, 1, 3) ? wins[fz_range(s, 0, 7)] : -1);
    c->mode = (int)fz_range(s, 0, 3);
    const int B = p->batch, D = p->head_dim;
    const size_t es = fp_dtype_size(p->dtype);
    int ex;
    if (c->mode == 2) { /* varlen */
        c->buf[A_CUQ] = fz_buf_new((size_t)(B + 1) * 4, (size_t)fz_range(s, 0, 3) * 4);
        c->buf[A_CUK] = fz_buf_new((size_t)(B + 1) * 4, (size_t)fz_range(s, 0, 3) * 4);
        int32_t *cq = (int32_t *)c->buf[A_CUQ].data, *ck = (int32_t *)c->buf[A_CUK].data;
        cq[0] = ck[0] = 0;
        for (int b = 0; b < B; ++b) {
            cq[b + 1] = cq[b] + (int)fz_range(s, fz_chance(s, 1, 5) ? 0 : 1, p->seqlen_q);
            ck[b + 1] = ck[b] + (int)fz_range(s, fz_chance(s, 1, 5) ? 0 : 1, p->seqlen_k);
        }
        c->total_q = cq[B];
        c->total_k = ck[B];
        fz_buf_snapshot(&c->buf[A_CUQ]);
        fz_buf_snapshot(&c->buf[A_CUK]);
        p->cu_seqlens_q = cq;
        p->cu_seqlens_k = ck;
        /* total_k (the packed K / V rows) given half the time: the packed
         * keys or more (a capacity), which the CPU path never reads past */
        if (fz_chance(s, 1, 2)) p->total_k = c->total_k + fz_range(s, 0, 3);
        const int tq = c->total_q > 0 ? c->total_q : 1, tk = c->total_k > 0 ? c->total_k : 1;
        /* Strides are checked against the packed totals (any non-overlapping
         * layout of them, head-major included, is valid on a CPU context). */
        const int so = 0;
        c->lq = make_layout(s, 0, tq, p->heads_q, D, &ex, so);
        if (ex) { p->q_seq_stride = c->lq.ss; p->q_head_stride = c->lq.hs; }
        c->lo = make_layout(s, 0, tq, p->heads_q, D, &ex, so);
        if (ex) { p->o_seq_stride = c->lo.ss; p->o_head_stride = c->lo.hs; }
        c->lk = make_layout(s, 0, tk, p->heads_kv, D, &ex, so);
        if (ex) { p->k_seq_stride = c->lk.ss; p->k_head_stride = c->lk.hs; }
        c->lv = make_layout(s, 0, tk, p->heads_kv, D, &ex, so);
        if (ex) { p->v_seq_stride = c->lv.ss; p->v_head_stride = c->lv.hs; }
        /* with one query / key per sequence the packed default seq stride
         * (heads * head_dim) is still right: make_layout used it */
    } else {
        c->lq = make_layout(s, B, p->seqlen_q, p->heads_q, D, &ex, 0);
        if (ex) { p->q_batch_stride = c->lq.bs; p->q_seq_stride = c->lq.ss; p->q_head_stride = c->lq.hs; }
        c->lo = make_layout(s, B, p->seqlen_q, p->heads_q, D, &ex, 0);
        if (ex) { p->o_batch_stride = c->lo.bs; p->o_seq_stride = c->lo.ss; p->o_head_stride = c->lo.hs; }
        int kv_b = B, kv_s = p->seqlen_k;
        if (c->mode == 3) { /* paged */
            if (fz_chance(s, 1, 12)) { /* one huge page: only its first seqlen_k rows exist */
                p->page_size = fz_chance(s, 1, 2) ? INT_MAX : 1 << 30;
                p->num_pages = 1;
                p->block_table_stride = (int)fz_range(s, 1, 3);
                kv_s = p->seqlen_k;
            } else {
                p->page_size = (int)fz_range(s, 1, 8);
                p->block_table_stride = (p->seqlen_k + p->page_size - 1) / p->page_size + (int)fz_range(s, 0, 2);
                p->num_pages = (int)fz_range(s, 1, 2 * B * p->block_table_stride);
                kv_s = p->page_size;
            }
            kv_b = p->num_pages;
            const size_t nbt = (size_t)B * (size_t)p->block_table_stride;
            c->buf[A_BT] = fz_buf_new(nbt * 4, (size_t)fz_range(s, 0, 3) * 4);
            int32_t *bt = (int32_t *)c->buf[A_BT].data;
            for (size_t e = 0; e < nbt; ++e) bt[e] = (int32_t)fz_range(s, 0, p->num_pages - 1);
            p->block_table = bt;
        }
        if (c->mode == 3 && p->page_size > 8) {
            /* one huge page whose first seqlen_k rows exist: packed rows and
             * heads, a page stride that is never used (one page) */
            layout l = {(int64_t)1 << 40, (int64_t)D * p->heads_kv, D,
                        (size_t)kv_s * (size_t)D * (size_t)p->heads_kv};
            c->lk = c->lv = l;
            p->k_batch_stride = p->v_batch_stride = l.bs;
        } else {
            c->lk = make_layout(s, kv_b, kv_s, p->heads_kv, D, &ex, 0);
            if (ex) { p->k_batch_stride = c->lk.bs; p->k_seq_stride = c->lk.ss; p->k_head_stride = c->lk.hs; }
            c->lv = make_layout(s, kv_b, kv_s, p->heads_kv, D, &ex, 0);
            if (ex) { p->v_batch_stride = c->lv.bs; p->v_seq_stride = c->lv.ss; p->v_head_stride = c->lv.hs; }
        }
        if (c->mode == 1 || (c->mode == 3 && fz_chance(s, 1, 2))) {
            c->buf[A_SEQLENS] = fz_buf_new((size_t)B * 4, (size_t)fz_range(s, 0, 3) * 4);
            int32_t *sk = (int32_t *)c->buf[A_SEQLENS].data;
            for (int b = 0; b < B; ++b) {
                int r = (int)fz_range(s, 0, 9);
                sk[b] = r == 0 ? -(int)fz_range(s, 1, 5) : r == 1 ? p->seqlen_k + (int)fz_range(s, 0, 5)
                        : r == 2 ? INT32_MIN : r == 3 ? INT32_MAX : (int)fz_range(s, 0, p->seqlen_k);
            }
            fz_buf_snapshot(&c->buf[A_SEQLENS]);
            p->seqlens_k = sk;
        }
        if (c->mode == 3) { /* unused block-table entries may hold anything */
            int32_t *bt = (int32_t *)c->buf[A_BT].data;
            for (int b = 0; b < B; ++b) {
                int L = p->seqlens_k ? p->seqlens_k[b] : p->seqlen_k;
                L = L < 0 ? 0 : L > p->seqlen_k ? p->seqlen_k : L;
                const int64_t used = L > 0 ? ((int64_t)L + p->page_size - 1) / p->page_size : 0;
                const int32_t junk[] = {-1, INT32_MIN, INT32_MAX, p->num_pages, -77};
                for (int64_t e = used; e < p->block_table_stride; ++e)
                    if (fz_chance(s, 1, 2)) bt[(int64_t)b * p->block_table_stride + e] = junk[fz_range(s, 0, 4)];
            }
            fz_buf_snapshot(&c->buf[A_BT]);
        }
    }
    const size_t esh = es * (size_t)fz_range(s, 0, 8);
    c->buf[A_Q] = fz_buf_new(c->lq.elems * es, fz_chance(s, 1, 2) ? 0 : esh);
    c->buf[A_K] = fz_buf_new(c->lk.elems * es, fz_chance(s, 1, 2) ? 0 : esh);
    c->buf[A_V] = fz_buf_new(c->lv.elems * es, fz_chance(s, 1, 2) ? 0 : esh);
    c->buf[A_O] = fz_buf_new(c->lo.elems * es, fz_chance(s, 1, 2) ? 0 : esh);
    fz_fill(c->buf[A_Q].data, p->dtype, c->lq.elems, s, -1.5, 1.5);
    fz_fill(c->buf[A_K].data, p->dtype, c->lk.elems, s, -1.5, 1.5);
    fz_fill(c->buf[A_V].data, p->dtype, c->lv.elems, s, -1.0, 1.0);
    fz_buf_snapshot(&c->buf[A_Q]);
    fz_buf_snapshot(&c->buf[A_K]);
    fz_buf_snapshot(&c->buf[A_V]);
    if (fz_chance(s, 1, 2)) {
        c->buf[A_LSE] = fz_buf_new((size_t)B * p->heads_q * p->seqlen_q * 4, (size_t)fz_range(s, 0, 3) * 4);
        p->lse = (float *)c->buf[A_LSE].data;
    }
    p->q = c->buf[A_Q].data;
    p->k = c->buf[A_K].data;
    p->v = c->buf[A_V].data;
    p->o = c->buf[A_O].data;
}

static void acase_free(acase *c) {
    for (int t = 0; t < A_COUNT; ++t) fz_buf_free(&c->buf[t]);
}

/* ---- the reference and the checks of a successful call ---- */

static void check_success(az_ctx *z, acase *c, const char *what) {
    const fp_attention_params *p = &c->p;
    const fp_dtype dt = p->dtype;
    const int D = p->head_dim, G = p->heads_q / p->heads_kv;
    const double scale = p->softmax_scale > 0 ? p->softmax_scale : 1.0 / sqrt((double)D);
    const int wr = p->causal ? 0 : p->window_right, wl = p->window_left;
    const int32_t *cq = p->cu_seqlens_q, *ck = p->cu_seqlens_k;
    unsigned char *o_mark = calloc(c->lo.elems ? c->lo.elems : 1, 1);
    const size_t n_lse = (size_t)p->batch * p->heads_q * p->seqlen_q;
    unsigned char *lse_mark = calloc(n_lse ? n_lse : 1, 1);
    double *sc = malloc((size_t)p->seqlen_k * sizeof *sc), *acc = malloc((size_t)D * sizeof *acc);
    /* atol relative to max |V| = 1 (P sums to 1): f32 accumulation, or
     * P and O rounded to f16 / bf16 */
    const double atol = dt == FP_F32 ? 2e-5 : dt == FP_F16 ? 4e-3 : 3e-2;
    int reported = 0;
    for (int b = 0; b < p->batch; ++b) {
        int sq = p->seqlen_q, L = p->seqlen_k;
        int64_t qrow0 = 0, krow0 = 0;
        if (cq) {
            sq = cq[b + 1] - cq[b];
            L = ck[b + 1] - ck[b];
            qrow0 = cq[b];
            krow0 = ck[b];
        } else if (p->seqlens_k) {
            L = p->seqlens_k[b] < 0 ? 0 : p->seqlens_k[b] > p->seqlen_k ? p->seqlen_k : p->seqlens_k[b];
        }
        for (int h = 0; h < p->heads_q; ++h) {
            const int hk = h / G;
            for (int i = 0; i < sq; ++i) {
                const int64_t qoff = cq ? (qrow0 + i) * c->lq.ss + h * c->lq.hs
                                        : b * c->lq.bs + (int64_t)i * c->lq.ss + h * c->lq.hs;
                const int64_t ooff = cq ? (qrow0 + i) * c->lo.ss + h * c->lo.hs
                                        : b * c->lo.bs + (int64_t)i * c->lo.ss + h * c->lo.hs;
                const int64_t diag = (int64_t)i + L - sq;
                double mx = -INFINITY;
                for (int j = 0; j < L; ++j) {
                    sc[j] = -INFINITY;
                    if (wr >= 0 && j > diag + wr) continue;
                    if (wl >= 0 && j < diag - wl) continue;
                    int64_t krow, vrow;
                    if (p->block_table) {
                        const int32_t pg = p->block_table[(int64_t)b * p->block_table_stride + j / p->page_size];
                        krow = pg * c->lk.bs + (int64_t)(j % p->page_size) * c->lk.ss;
                        vrow = pg * c->lv.bs + (int64_t)(j % p->page_size) * c->lv.ss;
                    } else if (cq) {
                        krow = (krow0 + j) * c->lk.ss;
                        vrow = (krow0 + j) * c->lv.ss;
                    } else {
                        krow = b * c->lk.bs + (int64_t)j * c->lk.ss;
                        vrow = b * c->lv.bs + (int64_t)j * c->lv.ss;
                    }
                    (void)vrow;
                    double dot = 0.0;
                    for (int d = 0; d < D; ++d)
                        dot += (double)fz_load(c->buf[A_Q].shadow, dt, (size_t)(qoff + d)) *
                               fz_load(c->buf[A_K].shadow, dt, (size_t)(krow + hk * c->lk.hs + d));
                    sc[j] = dot * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                double sum = 0.0;
                for (int d = 0; d < D; ++d) acc[d] = 0.0;
                if (mx > -INFINITY) {
                    for (int j = 0; j < L; ++j) {
                        if (sc[j] == -INFINITY) continue;
                        const double w = exp(sc[j] - mx);
                        sum += w;
                        const int64_t vrow = p->block_table
                            ? p->block_table[(int64_t)b * p->block_table_stride + j / p->page_size] * c->lv.bs +
                                  (int64_t)(j % p->page_size) * c->lv.ss
                            : cq ? (krow0 + j) * c->lv.ss : b * c->lv.bs + (int64_t)j * c->lv.ss;
                        for (int d = 0; d < D; ++d)
                            acc[d] += w * fz_load(c->buf[A_V].shadow, dt, (size_t)(vrow + hk * c->lv.hs + d));
                    }
                }
                for (int d = 0; d < D; ++d) {
                    const double want = sum > 0 ? acc[d] / sum : 0.0;
                    const size_t idx = (size_t)(ooff + d);
                    o_mark[idx] = 1;
                    const double got = fz_load(c->buf[A_O].data, dt, idx);
                    if (!(fabs(got - want) <= atol + atol * fabs(want)) && reported++ < 3) {
                        fprintf(stderr,
                                "seed %llu iter %ld: %s: O[b %d, i %d, h %d, d %d] = %.7g, reference %.7g "
                                "(mode %d, dtype %s, L %d, sq %d, windows %d/%d, causal %d)\n",
                                (unsigned long long)z->run.seed, z->run.iter, what, b, i, h, d, got, want, c->mode,
                                fp_dtype_name(dt), L, sq, p->window_left, p->window_right, p->causal);
                        fp_test_failures++;
                    }
                }
                if (p->lse) {
                    const size_t li = ((size_t)b * p->heads_q + h) * p->seqlen_q + i;
                    lse_mark[li] = 1;
                    const double want = sum > 0 ? mx + log(sum) : -INFINITY;
                    const double got = p->lse[li];
                    const int ok = want == -INFINITY ? got == -INFINITY : fabs(got - want) <= 2e-3 * (1 + fabs(want));
                    if (!ok && reported++ < 3) {
                        fprintf(stderr, "seed %llu iter %ld: %s: lse[b %d, h %d, i %d] = %.7g, reference %.7g\n",
                                (unsigned long long)z->run.seed, z->run.iter, what, b, h, i, got, want);
                        fp_test_failures++;
                    }
                }
            }
        }
    }
    /* everything not written by the op keeps its poison */
    const size_t es = fp_dtype_size(dt);
    for (size_t e = 0; e < c->lo.elems; ++e)
        if (!o_mark[e] && memcmp(c->buf[A_O].data + e * es, c->buf[A_O].shadow + e * es, es) && reported++ < 3) {
            fprintf(stderr, "seed %llu iter %ld: %s: O element %zu (padding / past a sequence) was written\n",
                    (unsigned long long)z->run.seed, z->run.iter, what, e);
            fp_test_failures++;
        }
    if (p->lse)
        for (size_t e = 0; e < n_lse; ++e)
            if (!lse_mark[e] && memcmp(c->buf[A_LSE].data + e * 4, c->buf[A_LSE].shadow + e * 4, 4) && reported++ < 3) {
                fprintf(stderr, "seed %llu iter %ld: %s: lse element %zu (past a varlen sequence) was written\n",
                        (unsigned long long)z->run.seed, z->run.iter, what, e);
                fp_test_failures++;
            }
    FZ_CHECK_BUF(&z->run, "o", &c->buf[A_O], 0);
    FZ_CHECK_BUF(&z->run, "lse", &c->buf[A_LSE], 0);
    for (int t = 0; t < A_COUNT; ++t)
        if (t != A_O && t != A_LSE) FZ_CHECK_BUF(&z->run, buf_names[t], &c->buf[t], 1);
    free(o_mark);
    free(lse_mark);
    free(sc);
    free(acc);
}

/* ---- one broken argument ---- */

static const char *break_one(az_ctx *z, acase *c, fp_context **ctx, const fp_attention_params **pp) {
    uint64_t *s = &z->rng;
    fp_attention_params *p = &c->p;
    switch (fz_range(s, 0, 30)) {
    case 0: *pp = NULL; return "params";
    case 1: *ctx = NULL; return "ctx";
    case 2: p->struct_size = fz_chance(s, 1, 2) ? 0 : sizeof *p + 8; return "struct_size";
    case 3: p->batch = fz_chance(s, 1, 2) ? 0 : INT_MIN; return "batch";
    case 4: p->seqlen_q = -(int)fz_range(s, 0, 5); return "seqlen_q";
    case 5: p->seqlen_k = fz_chance(s, 1, 2) ? 0 : INT_MIN; return "seqlen_k";
    case 6: p->heads_q = -(int)fz_range(s, 0, 5); return "heads_q";
    case 7: p->heads_kv = -(int)fz_range(s, 0, 5); return "heads_kv";
    case 8:
        if (p->heads_kv < 2) return "";
        p->heads_q = p->heads_kv * (int)fz_range(s, 1, 3) + 1;
        return "heads_q";
    case 9: {
        const int bad[] = {0, 4, 12, 264, -8, INT_MAX, 1 << 30, 257};
        p->head_dim = bad[fz_range(s, 0, 7)];
        return "head_dim";
    }
    case 10: {
        const fp_dtype bad[] = {(fp_dtype)7, FP_FP8_E5M2, (fp_dtype)5, (fp_dtype)-1};
        p->dtype = bad[fz_range(s, 0, 3)];
        return "dtype";
    }
    case 11: {
        const float bad[] = {-1e-3f, NAN, INFINITY, -INFINITY};
        p->softmax_scale = bad[fz_range(s, 0, 3)];
        return "softmax_scale";
    }
    case 12: p->causal = fz_chance(s, 1, 2) ? 2 : -1; return "causal";
    case 13: p->window_left = fz_chance(s, 1, 2) ? -2 : INT_MIN; return "window_left";
    case 14: p->window_right = fz_chance(s, 1, 2) ? -2 : INT_MIN; return "window_right";
    case 15: p->causal = 1; p->window_right = (int)fz_range(s, 1, 5); return "window_right";
    case 16: {
        const int k = (int)fz_range(s, 0, 3);
        if (k == 0) { p->q = NULL; return "'q'"; }
        if (k == 1) { p->k = NULL; return "'k'"; }
        if (k == 2) { p->v = NULL; return "'v'"; }
        p->o = NULL;
        return "'o'";
    }
    case 17: {
        const int k = (int)fz_range(s, 0, 3);
        const size_t off = p->dtype == FP_F32 ? (size_t)fz_range(s, 1, 3) : 1;
        if (k == 0) { p->q = (const char *)p->q + off; return "'q'"; }
        if (k == 1) { p->k = (const char *)p->k + off; return "'k'"; }
        if (k == 2) { p->v = (const char *)p->v + off; return "'v'"; }
        p->o = (char *)p->o + off;
        return "'o'";
    }
    case 18:
        if (!p->lse) return "";
        p->lse = (float *)((char *)p->lse + fz_range(s, 1, 3));
        return "lse";
    case 19:
        if (!p->seqlens_k) return "";
        p->seqlens_k = (const int32_t *)((const char *)p->seqlens_k + fz_range(s, 1, 3));
        return "seqlens_k";
    case 20: { /* a negative stride */
        int64_t *slots[] = {&p->q_seq_stride, &p->k_head_stride, &p->v_seq_stride, &p->o_head_stride};
        *slots[fz_range(s, 0, 3)] = -fz_range(s, 1, 64);
        return "stride";
    }
    case 21: { /* two rows of one tensor overlap: the seq stride inside a row */
        if (p->seqlen_q < 2 || (c->mode == 2 && c->total_q < 2)) return ""; /* varlen: packed rows */
        p->o_seq_stride = fz_range(s, 1, p->head_dim - 1);
        p->o_head_stride = p->heads_q > 1 ? p->head_dim * p->seqlen_q * 4 : 0;
        if (c->mode != 2) p->o_batch_stride = 0;
        return "stride";
    }
    case 22: /* an extent that overflows */
        if (p->batch < 2 || c->mode == 2) return "";
        p->k_batch_stride = INT64_MAX / fz_range(s, 1, 4);
        if (c->mode == 3 && p->num_pages < 2) return "";
        return "stride";
    case 23: { /* varlen rules */
        if (c->mode != 2) {
            if (fz_chance(s, 1, 2)) { /* one offset array alone */
                static const int32_t offs[4] = {0, 1, 2, 3};
                if (fz_chance(s, 1, 2)) p->cu_seqlens_q = offs;
                else p->cu_seqlens_k = offs;
                return "cu_seqlens";
            }
            return "";
        }
        int32_t *cq = (int32_t *)c->buf[A_CUQ].data, *ck = (int32_t *)c->buf[A_CUK].data;
        switch (fz_range(s, 0, 6)) {
        case 0: p->seqlens_k = (const int32_t *)ck; return "seqlens_k";
        case 1: p->q_batch_stride = 1 << 20; return "batch stride";
        case 2: /* decreasing */
            cq[p->batch] = cq[p->batch - 1] - (int)fz_range(s, 1, 3);
            fz_buf_snapshot(&c->buf[A_CUQ]);
            return "cu_seqlens_q";
        case 3:
            ck[p->batch] = ck[p->batch - 1] + p->seqlen_k + (int)fz_range(s, 1, 3);
            fz_buf_snapshot(&c->buf[A_CUK]);
            return "cu_seqlens_k";
        case 4:
            cq[0] = -(int)fz_range(s, 1, 3);
            fz_buf_snapshot(&c->buf[A_CUQ]);
            return "cu_seqlens_q";
        case 5: p->cu_seqlens_q = (const int32_t *)((const char *)cq + 2); return "cu_seqlens";
        default:
            if (!c->buf[A_Q].raw) return "";
            cq[p->batch] = INT32_MIN;
            fz_buf_snapshot(&c->buf[A_CUQ]);
            return "cu_seqlens_q";
        }
    }
    case 24: case 25: { /* paged rules */
        if (c->mode != 3) return "";
        int32_t *bt = (int32_t *)c->buf[A_BT].data;
        switch (fz_range(s, 0, 5)) {
        case 0: p->page_size = -(int)fz_range(s, 0, 3); return "page_size";
        case 1: p->num_pages = fz_chance(s, 1, 2) ? 0 : INT_MIN; return "num_pages";
        case 2:
            p->block_table_stride = (p->seqlen_k - 1) / p->page_size; /* one entry short */
            if (p->block_table_stride < 0) p->block_table_stride = 0;
            return "block_table_stride";
        case 3: { /* an entry a sequence uses, out of range */
            const int b = (int)fz_range(s, 0, p->batch - 1);
            int L = p->seqlens_k ? p->seqlens_k[b] : p->seqlen_k;
            L = L < 0 ? 0 : L > p->seqlen_k ? p->seqlen_k : L;
            if (L == 0) return "";
            const int64_t used = ((int64_t)L + p->page_size - 1) / p->page_size;
            const int32_t bad[] = {-1, p->num_pages, INT32_MAX, INT32_MIN};
            bt[(int64_t)b * p->block_table_stride + fz_range(s, 0, used - 1)] = bad[fz_range(s, 0, 3)];
            fz_buf_snapshot(&c->buf[A_BT]);
            return "block_table";
        }
        case 4: p->block_table = (const int32_t *)((const char *)bt + 2); return "block_table";
        default: {
            static const int32_t offs[4] = {0, 0, 0, 0};
            p->cu_seqlens_q = p->cu_seqlens_k = offs;
            p->seqlens_k = NULL;
            p->k_batch_stride = p->v_batch_stride = p->q_batch_stride = p->o_batch_stride = 0;
            return "block_table";
        }
        }
    }
    case 26: /* the varlen overlap the seq dimension hides: extent seqlen_q = 1 but several packed rows */
        if (c->mode != 2 || p->seqlen_q != 1 || c->total_q < 2 || p->heads_q < 2) return "";
        p->o_head_stride = p->head_dim;
        p->o_seq_stride = p->head_dim; /* row r + 1's head 0 is row r's head 1 */
        return "stride";
    case 27: /* more query rows than the CPU implementation indexes */
        if (c->mode == 2) return "";
        p->seqlen_q = 1 << 22;
        p->heads_q = p->heads_kv * 512;
        p->q_batch_stride = p->q_seq_stride = p->q_head_stride = 0;
        p->o_batch_stride = p->o_seq_stride = p->o_head_stride = 0;
        p->lse = NULL;
        return "seqlen_q";
    case 28: /* total_k: negative, below the packed keys, or without cu_seqlens */
        if (c->mode != 2) {
            p->total_k = fz_range(s, 1, 1000);
            return "total_k";
        }
        if (fz_chance(s, 1, 2) || c->total_k < 1) {
            p->total_k = fz_chance(s, 1, 2) ? -1 : INT64_MIN;
            return "total_k";
        }
        p->total_k = c->total_k - fz_range(s, 1, c->total_k);
        return p->total_k ? "total_k" : ""; /* 0: not given, valid */
    case 29: { /* a descale: fp8 only (f32 / f16 / bf16 take 0 or 1), finite and >= 0 */
        const float bad[] = {2.0f, 0.5f, -1.0f, NAN, INFINITY, -1e-30f};
        const float v = bad[fz_range(s, 0, 5)];
        const int k = (int)fz_range(s, 0, 2);
        if (k == 0) { p->q_descale = v; return "q_descale"; }
        if (k == 1) { p->k_descale = v; return "k_descale"; }
        p->v_descale = v;
        return "v_descale";
    }
    case 30: { /* kv_dtype: another 16-bit type, e5m2, out of range, or a 16-bit one under fp8 */
        const fp_dtype bad[] = {p->dtype == FP_F16 ? FP_BF16 : FP_F16, FP_FP8_E5M2, (fp_dtype)5, (fp_dtype)-1};
        p->kv_dtype = bad[fz_range(s, 0, 3)];
        return "kv_dtype";
    }
    default: return "";
    }
}

static void run_case(az_ctx *z, int baseline) {
    acase c;
    acase_make(z, &c);
    fp_context *ctx = z->ctx;
    const fp_attention_params *pp = &c.p;
    const int broken = fz_chance(&z->rng, 1, 2);
    const char *names = broken ? break_one(z, &c, &ctx, &pp) : NULL;
    if (broken && names && !*names) {
        acase_free(&c);
        return;
    }
    /* A caller built against 0.1 passes the shorter struct: the library must
     * read nothing past its struct_size (the struct is cut to that size on
     * the heap, so ASan sees a read past it). */
    fp_attention_params *v1 = NULL;
    if (!broken && c.mode != 3 && fz_chance(&z->rng, 1, 6)) {
        v1 = malloc(FZ_ATTN_V1_SIZE);
        memcpy(v1, &c.p, FZ_ATTN_V1_SIZE);
        v1->struct_size = FZ_ATTN_V1_SIZE;
        pp = v1;
    }
    const char *what = baseline ? "fp_attention_forward_baseline" : "fp_attention_forward";
    fp_clear_error();
    fp_status st = baseline ? fp_attention_forward_baseline(ctx, NULL, pp) : fp_attention_forward(ctx, NULL, pp);
    if (broken) {
        z->bad_calls++;
        if (FZ_CHECK_CALL(&z->run, what, st, FP_ERR_INVALID_ARGUMENT, names) != FP_ERR_INVALID_ARGUMENT)
            fprintf(stderr, "  (broken argument: '%s', mode %d)\n", names ? names : "?", c.mode);
        for (int t = 0; t < A_COUNT; ++t) FZ_CHECK_BUF(&z->run, buf_names[t], &c.buf[t], 1);
    } else {
        z->ok_calls++;
        if (FZ_CHECK_CALL(&z->run, what, st, FP_OK, NULL) == FP_OK) check_success(z, &c, what);
        else for (int t = 0; t < A_COUNT; ++t) FZ_CHECK_BUF(&z->run, buf_names[t], &c.buf[t], 1);
    }
    free(v1);
    if (!broken && fz_chance(&z->rng, 1, 30)) { /* validate writes neither o nor lse */
        for (int t = 0; t < A_COUNT; ++t) fz_buf_snapshot(&c.buf[t]);
        fp_timing_config cfg;
        fp_timing_config_default(&cfg);
        cfg.warmup = 0;
        cfg.min_samples = 1;
        cfg.max_samples = 2;
        cfg.max_time_s = 0.05;
        cfg.min_sample_ms = 0.0;
        fp_ab_report rep;
        memset(&rep, 0, sizeof rep);
        st = fp_attention_validate(z->ctx, NULL, &c.p, &cfg, &rep);
        FZ_CHECK_CALL(&z->run, "fp_attention_validate", st, FP_OK, NULL);
        if (st == FP_OK)
            CHECK_MSG(rep.compared && rep.agreement.passed, "validate disagreement (seed %llu iter %ld)",
                      (unsigned long long)z->run.seed, z->run.iter);
        for (int t = 0; t < A_COUNT; ++t) FZ_CHECK_BUF(&z->run, buf_names[t], &c.buf[t], 1);
    }
    acase_free(&c);
}

/* The helpers and the params initializer on bad input. */
static void helpers(az_ctx *z) {
    fp_attention_params p;
    memset(&p, 0x5A, sizeof p);
    unsigned char keep[sizeof p];
    memcpy(keep, &p, sizeof p);
    const size_t bad_sizes[] = {0, 1, FZ_ATTN_V1_SIZE - 8, sizeof p + 8, SIZE_MAX};
    for (int i = 0; i < 5; ++i) {
        FZ_CHECK_CALL(&z->run, "fp_attention_params_init (bad size)", fp_attention_params_init(&p, bad_sizes[i]),
                      FP_ERR_INVALID_ARGUMENT, "struct_size");
        CHECK(memcmp(&p, keep, sizeof p) == 0);
    }
    FZ_CHECK_CALL(&z->run, "fp_attention_params_init(NULL)", fp_attention_params_init(NULL, sizeof p),
                  FP_ERR_INVALID_ARGUMENT, NULL);
    /* the 0.1 initializer writes the 0.1 prefix only */
    (fp_attention_params_default)(&p);
    CHECK(p.struct_size == FZ_ATTN_V1_SIZE && memcmp((char *)&p + FZ_ATTN_V1_SIZE, keep + FZ_ATTN_V1_SIZE,
                                                     sizeof p - FZ_ATTN_V1_SIZE) == 0);
    (fp_attention_params_default)(NULL);
    CHECK(fp_attention_flops(NULL) == 0.0);
    fp_attention_params_default(&p);
    fp_ab_report rep;
    FZ_CHECK_CALL(&z->run, "fp_attention_validate(NULL report)", fp_attention_validate(z->ctx, NULL, &p, NULL, NULL),
                  FP_ERR_INVALID_ARGUMENT, "report");
    FZ_CHECK_CALL(&z->run, "fp_attention_validate(NULL params)", fp_attention_validate(z->ctx, NULL, NULL, NULL, &rep),
                  FP_ERR_INVALID_ARGUMENT, "params");
}

int main(int argc, char **argv) {
    az_ctx z;
    memset(&z, 0, sizeof z);
    z.run = fz_run_init(argc, argv, 0x6174746eULL, 2000, 4.0);
    z.rng = z.run.seed * 0x9E3779B97F4A7C15ULL + 11;
    if (fp_context_create(FP_DEVICE_CPU, -1, &z.ctx) != FP_OK) {
        fprintf(stderr, "CPU context: %s\n", fp_last_error());
        return 1;
    }
    CHECK_OK(fp_context_set_option(z.ctx, FP_CTX_CPU_THREADS, 2));
    helpers(&z);
    for (; fz_more(&z.run) && !fz_too_many_failures(); ++z.run.iter) run_case(&z, fz_chance(&z.rng, 1, 4));
    printf("attention fuzz: %ld iterations, %ld valid calls, %ld with a broken argument\n", z.run.iter, z.ok_calls,
           z.bad_calls);
    fp_context_destroy(z.ctx);
    TEST_END();
}
