// Every known bug is caught: each mutant is found by the seeded workload,
// reported under a property it is known to break, and shrunk to a short
// trace that replays the failure. The reference passes the same budget.
#include "reference/reference_engine.h"
#include "run_util.h"

#include <gtest/gtest.h>

#include <iostream>

namespace kvcheck::props {
namespace {

constexpr std::size_t traces_max = 3000;  // per mutant: the CI budget
constexpr std::uint64_t first_seed = 1;

class Mutant : public ::testing::TestWithParam<std::string> {};

TEST_P(Mutant, IsCaughtByAPropertyItBreaksAndShrunk) {
    const Adapter* adapter = adapters::find_bundled(GetParam());
    ASSERT_NE(adapter, nullptr);
    const WorkloadOptions options;
    const std::optional<Finding> finding = find_and_shrink(*adapter, first_seed, traces_max, options);
    ASSERT_TRUE(finding) << adapter->name << " (" << adapter->description << ") survived " << traces_max << " traces";
    const ShrinkResult& shrunk = finding->shrunk;
    const auto& breaks = adapter->breaks;
    const std::optional<Property> reported = parse_property(shrunk.failure.property);
    EXPECT_TRUE(reported && std::find(breaks.begin(), breaks.end(), *reported) != breaks.end())
        << adapter->name << " was reported under " << shrunk.failure.property << ":\n"
        << format_failure(shrunk.failure, shrunk.trace, reproduce_command(*adapter, shrunk.trace));
    // The shrunk trace replays the same failure, from its text form.
    const Trace replayed = parse_trace(format_trace(shrunk.trace));
    const RunResult again = run_on(*adapter, replayed);
    ASSERT_TRUE(again.failure);
    EXPECT_EQ(again.failure->property, shrunk.failure.property);
    // 4 operations, or 5 when an item is made by a turn and stored back
    // (two operations where an add is one: the shrinker keeps what it found).
    // A paged bug that needs a full pool (PM1's reuse, PM10's refusal)
    // takes a few allocations to fill the 8-block pool first: up to 8
    // operations (PM1: three allocations and two forks fill it, a free
    // and a step make a block reusable, an append reuses it).
    const bool paged = adapter->make()->capabilities().paged;
    EXPECT_LE(shrunk.trace.size(), paged ? 8u : 5u) << format_trace(shrunk.trace);
    std::cout << "[ mutant   ] " << adapter->name << ": " << shrunk.failure.property << " after "
              << finding->traces_tried << " traces (seed " << finding->seed << "), shrunk " << finding->found.size()
              << " -> " << shrunk.trace.size() << " ops in " << shrunk.runs << " runs; find "
              << finding->find_seconds << " s, shrink " << finding->shrink_seconds << " s\n"
              // An expected finding: no trace file is written (a test run
              // leaves nothing in the temp dir); the run command finds it again.
              << format_failure(shrunk.failure, shrunk.trace, "kvcheck run --adapter " + adapter->name);
}

std::vector<std::string> mutant_names() {
    std::vector<std::string> names;
    for (const auto& adapter : adapters::bundled()) {
        // A concurrency mutant's search has lanes: properties/lanes_test.cpp.
        if (!adapter.breaks.empty() && adapter.lanes == 1) names.push_back(adapter.name);
    }
    return names;
}

INSTANTIATE_TEST_SUITE_P(Bundled, Mutant, ::testing::ValuesIn(mutant_names()),
                         [](const auto& info) { return info.param; });

// Each property a mutant is known to break is caught on its own, when it is
// the only property checked: every property fails on a planted bug.
TEST_P(Mutant, BreaksEachListedPropertyOnItsOwn) {
    const Adapter* adapter = adapters::find_bundled(GetParam());
    ASSERT_NE(adapter, nullptr);
    for (const Property property : adapter->breaks) {
        const std::string id = property_id(property);
        const auto finding = find_and_shrink(*adapter, first_seed, traces_max, WorkloadOptions{}, PropertySet::only(property));
        ASSERT_TRUE(finding) << adapter->name << " never breaks " << id << " alone in " << traces_max << " traces";
        EXPECT_EQ(finding->shrunk.failure.property, id);
        std::cout << "[ alone    ] " << adapter->name << " / " << id << ": " << finding->shrunk.trace.size()
                  << " ops after " << finding->traces_tried << " traces\n";
    }
}

TEST(Properties, EveryPropertyIsBrokenBySomeMutant) {
    for (Property property : all_properties()) {
        bool listed = false;
        for (const auto& adapter : adapters::bundled()) {
            const auto& breaks = adapter.breaks;
            listed = listed || std::find(breaks.begin(), breaks.end(), property) != breaks.end();
        }
        EXPECT_TRUE(listed) << property_id(property) << " has no mutant that breaks it";
    }
}

void expect_passes(const std::string& name, std::size_t traces) {
    const Adapter* reference = adapters::find_bundled(name);
    ASSERT_NE(reference, nullptr);
    const auto finding = find_and_shrink(*reference, first_seed, traces, WorkloadOptions{});
    EXPECT_FALSE(finding) << format_failure(finding->shrunk.failure, finding->shrunk.trace,
                                            reproduce_command(*reference, finding->shrunk.trace));
}

TEST(Reference, PassesTheSameBudget) { expect_passes("reference", traces_max); }

// The same over a store window (docs/semantics.md#store-windows): every
// cache it stores, hands out or makes is cut to its last 4 tokens, and
// kvcheck compares only those; nothing is a finding.
TEST(ReferenceWindow, PassesTheSameBudget) { expect_passes("reference-window", traces_max); }

// The same for a quantized store (docs/semantics.md#content-tolerance): what
// it reads back is off the content by its rounding, within the tolerance it
// declares; nothing is a finding. A tenth of the budget: it shares every
// path with the reference but the comparison within the tolerance.
TEST(ReferenceQuantized, PassesATenthOfTheBudget) { expect_passes("reference-quantized", traces_max / 10); }

// Concurrent requests' readings are compared with the expected content
// exactly: linearizable is not checked under a tolerance, nor is a killed dump.
TEST(ReferenceQuantized, DeclaresItsToleranceAndIsNotJudgedWhereContentIsComparedExactly) {
    const Capabilities capabilities = adapters::find_bundled("reference-quantized")->make()->capabilities();
    EXPECT_EQ(capabilities.content_tolerance.rel, 1.0 / 256);
    EXPECT_FALSE(checkable(capabilities).has(Property::linearizable));
    EXPECT_TRUE(checkable(capabilities).has(Property::stored_immutable));
    EXPECT_FALSE(capabilities.dump_kill);
}

// A tolerance loosens only the comparison with what kvcheck expects: a
// cache read twice must read the same. A quantized store that nudges one
// value of a float32 or float16 cache by 2^-10 of it, once, well inside the
// 2^-8 it declares, is caught exactly: a stored entry its get_cache copies, by
// stored-immutable; the cache a generation decoded from (not an owned
// copy), by clone-independent.
class NudgesBelowTheTolerance final : public adapters::ReferenceEngine {
  public:
    enum class Where : std::uint8_t { stored_copied, generation_source };
    explicit NudgesBelowTheTolerance(Where where) : where_(where) { quantize(); }
    void get_cache(const std::vector<std::string>& ids, Handle out) override {
        ReferenceEngine::get_cache(ids, out);
        if (where_ != Where::stored_copied) return;
        for (const std::string& id : ids) {
            if (store_.get(id) != nullptr) nudge(*stored(id));
        }
    }
    GenerateResult generate(Handle h, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                            bool stream) override {
        GenerateResult result = ReferenceEngine::generate(h, prompt, max_new_tokens, stream);
        if (where_ != Where::generation_source) return result;
        // Not an owned copy (the model's to write) and not a stored entry (stored-immutable's).
        const kv::ConstCachePtr source = handle(h);
        if (!source || source->owned()) return result;
        for (const std::string& id : stored_ids()) {
            if (stored(id) == source) return result;
        }
        nudge(*source);
        return result;
    }

