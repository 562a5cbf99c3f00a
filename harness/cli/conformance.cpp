#include "conformance.h"

#include "interrupt.h"
#include "kvcheck/lanes.h"
#include "kvcheck/search.h"
#include "outcomes.h"
#include "search_job.h"
#include "text.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace kvcheck::cli {
namespace {

// A failure in a trace of several lanes: its lanes side by side, with the
// conflicting steps, for every report (docs/semantics.md#concurrent-clients).
void draw_lanes(FailureReport& report, std::size_t step, const std::string& property) {
    if (report.trace.empty()) return;
    const Trace trace = parse_trace(report.trace);
    if (lane_count(trace) < 2) return;
    report.lanes = lanes_of(trace);
    report.step = step;
    report.conflicts = conflicting_steps(trace, step);
    report.swimlanes = swimlanes(trace, step, property);
}

struct Task {
    std::size_t adapter = 0;
    std::size_t property = 0;  // index into the chosen properties
    double started = 0;
    double last_progress = 0;
    std::shared_ptr<Job> job;
};

class Scheduler {
  public:
    // known_not_applicable, and what this run cannot judge whatever the
    // adapter: linearizable without --lanes.
    const char* not_applicable(const Adapter& adapter, Property property) const {
        if (property == Property::linearizable && options_.workload.lanes <= 1) return lanes_not_applicable;
        return known_not_applicable(adapter, property);
    }

    Scheduler(const std::vector<Adapter>& adapters, const ConformanceOptions& options)
        : adapters_(adapters), options_(options), sandbox_(options.limits) {
        properties_ = options.properties;
        if (properties_.empty()) properties_.assign(all_properties().begin(), all_properties().end());
        std::set<std::string> stems;
        for (const Adapter& adapter : adapters) {
            AdapterResult result;
            result.adapter = adapter;
            for (Property p : properties_) {
                PropertyResult property;
                property.id = property_id(p);
                if (const char* message = not_applicable(adapter, p)) {
                    property.verdict = "skipped";
                    property.message = message;
                }
                result.properties.push_back(std::move(property));
            }
            PropertyResult errors;
            errors.id = engine_error_id;
            result.properties.push_back(std::move(errors));
            PropertyResult shared;
            shared.id = shared_state_id;
            if (options.replays == 0) {
                shared.verdict = "skipped";
                shared.message = "not checked: --replays 0 (no finding is replayed, and engine independence is not checked)";
            }
            result.properties.push_back(std::move(shared));
            results_.push_back(std::move(result));
            // Trace files are named after the adapter, made a safe file name
            // part; two adapters of one name get files of their own.
            std::string stem = file_name_part(adapter.name);
            for (int n = 2; !stems.insert(stem).second; ++n) stem = file_name_part(adapter.name) + "-" + std::to_string(n);
            stems_.push_back(stem);
            name_width_ = std::max(name_width_, printable(adapter.name, 40).size());
        }
        for (std::size_t a = 0; a < adapters.size(); ++a) {
            for (std::size_t p = 0; p < properties_.size(); ++p) {
                if (not_applicable(adapters[a], properties_[p]) != nullptr) continue;  // no job: n/a
                Task task;
                task.adapter = a;
                task.property = p;
                pending_.push_back(std::move(task));
            }
        }
        total_ = pending_.size();
        errors_.resize(adapters.size());
        shared_.resize(adapters.size());
    }

