// Where files that only this machine's processes read go: $TMPDIR when it
// is set; else /dev/shm when it is a RAM-backed file system this process
// may write to; else the temporary directory. Dumps are written, fsynced,
// renamed and removed there, trace after trace: on a disk that was most of
// a run's system time (and of a test suite's wall time, waiting on the
// disk), and nothing is lost by memory, since power cuts are simulated
// from the calls the dump shim records (docs/durability.md), never from a
// disk. Used by kvcheck's job directories and the test binaries' scratch.
#pragma once

#include <cstdlib>
#include <filesystem>

#include <sys/statfs.h>
#include <unistd.h>

namespace kvcheck::posix {

inline std::filesystem::path ram_backed_temp_dir() {
    const char* chosen = std::getenv("TMPDIR");
    if (chosen != nullptr && *chosen != '\0') return std::filesystem::temp_directory_path();
    struct statfs info {};
    constexpr long tmpfs_magic = 0x01021994;  // linux/magic.h TMPFS_MAGIC
    if (::statfs("/dev/shm", &info) == 0 && static_cast<long>(info.f_type) == tmpfs_magic &&
        ::access("/dev/shm", W_OK | X_OK) == 0) {
        return "/dev/shm";
    }
    return std::filesystem::temp_directory_path();
}

}  // namespace kvcheck::posix
