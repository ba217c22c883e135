/* graph.h on a CUDA context (label gpu; exits 77 without a device; also
 * built on the emulated runtime: test_graph_gpu_emu): a chain of kernels
 * captured and replayed against eager results over many replays with
 * changing data; recapture in place and with a new topology; illegal calls
 * during capture (a sync, cudaMalloc) give FP_ERR_UNSUPPORTED and leave the
 * stream usable; the legacy stream refused; a pool's memory and allocations
 * made through it during capture (replays allocate nothing); the cache's lazy
 * capture with padding; the validate A/B; the chain with programmatic
 * dependent launch, eager and replayed, equal to the chain without. */
#include <cuda_runtime_api.h>
#include <string.h>

#include "fastpath/graph.h"
#include "fp_test.h"
#include "internal.h"
#include "timing/probes.h"

static fp_context *g_ctx;

/* y = 1.5 x - 0.75 y, k times, then x = y + ...: a chain of tiny kernels
 * whose result depends on every step's order. */
typedef struct chain {
    float *x, *y;
    size_t n;
    int k;
} chain;

static fp_status chain_fn(void *user, fp_stream s) {
    chain *c = user;
    for (int i = 0; i < c->k; ++i) {
        float *in = i % 2 ? c->y : c->x, *out = i % 2 ? c->x : c->y;
        FP_TRY(fp_axpby(g_ctx, s, 2, FP_F32, c->n, 0.5f, in, 0.25f, out, out));
    }
    return FP_OK;
}

static void upload_rand(float *d, size_t n, uint64_t seed) {
    float *h = malloc(n * sizeof *h);
    fp_test_fill(h, n, seed, -1, 1);
    CHECK_OK(fp_mem_upload(g_ctx, d, h, n * sizeof *h, NULL));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    free(h);
}

static void download(float *h, const float *d, size_t n) {
    CHECK_OK(fp_mem_download(g_ctx, h, d, n * sizeof *h, NULL));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
}

