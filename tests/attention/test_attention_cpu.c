/* Attention on a CPU context: the tiled online-softmax implementation
 * (fp_attention_forward) and the materialized baseline
 * (fp_attention_forward_baseline) against the double reference, over every
 * option: seqlens 1..1024, causal with seqlen_q < and > seqlen_k, GQA/MQA,
 * windows, LSE, ragged decode, strided layouts, f32/f16/bf16, head dims; bad
 * input with outputs untouched; validate. */
#include <stddef.h>
#include <pthread.h>
#include <string.h>

#include "attn_test_util.h"

static fp_context *g_ctx;

/* The tiled (fp_attention_forward) and the materialized (baseline)
 * implementation on H, outputs poisoned (NaN) first, against the reference.
 * Tolerance: f32 accumulation error (grows slowly with the number of keys:
 * 2e-5 covers 1024 keys of |v| <= 1) plus one rounding of O to the dtype. */
static void check_impls(const attn_case *c, attn_host *H, const double *o_ref, const double *lse_ref) {
    const double atol = 2e-5, rtol = attn_eps(c->dtype) + 2e-5;
    for (int impl = 0; impl < 2; ++impl) {
        memset(H->o, 0xFF, H->o_bytes);
        if (H->lse) memset(H->lse, 0xFF, sizeof(float) * attn_n_lse(&H->p));
        fp_status st = impl == 0 ? fp_attention_forward(g_ctx, NULL, &H->p)
                                 : fp_attention_forward_baseline(g_ctx, NULL, &H->p);
        CHECK_MSG(st == FP_OK, "%s/%s: %s (%s)", c->name, impl ? "naive" : "tiled", fp_status_string(st),
                  fp_last_error());
        if (st != FP_OK) continue;
        attn_err E = attn_compare(H, H->o, H->lse, o_ref, lse_ref, atol, rtol);
        CHECK_MSG(E.bad == 0 && E.lse_bad == 0,
                  "%s/%s: %zu bad of %zu (first at %zu: got %.8g ref %.8g), max abs err %.3g, lse bad %zu "
                  "(max err %.3g)",
                  c->name, impl ? "naive" : "tiled", E.bad, H->n_o, E.first_bad, E.first_got, E.first_ref,
                  E.max_abs, E.lse_bad, E.lse_max_abs);
    }
}

static void run_case(const attn_case *c) {
    attn_host H;
    if (!attn_host_make(c, &H, 1234 + (uint64_t)c->sq * 7 + (uint64_t)c->sk)) {
        CHECK_MSG(0, "%s: host allocation", c->name);
        return;
    }
    double *o_ref = NULL, *lse_ref = NULL;
    CHECK(attn_reference(g_ctx->pool, &H, &o_ref, &lse_ref));
    check_impls(c, &H, o_ref, lse_ref);
    free(o_ref);
    free(lse_ref);
    attn_host_free(&H);
}

