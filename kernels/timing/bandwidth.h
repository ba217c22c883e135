/* Memory-bound probe kernels used by the timing engine's self-checks and by
 * fastbench's timing/... scenarios (launchers are extern "C"). */
#ifndef FASTPATH_KERNELS_BANDWIDTH_H
#define FASTPATH_KERNELS_BANDWIDTH_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "core/span_stamp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = alpha * x[i] + beta * y[i] over n elements of dtype (0 f32,
 * 1 f16, 2 bf16 as fp_dtype). version 1: one element per thread, scalar
 * loads; version 2: 16-byte vector loads, grid-stride (falls back to v1
 * semantics on misaligned pointers). pdl: launch with programmatic
 * dependent launch (kernels/common/pdl.cuh); stamp: the span its kernel
 * times (the kernel timer, core/span_stamp.h; NULL or a NULL rec: none).
 * Returns the launch's cudaError_t. */
cudaError_t fp_launch_axpby(int version, int dtype, size_t n, float alpha, const void *x,
                            float beta, const void *y, void *out, int sm_count, int pdl,
                            const fp_span_stamp *stamp, cudaStream_t stream);

/* dst[0..bytes) = src[0..bytes) with 16-byte vector loads where aligned. */
cudaError_t fp_launch_copy(void *dst, const void *src, size_t bytes, int sm_count, cudaStream_t stream);

/* One thread writes the GPU's global timer (ns; kernels/common/gtimer.cuh)
 * to *out (device memory): the kernel timer's calibration against the host
 * clock (src/trace). */
cudaError_t fp_launch_clock_read(unsigned long long *out, cudaStream_t stream);

/* Launch probes (fastbench graph/op_host_cost: the platform's floor under
 * an op's host cost): one launch of an empty kernel, <<<1, 32>>>.
 * variant 0: the runtime's launch (cudaLaunchKernel, as every op's
 * kernel<<<>>>), an 8-byte parameter; 1: the same with a 512-byte
 * __grid_constant__ parameter struct (what a large parameter block adds);
 * 2: variant 0's kernel through the driver's cuLaunchKernel (its CUfunction
 * from cudaGetFuncBySymbol, the entry point from
 * cudaGetDriverEntryPointByVersion, both asked once per device): what the
 * runtime's own per-launch work adds. cudaErrorNotSupported where the
 * variant is not available (the CPU emulation has no driver). */
cudaError_t fp_launch_empty(int variant, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
