#include "hostile_archives.h"

#include <array>
#include <cstdint>
#include <stdexcept>

namespace kvcheck::fuzz {
namespace {

std::uint32_t crc32(const std::string& bytes) {
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
    for (const char c : bytes) crc = table[(crc ^ static_cast<unsigned char>(c)) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

void put(std::string* out, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

std::uint64_t get(const std::string& in, std::size_t at, int bytes) {
    if (at > in.size() || in.size() - at < static_cast<std::size_t>(bytes)) throw std::runtime_error("not a zip archive");
    std::uint64_t value = 0;
    for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(in[at + i]);
    return value;
}

// A classic directory of `listed`; returns where it starts.
std::size_t write_directory(const ZipLayout& layout, const std::vector<std::size_t>& listed,
                            const std::vector<std::size_t>& offsets, std::string* out) {
    const std::size_t start = out->size();
    for (const std::size_t i : listed) {
        const ZipRecord& record = layout.records.at(i);
        put(out, 0x02014b50, 4);
        put(out, 20, 2);  // made by
        put(out, 20, 2);  // needed
        put(out, 0, 2);   // flags
        put(out, 0, 2);   // stored
        put(out, 0, 4);   // time and date
        put(out, crc32(record.bytes), 4);
        put(out, record.bytes.size(), 4);
        put(out, record.bytes.size(), 4);
        put(out, record.name.size(), 2);
        put(out, 0, 2);  // extra
        put(out, 0, 2);  // comment
        put(out, 0, 2);  // disk
        put(out, 0, 2);  // internal attributes
        put(out, 0, 4);  // external attributes
        put(out, offsets[i], 4);
        out->append(record.name);
    }
    return start;
}

std::vector<std::size_t> all_of(const ZipLayout& layout) {
    std::vector<std::size_t> listed;
    for (std::size_t i = 0; i < layout.records.size(); ++i) listed.push_back(i);
    return listed;
}

std::size_t index_of(const std::vector<ZipRecord>& records, const std::string& name) {
    for (std::size_t i = 0; i < records.size(); ++i) {
        if (records[i].name == name) return i;
    }
    throw std::runtime_error("the dump has no record " + name);
}

}  // namespace

std::string write_zip(const ZipLayout& layout) {
    std::string out;
    std::vector<std::size_t> offsets;
    for (const ZipRecord& record : layout.records) {
        const std::string& local_name = record.local_name.empty() ? record.name : record.local_name;
        offsets.push_back(out.size());
        put(&out, 0x04034b50, 4);
        put(&out, 20, 2);  // needed
        put(&out, 0, 2);   // flags
        put(&out, 0, 2);   // stored
        put(&out, 0, 4);   // time and date
        put(&out, crc32(record.bytes), 4);
        put(&out, record.bytes.size(), 4);
        put(&out, record.bytes.size(), 4);
        put(&out, local_name.size(), 2);
        put(&out, 0, 2);  // extra
        out.append(local_name);
        out.append(record.bytes);
    }
    const std::vector<std::size_t> classic = layout.directory.empty() ? all_of(layout) : layout.directory;
    const std::size_t classic_start = write_directory(layout, classic, offsets, &out);
    const std::size_t classic_size = out.size() - classic_start;
    if (layout.zip64) {
        std::size_t start = classic_start;
        std::size_t size = classic_size;
        std::size_t entries = classic.size();
        if (!layout.zip64_directory.empty()) {
            start = write_directory(layout, layout.zip64_directory, offsets, &out);
            size = out.size() - start;
            entries = layout.zip64_directory.size();
        }
        const std::size_t record = out.size();
        put(&out, 0x06064b50, 4);
        put(&out, 44, 8);  // the record's size after this field
        put(&out, 45, 2);
        put(&out, 45, 2);
        put(&out, 0, 4);  // this disk
        put(&out, 0, 4);  // the directory's disk
        put(&out, entries, 8);
        put(&out, entries, 8);
        put(&out, size, 8);
        put(&out, start, 8);
        put(&out, 0x07064b50, 4);
        put(&out, 0, 4);
        put(&out, record, 8);
        put(&out, 1, 4);  // disks
    }
    put(&out, 0x06054b50, 4);
    put(&out, 0, 2);
    put(&out, 0, 2);
    put(&out, classic.size(), 2);
    put(&out, classic.size(), 2);
    put(&out, classic_size, 4);
    put(&out, classic_start, 4);
    put(&out, 0, 2);  // comment
    return out;
}

std::vector<ZipRecord> read_zip_records(const std::string& archive) {
    if (archive.size() < 22) throw std::runtime_error("not a zip archive");
    const std::size_t end = archive.size() - 22;
    if (get(archive, end, 4) != 0x06054b50) throw std::runtime_error("not a zip archive");
    const std::size_t entries = get(archive, end + 10, 2);
    std::size_t at = get(archive, end + 16, 4);
    std::vector<ZipRecord> records;
    for (std::size_t i = 0; i < entries; ++i) {
        const std::size_t size = get(archive, at + 24, 4);
        const std::size_t name_size = get(archive, at + 28, 2);
        const std::size_t local = get(archive, at + 42, 4);
        const std::size_t data = local + 30 + get(archive, local + 26, 2) + get(archive, local + 28, 2);
        if (data > archive.size() || archive.size() - data < size || archive.size() - at < 46 + name_size) {
            throw std::runtime_error("not a zip archive");
        }
        records.push_back({archive.substr(at + 46, name_size), archive.substr(data, size), ""});
        at += 46 + name_size + get(archive, at + 30, 2) + get(archive, at + 32, 2);
    }
    return records;
}

std::string deep_tuple_pickle() {
    constexpr std::size_t depth = 200000;
    return std::string("\x80\x02") + ")" + std::string(depth - 1, '\x85') + ".";
}

std::string unknown_global_pickle() {
    // print("kvcheck") by REDUCE: harmless if a careless reader runs it.
    return std::string("\x80\x02") + "cbuiltins\nprint\n" + std::string("X\x07\0\0\0", 5) + "kvcheck" + "\x85" "R.";
}

std::vector<HostileArchive> hostile_archives(const std::vector<ZipRecord>& dump) {
    const std::size_t pickle = index_of(dump, "archive/data.pkl");
    const std::vector<std::pair<std::string, std::string>> payloads{{"deep-tuple", deep_tuple_pickle()},
                                                                    {"unknown-global", unknown_global_pickle()}};
    std::vector<HostileArchive> out;
    for (const auto& payload : payloads) {
        // torch looks up "archive/data.pkl" without case and finds only the
        // hostile record; a check matching "/data.pkl" with case finds the
        // real pickle, moved to another folder.
        ZipLayout variant{dump, {}, false, {}};
        variant.records[pickle] = {"archive/DATA.PKL", payload.second, ""};
        variant.records.push_back({"extra/data.pkl", dump[pickle].bytes, ""});
        out.push_back({"case-variant-" + payload.first + ".pt", write_zip(variant), "differs only in case"});

        // The classic directory lists the real pickle, the ZIP64 one (which
        // torch reads) the hostile one.
        ZipLayout zip64{dump, {}, true, {}};
        zip64.records.push_back({"archive/data.pkl", payload.second, ""});
        for (std::size_t i = 0; i < dump.size(); ++i) {
            zip64.directory.push_back(i);
            zip64.zip64_directory.push_back(i == pickle ? dump.size() : i);
        }
        out.push_back({"zip64-elsewhere-" + payload.first + ".pt", write_zip(zip64),
                       "disagrees with the classic end record"});

    }
    // Two records of one name: which one torch reads depends on its sort of
    // the directory.
    ZipLayout twice{dump, {}, false, {}};
    twice.records.push_back({"archive/data.pkl", unknown_global_pickle(), ""});
    out.push_back({"duplicate-pickle.pt", write_zip(twice), "are both named"});
    for (std::size_t i = 0; i < dump.size(); ++i) {
        if (dump[i].name.rfind("archive/data/", 0) != 0) continue;
        ZipLayout shorter{dump, {}, false, {}};
        shorter.records.push_back({dump[i].name, dump[i].bytes.substr(0, dump[i].bytes.size() / 2), ""});
        out.push_back({"duplicate-storage.pt", write_zip(shorter), "are both named"});
        break;
    }
    ZipLayout renamed{dump, {}, false, {}};
    renamed.records[pickle].local_name = "archive/data.pkx";
    out.push_back({"local-name-differs.pt", write_zip(renamed), "its local header names it"});
    // The records torch 2 adds, holding what would make torch 2 read the
    // dump otherwise than torch 1.13 and kvcheck: big-endian storages
    // (torch 2 swaps their bytes), an unknown format version.
    const std::vector<std::pair<std::string, std::string>> torch_records{{"byteorder", "big"}, {".format_version", "2"},
                                                                         {".storage_alignment", "x"}};
    for (const auto& [name, value] : torch_records) {
        ZipLayout added{dump, {}, false, {}};
        added.records.push_back({"archive/" + name, value, ""});
        out.push_back({"torch2-" + name.substr(name.find_first_not_of('.')) + "-" + value + ".pt", write_zip(added),
                       "not what torch 2 writes"});
    }
    return out;
}

}  // namespace kvcheck::fuzz
