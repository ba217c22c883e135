/* The CUPTI timer of CUDA spans (trace.h, FP_TRACE_TIMER_CUPTI): one
 * process-wide collector of CUPTI activity records, shared by every traced
 * context that chose it. Not installed.
 *
 * How a span gets its times without a driver call:
 *   - fp_cupti_push(index, seq) at the span's begin pushes the external
 *     correlation id (index << 40 | seq) on the calling thread's CUPTI stack
 *     (CUSTOM0); fp_cupti_pop at its end pops it. Host work only.
 *   - CUPTI then writes, for each launch / copy / set the thread issues
 *     inside, an external-correlation record (CUPTI's correlation id ->
 *     ours) before the API record, and for the device work a kernel, memcpy
 *     or memset record with its GPU start and end. Only the APIs that enqueue
 *     device work are traced (their names hold Launch, Memcpy or Memset).
 *   - The collector (CUPTI's buffer callbacks, on CUPTI's thread or the
 *     flushing one) joins the two by correlation id and files (seq, start,
 *     end) under the registered index; the ring's owner drains them
 *     (fp_cupti_take) when it resolves spans, after fp_cupti_flush.
 *   - Times are the trace clock's (CLOCK_MONOTONIC, in ns): CUPTI is given
 *     it as its timestamp source (cuptiActivityRegisterTimestampCallback);
 *     where that is refused, CUPTI's own clock is offset to it.
 *
 * Loading: libfastpath does not link CUPTI. The first use looks for it:
 * FASTPATH_CUPTI_LIB (a path), a libcupti the process has loaded, the
 * dynamic linker's search, then the one found at build time. The emulated
 * build (tests/emu) calls tests/emu/cupti_emu.cpp's entry points. */
#ifndef FASTPATH_TRACE_CUPTI_H
#define FASTPATH_TRACE_CUPTI_H

#include <stddef.h>
#include <stdint.h>

#include "fastpath/core.h"

/* A device activity filed under a registered index. */
typedef struct fp_cupti_rec {
    uint64_t seq;      /* the span's handle (the pushed id's low 40 bits) */
    uint64_t start_ns; /* trace clock */
    uint64_t end_ns;
} fp_cupti_rec;

/* Loads CUPTI (once). FP_OK, or FP_ERR_UNSUPPORTED with a message saying
 * why (built without CUPTI's headers, library not found, too old). */
fp_status fp_cupti_load(void);
/* Where CUPTI was loaded from ("" before / without). */
const char *fp_cupti_from(void);

/* Registers a ring: starts the collector at the first (activity kinds
 * enabled, buffer callbacks registered) and gives the ring its index.
 * Errors: FP_ERR_UNSUPPORTED (not loadable, or CUPTI refused: another tool
 * owns it), FP_ERR_OUT_OF_MEMORY, FP_ERR_INVALID_ARGUMENT (256 rings). */
fp_status fp_cupti_attach(uint32_t *index);
/* Unregisters (records still arriving for it are discarded); the collector
 * stops (kinds disabled, buffers flushed) when the last ring goes. */
void fp_cupti_detach(uint32_t index);

/* The span's begin / end on the calling thread: 1 when pushed. */
int fp_cupti_push(uint32_t index, uint64_t seq);
void fp_cupti_pop(void);

/* The trace clock now, in ns (the clock CUPTI's records are in). */
uint64_t fp_cupti_now_ns(void);

/* Delivers every record CUPTI holds (a forced flush): call after the work
 * whose records are wanted has completed. Device records whose API call was
 * not seen by then are discarded (counted by fp_cupti_lost). */
void fp_cupti_flush(void);
/* Takes the records filed under `index` so far: a malloc'd array of *n
 * (NULL when none) the caller frees. */
fp_cupti_rec *fp_cupti_take(uint32_t index, size_t *n);
/* Device records that could not be filed since the process began: their
 * correlation was never seen (a lost buffer, CUPTI's dropped records). */
uint64_t fp_cupti_lost(void);

#endif /* FASTPATH_TRACE_CUPTI_H */
