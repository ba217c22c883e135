// fp_torch_malloc_or_throw: the allocation function handed to PyTorch's
// CUDAPluggableAllocator. PyTorch (torch/csrc/cuda/CUDAPluggableAllocator.cpp,
// 2.x) stores whatever alloc_fn returns in the tensor's DataPtr without
// checking it, so a NULL from fp_torch_malloc became a tensor with a null data
// pointer and the failure showed up at its first use as an illegal-address
// error. alloc_fn is called from C++ through a std::function, so a C++
// exception thrown here unwinds into PyTorch, whose Python bindings turn any
// std::exception into a RuntimeError carrying what(): the failure surfaces at
// the allocating call, in Python, naming out-of-memory. (torch.OutOfMemoryError
// would need c10::OutOfMemoryError, a libtorch type: this library does not
// link libtorch.) The only C++ in the host code, and the only exception it
// throws: every other entry point returns a status.
#include <stdexcept>
#include <string>

#include "fastpath/alloc.h"

extern "C" FP_API void *fp_torch_malloc_or_throw(ssize_t size, int device, struct CUstream_st *stream) {
    void *p = fp_torch_malloc(size, device, stream);
    if (p || size == 0) return p;
    // The detail of an out-of-memory failure reads "caching allocator out of
    // memory: requested ..." (see fp_alloc_alloc).
    throw std::runtime_error("libfastpath: fp_torch_malloc of " + std::to_string(size) + " bytes on device " +
                             std::to_string(device) + " failed: " + fp_last_error());
}
