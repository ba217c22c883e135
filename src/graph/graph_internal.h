/* What the graph cache (graph_cache.c) uses of graph.c. */
#ifndef FASTPATH_GRAPH_INTERNAL_H
#define FASTPATH_GRAPH_INTERNAL_H

#include "fastpath/graph.h"

/* Counts a graph (or cache) as a user of the pool: fp_graph_pool_destroy
 * refuses while any remain. */
void fp_graph_pool_use(fp_graph_pool *p, int delta);
/* fp_graph_replay without the live-handle check (the caller owns g). */
fp_status fp_graph_replay_unchecked(fp_graph *g, fp_stream stream);
/* cudaStreamLegacy / cudaStreamPerThread: streams that cannot be captured. */
int fp_graph_is_legacy_stream(fp_stream s);

#endif /* FASTPATH_GRAPH_INTERNAL_H */
