/* Status strings, the thread-local error detail, the CUDA error mapping and
 * the monotonic clock (fp_now_s, condition variables on it). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static _Thread_local char tl_error[FP_ERROR_MAX];
/* Counts the messages recorded on this thread: a caller of a user callback
 * compares it before and after to tell whether the callback (one of the
 * library's own, which can record one) left a message. */
static _Thread_local unsigned tl_error_seq;

const char *fp_status_string(fp_status status) {
    switch (status) {
    case FP_OK: return "ok";
    case FP_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FP_ERR_UNSUPPORTED: return "unsupported";
    case FP_ERR_OUT_OF_MEMORY: return "out of memory";
    case FP_ERR_NO_DEVICE: return "no device";
    case FP_ERR_CUDA: return "CUDA error";
    case FP_ERR_CUBLAS: return "cuBLAS error";
    case FP_ERR_NCCL: return "NCCL error";
    case FP_ERR_TIMEOUT: return "timeout";
    case FP_ERR_QUEUE_FULL: return "queue full";
    case FP_ERR_SHUT_DOWN: return "shut down";
    case FP_ERR_CANCELLED: return "cancelled";
    case FP_ERR_NOT_FOUND: return "not found";
    case FP_ERR_MISMATCH: return "numerical mismatch";
    case FP_ERR_IO: return "I/O error";
    case FP_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *fp_last_error(void) { return tl_error; }

void fp_clear_error(void) { tl_error[0] = '\0'; }

unsigned fp_error_seq(void) { return tl_error_seq; }

void fp_error_save(fp_error_saved *s) {
    s->seq = tl_error_seq;
    memcpy(s->msg, tl_error, strlen(tl_error) + 1); /* tl_error is always terminated */
}

void fp_error_restore(const fp_error_saved *s) {
    if (tl_error_seq == s->seq) return; /* nothing recorded since the save */
    memcpy(tl_error, s->msg, strlen(s->msg) + 1);
}

fp_status fp_set_error_at(fp_status status, const char *file, int line, const char *fmt, ...) {
    /* Keep only the path below the source root so messages stay short. */
    const char *short_file = strstr(file, "src/");
    if (!short_file) short_file = strstr(file, "kernels/");
    if (!short_file) short_file = file;
    ++tl_error_seq;
    int n = snprintf(tl_error, sizeof tl_error, "%s:%d: ", short_file, line);
    if (n < 0 || (size_t)n >= sizeof tl_error) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_error + n, sizeof tl_error - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

fp_status fp_cuda_status(cudaError_t err, const char *expr, const char *file, int line) {
    fp_status st = FP_ERR_CUDA;
    if (err == cudaErrorMemoryAllocation) st = FP_ERR_OUT_OF_MEMORY;
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
        err == cudaErrorInvalidDevice)
        st = FP_ERR_NO_DEVICE;
    /* Clear the sticky-free "last error" so it does not leak into later calls. */
    (void)cudaGetLastError();
    return fp_set_error_at(st, file, line, "%s failed: %s (%s)", expr, cudaGetErrorString(err),
                           cudaGetErrorName(err));
}

double fp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fp_deadline_after_ms(struct timespec *ts, int64_t ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

int fp_cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0) return -1;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc;
}
