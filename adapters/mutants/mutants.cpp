// The mutants: each is the reference with one known bug planted
// (docs/semantics.md#known-bugs), one style for all: a ReferenceEngine
// subclass that overrides one of its seams, or hands it a Copier whose
// clone or concat strategy is the bug. Kept small on purpose: the diff from
// the reference is the bug. Their names, descriptions and the properties
// each breaks are in one table, adapters/bundled.cpp.
#include "mutants/mutants.h"

#include "reference/cache_views.h"
#include "reference/reference_engine.h"

#include "kv/window.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <unistd.h>

namespace kvcheck::adapters {
namespace {

using kv::Cache;
using kv::CachePtr;
using kv::ConstCachePtr;

// A Copier whose clone strategy is given per mutant.
class MutantCopier final : public kv::Copier {
  public:
    using CloneFn = std::function<CachePtr(const Cache&)>;
    using ConcatFn = std::function<CachePtr(const std::vector<ConstCachePtr>&)>;
    MutantCopier(CloneFn clone, ConcatFn concat) : clone_(std::move(clone)), concat_(std::move(concat)) {}

  protected:
    CachePtr clone_strategy(const Cache& source) override { return clone_ ? clone_(source) : kv::clone(source); }
    CachePtr concat_strategy(const std::vector<ConstCachePtr>& parts) override {
        return concat_ ? concat_(parts) : kv::concat(parts);
    }

  private:
    CloneFn clone_;
    ConcatFn concat_;
};

// A modern clone built layer by layer with `copy_layer`.
CachePtr clone_layers(const Cache& source, const std::function<kv::Layer(const kv::Layer&)>& copy_layer) {
    if (source.layout() == kv::Layout::legacy) return kv::clone(source);
    auto layers = std::make_shared<kv::LayerList>();
    for (const kv::LayerPtr& layer : *source.layers()) layers->push_back(std::make_shared<kv::Layer>(copy_layer(*layer)));
    return Cache::from_layers(std::move(layers));
}

at::Tensor copy_of(const at::Tensor& t) { return t.defined() ? t.clone() : at::Tensor(); }

// A layer with every slot copied, as the reference clone makes it.
kv::Layer copied(const kv::Layer& layer) {
    kv::Layer twin;
    twin.keys = copy_of(layer.keys);
    twin.values = copy_of(layer.values);
    twin.key_cache = copy_of(layer.key_cache);
    twin.value_cache = copy_of(layer.value_cache);
    twin.is_initialized = layer.is_initialized;
    return twin;
}

// M1: generate hands the incoming cache to the model without cloning.
class M1 final : public ReferenceEngine {
  protected:
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream,
                                             kv::GenerationStats& stats) override {
        const CachePtr working = past ? std::const_pointer_cast<Cache>(past) : Cache::make(kv::Layout::modern);
        std::vector<std::int64_t> tokens;
        kv::run_model(model_, prompt, *working, max_new_tokens,
                      [&tokens](std::int64_t token) { tokens.push_back(token); }, &stats);
        return tokens;
    }
};

// M2: get_cache with one id returns the stored object (marked owned, as the
// copy path marks whatever it returns).
class M2 final : public ReferenceEngine {
  protected:
    CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        std::vector<ConstCachePtr> kept;
        for (const std::string& id : ids) {
            const kv::ItemPtr item = store_.get(id);
            if (item && kv::holds_tokens(*item->cache)) kept.push_back(item->cache);
        }
        if (kept.size() != 1) return ReferenceEngine::store_get_cache(ids);
        CachePtr same = std::const_pointer_cast<Cache>(kept.front());
        same->set_owned(true);
        return same;
    }
};

// M3: generate clones even an owned copy (the double copy).
class M3 final : public ReferenceEngine {
  protected:
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream,
                                             kv::GenerationStats& stats) override {
        ConstCachePtr again = past && past->owned() ? copier_->clone(*past, kv::CopyReason::generate) : past;
        return ReferenceEngine::run_generation(again, prompt, max_new_tokens, stream, stats);
    }
};

// M8: storing an owned copy keeps its marker.
class M8 final : public ReferenceEngine {
  protected:
    void store_add(const std::string& id, const CachePtr& cache, const Metadata& metadata) override {
        const bool owned = cache->owned();
        ReferenceEngine::store_add(id, cache, metadata);
        cache->set_owned(owned);
    }
};

// M10: dump writes the final file in place (no temporary, no rename).
class M10 final : public ReferenceEngine {
  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        fs.make_dirs(dir);
        fs.write_file(dir + "/" + kv::dump_file_name, kv::encode_dump(store_.get_all()));
    }
};

// The dump's file system with one of its two flushes skipped.
class UnflushedFiles final : public kv::PosixFileSystem {
  protected:
    void flush_file(int, const std::string&) override {}
};

class UnflushedDirectory final : public kv::PosixFileSystem {
  protected:
    void flush_directory(const std::string&) override {}
};

// M25 (ours): the dump never fsyncs its file: the rename can reach the
// disk before the bytes it names, and a power cut leaves an empty dump.
class M25 final : public ReferenceEngine {
  protected:
    kv::FileSystem& file_system() override { return files_; }

  private:
    UnflushedFiles files_;
};

