/* The span ring on a CPU context (trace.h): off by default, nesting and
 * tags of user ranges and op spans, the step counter, the allocator's bytes,
 * overflow (oldest overwritten) and its counters, explicit records read back
 * exactly, and bad input (capacity 0, unbalanced pop, unknown handles, a
 * range stack too deep, unwritable export paths) answered with a status and
 * a message while the context keeps recording. */
#include <dirent.h>
#include <pthread.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp_test.h"
#include "trace_test_util.h"

static void sleep_us(unsigned us) { usleep(us); }

static size_t read_all(fp_context *ctx, fp_trace_span *out, size_t max) {
    size_t n = 0;
    CHECK_OK(fp_trace_read(ctx, out, max, &n, 0));
    return n;
}

/* 1 if b lies inside a in time. */
static int inside(const fp_trace_span *a, const fp_trace_span *b) {
    return b->start_s >= a->start_s && b->end_s <= a->end_s;
}

static void test_off_by_default(void) {
    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    CHECK(!fp_trace_is_enabled(ctx));
    uint64_t span = 99;
    CHECK_OK(fp_trace_begin(ctx, NULL, "op", "op", 0, 0, &span));
    CHECK(span == 0);
    CHECK_OK(fp_trace_end(ctx, span));
    size_t n = 7;
    CHECK_OK(fp_trace_read(ctx, NULL, 0, &n, 0));
    CHECK(n == 0);
    fp_trace_stats st = stats_of(ctx);
    CHECK(st.capacity == 0 && st.count == 0 && st.enabled == 0);
    fp_context_destroy(ctx);
}

