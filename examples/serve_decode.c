/*
 * serve_decode: an inference-server decode step built from libfastpath's
 * public API only (it links the shared library, which exports nothing else).
 *
 *   client threads --fp_batcher_submit--> fp_batcher --executor(batch)--> context
 *
 * Many client threads each submit single decode requests ("token t of
 * sequence s with hidden state x and residual r") to a dynamic batcher. The
 * executor runs one batched layer step per batch:
 *
 *   1. RMSNorm with residual:  s = x + r,  q = s / rms(s) * gamma   (fp_norm_forward)
 *      The normalized hidden state [heads_q * head_dim] is used directly as
 *      the query (a real layer would apply its Q projection here).
 *   2. Paged-KV decode attention with GQA over each sequence's cached keys
 *      (fp_attention_forward with block_table and seqlens_k).
 *
 * Its scratch buffers come from a caching allocator (fp_alloc_*), so after
 * the first batches they are cache hits, not cudaMalloc calls. Every client
 * checks its own output against a plain C reference (double accumulation)
 * of its own request, so a wrong batch assembly, page mapping or output slot
 * fails the run.
 *
 * --graphs: the layer step is captured into CUDA graphs, one per batch-size
 * bucket (fp_graph_cache: 1, 2, 4, 8, 16), and replayed. A graph runs on
 * fixed addresses, so the step's buffers are static (a graph pool's) instead
 * of per-batch cache allocations, and a fixed seqlen_k bound (MAX_SEQ_LEN;
 * each sequence's own length comes from seqlens_k). The batcher's allowed
 * sizes are set to the cache's buckets (fp_graph_cache_to_batcher), so a
 * batch arrives padded to a captured size; the executor fills the padding
 * rows with harmless input (zero rows, 1-token sequences) and runs the
 * bucket's graph. The first batch of each size captures it. On a CPU
 * context a replay calls the recorded step: the same program runs there.
 *
 * --pipeline: each batch's inputs and outputs go through a pipeline
 * (fp_pipeline): the executor packs the batch into a host chunk, the
 * pipeline stages it into pinned memory, copies it to the device on its H2D
 * stream, runs the layer step on its compute stream and copies the results
 * back on its D2H stream; three executor threads keep up to three batches
 * in flight, so one batch's copies overlap another's compute. Each
 * executor waits for its own batch's completion callback, then scatters
 * the rows.
 *
 * Usage: serve_decode [--device cpu|cuda] [--clients N] [--requests N] [--graphs | --pipeline]
 * Exit status: 0 when every request completed exactly once with a correct
 * output (and, with --graphs, every batch ran a captured graph), 1
 * otherwise, 2 for bad arguments. Registered as the CTests
 * example_serve_decode and example_serve_decode_graphs (CPU context).
 */
#include <fastpath/alloc.h>
#include <fastpath/attention.h>
#include <fastpath/batcher.h>
#include <fastpath/core.h>
#include <fastpath/graph.h>
#include <fastpath/norm.h>
#include <fastpath/pipeline.h>

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/*  Model shape                                                             */
/* ------------------------------------------------------------------------ */

enum {
    HEADS_Q = 8,
    HEADS_KV = 2,                    /* GQA: 4 query heads share a KV head */
    HEAD_DIM = 32,
    HIDDEN = HEADS_Q * HEAD_DIM,     /* 256 */
    PAGE_SIZE = 16,                  /* keys per KV-cache page */
    MAX_SEQ_LEN = 300,               /* cached tokens per sequence: 1..300 */
    MAX_PAGES_PER_SEQ = (MAX_SEQ_LEN + PAGE_SIZE - 1) / PAGE_SIZE,
    NUM_SEQS = 48,                   /* sequences live in the KV cache */
    MAX_BATCH = 16,                  /* the batcher's max_batch_size */
    KV_ROW = HEADS_KV * HEAD_DIM     /* floats per cached token, K or V */
};
static const float RMS_EPS = 1e-5f;

/* Decides whether a client's output matches its reference. The library
 * accumulates in f32 (~1e-6 relative); a wrong page or slot is off by ~0.1. */
static const double TOL_ABS = 1e-4, TOL_REL = 1e-4;

/* One request's input and output, as the batcher passes them through. */
typedef struct request_input {
    int seq;              /* which cached sequence this token belongs to */
    float x[HIDDEN];      /* hidden state of the new token */
    float residual[HIDDEN];
} request_input;

typedef struct request_output {
    float attn[HIDDEN];          /* attention output [heads_q, head_dim] */
    float residual_out[HIDDEN];  /* x + residual, for the next layer */
} request_output;

/* Per-request bookkeeping: how often the executor ran it and how often it
 * completed (both must end at exactly 1). */
typedef struct request_track {
    atomic_int executed;
    atomic_int completed;
} request_track;

/* The "model": weights and the paged KV cache, on the context and on the host
 * (the host copy is what the clients' references read). */
typedef struct model {
    float gamma[HIDDEN];
    int seq_len[NUM_SEQS];
    int32_t block_table[NUM_SEQS][MAX_PAGES_PER_SEQ]; /* page of each block */
    int num_pages;
    float *h_k, *h_v;                 /* host [num_pages, PAGE_SIZE, HEADS_KV, HEAD_DIM] */
    void *d_k, *d_v, *d_gamma;        /* the same on the context (fp_mem_alloc) */
} model;

