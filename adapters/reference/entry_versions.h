// The reference adapter's speed machinery, apart from what it means:
// entry versions, and reading many entries at once. Neither changes what
// the reference reports; both change only how fast it reports it.
//
// An entry's version stays while its cache is made of the same objects,
// unchanged: a snapshot holds those objects (so "the same" cannot be an
// address reused by a new object) and what can change about them in place;
// any difference gives a version never issued before.
//
// A full read of a big store finds its entries cold in memory, and a cache
// is a chain of objects: the cache, its lists and their arrays, the layer
// objects, each tensor's TensorImpl, its storage, then its values. Read an
// entry at a time, each link waits on the one before it; each_warmed takes
// a chunk of entries and first asks the memory for every object of one link
// of the chunk before reading any of the next, so that the misses of a link
// overlap.
#pragma once

#include "id_map.h"
#include "kv/cache.h"
#include "kv/store.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace kvcheck::adapters {

struct EntrySnapshot;

class EntryVersions {
  public:
    using Slot = std::unique_ptr<EntrySnapshot>;

    EntryVersions();
    ~EntryVersions();

    // The snapshot slot of `id`, made empty when there is none.
    Slot& slot(const std::string& id);
    // The item the snapshot was taken of, while the store still holds it;
    // else null.
    static kv::ItemPtr stored_item(const Slot& slot);
    // The version of the entry whose snapshot slot is `slot`, whose item is
    // `item` and cache `cache`.
    std::uint64_t version(Slot& slot, const kv::ItemPtr& item, const kv::Cache& cache);
    // A removed entry's snapshot lets go of what it holds and is kept for
    // the next new entry (up to spare_max of them): a store whose ids come
    // and go then takes no allocation to snapshot them.
    void forget(const std::string& id);
    void clear();

    const EntrySnapshot* find(const std::string& id) const;

  private:
    IdMap<Slot> snapshots_;
    static constexpr std::size_t spare_max = 64;
    std::vector<Slot> spare_;
    std::uint64_t issued_ = 0;
};

// What warming brings in at the end of each chain: the values the facts
// (digest, owned marker, storage) read, or the version counters a version
// compares.
enum class Warm { facts, versions };

// Runs `take(id, item)` on each of `ids`, warm_chunk of them at a time:
// each chunk's items found (through their snapshots while the store holds
// them, else with `find`) and their chains warmed first. `item` is null for
// a missing id.
void each_warmed(const std::vector<std::string>& ids, const EntryVersions& versions,
                 const std::function<const kv::ItemPtr*(const std::string&)>& find, Warm what,
                 const std::function<void(const std::string&, kv::ItemPtr)>& take);

}  // namespace kvcheck::adapters
