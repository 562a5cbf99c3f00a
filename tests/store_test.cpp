// The store: add/get/get_cache/delete semantics and ownership of what it hands out.
#include "kv/store.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

namespace {

using kv::Layout;
using kvtest::kv_tensor;
using kvtest::make_cache;
using kvtest::same_cache;

TEST(Store, AddGetOverwriteAndOrder) {
    kv::Store store;
    store.add({{"a", make_cache(Layout::modern, 1, 2, 1), {{"k", "1"}}},
               {"b", make_cache(Layout::legacy, 1, 3, 2), {}}});
    store.add({{"a", make_cache(Layout::modern, 1, 5, 3), {{"k", "2"}}}});
    ASSERT_EQ(store.size(), 2u);
    const auto all = store.get_all();
    EXPECT_EQ(all[0]->id, "a") << "an overwritten id keeps its position";
    EXPECT_EQ(all[0]->metadata.at("k"), "2");
    EXPECT_EQ(all[0]->cache->get_seq_length(), 5);
    EXPECT_EQ(store.get("missing"), nullptr);
    const auto some = store.get_by_ids({"b", "missing", "a"});
    ASSERT_EQ(some.size(), 3u);
    EXPECT_EQ(some[0]->id, "b");
    EXPECT_EQ(some[1], nullptr);
    store.remove({"a", "missing"});
    EXPECT_EQ(store.size(), 1u);
    store.remove_all();
    EXPECT_EQ(store.size(), 0u);
    EXPECT_THROW(store.add({{"x", nullptr, {}}}), std::invalid_argument);
}

// Item::stored is set exactly while the store that made the item holds it:
// what lets an adapter find an entry through an item it kept, without a
// look-up (adapters/reference_engine.cpp, entry_version).
TEST(Store, AnItemIsMarkedStoredExactlyWhileItsStoreHoldsIt) {
    kv::Store store;
    store.add({{"a", make_cache(Layout::modern, 1, 2, 1), {}}, {"b", make_cache(Layout::legacy, 1, 3, 2), {}}});
    const kv::ItemPtr a = store.get("a");
    const kv::ItemPtr b = store.get("b");
    EXPECT_TRUE(a->stored);
    EXPECT_TRUE(b->stored);
    EXPECT_EQ(*store.find("a"), a);
    EXPECT_EQ(store.find("missing"), nullptr);

    store.add({{"a", make_cache(Layout::modern, 1, 4, 3), {}}});
    EXPECT_FALSE(a->stored) << "overwritten";
    const kv::ItemPtr a2 = store.get("a");
    EXPECT_TRUE(a2->stored);
    store.remove({"b", "missing"});
    EXPECT_FALSE(b->stored) << "removed";
    EXPECT_TRUE(a2->stored) << "the others stay";

    const std::string dir = (std::filesystem::temp_directory_path() / ("kvcheck-store-test-" + std::to_string(::getpid()))).string();
    store.dump(dir);
    store.add({{"c", make_cache(Layout::modern, 1, 1, 4), {}}});
    const kv::ItemPtr c = store.get("c");
    EXPECT_THROW(store.load(dir + "-missing"), kv::DumpError);
    EXPECT_TRUE(a2->stored) << "a failed load changes nothing";
    EXPECT_TRUE(c->stored);
    store.load(dir);
    std::filesystem::remove_all(dir);
    EXPECT_FALSE(a2->stored) << "replaced by a load";
    EXPECT_FALSE(c->stored);
    const kv::ItemPtr loaded = store.get("a");
    EXPECT_TRUE(loaded->stored);

    {
        kv::Store copy(store);
        EXPECT_TRUE(loaded->stored) << "a copy holds it too";
    }
    EXPECT_FALSE(loaded->stored) << "a store letting an item go clears the flag for every store that shares it";
    store.remove_all();
    EXPECT_EQ(store.get("a"), nullptr);

    kv::ItemPtr kept;
    {
        kv::Store gone;
        gone.add({{"x", make_cache(Layout::modern, 1, 1, 5), {}}});
        kept = gone.get("x");
        store.add({{"x", make_cache(Layout::modern, 1, 1, 6), {}}});
        store.remove_all();
        EXPECT_TRUE(kept->stored) << "another store's remove_all leaves it";
    }
    EXPECT_FALSE(kept->stored) << "its store destroyed";
}

TEST(Store, GetCacheOfOneIdIsAnIndependentOwnedCopy) {
    for (Layout layout : {Layout::modern, Layout::legacy}) {
        kv::Store store;
        store.add({{"a", make_cache(layout, 2, 3, 1), {}}});
        const auto stored = store.get("a")->cache;
        const auto snapshot = kv::clone(*stored);
        kv::CachePtr copy = store.get_cache({"a"});
        ASSERT_TRUE(copy);
        EXPECT_NE(copy.get(), stored.get());
        EXPECT_TRUE(copy->owned());
        EXPECT_FALSE(stored->owned());
        EXPECT_FALSE(kv::shares_storage(*copy, *stored));
        copy->update(kv_tensor(4, 9), kv_tensor(4, 9), 0);
        std::string why;
        EXPECT_TRUE(same_cache(*stored, *snapshot, &why)) << why;
        ASSERT_EQ(store.copier().log().size(), 1u);
        EXPECT_EQ(store.copier().log()[0].reason, kv::CopyReason::get_cache);
    }
}

TEST(Store, GetCacheMergesInRequestOrderWithTheTrueLength) {
    kv::Store store;
    store.add({{"a", make_cache(Layout::modern, 2, 3, 1), {}},
               {"b", make_cache(Layout::modern, 2, 4, 2), {}},
               {"empty", kv::Cache::make(Layout::modern), {}}});
    kv::CachePtr merged = store.get_cache({"b", "missing", "empty", "a"});
    ASSERT_TRUE(merged);
    EXPECT_EQ(merged->get_seq_length(0), 7);
    EXPECT_EQ(merged->get_seq_length(1), 7);
    EXPECT_TRUE(merged->owned());
    for (const auto& item : store.get_all()) EXPECT_FALSE(kv::shares_storage(*merged, *item->cache));
    EXPECT_EQ(store.get_cache({"missing", "empty"}), nullptr);
    EXPECT_EQ(store.get_cache({}), nullptr);
    EXPECT_EQ(store.get_cache({"a", "a"})->get_seq_length(), 6) << "repeats are kept";
}

TEST(Store, AnOwnedCopyStoredBackLosesItsMarker) {
    kv::Store store;
    store.add({{"a", make_cache(Layout::modern, 1, 3, 1), {}}});
    kv::CachePtr copy = store.get_cache({"a"});
    ASSERT_TRUE(copy->owned());
    store.add({{"b", copy, {}}});
    EXPECT_FALSE(copy->owned());
    EXPECT_FALSE(store.get("b")->cache->owned());
}

}  // namespace
