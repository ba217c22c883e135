/* The CUPTI collector of CUDA spans (trace_cupti.h). */
#include "trace/trace_cupti.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

uint64_t fp_cupti_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#ifndef FP_HAVE_CUPTI

fp_status fp_cupti_load(void) {
    return fp_set_error(FP_ERR_UNSUPPORTED, "trace: libfastpath was built without CUPTI's headers "
                                            "(cupti_activity.h): only the event timer is available");
}
const char *fp_cupti_from(void) { return ""; }
fp_status fp_cupti_attach(uint32_t *index) {
    *index = 0;
    return fp_cupti_load();
}
void fp_cupti_detach(uint32_t index) { (void)index; }
int fp_cupti_push(uint32_t index, uint64_t seq) {
    (void)index;
    (void)seq;
    return 0;
}
void fp_cupti_pop(void) {}
void fp_cupti_flush(void) {}
fp_cupti_rec *fp_cupti_take(uint32_t index, size_t *n) {
    (void)index;
    *n = 0;
    return NULL;
}
uint64_t fp_cupti_lost(void) { return 0; }

#else

#include <cupti.h>
#include <dlfcn.h>

/* Required entry points (CUPTI 12 and 13 have them all). */
#define FP_CUPTI_FUNCS(X)                                                                                   \
    X(cuptiGetVersion) X(cuptiGetResultString) X(cuptiActivityEnable) X(cuptiActivityDisable)               \
    X(cuptiActivityRegisterCallbacks) X(cuptiActivityFlushAll) X(cuptiActivityGetNextRecord)                \
    X(cuptiActivityPushExternalCorrelationId) X(cuptiActivityPopExternalCorrelationId) X(cuptiGetTimestamp)
/* Used when present: the clock, the API filter. */
#define FP_CUPTI_OPTIONAL(X)                                                                       \
    X(cuptiActivityRegisterTimestampCallback) X(cuptiActivityEnableRuntimeApi) X(cuptiActivityEnableDriverApi) \
    X(cuptiGetCallbackName)

static struct {
#define FP_CUPTI_DECL(f) __typeof__(&f) f;
    FP_CUPTI_FUNCS(FP_CUPTI_DECL) FP_CUPTI_OPTIONAL(FP_CUPTI_DECL)
#undef FP_CUPTI_DECL
} C;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_loaded;
static const char *g_from = "";
static char g_load_error[768];

#ifdef FP_CUDA_EMU
static void load_cupti(void) {
#define FP_CUPTI_DIRECT(f) C.f = &f;
    FP_CUPTI_FUNCS(FP_CUPTI_DIRECT) FP_CUPTI_OPTIONAL(FP_CUPTI_DIRECT)
#undef FP_CUPTI_DIRECT
    g_loaded = 1;
    g_from = "the emulated CUPTI (tests/emu)";
}
#else
#ifndef FP_CUPTI_FALLBACK
#define FP_CUPTI_FALLBACK "libcupti.so"
#endif
static void load_cupti(void) {
    static const char *names[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
    const char *env = getenv("FASTPATH_CUPTI_LIB");
    void *h = NULL;
    const char *from = NULL;
    if (env && *env) {
        if (!(h = dlopen(env, RTLD_NOW | RTLD_GLOBAL))) {
            snprintf(g_load_error, sizeof g_load_error, "cannot load CUPTI from FASTPATH_CUPTI_LIB=%s: %s", env,
                     dlerror());
            return;
        }
        from = env;
    }
    for (size_t i = 0; !h && i < sizeof names / sizeof *names; ++i)
        if ((h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD))) from = names[i]; /* the process's own */
    for (size_t i = 0; !h && i < sizeof names / sizeof *names; ++i)
        if ((h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL))) from = names[i];
    if (!h && (h = dlopen(FP_CUPTI_FALLBACK, RTLD_NOW | RTLD_GLOBAL))) from = FP_CUPTI_FALLBACK;
    if (!h) {
        snprintf(g_load_error, sizeof g_load_error,
                 "cannot load CUPTI: libcupti.so is neither loaded, on the library path, nor at %s (%s); "
                 "set FASTPATH_CUPTI_LIB to the toolkit's libcupti.so, or use the event timer",
                 FP_CUPTI_FALLBACK, dlerror());
        return;
    }
