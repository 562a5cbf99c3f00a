// The zip layer of a dump, read the way torch's reader (miniz) reads it,
// with every point where another reader could read otherwise refused
// (kv/archive.h says which).
#include "kv/archive.h"

#include <caffe2/serialize/versions.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace kv {
namespace {

constexpr std::uint32_t local_signature = 0x04034b50;
constexpr std::uint32_t central_signature = 0x02014b50;
constexpr std::uint32_t end_signature = 0x06054b50;
constexpr std::uint32_t zip64_end_signature = 0x06064b50;
constexpr std::uint32_t zip64_locator_signature = 0x07064b50;
constexpr std::size_t local_bytes = 30;
constexpr std::size_t central_bytes = 46;
constexpr std::size_t end_bytes = 22;
constexpr std::size_t zip64_end_bytes = 56;
constexpr std::size_t zip64_locator_bytes = 20;
constexpr std::uint32_t zip64_sentinel = 0xFFFFFFFFu;
// The records torch 2.x's torch.save writes beside a dump's (its
// serialization.py, _save): a format version, the storages' alignment, the
// byte order, an id of the save.
constexpr const char* torch_records[] = {".format_version", ".storage_alignment", "byteorder", ".data/serialization_id"};

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// miniz's name comparison: ASCII letters without case.
bool same_without_case(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (lower(a[i]) != lower(b[i])) return false;
    }
    return true;
}

bool starts_without_case(std::string_view text, std::string_view start) {
    return text.size() >= start.size() && same_without_case(text.substr(0, start.size()), start);
}

std::string quoted(std::string_view name) { return "'" + std::string(name.substr(0, 200)) + "'"; }

// Little-endian fields of the file, read only after a bounds check.
class Bytes {
  public:
    explicit Bytes(std::string_view file) : file_(file) {}
    std::size_t size() const { return file_.size(); }
    // Do `count` bytes at `at` lie inside the file?
    bool has(std::uint64_t at, std::uint64_t count) const { return at <= size() && count <= size() - at; }
    std::uint64_t le(std::size_t at, int bytes) const {
        std::uint64_t value = 0;
        for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(file_[at + i]);
        return value;
    }
    std::uint16_t u16(std::size_t at) const { return static_cast<std::uint16_t>(le(at, 2)); }
    std::uint32_t u32(std::size_t at) const { return static_cast<std::uint32_t>(le(at, 4)); }
    std::uint64_t u64(std::size_t at) const { return le(at, 8); }
    std::string_view text(std::size_t at, std::size_t count) const { return file_.substr(at, count); }

  private:
    std::string_view file_;
};

// Where the zip directory is, as miniz finds it.
struct Directory {
    std::uint64_t entries = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
    std::uint64_t end = 0;  // where the directory must end: the ZIP64 end record, else the end record
};

// A directory entry, with where its bytes lie.
struct Entry {
    std::string name;
    std::uint64_t local = 0;  // the local header's offset
    std::uint64_t data = 0;   // the first data byte
    std::uint64_t size = 0;
};

class ArchiveReader {
  public:
    explicit ArchiveReader(std::string_view file) : bytes_(file) {}

    DumpArchive read() {
        Directory directory;
        std::vector<Entry> entries;
        if (find_directory(&directory) && read_entries(directory, &entries) && check_layout(entries, directory)) {
            choose_records(entries);
        }
        return std::move(archive_);
    }

  private:
    bool fail(const std::string& problem) {
        archive_.problem = problem;
        return false;
    }

