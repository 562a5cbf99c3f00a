// Concurrent clients at the thread level (kvcheck/threads.h,
// docs/semantics.md#the-thread-level): the references declare thread_safe
// and pass; a run is a function of its plan and schedule (it replays); each
// thread mutant is found at the thread level under a property it breaks,
// shrunk to at most 3 client lanes, replays alike, and is found neither by
// the operation level (--lanes, each call atomic) nor by one client in the
// same budget.
#include "run_util.h"

#include "checkers/checker.h"

#include "kvcheck/stress.h"
#include "kvcheck/threads.h"
#include "kvcheck/yield.h"
#include "mutants/mutants.h"
#include "reference/paged_reference.h"
#include "reference/reference_engine.h"

#include <gtest/gtest.h>

#include <iostream>
#include <tuple>

namespace kvcheck::props {
namespace {

constexpr std::size_t traces_max = 300;
constexpr std::uint64_t first_seed = 1;

WorkloadOptions thread_options(const Adapter& adapter, std::int64_t lanes) {
    WorkloadOptions options;
    options.capabilities = adapter.make()->capabilities();
    options.lanes = lanes;
    options.threads = true;
    return options;
}

TEST(Threads, TheReferencesDeclareThreadSafe) {
    for (const char* name : {"reference", "paged-reference", "paged-reference-window"}) {
        const Adapter* adapter = adapters::find_bundled(name);
        ASSERT_NE(adapter, nullptr);
        EXPECT_TRUE(adapter->make()->capabilities().thread_safe) << name;
    }
}

TEST(Threads, ARunReplaysFromItsSchedule) {
    for (const char* name : {"reference", "paged-reference"}) {
        const Adapter* adapter = adapters::find_bundled(name);
        ASSERT_NE(adapter, nullptr);
        // Runs where a client ran while another held the lock: half the
        // drawn schedules let clients wait there (Scheduler::pick), so 40.
        std::size_t overlapping = 0;
        for (std::uint64_t seed = 1; seed <= 40; ++seed) {
            const LanePlan plan = thread_plan(seed, thread_options(*adapter, 3));
            const ThreadRunResult drawn = run_threads(*adapter->make(), plan, {seed, std::nullopt});
            EXPECT_FALSE(drawn.failure) << drawn.failure->message;
            const ThreadRunResult again = run_threads(*adapter->make(), plan, {0, drawn.schedule});
            EXPECT_EQ(again.history, drawn.history);
            EXPECT_FALSE(again.diverged);
            EXPECT_EQ(yield_hook, nullptr);  // set for the length of a run only
            const auto paused = [](const std::string& line) { return line.find("paused at locked") != std::string::npos; };
            if (std::any_of(drawn.history.begin(), drawn.history.end(), paused)) ++overlapping;
        }
        EXPECT_GE(overlapping, 10u) << name;  // the calls do overlap: the lock, not the scheduler, keeps them whole
    }
}

// The store family's quiescent checks other than linearizable, each on a
// planted bug (TM3 and TM4 show linearizable's).
class HandsOutTheEntry final : public adapters::ReferenceEngine {
  protected:
    kv::CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        const kv::ItemPtr item = store_.get(ids.front());
        return item ? std::const_pointer_cast<kv::Cache>(item->cache) : nullptr;
    }
};

// Hands out the stored cache, declares no storage identities, and
// overwrites an entry in place: a held copy changes under its client.
class OverwritesWhatItHandedOut final : public adapters::ReferenceEngine {
  public:
    Capabilities capabilities() const override {
        Capabilities declared = ReferenceEngine::capabilities();
        declared.storage_identity = false;
        return declared;
    }

