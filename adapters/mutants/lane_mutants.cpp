// The concurrency mutants (docs/semantics.md#known-concurrency-bugs): bugs
// of a multi-call client protocol, which a call of another client between
// two of a request's calls exposes. Each is the paged reference (or the
// reference) with one seam overridden, like the mutants of mutants.cpp and
// paged_mutants.cpp; each is listed with the properties it breaks under
// `kvcheck run --lanes N` (Adapter::lanes), where the lanes workload
// (harness/lanes.cpp) draws the protocol and other clients' calls inside it.
#include "mutants/mutants.h"

#include "reference/paged_reference.h"
#include "reference/reference_engine.h"
#include "kvcheck/yield.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

namespace kvcheck::adapters {
namespace {

using kv::paged::BlockId;
using kv::paged::BlockKey;
using kv::paged::Pool;

// LM1: lookup-then-pin without re-validation. A lookup hands its request a
// ticket (the blocks it hit, by key), and the alloc of the same request
// (same tokens, same extra keys) pins the ticket's blocks instead of
// looking the keys up again, as a scheduler that takes references on the
// blocks its earlier lookup returned. Alone, nothing happens between the
// two; with another client's evict, or an alloc or append that takes the
// ticket's cached free blocks for other tokens, the alloc pins blocks that
// no longer hold its prefix.
class LM1 final : public Pool {
  public:
    using Pool::Pool;
    std::int64_t lookup(const kv::paged::Tokens& tokens, const std::string& extra) const override {
        tickets_.erase({tokens, extra});
        const std::vector<BlockKey> keys = block_keys(tokens, extra);
        const std::vector<BlockId> found = hits(tokens, extra);
        std::map<BlockKey, BlockId>& ticket = tickets_[{tokens, extra}];
        for (std::size_t i = 0; i < found.size(); ++i) ticket[keys[i]] = found[i];
        return static_cast<std::int64_t>(found.size()) * config_.block_tokens;
    }

  protected:
    std::vector<BlockKey> block_keys(const kv::paged::Tokens& tokens, const std::string& extra) const override {
        const auto ticket = tickets_.find({tokens, extra});
        current_ = ticket == tickets_.end() ? nullptr : &ticket->second;
        return Pool::block_keys(tokens, extra);
    }
    std::optional<BlockId> find(const BlockKey& key) const override {
        if (current_ != nullptr) {
            const auto at = current_->find(key);
            if (at != current_->end()) return at->second;  // the lookup's answer, not looked up again
        }
        return Pool::find(key);
    }
    void attach_hits(kv::paged::Sequence& sequence, const std::vector<BlockId>& hits, std::int64_t rest) override {
        Pool::attach_hits(sequence, hits, rest);
        for (auto at = tickets_.begin(); at != tickets_.end(); ++at) {
            if (&at->second == current_) {
                tickets_.erase(at);  // the ticket is used up by its request's alloc
                break;
            }
        }
        current_ = nullptr;
    }

  private:
    mutable std::map<std::pair<kv::paged::Tokens, std::string>, std::map<BlockKey, BlockId>> tickets_;
    mutable const std::map<BlockKey, BlockId>* current_ = nullptr;
};

// LM2: a handed-out copy is refreshed from its entry at use. get_cache of
// one id hands out an owned copy and remembers where it came from; the
// first generation from it, when the entry was overwritten since, takes
// the copy again from the entry as it now is (a client that holds a key
// and fetches the K/V when it generates, not when it asked). Alone, a
// request's copy and its generation see one entry; with another client's
// add of the id in between, the generation is from K/V the request never
// got.
class LM2 final : public ReferenceEngine {
  public:
    void get_cache(const std::vector<std::string>& ids, Handle out) override {
        ReferenceEngine::get_cache(ids, out);
        sources_.erase(out);
        if (ids.size() == 1 && store_.get(ids.front())) sources_[out] = {ids.front(), store_.get(ids.front())->cache};
    }
    GenerateResult generate(Handle handle, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                            bool stream) override {
        const auto source = sources_.find(handle);
        if (source != sources_.end()) {
            const std::string id = source->second.first;
            const kv::ItemPtr now = store_.get(id);
            if (now && now->cache != source->second.second) get_cache({id}, handle);
            sources_.erase(handle);
        }
        return ReferenceEngine::generate(handle, prompt, max_new_tokens, stream);
    }
    void release(Handle handle) override {
        sources_.erase(handle);
        ReferenceEngine::release(handle);
    }

