/* Structured fuzz of the core (core.h) and timing (timing.h) APIs on CPU
 * contexts, public headers only: statuses, dtypes and conversions, contexts
 * and their options (a CUDA context without a device must fail cleanly with
 * FP_ERR_NO_DEVICE), memory helpers, statistics, comparisons, fp_time and
 * fp_ab_run with callables that fail (also with a status outside the enum),
 * each call checked as fuzz_util.h says (status, message naming the broken
 * argument, outputs untouched on error). Usage: test_fuzz_core [seed]
 * [iterations]. */
#include <limits.h>

#include "fuzz_util.h"

typedef struct cz {
    fz_run run;
    uint64_t rng;
    fp_context *ctx;
} cz;

static void statuses_and_dtypes(cz *z) {
    for (int v = -3; v < 40; ++v) {
        const char *s = fp_status_string((fp_status)v);
        CHECK(s != NULL && *s);
        if (v < 0 || v > FP_ERR_INTERNAL) CHECK(strcmp(s, "unknown status") == 0);
        const fp_dtype d = (fp_dtype)v;
        CHECK(fp_dtype_name(d) != NULL);
        if (v < 0 || v > FP_FP8_E5M2) CHECK(fp_dtype_size(d) == 0 && strcmp(fp_dtype_name(d), "unknown") == 0);
    }
    const char *names[] = {"f32", "F16", "bfloat16", "half", "", "f64", "int8", "f32 ", "fp8e4m3", "x"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
        fp_dtype out = (fp_dtype)77;
        fp_status st = fp_dtype_parse(names[i], &out);
        FZ_CHECK_CALL(&z->run, "fp_dtype_parse", st, -2, NULL);
        if (st != FP_OK) CHECK(out == (fp_dtype)77);
    }
    fp_dtype out = (fp_dtype)77;
    FZ_CHECK_CALL(&z->run, "fp_dtype_parse(NULL)", fp_dtype_parse(NULL, &out), FP_ERR_INVALID_ARGUMENT, "name");
    FZ_CHECK_CALL(&z->run, "fp_dtype_parse(out NULL)", fp_dtype_parse("f32", NULL), FP_ERR_INVALID_ARGUMENT, "out");
    CHECK(out == (fp_dtype)77);
}

/* fp_convert_host: random valid conversions against the scalar ones, and
 * broken ones leaving dst untouched. */
static void conversions(cz *z) {
    uint64_t *s = &z->rng;
    const fp_dtype sd = (fp_dtype)fz_range(s, 0, 2), dd = (fp_dtype)fz_range(s, 0, 2);
    const size_t n = (size_t)fz_range(s, 0, 300);
    fz_buf src = fz_buf_new(n * fp_dtype_size(sd), (size_t)fz_range(s, 0, 8) * fp_dtype_size(sd));
    fz_buf dst = fz_buf_new(n * fp_dtype_size(dd), (size_t)fz_range(s, 0, 8) * fp_dtype_size(dd));
    fz_fill(src.data, sd, n, s, -70000.0, 70000.0);
    if (n && fz_chance(s, 1, 4)) fz_store(src.data, sd, 0, NAN);
    fz_buf_snapshot(&src);
    const int broken = fz_chance(s, 1, 2);
    fp_clear_error();
    if (!broken) {
        FZ_CHECK_CALL(&z->run, "fp_convert_host", fp_convert_host(src.data, sd, dst.data, dd, n), FP_OK, NULL);
        for (size_t i = 0; i < n; ++i) {
            const float want = fz_round(dd, fz_load(src.shadow, sd, i)), got = fz_load(dst.data, dd, i);
            if (!(want == got || (isnan(want) && isnan(got)))) {
                fprintf(stderr, "seed %llu iter %ld: convert %s -> %s [%zu]: %g, want %g\n", (unsigned long long)z->run.seed,
                        z->run.iter, fp_dtype_name(sd), fp_dtype_name(dd), i, got, want);
                fp_test_failures++;
                break;
            }
        }
        FZ_CHECK_BUF(&z->run, "convert dst", &dst, 0);
    } else {
        const void *sp = src.data;
        void *dp = dst.data;
        fp_dtype a = sd, b = dd;
        size_t nn = n;
        const char *name;
        switch (fz_range(s, 0, 4)) {
        case 0: sp = NULL; name = "src"; break;
        case 1: dp = NULL; name = "dst"; break;
        case 2: a = fz_chance(s, 1, 2) ? FP_FP8_E4M3 : (fp_dtype)-1; name = "src_dtype"; break;
        case 3: b = fz_chance(s, 1, 2) ? FP_FP8_E5M2 : (fp_dtype)9; name = "dst_dtype"; break;
        default: nn = SIZE_MAX / (size_t)fz_range(s, 1, 3); name = "'n'"; break;
        }
        FZ_CHECK_CALL(&z->run, "fp_convert_host (one bad argument)", fp_convert_host(sp, a, dp, b, nn),
                      FP_ERR_INVALID_ARGUMENT, name);
        FZ_CHECK_BUF(&z->run, "convert dst (failed)", &dst, 1);
    }
    FZ_CHECK_BUF(&z->run, "convert src", &src, 1);
    fz_buf_free(&src);
    fz_buf_free(&dst);
}

