/* graph.h on a CPU context (a graph records its callback; a replay calls it)
 * and its pure parts: default buckets, the bucket choice against brute
 * force, the cache's rounding / lazy capture / statistics / histogram files /
 * rebucketing / batcher sizes, bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fastpath/graph.h"
#include "fp_test.h"

typedef struct counter {
    int calls;
    int fail_at;      /* fail the call with this number (1-based), 0: never */
    fp_stream last_stream;
} counter;

static fp_status count_fn(void *user, fp_stream stream) {
    counter *c = user;
    c->calls++;
    c->last_stream = stream;
    if (c->fail_at && c->calls == c->fail_at) {
        fp_clear_error();
        return FP_ERR_MISMATCH;
    }
    return FP_OK;
}

static void test_graph_cpu(fp_context *cpu) {
    counter c = {0, 0, NULL};
    fp_graph *g = NULL;
    CHECK_OK(fp_graph_capture(cpu, NULL, count_fn, &c, NULL, &g));
    CHECK(c.calls == 1); /* the default warm-up; the capture itself records */
    for (int i = 0; i < 5; ++i) CHECK_OK(fp_graph_replay(g, NULL));
    CHECK(c.calls == 6);
    fp_graph_info info;
    fp_graph_info_init(&info);
    CHECK_OK(fp_graph_get_info(g, &info));
    CHECK(info.cpu == 1 && info.replays == 5);
    /* recapture with another callable: replays call it */
    counter c2 = {0, 0, NULL};
    fp_graph_update how = 0;
    CHECK_OK(fp_graph_recapture(g, NULL, count_fn, &c2, &how));
    CHECK(how == FP_GRAPH_REINSTANTIATED);
    CHECK_OK(fp_graph_replay(g, NULL));
    CHECK(c2.calls == 1 && c.calls == 6);
    /* a replay's failure is the callback's */
    c2.fail_at = 2;
    CHECK_STATUS(fp_graph_replay(g, NULL), FP_ERR_MISMATCH);
    CHECK_OK(fp_graph_destroy(g));
    /* a destroyed graph is refused, not followed */
    CHECK_STATUS(fp_graph_replay(g, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "not a live graph") != NULL);
    CHECK_STATUS(fp_graph_destroy(g), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_graph_destroy(NULL));
    /* warm-up 0 and 3; a failing warm-up is the capture's status, no graph */
    fp_graph_config cfg;
    fp_graph_config_default(&cfg);
    cfg.warmup = 3;
    counter c3 = {0, 2, NULL};
    fp_graph *bad = (fp_graph *)0x1;
    CHECK_STATUS(fp_graph_capture(cpu, NULL, count_fn, &c3, &cfg, &bad), FP_ERR_MISMATCH);
    CHECK(bad == (fp_graph *)0x1);
    cfg.warmup = 101;
    CHECK_STATUS(fp_graph_capture(cpu, NULL, count_fn, &c3, &cfg, &bad), FP_ERR_INVALID_ARGUMENT);
    cfg.warmup = 0;
    cfg.capture_mode = 7;
    CHECK_STATUS(fp_graph_capture(cpu, NULL, count_fn, &c3, &cfg, &bad), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "capture_mode") != NULL);
    CHECK_STATUS(fp_graph_capture(cpu, NULL, NULL, &c3, NULL, &bad), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_graph_capture(NULL, NULL, count_fn, &c3, NULL, &bad), FP_ERR_INVALID_ARGUMENT);
    /* a config from a newer header (struct_size too large) */
    fp_graph_config_default(&cfg);
    cfg.struct_size += 8;
    CHECK_STATUS(fp_graph_capture(cpu, NULL, count_fn, &c3, &cfg, &bad), FP_ERR_INVALID_ARGUMENT);
    CHECK(bad == (fp_graph *)0x1);
}

/* Shared pool: a pool with a graph on it cannot be destroyed; static
 * buffers; the pool allocator. */
