// dump_kill through the harness (harness/durability/dump_kill.h): the
// reference passes at every kill point, each flush and clean-up mutant is
// caught at some point of a one-step trace, and what the harness cannot
// judge (no factory, a dump the model cannot follow, a load that crashes)
// is skipped or reported as an engine error, never passed.
#include "kv/archive.h"
#include "kv/store.h"
#include "kvcheck/dump_bytes.h"
#include "reference/reference_engine.h"
#include "run_util.h"

#include <ATen/Parallel.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <unistd.h>

namespace kvcheck::props {
namespace {

constexpr std::int64_t points_max = 12;  // past the reference dump's counted calls: every point is reached

const Adapter& bundled(const std::string& name) { return *adapters::find_bundled(name); }

CacheSpec spec(std::uint64_t seed) { return parse_cache_spec("modern/f32/" + std::to_string(seed) + ":[kv2 kv3]"); }

// A store dumped, changed, then dumped again killed at `point`, and the
// slot read back in this process.
Trace killed_over_a_dump(std::int64_t point) {
    return {op::Add{"a", spec(1)}, op::Dump{0}, op::Add{"b", spec(2)}, op::DumpKill{0, point}, op::Load{0}};
}

TEST(DumpKill, TheReferencePassesAtEveryKillPoint) {
    for (std::int64_t point = 0; point < points_max; ++point) {
        const Trace trace = killed_over_a_dump(point);
        const RunResult result = run_on(bundled("reference"), trace);
        EXPECT_FALSE(result.failure) << format_failure(*result.failure, trace, "");
        EXPECT_EQ(result.coverage.ops_skipped, 0u) << "point " << point;
    }
}

TEST(DumpKill, EachFlushAndCleanUpMutantIsCaughtInOneStep) {
    for (const std::string name : {"M10", "M25", "M26", "M27"}) {
        std::size_t caught = 0;
        for (std::int64_t point = 0; point < points_max; ++point) {
            // M27's leftover changes what a load returns only where a
            // complete dump was there before it.
            const Trace trace = name == "M27" ? Trace{op::Add{"a", spec(1)}, op::Dump{0}, op::DumpKill{0, point}}
                                              : Trace{op::DumpKill{0, point}};
            const RunResult result = run_on(bundled(name), trace, PropertySet::only(Property::dump_safe));
            if (!result.failure) continue;
            EXPECT_EQ(result.failure->property, property_id(Property::dump_safe)) << name << ": " << result.failure->message;
            ++caught;
        }
        EXPECT_GT(caught, 0u) << name << " passes dump_kill at every point";
        std::cout << "[ dump_kill] " << name << ": caught at " << caught << " of " << points_max << " kill points\n";
    }
}

// docs/semantics.md#durability: a killed dump's temporary that no load
// reads is no finding. This store names its temporary so that its clean-up
// never finds it (the leftover stays for ever); every load, with the
// leftover beside the dump, still gives what it must.
class LeavesItsTemporary final : public adapters::ReferenceEngine {
  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        fs.make_dirs(dir);
        const std::string target = dir + "/" + kv::dump_file_name;
        const std::string temporary = target + ".partial-" + std::to_string(::getpid());
        fs.write_file(temporary, kv::encode_dump(store_.get_all()));
        fs.rename(temporary, target);
    }
};

TEST(DumpKill, ALeftoverThatNoLoadReadsIsNoFinding) {
    const Adapter leaves{"leaves-its-temporary", "never removes a killed dump's temporary", "bundled", {},
                         [] { return std::make_shared<LeavesItsTemporary>(); }};
    for (std::int64_t point = 0; point < points_max; ++point) {
        const Trace trace = killed_over_a_dump(point);
        const RunResult result = run_on(leaves, trace, PropertySet::only(Property::dump_safe));
        EXPECT_FALSE(result.failure) << format_failure(*result.failure, trace, "");
    }
    // The same leftover read by the load (M27) is one, and names it.
    bool named = false;
    for (std::int64_t point = 0; point < points_max && !named; ++point) {
        const RunResult result = run_on(bundled("M27"), killed_over_a_dump(point), PropertySet::only(Property::dump_safe));
        named = result.failure && result.failure->message.find("temporary file left beside it") != std::string::npos;
    }
    EXPECT_TRUE(named) << "no failure of M27 names the leftover";
}

TEST(DumpKill, IsSkippedWithoutAFactoryForFreshEngines) {
    adapters::ReferenceEngine engine;
    const RunResult result = execute({op::DumpKill{0, 1}}, engine, RunOptions{});
    EXPECT_FALSE(result.failure);
    EXPECT_EQ(result.coverage.ops_skipped, 1u);
}

TEST(DumpKill, IsSkippedWhenDumpSafeIsNotChecked) {
    const RunResult result = run_on(bundled("M25"), {op::DumpKill{0, 1}}, PropertySet::only(Property::stored_immutable));
    EXPECT_FALSE(result.failure);
    EXPECT_EQ(result.coverage.ops_skipped, 1u);
}

// An engine whose dump also makes a hard link: the model does not follow
// links, so the harness must say it cannot judge.
class LinkingEngine final : public adapters::ReferenceEngine {
  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        ReferenceEngine::store_dump(dir, fs);
        ::link((dir + "/" + kv::dump_file_name).c_str(), (dir + "/second-name").c_str());
    }
};

