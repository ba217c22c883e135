/* Communicators (comm.h): init with a timeout, split, abort, destroy; the
 * collectives with their ledger entries and events; the cliques (the ranks
 * of one NCCL communicator that live in this process) through which the
 * watchdog's report and the mismatch check see the other ranks; statistics.
 *
 * Locks, always taken in this order: the watchdog's list (watchdog.c), the
 * clique registry (g_cliques_mu, which also guards the cliques' members and
 * signatures), one communicator's mu. Never two communicators' mu at once. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"

/* ------------------------------------------------------------------------ */
/*  Small helpers                                                           */
/* ------------------------------------------------------------------------ */

fp_status fp_nccl_get(const fp_nccl_table **t) {
    *t = fp_nccl();
    if (!*t) return fp_set_error(FP_ERR_UNSUPPORTED, "%s", fp_nccl_load_error());
    return FP_OK;
}

int fp_comm_available(void) { return fp_nccl() != NULL; }

fp_status fp_nccl_error(int result, void *nccl_comm, const char *what) {
    const fp_nccl_table *t = fp_nccl();
    const char *s = t ? t->error_string(result) : "?";
    const char *last = (t && t->last_error) ? t->last_error(nccl_comm) : NULL;
    if (last && *last) return fp_set_error(FP_ERR_NCCL, "%s: %s (%s)", what, s, last);
    return fp_set_error(FP_ERR_NCCL, "%s: %s", what, s);
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Polls backoff: 50 us doubling to 2 ms. */
static long backoff(long us) { return us < 2000 ? us * 2 : 2000; }

const char *fp_coll_kind_name(fp_coll_kind kind) {
    switch (kind) {
    case FP_COLL_ALLREDUCE: return "allreduce";
    case FP_COLL_ALLGATHER: return "allgather";
    case FP_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case FP_COLL_BROADCAST: return "broadcast";
    }
    return "unknown";
}

const char *fp_reduce_op_name(fp_reduce_op op) {
    switch (op) {
    case FP_REDUCE_SUM: return "sum";
    case FP_REDUCE_AVG: return "avg";
    case FP_REDUCE_MAX: return "max";
    case FP_REDUCE_MIN: return "min";
    }
    return "unknown";
}

double fp_coll_busbw_factor(fp_coll_kind kind, int n) {
    if (n < 1) return 0;
    switch (kind) {
    case FP_COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case FP_COLL_ALLGATHER:
    case FP_COLL_REDUCE_SCATTER: return (double)(n - 1) / n;
    case FP_COLL_BROADCAST: return 1.0;
    }
    return 0;
}

double fp_coll_bytes(fp_coll_kind kind, size_t count, fp_dtype dtype, int nranks) {
    const double b = (double)count * (double)fp_dtype_size(dtype);
    switch (kind) {
    case FP_COLL_ALLREDUCE:
    case FP_COLL_BROADCAST: return b;
    case FP_COLL_ALLGATHER:
    case FP_COLL_REDUCE_SCATTER: return b * (nranks > 0 ? nranks : 0);
    }
    return 0;
}

static int dtype_ok(fp_dtype d) { return d == FP_F32 || d == FP_F16 || d == FP_BF16; }
static int op_ok(fp_reduce_op op) { return op >= FP_REDUCE_SUM && op <= FP_REDUCE_MIN; }

/* ------------------------------------------------------------------------ */
/*  Configs and ids                                                         */
/* ------------------------------------------------------------------------ */

#define COMM_CONFIG_SIZE_FIRST sizeof(fp_comm_config)
#define COMM_STATS_SIZE_FIRST sizeof(fp_comm_stats)

static void config_defaults(fp_comm_config *c) {
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->init_timeout_ms = 60000;
    c->timeout_ms = 300000;
    c->ledger_entries = 4096;
}

fp_status fp_comm_config_default_sized(fp_comm_config *cfg, size_t struct_size) {
    fp_comm_config d;
    config_defaults(&d);
    return fp_struct_init(cfg, struct_size, &d, COMM_CONFIG_SIZE_FIRST, sizeof d, "fp_comm_config");
}

fp_status fp_comm_stats_init_sized(fp_comm_stats *s, size_t struct_size) {
    return fp_struct_init(s, struct_size, NULL, COMM_STATS_SIZE_FIRST, sizeof(fp_comm_stats), "fp_comm_stats");
}

static fp_status read_config(const fp_comm_config *user, fp_comm_config *out) {
    if (!user) {
        config_defaults(out);
        return FP_OK;
    }
    fp_comm_config full;
    const fp_comm_config *c = user;
    FP_STRUCT_IN(&c, full, COMM_CONFIG_SIZE_FIRST, fp_comm_config_default, "fp_comm_config");
    *out = *c;
    FP_CHECK_ARG(out->ledger_entries >= 16 && out->ledger_entries <= (1 << 24),
                 "fp_comm_config.ledger_entries must be in [16, 16M] (got %d)", out->ledger_entries);
    return FP_OK;
}

fp_status fp_comm_get_unique_id(fp_comm_id *id) {
    FP_CHECK_NOT_NULL(id);
    const fp_nccl_table *t;
    FP_TRY(fp_nccl_get(&t));
    int r = t->get_unique_id(id);
    if (r != FP_NCCL_SUCCESS) return fp_nccl_error(r, NULL, "ncclGetUniqueId");
    return FP_OK;
}

fp_status fp_comm_id_write_file(const fp_comm_id *id, const char *path) {
    FP_CHECK_NOT_NULL(id);
    FP_CHECK_NOT_NULL(path);
    FP_CHECK_ARG(*path, "path is empty");
    size_t n = strlen(path);
    char *tmp = malloc(n + 32);
    if (!tmp) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "path buffer");
    snprintf(tmp, n + 32, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fp_status st = fp_set_error(FP_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    int ok = fwrite(id->bytes, 1, FP_COMM_ID_BYTES, f) == FP_COMM_ID_BYTES;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fp_status st = fp_set_error(FP_ERR_IO, "cannot write the id to '%s': %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return st;
    }
    free(tmp);
    return FP_OK;
}

fp_status fp_comm_id_read_file(const char *path, int64_t timeout_ms, fp_comm_id *id) {
    FP_CHECK_NOT_NULL(path);
    FP_CHECK_NOT_NULL(id);
    const double t_end = fp_now_s() + (double)timeout_ms / 1e3;
    long us = 50;
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            fp_comm_id tmp;
            size_t got = fread(tmp.bytes, 1, FP_COMM_ID_BYTES, f);
            int extra = fgetc(f) != EOF;
            fclose(f);
            if (got == FP_COMM_ID_BYTES && !extra) {
                *id = tmp;
                return FP_OK;
            }
            /* written by fp_comm_id_write_file it is whole; another writer's
             * partial file may still grow: wait for it too. */
            if (extra)
                return fp_set_error(FP_ERR_IO, "'%s' holds more than an id (%d bytes): not written by "
                                    "fp_comm_id_write_file", path, FP_COMM_ID_BYTES);
        } else if (errno != ENOENT) {
            return fp_set_error(FP_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
        }
        if (timeout_ms >= 0 && fp_now_s() >= t_end)
            return fp_set_error(FP_ERR_TIMEOUT, "'%s' did not hold a whole id within %lld ms", path,
                                (long long)timeout_ms);
        sleep_us(us);
        us = us < 20000 ? us * 2 : 20000;
    }
}

/* ------------------------------------------------------------------------ */
/*  Cliques                                                                 */
/* ------------------------------------------------------------------------ */

static pthread_mutex_t g_cliques_mu = PTHREAD_MUTEX_INITIALIZER;
static fp_clique *g_cliques;

/* Finds or makes the clique of `id`, and puts comm in it as `rank`. */
static fp_status clique_join(const fp_comm_id *id, int nranks, int rank, fp_comm *comm) {
    pthread_mutex_lock(&g_cliques_mu);
    fp_clique *c = g_cliques;
    while (c && memcmp(c->id.bytes, id->bytes, FP_COMM_ID_BYTES) != 0) c = c->next;
    if (c && c->nranks != nranks) {
        pthread_mutex_unlock(&g_cliques_mu);
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "rank %d joins a communicator of %d ranks, but another rank of this process "
                            "joined the same id with %d",
                            rank, nranks, c->nranks);
    }
    if (!c) {
        c = calloc(1, sizeof *c);
        if (c) c->members = calloc((size_t)nranks, sizeof *c->members);
        if (!c || !c->members) {
            if (c) free(c);
            pthread_mutex_unlock(&g_cliques_mu);
            return fp_set_error(FP_ERR_OUT_OF_MEMORY, "clique of %d ranks", nranks);
        }
        c->id = *id;
        c->nranks = nranks;
        c->next = g_cliques;
        g_cliques = c;
    }
    if (c->members[rank]) {
        pthread_mutex_unlock(&g_cliques_mu);
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "rank %d of this communicator already exists in this process",
                            rank);
    }
    c->members[rank] = comm;
    c->refs++;
    comm->clique = c;
    pthread_mutex_unlock(&g_cliques_mu);
    return FP_OK;
}

