// The checker interface: one checker per property (harness/checkers/<name>.cpp),
// fed facts by the run (harness/run/) and judging them, nothing else. A
// checker never calls an operation of the engine; it reads what it needs
// through the Probe, which caches every reading for the step, and records a
// violation of its own property only.
//
// The facts, and when the run delivers them:
//   Made        an operation bound a handle to a cache (get, get_cache,
//               clone, concat, make, conversions) or stored one back
//               (add_handle), right after the operation;
//   Generated   a generation ran (generate, generate_stream);
//   Loaded      a load ran (its outcome and what the slot may hold);
//   DumpKilled  a dump ran in a child process, to its end and killed at a
//               point; each state a crash may leave was loaded by a fresh
//               engine in a fresh process (harness/durability/);
//   GotByIds,
//   GotAll      the store answered a listing request;
//   Copies      the copies an operation logged (after every operation, when
//               the copy log is read);
//   EntryFact   a stored entry was read: the entries a step names or
//               reaches, and every entry at a full read;
//   listing     the store's ids are due for comparison (after a change of
//               membership, and at every full read);
//   HandleFact  a live handle is to be checked against the store's storage
//               (the handles a step names or reaches, all at a full read);
//   Evicted     a store with a declared capacity stored items (add,
//               add_handle, extract, fill): what it evicted, against
//               what its declared policy evicts, right after the operation;
//   Trimmed     a cache the caller owns was trimmed in place (trim), right
//               after the operation;
//   Leased      with leases declared: a tick, lease or unlease, or an
//               operation that would remove or replace an entry holding a
//               lease (live or expired): whether the engine refused it and
//               whether it had to, right after the operation;
//   Paged       a paged operation ran (the paged family, kvcheck/paged.h):
//               the pool as the engine reported it before and after.
// What each property asserts: docs/semantics.md#properties.
//
//   class MyChecker final : public Checker {
//     public:
//       MyChecker() : Checker(Property::single_copy) {}
//       void generated(const Generated& g, Probe& probe) override { expect(probe, g.copies == 1, [&] { return "..."; }); }
//   };
#pragma once

#include "auditor/auditor.h"
#include "kvcheck/engine.h"
#include "kvcheck/paged.h"
#include "kvcheck/properties.h"
#include "kvcheck/trace.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace kvcheck {

// What the run knows of one stored entry (harness/run/readings.h); checkers
// hold it only to pass it back to the Probe.
struct EntryReading;

