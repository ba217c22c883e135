// The buckets' gather / scatter: many small copies in one launch (a bucket
// of 50 tensors is one kernel, not 50 cudaMemcpyAsync calls, each paying a
// launch). blockIdx.y selects the copy; the blocks of a row stride over it.
#include <stdint.h>

#include "comm/comm_copy.h"

namespace {

constexpr int kThreads = 256;

__global__ void copies_kernel(const fp_copy_desc *__restrict__ descs) {
    const fp_copy_desc d = descs[blockIdx.y];
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uintptr_t a = (uintptr_t)d.src | (uintptr_t)d.dst;
    if ((a & 15) == 0) {
        const size_t nvec = d.bytes / 16;
        const uint4 *s = reinterpret_cast<const uint4 *>(d.src);
        uint4 *o = reinterpret_cast<uint4 *>(d.dst);
        // The pointers come from memory, so the compiler cannot tell they are
        // global: __ldg / __stwb make the loads and stores global (LDG / STG
        // 128-bit) instead of generic LD / ST.
        for (size_t v = first; v < nvec; v += stride) __stwb(o + v, __ldg(s + v));
        // Tail: fewer than 16 bytes.
        const size_t t = nvec * 16 + first;
        if (t < d.bytes) __stwb(static_cast<uint8_t *>(d.dst) + t, __ldg(static_cast<const uint8_t *>(d.src) + t));
    } else {
        const uint8_t *s = static_cast<const uint8_t *>(d.src);
        uint8_t *o = static_cast<uint8_t *>(d.dst);
        for (size_t i = first; i < d.bytes; i += stride) __stwb(o + i, __ldg(s + i));
    }
}

}  // namespace

extern "C" cudaError_t fp_launch_copies(const fp_copy_desc *d_descs, int n, size_t max_bytes, cudaStream_t stream) {
    if (n < 1 || n > 65535 || !d_descs) return cudaErrorInvalidValue;
    // A block moves 4 KiB per pass (256 threads x 16 B); enough blocks per
    // row that the largest copy takes a few passes, at most 64.
    size_t blocks = (max_bytes + 4 * 4096 - 1) / (4 * 4096);
    if (blocks < 1) blocks = 1;
    if (blocks > 64) blocks = 64;
    copies_kernel<<<dim3((unsigned)blocks, (unsigned)n), kThreads, 0, stream>>>(d_descs);
    return cudaGetLastError();
}
