// Ownership without a marker, and the empty get_cache (docs/semantics.md,
// #ownership and #store): an engine that keeps no owned marker is judged on
// a marker kvcheck derives from its storage identities, and a get_cache of
// ids that hold no tokens may give none or a new empty cache. Each
// acceptance passes a correct engine and still catches the bugs it could
// hide.
#include "reference/reference_engine.h"
#include "run_util.h"

#include <gtest/gtest.h>

#include <iostream>

namespace kvcheck::props {
namespace {

constexpr std::size_t traces_max = 600;
constexpr std::uint64_t first_seed = 1;

// `adapter` made to report no owned marker (ReferenceEngine::drop_owned_marker).
Adapter without_marker(const Adapter& adapter) {
    Adapter unmarked = adapter;
    unmarked.name = adapter.name + "-unmarked";
    unmarked.make = [make = adapter.make] {
        std::shared_ptr<Engine> engine = make();
        dynamic_cast<adapters::ReferenceEngine&>(*engine).drop_owned_marker();
        return engine;
    };
    return unmarked;
}

template <typename E>
Adapter test_adapter(const std::string& name) {
    return {name, "a test engine", "bundled", {}, [] { return std::shared_ptr<Engine>(std::make_shared<E>()); }};
}

void expect_no_failure(const Adapter& adapter, PropertySet properties = PropertySet::all()) {
    const std::optional<Finding> finding = find_and_shrink(adapter, first_seed, traces_max, WorkloadOptions{}, properties);
    EXPECT_FALSE(finding) << format_failure(finding->shrunk.failure, finding->shrunk.trace,
                                            reproduce_command(adapter, finding->shrunk.trace));
}

// ---- the derived marker ---------------------------------------------------------

TEST(DerivedOwnedMarker, NeedsTheMarkerOrStorageIdentities) {
    Capabilities capabilities;
    EXPECT_TRUE(checkable(capabilities).has(Property::owned_marker));
    capabilities.owned_marker = false;
    EXPECT_TRUE(checkable(capabilities).has(Property::owned_marker)) << "derived from storage identities";
    capabilities.storage_identity = false;
    EXPECT_FALSE(checkable(capabilities).has(Property::owned_marker)) << "neither a marker nor storage to derive it from";
    capabilities.owned_marker = true;
    EXPECT_TRUE(checkable(capabilities).has(Property::owned_marker));
}

TEST(DerivedOwnedMarker, TheReferenceWithoutAMarkerHoldsEveryProperty) {
    const Adapter unmarked = without_marker(*adapters::find_bundled("reference"));
    ASSERT_FALSE(unmarked.make()->capabilities().owned_marker);
    expect_no_failure(unmarked);
}

// Handing out a stored cache, keeping the copy handed out, or handing the
// same copy out twice: each is caught without a marker too.
TEST(DerivedOwnedMarker, CatchesWhatSharesTheStoreOrAnotherCopy) {
    for (const std::string name : {"M2", "M28", "M21", "M9"}) {
        const Adapter unmarked = without_marker(*adapters::find_bundled(name));
        const auto finding = find_and_shrink(unmarked, first_seed, 3000, WorkloadOptions{},
                                             PropertySet::only(Property::owned_marker));
        ASSERT_TRUE(finding) << name << " without a marker is not caught by owned-marker";
        const std::string& message = finding->shrunk.failure.message;
        EXPECT_NE(message.find("shares one storage with"), std::string::npos) << name << ": " << message;
        std::cout << "[ derived  ] " << name << ": " << message << "\n";
    }
}

// What a derived marker cannot see: a marker that is kept where it should
// be cleared (M8) is no fault of an engine that has no marker, as long as
// the engine hands back no cache a model wrote into. When it does, a turn
// from the stored item hands back the stored object itself, which the
// derived marker sees (docs/semantics.md#returned-caches).
TEST(DerivedOwnedMarker, AMarkerKeptOnStoringIsNotTheDerivedMarkersToSee) {
    Adapter unmarked = without_marker(*adapters::find_bundled("M8"));
    Adapter without_turns = unmarked;
    without_turns.make = [make = unmarked.make] {
        std::shared_ptr<Engine> engine = make();
        dynamic_cast<adapters::ReferenceEngine&>(*engine).drop_returned_caches();
        return engine;
    };
    expect_no_failure(without_turns, PropertySet::only(Property::owned_marker));
    const auto finding = find_and_shrink(unmarked, first_seed, traces_max, WorkloadOptions{},
                                         PropertySet::only(Property::owned_marker));
    ASSERT_TRUE(finding) << "M8 without a marker, returning the caches its model wrote into, is not caught";
    EXPECT_NE(finding->shrunk.failure.message.find("shares one storage with stored entry"), std::string::npos)
        << finding->shrunk.failure.message;
}

// ---- the empty get_cache --------------------------------------------------------

// The ids get_cache names that exist.
std::vector<kv::ConstCachePtr> existing(const kv::Store& store, const std::vector<std::string>& ids) {
    std::vector<kv::ConstCachePtr> found;
    for (const std::string& id : ids) {
        if (const kv::ItemPtr item = store.get(id)) found.push_back(item->cache);
    }
    return found;
}

// "None only if no cache is found": a merge of the parts, which holds no
// K/V (0 bytes copied, logged), owned, with their layers, initialized.
class EmptyMerge final : public adapters::ReferenceEngine {
  protected:
    kv::CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        kv::CachePtr found = ReferenceEngine::store_get_cache(ids);
        const std::vector<kv::ConstCachePtr> parts = existing(store_, ids);
        if (found || parts.empty()) return found;
        return copier_->concat(parts, kv::CopyReason::merge);
    }
};

// A new empty cache of the first part's layout: no copy, no marker.
class FreshEmpty final : public adapters::ReferenceEngine {
  protected:
    kv::CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        kv::CachePtr found = ReferenceEngine::store_get_cache(ids);
        const std::vector<kv::ConstCachePtr> parts = existing(store_, ids);
        if (found || parts.empty()) return found;
        return kv::Cache::make(parts.front()->layout());
    }
};

