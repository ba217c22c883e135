/* CUDA graphs (graph.h): capture, replay, recapture with in-place update,
 * graph pools over the caching allocator's private pools, the validate A/B
 * and padding. The shape-bucketed cache is graph_cache.c. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastpath/graph.h"
#include "graph_internal.h"
#include "internal.h"

/* ------------------------------------------------------------------------ */
/*  Live handles                                                            */
/* ------------------------------------------------------------------------ */

/* Every live graph's address in an open-addressing set, so a replay or a
 * destroy of a destroyed graph is an error rather than a use after free.
 * Lookups are a lock plus a probe or two (tens of ns) against a launch's us. */
static pthread_mutex_t g_live_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t *g_live;   /* 0: empty, 1: tombstone */
static size_t g_live_cap, g_live_n, g_live_used;

static size_t live_hash(uintptr_t p, size_t cap) {
    uint64_t h = (uint64_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

/* Call with g_live_mu held. */
static int live_find(uintptr_t p, size_t *slot) {
    if (!g_live_cap) return 0;
    for (size_t i = live_hash(p, g_live_cap), k = 0; k < g_live_cap; ++k, i = (i + 1) & (g_live_cap - 1)) {
        if (g_live[i] == p) {
            *slot = i;
            return 1;
        }
        if (g_live[i] == 0) return 0;
    }
    return 0;
}

static int live_rehash(size_t cap) {
    uintptr_t *t = calloc(cap, sizeof *t);
    if (!t) return 0;
    for (size_t i = 0; i < g_live_cap; ++i)
        if (g_live[i] > 1) {
            size_t j = live_hash(g_live[i], cap);
            while (t[j]) j = (j + 1) & (cap - 1);
            t[j] = g_live[i];
        }
    free(g_live);
    g_live = t;
    g_live_cap = cap;
    g_live_used = g_live_n;
    return 1;
}

static fp_status live_add(const void *p) {
    pthread_mutex_lock(&g_live_mu);
    if ((g_live_used + 1) * 2 > g_live_cap &&
        !live_rehash(g_live_cap ? ((g_live_n + 1) * 4 > g_live_cap ? g_live_cap * 2 : g_live_cap) : 64)) {
        pthread_mutex_unlock(&g_live_mu);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "graph handle table growth");
    }
    size_t i = live_hash((uintptr_t)p, g_live_cap);
    while (g_live[i] > 1) i = (i + 1) & (g_live_cap - 1);
    if (g_live[i] == 0) g_live_used++;
    g_live[i] = (uintptr_t)p;
    g_live_n++;
    pthread_mutex_unlock(&g_live_mu);
    return FP_OK;
}

static int live_remove(const void *p) {
    pthread_mutex_lock(&g_live_mu);
    size_t slot;
    int found = live_find((uintptr_t)p, &slot);
    if (found) {
        g_live[slot] = 1;
        g_live_n--;
    }
    pthread_mutex_unlock(&g_live_mu);
    return found;
}

static int live_has(const void *p) {
    pthread_mutex_lock(&g_live_mu);
    size_t slot;
    int found = live_find((uintptr_t)p, &slot);
    pthread_mutex_unlock(&g_live_mu);
    return found;
}

/* ------------------------------------------------------------------------ */
/*  Pools                                                                   */
/* ------------------------------------------------------------------------ */

struct fp_graph_pool {
    fp_context *ctx;
    fp_allocator *alloc;
    uint64_t id;             /* the allocator's private pool */
    pthread_mutex_t mu;      /* serializes routing the pool onto a stream */
    int users;               /* graphs (and caches) on it (atomic) */
    int routing;             /* a routing is active, begun by `router` */
    pthread_t router;
};

static uint64_t next_pool_id(void) {
    static uint64_t next = 0;
    return __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
}

fp_status fp_graph_pool_create(fp_context *ctx, fp_graph_pool **out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(out);
    fp_graph_pool *p = calloc(1, sizeof *p);
    if (!p) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "graph pool");
    p->ctx = ctx;
    p->id = next_pool_id();
    pthread_mutex_init(&p->mu, NULL);
    fp_status st = fp_alloc_create_for_context(ctx, NULL, &p->alloc);
    if (st != FP_OK) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return st;
    }
    *out = p;
    return FP_OK;
}

