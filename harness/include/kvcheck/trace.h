// Operations and traces: one definition of every operation, used by the
// RapidCheck generators, the libFuzzer decoder, the corpus text format, the
// shrinker and the reports.
//
// Each operation is a plain aggregate; Boost.PFR walks its fields for
// printing, parsing and equality. Handles are named by the operation that
// creates them (`out`), so removing an operation never renumbers the rest:
// an operation naming a handle nobody created is skipped when run.
//
// Text form, one operation per line, '#' starts a comment:
//   add a modern/f32/3:[kv2 kv2]
//   h1 = get_cache a b
//   generate h1 prompt=5,7 max=3
#pragma once

#include "kvcheck/content.h"
#include "kvcheck/engine.h"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace kvcheck {

// A handle named in a trace ("h3"); 0 is "no cache".
struct HandleName {
    std::int64_t value = 0;
    friend bool operator==(HandleName a, HandleName b) { return a.value == b.value; }
};

// An item's metadata in a trace: the seed item_metadata expands (0: none).
// Written `meta=N`, and only when not 0, as the last field: a trace without
// metadata reads as it always did.
struct MetaSeed {
    std::int64_t value = 0;
    friend bool operator==(MetaSeed a, MetaSeed b) { return a.value == b.value; }
};

// The metadata a seed stands for: none for 0, else a few string pairs
// drawn from the seed.
Metadata item_metadata(MetaSeed seed);

using Ids = std::vector<std::string>;
using Tokens = std::vector<std::int64_t>;
using HandleNames = std::vector<HandleName>;

// ---- operation traits -------------------------------------------------------
//
// Every operation struct states, next to its fields, what the harness needs
// to know of it without a list kept anywhere else (trace.cpp asserts at
// compile time that every operation of the variant has all of them):
//   reach        what of the store it reads or changes: the read schedule
//                around the operation follows from it (harness/run/);
//   changes_ids  whether it may change which ids the store holds;
//   needs        the capabilities an engine must report for the operation
//                to be generated and run (an engine lacking one never sees it);
//   list_min     the fewest entries its list field (ids, parts) keeps when
//                shrunk (0 when it has none);
//   well_formed  whether the operation names something an engine can do:
//                one that makes a handle must not make h0 ("no cache") or
//                one of its own sources. A malformed operation is skipped.

enum class StoreReach : std::uint8_t {
    named,           // reads or binds only the ids and handles it names
    replaces_named,  // replaces or removes the entries it names
    whole_store,     // reads or replaces the whole store
};

// The Capabilities an operation needs, as bits (see engine_supports).
enum Needs : std::uint16_t {
    needs_nothing = 0,
    needs_dump = 1 << 0,         // Capabilities::dump
    needs_dump_crash = 1 << 1,   // Capabilities::dump_crash
    needs_stream = 1 << 2,       // Capabilities::generate_stream
    needs_conversions = 1 << 3,  // Capabilities::conversions, legacy_layout and modern_layout
    needs_dump_kill = 1 << 4,    // Capabilities::dump_kill
    needs_returned = 1 << 5,     // Capabilities::returned_caches
    needs_paged = 1 << 6,        // Capabilities::paged (kvcheck/paged.h)
    needs_paged_fork = 1 << 7,   // Capabilities::paged_fork
    needs_paged_import = 1 << 8, // Capabilities::paged_import
    needs_paged_rewind = 1 << 9, // Capabilities::paged_rewind
    needs_trim = 1 << 10,        // Capabilities::trim
    needs_leases = 1 << 11,      // Capabilities::lease_ttl_ms > 0
    needs_batch = 1 << 12,       // Capabilities::batch
};

