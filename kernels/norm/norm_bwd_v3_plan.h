/* Work partition of the norm backward v3 kernel (kernels/norm/norm_bwd.cu):
 * which rows and columns each (CTA, thread, vector) covers, the launch shape
 * for a given cols, and the grid. Plain C (static inline) so the kernel and
 * its launcher use exactly these functions and a host unit
 * test (tests/norm/test_norm_bwd_v3_plan.c) can prove every (row, col) is
 * covered exactly once. Not installed.
 *
 * Shape of one launch (the v2 register path, same NV choice and threads as
 * dx v2):
 *   warp per row : block (32, 4): each warp a row, 4 rows per CTA at a time;
 *                  nvec <= 128 vectors of 16 bytes (NV = 1, 2, 4).
 *   block per row: block (threads, 1): the smallest NV in {2, 4, 8 (f32)}
 *                  with ceil(nvec / NV) <= 512 threads.
 * v3 additionally needs the per-thread dgamma/dbeta accumulators (2 x NV x V
 * floats) next to the row (2 x NV x V floats). With NV x V = 32 (4 x 32
 * floats of state) they stay in registers only in the 128-thread warp-per-row
 * blocks (bound 128: 255 registers); a block per row spilled even under a
 * 384-thread bound (168 registers, checked with ptxas), so a block per row
 * with NV x V = 32 (16-bit or f32 cols > 8192) keeps them in shared memory
 * instead (smem_acc: [2][cols] f32, each thread only touches its own columns,
 * no barrier; 2 x cols x 4 bytes must fit the device's per-block opt-in
 * limit, else the launcher falls back to v2). Even so the row alone spills
 * under a 512-thread bound (128 registers) with the persistent loop, so these
 * blocks are limited to 384 threads: cols <= 12288.
 * Longer rows (385-512 threads of NV x V = 32: 12288 < cols <= 16384 for
 * every dtype) stage the row in shared memory instead (stage_row: x as
 * loaded, T[cols], and g = dout * act'(y) as f32[cols]; each thread again
 * only its own cells, no barrier) and keep the dgamma sums in registers (32
 * floats), the dbeta sums too for f32 and in shared memory (f32[cols]) for
 * 16-bit types, whose 8-element vectors need more temporaries (in registers
 * they spilled at the 128-register bound): the row is read from device
 * memory once, as in the other modes. 16384 cols: 128 KB (f32), 160 KB
 * (16-bit), within the opt-in limit of sm_80 (163 KB) and sm_90 (227 KB).
 * Rows beyond 16384 cols fall back to v1 (dx v2 does not take them either).
 *
 * Persistent grid: CTA c handles row groups c, c + grid, c + 2 grid, ...; a
 * row group is the rows_per_cta rows the CTA works on at once. A thread's
 * columns never change, so its partial sums stay in registers (or its own
 * shared-memory cells). The plan and grid functions are host-only; the index
 * functions (FP_NORM_HD) are also compiled for the device. */
#ifndef FP_NORM_BWD_V3_PLAN_H
#define FP_NORM_BWD_V3_PLAN_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define FP_NORM_HD __host__ __device__
#else
#define FP_NORM_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FP_NORM_V3_WARP_ROWS = 4,        /* rows per CTA in warp-per-row mode */
    FP_NORM_V3_MAX_THREADS = 512,    /* block per row (NV x V <= 16) */
    FP_NORM_V3_MAX_NVV_BLOCK = 16,   /* NV x V of register sums in a block per row */
    FP_NORM_V3_MAX_THREADS_SMEM = 384, /* block per row with shared-memory sums */
    FP_NORM_V3_MAX_CTAS_PER_SM = 2,  /* more CTAs only add partial rows */
    FP_NORM_V4_RING_STAGES = 3       /* v4: rows in the ring (2 in flight while one is worked on) */
};

typedef struct fp_norm_v3_plan {
    int ok;           /* 0: v3 does not apply (cols not a multiple of vec, too long) */
    int nv;           /* 16-byte vectors per thread per row */
    int threads_x;    /* threads per row (blockDim.x) */
    int rows_per_cta; /* blockDim.y: rows a CTA works on at once */
    int smem_acc;     /* 1: the dgamma/dbeta sums live in shared memory */
    int stage_row;    /* 1: the row (x, g) is staged in shared memory, sums in
                         registers (block per row, NV x V = 32, > 384 threads) */
} fp_norm_v3_plan;

/* Launch shape for cols (a multiple of vec, the elements per 16-byte vector:
 * 4 for f32, 8 for f16/bf16); NV <= 32 / vec, as dx v2. */
static inline fp_norm_v3_plan fp_norm_v3_plan_for(int64_t cols, int vec) {
    fp_norm_v3_plan p = {0, 0, 0, 0, 0, 0};
    if (vec <= 0 || cols <= 0 || cols % vec) return p;
    const int max_nv = 32 / vec;
    const int64_t nvec = cols / vec;
    if (nvec <= 32 * 4) { /* warp per row */
        p.nv = nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
        p.threads_x = 32;
        p.rows_per_cta = FP_NORM_V3_WARP_ROWS;
        p.ok = 1;
        return p;
    }
    for (int nv = 2; nv <= max_nv; nv *= 2) {
        const int64_t t = (nvec + nv - 1) / nv;
        if (t <= FP_NORM_V3_MAX_THREADS) {
            p.smem_acc = nv * vec > FP_NORM_V3_MAX_NVV_BLOCK; /* too many for registers */
            p.nv = nv;
            p.threads_x = (int)((t + 31) / 32 * 32);
            if (p.smem_acc && p.threads_x > FP_NORM_V3_MAX_THREADS_SMEM) {
                p.smem_acc = 0; /* the row in shared memory, the sums in registers */
                p.stage_row = 1;
            }
            p.rows_per_cta = 1;
            p.ok = 1;
            return p;
        }
    }
    return p;
}

