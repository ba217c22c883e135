/* Caching allocator on real device memory (label gpu; exits 77 without a
 * device): random alloc/free with a kernel writing every allocated byte and a
 * read-back of each block's pattern, cross-stream reuse with real CUDA
 * events (stream-ordered through cudaStreamWaitEvent, and by polling alone
 * without the stream-wait op), the pinned-host instance, and the trace
 * replay against cudaMalloc/cudaFree (the warm replay makes no cudaMalloc;
 * the same replay without the stream-wait op is printed for comparison).
 * scripts/gpu-check.sh also runs it under compute-sanitizer with
 * FP_TEST_QUICK=1 (or --quick: the caching replays and their checks,
 * without the cudaMalloc/cudaFree replay and the comparison; the emulated
 * build, tests/emu, runs it so too). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "fastpath/alloc.h"
#include "fp_test.h"

#define MiB ((size_t)1 << 20)

cudaError_t alloc_test_write_block(void *p, size_t bytes, uint32_t tag, cudaStream_t s);
cudaError_t alloc_test_spin(void *p, long long cycles, cudaStream_t s);

typedef struct live_block {
    void *p;
    size_t size;
    uint32_t tag;
} live_block;

static fp_alloc_stats get_stats(fp_allocator *a) {
    fp_alloc_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK_OK(fp_alloc_get_stats(a, &s));
    return s;
}

/* The stream-ordered reuse counters (alloc_internal.h). */
static uint64_t waits_of(fp_allocator *a) {
    uint64_t w = 0;
    CHECK_OK(fp_alloc_stream_wait_counts(a, &w, NULL));
    return w;
}

