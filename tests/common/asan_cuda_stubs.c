/* AddressSanitizer builds (fp_add_asan_test) compile the library's host C
 * sources again with -fsanitize=address,undefined but not its CUDA kernels
 * (too slow for CI, and nvcc's device code is not what ASan checks). These
 * stand in for the extern "C" launchers the host sources call: each fails
 * cleanly, as a launch on a build without that kernel would. Host code
 * reaches them only on a CUDA context, which needs a device.
 *
 * The prototypes come from the launchers' own headers, so a changed
 * signature is a compile error here; a new launcher is a link error of the
 * ASan tests until it gets a stub below. */
#include <cuda_runtime_api.h>

#include "attention/attention_internal.h"
#include "comm/comm_copy.h"
#include "norm/norm_launch.h"
#include "timing/bandwidth.h"

/* (Parameters are unused: the project builds with -Wno-unused-parameter.) */

/* The emulated-GPU build (tests/emu: fastpath_emu) links these too, for the
 * kernels it does not emulate yet; FP_EMU_HAS_<X> drops the stubs of the
 * kernels it runs. */
#if !defined(FP_EMU_HAS_ATTENTION)
/* ---- attention (kernels/attention) ---- */
static fp_status no_kernels(const char *launcher) {
    return fp_set_error(FP_ERR_UNSUPPORTED,
                        "%s: this CUDA kernel is not linked into this build (ASan tests, or not yet emulated)",
                        launcher);
}
int fp_attn_cuda_flash_supported(fp_dtype dtype, int head_dim) {
    return 0;
}
int fp_attn_cuda_flash_kv8_supported(int head_dim) {
    return 0;
}
fp_status fp_attn_cuda_flash(const fp_attn_args *a, int version, int sm_count, int cc, cudaStream_t stream) {
    return no_kernels("fp_attn_cuda_flash");
}
fp_status fp_attn_cuda_flash_splits(const fp_attn_args *a, int num_splits, cudaStream_t stream) {
    return no_kernels("fp_attn_cuda_flash_splits");
}
fp_status fp_attn_cuda_flash_version(const fp_attn_args *a, int version, int num_splits, cudaStream_t stream) {
    return no_kernels("fp_attn_cuda_flash_version");
}
fp_status fp_attn_cuda_rowwise(const fp_attn_args *a, cudaStream_t stream) {
    return no_kernels("fp_attn_cuda_rowwise");
}
fp_status fp_attn_cuda_masked_softmax(const fp_attn_args *a, void *scores, cudaStream_t stream) {
    return no_kernels("fp_attn_cuda_masked_softmax");
}
fp_status fp_attn_cuda_gather_pages(const fp_attn_args *a, void *k_dense, void *v_dense, cudaStream_t stream) {
    return no_kernels("fp_attn_cuda_gather_pages");
}
fp_status fp_attn_cuda_zero_rows(const fp_attn_args *a, int64_t o0, int sq, cudaStream_t stream) {
    return no_kernels("fp_attn_cuda_zero_rows");
}

#endif

#if !defined(FP_EMU_HAS_NORM)
/* ---- norm (kernels/norm): cudaError_t launchers ---- */
cudaError_t fp_norm_fwd_launch(const fp_norm_fwd_desc *d, int version, cudaStream_t stream) {
    return cudaErrorNotSupported;
}
cudaError_t fp_norm_fwd_unfused_launch(const fp_norm_fwd_desc *d, cudaStream_t stream) {
    return cudaErrorNotSupported;
}
size_t fp_norm_bwd_partial_floats(const fp_norm_bwd_desc *d, int version, int sm_count) {
    return 0;
}
int fp_norm_bwd_version_used(const fp_norm_bwd_desc *d, int version) {
    return 1;
}
cudaError_t fp_norm_bwd_launch(const fp_norm_bwd_desc *d, int version, int sm_count, float *partial,
                               cudaStream_t stream) {
    return cudaErrorNotSupported;
}
cudaError_t fp_norm_bwd_unfused_launch(const fp_norm_bwd_desc *d, float *partial, cudaStream_t stream) {
    return cudaErrorNotSupported;
}

#endif

#if !defined(FP_EMU_HAS_TIMING)
/* ---- timing probes (kernels/timing) ---- */
cudaError_t fp_launch_axpby(int version, int dtype, size_t n, float alpha, const void *x, float beta,
                            const void *y, void *out, int sm_count, int pdl, const fp_span_stamp *stamp,
                            cudaStream_t stream) {
    return cudaErrorNotSupported;
}
cudaError_t fp_launch_copy(void *dst, const void *src, size_t bytes, int sm_count, cudaStream_t stream) {
    return cudaErrorNotSupported;
}
cudaError_t fp_launch_empty(int variant, cudaStream_t stream) { return cudaErrorNotSupported; }
cudaError_t fp_launch_clock_read(unsigned long long *out, cudaStream_t stream) { return cudaErrorNotSupported; }
#endif

#if !defined(FP_EMU_HAS_COMM)
/* ---- the buckets' gather / scatter (kernels/comm) ---- */
cudaError_t fp_launch_copies(const fp_copy_desc *d_descs, int n, size_t max_bytes, cudaStream_t stream) {
    return cudaErrorNotSupported;
}
#endif