static void contexts(cz *z) {
    fp_context *c = (fp_context *)(uintptr_t)0x77;
    FZ_CHECK_CALL(&z->run, "fp_context_create(bad kind)", fp_context_create((fp_device_kind)2, 0, &c),
                  FP_ERR_INVALID_ARGUMENT, "kind");
    FZ_CHECK_CALL(&z->run, "fp_context_create(kind -1)", fp_context_create((fp_device_kind)-1, 0, &c),
                  FP_ERR_INVALID_ARGUMENT, "kind");
    FZ_CHECK_CALL(&z->run, "fp_context_create(NULL out)", fp_context_create(FP_DEVICE_CPU, 0, NULL),
                  FP_ERR_INVALID_ARGUMENT, "out");
    CHECK(c == (fp_context *)(uintptr_t)0x77);
    int count = -1;
    FZ_CHECK_CALL(&z->run, "fp_device_count", fp_device_count(&count), FP_OK, NULL);
    FZ_CHECK_CALL(&z->run, "fp_device_count(NULL)", fp_device_count(NULL), FP_ERR_INVALID_ARGUMENT, "count");
    const int idx[] = {0, -1, 1, 64, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; ++i) {
        fp_context *cc = (fp_context *)(uintptr_t)0x77;
        fp_status st = fp_context_create(FP_DEVICE_CUDA, idx[i], &cc);
        if (idx[i] >= 0 && idx[i] < count) {
            /* a GPU machine: a device that exists works (or the ASan build's
             * kernels are missing, which only ops notice) */
            if (FZ_CHECK_CALL(&z->run, "fp_context_create(CUDA, existing)", st, -2, NULL) == FP_OK) fp_context_destroy(cc);
            continue;
        }
        FZ_CHECK_CALL(&z->run, "fp_context_create(CUDA, no such device)", st, FP_ERR_NO_DEVICE, NULL);
        CHECK(cc == (fp_context *)(uintptr_t)0x77);
        fp_device_info info;
        fp_device_info_init(&info);
        strcpy(info.name, "untouched");
        FZ_CHECK_CALL(&z->run, "fp_device_get_info(no such device)", fp_device_get_info(idx[i], &info), FP_ERR_NO_DEVICE, NULL);
        CHECK(strcmp(info.name, "untouched") == 0);
    }
    FZ_CHECK_CALL(&z->run, "fp_device_get_info(NULL)", fp_device_get_info(0, NULL), FP_ERR_INVALID_ARGUMENT, "info");
    FZ_CHECK_CALL(&z->run, "fp_cpu_get_info(NULL)", fp_cpu_get_info(NULL), FP_ERR_INVALID_ARGUMENT, "info");
    fp_device_info ci;
    fp_device_info_init(&ci);
    FZ_CHECK_CALL(&z->run, "fp_cpu_get_info", fp_cpu_get_info(&ci), FP_OK, NULL);
    CHECK(ci.kind == FP_DEVICE_CPU && ci.sm_count >= 1);
    fp_cuda_versions(NULL, NULL);
    fp_device_info_init(NULL);
    fp_context_destroy(NULL);
    CHECK(fp_context_kind(NULL) == FP_DEVICE_CPU && fp_context_device_index(NULL) == -1 && fp_context_stream(NULL) == NULL);
    FZ_CHECK_CALL(&z->run, "fp_context_device_info(NULL)", fp_context_device_info(NULL, &ci), FP_ERR_INVALID_ARGUMENT, "ctx");
    FZ_CHECK_CALL(&z->run, "fp_context_device_info(info NULL)", fp_context_device_info(z->ctx, NULL), FP_ERR_INVALID_ARGUMENT, "info");
    FZ_CHECK_CALL(&z->run, "fp_context_synchronize(NULL)", fp_context_synchronize(NULL, NULL), FP_ERR_INVALID_ARGUMENT, "ctx");
    FZ_CHECK_CALL(&z->run, "fp_context_synchronize(CPU)", fp_context_synchronize(z->ctx, NULL), FP_OK, NULL);
}

