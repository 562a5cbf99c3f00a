// The adapter interface: what an engine implements so that kvcheck can
// drive it and check its ownership properties. It speaks only of facts any
// engine can report, never of kvcheck's own types: no tensor, no cache class.
//
// Contract, in short:
// - Caches enter as CacheContent (kvcheck/content.h): the engine builds its
//   own cache holding exactly those values, in its own representation.
// - Caches leave as handles: small integers the harness chooses when it
//   asks for a cache (`out`). The engine keeps what the handle points at
//   alive until `release(out)` or the end of the run. A handle may point at
//   nothing (get of a missing id, get_cache of nothing) and then reports
//   `exists == false`.
// - Observations are read-only: reporting a view, storage or flags must not
//   change anything the engine holds.
// - Every method may throw std::exception for an operation the engine
//   rejects; the harness reports an unexpected throw as a failure of the
//   step, and a crash or hang is caught by running the engine out of
//   process (kvcheck run).
//
//   class MyEngine : public kvcheck::Engine { ... };
//   kvcheck::Failure f = kvcheck::execute(trace, engine);   // harness/executor.h
#pragma once

#include "kvcheck/content.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvcheck {

using Handle = std::int64_t;  // 0 means "no cache"

// An item's metadata: a small string map that get hands back and dump/load
// keep exactly (docs/semantics.md#metadata).
using Metadata = std::map<std::string, std::string>;

// What a full read of the store asks of one stored entry: entry_digest,
// entry_owned and (when asked for) storage_of_entry.
struct EntryFacts {
    std::uint64_t digest = 0;
    bool owned = false;
    std::vector<std::uint64_t> storage;
};

// The caches one model makes (docs/semantics.md#the-model-domain). A real
// store is fed by one model: every cache it holds has that model's layer
// count, its geometry, one token count in every layer (at least one: a
// model never stores an empty memory), one of its dtypes and layouts, and
// no bare, one-sided or legacy-named layer, and a real engine raises on
// anything else. Declared, it bounds what a trace makes, adds and
// generates from (kvcheck/workload.h); undeclared, traces draw any layer
// count, token counts, layer shapes, dtypes and geometry the other
// capabilities allow.
//
//   Capabilities c;
//   c.model = {true, 2, 8, 64, {Dtype::bf16}, {Layout::modern}, false};  // 2 layers, 8 heads of 64
struct ModelDomain {
    bool declared = false;
    std::int64_t layers = 1;                         // >= 1
    std::int64_t heads = cache_heads;                // in [1, cache_heads_max]
    std::int64_t head_dim = cache_head_dim;          // in [1, cache_head_dim_max]
    std::vector<Dtype> dtypes = {Dtype::f32};        // non-empty, no repeats; the first is the plainest
    std::vector<Layout> layouts = {Layout::modern};  // non-empty, no repeats
    bool odd_layers = false;  // bare, one-sided, uninitialized or legacy-named layers may occur

    bool holds(Dtype dtype) const;
    bool holds(Layout layout) const;
};

// Where a paged engine's freed blocks join its free queue, whose front
// allocation takes (free-order, docs/semantics.md#paged-caches): the back
// (the model's: FIFO), the front (LIFO), the front for a block without a
// key and the back for one with (vLLM's), least recently used first (lru:
// a block is used by every operation after which the table of a sequence
// it names holds it: alloc, append, fork, rewind, import; the queue is in
// the order of its blocks' last uses), or unspecified: no queue order (an
// eviction policy of the engine's own: a free block may then lose its key
// in any operation that takes blocks).
enum class PagedFreeOrder : std::uint8_t { back, front, front_unhashed, lru, unspecified };