// M26 (ours): the dump never fsyncs the directory after its rename: dump
// returns, and a power cut can still undo the rename.
class M26 final : public ReferenceEngine {
  protected:
    kv::FileSystem& file_system() override { return files_; }

  private:
    UnflushedDirectory files_;
};

// M27 (ours; issue 42's rule: a leftover is a finding where it changes
// what a load returns): a load that finds a dump's temporary file takes
// it for the newest dump and moves it into place first, so a killed
// dump's partial temporary replaces the complete dump before it.
class M27 final : public ReferenceEngine {
  public:
    LoadResult load(const std::string& dir) override {
        kv::FileSystem& fs = file_system();
        const std::string prefix = std::string(kv::dump_file_name) + kv::dump_temporary_suffix;
        try {
            for (const std::string& name : fs.list(dir)) {
                if (name.rfind(prefix, 0) == 0) fs.rename(dir + "/" + name, dir + "/" + kv::dump_file_name);
            }
        } catch (const kv::IoError&) {
            // No directory: the load says so.
        }
        return ReferenceEngine::load(dir);
    }
};

// M11 (ours): the generation boundary's copy drops the last token of every
// layer, an off-by-one of a sliding-window trim. Only the generated tokens
// show it: the store, the copy count and the layouts are all correct.
class M11 final : public ReferenceEngine {
  protected:
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream,
                                             kv::GenerationStats& stats) override {
        const CachePtr working = kv::own_for_generation(past, *copier_);
        trim_last_token(*working);
        std::vector<std::int64_t> tokens;
        kv::run_model(model_, prompt, *working, max_new_tokens,
                      [&tokens](std::int64_t token) { tokens.push_back(token); }, &stats);
        return tokens;
    }

  private:
    static at::Tensor trimmed(const at::Tensor& t) {
        if (!t.defined() || t.dim() != 4 || t.size(2) == 0) return t;
        return t.narrow(2, 0, t.size(2) - 1);
    }
    static void trim_last_token(Cache& cache) {
        if (cache.layout() == kv::Layout::legacy) {
            for (at::Tensor& t : *cache.key_cache()) t = trimmed(t);
            for (at::Tensor& t : *cache.value_cache()) t = trimmed(t);
            return;
        }
        for (const kv::LayerPtr& layer : *cache.layers()) {
            layer->keys = trimmed(layer->keys);
            layer->values = trimmed(layer->values);
        }
    }
};

// M12 (ours): get_all lists the ids sorted, not in insertion order (a store
// kept in an ordered map). Breaks only the plain store contract.
class M12 final : public ReferenceEngine {
  public:
    std::vector<std::string> get_all_ids() override {
        std::vector<std::string> ids = ReferenceEngine::get_all_ids();
        std::sort(ids.begin(), ids.end());
        return ids;
    }
};

// M17 (ours): releasing what get handed out frees it as if it were owned:
// the buffers go back for reuse, zeroed, and they are the stored item's.
class M17 final : public ReferenceEngine {
  public:
    void release(Handle h) override {
        const ConstCachePtr cache = handle(h);
        bool stored = false;
        for (const kv::ItemPtr& item : store_.get_all()) stored = stored || item->cache == cache;
        if (cache && stored) wipe(*std::const_pointer_cast<Cache>(cache));
        ReferenceEngine::release(h);
    }

  private:
    static void wipe(Cache& cache) {
        const auto zero = [](at::Tensor& t) {
            if (t.defined()) t.zero_();
        };
        if (cache.layout() == kv::Layout::legacy) {
            for (at::Tensor& t : *cache.key_cache()) zero(t);
            for (at::Tensor& t : *cache.value_cache()) zero(t);
            return;
        }
        for (const kv::LayerPtr& layer : *cache.layers()) {
            zero(layer->keys);
            zero(layer->values);
            zero(layer->key_cache);
            zero(layer->value_cache);
        }
    }
};

// M18 (ours): the store keeps an append-only index of ids: a deleted id
// that is added again takes back its old place in the insertion order.
class M18 final : public ReferenceEngine {
  public:
    std::vector<std::string> get_all_ids() override { return in_first_order(ReferenceEngine::get_all_ids()); }
    std::vector<std::string> stored_ids() override { return in_first_order(ReferenceEngine::stored_ids()); }

  protected:
    void store_add(const std::string& id, const CachePtr& cache, const Metadata& metadata) override {
        if (std::find(first_seen_.begin(), first_seen_.end(), id) == first_seen_.end()) first_seen_.push_back(id);
        ReferenceEngine::store_add(id, cache, metadata);
    }

