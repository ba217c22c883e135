/* The caching allocator policy: size rounding, small/large pools, best fit
 * over an ordered set keyed by (stream, size, address), split, coalesce,
 * split limits, stream-ordered reuse through event ops, caps, garbage
 * collection, the OOM retry ladder, statistics, snapshot, event ring and
 * private pools. Host-only code: the upstream and the event ops are the only
 * ways out, so the same code runs on device, pinned and host memory (and
 * under ThreadSanitizer).
 *
 * Data structures
 *   segment: one upstream allocation; its blocks form an address-ordered
 *            doubly linked list that tiles it exactly.
 *   block:   FREE (in its pool's free tree), ALLOCATED (in the pointer map)
 *            or PENDING (freed, waiting on events or deferred by capture).
 *   free tree: a treap per pool and class (small/large), intrusive in the
 *            blocks, priority = hash of the address. O(log n) expected for
 *            insert, remove and lower bound.
 *   pending tree: the same per pool and class for PENDING blocks whose
 *            events are all recorded (same links: a block is in at most one
 *            tree), so an allocation can find the best pending fit.
 *   pointer map: chained hash table address -> allocated block.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "alloc/alloc_internal.h"
#include "internal.h"

enum { B_FREE = 0, B_ALLOCATED = 1, B_PENDING = 2 };

typedef struct fp_pool fp_pool;
typedef struct fp_segment fp_segment;
typedef struct fp_block fp_block;

/* The fields a tree descent reads (key, children, priority) come first so a
 * visit touches one cache line; the structs are 64-byte aligned. */
struct fp_block {
    uintptr_t stream;        /* the segment's stream, copied for the tree key */
    size_t size;
    uintptr_t addr;
    fp_block *left, *right;  /* free tree */
    uint32_t prio;
    uint8_t state;
    size_t requested;
    fp_segment *seg;
    fp_block *prev, *next;   /* address neighbours inside the segment */
    uint8_t deferred;        /* PENDING without events yet (freed during capture) */
    uint8_t in_pend;         /* PENDING, every event recorded: in its pool's pending tree */
    uint16_t n_uses, cap_uses;
    int pending_events;
    fp_stream *uses;         /* other streams that used the block */
    fp_block *hnext;         /* pointer map chain, or recycle list */
    uint64_t free_tick;      /* when it last became free (GC / trim order) */
};

struct fp_segment {
    uintptr_t base;
    size_t size;
    uintptr_t stream;
    fp_pool *pool;
    int is_small;
    fp_block *head;
    fp_segment *prev, *next;
};

struct fp_pool {
    uint64_t id;             /* 0: the default pool */
    fp_block *root[2];       /* [0] large, [1] small */
    fp_block *pend_root[2];  /* pending blocks whose events are all recorded, same key */
    int active;              /* streams currently directed here */
    int released;
    int pins;                /* allocations in alloc_slow (the lock dropped around the
                                upstream): the struct outlives a release meanwhile */
    size_t n_segments;
    fp_pool *next;
};

typedef struct pending_event {
    void *event;
    fp_block *block;
} pending_event;

typedef struct capture_map {
    uintptr_t stream;
    fp_pool *pool;
} capture_map;

struct fp_allocator {
    atomic_int lock;         /* see lock() below */
    fp_alloc_upstream up;
    pthread_mutex_t up_mu;   /* serializes the upstream's calls (alloc runs without `lock`);
                                taken after `lock`, never the other way round */
    fp_alloc_event_ops ev;
    int have_events;
    fp_alloc_stream_wait_fn ev_wait; /* stream-ordered reuse; NULL: off */
    uint64_t stream_waits;           /* pending blocks reclaimed through ev_wait */
    uint64_t stream_wait_refusals;   /* ev_wait calls that refused */
    fp_alloc_config cfg;
    size_t cap;              /* effective cap on reserved bytes, SIZE_MAX: none */
    size_t max_split;

    fp_pool default_pool;
    fp_pool *private_pools;
    capture_map *captures;
    int n_captures, cap_captures;

    fp_segment *segments;    /* all segments, unordered */
    size_t growing_bytes;    /* asked of the upstream right now, lock dropped: counted
                                against the cap as if reserved */

    uint64_t *released_ids;  /* sorted: private pool ids released (never valid again) */
    size_t n_released, cap_released;

    fp_block **buckets;      /* pointer map */
    size_t n_buckets, n_mapped;
    unsigned bucket_shift;

    fp_block *recycled;      /* spare block structs */

    pending_event *pending;
    size_t n_pending, cap_pending;
    unsigned allocs_since_poll; /* allocations since the last poll, counted while events wait */
    fp_block **deferred;
    size_t n_deferred, cap_deferred;

    fp_alloc_event *ring;
    size_t ring_cap, ring_head, ring_count;
    uint64_t ring_seq;

    uint64_t tick;
    fp_alloc_stats st;
};

/* ======================================================================== */
/*  Lock                                                                    */
/* ======================================================================== */

/* A test-and-set lock: one atomic exchange to take it and a plain release
 * store to drop it (a glibc mutex costs two atomics and ~110 instructions per
 * lock/unlock pair, a third of a cache hit). Critical sections are short
 * (the upstream's alloc is called with the lock dropped; its free, a
 * cudaFree, is not), so waiters spin briefly, then yield, then sleep. */
static void lock_slow(atomic_int *l) {
    for (unsigned n = 0;; ++n) {
        if (n < 64) {
            fp_cpu_relax();
        } else if (n < 256) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        if (!atomic_load_explicit(l, memory_order_relaxed) &&
            !atomic_exchange_explicit(l, 1, memory_order_acquire))
            return;
    }
}

static inline void lock(fp_allocator *a) {
    if (atomic_exchange_explicit(&a->lock, 1, memory_order_acquire)) lock_slow(&a->lock);
}

static inline void unlock(fp_allocator *a) { atomic_store_explicit(&a->lock, 0, memory_order_release); }

/* ======================================================================== */
/*  Small helpers                                                           */
/* ======================================================================== */

static inline void stat_add(fp_alloc_stat *s, size_t v) {
    s->current += (int64_t)v;
    s->total += v;
    if (s->current > s->peak) s->peak = s->current;
}
/* `freed` is not kept on the hot path: it is always total - current, and is
 * filled in when the statistics are read (stats_fill_freed). */
static inline void stat_sub(fp_alloc_stat *s, size_t v) { s->current -= (int64_t)v; }

/* The nine fp_alloc_stat fields of the aggregate (cls < 0) or of one pool
 * class, in the same order as k_stat_names. */
static void stat_fields(fp_alloc_stats *s, int cls, fp_alloc_stat *f[9]) {
    if (cls < 0) {
        fp_alloc_stat *g[9] = {&s->allocated_bytes,  &s->requested_bytes, &s->reserved_bytes,
                               &s->active_bytes,     &s->inactive_split_bytes,
                               &s->allocation_count, &s->segment_count,   &s->active_count,
                               &s->inactive_split_count};
        memcpy(f, g, sizeof g);
    } else {
        fp_alloc_pool_stats *p = &s->pools[cls];
        fp_alloc_stat *g[9] = {&p->allocated_bytes,  &p->requested_bytes, &p->reserved_bytes,
                               &p->active_bytes,     &p->inactive_split_bytes,
                               &p->allocation_count, &p->segment_count,   &p->active_count,
                               &p->inactive_split_count};
        memcpy(f, g, sizeof g);
    }
}

static void stats_fill_derived(fp_alloc_stats *s) {
    fp_alloc_stat *g[9], *l[9], *m[9];
    stat_fields(s, -1, g);
    stat_fields(s, FP_ALLOC_POOL_LARGE, l);
    stat_fields(s, FP_ALLOC_POOL_SMALL, m);
    for (int i = 0; i < 9; ++i) {
        g[i]->total = l[i]->total + m[i]->total;
        g[i]->freed = g[i]->total - (uint64_t)g[i]->current;
        l[i]->freed = l[i]->total - (uint64_t)l[i]->current;
        m[i]->freed = m[i]->total - (uint64_t)m[i]->current;
    }
    const fp_alloc_pool_stats *pl = &s->pools[FP_ALLOC_POOL_LARGE], *ps = &s->pools[FP_ALLOC_POOL_SMALL];
    s->upstream_allocs = pl->upstream_allocs + ps->upstream_allocs;
    s->upstream_frees = pl->upstream_frees + ps->upstream_frees;
    s->cache_hits = pl->cache_hits + ps->cache_hits;
    s->cache_misses = pl->cache_misses + ps->cache_misses;
}

/* Every statistic is kept per pool class (cls = seg->is_small, which is the
 * fp_alloc_pool_class) and as an aggregate. The aggregate keeps only what
 * cannot be summed from the classes when the statistics are read (current
 * and its peak); total, freed and the counters are filled in by
 * stats_fill_derived. This keeps a cache hit to one extra store per stat. */
_Static_assert(FP_ALLOC_POOL_LARGE == 0 && FP_ALLOC_POOL_SMALL == 1, "class = is_small");
static inline void stat_add2(fp_alloc_stat *agg, fp_alloc_stat *cls, size_t v) {
    stat_add(cls, v);
    agg->current += (int64_t)v;
    if (agg->current > agg->peak) agg->peak = agg->current;
}
#define STAT_ADD(a, cls, field, v) stat_add2(&(a)->st.field, &(a)->st.pools[(cls)].field, (v))
#define STAT_SUB(a, cls, field, v) \
    (stat_sub(&(a)->st.field, (v)), stat_sub(&(a)->st.pools[(cls)].field, (v)))
#define COUNT(a, cls, field) ((a)->st.pools[(cls)].field++)

static inline uint32_t hash32(uintptr_t x) {
    uint64_t h = (uint64_t)x * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(h >> 32);
}

static inline int block_is_split(const fp_block *b) { return b->prev || b->next; }

static inline fp_pool *pool_of(const fp_block *b) { return b->seg->pool; }

static inline void ring_push(fp_allocator *a, uint32_t kind, uint64_t pool, uintptr_t ptr,
                             size_t size, fp_stream stream) {
    if (!a->ring_cap) return;
    size_t idx = (a->ring_head + a->ring_count) % a->ring_cap;
    if (a->ring_count == a->ring_cap)
        a->ring_head = (a->ring_head + 1) % a->ring_cap;
    else
        a->ring_count++;
    fp_alloc_event *e = &a->ring[idx];
    e->seq = a->ring_seq++;
    e->kind = kind;
    e->pool = pool;
    e->pool_low = (uint32_t)pool;
    e->ptr = ptr;
    e->size = size;
    e->stream = stream;
}

static fp_block *block_new(fp_allocator *a) {
    fp_block *b = a->recycled;
    if (b) {
        a->recycled = b->hnext;
        fp_stream *uses = b->uses;
        uint16_t cap = b->cap_uses;
        memset(b, 0, sizeof *b);
        b->uses = uses;
        b->cap_uses = cap;
        return b;
    }
    size_t bytes = (sizeof(fp_block) + 63) & ~(size_t)63;
    b = aligned_alloc(64, bytes);
    if (b) memset(b, 0, sizeof *b);
    return b;
}

