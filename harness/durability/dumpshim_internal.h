/* What the files of the dump shim share (dumpshim.h says what the shim
 * records and why): its state, the helpers of dumpshim_core.c, and the
 * pattern every wrapper follows. Every wrapper, in dumpshim_open.c,
 * dumpshim_write.c, dumpshim_names.c and dumpshim_close.c: when the shim
 * is not armed, or the call is not about a file under the armed directory,
 * it calls libc's function and nothing else. Otherwise it takes the lock,
 * counts the call if it is a kill point (and dies there if it is the
 * chosen one), makes the real call, writes the record and returns the real
 * call's result with its errno.
 *
 * Each source file defines _GNU_SOURCE and undefines _FORTIFY_SOURCE
 * before any include. Symbols are hidden (the target's visibility preset)
 * but for the wrappers and the arming functions (SHIM_EXPORT). */
#pragma once

#include "dumpshim.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define SHIM_EXPORT __attribute__((visibility("default")))
/* Descriptors at or above this are not followed (the model then reports
 * the files it could not follow). */
#define SHIM_FDS_MAX 4096
/* Records up to this size are built on the stack. */
#define SHIM_STACK_RECORD 4096

/* ---- libc's functions ---------------------------------------------------- */

/* Each file declares the libc functions it calls, REAL(write), and loads
 * one before its first use, LOAD(write); real_write(...) then calls libc's. */
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

/* ---- state ------------------------------------------------------------------ */

struct shim_state {
    int armed; /* read without the lock, atomically */
    char dir[PATH_MAX];
    size_t dir_size;
    char real_dir[PATH_MAX]; /* the same directory with symbolic links resolved */
    size_t real_dir_size;
    int log_fd;
    long long kill_at;
    long long calls;
};
extern struct shim_state shim;

/* What the shim knows of a descriptor under the directory. */
struct tracked_fd {
    char* path; /* relative to the directory; NULL: not followed */
    int directory;
    int writable;
    int sync; /* opened with O_SYNC or O_DSYNC: every write is flushed */
};
extern struct tracked_fd shim_fds[SHIM_FDS_MAX];

int armed(void);
void lock(void);
void unlock(void);

/* ---- paths ------------------------------------------------------------------ */

/* out = a "/" b (just a when b is empty); -1 (and out empty) when too long. */
int join(char* out, const char* a, const char* b);
/* Writes `path` relative to the armed directory into `relative` and
 * returns 1 when it lies under it (or is it); 0 otherwise. */
int resolve(int dirfd, const char* path, char* relative);
/* The absolute path of a name relative to the armed directory. */
void full_path(const char* relative, char* out);

/* ---- records ------------------------------------------------------------------ */

struct record_text {
    const char* path;
    const char* path2;
    const char* data;
    uint64_t data_size;
};

void emit(struct kvcheck_dumpshim_record header, struct record_text text);
struct kvcheck_dumpshim_record record(uint16_t kind, uint16_t flags, int fd, int error, int64_t call);
struct record_text paths(const char* path, const char* path2);
/* The whole content of the file open at `fd`, read through a new
 * descriptor (the caller's may be write-only); NULL when it cannot be read. */
char* content_of_fd(int fd, uint64_t* size);
/* The content of the regular file at `relative`, or NULL. */
char* content_of_path(const char* relative, uint64_t* size);
int is_directory(const char* relative);

/* Under the lock: the number of this counted call; the process ends here
 * if it is the one to kill at. */
int64_t count_call(void);

/* ---- descriptors ------------------------------------------------------------------ */

void forget(int fd);
void follow(int fd, const char* relative, int directory, int flags);
/* Is `fd` open on something under the directory? A descriptor opened
 * before the shim was armed, or by a call it does not wrap, is looked up
 * once through /proc and followed from then on. */
int followed(int fd);

/* ---- the call patterns --------------------------------------------------------------- */

/* A call on a descriptor: when it is followed, the lock is held (and the
 * call counted if `counted`) until the caller unlocks. */
struct fd_call {
    int active;
    int64_t call;
};
struct fd_call before_fd_call(int fd, int counted);
void record_flush(int fd, int error, uint16_t flags, int64_t call);
void record_write(int fd, int64_t call, int64_t offset, ssize_t done, int error);

/* An open of a path: when it lies under the directory, the lock is held
 * until after_open. */
struct open_call {
    int active;
    int existed;
    int64_t call;
    char relative[PATH_MAX];
};
void before_open(struct open_call* c, int dirfd, const char* path, int flags);
void after_open(struct open_call* c, int fd, int error, int flags);
int needs_mode(int flags);
