// The paged reference (src/kv/paged_pool.h): counts, the free queue, the
// prefix index, copy-on-write, the worker boundary, and content against a
// fresh computation of the same tokens, bit for bit.
#include "kv/models.h"
#include "kv/paged_pool.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>

#include <gtest/gtest.h>

#include <algorithm>

namespace {

using kv::paged::BlockId;
using kv::paged::Pool;
using kv::paged::PoolConfig;
using kv::paged::Tokens;

class PagedPool : public ::testing::Test {
  protected:
    kv::models::Decoder decoder{{}};
    Pool pool{PoolConfig{8, 2, 2, 2, 4}, decoder};

    // Every count is the tables holding the block plus the copies reading it;
    // the free queue holds exactly the blocks at 0, once each.
    void expect_consistent() {
        std::vector<std::int64_t> held(pool.blocks().size(), 0);
        for (const auto& [name, seq] : pool.sequences()) {
            for (const BlockId b : seq.table) ++held[static_cast<std::size_t>(b)];
        }
        for (const auto& copy : pool.pending_copies()) ++held[static_cast<std::size_t>(copy.source)];
        for (std::size_t b = 1; b < held.size(); ++b) {
            EXPECT_EQ(pool.blocks()[b].count, held[b]) << "block " << b;
            const auto in_free = std::count(pool.free_queue().begin(), pool.free_queue().end(), static_cast<BlockId>(b));
            EXPECT_EQ(in_free, held[b] == 0 ? 1 : 0) << "block " << b;
        }
        for (const auto& [key, list] : pool.index()) {
            for (const BlockId b : list) {
                ASSERT_TRUE(pool.blocks()[static_cast<std::size_t>(b)].key);
                EXPECT_EQ(*pool.blocks()[static_cast<std::size_t>(b)].key, key);
                EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(b)].tokens, key.tokens);
            }
        }
    }

    // The sequence's K/V, read through its table, equal the model's on its tokens.
    void expect_fresh(const std::string& seq) {
        const kv::CachePtr exported = pool.export_contiguous(seq);
        const kv::CachePtr fresh = pool.fresh(pool.sequences().at(seq).tokens, pool.sequences().at(seq).extra);
        for (std::int64_t l = 0; l < 2; ++l) {
            EXPECT_TRUE(at::equal(kv::logical_keys(*exported, l), kv::logical_keys(*fresh, l))) << seq << " layer " << l;
            EXPECT_TRUE(at::equal(kv::logical_values(*exported, l), kv::logical_values(*fresh, l))) << seq << " layer " << l;
        }
    }
};

TEST_F(PagedPool, AllocWritesPendingUntilStepThenPublishesFullBlocks) {
    EXPECT_EQ(pool.alloc("a", {5, 9, 2, 7, 1}, ""), 0);
    const auto& table = pool.sequences().at("a").table;
    ASSERT_EQ(table.size(), 3u);
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(table[0])].written, 0);
    EXPECT_TRUE(pool.index().empty());               // nothing hittable before the boundary
    EXPECT_EQ(pool.lookup({5, 9, 2, 7, 3}, ""), 0);
    expect_fresh("a");                                // the sequence reads its own pending writes
    pool.step();
    EXPECT_EQ(pool.index().size(), 2u);               // two full blocks; the partial one is not published
    EXPECT_EQ(pool.lookup({5, 9, 2, 7, 3}, ""), 4);
    EXPECT_EQ(pool.lookup({5, 9, 2, 7}, ""), 2);      // a hit ends before the last token
    EXPECT_EQ(pool.lookup({5, 9, 2, 7, 3}, "lora-1"), 0);  // other extra keys, other blocks
    expect_consistent();
}

TEST_F(PagedPool, AHitSharesBlocksAndItsContentIsAFreshComputation) {
    pool.alloc("a", {5, 9, 2, 7, 1}, "");
    pool.step();
    EXPECT_EQ(pool.alloc("b", {5, 9, 2, 7, 3, 4}, ""), 4);
    EXPECT_EQ(pool.sequences().at("a").table[0], pool.sequences().at("b").table[0]);
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(pool.sequences().at("b").table[0])].count, 2);
    expect_fresh("a");
    expect_fresh("b");
    expect_consistent();
}

