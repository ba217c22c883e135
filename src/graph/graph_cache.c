/* The shape-bucketed graph cache (graph.h): bucket lists, the bucket choice
 * for a histogram, lazy capture, histogram save / load, the batcher's
 * allowed sizes. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fastpath/graph.h"
#include "graph_internal.h"
#include "internal.h"

/* ------------------------------------------------------------------------ */
/*  Bucket lists                                                            */
/* ------------------------------------------------------------------------ */

fp_status fp_graph_default_buckets(int64_t max_size, int64_t *out, size_t max, size_t *n) {
    FP_CHECK_NOT_NULL(n);
    FP_CHECK_ARG(max_size >= 1 && max_size <= ((int64_t)1 << 20), "max_size must be in [1, 2^20] (got %lld)",
                 (long long)max_size);
    FP_CHECK_ARG(out || max == 0, "argument 'out' is NULL with max %zu", max);
    size_t k = 0;
    int64_t last = 0;
#define PUT(v)                            \
    do {                                  \
        if (k < max) out[k] = (v);        \
        k++;                              \
        last = (v);                       \
    } while (0)
    for (int64_t v = 1; v <= 4 && v <= max_size; v *= 2) PUT(v);
    for (int64_t v = 8; v <= max_size; v += 8) PUT(v);
    if (last != max_size) PUT(max_size);
#undef PUT
    *n = k;
    return FP_OK;
}

static fp_status check_bucket_list(const int64_t *b, size_t n) {
    FP_CHECK_ARG(b != NULL && n > 0, "the bucket list is empty");
    FP_CHECK_ARG(n <= FP_GRAPH_MAX_BUCKETS, "%zu buckets: at most FP_GRAPH_MAX_BUCKETS (%d)", n,
                 FP_GRAPH_MAX_BUCKETS);
    for (size_t i = 0; i < n; ++i) {
        FP_CHECK_ARG(b[i] >= 1, "bucket %zu is %lld: sizes must be >= 1", i, (long long)b[i]);
        FP_CHECK_ARG(i == 0 || b[i] > b[i - 1], "buckets must be strictly increasing (bucket %zu: %lld after %lld)",
                     i, (long long)b[i], (long long)b[i - 1]);
    }
    return FP_OK;
}

#define BUCKET_COST_SIZE_FIRST sizeof(fp_graph_bucket_cost)

fp_status fp_graph_bucket_cost_default_sized(fp_graph_bucket_cost *out, size_t struct_size) {
    fp_graph_bucket_cost d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.row_cost = 1.0;
    d.graph_cost = 0.25;
    return fp_struct_init(out, struct_size, &d, BUCKET_COST_SIZE_FIRST, sizeof d, "fp_graph_bucket_cost");
}

typedef struct size_count {
    int64_t size;
    uint64_t count;
} size_count;

static int cmp_size_count(const void *a, const void *b) {
    const size_count *x = a, *y = b;
    return (x->size > y->size) - (x->size < y->size);
}