    ConformanceRun run() {
        run_started_ = monotonic_seconds();
        while (!pending_.empty() || !running_.empty()) {
            while (!pending_.empty() && running_.size() < std::max<std::size_t>(options_.jobs, 1) && interrupted_by() == 0) {
                running_.push_back(start(pending_.front()));
                pending_.pop_front();
            }
            sandbox_.poll(0.2);
            if (interrupted_by() != 0) return stop();
            const double now = monotonic_seconds();
            // Collecting a fault shrinks it, which may take a while: the
            // tasks are taken out of running_ first.
            std::vector<Task> finished;
            for (auto it = running_.begin(); it != running_.end();) {
                if (it->job->done) {
                    finished.push_back(std::move(*it));
                    it = running_.erase(it);
                    continue;
                }
                if (options_.progress && now - it->last_progress >= options_.progress_seconds) {
                    it->last_progress = now;
                    std::cerr << "         " << printable(adapters_[it->adapter].name, 40) << " / "
                              << property_id(properties_[it->property]) << ": " << it->job->begins << " traces so far"
                              << time_left_note(now) << "\n";
                }
                ++it;
            }
            for (const Task& task : finished) collect(task, monotonic_seconds());
            if (interrupted_by() != 0) return stop();
        }
        settle_elsewhere();
        settle_also();
        settle_engine_errors();
        settle_shared_state();
        say_changed_verdicts();
        return {results_, 0};
    }

  private:
    // The failure of one found by a search, as the report keeps it.
    FailureReport report_of(const Task& task, const FoundFailure& found) const {
        FailureReport report;
        report.message = found.failure.message;
        report.also = found.failure.also;
        report.trace = found.trace;
        draw_lanes(report, found.failure.step, found.failure.property);
        report.found_length = found.found_length;
        report.found_after = found.cases;
        report.seed = found.seed;
        report.searching = property_id(properties_[task.property]);
        report.shape = failure_shape(found.failure);
        report.output = found.output;
        report.reproduction = found.reproduction;
        const std::string label = found.reproduction.label();
        if (!label.empty()) report.message = label + ": " + report.message;
        return report;
    }

    // A failure of another property found while searching this one: the
    // one found by the search earliest in the run's list of properties is
    // kept for that property (whichever child finishes first).
    void note_elsewhere(const Task& task, const FoundFailure& found) {
        const auto key = std::make_pair(task.adapter, found.failure.property);
        const auto kept = elsewhere_.find(key);
        if (kept != elsewhere_.end() && kept->second.first <= task.property) return;
        PropertyResult result;
        result.id = found.failure.property;
        result.verdict = "fail";
        result.cases = found.cases;
        FailureReport failure = report_of(task, found);
        failure.message = "found while searching " + failure.searching + ": " + failure.message;
        result.failures.push_back(std::move(failure));
        // The engine's output is that of the search that found it (its
        // tail: the search may have gone on past the failure).
        result.engine_output = task.job->output;
        result.output = results_[task.adapter].properties[task.property].output;
        elsewhere_[key] = {task.property, std::move(result)};
    }

    // A property whose own search passed, or was blocked, but that another
    // search found broken, fails with what that search found.
    void settle_elsewhere() {
        for (auto& [key, found] : elsewhere_) {
            AdapterResult& adapter = results_[key.first];
            for (PropertyResult& row : adapter.properties) {
                if (row.id != key.second || row.verdict == "fail" || row.verdict == "not-run") continue;
                // What its own search ran and judged stays.
                const PropertyResult own = row;
                row = found.second;
                row.seconds = own.seconds;
                row.cases = own.cases;
                row.judged = own.judged;
                row.repeats = own.repeats;
                settle_failures(adapter.adapter, stems_[key.first], row, options_);
            }
        }
    }

    // A violation reported as "also" at a failing step fails its own row
    // too, when that row's search passed or was blocked: it points at the
    // trace that showed it (issue 42: a row's verdict counts every
    // violation reported on it).
    void settle_also() {
        for (std::size_t a = 0; a < results_.size(); ++a) {
            AdapterResult& adapter = results_[a];
            std::vector<std::pair<std::string, FailureReport>> found;  // (property, its failure)
            for (const PropertyResult& row : adapter.properties) {
                if (row.verdict != "fail") continue;
                for (const FailureReport& failure : row.failures) {
                    for (const std::string& also : failure.also) {
                        const std::size_t colon = also.find(": ");
                        if (colon == std::string::npos) continue;
                        FailureReport shown = failure;
                        shown.also.clear();
                        shown.fault.clear();
                        shown.message = "also at the failing step of " + row.id + "'s trace" +
                                        (failure.trace_file.empty() ? "" : " (" + failure.trace_file + ")") + ": " +
                                        also.substr(colon + 2);
                        found.emplace_back(also.substr(0, colon), std::move(shown));
                    }
                }
            }
            for (auto& [property, failure] : found) {
                for (PropertyResult& row : adapter.properties) {
                    if (row.id != property || (row.verdict != "pass" && row.verdict != "blocked")) continue;
                    row.verdict = "fail";
                    row.failures = {std::move(failure)};
                    settle_failures(adapter.adapter, stems_[a], row, options_);
                    break;
                }
            }
        }
    }

