#include "dump_records.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <cstring>
#include <memory>

namespace kvcheck::fuzz {

std::vector<std::string> split_records(const std::string& input) {
    std::vector<std::string> records;
    const std::string separator = record_separator;
    std::size_t from = 0;
    for (std::size_t at = input.find(separator); at != std::string::npos; at = input.find(separator, from)) {
        records.push_back(input.substr(from, at - from));
        from = at + separator.size();
    }
    records.push_back(input.substr(from));
    return records;
}

std::string join_records(const std::vector<std::string>& records) {
    std::string joined;
    for (std::size_t i = 0; i < records.size(); ++i) joined += (i ? record_separator : "") + records[i];
    return joined;
}

std::vector<char> pack_records(const std::vector<std::string>& records) {
    std::vector<char> archive;
    caffe2::serialize::PyTorchStreamWriter writer([&archive](const void* data, std::size_t size) {
        const char* bytes = static_cast<const char*>(data);
        archive.insert(archive.end(), bytes, bytes + size);
        return size;
    });
    for (std::size_t i = 0; i < records.size(); ++i) {
        const std::string name = i == 0 ? "data.pkl" : "data/" + std::to_string(i - 1);
        writer.writeRecord(name, records[i].data(), records[i].size());
    }
    writer.writeEndOfFile();
    return archive;
}

std::vector<std::string> unpack_records(const std::vector<char>& archive) {
    auto adapter = std::make_shared<caffe2::serialize::MemoryReadAdapter>(archive.data(), archive.size());
    caffe2::serialize::PyTorchStreamReader reader(adapter);
    std::vector<std::string> records;
    for (std::size_t i = 0;; ++i) {
        const std::string name = i == 0 ? "data.pkl" : "data/" + std::to_string(i - 1);
        if (!reader.hasRecord(name)) break;
        const auto [data, size] = reader.getRecord(name);
        records.emplace_back(static_cast<const char*>(data.get()), size);
    }
    return records;
}

}  // namespace kvcheck::fuzz
