// The generation boundary: one owned copy per generation, never two, and
// never the stored cache in the model's hands.
#include "kv/generation.h"
#include "kv/store.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace {

using kv::Layout;
using kvtest::kv_tensor;
using kvtest::make_cache;
using kvtest::same_cache;

// Appends one token's K/V per layer through update, as a model does, and
// remembers which cache object it was handed and how many K/V sets were alive.
class RecordingModel final : public kv::Model {
  public:
    std::int64_t forward(const std::vector<std::int64_t>& tokens, kv::Cache& cache) override {
        seen.push_back(&cache);
        live_sets = std::max(live_sets, kv::live_sets_on_path(cache));
        const auto n = static_cast<std::int64_t>(tokens.size());
        const at::ScalarType dtype = cache.layer_count() > 0 && kv::logical_keys(cache, 0).defined()
                                         ? kv::logical_keys(cache, 0).scalar_type()
                                         : at::kFloat;
        for (std::int64_t layer = 0; layer < 2; ++layer) {
            cache.update(kv_tensor(n, 100 + tokens.back(), dtype), kv_tensor(n, 200 + tokens.back(), dtype), layer);
        }
        return (tokens.back() + 1) % 10;
    }
    std::int64_t eos_token() const override { return 9; }

    std::vector<const kv::Cache*> seen;
    std::int64_t live_sets = 0;
};

TEST(Generation, GenerateDoesNotMutateTheCallersCache) {
    for (Layout layout : {Layout::modern, Layout::legacy}) {
        auto cache = make_cache(layout, 2, 3, 1);
        const auto snapshot = kv::clone(*cache);
        RecordingModel model;
        kv::Copier copier;
        const auto tokens = kv::generate(model, copier, {1, 2}, cache, 4);
        EXPECT_EQ(tokens, (std::vector<std::int64_t>{3, 4, 5, 6}));
        std::string why;
        EXPECT_TRUE(same_cache(*cache, *snapshot, &why)) << why;
        for (const kv::Cache* seen : model.seen) EXPECT_NE(seen, cache.get()) << "the model got the caller's cache";
    }
}

TEST(Generation, GenerateStreamDoesNotMutateTheCallersCacheAndStreams) {
    auto cache = make_cache(Layout::modern, 2, 3, 1);
    const auto snapshot = kv::clone(*cache);
    RecordingModel model;
    kv::Copier copier;
    std::vector<std::int64_t> streamed;
    kv::generate_stream(model, copier, {5}, cache, 10, [&](std::int64_t t) {
        streamed.push_back(t);
        EXPECT_EQ(model.seen.size(), streamed.size()) << "tokens arrive one at a time";
    });
    EXPECT_EQ(streamed, (std::vector<std::int64_t>{6, 7, 8, 9})) << "stops at EOS, EOS included";
    EXPECT_TRUE(same_cache(*cache, *snapshot));
}

TEST(Generation, GenerateOfGetCacheCopiesOnceAndHoldsTwoSets) {
    for (Layout layout : {Layout::modern, Layout::legacy}) {
        auto copier = std::make_shared<kv::Copier>();
        kv::Store store(copier);
        store.add({{"a", make_cache(layout, 2, 5, 1), {}}});
        const auto stored_bytes = kv::footprint(*store.get("a")->cache).bytes;
        RecordingModel model;
        kv::GenerationStats stats;
        kv::generate(model, *copier, {1}, store.get_cache({"a"}), 3, &stats);
        ASSERT_EQ(copier->log().size(), 1u) << "exactly one copy along get_cache -> generate";
        EXPECT_EQ(copier->log()[0].bytes, stored_bytes);
        EXPECT_EQ(stats.copies, 0);
        EXPECT_EQ(stats.peak_live_sets, 2);
        EXPECT_EQ(model.live_sets, 2);
        EXPECT_EQ(store.get("a")->cache->get_seq_length(), 5);
    }
}

TEST(Generation, GenerateOfAStoredCacheCopiesOnce) {
    auto copier = std::make_shared<kv::Copier>();
    kv::Store store(copier);
    store.add({{"a", make_cache(Layout::modern, 2, 5, 1), {}}});
    RecordingModel model;
    kv::GenerationStats stats;
    kv::generate(model, *copier, {1}, store.get("a")->cache, 3, &stats);
    EXPECT_EQ(stats.copies, 1);
    EXPECT_EQ(stats.peak_live_sets, 2);
    EXPECT_EQ(store.get("a")->cache->get_seq_length(), 5);
    EXPECT_NE(model.seen.front(), store.get("a")->cache.get());
}

TEST(Generation, ADoubleCopyIsSeenAsThreeLiveSets) {
    // What the M3 mutant does: clone an owned copy again before the model.
    auto copier = std::make_shared<kv::Copier>();
    kv::Store store(copier);
    store.add({{"a", make_cache(Layout::modern, 2, 5, 1), {}}});
    kv::CachePtr owned = store.get_cache({"a"});
    kv::CachePtr again = copier->clone(*owned, kv::CopyReason::generate);
    RecordingModel model;
    kv::GenerationStats stats;
    kv::generate(model, *copier, {1}, again, 2, &stats);
    EXPECT_EQ(copier->log().size(), 2u);
    EXPECT_EQ(stats.peak_live_sets, 3);
}

TEST(Generation, AnOwnedCopyStoredBackIsCopiedAgainByTheBoundary) {
    auto copier = std::make_shared<kv::Copier>();
    kv::Store store(copier);
    store.add({{"a", make_cache(Layout::modern, 1, 3, 1), {}}});
    kv::CachePtr copy = store.get_cache({"a"});
    store.add({{"b", copy, {}}});
    RecordingModel model;
    kv::generate(model, *copier, {1}, copy, 2);
    EXPECT_EQ(store.get("b")->cache->get_seq_length(), 3) << "the stored cache stays read-only";
    EXPECT_NE(model.seen.front(), copy.get());
}

TEST(Generation, NoCacheStartsFromAnEmptyOneAndBadArgumentsAreRejected) {
    RecordingModel model;
    kv::Copier copier;
    EXPECT_EQ(kv::generate(model, copier, {3}, nullptr, 2), (std::vector<std::int64_t>{4, 5}));
    EXPECT_TRUE(copier.log().empty());
    EXPECT_THROW(kv::generate(model, copier, {}, nullptr, 2), std::invalid_argument);
    EXPECT_THROW(kv::generate(model, copier, {1}, nullptr, -1), std::invalid_argument);
    EXPECT_TRUE(kv::generate(model, copier, {1}, nullptr, 0).empty());
}

}  // namespace