    // The progress lines said each verdict as its search ended; a verdict
    // settled later (found by another search, or as "also") is said again,
    // so that the lines and the final table agree.
    void say_changed_verdicts() const {
        if (!options_.progress) return;
        for (const auto& [key, said] : said_) {
            const PropertyResult& row = results_[key.first].properties[key.second];
            const std::string verdict = row.fault.empty() ? row.verdict : "FAULT";
            if (verdict == said) continue;
            std::string name = printable(adapters_[key.first].name, 40);
            name.resize(std::max(name.size(), name_width_), ' ');
            std::cerr << "[settled] " << name << " " << row.id << ": now " << verdict << " (was " << said << "): "
                      << printable(row.message, 400) << "\n";
        }
    }

    // An engine-error group a search sent ("engine-error"), with the
    // engine's output of that search.
    struct ErrorGroup {
        std::size_t property = 0;  // the index of the search that found it
        std::size_t sent = 0;      // its place among the groups that search sent
        FailureReport failure;
        std::array<CapturedOutput, 2> engine_output;
        std::string output;
    };

    // The engine-error row of each adapter: the groups every search sent,
    // one per message shape, in the order of the run's properties and of
    // each search (whichever child finished first), their counts summed;
    // each keeps the first shrunk trace of its shape.
    void settle_engine_errors() {
        for (std::size_t a = 0; a < results_.size(); ++a) {
            std::vector<ErrorGroup> groups = errors_[a];
            std::stable_sort(groups.begin(), groups.end(), [](const ErrorGroup& x, const ErrorGroup& y) {
                return std::make_pair(x.property, x.sent) < std::make_pair(y.property, y.sent);
            });
            PropertyResult& row = row_of(a, engine_error_id);
            if (groups.empty()) continue;
            std::map<std::string, std::size_t> by_shape;
            row.failures.clear();
            row.cases = 0;
            for (const ErrorGroup& group : groups) {
                row.cases += group.failure.count;
                const auto [at, added] = by_shape.emplace(group.failure.shape, row.failures.size());
                if (added) {
                    row.failures.push_back(group.failure);
                    if (at->second == 0) {
                        row.engine_output = group.engine_output;
                        row.output = group.output;
                    }
                    continue;
                }
                FailureReport& kept = row.failures[at->second];
                kept.count += group.failure.count;
                if (kept.trace.empty() && !group.failure.trace.empty()) {
                    const std::size_t count = kept.count;
                    kept = group.failure;
                    kept.count = count;
                }
            }
            row.verdict = "fail";
            row.judged = row.cases;
            settle_failures(results_[a].adapter, stems_[a], row, options_);
        }
    }

    PropertyResult& row_of(std::size_t adapter, const char* id) {
        for (PropertyResult& row : results_[adapter].properties) {
            if (row.id == id) return row;
        }
        return results_[adapter].properties.back();  // never: every adapter has both engine-level rows
    }