// An engine that crashes loading anything (abort: the sanitizers catch a
// SIGSEGV and exit instead).
class CrashingLoadEngine final : public adapters::ReferenceEngine {
  public:
    LoadResult load(const std::string&) override { std::abort(); }
};

// A reduction large enough that libtorch splits it over its threads.
float parallel_sum() { return at::ones({2048, 2048}).sum().item<float>(); }

// An engine whose dump runs parallel work, after the harness's process ran
// some with two threads.
class ParallelDumpEngine final : public adapters::ReferenceEngine {
  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        if (parallel_sum() != 2048.0f * 2048.0f) throw std::runtime_error("the sum is wrong");
        ReferenceEngine::store_dump(dir, fs);
    }
};

// An engine whose load throws (a rejected operation, by the contract).
class ThrowingLoadEngine final : public adapters::ReferenceEngine {
  public:
    LoadResult load(const std::string&) override { throw std::runtime_error("no loading today"); }
};

// An engine whose dump throws.
class ThrowingDumpEngine final : public adapters::ReferenceEngine {
  protected:
    void store_dump(const std::string&, kv::FileSystem&) override { throw std::runtime_error("disk full"); }
};

template <typename E>
RunResult run_fresh(const Trace& trace) {
    E engine;
    RunOptions options;
    options.fresh_engine = [] { return std::shared_ptr<Engine>(std::make_shared<E>()); };
    return execute(trace, engine, options);
}

TEST(DumpKill, ADumpTheModelCannotFollowIsAnEngineErrorNotAPass) {
    const RunResult result = run_fresh<LinkingEngine>({op::Add{"a", spec(1)}, op::DumpKill{0, 2}});
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, engine_error_id);
    EXPECT_NE(result.failure->message.find("hard link"), std::string::npos) << result.failure->message;
}

TEST(DumpKill, AFreshEngineCrashingOnALoadIsAnEngineError) {
    const RunResult result = run_fresh<CrashingLoadEngine>({op::Add{"a", spec(1)}, op::DumpKill{0, 2}});
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, engine_error_id);
    EXPECT_NE(result.failure->message.find("crashed (SIGABRT)"), std::string::npos) << result.failure->message;
}

TEST(DumpKill, AChildRunsParallelRegionsAfterTheParentRanThem) {
    const int threads = at::get_num_threads();
    at::set_num_threads(2);
    ASSERT_EQ(parallel_sum(), 2048.0f * 2048.0f);  // OpenMP's worker threads now exist
    const RunResult result = run_fresh<ParallelDumpEngine>({op::Add{"a", spec(1)}, op::DumpKill{0, 3}});
    at::set_num_threads(threads);
    EXPECT_FALSE(result.failure) << result.failure->message;
}