  private:
    std::map<Handle, std::pair<std::string, kv::ConstCachePtr>> sources_;
};

// LM3: a split load/store reference count. A lookup loads the counts of
// the blocks it hits, and the alloc of the same request (same tokens, same
// extra keys) stores each loaded count plus one, deciding by the loaded
// count whether the block leaves the free queue (a scheduler that reads the
// counts when it plans a request and writes them when it admits it).
// Alone, nothing happens between the two; with another client's alloc
// pinning the same blocks in between, an increment is lost (the count says
// one table where two hold the block, which the first free returns to the
// free queue while the other still reads it); with another client's free
// of the last table holding them, a decrement is lost (a block in the free
// queue with a count of 2, which the next alloc may take while it is held).
class LM3 final : public Pool {
  public:
    using Pool::Pool;
    std::int64_t lookup(const kv::paged::Tokens& tokens, const std::string& extra) const override {
        loads_.erase({tokens, extra});
        const std::vector<BlockId> found = hits(tokens, extra);
        std::map<BlockId, std::int64_t>& loaded = loads_[{tokens, extra}];
        for (const BlockId block : found) loaded[block] = blocks_[static_cast<std::size_t>(block)].count;
        return static_cast<std::int64_t>(found.size()) * config_.block_tokens;
    }

  protected:
    std::vector<BlockKey> block_keys(const kv::paged::Tokens& tokens, const std::string& extra) const override {
        current_ = loads_.find({tokens, extra});
        return Pool::block_keys(tokens, extra);
    }
    void attach_hits(kv::paged::Sequence& sequence, const std::vector<BlockId>& hits, std::int64_t rest) override {
        if (current_ == loads_.end()) {
            Pool::attach_hits(sequence, hits, rest);
            return;
        }
        for (const BlockId block : hits) {
            kv::paged::Block& b = blocks_[static_cast<std::size_t>(block)];
            const auto load = current_->second.find(block);
            const std::int64_t loaded = load == current_->second.end() ? b.count : load->second;
            const auto queued = std::find(free_.begin(), free_.end(), block);
            if (loaded == 0 && queued != free_.end()) free_.erase(queued);
            b.count = loaded + 1;  // the store of what was loaded, whatever happened since
            sequence.table.push_back(block);
        }
        loads_.erase(current_);  // used up by its request's alloc
        current_ = loads_.end();
    }

  private:
    using Loads = std::map<std::pair<kv::paged::Tokens, std::string>, std::map<BlockId, std::int64_t>>;
    mutable Loads loads_;
    mutable Loads::iterator current_ = loads_.end();
};

// LM4: get_cache racing delete: a copy in flight is the entry's. get_cache
// of one id hands out an owned copy that the store counts as its entry's
// (freed with it) until the first generation from it or its release; a
// delete of the id frees the entry and its copies in flight, and the next
// add takes a freed copy's memory for its own entry (a slab handed out
// again). Alone, a request generates from its copy right after taking it;
// with another client's delete and add in between, the copy the request
// holds is the new entry: it aliases the store, and its generation is from
// K/V the request never got.
class LM4 final : public ReferenceEngine {
  public:
    void get_cache(const std::vector<std::string>& ids, Handle out) override {
        ReferenceEngine::get_cache(ids, out);
        forget(out);
        if (ids.size() == 1 && handle(out)) in_flight_[ids.front()].push_back(out);
    }
    GenerateResult generate(Handle h, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                            bool stream) override {
        forget(h);
        return ReferenceEngine::generate(h, prompt, max_new_tokens, stream);
    }
    void release(Handle h) override {
        forget(h);
        ReferenceEngine::release(h);
    }
    void remove(const std::vector<std::string>& ids) override {
        for (const std::string& id : ids) {
            const auto copies = in_flight_.find(id);
            if (copies == in_flight_.end()) continue;
            for (const Handle h : copies->second) freed_.push_back(std::const_pointer_cast<kv::Cache>(handle(h)));
            in_flight_.erase(copies);
        }
        ReferenceEngine::remove(ids);
    }