static void test_options(void) {
    static const attn_case cases[] = {
        /* name            b  sq    sk    hq hkv d   dtype   causal wl  wr scale lse rag str */
        {"seq1",           2, 1,    1,    2, 2, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0},
        {"seq17",          2, 17,   17,   2, 2, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0},
        {"seq128",         1, 128,  128,  2, 2, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0},
        {"seq333",         1, 333,  333,  2, 1, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0},
        {"seq1024",        1, 1024, 1024, 1, 1, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0},
        {"causal333",      1, 333,  333,  2, 2, 64, FP_F32, 1, -1, -1, 0, 1, 0, 0},
        {"causal1024",     1, 1024, 1024, 1, 1, 32, FP_F32, 1, -1, -1, 0, 1, 0, 0},
        {"causal_q<k",     2, 17,   333,  2, 2, 64, FP_F32, 1, -1, -1, 0, 1, 0, 0},
        {"causal_q>k",     2, 333,  17,   2, 2, 64, FP_F32, 1, -1, -1, 0, 1, 0, 0},
        {"causal_q>k_1",   1, 128,  1,    2, 1, 64, FP_F32, 1, -1, -1, 0, 1, 0, 0},
        {"gqa3",           2, 128,  128,  6, 2, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0},
        {"mqa_causal",     1, 333,  333,  4, 1, 64, FP_F32, 1, -1, -1, 0, 1, 0, 0},
        {"window_32_8",    1, 333,  333,  2, 2, 64, FP_F32, 0, 32, 8, 0, 1, 0, 0},
        {"window_causal",  1, 333,  400,  2, 2, 64, FP_F32, 1, 16, -1, 0, 1, 0, 0},
        {"window_0_0",     1, 128,  128,  2, 2, 64, FP_F32, 0, 0, 0, 0, 1, 0, 0},
        {"window_left",    1, 128,  333,  2, 2, 64, FP_F32, 0, 5, -1, 0, 1, 0, 0},
        {"window_right",   1, 333,  128,  2, 2, 64, FP_F32, 0, -1, 3, 0, 1, 0, 0},
        {"scale0.3",       1, 128,  128,  2, 2, 64, FP_F32, 0, -1, -1, 0.3f, 1, 0, 0},
        {"no_lse",         1, 128,  128,  2, 2, 64, FP_F32, 1, -1, -1, 0, 0, 0, 0},
        {"f16",            1, 333,  333,  2, 2, 64, FP_F16, 1, -1, -1, 0, 1, 0, 0},
        {"bf16",           1, 333,  333,  2, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"bf16_gqa",       2, 17,   128,  4, 2, 64, FP_BF16, 1, -1, -1, 0, 1, 0, 0},
        {"d8",             1, 128,  128,  2, 2, 8, FP_F32, 0, -1, -1, 0, 1, 0, 0},
        {"d96",            1, 128,  128,  2, 2, 96, FP_F16, 1, -1, -1, 0, 1, 0, 0},
        {"d256",           1, 128,  128,  1, 1, 256, FP_BF16, 0, -1, -1, 0, 1, 0, 0},
        {"decode_ragged",  8, 1,    1024, 8, 2, 128, FP_F32, 0, -1, -1, 0, 1, 1, 0},
        {"decode4_ragged_c", 4, 4,  1024, 4, 1, 64, FP_BF16, 1, -1, -1, 0, 1, 1, 0},
        {"decode_ragged_w", 4, 3,   333,  2, 2, 64, FP_F16, 1, 40, -1, 0, 1, 1, 0},
        {"strided",        2, 77,   77,   4, 2, 64, FP_F32, 1, -1, -1, 0, 1, 0, 1},
        {"strided_bf16",   2, 33,   129,  2, 1, 128, FP_BF16, 0, 20, 4, 0, 1, 0, 1},
        {"strided_decode", 4, 2,    300,  4, 4, 64, FP_F16, 1, -1, -1, 0, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i]);
}

/* Paged KV: the same case with K/V scattered over shuffled pages of a pool
 * (NaN poison everywhere no key maps to) must match the reference computed
 * on the dense layout; page sizes that divide, do not divide and exceed
 * the CPU tile, padded page strides, ragged lengths, GQA, causal, windows. */
