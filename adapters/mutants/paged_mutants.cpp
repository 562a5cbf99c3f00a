// The paged mutants: the paged reference (reference/paged_reference.h) with
// one known bug of real block managers planted each (docs/semantics.md#known-paged-bugs),
// one style for all: a kv::paged::Pool subclass overriding one seam.
#include "mutants/mutants.h"

#include "reference/paged_reference.h"

#include <ATen/ops/cat.h>

#include <algorithm>
#include <map>
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

// PM7: a finished request is detached without its blocks being released:
// the pool keeps its table and its counts, and nothing is ever freed.
class PM7 final : public Pool {
  public:
    using Pool::Pool;
    void free(const std::string&) override {}
};

// PM8: a hit reports its cached tokens but attaches none of the cached
// blocks: it fills fresh blocks with their K/V instead (the cached blocks
// are neither touched nor shared), when the pool has room for them.
class PM8 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void attach_hits(kv::paged::Sequence& sequence, const std::vector<BlockId>& hits, std::int64_t rest) override {
        if (hits.empty() || static_cast<std::int64_t>(free_.size()) < static_cast<std::int64_t>(hits.size()) + rest) {
            Pool::attach_hits(sequence, hits, rest);
            return;
        }
        std::vector<kv::paged::Tokens> tokens;
        std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> contents;
        for (const BlockId hit : hits) {
            contents.push_back(block_kv(hit));
            tokens.push_back(blocks_[static_cast<std::size_t>(hit)].tokens);
        }
        for (std::size_t i = 0; i < hits.size(); ++i) {
            const BlockId block = take_free();
            kv::paged::Block& b = blocks_[static_cast<std::size_t>(block)];
            ++b.count;
            stage(block, 0, contents[i], 0, static_cast<std::int64_t>(tokens[i].size()));
            b.tokens = tokens[i];
            sequence.table.push_back(block);
        }
    }
};

// PM9: the allocator takes a block whose only references are pending
// copies (it counts in-flight readers as no owner): the block is rewritten
// while a copy still reads it. Its counts stay exact.
class PM9 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    BlockId take_free() override {
        for (const kv::paged::PendingCopy& copy : copies_) {
            kv::paged::Block& b = blocks_[static_cast<std::size_t>(copy.source)];
            const auto readers = std::count_if(copies_.begin(), copies_.end(),
                                               [&copy](const kv::paged::PendingCopy& c) { return c.source == copy.source; });
            if (b.count != readers) continue;
            remove_from_index(copy.source);
            b.tokens.clear();
            b.written = 0;
            ++b.epoch;
            return copy.source;
        }
        return Pool::take_free();
    }
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

// PM14: when a block is promoted to its full key, the key it had while
// partial (its first B - 1 tokens) is registered again: the superseded
// key stays in the index, on a block whose identity is another.
class PM14 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void publish(BlockId block, const BlockKey& key) override {
        Pool::publish(block, key);
        if (key.tokens.size() < 2) return;
        index_[BlockKey{key.parent, kv::paged::Tokens(key.tokens.begin(), key.tokens.end() - 1), key.extra}].push_back(block);
    }
};

// PM15: one pin, two unpins: a sequence that ends releases each cached
// (published) block of its table twice, once for its table and once more
// for the hit that touched it.
class PM15 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void release_sequence(kv::paged::Sequence& sequence) override {
        Pool::release_sequence(sequence);
        for (const BlockId block : sequence.table) {
            kv::paged::Block& b = blocks_[static_cast<std::size_t>(block)];
            if (!b.key || b.count == 0) continue;
            if (--b.count == 0) free_.push_back(block);
        }
    }
};

