/* Helpers the trace tests share: a context's trace statistics, and the
 * event records since the last call (the emulated runtime counts them:
 * tests/emu/emu_runtime_counts.h; -1 on a GPU, where nobody counts). */
#ifndef FP_TRACE_TEST_UTIL_H
#define FP_TRACE_TEST_UTIL_H

#include <string.h>

#include "fp_test.h"
#if FP_TEST_EMULATED
#include "emu_runtime_counts.h"
#endif

static inline fp_trace_stats stats_of(fp_context *ctx) {
    fp_trace_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_OK(fp_trace_get_stats(ctx, &st));
    return st;
}

static inline long long events_since(void) {
#if FP_TEST_EMULATED
    fp_emu_runtime_counts c;
    fp_emu_runtime_counts_get(&c);
    fp_emu_runtime_counts_reset();
    return c.n[FP_EMU_CALL_EVENT_RECORD];
#else
    return -1;
#endif
}

#endif /* FP_TRACE_TEST_UTIL_H */