static void test_paged(void) {
    static const struct {
        attn_case c;
        int page_size, pad;
    } cases[] = {
        /*  name             b  sq  sk    hq hkv d   dtype    causal wl  wr  sc lse rag str  page pad */
        {{"paged_decode",    4, 1,  1000, 8, 2, 128, FP_BF16, 0, -1, -1, 0, 1, 1, 0}, 16, 0},
        {{"paged_decode_c",  4, 4,  333,  4, 1, 64,  FP_F16,  1, -1, -1, 0, 1, 1, 0}, 7, 1},
        {{"paged_prefill",   2, 200, 200, 2, 2, 64,  FP_F32,  1, -1, -1, 0, 1, 0, 0}, 64, 0},
        {{"paged_window",    2, 17, 500,  2, 2, 32,  FP_F32,  0, 40, 3, 0, 1, 0, 0}, 256, 1},
        {{"paged_one_page",  3, 5,  100,  2, 1, 64,  FP_BF16, 1, -1, -1, 0, 1, 1, 0}, 128, 0},
        {{"paged_page1",     2, 3,  50,   2, 2, 64,  FP_F32,  0, -1, -1, 0, 1, 0, 0}, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const attn_case *c = &cases[i].c;
        attn_host H;
        attn_paged P;
        CHECK(attn_host_make(c, &H, 77 + i));
        double *o_ref = NULL, *lse_ref = NULL;
        CHECK(attn_reference(g_ctx->pool, &H, &o_ref, &lse_ref)); /* dense layout */
        CHECK(attn_page(&H, cases[i].page_size, cases[i].pad, 99 + i, &P));
        check_impls(c, &H, o_ref, lse_ref);
        if (i == 0) { /* bad paged arguments: named, outputs untouched */
            static const char *what[] = {"page_size", "num_pages", "block_table_stride", "block_table",
                                         "block_table", "k strides", "cu_seqlens"};
            int32_t cu[5] = {0, 1, 2, 3, 4};
            for (int f = 0; f < 7; ++f) {
                fp_attention_params p = H.p;
                switch (f) {
                case 0: p.page_size = 0; break;
                case 1: p.num_pages = 0; break;
                case 2: p.block_table_stride = 2; break; /* 2 x 16 < 1000 keys */
                case 3: P.table[1] = P.num_pages; break; /* sequence 0 uses its 2nd entry */
                case 4: P.table[0] = -1; break;
                case 5: p.k_seq_stride = 64; break;      /* heads of a key overlap */
                case 6: p.cu_seqlens_q = p.cu_seqlens_k = cu; p.seqlens_k = NULL;
                        p.k_batch_stride = p.v_batch_stride = 0; break;
                }
                memset(H.o, 0x5A, H.o_bytes);
                fp_status st = fp_attention_forward(g_ctx, NULL, &p);
                CHECK_MSG(st == FP_ERR_INVALID_ARGUMENT && strstr(fp_last_error(), what[f]),
                          "paged bad input %d: %s (%s), expected the message to name %s", f,
                          fp_status_string(st), fp_last_error(), what[f]);
                int untouched = 1;
                for (size_t b = 0; b < H.o_bytes; ++b) untouched &= ((unsigned char *)H.o)[b] == 0x5A;
                CHECK_MSG(untouched, "paged bad input %d: O written", f);
                if (f == 3) P.table[1] = 0;
                if (f == 4) P.table[0] = 1;
            }
        }
        free(o_ref);
        free(lse_ref);
        attn_paged_free(&P);
        attn_host_free(&H);
    }
}

/* A page size near INT_MAX is accepted ("any page size"): the CPU check of
 * the table must still see the entry the sequence uses (L + page_size - 1
 * overflowed int and skipped it) and refuse it, writing nothing. */
static void test_paged_huge_page(void) {
    float q[8], k[10 * 8], v[10 * 8], o[8];
    for (int i = 0; i < 80; ++i) k[i] = v[i] = 0.5f;
    for (int i = 0; i < 8; ++i) { q[i] = 1.0f; o[i] = 7.0f; }
    int32_t table[1] = {5}; /* outside [0, 1) */
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = 1; p.seqlen_q = 1; p.seqlen_k = 10; p.heads_q = p.heads_kv = 1; p.head_dim = 8;
    p.dtype = FP_F32;
    p.q = q; p.k = k; p.v = v; p.o = o;
    p.block_table = table;
    p.block_table_stride = 1;
    p.page_size = 2147483647;
    p.num_pages = 1;
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "block_table") != NULL);
    for (int i = 0; i < 8; ++i) CHECK(o[i] == 7.0f);
    table[0] = 0;
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &p));
    for (int i = 0; i < 8; ++i) CHECK(o[i] > 0.49f && o[i] < 0.51f);
}

/* A caller built against 0.1 (struct_size ending at cu_seqlens_k, no paged
 * fields) is still served; the bytes after its struct are never read. */
