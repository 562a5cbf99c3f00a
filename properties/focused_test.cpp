// Focused properties, one per row of the property table that a short
// trace of a known shape exercises best: round trips, clone independence,
// merge correctness.
#include "generators.h"
#include "reference/reference_engine.h"
#include "run_util.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

namespace kvcheck::props {
namespace {

const Adapter& reference() { return *adapters::find_bundled("reference"); }

void expect_passes(const Trace& trace, PropertySet properties) {
    const RunResult result = run_on(reference(), trace, properties);
    if (result.failure) RC_FAIL(format_failure(*result.failure, trace, reproduce_command(reference(), trace)));
    RC_ASSERT(result.coverage.ops_skipped == 0u);
}

TEST(LayoutRoundtrip, ConversionsCloneAndDumpAreIdentities) {
    EXPECT_TRUE(rc::check("modern->legacy->modern, legacy->modern->legacy, clone, dump/load", [] {
        const CacheSpec spec = any_spec(any_dtype());
        PropertySet properties = PropertySet::only(Property::layout_roundtrip);
        properties.add(Property::dump_safe);
        Trace trace{op::Make{{1}, spec}, op::Clone{{2}, {1}}};
        if (spec.layout == Layout::modern) {
            trace.push_back(op::ToLegacy{{3}, {1}});
            trace.push_back(op::FromLegacy{{4}, {3}});
        } else {
            trace.push_back(op::FromLegacy{{3}, {1}});
            trace.push_back(op::ToLegacy{{4}, {3}});
        }
        trace.push_back(op::Add{"a", spec});
        trace.push_back(op::Dump{0});
        trace.push_back(op::DeleteAll{});
        trace.push_back(op::Load{0});
        expect_passes(trace, properties);
        // Canonical caches (what from_legacy makes) come back exactly.
        adapters::ReferenceEngine engine;
        const CacheContent content = expand(spec);
        engine.make(content, 1);
        const bool legacy = spec.layout == Layout::legacy;
        if (legacy) {
            engine.from_legacy(1, 2);
            engine.to_legacy(2, 3);
        } else {
            engine.to_legacy(1, 2);
            engine.from_legacy(2, 3);
        }
        const CacheContent once = legacy ? expected_from_legacy(content) : expected_to_legacy(content);
        const CacheContent twice = legacy ? expected_to_legacy(once) : expected_from_legacy(once);
        RC_ASSERT(view_difference(engine.view_handle(3), expected_view(twice)).empty());
        if (legacy) RC_ASSERT(view_difference(engine.view_handle(3), expected_view(content)).empty());
    }));
}

TEST(CloneIndependent, AModelFillingTheCloneNeverReachesTheSource) {
    EXPECT_TRUE(rc::check("clone shares nothing, even empty and odd layers", [] {
        const CacheSpec spec = any_spec(any_dtype());
        const CacheContent content = expand(spec);
        adapters::ReferenceEngine engine;
        engine.make(content, 1);
        engine.clone(1, 2);
        const auto source = engine.storage_of_handle(1);
        for (std::uint64_t id : engine.storage_of_handle(2)) {
            RC_ASSERT(std::find(source.begin(), source.end(), id) == source.end());
        }
        RC_ASSERT(engine.handle_facts(2).owned);
        bool compatible = true;
        for (std::size_t i = 0; i < content.layers.size(); ++i) {
            compatible = compatible && logical_slot(content, i, keys).tokens() == logical_slot(content, i, values).tokens();
        }
        if (compatible) engine.generate(2, {3, 4}, 2, false);  // the model writes into the clone
        RC_ASSERT(view_difference(engine.view_handle(1), expected_view(content)).empty());
    }));
}

TEST(MergeCorrect, GetCacheOfSeveralIdsConcatenatesInRequestOrder) {
    EXPECT_TRUE(rc::check("merge: true length, request order, initialized, owned, sources unchanged", [] {
        const auto count = *rc::gen::inRange(2, 5);
        const Dtype dtype = any_dtype();  // merged caches share one dtype
        Trace trace;
        Ids ids;
        for (int i = 0; i < count; ++i) {
            const std::string id(1, static_cast<char>('a' + i));
            trace.push_back(op::Add{id, any_spec(dtype)});
            ids.push_back(id);
        }
        if (*rc::gen::arbitrary<bool>()) std::reverse(ids.begin(), ids.end());
        trace.push_back(op::GetCache{{1}, ids});
        trace.push_back(op::Generate{{1}, {5}, 2});
        PropertySet properties = PropertySet::only(Property::merge_correct);
        properties.add(Property::stored_immutable);
        const RunResult result = run_on(reference(), trace, properties);
        if (result.failure) RC_FAIL(format_failure(*result.failure, trace, reproduce_command(reference(), trace)));
    }));
}

}  // namespace
}  // namespace kvcheck::props
