/* Execution contexts: a CUDA device (stream, cuBLASLt handle, workspace) or
 * the CPU (worker pool). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define FP_DEFAULT_WORKSPACE_BYTES (32u << 20)

fp_status fp_ctx_check(const fp_context *ctx, int want_kind) {
    if (!ctx) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "argument 'ctx' is NULL");
    if (want_kind >= 0 && (int)ctx->kind != want_kind)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "context is a %s context, expected %s",
                            ctx->kind == FP_DEVICE_CUDA ? "CUDA" : "CPU",
                            want_kind == FP_DEVICE_CUDA ? "CUDA" : "CPU");
    return FP_OK;
}

/* Every CUDA op calls this: cudaSetDevice only when the thread's current
 * device differs. cudaGetDevice reads the thread's runtime state (no driver
 * round trip, legal during capture), so a device the caller set between
 * calls is seen, which a library-side cache of "the device this library
 * last set" would miss. */
fp_status fp_ctx_activate(const fp_context *ctx) {
    if (ctx->kind != FP_DEVICE_CUDA) return FP_OK;
    int cur = -1;
    FP_CUDA_TRY(cudaGetDevice(&cur));
    if (cur != ctx->device) FP_CUDA_TRY(cudaSetDevice(ctx->device));
    return FP_OK;
}

/* FP_CTX_LAUNCH_PDL's value v (-1 off, 0 default, 1 on) resolved for ctx:
 * on only where asked and the device has programmatic dependent launch
 * (compute capability 9.0+). The default is off: no GPU has measured it yet
 * (benchmarks/NOTES.md, session 22). */
static int resolve_pdl(const fp_context *ctx, int64_t v) {
    return ctx->kind == FP_DEVICE_CUDA && v == 1 && ctx->info.cc_major >= 9;
}

/* FASTPATH_PDL=1 / =0 at a context's creation: FP_CTX_LAUNCH_PDL 1 / -1
 * (anything else: the default), so that a process can turn it on for every
 * context (fastbench's A/B runs, the torch drop-ins' contexts). */
static int64_t pdl_env(void) {
    const char *e = getenv("FASTPATH_PDL");
    if (!e || !*e) return 0;
    if (strcmp(e, "1") == 0) return 1;
    if (strcmp(e, "0") == 0) return -1;
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
        fprintf(stderr, "fastpath: FASTPATH_PDL=%s ignored (1: programmatic dependent launch on, 0: off)\n", e);
    return 0;
}

static int default_cpu_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static fp_status cuda_context_init(fp_context *ctx, int index) {
    fp_device_info_init(&ctx->info);
    FP_TRY(fp_device_get_info(index, &ctx->info));
    ctx->device = index;
    FP_CUDA_TRY(cudaSetDevice(index));
    FP_CUDA_TRY(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    cublasLtHandle_t lt = NULL;
    cublasStatus_t cs = cublasLtCreate(&lt);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return fp_set_error(FP_ERR_CUBLAS, "cublasLtCreate failed: %s", cublasLtGetStatusString(cs));
    ctx->cublaslt = lt;
    ctx->workspace_bytes = FP_DEFAULT_WORKSPACE_BYTES;
    FP_CUDA_TRY(cudaMalloc(&ctx->workspace, ctx->workspace_bytes));
    /* The scratch pool (fp_scratch_malloc): optional, so a device or driver
     * without memory pools falls back to cudaMallocAsync. */
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = index;
    cudaMemPool_t pool = NULL;
    if (cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
        uint64_t keep = FP_SCRATCH_KEEP_BYTES;
        if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess) {
            ctx->scratch_pool = pool;
        } else {
            (void)cudaGetLastError();
            cudaMemPoolDestroy(pool);
        }
    } else {
        (void)cudaGetLastError();
    }
    return FP_OK;
}

