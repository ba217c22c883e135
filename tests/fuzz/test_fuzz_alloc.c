/* Structured fuzz of the caching allocator (alloc.h) against a shadow model,
 * through the public header only.
 *
 * Each round builds an allocator over a random upstream (host, a caller
 * region, or a counting host upstream that refuses requests now and then)
 * with random event ops (none, or fake events completing at random) and a
 * random configuration (or a broken one, which create must refuse naming
 * the field, leaving *out untouched), then runs a random sequence of
 * alloc / free / double free / interior and foreign pointers / record_stream
 * / usable_size / round_size / empty_cache / trim / stats / snapshot / event
 * ring / private pools / NULL arguments. The shadow model checks:
 *   - every live block is 256-byte aligned, at least as large as asked,
 *     overlaps no other live block, and keeps the bytes written into it
 *     (a tag pattern checked at free) until it is freed;
 *   - bad frees and lookups fail with FP_ERR_NOT_FOUND and change nothing;
 *   - stats agree with the model (live count, requested and block bytes,
 *     reserved = what the counting upstream holds, per-class sums);
 *   - destroy returns every upstream byte and destroys every event.
 * A last phase runs alloc/free from two threads on one allocator, each with
 * its own shadow. Usage: test_fuzz_alloc [seed] [iterations]. */
#include <limits.h>
#include <pthread.h>
#include <unistd.h>

#include "fuzz_util.h"

/* ---- a counting upstream that may refuse ---- */

typedef struct up_state {
    fp_alloc_upstream inner;
    int fail_per_mille;      /* refusals per 1000 calls */
    int other_error;         /* refuse with FP_ERR_CUDA instead of OOM now and then */
    uint64_t rng;
    pthread_mutex_t mu;
    long live;               /* upstream blocks held */
    size_t live_bytes;
    void *ptrs[4096];
    size_t sizes[4096];
    int n;
    int bad_free;            /* frees of pointers never handed out, or with another size */
} up_state;

static fp_status up_alloc(void *opaque, size_t bytes, void **out) {
    up_state *u = opaque;
    pthread_mutex_lock(&u->mu);
    int refuse = (int)(fz_u64(&u->rng) % 1000) < u->fail_per_mille;
    int other = refuse && u->other_error && fz_chance(&u->rng, 1, 4);
    pthread_mutex_unlock(&u->mu);
    if (other) return FP_ERR_CUDA; /* an upstream failing for another reason: reported as is */
    if (refuse) return FP_ERR_OUT_OF_MEMORY;
    void *p = NULL;
    fp_status st = u->inner.alloc(u->inner.opaque, bytes, &p);
    if (st != FP_OK) return st;
    pthread_mutex_lock(&u->mu);
    if (u->n < 4096) {
        u->ptrs[u->n] = p;
        u->sizes[u->n] = bytes;
        u->n++;
    }
    u->live++;
    u->live_bytes += bytes;
    pthread_mutex_unlock(&u->mu);
    *out = p;
    return FP_OK;
}

static void up_free(void *opaque, void *ptr, size_t bytes) {
    up_state *u = opaque;
    pthread_mutex_lock(&u->mu);
    int found = 0;
    for (int i = 0; i < u->n; ++i)
        if (u->ptrs[i] == ptr) {
            if (u->sizes[i] != bytes) u->bad_free++;
            u->ptrs[i] = u->ptrs[u->n - 1];
            u->sizes[i] = u->sizes[u->n - 1];
            u->n--;
            found = 1;
            break;
        }
    if (!found) u->bad_free++;
    u->live--;
    u->live_bytes -= bytes;
    pthread_mutex_unlock(&u->mu);
    u->inner.free(u->inner.opaque, ptr, bytes);
}

static size_t up_total(void *opaque) {
    up_state *u = opaque;
    return u->inner.total_bytes ? u->inner.total_bytes(u->inner.opaque) : ((size_t)1 << 30);
}

/* ---- fake events ---- */

typedef struct ev_state {
    uint64_t rng;
    long created, destroyed;
    int refuse_record; /* per 10 */
} ev_state;

static fp_status ev_record(void *opaque, fp_stream stream, void **event) {
    ev_state *e = opaque;
    if (fz_chance(&e->rng, e->refuse_record, 10)) return FP_ERR_UNSUPPORTED; /* "not now" */
    long *tok = malloc(sizeof *tok);
    if (!tok) return FP_ERR_OUT_OF_MEMORY;
    *tok = (long)(fz_u64(&e->rng) % 4); /* polls until complete */
    e->created++;
    *event = tok;
    return FP_OK;
}
static int ev_query(void *opaque, void *event) {
    long *tok = event;
    if (*tok <= 0) return 1;
    --*tok;
    return 0;
}
static void ev_sync(void *opaque, void *event) { *(long *)event = 0; }
static void ev_destroy(void *opaque, void *event) {
    ev_state *e = opaque;
    e->destroyed++;
    free(event);
}

/* ---- the shadow of live blocks ---- */

#define MAX_LIVE 512
typedef struct live_block {
    unsigned char *ptr;
    size_t size, usable;
    unsigned tag;
} live_block;

typedef struct shadow {
    live_block b[MAX_LIVE];
    int n;
    unsigned next_tag;
    unsigned char *freed[64]; /* recently freed addresses (double-free candidates) */
    int n_freed;
} shadow;

static unsigned char tag_byte(unsigned tag, size_t i) { return (unsigned char)(tag * 131u + i * 7u + 1u); }

/* Writes the tag into a block: all of it when small, else head, tail and a
 * stride of probes (ASan-instrumented memset over megabytes is slow). */
static void tag_write(live_block *l) {
    const size_t n = l->size, step = n > 65536 ? 4093 : 1;
    for (size_t i = 0; i < n; i += (i < 4096 || i + 4096 >= n) ? 1 : step) l->ptr[i] = tag_byte(l->tag, i);
}
static int tag_ok(const live_block *l) {
    const size_t n = l->size, step = n > 65536 ? 4093 : 1;
    for (size_t i = 0; i < n; i += (i < 4096 || i + 4096 >= n) ? 1 : step)
        if (l->ptr[i] != tag_byte(l->tag, i)) return 0;
    return 1;
}

