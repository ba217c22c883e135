/* Per-stream workspaces of a CUDA context (internal.h, fp_ctx_scratch_get):
 * the scratch ops need between their kernels, allocated once per stream and
 * shape class instead of on every call, so a warmed-up op makes no
 * allocation and can be captured into a CUDA graph. */
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

#define WS_ALIGN ((size_t)256 << 10) /* growth granule: small shape changes reuse it */

static fp_status ws_retire(fp_context *ctx, void *ptr) {
    if (!ptr) return FP_OK;
    if (ctx->ws_nretired == ctx->ws_retired_cap) {
        const int cap = ctx->ws_retired_cap ? 2 * ctx->ws_retired_cap : 8;
        void **r = realloc(ctx->ws_retired, (size_t)cap * sizeof *r);
        if (!r) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "workspace: list of outgrown buffers");
        ctx->ws_retired = r;
        ctx->ws_retired_cap = cap;
    }
    ctx->ws_retired[ctx->ws_nretired++] = ptr;
    return FP_OK;
}

/* The slot of `stream`: its own, else a free one, else the least recently
 * used one (its buffer retired, not freed: a graph may hold it). A stream
 * created with a destroyed one's handle inherits its slot: safe, as CUDA
 * releases a destroyed stream (and so its handle) only after its work. */
static fp_ws_slot *ws_slot(fp_context *ctx, cudaStream_t stream, fp_status *st) {
    fp_ws_slot *free_slot = NULL, *lru = NULL;
    for (int i = 0; i < FP_WS_STREAMS; ++i) {
        fp_ws_slot *w = &ctx->ws[i];
        if (w->used && w->stream == stream) return w;
        if (!w->used && !free_slot) free_slot = w;
        if (w->used && (!lru || w->last_use < lru->last_use)) lru = w;
    }
    fp_ws_slot *w = free_slot ? free_slot : lru;
    if (!free_slot) {
        *st = ws_retire(ctx, w->ptr);
        if (*st == FP_OK) *st = ws_retire(ctx, w->counters);
        if (*st == FP_OK) *st = ws_retire(ctx, w->aux);
        if (*st != FP_OK) return NULL;
    }
    w->used = 1;
    w->stream = stream;
    w->ptr = NULL;
    w->bytes = 0;
    w->counters = NULL;
    w->counter_bytes = 0;
    w->aux = NULL;
    w->aux_bytes = 0;
    return w;
}

/* Grows one of the slot's buffers (*buf, *have bytes) to at least `need`
 * bytes: geometric, in WS_ALIGN granules, so a slowly growing shape
 * reallocates rarely. Growing allocates (cudaMalloc): not during a capture,
 * where it would fail or be illegal, and a graph could not own the buffer
 * anyway. `zero`: the new buffer is zeroed on the slot's stream (ordered
 * before the op's kernels: the arrival counters). The outgrown buffer is
 * retired, not freed (a graph may still use it). `what` names the buffer. */
static fp_status ws_grow(fp_context *ctx, fp_ws_slot *w, void **buf, size_t *have, size_t need, int zero,
                         const char *what, const char *who) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    FP_CUDA_TRY(cudaStreamIsCapturing(w->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "%s needs %zu bytes of %s on this stream, which has %zu, and the stream is being "
                            "captured (a graph cannot grow it): run the op once on this stream, at this or a larger "
                            "shape, before capturing",
                            who, need, what, *have);
    size_t want = *have + *have / 2;
    if (want < need) want = need;
    if (want > SIZE_MAX - WS_ALIGN) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "%s: %s of %zu bytes", who, what, need);
    want = (want + WS_ALIGN - 1) / WS_ALIGN * WS_ALIGN;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e == cudaSuccess && zero) {
        e = cudaMemsetAsync(p, 0, want, w->stream);
        if (e != cudaSuccess) cudaFree(p);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fp_set_error(e == cudaErrorMemoryAllocation ? FP_ERR_OUT_OF_MEMORY : FP_ERR_CUDA,
                            "%s: %s of %zu bytes (for %zu): %s", who, what, want, need, cudaGetErrorString(e));
    }
    fp_status st = ws_retire(ctx, *buf);
    if (st != FP_OK) {
        cudaFree(p);
        return st;
    }
    *buf = p;
    *have = want;
    return FP_OK;
}

fp_status fp_ctx_scratch_get(fp_context *ctx, cudaStream_t stream, size_t bytes, const char *who, fp_scratch *s) {
    return fp_ctx_scratch_get_counted(ctx, stream, bytes, 0, who, s);
}