static void test_old_struct_size(void) {
    attn_case c = {"v1size", 1, 17, 40, 2, 1, 64, FP_F32, 1, -1, -1, 0, 1, 0, 0};
    attn_host H;
    CHECK(attn_host_make(&c, &H, 11));
    double *o_ref = NULL, *lse_ref = NULL;
    CHECK(attn_reference(g_ctx->pool, &H, &o_ref, &lse_ref));
    const size_t v1 = offsetof(fp_attention_params, cu_seqlens_k) + sizeof(const int32_t *);
    unsigned char *buf = malloc(sizeof(fp_attention_params));
    CHECK(buf != NULL);
    memset(buf, 0x7B, sizeof(fp_attention_params)); /* garbage where the new fields would be */
    memcpy(buf, &H.p, v1);
    ((fp_attention_params *)buf)->struct_size = v1;
    CHECK_OK(fp_attention_forward(g_ctx, NULL, (const fp_attention_params *)buf));
    attn_err E = attn_compare(&H, H.o, H.lse, o_ref, lse_ref, 2e-5, 2e-5 + attn_eps(c.dtype));
    CHECK_MSG(E.bad == 0 && E.lse_bad == 0, "0.1 struct_size: %zu bad", E.bad);
    fp_ab_report rep;
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.min_samples = 3;
    cfg.max_samples = 3;
    cfg.max_time_s = 0.2;
    CHECK_OK(fp_attention_validate(g_ctx, NULL, (const fp_attention_params *)buf, &cfg, &rep));
    CHECK(rep.agreement.passed);
    ((fp_attention_params *)buf)->struct_size = v1 + 4;
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, (const fp_attention_params *)buf), FP_ERR_INVALID_ARGUMENT);
    /* A 0.1 program initializes its struct through the exported
     * fp_attention_params_default: the 0.1 layout only, nothing past it. */
    memset(buf, 0x7B, sizeof(fp_attention_params));
    (fp_attention_params_default)((fp_attention_params *)buf);
    CHECK(((fp_attention_params *)buf)->struct_size == v1 && ((fp_attention_params *)buf)->window_left == -1);
    for (size_t i = v1; i < sizeof(fp_attention_params); ++i) CHECK(buf[i] == 0x7B);
    /* any size a layout can have, from 0.1's up to this one's (core.h) */
    CHECK_STATUS(fp_attention_params_init((fp_attention_params *)buf, v1 + 4), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_attention_params_init((fp_attention_params *)buf, sizeof(fp_attention_params) + 8),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_attention_params_init((fp_attention_params *)buf, v1 + 8));
    CHECK_OK(fp_attention_params_init((fp_attention_params *)buf, sizeof(fp_attention_params)));
    CHECK(((fp_attention_params *)buf)->struct_size == sizeof(fp_attention_params));
    free(buf);
    free(o_ref);
    free(lse_ref);
    attn_host_free(&H);
}

