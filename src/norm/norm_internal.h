/* Internals of the fused-norm capability shared by the API layer (norm.c),
 * the CPU implementations (norm_cpu.c), the double-precision reference
 * (norm_ref.c) and the tests. Not installed. */
#ifndef FP_NORM_INTERNAL_H
#define FP_NORM_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fastpath/norm.h"
#include "half.h"
#include "internal.h"
#include "norm/norm_launch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks params and fills the resolved descriptor (strides never 0). Records
 * a message naming the argument on failure. */
fp_status fp_norm_check_fwd(const fp_norm_params *p, fp_norm_fwd_desc *d);
fp_status fp_norm_check_bwd(const fp_norm_backward_params *p, fp_norm_bwd_desc *d);

/* CPU implementations (synchronous; pool may be NULL: run on the caller).
 * They return FP_ERR_OUT_OF_MEMORY before writing anything if scratch cannot
 * be allocated. */
fp_status fp_norm_fwd_cpu(fp_thread_pool *pool, const fp_norm_fwd_desc *d);
fp_status fp_norm_fwd_cpu_unfused(fp_thread_pool *pool, const fp_norm_fwd_desc *d);
fp_status fp_norm_bwd_cpu(fp_thread_pool *pool, const fp_norm_bwd_desc *d);
fp_status fp_norm_bwd_cpu_unfused(fp_thread_pool *pool, const fp_norm_bwd_desc *d);

/* The numerical oracle: plain loops, double accumulation, single thread,
 * host memory. Same rounding points as the op: the sum s is rounded to the
 * dtype, everything after it is double until the final store. */
fp_status fp_norm_ref_forward(const fp_norm_fwd_desc *d);
fp_status fp_norm_ref_backward(const fp_norm_bwd_desc *d);

/* ---- scalar helpers (host) ---- */

#define FP_NORM_GELU_K 0.7978845608028654   /* sqrt(2/pi) */
#define FP_NORM_GELU_C 0.044715

static inline float fp_norm_act_f(int act, float y) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF: return 0.5f * y * (1.0f + erff(y * 0.70710678118654752f));
    case FP_NORM_ACT_GELU_TANH:
        return 0.5f * y * (1.0f + tanhf((float)FP_NORM_GELU_K * (y + (float)FP_NORM_GELU_C * y * y * y)));
    case FP_NORM_ACT_RELU: return y > 0.0f ? y : 0.0f;
    case FP_NORM_ACT_SILU: return y / (1.0f + expf(-y));
    default: return y;
    }
}
static inline float fp_norm_dact_f(int act, float y) {
    switch (act) {
    case FP_NORM_ACT_GELU_ERF:
        return 0.5f * (1.0f + erff(y * 0.70710678118654752f)) +
               y * 0.39894228040143268f * expf(-0.5f * y * y);
    case FP_NORM_ACT_GELU_TANH: {
        float u = (float)FP_NORM_GELU_K * (y + (float)FP_NORM_GELU_C * y * y * y);
        float t = tanhf(u);
        return 0.5f * (1.0f + t) +
               0.5f * y * (1.0f - t * t) * (float)FP_NORM_GELU_K * (1.0f + 3.0f * (float)FP_NORM_GELU_C * y * y);
    }
    case FP_NORM_ACT_RELU: return y > 0.0f ? 1.0f : 0.0f;
    case FP_NORM_ACT_SILU: {
        float sg = 1.0f / (1.0f + expf(-y));
        return sg * (1.0f + y * (1.0f - sg));
    }
    default: return 1.0f;
    }
}

#ifdef __cplusplus
}
#endif

#endif /* FP_NORM_INTERNAL_H */
