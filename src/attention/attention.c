/* Attention dispatch: fp_attention_forward (flash on CUDA, tiled on the CPU),
 * fp_attention_forward_baseline (materialized scores: cuBLAS + softmax
 * kernel on CUDA, naive on the CPU) and fp_attention_validate (the two
 * through fp_ab_run). */
#include <cublas_v2.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention/attention_internal.h"

/* The flash path once the arguments were checked. */
static fp_status forward_run(fp_context *ctx, fp_stream stream, fp_attn_args *a) {
    if (ctx->kind != FP_DEVICE_CUDA) {
        fp_status st = fp_attn_cpu_tiled(ctx->pool, a);
        if (st == FP_OK) fp_attn_note_kernel(a, -1, 1);
        return st;
    }
    FP_TRY(fp_ctx_activate(ctx));
    cudaStream_t s = fp_ctx_stream(ctx, stream);
    a->ctx = ctx;
    if (a->kv_fp8_cache) {
        if ((a->dtype == FP_F16 || a->dtype == FP_BF16) && fp_attn_cuda_flash_kv8_supported(a->head_dim))
            return fp_attn_cuda_flash(a, ctx->attn_kernel, ctx->info.sm_count,
                                      10 * ctx->info.cc_major + ctx->info.cc_minor, s);
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention: an fp8 KV cache with %s Q at head_dim %d on a CUDA context (the kernel "
                            "takes f16 / bf16 Q at head_dim 64, 128 or 256; a CPU context runs every shape)",
                            fp_dtype_name(a->dtype), a->head_dim);
    }
    if (fp_attn_cuda_flash_supported(a->dtype, a->head_dim))
        return fp_attn_cuda_flash(a, ctx->attn_kernel, ctx->info.sm_count,
                                  10 * ctx->info.cc_major + ctx->info.cc_minor, s);
    if (a->dtype == FP_FP8_E4M3)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention: fp8 e4m3 inputs at head_dim %d on a CUDA context (the fp8 kernel takes "
                            "head_dim 128)",
                            a->head_dim);
    if (ctx->attn_kernel >= 2)
        fp_attn_note_fallback(a->dtype == FP_F32 ? "f32 runs the row-wise kernel (no flash kernel for f32)"
                                                 : "this head_dim has no flash kernel (32, 64, 96, 128, 256)");
    fp_status st = fp_attn_cuda_rowwise(a, s);
    if (st == FP_OK) fp_attn_note_kernel(a, 0, 1);
    return st;
}

/* The span's name (trace.h): a few query rows against a longer K/V is a
 * decode step (attention.h's seqlen_q), anything else a forward. */
static const char *span_name(const fp_attn_args *a) {
    return a->seqlen_q <= 16 && a->seqlen_k > a->seqlen_q ? "attention_decode" : "attention_fwd";
}

fp_status fp_attention_forward(fp_context *ctx, fp_stream stream, const fp_attention_params *params) {
    FP_TRY(fp_ctx_check(ctx, -1));
    fp_attn_args a;
    const int cuda = ctx->kind == FP_DEVICE_CUDA;
    fp_attn_note_begin(cuda ? ctx->attn_kernel : 0);
    FP_TRY(fp_attn_check(params, cuda, &a));
    /* a.stamp: under the kernel timer, the kernels time the span (no event) */
    const uint64_t span = fp_ctx_trace_begin_stamped(ctx, stream, span_name(&a), "op", fp_attn_bytes(&a),
                                                     fp_attention_flops(params), &a.stamp);
    const fp_status st = forward_run(ctx, stream, &a);
    fp_ctx_trace_end(ctx, span);
    return st;
}

/* The baseline's cuBLAS handle is the context's (fp_ctx_cublas_lock):
 * created on first use, held and bound to the call's stream for its GEMMs,
 * destroyed with the context. */

static fp_status cublas_check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return FP_OK;
    return fp_set_error(st == CUBLAS_STATUS_ALLOC_FAILED ? FP_ERR_OUT_OF_MEMORY : FP_ERR_CUBLAS,
                        "%s failed: %s", what, cublasGetStatusString(st));
}

