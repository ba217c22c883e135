/* comm.h on CUDA contexts (label gpu; exits 77 without a device): one rank
 * per device, each on its own thread, up to 4 ranks. On one GPU only the
 * cases that make sense with one rank run (real NCCL). Also built on the
 * emulated runtime with the emulated NCCL and FP_EMU_DEVICES=4
 * (test_comm_gpu_emu, tests/emu): 4 ranks as threads, and the fault
 * injection of tests/emu/nccl_emu.h (hangs, errors).
 *
 * Cases: every collective and dtype against a host reference; init_all and
 * group calls from one thread; buckets (packing rules, results with ranks
 * marking in different orders, flat views, bad input, exposure); the
 * watchdog naming a rank that never enters a collective; a mismatch
 * reported instead of hanging; injected hang / errors; init timeout;
 * split; bench; the A/B and the tuner; abort; a ledger that wraps; the
 * collectives' trace spans (trace.h). */
#include <pthread.h>
#include <string.h>

#include "fastpath/trace.h"
#include "fp_test.h"
#include "internal.h"
#ifdef FP_CUDA_EMU
#include "nccl_emu.h"
#endif

/* Checks from rank threads. */
static pthread_mutex_t g_check_mu = PTHREAD_MUTEX_INITIALIZER;
#define RCHECK_MSG(cond, ...)                                                        \
    do {                                                                             \
        if (!(cond)) {                                                               \
            pthread_mutex_lock(&g_check_mu);                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
            fp_test_failures++;                                                      \
            pthread_mutex_unlock(&g_check_mu);                                       \
        }                                                                            \
    } while (0)
#define RCHECK(cond) RCHECK_MSG(cond, "rank %d", r->rank)
#define RCHECK_STATUS(expr, want)                                                                  \
    do {                                                                                           \
        fp_status got_ = (expr);                                                                   \
        RCHECK_MSG(got_ == (want), "rank %d: %s is %s, want %s (%s)", r->rank, #expr,              \
                   fp_status_string(got_), fp_status_string(want), fp_last_error());               \
    } while (0)
#define RCHECK_OK(expr) RCHECK_STATUS(expr, FP_OK)

/* ------------------------------------------------------------------------ */
/*  Ranks as threads                                                        */
/* ------------------------------------------------------------------------ */

typedef struct rank_ctx rank_ctx;
typedef void (*rank_fn)(rank_ctx *r);
typedef struct shared {
    int n;
    fp_comm_id id;
    fp_comm_config cfg;
    pthread_barrier_t bar;
    rank_fn fn;
    void *arg;
    int callbacks;               /* on_failure calls */
    int init_failed;             /* a rank could not join: the others skip fn */
    pthread_mutex_t mu;
} shared;
struct rank_ctx {
    int rank;
    shared *sh;
    fp_context *ctx;
    fp_comm *comm;
    pthread_t th;
};

static void on_failure(void *user, fp_comm *comm, const fp_comm_failure_info *info) {
    shared *sh = user;
    (void)comm;
    (void)info;
    pthread_mutex_lock(&sh->mu);
    sh->callbacks++;
    pthread_mutex_unlock(&sh->mu);
}

static void *rank_main(void *p) {
    rank_ctx *r = p;
    fp_status st = fp_context_create(FP_DEVICE_CUDA, r->rank, &r->ctx);
    RCHECK_MSG(st == FP_OK, "context on device %d: %s", r->rank, fp_last_error());
    if (st == FP_OK) {
        st = fp_comm_init(r->ctx, &r->sh->id, r->sh->n, r->rank, &r->sh->cfg, &r->comm);
        RCHECK_MSG(st == FP_OK, "rank %d init: %s", r->rank, fp_last_error());
    }
    if (st != FP_OK) {
        pthread_mutex_lock(&r->sh->mu);
        r->sh->init_failed = 1;
        pthread_mutex_unlock(&r->sh->mu);
    }
    /* Every rank joined before any goes on (an abort in fn must not reach a
     * rank still waiting for its init to complete). */
    pthread_barrier_wait(&r->sh->bar);
    pthread_mutex_lock(&r->sh->mu);
    if (r->sh->init_failed) st = FP_ERR_INTERNAL;
    pthread_mutex_unlock(&r->sh->mu);
    if (st == FP_OK) {
        RCHECK(fp_comm_rank(r->comm) == r->rank && fp_comm_nranks(r->comm) == r->sh->n);
        RCHECK(fp_comm_stream(r->comm) != NULL);
        r->sh->fn(r);
    }
    fp_comm_destroy(r->comm);
    if (r->ctx) fp_context_destroy(r->ctx);
    return NULL;
}

/* Runs fn on n ranks of a fresh communicator (cfg NULL: defaults). */
static int run_ranks(int n, const fp_comm_config *cfg, rank_fn fn, void *arg) {
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.n = n;
    sh.fn = fn;
    sh.arg = arg;
    pthread_mutex_init(&sh.mu, NULL);
    if (cfg) sh.cfg = *cfg;
    else fp_comm_config_default(&sh.cfg);
    sh.cfg.on_failure = on_failure;
    sh.cfg.user = &sh;
    if (fp_comm_get_unique_id(&sh.id) != FP_OK) {
        CHECK_MSG(0, "fp_comm_get_unique_id: %s", fp_last_error());
        return 0;
    }
    pthread_barrier_init(&sh.bar, NULL, (unsigned)n);
    rank_ctx rs[8];
    memset(rs, 0, sizeof rs);
    for (int i = 0; i < n; ++i) {
        rs[i].rank = i;
        rs[i].sh = &sh;
        pthread_create(&rs[i].th, NULL, rank_main, &rs[i]);
    }
    for (int i = 0; i < n; ++i) pthread_join(rs[i].th, NULL);
    pthread_barrier_destroy(&sh.bar);
    pthread_mutex_destroy(&sh.mu);
    return sh.callbacks;
}

static void barrier(rank_ctx *r) { pthread_barrier_wait(&r->sh->bar); }

/* Device buffers of n elements of dtype holding the floats h. */
static void *upload(const float *h, size_t n, fp_dtype dt) {
    size_t bytes = n * fp_dtype_size(dt);
    void *tmp = malloc(bytes), *d = NULL;
    fp_convert_host(h, FP_F32, tmp, dt, n);
    if (cudaMalloc(&d, bytes) == cudaSuccess) cudaMemcpy(d, tmp, bytes, cudaMemcpyHostToDevice);
    free(tmp);
    return d;
}
static void download(const void *d, size_t n, fp_dtype dt, float *h) {
    size_t bytes = n * fp_dtype_size(dt);
    void *tmp = malloc(bytes);
    cudaMemcpy(tmp, d, bytes, cudaMemcpyDeviceToHost);
    fp_convert_host(tmp, dt, h, FP_F32, n);
    free(tmp);
}

/* Every rank's input: small integers, exact in f16 and bf16, and in their
 * sums over 4 ranks. */
static float val(int rank, size_t i) { return (float)(rank + 1) + (float)(i % 7); }

/* ------------------------------------------------------------------------ */
/*  Collectives                                                             */
/* ------------------------------------------------------------------------ */

