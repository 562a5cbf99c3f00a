#include "output.h"

#include "adapters.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <fcntl.h>
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

}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw UsageError("cannot write --out " + path_ + ": " + std::strerror(errno) + " (checked before the run)");
    struct stat info {};
    if (::fstat(fd_, &info) == 0 && S_ISDIR(info.st_mode)) throw UsageError("--out " + path_ + " is a directory");
}

OutputFile::~OutputFile() {
    if (fd_ >= 0) ::close(fd_);
}

bool OutputFile::write(const std::string& text) {
    if (fd_ < 0) {
        std::cout << text << std::flush;
        return true;
    }
    struct stat info {};
    const bool regular = ::fstat(fd_, &info) == 0 && S_ISREG(info.st_mode);
    bool ok = !regular || ::ftruncate(fd_, 0) == 0;
    ok = ok && (!regular || ::lseek(fd_, 0, SEEK_SET) == 0);
    ok = ok && write_all(fd_, text);
    ok = ok && (!regular || ::fsync(fd_) == 0);
    if (ok) {
        std::cerr << "report written to " << path_ << "\n";
        return true;
    }
    std::cerr << "kvcheck: cannot write the report to " << path_ << ": " << std::strerror(errno)
              << "; it follows on standard output\n";
    std::cout << text << std::flush;
    return false;
}

void prepare_trace_dir(const std::string& dir) {
    if (dir.empty()) throw UsageError("--trace-dir must not be empty");
    std::error_code error;
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
}

}  // namespace kvcheck::cli