fp_status fp_context_create(fp_device_kind kind, int device_index, fp_context **out) {
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(kind == FP_DEVICE_CPU || kind == FP_DEVICE_CUDA, "unknown device kind %d", (int)kind);
    fp_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "context");
    ctx->kind = kind;
    ctx->device = -1;
    ctx->nvtx = fp_nvtx_env_enabled();
    if (pthread_mutex_init(&ctx->cublas_mu, NULL) != 0) {
        free(ctx);
        return fp_set_error(FP_ERR_INTERNAL, "context: pthread_mutex_init failed");
    }
    if (pthread_mutex_init(&ctx->ws_mu, NULL) != 0) {
        pthread_mutex_destroy(&ctx->cublas_mu);
        free(ctx);
        return fp_set_error(FP_ERR_INTERNAL, "context: pthread_mutex_init failed");
    }
    if (pthread_mutex_init(&ctx->ws_aux_mu, NULL) != 0) {
        pthread_mutex_destroy(&ctx->ws_mu);
        pthread_mutex_destroy(&ctx->cublas_mu);
        free(ctx);
        return fp_set_error(FP_ERR_INTERNAL, "context: pthread_mutex_init failed");
    }
    fp_status st;
    if (kind == FP_DEVICE_CUDA) {
        st = cuda_context_init(ctx, device_index);
    } else {
        fp_device_info_init(&ctx->info);
        st = fp_cpu_get_info(&ctx->info);
        if (st == FP_OK) st = fp_thread_pool_create(default_cpu_threads(), &ctx->pool);
    }
    if (st != FP_OK) {
        fp_context_destroy(ctx); /* keeps the detail message: destroy sets none */
        return st;
    }
    ctx->launch_pdl = resolve_pdl(ctx, pdl_env());
    *out = ctx;
    return FP_OK;
}

void fp_context_destroy(fp_context *ctx) {
    if (!ctx) return;
    if (ctx->kind == FP_DEVICE_CUDA && ctx->device >= 0) {
        cudaSetDevice(ctx->device);
        if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    }
    if (ctx->trace_hooks) ctx->trace_hooks->destroy(ctx); /* its events, before the stream goes */
    if (ctx->kind == FP_DEVICE_CUDA && ctx->device >= 0) {
        if (ctx->stream) cudaStreamDestroy(ctx->stream);
        cudaFree(ctx->workspace);
        cudaFree(ctx->l2_flush_buf);
        fp_ctx_scratch_destroy(ctx);
        if (ctx->scratch_pool) cudaMemPoolDestroy((cudaMemPool_t)ctx->scratch_pool);
        if (ctx->cublaslt) cublasLtDestroy((cublasLtHandle_t)ctx->cublaslt);
        if (ctx->cublas) cublasDestroy((cublasHandle_t)ctx->cublas);
        (void)cudaGetLastError();
    }
    fp_thread_pool_destroy(ctx->pool);
    pthread_mutex_destroy(&ctx->cublas_mu);
    pthread_mutex_destroy(&ctx->ws_mu);
    pthread_mutex_destroy(&ctx->ws_aux_mu);
    free(ctx);
}

fp_status fp_context_set_option(fp_context *ctx, fp_context_option opt, int64_t value) {
    FP_TRY(fp_ctx_check(ctx, -1));
    switch (opt) {
    case FP_CTX_CPU_THREADS: {
        FP_CHECK_ARG(value >= 0 && value <= 4096, "FP_CTX_CPU_THREADS must be in [0, 4096] (got %lld)",
                     (long long)value);
        if (ctx->kind != FP_DEVICE_CPU) return FP_OK; /* meaningless on CUDA: ignored */
        fp_thread_pool *pool = NULL;
        FP_TRY(fp_thread_pool_create(value ? (int)value : default_cpu_threads(), &pool));
        fp_thread_pool_destroy(ctx->pool);
        ctx->pool = pool;
        return FP_OK;
    }
    case FP_CTX_WORKSPACE_BYTES: {
        FP_CHECK_ARG(value >= 0, "FP_CTX_WORKSPACE_BYTES must be >= 0 (got %lld)", (long long)value);
        if (ctx->kind != FP_DEVICE_CUDA) return FP_OK;
        size_t bytes = value ? (size_t)value : FP_DEFAULT_WORKSPACE_BYTES;
        void *ws = NULL;
        FP_TRY(fp_ctx_activate(ctx));
        FP_CUDA_TRY(cudaStreamSynchronize(ctx->stream));
        FP_CUDA_TRY(cudaMalloc(&ws, bytes));
        cudaFree(ctx->workspace);
        ctx->workspace = ws;
        ctx->workspace_bytes = bytes;
        return FP_OK;
    }
    case FP_CTX_ATTENTION_KERNEL:
        FP_CHECK_ARG(value >= 0 && value <= 10, "FP_CTX_ATTENTION_KERNEL must be in [0, 10] (got %lld)",
                     (long long)value);
        ctx->attn_kernel = (int)value; /* read by CUDA dispatch only */
        return FP_OK;
    case FP_CTX_ATTENTION_SPLIT_COMBINE:
        FP_CHECK_ARG(value == 0 || value == 1, "FP_CTX_ATTENTION_SPLIT_COMBINE must be 0 or 1 (got %lld)",
                     (long long)value);
        ctx->attn_split_combine = (int)value; /* read by CUDA dispatch only */
        return FP_OK;
    case FP_CTX_LAUNCH_PDL:
        FP_CHECK_ARG(value >= -1 && value <= 1, "FP_CTX_LAUNCH_PDL must be -1, 0 or 1 (got %lld)",
                     (long long)value);
        ctx->launch_pdl = resolve_pdl(ctx, value); /* read by CUDA launchers only */
        return FP_OK;
    case FP_CTX_SCRATCH_KEEP_BYTES: {
        FP_CHECK_ARG(value >= -1, "FP_CTX_SCRATCH_KEEP_BYTES must be >= -1 (got %lld)", (long long)value);
        if (ctx->kind != FP_DEVICE_CUDA || !ctx->scratch_pool) return FP_OK;
        uint64_t keep = value == 0 ? FP_SCRATCH_KEEP_BYTES : value < 0 ? 0 : (uint64_t)value;
        cudaMemPool_t pool = (cudaMemPool_t)ctx->scratch_pool;
        FP_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
        FP_CUDA_TRY(cudaMemPoolTrimTo(pool, (size_t)keep));
        return FP_OK;
    }
    }
    return fp_set_error(FP_ERR_INVALID_ARGUMENT, "unknown context option %d", (int)opt);
}

