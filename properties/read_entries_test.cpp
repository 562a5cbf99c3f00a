// Reading many entries at once (Engine::read_entries, entry_versions): the
// full reads ask for every entry in one call, so a batch must report exactly
// what the one-entry methods report (the reference's, which brings entries
// into the cache a chunk at a time, over chunk boundaries included), and an
// adapter whose batch and one-entry methods disagree must be named, not
// taken at its word.
#include "generators.h"
#include "reference/reference_engine.h"
#include "run_util.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <string>
#include <vector>

namespace kvcheck::props {
namespace {

void expect_same(const std::vector<EntryFacts>& actual, const std::vector<EntryFacts>& expected, bool with_storage) {
    RC_ASSERT(actual.size() == expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i) {
        RC_ASSERT(actual[i].digest == expected[i].digest);
        RC_ASSERT(actual[i].owned == expected[i].owned);
        RC_ASSERT(actual[i].storage == expected[i].storage);
        if (!with_storage) RC_ASSERT(actual[i].storage.empty());
    }
}

TEST(ReadEntries, TheReferencesAreItsOneEntryReads) {
    EXPECT_TRUE(rc::check("stores of up to 70 entries (chunks of 32), some stored back from handles", [] {
        adapters::ReferenceEngine engine;
        const auto count = *rc::gen::inRange<std::size_t>(1, 70);
        std::vector<std::string> ids;
        for (std::size_t i = 0; i < count; ++i) {
            ids.push_back("e" + std::to_string(i));
            if (*rc::gen::inRange(0, 4) == 0) {
                // An owned copy stored back: the store clears its marker.
                engine.make(expand(any_spec()), 1);
                engine.clone(1, 2);
                engine.add_handle(ids.back(), 2);
            } else {
                engine.add(ids.back(), expand(any_spec()), {});
            }
        }
        // Asked in any order, with repeats.
        std::vector<std::string> asked = *rc::gen::container<std::vector<std::string>>(rc::gen::elementOf(ids));
        for (const bool with_storage : {true, false}) {
            expect_same(engine.read_entries(asked, with_storage), engine.Engine::read_entries(asked, with_storage),
                        with_storage);
        }
    }));
}

TEST(ReadEntries, AMissingIdIsNamed) {
    adapters::ReferenceEngine engine;
    engine.add("a", expand(parse_cache_spec("modern/f32/3:[kv2 kv3]")), {});
    try {
        engine.read_entries({"a", "b"}, true);
        FAIL() << "read_entries of a missing id returned";
    } catch (const std::out_of_range& error) {
        EXPECT_NE(std::string(error.what()).find("'b'"), std::string::npos) << error.what();
    }
}

// An adapter whose batch says something its one-entry methods do not.
enum class Lie { digest, owned, storage, count };

class LyingBatch : public adapters::ReferenceEngine {
  public:
    explicit LyingBatch(Lie lie) : lie_(lie) {}

    std::vector<EntryFacts> read_entries(const std::vector<std::string>& ids, bool with_storage) override {
        std::vector<EntryFacts> facts = ReferenceEngine::read_entries(ids, with_storage);
        if (lie_ == Lie::count) facts.pop_back();
        for (EntryFacts& fact : facts) {
            if (lie_ == Lie::digest) fact.digest += 1;
            if (lie_ == Lie::owned) fact.owned = true;
            // Every entry claims the storage of the cache handed out as h1.
            if (lie_ == Lie::storage) {
                const std::vector<std::uint64_t> handed_out = storage_of_handle(1);
                fact.storage.insert(fact.storage.end(), handed_out.begin(), handed_out.end());
            }
        }
        return facts;
    }

  private:
    Lie lie_;
};

TEST(ReadEntries, ABatchThatDisagreesWithItsOneEntryReadsIsAnEngineError) {
    const CacheSpec spec = parse_cache_spec("modern/f32/3:[kv2 kv3]");
    const Trace trace = {op::Add{"a", spec}, op::Add{"b", spec}, op::GetCache{{1}, {"b"}}, op::GetAll{}};
    const std::vector<std::pair<Lie, std::string>> lies = {
        {Lie::digest, "read_entries and entry_digest disagree on entry \"a\""},
        {Lie::owned, "read_entries and entry_owned disagree on entry \"a\""},
        {Lie::storage, "read_entries and storage_of_entry disagree on entry \"a\""},
        {Lie::count, "read_entries returned 1 results for 2 ids"},
    };
    for (const auto& [lie, message] : lies) {
        SCOPED_TRACE(message);
        LyingBatch engine(lie);
        const RunResult result = execute(trace, engine);
        ASSERT_TRUE(result.failure);
        EXPECT_EQ(result.failure->property, engine_error_id);
        EXPECT_NE(result.failure->message.find(message), std::string::npos) << result.failure->message;
        EXPECT_NE(result.failure->message.find("end of the run"), std::string::npos) << result.failure->message;
    }
}

// The reference, counting its one-entry reads made outside a batch.
class CountingReads : public adapters::ReferenceEngine {
  public:
    std::size_t batches = 0;
    std::size_t batched_ids = 0;
    std::size_t alone = 0;  // one-entry reads asked by the harness itself

    std::vector<EntryFacts> read_entries(const std::vector<std::string>& ids, bool with_storage) override {
        ++batches;
        batched_ids += ids.size();
        in_batch_ = true;
        std::vector<EntryFacts> facts = ReferenceEngine::read_entries(ids, with_storage);
        in_batch_ = false;
        return facts;
    }
    std::uint64_t entry_digest(const std::string& id) override {
        alone += in_batch_ ? 0 : 1;
        return ReferenceEngine::entry_digest(id);
    }
    bool entry_owned(const std::string& id) override {
        alone += in_batch_ ? 0 : 1;
        return ReferenceEngine::entry_owned(id);
    }
    std::vector<std::uint64_t> storage_of_entry(const std::string& id) override {
        alone += in_batch_ ? 0 : 1;
        return ReferenceEngine::storage_of_entry(id);
    }

  private:
    bool in_batch_ = false;
};

TEST(ReadEntries, TheReadAtTheEndOfARunAsksForEveryEntryInOneCall) {
    const CacheSpec spec = parse_cache_spec("legacy/f32/2:[kv1]");
    Trace trace;
    for (int i = 0; i < 40; ++i) trace.push_back(op::Add{"e" + std::to_string(i), spec});
    trace.push_back(op::GetAll{});  // reads no entry: the counts at its start are those before the final read
    CountingReads engine;
    std::size_t batches = 0, batched_ids = 0, alone = 0;
    RunOptions options;
    options.on_step = [&](std::size_t step) {
        if (step + 1 < trace.size()) return;
        batches = engine.batches;
        batched_ids = engine.batched_ids;
        alone = engine.alone;
    };
    const RunResult result = execute(trace, engine, options);
    ASSERT_FALSE(result.failure) << result.failure->message;
    EXPECT_EQ(engine.batches, batches + 1);
    EXPECT_EQ(engine.batched_ids, batched_ids + 40);
    EXPECT_EQ(engine.alone, alone);
}

}  // namespace
}  // namespace kvcheck::props
