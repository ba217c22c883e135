/* Core API on a machine with or without a GPU: version, status strings and
 * error details, dtypes and conversions, device discovery, contexts, memory
 * helpers, the CPU worker pool. */
#include <float.h>
#include <string.h>

#include "fp_test.h"
#include "internal.h"

static void test_version(void) {
    CHECK(fp_version() == FP_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FP_VERSION_MAJOR, FP_VERSION_MINOR, FP_VERSION_PATCH);
    CHECK(strcmp(fp_version_string(), want) == 0);
}

static void test_status_strings(void) {
    /* Pinned values: changing one breaks every binding. */
    CHECK(FP_OK == 0 && FP_ERR_INVALID_ARGUMENT == 1 && FP_ERR_UNSUPPORTED == 2 &&
          FP_ERR_OUT_OF_MEMORY == 3 && FP_ERR_NO_DEVICE == 4 && FP_ERR_CUDA == 5 &&
          FP_ERR_TIMEOUT == 8 && FP_ERR_QUEUE_FULL == 9 && FP_ERR_SHUT_DOWN == 10 &&
          FP_ERR_INTERNAL == 15);
    for (int s = 0; s <= 15; ++s) {
        const char *str = fp_status_string((fp_status)s);
        CHECK(str && *str && strcmp(str, "unknown status") != 0);
        for (int t = 0; t < s; ++t) CHECK(strcmp(str, fp_status_string((fp_status)t)) != 0);
    }
    CHECK(strcmp(fp_status_string((fp_status)999), "unknown status") == 0);
    CHECK(strcmp(fp_status_string(FP_ERR_NO_DEVICE), "no device") == 0);
}

static void test_error_detail(void) {
    fp_clear_error();
    CHECK(strcmp(fp_last_error(), "") == 0);
    CHECK_STATUS(fp_device_count(NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "count") != NULL);          /* names the argument */
    CHECK(strstr(fp_last_error(), "device.c:") != NULL);      /* file:line */
    fp_clear_error();
    CHECK(fp_last_error()[0] == '\0');
}

static void test_dtypes(void) {
    CHECK(fp_dtype_size(FP_F32) == 4 && fp_dtype_size(FP_F16) == 2 && fp_dtype_size(FP_BF16) == 2);
    CHECK(fp_dtype_size((fp_dtype)42) == 0);
    fp_dtype d;
    CHECK_OK(fp_dtype_parse("bf16", &d));
    CHECK(d == FP_BF16);
    CHECK_OK(fp_dtype_parse("float16", &d));
    CHECK(d == FP_F16);
    CHECK_STATUS(fp_dtype_parse("int7", &d), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "int7") != NULL);
    CHECK_STATUS(fp_dtype_parse(NULL, &d), FP_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(fp_dtype_name(FP_BF16), "bf16") == 0);
}