  protected:
    kv::CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        const kv::ItemPtr item = store_.get(ids.front());
        return item ? std::const_pointer_cast<kv::Cache>(item->cache) : nullptr;
    }
    void store_add(const std::string& id, const kv::CachePtr& cache, const Metadata& metadata) override {
        const kv::ItemPtr item = store_.get(id);
        if (!item) return ReferenceEngine::store_add(id, cache, metadata);
        *std::const_pointer_cast<kv::Cache>(item->cache) = *cache;
    }
};

class ListsTwice final : public adapters::ReferenceEngine {
  public:
    std::vector<std::string> stored_ids() override {
        std::vector<std::string> ids = ReferenceEngine::stored_ids();
        if (!ids.empty()) ids.push_back(ids.front());
        return ids;
    }
};

TEST(Threads, TheStoresQuiescentChecksFailOnPlantedBugs) {
    const CacheSpec spec = std::get<op::Add>(parse_trace("add a modern/f32/3:[kv2]").at(0)).cache;
    LanePlan plan;
    plan.lanes = {{op::Add{"a", spec, {}}}, {op::GetCache{HandleName{101}, {"a"}}, op::Release{HandleName{101}}}};
    HandsOutTheEntry shares;
    const ThreadRunResult shared = run_threads(shares, plan, {1, std::nullopt});
    ASSERT_TRUE(shared.failure);
    EXPECT_EQ(shared.failure->property, "stored-immutable");
    EXPECT_NE(shared.failure->message.find("shares storage with the stored entry"), std::string::npos) << shared.failure->message;
    ListsTwice twice;
    const ThreadRunResult listed = run_threads(twice, plan, {1, std::nullopt});
    ASSERT_TRUE(listed.failure);
    EXPECT_EQ(listed.failure->property, "store-contract");
    OverwritesWhatItHandedOut overwrites;
    LanePlan overwritten = plan;
    overwritten.lanes[1].insert(overwritten.lanes[1].begin() + 1,
                                std::get<op::Add>(parse_trace("add a modern/f32/5:[kv3]").at(0)));
    const ThreadRunResult changed = run_threads(overwrites, overwritten, {1, std::nullopt});
    ASSERT_TRUE(changed.failure);
    EXPECT_EQ(changed.failure->property, "stored-immutable");
    EXPECT_NE(changed.failure->message.find("changed while its client held it"), std::string::npos) << changed.failure->message;
    adapters::ReferenceEngine sound;
    const ThreadRunResult passed = run_threads(sound, plan, {1, std::nullopt});
    EXPECT_FALSE(passed.failure) << passed.failure->message;
}

// Three seeds far apart, 3 and 6 lanes: the lock keeps every call whole
// (the references yield inside it, so other clients do run and wait).
TEST(Threads, TheReferencesPassTheThreadLevel) {
    for (const char* name : {"reference", "paged-reference", "paged-reference-window"}) {
        const Adapter* adapter = adapters::find_bundled(name);
        ASSERT_NE(adapter, nullptr);
        for (const std::uint64_t seed : {first_seed, std::uint64_t{20261202}, std::uint64_t{1} << 40}) {
            for (const std::int64_t lanes : {3, 6}) {
                // The store's traces write and load dumps (each flushed to disk): half the budget.
                const std::size_t traces = std::string(name) == "reference" ? traces_max / 6 : traces_max / 3;
                const std::optional<ThreadFinding> found =
                    search_threads(adapter->make, thread_options(*adapter, lanes), seed, traces);
                EXPECT_FALSE(found) << format_thread_finding(*found);
            }
        }
    }
}

// A store with a capacity (lru and lrs, 2 entries, so that adds evict
// often): what it evicts under concurrent adds and reads is what some
// linearization's policy evicts (TM5 shows the check failing).
TEST(Threads, BoundedReferencesPassTheThreadLevel) {
    for (const Eviction eviction : {Eviction::lru, Eviction::lrs}) {
        const EngineFactory make = [eviction] {
            auto engine = std::make_shared<adapters::ReferenceEngine>();
            engine->set_capacity(2, eviction);
            return std::shared_ptr<Engine>(std::move(engine));
        };
        const Adapter adapter{"bounded", "", "test", {}, make};
        for (const std::int64_t lanes : {3, 6}) {
            const std::optional<ThreadFinding> found = search_threads(make, thread_options(adapter, lanes), first_seed, traces_max / 6);
            EXPECT_FALSE(found) << eviction_name(eviction) << ":\n" << format_thread_finding(*found);
        }
    }
}