// Wrong: an empty cache even when no id exists.
class EmptyForMissing final : public adapters::ReferenceEngine {
  protected:
    kv::CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        kv::CachePtr found = ReferenceEngine::store_get_cache(ids);
        return found ? found : kv::Cache::make(kv::Layout::modern);
    }
};

// Wrong: a clone of the first part, K/V of its uninitialized layers and all.
class CloneOfTokenless final : public adapters::ReferenceEngine {
  protected:
    kv::CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        kv::CachePtr found = ReferenceEngine::store_get_cache(ids);
        const std::vector<kv::ConstCachePtr> parts = existing(store_, ids);
        if (found || parts.empty()) return found;
        return copier_->clone(*parts.front(), kv::CopyReason::get_cache);
    }
};

// An empty result stays usable: generated from, cloned, merged, stored back.
const char* const empty_result_trace =
    "add a modern/f32/0:[kv~3 -0]\n"
    "add b legacy/f32/1:[kv0]\n"
    "h1 = get_cache a b\n"
    "h2 = clone h1\n"
    "h3 = concat h1 h2\n"
    "h4 = get_cache b\n"
    "generate h4 prompt=1 max=2\n"
    "add_handle c h2\n"
    "generate h1 prompt=1 max=2\n";

TEST(TokenlessGetCache, AnEmptyResultIsAcceptedAndFollowed) {
    const Trace trace = parse_trace(empty_result_trace);
    for (const Adapter& adapter : {test_adapter<EmptyMerge>("empty-merge"), test_adapter<FreshEmpty>("fresh-empty"),
                                   without_marker(test_adapter<EmptyMerge>("empty-merge"))}) {
        const RunResult result = run_on(adapter, trace);
        EXPECT_FALSE(result.failure) << adapter.name << ": "
                                     << format_failure(*result.failure, trace, reproduce_command(adapter, trace));
        EXPECT_EQ(result.coverage.ops_skipped, 0u) << adapter.name << ": every operation on the empty results ran";
    }
    // None stays right: the reference gives none (and what names h1 is skipped).
    const RunResult none = run_on(*adapters::find_bundled("reference"), trace);
    EXPECT_FALSE(none.failure) << none.failure->message;
}

TEST(TokenlessGetCache, EnginesGivingEmptyCachesHoldEveryProperty) {
    expect_no_failure(test_adapter<EmptyMerge>("empty-merge"));
    expect_no_failure(test_adapter<FreshEmpty>("fresh-empty"));
}

// The acceptance is narrow: an empty cache for ids none of which exists, or
// a "empty" result holding K/V, is still a store-contract failure (an empty
// result sharing the store's lists is M29's, stored-immutable).
TEST(TokenlessGetCache, CannotHideACacheForMissingIdsOrKVHeld) {
    const std::vector<std::pair<Adapter, std::string>> cases = {
        {test_adapter<EmptyForMissing>("empty-for-missing"), "h1 = get_cache x\n"},
        {test_adapter<CloneOfTokenless>("clone-of-tokenless"), "add a modern/f32/0:[kv~3 -0]\nh1 = get_cache a\n"},
    };
    for (const auto& [adapter, text] : cases) {
        const Trace trace = parse_trace(text);
        const RunResult result = run_on(adapter, trace, PropertySet::only(Property::store_contract));
        ASSERT_TRUE(result.failure) << adapter.name;
        EXPECT_EQ(result.failure->property, "store-contract");
        std::cout << "[ tokenless] " << adapter.name << ": " << result.failure->message << "\n";
    }
}

}  // namespace
}  // namespace kvcheck::props
