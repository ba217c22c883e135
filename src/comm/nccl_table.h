/* The one door to NCCL: every NCCL call of the communication module goes
 * through this table of function pointers. Only nccl_table.c includes
 * <nccl.h>; the rest of src/comm sees opaque handles (void *) and NCCL's
 * result codes as ints, so the module compiles without NCCL (the table is
 * then absent and every entry point returns FP_ERR_UNSUPPORTED), and tests
 * can put a table of their own in its place. In the emulated build
 * (tests/emu) the real NCCL symbols are answered by tests/emu/nccl_emu.cpp:
 * ranks as threads on the emulated runtime's streams. */
#ifndef FASTPATH_COMM_NCCL_TABLE_H
#define FASTPATH_COMM_NCCL_TABLE_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "fastpath/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ncclResult_t values the module tests for (NCCL's, stable since 2.x). */
enum { FP_NCCL_SUCCESS = 0, FP_NCCL_IN_PROGRESS = 7 };

typedef struct fp_nccl_table {
    int (*get_version)(int *version);
    int (*get_unique_id)(fp_comm_id *id);
    /* ncclCommInitRankConfig with config.blocking = `blocking`. */
    int (*init_rank)(void **comm, int nranks, const fp_comm_id *id, int rank, int blocking);
    int (*get_async_error)(void *comm, int *async_result);
    int (*abort)(void *comm);
    int (*finalize)(void *comm);
    int (*destroy)(void *comm);
    /* color < 0: NCCL_SPLIT_NOCOLOR. */
    int (*split)(void *comm, int color, int key, void **newcomm, int blocking);
    int (*count)(void *comm, int *nranks);
    int (*user_rank)(void *comm, int *rank);
    /* One collective: all-reduce, all-gather (count = send count),
     * reduce-scatter (count = receive count), broadcast (root). */
    int (*collective)(fp_coll_kind kind, const void *send, void *recv, size_t count, fp_dtype dtype,
                      fp_reduce_op op, int root, void *comm, cudaStream_t stream);
    int (*group_start)(void);
    int (*group_end)(void);
    const char *(*error_string)(int result);
    const char *(*last_error)(void *comm);
} fp_nccl_table;

/* The table in use: a test's, or NCCL's (loaded at the first call; see
 * nccl_table.c); NULL when built without NCCL or when it cannot be loaded
 * (fp_nccl_load_error says why). Thread-safe. */
const fp_nccl_table *fp_nccl(void);
const char *fp_nccl_load_error(void);
/* Replaces the table (NULL: back to NCCL's). For tests; not thread-safe
 * with communication in flight. */
void fp_nccl_set_table(const fp_nccl_table *table);

#ifdef __cplusplus
}
#endif

#endif
