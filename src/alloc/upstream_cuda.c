/* CUDA pieces of the caching allocator: the device and pinned-host upstreams
 * (cudaHostAlloc, and cudaHostRegister over the region upstream) and CUDA
 * event ops. Kept apart from the policy so host-only builds (the
 * ThreadSanitizer test) can leave them out. The device index travels in the
 * opaque pointer as (device + 1). */
#include <stdint.h>

#include "alloc/alloc_internal.h"
#include "fastpath/alloc.h"
#include "internal.h"

static inline int dev_of(void *opaque) { return (int)(intptr_t)opaque - 1; }

/* Makes `dev` current only when it is not already (cudaGetDevice is cheap). */
static cudaError_t use_device(int dev) {
    int cur = -1;
    cudaError_t err = cudaGetDevice(&cur);
    if (err != cudaSuccess) return err;
    return cur == dev ? cudaSuccess : cudaSetDevice(dev);
}

static fp_status map_error(cudaError_t err, const char *what, size_t bytes) {
    (void)cudaGetLastError(); /* clear it so it does not leak into later calls */
    fp_status st = err == cudaErrorMemoryAllocation ? FP_ERR_OUT_OF_MEMORY : FP_ERR_CUDA;
    return fp_set_error(st, "%s(%zu bytes) failed: %s", what, bytes, cudaGetErrorString(err));
}

static fp_status device_alloc(void *opaque, size_t bytes, void **out) {
    cudaError_t err = use_device(dev_of(opaque));
    if (err == cudaSuccess) err = cudaMalloc(out, bytes);
    return err == cudaSuccess ? FP_OK : map_error(err, "cudaMalloc", bytes);
}

static void device_free(void *opaque, void *ptr, size_t bytes) {
    (void)bytes;
    if (use_device(dev_of(opaque)) == cudaSuccess) (void)cudaFree(ptr);
    (void)cudaGetLastError();
}

static size_t device_total(void *opaque) {
    size_t free_b = 0, total = 0;
    if (use_device(dev_of(opaque)) != cudaSuccess || cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return total;
}

static fp_status pinned_alloc(void *opaque, size_t bytes, void **out) {
    cudaError_t err = use_device(dev_of(opaque));
    if (err == cudaSuccess) err = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    return err == cudaSuccess ? FP_OK : map_error(err, "cudaHostAlloc", bytes);
}

static void pinned_free(void *opaque, void *ptr, size_t bytes) {
    (void)opaque;
    (void)bytes;
    (void)cudaFreeHost(ptr);
    (void)cudaGetLastError();
}

static fp_status check_device(int device) {
    int n = 0;
    FP_TRY(fp_device_count(&n));
    if (device < 0 || device >= n)
        return fp_set_error(FP_ERR_NO_DEVICE, "argument 'device' (%d): %d CUDA device(s) present",
                            device, n);
    return FP_OK;
}

fp_status fp_alloc_upstream_device(int device, fp_alloc_upstream *out) {
    FP_CHECK_NOT_NULL(out);
    FP_TRY(check_device(device));
    fp_alloc_upstream u = {device_alloc, device_free, device_total, (void *)(intptr_t)(device + 1)};
    *out = u;
    return FP_OK;
}

fp_status fp_alloc_upstream_pinned(int device, fp_alloc_upstream *out) {
    FP_CHECK_NOT_NULL(out);
    FP_TRY(check_device(device));
    fp_alloc_upstream u = {pinned_alloc, pinned_free, NULL, (void *)(intptr_t)(device + 1)};
    *out = u;
    return FP_OK;
}

static void unregister_host(void *base, size_t bytes, int device) {
    (void)bytes;
    if (use_device(device) == cudaSuccess) (void)cudaHostUnregister(base);
    (void)cudaGetLastError();
}

fp_status fp_alloc_upstream_registered(int device, void *base, size_t bytes, fp_alloc_upstream *out) {
    FP_CHECK_NOT_NULL(out);
    fp_alloc_upstream u;
    FP_TRY(fp_alloc_upstream_region(base, bytes, &u)); /* validates base and bytes */
    fp_status st = check_device(device);
    cudaError_t err = cudaSuccess;
    if (st == FP_OK) err = use_device(device);
    if (st == FP_OK && err == cudaSuccess) err = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
    if (st == FP_OK && err != cudaSuccess) st = map_error(err, "cudaHostRegister", bytes);
    if (st != FP_OK) {
        fp_alloc_upstream_release(&u);
        return st;
    }
    fp_alloc_region_set_release(&u, device, unregister_host);
    *out = u;
    return FP_OK;
}

/* ---- events ---- */

static fp_status ev_record(void *opaque, fp_stream stream, void **event) {
    /* An event recorded on a capturing stream would become a graph node and
     * never complete on its own: refuse, the allocator retries later. */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess) (void)cudaGetLastError();
    if (cs != cudaStreamCaptureStatusNone)
        return fp_set_error(FP_ERR_UNSUPPORTED, "stream %p is capturing: event deferred", stream);
    cudaEvent_t e = NULL;
    cudaError_t err = use_device(dev_of(opaque));
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err == cudaSuccess) {
        err = cudaEventRecord(e, (cudaStream_t)stream);
        if (err != cudaSuccess) (void)cudaEventDestroy(e);
    }
    if (err != cudaSuccess) return map_error(err, "cudaEventRecord", 0);
    *event = e;
    return FP_OK;
}

