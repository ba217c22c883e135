/* The CPU attention implementations (tiled, naive, reference) on a 4-thread
 * pool under ThreadSanitizer: tasks write disjoint rows of O and lse, which
 * TSan checks; results are compared with the single-threaded reference.
 * Host sources only (see CMakeLists). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h"

static int failures = 0;

static void fill(float *x, size_t n, unsigned *s) {
    for (size_t i = 0; i < n; ++i) {
        *s = *s * 1664525u + 1013904223u;
        x[i] = (float)(*s >> 8) / 16777216.0f - 0.5f;
    }
}

static void run(int varlen, int causal, fp_thread_pool *pool) {
    enum { B = 3, SQ = 40, SK = 70, HQ = 4, HKV = 2, D = 32 };
    int32_t cu_q[B + 1] = {0, 40, 45, 62}, cu_k[B + 1] = {0, 70, 71, 100};
    const size_t rows_q = varlen ? 62 : (size_t)B * SQ, rows_k = varlen ? 100 : (size_t)B * SK;
    float *q = malloc(sizeof(float) * rows_q * HQ * D), *k = malloc(sizeof(float) * rows_k * HKV * D);
    float *v = malloc(sizeof(float) * rows_k * HKV * D);
    float *o = malloc(sizeof(float) * rows_q * HQ * D), *lse = malloc(sizeof(float) * B * HQ * SQ);
    double *o_ref = calloc((size_t)B * SQ * HQ * D, sizeof(double));
    double *lse_ref = calloc((size_t)B * HQ * SQ, sizeof(double));
    unsigned s = 7;
    fill(q, rows_q * HQ * D, &s);
    fill(k, rows_k * HKV * D, &s);
    fill(v, rows_k * HKV * D, &s);
    fp_attention_params p;
    fp_attention_params_default(&p);
    p.batch = B; p.seqlen_q = SQ; p.seqlen_k = SK; p.heads_q = HQ; p.heads_kv = HKV; p.head_dim = D;
    p.dtype = FP_F32; p.causal = causal; p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
    if (varlen) {
        p.cu_seqlens_q = cu_q;
        p.cu_seqlens_k = cu_k;
    }
    fp_attn_args a;
    if (fp_attn_check(&p, 0, &a) != FP_OK) {
        fprintf(stderr, "check: %s\n", fp_last_error());
        failures++;
        return;
    }
    fp_attn_reference(NULL, &a, o_ref, lse_ref);
    for (int impl = 0; impl < 3; ++impl) {
        memset(o, 0, sizeof(float) * rows_q * HQ * D);
        double *o2 = impl == 2 ? calloc((size_t)B * SQ * HQ * D, sizeof(double)) : NULL;
        double *l2 = impl == 2 ? calloc((size_t)B * HQ * SQ, sizeof(double)) : NULL;
        fp_status st = impl == 0 ? fp_attn_cpu_tiled(pool, &a)
                                 : impl == 1 ? fp_attn_cpu_naive(pool, &a) : fp_attn_reference(pool, &a, o2, l2);
        if (st != FP_OK) failures++;
        for (int b = 0; b < B; ++b) {
            fp_attn_seq S = fp_attn_seq_host(&a, b);
            for (int i = 0; i < S.sq; ++i)
                for (int h = 0; h < HQ; ++h)
                    for (int x = 0; x < D; ++x) {
                        double ref = o_ref[(((size_t)b * SQ + i) * HQ + h) * D + x];
                        double got = impl == 2 ? o2[(((size_t)b * SQ + i) * HQ + h) * D + x]
                                               : o[S.o0 + i * a.o_ss + h * a.o_hs + x];
                        if (!(fabs(got - ref) <= 1e-5 + 1e-5 * fabs(ref))) {
                            if (failures < 5)
                                fprintf(stderr, "varlen %d causal %d impl %d: O[%d,%d,%d,%d] %.7g ref %.7g\n", varlen,
                                        causal, impl, b, i, h, x, got, ref);
                            failures++;
                        }
                    }
        }
        free(o2);
        free(l2);
    }
    free(q); free(k); free(v); free(o); free(lse); free(o_ref); free(lse_ref);
}

int main(void) {
    fp_thread_pool *pool = NULL;
    if (fp_thread_pool_create(4, &pool) != FP_OK) return 1;
    for (int varlen = 0; varlen < 2; ++varlen)
        for (int causal = 0; causal < 2; ++causal) run(varlen, causal, pool);
    fp_thread_pool_destroy(pool);
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
