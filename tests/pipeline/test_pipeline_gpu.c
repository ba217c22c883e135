/* pipeline.h on a CUDA context (label gpu; exits 77 without a device; also
 * built on the emulated runtime with asynchronous streams:
 * test_pipeline_gpu_emu): the cases of pipeline_cases.h with real streams
 * and events, pageable and pinned host memory. */
#include "pipeline_cases.h"

int main(void) {
    fp_context *ctx = fp_test_cuda_context_or_skip();
    pc_run_all(ctx);
    fp_context_destroy(ctx);
    TEST_END();
}
