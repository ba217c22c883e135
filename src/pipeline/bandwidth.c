/* Copy bandwidth (pipeline.h, tier 1): host memory of each kind <-> device
 * memory, one direction at a time, timed by the timing engine.
 *
 * Host buffers per kind (CUDA contexts):
 *   pageable        aligned_alloc, every page touched before timing (the
 *                   first touch is a page fault, not a copy)
 *   pinned          cudaHostAlloc(Portable)
 *   registered      aligned_alloc + cudaHostRegister(Portable), unregistered
 *                   before it is freed
 *   write_combined  cudaHostAlloc(WriteCombined | Portable)
 * On a CPU context every kind is aligned_alloc and the copy is memcpy.
 *
 * One untimed copy into a poisoned destination is checked against a
 * position-dependent pattern before anything is timed: a figure for a copy
 * that moved nothing (or the wrong bytes) is FP_ERR_MISMATCH, not a result.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "fastpath/pipeline.h"
#include "pipeline/bandwidth.h"

#define PAGE ((size_t)4096)
/* Device data is filled and checked through a pageable buffer this large,
 * a piece at a time. A multiple of 8 (the pattern's offsets). */
#define CHECK_CHUNK ((size_t)4 << 20)
/* Host bytes the destination holds before the checked copy. */
#define POISON 0xA5

/* ---- the pattern ---- */

static uint64_t pattern_word(size_t i) {
    uint64_t x = ((uint64_t)i + 1) * 0x9E3779B97F4A7C15ULL;
    return x ^ (x >> 29);
}

/* The word as it lies in memory: byte k of the pattern is bits 8k.. of its
 * word, whatever the host's byte order. */
static uint64_t pattern_word_le(size_t i) {
    uint64_t w = pattern_word(i);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

unsigned char fp_copy_pattern_byte(size_t pos) {
    return (unsigned char)(pattern_word(pos / 8) >> (8 * (pos % 8)));
}

void fp_copy_pattern_fill(void *dst, size_t offset, size_t n) {
    unsigned char *d = dst;
    size_t j = 0, w = offset / 8;
    for (; j + 8 <= n; j += 8, ++w) {
        const uint64_t v = pattern_word_le(w);
        memcpy(d + j, &v, 8);
    }
    for (; j < n; ++j) d[j] = fp_copy_pattern_byte(offset + j);
}

/* First wrong byte in p[j, j + len) (pattern offset base + j...), or SIZE_MAX. */
static size_t first_bad_byte(const unsigned char *p, size_t base, size_t j, size_t len) {
    for (size_t k = j; k < j + len; ++k)
        if (p[k] != fp_copy_pattern_byte(base + k)) return base + k;
    return SIZE_MAX;
}

int fp_copy_pattern_check(const void *p, size_t offset, size_t n, size_t stride, size_t *bad) {
    const unsigned char *c = p;
    size_t found = SIZE_MAX;
    const size_t step = stride ? stride : 8;
    for (size_t j = 0; j + 8 <= n && found == SIZE_MAX; j += step) {
        uint64_t v;
        memcpy(&v, c + j, 8);
        if (v != pattern_word_le((offset + j) / 8)) found = first_bad_byte(c, offset, j, 8);
    }
    if (found == SIZE_MAX) {
        /* the tail: the bytes after the last whole word (sampled: the last 16) */
        const size_t tail = stride ? (n < 16 ? n : 16) : n % 8;
        found = first_bad_byte(c, offset, n - tail, tail);
    }
    if (found != SIZE_MAX && bad) *bad = found;
    return found == SIZE_MAX;
}

/* ---- host buffers ---- */

const char *fp_host_memory_kind_name(fp_host_memory_kind kind) {
    switch (kind) {
    case FP_HOST_PAGEABLE: return "pageable";
    case FP_HOST_PINNED: return "pinned";
    case FP_HOST_REGISTERED: return "registered";
    case FP_HOST_WRITE_COMBINED: return "write_combined";
    }
    return "unknown";
}

void fp_host_buf_free(fp_host_buf *h) {
    if (!h->ptr) return;
    if (h->cuda_alloc) {
        (void)cudaFreeHost(h->ptr);
    } else {
        if (h->registered) (void)cudaHostUnregister(h->ptr);
        free(h->ptr);
    }
    h->ptr = NULL;
}

fp_status fp_host_buf_alloc(fp_context *ctx, fp_host_memory_kind kind, size_t bytes, fp_host_buf *h) {
    memset(h, 0, sizeof *h);
    const int cuda = ctx->kind == FP_DEVICE_CUDA;
    if (cuda && (kind == FP_HOST_PINNED || kind == FP_HOST_WRITE_COMBINED)) {
        const unsigned flags =
            cudaHostAllocPortable | (kind == FP_HOST_WRITE_COMBINED ? cudaHostAllocWriteCombined : 0);
        void *p = NULL;
        const cudaError_t err = cudaHostAlloc(&p, bytes, flags);
        if (err != cudaSuccess) return fp_cuda_status(err, "cudaHostAlloc", __FILE__, __LINE__);
        h->ptr = p;
        h->cuda_alloc = 1;
        return FP_OK;
    }
    /* Page-aligned so that registration pins whole pages of this buffer only. */
    if (bytes > SIZE_MAX - PAGE)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "host buffer: %zu bytes of host memory (too large)", bytes);
    h->ptr = aligned_alloc(PAGE, (bytes + PAGE - 1) / PAGE * PAGE);
    if (!h->ptr)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "host buffer: cannot allocate %zu bytes of %s host memory",
                            bytes, fp_host_memory_kind_name(kind));
    /* The first touch maps the pages: done here, so that no sample pays it. */
    memset(h->ptr, POISON, bytes);
    if (cuda && kind == FP_HOST_REGISTERED) {
        const cudaError_t err = cudaHostRegister(h->ptr, bytes, cudaHostRegisterPortable);
        if (err != cudaSuccess) {
            fp_host_buf_free(h);
            return fp_cuda_status(err, "cudaHostRegister", __FILE__, __LINE__);
        }
        h->registered = 1;
    }
    return FP_OK;
}