// Extra keys are part of a block's identity and of what the model computes
// (as a LoRA's are): the same tokens under another salt miss, and their
// K/V differ everywhere; under the same salt they hit.
TEST_F(PagedPool, ExtraKeysSeparateHitsAndChangeTheKV) {
    pool.alloc("a", {5, 9, 2, 7, 1}, "salt-1");
    pool.step();
    EXPECT_EQ(pool.lookup({5, 9, 2, 7, 1}, ""), 0);
    EXPECT_EQ(pool.alloc("b", {5, 9, 2, 7, 1}, ""), 0);
    EXPECT_EQ(pool.alloc("c", {5, 9, 2, 7, 1}, "salt-1"), 4);
    expect_fresh("a");
    expect_fresh("b");
    expect_fresh("c");
    const kv::CachePtr plain = pool.export_contiguous("b");
    const kv::CachePtr salted = pool.export_contiguous("a");
    for (std::int64_t l = 0; l < 2; ++l) {
        const at::Tensor differ = kv::logical_keys(*plain, l).ne(kv::logical_keys(*salted, l));
        EXPECT_TRUE(differ.all().item<bool>()) << "layer " << l << ": a K/V value the salt left unchanged";
    }
    expect_consistent();
}

TEST_F(PagedPool, FreedBlocksStayHittableUntilTakenAgain) {
    pool.alloc("a", {5, 9, 2, 7, 1}, "");
    pool.step();
    pool.free("a");
    EXPECT_EQ(pool.free_queue().size(), 7u);
    EXPECT_EQ(pool.lookup({5, 9, 2, 7, 1}, ""), 4);
    EXPECT_EQ(pool.alloc("b", {5, 9, 2, 7, 1}, ""), 4);  // touched: out of the free queue again
    expect_fresh("b");
    expect_consistent();
    pool.free("b");
    // Filling the pool takes every free block: the cached ones are evicted.
    pool.alloc("c", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, "");
    EXPECT_EQ(pool.lookup({5, 9, 2, 7, 1}, ""), 0);
    expect_consistent();
}

TEST_F(PagedPool, AFailedAllocChangesNothing) {
    pool.alloc("a", {1, 2, 3, 4, 5, 6, 7, 8, 9}, "");  // 5 of 7 blocks
    EXPECT_THROW(pool.alloc("b", {1, 1, 1, 1, 1}, ""), std::runtime_error);
    EXPECT_THROW(pool.alloc("c", {99}, ""), std::invalid_argument);  // outside the vocabulary
    EXPECT_EQ(pool.sequences().size(), 1u);
    EXPECT_EQ(pool.free_queue().size(), 2u);
    EXPECT_THROW(pool.append("a", 6), std::runtime_error);
    EXPECT_EQ(pool.sequences().at("a").tokens.size(), 9u);
    expect_consistent();
}

TEST_F(PagedPool, AWriteIntoASharedBlockCopiesItOnce) {
    pool.alloc("a", {5, 9, 2}, "");
    pool.fork("a", "b");
    const BlockId shared = pool.sequences().at("a").table[1];
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(shared)].count, 2);
    const auto before = pool.block_kv(shared);
    pool.append("b", 1);
    const BlockId copy = pool.sequences().at("b").table[1];
    EXPECT_NE(copy, shared);
    ASSERT_EQ(pool.pending_copies().size(), 1u);
    EXPECT_EQ(pool.pending_copies()[0].source, shared);
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(shared)].count, 2);  // a's table and the copy
    const auto after = pool.block_kv(shared);
    for (std::size_t l = 0; l < before.size(); ++l) EXPECT_TRUE(at::equal(before[l].first, after[l].first));
    expect_consistent();
    expect_fresh("a");
    expect_fresh("b");
    pool.append("b", 2);                                  // b's own block now: no second copy
    EXPECT_EQ(pool.pending_copies().size(), 1u);
    pool.step();
    EXPECT_TRUE(pool.pending_copies().empty());
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(shared)].count, 1);
    expect_fresh("b");
    expect_consistent();
}

