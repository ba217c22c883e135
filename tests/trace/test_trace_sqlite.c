/* The SQLite export (fp_trace_export_sqlite, fp_trace_sqlite_add_run): a
 * synthetic workload of known durations (spans recorded with explicit
 * times), the database attached as `python` in a fresh connection, and
 * profiling-guide queries written against python.torch_trace /
 * python.nccl_trace / python.runs answered exactly: each module's share over
 * the last 10 steps with window functions, CASE-pivoted per-step stage sums,
 * collectives' algbw / busbw, A/B runs across commits. Bad input: unwritable
 * paths and a file that is not a database, left as it was. */
#include <sqlite3.h>
#include <string.h>
#include <unistd.h>

#include "fp_test.h"

enum { STEPS = 15, MODULES = 3 };
static const char *const module_names[MODULES] = {"embed", "encoder", "decoder"};

/* Forward time of module m at step s (seconds); backward takes twice as long. */
static double fwd_s(int m, int s) { return (m + 1) * 1e-3 + s * 1e-5; }

static void record(fp_context *ctx, const char *name, const char *cat, const char *module, const char *stage,
                   int step, double start, double dur, double bytes, int nranks) {
    fp_trace_span sp;
    CHECK_OK(fp_trace_span_init(&sp));
    snprintf(sp.name, sizeof sp.name, "%s", name);
    snprintf(sp.category, sizeof sp.category, "%s", cat);
    snprintf(sp.module, sizeof sp.module, "%s", module ? module : "");
    snprintf(sp.stage, sizeof sp.stage, "%s", stage ? stage : "");
    sp.step = step;
    sp.start_s = start;
    sp.end_s = start + dur;
    sp.bytes = bytes;
    sp.nranks = nranks;
    sp.allocated_bytes = (double)(step + 1) * 1048576.0;
    CHECK_OK(fp_trace_record(ctx, &sp));
}

/* Per step: a forward and a backward range per module, then an all-reduce
 * of 1e8 bytes over 4 ranks taking 10 ms outside any range. */
static void synthetic_workload(fp_context *ctx) {
    double t = 100.0;
    for (int s = 0; s < STEPS; ++s) {
        for (int m = 0; m < MODULES; ++m) {
            record(ctx, module_names[m], "range", module_names[m], "forward", s, t, fwd_s(m, s), 0, 0);
            t += fwd_s(m, s);
        }
        for (int m = MODULES - 1; m >= 0; --m) {
            record(ctx, module_names[m], "range", module_names[m], "backward", s, t, 2 * fwd_s(m, s), 0, 0);
            t += 2 * fwd_s(m, s);
        }
        record(ctx, "allreduce", "collective", NULL, NULL, s, t, 0.010, 1e8, 4);
        t += 0.010;
    }
    /* one all-gather without a rank count: busbw = algbw */
    record(ctx, "all_gather", "collective", NULL, NULL, STEPS - 1, t, 0.004, 2e7, 0);
}

static sqlite3 *attach(const char *path) {
    sqlite3 *db = NULL;
    CHECK(sqlite3_open(":memory:", &db) == SQLITE_OK);
    char sql[256];
    snprintf(sql, sizeof sql, "ATTACH DATABASE '%s' AS python", path);
    char *err = NULL;
    CHECK_MSG(sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK, "%s", err ? err : "");
    sqlite3_free(err);
    return db;
}

static sqlite3_stmt *query(sqlite3 *db, const char *sql) {
    sqlite3_stmt *st = NULL;
    CHECK_MSG(sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK, "%s\n  in: %s", sqlite3_errmsg(db), sql);
    return st;
}

