/* Pipelines (pipeline.h): chunks of host data staged into pinned memory,
 * copied to the device, computed on and copied back, with `depth` chunks in
 * flight and events ordering the stages.
 *
 * Structure
 *   A ring of chunk records indexed by seq: [head, disp) handed to the
 *   completion thread, [disp, tail) waiting for the dispatcher. The
 *   dispatcher takes chunks in order, takes a slot (staging and device
 *   buffers, six timing events) round robin, stages a pageable input,
 *   enqueues h2d -> compute -> d2h on three streams joined by events, and
 *   moves on without waiting. The completion thread takes chunks in order,
 *   waits on each one's last event, copies a staged output out, calls the
 *   completion callback and frees the slot. Slots are freed in the order
 *   they were taken (completion is in order), so "round robin" is exact.
 *   Only the completion thread waits on the device.
 *
 *   On a CPU context the dispatcher does each copy and the compute itself
 *   (memcpy, the callback) and the "events" are host timestamps; the rest
 *   is the same code.
 *
 *   Tracing (trace.h): each chunk's stages are spans of category
 *   "pipeline" on their streams: "pipeline_h2d" and "pipeline_d2h" (bytes:
 *   the chunk's in_bytes / out_bytes) and "pipeline_compute" (the ops the
 *   callback runs record their own spans inside it on a CPU context).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fastpath/pipeline.h"
#include "internal.h"
#include "pipeline/bandwidth.h"

#define PIPELINE_CONFIG_SIZE_FIRST sizeof(fp_pipeline_config)
#define PIPELINE_STATS_SIZE_FIRST sizeof(fp_pipeline_stats)
#define PIPELINE_MAX_DEPTH 64
#define MSG_MAX 512

enum { EV_H2D0, EV_H2D1, EV_C0, EV_C1, EV_D2H0, EV_D2H1, EV_N };

typedef struct slot {
    void *h_in, *h_out;    /* pinned staging (h_out NULL without output) */
    void *d_in, *d_out;    /* device buffers */
    cudaEvent_t ev[EV_N];  /* CUDA: timing events of the stages */
    double t[EV_N];        /* CPU: the same as host timestamps (s) */
} slot;

typedef struct rec {
    fp_pipeline_chunk c;
    int slot;              /* -1: never reached the device (cancelled, failed early) */
    int last_ev;           /* the last event recorded for it, -1: none */
    int staged, out_staged;
    double stage_ms;
    fp_status st;
    char msg[MSG_MAX];
} rec;

struct fp_pipeline {
    fp_context *ctx;
    int cuda;
    fp_pipeline_config cfg;
    cudaStream_t s_h2d, s_compute, s_d2h;
    fp_allocator *pinned;   /* cfg.pinned or own_pool's */
    fp_pinned_pool *own_pool;
    /* Host copies between pageable and pinned memory: one pool per
     * direction (the dispatcher stages inputs while the completion thread
     * copies outputs out; one pool would serialize them). */
    fp_thread_pool *stage_pool, *unstage_pool;
    slot *slots;

    pthread_mutex_t mu;
    pthread_cond_t cv_space, cv_disp, cv_comp, cv_done;
    rec *ring;
    uint64_t cap;           /* ring capacity: max_chunks_in_flight */
    uint64_t head, disp, tail;
    int disp_busy;          /* the dispatcher is working on ring[disp] */
    uint64_t cancel_upto;   /* chunks with seq below it that have not started are cancelled */
    size_t bytes_in_flight;
    int slots_free, next_slot;
    int closed, stopping, disp_done;
    int broken;             /* a device error: every later chunk fails fast */
    char broken_msg[MSG_MAX];
    /* flush: the first failure since the last flush */
    fp_status first_fail;
    uint64_t first_fail_seq;
    char first_fail_msg[MSG_MAX];

    fp_pipeline_stats stats;
    double first_start_s, last_done_s;   /* wall clock of the stats period */

    pthread_t th_disp, th_comp;
    int threads_started;
};

/* The pipeline whose callback the calling thread is in (NULL: none). */
static _Thread_local const fp_pipeline *tl_in_callback;

/* ------------------------------------------------------------------------ */
/*  Config and stats structs                                                */
/* ------------------------------------------------------------------------ */

fp_status fp_pipeline_config_default_sized(fp_pipeline_config *out, size_t struct_size) {
    fp_pipeline_config d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.depth = 3;
    return fp_struct_init(out, struct_size, &d, PIPELINE_CONFIG_SIZE_FIRST, sizeof d, "fp_pipeline_config");
}

