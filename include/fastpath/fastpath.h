/* libfastpath: GPU optimizations with built-in proof of their speedup.
 * Umbrella header: include this one. See core.h for the conventions. */
#ifndef FASTPATH_FASTPATH_H
#define FASTPATH_FASTPATH_H

#include "fastpath/core.h"
#include "fastpath/timing.h"
#include "fastpath/alloc.h"
#include "fastpath/norm.h"
#include "fastpath/attention.h"
#include "fastpath/batcher.h"
#include "fastpath/graph.h"
#include "fastpath/pinned.h"
#include "fastpath/pipeline.h"
#include "fastpath/comm.h"
#include "fastpath/trace.h"

#endif /* FASTPATH_FASTPATH_H */
