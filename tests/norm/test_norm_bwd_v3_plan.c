/* Host check of the norm backward v3 work partition (kernels/norm/
 * norm_bwd_v3_plan.h, the functions the kernel and its launcher call): for
 * many shapes, vector widths, SM counts and occupancies, walks every
 * (CTA, thread row, step, thread, vector, element) exactly as norm_bwd_v3
 * does and checks that
 *   - every (row, col) of the tensor is covered exactly once (dx written once,
 *     every element summed into dgamma/dbeta once),
 *   - every (CTA, col) of the partial buffer is written exactly once (by the
 *     thread row 0 after the in-CTA combine), inside [2][grid][cols],
 *   - the launch shape is v2's (same NV and threads) where v3 applies, within
 *     the register budget (shared-memory sums where a block per row needs
 *     NV x V > 16 up to 384 threads, the staged row beyond), v3 takes every
 *     shape v2 takes, and the dynamic shared memory fits the limits,
 *   - capping the grid at the number of row groups gives each CTA the same
 *     rows as the uncapped grid (so the sums are the same).
 * CPU only, no device needed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp_test.h"
#include "norm/norm_bwd_v3_plan.h"

/* dx v2's launch choice (kernels/norm/norm_bwd.cu launch_dx), restated. */
static int v2_choice(int64_t nvec, int vec, int *nv, int *threads, int *rows_per_cta) {
    const int max_nv = 32 / vec;
    if (nvec <= 128) {
        *nv = nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
        *threads = 32;
        *rows_per_cta = 4;
        return 1;
    }
    for (int c = 2; c <= max_nv; c *= 2) {
        int64_t t = (nvec + c - 1) / c;
        if (t <= 512) {
            *nv = c;
            *threads = (int)((t + 31) / 32 * 32);
            *rows_per_cta = 1;
            return 1;
        }
    }
    return 0;
}

static void check_plan(int64_t cols, int vec) {
    fp_norm_v3_plan p = fp_norm_v3_plan_for(cols, vec);
    if (cols % vec) {
        CHECK_MSG(!p.ok, "cols %lld vec %d: plan for cols not a multiple of vec", (long long)cols, vec);
        return;
    }
    const int64_t nvec = cols / vec;
    int nv = 0, threads = 0, rpc = 0;
    const int v2 = v2_choice(nvec, vec, &nv, &threads, &rpc);
    if (!p.ok) {
        /* v3 declines only rows dx v2 does not take either (> 16384 cols) */
        CHECK_MSG(!v2, "cols %lld vec %d: v3 declined a shape v2 takes", (long long)cols, vec);
        return;
    }
    /* a block per row with NV x V > 16: shared-memory sums up to 384 threads,
     * the row staged in shared memory beyond; never both */
    const int big = rpc == 1 && nv * vec > FP_NORM_V3_MAX_NVV_BLOCK;
    CHECK(p.smem_acc == (big && threads <= FP_NORM_V3_MAX_THREADS_SMEM));
    CHECK(p.stage_row == (big && threads > FP_NORM_V3_MAX_THREADS_SMEM));
    CHECK(!(p.smem_acc && p.stage_row));
    /* dynamic shared memory: the warp-per-row combine stays under the 48 KB
     * that needs no opt-in; the big modes fit sm_80's opt-in limit (163 KB,
     * 166912 bytes, less the kernel's 128 static bytes), so the launcher's
     * device check never sends a v3 shape back to v2 on sm_80+ */
    for (size_t es = 2; es <= 4; es += 2) {
        const size_t smem = fp_norm_v3_smem_bytes(&p, cols, es);
        if (p.rows_per_cta > 1) CHECK(smem <= 48 * 1024);
        if (!p.smem_acc && !p.stage_row && p.rows_per_cta == 1) CHECK(smem == 0);
        CHECK_MSG(smem + 128 <= 166912, "cols %lld vec %d es %zu: %zu bytes of shared memory", (long long)cols, vec,
                  es, smem);
        /* the opt-in attribute's fixed value covers every cols of the mode */
        CHECK_MSG(smem <= fp_norm_v3_smem_cap(&p, vec, es) && fp_norm_v3_smem_cap(&p, vec, es) + 128 <= 166912,
                  "cols %lld vec %d: smem %zu above the mode's cap %zu", (long long)cols, vec, smem,
                  fp_norm_v3_smem_cap(&p, vec, es));
        if (p.stage_row) /* g, [dbeta sums,] x: each part 16-byte aligned */
            CHECK(smem == (size_t)cols * (es == 2 ? 10 : 8) && (cols * 4) % 16 == 0);
    }
    CHECK_MSG(v2 && p.nv == nv && p.threads_x == threads && p.rows_per_cta == rpc,
              "cols %lld vec %d: plan (nv %d, %d x %d) differs from v2 (nv %d, %d x %d)", (long long)cols, vec,
              p.nv, p.threads_x, p.rows_per_cta, nv, threads, rpc);
    CHECK(p.threads_x % 32 == 0 && p.threads_x * p.rows_per_cta <= FP_NORM_V3_MAX_THREADS);
    CHECK((int64_t)p.threads_x * p.nv >= nvec);
    CHECK(p.rows_per_cta == 1 || p.threads_x == 32);
    CHECK(p.rows_per_cta == FP_NORM_V3_WARP_ROWS || p.nv * vec <= FP_NORM_V3_MAX_NVV_BLOCK || p.smem_acc ||
          p.stage_row);
}

