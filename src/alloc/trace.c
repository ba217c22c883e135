/* Allocation traces: a transformer-training-like generator, conversion of
 * event-ring records into a trace, and replay through a caching allocator or
 * straight through an upstream (the A/B baseline). */
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "internal.h"

/* ======================================================================== */
/*  Trace building                                                          */
/* ======================================================================== */

typedef struct builder {
    fp_alloc_trace_op *ops;
    size_t n, cap;
    uint32_t *free_slots;
    size_t n_free, cap_free;
    uint32_t next_slot;
    uint32_t max_stream;
    int failed;
} builder;

/* Room for one more element in a growing array `arr` of *cap elements of elt
 * bytes holding n (first size: init): returns the array to use (arr, or its
 * reallocation with *cap updated), or NULL with b marked failed when memory
 * runs out (arr is then unchanged and still owned by the caller). */
static void *grow(builder *b, void *arr, size_t *cap, size_t n, size_t elt, size_t init) {
    if (b->failed) return NULL;
    if (n < *cap) return arr;
    size_t nc = *cap ? *cap * 2 : init;
    void *na = realloc(arr, nc * elt);
    if (!na) {
        b->failed = 1;
        return NULL;
    }
    *cap = nc;
    return na;
}

static void push_op(builder *b, uint8_t kind, uint8_t stream, uint32_t slot, uint64_t size) {
    fp_alloc_trace_op *ops = grow(b, b->ops, &b->cap, b->n, sizeof *ops, 4096);
    if (!ops) return;
    b->ops = ops;
    fp_alloc_trace_op op = {kind, stream, 0, slot, size};
    b->ops[b->n++] = op;
    if (stream > b->max_stream) b->max_stream = stream;
}

static uint32_t b_alloc(builder *b, uint64_t size, int stream) {
    uint32_t slot = b->n_free ? b->free_slots[--b->n_free] : b->next_slot++;
    push_op(b, FP_ALLOC_TRACE_ALLOC, (uint8_t)stream, slot, size ? size : 1);
    return slot;
}

static void b_free(builder *b, uint32_t slot) {
    push_op(b, FP_ALLOC_TRACE_FREE, 0, slot, 0);
    uint32_t *fs = grow(b, b->free_slots, &b->cap_free, b->n_free, sizeof *fs, 256);
    if (!fs) return;
    b->free_slots = fs;
    b->free_slots[b->n_free++] = slot;
}

static void b_record(builder *b, uint32_t slot, int stream) {
    push_op(b, FP_ALLOC_TRACE_RECORD_STREAM, (uint8_t)stream, slot, 0);
}

static fp_status b_finish(builder *b, fp_alloc_trace **out) {
    free(b->free_slots);
    fp_alloc_trace *t = b->failed ? NULL : calloc(1, sizeof *t);
    if (!t) {
        free(b->ops);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace of %zu ops", b->n);
    }
    t->ops = b->ops;
    t->n_ops = b->n;
    t->n_slots = b->next_slot;
    t->n_streams = b->n ? b->max_stream + 1 : 0;
    *out = t;
    return FP_OK;
}

void fp_alloc_trace_destroy(fp_alloc_trace *t) {
    if (!t) return;
    free(t->ops);
    free(t);
}

/* ======================================================================== */
/*  Transformer-like generator                                              */
/* ======================================================================== */

/* The first published size of fp_alloc_trace_config (0.2): it stays when fields are
 * appended (src/core/struct_size.c). */
#define ALLOC_TRACE_CONFIG_SIZE_FIRST sizeof(fp_alloc_trace_config)

fp_status fp_alloc_trace_config_default_sized(fp_alloc_trace_config *out, size_t struct_size) {
    fp_alloc_trace_config defaults, *cfg = &defaults;
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->layers = 12;
    cfg->steps = 4;
    cfg->streams = 3;
    cfg->batch = 4;
    cfg->hidden = 768;
    cfg->heads = 12;
    cfg->max_seq = 512;
    cfg->random_free_fraction = 0.3;
    cfg->seed = 1;
    return fp_struct_init(out, struct_size, cfg, ALLOC_TRACE_CONFIG_SIZE_FIRST, sizeof *cfg, "fp_alloc_trace_config");
}

