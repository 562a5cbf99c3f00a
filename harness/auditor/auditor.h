// The auditor: the expected state of an engine, built only from the
// operations of a trace and their results, never from the engine's
// internals. Internal to the harness.
#pragma once

#include "id_map.h"
#include "kvcheck/content.h"
#include "kvcheck/engine.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvcheck {

using ObjectId = std::int64_t;  // the auditor's name for one cache object

// Where a handle's cache came from: it decides what the handle may alias
// and whether it must carry the owned marker.
enum class Origin : std::uint8_t { stored_item, get_cache, clone, concat, make, to_legacy, from_legacy };

// What a copy was made from: level 0 the objects it was copied from (the
// parts, for a merge), level k+1 what level k was copied from. Views that
// alias (to_legacy) and stored caches (the original from then on) have none.
using Lineage = std::vector<std::vector<ObjectId>>;

// A cache object as the auditor expects it.
struct Object {
    CacheContent content;
    // expected_view(content) and its view_digest, made when a check first
    // asks (Auditor::view_of, digest_of): a run that checks no content,
    // such as the benchmarks' unchecked one, never makes them.
    std::optional<CacheView> view;
    std::optional<std::uint64_t> digest;
    bool known = true;         // false once a model may have written into it
    // A cache the model made (docs/semantics.md#returned-caches): `content`
    // is what it started from, and it holds after it the K/V of these
    // tokens, which only the engine's model knows. Its `view` is then set
    // when it is made, from the engine's fed_view.
    std::optional<std::vector<std::int64_t>> fed;
    bool expect_owned = false;
    Origin origin = Origin::make;
    ObjectId alias_parent = 0;  // the object a conversion result may share storage with
    // At most how many K/V sets are alive on this object's copy chain
    // (itself and the copies it descends from): stored or made 1, a copy of
    // X one more than X, a merge one more than its deepest part.
    std::int64_t chain_sets = 1;
    // The copies it descends from: with what the trace still references,
    // the K/V sets that are certainly alive on its chain (referenced_levels).
    Lineage lineage;
};

// A store's content at the moment of a dump.
struct Snapshot {
    std::vector<std::string> order;
    std::vector<std::string> recency;  // least recently used first
    std::map<std::string, CacheContent> entries;
    std::int64_t window = 0;  // the engine's (Auditor::set_window): its entries show their last `window` tokens
    std::map<std::string, Metadata> metadata;
    // Ids that held one cache object: a load gives them one object again
    // (a dump writes a shared object once).
    std::map<std::string, ObjectId> objects;
    // The entries the model made: the tokens fed and their expected view.
    std::map<std::string, std::vector<std::int64_t>> fed;
    std::map<std::string, CacheView> views;
};

// What a dump slot may hold: after a crash during a dump, either the
// previous dump or the new one; a corrupted file may also be rejected.
struct DumpSlot {
    std::vector<Snapshot> candidates;  // empty: nothing readable was ever written
    bool corrupted = false;
    bool may_be_absent = false;  // a dump crashed before any complete dump was there
    // What each corrupt did to the slot's files since its last dump, in
    // words with the real byte offset ("byte 2155 of x.pt flipped ...").
    std::string damage;
};

class Auditor {
  public:
    ObjectId new_object(CacheContent content, Origin origin, bool expect_owned, ObjectId alias_parent = 0,
                        std::int64_t chain_sets = 1, Lineage lineage = {});
    // A new object with the content of `source` (a clone, the copy of an
    // entry get_cache hands out), and its digest if made already.
    ObjectId copy_object(ObjectId source, Origin origin, bool expect_owned, std::int64_t chain_sets);
    // Makes `object` a cache the model made: `content` plus the K/V of `fed`,
    // expected to read as `view`.
    void set_fed(ObjectId object, std::vector<std::int64_t> fed, CacheView view);
    // The bytes of K/V a copy of `object` holds.
    std::int64_t bytes_of(ObjectId object) const;
    // docs/semantics.md#store-windows: an engine whose model attends over
    // its last `window` tokens shows only those of every cache (view_of and
    // digest_of are of expected_window(content)); 0, the default: all.
    void set_window(std::int64_t window) { window_ = window; }
    std::int64_t window() const { return window_; }
    // The bytes of K/V `object` shows: bytes_of, but of its window only.
    std::int64_t shown_bytes_of(ObjectId object) const;
    // The lineage of a copy of `sources`.
    Lineage copy_lineage(const std::vector<ObjectId>& sources) const;
    // How many levels of `lineage` hold an object the trace still
    // references (bound to a handle, or stored): K/V sets an engine must
    // count alive, whatever else it keeps.
    std::int64_t referenced_levels(const Lineage& lineage) const;
    Object& object(ObjectId id) { return objects_.at(id); }
    const Object& object(ObjectId id) const { return objects_.at(id); }