/* Each bad argument: INVALID_ARGUMENT naming it, O and lse untouched. */
static void test_bad_input(void) {
    attn_case c = {"bad", 1, 16, 16, 4, 2, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0};
    attn_host H;
    CHECK(attn_host_make(&c, &H, 5));
    const size_t n_lse = (size_t)c.batch * c.hq * c.sq;
    struct {
        const char *what;   /* expected in the message */
        int field;
    } bad[] = {
        {"head_dim", 0}, {"head_dim", 1}, {"heads_q", 2}, {"seqlen_q", 3}, {"seqlen_k", 4},
        {"batch", 5}, {"window_left", 6}, {"window_right", 7}, {"window_right", 8},
        {"softmax_scale", 9}, {"q strides", 10}, {"o strides", 11}, {"'q'", 12}, {"'o'", 13},
        {"dtype", 14}, {"struct_size", 15}, {"'k'", 16}, {"heads_kv", 17}, {"k strides", 18},
        {"'v'", 19}, {"q strides", 20}, {"k strides", 21},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        fp_attention_params p = H.p;
        switch (bad[i].field) {
        case 0: p.head_dim = 60; break;
        case 1: p.head_dim = 512; break;
        case 2: p.heads_q = 3; break;
        case 3: p.seqlen_q = 0; break;
        case 4: p.seqlen_k = -5; break;
        case 5: p.batch = 0; break;
        case 6: p.window_left = -2; break;
        case 7: p.window_right = -7; break;
        case 8: p.causal = 1; p.window_right = 4; break;
        case 9: p.softmax_scale = -1.0f; break;
        case 10: p.q_head_stride = 32; break;          /* heads overlap */
        case 11: p.o_seq_stride = 64; break;           /* seq rows overlap heads */
        case 12: p.q = NULL; break;
        case 13: p.o = NULL; break;
        case 14: p.dtype = FP_FP8_E5M2; break;
        case 15: p.struct_size = 8; break;
        case 16: p.k = (const char *)p.k + 1; break;   /* misaligned */
        case 17: p.heads_kv = 0; break;
        case 18: p.k_batch_stride = -1; break;
        case 19: p.v = NULL; break;
        /* extents that overflow int64 (15 * stride): rejected, not wrapped */
        case 20: p.q_seq_stride = INT64_MAX / 2; break;
        case 21: p.k_seq_stride = (INT64_MAX / 16) * 2; break;
        }
        memset(H.o, 0x5A, H.o_bytes);
        memset(H.lse, 0x5A, n_lse * sizeof(float));
        for (int impl = 0; impl < 2; ++impl) {
            fp_status st = impl ? fp_attention_forward_baseline(g_ctx, NULL, &p)
                                : fp_attention_forward(g_ctx, NULL, &p);
            CHECK_MSG(st == FP_ERR_INVALID_ARGUMENT, "case %s: got %s", bad[i].what, fp_status_string(st));
            CHECK_MSG(strstr(fp_last_error(), bad[i].what) != NULL, "message '%s' does not name %s",
                      fp_last_error(), bad[i].what);
        }
        int untouched = 1;
        for (size_t b = 0; b < H.o_bytes; ++b) untouched &= ((unsigned char *)H.o)[b] == 0x5A;
        for (size_t b = 0; b < n_lse * sizeof(float); ++b) untouched &= ((unsigned char *)H.lse)[b] == 0x5A;
        CHECK_MSG(untouched, "case %s: outputs written on bad input", bad[i].what);
    }
    CHECK_STATUS(fp_attention_forward(NULL, NULL, &H.p), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_ab_report rep;
    CHECK_STATUS(fp_attention_validate(g_ctx, NULL, &H.p, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_attention_params p = H.p;
    p.heads_q = 5;
    CHECK_STATUS(fp_attention_validate(g_ctx, NULL, &p, NULL, &rep), FP_ERR_INVALID_ARGUMENT);
    attn_host_free(&H);
}

/* Varlen (cu_seqlens): each packed sequence must equal the same sequence run
 * on its own as a batch of one (the reference on a plain batch: independent
 * of the varlen offset logic). Lengths include 0 queries and 0 keys. */
static void test_varlen(fp_dtype dt, int causal, int wl) {
    enum { B = 5, SQ = 70, SK = 90, HQ = 4, HKV = 2, D = 64 };
    static const int nq[B] = {70, 5, 0, 17, 33}, nk[B] = {90, 40, 17, 0, 1};
    int32_t cu_q[B + 1] = {0}, cu_k[B + 1] = {0};
    for (int b = 0; b < B; ++b) {
        cu_q[b + 1] = cu_q[b] + nq[b];
        cu_k[b + 1] = cu_k[b] + nk[b];
    }
    const size_t elt = fp_dtype_size(dt);
    const int64_t q_ss = HQ * D + 8, kv_ss = HKV * D, o_ss = HQ * D; /* padded Q rows */
    const size_t nq_el = (size_t)cu_q[B] * q_ss, nk_el = (size_t)cu_k[B] * kv_ss, no_el = (size_t)cu_q[B] * o_ss;
    void *q = malloc(nq_el * elt), *k = malloc(nk_el * elt), *v = malloc(nk_el * elt), *o = malloc(no_el * elt);
    float *lse = malloc(sizeof(float) * B * HQ * SQ);
    uint64_t st = 99;
    for (size_t i = 0; i < nq_el; ++i) attn_store(q, i, dt, (float)fp_test_rand_uniform(&st, -1, 1));
    for (size_t i = 0; i < nk_el; ++i) attn_store(k, i, dt, (float)fp_test_rand_uniform(&st, -1, 1));
    for (size_t i = 0; i < nk_el; ++i) attn_store(v, i, dt, (float)fp_test_rand_uniform(&st, -1, 1));
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = B; p.seqlen_q = SQ; p.seqlen_k = SK; p.heads_q = HQ; p.heads_kv = HKV; p.head_dim = D;
    p.dtype = dt; p.causal = causal; p.window_left = wl;
    p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
    p.q_seq_stride = q_ss;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    for (int impl = 0; impl < 2; ++impl) {
        memset(o, 0xFF, no_el * elt);
        memset(lse, 0xFF, sizeof(float) * B * HQ * SQ);
        CHECK_OK(impl ? fp_attention_forward_baseline(g_ctx, NULL, &p) : fp_attention_forward(g_ctx, NULL, &p));
        size_t bad = 0;
        for (int b = 0; b < B; ++b) {
            double *o_ref = calloc((size_t)SQ * HQ * D, sizeof(double));
            double *lse_ref = calloc((size_t)HQ * SQ, sizeof(double));
            if (nq[b] > 0 && nk[b] > 0) {
                fp_attention_params one = p;
                one.batch = 1; one.seqlen_q = nq[b]; one.seqlen_k = nk[b];
                one.cu_seqlens_q = one.cu_seqlens_k = NULL;
                one.q = (const char *)q + (size_t)cu_q[b] * q_ss * elt;
                one.k = (const char *)k + (size_t)cu_k[b] * kv_ss * elt;
                one.v = (const char *)v + (size_t)cu_k[b] * kv_ss * elt;
                fp_attn_args a1;
                CHECK_OK(fp_attn_check(&one, 0, &a1));
                CHECK_OK(fp_attn_reference(NULL, &a1, o_ref, lse_ref));
            } else {
                for (int i = 0; i < HQ * SQ; ++i) lse_ref[i] = -INFINITY; /* no keys: O = 0 */
            }
            for (int i = 0; i < nq[b]; ++i)
                for (int h = 0; h < HQ; ++h) {
                    for (int x = 0; x < D; ++x) {
                        double ref = o_ref[((size_t)i * HQ + h) * D + x];
                        double got = attn_load(o, (size_t)(cu_q[b] + i) * o_ss + h * D + x, dt);
                        if (!(fabs(got - ref) <= 2e-5 + (attn_eps(dt) + 2e-5) * fabs(ref))) bad++;
                    }
                    double lr = lse_ref[(size_t)h * nq[b] + i], lg = lse[((size_t)b * HQ + h) * SQ + i];
                    if (isinf(lr) ? !(isinf(lg) && lg < 0) : !(fabs(lg - lr) <= 1e-4 + 1e-5 * fabs(lr))) bad++;
                }
            for (int i = nq[b]; i < SQ; ++i) /* rows past the sequence: lse untouched (NaN poison) */
                for (int h = 0; h < HQ; ++h) bad += !isnan(lse[((size_t)b * HQ + h) * SQ + i]);
            free(o_ref);
            free(lse_ref);
        }
        CHECK_MSG(bad == 0, "varlen %s causal %d wl %d (%s): %zu bad", fp_dtype_name(dt), causal, wl,
                  impl ? "naive" : "tiled", bad);
    }
    if (dt == FP_F32) { /* validate handles packed varlen outputs */
        fp_timing_config cfg;
        fp_timing_config_default(&cfg);
        cfg.warmup = 0;
        cfg.min_samples = 2;
        cfg.max_samples = 2;
        cfg.max_time_s = 0.1;
        fp_ab_report rep;
        CHECK_OK(fp_attention_validate(g_ctx, NULL, &p, &cfg, &rep));
        CHECK_MSG(rep.compared && rep.agreement.passed, "varlen validate: %zu mismatches", rep.agreement.mismatches);
    }
    /* bad varlen input: a clear status, nothing written */
    memset(o, 0x5A, no_el * elt);
    fp_attention_params bp = p;
    bp.cu_seqlens_k = NULL;
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &bp), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "cu_seqlens_k") != NULL);
    bp = p;
    bp.q_batch_stride = 1000;
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &bp), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "batch strides") != NULL);
    int32_t dec[B + 1] = {0, 10, 5, 20, 30, 40};
    bp = p;
    bp.cu_seqlens_k = dec;
    CHECK_STATUS(fp_attention_forward_baseline(g_ctx, NULL, &bp), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "cu_seqlens_k") != NULL);
    int32_t longq[B + 1] = {0, 71, 72, 73, 74, 75};
    bp = p;
    bp.cu_seqlens_q = longq;
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &bp), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "cu_seqlens_q") != NULL);
    int32_t lens[B] = {1, 2, 3, 4, 5};
    bp = p;
    bp.seqlens_k = lens;
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &bp), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "seqlens_k") != NULL);
    int untouched = 1;
    for (size_t i = 0; i < no_el * elt; ++i) untouched &= ((unsigned char *)o)[i] == 0x5A;
    CHECK_MSG(untouched, "varlen: outputs written on bad input");
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
}