#define FP_CUPTI_SYM(f)                                                                                   \
    if (!(*(void **)&C.f = dlsym(h, #f))) {                                                               \
        snprintf(g_load_error, sizeof g_load_error, "CUPTI from %s has no %s: CUPTI 12 or newer is needed", \
                 from, #f);                                                                               \
        return;                                                                                           \
    }
    FP_CUPTI_FUNCS(FP_CUPTI_SYM)
#undef FP_CUPTI_SYM
#define FP_CUPTI_OPT(f) *(void **)&C.f = dlsym(h, #f);
    FP_CUPTI_OPTIONAL(FP_CUPTI_OPT)
#undef FP_CUPTI_OPT
    uint32_t v = 0;
    if (C.cuptiGetVersion(&v) != CUPTI_SUCCESS || v / 10000 != CUPTI_API_VERSION / 10000) {
        /* the records are read with this build's structs: the same major */
        snprintf(g_load_error, sizeof g_load_error,
                 "CUPTI from %s has API version %u; libfastpath was built against %d (the same major is needed)",
                 from, v, CUPTI_API_VERSION);
        return;
    }
    g_loaded = 1;
    g_from = from;
}
#endif

fp_status fp_cupti_load(void) {
    pthread_once(&g_once, load_cupti);
    if (!g_loaded) return fp_set_error(FP_ERR_UNSUPPORTED, "trace: %s", g_load_error);
    return FP_OK;
}

const char *fp_cupti_from(void) {
    pthread_once(&g_once, load_cupti);
    return g_loaded ? g_from : "";
}

/* ------------------------------------------------------------------------ */
/*  The collector                                                           */
/* ------------------------------------------------------------------------ */

#define MAX_RINGS 256u
#define SEQ_BITS 40
#define SEQ_MASK ((1ull << SEQ_BITS) - 1)
/* Correlation ids seen in API records, by id modulo this: an id's device
 * record must arrive before 2^20 later API calls reuse its entry. */
#define CORR_BITS 20
#define CORR_SIZE (1u << CORR_BITS)
#define BUFFER_BYTES ((size_t)4 << 20)
/* Device records whose API record is not in yet: kept for this many
 * flushes, then lost. */
#define PENDING_FLUSHES 2
#define PENDING_MAX ((size_t)1 << 20)

typedef struct corr_entry {
    uint32_t corr;
    uint32_t valid;
    uint64_t ext; /* 0: an API call outside any span */
} corr_entry;

typedef struct pending_rec {
    uint32_t corr;
    uint32_t age;
    uint64_t start, end;
} pending_rec;

typedef struct ring_entry {
    int used;
    fp_cupti_rec *recs;
    size_t n, cap;
} ring_entry;

static struct {
    pthread_mutex_t mu; /* everything below; taken by CUPTI's buffer callback: never while calling CUPTI */
    pthread_mutex_t life; /* start / stop, held across CUPTI calls */
    int users;            /* attached rings (life) */
    int own_clock;        /* CUPTI reads fp_cupti_now_ns */
    int64_t offset;       /* else: the trace clock minus CUPTI's */
    corr_entry *corr;
    pending_rec *pending;
    size_t npending, cap_pending;
    ring_entry rings[MAX_RINGS]; /* [0] unused: an external id of 0 is no span */
    uint64_t lost;
    int api_filtered;     /* the APIs that enqueue no work switched off */
    int nruntime, ndriver; /* how many of each domain's APIs were */
    /* FASTPATH_CUPTI_DEBUG=1: what the records were, printed at each flush */
    int debug;
    uint64_t n_ext, n_ext_other, n_api, n_dev, n_filed, n_outside, n_other;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER, .life = PTHREAD_MUTEX_INITIALIZER};

static const CUpti_ActivityKind k_device_kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                                    CUPTI_ACTIVITY_KIND_MEMSET,
                                                    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

static uint64_t CUPTIAPI clock_cb(void) { return fp_cupti_now_ns(); }

static uint64_t to_trace_ns(uint64_t t) { return G.own_clock ? t : (uint64_t)((int64_t)t + G.offset); }

/* Files a device record (G.mu held): 1 when its API call was seen. */
static int file_locked(uint32_t corr, uint64_t start, uint64_t end) {
    const corr_entry *e = &G.corr[corr & (CORR_SIZE - 1)];
    if (!e->valid || e->corr != corr) return 0;
    if (!e->ext) { /* outside any span */
        ++G.n_outside;
        return 1;
    }
    ++G.n_filed;
    uint32_t idx = (uint32_t)(e->ext >> SEQ_BITS);
    ring_entry *r = idx < MAX_RINGS ? &G.rings[idx] : NULL;
    if (!r || !r->used) return 1; /* a ring detached since */
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 1024;
        void *p = realloc(r->recs, cap * sizeof *r->recs);
        if (!p) {
            ++G.lost;
            return 1;
        }
        r->recs = p;
        r->cap = cap;
    }
    r->recs[r->n++] = (fp_cupti_rec){e->ext & SEQ_MASK, to_trace_ns(start), to_trace_ns(end)};
    return 1;
}

static void device_locked(uint32_t corr, uint64_t start, uint64_t end) {
    ++G.n_dev;
    if (G.debug && G.n_dev <= 4)
        fprintf(stderr, "libfastpath: CUPTI device record: correlation %u, %llu-%llu\n", corr,
                (unsigned long long)start, (unsigned long long)end);
    if (file_locked(corr, start, end)) return;
    if (G.npending == G.cap_pending) {
        size_t cap = G.cap_pending ? 2 * G.cap_pending : 256;
        void *p = cap <= PENDING_MAX ? realloc(G.pending, cap * sizeof *G.pending) : NULL;
        if (!p) {
            ++G.lost;
            return;
        }
        G.pending = p;
        G.cap_pending = cap;
    }
    G.pending[G.npending++] = (pending_rec){corr, 0, start, end};
}

/* Files the pending records whose API call is in now; with `age`, the
 * others grow older and the oldest are lost (G.mu held). */
static void retry_pending_locked(int age) {
    size_t k = 0;
    for (size_t i = 0; i < G.npending; ++i) {
        pending_rec p = G.pending[i];
        if (file_locked(p.corr, p.start, p.end)) continue;
        if (age && ++p.age >= PENDING_FLUSHES) {
            ++G.lost;
            continue;
        }
        G.pending[k++] = p;
    }
    G.npending = k;
}

static void handle_locked(const CUpti_Activity *r) {
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const CUpti_ActivityExternalCorrelation *x = (const CUpti_ActivityExternalCorrelation *)r;
        if (x->externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
            ++G.n_ext_other;
            break;
        }
        ++G.n_ext;
        if (G.debug && G.n_ext <= 4)
            fprintf(stderr, "libfastpath: CUPTI external record: correlation %u -> external %llu\n", x->correlationId,
                    (unsigned long long)x->externalId);
        G.corr[x->correlationId & (CORR_SIZE - 1)] = (corr_entry){x->correlationId, 1, x->externalId};
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: { /* seen: outside any span unless its external record came first */
        const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)r;
        ++G.n_api;
        if (G.debug && G.n_api <= 4)
            fprintf(stderr, "libfastpath: CUPTI %s API record: cbid %u, correlation %u\n",
                    r->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? "runtime" : "driver", a->cbid, a->correlationId);
        corr_entry *e = &G.corr[a->correlationId & (CORR_SIZE - 1)];
        if (!e->valid || e->corr != a->correlationId) *e = (corr_entry){a->correlationId, 1, 0};
        break;
    }
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        device_locked(k->correlationId, k->start, k->end);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
        device_locked(m->correlationId, m->start, m->end);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
        device_locked(m->correlationId, m->start, m->end);
        break;
    }
    default:
        ++G.n_other;
        break;
    }
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    void *p = NULL;
    if (posix_memalign(&p, 8, BUFFER_BYTES) != 0) p = NULL;
    *buffer = p;
    *size = p ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)ctx;
    (void)stream_id;
    (void)size;
    if (!buffer) return;
    pthread_mutex_lock(&G.mu);
    if (G.corr) { /* records delivered after the stop are discarded */
        CUpti_Activity *r = NULL;
        while (valid && C.cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) handle_locked(r);
        retry_pending_locked(0);
    }
    pthread_mutex_unlock(&G.mu);
    free(buffer);
}

