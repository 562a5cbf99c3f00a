// kvcheck_fuzz_seeds CORPUS_DIR: writes the binary seeds of corpus/,
// deterministically:
// - for each store below, its dump file (CORPUS_DIR/dump_load/<name>.pt) and
//   the same dump in record form (dump_load_deep/<name>.records, see
//   dump_records.h);
// - for seeds 1..choice_seeds, the choice bytes of the seeded trace of each
//   trace target (ops/choices-<seed>.bin, layout/choices-<seed>.bin): the
//   bytes that make the target's ByteChooser repeat the SeededChooser's
//   choices, so they decode to the same trace (checked here).
// - for each store below, its dump file again as a seed of the archive
//   target (dump_archive/<name>.pt), and rebuilt with a ZIP64 end record
//   that agrees with the classic one (dump_archive/<name>-zip64.pt);
// - the hostile archives of hostile_archives.h, built around the dump of
//   one-modern-f32, as seeds of the archive target and of the loader
//   target (dump_archive/<shape>.pt, dump_load/hostile-<shape>.pt); each
//   must be refused by kv::read_dump_archive naming its fault (checked
//   here), every real dump accepted.
// The text traces of ops/ and layout/ are written by hand.
//
// kvcheck_fuzz_seeds --pack RECORDS DUMP: packs a record-form input (a
// fuzz_dump_load_deep input) into the dump file it stands for, so that a
// deep finding can be replayed through the honest fuzz_dump_load.
//
// kvcheck_fuzz_seeds --precheck RECORDS: prints what decode_dump's pickle
// check (kv/pickle_check.h) says of a record-form input.
#include "byte_chooser.h"
#include "dump_records.h"
#include "generators.h"
#include "hostile_archives.h"
#include "reference/reference_engine.h"
#include "reference/cache_views.h"

#include "kv/archive.h"
#include "kv/pickle_check.h"
#include "kv/store.h"
#include "kvcheck/content.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct SeedItem {
    std::string id;
    std::string spec;  // kvcheck cache spec text
    kv::Metadata metadata;
};

struct SeedStore {
    std::string name;
    std::vector<SeedItem> items;
};

// Every layout, dtype and odd layer kind the format carries, a few at a time.
const std::vector<SeedStore> seed_stores{
    {"empty", {}},
    {"one-modern-f32", {{"a", "modern/f32/1:[kv2]", {}}}},
    {"one-legacy-f32", {{"a", "legacy/f32/2:[kv3 kv1]", {{"source", "doc1"}}}}},
    {"modern-bf16-odd-layers", {{"m", "modern/bf16/3:[kv2 k1 v1 KV2 kvKV1 kv~2 -0]", {{"turn", "3"}}}}},
    {"modern-f16-empty-cache", {{"e", "modern/f16/4:[]", {}}}},
    {"mixed-three-items",
     {{"a", "modern/f32/5:[kv1 kv2]", {{"source", "a.txt"}, {"kind", "memory"}}},
      {"b", "legacy/f16/6:[kv2]", {}},
      {"c", "modern/bf16/7:[kv0 K1]", {{"source", "c.txt"}}}}},
};

