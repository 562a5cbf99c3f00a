// The properties kvcheck checks, by stable id: the registry. Each property
// is one line of KVCHECK_PROPERTY_LIST (its enum name, its id in reports,
// a one-line summary, the capabilities an engine must report for it to be
// checked) and one checker, harness/checkers/<name>.cpp; docs/semantics.md
// says what each asserts (#properties).
//
//   for (kvcheck::Property p : kvcheck::all_properties()) std::cout << kvcheck::property_id(p);
//   kvcheck::PropertySet only = kvcheck::PropertySet::only(kvcheck::Property::single_copy);
#pragma once

#include "kvcheck/engine.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace kvcheck {

// The capabilities a property needs (see checkable), as bits.
enum PropertyNeeds : std::uint16_t {
    property_needs_nothing = 0,
    property_needs_copy_log = 1 << 0,          // Capabilities::copy_log
    property_needs_storage_identity = 1 << 1,  // Capabilities::storage_identity
    property_needs_dump = 1 << 2,              // Capabilities::dump
    // Capabilities::owned_marker, or storage_identity to derive "owned" from.
    property_needs_ownership = 1 << 3,
    property_needs_paged = 1 << 4,  // Capabilities::paged: a property of the paged family
    property_needs_free_order = 1 << 5,  // Capabilities::paged_free_order declared (not unspecified)
    property_needs_capacity = 1 << 6,  // a declared capacity (Capabilities::policy.bounded())
    property_needs_trim = 1 << 7,      // Capabilities::trim
    property_needs_leases = 1 << 8,    // Capabilities::lease_ttl_ms > 0
    property_needs_batch = 1 << 9,     // Capabilities::batch
};

// X(enum name, id, summary, needs), in the order the checkers run and a
// step's violations are ranked (the first is the one reported).
#define KVCHECK_PROPERTY_LIST(X)                                                                                   \
    X(stored_immutable, "stored-immutable",                                                                        \
      "stored entries never change, and nothing handed out of the store aliases them", property_needs_nothing)    \
    X(single_copy, "single-copy", "each generation copies the stored K/V once at most; two K/V sets alive",        \
      property_needs_copy_log)                                                                                     \
    X(layout_roundtrip, "layout-roundtrip", "conversions, clone and dump/load are identities",                     \
      property_needs_nothing)                                                                                      \
    X(merge_correct, "merge-correct", "merged caches: true length, request order, initialized, owned",             \
      property_needs_nothing)                                                                                      \
    X(owned_marker, "owned-marker", "only caches sharing nothing with the store are marked owned",                 \
      property_needs_ownership)                                                                                    \
    X(clone_independent, "clone-independent",                                                                      \
      "a copy (clone, from_legacy) shares no tensor, layer or list with its source",                                \
      property_needs_storage_identity)                                                                             \
    X(generation_equivalent, "generation-equivalent",                                                              \
      "generating via the store equals generating from a fresh copy", property_needs_nothing)                      \
    X(dump_safe, "dump-safe", "dumps round-trip; bad or interrupted dumps never lose data", property_needs_dump)   \
    X(store_contract, "store-contract", "ids, order and missing ids of the store API", property_needs_nothing)      \
    X(eviction_as_declared, "eviction-as-declared",                                                                \
      "a bounded store evicts only past its declared capacity, and only what its declared policy names",           \
      property_needs_capacity)                                                                                     \
    X(trim_exact, "trim-exact", "a trimmed cache equals a fresh computation on the kept prefix",                   \
      property_needs_trim)                                                                                         \
    /* the paged family (kvcheck/paged.h) */                                                                       \
    X(op_atomic, "op-atomic",                                                                                      \
      "a refused operation changes nothing and was needed: an alloc of L tokens faces fewer free blocks "          \
      "(cached ones included) than ceil(L/B), a fork fewer than the parent's table",                                \
      property_needs_paged)                                                                                        \
    X(refcount_exact, "refcount-exact", "a block's count is the tables holding it plus the copies reading it",    \
      property_needs_paged)                                                                                        \
    X(free_iff_unreferenced, "free-iff-unreferenced", "a block is free, once, exactly when its count is 0",        \
      property_needs_paged)                                                                                        \
    X(index_consistent, "index-consistent", "every key maps only to blocks holding that identity and its tokens",  \
      property_needs_paged)                                                                                        \
    X(published_after_written, "published-after-written", "a block is hittable only once every slot is written",  \
      property_needs_paged)                                                                                        \
    X(published_immutable, "published-immutable",                                                                  \
      "a published or shared block is never written (a rewind may cut one held alone)",                            \
      property_needs_paged)                                                                                        \
    X(cow_exact, "cow-exact", "a write into a shared block copies exactly that block, once, into a fresh one",     \
      property_needs_paged)                                                                                        \
    X(no_reuse_while_read, "no-reuse-while-read", "a block a pending copy reads is never freed or taken",          \
      property_needs_paged)                                                                                        \
    X(prefix_hit_exact, "prefix-hit-exact", "a hit ends on a block boundary and equals a fresh computation",       \
      property_needs_paged)                                                                                        \
    X(hit_consumed, "hit-consumed", "the cached tokens reported are the K/V attached; the rest is computed",       \
      property_needs_paged)                                                                                        \
    X(no_leak, "no-leak", "with no sequence left, after a step, every count is 0 and every block free",           \
      property_needs_paged)                                                                                        \
    X(lookup_exact, "lookup-exact", "a lookup's or alloc's cached tokens are the longest chain the index held",    \
      property_needs_paged)                                                                                        \
    X(keys_retained, "keys-retained", "a block keeps its key until taken again or evicted; evict and reset as said", \
      property_needs_paged)                                                                                        \
    X(free_order, "free-order", "freed blocks join the free queue where the engine declares (back, front, ...)",   \
      property_needs_paged | property_needs_free_order)                                                            \
    X(paged_roundtrip, "paged-roundtrip", "export gives exactly the sequence's K/V, sharing nothing with the pool", \
      property_needs_paged)                                                                                        \
    /* concurrent clients (kvcheck/lanes.h): judged on traces of several lanes */                                 \
    X(linearizable, "linearizable",                                                                                \
      "the requests of concurrent clients give what some order of whole requests, kept by the schedule, gives",    \
      property_needs_nothing)                                                                                      \
    /* read leases on kvcheck's virtual clock (docs/semantics.md#leases) */                                       \
    X(lease_respected, "lease-respected",                                                                          \
      "an entry under a live read lease is never removed or replaced; an expired lease protects nothing",          \
      property_needs_leases)                                                                                      \
    /* batches (last: the properties before keep their trace streams, kvcheck::trace_seed) */                      \
    X(batch_exact, "batch-exact",                                                                                  \
      "a row of a repeated, reordered or selected batch equals the cache it came from", property_needs_batch)