static void case_collectives(rank_ctx *r) {
    const int n = r->sh->n;
    const fp_dtype dts[3] = {FP_F32, FP_F16, FP_BF16};
    const size_t c = 1001;
    float *h = malloc(n * c * sizeof *h), *got = malloc(n * c * sizeof *got);
    int ncoll = 0;
    for (int k = 0; k < 3; ++k) {
        const fp_dtype dt = dts[k];
        for (size_t i = 0; i < n * c; ++i) h[i] = val(r->rank, i);
        void *send = upload(h, n * c, dt);
        void *recv = upload(h, n * c, dt);
        /* all-reduce sum, out of place */
        RCHECK_OK(fp_comm_allreduce(r->comm, send, recv, c, dt, FP_REDUCE_SUM, NULL));
        RCHECK_OK(fp_comm_synchronize(r->comm, 20000));
        RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
        download(recv, c, dt, got);
        int bad = 0;
        for (size_t i = 0; i < c; ++i) bad += got[i] != (float)(n * (n + 1) / 2) + (float)n * (float)(i % 7);
        RCHECK_MSG(bad == 0, "rank %d allreduce sum %s: %d wrong", r->rank, fp_dtype_name(dt), bad);
        /* avg, in place */
        RCHECK_OK(fp_comm_allreduce(r->comm, send, send, c, dt, FP_REDUCE_AVG, NULL));
        /* max into recv */
        RCHECK_OK(fp_comm_allreduce(r->comm, recv, recv, c, dt, FP_REDUCE_MAX, NULL));
        RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
        download(send, c, dt, got);
        bad = 0;
        for (size_t i = 0; i < c; ++i) bad += got[i] != (float)(n + 1) / 2.0f + (float)(i % 7);
        RCHECK_MSG(bad == 0, "rank %d allreduce avg %s: %d wrong", r->rank, fp_dtype_name(dt), bad);
        download(recv, c, dt, got); /* max over ranks of the sums: the sums themselves */
        bad = 0;
        for (size_t i = 0; i < c; ++i) bad += got[i] != (float)(n * (n + 1) / 2) + (float)n * (float)(i % 7);
        RCHECK_MSG(bad == 0, "rank %d allreduce max %s: %d wrong", r->rank, fp_dtype_name(dt), bad);
        /* all-gather: rank j's c elements at j * c */
        cudaFree(send);
        for (size_t i = 0; i < n * c; ++i) h[i] = val(r->rank, i);
        send = upload(h, n * c, dt);
        RCHECK_OK(fp_comm_allgather(r->comm, send, recv, c, dt, NULL));
        RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
        download(recv, n * c, dt, got);
        bad = 0;
        for (int j = 0; j < n; ++j)
            for (size_t i = 0; i < c; ++i) bad += got[j * c + i] != val(j, i);
        RCHECK_MSG(bad == 0, "rank %d allgather %s: %d wrong", r->rank, fp_dtype_name(dt), bad);
        /* reduce-scatter: block `rank` of the sum */
        RCHECK_OK(fp_comm_reduce_scatter(r->comm, send, recv, c, dt, FP_REDUCE_SUM, NULL));
        RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
        download(recv, c, dt, got);
        bad = 0;
        for (size_t i = 0; i < c; ++i)
            bad += got[i] != (float)(n * (n + 1) / 2) + (float)n * (float)((r->rank * c + i) % 7);
        RCHECK_MSG(bad == 0, "rank %d reduce_scatter %s: %d wrong", r->rank, fp_dtype_name(dt), bad);
        /* broadcast from the last rank (the others pass no send buffer) */
        const int root = n - 1;
        RCHECK_OK(fp_comm_broadcast(r->comm, r->rank == root ? send : NULL, recv, c, dt, root, NULL));
        RCHECK_OK(fp_comm_synchronize(r->comm, 20000));
        RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
        download(recv, c, dt, got);
        bad = 0;
        for (size_t i = 0; i < c; ++i) bad += got[i] != val(root, i);
        RCHECK_MSG(bad == 0, "rank %d broadcast %s: %d wrong", r->rank, fp_dtype_name(dt), bad);
        ncoll += 6;
        cudaFree(send);
        cudaFree(recv);
    }
    /* Bad arguments: nothing enqueued, the seq not taken. */
    float dummy;
    RCHECK_STATUS(fp_comm_allreduce(r->comm, &dummy, &dummy, 0, FP_F32, FP_REDUCE_SUM, NULL), FP_ERR_INVALID_ARGUMENT);
    RCHECK_STATUS(fp_comm_allreduce(r->comm, NULL, &dummy, 1, FP_F32, FP_REDUCE_SUM, NULL), FP_ERR_INVALID_ARGUMENT);
    RCHECK_STATUS(fp_comm_allreduce(r->comm, &dummy, &dummy, 1, FP_FP8_E4M3, FP_REDUCE_SUM, NULL),
                  FP_ERR_INVALID_ARGUMENT);
    RCHECK_STATUS(fp_comm_allreduce(r->comm, &dummy, &dummy, 1, FP_F32, (fp_reduce_op)9, NULL), FP_ERR_INVALID_ARGUMENT);
    RCHECK_STATUS(fp_comm_broadcast(r->comm, &dummy, &dummy, 1, FP_F32, n, NULL), FP_ERR_INVALID_ARGUMENT);
    /* The ledger: every collective, in order, ended; the statistics. */
    fp_coll_record rec[64];
    int nr = 0;
    RCHECK_OK(fp_comm_ledger(r->comm, rec, 64, &nr));
    RCHECK_MSG(nr == ncoll, "rank %d: ledger has %d, want %d", r->rank, nr, ncoll);
    for (int i = 0; i < nr; ++i) {
        RCHECK(rec[i].seq == (uint64_t)i && rec[i].state == FP_COLL_ENDED && rec[i].duration_ms >= 0);
        RCHECK(rec[i].start_ms >= rec[i].enqueue_ms - 1e-6);
    }
    if (nr >= 6) RCHECK(rec[0].kind == FP_COLL_ALLREDUCE && rec[3].kind == FP_COLL_ALLGATHER &&
                        rec[4].kind == FP_COLL_REDUCE_SCATTER && rec[5].kind == FP_COLL_BROADCAST &&
                        rec[5].root == n - 1 && rec[1].op == FP_REDUCE_AVG && rec[0].count == c);
    fp_comm_stats s;
    fp_comm_stats_init(&s);
    RCHECK_OK(fp_comm_get_stats(r->comm, &s));
    RCHECK(s.enqueued == (uint64_t)ncoll && s.ended == (uint64_t)ncoll && s.aborted == 0);
    RCHECK(s.kind[FP_COLL_ALLREDUCE].calls == 9 && s.kind[FP_COLL_BROADCAST].calls == 3);
    RCHECK(s.kind[FP_COLL_ALLREDUCE].latency.samples == 9);
    const fp_coll_stats *ag = &s.kind[FP_COLL_ALLGATHER];
    RCHECK_MSG(fabs(ag->bytes - (double)n * c * (4 + 2 + 2)) < 1e-6, "allgather bytes %.0f", ag->bytes);
    if (ag->algbw_gbps > 0)
        RCHECK(fabs(ag->busbw_gbps - ag->algbw_gbps * fp_coll_busbw_factor(FP_COLL_ALLGATHER, n)) <
               1e-9 * ag->algbw_gbps + 1e-12);
    RCHECK_OK(fp_comm_reset_stats(r->comm));
    RCHECK_OK(fp_comm_get_stats(r->comm, &s));
    RCHECK(s.enqueued == 0 && s.kind[FP_COLL_ALLREDUCE].calls == 0);
    free(h);
    free(got);
}