static const char *result_text(CUptiResult r) {
    const char *s = NULL;
    if (C.cuptiGetResultString && C.cuptiGetResultString(r, &s) == CUPTI_SUCCESS && s) return s;
    return "unknown CUPTI error";
}

/* The APIs that enqueue device work: only they are traced (an API record
 * per traced call is what carries the external correlation). */
static int enqueues_work(const char *name) {
    return strstr(name, "Launch") || strstr(name, "Memcpy") || strstr(name, "Memset");
}

/* Switches off the API records of one domain's APIs that enqueue no work
 * (the kind is on: every API recorded until then); how many. Turning on
 * only the work-enqueuing APIs, with the kind off, is what the header
 * describes too, but CUPTI 13 on an H200 (driver 580, session 41) then
 * wrote no API record at all, and so no external correlation: the kind
 * first, then the exceptions, as the header's other recipe says. */
static int narrow_domain(CUpti_CallbackDomain domain, uint32_t size, CUptiResult (*enable)(CUpti_CallbackId, uint8_t)) {
    int n = 0;
    for (uint32_t id = 1; id < size; ++id) {
        const char *name = NULL;
        if (C.cuptiGetCallbackName(domain, id, &name) != CUPTI_SUCCESS || !name || enqueues_work(name)) continue;
        if (enable(id, 0) == CUPTI_SUCCESS) ++n;
    }
    return n;
}