// PM16: a hit takes its reference on the wrong block (the next one by id):
// the hit block may stay free, be taken and get a second owner.
class PM16 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void attach_hits(kv::paged::Sequence& sequence, const std::vector<BlockId>& hits, std::int64_t) override {
        for (const BlockId block : hits) {
            const BlockId wrong = block % (config_.blocks - 1) + 1;
            kv::paged::Block& b = blocks_[static_cast<std::size_t>(wrong)];
            if (b.count++ == 0) free_.erase(std::find(free_.begin(), free_.end(), wrong));
            sequence.table.push_back(block);
        }
    }
};

// PM17: the room check counts only free blocks without an identity: a
// cached free block, which an alloc would evict, counts as taken, so a
// pool whose free blocks are all cached refuses what it could hold.
class PM17 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    std::int64_t free_blocks() const override {
        return std::count_if(free_.begin(), free_.end(), [this](BlockId b) { return !blocks_[static_cast<std::size_t>(b)].key; });
    }
};

// PM18: an append decodes on its K/V with the first position blanked (a
// sliding window off by one that masks the oldest token by zeroing it):
// the tokens it gives are not those the exported cache gives.
class PM18 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    kv::CachePtr working_cache(const kv::paged::Sequence& sequence) const override {
        kv::CachePtr working = gather(sequence);
        for (std::int64_t l = 0; l < working->layer_count(); ++l) {
            kv::logical_keys(*working, l).narrow(2, 0, 1).zero_();
            kv::logical_values(*working, l).narrow(2, 0, 1).zero_();
        }
        return working;
    }
};

// PM19: copy-on-write assigns the copy's K/V by reference: its first
// slots read the source's storage, so when the source is freed and taken
// again, the copy's K/V change under the sequence holding it.
class PM19 final : public Pool {
  public:
    using Pool::Pool;
    std::vector<std::pair<at::Tensor, at::Tensor>> block_kv(BlockId block) const override {
        std::vector<std::pair<at::Tensor, at::Tensor>> own = Pool::block_kv(block);
        const auto alias = aliases_.find(block);
        if (alias == aliases_.end()) return own;
        const std::vector<std::pair<at::Tensor, at::Tensor>> source = Pool::block_kv(alias->second.source);
        for (std::size_t l = 0; l < own.size() && l < source.size(); ++l) {
            const std::int64_t shared = std::min({alias->second.slots, source[l].first.size(2), own[l].first.size(2)});
            own[l].first.narrow(2, 0, shared).copy_(source[l].first.narrow(2, 0, shared));
            own[l].second.narrow(2, 0, shared).copy_(source[l].second.narrow(2, 0, shared));
        }
        return own;
    }

  protected:
    void copy_block(BlockId source, BlockId destination) override {
        Pool::copy_block(source, destination);
        aliases_[destination] = {source, static_cast<std::int64_t>(blocks_[static_cast<std::size_t>(source)].tokens.size())};
    }
    BlockId take_free() override {
        const BlockId block = Pool::take_free();
        aliases_.erase(block);  // taken: no longer anyone's copy
        return block;
    }

  private:
    struct Alias {
        BlockId source = 0;
        std::int64_t slots = 0;
    };
    std::map<BlockId, Alias> aliases_;
};

// PM20: a rewind keeps the hash of the block it cuts: the block's tokens
// (rewritten by later appends) are no longer its key's, and a hit on the
// key serves K/V for the wrong tokens.
class PM20 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void truncate_block(BlockId block, std::int64_t slots) override {
        kv::paged::Block& b = blocks_[static_cast<std::size_t>(block)];
        b.tokens.resize(static_cast<std::size_t>(slots));
        b.written = std::min(b.written, slots);
    }
};

// PM21: a lookup counts only the hits on blocks a sequence holds: a
// cached free block (freed, still indexed, what an alloc would hit) is
// missed, as by a lookup that reads the running requests' blocks instead
// of the prefix index. Allocs still hit it.
class PM21 final : public Pool {
  public:
    using Pool::Pool;
    std::int64_t lookup(const kv::paged::Tokens& tokens, const std::string& extra) const override {
        std::int64_t found = 0;
        for (const BlockId block : hits(tokens, extra)) {
            if (blocks_[static_cast<std::size_t>(block)].count == 0) break;
            ++found;
        }
        return found * config_.block_tokens;
    }
};