static void options(cz *z) {
    uint64_t *s = &z->rng;
    struct { fp_context_option opt; int64_t value; const char *name; } bad[] = {
        {(fp_context_option)0, 1, "option"},      {(fp_context_option)99, 1, "option"},
        {(fp_context_option)-1, 0, "option"},     {FP_CTX_CPU_THREADS, -1, "FP_CTX_CPU_THREADS"},
        {FP_CTX_CPU_THREADS, 4097, "FP_CTX_CPU_THREADS"}, {FP_CTX_CPU_THREADS, INT64_MIN, "FP_CTX_CPU_THREADS"},
        {FP_CTX_WORKSPACE_BYTES, -1, "FP_CTX_WORKSPACE_BYTES"}, {FP_CTX_ATTENTION_KERNEL, 11, "FP_CTX_ATTENTION_KERNEL"},
        {FP_CTX_ATTENTION_KERNEL, -1, "FP_CTX_ATTENTION_KERNEL"}, {FP_CTX_SCRATCH_KEEP_BYTES, -2, "FP_CTX_SCRATCH_KEEP_BYTES"},
    };
    const int k = (int)fz_range(s, 0, (int64_t)(sizeof bad / sizeof bad[0]) - 1);
    FZ_CHECK_CALL(&z->run, "fp_context_set_option (bad)", fp_context_set_option(z->ctx, bad[k].opt, bad[k].value),
                  FP_ERR_INVALID_ARGUMENT, bad[k].name);
    FZ_CHECK_CALL(&z->run, "fp_context_set_option(NULL)", fp_context_set_option(NULL, FP_CTX_CPU_THREADS, 1),
                  FP_ERR_INVALID_ARGUMENT, "ctx");
    /* valid values: CPU contexts accept (and ignore) the CUDA ones */
    switch (fz_range(s, 0, 3)) {
    case 0: FZ_CHECK_CALL(&z->run, "FP_CTX_CPU_THREADS", fp_context_set_option(z->ctx, FP_CTX_CPU_THREADS, fz_range(s, 0, 3)), FP_OK, NULL); break;
    case 1: FZ_CHECK_CALL(&z->run, "FP_CTX_WORKSPACE_BYTES", fp_context_set_option(z->ctx, FP_CTX_WORKSPACE_BYTES, fz_range(s, 0, 1 << 30)), FP_OK, NULL); break;
    case 2: FZ_CHECK_CALL(&z->run, "FP_CTX_ATTENTION_KERNEL", fp_context_set_option(z->ctx, FP_CTX_ATTENTION_KERNEL, fz_range(s, 0, 10)), FP_OK, NULL); break;
    default: FZ_CHECK_CALL(&z->run, "FP_CTX_SCRATCH_KEEP_BYTES", fp_context_set_option(z->ctx, FP_CTX_SCRATCH_KEEP_BYTES, fz_range(s, -1, 1 << 30)), FP_OK, NULL); break;
    }
}