static int shadow_find(const shadow *sh, const void *p) {
    for (int i = 0; i < sh->n; ++i)
        if (sh->b[i].ptr == p) return i;
    return -1;
}
/* 1 if p lies inside (not at the start of) a live block. */
static int shadow_inside(const shadow *sh, const unsigned char *p) {
    for (int i = 0; i < sh->n; ++i)
        if (p >= sh->b[i].ptr && p < sh->b[i].ptr + sh->b[i].usable) return 1;
    return 0;
}

typedef struct fz_alloc {
    fz_run run;
    uint64_t rng;
    long calls;
} fz_alloc;

/* Checks a successful allocation against the shadow and adds it. */
static void shadow_add(fz_alloc *z, shadow *sh, fp_allocator *a, unsigned char *p, size_t size) {
    CHECK_MSG(p != NULL, "seed %llu iter %ld: alloc(%zu) returned FP_OK and NULL", (unsigned long long)z->run.seed,
              z->run.iter, size);
    if (!p) return;
    CHECK_MSG((uintptr_t)p % FP_ALLOC_ALIGN == 0, "seed %llu iter %ld: %p not 256-byte aligned",
              (unsigned long long)z->run.seed, z->run.iter, (void *)p);
    size_t usable = 0;
    FZ_CHECK_CALL(&z->run, "fp_alloc_usable_size (live)", fp_alloc_usable_size(a, p, &usable), FP_OK, NULL);
    CHECK_MSG(usable >= size, "seed %llu iter %ld: usable %zu < requested %zu", (unsigned long long)z->run.seed,
              z->run.iter, usable, size);
    for (int i = 0; i < sh->n; ++i) {
        const live_block *l = &sh->b[i];
        if (p < l->ptr + l->usable && l->ptr < p + usable) {
            fprintf(stderr, "seed %llu iter %ld: new block [%p, +%zu) overlaps live block [%p, +%zu)\n",
                    (unsigned long long)z->run.seed, z->run.iter, (void *)p, usable, (void *)l->ptr, l->usable);
            fp_test_failures++;
        }
    }
    live_block l = {p, size, usable, sh->next_tag++};
    tag_write(&l);
    sh->b[sh->n++] = l;
    /* a freed address handed out again is no longer a double-free candidate */
    for (int i = 0; i < sh->n_freed; ++i)
        if (sh->freed[i] >= p && sh->freed[i] < p + usable) sh->freed[i--] = sh->freed[--sh->n_freed];
}

static void shadow_free(fz_alloc *z, shadow *sh, fp_allocator *a, int i) {
    live_block l = sh->b[i];
    if (!tag_ok(&l)) {
        fprintf(stderr, "seed %llu iter %ld: block %p (%zu bytes) lost its contents while live\n",
                (unsigned long long)z->run.seed, z->run.iter, (void *)l.ptr, l.size);
        fp_test_failures++;
    }
    FZ_CHECK_CALL(&z->run, "fp_alloc_free (live)", fp_alloc_free(a, l.ptr), FP_OK, NULL);
    sh->b[i] = sh->b[--sh->n];
    if (sh->n_freed < 64) sh->freed[sh->n_freed++] = l.ptr;
}

static size_t draw_size(uint64_t *s) {
    switch (fz_range(s, 0, 19)) {
    case 0: return 0;
    case 1: return (size_t)fz_range(s, 1 << 20, 3 << 20);
    case 2: return (size_t)fz_range(s, 9 << 20, 24 << 20);
    case 3: case 4: case 5: return (size_t)fz_range(s, 4096, 300000);
    default: return (size_t)fz_range(s, 1, 4096);
    }
}

static void check_stats(fz_alloc *z, fp_allocator *a, const shadow *sh, const up_state *u) {
    fp_alloc_stats st;
    memset(&st, 0x5A, sizeof st);
    st.struct_size = sizeof st;
    if (FZ_CHECK_CALL(&z->run, "fp_alloc_get_stats", fp_alloc_get_stats(a, &st), FP_OK, NULL) != FP_OK) return;
    int64_t req = 0, blk = 0;
    for (int i = 0; i < sh->n; ++i) {
        req += (int64_t)sh->b[i].size;
        blk += (int64_t)sh->b[i].usable;
    }
    const int64_t nonzero = sh->n;
    if (st.allocation_count.current != nonzero || st.requested_bytes.current != req ||
        st.allocated_bytes.current != blk) {
        fprintf(stderr,
                "seed %llu iter %ld: stats disagree with the model: allocations %lld (model %lld), requested %lld "
                "(%lld), allocated %lld (%lld)\n",
                (unsigned long long)z->run.seed, z->run.iter, (long long)st.allocation_count.current,
                (long long)nonzero, (long long)st.requested_bytes.current, (long long)req,
                (long long)st.allocated_bytes.current, (long long)blk);
        fp_test_failures++;
    }
    if (u && st.reserved_bytes.current != (int64_t)u->live_bytes) {
        fprintf(stderr, "seed %llu iter %ld: reserved %lld but the upstream holds %zu bytes\n",
                (unsigned long long)z->run.seed, z->run.iter, (long long)st.reserved_bytes.current, u->live_bytes);
        fp_test_failures++;
    }
    CHECK_MSG(st.reserved_bytes.current >= st.allocated_bytes.current && st.allocated_bytes.peak >= st.allocated_bytes.current,
              "seed %llu iter %ld: reserved %lld < allocated %lld or peak below current",
              (unsigned long long)z->run.seed, z->run.iter, (long long)st.reserved_bytes.current,
              (long long)st.allocated_bytes.current);
    const fp_alloc_pool_stats *L = &st.pools[FP_ALLOC_POOL_LARGE], *S = &st.pools[FP_ALLOC_POOL_SMALL];
    CHECK_MSG(L->allocated_bytes.current + S->allocated_bytes.current == st.allocated_bytes.current &&
                  L->reserved_bytes.current + S->reserved_bytes.current == st.reserved_bytes.current &&
                  L->allocation_count.current + S->allocation_count.current == st.allocation_count.current,
              "seed %llu iter %ld: per-class stats do not add up to the aggregate", (unsigned long long)z->run.seed,
              z->run.iter);
    /* a bad struct_size leaves the output untouched */
    fp_alloc_stats bad;
    memset(&bad, 0x5A, sizeof bad);
    bad.struct_size = fz_chance(&z->rng, 1, 2) ? 0 : sizeof bad + 8;
    fp_alloc_stats copy = bad;
    FZ_CHECK_CALL(&z->run, "fp_alloc_get_stats (bad struct_size)", fp_alloc_get_stats(a, &bad), FP_ERR_INVALID_ARGUMENT,
                  "struct_size");
    CHECK_MSG(memcmp(&bad, &copy, sizeof bad) == 0, "seed %llu iter %ld: get_stats wrote a struct it refused",
              (unsigned long long)z->run.seed, z->run.iter);
}