// PM28: a lookup that keeps counting hits past the first miss (issue 41's
// "lookup past a miss"): every block key of the request still indexed is
// counted, not the chain up to the first key that is not. A chain key names
// its parent's tokens, not whether the parent is cached, so after a rewind
// cut a published block (its key dropped) the block after it, released, is
// still indexed and counted.
class PM28 final : public Pool {
  public:
    using Pool::Pool;
    std::int64_t lookup(const kv::paged::Tokens& tokens, const std::string& extra) const override {
        std::int64_t found = 0;
        for (const kv::paged::BlockKey& key : block_keys(tokens, extra)) found += find(key) ? 1 : 0;
        return found * config_.block_tokens;
    }
};

// PM22: a block's key is deleted when its count drops to 0 (eager key
// deletion): freed prefixes never hit again.
class PM22 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void unref(BlockId block) override {
        Pool::unref(block);
        if (blocks_[static_cast<std::size_t>(block)].count == 0) remove_from_index(block);
    }
};

// PM23: an inverted evict filter: the keys of the held blocks are dropped,
// the free blocks' kept.
class PM23 final : public Pool {
  public:
    using Pool::Pool;
    void evict() override {
        for (std::size_t b = 1; b < blocks_.size(); ++b) {
            if (blocks_[b].count > 0) remove_from_index(static_cast<BlockId>(b));
        }
    }
};

// PM25: the extra keys are left out of the block keys (a manager hashing
// the tokens alone, as one that predates LoRA or cache salts): a request
// hits blocks another adapter's or salt's request computed.
class PM25 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    std::string key_extra(const std::string&) const override { return ""; }
};

// The paged reference whose evict is PM2's.
class PM2Engine final : public PagedReference {
  public:
    PM2Engine()
        : PagedReference([](PoolConfig config, kv::Model& model) { return std::unique_ptr<Pool>(std::make_unique<PM2>(config, model)); }) {}
    void paged_evict() override { static_cast<PM2&>(pool()).evict_all(); }
};

// The paged reference's pool with freed blocks at the front of the free
// queue (LIFO: the block freed last is taken first).
PoolConfig lifo_config() {
    PoolConfig config = PagedReference::default_config();
    config.free_to_front = true;
    return config;
}

// PM24: freed blocks join the front of the free queue (LIFO) while the
// engine declares the back (FIFO): a correct pool of another order than
// the one it claims (what a serving layer relying on the order, to keep
// the oldest cached blocks longest, would get wrong).
class PM24Engine final : public PagedReference {
  public:
    PM24Engine() : PagedReference(nullptr, lifo_config()) {}
    Capabilities capabilities() const override {
        Capabilities capabilities = PagedReference::capabilities();
        capabilities.paged_free_order = PagedFreeOrder::back;
        return capabilities;
    }
};

// PM26: freed blocks join the back of the free queue in the order they are
// freed (FIFO) while the engine declares least recently used first: a
// sequence used long ago and freed late goes behind blocks used since (an
// LRU list that refreshes a block when it is released instead of when it
// is used).
class PM26Engine final : public PagedReference {
  public:
    Capabilities capabilities() const override {
        Capabilities capabilities = PagedReference::capabilities();
        capabilities.paged_free_order = PagedFreeOrder::lru;
        return capabilities;
    }
};

// PM27: a sliding window off by one: the blocks before the first position
// the next token still reads are released, and the block holding that
// position with them (its positions counted from 1, not 0): the sequence's
// window reads the null block's zeros where its oldest token's K/V were.
class PM27 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    std::int64_t blocks_behind_window(std::int64_t length) const override {
        if (config_.window <= 0) return 0;
        return std::max<std::int64_t>(0, length - config_.window + 2) / config_.block_tokens;
    }
};