    // The end record must close the file (torch writes no comment: any
    // bytes after it could hold another end record, the one a reader
    // scanning back from the end would find). A ZIP64 locator before it
    // makes miniz read the directory the ZIP64 end record names: that
    // record must sit just before the locator (where Python's zipfile
    // looks for it) and agree with the classic one field for field.
    bool find_directory(Directory* directory) {
        if (bytes_.size() < end_bytes) return fail("the file is truncated (" + std::to_string(bytes_.size()) + " bytes)");
        if (bytes_.u32(0) != local_signature) {
            return fail("the file does not begin with a zip record (Python's torch.load would read it as a non-zip, "
                        "legacy file)");
        }
        const std::size_t end = bytes_.size() - end_bytes;
        if (bytes_.u32(end) != end_signature || bytes_.u16(end + 20) != 0) {
            return fail("no zip end record at the end of the file: truncated, followed by other bytes, or not a dump");
        }
        if (bytes_.u16(end + 4) != 0 || bytes_.u16(end + 6) != 0 || bytes_.u16(end + 8) != bytes_.u16(end + 10)) {
            return fail("the zip end record describes an archive spanning several disks");
        }
        directory->entries = bytes_.u16(end + 10);
        directory->size = bytes_.u32(end + 12);
        directory->offset = bytes_.u32(end + 16);
        directory->end = end;
        if (end < zip64_locator_bytes || bytes_.u32(end - zip64_locator_bytes) != zip64_locator_signature) return true;
        const std::size_t locator = end - zip64_locator_bytes;
        const std::uint64_t record = bytes_.u64(locator + 8);
        if (!bytes_.has(record, zip64_end_bytes) || bytes_.u32(record) != zip64_end_signature) {
            return fail("the ZIP64 locator points at no ZIP64 end record");
        }
        if (record + zip64_end_bytes != locator) {
            return fail("the ZIP64 end record torch reads (at byte " + std::to_string(record) +
                        ") is not the one just before its locator (byte " + std::to_string(locator - zip64_end_bytes) +
                        "), which other zip readers read");
        }
        if (bytes_.u32(locator + 4) != 0 || bytes_.u32(locator + 16) != 1 || bytes_.u32(record + 16) != 0 ||
            bytes_.u32(record + 20) != 0 || bytes_.u64(record + 24) != bytes_.u64(record + 32) ||
            bytes_.u64(record + 4) != zip64_end_bytes - 12) {
            return fail("the ZIP64 end record is malformed or describes an archive spanning several disks");
        }
        const std::uint64_t entries = bytes_.u64(record + 32);
        const std::uint64_t size = bytes_.u64(record + 40);
        const std::uint64_t offset = bytes_.u64(record + 48);
        // A classic field too small for its value holds all ones, and the
        // ZIP64 record the value (miniz writes 0xFFFF entries for a dump of
        // more than 65,535 records): every reader then takes the ZIP64 one.
        const auto agree = [](std::uint64_t wide, std::uint64_t classic, std::uint64_t all_ones) {
            return wide == classic || (classic == all_ones && wide >= all_ones);
        };
        if (!agree(entries, directory->entries, 0xFFFF) || !agree(size, directory->size, zip64_sentinel) ||
            !agree(offset, directory->offset, zip64_sentinel)) {
            return fail("the ZIP64 end record (a directory of " + std::to_string(entries) + " entries, " +
                        std::to_string(size) + " bytes at byte " + std::to_string(offset) +
                        ") disagrees with the classic end record (" + std::to_string(directory->entries) + " entries, " +
                        std::to_string(directory->size) + " bytes at byte " + std::to_string(directory->offset) +
                        "): torch reads the ZIP64 directory, other zip readers the classic one");
        }
        directory->entries = entries;
        directory->size = size;
        directory->offset = offset;
        directory->end = record;
        return true;
    }

    // The directory must fill the bytes between its offset and the end
    // records exactly, entry after entry, with nothing before or after.
    bool read_entries(const Directory& directory, std::vector<Entry>* entries) {
        if (directory.offset > directory.end || directory.size != directory.end - directory.offset) {
            return fail("the zip directory lies outside the file or does not reach the end record");
        }
        std::uint64_t at = directory.offset;
        for (std::uint64_t i = 0; i < directory.entries; ++i) {
            Entry entry;
            if (!read_entry(static_cast<std::size_t>(i), at, directory.end, &entry, &at)) return false;
            entries->push_back(std::move(entry));
        }
        if (at != directory.end) {
            return fail("the zip directory has " + std::to_string(directory.end - at) + " bytes after its " +
                        std::to_string(directory.entries) + " entries");
        }
        return true;
    }

