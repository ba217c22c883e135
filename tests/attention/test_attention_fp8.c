/* fp8 e4m3 inputs with per-tensor descales (FlashAttention-3's fp8
 * forward) on a CPU context. Each case quantizes random f32 Q, K, V to e4m3
 * (stored = fp_f2e4m3(real / descale)), runs every CPU implementation on
 * the fp8 tensors, and compares with fp_attention_forward in f32 on the same
 * values dequantized by this test's own decoder (stored x descale, with
 * ldexp, not half.h): O must agree to one bf16 rounding, lse to f32
 * accuracy. Both runs use the same element layout (strides, padding, pages),
 * whose unused elements hold NaN (code 0x7f), and O's unwritten elements
 * must keep their poison. Also: the e4m3 conversions for all 256 codes,
 * refusals with nothing written, O's element size in the alignment rules
 * and the bytes counted, 0.3-sized params, validate. And every case again
 * as an fp8 KV cache (kv_dtype): bf16 / f32 Q over the same e4m3 K / V. */
#include <stddef.h>
#include <string.h>

#include "attention/attention_internal.h"
#include "fp_test.h"
#include "half.h" /* fp_f2e4m3 (the quantizer) and fp_e4m3_to_f32 under test */

static fp_context *g_ctx;

/* ------------------------------------------------------------------------ */
/*  e4m3 conversions                                                        */
/* ------------------------------------------------------------------------ */

/* The test's own decoder: S.EEEE.MMM, bias 7, no infinity, S.1111.111 NaN. */
static double e4m3_decode(uint8_t c) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return c & 0x80 ? -v : v;
}

static int same_value(double x, double y) {
    return (x != x && y != y) || (x == y && signbit(x) == signbit(y));
}

static void test_e4m3_conversions(void) {
    uint8_t codes[256];
    float table[256];
    for (int c = 0; c < 256; ++c) codes[c] = (uint8_t)c;
    fp_attn_cvt_row(codes, 0, FP_FP8_E4M3, 256, table); /* the CPU implementations' loader */
    int bad = 0;
    for (int c = 0; c < 256; ++c) {
        const double want = e4m3_decode((uint8_t)c);
        const float got = fp_e4m3_to_f32((uint8_t)c);
        bad += !same_value(got, want) || !same_value(table[c], want);
        bad += fp_f2e4m3(got) != c; /* exact round trip; NaN back to NaN with its sign */
    }
    CHECK_MSG(bad == 0, "e4m3 decode / round trip: %d codes wrong", bad);
    CHECK(e4m3_decode(0x7e) == 448.0 && e4m3_decode(0x01) == ldexp(1.0, -9) && e4m3_decode(0x08) == ldexp(1.0, -6));
    /* ties between neighbours go to the even code, just off a tie to the
     * nearer one; positive and negative */
    bad = 0;
    for (int c = 0; c < 0x7e; ++c) {
        const double lo = e4m3_decode((uint8_t)c), hi = e4m3_decode((uint8_t)(c + 1)), mid = 0.5 * (lo + hi);
        const int even = c % 2 == 0 ? c : c + 1;
        for (int s = 0; s < 2; ++s) {
            const double sg = s ? -1.0 : 1.0;
            const int sb = s ? 0x80 : 0;
            bad += fp_f2e4m3((float)(sg * mid)) != (even | sb);
            bad += fp_f2e4m3((float)(sg * (mid - (hi - lo) / 64))) != (c | sb);
            bad += fp_f2e4m3((float)(sg * (mid + (hi - lo) / 64))) != ((c + 1) | sb);
        }
    }
    CHECK_MSG(bad == 0, "e4m3 rounding: %d ties or near-ties wrong", bad);
    /* below half the smallest subnormal: 0; saturation at +-448 */
    CHECK(fp_f2e4m3((float)ldexp(1.0, -10)) == 0x00 && fp_f2e4m3((float)ldexp(1.01, -10)) == 0x01);
    CHECK(fp_f2e4m3(-0.0f) == 0x80 && fp_f2e4m3(1e-30f) == 0x00);
    CHECK(fp_f2e4m3(448.0f) == 0x7e && fp_f2e4m3(464.0f) == 0x7e && fp_f2e4m3(500.0f) == 0x7e);
    CHECK(fp_f2e4m3(1e30f) == 0x7e && fp_f2e4m3(INFINITY) == 0x7e && fp_f2e4m3(-INFINITY) == 0xfe);
    CHECK((fp_f2e4m3(NAN) & 0x7f) == 0x7f);
}

/* ------------------------------------------------------------------------ */
/*  Cases                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct fp8_case {
    const char *name;
    int batch, sq, sk, hq, hkv, d;
    int causal, wl, wr;
    int ragged;     /* seqlens_k: {sk, 17, 0, 3, ...} */
    int varlen;     /* cu_seqlens: batch 3, lengths below */
    int page;       /* paged K / V with this page size (0: dense) */
    int strided;    /* padded strides (not packed values), O in (b, h, s, d) */
    int nan_key;    /* one K element NaN (code 0x7f): its rows NaN */
    float qd, kd, vd;       /* descales (0 = 1) */
    float qa, ka, va;       /* real values uniform in (-amp, amp) */
} fp8_case;

/* Varlen: three sequences, one with a single key. */
static const int32_t VL_CU_Q[4] = {0, 40, 45, 62}, VL_CU_K[4] = {0, 70, 71, 100};

/* One tensor: an allocation of n elements, fp8 codes and the f32 twin. */
typedef struct tens {
    uint8_t *c;    /* codes */
    float *f;      /* twin: decode(code) x descale */
    size_t n;
} tens;