  private:
    std::vector<std::string> in_first_order(std::vector<std::string> ids) const {
        const auto rank = [this](const std::string& id) {
            return std::find(first_seen_.begin(), first_seen_.end(), id) - first_seen_.begin();
        };
        std::stable_sort(ids.begin(), ids.end(), [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
        return ids;
    }
    std::vector<std::string> first_seen_;
};

// M19 (ours): dump writes the caches but not the items' metadata.
class M19 final : public ReferenceEngine {
  protected:
    void store_dump(const std::string& dir, kv::FileSystem& fs) override {
        kv::Store bare(copier_);
        std::vector<kv::NewItem> items;
        for (const kv::ItemPtr& item : store_.get_all()) items.push_back({item->id, std::const_pointer_cast<Cache>(item->cache), {}});
        bare.add(items);
        bare.dump(dir, fs);
    }
};

// M20 (ours): from_legacy builds the modern layers around the legacy
// tensors themselves: no copy, so the result aliases its source.
class M20 final : public ReferenceEngine {
  protected:
    CachePtr convert_from_legacy(const Cache& cache) override {
        auto layers = std::make_shared<kv::LayerList>();
        for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
            auto layer = std::make_shared<kv::Layer>();
            layer->keys = (*cache.key_cache())[i];
            layer->values = (*cache.value_cache())[i];
            layer->is_initialized = true;
            layers->push_back(std::move(layer));
        }
        return Cache::from_layers(std::move(layers));
    }
};

// M21 (ours): get_cache of one id hands out the same copy again while the
// entry is unchanged (a memo of copies), logging a copy each time: two
// owned copies then share their storage, and a copy changed through the
// first handle (a generation appends to it) is handed out as the entry.
class M21 final : public ReferenceEngine {
  protected:
    CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        CachePtr copy = ReferenceEngine::store_get_cache(ids);
        if (ids.size() != 1 || !copy) return copy;
        const kv::ItemPtr item = store_.get(ids.front());
        if (memo_item_ == item && memo_) return memo_;
        memo_item_ = item;
        memo_ = copy;
        return copy;
    }

  private:
    kv::ItemPtr memo_item_;
    CachePtr memo_;
};

// M22 (ours): the store deduplicates: a cache equal to one it holds is
// stored as that very object, so two entries share their storage.
class M22 final : public ReferenceEngine {
  protected:
    void store_add(const std::string& id, const CachePtr& cache, const Metadata& metadata) override {
        const std::uint64_t digest = digest_of(*cache);
        for (const kv::ItemPtr& item : store_.get_all()) {
            if (item->id != id && digest_of(*item->cache) == digest) {
                ReferenceEngine::store_add(id, std::const_pointer_cast<Cache>(item->cache), metadata);
                return;
            }
        }
        ReferenceEngine::store_add(id, cache, metadata);
    }
};

// M23 (ours): clone copies twice (a defensive copy, then the copy kept).
class M23 final : public ReferenceEngine {
  public:
    void clone(Handle source, Handle out) override {
        ReferenceEngine::clone(source, out);
        ReferenceEngine::clone(source, out);
    }
};

// M24 (ours): the boundary's live-set report counts the cache the model
// writes into and nothing else.
class M24 final : public ReferenceEngine {
  protected:
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream,
                                             kv::GenerationStats& stats) override {
        std::vector<std::int64_t> tokens = ReferenceEngine::run_generation(past, prompt, max_new_tokens, stream, stats);
        stats.peak_live_sets = 1;
        return tokens;
    }
};

// M28 (ours): get_cache of one id keeps the copy it hands out as the
// stored item (a refresh on read that swaps the fresh copy in): storing
// it clears its marker, and what the caller holds is the stored object.
class M28 final : public ReferenceEngine {
  protected:
    CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        CachePtr copy = ReferenceEngine::store_get_cache(ids);
        if (ids.size() != 1 || !copy) return copy;
        const kv::ItemPtr item = store_.get(ids.front());
        store_add(ids.front(), copy, item->metadata);
        return copy;
    }
};

// M29 (ours): get_cache of ids that hold no tokens hands out a new cache
// object around the first one's stored lists (an "empty" result that is a
// view of the store, not a new cache).
class M29 final : public ReferenceEngine {
  protected:
    CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        CachePtr found = ReferenceEngine::store_get_cache(ids);
        if (found) return found;
        for (const std::string& id : ids) {
            const kv::ItemPtr item = store_.get(id);
            if (!item) continue;
            const Cache& stored = *item->cache;
            if (stored.layout() == kv::Layout::legacy) return Cache::from_slots(stored.key_cache(), stored.value_cache());
            return Cache::from_layers(stored.layers());
        }
        return nullptr;
    }
};

// M30 (ours): the cache a turn returns lost its last token: every slot
// cut by one at the end (an off-by-one in handing back past_key_values).
class M30 final : public ReferenceEngine {
  public:
    GenerateResult generate_returning(Handle h, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                                      Handle out) override {
        GenerateResult result = ReferenceEngine::generate_returning(h, prompt, max_new_tokens, out);
        const CachePtr returned = std::const_pointer_cast<Cache>(handle(out));
        const auto cut = [](at::Tensor& t) {
            if (t.defined() && t.dim() == 4 && t.size(2) > 0) t = t.narrow(2, 0, t.size(2) - 1);
        };
        if (returned->layout() == kv::Layout::modern) {
            for (const kv::LayerPtr& layer : *returned->layers()) {
                for (at::Tensor* slot : {&layer->keys, &layer->values, &layer->key_cache, &layer->value_cache}) cut(*slot);
            }
        } else {
            for (at::Tensor& slot : *returned->key_cache()) cut(slot);
            for (at::Tensor& slot : *returned->value_cache()) cut(slot);
        }
        return result;
    }
};

// M31 (ours): a chat session keeps the cache its turn returned as its
// own: the next generation from it continues in it, even once the caller
// has stored it (the store cleared its marker, the session never looks).
class M31 final : public ReferenceEngine {
  public:
    GenerateResult generate_returning(Handle h, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                                      Handle out) override {
        GenerateResult result = ReferenceEngine::generate_returning(h, prompt, max_new_tokens, out);
        sessions_.push_back(handle(out));
        return result;
    }