namespace checkers {

// ---- facts -------------------------------------------------------------------

// The operation that made a handle, as the checks name it.
enum class MadeBy : std::uint8_t { get, get_cache, clone, concat, make, to_legacy, from_legacy, stored_back, batch };

struct Made {
    MadeBy by = MadeBy::make;
    std::int64_t out = 0;               // the handle made (stored_back: the handle stored)
    std::optional<ObjectId> object;     // what it must hold; none: no cache
    std::vector<std::int64_t> sources;  // clone, concat, batch: the handles it was made from
    std::string how;                    // batch: the operation, as messages name it
    std::string id;                     // get, stored_back: the id
    std::size_t ids = 0;                // get_cache: how many ids were asked for
    bool merged = false;                // get_cache, concat: of several parts
    // get_cache of ids that exist but of which none holds tokens: none is
    // right, and so is a new cache holding no K/V and sharing nothing with
    // the store (docs/semantics.md#store). `object`, when the engine gave
    // a cache, is built from its view.
    bool tokenless = false;
    // get_cache, concat of parts of different dtypes that the engine
    // refused: its error. The handle must then hold nothing, and the store
    // must be as it was (the run reads all of it after the step).
    std::optional<std::string> refused;
};

struct Generated {
    std::int64_t source = 0;  // the handle generated from; 0: no cache
    bool stream = false;
    bool owned = false;       // the source was an owned copy: no copy is due
    CacheContent fresh;       // what a fresh deep copy of the source holds
    // The tokens the model was fed on top of `fresh` when the source is a
    // cache it made (docs/semantics.md#returned-caches): a fresh copy
    // generates over them and the prompt.
    Tokens history;
    Tokens prompt;
    std::int64_t max = 0;
    GenerateResult result;
    // The K/V sets alive while the model ran: at most the source's copy
    // chain plus the boundary's copy; at least those of them the trace
    // still references (the engine may keep more alive, never fewer).
    std::int64_t sets_min = 0;
    std::int64_t sets_max = 0;
    // turn: the handle of the cache the model wrote into, and what it must
    // hold (the engine's fed_view of `fresh` fed history, prompt and every
    // generated token but the last).
    std::int64_t returned = 0;
    std::optional<ObjectId> returned_object;
};

// trim (docs/semantics.md#trimming): the cache `handle` points at was cut
// to its first `keep` tokens; `object` is what it must hold now (the
// auditor's content cut, or for a cache the model made, the engine's
// fed_view of what it started from fed the tokens kept).
struct Trimmed {
    std::int64_t handle = 0;
    ObjectId object = 0;
    std::int64_t keep = 0;
    std::int64_t tokens_before = 0;  // the most tokens a slot held before the cut
};

// A call judged by its leases (docs/semantics.md#leases): whether the
// engine refused it (`refused`: its error) against whether it had to
// (`refusal_due`), `why` saying which lease on which entry, on kvcheck's
// virtual clock at `now_ms`.
struct Leased {
    std::string what;
    std::int64_t now_ms = 0;
    bool refusal_due = false;
    std::string why;
    std::optional<std::string> refused;
};

// The copies an operation logged (Engine::take_copies, read right after
// it), against those its semantics make: between `min` and `max` copies,
// each of `bytes` bytes of K/V (when known). Delivered after every
// operation when the copy log is read.
struct Copies {
    std::string what;  // the operation, as messages name it: "clone h1 -> h2"
    std::vector<CopyRecord> logged;
    std::size_t min = 0;
    std::size_t max = 0;
    std::optional<std::int64_t> bytes;
    // docs/semantics.md#store-windows: a windowed engine's copy holds at
    // least the K/V the cache shows (these bytes) and at most all of it
    // (`bytes`; none: unknown, for a cache the model made).
    std::optional<std::int64_t> bytes_shown;
};

struct Loaded {
    std::int64_t slot = 0;
    LoadResult result;
    DumpSlot expected;         // what the slot could hold when the load ran
    bool matched = false;      // a successful load gave one of the stores the slot may hold
    std::string difference;    // otherwise: how the loaded store differs from the last of them
};

// One directory a crash during or after a dump may leave, loaded by a fresh
// engine in a fresh process.
struct CrashLoad {
    std::string state;          // what the directory is and how a crash left it
    bool after_return = false;  // the crash came after dump returned: only the new store may load
    LoadResult result;          // the fresh engine's load
    bool matched = false;       // a successful load gave a store the state may hold
    std::string difference;     // otherwise: how it differs from the new store
    // Temporaries of a dump in the state the load ran on: no finding of
    // their own, named in the message of a load they may have changed.
    std::vector<std::string> leftovers;
    std::string changed_by_failure;      // the failed load, repeated on a loaded store, changed it: how
};

struct DumpKilled {
    std::int64_t slot = 0;
    std::string kill;    // "killed before call 3 of 7, after fsync ..."; empty: the dump made no counted call
    DumpSlot expected;   // what the slot could hold before the dump
    std::vector<CrashLoad> loads;
    std::string unfollowed;          // the power-cut model cannot follow this dump: why (nothing was loaded)
};

// A store with a declared capacity (Capabilities::policy) stored items,
// one after the other: per item, the entries it no longer listed after it,
// of those it held or was given, against what its policy evicts
// (docs/semantics.md#declared-store-contracts). The auditor has followed
// the engine: the entries gone are gone from it too.
struct Evicted {
    struct Store {
        std::string id;                  // the item stored
        bool refused = false;            // the engine refused it (its error was caught: refusal_due, or leases declared)
        // Policy none past its capacity, or no room but by evicting the item
        // itself while entries under a live lease stay (docs/semantics.md#leases).
        bool refusal_due = false;
        bool over = false;               // with it, the store would exceed its capacity
        std::size_t items_before = 0;    // entries, and K/V bytes, held with it, before any eviction
        std::int64_t bytes_before = 0;
        std::vector<std::string> gone;   // the ids the engine no longer lists after it, in the store's order
        std::vector<std::string> due;    // lru, fifo: the ids the policy evicts for it, in order
    };
    std::string what;                     // the operation, as messages name it: "add \"a\"", "fill i0..i63"
    StorePolicy policy;
    std::vector<std::string> handed_out;  // ids a live handle held before the operation
    std::vector<std::string> leased;      // ids under a live lease before it: never evicted
    std::vector<Store> stores;
    std::size_t items_after = 0;          // entries, and K/V bytes, held after the operation
    std::int64_t bytes_after = 0;
};

struct GotByIds {
    Ids ids;
    std::vector<std::optional<std::string>> found;
};

struct GotAll {
    std::vector<std::string> ids;
};

// A stored entry being read.
struct EntryFact {
    const std::string& id;
    ObjectId expected;
    EntryReading& reading;
    bool full_read = false;  // every entry is being read
};

// A live handle to check against the storage of the stored entries (and,
// at a full read, of every other live handle).
struct HandleFact {
    std::int64_t handle = 0;
    ObjectId object = 0;
    bool full_read = false;
};

// What the engine reports of a handle, read once per step. Whether it is
// owned is Probe::owned's to say (the engine's marker, or derived).
struct HandleReading {
    bool exists = false;
    std::vector<std::uint64_t> storage;
};

// A paged operation, with the pool before and after it
// (docs/semantics.md#paged-caches).
enum class PagedBy : std::uint8_t { alloc, append, fork, free, lookup, evict, reset, step, import, exported, rewind };

struct Paged {
    PagedBy by = PagedBy::step;
    std::string what;                    // the operation, as messages name it: "paged_alloc seq=1 tokens=1,2 salt=0"
    std::int64_t seq = 0;                // alloc, append, free, import, export, rewind; fork: the child
    std::int64_t parent = 0;             // fork
    Tokens tokens;                       // alloc, lookup
    std::int64_t salt = 0;               // alloc, lookup; export: the sequence's request's
    std::optional<std::string> refused;  // alloc, append, fork, import, rewind: the engine's refusal
    std::int64_t dropped = 0;            // rewind: the tokens asked dropped (count)
    std::int64_t cached = 0;             // alloc, lookup: the tokens reported cached
    Tokens appended;                     // append: the tokens decoded
    // append: what decoding the sequence's exported cache gave before it
    // (PagedEngine::paged_decode_exported), when the engine offers it.
    std::optional<Tokens> decoded_exported;
    std::int64_t blocks = 0;             // the pool's blocks, the null block included (N)
    PagedState before;
    PagedState after;
    // export: what the engine gave, and what the sequence must hold: the
    // imported content (a sequence only imported, forked or not), or the
    // model's K/V on its tokens (`computed`: every token known).
    std::optional<PagedExported> exported;
    std::optional<CacheContent> imported;
    bool computed = false;
};

// ---- what a checker may read ---------------------------------------------

class Probe {
  public:
    virtual ~Probe() = default;

