/* comm.h without a GPU (label cpu): the bandwidth arithmetic (nccl-tests'
 * definitions), names, config defaults, the id file exchange and its
 * errors, and argument checks that need no communicator. The communicator
 * itself runs in test_comm_gpu (a GPU, or the emulated runtime and NCCL:
 * test_comm_gpu_emu). */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fp_test.h"
#include "internal.h" /* fp_now_s */

static void test_arithmetic(void) {
    CHECK_NEAR(fp_coll_busbw_factor(FP_COLL_ALLREDUCE, 8), 2.0 * 7 / 8, 1e-12);
    CHECK_NEAR(fp_coll_busbw_factor(FP_COLL_ALLREDUCE, 2), 1.0, 1e-12);
    CHECK_NEAR(fp_coll_busbw_factor(FP_COLL_ALLGATHER, 4), 0.75, 1e-12);
    CHECK_NEAR(fp_coll_busbw_factor(FP_COLL_REDUCE_SCATTER, 4), 0.75, 1e-12);
    CHECK_NEAR(fp_coll_busbw_factor(FP_COLL_BROADCAST, 4), 1.0, 1e-12);
    CHECK(fp_coll_busbw_factor(FP_COLL_ALLREDUCE, 1) == 0);
    CHECK(fp_coll_busbw_factor(FP_COLL_ALLGATHER, 1) == 0);
    CHECK(fp_coll_busbw_factor(FP_COLL_BROADCAST, 1) == 1);
    CHECK(fp_coll_busbw_factor(FP_COLL_ALLREDUCE, 0) == 0);
    CHECK(fp_coll_busbw_factor((fp_coll_kind)9, 4) == 0);
    /* algbw's bytes: all-reduce / broadcast the buffer, all-gather the
     * receive side, reduce-scatter the send side. */
    CHECK(fp_coll_bytes(FP_COLL_ALLREDUCE, 1000, FP_F32, 4) == 4000);
    CHECK(fp_coll_bytes(FP_COLL_BROADCAST, 1000, FP_BF16, 4) == 2000);
    CHECK(fp_coll_bytes(FP_COLL_ALLGATHER, 1000, FP_F16, 4) == 8000);
    CHECK(fp_coll_bytes(FP_COLL_REDUCE_SCATTER, 1000, FP_F32, 8) == 32000);
    CHECK(strcmp(fp_coll_kind_name(FP_COLL_REDUCE_SCATTER), "reduce_scatter") == 0);
    CHECK(strcmp(fp_coll_kind_name((fp_coll_kind)7), "unknown") == 0);
    CHECK(strcmp(fp_reduce_op_name(FP_REDUCE_AVG), "avg") == 0);
    CHECK(strcmp(fp_reduce_op_name((fp_reduce_op)-1), "unknown") == 0);
}

static void test_defaults(void) {
    fp_comm_config c;
    CHECK_OK(fp_comm_config_default(&c));
    CHECK(c.struct_size == sizeof c && c.init_timeout_ms == 60000 && c.timeout_ms == 300000 &&
          c.ledger_entries == 4096 && c.on_failure == NULL);
    fp_buckets_config b;
    CHECK_OK(fp_buckets_config_default(&b));
    CHECK(b.bucket_cap_bytes == (size_t)25 << 20 && b.first_bucket_cap_bytes == (size_t)1 << 20 &&
          b.op == FP_REDUCE_SUM && b.flat_views == 0);
    fp_comm_stats s;
    CHECK_OK(fp_comm_stats_init(&s));
    CHECK(s.struct_size == sizeof s && s.enqueued == 0);
    CHECK_STATUS(fp_comm_config_default_sized(&c, 3), FP_ERR_INVALID_ARGUMENT);
}

