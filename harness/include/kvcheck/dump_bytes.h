// What the bytes of a dump file are, as far as kvcheck can tell without
// knowing the engine's format: the layout of a torch.save archive found in
// the file (after any header of the store's own: a magic, a length, a
// digest), by which the `corrupt` operation draws the byte it flips from
// three classes evenly (docs/semantics.md#durability):
// - tensor data: the bytes of the archive's storage records
//   ("<folder>/data/<key>"), the K/V values a load hands back;
// - metadata: the bytes of its other records (the pickle: ids, metadata,
//   shapes, dtypes; the version; torch 2's byte order and serialization id);
// - header: every other byte (the store's own header, ZIP local headers and
//   their padding, the central directory, the end records).
// A file holding no archive kvcheck can read is of one class, `unknown`.
// Only the archive's structure is read here, nothing in it is trusted: a
// record whose bounds leave the file makes the file `unknown`.
//
//   const kvcheck::DumpLayout layout = kvcheck::dump_layout(bytes);
//   if (layout.archive) for (const DumpRecord& r : layout.records) ...;
//   kvcheck::byte_class(layout, 2155);   // DumpByteClass::tensor_data
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvcheck {

enum class DumpByteClass : std::uint8_t { header, metadata, tensor_data, unknown };
inline constexpr std::size_t dump_byte_class_count = 4;

const char* dump_byte_class_name(DumpByteClass byte_class);  // "tensor data"

// One record of the archive, with offsets into the whole file.
struct DumpRecord {
    std::string name;               // "archive/data/0"
    std::size_t local_header = 0;   // of its local header ("PK\3\4")
    std::size_t central_entry = 0;  // of its central directory entry ("PK\1\2")
    std::size_t data_begin = 0;     // of its first byte
    std::size_t data_size = 0;      // stored (torch never compresses)
    bool tensor_data = false;       // a storage: "<folder>/data/<key>"
};

struct DumpLayout {
    bool archive = false;  // a readable torch.save archive was found
    std::vector<DumpRecord> records;
};

DumpLayout dump_layout(std::string_view file);

DumpByteClass byte_class(const DumpLayout& layout, std::size_t byte);

// The record holding `byte` of the file, or null (a header byte).
const DumpRecord* record_at(const DumpLayout& layout, std::size_t byte);

}  // namespace kvcheck
