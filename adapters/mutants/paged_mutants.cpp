// The paged mutants: the paged reference (reference/paged_reference.h) with
// one known bug of real block managers planted each (docs/semantics.md#known-paged-bugs),
// one style for all: a kv::paged::Pool subclass overriding one seam.
#include "mutants/mutants.h"

#include "reference/paged_reference.h"

#include <ATen/ops/cat.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace kvcheck::adapters {
namespace {

using kv::paged::BlockId;
using kv::paged::BlockKey;
using kv::paged::Pool;
using kv::paged::PoolConfig;

// PM1: a block taken from the free queue for reuse stays in the prefix
// index under its old key; a later hit returns it, overwritten.
class PM1 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    BlockId take_free() override {
        if (free_.empty()) throw std::runtime_error("paged pool: out of blocks");
        const BlockId block = free_.front();
        free_.pop_front();
        kv::paged::Block& b = blocks_[static_cast<std::size_t>(block)];
        b.tokens.clear();
        b.written = 0;
        ++b.epoch;
        return block;
    }
};

// PM2: evict takes the free blocks out of the index but leaves each its
// hash: the block keeps a stale identity.
class PM2 final : public Pool {
  public:
    using Pool::Pool;
    void evict_all() {
        for (const BlockId block : free_) {
            kv::paged::Block& b = blocks_[static_cast<std::size_t>(block)];
            if (!b.key) continue;
            const auto key = *b.key;
            remove_from_index(block);
            b.key = key;
        }
    }
};

// PM3: blocks identified by a weak hash (parent, extra keys and the sum of
// the tokens), with no check of the tokens: a collision hits the wrong block.
class PM3 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    std::optional<BlockId> find(const BlockKey& key) const override {
        auto sum = [](const kv::paged::Tokens& t) { return std::accumulate(t.begin(), t.end(), std::int64_t{0}); };
        for (const auto& [indexed, blocks] : index_) {
            if (indexed.parent == key.parent && indexed.extra == key.extra && sum(indexed.tokens) == sum(key.tokens) && !blocks.empty()) {
                return blocks.front();
            }
        }
        return std::nullopt;
    }
};

// PM4: a full block's hash is published at allocation, before the forward
// pass wrote its K/V: a same-step request hits an unwritten block.
class PM4 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void publish_later(BlockId block, BlockKey key) override {
        kv::paged::Block& b = blocks_[static_cast<std::size_t>(block)];
        if (b.key) return;
        b.key = key;
        index_[key].push_back(block);
    }
};

// PM5: copy-on-write copies layer 0 only.
class PM5 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void copy_block(BlockId source, BlockId destination) override {
        auto kv = block_kv(source);
        kv.resize(1);
        const auto filled = static_cast<std::int64_t>(blocks_[static_cast<std::size_t>(source)].tokens.size());
        stage(destination, 0, kv, 0, filled);
        blocks_[static_cast<std::size_t>(destination)].tokens = blocks_[static_cast<std::size_t>(source)].tokens;
        ++blocks_[static_cast<std::size_t>(source)].count;
        copies_.push_back({source, destination});
    }
};

// PM6: no copy-on-write: a sequence appends in place into a block it shares.
class PM6 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    bool must_copy(BlockId) const override { return false; }
};

// PM7: a finished request is detached without decrementing its blocks'
// counts: nothing is ever freed.
class PM7 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void release_sequence(kv::paged::Sequence&) override {}
};

// PM8: a hit reports its cached tokens but attaches no K/V: fresh blocks
// stand where the hits should (when the pool has room for them).
class PM8 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void attach_hits(kv::paged::Sequence& sequence, const std::vector<BlockId>& hits) override {
        const auto spare = static_cast<std::int64_t>(free_.size()) -
                           static_cast<std::int64_t>(hits.size());  // the hits' room, and the rest's
        if (hits.empty() || spare < static_cast<std::int64_t>(hits.size()) + 2) {
            Pool::attach_hits(sequence, hits);
            return;
        }
        for (std::size_t i = 0; i < hits.size(); ++i) {
            const BlockId block = take_free();
            blocks_[static_cast<std::size_t>(block)].count = 1;
            sequence.table.push_back(block);
        }
    }
};

// PM9: a pending copy holds no reference on its source: the source can be
// freed and reused while the copy still reads it.
class PM9 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void copy_block(BlockId source, BlockId destination) override {
        Pool::copy_block(source, destination);
        --blocks_[static_cast<std::size_t>(source)].count;
    }
    void end_copy(const kv::paged::PendingCopy&) override {}
};

// PM10: no room check before an alloc: it takes blocks until the pool runs
// out, then throws, keeping what it took.
class PM10 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    std::int64_t free_blocks() const override { return 1 << 20; }
};