fp_status fp_graph_pool_destroy(fp_graph_pool *p) {
    if (!p) return FP_OK;
    const int users = __atomic_load_n(&p->users, __ATOMIC_ACQUIRE);
    if (users)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "graph pool still used by %d graph(s) or cache(s): destroy them first", users);
    /* Replays on any stream may still read the pool's memory: the segments
     * go back only after the device finished (cudaFree synchronizes on a GPU;
     * the context's synchronize covers the emulation's streams too). */
    if (p->ctx->kind == FP_DEVICE_CUDA) {
        (void)fp_ctx_activate(p->ctx);
        (void)cudaDeviceSynchronize();
    }
    fp_alloc_destroy(p->alloc);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return FP_OK;
}

fp_allocator *fp_graph_pool_allocator(fp_graph_pool *p) { return p ? p->alloc : NULL; }

/* Routes allocations on `stream` into the pool until pool_route_end. The
 * pool's lock is held in between: one routing at a time per pool. */
static fp_status pool_route_begin(fp_graph_pool *p, cudaStream_t stream) {
    /* From inside a capture callback on this pool (this thread routes it
     * now), waiting for the lock would wait forever: refused instead. The
     * flag is only ever set by the thread that holds the lock, so reading it
     * unlocked can only say "this thread" when it is true. */
    if (__atomic_load_n(&p->routing, __ATOMIC_ACQUIRE) && pthread_equal(p->router, pthread_self()))
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "the graph pool is capturing on this thread: inside a capture callback, allocate "
                            "through fp_graph_pool_allocator on the capture stream (static buffers: "
                            "fp_graph_pool_alloc before the capture)");
    pthread_mutex_lock(&p->mu);
    fp_status st = fp_alloc_pool_begin(p->alloc, p->id, (fp_stream)stream);
    if (st != FP_OK) {
        pthread_mutex_unlock(&p->mu);
        return st;
    }
    p->router = pthread_self();
    __atomic_store_n(&p->routing, 1, __ATOMIC_RELEASE);
    return FP_OK;
}
static void pool_route_end(fp_graph_pool *p) {
    fp_error_saved saved;
    fp_error_save(&saved);
    (void)fp_alloc_pool_end(p->alloc, p->id);
    fp_error_restore(&saved);
    __atomic_store_n(&p->routing, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&p->mu);
}

fp_status fp_graph_pool_alloc(fp_graph_pool *p, size_t bytes, void **out) {
    FP_CHECK_NOT_NULL(p);
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(bytes > 0, "argument 'bytes' is 0");
    cudaStream_t s = p->ctx->kind == FP_DEVICE_CUDA ? p->ctx->stream : NULL;
    FP_TRY(pool_route_begin(p, s));
    fp_status st = fp_alloc_alloc(p->alloc, bytes, (fp_stream)s, out);
    pool_route_end(p);
    return st;
}

fp_status fp_graph_pool_free(fp_graph_pool *p, void *ptr) {
    FP_CHECK_NOT_NULL(p);
    if (!ptr) return FP_OK;
    return fp_alloc_free(p->alloc, ptr);
}

fp_status fp_graph_pool_reserved(fp_graph_pool *p, size_t *bytes) {
    FP_CHECK_NOT_NULL(p);
    FP_CHECK_NOT_NULL(bytes);
    fp_alloc_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    FP_TRY(fp_alloc_get_stats(p->alloc, &s));
    *bytes = (size_t)s.reserved_bytes.current;
    return FP_OK;
}

void fp_graph_pool_use(fp_graph_pool *p, int delta) { __atomic_add_fetch(&p->users, delta, __ATOMIC_ACQ_REL); }

/* ------------------------------------------------------------------------ */
/*  Graphs                                                                  */
/* ------------------------------------------------------------------------ */

struct fp_graph {
    fp_context *ctx;
    int cpu;
    fp_graph_fn fn;          /* CPU: what a replay calls */
    void *user;
    cudaGraphExec_t exec;
    fp_graph_pool *pool;
    int own_pool;
    int mode;
    cudaStream_t last_stream; /* of the last replay (destroy waits for it) */
    fp_graph_info info;
};

#define GRAPH_CONFIG_SIZE_FIRST sizeof(fp_graph_config)
#define GRAPH_INFO_SIZE_FIRST sizeof(fp_graph_info)

