/* Device discovery. Never crashes without a GPU or a driver: the CUDA runtime
 * reports cudaErrorNoDevice / cudaErrorInsufficientDriver, which we map to a
 * count of 0 and FP_ERR_NO_DEVICE. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

fp_status fp_device_info_init_sized(fp_device_info *out, size_t struct_size) {
    fp_device_info defaults, *info = &defaults;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    info->index = -1;
    return fp_struct_init(out, struct_size, info, FP_DEVICE_INFO_SIZE_FIRST, sizeof *info, "fp_device_info");
}

void(fp_device_info_init)(fp_device_info *info) {
    if (info) (void)fp_device_info_init_sized(info, FP_DEVICE_INFO_SIZE_FIRST);
}

void fp_cuda_versions(int *runtime_version, int *driver_version) {
    int rt = 0, drv = 0;
    /* Clear only errors of these calls: an error the caller had pending
     * (an unchecked failed launch) is not ours to swallow. */
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) {
        rt = 0;
        (void)cudaGetLastError();
    }
    if (cudaDriverGetVersion(&drv) != cudaSuccess) {
        drv = 0;
        (void)cudaGetLastError();
    }
    if (runtime_version) *runtime_version = rt;
    if (driver_version) *driver_version = drv;
}

fp_status fp_device_count(int *count) {
    FP_CHECK_NOT_NULL(count);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { /* no driver / no GPU */
        n = 0;
        (void)cudaGetLastError(); /* ours: do not leave it for the caller */
    }
    *count = n;
    return FP_OK;
}

/* Per-architecture throughput per SM per clock. FP32: 2 * FMA lanes. Tensor:
 * dense fp16/bf16 with f32 accumulation (sm_70/75 have no bf16: fp16 figure).
 * Unknown newer architectures use the newest known row. */
static void arch_ops_per_clock(int major, int minor, double *fp32, double *tensor) {
    static const struct { int major, minor; double fp32, tensor; } table[] = {
        {7, 0, 128, 1024},  /* V100 */
        {7, 5, 128, 1024},  /* T4 */
        {8, 0, 128, 2048},  /* A100 */
        {8, 6, 256, 1024},  /* A10, RTX 30 */
        {8, 7, 256, 1024},  /* Orin */
        {8, 9, 256, 1024},  /* L4, L40S, RTX 40 */
        {9, 0, 256, 4096},  /* H100, H200 */
        {10, 0, 256, 8192}, /* B200 */
        {12, 0, 256, 1024}, /* RTX PRO 6000 Blackwell: 188 SMs x 2.6 GHz x 1024 = 504 dense bf16
                               TFLOP/s (GeForce RTX 50 accumulate f32 at half that) */
    };
    size_t n = sizeof table / sizeof table[0], best = n;
    for (size_t i = 0; i < n; ++i) {
        if (table[i].major < major || (table[i].major == major && table[i].minor <= minor))
            best = i; /* table is sorted: last row not newer than the device */
    }
    if (best == n) { *fp32 = 0; *tensor = 0; return; }
    *fp32 = table[best].fp32;
    *tensor = table[best].tensor;
}

fp_status fp_device_get_info(int index, fp_device_info *info) {
    FP_CHECK_NOT_NULL(info);
    FP_TRY(fp_struct_size_check(info->struct_size, FP_DEVICE_INFO_SIZE_FIRST, sizeof *info, "fp_device_info (info)"));
    int count = 0;
    fp_device_count(&count);
    if (count == 0)
        return fp_set_error(FP_ERR_NO_DEVICE, "no CUDA device (no GPU or no driver)");
    if (index < 0 || index >= count)
        return fp_set_error(FP_ERR_NO_DEVICE, "device index %d out of range (%d device%s)",
                            index, count, count == 1 ? "" : "s");
    struct cudaDeviceProp prop;
    FP_CUDA_TRY(cudaGetDeviceProperties(&prop, index));
    fp_device_info d;
    fp_device_info_init(&d);
    d.kind = FP_DEVICE_CUDA;
    d.index = index;
    snprintf(d.name, sizeof d.name, "%s", prop.name);
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.total_mem_bytes = prop.totalGlobalMem;
    FP_CUDA_TRY(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, index));
    int l2 = 0;
    FP_CUDA_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, index));
    d.l2_bytes = (size_t)l2;
    FP_CUDA_TRY(cudaDeviceGetAttribute(&d.mem_clock_khz, cudaDevAttrMemoryClockRate, index));
    FP_CUDA_TRY(cudaDeviceGetAttribute(&d.mem_bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, index));
    FP_CUDA_TRY(cudaDeviceGetAttribute(&d.sm_clock_khz, cudaDevAttrClockRate, index));
    /* DDR: two transfers per memory clock. */
    d.peak_gbps = 2.0 * d.mem_clock_khz * 1e3 * (d.mem_bus_width_bits / 8.0) / 1e9;
    double fp32_clk, tensor_clk;
    arch_ops_per_clock(d.cc_major, d.cc_minor, &fp32_clk, &tensor_clk);
    double sm_hz = (double)d.sm_count * d.sm_clock_khz * 1e3;
    d.peak_tflops_fp32 = sm_hz * fp32_clk / 1e12;
    d.peak_tflops_bf16 = sm_hz * tensor_clk / 1e12;
    fp_cuda_versions(&d.runtime_version, &d.driver_version);
    return fp_struct_write(info, &d, FP_DEVICE_INFO_SIZE_FIRST, sizeof d, "fp_device_info (info)");
}

fp_status fp_cpu_get_info(fp_device_info *info) {
    FP_CHECK_NOT_NULL(info);
    FP_TRY(fp_struct_size_check(info->struct_size, FP_DEVICE_INFO_SIZE_FIRST, sizeof *info, "fp_device_info (info)"));
    fp_device_info d;
    fp_device_info_init(&d);
    d.kind = FP_DEVICE_CPU;
    snprintf(d.name, sizeof d.name, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *v = strchr(line, ':');
                if (v) {
                    v++;
                    while (*v == ' ' || *v == '\t') v++;
                    snprintf(d.name, sizeof d.name, "%s", v);
                    d.name[strcspn(d.name, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    d.sm_count = cores > 0 ? (int)cores : 1;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) d.total_mem_bytes = (size_t)pages * (size_t)page;
    fp_cuda_versions(&d.runtime_version, &d.driver_version);
    return fp_struct_write(info, &d, FP_DEVICE_INFO_SIZE_FIRST, sizeof d, "fp_device_info (info)");
}