enum class Property : std::uint8_t {
#define KVCHECK_PROPERTY_ENUM(name, id, summary, needs) name,
    KVCHECK_PROPERTY_LIST(KVCHECK_PROPERTY_ENUM)
#undef KVCHECK_PROPERTY_ENUM
};

#define KVCHECK_PROPERTY_COUNT(name, id, summary, needs) +1
inline constexpr std::size_t property_count = 0 KVCHECK_PROPERTY_LIST(KVCHECK_PROPERTY_COUNT);
#undef KVCHECK_PROPERTY_COUNT

const char* property_id(Property property);       // "stored-immutable", ...
const char* property_summary(Property property);  // one line
std::optional<Property> parse_property(const std::string& id);
const std::array<Property, property_count>& all_properties();

// An engine's unexpected exception, or an adapter contradicting itself, is
// reported under this id (it is not a property: the step could not be judged).
inline constexpr const char* engine_error_id = "engine-error";
// State shared across engine instances (docs/semantics.md#reproduction): a
// finding that needs an earlier engine of the same process, or answers that
// differ from the trace's run alone. Not a property either: an engine-level
// verdict, with a two-part reproducer (kvcheck replay --prefix).
inline constexpr const char* shared_state_id = "shared-state";

class PropertySet {
  public:
    static PropertySet all() { return PropertySet((1u << property_count) - 1); }
    static PropertySet none() { return PropertySet(0); }
    static PropertySet only(Property p) { return PropertySet(1u << static_cast<unsigned>(p)); }
    bool has(Property p) const { return (bits_ >> static_cast<unsigned>(p)) & 1; }
    void add(Property p) { bits_ |= 1u << static_cast<unsigned>(p); }
    void remove(Property p) { bits_ &= ~(1u << static_cast<unsigned>(p)); }
    bool empty() const { return bits_ == 0; }

  private:
    explicit PropertySet(std::uint32_t bits) : bits_(bits) {}
    std::uint32_t bits_;
};

// Which properties an engine's capabilities let kvcheck check.
PropertySet checkable(const Capabilities& capabilities);
// A property of the paged family (property_needs_paged)?
bool paged_property(Property property);
// A property that judges a declared capacity (property_needs_capacity)?
bool capacity_property(Property property);

}  // namespace kvcheck