fp_status fp_graph_config_default_sized(fp_graph_config *out, size_t struct_size) {
    fp_graph_config d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.capture_mode = FP_GRAPH_CAPTURE_THREAD_LOCAL;
    d.warmup = 1;
    return fp_struct_init(out, struct_size, &d, GRAPH_CONFIG_SIZE_FIRST, sizeof d, "fp_graph_config");
}

fp_status fp_graph_info_init_sized(fp_graph_info *out, size_t struct_size) {
    return fp_struct_init(out, struct_size, NULL, GRAPH_INFO_SIZE_FIRST, sizeof(fp_graph_info), "fp_graph_info");
}

static const char *mode_name(int m) {
    return m == FP_GRAPH_CAPTURE_GLOBAL ? "global" : m == FP_GRAPH_CAPTURE_RELAXED ? "relaxed" : "thread-local";
}
static enum cudaStreamCaptureMode cuda_mode(int m) {
    return m == FP_GRAPH_CAPTURE_GLOBAL    ? cudaStreamCaptureModeGlobal
           : m == FP_GRAPH_CAPTURE_RELAXED ? cudaStreamCaptureModeRelaxed
                                           : cudaStreamCaptureModeThreadLocal;
}

int fp_graph_is_legacy_stream(fp_stream s) {
    /* cudaStreamLegacy and cudaStreamPerThread: neither can be captured into
     * a graph that others can rely on (the legacy stream not at all). */
    return (uintptr_t)s == (uintptr_t)cudaStreamLegacy || (uintptr_t)s == (uintptr_t)cudaStreamPerThread;
}

/* Counts a graph's nodes and its kernel nodes. */
static void count_nodes(cudaGraph_t g, fp_graph_info *info) {
    size_t n = 0;
    info->nodes = info->kernel_nodes = 0;
    if (cudaGraphGetNodes(g, NULL, &n) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    info->nodes = n;
    if (!n) return;
    cudaGraphNode_t *nodes = malloc(n * sizeof *nodes);
    if (!nodes) return;
    if (cudaGraphGetNodes(g, nodes, &n) == cudaSuccess) {
        for (size_t i = 0; i < n; ++i) {
            enum cudaGraphNodeType t;
            if (cudaGraphNodeGetType(nodes[i], &t) == cudaSuccess && t == cudaGraphNodeTypeKernel)
                info->kernel_nodes++;
        }
    }
    (void)cudaGetLastError();
    free(nodes);
}

/* One capture of fn on stream into *out (a cudaGraph_t the caller owns),
 * allocations routed into the pool. On failure nothing is left: the capture
 * ended, its graph destroyed, CUDA's last error cleared. */
static fp_status capture_once(fp_graph_pool *pool, cudaStream_t stream, int mode, fp_graph_fn fn, void *user,
                              cudaGraph_t *out, double *capture_ms) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    FP_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
    FP_CHECK_ARG(cs == cudaStreamCaptureStatusNone,
                 "the stream is already being captured (a capture inside a capture callback)");
    FP_TRY(pool_route_begin(pool, stream));
    const double t0 = fp_now_s();
    cudaError_t e = cudaStreamBeginCapture(stream, cuda_mode(mode));
    if (e != cudaSuccess) {
        pool_route_end(pool);
        (void)cudaGetLastError();
        return fp_set_error(FP_ERR_UNSUPPORTED, "cudaStreamBeginCapture (%s mode) refused the stream: %s",
                            mode_name(mode), cudaGetErrorString(e));
    }
    const unsigned seq0 = fp_error_seq();
    fp_status st = fn(user, (fp_stream)stream);
    char fn_msg[FP_ERROR_MAX] = "";
    if (st != FP_OK && fp_error_seq() != seq0) snprintf(fn_msg, sizeof fn_msg, "%s", fp_last_error());
    cudaGraph_t g = NULL;
    e = cudaStreamEndCapture(stream, &g);
    pool_route_end(pool);
    *capture_ms = (fp_now_s() - t0) * 1e3;
    if (e != cudaSuccess || !g) {
        (void)cudaGetLastError(); /* the capture's failure is reported here, not left sticky */
        if (g) cudaGraphDestroy(g);
        if (st != FP_OK)
            return fp_set_error(FP_ERR_UNSUPPORTED,
                                "the callback cannot be captured (%s mode): CUDA ended the capture with %s "
                                "(a call that is illegal while capturing: a synchronization, cudaMalloc / "
                                "cudaFree, a blocking copy, a host read of device data); the callback "
                                "returned %s: %s",
                                mode_name(mode), cudaGetErrorString(e), fp_status_string(st),
                                fn_msg[0] ? fn_msg : "(no message)");
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "the callback cannot be captured (%s mode): CUDA ended the capture with %s (a call "
                            "that is illegal while capturing: a synchronization, cudaMalloc / cudaFree, a "
                            "blocking copy, a host read of device data)",
                            mode_name(mode), cudaGetErrorString(e));
    }
    if (st != FP_OK) {
        cudaGraphDestroy(g);
        (void)cudaGetLastError();
        if (fn_msg[0]) fp_set_error(st, "%s", fn_msg); /* the callback's own message stays the detail */
        return st;
    }
    *out = g;
    return FP_OK;
}

