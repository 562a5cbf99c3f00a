// A file system that "loses power" once `bytes_budget` bytes are written:
// the file being written keeps only the bytes that fit, and every later
// write or rename throws PowerCut. The reference adapter's dump_interrupted
// runs its dump on one.
//
//   CrashingFileSystem fs(100);
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
    explicit CrashingFileSystem(std::int64_t bytes_budget) : budget_(bytes_budget) {}
    void write_file(const std::string& path, const std::vector<char>& bytes) override;
    void rename(const std::string& from, const std::string& to) override;
    std::vector<char> read_file(const std::string& path, std::int64_t bytes_max) override;
    void remove(const std::string& path) override;
    void make_dirs(const std::string& path) override;
    std::vector<std::string> list(const std::string& dir) override;

  private:
    std::int64_t budget_;
};

}  // namespace kvcheck::adapters