static void block_recycle(fp_allocator *a, fp_block *b) {
    b->hnext = a->recycled;
    a->recycled = b;
}

/* ======================================================================== */
/*  Free tree: treap keyed by (stream, size, addr)                          */
/* ======================================================================== */

static inline int key_less(const fp_block *x, uintptr_t stream, size_t size, uintptr_t addr) {
    if (x->stream != stream) return x->stream < stream;
    if (x->size != size) return x->size < size;
    return x->addr < addr;
}

/* Splits t into keys < (key of b) and keys > it. */
static void treap_split(fp_block *t, const fp_block *b, fp_block **l, fp_block **r) {
    while (t) {
        if (key_less(t, b->stream, b->size, b->addr)) {
            *l = t;
            l = &t->right;
            t = t->right;
        } else {
            *r = t;
            r = &t->left;
            t = t->left;
        }
    }
    *l = NULL;
    *r = NULL;
}

static fp_block *treap_merge(fp_block *l, fp_block *r) {
    fp_block *root = NULL, **link = &root;
    while (l && r) {
        if (l->prio > r->prio) {
            *link = l;
            link = &l->right;
            l = l->right;
        } else {
            *link = r;
            link = &r->left;
            r = r->left;
        }
    }
    *link = l ? l : r;
    return root;
}

static void treap_insert(fp_block **root, fp_block *b) {
    b->prio = hash32(b->addr);
    fp_block **link = root;
    while (*link && (*link)->prio > b->prio)
        link = key_less(*link, b->stream, b->size, b->addr) ? &(*link)->right : &(*link)->left;
    treap_split(*link, b, &b->left, &b->right);
    *link = b;
}

static void treap_remove(fp_block **root, fp_block *b) {
    fp_block **link = root;
    while (*link != b)
        link = key_less(*link, b->stream, b->size, b->addr) ? &(*link)->right : &(*link)->left;
    *link = treap_merge(b->left, b->right);
    b->left = b->right = NULL;
}

static inline fp_block **tree_of(fp_block *b) { return &pool_of(b)->root[b->seg->is_small]; }

static void free_insert(fp_allocator *a, fp_block *b) {
    b->state = B_FREE;
    b->free_tick = ++a->tick;
    treap_insert(tree_of(b), b);
    if (block_is_split(b)) {
        STAT_ADD(a, b->seg->is_small, inactive_split_bytes, b->size);
        STAT_ADD(a, b->seg->is_small, inactive_split_count, 1);
    }
}

static void free_remove(fp_allocator *a, fp_block *b) {
    treap_remove(tree_of(b), b);
    if (block_is_split(b)) {
        STAT_SUB(a, b->seg->is_small, inactive_split_bytes, b->size);
        STAT_SUB(a, b->seg->is_small, inactive_split_count, 1);
    }
}

/* ======================================================================== */
/*  Pointer map                                                             */
/* ======================================================================== */

static inline size_t bucket_of(const fp_allocator *a, uintptr_t addr) {
    return (size_t)(((uint64_t)addr * 0x9E3779B97F4A7C15ULL) >> a->bucket_shift);
}

static int map_grow(fp_allocator *a) {
    size_t n = a->n_buckets ? a->n_buckets * 2 : 1024;
    fp_block **nb = calloc(n, sizeof *nb);
    if (!nb) return 0;
    unsigned shift = 64;
    for (size_t k = n; k > 1; k >>= 1) shift--;
    for (size_t i = 0; i < a->n_buckets; ++i) {
        fp_block *b = a->buckets[i];
        while (b) {
            fp_block *nx = b->hnext;
            size_t h = (size_t)(((uint64_t)b->addr * 0x9E3779B97F4A7C15ULL) >> shift);
            b->hnext = nb[h];
            nb[h] = b;
            b = nx;
        }
    }
    free(a->buckets);
    a->buckets = nb;
    a->n_buckets = n;
    a->bucket_shift = shift;
    return 1;
}

static inline void map_insert(fp_allocator *a, fp_block *b) {
    size_t h = bucket_of(a, b->addr);
    b->hnext = a->buckets[h];
    a->buckets[h] = b;
    a->n_mapped++;
}

static inline fp_block *map_find(const fp_allocator *a, uintptr_t addr) {
    fp_block *b = a->buckets[bucket_of(a, addr)];
    while (b && b->addr != addr) b = b->hnext;
    return b;
}

static inline fp_block *map_remove(fp_allocator *a, uintptr_t addr) {
    fp_block **link = &a->buckets[bucket_of(a, addr)];
    while (*link && (*link)->addr != addr) link = &(*link)->hnext;
    fp_block *b = *link;
    if (b) {
        *link = b->hnext;
        b->hnext = NULL;
        a->n_mapped--;
    }
    return b;
}

/* ======================================================================== */
/*  Configuration                                                           */
/* ======================================================================== */

fp_status fp_alloc_config_default_sized(fp_alloc_config *out, size_t struct_size) {
    fp_alloc_config defaults, *cfg = &defaults;
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->max_split_size = SIZE_MAX;
    cfg->max_non_split_rounding = FP_ALLOC_LARGE_SEGMENT;
    return fp_struct_init(out, struct_size, cfg, ALLOC_CONFIG_SIZE_FIRST, sizeof *cfg, "fp_alloc_config");
}

void(fp_alloc_config_default)(fp_alloc_config *cfg) {
    if (cfg) (void)fp_alloc_config_default_sized(cfg, ALLOC_CONFIG_SIZE_FIRST);
}

static int is_pow2_u32(uint32_t v) { return v && !(v & (v - 1)); }

fp_status fp_alloc_config_set_divisions(fp_alloc_config *cfg, size_t lo_bytes, size_t hi_bytes,
                                        uint32_t divisions) {
    FP_CHECK_NOT_NULL(cfg);
    FP_CHECK_ARG(cfg->struct_size == sizeof *cfg,
                 "cfg->struct_size %zu != %zu: initialize it with fp_alloc_config_default",
                 cfg->struct_size, sizeof *cfg);
    FP_CHECK_ARG(divisions == 0 || (is_pow2_u32(divisions) && divisions <= (1u << 20)),
                 "argument 'divisions' (%u) must be 0 or a power of two <= 2^20", divisions);
    FP_CHECK_ARG(lo_bytes <= hi_bytes, "argument 'lo_bytes' (%zu) > 'hi_bytes' (%zu)", lo_bytes,
                 hi_bytes);
    for (int k = 0; k < FP_ALLOC_POW2_INTERVALS; ++k) {
        size_t start = (size_t)1 << k;
        size_t end = k == 63 ? SIZE_MAX : ((size_t)1 << (k + 1)) - 1;
        if (end >= lo_bytes && start <= hi_bytes) cfg->roundup_power2_divisions[k] = divisions;
    }
    return FP_OK;
}

static fp_status check_config(const fp_alloc_config *c) {
    for (int k = 0; k < FP_ALLOC_POW2_INTERVALS; ++k) {
        uint32_t d = c->roundup_power2_divisions[k];
        FP_CHECK_ARG(d == 0 || (is_pow2_u32(d) && d <= (1u << 20)),
                     "cfg->roundup_power2_divisions[%d] = %u is not 0 or a power of two <= 2^20",
                     k, d);
    }
    FP_CHECK_ARG(c->memory_fraction >= 0 && c->memory_fraction <= 1,
                 "cfg->memory_fraction (%g) must be in [0, 1]", c->memory_fraction);
    FP_CHECK_ARG(c->garbage_collection_threshold >= 0 && c->garbage_collection_threshold < 1,
                 "cfg->garbage_collection_threshold (%g) must be in [0, 1)",
                 c->garbage_collection_threshold);
    FP_CHECK_ARG(c->event_ring_size <= ((size_t)1 << 28), "cfg->event_ring_size (%zu) too large",
                 c->event_ring_size);
    return FP_OK;
}

/* Rounds a request (1 <= n <= FP_ALLOC_MAX_REQUEST) to its block size. */
static inline size_t round_size(const fp_alloc_config *cfg, size_t n) {
    if (n <= FP_ALLOC_MIN_BLOCK) return FP_ALLOC_MIN_BLOCK;
    int k = 63 - __builtin_clzll((unsigned long long)n);
    uint32_t d = cfg->roundup_power2_divisions[k];
    if (d > 1) {
        size_t step = ((size_t)1 << k) / d;
        if (step >= FP_ALLOC_ALIGN) return (n + step - 1) & ~(step - 1);
    }
    return (n + FP_ALLOC_ALIGN - 1) & ~(FP_ALLOC_ALIGN - 1);
}

/* ======================================================================== */
/*  Create / destroy                                                        */
/* ======================================================================== */

fp_status fp_alloc_create_sized(const fp_alloc_upstream *user_upstream, size_t upstream_size,
                                const fp_alloc_event_ops *user_events, size_t events_size,
                                const fp_alloc_config *cfg, fp_allocator **out) {
    FP_CHECK_ARG(user_upstream != NULL, "argument 'upstream' is NULL");
    FP_CHECK_NOT_NULL(out);
    fp_alloc_upstream up_full;
    fp_alloc_event_ops ev_full;
    FP_TRY(fp_table_read(&up_full, user_upstream, upstream_size, ALLOC_UPSTREAM_SIZE_FIRST, sizeof up_full,
                         "fp_alloc_upstream (upstream_size)"));
    if (user_events)
        FP_TRY(fp_table_read(&ev_full, user_events, events_size, ALLOC_EVENT_OPS_SIZE_FIRST, sizeof ev_full,
                             "fp_alloc_event_ops (events_size)"));
    const fp_alloc_upstream *upstream = &up_full;
    const fp_alloc_event_ops *events = user_events ? &ev_full : NULL;
    FP_CHECK_ARG(upstream->alloc && upstream->free, "upstream->alloc and upstream->free are required");
    if (events)
        FP_CHECK_ARG(events->record && events->query && events->destroy,
                     "events->record, query and destroy are required");
    fp_alloc_config def;
    if (!cfg) {
        fp_alloc_config_default(&def);
        cfg = &def;
    }
    FP_STRUCT_IN(&cfg, def, ALLOC_CONFIG_SIZE_FIRST, fp_alloc_config_default, "fp_alloc_config (cfg)");
    FP_TRY(check_config(cfg));
    size_t cap = SIZE_MAX;
    if (cfg->memory_cap_bytes) cap = cfg->memory_cap_bytes;
    if (cfg->memory_fraction > 0) {
        size_t total = upstream->total_bytes ? upstream->total_bytes(upstream->opaque) : 0;
        FP_CHECK_ARG(total > 0, "cfg->memory_fraction needs an upstream with total_bytes");
        size_t c = (size_t)((double)total * cfg->memory_fraction);
        if (c < cap) cap = c;
    }
    FP_CHECK_ARG(cfg->garbage_collection_threshold == 0 || cap != SIZE_MAX,
                 "cfg->garbage_collection_threshold needs a cap (memory_cap_bytes or memory_fraction)");

    fp_allocator *a = calloc(1, sizeof *a);
    if (!a) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "allocator state");
    a->up = *upstream;
    if (events) {
        a->ev = *events;
        a->have_events = 1;
    }
    a->cfg = *cfg;
    a->cap = cap;
    a->max_split = cfg->max_split_size < FP_ALLOC_LARGE_SEGMENT ? FP_ALLOC_LARGE_SEGMENT
                                                                : cfg->max_split_size;
    a->st.struct_size = sizeof a->st;
    if (cfg->event_ring_size) {
        a->ring = calloc(cfg->event_ring_size, sizeof *a->ring);
        a->ring_cap = cfg->event_ring_size;
    }
    if ((cfg->event_ring_size && !a->ring) || !map_grow(a)) {
        free(a->ring);
        free(a);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "allocator state");
    }
    if (pthread_mutex_init(&a->up_mu, NULL) != 0) {
        free(a->ring);
        free(a->buckets);
        free(a);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "allocator state");
    }
    atomic_init(&a->lock, 0);
    *out = a;
    return FP_OK;
}