/* With the API kinds on: the others off (FASTPATH_CUPTI_API_FILTER=0:
 * every API recorded, for a comparison). */
static void narrow_apis(void) {
    G.nruntime = G.ndriver = 0;
    G.api_filtered = 0;
    const char *filt = getenv("FASTPATH_CUPTI_API_FILTER");
    if (filt && strcmp(filt, "0") == 0) return;
    if (!C.cuptiActivityEnableRuntimeApi || !C.cuptiActivityEnableDriverApi || !C.cuptiGetCallbackName) return;
    G.nruntime = narrow_domain(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_SIZE,
                               C.cuptiActivityEnableRuntimeApi);
    G.ndriver = narrow_domain(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_SIZE, C.cuptiActivityEnableDriverApi);
    G.api_filtered = G.nruntime > 0 || G.ndriver > 0;
}

/* The API kinds off (a later cuptiActivityEnable of them overrides the
 * per-API switches, as CUPTI documents). */
static void disable_apis(void) {
    (void)C.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
    (void)C.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_DRIVER);
    G.nruntime = G.ndriver = 0;
    G.api_filtered = 0;
}

/* Stops the collector (G.life held). */
static void stop_locked(void) {
    for (size_t i = 0; i < sizeof k_device_kinds / sizeof *k_device_kinds; ++i)
        (void)C.cuptiActivityDisable(k_device_kinds[i]);
    disable_apis();
    (void)C.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&G.mu);
    free(G.corr);
    G.corr = NULL;
    free(G.pending);
    G.pending = NULL;
    G.npending = G.cap_pending = 0;
    pthread_mutex_unlock(&G.mu);
}

static fp_status start_locked(void) {
    const char *dbg = getenv("FASTPATH_CUPTI_DEBUG");
    G.debug = dbg && strcmp(dbg, "1") == 0;
    corr_entry *corr = calloc(CORR_SIZE, sizeof *corr);
    if (!corr) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "trace: CUPTI's correlation table (%zu bytes)",
                                   (size_t)CORR_SIZE * sizeof *corr);
    pthread_mutex_lock(&G.mu);
    G.corr = corr;
    pthread_mutex_unlock(&G.mu);
    G.own_clock = C.cuptiActivityRegisterTimestampCallback &&
                  C.cuptiActivityRegisterTimestampCallback(clock_cb) == CUPTI_SUCCESS;
    CUptiResult r = C.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    size_t enabled = 0;
    for (; r == CUPTI_SUCCESS && enabled < sizeof k_device_kinds / sizeof *k_device_kinds; ++enabled)
        r = C.cuptiActivityEnable(k_device_kinds[enabled]);
    if (r == CUPTI_SUCCESS) r = C.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    if (r == CUPTI_SUCCESS) r = C.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
    if (r == CUPTI_SUCCESS) narrow_apis();
    if (r != CUPTI_SUCCESS) {
        const char *why = result_text(r);
        stop_locked();
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "trace: CUPTI refused to record activity (%s): another profiler or tool may own it; "
                            "use the event timer",
                            why);
    }
    if (!G.own_clock) {
        uint64_t c = 0;
        uint64_t a = fp_cupti_now_ns();
        (void)C.cuptiGetTimestamp(&c);
        uint64_t b = fp_cupti_now_ns();
        G.offset = (int64_t)(a / 2 + b / 2) - (int64_t)c;
    }
    return FP_OK;
}