static void test_chain(void) {
    const size_t n = 1000;
    const int reps = FP_TEST_EMULATED ? 5 : 50;
    fp_graph_pool *pool;
    CHECK_OK(fp_graph_pool_create(g_ctx, &pool));
    chain c = {NULL, NULL, n, 20};
    CHECK_OK(fp_graph_pool_alloc(pool, n * sizeof(float), (void **)&c.x));
    CHECK_OK(fp_graph_pool_alloc(pool, n * sizeof(float), (void **)&c.y));
    upload_rand(c.x, n, 1);
    upload_rand(c.y, n, 2);
    fp_graph_config cfg;
    fp_graph_config_default(&cfg);
    cfg.pool = pool;
    fp_graph *g = NULL;
    CHECK_OK(fp_graph_capture(g_ctx, NULL, chain_fn, &c, &cfg, &g));
    fp_graph_info info;
    fp_graph_info_init(&info);
    CHECK_OK(fp_graph_get_info(g, &info));
    CHECK_MSG(info.kernel_nodes == 20 && info.nodes >= 20 && !info.cpu, "nodes %zu kernels %zu", info.nodes,
              info.kernel_nodes);
    float *ex = malloc(n * 4), *ey = malloc(n * 4), *gx = malloc(n * 4), *gy = malloc(n * 4);
    for (int r = 0; r < reps; ++r) {
        /* new data in the same buffers: eager result, then the replay's */
        upload_rand(c.x, n, 100 + r);
        upload_rand(c.y, n, 200 + r);
        CHECK_OK(chain_fn(&c, NULL));
        download(ex, c.x, n);
        download(ey, c.y, n);
        upload_rand(c.x, n, 100 + r);
        upload_rand(c.y, n, 200 + r);
        CHECK_OK(fp_graph_replay(g, NULL));
        download(gx, c.x, n);
        download(gy, c.y, n);
        CHECK_MSG(memcmp(ex, gx, n * 4) == 0 && memcmp(ey, gy, n * 4) == 0, "replay %d differs from eager", r);
    }
    /* recapture on other buffers, same kernels: updated in place, replays
     * write the new buffers */
    chain c2 = c;
    CHECK_OK(fp_graph_pool_alloc(pool, n * sizeof(float), (void **)&c2.x));
    CHECK_OK(fp_graph_pool_alloc(pool, n * sizeof(float), (void **)&c2.y));
    fp_graph_update how = 0;
    CHECK_OK(fp_graph_recapture(g, NULL, chain_fn, &c2, &how));
    CHECK(how == FP_GRAPH_UPDATED_IN_PLACE);
    upload_rand(c2.x, n, 7);
    upload_rand(c2.y, n, 8);
    CHECK_OK(chain_fn(&c2, NULL));
    download(ex, c2.x, n);
    upload_rand(c2.x, n, 7);
    upload_rand(c2.y, n, 8);
    CHECK_OK(fp_graph_replay(g, NULL));
    download(gx, c2.x, n);
    CHECK(memcmp(ex, gx, n * 4) == 0);
    /* another topology (fewer kernels): instantiated anew */
    c2.k = 7;
    CHECK_OK(fp_graph_recapture(g, NULL, chain_fn, &c2, &how));
    CHECK(how == FP_GRAPH_REINSTANTIATED);
    CHECK_OK(fp_graph_get_info(g, &info));
    CHECK(info.kernel_nodes == 7 && info.updates_in_place == 1 && info.reinstantiations == 1);
    upload_rand(c2.x, n, 9);
    upload_rand(c2.y, n, 10);
    CHECK_OK(chain_fn(&c2, NULL));
    download(ex, c2.y, n);
    upload_rand(c2.x, n, 9);
    upload_rand(c2.y, n, 10);
    CHECK_OK(fp_graph_replay(g, NULL));
    download(gy, c2.y, n);
    CHECK(memcmp(ex, gy, n * 4) == 0);
    CHECK_OK(fp_graph_destroy(g));
    CHECK_STATUS(fp_graph_replay(g, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_graph_pool_free(pool, c.x));
    CHECK_OK(fp_graph_pool_free(pool, c.y));
    CHECK_OK(fp_graph_pool_free(pool, c2.x));
    CHECK_OK(fp_graph_pool_free(pool, c2.y));
    CHECK_OK(fp_graph_pool_destroy(pool));
    free(ex), free(ey), free(gx), free(gy);
}

/* The chain with programmatic dependent launch (FP_CTX_LAUNCH_PDL 1,
 * kernels/common/pdl.cuh): each kernel reads what the one before it wrote,
 * so a kernel that read before its predecessor finished would give other
 * bits. Eager calls and replays of a capture (programmatic edges), against
 * the chain without it, over replays with new data. On a device without
 * PDL (before compute capability 9.0) the option changes nothing and the
 * results must still agree. */
static void test_chain_pdl(void) {
    const size_t n = FP_TEST_EMULATED ? 1000 : (size_t)1 << 18;
    const int reps = FP_TEST_EMULATED ? 3 : 30;
    chain c = {NULL, NULL, n, 40};
    CHECK_OK(fp_mem_alloc(g_ctx, n * sizeof(float), (void **)&c.x));
    CHECK_OK(fp_mem_alloc(g_ctx, n * sizeof(float), (void **)&c.y));
    CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_LAUNCH_PDL, 1));
    fp_graph *g = NULL;
    upload_rand(c.x, n, 1);
    upload_rand(c.y, n, 2);
    CHECK_OK(fp_graph_capture(g_ctx, NULL, chain_fn, &c, NULL, &g));
    float *rx = malloc(n * 4), *ry = malloc(n * 4), *px = malloc(n * 4), *py = malloc(n * 4);
    for (int r = 0; r < reps; ++r) {
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_LAUNCH_PDL, -1));
        upload_rand(c.x, n, 300 + r);
        upload_rand(c.y, n, 400 + r);
        CHECK_OK(chain_fn(&c, NULL));
        download(rx, c.x, n);
        download(ry, c.y, n);
        CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_LAUNCH_PDL, 1));
        upload_rand(c.x, n, 300 + r);
        upload_rand(c.y, n, 400 + r);
        CHECK_OK(chain_fn(&c, NULL));
        download(px, c.x, n);
        download(py, c.y, n);
        CHECK_MSG(memcmp(rx, px, n * 4) == 0 && memcmp(ry, py, n * 4) == 0,
                  "round %d: the chain with programmatic dependent launch differs from the chain without", r);
        upload_rand(c.x, n, 300 + r);
        upload_rand(c.y, n, 400 + r);
        CHECK_OK(fp_graph_replay(g, NULL));
        download(px, c.x, n);
        download(py, c.y, n);
        CHECK_MSG(memcmp(rx, px, n * 4) == 0 && memcmp(ry, py, n * 4) == 0,
                  "round %d: the replay captured with programmatic dependent launch differs from eager", r);
    }
    CHECK_OK(fp_graph_destroy(g));
    CHECK_OK(fp_context_set_option(g_ctx, FP_CTX_LAUNCH_PDL, 0));
    fp_mem_free(g_ctx, c.x);
    fp_mem_free(g_ctx, c.y);
    free(rx), free(ry), free(px), free(py);
}

