// The text of a file under /proc, for the readers of process trees and
// their CPU and memory (harness/process/stillness.cpp, harness/cli/sandbox.cpp).
// Not std::ifstream: libstdc++'s filebuf throws from underflow when read(2)
// fails, whatever the stream's exception mask, and reading a file of a
// process that ends between the open and the read fails with ESRCH: an
// adapter's child ending while kvcheck sampled it ended a whole run
// ("basic_filebuf::underflow error reading the file: No such process").
#pragma once

#include <cerrno>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace kvcheck::posix {

// At most `bytes_max` bytes of the file; "" when it cannot be opened, and
// what was read so far when a read fails (the process is gone).
inline std::string read_proc_file(const std::string& path, std::size_t bytes_max = 1 << 20) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    std::string text;
    char buffer[4096];
    while (text.size() < bytes_max) {
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return text;
}

}  // namespace kvcheck::posix
