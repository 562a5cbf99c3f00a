#include "kv/io.h"

#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

namespace kv {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
    throw IoError(what + " " + path + ": " + std::strerror(errno));
}

class FileDescriptor {
  public:
    explicit FileDescriptor(int fd) : fd_(fd) {}
    ~FileDescriptor() {
        if (fd_ >= 0) ::close(fd_);
    }
    FileDescriptor(const FileDescriptor&) = delete;
    FileDescriptor& operator=(const FileDescriptor&) = delete;
    int get() const { return fd_; }

  private:
    int fd_;
};

}  // namespace

void PosixFileSystem::flush_file(int fd, const std::string& path) {
    if (::fsync(fd) != 0) fail("cannot flush", path);
}

void PosixFileSystem::flush_directory(const std::string& dir) {
    FileDescriptor fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) fail("cannot open directory", dir);
    if (::fsync(fd.get()) != 0) fail("cannot flush directory", dir);
}

void PosixFileSystem::write_file(const std::string& path, const std::vector<char>& bytes) {
    FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) fail("cannot create", path);
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail("cannot write", path);
        done += static_cast<std::size_t>(n);
    }
    flush_file(fd.get(), path);
}

void PosixFileSystem::rename(const std::string& from, const std::string& to) {
    if (::rename(from.c_str(), to.c_str()) != 0) fail("cannot rename " + from + " to", to);
    std::string dir = std::filesystem::path(to).parent_path().string();
    flush_directory(dir.empty() ? "." : dir);
}

std::vector<char> PosixFileSystem::read_file(const std::string& path, std::int64_t bytes_max) {
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) fail("cannot open", path);
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0) fail("cannot stat", path);
    if (!S_ISREG(info.st_mode)) throw IoError("not a regular file: " + path);
    if (info.st_size > bytes_max) {
        throw IoError("file too large: " + path + " holds " + std::to_string(info.st_size) +
                      " bytes, the limit is " + std::to_string(bytes_max));
    }
    std::vector<char> bytes(static_cast<std::size_t>(info.st_size));
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) fail("cannot read", path);
        if (n == 0) break;  // the file shrank under us: what we have is what there is
        done += static_cast<std::size_t>(n);
    }
    bytes.resize(done);
    return bytes;
}

void PosixFileSystem::remove(const std::string& path) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) fail("cannot remove", path);
}

void PosixFileSystem::make_dirs(const std::string& path) {
    std::error_code error;
    std::filesystem::create_directories(path, error);
    if (error) throw IoError("cannot create directory " + path + ": " + error.message());
}

std::vector<std::string> PosixFileSystem::list(const std::string& dir) {
    std::vector<std::string> names;
    DIR* listing = ::opendir(dir.c_str());
    if (listing == nullptr) {
        if (errno == ENOENT) return names;
        fail("cannot list", dir);
    }
    while (const dirent* entry = ::readdir(listing)) {
        const std::string name = entry->d_name;
        if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(listing);
    return names;
}

FileSystem& posix_file_system() {
    static PosixFileSystem fs;
    return fs;
}

}  // namespace kv
