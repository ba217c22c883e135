/* The ThreadSanitizer build links no CUDA library; src/core/status.c only
 * needs these three for its CUDA error mapping, which the host-only
 * allocator never reaches. */
#include <cuda_runtime_api.h>

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t err) { (void)err; return "CUDA unavailable (TSan build)"; }
const char *cudaGetErrorName(cudaError_t err) { (void)err; return "cudaErrorUnknown"; }
