/* The CPU fused norm's row kernels for AVX2 + FMA + F16C (norm_cpu_avx2.c,
 * the only file built with those flags) and the dispatch between them and
 * the portable code of norm_cpu.c. Not installed.
 *
 * The AVX2 file is compiled with -mavx2 -mfma -mf16c on x86-64 (CMake sets
 * them on that one file); elsewhere, or where the flags are not set, it
 * compiles to a stub with fp_norm_avx2_built = 0. Nothing in it runs before
 * fp_norm_cpu_simd() (portable code, in norm_cpu.c) has checked the CPU. */
#ifndef FP_NORM_CPU_SIMD_H
#define FP_NORM_CPU_SIMD_H

#include "norm/norm_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when norm_cpu_avx2.c was compiled with the AVX2 kernels. */
extern const int fp_norm_avx2_built;

/* One forward row r of d, everything fused: s is row scratch of
 * round_up(cols, 8) floats, g / b the per-column gamma and beta + bias in
 * f32 (the same length; padding g = 1, b = 0). Writes res_out, out, mean,
 * rstd of row r as fp_norm_fwd_cpu defines them. */
void fp_norm_avx2_fwd_row(const fp_norm_fwd_desc *d, int64_t r, float *s, const float *g, const float *b);
/* One backward row r of d: xn, dn row scratch (round_up(cols, 8) floats),
 * g / sh gamma and beta + bias in f32, pg / pb the chunk's partial dgamma /
 * dbeta, to which row r's terms are added in column order. Writes dx. */
void fp_norm_avx2_bwd_row(const fp_norm_bwd_desc *d, int64_t r, float *xn, float *dn, const float *g,
                          const float *sh, float *pg, float *pb);
/* v[0..n) = act(v) (deriv 0) or act'(v) (deriv 1), in place. */
void fp_norm_avx2_act_row(int act, int deriv, float *v, int64_t n);
/* dtype <-> f32 rows (f16 / bf16: bit-exact with fp_h2f / fp_f2h / fp_b2f /
 * fp_f2b of half.h, NaN payloads included). */
void fp_norm_avx2_load_row(float *dst, const void *src, int dt, int64_t n);
void fp_norm_avx2_store_row(void *dst, int dt, const float *src, int64_t n);

/* Which kernels the CPU norm runs: 1 = AVX2 (built, the CPU has AVX2, FMA
 * and F16C, not forced portable), 0 = portable. The environment variable
 * FASTPATH_NORM_CPU=portable (read once) forces the portable path;
 * fp_norm_cpu_force_portable() overrides both (tests run both paths). */
int fp_norm_cpu_simd(void);
/* 1 when this CPU and OS run AVX2 + FMA + F16C code (CPUID, XGETBV). */
int fp_norm_cpu_has_avx2(void);
/* on = 1: portable; on = 0: the automatic choice; on = -1: back to the
 * environment's choice. Not for concurrent use with running norms. */
void fp_norm_cpu_force_portable(int on);

/* The current path's row helpers (as the fused kernels use them), for the
 * tests of accuracy and conversions. */
void fp_norm_cpu_act_row(int act, int deriv, float *v, int64_t n);
void fp_norm_cpu_load_row(float *dst, const void *src, int dt, int64_t n);
void fp_norm_cpu_store_row(void *dst, int dt, const float *src, int64_t n);

#ifdef __cplusplus
}
#endif

#endif /* FP_NORM_CPU_SIMD_H */
