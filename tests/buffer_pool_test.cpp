// The buffer pool behind kv::clone and kv::concat (kv/buffer_pool.h):
// blocks of freed copies are reused, the retention limit holds, limit 0 turns retention off,
// pooled tensors are ordinary independent CPU tensors, and concurrent
// clones and frees are safe. Each test sets the limit itself (it starts
// from an empty pool) and restores the previous one: under ASan the default
// is 0, and these tests turn retention on to check the pool there too.
#include "kv/buffer_pool.h"
#include "kv/cache.h"
#include "kv/store.h"
#include "test_util.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mul.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define KVCHECK_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVCHECK_TEST_ASAN 1
#endif
#endif
#if defined(KVCHECK_TEST_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace {

using kv::Layout;
using kvtest::make_cache;
using kvtest::same_cache;

// make_cache's tokens are 2 heads x 4 float32 = 32 bytes: 4,096 tokens make
// a 128 KiB slot, twice the smallest pooled block.
constexpr std::int64_t pooled_seq = 4096;
constexpr std::int64_t slot_bytes = pooled_seq * 32;
constexpr std::int64_t cache_layers = 4;
constexpr std::int64_t cache_slots = 2 * cache_layers;
static_assert(slot_bytes >= static_cast<std::int64_t>(kv::buffer_pool_block_bytes_min));

class BufferPool : public ::testing::Test {
  protected:
    void SetUp() override {
        saved_limit_ = kv::buffer_pool_stats().limit_bytes;
        set_limit(kv::buffer_pool_limit_bytes_default);
    }
    void TearDown() override { kv::set_buffer_pool_limit(saved_limit_); }

    // An empty pool with the given limit.
    static void set_limit(std::int64_t limit_bytes) {
        kv::set_buffer_pool_limit(0);
        ASSERT_EQ(kv::buffer_pool_stats().retained_bytes, 0);
        kv::set_buffer_pool_limit(limit_bytes);
    }

    static kv::CachePtr pooled_cache(std::uint64_t seed, Layout layout = Layout::modern) {
        return make_cache(layout, cache_layers, pooled_seq, seed);
    }

  private:
    std::int64_t saved_limit_ = 0;
};

std::set<const void*> data_pointers(const kv::Cache& cache) {
    std::set<const void*> pointers;
    for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
        pointers.insert(kv::logical_keys(cache, i).data_ptr());
        pointers.insert(kv::logical_values(cache, i).data_ptr());
    }
    return pointers;
}

TEST_F(BufferPool, FreedCopiesAreRetainedAndReusedByTheNextClone) {
    const auto source = pooled_cache(1);
    const auto before = kv::buffer_pool_stats();
    auto first = kv::clone(*source);
    const std::set<const void*> first_pointers = data_pointers(*first);
    ASSERT_EQ(first_pointers.size(), static_cast<std::size_t>(cache_slots));
    first.reset();
    const auto freed = kv::buffer_pool_stats();
    EXPECT_EQ(freed.fresh_blocks - before.fresh_blocks, cache_slots);
    EXPECT_EQ(freed.kept_blocks - before.kept_blocks, cache_slots);
    EXPECT_EQ(freed.retained_blocks, cache_slots);
    EXPECT_EQ(freed.retained_bytes, cache_slots * slot_bytes);

    const auto second = kv::clone(*source);
    const auto reused = kv::buffer_pool_stats();
    EXPECT_EQ(reused.reused_blocks - freed.reused_blocks, cache_slots);
    EXPECT_EQ(reused.fresh_blocks, freed.fresh_blocks);
    EXPECT_EQ(reused.retained_blocks, 0);
    EXPECT_EQ(data_pointers(*second), first_pointers);
    EXPECT_TRUE(same_cache(*second, *source));
}