typedef struct fp8_host {
    fp_attention_params p8, p32; /* the fp8 call and its f32 twin */
    tens q, k, v;
    uint16_t *o8;  /* bf16 O */
    float *o32;    /* f32 O */
    unsigned char *written; /* per O element: 1 where a row is written */
    size_t n_o;    /* O elements in its allocation */
    float *lse8, *lse32;
    int32_t *seqlens, *table;
    double vmax;   /* max |V real| */
} fp8_host;

static size_t extent(int64_t bs, int64_t ss, int64_t hs, int nb, int ns, int nh, int d) {
    return (size_t)((nb - 1) * bs + (ns - 1) * ss + (nh - 1) * hs + d);
}

static int rand_int(uint64_t *s, int n) {
    int r = (int)fp_test_rand_uniform(s, 0.0, (double)n);
    return r < n ? r : n - 1;
}

/* Element (row, head) of tensor t at element offset off: d random values
 * quantized with descale ds (0 = 1) from (-amp, amp). */
static void fill_row(tens *t, size_t off, int d, float amp, float ds, uint64_t *s) {
    const float de = ds > 0.0f ? ds : 1.0f;
    for (int i = 0; i < d; ++i) t->c[off + i] = fp_f2e4m3((float)fp_test_rand_uniform(s, -amp, amp) / de);
}

static int tens_alloc(tens *t, size_t n) {
    t->n = n;
    t->c = malloc(n);
    t->f = malloc(n * sizeof(float));
    if (!t->c || !t->f) return 0;
    memset(t->c, 0x7f, n); /* NaN where no element lives */
    return 1;
}

static void tens_twin(tens *t, float ds, double *amax) {
    const double de = ds > 0.0f ? ds : 1.0;
    for (size_t i = 0; i < t->n; ++i) {
        t->f[i] = (float)(e4m3_decode(t->c[i]) * de);
        if (amax && t->c[i] != 0x7f && t->c[i] != 0xff && fabs(t->f[i]) > *amax) *amax = fabs(t->f[i]);
    }
}

static void host_free(fp8_host *H) {
    free(H->q.c); free(H->q.f); free(H->k.c); free(H->k.f); free(H->v.c); free(H->v.f);
    free(H->o8); free(H->o32); free(H->written); free(H->lse8); free(H->lse32);
    free(H->seqlens); free(H->table);
}

/* Query rows and keys of sequence b. */
static void seq_lens(const fp8_case *c, const fp8_host *H, int b, int *sq, int *L) {
    if (c->varlen) {
        *sq = VL_CU_Q[b + 1] - VL_CU_Q[b];
        *L = VL_CU_K[b + 1] - VL_CU_K[b];
    } else {
        *sq = c->sq;
        *L = H->seqlens ? H->seqlens[b] : c->sk;
    }
}