// The bounded model of linearizable's search, one policy against another:
// add a, b, a again, then c in a store of 2: fifo evicts a (stored first),
// lrs and lru evict b (a was stored, so used, again); a read of b before c
// makes lru evict a instead. Each object's digest is its number.
class ObjectsAreTheirDigests final : public checkers::StoreModel {
  public:
    bool holds_tokens(ObjectId) override { return true; }
    std::uint64_t digest(ObjectId object) override { return static_cast<std::uint64_t>(object); }
    const Tokens& fresh(ObjectId, const Tokens&, std::int64_t) override { return none_; }

  private:
    Tokens none_;
};

TEST(Threads, ABoundedStoresEvictionsAreThoseOfItsPolicy) {
    std::vector<checkers::StoreRequest> requests;
    const auto request = [&](checkers::StoreRequest::Kind kind, const std::string& id, ObjectId object) {
        checkers::StoreRequest made;
        made.kind = kind;
        made.ids = {id};
        made.object = object;
        made.first = made.last = requests.size();
        made.ended = true;
        if (kind == checkers::StoreRequest::Kind::read) made.copy = static_cast<std::uint64_t>(object);
        requests.push_back(made);
    };
    const auto write = checkers::StoreRequest::Kind::write;
    request(write, "a", 1);
    request(write, "b", 2);
    request(write, "a", 3);
    const auto stuck = [&](Eviction eviction, std::vector<checkers::StoreRequest> all, std::map<std::string, std::uint64_t> held) {
        checkers::StoreRequest c;
        c.kind = write;
        c.ids = {"c"};
        c.object = 4;
        c.first = c.last = all.size();
        c.ended = true;
        all.push_back(c);
        checkers::StoreRequest whole;
        whole.kind = checkers::StoreRequest::Kind::whole;
        whole.held = std::move(held);
        whole.first = whole.last = all.size();
        whole.ended = true;
        all.push_back(whole);
        std::vector<const checkers::StoreRequest*> pointers;
        for (const checkers::StoreRequest& one : all) pointers.push_back(&one);
        ObjectsAreTheirDigests model;
        StorePolicy policy;
        policy.capacity_items = 2;
        policy.eviction = eviction;
        return checkers::linearization_stuck(pointers, model, policy).has_value();
    };
    const std::map<std::string, std::uint64_t> kept_a = {{"a", 3}, {"c", 4}}, kept_b = {{"b", 2}, {"c", 4}};
    EXPECT_FALSE(stuck(Eviction::fifo, requests, kept_b));
    EXPECT_TRUE(stuck(Eviction::fifo, requests, kept_a));
    EXPECT_FALSE(stuck(Eviction::lrs, requests, kept_a));
    EXPECT_TRUE(stuck(Eviction::lrs, requests, kept_b));
    EXPECT_FALSE(stuck(Eviction::lru, requests, kept_a));
    request(checkers::StoreRequest::Kind::read, "b", 2);  // a use under lru only
    EXPECT_FALSE(stuck(Eviction::lru, requests, kept_b));
    EXPECT_TRUE(stuck(Eviction::lru, requests, kept_a));
    EXPECT_FALSE(stuck(Eviction::lrs, requests, kept_a));
    EXPECT_TRUE(stuck(Eviction::lrs, requests, {{"a", 3}, {"b", 2}, {"c", 4}}));  // past the capacity: no state
    EXPECT_THROW(stuck(Eviction::unspecified, requests, kept_a), std::invalid_argument);
}