// A merge (kv::concat, Store::get_cache of several ids) is a copy too: its
// slots come from the pool, in either layout, and hold what at::cat gives.
TEST_F(BufferPool, MergesTakeTheirSlotsFromThePoolAndReuseThem) {
    for (const Layout layout : {Layout::modern, Layout::legacy}) {
        set_limit(kv::buffer_pool_limit_bytes_default);
        const auto a = make_cache(layout, cache_layers, pooled_seq / 4, 1);
        const auto b = make_cache(layout, cache_layers, pooled_seq / 4 * 3, 2);
        const auto before = kv::buffer_pool_stats();
        auto first = kv::concat({a, b});
        const std::set<const void*> first_pointers = data_pointers(*first);
        const auto made = kv::buffer_pool_stats();
        EXPECT_EQ(made.fresh_blocks - before.fresh_blocks, cache_slots) << kv::layout_name(layout);
        for (std::int64_t i = 0; i < cache_layers; ++i) {
            EXPECT_TRUE(at::equal(kv::logical_keys(*first, i),
                                  at::cat({kv::logical_keys(*a, i), kv::logical_keys(*b, i)}, -2)));
            EXPECT_TRUE(at::equal(kv::logical_values(*first, i),
                                  at::cat({kv::logical_values(*a, i), kv::logical_values(*b, i)}, -2)));
        }
        first.reset();
        EXPECT_EQ(kv::buffer_pool_stats().retained_blocks, cache_slots) << kv::layout_name(layout);
        const auto second = kv::concat({a, b});
        const auto reused = kv::buffer_pool_stats();
        EXPECT_EQ(reused.reused_blocks - made.reused_blocks, cache_slots) << kv::layout_name(layout);
        EXPECT_EQ(data_pointers(*second), first_pointers) << kv::layout_name(layout);
        EXPECT_FALSE(kv::shares_storage(*second, *a));
        EXPECT_FALSE(kv::shares_storage(*second, *b));
    }
}

TEST_F(BufferPool, ABlockServesSlightlySmallerRequestsButNotMuchSmallerOnes) {
    auto big = kv::clone(*make_cache(Layout::modern, 1, pooled_seq, 1));
    big.reset();
    const auto freed = kv::buffer_pool_stats();
    ASSERT_EQ(freed.retained_blocks, 2);
    // 7/8 of the size: served by the retained blocks.
    const auto near = kv::clone(*make_cache(Layout::modern, 1, pooled_seq * 7 / 8, 2));
    const auto after_near = kv::buffer_pool_stats();
    EXPECT_EQ(after_near.reused_blocks - freed.reused_blocks, 2);
    EXPECT_EQ(near->get_seq_length(0), pooled_seq * 7 / 8);
    EXPECT_EQ(kv::logical_keys(*near, 0).nbytes(), static_cast<std::size_t>(slot_bytes * 7 / 8));
    // Half the size would waste half the block: fresh blocks instead.
    set_limit(kv::buffer_pool_limit_bytes_default);
    kv::clone(*make_cache(Layout::modern, 1, pooled_seq, 3)).reset();
    const auto refilled = kv::buffer_pool_stats();
    const auto half = kv::clone(*make_cache(Layout::modern, 1, pooled_seq / 2, 4));
    const auto after_half = kv::buffer_pool_stats();
    EXPECT_EQ(after_half.reused_blocks, refilled.reused_blocks);
    EXPECT_EQ(after_half.fresh_blocks - refilled.fresh_blocks, 2);
}

TEST_F(BufferPool, RetainsNoMoreThanTheLimitAndReleasesTheOldestFirst) {
    set_limit(3 * slot_bytes);
    const auto source = pooled_cache(1);
    const auto before = kv::buffer_pool_stats();
    auto copy = kv::clone(*source);
    // The slots are freed in this order: the last three stay.
    std::vector<const void*> free_order;
    for (const kv::LayerPtr& layer : *copy->layers()) {
        free_order.push_back(layer->keys.data_ptr());
        free_order.push_back(layer->values.data_ptr());
    }
    for (const kv::LayerPtr& layer : *copy->layers()) {
        layer->keys = at::Tensor();
        layer->values = at::Tensor();
    }
    copy.reset();
    const auto freed = kv::buffer_pool_stats();
    EXPECT_EQ(freed.limit_bytes, 3 * slot_bytes);
    EXPECT_EQ(freed.retained_blocks, 3);
    EXPECT_EQ(freed.retained_bytes, 3 * slot_bytes);
    EXPECT_EQ(freed.released_blocks - before.released_blocks, cache_slots - 3);

    const auto next = kv::clone(*source);
    const std::set<const void*> reused = data_pointers(*next);
    EXPECT_EQ(kv::buffer_pool_stats().reused_blocks - freed.reused_blocks, 3);
    for (std::size_t i = free_order.size() - 3; i < free_order.size(); ++i) {
        EXPECT_EQ(reused.count(free_order[i]), 1u) << "slot " << i << " was not among the retained";
    }

    // Lowering the limit releases at once.
    kv::clone(*source).reset();
    ASSERT_EQ(kv::buffer_pool_stats().retained_blocks, 3);
    kv::set_buffer_pool_limit(slot_bytes + slot_bytes / 2);
    EXPECT_EQ(kv::buffer_pool_stats().retained_blocks, 1);
    EXPECT_EQ(kv::buffer_pool_stats().retained_bytes, slot_bytes);
}