static void clique_leave(fp_comm *comm) {
    fp_clique *c = comm->clique;
    if (!c) return;
    pthread_mutex_lock(&g_cliques_mu);
    if (c->members[comm->rank] == comm) c->members[comm->rank] = NULL;
    if (--c->refs == 0) {
        fp_clique **pp = &g_cliques;
        while (*pp && *pp != c) pp = &(*pp)->next;
        if (*pp) *pp = c->next;
        free(c->members);
        free(c);
    }
    comm->clique = NULL;
    pthread_mutex_unlock(&g_cliques_mu);
}

/* The id of a split's child: the parent's, with the split's number and the
 * color mixed into its last 16 bytes (every rank of the parent counts its
 * splits alike: a split is collective). */
static void child_id(const fp_comm_id *parent, uint64_t nsplit, int color, fp_comm_id *out) {
    *out = *parent;
    uint64_t a = nsplit * 0x9E3779B97F4A7C15ull + 1, b = (uint64_t)(uint32_t)color * 0xC2B2AE3D27D4EB4Full + 7;
    for (int i = 0; i < 8; ++i) {
        out->bytes[FP_COMM_ID_BYTES - 16 + i] ^= (unsigned char)(a >> (8 * i));
        out->bytes[FP_COMM_ID_BYTES - 8 + i] ^= (unsigned char)(b >> (8 * i));
    }
}

/* ------------------------------------------------------------------------ */
/*  Creation                                                                */
/* ------------------------------------------------------------------------ */

static void comm_free(fp_comm *c) {
    if (!c) return;
    if (c->ring) {
        for (int i = 0; i < c->ring_cap; ++i) {
            if (c->ring[i].ev_start) cudaEventDestroy(c->ring[i].ev_start);
            if (c->ring[i].ev_end) cudaEventDestroy(c->ring[i].ev_end);
        }
        free(c->ring);
    }
    for (int k = 0; k < FP_COLL_KINDS; ++k) free(c->acc[k].lat);
    while (c->cells) {
        fp_split_cell *next = c->cells->next;
        free(c->cells);
        c->cells = next;
    }
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->report);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The fp_comm around a live NCCL communicator (which it owns from now on:
 * on failure it is aborted). */
static fp_status comm_wrap(fp_context *ctx, void *nccl, const fp_comm_id *id, const fp_comm_config *cfg,
                           fp_comm **out) {
    const fp_nccl_table *t = fp_nccl();
    fp_status st = FP_OK;
    fp_comm *c = calloc(1, sizeof *c);
    if (!c) {
        t->abort(nccl);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "communicator");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->ctx = ctx;
    c->nccl = nccl;
    c->cfg = *cfg;
    c->t0 = fp_now_s();
    int r = t->count(nccl, &c->nranks);
    if (r == FP_NCCL_SUCCESS) r = t->user_rank(nccl, &c->rank);
    if (r != FP_NCCL_SUCCESS) st = fp_nccl_error(r, nccl, "ncclCommCount / ncclCommUserRank");
    if (st == FP_OK) {
        c->ring_cap = cfg->ledger_entries;
        c->ring = calloc((size_t)c->ring_cap, sizeof *c->ring);
        for (int k = 0; k < FP_COLL_KINDS && c->ring; ++k) {
            c->acc[k].lat = malloc(FP_COMM_LAT_KEEP * sizeof(double));
            if (!c->acc[k].lat) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "latency samples");
        }
        if (!c->ring) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "ledger of %d entries", c->ring_cap);
    }
    if (st == FP_OK) st = fp_ctx_activate(ctx);
    if (st == FP_OK) {
        cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
        if (e != cudaSuccess) st = fp_cuda_status(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
    }
    if (st == FP_OK) st = clique_join(id, c->nranks, c->rank, c);
    if (st != FP_OK) {
        t->abort(nccl);
        c->nccl = NULL;
        comm_free(c);
        return st;
    }
    fp_watchdog_add(c);
    *out = c;
    return FP_OK;
}

/* Polls NCCL communicators until each is ready (async error not "in
 * progress"), an error, or the deadline; on failure aborts them all. */
static fp_status wait_ready(void **ncomms, int n, int64_t timeout_ms, const char *what) {
    const fp_nccl_table *t = fp_nccl();
    const double t_end = fp_now_s() + (double)timeout_ms / 1e3;
    long us = 50;
    fp_status st = FP_OK;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < n && st == FP_OK; ++i) {
            if (!ncomms[i]) continue;
            int async = FP_NCCL_SUCCESS;
            int r = t->get_async_error(ncomms[i], &async);
            if (r != FP_NCCL_SUCCESS) st = fp_nccl_error(r, ncomms[i], "ncclCommGetAsyncError");
            else if (async == FP_NCCL_IN_PROGRESS) pending++;
            else if (async != FP_NCCL_SUCCESS) st = fp_nccl_error(async, ncomms[i], what);
        }
        if (st != FP_OK || !pending) break;
        if (timeout_ms >= 0 && fp_now_s() >= t_end) {
            st = fp_set_error(FP_ERR_TIMEOUT,
                              "%s: the other ranks did not join within %lld ms (init_timeout_ms); the "
                              "communicator was aborted",
                              what, (long long)timeout_ms);
            break;
        }
        sleep_us(us);
        us = backoff(us);
    }
    if (st != FP_OK)
        for (int i = 0; i < n; ++i)
            if (ncomms[i]) {
                t->abort(ncomms[i]);
                ncomms[i] = NULL;
            }
    return st;
}