static int host_make(const fp8_case *c, fp8_host *H, uint64_t seed) {
    memset(H, 0, sizeof *H);
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7;
    fp_attention_params *p = &H->p8;
    fp_attention_params_default(p);
    const int d = c->d;
    const int B = c->varlen ? 3 : c->batch;
    p->batch = B; p->seqlen_q = c->sq; p->seqlen_k = c->sk;
    p->heads_q = c->hq; p->heads_kv = c->hkv; p->head_dim = d;
    p->causal = c->causal; p->window_left = c->wl; p->window_right = c->wr;
    p->dtype = FP_FP8_E4M3;
    p->q_descale = c->qd; p->k_descale = c->kd; p->v_descale = c->vd;
    if (c->ragged) {
        H->seqlens = malloc(sizeof(int32_t) * (size_t)B);
        if (!H->seqlens) return 0;
        static const int pat[4] = {-1, 17, 0, 3};
        for (int b = 0; b < B; ++b) H->seqlens[b] = pat[b % 4] < 0 || pat[b % 4] > c->sk ? c->sk : pat[b % 4];
        p->seqlens_k = H->seqlens;
    }
    /* extents along (batch, seq) of Q / O and of K / V */
    const int nbq = c->varlen ? 1 : B, nsq = c->varlen ? VL_CU_Q[3] : c->sq;
    const int nbk = c->varlen ? 1 : B, nsk = c->varlen ? VL_CU_K[3] : c->sk;
    const int64_t pad = c->strided ? 8 : 0;
    /* Q, K, V strides (padded: not the packed values) */
    const int64_t q_hs = d + pad, q_ss = c->hq * q_hs + 2 * pad, q_bs = c->varlen ? 0 : nsq * q_ss + 4 * pad;
    const int64_t k_hs = d + pad, k_ss = c->hkv * k_hs + 2 * pad;
    int64_t k_bs = c->varlen ? 0 : nsk * k_ss + 4 * pad;
    int kv_nb = nbk, kv_ns = nsk;
    int per_seq = 0, num_pages = 0;
    if (c->page) { /* pools of pages [num_pages, page, hkv, d], pages shuffled, 2 spare */
        per_seq = (c->sk + c->page - 1) / c->page;
        num_pages = B * per_seq + 2;
        k_bs = (int64_t)c->page * k_ss + pad;
        kv_nb = num_pages;
        kv_ns = c->page;
        H->table = malloc(sizeof(int32_t) * (size_t)B * per_seq);
        int32_t *perm = malloc(sizeof(int32_t) * (size_t)num_pages);
        if (!H->table || !perm) { free(perm); return 0; }
        for (int i = 0; i < num_pages; ++i) perm[i] = i;
        for (int i = num_pages - 1; i > 0; --i) {
            const int j = rand_int(&s, i + 1);
            const int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
        for (int i = 0; i < B * per_seq; ++i) H->table[i] = perm[i];
        free(perm);
        p->block_table = H->table;
        p->block_table_stride = per_seq;
        p->page_size = c->page;
        p->num_pages = num_pages;
    }
    if (c->varlen) {
        p->cu_seqlens_q = VL_CU_Q;
        p->cu_seqlens_k = VL_CU_K;
    }
    p->q_head_stride = q_hs; p->q_seq_stride = q_ss; p->q_batch_stride = q_bs;
    p->k_head_stride = p->v_head_stride = k_hs;
    p->k_seq_stride = p->v_seq_stride = k_ss;
    p->k_batch_stride = p->v_batch_stride = k_bs;
    if (!tens_alloc(&H->q, extent(q_bs, q_ss, q_hs, nbq, nsq, c->hq, d)) ||
        !tens_alloc(&H->k, extent(k_bs, k_ss, k_hs, kv_nb, kv_ns, c->hkv, d)) ||
        !tens_alloc(&H->v, extent(k_bs, k_ss, k_hs, kv_nb, kv_ns, c->hkv, d)))
        return 0;
    /* O: (b, h, s, d) padded when strided, else packed [b, s, h, d] */
    int64_t o_hs = d, o_ss = (int64_t)c->hq * d, o_bs = c->varlen ? 0 : (int64_t)nsq * c->hq * d;
    if (c->strided) {
        o_ss = d;
        o_hs = (int64_t)nsq * d + 8;
        o_bs = c->varlen ? 0 : c->hq * o_hs + 8;
    }
    p->o_head_stride = o_hs; p->o_seq_stride = o_ss; p->o_batch_stride = o_bs;
    H->n_o = extent(o_bs, o_ss, o_hs, nbq, nsq, c->hq, d);
    H->o8 = malloc(H->n_o * sizeof(uint16_t));
    H->o32 = malloc(H->n_o * sizeof(float));
    H->written = calloc(H->n_o, 1);
    const size_t n_lse = (size_t)B * c->hq * c->sq;
    H->lse8 = malloc(n_lse * sizeof(float));
    H->lse32 = malloc(n_lse * sizeof(float));
    if (!H->o8 || !H->o32 || !H->written || !H->lse8 || !H->lse32) return 0;
    p->lse = H->lse8;
    /* values: every row a sequence uses, nothing else */
    for (int b = 0; b < B; ++b) {
        int sq, L;
        seq_lens(c, H, b, &sq, &L);
        const int64_t q0 = c->varlen ? VL_CU_Q[b] * q_ss : b * q_bs;
        const int64_t o0 = c->varlen ? VL_CU_Q[b] * o_ss : b * o_bs;
        for (int i = 0; i < sq; ++i)
            for (int h = 0; h < c->hq; ++h) {
                fill_row(&H->q, (size_t)(q0 + i * q_ss + h * q_hs), d, c->qa, c->qd, &s);
                memset(H->written + o0 + i * o_ss + h * o_hs, 1, (size_t)d);
            }
        for (int j = 0; j < L; ++j) {
            int64_t row;
            if (c->page) row = (int64_t)H->table[b * per_seq + j / c->page] * k_bs + (int64_t)(j % c->page) * k_ss;
            else if (c->varlen) row = (int64_t)(VL_CU_K[b] + j) * k_ss;
            else row = b * k_bs + j * k_ss;
            for (int h = 0; h < c->hkv; ++h) {
                fill_row(&H->k, (size_t)(row + h * k_hs), d, c->ka, c->kd, &s);
                fill_row(&H->v, (size_t)(row + h * k_hs), d, c->va, c->vd, &s);
            }
        }
    }
    if (c->nan_key) H->k.c[(size_t)(3 * k_ss + 5)] = 0x7f; /* key 3 of sequence 0 (dense), head 0 */
    tens_twin(&H->q, c->qd, NULL);
    tens_twin(&H->k, c->kd, NULL);
    tens_twin(&H->v, c->vd, &H->vmax);
    p->q = H->q.c; p->k = H->k.c; p->v = H->v.c; p->o = H->o8;
    H->p32 = *p;
    H->p32.dtype = FP_F32;
    H->p32.q_descale = H->p32.k_descale = H->p32.v_descale = 0.0f;
    H->p32.q = H->q.f; H->p32.k = H->k.f; H->p32.v = H->v.f; H->p32.o = H->o32;
    H->p32.lse = H->lse32;
    return 1;
}

/* ------------------------------------------------------------------------ */
/*  Comparison                                                              */
/* ------------------------------------------------------------------------ */

/* bf16 O (o8, lse8) against the f32 twin's (o32, lse32): written elements
 * to one bf16 rounding (2^-8 relative: two of its half-ulp bounds) plus
 * f32 accumulation differences (2e-5 x max |V|), NaN only against NaN;
 * unwritten elements must still hold the poison 0xA5A5. lse within 2e-5
 * (f32 sums: the implementations differ by ~1e-6). */
static void compare(const fp8_case *c, const fp8_host *H, const char *impl) {
    const double rtol = 1.0 / 256, atol = 2e-5 * H->vmax;
    size_t bad = 0, first = SIZE_MAX, poison = 0;
    double got_first = 0, ref_first = 0;
    for (size_t i = 0; i < H->n_o; ++i) {
        if (!H->written[i]) {
            poison += H->o8[i] != 0xA5A5;
            continue;
        }
        const double got = fp_bf16_to_f32(H->o8[i]), ref = H->o32[i];
        const double err = fabs(got - ref);
        const int ok = ref != ref ? got != got : err <= atol + rtol * fabs(ref);
        if (!ok && bad++ == 0) { first = i; got_first = got; ref_first = ref; }
    }
    size_t lse_bad = 0;
    for (int b = 0; b < H->p8.batch; ++b) {
        int sq, L;
        seq_lens(c, H, b, &sq, &L);
        for (int h = 0; h < c->hq; ++h)
            for (int i = 0; i < sq; ++i) {
                const size_t x = ((size_t)b * c->hq + h) * c->sq + i;
                const double g = H->lse8[x], r = H->lse32[x];
                if (r != r || isinf(r)) { lse_bad += !same_value(g, r); continue; }
                lse_bad += !(fabs(g - r) <= 2e-5);
            }
    }
    CHECK_MSG(bad == 0 && poison == 0 && lse_bad == 0,
              "%s/%s: %zu of O bad (first at %zu: got %.8g want %.8g; tol %.3g + %.3g |ref|), %zu poison "
              "elements overwritten, %zu lse bad",
              c->name, impl, bad, first, got_first, ref_first, atol, rtol, poison, lse_bad);
}

typedef fp_status (*impl_fn)(fp_thread_pool *, const fp_attn_args *);

static void run_case(const fp8_case *c, uint64_t seed) {
    fp8_host H;
    if (!host_make(c, &H, seed)) {
        CHECK_MSG(0, "%s: host allocation", c->name);
        host_free(&H);
        return;
    }
    /* the f32 twin through the public op: the reference of every fp8 run */
    memset(H.o32, 0xA5, H.n_o * sizeof(float));
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &H.p32));
    /* the oracle on both: fp8 decoded by half.h, descales folded */
    fp_attn_args a8, a32;
    CHECK_OK(fp_attn_check(&H.p8, 0, &a8));
    CHECK_OK(fp_attn_check(&H.p32, 0, &a32));
    CHECK(a8.o_dtype == FP_BF16 && a8.o_scale == (c->vd > 0 ? c->vd : 1.0f) && a32.o_dtype == FP_F32 &&
          a32.o_scale == 1.0f);
    const size_t n_ref = (size_t)a8.batch * a8.seqlen_q * a8.heads_q * a8.head_dim;
    const size_t n_lse = (size_t)a8.batch * a8.heads_q * a8.seqlen_q;
    double *r8 = calloc(n_ref, sizeof(double)), *r32 = calloc(n_ref, sizeof(double));
    double *l8 = calloc(n_lse, sizeof(double)), *l32 = calloc(n_lse, sizeof(double));
    CHECK(r8 && r32 && l8 && l32);
    if (r8 && r32 && l8 && l32) {
        CHECK_OK(fp_attn_reference(g_ctx->pool, &a8, r8, l8));
        CHECK_OK(fp_attn_reference(g_ctx->pool, &a32, r32, l32));
        size_t bad = 0;
        for (size_t i = 0; i < n_ref; ++i)
            bad += r32[i] != r32[i] ? r8[i] == r8[i] : !(fabs(r8[i] - r32[i]) <= 1e-5 * H.vmax + 1e-6 * fabs(r32[i]));
        for (size_t i = 0; i < n_lse; ++i)
            bad += l32[i] != l32[i] || isinf(l32[i]) ? !same_value(l8[i], l32[i]) : !(fabs(l8[i] - l32[i]) <= 1e-5);
        CHECK_MSG(bad == 0, "%s: fp_attn_reference on fp8 and on the f32 twin differ in %zu values", c->name, bad);
    }
    free(r8); free(r32); free(l8); free(l32);

    struct { const char *name; impl_fn fn; int api; } impls[] = {
        {"fp_attention_forward", NULL, 1},
        {"fp_attention_forward_baseline", NULL, 2},
        {"tiled_portable", fp_attn_cpu_tiled_portable, 0},
        {"naive_portable", fp_attn_cpu_naive_portable, 0},
        {"flash_blas", fp_attn_cpu_flash_blas, 0},
        {"naive_blas", fp_attn_cpu_naive_blas, 0},
    };
    for (size_t i = 0; i < sizeof impls / sizeof impls[0]; ++i) {
        if (!impls[i].api && impls[i].fn == fp_attn_cpu_flash_blas && !fp_attn_cpu_have_blas()) continue;
        if (!impls[i].api && impls[i].fn == fp_attn_cpu_naive_blas && !fp_attn_cpu_have_blas()) continue;
        memset(H.o8, 0xA5, H.n_o * sizeof(uint16_t));
        memset(H.lse8, 0xA5, n_lse * sizeof(float));
        fp_status st;
        if (impls[i].api == 1) st = fp_attention_forward(g_ctx, NULL, &H.p8);
        else if (impls[i].api == 2) st = fp_attention_forward_baseline(g_ctx, NULL, &H.p8);
        else st = impls[i].fn(g_ctx->pool, &a8);
        CHECK_MSG(st == FP_OK, "%s/%s: %s (%s)", c->name, impls[i].name, fp_status_string(st), fp_last_error());
        if (st == FP_OK) compare(c, &H, impls[i].name);
    }
    host_free(&H);
}

