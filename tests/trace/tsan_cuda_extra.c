/* The CUDA entry points the trace layer names beyond those
 * tests/pipeline/tsan_stand_ins.c stands in for: reached only on a CUDA
 * context, which the ThreadSanitizer build of the trace test never has. */
#include <cuda_runtime_api.h>

cudaError_t cudaGetDevice(int *device) {
    (void)device;
    return cudaErrorNoDevice;
}
cudaError_t cudaSetDevice(int device) {
    (void)device;
    return cudaErrorNoDevice;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
    (void)stream;
    (void)status;
    return cudaErrorNoDevice;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaErrorNoDevice; }