fp_status fp_cupti_attach(uint32_t *index) {
    *index = 0;
    FP_TRY(fp_cupti_load());
    pthread_mutex_lock(&G.life);
    fp_status st = FP_OK;
    if (G.users == 0) st = start_locked();
    uint32_t idx = 0;
    if (st == FP_OK) {
        pthread_mutex_lock(&G.mu);
        for (uint32_t i = 1; i < MAX_RINGS && !idx; ++i)
            if (!G.rings[i].used) idx = i;
        if (idx) {
            G.rings[idx].used = 1;
            G.rings[idx].n = 0;
        }
        pthread_mutex_unlock(&G.mu);
        if (idx) ++G.users;
        else {
            if (G.users == 0) stop_locked();
            st = fp_set_error(FP_ERR_INVALID_ARGUMENT, "trace: %u contexts already use the CUPTI timer",
                              MAX_RINGS - 1);
        }
    }
    pthread_mutex_unlock(&G.life);
    *index = idx;
    return st;
}

void fp_cupti_detach(uint32_t index) {
    if (!index || index >= MAX_RINGS) return;
    pthread_mutex_lock(&G.life);
    pthread_mutex_lock(&G.mu);
    int was = G.rings[index].used;
    G.rings[index].used = 0;
    free(G.rings[index].recs);
    G.rings[index].recs = NULL;
    G.rings[index].n = G.rings[index].cap = 0;
    pthread_mutex_unlock(&G.mu);
    if (was && --G.users == 0) stop_locked();
    pthread_mutex_unlock(&G.life);
}

int fp_cupti_push(uint32_t index, uint64_t seq) {
    return C.cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0,
                                                    ((uint64_t)index << SEQ_BITS) | (seq & SEQ_MASK)) ==
           CUPTI_SUCCESS;
}

void fp_cupti_pop(void) {
    uint64_t last = 0;
    (void)C.cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

void fp_cupti_flush(void) {
    if (!g_loaded) return;
    (void)C.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&G.mu);
    if (G.corr) retry_pending_locked(1);
    if (G.debug)
        fprintf(stderr,
                "libfastpath: CUPTI flush: external records %llu (other kinds %llu), API records %llu, device "
                "records %llu (in spans %llu, outside %llu, pending %zu, lost %llu), other records %llu; API "
                "filter %s (%d runtime, %d driver APIs off)\n",
                (unsigned long long)G.n_ext, (unsigned long long)G.n_ext_other, (unsigned long long)G.n_api,
                (unsigned long long)G.n_dev, (unsigned long long)G.n_filed, (unsigned long long)G.n_outside,
                G.npending, (unsigned long long)G.lost, (unsigned long long)G.n_other,
                G.api_filtered ? "on" : "off", G.nruntime, G.ndriver);
    pthread_mutex_unlock(&G.mu);
}

fp_cupti_rec *fp_cupti_take(uint32_t index, size_t *n) {
    *n = 0;
    if (!index || index >= MAX_RINGS) return NULL;
    pthread_mutex_lock(&G.mu);
    ring_entry *r = &G.rings[index];
    fp_cupti_rec *recs = NULL;
    if (r->used && r->n) {
        recs = r->recs;
        *n = r->n;
        r->recs = NULL;
        r->n = r->cap = 0;
    }
    pthread_mutex_unlock(&G.mu);
    return recs;
}

uint64_t fp_cupti_lost(void) {
    pthread_mutex_lock(&G.mu);
    uint64_t n = G.lost;
    pthread_mutex_unlock(&G.mu);
    return n;
}

#endif /* FP_HAVE_CUPTI */