/* A broken configuration for create: returns the field the message must
 * name, or NULL if the draw left the config valid. */
static const char *break_config(uint64_t *s, fp_alloc_config *c) {
    switch (fz_range(s, 0, 6)) {
    case 0: c->struct_size = fz_chance(s, 1, 2) ? 0 : sizeof *c - 8; return "struct_size";
    case 1: {
        const double bad[] = {-0.5, 1.5, NAN, INFINITY, -INFINITY};
        c->memory_fraction = bad[fz_range(s, 0, 4)];
        return "memory_fraction";
    }
    case 2: {
        const double bad[] = {-0.1, 1.0, 2.0, NAN, INFINITY};
        c->garbage_collection_threshold = bad[fz_range(s, 0, 4)];
        return "garbage_collection_threshold";
    }
    case 3: {
        const uint32_t bad[] = {3, 6, 1000, (1u << 21), 0xFFFFFFFFu};
        c->roundup_power2_divisions[fz_range(s, 0, FP_ALLOC_POW2_INTERVALS - 1)] = bad[fz_range(s, 0, 4)];
        return "roundup_power2_divisions";
    }
    case 4: c->event_ring_size = ((size_t)1 << 28) + 1 + (size_t)fz_range(s, 0, 1 << 20); return "event_ring_size";
    case 5: /* a GC threshold without a cap */
        c->memory_cap_bytes = 0;
        c->memory_fraction = 0;
        c->garbage_collection_threshold = 0.5;
        return "garbage_collection_threshold";
    default: return NULL;
    }
}

static void null_argument_calls(fz_alloc *z, fp_allocator *a) {
    void *p = NULL;
    size_t n = 0;
    fp_alloc_stats st;
    st.struct_size = sizeof st;
    char *json = NULL;
    FZ_CHECK_CALL(&z->run, "alloc(NULL a)", fp_alloc_alloc(NULL, 64, NULL, &p), FP_ERR_INVALID_ARGUMENT, "'a'");
    FZ_CHECK_CALL(&z->run, "alloc(NULL out)", fp_alloc_alloc(a, 64, NULL, NULL), FP_ERR_INVALID_ARGUMENT, "out");
    FZ_CHECK_CALL(&z->run, "free(NULL a)", fp_alloc_free(NULL, &n), FP_ERR_INVALID_ARGUMENT, "'a'");
    FZ_CHECK_CALL(&z->run, "free(NULL ptr)", fp_alloc_free(a, NULL), FP_OK, NULL);
    FZ_CHECK_CALL(&z->run, "record_stream(NULL ptr)", fp_alloc_record_stream(a, NULL, NULL), FP_ERR_INVALID_ARGUMENT, "ptr");
    FZ_CHECK_CALL(&z->run, "usable_size(NULL out)", fp_alloc_usable_size(a, &n, NULL), FP_ERR_INVALID_ARGUMENT, "out");
    FZ_CHECK_CALL(&z->run, "round_size(0)", fp_alloc_round_size(a, 0, &n), FP_ERR_INVALID_ARGUMENT, "size");
    FZ_CHECK_CALL(&z->run, "round_size(huge)", fp_alloc_round_size(a, SIZE_MAX, &n), FP_ERR_INVALID_ARGUMENT, "size");
    FZ_CHECK_CALL(&z->run, "get_stats(NULL)", fp_alloc_get_stats(a, NULL), FP_ERR_INVALID_ARGUMENT, "out");
    FZ_CHECK_CALL(&z->run, "get_stats(NULL a)", fp_alloc_get_stats(NULL, &st), FP_ERR_INVALID_ARGUMENT, "'a'");
    FZ_CHECK_CALL(&z->run, "snapshot_json(NULL out)", fp_alloc_snapshot_json(a, NULL), FP_ERR_INVALID_ARGUMENT, "out");
    FZ_CHECK_CALL(&z->run, "snapshot_json(NULL a)", fp_alloc_snapshot_json(NULL, &json), FP_ERR_INVALID_ARGUMENT, "'a'");
    FZ_CHECK_CALL(&z->run, "read_events(NULL n)", fp_alloc_read_events(a, NULL, 0, NULL, 0), FP_ERR_INVALID_ARGUMENT, "'n'");
    FZ_CHECK_CALL(&z->run, "read_events(NULL out, max 4)", fp_alloc_read_events(a, NULL, 4, &n, 0), -1, NULL);
    FZ_CHECK_CALL(&z->run, "pool_begin(0)", fp_alloc_pool_begin(a, 0, NULL), FP_ERR_INVALID_ARGUMENT, "pool_id");
    FZ_CHECK_CALL(&z->run, "pool_end(unknown)", fp_alloc_pool_end(a, 0xDEAD0000ULL), FP_ERR_NOT_FOUND, NULL);
    FZ_CHECK_CALL(&z->run, "pool_release(unknown)", fp_alloc_pool_release(a, 0xDEAD0001ULL), FP_ERR_NOT_FOUND, NULL);
    FZ_CHECK_CALL(&z->run, "trim(NULL)", fp_alloc_trim(NULL, 0), FP_ERR_INVALID_ARGUMENT, "'a'");
    FZ_CHECK_CALL(&z->run, "reset_peak(NULL)", fp_alloc_reset_peak(NULL), FP_ERR_INVALID_ARGUMENT, "'a'");
    fp_alloc_destroy(NULL);
    fp_alloc_json_free(NULL);
}

