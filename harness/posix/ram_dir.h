// Where files that only this machine's processes read go: $TMPDIR when it
// is set; else /dev/shm when it is a RAM-backed file system this process
// may write to; else the temporary directory. Dumps are written, fsynced,
// renamed and removed there, trace after trace: on a disk that was most of
// a run's system time (and of a test suite's wall time, waiting on the
// disk), and nothing is lost by memory, since power cuts are simulated
// from the calls the dump shim records (docs/durability.md), never from a
// disk. Used by kvcheck's job directories and the test binaries' TMPDIR.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

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

// A test binary's TMPDIR: unless one is given, a directory of this
// process's own under ram_backed_temp_dir(), removed when the object that
// made it goes (forked children leave with _exit and remove nothing).
// Whatever the tests write through TMPDIR (dumps, dump_kill's crash states,
// the thread level's dumps, kvcheck's job directories) then stays in RAM.
class RamTmpdir {
  public:
    RamTmpdir() {
        if (std::getenv("TMPDIR") != nullptr) return;
        std::string pattern = (ram_backed_temp_dir() / "kvcheck-tests-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) return;  // the default temporary directory, then
        path_ = pattern;
        ::setenv("TMPDIR", path_.c_str(), 1);
    }
    ~RamTmpdir() {
        if (path_.empty() || ::getpid() != owner_) return;
        std::error_code ignored;
        std::filesystem::remove_all(path_, ignored);
    }
    RamTmpdir(const RamTmpdir&) = delete;
    RamTmpdir& operator=(const RamTmpdir&) = delete;

  private:
    pid_t owner_ = ::getpid();
    std::string path_;
};

}  // namespace kvcheck::posix
