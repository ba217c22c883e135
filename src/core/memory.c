/* Plain memory helpers so tests, fastbench and bindings are device-agnostic:
 * CUDA contexts use device memory, CPU contexts 256-byte aligned host memory. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

fp_status fp_mem_alloc(fp_context *ctx, size_t bytes, void **out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(bytes > 0, "argument 'bytes' is 0");
    FP_CHECK_ARG(bytes <= SIZE_MAX - 255, "argument 'bytes' (%zu) overflows when rounded", bytes);
    void *p = NULL;
    if (ctx->kind == FP_DEVICE_CPU) {
        p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
        if (!p) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", bytes);
    } else {
        FP_TRY(fp_ctx_activate(ctx));
        cudaError_t err = cudaMalloc(&p, bytes);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            return fp_set_error(err == cudaErrorMemoryAllocation ? FP_ERR_OUT_OF_MEMORY : FP_ERR_CUDA,
                                "cudaMalloc(%zu bytes) failed: %s", bytes, cudaGetErrorString(err));
        }
    }
    *out = p;
    return FP_OK;
}

fp_status fp_mem_free(fp_context *ctx, void *ptr) {
    FP_TRY(fp_ctx_check(ctx, -1));
    if (!ptr) return FP_OK;
    if (ctx->kind == FP_DEVICE_CPU) {
        free(ptr);
        return FP_OK;
    }
    FP_TRY(fp_ctx_activate(ctx));
    FP_CUDA_TRY(cudaFree(ptr));
    return FP_OK;
}

static fp_status copy(fp_context *ctx, void *dst, const void *src, size_t bytes, fp_stream stream,
                      enum cudaMemcpyKind kind) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(dst);
    FP_CHECK_NOT_NULL(src);
    if (bytes == 0) return FP_OK;
    /* a host<->device copy: the verdict's "transfer" (trace.h) */
    const char *name = kind == cudaMemcpyHostToDevice ? "h2d" : "d2h";
    if (ctx->kind == FP_DEVICE_CPU) {
        uint64_t span = fp_ctx_trace_begin(ctx, stream, name, "transfer", (double)bytes, 0);
        memmove(dst, src, bytes);
        fp_ctx_trace_end(ctx, span);
        return FP_OK;
    }
    FP_TRY(fp_ctx_activate(ctx));
    uint64_t span = fp_ctx_trace_begin(ctx, stream, name, "transfer", (double)bytes, 0);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, fp_ctx_stream(ctx, stream));
    fp_ctx_trace_end(ctx, span);
    if (e != cudaSuccess) return fp_cuda_status(e, "cudaMemcpyAsync", __FILE__, __LINE__);
    return FP_OK;
}

fp_status fp_mem_upload(fp_context *ctx, void *dst, const void *host_src, size_t bytes,
                        fp_stream stream) {
    return copy(ctx, dst, host_src, bytes, stream, cudaMemcpyHostToDevice);
}

fp_status fp_mem_download(fp_context *ctx, void *host_dst, const void *src, size_t bytes,
                          fp_stream stream) {
    return copy(ctx, host_dst, src, bytes, stream, cudaMemcpyDeviceToHost);
}

fp_status fp_mem_fill(fp_context *ctx, void *dst, int value, size_t bytes, fp_stream stream) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(dst);
    if (bytes == 0) return FP_OK;
    if (ctx->kind == FP_DEVICE_CPU) {
        memset(dst, value, bytes);
        return FP_OK;
    }
    FP_TRY(fp_ctx_activate(ctx));
    FP_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, fp_ctx_stream(ctx, stream)));
    return FP_OK;
}
