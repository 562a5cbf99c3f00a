/* The dump shim's core (dumpshim_internal.h): its state, paths, records,
 * kill points, the descriptors it follows, the patterns of its calls, and
 * arming. The wrappers of libc's calls are in dumpshim_open.c,
 * dumpshim_write.c, dumpshim_names.c and dumpshim_close.c. */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE

#include "dumpshim_internal.h"

REAL(write);
REAL(open);
REAL(close);

/* ---- state ------------------------------------------------------------------ */

struct shim_state shim = {0, "", 0, "", 0, -1, -1, 0};

static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER;

struct tracked_fd shim_fds[SHIM_FDS_MAX];

int armed(void) { return __atomic_load_n(&shim.armed, __ATOMIC_ACQUIRE); }
/* ---- paths -------------------------------------------------------------------- */

/* out = a "/" b (just a when b is empty); -1 (and out empty) when too long. */
int join(char* out, const char* a, const char* b) {
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
int resolve(int dirfd, const char* path, char* relative) {
    char absolute[PATH_MAX];
    if (absolute_path(dirfd, path, absolute) != 0) return 0;
    const char* rest = inside(absolute, shim.dir, shim.dir_size);
    if (rest == NULL) rest = inside(absolute, shim.real_dir, shim.real_dir_size);
    if (rest == NULL) return 0;
    strcpy(relative, rest);
    return 1;
}

/* The absolute path of a name relative to the armed directory. */
void full_path(const char* relative, char* out) { join(out, shim.dir, relative); }

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


void emit(struct kvcheck_dumpshim_record header, struct record_text text) {
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

struct kvcheck_dumpshim_record record(uint16_t kind, uint16_t flags, int fd, int error, int64_t call) {
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

struct record_text paths(const char* path, const char* path2) {
    struct record_text text = {path, path2, NULL, 0};
    return text;
}

/* The whole content of the file open at `fd`, read through a new
 * descriptor (the caller's may be write-only); NULL when it cannot be read. */
char* content_of_fd(int fd, uint64_t* size) {
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
char* content_of_path(const char* relative, uint64_t* size) {
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

int is_directory(const char* relative) {
    char path[PATH_MAX];
    struct stat info;
    full_path(relative, path);
    return lstat(path, &info) == 0 && S_ISDIR(info.st_mode);
}

/* ---- kill points ------------------------------------------------------------------ */

/* Under the lock: the number of this counted call; the process ends here
 * if it is the one to kill at. */
int64_t count_call(void) {
    const int64_t call = shim.calls++;
    if (shim.kill_at >= 0 && call == shim.kill_at) {
        emit(record(KVCHECK_SHIM_KILL, 0, -1, 0, call), paths(NULL, NULL));
        kill(getpid(), SIGKILL);
        for (;;) pause();
    }
    return call;
}

void lock(void) { pthread_mutex_lock(&shim_lock); }
void unlock(void) { pthread_mutex_unlock(&shim_lock); }

/* ---- descriptors ------------------------------------------------------------------ */

void forget(int fd) {
    if (fd < 0 || fd >= SHIM_FDS_MAX) return;
    free(shim_fds[fd].path);
    memset(&shim_fds[fd], 0, sizeof shim_fds[fd]);
}

void follow(int fd, const char* relative, int directory, int flags) {
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
int followed(int fd) {
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


struct fd_call before_fd_call(int fd, int counted) {
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

void record_flush(int fd, int error, uint16_t flags, int64_t call) {
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

void record_write(int fd, int64_t call, int64_t offset, ssize_t done, int error) {
    struct kvcheck_dumpshim_record header = record(KVCHECK_SHIM_WRITE, 0, fd, done < 0 ? error : 0, call);
    header.offset = offset;
    header.length = done < 0 ? 0 : done;
    emit(header, paths(shim_fds[fd].path, NULL));
    if (done >= 0 && shim_fds[fd].sync) record_flush(fd, 0, KVCHECK_SHIM_IMPLIED, -1);
}


static int changes_something(int flags) {
    return (flags & (O_CREAT | O_TRUNC)) != 0 || (flags & O_ACCMODE) != O_RDONLY;
}

void before_open(struct open_call* c, int dirfd, const char* path, int flags) {
    c->active = 0;
    c->call = -1;
    if (!armed() || !resolve(dirfd, path, c->relative)) return;
    lock();
    c->active = 1;
    struct stat info;
    c->existed = fstatat(dirfd, path, &info, AT_SYMLINK_NOFOLLOW) == 0;
    if (changes_something(flags)) c->call = count_call();
}

void after_open(struct open_call* c, int fd, int error, int flags) {
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

int needs_mode(int flags) {
#ifdef O_TMPFILE
    if ((flags & O_TMPFILE) == O_TMPFILE) return 1;
#endif
    return (flags & O_CREAT) != 0;
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
