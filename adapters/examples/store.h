// The vector engine's activation-memory store, its copier and its
// generation boundary.
//
// Ownership: the store holds each item's cache object and hands out the
// object itself for reading (get). Nothing it hands out reaches a model
// without going through `generate`, which copies any cache that is not an
// owned copy. `get_cache` hands out owned copies made by the Copier, so a
// model may write into them. Storing a cache clears its owned marker: it
// becomes stored, and the boundary will copy it.
//
//   Copier copier(Depth::deep);
//   Store store(copier);
//   store.add("a", cache);
//   CachePtr copy = store.get_cache({"a"});                    // owned, one copy logged
//   generate(model, copier, copy, {5}, 4, sink, stats);        // no further copy
#pragma once

#include "cache.h"
#include "dump_format.h"
#include "model.h"

#include <map>
#include <string>
#include <vector>

namespace vector_engine {

// One deliberate K/V copy.
struct CopyEvent {
    std::string reason;  // "get_cache", "merge", "generate", "clone", "concat", "from_legacy"
    std::int64_t bytes = 0;
};

// Every copy of K/V goes through a Copier, which logs it and records the
// copy's lineage (so the K/V sets alive along a generation can be counted).
class Copier {
  public:
    explicit Copier(Depth depth) : depth_(depth) {}

    CachePtr clone(const Cache& source, const std::string& reason);                   // owned
    CachePtr concat(const std::vector<ConstCachePtr>& parts, const std::string& reason);  // owned
    // A conversion that copies: not an owned copy (a caller asked for a new
    // layout, not for permission to write), but a copy all the same.
    CachePtr from_legacy(const Cache& source);

    const std::vector<CopyEvent>& log() const { return log_; }

  private:
    CachePtr record(CachePtr copy, const std::vector<const Cache*>& sources, const std::string& reason, bool owned);

    Depth depth_;
    std::vector<CopyEvent> log_;
};

class Store {
  public:
    explicit Store(Copier& copier) : copier_(copier) {}

    // Stores `cache` under id (an existing id keeps its position); clears
    // the owned marker and the copy history: the cache is an original now.
    void add(const std::string& id, CachePtr cache, Metadata metadata = {});
    const Item* get(const std::string& id) const;  // null when missing
    const std::vector<std::string>& ids() const { return order_; }  // insertion order

    // Ids that exist and hold tokens are kept, in request order (repeats
    // too); none: null. One: an owned clone. Several: an owned merge.
    CachePtr get_cache(const std::vector<std::string>& ids);

    void remove(const std::vector<std::string>& ids);  // missing ids are ignored
    void remove_all();

    // Writes the whole store to dir/vector-engine.dump through a temporary
    // file and a rename.
    void dump(const std::string& dir, Disk& disk) const;
    // Replaces the store with the dump in dir. Throws DumpError, and then
    // the store is unchanged.
    void load(const std::string& dir, Disk& disk);

  private:
    Copier& copier_;
    std::vector<std::string> order_;
    std::map<std::string, Item> items_;
};

// The model boundary: the model writes into `past` itself when it is an
// owned copy, else into a clone of it (logged as "generate"); into a new
// empty modern cache when `past` is null.
void generate(const Model& model, Copier& copier, const CachePtr& past, const std::vector<std::int64_t>& prompt,
              std::int64_t max_new_tokens, const TokenSink& sink, RunStats& stats);

}  // namespace vector_engine
