/* NCCL's side of the table (nccl_table.h): thin wrappers that translate the
 * library's enums to NCCL's and fill ncclConfig_t, over NCCL's entry points
 * resolved when communication is first used.
 *
 * Loading: libfastpath does not link NCCL. The first fp_comm_* call looks
 * for it in this order: FASTPATH_NCCL_LIB (a path), a libnccl.so.2 the
 * process has already loaded (PyTorch's: a second, older copy loaded first
 * would shadow it and break `import torch`), the dynamic linker's search
 * (LD_LIBRARY_PATH, ld.so.cache), then the one found at build time. The
 * emulated build (tests/emu) calls tests/emu/nccl_emu.cpp's entry points
 * directly. */
#include "comm/nccl_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FP_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>

_Static_assert(sizeof(ncclUniqueId) == FP_COMM_ID_BYTES, "fp_comm_id must hold an ncclUniqueId");
_Static_assert((int)ncclSuccess == (int)FP_NCCL_SUCCESS && (int)ncclInProgress == (int)FP_NCCL_IN_PROGRESS,
               "NCCL result codes");

#define FP_NCCL_FUNCS(X)                                                                                  \
    X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommGetAsyncError) X(ncclCommAbort) \
    X(ncclCommFinalize) X(ncclCommDestroy) X(ncclCommSplit) X(ncclCommCount) X(ncclCommUserRank)          \
    X(ncclAllReduce) X(ncclAllGather) X(ncclReduceScatter) X(ncclBroadcast) X(ncclGroupStart)             \
    X(ncclGroupEnd) X(ncclGetErrorString) X(ncclGetLastError)

/* NCCL's entry points, by their own names (N.ncclAllReduce). */
static struct {
#define FP_NCCL_DECL(f) __typeof__(&f) f;
    FP_NCCL_FUNCS(FP_NCCL_DECL)
#undef FP_NCCL_DECL
} N;

/* The oldest NCCL with everything used here (ncclCommSplit: 2.18). */
#define FP_NCCL_MIN_VERSION 21800

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_loaded;
static int g_version;       /* ncclGetVersion of the library loaded */
static const char *g_from;  /* where it was loaded from */
static char g_load_error[768];

#ifdef FP_CUDA_EMU
static void load_nccl(void) {
#define FP_NCCL_DIRECT(f) N.f = &f;
    FP_NCCL_FUNCS(FP_NCCL_DIRECT)
#undef FP_NCCL_DIRECT
    g_loaded = 1;
    (void)N.ncclGetVersion(&g_version);
    g_from = "the emulated NCCL (tests/emu)";
}
#else
#ifndef FP_NCCL_FALLBACK
#define FP_NCCL_FALLBACK "libnccl.so.2"
#endif
static void load_nccl(void) {
    const char *env = getenv("FASTPATH_NCCL_LIB");
    void *h = NULL;
    const char *from = NULL;
    if (env && *env) {
        h = dlopen(env, RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            snprintf(g_load_error, sizeof g_load_error, "cannot load NCCL from FASTPATH_NCCL_LIB=%s: %s", env,
                     dlerror());
            return;
        }
        from = env;
    }
    if (!h && (h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD))) from = "the process's libnccl.so.2";
    if (!h && (h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL))) from = "libnccl.so.2 on the library path";
    if (!h && (h = dlopen(FP_NCCL_FALLBACK, RTLD_NOW | RTLD_GLOBAL))) from = FP_NCCL_FALLBACK;
    if (!h) {
        snprintf(g_load_error, sizeof g_load_error,
                 "cannot load NCCL: libnccl.so.2 is neither loaded, on the library path, nor at %s (%s); "
                 "install NCCL or set FASTPATH_NCCL_LIB to its libnccl.so.2",
                 FP_NCCL_FALLBACK, dlerror());
        return;
    }