    // The store.
    // An overwritten id keeps its position; a re-added one (deleted before)
    // goes last.
    void store(const std::string& id, ObjectId object, Metadata metadata = {});
    const Metadata& metadata(const std::string& id) const;  // of a stored id
    void remove(const std::string& id);
    void remove_all();
    const std::vector<std::string>& order() const { return order_; }
    // The stored ids, least recently used first: a use is a store (add,
    // add_handle, extract, fill) or a hand-out (get, get_by_ids, get_cache)
    // of the id (docs/semantics.md#declared-store-contracts).
    const std::vector<std::string>& recency() const { return recency_; }
    void touch(const std::string& id);  // a stored id was used; others are ignored
    // The stored ids, least recently stored first: a store (add,
    // add_handle, extract, fill; an overwrite too) is the only use, the
    // order Eviction::lrs evicts in.
    const std::vector<std::string>& stores() const { return stores_; }
    // The listing a store of `listing` order must give (unordered: insertion
    // order, compared as a set).
    const std::vector<std::string>& listing(ListingOrder listing) const {
        return listing == ListingOrder::recency ? recency_ : order_;
    }
    // The K/V bytes the store holds (content_bytes of every entry).
    std::int64_t stored_bytes() const;
    // The ids that must not be evicted under Eviction::unspecified: those
    // handed out, whose object a live handle holds (or a view of it).
    std::vector<std::string> handed_out() const;
    // The ids a store of `policy` (lru, fifo or lrs) evicts, in order, when
    // `added` (id, K/V bytes) are stored one after the other into the store
    // as it is now. Nothing changes here: the run follows what the engine
    // did, and eviction-as-declared compares. The `leased` ids (entries
    // under a live lease: docs/semantics.md#leases) are passed over; an
    // item for which the store could make room only by evicting the item
    // itself while a leased entry stays is refused whole (nothing evicted
    // for it, nothing stored): its id goes to `refused`, when given.
    std::vector<std::string> due_evictions(const StorePolicy& policy,
                                           const std::vector<std::pair<std::string, std::int64_t>>& added,
                                           const std::set<std::string>& leased = {},
                                           std::vector<std::string>* refused = nullptr) const;
    std::optional<ObjectId> entry(const std::string& id) const;
    // The view and digest the engine's cache of `object` must have.
    const CacheView& view_of(ObjectId object);
    std::uint64_t digest_of(ObjectId object);
    // view_of with each slot's values (SlotView::values), not kept: what a
    // reading within a content tolerance is compared with.
    CacheView values_view_of(ObjectId object) const;
    Snapshot snapshot() const;
    // load: new objects, same content; used in the order a store of
    // `listing` order lists them
    void restore(const Snapshot& snapshot, ListingOrder listing = ListingOrder::insertion);

    // Handles: created (possibly holding no cache) or never created.
    bool handle_created(std::int64_t handle) const { return handles_.count(handle) != 0; }
    std::optional<ObjectId> handle(std::int64_t handle) const;  // nullopt: created but no cache, or unknown
    void bind(std::int64_t handle, std::optional<ObjectId> object) { handles_[handle] = object; }
    void release(std::int64_t handle) { handles_.erase(handle); }
    const std::map<std::int64_t, std::optional<ObjectId>>& handles() const { return handles_; }

    // May a cache of object `a` share storage with object `b`? Only when it
    // is `b` or a conversion result derived from it.
    bool may_alias(ObjectId a, ObjectId b) const;
    // A model wrote into `object`: its content, and that of every view
    // derived from it, is no longer known.
    void consumed(ObjectId object);
    // `object` was trimmed in place (docs/semantics.md#trimming): it holds
    // `content`, and after it the K/V of `fed` when the model made it (then
    // read as `view`). A view derived from it (a conversion aliasing it) may
    // or may not see the cut: its content is no longer known.
    void trimmed(ObjectId object, CacheContent content, std::optional<std::vector<std::int64_t>> fed,
                 std::optional<CacheView> view);

    std::map<std::int64_t, DumpSlot>& slots() { return slots_; }
    // Per slot, the temporary files killed dumps left there (dump_kill):
    // a later complete dump must not leave them.
    std::map<std::int64_t, std::vector<std::string>>& temporaries() { return temporaries_; }

  private:
    // Looked up by every check of every step: hashed, not ordered.
    std::unordered_map<ObjectId, Object> objects_;
    std::unordered_map<ObjectId, std::vector<ObjectId>> alias_children_;  // alias_parent -> the objects naming it
    ObjectId next_object_ = 1;
    std::vector<std::string> order_;
    std::vector<std::string> recency_;  // least recently used first
    std::vector<std::string> stores_;   // least recently stored first
    IdMap<ObjectId> entries_;  // in no order: order_ has it
    std::map<std::string, Metadata> metadata_;  // of the stored ids
    std::map<std::int64_t, std::optional<ObjectId>> handles_;
    std::map<std::int64_t, DumpSlot> slots_;
    std::map<std::int64_t, std::vector<std::string>> temporaries_;
    // expected_digest of each content digest_of met (content_key -> digest).
    std::unordered_map<std::string, std::uint64_t> digests_by_content_;
    std::int64_t window_ = 0;
};

}  // namespace kvcheck