fp_status fp_comm_init(fp_context *ctx, const fp_comm_id *id, int nranks, int rank, const fp_comm_config *cfg,
                       fp_comm **out) {
    FP_CHECK_NOT_NULL(out);
    *out = NULL;
    FP_TRY(fp_ctx_check(ctx, FP_DEVICE_CUDA));
    FP_CHECK_NOT_NULL(id);
    FP_CHECK_ARG(nranks >= 1, "nranks must be >= 1 (got %d)", nranks);
    FP_CHECK_ARG(rank >= 0 && rank < nranks, "rank %d is outside [0, %d)", rank, nranks);
    const fp_nccl_table *t;
    FP_TRY(fp_nccl_get(&t));
    fp_comm_config c;
    FP_TRY(read_config(cfg, &c));
    FP_TRY(fp_ctx_activate(ctx));
    void *nc = NULL;
    int r = t->init_rank(&nc, nranks, id, rank, 0);
    if (r != FP_NCCL_SUCCESS && r != FP_NCCL_IN_PROGRESS) {
        fp_status st = fp_nccl_error(r, nc, "ncclCommInitRankConfig");
        if (nc) t->abort(nc);
        return st;
    }
    char what[64];
    snprintf(what, sizeof what, "init of rank %d of %d", rank, nranks);
    FP_TRY(wait_ready(&nc, 1, c.init_timeout_ms, what));
    return comm_wrap(ctx, nc, id, &c, out);
}

fp_status fp_comm_init_all(fp_context *const *ctxs, int n, const fp_comm_config *cfg, fp_comm **comms) {
    FP_CHECK_NOT_NULL(ctxs);
    FP_CHECK_NOT_NULL(comms);
    FP_CHECK_ARG(n >= 1, "n must be >= 1 (got %d)", n);
    for (int i = 0; i < n; ++i) comms[i] = NULL;
    for (int i = 0; i < n; ++i) {
        FP_TRY(fp_ctx_check(ctxs[i], FP_DEVICE_CUDA));
        for (int j = 0; j < i; ++j)
            FP_CHECK_ARG(ctxs[j]->device != ctxs[i]->device,
                         "ctxs[%d] and ctxs[%d] are both on device %d: one rank per device", j, i, ctxs[i]->device);
    }
    const fp_nccl_table *t;
    FP_TRY(fp_nccl_get(&t));
    fp_comm_config c;
    FP_TRY(read_config(cfg, &c));
    fp_comm_id id;
    FP_TRY(fp_comm_get_unique_id(&id));
    void **nc = calloc((size_t)n, sizeof *nc);
    if (!nc) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "%d communicators", n);
    fp_status st = FP_OK;
    int r = t->group_start();
    if (r != FP_NCCL_SUCCESS) st = fp_nccl_error(r, NULL, "ncclGroupStart");
    for (int i = 0; i < n && st == FP_OK; ++i) {
        st = fp_ctx_activate(ctxs[i]);
        if (st != FP_OK) break;
        r = t->init_rank(&nc[i], n, &id, i, 0);
        if (r != FP_NCCL_SUCCESS && r != FP_NCCL_IN_PROGRESS) st = fp_nccl_error(r, nc[i], "ncclCommInitRankConfig");
    }
    r = t->group_end();
    if (st == FP_OK && r != FP_NCCL_SUCCESS && r != FP_NCCL_IN_PROGRESS) st = fp_nccl_error(r, NULL, "ncclGroupEnd");
    if (st != FP_OK) {
        for (int i = 0; i < n; ++i)
            if (nc[i]) t->abort(nc[i]);
        free(nc);
        return st;
    }
    st = wait_ready(nc, n, c.init_timeout_ms, "fp_comm_init_all");
    for (int i = 0; i < n && st == FP_OK; ++i) {
        st = comm_wrap(ctxs[i], nc[i], &id, &c, &comms[i]);
        nc[i] = NULL;
    }
    if (st != FP_OK) {
        for (int i = 0; i < n; ++i) {
            if (nc[i]) t->abort(nc[i]);
            if (comms[i]) {
                fp_comm_abort(comms[i]);
                fp_comm_destroy(comms[i]);
                comms[i] = NULL;
            }
        }
    }
    free(nc);
    return st;
}

/* ------------------------------------------------------------------------ */
/*  Groups: a thread's collectives between start and end are launched by   */
/*  ncclGroupEnd, so their start events are recorded just before it and    */
/*  their end events just after; splits made in a group are finished there. */
/* ------------------------------------------------------------------------ */

typedef struct group_item {
    fp_comm *comm;       /* a collective's communicator, or a split's parent */
    uint64_t seq;        /* the collective */
    fp_comm **split_out; /* a split: where its communicator goes */
    fp_split_cell *split_cell;
    fp_comm_config split_cfg;
    fp_comm_id split_id;
} group_item;

static fp_status split_finish(fp_comm *parent, fp_split_cell *cell, const fp_comm_id *id, const fp_comm_config *c,
                              fp_comm **out);
static fp_status split_drop(fp_comm *parent, fp_split_cell *cell);

static __thread int t_group_depth;
static __thread group_item *t_group;
static __thread int t_ngroup, t_group_cap;

static fp_status group_push(const group_item *it) {
    if (t_ngroup == t_group_cap) {
        int cap = t_group_cap ? 2 * t_group_cap : 16;
        group_item *p = realloc(t_group, (size_t)cap * sizeof *p);
        if (!p) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "group list");
        t_group = p;
        t_group_cap = cap;
    }
    t_group[t_ngroup++] = *it;
    return FP_OK;
}

/* A non-blocking communicator's call may return "in progress": it finishes
 * in the background, and the communicator takes no other call until then.
 * Polls NCCL's asynchronous state until it leaves "in progress"; returns
 * that state (or the poll's own error). comm->mu held. */
static int settle_locked(fp_comm *c) {
    const fp_nccl_table *t = fp_nccl();
    long us = 20;
    int async = FP_NCCL_IN_PROGRESS, r = FP_NCCL_SUCCESS;
    while (c->nccl && (r = t->get_async_error(c->nccl, &async)) == FP_NCCL_SUCCESS && async == FP_NCCL_IN_PROGRESS) {
        sleep_us(us);
        us = backoff(us);
    }
    if (!c->nccl) return FP_NCCL_SUCCESS;
    return r == FP_NCCL_SUCCESS ? async : r;
}

