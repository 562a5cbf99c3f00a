#include "reference/crashing_fs.h"

namespace kvcheck::adapters {

void CrashingFileSystem::write_file(const std::string& path, const std::vector<char>& bytes) {
    if (budget_ < 0) throw PowerCut{};
    const auto size = static_cast<std::int64_t>(bytes.size());
    if (size <= budget_) {
        budget_ -= size;
        inner_.write_file(path, bytes);
        return;
    }
    inner_.write_file(path, std::vector<char>(bytes.begin(), bytes.begin() + budget_));
    budget_ = -1;
    throw PowerCut{};
}

void CrashingFileSystem::rename(const std::string& from, const std::string& to) {
    if (budget_ <= 0) {
        budget_ = -1;
        throw PowerCut{};
    }
    budget_ -= 1;  // a rename costs one unit of budget, so a crash can land just before it
    inner_.rename(from, to);
}

std::vector<char> CrashingFileSystem::read_file(const std::string& path, std::int64_t bytes_max) {
    return inner_.read_file(path, bytes_max);
}

void CrashingFileSystem::remove(const std::string& path) {
    if (budget_ < 0) throw PowerCut{};
    inner_.remove(path);
}

void CrashingFileSystem::make_dirs(const std::string& path) { inner_.make_dirs(path); }

std::vector<std::string> CrashingFileSystem::list(const std::string& dir) { return inner_.list(dir); }


}  // namespace kvcheck::adapters