static cudaDataType_t cuda_type(fp_dtype dt) {
    return dt == FP_F32 ? CUDA_R_32F : dt == FP_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

/* S[b, h] = Q[b, :, h] K[b, :, hk]^T per (batch, head) and O = P V with the
 * context's cuBLAS handle. GEMMs are issued per sequence (all heads as one
 * strided batch) or, with GQA, per (sequence, kv head) with the K/V stride 0
 * so the group's query heads share one K/V head. Column-major view: a
 * row-major [seqlen, head_dim] slice with row stride ld is a col-major
 * [head_dim, seqlen] matrix with leading dimension ld. Scores are [batch *
 * heads_q, seqlen_q, seqlen_k] (row stride seqlen_k); a varlen sequence
 * fills the top-left [sq_b, L_b] corner of its slices, the softmax kernel
 * zeroes P past L_b. cu_q/cu_k/lens_k are host copies of the varlen offsets
 * and the ragged key lengths (or NULL): the GEMMs span only the L_b valid
 * keys, so nothing past a cache's length is read (0 * NaN there would make
 * the baseline NaN where flash, which never reads it, is fine). The first
 * GEMM applies the softmax scale (alpha) before its f32 result is rounded to
 * dtype, as PyTorch's math path scales before the product: rounding the
 * unscaled Q K^T to f16 overflows to inf sqrt(head_dim) times sooner (at
 * head_dim 128, |q.k| > 65504 already with |q|, |k| entries ~ 23), and the
 * softmax then runs with scale 1. */
static fp_status baseline_gemms(cublasHandle_t hdl, const fp_attn_args *a, const int32_t *cu_q,
                                const int32_t *cu_k, const int32_t *lens_k, void *scores, int which,
                                cudaStream_t stream) {
    const size_t elt = fp_dtype_size(a->dtype);
    const int D = a->head_dim, SQ = a->seqlen_q, SK = a->seqlen_k;
    const long long s_stride = (long long)SQ * SK;
    const int gqa = a->group > 1;
    const int per_b = gqa ? a->heads_kv : 1;
    const int count = gqa ? a->group : a->heads_q;
    const float one = 1.0f, zero = 0.0f, scale = a->scale;
    const cudaDataType_t t = cuda_type(a->dtype);
    /* ld of a dimension of extent 1 is irrelevant but must be >= head_dim */
    const long long ldq = SQ > 1 ? a->q_ss : D, ldk = SK > 1 ? a->k_ss : D;
    const long long ldv = SK > 1 ? a->v_ss : D, ldo = SQ > 1 ? a->o_ss : D;
    for (int b = 0; b < a->batch; ++b) {
        fp_attn_args hv = *a; /* host view of the offsets for fp_attn_seq_host */
        hv.cu_q = cu_q;
        hv.cu_k = cu_k;
        hv.seqlens_k = lens_k;
        const fp_attn_seq S = fp_attn_seq_host(&hv, b);
        if (S.sq == 0) continue;
        if (S.L == 0) { /* no keys: O = 0 (no GEMM of k = 0) */
            if (which == 1) FP_TRY(fp_attn_cuda_zero_rows(a, S.o0, S.sq, stream));
            continue;
        }
        for (int u = 0; u < per_b; ++u) {
            int hk = gqa ? u : 0, h0 = gqa ? hk * a->group : 0;
            const char *q = (const char *)a->q + (size_t)(S.q0 + h0 * a->q_hs) * elt;
            const char *k = (const char *)a->k + (size_t)(S.k0 + hk * a->k_hs) * elt;
            const char *v = (const char *)a->v + (size_t)(S.v0 + hk * a->v_hs) * elt;
            char *o = (char *)a->o + (size_t)(S.o0 + h0 * a->o_hs) * elt;
            char *s = (char *)scores + (size_t)(((long long)b * a->heads_q + h0) * s_stride) * elt;
            long long ks = gqa ? 0 : a->k_hs, vs = gqa ? 0 : a->v_hs;
            if (which == 0) {
                /* S^T (col-major L x sq, ld SK) = K^T Q: scores row-major [sq, SK] */
                FP_TRY(cublas_check(cublasGemmStridedBatchedEx(hdl, CUBLAS_OP_T, CUBLAS_OP_N, S.L, S.sq, D, &scale,
                                                               k, t, (int)ldk, ks, q, t, (int)ldq, a->q_hs,
                                                               &zero, s, t, SK, s_stride, count,
                                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                    "cublasGemmStridedBatchedEx (Q K^T)"));
            } else {
                /* O^T (col-major D x sq) = V^T P^T */
                FP_TRY(cublas_check(cublasGemmStridedBatchedEx(hdl, CUBLAS_OP_N, CUBLAS_OP_N, D, S.sq, S.L, &one,
                                                               v, t, (int)ldv, vs, s, t, SK, s_stride, &zero,
                                                               o, t, (int)ldo, a->o_hs, count,
                                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                    "cublasGemmStridedBatchedEx (P V)"));
            }
        }
    }
    return FP_OK;
}

/* cuBLAS's own workspace, a slice of the call's scratch: without one, cuBLAS
 * allocates a workspace per stream on first use (cudaMalloc: not during a
 * capture), and a context-wide one would be shared by GEMMs running on
 * different streams at once. 4 MiB: NVIDIA's recommendation before Hopper;
 * 32 MiB on Hopper (cc 9.x), for its split-K kernels. */
static size_t cublas_ws_bytes(const fp_context *ctx) {
    return ctx->info.cc_major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
}

static size_t align256(double bytes) { return ((size_t)bytes + 255) & ~(size_t)255; }

/* scores: [batch * heads_q, seqlen_q, seqlen_k] of dtype; cublas_ws: the
 * GEMMs' workspace (cublas_ws_bytes). */
static fp_status baseline_cuda(fp_context *ctx, const fp_attn_args *a, void *scores, void *cublas_ws,
                               cudaStream_t stream) {
    if (a->q_ss > 2147483647LL || a->k_ss > 2147483647LL || a->v_ss > 2147483647LL ||
        a->o_ss > 2147483647LL)
        return fp_set_error(FP_ERR_UNSUPPORTED, "attention baseline: a sequence stride exceeds int");
    /* varlen / ragged decode: the GEMM shapes depend on the offsets and key
     * lengths, so the baseline reads them back (a stream synchronization:
     * acceptable for a baseline; the one op here that is not capturable).
     * Layout: cu_q [batch+1], cu_k [batch+1], seqlens_k [batch]. */
    int32_t *cu = NULL;
    const size_t nb = sizeof(int32_t) * ((size_t)a->batch + 1);
    if (a->cu_q || a->seqlens_k) {
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        FP_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
        if (cs != cudaStreamCaptureStatusNone) /* a synchronization would invalidate the capture */
            return fp_set_error(FP_ERR_UNSUPPORTED, "attention baseline: with cu_seqlens or seqlens_k it reads them "
                                                    "back (a stream synchronization) and cannot be captured");
        cu = malloc(3 * nb);
        if (!cu) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "attention baseline: host offsets");
        cudaError_t e = cudaSuccess;
        if (a->cu_q) e = cudaMemcpyAsync(cu, a->cu_q, nb, cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess && a->cu_q)
            e = cudaMemcpyAsync(cu + a->batch + 1, a->cu_k, nb, cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess && a->seqlens_k)
            e = cudaMemcpyAsync(cu + 2 * (a->batch + 1), a->seqlens_k, nb - sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) {
            free(cu);
            return fp_cuda_status(e, "reading cu_seqlens / seqlens_k", __FILE__, __LINE__);
        }
    }
    const int32_t *cu_q = a->cu_q ? cu : NULL, *cu_k = a->cu_q ? cu + a->batch + 1 : NULL;
    const int32_t *lens_k = a->seqlens_k ? cu + 2 * (a->batch + 1) : NULL;
    /* The context's handle is shared: hold it (bound to our stream) across
     * the GEMMs, or another thread could rebind it to its stream between our
     * cublasSetStream and our GEMMs (the header promises thread-safety for
     * one CUDA context). */
    void *handle = NULL;
    fp_status st = fp_ctx_cublas_lock(ctx, (fp_stream)stream, &handle);
    if (st == FP_OK) {
        cublasHandle_t hdl = (cublasHandle_t)handle;
        st = cublas_check(cublasSetWorkspace(hdl, cublas_ws, cublas_ws_bytes(ctx)), "cublasSetWorkspace");
        if (st == FP_OK) st = baseline_gemms(hdl, a, cu_q, cu_k, lens_k, scores, 0, stream);
        fp_attn_args scaled = *a; /* the first GEMM applied the scale */
        scaled.scale = 1.0f;
        if (st == FP_OK) st = fp_attn_cuda_masked_softmax(&scaled, scores, stream);
        if (st == FP_OK) st = baseline_gemms(hdl, a, cu_q, cu_k, lens_k, scores, 1, stream);
        fp_ctx_cublas_unlock(ctx);
    }
    free(cu);
    return st;
}

/* Paged KV: the materialized baseline first gathers the pages into dense K
 * and V (what code without paged attention does, into kd / vd: [batch,
 * seqlen_k, heads_kv, head_dim]), then runs as dense. */
static fp_status baseline_cuda_paged(fp_context *ctx, const fp_attn_args *a, void *kd, void *vd, void *scores,
                                     void *cublas_ws, cudaStream_t stream) {
    FP_TRY(fp_attn_cuda_gather_pages(a, kd, vd, stream));
    fp_attn_args d = *a;
    d.block_table = NULL;
    d.bt_stride = d.page_size = d.num_pages = 0;
    d.k = kd;
    d.v = vd;
    d.k_hs = d.v_hs = a->head_dim;
    d.k_ss = d.v_ss = (int64_t)a->heads_kv * a->head_dim;
    d.k_bs = d.v_bs = (int64_t)a->seqlen_k * a->heads_kv * a->head_dim;
    return baseline_cuda(ctx, &d, scores, cublas_ws, stream);
}

/* The baseline on CUDA once the arguments were checked. */
static fp_status baseline_run_cuda(fp_context *ctx, fp_stream stream, const fp_attn_args *a) {
    FP_TRY(fp_ctx_activate(ctx));
    cudaStream_t s = fp_ctx_stream(ctx, stream);
    /* One scratch buffer (the stream's workspace): scores, then with a paged
     * cache the dense K and V, then cuBLAS's workspace. */
    const size_t elt = fp_dtype_size(a->dtype);
    const double scores = (double)a->batch * a->heads_q * (double)a->seqlen_q * a->seqlen_k * (double)elt;
    const double kv = a->block_table ? (double)a->batch * a->seqlen_k * a->heads_kv * (double)a->head_dim * elt : 0.0;
    if (scores > 1.0e15)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "attention baseline: score matrix needs %.3g bytes", scores);
    if (kv > 1.0e15)
        return fp_set_error(FP_ERR_OUT_OF_MEMORY, "attention baseline: dense K/V need %.3g bytes", 2 * kv);
    const size_t s_bytes = align256(scores), kv_bytes = align256(kv);
    fp_scratch w;
    FP_TRY(fp_ctx_scratch_get(ctx, s, s_bytes + 2 * kv_bytes + cublas_ws_bytes(ctx), "attention baseline", &w));
    char *base = w.ptr, *cublas_ws = base + s_bytes + 2 * kv_bytes;
    fp_status st = a->block_table
                       ? baseline_cuda_paged(ctx, a, base + s_bytes, base + s_bytes + kv_bytes, base, cublas_ws, s)
                       : baseline_cuda(ctx, a, base, cublas_ws, s);
    const fp_status put = fp_ctx_scratch_put(&w);
    return st != FP_OK ? st : put;
}

/* The CUDA baseline's GEMMs are cuBLAS's in the inputs' dtype: fp8 inputs
 * (with their bf16 O and descales) have none there. */
static fp_status baseline_dtype_check(int cuda, const fp_attn_args *a) {
    if (cuda && a->kv_fp8_cache)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention baseline: an fp8 KV cache (kv_dtype fp8e4m3) is not supported on a CUDA "
                            "context (the cuBLAS baseline runs Q, K, V in one dtype: dequantize K, V for a "
                            "baseline; a CPU context runs it)");
    if (cuda && a->dtype == FP_FP8_E4M3)
        return fp_set_error(FP_ERR_UNSUPPORTED,
                            "attention baseline: dtype fp8e4m3 is not supported on a CUDA context (the "
                            "cuBLAS baseline runs bf16, f16 or f32: dequantize Q, K, V to bf16 for a "
                            "baseline; a CPU context runs fp8)");
    return FP_OK;
}

