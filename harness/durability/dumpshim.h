/* The dump shim: records what a process does to the files under one
 * directory, at the system-call boundary, and can kill the process (SIGKILL)
 * just before its n-th such call. kvcheck's durability checks (dump_kill,
 * harness/durability/) read the record and construct the directory states a
 * power cut could leave, as crash-consistency checkers such as ALICE and
 * LazyFS do.
 *
 * How it gets into a process. The shim is a shared library that defines
 * open, write, fsync, rename and the rest. Interposition is ELF symbol
 * lookup: a definition in a library that comes before libc in the global
 * lookup scope wins for every caller (the executable, libstdc++, libtorch, a
 * dlopen'ed plugin). Two ways put it there:
 *   - linked into the executable (kvcheck and everything that links the
 *     harness does): the shim is inert, every call passes straight to libc,
 *     until kvcheck_dumpshim_arm() arms it, in a child forked to dump;
 *   - LD_PRELOAD=libkvcheck_dumpshim.so at exec, for an engine that runs as
 *     a program of its own (a Python engine): the constructor arms it from
 *     the environment (KVCHECK_DUMPSHIM_DIR, KVCHECK_DUMPSHIM_LOG_FD and
 *     optionally KVCHECK_DUMPSHIM_KILL_AT), or the program arms it later by
 *     calling kvcheck_dumpshim_arm (ctypes, for instance). kvcheck preloads
 *     it into every adapter process it starts; the Python SDK arms it in
 *     the copy a dump_fork request makes (docs/protocol.md section 10a).
 *     Preloaded into programs without a sanitizer runtime, it is built
 *     without sanitizers in every build.
 *
 * What it records, while armed: every call below on a path under the armed
 * directory, or on a descriptor opened on one: open, open64, openat,
 * openat64, creat, creat64 and their _2 fortify forms, fopen, fopen64,
 * freopen, write, pwrite, pwrite64, writev, pwritev, pwritev2, ftruncate,
 * truncate, fallocate, posix_fallocate, fsync, fdatasync, sync, syncfs,
 * rename, renameat, renameat2, unlink, unlinkat, remove, mkdir, mkdirat,
 * rmdir, link, linkat, symlink, symlinkat, close, fclose, dup, dup2, dup3.
 * Each record is written to the log descriptor with one write(2), as the
 * call returns, so a kill leaves whole records of every call that ran.
 * With a record of an fsync or fdatasync of a file goes the file's whole
 * content right after it (what that call made durable); with a rename over
 * a file, or an unlink, the content of the file whose name goes. While
 * armed, flushes (fsync, fdatasync, sync, syncfs) of what is under the
 * directory are recorded and succeed without reaching the disk: nobody cuts
 * the power of a watched process, the model decides what a flush made
 * durable, and a real flush costs milliseconds.
 *
 * Counted calls (the kill points): those that change or flush something:
 * an open that may create, truncate or write, every write, truncate and
 * allocation, fsync, fdatasync, sync, syncfs, every change of a name, and
 * the close of a descriptor opened for writing. Counted from 0 in the order
 * they are made; with kill_at = n the process kills itself just before
 * counted call n runs, so exactly n counted calls have completed.
 *
 * The power-cut model built on the record (docs/durability.md says the same,
 * with examples; harness/durability/power_cut.h constructs it):
 *   1. When the dump starts, the dump directory exists and everything in it
 *      is durable.
 *   2. A file's durable content is its content at its last fsync or
 *      fdatasync (or its last write, on a descriptor opened with O_SYNC or
 *      O_DSYNC; or a sync or syncfs); a file not flushed since the dump
 *      started keeps its content from before (a file the dump created: no
 *      bytes). Whatever was written after that may be lost: a power cut
 *      leaves the durable content ("lost"), or the durable content resized
 *      to the file's size at the crash, unflushed bytes read as zeros
 *      ("size-only"), or everything ("kept").
 *   3. Creating, renaming or removing a name (an open that creates a file,
 *      mkdir, rename, unlink, rmdir) is durable once the directory holding
 *      the name has been fsynced after it (for a rename between two
 *      directories, both). fsync of a file does not make its name durable;
 *      sync and syncfs make every name durable.
 *   4. Name changes that are not durable survive a power cut as a prefix of
 *      the order they were made in, as a journaling file system commits
 *      them: none, the first, the first two, ..., all of them.
 *   5. Not modelled (the harness reports a dump it cannot follow, never a
 *      verdict on it): writes through mmap and msync, system calls made
 *      without libc's exported functions (syscall(2), io_uring), hard and
 *      symbolic links and O_TMPFILE, a rename into the directory from
 *      outside it or out of it. Writes through stdio (fwrite) are not kill
 *      points, but their data counts once fsynced. Metadata other than size
 *      (modes, times) is not tracked; every file of a state gets the same
 *      one of the three data outcomes.
 *
 * Threads: calls are recorded and counted under one lock, in the order
 * they are made; a dump that writes from several threads at once has kill
 * points that are not reproducible.
 */