TEST(DumpKill, AFreshEngineThrowingOnALoadIsAnEngineErrorNamingTheThrow) {
    const RunResult result = run_fresh<ThrowingLoadEngine>({op::Add{"a", spec(1)}, op::DumpKill{0, 2}});
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, engine_error_id);
    EXPECT_NE(result.failure->message.find("threw loading"), std::string::npos) << result.failure->message;
    EXPECT_NE(result.failure->message.find("no loading today"), std::string::npos) << result.failure->message;
}

TEST(DumpKill, ADumpThatThrowsInItsChildIsAnEngineErrorNamingTheThrow) {
    const RunResult result = run_fresh<ThrowingDumpEngine>({op::DumpKill{0, 0}});
    ASSERT_TRUE(result.failure);
    EXPECT_EQ(result.failure->property, engine_error_id);
    EXPECT_NE(result.failure->message.find("the dump threw: disk full"), std::string::npos) << result.failure->message;
}

// ---- corrupted dumps (issue 42, item 5; docs/semantics.md#durability) -----------------------

// A planted bug (issue 42: corruption found every time), not a bundled
// mutant: kvcheck run's default budget draws about one flip of tensor data
// in 200 traces of dump-safe, too few for the self-check. A load that repairs
// the dump's CRC-32s before it reads the file, as a loader that skips the
// check does in effect (torch.load checks none): a flipped byte of tensor
// data loads silently as another value, a flipped pickle byte as another
// id or metadata value where it still parses.
class RepairsCrcs final : public adapters::ReferenceEngine {
  public:
    LoadResult load(const std::string& dir) override {
        kv::FileSystem& fs = file_system();
        const std::string path = dir + "/" + kv::dump_file_name;
        try {
            std::vector<char> bytes = fs.read_file(path, kv::LoadLimits{}.file_bytes_max);
            const DumpLayout layout = dump_layout(std::string_view(bytes.data(), bytes.size()));
            for (const DumpRecord& record : layout.records) {
                const std::uint32_t crc = kv::crc32(bytes.data() + record.data_begin, record.data_size);
                for (const std::size_t field : {record.local_header + 14, record.central_entry + 16}) {
                    for (std::size_t i = 0; i < 4; ++i) bytes[field + i] = static_cast<char>(crc >> (8 * i) & 0xFF);
                }
            }
            if (layout.archive) fs.write_file(path, bytes);
        } catch (const kv::IoError&) {
            // No file: the load says so.
        }
        return ReferenceEngine::load(dir);
    }
};

const Adapter& repairs_crcs() {
    static const Adapter adapter{"repairs-crcs", "a load repairs the dump's CRC-32s first", "test", {Property::dump_safe},
                                 [] { return std::make_shared<RepairsCrcs>(); }};
    return adapter;
}

// A dump of one small entry (2 x 64 bytes of K/V), flipped at `offset`,
// loaded.
Trace flipped_dump(std::int64_t offset) {
    return {op::Add{"a", parse_cache_spec("modern/f32/7:[kv2]")}, op::Dump{0}, op::Corrupt{0, offset, 0}, op::Load{0}};
}