    bool read_entry(std::size_t i, std::uint64_t at, std::uint64_t end, Entry* entry, std::uint64_t* next) {
        const std::string record = "zip record " + std::to_string(i);
        if (at > end || end - at < central_bytes || bytes_.u32(at) != central_signature) {
            return fail("zip directory entry " + std::to_string(i) + " is damaged");
        }
        const std::uint16_t flags = bytes_.u16(at + 8);
        const std::uint16_t method = bytes_.u16(at + 10);
        const std::uint32_t crc = bytes_.u32(at + 16);
        const std::uint32_t packed = bytes_.u32(at + 20);
        const std::uint32_t unpacked = bytes_.u32(at + 24);
        const std::size_t name_size = bytes_.u16(at + 28);
        const std::size_t extra_size = bytes_.u16(at + 30);
        const std::size_t comment_size = bytes_.u16(at + 32);
        const std::uint16_t disk = bytes_.u16(at + 34);
        const std::uint32_t attributes = bytes_.u32(at + 38);
        const std::uint32_t local = bytes_.u32(at + 42);
        const std::uint64_t entry_size = central_bytes + name_size + extra_size + comment_size;
        if (entry_size > end - at) return fail(record + " has a name past the directory");
        entry->name = std::string(bytes_.text(static_cast<std::size_t>(at + central_bytes), name_size));
        const std::string named = record + " (" + quoted(entry->name) + ")";
        if (method != 0 || packed != unpacked) return fail(named + " is compressed");
        // torch writes flags 0x0808 (sizes after the data, UTF-8 names).
        // Encrypted or directory entries never occur in a dump: miniz
        // refuses the first and hands the second to torch as empty.
        if ((flags & ~std::uint16_t{0x0808}) != 0 || (attributes & 0x10) != 0) return fail(named + " has unexpected flags");
        if (packed == zip64_sentinel || local == zip64_sentinel) {
            return fail(named + " keeps its size or offset in a ZIP64 extra field; a dump's records never need one");
        }
        if (disk != 0) return fail(named + " lies on another disk");
        if (!bytes_.has(local, local_bytes) || bytes_.u32(local) != local_signature) {
            return fail(named + " has a damaged header");
        }
        const std::uint64_t data = std::uint64_t{local} + local_bytes + bytes_.u16(local + 26) + bytes_.u16(local + 28);
        if (!bytes_.has(data, unpacked)) {
            return fail(record + " claims " + std::to_string(unpacked) + " bytes the file does not have");
        }
        const std::string_view local_name = bytes_.text(local + local_bytes, bytes_.u16(local + 26));
        if (local_name != entry->name) {
            return fail(named + ": its local header names it " + quoted(local_name) +
                        " (torch reads the directory's name, other zip readers the local one)");
        }
        if (crc32(bytes_.text(static_cast<std::size_t>(data), unpacked).data(), unpacked) != crc) {
            return fail(named + " fails its CRC-32 check");
        }
        entry->local = local;
        entry->data = data;
        entry->size = unpacked;
        *next = at + entry_size;
        return true;
    }