// How a store bounds itself, as its author declares it
// (docs/semantics.md#declared-store-contracts). Undeclared (the default):
// no capacity, nothing is ever evicted, the listing is in insertion order.
// With a capacity, kvcheck follows evictions instead of reporting the
// entries gone: one the policy evicts is no violation, one evicted against
// it is (eviction-as-declared).
//
//   Capabilities c;
//   c.policy = {16, 0, Eviction::lru, ListingOrder::recency};  // an LRU of 16 items, listed least recent first
enum class Eviction : std::uint8_t {
    none,         // never evicts: an add past the capacity is refused, the store unchanged
    lru,          // the least recently used entry first (a use: add, get, get_by_ids, get_cache)
    fifo,         // the entry stored first first (insertion order; an overwrite keeps its place)
    unspecified,  // any entry may go, never one handed out (a live get of it, or a view of that)
    lrs,          // the least recently stored first (a store is its only use: an overwrite moves it to the back)
};
enum class ListingOrder : std::uint8_t {
    insertion,  // get_all and the listing in insertion order (the default)
    recency,    // least recently used first, most recent last (an LRU's own order)
    unordered,  // any order: only the set of ids is compared
};
struct StorePolicy {
    std::int64_t capacity_items = 0;  // at most this many entries; 0: no bound
    std::int64_t capacity_bytes = 0;  // at most this many bytes of K/V (content_bytes); 0: no bound
    Eviction eviction = Eviction::none;
    ListingOrder listing = ListingOrder::insertion;

    bool bounded() const { return capacity_items > 0 || capacity_bytes > 0; }
};

const char* eviction_name(Eviction eviction);  // "none", "lru", "fifo", "unspecified", "lrs"
// Whether a policy names the entries it evicts, in order (lru, fifo, lrs):
// then exactly those must go (eviction-as-declared).
inline bool evicts_in_order(Eviction eviction) {
    return eviction == Eviction::lru || eviction == Eviction::fifo || eviction == Eviction::lrs;
}
const char* listing_name(ListingOrder listing);  // "insertion", "recency", "unordered"
std::optional<Eviction> parse_eviction(const std::string& text);
std::optional<ListingOrder> parse_listing(const std::string& text);

// What an engine supports. A property whose observations an engine lacks is
// reported as skipped; an operation it lacks is never generated.
// capabilities_fault (kvcheck/workload.h) says what is inconsistent.
struct Capabilities {
    bool modern_layout = true;         // at least one of modern_layout and legacy_layout
    bool legacy_layout = true;
    bool one_sided_layers = true;      // layers holding only keys or only values
    bool legacy_slot_names = true;     // modern layers carrying key_cache/value_cache
    bool uninitialized_layers = true;  // bare layers with assigned tensors
    bool half_dtypes = true;           // float16 and bfloat16
    bool any_geometry = true;          // heads and head_dim other than 2 and 4 (CacheContent)
    bool conversions = true;           // to_legacy / from_legacy
    bool dump = true;                  // dump / load
    bool dump_crash = true;            // dump_interrupted (simulated crash)
    bool generate_stream = true;
    bool storage_identity = true;      // storage_of
    bool copy_log = true;              // take_copies and live sets
    // The engine keeps an owned marker (entry_owned, HandleFacts::owned).
    // Without one those reports are ignored and kvcheck derives "owned"
    // from storage identities: a cache that shares no storage with any
    // stored entry (docs/semantics.md#ownership).
    bool owned_marker = true;
    bool entry_versions = false;       // entry_version (off unless an engine claims it)
    bool metadata = false;             // entry_metadata and handle_metadata report item metadata
    // dump_kill: the engine's dump may run in a fork of kvcheck's process
    // (an engine loaded in process; not one behind a process boundary).
    bool dump_kill = true;
    // generate_returning, extract and fed_view (docs/semantics.md#returned-caches):
    // caches the model wrote into, handed back and stored. Off unless an
    // engine claims it.
    bool returned_caches = false;
    // trim (docs/semantics.md#trimming): a cache the caller owns can be cut
    // to its first tokens in place. Off unless an engine claims it.
    bool trim = false;
    // Read leases with expiry (docs/semantics.md#leases): the TTL in
    // milliseconds of kvcheck's virtual clock that a lease lives for
    // (Engine::advance_clock, lease, unlease); 0: no leases, the default.
    std::int64_t lease_ttl_ms = 0;
    // docs/semantics.md#store-windows: the engine's model attends over its
    // last `window` tokens, and of every cache it holds or hands out only
    // those count: views show each slot's last `window` tokens, a trim is
    // asked only of a cache that never held `window`. 0: no window.
    std::int64_t window = 0;
    // batch (docs/semantics.md#batches): caches the caller owns stacked
    // into a batch, repeated, reordered and a row selected. Off unless an
    // engine claims it.
    bool batch = false;
    // docs/semantics.md#content-tolerance: the engine stores K/V quantized
    // and reads a value back within this of the one it was given; its views
    // carry their values (SlotView::values). Exact (none) by default.
    ContentTolerance content_tolerance;
    // The model whose caches the engine holds; undeclared by default.
    ModelDomain model;
    // The store's capacity, eviction policy and listing order; undeclared by default.
    StorePolicy policy;
    // A paged block manager (kvcheck/paged.h): Engine::paged() answers, the
    // paged operations are drawn and the paged properties checked. Off
    // unless an engine claims it.
    bool paged = false;
    // The contiguous family: the store, generation and cache-level
    // operations. False: a paged-only engine (a block manager behind a
    // process boundary, say; needs paged): no contiguous operation is drawn
    // and the contiguous properties are n/a. On unless an engine says otherwise.
    bool store = true;
    // With paged: whether the manager has a fork (paged_fork) and an import
    // of a contiguous cache (paged_import) at all. False: kvcheck never
    // draws that operation (a refusal of one it has must be needed:
    // op-atomic). On unless an engine says otherwise.
    bool paged_fork = true;
    bool paged_import = true;
    // With paged: whether the manager can rewind a sequence (paged_rewind:
    // drop its last tokens, so that later appends write others). False:
    // kvcheck never draws it. On unless an engine says otherwise (a process
    // adapter claims it: docs/protocol.md).
    bool paged_rewind = true;
    // With paged: where freed blocks join the free queue (PagedFreeOrder).
    // The back unless an engine says otherwise (a process adapter that
    // declares none: unspecified).
    PagedFreeOrder paged_free_order = PagedFreeOrder::back;
    // Its Engine and PagedEngine methods may be called from several threads
    // at once (the thread level, docs/semantics.md#the-thread-level: calls
    // that overlap, interleaved at kvcheck::yield points). Off unless an
    // engine claims it.
    bool thread_safe = false;
};