/* Callbacks that break the capture. */
typedef struct bad_call {
    float *buf;
    int what; /* 0: fp_context_synchronize, 1: cudaMalloc, 2: the callback fails */
} bad_call;

static fp_status bad_fn(void *user, fp_stream s) {
    bad_call *b = user;
    FP_TRY(fp_mem_fill(g_ctx, b->buf, 0, 64, s));
    if (b->what == 0) return fp_context_synchronize(g_ctx, s);
    if (b->what == 1) {
        void *p = NULL;
        if (cudaMalloc(&p, 256) != cudaSuccess) return FP_ERR_CUDA;
        cudaFree(p);
        return FP_OK;
    }
    fp_clear_error();
    return FP_ERR_MISMATCH;
}

static void test_illegal_calls(void) {
    float *buf = NULL;
    CHECK_OK(fp_mem_alloc(g_ctx, 256, (void **)&buf));
    fp_graph_config cfg;
    fp_graph_config_default(&cfg);
    cfg.warmup = 0;
    const char *names[] = {"a synchronization", "cudaMalloc", "a failing callback"};
    for (int what = 0; what < 3; ++what) {
        bad_call b = {buf, what};
        fp_graph *g = (fp_graph *)0x1;
        fp_status st = fp_graph_capture(g_ctx, NULL, bad_fn, &b, &cfg, &g);
        if (what < 2) {
            CHECK_MSG(st == FP_ERR_UNSUPPORTED, "%s during capture: %s (%s)", names[what], fp_status_string(st),
                      fp_last_error());
            CHECK(strstr(fp_last_error(), "cannot be captured") != NULL);
        } else {
            CHECK_STATUS(st, FP_ERR_MISMATCH);
        }
        CHECK(g == (fp_graph *)0x1);
        /* the stream is usable: no capture left, no sticky error */
        enum cudaStreamCaptureStatus cs;
        CHECK(cudaStreamIsCapturing((cudaStream_t)fp_context_stream(g_ctx), &cs) == cudaSuccess &&
              cs == cudaStreamCaptureStatusNone);
        CHECK(cudaGetLastError() == cudaSuccess);
        CHECK_OK(fp_mem_fill(g_ctx, buf, 1, 256, NULL));
        CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    }
    /* relaxed mode allows cudaMalloc during the capture */
    bad_call b = {buf, 1};
    cfg.capture_mode = FP_GRAPH_CAPTURE_RELAXED;
    fp_graph *g = NULL;
    fp_status st = fp_graph_capture(g_ctx, NULL, bad_fn, &b, &cfg, &g);
    CHECK_MSG(st == FP_OK, "relaxed capture with cudaMalloc: %s", fp_last_error());
    if (st == FP_OK) CHECK_OK(fp_graph_destroy(g));
    /* the legacy stream cannot be captured */
    CHECK_STATUS(fp_graph_capture(g_ctx, (fp_stream)cudaStreamLegacy, bad_fn, &b, NULL, &g), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "legacy") != NULL);
    fp_mem_free(g_ctx, buf);
}

/* A callback that allocates its temporary through the pool's allocator
 * during capture: the graph keeps the address, replays allocate nothing. */
typedef struct pooled {
    fp_graph_pool *pool;
    float *in, *out;
    size_t n;
} pooled;

static fp_status pooled_fn(void *user, fp_stream s) {
    pooled *p = user;
    fp_allocator *a = fp_graph_pool_allocator(p->pool);
    void *tmp = NULL;
    FP_TRY(fp_alloc_alloc(a, p->n * sizeof(float), s, &tmp));
    fp_status st = fp_axpby(g_ctx, s, 2, FP_F32, p->n, 2.0f, p->in, 0.0f, p->in, tmp);
    if (st == FP_OK) st = fp_axpby(g_ctx, s, 2, FP_F32, p->n, 1.0f, tmp, 1.0f, p->in, p->out);
    fp_alloc_free(a, tmp);
    return st;
}

