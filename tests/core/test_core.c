#include "fp_test.h"
int main(void) {
    CHECK(fp_version() == FP_VERSION_NUMBER);
    TEST_END();
}