/* Creates (first use) and binds the handle; ctx->cublas_mu is held. */
static fp_status cublas_bind_locked(fp_context *ctx, fp_stream stream) {
    FP_TRY(fp_ctx_activate(ctx));
    if (!ctx->cublas) {
        cublasHandle_t h = NULL;
        cublasStatus_t cs = cublasCreate(&h);
        if (cs != CUBLAS_STATUS_SUCCESS)
            return fp_set_error(FP_ERR_CUBLAS, "cublasCreate failed: %s", cublasGetStatusString(cs));
        ctx->cublas = h;
    }
    cublasStatus_t cs = cublasSetStream((cublasHandle_t)ctx->cublas, fp_ctx_stream(ctx, stream));
    if (cs != CUBLAS_STATUS_SUCCESS)
        return fp_set_error(FP_ERR_CUBLAS, "cublasSetStream failed: %s", cublasGetStatusString(cs));
    return FP_OK;
}

fp_status fp_ctx_cublas_lock(fp_context *ctx, fp_stream stream, void **handle) {
    FP_TRY(fp_ctx_check(ctx, FP_DEVICE_CUDA));
    FP_CHECK_NOT_NULL(handle);
    pthread_mutex_lock(&ctx->cublas_mu);
    fp_status st = cublas_bind_locked(ctx, stream);
    if (st != FP_OK) {
        pthread_mutex_unlock(&ctx->cublas_mu);
        return st;
    }
    *handle = ctx->cublas;
    return FP_OK;
}

void fp_ctx_cublas_unlock(fp_context *ctx) { pthread_mutex_unlock(&ctx->cublas_mu); }

fp_status fp_ctx_cublas(fp_context *ctx, fp_stream stream, void **handle) {
    FP_TRY(fp_ctx_cublas_lock(ctx, stream, handle));
    fp_ctx_cublas_unlock(ctx);
    return FP_OK;
}

fp_device_kind fp_context_kind(const fp_context *ctx) { return ctx ? ctx->kind : FP_DEVICE_CPU; }

int fp_context_device_index(const fp_context *ctx) { return ctx ? ctx->device : -1; }

fp_stream fp_context_stream(const fp_context *ctx) { return ctx ? (fp_stream)ctx->stream : NULL; }

fp_status fp_context_device_info(const fp_context *ctx, fp_device_info *info) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(info);
    return fp_struct_write(info, &ctx->info, FP_DEVICE_INFO_SIZE_FIRST, sizeof *info, "fp_device_info (info)");
}

fp_status fp_context_synchronize(fp_context *ctx, fp_stream stream) {
    FP_TRY(fp_ctx_check(ctx, -1));
    if (ctx->kind == FP_DEVICE_CPU) return FP_OK;
    FP_TRY(fp_ctx_activate(ctx));
    /* a host wait: the verdict's "sync" (trace.h), timed by the host clock */
    uint64_t span = fp_ctx_trace_begin(ctx, stream, "synchronize", "sync", 0, 0);
    cudaError_t e = cudaStreamSynchronize(fp_ctx_stream(ctx, stream));
    fp_ctx_trace_end(ctx, span);
    if (e != cudaSuccess) return fp_cuda_status(e, "cudaStreamSynchronize", __FILE__, __LINE__);
    return FP_OK;
}