class PM27Engine final : public PagedReference {
  public:
    PM27Engine()
        : PagedReference([](PoolConfig config, kv::Model& model) { return std::unique_ptr<Pool>(std::make_unique<PM27>(config, model)); },
                         window_config()) {}
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
        paged_mutant<PM6>("PM6", "no copy-on-write: appends go into a shared block", {P::published_immutable}),
        paged_mutant<PM7>("PM7", "a finished request is detached but its table is kept: nothing is ever freed", {P::no_leak}),
        paged_mutant<PM8>("PM8", "a hit reports cached tokens but attaches fresh copies, not the cached blocks", {P::hit_consumed}),
        paged_mutant<PM9>("PM9", "the allocator takes a block only pending copies hold, while they read it",
                          {P::no_reuse_while_read}),
        paged_mutant<PM10>("PM10", "alloc checks no room first and keeps what it took when it runs out", {P::op_atomic}),
        paged_mutant<PM11>("PM11", "export keeps whole blocks: the last block's stale tail leaks",
                           {P::paged_roundtrip, P::generation_equivalent}),
        paged_mutant<PM12>("PM12", "the last block of a sequence is released twice", {P::refcount_exact}),
        paged_mutant<PM13>("PM13", "a block joins the free queue when its count drops to 1", {P::free_iff_unreferenced}),
        paged_mutant<PM14>("PM14", "a promoted block's superseded partial key is registered again", {P::index_consistent}),
        paged_mutant<PM15>("PM15", "one pin, two unpins: a cached block is released twice when its sequence ends", {P::refcount_exact}),
        paged_mutant<PM16>("PM16", "a hit takes its reference on the wrong block", {P::refcount_exact}),
        paged_mutant<PM17>("PM17", "the room check ignores cached free blocks: needless refusals", {P::op_atomic}),
        paged_mutant<PM18>("PM18", "an append decodes with the first cached position blanked",
                           {P::generation_equivalent, P::paged_roundtrip}),
        paged_mutant<PM19>("PM19", "copy-on-write by reference: the copy reads the source's storage", {P::published_immutable}),
        paged_mutant<PM20>("PM20", "a rewind keeps the hash of the block it cuts: hits serve K/V for other tokens",
                           {P::prefix_hit_exact, P::index_consistent}),
        paged_mutant<PM21>("PM21", "a lookup misses cached free blocks: it counts only the hits on held ones", {P::lookup_exact}),
        paged_mutant<PM22>("PM22", "eager key deletion: a block's key goes when its count drops to 0", {P::keys_retained}),
        paged_mutant<PM23>("PM23", "an inverted evict: the held blocks lose their keys, the free ones keep theirs", {P::keys_retained}),
        {"PM24", "freed blocks join the front of the free queue where the back is declared", "bundled", {P::free_order},
         [] {
             auto engine = std::make_shared<PM24Engine>();
             engine->rename("PM24");
             return std::shared_ptr<Engine>(std::move(engine));
         }},
        paged_mutant<PM25>("PM25", "extra keys left out of the block keys: hits across LoRA adapters and salts",
                           {P::index_consistent, P::prefix_hit_exact, P::hit_consumed}),
        {"PM26", "freed blocks join the back in free order where least recently used first is declared", "bundled",
         {P::free_order},
         [] {
             auto engine = std::make_shared<PM26Engine>();
             engine->rename("PM26");
             return std::shared_ptr<Engine>(std::move(engine));
         }},
        paged_mutant<PM28>("PM28", "a lookup counts hits past the first miss: every indexed block key of the request", {P::lookup_exact}),
        {"PM27", "a sliding window off by one: the block of the oldest position a window reads is freed", "bundled",
         {P::refcount_exact},
         [] {
             auto engine = std::make_shared<PM27Engine>();
             engine->rename("PM27");
             return std::shared_ptr<Engine>(std::move(engine));
         }},
    };
}

}  // namespace kvcheck::adapters