static fp_status graph_destroy_parts(fp_graph *g) {
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->pool) {
        fp_graph_pool_use(g->pool, -1);
        if (g->own_pool) return fp_graph_pool_destroy(g->pool);
    }
    return FP_OK;
}

fp_status fp_graph_capture(fp_context *ctx, fp_stream stream, fp_graph_fn fn, void *user,
                           const fp_graph_config *cfg, fp_graph **out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(fn);
    FP_CHECK_NOT_NULL(out);
    fp_graph_config full;
    if (!cfg) {
        fp_graph_config_default(&full);
        cfg = &full;
    } else {
        FP_STRUCT_IN(&cfg, full, GRAPH_CONFIG_SIZE_FIRST, fp_graph_config_default, "fp_graph_config");
    }
    FP_CHECK_ARG(cfg->capture_mode >= FP_GRAPH_CAPTURE_THREAD_LOCAL && cfg->capture_mode <= FP_GRAPH_CAPTURE_RELAXED,
                 "capture_mode must be 0 (thread-local), 1 (global) or 2 (relaxed) (got %d)", cfg->capture_mode);
    FP_CHECK_ARG(cfg->warmup >= 0 && cfg->warmup <= 100, "warmup must be in [0, 100] (got %d)", cfg->warmup);
    if (cfg->pool) FP_CHECK_ARG(cfg->pool->ctx == ctx, "cfg->pool belongs to another context");
    const int cpu = ctx->kind != FP_DEVICE_CUDA;
    if (!cpu)
        FP_CHECK_ARG(!fp_graph_is_legacy_stream(stream),
                     "the legacy default stream (stream 0 / cudaStreamLegacy / cudaStreamPerThread) cannot be "
                     "captured: pass a stream of your own or NULL (the context's non-blocking stream)");
    fp_graph *g = calloc(1, sizeof *g);
    if (!g) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "graph");
    g->ctx = ctx;
    g->cpu = cpu;
    g->fn = fn;
    g->user = user;
    g->mode = cfg->capture_mode;
    fp_graph_info_init(&g->info);
    g->info.cpu = cpu;
    fp_status st = FP_OK;
    if (cfg->pool) {
        g->pool = cfg->pool;
    } else {
        st = fp_graph_pool_create(ctx, &g->pool);
        g->own_pool = 1;
    }
    if (st != FP_OK) {
        free(g);
        return st;
    }
    fp_graph_pool_use(g->pool, +1);
    cudaStream_t s = cpu ? NULL : fp_ctx_stream(ctx, stream);
    if (!cpu) st = fp_ctx_activate(ctx);
    for (int i = 0; st == FP_OK && i < cfg->warmup; ++i) st = fn(user, (fp_stream)s);
    if (st == FP_OK && !cpu) {
        cudaGraph_t cg = NULL;
        st = capture_once(g->pool, s, g->mode, fn, user, &cg, &g->info.capture_ms);
        if (st == FP_OK) {
            count_nodes(cg, &g->info);
            const double t0 = fp_now_s();
            cudaError_t e = cudaGraphInstantiate(&g->exec, cg, 0);
            g->info.instantiate_ms = (fp_now_s() - t0) * 1e3;
            cudaGraphDestroy(cg);
            if (e != cudaSuccess) {
                g->exec = NULL;
                st = fp_cuda_status(e, "cudaGraphInstantiate", __FILE__, __LINE__);
            }
        }
    }
    if (st == FP_OK) st = live_add(g);
    if (st != FP_OK) {
        fp_error_saved saved;
        fp_error_save(&saved);
        (void)graph_destroy_parts(g);
        fp_error_restore(&saved);
        free(g);
        return st;
    }
    g->last_stream = s;
    *out = g;
    return FP_OK;
}

