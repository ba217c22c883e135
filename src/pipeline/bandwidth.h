/* The copy-bandwidth check pattern (bandwidth.c), shared with its tests: a
 * position-dependent byte pattern, so that a copy that did nothing, moved
 * the wrong range or was cut short is caught. Not installed. */
#ifndef FP_PIPELINE_BANDWIDTH_H
#define FP_PIPELINE_BANDWIDTH_H

#include <stddef.h>

/* Writes the pattern's bytes [offset, offset + n) to dst (dst holds byte
 * `offset` of the pattern at dst[0]). offset must be a multiple of 8. */
void fp_copy_pattern_fill(void *dst, size_t offset, size_t n);

/* Checks p against the pattern's bytes [offset, offset + n): all of them
 * when stride is 0, else the 8-byte word at every stride-th byte (stride a
 * multiple of 8) and the last n % 8 + 8 bytes. Returns 1 when they match;
 * 0 with *bad (if not NULL) the pattern offset of the first wrong byte.
 * offset must be a multiple of 8. */
int fp_copy_pattern_check(const void *p, size_t offset, size_t n, size_t stride, size_t *bad);

/* Byte `pos` of the pattern. */
unsigned char fp_copy_pattern_byte(size_t pos);

#endif /* FP_PIPELINE_BANDWIDTH_H */