static void test_pool_allocations(void) {
    const size_t n = 4096;
    pooled p = {NULL, NULL, NULL, n};
    CHECK_OK(fp_graph_pool_create(g_ctx, &p.pool));
    CHECK_OK(fp_graph_pool_alloc(p.pool, n * 4, (void **)&p.in));
    CHECK_OK(fp_graph_pool_alloc(p.pool, n * 4, (void **)&p.out));
    upload_rand(p.in, n, 3);
    fp_graph_config cfg;
    fp_graph_config_default(&cfg);
    cfg.pool = p.pool;
    fp_graph *g = NULL;
    CHECK_OK(fp_graph_capture(g_ctx, NULL, pooled_fn, &p, &cfg, &g));
    fp_alloc_stats s0, s1;
    memset(&s0, 0, sizeof s0);
    s0.struct_size = sizeof s0;
    s1 = s0;
    CHECK_OK(fp_alloc_get_stats(fp_graph_pool_allocator(p.pool), &s0));
    float *h = malloc(n * 4), *want = malloc(n * 4);
    download(want, p.in, n);
    for (size_t i = 0; i < n; ++i) want[i] *= 3.0f;
    for (int r = 0; r < 10; ++r) CHECK_OK(fp_graph_replay(g, NULL));
    download(h, p.out, n);
    CHECK(memcmp(h, want, n * 4) == 0);
    CHECK_OK(fp_alloc_get_stats(fp_graph_pool_allocator(p.pool), &s1));
    CHECK_MSG(s1.upstream_allocs == s0.upstream_allocs && s1.allocation_count.total == s0.allocation_count.total,
              "replays allocated: upstream %llu -> %llu, allocations %llu -> %llu",
              (unsigned long long)s0.upstream_allocs, (unsigned long long)s1.upstream_allocs,
              (unsigned long long)s0.allocation_count.total, (unsigned long long)s1.allocation_count.total);
    /* the validate A/B (out computed from inputs the step does not
     * modify): same output, and a replay timing */
    fp_timing_config tc;
    fp_timing_config_default(&tc);
    tc.max_time_s = 0.2;
    tc.min_samples = 3;
    tc.max_samples = 20;
    fp_ab_report rep;
    double saved = -1;
    CHECK_OK(fp_graph_validate(g, NULL, pooled_fn, &p, p.out, n, FP_F32, &tc, &rep, &saved));
    CHECK_MSG(rep.compared && rep.agreement.passed, "validate: %zu mismatches", rep.agreement.mismatches);
    printf("pooled step (2 kernels): eager %.4f ms, replay %.4f ms (%.2fx), %.2f us saved per kernel\n",
           rep.baseline.median_ms, rep.optimized.median_ms, rep.speedup, saved);
    CHECK_OK(fp_graph_destroy(g));
    CHECK_OK(fp_graph_pool_free(p.pool, p.in));
    CHECK_OK(fp_graph_pool_free(p.pool, p.out));
    CHECK_OK(fp_graph_pool_destroy(p.pool));
    free(h);
    free(want);
}

/* The cache: rows [0, size) of y = 2 x, x padded with zeros past n. */
typedef struct rows_step {
    float *x, *y;
    int64_t width;
} rows_step;

static fp_status rows_fn(void *user, fp_stream s, int64_t size) {
    rows_step *r = user;
    return fp_axpby(g_ctx, s, 2, FP_F32, (size_t)(size * r->width), 2.0f, r->x, 0.0f, r->x, r->y);
}

