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
/* the kernel timer's records and clock (trace.c: fit_stamps, calibrate,
 * resolve_kernel_locked) */
cudaError_t cudaMalloc(void **p, size_t n) {
    (void)p;
    (void)n;
    return cudaErrorNoDevice;
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    (void)p;
    (void)v;
    (void)n;
    return cudaErrorNoDevice;
}
cudaError_t cudaFree(void *p) {
    (void)p;
    return cudaErrorNoDevice;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    (void)d;
    (void)s;
    (void)n;
    (void)k;
    return cudaErrorNoDevice;
}
cudaError_t fp_launch_clock_read(unsigned long long *out, cudaStream_t stream);
cudaError_t fp_launch_clock_read(unsigned long long *out, cudaStream_t stream) {
    (void)out;
    (void)stream;
    return cudaErrorNoDevice;
}