static void one_round(fz_alloc *z, int round) {
    uint64_t *s = &z->rng;
    /* upstream */
    up_state *u = calloc(1, sizeof *u);
    pthread_mutex_init(&u->mu, NULL);
    u->rng = fz_u64(s);
    void *region = NULL;
    fp_alloc_upstream region_up;
    memset(&region_up, 0, sizeof region_up);
    const int kind = (int)fz_range(s, 0, 2);
    if (kind == 1) {
        size_t bytes = (size_t)fz_range(s, 1 << 16, 48 << 20);
        region = malloc(bytes);
        size_t skew = (size_t)fz_range(s, 0, 255);
        FZ_CHECK_CALL(&z->run, "fp_alloc_upstream_region", fp_alloc_upstream_region((char *)region + skew, bytes - skew, &region_up),
                      FP_OK, NULL);
        u->inner = region_up;
    } else {
        u->inner = fp_alloc_upstream_host();
    }
    u->fail_per_mille = kind == 2 ? (int)fz_range(s, 0, 300) : 0;
    u->other_error = kind == 2 && fz_chance(s, 1, 3);
    fp_alloc_upstream up = {up_alloc, up_free, up_total, u};
    /* events */
    ev_state ev = {fz_u64(s), 0, 0, (int)fz_range(s, 0, 3)};
    fp_alloc_event_ops ops = {ev_record, ev_query, fz_chance(s, 1, 2) ? ev_sync : NULL, ev_destroy, NULL, &ev};
    const int with_events = fz_chance(s, 1, 2);
    /* configuration */
    fp_alloc_config cfg;
    fp_alloc_config_default(&cfg);
    if (fz_chance(s, 1, 2)) cfg.max_split_size = (size_t)fz_range(s, 1, 64) << 20;
    if (fz_chance(s, 1, 3)) cfg.memory_cap_bytes = (size_t)fz_range(s, 1 << 20, 96 << 20);
    if (fz_chance(s, 1, 4)) cfg.memory_fraction = fz_uniform(s, 0.001, 1.0);
    if ((cfg.memory_cap_bytes || cfg.memory_fraction > 0) && fz_chance(s, 1, 2))
        cfg.garbage_collection_threshold = fz_uniform(s, 0.0, 0.99);
    if (fz_chance(s, 1, 3))
        CHECK_OK(fp_alloc_config_set_divisions(&cfg, (size_t)fz_range(s, 0, 1 << 20), (size_t)fz_range(s, 1 << 20, 1 << 26),
                                               1u << fz_range(s, 0, 4)));
    if (fz_chance(s, 1, 2)) cfg.event_ring_size = (size_t)fz_range(s, 1, 300);
    /* a broken config first: refused, *out untouched */
    fp_alloc_config bad = cfg;
    const char *field = break_config(s, &bad);
    if (field) {
        fp_allocator *sentinel = (fp_allocator *)(uintptr_t)0x5150;
        FZ_CHECK_CALL(&z->run, "fp_alloc_create (broken config)", fp_alloc_create(&up, with_events ? &ops : NULL, &bad, &sentinel),
                      FP_ERR_INVALID_ARGUMENT, field);
        CHECK(sentinel == (fp_allocator *)(uintptr_t)0x5150);
    }
    fp_alloc_config div = cfg;
    FZ_CHECK_CALL(&z->run, "fp_alloc_config_set_divisions (not a power of two)",
                  fp_alloc_config_set_divisions(&div, 0, 1, (uint32_t)(3 + 2 * fz_range(s, 0, 100))), -1, "divisions");
    FZ_CHECK_CALL(&z->run, "fp_alloc_config_set_divisions (lo > hi)", fp_alloc_config_set_divisions(&div, 2, 1, 2), -1,
                  "lo_bytes");
    CHECK(memcmp(&div, &cfg, sizeof div) == 0);
    fp_allocator *a = NULL;
    if (FZ_CHECK_CALL(&z->run, "fp_alloc_create", fp_alloc_create(&up, with_events ? &ops : NULL, &cfg, &a), FP_OK, NULL) != FP_OK) {
        if (region) fp_alloc_upstream_release(&region_up);
        free(region);
        free(u);
        return;
    }
    shadow *sh = calloc(1, sizeof *sh);
    sh->next_tag = (unsigned)round * 1000u;
    uint64_t active_pool = 0, pools_made = 0;
    const int ops_n = (int)fz_range(s, 50, 400);
    for (int k = 0; k < ops_n && !fz_too_many_failures(); ++k, ++z->calls) {
        const int op = (int)fz_range(s, 0, 29);
        fp_clear_error();
        if (op < 12) { /* alloc */
            if (sh->n >= MAX_LIVE) continue;
            size_t size = fz_chance(s, 1, 40) ? (fz_chance(s, 1, 2) ? SIZE_MAX - (size_t)fz_range(s, 0, 4096)
                                                                   : FP_ALLOC_MAX_REQUEST + 1)
                                              : draw_size(s);
            void *p = (void *)(uintptr_t)0x77;
            fp_stream stream = (fp_stream)(uintptr_t)fz_range(s, 0, 2);
            fp_status st = fp_alloc_alloc(a, size, stream, &p);
            if (size > FP_ALLOC_MAX_REQUEST) {
                FZ_CHECK_CALL(&z->run, "fp_alloc_alloc (too large)", st, FP_ERR_INVALID_ARGUMENT, "size");
                CHECK(p == (void *)(uintptr_t)0x77);
            } else if (size == 0) {
                FZ_CHECK_CALL(&z->run, "fp_alloc_alloc (0)", st, FP_OK, NULL);
                CHECK(p == NULL);
            } else if (st == FP_OK) {
                shadow_add(z, sh, a, p, size);
            } else {
                /* out of memory (cap, region, refusing upstream) or the upstream's own status */
                FZ_CHECK_CALL(&z->run, "fp_alloc_alloc", st, -1, NULL);
                CHECK_MSG(st == FP_ERR_OUT_OF_MEMORY || st == FP_ERR_CUDA, "seed %llu iter %ld: alloc failed with '%s': %s",
                          (unsigned long long)z->run.seed, z->run.iter, fp_status_string(st), fp_last_error());
                CHECK(p == (void *)(uintptr_t)0x77);
            }
        } else if (op < 19) { /* free a live block */
            if (sh->n) shadow_free(z, sh, a, (int)fz_range(s, 0, sh->n - 1));
        } else if (op == 19) { /* double free / stale pointer */
            if (!sh->n_freed) continue;
            unsigned char *p = sh->freed[fz_range(s, 0, sh->n_freed - 1)];
            if (shadow_find(sh, p) >= 0 || shadow_inside(sh, p)) continue;
            fp_status st = fp_alloc_free(a, p);
            FZ_CHECK_CALL(&z->run, "fp_alloc_free (already freed)", st, FP_ERR_NOT_FOUND, NULL);
            CHECK_MSG(strstr(fp_last_error(), "double free") || strstr(fp_last_error(), "not owned"),
                      "seed %llu iter %ld: double free message: %s", (unsigned long long)z->run.seed, z->run.iter,
                      fp_last_error());
        } else if (op == 20) { /* interior pointer of a live block */
            if (!sh->n) continue;
            live_block *l = &sh->b[fz_range(s, 0, sh->n - 1)];
            unsigned char *p = l->ptr + fz_range(s, 1, (int64_t)l->usable - 1);
            FZ_CHECK_CALL(&z->run, "fp_alloc_free (interior)", fp_alloc_free(a, p), FP_ERR_NOT_FOUND, NULL);
            size_t us = 12345;
            FZ_CHECK_CALL(&z->run, "fp_alloc_usable_size (interior)", fp_alloc_usable_size(a, p, &us), FP_ERR_NOT_FOUND, NULL);
            CHECK(us == 12345);
            FZ_CHECK_CALL(&z->run, "fp_alloc_record_stream (interior)", fp_alloc_record_stream(a, p, NULL), FP_ERR_NOT_FOUND, NULL);
        } else if (op == 21) { /* foreign pointers */
            int local = 0;
            void *heap = malloc(64);
            void *foreign[] = {&local, heap, (void *)(uintptr_t)0x1000, (void *)(uintptr_t)(UINTPTR_MAX - 255)};
            void *p = foreign[fz_range(s, 0, 3)];
            FZ_CHECK_CALL(&z->run, "fp_alloc_free (foreign)", fp_alloc_free(a, p), FP_ERR_NOT_FOUND, NULL);
            CHECK_MSG(strstr(fp_last_error(), "not owned") != NULL, "seed %llu iter %ld: foreign free message: %s",
                      (unsigned long long)z->run.seed, z->run.iter, fp_last_error());
            free(heap);
        } else if (op == 22) { /* record_stream on a live block */
            if (!sh->n) continue;
            live_block *l = &sh->b[fz_range(s, 0, sh->n - 1)];
            FZ_CHECK_CALL(&z->run, "fp_alloc_record_stream", fp_alloc_record_stream(a, l->ptr, (fp_stream)(uintptr_t)fz_range(s, 0, 5)),
                          FP_OK, NULL);
        } else if (op == 23) {
            fp_status st = fz_chance(s, 1, 2) ? fp_alloc_empty_cache(a) : fp_alloc_trim(a, (size_t)fz_range(s, 0, 64 << 20));
            FZ_CHECK_CALL(&z->run, "fp_alloc_empty_cache / trim", st, active_pool ? FP_ERR_UNSUPPORTED : FP_OK, NULL);
        } else if (op == 24) {
            check_stats(z, a, sh, u);
        } else if (op == 25) {
            char *json = NULL;
            if (FZ_CHECK_CALL(&z->run, "fp_alloc_snapshot_json", fp_alloc_snapshot_json(a, &json), FP_OK, NULL) == FP_OK) {
                CHECK(json && json[0] == '{');
                fp_alloc_json_free(json);
            }
        } else if (op == 26) {
            fp_alloc_event evs[64];
            size_t n = 999;
            fp_status st = fp_alloc_read_events(a, evs, (size_t)fz_range(s, 0, 64), &n, fz_chance(s, 1, 2));
            FZ_CHECK_CALL(&z->run, "fp_alloc_read_events", st, cfg.event_ring_size ? FP_OK : FP_ERR_UNSUPPORTED, NULL);
        } else if (op == 27) { /* private pools */
            if (!active_pool) {
                uint64_t id = ++pools_made;
                if (FZ_CHECK_CALL(&z->run, "fp_alloc_pool_begin", fp_alloc_pool_begin(a, id, (fp_stream)(uintptr_t)fz_range(s, 0, 2)),
                                  FP_OK, NULL) == FP_OK)
                    active_pool = id;
            } else {
                FZ_CHECK_CALL(&z->run, "fp_alloc_pool_release (active)", fp_alloc_pool_release(a, active_pool),
                              FP_ERR_INVALID_ARGUMENT, NULL);
                FZ_CHECK_CALL(&z->run, "fp_alloc_pool_end", fp_alloc_pool_end(a, active_pool), FP_OK, NULL);
                if (fz_chance(s, 1, 2))
                    FZ_CHECK_CALL(&z->run, "fp_alloc_pool_release", fp_alloc_pool_release(a, active_pool), FP_OK, NULL);
                active_pool = 0;
            }
        } else if (op == 28) {
            size_t r = 0, size = draw_size(s);
            if (size) {
                FZ_CHECK_CALL(&z->run, "fp_alloc_round_size", fp_alloc_round_size(a, size, &r), FP_OK, NULL);
                CHECK(r >= size && r % FP_ALLOC_ALIGN == 0);
            }
        } else {
            null_argument_calls(z, a);
            if (with_events && ops.synchronize)
                FZ_CHECK_CALL(&z->run, "fp_alloc_synchronize_events", fp_alloc_synchronize_events(a),
                              active_pool ? FP_ERR_UNSUPPORTED : FP_OK, NULL);
        }
    }
    if (active_pool) FZ_CHECK_CALL(&z->run, "fp_alloc_pool_end", fp_alloc_pool_end(a, active_pool), FP_OK, NULL);
    check_stats(z, a, sh, u);
    /* free most, then destroy with a few live blocks: everything returns */
    while (sh->n > (fz_chance(s, 1, 2) ? 3 : 0)) shadow_free(z, sh, a, sh->n - 1);
    if (!sh->n) {
        fp_alloc_stats st;
        st.struct_size = sizeof st;
        CHECK_OK(fp_alloc_get_stats(a, &st));
        CHECK(st.allocated_bytes.current == 0 && st.allocation_count.current == 0 && st.requested_bytes.current == 0);
    }
    fp_alloc_destroy(a);
    CHECK_MSG(u->live == 0 && u->live_bytes == 0 && u->bad_free == 0,
              "seed %llu round %d: after destroy the upstream still holds %ld blocks / %zu bytes (%d bad frees)",
              (unsigned long long)z->run.seed, round, u->live, u->live_bytes, u->bad_free);
    CHECK_MSG(ev.created == ev.destroyed, "seed %llu round %d: %ld events created, %ld destroyed",
              (unsigned long long)z->run.seed, round, ev.created, ev.destroyed);
    if (region) fp_alloc_upstream_release(&region_up);
    free(region);
    pthread_mutex_destroy(&u->mu);
    free(u);
    free(sh);
}


