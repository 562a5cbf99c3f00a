// The dump-loader target: the input is written as the dump file of a dump
// directory, and kv::Store::load reads it into a store that already holds
// known items. Exactly one of two things may happen:
// - the load fails with kv::DumpError (a clear message naming the file) and
//   the store is unchanged, item for item (ids, order, metadata, content,
//   layout, flags);
// - the load succeeds, every loaded cache is well formed (float K/V of rank
//   4 or empty, every element inside its storage, readable end to end),
//   and the loaded store dumps and loads again to the same store.
// Anything else - another exception, a crash, a hang, an allocation over
// libFuzzer's -malloc_limit_mb - is a finding (dump-safe).
//
// Built twice: fuzz_dump_load takes the file bytes as they are (the honest
// target: every zip and CRC check stands in the way), and
// fuzz_dump_load_deep (KVCHECK_FUZZ_DEEP) takes the records of a dump
// (dump_records.h) and packs them into a valid archive first, so mutations
// reach decode_dump's pickle check (kv/pickle_check.h), torch's unpickler
// and the loader's field checks.
#include "dump_records.h"
#include "extra_counters.h"
#include "reference/reference_engine.h"
#include "reference/cache_views.h"
#include "sha1.h"

#include "kv/pickle_check.h"
#include "kv/store.h"
#include "kvcheck/content.h"

#include <ATen/Parallel.h>
#include <c10/util/Logging.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

namespace {

namespace fs = std::filesystem;
using namespace kvcheck;

#ifdef KVCHECK_FUZZ_DEEP
constexpr bool deep = true;
constexpr const char* target_name = "fuzz_dump_load_deep";
#else
constexpr bool deep = false;
constexpr const char* target_name = "fuzz_dump_load";
#endif

// What the store holds before each load.
const std::vector<std::pair<std::string, std::string>> known_items{
    {"alpha", "modern/bf16/11:[kv3 k2 KV1 kv~2]"},
    {"beta", "legacy/f32/12:[kv2 kv0]"},
    {"gamma", "modern/f16/13:[]"},
};

// A store's content as kvcheck sees it, item by item.
struct ItemSnapshot {
    std::string id;
    kv::Metadata metadata;
    CacheView view;
};

std::string snapshot_difference(const std::vector<ItemSnapshot>& actual, const std::vector<ItemSnapshot>& expected) {
    if (actual.size() != expected.size()) {
        return "the store holds " + std::to_string(actual.size()) + " items, expected " + std::to_string(expected.size());
    }
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const std::string where = "item " + std::to_string(i) + " (\"" + expected[i].id + "\")";
        if (actual[i].id != expected[i].id) return where + " has id \"" + actual[i].id + "\"";
        if (actual[i].metadata != expected[i].metadata) return where + " metadata changed";
        if (actual[i].view.layout != expected[i].view.layout) return where + " layout changed";
        const std::string difference = view_difference(actual[i].view, expected[i].view);
        if (!difference.empty()) return where + " " + difference;
    }
    return {};
}

// A file system in memory, for the round trip of a loaded store (the real
// one fsyncs every dump).
class MemoryFileSystem final : public kv::FileSystem {
  public:
    void write_file(const std::string& path, const std::vector<char>& bytes) override { files_[path] = bytes; }
    void rename(const std::string& from, const std::string& to) override {
        files_[to] = files_.at(from);
        files_.erase(from);
    }
    std::vector<char> read_file(const std::string& path, std::int64_t bytes_max) override {
        const auto found = files_.find(path);
        if (found == files_.end()) throw kv::IoError("no file " + path);
        if (static_cast<std::int64_t>(found->second.size()) > bytes_max) throw kv::IoError("too large: " + path);
        return found->second;
    }
    void remove(const std::string& path) override { files_.erase(path); }
    void make_dirs(const std::string&) override {}
    std::vector<std::string> list(const std::string& dir) override {
        std::vector<std::string> names;
        for (const auto& [path, bytes] : files_) {
            if (path.rfind(dir + "/", 0) == 0 && path.find('/', dir.size() + 1) == std::string::npos) {
                names.push_back(path.substr(dir.size() + 1));
            }
        }
        return names;
    }

