/* NCCL's side of the table (nccl_table.h): thin wrappers that translate the
 * library's enums to NCCL's and fill ncclConfig_t. */
#include "comm/nccl_table.h"

#include <string.h>

#ifdef FP_HAVE_NCCL
#include <nccl.h>

_Static_assert(sizeof(ncclUniqueId) == FP_COMM_ID_BYTES, "fp_comm_id must hold an ncclUniqueId");
_Static_assert((int)ncclSuccess == (int)FP_NCCL_SUCCESS && (int)ncclInProgress == (int)FP_NCCL_IN_PROGRESS,
               "NCCL result codes");

static int w_get_version(int *v) { return (int)ncclGetVersion(v); }
static int w_get_unique_id(fp_comm_id *id) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r == ncclSuccess) memcpy(id->bytes, u.internal, sizeof u.internal);
    return (int)r;
}
static int w_init_rank(void **comm, int nranks, const fp_comm_id *id, int rank, int blocking) {
    ncclUniqueId u;
    memcpy(u.internal, id->bytes, sizeof u.internal);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&c, nranks, u, rank, &cfg);
    *comm = c;
    return (int)r;
}
static int w_get_async_error(void *comm, int *async) {
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError((ncclComm_t)comm, &a);
    *async = (int)a;
    return (int)r;
}
static int w_abort(void *comm) { return (int)ncclCommAbort((ncclComm_t)comm); }
static int w_finalize(void *comm) { return (int)ncclCommFinalize((ncclComm_t)comm); }
static int w_destroy(void *comm) { return (int)ncclCommDestroy((ncclComm_t)comm); }
static int w_split(void *comm, int color, int key, void **newcomm, int blocking) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = blocking;
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommSplit((ncclComm_t)comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c, &cfg);
    *newcomm = c;
    return (int)r;
}
static int w_count(void *comm, int *n) { return (int)ncclCommCount((ncclComm_t)comm, n); }
static int w_user_rank(void *comm, int *r) { return (int)ncclCommUserRank((ncclComm_t)comm, r); }

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
    case FP_COLL_ALLREDUCE: return (int)ncclAllReduce(send, recv, count, nccl_dtype(dtype), nccl_op(op), c, stream);
    case FP_COLL_ALLGATHER: return (int)ncclAllGather(send, recv, count, nccl_dtype(dtype), c, stream);
    case FP_COLL_REDUCE_SCATTER:
        return (int)ncclReduceScatter(send, recv, count, nccl_dtype(dtype), nccl_op(op), c, stream);
    case FP_COLL_BROADCAST: return (int)ncclBroadcast(send, recv, count, nccl_dtype(dtype), root, c, stream);
    }
    return (int)ncclInvalidArgument;
}
static int w_group_start(void) { return (int)ncclGroupStart(); }
static int w_group_end(void) { return (int)ncclGroupEnd(); }
static const char *w_error_string(int r) { return ncclGetErrorString((ncclResult_t)r); }
static const char *w_last_error(void *comm) { return ncclGetLastError((ncclComm_t)comm); }

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

static const fp_nccl_table *g_table = FP_NCCL_DEFAULT;

const fp_nccl_table *fp_nccl(void) { return g_table; }

void fp_nccl_set_table(const fp_nccl_table *table) { g_table = table ? table : FP_NCCL_DEFAULT; }
