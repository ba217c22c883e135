/* Launchers of the fused-norm CUDA kernels (kernels/norm/norm_fwd.cu, norm_bwd.cu), callable from
 * C. The host side (src/norm/norm.c) has already checked every argument and
 * resolved the strides; the launchers pick a kernel version, compute the grid
 * and check the launch. Not installed. */
#ifndef FP_NORM_LAUNCH_H
#define FP_NORM_LAUNCH_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "core/span_stamp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checked forward arguments; strides resolved (never 0). Plain data so it can
 * be passed by value to a kernel. Flags are pointers being non-NULL. */
typedef struct fp_norm_fwd_desc {
    int kind;          /* fp_norm_kind */
    int act;           /* fp_norm_activation */
    int dtype;         /* fp_dtype of every tensor and vector */
    int64_t rows, cols;
    int64_t x_stride, res_stride, res_out_stride, out_stride;
    const void *x, *res, *gamma, *beta, *bias;
    void *res_out, *out;
    float *mean, *rstd;
    float eps;
    int sm_count;      /* the device's SMs (0: unknown): picks v2's load order
                          (norm_fwd.cu, launch_v2) */
    int pdl;           /* 1: launch with programmatic dependent launch (the
                          context's FP_CTX_LAUNCH_PDL; kernels/common/pdl.cuh) */
    int ln_two_reductions; /* set by the launchers: 1 = LayerNorm's mean and
                          variance as two reductions in v2's / v4's block per
                          row (the default); 0 = one reduction of the
                          threads' moments (session 28's form, measured
                          slower: FP_NORM_VOPT_ONE_REDUCTION,
                          FP_NORM_FWD_LN_STATS=1) */
    int v4_params;     /* set by the launchers: 1 = v4 keeps gamma / beta /
                          bias in registers across its rows (NV <= 2;
                          FP_NORM_VOPT_V4_PARAMS, FP_NORM_FWD_V4_PARAMS=1) */
    fp_span_stamp stamp; /* the op's span, timed by its kernels (the kernel
                          timer; rec NULL: not) */
} fp_norm_fwd_desc;

typedef struct fp_norm_bwd_desc {
    int kind, act, dtype;
    int64_t rows, cols;
    int64_t dout_stride, x_stride, dres_stride, dx_stride;
    const void *dout, *x, *gamma, *beta, *bias;
    const float *mean, *rstd;
    const void *dres;
    void *dx, *dgamma, *dbeta, *dbias;
    int sep_sums; /* set by the launchers: 1 = LayerNorm's two row sums as two
                     reductions (before session 15; FP_NORM_BWD_SEP_SUMS=1) */
    int *counters; /* 2 ints, zero between launches (fp_ctx_scratch_get_counted):
                      what the fused reduce counts with; NULL: no fused reduce */
    int tail_ctas; /* set by the launchers: the CTAs that run the fused reduce
                      (0: the reduce kernel after v3 / v4) */
    fp_span_stamp stamp; /* the op's span, timed by its kernels (the kernel
                            timer; rec NULL: not) */
} fp_norm_bwd_desc;

/* Option bits a version request may carry next to the version (tests' and
 * fastbench's A/B, in one process; not API): a kernel's earlier form.
 *   FP_NORM_VOPT_ACCURATE_ACT    GELU (tanh) and SiLU by tanhf / expf and an
 *                                IEEE division, as before session 28 (the
 *                                environment's FP_NORM_ACT_FAST=0 does the
 *                                same for every call)
 *   FP_NORM_VOPT_TWO_REDUCTIONS  LayerNorm's row statistics through two
 *                                reductions: forward v2 / v4, the mean and
 *                                then the squared deviations (the default
 *                                again since session 44; FP_NORM_FWD_LN_STATS
 *                                =2 for every call); backward, its two
 *                                row sums one after the other (before session
 *                                15; FP_NORM_BWD_SEP_SUMS=1)
 * and, forward only, choices the GPU check measures:
 *   FP_NORM_VOPT_V4_PARAMS       forward v4 keeps gamma / beta / bias in
 *                                registers across its rows
 *                                (FP_NORM_FWD_V4_PARAMS=1 for every call)
 *   FP_NORM_VOPT_ONE_REDUCTION   LayerNorm's row statistics in v2's / v4's
 *                                block per row through one reduction of the
 *                                threads' moments (session 28's default;
 *                                0.87-0.90x the two reductions on an H200
 *                                without a residual, session 41: now opt-in;
 *                                FP_NORM_FWD_LN_STATS=1 for every call;
 *                                FP_NORM_VOPT_TWO_REDUCTIONS wins over it)
 * and, backward only, one:
 *   FP_NORM_VOPT_FUSED_REDUCE    backward v3 / v4 sum the dgamma / dbeta /
 *                                dbias partial rows in their own tail (the
 *                                last CTAs, counted in d->counters) instead
 *                                of a reduce kernel after them
 *                                (FP_NORM_BWD_FUSED_REDUCE=1 for every call,
 *                                =0 for none; needs d->counters) */
