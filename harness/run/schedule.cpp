// What the run reads when: the schedule described at the top of
// harness/run/run.cpp, each reading handed to every checker.
#include "run/run.h"

#include <algorithm>

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

}  // namespace

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

// Tells the engine what the reads after the step will be (Engine::expect_reads):
// a full read after it (check_after's, the next step's check_before's, the
// end of the run's), else `entries` (those its handles reached before it
// ran, those the next step reads before it replaces them). A hint only: a
// read it does not foresee (a merge refused, an entry reached only after
// the step) is asked for as any read is.
// A fill of more than one item is told nothing: it is one engine call per
// item, and an engine in another process gathers the hinted facts after
// each of them (a full read per item, the store growing: quadratic in the
// fill), where the reads after the fill ask for every entry once.
void Run::tell_reads(const Op& operation, const std::vector<std::string>& entries) {
    const bool entries_read = still_reading(&checkers::Reads::entry_content) || still_reading(&checkers::Reads::entry_marker);
    const op::Fill* fill = std::get_if<op::Fill>(&operation);
    if (!entries_read || (fill != nullptr && fill->count > 1)) {
        engine_.expect_reads({}, false);
        return;
    }
    const bool full_read = every_step_ || op_reach(operation) == StoreReach::whole_store ||
                           steps_since_full_read_ + 1 >= std::max(sweep_steps_min, audit_.order().size()) ||
                           next_ == nullptr || op_reach(*next_) == StoreReach::whole_store;
    engine_.expect_reads(full_read ? std::vector<std::string>{} : entries, full_read);
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
    // Readings made before the operation are stale; those of a round begun
    // after it (round_after_op_) are not.
    if (!round_after_op_) readings_.begin_round();
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
    check_handles(std::move(handles), false);
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
        const checkers::EntryFact fact{id, *expected, reading, false};
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
        const checkers::EntryFact fact{*reading.id, read.expected, reading, true};
        for (const auto& checker : checkers_) checker->entry(fact, *this);
        if (index) readings_.index_storage(reading, rechecking_ ? &held : nullptr);
    }
    if (!index || !still_reading(&checkers::Reads::handle_aliasing)) return;
    std::vector<std::int64_t> handles;
    for (const auto& [handle, object] : audit_.handles()) {
        if (object) handles.push_back(handle);
    }
    check_handles(std::move(handles), true);
}

void Run::check_handles(std::vector<std::int64_t> handles, bool full_read) {
    for (const std::int64_t handle : handles) {
        const std::optional<ObjectId> object = audit_.handle(handle);
        if (!object) continue;
        for (const auto& checker : checkers_) checker->handle({handle, *object, full_read}, *this);
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

}  // namespace kvcheck
