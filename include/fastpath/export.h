/* Symbol visibility: the library is built with -fvisibility=hidden and only
 * declarations marked FP_API are exported from libfastpath.so. */
#ifndef FASTPATH_EXPORT_H
#define FASTPATH_EXPORT_H

#if defined(_WIN32)
#define FP_API
#elif defined(__GNUC__) || defined(__clang__)
#define FP_API __attribute__((visibility("default")))
#else
#define FP_API
#endif

#endif /* FASTPATH_EXPORT_H */