static void test_nesting_and_tags(void) {
    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    CHECK_OK(fp_trace_enable(ctx, 64));
    CHECK(fp_trace_is_enabled(ctx));
    CHECK_OK(fp_trace_set_step(ctx, 3));
    uint64_t a = 0, b = 0;
    CHECK_OK(fp_trace_push(ctx, "encoder", "forward"));
    CHECK_OK(fp_trace_begin(ctx, NULL, "matmul", "op", 100, 200, &a));
    CHECK(a != 0);
    sleep_us(2000);
    CHECK_OK(fp_trace_end(ctx, a));
    CHECK_OK(fp_trace_push(ctx, "encoder.layer0", NULL)); /* stage inherited */
    CHECK_OK(fp_trace_begin(ctx, NULL, "norm", "op", 8, 0, &b));
    sleep_us(1000);
    CHECK_OK(fp_trace_end(ctx, b));
    CHECK_OK(fp_trace_pop(ctx));
    CHECK_OK(fp_trace_pop(ctx));
    int64_t step = 0;
    CHECK_OK(fp_trace_step(ctx, &step));
    CHECK(step == 4);
    CHECK_OK(fp_trace_push(ctx, NULL, "backward"));
    CHECK(stats_of(ctx).depth == 1);
    CHECK_OK(fp_trace_pop(ctx));
    uint64_t c = 0;
    CHECK_OK(fp_trace_begin_collective(ctx, NULL, "allreduce", 4096, 8, &c));
    CHECK_OK(fp_trace_end(ctx, c));

    fp_trace_span s[8];
    size_t n = read_all(ctx, s, 8);
    CHECK_MSG(n == 6, "%zu spans", n);
    if (n != 6) {
        fp_context_destroy(ctx);
        return;
    }
    /* in begin order */
    const char *names[6] = {"encoder/forward", "matmul", "encoder.layer0", "norm", "backward", "allreduce"};
    const char *cats[6] = {"range", "op", "range", "op", "range", "collective"};
    const char *modules[6] = {"encoder", "encoder", "encoder.layer0", "encoder.layer0", "", ""};
    const char *stages[6] = {"forward", "forward", "forward", "forward", "backward", ""};
    const int depths[6] = {0, 1, 1, 2, 0, 0};
    const int64_t steps[6] = {3, 3, 3, 3, 4, 4};
    for (int i = 0; i < 6; ++i) {
        CHECK_MSG(!strcmp(s[i].name, names[i]), "span %d name '%s', expected '%s'", i, s[i].name, names[i]);
        CHECK_MSG(!strcmp(s[i].category, cats[i]), "span %d category '%s'", i, s[i].category);
        CHECK_MSG(!strcmp(s[i].module, modules[i]), "span %d module '%s', expected '%s'", i, s[i].module, modules[i]);
        CHECK_MSG(!strcmp(s[i].stage, stages[i]), "span %d stage '%s', expected '%s'", i, s[i].stage, stages[i]);
        CHECK_MSG(s[i].depth == depths[i], "span %d depth %d, expected %d", i, s[i].depth, depths[i]);
        CHECK_MSG(s[i].step == steps[i], "span %d step %lld", i, (long long)s[i].step);
        CHECK(s[i].device == -1);
        CHECK(s[i].stream == s[0].stream && s[i].stream != 0); /* one recording thread */
        CHECK(s[i].end_s >= s[i].start_s);
        CHECK(s[i].allocated_bytes == -1);
        CHECK(s[i].struct_size == sizeof s[i]);
        if (i) CHECK(s[i].start_s >= s[i - 1].start_s);
    }
    CHECK(s[1].bytes == 100 && s[1].flops == 200);
    CHECK(s[5].bytes == 4096 && s[5].nranks == 8);
    CHECK_MSG(s[1].end_s - s[1].start_s >= 0.002, "matmul lasted %g s, slept 2 ms", s[1].end_s - s[1].start_s);
    CHECK_MSG(s[3].end_s - s[3].start_s >= 0.001, "norm lasted %g s, slept 1 ms", s[3].end_s - s[3].start_s);
    CHECK(inside(&s[0], &s[1]) && inside(&s[0], &s[2]) && inside(&s[2], &s[3]) && inside(&s[0], &s[3]));
    CHECK(s[4].start_s >= s[0].end_s);
    CHECK(s[2].start_s >= s[1].end_s); /* siblings in sequence */
    fp_trace_stats st = stats_of(ctx);
    CHECK(st.count == 6 && st.recorded == 6 && st.dropped == 0 && st.open == 0 && st.depth == 0);
    CHECK(st.step == 4 && st.enabled == 1 && st.capacity == 64);

    /* disabled: nothing new is recorded, the ring stays readable */
    CHECK_OK(fp_trace_disable(ctx));
    uint64_t d = 5;
    CHECK_OK(fp_trace_begin(ctx, NULL, "ignored", "op", 0, 0, &d));
    CHECK(d == 0);
    CHECK_OK(fp_trace_push(ctx, "m", "s")); /* the stack is kept while off */
    CHECK_OK(fp_trace_pop(ctx));
    CHECK(read_all(ctx, s, 8) == 6);
    /* re-enabled with the same capacity: the ring is kept */
    CHECK_OK(fp_trace_enable(ctx, 64));
    CHECK(read_all(ctx, s, 8) == 6);
    fp_context_destroy(ctx);
}