TEST_F(PagedPool, ARewindCutsItsLastBlockAndDropsItsKeySoOtherTokensFollow) {
    pool.alloc("a", {5, 9, 2, 7, 1}, "");
    pool.step();  // blocks of 5,9 and 2,7 published
    const BlockId cut = pool.sequences().at("a").table[1];
    const BlockId emptied = pool.sequences().at("a").table[2];
    ASSERT_TRUE(pool.blocks()[static_cast<std::size_t>(cut)].key);
    pool.rewind("a", 2, 3);  // keeps 5,9,2
    EXPECT_EQ(pool.sequences().at("a").tokens, (Tokens{5, 9, 2}));
    EXPECT_EQ(pool.sequences().at("a").table.size(), 2u);
    EXPECT_FALSE(pool.blocks()[static_cast<std::size_t>(cut)].key) << "its tokens are no longer its key's";
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(cut)].tokens, (Tokens{2}));
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(emptied)].count, 0);
    EXPECT_EQ(pool.append("a", 1), (Tokens{3}));  // the token the rewind chose
    pool.step();
    EXPECT_EQ(pool.lookup({5, 9, 2, 7, 1}, ""), 2) << "the old block 2,7 is not hittable";
    EXPECT_EQ(pool.lookup({5, 9, 2, 3, 1}, ""), 4);
    expect_consistent();
    expect_fresh("a");
    EXPECT_THROW(pool.rewind("a", 0, 1), std::invalid_argument);
    pool.rewind("a", 9, 1);  // keeps one token at least
    EXPECT_EQ(pool.sequences().at("a").tokens, (Tokens{5}));
    expect_consistent();
}

TEST_F(PagedPool, ARewindCopiesASharedLastBlockAndIsRefusedWithoutAFreeOne) {
    pool.alloc("a", {5, 9, 2, 7}, "");
    pool.fork("a", "b");
    const BlockId shared = pool.sequences().at("a").table[1];
    pool.rewind("b", 1, 3);
    const BlockId copy = pool.sequences().at("b").table[1];
    EXPECT_NE(copy, shared);
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(shared)].tokens, (Tokens{2, 7})) << "a's block unchanged";
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(copy)].tokens, (Tokens{2}));
    ASSERT_EQ(pool.pending_copies().size(), 1u);
    expect_consistent();
    expect_fresh("a");
    expect_fresh("b");
    pool.step();
    pool.fork("a", "c");
    pool.alloc("d", {1, 1, 1, 1, 1, 1, 1, 1}, "");  // the last 4 free blocks
    ASSERT_TRUE(pool.free_queue().empty());
    const auto tables = pool.sequences().at("c").table;
    EXPECT_THROW(pool.rewind("c", 1, 3), std::runtime_error);
    EXPECT_EQ(pool.sequences().at("c").table, tables);
    EXPECT_EQ(pool.sequences().at("c").tokens.size(), 4u);
    expect_consistent();
}

TEST_F(PagedPool, EveryBlockIsFreeAfterEverySequenceIsFreedAndAStep) {
    pool.alloc("a", {5, 9, 2}, "");
    pool.fork("a", "b");
    pool.append("b", 2);
    pool.free("a");
    pool.free("b");
    pool.step();
    EXPECT_EQ(pool.free_queue().size(), 7u);
    for (std::size_t b = 0; b < pool.blocks().size(); ++b) EXPECT_EQ(pool.blocks()[b].count, 0);
    pool.reset();
    EXPECT_TRUE(pool.index().empty());
    EXPECT_TRUE(std::is_sorted(pool.free_queue().begin(), pool.free_queue().end()));
}

TEST_F(PagedPool, ImportThenExportGivesTheCacheBackSharingNothing) {
    const kv::CachePtr memory = kv::models::memory_cache(decoder, {3, 1, 4, 1, 5}, kv::Layout::modern);
    pool.import_contiguous("m", *memory);
    EXPECT_EQ(pool.sequences().at("m").table.size(), 3u);
    const kv::CachePtr back = pool.export_contiguous("m");
    for (std::int64_t l = 0; l < 2; ++l) {
        EXPECT_TRUE(at::equal(kv::logical_keys(*back, l), kv::logical_keys(*memory, l)));
        EXPECT_TRUE(at::equal(kv::logical_values(*back, l), kv::logical_values(*memory, l)));
    }
    for (const void* id : kv::storage_identities(*back)) {
        const auto pool_ids = pool.storage();
        EXPECT_EQ(std::count(pool_ids.begin(), pool_ids.end(), id), 0);
    }
    pool.step();
    EXPECT_TRUE(pool.index().empty());  // tokens unknown: never published
    pool.append("m", 3);
    EXPECT_EQ(kv::logical_keys(*pool.export_contiguous("m"), 0).size(2), 8);
    expect_consistent();
}