/* Traced: each collective is one span of category "collective" with its
 * name, nccl-tests bytes and the rank count, tagged by the user range; a
 * refused call records nothing; no span left open. */
static void case_traced(rank_ctx *r) {
    const int n = r->sh->n;
    const size_t c = 1001;
    float *h = malloc(n * c * sizeof *h);
    for (size_t i = 0; i < n * c; ++i) h[i] = val(r->rank, i);
    void *send = upload(h, n * c, FP_F32), *recv = upload(h, n * c, FP_F32);
    RCHECK_OK(fp_trace_enable(r->ctx, 64));
    RCHECK_OK(fp_trace_push(r->ctx, "dp", "grad_sync"));
    float dummy;
    RCHECK_STATUS(fp_comm_allreduce(r->comm, &dummy, &dummy, 0, FP_F32, FP_REDUCE_SUM, NULL), FP_ERR_INVALID_ARGUMENT);
    RCHECK_OK(fp_comm_allreduce(r->comm, send, recv, c, FP_F32, FP_REDUCE_SUM, NULL));
    RCHECK_OK(fp_comm_allgather(r->comm, send, recv, c, FP_F32, NULL));
    RCHECK_OK(fp_comm_reduce_scatter(r->comm, send, recv, c, FP_F32, FP_REDUCE_SUM, NULL));
    RCHECK_OK(fp_comm_broadcast(r->comm, send, recv, c, FP_F32, 0, NULL));
    RCHECK_OK(fp_comm_synchronize(r->comm, 20000));
    RCHECK_OK(fp_trace_pop(r->ctx));
    RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
    fp_trace_span sp[16];
    size_t ns = 0;
    RCHECK_OK(fp_trace_read(r->ctx, sp, 16, &ns, 1));
    fp_trace_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    RCHECK_OK(fp_trace_get_stats(r->ctx, &st));
    RCHECK(st.open == 0);
    const char *names[4] = {"allreduce", "allgather", "reduce_scatter", "broadcast"};
    const fp_coll_kind kinds[4] = {FP_COLL_ALLREDUCE, FP_COLL_ALLGATHER, FP_COLL_REDUCE_SCATTER, FP_COLL_BROADCAST};
    /* and the fp_context_synchronize's host wait, after the range */
    RCHECK_MSG(ns == 6, "rank %d: %zu spans (want 4 collectives, the range and the sync)", r->rank, ns);
    RCHECK(ns == 6 && strcmp(sp[5].name, "synchronize") == 0 && strcmp(sp[5].category, "sync") == 0 &&
           sp[5].module[0] == '\0');
    for (int k = 0; k < 4; ++k) {
        int found = 0;
        for (size_t i = 0; i < ns; ++i) {
            const fp_trace_span *s = &sp[i];
            if (strcmp(s->name, names[k]) != 0) continue;
            ++found;
            RCHECK_MSG(strcmp(s->category, "collective") == 0 && s->nranks == n &&
                           s->bytes == fp_coll_bytes(kinds[k], c, FP_F32, n) && strcmp(s->module, "dp") == 0 &&
                           strcmp(s->stage, "grad_sync") == 0,
                       "rank %d %s: category %s nranks %d bytes %.0f module %s", r->rank, names[k], s->category,
                       s->nranks, s->bytes, s->module);
        }
        RCHECK_MSG(found == 1, "rank %d: %d %s spans", r->rank, found, names[k]);
    }
    RCHECK_OK(fp_trace_disable(r->ctx));
    cudaFree(send);
    cudaFree(recv);
    free(h);
}

/* One thread, every rank: fp_comm_init_all and group calls. */
static void case_init_all(int n) {
    fp_context *ctxs[4] = {0};
    fp_comm *comms[4] = {0};
    void *buf[4] = {0};
    const size_t c = 4096;
    float *h = malloc(c * sizeof *h), *got = malloc(c * sizeof *got);
    for (int i = 0; i < n; ++i) CHECK_OK(fp_context_create(FP_DEVICE_CUDA, i, &ctxs[i]));
    CHECK_OK(fp_comm_init_all(ctxs, n, NULL, comms));
    for (int i = 0; i < n; ++i) {
        CHECK(comms[i] && fp_comm_rank(comms[i]) == i && fp_comm_nranks(comms[i]) == n);
        for (size_t k = 0; k < c; ++k) h[k] = val(i, k);
        CHECK_OK(fp_ctx_activate(ctxs[i]));
        buf[i] = upload(h, c, FP_F32);
    }
    CHECK_OK(fp_comm_group_start());
    for (int i = 0; i < n; ++i) CHECK_OK(fp_comm_allreduce(comms[i], buf[i], buf[i], c, FP_F32, FP_REDUCE_SUM, NULL));
    CHECK_OK(fp_comm_group_end());
    for (int i = 0; i < n; ++i) {
        CHECK_OK(fp_comm_synchronize(comms[i], 20000));
        CHECK_OK(fp_context_synchronize(ctxs[i], NULL));
        download(buf[i], c, FP_F32, got);
        int bad = 0;
        for (size_t k = 0; k < c; ++k) bad += got[k] != (float)(n * (n + 1) / 2) + (float)n * (float)(k % 7);
        CHECK_MSG(bad == 0, "init_all rank %d: %d wrong", i, bad);
        fp_coll_record rec[4];
        int nr = 0;
        CHECK_OK(fp_comm_ledger(comms[i], rec, 4, &nr));
        CHECK(nr == 1 && rec[0].state == FP_COLL_ENDED);
    }
    /* Split from one thread: the children are ready after the group ends. */
    fp_comm *kids[4] = {0};
    CHECK_OK(fp_comm_group_start());
    for (int i = 0; i < n; ++i) CHECK_OK(fp_comm_split(comms[i], i % 2, i, NULL, &kids[i]));
    CHECK_OK(fp_comm_group_end());
    for (int i = 0; i < n; ++i) {
        const int members = (n - (i % 2) + 1) / 2; /* ranks of the same parity */
        CHECK_MSG(kids[i] && fp_comm_nranks(kids[i]) == members && fp_comm_rank(kids[i]) == i / 2,
                  "grouped split: rank %d got %d of %d, want %d of %d", i, kids[i] ? fp_comm_rank(kids[i]) : -1,
                  kids[i] ? fp_comm_nranks(kids[i]) : 0, i / 2, members);
    }
    for (int i = 0; i < n; ++i) fp_comm_destroy(kids[i]);
    /* Duplicated devices are refused. */
    if (n >= 1) {
        fp_context *dup[2] = {ctxs[0], ctxs[0]};
        fp_comm *dc[2];
        CHECK_STATUS(fp_comm_init_all(dup, 2, NULL, dc), FP_ERR_INVALID_ARGUMENT);
    }
    CHECK_STATUS(fp_comm_group_end(), FP_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < n; ++i) {
        fp_comm_destroy(comms[i]);
        cudaFree(buf[i]);
        fp_context_destroy(ctxs[i]);
    }
    free(h);
    free(got);
}