/* Walks the kernel's loops for one (rows, cols, grid) and checks coverage. */
static int walk(int64_t rows, int64_t cols, int vec, const fp_norm_v3_plan *p, int64_t grid,
                unsigned char *cover, unsigned char *pcover) {
    const int64_t nvec = cols / vec;
    memset(cover, 0, (size_t)(rows * cols));
    memset(pcover, 0, (size_t)(2 * grid * cols));
    for (int64_t cta = 0; cta < grid; ++cta) {
        for (int ty = 0; ty < p->rows_per_cta; ++ty)
            for (int64_t step = 0;; ++step) {
                const int64_t row = fp_norm_v3_row(cta, step, ty, grid, p->rows_per_cta);
                if (row >= rows) break;
                for (int tx = 0; tx < p->threads_x; ++tx)
                    for (int k = 0; k < p->nv; ++k) {
                        const int64_t j = fp_norm_v3_vec(tx, k, p->threads_x);
                        if (j >= nvec) continue;
                        for (int e = 0; e < vec; ++e) cover[row * cols + j * vec + e]++;
                    }
            }
        /* partial row of this CTA: thread row 0 writes both halves */
        for (int tx = 0; tx < p->threads_x; ++tx)
            for (int k = 0; k < p->nv; ++k) {
                const int64_t j = fp_norm_v3_vec(tx, k, p->threads_x);
                if (j >= nvec) continue;
                for (int which = 0; which < 2; ++which)
                    for (int e = 0; e < vec; ++e) {
                        const int64_t i = fp_norm_v3_partial_index(which, cta, j * vec + e, grid, cols);
                        if (i < 0 || i >= 2 * grid * cols) return 0;
                        if (e % 4 == 0 && (i & 3) != 0) return 0; /* float4 stores: 16-byte aligned */
                        pcover[i]++;
                    }
            }
    }
    for (int64_t i = 0; i < rows * cols; ++i)
        if (cover[i] != 1) {
            fprintf(stderr, "rows %lld cols %lld vec %d grid %lld: (row %lld, col %lld) covered %d times\n",
                    (long long)rows, (long long)cols, vec, (long long)grid, (long long)(i / cols),
                    (long long)(i % cols), cover[i]);
            return 0;
        }
    for (int64_t i = 0; i < 2 * grid * cols; ++i)
        if (pcover[i] != 1) {
            fprintf(stderr, "rows %lld cols %lld vec %d grid %lld: partial %lld written %d times\n",
                    (long long)rows, (long long)cols, vec, (long long)grid, (long long)i, pcover[i]);
            return 0;
        }
    return 1;
}