static void test_overflow(void) {
    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    CHECK_OK(fp_trace_enable(ctx, 8));
    char name[32];
    for (int i = 0; i < 20; ++i) {
        uint64_t h = 0;
        snprintf(name, sizeof name, "s%d", i);
        CHECK_OK(fp_trace_begin(ctx, NULL, name, "op", i, 0, &h));
        CHECK_OK(fp_trace_end(ctx, h));
    }
    fp_trace_stats st = stats_of(ctx);
    CHECK_MSG(st.count == 8 && st.recorded == 20 && st.dropped == 12, "count %zu recorded %llu dropped %llu",
              st.count, (unsigned long long)st.recorded, (unsigned long long)st.dropped);
    fp_trace_span s[8];
    size_t n = read_all(ctx, s, 8);
    CHECK(n == 8);
    for (size_t i = 0; i < n; ++i) { /* the newest 8, oldest first */
        snprintf(name, sizeof name, "s%zu", i + 12);
        CHECK_MSG(!strcmp(s[i].name, name), "slot %zu holds '%s', expected '%s'", i, s[i].name, name);
    }
    /* max below the count: the newest max */
    CHECK(read_all(ctx, s, 3) == 3 && !strcmp(s[0].name, "s17") && !strcmp(s[2].name, "s19"));

    /* an open span overwritten by newer ones is counted once and its end is harmless */
    uint64_t open = 0;
    CHECK_OK(fp_trace_begin(ctx, NULL, "long", "op", 0, 0, &open));
    CHECK(stats_of(ctx).open == 1);
    for (int i = 0; i < 8; ++i) {
        uint64_t h = 0;
        CHECK_OK(fp_trace_begin(ctx, NULL, "short", "op", 0, 0, &h));
        CHECK_OK(fp_trace_end(ctx, h));
    }
    st = stats_of(ctx);
    CHECK(st.open == 0 && st.dropped == 12 + 9 && st.count == 8);
    CHECK_OK(fp_trace_end(ctx, open));
    st = stats_of(ctx);
    CHECK(st.recorded == 28 && st.count == 8);
    for (size_t i = 0, k = read_all(ctx, s, 8); i < k; ++i) CHECK(!strcmp(s[i].name, "short"));

    /* read with clear empties the ring and resets the counters */
    CHECK(read_all(ctx, s, 8) == 8);
    CHECK_OK(fp_trace_read(ctx, s, 8, &n, 1));
    CHECK(n == 8);
    st = stats_of(ctx);
    CHECK(st.count == 0 && st.dropped == 0 && st.recorded == 0);
    CHECK_OK(fp_trace_end(ctx, open)); /* from before the clear: harmless */

    /* a new capacity replaces the ring */
    CHECK_OK(fp_trace_enable(ctx, 2));
    uint64_t h = 0;
    for (int i = 0; i < 3; ++i) {
        CHECK_OK(fp_trace_begin(ctx, NULL, "x", "op", 0, 0, &h));
        CHECK_OK(fp_trace_end(ctx, h));
    }
    st = stats_of(ctx);
    CHECK(st.capacity == 2 && st.count == 2 && st.dropped == 1);
    fp_context_destroy(ctx);
}

static void test_record_exact(void) {
    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    fp_trace_span in;
    CHECK_OK(fp_trace_span_init(&in));
    CHECK(in.device == -1 && in.allocated_bytes == -1 && in.struct_size == sizeof in);
    strcpy(in.name, "attention");
    strcpy(in.category, "op");
    strcpy(in.module, "decoder");
    strcpy(in.stage, "forward");
    in.step = 12;
    in.device = 1;
    in.stream = 0xabc;
    in.start_s = 10.25;
    in.end_s = 10.75;
    in.bytes = 1e6;
    in.flops = 2e9;
    in.allocated_bytes = 3 * 1048576.0;
    CHECK_STATUS(fp_trace_record(ctx, &in), FP_ERR_INVALID_ARGUMENT); /* no ring yet */
    CHECK(strstr(fp_last_error(), "fp_trace_enable") != NULL);
    CHECK_OK(fp_trace_enable(ctx, 4));
    CHECK_OK(fp_trace_record(ctx, &in));
    fp_trace_span out;
    CHECK(read_all(ctx, &out, 1) == 1);
    CHECK(!memcmp(&in, &out, sizeof in));
    /* bad spans: nothing recorded */
    fp_trace_span bad = in;
    bad.end_s = 10.0;
    CHECK_STATUS(fp_trace_record(ctx, &bad), FP_ERR_INVALID_ARGUMENT);
    bad = in;
    bad.name[0] = '\0';
    CHECK_STATUS(fp_trace_record(ctx, &bad), FP_ERR_INVALID_ARGUMENT);
    bad = in;
    bad.start_s = NAN;
    CHECK_STATUS(fp_trace_record(ctx, &bad), FP_ERR_INVALID_ARGUMENT);
    bad = in;
    bad.bytes = -1;
    CHECK_STATUS(fp_trace_record(ctx, &bad), FP_ERR_INVALID_ARGUMENT);
    bad = in;
    memset(bad.stage, 'x', sizeof bad.stage);
    CHECK_STATUS(fp_trace_record(ctx, &bad), FP_ERR_INVALID_ARGUMENT);
    bad = in;
    bad.struct_size = sizeof bad + 8;
    CHECK_STATUS(fp_trace_record(ctx, &bad), FP_ERR_INVALID_ARGUMENT);
    CHECK(stats_of(ctx).count == 1);
    /* long names are truncated, not overrun */
    CHECK_OK(fp_trace_push(ctx, "a-module-name-much-longer-than-sixty-four-characters-to-be-cut-somewhere", "fwd"));
    CHECK_OK(fp_trace_pop(ctx));
    fp_trace_span two[2];
    CHECK(read_all(ctx, two, 2) == 2);
    CHECK(strlen(two[1].name) == FP_TRACE_NAME_MAX - 1 && strlen(two[1].module) == FP_TRACE_MODULE_MAX - 1);
    fp_context_destroy(ctx);
}