static void test_module_share(sqlite3 *db) {
    /* as a profiling guide writes it: each module's share of the last 10 steps */
    sqlite3_stmt *q = query(db,
                            "SELECT module, SUM(duration) AS t, SUM(SUM(duration)) OVER () AS total,"
                            " 100.0 * SUM(duration) / SUM(SUM(duration)) OVER () AS pct"
                            " FROM python.torch_trace"
                            " WHERE step > (SELECT MAX(step) FROM python.torch_trace) - 10"
                            " GROUP BY module ORDER BY t DESC");
    if (!q) return;
    /* expected: steps 5..14; each module 3 * fwd per step; the collectives
     * (module NULL) 10 x 10 ms + the all-gather's 4 ms */
    double want[MODULES + 1], total = 0;
    for (int m = 0; m < MODULES; ++m) {
        want[m] = 0;
        for (int s = STEPS - 10; s < STEPS; ++s) want[m] += 3 * fwd_s(m, s);
        total += want[m];
    }
    want[MODULES] = 10 * 0.010 + 0.004;
    total += want[MODULES];
    /* order by t DESC: NULL (0.104), decoder, encoder, embed */
    const int order[MODULES + 1] = {MODULES, 2, 1, 0};
    int row = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        CHECK(row <= MODULES);
        if (row > MODULES) break;
        int m = order[row];
        const unsigned char *name = sqlite3_column_text(q, 0);
        if (m == MODULES) CHECK_MSG(name == NULL, "row %d module '%s', expected NULL", row, name);
        else CHECK_MSG(name && !strcmp((const char *)name, module_names[m]), "row %d module '%s', expected '%s'",
                       row, name ? (const char *)name : "NULL", module_names[m]);
        CHECK_NEAR(sqlite3_column_double(q, 1), want[m], 1e-12);
        CHECK_NEAR(sqlite3_column_double(q, 2), total, 1e-12);
        CHECK_NEAR(sqlite3_column_double(q, 3), 100.0 * want[m] / total, 1e-9);
        ++row;
    }
    CHECK_MSG(row == MODULES + 1, "%d rows", row);
    sqlite3_finalize(q);
}

static void test_stage_pivot(sqlite3 *db) {
    sqlite3_stmt *q = query(db,
                            "SELECT step,"
                            " SUM(CASE WHEN stage = 'forward' THEN duration ELSE 0 END) AS fwd,"
                            " SUM(CASE WHEN stage = 'backward' THEN duration ELSE 0 END) AS bwd,"
                            " SUM(CASE WHEN category = 'collective' THEN duration ELSE 0 END) AS comm"
                            " FROM python.torch_trace GROUP BY step ORDER BY step");
    if (!q) return;
    int row = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        int s = sqlite3_column_int(q, 0);
        CHECK(s == row);
        double fwd = 0;
        for (int m = 0; m < MODULES; ++m) fwd += fwd_s(m, s);
        CHECK_NEAR(sqlite3_column_double(q, 1), fwd, 1e-12);
        CHECK_NEAR(sqlite3_column_double(q, 2), 2 * fwd, 1e-12);
        CHECK_NEAR(sqlite3_column_double(q, 3), s == STEPS - 1 ? 0.014 : 0.010, 1e-12);
        ++row;
    }
    CHECK_MSG(row == STEPS, "%d rows", row);
    sqlite3_finalize(q);

    /* the other columns of one row, exactly */
    q = query(db, "SELECT name, category, bytes, flops, allocated, device, stream, start, depth"
                  " FROM python.torch_trace WHERE step = 2 AND module = 'encoder' AND stage = 'backward'");
    if (!q) return;
    CHECK(sqlite3_step(q) == SQLITE_ROW);
    CHECK(!strcmp((const char *)sqlite3_column_text(q, 0), "encoder"));
    CHECK(!strcmp((const char *)sqlite3_column_text(q, 1), "range"));
    CHECK(sqlite3_column_double(q, 2) == 0 && sqlite3_column_double(q, 3) == 0);
    CHECK(sqlite3_column_double(q, 4) == 3.0); /* (step + 1) MB */
    CHECK(sqlite3_column_int(q, 5) == -1 && sqlite3_column_int(q, 6) == 1 && sqlite3_column_int(q, 8) == 0);
    double start = 0; /* steps 0 and 1 whole, step 2's forwards and the decoder's backward */
    for (int s = 0; s < 2; ++s)
        for (int m = 0; m < MODULES; ++m) start += 3 * fwd_s(m, s);
    start += 2 * 0.010;
    for (int m = 0; m < MODULES; ++m) start += fwd_s(m, 2);
    start += 2 * fwd_s(2, 2);
    CHECK_NEAR(sqlite3_column_double(q, 7), start, 1e-9);
    CHECK(sqlite3_step(q) == SQLITE_DONE);
    sqlite3_finalize(q);
}

