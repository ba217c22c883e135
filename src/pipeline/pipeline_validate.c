/* The pipeline's built-in A/B (fp_pipeline_validate, pipeline.h): the same
 * input moved through the same compute chunk by chunk with synchronous
 * pageable copies on one stream (what a loop written without this library
 * does) against a pipeline, timed by the timing engine; outputs compared
 * byte for byte; the copy and compute totals measured apart, so the report
 * says how close the pipeline came to max(copy, compute). */
#include <stdlib.h>
#include <string.h>

#include "fastpath/pipeline.h"
#include "internal.h"
#include "pipeline/bandwidth.h"

#define AB_REPORT_SIZE_FIRST sizeof(fp_pipeline_ab_report)

fp_status fp_pipeline_ab_report_init_sized(fp_pipeline_ab_report *out, size_t struct_size) {
    fp_pipeline_ab_report d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.pipeline.struct_size = sizeof d.pipeline;
    return fp_struct_init(out, struct_size, &d, AB_REPORT_SIZE_FIRST, sizeof d, "fp_pipeline_ab_report");
}

typedef struct ab_case {
    fp_context *ctx;
    int cuda;
    const fp_pipeline_config *cfg; /* with max_out_bytes and complete fixed up */
    fp_pipeline *pipe;
    const char *in;
    char *out;                     /* where the callable writes (NULL: no output) */
    size_t bytes, chunk;
    void *d_in, *d_out;            /* the baseline's and the apart measurements' buffers */
    fp_host_buf pin_in, pin_out;   /* pinned (host on CPU) buffers of one chunk */
} ab_case;


static fp_status ab_sync(ab_case *c, cudaStream_t s) {
    if (c->cuda) FP_CUDA_TRY(cudaStreamSynchronize(s));
    return FP_OK;
}