fp_status(fp_alloc_create)(const fp_alloc_upstream *upstream, const fp_alloc_event_ops *events,
                           const fp_alloc_config *cfg, fp_allocator **out) {
    return fp_alloc_create_sized(upstream, ALLOC_UPSTREAM_SIZE_FIRST, events, ALLOC_EVENT_OPS_SIZE_FIRST, cfg, out);
}

static void free_block_struct(fp_block *b) {
    free(b->uses);
    free(b);
}

void fp_alloc_destroy(fp_allocator *a) {
    if (!a) return;
    for (size_t i = 0; i < a->n_pending; ++i) a->ev.destroy(a->ev.opaque, a->pending[i].event);
    fp_segment *s = a->segments;
    while (s) {
        fp_segment *nx = s->next;
        fp_block *b = s->head;
        while (b) {
            fp_block *bn = b->next;
            free_block_struct(b);
            b = bn;
        }
        a->up.free(a->up.opaque, (void *)s->base, s->size);
        free(s);
        s = nx;
    }
    pthread_mutex_destroy(&a->up_mu);
    while (a->recycled) {
        fp_block *nx = a->recycled->hnext;
        free_block_struct(a->recycled);
        a->recycled = nx;
    }
    fp_pool *p = a->private_pools;
    while (p) {
        fp_pool *nx = p->next;
        free(p);
        p = nx;
    }
    free(a->captures);
    free(a->released_ids);
    free(a->buckets);
    free(a->pending);
    free(a->deferred);
    free(a->ring);
    free(a);
}

/* ======================================================================== */
/*  Segments                                                                */
/* ======================================================================== */

static int pool_releasable(const fp_pool *p) { return p->id == 0 || p->released; }

/* The upstream sees one call at a time, as when every call was made under
 * the allocator's lock (a caller's upstream need not be thread-safe). */
static void upstream_free(fp_allocator *a, void *ptr, size_t size) {
    pthread_mutex_lock(&a->up_mu);
    a->up.free(a->up.opaque, ptr, size);
    pthread_mutex_unlock(&a->up_mu);
}

static void pool_unlink_free(fp_allocator *a, fp_pool *p) {
    fp_pool **link = &a->private_pools;
    while (*link && *link != p) link = &(*link)->next;
    if (*link) *link = p->next;
    free(p);
}

/* A released private pool goes once its last segment went and no allocation
 * that dropped the lock still points at it (its id stays in
 * a->released_ids). */
static void pool_maybe_free(fp_allocator *a, fp_pool *p) {
    if (p->id && p->released && p->n_segments == 0 && p->pins == 0) pool_unlink_free(a, p);
}

/* Returns a segment whose only block is free to the upstream. */
static void segment_release(fp_allocator *a, fp_segment *s) {
    fp_block *b = s->head;
    free_remove(a, b);
    block_recycle(a, b);
    if (s->prev) s->prev->next = s->next; else a->segments = s->next;
    if (s->next) s->next->prev = s->prev;
    upstream_free(a, (void *)s->base, s->size);
    COUNT(a, s->is_small, upstream_frees);
    STAT_SUB(a, s->is_small, reserved_bytes, s->size);
    STAT_SUB(a, s->is_small, segment_count, 1);
    ring_push(a, FP_ALLOC_EV_SEGMENT_FREE, s->pool->id, s->base, s->size, (fp_stream)s->stream);
    fp_pool *p = s->pool;
    p->n_segments--;
    free(s);
    pool_maybe_free(a, p);
}

static inline int segment_is_free(const fp_segment *s) {
    return s->head->state == B_FREE && !s->head->next;
}

static int cmp_oldest(const void *x, const void *y) {
    const fp_segment *a = *(fp_segment *const *)x, *b = *(fp_segment *const *)y;
    return a->head->free_tick < b->head->free_tick ? -1 : a->head->free_tick > b->head->free_tick;
}
static int cmp_largest(const void *x, const void *y) {
    const fp_segment *a = *(fp_segment *const *)x, *b = *(fp_segment *const *)y;
    return a->size > b->size ? -1 : a->size < b->size;
}

/* Releases free segments of releasable pools (class: 0 large, 1 small, -1
 * both), in `order` (cmp_oldest or cmp_largest), until reserved <= target or
 * `want` bytes were released (0: no such bound). Returns bytes released. */
static size_t release_free_segments(fp_allocator *a, int cls, int (*order)(const void *, const void *),
                                    size_t target, size_t want) {
    size_t n = 0;
    for (fp_segment *s = a->segments; s; s = s->next)
        if (segment_is_free(s) && pool_releasable(s->pool) && (cls < 0 || s->is_small == cls)) n++;
    if (!n) return 0;
    fp_segment **list = malloc(n * sizeof *list);
    size_t released = 0;
    if (!list) {
        /* No memory for ordering: release in list order. */
        fp_segment *s = a->segments;
        while (s && (size_t)a->st.reserved_bytes.current > target && (!want || released < want)) {
            fp_segment *nx = s->next;
            if (segment_is_free(s) && pool_releasable(s->pool) && (cls < 0 || s->is_small == cls)) {
                released += s->size;
                segment_release(a, s);
            }
            s = nx;
        }
        return released;
    }
    size_t k = 0;
    for (fp_segment *s = a->segments; s; s = s->next)
        if (segment_is_free(s) && pool_releasable(s->pool) && (cls < 0 || s->is_small == cls))
            list[k++] = s;
    qsort(list, n, sizeof *list, order);
    for (size_t i = 0; i < n; ++i) {
        if ((size_t)a->st.reserved_bytes.current <= target) break;
        if (want && released >= want) break;
        released += list[i]->size;
        segment_release(a, list[i]);
    }
    free(list);
    return released;
}

/* The event ops' check_stream on `stream`: a caller's callback cannot record
 * a message (fp_set_error is internal) and may return any int, so its
 * failure is reported with a message naming it, and a value outside
 * fp_status as FP_ERR_INVALID_ARGUMENT (as for the upstream below); the
 * message of a callback that set one (the CUDA ops') is kept. */
static fp_status check_stream(fp_allocator *a, uintptr_t stream) {
    if (!a->ev.check_stream) return FP_OK;
    const unsigned seq = fp_error_seq();
    const fp_status st = a->ev.check_stream(a->ev.opaque, (fp_stream)stream);
    if (st == FP_OK) return FP_OK;
    if ((int)st < FP_OK || (int)st > FP_ERR_INTERNAL)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT, "event ops' check_stream(stream %p) returned %d, not an fp_status",
                            (void *)stream, (int)st);
    if (fp_error_seq() == seq)
        return fp_set_error(st, "event ops' check_stream refused stream %p: %s", (void *)stream, fp_status_string(st));
    return st;
}

/* Asks the upstream for a segment of `size` bytes for `pool` (respecting the
 * cap); FP_ERR_OUT_OF_MEMORY when refused (*by_cap set when the cap refused
 * without asking the upstream). Called with the lock held; drops it around
 * the upstream's alloc (a cudaMalloc takes milliseconds: other threads' cache
 * hits, frees and statistics go on meanwhile, as in PyTorch). The bytes are
 * counted in growing_bytes first, so concurrent requests see them against
 * the cap; the memory is not in any list until the caller makes it a
 * segment, so a concurrent release (empty_cache, trim, the OOM ladder of
 * another thread) cannot touch it; the pool is pinned by the caller
 * (alloc_slow). On return the lock is held again and anything may have
 * changed meanwhile. */
static fp_status segment_reserve(fp_allocator *a, size_t size, int is_small, void **out, int *by_cap) {
    *by_cap = 0;
    if (a->cap != SIZE_MAX && (size > a->cap || a->growing_bytes > a->cap - size ||
                               (size_t)a->st.reserved_bytes.current > a->cap - size - a->growing_bytes)) {
        *by_cap = 1;
        return FP_ERR_OUT_OF_MEMORY;
    }
    a->growing_bytes += size;
    unlock(a);
    /* A caller's upstream cannot record a detail message (fp_set_error is
     * internal), and may return any int: its failure is reported with a
     * status from the enum and a message naming it, while the message of an
     * upstream that did set one (the built-in device upstream's cudaMalloc
     * detail) is kept. The error state is per thread: the dropped lock does
     * not mix messages. */
    const unsigned seq = fp_error_seq();
    void *mem = NULL;
    pthread_mutex_lock(&a->up_mu);
    fp_status st = a->up.alloc(a->up.opaque, size, &mem);
    pthread_mutex_unlock(&a->up_mu);
    lock(a);
    a->growing_bytes -= size;
    if (st == FP_OK && !mem) {
        a->st.upstream_failures++;
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "upstream alloc of %zu bytes returned FP_OK and no memory", size);
    }
    if (st != FP_OK) {
        a->st.upstream_failures++;
        if ((int)st < FP_OK || (int)st > FP_ERR_INTERNAL)
            return fp_set_error(FP_ERR_INVALID_ARGUMENT, "upstream alloc of %zu bytes returned %d, not an fp_status", size,
                                (int)st);
        if (st != FP_ERR_OUT_OF_MEMORY && fp_error_seq() == seq)
            return fp_set_error(st, "upstream alloc of %zu bytes failed: %s", size, fp_status_string(st));
        return st;
    }
    *out = mem;
    COUNT(a, is_small, upstream_allocs);
    return FP_OK;
}

/* What a cache miss asked for, for the out-of-memory message. */
typedef struct reserve_try {
    size_t seg_size;  /* the pool's segment size for the request */
    size_t fit_size;  /* the right-sized fallback (rsize), 0 when the same */
    size_t got;       /* the size reserved */
    int by_cap;       /* the last refusal came from the cap, not the upstream */
} reserve_try;

/* The pool's segment size first (20 MiB for a 1-10 MiB request, so that
 * later requests split it), then, when that is refused (by the cap or the
 * upstream: a small region, a registered staging buffer, a nearly full
 * device), a segment of exactly the block size: the request fails only when
 * no segment that fits can be had. */