/* ------------------------------------------------------------------------ */
/*  Buckets                                                                 */
/* ------------------------------------------------------------------------ */

#define NT 200
typedef struct bucket_case {
    fp_comm_tensor t[NT];
    size_t off[NT + 1];          /* elements, into each rank's source */
} bucket_case;

/* 200 tensors, transformer-like in shape (h x h weights, 4h MLP pairs,
 * h-sized biases and norms), every tenth bf16. */
static void make_list(bucket_case *bc, size_t h) {
    const size_t pat[5] = {h * h, h, 4 * h * h, 4 * h, h};
    bc->off[0] = 0;
    for (int i = 0; i < NT; ++i) {
        bc->t[i].count = pat[i % 5] + (size_t)(i % 3); /* odd sizes too */
        bc->t[i].dtype = i % 10 == 9 ? FP_BF16 : FP_F32;
        bc->t[i].data = NULL;
        bc->off[i + 1] = bc->off[i] + bc->t[i].count;
    }
}

/* The packing rules of fp_buckets_config, checked from the outside. */
static void check_packing(rank_ctx *r, const fp_buckets *b, const bucket_case *bc, const fp_buckets_config *cfg) {
    const int nb = fp_buckets_count(b);
    RCHECK(nb >= 2);
    size_t *bytes = calloc((size_t)nb, sizeof *bytes), *count = calloc((size_t)nb, sizeof *count);
    int *ntens = calloc((size_t)nb, sizeof *ntens), *dtype = malloc((size_t)nb * sizeof *dtype);
    int *last_of = malloc((size_t)nb * sizeof *last_of), *first_of = malloc((size_t)nb * sizeof *first_of);
    for (int k = 0; k < nb; ++k) dtype[k] = -1, last_of[k] = -1, first_of[k] = -1;
    int prev_bucket[3] = {-1, -1, -1};
    int nth_of_dtype[3] = {0, 0, 0};
    int *which = calloc((size_t)nb, sizeof *which); /* this dtype's how-many-th bucket */
    for (int i = 0; i < NT; ++i) {
        int k = -1;
        size_t off = 0;
        RCHECK_OK(fp_buckets_tensor_bucket(b, i, &k, &off));
        if (k < 0 || k >= nb) continue;
        const fp_dtype d = bc->t[i].dtype;
        RCHECK_MSG(dtype[k] == -1 || dtype[k] == (int)d, "bucket %d mixes dtypes", k);
        dtype[k] = (int)d;
        RCHECK_MSG(off == count[k], "tensor %d at offset %zu of bucket %d, want %zu", i, off, k, count[k]);
        /* Same-dtype tensors fill buckets in list order. */
        RCHECK_MSG(k >= prev_bucket[d], "tensor %d goes back to bucket %d from %d", i, k, prev_bucket[d]);
        if (k != prev_bucket[d]) {
            which[k] = ++nth_of_dtype[d];
            first_of[k] = i;
            if (prev_bucket[d] >= 0) {
                /* the previous one closed: full, or this tensor did not fit */
                const int p = prev_bucket[d];
                const size_t cap = which[p] == 1 ? cfg->first_bucket_cap_bytes : cfg->bucket_cap_bytes;
                RCHECK_MSG(bytes[p] >= cap || bytes[p] + bc->t[i].count * fp_dtype_size(d) > cap,
                           "bucket %d closed at %zu bytes (cap %zu) though tensor %d fitted", p, bytes[p], cap, i);
            }
        }
        prev_bucket[d] = k;
        last_of[k] = i;
        count[k] += bc->t[i].count;
        bytes[k] += bc->t[i].count * fp_dtype_size(d);
        ntens[k]++;
    }
    for (int k = 0; k < nb; ++k) {
        RCHECK_MSG(ntens[k] > 0, "bucket %d is empty", k);
        const size_t cap = which[k] == 1 ? cfg->first_bucket_cap_bytes : cfg->bucket_cap_bytes;
        RCHECK_MSG(bytes[k] <= cap || ntens[k] == 1, "bucket %d holds %zu bytes in %d tensors (cap %zu)", k, bytes[k],
                   ntens[k], cap);
    }
    free(bytes), free(count), free(ntens), free(dtype), free(last_of), free(first_of), free(which);
}

/* Each rank's source: tensor i holds (rank + 1) + (i % 5) in every element. */
static void *make_source(int rank, const bucket_case *bc) {
    size_t total = bc->off[NT];
    float *h = malloc(total * sizeof *h);
    void *d = NULL;
    /* Stored per tensor in its own dtype: byte offsets differ from element
     * offsets, so the source is laid out as the tensors are (4 bytes per
     * element, bf16 tensors use the first half). */
    cudaMalloc(&d, total * 4);
    for (int i = 0; i < NT; ++i) {
        for (size_t k = 0; k < bc->t[i].count; ++k) h[k] = (float)(rank + 1) + (float)(i % 5);
        size_t bytes = bc->t[i].count * fp_dtype_size(bc->t[i].dtype);
        void *tmp = malloc(bytes);
        fp_convert_host(h, FP_F32, tmp, bc->t[i].dtype, bc->t[i].count);
        cudaMemcpy((char *)d + bc->off[i] * 4, tmp, bytes, cudaMemcpyHostToDevice);
        free(tmp);
    }
    free(h);
    return d;
}

typedef struct produce_arg {
    const bucket_case *bc;
    const void *src;
} produce_arg;

static fp_status produce(void *user, int i, void *data, fp_stream stream) {
    const produce_arg *p = user;
    size_t bytes = p->bc->t[i].count * fp_dtype_size(p->bc->t[i].dtype);
    cudaError_t e = cudaMemcpyAsync(data, (const char *)p->src + p->bc->off[i] * 4, bytes, cudaMemcpyDeviceToDevice,
                                    (cudaStream_t)stream);
    return e == cudaSuccess ? FP_OK : FP_ERR_CUDA;
}

static void check_results(rank_ctx *r, const fp_buckets *b, const bucket_case *bc, const char *what) {
    const int n = r->sh->n;
    float *got = malloc(5 * 4096 * 4 * sizeof *got + 64 * 64 * 16 * sizeof *got);
    int bad = 0, first = -1;
    for (int i = 0; i < NT; ++i) {
        void *data = NULL;
        fp_buckets_tensor_data(b, i, &data);
        download(data, bc->t[i].count, bc->t[i].dtype, got);
        const float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 5);
        for (size_t k = 0; k < bc->t[i].count; ++k)
            if (got[k] != want) {
                bad++;
                if (first < 0) first = i;
                break;
            }
    }
    RCHECK_MSG(bad == 0, "rank %d %s: %d tensors wrong, the first %d", r->rank, what, bad, first);
    free(got);
}