static void test_collectives(sqlite3 *db) {
    sqlite3_stmt *q = query(db, "SELECT operation, COUNT(*), SUM(bytes), AVG(duration), AVG(algbw), AVG(busbw),"
                                " MAX(nranks) FROM python.nccl_trace GROUP BY operation ORDER BY operation");
    if (!q) return;
    CHECK(sqlite3_step(q) == SQLITE_ROW);
    CHECK(!strcmp((const char *)sqlite3_column_text(q, 0), "all_gather"));
    CHECK(sqlite3_column_int(q, 1) == 1);
    CHECK_NEAR(sqlite3_column_double(q, 3), 4.0, 1e-9);            /* ms */
    CHECK_NEAR(sqlite3_column_double(q, 4), 2e7 / 0.004 / 1e9, 1e-9); /* 5 GB/s */
    CHECK_NEAR(sqlite3_column_double(q, 5), 2e7 / 0.004 / 1e9, 1e-9); /* no rank count: = algbw */
    CHECK(sqlite3_column_type(q, 6) == SQLITE_NULL);
    CHECK(sqlite3_step(q) == SQLITE_ROW);
    CHECK(!strcmp((const char *)sqlite3_column_text(q, 0), "allreduce"));
    CHECK(sqlite3_column_int(q, 1) == STEPS);
    CHECK_NEAR(sqlite3_column_double(q, 2), STEPS * 1e8, 1e-3);
    CHECK_NEAR(sqlite3_column_double(q, 3), 10.0, 1e-9);
    CHECK_NEAR(sqlite3_column_double(q, 4), 10.0, 1e-9);          /* 1e8 B / 10 ms */
    CHECK_NEAR(sqlite3_column_double(q, 5), 10.0 * 2 * 3 / 4, 1e-9); /* 2(n-1)/n, n = 4 */
    CHECK(sqlite3_column_int(q, 6) == 4);
    CHECK(sqlite3_step(q) == SQLITE_DONE);
    sqlite3_finalize(q);
    /* the collectives' share of each of the last 3 steps, joining both tables */
    q = query(db, "SELECT t.step, SUM(t.duration), (SELECT SUM(n.duration) FROM python.nccl_trace n"
                  " WHERE n.step = t.step) FROM python.torch_trace t"
                  " WHERE t.step > (SELECT MAX(step) FROM python.torch_trace) - 3 GROUP BY t.step ORDER BY t.step");
    if (!q) return;
    for (int s = STEPS - 3; s < STEPS; ++s) {
        CHECK(sqlite3_step(q) == SQLITE_ROW);
        double comm = s == STEPS - 1 ? 0.014 : 0.010, fwd = 0;
        for (int m = 0; m < MODULES; ++m) fwd += fwd_s(m, s);
        CHECK(sqlite3_column_int(q, 0) == s);
        CHECK_NEAR(sqlite3_column_double(q, 1), 3 * fwd + comm, 1e-12);
        CHECK_NEAR(sqlite3_column_double(q, 2), comm * 1e3, 1e-9);
    }
    sqlite3_finalize(q);
}

static fp_ab_report report_of(double base_ms, double opt_ms, fp_verdict v) {
    fp_ab_report r;
    memset(&r, 0, sizeof r);
    r.baseline.median_ms = base_ms;
    r.baseline.p10_ms = base_ms * 0.9;
    r.baseline.p90_ms = base_ms * 1.1;
    r.baseline.samples = 20;
    r.optimized.median_ms = opt_ms;
    r.optimized.p10_ms = opt_ms * 0.9;
    r.optimized.p90_ms = opt_ms * 1.1;
    r.optimized.samples = 30;
    r.speedup = base_ms / opt_ms;
    r.verdict = v;
    r.compared = 1;
    r.agreement.max_abs_err = 1e-3;
    r.agreement.passed = 1;
    r.achieved_gbps = 1500;
    r.pct_of_peak = 45;
    r.bound = "memory";
    return r;
}

