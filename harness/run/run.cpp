// The run: one trace against one engine. Each step runs its transition
// (harness/run/transitions.cpp), hands the fact to every checker
// (harness/checkers/), and reads the store on the schedule below, handing
// each reading to the checkers too.
//
// What is read when. The checks of an operation's own result (the cache it
// made, the copies it logged, the tokens it generated) run at its step,
// always. The stored entries are read on a schedule that follows what an
// operation can reach (its traits, kvcheck/trace.h), so that a step costs
// what it touches, not what the store holds:
// - after a step: the entries it names, and the entries that share storage
//   with a handle it names (before or after it ran: that is how a model's
//   in-place write reaches the store); the ownership of the handles it
//   names; the listing, while the store is small (listing_every_step_max);
// - before a step that replaces or removes the entries it names, those
//   entries, so that a change is not wiped before it is seen;
// - every entry, the listing and every handle ("a full read"): before and
//   after a step that reads or replaces the whole store, every
//   max(sweep_steps_min, entries) steps, and at the end of the run, then
//   without entry versions.
// A change no handle can reach (an engine writing into an entry it was not
// asked about) is therefore found at the next full read, at a later step
// than it happened; RunOptions::every_entry_every_step reads everything
// after every step instead and pins it to its step. Without storage
// identities no handle can be traced to the entries it reaches, and every
// step is a full read.
#include "kvcheck/executor.h"

#include "run/readings.h"
#include "run/transitions.h"
#include "run/verdicts.h"

#include <boost/pfr.hpp>

#include <algorithm>
#include <type_traits>

namespace kvcheck {
namespace {

// A full read at least this often (in steps), and once per entry in a big
// store: a change no handle reaches is found within that many steps.
constexpr std::size_t sweep_steps_min = 16;
// Up to this many entries the listing is compared after every step that may
// change it; beyond, at full reads (listing a thousand ids costs more than
// the operation).
constexpr std::size_t listing_every_step_max = 64;

template <typename T>
void add_unique(std::vector<T>& list, const T& value) {
    if (std::find(list.begin(), list.end(), value) == list.end()) list.push_back(value);
}

// The ids and handles an operation names (never h0), from its fields.
struct Named {
    std::vector<std::string> ids;
    std::vector<std::int64_t> handles;
};

Named named_by(const Op& operation) {
    Named named;
    std::visit(
        [&named](const auto& o) {
            boost::pfr::for_each_field(o, [&named](const auto& field) {
                using F = std::decay_t<decltype(field)>;
                if constexpr (std::is_same_v<F, std::string>) {
                    add_unique(named.ids, field);
                } else if constexpr (std::is_same_v<F, Ids>) {
                    for (const std::string& id : field) add_unique(named.ids, id);
                } else if constexpr (std::is_same_v<F, HandleName>) {
                    if (field.value != 0) add_unique(named.handles, field.value);
                } else if constexpr (std::is_same_v<F, HandleNames>) {
                    for (const HandleName& handle : field) {
                        if (handle.value != 0) add_unique(named.handles, handle.value);
                    }
                }
            });
        },
        operation);
    return named;
}

// The checkers of the properties checked, in property order.
std::vector<std::unique_ptr<checkers::Checker>> checkers_of(const PropertySet& checked) {
    std::vector<std::unique_ptr<checkers::Checker>> active;
    for (std::unique_ptr<checkers::Checker>& checker : checkers::make_checkers()) {
        if (checked.has(checker->property())) active.push_back(std::move(checker));
    }
    return active;
}

std::vector<checkers::Reads> reads_each(const std::vector<std::unique_ptr<checkers::Checker>>& active) {
    std::vector<checkers::Reads> reads;
    for (const auto& checker : active) reads.push_back(checker->reads());
    return reads;
}

// What the checkers read, together.
checkers::Reads reads_of(const std::vector<checkers::Reads>& each) {
    checkers::Reads reads;
    for (const checkers::Reads& more : each) {
        reads.entry_content = reads.entry_content || more.entry_content;
        reads.entry_marker = reads.entry_marker || more.entry_marker;
        reads.listing = reads.listing || more.listing;
        reads.handle_aliasing = reads.handle_aliasing || more.handle_aliasing;
        reads.copy_log = reads.copy_log || more.copy_log;
    }
    return reads;
}

PropertySet checked_in(const RunOptions& options, const Capabilities& capabilities) {
    PropertySet checked = options.properties;
    const PropertySet possible = checkable(capabilities);
    for (Property p : all_properties()) {
        if (!possible.has(p)) checked.remove(p);
    }
    return checked;
}

class Run final : public checkers::Probe {
  public:
    Run(Engine& engine, const RunOptions& options)
        : engine_(engine), options_(options), capabilities_(engine.capabilities()),
          verdicts_(checked_in(options, capabilities_)), checkers_(checkers_of(verdicts_.checked())),
          checker_reads_(reads_each(checkers_)), reads_(reads_of(checker_reads_)), readings_(engine, capabilities_, audit_, verdicts_),
          slots_(options.work_dir),
          transitions_(engine, audit_, readings_, slots_, result_.coverage, reads_.copy_log && capabilities_.copy_log) {
        every_step_ = options.every_entry_every_step || !capabilities_.storage_identity;
        reads_store_ = reads_.entry_content || reads_.entry_marker || reads_.listing;
    }