  protected:
    void store_add(const std::string& id, const kv::CachePtr& cache, const Metadata& metadata) override {
        if (freed_.empty()) {
            ReferenceEngine::store_add(id, cache, metadata);
            return;
        }
        const kv::CachePtr memory = freed_.front();
        freed_.pop_front();
        *memory = *cache;  // the new entry written into the freed copy's memory
        ReferenceEngine::store_add(id, memory, metadata);
    }

  private:
    void forget(Handle h) {
        for (auto& [id, handles] : in_flight_) handles.erase(std::remove(handles.begin(), handles.end(), h), handles.end());
    }
    std::map<std::string, std::vector<Handle>> in_flight_;
    std::deque<kv::CachePtr> freed_;
};

// An engine of type E (made from `args`), named `name`: a concurrency
// mutant, listed with the lanes its bug needs.
template <typename E, typename... Args>
Adapter lane_mutant(const std::string& name, std::string description, std::vector<Property> breaks, Args... args) {
    Adapter adapter{name, std::move(description), "bundled", std::move(breaks), [name, args...] {
                        auto engine = std::make_shared<E>(args...);
                        engine->rename(name);
                        return std::shared_ptr<Engine>(std::move(engine));
                    }};
    adapter.lanes = 2;
    return adapter;
}

// The paged reference over a pool of type P.
template <typename P>
PagedReference::PoolFactory pool_of() {
    return [](kv::paged::PoolConfig config, kv::Model& model) { return std::unique_ptr<Pool>(std::make_unique<P>(config, model)); };
}

// ---- the thread level's mutants (kvcheck/threads.h) ----
// Each is the paged reference with its lock dropped (it still declares
// thread_safe) and a kvcheck::yield inside the critical section the lock
// kept whole: calls of other clients' threads can run there. One client,
// or the operation level (each call atomic), never runs anything there.

class Unlocked final : public PagedReference {
  public:
    explicit Unlocked(PoolFactory make_pool) : PagedReference(std::move(make_pool)) { locked_ = false; }
};

// TM1: an unlocked free-queue update (the pool's LRU list of free blocks):
// a release loads the free queue, yields, and stores back what it loaded
// with its block at the back. Another client's call in between is undone:
// a block it took is free again while its table holds it (taken twice), a
// block it freed is lost (count 0, never taken again).
class TM1 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void unref(BlockId block) override {
        const std::deque<BlockId> loaded = free_;
        kvcheck::yield("free_queue");
        const std::size_t free_before = free_.size();
        Pool::unref(block);
        if (free_.size() == free_before) return;  // still held: the queue is untouched
        free_ = loaded;
        free_.push_back(block);
    }
};

// TM2: a fork's reference increments race other clients' count updates:
// fork loads a block's count, yields, and stores it plus one; another
// client's alloc hitting the block, or free of a sequence sharing it, in
// between is lost (a count too low: the block freed while held; or too high).
class TM2 final : public Pool {
  public:
    using Pool::Pool;

  protected:
    void ref(BlockId block) override {
        const std::int64_t count = blocks_[static_cast<std::size_t>(block)].count;
        kvcheck::yield("fork_ref");
        blocks_[static_cast<std::size_t>(block)].count = count + 1;
    }
};

// The store family's thread mutants: the reference, its lock kept on every
// call, with one window (ReferenceEngine::unlocked_window) inside one
// section the lock kept whole: the lock let go, a yield, the lock taken
// back. Other clients' calls run whole in the window and nowhere else, so a
// stress run, whose threads run free, meets the bug only through it.

// TM3: an unlocked index update (copy-on-write, as a store that swaps in a
// new index map): an add loads the whole index, lets the lock go
// (`store_index`), and installs its copy with its item. Another client's
// add or delete in between is undone: an entry lost, or a deleted one back.
class TM3 final : public ReferenceEngine {
  protected:
    void store_add(const std::string& id, const kv::CachePtr& cache, const Metadata& metadata) override {
        const std::vector<kv::ItemPtr> loaded = store_.get_all();
        unlocked_window("store_index");
        std::vector<kv::NewItem> index;
        bool replaced = false;
        for (const kv::ItemPtr& item : loaded) {
            const bool mine = item->id == id;
            replaced = replaced || mine;
            index.push_back(mine ? kv::NewItem{id, windowed(cache), metadata}
                                 : kv::NewItem{item->id, std::const_pointer_cast<kv::Cache>(item->cache), item->metadata});
        }
        if (!replaced) index.push_back({id, windowed(cache), metadata});
        store_.remove_all();
        store_.add(index);
    }
};

// TM4: a dump torn by a concurrent add: the dump lists the ids, then takes
// each entry in turn, letting the lock go (`dump_entry`) before each;
// other clients' adds and deletes in between land in the middle of it, so it may hold an
// entry from before one add and another from after a later one: a store
// that never existed.
class TM4 final : public ReferenceEngine {
  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        std::vector<std::string> ids;
        for (const kv::ItemPtr& item : store_.get_all()) ids.push_back(item->id);
        kv::Store taken;
        for (const std::string& id : ids) {
            unlocked_window("dump_entry");
            const kv::ItemPtr item = store_.get(id);
            if (item) taken.add({{id, std::const_pointer_cast<kv::Cache>(item->cache), item->metadata}});
        }
        taken.dump(dir, fs);
    }
};