static void test_cache(void) {
    const int64_t width = 64, max = 48, rows = 64; /* buffers past the largest bucket: 49 runs eagerly */
    rows_step r = {NULL, NULL, width};
    CHECK_OK(fp_mem_alloc(g_ctx, (size_t)(rows * width * 4), (void **)&r.x));
    CHECK_OK(fp_mem_alloc(g_ctx, (size_t)(rows * width * 4), (void **)&r.y));
    fp_graph_cache_config cfg;
    fp_graph_cache_config_default(&cfg);
    cfg.max_size = max;
    fp_graph_cache *c = NULL;
    CHECK_OK(fp_graph_cache_create(g_ctx, rows_fn, &r, &cfg, &c));
    float *h = malloc((size_t)(rows * width * 4)), *got = malloc((size_t)(rows * width * 4));
    const int64_t sizes[] = {3, 3, 17, 1, 20, 48, 49, 9, 17};
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; ++t) {
        const int64_t n = sizes[t];
        fp_test_fill(h, (size_t)(n * width), 50 + t, -1, 1);
        CHECK_OK(fp_mem_upload(g_ctx, r.x, h, (size_t)(n * width * 4), NULL));
        int64_t bucket = n;
        fp_status bs = fp_graph_cache_bucket(c, n, &bucket);
        CHECK(bs == (n > max ? FP_ERR_NOT_FOUND : FP_OK));
        CHECK_OK(fp_graph_pad_rows(g_ctx, NULL, r.x, (size_t)width * 4, n, bucket, 0));
        CHECK_OK(fp_mem_fill(g_ctx, r.y, 0xFF, (size_t)(rows * width * 4), NULL));
        int64_t ran = 0;
        fp_graph_run how;
        CHECK_OK(fp_graph_cache_run(c, NULL, n, &ran, &how));
        CHECK(how == (n > max ? FP_GRAPH_RUN_EAGER : how));
        CHECK_OK(fp_mem_download(g_ctx, got, r.y, (size_t)(bucket * width * 4), NULL));
        CHECK_OK(fp_context_synchronize(g_ctx, NULL));
        size_t bad = 0;
        for (int64_t i = 0; i < bucket * width; ++i) bad += got[i] != (i < n * width ? 2.0f * h[i] : 0.0f);
        CHECK_MSG(bad == 0 && ran == bucket, "size %lld (bucket %lld, ran %lld, how %d): %zu bad", (long long)n,
                  (long long)bucket, (long long)ran, (int)how, bad);
    }
    fp_graph_cache_stats st;
    fp_graph_cache_stats_init(&st);
    CHECK_OK(fp_graph_cache_get_stats(c, &st));
    /* buckets used: 4, 24 (17, 20, 17), 1, 48, 16 (9): 5 captures */
    CHECK_MSG(st.captures == 5 && st.replays == 3 && st.eager_above == 1 && st.capture_failures == 0,
              "captures %llu replays %llu eager %llu failures %llu (%s)", (unsigned long long)st.captures,
              (unsigned long long)st.replays, (unsigned long long)st.eager_above,
              (unsigned long long)st.capture_failures, fp_graph_cache_capture_error(c));
    printf("cache: %llu runs, %llu replays, %llu captures (%.1f ms), lookup %.0f ns, pool %zu bytes\n",
           (unsigned long long)st.runs, (unsigned long long)st.replays, (unsigned long long)st.captures,
           st.capture_ms_total, st.lookup_ns, st.pool_bytes);
    fp_graph_cache_destroy(c);
    fp_mem_free(g_ctx, r.x);
    fp_mem_free(g_ctx, r.y);
    free(h);
    free(got);
}

/* A step that cannot be captured (it synchronizes): lazy capture fails, the
 * step still ran eagerly, the call succeeds and later runs stay eager. */
static fp_status sync_step(void *user, fp_stream s, int64_t size) {
    float *buf = user;
    FP_TRY(fp_mem_fill(g_ctx, buf, (int)size, 16, s));
    return fp_context_synchronize(g_ctx, s);
}

static void test_cache_uncapturable(void) {
    float *buf = NULL;
    CHECK_OK(fp_mem_alloc(g_ctx, 64, (void **)&buf));
    fp_graph_cache *c = NULL;
    CHECK_OK(fp_graph_cache_create(g_ctx, sync_step, buf, NULL, &c));
    fp_clear_error();
    fp_graph_run how;
    CHECK_OK(fp_graph_cache_run(c, NULL, 2, NULL, &how));
    CHECK(how == FP_GRAPH_RUN_CAPTURE_FAILED);
    CHECK(fp_last_error()[0] == '\0'); /* a success leaves the message alone */
    CHECK(strstr(fp_graph_cache_capture_error(c), "bucket 2") != NULL);
    CHECK_OK(fp_graph_cache_run(c, NULL, 2, NULL, &how));
    CHECK(how == FP_GRAPH_RUN_CAPTURE_FAILED);
    unsigned char h[16];
    CHECK_OK(fp_mem_download(g_ctx, h, buf, 16, NULL));
    CHECK_OK(fp_context_synchronize(g_ctx, NULL));
    CHECK(h[0] == 2 && h[15] == 2);
    fp_graph_cache_stats st;
    fp_graph_cache_stats_init(&st);
    CHECK_OK(fp_graph_cache_get_stats(c, &st));
    CHECK(st.capture_failures == 1 && st.eager_uncapturable == 1 && st.graphs == 0);
    fp_graph_cache_destroy(c);
    fp_mem_free(g_ctx, buf);
}

int main(void) {
    g_ctx = fp_test_cuda_context_or_skip();
    test_chain();
    test_chain_pdl();
    test_illegal_calls();
    test_pool_allocations();
    test_cache();
    test_cache_uncapturable();
    fp_context_destroy(g_ctx);
    TEST_END();
}
