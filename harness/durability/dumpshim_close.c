/* The dump shim's wrappers of descriptors ending (close, fclose) and copied (dup)
 * (dumpshim_internal.h says the pattern each follows). */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE

#include "dumpshim_internal.h"

REAL(close);
REAL(dup);
REAL(dup2);
REAL(dup3);
REAL(fclose);

/* Under the lock, for a followed descriptor about to be closed. */
static int64_t before_close(int fd) {
    return shim_fds[fd].writable ? count_call() : -1;
}

static void after_close(int fd, int64_t call, int result, int error) {
    emit(record(KVCHECK_SHIM_CLOSE, shim_fds[fd].directory ? KVCHECK_SHIM_DIRECTORY : 0, fd, result == 0 ? 0 : error, call),
         paths(shim_fds[fd].path, NULL));
    forget(fd);
}

static int is_followed_now(int fd) { return fd >= 0 && fd < SHIM_FDS_MAX && shim_fds[fd].path != NULL; }

SHIM_EXPORT int close(int fd) {
    LOAD(close);
    if (!armed()) return real_close(fd);
    lock();
    if (!is_followed_now(fd)) {
        unlock();
        return real_close(fd);
    }
    const int64_t call = before_close(fd);
    const int result = real_close(fd);
    const int error = errno;
    after_close(fd, call, result, error);
    unlock();
    errno = error;
    return result;
}

SHIM_EXPORT int fclose(FILE* stream) {
    LOAD(fclose);
    if (!armed() || stream == NULL) return real_fclose(stream);
    const int fd = fileno(stream);
    lock();
    if (!is_followed_now(fd)) {
        unlock();
        return real_fclose(stream);
    }
    const int64_t call = before_close(fd);
    const int result = real_fclose(stream);
    const int error = errno;
    after_close(fd, call, result, error);
    unlock();
    errno = error;
    return result;
}

static void record_dup(int from, int to) {
    if (from == to) return; /* dup2(fd, fd) changes nothing */
    struct tracked_fd source = shim_fds[from];
    if (is_followed_now(to)) after_close(to, -1, 0, 0);
    if (to < 0 || to >= SHIM_FDS_MAX) return;
    follow(to, source.path, source.directory, source.writable ? O_RDWR : O_RDONLY);
    shim_fds[to].sync = source.sync;
    struct kvcheck_dumpshim_record header = record(KVCHECK_SHIM_DUP, 0, to, 0, -1);
    header.offset = from;
    emit(header, paths(source.path, NULL));
}

#define DUP_BODY(real_call, from)                         \
    struct fd_call c = before_fd_call(from, 0);           \
    if (!c.active) return real_call;                      \
    const int copy = real_call;                             \
    const int error = errno;                              \
    if (copy >= 0) record_dup(from, copy);                    \
    unlock();                                             \
    errno = error;                                        \
    return copy

SHIM_EXPORT int dup(int fd) {
    LOAD(dup);
    DUP_BODY(real_dup(fd), fd);
}

SHIM_EXPORT int dup2(int fd, int to) {
    LOAD(dup2);
    DUP_BODY(real_dup2(fd, to), fd);
}

SHIM_EXPORT int dup3(int fd, int to, int flags) {
    LOAD(dup3);
    DUP_BODY(real_dup3(fd, to, flags), fd);
}
