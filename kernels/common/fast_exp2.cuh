// 2^x by the SFU instruction alone (ex2.approx.ftz.f32: about 2 ulp; results
// below 2^-126 flush to 0; -inf gives 0), shared by the attention kernels'
// softmax and the norm kernels' fast sigmoid. exp2f / __expf wrap the same
// instruction in a denormal-range fix-up, three more instructions per call
// (tests/sass/check_sass.py's "ex2_ftz" check finds it). Built with
// FP_CUDA_EMU (tests/emu) it routes to the CPU emulation (the exact exp2f
// with the flush).
#pragma once

#include <cuda_runtime.h>

#if defined(FP_CUDA_EMU)
#include "emu_sm80.h"
#endif

namespace fp_fast {

__device__ __forceinline__ float ex2_ftz(float x) {
#if defined(FP_CUDA_EMU)
    return fp_emu::ex2_approx_ftz(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

}  // namespace fp_fast
