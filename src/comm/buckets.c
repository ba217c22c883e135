/* Buckets (comm.h): tensors packed into flat buckets, each all-reduced on
 * the communicator's stream once all its tensors are marked ready, while
 * compute goes on; the compute stream waits for the results at the end.
 *
 * Buckets are reduced in bucket order (bucket k only after bucket k - 1),
 * whatever order the tensors are marked in: NCCL needs every rank to issue
 * the same collectives in the same order, and ranks may mark differently.
 * A bucket waits for the streams its tensors were marked on (an event per
 * stream, recorded when the bucket is launched: stream order covers every
 * tensor marked on it before). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

#define BUCKET_STREAMS 4

typedef struct bucket {
    fp_dtype dtype;
    size_t count;                 /* elements */
    void *flat;                   /* flat buffer (cudaMalloc'd) */
    int *idx;                     /* its tensors, in list order */
    int nt;
    int pending;                  /* tensors not yet marked this iteration */
    size_t max_bytes;             /* its largest tensor */
    cudaStream_t prod[BUCKET_STREAMS];
    int nprod;
    cudaEvent_t ev_prod[BUCKET_STREAMS + 1]; /* + 1: a stream beyond the first four waits at mark time */
    cudaEvent_t ev_done;          /* recorded after its reduction (and scatter) */
    fp_copy_desc *d_gather, *d_scatter; /* into the descriptor array on the device */
} bucket;

struct fp_buckets {
    fp_comm *comm;
    fp_buckets_config cfg;
    int n;
    fp_comm_tensor *t;            /* registered list (data: where each lives) */
    int *bucket_of;
    size_t *offset;               /* elements into the bucket */
    unsigned char *marked;
    int nmarked;
    bucket *b;
    int nb;
    int next_launch;              /* the next bucket to reduce this iteration */
    void *d_descs;                /* 2 x n fp_copy_desc */
    /* Exposure: the waiting stream's events before and after its waits,
     * two iterations' worth (harvested when known). */
    cudaEvent_t ev_x[2][2];
    int x_pending[2];
    int x_cur;
    struct fp_buckets *next;      /* the communicator's list */
};

#define BUCKETS_CONFIG_SIZE_FIRST sizeof(fp_buckets_config)

static void config_defaults(fp_buckets_config *c) {
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->bucket_cap_bytes = (size_t)25 << 20;
    c->first_bucket_cap_bytes = (size_t)1 << 20;
    c->op = FP_REDUCE_SUM;
}

fp_status fp_buckets_config_read(const fp_buckets_config *user, fp_buckets_config *out) {
    if (!user) {
        config_defaults(out);
        return FP_OK;
    }
    fp_buckets_config full;
    FP_STRUCT_IN(&user, full, BUCKETS_CONFIG_SIZE_FIRST, fp_buckets_config_default, "fp_buckets_config");
    *out = *user;
    return FP_OK;
}

fp_status fp_buckets_config_default_sized(fp_buckets_config *cfg, size_t struct_size) {
    fp_buckets_config d;
    config_defaults(&d);
    return fp_struct_init(cfg, struct_size, &d, BUCKETS_CONFIG_SIZE_FIRST, sizeof d, "fp_buckets_config");
}

/* ------------------------------------------------------------------------ */
/*  Exposure harvest                                                        */
/* ------------------------------------------------------------------------ */

