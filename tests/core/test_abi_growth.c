/* Versioned structs can grow (core.h, "Conventions"): a program built
 * against an older header keeps working with this library, one built
 * against a newer header gets a clear FP_ERR_INVALID_ARGUMENT.
 *
 * The "old programs" here are written as such a program is compiled: with
 * their own copies of the older struct layouts, calling the exported
 * symbols (the names in parentheses, not the header's macros that pass
 * this header's sizeof). Every buffer handed to the library is followed by
 * a canary that must survive: the library may never write past a caller's
 * struct or array element. */
#include <stddef.h>
#include <string.h>

#include "fastpath/fastpath.h"
#include "fp_test.h"

#define CANARY 0xA5
static int canary_ok(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != CANARY) return 0;
    return 1;
}

/* fp_alloc_event as 0.2 laid it out (40 bytes; pool a 32-bit field). */
typedef struct event_0_2 {
    uint64_t seq;
    uint32_t kind;
    uint32_t pool;
    uintptr_t ptr;
    size_t size;
    void *stream;
} event_0_2;

static void test_alloc_event_0_2(void) {
    CHECK(sizeof(event_0_2) == FP_ALLOC_EVENT_SIZE_0_2);
    fp_alloc_config cfg;
    fp_alloc_config_default(&cfg);
    cfg.event_ring_size = 64;
    fp_allocator *a = NULL;
    fp_alloc_upstream up = fp_alloc_upstream_host();
    CHECK_OK(fp_alloc_create(&up, NULL, &cfg, &a));
    if (!a) return;
    /* a private pool whose id needs 64 bits */
    const uint64_t pool = ((uint64_t)7 << 32) | 5u;
    fp_stream s = (fp_stream)0x10;
    CHECK_OK(fp_alloc_pool_begin(a, pool, s));
    void *p = NULL;
    CHECK_OK(fp_alloc_alloc(a, 4096, s, &p));
    CHECK_OK(fp_alloc_pool_end(a, pool));
    CHECK_OK(fp_alloc_free(a, p));

    /* The old program: an array of 0.2 events, then the canary. */
    unsigned char buf[4 * sizeof(event_0_2) + 64];
    memset(buf, CANARY, sizeof buf);
    size_t n = 0;
    CHECK_OK((fp_alloc_read_events)(a, (fp_alloc_event *)buf, 4, &n, 0));
    CHECK(n >= 2 && n <= 4);
    CHECK(canary_ok(buf + n * sizeof(event_0_2), sizeof buf - n * sizeof(event_0_2)));
    int saw_alloc = 0;
    for (size_t i = 0; i < n; ++i) {
        event_0_2 e;
        memcpy(&e, buf + i * sizeof e, sizeof e);
        if (e.kind == FP_ALLOC_EV_ALLOC) {
            saw_alloc = 1;
            CHECK(e.pool == 5u); /* 0.2's field: the low bits */
            CHECK(e.ptr == (uintptr_t)p && e.size == 4096 && e.stream == s);
        }
    }
    CHECK(saw_alloc);
    /* ...and builds a trace from them with the exported function */
    fp_alloc_trace *t = NULL;
    CHECK_OK((fp_alloc_trace_from_events)((const fp_alloc_event *)buf, n, &t));
    CHECK(t && t->n_ops == 2);
    fp_alloc_trace_destroy(t);

    /* A program built against this header gets the whole pool id. */
    fp_alloc_event ev[4];
    CHECK_OK(fp_alloc_read_events(a, ev, 4, &n, 0));
    int found = 0;
    for (size_t i = 0; i < n; ++i)
        if (ev[i].kind == FP_ALLOC_EV_ALLOC) found = ev[i].pool == pool && ev[i].pool_low == 5u;
    CHECK(found);
    /* An element size the library does not know. */
    CHECK_STATUS(fp_alloc_read_events_sized(a, ev, sizeof(fp_alloc_event) + 8, 4, &n, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "newer libfastpath header") != NULL);
    CHECK_STATUS(fp_alloc_read_events_sized(a, ev, FP_ALLOC_EVENT_SIZE_0_2 - 8, 4, &n, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_alloc_trace_from_events_sized(ev, sizeof(fp_alloc_event) + 8, 1, &t), FP_ERR_INVALID_ARGUMENT);
    fp_alloc_destroy(a);
}

/* The tables: a program built against a header whose fp_alloc_upstream had
 * one more callback is refused; this header's is accepted. */
static void test_tables(void) {
    fp_alloc_upstream up = fp_alloc_upstream_host();
    fp_allocator *a = NULL;
    struct {
        fp_alloc_upstream up;
        void *newer_callback;
    } newer = {up, NULL};
    CHECK_STATUS(fp_alloc_create_sized(&newer.up, sizeof newer, NULL, sizeof(fp_alloc_event_ops), NULL, &a),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK(a == NULL && strstr(fp_last_error(), "fp_alloc_upstream") != NULL);
    CHECK_STATUS(fp_alloc_create_sized(&up, sizeof up - sizeof(void *), NULL, 0, NULL, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK((fp_alloc_create)(&up, NULL, NULL, &a)); /* a 0.2 program */
    fp_alloc_destroy(a);
    a = NULL;
    CHECK_OK(fp_alloc_create(&up, NULL, NULL, &a));
    fp_alloc_destroy(a);
    fp_alloc_trace *t = NULL;
    CHECK_OK(fp_alloc_trace_generate(NULL, &t));
    fp_alloc_replay_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    CHECK_STATUS(fp_alloc_trace_replay_direct_sized(&newer.up, sizeof newer, t, 0, &r), FP_ERR_INVALID_ARGUMENT);
    CHECK_OK((fp_alloc_trace_replay_direct)(&up, t, 0, &r));
    CHECK(r.upstream_allocs > 0);
    fp_alloc_trace_destroy(t);
}

/* fp_attention_params as 0.1 laid it out ended at cu_seqlens_k: the
 * exported fp_attention_params_default writes only that much. */
static void test_attention_params_0_1(void) {
    const size_t v01 = offsetof(fp_attention_params, cu_seqlens_k) + sizeof(const int32_t *);
    unsigned char buf[sizeof(fp_attention_params) + 64];
    memset(buf, CANARY, sizeof buf);
    (fp_attention_params_default)((fp_attention_params *)buf);
    size_t written;
    memcpy(&written, buf, sizeof written);
    CHECK(written == v01);
    CHECK(canary_ok(buf + v01, sizeof buf - v01));
    /* any size from 0.1's to this one's; nothing else, nothing written */
    fp_attention_params p;
    memset(&p, CANARY, sizeof p);
    CHECK_STATUS(fp_attention_params_init(&p, sizeof p + 8), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_attention_params_init(&p, v01 - 8), FP_ERR_INVALID_ARGUMENT);
    CHECK(canary_ok((const unsigned char *)&p, sizeof p));
    CHECK_OK(fp_attention_params_init(&p, v01));
    CHECK_OK(fp_attention_params_init(&p, sizeof p));
}

/* fp_alloc_stats before pools[] (FP_ALLOC_STATS_SIZE_V1): written up to it. */
static void test_alloc_stats_v1(void) {
    fp_allocator *a = NULL;
    fp_alloc_upstream up = fp_alloc_upstream_host();
    CHECK_OK(fp_alloc_create(&up, NULL, NULL, &a));
    unsigned char buf[sizeof(fp_alloc_stats) + 64];
    memset(buf, CANARY, sizeof buf);
    size_t v1 = FP_ALLOC_STATS_SIZE_V1;
    memcpy(buf, &v1, sizeof v1);
    CHECK_OK(fp_alloc_get_stats(a, (fp_alloc_stats *)buf));
    CHECK(canary_ok(buf + v1, sizeof buf - v1));
    fp_alloc_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st + 8; /* a newer program's */
    CHECK_STATUS(fp_alloc_get_stats(a, &st), FP_ERR_INVALID_ARGUMENT);
    CHECK(st.struct_size == sizeof st + 8 && st.cache_hits == 0);
    fp_alloc_destroy(a);
}

/* Every versioned struct: its initializer's exported symbol writes its
 * first published layout and nothing past it, the sized initializer takes
 * the caller's size, and a struct_size larger than the library's (a program
 * built against a newer header) is refused by the initializer and by the
 * function that reads the struct, with a message saying so. */
typedef fp_status (*sized_init_fn)(void *p, size_t size);
typedef void (*legacy_init_fn)(void *p);
typedef struct versioned {
    const char *name;
    size_t size;
    sized_init_fn sized;
    legacy_init_fn legacy;
    size_t first; /* the first published size, once the struct grew (0: size) */
} versioned;

static void test_initializers(void) {
    const versioned all[] = {
        {"fp_device_info", sizeof(fp_device_info), (sized_init_fn)fp_device_info_init_sized,
         (legacy_init_fn)(fp_device_info_init), 0},
        {"fp_timing_config", sizeof(fp_timing_config), (sized_init_fn)fp_timing_config_default_sized,
         (legacy_init_fn)(fp_timing_config_default), 0},
        {"fp_ab_spec", sizeof(fp_ab_spec), (sized_init_fn)fp_ab_spec_init_sized, (legacy_init_fn)(fp_ab_spec_init), 0},
        {"fp_norm_params", sizeof(fp_norm_params), (sized_init_fn)fp_norm_params_default_sized,
         (legacy_init_fn)(fp_norm_params_default), 0},
        {"fp_norm_backward_params", sizeof(fp_norm_backward_params),
         (sized_init_fn)fp_norm_backward_params_default_sized,
         (legacy_init_fn)(fp_norm_backward_params_default), 0},
        {"fp_alloc_config", sizeof(fp_alloc_config), (sized_init_fn)fp_alloc_config_default_sized,
         (legacy_init_fn)(fp_alloc_config_default), 0},
        {"fp_alloc_trace_config", sizeof(fp_alloc_trace_config), (sized_init_fn)fp_alloc_trace_config_default_sized,
         (legacy_init_fn)(fp_alloc_trace_config_default), 0},
        {"fp_batcher_config", sizeof(fp_batcher_config), (sized_init_fn)fp_batcher_config_default_sized,
         (legacy_init_fn)(fp_batcher_config_default),
         offsetof(fp_batcher_config, trace_context)},
        {"fp_batch_submit_info", sizeof(fp_batch_submit_info), (sized_init_fn)fp_batch_submit_info_default_sized,
         (legacy_init_fn)(fp_batch_submit_info_default), 0},
        {"fp_batcher_stats", sizeof(fp_batcher_stats), (sized_init_fn)fp_batcher_stats_init_sized,
         (legacy_init_fn)(fp_batcher_stats_init), 0},
        {"fp_batcher_bench_config", sizeof(fp_batcher_bench_config),
         (sized_init_fn)fp_batcher_bench_config_default_sized,
         (legacy_init_fn)(fp_batcher_bench_config_default), 0},
    };
    static unsigned char buf[8192];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) {
        const versioned *v = &all[i];
        const size_t first = v->first ? v->first : v->size;
        memset(buf, CANARY, sizeof buf);
        v->legacy(buf);
        size_t written;
        memcpy(&written, buf, sizeof written);
        CHECK_MSG(written == first && canary_ok(buf + first, 256), "%s: the exported initializer wrote %zu",
                  v->name, written);
        if (first < v->size) { /* an older program's size: accepted, written up to it */
            memset(buf, CANARY, sizeof buf);
            CHECK_OK(v->sized(buf, first));
            CHECK(canary_ok(buf + first, 64));
        }
        v->legacy(NULL); /* NULL: a no-op */
        memset(buf, CANARY, sizeof buf);
        CHECK_STATUS(v->sized(buf, v->size + 8), FP_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(fp_last_error(), v->name) && strstr(fp_last_error(), "newer libfastpath header"),
                  "%s: %s", v->name, fp_last_error());
        CHECK(canary_ok(buf, v->size + 64)); /* nothing written */
        CHECK_STATUS(v->sized(buf, sizeof(size_t) - 1), FP_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(v->sized(NULL, v->size), FP_ERR_INVALID_ARGUMENT);
        CHECK_OK(v->sized(buf, v->size));
        CHECK(canary_ok(buf + v->size, 64));
    }
}

static fp_status never_called(void *user, fp_stream stream) { return FP_ERR_INTERNAL; }
static fp_status copy_executed(void *user, fp_batch_item *items, int count, int padded) {
    for (int i = 0; i < count; ++i) memcpy(items[i].output, items[i].input, items[i].input_size);
    return FP_OK;
}
static fp_status never_executed(void *user, fp_batch_item *items, int count, int padded) { return FP_ERR_INTERNAL; }

/* The functions that read a caller's struct refuse a newer program's. */
static void test_readers_refuse_newer(void) {
    fp_context *cpu = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &cpu));
    fp_device_info info;
    fp_device_info_init(&info);
    CHECK_OK(fp_context_device_info(cpu, &info));
    CHECK(info.kind == FP_DEVICE_CPU);
    info.struct_size = sizeof info + 8;
    CHECK_STATUS(fp_context_device_info(cpu, &info), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_cpu_get_info(&info), FP_ERR_INVALID_ARGUMENT);

    fp_norm_params np;
    fp_norm_params_default(&np);
    np.struct_size += 8;
    float x[8] = {0}, out[8];
    np.x = x;
    np.out = out;
    np.rows = 1;
    np.cols = 8;
    CHECK_STATUS(fp_norm_forward(cpu, NULL, &np), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "newer libfastpath header") != NULL);

    fp_alloc_config ac;
    fp_alloc_config_default(&ac);
    ac.struct_size += 8;
    fp_allocator *a = NULL;
    fp_alloc_upstream up = fp_alloc_upstream_host();
    CHECK_STATUS(fp_alloc_create(&up, NULL, &ac, &a), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_torch_allocator_configure(&ac), FP_ERR_INVALID_ARGUMENT);

    fp_batcher_config bc;
    fp_batcher_config_default(&bc);
    bc.struct_size += 8;
    CHECK_STATUS(fp_batcher_config_validate(&bc), FP_ERR_INVALID_ARGUMENT);
    fp_batcher_config_default(&bc);
    CHECK_OK(fp_batcher_config_validate(&bc));
    fp_batcher *b = NULL;
    CHECK_STATUS(fp_batcher_create_sized(&bc, never_executed, NULL, sizeof(fp_batch_item) + 8, &b),
                 FP_ERR_INVALID_ARGUMENT);
    CHECK(b == NULL && strstr(fp_last_error(), "fp_batch_item") != NULL);
    /* An older program's config ends before trace_context: whatever lies
     * past its size is not read (a garbage context would crash the batch). */
    fp_batcher_config_default(&bc);
    memset(&bc.trace_context, 0xab, sizeof bc.trace_context);
    bc.struct_size = offsetof(fp_batcher_config, trace_context);
    CHECK_OK(fp_batcher_create(&bc, copy_executed, NULL, &b));
    if (b) {
        int in = 7, got = 0;
        fp_batch_submit_info si;
        fp_batch_submit_info_default(&si);
        si.input = &in;
        si.input_size = sizeof in;
        si.output = &got;
        si.output_size = sizeof got;
        fp_batch_request *req = NULL;
        CHECK_OK(fp_batcher_submit(b, &si, &req));
        fp_status rs = FP_ERR_INTERNAL;
        CHECK_OK(fp_batch_request_wait(req, 10 * 1000000LL, &rs));
        CHECK(rs == FP_OK && got == 7);
        fp_batch_request_release(req);
        CHECK_OK(fp_batcher_destroy(b));
    }

    fp_timing_config tc;
    fp_timing_config_default(&tc);
    tc.struct_size += 8;
    fp_stats stats;
    CHECK_STATUS(fp_time(cpu, NULL, never_called, NULL, &tc, &stats), FP_ERR_INVALID_ARGUMENT);
    fp_context_destroy(cpu);
}

int main(void) {
    test_alloc_event_0_2();
    test_tables();
    test_attention_params_0_1();
    test_alloc_stats_v1();
    test_initializers();
    test_readers_refuse_newer();
    TEST_END();
}