/* ---- upstreams that break their contract, and trace replays ---- */

typedef struct rogue { int mode; } rogue; /* 0: FP_ERR_CUDA, 1: 99, 2: FP_OK and NULL */
static fp_status rogue_alloc(void *opaque, size_t bytes, void **out) {
    const rogue *r = opaque;
    if (r->mode == 0) return FP_ERR_CUDA; /* no message: a caller's upstream cannot set one */
    if (r->mode == 1) return (fp_status)99;
    *out = NULL;
    return FP_OK;
}
static void rogue_free(void *opaque, void *ptr, size_t bytes) {}

/* An upstream's failure reaches the caller with a status from the enum and
 * a message, through fp_alloc_alloc and fp_alloc_trace_replay_direct, and a
 * failed replay leaves its result untouched. */
static void upstream_contract(fz_alloc *z) {
    fp_alloc_trace *t = NULL;
    fp_alloc_trace_config tc;
    fp_alloc_trace_config_default(&tc);
    tc.layers = 2;
    tc.steps = 1;
    tc.hidden = 64;
    tc.max_seq = 32;
    CHECK_OK(fp_alloc_trace_generate(&tc, &t));
    for (int mode = 0; mode < 3; ++mode) {
        rogue r = {mode};
        fp_alloc_upstream up = {rogue_alloc, rogue_free, NULL, &r};
        fp_allocator *a = NULL;
        CHECK_OK(fp_alloc_create(&up, NULL, NULL, &a));
        void *p = (void *)(uintptr_t)0x99;
        fp_clear_error();
        fp_status st = fp_alloc_alloc(a, 1000, NULL, &p);
        FZ_CHECK_CALL(&z->run, "fp_alloc_alloc over a rogue upstream", st, -1, NULL);
        CHECK_MSG(p == (void *)(uintptr_t)0x99, "mode %d: *out written on failure", mode);
        fp_alloc_replay_result res;
        memset(&res, 0x3C, sizeof res);
        res.struct_size = sizeof res;
        fp_alloc_replay_result before = res;
        if (t) {
            st = fp_alloc_trace_replay_direct(&up, t, 0, &res);
            FZ_CHECK_CALL(&z->run, "fp_alloc_trace_replay_direct over a rogue upstream", st, -1, NULL);
            CHECK_MSG(memcmp(&res, &before, sizeof res) == 0, "mode %d: replay_direct wrote its result on failure", mode);
            st = fp_alloc_trace_replay(a, t, NULL, fz_chance(&z->rng, 1, 2), &res);
            FZ_CHECK_CALL(&z->run, "fp_alloc_trace_replay over a rogue upstream", st, -1, NULL);
            CHECK_MSG(memcmp(&res, &before, sizeof res) == 0, "mode %d: replay wrote its result on failure", mode);
        }
        fp_alloc_destroy(a);
    }
    /* malformed traces: refused before anything runs, result untouched */
    if (t && t->n_ops > 4) {
        fp_alloc_upstream host = fp_alloc_upstream_host();
        fp_allocator *a = NULL;
        CHECK_OK(fp_alloc_create(&host, NULL, NULL, &a));
        for (int k = 0; k < 5; ++k) {
            fp_alloc_trace bad = *t;
            bad.ops = malloc(t->n_ops * sizeof *bad.ops);
            memcpy(bad.ops, t->ops, t->n_ops * sizeof *bad.ops);
            size_t i = (size_t)fz_range(&z->rng, 0, (int64_t)t->n_ops - 1);
            const char *name = "trace";
            if (k == 0) bad.ops[i].kind = 7;
            else if (k == 1) bad.ops[i].slot = t->n_slots + (uint32_t)fz_range(&z->rng, 0, 9);
            else if (k == 2) { bad.ops[i].kind = FP_ALLOC_TRACE_ALLOC; bad.ops[i].stream = (uint8_t)t->n_streams; }
            else if (k == 3) bad.n_streams = 257;
            else { /* the same slot allocated twice */
                size_t j = 0;
                while (j < t->n_ops && t->ops[j].kind != FP_ALLOC_TRACE_ALLOC) ++j;
                if (j + 1 >= t->n_ops) { free(bad.ops); continue; }
                bad.ops[j + 1] = bad.ops[j];
                name = "slot";
            }
            fp_alloc_replay_result res;
            memset(&res, 0x3C, sizeof res);
            res.struct_size = sizeof res;
            fp_alloc_replay_result before = res;
            FZ_CHECK_CALL(&z->run, "fp_alloc_trace_replay (malformed)", fp_alloc_trace_replay(a, &bad, NULL, 0, &res),
                          FP_ERR_INVALID_ARGUMENT, k == 4 ? name : NULL);
            CHECK_MSG(memcmp(&res, &before, sizeof res) == 0, "malformed trace %d: result written", k);
            FZ_CHECK_CALL(&z->run, "fp_alloc_trace_replay_direct (malformed)",
                          fp_alloc_trace_replay_direct(&host, &bad, 0, &res), FP_ERR_INVALID_ARGUMENT, k == 4 ? name : NULL);
            CHECK_MSG(memcmp(&res, &before, sizeof res) == 0, "malformed trace %d: direct result written", k);
            free(bad.ops);
        }
        fp_alloc_stats st;
        st.struct_size = sizeof st;
        CHECK_OK(fp_alloc_get_stats(a, &st));
        CHECK(st.allocation_count.current == 0);
        fp_alloc_destroy(a);
    }
    fp_alloc_trace_destroy(t);
    fp_alloc_trace_destroy(NULL);
}


