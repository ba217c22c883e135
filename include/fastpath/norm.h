/*
 * libfastpath fused normalization: LayerNorm / RMSNorm with residual add,
 * affine, bias and activation fused into one pass, forward and backward.
 *
 * What one forward call computes, per row i of a [rows, cols] tensor (every
 * step but the norm optional):
 *
 *     s      = x + residual                 (rounded to the tensor dtype)
 *     residual_out = s                      (the pre-norm sum, for the next layer)
 *     LayerNorm: mean = avg(s), rstd = 1 / sqrt(avg((s - mean)^2) + eps)
 *                n = (s - mean) * rstd
 *     RMSNorm:   rstd = 1 / sqrt(avg(s^2) + eps),  n = s * rstd
 *     y      = n * gamma + beta + bias      (per column; a missing one is 1 / 0 / 0)
 *     out    = act(y)                       (none, GELU erf, GELU tanh, ReLU, SiLU)
 *
 * Accumulation is f32 (CPU and GPU); the variance is computed two-pass over
 * the row held on chip, so no E[s^2] - E[s]^2 cancellation, and LayerNorm
 * sums s minus the row's first element (x or s) rather than s, so a large
 * mean with a small spread keeps its digits. The variance is the biased (population) one, as in
 * torch.nn.LayerNorm. (CUDA, a block per row: the row's mean in one
 * reduction, then the squared deviations from it over the registers in a
 * second.)
 *
 * GELU (tanh) and SiLU on CUDA are computed as y * sigmoid(z) (z = 2
 * sqrt(2/pi) (y + 0.044715 y^3), resp. y) with the hardware's approximate
 * exp2 and reciprocal, their derivatives from the same two values: relative
 * error within about 2^-19 of the exact function (f32 tanhf / expf: about
 * 2^-22; both far below bf16 / f16 rounding), and no cancellation where
 * 0.5 y (1 + tanh(u)) has one (y < 0). The CPU implementations have their
 * own vectorized forms.
 *
 * API tiers
 *   fp_norm_forward / fp_norm_backward   the ops (CUDA or CPU context)
 *   fp_norm_validate                     the fused op against the same math as
 *   fp_norm_backward_validate            separate unfused passes (add; norm;
 *                                        affine; activation), timed A/B with
 *                                        the timing engine and checked for
 *                                        numerical agreement. Run them on your
 *                                        own shapes.
 *
 * Memory: every pointer is ctx memory (device memory for a CUDA context, host
 * memory for a CPU context), e.g. from fp_mem_alloc. Tensors are row-major
 * [rows, cols] with a row stride in elements (0 means dense: stride = cols).
 * gamma, beta, bias (and their gradients) are dense [cols] vectors; mean and
 * rstd are dense f32 [rows].
 *
 * Implementations
 *   CUDA: a warp per row for small rows and a block per row for large ones,
 *   the row kept in registers and loaded with 16-byte vector loads when every
 *   pointer is 16-byte aligned and cols and the strides are multiples of the
 *   vector width (8 elements for f16/bf16, 4 for f32); otherwise, and for
 *   rows too long for registers (cols > 16384), a scalar kernel that
 *   re-reads the row through the cache. Any rows >= 1 and cols >= 1 are
 *   supported.
 *   CPU: one pass per row (row kept in a per-thread f32 buffer), rows split
 *   over the context's worker threads.
 *
 * Thread-safety: every function is thread-safe for distinct contexts, and for
 * one CUDA context from several threads as long as the output buffers differ.
 * A CPU context's worker pool serializes concurrent calls. The validate
 * functions time with the timing engine, which must not time two things at
 * once on one context: call them from one thread per context.
 */
#ifndef FASTPATH_NORM_H
#define FASTPATH_NORM_H

#include "fastpath/core.h"
#include "fastpath/timing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/*  Options                                                                 */
/* ======================================================================== */

typedef enum fp_norm_kind {
    FP_NORM_LAYERNORM = 0,
    FP_NORM_RMSNORM = 1
} fp_norm_kind;

/* Activation applied after the affine and bias. */
typedef enum fp_norm_activation {
    FP_NORM_ACT_NONE = 0,
    FP_NORM_ACT_GELU_ERF = 1,  /* 0.5 y (1 + erf(y / sqrt(2))) */
    FP_NORM_ACT_GELU_TANH = 2, /* 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))) */
    FP_NORM_ACT_RELU = 3,      /* max(y, 0); gradient 0 at y <= 0 */
    FP_NORM_ACT_SILU = 4       /* y * sigmoid(y) */
} fp_norm_activation;

/* "layernorm", "rmsnorm" / "none", "gelu_erf", "gelu_tanh", "relu", "silu";
 * "unknown" otherwise. Static storage. Thread-safe. */