fp_status fp_pipeline_stats_init_sized(fp_pipeline_stats *out, size_t struct_size) {
    return fp_struct_init(out, struct_size, NULL, PIPELINE_STATS_SIZE_FIRST, sizeof(fp_pipeline_stats),
                          "fp_pipeline_stats");
}

/* ------------------------------------------------------------------------ */
/*  Small helpers                                                           */
/* ------------------------------------------------------------------------ */

/* Waits on cv; timeout_ms < 0: no limit. Returns 0 on a timeout. */
static int cond_wait(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t timeout_ms, const struct timespec *dl) {
    if (timeout_ms < 0) {
        pthread_cond_wait(cv, mu);
        return 1;
    }
    return pthread_cond_timedwait(cv, mu, dl) == 0;
}

static void copy_msg(char *dst, const char *src) {
    snprintf(dst, MSG_MAX, "%s", src ? src : "");
}

/* Whether a host pointer is page-locked (pinned or registered): then the
 * copies use it directly. On a CPU context nothing is: every input is
 * staged, so the staging path is what CPU tests exercise. */
static int host_is_pinned(const fp_pipeline *p, const void *ptr) {
    if (!p->cuda) return 0;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        (void)cudaGetLastError(); /* not a CUDA pointer: pageable */
        return 0;
    }
    return a.type == cudaMemoryTypeHost;
}

/* ------------------------------------------------------------------------ */
/*  Staging: pageable -> pinned by host threads                             */
/* ------------------------------------------------------------------------ */

typedef struct stage_arg {
    char *dst;
    const char *src;
    size_t bytes, piece;
} stage_arg;

static void stage_piece(void *arg, size_t begin, size_t end) {
    stage_arg *a = arg;
    for (size_t i = begin; i < end; ++i) {
        size_t off = i * a->piece;
        size_t n = off + a->piece > a->bytes ? a->bytes - off : a->piece;
        memcpy(a->dst + off, a->src + off, n);
    }
}

#define STAGE_PIECE ((size_t)1 << 20)

void fp_stage_copy(fp_thread_pool *pool, void *dst, const void *src, size_t bytes) {
    if (!pool || bytes < 2 * STAGE_PIECE) {
        memcpy(dst, src, bytes);
        return;
    }
    stage_arg a = {dst, src, bytes, STAGE_PIECE};
    size_t pieces = (bytes + STAGE_PIECE - 1) / STAGE_PIECE;
    fp_parallel_for(pool, pieces, 1, stage_piece, &a);
}

/* ------------------------------------------------------------------------ */
/*  Dispatcher                                                              */
/* ------------------------------------------------------------------------ */

/* Marks an event of the stage sequence: CUDA records it on s, CPU stamps. */
static fp_status mark(fp_pipeline *p, slot *sl, int ev, cudaStream_t s) {
    if (!p->cuda) {
        sl->t[ev] = fp_now_s();
        return FP_OK;
    }
    FP_CUDA_TRY(cudaEventRecord(sl->ev[ev], s));
    return FP_OK;
}

/* Everything a started chunk goes through up to the last enqueue. Sets
 * r->last_ev to the last event recorded, so the completion thread waits
 * for whatever reached the device, even on failure. */
