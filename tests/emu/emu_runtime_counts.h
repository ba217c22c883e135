/* Calls of the emulated CUDA runtime (tests/emu), counted by kind, so a test
 * can require that a library op, once warmed up, reaches none of the calls
 * that break stream capture or cost a driver round trip per call
 * (tests/core/test_op_runtime_calls.c). C and C++; counting is atomic
 * (relaxed: a test reads the counts after its calls returned). */
#ifndef FP_EMU_RUNTIME_COUNTS_H
#define FP_EMU_RUNTIME_COUNTS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fp_emu_call_kind {
    /* cudaMalloc, cudaMallocAsync, cudaMallocFromPoolAsync, cudaMallocHost,
     * cudaHostAlloc, cudaFree, cudaFreeAsync, cudaFreeHost,
     * cudaHostRegister, cudaHostUnregister, cudaMemPoolCreate / Destroy */
    FP_EMU_CALL_ALLOC = 0,
    /* cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize,
     * the blocking cudaMemcpy / cudaMemset */
    FP_EMU_CALL_SYNC = 1,
    /* device and function attribute queries: cudaGetDeviceProperties,
     * cudaDeviceGetAttribute, cudaFuncGetAttributes, cudaFuncSetAttribute,
     * cudaOccupancy*, cudaMemGetInfo, cudaPointerGetAttributes,
     * cudaGetDriverEntryPoint* */
    FP_EMU_CALL_QUERY = 2,
    FP_EMU_CALL_SET_DEVICE = 3, /* cudaSetDevice */
    /* cudaGetDevice: host-only (thread state), capture-safe and cheap; counted
     * apart because it is not a device query */
    FP_EMU_CALL_GET_DEVICE = 4,
    /* kernel launches (<<<>>>, emulated cuBLAS GEMMs not included): each
     * costs about 3 us of host time on a GPU (graph/op_host_cost) */
    FP_EMU_CALL_LAUNCH = 5,
    /* the launches among those with programmatic stream serialization
     * (kernels/common/pdl.cuh; FP_CTX_LAUNCH_PDL) */
    FP_EMU_CALL_LAUNCH_PDL = 6,
    /* cudaEventRecord: what a span costs under the event timer (two per
     * span; trace.h), none under the kernel timer */
    FP_EMU_CALL_EVENT_RECORD = 7,
    FP_EMU_CALL_KINDS = 8
} fp_emu_call_kind;

typedef struct fp_emu_runtime_counts {
    long long n[FP_EMU_CALL_KINDS]; /* calls since the last reset, by fp_emu_call_kind */
} fp_emu_runtime_counts;

/* The counts since the process started or the last reset. */
void fp_emu_runtime_counts_get(fp_emu_runtime_counts *out);
void fp_emu_runtime_counts_reset(void);
/* Counts one call (the emulated runtime's entry points call it). */
void fp_emu_count_call(fp_emu_call_kind kind);

#ifdef __cplusplus
}
#endif

#endif /* FP_EMU_RUNTIME_COUNTS_H */