// PM11: export trims the length it reports but keeps whole blocks: the
// tail of the last block (a previous request's K/V) leaks into the export.
class PM11 final : public Pool {
  public:
    using Pool::Pool;
    kv::CachePtr export_contiguous(const std::string& seq) const override {
        const auto& s = sequences_.at(seq);
        kv::CachePtr cache = kv::Cache::make(kv::Layout::modern);
        for (std::int64_t l = 0; l < config_.layers; ++l) {
            std::vector<at::Tensor> keys, values;
            for (const BlockId block : s.table) {
                keys.push_back(keys_[static_cast<std::size_t>(l)][block].unsqueeze(0));
                values.push_back(values_[static_cast<std::size_t>(l)][block].unsqueeze(0));
            }
            cache->update(at::cat(keys, 2), at::cat(values, 2), l);
        }
        return cache;
    }
};

// PM12: the last block of a sequence is released twice when it ends.
class PM12 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void release_sequence(kv::paged::Sequence& sequence) override {
        Pool::release_sequence(sequence);
        if (sequence.table.empty()) return;
        kv::paged::Block& last = blocks_[static_cast<std::size_t>(sequence.table.back())];
        if (last.count > 0 && --last.count == 0) free_.push_back(sequence.table.back());
    }
};

// PM13: a block joins the free queue when its count drops to 1, not 0 (a
// free through a stale mapping): another sequence's live block is free.
class PM13 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void unref(BlockId block) override {
        kv::paged::Block& b = blocks_[static_cast<std::size_t>(block)];
        --b.count;
        if (b.count <= 1 && std::find(free_.begin(), free_.end(), block) == free_.end()) free_.push_back(block);
    }
};

// The paged reference whose evict is PM2's.
class PM2Engine final : public PagedReference {
  public:
    PM2Engine()
        : PagedReference([](PoolConfig config, kv::Model& model) { return std::unique_ptr<Pool>(std::make_unique<PM2>(config, model)); }) {}
    void paged_evict() override { static_cast<PM2&>(pool()).evict_all(); }
};

template <typename P>
std::shared_ptr<Engine> paged_engine_of() {
    return std::make_shared<PagedReference>(
        [](PoolConfig config, kv::Model& model) { return std::unique_ptr<Pool>(std::make_unique<P>(config, model)); });
}

template <typename P>
Adapter paged_mutant(const std::string& name, std::string description, std::vector<Property> breaks) {
    return {name, std::move(description), "bundled", std::move(breaks), [name] {
                std::shared_ptr<Engine> engine = paged_engine_of<P>();
                std::static_pointer_cast<PagedReference>(engine)->rename(name);
                return engine;
            }};
}

using P = Property;

}  // namespace

std::vector<Adapter> paged_mutant_adapters() {
    return {
        paged_mutant<PM1>("PM1", "a block reused from the free queue stays in the prefix index",
                          {P::index_consistent, P::published_after_written}),
        {"PM2", "evict leaves the evicted block its hash (a stale identity)", "bundled", {P::index_consistent},
         [] {
             auto engine = std::make_shared<PM2Engine>();
             engine->rename("PM2");
             return std::shared_ptr<Engine>(std::move(engine));
         }},
        paged_mutant<PM3>("PM3", "blocks matched by a weak hash with no token check", {P::prefix_hit_exact}),
        paged_mutant<PM4>("PM4", "hashes published at allocation, before the K/V are written", {P::published_after_written}),
        paged_mutant<PM5>("PM5", "copy-on-write copies layer 0 only", {P::cow_exact}),
        paged_mutant<PM6>("PM6", "no copy-on-write: appends go into a shared block", {P::published_immutable, P::cow_exact}),
        paged_mutant<PM7>("PM7", "a finished request's blocks are never released", {P::refcount_exact, P::no_leak}),
        paged_mutant<PM8>("PM8", "a hit reports cached tokens but attaches fresh blocks, not the K/V", {P::prefix_hit_exact, P::hit_consumed}),
        paged_mutant<PM9>("PM9", "a pending copy holds no reference on the block it reads", {P::refcount_exact, P::no_reuse_while_read}),
        paged_mutant<PM10>("PM10", "alloc checks no room first and keeps what it took when it runs out", {P::op_atomic}),
        paged_mutant<PM11>("PM11", "export keeps whole blocks: the last block's stale tail leaks", {P::paged_roundtrip}),
        paged_mutant<PM12>("PM12", "the last block of a sequence is released twice", {P::refcount_exact}),
        paged_mutant<PM13>("PM13", "a block joins the free queue when its count drops to 1", {P::free_iff_unreferenced}),
    };
}

}  // namespace kvcheck::adapters