/* Varlen strides are checked against the packed total cu_seqlens[batch],
 * not seqlen_q / seqlen_k (the per-sequence maximum): a head-major packed Q
 * whose rows do not overlap is accepted and gives the same O as the default
 * layout; an O whose rows of two sequences coincide is refused. On a CUDA
 * context (offsets in device memory) the sequence stride must be outermost. */
static void test_varlen_strides(void) {
    enum { SQ = 8, H = 2, D = 8, TQ = 2 };
    int32_t cu[2] = {0, TQ};
    float q_hm[H * SQ * D], q_sm[SQ * H * D], k[SQ * H * D], v[SQ * H * D], o1[SQ * H * D], o2[SQ * H * D];
    uint64_t st = 5;
    for (int i = 0; i < SQ * H * D; ++i) {
        k[i] = (float)fp_test_rand_uniform(&st, -1, 1);
        v[i] = (float)fp_test_rand_uniform(&st, -1, 1);
        q_sm[i] = (float)fp_test_rand_uniform(&st, -1, 1);
    }
    for (int i = 0; i < H * SQ * D; ++i) q_hm[i] = NAN;
    for (int s = 0; s < TQ; ++s) /* the same Q, head-major: row (s, h) at h * 16 + s * 8 */
        for (int h = 0; h < H; ++h)
            for (int x = 0; x < D; ++x) q_hm[h * 16 + s * 8 + x] = q_sm[(s * H + h) * D + x];
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = 1; p.seqlen_q = SQ; p.seqlen_k = SQ; p.heads_q = H; p.heads_kv = H; p.head_dim = D;
    p.dtype = FP_F32; p.q = q_sm; p.k = k; p.v = v; p.o = o1;
    p.cu_seqlens_q = p.cu_seqlens_k = cu;
    memset(o1, 0, sizeof o1);
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &p));
    fp_attention_params hm = p;
    hm.q = q_hm; hm.o = o2;
    hm.q_seq_stride = 8;
    hm.q_head_stride = 16;
    memset(o2, 0, sizeof o2);
    fp_status r = fp_attention_forward(g_ctx, NULL, &hm);
    CHECK_MSG(r == FP_OK, "head-major varlen Q refused: %s", fp_last_error());
    CHECK_MSG(r != FP_OK || memcmp(o1, o2, sizeof(float) * TQ * H * D) == 0, "head-major varlen Q: other O");
    fp_attn_args a; /* CUDA rule: offsets unreadable, the sequence must be outermost */
    CHECK_STATUS(fp_attn_check(&hm, 1, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "outermost") != NULL);
    CHECK_OK(fp_attn_check(&p, 1, &a));
    CHECK(a.total_k == 0);

    /* total_k: the rows of the packed K / V (varlen only, >= 0; on a CPU
     * context at least cu_seqlens_k[batch], which CUDA cannot check). On
     * CUDA it bounds K's and V's stride check: a head-major K (rows of one
     * head 8 apart, heads 16 apart: the sequence stride not the outermost),
     * refused without it, is checked against total_k rows instead. */
    fp_attention_params tk = p;
    tk.total_k = TQ;
    CHECK_OK(fp_attn_check(&tk, 0, &a));
    CHECK(a.total_k == TQ);
    CHECK_OK(fp_attn_check(&tk, 1, &a));
    tk.total_k = TQ - 1;
    CHECK_STATUS(fp_attn_check(&tk, 0, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "total_k") != NULL && strstr(fp_last_error(), "cu_seqlens_k") != NULL);
    CHECK_OK(fp_attn_check(&tk, 1, &a)); /* device offsets: not checkable */
    tk.total_k = -1;
    CHECK_STATUS(fp_attn_check(&tk, 0, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "total_k") != NULL);
    CHECK_STATUS(fp_attn_check(&tk, 1, &a), FP_ERR_INVALID_ARGUMENT);
    fp_attention_params dense = tk; /* total_k without cu_seqlens */
    dense.cu_seqlens_q = dense.cu_seqlens_k = NULL;
    dense.total_k = SQ;
    CHECK_STATUS(fp_attn_check(&dense, 0, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "total_k") != NULL && strstr(fp_last_error(), "varlen") != NULL);
    fp_attention_params khm = p; /* K head-major: seq stride 8, head stride 16 */
    khm.k_seq_stride = 8;
    khm.k_head_stride = 16;
    CHECK_STATUS(fp_attn_check(&khm, 1, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "outermost") != NULL);
    khm.total_k = TQ; /* 2 rows x 8 inside a head's 16: no overlap */
    CHECK_OK(fp_attn_check(&khm, 1, &a));
    khm.total_k = 3; /* 3 rows x 8 = 24 > 16: rows of heads 0 and 1 coincide */
    CHECK_STATUS(fp_attn_check(&khm, 1, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "k strides") != NULL);

    /* Two sequences of one query: O rows (s = 1, h = 0) and (s = 0, h = 1)
     * are the same memory with seq stride 8 = head stride 8. */
    int32_t cq[3] = {0, 1, 2}, ck[3] = {0, 2, 4};
    fp_attention_params ov = p;
    ov.batch = 2; ov.seqlen_q = 1; ov.seqlen_k = 2;
    ov.cu_seqlens_q = cq; ov.cu_seqlens_k = ck;
    ov.q = q_sm; ov.o = o2;
    ov.o_seq_stride = 8;
    ov.o_head_stride = 8;
    memset(o2, 0x5A, sizeof o2);
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &ov), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "o strides") != NULL && strstr(fp_last_error(), "overlap") != NULL);
    int untouched = 1;
    for (size_t i = 0; i < sizeof o2; ++i) untouched &= ((unsigned char *)o2)[i] == 0x5A;
    CHECK_MSG(untouched, "varlen overlapping O: written");
}