/* CUDA-backed upstreams and event ops, the PyTorch entry points and a
 * context's allocator: without a device (CI, the ASan build) every one fails
 * cleanly with a status and a message, its output untouched; with one they
 * must work. Also the region upstream's argument checks. */
static void device_edges(fz_alloc *z) {
    int count = 0;
    CHECK_OK(fp_device_count(&count));
    const int dev[] = {0, -1, 7, INT_MAX};
    for (int i = 0; i < 4; ++i) {
        const int exists = dev[i] >= 0 && dev[i] < count;
        fp_alloc_upstream up;
        memset(&up, 0x5A, sizeof up);
        fp_alloc_upstream keep = up;
        fp_status st = fp_alloc_upstream_device(dev[i], &up);
        FZ_CHECK_CALL(&z->run, "fp_alloc_upstream_device", st, exists ? FP_OK : FP_ERR_NO_DEVICE, NULL);
        if (st != FP_OK) CHECK(memcmp(&up, &keep, sizeof up) == 0);
        st = fp_alloc_upstream_pinned(dev[i], &up);
        FZ_CHECK_CALL(&z->run, "fp_alloc_upstream_pinned", st, exists ? FP_OK : FP_ERR_NO_DEVICE, NULL);
        fp_alloc_event_ops ev;
        memset(&ev, 0x5A, sizeof ev);
        fp_alloc_event_ops evkeep = ev;
        st = fp_alloc_event_ops_cuda(dev[i], &ev);
        FZ_CHECK_CALL(&z->run, "fp_alloc_event_ops_cuda", st, exists ? FP_OK : FP_ERR_NO_DEVICE, NULL);
        if (st != FP_OK) CHECK(memcmp(&ev, &evkeep, sizeof ev) == 0);
        char region[4096];
        memset(&up, 0x5A, sizeof up);
        st = fp_alloc_upstream_registered(dev[i], region, sizeof region, &up);
        FZ_CHECK_CALL(&z->run, "fp_alloc_upstream_registered", st, -2, NULL);
        if (st == FP_OK) fp_alloc_upstream_release(&up);
        else CHECK(memcmp(&up, &keep, sizeof up) == 0);
        if (!exists) {
            fp_clear_error();
            void *p = fp_torch_malloc(4096, dev[i], NULL);
            CHECK_MSG(p == NULL && fp_last_error()[0], "fp_torch_malloc without device %d: %p, '%s'", dev[i], p,
                      fp_last_error());
            fp_allocator *a = (fp_allocator *)(uintptr_t)0x31;
            FZ_CHECK_CALL(&z->run, "fp_torch_allocator_get (no device)", fp_torch_allocator_get(dev[i], &a), -1, NULL);
            CHECK(a == (fp_allocator *)(uintptr_t)0x31);
        }
    }
    int local = 0;
    fp_torch_free(NULL, 0, 0, NULL);
    fp_torch_free(&local, 4, 0, NULL); /* not ours: ignored */
    fp_torch_record_stream(NULL, NULL);
    fp_torch_record_stream(&local, NULL);
    fp_torch_empty_cache();
    CHECK(fp_torch_malloc(0, 0, NULL) == NULL);
    fp_clear_error();
    CHECK(fp_torch_malloc(-5, 0, NULL) == NULL && fp_last_error()[0]);
    fp_alloc_config bad;
    fp_alloc_config_default(&bad);
    bad.memory_fraction = NAN;
    FZ_CHECK_CALL(&z->run, "fp_torch_allocator_configure (bad)", fp_torch_allocator_configure(&bad), FP_ERR_INVALID_ARGUMENT,
                  "memory_fraction");
    FZ_CHECK_CALL(&z->run, "fp_torch_allocator_get(NULL)", fp_torch_allocator_get(0, NULL), FP_ERR_INVALID_ARGUMENT, "out");
    /* the region upstream */
    fp_alloc_upstream up;
    memset(&up, 0x5A, sizeof up);
    fp_alloc_upstream keep = up;
    char small[500]; /* < FP_ALLOC_MIN_BLOCK usable bytes at any alignment */
    FZ_CHECK_CALL(&z->run, "fp_alloc_upstream_region(NULL)", fp_alloc_upstream_region(NULL, 1 << 20, &up),
                  FP_ERR_INVALID_ARGUMENT, "base");
    FZ_CHECK_CALL(&z->run, "fp_alloc_upstream_region(too small)", fp_alloc_upstream_region(small, sizeof small, &up),
                  FP_ERR_INVALID_ARGUMENT, NULL);
    FZ_CHECK_CALL(&z->run, "fp_alloc_upstream_region(wrapping)", fp_alloc_upstream_region(small, SIZE_MAX - 16, &up),
                  FP_ERR_INVALID_ARGUMENT, NULL);
    FZ_CHECK_CALL(&z->run, "fp_alloc_upstream_region(NULL out)", fp_alloc_upstream_region(small, sizeof small, NULL),
                  FP_ERR_INVALID_ARGUMENT, "out");
    CHECK(memcmp(&up, &keep, sizeof up) == 0);
    fp_alloc_upstream_release(NULL);
    fp_alloc_upstream host = fp_alloc_upstream_host();
    fp_alloc_upstream_release(&host); /* not a region: no-op */
    /* a CPU context's allocator: the host upstream */
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, -1, &ctx));
    fp_allocator *a = NULL;
    FZ_CHECK_CALL(&z->run, "fp_alloc_create_for_context(CPU)", fp_alloc_create_for_context(ctx, NULL, &a), FP_OK, NULL);
    void *p = NULL;
    if (a) {
        CHECK_OK(fp_alloc_alloc(a, 1000, NULL, &p));
        CHECK_OK(fp_alloc_free(a, p));
        fp_alloc_destroy(a);
    }
    FZ_CHECK_CALL(&z->run, "fp_alloc_create_for_context(NULL)", fp_alloc_create_for_context(NULL, NULL, &a),
                  FP_ERR_INVALID_ARGUMENT, "ctx");
    fp_context_destroy(ctx);
    FZ_CHECK_CALL(&z->run, "fp_alloc_create(NULL upstream)", fp_alloc_create(NULL, NULL, NULL, &a), FP_ERR_INVALID_ARGUMENT,
                  "upstream");
    fp_alloc_upstream half = {NULL, NULL, NULL, NULL};
    FZ_CHECK_CALL(&z->run, "fp_alloc_create(upstream without alloc)", fp_alloc_create(&half, NULL, NULL, &a),
                  FP_ERR_INVALID_ARGUMENT, "upstream");
    fp_alloc_event_ops noev;
    memset(&noev, 0, sizeof noev);
    FZ_CHECK_CALL(&z->run, "fp_alloc_create(event ops without record)", fp_alloc_create(&host, &noev, NULL, &a),
                  FP_ERR_INVALID_ARGUMENT, "events");
}