    virtual Engine& engine() = 0;
    virtual Auditor& auditor() = 0;
    virtual const Capabilities& capabilities() const = 0;

    // The index of the step being run or read.
    virtual std::size_t step() const = 0;
    // Is `property` checked in this run and not violated yet at this step?
    virtual bool checking(Property property) const = 0;
    virtual void fail(Property property, std::string message) = 0;
    // The adapter contradicts itself (two of its reports disagree).
    virtual void engine_error(std::string message) = 0;

    virtual const HandleReading& handle(std::int64_t handle) = 0;
    // Is the cache of `handle` owned? With Capabilities::owned_marker, the
    // engine's marker; without, derived (docs/semantics.md#ownership): it
    // exists and shares no storage identity with any stored entry, as the
    // store is after the step's operation. The one place "owned" is read.
    virtual bool owned(std::int64_t handle) = 0;
    // How the cache of `handle` differs from `expected`'s view; empty when it
    // does not (or when the adapter's digest and view disagree: an engine error).
    virtual std::string handle_difference(std::int64_t handle, ObjectId expected) = 0;
    // The same for a stored entry.
    virtual std::string entry_difference(const EntryFact& entry) = 0;
    // The stored entry's marker; without Capabilities::owned_marker false,
    // unasked (a stored entry is a stored object: never owned).
    virtual bool entry_owned(const EntryFact& entry) = 0;
    // The first stored entry, in insertion order, that shares storage with
    // `handle` although the handle's object may not alias it.
    virtual std::optional<std::string> aliased_entry(const HandleFact& handle) = 0;
    // Another live handle that shares storage with `handle` although
    // neither's object may alias the other's (asked at full reads).
    virtual std::optional<std::int64_t> handle_sharing(const HandleFact& handle) = 0;
    // Another stored entry, holding another object, that shares storage with
    // `entry` (as far as the entries read so far tell).
    virtual std::optional<std::string> entry_sharing(const EntryFact& entry) = 0;
    // The ids the engine lists, read once per round.
    virtual const std::vector<std::string>& listed() = 0;
    // How the engine's whole store differs from the expected one (ids in
    // any order, then each entry's content); empty when it does not.
    virtual std::string store_difference() = 0;
};

// ---- checkers --------------------------------------------------------------

// What a checker reads of the engine beyond an operation's own result: the
// run reads the store, the handles' storage and the copy log only for the
// checkers that read them.
struct Reads {
    bool entry_content = false;    // stored entries' views
    bool entry_marker = false;     // stored entries' owned markers
    bool listing = false;          // the ids the store lists
    bool handle_aliasing = false;  // handles against the stored entries' storage
    bool copy_log = false;         // the copies each operation logged
};

class Checker {
  public:
    explicit Checker(Property property) : property_(property) {}
    virtual ~Checker() = default;
    Property property() const { return property_; }
    virtual Reads reads() const { return {}; }