static void test_defaults_and_flops(void) {
    fp_attention_params p;
    fp_attention_params_default(&p);
    CHECK(p.struct_size == sizeof p);
    CHECK(p.window_left == -1 && p.window_right == -1 && p.causal == 0 && p.softmax_scale == 0.0f);
    p.batch = 2; p.seqlen_q = 3; p.seqlen_k = 5; p.heads_q = 4; p.head_dim = 8;
    CHECK_NEAR(fp_attention_flops(&p), 4.0 * 2 * 4 * 3 * 5 * 8, 0);
    p.causal = 1;
    CHECK_NEAR(fp_attention_flops(&p), 2.0 * 2 * 4 * 3 * 5 * 8, 0);
    CHECK(fp_attention_flops(NULL) == 0.0);
}

static void test_validate(void) {
    attn_case c = {"validate", 2, 64, 96, 4, 2, 64, FP_BF16, 1, -1, -1, 0, 0, 0, 0};
    attn_host H;
    CHECK(attn_host_make(&c, &H, 9));
    memset(H.o, 0x5A, H.o_bytes);
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.warmup = 1;
    cfg.min_samples = 3;
    cfg.max_samples = 5;
    cfg.max_time_s = 0.2;
    fp_ab_report rep;
    CHECK_OK(fp_attention_validate(g_ctx, NULL, &H.p, &cfg, &rep));
    CHECK(rep.compared == 1);
    CHECK_MSG(rep.agreement.passed, "validate: %zu mismatches, max abs err %g", rep.agreement.mismatches,
              rep.agreement.max_abs_err);
    CHECK(rep.baseline.samples >= 3 && rep.optimized.samples >= 3);
    CHECK(rep.achieved_tflops > 0.0);
    int untouched = 1;
    for (size_t b = 0; b < H.o_bytes; ++b) untouched &= ((unsigned char *)H.o)[b] == 0x5A;
    CHECK_MSG(untouched, "validate wrote params->o");
    attn_host_free(&H);
}