    RunResult run(const Trace& trace);

    // ---- the probe checkers read through ----
    Engine& engine() override { return engine_; }
    Auditor& auditor() override { return audit_; }
    const Capabilities& capabilities() const override { return capabilities_; }
    bool checking(Property property) const override { return verdicts_.checking(property); }
    void fail(Property property, std::string message) override { verdicts_.fail(property, message); }
    void engine_error(std::string message) override { verdicts_.engine_error(message); }
    const checkers::HandleReading& handle(std::int64_t handle) override { return readings_.handle(handle); }
    std::string handle_difference(std::int64_t handle, ObjectId expected) override {
        return readings_.handle_difference(handle, expected);
    }
    std::string entry_difference(const checkers::EntryFact& entry) override {
        return readings_.entry_difference(entry.id, entry.reading, entry.expected);
    }
    bool entry_owned(const checkers::EntryFact& entry) override { return readings_.entry_owned(entry.id, entry.reading); }
    std::optional<std::string> aliased_entry(const checkers::HandleFact& handle) override {
        return readings_.aliased_entry(handle);
    }
    const std::vector<std::string>& listed() override { return readings_.listed(); }
    std::string store_difference() override { return readings_.store_difference(false); }

  private:
    void run_step(const Op& operation);
    void deliver(const Fact& fact);
    void check_before(const Op& operation, const Named& named);
    void check_after(const Op& operation, const Named& named, std::vector<std::string> reached);
    void check_everything(const std::string& note);
    void read_every_entry();
    std::vector<std::string> check_entries(const std::vector<std::string>& ids);
    void check_handles(std::vector<std::int64_t> handles);
    void check_listing(bool full_read);
    void recheck_everything(std::size_t last_step);
    void record_state(const Op& op);

    // Is any checker that reads `what` still checking at this step?
    template <typename Member>
    bool still_reading(Member what) const {
        for (std::size_t i = 0; i < checkers_.size(); ++i) {
            if (checker_reads_[i].*what && verdicts_.checking(checkers_[i]->property())) return true;
        }
        return false;
    }