static void dispatch_one(fp_pipeline *p, rec *r) {
    slot *sl = &p->slots[r->slot];
    fp_pipeline_chunk *c = &r->c;
    const void *src = c->host_in;
    fp_status st = FP_OK;
    r->last_ev = -1;

    if (!host_is_pinned(p, c->host_in)) {
        double t0 = fp_now_s();
        fp_stage_copy(p->stage_pool, sl->h_in, c->host_in, c->in_bytes);
        r->stage_ms = (fp_now_s() - t0) * 1e3;
        r->staged = 1;
        src = sl->h_in;
    }
    c->d_in = sl->d_in;
    c->d_out = c->out_bytes ? sl->d_out : NULL;

    /* h2d */
    uint64_t span = fp_ctx_trace_begin(p->ctx, (fp_stream)p->s_h2d, "pipeline_h2d", "pipeline", (double)c->in_bytes, 0);
    st = mark(p, sl, EV_H2D0, p->s_h2d);
    if (st == FP_OK && p->cuda) {
        cudaError_t e = cudaMemcpyAsync(sl->d_in, src, c->in_bytes, cudaMemcpyHostToDevice, p->s_h2d);
        if (e != cudaSuccess) st = fp_cuda_status(e, "cudaMemcpyAsync (h2d)", __FILE__, __LINE__);
    } else if (st == FP_OK) {
        memcpy(sl->d_in, src, c->in_bytes);
    }
    if (st == FP_OK) st = mark(p, sl, EV_H2D1, p->s_h2d);
    fp_ctx_trace_end(p->ctx, span);
    if (st != FP_OK) goto fail;
    r->last_ev = EV_H2D1;

    /* compute, after the h2d */
    if (p->cuda) {
        cudaError_t e = cudaStreamWaitEvent(p->s_compute, sl->ev[EV_H2D1], 0);
        if (e != cudaSuccess) {
            st = fp_cuda_status(e, "cudaStreamWaitEvent (compute after h2d)", __FILE__, __LINE__);
            goto fail;
        }
    }
    span = fp_ctx_trace_begin(p->ctx, (fp_stream)p->s_compute, "pipeline_compute", "pipeline", 0, 0);
    if ((st = mark(p, sl, EV_C0, p->s_compute)) != FP_OK) {
        fp_ctx_trace_end(p->ctx, span);
        goto fail;
    }
    {
        unsigned seq0 = fp_error_seq();
        tl_in_callback = p;
        fp_status cs = p->cfg.compute(p->cfg.user, p->cuda ? (fp_stream)p->s_compute : NULL, c);
        tl_in_callback = NULL;
        /* Whatever the callback enqueued must finish before the slot is
         * reused, failed or not. */
        fp_status ms = mark(p, sl, EV_C1, p->s_compute);
        fp_ctx_trace_end(p->ctx, span);
        if (ms == FP_OK) r->last_ev = EV_C1;
        if (cs != FP_OK) {
            r->st = cs;
            snprintf(r->msg, MSG_MAX, "compute failed (%s)%s%s", fp_status_string(cs),
                     fp_error_seq() != seq0 ? ": " : "", fp_error_seq() != seq0 ? fp_last_error() : "");
            return;
        }
        if ((st = ms) != FP_OK) goto fail;
    }

    /* d2h, after the compute */
    if (c->out_bytes) {
        void *dst = c->host_out;
        if (!host_is_pinned(p, c->host_out)) {
            dst = sl->h_out;
            r->out_staged = 1;
        }
        if (p->cuda) {
            cudaError_t e = cudaStreamWaitEvent(p->s_d2h, sl->ev[EV_C1], 0);
            if (e != cudaSuccess) {
                st = fp_cuda_status(e, "cudaStreamWaitEvent (d2h after compute)", __FILE__, __LINE__);
                goto fail;
            }
        }
        span = fp_ctx_trace_begin(p->ctx, (fp_stream)p->s_d2h, "pipeline_d2h", "pipeline", (double)c->out_bytes, 0);
        st = mark(p, sl, EV_D2H0, p->s_d2h);
        if (st == FP_OK && p->cuda) {
            cudaError_t e = cudaMemcpyAsync(dst, sl->d_out, c->out_bytes, cudaMemcpyDeviceToHost, p->s_d2h);
            if (e != cudaSuccess) st = fp_cuda_status(e, "cudaMemcpyAsync (d2h)", __FILE__, __LINE__);
        } else if (st == FP_OK) {
            memcpy(dst, sl->d_out, c->out_bytes);
        }
        if (st == FP_OK) st = mark(p, sl, EV_D2H1, p->s_d2h);
        fp_ctx_trace_end(p->ctx, span);
        if (st != FP_OK) goto fail;
        r->last_ev = EV_D2H1;
    }
    return;
fail:
    r->st = st;
    copy_msg(r->msg, fp_last_error());
}

static void *dispatcher_main(void *arg) {
    fp_pipeline *p = arg;
    if (p->cuda) (void)fp_ctx_activate(p->ctx);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->disp == p->tail && !p->stopping) pthread_cond_wait(&p->cv_disp, &p->mu);
        if (p->disp == p->tail) break; /* stopping and nothing left */
        rec *r = &p->ring[p->disp % p->cap];
        /* A chunk needs a slot unless it is cancelled or the pipeline broke;
         * those can change while it waits for one. */
        while (!(p->disp < p->cancel_upto || p->broken) && p->slots_free == 0)
            pthread_cond_wait(&p->cv_disp, &p->mu);
        r->slot = -1;
        r->last_ev = -1;
        if (p->disp < p->cancel_upto) {
            r->st = FP_ERR_CANCELLED;
            snprintf(r->msg, MSG_MAX, "chunk %llu cancelled before it started", (unsigned long long)r->c.seq);
        } else if (p->broken) {
            r->st = FP_ERR_CUDA;
            snprintf(r->msg, MSG_MAX, "not started: an earlier chunk hit a device error (%.400s)", p->broken_msg);
        } else {
            r->slot = p->next_slot;
            p->next_slot = (p->next_slot + 1) % p->cfg.depth;
            p->slots_free--;
            if (p->first_start_s == 0) p->first_start_s = fp_now_s();
            p->disp_busy = 1;
            pthread_mutex_unlock(&p->mu);
            dispatch_one(p, r);
            pthread_mutex_lock(&p->mu);
            p->disp_busy = 0;
        }
        p->disp++;
        pthread_cond_broadcast(&p->cv_comp);
    }
    p->disp_done = 1;
    pthread_cond_broadcast(&p->cv_comp);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/*  Completion                                                              */
