// The file operations a dump is made of, behind an interface so that a
// caller can run a dump on a file system that fails on purpose (a crash
// after N bytes) and check what survives. The real one is POSIX.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kv {

// A file could not be read or written; the message names the path.
class IoError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

class FileSystem {
  public:
    virtual ~FileSystem() = default;
    // Creates or truncates `path`, writes `bytes`, flushes them to disk.
    virtual void write_file(const std::string& path, const std::vector<char>& bytes) = 0;
    // Atomically replaces `to` with `from` and flushes the directory.
    virtual void rename(const std::string& from, const std::string& to) = 0;
    // Reads a whole file; throws IoError when it is missing or larger than
    // `bytes_max` (nothing larger is ever allocated).
    virtual std::vector<char> read_file(const std::string& path, std::int64_t bytes_max) = 0;
    virtual void remove(const std::string& path) = 0;  // missing files are ignored
    virtual void make_dirs(const std::string& path) = 0;
    // The names (not paths) of the entries of directory `dir`, in no
    // particular order; throws IoError when it cannot be read.
    virtual std::vector<std::string> list(const std::string& dir) = 0;
};

// The real one. Its two flushes are what a dump's durability rests on
// (docs/durability.md): a file's bytes reach the disk by flush_file, a
// rename by flush_directory of the directory holding the new name.
class PosixFileSystem : public FileSystem {
  public:
    void write_file(const std::string& path, const std::vector<char>& bytes) override;
    void rename(const std::string& from, const std::string& to) override;
    std::vector<char> read_file(const std::string& path, std::int64_t bytes_max) override;
    void remove(const std::string& path) override;
    void make_dirs(const std::string& path) override;
    std::vector<std::string> list(const std::string& dir) override;

  protected:
    virtual void flush_file(int fd, const std::string& path);
    virtual void flush_directory(const std::string& dir);
};

FileSystem& posix_file_system();  // a PosixFileSystem

}  // namespace kv