fp_status fp_comm_group_start(void) {
    const fp_nccl_table *t;
    FP_TRY(fp_nccl_get(&t));
    int r = t->group_start();
    if (r != FP_NCCL_SUCCESS) return fp_nccl_error(r, NULL, "ncclGroupStart");
    t_group_depth++;
    return FP_OK;
}

static coll_entry *slot(fp_comm *c, uint64_t seq) { return &c->ring[seq % (uint64_t)c->ring_cap]; }

/* Records a collective's start or end event (comm->mu held). */
static cudaError_t record_event(fp_comm *c, uint64_t seq, int end) {
    coll_entry *e = slot(c, seq);
    if (e->rec.seq != seq || e->rec.state == FP_COLL_ABORTED) return cudaSuccess;
    return cudaEventRecord(end ? e->ev_end : e->ev_start, e->stream);
}

fp_status fp_comm_group_end(void) {
    const fp_nccl_table *t;
    FP_TRY(fp_nccl_get(&t));
    FP_CHECK_ARG(t_group_depth > 0, "fp_comm_group_end without fp_comm_group_start");
    fp_status st = FP_OK;
    const int outer = t_group_depth == 1;
    if (outer)
        for (int i = 0; i < t_ngroup; ++i)
            if (!t_group[i].split_out) {
                fp_comm *c = t_group[i].comm;
                pthread_mutex_lock(&c->mu);
                cudaError_t e = record_event(c, t_group[i].seq, 0);
                pthread_mutex_unlock(&c->mu);
                if (e != cudaSuccess && st == FP_OK) st = fp_cuda_status(e, "cudaEventRecord", __FILE__, __LINE__);
            }
    int r = t->group_end();
    t_group_depth--;
    if (st == FP_OK && r != FP_NCCL_SUCCESS && r != FP_NCCL_IN_PROGRESS) st = fp_nccl_error(r, NULL, "ncclGroupEnd");
    if (!outer) return st;
    if (r == FP_NCCL_IN_PROGRESS) /* the group's launch finishes in the background */
        for (int i = 0; i < t_ngroup; ++i) {
            if (t_group[i].split_out) continue;
            pthread_mutex_lock(&t_group[i].comm->mu);
            (void)settle_locked(t_group[i].comm); /* an error shows at the next call or the watchdog */
            pthread_mutex_unlock(&t_group[i].comm->mu);
        }
    for (int i = 0; i < t_ngroup; ++i) {
        group_item *it = &t_group[i];
        if (!it->split_out) {
            fp_comm *c = it->comm;
            pthread_mutex_lock(&c->mu);
            coll_entry *e = slot(c, it->seq);
            cudaError_t ce = record_event(c, it->seq, 1);
            if (e->rec.seq == it->seq && e->rec.start_ms < 0) e->rec.start_ms = 0; /* events armed */
            pthread_mutex_unlock(&c->mu);
            if (ce != cudaSuccess && st == FP_OK) st = fp_cuda_status(ce, "cudaEventRecord", __FILE__, __LINE__);
        }
    }
    /* Splits: NCCL has now run (or runs) their jobs; wait for each child,
     * then wrap it. */
    for (int i = 0; i < t_ngroup; ++i) {
        group_item *it = &t_group[i];
        if (!it->split_out) continue;
        fp_status s2 = st == FP_OK ? split_finish(it->comm, it->split_cell, &it->split_id, &it->split_cfg,
                                                  it->split_out)
                                   : split_drop(it->comm, it->split_cell);
        if (s2 != FP_OK && st == FP_OK) st = s2;
    }
    t_ngroup = 0;
    return st;
}

/* ------------------------------------------------------------------------ */
/*  Failure                                                                 */
/* ------------------------------------------------------------------------ */

void fp_comm_fail(fp_comm *c, fp_status status, const fp_comm_failure_info *info, const char *report) {
    pthread_mutex_lock(&c->mu);
    if (c->failed == FP_OK) {
        c->failed = status;
        c->report = strdup(report ? report : fp_status_string(status));
        if (info) c->info = *info;
        c->info.status = status;
        c->info.nranks = c->nranks;
        c->info.message = c->report;
        if (c->nccl) {
            fp_nccl()->abort(c->nccl);
            c->nccl = NULL;
        }
        for (uint64_t s = c->first_open; s < c->next_seq; ++s) {
            coll_entry *e = slot(c, s);
            if (e->rec.seq == s && e->rec.state != FP_COLL_ENDED && e->rec.state != FP_COLL_ABORTED) {
                e->rec.state = FP_COLL_ABORTED;
                c->n_aborted++;
            }
        }
        c->first_open = c->next_seq;
    }
    pthread_mutex_unlock(&c->mu);
}

void fp_comm_run_callback(fp_comm *c) {
    pthread_mutex_lock(&c->mu);
    int due = c->failed != FP_OK && !c->callback_done && c->cfg.on_failure;
    if (c->failed != FP_OK) c->callback_done = 1;
    fp_comm_failure_info info = c->info;
    pthread_mutex_unlock(&c->mu);
    if (due) c->cfg.on_failure(c->cfg.user, c, &info);
}

fp_status fp_comm_failure_status(fp_comm *c) {
    pthread_mutex_lock(&c->mu);
    fp_status st = c->failed;
    if (st != FP_OK) fp_set_error(st, "%s", c->report ? c->report : "communicator aborted");
    pthread_mutex_unlock(&c->mu);
    return st;
}

int fp_comm_async_error_locked(fp_comm *c, char *msg, size_t n) {
    const fp_nccl_table *t = fp_nccl();
    if (!c->nccl || !t) return 0;
    int async = FP_NCCL_SUCCESS;
    int r = t->get_async_error(c->nccl, &async);
    int bad = r != FP_NCCL_SUCCESS ? r : async;
    if (bad == FP_NCCL_SUCCESS || bad == FP_NCCL_IN_PROGRESS) return 0;
    const char *last = t->last_error ? t->last_error(c->nccl) : NULL;
    snprintf(msg, n, "Rank %d of %d: NCCL reported an asynchronous error at collective %llu: %s%s%s%s.", c->rank,
             c->nranks, (unsigned long long)c->first_open, t->error_string(bad), last && *last ? " (" : "",
             last && *last ? last : "", last && *last ? ")" : "");
    return 1;
}

static void describe(const fp_coll_record *r, char *buf, size_t n) {
    if (r->kind == FP_COLL_BROADCAST)
        snprintf(buf, n, "%s %s x %zu, root %d", fp_coll_kind_name(r->kind), fp_dtype_name(r->dtype), r->count,
                 r->root);
    else if (r->kind == FP_COLL_ALLGATHER)
        snprintf(buf, n, "%s %s x %zu", fp_coll_kind_name(r->kind), fp_dtype_name(r->dtype), r->count);
    else
        snprintf(buf, n, "%s %s x %zu, %s", fp_coll_kind_name(r->kind), fp_dtype_name(r->dtype), r->count,
                 fp_reduce_op_name(r->op));
}