#define FP_NCCL_SYM(f)                                                                                      \
    if (!(*(void **)&N.f = dlsym(h, #f))) {                                                                 \
        snprintf(g_load_error, sizeof g_load_error, "NCCL from %s has no %s: NCCL 2.18 or newer is needed", \
                 from, #f);                                                                                  \
        return;                                                                                              \
    }
    FP_NCCL_FUNCS(FP_NCCL_SYM)
#undef FP_NCCL_SYM
    int v = 0;
    if (N.ncclGetVersion(&v) != ncclSuccess || v < FP_NCCL_MIN_VERSION) {
        snprintf(g_load_error, sizeof g_load_error, "NCCL from %s is version %d: 2.18 (%d) or newer is needed", from,
                 v, FP_NCCL_MIN_VERSION);
        return;
    }
    g_loaded = 1;
    g_version = v;
    g_from = from;
}
#endif

static int w_get_version(int *v) { return (int)N.ncclGetVersion(v); }
static int w_get_unique_id(fp_comm_id *id) {
    ncclUniqueId u;
    ncclResult_t r = N.ncclGetUniqueId(&u);
    if (r == ncclSuccess) memcpy(id->bytes, u.internal, sizeof u.internal);
    return (int)r;
}
static int w_init_rank(void **comm, int nranks, const fp_comm_id *id, int rank, int blocking) {
    ncclUniqueId u;
    memcpy(u.internal, id->bytes, sizeof u.internal);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    ncclComm_t c = NULL;
    ncclResult_t r = N.ncclCommInitRankConfig(&c, nranks, u, rank, &cfg);
    *comm = c;
    return (int)r;
}
static int w_get_async_error(void *comm, int *async) {
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = N.ncclCommGetAsyncError((ncclComm_t)comm, &a);
    *async = (int)a;
    return (int)r;
}
static int w_abort(void *comm) { return (int)N.ncclCommAbort((ncclComm_t)comm); }
static int w_finalize(void *comm) { return (int)N.ncclCommFinalize((ncclComm_t)comm); }
static int w_destroy(void *comm) { return (int)N.ncclCommDestroy((ncclComm_t)comm); }
/* NCCL writes the child when the split's job runs (at the group's end in a
 * group, maybe later for a non-blocking parent): newcomm is handed to it as
 * is and must outlive the call (comm.c's split cells). */
static int w_split(void *comm, int color, int key, void **newcomm, int blocking) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    return (int)N.ncclCommSplit((ncclComm_t)comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                (ncclComm_t *)newcomm, &cfg);
}
static int w_count(void *comm, int *n) { return (int)N.ncclCommCount((ncclComm_t)comm, n); }
static int w_user_rank(void *comm, int *r) { return (int)N.ncclCommUserRank((ncclComm_t)comm, r); }

static ncclDataType_t nccl_dtype(fp_dtype d) {
    switch (d) {
    case FP_F16: return ncclFloat16;
    case FP_BF16: return ncclBfloat16;
    default: return ncclFloat32;
    }
}
static ncclRedOp_t nccl_op(fp_reduce_op op) {
    switch (op) {
    case FP_REDUCE_AVG: return ncclAvg;
    case FP_REDUCE_MAX: return ncclMax;
    case FP_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}
static int w_collective(fp_coll_kind kind, const void *send, void *recv, size_t count, fp_dtype dtype,
                        fp_reduce_op op, int root, void *comm, cudaStream_t stream) {
    ncclComm_t c = (ncclComm_t)comm;
    switch (kind) {
    case FP_COLL_ALLREDUCE: return (int)N.ncclAllReduce(send, recv, count, nccl_dtype(dtype), nccl_op(op), c, stream);
    case FP_COLL_ALLGATHER: return (int)N.ncclAllGather(send, recv, count, nccl_dtype(dtype), c, stream);
    case FP_COLL_REDUCE_SCATTER:
        return (int)N.ncclReduceScatter(send, recv, count, nccl_dtype(dtype), nccl_op(op), c, stream);
    case FP_COLL_BROADCAST: return (int)N.ncclBroadcast(send, recv, count, nccl_dtype(dtype), root, c, stream);
    }
    return (int)ncclInvalidArgument;
}
static int w_group_start(void) { return (int)N.ncclGroupStart(); }
static int w_group_end(void) { return (int)N.ncclGroupEnd(); }
static const char *w_error_string(int r) { return N.ncclGetErrorString((ncclResult_t)r); }
static const char *w_last_error(void *comm) { return N.ncclGetLastError((ncclComm_t)comm); }

static const fp_nccl_table k_nccl = {
    .get_version = w_get_version,
    .get_unique_id = w_get_unique_id,
    .init_rank = w_init_rank,
    .get_async_error = w_get_async_error,
    .abort = w_abort,
    .finalize = w_finalize,
    .destroy = w_destroy,
    .split = w_split,
    .count = w_count,
    .user_rank = w_user_rank,
    .collective = w_collective,
    .group_start = w_group_start,
    .group_end = w_group_end,
    .error_string = w_error_string,
    .last_error = w_last_error,
};
#define FP_NCCL_DEFAULT (&k_nccl)
#else
#define FP_NCCL_DEFAULT NULL
#endif

static const fp_nccl_table *g_override;

const fp_nccl_table *fp_nccl(void) {
    if (g_override) return g_override;
#ifdef FP_HAVE_NCCL
    pthread_once(&g_once, load_nccl);
    return g_loaded ? FP_NCCL_DEFAULT : NULL;
#else
    return NULL;
#endif
}

const char *fp_nccl_load_error(void) {
#ifdef FP_HAVE_NCCL
    pthread_once(&g_once, load_nccl);
    return g_loaded ? "" : g_load_error;
#else
    return "libfastpath was built without NCCL (FASTPATH_WITH_NCCL=OFF): no communication";
#endif
}

int fp_comm_nccl_version(const char **from) {
    if (from) *from = NULL;
#ifdef FP_HAVE_NCCL
    pthread_once(&g_once, load_nccl);
    if (!g_loaded) return 0;
    if (from) *from = g_from;
    return g_version;
#else
    return 0;
#endif
}

void fp_nccl_set_table(const fp_nccl_table *table) { g_override = table; }
