/* The dump shim's wrappers of writes, truncations, allocations and flushes
 * (dumpshim_internal.h says the pattern each follows). */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE

#include "dumpshim_internal.h"

REAL(fallocate);
REAL(fallocate64);
REAL(fdatasync);
REAL(fsync);
REAL(ftruncate);
REAL(ftruncate64);
REAL(posix_fallocate);
REAL(posix_fallocate64);
REAL(pwrite);
REAL(pwrite64);
REAL(pwritev);
REAL(pwritev2);
REAL(pwritev64);
REAL(pwritev64v2);
REAL(sync);
REAL(syncfs);
REAL(truncate);
REAL(truncate64);
REAL(write);
REAL(writev);

#define WRITE_BODY(real_call, fd, offset)                   \
    struct fd_call c = before_fd_call(fd, 1);              \
    if (!c.active) return real_call;                       \
    const int64_t at = offset;                             \
    const ssize_t done = real_call;                        \
    const int error = errno;                               \
    record_write(fd, c.call, at, done, error);             \
    unlock();                                              \
    errno = error;                                         \
    return done

static int64_t position(int fd) { return (int64_t)lseek(fd, 0, SEEK_CUR); }

SHIM_EXPORT ssize_t write(int fd, const void* bytes, size_t size) {
    LOAD(write);
    WRITE_BODY(real_write(fd, bytes, size), fd, position(fd));
}

SHIM_EXPORT ssize_t pwrite(int fd, const void* bytes, size_t size, off_t offset) {
    LOAD(pwrite);
    WRITE_BODY(real_pwrite(fd, bytes, size, offset), fd, (int64_t)offset);
}

SHIM_EXPORT ssize_t pwrite64(int fd, const void* bytes, size_t size, off64_t offset) {
    LOAD(pwrite64);
    WRITE_BODY(real_pwrite64(fd, bytes, size, offset), fd, (int64_t)offset);
}

SHIM_EXPORT ssize_t writev(int fd, const struct iovec* parts, int count) {
    LOAD(writev);
    WRITE_BODY(real_writev(fd, parts, count), fd, position(fd));
}

SHIM_EXPORT ssize_t pwritev(int fd, const struct iovec* parts, int count, off_t offset) {
    LOAD(pwritev);
    WRITE_BODY(real_pwritev(fd, parts, count, offset), fd, (int64_t)offset);
}

SHIM_EXPORT ssize_t pwritev64(int fd, const struct iovec* parts, int count, off64_t offset) {
    LOAD(pwritev64);
    WRITE_BODY(real_pwritev64(fd, parts, count, offset), fd, (int64_t)offset);
}

SHIM_EXPORT ssize_t pwritev2(int fd, const struct iovec* parts, int count, off_t offset, int flags) {
    LOAD(pwritev2);
    WRITE_BODY(real_pwritev2(fd, parts, count, offset, flags), fd, (int64_t)offset);
}

SHIM_EXPORT ssize_t pwritev64v2(int fd, const struct iovec* parts, int count, off64_t offset, int flags) {
    LOAD(pwritev64v2);
    WRITE_BODY(real_pwritev64v2(fd, parts, count, offset, flags), fd, (int64_t)offset);
}

/* Calls that change a file's size or allocation but write no bytes of
 * their own: recorded as writes of `length` bytes at `offset` (the model
 * needs only the file's content at a flush and at the crash). */
#define RESIZE_BODY(real_call, fd, at, size, kind)                        \
    struct fd_call c = before_fd_call(fd, 1);                                  \
    if (!c.active) return real_call;                                           \
    const int result = real_call;                                              \
    const int error = errno;                                                   \
    struct kvcheck_dumpshim_record header = record(kind, 0, fd, result == 0 ? 0 : error, c.call); \
    header.offset = (int64_t)(at);                                         \
    header.length = (int64_t)(size);                                         \
    emit(header, paths(shim_fds[fd].path, NULL));                              \
    unlock();                                                                  \
    errno = error;                                                             \
    return result

SHIM_EXPORT int ftruncate(int fd, off_t length) {
    LOAD(ftruncate);
    RESIZE_BODY(real_ftruncate(fd, length), fd, -1, length, KVCHECK_SHIM_TRUNCATE);
}

SHIM_EXPORT int ftruncate64(int fd, off64_t length) {
    LOAD(ftruncate64);
    RESIZE_BODY(real_ftruncate64(fd, length), fd, -1, length, KVCHECK_SHIM_TRUNCATE);
}

SHIM_EXPORT int fallocate(int fd, int mode, off_t offset, off_t length) {
    LOAD(fallocate);
    RESIZE_BODY(real_fallocate(fd, mode, offset, length), fd, offset, length, KVCHECK_SHIM_WRITE);
}