fp_status fp_graph_buckets_choose(const int64_t *sizes, const uint64_t *counts, size_t n_sizes,
                                  const fp_graph_bucket_cost *cost, int64_t *out, size_t max_out, size_t *n_out,
                                  double *objective) {
    FP_CHECK_NOT_NULL(sizes);
    FP_CHECK_NOT_NULL(counts);
    FP_CHECK_NOT_NULL(n_out);
    FP_CHECK_ARG(n_sizes >= 1 && n_sizes <= 4096, "n_sizes must be in [1, 4096] (got %zu)", n_sizes);
    fp_graph_bucket_cost full;
    if (!cost) {
        fp_graph_bucket_cost_default(&full);
        cost = &full;
    } else {
        FP_STRUCT_IN(&cost, full, BUCKET_COST_SIZE_FIRST, fp_graph_bucket_cost_default, "fp_graph_bucket_cost");
    }
    FP_CHECK_ARG(cost->row_cost >= 0 && cost->row_cost < 1e300, "row_cost must be finite and >= 0");
    FP_CHECK_ARG(cost->graph_cost >= 0 && cost->graph_cost < 1e300, "graph_cost must be finite and >= 0");
    FP_CHECK_ARG(cost->graph_row_cost >= 0 && cost->graph_row_cost < 1e300,
                 "graph_row_cost must be finite and >= 0");
    FP_CHECK_ARG(cost->max_buckets <= FP_GRAPH_MAX_BUCKETS, "max_buckets must be <= %d (got %zu)",
                 FP_GRAPH_MAX_BUCKETS, cost->max_buckets);
    size_count *h = malloc(n_sizes * sizeof *h);
    if (!h) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "bucket choice");
    size_t m = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n_sizes; ++i) {
        if (sizes[i] < 1) {
            free(h);
            return fp_set_error(FP_ERR_INVALID_ARGUMENT, "sizes[%zu] is %lld: sizes must be >= 1", i,
                                (long long)sizes[i]);
        }
        if (!counts[i]) continue;
        h[m++] = (size_count){sizes[i], counts[i]};
        total += counts[i];
    }
    if (!m) {
        free(h);
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "the histogram is empty (every count is 0)");
    }
    qsort(h, m, sizeof *h, cmp_size_count);
    size_t u = 0; /* duplicates merged */
    for (size_t i = 0; i < m; ++i) {
        if (u && h[u - 1].size == h[i].size) h[u - 1].count += h[i].count;
        else h[u++] = h[i];
    }
    m = u;
    /* prefix sums (1-based): C = counts, S = counts * sizes (as doubles:
     * sizes * counts may pass 2^64) */
    double *C = malloc((m + 1) * sizeof *C), *S = malloc((m + 1) * sizeof *S);
    const size_t K = cost->max_buckets && cost->max_buckets < m ? cost->max_buckets : 0;
    const size_t rows = K ? K + 1 : 1;
    double *f = malloc(rows * (m + 1) * sizeof *f);
    uint32_t *from = malloc(rows * (m + 1) * sizeof *from);
    if (!C || !S || !f || !from) {
        free(h), free(C), free(S), free(f), free(from);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "bucket choice over %zu sizes", m);
    }
    C[0] = S[0] = 0;
    for (size_t i = 1; i <= m; ++i) {
        C[i] = C[i - 1] + (double)h[i - 1].count;
        S[i] = S[i - 1] + (double)h[i - 1].count * (double)h[i - 1].size;
    }
    const double inv_total = 1.0 / (double)total;
#define GROUP_COST(j, i)                                                                                  \
    (cost->row_cost * ((double)h[(i) - 1].size * (C[i] - C[j]) - (S[i] - S[j])) * inv_total +           \
     cost->graph_cost + cost->graph_row_cost * (double)h[(i) - 1].size)
    /* f[k][i]: the best cost of covering sizes 1..i with exactly k buckets
     * (unlimited: row 0 holds any number), the last bucket at size i. */
    for (size_t r = 0; r < rows; ++r)
        for (size_t i = 0; i <= m; ++i) f[r * (m + 1) + i] = (r == 0 && i == 0) ? 0.0 : INFINITY;
    if (!K) {
        for (size_t i = 1; i <= m; ++i)
            for (size_t j = 0; j < i; ++j) {
                double v = f[j] + GROUP_COST(j, i);
                if (v < f[i]) {
                    f[i] = v;
                    from[i] = (uint32_t)j;
                }
            }
    } else {
        for (size_t k = 1; k <= K; ++k)
            for (size_t i = k; i <= m; ++i)
                for (size_t j = k - 1; j < i; ++j) {
                    double prev = f[(k - 1) * (m + 1) + j];
                    if (prev == INFINITY) continue;
                    double v = prev + GROUP_COST(j, i);
                    if (v < f[k * (m + 1) + i]) {
                        f[k * (m + 1) + i] = v;
                        from[k * (m + 1) + i] = (uint32_t)j;
                    }
                }
    }
