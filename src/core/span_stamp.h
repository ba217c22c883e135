/* The kernel timer's handle (trace.h, FP_TRACE_TIMER_KERNEL): what an op
 * passes to its kernels so that they time its span themselves, with no
 * event or other driver call per span. Plain data, passed by value in a
 * kernel's parameters (24 bytes); shared by the host code (src/trace) and
 * the kernels (kernels/common/span_stamp.cuh). Not installed.
 *
 * rec points at the span's record in device memory, four 64-bit words:
 *   [0] the handle of the span that last wrote the record,
 *   [1] its start: the GPU's global timer (ns) when the first CTA of its
 *       first kernel began, after the kernel's PDL wait,
 *   [2] its end: the latest global timer reading of any CTA of any of its
 *       kernels, at the CTA's end (an atomic max: a record's earlier
 *       occupant ended earlier, so no reset is needed between uses),
 *   [3] unused (alignment).
 * rec NULL: the span is not timed by its kernels (tracing off, another
 * timer, a capturing stream); every kernel then pays one uniform branch. */
#ifndef FP_SPAN_STAMP_H
#define FP_SPAN_STAMP_H

typedef struct fp_span_stamp {
    unsigned long long *rec;
    unsigned long long seq;
    /* rec again, for the end stamp: a parameter of its own is loaded where
     * the kernel ends instead of rec being held in two registers from its
     * start (the compiler merges two loads of one parameter): the tight
     * norm kernels keep their register counts (tests/sass/check_sass.py) */
    unsigned long long *rec_end;
} fp_span_stamp;

#define FP_SPAN_STAMP_WORDS 4

#endif /* FP_SPAN_STAMP_H */
