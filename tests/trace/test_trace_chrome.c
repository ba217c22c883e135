/* The Chrome trace export (fp_trace_export_chrome) parsed back with cJSON and
 * checked as a trace viewer reads it: the document's schema, every event
 * well-formed (name, ph, pid, tid; complete events with ts and dur >= 0),
 * each (pid, tid) named by metadata, spans nested consistently on every
 * thread (each event inside the one it starts in, never straddling its end),
 * the values of a span recorded with known times, and an atomic overwrite. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fp_test.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf) buf[n] = '\0';
    fclose(f);
    return buf;
}

typedef struct xevent {
    int pid, tid;
    double ts, dur;
    const char *name;
} xevent;

static int by_thread_then_time(const void *a, const void *b) {
    const xevent *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->dur > y->dur ? -1 : x->dur < y->dur; /* the parent first */
}

/* Checks one exported document; returns the number of complete events. */
static int validate(const char *text, int *named_threads) {
    cJSON *root = cJSON_Parse(text);
    CHECK_MSG(root != NULL, "the export is not JSON");
    if (!root) return -1;
    CHECK(cJSON_IsObject(root));
    cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    CHECK(cJSON_IsArray(events));
    int n = cJSON_GetArraySize(events), nx = 0;
    xevent *xs = calloc((size_t)n + 1, sizeof *xs);
    int meta_pids[64], meta_tids[64], nmeta = 0;
    *named_threads = 0;
    for (int i = 0; i < n; ++i) {
        cJSON *e = cJSON_GetArrayItem(events, i);
        cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
        cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
        int ok = cJSON_IsString(name) && cJSON_IsString(ph) && cJSON_IsNumber(pid) && cJSON_IsNumber(tid);
        CHECK_MSG(ok, "event %d lacks name / ph / pid / tid", i);
        if (!ok) continue;
        CHECK(pid->valuedouble >= 0 && tid->valuedouble >= 0);
        if (!strcmp(ph->valuestring, "M")) {
            cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
            cJSON *an = cJSON_GetObjectItemCaseSensitive(args, "name");
            CHECK_MSG(cJSON_IsString(an) && an->valuestring[0], "metadata event %d has no args.name", i);
            CHECK(!strcmp(name->valuestring, "process_name") || !strcmp(name->valuestring, "thread_name"));
            if (!strcmp(name->valuestring, "thread_name") && nmeta < 64) {
                meta_pids[nmeta] = pid->valueint;
                meta_tids[nmeta++] = tid->valueint;
            }
            continue;
        }
        CHECK_MSG(!strcmp(ph->valuestring, "X"), "event %d has ph '%s'", i, ph->valuestring);
        cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts");
        cJSON *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
        cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
        ok = cJSON_IsNumber(ts) && cJSON_IsNumber(dur) && cJSON_IsString(cat);
        CHECK_MSG(ok, "complete event %d ('%s') lacks ts / dur / cat", i, name->valuestring);
        if (!ok) continue;
        CHECK_MSG(dur->valuedouble >= 0 && ts->valuedouble >= 0, "event '%s': ts %g dur %g", name->valuestring,
                  ts->valuedouble, dur->valuedouble);
        xs[nx++] = (xevent){pid->valueint, tid->valueint, ts->valuedouble, dur->valuedouble, name->valuestring};
    }
    /* every thread of a complete event is named */
    for (int i = 0; i < nx; ++i) {
        int found = 0;
        for (int k = 0; k < nmeta; ++k) found |= meta_pids[k] == xs[i].pid && meta_tids[k] == xs[i].tid;
        CHECK_MSG(found, "pid %d tid %d has no thread_name", xs[i].pid, xs[i].tid);
    }
    *named_threads = nmeta;
    /* nesting per thread: a stack of open events; each new one must end
     * inside the innermost it starts in (tolerance: the microsecond values'
     * rounding) */
    qsort(xs, (size_t)nx, sizeof *xs, by_thread_then_time);
    const double eps = 1e-3;
    xevent *stack[256];
    int depth = 0;
    for (int i = 0; i < nx; ++i) {
        if (i && (xs[i].pid != xs[i - 1].pid || xs[i].tid != xs[i - 1].tid)) depth = 0;
        while (depth && xs[i].ts >= stack[depth - 1]->ts + stack[depth - 1]->dur - eps) --depth;
        if (depth) {
            const xevent *p = stack[depth - 1];
            CHECK_MSG(xs[i].ts + xs[i].dur <= p->ts + p->dur + eps,
                      "'%s' [%g, %g] straddles the end of '%s' [%g, %g] (pid %d tid %d)", xs[i].name, xs[i].ts,
                      xs[i].ts + xs[i].dur, p->name, p->ts, p->ts + p->dur, xs[i].pid, xs[i].tid);
        }
        if (depth < 256) stack[depth++] = &xs[i];
    }
    free(xs);
    cJSON_Delete(root);
    return nx;
}

static void *side_thread(void *p) {
    fp_context *ctx = p;
    for (int i = 0; i < 20; ++i) {
        uint64_t h = 0;
        if (fp_trace_begin(ctx, NULL, "side_op", "op", 64, 0, &h) != FP_OK) return p;
        usleep(50);
        if (fp_trace_end(ctx, h) != FP_OK) return p;
    }
    return NULL;
}

/* A traced CPU "model": steps of forward / backward ranges with ops inside,
 * a collective, and a second thread's ops. */