fp_status fp_attention_forward_baseline(fp_context *ctx, fp_stream stream, const fp_attention_params *params) {
    FP_TRY(fp_ctx_check(ctx, -1));
    fp_attn_args a;
    const int cuda = ctx->kind == FP_DEVICE_CUDA;
    FP_TRY(fp_attn_check(params, cuda, &a));
    FP_TRY(baseline_dtype_check(cuda, &a));
    const uint64_t span =
        fp_ctx_trace_begin(ctx, stream, "attention_fwd_baseline", "op", fp_attn_bytes(&a), fp_attention_flops(params));
    const fp_status st = cuda ? baseline_run_cuda(ctx, stream, &a) : fp_attn_cpu_naive(ctx->pool, &a);
    fp_ctx_trace_end(ctx, span);
    return st;
}

/* ------------------------------------------------------------------------ */
/*  Validate                                                                */
/* ------------------------------------------------------------------------ */

typedef struct validate_side {
    fp_context *ctx;
    fp_attention_params p;
} validate_side;

static fp_status run_baseline(void *user, fp_stream stream) {
    validate_side *s = user;
    return fp_attention_forward_baseline(s->ctx, stream, &s->p);
}

static fp_status run_flash(void *user, fp_stream stream) {
    validate_side *s = user;
    return fp_attention_forward(s->ctx, stream, &s->p);
}