/* The fp8 KV cache form of a case (kv_dtype FP_FP8_E4M3): Q in bf16 (the
 * twin's values rounded to bf16, unused elements NaN), K / V the case's e4m3
 * codes with their descales, O bf16; the reference is the f32 run on those
 * bf16 Q values and the K / V twins. Every CPU implementation, then the
 * same with an f32 Q (O f32, to f32 accumulation). */
static void run_case_kv8(const fp8_case *c, uint64_t seed) {
    fp8_host H;
    uint16_t *q16 = NULL;
    float *q32 = NULL, *o32b = NULL;
    if (!host_make(c, &H, seed) || !(q16 = malloc(H.q.n * 2)) || !(q32 = malloc(H.q.n * 4)) ||
        !(o32b = malloc(H.n_o * 4))) {
        CHECK_MSG(0, "%s (kv8): host allocation", c->name);
        goto out;
    }
    for (size_t i = 0; i < H.q.n; ++i) {
        q16[i] = fp_f32_to_bf16(H.q.f[i]);
        q32[i] = fp_bf16_to_f32(q16[i]);
    }
    fp_attention_params pk = H.p8;
    pk.dtype = FP_BF16;
    pk.kv_dtype = FP_FP8_E4M3;
    pk.q_descale = 0.0f;
    pk.q = q16;
    H.p32.q = q32;
    memset(H.o32, 0xA5, H.n_o * sizeof(float));
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &H.p32));
    fp_attn_args a;
    CHECK_OK(fp_attn_check(&pk, 0, &a));
    CHECK(a.kv_fp8_cache && a.kv_dtype == FP_FP8_E4M3 && a.o_dtype == FP_BF16 &&
          a.o_scale == (c->vd > 0 ? c->vd : 1.0f));
    const size_t n_lse = (size_t)a.batch * a.heads_q * a.seqlen_q;
    struct { const char *name; impl_fn fn; int api; } impls[] = {
        {"kv8 fp_attention_forward", NULL, 1},
        {"kv8 fp_attention_forward_baseline", NULL, 2},
        {"kv8 tiled_portable", fp_attn_cpu_tiled_portable, 0},
        {"kv8 naive_portable", fp_attn_cpu_naive_portable, 0},
        {"kv8 flash_blas", fp_attn_cpu_flash_blas, 0},
        {"kv8 naive_blas", fp_attn_cpu_naive_blas, 0},
    };
    for (size_t i = 0; i < sizeof impls / sizeof impls[0]; ++i) {
        if (!impls[i].api && (impls[i].fn == fp_attn_cpu_flash_blas || impls[i].fn == fp_attn_cpu_naive_blas) &&
            !fp_attn_cpu_have_blas())
            continue;
        memset(H.o8, 0xA5, H.n_o * sizeof(uint16_t));
        memset(H.lse8, 0xA5, n_lse * sizeof(float));
        fp_status st;
        if (impls[i].api == 1) st = fp_attention_forward(g_ctx, NULL, &pk);
        else if (impls[i].api == 2) st = fp_attention_forward_baseline(g_ctx, NULL, &pk);
        else st = impls[i].fn(g_ctx->pool, &a);
        CHECK_MSG(st == FP_OK, "%s/%s: %s (%s)", c->name, impls[i].name, fp_status_string(st), fp_last_error());
        if (st == FP_OK) compare(c, &H, impls[i].name);
    }
    /* f32 Q over the same fp8 cache: O f32, against the f32 run */
    fp_attention_params pf = pk;
    pf.dtype = FP_F32;
    pf.q = q32;
    pf.o = o32b;
    memset(o32b, 0xA5, H.n_o * sizeof(float));
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &pf));
    size_t bad = 0;
    for (size_t i = 0; i < H.n_o; ++i) {
        if (!H.written[i]) {
            uint32_t u;
            memcpy(&u, &o32b[i], 4);
            bad += u != 0xA5A5A5A5u;
            continue;
        }
        const double got = o32b[i], ref = H.o32[i];
        bad += ref != ref ? got == got : !(fabs(got - ref) <= 2e-5 * H.vmax + 1e-6 * fabs(ref));
    }
    CHECK_MSG(bad == 0, "%s: f32 Q over the fp8 cache: %zu elements differ from the f32 run", c->name, bad);
