/* Memory-bound probe ops behind the timing engine's self-checks and the
 * timing/... fastbench scenarios. Internal (fastbench links the static
 * library). */
#ifndef FASTPATH_TIMING_PROBES_H
#define FASTPATH_TIMING_PROBES_H

#include "fastpath/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = alpha * x + beta * y over n elements of dtype (f32/f16/bf16).
 * version 1: naive (GPU: scalar per-thread; CPU: one thread, per-element
 * dtype dispatch); version 2: optimized (GPU: 16-byte vectors; CPU: worker
 * pool, dtype-specialized loops). */
fp_status fp_axpby(fp_context *ctx, fp_stream stream, int version, fp_dtype dtype, size_t n,
                   float alpha, const void *x, float beta, const void *y, void *out);
/* The same with its kernel timing span `stamp` (the kernel timer:
 * fp_ctx_trace_begin_stamped, internal.h; NULL: none). */
struct fp_span_stamp;
fp_status fp_axpby_stamped(fp_context *ctx, fp_stream stream, int version, fp_dtype dtype, size_t n, float alpha,
                           const void *x, float beta, const void *y, void *out, const struct fp_span_stamp *stamp);

/* Device-to-device copy. version 1: cudaMemcpyAsync / memcpy; version 2:
 * vector copy kernel / memcpy split over the worker pool. */
fp_status fp_copy(fp_context *ctx, fp_stream stream, int version, void *dst, const void *src,
                  size_t bytes);

/* One launch of an empty kernel (fp_launch_empty's variant 0, 1 or 2): the
 * floor under an op's host cost, nothing else done (no device check or
 * switch). CUDA contexts only; FP_ERR_UNSUPPORTED where the variant is not
 * available (the driver launch under the CPU emulation). */
fp_status fp_launch_probe(fp_context *ctx, fp_stream stream, int variant);

#ifdef __cplusplus
}
#endif

#endif