/* The first published size of fp_alloc_replay_result (0.2), an output the
 * caller sizes: it stays when fields are appended. */
#define REPLAY_RESULT_SIZE_FIRST sizeof(fp_alloc_replay_result)

void(fp_alloc_trace_config_default)(fp_alloc_trace_config *cfg) {
    if (cfg) (void)fp_alloc_trace_config_default_sized(cfg, ALLOC_TRACE_CONFIG_SIZE_FIRST);
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* Temporaries waiting to be freed out of order. */
typedef struct window {
    uint32_t slots[64];
    int n;
} window;

static void window_flush_random(builder *b, window *w, uint64_t *rng, int keep) {
    while (w->n > keep) {
        int i = (int)(rng_next(rng) % (uint64_t)w->n);
        b_free(b, w->slots[i]);
        w->slots[i] = w->slots[--w->n];
    }
}

/* A temporary: freed at once, or parked and freed later in random order. */
static void temp(builder *b, window *w, uint64_t *rng, double frac, uint64_t size, int stream) {
    uint32_t s = b_alloc(b, size, stream);
    if (rng_unit(rng) < frac && w->n < 64) {
        w->slots[w->n++] = s;
        if (w->n > 6) window_flush_random(b, w, rng, 3);
    } else {
        b_free(b, s);
    }
}

fp_status fp_alloc_trace_generate(const fp_alloc_trace_config *cfg, fp_alloc_trace **out) {
    FP_CHECK_NOT_NULL(out);
    fp_alloc_trace_config def;
    if (!cfg) {
        fp_alloc_trace_config_default(&def);
        cfg = &def;
    }
    fp_alloc_trace_config full;
    FP_STRUCT_IN(&cfg, full, ALLOC_TRACE_CONFIG_SIZE_FIRST, fp_alloc_trace_config_default,
                 "fp_alloc_trace_config (cfg)");
    FP_CHECK_ARG(cfg->layers >= 1 && cfg->layers <= 1024, "cfg->layers (%d) must be in [1, 1024]", cfg->layers);
    FP_CHECK_ARG(cfg->steps >= 1 && cfg->steps <= 100000, "cfg->steps (%d) must be in [1, 100000]", cfg->steps);
    FP_CHECK_ARG(cfg->streams >= 1 && cfg->streams <= 8, "cfg->streams (%d) must be in [1, 8]", cfg->streams);
    FP_CHECK_ARG(cfg->batch >= 1 && cfg->batch <= 4096, "cfg->batch (%d) must be in [1, 4096]", cfg->batch);
    FP_CHECK_ARG(cfg->hidden >= 8 && cfg->hidden <= 65536, "cfg->hidden (%d) must be in [8, 65536]", cfg->hidden);
    FP_CHECK_ARG(cfg->heads >= 1 && cfg->heads <= cfg->hidden, "cfg->heads (%d) must be in [1, hidden]", cfg->heads);
    FP_CHECK_ARG(cfg->max_seq >= 16 && cfg->max_seq <= 1 << 20, "cfg->max_seq (%d) must be in [16, 2^20]", cfg->max_seq);
    FP_CHECK_ARG(cfg->random_free_fraction >= 0 && cfg->random_free_fraction <= 1,
                 "cfg->random_free_fraction (%g) must be in [0, 1]", cfg->random_free_fraction);

    builder b;
    memset(&b, 0, sizeof b);
    uint64_t rng = cfg->seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
    const int L = cfg->layers, S = cfg->streams, H = cfg->heads;
    const uint64_t B = (uint64_t)cfg->batch, C = (uint64_t)cfg->hidden, V = 16384;
    const int comm = S > 1 ? 1 : 0, data = S > 2 ? 2 : 0;
    const double frac = cfg->random_free_fraction;
    enum { N_PARAM = 12 };
    /* Parameter shapes of one block (elements): qkv w/b, proj w/b, fc1 w/b,
     * fc2 w/b, ln1 w/b, ln2 w/b; bf16. */
    const uint64_t pe[N_PARAM] = {3 * C * C, 3 * C, C * C, C, 4 * C * C, 4 * C,
                                  4 * C * C, C, C, C, C, C};
    uint32_t *weights = malloc(sizeof(uint32_t) * (size_t)(L * N_PARAM + 1));
    uint32_t *grads = malloc(sizeof(uint32_t) * (size_t)(L * N_PARAM + 1));
    /* Per layer: 12 saved activations (room for 16). */
    uint32_t *saved = malloc(sizeof(uint32_t) * (size_t)L * 16);
    if (!weights || !grads || !saved) {
        free(weights);
        free(grads);
        free(saved);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace generator scratch");
    }
    weights[L * N_PARAM] = b_alloc(&b, V * C * 2, 0); /* embedding */
    for (int l = 0; l < L; ++l)
        for (int p = 0; p < N_PARAM; ++p) weights[l * N_PARAM + p] = b_alloc(&b, pe[p] * 2, 0);
    int have_grads = 0;
    window w = {{0}, 0};

    for (int step = 0; step < cfg->steps; ++step) {
        /* Sequence length varies per step, in multiples of 16. */
        uint64_t lo = (uint64_t)cfg->max_seq / 4, span = (uint64_t)cfg->max_seq - lo + 1;
        uint64_t T = (lo + rng_next(&rng) % span + 15) / 16 * 16;
        uint64_t BT = B * T, BTC2 = BT * C * 2;
        /* Inputs on the data stream, used on the compute stream. */
        uint32_t tokens = b_alloc(&b, BT * 4, data), targets = b_alloc(&b, BT * 4, data);
        if (data != 0) {
            b_record(&b, tokens, 0);
            b_record(&b, targets, 0);
        }
        uint32_t x = b_alloc(&b, BTC2, 0); /* embeddings out */
        for (int l = 0; l < L; ++l) {
            uint32_t *sv = saved + l * 16;
            int k = 0;
            sv[k++] = b_alloc(&b, BTC2, 0);          /* ln1 out */
            sv[k++] = b_alloc(&b, BT * 4, 0);        /* ln1 mean */
            sv[k++] = b_alloc(&b, BT * 4, 0);        /* ln1 rstd */
            sv[k++] = b_alloc(&b, BT * 3 * C * 2, 0); /* qkv */
            temp(&b, &w, &rng, frac, (uint64_t)H * T * 64 + (rng_next(&rng) % 8) * 4096, 0);
            sv[k++] = b_alloc(&b, BTC2, 0);          /* attention out */
            sv[k++] = b_alloc(&b, B * (uint64_t)H * T * 4, 0); /* logsumexp */
            uint32_t proj = b_alloc(&b, BTC2, 0);
            sv[k++] = b_alloc(&b, BTC2, 0);          /* residual 1 */
            b_free(&b, proj);
            sv[k++] = b_alloc(&b, BTC2, 0);          /* ln2 out */
            sv[k++] = b_alloc(&b, BT * 4, 0);
            sv[k++] = b_alloc(&b, BT * 4, 0);
            sv[k++] = b_alloc(&b, BT * 4 * C * 2, 0); /* fc1 */
            sv[k++] = b_alloc(&b, BT * 4 * C * 2, 0); /* gelu */
            temp(&b, &w, &rng, frac, 1 << 20, 0);    /* GEMM workspace */
            uint32_t fc2 = b_alloc(&b, BTC2, 0);
            b_free(&b, x);
            x = b_alloc(&b, BTC2, 0);                /* residual 2 = next input */
            b_free(&b, fc2);
        }
        /* Head and loss. */
        uint32_t lnf = b_alloc(&b, BTC2, 0);
        uint32_t logits = b_alloc(&b, BT * V * 2, 0);
        uint32_t losses = b_alloc(&b, BT * 4, 0);
        uint32_t dlogits = b_alloc(&b, BT * V * 2, 0);
        b_free(&b, logits);
        uint32_t dx = b_alloc(&b, BTC2, 0);
        b_free(&b, dlogits);
        b_free(&b, lnf);
        b_free(&b, losses);
        b_free(&b, x);
        if (!have_grads) {
            grads[L * N_PARAM] = b_alloc(&b, V * C * 2, 0);
        }
        uint32_t bucket_prev = UINT32_MAX;
        for (int l = L - 1; l >= 0; --l) {
            if (!have_grads)
                for (int p = 0; p < N_PARAM; ++p) grads[l * N_PARAM + p] = b_alloc(&b, pe[p] * 2, 0);
            uint32_t *sv = saved + l * 16;
            /* Backward pops the saved activations last-in first-out. */
            uint32_t dfc1 = b_alloc(&b, BT * 4 * C * 2, 0);
            b_free(&b, sv[11]);
            b_free(&b, sv[10]);
            uint32_t dln2 = b_alloc(&b, BTC2, 0);
            b_free(&b, dfc1);
            temp(&b, &w, &rng, frac, 1 << 20, 0);
            b_free(&b, sv[9]);
            b_free(&b, sv[8]);
            b_free(&b, sv[7]);
            uint32_t dres = b_alloc(&b, BTC2, 0);
            b_free(&b, dln2);
            b_free(&b, sv[6]);
            uint32_t dqkv = b_alloc(&b, BT * 3 * C * 2, 0);
            temp(&b, &w, &rng, frac, (uint64_t)H * T * 64 + (rng_next(&rng) % 8) * 4096, 0);
            b_free(&b, sv[5]);
            b_free(&b, sv[4]);
            b_free(&b, sv[3]);
            uint32_t dln1 = b_alloc(&b, BTC2, 0);
            b_free(&b, dqkv);
            b_free(&b, sv[2]);
            b_free(&b, sv[1]);
            b_free(&b, sv[0]);
            b_free(&b, dx);
            dx = b_alloc(&b, BTC2, 0);
            b_free(&b, dres);
            b_free(&b, dln1);
            /* Every two layers a flattened gradient bucket goes to the
             * communication stream (all-reduce) and its scratch lives there. */
            if (l % 2 == 0) {
                uint64_t bytes = 0;
                for (int p = 0; p < N_PARAM; ++p) bytes += pe[p] * 2 * 2;
                uint32_t bucket = b_alloc(&b, bytes, 0);
                if (comm != 0) b_record(&b, bucket, comm);
                temp(&b, &w, &rng, 0.0, 4 << 20, comm);
                if (bucket_prev != UINT32_MAX) b_free(&b, bucket_prev);
                bucket_prev = bucket;
            }
        }
        if (bucket_prev != UINT32_MAX) b_free(&b, bucket_prev);
        b_free(&b, dx);
        have_grads = 1;
        window_flush_random(&b, &w, &rng, 0);
        /* Optimizer: an fp32 temporary per parameter tensor; side streams
         * (beyond data) take a share. */
        for (int l = 0; l < L; ++l)
            for (int p = 0; p < N_PARAM; ++p) {
                int s = S > 3 ? 3 + (int)(rng_next(&rng) % (uint64_t)(S - 3)) : 0;
                if (p % 3 != 0) s = 0;
                uint32_t tmp = b_alloc(&b, pe[p] * 4, s);
                b_free(&b, tmp);
            }
        b_free(&b, tokens);
        b_free(&b, targets);
    }
    for (int i = 0; i <= L * N_PARAM; ++i) b_free(&b, weights[i]);
    if (have_grads)
        for (int i = 0; i <= L * N_PARAM; ++i) b_free(&b, grads[i]);
    free(weights);
    free(grads);
    free(saved);
    return b_finish(&b, out);
}

/* ======================================================================== */
/*  From the event ring                                                     */
/* ======================================================================== */

fp_status fp_alloc_trace_from_events_sized(const fp_alloc_event *events, size_t event_size, size_t n,
                                          fp_alloc_trace **out) {
    FP_CHECK_NOT_NULL(out);
    FP_TRY(fp_struct_size_check(event_size, FP_ALLOC_EVENT_SIZE_0_2, sizeof *events, "fp_alloc_event (event_size)"));
    FP_CHECK_ARG(events || n == 0, "argument 'events' is NULL with n %zu", n);
    /* No array holds more; it also keeps 2 * n and the table size below
     * from wrapping (the doubling loop reached 0 and spun forever). */
    FP_CHECK_ARG(n <= SIZE_MAX / event_size, "argument 'n' (%zu) is more events than memory can hold", n);
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    uintptr_t *keys = calloc(cap, sizeof *keys);
    uint32_t *vals = malloc(cap * sizeof *vals);
    builder b;
    memset(&b, 0, sizeof b);
    fp_stream streams[256];
    int n_streams = 0;
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace conversion of %zu events", n);
    }
    fp_status st = FP_OK;
    for (size_t i = 0; i < n && st == FP_OK; ++i) {
        /* the fields read here are in every layout (0.2's prefix) */
        const fp_alloc_event *e = (const fp_alloc_event *)((const char *)events + i * event_size);
        if (e->kind != FP_ALLOC_EV_ALLOC && e->kind != FP_ALLOC_EV_FREE &&
            e->kind != FP_ALLOC_EV_RECORD_STREAM)
            continue;
        /* Keys are never removed (a freed pointer keeps its cell with slot
         * UINT32_MAX), so linear probing needs no tombstones. */
        size_t h = (size_t)(((uint64_t)e->ptr * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
        while (keys[h] && keys[h] != e->ptr) h = (h + 1) & (cap - 1);
        int sidx = 0;
        if (e->kind != FP_ALLOC_EV_FREE) {
            while (sidx < n_streams && streams[sidx] != e->stream) sidx++;
            if (sidx == n_streams) {
                if (n_streams == 256) {
                    st = fp_set_error(FP_ERR_UNSUPPORTED, "trace from events: more than 256 streams");
                    break;
                }
                streams[n_streams++] = e->stream;
            }
        }
        if (e->kind == FP_ALLOC_EV_ALLOC) {
            if (keys[h] && vals[h] != UINT32_MAX) b_free(&b, vals[h]); /* missed free */
            keys[h] = e->ptr ? e->ptr : 1;
            vals[h] = b_alloc(&b, e->size, sidx);
        } else if (keys[h] && vals[h] != UINT32_MAX) {
            if (e->kind == FP_ALLOC_EV_FREE) {
                b_free(&b, vals[h]);
                vals[h] = UINT32_MAX;
            } else {
                b_record(&b, vals[h], sidx);
            }
        }
    }
    for (size_t h = 0; h < cap && st == FP_OK; ++h)
        if (keys[h] && vals[h] != UINT32_MAX) b_free(&b, vals[h]);
    free(keys);
    free(vals);
    if (st != FP_OK) {
        free(b.ops);
        free(b.free_slots);
        return st;
    }
    return b_finish(&b, out);
}

fp_status(fp_alloc_trace_from_events)(const fp_alloc_event *events, size_t n, fp_alloc_trace **out) {
    return fp_alloc_trace_from_events_sized(events, FP_ALLOC_EVENT_SIZE_0_2, n, out);
}

/* ======================================================================== */
/*  Replay                                                                  */
/* ======================================================================== */

static fp_status check_trace(const fp_alloc_trace *t) {
    FP_CHECK_ARG(t->ops || t->n_ops == 0, "trace has no ops array");
    FP_CHECK_ARG(t->n_streams <= 256, "trace->n_streams (%u) > 256", t->n_streams);
    for (size_t i = 0; i < t->n_ops; ++i) {
        const fp_alloc_trace_op *op = &t->ops[i];
        FP_CHECK_ARG(op->kind <= FP_ALLOC_TRACE_RECORD_STREAM, "trace op %zu: bad kind %u", i, op->kind);
        FP_CHECK_ARG(op->slot < t->n_slots, "trace op %zu: slot %u >= n_slots %u", i, op->slot, t->n_slots);
        FP_CHECK_ARG(op->stream < t->n_streams || op->kind == FP_ALLOC_TRACE_FREE,
                     "trace op %zu: stream %u >= n_streams %u", i, op->stream, t->n_streams);
    }
    return FP_OK;
}

typedef struct replay_state {
    void **ptrs;
    size_t *sizes;
    double *alat, *flat;
    size_t na, nf;
    size_t live, peak_live;
} replay_state;

static void replay_state_free(replay_state *r) {
    free(r->ptrs);
    free(r->sizes);
    free(r->alat);
    free(r->flat);
}

static fp_status replay_state_init(replay_state *r, const fp_alloc_trace *t, int time_ops) {
    memset(r, 0, sizeof *r);
    size_t slots = t->n_slots ? t->n_slots : 1;
    r->ptrs = calloc(slots, sizeof *r->ptrs);
    r->sizes = calloc(slots, sizeof *r->sizes);
    if (time_ops) {
        r->alat = malloc((t->n_ops + 1) * sizeof(double));
        r->flat = malloc((t->n_ops + 1) * sizeof(double));
    }
    if (!r->ptrs || !r->sizes || (time_ops && (!r->alat || !r->flat))) {
        replay_state_free(r);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "replay state for %zu ops", t->n_ops);
    }
    return FP_OK;
}

static fp_status replay_finish(replay_state *r, fp_alloc_replay_result *out) {
    fp_status st = FP_OK;
    if (r->na) st = fp_stats_compute(r->alat, (int)r->na, &out->alloc_latency);
    if (st == FP_OK && r->nf) st = fp_stats_compute(r->flat, (int)r->nf, &out->free_latency);
    out->peak_requested = r->peak_live;
    return st;
}

fp_status fp_alloc_trace_replay(fp_allocator *a, const fp_alloc_trace *t, const fp_stream *streams,
                                int time_ops, fp_alloc_replay_result *out) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(t);
    FP_CHECK_NOT_NULL(out);
    FP_TRY(fp_struct_size_check(out->struct_size, REPLAY_RESULT_SIZE_FIRST, sizeof *out, "fp_alloc_replay_result (out)"));
    FP_TRY(check_trace(t));
    replay_state r;
    FP_TRY(replay_state_init(&r, t, time_ops));
    fp_alloc_stats s0, s1;
    s0.struct_size = s1.struct_size = sizeof s0;
    fp_status st = fp_alloc_reset_peak(a);
    if (st == FP_OK) st = fp_alloc_get_stats(a, &s0);
    double t_start = fp_now_s();
    for (size_t i = 0; i < t->n_ops && st == FP_OK; ++i) {
        const fp_alloc_trace_op *op = &t->ops[i];
        fp_stream s = streams ? streams[op->stream] : (fp_stream)(uintptr_t)(op->stream + 1);
        if (op->kind == FP_ALLOC_TRACE_ALLOC) {
            if (r.ptrs[op->slot]) {
                st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "trace op %zu: slot %u is already live", i, op->slot);
                break;
            }
            double t0 = time_ops ? fp_now_s() : 0;
            st = fp_alloc_alloc(a, (size_t)op->size, s, &r.ptrs[op->slot]);
            if (time_ops) r.alat[r.na++] = (fp_now_s() - t0) * 1e3;
            r.sizes[op->slot] = (size_t)op->size;
            r.live += (size_t)op->size;
            if (r.live > r.peak_live) r.peak_live = r.live;
        } else if (op->kind == FP_ALLOC_TRACE_FREE) {
            if (!r.ptrs[op->slot]) continue;
            double t0 = time_ops ? fp_now_s() : 0;
            st = fp_alloc_free(a, r.ptrs[op->slot]);
            if (time_ops) r.flat[r.nf++] = (fp_now_s() - t0) * 1e3;
            r.ptrs[op->slot] = NULL;
            r.live -= r.sizes[op->slot];
        } else if (r.ptrs[op->slot]) {
            st = fp_alloc_record_stream(a, r.ptrs[op->slot], s);
        }
    }
    /* The result is built aside and copied on success: a failed replay
     * leaves *out untouched. */
    fp_alloc_replay_result res = *out;
    res.total_ms = (fp_now_s() - t_start) * 1e3;
    for (uint32_t k = 0; k < t->n_slots; ++k)
        if (r.ptrs[k]) (void)fp_alloc_free(a, r.ptrs[k]);
    if (st == FP_OK) st = fp_alloc_get_stats(a, &s1);
    if (st == FP_OK) {
        res.upstream_allocs = s1.upstream_allocs - s0.upstream_allocs;
        res.upstream_frees = s1.upstream_frees - s0.upstream_frees;
        res.peak_allocated = (size_t)s1.allocated_bytes.peak;
        res.peak_reserved = (size_t)s1.reserved_bytes.peak;
        st = replay_finish(&r, &res);
    }
    if (st == FP_OK) st = fp_struct_write(out, &res, REPLAY_RESULT_SIZE_FIRST, sizeof res, "fp_alloc_replay_result (out)");
    replay_state_free(&r);
    return st;
}