    virtual void made(const Made&, Probe&) {}
    virtual void generated(const Generated&, Probe&) {}
    virtual void loaded(const Loaded&, Probe&) {}
    virtual void dump_killed(const DumpKilled&, Probe&) {}
    virtual void got_by_ids(const GotByIds&, Probe&) {}
    virtual void got_all(const GotAll&, Probe&) {}
    virtual void copies(const Copies&, Probe&) {}
    virtual void entry(const EntryFact&, Probe&) {}
    virtual void listing(bool full_read, Probe&) {}
    virtual void handle(const HandleFact&, Probe&) {}
    virtual void paged(const Paged&, Probe&) {}
    virtual void trimmed(const Trimmed&, Probe&) {}
    virtual void leased(const Leased&, Probe&) {}
    virtual void evicted(const Evicted&, Probe&) {}
    // Every operation run (not skipped), after its facts: a checker that
    // follows the trace itself (linearizable, which groups calls into
    // requests by lane).
    virtual void called(const Op&, Probe&) {}

  protected:
    bool checking(const Probe& probe) const { return probe.checking(property_); }
    void fail(Probe& probe, std::string message) const {
        if (checking(probe)) probe.fail(property_, std::move(message));
    }
    // Records a violation when `ok` is false; the message is made only then
    // (the checks of every step pass nearly always, and their texts cost
    // more than their comparisons). Returns ok.
    template <typename MakeMessage>
    bool expect(Probe& probe, bool ok, MakeMessage&& message) const {
        if (!ok && checking(probe)) probe.fail(property_, message());
        return ok;
    }