/* ---- the copy ---- */

typedef struct copy_call {
    fp_context *ctx;
    void *dst;
    const void *src;
    size_t bytes;
    enum cudaMemcpyKind dir;
} copy_call;

/* A pageable cudaMemcpyAsync returns only once the data has been staged (or,
 * for D2H, has arrived): the host-side cost is what the pageable figure
 * measures. */
static fp_status copy_fn(void *user, fp_stream stream) {
    const copy_call *c = user;
    if (c->ctx->kind == FP_DEVICE_CPU) {
        memcpy(c->dst, c->src, c->bytes);
        return FP_OK;
    }
    FP_CUDA_TRY(cudaMemcpyAsync(c->dst, c->src, c->bytes, c->dir, fp_ctx_stream(c->ctx, stream)));
    return FP_OK;
}

static fp_status mismatch(fp_host_memory_kind kind, fp_copy_direction dir, size_t bad, unsigned got) {
    return fp_set_error(FP_ERR_MISMATCH,
                        "copy bandwidth (%s, %s): byte %zu after the copy is 0x%02x, expected 0x%02x: "
                        "the copy did not move the source's bytes, no figure",
                        fp_host_memory_kind_name(kind), dir == FP_COPY_H2D ? "h2d" : "d2h", bad, got,
                        fp_copy_pattern_byte(bad));
}

/* Writes the pattern into the device buffer (fill: the D2H source) or
 * checks the buffer against it (the H2D destination), CHECK_CHUNK bytes at a
 * time through a pageable buffer: no second full-size host buffer. */
static fp_status device_pattern(fp_context *ctx, unsigned char *d, size_t bytes, int fill,
                                fp_host_memory_kind kind) {
    const size_t cap = bytes < CHECK_CHUNK ? bytes : CHECK_CHUNK;
    unsigned char *tmp = malloc(cap);
    if (!tmp)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "copy bandwidth: cannot allocate %zu bytes to %s the device",
                            cap, fill ? "fill" : "check");
    fp_status st = FP_OK;
    for (size_t off = 0; off < bytes && st == FP_OK; off += cap) {
        const size_t n = bytes - off < cap ? bytes - off : cap;
        size_t bad = 0;
        if (fill) fp_copy_pattern_fill(tmp, off, n);
        st = fill ? fp_mem_upload(ctx, d + off, tmp, n, NULL) : fp_mem_download(ctx, tmp, d + off, n, NULL);
        /* either way tmp is reused next: the copy must be done with it */
        if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
        if (st == FP_OK && !fill && !fp_copy_pattern_check(tmp, off, n, 0, &bad))
            st = mismatch(kind, FP_COPY_H2D, bad, tmp[bad - off]);
    }
    free(tmp);
    return st;
}