std::vector<char> dump_bytes(const SeedStore& seed, const fs::path& scratch) {
    std::vector<kv::NewItem> items;
    for (const SeedItem& item : seed.items) {
        items.push_back({item.id, kvcheck::adapters::materialize(kvcheck::expand(kvcheck::parse_cache_spec(item.spec))),
                         item.metadata});
    }
    kv::Store store;
    store.add(items);
    store.dump(scratch.string());
    std::ifstream in(scratch / kv::dump_file_name, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

constexpr std::uint64_t choice_seeds = 12;

// The choice bytes of seeded trace `seed`; exits if they do not decode to it.
std::string choice_seed(std::uint64_t seed, const kvcheck::WorkloadOptions& options,
                        kvcheck::Trace (*generate)(kvcheck::Chooser&, const kvcheck::WorkloadOptions&)) {
    kvcheck::SeededChooser seeded(seed);
    kvcheck::fuzz::ChoiceRecorder recorder(seeded);
    const kvcheck::Trace trace = generate(recorder, options);
    const std::vector<std::uint8_t>& bytes = recorder.bytes();
    kvcheck::fuzz::ByteChooser decoder(bytes.data(), bytes.size());
    if (!(generate(decoder, options) == trace)) {
        std::cerr << "kvcheck_fuzz_seeds: the choice bytes of seed " << seed << " decode to another trace\n";
        std::exit(1);
    }
    return std::string(bytes.begin(), bytes.end());
}

void write(const fs::path& path, const std::string& bytes) {
    if (!path.parent_path().empty()) fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << bytes;
    std::cout << "wrote " << path.string() << " (" << bytes.size() << " bytes)\n";
}

}  // namespace

// The archive target's seeds of one real dump; the hostile archives too
// when `hostile`. Exits when the archive check misjudges one.
void write_archive_seeds(const fs::path& corpus, const std::string& name, const std::vector<char>& dump, bool hostile) {
    const std::string real(dump.begin(), dump.end());
    const auto records = kvcheck::fuzz::read_zip_records(real);
    const std::string zip64 = kvcheck::fuzz::write_zip({records, {}, true, {}});
    for (const std::string* sound : {&real, &zip64}) {
        const std::string problem = kv::read_dump_archive(*sound).problem;
        if (!problem.empty()) {
            std::cerr << "kvcheck_fuzz_seeds: the archive check refuses the dump of " << name << ": " << problem << "\n";
            std::exit(1);
        }
    }
    write(corpus / "dump_archive" / (name + ".pt"), real);
    write(corpus / "dump_archive" / (name + "-zip64.pt"), zip64);
    if (!hostile) return;
    for (const auto& archive : kvcheck::fuzz::hostile_archives(records)) {
        const std::string problem = kv::read_dump_archive(archive.bytes).problem;
        if (problem.find(archive.fault) == std::string::npos) {
            std::cerr << "kvcheck_fuzz_seeds: " << archive.name << " is not refused for '" << archive.fault << "': '"
                      << problem << "'\n";
            std::exit(1);
        }
        write(corpus / "dump_archive" / archive.name, archive.bytes);
        write(corpus / "dump_load" / ("hostile-" + archive.name), archive.bytes);
    }
}

int pack(const std::string& from, const std::string& to) {
    std::ifstream in(from, std::ios::binary);
    const std::string records((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
        std::cerr << "kvcheck_fuzz_seeds: cannot read " << from << "\n";
        return 1;
    }
    const std::vector<char> dump = kvcheck::fuzz::pack_records(kvcheck::fuzz::split_records(records));
    write(to, std::string(dump.begin(), dump.end()));
    return 0;
}

int precheck(const std::string& from) {
    std::ifstream in(from, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::vector<std::string> records = kvcheck::fuzz::split_records(text);
    std::map<std::string, std::uint64_t> storage_bytes;
    for (std::size_t i = 1; i < records.size(); ++i) storage_bytes[std::to_string(i - 1)] = records[i].size();
    const std::string problem = kv::pickle_problem(records.front(), storage_bytes);
    std::cout << from << ": " << (problem.empty() ? "passes the pickle check" : "rejected: " + problem) << "\n";
    return problem.empty() ? 0 : 1;
}

int main(int argc, char** argv) {
    if (argc == 4 && std::string(argv[1]) == "--pack") return pack(argv[2], argv[3]);
    if (argc == 3 && std::string(argv[1]) == "--precheck") return precheck(argv[2]);
    if (argc != 2) {
        std::cerr << "usage: kvcheck_fuzz_seeds CORPUS_DIR | --pack RECORDS DUMP | --precheck RECORDS\n";
        return 2;
    }
    const fs::path corpus = argv[1];
    const fs::path scratch = fs::temp_directory_path() / ("kvcheck-fuzz-seeds-" + std::to_string(::getpid()));
    for (const SeedStore& seed : seed_stores) {
        const std::vector<char> dump = dump_bytes(seed, scratch);
        const std::vector<std::string> records = kvcheck::fuzz::unpack_records(dump);
        // decode_dump's pickle check must accept every real dump.
        std::map<std::string, std::uint64_t> storage_bytes;
        for (std::size_t i = 1; i < records.size(); ++i) storage_bytes[std::to_string(i - 1)] = records[i].size();
        const std::string problem = kv::pickle_problem(records.front(), storage_bytes);
        if (!problem.empty()) {
            std::cerr << "kvcheck_fuzz_seeds: the pickle check rejects the dump of " << seed.name << ": " << problem << "\n";
            return 1;
        }
        write(corpus / "dump_load" / (seed.name + ".pt"), std::string(dump.begin(), dump.end()));
        write(corpus / "dump_load_deep" / (seed.name + ".records"),
              kvcheck::fuzz::join_records(records));
        write_archive_seeds(corpus, seed.name, dump, seed.name == "one-modern-f32");
    }
    fs::remove_all(scratch);
    for (std::uint64_t seed = 1; seed <= choice_seeds; ++seed) {
        const std::string name = "choices-" + std::to_string(seed) + ".bin";
        write(corpus / "ops" / name, choice_seed(seed, kvcheck::fuzz::ops_workload(), kvcheck::fuzz::ops_trace));
        write(corpus / "layout" / name, choice_seed(seed, kvcheck::fuzz::layout_workload(), kvcheck::fuzz::layout_trace));
    }
    return 0;
}