static fp_status ab_copy(ab_case *c, void *dst, const void *src, size_t n, int h2d, cudaStream_t s) {
    if (!c->cuda) {
        memcpy(dst, src, n);
        return FP_OK;
    }
    FP_CUDA_TRY(cudaMemcpyAsync(dst, src, n, h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
    return FP_OK;
}

static void chunk_of(const ab_case *c, size_t i, const void *in, void *out, fp_pipeline_chunk *ch) {
    size_t off = i * c->chunk, n = c->bytes - off < c->chunk ? c->bytes - off : c->chunk;
    memset(ch, 0, sizeof *ch);
    ch->seq = i;
    ch->host_in = (const char *)in + off;
    ch->in_bytes = n;
    ch->host_out = out ? (char *)out + off : NULL;
    ch->out_bytes = out ? n : 0;
    ch->d_in = c->d_in;
    ch->d_out = out ? c->d_out : NULL;
}

static size_t nchunks(const ab_case *c) { return (c->bytes + c->chunk - 1) / c->chunk; }

/* Baseline: per chunk, a synchronous copy from the pageable input, the
 * compute, a synchronous copy back, all on one stream. */
static fp_status baseline_fn(void *user, fp_stream stream) {
    ab_case *c = user;
    cudaStream_t s = c->cuda ? fp_ctx_stream(c->ctx, stream) : NULL;
    for (size_t i = 0; i < nchunks(c); ++i) {
        fp_pipeline_chunk ch;
        chunk_of(c, i, c->in, c->out, &ch);
        FP_TRY(ab_copy(c, c->d_in, ch.host_in, ch.in_bytes, 1, s));
        FP_TRY(ab_sync(c, s));
        FP_TRY(c->cfg->compute(c->cfg->user, c->cuda ? (fp_stream)s : NULL, &ch));
        if (ch.out_bytes) {
            FP_TRY(ab_copy(c, ch.host_out, c->d_out, ch.out_bytes, 0, s));
            FP_TRY(ab_sync(c, s));
        }
    }
    return FP_OK;
}

/* Optimized: every chunk through the pipeline, then flush. */
static fp_status pipeline_fn(void *user, fp_stream stream) {
    (void)stream;
    ab_case *c = user;
    FP_TRY(fp_pipeline_reset_stats(c->pipe));
    for (size_t i = 0; i < nchunks(c); ++i) {
        fp_pipeline_chunk ch;
        chunk_of(c, i, c->in, c->out, &ch);
        FP_TRY(fp_pipeline_submit(c->pipe, ch.host_in, ch.in_bytes, ch.host_out, ch.out_bytes, NULL, -1, NULL));
    }
    return fp_pipeline_flush(c->pipe, -1);
}

/* The stages apart, one chunk at a time on one stream, from pinned memory:
 * the copies alone, and the compute alone. */
static fp_status copies_fn(void *user, fp_stream stream) {
    ab_case *c = user;
    cudaStream_t s = c->cuda ? fp_ctx_stream(c->ctx, stream) : NULL;
    for (size_t i = 0; i < nchunks(c); ++i) {
        fp_pipeline_chunk ch;
        chunk_of(c, i, c->in, c->out, &ch);
        FP_TRY(ab_copy(c, c->d_in, c->pin_in.ptr, ch.in_bytes, 1, s));
        if (ch.out_bytes) FP_TRY(ab_copy(c, c->pin_out.ptr, c->d_out, ch.out_bytes, 0, s));
    }
    return FP_OK;
}

static fp_status compute_fn(void *user, fp_stream stream) {
    ab_case *c = user;
    cudaStream_t s = c->cuda ? fp_ctx_stream(c->ctx, stream) : NULL;
    for (size_t i = 0; i < nchunks(c); ++i) {
        fp_pipeline_chunk ch;
        chunk_of(c, i, c->in, c->out, &ch);
        FP_TRY(c->cfg->compute(c->cfg->user, c->cuda ? (fp_stream)s : NULL, &ch));
    }
    return FP_OK;
}

fp_status fp_pipeline_validate(fp_context *ctx, const fp_pipeline_config *cfg, const void *host_in, size_t bytes,
                               void *host_out, const fp_timing_config *cfg_timing, fp_pipeline_ab_report *report) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(cfg);
    FP_CHECK_NOT_NULL(host_in);
    FP_CHECK_NOT_NULL(report);
    FP_CHECK_ARG(bytes > 0, "bytes is 0: nothing to move");
    FP_TRY(fp_struct_size_check(report->struct_size, AB_REPORT_SIZE_FIRST, sizeof(fp_pipeline_ab_report),
                                "fp_pipeline_ab_report"));
    fp_pipeline_config full, pc;
    FP_STRUCT_IN(&cfg, full, sizeof(fp_pipeline_config), fp_pipeline_config_default, "fp_pipeline_config");
    pc = *cfg;
    pc.max_out_bytes = host_out ? pc.max_in_bytes : 0;
    pc.complete = NULL;
    FP_CHECK_ARG(pc.compute != NULL, "fp_pipeline_config.compute is NULL");
    FP_CHECK_ARG(pc.max_in_bytes > 0, "fp_pipeline_config.max_in_bytes (the chunk size) is 0");

    ab_case c;
    memset(&c, 0, sizeof c);
    c.ctx = ctx;
    c.cuda = fp_context_kind(ctx) == FP_DEVICE_CUDA;
    c.cfg = &pc;
    c.in = host_in;
    c.bytes = bytes;
    c.chunk = pc.max_in_bytes;
    char *base_out = NULL;
    fp_pipeline_ab_report rep;
    fp_pipeline_ab_report_init(&rep);

    fp_status st = fp_pipeline_create(ctx, &pc, &c.pipe);
    if (st == FP_OK) st = fp_mem_alloc(ctx, c.chunk, &c.d_in);
    if (st == FP_OK && host_out) st = fp_mem_alloc(ctx, c.chunk, &c.d_out);
    if (st == FP_OK) st = fp_host_buf_alloc(ctx, FP_HOST_PINNED, c.chunk, &c.pin_in);
    if (st == FP_OK && host_out) st = fp_host_buf_alloc(ctx, FP_HOST_PINNED, c.chunk, &c.pin_out);
    if (st == FP_OK && host_out) {
        base_out = malloc(bytes);
        if (!base_out) st = fp_set_error(FP_ERR_OUT_OF_MEMORY, "pipeline validate: %zu bytes of output", bytes);
    }
    if (st == FP_OK) memcpy(c.pin_in.ptr, host_in, c.chunk < bytes ? c.chunk : bytes);

    /* One run of each on poisoned outputs, compared byte for byte. */
    if (st == FP_OK) {
        if (host_out) {
            memset(base_out, 0xA5, bytes);
            memset(host_out, 0x5A, bytes);
        }
        c.out = base_out;
        st = baseline_fn(&c, NULL);
        if (st == FP_OK) {
            c.out = host_out;
            st = pipeline_fn(&c, NULL);
        }
        rep.outputs_equal = st == FP_OK && (!host_out || memcmp(base_out, host_out, bytes) == 0);
    }

    /* Timed, interleaved. The baseline writes its own buffer, so host_out
     * keeps the pipeline's output. */
    if (st == FP_OK) {
        ab_case base = c, opt = c;
        base.out = base_out;
        opt.out = host_out;
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = baseline_fn;
        spec.baseline_user = &base;
        spec.optimized = pipeline_fn;
        spec.optimized_user = &opt;
        spec.bytes = (double)bytes * (host_out ? 2.0 : 1.0);
        fp_ab_report ab;
        st = fp_ab_run(ctx, NULL, &spec, cfg_timing, &ab);
        if (st == FP_OK) {
            rep.baseline = ab.baseline;
            rep.optimized = ab.optimized;
            rep.speedup = ab.speedup;
            rep.verdict = ab.verdict;
            rep.pipeline.struct_size = sizeof rep.pipeline;
            st = fp_pipeline_get_stats(c.pipe, &rep.pipeline);
        }
    }
    /* The stages apart. */
    if (st == FP_OK) {
        fp_stats s;
        c.out = host_out;
        st = fp_time(ctx, NULL, copies_fn, &c, cfg_timing, &s);
        if (st == FP_OK) rep.copy_ms = s.median_ms;
        if (st == FP_OK) st = fp_time(ctx, NULL, compute_fn, &c, cfg_timing, &s);
        if (st == FP_OK) rep.compute_ms = s.median_ms;
        rep.overlap_bound_ms = rep.copy_ms > rep.compute_ms ? rep.copy_ms : rep.compute_ms;
    }

    fp_error_saved saved;
    fp_error_save(&saved);
    fp_pipeline_destroy(c.pipe);
    fp_mem_free(ctx, c.d_in);
    fp_mem_free(ctx, c.d_out);
    fp_host_buf_free(&c.pin_in);
    fp_host_buf_free(&c.pin_out);
    free(base_out);
    fp_error_restore(&saved);
    if (st != FP_OK) return st;
    return fp_struct_write(report, &rep, AB_REPORT_SIZE_FIRST, sizeof rep, "fp_pipeline_ab_report");
}