static void test_runs(const char *path) {
    fp_ab_report a = report_of(2.0, 1.0, FP_VERDICT_FASTER), b = report_of(2.0, 0.8, FP_VERDICT_FASTER);
    fp_ab_report c = report_of(1.0, 1.0, FP_VERDICT_SAME);
    c.compared = 0;
    c.bound = NULL;
    CHECK_OK(fp_trace_sqlite_add_run(path, "norm/layernorm_fwd", "abc1234", &a));
    CHECK_OK(fp_trace_sqlite_add_run(path, "norm/layernorm_fwd", "def5678", &b));
    CHECK_OK(fp_trace_sqlite_add_run(path, "timing/self_check", NULL, &c));
    sqlite3 *db = attach(path);
    /* compare one scenario across commits */
    sqlite3_stmt *q = query(db, "SELECT git_commit, speedup, optimized_median_ms, verdict, passed, bound"
                                " FROM python.runs WHERE label = 'norm/layernorm_fwd' ORDER BY id");
    if (q) {
        CHECK(sqlite3_step(q) == SQLITE_ROW);
        CHECK(!strcmp((const char *)sqlite3_column_text(q, 0), "abc1234"));
        CHECK_NEAR(sqlite3_column_double(q, 1), 2.0, 1e-12);
        CHECK(!strcmp((const char *)sqlite3_column_text(q, 3), "FASTER"));
        CHECK(sqlite3_column_int(q, 4) == 1);
        CHECK(!strcmp((const char *)sqlite3_column_text(q, 5), "memory"));
        CHECK(sqlite3_step(q) == SQLITE_ROW);
        CHECK(!strcmp((const char *)sqlite3_column_text(q, 0), "def5678"));
        CHECK_NEAR(sqlite3_column_double(q, 1), 2.5, 1e-12);
        CHECK_NEAR(sqlite3_column_double(q, 2), 0.8, 1e-12);
        CHECK(sqlite3_step(q) == SQLITE_DONE);
        sqlite3_finalize(q);
    }
    /* the improvement between the two commits, with a window function */
    q = query(db, "SELECT git_commit, optimized_median_ms / LAG(optimized_median_ms) OVER (ORDER BY id)"
                  " FROM python.runs WHERE label = 'norm/layernorm_fwd' ORDER BY id");
    if (q) {
        CHECK(sqlite3_step(q) == SQLITE_ROW && sqlite3_column_type(q, 1) == SQLITE_NULL);
        CHECK(sqlite3_step(q) == SQLITE_ROW);
        CHECK_NEAR(sqlite3_column_double(q, 1), 0.8, 1e-12);
        sqlite3_finalize(q);
    }
    q = query(db, "SELECT git_commit, compared, max_abs_err, passed, bound, length(time) FROM python.runs"
                  " WHERE label = 'timing/self_check'");
    if (q) {
        CHECK(sqlite3_step(q) == SQLITE_ROW);
        CHECK(sqlite3_column_type(q, 0) == SQLITE_NULL && sqlite3_column_int(q, 1) == 0);
        CHECK(sqlite3_column_type(q, 2) == SQLITE_NULL && sqlite3_column_type(q, 3) == SQLITE_NULL);
        CHECK(sqlite3_column_type(q, 4) == SQLITE_NULL);
        CHECK(sqlite3_column_int(q, 5) == 20); /* 2026-01-01T00:00:00Z */
        sqlite3_finalize(q);
    }
    sqlite3_close(db);
}

static int count_rows(const char *path, const char *table) {
    sqlite3 *db = attach(path);
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM python.%s", table);
    sqlite3_stmt *q = query(db, sql);
    int n = -1;
    if (q && sqlite3_step(q) == SQLITE_ROW) n = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    sqlite3_close(db);
    return n;
}

