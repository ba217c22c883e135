#include "fp_test.h"
int main(void){TEST_END();}