/* Traces from event arrays: the allocator's own ring (replayed on a fresh
 * allocator) and garbage (built or refused cleanly, never a hang); an event
 * count no array can hold is refused at once. */
static void traces_from_events(fz_alloc *z) {
    uint64_t *s = &z->rng;
    fp_alloc_event ev[256];
    const size_t n = (size_t)fz_range(s, 0, 256);
    const uintptr_t ptrs[] = {0, 1, 256, 512, 4096, UINTPTR_MAX, UINTPTR_MAX - 255};
    for (size_t i = 0; i < n; ++i) {
        ev[i].seq = i;
        ev[i].kind = (uint32_t)fz_range(s, 0, 7);
        ev[i].pool = (uint32_t)fz_range(s, 0, 2);
        ev[i].ptr = ptrs[fz_range(s, 0, 6)];
        ev[i].size = (size_t)fz_range(s, 0, 1 << 20);
        ev[i].stream = (fp_stream)(uintptr_t)fz_range(s, 0, 300);
    }
    fp_alloc_trace *t = (fp_alloc_trace *)(uintptr_t)0x42;
    fp_status st = fp_alloc_trace_from_events(ev, n, &t);
    FZ_CHECK_CALL(&z->run, "fp_alloc_trace_from_events (garbage)", st, -2, NULL);
    if (st == FP_OK) {
        fp_alloc_upstream host = fp_alloc_upstream_host();
        fp_allocator *a = NULL;
        CHECK_OK(fp_alloc_create(&host, NULL, NULL, &a));
        fp_alloc_replay_result res;
        memset(&res, 0, sizeof res);
        res.struct_size = sizeof res;
        FZ_CHECK_CALL(&z->run, "fp_alloc_trace_replay (trace from garbage events)", fp_alloc_trace_replay(a, t, NULL, 0, &res),
                      -2, NULL);
        fp_alloc_stats stt;
        stt.struct_size = sizeof stt;
        CHECK_OK(fp_alloc_get_stats(a, &stt));
        CHECK(stt.allocation_count.current == 0);
        fp_alloc_destroy(a);
        fp_alloc_trace_destroy(t);
    } else {
        CHECK(t == (fp_alloc_trace *)(uintptr_t)0x42);
    }
    const size_t huge[] = {SIZE_MAX, SIZE_MAX / 2, (size_t)1 << 62, SIZE_MAX / sizeof(fp_alloc_event) + 1};
    t = (fp_alloc_trace *)(uintptr_t)0x42;
    FZ_CHECK_CALL(&z->run, "fp_alloc_trace_from_events (impossible n)",
                  fp_alloc_trace_from_events(ev, huge[fz_range(s, 0, 3)], &t), FP_ERR_INVALID_ARGUMENT, "'n'");
    CHECK(t == (fp_alloc_trace *)(uintptr_t)0x42);
    FZ_CHECK_CALL(&z->run, "fp_alloc_trace_from_events(NULL, 3)", fp_alloc_trace_from_events(NULL, 3, &t),
                  FP_ERR_INVALID_ARGUMENT, "events");
}