// A plugin's own copy of the hook (kvcheck_plugin::yield_hook, registered
// by add_yield_slot when kvcheck opens the plugin) is set for the length of
// a run: a yield through it reaches the scheduler.
kvcheck_yield_fn plugin_slot = nullptr;

class YieldsThroughItsSlot final : public adapters::PagedReference {
  public:
    void paged_step() override {
        if (plugin_slot != nullptr) plugin_slot("plugin_step");
        PagedReference::paged_step();
    }
};

TEST(Threads, APluginsYieldHookIsSetForTheRun) {
    add_yield_slot(&plugin_slot);
    const Adapter* adapter = adapters::find_bundled("paged-reference");
    ASSERT_NE(adapter, nullptr);
    std::size_t paused = 0;
    for (std::uint64_t seed = 1; seed <= 40; ++seed) {
        YieldsThroughItsSlot engine;
        const ThreadRunResult run = run_threads(engine, thread_plan(seed, thread_options(*adapter, 3)), {seed, std::nullopt});
        EXPECT_FALSE(run.failure) << run.failure->message;
        for (const std::string& line : run.history) paused += line.find("paused at plugin_step") != std::string::npos ? 1 : 0;
        EXPECT_EQ(plugin_slot, nullptr);
    }
    EXPECT_GT(paused, 0u);
}

TEST(Threads, AThreadTraceNeedsItsHeaderWhole) {
    EXPECT_FALSE(parse_thread_trace("# a lanes trace\npaged_step\nswitch lane=1\npaged_step\n"));
    const std::optional<ThreadTrace> parsed = parse_thread_trace("# x\nthreads lanes=3 schedule=2,1\npaged_step\nswitch lane=2\npaged_evict\n");
    ASSERT_TRUE(parsed);
    EXPECT_EQ(parsed->schedule, (std::vector<std::int64_t>{2, 1}));
    ASSERT_EQ(parsed->plan.lanes.size(), 3u);  // lane 1 emptied, kept: the schedule's numbers stand
    EXPECT_EQ(parsed->plan.lanes[1].size(), 0u);
    EXPECT_EQ(parsed->plan.lanes[2].size(), 1u);
    for (const char* bad : {"threads lanes=3\n", "threads schedule=1\n", "threads lanes=1 schedule=\n", "threads lanes=3 schedule=3\n",
                            "threads lanes=2 schedule=1 color=red\n", "threads lanes=2 schedule=\nswitch lane=2\npaged_step\n"}) {
        EXPECT_THROW(parse_thread_trace(bad), TraceParseError) << bad;
    }
}

// A plain stress run (kvcheck/stress.h) is judged by the thread level's
// checks, at the end of each round: the references pass its rounds; engines
// broken sequentially are found in its first rounds (M2 by linearizable;
// PM12 by the pool's own assertion, which fires before the round's end; a
// paged state that misreports a count by refcount-exact); a round that
// crashes or never ends is found too, in the child the rounds run in.
class MiscountsABlock final : public adapters::PagedReference {
  public:
    PagedState paged_state() override {
        PagedState state = PagedReference::paged_state();
        if (state.blocks.size() > 1) ++state.blocks[1].count;
        return state;
    }
};

class AbortsAtAFree final : public adapters::PagedReference {
  public:
    void paged_free(std::int64_t) override { std::abort(); }
};

class NeverReturnsFromAFree final : public adapters::PagedReference {
  public:
    void paged_free(std::int64_t) override {
        for (volatile std::uint64_t turns = 0;; turns = turns + 1) {
        }
    }
};

