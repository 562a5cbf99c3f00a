/* The dump shim (dumpshim.h says what it records and why). Every wrapper
 * follows one pattern: when the shim is not armed, or the call is not about
 * a file under the armed directory, it calls libc's function and nothing
 * else. Otherwise it takes the lock, counts the call if it is a kill point
 * (and dies there if it is the chosen one), makes the real call, writes the
 * record and returns the real call's result with its errno. */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE

#include "dumpshim.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* The fortify entry points of open, declared here because <fcntl.h>
 * declares them only when fortifying. */
int __open_2(const char* path, int flags);
int __open64_2(const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags);

#define SHIM_EXPORT __attribute__((visibility("default")))
/* Descriptors at or above this are not followed (the model then reports
 * the files it could not follow). */
#define SHIM_FDS_MAX 4096
/* Records up to this size are built on the stack. */
#define SHIM_STACK_RECORD 4096

/* ---- libc's functions ---------------------------------------------------- */

#define REAL(name) static __typeof__(name)* real_##name
/* memcpy, because ISO C has no conversion from dlsym's object pointer to a
 * function pointer. */
#define LOAD(name)                                                  \
    do {                                                            \
        if (real_##name == NULL) {                                  \
            void* symbol = dlsym(RTLD_NEXT, #name);                 \
            memcpy(&real_##name, &symbol, sizeof symbol);           \
        }                                                           \
    } while (0)

REAL(open);
REAL(open64);
REAL(openat);
REAL(openat64);
REAL(creat);
REAL(creat64);
REAL(__open_2);
REAL(__open64_2);
REAL(__openat_2);
REAL(__openat64_2);
REAL(fopen);
REAL(fopen64);
REAL(freopen);
REAL(freopen64);
REAL(write);
REAL(pwrite);
REAL(pwrite64);
REAL(writev);
REAL(pwritev);
REAL(pwritev64);
REAL(pwritev2);
REAL(pwritev64v2);
REAL(ftruncate);
REAL(ftruncate64);
REAL(truncate);
REAL(truncate64);
REAL(fallocate);
REAL(fallocate64);
REAL(posix_fallocate);
REAL(posix_fallocate64);
REAL(fsync);
REAL(fdatasync);
REAL(sync);
REAL(syncfs);
REAL(rename);
REAL(renameat);
REAL(renameat2);
REAL(unlink);
REAL(unlinkat);
REAL(remove);
REAL(mkdir);
REAL(mkdirat);
REAL(rmdir);
REAL(link);
REAL(linkat);
REAL(symlink);
REAL(symlinkat);
REAL(close);
REAL(fclose);
REAL(dup);
REAL(dup2);
REAL(dup3);

/* ---- state ------------------------------------------------------------------ */

static struct {
    int armed; /* read without the lock, atomically */
    char dir[PATH_MAX];
    size_t dir_size;
    char real_dir[PATH_MAX]; /* the same directory with symbolic links resolved */
    size_t real_dir_size;
    int log_fd;
    long long kill_at;
    long long calls;
} shim = {0, "", 0, "", 0, -1, -1, 0};

static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER;

/* What the shim knows of a descriptor under the directory. */
struct tracked_fd {
    char* path; /* relative to the directory; NULL: not followed */
    int directory;
    int writable;
    int sync; /* opened with O_SYNC or O_DSYNC: every write is flushed */
};
static struct tracked_fd shim_fds[SHIM_FDS_MAX];

static int armed(void) { return __atomic_load_n(&shim.armed, __ATOMIC_ACQUIRE); }

/* ---- paths -------------------------------------------------------------------- */

/* out = a "/" b (just a when b is empty); -1 (and out empty) when too long. */
static int join(char* out, const char* a, const char* b) {
    const size_t a_size = strlen(a);
    const size_t b_size = strlen(b);
    if (a_size + 1 + b_size >= PATH_MAX) {
        out[0] = '\0';
        return -1;
    }
    memcpy(out, a, a_size);
    size_t size = a_size;
    if (b_size > 0) {
        out[size++] = '/';
        memcpy(out + size, b, b_size);
        size += b_size;
    }
    out[size] = '\0';
    return 0;
}

/* Collapses "//", "/./" and "/../" in an absolute path, lexically. */
static void normalize(char* path) {
    unsigned short starts[PATH_MAX / 2]; /* where each kept component begins in out */
    char out[PATH_MAX];
    size_t size = 0;
    size_t depth = 0;
    const char* at = path;
    while (*at != '\0') {
        while (*at == '/') ++at;
        if (*at == '\0') break;
        const char* end = at;
        while (*end != '\0' && *end != '/') ++end;
        const size_t length = (size_t)(end - at);
        if (length == 2 && at[0] == '.' && at[1] == '.') {
            if (depth > 0) size = starts[--depth];
        } else if (!(length == 1 && at[0] == '.')) {
            starts[depth++] = (unsigned short)size;
            out[size++] = '/';
            memcpy(out + size, at, length);
            size += length;
        }
        at = end;
    }
    if (size == 0) out[size++] = '/';
    out[size] = '\0';
    memcpy(path, out, size + 1);
}

/* The absolute, normalized form of `path` as seen from `dirfd`; -1 when it
 * cannot be known or is too long. */
static int absolute_path(int dirfd, const char* path, char* out) {
    char base[PATH_MAX];
    if (path == NULL) return -1;
    if (path[0] == '/') {
        if (strlen(path) >= PATH_MAX) return -1;
        strcpy(out, path);
        normalize(out);
        return 0;
    }
    if (dirfd == AT_FDCWD) {
        if (getcwd(base, sizeof base) == NULL) return -1;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        const ssize_t size = readlink(link, base, sizeof base - 1);
        if (size < 0) return -1;
        base[size] = '\0';
    }
    if (path[0] == '\0' || join(out, base, path) != 0) return -1;
    normalize(out);
    return 0;
}

static const char* inside(const char* path, const char* dir, size_t size) {
    if (size == 0 || strncmp(path, dir, size) != 0) return NULL;
    if (path[size] == '\0') return path + size;
    if (path[size] == '/') return path + size + 1;
    return NULL;
}

/* Writes `path` relative to the armed directory into `relative` and
 * returns 1 when it lies under it (or is it); 0 otherwise. */
static int resolve(int dirfd, const char* path, char* relative) {
    char absolute[PATH_MAX];
    if (absolute_path(dirfd, path, absolute) != 0) return 0;
    const char* rest = inside(absolute, shim.dir, shim.dir_size);
    if (rest == NULL) rest = inside(absolute, shim.real_dir, shim.real_dir_size);
    if (rest == NULL) return 0;
    strcpy(relative, rest);
    return 1;
}

/* The absolute path of a name relative to the armed directory. */
static void full_path(const char* relative, char* out) { join(out, shim.dir, relative); }

/* ---- records ---------------------------------------------------------------------- */

static void write_all(int fd, const char* bytes, size_t size) {
    LOAD(write);
    while (size > 0) {
        const ssize_t done = real_write(fd, bytes, size);
        if (done < 0 && errno == EINTR) continue;
        if (done <= 0) return; /* the log is gone: nothing to record to */
        bytes += done;
        size -= (size_t)done;
    }
}

struct record_text {
    const char* path;
    const char* path2;
    const char* data;
    uint64_t data_size;
};

static void emit(struct kvcheck_dumpshim_record header, struct record_text text) {
    if (shim.log_fd < 0) return;
    const uint64_t path_size = text.path ? strlen(text.path) : 0;
    const uint64_t path2_size = text.path2 ? strlen(text.path2) : 0;
    header.path_size = path_size;
    header.path2_size = path2_size;
    header.data_size = text.data_size;
    header.size = sizeof header + path_size + path2_size + text.data_size;
    char stack[SHIM_STACK_RECORD];
    char* buffer = header.size <= sizeof stack ? stack : malloc(header.size);
    if (buffer == NULL) {
        /* No memory for the record: a record that says so keeps the log honest. */
        header.kind = KVCHECK_SHIM_UNMODELLED;
        header.size = sizeof header;
        header.path_size = header.path2_size = header.data_size = 0;
        write_all(shim.log_fd, (const char*)&header, sizeof header);
        return;
    }
    char* at = buffer;
    memcpy(at, &header, sizeof header);
    at += sizeof header;
    if (path_size) memcpy(at, text.path, path_size);
    at += path_size;
    if (path2_size) memcpy(at, text.path2, path2_size);
    at += path2_size;
    if (text.data_size) memcpy(at, text.data, text.data_size);
    write_all(shim.log_fd, buffer, header.size);
    if (buffer != stack) free(buffer);
}

static struct kvcheck_dumpshim_record record(uint16_t kind, uint16_t flags, int fd, int error, int64_t call) {
    struct kvcheck_dumpshim_record header;
    memset(&header, 0, sizeof header);
    header.kind = kind;
    header.flags = flags;
    header.fd = fd;
    header.error = error;
    header.call = call;
    header.offset = -1;
    return header;
}

static struct record_text paths(const char* path, const char* path2) {
    struct record_text text = {path, path2, NULL, 0};
    return text;
}

/* The whole content of the file open at `fd`, read through a new
 * descriptor (the caller's may be write-only); NULL when it cannot be read. */
static char* content_of_fd(int fd, uint64_t* size) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    LOAD(open);
    LOAD(close);
    const int reader = real_open(link, O_RDONLY | O_CLOEXEC);
    if (reader < 0) return NULL;
    struct stat info;
    char* bytes = NULL;
    if (fstat(reader, &info) == 0 && S_ISREG(info.st_mode)) {
        bytes = malloc(info.st_size > 0 ? (size_t)info.st_size : 1);
        uint64_t done = 0;
        while (bytes != NULL && done < (uint64_t)info.st_size) {
            const ssize_t n = pread(reader, bytes + done, (size_t)info.st_size - done, (off_t)done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break; /* shrank while read: what was read is what there is */
            done += (uint64_t)n;
        }
        *size = done;
    }
    real_close(reader);
    return bytes;
}

/* The content of the regular file at `relative`, or NULL. */
static char* content_of_path(const char* relative, uint64_t* size) {
    char path[PATH_MAX];
    full_path(relative, path);
    LOAD(open);
    LOAD(close);
    const int fd = real_open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return NULL;
    char* bytes = content_of_fd(fd, size);
    real_close(fd);
    return bytes;
}

static int is_directory(const char* relative) {
    char path[PATH_MAX];
    struct stat info;
    full_path(relative, path);
    return lstat(path, &info) == 0 && S_ISDIR(info.st_mode);
}

/* ---- kill points ------------------------------------------------------------------ */

/* Under the lock: the number of this counted call; the process ends here
 * if it is the one to kill at. */
static int64_t count_call(void) {
    const int64_t call = shim.calls++;
    if (shim.kill_at >= 0 && call == shim.kill_at) {
        emit(record(KVCHECK_SHIM_KILL, 0, -1, 0, call), paths(NULL, NULL));
        kill(getpid(), SIGKILL);
        for (;;) pause();
    }
    return call;
}

static void lock(void) { pthread_mutex_lock(&shim_lock); }
static void unlock(void) { pthread_mutex_unlock(&shim_lock); }

/* ---- descriptors ------------------------------------------------------------------ */

static void forget(int fd) {
    if (fd < 0 || fd >= SHIM_FDS_MAX) return;
    free(shim_fds[fd].path);
    memset(&shim_fds[fd], 0, sizeof shim_fds[fd]);
}

static void follow(int fd, const char* relative, int directory, int flags) {
    if (fd < 0 || fd >= SHIM_FDS_MAX) return;
    forget(fd);
    shim_fds[fd].path = strdup(relative);
    shim_fds[fd].directory = directory;
    shim_fds[fd].writable = (flags & O_ACCMODE) != O_RDONLY;
    shim_fds[fd].sync = (flags & (O_SYNC | O_DSYNC)) != 0;
}

/* Is `fd` open on something under the directory? A descriptor opened
 * before the shim was armed, or by a call it does not wrap, is looked up
 * once through /proc and followed from then on. */
static int followed(int fd) {
    if (fd < 0 || fd >= SHIM_FDS_MAX) return 0;
    if (shim_fds[fd].path != NULL) return 1;
    char link[64];
    char target[PATH_MAX];
    char relative[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t size = readlink(link, target, sizeof target - 1);
    if (size <= 0 || target[0] != '/') return 0;
    target[size] = '\0';
    if (!resolve(AT_FDCWD, target, relative)) return 0;
    struct stat info;
    const int directory = fstat(fd, &info) == 0 && S_ISDIR(info.st_mode);
    const int flags = fcntl(fd, F_GETFL);
    follow(fd, relative, directory, flags < 0 ? O_RDONLY : flags);
    return 1;
}

/* ---- the call patterns --------------------------------------------------------------- */

/* A call on a descriptor: when it is followed, the lock is held (and the
 * call counted if `counted`) until after_fd_call. */
struct fd_call {
    int active;
    int64_t call;
};

static struct fd_call before_fd_call(int fd, int counted) {
    struct fd_call c = {0, -1};
    if (!armed()) return c;
    lock();
    if (!followed(fd)) {
        unlock();
        return c;
    }
    c.active = 1;
    if (counted) c.call = count_call();
    return c;
}

static void record_flush(int fd, int error, uint16_t flags, int64_t call) {
    const struct tracked_fd* t = &shim_fds[fd];
    struct kvcheck_dumpshim_record header = record(KVCHECK_SHIM_FSYNC, flags, fd, error, call);
    struct record_text text = paths(t->path, NULL);
    char* content = NULL;
    if (t->directory) {
        header.flags |= KVCHECK_SHIM_DIRECTORY;
    } else if (error == 0) {
        uint64_t size = 0;
        content = content_of_fd(fd, &size);
        if (content == NULL) header.flags |= KVCHECK_SHIM_NO_CONTENT;
        text.data = content;
        text.data_size = content ? size : 0;
    }
    emit(header, text);
    free(content);
}

static void record_write(int fd, int64_t call, int64_t offset, ssize_t done, int error) {
    struct kvcheck_dumpshim_record header = record(KVCHECK_SHIM_WRITE, 0, fd, done < 0 ? error : 0, call);
    header.offset = offset;
    header.length = done < 0 ? 0 : done;
    emit(header, paths(shim_fds[fd].path, NULL));
    if (done >= 0 && shim_fds[fd].sync) record_flush(fd, 0, KVCHECK_SHIM_IMPLIED, -1);
}

/* An open of a path: when it lies under the directory, the lock is held
 * until after_open. */
struct open_call {
    int active;
    int existed;
    int64_t call;
    char relative[PATH_MAX];
};

static int changes_something(int flags) {
    return (flags & (O_CREAT | O_TRUNC)) != 0 || (flags & O_ACCMODE) != O_RDONLY;
}

static void before_open(struct open_call* c, int dirfd, const char* path, int flags) {
    c->active = 0;
    c->call = -1;
    if (!armed() || !resolve(dirfd, path, c->relative)) return;
    lock();
    c->active = 1;
    struct stat info;
    c->existed = fstatat(dirfd, path, &info, AT_SYMLINK_NOFOLLOW) == 0;
    if (changes_something(flags)) c->call = count_call();
}

static void after_open(struct open_call* c, int fd, int error, int flags) {
    if (!c->active) return;
    uint16_t record_flags = 0;
    if (fd >= 0) {
        struct stat info;
        const int directory = fstat(fd, &info) == 0 && S_ISDIR(info.st_mode);
        if (directory) record_flags |= KVCHECK_SHIM_DIRECTORY;
        if (!c->existed) record_flags |= KVCHECK_SHIM_CREATED;
        follow(fd, c->relative, directory, flags);
    }
    struct kvcheck_dumpshim_record header = record(KVCHECK_SHIM_OPEN, record_flags, fd, fd < 0 ? error : 0, c->call);
    header.open_flags = flags;
#ifdef O_TMPFILE
    if ((flags & O_TMPFILE) == O_TMPFILE) {
        header.kind = KVCHECK_SHIM_UNMODELLED;
        emit(header, (struct record_text){c->relative, NULL, "O_TMPFILE", 9});
        unlock();
        return;
    }
#endif
    emit(header, paths(c->relative, NULL));
    unlock();
}

static int needs_mode(int flags) {
#ifdef O_TMPFILE
    if ((flags & O_TMPFILE) == O_TMPFILE) return 1;
#endif
    return (flags & O_CREAT) != 0;
}

/* ---- open ------------------------------------------------------------------------------ */

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

/* ---- writes -------------------------------------------------------------------------------- */

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

/* ---- names ------------------------------------------------------------------------------------- */

enum rename_variant { plain_rename, rename_at, rename_at2 };

static int real_rename_call(enum rename_variant variant, int from_dir, const char* from, int to_dir, const char* to,
                            unsigned int flags) {
    switch (variant) {
        case plain_rename: LOAD(rename); return real_rename(from, to);
        case rename_at: LOAD(renameat); return real_renameat(from_dir, from, to_dir, to);
        default: LOAD(renameat2); return real_renameat2(from_dir, from, to_dir, to, flags);
    }
}

static int rename_call(enum rename_variant variant, int from_dir, const char* from, int to_dir, const char* to,
                       unsigned int flags) {
    char source[PATH_MAX];
    char target[PATH_MAX];
    if (!armed()) return real_rename_call(variant, from_dir, from, to_dir, to, flags);
    const int from_inside = resolve(from_dir, from, source);
    const int to_inside = resolve(to_dir, to, target);
    if (!from_inside && !to_inside) return real_rename_call(variant, from_dir, from, to_dir, to, flags);
    lock();
    const int64_t call = count_call();
    if (!from_inside || !to_inside) {
        const int result = real_rename_call(variant, from_dir, from, to_dir, to, flags);
        const int error = errno;
        const char* what = "a rename across the boundary of the dump directory";
        emit(record(KVCHECK_SHIM_UNMODELLED, 0, -1, result == 0 ? 0 : error, call),
             (struct record_text){from_inside ? source : "", to_inside ? target : "", what, strlen(what)});
        unlock();
        errno = error;
        return result;
    }
#ifdef RENAME_EXCHANGE
    const int exchange = (flags & RENAME_EXCHANGE) != 0;
#else
    const int exchange = 0;
#endif
    uint16_t record_flags = is_directory(source) ? KVCHECK_SHIM_DIRECTORY : 0;
    uint64_t size = 0;
    char* victim = exchange ? NULL : content_of_path(target, &size);
    if (victim != NULL) record_flags |= KVCHECK_SHIM_VICTIM;
    const int result = real_rename_call(variant, from_dir, from, to_dir, to, flags);
    const int error = errno;
    emit(record(exchange ? KVCHECK_SHIM_EXCHANGE : KVCHECK_SHIM_RENAME, record_flags, -1, result == 0 ? 0 : error, call),
         (struct record_text){source, target, victim, victim ? size : 0});
    free(victim);
    unlock();
    errno = error;
    return result;
}

SHIM_EXPORT int rename(const char* from, const char* to) { return rename_call(plain_rename, AT_FDCWD, from, AT_FDCWD, to, 0); }

SHIM_EXPORT int renameat(int from_dir, const char* from, int to_dir, const char* to) {
    return rename_call(rename_at, from_dir, from, to_dir, to, 0);
}

SHIM_EXPORT int renameat2(int from_dir, const char* from, int to_dir, const char* to, unsigned int flags) {
    return rename_call(rename_at2, from_dir, from, to_dir, to, flags);
}

enum remove_variant { plain_unlink, unlink_at, plain_remove, plain_rmdir };

static int real_remove_call(enum remove_variant variant, int dirfd, const char* path, int flags) {
    switch (variant) {
        case plain_unlink: LOAD(unlink); return real_unlink(path);
        case unlink_at: LOAD(unlinkat); return real_unlinkat(dirfd, path, flags);
        case plain_remove: LOAD(remove); return real_remove(path);
        default: LOAD(rmdir); return real_rmdir(path);
    }
}

static int remove_call(enum remove_variant variant, int dirfd, const char* path, int flags) {
    char relative[PATH_MAX];
    if (!armed() || !resolve(dirfd, path, relative)) return real_remove_call(variant, dirfd, path, flags);
    lock();
    const int64_t call = count_call();
    const int directory = is_directory(relative);
    uint64_t size = 0;
    char* victim = directory ? NULL : content_of_path(relative, &size);
    const int result = real_remove_call(variant, dirfd, path, flags);
    const int error = errno;
    uint16_t record_flags = directory ? KVCHECK_SHIM_DIRECTORY : 0;
    if (victim != NULL) record_flags |= KVCHECK_SHIM_VICTIM;
    emit(record(directory ? KVCHECK_SHIM_RMDIR : KVCHECK_SHIM_UNLINK, record_flags, -1, result == 0 ? 0 : error, call),
         (struct record_text){relative, NULL, victim, victim ? size : 0});
    free(victim);
    unlock();
    errno = error;
    return result;
}

SHIM_EXPORT int unlink(const char* path) { return remove_call(plain_unlink, AT_FDCWD, path, 0); }
SHIM_EXPORT int unlinkat(int dirfd, const char* path, int flags) { return remove_call(unlink_at, dirfd, path, flags); }
SHIM_EXPORT int remove(const char* path) { return remove_call(plain_remove, AT_FDCWD, path, 0); }
SHIM_EXPORT int rmdir(const char* path) { return remove_call(plain_rmdir, AT_FDCWD, path, 0); }

static int mkdir_call(int at, int dirfd, const char* path, mode_t mode) {
    char relative[PATH_MAX];
    LOAD(mkdir);
    LOAD(mkdirat);
    if (!armed() || !resolve(dirfd, path, relative)) return at ? real_mkdirat(dirfd, path, mode) : real_mkdir(path, mode);
    lock();
    const int64_t call = count_call();
    const int result = at ? real_mkdirat(dirfd, path, mode) : real_mkdir(path, mode);
    const int error = errno;
    emit(record(KVCHECK_SHIM_MKDIR, KVCHECK_SHIM_DIRECTORY, -1, result == 0 ? 0 : error, call), paths(relative, NULL));
    unlock();
    errno = error;
    return result;
}

SHIM_EXPORT int mkdir(const char* path, mode_t mode) { return mkdir_call(0, AT_FDCWD, path, mode); }
SHIM_EXPORT int mkdirat(int dirfd, const char* path, mode_t mode) { return mkdir_call(1, dirfd, path, mode); }

/* Links make a name the model cannot follow (two names, one file). */
static void record_link(const char* what, int new_dir, const char* name, int result, int error, int64_t call) {
    char relative[PATH_MAX];
    if (!resolve(new_dir, name, relative)) relative[0] = '\0';
    emit(record(KVCHECK_SHIM_UNMODELLED, 0, -1, result == 0 ? 0 : error, call), (struct record_text){relative, NULL, what, strlen(what)});
}

#define LINK_BODY(real_call, new_dir, name, what)                                          \
    char relative[PATH_MAX];                                                                \
    if (!armed() || !resolve(new_dir, name, relative)) return real_call;                    \
    lock();                                                                                 \
    const int64_t call = count_call();                                                      \
    const int result = real_call;                                                           \
    const int error = errno;                                                                \
    record_link(what, new_dir, name, result, error, call);                                  \
    unlock();                                                                               \
    errno = error;                                                                          \
    return result

SHIM_EXPORT int link(const char* from, const char* to) {
    LOAD(link);
    LINK_BODY(real_link(from, to), AT_FDCWD, to, "a hard link");
}

SHIM_EXPORT int linkat(int from_dir, const char* from, int to_dir, const char* to, int flags) {
    LOAD(linkat);
    LINK_BODY(real_linkat(from_dir, from, to_dir, to, flags), to_dir, to, "a hard link");
}

SHIM_EXPORT int symlink(const char* target, const char* name) {
    LOAD(symlink);
    LINK_BODY(real_symlink(target, name), AT_FDCWD, name, "a symbolic link");
}

SHIM_EXPORT int symlinkat(const char* target, int dirfd, const char* name) {
    LOAD(symlinkat);
    LINK_BODY(real_symlinkat(target, dirfd, name), dirfd, name, "a symbolic link");
}

/* ---- descriptors ending and copied ---------------------------------------------------------------- */

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

/* ---- arming -------------------------------------------------------------------------------------- */

SHIM_EXPORT int kvcheck_dumpshim_arm(const char* dir, int log_fd, long long kill_at) {
    char absolute[PATH_MAX];
    char real[PATH_MAX];
    struct stat info;
    if (absolute_path(AT_FDCWD, dir, absolute) != 0) return -1;
    if (stat(absolute, &info) != 0 || !S_ISDIR(info.st_mode)) return -1;
    if (realpath(absolute, real) == NULL) return -1;
    lock();
    __atomic_store_n(&shim.armed, 0, __ATOMIC_RELEASE);
    for (int fd = 0; fd < SHIM_FDS_MAX; ++fd) forget(fd);
    strcpy(shim.dir, absolute);
    shim.dir_size = strlen(absolute);
    strcpy(shim.real_dir, real);
    shim.real_dir_size = strlen(real);
    shim.log_fd = log_fd;
    shim.kill_at = kill_at;
    shim.calls = 0;
    __atomic_store_n(&shim.armed, 1, __ATOMIC_RELEASE);
    unlock();
    return 0;
}

SHIM_EXPORT void kvcheck_dumpshim_disarm(void) {
    lock();
    __atomic_store_n(&shim.armed, 0, __ATOMIC_RELEASE);
    for (int fd = 0; fd < SHIM_FDS_MAX; ++fd) forget(fd);
    shim.log_fd = -1;
    shim.kill_at = -1;
    unlock();
}

SHIM_EXPORT long long kvcheck_dumpshim_calls(void) {
    lock();
    const long long calls = shim.calls;
    unlock();
    return calls;
}

/* Preloaded into a program (LD_PRELOAD): armed from the environment, which
 * is then cleared, so that the programs it starts are not armed too. */
__attribute__((constructor)) static void arm_from_environment(void) {
    const char* dir = getenv("KVCHECK_DUMPSHIM_DIR");
    const char* log = getenv("KVCHECK_DUMPSHIM_LOG_FD");
    if (dir == NULL || log == NULL) return;
    const char* kill_at = getenv("KVCHECK_DUMPSHIM_KILL_AT");
    char dir_copy[PATH_MAX];
    snprintf(dir_copy, sizeof dir_copy, "%s", dir);
    const int log_fd = atoi(log);
    const long long kill = kill_at ? atoll(kill_at) : -1;
    unsetenv("KVCHECK_DUMPSHIM_DIR");
    unsetenv("KVCHECK_DUMPSHIM_LOG_FD");
    unsetenv("KVCHECK_DUMPSHIM_KILL_AT");
    kvcheck_dumpshim_arm(dir_copy, log_fd, kill);
}