fp_status fp_alloc_trace_replay_direct_sized(const fp_alloc_upstream *user_up, size_t upstream_size,
                                             const fp_alloc_trace *t, int time_ops, fp_alloc_replay_result *out) {
    FP_CHECK_ARG(user_up != NULL, "argument 'up' is NULL");
    fp_alloc_upstream up_full;
    FP_TRY(fp_table_read(&up_full, user_up, upstream_size, ALLOC_UPSTREAM_SIZE_FIRST, sizeof up_full,
                         "fp_alloc_upstream (upstream_size)"));
    const fp_alloc_upstream *up = &up_full;
    FP_CHECK_NOT_NULL(t);
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(up->alloc && up->free, "upstream->alloc and upstream->free are required");
    FP_TRY(fp_struct_size_check(out->struct_size, REPLAY_RESULT_SIZE_FIRST, sizeof *out, "fp_alloc_replay_result (out)"));
    FP_TRY(check_trace(t));
    replay_state r;
    FP_TRY(replay_state_init(&r, t, time_ops));
    fp_status st = FP_OK;
    uint64_t allocs = 0, frees = 0;
    double t_start = fp_now_s();
    for (size_t i = 0; i < t->n_ops && st == FP_OK; ++i) {
        const fp_alloc_trace_op *op = &t->ops[i];
        if (op->kind == FP_ALLOC_TRACE_ALLOC) {
            if (r.ptrs[op->slot]) {
                st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "trace op %zu: slot %u is already live", i, op->slot);
                break;
            }
            double t0 = time_ops ? fp_now_s() : 0;
            const unsigned seq = fp_error_seq(); /* a caller's upstream cannot set a message: see below */
            st = up->alloc(up->opaque, (size_t)op->size, &r.ptrs[op->slot]);
            if (time_ops) r.alat[r.na++] = (fp_now_s() - t0) * 1e3;
            if (st == FP_OK && !r.ptrs[op->slot])
                st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace op %zu: upstream alloc of %llu bytes returned FP_OK "
                                  "and no memory", i, (unsigned long long)op->size);
            if (st != FP_OK) {
                r.ptrs[op->slot] = NULL;
                if ((int)st < FP_OK || (int)st > FP_ERR_INTERNAL)
                    st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "trace op %zu: upstream alloc returned %d, not an "
                                      "fp_status", i, (int)st);
                else if (fp_error_seq() == seq)
                    fp_set_error(st, "trace op %zu: upstream allocation of %llu bytes failed: %s", i,
                                 (unsigned long long)op->size, fp_status_string(st));
                break;
            }
            allocs++;
            r.sizes[op->slot] = (size_t)op->size;
            r.live += (size_t)op->size;
            if (r.live > r.peak_live) r.peak_live = r.live;
        } else if (op->kind == FP_ALLOC_TRACE_FREE) {
            if (!r.ptrs[op->slot]) continue;
            double t0 = time_ops ? fp_now_s() : 0;
            up->free(up->opaque, r.ptrs[op->slot], r.sizes[op->slot]);
            if (time_ops) r.flat[r.nf++] = (fp_now_s() - t0) * 1e3;
            frees++;
            r.ptrs[op->slot] = NULL;
            r.live -= r.sizes[op->slot];
        }
    }
    fp_alloc_replay_result res = *out; /* copied on success only */
    res.total_ms = (fp_now_s() - t_start) * 1e3;
    for (uint32_t k = 0; k < t->n_slots; ++k)
        if (r.ptrs[k]) {
            up->free(up->opaque, r.ptrs[k], r.sizes[k]);
            frees++;
        }
    res.upstream_allocs = allocs;
    res.upstream_frees = frees;
    if (st == FP_OK) {
        st = replay_finish(&r, &res);
        res.peak_allocated = r.peak_live;
        res.peak_reserved = r.peak_live;
    }
    if (st == FP_OK) st = fp_struct_write(out, &res, REPLAY_RESULT_SIZE_FIRST, sizeof res, "fp_alloc_replay_result (out)");
    replay_state_free(&r);
    return st;
}

fp_status(fp_alloc_trace_replay_direct)(const fp_alloc_upstream *up, const fp_alloc_trace *t, int time_ops,
                                        fp_alloc_replay_result *out) {
    return fp_alloc_trace_replay_direct_sized(up, ALLOC_UPSTREAM_SIZE_FIRST, t, time_ops, out);
}
