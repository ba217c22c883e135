/* graph/chain: what a CUDA graph saves on a step made of many tiny kernels.
 *
 * The step is a chain of --kernels (10, 100 and 500 by default) launches of
 * the timing probe axpby on a 256-float buffer: the first writes
 * out = x0 + ones, each next one out = out + ones, so a step leaves
 * x0 + kernels in out whatever ran before it (the eager and the replayed
 * side must agree exactly, and both start from the same state). Each kernel
 * moves 3 KiB: the step is all launch overhead. Baseline: the chain launched
 * eagerly; optimized: fp_graph_replay of its capture, through
 * fp_graph_validate (the timing engine's interleaved A/B). Reported:
 * saved_us_per_kernel = (eager - replay) / kernels and the eager cost per
 * kernel. On a CPU context a replay calls the recorded chain (graph.h), so
 * the row reads SAME: it checks the path, not a saving. --pdl 1: both sides
 * with programmatic dependent launch (FP_CTX_LAUNCH_PDL; graph/pdl times it
 * against without).
 */
#include "fastpath/graph.h"
#include "scenario.h"
#include "timing/probes.h"

enum { CHAIN_N = 256 }; /* floats per buffer: small enough that a kernel is all launch */

typedef struct chain_case {
    fp_context *ctx;
    int kernels;
    const void *x0, *ones;
    void *out;
} chain_case;

static fp_status chain_fn(void *user, fp_stream stream) {
    chain_case *c = user;
    /* version 1: one scalar element per thread, the smallest kernel the
     * probe has; in place (x == out) is element-wise safe */
    fp_status st = fp_axpby(c->ctx, stream, 1, FP_F32, CHAIN_N, 1.0f, c->x0, 1.0f, c->ones, c->out);
    for (int k = 1; k < c->kernels && st == FP_OK; ++k)
        st = fp_axpby(c->ctx, stream, 1, FP_F32, CHAIN_N, 1.0f, c->out, 1.0f, c->ones, c->out);
    return st;
}

static void run_chain_shape(fb_run *run, int kernels) {
    fp_context *ctx = fb_ctx(run);
    fb_result *r = fb_result_new(run);
    fb_param_int(r, "kernels", kernels);
    if (fb_opt_given(run, "pdl")) fb_param_int(r, "pdl", fb_opt_int(run, "pdl", 0));
    chain_case c = {ctx, kernels, NULL, NULL, NULL};
    void *x0 = NULL, *ones = NULL;
    fp_graph *g = NULL;
    const size_t bytes = CHAIN_N * sizeof(float);
    /* x0 random in [1, 2): never zero, and x0 + kernels stays exact in f32 */
    fp_status st = fb_alloc_random(ctx, CHAIN_N, FP_F32, 11, 1.0f, 2.0f, &x0);
    if (st == FP_OK) st = fp_mem_alloc(ctx, bytes, &ones);
    if (st == FP_OK) st = fp_mem_alloc(ctx, bytes, &c.out);
    if (st == FP_OK) {
        float h_ones[CHAIN_N];
        for (int i = 0; i < CHAIN_N; ++i) h_ones[i] = 1.0f;
        st = fp_mem_upload(ctx, ones, h_ones, bytes, NULL);
    }
    if (st == FP_OK) st = fp_mem_fill(ctx, c.out, 0xff, bytes, NULL); /* poison: NaN */
    c.x0 = x0;
    c.ones = ones;
    if (st == FP_OK) st = fp_graph_capture(ctx, NULL, chain_fn, &c, NULL, &g);
    fp_ab_report rep;
    double saved_per_kernel = 0;
    if (st == FP_OK)
        st = fp_graph_validate(g, NULL, chain_fn, &c, c.out, CHAIN_N, FP_F32, fb_timing(run), &rep,
                               &saved_per_kernel);
    fp_graph_info info;
    fp_graph_info_init(&info);
    if (st == FP_OK) st = fp_graph_get_info(g, &info);
    if (st == FP_OK) {
        fb_result_set_ab(r, &rep);
        /* per kernel of the chain as launched (the graph's kernel_nodes may
         * differ when an op is not one kernel): the figure the target reads */
        fb_result_metric(r, "saved_us_per_kernel",
                         (rep.baseline.median_ms - rep.optimized.median_ms) * 1e3 / kernels);
        fb_result_metric(r, "eager_us_per_kernel", rep.baseline.median_ms * 1e3 / kernels);
        fb_result_metric(r, "kernel_nodes", (double)info.kernel_nodes);
        fb_result_metric(r, "capture_ms", info.capture_ms);
        fb_result_metric(r, "instantiate_ms", info.instantiate_ms);
        if (info.cpu) fb_result_note(r, "cpu: a replay calls the chain (no launch saved)");
        else if (info.kernel_nodes != (size_t)kernels)
            fb_result_note(r, "graph has %zu kernel nodes for %d launches", info.kernel_nodes, kernels);
    } else {
        fb_result_fail(r, st, fp_last_error());
    }
    fp_status dst = fp_graph_destroy(g);
    if (dst != FP_OK && st == FP_OK) fb_result_fail(r, dst, fp_last_error());
    fp_mem_free(ctx, x0);
    fp_mem_free(ctx, ones);
    fp_mem_free(ctx, c.out);
}

static fp_status run_chain(fb_run *run) {
    const int64_t pdl = fb_opt_int(run, "pdl", 0);
    if (pdl != 0 && pdl != 1) {
        fb_result_fail(fb_result_new(run), FP_ERR_INVALID_ARGUMENT, "--pdl must be 0 or 1");
        return FP_OK;
    }
    fp_context_set_option(fb_ctx(run), FP_CTX_LAUNCH_PDL, pdl ? 1 : 0);
    if (fb_opt_given(run, "kernels")) {
        const int64_t k = fb_opt_int(run, "kernels", 0);
        /* every kernel is a node: CUDA graphs of 10^5 nodes take seconds to
         * instantiate, and nothing is learned past a few thousand */
        if (k < 1 || k > 10000) {
            fb_result *r = fb_result_new(run);
            fb_param_int(r, "kernels", k);
            fb_result_fail(r, FP_ERR_INVALID_ARGUMENT, "--kernels must be in [1, 10000]");
        } else {
            run_chain_shape(run, (int)k);
        }
    } else {
        static const int kernels[] = {10, 100, 500};
        for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; ++i) run_chain_shape(run, kernels[i]);
    }
    fp_context_set_option(fb_ctx(run), FP_CTX_LAUNCH_PDL, 0);
    return FP_OK;
}

FB_SCENARIO(fb_graph_chain, "graph/chain",
            "a chain of tiny kernels: eager launches vs one CUDA graph replay (launch time saved per kernel)",
            run_chain)
