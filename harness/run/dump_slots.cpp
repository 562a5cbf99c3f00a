#include "run/dump_slots.h"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace kvcheck {

namespace fs = std::filesystem;

DumpSlots::~DumpSlots() {
    if (!own_work_dir_) return;
    std::error_code ignored;
    fs::remove_all(work_dir_, ignored);
}

std::string DumpSlots::dir(std::int64_t slot) {
    if (work_dir_.empty()) {
        std::string pattern = (fs::temp_directory_path() / "kvcheck-run-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temporary directory");
        work_dir_ = pattern;
        own_work_dir_ = true;
    }
    return work_dir_ + "/slot-" + std::to_string(slot);
}

bool DumpSlots::corrupt(std::int64_t slot, std::int64_t offset, bool truncate) {
    std::vector<fs::path> files;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(dir(slot), error)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    std::uintmax_t total = 0;
    for (const fs::path& file : files) total += fs::file_size(file);
    if (total == 0) return false;
    std::uintmax_t at = static_cast<std::uintmax_t>(offset < 0 ? -offset : offset) % total;
    for (const fs::path& file : files) {
        const std::uintmax_t size = fs::file_size(file);
        if (at >= size) {
            at -= size;
            continue;
        }
        if (truncate) {
            fs::resize_file(file, at);
        } else {
            std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
            stream.seekg(static_cast<std::streamoff>(at));
            const char byte = static_cast<char>(stream.get() ^ 0x5A);
            stream.seekp(static_cast<std::streamoff>(at));
            stream.put(byte);
        }
        break;
    }
    return true;
}

}  // namespace kvcheck
