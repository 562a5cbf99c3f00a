/* The dump shim's wrapper of syscall(2): a file call made through it
 * bypasses every other wrapper, so the model cannot follow it. While armed,
 * one that touches the directory (a descriptor followed, a path under it)
 * is recorded as a call the model does not follow, naming it
 * ("syscall(SYS_fsync)"), and is made as it was asked: the harness then
 * reports the dump as one it cannot judge (an engine error naming the
 * call), never as a dump that lost its data (docs/durability.md). */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE

#include "dumpshim_internal.h"

#include <stdarg.h>
#include <sys/syscall.h>

REAL(syscall);

/* What a file call gets from its arguments: 1 a descriptor first,
 * 2 a path first, 3 a directory descriptor and a path, 4 nothing (sync). */
struct file_syscall {
    long number;
    const char* name;
    int shape;
};

static const struct file_syscall file_syscalls[] = {
    {SYS_write, "SYS_write", 1},
    {SYS_pwrite64, "SYS_pwrite64", 1},
    {SYS_writev, "SYS_writev", 1},
    {SYS_pwritev, "SYS_pwritev", 1},
    {SYS_pwritev2, "SYS_pwritev2", 1},
    {SYS_fsync, "SYS_fsync", 1},
    {SYS_fdatasync, "SYS_fdatasync", 1},
    {SYS_sync_file_range, "SYS_sync_file_range", 1},
    {SYS_syncfs, "SYS_syncfs", 1},
    {SYS_ftruncate, "SYS_ftruncate", 1},
    {SYS_fallocate, "SYS_fallocate", 1},
    {SYS_truncate, "SYS_truncate", 2},
#ifdef SYS_open
    {SYS_open, "SYS_open", 2},
    {SYS_creat, "SYS_creat", 2},
    {SYS_rename, "SYS_rename", 2},
    {SYS_unlink, "SYS_unlink", 2},
    {SYS_mkdir, "SYS_mkdir", 2},
    {SYS_rmdir, "SYS_rmdir", 2},
    {SYS_link, "SYS_link", 2},
    {SYS_symlink, "SYS_symlink", 2},
#endif
    {SYS_openat, "SYS_openat", 3},
    {SYS_renameat, "SYS_renameat", 3},
    {SYS_renameat2, "SYS_renameat2", 3},
    {SYS_unlinkat, "SYS_unlinkat", 3},
    {SYS_mkdirat, "SYS_mkdirat", 3},
    {SYS_linkat, "SYS_linkat", 3},
    {SYS_sync, "SYS_sync", 4},
};

/* The file call `number` with `args`, when it touches the armed
 * directory; NULL otherwise. `relative` gets the name it touches. */
static const struct file_syscall* touches_directory(long number, const long* args, char* relative) {
    for (size_t i = 0; i < sizeof file_syscalls / sizeof file_syscalls[0]; ++i) {
        const struct file_syscall* call = &file_syscalls[i];
        if (call->number != number) continue;
        relative[0] = '\0';
        switch (call->shape) {
            case 1: {
                const int fd = (int)args[0];
                if (!followed(fd)) return NULL;
                if (fd < SHIM_FDS_MAX && shim_fds[fd].path != NULL) {
                    if (join(relative, shim_fds[fd].path, "") != 0) relative[0] = '\0';
                }
                return call;
            }
            case 2: return resolve(AT_FDCWD, (const char*)args[0], relative) ? call : NULL;
            case 3: return resolve((int)args[0], (const char*)args[1], relative) ? call : NULL;
            default: return call;
        }
    }
    return NULL;
}

/* The arguments are read as six longs, as glibc's own syscall() reads
 * them: the registers of a call that passed fewer hold whatever they held. */
SHIM_EXPORT long syscall(long number, ...) {
    LOAD(syscall);
    va_list list;
    va_start(list, number);
    long args[6];
    for (int i = 0; i < 6; ++i) args[i] = va_arg(list, long);
    va_end(list);
    char relative[PATH_MAX];
    const struct file_syscall* call = armed() ? touches_directory(number, args, relative) : NULL;
    if (call == NULL) return real_syscall(number, args[0], args[1], args[2], args[3], args[4], args[5]);
    lock();
    const int64_t counted = count_call();
    const long result = real_syscall(number, args[0], args[1], args[2], args[3], args[4], args[5]);
    const int error = errno;
    char what[64];
    snprintf(what, sizeof what, "syscall(%s)", call->name);
    emit(record(KVCHECK_SHIM_UNMODELLED, 0, -1, result < 0 ? error : 0, counted),
         (struct record_text){relative, NULL, what, strlen(what)});
    unlock();
    errno = error;
    return result;
}