    Engine& engine_;
    const RunOptions& options_;
    Capabilities capabilities_;
    Verdicts verdicts_;
    std::vector<std::unique_ptr<checkers::Checker>> checkers_;  // of the checked properties
    std::vector<checkers::Reads> checker_reads_;                // what each reads
    checkers::Reads reads_;                                     // what they read, together
    Auditor audit_;
    RunResult result_;
    Readings readings_;
    DumpSlots slots_;
    Transitions transitions_;
    bool every_step_ = false;   // a full read after every step (RunOptions, or no storage identities)
    bool reads_store_ = false;  // some checked property reads the store's entries or listing
    bool rechecking_ = false;   // the final read, without versions, is running
    bool listing_due_ = false;  // the store's membership changed since its listing was compared
    std::size_t steps_since_full_read_ = 0;
};

RunResult Run::run(const Trace& trace) {
    for (std::size_t step = 0; step < trace.size() && !result_.failure; ++step) {
        if (options_.on_step) options_.on_step(step);
        verdicts_.at_step(step);
        try {
            run_step(trace[step]);
        } catch (const std::exception& error) {
            verdicts_.engine_error(std::string("the engine threw: ") + error.what());
        }
        verdicts_.note("");
        result_.steps_run = step + 1;
        result_.failure = verdicts_.settle();
    }
    if (!result_.failure && !trace.empty() && reads_store_) recheck_everything(trace.size() - 1);
    return std::move(result_);
}

void Run::run_step(const Op& operation) {
    if (!op_well_formed(operation) || !engine_supports(capabilities_, operation)) {
        ++result_.coverage.ops_skipped;
        return;
    }
    const Named named = named_by(operation);
    std::vector<std::string> reached;
    if (reads_store_ && !every_step_) {
        check_before(operation, named);
        if (verdicts_.any()) return;
        reached = readings_.entries_reached(named.handles);
    }
    for (const std::int64_t handle : named.handles) readings_.forget_handle(handle);
    const std::optional<Fact> fact = transitions_.apply(operation);
    if (!fact) {
        ++result_.coverage.ops_skipped;
        return;
    }
    ++result_.coverage.ops_run[operation.index()];
    record_state(operation);
    deliver(*fact);
    if (op_changes_ids(operation)) listing_due_ = true;
    if (reads_store_) check_after(operation, named, std::move(reached));
}

void Run::deliver(const Fact& fact) {
    std::visit(
        [this](const auto& f) {
            using F = std::decay_t<decltype(f)>;
            for (const auto& checker : checkers_) {
                if constexpr (std::is_same_v<F, checkers::Made>) checker->made(f, *this);
                if constexpr (std::is_same_v<F, checkers::Generated>) checker->generated(f, *this);
                if constexpr (std::is_same_v<F, checkers::Loaded>) checker->loaded(f, *this);
                if constexpr (std::is_same_v<F, checkers::GotByIds>) checker->got_by_ids(f, *this);
                if constexpr (std::is_same_v<F, checkers::GotAll>) checker->got_all(f, *this);
            }
        },
        fact);
}

// ---- the schedule ---------------------------------------------------------------

// The evidence an operation is about to replace, read while it is there.
void Run::check_before(const Op& operation, const Named& named) {
    const StoreReach reach = op_reach(operation);
    if (reach == StoreReach::whole_store) {
        check_everything(" (read before this operation read or replaced the whole store)");
        return;
    }
    if (reach != StoreReach::replaces_named) return;
    readings_.begin_round();
    verdicts_.note(" (read before this operation replaced or removed it)");
    check_entries(named.ids);
    verdicts_.note("");
}

void Run::check_after(const Op& operation, const Named& named, std::vector<std::string> reached) {
    ++steps_since_full_read_;
    if (every_step_ || op_reach(operation) == StoreReach::whole_store) {
        check_everything("");
        return;
    }
    if (steps_since_full_read_ >= std::max(sweep_steps_min, audit_.order().size())) {
        check_everything(" (found by the periodic read of every entry: it may have happened at an earlier step; "
                         "kvcheck replay pins it to its step)");
        return;
    }
    readings_.begin_round();
    for (const std::string& id : named.ids) add_unique(reached, id);
    for (const std::string& id : readings_.entries_reached(named.handles)) add_unique(reached, id);
    if (listing_due_ && audit_.order().size() <= listing_every_step_max) check_listing(false);
    const std::vector<std::string> renewed = check_entries(reached);
    // The handles the step named, and any handle that shares storage with
    // an entry whose storage changed at this step.
    if (!capabilities_.storage_identity || !still_reading(&checkers::Reads::handle_aliasing)) return;
    std::vector<std::int64_t> handles;
    for (const std::int64_t handle : named.handles) {
        if (audit_.handle(handle)) handles.push_back(handle);
    }
    if (!renewed.empty()) {
        for (const std::int64_t handle : readings_.handles_meeting(renewed)) add_unique(handles, handle);
    }
    std::sort(handles.begin(), handles.end());
    check_handles(std::move(handles));
}

// The store's listing, its content and every handle's ownership.
void Run::check_everything(const std::string& note) {
    verdicts_.note(note);
    readings_.begin_round();
    readings_.forget_handles();
    steps_since_full_read_ = 0;
    check_listing(true);
    read_every_entry();
    verdicts_.note("");
}

void Run::check_listing(bool full_read) {
    listing_due_ = false;
    for (const auto& checker : checkers_) checker->listing(full_read, *this);
}

// Entries `ids` (those the auditor holds): read by the checkers, then
// indexed. Returns the entries indexed anew (new, or whose version moved):
// their storage identities may have changed.
std::vector<std::string> Run::check_entries(const std::vector<std::string>& ids) {
    std::vector<std::string> renewed;
    for (const std::string& id : ids) {
        const std::optional<ObjectId> expected = audit_.entry(id);
        if (!expected) continue;
        EntryReading& reading = readings_.entry(id);
        const checkers::EntryFact fact{id, *expected, reading};
        for (const auto& checker : checkers_) checker->entry(fact, *this);
        if (!capabilities_.storage_identity) continue;
        // Not indexed in this round's reading: new, or its version moved.
        const bool renewing = !reading.indexed;
        readings_.index_storage(reading);
        if (renewing) renewed.push_back(id);
    }
    return renewed;
}

// Every entry, in one pass (one reading each, asked of the engine in
// batches), then every live handle.
void Run::read_every_entry() {
    const bool content = still_reading(&checkers::Reads::entry_content);
    const bool marker = still_reading(&checkers::Reads::entry_marker);
    const bool index = capabilities_.storage_identity && (content || marker);
    // The end-of-run read indexes, of every entry's storage identities,
    // only those a live handle holds: the handles' checks need no more,
    // and no step runs after it.
    std::vector<std::uint64_t> held;
    if (index && rechecking_) {
        for (const auto& [handle, object] : audit_.handles()) {
            if (!object) continue;
            const std::vector<std::uint64_t>& storage = readings_.handle(handle).storage;
            held.insert(held.end(), storage.begin(), storage.end());
        }
        std::sort(held.begin(), held.end());
    }
    for (const Readings::ReadEntry& read : readings_.read_all(content, marker, index)) {
        EntryReading& reading = *read.reading;
        const checkers::EntryFact fact{*reading.id, read.expected, reading};
        for (const auto& checker : checkers_) checker->entry(fact, *this);
        if (index) readings_.index_storage(reading, rechecking_ ? &held : nullptr);
    }
    if (!index || !still_reading(&checkers::Reads::handle_aliasing)) return;
    std::vector<std::int64_t> handles;
    for (const auto& [handle, object] : audit_.handles()) {
        if (object) handles.push_back(handle);
    }
    check_handles(std::move(handles));
}

void Run::check_handles(std::vector<std::int64_t> handles) {
    for (const std::int64_t handle : handles) {
        const std::optional<ObjectId> object = audit_.handle(handle);
        if (!object) continue;
        for (const auto& checker : checkers_) checker->handle({handle, *object}, *this);
    }
}

// Every entry and handle read again, versions or not, after the last step:
// an engine whose versions miss a change, or whose change no handle
// reached, is caught all the same.
void Run::recheck_everything(std::size_t last_step) {
    rechecking_ = true;
    verdicts_.rechecking();
    verdicts_.at_step(last_step);
    readings_.distrust_all();
    try {
        check_everything("");
    } catch (const std::exception& error) {
        verdicts_.engine_error(std::string("the engine threw: ") + error.what());
    }
    result_.failure = verdicts_.settle();
}

// ---- coverage ---------------------------------------------------------------------

void Run::record_state(const Op& op) {
    Coverage& coverage = result_.coverage;
    const auto size = static_cast<std::uint32_t>(audit_.order().size());
    coverage.store_size_max = std::max(coverage.store_size_max, size);
    if (!options_.record_states) return;
    const std::uint32_t bucket = size == 0 ? 0 : size == 1 ? 1 : size <= 3 ? 2 : 3;
    const std::int64_t out = created_handle(op);
    std::uint32_t layout = 2;  // no cache made by this step
    std::uint32_t owned = 0;
    if (out != 0) {
        if (const auto object = audit_.handle(out)) {
            layout = audit_.object(*object).content.layout == Layout::modern ? 0 : 1;
            owned = audit_.object(*object).expect_owned ? 1 : 0;
        }
    }
    coverage.states.push_back(static_cast<std::uint16_t>(((op.index() * 3 + layout) * 4 + bucket) * 2 + owned));
}

}  // namespace

RunResult execute(const Trace& trace, Engine& engine, const RunOptions& options) {
    Run run(engine, options);
    return run.run(trace);
}

}  // namespace kvcheck