int main(void) {
    char dir[] = "/tmp/fp_trace_sqlite_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[160], junk[160];
    snprintf(path, sizeof path, "%s/trace.db", dir);
    snprintf(junk, sizeof junk, "%s/not_a_db.json", dir);

    fp_context *ctx;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    CHECK_OK(fp_trace_enable(ctx, 1024));
    synthetic_workload(ctx);
    CHECK_OK(fp_trace_export_sqlite(ctx, path));
    CHECK(count_rows(path, "torch_trace") == STEPS * (2 * MODULES + 1) + 1);
    CHECK(count_rows(path, "nccl_trace") == STEPS + 1);
    CHECK(count_rows(path, "runs") == 0);
    sqlite3 *db = attach(path);
    test_module_share(db);
    test_stage_pivot(db);
    test_collectives(db);
    sqlite3_close(db);

    /* runs accumulate; a new export replaces the trace tables only */
    test_runs(path);
    CHECK_OK(fp_trace_clear(ctx));
    uint64_t h = 0;
    CHECK_OK(fp_trace_begin(ctx, NULL, "live", "op", 10, 20, &h));
    CHECK_OK(fp_trace_end(ctx, h));
    CHECK_OK(fp_trace_export_sqlite(ctx, path));
    CHECK(count_rows(path, "torch_trace") == 1);
    CHECK(count_rows(path, "nccl_trace") == 0);
    CHECK(count_rows(path, "runs") == 3);
    db = attach(path);
    sqlite3_stmt *q = query(db, "SELECT duration, allocated, module, start FROM python.torch_trace");
    if (q) {
        CHECK(sqlite3_step(q) == SQLITE_ROW);
        CHECK(sqlite3_column_double(q, 0) >= 0 && sqlite3_column_double(q, 0) < 1);
        CHECK(sqlite3_column_type(q, 1) == SQLITE_NULL && sqlite3_column_type(q, 2) == SQLITE_NULL);
        CHECK(sqlite3_column_double(q, 3) == 0);
        sqlite3_finalize(q);
    }
    sqlite3_close(db);

    /* bad input: a status and a message; nothing created or changed */
    fp_ab_report r = report_of(1, 1, FP_VERDICT_SAME);
    CHECK_STATUS(fp_trace_export_sqlite(ctx, "/nonexistent/dir/x.db"), FP_ERR_IO);
    CHECK(strstr(fp_last_error(), "/nonexistent/dir/x.db") != NULL);
    CHECK_STATUS(fp_trace_sqlite_add_run("/nonexistent/dir/x.db", "l", NULL, &r), FP_ERR_IO);
    CHECK_STATUS(fp_trace_sqlite_add_run(path, NULL, NULL, &r), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_sqlite_add_run(path, "l", NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_trace_export_sqlite(NULL, path), FP_ERR_INVALID_ARGUMENT);
    const char *content = "{\"not\": \"a database, long enough to fill SQLite's header check ......\"}\n";
    FILE *f = fopen(junk, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(content, f);
        fclose(f);
    }
    CHECK_STATUS(fp_trace_export_sqlite(ctx, junk), FP_ERR_IO);
    CHECK_MSG(strstr(fp_last_error(), "not a database") != NULL, "message: %s", fp_last_error());
    f = fopen(junk, "r");
    char back[256] = {0};
    CHECK(f && fread(back, 1, sizeof back - 1, f) > 0 && !strcmp(back, content));
    if (f) fclose(f);
    CHECK(count_rows(path, "runs") == 3);
    /* the context keeps recording */
    CHECK_OK(fp_trace_begin(ctx, NULL, "after", "op", 0, 0, &h));
    CHECK(h != 0);
    CHECK_OK(fp_trace_end(ctx, h));
    CHECK_OK(fp_trace_export_sqlite(ctx, path));
    CHECK(count_rows(path, "torch_trace") == 2);

    fp_context_destroy(ctx);
    unlink(junk);
    unlink(path);
    rmdir(dir);
    TEST_END();
}
