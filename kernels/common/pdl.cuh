// Programmatic dependent launch (PDL, compute capability 9.0+): a kernel
// launched with cudaLaunchAttributeProgrammaticStreamSerialization may start
// while the kernel before it on the stream is still running, once every CTA
// of that kernel has signalled (griddepcontrol.launch_dependents) or exited.
// Its CTAs are then resident when the predecessor ends, so the boundary
// costs the dependency's resolution instead of a launch: what a chain of
// short kernels (a decode step, a CUDA graph of small ops) loses between
// them.
//
// The library's rule, which makes it safe whatever ran before (a user's
// kernel, a cuBLAS GEMM, a memset): a kernel that may be launched so calls
// fp_pdl::enter() as its first statement, in every thread, before any access
// to global memory. enter() signals this kernel's own dependents first (all
// of its CTAs have started by the time the signal completes, so a dependent's
// CTAs take only slots this kernel no longer needs), then waits
// (griddepcontrol.wait) for the predecessor's completion and the visibility
// of its writes. Below sm_90 both are nothing; so are they for a kernel
// launched without the attribute.
//
// Checked: the CPU emulation (tests/emu) fails a PDL launch whose thread
// exits, or issues an async copy (cp.async, TMA), before enter();
// tests/sass/check_sass.py fails a kernel of the PDL set whose sm_90 SASS
// has a global memory access before its first ACQBULK (the wait).
//
// Host side: launch<Kernel>(grid, block, smem, stream, pdl, args...) launches
// with the attribute when pdl is set and the kernel's loaded code has the
// wait (compiled for sm_90+: a PTX JIT of compute_80 code has none, and such
// a kernel launched with the attribute would race its predecessor); pdl
// comes from the context (FP_CTX_LAUNCH_PDL, core.h).
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace fp_pdl {

__device__ __forceinline__ void enter() {
#if defined(FP_CUDA_EMU)
    fp_emu::pdl_enter();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether Kernel's code on the current device has enter()'s wait (PTX
// version 9.0 or later), asked once per (Kernel, device): no attribute query
// on a launch after the first.
template <auto Kernel> bool capable() {
    static std::atomic<unsigned long long> known{0}, yes{0};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        (void)cudaGetLastError();
        return false;
    }
    const unsigned long long bit = 1ull << dev;
    if (known.load(std::memory_order_acquire) & bit) return (yes.load(std::memory_order_relaxed) & bit) != 0;
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, Kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    if (a.ptxVersion >= 90) yes.fetch_or(bit, std::memory_order_relaxed);
    known.fetch_or(bit, std::memory_order_release);
    return a.ptxVersion >= 90;
}

// Kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream
// serialization when pdl is set and the kernel is capable; returns the
// launch's error (cudaGetLastError's, cleared).
// (No launch syntax in the emulation's branch: this header is included from
// kernels/<cap>/ headers, where tests/emu/cu2emu.py's rewrite of it is not
// the copy found.)
template <auto Kernel, typename... Args>
cudaError_t launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl, Args... args) {
#if defined(FP_CUDA_EMU)
    const auto l = fp_emu::make_launch(Kernel, grid, block, smem, stream);
    if (pdl && capable<Kernel>()) l.with_pdl()(args...);
    else l(args...);
    return cudaGetLastError();
#else
    if (!pdl || !capable<Kernel>()) {
        Kernel<<<grid, block, smem, stream>>>(args...);
        return cudaGetLastError();
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, Kernel, args...);
    const cudaError_t last = cudaGetLastError();
    return e != cudaSuccess ? e : last;
#endif
}

}  // namespace fp_pdl
