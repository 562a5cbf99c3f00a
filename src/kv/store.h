// The activation-memory store: items {id, cache, metadata} kept read-only.
//
// Ownership: the store holds each item's cache object and hands out
// `const` access to it (get, get_by_ids, get_all); nothing it hands out can
// reach a model without going through the generation boundary, which clones
// non-owned caches. `get_cache` hands out owned copies, made by the store's
// Copier, so a model may write into them. Storing a cache clears its owned
// marker: the object becomes stored, and the boundary will copy it.
//
//   kv::Store store;
//   store.add({{"a", cache, {{"source", "doc1"}}}});
//   kv::CachePtr copy = store.get_cache({"a"});   // owned, independent
//   store.dump("/tmp/mem"); store.load("/tmp/mem");
#pragma once

#include "kv/cache.h"
#include "kv/copy.h"
#include "kv/io.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kv {

using Metadata = std::map<std::string, std::string>;

struct Item {
    std::string id;
    ConstCachePtr cache;  // never null
    Metadata metadata;
    // Set when a store makes the item (add, load); cleared when a store
    // holding it lets it go (remove, overwrite, remove_all, load, the
    // store's destruction). While it is set, the store that made the item
    // (and any copy of that store) maps `id` to this very item: a holder of
    // the ItemPtr can tell so without a look-up. Copies of a store share
    // items, so one letting an item go clears it for all: the flag may be
    // clear while a store still holds the item, never set while it does not.
    mutable bool stored = false;
};
using ItemPtr = std::shared_ptr<const Item>;

struct NewItem {
    std::string id;
    CachePtr cache;  // must not be null; its owned marker is cleared on store
    Metadata metadata;
};

// A dump could not be read: missing, truncated, corrupt, of another version
// or over the limits. The message names the file and what is wrong.
class DumpError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// Bounds on what a load may read and allocate, whatever the file claims.
struct LoadLimits {
    std::int64_t file_bytes_max = std::int64_t{1} << 30;
    std::int64_t tensor_bytes_max = std::int64_t{1} << 30;  // all tensors together
    std::int64_t items_max = 1 << 20;
    std::int64_t layers_max = 1 << 12;  // per cache
};

// The name of the dump file inside a dump directory.
inline constexpr const char* dump_file_name = "kvcheck-store.pt";
// A dump is written to dump_file_name + this + the writer's process id,
// then renamed; a name with this prefix is a crashed dump's leftover.
inline constexpr const char* dump_temporary_suffix = ".tmp-";
inline constexpr std::int64_t dump_format_version = 1;

// Does the cache hold any K or V element a model would see?
bool holds_tokens(const Cache& cache);

class Store {
  public:
    explicit Store(std::shared_ptr<Copier> copier = std::make_shared<Copier>());
    ~Store();  // clears the `stored` flag of the items it holds
    Store(const Store&) = default;
    Store(Store&&) = default;
    // No assignment: the items a store held before would keep their flag.
    Store& operator=(const Store&) = delete;
    Store& operator=(Store&&) = delete;

    // Stores each item under its id; an existing id is overwritten in place
    // (insertion order keeps its first position, as a Python dict does).
    void add(const std::vector<NewItem>& items);

    ItemPtr get(const std::string& id) const;  // null when missing
    // The store's own pointer to the stored item, without taking a
    // reference: valid until the store next changes. Null when missing.
    const ItemPtr* find(const std::string& id) const;
    std::vector<ItemPtr> get_by_ids(const std::vector<std::string>& ids) const;  // null for missing
    std::vector<ItemPtr> get_all() const;  // insertion order

    // Ids that exist and hold tokens are kept, in request order (repeats
    // included); none left -> null. One: an owned clone. Several: an owned
    // merge, every layer initialized. The stored caches are not modified.
    CachePtr get_cache(const std::vector<std::string>& ids);

    void remove(const std::vector<std::string>& ids);  // missing ids are ignored
    void remove_all();

    // An optional capacity (docs/semantics.md#declared-store-contracts):
    // at most `items` entries (0: no bound, the default). An add past it
    // evicts the least recently used entry (a use: add, or touch). What the
    // evicted item's holders hold stays as it is: the store lets go of it.
    void set_capacity(std::size_t items) { capacity_ = items; }
    std::size_t capacity() const { return capacity_; }
    // Entries the store must not evict (an entry under a live read lease:
    // docs/semantics.md#leases): eviction passes over them to the least
    // recently used one that is not pinned, and an add of a new id to a
    // full store whose every entry is pinned is refused (throws
    // std::runtime_error, nothing stored). None pinned by default.
    void set_pinned(std::function<bool(const std::string&)> pinned) { pinned_ = std::move(pinned); }
    // `id` was handed out (get, get_by_ids, get_cache): its recency. A
    // missing id is ignored.
    void touch(const std::string& id);
    // The stored ids, least recently used first.
    const std::vector<std::string>& recency() const { return recency_; }

    std::size_t size() const { return order_.size(); }
    // Moves whenever the set of stored items changes (an add, a remove, a
    // load): a pointer from find() is still good while it stays.
    std::uint64_t changes() const { return changes_; }

    // Writes the whole store to `dir`/kvcheck-store.pt: to a temporary file
    // (kvcheck-store.pt.tmp-<pid>) first (flushed), then renamed over the
    // previous dump (the directory flushed), so a crash at any point leaves
    // the previous dump readable and a power cut after it returns leaves
    // this one.
    //
    // Both dump and load first remove the temporary files of dumps that
    // died before their rename: those of processes that no longer run, and
    // this process's own. So one directory takes the dumps of one store of
    // a process at a time (another process's dump in progress is left
    // alone). Removal is best effort: a directory that cannot be written
    // still loads.
    void dump(const std::string& dir, FileSystem& fs = posix_file_system()) const;
    // Replaces the store with the dump in `dir`. On any error (DumpError,
    // IoError) the store is unchanged. Temporaries a crashed dump left are
    // removed first (as far as they can be: a load does not fail for them).
    void load(const std::string& dir, FileSystem& fs = posix_file_system(),
              const LoadLimits& limits = LoadLimits{});

    Copier& copier() { return *copier_; }

  private:
    const std::string* victim() const;

    std::shared_ptr<Copier> copier_;
    std::vector<std::string> order_;
    std::vector<std::string> recency_;  // least recently used first
    std::size_t capacity_ = 0;
    std::function<bool(const std::string&)> pinned_;
    std::map<std::string, ItemPtr> items_;
    std::uint64_t changes_ = 0;
};

// The dump format, for tools and adapters that write dumps their own way:
// a torch pickle (readable by Python's torch.load(path, weights_only=True);
// plain torch.load runs any code a crafted file names) of
//   ("kvcheck.store", version, ((id, ((key, value), ...), cache), ...))
// where a cache is ("modern", ((initialized, keys, values, key_cache,
// value_cache), ...)) with None for an absent slot, or
// ("legacy", (key, ...), (value, ...)).
std::vector<char> encode_dump(const std::vector<ItemPtr>& items);
// Parses and validates a dump; throws DumpError naming `origin` and the fault.
std::vector<Item> decode_dump(const std::vector<char>& bytes, const std::string& origin,
                              const LoadLimits& limits);

}  // namespace kv