TEST(Threads, AStressRunIsJudgedByTheThreadLevelsChecks) {
    constexpr std::size_t rounds = 20;
    std::size_t overlapping = 0;  // rounds where a lane's call began inside another lane's
    for (const char* name : {"reference", "paged-reference"}) {
        const Adapter* adapter = adapters::find_bundled(name);
        ASSERT_NE(adapter, nullptr);
        for (std::uint64_t seed = 1; seed <= rounds; ++seed) {
            const ThreadRunResult round = run_stress(*adapter->make(), thread_plan(seed, thread_options(*adapter, 4)));
            EXPECT_FALSE(round.failure) << name << " seed " << seed << ": " << round.failure->message;
            EXPECT_TRUE(round.schedule.empty());
            std::map<std::string, bool> inside;  // lane -> in a call
            bool overlapped = false;
            for (const std::string& line : round.history) {
                const std::string lane = line.substr(0, line.find(':'));
                const bool response = line.find(": -> ") != std::string::npos || line.find(": threw ") != std::string::npos;
                if (!response && line.rfind("lane ", 0) == 0) {
                    for (const auto& [other, busy] : inside) overlapped = overlapped || (busy && other != lane);
                }
                inside[lane] = !response;
            }
            overlapping += overlapped ? 1 : 0;
        }
    }
    std::cout << "[ stress   ] " << overlapping << " of " << 2 * rounds << " rounds had calls of two lanes overlap\n";
    const auto found = [](const EngineFactory& make, const Adapter& like) {
        return stress_search(make, thread_options(like, 4), first_seed, {rounds, 0, 120});
    };
    const Adapter* paged = adapters::find_bundled("paged-reference");
    // What a round finds may depend on how its threads ran (M2's changed
    // entry may be deleted before the end; PM12's double release may be
    // the last call to touch its block): either of two findings, within 3 rounds.
    for (const auto& [name, one, other] : {std::tuple{"M2", "linearizable", "stored-immutable"},
                                           std::tuple{"PM12", "engine-error", "refcount-exact"}}) {
        const Adapter* adapter = adapters::find_bundled(name);
        ASSERT_NE(adapter, nullptr);
        const StressOutcome outcome = found(adapter->make, *adapter);
        ASSERT_TRUE(outcome.failure) << name << " survived " << rounds << " stress rounds";
        EXPECT_TRUE(outcome.failure->property == one || outcome.failure->property == other) << outcome.failure->message;
        EXPECT_LE(outcome.rounds, 3u) << name;
        EXPECT_FALSE(outcome.history.empty());
    }
    const StressOutcome hidden = found([] { return std::make_shared<MiscountsABlock>(); }, *paged);
    ASSERT_TRUE(hidden.failure);
    EXPECT_EQ(hidden.failure->property, "refcount-exact") << hidden.failure->message;
    EXPECT_EQ(hidden.rounds, 1u);  // wrong whatever the schedule
    const StressOutcome crashed = found([] { return std::make_shared<AbortsAtAFree>(); }, *paged);
    ASSERT_TRUE(crashed.failure);
    EXPECT_TRUE(crashed.crashed);
    EXPECT_EQ(crashed.failure->property, "engine-error");
    EXPECT_NE(crashed.failure->message.find("killed by SIGABRT"), std::string::npos) << crashed.failure->message;
    EXPECT_EQ(crashed.round_seed, first_seed + crashed.rounds - 1);
    const StressOutcome looped =
        stress_search([] { return std::make_shared<NeverReturnsFromAFree>(); }, thread_options(*paged, 4), first_seed, {rounds, 0, 120, 0.2});
    ASSERT_TRUE(looped.failure);
    EXPECT_TRUE(looped.hung);
    EXPECT_NE(looped.failure->message.find("hung (a round used 0.2 s of CPU)"), std::string::npos) << looped.failure->message;
}

class ThreadMutant : public ::testing::TestWithParam<std::size_t> {};