  protected:
    CachePtr working_cache(const ConstCachePtr& past) override {
        for (const std::weak_ptr<const Cache>& session : sessions_) {
            if (past && session.lock() == past) return std::const_pointer_cast<Cache>(past);
        }
        return ReferenceEngine::working_cache(past);
    }
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool, kv::GenerationStats& stats) override {
        const CachePtr working = working_cache(past);
        std::vector<std::int64_t> tokens;
        run_on(*working, prompt, max_new_tokens, tokens, stats);
        return tokens;
    }

  private:
    std::vector<std::weak_ptr<const Cache>> sessions_;
};

// M32 (ours): extract stores the model's working cache and keeps it as
// the session's: the next generation from no cache continues in it,
// writing into the stored memory.
class M32 final : public ReferenceEngine {
  protected:
    CachePtr extracted(const std::vector<std::int64_t>& prompt) override {
        session_ = ReferenceEngine::extracted(prompt);
        return session_;
    }
    std::vector<std::int64_t> run_generation(const ConstCachePtr& past, const std::vector<std::int64_t>& prompt,
                                             std::int64_t max_new_tokens, bool stream, kv::GenerationStats& stats) override {
        if (past || !session_) return ReferenceEngine::run_generation(past, prompt, max_new_tokens, stream, stats);
        std::vector<std::int64_t> tokens;
        run_on(*session_, prompt, max_new_tokens, tokens, stats);
        return tokens;
    }

  private:
    CachePtr session_;
};

// M33 (ours): the store bounds its size at 48 items and silently evicts
// the oldest to make room (an LRU cap nobody asked for).
class M33 final : public ReferenceEngine {
  protected:
    void store_add(const std::string& id, const CachePtr& cache, const Metadata& metadata) override {
        ReferenceEngine::store_add(id, cache, metadata);
        std::vector<kv::ItemPtr> items = store_.get_all();
        if (items.size() > capacity) remove({items.front()->id});
    }

  private:
    static constexpr std::size_t capacity = 48;
};

// M34 (ours, issue 42): an LRU store of 4 items that, full, evicts the most
// recently used entry instead of the least (a comparator turned round).
// It declares lru eviction: the entries it keeps are intact, the choice is
// the bug.
class M34 final : public ReferenceEngine {
  public:
    M34() { set_capacity(capacity); }

  protected:
    void store_add(const std::string& id, const CachePtr& cache, const Metadata& metadata) override {
        if (store_.get(id) == nullptr && store_.size() >= capacity) remove({store_.recency().back()});
        ReferenceEngine::store_add(id, cache, metadata);
    }

  private:
    static constexpr std::size_t capacity = 4;
};

// M35 (ours, issue 40): trim keeps one token too many (an off-by-one in
// crop's bound, `[..., :keep + 1, :]`).
class M35 final : public ReferenceEngine {
  public:
    void trim(Handle h, std::int64_t keep) override { ReferenceEngine::trim(h, keep + 1); }
};

// M36 (ours, issue 40): trimming a copy get_cache made of one entry cuts
// the entry too (a prompt cache that trims the cached prefix it handed a
// copy of, instead of the copy alone).
class M36 final : public ReferenceEngine {
  public:
    void get_cache(const std::vector<std::string>& ids, Handle out) override {
        ReferenceEngine::get_cache(ids, out);
        copied_from_.erase(out);
        if (ids.size() == 1) copied_from_[out] = ids.front();
    }
    void trim(Handle h, std::int64_t keep) override {
        ReferenceEngine::trim(h, keep);
        const auto from = copied_from_.find(h);
        if (from == copied_from_.end() || store_.get(from->second) == nullptr) return;
        kv::crop(*std::const_pointer_cast<Cache>(stored(from->second)), keep);
    }

  private:
    std::map<Handle, std::string> copied_from_;
};

// M37 (ours, issue 40): a store of 4 items that declares lrs (the least
// recently stored goes first: an overwrite moves an entry to the back) but,
// full, evicts the first inserted: an overwrite keeps its place, as a FIFO
// keyed by first insertion does (mlx-lm's LRUPromptCache with an
// overwrite that forgot to move its key in the LRU).
class M37 final : public ReferenceEngine {
  public:
    M37() { set_capacity(capacity, Eviction::lrs); }

  protected:
    void store_add(const std::string& id, const CachePtr& cache, const Metadata& metadata) override {
        if (store_.get(id) == nullptr && store_.size() >= capacity) remove({store_.get_all().front()->id});
        ReferenceEngine::store_add(id, cache, metadata);
    }

  private:
    static constexpr std::size_t capacity = 4;
};

// M38 (ours, issue 40): delete frees an entry under a live read lease
// (LMCache's L1Manager.delete with force=True, or a store that never asks
// is_key_evictable: the reader's memory object is freed under it).
class M38 final : public ReferenceEngine {
  public:
    M38() { enable_bundled_leases(); }

  protected:
    bool lease_live(const std::string& id, LeaseUse use) const override {
        return use != LeaseUse::remove && ReferenceEngine::lease_live(id, use);
    }
};