static fp_status reserve_fitting(fp_allocator *a, reserve_try *t, int is_small, void **out) {
    t->got = t->seg_size;
    fp_status st = segment_reserve(a, t->seg_size, is_small, out, &t->by_cap);
    if (st == FP_ERR_OUT_OF_MEMORY && t->fit_size) {
        t->got = t->fit_size;
        st = segment_reserve(a, t->fit_size, is_small, out, &t->by_cap);
    }
    return st;
}

static fp_status segment_create(fp_allocator *a, void *mem, size_t size, uintptr_t stream, fp_pool *pool,
                                int is_small, fp_block **out) {
    fp_segment *s = calloc(1, sizeof *s);
    fp_block *b = s ? block_new(a) : NULL;
    if (!b) {
        free(s);
        upstream_free(a, mem, size);
        COUNT(a, is_small, upstream_frees);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "allocator bookkeeping for a %zu-byte segment", size);
    }
    s->base = (uintptr_t)mem;
    s->size = size;
    s->stream = stream;
    s->pool = pool;
    s->is_small = is_small;
    s->head = b;
    s->next = a->segments;
    if (a->segments) a->segments->prev = s;
    a->segments = s;
    pool->n_segments++;
    b->addr = s->base;
    b->size = size;
    b->stream = stream;
    b->seg = s;
    b->state = B_FREE;
    STAT_ADD(a, is_small, reserved_bytes, size);
    STAT_ADD(a, is_small, segment_count, 1);
    ring_push(a, FP_ALLOC_EV_SEGMENT_ALLOC, pool->id, s->base, size, (fp_stream)stream);
    *out = b;
    return FP_OK;
}

/* ======================================================================== */
/*  Stream-ordered reuse                                                    */
/* ======================================================================== */

/* A block whose events all completed (or that needs none) goes back to the
 * free tree, merged with its free neighbours. */