fp_status fp_copy_bandwidth(fp_context *ctx, fp_host_memory_kind kind, fp_copy_direction dir, size_t bytes,
                            const fp_timing_config *cfg, double *gbps, fp_stats *stats) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(gbps);
    FP_CHECK_ARG(kind == FP_HOST_PAGEABLE || kind == FP_HOST_PINNED || kind == FP_HOST_REGISTERED ||
                     kind == FP_HOST_WRITE_COMBINED,
                 "argument 'kind' (%d) is not an fp_host_memory_kind (0 to 3)", (int)kind);
    FP_CHECK_ARG(dir == FP_COPY_H2D || dir == FP_COPY_D2H,
                 "argument 'dir' (%d) is not an fp_copy_direction (FP_COPY_H2D 0, FP_COPY_D2H 1)", (int)dir);
    if (bytes == 0) bytes = (size_t)256 << 20;
    FP_TRY(fp_ctx_activate(ctx));

    fp_host_buf h;
    unsigned char *d = NULL;
    fp_status st = fp_host_buf_alloc(ctx, kind, bytes, &h);
    if (st == FP_OK) st = fp_mem_alloc(ctx, bytes, (void **)&d);
    /* Source holds the pattern, destination the poison. */
    if (st == FP_OK && dir == FP_COPY_H2D) {
        fp_copy_pattern_fill(h.ptr, 0, bytes);
        st = fp_mem_fill(ctx, d, POISON, bytes, NULL);
    } else if (st == FP_OK) {
        st = device_pattern(ctx, d, bytes, 1, kind);
        if (st == FP_OK) memset(h.ptr, POISON, bytes);
    }
    copy_call call = {ctx, dir == FP_COPY_H2D ? (void *)d : (void *)h.ptr,
                      dir == FP_COPY_H2D ? (const void *)h.ptr : (const void *)d, bytes,
                      dir == FP_COPY_H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost};
    /* One copy, checked, before any is timed. */
    if (st == FP_OK) st = copy_fn(&call, NULL);
    if (st == FP_OK) st = fp_context_synchronize(ctx, NULL);
    if (st == FP_OK && dir == FP_COPY_H2D) {
        st = device_pattern(ctx, d, bytes, 0, kind);
    } else if (st == FP_OK) {
        /* CPU reads of write-combined memory are uncached (tens of times
         * slower than the copy): one word per page and the tail there. */
        const size_t stride = ctx->kind == FP_DEVICE_CUDA && kind == FP_HOST_WRITE_COMBINED ? PAGE : 0;
        size_t bad = 0;
        if (!fp_copy_pattern_check(h.ptr, 0, bytes, stride, &bad)) st = mismatch(kind, dir, bad, h.ptr[bad]);
    }
    fp_stats s;
    if (st == FP_OK) st = fp_time(ctx, NULL, copy_fn, &call, cfg, &s);
    if (st == FP_OK && !(s.median_ms > 0))
        st = fp_set_error(FP_ERR_INTERNAL, "copy bandwidth: median copy time %g ms", s.median_ms);
    if (st == FP_OK) {
        *gbps = (double)bytes / (s.median_ms * 1e-3) / 1e9;
        if (stats) *stats = s;
    }
    /* Nothing is freed while a copy may still run (after an error mid-run);
     * a failure here does not hide the first one. */
    if (ctx->kind == FP_DEVICE_CUDA && d) {
        fp_error_saved saved;
        fp_error_save(&saved);
        const fp_status sync = fp_context_synchronize(ctx, NULL);
        if (st == FP_OK) st = sync;
        else fp_error_restore(&saved);
    }
    fp_mem_free(ctx, d);
    fp_host_buf_free(&h);
    return st;
}