static void memory(cz *z) {
    uint64_t *s = &z->rng;
    void *p = (void *)(uintptr_t)0x77;
    FZ_CHECK_CALL(&z->run, "fp_mem_alloc(0)", fp_mem_alloc(z->ctx, 0, &p), FP_ERR_INVALID_ARGUMENT, "bytes");
    FZ_CHECK_CALL(&z->run, "fp_mem_alloc(SIZE_MAX)", fp_mem_alloc(z->ctx, SIZE_MAX - (size_t)fz_range(s, 0, 200), &p),
                  FP_ERR_INVALID_ARGUMENT, "bytes");
    if (fz_chance(s, 1, 8)) /* (ASan prints a warning for each) */
        FZ_CHECK_CALL(&z->run, "fp_mem_alloc(huge)", fp_mem_alloc(z->ctx, (size_t)1 << fz_range(s, 50, 62), &p),
                      FP_ERR_OUT_OF_MEMORY, NULL);
    FZ_CHECK_CALL(&z->run, "fp_mem_alloc(NULL ctx)", fp_mem_alloc(NULL, 64, &p), FP_ERR_INVALID_ARGUMENT, "ctx");
    FZ_CHECK_CALL(&z->run, "fp_mem_alloc(NULL out)", fp_mem_alloc(z->ctx, 64, NULL), FP_ERR_INVALID_ARGUMENT, "out");
    CHECK(p == (void *)(uintptr_t)0x77);
    const size_t n = (size_t)fz_range(s, 1, 5000);
    FZ_CHECK_CALL(&z->run, "fp_mem_alloc", fp_mem_alloc(z->ctx, n, &p), FP_OK, NULL);
    CHECK((uintptr_t)p % 256 == 0);
    unsigned char *h = malloc(n);
    for (size_t i = 0; i < n; ++i) h[i] = (unsigned char)(i * 13 + 1);
    FZ_CHECK_CALL(&z->run, "fp_mem_upload", fp_mem_upload(z->ctx, p, h, n, NULL), FP_OK, NULL);
    memset(h, 0, n);
    FZ_CHECK_CALL(&z->run, "fp_mem_download", fp_mem_download(z->ctx, h, p, n, NULL), FP_OK, NULL);
    for (size_t i = 0; i < n; ++i)
        if (h[i] != (unsigned char)(i * 13 + 1)) {
            fprintf(stderr, "seed %llu: upload/download byte %zu\n", (unsigned long long)z->run.seed, i);
            fp_test_failures++;
            break;
        }
    FZ_CHECK_CALL(&z->run, "fp_mem_fill", fp_mem_fill(z->ctx, p, 0xAB, n, NULL), FP_OK, NULL);
    CHECK(((unsigned char *)p)[n - 1] == 0xAB);
    FZ_CHECK_CALL(&z->run, "fp_mem_upload(NULL dst)", fp_mem_upload(z->ctx, NULL, h, n, NULL), FP_ERR_INVALID_ARGUMENT, "dst");
    FZ_CHECK_CALL(&z->run, "fp_mem_download(NULL src)", fp_mem_download(z->ctx, h, NULL, n, NULL), FP_ERR_INVALID_ARGUMENT, "src");
    FZ_CHECK_CALL(&z->run, "fp_mem_fill(NULL)", fp_mem_fill(z->ctx, NULL, 0, n, NULL), FP_ERR_INVALID_ARGUMENT, "dst");
    FZ_CHECK_CALL(&z->run, "fp_mem_fill(NULL ctx)", fp_mem_fill(NULL, p, 0, n, NULL), FP_ERR_INVALID_ARGUMENT, "ctx");
    FZ_CHECK_CALL(&z->run, "fp_mem_upload(0 bytes)", fp_mem_upload(z->ctx, p, h, 0, NULL), FP_OK, NULL);
    FZ_CHECK_CALL(&z->run, "fp_mem_free(NULL ptr)", fp_mem_free(z->ctx, NULL), FP_OK, NULL);
    FZ_CHECK_CALL(&z->run, "fp_mem_free(NULL ctx)", fp_mem_free(NULL, p), FP_ERR_INVALID_ARGUMENT, "ctx");
    FZ_CHECK_CALL(&z->run, "fp_mem_free", fp_mem_free(z->ctx, p), FP_OK, NULL);
    free(h);
}

/* ---- timing ---- */