/* ------------------------------------------------------------------------ */

static double ev_ms(fp_pipeline *p, slot *sl, int a, int b) {
    if (!p->cuda) return (sl->t[b] - sl->t[a]) * 1e3;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, sl->ev[a], sl->ev[b]) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return ms;
}

static void *completion_main(void *arg) {
    fp_pipeline *p = arg;
    if (p->cuda) (void)fp_ctx_activate(p->ctx);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->head == p->disp && !(p->disp_done && p->head == p->tail)) pthread_cond_wait(&p->cv_comp, &p->mu);
        if (p->head == p->disp) break; /* the dispatcher is done and everything completed */
        rec *r = &p->ring[p->head % p->cap];
        pthread_mutex_unlock(&p->mu);

        double h2d = 0, comp = 0, d2h = 0;
        double t0 = 0;
        if (r->slot >= 0) {
            slot *sl = &p->slots[r->slot];
            if (r->last_ev >= 0 && p->cuda) {
                cudaError_t e = cudaEventSynchronize(sl->ev[r->last_ev]);
                if (e != cudaSuccess) {
                    fp_cuda_status(e, "cudaEventSynchronize (chunk's last stage)", __FILE__, __LINE__);
                    if (r->st == FP_OK) {
                        r->st = FP_ERR_CUDA;
                        copy_msg(r->msg, fp_last_error());
                    }
                    pthread_mutex_lock(&p->mu);
                    if (!p->broken) {
                        p->broken = 1;
                        copy_msg(p->broken_msg, fp_last_error());
                    }
                    pthread_mutex_unlock(&p->mu);
                }
            }
            t0 = fp_now_s(); /* the completion stage's own work starts here */
            if (r->last_ev >= EV_H2D1) h2d = ev_ms(p, sl, EV_H2D0, EV_H2D1);
            if (r->last_ev >= EV_C1) comp = ev_ms(p, sl, EV_C0, EV_C1);
            if (r->last_ev >= EV_D2H1) d2h = ev_ms(p, sl, EV_D2H0, EV_D2H1);
            if (r->st == FP_OK && r->out_staged) fp_stage_copy(p->unstage_pool, r->c.host_out, sl->h_out, r->c.out_bytes);
        }
        if (t0 == 0) t0 = fp_now_s();
        if (p->cfg.complete) {
            tl_in_callback = p;
            p->cfg.complete(p->cfg.user, &r->c, r->st, r->st == FP_OK ? "" : r->msg);
            tl_in_callback = NULL;
        }
        double t1 = fp_now_s();

        pthread_mutex_lock(&p->mu);
        fp_pipeline_stats *s = &p->stats;
        s->completed++;
        if (r->st == FP_ERR_CANCELLED) s->cancelled++;
        else if (r->st != FP_OK) s->failed++;
        if (r->staged) s->staged++;
        s->stage_ms += r->stage_ms;
        if (r->last_ev >= EV_H2D1) s->bytes_h2d += r->c.in_bytes;
        if (r->last_ev >= EV_D2H1) s->bytes_d2h += r->c.out_bytes;
        s->h2d_ms += h2d;
        s->compute_ms += comp;
        s->d2h_ms += d2h;
        s->complete_ms += (t1 - t0) * 1e3;
        if (r->slot >= 0) {
            p->last_done_s = t1;
            p->slots_free++;
        }
        if (r->st != FP_OK && p->first_fail == FP_OK) {
            p->first_fail = r->st;
            p->first_fail_seq = r->c.seq;
            copy_msg(p->first_fail_msg, r->msg);
        }
        p->bytes_in_flight -= r->c.in_bytes;
        p->head++;
        pthread_cond_broadcast(&p->cv_space);
        pthread_cond_broadcast(&p->cv_disp);
        pthread_cond_broadcast(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/*  Create / destroy                                                        */
/* ------------------------------------------------------------------------ */

static void release(fp_pipeline *p) {
    if (p->slots) {
        for (int i = 0; i < p->cfg.depth; ++i) {
            slot *sl = &p->slots[i];
            if (p->pinned) {
                /* Freed after every copy that used them (the threads are
                 * joined and each chunk's last event waited on), but another
                 * user of a shared allocator must still not get a block
                 * before the copy streams' work is done on the device. */
                if (sl->h_in) {
                    if (p->cuda) (void)fp_alloc_record_stream(p->pinned, sl->h_in, p->s_h2d);
                    fp_alloc_free(p->pinned, sl->h_in);
                }
                if (sl->h_out) {
                    if (p->cuda) (void)fp_alloc_record_stream(p->pinned, sl->h_out, p->s_d2h);
                    fp_alloc_free(p->pinned, sl->h_out);
                }
            }
            fp_mem_free(p->ctx, sl->d_in);
            fp_mem_free(p->ctx, sl->d_out);
            if (p->cuda)
                for (int e = 0; e < EV_N; ++e)
                    if (sl->ev[e]) cudaEventDestroy(sl->ev[e]);
        }
        free(p->slots);
    }
    fp_pinned_pool_destroy(p->own_pool);
    if (p->cuda) {
        if (p->s_h2d) cudaStreamDestroy(p->s_h2d);
        if (p->s_compute) cudaStreamDestroy(p->s_compute);
        if (p->s_d2h) cudaStreamDestroy(p->s_d2h);
    }
    fp_thread_pool_destroy(p->stage_pool);
    fp_thread_pool_destroy(p->unstage_pool);
    free(p->ring);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_space);
    pthread_cond_destroy(&p->cv_disp);
    pthread_cond_destroy(&p->cv_comp);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}

