// Transitions: one per operation, each calls the engine and brings the
// auditor's expected state along, and returns the fact its checks judge
// (harness/checkers/checker.h). No transition judges anything.
//
// An operation the expected state cannot follow is skipped (nullopt): one
// naming a handle nobody made, or a handle whose content a model may have
// written into, or a source of the wrong layout; an operation whose cache
// holds no sensible generation (keys and values of different lengths); a
// merge of caches of different geometries (a trace has one geometry; only
// a hand-written or half-shrunk one mixes them).
#pragma once

#include "auditor/auditor.h"
#include "checkers/checker.h"
#include "kvcheck/executor.h"
#include "run/dump_slots.h"
#include "run/readings.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <variant>

namespace kvcheck {

using Fact = std::variant<std::monostate, checkers::Made, checkers::Generated, checkers::Loaded, checkers::GotByIds,
                          checkers::GotAll, checkers::DumpKilled, checkers::Paged, checkers::Trimmed,
                          checkers::Leased>;

class Transitions {
  public:
    // `fresh_layout`: the layout of a cache the engine starts itself, as
    // generation with no cache does (kvcheck/domain.h). `fresh_engine`:
    // makes the fresh engines dump_kill loads with (unset: dump_kill is
    // skipped).
    Transitions(Engine& engine, Auditor& auditor, Readings& readings, DumpSlots& slots, Coverage& coverage,
                Layout fresh_layout, std::function<std::shared_ptr<Engine>()> fresh_engine = nullptr)
        : engine_(engine), audit_(auditor), readings_(readings), slots_(slots), coverage_(coverage),
          fresh_layout_(fresh_layout), fresh_engine_(std::move(fresh_engine)) {}

    std::optional<Fact> apply(const Op& operation);
    // The copies the operation just applied makes, by its semantics (the
    // run fills in what the engine logged).
    const checkers::Copies& copies_expected() const { return copies_; }
    // What a store with a declared capacity evicted in the operation just
    // applied, when it stored items (docs/semantics.md#declared-store-contracts).
    const std::optional<checkers::Evicted>& evicted() const { return evicted_; }

  private:
    // One per operation type, each defined in transitions.cpp: an operation
    // without one does not link.
    template <typename O>
    std::optional<Fact> apply(const O& op);

    // `out` != 0: a turn, which binds out to the cache the model wrote into.
    std::optional<Fact> generate(const HandleName& source, const Tokens& prompt, std::int64_t max, bool stream,
                                 std::int64_t out = 0);
    void bind_returned(checkers::Generated& fact, std::optional<ObjectId> source, std::int64_t out);
    std::optional<Fact> convert(std::int64_t source, std::int64_t out, Layout from);
    // get_cache of ids that exist, none holding tokens: what the engine
    // gave (none, or an empty cache) bound to the handle.
    void bind_tokenless(const op::GetCache& op, checkers::Made& fact);
    // A live handle whose object is known, or nullopt; `holds_none` tells a
    // handle that holds no cache (or h0) from one that cannot be followed.
    std::optional<ObjectId> known_source(std::int64_t handle, bool* holds_none) const;
    // The operation makes `count` copies of `content`'s K/V.
    // `count` copies of `object`'s K/V (under a window: from what it shows to all of it).
    void expect_copies_of(std::string what, std::size_t count, ObjectId object);
    void expect_copies(std::string what, std::size_t count, std::int64_t bytes);
    void refused_copies(std::string what);
    void count_layout(Layout layout);
    void count_reuse();
    void count_content(const CacheContent& content);
    void count_copy_of(const CacheContent& content);
    void count_merge(bool mixed, bool refused);
    // A bounded store (Capabilities::policy): an operation that stores
    // items begins an Evicted fact (begin_stores), stores each item
    // (store_item: the engine's `call`, the auditor's `follow`, then the
    // entries the engine no longer lists let go; false when a store that
    // never evicts refused it), and ends it (settle_evictions). Unbounded:
    // store_item calls and follows, nothing more.
    void begin_stores(std::string what);
    bool store_item(const std::string& id, std::int64_t bytes, const std::function<void()>& call,
                    const std::function<void()>& follow);
    void settle_evictions();
    void use(const std::string& id);  // a stored id handed out: its recency

    Engine& engine_;
    Auditor& audit_;
    Readings& readings_;
    DumpSlots& slots_;
    Coverage& coverage_;
    Layout fresh_layout_;
    checkers::Copies copies_;
    std::optional<checkers::Evicted> evicted_;
    // For the shape counts: ids deleted so far, and the spec each id added
    // from a spec holds.
    std::set<std::string> deleted_ids_;
    std::map<std::string, CacheSpec> added_specs_;
    std::function<std::shared_ptr<Engine>()> fresh_engine_;
    // The paged family (run/paged_transitions.cpp): the sequences alive,
    // and what each must hold.
    struct PagedSequence {
        std::optional<CacheContent> imported;  // only imported (and forked): exactly this
        bool computed = true;                  // every token known: the model's K/V on them
        std::int64_t salt = 0;                 // its request's extra keys (a fork's: its parent's)
    };
    std::map<std::int64_t, PagedSequence> paged_sequences_;
    template <typename Call>
    std::optional<Fact> run_paged(checkers::Paged fact, bool may_refuse, Call&& call);
    // Read leases (run/lease_transitions.cpp, docs/semantics.md#leases):
    // kvcheck's virtual clock, and per stored id the leases it holds (as
    // LMCache's TTLLock: a count, and one expiry every lease moves to now +
    // TTL). A record of an entry that left the store is let go; an expired
    // one is kept (it names the expiry a refusal ignored).
    struct LeaseRecord {
        std::int64_t count = 0;
        std::int64_t until_ms = 0;
        bool live(std::int64_t now_ms) const { return count > 0 && now_ms < until_ms; }
    };
    std::int64_t clock_ms_ = 0;
    std::map<std::string, LeaseRecord> leases_;
    // With leases declared: the operation run as any is, then judged by
    // the leases on the entries it would remove or replace.
    std::optional<Fact> apply_under_leases(const Op& operation);
    std::vector<std::string> replaced_ids(const Op& operation) const;
    std::int64_t lease_ttl_ms() const { return readings_.capabilities().lease_ttl_ms; }
};

// The paged transitions (run/paged_transitions.cpp).
template <> std::optional<Fact> Transitions::apply(const op::PagedAlloc& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedAppend& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedFork& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedFree& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedLookup& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedEvict& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedReset& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedStep& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedImport& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedExport& op);
template <> std::optional<Fact> Transitions::apply(const op::PagedRewind& op);
// A context switch between clients (run/lane_transitions.cpp).
template <> std::optional<Fact> Transitions::apply(const op::SwitchLane& op);
// kvcheck's clock and read leases (run/lease_transitions.cpp).
template <> std::optional<Fact> Transitions::apply(const op::Tick& op);
template <> std::optional<Fact> Transitions::apply(const op::Lease& op);
template <> std::optional<Fact> Transitions::apply(const op::Unlease& op);

}  // namespace kvcheck
