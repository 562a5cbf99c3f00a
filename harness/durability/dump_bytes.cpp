#include "kvcheck/dump_bytes.h"

#include <optional>

namespace kvcheck {
namespace {

constexpr std::string_view end_signature{"PK\5\6", 4};
constexpr std::string_view central_signature{"PK\1\2", 4};
constexpr std::string_view local_signature{"PK\3\4", 4};
constexpr std::string_view zip64_end_signature{"PK\6\6", 4};
constexpr std::string_view zip64_locator_signature{"PK\6\7", 4};
constexpr std::size_t zip64_locator_bytes = 20;
constexpr std::size_t zip64_end_bytes = 56;
constexpr std::size_t end_record_bytes = 22;
constexpr std::size_t central_entry_bytes = 46;
constexpr std::size_t local_header_bytes = 30;

std::uint64_t little_endian(std::string_view file, std::size_t at, std::size_t bytes) {
    std::uint64_t value = 0;
    for (std::size_t i = bytes; i-- > 0;) value = value << 8 | static_cast<unsigned char>(file[at + i]);
    return value;
}

// A storage record: "<folder>/data/<key>", the key holding no '/'.
bool is_storage(const std::string& name) {
    const std::size_t at = name.find("/data/");
    return at != std::string::npos && at > 0 && name.find('/') == at && at + 6 < name.size() &&
           name.find('/', at + 6) == std::string::npos;
}

// The archive whose end record is at `end`: its records, or nullopt when
// any bound leaves the file. The archive may start after a header of the
// store's own: its offsets count from where its directory says it starts.
// torch writes a ZIP64 end record and its locator before the classic end
// record: then the directory ends where the ZIP64 record begins, and its
// counts are the ZIP64 record's.
std::optional<std::vector<DumpRecord>> records_ending_at(std::string_view file, std::size_t end) {
    std::uint64_t count = little_endian(file, end + 10, 2);
    std::uint64_t directory_bytes = little_endian(file, end + 12, 4);
    std::uint64_t directory_offset = little_endian(file, end + 16, 4);
    std::size_t directory_end = end;
    if (end >= zip64_locator_bytes + zip64_end_bytes &&
        file.substr(end - zip64_locator_bytes, 4) == zip64_locator_signature) {
        const std::size_t zip64_end = file.rfind(zip64_end_signature, end - zip64_locator_bytes - zip64_end_bytes);
        if (zip64_end == std::string_view::npos) return std::nullopt;
        count = little_endian(file, zip64_end + 32, 8);
        directory_bytes = little_endian(file, zip64_end + 40, 8);
        directory_offset = little_endian(file, zip64_end + 48, 8);
        directory_end = zip64_end;
    }
    if (directory_bytes > directory_end || directory_offset > directory_end - directory_bytes) return std::nullopt;
    const std::size_t base = directory_end - directory_bytes - directory_offset;
    std::vector<DumpRecord> records;
    std::size_t at = base + directory_offset;
    for (std::size_t n = 0; n < count; ++n) {
        if (at + central_entry_bytes > directory_end || file.substr(at, 4) != central_signature) return std::nullopt;
        DumpRecord record;
        record.central_entry = at;
        record.data_size = little_endian(file, at + 20, 4);
        const std::size_t name_bytes = little_endian(file, at + 28, 2);
        const std::size_t skipped = little_endian(file, at + 30, 2) + little_endian(file, at + 32, 2);
        record.local_header = base + little_endian(file, at + 42, 4);
        if (at + central_entry_bytes + name_bytes > directory_end) return std::nullopt;
        record.name = std::string(file.substr(at + central_entry_bytes, name_bytes));
        at += central_entry_bytes + name_bytes + skipped;
        const std::size_t local = record.local_header;
        if (local + local_header_bytes > file.size() || file.substr(local, 4) != local_signature) return std::nullopt;
        record.data_begin = local + local_header_bytes + little_endian(file, local + 26, 2) + little_endian(file, local + 28, 2);
        if (record.data_begin + record.data_size > file.size()) return std::nullopt;
        record.tensor_data = is_storage(record.name);
        records.push_back(std::move(record));
    }
    return records;
}

}  // namespace

const char* dump_byte_class_name(DumpByteClass byte_class) {
    switch (byte_class) {
        case DumpByteClass::header: return "header";
        case DumpByteClass::metadata: return "metadata";
        case DumpByteClass::tensor_data: return "tensor data";
        case DumpByteClass::unknown: break;
    }
    return "a file of no format kvcheck reads";
}

DumpLayout dump_layout(std::string_view file) {
    DumpLayout layout;
    if (file.size() < end_record_bytes) return layout;
    // The last end record with room for itself, as torch's reader finds it.
    const std::size_t end = file.rfind(end_signature, file.size() - end_record_bytes);
    if (end == std::string_view::npos) return layout;
    if (auto records = records_ending_at(file, end)) {
        layout.archive = true;
        layout.records = std::move(*records);
    }
    return layout;
}

const DumpRecord* record_at(const DumpLayout& layout, std::size_t byte) {
    for (const DumpRecord& record : layout.records) {
        if (byte >= record.data_begin && byte < record.data_begin + record.data_size) return &record;
    }
    return nullptr;
}

DumpByteClass byte_class(const DumpLayout& layout, std::size_t byte) {
    if (!layout.archive) return DumpByteClass::unknown;
    const DumpRecord* record = record_at(layout, byte);
    if (record == nullptr) return DumpByteClass::header;
    return record->tensor_data ? DumpByteClass::tensor_data : DumpByteClass::metadata;
}

}  // namespace kvcheck