static fp_status create_buffers(fp_pipeline *p) {
    fp_pipeline_config *cfg = &p->cfg;
    if (cfg->pinned) {
        p->pinned = cfg->pinned;
    } else {
        /* A pool of its own; a reserve's segments as large as the largest
         * staging buffer, so that each buffer is cut from one. */
        fp_pinned_config pc;
        fp_pinned_config_default(&pc);
        size_t largest = cfg->max_in_bytes > cfg->max_out_bytes ? cfg->max_in_bytes : cfg->max_out_bytes;
        if (largest > pc.chunk_bytes) pc.chunk_bytes = largest;
        FP_TRY(fp_pinned_pool_create(p->ctx, &pc, &p->own_pool));
        p->pinned = fp_pinned_pool_allocator(p->own_pool);
    }
    p->slots = calloc((size_t)cfg->depth, sizeof *p->slots);
    if (!p->slots) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "pipeline: %d slots", cfg->depth);
    for (int i = 0; i < cfg->depth; ++i) {
        slot *sl = &p->slots[i];
        /* On stream NULL, where a pinned pool's reserve (pinned.h) puts
         * its segments; on release each is recorded on its copy stream, so
         * the allocator hands it out again only once those copies are done. */
        FP_TRY(fp_alloc_alloc(p->pinned, cfg->max_in_bytes, NULL, &sl->h_in));
        if (cfg->max_out_bytes) FP_TRY(fp_alloc_alloc(p->pinned, cfg->max_out_bytes, NULL, &sl->h_out));
        FP_TRY(fp_mem_alloc(p->ctx, cfg->max_in_bytes, &sl->d_in));
        if (cfg->max_out_bytes) FP_TRY(fp_mem_alloc(p->ctx, cfg->max_out_bytes, &sl->d_out));
        if (p->cuda)
            for (int e = 0; e < EV_N; ++e) FP_CUDA_TRY(cudaEventCreate(&sl->ev[e]));
    }
    return FP_OK;
}