TEST_P(ThreadMutant, IsFoundWithThreadsAndNotWithoutThem) {
    const Adapter adapter = adapters::thread_mutant_adapters().at(GetParam());
    const std::optional<ThreadFinding> found = search_threads(adapter.make, thread_options(adapter, 6), first_seed, traces_max);
    ASSERT_TRUE(found) << adapter.name << " survived " << traces_max << " thread-level traces";
    const Failure& failure = *found->result.failure;
    const std::optional<Property> reported = parse_property(failure.property);
    EXPECT_TRUE(reported && std::find(adapter.breaks.begin(), adapter.breaks.end(), *reported) != adapter.breaks.end())
        << format_thread_finding(*found);
    EXPECT_LE(found->plan.lanes.size() - 1, 3u) << format_thread_finding(*found);
    EXPECT_EQ(found->replays_same, found->replays) << format_thread_finding(*found);
    const ThreadRunResult again = run_threads(*adapter.make(), found->plan, {0, found->result.schedule});
    ASSERT_TRUE(again.failure);
    EXPECT_EQ(again.failure->message, failure.message);
    EXPECT_EQ(again.history, found->result.history);
    EXPECT_FALSE(again.diverged);  // every choice of the shrunk schedule names a lane that could run
    // Its trace file's text (kvcheck run --threads writes it, kvcheck replay
    // reads it) holds the plan and the schedule: the same run again.
    const std::optional<ThreadTrace> parsed = parse_thread_trace(thread_trace_text(found->plan, found->result));
    ASSERT_TRUE(parsed);
    EXPECT_EQ(parsed->schedule, found->result.schedule);
    ASSERT_EQ(parsed->plan.lanes.size(), found->plan.lanes.size());
    for (std::size_t lane = 0; lane < parsed->plan.lanes.size(); ++lane) {
        EXPECT_EQ(format_trace(parsed->plan.lanes[lane]), format_trace(found->plan.lanes[lane]));
    }
    EXPECT_EQ(run_threads(*adapter.make(), parsed->plan, {0, parsed->schedule}).history, found->result.history);
    std::cout << "[ threads  ] " << adapter.name << ": found after " << found->traces << " traces\n"
              << format_thread_finding(*found);

    // The operation level (the same requests, each call atomic) and one
    // client, on the same seeds and budget, find nothing.
    for (const std::int64_t lanes : {3, 1}) {
        const std::optional<Finding> without = find_and_shrink(adapter, first_seed, traces_max, thread_options(adapter, lanes));
        EXPECT_FALSE(without) << adapter.name << " was found with --lanes " << lanes << " without threads:\n"
                              << format_failure(without->shrunk.failure, without->shrunk.trace,
                                                reproduce_command(adapter, without->shrunk.trace));
    }
}

// The shrinker brings TM4 (its failure needs a dump and, on another lane,
// two adds it tears) to at most 3 client lanes on every seed, not only on
// the first (above): 9 seeds far apart (2 client lanes on each today).
TEST(Threads, TM4IsShrunkToAtMostThreeLanesOnEverySeed) {
    const std::vector<Adapter> mutants = adapters::thread_mutant_adapters();
    const auto tm4 = std::find_if(mutants.begin(), mutants.end(), [](const Adapter& a) { return a.name == "TM4"; });
    ASSERT_NE(tm4, mutants.end());
    for (std::uint64_t k = 1; k < 10; ++k) {
        const std::uint64_t seed = first_seed + k * 1000003;
        const std::optional<ThreadFinding> found = search_threads(tm4->make, thread_options(*tm4, 6), seed, traces_max);
        ASSERT_TRUE(found) << "seed " << seed;
        EXPECT_LE(found->plan.lanes.size() - 1, 3u) << format_thread_finding(*found);
        EXPECT_EQ(found->replays_same, found->replays) << format_thread_finding(*found);
    }
}

INSTANTIATE_TEST_SUITE_P(Bundled, ThreadMutant, ::testing::Range<std::size_t>(0, adapters::thread_mutant_adapters().size()),
                         [](const auto& info) { return adapters::thread_mutant_adapters().at(info.param).name; });

}  // namespace
}  // namespace kvcheck::props