static void stats(cz *z) {
    uint64_t *s = &z->rng;
    const int n = (int)fz_range(s, 1, 200);
    double *v = malloc((size_t)n * sizeof *v);
    for (int i = 0; i < n; ++i) v[i] = fz_uniform(s, 0.0, 10.0);
    const int broken = fz_chance(s, 1, 2);
    fp_stats out, keep;
    memset(&out, 0x5C, sizeof out);
    keep = out;
    if (!broken) {
        if (FZ_CHECK_CALL(&z->run, "fp_stats_compute", fp_stats_compute(v, n, &out), FP_OK, NULL) == FP_OK) {
            double mn = v[0], mx = v[0];
            for (int i = 1; i < n; ++i) { mn = fmin(mn, v[i]); mx = fmax(mx, v[i]); }
            CHECK(out.samples == n && out.min_ms == mn && out.max_ms == mx && out.median_ms >= mn && out.median_ms <= mx &&
                  out.p10_ms <= out.median_ms && out.median_ms <= out.p90_ms && out.stdev_ms >= 0 && isfinite(out.noise));
        }
    } else {
        const double badv[] = {NAN, -1e-9, INFINITY, -INFINITY};
        const double *p = v;
        int nn = n;
        const char *name = NULL;
        switch (fz_range(s, 0, 2)) {
        case 0: p = NULL; name = "samples"; break;
        case 1: nn = fz_chance(s, 1, 2) ? 0 : INT_MIN; name = "'n'"; break;
        default: v[fz_range(s, 0, n - 1)] = badv[fz_range(s, 0, 3)]; break;
        }
        FZ_CHECK_CALL(&z->run, "fp_stats_compute (bad)", fp_stats_compute(p, nn, &out), FP_ERR_INVALID_ARGUMENT, name);
        CHECK(memcmp(&out, &keep, sizeof out) == 0);
    }
    FZ_CHECK_CALL(&z->run, "fp_stats_compute(out NULL)", fp_stats_compute(v, n, NULL), FP_ERR_INVALID_ARGUMENT, "out");
    /* pure helpers on garbage: a valid answer, no crash */
    fp_stats a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    const double odd[] = {0, -1, NAN, INFINITY, 1e-300, 5};
    a.median_ms = odd[fz_range(s, 0, 5)];
    b.median_ms = odd[fz_range(s, 0, 5)];
    a.noise = odd[fz_range(s, 0, 5)];
    a.samples = (int)fz_range(s, -3, 10);
    double sp = 0;
    const fp_verdict vd = fp_verdict_decide(fz_chance(s, 1, 5) ? NULL : &a, &b, odd[fz_range(s, 0, 5)], fz_chance(s, 1, 2) ? &sp : NULL);
    CHECK(vd == FP_VERDICT_SAME || vd == FP_VERDICT_FASTER || vd == FP_VERDICT_SLOWER);
    CHECK(fp_verdict_string(vd) != NULL && fp_verdict_string((fp_verdict)9) != NULL);
    fp_ab_report rep;
    fp_roofline(fz_chance(s, 1, 2) ? NULL : &(fp_device_info){0}, odd[fz_range(s, 0, 5)], odd[fz_range(s, 0, 5)],
                odd[fz_range(s, 0, 5)], 1, &rep);
    fp_roofline(NULL, 1, 1, 1, 0, NULL);
    free(v);
}