#ifndef KVCHECK_DUMPSHIM_H
#define KVCHECK_DUMPSHIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum kvcheck_dumpshim_kind {
    KVCHECK_SHIM_OPEN = 1,     /* path; fd: the descriptor made; flags: CREATED, DIRECTORY */
    KVCHECK_SHIM_WRITE,        /* fd, offset (-1: the file position), length: bytes written */
    KVCHECK_SHIM_TRUNCATE,     /* fd (or path, fd -1), length: the new size */
    KVCHECK_SHIM_FSYNC,        /* fd; flags: DIRECTORY, DATASYNC, IMPLIED; data: the file's content */
    KVCHECK_SHIM_RENAME,       /* path -> path2; flags: VICTIM (data: the replaced file's content) */
    KVCHECK_SHIM_EXCHANGE,     /* renameat2 RENAME_EXCHANGE of path and path2 */
    KVCHECK_SHIM_UNLINK,       /* path; flags: VICTIM (data: its content) */
    KVCHECK_SHIM_MKDIR,        /* path */
    KVCHECK_SHIM_RMDIR,        /* path */
    KVCHECK_SHIM_CLOSE,        /* fd */
    KVCHECK_SHIM_DUP,          /* fd: the new descriptor; offset: the old one */
    KVCHECK_SHIM_SYNC_FILE,    /* sync or syncfs: one per regular file, path and content */
    KVCHECK_SHIM_SYNC_ALL,     /* after those: every name is durable */
    KVCHECK_SHIM_UNMODELLED,   /* a call the model cannot follow: path, path2; data: what it was */
    KVCHECK_SHIM_KILL          /* the process kills itself before counted call `call` */
};

enum kvcheck_dumpshim_flag {
    KVCHECK_SHIM_CREATED = 1,     /* the open created the file */
    KVCHECK_SHIM_DIRECTORY = 2,   /* the descriptor or path is a directory */
    KVCHECK_SHIM_VICTIM = 4,      /* data holds the content of the file whose name went */
    KVCHECK_SHIM_DATASYNC = 8,    /* fdatasync, not fsync */
    KVCHECK_SHIM_IMPLIED = 16,    /* a write on an O_SYNC or O_DSYNC descriptor */
    KVCHECK_SHIM_NO_CONTENT = 32  /* the content could not be read (data is empty) */
};

/* One record; path, path2 and data follow it, in that order. Paths are
 * relative to the armed directory ("" is the directory itself). */
struct kvcheck_dumpshim_record {
    uint64_t size; /* of the whole record: this header, the paths and data */
    uint16_t kind;
    uint16_t flags;
    int32_t fd;
    int32_t error;   /* 0: the call succeeded; else its errno */
    int32_t open_flags;
    int64_t call;    /* its number among the counted calls; -1: not counted */
    int64_t offset;
    int64_t length;
    uint64_t path_size;
    uint64_t path2_size;
    uint64_t data_size;
};

/* Arms the shim: records calls on files under `dir` to `log_fd` and, when
 * kill_at >= 0, kills the process just before counted call kill_at. The
 * count starts again from 0. Returns 0, or -1 when `dir` is not an existing
 * directory or its path is too long. */
int kvcheck_dumpshim_arm(const char* dir, int log_fd, long long kill_at);
void kvcheck_dumpshim_disarm(void);
/* The counted calls made since the shim was last armed. */
long long kvcheck_dumpshim_calls(void);

#ifdef __cplusplus
}
#endif

#endif /* KVCHECK_DUMPSHIM_H */
