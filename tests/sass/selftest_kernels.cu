// Kernels with known defects for check_sass.py --self-test: the checks must
// report each of them (and not the clean one). Built for sm_80 only, SASS
// without PTX (so the missing-PTX check fires too). Never launched.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// Clean: 16-byte loads and stores.
extern "C" __global__ void selftest_vec_copy(const uint4 *__restrict__ in, uint4 *__restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}

// Defect: 4-byte accesses where the rule asks for 16-byte ones.
extern "C" __global__ void selftest_scalar_copy(const float *__restrict__ in, float *__restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}

// Defect: a dynamically indexed array lives in local memory.
extern "C" __global__ void selftest_local_array(const int *__restrict__ idx, float *__restrict__ out) {
    float a[512]; /* more than the 255 registers a thread may have */
    for (int i = 0; i < 512; ++i) a[i] = out[i * blockDim.x + threadIdx.x];
    a[idx[threadIdx.x] & 511] += 1.0f; /* dynamic indices: the array cannot live in registers */
    out[threadIdx.x] = a[idx[threadIdx.x + 32] & 511];
}

// Defect for its rule: an f16 mma where the rule asks for bf16.
extern "C" __global__ void selftest_mma(const uint32_t *__restrict__ ab, float *__restrict__ d) {
    uint32_t a0 = ab[threadIdx.x], a1 = ab[threadIdx.x + 32], a2 = ab[threadIdx.x + 64], a3 = ab[threadIdx.x + 96];
    uint32_t b0 = ab[threadIdx.x + 128], b1 = ab[threadIdx.x + 160];
    float c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    d[threadIdx.x] = c0 + c1 + c2 + c3;
}

// Defect for its rule: exp2f (MUFU.EX2 inside a denormal fix-up) where the
// rule asks for the bare instruction.
extern "C" __global__ void selftest_exp2f(float *out) { out[threadIdx.x] = exp2f(out[threadIdx.x]); }

// Defect for its rule: a static __shared__ word beside the dynamic arena.
extern "C" __global__ void selftest_static_smem(int *out) {
    __shared__ int flag;
    if (threadIdx.x == 0) flag = out[0];
    __syncthreads();
    out[threadIdx.x] = flag;
}

// Defect for its rule: GELU (tanh) by tanhf, where the rule asks for the
// norm kernels' fast sigmoid blocks (ex2.approx.ftz of -|z| log2(e)).
extern "C" __global__ void selftest_act_slow(float *out) {
    const float y = out[threadIdx.x];
    out[threadIdx.x] = 0.5f * y * (1.0f + tanhf(0.7978845608f * (y + 0.044715f * y * y * y)));
}

// Defect: no rule names it.
extern "C" __global__ void selftest_unruled(float *out) { out[threadIdx.x] = 1.0f; }

// Defect for its rule ("prefetch"): the streaming loads of a row issued
// after the row's block barrier, where the rule asks for every one of them
// before the first (the next row in flight through the reduction).
extern "C" __global__ void selftest_late_prefetch(const uint4 *in, uint4 *out, int n) {
    __shared__ float red[32];
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        if (threadIdx.x < 32) red[threadIdx.x] = (float)i;
        __syncthreads();
        const uint4 v = __ldcs(in + (size_t)i * blockDim.x + threadIdx.x);
        out[(size_t)i * blockDim.x + threadIdx.x] = make_uint4(v.x + (unsigned)red[i & 31], v.y, v.z, v.w);
        __syncthreads();
    }
}

// Defect for its rule ("params_in_regs"): the parameter vector loaded again
// after the block barrier (per row), where the rule asks for it in
// registers from before the first barrier on.
extern "C" __global__ void selftest_param_reload(const uint4 *gamma, uint4 *out, int n) {
    __shared__ unsigned red[32];
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        if (threadIdx.x < 32) red[threadIdx.x] = (unsigned)i;
        __syncthreads();
        const uint4 g = __ldg(gamma + (size_t)(red[i & 31] & 7) * blockDim.x + threadIdx.x);  // after the barrier
        out[(size_t)i * blockDim.x + threadIdx.x] = g;
        __syncthreads();
    }
}