#undef GROUP_COST
    size_t best_k = 0;
    if (K) {
        best_k = 1;
        for (size_t k = 2; k <= K; ++k)
            if (f[k * (m + 1) + m] < f[best_k * (m + 1) + m]) best_k = k;
    }
    /* walk back: the chosen buckets, largest first */
    size_t nb = 0;
    for (size_t i = m, k = best_k; i > 0; ++nb) {
        size_t j = from[(K ? k : 0) * (m + 1) + i];
        i = j;
        if (K) k--;
    }
    fp_status st = FP_OK;
    if (nb > max_out || (!out && nb)) {
        st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "the choice has %zu buckets; out holds %zu", nb, max_out);
    } else {
        size_t w = nb;
        for (size_t i = m, k = best_k; i > 0;) {
            out[--w] = h[i - 1].size;
            size_t j = from[(K ? k : 0) * (m + 1) + i];
            i = j;
            if (K) k--;
        }
        *n_out = nb;
        if (objective) *objective = f[(K ? best_k : 0) * (m + 1) + m];
    }
    free(h), free(C), free(S), free(f), free(from);
    return st;
}

/* ------------------------------------------------------------------------ */
/*  The cache                                                               */
/* ------------------------------------------------------------------------ */

/* One bucket: the graph replayed for it, and the capture callback's
 * argument (it lives as long as the graph: CPU graphs call it on replay). */
typedef struct slot {
    fp_graph_cache *c;
    int64_t size;
    fp_graph *g;
    int failed;
} slot;

struct fp_graph_cache {
    fp_context *ctx;
    fp_graph_step_fn step;
    void *user;
    pthread_mutex_t mu;
    slot **slots;            /* one per bucket, by increasing size */
    size_t nb;
    cudaStream_t side;       /* CUDA: the capture stream */
    fp_graph_pool *pool;
    int own_pool;
    int mode, warmup, lazy;
    int64_t *hsize;          /* histogram, sorted by size */
    uint64_t *hcount;
    size_t hn, hcap;
    fp_graph_cache_stats st;
    double lookup_ns_sum;
    uint64_t lookups;
    char capture_err[FP_ERROR_MAX];
};

#define CACHE_CONFIG_SIZE_FIRST sizeof(fp_graph_cache_config)
#define CACHE_STATS_SIZE_FIRST sizeof(fp_graph_cache_stats)

fp_status fp_graph_cache_config_default_sized(fp_graph_cache_config *out, size_t struct_size) {
    fp_graph_cache_config d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.max_size = 256;
    d.lazy = 1;
    d.capture_mode = FP_GRAPH_CAPTURE_THREAD_LOCAL;
    d.warmup = 1;
    return fp_struct_init(out, struct_size, &d, CACHE_CONFIG_SIZE_FIRST, sizeof d, "fp_graph_cache_config");
}

fp_status fp_graph_cache_stats_init_sized(fp_graph_cache_stats *out, size_t struct_size) {
    return fp_struct_init(out, struct_size, NULL, CACHE_STATS_SIZE_FIRST, sizeof(fp_graph_cache_stats),
                          "fp_graph_cache_stats");
}

static fp_status slot_step(void *user, fp_stream stream) {
    slot *s = user;
    return s->c->step(s->c->user, stream, s->size);
}

static void slot_free(slot *s) {
    if (!s) return;
    if (s->g) {
        fp_error_saved saved;
        fp_error_save(&saved);
        (void)fp_graph_destroy(s->g);
        fp_error_restore(&saved);
    }
    free(s);
}

/* Captures slot s on `stream` (warm-up calls first, `warmup`). On
 * failure the slot is marked and the reason kept. Call with c->mu held. */
static fp_status capture_slot(fp_graph_cache *c, slot *s, int warmup, fp_stream stream) {
    fp_graph_config gc;
    fp_graph_config_default(&gc);
    gc.capture_mode = c->mode;
    gc.warmup = warmup;
    gc.pool = c->pool;
    const double t0 = fp_now_s();
    fp_status st = fp_graph_capture(c->ctx, stream, slot_step, s, &gc, &s->g);
    c->st.capture_ms_total += (fp_now_s() - t0) * 1e3;
    if (st == FP_OK) {
        c->st.captures++;
        c->st.graphs++;
    } else {
        s->g = NULL;
        s->failed = 1;
        c->st.capture_failures++;
        snprintf(c->capture_err, sizeof c->capture_err, "bucket %lld: %s", (long long)s->size, fp_last_error());
    }
    return st;
}

/* Builds the slots for bucket list b (validated), reusing old slots of the
 * same size; the old slots not reused are freed. Call with c->mu held (or
 * before the cache is shared). */
