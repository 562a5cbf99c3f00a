#include "durability/shim_log.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unistd.h>

namespace kvcheck::durability {

std::vector<ShimEvent> read_shim_log(const std::string& bytes) {
    std::vector<ShimEvent> events;
    std::size_t at = 0;
    while (at < bytes.size()) {
        kvcheck_dumpshim_record header;
        if (bytes.size() - at < sizeof header) break;  // torn
        std::memcpy(&header, bytes.data() + at, sizeof header);
        const std::uint64_t texts = header.path_size + header.path2_size + header.data_size;
        if (header.size != sizeof header + texts || header.kind < KVCHECK_SHIM_OPEN || header.kind > KVCHECK_SHIM_KILL) {
            throw std::runtime_error("the dump shim's log is damaged at byte " + std::to_string(at));
        }
        if (bytes.size() - at < header.size) break;  // torn
        ShimEvent event;
        event.kind = static_cast<Call>(header.kind);
        event.flags = header.flags;
        event.fd = header.fd;
        event.error = header.error;
        event.open_flags = header.open_flags;
        event.call = header.call;
        event.offset = header.offset;
        event.length = header.length;
        std::size_t text = at + sizeof header;
        event.path.assign(bytes, text, header.path_size);
        text += header.path_size;
        event.path2.assign(bytes, text, header.path2_size);
        text += header.path2_size;
        event.data.assign(bytes, text, header.data_size);
        events.push_back(std::move(event));
        at += header.size;
    }
    return events;
}

std::int64_t counted_calls(const std::vector<ShimEvent>& events) {
    std::int64_t count = 0;
    for (const ShimEvent& event : events) {
        if (event.kind != Call::kill && event.call >= 0) count = std::max(count, event.call + 1);
    }
    return count;
}

namespace {

std::string quoted(const std::string& path) { return "\"" + (path.empty() ? std::string(".") : path) + "\""; }

const char* call_name(const ShimEvent& event) {
    switch (event.kind) {
        case Call::open: return event.has(KVCHECK_SHIM_CREATED) ? "create" : "open";
        case Call::write: return "write";
        case Call::truncate: return "truncate";
        case Call::fsync: return event.has(KVCHECK_SHIM_IMPLIED) ? "O_SYNC write" : event.has(KVCHECK_SHIM_DATASYNC) ? "fdatasync" : "fsync";
        case Call::rename: return "rename";
        case Call::exchange: return "exchange";
        case Call::unlink: return "unlink";
        case Call::mkdir: return "mkdir";
        case Call::rmdir: return "rmdir";
        case Call::close: return "close";
        case Call::dup: return "dup";
        case Call::sync_file: return "sync of";
        case Call::sync_all: return "sync";
        case Call::unmodelled: return "unmodelled";
        case Call::kill: return "kill";
    }
    return "?";
}

}  // namespace

std::string describe(const ShimEvent& event) {
    std::string text = call_name(event);
    if (event.kind == Call::sync_all || event.kind == Call::kill) return text;
    if (event.kind == Call::unmodelled) return text + " " + event.data + " at " + quoted(event.path.empty() ? event.path2 : event.path);
    text += " " + quoted(event.path);
    if (event.kind == Call::rename || event.kind == Call::exchange) text += " -> " + quoted(event.path2);
    if (event.kind == Call::write || event.kind == Call::truncate) text += " (" + std::to_string(event.length) + " bytes)";
    if (event.kind == Call::fsync && !event.has(KVCHECK_SHIM_DIRECTORY)) text += " (" + std::to_string(event.data.size()) + " bytes)";
    if (!event.ok()) text += " failed: " + std::string(std::strerror(event.error));
    return text;
}

std::vector<ShimEvent> read_shim_log_fd(int fd) {
    std::string bytes;
    char chunk[65536];
    for (off_t at = 0;;) {
        const ssize_t n = ::pread(fd, chunk, sizeof chunk, at);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        bytes.append(chunk, static_cast<std::size_t>(n));
        at += n;
    }
    return read_shim_log(bytes);
}

}  // namespace kvcheck::durability