  private:
    std::map<std::string, std::vector<char>> files_;
};

struct Setup {
    std::string program;
    std::string dir;   // the dump directory the input is written to
    std::string file;  // dir/kvcheck-store.pt
    std::string artifact_prefix;
    std::vector<kv::NewItem> items;     // the known items, added to a fresh store per input
    std::vector<ItemSnapshot> before;   // what a store holding them looks like
    kv::LoadLimits limits;
};

Setup& setup() {
    static Setup instance;
    return instance;
}

std::vector<ItemSnapshot> snapshot(const kv::Store& store) {
    std::vector<ItemSnapshot> items;
    for (const kv::ItemPtr& item : store.get_all()) items.push_back({item->id, item->metadata, adapters::view_of(*item->cache)});
    return items;
}

[[noreturn]] void fail(const std::string& message, const std::uint8_t* data, std::size_t size) {
    const Setup& s = setup();
    std::cerr << "ERROR: dump-safe: " << message << "\n"
              << "SUMMARY: kvcheck: dump-safe violated by a " << size << "-byte " << (deep ? "record form" : "dump file")
              << "\n"
              << "reproduce: " << s.program << " " << s.artifact_prefix << "crash-" << fuzz::sha1_hex(data, size) << "\n";
    std::abort();
}

// Does every element of `t` lie inside its storage? (sizes, strides and
// offset come from the file; torch's unpickler does not check them.)
bool inside_storage(const at::Tensor& t) {
    if (t.numel() == 0) return true;
    if (t.storage_offset() < 0) return false;
    std::int64_t last = t.storage_offset();
    for (std::int64_t d = 0; d < t.dim(); ++d) {
        if (t.stride(d) < 0) return false;
        last += (t.size(d) - 1) * t.stride(d);
    }
    const auto capacity = static_cast<std::int64_t>(t.storage().nbytes() / t.element_size());
    return last < capacity;
}

// Every tensor of a loaded cache: a float dtype, rank 4 or no elements,
// inside its storage.
std::string malformed(const kv::Cache& cache) {
    std::string problem;
    const auto check = [&](const at::Tensor& t, const std::string& what) {
        if (!t.defined() || !problem.empty()) return;
        const auto dtype = t.scalar_type();
        if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) problem = what + " has a non-float dtype";
        if (t.dim() != 4 && t.numel() != 0) problem = what + " is not of rank 4";
        if (problem.empty() && !inside_storage(t)) {
            problem = what + " of sizes " + c10::str(t.sizes()) + ", strides " + c10::str(t.strides()) + " and offset " +
                      std::to_string(t.storage_offset()) + " reaches past its storage of " +
                      std::to_string(t.storage().nbytes()) + " bytes";
        }
    };
    if (cache.layout() == kv::Layout::legacy) {
        for (const at::Tensor& t : *cache.key_cache()) check(t, "a key_cache tensor");
        for (const at::Tensor& t : *cache.value_cache()) check(t, "a value_cache tensor");
    } else {
        for (const kv::LayerPtr& layer : *cache.layers()) {
            check(layer->keys, "a keys tensor");
            check(layer->values, "a values tensor");
            check(layer->key_cache, "a key_cache tensor");
            check(layer->value_cache, "a value_cache tensor");
        }
    }
    return problem;
}

void check_loaded(const kv::Store& store, const std::uint8_t* data, std::size_t size) {
    for (const kv::ItemPtr& item : store.get_all()) {
        if (!item->cache) fail("item \"" + item->id + "\" was loaded without a cache", data, size);
        const std::string problem = malformed(*item->cache);
        if (!problem.empty()) fail("item \"" + item->id + "\": " + problem, data, size);
    }
    const std::vector<ItemSnapshot> loaded = snapshot(store);  // reads every element
    MemoryFileSystem memory;
    kv::Store again;
    try {
        store.dump("/again", memory);
        again.load("/again", memory, setup().limits);
    } catch (const std::exception& error) {
        fail(std::string("a loaded store does not dump and load again: ") + error.what(), data, size);
    }
    const std::string difference = snapshot_difference(snapshot(again), loaded);
    if (!difference.empty()) fail("a loaded store changed in a dump/load round trip: " + difference, data, size);
}