static void block_make_free(fp_allocator *a, fp_block *b) {
    STAT_SUB(a, b->seg->is_small, active_bytes, b->size);
    STAT_SUB(a, b->seg->is_small, active_count, 1);
    fp_block *p = b->prev;
    if (p && p->state == B_FREE) {
        free_remove(a, p);
        p->size += b->size;
        p->next = b->next;
        if (b->next) b->next->prev = p;
        block_recycle(a, b);
        b = p;
    }
    fp_block *n = b->next;
    if (n && n->state == B_FREE) {
        free_remove(a, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        block_recycle(a, n);
    }
    free_insert(a, b);
    fp_pool *pool = pool_of(b);
    if (pool->released && !block_is_split(b)) segment_release(a, b->seg);
}

static inline void pend_insert(fp_block *b) {
    treap_insert(&pool_of(b)->pend_root[b->seg->is_small], b);
    b->in_pend = 1;
}

static inline void pend_remove(fp_block *b) {
    if (!b->in_pend) return;
    treap_remove(&pool_of(b)->pend_root[b->seg->is_small], b);
    b->in_pend = 0;
}

static void pending_done(fp_allocator *a, fp_block *b) {
    pend_remove(b);
    a->st.pending_event_blocks--;
    block_make_free(a, b);
}

static int push_pending(fp_allocator *a, void *event, fp_block *b) {
    if (a->n_pending == a->cap_pending) {
        size_t nc = a->cap_pending ? a->cap_pending * 2 : 64;
        pending_event *np = realloc(a->pending, nc * sizeof *np);
        if (!np) return 0;
        a->pending = np;
        a->cap_pending = nc;
    }
    a->pending[a->n_pending].event = event;
    a->pending[a->n_pending].block = b;
    a->n_pending++;
    return 1;
}

/* Parks a block whose events cannot be recorded yet (capture in progress).
 * Returns 0 if the list cannot grow: the block then stays pending for good
 * rather than risk reuse while another stream may still use it. */
static int defer_block(fp_allocator *a, fp_block *b) {
    if (a->n_deferred == a->cap_deferred) {
        size_t nc = a->cap_deferred ? a->cap_deferred * 2 : 32;
        fp_block **nd = realloc(a->deferred, nc * sizeof *nd);
        if (!nd) return 0;
        a->deferred = nd;
        a->cap_deferred = nc;
    }
    b->deferred = 1;
    a->deferred[a->n_deferred++] = b;
    return 1;
}

/* Records one event per stream that used b. Streams whose event cannot be
 * recorded now (e.g. the CUDA ops refuse while that stream is capturing) stay
 * in b->uses and the block is deferred; it becomes free only when every
 * stream has an event and all of them completed. */
static void record_block_events(fp_allocator *a, fp_block *b) {
    b->deferred = 0;
    uint16_t keep = 0;
    for (uint16_t i = 0; i < b->n_uses; ++i) {
        void *ev = NULL;
        if (a->ev.record(a->ev.opaque, b->uses[i], &ev) != FP_OK) {
            b->uses[keep++] = b->uses[i];
            continue;
        }
        if (!push_pending(a, ev, b)) {
            if (a->ev.synchronize) a->ev.synchronize(a->ev.opaque, ev);
            a->ev.destroy(a->ev.opaque, ev);
            continue;
        }
        b->pending_events++;
    }
    b->n_uses = keep;
    if (keep)
        (void)defer_block(a, b);
    else if (b->pending_events == 0)
        pending_done(a, b);
    else
        pend_insert(b);
}

static void record_deferred(fp_allocator *a) {
    size_t n = a->n_deferred;
    a->n_deferred = 0;
    for (size_t i = 0; i < n; ++i) record_block_events(a, a->deferred[i]);
}

/* Non-blocking poll (blocking with wait != 0) of every pending event. */
static void process_events(fp_allocator *a, int wait) {
    if (a->n_captures) return; /* no event calls while a graph may be capturing */
    a->allocs_since_poll = 0;
    if (a->n_deferred) record_deferred(a);
    size_t k = 0;
    for (size_t i = 0; i < a->n_pending; ++i) {
        pending_event pe = a->pending[i];
        if (wait && a->ev.synchronize) a->ev.synchronize(a->ev.opaque, pe.event);
        if (a->ev.query(a->ev.opaque, pe.event)) {
            a->ev.destroy(a->ev.opaque, pe.event);
            if (--pe.block->pending_events == 0 && !pe.block->deferred) pending_done(a, pe.block);
        } else {
            a->pending[k++] = pe;
        }
    }
    a->n_pending = k;
}

/* ======================================================================== */
/*  Allocation                                                              */
/* ======================================================================== */

static inline fp_pool *pool_for_stream(fp_allocator *a, uintptr_t stream) {
    for (int i = 0; i < a->n_captures; ++i)
        if (a->captures[i].stream == stream) return a->captures[i].pool;
    return &a->default_pool;
}

/* Best fit in the tree at `root` (a free or pending tree) for this stream,
 * honouring the split limits: the link that holds it, or NULL. */
static inline fp_block **fit_link(const fp_allocator *a, fp_block **root, int small, uintptr_t stream,
                                  size_t rsize) {
    fp_block **link = root, **best_link = NULL;
    while (*link) {
        fp_block *t = *link;
        if (key_less(t, stream, rsize, 0)) {
            link = &t->right;
        } else {
            best_link = link;
            link = &t->left;
        }
    }
    if (!best_link) return NULL;
    const fp_block *b = *best_link;
    if (b->stream != stream) return NULL;
    if (!small && b->size > a->max_split) {
        /* An unsplittable block: never for a request that could be served by
         * splitting, and only when it wastes at most max_non_split_rounding. */
        if (rsize <= a->max_split) return NULL;
        if (b->size - rsize > a->cfg.max_non_split_rounding) return NULL;
    }
    return best_link;
}

/* Removes the free block at *link (from fit_link on a free tree), reusing
 * the link found by the search (one descent instead of two). */
static inline fp_block *take_free(fp_allocator *a, fp_block **link, int small) {
    fp_block *b = *link;
    *link = treap_merge(b->left, b->right);
    b->left = b->right = NULL;
    if (block_is_split(b)) {
        STAT_SUB(a, small, inactive_split_bytes, b->size);
        STAT_SUB(a, small, inactive_split_count, 1);
    }
    return b;
}

/* Best fit in the pool's free tree for this stream, removed from the tree. */
static inline fp_block *find_fit(fp_allocator *a, fp_pool *pool, int small, uintptr_t stream,
                                 size_t rsize) {
    fp_block **link = fit_link(a, &pool->root[small], small, stream, rsize);
    return link ? take_free(a, link, small) : NULL;
}

static inline int should_split(const fp_allocator *a, const fp_block *b, size_t rsize, int small) {
    size_t rem = b->size - rsize;
    if (small) return rem >= FP_ALLOC_MIN_BLOCK;
    return rem > FP_ALLOC_SMALL_SIZE && b->size <= a->max_split;
}

/* The message says what was asked of the upstream (or refused by the cap)
 * and what waits on stream events (bytes freed but still used by other
 * streams: a reason the cache could not serve the request), and ends with
 * the upstream's own detail when it recorded one (a pinned pool's budget,
 * cudaMalloc's error): without it the caller cannot tell why. */
static fp_status oom(fp_allocator *a, size_t size, size_t rsize, const reserve_try *t, fp_stream stream,
                     const char *upstream_detail) {
    a->st.ooms++;
    ring_push(a, FP_ALLOC_EV_OOM, 0, 0, size, stream);
    char capbuf[64] = "none";
    if (a->cap != SIZE_MAX) snprintf(capbuf, sizeof capbuf, "%zu bytes", a->cap);
    char segbuf[96];
    if (t->fit_size)
        snprintf(segbuf, sizeof segbuf, "segment of %zu bytes, then of %zu bytes", t->seg_size, t->fit_size);
    else
        snprintf(segbuf, sizeof segbuf, "segment of %zu bytes", t->seg_size);
    const long long waiting = (long long)(a->st.active_bytes.current - a->st.allocated_bytes.current);
    return fp_set_error(FP_ERR_OUT_OF_MEMORY,
                        "caching allocator out of memory: requested %zu bytes (block %zu), "
                        "%s refused by the %s; allocated %lld bytes, reserved %lld bytes, "
                        "inactive split %lld bytes, waiting on stream events %lld bytes in %llu "
                        "blocks, being reserved by other threads %zu bytes, cap %s%s%s",
                        size, rsize, segbuf, t->by_cap ? "cap" : "upstream",
                        (long long)a->st.allocated_bytes.current, (long long)a->st.reserved_bytes.current,
                        (long long)a->st.inactive_split_bytes.current, waiting,
                        (unsigned long long)a->st.pending_event_blocks, a->growing_bytes, capbuf,
                        upstream_detail[0] ? "; the upstream said: " : "", upstream_detail);
}

/* A run of address neighbours that are free, or pending on recorded events,
 * with at least one pending block: what a cache miss can reclaim at once by
 * making its stream wait on the run's events. */
typedef struct pending_run {
    fp_block *pend[FP_ALLOC_MAX_STREAM_WAITS]; /* its pending blocks */
    int n_pend, n_events;
    size_t bytes;
} pending_run;

static inline int run_member(const fp_block *b) {
    return b->state == B_FREE || (b->state == B_PENDING && b->in_pend);
}

/* The run through pending block b, grown from b towards both ends while it
 * stays within FP_ALLOC_MAX_STREAM_WAITS events; stops as soon as it holds
 * `want` bytes (taking fewer pending blocks than the maximal run). */
static void run_through(fp_block *b, size_t want, pending_run *r) {
    r->n_pend = 1;
    r->pend[0] = b;
    r->n_events = b->pending_events;
    r->bytes = b->size;
    fp_block *lo = b->prev, *hi = b->next;
    while (r->bytes < want && (lo || hi)) {
        /* free neighbours first (no event), then the pending one with fewer events */
        fp_block *c = NULL;
        int lo_ok = lo && run_member(lo), hi_ok = hi && run_member(hi);
        if (lo_ok && lo->state == B_FREE) c = lo;
        else if (hi_ok && hi->state == B_FREE) c = hi;
        else if (lo_ok && (!hi_ok || lo->pending_events <= hi->pending_events)) c = lo;
        else if (hi_ok) c = hi;
        if (!c) break;
        if (c->state == B_PENDING) {
            if (r->n_pend == FP_ALLOC_MAX_STREAM_WAITS ||
                r->n_events + c->pending_events > FP_ALLOC_MAX_STREAM_WAITS)
                break;
            r->pend[r->n_pend++] = c;
            r->n_events += c->pending_events;
        }
        r->bytes += c->size;
        if (c == lo) lo = lo->prev;
        else hi = hi->next;
    }
}

/* For a cache miss: the run of this pool, class and stream that serves
 * rsize with the fewest bytes (best fit; the oldest freed pending block
 * first among equals, a->pending being in record order). 0: none. */
static int pending_run_fit(fp_allocator *a, fp_pool *pool, int small, uintptr_t stream, size_t rsize,
                           pending_run *best) {
    best->bytes = SIZE_MAX;
    int found = 0;
    for (size_t i = 0; i < a->n_pending; ++i) {
        fp_block *b = a->pending[i].block;
        if (!b->in_pend || b->stream != stream || pool_of(b) != pool || b->seg->is_small != small ||
            b->pending_events > FP_ALLOC_MAX_STREAM_WAITS)
            continue;
        pending_run r;
        run_through(b, rsize, &r);
        if (r.bytes < rsize || r.bytes >= best->bytes) continue;
        /* fit_link's rule for blocks that will not be split */
        if (!small && r.bytes > a->max_split &&
            (rsize <= a->max_split || r.bytes - rsize > a->cfg.max_non_split_rounding))
            continue;
        *best = r;
        found = 1;
        if (r.bytes == rsize) break;
    }
    return found;
}

/* Makes `stream` wait on every event of the run's pending blocks and frees
 * them (merged with the run's free blocks): stream-ordered reuse, since
 * everything the other streams queued before the frees then runs before
 * anything `stream` queues after this allocation, which is what completed
 * events would guarantee. 0 (nothing freed; waits already
 * placed stay, harmlessly) when the op refuses one. */
static int reclaim_run(fp_allocator *a, const pending_run *r, uintptr_t stream) {
    for (size_t i = 0; i < a->n_pending; ++i)
        for (int j = 0; j < r->n_pend; ++j)
            if (a->pending[i].block == r->pend[j] &&
                a->ev_wait(a->ev.opaque, (fp_stream)stream, a->pending[i].event) != FP_OK) {
                a->stream_wait_refusals++;
                return 0;
            }
    size_t k = 0;
    for (size_t i = 0; i < a->n_pending; ++i) {
        int in_run = 0;
        for (int j = 0; j < r->n_pend; ++j) in_run |= a->pending[i].block == r->pend[j];
        if (in_run)
            a->ev.destroy(a->ev.opaque, a->pending[i].event);
        else
            a->pending[k++] = a->pending[i];
    }
    a->n_pending = k;
    for (int j = 0; j < r->n_pend; ++j) {
        r->pend[j]->pending_events = 0;
        a->stream_waits++;
        pending_done(a, r->pend[j]);
    }
    return 1;
}

/* Tries to make the pending block b (all events recorded) free for an
 * allocation on `stream`, without the host waiting: drops the events that
 * completed (one non-blocking query each); if some remain, allow_wait is set
 * and the allocator has a stream-wait op, makes `stream` wait on each of
 * them (reclaim_run of b alone: stream-ordered reuse). Returns 1 when b was
 * freed (merged into its free tree: the caller searches again), 0 when it
 * stays pending (with its remaining events). O(pending events). */
static int reclaim_pending(fp_allocator *a, fp_block *b, uintptr_t stream, int allow_wait) {
    size_t k = 0;
    for (size_t i = 0; i < a->n_pending; ++i) {
        pending_event pe = a->pending[i];
        if (pe.block == b && a->ev.query(a->ev.opaque, pe.event)) {
            a->ev.destroy(a->ev.opaque, pe.event);
            b->pending_events--;
        } else {
            a->pending[k++] = pe;
        }
    }
    a->n_pending = k;
    if (b->pending_events == 0) {
        pending_done(a, b);
        return 1;
    }
    if (!allow_wait || !a->ev_wait || b->pending_events > FP_ALLOC_MAX_STREAM_WAITS) return 0;
    const pending_run run = {{b}, 1, b->pending_events, b->size};
    return reclaim_run(a, &run, stream);
}

/* The OOM ladder after the first refusal (fresh_block_or_segment); the
 * lock may be dropped inside segment_reserve, so whether cache may be
 * released is read again before each step. */
static fp_status reserve_with_retries(fp_allocator *a, fp_pool *pool, int small, uintptr_t stream,
                                      size_t rsize, reserve_try *t, void **mem, fp_block **hit) {
    fp_status st = reserve_fitting(a, t, small, mem);
    /* While a private pool is active a graph may be capturing: returning
     * segments then (cudaFree synchronizes the device, which a capture does
     * not allow: the call fails, the capture is invalidated, and the segment
     * would leak) is left out. Only new memory is asked for; if that fails,
     * the request fails (PyTorch's allocator likewise releases no cache
     * during a capture). */
    if (st == FP_ERR_OUT_OF_MEMORY && !a->n_captures) {
        /* 1: release cached unsplit segments of this class, largest first. */
        if (release_free_segments(a, small, cmp_largest, 0, t->seg_size)) {
            a->st.retries++;
            st = reserve_fitting(a, t, small, mem);
        }
    }
    if (st == FP_ERR_OUT_OF_MEMORY && !a->n_captures) {
        /* 2: wait for pending events and release the whole cache. */
        if (a->n_pending || a->n_deferred) process_events(a, 1);
        /* (also whatever other threads freed while the lock was dropped) */
        *hit = find_fit(a, pool, small, stream, rsize);
        if (*hit) return FP_OK;
        if (release_free_segments(a, -1, cmp_largest, 0, 0)) {
            a->st.retries++;
            st = reserve_fitting(a, t, small, mem);
        }
    }
    return st;
}

/* Cache miss: poll events, stream-ordered reuse, GC, reserve a segment, OOM
 * ladder. The pool is pinned while the lock may be dropped (a concurrent
 * fp_alloc_pool_end + fp_alloc_pool_release must not free it). */
static fp_status alloc_slow(fp_allocator *a, fp_pool *pool, int small, uintptr_t stream, size_t size,
                            size_t rsize, fp_block **out) {
    if (a->n_pending || a->n_deferred) {
        process_events(a, 0);
        fp_block *b = find_fit(a, pool, small, stream, rsize);
        pending_run run;
        if (!b && a->ev_wait && a->n_pending && !a->n_captures &&
            pending_run_fit(a, pool, small, stream, rsize, &run) && reclaim_run(a, &run, stream))
            b = find_fit(a, pool, small, stream, rsize);
        if (b) {
            COUNT(a, small, cache_hits);
            *out = b;
            return FP_OK;
        }
    }
    FP_TRY(check_stream(a, stream));
    COUNT(a, small, cache_misses);
    reserve_try t = {0, 0, 0, 0};
    t.seg_size = small ? FP_ALLOC_SMALL_SEGMENT
               : rsize < FP_ALLOC_MIN_LARGE_ALLOC
                   ? FP_ALLOC_LARGE_SEGMENT
                   : (rsize + FP_ALLOC_ROUND_LARGE - 1) & ~(FP_ALLOC_ROUND_LARGE - 1);
    t.fit_size = t.seg_size > rsize ? rsize : 0;
    if (!a->n_captures && a->cfg.garbage_collection_threshold > 0) {
        double limit = a->cfg.garbage_collection_threshold * (double)a->cap;
        if ((double)a->st.reserved_bytes.current + (double)a->growing_bytes + (double)t.seg_size > limit) {
            size_t target = limit > (double)t.seg_size ? (size_t)(limit - (double)t.seg_size) : 0;
            size_t before = (size_t)a->st.segment_count.current;
            release_free_segments(a, -1, cmp_oldest, target, 0);
            a->st.gc_releases += before - (size_t)a->st.segment_count.current;
        }
    }
    void *mem = NULL;
    fp_block *hit = NULL;
    /* An upstream refusal (the device upstream's cudaMalloc detail) that a
     * retry then overcomes must not stay as this successful call's message. */
    fp_error_saved saved;
    fp_error_save(&saved);
    pool->pins++;
    fp_status st = reserve_with_retries(a, pool, small, stream, rsize, &t, &mem, &hit);
    pool->pins--;
    if (hit || st == FP_OK) fp_error_restore(&saved);
    if (hit) {
        *out = hit;
        return FP_OK;
    }
    if (st == FP_OK) return segment_create(a, mem, t.got, stream, pool, small, out);
    if (st == FP_ERR_OUT_OF_MEMORY) {
        /* A message recorded since the save came from the upstream's refusals. */
        char detail[FP_ERROR_MAX / 2] = "";
        if (!t.by_cap && fp_error_seq() != saved.seq) snprintf(detail, sizeof detail, "%s", fp_last_error());
        st = oom(a, size, rsize, &t, (fp_stream)stream, detail);
    }
    pool_maybe_free(a, pool);
    return st;
}

fp_status fp_alloc_alloc(fp_allocator *a, size_t size, fp_stream stream, void **out) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(out);
    if (size == 0) {
        *out = NULL;
        return FP_OK;
    }
    FP_CHECK_ARG(size <= FP_ALLOC_MAX_REQUEST,
                 "argument 'size' (%zu) is larger than FP_ALLOC_MAX_REQUEST (overflows when rounded)",
                 size);
    size_t rsize = round_size(&a->cfg, size);
    int small = rsize <= FP_ALLOC_SMALL_SIZE;
    uintptr_t s = (uintptr_t)stream;

    lock(a);
    /* Blocks waiting on events become free at most FP_ALLOC_EVENT_POLL_INTERVAL
     * allocations after their events complete, even while every allocation
     * hits the cache (a miss polls at once). Nothing pending: one test. */
    if ((a->n_pending || a->n_deferred) && ++a->allocs_since_poll >= FP_ALLOC_EVENT_POLL_INTERVAL)
        process_events(a, 0);
    fp_pool *pool = a->n_captures ? pool_for_stream(a, s) : &a->default_pool;
    fp_block **link = fit_link(a, &pool->root[small], small, s, rsize);
    if (!small && link && pool->pend_root[0] && !a->n_captures && should_split(a, *link, rsize, 0)) {
        /* The best free block would be split: a pending block of this stream
         * that fits better is taken instead if its events completed, or, when
         * it fits whole (same-size reuse, the pattern that otherwise carves
         * the large blocks), by making the stream wait on them (see
         * reclaim_pending): a large block stays whole for the large request
         * it was made for. A looser fit is not worth a device dependency. */
        fp_block **pl = fit_link(a, &pool->pend_root[0], 0, s, rsize);
        if (pl && (*pl)->size < (*link)->size && reclaim_pending(a, *pl, s, !should_split(a, *pl, rsize, 0)))
            link = fit_link(a, &pool->root[0], 0, s, rsize);
    }
    fp_block *b = link ? take_free(a, link, small) : NULL;
    if (b) {
        COUNT(a, small, cache_hits);
    } else {
        fp_status st = alloc_slow(a, pool, small, s, size, rsize, &b);
        if (st != FP_OK) {
            unlock(a);
            return st;
        }
    }
    if (a->n_mapped >= a->n_buckets && !map_grow(a)) {
        free_insert(a, b);
        unlock(a);
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "allocator pointer map growth");
    }
    if (should_split(a, b, rsize, small)) {
        fp_block *r = block_new(a);
        if (r) {
            r->addr = b->addr + rsize;
            r->size = b->size - rsize;
            r->stream = b->stream;
            r->seg = b->seg;
            r->prev = b;
            r->next = b->next;
            if (b->next) b->next->prev = r;
            b->next = r;
            b->size = rsize;
            free_insert(a, r);
        }
    }
    if (b->size > a->max_split) a->st.oversize_allocations++;
    b->state = B_ALLOCATED;
    b->requested = size;
    map_insert(a, b);
    STAT_ADD(a, small, allocated_bytes, b->size);
    STAT_ADD(a, small, requested_bytes, size);
    STAT_ADD(a, small, allocation_count, 1);
    STAT_ADD(a, small, active_bytes, b->size);
    STAT_ADD(a, small, active_count, 1);
    ring_push(a, FP_ALLOC_EV_ALLOC, pool->id, b->addr, size, stream);
    *out = (void *)b->addr;
    unlock(a);
    return FP_OK;
}

