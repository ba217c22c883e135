/* CUDA pieces of the caching allocator: the device and pinned-host upstreams
 * (cudaHostAlloc, and cudaHostRegister over the region upstream), CUDA
 * event ops and the stream-wait op (cudaStreamWaitEvent). Kept apart from the policy so host-only builds (the
 * ThreadSanitizer test) can leave them out. The device index travels in the
 * opaque pointer as (device + 1). */
#include <stdint.h>

#include "alloc/alloc_internal.h"
#include "fastpath/alloc.h"
#include "internal.h"

static inline int dev_of(void *opaque) { return (int)(intptr_t)opaque - 1; }

/* Consumes the error of a failed call of ours, so that it does not show up in
 * the caller's next cudaGetLastError. Successful calls leave the last-error
 * state alone: clearing it unconditionally would swallow an error the caller
 * had pending (say a failed launch it has not checked yet). */
static void consume(cudaError_t err) {
    if (err != cudaSuccess) (void)cudaGetLastError();
}

/* Makes `dev` current for one upstream / event call; *prev receives the
 * calling thread's device, which restore_device puts back (PyTorch, for one,
 * frees a tensor of device 1 with device 0 current and keeps launching on
 * device 0 afterwards: the allocator must not move the thread). Only when
 * they differ is cudaSetDevice called (cudaGetDevice is cheap). */
static cudaError_t use_device(int dev, int *prev) {
    *prev = -1;
    cudaError_t err = cudaGetDevice(prev);
    if (err != cudaSuccess) {
        *prev = -1;
        return err;
    }
    return *prev == dev ? cudaSuccess : cudaSetDevice(dev);
}

static void restore_device(int dev, int prev) {
    if (prev >= 0 && prev != dev) consume(cudaSetDevice(prev));
}

static fp_status map_error(cudaError_t err, const char *what, size_t bytes) {
    consume(err); /* clear it so it does not leak into later calls */
    fp_status st = err == cudaErrorMemoryAllocation ? FP_ERR_OUT_OF_MEMORY : FP_ERR_CUDA;
    return fp_set_error(st, "%s(%zu bytes) failed: %s", what, bytes, cudaGetErrorString(err));
}

/* cudaMalloc in the relaxed capture mode, as PyTorch's allocator does: under
 * the default (global) mode a cudaMalloc while any thread captures a graph
 * fails with cudaErrorStreamCaptureUnsupported and invalidates that capture,
 * so a cache miss during a capture into a private pool (fp_alloc_pool_begin)
 * could never reserve a segment, and one on another thread would break the
 * capture. cudaMalloc is not stream-ordered: the segment simply stays valid
 * for the graph (the private pool keeps it). */
static int relaxed_begin(enum cudaStreamCaptureMode *saved) {
    *saved = cudaStreamCaptureModeRelaxed;
    cudaError_t err = cudaThreadExchangeStreamCaptureMode(saved);
    consume(err);
    return err == cudaSuccess;
}
static void relaxed_end(int began, enum cudaStreamCaptureMode *saved) {
    if (began) consume(cudaThreadExchangeStreamCaptureMode(saved));
}

static cudaError_t malloc_relaxed(void **out, size_t bytes) {
    enum cudaStreamCaptureMode mode;
    int began = relaxed_begin(&mode);
    cudaError_t err = cudaMalloc(out, bytes);
    relaxed_end(began, &mode);
    return err;
}

static fp_status device_alloc(void *opaque, size_t bytes, void **out) {
    int prev;
    cudaError_t err = use_device(dev_of(opaque), &prev);
    if (err == cudaSuccess) err = malloc_relaxed(out, bytes);
    restore_device(dev_of(opaque), prev);
    return err == cudaSuccess ? FP_OK : map_error(err, "cudaMalloc", bytes);
}

static void device_free(void *opaque, void *ptr, size_t bytes) {
    (void)bytes;
    int prev;
    cudaError_t err = use_device(dev_of(opaque), &prev);
    if (err == cudaSuccess) err = cudaFree(ptr);
    consume(err);
    restore_device(dev_of(opaque), prev);
}

static size_t device_total(void *opaque) {
    size_t free_b = 0, total = 0;
    int prev;
    cudaError_t err = use_device(dev_of(opaque), &prev);
    if (err == cudaSuccess) err = cudaMemGetInfo(&free_b, &total);
    consume(err);
    restore_device(dev_of(opaque), prev);
    return err == cudaSuccess ? total : 0;
}

static fp_status pinned_alloc(void *opaque, size_t bytes, void **out) {
    int prev;
    cudaError_t err = use_device(dev_of(opaque), &prev);
    if (err == cudaSuccess) err = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
    restore_device(dev_of(opaque), prev);
    return err == cudaSuccess ? FP_OK : map_error(err, "cudaHostAlloc", bytes);
}

