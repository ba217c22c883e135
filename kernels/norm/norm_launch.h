/* Launchers of the fused-norm CUDA kernels (kernels/norm/norm_fwd.cu, norm_bwd.cu), callable from
 * C. The host side (src/norm/norm.c) has already checked every argument and
 * resolved the strides; the launchers pick a kernel version, compute the grid
 * and check the launch. Not installed. */
#ifndef FP_NORM_LAUNCH_H
#define FP_NORM_LAUNCH_H

#include <cuda_runtime_api.h>
#include <stdint.h>

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
} fp_norm_fwd_desc;

typedef struct fp_norm_bwd_desc {
    int kind, act, dtype;
    int64_t rows, cols;
    int64_t dout_stride, x_stride, dres_stride, dx_stride;
    const void *dout, *x, *gamma, *beta, *bias;
    const float *mean, *rstd;
    const void *dres;
    void *dx, *dgamma, *dbeta, *dbias;
} fp_norm_bwd_desc;

/* Kernel versions (see the header comments of the .cu files):
 *   0 = automatic (best for the shape), 1 = scalar/any-shape, 2 = vectorized
 *   row in registers (falls back to 1 where it does not apply). */

/* Fused forward. Returns a cudaError_t (cudaSuccess or the launch error). */
cudaError_t fp_norm_fwd_launch(const fp_norm_fwd_desc *d, int version, cudaStream_t stream);

/* Unfused baseline steps, each one kernel over the whole tensor, working in
 * place on d->out (and writing d->res_out): add (out = x + res), norm
 * (out = norm(out), mean/rstd), affine (out = out * gamma + beta + bias),
 * activation (out = act(out)). Skips steps the desc does not ask for. */
cudaError_t fp_norm_fwd_unfused_launch(const fp_norm_fwd_desc *d, cudaStream_t stream);

/* Fused backward. `partial` is f32 scratch of fp_norm_bwd_partial_floats()
 * elements (may be NULL when no dgamma/dbeta/dbias is requested). */
size_t fp_norm_bwd_partial_floats(const fp_norm_bwd_desc *d);
cudaError_t fp_norm_bwd_launch(const fp_norm_bwd_desc *d, float *partial, cudaStream_t stream);
/* Unfused baseline of the backward: activation backward written to dx; norm
 * backward on it in place; dx += dres. Same partial buffer. */
cudaError_t fp_norm_bwd_unfused_launch(const fp_norm_bwd_desc *d, float *partial, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* FP_NORM_LAUNCH_H */
