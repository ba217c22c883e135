/* ThreadSanitizer builds link no CUDA library (host logic only);
 * src/core/status.c names these three for its CUDA error mapping, which host
 * code never reaches. fp_add_tsan_test adds this file to every TSan target. */
#include <cuda_runtime_api.h>

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t err) { (void)err; return "CUDA unavailable (TSan build)"; }
const char *cudaGetErrorName(cudaError_t err) { (void)err; return "cudaErrorUnknown"; }