static fp_status install_buckets(fp_graph_cache *c, const int64_t *b, size_t n) {
    slot **ns = calloc(n, sizeof *ns);
    if (!ns) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "graph cache buckets");
    /* first the new slots (nothing changed yet if one cannot be allocated) */
    for (size_t i = 0, j = 0; i < n; ++i) {
        while (j < c->nb && c->slots[j]->size < b[i]) j++;
        if (j < c->nb && c->slots[j]->size == b[i]) continue;
        ns[i] = calloc(1, sizeof *ns[i]);
        if (!ns[i]) {
            for (size_t k = 0; k < i; ++k) free(ns[k]);
            free(ns);
            return fp_set_error(FP_ERR_OUT_OF_MEMORY, "graph cache buckets");
        }
        ns[i]->c = c;
        ns[i]->size = b[i];
    }
    /* then the kept ones move over; the rest go */
    for (size_t i = 0, j = 0; i < n; ++i) {
        while (j < c->nb && c->slots[j]->size < b[i]) j++;
        if (!ns[i]) {
            ns[i] = c->slots[j];
            c->slots[j++] = NULL;
        }
    }
    for (size_t k = 0; k < c->nb; ++k)
        if (c->slots[k]) {
            if (c->slots[k]->g) c->st.graphs--;
            slot_free(c->slots[k]);
        }
    free(c->slots);
    c->slots = ns;
    c->nb = n;
    return FP_OK;
}

void fp_graph_cache_destroy(fp_graph_cache *c) {
    if (!c) return;
    fp_error_saved saved;
    fp_error_save(&saved);
    for (size_t i = 0; i < c->nb; ++i) slot_free(c->slots[i]);
    free(c->slots);
    if (c->side) {
        (void)fp_ctx_activate(c->ctx);
        (void)cudaStreamSynchronize(c->side);
        (void)cudaStreamDestroy(c->side);
    }
    if (c->pool) {
        fp_graph_pool_use(c->pool, -1);
        if (c->own_pool) (void)fp_graph_pool_destroy(c->pool);
    }
    fp_error_restore(&saved);
    free(c->hsize);
    free(c->hcount);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

fp_status fp_graph_cache_create(fp_context *ctx, fp_graph_step_fn step, void *user, const fp_graph_cache_config *cfg,
                                fp_graph_cache **out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(step);
    FP_CHECK_NOT_NULL(out);
    fp_graph_cache_config full;
    if (!cfg) {
        fp_graph_cache_config_default(&full);
        cfg = &full;
    } else {
        FP_STRUCT_IN(&cfg, full, CACHE_CONFIG_SIZE_FIRST, fp_graph_cache_config_default, "fp_graph_cache_config");
    }
    FP_CHECK_ARG(cfg->capture_mode >= FP_GRAPH_CAPTURE_THREAD_LOCAL && cfg->capture_mode <= FP_GRAPH_CAPTURE_RELAXED,
                 "capture_mode must be 0 (thread-local), 1 (global) or 2 (relaxed) (got %d)", cfg->capture_mode);
    FP_CHECK_ARG(cfg->warmup >= 0 && cfg->warmup <= 100, "warmup must be in [0, 100] (got %d)", cfg->warmup);
    FP_CHECK_ARG(cfg->lazy == 0 || cfg->lazy == 1, "lazy must be 0 or 1 (got %d)", cfg->lazy);
    int64_t defaults[FP_GRAPH_MAX_BUCKETS];
    const int64_t *b = cfg->buckets;
    size_t n = cfg->n_buckets;
    if (!b) {
        FP_CHECK_ARG(n == 0, "n_buckets is %zu with buckets NULL", n);
        FP_TRY(fp_graph_default_buckets(cfg->max_size, defaults, FP_GRAPH_MAX_BUCKETS, &n));
        FP_CHECK_ARG(n <= FP_GRAPH_MAX_BUCKETS, "max_size %lld gives %zu default buckets, more than %d",
                     (long long)cfg->max_size, n, FP_GRAPH_MAX_BUCKETS);
        b = defaults;
    }
    FP_TRY(check_bucket_list(b, n));
    if (cfg->pool) FP_CHECK_ARG(fp_graph_pool_allocator(cfg->pool) != NULL, "cfg->pool is not a pool");
    fp_graph_cache *c = calloc(1, sizeof *c);
    if (!c) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "graph cache");
    pthread_mutex_init(&c->mu, NULL);
    c->ctx = ctx;
    c->step = step;
    c->user = user;
    c->mode = cfg->capture_mode;
    c->warmup = cfg->warmup;
    c->lazy = cfg->lazy;
    fp_graph_cache_stats_init(&c->st);
    fp_status st = FP_OK;
    if (cfg->pool) {
        c->pool = cfg->pool;
    } else {
        st = fp_graph_pool_create(ctx, &c->pool);
        c->own_pool = st == FP_OK;
    }
    if (st == FP_OK) fp_graph_pool_use(c->pool, +1);
    if (st == FP_OK && ctx->kind == FP_DEVICE_CUDA) {
        st = fp_ctx_activate(ctx);
        if (st == FP_OK) {
            cudaError_t e = cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking);
            if (e != cudaSuccess) {
                c->side = NULL;
                st = fp_cuda_status(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
            }
        }
    }
    if (st == FP_OK) st = install_buckets(c, b, n);
    if (st == FP_OK && !c->lazy) {
        /* every bucket, largest first: smaller graphs then reuse the pool's
         * memory the larger ones freed during their capture */
        for (size_t i = c->nb; i-- > 0 && st == FP_OK;)
            st = capture_slot(c, c->slots[i], c->warmup, (fp_stream)c->side);
        if (st == FP_OK && c->side) {
            cudaError_t e = cudaStreamSynchronize(c->side);
            if (e != cudaSuccess) st = fp_cuda_status(e, "cudaStreamSynchronize", __FILE__, __LINE__);
        }
    }
    if (st != FP_OK) {
        fp_error_saved saved;
        fp_error_save(&saved);
        fp_graph_cache_destroy(c);
        fp_error_restore(&saved);
        return st;
    }
    *out = c;
    return FP_OK;
}