static void workload(fp_context *ctx) {
    pthread_t th;
    CHECK(pthread_create(&th, NULL, side_thread, ctx) == 0);
    const char *modules[3] = {"embed", "encoder", "head"};
    for (int step = 0; step < 3; ++step) {
        for (int st = 0; st < 2; ++st) {
            CHECK_OK(fp_trace_push(ctx, NULL, st ? "backward" : "forward"));
            for (int m = 0; m < 3; ++m) {
                CHECK_OK(fp_trace_push(ctx, modules[m], NULL));
                for (int k = 0; k < 2; ++k) {
                    uint64_t h = 0;
                    CHECK_OK(fp_trace_begin(ctx, NULL, k ? "gemm" : "norm", "op", 1024, 4096, &h));
                    usleep(20);
                    CHECK_OK(fp_trace_end(ctx, h));
                }
                CHECK_OK(fp_trace_pop(ctx));
            }
            CHECK_OK(fp_trace_pop(ctx));
        }
        uint64_t c = 0;
        CHECK_OK(fp_trace_begin_collective(ctx, NULL, "allreduce", 1 << 20, 4, &c));
        CHECK_OK(fp_trace_end(ctx, c));
        CHECK_OK(fp_trace_step(ctx, NULL));
    }
    void *r = NULL;
    pthread_join(th, &r);
    CHECK(r == NULL);
}

int main(void) {
    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    CHECK_OK(fp_trace_enable(ctx, 4096));
    workload(ctx);
    /* a span with known times on a CUDA-like (device, stream): exact values back */
    fp_trace_span known;
    CHECK_OK(fp_trace_span_init(&known));
    strcpy(known.name, "known");
    strcpy(known.category, "op");
    known.device = 0;
    known.stream = 0x1234;
    size_t nspans = 0;
    CHECK_OK(fp_trace_read(ctx, NULL, 0, &nspans, 0));
    fp_trace_span *all = malloc(nspans * sizeof *all);
    CHECK_OK(fp_trace_read(ctx, all, nspans, &nspans, 0));
    double origin = all[0].start_s;
    for (size_t i = 0; i < nspans; ++i) origin = all[i].start_s < origin ? all[i].start_s : origin;
    free(all);
    known.start_s = origin + 0.5;
    known.end_s = origin + 0.75;
    known.bytes = 2048;
    CHECK_OK(fp_trace_record(ctx, &known));
    ++nspans;

    char dir[] = "/tmp/fp_trace_chrome_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    CHECK_OK(fp_trace_export_chrome(ctx, path));
    char *text = slurp(path);
    CHECK(text != NULL);
    if (text) {
        int named = 0;
        int nx = validate(text, &named);
        CHECK_MSG(nx == (int)nspans, "%d complete events for %zu spans", nx, nspans);
        CHECK_MSG(named == 3, "%d threads named (main, side, the known span's stream)", named);
        /* the known span's exact values */
        cJSON *root = cJSON_Parse(text);
        cJSON *e;
        int seen = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "traceEvents")) {
            cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (!cJSON_IsString(name) || strcmp(name->valuestring, "known")) continue;
            seen = 1;
            CHECK_NEAR(cJSON_GetObjectItemCaseSensitive(e, "ts")->valuedouble, 0.5e6, 1e-3);
            CHECK_NEAR(cJSON_GetObjectItemCaseSensitive(e, "dur")->valuedouble, 0.25e6, 1e-3);
            CHECK(cJSON_GetObjectItemCaseSensitive(e, "pid")->valueint == 0);
            cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
            CHECK(cJSON_GetObjectItemCaseSensitive(args, "bytes")->valuedouble == 2048);
        }
        CHECK(seen);
        /* CPU spans carry the CPU's pid; tags are in args */
        int tagged = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "traceEvents")) {
            cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (strcmp(name->valuestring, "gemm")) continue;
            CHECK(cJSON_GetObjectItemCaseSensitive(e, "pid")->valueint == FP_TRACE_CPU_PID);
            cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
            cJSON *module = cJSON_GetObjectItemCaseSensitive(args, "module");
            cJSON *stage = cJSON_GetObjectItemCaseSensitive(args, "stage");
            tagged += cJSON_IsString(module) && cJSON_IsString(stage);
        }
        CHECK_MSG(tagged == 18, "%d gemm events with module and stage (3 steps x 2 stages x 3 modules)", tagged);
        cJSON_Delete(root);
        free(text);
    }
    /* an overwrite is atomic: a failed export leaves the old file intact */
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    off_t old_size = sb.st_size;
    CHECK_OK(fp_trace_export_chrome(ctx, path)); /* same content again */
    CHECK(stat(path, &sb) == 0 && sb.st_size == old_size);
    if (chmod(dir, 0500) == 0 && access(dir, W_OK) != 0) {
        CHECK_STATUS(fp_trace_export_chrome(ctx, path), FP_ERR_IO);
        CHECK(stat(path, &sb) == 0 && sb.st_size == old_size);
    }
    chmod(dir, 0700);
    /* an empty ring exports a valid document with no events */
    fp_context *empty;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &empty));
    char path2[160];
    snprintf(path2, sizeof path2, "%s/empty.json", dir);
    CHECK_OK(fp_trace_export_chrome(empty, path2));
    text = slurp(path2);
    int named = -1;
    CHECK(text && validate(text, &named) == 0 && named == 0);
    free(text);
    fp_context_destroy(empty);
    unlink(path2);
    unlink(path);
    rmdir(dir);
    fp_context_destroy(ctx);
    TEST_END();
}
