// The dump shim's record (dumpshim.h), read back as one event per call.
//
//   std::vector<ShimEvent> events = read_shim_log(bytes);   // a torn last record is dropped
//   for (const ShimEvent& e : events) std::cout << describe(e) << "\n";   // rename "a.tmp" -> "a"
#pragma once

#include "durability/dumpshim.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck::durability {

enum class Call : std::uint16_t {
    open = KVCHECK_SHIM_OPEN,
    write = KVCHECK_SHIM_WRITE,
    truncate = KVCHECK_SHIM_TRUNCATE,
    fsync = KVCHECK_SHIM_FSYNC,
    rename = KVCHECK_SHIM_RENAME,
    exchange = KVCHECK_SHIM_EXCHANGE,
    unlink = KVCHECK_SHIM_UNLINK,
    mkdir = KVCHECK_SHIM_MKDIR,
    rmdir = KVCHECK_SHIM_RMDIR,
    close = KVCHECK_SHIM_CLOSE,
    dup = KVCHECK_SHIM_DUP,
    sync_file = KVCHECK_SHIM_SYNC_FILE,
    sync_all = KVCHECK_SHIM_SYNC_ALL,
    unmodelled = KVCHECK_SHIM_UNMODELLED,
    kill = KVCHECK_SHIM_KILL,
};

struct ShimEvent {
    Call kind = Call::open;
    std::uint16_t flags = 0;
    int fd = -1;
    int error = 0;  // 0: the call succeeded
    int open_flags = 0;
    std::int64_t call = -1;  // its number among the counted calls (the kill points); -1: not counted
    std::int64_t offset = -1;
    std::int64_t length = 0;
    std::string path;   // relative to the dump directory; "" is the directory itself
    std::string path2;  // a rename's target
    std::string data;   // a flushed file's content, a replaced file's content, or a text

    bool has(std::uint16_t flag) const { return (flags & flag) != 0; }
    bool ok() const { return error == 0; }
};

// Throws std::runtime_error for a record that is not a shim record; a last
// record cut short (the log of a process killed from outside) is dropped.
std::vector<ShimEvent> read_shim_log(const std::string& bytes);
// The log the shim wrote to `fd` (a memfd or a file), read from its start.
std::vector<ShimEvent> read_shim_log_fd(int fd);

// The counted calls in `events` (the number of kill points).
std::int64_t counted_calls(const std::vector<ShimEvent>& events);

// One line: `fsync "kvcheck-store.pt.tmp-7" (1620 bytes)`, `rename "a" -> "b"`.
std::string describe(const ShimEvent& event);

}  // namespace kvcheck::durability