fp_status fp_pipeline_create(fp_context *ctx, const fp_pipeline_config *cfg, fp_pipeline **out) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(cfg);
    FP_CHECK_NOT_NULL(out);
    fp_pipeline_config full;
    FP_STRUCT_IN(&cfg, full, PIPELINE_CONFIG_SIZE_FIRST, fp_pipeline_config_default, "fp_pipeline_config");
    FP_CHECK_ARG(cfg->compute != NULL, "fp_pipeline_config.compute is NULL: a pipeline needs a compute callback");
    FP_CHECK_ARG(cfg->depth >= 1 && cfg->depth <= PIPELINE_MAX_DEPTH,
                 "fp_pipeline_config.depth is %d; it must be in [1, %d]", cfg->depth, PIPELINE_MAX_DEPTH);
    FP_CHECK_ARG(cfg->max_in_bytes > 0, "fp_pipeline_config.max_in_bytes is 0: set the largest chunk's size");
    FP_CHECK_ARG(cfg->max_chunks_in_flight >= 0, "fp_pipeline_config.max_chunks_in_flight is %d (< 0)",
                 cfg->max_chunks_in_flight);
    FP_CHECK_ARG(cfg->staging_threads >= 0, "fp_pipeline_config.staging_threads is %d (< 0)", cfg->staging_threads);
    FP_CHECK_ARG(cfg->max_bytes_in_flight == 0 || cfg->max_bytes_in_flight >= cfg->max_in_bytes,
                 "fp_pipeline_config.max_bytes_in_flight (%zu) is below max_in_bytes (%zu): a full-size chunk "
                 "could never be submitted",
                 cfg->max_bytes_in_flight, cfg->max_in_bytes);
    FP_CHECK_ARG(cfg->max_chunks_in_flight <= (1 << 20), "fp_pipeline_config.max_chunks_in_flight is %d (> 2^20)",
                 cfg->max_chunks_in_flight);

    fp_pipeline *p = calloc(1, sizeof *p);
    if (!p) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "pipeline: %zu bytes", sizeof *p);
    p->ctx = ctx;
    p->cuda = fp_context_kind(ctx) == FP_DEVICE_CUDA;
    p->cfg = *cfg;
    p->cfg.struct_size = sizeof p->cfg;
    if (p->cfg.max_chunks_in_flight == 0) p->cfg.max_chunks_in_flight = 4 * p->cfg.depth;
    if (p->cfg.staging_threads == 0) {
        /* One thread's memcpy moved 8.6 GB/s on the H100 VM, 8 threads 41,
         * a PCIe 5 link 55 each way: half the cores per direction, 1 to 8
         * (both directions at once share the host's memory bandwidth). */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long t = cores / 2;
        p->cfg.staging_threads = t < 1 ? 1 : t > 8 ? 8 : (int)t;
    }
    p->cap = (uint64_t)p->cfg.max_chunks_in_flight;
    p->slots_free = p->cfg.depth;
    p->first_fail = FP_OK;
    pthread_mutex_init(&p->mu, NULL);
    int cv_ok = fp_cond_init_monotonic(&p->cv_space) == 0 && fp_cond_init_monotonic(&p->cv_done) == 0;
    pthread_cond_init(&p->cv_disp, NULL);
    pthread_cond_init(&p->cv_comp, NULL);
    fp_status st = cv_ok ? FP_OK : fp_set_error(FP_ERR_INTERNAL, "pipeline: pthread_cond_init failed");
    p->stats.struct_size = sizeof p->stats;
    if (st == FP_OK) {
        p->ring = calloc((size_t)p->cap, sizeof *p->ring);
        if (!p->ring) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "pipeline: ring of %llu chunks",
                                        (unsigned long long)p->cap);
    }
    if (st == FP_OK && p->cfg.staging_threads > 1) st = fp_thread_pool_create(p->cfg.staging_threads, &p->stage_pool);
    if (st == FP_OK && p->cfg.staging_threads > 1 && p->cfg.max_out_bytes)
        st = fp_thread_pool_create(p->cfg.staging_threads, &p->unstage_pool);
    if (st == FP_OK && p->cuda) {
        st = fp_ctx_activate(ctx);
        if (st == FP_OK) {
            cudaError_t e = cudaStreamCreateWithFlags(&p->s_h2d, cudaStreamNonBlocking);
            if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&p->s_compute, cudaStreamNonBlocking);
            if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&p->s_d2h, cudaStreamNonBlocking);
            if (e != cudaSuccess) st = fp_cuda_status(e, "cudaStreamCreateWithFlags", __FILE__, __LINE__);
        }
    }
    if (st == FP_OK) st = create_buffers(p);
    if (st == FP_OK) {
        if (pthread_create(&p->th_disp, NULL, dispatcher_main, p) != 0) {
            st = fp_set_error(FP_ERR_INTERNAL, "pipeline: cannot start the dispatcher thread");
        } else if (pthread_create(&p->th_comp, NULL, completion_main, p) != 0) {
            pthread_mutex_lock(&p->mu);
            p->stopping = 1;
            pthread_cond_broadcast(&p->cv_disp);
            pthread_mutex_unlock(&p->mu);
            pthread_join(p->th_disp, NULL);
            st = fp_set_error(FP_ERR_INTERNAL, "pipeline: cannot start the completion thread");
        } else {
            p->threads_started = 1;
        }
    }
    if (st != FP_OK) {
        fp_error_saved saved;
        fp_error_save(&saved);
        release(p);
        fp_error_restore(&saved);
        return st;
    }
    *out = p;
    return FP_OK;
}