static const char *state_name(fp_coll_state s) {
    switch (s) {
    case FP_COLL_ENQUEUED: return "enqueued";
    case FP_COLL_STARTED: return "running";
    case FP_COLL_ENDED: return "ended";
    case FP_COLL_ABORTED: return "aborted";
    }
    return "?";
}

/* Appends to a growing report. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;
static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 512) + (size_t)k;
        char *q = realloc(b->p, cap);
        if (!q) return;
        b->p = q;
        b->cap = cap;
    }
}

void fp_comm_fail_clique(fp_comm *comm, fp_status status, uint64_t seq, const char *what) {
    pthread_mutex_lock(&g_cliques_mu);
    fp_clique *cl = comm->clique;
    fp_comm_failure_info info;
    memset(&info, 0, sizeof info);
    info.status = status;
    info.seq = seq;
    info.nranks = comm->nranks;
    sbuf b = {0};
    sb_printf(&b, "%s", what);
    /* Each rank of this process: what it did about collective seq. */
    sbuf entered = {0};
    for (int r = 0; r < comm->nranks; ++r) {
        fp_comm *m = cl ? cl->members[r] : (r == comm->rank ? comm : NULL);
        if (!m) {
            info.not_visible++;
            continue;
        }
        pthread_mutex_lock(&m->mu);
        if (m->failed == FP_OK) fp_comm_refresh_locked(m);
        char d[160];
        int in = 0;
        if (m->next_seq <= seq) {
            if (m->next_seq == 0) {
                sb_printf(&b, " Rank %d has not entered it: it has made no collective call.", r);
            } else {
                coll_entry *e = slot(m, m->next_seq - 1);
                describe(&e->rec, d, sizeof d);
                sb_printf(&b, " Rank %d has not entered it: it has not called it (its last call: collective %llu, %s, %s).",
                          r, (unsigned long long)(m->next_seq - 1), d, state_name(e->rec.state));
            }
        } else {
            coll_entry *e = slot(m, seq);
            if (e->rec.seq == seq && e->rec.state == FP_COLL_ENQUEUED) {
                describe(&e->rec, d, sizeof d);
                sb_printf(&b, " Rank %d has not entered it: it called it (%s) but its stream has not reached it "
                          "(earlier work on that stream is still running).", r, d);
            } else {
                in = 1;
            }
        }
        pthread_mutex_unlock(&m->mu);
        if (in) sb_printf(&entered, "%s%d", entered.n ? ", " : "", r);
        else if (info.nmissing < 64) info.missing[info.nmissing++] = r;
    }
    if (entered.n) sb_printf(&b, " Entered it: rank%s %s.", strchr(entered.p, ',') ? "s" : "", entered.p);
    if (info.not_visible)
        sb_printf(&b, " %d rank%s in other processes (not visible from here).", info.not_visible,
                  info.not_visible > 1 ? "s are" : " is");
    sb_printf(&b, " The communicator was aborted on every rank of this process.");
    free(entered.p);
    const char *report = b.p ? b.p : what;
    for (int r = 0; r < comm->nranks; ++r) {
        fp_comm *m = cl ? cl->members[r] : (r == comm->rank ? comm : NULL);
        if (m) fp_comm_fail(m, status, &info, report);
    }
    for (int r = 0; r < comm->nranks; ++r) {
        fp_comm *m = cl ? cl->members[r] : (r == comm->rank ? comm : NULL);
        if (m) fp_comm_run_callback(m);
    }
    pthread_mutex_unlock(&g_cliques_mu);
    free(b.p);
}

/* ------------------------------------------------------------------------ */
/*  The ledger                                                              */
/* ------------------------------------------------------------------------ */

static void account(fp_comm *c, coll_entry *e) {
    coll_acc *a = &c->acc[e->rec.kind];
    a->calls++;
    a->bytes += fp_coll_bytes(e->rec.kind, e->rec.count, e->rec.dtype, c->nranks);
    a->busy_ms += e->rec.duration_ms;
    a->lat[a->nlat % FP_COMM_LAT_KEEP] = e->rec.duration_ms;
    a->nlat++;
    c->n_ended++;
}

void fp_comm_refresh_locked(fp_comm *c) {
    const double now_ms = (fp_now_s() - c->t0) * 1e3;
    for (uint64_t s = c->first_open; s < c->next_seq; ++s) {
        coll_entry *e = slot(c, s);
        if (e->rec.seq != s) continue;
        if (e->rec.state == FP_COLL_ENQUEUED && e->rec.start_ms < 0) continue; /* in a group: no events yet */
        if (e->rec.state == FP_COLL_ENQUEUED) {
            cudaError_t q = cudaEventQuery(e->ev_start);
            if (q == cudaSuccess) {
                e->rec.state = FP_COLL_STARTED;
                e->rec.start_ms = now_ms;
            } else {
                if (q != cudaErrorNotReady) (void)cudaGetLastError();
                continue;
            }
        }
        if (e->rec.state == FP_COLL_STARTED) {
            cudaError_t q = cudaEventQuery(e->ev_end);
            if (q == cudaSuccess) {
                float ms = 0;
                if (cudaEventElapsedTime(&ms, e->ev_start, e->ev_end) != cudaSuccess) {
                    (void)cudaGetLastError();
                    ms = 0;
                }
                e->rec.duration_ms = ms > 0 ? ms : 0;
                e->rec.state = FP_COLL_ENDED;
                account(c, e);
            } else if (q != cudaErrorNotReady) {
                (void)cudaGetLastError();
            }
        }
    }
    while (c->first_open < c->next_seq) {
        coll_entry *e = slot(c, c->first_open);
        if (e->rec.seq == c->first_open && e->rec.state != FP_COLL_ENDED && e->rec.state != FP_COLL_ABORTED) break;
        c->first_open++;
    }
}

/* Waits (comm->mu held, released while sleeping) until the ring slot of
 * next_seq is free: its previous collective ended or was aborted. */
static fp_status wait_slot(fp_comm *c) {
    const uint64_t cap = (uint64_t)c->ring_cap;
    long us = 50;
    while (c->next_seq >= cap && c->first_open <= c->next_seq - cap) {
        fp_comm_refresh_locked(c);
        if (c->failed != FP_OK) return c->failed;
        if (c->first_open > c->next_seq - cap) break;
        pthread_mutex_unlock(&c->mu);
        sleep_us(us);
        us = backoff(us);
        pthread_mutex_lock(&c->mu);
    }
    return FP_OK;
}

/* The mismatch check against what the other ranks of this process enqueued
 * as the same seq. Returns 1 with a message in buf on a mismatch. */