/* ---- two threads on one allocator ---- */

typedef struct thread_arg {
    fp_allocator *a;
    fz_alloc z;
    int id;
} thread_arg;

static void *thread_main(void *arg) {
    thread_arg *t = arg;
    shadow *sh = calloc(1, sizeof *sh);
    sh->next_tag = 100000u * (unsigned)(t->id + 1);
    for (int k = 0; k < 3000; ++k) {
        if (sh->n < 64 && fz_chance(&t->z.rng, 1, 2)) {
            size_t size = (size_t)fz_range(&t->z.rng, 1, fz_chance(&t->z.rng, 1, 10) ? 3 << 20 : 8192);
            void *p = NULL;
            fp_status st = fp_alloc_alloc(t->a, size, (fp_stream)(uintptr_t)t->id, &p);
            if (st == FP_OK) {
                live_block l = {p, size, size, sh->next_tag++};
                tag_write(&l);
                sh->b[sh->n++] = l;
            } else {
                FZ_CHECK_CALL(&t->z.run, "fp_alloc_alloc (threads)", st, FP_ERR_OUT_OF_MEMORY, NULL);
            }
        } else if (sh->n) {
            int i = (int)fz_range(&t->z.rng, 0, sh->n - 1);
            if (!tag_ok(&sh->b[i])) {
                fprintf(stderr, "thread %d: block %p lost its contents (another thread's block overlaps it?)\n",
                        t->id, (void *)sh->b[i].ptr);
                fp_test_failures++;
            }
            FZ_CHECK_CALL(&t->z.run, "fp_alloc_free (threads)", fp_alloc_free(t->a, sh->b[i].ptr), FP_OK, NULL);
            sh->b[i] = sh->b[--sh->n];
        }
    }
    while (sh->n) {
        fp_alloc_free(t->a, sh->b[sh->n - 1].ptr);
        sh->n--;
    }
    free(sh);
    return NULL;
}

static void threads_phase(fz_alloc *z) {
    fp_alloc_upstream up = fp_alloc_upstream_host();
    fp_alloc_config cfg;
    fp_alloc_config_default(&cfg);
    cfg.memory_cap_bytes = 64 << 20;
    fp_allocator *a = NULL;
    CHECK_OK(fp_alloc_create(&up, NULL, &cfg, &a));
    if (!a) return;
    pthread_t th[2];
    thread_arg args[2];
    for (int i = 0; i < 2; ++i) {
        args[i].a = a;
        args[i].z = *z;
        args[i].z.rng = fz_u64(&z->rng);
        args[i].id = i;
        pthread_create(&th[i], NULL, thread_main, &args[i]);
    }
    for (int i = 0; i < 2; ++i) pthread_join(th[i], NULL);
    fp_alloc_stats st;
    st.struct_size = sizeof st;
    CHECK_OK(fp_alloc_get_stats(a, &st));
    CHECK(st.allocation_count.current == 0 && st.allocated_bytes.current == 0);
    fp_alloc_destroy(a);
}

int main(int argc, char **argv) {
    fz_alloc z;
    memset(&z, 0, sizeof z);
    z.run = fz_run_init(argc, argv, 0x616c6c6fULL, 120, 4.0);
    z.rng = z.run.seed * 0x9E3779B97F4A7C15ULL + 13;
    alarm(120); /* a hang fails with SIGALRM rather than only at CTest's timeout */
    for (; fz_more(&z.run) && !fz_too_many_failures(); ++z.run.iter) one_round(&z, (int)z.run.iter);
    const long rounds = z.run.iter;
    upstream_contract(&z);
    device_edges(&z);
    for (int i = 0; i < 50; ++i) traces_from_events(&z);
    threads_phase(&z);
    printf("alloc fuzz: %ld rounds, %ld operations, plus a two-thread phase\n", rounds, z.calls);
    TEST_END();
}