static void harvest_one(fp_buckets *b, int x) {
    if (!b->x_pending[x]) return;
    if (cudaEventQuery(b->ev_x[x][1]) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    float ms = 0;
    if (cudaEventElapsedTime(&ms, b->ev_x[x][0], b->ev_x[x][1]) != cudaSuccess) {
        (void)cudaGetLastError();
        ms = 0;
    }
    b->comm->exposed_ms += ms > 0 ? ms : 0;
    b->comm->iterations++;
    b->x_pending[x] = 0;
}

void fp_buckets_harvest_locked(fp_buckets *list) {
    for (fp_buckets *b = list; b; b = b->next) {
        harvest_one(b, 0);
        harvest_one(b, 1);
    }
}

/* ------------------------------------------------------------------------ */
/*  Create / destroy                                                        */
/* ------------------------------------------------------------------------ */

static void buckets_free(fp_buckets *b) {
    if (!b) return;
    for (int k = 0; k < b->nb; ++k) {
        bucket *q = &b->b[k];
        if (q->flat) cudaFree(q->flat);
        for (int j = 0; j <= BUCKET_STREAMS; ++j)
            if (q->ev_prod[j]) cudaEventDestroy(q->ev_prod[j]);
        if (q->ev_done) cudaEventDestroy(q->ev_done);
        free(q->idx);
    }
    for (int x = 0; x < 2; ++x)
        for (int j = 0; j < 2; ++j)
            if (b->ev_x[x][j]) cudaEventDestroy(b->ev_x[x][j]);
    if (b->d_descs) cudaFree(b->d_descs);
    free(b->b);
    free(b->t);
    free(b->bucket_of);
    free(b->offset);
    free(b->marked);
    free(b);
}

/* Packs the list (see fp_buckets_config): per dtype one open bucket; the
 * first bucket of each dtype has the first cap. Fills bucket_of / offset
 * and b->b[k].{dtype, count, nt, max_bytes}; returns the bucket count. */
static fp_status pack(fp_buckets *b) {
    int open[3] = {-1, -1, -1};   /* by dtype: the open bucket */
    int made[3] = {0, 0, 0};      /* buckets closed or open so far, by dtype */
    size_t open_bytes[3] = {0, 0, 0};
    b->b = calloc((size_t)b->n, sizeof *b->b); /* at most one per tensor */
    if (!b->b) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "buckets");
    for (int i = 0; i < b->n; ++i) {
        const fp_dtype d = b->t[i].dtype;
        const size_t bytes = b->t[i].count * fp_dtype_size(d);
        if (open[d] >= 0) { /* the open bucket is this dtype's made[d]-th */
            const size_t cap = made[d] == 1 ? b->cfg.first_bucket_cap_bytes : b->cfg.bucket_cap_bytes;
            if (open_bytes[d] + bytes > cap) open[d] = -1; /* closes it */
        }
        if (open[d] < 0) {
            open[d] = b->nb++;
            made[d]++;
            open_bytes[d] = 0;
            b->b[open[d]].dtype = d;
        }
        bucket *q = &b->b[open[d]];
        b->bucket_of[i] = open[d];
        b->offset[i] = q->count;
        q->count += b->t[i].count;
        q->nt++;
        if (bytes > q->max_bytes) q->max_bytes = bytes;
        open_bytes[d] += bytes;
        const size_t cap_now = made[d] == 1 ? b->cfg.first_bucket_cap_bytes : b->cfg.bucket_cap_bytes;
        if (open_bytes[d] >= cap_now) open[d] = -1;
    }
    return FP_OK;
}