static int check_signature(fp_comm *c, const coll_sig *mine, char *buf, size_t n) {
    fp_clique *cl = c->clique;
    if (!cl || c->nranks == 1) return 0;
    int bad = 0;
    pthread_mutex_lock(&g_cliques_mu);
    coll_sig *s = &cl->sigs[mine->seq % FP_CLIQUE_SIGS];
    if (!s->set || s->seq != mine->seq) {
        *s = *mine;
        s->set = 1;
    } else if (s->kind != mine->kind || s->dtype != mine->dtype || s->count != mine->count ||
               (mine->kind != FP_COLL_ALLGATHER && mine->kind != FP_COLL_BROADCAST && s->op != mine->op) ||
               (mine->kind == FP_COLL_BROADCAST && s->root != mine->root)) {
        fp_coll_record a = {.kind = s->kind, .dtype = s->dtype, .count = s->count, .op = s->op, .root = s->root};
        fp_coll_record b = {.kind = mine->kind, .dtype = mine->dtype, .count = mine->count, .op = mine->op,
                            .root = mine->root};
        char da[160], db[160];
        describe(&a, da, sizeof da);
        describe(&b, db, sizeof db);
        snprintf(buf, n, "Mismatched collective %llu: rank %d enqueued %s, rank %d %s.",
                 (unsigned long long)mine->seq, s->rank, da, mine->rank, db);
        bad = 1;
    }
    pthread_mutex_unlock(&g_cliques_mu);
    return bad;
}

static fp_status coll_enqueue(fp_comm *c, fp_coll_kind kind, const void *send, void *recv, size_t count,
                              fp_dtype dtype, fp_reduce_op op, int root, cudaStream_t stream) {
    coll_sig sig = {.seq = 0, .rank = c->rank, .kind = kind, .dtype = dtype, .count = count, .op = op, .root = root};
    pthread_mutex_lock(&c->mu);
    sig.seq = c->next_seq;
    pthread_mutex_unlock(&c->mu);
    char msg[512];
    if (check_signature(c, &sig, msg, sizeof msg)) {
        fp_comm_fail_clique(c, FP_ERR_MISMATCH, sig.seq, msg);
        return fp_comm_failure_status(c);
    }
    FP_TRY(fp_ctx_activate(c->ctx));
    pthread_mutex_lock(&c->mu);
    fp_status st = wait_slot(c);
    if (st != FP_OK) {
        pthread_mutex_unlock(&c->mu);
        return fp_comm_failure_status(c);
    }
    const uint64_t seq = c->next_seq;
    coll_entry *e = slot(c, seq);
    cudaError_t ce = cudaSuccess;
    if (!e->ev_start) ce = cudaEventCreate(&e->ev_start);
    if (ce == cudaSuccess && !e->ev_end) ce = cudaEventCreate(&e->ev_end);
    if (ce != cudaSuccess) {
        pthread_mutex_unlock(&c->mu);
        return fp_cuda_status(ce, "cudaEventCreate", __FILE__, __LINE__);
    }
    const int grouped = t_group_depth > 0;
    if (!grouped) ce = cudaEventRecord(e->ev_start, stream);
    if (ce != cudaSuccess) {
        pthread_mutex_unlock(&c->mu);
        return fp_cuda_status(ce, "cudaEventRecord", __FILE__, __LINE__);
    }
    const fp_nccl_table *t = fp_nccl();
    int r = t->collective(kind, send, recv, count, dtype, op, root, c->nccl, stream);
    if (r == FP_NCCL_IN_PROGRESS) r = settle_locked(c);
    if (r != FP_NCCL_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "rank %d: nccl %s (collective %llu)", c->rank, fp_coll_kind_name(kind),
                 (unsigned long long)seq);
        st = fp_nccl_error(r, c->nccl, what);
        char why[512];
        int broken = fp_comm_async_error_locked(c, why, sizeof why);
        pthread_mutex_unlock(&c->mu);
        /* The ledger did not take it; the signature stays (a retry of the
         * same call matches it). A call that failed because the
         * communicator did (NCCL's asynchronous error) fails it for good. */
        if (broken) {
            fp_comm_fail_clique(c, FP_ERR_NCCL, seq, why);
            return fp_comm_failure_status(c);
        }
        return st;
    }
    if (!grouped) ce = cudaEventRecord(e->ev_end, stream);
    memset(&e->rec, 0, sizeof e->rec);
    e->rec.seq = seq;
    e->rec.kind = kind;
    e->rec.dtype = dtype;
    e->rec.count = count;
    e->rec.op = op;
    e->rec.root = root;
    e->rec.state = FP_COLL_ENQUEUED;
    e->rec.enqueue_ms = (fp_now_s() - c->t0) * 1e3;
    e->rec.start_ms = grouped ? -1 : 0; /* -1: events not recorded yet (fp_comm_group_end does) */
    e->stream = stream;
    c->next_seq++;
    c->n_enqueued++;
    pthread_mutex_unlock(&c->mu);
    if (ce != cudaSuccess) return fp_cuda_status(ce, "cudaEventRecord", __FILE__, __LINE__);
    if (grouped) {
        group_item it = {.comm = c, .seq = seq};
        FP_TRY(group_push(&it));
    }
    return FP_OK;
}

/* Every collective is one span (trace.h, fp_trace_begin_collective: the
 * operation's name, its bytes as nccl-tests count them, the ranks) around
 * its enqueue, begun once the arguments and the communicator were checked.
 * Inside fp_comm_group_start / end the collectives run at the group's end:
 * their spans then cover only the enqueue. */
fp_status fp_comm_enqueue(fp_comm *c, fp_coll_kind kind, const void *send, void *recv, size_t count,
                          fp_dtype dtype, fp_reduce_op op, int root, cudaStream_t stream) {
    FP_TRY(fp_comm_failure_status(c));
    const uint64_t span = fp_ctx_trace_begin_collective(c->ctx, (fp_stream)stream, fp_coll_kind_name(kind),
                                                        fp_coll_bytes(kind, count, dtype, c->nranks), c->nranks);
    const fp_status st = coll_enqueue(c, kind, send, recv, count, dtype, op, root, stream);
    fp_ctx_trace_end(c->ctx, span);
    return st;
}

static fp_status check_coll(fp_comm *c, const void *send, void *recv, size_t count, fp_dtype dtype) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_ARG(count > 0, "count is 0");
    FP_CHECK_ARG(dtype_ok(dtype), "dtype %s is not supported (f32, f16, bf16)", fp_dtype_name(dtype));
    FP_CHECK_ARG(send != NULL && recv != NULL, "NULL %s buffer", send ? "receive" : "send");
    return FP_OK;
}

fp_status fp_comm_allreduce(fp_comm *c, const void *send, void *recv, size_t count, fp_dtype dtype,
                            fp_reduce_op op, fp_stream stream) {
    FP_TRY(check_coll(c, send, recv, count, dtype));
    FP_CHECK_ARG(op_ok(op), "unknown reduce op %d", (int)op);
    return fp_comm_enqueue(c, FP_COLL_ALLREDUCE, send, recv, count, dtype, op, 0, fp_ctx_stream(c->ctx, stream));
}

