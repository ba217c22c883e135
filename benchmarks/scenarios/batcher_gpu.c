/* batcher/gpu_model: the dynamic batcher's A/B with a real GPU workload per
 * batch (CUDA contexts only).
 *
 * The model runs, per batch of B (padded) requests on the context's stream:
 * upload the B request vectors (pinned), a fused RMSNorm + SiLU over a
 * [B, hidden] bf16 hidden state, a cuBLAS GEMM [B, hidden] x [hidden, hidden]
 * (bf16 in, f32 accumulate), the checked output out = 2 * in + 1 (fp_axpby)
 * and the download; then the executor waits for the stream. Reading the
 * weights dominates at small B, so a batch of 64 costs little more than a
 * batch of 1: the sublinear cost that makes batching pay.
 * Options: --clients (default 1, 8, 64, 256), --hidden (1024), --max_batch
 * (64), --delay_us (200), --requests.
 */
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include "fastpath/batcher.h"
#include "fastpath/norm.h"
#include "internal.h"
#include "scenario.h"
#include "timing/probes.h"

#define GPU_MODEL_DIM 16 /* floats per request (fp_batcher_bench's model.dim) */

typedef struct gpu_model {
    fp_context *ctx;
    int hidden, max_batch;
    float *h_in, *h_out;          /* pinned [max_batch, dim] */
    void *d_in, *d_ones, *d_out;  /* f32 [max_batch, dim] */
    void *d_x, *d_h, *d_y;        /* bf16 [max_batch, hidden] */
    void *d_w, *d_gamma;          /* bf16 [hidden, hidden], [hidden] */
} gpu_model;

static void gpu_model_free(gpu_model *m) {
    cudaFreeHost(m->h_in);
    cudaFreeHost(m->h_out);
    void *bufs[] = {m->d_in, m->d_ones, m->d_out, m->d_x, m->d_h, m->d_y, m->d_w, m->d_gamma};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) fp_mem_free(m->ctx, bufs[i]);
}

static fp_status gpu_model_init(gpu_model *m, fp_context *ctx, int hidden, int max_batch) {
    memset(m, 0, sizeof *m);
    m->ctx = ctx;
    m->hidden = hidden;
    m->max_batch = max_batch;
    size_t io = (size_t)max_batch * GPU_MODEL_DIM, act = (size_t)max_batch * hidden;
    FP_TRY(fp_ctx_activate(ctx));
    FP_CUDA_TRY(cudaMallocHost((void **)&m->h_in, io * sizeof(float)));
    FP_CUDA_TRY(cudaMallocHost((void **)&m->h_out, io * sizeof(float)));
    FP_TRY(fp_mem_alloc(ctx, io * 4, &m->d_in));
    FP_TRY(fp_mem_alloc(ctx, io * 4, &m->d_ones));
    FP_TRY(fp_mem_alloc(ctx, io * 4, &m->d_out));
    FP_TRY(fp_mem_alloc(ctx, act * 2, &m->d_x));
    FP_TRY(fp_mem_alloc(ctx, act * 2, &m->d_h));
    FP_TRY(fp_mem_alloc(ctx, act * 2, &m->d_y));
    FP_TRY(fp_mem_alloc(ctx, (size_t)hidden * hidden * 2, &m->d_w));
    FP_TRY(fp_mem_alloc(ctx, (size_t)hidden * 2, &m->d_gamma));
    FP_TRY(fb_fill_random(ctx, m->d_ones, io, FP_F32, 1, 1.0f, 1.0f)); /* all ones */
    FP_TRY(fb_fill_random(ctx, m->d_x, act, FP_BF16, 2, -1.0f, 1.0f));
    FP_TRY(fb_fill_random(ctx, m->d_w, (size_t)hidden * hidden, FP_BF16, 3, -0.03f, 0.03f));
    FP_TRY(fb_fill_random(ctx, m->d_gamma, (size_t)hidden, FP_BF16, 4, 0.5f, 1.5f));
    return FP_OK;
}