// One deliberate K/V copy (clone or merge), as the engine logged it.
struct CopyRecord {
    std::string reason;  // free text: "get_cache", "merge", "generate", "clone", ...
    std::int64_t bytes = 0;
};

struct GenerateResult {
    std::vector<std::int64_t> tokens;
    std::int64_t peak_live_sets = 0;  // K/V sets alive on the path while the model ran
};

// Result of a load: ok, or the engine's error message.
struct LoadResult {
    bool ok = false;
    std::string error;
};

struct HandleFacts {
    bool exists = false;
    bool owned = false;  // the owned-copy marker (ignored without Capabilities::owned_marker)
};

class PagedEngine;  // kvcheck/paged.h

class Engine {
  public:
    virtual ~Engine() = default;

    virtual std::string name() const = 0;
    virtual Capabilities capabilities() const { return {}; }

    // ---- the store ----
    virtual void add(const std::string& id, const CacheContent& content, const Metadata& metadata) = 0;
    // Stores the cache `handle` points at (typically an owned copy) under
    // id, with no metadata.
    virtual void add_handle(const std::string& id, Handle handle) = 0;
    // `out` points at what the store hands out for id (the stored item's cache).
    virtual void get(const std::string& id, Handle out) = 0;
    // The ids of the items handed out, in request order; nullopt for missing.
    virtual std::vector<std::optional<std::string>> get_by_ids(const std::vector<std::string>& ids) = 0;
    virtual std::vector<std::string> get_all_ids() = 0;  // insertion order
    virtual void get_cache(const std::vector<std::string>& ids, Handle out) = 0;
    virtual void remove(const std::vector<std::string>& ids) = 0;
    virtual void remove_all() = 0;
    virtual void dump(const std::string& dir) = 0;
    // A dump that crashes after `bytes_budget` bytes are written (simulated
    // power cut): partial files stay as the crash left them.
    virtual void dump_interrupted(const std::string& dir, std::int64_t bytes_budget) = 0;
    virtual LoadResult load(const std::string& dir) = 0;

    // ---- generation ----
    // handle 0: no cache.
    virtual GenerateResult generate(Handle handle, const std::vector<std::int64_t>& prompt,
                                    std::int64_t max_new_tokens, bool stream) = 0;
    // The engine's model on a fresh cache holding `content` (the "fresh deep
    // copy" generation-equivalent compares with).
    virtual std::vector<std::int64_t> generate_fresh(const CacheContent& content,
                                                     const std::vector<std::int64_t>& prompt,
                                                     std::int64_t max_new_tokens) = 0;