TEST_F(BufferPool, ABlockLargerThanTheLimitIsNotRetained) {
    set_limit(slot_bytes - 1);
    kv::clone(*pooled_cache(1)).reset();
    const auto stats = kv::buffer_pool_stats();
    EXPECT_EQ(stats.retained_blocks, 0);
    EXPECT_EQ(stats.retained_bytes, 0);
}

TEST_F(BufferPool, LimitZeroTurnsRetentionOff) {
    const auto source = pooled_cache(1);
    kv::clone(*source).reset();
    ASSERT_EQ(kv::buffer_pool_stats().retained_blocks, cache_slots);
    kv::set_buffer_pool_limit(0);
    const auto off = kv::buffer_pool_stats();
    EXPECT_EQ(off.limit_bytes, 0);
    EXPECT_EQ(off.retained_blocks, 0);
    EXPECT_EQ(off.retained_bytes, 0);
    for (int round = 0; round < 3; ++round) kv::clone(*source).reset();
    const auto after = kv::buffer_pool_stats();
    EXPECT_EQ(after.reused_blocks, off.reused_blocks);
    EXPECT_EQ(after.kept_blocks, off.kept_blocks);
    EXPECT_EQ(after.fresh_blocks - off.fresh_blocks, 3 * cache_slots);
    EXPECT_EQ(after.released_blocks - off.released_blocks, 3 * cache_slots);
    EXPECT_EQ(after.retained_bytes, 0);
}

TEST_F(BufferPool, SmallSlotsAreNotPooled) {
    const auto before = kv::buffer_pool_stats();
    kv::clone(*make_cache(Layout::modern, cache_layers, 16, 1)).reset();
    const auto after = kv::buffer_pool_stats();
    EXPECT_EQ(after.fresh_blocks, before.fresh_blocks);
    EXPECT_EQ(after.reused_blocks, before.reused_blocks);
    EXPECT_EQ(after.retained_blocks, 0);
}

TEST_F(BufferPool, AReusedBlockHoldsTheNewSourcesBytesAndIsIndependent) {
    for (Layout layout : {Layout::modern, Layout::legacy}) {
        const auto first_source = pooled_cache(1, layout);
        const auto second_source = pooled_cache(2, layout);
        ASSERT_FALSE(same_cache(*first_source, *second_source));
        kv::clone(*first_source).reset();
        const auto reused_before = kv::buffer_pool_stats().reused_blocks;
        const auto copy = kv::clone(*second_source);
        ASSERT_EQ(kv::buffer_pool_stats().reused_blocks - reused_before, cache_slots);
        std::string why;
        EXPECT_TRUE(same_cache(*copy, *second_source, &why)) << why;
        EXPECT_FALSE(kv::shares_storage(*copy, *second_source));
        const auto untouched = kv::clone(*second_source);
        EXPECT_FALSE(kv::shares_storage(*copy, *untouched));
        // Writing into the copy, in place, leaves the source alone.
        kv::logical_keys(*copy, 0).fill_(7.0);
        kv::logical_values(*copy, cache_layers - 1).add_(1.0);
        EXPECT_TRUE(same_cache(*second_source, *untouched, &why)) << why;
        EXPECT_FALSE(same_cache(*copy, *second_source));
    }
}

TEST_F(BufferPool, DataSurvivesTheSourceAndOtherClones) {
    auto source = pooled_cache(3);
    const auto reference = kv::clone(*source);
    auto copy = kv::clone(*source);
    source.reset();
    for (int round = 0; round < 4; ++round) kv::clone(*pooled_cache(10 + round)).reset();
    std::string why;
    EXPECT_TRUE(same_cache(*copy, *reference, &why)) << why;
}