// TM5: an LRU list updated without its lock, in a store of
// tm5_capacity_items entries (lru): an add reads the list (least recently
// used first), lets the lock go (`store_lru`), stores its entry, and
// evicts by the list it read. Another client's use in between is not seen (the entry it
// just used is evicted), nor its add's eviction: the same entry is
// evicted twice, and the store is left past its capacity (one never evicted).
constexpr std::size_t tm5_capacity_items = 2;

class TM5 final : public ReferenceEngine {
  public:
    TM5() { set_capacity(tm5_capacity_items); }

  protected:
    void store_add(const std::string& id, const kv::CachePtr& cache, const Metadata& metadata) override {
        const std::vector<std::string> loaded = store_.recency();
        unlocked_window("store_lru");
        const bool fresh = std::find(loaded.begin(), loaded.end(), id) == loaded.end();
        std::size_t evicting = fresh && loaded.size() >= tm5_capacity_items ? loaded.size() + 1 - tm5_capacity_items : 0;
        store_.set_capacity(0);  // the store's own eviction off: this add evicts by the list it read
        ReferenceEngine::store_add(id, cache, metadata);
        store_.set_capacity(tm5_capacity_items);
        for (auto victim = loaded.begin(); victim != loaded.end() && evicting > 0; ++victim, --evicting) {
            store_.remove({*victim});
        }
    }
};

using P = Property;

}  // namespace

std::vector<Adapter> thread_mutant_adapters() {
    std::vector<Adapter> mutants = {
        lane_mutant<Unlocked>("TM1", "an unlocked free-queue update: a release stores back the free queue it loaded before a yield",
                              {P::free_iff_unreferenced}, pool_of<TM1>()),
        lane_mutant<Unlocked>("TM2", "a fork's reference increment (load, yield, store) races other clients' count updates",
                              {P::refcount_exact, P::free_iff_unreferenced}, pool_of<TM2>()),
        lane_mutant<TM3>("TM3", "an unlocked store index update: an add installs a copy of the index it loaded before a yield",
                         {P::linearizable}),
        lane_mutant<TM4>("TM4", "a dump torn by concurrent adds: it takes each entry in turn, yielding between them",
                         {P::linearizable}),
        lane_mutant<TM5>("TM5", "an unlocked LRU list in a store of 2 entries: an add evicts by the recency list it read before a yield",
                         {P::linearizable}),
    };
    for (Adapter& mutant : mutants) mutant.threads = true;
    return mutants;
}

std::vector<Adapter> lane_mutant_adapters() {
    return {
        lane_mutant<PagedReference>("LM1", "lookup-then-pin without re-validation: an alloc pins the blocks its request's lookup hit",
                                    {P::prefix_hit_exact, P::hit_consumed, P::lookup_exact}, pool_of<LM1>()),
        lane_mutant<LM2>("LM2", "a handed-out copy is taken again from its entry, overwritten since, at its first generation",
                         {P::single_copy, P::generation_equivalent, P::linearizable}),
        lane_mutant<PagedReference>("LM3", "a split load/store count: an alloc stores the counts its request's lookup loaded, plus one",
                                    {P::refcount_exact}, pool_of<LM3>()),
        lane_mutant<LM4>("LM4", "a copy get_cache hands out is freed with its entry until first used; the next add reuses it",
                         {P::stored_immutable, P::generation_equivalent, P::linearizable}),
    };
}

}  // namespace kvcheck::adapters