/* The index of the first bucket >= n, or c->nb. */
static size_t lower_bucket(const fp_graph_cache *c, int64_t n) {
    size_t lo = 0, hi = c->nb;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->slots[mid]->size < n) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

fp_status fp_graph_cache_bucket(const fp_graph_cache *c, int64_t n, int64_t *bucket) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_NOT_NULL(bucket);
    FP_CHECK_ARG(n >= 1, "n must be >= 1 (got %lld)", (long long)n);
    pthread_mutex_t *mu = (pthread_mutex_t *)&c->mu; /* the lock, not the cache, changes */
    pthread_mutex_lock(mu);
    const size_t i = lower_bucket(c, n);
    const int64_t b = i < c->nb ? c->slots[i]->size : n, largest = c->slots[c->nb - 1]->size;
    const int above = i == c->nb;
    pthread_mutex_unlock(mu);
    *bucket = b;
    if (above)
        return fp_set_error(FP_ERR_NOT_FOUND, "size %lld is above the largest bucket (%lld): it runs eagerly",
                            (long long)n, (long long)largest);
    return FP_OK;
}

/* Room for `need` distinct sizes; on failure the histogram is unchanged.
 * Call with c->mu held. */
static int hist_reserve(fp_graph_cache *c, size_t need) {
    if (need <= c->hcap) return 1;
    int64_t *s = realloc(c->hsize, need * sizeof *s);
    if (!s) return 0;
    c->hsize = s;
    uint64_t *k = realloc(c->hcount, need * sizeof *k);
    if (!k) return 0; /* hsize grew, its contents did not change */
    c->hcount = k;
    c->hcap = need;
    return 1;
}

/* Adds `count` observations of size n. Call with c->mu held. */
static int hist_add(fp_graph_cache *c, int64_t n, uint64_t count) {
    size_t lo = 0, hi = c->hn;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->hsize[mid] < n) lo = mid + 1;
        else hi = mid;
    }
    if (lo < c->hn && c->hsize[lo] == n) {
        c->hcount[lo] += count;
        return 1;
    }
    if (c->hn == c->hcap && !hist_reserve(c, c->hcap ? c->hcap * 2 : 64)) return 0;
    memmove(c->hsize + lo + 1, c->hsize + lo, (c->hn - lo) * sizeof *c->hsize);
    memmove(c->hcount + lo + 1, c->hcount + lo, (c->hn - lo) * sizeof *c->hcount);
    c->hsize[lo] = n;
    c->hcount[lo] = count;
    c->hn++;
    return 1;
}