/* Dynamic shared memory of a launch with plan p, elem_size = sizeof(T):
 *   smem_acc : the sums, [2][cols] f32;
 *   stage_row: g as f32[cols], for 16-bit T the dbeta sums f32[cols], then
 *              x as T[cols] (each part 16-byte aligned: cols is a multiple
 *              of 4);
 *   warp per row (register sums): the other thread rows' sums for the
 *              in-CTA combine, [2][rows_per_cta - 1][cols] f32;
 *   else 0. Above 48 KB the launcher opts in (cudaFuncSetAttribute) after
 *   checking the device's per-block limit; below, no opt-in is needed. */
static inline size_t fp_norm_v3_smem_bytes(const fp_norm_v3_plan *p, int64_t cols, size_t elem_size) {
    if (!p->ok) return 0;
    if (p->smem_acc) return (size_t)2 * (size_t)cols * sizeof(float);
    if (p->stage_row) return (size_t)cols * (sizeof(float) * (elem_size == 2 ? 2 : 1) + elem_size);
    if (p->rows_per_cta > 1) return (size_t)2 * (size_t)(p->rows_per_cta - 1) * (size_t)cols * sizeof(float);
    return 0;
}

/* v4 (v3 with a prefetch ring): applies where v3 keeps its sums in registers
 * (neither smem_acc nor stage_row). Each thread copies its own part of the
 * rows ahead (x, dout and, with a dresidual, dres: ntensors = 2 or 3; the
 * row's mean and rstd) into FP_NORM_V4_RING_STAGES stages of shared memory
 * with cp.async, so loads stay in flight through a row's reductions and
 * stores. Dynamic shared memory: v3's (the warps' combine area) + the ring,
 * stages x threads x (nv x ntensors x 16 + 8) bytes; 0 where v4 does not
 * apply. */
static inline size_t fp_norm_v4_smem_bytes(const fp_norm_v3_plan *p, int64_t cols, size_t elem_size, int ntensors) {
    if (!p->ok || p->smem_acc || p->stage_row) return 0;
    const size_t threads = (size_t)p->threads_x * (size_t)p->rows_per_cta;
    return fp_norm_v3_smem_bytes(p, cols, elem_size) +
           (size_t)FP_NORM_V4_RING_STAGES * threads * ((size_t)p->nv * (size_t)ntensors * 16u + 8u);
}

/* The most dynamic shared memory plan p's mode can ask for (the row length
 * at its thread cap: 384 x 32 elements with shared-memory sums, 512 x 32
 * with the staged row, 32 x 4 x vec per warp-per-row CTA). The launcher
 * sets the kernel's opt-in attribute to this fixed value (capped by the
 * device), never to one call's need: two host threads launching the same
 * kernel for different cols would otherwise race between setting the
 * attribute and launching. */
static inline size_t fp_norm_v3_smem_cap(const fp_norm_v3_plan *p, int vec, size_t elem_size) {
    int64_t cols;
    if (!p->ok) return 0;
    if (p->smem_acc) cols = (int64_t)FP_NORM_V3_MAX_THREADS_SMEM * p->nv * vec;
    else if (p->stage_row) cols = (int64_t)FP_NORM_V3_MAX_THREADS * p->nv * vec;
    else cols = (int64_t)32 * 4 * vec;
    return fp_norm_v3_smem_bytes(p, cols, elem_size);
}

/* Grid: SMs x min(CTAs that fit per SM, 2), at least 1, and no more CTAs than
 * row groups. The cap changes nothing in the results: with grid G' = number
 * of row groups < G, CTA c gets exactly the row group c it would get with G,
 * and the CTAs left out would only add +0.0 partials. */
static inline int64_t fp_norm_v3_grid(int64_t rows, int rows_per_cta, int sm_count, int ctas_per_sm) {
    if (ctas_per_sm > FP_NORM_V3_MAX_CTAS_PER_SM) ctas_per_sm = FP_NORM_V3_MAX_CTAS_PER_SM;
    if (ctas_per_sm < 1) ctas_per_sm = 1;
    if (sm_count < 1) sm_count = 1;
    const int64_t groups = (rows + rows_per_cta - 1) / rows_per_cta;
    int64_t g = (int64_t)sm_count * ctas_per_sm;
    return g < groups ? g : groups;
}

/* Row handled by thread row ty (threadIdx.y) of CTA cta at loop step `step`;
 * >= rows means the CTA is done. */
FP_NORM_HD static inline int64_t fp_norm_v3_row(int64_t cta, int64_t step, int ty, int64_t grid,
                                               int rows_per_cta) {
    return (cta + step * grid) * rows_per_cta + ty;
}

/* Vector index (column / vec) of a thread's k-th vector; valid if < nvec. */
FP_NORM_HD static inline int64_t fp_norm_v3_vec(int tx, int k, int threads_x) {
    return (int64_t)tx + (int64_t)k * threads_x;
}

/* Partial sums: [2][grid][cols] f32 (sum g * n, then sum g). Index of
 * (which, cta, col). The thread row ty == 0 of a CTA writes the CTA's row
 * after adding the other thread rows' sums (warp-per-row mode). */
FP_NORM_HD static inline int64_t fp_norm_v3_partial_index(int which, int64_t cta, int64_t col, int64_t grid,
                                                          int64_t cols) {
    return ((int64_t)which * grid + cta) * cols + col;
}

#ifdef __cplusplus
}
#endif

#endif /* FP_NORM_BWD_V3_PLAN_H */