static fp_status check_live(const fp_graph *g) {
    FP_CHECK_NOT_NULL(g);
    if (!live_has(g)) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "graph %p is not a live graph (destroyed?)", (const void *)g);
    return FP_OK;
}

static fp_status replay_run(fp_graph *g, fp_stream stream) {
    if (g->cpu) {
        FP_TRY(g->fn(g->user, stream));
        g->info.replays++;
        return FP_OK;
    }
    cudaStream_t s = fp_ctx_stream(g->ctx, stream);
    FP_TRY(fp_ctx_activate(g->ctx));
    FP_CUDA_TRY(cudaGraphLaunch(g->exec, s));
    g->last_stream = s;
    g->info.replays++;
    return FP_OK;
}

/* A replay is one span ("graph_replay", category "graph", trace.h); the
 * captured ops record none (not during the capture, and a replay does not
 * run their host code). A CPU context's graph re-runs its function: the
 * ops it calls record their spans inside this one. */
fp_status fp_graph_replay_unchecked(fp_graph *g, fp_stream stream) {
    const uint64_t span = fp_ctx_trace_begin(g->ctx, stream, "graph_replay", "graph", 0, 0);
    const fp_status st = replay_run(g, stream);
    fp_ctx_trace_end(g->ctx, span);
    return st;
}

fp_status fp_graph_replay(fp_graph *g, fp_stream stream) {
    FP_TRY(check_live(g));
    return fp_graph_replay_unchecked(g, stream);
}

fp_status fp_graph_recapture(fp_graph *g, fp_stream stream, fp_graph_fn fn, void *user, fp_graph_update *how) {
    FP_TRY(check_live(g));
    FP_CHECK_NOT_NULL(fn);
    if (g->cpu) {
        g->fn = fn;
        g->user = user;
        g->info.reinstantiations++;
        if (how) *how = FP_GRAPH_REINSTANTIATED;
        return FP_OK;
    }
    FP_CHECK_ARG(!fp_graph_is_legacy_stream(stream), "the legacy default stream cannot be captured");
    cudaStream_t s = fp_ctx_stream(g->ctx, stream);
    FP_TRY(fp_ctx_activate(g->ctx));
    cudaGraph_t cg = NULL;
    double cap_ms = 0;
    FP_TRY(capture_once(g->pool, s, g->mode, fn, user, &cg, &cap_ms));
    fp_graph_info counted = g->info;
    count_nodes(cg, &counted);
    const double t0 = fp_now_s();
    cudaGraphExecUpdateResultInfo res;
    memset(&res, 0, sizeof res);
    fp_graph_update kind = FP_GRAPH_UPDATED_IN_PLACE;
    cudaError_t e = cudaGraphExecUpdate(g->exec, cg, &res);
    if (e != cudaSuccess) {
        /* Topology (or a node kind CUDA cannot update) changed: a new
         * instantiation; in-flight launches of the old one finish first
         * (cudaGraphExecDestroy frees it asynchronously). */
        (void)cudaGetLastError();
        cudaGraphExec_t fresh = NULL;
        e = cudaGraphInstantiate(&fresh, cg, 0);
        if (e != cudaSuccess) {
            cudaGraphDestroy(cg);
            return fp_cuda_status(e, "cudaGraphInstantiate", __FILE__, __LINE__);
        }
        cudaGraphExecDestroy(g->exec);
        g->exec = fresh;
        kind = FP_GRAPH_REINSTANTIATED;
    }
    cudaGraphDestroy(cg);
    g->fn = fn;
    g->user = user;
    g->info.nodes = counted.nodes;
    g->info.kernel_nodes = counted.kernel_nodes;
    g->info.capture_ms = cap_ms;
    g->info.instantiate_ms = (fp_now_s() - t0) * 1e3;
    if (kind == FP_GRAPH_UPDATED_IN_PLACE) g->info.updates_in_place++;
    else g->info.reinstantiations++;
    if (how) *how = kind;
    return FP_OK;
}