fp_status fp_graph_cache_run(fp_graph_cache *c, fp_stream stream, int64_t n, int64_t *size, fp_graph_run *how) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_ARG(n >= 1, "n must be >= 1 (got %lld)", (long long)n);
    const int cpu = c->ctx->kind != FP_DEVICE_CUDA;
    fp_stream s = cpu ? NULL : (fp_stream)fp_ctx_stream(c->ctx, stream);
    pthread_mutex_lock(&c->mu);
    const double t0 = fp_now_s();
    if (!hist_add(c, n, 1)) {
        pthread_mutex_unlock(&c->mu);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "graph cache histogram");
    }
    const size_t i = lower_bucket(c, n);
    slot *sl = i < c->nb ? c->slots[i] : NULL;
    c->lookup_ns_sum += (fp_now_s() - t0) * 1e9;
    c->lookups++;
    fp_status st;
    fp_graph_run kind;
    int64_t ran = n;
    if (!sl) {
        kind = FP_GRAPH_RUN_EAGER;
        st = c->step(c->user, s, n);
        if (st == FP_OK) c->st.eager_above++;
    } else if (sl->g) {
        kind = FP_GRAPH_RUN_REPLAYED;
        ran = sl->size;
        st = fp_graph_replay_unchecked(sl->g, s);
        if (st == FP_OK) c->st.replays++;
    } else if (sl->failed) {
        kind = FP_GRAPH_RUN_CAPTURE_FAILED;
        ran = sl->size;
        st = c->step(c->user, s, sl->size);
        if (st == FP_OK) c->st.eager_uncapturable++;
    } else {
        /* first use: this step eagerly at the bucket's size (its warm-up),
         * then the capture, which executes nothing: the device runs the
         * eager step while the host captures. The capture is on the same
         * stream (the legacy stream cannot capture: the side stream then),
         * whose per-stream workspace the eager step has just sized: the
         * ops refuse to grow a workspace inside a capture, so a capture on
         * a fresh side stream failed for every op that needs one (split-KV
         * decode at batch 1 and 8 on the H200; see context.c). */
        ran = sl->size;
        st = c->step(c->user, s, sl->size);
        kind = FP_GRAPH_RUN_CAPTURED;
        if (st == FP_OK) {
            fp_error_saved saved;
            fp_error_save(&saved);
            if (capture_slot(c, sl, 0, cpu || !fp_graph_is_legacy_stream(s) ? s : (fp_stream)c->side) != FP_OK)
                kind = FP_GRAPH_RUN_CAPTURE_FAILED;
            fp_error_restore(&saved); /* the step ran: this call succeeds */
        }
    }
    if (st == FP_OK) {
        c->st.runs++;
        c->st.rows += (uint64_t)n;
        c->st.padded_rows += (uint64_t)(ran - n);
    }
    pthread_mutex_unlock(&c->mu);
    if (st == FP_OK) {
        if (size) *size = ran;
        if (how) *how = kind;
    }
    return st;
}

