/* Whole-file writes that either complete or leave nothing: a temporary file
 * next to the target, flushed to disk, renamed over it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

fp_status fp_write_file_atomic(const char *path, const void *data, size_t len, const char *what) {
    FP_CHECK_NOT_NULL(path);
    FP_CHECK_ARG(path[0] != '\0', "%s: argument 'path' is empty", what);
    FP_CHECK_ARG(data || len == 0, "%s: no data", what);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 8);
    if (!tmp) return fp_set_error(FP_ERR_OUT_OF_MEMORY, "%s: path buffer", what);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".XXXXXX", 8);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        fp_status st = fp_set_error(FP_ERR_IO, "%s: cannot create a temporary file next to '%s': %s (nothing written)",
                                    what, path, strerror(errno));
        free(tmp);
        return st;
    }
    /* mkstemp makes it 0600: readable by others like any file written with fopen */
    int ok = 1, err = 0;
    if (fchmod(fd, 0644) != 0) {
        ok = 0;
        err = errno;
    }
    const char *p = data;
    size_t left = len;
    while (ok && left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            ok = 0;
            err = w < 0 ? errno : EIO;
        } else {
            p += w;
            left -= (size_t)w;
        }
    }
    if (ok && fsync(fd) != 0) {
        ok = 0;
        err = errno;
    }
    if (close(fd) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        err = errno;
    }
    fp_status st = FP_OK;
    if (!ok) {
        unlink(tmp);
        st = fp_set_error(FP_ERR_IO, "%s: writing '%s' failed: %s (nothing written there)", what, path,
                          strerror(err));
    }
    free(tmp);
    return st;
}
