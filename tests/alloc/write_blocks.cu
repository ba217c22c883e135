// Test kernels for the caching allocator's GPU test: write every byte of an
// allocated block (run under compute-sanitizer to catch out-of-segment
// writes), and hold a stream busy for a while (cross-stream reuse).
#include <cuda_runtime.h>
#include <stdint.h>

// p: (bytes,) -- byte i gets (tag + i * 131) & 0xff, so overlaps between
// blocks with different tags show up when the host reads them back.
__global__ void write_block_v1(uint8_t *p, size_t bytes, uint32_t tag) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < bytes;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)((tag + i * 131u) & 0xffu);
}

// One thread spins for `cycles` clocks, then touches p[0] (so the block is
// really in use on this stream while it spins).
__global__ void spin_v1(uint8_t *p, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    p[0] = (uint8_t)(p[0] + 1);
}

extern "C" cudaError_t alloc_test_write_block(void *p, size_t bytes, uint32_t tag, cudaStream_t s) {
    if (bytes == 0) return cudaSuccess;
    size_t blocks = (bytes + 255) / 256;
    unsigned grid = blocks > 1024 ? 1024u : (unsigned)blocks;
    write_block_v1<<<grid, 256, 0, s>>>((uint8_t *)p, bytes, tag);
    return cudaGetLastError();
}

extern "C" cudaError_t alloc_test_spin(void *p, long long cycles, cudaStream_t s) {
    spin_v1<<<1, 1, 0, s>>>((uint8_t *)p, cycles);
    return cudaGetLastError();
}