static void test_pool_cpu(fp_context *cpu) {
    fp_graph_pool *pool = NULL;
    CHECK_OK(fp_graph_pool_create(cpu, &pool));
    void *buf = NULL;
    CHECK_OK(fp_graph_pool_alloc(pool, 1000, &buf));
    CHECK(buf != NULL);
    memset(buf, 1, 1000);
    CHECK_STATUS(fp_graph_pool_alloc(pool, 0, &buf), FP_ERR_INVALID_ARGUMENT);
    size_t reserved = 0;
    CHECK_OK(fp_graph_pool_reserved(pool, &reserved));
    CHECK(reserved >= 1000);
    counter c = {0, 0, NULL};
    fp_graph_config cfg;
    fp_graph_config_default(&cfg);
    cfg.pool = pool;
    fp_graph *g;
    CHECK_OK(fp_graph_capture(cpu, NULL, count_fn, &c, &cfg, &g));
    CHECK_STATUS(fp_graph_pool_destroy(pool), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "still used") != NULL);
    CHECK_OK(fp_graph_destroy(g));
    CHECK(fp_graph_pool_allocator(pool) != NULL);
    int x = 0;
    CHECK_STATUS(fp_graph_pool_free(pool, &x), FP_ERR_NOT_FOUND);
    CHECK_OK(fp_graph_pool_free(pool, buf));
    CHECK_OK(fp_graph_pool_destroy(pool));
    CHECK_OK(fp_graph_pool_destroy(NULL));
}

static void test_default_buckets(void) {
    int64_t b[FP_GRAPH_MAX_BUCKETS];
    size_t n = 0;
    CHECK_OK(fp_graph_default_buckets(512, b, FP_GRAPH_MAX_BUCKETS, &n));
    /* vLLM: 1, 2, 4, then multiples of 8 up to 512: 3 + 64 */
    CHECK(n == 67 && b[0] == 1 && b[1] == 2 && b[2] == 4 && b[3] == 8 && b[4] == 16 && b[66] == 512);
    CHECK_OK(fp_graph_default_buckets(5, b, FP_GRAPH_MAX_BUCKETS, &n));
    CHECK(n == 4 && b[3] == 5);
    CHECK_OK(fp_graph_default_buckets(1, b, FP_GRAPH_MAX_BUCKETS, &n));
    CHECK(n == 1 && b[0] == 1);
    CHECK_OK(fp_graph_default_buckets(20, b, 2, &n)); /* count only past max */
    CHECK(n == 6 && b[0] == 1 && b[1] == 2);
    CHECK_STATUS(fp_graph_default_buckets(0, b, 10, &n), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_graph_default_buckets(10, NULL, 10, &n), FP_ERR_INVALID_ARGUMENT);
}

/* Brute force: every subset of the observed sizes that contains the
 * largest, cost as the header defines it. */
static double brute_choose(const int64_t *s, const uint64_t *c, int m, const fp_graph_bucket_cost *k,
                           int64_t *best_b, size_t *best_n) {
    double best = INFINITY;
    uint64_t total = 0;
    for (int i = 0; i < m; ++i) total += c[i];
    for (uint32_t mask = 0; mask < (1u << (m - 1)); ++mask) {
        uint32_t full = mask | (1u << (m - 1));
        size_t nb = (size_t)__builtin_popcount(full);
        if (k->max_buckets && nb > k->max_buckets) continue;
        double pad = 0, graphs = 0;
        for (int i = 0; i < m; ++i) {
            int j = i;
            while (!(full & (1u << j))) j++;
            pad += (double)c[i] * (double)(s[j] - s[i]);
            if (full & (1u << i)) graphs += k->graph_cost + k->graph_row_cost * (double)s[i];
        }
        double cost = k->row_cost * pad / (double)total + graphs;
        if (cost < best - 1e-12) {
            best = cost;
            *best_n = 0;
            for (int i = 0; i < m; ++i)
                if (full & (1u << i)) best_b[(*best_n)++] = s[i];
        }
    }
    return best;
}