TEST_F(BufferPool, PooledTensorsAreOrdinaryCpuTensors) {
    const auto source = pooled_cache(1);
    kv::clone(*source).reset();
    const auto copy = kv::clone(*source);
    const at::Tensor original = kv::logical_keys(*source, 0);
    at::Tensor pooled = kv::logical_keys(*copy, 0);
    ASSERT_TRUE(pooled.storage().data_ptr().get_context() != nullptr);
    EXPECT_TRUE(pooled.device().is_cpu());
    EXPECT_EQ(pooled.sizes(), original.sizes());
    EXPECT_EQ(pooled.strides(), original.strides());
    EXPECT_EQ(pooled.scalar_type(), original.scalar_type());
    EXPECT_EQ(pooled.storage().nbytes(), original.nbytes());
    EXPECT_TRUE(pooled.storage().resizable());
    EXPECT_TRUE(at::equal(pooled, original));

    // What the models do with a cache: append along seq.
    copy->update(kvtest::kv_tensor(3, 9), kvtest::kv_tensor(3, 10), 0);
    EXPECT_EQ(copy->get_seq_length(0), pooled_seq + 3);
    const at::Tensor appended = at::cat({pooled, kvtest::kv_tensor(3, 9)}, -2);
    EXPECT_TRUE(at::equal(kv::logical_keys(*copy, 0), appended));

    // In place, then a resize beyond the storage: the bytes stay.
    at::Tensor values = kv::logical_values(*copy, 1).clone();
    at::Tensor resized = kv::logical_values(*copy, 1);
    resized.mul_(2.0);
    EXPECT_TRUE(at::equal(resized, values.mul(2.0)));
    resized.resize_({1, 2, 2 * pooled_seq, 4});
    EXPECT_EQ(resized.size(2), 2 * pooled_seq);
    // resize_ keeps the bytes, not the positions: compare them flat.
    EXPECT_TRUE(at::equal(resized.flatten().narrow(0, 0, values.numel()), values.mul(2.0).flatten()));
    resized.resize_({1, 2, 1, 4});
    EXPECT_EQ(resized.numel(), 8);
}

TEST_F(BufferPool, PooledCachesDumpAndLoadBitExactly) {
    for (Layout layout : {Layout::modern, Layout::legacy}) {
        const auto source = pooled_cache(5, layout);
        kv::clone(*source).reset();
        const auto copy = kv::clone(*source);
        const auto item = std::make_shared<const kv::Item>(kv::Item{"a", copy, {}});
        const std::vector<kv::Item> loaded = kv::decode_dump(kv::encode_dump({item}), "memory", kv::LoadLimits{});
        ASSERT_EQ(loaded.size(), 1u);
        std::string why;
        EXPECT_TRUE(same_cache(*loaded[0].cache, *source, &why)) << why;
    }
}

TEST_F(BufferPool, ConcurrentClonesAndFreesFromTwoThreads) {
    // A limit of 12 slots for 2 threads of 8: retention, reuse and eviction
    // all happen concurrently.
    set_limit(12 * slot_bytes);
    constexpr int rounds = 100;
    const auto before = kv::buffer_pool_stats();
    int mismatches[2] = {0, 0};
    auto work = [&](int thread) {
        const auto source = pooled_cache(static_cast<std::uint64_t>(20 + thread));
        for (int round = 0; round < rounds; ++round) {
            auto copy = kv::clone(*source);
            if (!same_cache(*copy, *source) || kv::shares_storage(*copy, *source)) mismatches[thread] += 1;
            kv::logical_keys(*copy, round % cache_layers).fill_(static_cast<double>(thread));
        }
    };
    std::thread other(work, 1);
    work(0);
    other.join();
    EXPECT_EQ(mismatches[0], 0);
    EXPECT_EQ(mismatches[1], 0);
    const auto after = kv::buffer_pool_stats();
    const std::int64_t taken = (after.reused_blocks - before.reused_blocks) + (after.fresh_blocks - before.fresh_blocks);
    EXPECT_EQ(taken, 2 * rounds * cache_slots);
    EXPECT_GT(after.reused_blocks - before.reused_blocks, rounds * cache_slots);
    EXPECT_LE(after.retained_bytes, 12 * slot_bytes);
    EXPECT_EQ(after.retained_bytes, after.retained_blocks * slot_bytes);
    // Every block the system gave came back to it, or is retained: none is
    // lost and none is released twice.
    EXPECT_EQ((after.fresh_blocks - before.fresh_blocks) - (after.released_blocks - before.released_blocks),
              after.retained_blocks - before.retained_blocks);
}

#if defined(KVCHECK_TEST_ASAN)
TEST_F(BufferPool, RetainedBlocksArePoisonedUnderAsan) {
    const auto source = make_cache(Layout::modern, 1, pooled_seq - 1, 1);
    auto copy = kv::clone(*source);
    char* keys = static_cast<char*>(kv::logical_keys(*copy, 0).data_ptr());
    const std::size_t bytes = kv::logical_keys(*copy, 0).nbytes();
    EXPECT_EQ(__asan_region_is_poisoned(keys, bytes), nullptr);
    // The block is a whole page: its tail past the tensor is poisoned.
    EXPECT_NE(__asan_address_is_poisoned(keys + bytes), 0);
    copy.reset();
    ASSERT_EQ(kv::buffer_pool_stats().retained_blocks, 2);
    EXPECT_NE(__asan_address_is_poisoned(keys), 0);
    EXPECT_NE(__asan_address_is_poisoned(keys + bytes / 2), 0);
}
#endif

}  // namespace