out:
    free(q16);
    free(q32);
    free(o32b);
    host_free(&H);
}

static void test_cases(void) {
    /* name, b, sq, sk, hq, hkv, d, causal, wl, wr, ragged, varlen, page, strided, nan,
     * qd, kd, vd, q amp, k amp, v amp */
    static const fp8_case cases[] = {
        {"plain d64", 2, 40, 70, 4, 4, 64, 0, -1, -1, 0, 0, 0, 0, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
        {"causal gqa d128", 1, 100, 130, 8, 2, 128, 1, -1, -1, 0, 0, 0, 0, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
        {"window strided d40", 2, 33, 50, 3, 1, 40, 0, 9, 4, 0, 0, 0, 1, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
        {"ragged decode gqa d128", 4, 1, 300, 8, 2, 128, 0, -1, -1, 1, 0, 0, 0, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
        {"varlen causal d64", 3, 40, 70, 4, 2, 64, 1, -1, -1, 0, 1, 0, 0, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
        {"varlen window strided d40", 3, 40, 70, 2, 1, 40, 0, 12, 0, 0, 1, 0, 1, 0, 0.03f, 0.01f, 0.25f, 3, 1, 2},
        {"paged ragged gqa d128", 3, 20, 90, 4, 2, 128, 1, -1, -1, 1, 0, 16, 0, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
        {"paged odd page strided d64", 2, 9, 61, 2, 2, 64, 0, 20, -1, 0, 0, 7, 1, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
        {"default descales d64", 2, 30, 45, 2, 1, 64, 0, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2},
        /* stored values past 448 saturate; a NaN key makes its rows NaN */
        {"saturating nan d40", 1, 24, 40, 2, 1, 40, 0, -1, -1, 0, 0, 0, 0, 1, 0.01f, 0.004f, 0.05f, 6, 2, 30},
        /* several query tiles and key tiles of the BLIS path (its K / V cache) */
        {"long gqa d128", 1, 200, 600, 2, 1, 128, 1, -1, -1, 0, 0, 0, 0, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
        {"long window d64", 1, 150, 700, 2, 2, 64, 0, 300, 40, 0, 0, 0, 0, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i], 100 + i);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case_kv8(&cases[i], 200 + i);
}

/* ------------------------------------------------------------------------ */
/*  Refusals, alignment, bytes, old struct sizes, validate                  */
/* ------------------------------------------------------------------------ */

static const fp8_case SMALL = {"small", 1, 16, 24, 4, 2, 64, 0, -1, -1, 0, 0, 0, 0, 0, 0.02f, 0.05f, 0.1f, 2, 1, 1};

static void test_refusals(void) {
    fp8_host H;
    CHECK(host_make(&SMALL, &H, 9));
    const size_t n_lse = (size_t)SMALL.batch * SMALL.hq * SMALL.sq;
    struct { const char *what; int field; fp_status want; } bad[] = {
        {"dtype", 0, FP_ERR_INVALID_ARGUMENT},      {"q_descale", 1, FP_ERR_INVALID_ARGUMENT},
        {"k_descale", 2, FP_ERR_INVALID_ARGUMENT},  {"v_descale", 3, FP_ERR_INVALID_ARGUMENT},
        {"q_descale", 4, FP_ERR_INVALID_ARGUMENT},  {"v_descale", 5, FP_ERR_INVALID_ARGUMENT},
        {"k_descale", 6, FP_ERR_INVALID_ARGUMENT},  {"'o'", 7, FP_ERR_INVALID_ARGUMENT},
        {"q_descale", 8, FP_ERR_INVALID_ARGUMENT},  {"k_descale", 9, FP_ERR_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        fp_attention_params p = H.p8;
        switch (bad[i].field) {
        case 0: p.dtype = FP_FP8_E5M2; break;
        case 1: p.q_descale = -0.5f; break;
        case 2: p.k_descale = NAN; break;
        case 3: p.v_descale = INFINITY; break;
        case 4: p = H.p32; p.dtype = FP_F32; p.q_descale = 2.0f; break;  /* f32 data */
        case 5: p = H.p32; p.v_descale = 0.5f; break;
        case 6: p.k_descale = -INFINITY; break;
        case 7: p.o = (char *)p.o + 1; break; /* O is bf16: 2-byte aligned, even with 1-byte inputs */
        case 8: p.q_descale = 1e-30f; p.k_descale = 1e-30f; break; /* the product underflows */
        case 9: p.q_descale = 1e30f; p.k_descale = 1e30f; break;   /* and overflows */
        }
        memset(H.o8, 0x5A, H.n_o * sizeof(uint16_t));
        memset(H.o32, 0x5A, H.n_o * sizeof(float));
        memset(H.lse8, 0x5A, n_lse * sizeof(float));
        memset(H.lse32, 0x5A, n_lse * sizeof(float));
        for (int impl = 0; impl < 2; ++impl) {
            const fp_status st = impl ? fp_attention_forward_baseline(g_ctx, NULL, &p) : fp_attention_forward(g_ctx, NULL, &p);
            CHECK_MSG(st == bad[i].want, "case %s (%d): got %s", bad[i].what, bad[i].field, fp_status_string(st));
            CHECK_MSG(strstr(fp_last_error(), bad[i].what) != NULL, "message '%s' does not name %s", fp_last_error(),
                      bad[i].what);
        }
        fp_ab_report rep;
        CHECK_STATUS(fp_attention_validate(g_ctx, NULL, &p, NULL, &rep), bad[i].want);
        int untouched = 1;
        for (size_t b = 0; b < H.n_o * sizeof(uint16_t); ++b) untouched &= ((unsigned char *)H.o8)[b] == 0x5A;
        for (size_t b = 0; b < H.n_o * sizeof(float); ++b) untouched &= ((unsigned char *)H.o32)[b] == 0x5A;
        for (size_t b = 0; b < n_lse * sizeof(float); ++b)
            untouched &= ((unsigned char *)H.lse8)[b] == 0x5A && ((unsigned char *)H.lse32)[b] == 0x5A;
        CHECK_MSG(untouched, "case %s (%d): outputs written on bad input", bad[i].what, bad[i].field);
    }
    /* descales 0 or 1 with another dtype: accepted, the result unchanged bit for bit */
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &H.p32));
    float *first = malloc(H.n_o * sizeof(float));
    CHECK(first != NULL);
    if (first) {
        memcpy(first, H.o32, H.n_o * sizeof(float));
        fp_attention_params ones = H.p32;
        ones.q_descale = ones.k_descale = ones.v_descale = 1.0f;
        CHECK_OK(fp_attention_forward(g_ctx, NULL, &ones));
        CHECK(memcmp(first, H.o32, H.n_o * sizeof(float)) == 0);
        free(first);
    }
    host_free(&H);
}

/* The CUDA rules (fp_attn_check with cuda = 1: no GPU needed): 16-byte
 * aligned pointers and row strides in multiples of 16 bytes, i.e. 16 fp8
 * elements for Q, K, V and 8 bf16 elements for O; the bytes an fp8 call
 * moves: 1 per element of Q, K, V, 2 per element of O. */
static void test_alignment_and_bytes(void) {
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = 2; p.seqlen_q = 32; p.seqlen_k = 48; p.heads_q = 4; p.heads_kv = 2; p.head_dim = 128;
    p.dtype = FP_FP8_E4M3;
    p.q = (const void *)(uintptr_t)0x10000; p.k = (const void *)(uintptr_t)0x20000;
    p.v = (const void *)(uintptr_t)0x30000; p.o = (void *)(uintptr_t)0x40000;
    fp_attn_args a;
    CHECK_OK(fp_attn_check(&p, 1, &a));
    const double q_o = 2.0 * 32 * 4 * 128, kv = 2.0 * 48 * 2 * 128;
    CHECK_NEAR(fp_attn_bytes(&a), q_o * (1 + 2) + 2 * kv, 0.5);
    fp_attention_params t = p;
    t.q_head_stride = 136; /* 136 bytes of fp8: not a multiple of 16 */
    t.q_seq_stride = 4 * 144;
    t.q_batch_stride = 32 * 4 * 144;
    CHECK_STATUS(fp_attn_check(&t, 1, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "q strides") != NULL && strstr(fp_last_error(), "16 elements") != NULL);
    t.q_head_stride = 144; /* 144 bytes */
    CHECK_OK(fp_attn_check(&t, 1, &a));
    t = p;
    t.o_head_stride = 136; /* 272 bytes of bf16: fine */
    t.o_seq_stride = 4 * 136;
    t.o_batch_stride = 32 * 4 * 136;
    CHECK_OK(fp_attn_check(&t, 1, &a));
    t.o_head_stride = 132; /* 264 bytes */
    t.o_seq_stride = 4 * 132;
    t.o_batch_stride = 32 * 4 * 132;
    CHECK_STATUS(fp_attn_check(&t, 1, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "o strides") != NULL && strstr(fp_last_error(), "8 elements") != NULL);
    t = p;
    t.o = (void *)(uintptr_t)0x40008;
    CHECK_STATUS(fp_attn_check(&t, 1, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "'o'") != NULL);
    t = p;
    t.k = (const void *)(uintptr_t)0x20001; /* CPU: fp8 needs 1-byte alignment only */
    CHECK_OK(fp_attn_check(&t, 0, &a));
    CHECK_STATUS(fp_attn_check(&t, 1, &a), FP_ERR_INVALID_ARGUMENT);
}

/* A caller built against 0.3 (struct_size ending at total_k) with fp8
 * inputs: served, the descales reading as 1; the bytes past its struct
 * (garbage here, which as descales would be refused) never read. */
static void test_struct_size_0_3(void) {
    fp8_host H;
    CHECK(host_make(&SMALL, &H, 21));
    const size_t v03 = offsetof(fp_attention_params, q_descale);
    CHECK(v03 == offsetof(fp_attention_params, total_k) + sizeof(int64_t) && v03 < sizeof(fp_attention_params));
    fp_attention_params ones = H.p8;
    ones.q_descale = ones.k_descale = ones.v_descale = 1.0f;
    memset(H.o8, 0xA5, H.n_o * sizeof(uint16_t));
    CHECK_OK(fp_attention_forward(g_ctx, NULL, &ones));
    uint16_t *want = malloc(H.n_o * sizeof(uint16_t));
    unsigned char *buf = malloc(sizeof(fp_attention_params));
    CHECK(want && buf);
    if (want && buf) {
        memcpy(want, H.o8, H.n_o * sizeof(uint16_t));
        memset(buf, 0x7B, sizeof(fp_attention_params));
        memcpy(buf, &H.p8, v03);
        ((fp_attention_params *)buf)->struct_size = v03;
        memset(H.o8, 0xA5, H.n_o * sizeof(uint16_t));
        CHECK_OK(fp_attention_forward(g_ctx, NULL, (const fp_attention_params *)buf));
        CHECK_MSG(memcmp(want, H.o8, H.n_o * sizeof(uint16_t)) == 0, "0.3-sized fp8 params: O differs from descales 1");
        CHECK_OK(fp_attention_forward_baseline(g_ctx, NULL, (const fp_attention_params *)buf));
        /* and the init of a 0.3 caller writes nothing past its struct */
        memset(buf, 0x7B, sizeof(fp_attention_params));
        CHECK_OK(fp_attention_params_init((fp_attention_params *)buf, v03));
        int untouched = 1;
        for (size_t i = v03; i < sizeof(fp_attention_params); ++i) untouched &= buf[i] == 0x7B;
        CHECK(untouched);
        /* with the current size the fields are there and start at 0 */
        CHECK_OK(fp_attention_params_init((fp_attention_params *)buf, sizeof(fp_attention_params)));
        const fp_attention_params *np = (const fp_attention_params *)buf;
        CHECK(np->q_descale == 0.0f && np->k_descale == 0.0f && np->v_descale == 0.0f);
    }
    free(want);
    free(buf);
    host_free(&H);
}

/* kv_dtype's rules: 0 or dtype mean dtype; FP_FP8_E4M3 under f32 / f16 /
 * bf16 Q is the fp8 cache (q_descale then 0 / 1); anything else refused,
 * naming kv_dtype, nothing written. A 0.4-sized struct (ending at
 * v_descale) reads kv_dtype as 0; the bytes counted use K / V's size. */
static void test_kv8_args(void) {
    fp8_host H;
    CHECK(host_make(&SMALL, &H, 45));
    fp_attention_params p = H.p32; /* f32 Q, K, V */
    fp_attn_args a;
    p.kv_dtype = FP_F32;
    CHECK_OK(fp_attn_check(&p, 0, &a));
    CHECK(!a.kv_fp8_cache && a.kv_dtype == FP_F32);
    fp_attention_params f8 = H.p8; /* all fp8: kv_dtype fp8 is "the same" */
    f8.kv_dtype = FP_FP8_E4M3;
    CHECK_OK(fp_attn_check(&f8, 0, &a));
    CHECK(!a.kv_fp8_cache && a.kv_dtype == FP_FP8_E4M3 && a.dtype == FP_FP8_E4M3);
    struct { const char *what; fp_dtype dt, kv; float qd; } bad[] = {
        {"kv_dtype", FP_BF16, FP_F16, 0},        {"kv_dtype", FP_BF16, FP_FP8_E5M2, 0},
        {"kv_dtype", FP_BF16, (fp_dtype)99, 0},  {"kv_dtype", FP_FP8_E4M3, FP_BF16, 0},
        {"q_descale", FP_BF16, FP_FP8_E4M3, 2.0f},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        fp_attention_params t = H.p8;
        t.dtype = bad[i].dt;
        t.kv_dtype = bad[i].kv;
        t.q_descale = bad[i].qd;
        memset(H.o8, 0x5A, H.n_o * sizeof(uint16_t));
        const fp_status st = fp_attention_forward(g_ctx, NULL, &t);
        int untouched = 1;
        for (size_t b = 0; b < H.n_o * sizeof(uint16_t); ++b) untouched &= ((unsigned char *)H.o8)[b] == 0x5A;
        CHECK_MSG(st == FP_ERR_INVALID_ARGUMENT && strstr(fp_last_error(), bad[i].what) && untouched,
                  "kv_dtype case %zu: %s (%s), O %s", i, fp_status_string(st), fp_last_error(),
                  untouched ? "untouched" : "written");
    }
    /* bytes: Q bf16 + O bf16 (2 + 2 per element), K and V 1 byte each */
    fp_attention_params k8 = H.p8;
    k8.dtype = FP_BF16;
    k8.kv_dtype = FP_FP8_E4M3;
    k8.q_descale = 0;
    k8.q_head_stride = k8.q_seq_stride = k8.q_batch_stride = 0;
    CHECK_OK(fp_attn_check(&k8, 0, &a));
    const double q_o = (double)SMALL.batch * SMALL.sq * SMALL.hq * SMALL.d,
                 kv = (double)SMALL.batch * SMALL.sk * SMALL.hkv * SMALL.d;
    CHECK_NEAR(fp_attn_bytes(&a), 4.0 * q_o + 2.0 * kv, 0.5);
    /* a 0.4 caller (its sizeof: the fields end at v_descale, padded to 8
     * bytes): kv_dtype past its struct (garbage here) is never read */
    const size_t v04 = offsetof(fp_attention_params, kv_dtype);
    CHECK(v04 == (offsetof(fp_attention_params, v_descale) + sizeof(float) + 7) / 8 * 8);
    unsigned char *buf = malloc(sizeof(fp_attention_params));
    CHECK(buf != NULL);
    if (buf) {
        memset(buf, 0x7B, sizeof(fp_attention_params));
        memcpy(buf, &H.p32, v04);
        ((fp_attention_params *)buf)->struct_size = v04;
        CHECK_OK(fp_attn_check((const fp_attention_params *)buf, 0, &a));
        CHECK(a.kv_dtype == FP_F32 && !a.kv_fp8_cache);
        memset(buf, 0x7B, sizeof(fp_attention_params));
        CHECK_OK(fp_attention_params_init((fp_attention_params *)buf, v04));
        int untouched = 1;
        for (size_t i = v04; i < sizeof(fp_attention_params); ++i) untouched &= buf[i] == 0x7B;
        CHECK(untouched);
        free(buf);
    }
    host_free(&H);
}

/* fp_attention_validate on fp8: baseline and forward compared as bf16. */
static void test_validate(void) {
    fp8_host H;
    CHECK(host_make(&SMALL, &H, 33));
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.min_samples = 3;
    cfg.max_samples = 3;
    cfg.max_time_s = 0.2;
    fp_ab_report rep;
    memset(H.o8, 0xA5, H.n_o * sizeof(uint16_t));
    CHECK_OK(fp_attention_validate(g_ctx, NULL, &H.p8, &cfg, &rep));
    CHECK(rep.compared && rep.agreement.passed);
    CHECK(rep.agreement.count == (size_t)SMALL.batch * SMALL.sq * SMALL.hq * SMALL.d);
    /* bf16's default tolerance; the two CPU versions agree far inside it */
    CHECK(rep.agreement.atol == 1e-2 && rep.agreement.rtol == 1.6e-2);
    CHECK_MSG(rep.agreement.max_abs_err < 1e-2 * H.vmax, "validate max abs err %g", rep.agreement.max_abs_err);
    int untouched = 1; /* params->o is not written */
    for (size_t i = 0; i < H.n_o; ++i) untouched &= H.o8[i] == 0xA5A5;
    CHECK(untouched);
    host_free(&H);
}

int main(void) {
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, -1, &g_ctx));
    if (!g_ctx) return 1;
    test_e4m3_conversions();
    test_alignment_and_bytes();
    test_cases();
    test_refusals();
    test_struct_size_0_3();
    test_kv8_args();
    test_validate();
    fp_context_destroy(g_ctx);
    TEST_END();
}
