// A file system that "loses power" once `bytes_budget` bytes are written:
// the file being written keeps only the bytes that fit, and every later
// write or rename throws PowerCut. The reference adapter's dump_interrupted
// runs its dump on one, over its own file system (`inner`, POSIX unless a
// mutant gives another).
//
//   CrashingFileSystem fs(100, kv::posix_file_system());
//   try { store.dump(dir, fs); } catch (const CrashingFileSystem::PowerCut&) {}  // the first 100 bytes hit the disk
#pragma once

#include "kv/io.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck::adapters {

class CrashingFileSystem final : public kv::FileSystem {
  public:
    struct PowerCut {};
    CrashingFileSystem(std::int64_t bytes_budget, kv::FileSystem& inner) : budget_(bytes_budget), inner_(inner) {}
    void write_file(const std::string& path, const std::vector<char>& bytes) override;
    void rename(const std::string& from, const std::string& to) override;
    std::vector<char> read_file(const std::string& path, std::int64_t bytes_max) override;
    void remove(const std::string& path) override;
    void make_dirs(const std::string& path) override;
    std::vector<std::string> list(const std::string& dir) override;

  private:
    std::int64_t budget_;
    kv::FileSystem& inner_;
};

}  // namespace kvcheck::adapters