TEST_F(PagedPool, EvictDropsTheKeysOfFreeBlocksOnly) {
    pool.alloc("a", {5, 9, 2, 7, 1}, "");
    pool.alloc("b", {6, 6, 6}, "");
    pool.step();
    pool.free("a");
    pool.evict();
    EXPECT_EQ(pool.lookup({5, 9, 2, 7, 1}, ""), 0);
    EXPECT_EQ(pool.lookup({6, 6, 6}, ""), 2);
    EXPECT_THROW(pool.reset(), std::runtime_error);
    expect_consistent();
}

// Sliding windows: at each step a sequence gives back the blocks wholly
// before its next token's window, the null block in their place; what it
// reads inside the window is the model's, and it decodes as a windowed
// model decodes its tokens with no cache.
TEST(PagedPoolWindow, BlocksBehindTheWindowAreFreedAtTheStepAndTheNullBlockTakesTheirPlace) {
    kv::models::DecoderConfig model;
    model.eos_token = -1;
    model.window = 3;
    kv::models::Decoder decoder(model);
    PoolConfig config{8, 2, 2, 2, 4};
    config.window = 3;
    Pool pool(config, decoder);
    const Tokens prompt{5, 9, 2, 7, 1, 4};  // 6 tokens: the next, at 6, sees 4..6
    pool.alloc("a", prompt, "");
    const std::vector<BlockId> before = pool.sequences().at("a").table;
    ASSERT_EQ(before.size(), 3u);
    EXPECT_EQ(std::count(before.begin(), before.end(), BlockId{0}), 0) << "nothing is freed before the step";
    pool.step();
    const std::vector<BlockId> after = pool.sequences().at("a").table;
    EXPECT_EQ(after, (std::vector<BlockId>{0, 0, before[2]}));
    EXPECT_EQ(pool.blocks()[static_cast<std::size_t>(before[0])].count, 0);
    EXPECT_EQ(pool.blocks()[0].count, 0);
    EXPECT_EQ(pool.free_queue().size(), 6u);
    EXPECT_TRUE(pool.blocks()[static_cast<std::size_t>(before[0])].key) << "a freed block keeps its key";
    // Decoding through the table reads zeros where the window does not look.
    const Tokens added = pool.append("a", 3);
    Tokens all = prompt;
    all.insert(all.end(), added.begin(), added.end());
    EXPECT_EQ(kv::models::generate_without_cache(decoder, prompt, 3), added) << "the appended tokens are the windowed model's";
    // The sequence's blocks inside the window hold the model's K/V.
    pool.step();
    const kv::CachePtr fresh = pool.fresh(pool.sequences().at("a").tokens, "");
    const kv::CachePtr read = pool.export_contiguous("a");
    const auto from = static_cast<std::int64_t>(all.size()) - 3 + 1;  // the next token's window starts here
    for (std::int64_t l = 0; l < 2; ++l) {
        const std::int64_t n = static_cast<std::int64_t>(all.size()) - from;
        EXPECT_TRUE(at::equal(kv::logical_keys(*read, l).narrow(2, from, n), kv::logical_keys(*fresh, l).narrow(2, from, n)));
        EXPECT_TRUE(at::equal(kv::logical_values(*read, l).narrow(2, from, n), kv::logical_values(*fresh, l).narrow(2, from, n)));
    }
    EXPECT_THROW(pool.rewind("a", 1, 3), std::invalid_argument) << "no rewind behind a window";
    pool.fork("a", "b");
    pool.free("a");
    pool.free("b");
    pool.step();
    EXPECT_EQ(pool.free_queue().size(), 7u);
    for (const kv::paged::Block& b : pool.blocks()) EXPECT_EQ(b.count, 0);
}

}  // namespace