    // A finding that needs an earlier engine of the process (a property's,
    // another's, an engine-error group's), or answers that differ
    // ("shared-state" from check_independence): a failure of the adapter's
    // shared-state row, which lists each with its two-part reproducer
    // (docs/semantics.md#reproduction). The property's own row keeps its
    // failure: it reproduces, with both parts.
    void note_shared_state(const Task& task, const FoundFailure& found, const std::string& kind) {
        if (found.reproduction.kind != "shared-state") return;
        FailureReport failure = report_of(task, found);
        const std::string what = kind == "shared-state" ? std::string()
                                 : found.failure.property == engine_error_id
                                     ? "an engine error, "
                                     : "a failure of " + found.failure.property + ", ";
        // The row says what the finding is; each says what it was.
        const std::string said = "shared-state: engines share state across instances: ";
        if (failure.message.rfind(said, 0) == 0) failure.message.erase(0, said.size());
        failure.message = what + "found while searching " + failure.searching + ": " + failure.message;
        shared_[task.adapter].push_back({task.property, shared_[task.adapter].size(), std::move(failure), task.job->output, ""});
    }

    // The shared-state row of each adapter: fails when any search found
    // state shared across engine instances, its findings in the order of
    // the run's properties.
    void settle_shared_state() {
        for (std::size_t a = 0; a < results_.size(); ++a) {
            std::vector<ErrorGroup> found = shared_[a];
            if (found.empty()) continue;
            std::stable_sort(found.begin(), found.end(), [](const ErrorGroup& x, const ErrorGroup& y) {
                return std::make_pair(x.property, x.sent) < std::make_pair(y.property, y.sent);
            });
            PropertyResult& row = row_of(a, shared_state_id);
            row.failures.clear();
            for (ErrorGroup& one : found) row.failures.push_back(std::move(one.failure));
            row.verdict = "fail";
            row.cases = row.judged = row.failures.size();
            row.engine_output = found.front().engine_output;
            settle_failures(results_[a].adapter, stems_[a], row, options_);
        }
    }

    // A Ctrl-C: every child killed, what finished kept, the rest "not-run".
    ConformanceRun stop() {
        const int signal = interrupted_by();
        const std::string why = "interrupted by " + signal_name(signal);
        sandbox_.stop_all(why);
        const double now = monotonic_seconds();
        for (const Task& task : running_) collect(task, now);
        running_.clear();
        for (const Task& task : pending_) {
            PropertyResult& result = results_[task.adapter].properties[task.property];
            result.verdict = "not-run";
            result.message = "not started: " + why;
        }
        pending_.clear();
        settle_engine_errors();
        settle_shared_state();
        return {results_, signal};
    }

    Task start(Task task) {
        const Adapter& adapter = adapters_[task.adapter];
        const Property property = properties_[task.property];
        const ConformanceOptions& options = options_;
        const std::size_t index = task.property;
        auto body = [&adapter, property, index, &options](Channel& out) {
            search_property(adapter, property, index, options, out);
        };
        task.started = task.last_progress = monotonic_seconds();
        if (options_.isolate) {
            Limits limits = options_.limits;
            if (options_.seconds > 0 && limits.total_seconds > 0) limits.total_seconds += options_.seconds;
            task.job = sandbox_.start(body, nullptr, limits);
        } else {
            task.job = run_in_process(body);
        }
        return task;
    }

    // A fault: the verdict "fail", the fault first among the failures.
    void collect_fault(const Task& task, PropertyResult& result) {
        const Adapter& adapter = adapters_[task.adapter];
        const Job& job = *task.job;
        const Fault& fault = *job.fault;
        if (fault.kind == "stopped") {
            if (!result.failures.empty()) return;  // the failures found before: a verdict all the same
            result.verdict = "not-run";
            result.message = "not finished: " + fault.detail + " (after " + std::to_string(job.begins) + " traces)";
            return;
        }
        result.verdict = "fail";
        FailureReport failure;
        failure.fault = fault.kind + ": " + fault.detail;
        failure.searching = result.id;
        failure.found_after = job.begins;
        const ShrunkFault shrunk = shrink_fault(adapter, job.last_begin, fault, job.last_step,
                                                PropertySet::only(properties_[task.property]), options_, sandbox_);
        failure.trace = shrunk.trace;
        failure.found_length = static_cast<std::size_t>(std::count(job.last_begin.begin(), job.last_begin.end(), '\n'));
        failure.message = fault_message(fault, step_text(shrunk.trace, shrunk.step));
        if (!shrunk.recurred) {
            failure.message += " (it did not recur when this trace ran alone in a fresh engine process: it built up over the " +
                               std::to_string(job.begins - 1) + " traces that process ran before)";
        }
        result.failures.insert(result.failures.begin(), std::move(failure));
    }