fp_status fp_graph_cache_capture(fp_graph_cache *c, int all_buckets) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_ARG(all_buckets == 0 || all_buckets == 1, "all_buckets must be 0 or 1 (got %d)", all_buckets);
    pthread_mutex_lock(&c->mu);
    fp_status st = FP_OK;
    for (size_t i = c->nb; i-- > 0 && st == FP_OK;) {
        slot *s = c->slots[i];
        if (s->g || s->failed) continue;
        int wanted = all_buckets;
        const int64_t lo = i ? c->slots[i - 1]->size : 0;
        for (size_t k = 0; k < c->hn && !wanted; ++k) wanted = c->hsize[k] > lo && c->hsize[k] <= s->size;
        if (wanted) st = capture_slot(c, s, c->warmup, (fp_stream)c->side);
    }
    if (st == FP_OK && c->side) {
        cudaError_t e = cudaStreamSynchronize(c->side);
        if (e != cudaSuccess) st = fp_cuda_status(e, "cudaStreamSynchronize", __FILE__, __LINE__);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

fp_status fp_graph_cache_set_buckets(fp_graph_cache *c, const int64_t *buckets, size_t n) {
    FP_CHECK_NOT_NULL(c);
    FP_TRY(check_bucket_list(buckets, n));
    pthread_mutex_lock(&c->mu);
    fp_status st = install_buckets(c, buckets, n);
    pthread_mutex_unlock(&c->mu);
    return st;
}

fp_status fp_graph_cache_buckets(fp_graph_cache *c, int64_t *out, size_t max, size_t *n) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_NOT_NULL(n);
    FP_CHECK_ARG(out || max == 0, "argument 'out' is NULL with max %zu", max);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->nb && i < max; ++i) out[i] = c->slots[i]->size;
    *n = c->nb;
    pthread_mutex_unlock(&c->mu);
    return FP_OK;
}

fp_status fp_graph_cache_rebucket(fp_graph_cache *c, const fp_graph_bucket_cost *cost) {
    FP_CHECK_NOT_NULL(c);
    int64_t chosen[FP_GRAPH_MAX_BUCKETS];
    size_t nc = 0;
    pthread_mutex_lock(&c->mu);
    fp_status st;
    if (!c->hn) st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "the cache's histogram is empty: nothing to choose for");
    else if (c->hn > 4096)
        st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "the histogram has %zu distinct sizes; the choice takes at most 4096",
                          c->hn);
    else st = fp_graph_buckets_choose(c->hsize, c->hcount, c->hn, cost, chosen, FP_GRAPH_MAX_BUCKETS, &nc, NULL);
    if (st == FP_OK) st = install_buckets(c, chosen, nc);
    pthread_mutex_unlock(&c->mu);
    return st;
}

fp_status fp_graph_cache_to_batcher(fp_graph_cache *c, fp_batcher_config *cfg) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_NOT_NULL(cfg);
    int sizes[FP_BATCHER_MAX_SIZES];
    pthread_mutex_lock(&c->mu);
    const size_t n = c->nb;
    int64_t largest = c->slots[n - 1]->size;
    for (size_t i = 0; i < n && i < FP_BATCHER_MAX_SIZES; ++i) sizes[i] = (int)c->slots[i]->size;
    pthread_mutex_unlock(&c->mu);
    FP_CHECK_ARG(n <= FP_BATCHER_MAX_SIZES,
                 "the cache has %zu buckets; a batcher takes at most FP_BATCHER_MAX_SIZES (%d) allowed sizes: "
                 "choose fewer (fp_graph_bucket_cost.max_buckets, fp_graph_cache_rebucket)",
                 n, FP_BATCHER_MAX_SIZES);
    FP_CHECK_ARG(largest <= INT_MAX, "the largest bucket (%lld) is above INT_MAX", (long long)largest);
    memcpy(cfg->allowed_batch_sizes, sizes, n * sizeof sizes[0]);
    cfg->num_allowed_batch_sizes = (int)n;
    cfg->max_batch_size = (int)largest;
    return FP_OK;
}

fp_status fp_graph_cache_get_stats(fp_graph_cache *c, fp_graph_cache_stats *out) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_NOT_NULL(out);
    pthread_mutex_lock(&c->mu);
    fp_graph_cache_stats s = c->st;
    s.lookup_ns = c->lookups ? c->lookup_ns_sum / (double)c->lookups : 0.0;
    pthread_mutex_unlock(&c->mu);
    size_t bytes = 0;
    fp_error_saved saved;
    fp_error_save(&saved);
    if (fp_graph_pool_reserved(c->pool, &bytes) == FP_OK) s.pool_bytes = bytes;
    fp_error_restore(&saved);
    return fp_struct_write(out, &s, CACHE_STATS_SIZE_FIRST, sizeof s, "fp_graph_cache_stats");
}

const char *fp_graph_cache_capture_error(fp_graph_cache *c) { return c ? c->capture_err : ""; }