fp_status fp_buckets_create(fp_comm *comm, const fp_comm_tensor *tensors, int n, const fp_buckets_config *cfg,
                            fp_buckets **out) {
    FP_CHECK_NOT_NULL(out);
    *out = NULL;
    FP_CHECK_NOT_NULL(comm);
    FP_CHECK_NOT_NULL(tensors);
    FP_CHECK_ARG(n >= 1, "n must be >= 1 (got %d)", n);
    fp_buckets_config c;
    FP_TRY(fp_buckets_config_read(cfg, &c));
    FP_CHECK_ARG(c.bucket_cap_bytes > 0 && c.first_bucket_cap_bytes > 0,
                 "bucket caps must be > 0 (bucket_cap_bytes %zu, first_bucket_cap_bytes %zu)", c.bucket_cap_bytes,
                 c.first_bucket_cap_bytes);
    FP_CHECK_ARG(c.op == FP_REDUCE_SUM || c.op == FP_REDUCE_AVG, "buckets reduce with sum or avg (got %s)",
                 fp_reduce_op_name(c.op));
    FP_CHECK_ARG(c.flat_views == 0 || c.flat_views == 1, "flat_views must be 0 or 1 (got %d)", c.flat_views);
    for (int i = 0; i < n; ++i) {
        const fp_comm_tensor *x = &tensors[i];
        FP_CHECK_ARG(x->count > 0, "tensors[%d].count is 0", i);
        FP_CHECK_ARG(x->dtype == FP_F32 || x->dtype == FP_F16 || x->dtype == FP_BF16,
                     "tensors[%d].dtype %s is not supported (f32, f16, bf16)", i, fp_dtype_name(x->dtype));
        FP_CHECK_ARG(c.flat_views || x->data, "tensors[%d].data is NULL (allowed only with flat_views)", i);
    }
    FP_TRY(fp_comm_failure_status(comm));
    FP_TRY(fp_ctx_activate(comm->ctx));
    fp_status st = FP_OK;
    fp_buckets *b = calloc(1, sizeof *b);
    if (!b) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "buckets");
    b->comm = comm;
    b->cfg = c;
    b->n = n;
    b->t = malloc((size_t)n * sizeof *b->t);
    b->bucket_of = malloc((size_t)n * sizeof *b->bucket_of);
    b->offset = malloc((size_t)n * sizeof *b->offset);
    b->marked = calloc((size_t)n, 1);
    if (!b->t || !b->bucket_of || !b->offset || !b->marked) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "bucket lists");
    if (st == FP_OK) {
        memcpy(b->t, tensors, (size_t)n * sizeof *b->t);
        st = pack(b);
    }
    /* Flat buffers, per-bucket index lists and events. */
    for (int k = 0; k < b->nb && st == FP_OK; ++k) {
        bucket *q = &b->b[k];
        q->idx = malloc((size_t)q->nt * sizeof *q->idx);
        if (!q->idx) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "bucket %d's list", k);
        q->nt = 0;
        cudaError_t e = cudaSuccess;
        if (st == FP_OK) e = cudaMalloc(&q->flat, q->count * fp_dtype_size(q->dtype));
        for (int j = 0; j <= BUCKET_STREAMS && e == cudaSuccess; ++j)
            e = cudaEventCreateWithFlags(&q->ev_prod[j], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&q->ev_done, cudaEventDisableTiming);
        if (st == FP_OK && e != cudaSuccess) st = fp_cuda_status(e, "bucket buffer / events", __FILE__, __LINE__);
    }
    for (int i = 0; i < n && st == FP_OK; ++i) {
        bucket *q = &b->b[b->bucket_of[i]];
        q->idx[q->nt++] = i;
        if (c.flat_views) b->t[i].data = (char *)q->flat + b->offset[i] * fp_dtype_size(q->dtype);
    }
    for (int x = 0; x < 2 && st == FP_OK; ++x)
        for (int j = 0; j < 2 && st == FP_OK; ++j) {
            cudaError_t e = cudaEventCreate(&b->ev_x[x][j]);
            if (e != cudaSuccess) st = fp_cuda_status(e, "cudaEventCreate", __FILE__, __LINE__);
        }
    /* Gather / scatter descriptors: per bucket, contiguous. */
    if (st == FP_OK && !c.flat_views) {
        fp_copy_desc *h = malloc(2 * (size_t)n * sizeof *h);
        cudaError_t e = h ? cudaMalloc(&b->d_descs, 2 * (size_t)n * sizeof *h) : cudaErrorMemoryAllocation;
        if (e == cudaSuccess) {
            size_t at = 0;
            for (int k = 0; k < b->nb; ++k) {
                bucket *q = &b->b[k];
                const size_t es = fp_dtype_size(q->dtype);
                q->d_gather = (fp_copy_desc *)b->d_descs + at;
                q->d_scatter = (fp_copy_desc *)b->d_descs + n + at;
                for (int j = 0; j < q->nt; ++j) {
                    const int i = q->idx[j];
                    void *in_flat = (char *)q->flat + b->offset[i] * es;
                    h[at + j] = (fp_copy_desc){b->t[i].data, in_flat, b->t[i].count * es};
                    h[n + at + j] = (fp_copy_desc){in_flat, b->t[i].data, b->t[i].count * es};
                }
                at += (size_t)q->nt;
            }
            e = cudaMemcpy(b->d_descs, h, 2 * (size_t)n * sizeof *h, cudaMemcpyHostToDevice);
        }
        free(h);
        if (e != cudaSuccess) st = fp_cuda_status(e, "bucket copy descriptors", __FILE__, __LINE__);
        for (int k = 0; k < b->nb && st == FP_OK; ++k)
            if (b->b[k].nt > 65535)
                st = fp_set_error(FP_ERR_UNSUPPORTED, "bucket %d holds %d tensors (at most 65535 per bucket)", k,
                                  b->b[k].nt);
    }
    for (int k = 0; k < b->nb; ++k) b->b[k].pending = b->b[k].nt;
    if (st != FP_OK) {
        buckets_free(b);
        return st;
    }
    pthread_mutex_lock(&comm->mu);
    b->next = comm->buckets;
    comm->buckets = b;
    pthread_mutex_unlock(&comm->mu);
    *out = b;
    return FP_OK;
}

