// The archive target: the input is a dump file's bytes, as is. It holds
// kv::read_dump_archive (the decision of which records torch reads, shared
// by the reference's load and `kvcheck check-dump`) against libtorch's own
// reader, caffe2::serialize::PyTorchStreamReader, in process:
// - when the check accepts, torch opens the archive, lists the same
//   records, and reads, for every record the check chose (data.pkl,
//   version, every data/<key>), exactly the bytes the check chose;
// - when torch would read another record than the check chose, the check
//   must have refused (so this is the same assertion, seen from torch).
// A refusal is never a finding; torch is not run on a refused archive (it
// trusts sizes and would allocate what a lying one claims). Anything else
// - torch failing on an accepted archive, other bytes, other records, a
// crash in the check - is a finding (dump-safe).
#include "extra_counters.h"
#include "sha1.h"

#include "kv/archive.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct Setup {
    std::string program = "fuzz_dump_archive";
    std::string artifact_prefix;
};

Setup& setup() {
    static Setup instance;
    return instance;
}

[[noreturn]] void fail(const std::string& message, const std::uint8_t* data, std::size_t size) {
    const Setup& s = setup();
    std::cerr << "ERROR: dump-safe: " << message << "\n"
              << "SUMMARY: kvcheck: dump-safe violated by a " << size << "-byte archive (the check and torch disagree)\n"
              << "reproduce: " << s.program << " " << s.artifact_prefix << "crash-"
              << kvcheck::fuzz::sha1_hex(data, size) << "\n";
    std::abort();
}

// The record's name under the archive's folder, as torch's getRecord takes it.
std::string relative(const kv::DumpArchive& archive, const kv::ArchiveRecord& record) {
    return record.name.substr(archive.folder.size() + 1);
}

// Every record the check chose, with the name torch looks it up by.
std::vector<const kv::ArchiveRecord*> chosen(const kv::DumpArchive& archive) {
    std::vector<const kv::ArchiveRecord*> records{&archive.pickle, &archive.version};
    for (const auto& entry : archive.storages) records.push_back(&entry.second);
    return records;
}

void compare_with_torch(const kv::DumpArchive& archive, std::string_view file, const std::uint8_t* data,
                        std::size_t size) {
    std::string step = "opening the archive";
    try {
        caffe2::serialize::PyTorchStreamReader reader(
            std::make_shared<caffe2::serialize::MemoryReadAdapter>(file.data(), static_cast<off_t>(file.size())));
        step = "listing its records";
        std::vector<std::string> listed = reader.getAllRecords();
        std::vector<std::string> expected;
        for (const kv::ArchiveRecord* record : chosen(archive)) expected.push_back(relative(archive, *record));
        std::sort(listed.begin(), listed.end());
        std::sort(expected.begin(), expected.end());
        if (listed != expected) {
            fail("torch lists " + std::to_string(listed.size()) + " records, the check chose " +
                     std::to_string(expected.size()),
                 data, size);
        }
        for (const kv::ArchiveRecord* record : chosen(archive)) {
            const std::string name = relative(archive, *record);
            step = "reading " + name;
            const auto [bytes, count] = reader.getRecord(name);
            const std::string_view torch_read(static_cast<const char*>(bytes.get()), count);
            if (torch_read != file.substr(record->offset, record->size)) {
                fail("torch reads " + std::to_string(count) + " other bytes for " + name + " than the check chose (" +
                         std::to_string(record->size) + " bytes of zip record " + std::to_string(record->index) + ")",
                     data, size);
            }
        }
    } catch (const std::exception& error) {
        std::string what = error.what();
        what = what.substr(0, what.find('\n'));
        fail("the check accepted an archive torch fails on, " + step + ": " + what, data, size);
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    // c10 errors record a symbolized backtrace each; see fuzz_dump_load.cpp.
    c10::SetStackTraceFetcher([] { return std::string("(backtrace off in fuzz targets)"); });
    Setup& s = setup();
    if (*argc > 0) s.program = (*argv)[0];
    for (int i = 1; i < *argc; ++i) {
        const std::string arg = (*argv)[i];
        if (arg.rfind("-artifact_prefix=", 0) == 0) s.artifact_prefix = arg.substr(17);
    }
    std::cerr << "kvcheck fuzz target fuzz_dump_archive: input = a dump file; kv::read_dump_archive's choice of "
                 "records against caffe2::serialize::PyTorchStreamReader's reading\n";
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view file(reinterpret_cast<const char*>(data), size);
    const kv::DumpArchive archive = kv::read_dump_archive(file);
    kvcheck::fuzz::count_outcome(archive.problem.empty() ? "accepted" : archive.problem);
    if (archive.problem.empty()) compare_with_torch(archive, file, data, size);
    return 0;
}