void fp_pipeline_destroy(fp_pipeline *p) {
    if (!p) return;
    if (tl_in_callback == p) {
        fp_set_error(FP_ERR_INVALID_ARGUMENT,
                     "fp_pipeline_destroy called from the pipeline's own callback: refused (it would wait for "
                     "itself); the pipeline stays alive");
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    p->stopping = 1;
    p->cancel_upto = p->tail;
    pthread_cond_broadcast(&p->cv_disp);
    pthread_cond_broadcast(&p->cv_space);
    pthread_mutex_unlock(&p->mu);
    if (p->threads_started) {
        pthread_join(p->th_disp, NULL);
        pthread_join(p->th_comp, NULL);
    }
    release(p);
}

/* ------------------------------------------------------------------------ */
/*  Submit, flush, cancel, close                                            */
/* ------------------------------------------------------------------------ */

fp_status fp_pipeline_submit(fp_pipeline *p, const void *host_in, size_t in_bytes, void *host_out,
                             size_t out_bytes, void *tag, int64_t timeout_ms, uint64_t *seq) {
    FP_CHECK_NOT_NULL(p);
    FP_CHECK_NOT_NULL(host_in);
    FP_CHECK_ARG(in_bytes > 0 && in_bytes <= p->cfg.max_in_bytes,
                 "in_bytes is %zu; it must be in [1, max_in_bytes = %zu]", in_bytes, p->cfg.max_in_bytes);
    FP_CHECK_ARG(out_bytes <= p->cfg.max_out_bytes, "out_bytes is %zu, above max_out_bytes = %zu", out_bytes,
                 p->cfg.max_out_bytes);
    FP_CHECK_ARG(out_bytes == 0 || host_out != NULL, "host_out is NULL with out_bytes = %zu", out_bytes);
    FP_CHECK_ARG(!(tl_in_callback == p && timeout_ms != 0),
                 "a blocking fp_pipeline_submit from the pipeline's own callback could wait for itself: pass "
                 "timeout_ms = 0 there");
    size_t byte_cap = p->cfg.max_bytes_in_flight;
    struct timespec dl;
    if (timeout_ms > 0) fp_deadline_after_ms(&dl, timeout_ms);
    double t0 = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (p->closed) {
            pthread_mutex_unlock(&p->mu);
            return fp_set_error(FP_ERR_SHUT_DOWN, "pipeline is closed: no more submits");
        }
        int room = p->tail - p->head < p->cap &&
                   (byte_cap == 0 || p->bytes_in_flight + in_bytes <= byte_cap);
        if (room) break;
        if (timeout_ms == 0) {
            pthread_mutex_unlock(&p->mu);
            return fp_set_error(FP_ERR_QUEUE_FULL, "pipeline full: %llu chunks, %zu bytes in flight (limits %d, %zu)",
                                (unsigned long long)(p->tail - p->head), p->bytes_in_flight,
                                p->cfg.max_chunks_in_flight, byte_cap);
        }
        if (t0 == 0) t0 = fp_now_s();
        if (!cond_wait(&p->cv_space, &p->mu, timeout_ms, &dl)) {
            p->stats.submit_wait_ms += (fp_now_s() - t0) * 1e3;
            pthread_mutex_unlock(&p->mu);
            return fp_set_error(FP_ERR_TIMEOUT, "pipeline still full after %lld ms (%llu chunks, %zu bytes in flight)",
                                (long long)timeout_ms, (unsigned long long)(p->tail - p->head),
                                p->bytes_in_flight);
        }
    }
    if (t0 != 0) p->stats.submit_wait_ms += (fp_now_s() - t0) * 1e3;
    rec *r = &p->ring[p->tail % p->cap];
    memset(r, 0, sizeof *r);
    r->c.seq = p->tail;
    r->c.host_in = host_in;
    r->c.in_bytes = in_bytes;
    r->c.host_out = out_bytes ? host_out : NULL;
    r->c.out_bytes = out_bytes;
    r->c.tag = tag;
    r->slot = -1;
    r->last_ev = -1;
    r->st = FP_OK;
    if (seq) *seq = p->tail;
    p->tail++;
    p->bytes_in_flight += in_bytes;
    p->stats.submitted++;
    if (p->tail - p->head > p->stats.max_in_flight) p->stats.max_in_flight = p->tail - p->head;
    pthread_cond_broadcast(&p->cv_disp);
    pthread_mutex_unlock(&p->mu);
    return FP_OK;
}