void fp_buckets_destroy(fp_buckets *b) {
    if (!b) return;
    fp_error_saved saved;
    fp_error_save(&saved);
    fp_comm *comm = b->comm;
    (void)fp_ctx_activate(comm->ctx);
    /* The work on the buffers: the communicator's stream, and the streams
     * that waited (their exposure events). */
    cudaStreamSynchronize(comm->stream);
    for (int x = 0; x < 2; ++x)
        if (b->x_pending[x]) cudaEventSynchronize(b->ev_x[x][1]);
    (void)cudaGetLastError();
    pthread_mutex_lock(&comm->mu);
    harvest_one(b, 0);
    harvest_one(b, 1);
    fp_buckets **pp = &comm->buckets;
    while (*pp && *pp != b) pp = &(*pp)->next;
    if (*pp) *pp = b->next;
    pthread_mutex_unlock(&comm->mu);
    buckets_free(b);
    fp_error_restore(&saved);
}

/* ------------------------------------------------------------------------ */
/*  Queries                                                                 */
/* ------------------------------------------------------------------------ */

int fp_buckets_count(const fp_buckets *b) { return b ? b->nb : 0; }

fp_status fp_buckets_tensor_bucket(const fp_buckets *b, int i, int *bucket_index, size_t *offset) {
    FP_CHECK_NOT_NULL(b);
    FP_CHECK_ARG(i >= 0 && i < b->n, "tensor %d is outside [0, %d)", i, b->n);
    if (bucket_index) *bucket_index = b->bucket_of[i];
    if (offset) *offset = b->offset[i];
    return FP_OK;
}

fp_status fp_buckets_tensor_data(const fp_buckets *b, int i, void **data) {
    FP_CHECK_NOT_NULL(b);
    FP_CHECK_NOT_NULL(data);
    FP_CHECK_ARG(i >= 0 && i < b->n, "tensor %d is outside [0, %d)", i, b->n);
    *data = b->t[i].data;
    return FP_OK;
}

fp_status fp_buckets_find(const fp_buckets *b, const void *data, int *index) {
    FP_CHECK_NOT_NULL(b);
    FP_CHECK_NOT_NULL(index);
    for (int i = 0; i < b->n; ++i)
        if (b->t[i].data == data) {
            *index = i;
            return FP_OK;
        }
    return fp_set_error(FP_ERR_NOT_FOUND, "%p is not a tensor of these buckets (%d tensors)", data, b->n);
}

/* ------------------------------------------------------------------------ */
/*  An iteration                                                            */
/* ------------------------------------------------------------------------ */

/* Enqueues bucket k's reduction on the communicator's stream. */
static fp_status launch(fp_buckets *b, int k) {
    fp_comm *comm = b->comm;
    bucket *q = &b->b[k];
    cudaStream_t cs = comm->stream;
    for (int j = 0; j < q->nprod; ++j) {
        FP_CUDA_TRY(cudaEventRecord(q->ev_prod[j], q->prod[j]));
        FP_CUDA_TRY(cudaStreamWaitEvent(cs, q->ev_prod[j], 0));
    }
    if (!b->cfg.flat_views) FP_CUDA_TRY(fp_launch_copies(q->d_gather, q->nt, q->max_bytes, cs));
    FP_TRY(fp_comm_enqueue(comm, FP_COLL_ALLREDUCE, q->flat, q->flat, q->count, q->dtype, b->cfg.op, 0, cs));
    if (!b->cfg.flat_views) FP_CUDA_TRY(fp_launch_copies(q->d_scatter, q->nt, q->max_bytes, cs));
    FP_CUDA_TRY(cudaEventRecord(q->ev_done, cs));
    return FP_OK;
}