static void case_buckets(rank_ctx *r) {
    bucket_case *bc = calloc(1, sizeof *bc);
    make_list(bc, 32); /* quick and emulated: about 2 MB in all */
    void *src = make_source(r->rank, bc);
    /* Tensors of the baseline's memory (copy mode). */
    void *mem = NULL;
    cudaMalloc(&mem, bc->off[NT] * 4);
    for (int i = 0; i < NT; ++i) bc->t[i].data = (char *)mem + bc->off[i] * 4;
    fp_buckets_config cfg;
    fp_buckets_config_default(&cfg);
    cfg.bucket_cap_bytes = 64 << 10;
    cfg.first_bucket_cap_bytes = 8 << 10;
    /* Bad configurations. */
    fp_buckets *b = NULL;
    fp_buckets_config bad = cfg;
    bad.op = FP_REDUCE_MAX;
    RCHECK_STATUS(fp_buckets_create(r->comm, bc->t, NT, &bad, &b), FP_ERR_INVALID_ARGUMENT);
    bad = cfg;
    bad.bucket_cap_bytes = 0;
    RCHECK_STATUS(fp_buckets_create(r->comm, bc->t, NT, &bad, &b), FP_ERR_INVALID_ARGUMENT);
    RCHECK_STATUS(fp_buckets_create(r->comm, bc->t, 0, &cfg, &b), FP_ERR_INVALID_ARGUMENT);
    fp_comm_tensor t0 = bc->t[0];
    bc->t[0].count = 0;
    RCHECK_STATUS(fp_buckets_create(r->comm, bc->t, NT, &cfg, &b), FP_ERR_INVALID_ARGUMENT);
    bc->t[0] = t0;
    bc->t[0].data = NULL;
    RCHECK_STATUS(fp_buckets_create(r->comm, bc->t, NT, &cfg, &b), FP_ERR_INVALID_ARGUMENT);
    bc->t[0] = t0;
    RCHECK(b == NULL);

    RCHECK_OK(fp_buckets_create(r->comm, bc->t, NT, &cfg, &b));
    if (!b) return;
    check_packing(r, b, bc, &cfg);
    produce_arg pa = {bc, src};
    fp_stream s = fp_context_stream(r->ctx);
    for (int it = 0; it < 2; ++it) {
        cudaMemset(mem, 0xFF, bc->off[NT] * 4);
        /* Ranks mark in different orders: odd ranks backwards. Buckets
         * still reduce in bucket order on every rank. */
        for (int j = 0; j < NT; ++j) {
            int i = r->rank % 2 ? NT - 1 - j : j;
            void *data = NULL;
            RCHECK_OK(fp_buckets_tensor_data(b, i, &data));
            RCHECK(data == bc->t[i].data);
            RCHECK_OK(produce(&pa, i, data, s));
            if (j == NT - 1) {
                /* Every tensor but one marked: wait names it, changes nothing. */
                RCHECK_STATUS(fp_buckets_wait(b, s), FP_ERR_INVALID_ARGUMENT);
                char want[64];
                snprintf(want, sizeof want, "tensor %d ", i);
                RCHECK_MSG(strstr(fp_last_error(), want) != NULL, "wait message: %s", fp_last_error());
            }
            RCHECK_OK(fp_buckets_mark_ready(b, i, data, s));
            if (j == 0) {
                RCHECK_STATUS(fp_buckets_mark_ready(b, i, data, s), FP_ERR_INVALID_ARGUMENT); /* twice */
                RCHECK(strstr(fp_last_error(), "already marked") != NULL);
            }
        }
        /* A pointer that is not the registered one: the list changed. */
        RCHECK_STATUS(fp_buckets_mark_ready(b, 3, (char *)bc->t[3].data + 4, s), FP_ERR_INVALID_ARGUMENT);
        RCHECK(strstr(fp_last_error(), "changed after registration") != NULL);
        RCHECK_OK(fp_buckets_wait(b, s));
        RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
        check_results(r, b, bc, it ? "buckets (copy mode), iteration 2" : "buckets (copy mode)");
    }
    int idx = -1;
    RCHECK_OK(fp_buckets_find(b, bc->t[7].data, &idx));
    RCHECK(idx == 7);
    RCHECK_STATUS(fp_buckets_find(b, src, &idx), FP_ERR_NOT_FOUND);
    RCHECK_STATUS(fp_buckets_mark_ready(b, NT, NULL, s), FP_ERR_INVALID_ARGUMENT);
    RCHECK_STATUS(fp_buckets_tensor_bucket(b, -1, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_buckets_destroy(b);
    fp_comm_stats st;
    fp_comm_stats_init(&st);
    RCHECK_OK(fp_comm_get_stats(r->comm, &st));
    RCHECK_MSG(st.iterations == 2 && st.exposed_ms >= 0, "rank %d: %llu iterations, exposed %.3f ms", r->rank,
               (unsigned long long)st.iterations, st.exposed_ms);

    /* Flat views: the buckets own the memory; the caller's pointers are ignored. */
    fp_buckets_config fv = cfg;
    fv.flat_views = 1;
    fp_comm_tensor *views = malloc(NT * sizeof *views);
    for (int i = 0; i < NT; ++i) views[i] = (fp_comm_tensor){NULL, bc->t[i].count, bc->t[i].dtype};
    RCHECK_OK(fp_buckets_create(r->comm, views, NT, &fv, &b));
    if (b) {
        void *d0 = NULL, *d1 = NULL;
        fp_buckets_tensor_data(b, 0, &d0);
        fp_buckets_tensor_data(b, 1, &d1);
        int k0 = -1, k1 = -1;
        fp_buckets_tensor_bucket(b, 0, &k0, NULL);
        fp_buckets_tensor_bucket(b, 1, &k1, NULL);
        RCHECK(d0 != NULL && (k0 != k1 || (char *)d1 == (char *)d0 + bc->t[0].count * 4));
        for (int i = 0; i < NT; ++i) {
            void *data = NULL;
            fp_buckets_tensor_data(b, i, &data);
            RCHECK_OK(produce(&pa, i, data, s));
            RCHECK_OK(fp_buckets_mark_ready(b, i, NULL, s));
        }
        RCHECK_OK(fp_buckets_wait(b, s));
        RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
        check_results(r, b, bc, "buckets (flat views)");
        fp_buckets_destroy(b);
    }
    free(views);
    cudaFree(mem);
    cudaFree(src);
    free(bc);
}

/* ------------------------------------------------------------------------ */
/*  Failures                                                                */
/* ------------------------------------------------------------------------ */

/* The last rank never enters collective 1: every rank's watchdog report
 * names it, within the timeout plus 1 s. */
static void case_watchdog(rank_ctx *r) {
    const int n = r->sh->n, late = n - 1;
    float *d = NULL;
    cudaMalloc((void **)&d, 1024 * sizeof *d);
    cudaMemset(d, 0, 1024 * sizeof *d);
    RCHECK_OK(fp_comm_allreduce(r->comm, d, d, 1024, FP_F32, FP_REDUCE_SUM, NULL));
    RCHECK_OK(fp_comm_synchronize(r->comm, 20000));
    barrier(r);
    if (r->rank != late) {
        const double t0 = fp_now_s();
        RCHECK_OK(fp_comm_allreduce(r->comm, d, d, 1024, FP_F32, FP_REDUCE_SUM, NULL));
        RCHECK_STATUS(fp_comm_synchronize(r->comm, 10000), FP_ERR_TIMEOUT);
        const double dt = fp_now_s() - t0;
        RCHECK_MSG(dt < r->sh->cfg.timeout_ms / 1e3 + 1.0, "rank %d: the watchdog took %.2f s (timeout %.2f s)",
                   r->rank, dt, r->sh->cfg.timeout_ms / 1e3);
        char want[64];
        snprintf(want, sizeof want, "Rank %d has not entered it", late);
        RCHECK_MSG(strstr(fp_last_error(), want) != NULL, "report: %s", fp_last_error());
        RCHECK_MSG(strstr(fp_last_error(), "Collective 1 ") != NULL, "report: %s", fp_last_error());
    }
    /* The late rank finds its communicator aborted with the same report. */
    double t0 = fp_now_s();
    while (fp_comm_failure(r->comm, NULL, 0) == FP_OK && fp_now_s() - t0 < 5) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    char rep[2048];
    RCHECK_STATUS(fp_comm_failure(r->comm, rep, sizeof rep), FP_ERR_TIMEOUT);
    RCHECK_MSG(strstr(rep, "has not entered it") != NULL, "rank %d report: %s", r->rank, rep);
    RCHECK_STATUS(fp_comm_allreduce(r->comm, d, d, 1024, FP_F32, FP_REDUCE_SUM, NULL), FP_ERR_TIMEOUT);
    fp_coll_record rec[8];
    int nr = 0;
    RCHECK_OK(fp_comm_ledger(r->comm, rec, 8, &nr));
    if (r->rank != late) RCHECK(nr == 2 && rec[0].state == FP_COLL_ENDED && rec[1].state == FP_COLL_ABORTED);
    else RCHECK(nr == 1);
    barrier(r);
    cudaFree(d);
}

/* Rank 1 enqueues collective 0 with another count: reported as a mismatch
 * on every rank, at once, instead of hanging until the timeout. */
static void case_mismatch(rank_ctx *r) {
    float *d = NULL;
    cudaMalloc((void **)&d, 2048 * sizeof *d);
    cudaMemset(d, 0, 2048 * sizeof *d);
    const double t0 = fp_now_s();
    if (r->rank == 0) RCHECK_OK(fp_comm_allreduce(r->comm, d, d, 1000, FP_F32, FP_REDUCE_SUM, NULL));
    barrier(r);
    if (r->rank == 1) {
        RCHECK_STATUS(fp_comm_allreduce(r->comm, d, d, 1001, FP_F32, FP_REDUCE_SUM, NULL), FP_ERR_MISMATCH);
        RCHECK_MSG(strstr(fp_last_error(), "Mismatched collective 0") != NULL &&
                       strstr(fp_last_error(), "x 1001") != NULL && strstr(fp_last_error(), "x 1000") != NULL,
                   "report: %s", fp_last_error());
    }
    barrier(r);
    if (r->rank >= 2) /* the others find the communicator aborted */
        RCHECK_STATUS(fp_comm_allreduce(r->comm, d, d, 1000, FP_F32, FP_REDUCE_SUM, NULL), FP_ERR_MISMATCH);
    RCHECK_STATUS(fp_comm_synchronize(r->comm, 5000), FP_ERR_MISMATCH);
    RCHECK_MSG(fp_now_s() - t0 < r->sh->cfg.timeout_ms / 1e3, "rank %d: the mismatch waited for the timeout",
               r->rank);
    barrier(r);
    cudaFree(d);
}

#ifdef FP_CUDA_EMU
/* The emulated NCCL's faults: a rank's stream stuck inside collective 1. */
static void case_injected_hang(rank_ctx *r) {
    float *d = NULL;
    cudaMalloc((void **)&d, 256 * sizeof *d);
    cudaMemset(d, 0, 256 * sizeof *d);
    for (int k = 0; k < 2; ++k) RCHECK_OK(fp_comm_allreduce(r->comm, d, d, 256, FP_F32, FP_REDUCE_SUM, NULL));
    RCHECK_STATUS(fp_comm_synchronize(r->comm, 10000), FP_ERR_TIMEOUT);
    RCHECK_MSG(strstr(fp_last_error(), "Collective 1 ") != NULL, "report: %s", fp_last_error());
    barrier(r);
    cudaFree(d);
}

/* A call that fails in NCCL: the status names NCCL's error, nothing is
 * enqueued, and the communicator goes on. */
static void case_call_error(rank_ctx *r) {
    const int n = r->sh->n;
    float *d = NULL, h[64], got[64];
    for (int i = 0; i < 64; ++i) h[i] = 1.0f;
    d = upload(h, 64, FP_F32);
    RCHECK_STATUS(fp_comm_allreduce(r->comm, d, d, 64, FP_F32, FP_REDUCE_SUM, NULL), FP_ERR_NCCL);
    RCHECK_MSG(strstr(fp_last_error(), "allreduce") != NULL, "message: %s", fp_last_error());
    barrier(r);
    if (r->rank == 0) fp_nccl_emu_reset();
    barrier(r);
    RCHECK_OK(fp_comm_allreduce(r->comm, d, d, 64, FP_F32, FP_REDUCE_SUM, NULL));
    RCHECK_OK(fp_comm_synchronize(r->comm, 10000));
    RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
    download(d, 64, FP_F32, got);
    RCHECK(got[0] == (float)n && got[63] == (float)n);
    barrier(r);
    cudaFree(d);
}

/* An error NCCL reports asynchronously: every rank fails with FP_ERR_NCCL. */
static void case_async_error(rank_ctx *r) {
    float *d = NULL;
    cudaMalloc((void **)&d, 64 * sizeof *d);
    cudaMemset(d, 0, 64 * sizeof *d);
    /* Rank 0 fails at run time; a rank that calls later may find the
     * communicator failed already: FP_ERR_NCCL at the call. */
    fp_status st = fp_comm_allreduce(r->comm, d, d, 64, FP_F32, FP_REDUCE_SUM, NULL);
    RCHECK_MSG(st == FP_OK || st == FP_ERR_NCCL, "rank %d: %s", r->rank, fp_last_error());
    RCHECK_STATUS(fp_comm_synchronize(r->comm, 10000), FP_ERR_NCCL);
    RCHECK_MSG(strstr(fp_last_error(), "asynchronous error") != NULL, "rank %d: %s", r->rank, fp_last_error());
    barrier(r);
    cudaFree(d);
}
#endif

/* nranks 2, only rank 0 comes: the init gives up after its timeout. */
static void case_init_timeout(void) {
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CUDA, 0, &ctx));
    fp_comm_id id;
    CHECK_OK(fp_comm_get_unique_id(&id));
    fp_comm_config cfg;
    fp_comm_config_default(&cfg);
    cfg.init_timeout_ms = 300;
    fp_comm *c = (fp_comm *)0x1;
    const double t0 = fp_now_s();
    CHECK_STATUS(fp_comm_init(ctx, &id, 2, 0, &cfg, &c), FP_ERR_TIMEOUT);
    const double dt = fp_now_s() - t0;
    CHECK(c == NULL);
    CHECK_MSG(dt >= 0.29 && (dt < 5.0 || fp_test_sanitized()), "init gave up after %.2f s (timeout 0.3 s)", dt);
    CHECK(strstr(fp_last_error(), "did not join") != NULL);
    CHECK_STATUS(fp_comm_init(ctx, &id, 2, 2, &cfg, &c), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_comm_init(ctx, &id, 0, 0, &cfg, &c), FP_ERR_INVALID_ARGUMENT);
    cfg.ledger_entries = 3;
    CHECK_STATUS(fp_comm_init(ctx, &id, 1, 0, &cfg, &c), FP_ERR_INVALID_ARGUMENT);
    fp_context_destroy(ctx);
}

