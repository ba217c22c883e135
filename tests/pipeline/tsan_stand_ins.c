/* Stand-ins for the ThreadSanitizer builds of the pipeline tests
 * (test_pinned_tsan, test_pipeline_tsan): they link the pipeline's and the
 * pinned pool's host code, the caching allocator, the thread pool and
 * core's status code, but no context code and no CUDA. A CPU context is all
 * that code reads (its kind); memory helpers are malloc; the CUDA entry
 * points exist only so that the CUDA branches link: on a CPU context they
 * are never reached, and fail loudly if they were. */
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "alloc/alloc_internal.h"
#include "internal.h"

fp_status fp_ctx_check(const fp_context *ctx, int want_kind) {
    (void)want_kind;
    return ctx ? FP_OK : fp_set_error(FP_ERR_INVALID_ARGUMENT, "argument 'ctx' is NULL");
}
fp_status fp_context_create(fp_device_kind kind, int device_index, fp_context **out) {
    static struct fp_context cpu;
    (void)device_index;
    cpu.kind = kind;
    cpu.device = -1;
    *out = &cpu;
    return FP_OK;
}
void fp_context_destroy(fp_context *ctx) { (void)ctx; }
fp_device_kind fp_context_kind(const fp_context *ctx) { return ctx ? ctx->kind : FP_DEVICE_CPU; }

static fp_status no_cuda(void) { return fp_set_error(FP_ERR_INTERNAL, "CUDA called in host mode"); }
fp_status fp_ctx_activate(const fp_context *ctx) {
    (void)ctx;
    return no_cuda();
}
fp_status fp_mem_alloc(fp_context *ctx, size_t bytes, void **out) {
    (void)ctx;
    *out = aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *out ? FP_OK : fp_set_error(FP_ERR_OUT_OF_MEMORY, "%zu bytes", bytes);
}
fp_status fp_mem_free(fp_context *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
    return FP_OK;
}
fp_status fp_alloc_host_register(int device, void *base, size_t bytes) {
    (void)device;
    (void)base;
    (void)bytes;
    return no_cuda();
}
fp_status fp_alloc_host_unregister(int device, void *base) {
    (void)device;
    (void)base;
    return no_cuda();
}
fp_status fp_alloc_event_ops_cuda(int device, fp_alloc_event_ops *out) {
    (void)device;
    (void)out;
    return no_cuda();
}

static cudaError_t never(void) {
    abort(); /* a CPU context reached a CUDA branch: a bug the test must show */
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) { (void)a; (void)p; return never(); }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    (void)d; (void)s; (void)n; (void)k; (void)st;
    return never();
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { (void)e; (void)s; return never(); }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) { (void)s; (void)e; (void)f; return never(); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; return never(); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) { (void)ms; (void)a; (void)b; return never(); }
cudaError_t cudaEventCreate(cudaEvent_t *e) { (void)e; return never(); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { (void)e; return never(); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) { (void)s; (void)f; return never(); }
cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return never(); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int f) { (void)p; (void)n; (void)f; return never(); }
cudaError_t cudaFreeHost(void *p) { (void)p; return never(); }