    void collect(const Task& task, double now) {
        const Adapter& adapter = adapters_[task.adapter];
        PropertyResult& result = results_[task.adapter].properties[task.property];
        const Job& job = *task.job;
        result.seconds = now - task.started;
        result.cases = result.judged = job.begins;
        result.engine_output = job.output;
        if (adapter.take_output) result.output = adapter.take_output(options_.isolate ? job.pid : 0);
        bool counted = false;  // a job that finishes sends "stats" with the traces it ran
        std::vector<std::size_t> sent;  // the engine-error groups of this search, in errors_
        for (const Message& message : job.messages) {
            if (message.kind == "pass" || message.kind == "fail" || message.kind == "blocked") {
                const SearchSummary summary = decode_summary(message.payload);
                result.verdict = message.kind;
                result.cases = summary.cases;
                result.judged = summary.judged;
                result.repeats = summary.repeats;
                if (message.kind == "blocked") result.message = summary.blocked_by;
                for (std::size_t i = 0; i < sent.size() && i < summary.group_counts.size(); ++i) {
                    errors_[task.adapter][sent[i]].failure.count = summary.group_counts[i];
                }
            } else if (message.kind == "skipped") {
                result.verdict = "skipped";
                result.message = message.payload;
            } else if (message.kind == "failure") {
                result.verdict = "fail";
                const FoundFailure found = decode(message.payload);
                result.failures.push_back(report_of(task, found));
                note_shared_state(task, found, message.kind);
            } else if (message.kind == "shared-state") {
                note_shared_state(task, decode(message.payload), message.kind);
            } else if (message.kind == "engine-error") {
                const FoundFailure found = decode(message.payload);
                note_shared_state(task, found, message.kind);
                ErrorGroup group{task.property, sent.size(), report_of(task, found), job.output, result.output};
                group.failure.message = "found while searching " + group.failure.searching + ": " + group.failure.message;
                sent.push_back(errors_[task.adapter].size());
                errors_[task.adapter].push_back(std::move(group));
            } else if (message.kind == "other") {
                const FoundFailure found = decode(message.payload);
                note_shared_state(task, found, message.kind);
                note_elsewhere(task, found);
            } else if (message.kind == "not-applied") {
                result.not_applied += (result.not_applied.empty() ? "" : "; ") + message.payload;
            } else if (message.kind == "domain") {
                results_[task.adapter].domain = message.payload;
            } else if (message.kind == "stats") {
                decode_stats(message.payload, &results_[task.adapter].traces, &results_[task.adapter].coverage);
                counted = true;
            } else if (message.kind == "error") {
                result.verdict = "fail";
                FailureReport failure;
                failure.fault = "error: " + one_line(message.payload);
                failure.message = "the adapter failed outside any trace: " + one_line(message.payload);
                failure.searching = result.id;
                result.failures.insert(result.failures.begin(), std::move(failure));
            }
        }
        // One that crashed, hung or was interrupted sent none: the traces
        // it began count, and their operations (their shapes are not known).
        if (!counted) {
            results_[task.adapter].traces += job.begins;
            results_[task.adapter].operations_begun += job.operations_begun;
        }
        if (job.fault) collect_fault(task, result);
        if (result.verdict != "fail") result.output.clear();  // shown with a failure only
        if (result.verdict == "fail") settle_failures(adapter, stems_[task.adapter], result, options_);
        ++finished_;
        if (result.verdict == "skipped") {
            ++not_timed_;
        } else {
            finished_seconds_ += result.seconds;
        }
        if (options_.progress) {
            const std::string verdict = result.fault.empty() ? result.verdict : "FAULT";
            said_[{task.adapter, task.property}] = verdict;
            char line[128];
            std::snprintf(line, sizeof line, "%-22s %-7s %5zu cases %6.2f s\n", result.id.c_str(), verdict.c_str(),
                          result.cases, result.seconds);
            std::string name = printable(adapter.name, 40);
            name.resize(std::max(name.size(), name_width_), ' ');
            if (finished_ < total_) line[std::strlen(line) - 1] = '\0';  // the time left follows
            std::cerr << "[" << std::string(finished_ < 10 ? 2 : finished_ < 100 ? 1 : 0, ' ') << finished_ << "/"
                      << total_ << "] " << name << " " << line << (finished_ < total_ ? time_left_note(now) + "\n" : "");
        }
    }

