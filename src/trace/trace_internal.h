/* Shared by the trace layer's files (trace.c records, export_*.c write):
 * the finished spans copied out of a context's ring. Not installed. */
#ifndef FASTPATH_TRACE_INTERNAL_H
#define FASTPATH_TRACE_INTERNAL_H

#include "internal.h"
#include "fastpath/trace.h"

/* What an export writes: the finished spans of a context's ring, oldest
 * first, resolved (CUDA events read); streams[i], the small stream number of
 * spans[i] per device from 1 in order of first appearance (the Chrome
 * trace's tid and the SQLite stream column); origin, the earliest start
 * (exported times count from it). */
typedef struct fp_trace_export {
    fp_trace_span *spans;
    int *streams;
    size_t n;
    double origin;
} fp_trace_export;

/* Checks ctx and path (`what` names the caller in messages) and fills x.
 * Errors: FP_ERR_INVALID_ARGUMENT, FP_ERR_OUT_OF_MEMORY (x then empty). */
fp_status fp_trace_export_begin(fp_context *ctx, const char *path, const char *what, fp_trace_export *x);
/* Frees what fp_trace_export_begin allocated. */
void fp_trace_export_end(fp_trace_export *x);

#endif /* FASTPATH_TRACE_INTERNAL_H */