// M39 (ours, issue 40): a lease expires a tick late: it still holds an
// entry at exactly its expiry (`now <= until` for `now < until`), so a
// delete at t + TTL is refused.
class M39 final : public ReferenceEngine {
  public:
    M39() { enable_bundled_leases(); }

  protected:
    bool lease_live(const std::string& id, LeaseUse) const override {
        const kv::Leases::Lease lease = leases_.lease(id);
        return lease.count > 0 && leases_.now_ms() <= lease.until_ms;
    }
};

// M44 (ours, issue 40): a bounded store evicts an entry under a live read
// lease (reference-leases: 3 entries, lru): its eviction never asks
// whether the least recently used entry is leased (LMCache's eviction
// policy called without its is_key_evictable filter), so a reader's entry
// goes while it is read, and a full store of leased entries evicts one
// instead of refusing the add.
class M44 final : public ReferenceEngine {
  public:
    M44() { enable_bundled_leases(); }

  protected:
    bool lease_live(const std::string& id, LeaseUse use) const override {
        return use != LeaseUse::evict && ReferenceEngine::lease_live(id, use);
    }
};

// M40 (ours, issue 40): a windowed store (the reference over a model of
// window 4, as reference-window) that keeps the last 5 tokens of what it
// stores: one past its window, as a rotating buffer whose size forgot the
// slot the next token is written into (docs/semantics.md#store-windows).
// No later token reads the extra one: generation is unchanged.
class M40 final : public ReferenceEngine {
  public:
    M40() { set_window(reference_window); }

  protected:
    void store_add(const std::string& id, const CachePtr& cache, const Metadata& metadata) override {
        kv::keep_window(*cache, window() + 1);
        store_.add({{id, cache, metadata}});
    }
};

// M41 (ours, issue 40): the same windowed store, whose cut forgets the
// positions it moved on (Cache::dropped): a generation from what it stored
// numbers its tokens from the tokens held, as a rotating buffer whose
// offset counts its slots instead of the tokens it was fed.
class M41 final : public ReferenceEngine {
  public:
    M41() { set_window(reference_window); }

  protected:
    void store_add(const std::string& id, const CachePtr& cache, const Metadata& metadata) override {
        ReferenceEngine::store_add(id, cache, metadata);
        cache->set_dropped(0);
    }
};

// M46 (ours, issue 40): a quantized store (as reference-quantized) that
// declares the bfloat16 grid's content tolerance but keeps 3 mantissa bits:
// what it reads back is off by up to 2^-4 of a value, beyond the 2^-8 it
// declared (docs/semantics.md#content-tolerance). A tolerance-judged
// comparison must still catch it. It rounds everything it builds alike, so
// its generations agree with its fresh ones.
class M46 final : public ReferenceEngine {
  public:
    M46() { quantize(3); }
};

// A Copier whose batch strategy is the bug (docs/semantics.md#batches).
class BatchCopier final : public kv::Copier {
  public:
    using BatchFn = std::function<CachePtr(const std::vector<ConstCachePtr>&, const kv::BatchSteps&)>;
    explicit BatchCopier(BatchFn batch) : batch_(std::move(batch)) {}

  protected:
    CachePtr batch_strategy(const std::vector<ConstCachePtr>& rows, const kv::BatchSteps& steps) override {
        return batch_(rows, steps);
    }

  private:
    BatchFn batch_;
};

// M42 (ours, issue 40): a beam step's reorder moves the keys but not the
// values (reorder_cache's index_select applied to one side of the layer):
// the row handed out pairs one row's keys with another's values.
CachePtr batch_m42(const std::vector<ConstCachePtr>& rows, const kv::BatchSteps& steps) {
    kv::BatchSteps unordered = steps;
    unordered.reorder.clear();
    auto layers = std::make_shared<kv::LayerList>();
    for (std::size_t i = 0; i < rows.front()->layers()->size(); ++i) {
        std::vector<at::Tensor> keys;
        std::vector<at::Tensor> values;
        for (const ConstCachePtr& row : rows) {
            keys.push_back((*row->layers())[i]->keys);
            values.push_back((*row->layers())[i]->values);
        }
        auto layer = std::make_shared<kv::Layer>();
        layer->keys = kv::batch_slot(keys, steps);
        layer->values = kv::batch_slot(values, unordered);
        layer->is_initialized = true;
        layers->push_back(std::move(layer));
    }
    return Cache::from_layers(std::move(layers));
}

// M43 (ours, issue 40): a batch of one row, neither repeated nor
// reordered, is taken for the identity: the row handed out is new layer
// objects around the row's own tensors, so the two share storage.
CachePtr batch_m43(const std::vector<ConstCachePtr>& rows, const kv::BatchSteps& steps) {
    if (rows.size() != 1 || steps.repeat != 1 || !steps.reorder.empty()) return kv::batch_row(rows, steps);
    auto layers = std::make_shared<kv::LayerList>();
    for (const kv::LayerPtr& layer : *rows.front()->layers()) layers->push_back(std::make_shared<kv::Layer>(*layer));
    return Cache::from_layers(std::move(layers));
}

class M42 final : public ReferenceEngine {
  public:
    M42() : ReferenceEngine(std::make_shared<BatchCopier>(batch_m42)) {}
};

