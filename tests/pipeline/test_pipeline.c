/* pipeline.h on a CPU context: ordering, outputs, back-pressure, errors,
 * cancellation, destroy in flight, bad input, concurrent submitters and the
 * A/B (tests/pipeline/pipeline_cases.h). The same cases run on CUDA in
 * test_pipeline_gpu.c. */
#include "pipeline_cases.h"

int main(void) {
    fp_context *ctx = NULL;
    CHECK_OK(fp_context_create(FP_DEVICE_CPU, 0, &ctx));
    pc_run_all(ctx);
    fp_context_destroy(ctx);
    TEST_END();
}
