/* Attention on a CPU context when scratch allocation fails part-way: the
 * header promises "nothing is written" on error, FP_ERR_OUT_OF_MEMORY
 * included. Linked with -Wl,--wrap=malloc so that library code's malloc goes
 * through __wrap_malloc below, which fails every large allocation once a
 * countdown of successful ones runs out. Before the fix each task allocated
 * its own scratch: the first tasks stored their rows of O and lse, a later
 * one failed, and the call returned FP_ERR_OUT_OF_MEMORY with O half
 * written. */
#include <stdatomic.h>
#include <string.h>

#include "attn_test_util.h"

void *__real_malloc(size_t size);
void *__wrap_malloc(size_t size);

static atomic_int g_armed;      /* 0: pass everything through */
static atomic_int g_countdown;  /* large allocations still allowed */
#define LARGE_BYTES ((size_t)16 << 10)

void *__wrap_malloc(size_t size) {
    if (atomic_load(&g_armed) && size >= LARGE_BYTES && atomic_fetch_sub(&g_countdown, 1) <= 0)
        return NULL;
    return __real_malloc(size);
}

static int all_bytes(const void *p, size_t n, unsigned char v) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; ++i)
        if (b[i] != v) return 0;
    return 1;
}

int main(void) {
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, -1, &ctx));
    if (!ctx) return 1;
    /* 4 threads whatever the machine: several chunks run. */
    CHECK_OK(fp_context_set_option(ctx, FP_CTX_CPU_THREADS, 4));
    /* 8 (batch, head) tasks with a 256 KiB score matrix each (naive) and 16
     * tile tasks of ~48 KiB scratch (tiled): every scratch piece is large. */
    const attn_case c = {"oom", 2, 128, 512, 4, 2, 64, FP_F32, 0, -1, -1, 0, 1, 0, 0};
    attn_host H;
    CHECK(attn_host_make(&c, &H, 99));
    const size_t lse_bytes = sizeof(float) * (size_t)c.batch * c.hq * c.sq;
    for (int impl = 0; impl < 2; ++impl) {
        const char *name = impl ? "naive" : "tiled";
        for (int allowed = 0; allowed < 4; ++allowed) {
            memset(H.o, 0x5A, H.o_bytes);
            memset(H.lse, 0x5A, lse_bytes);
            atomic_store(&g_countdown, allowed);
            atomic_store(&g_armed, 1);
            fp_status st = impl ? fp_attention_forward_baseline(ctx, NULL, &H.p)
                                : fp_attention_forward(ctx, NULL, &H.p);
            atomic_store(&g_armed, 0);
            /* no large allocation allowed: must fail (proves the wrap works) */
            if (allowed == 0) CHECK_MSG(st == FP_ERR_OUT_OF_MEMORY, "%s: not OOM with no memory", name);
            if (st == FP_OK) {
                /* enough memory after all: every output row was written */
                CHECK_MSG(!all_bytes(H.o, 64, 0x5A), "%s: OK but O not written", name);
                continue;
            }
            CHECK_MSG(st == FP_ERR_OUT_OF_MEMORY, "%s allowed %d: %s (%s)", name, allowed,
                      fp_status_string(st), fp_last_error());
            CHECK_MSG(strstr(fp_last_error(), "scratch") || strstr(fp_last_error(), "score matrix"),
                      "%s: message '%s'", name, fp_last_error());
            CHECK_MSG(all_bytes(H.o, H.o_bytes, 0x5A) && all_bytes(H.lse, lse_bytes, 0x5A),
                      "%s allowed %d: FP_ERR_OUT_OF_MEMORY with outputs partly written", name, allowed);
        }
        /* with no failure injected the call succeeds */
        CHECK_OK(impl ? fp_attention_forward_baseline(ctx, NULL, &H.p) : fp_attention_forward(ctx, NULL, &H.p));
    }
    attn_host_free(&H);
    fp_context_destroy(ctx);
    TEST_END();
}