static void test_conversions(void) {
    /* Exact values. */
    CHECK(fp_f32_to_f16(1.0f) == 0x3c00 && fp_f32_to_f16(-2.0f) == 0xc000);
    CHECK(fp_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(fp_f32_to_f16(65520.0f) == 0x7c00);       /* rounds to Inf */
    CHECK(fp_f32_to_f16(5.9604645e-08f) == 0x0001); /* smallest subnormal */
    CHECK(fp_f32_to_f16(2.9802322e-08f) == 0x0000); /* half of it: ties to even (0) */
    CHECK(fp_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(fp_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(isnan(fp_f16_to_f32(fp_f32_to_f16(NAN))));
    CHECK(isnan(fp_bf16_to_f32(fp_f32_to_bf16(NAN))));
    CHECK(isinf(fp_f16_to_f32(fp_f32_to_f16(INFINITY))));
    /* Ties to even: 1 + 2^-11 lies halfway between two halfs -> the even one. */
    CHECK(fp_f32_to_f16(1.0f + 0.00048828125f) == 0x3c00);
    CHECK(fp_f32_to_f16(1.0f + 3 * 0.00048828125f) == 0x3c02);
    /* Round trip of every finite half is exact, and rounding error bounds hold. */
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if (((h >> 10) & 0x1f) == 0x1f) continue;
        CHECK(fp_f32_to_f16(fp_f16_to_f32((uint16_t)h)) == h);
    }
    uint64_t s = 7;
    for (int i = 0; i < 100000; ++i) {
        float v = (float)fp_test_rand_uniform(&s, -1000.0, 1000.0);
        float h = fp_f16_to_f32(fp_f32_to_f16(v)), b = fp_bf16_to_f32(fp_f32_to_bf16(v));
        CHECK(fabsf(h - v) <= fabsf(v) * 0.00048828125f + 1e-7f);
        CHECK(fabsf(b - v) <= fabsf(v) * 0.00390625f + 1e-7f);
    }
    float src[5] = {1.5f, -2.25f, 3.0e-3f, 1000.0f, -0.0f}, back[5];
    uint16_t mid[5];
    CHECK_OK(fp_convert_host(src, FP_F32, mid, FP_BF16, 5));
    CHECK_OK(fp_convert_host(mid, FP_BF16, back, FP_F32, 5));
    CHECK(back[0] == 1.5f && back[1] == -2.25f && back[3] == 1000.0f);
    CHECK_STATUS(fp_convert_host(src, FP_FP8_E4M3, mid, FP_F32, 5), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_convert_host(NULL, FP_F32, mid, FP_F16, 5), FP_ERR_INVALID_ARGUMENT);
    /* n * 4 wraps to 4 bytes: must be rejected, not copy 4 bytes and succeed. */
    float one[1] = {7.0f}, dst1[2] = {-1.0f, -1.0f};
    CHECK_STATUS(fp_convert_host(one, FP_F32, dst1, FP_F32, SIZE_MAX / 4 + 2), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "'n'") != NULL);
    CHECK(dst1[0] == -1.0f && dst1[1] == -1.0f); /* untouched */
}

static void test_devices(int ngpu) {
    int n = -1;
    CHECK_OK(fp_device_count(&n));
    CHECK(n == ngpu);
    fp_device_info info;
    fp_device_info_init(&info);
    CHECK(info.struct_size == sizeof info);
    if (n == 0) {
        /* Without a GPU: a clean "no device", never a crash. */
        CHECK_STATUS(fp_device_get_info(0, &info), FP_ERR_NO_DEVICE);
        CHECK(strstr(fp_last_error(), "no CUDA device") != NULL);
        fp_context *ctx = (fp_context *)0x1;
        CHECK_STATUS(fp_context_create(FP_DEVICE_CUDA, 0, &ctx), FP_ERR_NO_DEVICE);
        CHECK(ctx == (fp_context *)0x1); /* output untouched on error */
        CHECK(strlen(fp_last_error()) > 0);
    } else {
        CHECK_OK(fp_device_get_info(0, &info));
        CHECK(info.kind == FP_DEVICE_CUDA && info.sm_count > 0 && info.peak_gbps > 0);
        CHECK_STATUS(fp_device_get_info(n, &info), FP_ERR_NO_DEVICE);
    }
    CHECK_STATUS(fp_device_get_info(-1, &info), FP_ERR_NO_DEVICE);
    CHECK_STATUS(fp_device_get_info(0, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_device_info cpu;
    memset(&cpu, 0, sizeof cpu);
    CHECK_STATUS(fp_cpu_get_info(&cpu), FP_ERR_INVALID_ARGUMENT); /* struct_size unset */
    fp_device_info_init(&cpu);
    CHECK_OK(fp_cpu_get_info(&cpu));
    CHECK(cpu.kind == FP_DEVICE_CPU && cpu.sm_count >= 1 && cpu.name[0] != '\0');
    CHECK(cpu.peak_gbps == 0); /* unknown on CPU: roofline says "unknown" */
}

static void test_cpu_context(void) {
    fp_context *ctx = NULL;
    CHECK_STATUS(fp_context_create(FP_DEVICE_CPU, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_context_create((fp_device_kind)7, 0, &ctx), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    if (!ctx) return;
    CHECK(fp_context_kind(ctx) == FP_DEVICE_CPU);
    CHECK(fp_context_device_index(ctx) == -1);
    CHECK_OK(fp_context_synchronize(ctx, NULL));
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_CPU_THREADS, 3));
    CHECK(fp_thread_pool_size(ctx->pool) == 3);
    CHECK_STATUS(fp_context_set_option(ctx, FP_CTX_CPU_THREADS, -1), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_context_set_option(ctx, (fp_context_option)99, 1), FP_ERR_INVALID_ARGUMENT);
    /* CUDA-only options are accepted and ignored on a CPU context; their
     * range is still checked */
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_SCRATCH_KEEP_BYTES, -1));
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_SCRATCH_KEEP_BYTES, 0));
    CHECK_STATUS(fp_context_set_option(ctx, FP_CTX_SCRATCH_KEEP_BYTES, -2), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 5));
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 0));
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 7));
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 9));
    CHECK_STATUS(fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, 11), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_context_set_option(ctx, FP_CTX_ATTENTION_KERNEL, -1), FP_ERR_INVALID_ARGUMENT);

    void *p = NULL;
    CHECK_STATUS(fp_mem_alloc(ctx, 0, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_mem_alloc(ctx, SIZE_MAX, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_mem_alloc(NULL, 16, &p), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_mem_alloc(ctx, 1000, &p));
    CHECK(((uintptr_t)p & 255) == 0);
    unsigned char host[1000], back[1000];
    for (int i = 0; i < 1000; ++i) host[i] = (unsigned char)(i * 7 + 1);
    CHECK_OK(fp_mem_upload(ctx, p, host, sizeof host, NULL));
    CHECK_OK(fp_mem_download(ctx, back, p, sizeof back, NULL));
    CHECK(memcmp(host, back, sizeof host) == 0);
    CHECK_OK(fp_mem_fill(ctx, p, 0xab, 10, NULL));
    CHECK_OK(fp_mem_download(ctx, back, p, 10, NULL));
    CHECK(back[0] == 0xab && back[9] == 0xab);
    CHECK_STATUS(fp_mem_upload(ctx, NULL, host, 4, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK(fp_mem_free(ctx, p));
    CHECK_OK(fp_mem_free(ctx, NULL));
    fp_context_destroy(ctx);
    fp_context_destroy(NULL);
}

int main(void) {
    int ngpu = 0;
    cudaError_t e = cudaGetDeviceCount(&ngpu);
    if (e != cudaSuccess) ngpu = 0;
    test_version();
    test_status_strings();
    test_error_detail();
    test_dtypes();
    test_conversions();
    test_devices(ngpu);
    test_cpu_context();
    TEST_END();
}