/* --graphs: the step's static buffers (rows for the largest bucket), from a
 * graph pool so that they keep their address for the graphs' lifetime. */
typedef struct static_buffers {
    fp_graph_pool *pool;
    void *x, *res, *q, *resout, *attn, *table, *seqlens;
} static_buffers;

/* Everything the executor needs. executor_threads = 1 runs one batch at a
 * time, so one set of host staging buffers (and, with --graphs, one set of
 * static buffers) serves every batch. --pipeline runs PIPE_EXECUTORS
 * executors, each with its batch's own chunk buffers (pipe_batch). */
typedef struct server {
    fp_context *ctx;
    fp_stream stream;
    fp_allocator *alloc;
    const model *m;
    fp_graph_cache *graphs;       /* --graphs, else NULL */
    fp_pipeline *pipe;            /* --pipeline, else NULL */
    static_buffers sb;
    float h_x[MAX_BATCH][HIDDEN], h_res[MAX_BATCH][HIDDEN];
    float h_attn[MAX_BATCH][HIDDEN], h_resout[MAX_BATCH][HIDDEN];
    int32_t h_table[MAX_BATCH][MAX_PAGES_PER_SEQ];
    int32_t h_seqlens[MAX_BATCH];
} server;

/* Prints which library call failed, with the library's detail message. */
static void report_failure(const char *call, fp_status st)
{
    fprintf(stderr, "serve_decode: %s failed: %s (%s)\n", call, fp_status_string(st),
            fp_last_error());
}

