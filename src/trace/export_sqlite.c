/* The SQLite export of a context's spans (trace.h, fp_trace_export_sqlite:
 * tables torch_trace and nccl_trace) and the runs table of timing-engine
 * A/B results (fp_trace_sqlite_add_run). Each call is one transaction. */
#include <ctype.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trace/trace_internal.h"

static const char *const TRACE_SCHEMA =
    "DROP TABLE IF EXISTS torch_trace;"
    "DROP TABLE IF EXISTS nccl_trace;"
    "CREATE TABLE torch_trace(id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,"
    " step INTEGER NOT NULL, module TEXT, stage TEXT, duration REAL NOT NULL, bytes REAL NOT NULL,"
    " flops REAL NOT NULL, allocated REAL, device INTEGER NOT NULL, stream INTEGER NOT NULL,"
    " start REAL NOT NULL, depth INTEGER NOT NULL);"
    "CREATE TABLE nccl_trace(id INTEGER PRIMARY KEY, operation TEXT NOT NULL, bytes REAL NOT NULL,"
    " duration REAL NOT NULL, algbw REAL, busbw REAL, nranks INTEGER, step INTEGER NOT NULL,"
    " device INTEGER NOT NULL, stream INTEGER NOT NULL, start REAL NOT NULL);";

static const char *const RUNS_SCHEMA =
    "CREATE TABLE IF NOT EXISTS runs(id INTEGER PRIMARY KEY, time TEXT NOT NULL, label TEXT NOT NULL,"
    " git_commit TEXT, baseline_median_ms REAL, baseline_p10_ms REAL, baseline_p90_ms REAL,"
    " baseline_noise REAL, baseline_samples INTEGER, optimized_median_ms REAL, optimized_p10_ms REAL,"
    " optimized_p90_ms REAL, optimized_noise REAL, optimized_samples INTEGER, speedup REAL, verdict TEXT,"
    " compared INTEGER, max_abs_err REAL, passed INTEGER, achieved_gbps REAL, achieved_tflops REAL,"
    " pct_of_peak REAL, bound TEXT);";

/* An open database inside a transaction: whether the file existed before,
 * so a failed first write can remove it. */
typedef struct db_txn {
    sqlite3 *db;
    const char *path;
    const char *what;
    int existed;
} db_txn;

static fp_status db_error(db_txn *x, const char *step) {
    return fp_set_error(FP_ERR_IO, "%s: %s of the SQLite database '%s' failed: %s", x->what, step, x->path,
                        x->db ? sqlite3_errmsg(x->db) : "out of memory");
}