    // The records lie one after another from the first byte of the file
    // up to the directory, none inside another or inside the directory.
    bool check_layout(const std::vector<Entry>& entries, const Directory& directory) {
        std::vector<std::size_t> order(entries.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::sort(order.begin(), order.end(),
                  [&](std::size_t a, std::size_t b) { return entries[a].local < entries[b].local; });
        std::uint64_t free_from = 0;  // where the bytes of the record before end
        std::size_t before = 0;       // that record's index
        for (std::size_t k = 0; k < order.size(); ++k) {
            const Entry& entry = entries[order[k]];
            if (k == 0 && entry.local != 0) {
                return fail("the first zip record starts at byte " + std::to_string(entry.local) +
                            ", after bytes that belong to no record");
            }
            if (entry.local < free_from) {
                return fail("zip records " + std::to_string(std::min(before, order[k])) + " and " +
                            std::to_string(std::max(before, order[k])) + " overlap");
            }
            if (entry.data + entry.size > directory.offset) {
                return fail("zip record " + std::to_string(order[k]) + " (" + quoted(entry.name) +
                            ") reaches into the zip directory");
            }
            free_from = entry.data + entry.size;
            before = order[k];
        }
        return true;
    }

    // The records torch reads, by the names it looks up, and nothing
    // that another reader could take for one of them.
    void choose_records(const std::vector<Entry>& entries) {
        if (entries.empty()) {
            fail("the archive holds no records");
            return;
        }
        const std::string& first = entries.front().name;
        const std::size_t slash = first.find('/');
        if (slash == std::string::npos || slash == 0) {
            fail("zip record 0 (" + quoted(first) + ") is in no folder: torch reads the records of the first record's folder");
            return;
        }
        archive_.folder = first.substr(0, slash);
        const std::string folder = archive_.folder + "/";
        std::map<std::string, std::size_t> seen;  // exact name -> index
        for (std::size_t i = 0; i < entries.size(); ++i) {
            if (!choose(i, entries[i], folder, &seen)) return;
        }
        if (archive_.pickle.name.empty()) {
            fail("no pickle record (" + folder + "data.pkl)");
            return;
        }
        if (archive_.version.name.empty()) {
            fail("no version record (" + folder + "version)");
            return;
        }
        if (check_version()) check_torch_records();
    }

    // What torch 2 adds beside a dump's records, each as torch 2.x
    // writes it: read by torch 2 only (torch 1.13 and kvcheck pass them
    // by), so each must hold what makes torch 2 read the dump as they do.
    // A big-endian byte order is refused: torch 2 would swap every
    // storage's bytes, torch 1.13 and kvcheck would not.
    void check_torch_records() {
        for (const auto& [rest, record] : torch_records_) {
            const std::string_view text = bytes_.text(record.offset, record.size);
            const bool sound = rest == ".format_version"      ? text == "1"
                               : rest == ".storage_alignment" ? !text.empty() && text.size() <= 6 &&
                                                                    text.find_first_not_of("0123456789") == std::string_view::npos
                               : rest == "byteorder"          ? text == "little"
                                                              : true;  // .data/serialization_id: an id, any bytes
            if (!sound) {
                fail("the record " + quoted(record.name) + " holds " + quoted(text.substr(0, 20)) + ", not what torch 2 " +
                     (rest == "byteorder" ? "writes on a little-endian machine (kvcheck and torch 1.13 read every storage "
                                            "as little-endian; torch 2 would swap its bytes)"
                                          : "writes (" + std::string(rest == ".format_version" ? "1" : "a number") + ")"));
                return;
            }
        }
    }

    bool choose(std::size_t i, const Entry& entry, const std::string& folder, std::map<std::string, std::size_t>* seen) {
        const std::string named = "zip record " + std::to_string(i) + " (" + quoted(entry.name) + ")";
        for (const char c : entry.name) {
            if (c <= ' ' || c > '~') return fail(named + " has a name with a byte that is not printable ASCII");
        }
        if (!starts_without_case(entry.name, folder)) {
            return fail(named + " is outside the folder " + quoted(folder) + " of the first record, which torch reads");
        }
        const std::string rest = entry.name.substr(folder.size());
        const bool storage = rest.size() > 5 && rest.compare(0, 5, "data/") == 0 &&
                             rest.find_first_not_of("0123456789", 5) == std::string::npos;
        const bool torch_record = std::find(std::begin(torch_records), std::end(torch_records), rest) != std::end(torch_records);
        if (!(rest == "data.pkl" || rest == "version" || storage || torch_record)) {
            const std::string lowered_storage = rest.size() > 5 && same_without_case(rest.substr(0, 5), "data/") ? rest : "";
            std::vector<std::string> known = {"data.pkl", "version", lowered_storage};
            known.insert(known.end(), std::begin(torch_records), std::end(torch_records));
            for (const std::string& name : known) {
                if (!name.empty() && same_without_case(rest, name)) {
                    return fail(named + " differs only in case from " + quoted(folder + name) +
                                ": torch matches names without case, other zip readers with it");
                }
            }
            return fail(named + " is not a record of a dump (data.pkl, version, data/<n>, or one of the records torch 2 "
                                "adds, in " + quoted(folder) + ")");
        }
        if (entry.name.compare(0, folder.size(), folder) != 0) {
            return fail(named + " differs only in case from " + quoted(folder + rest) +
                        ": torch matches names without case, other zip readers with it");
        }
        const auto [found, added] = seen->emplace(entry.name, i);
        if (!added) {
            return fail("zip records " + std::to_string(found->second) + " and " + std::to_string(i) + " are both named " +
                        quoted(entry.name) + ": torch would read one of them, which one depends on its sort of the "
                        "directory");
        }
        ArchiveRecord record{entry.name, i, static_cast<std::size_t>(entry.data), static_cast<std::size_t>(entry.size)};
        if (torch_record) {
            torch_records_[rest] = std::move(record);
        } else if (rest == "data.pkl") {
            archive_.pickle = std::move(record);
        } else if (rest == "version") {
            archive_.version = std::move(record);
        } else {
            archive_.storages[rest.substr(5)] = std::move(record);
        }
        return true;
    }

    // torch refuses a version it cannot parse or read; the record is a
    // number and a newline, as torch writes it.
    bool check_version() {
        std::string_view text = bytes_.text(archive_.version.offset, archive_.version.size);
        if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
        const bool digits = !text.empty() && text.size() <= 4 && text.find_first_not_of("0123456789") == std::string_view::npos;
        const std::uint64_t version = digits ? std::stoull(std::string(text)) : 0;
        if (!digits || version < caffe2::serialize::kMinSupportedFileFormatVersion ||
            version > caffe2::serialize::kMaxSupportedFileFormatVersion) {
            fail("the version record holds " + quoted(text.substr(0, 20)) + "; torch reads versions " +
                 std::to_string(caffe2::serialize::kMinSupportedFileFormatVersion) + " to " +
                 std::to_string(caffe2::serialize::kMaxSupportedFileFormatVersion));
            return false;
        }
        return true;
    }

    Bytes bytes_;
    DumpArchive archive_;
    std::map<std::string, ArchiveRecord> torch_records_;  // by name in the folder: ".format_version"
};

}  // namespace

std::uint32_t crc32(const char* data, std::size_t size) {
    static const auto table = [] {
        std::array<std::uint32_t, 256> t{};
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    std::uint32_t crc = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < size; ++i) {
        crc = table[(crc ^ static_cast<unsigned char>(data[i])) & 0xFF] ^ (crc >> 8);
    }
    return crc ^ 0xFFFFFFFFu;
}

DumpArchive read_dump_archive(std::string_view file) { return ArchiveReader(file).read(); }

}  // namespace kv