class M43 final : public ReferenceEngine {
  public:
    M43() : ReferenceEngine(std::make_shared<BatchCopier>(batch_m43)) {}
};

// A Copier whose clone (and concat) strategy is the bug.
std::shared_ptr<kv::Copier> copier_with(MutantCopier::CloneFn clone, MutantCopier::ConcatFn concat = nullptr) {
    return std::make_shared<MutantCopier>(std::move(clone), std::move(concat));
}

// M4: clone of an empty modern cache shares the layer list.
CachePtr clone_m4(const Cache& source) {
    if (source.layout() == kv::Layout::modern && source.layers()->empty()) return Cache::from_layers(source.layers());
    return kv::clone(source);
}

// M5: clone prefers the legacy slots when the modern ones exist: it builds
// the copy's keys/values from key_cache/value_cache, and carries the legacy
// slots over as they are (uncopied).
CachePtr clone_m5(const Cache& source) {
    return clone_layers(source, [](const kv::Layer& layer) {
        if (!layer.keys.defined() || !layer.key_cache.defined()) return copied(layer);
        kv::Layer twin = layer;  // the legacy slots come along uncopied
        twin.keys = copy_of(layer.key_cache);
        twin.values = copy_of(layer.value_cache.defined() ? layer.value_cache : layer.values);
        return twin;
    });
}

// M6: clone copies each layer's (key(), value()) as a pair: a one-sided
// layer cannot be copied so and is kept as it is (the source's own layer
// object), and a paired layer's legacy-named slots are dropped.
CachePtr clone_m6(const Cache& source) {
    if (source.layout() == kv::Layout::legacy) return kv::clone(source);
    auto layers = std::make_shared<kv::LayerList>();
    for (const kv::LayerPtr& layer : *source.layers()) {
        if (!layer->key().defined() || !layer->value().defined()) {
            layers->push_back(layer);
            continue;
        }
        auto twin = std::make_shared<kv::Layer>();
        twin->keys = copy_of(layer->key());
        twin->values = copy_of(layer->value());
        twin->is_initialized = layer->is_initialized;
        layers->push_back(std::move(twin));
    }
    return Cache::from_layers(std::move(layers));
}

// M7: merged layers are not marked initialized (their length reads 0).
CachePtr concat_m7(const std::vector<ConstCachePtr>& parts) {
    CachePtr merged = kv::concat(parts);
    if (merged->layout() == kv::Layout::modern) {
        for (const kv::LayerPtr& layer : *merged->layers()) layer->is_initialized = false;
    }
    return merged;
}

// M9: clone copies the layer objects but shares their tensors.
CachePtr clone_m9(const Cache& source) {
    if (source.layout() == kv::Layout::legacy) {
        return Cache::from_slots(std::make_shared<kv::TensorList>(*source.key_cache()),
                                 std::make_shared<kv::TensorList>(*source.value_cache()));
    }
    return clone_layers(source, [](const kv::Layer& layer) { return layer; });
}

// Rebinds every tensor `cache` holds to `change` of it.
void rebind_each_tensor(Cache& cache, const std::function<at::Tensor(const at::Tensor&)>& change) {
    const auto apply = [&](at::Tensor& t) {
        if (t.defined()) t = change(t);
    };
    if (cache.layout() == kv::Layout::legacy) {
        for (at::Tensor& t : *cache.key_cache()) apply(t);
        for (at::Tensor& t : *cache.value_cache()) apply(t);
        return;
    }
    for (const kv::LayerPtr& layer : *cache.layers()) {
        apply(layer->keys);
        apply(layer->values);
        apply(layer->key_cache);
        apply(layer->value_cache);
    }
}

// A clone whose every tensor is the reference clone's, passed through `copy_tensor`.
CachePtr clone_each_tensor(const Cache& source, const std::function<at::Tensor(const at::Tensor&)>& copy_tensor) {
    CachePtr copy = kv::clone(source);
    rebind_each_tensor(*copy, copy_tensor);
    return copy;
}

// M13: clone routes bfloat16 through float16 (a conversion kernel written
// for one half type, reused for the other): the copy keeps the bfloat16 tag
// but loses what float16 cannot hold (values below 2^-14 lose bits).
CachePtr clone_m13(const Cache& source) {
    return clone_each_tensor(source, [](const at::Tensor& t) {
        return t.scalar_type() == at::kBFloat16 ? t.to(at::kHalf).to(at::kBFloat16) : t;
    });
}

// M14: clone copies a slot of 64 tokens or more in chunks of 64 rows, and
// each chunk after the first starts one row early: row 63 is repeated, the
// rest shift by one and the last row is lost. The shape is right.
constexpr std::int64_t chunk_rows = 64;

CachePtr clone_m14(const Cache& source) {
    return clone_each_tensor(source, [](const at::Tensor& t) {
        if (t.dim() != 4 || t.size(2) < chunk_rows) return t;
        std::vector<at::Tensor> chunks;
        std::int64_t copied = 0;
        for (std::int64_t start = 0; copied < t.size(2); start += chunk_rows - 1) {
            const std::int64_t rows = std::min(chunk_rows, t.size(2) - copied);
            chunks.push_back(t.narrow(2, start, rows));
            copied += rows;
        }
        return at::cat(chunks, 2);
    });
}

