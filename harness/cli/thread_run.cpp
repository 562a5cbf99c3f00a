#include "thread_run.h"

#include "interrupt.h"
#include "adapters.h"
#include "kvcheck/lanes.h"
#include "outcomes.h"
#include "search_job.h"
#include "text.h"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <tuple>
#include <utility>

namespace kvcheck::cli {
namespace {

// Why an adapter is not run at the thread level (the rows' skip message),
// or "" when it can be.
std::string not_at_the_thread_level(const Capabilities& capabilities) {
    if (!capabilities.thread_safe) {
        return "n/a: the thread level calls an engine from several threads at once, and the adapter does not declare "
               "thread_safe (Capabilities::thread_safe; docs/semantics.md#the-thread-level)";
    }
    if (!capabilities.paged && !capabilities.store) {
        return "n/a: the thread level runs a paged engine's or a store's requests, and the adapter declares neither "
               "(docs/semantics.md#the-thread-level)";
    }
    if (capabilities.content_tolerance.declared()) {
        return "n/a: the thread level compares what the lanes read with the expected content exactly, and the adapter "
               "declares a content tolerance (docs/semantics.md#content-tolerance)";
    }
    if (!capabilities.paged && capabilities.policy.bounded()) {
        return "n/a: the thread level's store lanes judge an unbounded store, and the adapter declares a capacity (its "
               "evictions are not in the thread level's model; docs/semantics.md#the-thread-level)";
    }
    return "";
}

// The properties the thread level judges for one cache family.
std::vector<Property> family_properties(bool paged) {
    if (paged) return {Property::refcount_exact, Property::free_iff_unreferenced};
    return {Property::stored_immutable, Property::store_contract, Property::linearizable, Property::dump_safe};
}

bool of_family(const std::string& id, bool paged) {
    const std::vector<Property> judged = family_properties(paged);
    return std::any_of(judged.begin(), judged.end(), [&](Property p) { return property_id(p) == id; });
}

WorkloadOptions thread_workload(const ConformanceOptions& options, const Capabilities& capabilities) {
    WorkloadOptions workload = options.workload;
    workload.capabilities = capabilities;
    workload.threads = true;
    return workload;
}

PropertySet property_set_of(const std::vector<Property>& properties) {
    if (properties.empty()) return PropertySet::all();
    PropertySet set = PropertySet::none();
    for (const Property p : properties) set.add(p);
    return set;
}

std::string joined(const std::vector<std::int64_t>& numbers, const char* separator) {
    std::string text;
    for (std::size_t i = 0; i < numbers.size(); ++i) text += (i == 0 ? "" : separator) + std::to_string(numbers[i]);
    return text;
}

bool chosen(PropertySet properties, const std::string& id) {
    const std::optional<Property> property = parse_property(id);
    return !property || properties.has(*property);  // engine-error is always judged
}

// What the search's child does: "na" with why, or per trace a "trace"
// (progress), then "pass" or "fail" with the finding.
void search_body(const Adapter& adapter, const ConformanceOptions& options, PropertySet properties, Channel& out) {
    const Capabilities capabilities = adapter.make()->capabilities();
    const std::string why = not_at_the_thread_level(capabilities);
    if (!why.empty()) {
        out.send("na", why);
        return;
    }
    out.send("family", capabilities.paged ? "paged" : "store");
    const WorkloadOptions workload = thread_workload(options, capabilities);
    const double started = monotonic_seconds();
    std::size_t trace = 0;
    std::size_t calls = 0;  // of the traces as drawn
    bool engine_error_sent = false;
    for (; options.seconds > 0 ? monotonic_seconds() - started < options.seconds : trace < options.cases; ++trace) {
        // One trace a call: the parent hears of each (the run's limits).
        std::optional<ThreadFinding> found = search_threads(adapter.make, workload, options.seed + trace, 1);
        for (const Trace& lane : thread_plan(options.seed + trace, workload).lanes) calls += lane.size();
        out.send("trace", std::to_string(trace + 1) + " " + std::to_string(calls));
        if (!found || !chosen(properties, found->result.failure->property)) continue;
        // An engine error is reported and the search goes on for the
        // properties (as a property's search does); the first of each only.
        const bool engine_error = found->result.failure->property == engine_error_id;
        if (engine_error && engine_error_sent) continue;
        engine_error_sent = engine_error_sent || engine_error;
        found->traces = trace + 1;
        FoundFailure sent;
        sent.cases = trace + 1;
        sent.failure = *found->result.failure;
        sent.found_length = ran_trace(thread_plan(found->seed, workload), ThreadRunResult{}).size();  // as drawn
        sent.trace = thread_trace_text(found->plan, found->result) + what_ran(found->plan, found->result);
        ran_trace(found->plan, found->result, &sent.failure.step);
        sent.seed = found->seed;
        sent.reproduction.replays = found->replays;
        sent.reproduction.failed = found->replays_same;
        sent.reproduction.kind = found->replays_same == found->replays ? "reproduced" : "flaky";
        out.send("fail", encode(sent));
        if (!engine_error) return;
    }
    out.send("pass", std::to_string(trace) + " " + std::to_string(calls));
}

// The `threads ...` first line of a thread-level trace's text, and the rest.
std::pair<std::string, std::string> split_header(const std::string& text) {
    const std::size_t end = text.find('\n');
    return {text.substr(0, end + 1), end == std::string::npos ? "" : text.substr(end + 1)};
}

FailureReport report_of(const FoundFailure& found) {
    FailureReport report;
    report.message = found.failure.message;
    std::tie(report.threads, report.trace) = split_header(found.trace);
    report.found_length = found.found_length;
    report.found_after = found.cases;
    report.seed = found.seed;
    report.searching = found.failure.property;
    report.shape = found.failure.property;
    report.reproduction = found.reproduction;
    if (report.reproduction.kind == "reproduced") report.reproduction.kind = "";  // the label says nothing then
    // The lanes side by side, the schedule and what ran: the plan and
    // schedule replayed here once more (in the parent) would be a run;
    // drawn from the trace alone instead, with the history the search saw.
    const std::optional<ThreadTrace> parsed = parse_thread_trace(found.trace);
    const Trace ran = parse_trace(report.trace);
    if (parsed && lane_count(ran) >= 2) {
        report.lanes = lanes_of(ran);
        report.step = found.failure.step;
        report.conflicts = conflicting_steps(ran, report.step);
        report.swimlanes = swimlanes(ran, report.step, found.failure.property);
    }
    return report;
}

PropertyResult row_named(const std::string& id) {
    PropertyResult row;
    row.id = id;
    return row;
}

void skip_rows(AdapterResult& result, const std::string& why) {
    for (PropertyResult& row : result.properties) {
        row.verdict = "skipped";
        row.message = why;
    }
}

}  // namespace

std::vector<Property> thread_properties() {
    std::vector<Property> judged = family_properties(true);
    for (const Property p : family_properties(false)) judged.push_back(p);
    return judged;
}

std::string thread_swimlanes(const LanePlan& plan, const ThreadRunResult& result) {
    if (!result.failure) return "";
    std::size_t step = 0;
    const Trace ran = ran_trace(plan, result, &step);
    return swimlanes(ran, step, result.failure->property) + what_ran(plan, result);
}

std::string what_ran(const LanePlan& plan, const ThreadRunResult& result) {
    std::string text = "# what ran, in order (a pause inside the engine hands the turn to another lane; lane 0 ran alone first):\n";
    for (std::size_t line = 0; line < result.history.size(); ++line) {
        const bool failing = result.failure && line == result.failure->step;
        text += (failing ? "# > " : "#   ") + one_line(result.history[line]) + "\n";
    }
    text += "# schedule (the lane run at each yield with a choice): threads lanes=" + std::to_string(plan.lanes.size()) +
            " schedule=" + joined(result.schedule, ",") + "\n";
    return text;
}

ConformanceRun check_threads(const std::vector<Adapter>& adapters, const ConformanceOptions& options) {
    ConformanceRun run;
    const PropertySet properties = property_set_of(options.properties);
    Sandbox sandbox(options.limits);
    for (const Adapter& adapter : adapters) {
        AdapterResult result;
        result.adapter = adapter;
        for (const Property p : thread_properties()) {
            if (properties.has(p)) result.properties.push_back(row_named(property_id(p)));
        }
        result.properties.push_back(row_named(engine_error_id));
        if (interrupted_by() != 0) {
            for (PropertyResult& row : result.properties) row.verdict = "not-run";
            run.adapters.push_back(std::move(result));
            continue;
        }
        const double started = monotonic_seconds();
        const auto body = [&](Channel& out) { search_body(adapter, options, properties, out); };
        const std::shared_ptr<Job> job = options.isolate ? run_in(sandbox, body, options.limits) : run_in_process(body);
        const double seconds = monotonic_seconds() - started;
        std::size_t traces = 0, calls = 0;
        std::vector<FoundFailure> found;
        std::string why;
        std::optional<bool> paged;  // the adapter's cache family, as its child found it
        for (const Message& message : job ? job->messages : std::vector<Message>{}) {
            if (message.kind == "family") paged = message.payload == "paged";
            if (message.kind == "trace" || message.kind == "pass") std::istringstream(message.payload) >> traces >> calls;
            if (message.kind == "na") why = message.payload;
            if (message.kind == "fail") found.push_back(decode(message.payload));
            if (message.kind == "error") why = "the adapter failed outside any trace: " + one_line(message.payload);
        }
        result.traces = traces;
        result.operations_begun = calls;
        for (PropertyResult& row : result.properties) {
            row.cases = traces;
            row.judged = traces;
            row.seconds = seconds;
        }
        if (!job || (job->fault && job->fault->kind == "stopped")) {
            for (PropertyResult& row : result.properties) row.verdict = "not-run";
        } else if (job->fault) {
            PropertyResult& row = result.properties.back();  // engine-error
            row.verdict = "fail";
            row.fault = job->fault->kind + ": " + job->fault->detail;
            row.message = "the engine's process ended (" + row.fault + ") in thread-level trace " + std::to_string(traces + 1) +
                          " (seed " + std::to_string(options.seed + traces) + "): not shrunk at the thread level";
        } else if (!why.empty() && found.empty()) {
            skip_rows(result, why);
        } else {
            // A property's finding ends the search: the other properties
            // were not searched to the end of the budget.
            const auto property_found = std::find_if(found.begin(), found.end(), [](const FoundFailure& f) {
                return f.failure.property != engine_error_id;
            });
            for (PropertyResult& row : result.properties) {
                const auto own = std::find_if(found.begin(), found.end(), [&](const FoundFailure& f) { return f.failure.property == row.id; });
                if (paged && row.id != engine_error_id && !of_family(row.id, *paged)) {
                    row.verdict = "skipped";
                    row.message = std::string("n/a: a property of the ") + (*paged ? "store" : "paged") +
                                  " family; the adapter's lanes run " + (*paged ? "paged" : "store") + " requests";
                } else if (own != found.end()) {
                    row.verdict = "fail";
                    row.failures.push_back(report_of(*own));
                    settle_failures(adapter, "threads-" + adapter.name, row, options);
                } else if (property_found != found.end() && row.id != engine_error_id) {
                    row.verdict = "skipped";
                    row.message = "not searched to the end: the thread-level search stops at its first finding (" +
                                  property_found->failure.property + ")";
                }
            }
        }
        run.adapters.push_back(std::move(result));
    }
    return run;
}

int replay_threads(const Adapter& adapter, const ThreadTrace& trace, const std::string& reproduce, PropertySet properties,
                   const ConformanceOptions& options, std::ostream& out) {
    // Each replay on a fresh engine, in a child (a crash is the child's).
    std::vector<ThreadRunResult> runs;
    std::string fault;
    Sandbox sandbox(options.limits);
    const std::size_t replays = std::max<std::size_t>(options.replays, 1);
    for (std::size_t replay = 0; replay < replays && fault.empty(); ++replay) {
        const auto body = [&](Channel& channel) {
            const std::string why = not_at_the_thread_level(adapter.make()->capabilities());
            if (!why.empty()) {
                channel.send("na", why);
                return;
            }
            const ThreadRunResult result = run_threads(*adapter.make(), trace.plan, {0, trace.schedule});
            std::string history;
            for (const std::string& line : result.history) history += one_line(line) + "\n";
            const Failure failure = result.failure.value_or(Failure{});
            channel.send("run", failure.property + "\n" + std::to_string(failure.step) + "\n" + one_line(failure.message) + "\n" +
                                    joined(result.schedule, " ") + "\n" + std::to_string(result.failing_call) + "\n" +
                                    joined(result.returned, " ") + "\n" + history);
        };
        const std::shared_ptr<Job> job = options.isolate ? run_in(sandbox, body, options.limits) : run_in_process(body);
        if (!job) return 128 + interrupted_by();
        if (job->fault) fault = job->fault->kind + ": " + job->fault->detail;
        for (const Message& message : job->messages) {
            if (message.kind == "na") throw UsageError("kvcheck replay of a thread-level trace: " + message.payload);
            if (message.kind == "error") throw UsageError("the adapter failed outside any trace: " + one_line(message.payload));
            if (message.kind != "run") continue;
            std::istringstream lines(message.payload);
            ThreadRunResult result;
            std::string property, step, text, schedule, failing, returned, line;
            std::getline(lines, property);
            std::getline(lines, step);
            std::getline(lines, text);
            std::getline(lines, schedule);
            std::getline(lines, failing);
            std::getline(lines, returned);
            if (!property.empty()) result.failure = Failure{property, std::stoul(step), text, {}};
            std::istringstream choices(schedule), lanes(returned);
            for (std::int64_t choice = 0; choices >> choice;) result.schedule.push_back(choice);
            for (std::int64_t lane = 0; lanes >> lane;) result.returned.push_back(lane);
            result.failing_call = std::stoul(failing);
            while (std::getline(lines, line)) result.history.push_back(line);
            runs.push_back(std::move(result));
        }
    }
    if (!fault.empty()) {
        out << "ERROR: fault: the engine's process ended (" << fault << ") while it ran the thread-level trace\nreproduce: "
            << reproduce << "\n";
        return 1;
    }
    const auto counts = [&](const ThreadRunResult& run) {
        return run.failure && chosen(properties, run.failure->property);
    };
    const std::size_t failed = static_cast<std::size_t>(std::count_if(runs.begin(), runs.end(), counts));
    if (failed == 0) {
        std::size_t calls = 0;
        for (const Trace& lane : trace.plan.lanes) calls += lane.size();
        out << "kvcheck: " << calls << " calls in " << trace.plan.lanes.size() << " lanes at the thread level, replayed "
            << runs.size() << " times: every judged property holds on " << printable(adapter.name, 80) << "\n";
        return 0;
    }
    const ThreadRunResult& first = *std::find_if(runs.begin(), runs.end(), counts);
    const std::size_t alike = static_cast<std::size_t>(std::count_if(runs.begin(), runs.end(), [&](const ThreadRunResult& run) {
        return run.failure && run.failure->property == first.failure->property && run.failure->message == first.failure->message &&
               run.history == first.history;
    }));
    ThreadRunResult shown = first;  // its choices as given, not those made past them
    shown.schedule.resize(std::min(shown.schedule.size(), trace.schedule.size()));
    out << "ERROR: " << first.failure->property << ": " << printable(first.failure->message, 2000) << " (thread level)\n"
        << thread_swimlanes(trace.plan, shown)
        << (alike == runs.size() ? "replayed alike " + std::to_string(alike) + " of " + std::to_string(runs.size()) + " times\n"
                                 : "flaky: failed alike " + std::to_string(alike) + " of " + std::to_string(runs.size()) +
                                       " replays on a fresh engine\n")
        << "reproduce: " << reproduce << "\n";
    return 1;
}

}  // namespace kvcheck::cli
