/* x86-64 SIMD features for the CPU implementations' AVX2 paths, read with
 * CPUID and XGETBV directly (__builtin_cpu_supports has no "f16c" in older
 * clang): a feature counts only when the OS also saves the YMM state.
 * Computed once. */
#include <stdatomic.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "internal.h"

static int probe(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if ((c & (1u << 27 | 1u << 28)) != (1u << 27 | 1u << 28)) return 0; /* OSXSAVE, AVX */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6u) != 6u) return 0; /* XMM and YMM state enabled */
    const int fma = (c >> 12) & 1u, f16c = (c >> 29) & 1u;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((b >> 5) & 1u)) return 0; /* AVX2 */
    return (fma ? FP_CPU_AVX2_FMA : 0) | (f16c ? FP_CPU_AVX2_F16C : 0);
#else
    return 0;
#endif
}

int fp_cpu_features(void) {
    static atomic_int cached = -1;
    int f = atomic_load_explicit(&cached, memory_order_relaxed);
    if (f < 0) {
        f = probe();
        atomic_store_explicit(&cached, f, memory_order_relaxed);
    }
    return f;
}