fp_status fp_comm_allgather(fp_comm *c, const void *send, void *recv, size_t send_count, fp_dtype dtype,
                            fp_stream stream) {
    FP_TRY(check_coll(c, send, recv, send_count, dtype));
    return fp_comm_enqueue(c, FP_COLL_ALLGATHER, send, recv, send_count, dtype, FP_REDUCE_SUM, 0,
                           fp_ctx_stream(c->ctx, stream));
}

fp_status fp_comm_reduce_scatter(fp_comm *c, const void *send, void *recv, size_t recv_count, fp_dtype dtype,
                                 fp_reduce_op op, fp_stream stream) {
    FP_TRY(check_coll(c, send, recv, recv_count, dtype));
    FP_CHECK_ARG(op_ok(op), "unknown reduce op %d", (int)op);
    return fp_comm_enqueue(c, FP_COLL_REDUCE_SCATTER, send, recv, recv_count, dtype, op, 0,
                           fp_ctx_stream(c->ctx, stream));
}

fp_status fp_comm_broadcast(fp_comm *c, const void *send, void *recv, size_t count, fp_dtype dtype, int root,
                            fp_stream stream) {
    FP_CHECK_NOT_NULL(c);
    FP_CHECK_ARG(root >= 0 && root < c->nranks, "root %d is outside [0, %d)", root, c->nranks);
    FP_CHECK_ARG(count > 0, "count is 0");
    FP_CHECK_ARG(dtype_ok(dtype), "dtype %s is not supported (f32, f16, bf16)", fp_dtype_name(dtype));
    FP_CHECK_ARG(recv != NULL && (send != NULL || c->rank != root), "NULL %s buffer", recv ? "send" : "receive");
    return fp_comm_enqueue(c, FP_COLL_BROADCAST, send ? send : recv, recv, count, dtype, FP_REDUCE_SUM, root,
                           fp_ctx_stream(c->ctx, stream));
}

/* ------------------------------------------------------------------------ */
/*  Split, abort, destroy, queries                                          */
/* ------------------------------------------------------------------------ */

/* Unlinks a split's cell from its parent's list and leaves it allocated:
 * NCCL may still write to it (a failed or abandoned split). */
static void cell_abandon(fp_comm *parent, fp_split_cell *cell) {
    pthread_mutex_lock(&parent->mu);
    for (fp_split_cell **pp = &parent->cells; *pp; pp = &(*pp)->next)
        if (*pp == cell) {
            *pp = cell->next;
            break;
        }
    pthread_mutex_unlock(&parent->mu);
}

/* A split that will not be finished (its group failed): the child, once
 * NCCL has written it, is aborted. */
static fp_status split_drop(fp_comm *parent, fp_split_cell *cell) {
    void *nc = __atomic_load_n(&cell->nccl, __ATOMIC_ACQUIRE);
    if (nc) fp_nccl()->abort(nc);
    cell_abandon(parent, cell);
    return FP_OK;
}

/* Waits until NCCL has written the child into the cell and the child is
 * ready, within the child's init timeout, then wraps it. */
static fp_status split_finish(fp_comm *parent, fp_split_cell *cell, const fp_comm_id *id, const fp_comm_config *c,
                              fp_comm **out) {
    const double t_end = fp_now_s() + (double)c->init_timeout_ms / 1e3;
    long us = 20;
    void *nc;
    while (!(nc = __atomic_load_n(&cell->nccl, __ATOMIC_ACQUIRE))) {
        if (c->init_timeout_ms >= 0 && fp_now_s() >= t_end) {
            cell_abandon(parent, cell);
            return fp_set_error(FP_ERR_TIMEOUT,
                                "fp_comm_split: NCCL gave no child communicator within %lld ms (init_timeout_ms): "
                                "the other ranks did not split",
                                (long long)c->init_timeout_ms);
        }
        sleep_us(us);
        us = backoff(us);
    }
    const double left_ms = (t_end - fp_now_s()) * 1e3;
    fp_status st = wait_ready(&nc, 1, c->init_timeout_ms < 0 ? -1 : left_ms > 0 ? (int64_t)left_ms : 0,
                              "fp_comm_split");
    if (st != FP_OK) {
        cell_abandon(parent, cell);
        return st;
    }
    return comm_wrap(parent->ctx, nc, id, c, out);
}

fp_status fp_comm_split(fp_comm *comm, int color, int key, const fp_comm_config *cfg, fp_comm **out) {
    FP_CHECK_NOT_NULL(comm);
    FP_CHECK_NOT_NULL(out);
    *out = NULL;
    FP_TRY(fp_comm_failure_status(comm));
    fp_comm_config c;
    if (cfg) FP_TRY(read_config(cfg, &c));
    else c = comm->cfg;
    const fp_nccl_table *t = fp_nccl();
    /* The child's id (for the clique registry): the parent's, mixed with
     * the parent's split count and the color. A split is collective, so
     * every rank's count is the same. */
    fp_comm_id id;
    child_id(&comm->clique->id, (uint64_t)comm->n_splits, color, &id);
    FP_TRY(fp_ctx_activate(comm->ctx));
    fp_split_cell *cell = calloc(1, sizeof *cell);
    if (!cell) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_comm_split");
    pthread_mutex_lock(&comm->mu);
    cell->next = comm->cells;
    comm->cells = cell;
    int r = comm->nccl ? t->split(comm->nccl, color, key, &cell->nccl, 0) : FP_NCCL_SUCCESS;
    comm->n_splits++;
    pthread_mutex_unlock(&comm->mu);
    if (r != FP_NCCL_SUCCESS && r != FP_NCCL_IN_PROGRESS) {
        fp_status st = fp_nccl_error(r, NULL, "ncclCommSplit");
        split_drop(comm, cell);
        return st;
    }
    if (color < 0 || !comm->nccl) return FP_OK; /* no child; the cell stays with the parent */
    if (t_group_depth > 0) {
        group_item it = {.comm = comm, .split_out = out, .split_cell = cell, .split_cfg = c, .split_id = id};
        fp_status st = group_push(&it);
        if (st != FP_OK) split_drop(comm, cell);
        return st;
    }
    return split_finish(comm, cell, &id, &c, out);
}

fp_status fp_comm_abort(fp_comm *comm) {
    FP_CHECK_NOT_NULL(comm);
    char msg[160];
    snprintf(msg, sizeof msg, "rank %d of %d: the communicator was aborted (fp_comm_abort)", comm->rank,
             comm->nranks);
    fp_comm_failure_info info;
    memset(&info, 0, sizeof info);
    fp_comm_fail(comm, FP_ERR_SHUT_DOWN, &info, msg);
    return FP_OK;
}