fp_status fp_buckets_mark_ready(fp_buckets *b, int i, const void *data, fp_stream stream) {
    FP_CHECK_NOT_NULL(b);
    FP_CHECK_ARG(i >= 0 && i < b->n, "tensor %d is outside [0, %d)", i, b->n);
    FP_CHECK_ARG(!data || data == b->t[i].data,
                 "tensor %d was registered at %p but is marked at %p: the tensor list changed after "
                 "registration (create the buckets again)",
                 i, b->t[i].data, data);
    FP_CHECK_ARG(!b->marked[i], "tensor %d was already marked ready in this iteration", i);
    FP_TRY(fp_comm_failure_status(b->comm));
    FP_TRY(fp_ctx_activate(b->comm->ctx));
    cudaStream_t s = fp_ctx_stream(b->comm->ctx, stream);
    bucket *q = &b->b[b->bucket_of[i]];
    int seen = 0;
    for (int j = 0; j < q->nprod; ++j) seen |= q->prod[j] == s;
    if (!seen && s != b->comm->stream) {
        if (q->nprod < BUCKET_STREAMS) {
            q->prod[q->nprod++] = s;
        } else {
            /* A fifth stream: the communicator's stream waits for it now. */
            FP_CUDA_TRY(cudaEventRecord(q->ev_prod[BUCKET_STREAMS], s));
            FP_CUDA_TRY(cudaStreamWaitEvent(b->comm->stream, q->ev_prod[BUCKET_STREAMS], 0));
        }
    }
    b->marked[i] = 1;
    b->nmarked++;
    q->pending--;
    /* Reduce every bucket that is complete, in bucket order. */
    while (b->next_launch < b->nb && b->b[b->next_launch].pending == 0) {
        FP_TRY(launch(b, b->next_launch));
        b->next_launch++;
    }
    return FP_OK;
}

fp_status fp_buckets_wait(fp_buckets *b, fp_stream stream) {
    FP_CHECK_NOT_NULL(b);
    if (b->nmarked < b->n) {
        for (int i = 0; i < b->n; ++i)
            if (!b->marked[i])
                return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                                    "fp_buckets_wait: tensor %d (and %d more) was not marked ready in this "
                                    "iteration",
                                    i, b->n - b->nmarked - 1);
    }
    FP_TRY(fp_comm_failure_status(b->comm));
    FP_TRY(fp_ctx_activate(b->comm->ctx));
    fp_comm *comm = b->comm;
    cudaStream_t s = fp_ctx_stream(comm->ctx, stream);
    const int x = b->x_cur;
    if (b->x_pending[x]) {
        /* Two iterations back: done by now unless the device is far behind. */
        cudaEventSynchronize(b->ev_x[x][1]);
        pthread_mutex_lock(&comm->mu);
        harvest_one(b, x);
        b->x_pending[x] = 0; /* its events are recorded again below */
        pthread_mutex_unlock(&comm->mu);
    }
    /* A bucket whose launch failed in fp_buckets_mark_ready (the error went
     * to that call): launch it now, or fail here, never wait without it. */
    while (b->next_launch < b->nb) {
        FP_TRY(launch(b, b->next_launch));
        b->next_launch++;
    }
    FP_CUDA_TRY(cudaEventRecord(b->ev_x[x][0], s));
    if (s != comm->stream)
        for (int k = 0; k < b->nb; ++k) FP_CUDA_TRY(cudaStreamWaitEvent(s, b->b[k].ev_done, 0));
    FP_CUDA_TRY(cudaEventRecord(b->ev_x[x][1], s));
    pthread_mutex_lock(&comm->mu);
    b->x_pending[x] = 1;
    pthread_mutex_unlock(&comm->mu);
    b->x_cur ^= 1;
    memset(b->marked, 0, (size_t)b->n);
    b->nmarked = 0;
    b->next_launch = 0;
    for (int k = 0; k < b->nb; ++k) {
        b->b[k].pending = b->b[k].nt;
        b->b[k].nprod = 0;
    }
    return FP_OK;
}