static void test_allocator_bytes(void) {
    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    fp_allocator *a = NULL;
    CHECK_OK(fp_alloc_create_for_context(ctx, NULL, &a));
    CHECK_STATUS(fp_trace_set_allocator(ctx, a), FP_ERR_INVALID_ARGUMENT); /* never enabled */
    CHECK_OK(fp_trace_enable(ctx, 16));
    CHECK_OK(fp_trace_set_allocator(ctx, a));
    void *p = NULL;
    CHECK_OK(fp_alloc_alloc(a, 3 << 20, NULL, &p));
    fp_alloc_stats as;
    memset(&as, 0, sizeof as);
    as.struct_size = sizeof as;
    CHECK_OK(fp_alloc_get_stats(a, &as));
    CHECK(as.allocated_bytes.current >= (3 << 20));
    uint64_t h = 0;
    CHECK_OK(fp_trace_begin(ctx, NULL, "with_alloc", "op", 0, 0, &h));
    CHECK_OK(fp_trace_end(ctx, h));
    CHECK_OK(fp_alloc_free(a, p));
    CHECK_OK(fp_trace_set_allocator(ctx, NULL));
    CHECK_OK(fp_trace_begin(ctx, NULL, "without", "op", 0, 0, &h));
    CHECK_OK(fp_trace_end(ctx, h));
    fp_trace_span s[2];
    CHECK(read_all(ctx, s, 2) == 2);
    CHECK_MSG(s[0].allocated_bytes == (double)as.allocated_bytes.current, "allocated %g, allocator says %lld",
              s[0].allocated_bytes, (long long)as.allocated_bytes.current);
    CHECK(s[1].allocated_bytes == -1);
    fp_alloc_destroy(a);
    fp_context_destroy(ctx);
}

/* 1 if dir holds exactly one entry besides . and .., named `only`
 * (NULL: none). */
static int dir_holds_only(const char *dir, const char *only) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int others = 0, found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (only && !strcmp(e->d_name, only)) found = 1;
        else ++others;
    }
    closedir(d);
    return !others && (only ? found : 1);
}

