/* The communication module's internals: the communicator, its ledger, the
 * clique registry and the watchdog (src/comm/comm.c, watchdog.c), used by
 * the buckets (buckets.c). Not installed. */
#ifndef FASTPATH_COMM_INTERNAL_H
#define FASTPATH_COMM_INTERNAL_H

#include <pthread.h>

#include "comm/comm_copy.h"
#include "comm/nccl_table.h"
#include "fastpath/comm.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One collective in the ledger ring. Its events are created on first use
 * and reused when the slot comes round again (the entry has ended). */
typedef struct coll_entry {
    fp_coll_record rec;
    cudaEvent_t ev_start, ev_end;
    cudaStream_t stream;
} coll_entry;

/* Latency samples of one kind: the last FP_COMM_LAT_KEEP durations. */
#define FP_COMM_LAT_KEEP 4096
typedef struct coll_acc {
    uint64_t calls;
    double bytes, busy_ms;
    double *lat;                  /* ring of FP_COMM_LAT_KEEP */
    uint64_t nlat;
} coll_acc;

/* What every rank of this process enqueued as a seq: the first one's
 * signature, for the mismatch check. */
#define FP_CLIQUE_SIGS 1024
typedef struct coll_sig {
    uint64_t seq;
    int set, rank;
    fp_coll_kind kind;
    fp_dtype dtype;
    size_t count;
    fp_reduce_op op;
    int root;
} coll_sig;

/* The in-process ranks of one NCCL communicator (same unique id). */
typedef struct fp_clique {
    fp_comm_id id;
    int nranks;
    int refs;
    fp_comm **members;            /* [nranks], NULL for ranks not (or no longer) here */
    coll_sig sigs[FP_CLIQUE_SIGS];
    struct fp_clique *next;
} fp_clique;

typedef struct fp_buckets fp_buckets;

/* Where ncclCommSplit writes the child's handle. NCCL writes it when the
 * split's job runs: at ncclGroupEnd inside a group, possibly later from its
 * own thread for a non-blocking parent (seen on an H100: NULL right after
 * a split in a group). So it must outlive the call: cells live on their
 * parent's list until the parent is freed; a split that failed or timed out
 * leaves its cell unfreed (NCCL may still write to it). */
typedef struct fp_split_cell {
    void *nccl; /* first member: the address NCCL is given */
    struct fp_split_cell *next;
} fp_split_cell;

struct fp_comm {
    fp_context *ctx;
    int rank, nranks;
    void *nccl;                   /* ncclComm_t; NULL once aborted / destroyed */
    cudaStream_t stream;
    fp_comm_config cfg;
    fp_clique *clique;
    double t0;                    /* fp_now_s at creation */
    /* mu guards everything below, and the NCCL handle's use. */
    pthread_mutex_t mu;
    coll_entry *ring;
    int ring_cap;
    uint64_t next_seq;            /* the next collective's seq */
    uint64_t first_open;          /* every seq below it has ended or was aborted */
    coll_acc acc[FP_COLL_KINDS];
    uint64_t n_enqueued, n_ended, n_aborted;
    double exposed_ms;
    uint64_t iterations;
    fp_buckets *buckets;          /* the communicator's buckets (exposure harvest) */
    /* Failure: set once; the report is kept. */
    fp_status failed;
    char *report;
    fp_comm_failure_info info;
    int callback_done;
    uint64_t n_splits;            /* splits made from it (the children's ids) */
    struct fp_split_cell *cells;  /* where NCCL writes its splits' children */
    int watched;                  /* on the watchdog's list */
    struct fp_comm *wd_next;
};

/* Records the failure (first one wins), aborts the NCCL communicator and
 * drops the pending collectives. Takes comm->mu. The callback runs later
 * (fp_comm_run_callbacks) outside every lock. */
void fp_comm_fail(fp_comm *comm, fp_status status, const fp_comm_failure_info *info, const char *report);
/* Calls the failure callback if one is due. */
void fp_comm_run_callback(fp_comm *comm);
/* Aborts every in-process rank of comm's clique with one report. */
void fp_comm_fail_clique(fp_comm *comm, fp_status status, uint64_t seq, const char *what);
/* Updates the ledger's states from the events. comm->mu held. */
void fp_comm_refresh_locked(fp_comm *comm);
/* 1 with a report in msg when NCCL says the communicator failed
 * (ncclCommGetAsyncError). comm->mu held. */
int fp_comm_async_error_locked(fp_comm *comm, char *msg, size_t n);
/* The stored failure as this thread's error (FP_OK if none). */
fp_status fp_comm_failure_status(fp_comm *comm);

/* Enqueues one collective with its ledger entry and events (the body of
 * fp_comm_allreduce & co., also used by the buckets). */
fp_status fp_comm_enqueue(fp_comm *comm, fp_coll_kind kind, const void *send, void *recv, size_t count,
                          fp_dtype dtype, fp_reduce_op op, int root, cudaStream_t stream);

/* Buckets' exposure harvest (buckets.c): adds what finished to comm's
 * statistics. comm->mu held. */
void fp_buckets_harvest_locked(fp_buckets *b);
/* A caller's buckets config (NULL: defaults) as this library's layout. */
fp_status fp_buckets_config_read(const fp_buckets_config *user, fp_buckets_config *out);

/* The watchdog (watchdog.c). */
void fp_watchdog_add(fp_comm *comm);
void fp_watchdog_remove(fp_comm *comm);

/* NCCL's error as the thread's message: "what: <NCCL string> (<last error>)". */
fp_status fp_nccl_error(int result, void *nccl_comm, const char *what);

/* The table, or FP_ERR_UNSUPPORTED. */
fp_status fp_nccl_get(const fp_nccl_table **t);

#ifdef __cplusplus
}
#endif

#endif