    // The run's estimated time left, once it has run for progress_seconds:
    // every task still pending or running takes what a task takes (its
    // --seconds budget, else the mean of those finished), spread over the
    // jobs; "" before there is anything to estimate from.
    std::string time_left_note(double now) const {
        if (now - run_started_ < options_.progress_seconds) return "";
        const std::size_t done = finished_ - std::min(finished_, not_timed_);
        if (options_.seconds <= 0 && done == 0) return "";
        const double task_seconds = options_.seconds > 0 ? options_.seconds : finished_seconds_ / static_cast<double>(done);
        double work = static_cast<double>(pending_.size()) * task_seconds;
        for (const Task& task : running_) work += std::max(0.0, task_seconds - (now - task.started));
        const double left = work / static_cast<double>(std::max<std::size_t>(options_.jobs, 1));
        char note[64];
        if (left >= 90) {
            std::snprintf(note, sizeof note, "; about %.0f min left", left / 60);
        } else {
            std::snprintf(note, sizeof note, "; about %.0f s left", std::max(1.0, left));
        }
        return note;
    }

    const std::vector<Adapter>& adapters_;
    const ConformanceOptions& options_;
    std::vector<Property> properties_;
    Sandbox sandbox_;
    std::deque<Task> pending_;
    std::vector<Task> running_;
    std::vector<AdapterResult> results_;
    std::vector<std::string> stems_;    // per adapter: its trace files' name
    std::size_t name_width_ = 10;
    std::size_t total_ = 0;
    std::size_t finished_ = 0;
    double run_started_ = 0;
    double finished_seconds_ = 0;  // the time the finished tasks took, together
    std::size_t not_timed_ = 0;    // finished tasks not in it (skipped: they took no time of their own)
    // (adapter, property id) -> the index of the search that found it, and what it found
    std::map<std::pair<std::size_t, std::string>, std::pair<std::size_t, PropertyResult>> elsewhere_;
    // The verdict each progress line said, by (adapter, property index).
    std::map<std::pair<std::size_t, std::size_t>, std::string> said_;
    std::vector<std::vector<ErrorGroup>> errors_;  // per adapter: the engine-error groups sent, as collected
    std::vector<std::vector<ErrorGroup>> shared_;  // per adapter: the shared-state findings, as collected
};

}  // namespace

const char* known_not_applicable(const Adapter& adapter, Property property) {
    if (!adapter.model.has_value()) return nullptr;
    const bool paged = paged_property(property);
    if (paged && !adapter.paged) return paged_not_applicable;
    if (!paged && !adapter.store) return contiguous_not_applicable;
    if (capacity_property(property) && !adapter.policy.bounded()) return capacity_not_applicable;
    return nullptr;
}

bool AdapterResult::all_pass() const {
    return std::none_of(properties.begin(), properties.end(),
                        [](const PropertyResult& p) { return p.verdict == "fail" || p.verdict == "not-run"; });
}

bool AdapterResult::fails(const std::string& property) const {
    return std::any_of(properties.begin(), properties.end(),
                       [&](const PropertyResult& p) { return p.id == property && p.verdict == "fail"; });
}

ConformanceRun check_adapters(const std::vector<Adapter>& adapters, const ConformanceOptions& options) {
    return Scheduler(adapters, options).run();
}

}  // namespace kvcheck::cli