/* Split by rank parity, keys reversed; with 3+ ranks the last joins none. */
static void case_split(rank_ctx *r) {
    const int n = r->sh->n;
    const int color = (n >= 3 && r->rank == n - 1) ? -1 : r->rank % 2;
    fp_comm *child = (fp_comm *)0x1;
    RCHECK_OK(fp_comm_split(r->comm, color, -r->rank, NULL, &child));
    if (color < 0) {
        RCHECK(child == NULL);
    } else if (child) {
        int members = 0, above = 0;
        float want = 0;
        for (int j = 0; j < n; ++j) {
            int cj = (n >= 3 && j == n - 1) ? -1 : j % 2;
            if (cj != color) continue;
            members++;
            above += j > r->rank;
            want += (float)(j + 1);
        }
        RCHECK_MSG(fp_comm_nranks(child) == members && fp_comm_rank(child) == above,
                   "rank %d: child rank %d of %d, want %d of %d", r->rank, fp_comm_rank(child), fp_comm_nranks(child),
                   above, members);
        float h[16], got[16];
        for (int i = 0; i < 16; ++i) h[i] = (float)(r->rank + 1);
        float *d = upload(h, 16, FP_F32);
        RCHECK_OK(fp_comm_allreduce(child, d, d, 16, FP_F32, FP_REDUCE_SUM, NULL));
        RCHECK_OK(fp_comm_synchronize(child, 10000));
        RCHECK_OK(fp_context_synchronize(r->ctx, NULL));
        download(d, 16, FP_F32, got);
        RCHECK_MSG(got[0] == want && got[15] == want, "rank %d: split sum %g, want %g", r->rank, got[0], want);
        cudaFree(d);
        fp_comm_destroy(child);
    } else {
        RCHECK_MSG(0, "rank %d: no child communicator", r->rank);
    }
    barrier(r);
}

