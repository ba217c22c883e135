/* The growth rule of versioned structs (core.h, "Conventions"): a caller's
 * struct_size may be anything from the struct's first published size to
 * this library's sizeof; the fields past it take their defaults, and an
 * output struct is written only up to it.
 *
 * For whoever appends a field: the struct's first published size (the
 * *_SIZE_0_2-style constant next to its checks) stays what it was, and the
 * new field must start at or after the previous version's sizeof (add an
 * explicit pad field if it would fall into tail padding), so an older
 * caller's struct never covers part of it. */
#include <string.h>

#include "internal.h"

fp_status fp_struct_size_check(size_t size, size_t first, size_t cur, const char *what) {
    if (size > cur)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "%s: struct_size %zu is larger than this library's %zu: the program was "
                            "built against a newer libfastpath header than the library it runs with "
                            "(libfastpath %s)",
                            what, size, cur, fp_version_string());
    /* Every real layout starts with a size_t, so its sizeof is a multiple
     * of size_t's alignment: anything else ends inside a field. */
    if (size % _Alignof(size_t) != 0)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "%s: struct_size %zu is not a multiple of %zu, so no header's layout: "
                            "initialize the struct with its *_default / *_init macro",
                            what, size, (size_t)_Alignof(size_t));
    if (size < first)
        return fp_set_error(FP_ERR_INVALID_ARGUMENT,
                            "%s: struct_size %zu is smaller than its first published size %zu: "
                            "initialize the struct with its *_default / *_init macro",
                            what, size, first);
    return FP_OK;
}

/* The struct_size at the start of a caller's struct, checked. */
static fp_status caller_size(const void *p, size_t first, size_t cur, const char *what, size_t *size) {
    if (!p) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    memcpy(size, p, sizeof *size);
    return fp_struct_size_check(*size, first, cur, what);
}

fp_status fp_struct_read(void *full, const void *user, size_t first, size_t cur, const char *what) {
    size_t size = 0;
    FP_TRY(caller_size(user, first, cur, what, &size));
    memcpy(full, user, size);
    memcpy(full, &cur, sizeof cur); /* full is now this library's layout */
    return FP_OK;
}

fp_status fp_struct_write(void *user, const void *full, size_t first, size_t cur, const char *what) {
    size_t size = 0;
    FP_TRY(caller_size(user, first, cur, what, &size));
    memcpy(user, full, size);
    memcpy(user, &size, sizeof size); /* the caller's struct_size stays */
    return FP_OK;
}

fp_status fp_table_read(void *full, const void *user, size_t user_size, size_t first, size_t cur,
                        const char *what) {
    if (!user) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    FP_TRY(fp_struct_size_check(user_size, first, cur, what));
    memset(full, 0, cur);
    memcpy(full, user, user_size);
    return FP_OK;
}

fp_status fp_struct_init(void *p, size_t size, const void *defaults, size_t first, size_t cur,
                         const char *what) {
    if (!p) return fp_set_error(FP_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    fp_status st = fp_struct_size_check(size, first, cur, what);
    if (st != FP_OK) return st;
    if (defaults) memcpy(p, defaults, size);
    else memset(p, 0, size);
    memcpy(p, &size, sizeof size);
    return FP_OK;
}