// M15: clone hands out the slots of 256 tokens or more without copying them
// (a copy-avoiding path for large buffers): the copy shares their storage
// with its source.
constexpr std::int64_t shared_rows_min = 256;

CachePtr clone_m15(const Cache& source) {
    CachePtr copy = clone_each_tensor(source, [](const at::Tensor& t) { return t; });
    const auto share_large = [](at::Tensor& mine, const at::Tensor& theirs) {
        if (theirs.defined() && theirs.dim() == 4 && theirs.size(2) >= shared_rows_min) mine = theirs;
    };
    if (copy->layout() == kv::Layout::legacy) {
        for (std::size_t i = 0; i < copy->key_cache()->size(); ++i) {
            share_large((*copy->key_cache())[i], (*source.key_cache())[i]);
            share_large((*copy->value_cache())[i], (*source.value_cache())[i]);
        }
        return copy;
    }
    for (std::size_t i = 0; i < copy->layers()->size(); ++i) {
        kv::Layer& mine = *(*copy->layers())[i];
        const kv::Layer& theirs = *(*source.layers())[i];
        share_large(mine.keys, theirs.keys);
        share_large(mine.values, theirs.values);
        share_large(mine.key_cache, theirs.key_cache);
        share_large(mine.value_cache, theirs.value_cache);
    }
    return copy;
}

// M16: get_cache refuses to merge items of different dtypes, which the
// semantics allow, but only after it has cast the stored items in place to
// the first one's dtype (normalizing before checking).
class M16 final : public ReferenceEngine {
  protected:
    CachePtr store_get_cache(const std::vector<std::string>& ids) override {
        std::vector<kv::ItemPtr> kept;
        for (const std::string& id : ids) {
            const kv::ItemPtr item = store_.get(id);
            if (item && kv::holds_tokens(*item->cache)) kept.push_back(item);
        }
        if (kept.empty()) return ReferenceEngine::store_get_cache(ids);
        const at::ScalarType first = dtype_of(*kept.front()->cache);
        const bool mixed = std::any_of(kept.begin(), kept.end(), [first](const kv::ItemPtr& item) {
            return dtype_of(*item->cache) != first;
        });
        if (!mixed) return ReferenceEngine::store_get_cache(ids);
        for (const kv::ItemPtr& item : kept) {
            rebind_each_tensor(*std::const_pointer_cast<Cache>(item->cache), [first](const at::Tensor& t) { return t.to(first); });
        }
        throw std::invalid_argument("get_cache: items of different dtypes are not merged");
    }

  private:
    // The dtype of the first tensor the cache holds: the one the promotion counts.
    static at::ScalarType dtype_of(const Cache& cache) {
        std::vector<at::Tensor> tensors;
        if (cache.layout() == kv::Layout::legacy) {
            tensors = *cache.key_cache();
        } else {
            for (const kv::LayerPtr& layer : *cache.layers()) {
                tensors.insert(tensors.end(), {layer->keys, layer->values, layer->key_cache, layer->value_cache});
            }
        }
        for (const at::Tensor& t : tensors) {
            if (t.defined()) return t.scalar_type();
        }
        return at::kFloat;
    }
};

class M4 final : public ReferenceEngine {
  public:
    M4() : ReferenceEngine(copier_with(clone_m4)) {}
};

class M5 final : public ReferenceEngine {
  public:
    M5() : ReferenceEngine(copier_with(clone_m5)) {}
};

class M6 final : public ReferenceEngine {
  public:
    M6() : ReferenceEngine(copier_with(clone_m6)) {}
};

class M7 final : public ReferenceEngine {
  public:
    M7() : ReferenceEngine(copier_with(nullptr, concat_m7)) {}
};

class M9 final : public ReferenceEngine {
  public:
    M9() : ReferenceEngine(copier_with(clone_m9)) {}
};

class M13 final : public ReferenceEngine {
  public:
    M13() : ReferenceEngine(copier_with(clone_m13)) {}
};

class M14 final : public ReferenceEngine {
  public:
    M14() : ReferenceEngine(copier_with(clone_m14)) {}
};

class M15 final : public ReferenceEngine {
  public:
    M15() : ReferenceEngine(copier_with(clone_m15)) {}
};

// A bundled adapter of mutant M under `name`.
template <typename M>
Adapter mutant(const std::string& name, std::string description, std::vector<Property> breaks) {
    return {name, std::move(description), "bundled", std::move(breaks), [name] {
                auto engine = std::make_shared<M>();
                engine->rename(name);
                return std::shared_ptr<Engine>(std::move(engine));
            }};
}

using P = Property;

}  // namespace