static void pinned_free(void *opaque, void *ptr, size_t bytes) {
    (void)opaque;
    (void)bytes;
    consume(cudaFreeHost(ptr));
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

fp_status fp_alloc_host_register(int device, void *base, size_t bytes) {
    int prev;
    cudaError_t err = use_device(device, &prev);
    if (err == cudaSuccess) err = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
    restore_device(device, prev);
    return err == cudaSuccess ? FP_OK : map_error(err, "cudaHostRegister", bytes);
}

fp_status fp_alloc_host_unregister(int device, void *base) {
    int prev;
    cudaError_t err = use_device(device, &prev);
    if (err == cudaSuccess) err = cudaHostUnregister(base);
    restore_device(device, prev);
    return err == cudaSuccess ? FP_OK : map_error(err, "cudaHostUnregister", 0);
}

static void unregister_host(void *base, size_t bytes, int device) {
    (void)bytes;
    (void)fp_alloc_host_unregister(device, base);
}

fp_status fp_alloc_upstream_registered(int device, void *base, size_t bytes, fp_alloc_upstream *out) {
    FP_CHECK_NOT_NULL(out);
    fp_alloc_upstream u;
    FP_TRY(fp_alloc_upstream_region(base, bytes, &u)); /* validates base and bytes */
    fp_status st = check_device(device);
    if (st == FP_OK) st = fp_alloc_host_register(device, base, bytes);
    if (st != FP_OK) {
        fp_alloc_upstream_release(&u);
        return st;
    }
    fp_alloc_region_set_release(&u, device, unregister_host);
    *out = u;
    return FP_OK;
}

/* ---- events ---- */

/* Capture status of `stream` for ev_record and the stream wait: FP_OK when it is not
 * capturing; FP_ERR_UNSUPPORTED ("not now") when it is, or when the status
 * cannot be read (e.g. cudaErrorStreamCaptureImplicit for the legacy stream
 * while another thread captures: any call there could break that capture). */
static fp_status not_capturing(fp_stream stream, const char *what) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t qerr = cudaStreamIsCapturing((cudaStream_t)stream, &cs);
    if (qerr != cudaSuccess) {
        consume(qerr);
        return fp_set_error(FP_ERR_UNSUPPORTED, "stream %p: cudaStreamIsCapturing failed (%s): %s", stream,
                            cudaGetErrorString(qerr), what);
    }
    if (cs != cudaStreamCaptureStatusNone)
        return fp_set_error(FP_ERR_UNSUPPORTED, "stream %p is capturing: %s", stream, what);
    return FP_OK;
}

static fp_status ev_record(void *opaque, fp_stream stream, void **event) {
    /* An event recorded on a capturing stream would become a graph node and
     * never complete on its own: refuse, the allocator retries later (also
     * when the status is unknown: "not now", retried on a later slow path). */
    FP_TRY(not_capturing(stream, "event deferred"));
    cudaEvent_t e = NULL;
    int prev;
    cudaError_t err = use_device(dev_of(opaque), &prev);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err == cudaSuccess) {
        err = cudaEventRecord(e, (cudaStream_t)stream);
        if (err != cudaSuccess) (void)cudaEventDestroy(e);
    }
    restore_device(dev_of(opaque), prev);
    if (err != cudaSuccess) return map_error(err, "cudaEventRecord", 0);
    *event = e;
    return FP_OK;
}

static int ev_query(void *opaque, void *event) {
    (void)opaque;
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);
    if (err == cudaErrorNotReady) {
        /* Not an error; clear it only if the runtime recorded it, so an
         * error the caller had pending stays for the caller. */
        if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
        return 0;
    }
    /* Success, or an error: count it as done so the block does not leak. */
    consume(err);
    return 1;
}

static void ev_sync(void *opaque, void *event) {
    (void)opaque;
    consume(cudaEventSynchronize((cudaEvent_t)event));
}

static void ev_destroy(void *opaque, void *event) {
    (void)opaque;
    consume(cudaEventDestroy((cudaEvent_t)event));
}

static fp_status ev_check_stream(void *opaque, fp_stream stream) {
    /* The legacy and per-thread default streams follow the current device. */
    if (stream == NULL || (cudaStream_t)stream == cudaStreamLegacy ||
        (cudaStream_t)stream == cudaStreamPerThread)
        return FP_OK;
#if CUDART_VERSION >= 12080
    /* A stream being captured (a private pool's capture: this check runs on
     * its cache misses) is not asked: cudaStreamGetDevice is not a call to
     * make on a capturing stream, and a refused call may invalidate the
     * capture. Otherwise ask in the relaxed mode, so that a capture running
     * on another thread in the global mode is not disturbed. */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t err = cudaStreamIsCapturing((cudaStream_t)stream, &cs);
    if (err == cudaSuccess && cs != cudaStreamCaptureStatusNone) return FP_OK;
    int dev = -1;
    if (err == cudaSuccess) {
        enum cudaStreamCaptureMode mode;
        int began = relaxed_begin(&mode);
        err = cudaStreamGetDevice((cudaStream_t)stream, &dev);
        relaxed_end(began, &mode);
    }
    if (err != cudaSuccess) {
        consume(err);
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "stream %p: cannot tell its device: %s",
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

fp_status fp_alloc_stream_wait_cuda(void *opaque, fp_stream stream, void *event) {
    /* A wait enqueued on a capturing stream would become a graph node (and
     * an event recorded outside the capture cannot be waited on there). */
    FP_TRY(not_capturing(stream, "no stream wait"));
    int prev;
    cudaError_t err = use_device(dev_of(opaque), &prev); /* the legacy stream is the current device's */
    if (err == cudaSuccess) err = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
    restore_device(dev_of(opaque), prev);
    if (err != cudaSuccess) return map_error(err, "cudaStreamWaitEvent", 0);
    return FP_OK;
}

fp_status fp_alloc_create_device(int device, const fp_alloc_config *cfg, fp_allocator **out) {
    fp_alloc_upstream up;
    fp_alloc_event_ops ev;
    FP_TRY(fp_alloc_upstream_device(device, &up));
    FP_TRY(fp_alloc_event_ops_cuda(device, &ev));
    fp_allocator *a = NULL;
    FP_TRY(fp_alloc_create(&up, &ev, cfg, &a));
    fp_status st = fp_alloc_set_stream_wait(a, fp_alloc_stream_wait_cuda);
    if (st != FP_OK) {
        fp_alloc_destroy(a);
        return st;
    }
    *out = a;
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
    return fp_alloc_create_device(ctx->device, cfg, out);
}