fp_status fp_comm_synchronize(fp_comm *comm, int64_t timeout_ms) {
    FP_CHECK_NOT_NULL(comm);
    const double t_end = fp_now_s() + (double)timeout_ms / 1e3;
    long us = 20;
    for (;;) {
        pthread_mutex_lock(&comm->mu);
        fp_comm_refresh_locked(comm);
        int done = comm->first_open >= comm->next_seq;
        fp_status failed = comm->failed;
        char msg[512];
        /* Ended collectives may have ended because NCCL failed: ask it. */
        int async = failed == FP_OK && done && fp_comm_async_error_locked(comm, msg, sizeof msg);
        const uint64_t seq = comm->first_open;
        pthread_mutex_unlock(&comm->mu);
        if (async) fp_comm_fail_clique(comm, FP_ERR_NCCL, seq, msg);
        if (failed != FP_OK || async) return fp_comm_failure_status(comm);
        if (done) return FP_OK;
        if (timeout_ms >= 0 && fp_now_s() >= t_end)
            return fp_set_error(FP_ERR_TIMEOUT, "rank %d: collectives still running after %lld ms", comm->rank,
                                (long long)timeout_ms);
        sleep_us(us);
        us = backoff(us);
    }
}

fp_status fp_comm_failure(fp_comm *comm, char *buf, size_t buf_size) {
    FP_CHECK_NOT_NULL(comm);
    pthread_mutex_lock(&comm->mu);
    fp_status st = comm->failed;
    if (buf && buf_size) snprintf(buf, buf_size, "%s", st != FP_OK && comm->report ? comm->report : "");
    pthread_mutex_unlock(&comm->mu);
    return st;
}

void fp_comm_destroy(fp_comm *comm) {
    if (!comm) return;
    fp_error_saved saved;
    fp_error_save(&saved);
    /* Collectives enqueued so far end, or the watchdog aborts them. */
    if (comm->cfg.timeout_ms >= 0) (void)fp_comm_synchronize(comm, -1);
    else (void)fp_comm_synchronize(comm, 0);
    fp_watchdog_remove(comm);
    clique_leave(comm);
    const fp_nccl_table *t = fp_nccl();
    pthread_mutex_lock(&comm->mu);
    void *nc = comm->nccl;
    comm->nccl = NULL;
    pthread_mutex_unlock(&comm->mu);
    if (nc) {
        (void)fp_ctx_activate(comm->ctx);
        int r = t->finalize(nc);
        if (r == FP_NCCL_SUCCESS || r == FP_NCCL_IN_PROGRESS) {
            void *one = nc;
            /* Finalize waits for NCCL's own work; bounded like init. */
            if (wait_ready(&one, 1, comm->cfg.init_timeout_ms, "ncclCommFinalize") != FP_OK) nc = NULL; /* aborted */
        }
        if (nc) t->destroy(nc);
    }
    if (comm->stream) cudaStreamSynchronize(comm->stream);
    comm_free(comm);
    fp_error_restore(&saved);
}

int fp_comm_rank(const fp_comm *comm) { return comm ? comm->rank : -1; }
int fp_comm_nranks(const fp_comm *comm) { return comm ? comm->nranks : 0; }
fp_stream fp_comm_stream(const fp_comm *comm) { return comm ? (fp_stream)comm->stream : NULL; }

/* ------------------------------------------------------------------------ */
/*  Ledger and statistics                                                   */
/* ------------------------------------------------------------------------ */

fp_status fp_comm_ledger(fp_comm *comm, fp_coll_record *out, int max, int *n) {
    FP_CHECK_NOT_NULL(comm);
    FP_CHECK_NOT_NULL(n);
    FP_CHECK_ARG(max >= 0 && (out || max == 0), "out is NULL with max %d", max);
    pthread_mutex_lock(&comm->mu);
    if (comm->failed == FP_OK) fp_comm_refresh_locked(comm);
    uint64_t lo = comm->next_seq > (uint64_t)comm->ring_cap ? comm->next_seq - (uint64_t)comm->ring_cap : 0;
    if (comm->next_seq - lo > (uint64_t)max) lo = comm->next_seq - (uint64_t)max;
    int k = 0;
    for (uint64_t s = lo; s < comm->next_seq; ++s) {
        coll_entry *e = slot(comm, s);
        if (e->rec.seq != s) continue;
        out[k] = e->rec;
        if (out[k].start_ms < 0) out[k].start_ms = 0;
        k++;
    }
    *n = k;
    pthread_mutex_unlock(&comm->mu);
    return FP_OK;
}

fp_status fp_comm_get_stats(fp_comm *comm, fp_comm_stats *user) {
    FP_CHECK_NOT_NULL(comm);
    FP_CHECK_NOT_NULL(user);
    FP_TRY(fp_struct_size_check(user->struct_size, COMM_STATS_SIZE_FIRST, sizeof(fp_comm_stats), "fp_comm_stats"));
    fp_comm_stats s;
    fp_comm_stats_init(&s);
    double *tmp = malloc(FP_COMM_LAT_KEEP * sizeof *tmp);
    if (!tmp) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "latency samples");
    pthread_mutex_lock(&comm->mu);
    if (comm->failed == FP_OK) fp_comm_refresh_locked(comm);
    if (comm->buckets) fp_buckets_harvest_locked(comm->buckets);
    for (int k = 0; k < FP_COLL_KINDS; ++k) {
        const coll_acc *a = &comm->acc[k];
        fp_coll_stats *o = &s.kind[k];
        o->calls = a->calls;
        o->bytes = a->bytes;
        o->busy_ms = a->busy_ms;
        int m = a->nlat < FP_COMM_LAT_KEEP ? (int)a->nlat : FP_COMM_LAT_KEEP;
        if (m > 0) {
            memcpy(tmp, a->lat, (size_t)m * sizeof *tmp);
            fp_sort_doubles(tmp, m);
            fp_stats_from_sorted(tmp, m, &o->latency);
            o->p99_ms = fp_percentile_sorted(tmp, m, 0.99);
        }
        if (a->busy_ms > 0) {
            o->algbw_gbps = a->bytes / (a->busy_ms * 1e-3) / 1e9;
            o->busbw_gbps = o->algbw_gbps * fp_coll_busbw_factor((fp_coll_kind)k, comm->nranks);
        }
    }
    s.enqueued = comm->n_enqueued;
    s.ended = comm->n_ended;
    s.aborted = comm->n_aborted;
    s.exposed_ms = comm->exposed_ms;
    s.iterations = comm->iterations;
    pthread_mutex_unlock(&comm->mu);
    free(tmp);
    return fp_struct_write(user, &s, COMM_STATS_SIZE_FIRST, sizeof s, "fp_comm_stats");
}

fp_status fp_comm_reset_stats(fp_comm *comm) {
    FP_CHECK_NOT_NULL(comm);
    pthread_mutex_lock(&comm->mu);
    if (comm->failed == FP_OK) fp_comm_refresh_locked(comm);
    for (int k = 0; k < FP_COLL_KINDS; ++k) {
        coll_acc *a = &comm->acc[k];
        a->calls = 0;
        a->bytes = a->busy_ms = 0;
        a->nlat = 0;
    }
    comm->n_enqueued = comm->n_ended = comm->n_aborted = 0;
    comm->exposed_ms = 0;
    comm->iterations = 0;
    pthread_mutex_unlock(&comm->mu);
    return FP_OK;
}