    // ---- caches the model makes (docs/semantics.md#returned-caches) ----
    // With Capabilities::returned_caches; the defaults throw.
    // generate(handle, prompt, max_new_tokens), and `out` then points at the
    // cache the model wrote into: the input's K/V, then those of every token
    // the model was fed (the prompt and each generated token but the last),
    // in every layer. The caller owns it: it may read it, generate from it
    // again (a second turn) and store it (add_handle).
    virtual GenerateResult generate_returning(Handle /*handle*/, const std::vector<std::int64_t>& /*prompt*/,
                                              std::int64_t /*max_new_tokens*/, Handle /*out*/) {
        throw std::logic_error("generate_returning: not supported by this engine");
    }
    // Stores under id the memory the model makes of `prompt`: its prefill
    // over the prompt on a fresh cache.
    virtual void extract(const std::string& /*id*/, const std::vector<std::int64_t>& /*prompt*/) {
        throw std::logic_error("extract: not supported by this engine");
    }
    // The view of a fresh deep copy of `content` once the engine's model has
    // been fed `tokens` (none: the copy as it is): what a returned cache or
    // an extracted memory must hold, as generate_fresh is what a generation
    // must give.
    virtual CacheView fed_view(const CacheContent& /*content*/, const std::vector<std::int64_t>& /*tokens*/) {
        throw std::logic_error("fed_view: not supported by this engine");
    }

    // ---- trimming (docs/semantics.md#trimming) ----
    // With Capabilities::trim; the default throws. Cuts the cache `handle`
    // points at, which the caller owns, to its first `keep` tokens (>= 1)
    // in place: every present slot of every layer holding more keeps its
    // first `keep` tokens; the others are unchanged. Other handles of the
    // same cache see the cut; no stored entry changes.
    virtual void trim(Handle /*handle*/, std::int64_t /*keep*/) {
        throw std::logic_error("trim: not supported by this engine");
    }

    // ---- kvcheck's clock and read leases (docs/semantics.md#leases) ----
    // With Capabilities::lease_ttl_ms > 0; the defaults throw. The engine's
    // clock starts at 0 and moves only by advance_clock: a lease taken at t
    // is live while the clock is below t + lease_ttl_ms (each lease on an
    // entry moves its expiry to now + TTL, as LMCache's TTLLock does).
    // While an entry holds a live lease, every call that would remove or
    // replace it (add, add_handle, extract, remove, remove_all, load) throws
    // and changes nothing.
    virtual void advance_clock(std::int64_t /*ms*/) {
        throw std::logic_error("advance_clock: not supported by this engine");
    }
    // Throws when nothing is stored under `id`.
    virtual void lease(const std::string& /*id*/) { throw std::logic_error("lease: not supported by this engine"); }
    // Gives one lease back; throws when `id` holds no live lease.
    virtual void unlease(const std::string& /*id*/) { throw std::logic_error("unlease: not supported by this engine"); }
    // ---- batches (docs/semantics.md#batches) ----
    // With Capabilities::batch; the default throws. Stacks the caches
    // `rows` (each batch 1, owned by the caller, of one geometry) into one
    // cache of batch rows.size(), repeats every row `repeat` times in place
    // (batch_repeat_interleave), reorders the rows by `reorder` when it is
    // not empty (reorder_cache: row j becomes row reorder[j]), keeps row
    // `select` (batch_select_indices) and binds `out` to it: a new cache
    // the caller owns, sharing no storage with any row or the store. The
    // rows are unchanged; one deliberate copy (of the row handed out) is
    // logged.
    virtual void batch_row(const std::vector<Handle>& /*rows*/, std::int64_t /*repeat*/,
                           const std::vector<std::int64_t>& /*reorder*/, std::int64_t /*select*/, Handle /*out*/) {
        throw std::logic_error("batch: not supported by this engine");
    }