namespace op {

// Field names: integer and token fields print as name=value, the others by
// position. A variable-length field (Ids, HandleNames) comes last.
struct Add {
    static constexpr const char* name = "add";
    static constexpr std::array<const char*, 3> fields{"id", "cache", "meta"};
    static constexpr StoreReach reach = StoreReach::replaces_named;
    static constexpr bool changes_ids = true;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    std::string id;
    CacheSpec cache;
    MetaSeed meta = {};
    bool well_formed() const { return true; }
};
// Stores the cache a handle points at under an id.
struct AddHandle {
    static constexpr const char* name = "add_handle";
    static constexpr std::array<const char*, 2> fields{"id", "handle"};
    static constexpr StoreReach reach = StoreReach::replaces_named;
    static constexpr bool changes_ids = true;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    std::string id;
    HandleName handle;
    bool well_formed() const { return true; }
};
struct Get {
    static constexpr const char* name = "get";
    static constexpr std::array<const char*, 2> fields{"out", "id"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    HandleName out;
    std::string id;
    bool well_formed() const { return out.value != 0; }
};
struct GetByIds {
    static constexpr const char* name = "get_by_ids";
    static constexpr std::array<const char*, 1> fields{"ids"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    Ids ids;
    bool well_formed() const { return true; }
};
struct GetAll {
    static constexpr const char* name = "get_all";
    static constexpr std::array<const char*, 0> fields{};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    bool well_formed() const { return true; }
};
struct GetCache {
    static constexpr const char* name = "get_cache";
    static constexpr std::array<const char*, 2> fields{"out", "ids"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 1;
    HandleName out;
    Ids ids;
    bool well_formed() const { return out.value != 0; }
};
struct Generate {
    static constexpr const char* name = "generate";
    static constexpr std::array<const char*, 3> fields{"source", "prompt", "max"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    HandleName source;
    Tokens prompt;
    std::int64_t max = 0;
    bool well_formed() const { return true; }
};
struct GenerateStream {
    static constexpr const char* name = "generate_stream";
    static constexpr std::array<const char*, 3> fields{"source", "prompt", "max"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_stream;
    static constexpr std::size_t list_min = 0;
    HandleName source;
    Tokens prompt;
    std::int64_t max = 0;
    bool well_formed() const { return true; }
};
struct Delete {
    static constexpr const char* name = "delete";
    static constexpr std::array<const char*, 1> fields{"ids"};
    static constexpr StoreReach reach = StoreReach::replaces_named;
    static constexpr bool changes_ids = true;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    Ids ids;
    bool well_formed() const { return true; }
};
struct DeleteAll {
    static constexpr const char* name = "delete_all";
    static constexpr std::array<const char*, 0> fields{};
    static constexpr StoreReach reach = StoreReach::whole_store;
    static constexpr bool changes_ids = true;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    bool well_formed() const { return true; }
};
struct Dump {
    static constexpr const char* name = "dump";
    static constexpr std::array<const char*, 1> fields{"slot"};
    static constexpr StoreReach reach = StoreReach::whole_store;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_dump;
    static constexpr std::size_t list_min = 0;
    std::int64_t slot = 0;
    bool well_formed() const { return true; }
};
// A dump that crashes after `bytes` bytes are written.
struct DumpCrash {
    static constexpr const char* name = "dump_crash";
    static constexpr std::array<const char*, 2> fields{"slot", "bytes"};
    static constexpr StoreReach reach = StoreReach::whole_store;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_dump | needs_dump_crash;
    static constexpr std::size_t list_min = 0;
    std::int64_t slot = 0;
    std::int64_t bytes = 0;
    bool well_formed() const { return true; }
};
struct Load {
    static constexpr const char* name = "load";
    static constexpr std::array<const char*, 1> fields{"slot"};
    static constexpr StoreReach reach = StoreReach::whole_store;
    static constexpr bool changes_ids = true;
    static constexpr std::uint16_t needs = needs_dump;
    static constexpr std::size_t list_min = 0;
    std::int64_t slot = 0;
    bool well_formed() const { return true; }
};
// Flips one byte of the dump files in a slot: `offset` picks a byte class
// (header, metadata, tensor data: kvcheck/dump_bytes.h) evenly, then a
// byte of it (DumpSlots::corrupt; the report names the real byte offset).
// With truncate=1, cuts the file holding byte `offset` modulo the files'
// size to end before it.
struct Corrupt {
    static constexpr const char* name = "corrupt";
    static constexpr std::array<const char*, 3> fields{"slot", "offset", "truncate"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_dump;
    static constexpr std::size_t list_min = 0;
    std::int64_t slot = 0;
    std::int64_t offset = 0;
    std::int64_t truncate = 0;
    bool well_formed() const { return true; }
};
struct Make {
    static constexpr const char* name = "make";
    static constexpr std::array<const char*, 2> fields{"out", "cache"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    HandleName out;
    CacheSpec cache;
    bool well_formed() const { return out.value != 0; }
};
struct Clone {
    static constexpr const char* name = "clone";
    static constexpr std::array<const char*, 2> fields{"out", "source"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    HandleName out;
    HandleName source;
    bool well_formed() const { return out.value != 0 && !(out == source); }
};
struct Concat {
    static constexpr const char* name = "concat";
    static constexpr std::array<const char*, 2> fields{"out", "parts"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 1;
    HandleName out;
    HandleNames parts;
    bool well_formed() const {
        for (const HandleName& part : parts) {
            if (part == out) return false;
        }
        return out.value != 0;
    }
};
struct ToLegacy {
    static constexpr const char* name = "to_legacy";
    static constexpr std::array<const char*, 2> fields{"out", "source"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_conversions;
    static constexpr std::size_t list_min = 0;
    HandleName out;
    HandleName source;
    bool well_formed() const { return out.value != 0 && !(out == source); }
};
struct FromLegacy {
    static constexpr const char* name = "from_legacy";
    static constexpr std::array<const char*, 2> fields{"out", "source"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_conversions;
    static constexpr std::size_t list_min = 0;
    HandleName out;
    HandleName source;
    bool well_formed() const { return out.value != 0 && !(out == source); }
};
// The dump tested from outside the engine (harness/durability/dump_kill.h):
// run in a child process to its end, then again killed (SIGKILL) just
// before its counted file call number `point` modulo their count; every
// directory state the kill and a power cut may leave is loaded by a fresh
// engine in a fresh process. Run in kvcheck's process only (the children
// are forks of it); the slot then holds what the kill left.
struct DumpKill {
    static constexpr const char* name = "dump_kill";
    static constexpr std::array<const char*, 2> fields{"slot", "point"};
    static constexpr StoreReach reach = StoreReach::whole_store;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_dump | needs_dump_kill;
    static constexpr std::size_t list_min = 0;
    std::int64_t slot = 0;
    std::int64_t point = 0;
    bool well_formed() const { return true; }
};

// Ends a handle (docs/semantics.md#handles-and-release).
struct Release {
    static constexpr const char* name = "release";
    static constexpr std::array<const char*, 1> fields{"handle"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    HandleName handle;
    bool well_formed() const { return handle.value != 0; }
};

// ---- caches the model makes (docs/semantics.md#returned-caches) ----
// A chat turn: generates from `source` as `generate` does, and binds `out`
// to the cache the model wrote into (a second turn generates from it; it
// may be stored with add_handle).
struct Turn {
    static constexpr const char* name = "turn";
    static constexpr std::array<const char*, 4> fields{"out", "source", "prompt", "max"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_returned;
    static constexpr std::size_t list_min = 0;
    HandleName out;
    HandleName source;
    Tokens prompt;
    std::int64_t max = 0;
    bool well_formed() const { return out.value != 0 && !(out == source); }
};
// The store makes a memory: the model's prefill over `prompt` on a fresh
// cache, stored under id.
struct Extract {
    static constexpr const char* name = "extract";
    static constexpr std::array<const char*, 2> fields{"id", "prompt"};
    static constexpr StoreReach reach = StoreReach::replaces_named;
    static constexpr bool changes_ids = true;
    static constexpr std::uint16_t needs = needs_returned;
    static constexpr std::size_t list_min = 0;
    std::string id;
    Tokens prompt;
    bool well_formed() const { return true; }
};

// ---- stores under load ----
// Adds `count` items at once, ids i<first> to i<first + count - 1>, item k
// holding `cache` with the seed cache.seed + k: a store of many items in
// one line (a run of adds, each stored as `add` stores).
struct Fill {
    static constexpr const char* name = "fill";
    static constexpr std::array<const char*, 3> fields{"cache", "first", "count"};
    static constexpr StoreReach reach = StoreReach::whole_store;
    static constexpr bool changes_ids = true;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    static constexpr std::int64_t count_max = 1024;
    CacheSpec cache;
    std::int64_t first = 0;
    std::int64_t count = 0;
    bool well_formed() const { return first >= 0 && count >= 0 && count <= count_max; }
};
// The id of item k of a fill.
std::string fill_id(std::int64_t index);


// ---- the paged family (kvcheck/paged.h, docs/semantics.md#paged-operations) ----
// Sequences are numbered (seq=N); `salt` stands for the extra keys (0:
// none). They name no stored id and no handle: the store is not read
// around them. Each needs Capabilities::paged.
struct PagedAlloc {
    static constexpr const char* name = "paged_alloc";
    static constexpr std::array<const char*, 3> fields{"seq", "tokens", "salt"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged;
    static constexpr std::size_t list_min = 0;
    std::int64_t seq = 0;
    Tokens tokens;
    std::int64_t salt = 0;
    bool well_formed() const { return !tokens.empty(); }
};
// Decodes `count` tokens on top of a sequence.
struct PagedAppend {
    static constexpr const char* name = "paged_append";
    static constexpr std::array<const char*, 2> fields{"seq", "count"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged;
    static constexpr std::size_t list_min = 0;
    std::int64_t seq = 0;
    std::int64_t count = 1;
    bool well_formed() const { return count >= 1; }
};
struct PagedFork {
    static constexpr const char* name = "paged_fork";
    static constexpr std::array<const char*, 2> fields{"parent", "child"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged | needs_paged_fork;
    static constexpr std::size_t list_min = 0;
    std::int64_t parent = 0;
    std::int64_t child = 0;
    bool well_formed() const { return parent != child; }
};
// Ends a sequence: finished, preempted or aborted alike.
struct PagedFree {
    static constexpr const char* name = "paged_free";
    static constexpr std::array<const char*, 1> fields{"seq"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged;
    static constexpr std::size_t list_min = 0;
    std::int64_t seq = 0;
    bool well_formed() const { return true; }
};
struct PagedLookup {
    static constexpr const char* name = "paged_lookup";
    static constexpr std::array<const char*, 2> fields{"tokens", "salt"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged;
    static constexpr std::size_t list_min = 0;
    Tokens tokens;
    std::int64_t salt = 0;
    bool well_formed() const { return !tokens.empty(); }
};
struct PagedEvict {
    static constexpr const char* name = "paged_evict";
    static constexpr std::array<const char*, 0> fields{};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged;
    static constexpr std::size_t list_min = 0;
    bool well_formed() const { return true; }
};
// Run only when no sequence or pending copy holds a block (else skipped).
struct PagedReset {
    static constexpr const char* name = "paged_reset";
    static constexpr std::array<const char*, 0> fields{};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged;
    static constexpr std::size_t list_min = 0;
    bool well_formed() const { return true; }
};
// The worker boundary.
struct PagedStep {
    static constexpr const char* name = "paged_step";
    static constexpr std::array<const char*, 0> fields{};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged;
    static constexpr std::size_t list_min = 0;
    bool well_formed() const { return true; }
};
// A contiguous cache (an activation memory) becomes a sequence's blocks.
struct PagedImport {
    static constexpr const char* name = "paged_import";
    static constexpr std::array<const char*, 2> fields{"seq", "cache"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged | needs_paged_import;
    static constexpr std::size_t list_min = 0;
    std::int64_t seq = 0;
    CacheSpec cache;
    bool well_formed() const { return true; }
};
struct PagedExport {
    static constexpr const char* name = "paged_export";
    static constexpr std::array<const char*, 1> fields{"seq"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged;
    static constexpr std::size_t list_min = 0;
    std::int64_t seq = 0;
    bool well_formed() const { return true; }
};
// Drops the last `count` tokens of a sequence (a sequence keeps one at
// least): speculative decoding rejecting draft tokens, a preemption
// recomputing. The next append feeds `token` first, so the tokens written
// after it may differ from those dropped. Last in the variant: the kinds
// before it keep their indices (the fuzz corpus's choice bytes).
struct PagedRewind {
    static constexpr const char* name = "paged_rewind";
    static constexpr std::array<const char*, 3> fields{"seq", "count", "token"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_paged | needs_paged_rewind;
    static constexpr std::size_t list_min = 0;
    std::int64_t seq = 0;
    std::int64_t count = 1;
    std::int64_t token = 1;
    bool well_formed() const { return count >= 1 && token >= 0; }
};

// ---- trimming a cache the caller owns (docs/semantics.md#trimming) ----
// Cuts the cache `handle` points at to its first `keep` tokens, in place
// (transformers' DynamicCache.crop(keep), mlx-lm's trim_prompt_cache):
// speculative decoding dropping rejected draft tokens, a prompt cache
// reusing a prefix. Run only on a cache the caller owns: a stored item is
// read-only. After PagedRewind in the variant: the kinds before it keep
// their indices (the fuzz corpus's choice bytes).
struct Trim {
    static constexpr const char* name = "trim";
    static constexpr std::array<const char*, 2> fields{"handle", "keep"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_trim;
    static constexpr std::size_t list_min = 0;
    HandleName handle;
    std::int64_t keep = 1;
    bool well_formed() const { return handle.value != 0 && keep >= 1; }
};

// ---- batches (docs/semantics.md#batches) ----
// One row of a batch the caller owns: the caches `rows` (batch 1 each)
// stacked into one cache of batch rows.size(), each row repeated `repeat`
// times in place (transformers' batch_repeat_interleave), reordered by
// `reorder` when it is not empty (reorder_cache after a beam step: row j
// becomes row reorder[j]), then row `select` kept (batch_select_indices)
// and bound to `out`, a cache the caller owns.
//   h5 = batch repeat=2 reorder=3,0,1,1 select=1 h1 h2   # h5 holds h2's K/V
struct Batch {
    static constexpr const char* name = "batch";
    static constexpr std::array<const char*, 5> fields{"out", "repeat", "reorder", "select", "rows"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_batch;
    static constexpr std::size_t list_min = 1;
    HandleName out;
    std::int64_t repeat = 1;
    Tokens reorder;
    std::int64_t select = 0;
    HandleNames rows;
    // The batch's size once repeated.
    std::int64_t width() const { return static_cast<std::int64_t>(rows.size()) * repeat; }
    bool well_formed() const {
        if (out.value == 0 || rows.empty() || repeat < 1 || repeat > 8 || select < 0 || select >= width()) return false;
        for (const HandleName& row : rows) {
            if (row == out || row.value == 0) return false;
        }
        if (!reorder.empty() && static_cast<std::int64_t>(reorder.size()) != width()) return false;
        for (const std::int64_t index : reorder) {
            if (index < 0 || index >= width()) return false;
        }
        return true;
    }
    // The row of `rows` that row `select` of the result came from.
    std::size_t source_row() const {
        const std::int64_t index = reorder.empty() ? select : reorder[static_cast<std::size_t>(select)];
        return static_cast<std::size_t>(index / repeat);
    }
};

// ---- concurrent clients (docs/semantics.md#concurrent-clients) ----
// A context switch: the steps after it, up to the next switch, are client
// `lane`'s calls. A trace without one is one client's (lane 0), as every
// trace was; `kvcheck run --lanes N` draws traces of N clients
// (harness/lanes.cpp) whose switches are their schedule, so a trace file
// carries lanes and schedule and replays exactly. Calls nothing: the
// engine never sees it. Last in the variant (the kinds before it keep
// their indices).
struct SwitchLane {
    static constexpr const char* name = "switch";
    static constexpr std::array<const char*, 1> fields{"lane"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_nothing;
    static constexpr std::size_t list_min = 0;
    static constexpr std::int64_t lanes_max = 16;
    std::int64_t lane = 0;
    bool well_formed() const { return lane >= 0 && lane < lanes_max; }
};

// ---- kvcheck's clock and read leases (docs/semantics.md#leases) ----
// Drawn only for an engine that declares leases (Capabilities::lease_ttl_ms):
// their expiry reads kvcheck's virtual clock, never the wall clock, so a
// verdict does not depend on load. After SwitchLane in the variant (the
// kinds before keep their indices).
// The virtual clock advances `ms` milliseconds (Engine::advance_clock).
struct Tick {
    static constexpr const char* name = "tick";
    static constexpr std::array<const char*, 1> fields{"ms"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_leases;
    static constexpr std::size_t list_min = 0;
    static constexpr std::int64_t ms_max = 1000 * 1000;
    std::int64_t ms = 1;
    bool well_formed() const { return ms >= 1 && ms <= ms_max; }
};
// A read lease on the stored entry `id` (LMCache's L1Manager.reserve_read):
// live for the declared TTL from now; while live the entry is not removed
// or replaced. Refused when nothing is stored under `id`.
struct Lease {
    static constexpr const char* name = "lease";
    static constexpr std::array<const char*, 1> fields{"id"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_leases;
    static constexpr std::size_t list_min = 0;
    std::string id;
    bool well_formed() const { return true; }
};
// One read lease on `id` given back (LMCache's finish_read). Refused when
// `id` holds no live lease (none taken, all given back, or expired).
struct Unlease {
    static constexpr const char* name = "unlease";
    static constexpr std::array<const char*, 1> fields{"id"};
    static constexpr StoreReach reach = StoreReach::named;
    static constexpr bool changes_ids = false;
    static constexpr std::uint16_t needs = needs_leases;
    static constexpr std::size_t list_min = 0;
    std::string id;
    bool well_formed() const { return true; }
};

}  // namespace op

using Op = std::variant<op::Add, op::AddHandle, op::Get, op::GetByIds, op::GetAll, op::GetCache,
                        op::Generate, op::GenerateStream, op::Delete, op::DeleteAll, op::Dump,
                        op::DumpCrash, op::Load, op::Corrupt, op::Make, op::Clone, op::Concat,
                        op::ToLegacy, op::FromLegacy, op::Release, op::DumpKill,
                        op::Turn, op::Extract, op::Fill,
                        // the paged family
                        op::PagedAlloc, op::PagedAppend, op::PagedFork, op::PagedFree, op::PagedLookup,
                        op::PagedEvict, op::PagedReset, op::PagedStep, op::PagedImport, op::PagedExport,
                        op::PagedRewind,
                        // trimming (after the paged family: the kinds before keep their indices)
                        op::Trim,
                        // concurrent clients
                        op::SwitchLane,
                        // kvcheck's clock and read leases (after SwitchLane: the kinds before keep their indices)
                        op::Tick, op::Lease, op::Unlease,
                        // batches (after the rest: the kinds before keep their indices)
                        op::Batch>;
using Trace = std::vector<Op>;

inline constexpr std::size_t op_kind_count = std::variant_size_v<Op>;

namespace detail {
// Printed as name=value, by the op's `fields` name.
template <typename T>
inline constexpr bool is_named_v = std::is_same_v<T, std::int64_t> || std::is_same_v<T, Tokens>;
// Any number of words; only the last field may be one.
template <typename T>
inline constexpr bool is_variable_v = std::is_same_v<T, Ids> || std::is_same_v<T, HandleNames>;
// Optional, and only last: left out when it has its default.
template <typename T>
inline constexpr bool is_optional_v = std::is_same_v<T, MetaSeed>;
template <typename T>
inline constexpr bool is_field_type_v = is_named_v<T> || is_variable_v<T> || is_optional_v<T> ||
                                        std::is_same_v<T, HandleName> || std::is_same_v<T, std::string> ||
                                        std::is_same_v<T, CacheSpec>;

// An op whose first field is named "out" creates that handle: "h2 = get a".
template <typename O>
constexpr bool has_out() {
    if constexpr (O::fields.size() == 0) {
        return false;
    } else {
        return std::string_view(O::fields[0]) == "out";
    }
}

template <typename T, typename... Alternatives>
constexpr std::size_t index_in(const std::variant<Alternatives...>*) {
    constexpr bool matches[] = {std::is_same_v<T, Alternatives>...};
    for (std::size_t i = 0; i < sizeof...(Alternatives); ++i) {
        if (matches[i]) return i;
    }
    return sizeof...(Alternatives);
}
}  // namespace detail

// The variant index of an operation type: op_kind<op::Add>() == 0.
template <typename T>
constexpr std::size_t op_kind() {
    constexpr std::size_t index = detail::index_in<T>(static_cast<const Op*>(nullptr));
    static_assert(index < op_kind_count, "not an operation type");
    return index;
}

const char* op_name(const Op& op);

// The traits of an operation (see "operation traits" above), by value or by
// variant index.
StoreReach op_reach(const Op& op);
bool op_changes_ids(const Op& op);
std::uint16_t op_needs(std::size_t kind);
bool op_well_formed(const Op& op);
// Does an engine with `capabilities` support what `needs` asks, a cache of
// this spec (its layout, dtype and odd layers), every cache an operation
// names?
bool engine_supports(const Capabilities& capabilities, std::uint16_t needs);
bool engine_supports(const Capabilities& capabilities, const CacheSpec& spec);
bool engine_supports(const Capabilities& capabilities, const Op& op);
const char* op_kind_name(std::size_t kind);  // by variant index

// The handle an operation creates (0 when it creates none).
std::int64_t created_handle(const Op& op);

bool operator==(const Op& a, const Op& b);
inline bool operator!=(const Op& a, const Op& b) { return !(a == b); }
// Op and Trace are std types whose alternatives live in kvcheck::op, so
// argument-dependent lookup searches kvcheck::op, never kvcheck; without these
// using-declarations `trace == trace` (and `op == op` outside namespace
// kvcheck) would pick std::variant's operators, which need an operator== on
// every op struct, and fail to compile.
namespace op {
using kvcheck::operator==;
using kvcheck::operator!=;
}  // namespace op

std::size_t hash_op(const Op& op);

// Throws std::invalid_argument for an operation the text cannot carry: an
// id outside [A-Za-z0-9_.-]+, a negative handle, an invalid cache spec.
std::string format_op(const Op& op);
std::string format_trace(const Trace& trace);  // one op per line, trailing newline

// Parse errors name the line and what is wrong.
class TraceParseError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

Op parse_op(const std::string& line);  // one line, without comment
Trace parse_trace(const std::string& text);

}  // namespace kvcheck
