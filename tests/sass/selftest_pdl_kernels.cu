// Kernels with known programmatic-dependent-launch defects for
// check_sass.py's self-test (the "pdl" check; sm_90 only): each defect must
// be reported, the clean kernel not.

// Clean: the wait (ACQBULK) before any global memory access.
extern "C" __global__ void selftest_pdl_ok(const float *x, float *y) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    y[threadIdx.x] = 2.0f * x[threadIdx.x];
}

// A load before the wait: it may read the predecessor's output too early.
extern "C" __global__ void selftest_pdl_late(const float *x, float *y) {
    const float v = x[threadIdx.x];
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    y[threadIdx.x] = v;
}

// Claimed launchable with PDL, but no wait at all.
extern "C" __global__ void selftest_pdl_missing(const float *x, float *y) { y[threadIdx.x] = x[threadIdx.x]; }