static void compare(cz *z) {
    uint64_t *s = &z->rng;
    const fp_dtype dt = (fp_dtype)fz_range(s, 0, 2);
    const size_t n = (size_t)fz_range(s, 0, 100);
    fz_buf ref = fz_buf_new(n * fp_dtype_size(dt), 0), got = fz_buf_new(n * fp_dtype_size(dt), 0);
    fz_fill(ref.data, dt, n, s, -4, 4);
    memcpy(got.data, ref.data, ref.bytes);
    size_t bad_at = SIZE_MAX;
    if (n && fz_chance(s, 1, 2)) {
        bad_at = (size_t)fz_range(s, 0, (int64_t)n - 1);
        fz_store(got.data, dt, bad_at, fz_chance(s, 1, 2) ? NAN : fz_load(ref.data, dt, bad_at) + 1.0f);
    }
    fp_compare_result r;
    FZ_CHECK_CALL(&z->run, "fp_compare_host", fp_compare_host(ref.data, got.data, n, dt, -1, -1, &r), FP_OK, NULL);
    CHECK(r.count == n && r.passed == (bad_at == SIZE_MAX) && r.first_bad == bad_at && r.mismatches == (bad_at != SIZE_MAX));
    FZ_CHECK_CALL(&z->run, "fp_compare(CPU)", fp_compare(z->ctx, ref.data, got.data, n, dt, -1, -1, &r), FP_OK, NULL);
    CHECK(r.passed == (bad_at == SIZE_MAX));
    fp_compare_result keep;
    memset(&r, 0x4D, sizeof r);
    keep = r;
    FZ_CHECK_CALL(&z->run, "fp_compare_host(bad dtype)", fp_compare_host(ref.data, got.data, n, FP_FP8_E4M3, -1, -1, &r),
                  FP_ERR_INVALID_ARGUMENT, "dtype");
    FZ_CHECK_CALL(&z->run, "fp_compare_host(NULL)", fp_compare_host(NULL, got.data, n, dt, -1, -1, &r), FP_ERR_INVALID_ARGUMENT, "ref");
    FZ_CHECK_CALL(&z->run, "fp_compare(bad dtype)", fp_compare(z->ctx, ref.data, got.data, n, (fp_dtype)-3, -1, -1, &r),
                  FP_ERR_INVALID_ARGUMENT, "dtype");
    CHECK(memcmp(&r, &keep, sizeof r) == 0);
    FZ_CHECK_BUF(&z->run, "compare ref", &ref, 0);
    fz_buf_free(&ref);
    fz_buf_free(&got);
}

/* Callables for fp_time / fp_ab_run. A caller's callable cannot set a
 * detail message; it may even return a value outside fp_status. */
typedef struct timed { int calls, fail_at; int status; } timed;
static fp_status timed_fn(void *user, fp_stream stream) {
    timed *t = user;
    if (++t->calls >= t->fail_at) return (fp_status)t->status;
    return FP_OK;
}