fp_status fp_graph_destroy(fp_graph *g) {
    if (!g) return FP_OK;
    if (!live_remove(g))
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "graph %p is not a live graph (destroyed twice?)", (void *)g);
    if (!g->cpu) {
        (void)fp_ctx_activate(g->ctx);
        if (g->last_stream) (void)cudaStreamSynchronize(g->last_stream);
        (void)cudaGetLastError();
    }
    fp_status st = graph_destroy_parts(g);
    free(g);
    return st;
}

fp_status fp_graph_get_info(const fp_graph *g, fp_graph_info *out) {
    FP_TRY(check_live(g));
    FP_CHECK_NOT_NULL(out);
    return fp_struct_write(out, &g->info, GRAPH_INFO_SIZE_FIRST, sizeof g->info, "fp_graph_info");
}


/* ------------------------------------------------------------------------ */
/*  Validate (A/B) and padding                                              */
/* ------------------------------------------------------------------------ */

typedef struct replay_arg {
    fp_graph *g;
} replay_arg;

static fp_status replay_fn(void *user, fp_stream stream) {
    return fp_graph_replay_unchecked(((replay_arg *)user)->g, stream);
}

static fp_status copy_on(fp_context *ctx, void *dst, const void *src, size_t bytes, fp_stream stream) {
    if (ctx->kind != FP_DEVICE_CUDA) {
        memcpy(dst, src, bytes);
        return FP_OK;
    }
    FP_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, fp_ctx_stream(ctx, stream)));
    return FP_OK;
}

fp_status fp_graph_validate(fp_graph *g, fp_stream stream, fp_graph_fn fn, void *user, const void *out,
                            size_t out_count, fp_dtype out_dtype, const fp_timing_config *cfg,
                            fp_ab_report *report, double *saved_us_per_kernel) {
    FP_TRY(check_live(g));
    FP_CHECK_NOT_NULL(fn);
    FP_CHECK_NOT_NULL(report);
    fp_context *ctx = g->ctx;
    const size_t elt = fp_dtype_size(out_dtype);
    if (out) FP_CHECK_ARG(out_count > 0 && elt > 0, "out given with out_count 0 or an unknown out_dtype");
    fp_compare_result agree;
    memset(&agree, 0, sizeof agree);
    if (out) {
        /* eager result kept aside; then the replay's, on poisoned output */
        void *ref = NULL;
        FP_TRY(fp_mem_alloc(ctx, out_count * elt, &ref));
        fp_status st = fn(user, stream);
        if (st == FP_OK) st = copy_on(ctx, ref, out, out_count * elt, stream);
        if (st == FP_OK) st = fp_mem_fill(ctx, (void *)out, 0xFF, out_count * elt, stream);
        if (st == FP_OK) st = fp_graph_replay_unchecked(g, stream);
        if (st == FP_OK) st = fp_context_synchronize(ctx, stream);
        if (st == FP_OK) st = fp_compare(ctx, ref, out, out_count, out_dtype, -1, -1, &agree);
        fp_mem_free(ctx, ref);
        FP_TRY(st);
    }
    replay_arg ra = {g};
    fp_ab_spec spec;
    fp_ab_spec_init(&spec);
    spec.baseline = fn;
    spec.baseline_user = user;
    spec.optimized = replay_fn;
    spec.optimized_user = &ra;
    fp_ab_report rep;
    FP_TRY(fp_ab_run(ctx, stream, &spec, cfg, &rep));
    if (out) {
        rep.compared = 1;
        rep.agreement = agree;
    }
    *report = rep;
    if (saved_us_per_kernel)
        *saved_us_per_kernel = g->info.kernel_nodes
                                   ? (rep.baseline.median_ms - rep.optimized.median_ms) * 1e3 / (double)g->info.kernel_nodes
                                   : 0.0;
    return FP_OK;
}

fp_status fp_graph_pad_rows(fp_context *ctx, fp_stream stream, void *base, size_t row_bytes, int64_t n,
                            int64_t bucket, int value) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_ARG(n >= 0 && n <= bucket, "n (%lld) must be in [0, bucket] (bucket %lld)", (long long)n,
                 (long long)bucket);
    if (n == bucket || row_bytes == 0) return FP_OK;
    FP_CHECK_NOT_NULL(base);
    FP_CHECK_ARG((uint64_t)bucket <= SIZE_MAX / row_bytes, "bucket * row_bytes overflows");
    return fp_mem_fill(ctx, (char *)base + (size_t)n * row_bytes, value, (size_t)(bucket - n) * row_bytes, stream);
}