SHIM_EXPORT int fallocate64(int fd, int mode, off64_t offset, off64_t length) {
    LOAD(fallocate64);
    RESIZE_BODY(real_fallocate64(fd, mode, offset, length), fd, offset, length, KVCHECK_SHIM_WRITE);
}

/* posix_fallocate returns its error instead of setting errno. */
SHIM_EXPORT int posix_fallocate(int fd, off_t offset, off_t length) {
    LOAD(posix_fallocate);
    RESIZE_BODY(real_posix_fallocate(fd, offset, length), fd, offset, length, KVCHECK_SHIM_WRITE);
}

SHIM_EXPORT int posix_fallocate64(int fd, off64_t offset, off64_t length) {
    LOAD(posix_fallocate64);
    RESIZE_BODY(real_posix_fallocate64(fd, offset, length), fd, offset, length, KVCHECK_SHIM_WRITE);
}

#define TRUNCATE_PATH_BODY(real_call, path, size)                                    \
    char relative[PATH_MAX];                                                            \
    if (!armed() || !resolve(AT_FDCWD, path, relative)) return real_call;               \
    lock();                                                                             \
    const int64_t call = count_call();                                                  \
    const int result = real_call;                                                       \
    const int error = errno;                                                            \
    struct kvcheck_dumpshim_record header = record(KVCHECK_SHIM_TRUNCATE, 0, -1, result == 0 ? 0 : error, call); \
    header.length = (int64_t)(size);                                                  \
    emit(header, paths(relative, NULL));                                                \
    unlock();                                                                           \
    errno = error;                                                                      \
    return result

SHIM_EXPORT int truncate(const char* path, off_t length) {
    LOAD(truncate);
    TRUNCATE_PATH_BODY(real_truncate(path, length), path, length);
}

SHIM_EXPORT int truncate64(const char* path, off64_t length) {
    LOAD(truncate64);
    TRUNCATE_PATH_BODY(real_truncate64(path, length), path, length);
}

/* ---- flushes ---------------------------------------------------------------------------------- */

/* While armed, a flush of something under the directory is recorded, not
 * made: nobody cuts the power of a process the shim watches (the model
 * decides what a flush made durable), and a real flush costs milliseconds
 * of disk time per call. It succeeds, as a flush on a healthy disk does. */
SHIM_EXPORT int fsync(int fd) {
    LOAD(fsync);
    struct fd_call c = before_fd_call(fd, 1);
    if (!c.active) return real_fsync(fd);
    const int error = errno;
    record_flush(fd, 0, 0, c.call);
    unlock();
    errno = error;
    return 0;
}

SHIM_EXPORT int fdatasync(int fd) {
    LOAD(fdatasync);
    struct fd_call c = before_fd_call(fd, 1);
    if (!c.active) return real_fdatasync(fd);
    const int error = errno;
    record_flush(fd, 0, KVCHECK_SHIM_DATASYNC, c.call);
    unlock();
    errno = error;
    return 0;
}

/* After sync or syncfs: the content of every regular file under the
 * directory is durable, and so is every name. */
static void record_sync_under(const char* relative, int64_t call, int depth) {
    char path[PATH_MAX];
    full_path(relative, path);
    DIR* dir = opendir(path);
    if (dir == NULL || depth > 32) {
        if (dir) closedir(dir);
        return;
    }
    struct dirent* entry;
    while ((entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
        char child[PATH_MAX];
        if (relative[0] == '\0') {
            if (join(child, entry->d_name, "") != 0) continue;
        } else if (join(child, relative, entry->d_name) != 0) {
            continue;
        }
        if (is_directory(child)) {
            record_sync_under(child, call, depth + 1);
            continue;
        }
        uint64_t size = 0;
        char* content = content_of_path(child, &size);
        struct kvcheck_dumpshim_record header = record(KVCHECK_SHIM_SYNC_FILE, content ? 0 : KVCHECK_SHIM_NO_CONTENT, -1, 0, call);
        emit(header, (struct record_text){child, NULL, content, content ? size : 0});
        free(content);
    }
    closedir(dir);
}

static void record_sync(int64_t call) {
    record_sync_under("", call, 0);
    emit(record(KVCHECK_SHIM_SYNC_ALL, 0, -1, 0, call), paths(NULL, NULL));
}

SHIM_EXPORT void sync(void) {
    LOAD(sync);
    if (!armed()) {
        real_sync();
        return;
    }
    lock();
    const int64_t call = count_call();
    record_sync(call); /* recorded, not made: see fsync */
    unlock();
}

SHIM_EXPORT int syncfs(int fd) {
    LOAD(syncfs);
    struct stat target;
    struct stat dir;
    if (!armed() || fstat(fd, &target) != 0 || stat(shim.dir, &dir) != 0 || target.st_dev != dir.st_dev) {
        return real_syncfs(fd);
    }
    lock();
    const int64_t call = count_call();
    const int error = errno;
    record_sync(call); /* recorded, not made: see fsync */
    unlock();
    errno = error;
    return 0;
}