enum {
    FP_NORM_VERSION_MASK = 0xff,
    FP_NORM_VOPT_ACCURATE_ACT = 0x100,
    FP_NORM_VOPT_TWO_REDUCTIONS = 0x200,
    FP_NORM_VOPT_V4_PARAMS = 0x400,
    FP_NORM_VOPT_FUSED_REDUCE = 0x800,
    FP_NORM_VOPT_ONE_REDUCTION = 0x1000,
    FP_NORM_VOPT_ALL = FP_NORM_VOPT_ACCURATE_ACT | FP_NORM_VOPT_TWO_REDUCTIONS,
    FP_NORM_VOPT_BWD_ALL = FP_NORM_VOPT_ALL | FP_NORM_VOPT_FUSED_REDUCE,
    FP_NORM_VOPT_FWD_ALL = FP_NORM_VOPT_ALL | FP_NORM_VOPT_V4_PARAMS | FP_NORM_VOPT_ONE_REDUCTION
};
/* Kernel versions (see the header comments of the .cu files):
 *   0 = automatic (best for the shape), 1 = scalar/any-shape, 2 = vectorized
 *   row in registers (falls back to 1 where it does not apply), 3 = the row
 *   staged in shared memory (likewise), 4 = 2 in persistent CTAs with the
 *   next row prefetched (the automatic choice where it does not apply). */

/* Fused forward. Returns a cudaError_t (cudaSuccess or the launch error). */
cudaError_t fp_norm_fwd_launch(const fp_norm_fwd_desc *d, int version, cudaStream_t stream);

/* Unfused baseline steps, each one kernel over the whole tensor, working in
 * place on d->out (and writing d->res_out): add (out = x + res), norm
 * (out = norm(out), mean/rstd), affine (out = out * gamma + beta + bias),
 * activation (out = act(out)). Skips steps the desc does not ask for. */
cudaError_t fp_norm_fwd_unfused_launch(const fp_norm_fwd_desc *d, cudaStream_t stream);

/* Fused backward. Versions (kernels/norm/norm_bwd.cu): 1 = scalar dx and
 * dgamma/dbeta kernels; 2 = dx v2 (row in registers) + a separate dgamma/dbeta
 * pass where aligned, else 1; 3 = one pass computing dx and the dgamma/dbeta
 * partial sums (persistent grid of sm_count x <= 2 CTAs) where its plan
 * applies (aligned, cols <= 16384), else 2; 4 = 3 with a cp.async prefetch
 * ring of the next rows where v3 keeps its sums in registers (also without
 * dgamma/dbeta/dbias), else as 3; 0 = automatic (4 when dgamma/dbeta/dbias
 * and a dresidual are given and it applies, else 3 when dgamma/dbeta/dbias
 * are requested and it applies, else 2; environment FP_NORM_BWD_RING=1: 4
 * wherever it applies, =0: never). sm_count: the device's SMs (sizes v3's grid).
 * `partial` is f32 scratch of fp_norm_bwd_partial_floats(d, version,
 * sm_count) elements, 16-byte aligned (may be NULL when no
 * dgamma/dbeta/dbias is requested). */
size_t fp_norm_bwd_partial_floats(const fp_norm_bwd_desc *d, int version, int sm_count);
cudaError_t fp_norm_bwd_launch(const fp_norm_bwd_desc *d, int version, int sm_count, float *partial,
                               cudaStream_t stream);
/* The dx kernel version (1, 2, 3 or 4) a request for `version` runs on d. */
int fp_norm_bwd_version_used(const fp_norm_bwd_desc *d, int version);
/* 1 if a request for `version` (with its FP_NORM_VOPT_FUSED_REDUCE bit, or
 * FP_NORM_BWD_FUSED_REDUCE) runs the fused reduce on d, given the counters
 * fp_norm_backward gives it; else 0. */
int fp_norm_bwd_fused_reduce_used(const fp_norm_bwd_desc *d, int version);
/* Unfused baseline of the backward: activation backward written to dx; norm
 * backward on it in place (version 2); dx += dres. partial as for version 2. */
cudaError_t fp_norm_bwd_unfused_launch(const fp_norm_bwd_desc *d, float *partial, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

/* Host entry with a forced backward version, for tests and fastbench (static
 * link; implemented in src/norm/norm.c, not part of the public API). As
 * fp_norm_backward (same checks and errors), with `version` passed to
 * fp_norm_bwd_launch; CPU contexts ignore it. Declared only for C/C++ host
 * code that has the public headers. */
#if !defined(__CUDACC__)
#include "fastpath/norm.h"
#ifdef __cplusplus
extern "C" {
#endif
fp_status fp_norm_backward_version(fp_context *ctx, fp_stream stream, const fp_norm_backward_params *params,
                                   int version);  /* version: 0-4, | FP_NORM_VOPT_* bits */
/* As fp_norm_forward with `version` passed to fp_norm_fwd_launch (0
 * automatic, 1 v1, 2 v2, 3 v3, v1 where the asked one does not apply; 4 v4,
 * the automatic choice where it does not apply; | FP_NORM_VOPT_* bits). */
fp_status fp_norm_forward_version(fp_context *ctx, fp_stream stream, const fp_norm_params *params, int version);
/* The dx kernel version (1, 2, 3, 4) a request for `version` runs on a CUDA
 * context for params; 0 if params are invalid (error cleared). */
int fp_norm_backward_version_used(const fp_norm_backward_params *params, int version);
#ifdef __cplusplus
}
#endif
#endif

#endif /* FP_NORM_LAUNCH_H */
