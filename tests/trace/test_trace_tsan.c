/* Tracing from many threads on one CPU context, built with ThreadSanitizer
 * (label tsan): op spans and collectives on four threads, user ranges and
 * steps on a fifth, and a sixth reading, counting and exporting while they
 * record, with the caching allocator sampled at every begin and attached /
 * detached meanwhile. Every span begun is accounted for at the end: in the
 * ring or counted as dropped. */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "fp_test.h"

enum { OP_THREADS = 4, OPS = 2000, RANGES = 500, READS = 40 };

static fp_context *g_ctx;
static fp_allocator *g_alloc;

static void *op_thread(void *p) {
    long *begun = p;
    for (int i = 0; i < OPS; ++i) {
        uint64_t h = 0;
        fp_status st = i % 7 ? fp_trace_begin(g_ctx, NULL, "op", "op", i, 2 * i, &h)
                             : fp_trace_begin_collective(g_ctx, NULL, "allreduce", 1024, 4, &h);
        if (st != FP_OK) return p;
        *begun += h != 0;
        if (fp_trace_end(g_ctx, h) != FP_OK) return p;
    }
    return NULL;
}

static void *range_thread(void *p) {
    for (int i = 0; i < RANGES; ++i) {
        if (fp_trace_push(g_ctx, "model", "forward") != FP_OK) return p;
        if (fp_trace_push(g_ctx, "layer", NULL) != FP_OK) return p;
        if (fp_trace_pop(g_ctx) != FP_OK || fp_trace_pop(g_ctx) != FP_OK) return p;
        if (fp_trace_step(g_ctx, NULL) != FP_OK) return p;
    }
    return NULL;
}

static void *reader_thread(void *p) {
    const char *path = p;
    fp_trace_span spans[64];
    for (int i = 0; i < READS; ++i) {
        size_t n = 0;
        fp_trace_stats st;
        memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        if (fp_trace_read(g_ctx, spans, 64, &n, 0) != FP_OK || fp_trace_get_stats(g_ctx, &st) != FP_OK) return p;
        if (n > 64 || st.count > st.capacity) return p;
        if (i % 10 == 0 && fp_trace_export_chrome(g_ctx, path) != FP_OK) return p;
        if (fp_trace_set_allocator(g_ctx, i % 2 ? NULL : g_alloc) != FP_OK) return p;
    }
    return NULL;
}

int main(void) {
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &g_ctx));
    fp_alloc_upstream up = fp_alloc_upstream_host();
    CHECK_OK(fp_alloc_create(&up, NULL, NULL, &g_alloc));
    CHECK_OK(fp_trace_enable(g_ctx, 512)); /* small: the ring wraps while read */
    char dir[] = "/tmp/fp_trace_tsan_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[96];
    snprintf(path, sizeof path, "%s/t.json", dir);
    pthread_t ops[OP_THREADS], ranges, reader;
    long begun[OP_THREADS] = {0};
    for (int i = 0; i < OP_THREADS; ++i) CHECK(pthread_create(&ops[i], NULL, op_thread, &begun[i]) == 0);
    CHECK(pthread_create(&ranges, NULL, range_thread, NULL) == 0);
    CHECK(pthread_create(&reader, NULL, reader_thread, path) == 0);
    void *r = NULL;
    long total = 0;
    for (int i = 0; i < OP_THREADS; ++i) {
        pthread_join(ops[i], &r);
        CHECK(r == NULL);
        total += begun[i];
    }
    pthread_join(ranges, &r);
    CHECK(r == NULL);
    pthread_join(reader, &r);
    CHECK(r == NULL);
    fp_trace_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_OK(fp_trace_get_stats(g_ctx, &st));
    total += 2 * RANGES; /* every range is a span too */
    CHECK(total == (long)OP_THREADS * OPS + 2 * RANGES);
    /* each span begun is in the ring or was overwritten; those overwritten
     * while open never count as recorded */
    CHECK_MSG((long)(st.count + st.dropped) == total && (long)st.recorded <= total && st.recorded >= st.count,
              "begun %ld: in the ring %zu, dropped %llu, recorded %llu", total, st.count,
              (unsigned long long)st.dropped, (unsigned long long)st.recorded);
    CHECK(st.open == 0 && st.depth == 0 && st.step == RANGES && st.count == 512);
    printf("%ld spans begun: %zu in the ring, %llu dropped, %llu recorded\n", total, st.count,
           (unsigned long long)st.dropped, (unsigned long long)st.recorded);
    CHECK_OK(fp_trace_set_allocator(g_ctx, NULL));
    fp_alloc_destroy(g_alloc);
    unlink(path);
    rmdir(dir);
    fp_context_destroy(g_ctx);
    TEST_END();
}
