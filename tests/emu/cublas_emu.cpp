// The cuBLAS / cuBLASLt calls the library makes, for the emulated device:
// handles, streams, and cublasGemmEx / cublasGemmStridedBatchedEx
// (column-major, op N or T, f16 / bf16 / f32 operands, f32 compute, alpha
// and beta as f32 host scalars) computed on the host in double. Enough for
// the materialized attention baseline and the batcher's GPU model.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

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
cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha,
                    const void *A, cudaDataType at, int lda, long long sa, const void *B, cudaDataType bt, int ldb,
                    long long sb, const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                    cublasComputeType_t compute) {
    size_t es;
    if (!elem_size(at, &es) || !elem_size(bt, &es) || !elem_size(ct, &es)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (ldc < (m > 1 ? m : 1) || lda < ((ta == CUBLAS_OP_N ? m : k) > 1 ? (ta == CUBLAS_OP_N ? m : k) : 1) ||
        ldb < ((tb == CUBLAS_OP_N ? k : n) > 1 ? (tb == CUBLAS_OP_N ? k : n) : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *static_cast<const float *>(alpha), be = *static_cast<const float *>(beta);
    for (int b = 0; b < batch; ++b)
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                double acc = 0;
                for (int p = 0; p < k; ++p) {
                    int64_t ia = ta == CUBLAS_OP_N ? (int64_t)p * lda + i : (int64_t)i * lda + p;
                    int64_t ib = tb == CUBLAS_OP_N ? (int64_t)j * ldb + p : (int64_t)p * ldb + j;
                    acc += load(A, at, b * sa + ia) * load(B, bt, b * sb + ib);
                }
                const int64_t ic = b * sc + (int64_t)j * ldc + i;
                double v = al * acc;
                if (be != 0.0f) v += be * load(C, ct, ic);
                store(C, ct, ic, v);
            }
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
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS (emulated)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (emulated)";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emulated)";
    default: return "cuBLAS error (emulated)";
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
    return gemm(ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t) {
    return gemm(ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute);
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