/* ------------------------------------------------------------------------ */
/*  Timing: bench, A/B, tuner                                               */
/* ------------------------------------------------------------------------ */

static void case_bench(rank_ctx *r) {
    fp_timing_config tc;
    fp_timing_config_default(&tc);
    tc.warmup = 1;
    tc.min_samples = 4;
    tc.max_samples = 20;
    tc.max_time_s = 0.5;
    for (int k = 0; k < FP_COLL_KINDS; ++k) {
        fp_coll_bench b;
        memset(&b, 0, sizeof b);
        RCHECK_OK(fp_comm_bench(r->comm, (fp_coll_kind)k, 256 << 10, FP_F32, &tc, &b));
        if (r->sh->n > 1) RCHECK_MSG(b.latency.samples == 4, "rank %d: %d samples, want the fixed 4", r->rank,
                                     b.latency.samples);
        RCHECK(b.latency.samples >= 1 && b.latency.median_ms > 0);
        RCHECK(b.bytes == fp_coll_bytes((fp_coll_kind)k,
                                        (k == FP_COLL_ALLGATHER || k == FP_COLL_REDUCE_SCATTER) ? 65536 / r->sh->n
                                                                                               : 65536,
                                        FP_F32, r->sh->n));
        RCHECK(fabs(b.busbw_gbps - b.algbw_gbps * fp_coll_busbw_factor((fp_coll_kind)k, r->sh->n)) <
               1e-9 * (b.algbw_gbps + 1));
    }
    fp_coll_bench b;
    RCHECK_STATUS(fp_comm_bench(r->comm, FP_COLL_ALLGATHER, 2, FP_F32, &tc, &b), FP_ERR_INVALID_ARGUMENT);
}

static void case_ab(rank_ctx *r) {
    bucket_case *bc = calloc(1, sizeof *bc);
    make_list(bc, FP_TEST_EMULATED || fp_test_quick() ? 16 : 64);
    void *src = make_source(r->rank, bc), *mem = NULL;
    cudaMalloc(&mem, bc->off[NT] * 4);
    for (int i = 0; i < NT; ++i) bc->t[i].data = (char *)mem + bc->off[i] * 4;
    produce_arg pa = {bc, src};
    fp_buckets_config cfg;
    fp_buckets_config_default(&cfg);
    cfg.bucket_cap_bytes = 32 << 10;
    cfg.first_bucket_cap_bytes = 4 << 10;
    fp_timing_config tc;
    fp_timing_config_default(&tc);
    tc.warmup = 1;
    tc.min_samples = 3;
    tc.max_samples = FP_TEST_EMULATED ? 3 : 50;
    tc.max_time_s = FP_TEST_EMULATED ? 5 : 1;
    fp_buckets_ab_report rep;
    fp_buckets_ab_report_init(&rep);
    RCHECK_OK(fp_buckets_validate(r->comm, bc->t, NT, &cfg, produce, &pa, &tc, &rep));
    RCHECK_MSG(rep.results_agree == 1 && rep.max_abs_err == 0, "rank %d: results differ (max abs err %g)", r->rank,
               rep.max_abs_err);
    RCHECK(rep.buckets >= 2 && rep.baseline.median_ms > 0 && rep.optimized.median_ms > 0 && rep.speedup > 0);
    RCHECK(rep.produce_ms > 0 && rep.exposed_ms >= 0);
    if (r->sh->n > 1) RCHECK(rep.baseline.samples == 3 && rep.optimized.samples == 3);
    printf("rank %d A/B, caps 4 / 32 KiB: per-tensor %.3f ms, buckets %.3f ms (%d), speedup %.2fx %s, exposed %.3f "
           "ms, produce %.3f ms\n",
           r->rank, rep.baseline.median_ms, rep.optimized.median_ms, rep.buckets, rep.speedup,
           fp_verdict_string(rep.verdict), rep.exposed_ms, rep.produce_ms);
    if (fp_test_timing_meaningful() && r->sh->n == 1) {
        /* 200 tensors: one NCCL launch each against a handful of buckets at
         * the default caps. (At the small caps above, 83 buckets of three
         * launches each, the buckets lose: 3.1 vs 2.2 ms on an H100.) */
        fp_buckets_config dflt;
        fp_buckets_config_default(&dflt);
        fp_buckets_ab_report rd;
        fp_buckets_ab_report_init(&rd);
        RCHECK_OK(fp_buckets_validate(r->comm, bc->t, NT, &dflt, produce, &pa, &tc, &rd));
        RCHECK(rd.results_agree == 1 && rd.max_abs_err == 0);
        RCHECK_MSG(rd.speedup > 1.0, "rank %d: buckets %.3f ms (%d) vs per-tensor %.3f ms", r->rank,
                   rd.optimized.median_ms, rd.buckets, rd.baseline.median_ms);
        printf("rank %d A/B, default caps: per-tensor %.3f ms, buckets %.3f ms (%d), speedup %.2fx %s\n", r->rank,
               rd.baseline.median_ms, rd.optimized.median_ms, rd.buckets, rd.speedup, fp_verdict_string(rd.verdict));
    }
    /* The tuner: the default cap is added to the list. */
    const size_t caps[3] = {4 << 10, 64 << 10, 1 << 20};
    fp_buckets_tune_result tr;
    fp_buckets_tune_result_init(&tr);
    RCHECK_OK(fp_buckets_tune(r->comm, bc->t, NT, &cfg, caps, 3, produce, &pa, &tc, &tr));
    RCHECK(tr.ncaps == 4 && tr.caps[3] == cfg.bucket_cap_bytes);
    RCHECK(tr.best >= 0 && tr.best < 4 && tr.speedup_vs_default > 0);
    RCHECK(tr.recommended_cap == cfg.bucket_cap_bytes || tr.recommended_cap == tr.caps[tr.best]);
    RCHECK(tr.buckets[0] >= tr.buckets[1] && tr.buckets[1] >= tr.buckets[2]);
    RCHECK_STATUS(fp_buckets_tune(r->comm, bc->t, NT, &cfg, caps, 17, produce, &pa, &tc, &tr),
                  FP_ERR_INVALID_ARGUMENT);
    cudaFree(mem);
    cudaFree(src);
    free(bc);
}

