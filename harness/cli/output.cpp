#include "output.h"

#include "adapters.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvcheck::cli {
namespace {

bool write_all(int fd, const std::string& text) {
    std::size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return false;
        done += static_cast<std::size_t>(n);
    }
    return true;
}

std::string file_type(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

// Reads `fd` to its end or to bytes_max + 1 bytes into `out` (a string or
// a vector of char), room made for the `expected` bytes first.
template <typename Buffer>
bool read_up_to(int fd, std::uint64_t expected, std::size_t bytes_max, Buffer* out) {
    out->clear();
    out->reserve(static_cast<std::size_t>(std::min<std::uint64_t>(expected, bytes_max)) + 1);
    char buffer[1 << 16];
    while (out->size() <= bytes_max) {
        const std::size_t want = std::min(sizeof buffer, bytes_max + 1 - out->size());
        const ssize_t n = ::read(fd, buffer, want);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return false;
        if (n == 0) break;
        out->insert(out->end(), buffer, buffer + n);
    }
    return true;
}

}  // namespace

std::string temporary_beside(const std::string& path) {
    const std::filesystem::path target(path);
    return (target.parent_path() / ("." + target.filename().string() + ".kvcheck-" + std::to_string(::getpid()) + ".tmp"))
        .string();
}

int replace_file(const std::string& path, const std::string& text) {
    const std::string temporary = temporary_beside(path);
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    errno = 0;
    bool ok = fd >= 0 && write_all(fd, text) && ::fsync(fd) == 0;
    int error = errno;
    if (fd >= 0 && ::close(fd) != 0 && ok) {
        ok = false;
        error = errno;
    }
    if (ok && ::rename(temporary.c_str(), path.c_str()) != 0) {
        ok = false;
        error = errno;
    }
    if (ok) return 0;
    ::unlink(temporary.c_str());
    return error != 0 ? error : EIO;
}

InputFile::InputFile(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        problem_ = std::string("cannot be opened: ") + std::strerror(errno);
        return;
    }
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
        problem_ = std::string("cannot be examined: ") + std::strerror(errno);
        ::close(fd);
        return;
    }
    if (!S_ISREG(info.st_mode)) {
        problem_ = "is " + file_type(info.st_mode) + ", not a regular file";
        ::close(fd);
        return;
    }
    // Blocking again: a regular file never blocks, but the flag is not
    // left to surprise whoever reads it.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    fd_ = fd;
    bytes_ = static_cast<std::uint64_t>(info.st_size);
}

InputFile::~InputFile() {
    if (fd_ >= 0) ::close(fd_);
}

bool InputFile::read(std::size_t bytes_max, std::string* text) const { return read_up_to(fd_, bytes_, bytes_max, text); }
bool InputFile::read(std::size_t bytes_max, std::vector<char>* bytes) const { return read_up_to(fd_, bytes_, bytes_max, bytes); }

bool standard_output_written() {
    errno = 0;
    std::cout.flush();
    const bool written = std::cout.good() && std::fflush(stdout) == 0 && !std::ferror(stdout);
    if (!written) {
        const int error = errno;
        std::cerr << "kvcheck: cannot write to standard output" << (error != 0 ? std::string(": ") + std::strerror(error) : "")
                  << ": what kvcheck printed there is lost\n";
    }
    return written;
}

OutputFile::OutputFile(std::string path, const std::string& option) : path_(std::move(path)) {
    if (path_.empty()) return;
    struct stat info {};
    if (::stat(path_.c_str(), &info) == 0) {
        if (S_ISDIR(info.st_mode)) throw UsageError(option + " " + path_ + " is a directory");
        if (!S_ISREG(info.st_mode)) {
            // A device or a pipe (/dev/stdout, a FIFO): written in place.
            fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
            if (fd_ < 0) {
                throw UsageError("cannot write " + option + " " + path_ + ": " + std::strerror(errno) + " (checked before the run)");
            }
            return;
        }
        const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0) throw UsageError("cannot write " + option + " " + path_ + ": " + std::strerror(errno) + " (checked before the run)");
        ::close(fd);
        char resolved[PATH_MAX];
        if (::realpath(path_.c_str(), resolved) != nullptr) target_ = resolved;  // a symbolic link's file is replaced
    }
    if (target_.empty()) target_ = path_;
    // The report is written to a file beside it and renamed over it when
    // complete: a kvcheck killed in mid-run leaves no empty or partial
    // report (nor creates one before the end).
    const std::string temporary = temporary_beside(target_);
    const int probe = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (probe < 0) {
        throw UsageError("cannot write " + option + " " + path_ + ": " + temporary + ": " + std::strerror(errno) +
                         " (checked before the run)");
    }
    ::close(probe);
    ::unlink(temporary.c_str());
}

OutputFile::~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
}

bool OutputFile::write(const std::string& text) {
    if (path_.empty()) {
        std::cout << text << std::flush;
        return true;
    }
    bool ok = false;
    if (fd_ >= 0) {
        ok = write_all(fd_, text);
    } else {
        const int error = replace_file(target_, text);
        ok = error == 0;
        errno = error;
    }
    if (ok) {
        std::cerr << "report written to " << path_ << "\n";
        return true;
    }
    std::cerr << "kvcheck: cannot write the report to " << path_ << ": " << std::strerror(errno)
              << "; it follows on standard output\n";
    std::cout << text << std::flush;
    return false;
}

TraceDir::TraceDir(std::string path) : dir_(std::move(path)) {
    const std::string& dir = dir_;
    if (dir.empty()) throw UsageError("--trace-dir must not be empty");
    std::error_code error;
    for (std::filesystem::path p = std::filesystem::absolute(dir, error); !error && !p.empty() && !std::filesystem::exists(p, error);
         p = p.parent_path()) {
        made_ = p.string();
        if (p == p.parent_path()) break;
    }
    std::filesystem::create_directories(dir, error);
    if (error) throw UsageError("cannot create --trace-dir " + dir + ": " + error.message() + " (checked before the run)");
    if (!std::filesystem::is_directory(dir, error)) throw UsageError("--trace-dir " + dir + " is not a directory");
    const std::string probe = dir + "/.kvcheck-write-check-" + std::to_string(::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        throw UsageError("cannot write in --trace-dir " + dir + ": " + std::strerror(errno) + " (checked before the run)");
    }
    ::close(fd);
    ::unlink(probe.c_str());
    // A run holds its directory locked until it ends. A run that finds it
    // held by another names its traces apart (name_suffix): two runs at
    // once never write the same trace file, and a run alone overwrites
    // the traces an earlier run left, as always.
    lock_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock_fd_ >= 0 && ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) suffix_ = ".run-" + std::to_string(::getpid());
}

TraceDir::~TraceDir() {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    if (made_.empty()) return;
    // Innermost first: each removal succeeds only on an empty directory.
    std::error_code ignored;
    for (std::filesystem::path p = std::filesystem::absolute(dir_, ignored); !p.empty(); p = p.parent_path()) {
        if (!std::filesystem::remove(p, ignored)) break;  // not empty (or gone): stop
        if (p.string() == made_ || p == p.parent_path()) break;
    }
}

}  // namespace kvcheck::cli