/* One batch: the executor of fp_batcher_bench (single executor thread). */
static fp_status gpu_model_execute(void *user, fp_batch_item *items, int count, int padded) {
    gpu_model *m = user;
    if (padded > m->max_batch) return FP_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < count; ++i)
        memcpy(m->h_in + (size_t)i * GPU_MODEL_DIM, items[i].input, GPU_MODEL_DIM * sizeof(float));
    if (padded > count) memset(m->h_in + (size_t)count * GPU_MODEL_DIM, 0, (size_t)(padded - count) * GPU_MODEL_DIM * sizeof(float));
    fp_context *ctx = m->ctx;
    cudaStream_t s = (cudaStream_t)fp_context_stream(ctx);
    size_t io_bytes = (size_t)padded * GPU_MODEL_DIM * sizeof(float);
    FP_TRY(fp_ctx_activate(ctx));
    FP_CUDA_TRY(cudaMemcpyAsync(m->d_in, m->h_in, io_bytes, cudaMemcpyHostToDevice, s));
    fp_norm_params np;
    fp_norm_params_default(&np);
    np.kind = FP_NORM_RMSNORM;
    np.activation = FP_NORM_ACT_SILU;
    np.rows = padded;
    np.cols = m->hidden;
    np.x_dtype = np.residual_dtype = np.out_dtype = np.param_dtype = FP_BF16;
    np.x = m->d_x;
    np.gamma = m->d_gamma;
    np.out = m->d_h;
    FP_TRY(fp_norm_forward(ctx, NULL, &np));
    void *handle = NULL;
    FP_TRY(fp_ctx_cublas_lock(ctx, NULL, &handle));
    const float one = 1.0f, zero = 0.0f;
    /* Row-major Y[B, H] = Hs[B, H] W[H, H] is column-major Y^T = W^T Hs^T. */
    cublasStatus_t cs = cublasGemmEx((cublasHandle_t)handle, CUBLAS_OP_N, CUBLAS_OP_N, m->hidden, padded,
                                     m->hidden, &one, m->d_w, CUDA_R_16BF, m->hidden, m->d_h, CUDA_R_16BF,
                                     m->hidden, &zero, m->d_y, CUDA_R_16BF, m->hidden, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    fp_ctx_cublas_unlock(ctx);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return fp_set_error(FP_ERR_CUBLAS, "cublasGemmEx: %s", cublasGetStatusString(cs));
    FP_TRY(fp_axpby(ctx, NULL, 2, FP_F32, (size_t)padded * GPU_MODEL_DIM, 2.0f, m->d_in, 1.0f, m->d_ones,
                    m->d_out));
    FP_CUDA_TRY(cudaMemcpyAsync(m->h_out, m->d_out, io_bytes, cudaMemcpyDeviceToHost, s));
    FP_CUDA_TRY(cudaStreamSynchronize(s));
    for (int i = 0; i < count; ++i)
        memcpy(items[i].output, m->h_out + (size_t)i * GPU_MODEL_DIM, GPU_MODEL_DIM * sizeof(float));
    return FP_OK;
}

static fp_status run_gpu_model(fb_run *run) {
    if (fb_kind(run) != FP_DEVICE_CUDA) return fb_skip(run, "needs a CUDA device (the model is GPU work)");
    int quick = fb_quick(run);
    int hidden = (int)fb_opt_int(run, "hidden", 1024);
    int max_batch = (int)fb_opt_int(run, "max_batch", 64);
    if (hidden < 8 || hidden % 8 || max_batch < 1) return fb_skip(run, "--hidden must be a multiple of 8, --max_batch >= 1");
    gpu_model m;
    fp_status st = gpu_model_init(&m, fb_ctx(run), hidden, max_batch);
    int clients_list[4] = {1, 8, 64, 256}, nclients = 4;
    if (fb_opt_given(run, "clients")) {
        clients_list[0] = (int)fb_opt_int(run, "clients", 64);
        nclients = 1;
    } else if (quick) {
        clients_list[0] = 64;
        nclients = 1;
    }
    for (int i = 0; st == FP_OK && i < nclients; ++i) {
        fp_batcher_bench_config c;
        fp_batcher_bench_config_default(&c);
        c.load = FP_BATCHER_LOAD_CLOSED;
        c.clients = clients_list[i];
        c.requests = (int)fb_opt_int(run, "requests", quick ? 1000 : 8192);
        c.warmup_requests = quick ? 64 : 256;
        c.batcher.max_batch_size = max_batch;
        c.batcher.max_queue_delay_us = fb_opt_int(run, "delay_us", 200);
        c.batcher.executor_threads = 1; /* one stream, one set of buffers */
        c.model.dim = GPU_MODEL_DIM;
        c.executor = gpu_model_execute;
        c.executor_user = &m;
        fp_batcher_bench_report rep;
        fp_status bst = fp_batcher_bench(&c, &rep);
        fb_result *r = fb_result_new(run);
        fb_param_int(r, "clients", c.clients);
        fb_param_int(r, "hidden", hidden);
        fb_param_int(r, "max_batch", max_batch);
        fb_param_str(r, "model", "rmsnorm+silu+gemm bf16");
        if (bst != FP_OK) {
            fb_result_fail(r, bst, fp_last_error());
            continue;
        }
        fb_result_set_ab(r, &rep.ab);
        fb_result_metric(r, "throughput_rps", rep.batched.throughput_rps);
        fb_result_metric(r, "throughput_speedup", rep.speedup);
        fb_result_metric(r, "baseline_rps", rep.baseline.throughput_rps);
        fb_result_metric(r, "p99_queue_us", rep.batched.stats.queue_time.p99_us);
        fb_result_metric(r, "batch_exec_p99_us", rep.batched.stats.executor.p99_us);
        fb_result_metric(r, "mean_batch", rep.batched.stats.mean_batch_size);
        if (rep.batched.wrong_outputs || rep.baseline.wrong_outputs)
            fb_result_fail(r, FP_ERR_MISMATCH, "wrong outputs from the GPU model");
    }
    gpu_model_free(&m);
    if (st != FP_OK) {
        fb_result *r = fb_result_new(run);
        fb_result_fail(r, st, fp_last_error());
    }
    return FP_OK;
}

FB_SCENARIO(fb_batcher_gpu_model, "batcher/gpu_model",
            "dynamic batching vs batch 1 with a GPU model per batch (RMSNorm+SiLU, cuBLAS GEMM)",
            run_gpu_model)