static fp_status db_begin(db_txn *x, const char *path, const char *what) {
    memset(x, 0, sizeof *x);
    x->path = path;
    x->what = what;
    x->existed = access(path, F_OK) == 0;
    int rc = sqlite3_open_v2(path, &x->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    fp_status st = FP_OK;
    if (rc != SQLITE_OK) st = db_error(x, "opening");
    if (st == FP_OK) {
        sqlite3_busy_timeout(x->db, 5000);
        if (sqlite3_exec(x->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
            st = db_error(x, "starting a transaction");
    }
    if (st != FP_OK) {
        sqlite3_close(x->db);
        x->db = NULL;
        if (!x->existed) unlink(path);
    }
    return st;
}

/* Commits when st is FP_OK, else rolls back (and removes a file this call
 * created); closes. Returns the first error. */
static fp_status db_end(db_txn *x, fp_status st) {
    if (st == FP_OK && sqlite3_exec(x->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) st = db_error(x, "committing");
    if (st != FP_OK) sqlite3_exec(x->db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(x->db);
    if (st != FP_OK && !x->existed) unlink(x->path);
    return st;
}

static void bind_text_or_null(sqlite3_stmt *s, int i, const char *v) {
    if (v && v[0]) sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(s, i);
}

/* The NCCL convention (nccl-tests' PERFORMANCE.md) factor from algbw to busbw. */
static double busbw_factor(const char *op, int nranks) {
    if (nranks <= 0) return 1;
    char k[FP_TRACE_NAME_MAX];
    size_t j = 0;
    for (size_t i = 0; op[i] && j + 1 < sizeof k; ++i)
        if (op[i] != '_' && op[i] != '-') k[j++] = (char)tolower((unsigned char)op[i]);
    k[j] = '\0';
    double n = nranks;
    if (!strcmp(k, "allreduce")) return 2 * (n - 1) / n;
    if (!strcmp(k, "allgather") || !strcmp(k, "reducescatter")) return (n - 1) / n;
    return 1;
}

static fp_status insert_spans(db_txn *x, const fp_trace_export *e) {
    const fp_trace_span *spans = e->spans;
    const int *streams = e->streams;
    sqlite3_stmt *ins = NULL, *coll = NULL;
    fp_status st = FP_OK;
    if (sqlite3_prepare_v2(x->db,
                           "INSERT INTO torch_trace(name, category, step, module, stage, duration, bytes, flops,"
                           " allocated, device, stream, start, depth) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           -1, &ins, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(x->db,
                           "INSERT INTO nccl_trace(operation, bytes, duration, algbw, busbw, nranks, step, device,"
                           " stream, start) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           -1, &coll, NULL) != SQLITE_OK)
        st = db_error(x, "preparing the inserts");
    const double origin = e->origin;
    for (size_t i = 0; st == FP_OK && i < e->n; ++i) {
        const fp_trace_span *s = &spans[i];
        double dur = s->end_s - s->start_s;
        sqlite3_reset(ins);
        sqlite3_bind_text(ins, 1, s->name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(ins, 2, s->category, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(ins, 3, s->step);
        bind_text_or_null(ins, 4, s->module);
        bind_text_or_null(ins, 5, s->stage);
        sqlite3_bind_double(ins, 6, dur);
        sqlite3_bind_double(ins, 7, s->bytes);
        sqlite3_bind_double(ins, 8, s->flops);
        if (s->allocated_bytes >= 0) sqlite3_bind_double(ins, 9, s->allocated_bytes / (1024.0 * 1024.0));
        else sqlite3_bind_null(ins, 9);
        sqlite3_bind_int(ins, 10, s->device);
        sqlite3_bind_int(ins, 11, streams[i]);
        sqlite3_bind_double(ins, 12, s->start_s - origin);
        sqlite3_bind_int(ins, 13, s->depth);
        if (sqlite3_step(ins) != SQLITE_DONE) st = db_error(x, "inserting into torch_trace");
        if (st != FP_OK || strcmp(s->category, "collective") != 0) continue;
        sqlite3_reset(coll);
        sqlite3_bind_text(coll, 1, s->name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(coll, 2, s->bytes);
        sqlite3_bind_double(coll, 3, dur * 1e3);
        if (dur > 0) {
            double algbw = s->bytes / dur / 1e9;
            sqlite3_bind_double(coll, 4, algbw);
            sqlite3_bind_double(coll, 5, algbw * busbw_factor(s->name, s->nranks));
        } else { /* a zero-length span has no bandwidth */
            sqlite3_bind_null(coll, 4);
            sqlite3_bind_null(coll, 5);
        }
        if (s->nranks > 0) sqlite3_bind_int(coll, 6, s->nranks);
        else sqlite3_bind_null(coll, 6);
        sqlite3_bind_int64(coll, 7, s->step);
        sqlite3_bind_int(coll, 8, s->device);
        sqlite3_bind_int(coll, 9, streams[i]);
        sqlite3_bind_double(coll, 10, s->start_s - origin);
        if (sqlite3_step(coll) != SQLITE_DONE) st = db_error(x, "inserting into nccl_trace");
    }
    sqlite3_finalize(ins);
    sqlite3_finalize(coll);
    return st;
}

fp_status fp_trace_export_sqlite(fp_context *ctx, const char *path) {
    fp_trace_export e;
    FP_TRY(fp_trace_export_begin(ctx, path, "fp_trace_export_sqlite", &e));
    db_txn x;
    fp_status st = db_begin(&x, path, "fp_trace_export_sqlite");
    if (st == FP_OK) {
        if (sqlite3_exec(x.db, TRACE_SCHEMA, NULL, NULL, NULL) != SQLITE_OK ||
            sqlite3_exec(x.db, RUNS_SCHEMA, NULL, NULL, NULL) != SQLITE_OK)
            st = db_error(&x, "creating the tables");
        if (st == FP_OK) st = insert_spans(&x, &e);
        st = db_end(&x, st);
    }
    fp_trace_export_end(&e);
    return st;
}

static void bind_stats(sqlite3_stmt *s, int first, const fp_stats *st) {
    sqlite3_bind_double(s, first, st->median_ms);
    sqlite3_bind_double(s, first + 1, st->p10_ms);
    sqlite3_bind_double(s, first + 2, st->p90_ms);
    sqlite3_bind_double(s, first + 3, st->noise);
    sqlite3_bind_int(s, first + 4, st->samples);
}

fp_status fp_trace_sqlite_add_run(const char *path, const char *label, const char *git_commit,
                                  const fp_ab_report *report) {
    FP_CHECK_NOT_NULL(path);
    FP_CHECK_NOT_NULL(label);
    FP_CHECK_NOT_NULL(report);
    FP_CHECK_ARG(path[0] != '\0', "fp_trace_sqlite_add_run: argument 'path' is empty");
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    db_txn x;
    FP_TRY(db_begin(&x, path, "fp_trace_sqlite_add_run"));
    fp_status st = FP_OK;
    sqlite3_stmt *ins = NULL;
    if (sqlite3_exec(x.db, RUNS_SCHEMA, NULL, NULL, NULL) != SQLITE_OK) st = db_error(&x, "creating the runs table");
    if (st == FP_OK &&
        sqlite3_prepare_v2(x.db,
                           "INSERT INTO runs(time, label, git_commit, baseline_median_ms, baseline_p10_ms,"
                           " baseline_p90_ms, baseline_noise, baseline_samples, optimized_median_ms,"
                           " optimized_p10_ms, optimized_p90_ms, optimized_noise, optimized_samples, speedup,"
                           " verdict, compared, max_abs_err, passed, achieved_gbps, achieved_tflops, pct_of_peak,"
                           " bound) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           -1, &ins, NULL) != SQLITE_OK)
        st = db_error(&x, "preparing the insert into runs");
    if (st == FP_OK) {
        sqlite3_bind_text(ins, 1, when, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(ins, 2, label, -1, SQLITE_TRANSIENT);
        bind_text_or_null(ins, 3, git_commit);
        bind_stats(ins, 4, &report->baseline);
        bind_stats(ins, 9, &report->optimized);
        sqlite3_bind_double(ins, 14, report->speedup);
        sqlite3_bind_text(ins, 15, fp_verdict_string(report->verdict), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(ins, 16, report->compared ? 1 : 0);
        if (report->compared) {
            sqlite3_bind_double(ins, 17, report->agreement.max_abs_err);
            sqlite3_bind_int(ins, 18, report->agreement.passed ? 1 : 0);
        } else {
            sqlite3_bind_null(ins, 17);
            sqlite3_bind_null(ins, 18);
        }
        sqlite3_bind_double(ins, 19, report->achieved_gbps);
        sqlite3_bind_double(ins, 20, report->achieved_tflops);
        sqlite3_bind_double(ins, 21, report->pct_of_peak);
        bind_text_or_null(ins, 22, report->bound);
        if (sqlite3_step(ins) != SQLITE_DONE) st = db_error(&x, "inserting into runs");
    }
    sqlite3_finalize(ins);
    return db_end(&x, st);
}