/* With the uncapped grid G, CTA c's rows are those it gets with the capped one. */
static void check_cap(int64_t rows, int rows_per_cta, int sm, int per_sm) {
    const int64_t g = fp_norm_v3_grid(rows, rows_per_cta, sm, per_sm);
    int64_t full = (int64_t)sm * (per_sm > FP_NORM_V3_MAX_CTAS_PER_SM ? FP_NORM_V3_MAX_CTAS_PER_SM : per_sm);
    if (full < 1) full = 1;
    const int64_t groups = (rows + rows_per_cta - 1) / rows_per_cta;
    CHECK(g >= 1 && g <= full && g <= groups);
    CHECK(g == (full < groups ? full : groups));
    for (int64_t c = 0; c < g; ++c)
        for (int ty = 0; ty < rows_per_cta; ++ty)
            for (int64_t s = 0;; ++s) {
                const int64_t r = fp_norm_v3_row(c, s, ty, g, rows_per_cta);
                const int64_t rf = fp_norm_v3_row(c, s, ty, full, rows_per_cta);
                if (r >= rows && rf >= rows) break;
                CHECK_MSG(r == rf || g == full, "rows %lld: CTA %lld step %lld row %lld vs %lld uncapped",
                          (long long)rows, (long long)c, (long long)s, (long long)r, (long long)rf);
                if (r >= rows || rf >= rows) break;
            }
}

int main(void) {
    static const int vecs[] = {4, 8};
    /* Every cols class of v2: warp per row NV 1/2/4, block per row NV 2/4/8,
     * the boundaries between them, odd sizes, and beyond v2. */
    static const int64_t cols_list[] = {4,    8,    12,   24,   32,   64,   120,  128,  136,  256,   264,
                                        504,  512,  520,  768,  1000, 1024, 1032, 1536, 2048,  2056,  4096,
                                        4104, 5120, 8192, 8200, 9216, 12288, 12296, 16384, 16392, 20000, 7, 1537};
    static const int64_t rows_list[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 33, 263, 1000};
    static const int sms[] = {1, 3, 7, 132};
    static const int per_sms[] = {1, 2, 5};
    unsigned char *cover = malloc((size_t)1000 * 20000), *pcover = malloc((size_t)2 * 264 * 20000);
    size_t walks = 0;
    for (size_t vi = 0; vi < 2; ++vi)
        for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ++ci) {
            const int vec = vecs[vi];
            const int64_t cols = cols_list[ci];
            check_plan(cols, vec);
            const fp_norm_v3_plan p = fp_norm_v3_plan_for(cols, vec);
            if (!p.ok) continue;
            for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ++ri)
                for (size_t si = 0; si < sizeof sms / sizeof sms[0]; ++si)
                    for (size_t oi = 0; oi < sizeof per_sms / sizeof per_sms[0]; ++oi) {
                        const int64_t rows = rows_list[ri];
                        /* keep the run short: the biggest rows only with a few cols */
                        if (rows * cols > 2000000 && oi > 0) continue;
                        const int64_t grid = fp_norm_v3_grid(rows, p.rows_per_cta, sms[si], per_sms[oi]);
                        CHECK_MSG(walk(rows, cols, vec, &p, grid, cover, pcover),
                                  "coverage rows %lld cols %lld vec %d sm %d per_sm %d", (long long)rows,
                                  (long long)cols, vec, sms[si], per_sms[oi]);
                        check_cap(rows, p.rows_per_cta, sms[si], per_sms[oi]);
                        walks++;
                    }
        }
    /* every cols that is a multiple of vec up to 2 x the largest row v2 keeps */
    for (int vi = 0; vi < 2; ++vi)
        for (int64_t cols = vecs[vi]; cols <= 40000; cols += vecs[vi]) check_plan(cols, vecs[vi]);
    /* the shapes in bf16 (vec 8): which take v3 */
    CHECK(fp_norm_v3_plan_for(768, 8).ok && fp_norm_v3_plan_for(4096, 8).ok && fp_norm_v3_plan_for(8192, 8).ok &&
          fp_norm_v3_plan_for(5120, 8).ok && fp_norm_v3_plan_for(12288, 8).ok);
    CHECK(fp_norm_v3_plan_for(12288, 8).smem_acc && !fp_norm_v3_plan_for(8192, 8).smem_acc);
    CHECK(!fp_norm_v3_plan_for(12288, 8).stage_row && fp_norm_v3_plan_for(12296, 8).stage_row);
    CHECK(fp_norm_v3_plan_for(16384, 8).ok && fp_norm_v3_plan_for(16384, 8).stage_row &&
          fp_norm_v3_plan_for(16384, 4).stage_row && fp_norm_v3_plan_for(16384, 8).threads_x == 512);
    CHECK(!fp_norm_v3_plan_for(16392, 8).ok && !fp_norm_v3_plan_for(16388, 4).ok && !fp_norm_v3_plan_for(1537, 8).ok);
    printf("v3 partition: %zu (shape, grid) walks checked\n", walks);
    free(cover);
    free(pcover);
    TEST_END();
}