static void test_bad_input(void) {
    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    /* capacity 0 */
    fp_clear_error();
    CHECK_STATUS(fp_trace_enable(ctx, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(fp_last_error(), "capacity 0") != NULL, "message: %s", fp_last_error());
    CHECK(!fp_trace_is_enabled(ctx));
    CHECK_STATUS(fp_trace_enable(ctx, (size_t)1 << 40), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_enable(NULL, 8), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_pop(ctx), FP_ERR_INVALID_ARGUMENT); /* never enabled, nothing open */
    CHECK_OK(fp_trace_enable(ctx, 32));
    /* a failed enable keeps the ring */
    CHECK_STATUS(fp_trace_enable(ctx, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK(fp_trace_is_enabled(ctx) && stats_of(ctx).capacity == 32);

    /* unbalanced pop: a status and a message, nothing changes */
    CHECK_OK(fp_trace_push(ctx, "m", "forward"));
    CHECK_OK(fp_trace_pop(ctx));
    fp_clear_error();
    CHECK_STATUS(fp_trace_pop(ctx), FP_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(fp_last_error(), "unbalanced pop") != NULL, "message: %s", fp_last_error());
    CHECK(stats_of(ctx).depth == 0);

    /* bad arguments of begin / end / push */
    uint64_t h = 1;
    CHECK_STATUS(fp_trace_begin(ctx, NULL, NULL, "op", 0, 0, &h), FP_ERR_INVALID_ARGUMENT);
    CHECK(h == 0);
    CHECK_STATUS(fp_trace_begin(ctx, NULL, "x", "", 0, 0, &h), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_begin(ctx, NULL, "x", "op", -1, 0, &h), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_begin(ctx, NULL, "x", "op", 0, INFINITY, &h), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_begin(ctx, NULL, "x", "op", 0, 0, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_begin_collective(ctx, NULL, "allreduce", 8, -2, &h), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_end(ctx, 1000000), FP_ERR_INVALID_ARGUMENT); /* never issued */
    CHECK_OK(fp_trace_begin(ctx, NULL, "x", "op", 0, 0, &h));
    CHECK_OK(fp_trace_end(ctx, h));
    CHECK_STATUS(fp_trace_end(ctx, h), FP_ERR_INVALID_ARGUMENT); /* already ended */
    CHECK(strstr(fp_last_error(), "already ended") != NULL);
    CHECK_STATUS(fp_trace_push(ctx, NULL, ""), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_set_step(ctx, -1), FP_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < FP_TRACE_MAX_DEPTH; ++i) CHECK_OK(fp_trace_push(ctx, "deep", NULL));
    CHECK_STATUS(fp_trace_push(ctx, "deep", NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK(stats_of(ctx).depth == FP_TRACE_MAX_DEPTH);
    for (int i = 0; i < FP_TRACE_MAX_DEPTH; ++i) CHECK_OK(fp_trace_pop(ctx));
    CHECK_STATUS(fp_trace_pop(ctx), FP_ERR_INVALID_ARGUMENT);
    fp_trace_span one;
    size_t n = 0;
    CHECK_STATUS(fp_trace_read_sized(ctx, &one, sizeof one + 8, 1, &n, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_read(ctx, NULL, 1, &n, 0), FP_ERR_INVALID_ARGUMENT);
    fp_trace_stats bad_stats;
    memset(&bad_stats, 0, sizeof bad_stats);
    CHECK_STATUS(fp_trace_get_stats(ctx, &bad_stats), FP_ERR_INVALID_ARGUMENT); /* struct_size 0 */

    /* unwritable export paths: FP_ERR_IO naming the path, nothing written */
    fp_trace_stats before = stats_of(ctx);
    CHECK_STATUS(fp_trace_export_chrome(ctx, "/nonexistent/dir/x.json"), FP_ERR_IO);
    CHECK_MSG(strstr(fp_last_error(), "/nonexistent/dir/x.json") != NULL, "message: %s", fp_last_error());
    CHECK_STATUS(fp_trace_export_sqlite(ctx, "/nonexistent/dir/x.db"), FP_ERR_IO);
    CHECK_MSG(strstr(fp_last_error(), "/nonexistent/dir/x.db") != NULL, "message: %s", fp_last_error());
    CHECK_STATUS(fp_trace_export_chrome(ctx, ""), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_export_chrome(ctx, NULL), FP_ERR_INVALID_ARGUMENT);
    /* a directory that exists but cannot be written (root may write anywhere: skip then) */
    char dir[] = "/tmp/fp_trace_ro_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/t.json", dir);
    if (chmod(dir, 0500) == 0 && access(dir, W_OK) != 0) {
        CHECK_STATUS(fp_trace_export_chrome(ctx, path), FP_ERR_IO);
        CHECK(dir_holds_only(dir, NULL));
    }
    chmod(dir, 0700);
    /* a path that is a directory: the rename fails, no temporary file is left */
    CHECK_STATUS(fp_trace_export_chrome(ctx, dir), FP_ERR_IO);
    rmdir(dir);

    /* the context keeps recording after every failure */
    CHECK(stats_of(ctx).count == before.count && stats_of(ctx).recorded == before.recorded);
    CHECK_OK(fp_trace_push(ctx, "after", "errors"));
    CHECK_OK(fp_trace_begin(ctx, NULL, "still", "op", 0, 0, &h));
    CHECK(h != 0);
    CHECK_OK(fp_trace_end(ctx, h));
    CHECK_OK(fp_trace_pop(ctx));
    fp_trace_stats st = stats_of(ctx);
    CHECK(st.recorded == before.recorded + 2 && st.open == 0 && st.enabled);
    fp_trace_span last[2];
    CHECK(read_all(ctx, last, 2) == 2 && !strcmp(last[0].name, "after/errors") && !strcmp(last[1].name, "still"));
    fp_context_destroy(ctx);
}

/* Several threads recording on one context: every span lands, each thread's
 * spans on its own stream (thread id). */
typedef struct worker_arg {
    fp_context *ctx;
    int spans;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    for (int i = 0; i < w->spans; ++i) {
        uint64_t h = 0;
        if (fp_trace_begin(w->ctx, NULL, "threaded", "op", 1, 0, &h) != FP_OK || !h) return p;
        if (fp_trace_end(w->ctx, h) != FP_OK) return p;
    }
    return NULL;
}

static void test_threads(void) {
    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    CHECK_OK(fp_trace_enable(ctx, 4096));
    enum { T = 4, PER = 500 };
    pthread_t th[T];
    worker_arg arg = {ctx, PER};
    for (int i = 0; i < T; ++i) CHECK(pthread_create(&th[i], NULL, worker, &arg) == 0);
    for (int i = 0; i < T; ++i) {
        void *r = &arg;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
    fp_trace_stats st = stats_of(ctx);
    CHECK(st.recorded == T * PER && st.count == T * PER && st.dropped == 0 && st.open == 0);
    fp_trace_span *s = malloc(T * PER * sizeof *s);
    size_t n = read_all(ctx, s, T * PER);
    CHECK(n == T * PER);
    uint64_t streams[T] = {0};
    int nstreams = 0;
    for (size_t i = 0; i < n; ++i) {
        int k = 0;
        while (k < nstreams && streams[k] != s[i].stream) ++k;
        if (k == nstreams && nstreams < T) streams[nstreams++] = s[i].stream;
    }
    CHECK_MSG(nstreams == T, "%d distinct thread ids over %d threads", nstreams, T);
    free(s);
    fp_context_destroy(ctx);
}

/* A first enable whose ring cannot be allocated (the address space capped
 * in a child process) leaves a state without a ring: the calls that need
 * one must say so, not divide by its zero capacity. Not under ASan (its
 * shadow memory needs the address space). */
static void test_failed_first_enable(void) {
#ifndef __SANITIZE_ADDRESS__
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        fp_context *ctx;
        if (fp_context_create(FP_DEVICE_CPU, 0, &ctx) != FP_OK) _exit(2);
        struct rlimit lim = {(rlim_t)4 << 30, (rlim_t)4 << 30}; /* the ring asks for ~20 GB */
        if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(77);
        int bad = 0;
        bad |= fp_trace_enable(ctx, (size_t)1 << 26) != FP_ERR_OUT_OF_MEMORY;
        bad |= fp_trace_is_enabled(ctx) != 0;
        fp_trace_span sp;
        fp_trace_span_init(&sp);
        strcpy(sp.name, "x");
        strcpy(sp.category, "op");
        bad |= fp_trace_record(ctx, &sp) != FP_ERR_INVALID_ARGUMENT;
        bad |= fp_trace_end(ctx, 1) != FP_ERR_INVALID_ARGUMENT;
        bad |= fp_trace_push(ctx, "m", "s") != FP_ERR_INVALID_ARGUMENT;
        bad |= fp_trace_step(ctx, NULL) != FP_ERR_INVALID_ARGUMENT;
        size_t n = 1;
        bad |= fp_trace_read(ctx, &sp, 1, &n, 0) != FP_OK || n != 0;
        bad |= fp_trace_enable(ctx, 16) != FP_OK; /* a smaller ring then works */
        bad |= fp_trace_record(ctx, &sp) != FP_OK;
        fp_context_destroy(ctx);
        _exit(bad);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77),
              "the child exited with status %d", status);
#endif
}

int main(void) {
    test_off_by_default();
    test_nesting_and_tags();
    test_overflow();
    test_record_exact();
    test_allocator_bytes();
    test_bad_input();
    test_threads();
    test_failed_first_enable();
    TEST_END();
}
