/* The dump shim's wrappers of renames, removals, directories and links
 * (dumpshim_internal.h says the pattern each follows). */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE

#include "dumpshim_internal.h"

REAL(link);
REAL(linkat);
REAL(mkdir);
REAL(mkdirat);
REAL(remove);
REAL(rename);
REAL(renameat);
REAL(renameat2);
REAL(rmdir);
REAL(symlink);
REAL(symlinkat);
REAL(unlink);
REAL(unlinkat);

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
