#include "run/dump_slots.h"

#include "kvcheck/dump_bytes.h"

#include <stdlib.h>

#include <algorithm>
#include <array>
#include <iterator>
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

namespace {

// A run of bytes of one class in one file of a slot.
struct ClassRange {
    std::size_t file = 0;
    std::uintmax_t begin = 0, end = 0;
};

// The byte ranges of each class (DumpByteClass order) in `bytes`, the
// file `file` of a slot.
void add_ranges(std::size_t file, const std::string& bytes, std::array<std::vector<ClassRange>, dump_byte_class_count>& ranges) {
    const DumpLayout layout = dump_layout(bytes);
    auto add = [&](DumpByteClass byte_class, std::uintmax_t begin, std::uintmax_t end) {
        if (begin < end) ranges[static_cast<std::size_t>(byte_class)].push_back({file, begin, end});
    };
    if (!layout.archive) return add(DumpByteClass::unknown, 0, bytes.size());
    std::vector<DumpRecord> records = layout.records;
    std::sort(records.begin(), records.end(), [](const DumpRecord& a, const DumpRecord& b) { return a.data_begin < b.data_begin; });
    std::uintmax_t cursor = 0;
    for (const DumpRecord& record : records) {
        const std::uintmax_t end = record.data_begin + record.data_size;
        add(DumpByteClass::header, cursor, record.data_begin);
        add(record.tensor_data ? DumpByteClass::tensor_data : DumpByteClass::metadata, std::max<std::uintmax_t>(cursor, record.data_begin), end);
        cursor = std::max(cursor, end);
    }
    add(DumpByteClass::header, cursor, bytes.size());
}

std::string read_whole(const fs::path& file) {
    std::ifstream stream(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
}

}  // namespace

std::optional<std::string> DumpSlots::corrupt(std::int64_t slot, std::int64_t offset, bool truncate) {
    std::vector<fs::path> files;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(dir(slot), error)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    std::vector<std::string> contents;
    std::uintmax_t total = 0;
    for (const fs::path& file : files) total += contents.emplace_back(read_whole(file)).size();
    if (total == 0) return std::nullopt;
    const auto drawn = static_cast<std::uintmax_t>(offset < 0 ? -offset : offset);
    if (truncate) {
        std::uintmax_t at = drawn % total;
        for (std::size_t f = 0; f < files.size(); ++f) {
            if (at >= contents[f].size()) {
                at -= contents[f].size();
                continue;
            }
            fs::resize_file(files[f], at);
            return files[f].filename().string() + " cut to " + std::to_string(at) + " bytes (of " +
                   std::to_string(contents[f].size()) + ")";
        }
    }
    // A flip: a class drawn evenly among those the slot's files hold, then
    // a byte of it.
    std::array<std::vector<ClassRange>, dump_byte_class_count> ranges;
    for (std::size_t f = 0; f < files.size(); ++f) add_ranges(f, contents[f], ranges);
    std::vector<std::size_t> held;
    for (std::size_t c = 0; c < ranges.size(); ++c) {
        if (!ranges[c].empty()) held.push_back(c);
    }
    const std::size_t chosen = held[drawn % held.size()];
    std::uintmax_t size = 0;
    for (const ClassRange& range : ranges[chosen]) size += range.end - range.begin;
    std::uintmax_t at = drawn / held.size() % size;
    for (const ClassRange& range : ranges[chosen]) {
        if (at >= range.end - range.begin) {
            at -= range.end - range.begin;
            continue;
        }
        const std::uintmax_t byte = range.begin + at;
        std::string& bytes = contents[range.file];
        bytes[byte] = static_cast<char>(bytes[byte] ^ 0x5A);
        std::fstream stream(files[range.file], std::ios::in | std::ios::out | std::ios::binary);
        stream.seekp(static_cast<std::streamoff>(byte));
        stream.put(bytes[byte]);
        const auto byte_class = static_cast<DumpByteClass>(chosen);
        std::string where = dump_byte_class_name(byte_class);
        if (byte_class == DumpByteClass::tensor_data || byte_class == DumpByteClass::metadata) {
            const DumpLayout layout = dump_layout(bytes);
            const DumpRecord* record = record_at(layout, byte);
            if (record != nullptr) where += ": record " + record->name + ", its byte " + std::to_string(byte - record->data_begin);
        }
        return "byte " + std::to_string(byte) + " of " + files[range.file].filename().string() + " flipped (of " +
               std::to_string(bytes.size()) + " bytes; " + where + ")";
    }
    return std::nullopt;  // not reached: `at` is within the class
}

}  // namespace kvcheck