static void test_buckets_choose(void) {
    uint64_t rng = 12345;
    for (int trial = 0; trial < 300; ++trial) {
        int m = 1 + (int)(fp_test_rand_u64(&rng) % 12);
        int64_t s[12];
        uint64_t c[12];
        int64_t v = 0;
        for (int i = 0; i < m; ++i) {
            v += 1 + (int64_t)(fp_test_rand_u64(&rng) % 20);
            s[i] = v;
            c[i] = fp_test_rand_u64(&rng) % 4 == 0 ? 1 + fp_test_rand_u64(&rng) % 1000 : 1 + fp_test_rand_u64(&rng) % 10;
        }
        fp_graph_bucket_cost k;
        fp_graph_bucket_cost_default(&k);
        k.graph_cost = fp_test_rand_uniform(&rng, 0, 5);
        k.graph_row_cost = trial % 3 == 0 ? fp_test_rand_uniform(&rng, 0, 0.1) : 0;
        k.max_buckets = trial % 2 ? 1 + fp_test_rand_u64(&rng) % 4 : 0;
        int64_t want[12], got[FP_GRAPH_MAX_BUCKETS];
        size_t nw = 0, ng = 0;
        double bw = brute_choose(s, c, m, &k, want, &nw), obj = -1;
        /* shuffled input order, plus a zero-count size that must be ignored */
        int64_t ss[13];
        uint64_t cc[13];
        for (int i = 0; i < m; ++i) {
            ss[i] = s[m - 1 - i];
            cc[i] = c[m - 1 - i];
        }
        ss[m] = s[m - 1] + 1000;
        cc[m] = 0;
        CHECK_OK(fp_graph_buckets_choose(ss, cc, (size_t)m + 1, &k, got, FP_GRAPH_MAX_BUCKETS, &ng, &obj));
        CHECK_MSG(fabs(obj - bw) <= 1e-9 * (1 + fabs(bw)), "trial %d: objective %.12g, brute force %.12g", trial, obj,
                  bw);
        CHECK_MSG(got[ng - 1] == s[m - 1], "trial %d: the largest size must be a bucket", trial);
        if (k.max_buckets) CHECK(ng <= k.max_buckets);
        for (size_t i = 1; i < ng; ++i) CHECK(got[i] > got[i - 1]);
    }
    /* the obvious case: two clusters */
    int64_t s[] = {1, 2, 100, 99};
    uint64_t c[] = {50, 50, 30, 30};
    int64_t out[8];
    size_t n = 0;
    CHECK_OK(fp_graph_buckets_choose(s, c, 4, NULL, out, 8, &n, NULL));
    /* default graph_cost 0.25 row: a bucket of its own for 1 saves 50/160
     * padded rows per step (kept), one for 99 saves 30/160 (not) */
    CHECK_MSG(n == 3 && out[0] == 1 && out[1] == 2 && out[2] == 100, "two clusters: %zu buckets", n);
    /* bad input */
    CHECK_STATUS(fp_graph_buckets_choose(s, c, 0, NULL, out, 8, &n, NULL), FP_ERR_INVALID_ARGUMENT);
    uint64_t zero[] = {0, 0};
    CHECK_STATUS(fp_graph_buckets_choose(s, zero, 2, NULL, out, 8, &n, NULL), FP_ERR_INVALID_ARGUMENT);
    int64_t neg[] = {3, -1};
    CHECK_STATUS(fp_graph_buckets_choose(neg, c, 2, NULL, out, 8, &n, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_graph_bucket_cost k;
    fp_graph_bucket_cost_default(&k);
    k.graph_cost = -1;
    CHECK_STATUS(fp_graph_buckets_choose(s, c, 4, &k, out, 8, &n, NULL), FP_ERR_INVALID_ARGUMENT);
    k.graph_cost = 0; /* every size its own bucket: 4 > max_out 2 */
    CHECK_STATUS(fp_graph_buckets_choose(s, c, 4, &k, out, 2, &n, NULL), FP_ERR_INVALID_ARGUMENT);
}

/* The cache on a CPU context: the step records what it was asked for. */
typedef struct stepper {
    int calls;
    int64_t last_size;
    int64_t fail_size;   /* the step fails at this size (0: never) */
} stepper;

static fp_status step_fn(void *user, fp_stream stream, int64_t size) {
    stepper *s = user;
    s->calls++;
    s->last_size = size;
    if (s->fail_size && size == s->fail_size) {
        fp_clear_error();
        return FP_ERR_MISMATCH;
    }
    return FP_OK;
}

static void test_cache_cpu(fp_context *cpu) {
    stepper sp = {0, 0, 0};
    fp_graph_cache_config cfg;
    fp_graph_cache_config_default(&cfg);
    cfg.max_size = 64;
    fp_graph_cache *c = NULL;
    CHECK_OK(fp_graph_cache_create(cpu, step_fn, &sp, &cfg, &c));
    CHECK(sp.calls == 0); /* lazy: nothing captured yet */
    int64_t b;
    CHECK_OK(fp_graph_cache_bucket(c, 3, &b));
    CHECK(b == 4);
    CHECK_OK(fp_graph_cache_bucket(c, 9, &b));
    CHECK(b == 16);
    CHECK_OK(fp_graph_cache_bucket(c, 64, &b));
    CHECK(b == 64);
    CHECK_STATUS(fp_graph_cache_bucket(c, 65, &b), FP_ERR_NOT_FOUND);
    CHECK(b == 65);
    CHECK_STATUS(fp_graph_cache_bucket(c, 0, &b), FP_ERR_INVALID_ARGUMENT);
    int64_t size = 0;
    fp_graph_run how = 9;
    /* first use of bucket 16: eager at 16 (+ the CPU "capture" records) */
    CHECK_OK(fp_graph_cache_run(c, NULL, 9, &size, &how));
    CHECK(how == FP_GRAPH_RUN_CAPTURED && size == 16 && sp.calls == 1 && sp.last_size == 16);
    CHECK_OK(fp_graph_cache_run(c, NULL, 13, &size, &how));
    CHECK(how == FP_GRAPH_RUN_REPLAYED && size == 16 && sp.calls == 2 && sp.last_size == 16);
    CHECK_OK(fp_graph_cache_run(c, NULL, 100, &size, &how));
    CHECK(how == FP_GRAPH_RUN_EAGER && size == 100 && sp.last_size == 100);
    CHECK_OK(fp_graph_cache_run(c, NULL, 1, &size, &how));
    CHECK(how == FP_GRAPH_RUN_CAPTURED && size == 1);
    /* a failing step: its status, nothing captured, stats unchanged */
    sp.fail_size = 24;
    CHECK_STATUS(fp_graph_cache_run(c, NULL, 20, &size, &how), FP_ERR_MISMATCH);
    sp.fail_size = 0;
    CHECK_OK(fp_graph_cache_run(c, NULL, 20, &size, &how));
    CHECK(how == FP_GRAPH_RUN_CAPTURED && size == 24);
    fp_graph_cache_stats st;
    fp_graph_cache_stats_init(&st);
    CHECK_OK(fp_graph_cache_get_stats(c, &st));
    CHECK_MSG(st.runs == 5 && st.replays == 1 && st.captures == 3 && st.eager_above == 1 && st.graphs == 3,
              "runs %llu replays %llu captures %llu eager %llu graphs %zu", (unsigned long long)st.runs,
              (unsigned long long)st.replays, (unsigned long long)st.captures, (unsigned long long)st.eager_above,
              st.graphs);
    CHECK(st.rows == 9 + 13 + 100 + 1 + 20 && st.padded_rows == 7 + 3 + 0 + 0 + 4);
    CHECK(st.lookup_ns > 0);
    CHECK(fp_graph_cache_capture_error(c)[0] == '\0');
    /* the histogram: every size asked for, the failed run too */
    int64_t hs[16];
    uint64_t hc[16];
    size_t hn = 0;
    CHECK_OK(fp_graph_cache_histogram(c, hs, hc, 16, &hn));
    CHECK(hn == 5 && hs[0] == 1 && hs[1] == 9 && hs[2] == 13 && hs[3] == 20 && hs[4] == 100 && hc[3] == 2);
    /* save / load round trip into a fresh cache */
    char path[] = "/tmp/fp_graph_histXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(fp_graph_cache_save_histogram(c, path));
    stepper sp2 = {0, 0, 0};
    fp_graph_cache *c2 = NULL;
    CHECK_OK(fp_graph_cache_create(cpu, step_fn, &sp2, &cfg, &c2));
    CHECK_OK(fp_graph_cache_load_histogram(c2, path));
    CHECK_OK(fp_graph_cache_load_histogram(c2, path)); /* adds */
    int64_t hs2[16];
    uint64_t hc2[16];
    size_t hn2 = 0;
    CHECK_OK(fp_graph_cache_histogram(c2, hs2, hc2, 16, &hn2));
    CHECK(hn2 == hn);
    for (size_t i = 0; i < hn && i < hn2; ++i) CHECK(hs2[i] == hs[i] && hc2[i] == 2 * hc[i]);
    /* capture what the histogram will use: buckets 1, 16, 24 (100 is above) */
    CHECK_OK(fp_graph_cache_capture(c2, 0));
    CHECK_OK(fp_graph_cache_get_stats(c2, &st));
    CHECK_MSG(st.captures == 3 && st.graphs == 3, "captured %llu", (unsigned long long)st.captures);
    CHECK(sp2.calls == 3); /* the warm-ups */
    CHECK_OK(fp_graph_cache_run(c2, NULL, 16, &size, &how));
    CHECK(how == FP_GRAPH_RUN_REPLAYED);
    /* rebucket for the histogram: buckets cover 100 now; the batcher's sizes */
    fp_graph_bucket_cost k;
    fp_graph_bucket_cost_default(&k);
    k.max_buckets = 3;
    CHECK_OK(fp_graph_cache_rebucket(c2, &k));
    int64_t nbk[16];
    size_t nn = 0;
    CHECK_OK(fp_graph_cache_buckets(c2, nbk, 16, &nn));
    CHECK(nn >= 1 && nn <= 3 && nbk[nn - 1] == 100);
    CHECK_OK(fp_graph_cache_run(c2, NULL, 100, &size, &how));
    CHECK(how != FP_GRAPH_RUN_EAGER && size == 100);
    fp_batcher_config bc;
    fp_batcher_config_default(&bc);
    CHECK_OK(fp_graph_cache_to_batcher(c2, &bc));
    CHECK(bc.num_allowed_batch_sizes == (int)nn && bc.max_batch_size == 100 &&
          bc.allowed_batch_sizes[nn - 1] == 100);
    /* 67 buckets do not fit a batcher */
    fp_graph_cache_config big;
    fp_graph_cache_config_default(&big);
    big.max_size = 512;
    fp_graph_cache *c3 = NULL;
    CHECK_OK(fp_graph_cache_create(cpu, step_fn, &sp2, &big, &c3));
    fp_batcher_config_default(&bc);
    int before = bc.max_batch_size;
    CHECK_STATUS(fp_graph_cache_to_batcher(c3, &bc), FP_ERR_INVALID_ARGUMENT);
    CHECK(bc.max_batch_size == before && strstr(fp_last_error(), "FP_BATCHER_MAX_SIZES") != NULL);
    fp_graph_cache_destroy(c3);
    /* set_buckets keeps the graphs of sizes that stay */
    int64_t keep[] = {16, 24, 200};
    CHECK_OK(fp_graph_cache_set_buckets(c, keep, 3));
    CHECK_OK(fp_graph_cache_get_stats(c, &st));
    CHECK(st.graphs == 2);
    CHECK_OK(fp_graph_cache_run(c, NULL, 17, &size, &how));
    CHECK(how == FP_GRAPH_RUN_REPLAYED && size == 24);
    int64_t bad1[] = {4, 4};
    CHECK_STATUS(fp_graph_cache_set_buckets(c, bad1, 2), FP_ERR_INVALID_ARGUMENT);
    int64_t bad2[] = {0, 4};
    CHECK_STATUS(fp_graph_cache_set_buckets(c, bad2, 2), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_graph_cache_set_buckets(c, keep, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_graph_cache_buckets(c, nbk, 16, &nn));
    CHECK(nn == 3 && nbk[2] == 200); /* unchanged by the refusals */
    fp_graph_cache_destroy(c);
    fp_graph_cache_destroy(c2);
    fp_graph_cache_destroy(NULL);
    unlink(path);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void test_histogram_files(fp_context *cpu) {
    stepper sp = {0, 0, 0};
    fp_graph_cache *c = NULL;
    CHECK_OK(fp_graph_cache_create(cpu, step_fn, &sp, NULL, &c));
    CHECK_OK(fp_graph_cache_run(c, NULL, 5, NULL, NULL));
    char path[] = "/tmp/fp_graph_badXXXXXX";
    int fd = mkstemp(path);
    close(fd);
    const char *bad[] = {
        "not a histogram\n1 2\n",
        "fastpath-graph-histogram 1\n3 4\n0 5\n",         /* size 0 */
        "fastpath-graph-histogram 1\n3 -4\n",             /* negative count */
        "fastpath-graph-histogram 1\n3 4 5\n",            /* extra field */
        "fastpath-graph-histogram 1\nx 4\n",
        "fastpath-graph-histogram 2\n3 4\n",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        write_file(path, bad[i]);
        CHECK_STATUS(fp_graph_cache_load_histogram(c, path), FP_ERR_INVALID_ARGUMENT);
        size_t n = 0;
        int64_t s[4];
        uint64_t k[4];
        CHECK_OK(fp_graph_cache_histogram(c, s, k, 4, &n));
        CHECK_MSG(n == 1 && s[0] == 5 && k[0] == 1, "bad file %zu changed the histogram", i);
    }
    write_file(path, "fastpath-graph-histogram 1\n\n7 0\n  9 3 \n");
    CHECK_OK(fp_graph_cache_load_histogram(c, path));
    unlink(path);
    CHECK_STATUS(fp_graph_cache_load_histogram(c, "/nonexistent/dir/h.txt"), FP_ERR_IO);
    /* a save that cannot be written leaves nothing behind */
    CHECK_STATUS(fp_graph_cache_save_histogram(c, "/nonexistent/dir/h.txt"), FP_ERR_IO);
    CHECK(strstr(fp_last_error(), "/nonexistent/dir/h.txt") != NULL);
    fp_graph_cache_destroy(c);
}

static void test_cache_bad_config(fp_context *cpu) {
    stepper sp = {0, 0, 0};
    fp_graph_cache_config cfg;
    fp_graph_cache_config_default(&cfg);
    fp_graph_cache *c = (fp_graph_cache *)0x1;
    int64_t desc[] = {8, 4};
    cfg.buckets = desc;
    cfg.n_buckets = 2;
    CHECK_STATUS(fp_graph_cache_create(cpu, step_fn, &sp, &cfg, &c), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "increasing") != NULL);
    cfg.buckets = NULL;
    cfg.n_buckets = 3;
    CHECK_STATUS(fp_graph_cache_create(cpu, step_fn, &sp, &cfg, &c), FP_ERR_INVALID_ARGUMENT);
    cfg.n_buckets = 0;
    cfg.max_size = 0;
    CHECK_STATUS(fp_graph_cache_create(cpu, step_fn, &sp, &cfg, &c), FP_ERR_INVALID_ARGUMENT);
    cfg.max_size = 16;
    cfg.lazy = 2;
    CHECK_STATUS(fp_graph_cache_create(cpu, step_fn, &sp, &cfg, &c), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_graph_cache_create(cpu, NULL, &sp, NULL, &c), FP_ERR_INVALID_ARGUMENT);
    CHECK(c == (fp_graph_cache *)0x1);
    /* eager capture of every bucket at create; a step that fails at one
     * bucket fails the create, nothing kept */
    cfg.lazy = 0;
    sp.fail_size = 8;
    CHECK_STATUS(fp_graph_cache_create(cpu, step_fn, &sp, &cfg, &c), FP_ERR_MISMATCH);
    CHECK(c == (fp_graph_cache *)0x1);
    sp.fail_size = 0;
    sp.calls = 0;
    CHECK_OK(fp_graph_cache_create(cpu, step_fn, &sp, &cfg, &c));
    CHECK(sp.calls == 5); /* 1, 2, 4, 8, 16: one warm-up each */
    fp_graph_run how;
    CHECK_OK(fp_graph_cache_run(c, NULL, 3, NULL, &how));
    CHECK(how == FP_GRAPH_RUN_REPLAYED);
    fp_graph_cache_destroy(c);
    /* padding helper on the CPU */
    unsigned char rows[5 * 3];
    memset(rows, 7, sizeof rows);
    CHECK_OK(fp_graph_pad_rows(cpu, NULL, rows, 3, 2, 5, 0));
    CHECK(rows[5] == 7 && rows[6] == 0 && rows[14] == 0);
    CHECK_STATUS(fp_graph_pad_rows(cpu, NULL, rows, 3, 6, 5, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_graph_pad_rows(cpu, NULL, NULL, 3, 5, 5, 0));
}

int main(void) {
    fp_context *cpu = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &cpu));
    test_graph_cpu(cpu);
    test_pool_cpu(cpu);
    test_default_buckets();
    test_buckets_choose();
    test_cache_cpu(cpu);
    test_histogram_files(cpu);
    test_cache_bad_config(cpu);
    fp_context_destroy(cpu);
    TEST_END();
}