static fp_status not_live(fp_allocator *a, uintptr_t p, const char *what) {
    for (fp_segment *s = a->segments; s; s = s->next)
        if (p >= s->base && p - s->base < s->size)
            return fp_set_error(FP_ERR_NOT_FOUND,
                                "%s: pointer %p is inside a segment of this allocator but is not "
                                "a live allocation (double free, or not the start of a block)",
                                what, (void *)p);
    return fp_set_error(FP_ERR_NOT_FOUND, "%s: pointer %p is not owned by this allocator", what,
                        (void *)p);
}

fp_status fp_alloc_free(fp_allocator *a, void *ptr) {
    FP_CHECK_NOT_NULL(a);
    if (!ptr) return FP_OK;
    lock(a);
    fp_block *b = map_remove(a, (uintptr_t)ptr);
    if (!b) {
        fp_status st = not_live(a, (uintptr_t)ptr, "fp_alloc_free");
        unlock(a);
        return st;
    }
    int cls = b->seg->is_small;
    STAT_SUB(a, cls, allocated_bytes, b->size);
    STAT_SUB(a, cls, requested_bytes, b->requested);
    STAT_SUB(a, cls, allocation_count, 1);
    ring_push(a, FP_ALLOC_EV_FREE, pool_of(b)->id, b->addr, b->requested, (fp_stream)b->stream);
    if (b->n_uses && a->have_events) {
        b->state = B_PENDING;
        a->st.pending_event_blocks++;
        if (a->n_captures) {
            (void)defer_block(a, b);
        } else {
            record_block_events(a, b);
        }
    } else {
        b->n_uses = 0;
        block_make_free(a, b);
    }
    unlock(a);
    return FP_OK;
}

fp_status fp_alloc_record_stream(fp_allocator *a, void *ptr, fp_stream stream) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(ptr);
    lock(a);
    fp_block *b = map_find(a, (uintptr_t)ptr);
    if (!b) {
        fp_status st = not_live(a, (uintptr_t)ptr, "fp_alloc_record_stream");
        unlock(a);
        return st;
    }
    fp_status st = FP_OK;
    /* The allocation stream is recorded too when events exist: device memory
     * never needs it (stream order protects it), but host memory (pinned,
     * registered) is rewritten by the CPU out of stream order, so a copy
     * queued on the block's own stream must finish before the block is
     * handed out again. */
    if ((uintptr_t)stream != b->stream || a->ev.record) {
        int seen = 0;
        for (uint16_t i = 0; i < b->n_uses; ++i) seen |= b->uses[i] == stream;
        if (!seen) {
            st = check_stream(a, (uintptr_t)stream);
            if (st != FP_OK) goto done;
        }
        if (!seen) {
            if (b->n_uses == b->cap_uses) {
                uint16_t nc = b->cap_uses ? (uint16_t)(b->cap_uses * 2) : 4;
                fp_stream *nu = nc > b->cap_uses ? realloc(b->uses, nc * sizeof *nu) : NULL;
                if (!nu) {
                    st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_alloc_record_stream: stream list");
                    goto done;
                }
                b->uses = nu;
                b->cap_uses = nc;
            }
            b->uses[b->n_uses++] = stream;
        }
        ring_push(a, FP_ALLOC_EV_RECORD_STREAM, pool_of(b)->id, b->addr, b->requested, stream);
    }
done:
    unlock(a);
    return st;
}

/* The size and stream of the live block at ptr, under the lock; `what`
 * names the caller in the not-live message. */
static fp_status live_block_info(fp_allocator *a, const void *ptr, const char *what, size_t *size,
                                 fp_stream *stream) {
    lock(a);
    fp_block *b = map_find(a, (uintptr_t)ptr);
    fp_status st = FP_OK;
    if (b) {
        if (size) *size = b->size;
        if (stream) *stream = (fp_stream)b->stream;
    } else {
        st = not_live(a, (uintptr_t)ptr, what);
    }
    unlock(a);
    return st;
}

fp_status fp_alloc_usable_size(fp_allocator *a, const void *ptr, size_t *out) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(ptr);
    FP_CHECK_NOT_NULL(out);
    return live_block_info(a, ptr, "fp_alloc_usable_size", out, NULL);
}

fp_status fp_alloc_block_stream(fp_allocator *a, const void *ptr, fp_stream *out) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(ptr);
    FP_CHECK_NOT_NULL(out);
    return live_block_info(a, ptr, "fp_alloc_block_stream", NULL, out);
}

fp_status fp_alloc_round_size(const fp_allocator *a, size_t size, size_t *out) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(out);
    FP_CHECK_ARG(size > 0, "argument 'size' is 0");
    FP_CHECK_ARG(size <= FP_ALLOC_MAX_REQUEST, "argument 'size' (%zu) is larger than FP_ALLOC_MAX_REQUEST", size);
    *out = round_size(&a->cfg, size);
    return FP_OK;
}

/* ======================================================================== */
/*  Release                                                                 */
/* ======================================================================== */

fp_status fp_alloc_trim(fp_allocator *a, size_t target_reserved) {
    FP_CHECK_NOT_NULL(a);
    lock(a);
    if (a->n_captures) {
        /* A graph may be capturing: releasing a segment would be a cudaFree
         * inside the capture (as the GC threshold and the OOM retries, trim
         * releases nothing then; PyTorch refuses empty_cache there too). */
        unlock(a);
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "fp_alloc_trim / fp_alloc_empty_cache: a private pool is active (a graph may be "
                            "capturing): nothing released; call again after fp_alloc_pool_end");
    }
    process_events(a, 0);
    release_free_segments(a, -1, cmp_oldest, target_reserved, 0);
    unlock(a);
    return FP_OK;
}

fp_status fp_alloc_empty_cache(fp_allocator *a) { return fp_alloc_trim(a, 0); }

fp_status fp_alloc_set_stream_wait(fp_allocator *a, fp_alloc_stream_wait_fn wait) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_ARG(a->have_events || !wait,
                 "fp_alloc_set_stream_wait: the allocator has no event ops (streams are synchronous)");
    lock(a);
    a->ev_wait = wait;
    unlock(a);
    return FP_OK;
}

fp_status fp_alloc_stream_wait_counts(fp_allocator *a, uint64_t *waits, uint64_t *refusals) {
    FP_CHECK_NOT_NULL(a);
    lock(a);
    if (waits) *waits = a->stream_waits;
    if (refusals) *refusals = a->stream_wait_refusals;
    unlock(a);
    return FP_OK;
}

fp_status fp_alloc_synchronize_events(fp_allocator *a) {
    FP_CHECK_NOT_NULL(a);
    lock(a);
    fp_status st = FP_OK;
    if (a->n_captures) {
        st = fp_set_error(FP_ERR_UNSUPPORTED, "fp_alloc_synchronize_events: a private pool is active");
    } else if (a->n_pending && !a->ev.synchronize) {
        st = fp_set_error(FP_ERR_UNSUPPORTED, "fp_alloc_synchronize_events: event ops lack synchronize");
    } else {
        process_events(a, 1);
    }
    unlock(a);
    return st;
}

/* ======================================================================== */
/*  Statistics, ring                                                        */
/* ======================================================================== */

fp_status fp_alloc_get_stats(fp_allocator *a, fp_alloc_stats *out) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(out);
    FP_TRY(fp_struct_size_check(out->struct_size, FP_ALLOC_STATS_SIZE_V1, sizeof *out, "fp_alloc_stats (out)"));
    fp_alloc_stats copy;
    lock(a);
    copy = a->st;
    unlock(a);
    stats_fill_derived(&copy);
    return fp_struct_write(out, &copy, FP_ALLOC_STATS_SIZE_V1, sizeof copy, "fp_alloc_stats (out)");
}

fp_status fp_alloc_reset_peak(fp_allocator *a) {
    FP_CHECK_NOT_NULL(a);
    lock(a);
    for (int c = -1; c < 2; ++c) {
        fp_alloc_stat *f[9];
        stat_fields(&a->st, c, f);
        for (int i = 0; i < 9; ++i) f[i]->peak = f[i]->current;
    }
    unlock(a);
    return FP_OK;
}

fp_status fp_alloc_read_events_sized(fp_allocator *a, fp_alloc_event *out, size_t event_size, size_t max,
                                     size_t *n, int clear) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(n);
    FP_TRY(fp_struct_size_check(event_size, FP_ALLOC_EVENT_SIZE_0_2, sizeof *out, "fp_alloc_event (event_size)"));
    FP_CHECK_ARG(out || max == 0, "argument 'out' is NULL with max %zu", max);
    if (!a->ring_cap) return fp_set_error(FP_ERR_UNSUPPORTED, "event ring is off (cfg.event_ring_size 0)");
    lock(a);
    size_t cnt = a->ring_count < max ? a->ring_count : max;
    size_t first = a->ring_count - cnt; /* most recent `cnt` */
    for (size_t i = 0; i < cnt; ++i)
        memcpy((char *)out + i * event_size, &a->ring[(a->ring_head + first + i) % a->ring_cap], event_size);
    if (clear) {
        a->ring_head = 0;
        a->ring_count = 0;
    }
    unlock(a);
    *n = cnt;
    return FP_OK;
}