static int ev_query(void *opaque, void *event) {
    (void)opaque;
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    /* Success, or an error: count it as done so the block does not leak. */
    (void)cudaGetLastError();
    return 1;
}

static void ev_sync(void *opaque, void *event) {
    (void)opaque;
    (void)cudaEventSynchronize((cudaEvent_t)event);
    (void)cudaGetLastError();
}

static void ev_destroy(void *opaque, void *event) {
    (void)opaque;
    (void)cudaEventDestroy((cudaEvent_t)event);
}

static fp_status ev_check_stream(void *opaque, fp_stream stream) {
    /* The legacy and per-thread default streams follow the current device. */
    if (stream == NULL || (cudaStream_t)stream == cudaStreamLegacy ||
        (cudaStream_t)stream == cudaStreamPerThread)
        return FP_OK;
#if CUDART_VERSION >= 12080
    int dev = -1;
    cudaError_t err = cudaStreamGetDevice((cudaStream_t)stream, &dev);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "stream %p: cudaStreamGetDevice failed: %s",
                            stream, cudaGetErrorString(err));
    }
    if (dev != dev_of(opaque))
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "stream %p belongs to device %d, the allocator to device %d", stream, dev,
                            dev_of(opaque));
#else
    (void)opaque;
#endif
    return FP_OK;
}

fp_status fp_alloc_event_ops_cuda(int device, fp_alloc_event_ops *out) {
    FP_CHECK_NOT_NULL(out);
    FP_TRY(check_device(device));
    fp_alloc_event_ops ops = {ev_record, ev_query, ev_sync, ev_destroy, ev_check_stream,
                              (void *)(intptr_t)(device + 1)};
    *out = ops;
    return FP_OK;
}

fp_status fp_alloc_create_for_context(fp_context *ctx, const fp_alloc_config *cfg, fp_allocator **out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(out);
    if (ctx->kind == FP_DEVICE_CPU) {
        fp_alloc_upstream up = fp_alloc_upstream_host();
        return fp_alloc_create(&up, NULL, cfg, out);
    }
    fp_alloc_upstream up;
    fp_alloc_event_ops ev;
    FP_TRY(fp_alloc_upstream_device(ctx->device, &up));
    FP_TRY(fp_alloc_event_ops_cuda(ctx->device, &ev));
    return fp_alloc_create(&up, &ev, cfg, out);
}
