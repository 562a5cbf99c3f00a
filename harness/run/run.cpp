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
//   after a step that reads or replaces the whole store, after a merge the
//   engine refused (it must have changed nothing), every
//   max(sweep_steps_min, entries) steps, and at the end of the run, then
//   without entry versions.
// A change no handle can reach (an engine writing into an entry it was not
// asked about) is therefore found at the next full read, at a later step
// than it happened; RunOptions::every_entry_every_step reads everything
// after every step instead and pins it to its step. Without storage
// identities no handle can be traced to the entries it reaches, and every
// step is a full read.
#include "run/run.h"

#include "kvcheck/domain.h"

#include <boost/pfr.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <type_traits>

namespace kvcheck {
namespace {

template <typename T>
void add_unique(std::vector<T>& list, const T& value) {
    if (std::find(list.begin(), list.end(), value) == list.end()) list.push_back(value);
}

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

// ---- answers (RunOptions::record_answers) ---------------------------------------

std::string hex_text(std::uint64_t value) {
    char text[24];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
    return text;
}

std::string numbers_text(const std::vector<std::int64_t>& numbers) {
    std::string text = "[";
    for (std::size_t i = 0; i < numbers.size(); ++i) text += (i ? "," : "") + std::to_string(numbers[i]);
    return text + "]";
}

// What the engine answered of a paged operation: its refusal, the tokens it
// reported cached or decoded, and the pool's lengths (the blocks each table
// holds, the free blocks, the index), never which blocks it chose.
std::string paged_answer(const checkers::Paged& paged) {
    std::string text = paged.what + (paged.refused ? ": refused" : ": cached " + std::to_string(paged.cached));
    if (!paged.appended.empty()) text += ", appended " + numbers_text(paged.appended);
    if (paged.decoded_exported) text += ", decoded " + numbers_text(*paged.decoded_exported);
    if (paged.exported) text += ", exported content " + hex_text(view_digest(paged.exported->view));
    text += "; tables";
    for (const auto& [seq, table] : paged.after.tables) text += " " + std::to_string(seq) + ":" + std::to_string(table.size());
    return text + ", " + std::to_string(paged.after.free_queue.size()) + " free, " +
           std::to_string(paged.after.index.size()) + " indexed";
}

}  // namespace

// The cache `handle` holds, as the engine reports it: none, or its content
// digest (and its owned marker, when the engine keeps one). Asked of the
// engine only here, when answers are recorded; what it raises is an answer
// too ("unreadable"), never an engine error of the run.
std::string Run::handle_answer(std::int64_t handle) {
    try {
        const HandleFacts facts = engine_.handle_facts(handle);
        if (!facts.exists) return "no cache";
        const bool owned = capabilities_.owned_marker && facts.owned;
        return "content " + hex_text(engine_.handle_digest(handle)) + (owned ? ", owned" : "");
    } catch (const std::exception&) {
        return "unreadable";
    }
}

// One step's answer (RunResult::answers), from its fact and the copies it
// logged.
std::string Run::answer_of(const Op& operation, const Fact& fact, const std::vector<CopyRecord>* copies) {
    std::string text = op_name(operation);
    std::visit(
        [&](const auto& f) {
            using F = std::decay_t<decltype(f)>;
            if constexpr (std::is_same_v<F, checkers::Made>) {
                text += f.refused ? ": refused" : ": " + handle_answer(f.out);
            } else if constexpr (std::is_same_v<F, checkers::Generated>) {
                text += ": tokens " + numbers_text(f.result.tokens);
                if (f.returned != 0) text += ", returned " + handle_answer(f.returned);
            } else if constexpr (std::is_same_v<F, checkers::Loaded>) {
                text += f.result.ok ? ": loaded" : ": refused";
            } else if constexpr (std::is_same_v<F, checkers::GotByIds>) {
                text += ": " + std::to_string(std::count_if(f.found.begin(), f.found.end(), [](const auto& x) { return x.has_value(); })) +
                        " of " + std::to_string(f.found.size()) + " found";
            } else if constexpr (std::is_same_v<F, checkers::GotAll>) {
                text += ": " + std::to_string(f.ids.size()) + " ids";
            } else if constexpr (std::is_same_v<F, checkers::Paged>) {
                text = paged_answer(f);
            } else if constexpr (std::is_same_v<F, checkers::Trimmed>) {
                text += ": " + handle_answer(f.handle);
            } else if constexpr (std::is_same_v<F, checkers::Leased>) {
                text += f.refused ? ": refused" : ": done";
            }
        },
        fact);
    if (copies != nullptr) {
        const std::int64_t bytes = std::accumulate(copies->begin(), copies->end(), std::int64_t{0},
                                                   [](std::int64_t sum, const CopyRecord& c) { return sum + c.bytes; });
        text += "; " + std::to_string(copies->size()) + (copies->size() == 1 ? " copy of " : " copies of ") +
                std::to_string(bytes) + " bytes";
    }
    return text;
}

Run::Run(Engine& engine, const RunOptions& options)
    : engine_(engine), options_(options), capabilities_(engine.capabilities()),
      verdicts_(checked_in(options, capabilities_)), checkers_(checkers_of(verdicts_.checked())),
      checker_reads_(reads_each(checkers_)), reads_(reads_of(checker_reads_)), readings_(engine, capabilities_, audit_, verdicts_),
      slots_(options.work_dir),
      transitions_(engine, audit_, readings_, slots_, result_.coverage, fresh_layout(capabilities_),
                   // dump_kill judges dump-safe only, and costs three processes: not run without it.
                   verdicts_.checked().has(Property::dump_safe) ? options.fresh_engine : nullptr) {
    every_step_ = options.every_entry_every_step || !capabilities_.storage_identity;
    derives_owned_ = !capabilities_.owned_marker && verdicts_.checked().has(Property::owned_marker);
    reads_store_ = reads_.entry_content || reads_.entry_marker || reads_.listing;
    audit_.set_window(capabilities_.window);
}


RunResult Run::run(const Trace& trace) {
    for (std::size_t step = 0; step < trace.size() && !result_.failure; ++step) {
        if (options_.on_step) options_.on_step(step);
        verdicts_.at_step(step);
        next_ = step + 1 < trace.size() ? &trace[step + 1] : nullptr;
        answer_ = "skipped";
        try {
            run_step(trace[step]);
        } catch (const std::exception& error) {
            verdicts_.engine_error(std::string("the engine threw: ") + error.what());
        }
        verdicts_.note("");
        if (options_.record_answers) result_.answers.push_back(std::move(answer_));
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
    const bool read_copies = reads_.copy_log && capabilities_.copy_log;
    if (read_copies) engine_.take_copies();  // what an observation logged is no operation's
    // The entries the next step reads before it replaces them are read
    // after this one.
    std::vector<std::string> read_next = reached;
    if (next_ != nullptr && op_reach(*next_) == StoreReach::replaces_named) {
        for (const std::string& id : named_by(*next_).ids) add_unique(read_next, id);
    }
    tell_reads(operation, read_next);
    const std::optional<Fact> fact = transitions_.apply(operation);
    if (!fact) {
        ++result_.coverage.ops_skipped;
        return;
    }
    ++result_.coverage.ops_run[operation.index()];
    if (const auto* made = std::get_if<checkers::Made>(&*fact); made != nullptr && made->merged && !made->refused) {
        ++result_.coverage.merges_run[operation.index()];
    }
    record_state(operation);
    // A derived owned marker is read against the store the operation left
    // (Probe::owned), at its step: what was read before it is stale.
    round_after_op_ = derives_owned_;
    if (round_after_op_) readings_.begin_round();
    // The copies first: that an operation copied wrongly says more than
    // what follows from it.
    checkers::Copies copies = transitions_.copies_expected();
    if (read_copies) {
        copies.logged = engine_.take_copies();
        for (const auto& checker : checkers_) checker->copies(copies, *this);
    }
    deliver(*fact);
    if (const std::optional<checkers::Evicted>& evicted = transitions_.evicted()) {
        for (const auto& checker : checkers_) checker->evicted(*evicted, *this);
    }
    for (const auto& checker : checkers_) checker->called(operation, *this);
    if (options_.record_answers) answer_ = answer_of(operation, *fact, read_copies ? &copies.logged : nullptr);
    if (op_changes_ids(operation)) listing_due_ = true;
    if (!reads_store_) return;
    // A merge the engine refused must have changed nothing: all of the
    // store is read at once.
    const auto* made = std::get_if<checkers::Made>(&*fact);
    if (made != nullptr && made->refused) {
        check_everything(" (read after the engine refused a merge of mixed dtypes)");
        return;
    }
    check_after(operation, named, std::move(reached));
}

void Run::deliver(const Fact& fact) {
    std::visit(
        [this](const auto& f) {
            using F = std::decay_t<decltype(f)>;
            for (const auto& checker : checkers_) {
                if constexpr (std::is_same_v<F, checkers::Made>) checker->made(f, *this);
                if constexpr (std::is_same_v<F, checkers::Generated>) checker->generated(f, *this);
                if constexpr (std::is_same_v<F, checkers::Loaded>) checker->loaded(f, *this);
                if constexpr (std::is_same_v<F, checkers::DumpKilled>) checker->dump_killed(f, *this);
                if constexpr (std::is_same_v<F, checkers::GotByIds>) checker->got_by_ids(f, *this);
                if constexpr (std::is_same_v<F, checkers::GotAll>) checker->got_all(f, *this);
                if constexpr (std::is_same_v<F, checkers::Paged>) checker->paged(f, *this);
                if constexpr (std::is_same_v<F, checkers::Trimmed>) checker->trimmed(f, *this);
                if constexpr (std::is_same_v<F, checkers::Leased>) checker->leased(f, *this);
            }
        },
        fact);
}

// ---- coverage ---------------------------------------------------------------------

void Run::record_state(const Op& op) {
    Coverage& coverage = result_.coverage;
    const auto size = static_cast<std::uint32_t>(audit_.order().size());
    coverage.store_size_max = std::max(coverage.store_size_max, size);
    // Once a trace: it counts traces.
    if (size >= 64 && coverage.count_of(Shape::store_64_items) == 0) coverage.count(Shape::store_64_items);
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

RunResult execute(const Trace& trace, Engine& engine, const RunOptions& options) {
    Run run(engine, options);
    return run.run(trace);
}

}  // namespace kvcheck