FP_API const char *fp_norm_kind_name(fp_norm_kind kind);
FP_API const char *fp_norm_activation_name(fp_norm_activation act);

/* ======================================================================== */
/*  Forward                                                                 */
/* ======================================================================== */

typedef struct fp_norm_params {
    size_t struct_size;          /* set by fp_norm_params_default */
    fp_norm_kind kind;           /* default FP_NORM_LAYERNORM */
    fp_norm_activation activation; /* default FP_NORM_ACT_NONE */
    int64_t rows, cols;          /* >= 1 each (default 0: must be set) */
    /* dtypes (f32, f16 or bf16; default f32). This version requires them all
     * equal to x_dtype: a mismatch is FP_ERR_INVALID_ARGUMENT naming it. */
    fp_dtype x_dtype;            /* x */
    fp_dtype residual_dtype;     /* residual and residual_out */
    fp_dtype out_dtype;          /* out */
    fp_dtype param_dtype;        /* gamma, beta, bias */
    /* Row strides in elements; 0 = cols. A non-zero stride must be >= cols. */
    int64_t x_stride, residual_stride, residual_out_stride, out_stride;
    /* Inputs. x is required, the others optional (NULL: step skipped). */
    const void *x;               /* [rows, cols] */
    const void *residual;        /* [rows, cols] added to x before the norm */
    const void *gamma;           /* [cols] scale (NULL: 1) */
    const void *beta;            /* [cols] shift (NULL: 0) */
    const void *bias;            /* [cols] added after beta, before the activation */
    /* Outputs. out is required; the others optional (NULL: not written). */
    void *out;                   /* [rows, cols] */
    void *residual_out;          /* [rows, cols] the sum s = x + residual (s = x
                                    without residual). May alias neither x nor out. */
    float *mean;                 /* [rows] LayerNorm only: ignored by RMSNorm */
    float *rstd;                 /* [rows] 1 / sqrt(variance + eps) (RMSNorm: of mean square) */
    float eps;                   /* > 0 and finite (default 1e-5) */
} fp_norm_params;

/* Fills the defaults listed above (zeroes the struct first). */
FP_API fp_status fp_norm_params_default_sized(fp_norm_params *params, size_t struct_size);
/* The exported fp_norm_params_default writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_norm_params_default)(fp_norm_params *params);
#define fp_norm_params_default(params) fp_norm_params_default_sized((params), sizeof *(params))

/* Runs the fused forward on ctx, enqueued on `stream` for a CUDA context
 * (NULL: the context's default stream; returns before the GPU finishes),
 * synchronously for a CPU context.
 * out may alias x (in place) when the strides and dtypes agree; residual_out
 * may alias residual likewise. Other overlaps are undefined.
 * Errors (outputs untouched): FP_ERR_INVALID_ARGUMENT with the argument named
 * for a NULL ctx/params/x/out, wrong struct_size, rows or cols < 1, an
 * unknown kind/activation/dtype, mismatched dtypes, eps <= 0 or not finite,
 * a non-zero stride < cols, a pointer not aligned to its element size;
 * FP_ERR_CUDA if a launch fails. */
FP_API fp_status fp_norm_forward(fp_context *ctx, fp_stream stream, const fp_norm_params *params);

/* ======================================================================== */
/*  Backward                                                                */
/* ======================================================================== */

/* Gradients of the forward above, given dout (the gradient of out). The
 * pre-activation y is recomputed from x, mean, rstd, gamma, beta and bias.
 *   g      = dout * act'(y)
 *   dgamma = sum_rows g * n,   dbeta = dbias = sum_rows g
 *   dn     = g * gamma
 *   LayerNorm: dx = rstd * (dn - avg(dn) - n * avg(dn * n))
 *   RMSNorm:   dx = rstd * (dn - n * avg(dn * n))
 *   dx    += dresidual_out          (if given)
 * With a fused residual the gradient of both x and residual is dx. */
typedef struct fp_norm_backward_params {
    size_t struct_size;          /* set by fp_norm_backward_params_default */
    fp_norm_kind kind;           /* as in the forward */
    fp_norm_activation activation;
    int64_t rows, cols;
    fp_dtype dtype;              /* dout, x, dresidual_out, dx (default f32) */
    fp_dtype param_dtype;        /* gamma, beta, bias, dgamma, dbeta, dbias;
                                    must equal dtype in this version */
    int64_t dout_stride, x_stride, dresidual_out_stride, dx_stride; /* 0 = cols */
    /* Inputs */
    const void *dout;            /* [rows, cols] required */
    const void *x;               /* [rows, cols] required: the normalized input,
                                    i.e. the forward's residual_out when it fused a
                                    residual, else its x */
    const void *gamma, *beta, *bias; /* as given to the forward (NULL: 1 / 0 / 0) */
    const float *mean;           /* [rows] required for LayerNorm, ignored by RMSNorm */
    const float *rstd;           /* [rows] required */
    const void *dresidual_out;   /* [rows, cols] optional: gradient reaching the
                                    forward's residual_out from later layers */
    /* Outputs */
    void *dx;                    /* [rows, cols] required; may alias dout */
    void *dgamma, *dbeta, *dbias; /* [cols] optional (NULL: not computed) */
} fp_norm_backward_params;

