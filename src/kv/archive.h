// Which records of a dump archive torch reads, decided as torch's zip
// reader decides, before anything in the file is trusted. One home for
// that decision: kv::decode_dump (the reference's load, and so
// `kvcheck check-dump`) runs the pickle check on exactly the bytes chosen
// here, and the fuzz target fuzz_dump_archive holds the choice against
// libtorch's own reader.
//
// torch (caffe2::serialize::PyTorchStreamReader over miniz, used by C++
// and by Python's torch.load alike) reads a dump this way, checked with
// torch 1.13 and 2.13 (docs/semantics.md, "How torch reads a dump"):
// - the end record is the last "PK\5\6" with 22 bytes after it; when a
//   ZIP64 locator sits just before it and points at a ZIP64 end record,
//   the directory is the one the ZIP64 record names, not the classic one;
// - the archive's folder is the first directory entry's name up to its
//   first '/'; records are looked up as "<folder>/data.pkl",
//   "<folder>/version", "<folder>/data/<key>";
// - a lookup compares names case-insensitively (ASCII) in a sorted copy of
//   the directory: of several records matching one name, which is read
//   depends on the sort;
// - a record's bytes start after its local header's name and extra field;
//   the local header's name and the CRC are not checked.
// Anything on which two readers could disagree is refused, not guessed:
// a ZIP64 end record that disagrees with the classic one, two records
// matching one name, a name that differs from a dump's only in case, a
// record outside the folder, bytes before the first record or after the
// end record, records overlapping each other or the directory, a local
// header naming another record. What is left has one reading.
//
//   const kv::DumpArchive archive = kv::read_dump_archive(bytes);
//   if (!archive.problem.empty()) refuse(archive.problem);
//   check(archive.bytes_of(archive.pickle));  // what torch unpickles
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace kv {

// One record torch reads: its full name and where its bytes lie in the
// file (the record is stored, so these are the bytes torch hands on).
struct ArchiveRecord {
    std::string name;       // "archive/data/0"
    std::size_t index = 0;  // its place in the zip directory
    std::size_t offset = 0;  // of its first byte in the file
    std::size_t size = 0;    // in bytes
};

// The records of a sound dump archive: the pickle, the version, and the
// storages by key ("0" for <folder>/data/0). Aliases the file it was read
// from: the offsets are into it. `problem` is empty when the archive is
// sound; otherwise it names the first fault and the records are partial.
struct DumpArchive {
    std::string problem;
    std::string folder;  // "archive": the first record's folder
    ArchiveRecord pickle;
    ArchiveRecord version;
    std::map<std::string, ArchiveRecord> storages;
};

// The CRC-32 a ZIP record carries of its bytes (IEEE 802.3, reflected).
std::uint32_t crc32(const char* data, std::size_t size);

// Decides which records torch will read from `file` (a whole dump file),
// refusing any archive that is ambiguous or damaged (every record stored,
// inside the file, matching its CRC-32).
DumpArchive read_dump_archive(std::string_view file);

}  // namespace kv
