/* The dump shim's wrappers of open, creat and the stdio opens
 * (dumpshim_internal.h says the pattern each follows). */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE

#include "dumpshim_internal.h"

/* The fortify entry points of open, declared here because <fcntl.h>
 * declares them only when fortifying. */
int __open_2(const char* path, int flags);
int __open64_2(const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags);

REAL(__open64_2);
REAL(__open_2);
REAL(__openat64_2);
REAL(__openat_2);
REAL(creat);
REAL(creat64);
REAL(fopen);
REAL(fopen64);
REAL(freopen);
REAL(freopen64);
REAL(open);
REAL(open64);
REAL(openat);
REAL(openat64);

#define OPEN_BODY(real_call, dirfd, path, flags)         \
    struct open_call c;                                  \
    before_open(&c, dirfd, path, flags);                 \
    const int fd = real_call;                            \
    const int error = errno;                             \
    after_open(&c, fd, error, flags);                    \
    errno = error;                                       \
    return fd

#define MODE_ARGUMENT(flags)                      \
    mode_t mode = 0;                              \
    if (needs_mode(flags)) {                      \
        va_list arguments;                        \
        va_start(arguments, flags);               \
        mode = (mode_t)va_arg(arguments, int);    \
        va_end(arguments);                        \
    }

SHIM_EXPORT int open(const char* path, int flags, ...) {
    MODE_ARGUMENT(flags);
    LOAD(open);
    OPEN_BODY(real_open(path, flags, mode), AT_FDCWD, path, flags);
}

SHIM_EXPORT int open64(const char* path, int flags, ...) {
    MODE_ARGUMENT(flags);
    LOAD(open64);
    OPEN_BODY(real_open64(path, flags, mode), AT_FDCWD, path, flags);
}

SHIM_EXPORT int openat(int dirfd, const char* path, int flags, ...) {
    MODE_ARGUMENT(flags);
    LOAD(openat);
    OPEN_BODY(real_openat(dirfd, path, flags, mode), dirfd, path, flags);
}

SHIM_EXPORT int openat64(int dirfd, const char* path, int flags, ...) {
    MODE_ARGUMENT(flags);
    LOAD(openat64);
    OPEN_BODY(real_openat64(dirfd, path, flags, mode), dirfd, path, flags);
}

SHIM_EXPORT int creat(const char* path, mode_t mode) {
    LOAD(creat);
    OPEN_BODY(real_creat(path, mode), AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC);
}

SHIM_EXPORT int creat64(const char* path, mode_t mode) {
    LOAD(creat64);
    OPEN_BODY(real_creat64(path, mode), AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC);
}

SHIM_EXPORT int __open_2(const char* path, int flags) {
    LOAD(__open_2);
    OPEN_BODY(real___open_2(path, flags), AT_FDCWD, path, flags);
}

SHIM_EXPORT int __open64_2(const char* path, int flags) {
    LOAD(__open64_2);
    OPEN_BODY(real___open64_2(path, flags), AT_FDCWD, path, flags);
}

SHIM_EXPORT int __openat_2(int dirfd, const char* path, int flags) {
    LOAD(__openat_2);
    OPEN_BODY(real___openat_2(dirfd, path, flags), dirfd, path, flags);
}

SHIM_EXPORT int __openat64_2(int dirfd, const char* path, int flags) {
    LOAD(__openat64_2);
    OPEN_BODY(real___openat64_2(dirfd, path, flags), dirfd, path, flags);
}

/* The open(2) flags an fopen mode stands for. */
static int mode_flags(const char* mode) {
    int flags = 0;
    if (mode == NULL) return O_RDONLY;
    const int plus = strchr(mode, '+') != NULL;
    switch (mode[0]) {
        case 'w': flags = (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_TRUNC; break;
        case 'a': flags = (plus ? O_RDWR : O_WRONLY) | O_CREAT | O_APPEND; break;
        default: flags = plus ? O_RDWR : O_RDONLY; break;
    }
    if (strchr(mode, 'x') != NULL) flags |= O_EXCL;
    return flags;
}

#define FOPEN_BODY(real_call, path, mode)                  \
    const int flags = mode_flags(mode);                    \
    struct open_call c;                                    \
    before_open(&c, AT_FDCWD, path, flags);                \
    FILE* file = real_call;                                \
    const int error = errno;                               \
    after_open(&c, file ? fileno(file) : -1, error, flags); \
    errno = error;                                         \
    return file

SHIM_EXPORT FILE* fopen(const char* path, const char* mode) {
    LOAD(fopen);
    FOPEN_BODY(real_fopen(path, mode), path, mode);
}

SHIM_EXPORT FILE* fopen64(const char* path, const char* mode) {
    LOAD(fopen64);
    FOPEN_BODY(real_fopen64(path, mode), path, mode);
}

/* freopen closes the stream's descriptor first: it is no longer followed. */
static void forget_stream(FILE* stream) {
    if (!armed() || stream == NULL) return;
    lock();
    forget(fileno(stream));
    unlock();
}

SHIM_EXPORT FILE* freopen(const char* path, const char* mode, FILE* stream) {
    LOAD(freopen);
    if (path == NULL) return real_freopen(path, mode, stream);
    forget_stream(stream);
    FOPEN_BODY(real_freopen(path, mode, stream), path, mode);
}

SHIM_EXPORT FILE* freopen64(const char* path, const char* mode, FILE* stream) {
    LOAD(freopen64);
    if (path == NULL) return real_freopen64(path, mode, stream);
    forget_stream(stream);
    FOPEN_BODY(real_freopen64(path, mode, stream), path, mode);
}