/* fp_comm_abort: later calls are refused; the other ranks are not aborted. */
static void case_abort(rank_ctx *r) {
    float *d = NULL;
    cudaMalloc((void **)&d, 64 * sizeof *d);
    RCHECK_OK(fp_comm_abort(r->comm));
    /* SHUT_DOWN, or (with several ranks) the NCCL error an earlier abort of
     * another rank gave this one first: an abort reaches NCCL's peers. */
    const fp_status want = fp_comm_failure(r->comm, NULL, 0);
    RCHECK(want == FP_ERR_SHUT_DOWN || (r->sh->n > 1 && want == FP_ERR_NCCL));
    RCHECK_STATUS(fp_comm_allreduce(r->comm, d, d, 64, FP_F32, FP_REDUCE_SUM, NULL), want);
    RCHECK_STATUS(fp_comm_synchronize(r->comm, 0), want);
    barrier(r);
    cudaFree(d);
}

/* A ledger of 16 entries through 40 collectives. */
static void case_ledger_wrap(rank_ctx *r) {
    float *d = NULL;
    cudaMalloc((void **)&d, 64 * sizeof *d);
    cudaMemset(d, 0, 64 * sizeof *d);
    for (int k = 0; k < 40; ++k) RCHECK_OK(fp_comm_allreduce(r->comm, d, d, 64, FP_F32, FP_REDUCE_SUM, NULL));
    RCHECK_OK(fp_comm_synchronize(r->comm, 20000));
    fp_coll_record rec[64];
    int nr = 0;
    RCHECK_OK(fp_comm_ledger(r->comm, rec, 64, &nr));
    RCHECK_MSG(nr == 16 && rec[15].seq == 39 && rec[0].seq == 24, "rank %d: %d records, last seq %llu", r->rank, nr,
               nr ? (unsigned long long)rec[nr - 1].seq : 0ull);
    RCHECK_OK(fp_comm_ledger(r->comm, rec, 5, &nr));
    RCHECK(nr == 5 && rec[4].seq == 39);
    fp_comm_stats s;
    fp_comm_stats_init(&s);
    RCHECK_OK(fp_comm_get_stats(r->comm, &s));
    RCHECK(s.kind[FP_COLL_ALLREDUCE].calls == 40);
    cudaFree(d);
}

int main(void) {
    int ndev = 0;
    fp_device_count(&ndev);
    if (ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return FP_SKIP_CODE;
    }
    if (!fp_comm_available()) {
        printf("SKIP: built without NCCL\n");
        return FP_SKIP_CODE;
    }
    const int n = ndev < 4 ? ndev : 4;
    const char *from = NULL;
    const int nv = fp_comm_nccl_version(&from);
    CHECK(nv >= 21800 && from != NULL);
    printf("%d rank(s)%s, NCCL %d from %s\n", n, FP_TEST_EMULATED ? " (emulated runtime and NCCL)" : "", nv,
           from ? from : "?");
    fp_comm_config cfg;
    fp_comm_config_default(&cfg);

    /* First, in a fresh process, and again after the other cases (a group
     * or split state left behind would show there). */
    case_init_timeout();
    run_ranks(n, NULL, case_collectives, NULL);
    run_ranks(n, NULL, case_traced, NULL);
    case_init_all(n);
    run_ranks(n, NULL, case_buckets, NULL);
    run_ranks(n, NULL, case_bench, NULL);
    run_ranks(n, NULL, case_ab, NULL);
    run_ranks(n, NULL, case_abort, NULL);
    cfg.ledger_entries = 16;
    run_ranks(n, &cfg, case_ledger_wrap, NULL);
    case_init_timeout();
    if (n >= 2) {
        fp_comm_config_default(&cfg);
        cfg.timeout_ms = 400;
        int calls = run_ranks(n, &cfg, case_watchdog, NULL);
        CHECK_MSG(calls == n, "the failure callback ran %d times for %d ranks", calls, n);
        cfg.timeout_ms = 20000;
        run_ranks(n, &cfg, case_mismatch, NULL);
        run_ranks(n, NULL, case_split, NULL);
    } else {
        printf("one rank: the watchdog, mismatch and split cases need 2+ GPUs (they run on the emulated NCCL)\n");
    }
#ifdef FP_CUDA_EMU
    fp_comm_config_default(&cfg);
    cfg.timeout_ms = 300;
    fp_nccl_emu_inject(n - 1, 1, FP_NCCL_EMU_HANG, 0);
    run_ranks(n, &cfg, case_injected_hang, NULL);
    fp_nccl_emu_reset();
    fp_nccl_emu_inject(-1, 0, FP_NCCL_EMU_CALL_ERROR, 0);
    run_ranks(n, NULL, case_call_error, NULL);
    fp_nccl_emu_reset();
    fp_nccl_emu_inject(0, 0, FP_NCCL_EMU_ASYNC_ERROR, 0);
    run_ranks(n, &cfg, case_async_error, NULL);
    fp_nccl_emu_reset();
    CHECK_MSG(fp_nccl_emu_live_comms() == 0, "%d emulated communicators leaked", fp_nccl_emu_live_comms());
#endif
    TEST_END();
}