FP_API fp_status fp_norm_backward_params_default_sized(fp_norm_backward_params *params, size_t struct_size);
/* The exported fp_norm_backward_params_default writes the first published layout (what programs
 * built against 0.2 call); the macro passes the caller's sizeof. */
FP_API void(fp_norm_backward_params_default)(fp_norm_backward_params *params);
#define fp_norm_backward_params_default(params) fp_norm_backward_params_default_sized((params), sizeof *(params))

/* Runs the backward (CUDA: stream-ordered, deterministic: no float atomics;
 * dgamma/dbeta are reduced per block of rows then over blocks in a fixed
 * order). The partial sums live in the context's workspace of the call's
 * stream, grown on first need and kept: once a call ran on a stream at a
 * shape, the same call there makes no allocation, synchronization or device
 * query (both directions are capturable into CUDA graphs; a graph uses its
 * capture stream's workspace: replay it there, or not while calls there run).
 * Errors (outputs untouched): as fp_norm_forward, naming the argument;
 * FP_ERR_OUT_OF_MEMORY if the partial-sum buffer cannot be allocated;
 * FP_ERR_UNSUPPORTED if it must grow while the stream is being captured
 * (run the call once on that stream first). */
FP_API fp_status fp_norm_backward(fp_context *ctx, fp_stream stream,
                                  const fp_norm_backward_params *params);

/* ======================================================================== */
/*  Validate: fused vs unfused, timed, with the error check                 */
/* ======================================================================== */

/* Runs the unfused baseline (separate passes: add; norm; affine; activation,
 * each intermediate stored in the tensor dtype) and the fused forward on the
 * inputs and options of `params`, compares their `out`, then times them A/B
 * with fp_ab_run (cfg NULL: defaults) and fills *report, with the roofline
 * figure from the bytes the fused op must move.
 * The optional outputs that are non-NULL in params select what is fused
 * (residual_out, mean/rstd), but validate writes only to scratch buffers it
 * allocates on ctx: params' output pointers are not written (out may even be
 * NULL). FP_OK means the measurement completed; check
 * report->agreement.passed. Errors: as fp_norm_forward; FP_ERR_OUT_OF_MEMORY
 * for the scratch buffers; the timing engine's errors. */
FP_API fp_status fp_norm_validate(fp_context *ctx, fp_stream stream, const fp_norm_params *params,
                                  const fp_timing_config *cfg, fp_ab_report *report);

/* The same for the backward: the unfused baseline is the activation backward
 * (g = dout * act'(y) written to dx), the norm backward on g in place (dx,
 * dgamma, dbeta) and dx += dresidual_out, each a separate pass. dx is
 * compared. params->dx may be NULL; validate writes only its scratch. */
FP_API fp_status fp_norm_backward_validate(fp_context *ctx, fp_stream stream,
                                           const fp_norm_backward_params *params,
                                           const fp_timing_config *cfg, fp_ab_report *report);

/* Bytes the fused forward must read and write at least for params (the
 * roofline figure of validate and fastbench): every tensor once, the
 * vectors and stats once. 0 for invalid params, with the reason in
 * fp_last_error() (a value-returning call: clear it first to tell, see
 * core.h). Thread-safe. */
FP_API double fp_norm_forward_bytes(const fp_norm_params *params);
/* The same for the backward (dout, x, dresidual_out read once, dx written
 * once, vectors, stats). The CUDA backward reads dout and x once where its
 * one-pass kernel applies (16-byte aligned pointers, cols and strides a
 * multiple of 8 elements (f16/bf16) or 4 (f32), cols <= 16384), plus per-CTA
 * f32 partial sums of dgamma/dbeta (2 x grid x cols x 4 bytes, grid <= 2 x
 * SMs); elsewhere it re-reads dout and x for dgamma/dbeta (at most ~3/5 of
 * this figure's peak). 0 for invalid params, the reason in fp_last_error(). */
FP_API double fp_norm_backward_bytes(const fp_norm_backward_params *params);

#ifdef __cplusplus
}
#endif

#endif /* FASTPATH_NORM_H */
