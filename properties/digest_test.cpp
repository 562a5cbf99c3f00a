// View digests (ViewDigest, Engine::entry_digest/handle_digest): the
// harness compares digests and builds a view only to name a difference, so
// a digest must be equal exactly when view_difference finds no difference,
// and the reference's digest, computed from the cache without building the
// view, must be the digest of its view.
#include "auditor/auditor.h"
#include "generators.h"
#include "reference/reference_engine.h"
#include "reference/cache_views.h"
#include "run_util.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace kvcheck::props {
namespace {

// One small change to a view, of any of the kinds view_difference knows,
// the dtype of an empty slot included (which it does not count).
CacheView changed(CacheView view) {
    const int kind = *rc::gen::inRange(0, 7);
    if (kind == 0) {
        view.layout = view.layout == Layout::modern ? Layout::legacy : Layout::modern;
        return view;
    }
    if (kind == 1 || view.layers.empty()) {
        view.layers.push_back(LayerView{});
        return view;
    }
    LayerView& layer = view.layers[*rc::gen::inRange<std::size_t>(0, view.layers.size())];
    if (kind == 2) {
        layer.initialized = !layer.initialized;
        return view;
    }
    SlotView& slot = layer.slots[*rc::gen::inRange(0, slot_count)];
    if (kind == 3 || !slot.present) {
        slot.present = !slot.present;
        if (slot.present) slot.shape = {0};
        return view;
    }
    if (kind == 4) {
        slot.dtype = slot.dtype == Dtype::f32 ? Dtype::bf16 : Dtype::f32;
    } else if (kind == 5) {
        slot.shape.back() += 1;
    } else {
        slot.hash ^= 1;
    }
    return view;
}

// The same view with one slot made empty (shape [0], float32), and a copy
// whose empty slot is bfloat16: no difference.
std::pair<CacheView, CacheView> empty_slot_dtypes(CacheView view) {
    if (view.layers.empty()) view.layers.push_back(LayerView{});
    SlotView& slot = view.layers[*rc::gen::inRange<std::size_t>(0, view.layers.size())].slots[*rc::gen::inRange(0, slot_count)];
    slot.present = true;
    slot.dtype = Dtype::f32;
    slot.shape = {0};
    slot.hash = content_hash(nullptr, 0);
    CacheView other = view;
    for (LayerView& layer : other.layers) {
        for (SlotView& s : layer.slots) {
            if (s.present && s.shape == std::vector<std::int64_t>{0}) s.dtype = Dtype::bf16;
        }
    }
    return {view, other};
}

TEST(ViewDigest, EqualExactlyWhenTheViewsAre) {
    EXPECT_TRUE(rc::check("digests of a view and of a changed copy", [] {
        CacheView view = expected_view(expand(any_spec()));
        CacheView other;
        if (*rc::gen::inRange(0, 4) == 0) {
            std::tie(view, other) = empty_slot_dtypes(view);
        } else {
            other = changed(view);
        }
        const bool same = view_difference(other, view).empty();
        RC_TAG(same ? "no difference (an empty slot's dtype)" : "a difference");
        RC_ASSERT((view_digest(other) == view_digest(view)) == same);
    }));
}

TEST(ViewDigest, TheReferencesIsItsViews) {
    EXPECT_TRUE(rc::check("made, stored, cloned, converted and merged caches", [] {
        const CacheSpec spec = any_spec();
        const CacheContent content = expand(spec);
        adapters::ReferenceEngine engine;
        engine.make(content, 1);
        engine.add("a", content, {});
        engine.clone(1, 2);
        if (spec.layout == Layout::modern) {
            engine.to_legacy(1, 3);
        } else {
            engine.from_legacy(1, 3);
        }
        engine.concat({1, 3}, 4);
        RC_ASSERT(engine.entry_digest("a") == view_digest(engine.view_entry("a")));
        RC_ASSERT(engine.entry_digest("a") == view_digest(expected_view(content)));
        for (const Handle handle : {1, 2, 3, 4}) {
            RC_ASSERT(engine.handle_digest(handle) == view_digest(engine.view_handle(handle)));
        }
    }));
}

// docs/semantics.md#store-windows: what a windowed engine shows of a cache
// (expected_window: each slot's last W tokens, segments cut inside) is what
// the reference's cut keeps (kv::keep_window), for any cache, a merge of
// two (whose slots are two segments) included.
TEST(ViewDigest, AWindowShowsWhatTheReferencesCutKeeps) {
    EXPECT_TRUE(rc::check("any cache, a merge of two, any window", [] {
        const CacheSpec spec = any_spec();
        const CacheContent first = expand(spec);
        CacheSpec other_spec = any_spec(spec.dtype);
        other_spec.layout = spec.layout;
        other_spec.heads = spec.heads;
        other_spec.head_dim = spec.head_dim;
        const CacheContent second = expand(other_spec);
        const auto window = *rc::gen::inRange<std::int64_t>(1, 40);
        adapters::ReferenceEngine engine;
        engine.set_window(window);
        engine.make(first, 1);
        engine.make(second, 2);
        engine.add("a", first, {});
        RC_ASSERT(engine.handle_digest(1) == expected_digest(expected_window(first, window)));
        RC_ASSERT(engine.entry_digest("a") == expected_digest(expected_window(first, window)));
        RC_ASSERT(view_difference(engine.view_entry("a"), expected_view(expected_window(first, window))).empty());
        if (!merged_geometry_ok({first, second}) || dtypes_mixed({first, second})) return;
        engine.concat({1, 2}, 3);
        const CacheContent merged = expected_window(expected_concat({expected_window(first, window),
                                                                     expected_window(second, window)}), window);
        RC_ASSERT(engine.handle_digest(3) == expected_digest(merged));
        // A window of the whole merge shows the same: the parts' cuts lose nothing it shows.
        RC_ASSERT(expected_digest(merged) == expected_digest(expected_window(expected_concat({first, second}), window)));
    }));
}

// The auditor makes an object's expected view and digest when a check first
// asks for them: a run that checks no content (the benchmarks' unchecked
// one) must not pay for them. A copy takes its source's digest when made.
TEST(ViewDigest, TheAuditorMakesExpectedViewsWhenAsked) {
    EXPECT_TRUE(rc::check("any content", [] {
        const CacheContent content = expand(any_spec());
        Auditor audit;
        const ObjectId made = audit.new_object(content, Origin::make, false);
        RC_ASSERT(!audit.object(made).view && !audit.object(made).digest);
        const ObjectId early_copy = audit.copy_object(made, Origin::clone, true, 2);
        RC_ASSERT(!audit.object(early_copy).digest);
        RC_ASSERT(expected_digest(content) == view_digest(expected_view(content)));
        RC_ASSERT(audit.digest_of(made) == view_digest(expected_view(content)));
        RC_ASSERT(audit.view_of(made).layers.size() == expected_view(content).layers.size());
        RC_ASSERT(view_difference(audit.view_of(made), expected_view(content)).empty());
        const ObjectId copy = audit.copy_object(made, Origin::clone, true, 2);
        RC_ASSERT(audit.object(copy).digest == audit.object(made).digest);
        RC_ASSERT(audit.digest_of(early_copy) == audit.digest_of(made));
    }));
}

// An adapter whose digests disagree with its views is named, not trusted.
class WrongDigests : public adapters::ReferenceEngine {
  public:
    explicit WrongDigests(bool entries) : entries_(entries) {}
    std::uint64_t entry_digest(const std::string& id) override {
        return ReferenceEngine::entry_digest(id) + (entries_ ? 1 : 0);
    }
    std::uint64_t handle_digest(Handle handle) override {
        return ReferenceEngine::handle_digest(handle) + (entries_ ? 0 : 1);
    }

  private:
    bool entries_;
};

TEST(ViewDigest, ADigestThatDisagreesWithItsViewIsAnEngineError) {
    const CacheSpec spec = parse_cache_spec("modern/f32/3:[kv2 kv3]");
    for (const bool entries : {true, false}) {
        WrongDigests engine(entries);
        const RunResult result = execute({op::Add{"a", spec}, op::GetCache{{1}, {"a"}}}, engine);
        ASSERT_TRUE(result.failure);
        EXPECT_EQ(result.failure->property, engine_error_id);
        EXPECT_NE(result.failure->message.find(entries ? "entry_digest of entry \"a\" disagrees with its view_entry"
                                                       : "handle_digest of h1 disagrees with its view_handle"),
                  std::string::npos)
            << result.failure->message;
    }
}

}  // namespace
}  // namespace kvcheck::props