fp_status(fp_alloc_read_events)(fp_allocator *a, fp_alloc_event *out, size_t max, size_t *n, int clear) {
    return fp_alloc_read_events_sized(a, out, FP_ALLOC_EVENT_SIZE_0_2, max, n, clear);
}

/* ======================================================================== */
/*  Private pools                                                           */
/* ======================================================================== */

static fp_pool *find_pool(fp_allocator *a, uint64_t id) {
    for (fp_pool *p = a->private_pools; p; p = p->next)
        if (p->id == id) return p;
    return NULL;
}

/* Index of the first released id >= id. */
static size_t released_lower_bound(const fp_allocator *a, uint64_t id) {
    size_t lo = 0, hi = a->n_released;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->released_ids[mid] < id) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int pool_id_released(const fp_allocator *a, uint64_t id) {
    size_t i = released_lower_bound(a, id);
    return i < a->n_released && a->released_ids[i] == id;
}

/* Remembers a released id (its pool struct goes with its last segment). 0
 * when the list cannot grow. */
static int remember_released(fp_allocator *a, uint64_t id) {
    if (a->n_released == a->cap_released) {
        size_t nc = a->cap_released ? a->cap_released * 2 : 16;
        uint64_t *n = realloc(a->released_ids, nc * sizeof *n);
        if (!n) return 0;
        a->released_ids = n;
        a->cap_released = nc;
    }
    size_t i = released_lower_bound(a, id);
    memmove(&a->released_ids[i + 1], &a->released_ids[i], (a->n_released - i) * sizeof *a->released_ids);
    a->released_ids[i] = id;
    a->n_released++;
    return 1;
}

fp_status fp_alloc_pool_begin(fp_allocator *a, uint64_t pool_id, fp_stream stream) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_ARG(pool_id != 0, "argument 'pool_id' is 0 (reserved for the default pool)");
    fp_status st = FP_OK;
    lock(a);
    fp_pool *p = find_pool(a, pool_id);
    for (int i = 0; i < a->n_captures; ++i)
        if (a->captures[i].stream == (uintptr_t)stream) {
            st = fp_set_error(FP_ERR_INVALID_ARGUMENT,
                              "fp_alloc_pool_begin: stream %p already allocates into pool %llu",
                              stream, (unsigned long long)a->captures[i].pool->id);
            goto done;
        }
    if ((p && p->released) || pool_id_released(a, pool_id)) {
        st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "fp_alloc_pool_begin: pool %llu was released",
                          (unsigned long long)pool_id);
        goto done;
    }
    if (a->n_captures == a->cap_captures) {
        int nc = a->cap_captures ? a->cap_captures * 2 : 4;
        capture_map *ncap = realloc(a->captures, (size_t)nc * sizeof *ncap);
        if (!ncap) {
            st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_alloc_pool_begin: capture table");
            goto done;
        }
        a->captures = ncap;
        a->cap_captures = nc;
    }
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p) {
            st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_alloc_pool_begin: pool");
            goto done;
        }
        p->id = pool_id;
        p->next = a->private_pools;
        a->private_pools = p;
    }
    p->active++;
    a->captures[a->n_captures].stream = (uintptr_t)stream;
    a->captures[a->n_captures].pool = p;
    a->n_captures++;
done:
    unlock(a);
    return st;
}

fp_status fp_alloc_pool_end(fp_allocator *a, uint64_t pool_id) {
    FP_CHECK_NOT_NULL(a);
    lock(a);
    int k = 0, found = 0;
    for (int i = 0; i < a->n_captures; ++i) {
        if (a->captures[i].pool->id == pool_id) {
            a->captures[i].pool->active--;
            found = 1;
        } else {
            a->captures[k++] = a->captures[i];
        }
    }
    a->n_captures = k;
    unlock(a);
    if (!found)
        return fp_set_error(FP_ERR_NOT_FOUND, "fp_alloc_pool_end: pool %llu is not active",
                            (unsigned long long)pool_id);
    return FP_OK;
}

fp_status fp_alloc_pool_release(fp_allocator *a, uint64_t pool_id) {
    FP_CHECK_NOT_NULL(a);
    fp_status st = FP_OK;
    lock(a);
    fp_pool *p = pool_id ? find_pool(a, pool_id) : NULL;
    if (!p || p->released) {
        st = fp_set_error(FP_ERR_NOT_FOUND, "fp_alloc_pool_release: unknown pool %llu",
                          (unsigned long long)pool_id);
    } else if (p->active) {
        st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "fp_alloc_pool_release: pool %llu is still active",
                          (unsigned long long)pool_id);
    } else if (!remember_released(a, pool_id)) {
        st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_alloc_pool_release: released-pool list");
    } else {
        p->released = 1;
        size_t left = p->n_segments;
        if (left == 0) pool_maybe_free(a, p);
        /* segment_release frees p with its last segment: stop looking at p
         * once all of its segments were visited. */
        fp_segment *s = a->segments;
        while (s && left) {
            fp_segment *nx = s->next;
            if (s->pool == p) {
                left--;
                if (segment_is_free(s)) segment_release(a, s);
            }
            s = nx;
        }
    }
    unlock(a);
    return st;
}

/* ======================================================================== */
/*  Snapshot                                                                */
/* ======================================================================== */

/* The snapshot copies these under the lock and builds the JSON after
 * dropping it (100k blocks take ~100 ms to format: other threads' allocations
 * must not wait for that). */
typedef struct snap_segment {
    uintptr_t base, stream;
    size_t size, first_block, n_blocks;
    uint64_t pool;
    int is_small;
} snap_segment;

typedef struct snap_block {
    uintptr_t addr;
    size_t size, requested;
    int state;
} snap_block;

typedef struct snapshot {
    fp_alloc_config cfg;
    size_t max_split, cap;
    fp_alloc_stats st;
    uint64_t stream_waits, stream_wait_refusals;
    snap_segment *segs;
    snap_block *blocks;
    size_t n_segs, n_blocks;
} snapshot;

static int cmp_base(const void *x, const void *y) {
    const snap_segment *a = x, *b = y;
    return a->base < b->base ? -1 : a->base > b->base;
}

/* Copies everything the snapshot shows. The arrays are allocated with the
 * lock dropped (sized from a count, then checked: blocks may have been split
 * meanwhile, and the count is taken again). FP_ERR_OUT_OF_MEMORY without
 * memory for them. */
static fp_status snapshot_copy(fp_allocator *a, snapshot *sn) {
    memset(sn, 0, sizeof *sn);
    size_t cap_segs = 0, cap_blocks = 0;
    for (;;) {
        lock(a);
        size_t ns = 0, nb = 0;
        for (fp_segment *s = a->segments; s; s = s->next) {
            ns++;
            for (fp_block *b = s->head; b; b = b->next) nb++;
        }
        if (ns <= cap_segs && nb <= cap_blocks) break; /* still locked */
        unlock(a);
        free(sn->segs);
        free(sn->blocks);
        cap_segs = ns + ns / 8 + 16;
        cap_blocks = nb + nb / 8 + 64;
        sn->segs = malloc(cap_segs * sizeof *sn->segs);
        sn->blocks = malloc(cap_blocks * sizeof *sn->blocks);
        if (!sn->segs || !sn->blocks) {
            free(sn->segs);
            free(sn->blocks);
            sn->segs = NULL;
            sn->blocks = NULL;
            return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_alloc_snapshot_json: copying %zu segments, %zu blocks",
                                ns, nb);
        }
    }
    sn->cfg = a->cfg;
    sn->max_split = a->max_split;
    sn->cap = a->cap;
    sn->st = a->st;
    sn->stream_waits = a->stream_waits;
    sn->stream_wait_refusals = a->stream_wait_refusals;
    for (fp_segment *s = a->segments; s; s = s->next) {
        snap_segment *g = &sn->segs[sn->n_segs++];
        *g = (snap_segment){s->base, s->stream, s->size, sn->n_blocks, 0, s->pool->id, s->is_small};
        for (fp_block *b = s->head; b; b = b->next, g->n_blocks++)
            sn->blocks[sn->n_blocks++] = (snap_block){b->addr, b->size, b->requested, b->state};
    }
    unlock(a);
    if (sn->n_segs > 1) qsort(sn->segs, sn->n_segs, sizeof *sn->segs, cmp_base);
    stats_fill_derived(&sn->st);
    return FP_OK;
}

static void add_hex(cJSON *o, const char *key, uintptr_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "0x%llx", (unsigned long long)v);
    cJSON_AddStringToObject(o, key, buf);
}

static void add_stat(cJSON *o, const char *key, const fp_alloc_stat *s) {
    cJSON *j = cJSON_AddObjectToObject(o, key);
    cJSON_AddNumberToObject(j, "current", (double)s->current);
    cJSON_AddNumberToObject(j, "peak", (double)s->peak);
    cJSON_AddNumberToObject(j, "total", (double)s->total);
    cJSON_AddNumberToObject(j, "freed", (double)s->freed);
}

/* The nine fp_alloc_stat fields that fp_alloc_stats and fp_alloc_pool_stats
 * share, in this order. */
static const char *const k_stat_names[9] = {
    "allocated_bytes", "requested_bytes",  "reserved_bytes", "active_bytes", "inactive_split_bytes",
    "allocation_count", "segment_count", "active_count", "inactive_split_count"};

static void add_common_stats(cJSON *o, fp_alloc_stats *s, int cls) {
    fp_alloc_stat *f[9];
    stat_fields(s, cls, f);
    for (int i = 0; i < 9; ++i) add_stat(o, k_stat_names[i], f[i]);
}