  private:
    // Once an engine: a second nudge of a cache read in between would be
    // caught by the reading after the first.
    void nudge(const kv::Cache& cache) {
        if (nudged_ || cache.layer_count() == 0) return;
        const at::Tensor keys = cache.layout() == kv::Layout::legacy ? (*cache.key_cache())[0] : (*cache.layers())[0]->keys;
        if (!keys.defined() || keys.dim() != 4 || keys.numel() == 0 || keys.scalar_type() == at::kBFloat16) return;
        keys[0][0][0][0].mul_(1.0 + 1.0 / 1024);
        nudged_ = true;
    }
    Where where_;
    bool nudged_ = false;
};

// Each with only its property checked: no other property's reading of the
// cache comes first.
void expect_the_nudge_caught(NudgesBelowTheTolerance::Where where, Property property) {
    const Adapter nudging{"nudges-below-the-tolerance", "nudges one value by 2^-10", "test", {}, [where] {
                              return std::shared_ptr<Engine>(std::make_shared<NudgesBelowTheTolerance>(where));
                          }};
    const auto finding = find_and_shrink(nudging, first_seed, traces_max / 10, WorkloadOptions{}, PropertySet::only(property));
    ASSERT_TRUE(finding) << "a write below the tolerance went unseen (" << property_id(property) << ")";
    EXPECT_EQ(finding->shrunk.failure.property, property_id(property));
    EXPECT_NE(finding->shrunk.failure.message.find("differs from its first reading"), std::string::npos)
        << finding->shrunk.failure.message;
}

TEST(ReferenceQuantized, AWriteBelowTheToleranceIntoAStoredEntryIsCaughtByStoredImmutable) {
    expect_the_nudge_caught(NudgesBelowTheTolerance::Where::stored_copied, Property::stored_immutable);
}

TEST(ReferenceQuantized, AWriteBelowTheToleranceIntoAGenerationsSourceIsCaughtByCloneIndependent) {
    expect_the_nudge_caught(NudgesBelowTheTolerance::Where::generation_source, Property::clone_independent);
}

// A tenth of the budget: a paged trace runs the model on every alloc and
// append and reads the pool twice a step (the mutants are found in far fewer).
void expect_passes_a_tenth_of_the_budget(const std::string& name) { expect_passes(name, traces_max / 10); }

TEST(PagedReference, PassesATenthOfTheBudget) { expect_passes_a_tenth_of_the_budget("paged-reference"); }

// The same over a sliding-window model (docs/semantics.md#sliding-windows):
// its pool frees the blocks behind every window and tables hold the null
// block; nothing is a finding.
TEST(PagedReferenceWindow, PassesATenthOfTheBudget) { expect_passes_a_tenth_of_the_budget("paged-reference-window"); }

// The reference with read leases on kvcheck's clock (docs/semantics.md#leases):
// the refusals a live lease makes are due, none after its expiry.
TEST(ReferenceLeases, PassesATenthOfTheBudget) { expect_passes_a_tenth_of_the_budget("reference-leases"); }

// The default schedule reads around each step only what the step can reach
// (harness/run/schedule.cpp); it must find what reading every entry after every
// step finds, on the same traces, under the same property, at the same
// step or later. Long traces too, so that the periodic full reads run (two
// tests, which ctest runs side by side: mutant.schedule-short and -long).
void expect_schedules_agree(std::size_t ops, std::uint64_t seeds) {
    RunOptions strict;
    strict.every_entry_every_step = true;
    std::size_t failing = 0;
    std::size_t later = 0;
    WorkloadOptions workload;
    workload.trace_ops_max = ops;
    for (const auto& adapter : adapters::bundled()) {
        // The paged family reads no stored entry around its operations:
        // the schedule is the contiguous family's.
        if (adapter.make()->capabilities().paged) continue;
        for (std::uint64_t seed = first_seed; seed < first_seed + seeds; ++seed) {
            const Trace trace = trace_for_seed(seed, workload);
            const RunResult focused = run_on(adapter, trace);
            const std::shared_ptr<Engine> engine = adapter.make();
            strict.fresh_engine = adapter.make;  // as the Runner of run_on sets it: dump_kill runs in both
            const RunResult exact = execute(trace, *engine, strict);
            const std::string where = adapter.name + ", seed " + std::to_string(seed) + ", " + std::to_string(ops) +
                                      " ops max:\n" + format_trace(trace);
            ASSERT_EQ(focused.failure.has_value(), exact.failure.has_value()) << where;
            if (!exact.failure) continue;
            ++failing;
            EXPECT_EQ(focused.failure->property, exact.failure->property)
                << where << "default: " << focused.failure->message << "\nevery step: " << exact.failure->message;
            EXPECT_GE(focused.failure->step, exact.failure->step) << where;
            if (focused.failure->step > exact.failure->step) ++later;
        }
    }
    EXPECT_GT(failing, 0u);
    std::cout << "[ schedule ] " << failing << " failing traces of " << ops
              << " operations at most, the same under both schedules; " << later
              << " found at a later step by the default one\n";
}

TEST(Schedule, FindsWhatReadingEverythingEveryStepFindsInShortTraces) { expect_schedules_agree(24, 150); }

TEST(Schedule, FindsWhatReadingEverythingEveryStepFindsInLongTraces) { expect_schedules_agree(80, 40); }

}  // namespace
}  // namespace kvcheck::props