/* In main / setup: a failed call ends the program. */
#define MUST(call)                                                                 \
    do {                                                                           \
        fp_status must_st_ = (call);                                               \
        if (must_st_ != FP_OK) {                                                   \
            report_failure(#call, must_st_);                                       \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* In the executor: a failed call fails the batch (after its cleanup). */
#define TRY(call)                                                                  \
    do {                                                                           \
        st = (call);                                                               \
        if (st != FP_OK) {                                                         \
            report_failure(#call, st);                                             \
            goto done;                                                             \
        }                                                                          \
    } while (0)

/* splitmix64: small, seedable, one state per thread. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next(s) >> 40) * (1.0 / (double)(1ull << 24)));
}

/* ------------------------------------------------------------------------ */
/*  Setup: weights and a paged KV cache with scattered pages               */
/* ------------------------------------------------------------------------ */

static void model_init(model *m, fp_context *ctx, fp_stream stream)
{
    uint64_t rng = 42;
    // gamma around 1, never 0
    for (int i = 0; i < HIDDEN; ++i) m->gamma[i] = rng_uniform(&rng, 0.5f, 1.5f);
    // random cache length per sequence, counting the pages each needs
    m->num_pages = 0;
    for (int s = 0; s < NUM_SEQS; ++s) {
        m->seq_len[s] = 1 + (int)(rng_next(&rng) % MAX_SEQ_LEN);
        m->num_pages += (m->seq_len[s] + PAGE_SIZE - 1) / PAGE_SIZE;
    }
    // shuffle page ids (Fisher-Yates) so a sequence's pages are scattered in the pool
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)m->num_pages);
    if (!perm) { fprintf(stderr, "serve_decode: out of host memory\n"); exit(1); }
    for (int i = 0; i < m->num_pages; ++i) perm[i] = i;
    for (int i = m->num_pages - 1; i > 0; --i) {
        int j = (int)(rng_next(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    // block table: block b of sequence s lives in page block_table[s][b] (unused blocks: 0)
    int next = 0;
    for (int s = 0; s < NUM_SEQS; ++s)
        for (int b = 0; b < MAX_PAGES_PER_SEQ; ++b)
            m->block_table[s][b] =
                b * PAGE_SIZE < m->seq_len[s] ? perm[next++] : 0;
    free(perm);
    // fill the K and V pools with random values (host copy kept for the references)
    size_t pool_floats = (size_t)m->num_pages * PAGE_SIZE * KV_ROW;
    m->h_k = malloc(pool_floats * sizeof(float));
    m->h_v = malloc(pool_floats * sizeof(float));
    if (!m->h_k || !m->h_v) { fprintf(stderr, "serve_decode: out of host memory\n"); exit(1); }
    for (size_t i = 0; i < pool_floats; ++i) {
        m->h_k[i] = rng_uniform(&rng, -1.0f, 1.0f);
        m->h_v[i] = rng_uniform(&rng, -1.0f, 1.0f);
    }
    // copy weights and cache to the context (device memory on CUDA, host memory on CPU)
    MUST(fp_mem_alloc(ctx, pool_floats * sizeof(float), &m->d_k));
    MUST(fp_mem_alloc(ctx, pool_floats * sizeof(float), &m->d_v));
    MUST(fp_mem_alloc(ctx, sizeof m->gamma, &m->d_gamma));
    MUST(fp_mem_upload(ctx, m->d_k, m->h_k, pool_floats * sizeof(float), stream));
    MUST(fp_mem_upload(ctx, m->d_v, m->h_v, pool_floats * sizeof(float), stream));
    MUST(fp_mem_upload(ctx, m->d_gamma, m->gamma, sizeof m->gamma, stream));
    MUST(fp_context_synchronize(ctx, stream));
}

static void model_free(model *m, fp_context *ctx)
{
    MUST(fp_mem_free(ctx, m->d_k));
    MUST(fp_mem_free(ctx, m->d_v));
    MUST(fp_mem_free(ctx, m->d_gamma));
    free(m->h_k);
    free(m->h_v);
}

/* ------------------------------------------------------------------------ */
/*  The executor: one batched layer step                                    */
/* ------------------------------------------------------------------------ */

/* A batch's host rows: where the executor assembles inputs and reads
 * results (the server's own arrays, or a --pipeline chunk's). */
typedef struct host_rows {
    float (*x)[HIDDEN], (*res)[HIDDEN], (*attn)[HIDDEN], (*resout)[HIDDEN];
    int32_t (*table)[MAX_PAGES_PER_SEQ];
    int32_t *seqlens;
} host_rows;

static host_rows server_rows(server *sv)
{
    return (host_rows){sv->h_x, sv->h_res, sv->h_attn, sv->h_resout, sv->h_table, sv->h_seqlens};
}

/* Row i of the host rows := request i's input, table row and length.
 * Returns the batch's longest cached sequence. */
static int assemble_rows(const model *m, const fp_batch_item *items, int count, host_rows h)
{
    int max_len = 1;
    for (int i = 0; i < count; ++i) {
        const request_input *in = items[i].input;
        memcpy(h.x[i], in->x, sizeof in->x);
        memcpy(h.res[i], in->residual, sizeof in->residual);
        memcpy(h.table[i], m->block_table[in->seq], sizeof h.table[i]);
        h.seqlens[i] = m->seq_len[in->seq];
        if (m->seq_len[in->seq] > max_len) max_len = m->seq_len[in->seq];
    }
    return max_len;
}

/* Row i of the downloaded results -> request i's own output buffer. */
static void scatter_rows(fp_batch_item *items, int count, host_rows h)
{
    for (int i = 0; i < count; ++i) {
        request_output *out = items[i].output;
        request_track *track = items[i].user;
        memcpy(out->attn, h.attn[i], sizeof out->attn);
        memcpy(out->residual_out, h.resout[i], sizeof out->residual_out);
        atomic_fetch_add(&track->executed, 1);
    }
}

/* Step 1: residual_out = x + residual; q = RMSNorm(residual_out) * gamma. */
static fp_status norm_step(server *sv, fp_stream stream, int64_t rows, const void *x, const void *res,
                           void *q, void *resout)
{
    fp_norm_params np;
    fp_norm_params_default(&np);
    np.kind = FP_NORM_RMSNORM;
    np.rows = rows;
    np.cols = HIDDEN;
    np.x_dtype = np.residual_dtype = np.out_dtype = np.param_dtype = FP_F32;
    np.x = x;
    np.residual = res;
    np.gamma = sv->m->d_gamma;
    np.out = q;
    np.residual_out = resout;
    np.eps = RMS_EPS;
    return fp_norm_forward(sv->ctx, stream, &np);
}

/* Step 2: decode attention, one query token per sequence, keys from the
 * paged cache; seqlen_k bounds every row's own length (seqlens_k). */
static fp_status attention_step(server *sv, fp_stream stream, int batch, int seqlen_k, const void *q,
                                void *attn, const void *table, const void *seqlens)
{
    fp_attention_params ap;
    fp_attention_params_default(&ap);
    ap.batch = batch;
    ap.seqlen_q = 1;
    ap.seqlen_k = seqlen_k;
    ap.heads_q = HEADS_Q;
    ap.heads_kv = HEADS_KV;
    ap.head_dim = HEAD_DIM;
    ap.dtype = FP_F32;
    ap.q = q;                              /* [batch, 1, HEADS_Q, HEAD_DIM], packed */
    ap.k = sv->m->d_k;                     /* [num_pages, PAGE_SIZE, HEADS_KV, HEAD_DIM] */
    ap.v = sv->m->d_v;
    ap.o = attn;                           /* [batch, 1, HEADS_Q, HEAD_DIM], packed */
    ap.seqlens_k = seqlens;                /* each sequence's own cache length */
    ap.block_table = table;                /* [batch, MAX_PAGES_PER_SEQ] */
    ap.block_table_stride = MAX_PAGES_PER_SEQ;
    ap.page_size = PAGE_SIZE;
    ap.num_pages = sv->m->num_pages;
    return fp_attention_forward(sv->ctx, stream, &ap);
}

/* After a failure, lets queued work finish before the buffers are reused. */
static void drain_after_failure(server *sv, fp_status st)
{
    if (st == FP_OK) return;
    fp_status sst = fp_context_synchronize(sv->ctx, sv->stream);
    if (sst != FP_OK) report_failure("fp_context_synchronize", sst);
}

static fp_status layer_step(void *user, fp_batch_item *items, int count, int padded_count)
{
    (void)padded_count; /* no allowed_batch_sizes: padded_count == count */
    server *sv = user;
    fp_status st = FP_OK;
    const size_t act_bytes = (size_t)count * HIDDEN * sizeof(float);
    void *d_x = NULL, *d_res = NULL, *d_q = NULL, *d_resout = NULL, *d_attn = NULL;
    void *d_table = NULL, *d_seqlens = NULL;

    // assemble the batch on the host: row i holds request i's input, table row and length
    const int max_len = assemble_rows(sv->m, items, count, server_rows(sv));

    // take this batch's scratch buffers from the caching allocator
    TRY(fp_alloc_alloc(sv->alloc, act_bytes, sv->stream, &d_x));
    TRY(fp_alloc_alloc(sv->alloc, act_bytes, sv->stream, &d_res));
    TRY(fp_alloc_alloc(sv->alloc, act_bytes, sv->stream, &d_q));
    TRY(fp_alloc_alloc(sv->alloc, act_bytes, sv->stream, &d_resout));
    TRY(fp_alloc_alloc(sv->alloc, act_bytes, sv->stream, &d_attn));
    TRY(fp_alloc_alloc(sv->alloc, (size_t)count * sizeof sv->h_table[0], sv->stream, &d_table));
    TRY(fp_alloc_alloc(sv->alloc, (size_t)count * sizeof(int32_t), sv->stream, &d_seqlens));

    // upload the batch (a memcpy on a CPU context)
    TRY(fp_mem_upload(sv->ctx, d_x, sv->h_x, act_bytes, sv->stream));
    TRY(fp_mem_upload(sv->ctx, d_res, sv->h_res, act_bytes, sv->stream));
    TRY(fp_mem_upload(sv->ctx, d_table, sv->h_table, (size_t)count * sizeof sv->h_table[0],
                      sv->stream));
    TRY(fp_mem_upload(sv->ctx, d_seqlens, sv->h_seqlens, (size_t)count * sizeof(int32_t),
                      sv->stream));

    // the layer: RMSNorm over the batch's rows, then attention up to its longest sequence
    TRY(norm_step(sv, sv->stream, count, d_x, d_res, d_q, d_resout));
    TRY(attention_step(sv, sv->stream, count, max_len, d_q, d_attn, d_table, d_seqlens));

    // download the results and wait for them
    TRY(fp_mem_download(sv->ctx, sv->h_attn, d_attn, act_bytes, sv->stream));
    TRY(fp_mem_download(sv->ctx, sv->h_resout, d_resout, act_bytes, sv->stream));
    TRY(fp_context_synchronize(sv->ctx, sv->stream));

    // scatter row i back to request i's own output buffer
    scatter_rows(items, count, server_rows(sv));

done:
    drain_after_failure(sv, st);
    // give the scratch buffers back to the cache (fp_alloc_free(NULL) is a no-op)
    {
        void *bufs[] = {d_x, d_res, d_q, d_resout, d_attn, d_table, d_seqlens};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) {
            fp_status fst = fp_alloc_free(sv->alloc, bufs[i]);
            if (fst != FP_OK) {
                report_failure("fp_alloc_free", fst);
                if (st == FP_OK) st = fst;
            }
        }
    }
    return st;
}

/* ------------------------------------------------------------------------ */
/*  --graphs: the same layer step, captured per batch-size bucket           */
/* ------------------------------------------------------------------------ */

/* fp_graph_step_fn: the layer step on rows [0, size) of the static buffers.
 * Only what a graph can replay: launches on `stream` with fixed pointers and
 * scalars. seqlen_k is the fixed bound MAX_SEQ_LEN (the batch's longest
 * sequence changes from batch to batch); seqlens_k holds each row's own
 * length. */
static fp_status graph_step(void *user, fp_stream stream, int64_t size)
{
    server *sv = user;
    const static_buffers *b = &sv->sb;
    fp_status st = norm_step(sv, stream, size, b->x, b->res, b->q, b->resout);
    if (st != FP_OK) return st;
    return attention_step(sv, stream, (int)size, MAX_SEQ_LEN, b->q, b->attn, b->table, b->seqlens);
}

/* The executor of --graphs: count real requests, padded_count (a bucket, by
 * fp_graph_cache_to_batcher) rows to run. */
static fp_status layer_step_graphs(void *user, fp_batch_item *items, int count, int padded_count)
{
    server *sv = user;
    const static_buffers *b = &sv->sb;
    fp_status st = FP_OK;
    const size_t row_bytes = HIDDEN * sizeof(float);

    // rows [0, count) as the other executor assembles them; the padding rows
    // [count, padded_count): one cached token on a valid page, so they
    // compute something finite that nobody reads
    (void)assemble_rows(sv->m, items, count, server_rows(sv));
    for (int i = count; i < padded_count; ++i) {
        memset(sv->h_table[i], 0, sizeof sv->h_table[i]);
        sv->h_seqlens[i] = 1;
    }
    TRY(fp_mem_upload(sv->ctx, b->x, sv->h_x, (size_t)count * row_bytes, sv->stream));
    TRY(fp_mem_upload(sv->ctx, b->res, sv->h_res, (size_t)count * row_bytes, sv->stream));
    TRY(fp_graph_pad_rows(sv->ctx, sv->stream, b->x, row_bytes, count, padded_count, 0));
    TRY(fp_graph_pad_rows(sv->ctx, sv->stream, b->res, row_bytes, count, padded_count, 0));
    TRY(fp_mem_upload(sv->ctx, b->table, sv->h_table, (size_t)padded_count * sizeof sv->h_table[0],
                      sv->stream));
    TRY(fp_mem_upload(sv->ctx, b->seqlens, sv->h_seqlens, (size_t)padded_count * sizeof(int32_t),
                      sv->stream));

    // the bucket's graph (captured by the first batch of this size)
    int64_t ran_at = 0;
    TRY(fp_graph_cache_run(sv->graphs, sv->stream, count, &ran_at, NULL));
    if (ran_at != padded_count) {
        // the batcher's allowed sizes are the cache's buckets: they must agree
        fprintf(stderr, "serve_decode: a batch of %d padded to %d ran at %lld\n", count, padded_count,
                (long long)ran_at);
        st = FP_ERR_INTERNAL;
        goto done;
    }

    TRY(fp_mem_download(sv->ctx, sv->h_attn, b->attn, (size_t)count * row_bytes, sv->stream));
    TRY(fp_mem_download(sv->ctx, sv->h_resout, b->resout, (size_t)count * row_bytes, sv->stream));
    TRY(fp_context_synchronize(sv->ctx, sv->stream));
    scatter_rows(items, count, server_rows(sv));
done:
    drain_after_failure(sv, st);
    return st;
}

/* The graph cache over graph_step and its static buffers, sized for the
 * largest bucket; the batcher config's allowed sizes set to the buckets. */
static void graphs_init(server *sv, fp_batcher_config *cfg)
{
    static_buffers *b = &sv->sb;
    const size_t act_bytes = (size_t)MAX_BATCH * HIDDEN * sizeof(float);
    MUST(fp_graph_pool_create(sv->ctx, &b->pool));
    MUST(fp_graph_pool_alloc(b->pool, act_bytes, &b->x));
    MUST(fp_graph_pool_alloc(b->pool, act_bytes, &b->res));
    MUST(fp_graph_pool_alloc(b->pool, act_bytes, &b->q));
    MUST(fp_graph_pool_alloc(b->pool, act_bytes, &b->resout));
    MUST(fp_graph_pool_alloc(b->pool, act_bytes, &b->attn));
    MUST(fp_graph_pool_alloc(b->pool, (size_t)MAX_BATCH * sizeof sv->h_table[0], &b->table));
    MUST(fp_graph_pool_alloc(b->pool, (size_t)MAX_BATCH * sizeof(int32_t), &b->seqlens));
    fp_graph_cache_config gc;
    fp_graph_cache_config_default(&gc);
    gc.max_size = MAX_BATCH;  /* buckets 1, 2, 4, 8, 16 */
    gc.pool = b->pool;
    MUST(fp_graph_cache_create(sv->ctx, graph_step, sv, &gc, &sv->graphs));
    MUST(fp_graph_cache_to_batcher(sv->graphs, cfg));
}

/* Prints the cache's statistics; returns the number of problems: every batch
 * must have replayed or captured a graph (none eager, no failed capture). */
static int graphs_report(server *sv, int64_t batches)
{
    fp_graph_cache_stats gs;
    fp_graph_cache_stats_init(&gs);
    MUST(fp_graph_cache_get_stats(sv->graphs, &gs));
    printf("  graphs: %llu runs, %llu replays, %llu captures (%.1f ms), %llu eager runs, "
           "%llu padded rows of %llu, lookup %.0f ns\n",
           (unsigned long long)gs.runs, (unsigned long long)gs.replays, (unsigned long long)gs.captures,
           gs.capture_ms_total, (unsigned long long)(gs.eager_above + gs.eager_uncapturable),
           (unsigned long long)gs.padded_rows, (unsigned long long)(gs.rows + gs.padded_rows), gs.lookup_ns);
    int problems = 0;
    if (gs.runs != (uint64_t)batches || gs.replays + gs.captures != gs.runs) {
        fprintf(stderr, "serve_decode: %lld batches but %llu graph runs (%llu replays, %llu captures)\n",
                (long long)batches, (unsigned long long)gs.runs, (unsigned long long)gs.replays,
                (unsigned long long)gs.captures);
        problems++;
    }
    if (gs.capture_failures != 0) {
        fprintf(stderr, "serve_decode: %llu captures failed: %s\n", (unsigned long long)gs.capture_failures,
                fp_graph_cache_capture_error(sv->graphs));
        problems++;
    }
    return problems;
}

static void graphs_free(server *sv)
{
    fp_graph_cache_destroy(sv->graphs); /* before the pool its graphs use */
    void *bufs[] = {sv->sb.x, sv->sb.res, sv->sb.q, sv->sb.resout, sv->sb.attn, sv->sb.table, sv->sb.seqlens};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) MUST(fp_graph_pool_free(sv->sb.pool, bufs[i]));
    MUST(fp_graph_pool_destroy(sv->sb.pool));
}

/* ------------------------------------------------------------------------ */
/*  --pipeline: batches staged through an fp_pipeline                       */
/* ------------------------------------------------------------------------ */

enum { PIPE_EXECUTORS = 3 }; /* batches in flight: the pipeline's depth too */

/* One batch as a pipeline chunk: every row array at a fixed offset (sized
 * for MAX_BATCH rows: 49 KiB in, 32 KiB out), so the compute finds them in
 * the chunk's device copy. */
typedef struct pipe_in {
    float x[MAX_BATCH][HIDDEN], res[MAX_BATCH][HIDDEN];
    int32_t table[MAX_BATCH][MAX_PAGES_PER_SEQ];
    int32_t seqlens[MAX_BATCH];
} pipe_in;
typedef struct pipe_out {
    float attn[MAX_BATCH][HIDDEN], resout[MAX_BATCH][HIDDEN];
} pipe_out;

/* An executor's batch in flight: the chunk's tag. */
typedef struct pipe_batch {
    int count, max_len;
    pipe_in in;    /* pageable: the pipeline stages it into pinned memory */
    pipe_out out;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    fp_status st;
} pipe_batch;

/* fp_pipeline_compute_fn: the layer step on the chunk's device copy, on the
 * pipeline's compute stream. q is scratch from the caching allocator on that
 * stream, freed at once: the next user on the stream is ordered after it. */
static fp_status pipe_compute(void *user, fp_stream stream, const fp_pipeline_chunk *c)
{
    server *sv = user;
    const pipe_batch *b = c->tag;
    const char *din = c->d_in;
    char *dout = c->d_out;
    void *d_q = NULL;
    fp_status st = fp_alloc_alloc(sv->alloc, (size_t)b->count * HIDDEN * sizeof(float), stream, &d_q);
    if (st != FP_OK) return st;
    st = norm_step(sv, stream, b->count, din + offsetof(pipe_in, x), din + offsetof(pipe_in, res), d_q,
                   dout + offsetof(pipe_out, resout));
    if (st == FP_OK)
        st = attention_step(sv, stream, b->count, b->max_len, d_q, dout + offsetof(pipe_out, attn),
                            din + offsetof(pipe_in, table), din + offsetof(pipe_in, seqlens));
    fp_status fst = fp_alloc_free(sv->alloc, d_q);
    return st != FP_OK ? st : fst;
}

/* fp_pipeline_complete_fn: wakes the executor that submitted the batch. */
static void pipe_complete(void *user, const fp_pipeline_chunk *c, fp_status status, const char *message)
{
    (void)user;
    pipe_batch *b = c->tag;
    if (status != FP_OK) fprintf(stderr, "serve_decode: batch chunk %llu failed: %s (%s)\n",
                                 (unsigned long long)c->seq, fp_status_string(status), message);
    pthread_mutex_lock(&b->mu);
    b->st = status;
    b->done = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* The executor of --pipeline (PIPE_EXECUTORS run at once): pack, submit,
 * wait for this batch's completion, scatter. */
static fp_status layer_step_pipeline(void *user, fp_batch_item *items, int count, int padded_count)
{
    (void)padded_count;
    server *sv = user;
    pipe_batch *b = malloc(sizeof *b);
    if (!b) return FP_ERR_OUT_OF_MEMORY;
    b->count = count;
    b->done = 0;
    b->st = FP_OK;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    host_rows rows = {b->in.x, b->in.res, b->out.attn, b->out.resout, b->in.table, b->in.seqlens};
    b->max_len = assemble_rows(sv->m, items, count, rows);
    fp_status st = fp_pipeline_submit(sv->pipe, &b->in, sizeof b->in, &b->out, sizeof b->out, b, -1, NULL);
    if (st != FP_OK) {
        report_failure("fp_pipeline_submit", st);
    } else {
        pthread_mutex_lock(&b->mu);
        while (!b->done) pthread_cond_wait(&b->cv, &b->mu);
        pthread_mutex_unlock(&b->mu);
        st = b->st;
        if (st == FP_OK) scatter_rows(items, count, rows);
    }
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b);
    return st;
}

static void pipeline_init(server *sv, fp_batcher_config *cfg)
{
    fp_pipeline_config pc;
    fp_pipeline_config_default(&pc);
    pc.depth = PIPE_EXECUTORS;
    pc.max_in_bytes = sizeof(pipe_in);
    pc.max_out_bytes = sizeof(pipe_out);
    pc.compute = pipe_compute;
    pc.complete = pipe_complete;
    pc.user = sv;
    MUST(fp_pipeline_create(sv->ctx, &pc, &sv->pipe));
    cfg->executor_threads = PIPE_EXECUTORS;
}

/* Prints the pipeline's statistics; returns the number of problems: every
 * batch must have gone through it, none failed. */
static int pipeline_report(server *sv, int64_t batches)
{
    fp_pipeline_stats ps;
    fp_pipeline_stats_init(&ps);
    MUST(fp_pipeline_get_stats(sv->pipe, &ps));
    printf("  pipeline: %llu chunks (%llu staged), %llu failed; h2d %.2f GB/s, d2h %.2f GB/s, "
           "overlap efficiency %.2f, most in flight %llu\n",
           (unsigned long long)ps.completed, (unsigned long long)ps.staged, (unsigned long long)ps.failed,
           ps.h2d_gbps, ps.d2h_gbps, ps.overlap_efficiency, (unsigned long long)ps.max_in_flight);
    int problems = 0;
    if ((int64_t)ps.completed != batches || ps.failed != 0) {
        fprintf(stderr, "serve_decode: %lld batches but %llu pipeline chunks (%llu failed)\n", (long long)batches,
                (unsigned long long)ps.completed, (unsigned long long)ps.failed);
        problems++;
    }
    return problems;
}

/* ------------------------------------------------------------------------ */
/*  Clients: submit, wait, check against a plain C reference                */
/* ------------------------------------------------------------------------ */

/* The layer step for one request in double precision: what the batch row of
 * this request must hold. */
static void reference_step(const model *m, const request_input *in, double *attn,
                           double *residual_out)
{
    // RMSNorm with residual (s rounded to f32 as the library stores it)
    double q[HIDDEN], sumsq = 0.0;
    for (int c = 0; c < HIDDEN; ++c) {
        float s = in->x[c] + in->residual[c];
        residual_out[c] = s;
        sumsq += (double)s * s;
    }
    double rstd = 1.0 / sqrt(sumsq / HIDDEN + (double)RMS_EPS);
    for (int c = 0; c < HIDDEN; ++c) q[c] = residual_out[c] * rstd * m->gamma[c];
    // attention over this sequence's keys, found through its own block table row
    const int len = m->seq_len[in->seq];
    const double scale = 1.0 / sqrt((double)HEAD_DIM);
    double score[MAX_SEQ_LEN];
    for (int h = 0; h < HEADS_Q; ++h) {
        const int hk = h / (HEADS_Q / HEADS_KV);
        const double *qh = q + h * HEAD_DIM;
        double mx = -INFINITY, denom = 0.0;
        for (int j = 0; j < len; ++j) {
            size_t row = (size_t)m->block_table[in->seq][j / PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE;
            const float *k = m->h_k + row * KV_ROW + hk * HEAD_DIM;
            double dot = 0.0;
            for (int d = 0; d < HEAD_DIM; ++d) dot += qh[d] * k[d];
            score[j] = dot * scale;
            if (score[j] > mx) mx = score[j];
        }
        for (int d = 0; d < HEAD_DIM; ++d) attn[h * HEAD_DIM + d] = 0.0;
        for (int j = 0; j < len; ++j) {
            size_t row = (size_t)m->block_table[in->seq][j / PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE;
            const float *v = m->h_v + row * KV_ROW + hk * HEAD_DIM;
            double p = exp(score[j] - mx);
            denom += p;
            for (int d = 0; d < HEAD_DIM; ++d) attn[h * HEAD_DIM + d] += p * v[d];
        }
        for (int d = 0; d < HEAD_DIM; ++d) attn[h * HEAD_DIM + d] /= denom;
    }
}

/* Index of the first element outside tolerance, or -1. */
static int first_mismatch(const float *got, const double *want, int n)
{
    for (int i = 0; i < n; ++i)
        if (!(fabs(got[i] - want[i]) <= TOL_ABS + TOL_REL * fabs(want[i]))) return i;
    return -1;
}

typedef struct client {
    int id, requests;
    fp_batcher *batcher;
    const model *m;
    request_track *tracks;    /* [requests] of this client */
    int failures;
} client;

/* Completion callback: counts completions, which must be exactly one. */
static void on_done(fp_batch_request *req, fp_status status, void *user)
{
    (void)req;
    (void)status;
    atomic_fetch_add(&((request_track *)user)->completed, 1);
}

static void *client_main(void *arg)
{
    client *c = arg;
    uint64_t rng = 1000 + (uint64_t)c->id;
    request_input in;
    request_output out;
    double want_attn[HIDDEN], want_resout[HIDDEN];
    for (int r = 0; r < c->requests; ++r) {
        // a new token for a random cached sequence; poison the output with NaN
        in.seq = (int)(rng_next(&rng) % NUM_SEQS);
        for (int i = 0; i < HIDDEN; ++i) {
            in.x[i] = rng_uniform(&rng, -2.0f, 2.0f);
            in.residual[i] = rng_uniform(&rng, -1.0f, 1.0f);
        }
        for (int i = 0; i < HIDDEN; ++i) out.attn[i] = out.residual_out[i] = NAN;
        // submit it and wait for its completion
        fp_batch_submit_info info;
        fp_batch_submit_info_default(&info);
        info.input = &in;
        info.input_size = sizeof in;
        info.output = &out;
        info.output_size = sizeof out;
        info.user = &c->tracks[r];
        info.on_done = on_done;
        info.on_done_user = &c->tracks[r];
        fp_batch_request *req = NULL;
        fp_status st = fp_batcher_submit(c->batcher, &info, &req);
        if (st != FP_OK) { report_failure("fp_batcher_submit", st); c->failures++; continue; }
        fp_status result = FP_ERR_INTERNAL;
        st = fp_batch_request_wait(req, -1, &result);
        fp_batch_request_release(req);
        if (st != FP_OK) { report_failure("fp_batch_request_wait", st); c->failures++; continue; }
        if (result != FP_OK) {
            fprintf(stderr, "serve_decode: client %d request %d completed with %s\n", c->id, r,
                    fp_status_string(result));
            c->failures++;
            continue;
        }
        // check this request's output against its own reference
        reference_step(c->m, &in, want_attn, want_resout);
        int bad = first_mismatch(out.residual_out, want_resout, HIDDEN);
        const char *what = "residual_out";
        const float *got = out.residual_out;
        const double *want = want_resout;
        if (bad < 0) {
            bad = first_mismatch(out.attn, want_attn, HIDDEN);
            what = "attn";
            got = out.attn;
            want = want_attn;
        }
        if (bad >= 0) {
            fprintf(stderr,
                    "serve_decode: MISMATCH client %d request %d (sequence %d, %d cached tokens): "
                    "%s[%d] = %.7g, expected %.7g\n",
                    c->id, r, in.seq, c->m->seq_len[in.seq], what, bad, got[bad], want[bad]);
            c->failures++;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/*  main                                                                    */
/* ------------------------------------------------------------------------ */

static int usage(void)
{
    fprintf(stderr, "usage: serve_decode [--device cpu|cuda] [--clients N] [--requests N] [--graphs | --pipeline]\n");
    return 2;
}

int main(int argc, char **argv)
{
    fp_device_kind kind = FP_DEVICE_CPU;
    int num_clients = 16, requests = 20, use_graphs = 0, use_pipeline = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--graphs")) {
            use_graphs = 1;
            continue;
        }
        if (!strcmp(argv[i], "--pipeline")) {
            use_pipeline = 1;
            continue;
        }
        if (i + 1 >= argc) return usage();
        if (!strcmp(argv[i], "--device")) {
            ++i;
            if (!strcmp(argv[i], "cpu")) kind = FP_DEVICE_CPU;
            else if (!strcmp(argv[i], "cuda")) kind = FP_DEVICE_CUDA;
            else return usage();
        } else if (!strcmp(argv[i], "--clients")) {
            num_clients = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--requests")) {
            requests = atoi(argv[++i]);
        } else {
            return usage();
        }
    }
    if (num_clients < 1 || num_clients > 1024 || requests < 1 || requests > 100000) return usage();
    if (use_graphs && use_pipeline) return usage();

    // a context (CPU worker pool, or CUDA device 0 with its stream) and a caching allocator on it
    static server sv; /* large staging arrays: not on the stack */
    static model m;
    MUST(fp_context_create(kind, 0, &sv.ctx));
    sv.stream = fp_context_stream(sv.ctx);
    MUST(fp_alloc_create_for_context(sv.ctx, NULL, &sv.alloc));
    sv.m = &m;

    // weights and the paged KV cache
    model_init(&m, sv.ctx, sv.stream);

    // a dynamic batcher: up to 16 requests per batch, waiting at most 200 us to fill one
    fp_batcher_config cfg;
    fp_batcher_config_default(&cfg);
    cfg.max_batch_size = MAX_BATCH;
    cfg.max_queue_delay_us = 200;
    cfg.executor_threads = 1;
    // --graphs: allowed sizes = the graph cache's buckets (max_batch_size stays 16, the largest)
    if (use_graphs) graphs_init(&sv, &cfg);
    // --pipeline: three executors, each batch through the pipeline
    if (use_pipeline) pipeline_init(&sv, &cfg);
    fp_batcher *batcher = NULL;
    MUST(fp_batcher_create(&cfg, use_graphs ? layer_step_graphs : use_pipeline ? layer_step_pipeline : layer_step,
                           &sv, &batcher));

    // clients: each submits its requests one at a time and checks every answer
    client *clients = calloc((size_t)num_clients, sizeof *clients);
    request_track *tracks = calloc((size_t)num_clients * (size_t)requests, sizeof *tracks);
    pthread_t *threads = calloc((size_t)num_clients, sizeof *threads);
    if (!clients || !tracks || !threads) { fprintf(stderr, "serve_decode: out of host memory\n"); return 1; }
    for (int c = 0; c < num_clients; ++c) {
        clients[c] = (client){.id = c, .requests = requests, .batcher = batcher, .m = &m,
                              .tracks = tracks + (size_t)c * (size_t)requests};
        if (pthread_create(&threads[c], NULL, client_main, &clients[c]) != 0) {
            fprintf(stderr, "serve_decode: pthread_create failed\n");
            return 1;
        }
    }
    int failures = 0;
    for (int c = 0; c < num_clients; ++c) {
        pthread_join(threads[c], NULL);
        failures += clients[c].failures;
    }

    // drain and stop the batcher, then read its statistics
    MUST(fp_batcher_shutdown(batcher, FP_BATCHER_SHUTDOWN_DRAIN));
    fp_batcher_stats bs;
    fp_batcher_stats_init(&bs);
    MUST(fp_batcher_get_stats(batcher, &bs));
    fp_alloc_stats as;
    memset(&as, 0, sizeof as);
    as.struct_size = sizeof as;
    MUST(fp_alloc_get_stats(sv.alloc, &as));

    // every request must have run once and completed once
    const int total = num_clients * requests;
    for (int i = 0; i < total; ++i) {
        int e = atomic_load(&tracks[i].executed), d = atomic_load(&tracks[i].completed);
        if (e != 1 || d != 1) {
            fprintf(stderr, "serve_decode: client %d request %d executed %d times, completed %d times\n",
                    i / requests, i % requests, e, d);
            failures++;
        }
    }
    if (bs.completed_ok != total) {
        fprintf(stderr, "serve_decode: batcher completed %lld of %d requests\n",
                (long long)bs.completed_ok, total);
        failures++;
    }

    printf("serve_decode on %s%s: %d clients x %d requests = %d requests, %lld batches, "
           "mean batch size %.2f\n",
           kind == FP_DEVICE_CUDA ? "cuda" : "cpu",
           use_graphs ? " with graphs" : use_pipeline ? " through a pipeline" : "", num_clients, requests, total,
           (long long)bs.batches, bs.mean_batch_size);
    printf("  end-to-end latency p50 %.1f us, p99 %.1f us; executor p50 %.1f us per batch\n",
           bs.end_to_end.p50_us, bs.end_to_end.p99_us, bs.executor.p50_us);
    printf("  allocator: %llu allocations, %llu cache hits, %llu upstream allocs\n",
           (unsigned long long)(as.cache_hits + as.cache_misses),
           (unsigned long long)as.cache_hits, (unsigned long long)as.upstream_allocs);
    if (use_graphs) failures += graphs_report(&sv, bs.batches);
    if (use_pipeline) failures += pipeline_report(&sv, bs.batches);
    printf("  %s\n", failures == 0 ? "all outputs correct" : "FAILED");

    // tear down in reverse order
    fp_batcher_destroy(batcher);
    if (use_graphs) graphs_free(&sv);
    fp_pipeline_destroy(sv.pipe);
    model_free(&m, sv.ctx);
    fp_alloc_destroy(sv.alloc);
    fp_context_destroy(sv.ctx);
    free(clients);
    free(tracks);
    free(threads);
    return failures == 0 ? 0 : 1;
}