    // ---- cache-level ----
    virtual void make(const CacheContent& content, Handle out) = 0;  // not stored, not owned
    virtual void clone(Handle source, Handle out) = 0;
    virtual void concat(const std::vector<Handle>& parts, Handle out) = 0;
    virtual void to_legacy(Handle source, Handle out) = 0;
    virtual void from_legacy(Handle source, Handle out) = 0;
    // Ends the handle: releasing what get handed out ends only the borrow
    // (the stored item, its content and storage stay as they are); releasing
    // an owned copy or a merge frees that object only.
    virtual void release(Handle handle) = 0;

    // ---- observations ----
    virtual std::vector<std::string> stored_ids() = 0;  // insertion order
    virtual CacheView view_entry(const std::string& id) = 0;
    virtual bool entry_owned(const std::string& id) = 0;
    virtual CacheView view_handle(Handle handle) = 0;
    // view_digest(view_entry(id)) and view_digest(view_handle(handle)), for
    // an engine that can compute them without building the view (with
    // ViewDigest): the harness compares digests, and asks for the view only
    // to name a difference. The defaults build the view.
    virtual std::uint64_t entry_digest(const std::string& id) { return view_digest(view_entry(id)); }
    virtual std::uint64_t handle_digest(Handle handle) { return view_digest(view_handle(handle)); }
    virtual HandleFacts handle_facts(Handle handle) = 0;
    // The metadata of a stored item, and of the item get handed out as
    // `handle` (with Capabilities::metadata; the defaults report none).
    virtual Metadata entry_metadata(const std::string& /*id*/) { return {}; }
    virtual Metadata handle_metadata(Handle /*handle*/) { return {}; }
    // Identities of everything a cache is made of (tensor storages, layer
    // objects, lists), as opaque numbers: two caches alias iff they share one.
    virtual std::vector<std::uint64_t> storage_of_entry(const std::string& id) = 0;
    virtual std::vector<std::uint64_t> storage_of_handle(Handle handle) = 0;
    // The copies made since the last call.
    virtual std::vector<CopyRecord> take_copies() = 0;
    // A number that stays the same while view_entry, entry_owned and
    // storage_of_entry of `id` would report the same, and changes - to a
    // value it never had before - whenever they may have changed. With it
    // the harness re-reads and re-hashes after a step only the entries whose
    // version changed, not every entry (it still reads every entry once at
    // the end of a run). Claim it with capabilities().entry_versions only
    // when it is cheap and certain: an entry whose version misses a change
    // is checked late.
    virtual std::uint64_t entry_version(const std::string& /*id*/) { return 0; }

    // ---- a hint ----
    // Said before the operations of each step run: the stored entries the
    // harness will read after them besides those the step names, or that
    // it will read every one (a full read). An engine may gather those
    // facts while it runs the operations (one behind a process boundary:
    // in their replies, instead of a request for the reads); the reads
    // still go through the observations, and may ask about others. The
    // default ignores it.
    virtual void expect_reads(const std::vector<std::string>& /*entries*/, bool /*every_entry*/) {}

    // ---- many entries at once ----
    // The full reads of the store (periodically, and at the end of a run)
    // ask these about every stored id, answers in the order of `ids`. Each
    // must report exactly what its one-entry methods report (a fact a check
    // is about to report is asked again of them, and a disagreement is an
    // engine error). The defaults call them entry by entry; an engine can do
    // better in one call: one round trip instead of one per entry for an
    // engine behind a process boundary, or, as the reference does, memory
    // asked for a batch of entries at a time (a store of a thousand small
    // caches is cold in memory).
    virtual std::vector<std::uint64_t> entry_versions(const std::vector<std::string>& ids) {
        std::vector<std::uint64_t> versions;
        versions.reserve(ids.size());
        for (const std::string& id : ids) versions.push_back(entry_version(id));
        return versions;
    }
    virtual std::vector<EntryFacts> read_entries(const std::vector<std::string>& ids, bool with_storage) {
        std::vector<EntryFacts> facts;
        facts.reserve(ids.size());
        for (const std::string& id : ids) {
            facts.push_back({entry_digest(id), entry_owned(id), with_storage ? storage_of_entry(id) : std::vector<std::uint64_t>{}});
        }
        return facts;
    }

    // ---- the paged family ----
    // The engine's paged interface (with Capabilities::paged), else null.
    virtual PagedEngine* paged() { return nullptr; }
};

}  // namespace kvcheck