fp_status fp_pipeline_flush(fp_pipeline *p, int64_t timeout_ms) {
    FP_CHECK_NOT_NULL(p);
    FP_CHECK_ARG(tl_in_callback != p,
                 "fp_pipeline_flush called from the pipeline's own callback: it would wait for itself");
    struct timespec dl;
    if (timeout_ms > 0) fp_deadline_after_ms(&dl, timeout_ms);
    pthread_mutex_lock(&p->mu);
    uint64_t target = p->tail;
    while (p->head < target) {
        if (timeout_ms == 0 || !cond_wait(&p->cv_done, &p->mu, timeout_ms, &dl)) {
            uint64_t left = target - p->head;
            pthread_mutex_unlock(&p->mu);
            return fp_set_error(FP_ERR_TIMEOUT, "flush: %llu chunks still in flight after %lld ms",
                                (unsigned long long)left, (long long)timeout_ms);
        }
    }
    fp_status st = p->first_fail;
    char msg[MSG_MAX];
    uint64_t fseq = p->first_fail_seq;
    copy_msg(msg, p->first_fail_msg);
    p->first_fail = FP_OK;
    pthread_mutex_unlock(&p->mu);
    if (st != FP_OK)
        return fp_set_error(st, "chunk %llu failed (%s): %s", (unsigned long long)fseq, fp_status_string(st), msg);
    return FP_OK;
}

fp_status fp_pipeline_cancel(fp_pipeline *p, uint64_t *cancelled) {
    FP_CHECK_NOT_NULL(p);
    pthread_mutex_lock(&p->mu);
    uint64_t from = p->disp + (uint64_t)p->disp_busy;
    if (p->cancel_upto > from) from = p->cancel_upto;
    uint64_t n = p->tail > from ? p->tail - from : 0;
    p->cancel_upto = p->tail;
    pthread_cond_broadcast(&p->cv_disp);
    pthread_mutex_unlock(&p->mu);
    if (cancelled) *cancelled = n;
    return FP_OK;
}

fp_status fp_pipeline_close(fp_pipeline *p) {
    FP_CHECK_NOT_NULL(p);
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    pthread_cond_broadcast(&p->cv_space);
    pthread_mutex_unlock(&p->mu);
    return FP_OK;
}

fp_stream fp_pipeline_compute_stream(const fp_pipeline *p) {
    return p && p->cuda ? (fp_stream)p->s_compute : NULL;
}

/* ------------------------------------------------------------------------ */
/*  Statistics                                                              */
/* ------------------------------------------------------------------------ */

fp_status fp_pipeline_get_stats(fp_pipeline *p, fp_pipeline_stats *out) {
    FP_CHECK_NOT_NULL(p);
    FP_TRY(fp_struct_size_check(out ? out->struct_size : 0, PIPELINE_STATS_SIZE_FIRST, sizeof(fp_pipeline_stats),
                                "fp_pipeline_stats"));
    pthread_mutex_lock(&p->mu);
    fp_pipeline_stats s = p->stats;
    double wall = p->first_start_s > 0 && p->last_done_s > p->first_start_s
                      ? (p->last_done_s - p->first_start_s) * 1e3 : 0;
    pthread_mutex_unlock(&p->mu);
    s.struct_size = sizeof s;
    s.wall_ms = wall;
    s.h2d_gbps = s.h2d_ms > 0 ? (double)s.bytes_h2d / (s.h2d_ms * 1e6) : 0;
    s.d2h_gbps = s.d2h_ms > 0 ? (double)s.bytes_d2h / (s.d2h_ms * 1e6) : 0;
    double busy = s.stage_ms + s.h2d_ms + s.compute_ms + s.d2h_ms;
    s.overlap_efficiency = wall > 0 ? busy / wall : 0;
    s.compute_idle_ms = wall > s.compute_ms ? wall - s.compute_ms : 0;
    return fp_struct_write(out, &s, PIPELINE_STATS_SIZE_FIRST, sizeof s, "fp_pipeline_stats");
}

fp_status fp_pipeline_reset_stats(fp_pipeline *p) {
    FP_CHECK_NOT_NULL(p);
    pthread_mutex_lock(&p->mu);
    memset(&p->stats, 0, sizeof p->stats);
    p->stats.struct_size = sizeof p->stats;
    p->first_start_s = 0;
    p->last_done_s = 0;
    pthread_mutex_unlock(&p->mu);
    return FP_OK;
}