std::vector<Adapter> mutant_adapters() {
    return {
        mutant<M1>("M1", "generate hands the incoming cache to the model without cloning", {P::stored_immutable, P::single_copy}),
        mutant<M2>("M2", "get_cache with one id returns the stored object",
                   {P::stored_immutable, P::owned_marker, P::single_copy}),
        mutant<M3>("M3", "generate clones even an owned copy (double copy)", {P::single_copy}),
        mutant<M4>("M4", "clone of an empty modern cache shares the layer list",
                   {P::clone_independent, P::stored_immutable, P::single_copy, P::owned_marker, P::generation_equivalent}),
        mutant<M5>("M5", "clone prefers the legacy slots when the modern ones exist",
                   {P::layout_roundtrip, P::clone_independent, P::generation_equivalent, P::stored_immutable,
                    P::owned_marker}),
        mutant<M6>("M6", "clone copies K and V as a pair and drops a one-sided layer",
                   {P::clone_independent, P::layout_roundtrip, P::stored_immutable, P::owned_marker, P::single_copy,
                    P::generation_equivalent}),
        mutant<M7>("M7", "merged layers are not marked initialized", {P::merge_correct, P::generation_equivalent}),
        mutant<M8>("M8", "storing an owned copy keeps its marker", {P::owned_marker, P::stored_immutable}),
        mutant<M9>("M9", "clone copies layer objects but shares their tensors",
                   {P::clone_independent, P::stored_immutable, P::owned_marker}),
        mutant<M10>("M10", "dump writes in place (no temporary file and rename)", {P::dump_safe}),
        mutant<M11>("M11", "the boundary copy drops the last cached token", {P::generation_equivalent}),
        mutant<M12>("M12", "get_all lists ids sorted instead of in insertion order", {P::store_contract}),
        mutant<M13>("M13", "clone routes bfloat16 through float16 (keeps the tag, loses bits)",
                    {P::layout_roundtrip, P::generation_equivalent}),
        mutant<M14>("M14", "clone copies slots of 64 tokens or more in chunks that overlap by a row",
                    {P::layout_roundtrip, P::generation_equivalent}),
        mutant<M15>("M15", "clone shares slots of 256 tokens or more with its source instead of copying them",
                    {P::clone_independent, P::stored_immutable, P::owned_marker}),
        mutant<M16>("M16", "get_cache refuses items of different dtypes, after casting them in place", {P::stored_immutable}),
        mutant<M17>("M17", "releasing what get handed out zeroes the stored item (a borrow freed as owned)",
                    {P::stored_immutable}),
        mutant<M18>("M18", "a re-added id takes back its old place in the insertion order", {P::store_contract}),
        mutant<M19>("M19", "dump leaves out the items' metadata", {P::dump_safe}),
        mutant<M20>("M20", "from_legacy aliases the legacy tensors instead of copying them",
                    {P::clone_independent, P::single_copy}),
        mutant<M21>("M21", "get_cache of one id hands out the same copy again (a memo)",
                    {P::layout_roundtrip, P::owned_marker}),
        mutant<M22>("M22", "the store stores an equal cache as the one it holds (dedup)", {P::stored_immutable}),
        mutant<M23>("M23", "clone copies twice", {P::single_copy}),
        mutant<M24>("M24", "generation reports only the working K/V set alive", {P::single_copy}),
        mutant<M25>("M25", "dump never fsyncs its file before the rename", {P::dump_safe}),
        mutant<M26>("M26", "dump never fsyncs the directory after the rename", {P::dump_safe}),
        mutant<M27>("M27", "a load takes a killed dump's temporary file for the newest dump", {P::dump_safe}),
        mutant<M28>("M28", "get_cache of one id keeps the copy it hands out as the stored item",
                    {P::owned_marker, P::stored_immutable, P::single_copy}),
        mutant<M29>("M29", "get_cache of ids holding no tokens hands out a cache around the stored lists",
                    {P::stored_immutable, P::store_contract}),
        mutant<M30>("M30", "the cache a turn returns lost its last token", {P::generation_equivalent}),
        mutant<M31>("M31", "a stored returned cache stays the session's: the next turn from it writes into the store",
                    {P::stored_immutable, P::single_copy}),
        mutant<M32>("M32", "extract keeps the model's working cache: the next generation from none writes into the memory",
                    {P::stored_immutable, P::generation_equivalent}),
        mutant<M33>("M33", "the store keeps at most 48 items and silently evicts the oldest",
                    {P::stored_immutable, P::store_contract}),
        mutant<M34>("M34", "an LRU store of 4 items evicts the most recently used entry, not the least",
                    {P::eviction_as_declared}),
        mutant<M35>("M35", "trim keeps one token too many", {P::trim_exact}),
        mutant<M36>("M36", "trimming a get_cache copy of one entry cuts the stored entry too", {P::stored_immutable}),
        mutant<M37>("M37", "a store of 4 items declaring lrs evicts the first inserted: an overwrite keeps its place",
                    {P::eviction_as_declared}),
        mutant<M38>("M38", "delete frees an entry under a live read lease", {P::lease_respected}),
        mutant<M39>("M39", "a read lease expires a tick late: a delete at its expiry is refused", {P::lease_respected}),
        mutant<M40>("M40", "a store of window 4 keeps the last 5 tokens of what it stores", {P::stored_immutable}),
        mutant<M41>("M41", "a store of window 4 forgets the positions its cut moved on", {P::generation_equivalent}),
        mutant<M42>("M42", "a batch's reorder moves the keys but not the values", {P::batch_exact}),
        mutant<M43>("M43", "a batch of one row, not repeated or reordered, hands out the row's own tensors",
                    {P::clone_independent}),
        mutant<M44>("M44", "a bounded store evicts an entry under a live read lease", {P::eviction_as_declared}),
        mutant<M46>("M46", "a quantized store declaring the bfloat16 grid's tolerance keeps only 3 mantissa bits",
                    {P::stored_immutable}),
    };
}

}  // namespace kvcheck::adapters