// The size of each byte class (header, metadata, tensor data) of the
// reference's dump of flipped_dump's store.
std::array<std::size_t, 3> class_sizes() {
    const std::string dir = ::testing::TempDir() + "kvcheck-corrupt-classes-" + std::to_string(::getpid());
    Runner runner;
    runner.make = bundled("reference").make;
    runner.options.work_dir = dir;
    Trace dumped = flipped_dump(0);
    dumped.resize(2);  // the add and the dump
    EXPECT_FALSE(runner.run(dumped).failure);
    std::ifstream stream(dir + "/slot-0/" + kv::dump_file_name, std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
    std::filesystem::remove_all(dir);
    const DumpLayout layout = dump_layout(file);
    EXPECT_TRUE(layout.archive);
    std::array<std::size_t, 3> sizes{file.size(), 0, 0};
    for (const DumpRecord& record : layout.records) {
        sizes[record.tensor_data ? 2 : 1] += record.data_size;
        sizes[0] -= record.data_size;
    }
    return sizes;
}

// Every byte of a class, as a corrupt's offset: class c of 3 held, byte p.
std::int64_t offset_of(std::size_t byte_class, std::size_t byte) { return static_cast<std::int64_t>(byte_class + 3 * byte); }

// RepairsCrcs loads whatever the file holds once its CRCs match: every flip of
// tensor data is found, on every byte, and the failure names the byte's
// real offset in the file and its class; the reference refuses each one.
TEST(CorruptDump, EveryFlippedByteOfTensorDataLoadedSilentlyIsFound) {
    const std::size_t tensor_bytes = class_sizes()[2];
    ASSERT_EQ(tensor_bytes, 128u);
    for (std::size_t byte = 0; byte < tensor_bytes; ++byte) {
        const Trace trace = flipped_dump(offset_of(2, byte));
        const RunResult caught = run_on(repairs_crcs(), trace, PropertySet::only(Property::dump_safe));
        ASSERT_TRUE(caught.failure) << "byte " << byte << " of tensor data loaded silently and was not found";
        EXPECT_EQ(caught.failure->property, "dump-safe");
        const std::string& message = caught.failure->message;
        EXPECT_NE(message.find(" gave a store unlike any dump"), std::string::npos) << message;
        EXPECT_NE(message.find("tensor data: record archive/data/"), std::string::npos) << message;
        EXPECT_NE(message.find("its byte " + std::to_string(byte % 64) + ")"), std::string::npos) << message;
        if (byte % 8 != 0) continue;
        const RunResult refused = run_on(bundled("reference"), trace);
        EXPECT_FALSE(refused.failure) << format_failure(*refused.failure, trace, "");
    }
}

// A flip of the pickle (metadata) or of the archive's structure (header)
// is a finding only where it changes what the load gives back: never of
// the reference, which refuses every damaged file (a sample of each
// class's bytes); where RepairsCrcs fails, its message names the class.
TEST(CorruptDump, AFlipOfMetadataOrHeaderIsNoFalseFinding) {
    const std::array<std::size_t, 3> sizes = class_sizes();
    for (const std::size_t byte_class : {0u, 1u}) {
        for (std::size_t byte = 0; byte < sizes[byte_class]; byte += 7) {
            const Trace trace = flipped_dump(offset_of(byte_class, byte));
            const RunResult refused = run_on(bundled("reference"), trace);
            EXPECT_FALSE(refused.failure) << format_failure(*refused.failure, trace, "");
            const RunResult loaded = run_on(repairs_crcs(), trace, PropertySet::only(Property::dump_safe));
            if (!loaded.failure) continue;
            const std::string name = byte_class == 0 ? "; header)" : "; metadata: record archive/";
            EXPECT_NE(loaded.failure->message.find(name), std::string::npos) << loaded.failure->message;
        }
    }
}

// The real byte offset, whatever the trace's offset: a flip of the first
// tensor byte names its place in the file, within the file's size.
TEST(CorruptDump, TheReportNamesTheRealByteOffset) {
    const std::array<std::size_t, 3> sizes = class_sizes();
    const std::size_t file_bytes = sizes[0] + sizes[1] + sizes[2];
    const RunResult caught = run_on(repairs_crcs(), flipped_dump(offset_of(2, 0) + 3 * 128 * 7919), PropertySet::only(Property::dump_safe));
    ASSERT_TRUE(caught.failure);
    const std::string& message = caught.failure->message;
    const std::size_t at = message.find("(corrupted: byte ");
    ASSERT_NE(at, std::string::npos) << message;
    const std::size_t byte = std::stoul(message.substr(at + 17));
    EXPECT_LT(byte, file_bytes) << message;
    EXPECT_NE(message.find(" of " + std::string(kv::dump_file_name) + " flipped (of " + std::to_string(file_bytes) + " bytes; "),
              std::string::npos)
        << message;
}

}  // namespace
}  // namespace kvcheck::props
