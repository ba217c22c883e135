/* Runtime version, to detect a header/library mismatch. */
#include "fastpath/core.h"

#define FP_STR2(x) #x
#define FP_STR(x) FP_STR2(x)

int fp_version(void) { return FP_VERSION_NUMBER; }

const char *fp_version_string(void) {
    return FP_STR(FP_VERSION_MAJOR) "." FP_STR(FP_VERSION_MINOR) "." FP_STR(FP_VERSION_PATCH);
}
