// The cuBLAS / cuBLASLt calls the library makes, for the emulated device:
// handles, streams, and cublasGemmEx / cublasGemmStridedBatchedEx
// (column-major, op N or T, f16 / bf16 / f32 operands, f32 compute, alpha
// and beta as f32 host scalars) computed on the host in double. Enough for
// the materialized attention baseline and the batcher's GPU model. A GEMM
// is work on the handle's stream (fp_emu::submit): with asynchronous
// streams it runs after the stream's earlier kernels, as on a GPU.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "cuda_emu.h"

namespace {

struct Handle {
    cudaStream_t stream = nullptr;
};

bool elem_size(cudaDataType t, size_t *n) {
    switch (t) {
    case CUDA_R_32F: *n = 4; return true;
    case CUDA_R_16F:
    case CUDA_R_16BF: *n = 2; return true;
    default: return false;
    }
}

double load(const void *p, cudaDataType t, int64_t i) {
    switch (t) {
    case CUDA_R_32F: return static_cast<const float *>(p)[i];
    case CUDA_R_16F: return __half2float(static_cast<const __half *>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    }
}

void store(void *p, cudaDataType t, int64_t i, double v) {
    switch (t) {
    case CUDA_R_32F: static_cast<float *>(p)[i] = (float)v; break;
    case CUDA_R_16F: static_cast<__half *>(p)[i] = __float2half_rn((float)v); break;
    default: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn((float)v); break;
    }
}

// C[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C, column-major.
// One GEMM description, copied into the stream's work.
struct Gemm {
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    const void *A, *B;
    void *C;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
    long long sa, sb, sc;
    int batch;
};

void run(const Gemm &g) {
    for (int b = 0; b < g.batch; ++b)
        for (int j = 0; j < g.n; ++j)
            for (int i = 0; i < g.m; ++i) {
                double acc = 0;
                for (int p = 0; p < g.k; ++p) {
                    int64_t ia = g.ta == CUBLAS_OP_N ? (int64_t)p * g.lda + i : (int64_t)i * g.lda + p;
                    int64_t ib = g.tb == CUBLAS_OP_N ? (int64_t)j * g.ldb + p : (int64_t)p * g.ldb + j;
                    acc += load(g.A, g.at, b * g.sa + ia) * load(g.B, g.bt, b * g.sb + ib);
                }
                const int64_t ic = b * g.sc + (int64_t)j * g.ldc + i;
                double v = g.alpha * acc;
                if (g.beta != 0.0f) v += g.beta * load(g.C, g.ct, ic);  // beta 0: C is not read
                store(g.C, g.ct, ic, v);
            }
}

cublasStatus_t gemm(cudaStream_t stream, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
                    cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
                    long long sc, int batch, cublasComputeType_t compute) {
    size_t es;
    if (!elem_size(at, &es) || !elem_size(bt, &es) || !elem_size(ct, &es)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
    if (ldc < (m > 1 ? m : 1) || lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    // Host pointer mode: alpha and beta are read now; the product runs on
    // the stream.
    const Gemm g = {ta, tb, m, n, k, *static_cast<const float *>(alpha), *static_cast<const float *>(beta),
                    A, B, C, at, bt, ct, lda, ldb, ldc, sa, sb, sc, batch};
    fp_emu::submit_node(stream, [g] { run(g); }, cudaGraphNodeTypeKernel, reinterpret_cast<const void *>(&run));
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = reinterpret_cast<cublasHandle_t>(new Handle);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    delete reinterpret_cast<Handle *>(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    reinterpret_cast<Handle *>(h)->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
// The emulated GEMMs need no workspace: the pointer is only recorded.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes) {
    if (bytes && !ws) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS (emulated)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (emulated)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emulated)";
    default: return "cuBLAS error (emulated)";
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
    return gemm(reinterpret_cast<Handle *>(h)->stream, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta,
                C, ct, ldc, 0, 1, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t) {
    return gemm(reinterpret_cast<Handle *>(h)->stream, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta,
                C, ct, ldc, sc, batch, compute);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = reinterpret_cast<cublasLtHandle_t>(new Handle);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    delete reinterpret_cast<Handle *>(h);
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }

}  // extern "C"