fp_status fp_alloc_snapshot_json(fp_allocator *a, char **out) {
    FP_CHECK_NOT_NULL(a);
    FP_CHECK_NOT_NULL(out);
    snapshot sn;
    FP_TRY(snapshot_copy(a, &sn));
    cJSON *root = cJSON_CreateObject();
    if (!root) goto oom;

    cJSON *cfg = cJSON_AddObjectToObject(root, "config");
    cJSON_AddNumberToObject(cfg, "max_split_size", (double)sn.max_split);
    cJSON_AddNumberToObject(cfg, "max_non_split_rounding", (double)sn.cfg.max_non_split_rounding);
    cJSON_AddNumberToObject(cfg, "cap", sn.cap == SIZE_MAX ? -1.0 : (double)sn.cap);
    cJSON_AddNumberToObject(cfg, "garbage_collection_threshold", sn.cfg.garbage_collection_threshold);
    cJSON_AddNumberToObject(cfg, "event_ring_size", (double)sn.cfg.event_ring_size);

    cJSON *st = cJSON_AddObjectToObject(root, "stats");
    fp_alloc_stats *g = &sn.st;
    add_common_stats(st, g, -1);
    cJSON_AddNumberToObject(st, "upstream_allocs", (double)g->upstream_allocs);
    cJSON_AddNumberToObject(st, "upstream_frees", (double)g->upstream_frees);
    cJSON_AddNumberToObject(st, "upstream_failures", (double)g->upstream_failures);
    cJSON_AddNumberToObject(st, "cache_hits", (double)g->cache_hits);
    cJSON_AddNumberToObject(st, "cache_misses", (double)g->cache_misses);
    cJSON_AddNumberToObject(st, "retries", (double)g->retries);
    cJSON_AddNumberToObject(st, "ooms", (double)g->ooms);
    cJSON_AddNumberToObject(st, "oversize_allocations", (double)g->oversize_allocations);
    cJSON_AddNumberToObject(st, "gc_releases", (double)g->gc_releases);
    cJSON_AddNumberToObject(st, "pending_event_blocks", (double)g->pending_event_blocks);
    cJSON_AddNumberToObject(st, "stream_waits", (double)sn.stream_waits);
    cJSON_AddNumberToObject(st, "stream_wait_refusals", (double)sn.stream_wait_refusals);
    cJSON *pools = cJSON_AddObjectToObject(st, "pools");
    for (int c = 0; c < 2; ++c) {
        const fp_alloc_pool_stats *ps = &g->pools[c];
        cJSON *jp = cJSON_AddObjectToObject(pools, c == FP_ALLOC_POOL_SMALL ? "small" : "large");
        add_common_stats(jp, g, c);
        cJSON_AddNumberToObject(jp, "upstream_allocs", (double)ps->upstream_allocs);
        cJSON_AddNumberToObject(jp, "upstream_frees", (double)ps->upstream_frees);
        cJSON_AddNumberToObject(jp, "cache_hits", (double)ps->cache_hits);
        cJSON_AddNumberToObject(jp, "cache_misses", (double)ps->cache_misses);
    }

    cJSON *segs = cJSON_AddArrayToObject(root, "segments");
    for (size_t i = 0; i < sn.n_segs; ++i) {
        const snap_segment *s = &sn.segs[i];
        cJSON *js = cJSON_CreateObject();
        if (!js) goto oom;
        cJSON_AddItemToArray(segs, js);
        add_hex(js, "address", s->base);
        cJSON_AddNumberToObject(js, "size", (double)s->size);
        add_hex(js, "stream", s->stream);
        cJSON_AddNumberToObject(js, "pool", (double)s->pool);
        cJSON_AddStringToObject(js, "kind", s->is_small ? "small" : "large");
        cJSON *blocks = cJSON_AddArrayToObject(js, "blocks");
        for (size_t k = 0; k < s->n_blocks; ++k) {
            const snap_block *b = &sn.blocks[s->first_block + k];
            cJSON *jb = cJSON_CreateObject();
            if (!jb) goto oom;
            cJSON_AddItemToArray(blocks, jb);
            add_hex(jb, "address", b->addr);
            cJSON_AddNumberToObject(jb, "size", (double)b->size);
            cJSON_AddNumberToObject(jb, "requested", b->state == B_FREE ? 0.0 : (double)b->requested);
            cJSON_AddStringToObject(jb, "state", b->state == B_FREE        ? "free"
                                                 : b->state == B_ALLOCATED ? "allocated"
                                                                           : "pending");
        }
    }
    free(sn.segs);
    free(sn.blocks);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_alloc_snapshot_json: printing");
    *out = text;
    return FP_OK;
oom:
    free(sn.segs);
    free(sn.blocks);
    cJSON_Delete(root);
    return fp_set_error(FP_ERR_OUT_OF_MEMORY, "fp_alloc_snapshot_json: building the document");
}

/* Tests: whether some thread holds a's lock now. */
int fp_alloc_lock_held(fp_allocator *a) { return atomic_load_explicit(&a->lock, memory_order_relaxed) != 0; }

void fp_alloc_json_free(char *json) { cJSON_free(json); }

/* ======================================================================== */
/*  Invariants (tests)                                                      */
/* ======================================================================== */

typedef struct tree_walk {
    size_t nodes, bytes;
    const fp_block *last;
    const char *err;
} tree_walk;

/* pend: walking a pending tree (PENDING blocks with every event recorded)
 * instead of a free tree. */
static void walk_tree(const fp_block *t, const fp_pool *pool, int small, int pend, tree_walk *w, int depth) {
    if (!t || w->err) return;
    if (depth > 10000) { w->err = "free tree too deep (cycle?)"; return; }
    if (t->left && t->left->prio > t->prio) w->err = "treap heap order violated";
    if (t->right && t->right->prio > t->prio) w->err = "treap heap order violated";
    walk_tree(t->left, pool, small, pend, w, depth + 1);
    if (w->err) return;
    if (w->last && !key_less(w->last, t->stream, t->size, t->addr)) w->err = "free tree out of order";
    if (!pend && t->state != B_FREE) w->err = "non-free block in a free tree";
    if (pend && (t->state != B_PENDING || !t->in_pend || t->deferred || t->pending_events <= 0))
        w->err = "pending tree holds a block that is not pending on recorded events";
    if (t->seg->pool != pool || t->seg->is_small != small) w->err = "block in the wrong tree";
    w->last = t;
    w->nodes++;
    w->bytes += t->size;
    walk_tree(t->right, pool, small, pend, w, depth + 1);
}

fp_status fp_alloc_check_invariants(fp_allocator *a) {
    FP_CHECK_NOT_NULL(a);
    lock(a);
    const char *err = NULL;
    size_t reserved = 0, segs = 0, alloc_b = 0, alloc_n = 0, req = 0, pend_b = 0, pend_n = 0;
    size_t free_n = 0, split_b = 0, split_n = 0, in_pend_n = 0;
    /* Per class, in the order of k_stat_names. */
    size_t cls_sum[2][9];
    memset(cls_sum, 0, sizeof cls_sum);
    for (fp_segment *s = a->segments; s && !err; s = s->next) {
        segs++;
        reserved += s->size;
        size_t *cs = cls_sum[s->is_small];
        cs[2] += s->size;
        cs[6]++;
        if (s->head->prev) err = "segment head has a prev";
        uintptr_t at = s->base;
        for (fp_block *b = s->head; b && !err; b = b->next) {
            if (b->addr != at) err = "blocks do not tile the segment (gap or overlap)";
            if (b->seg != s || b->stream != s->stream) err = "block has the wrong segment/stream";
            if (b->next && b->next->prev != b) err = "broken block links";
            if (b->size < FP_ALLOC_MIN_BLOCK || b->size % FP_ALLOC_ALIGN) err = "bad block size";
            if (b->state == B_FREE) {
                free_n++;
                if (b->next && b->next->state == B_FREE) err = "two free neighbours not coalesced";
                if (block_is_split(b)) {
                    split_b += b->size;
                    split_n++;
                    cs[4] += b->size;
                    cs[8]++;
                }
            } else if (b->state == B_ALLOCATED) {
                alloc_b += b->size;
                alloc_n++;
                req += b->requested;
                cs[0] += b->size;
                cs[1] += b->requested;
                cs[5]++;
                cs[3] += b->size;
                cs[7]++;
                if (map_find(a, b->addr) != b) err = "allocated block missing from the pointer map";
            } else {
                pend_b += b->size;
                pend_n++;
                cs[3] += b->size;
                cs[7]++;
                in_pend_n += b->in_pend;
                if (!b->deferred && b->pending_events > 0 && !b->in_pend)
                    err = "pending block with recorded events missing from its pending tree";
            }
            if (b->state != B_PENDING && b->in_pend) err = "non-pending block marked as in a pending tree";
            at += b->size;
        }
        if (!err && at != s->base + s->size) err = "blocks do not add up to the segment size";
    }
    size_t tree_nodes = 0, pend_nodes = 0;
    fp_pool *pools[1024];
    size_t np = 0;
    pools[np++] = &a->default_pool;
    for (fp_pool *p = a->private_pools; p && np < 1024; p = p->next) pools[np++] = p;
    for (size_t i = 0; i < np && !err; ++i)
        for (int small = 0; small < 2 && !err; ++small) {
            tree_walk w = {0, 0, NULL, NULL};
            walk_tree(pools[i]->root[small], pools[i], small, 0, &w, 0);
            err = w.err;
            tree_nodes += w.nodes;
            tree_walk wp = {0, 0, NULL, NULL};
            if (!err) walk_tree(pools[i]->pend_root[small], pools[i], small, 1, &wp, 0);
            if (!err) err = wp.err;
            pend_nodes += wp.nodes;
        }
    const fp_alloc_stats *st = &a->st;
    if (!err && tree_nodes != free_n) err = "free blocks and free-tree nodes differ";
    if (!err && pend_nodes != in_pend_n) err = "pending-tree nodes and blocks marked in_pend differ";
    if (!err && a->n_mapped != alloc_n) err = "pointer map count differs from allocated blocks";
    if (!err && (size_t)st->reserved_bytes.current != reserved) err = "stats: reserved_bytes";
    if (!err && (size_t)st->segment_count.current != segs) err = "stats: segment_count";
    if (!err && (size_t)st->allocated_bytes.current != alloc_b) err = "stats: allocated_bytes";
    if (!err && (size_t)st->allocation_count.current != alloc_n) err = "stats: allocation_count";
    if (!err && (size_t)st->requested_bytes.current != req) err = "stats: requested_bytes";
    if (!err && (size_t)st->active_bytes.current != alloc_b + pend_b) err = "stats: active_bytes";
    if (!err && (size_t)st->active_count.current != alloc_n + pend_n) err = "stats: active_count";
    if (!err && st->pending_event_blocks != pend_n) err = "stats: pending_event_blocks";
    if (!err && (size_t)st->inactive_split_bytes.current != split_b) err = "stats: inactive_split_bytes";
    if (!err && (size_t)st->inactive_split_count.current != split_n) err = "stats: inactive_split_count";
    /* Per pool class: currents recomputed from the blocks, and current,
     * total and freed of the two classes adding up to the aggregate. */
    fp_alloc_stats copy = *st;
    stats_fill_derived(&copy);
    fp_alloc_stat *agg[9], *cls[2][9];
    stat_fields(&copy, -1, agg);
    stat_fields(&copy, 0, cls[0]);
    stat_fields(&copy, 1, cls[1]);
    char msg[128];
    for (int i = 0; i < 9 && !err; ++i) {
        for (int c = 0; c < 2 && !err; ++c)
            if ((size_t)cls[c][i]->current != cls_sum[c][i]) {
                snprintf(msg, sizeof msg, "stats: pools[%s].%s", c ? "small" : "large", k_stat_names[i]);
                err = msg;
            }
        if (!err && (cls[0][i]->current + cls[1][i]->current != agg[i]->current ||
                     cls[0][i]->total + cls[1][i]->total != agg[i]->total ||
                     cls[0][i]->freed + cls[1][i]->freed != agg[i]->freed)) {
            snprintf(msg, sizeof msg, "stats: pools do not add up to %s", k_stat_names[i]);
            err = msg;
        }
    }
    unlock(a);
    if (err) return fp_set_error(FP_ERR_INTERNAL, "allocator invariant violated: %s", err);
    return FP_OK;
}