/* Reads back the first and last 256 bytes and compares with the pattern. */
static int block_ok(const live_block *b) {
    unsigned char buf[256];
    size_t n = b->size < 256 ? b->size : 256;
    size_t offs[2] = {0, b->size - n};
    for (int k = 0; k < 2; ++k) {
        if (cudaMemcpy(buf, (const char *)b->p + offs[k], n, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
        for (size_t i = 0; i < n; ++i)
            if (buf[i] != (unsigned char)((b->tag + (offs[k] + i) * 131u) & 0xffu)) return 0;
    }
    return 1;
}

static void test_random_device(fp_allocator *a, cudaStream_t s1) {
    uint64_t rng = 7;
    live_block live[256];
    int n = 0;
    const int ops = FP_TEST_EMULATED ? 300 : 4000; /* emulated: every byte written by a CPU fiber */
    for (int op = 0; op < ops; ++op) {
        uint64_t r = fp_test_rand_u64(&rng);
        if (n < 4 || (n < 256 && (r & 1))) {
            live_block b;
            size_t kind = (r >> 8) % 8;
            b.size = kind < 5 ? 1 + (r >> 16) % (64 << 10) : kind < 7 ? MiB + (r >> 16) % (8 * MiB)
                                                                      : 10 * MiB + (r >> 16) % (20 * MiB);
            b.tag = (uint32_t)(r >> 32);
            CHECK_OK(fp_alloc_alloc(a, b.size, (fp_stream)s1, &b.p));
            CHECK(cudaSuccess == alloc_test_write_block(b.p, b.size, b.tag, s1));
            live[n++] = b;
        } else {
            int i = (int)((r >> 16) % (uint64_t)n);
            CHECK_OK(fp_alloc_free(a, live[i].p));
            live[i] = live[--n];
        }
    }
    CHECK(cudaSuccess == cudaStreamSynchronize(s1));
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += !block_ok(&live[i]);
    CHECK_MSG(bad == 0, "%d device blocks lost their pattern (overlap?)", bad);
    CHECK_OK(fp_alloc_check_invariants(a));
    for (int i = 0; i < n; ++i) CHECK_OK(fp_alloc_free(a, live[i].p));
    CHECK_OK(fp_alloc_check_invariants(a));
}

static long long spin_cycles(void) {
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    return (long long)khz * 200; /* ~200 ms */
}

/* Stream-ordered reuse (the context's allocator has the CUDA stream-wait
 * op): a block still used by a kernel on s2 is handed out again on s1 at
 * once, and s1's next kernel runs only after s2's: the spin kernel's final
 * write to byte 0 would otherwise land after s1's pattern and break it. */
static void test_cross_stream(fp_allocator *a, cudaStream_t s1, cudaStream_t s2) {
    void *p = NULL, *q = NULL;
    CHECK_OK(fp_alloc_empty_cache(a)); /* so p gets a fresh 12 MiB segment */
    CHECK_OK(fp_alloc_alloc(a, 12 * MiB, (fp_stream)s1, &p));
    CHECK(cudaSuccess == alloc_test_spin(p, spin_cycles(), s2));
    CHECK_OK(fp_alloc_record_stream(a, p, (fp_stream)s2));
    CHECK_OK(fp_alloc_free(a, p));
    fp_alloc_stats s0 = get_stats(a);
    const uint64_t w0 = waits_of(a);
    CHECK(s0.pending_event_blocks == 1);
    CHECK_OK(fp_alloc_alloc(a, 12 * MiB, (fp_stream)s1, &q)); /* s2 still busy: s1 waits on it */
    fp_alloc_stats s1st = get_stats(a);
    const uint64_t w1 = waits_of(a);
    CHECK_MSG(q == p && s1st.upstream_allocs == s0.upstream_allocs && w1 == w0 + 1,
              "q %p p %p, %llu cudaMalloc, %llu stream waits", q, p,
              (unsigned long long)(s1st.upstream_allocs - s0.upstream_allocs), (unsigned long long)(w1 - w0));
    live_block b = {q, 12 * MiB, 0x5au};
    CHECK(cudaSuccess == alloc_test_write_block(b.p, b.size, b.tag, s1));
    CHECK(cudaSuccess == cudaStreamSynchronize(s1));
    CHECK(cudaSuccess == cudaStreamSynchronize(s2));
    CHECK_MSG(block_ok(&b), "s1 wrote the reused block before s2's kernel finished with it");
    CHECK_OK(fp_alloc_free(a, q));
    CHECK_OK(fp_alloc_empty_cache(a));
    CHECK(get_stats(a).reserved_bytes.current == 0);
}

/* Without the stream-wait op (fp_alloc_event_ops_cuda alone, as for host
 * memory): the pending block is reused only after its event completed. */
static void test_cross_stream_polling(cudaStream_t s1, cudaStream_t s2) {
    fp_alloc_upstream up;
    fp_alloc_event_ops ev;
    fp_allocator *a = NULL;
    CHECK_OK(fp_alloc_upstream_device(0, &up));
    CHECK_OK(fp_alloc_event_ops_cuda(0, &ev));
    CHECK_OK(fp_alloc_create(&up, &ev, NULL, &a));
    if (!a) return;
    void *p = NULL, *q = NULL, *x = NULL, *y = NULL;
    CHECK_OK(fp_alloc_alloc(a, 12 * MiB, (fp_stream)s1, &p));
    CHECK(cudaSuccess == alloc_test_spin(p, spin_cycles(), s2));
    CHECK_OK(fp_alloc_record_stream(a, p, (fp_stream)s2));
    CHECK_OK(fp_alloc_free(a, p));
    fp_alloc_stats s0 = get_stats(a);
    CHECK(s0.pending_event_blocks == 1);
    CHECK_OK(fp_alloc_alloc(a, 12 * MiB, (fp_stream)s1, &q)); /* s2 still busy */
    CHECK(q != p);
    CHECK_OK(fp_alloc_free(a, q));
    CHECK(cudaSuccess == cudaStreamSynchronize(s2));
    CHECK_OK(fp_alloc_alloc(a, 12 * MiB, (fp_stream)s1, &x)); /* q from the cache */
    CHECK_OK(fp_alloc_alloc(a, 12 * MiB, (fp_stream)s1, &y)); /* miss: poll frees p */
    CHECK(x == q && y == p);
    fp_alloc_stats s1st = get_stats(a);
    CHECK(s1st.pending_event_blocks == 0 && s1st.upstream_allocs == s0.upstream_allocs + 1 && waits_of(a) == 0);
    CHECK_OK(fp_alloc_free(a, x));
    CHECK_OK(fp_alloc_free(a, y));
    fp_alloc_destroy(a);
}

static void test_pinned(void) {
    fp_alloc_upstream up;
    fp_allocator *a = NULL;
    CHECK_OK(fp_alloc_upstream_pinned(0, &up));
    CHECK_OK(fp_alloc_create(&up, NULL, NULL, &a));
    if (!a) return;
    unsigned char *h = NULL;
    CHECK_OK(fp_alloc_alloc(a, 3 * MiB, NULL, (void **)&h));
    void *d = NULL;
    CHECK(cudaSuccess == cudaMalloc(&d, 3 * MiB));
    for (size_t i = 0; i < 3 * MiB; ++i) h[i] = (unsigned char)(i * 7 + 1);
    CHECK(cudaSuccess == cudaMemcpy(d, h, 3 * MiB, cudaMemcpyHostToDevice));
    memset(h, 0, 3 * MiB);
    CHECK(cudaSuccess == cudaMemcpy(h, d, 3 * MiB, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < 3 * MiB; ++i) bad += h[i] != (unsigned char)(i * 7 + 1);
    CHECK(bad == 0);
    struct cudaPointerAttributes attr;
    CHECK(cudaSuccess == cudaPointerGetAttributes(&attr, h) && attr.type == cudaMemoryTypeHost);
    cudaFree(d);
    CHECK_OK(fp_alloc_free(a, h));
    fp_alloc_destroy(a);
}

static void test_replay_vs_cudamalloc(fp_allocator *a, cudaStream_t *streams, int quick) {
    fp_alloc_trace *t = NULL;
    CHECK_OK(fp_alloc_trace_generate(NULL, &t));
    if (!t) return;
    fp_stream st[3] = {(fp_stream)streams[0], (fp_stream)streams[1], (fp_stream)streams[2]};
    fp_alloc_replay_result warm, rc, rd;
    memset(&warm, 0, sizeof warm);
    warm.struct_size = sizeof warm;
    rc = rd = warm;
    const uint64_t waits0 = waits_of(a);
    CHECK_OK(fp_alloc_trace_replay(a, t, st, 0, &warm));
    CHECK_OK(fp_alloc_trace_replay(a, t, st, 1, &rc));
    const uint64_t waits = waits_of(a) - waits0;
    const double ratio = (double)rc.peak_reserved / (double)rc.peak_allocated;
    CHECK_MSG(rc.upstream_allocs == 0, "warm replay: %llu cudaMalloc", (unsigned long long)rc.upstream_allocs);
    CHECK_MSG(ratio <= 1.15, "warm replay: peak reserved / peak allocated %.3f", ratio);
    printf("device trace replay: warm caching replay %.3f ms, peak reserved/allocated %.3f, %llu stream waits "
           "in the two replays\n",
           rc.total_ms, ratio, (unsigned long long)waits);
    fp_alloc_upstream dev;
    CHECK_OK(fp_alloc_upstream_device(0, &dev));
    if (quick) {
        fp_alloc_trace_destroy(t);
        CHECK_OK(fp_alloc_check_invariants(a));
        return;
    }
    CHECK_OK(fp_alloc_trace_replay_direct(&dev, t, 1, &rd));
    printf("vs cudaMalloc/cudaFree %.3f ms (%.0fx)\n", rd.total_ms, rd.total_ms / rc.total_ms);
    /* For comparison (printed, not checked: it depends on how far the device
     * lags): the same two replays polling only, without the stream-wait op. */
    fp_alloc_event_ops ev;
    fp_allocator *b = NULL;
    CHECK_OK(fp_alloc_event_ops_cuda(0, &ev));
    CHECK_OK(fp_alloc_create(&dev, &ev, NULL, &b));
    if (b) {
        fp_alloc_replay_result bw = warm, br = warm;
        CHECK_OK(fp_alloc_trace_replay(b, t, st, 0, &bw));
        CHECK_OK(fp_alloc_trace_replay(b, t, st, 0, &br));
        printf("without the stream-wait op: warm replay %llu cudaMalloc, peak reserved/allocated %.3f\n",
               (unsigned long long)br.upstream_allocs, (double)br.peak_reserved / (double)br.peak_allocated);
        for (int i = 0; i < 3; ++i) cudaStreamSynchronize(streams[i]);
        fp_alloc_destroy(b);
    }
    fp_alloc_trace_destroy(t);
    CHECK_OK(fp_alloc_check_invariants(a));
}

int main(int argc, char **argv) {
    /* --quick (compute-sanitizer, emulation): no cudaMalloc/cudaFree replay. */
    int quick = (argc > 1 && !strcmp(argv[1], "--quick")) || fp_test_quick();
    fp_context *ctx = fp_test_cuda_context_or_skip();
    fp_allocator *a = NULL;
    CHECK_OK(fp_alloc_create_for_context(ctx, NULL, &a));
    if (!a) return 1;
    cudaStream_t s[3];
    for (int i = 0; i < 3; ++i) CHECK(cudaSuccess == cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
    test_random_device(a, s[0]);
    test_cross_stream(a, s[0], s[1]);
    test_cross_stream_polling(s[0], s[1]);
    test_replay_vs_cudamalloc(a, s, quick);
    test_pinned();
    for (int i = 0; i < 3; ++i) cudaStreamSynchronize(s[i]);
    fp_alloc_destroy(a);
    for (int i = 0; i < 3; ++i) cudaStreamDestroy(s[i]);
    fp_context_destroy(ctx);
    TEST_END();
}