static void test_id_files(void) {
    char dir[] = "/tmp/fp_comm_test_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256], bad[256];
    snprintf(path, sizeof path, "%s/id", dir);
    fp_comm_id id, back;
    for (int i = 0; i < FP_COMM_ID_BYTES; ++i) id.bytes[i] = (unsigned char)(i * 7 + 3);
    CHECK_OK(fp_comm_id_write_file(&id, path));
    memset(&back, 0, sizeof back);
    CHECK_OK(fp_comm_id_read_file(path, 0, &back));
    CHECK(memcmp(id.bytes, back.bytes, FP_COMM_ID_BYTES) == 0);
    /* No temporary left behind. */
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0);
    /* A missing file: waits up to the timeout. */
    snprintf(bad, sizeof bad, "%s/missing", dir);
    double t0 = fp_now_s();
    CHECK_STATUS(fp_comm_id_read_file(bad, 100, &back), FP_ERR_TIMEOUT);
    double dt = fp_now_s() - t0;
    CHECK_MSG(dt >= 0.09 && dt < 2.0, "waited %.3f s for a 100 ms timeout", dt);
    CHECK(strstr(fp_last_error(), "missing") != NULL);
    /* Too long: not an id. */
    snprintf(bad, sizeof bad, "%s/long", dir);
    FILE *f = fopen(bad, "wb");
    for (int i = 0; i < FP_COMM_ID_BYTES + 5; ++i) fputc(1, f);
    fclose(f);
    CHECK_STATUS(fp_comm_id_read_file(bad, 0, &back), FP_ERR_IO);
    unlink(bad);
    /* A short file is taken as still being written: a timeout, not garbage. */
    snprintf(bad, sizeof bad, "%s/short", dir);
    f = fopen(bad, "wb");
    fputc(1, f);
    fclose(f);
    CHECK_STATUS(fp_comm_id_read_file(bad, 50, &back), FP_ERR_TIMEOUT);
    unlink(bad);
    /* A directory that does not exist. */
    snprintf(bad, sizeof bad, "%s/no/such/dir/id", dir);
    CHECK_STATUS(fp_comm_id_write_file(&id, bad), FP_ERR_IO);
    CHECK(strstr(fp_last_error(), "no/such/dir") != NULL);
    CHECK_STATUS(fp_comm_id_write_file(NULL, path), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_comm_id_write_file(&id, ""), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_comm_id_read_file(NULL, 0, &back), FP_ERR_INVALID_ARGUMENT);
    unlink(path);
    rmdir(dir);
}

static void test_arguments(void) {
    fp_context *cpu = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, -1, &cpu));
    fp_comm_id id;
    memset(&id, 1, sizeof id);
    fp_comm *c = (fp_comm *)0x1;
    /* Communicators live on CUDA contexts. */
    CHECK_STATUS(fp_comm_init(cpu, &id, 1, 0, NULL, &c), FP_ERR_INVALID_ARGUMENT);
    CHECK(c == NULL);
    CHECK_STATUS(fp_comm_init(NULL, &id, 1, 0, NULL, &c), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_comm_init(cpu, &id, 1, 0, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    fp_context *ctxs[1] = {cpu};
    fp_comm *comms[1];
    CHECK_STATUS(fp_comm_init_all(ctxs, 1, NULL, comms), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_comm_init_all(ctxs, 0, NULL, comms), FP_ERR_INVALID_ARGUMENT);
    /* NULL communicators and buckets. */
    float x;
    CHECK_STATUS(fp_comm_allreduce(NULL, &x, &x, 1, FP_F32, FP_REDUCE_SUM, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_comm_synchronize(NULL, 0), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_comm_abort(NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_buckets_mark_ready(NULL, 0, NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fp_buckets_wait(NULL, NULL), FP_ERR_INVALID_ARGUMENT);
    CHECK(fp_buckets_count(NULL) == 0);
    CHECK(fp_comm_rank(NULL) == -1 && fp_comm_nranks(NULL) == 0 && fp_comm_stream(NULL) == NULL);
    fp_comm_destroy(NULL);
    fp_buckets_destroy(NULL);
    CHECK_STATUS(fp_comm_group_end(), fp_comm_available() ? FP_ERR_INVALID_ARGUMENT : FP_ERR_UNSUPPORTED);
    /* The NCCL in use: its version and origin, or nothing. */
    const char *from = "unset";
    const int v = fp_comm_nccl_version(&from);
    if (fp_comm_available())
        CHECK_MSG(v >= 21800 && from && *from, "version %d from %s", v, from ? from : "NULL");
    else
        CHECK(v == 0 && from == NULL);
    CHECK(fp_comm_nccl_version(NULL) == v);
    fp_context_destroy(cpu);
}

static void test_unique_id(void) {
    if (!fp_comm_available()) {
        fp_comm_id id;
        CHECK_STATUS(fp_comm_get_unique_id(&id), FP_ERR_UNSUPPORTED);
        printf("built without NCCL: fp_comm_get_unique_id is UNSUPPORTED, as documented\n");
        return;
    }
    /* Two ids differ (NCCL's host-side bootstrap: no GPU needed). */
    fp_comm_id a, b;
    fp_status st = fp_comm_get_unique_id(&a);
    if (st != FP_OK) {
        /* Some NCCL builds need a driver even for the id: say so, fail nothing. */
        printf("ncclGetUniqueId without a GPU: %s (%s)\n", fp_status_string(st), fp_last_error());
        CHECK(st == FP_ERR_NCCL);
        return;
    }
    CHECK_OK(fp_comm_get_unique_id(&b));
    CHECK(memcmp(a.bytes, b.bytes, FP_COMM_ID_BYTES) != 0);
    CHECK_STATUS(fp_comm_get_unique_id(NULL), FP_ERR_INVALID_ARGUMENT);
}

int main(void) {
    test_arithmetic();
    test_defaults();
    test_id_files();
    test_arguments();
    test_unique_id();
    TEST_END();
}