fp_status fp_attention_validate(fp_context *ctx, fp_stream stream, const fp_attention_params *params,
                                const fp_timing_config *cfg, fp_ab_report *report) {
    FP_TRY(fp_ctx_check(ctx, -1));
    FP_CHECK_NOT_NULL(report);
    fp_attn_args a;
    FP_TRY(fp_attn_check(params, ctx->kind == FP_DEVICE_CUDA, &a));
    FP_TRY(baseline_dtype_check(ctx->kind == FP_DEVICE_CUDA, &a)); /* before any allocation */
    /* packed scratch rows: batch * seqlen_q, or with varlen the rows up to
     * the last offset (read back from the device: validate is not an
     * enqueue-only call) */
    size_t rows = (size_t)a.batch * a.seqlen_q;
    if (a.cu_q) {
        /* Every sequence's last row, not just cu_seqlens_q[batch]: on CUDA
         * the offsets are not checked, and with a decreasing pair an earlier
         * sequence can end past the last offset (e.g. {0, 100, 50}). */
        const size_t nb = ((size_t)a.batch + 1) * sizeof(int32_t);
        int32_t *cu = malloc(nb);
        if (!cu) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "attention validate: host offsets");
        fp_status st = fp_mem_download(ctx, cu, a.cu_q, nb, stream);
        if (st == FP_OK) st = fp_context_synchronize(ctx, stream);
        int64_t end = 1;
        for (int b = 0; st == FP_OK && b < a.batch; ++b) {
            if (cu[b] < 0) {
                st = fp_set_error(FP_ERR_INVALID_ARGUMENT,
                                  "argument 'cu_seqlens_q': offset %d of sequence %d is negative", cu[b], b);
                break;
            }
            const int64_t e = (int64_t)cu[b] + fp_attn_clamp((int64_t)cu[b + 1] - cu[b], a.seqlen_q);
            if (e > end) end = e;
        }
        free(cu);
        FP_TRY(st);
        rows = (size_t)end;
    }
    const size_t elt = fp_dtype_size(a.o_dtype); /* the outputs: bf16 for fp8 inputs */
    FP_CHECK_ARG(rows <= SIZE_MAX / elt / (size_t)a.heads_q / (size_t)a.head_dim,
                 "attention validate: output of %zu rows x %d heads x %d overflows", rows, a.heads_q,
                 a.head_dim);
    const size_t n_out = rows * a.heads_q * a.head_dim;
    void *o_base = NULL, *o_flash = NULL;
    FP_TRY(fp_mem_alloc(ctx, n_out * elt, &o_base));
    fp_status st = fp_mem_alloc(ctx, n_out * elt, &o_flash);
    /* rows neither writes (varlen gaps) must compare equal */
    if (st == FP_OK) st = fp_mem_fill(ctx, o_base, 0, n_out * elt, stream);
    if (st == FP_OK) st = fp_mem_fill(ctx, o_flash, 0, n_out * elt, stream);
    if (st == FP_OK) {
        validate_side sb = {ctx, {0}}, sf = {ctx, {0}};
        fp_attn_params_upgrade(params, &sb.p); /* params may be an older, shorter struct */
        fp_attn_params_upgrade(params, &sf.p);
        /* packed scratch outputs; params' own o / lse are not written */
        sb.p.o = o_base;
        sf.p.o = o_flash;
        sb.p.o_batch_stride = sb.p.o_seq_stride = sb.p.o_head_stride = 0;
        sf.p.o_batch_stride = sf.p.o_seq_stride = sf.p.o_head_stride = 0;
        sb.p.lse = sf.p.lse = NULL;
        fp_ab_spec spec;
        fp_ab_spec_init(&spec);
        spec.baseline = run_baseline;
        spec.baseline_user = &sb;
        spec.optimized = run_flash;
        spec.optimized_user = &sf;
        spec.baseline_out = o_base;
        spec.optimized_out = o_flash;
        spec.out_count = n_out;
        spec.out_dtype = a.o_dtype; /* its default tolerance: bf16's for fp8 inputs */
        spec.bytes = fp_attn_bytes(&a);
        spec.flops = fp_attention_flops(params);
        spec.flops_on_tensor_cores = ctx->kind == FP_DEVICE_CUDA && a.dtype != FP_F32;
        st = fp_ab_run(ctx, stream, &spec, cfg, report);
    }
    fp_context_synchronize(ctx, stream);
    fp_mem_free(ctx, o_base);
    fp_mem_free(ctx, o_flash);
    return st;
}