void write_input(const std::vector<char>& bytes) {
    std::ofstream out(setup().file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
        std::cerr << "kvcheck fuzz: cannot write " << setup().file << "\n";
        std::abort();
    }
}

void remove_dir() {
    std::error_code ignored;
    fs::remove_all(setup().dir, ignored);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    at::set_num_threads(1);
    // Every c10::Error records a symbolized C++ backtrace; torch's unpickler
    // throws one per rejected input, and the backtrace costs far more than
    // the load (a few exec/s instead of hundreds). Messages stay as they are.
    c10::SetStackTraceFetcher([] { return std::string("(backtrace off in fuzz targets)"); });
    Setup& s = setup();
    s.program = *argc > 0 ? (*argv)[0] : target_name;
    for (int i = 1; i < *argc; ++i) {
        const std::string arg = (*argv)[i];
        if (arg.rfind("-artifact_prefix=", 0) == 0) s.artifact_prefix = arg.substr(17);
    }
    const char* tmp = std::getenv("KVCHECK_FUZZ_TMPDIR");
    std::string base = tmp != nullptr && *tmp != '\0' ? tmp : (::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : fs::temp_directory_path().string());
    std::string pattern = base + "/kvcheck-fuzz-load-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
        std::cerr << "kvcheck fuzz: cannot create a directory under " << base << "\n";
        std::exit(2);
    }
    s.dir = pattern;

    s.file = s.dir + "/" + kv::dump_file_name;
    std::atexit(remove_dir);
    // Tight enough that nothing a small file claims can exhaust memory;
    // the loader's defaults (1 GiB) are what users get.
    s.limits.file_bytes_max = std::int64_t{1} << 20;
    s.limits.tensor_bytes_max = std::int64_t{1} << 24;
    s.limits.items_max = 1024;
    s.limits.layers_max = 64;
    for (const auto& [id, spec] : known_items) {
        s.items.push_back({id, adapters::materialize(expand(parse_cache_spec(spec))), {{"source", id + ".txt"}}});
    }
    kv::Store store;
    store.add(s.items);
    s.before = snapshot(store);
    std::cerr << "kvcheck fuzz target " << target_name << ": input = " << (deep ? "the records of a dump" : "a dump file")
              << ", written to " << s.file << "; load limits: file_bytes_max=" << s.limits.file_bytes_max
              << " tensor_bytes_max=" << s.limits.tensor_bytes_max << " items_max=" << s.limits.items_max
              << " layers_max=" << s.limits.layers_max << "; the store holds " << s.items.size() << " known items\n";
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const Setup& s = setup();
    std::vector<char> bytes(data, data + size);
    if (deep) {
        const std::vector<std::string> records = fuzz::split_records(std::string(bytes.begin(), bytes.end()));
        try {
            bytes = fuzz::pack_records(records);
        } catch (const std::exception&) {
            return -1;  // torch's writer refused the records (it never should)
        }
    }
    write_input(bytes);
    kv::Store store;
    store.add(s.items);
    try {
        store.load(s.dir, kv::posix_file_system(), s.limits);
    } catch (const kv::DumpError& error) {
        const std::string message = error.what();
        fuzz::count_outcome(message);
        if (message.find(kv::dump_file_name) == std::string::npos) {
            fail("the load error does not name the file: " + message, data, size);
        }
        const std::string difference = snapshot_difference(snapshot(store), s.before);
        if (!difference.empty()) fail("a failed load changed the store: " + difference + " (error: " + message + ")", data, size);
        return 0;
    } catch (const std::exception& error) {
        fail(std::string("load threw something other than kv::DumpError: ") + error.what(), data, size);
    }
    fuzz::count_outcome("loaded");
    check_loaded(store, data, size);
    return 0;
}
