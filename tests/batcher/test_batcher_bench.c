/* Built-in A/B of the batcher (fp_batcher_bench) on the CPU model: both
 * sides complete every request with the right output, batching at 64
 * clients beats batch 1 by a clear margin (the model makes batch 1 about
 * ten times costlier per sample; asserted loosely: 1.5x), and bad fields
 * are named. */
#include "fastpath/batcher.h"
#include "fp_test.h"

#include <string.h>

static void print_side(const char *name, const fp_batcher_bench_side *s) {
    printf("  %-9s %9.0f req/s  %7.1f us/req  e2e p50/p99 %8.1f/%8.1f us  queue p99 %8.1f us  "
           "batch %.1f  exec p50 %.1f us  overhead %.2f us/req\n",
           name, s->throughput_rps, s->per_request_us, s->stats.end_to_end.p50_us,
           s->stats.end_to_end.p99_us, s->stats.queue_time.p99_us, s->stats.mean_batch_size,
           s->stats.executor.p50_us, s->sched_overhead_us);
}

int main(void) {
    fp_batcher_bench_config c;
    fp_batcher_bench_config_default(&c);
    c.requests = 2000;
    c.warmup_requests = 100;

    fp_batcher_bench_report rep;
    c.clients = 64;
    CHECK_OK(fp_batcher_bench(&c, &rep));
    printf("closed loop, 64 clients: speedup %.2fx (verdict %s)\n", rep.speedup,
           fp_verdict_string(rep.ab.verdict));
    print_side("baseline", &rep.baseline);
    print_side("batched", &rep.batched);
    CHECK(rep.baseline.wrong_outputs == 0 && rep.batched.wrong_outputs == 0);
    CHECK(rep.baseline.failed == 0 && rep.batched.failed == 0);
    CHECK(rep.ab.agreement.passed == 1);
    CHECK(rep.baseline.stats.mean_batch_size == 1.0);
    CHECK(rep.batched.stats.mean_batch_size > 4.0);
    CHECK_MSG(rep.speedup > 1.5, "speedup %.2f", rep.speedup);
    CHECK(rep.ab.baseline.samples == c.windows && rep.ab.optimized.samples == c.windows);

    c.load = FP_BATCHER_LOAD_OPEN;
    c.rate_rps = 20000;
    CHECK_OK(fp_batcher_bench(&c, &rep));
    printf("open loop, %.0f req/s offered: speedup %.2fx\n", c.rate_rps, rep.speedup);
    print_side("baseline", &rep.baseline);
    print_side("batched", &rep.batched);
    CHECK(rep.baseline.wrong_outputs == 0 && rep.batched.wrong_outputs == 0);
    CHECK(rep.baseline.failed == 0 && rep.batched.failed == 0);

    fp_batcher_bench_config bad = c;
    bad.clients = 0;
    bad.load = FP_BATCHER_LOAD_CLOSED;
    CHECK_STATUS(fp_batcher_bench(&bad, &rep), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "clients") != NULL);
    bad = c;
    bad.rate_rps = -1;
    CHECK_STATUS(fp_batcher_bench(&bad, &rep), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "rate_rps") != NULL);
    bad = c;
    bad.batcher.max_batch_size = 0;
    CHECK_STATUS(fp_batcher_bench(&bad, &rep), FP_ERR_INVALID_ARGUMENT);
    CHECK(strstr(fp_last_error(), "max_batch_size") != NULL);
    CHECK_STATUS(fp_batcher_bench(NULL, &rep), FP_ERR_INVALID_ARGUMENT);
    TEST_END();
}