fp_status fp_ctx_scratch_get_counted(fp_context *ctx, cudaStream_t stream, size_t bytes, size_t ncounters,
                                     const char *who, fp_scratch *s) {
    s->ptr = NULL;
    s->ctx = ctx;
    s->stream = stream;
    s->counters = NULL;
    s->aux = 0;
    if (!ctx) {
        /* one stream-ordered allocation: the scratch, then the counters
         * (zeroed on the stream) at a 256-byte boundary */
        if (bytes == 0 && ncounters == 0) return FP_OK;
        const size_t head = (bytes + 255) / 256 * 256;
        if (bytes > SIZE_MAX - 255 || ncounters > (SIZE_MAX - head) / sizeof(int))
            return fp_set_error(FP_ERR_OUT_OF_MEMORY, "%s: scratch of %zu bytes and %zu counters", who, bytes,
                                ncounters);
        void *base = NULL;
        cudaError_t e = cudaMallocAsync(&base, head + ncounters * sizeof(int), stream);
        if (e == cudaSuccess && ncounters) {
            e = cudaMemsetAsync((char *)base + head, 0, ncounters * sizeof(int), stream);
            if (e != cudaSuccess) (void)cudaFreeAsync(base, stream);
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return fp_set_error(e == cudaErrorMemoryAllocation ? FP_ERR_OUT_OF_MEMORY : FP_ERR_CUDA,
                                "%s: scratch of %zu bytes and %zu counters: %s", who, bytes, ncounters,
                                cudaGetErrorString(e));
        }
        s->ptr = bytes ? base : NULL;
        s->counters = ncounters ? (int *)((char *)base + head) : NULL;
        return FP_OK;
    }
    pthread_mutex_lock(&ctx->ws_mu);
    if (bytes == 0 && ncounters == 0) return FP_OK;
    fp_status st = FP_OK;
    fp_ws_slot *w = ws_slot(ctx, stream, &st);
    const size_t counter_bytes = ncounters * sizeof(int);
    if (ncounters > SIZE_MAX / sizeof(int))
        st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "%s: %zu arrival counters", who, ncounters);
    if (st == FP_OK && w && w->bytes < bytes) st = ws_grow(ctx, w, &w->ptr, &w->bytes, bytes, 0, "workspace", who);
    if (st == FP_OK && w && w->counter_bytes < counter_bytes)
        st = ws_grow(ctx, w, &w->counters, &w->counter_bytes, counter_bytes, 1, "arrival counters", who);
    if (st != FP_OK) {
        pthread_mutex_unlock(&ctx->ws_mu);
        return st;
    }
    w->last_use = ++ctx->ws_clock;
    s->ptr = bytes ? w->ptr : NULL;
    s->counters = ncounters ? w->counters : NULL;
    return FP_OK;
}

fp_status fp_ctx_scratch_get_aux(fp_context *ctx, cudaStream_t stream, size_t bytes, const char *who, fp_scratch *s) {
    if (!ctx) return fp_ctx_scratch_get_counted(NULL, stream, bytes, 0, who, s); /* its own allocation */
    s->ptr = NULL;
    s->ctx = ctx;
    s->stream = stream;
    s->counters = NULL;
    s->aux = 1;
    pthread_mutex_lock(&ctx->ws_aux_mu);
    if (bytes == 0) return FP_OK;
    pthread_mutex_lock(&ctx->ws_mu); /* the slot table; released before returning */
    fp_status st = FP_OK;
    fp_ws_slot *w = ws_slot(ctx, stream, &st);
    if (st == FP_OK && w && w->aux_bytes < bytes) st = ws_grow(ctx, w, &w->aux, &w->aux_bytes, bytes, 0, "scratch", who);
    if (st == FP_OK && w) {
        w->last_use = ++ctx->ws_clock;
        s->ptr = w->aux;
    }
    pthread_mutex_unlock(&ctx->ws_mu);
    if (st != FP_OK) {
        s->aux = 0;
        pthread_mutex_unlock(&ctx->ws_aux_mu);
    }
    return st;
}

fp_status fp_ctx_scratch_put(fp_scratch *s) {
    if (s->ctx) {
        if (s->aux) {
            s->aux = 0;
            pthread_mutex_unlock(&s->ctx->ws_aux_mu);
        } else {
            pthread_mutex_unlock(&s->ctx->ws_mu);
        }
        return FP_OK;
    }
    /* the allocation's base: the scratch, or the counters when it has none */
    void *base = s->ptr ? s->ptr : (void *)s->counters;
    if (!base) return FP_OK;
    /* a failed free would stay the thread's last error and be reported by
     * the next launch check, of another call */
    const cudaError_t e = cudaFreeAsync(base, s->stream);
    s->ptr = NULL;
    s->counters = NULL;
    if (e != cudaSuccess) return fp_cuda_status(e, "cudaFreeAsync(scratch)", __FILE__, __LINE__);
    return FP_OK;
}

void fp_ctx_scratch_destroy(fp_context *ctx) {
    for (int i = 0; i < FP_WS_STREAMS; ++i) {
        cudaFree(ctx->ws[i].ptr);
        cudaFree(ctx->ws[i].counters);
        cudaFree(ctx->ws[i].aux);
    }
    for (int i = 0; i < ctx->ws_nretired; ++i) cudaFree(ctx->ws_retired[i]);
    free(ctx->ws_retired);
}