/* fp_attention_last_kernel: per thread, "cpu" after a CPU forward, "none"
 * after a call refused before any launch, NULL refused. */
static void *last_kernel_thread(void *arg) {
    fp_attention_kernel_info k;
    *(int *)arg = fp_attention_last_kernel(&k) == FP_OK && strcmp(k.kernel, "none") == 0;
    return NULL;
}
static void test_last_kernel(void) {
    attn_case c = {"last_kernel", 1, 16, 24, 2, 1, 64, FP_BF16, 1, -1, -1, 0, 0, 0, 0};
    attn_host H;
    CHECK(attn_host_make(&c, &H, 5));
    fp_attention_kernel_info k;
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &H.p));
    CHECK_OK(fp_attention_last_kernel(&k));
    CHECK(strcmp(k.kernel, "cpu") == 0 && k.version == 0 && k.num_splits == 1 && k.paged == 0 && !k.fallback[0]);
    int fresh = 0; /* another thread has its own record */
    pthread_t th;
    CHECK(pthread_create(&th, NULL, last_kernel_thread, &fresh) == 0);
    pthread_join(th, NULL);
    CHECK_MSG(fresh, "a new thread's record is not 'none'");
    fp_attention_params bad = H.p;
    bad.head_dim = 12;
    CHECK_STATUS(fp_attention_forward(g_ctx, NULL, &bad), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_attention_last_kernel(&k));
    CHECK(strcmp(k.kernel, "none") == 0);
    CHECK_STATUS(fp_attention_last_kernel(NULL), FP_ERR_INVALID_ARGUMENT);
    attn_host_free(&H);
}

int main(void) {
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, -1, &g_ctx));
    test_last_kernel();
    if (!g_ctx) return 1;
    test_defaults_and_flops();
    test_options();
    test_varlen(FP_F32, 0, -1);
    test_varlen_strides();
    test_varlen(FP_BF16, 1, -1);
    test_varlen(FP_F16, 1, 20);
    test_bad_input();
    test_paged();
    test_old_struct_size();
    test_paged_huge_page();
    test_validate();
    fp_context_destroy(g_ctx);
    TEST_END();
}