static void timing(cz *z) {
    uint64_t *s = &z->rng;
    fp_timing_config cfg;
    fp_timing_config_default(&cfg);
    cfg.warmup = (int)fz_range(s, 0, 2);
    cfg.min_samples = (int)fz_range(s, 1, 4);
    cfg.max_samples = cfg.min_samples + (int)fz_range(s, 0, 4);
    cfg.max_time_s = 0.02;
    cfg.min_sample_ms = 0.0;
    const int statuses[] = {FP_ERR_MISMATCH, FP_ERR_CUDA, FP_ERR_OUT_OF_MEMORY, 42, -7};
    timed t = {0, (int)fz_range(s, 1, 8), statuses[fz_range(s, 0, 4)]};
    fp_stats out, keep;
    memset(&out, 0x6B, sizeof out);
    keep = out;
    fp_clear_error();
    fp_status st = fp_time(z->ctx, NULL, timed_fn, &t, &cfg, &out);
    if (t.calls >= t.fail_at) {
        FZ_CHECK_CALL(&z->run, "fp_time (callable fails)", st, -1, NULL);
        if (t.status >= 0 && t.status <= FP_ERR_INTERNAL) CHECK(st == (fp_status)t.status);
        CHECK(memcmp(&out, &keep, sizeof out) == 0);
    } else {
        FZ_CHECK_CALL(&z->run, "fp_time", st, FP_OK, NULL);
    }
    /* broken configurations */
    fp_timing_config bad = cfg;
    const char *name;
    switch (fz_range(s, 0, 7)) {
    case 0: bad.struct_size = 0; name = "struct_size"; break;
    case 1: bad.warmup = -1; name = "warmup"; break;
    case 2: bad.min_samples = 0; name = "min_samples"; break;
    case 3: bad.max_samples = bad.min_samples - 1; name = "max_samples"; break;
    case 4: bad.max_time_s = fz_chance(s, 1, 2) ? NAN : -1; name = "max_time_s"; break;
    case 5: bad.target_noise = -0.5; name = "target_noise"; break;
    case 6: bad.min_sample_ms = INFINITY; name = "min_sample_ms"; break;
    default: bad.use_graph = 2; name = "use_graph"; break;
    }
    timed ok = {0, INT_MAX, 0};
    keep = out;
    FZ_CHECK_CALL(&z->run, "fp_time (bad config)", fp_time(z->ctx, NULL, timed_fn, &ok, &bad, &out), FP_ERR_INVALID_ARGUMENT, name);
    CHECK(ok.calls == 0 && memcmp(&out, &keep, sizeof out) == 0);
    FZ_CHECK_CALL(&z->run, "fp_time(NULL fn)", fp_time(z->ctx, NULL, NULL, NULL, &cfg, &out), FP_ERR_INVALID_ARGUMENT, "fn");
    FZ_CHECK_CALL(&z->run, "fp_time(NULL ctx)", fp_time(NULL, NULL, timed_fn, &ok, &cfg, &out), FP_ERR_INVALID_ARGUMENT, "ctx");
    /* fp_ab_run */
    fp_ab_spec spec;
    fp_ab_spec_init(&spec);
    timed ta = {0, INT_MAX, 0}, tb = {0, (int)fz_range(s, 1, 12), statuses[fz_range(s, 0, 4)]};
    spec.baseline = timed_fn;
    spec.baseline_user = &ta;
    spec.optimized = timed_fn;
    spec.optimized_user = &tb;
    fp_ab_report rep, rkeep;
    memset(&rep, 0x2E, sizeof rep);
    rkeep = rep;
    st = fp_ab_run(z->ctx, NULL, &spec, &cfg, &rep);
    if (tb.calls >= tb.fail_at) {
        FZ_CHECK_CALL(&z->run, "fp_ab_run (callable fails)", st, -1, NULL);
        CHECK(memcmp(&rep, &rkeep, sizeof rep) == 0);
    } else {
        FZ_CHECK_CALL(&z->run, "fp_ab_run", st, FP_OK, NULL);
    }
    fp_ab_spec bs = spec;
    switch (fz_range(s, 0, 2)) {
    case 0: bs.struct_size = sizeof bs + 8; name = "struct_size"; break;
    case 1: bs.optimized = NULL; name = "optimized"; break;
    default: bs.baseline_out = &ta; name = "baseline_out"; break;
    }
    FZ_CHECK_CALL(&z->run, "fp_ab_run (bad spec)", fp_ab_run(z->ctx, NULL, &bs, &cfg, &rep), FP_ERR_INVALID_ARGUMENT, name);
    FZ_CHECK_CALL(&z->run, "fp_ab_run(NULL spec)", fp_ab_run(z->ctx, NULL, NULL, &cfg, &rep), FP_ERR_INVALID_ARGUMENT, "spec");
    CHECK(memcmp(&rep, &rkeep, sizeof rep) == 0 || tb.calls < tb.fail_at);
    double gbps = -1;
    FZ_CHECK_CALL(&z->run, "fp_measure_copy_bandwidth(NULL)", fp_measure_copy_bandwidth(z->ctx, 4096, NULL),
                  FP_ERR_INVALID_ARGUMENT, "gbps");
    if (fz_chance(s, 1, 20))
        FZ_CHECK_CALL(&z->run, "fp_measure_copy_bandwidth", fp_measure_copy_bandwidth(z->ctx, (size_t)fz_range(s, 1, 1 << 16), &gbps),
                      FP_OK, NULL);
}

int main(int argc, char **argv) {
    cz z;
    memset(&z, 0, sizeof z);
    z.run = fz_run_init(argc, argv, 0x636f7265ULL, 400, 4.0);
    z.rng = z.run.seed * 0x9E3779B97F4A7C15ULL + 19;
    if (fp_context_create(FP_DEVICE_CPU, -1, &z.ctx) != FP_OK) {
        fprintf(stderr, "CPU context: %s\n", fp_last_error());
        return 1;
    }
    statuses_and_dtypes(&z);
    contexts(&z);
    for (; fz_more(&z.run) && !fz_too_many_failures(); ++z.run.iter) {
        switch (fz_range(&z.rng, 0, 5)) {
        case 0: conversions(&z); break;
        case 1: options(&z); break;
        case 2: memory(&z); break;
        case 3: stats(&z); break;
        case 4: compare(&z); break;
        default: timing(&z); break;
        }
    }
    printf("core fuzz: %ld iterations\n", z.run.iter);
    fp_context_destroy(z.ctx);
    TEST_END();
}