fp_status fp_graph_cache_histogram(fp_graph_cache *c, int64_t *sizes, uint64_t *counts, size_t max, size_t *n) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_NOT_NULL(n);
    FP_CHECK_ARG((sizes && counts) || max == 0, "sizes / counts NULL with max %zu", max);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->hn && i < max; ++i) {
        sizes[i] = c->hsize[i];
        counts[i] = c->hcount[i];
    }
    *n = c->hn;
    pthread_mutex_unlock(&c->mu);
    return FP_OK;
}

#define HIST_MAGIC "fastpath-graph-histogram 1"

fp_status fp_graph_cache_save_histogram(fp_graph_cache *c, const char *path) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_NOT_NULL(path);
    FP_CHECK_ARG(path[0] != '\0', "argument 'path' is empty");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "histogram text");
    pthread_mutex_lock(&c->mu);
    size_t sizes = c->hn;
    int ok = fprintf(f, "%s\n", HIST_MAGIC) > 0;
    for (size_t i = 0; i < sizes && ok; ++i)
        ok = fprintf(f, "%lld %llu\n", (long long)c->hsize[i], (unsigned long long)c->hcount[i]) > 0;
    pthread_mutex_unlock(&c->mu);
    ok = (fclose(f) == 0) && ok;
    fp_status st = ok ? fp_write_file_atomic(path, text, len, "writing the histogram")
                      : fp_set_error(FP_ERR_OUT_OF_MEMORY, "histogram text of %zu sizes", sizes);
    free(text);
    return st;
}

fp_status fp_graph_cache_load_histogram(fp_graph_cache *c, const char *path) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_NOT_NULL(path);
    FILE *f = fopen(path, "r");
    if (!f) return fp_set_error(FP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    char line[256];
    size_t cap = 64, n = 0;
    size_count *v = malloc(cap * sizeof *v);
    fp_status st = FP_OK;
    if (!v) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "histogram");
    if (st == FP_OK && (!fgets(line, sizeof line, f) || strncmp(line, HIST_MAGIC, strlen(HIST_MAGIC)) != 0 ||
                        (line[strlen(HIST_MAGIC)] != '\n' && line[strlen(HIST_MAGIC)] != '\0')))
        st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "'%s' is not a graph-cache histogram (line 1 must read \"%s\")",
                          path, HIST_MAGIC);
    for (int lineno = 2; st == FP_OK && fgets(line, sizeof line, f); ++lineno) {
        if (!strchr(line, '\n') && !feof(f)) {
            st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "%s:%d: line too long", path, lineno);
            break;
        }
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\n' || *p == '\0' || *p == '\r') continue;
        char *end;
        errno = 0;
        long long size = strtoll(p, &end, 10);
        int bad = errno || end == p || size < 1;
        unsigned long long count = 0;
        if (!bad) {
            p = end;
            while (*p == ' ' || *p == '\t') p++;
            if (*p == '-') bad = 1;
            errno = 0;
            count = strtoull(p, &end, 10);
            bad = bad || errno || end == p;
            while (!bad && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
            bad = bad || *end != '\0';
        }
        if (bad) {
            st = fp_set_error(FP_ERR_INVALID_ARGUMENT,
                              "%s:%d: expected \"size count\" (size >= 1, count >= 0), got \"%.60s\"", path, lineno,
                              line);
            break;
        }
        if (n == cap) {
            size_count *w = realloc(v, cap * 2 * sizeof *v);
            if (!w) {
                st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "histogram");
                break;
            }
            v = w;
            cap *= 2;
        }
        v[n++] = (size_count){size, count};
    }
    if (st == FP_OK && ferror(f)) st = fp_set_error(FP_ERR_IO, "reading '%s' failed", path);
    fclose(f);
    if (st == FP_OK) {
        /* all or nothing: room for every new size first, then the adds,
         * which cannot fail */
        pthread_mutex_lock(&c->mu);
        if (!hist_reserve(c, c->hn + n)) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "histogram");
        for (size_t i = 0; i < n && st == FP_OK; ++i)
            if (v[i].count) (void)hist_add(c, v[i].size, v[i].count);
        pthread_mutex_unlock(&c->mu);
    }
    free(v);
    return st;
}