  private:
    Property property_;
};

// Makes the checker of one property; each checker file defines its own.
template <Property P>
std::unique_ptr<Checker> make_checker();

// Every property's checker, in property order (checkers/registry.cpp).
std::vector<std::unique_ptr<Checker>> make_checkers();

// ---- shared by several checkers -----------------------------------------------

std::string in_quotes(const std::string& id);
std::string handle_text(std::int64_t handle);
std::string tokens_text(const std::vector<std::int64_t>& tokens);
std::string id_list(const std::vector<std::string>& ids);
std::string metadata_text(const Metadata& metadata);  // {source=doc-3, turn=7}
// "generate from h3", "generate_stream from no cache".
std::string generation_text(const Generated& generation);
// How the ids a store lists differ from the expected ones (in order when
// `ordered`); empty when they do not.
std::string ids_difference(const std::vector<std::string>& listed, const std::vector<std::string>& expected, bool ordered);

// Where a view holds K/V, "layer 0 keys holds [1, 2, 3, 4]"; empty when no
// slot holds an element.
std::string kv_held(const CacheView& view);

// The first of `sources` whose storage `out` shares, if any (needs the
// engine's storage identities).
std::optional<std::int64_t> shared_source(Probe& probe, std::int64_t out, const std::vector<std::int64_t>& sources);

// ---- linearizable's model and search (checkers/linearizable.cpp): one
// search for the operation level's requests (steps) and the thread
// level's overlapping calls (harness/threads.cpp: lines of its history) ----

// A request of a store client, from its first step (invocation) to its
// last (response). Steps are comparable within one history only.
struct StoreRequest {
    enum class Kind : std::uint8_t {
        write,  // add: `object` stored under ids[0]
        erase,  // delete of `ids`
        read,   // get_cache of ids[0]: the copy it got (`copy`, its digest), its first generation
        whole,  // the whole store read at once (a dump read back, the store at a quiescent point): `held`
    };
    std::int64_t lane = 0;
    std::size_t first = 0;
    std::size_t last = 0;
    bool ended = false;
    Kind kind = Kind::write;
    Ids ids;
    std::optional<ObjectId> object;
    std::int64_t handle = 0;
    std::optional<std::uint64_t> copy;
    bool generated = false;
    Tokens prompt;
    std::int64_t max = 0;
    Tokens tokens;
    std::map<std::string, std::uint64_t> held;  // whole: each id it holds, and its content digest
    std::string what;                           // whole: what read it ("lane 2's dump")
};

// What the model knows of the objects writes store: whether one holds
// tokens, the digest of its expected view, and what the engine's model
// generates on it (memoized by the implementer).
class StoreModel {
  public:
    virtual ~StoreModel() = default;
    virtual bool holds_tokens(ObjectId object) = 0;
    virtual std::uint64_t digest(ObjectId object) = 0;
    virtual const Tokens& fresh(ObjectId object, const Tokens& prompt, std::int64_t max) = 0;
};

// Requests past this many are not judged (the search's memo key is a bit set).
constexpr std::size_t linearizable_requests_max = 64;

// Wing and Gong's search, memoized as Lowe's: is there an order of
// `requests` (all ended, at most linearizable_requests_max), each placed at
// one point between its first and last step, keeping the order of requests
// that do not overlap, whose reads and whole readings fit the state the
// writes before them made (the store empty at the start)? Nothing when
// there is; else the index of a read or whole reading that fitted no state
// in a deepest order tried. With `policy` bounded (items, evicted lru,
// fifo or lrs; else std::invalid_argument), a write past the capacity
// evicts as the policy says, in the order its uses made (under lru a read
// is a use: it is placed where its get_cache ran).
std::optional<std::size_t> linearization_stuck(const std::vector<const StoreRequest*>& requests, StoreModel& model,
                                               const StorePolicy& policy = {});
// "lane 2's read of \"a\" (steps 4 to 9) got a copy of content 0123... and generated [3, 4]"
// (`unit` "steps" or "lines"; numbered from 1).
std::string store_request_text(const StoreRequest& request, const char* unit);
// The requests of other lanes that began inside `request`: "add \"a\" at step 5 (lane 3), ...", or "none".
std::string requests_inside(const std::vector<StoreRequest>& all, const StoreRequest& request, const char* unit);

// The paged family's helpers (checkers/paged_util.cpp).
// "block 3 (count 2, key [1 2], tokens [1 2], 2 written)".
std::string block_text(const PagedState& state, std::int64_t block);
// The pool's whole-state invariants, as they hold at any point between
// calls whatever order the calls ran in (the thread level's quiescent
// checks, harness/threads.cpp): what is wrong, or nothing.
// refcount-exact: each block's count is its tables plus its pending copies.
std::optional<std::string> refcount_wrong(const PagedState& state);
// free-iff-unreferenced: a block is in the free queue once when its count is 0, else never.
std::optional<std::string> free_queue_wrong(const PagedState& state);
// How many tables hold `block`, and how many pending copies read it.
std::int64_t tables_holding(const PagedState& state, std::int64_t block);
std::int64_t copies_reading(const PagedState& state, std::int64_t block);
bool in_free_queue(const PagedState& state, std::int64_t block);
// Whether `block` is the last block a successful rewind kept, held alone
// before it and cut (its tokens changed).
bool cut_by_rewind(const Paged& fact, std::int64_t block);
// Whether a successful rewind released `block` (only the table positions
// it dropped held it, and no pending copy read it: it was free once they
// were released) and took it back as the target of the copy of its kept
// last block: a new block (with a LIFO free list, the one freed last is
// taken first), not the one it was.
bool retaken_by_rewind(const Paged& fact, std::int64_t block);
// Whether, with a sliding window, the operation released `block` behind a
// window (every table position holding it before holds the null block
// after it, and no pending copy read it: it was free once released) and
// took it back at another position: a new block, not the one it was (vLLM's
// allocate_slots releases the blocks behind the window before it takes
// new ones, and an unhashed block released goes to the front of the queue).
bool retaken_behind_window(const Paged& fact, std::int64_t block);
// `block` of `state`, or null when the state has no such block (below 1, or
// past its own pool: an engine may report a pool that changed size, so a
// block of one state is looked up in that state, never by another's size).
const PagedBlock* block_in(const PagedState& state, std::int64_t block);
// Sliding windows (docs/semantics.md#sliding-windows): how many leading
// positions of the sequence's table lie wholly before its next token's
// window, (L - W + 1) / B for L tokens and a window of W (0 without a
// window, or for a sequence the state does not hold): the null block may
// stand there, and the content is compared only after them.
std::int64_t blocks_behind_window(const PagedState& state, std::int64_t seq);
// With a window: the K/V of each of the sequence's blocks inside its window
// (from blocks_behind_window on; the last one's filled slots) against the
// engine's model on `tokens` under `salt` at those positions; "" when every
// one is equal, else the first difference, naming the block.
std::string window_difference(PagedEngine& paged, const PagedState& state, std::int64_t seq, const Tokens& tokens,
                              std::int64_t salt);

}  // namespace checkers
}  // namespace kvcheck
