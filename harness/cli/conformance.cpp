#include "conformance.h"

#include "interrupt.h"
#include "kvcheck/search.h"
#include "text.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace kvcheck::cli {
namespace {

namespace fs = std::filesystem;

std::string one_line(std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    return text;
}

// A message on one line of the child's report and back: an engine's error
// may span lines (a Python traceback), and keeps them.
std::string escape_lines(const std::string& text) {
    std::string out;
    for (const char c : text) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
    return out;
}

std::string unescape_lines(const std::string& text) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) {
            out += text[i + 1] == 'n' ? '\n' : text[i + 1];
            ++i;
        } else {
            out += text[i];
        }
    }
    return out;
}

// ---- what a child sends about a failure ---------------------------------------

struct FoundFailure {
    std::size_t cases = 0;
    std::size_t found_length = 0;
    Failure failure;
    std::string trace;
};

std::string encode(const FoundFailure& found) {
    std::ostringstream out;
    out << "cases " << found.cases << "\nfound " << found.found_length << "\nstep " << found.failure.step
        << "\nproperty " << found.failure.property << "\nmessage " << escape_lines(found.failure.message) << "\n";
    for (const std::string& other : found.failure.also) out << "also " << escape_lines(other) << "\n";
    out << "trace\n" << found.trace;
    return out.str();
}

FoundFailure decode(const std::string& payload) {
    FoundFailure found;
    std::istringstream in(payload);
    std::string line;
    while (std::getline(in, line) && line != "trace") {
        const std::size_t space = line.find(' ');
        const std::string key = line.substr(0, space);
        const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
        if (key == "cases") found.cases = std::stoul(value);
        if (key == "found") found.found_length = std::stoul(value);
        if (key == "step") found.failure.step = std::stoul(value);
        if (key == "property") found.failure.property = value;
        if (key == "message") found.failure.message = unescape_lines(value);
        if (key == "also") found.failure.also.push_back(unescape_lines(value));
    }
    found.trace.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return found;
}

// ---- the child's work -------------------------------------------------------------

// Each property searches traces of its own: property i of the run's list
// takes seeds seed + i * 2^32, seed + i * 2^32 + 1, ...
std::uint64_t first_seed_of(std::uint64_t seed, std::size_t property_index) {
    return seed + (static_cast<std::uint64_t>(property_index) << 32);
}

// Runs traces of `adapter` checking `properties` on fresh engines, each
// announced to the parent first ("begin": when the child dies, the parent
// knows which trace killed it) and each operation marked on the channel
// (the parent's silence limit, and the step a crash is pinned to); dumps go
// under the job's own directory, emptied first, which the parent removes
// however the child ends.
Runner runner_for(const Adapter& adapter, PropertySet properties, Channel& out) {
    Runner runner;
    runner.make = adapter.make;
    runner.options.properties = properties;
    runner.options.on_step = [&out](std::size_t step) { out.step(step); };
    if (!out.work_dir().empty()) runner.options.work_dir = out.work_dir() + "/run";
    runner.before_run = [&out, dir = runner.options.work_dir](const Trace& trace) {
        out.send("begin", format_trace(trace));
        std::error_code ignored;
        if (!dir.empty()) fs::remove_all(dir, ignored);
    };
    // For the parent's progress lines.
    runner.on_shorter = [&out](std::size_t operations) { out.send("shrunk", std::to_string(operations)); };
    return runner;
}

void send_finding(const Finding& finding, std::size_t cases, Channel& out) {
    out.send("fail", encode({cases, finding.found.size(), finding.reported, format_trace(finding.shrunk.trace)}));
}

std::string encode_stats(std::size_t cases, const Coverage& coverage) {
    std::ostringstream out;
    out << "cases " << cases << "\n";
    for (std::size_t i = 0; i < shape_count; ++i) out << shape_id(static_cast<Shape>(i)) << " " << coverage.shapes[i] << "\n";
    return out.str();
}

void decode_stats(const std::string& payload, std::size_t* cases, Coverage* coverage) {
    std::istringstream in(payload);
    std::string key;
    std::uint64_t value = 0;
    while (in >> key >> value) {
        if (key == "cases") *cases += value;
        for (std::size_t i = 0; i < shape_count; ++i) {
            if (key == shape_id(static_cast<Shape>(i))) coverage->shapes[i] += static_cast<std::uint32_t>(value);
        }
    }
}

// Searches seeded traces for a violation of one property: the property's
// own traces (first_seed_of), with every property the engine can be judged
// on checked on each, so that a trace is blamed on what it breaks first.
// Another property found broken is reported as such ("other"), and the
// search goes on for this one, passing over the traces that break a
// property already found broken first (what follows such a break proves
// nothing); an engine error ends it ("blocked": the property could not be
// judged past it).
void search_property(const Adapter& adapter, Property property, std::size_t index, const ConformanceOptions& options,
                     Channel& out) {
    const std::shared_ptr<Engine> probe = adapter.make();
    const Capabilities capabilities = probe->capabilities();
    if (!checkable(capabilities).has(property)) {
        out.send("skipped", "the adapter does not report what this property needs (see Capabilities)");
        return;
    }
    WorkloadOptions workload = options.workload;
    workload.capabilities = capabilities;
    workload.dump_kill = property == Property::dump_safe;
    const PropertySet checked = checkable(capabilities);
    std::vector<std::string> known;  // the properties found broken so far
    const double start = monotonic_seconds();
    std::size_t cases = 0;
    Coverage coverage;
    const auto finish = [&](const std::string& kind, const std::string& payload) {
        out.send("stats", encode_stats(cases, coverage));
        out.send(kind, payload);
    };
    for (;;) {
        Budget budget{first_seed_of(options.seed, index) + cases, options.cases > cases ? options.cases - cases : 0, 0};
        if (options.seconds > 0) {
            budget.seconds = options.seconds - (monotonic_seconds() - start);
            if (budget.seconds <= 0) break;
        } else if (budget.cases == 0) {
            break;
        }
        Runner runner = runner_for(adapter, checked, out);
        runner.passes_over = [&known](const Failure& failure) {
            return std::find(known.begin(), known.end(), failure.property) != known.end();
        };
        const SearchResult result = search(runner, budget, workload);
        cases += result.cases;
        coverage.add(result.coverage);
        if (!result.finding) break;
        const Finding& finding = *result.finding;
        const FoundFailure found{cases, finding.found.size(), finding.reported, format_trace(finding.shrunk.trace)};
        const std::optional<Property> broken = parse_property(finding.reported.property);
        if (broken == property) {
            finish("fail", encode(found));
            return;
        }
        out.send("other", encode(found));
        if (!broken) {
            finish("blocked", "the engine errors (see engine-error) at trace " + std::to_string(cases) +
                                  " of the search; this property was not judged past it");
            return;
        }
        known.push_back(finding.reported.property);
    }
    finish("pass", std::to_string(cases));
}


// ---- the parent's side -------------------------------------------------------------

// Writes the failing trace of `result` to <trace dir>/<stem>-<property>.trace.
// The reproduce command names the file only once it is written.
void write_trace_file(const Adapter& adapter, const std::string& stem, PropertyResult& result,
                      const ConformanceOptions& options) {
    const std::string file = options.trace_dir + "/" + stem + "-" + result.id + ".trace";
    const std::string reproduce = replay_command(adapter, file, parse_property(result.id));
    std::error_code error;
    fs::create_directories(options.trace_dir, error);  // made by TraceDir, unless removed since
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << "# kvcheck: " << (result.fault.empty() ? result.id + " fails" : "fault (" + printable(result.fault, 200) + ")")
        << " on adapter " << printable(adapter.name, 200) << "\n# " << printable(result.message, 2000) << "\n# seed "
        << options.seed << "\n# reproduce: " << reproduce << "\n"
        << result.trace;
    out.close();
    if (!out) {
        result.trace_file_error = "cannot write " + file + ": " + std::strerror(errno);
        return;
    }
    result.trace_file = file;
    result.reproduce = reproduce;
}

// The operation at `step` of the trace text, for messages: "step 3 (add)".
std::string step_text(const std::string& trace_text, std::optional<std::size_t> step) {
    if (!step) return "";
    std::string name = "?";
    try {
        const Trace trace = parse_trace(trace_text);
        if (*step < trace.size()) name = op_name(trace[*step]);
    } catch (const std::exception&) {
    }
    return " at step " + std::to_string(*step + 1) + " (" + name + ")";
}

// Runs one candidate to its end in `sandbox`, polling every job there (so
// the limits of the run's other children hold while a fault is shrunk).
// Nothing is started once the run is interrupted.
std::shared_ptr<Job> run_in(Sandbox& sandbox, const std::function<void(Channel&)>& body, const Limits& limits) {
    if (interrupted_by() != 0) return nullptr;
    auto job = sandbox.start(body, nullptr, limits);
    while (!job->done) {
        sandbox.poll(0.1);
        if (interrupted_by() != 0) sandbox.stop_all("interrupted by " + signal_name(interrupted_by()));
    }
    return job;
}

struct ShrunkFault {
    std::string trace;
    std::optional<std::size_t> step;  // where the fault struck in it
    bool recurred = true;             // false: the trace alone, in a fresh process, did not fault
};

// Shrinks a trace that made a child die, each candidate in a child of its
// own, in the run's own sandbox; hangs and time-outs are only cut after the
// step they struck at (each try would cost the full time limit), and leaks
// shrunk only a little. The trace runs alone first: a fault that built up
// over the traces its process ran before (a leak across traces) does not
// recur, no shorter trace would show it, and the trace is kept whole.
ShrunkFault shrink_fault(const Adapter& adapter, const std::string& trace_text, const Fault& fault,
                         std::optional<std::size_t> step, PropertySet properties, const ConformanceOptions& options,
                         Sandbox& sandbox) {
    const ShrunkFault as_found{trace_text, step};
    if (fault.kind == "stopped" || trace_text.empty()) return as_found;
    Trace trace;
    try {
        trace = parse_trace(trace_text);
    } catch (const std::exception&) {
        return as_found;
    }
    if (trace.empty()) return as_found;
    if (fault.kind == "hang" || fault.kind == "time") {
        if (step && *step + 1 < trace.size()) trace.resize(*step + 1);
        return {format_trace(trace), step};
    }
    if (interrupted_by() != 0) return as_found;
    std::size_t tried = 0;
    std::size_t shortest = trace.size();
    double noted = monotonic_seconds();
    const Oracle oracle = [&](const Trace& candidate) -> std::optional<Failure> {
        const auto job = run_in(sandbox, [&](Channel& out) { runner_for(adapter, properties, out).run(candidate); },
                                options.limits);
        if (job && adapter.take_output) adapter.take_output(job->pid);
        ++tried;
        const bool same = job && job->fault && job->fault->kind == fault.kind;
        if (same) shortest = std::min(shortest, candidate.size());
        if (options.progress && monotonic_seconds() - noted >= options.progress_seconds) {
            noted = monotonic_seconds();
            std::cerr << "kvcheck: shrinking the fault (" << fault.kind << ") of " << printable(adapter.name, 40) << ": " << tried
                      << " candidate traces run, the shortest failing one " << shortest << " operations\n";
        }
        if (!same) return std::nullopt;
        return Failure{"fault:" + fault.kind, job->last_step.value_or(candidate.size() - 1), job->fault->detail, {}};
    };
    const std::optional<Failure> alone = oracle(trace);
    if (!alone) return {trace_text, step, interrupted_by() != 0};
    ShrinkOptions limits;
    limits.runs_max = fault.kind == "memory" ? 20 : 100;  // each leaking try fills the memory limit
    const ShrinkResult shrunk = shrink(trace, *alone, oracle, limits);
    return {format_trace(shrunk.trace), shrunk.failure.step, true};
}

std::string fault_message(const Fault& fault, const std::string& where) {
    const std::string& kind = fault.kind;
    const std::string what = kind == "crash"    ? "crashed (" + fault.detail + ")"
                             : kind == "hang"   ? "hung (" + fault.detail + ")"
                             : kind == "time"   ? "ran out of time (" + fault.detail + ")"
                             : kind == "memory" ? "exceeded the memory limit (" + fault.detail + ")"
                             : kind == "protocol" ? "broke the adapter protocol (" + fault.detail + ")"
                             : kind == "start"    ? "could not start its process (" + fault.detail + ")"
                                                  : "exited (" + fault.detail + ")";
    return "the engine " + what + where + " while running the trace below";
}

// A job run in kvcheck's own process (--no-isolate): messages kept as a
// child's would be.
std::shared_ptr<Job> run_in_process(const std::function<void(Channel&)>& body) {
    auto job = std::make_shared<Job>();
    Job& target = *job;
    Channel channel([&target](const std::string& kind, const std::string& payload) {
        if (kind == "begin") {
            target.last_begin = payload;
            ++target.begins;
        } else {
            target.messages.push_back({kind, payload});
        }
    });
    body(channel);
    job->done = true;
    job->ended = true;
    return job;
}

// After an adapter hung for the full silence limit, its other properties
// get this much: enough for any operation that is not stuck, short of
// waiting the full limit again for each property.
double fail_fast_seconds(const Limits& limits) {
    return std::min(limits.silence_seconds, std::max(2.0, limits.silence_seconds / 10));
}

std::string seconds_text(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", seconds);
    return text;
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
    Scheduler(const std::vector<Adapter>& adapters, const ConformanceOptions& options)
        : adapters_(adapters), options_(options), sandbox_(options.limits), hung_on_(adapters.size()) {
        properties_ = options.properties;
        if (properties_.empty()) properties_.assign(all_properties().begin(), all_properties().end());
        std::set<std::string> stems;
        for (const Adapter& adapter : adapters) {
            AdapterResult result;
            result.adapter = adapter;
            for (Property p : properties_) {
                PropertyResult property;
                property.id = property_id(p);
                result.properties.push_back(std::move(property));
            }
            PropertyResult errors;
            errors.id = engine_error_id;
            result.properties.push_back(std::move(errors));
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
                Task task;
                task.adapter = a;
                task.property = p;
                pending_.push_back(std::move(task));
            }
        }
        total_ = pending_.size();
    }

    ConformanceRun run() {
        while (!pending_.empty() || !running_.empty()) {
            while (!pending_.empty() && running_.size() < std::max<std::size_t>(options_.jobs, 1) && interrupted_by() == 0) {
                running_.push_back(start(pending_.front()));
                pending_.pop_front();
            }
            sandbox_.poll(0.2);
            if (interrupted_by() != 0) return stop();
            const double now = monotonic_seconds();
            // Collecting a fault shrinks it, which may take a while: the
            // tasks are taken out of running_ first, so that a hang found
            // meanwhile can still cut the limits of the others.
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
                              << property_id(properties_[it->property]) << ": " << it->job->begins << " traces so far\n";
                }
                ++it;
            }
            for (const Task& task : finished) collect(task, monotonic_seconds());
            if (interrupted_by() != 0) return stop();
        }
        settle_elsewhere();
        return {results_, 0};
    }

  private:
    // A failure of another property (or an engine error) found while
    // searching this one: the first found is kept for that property.
    void note_elsewhere(const Task& task, const FoundFailure& found) {
        const auto key = std::make_pair(task.adapter, found.failure.property);
        if (elsewhere_.count(key) != 0) return;
        PropertyResult result;
        result.id = found.failure.property;
        result.verdict = "fail";
        result.cases = found.cases;
        result.found_length = found.found_length;
        result.message = "found while searching " + std::string(property_id(properties_[task.property])) + ": " +
                         found.failure.message;
        result.also = found.failure.also;
        result.trace = found.trace;
        // The engine's output is that of the search that found it (its
        // tail: the search may have gone on past the failure).
        result.engine_output = task.job->output;
        result.output = results_[task.adapter].properties[task.property].output;
        elsewhere_.emplace(key, std::move(result));
    }

    // A property whose own search passed, or was cut short, but that another
    // search found broken, fails with what that search found.
    void settle_elsewhere() {
        for (auto& [key, found] : elsewhere_) {
            AdapterResult& adapter = results_[key.first];
            for (PropertyResult& row : adapter.properties) {
                if (row.id != key.second || row.verdict == "fail" || row.verdict == "not-run") continue;
                const double seconds = row.seconds;
                row = found;
                row.seconds = seconds;
                write_trace_file(adapter.adapter, stems_[key.first], row, options_);
            }
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
            if (!hung_on_[task.adapter].empty()) limits.silence_seconds = fail_fast_seconds(options_.limits);
            task.job = sandbox_.start(body, nullptr, limits);
        } else {
            task.job = run_in_process(body);
        }
        return task;
    }

    // The adapter hung for the full limit: its other properties, running
    // or to come, get the short one (fail fast).
    void note_hang(std::size_t adapter, const std::string& property) {
        if (!hung_on_[adapter].empty()) return;
        hung_on_[adapter] = property;
        for (Task& task : running_) {
            if (task.adapter == adapter) task.job->limits.silence_seconds = fail_fast_seconds(options_.limits);
        }
    }

    void collect_fault(const Task& task, PropertyResult& result) {
        const Adapter& adapter = adapters_[task.adapter];
        const Job& job = *task.job;
        const Fault& fault = *job.fault;
        if (fault.kind == "stopped") {
            result.verdict = "not-run";
            result.message = "not finished: " + fault.detail + " (after " + std::to_string(job.begins) + " traces)";
            return;
        }
        result.verdict = "fail";
        result.fault = fault.kind + ": " + fault.detail;
        const ShrunkFault shrunk = shrink_fault(adapter, job.last_begin, fault, job.last_step,
                                                PropertySet::only(properties_[task.property]), options_, sandbox_);
        result.trace = shrunk.trace;
        result.found_length = static_cast<std::size_t>(std::count(job.last_begin.begin(), job.last_begin.end(), '\n'));
        result.message = fault_message(fault, step_text(shrunk.trace, shrunk.step));
        if (!shrunk.recurred) {
            result.message += " (it did not recur when this trace ran alone in a fresh engine process: it built up over the " +
                              std::to_string(job.begins - 1) + " traces that process ran before)";
        }
        if (fault.kind != "hang") return;
        if (job.limits.silence_seconds < options_.limits.silence_seconds) {
            result.message += " (the limit was cut from " + seconds_text(options_.limits.silence_seconds) + " s to " +
                              seconds_text(job.limits.silence_seconds) + " s after the adapter hung on " +
                              hung_on_[task.adapter] + ": kvcheck fails fast after a hang)";
        } else {
            note_hang(task.adapter, result.id);
        }
    }

    void collect(const Task& task, double now) {
        const Adapter& adapter = adapters_[task.adapter];
        PropertyResult& result = results_[task.adapter].properties[task.property];
        const Job& job = *task.job;
        result.seconds = now - task.started;
        result.cases = job.begins;
        result.engine_output = job.output;
        if (adapter.take_output) result.output = adapter.take_output(options_.isolate ? job.pid : 0);
        for (const Message& message : job.messages) {
            if (message.kind == "pass") {
                result.verdict = "pass";
                result.cases = std::stoul(message.payload);
            } else if (message.kind == "skipped") {
                result.verdict = "skipped";
                result.message = message.payload;
            } else if (message.kind == "fail") {
                const FoundFailure found = decode(message.payload);
                result.verdict = "fail";
                result.cases = found.cases;
                result.found_length = found.found_length;
                result.message = found.failure.property == result.id
                                     ? found.failure.message
                                     : found.failure.property + ": " + found.failure.message;
                result.also = found.failure.also;
                result.trace = found.trace;
            } else if (message.kind == "blocked") {
                result.verdict = "blocked";
                result.message = message.payload;
            } else if (message.kind == "other") {
                note_elsewhere(task, decode(message.payload));
            } else if (message.kind == "stats") {
                decode_stats(message.payload, &results_[task.adapter].traces, &results_[task.adapter].coverage);
            } else if (message.kind == "error") {
                result.verdict = "fail";
                result.fault = "error: " + one_line(message.payload);
                result.message = "the adapter failed outside any trace: " + one_line(message.payload);
            }
        }
        if (job.fault) collect_fault(task, result);
        if (result.verdict != "fail") result.output.clear();  // shown with a failure only
        if (result.verdict == "fail" && !result.trace.empty()) write_trace_file(adapter, stems_[task.adapter], result, options_);
        ++finished_;
        if (options_.progress) {
            const std::string verdict = result.fault.empty() ? result.verdict : "FAULT";
            char line[128];
            std::snprintf(line, sizeof line, "%-22s %-7s %5zu cases %6.2f s\n", result.id.c_str(), verdict.c_str(),
                          result.cases, result.seconds);
            std::string name = printable(adapter.name, 40);
            name.resize(std::max(name.size(), name_width_), ' ');
            std::cerr << "[" << std::string(finished_ < 10 ? 2 : finished_ < 100 ? 1 : 0, ' ') << finished_ << "/"
                      << total_ << "] " << name << " " << line;
        }
    }

    const std::vector<Adapter>& adapters_;
    const ConformanceOptions& options_;
    std::vector<Property> properties_;
    Sandbox sandbox_;
    std::deque<Task> pending_;
    std::vector<Task> running_;
    std::vector<AdapterResult> results_;
    std::vector<std::string> stems_;    // per adapter: its trace files' name
    std::vector<std::string> hung_on_;  // per adapter: the property it first hung on, or ""
    std::size_t name_width_ = 10;
    std::size_t total_ = 0;
    std::size_t finished_ = 0;
    std::map<std::pair<std::size_t, std::string>, PropertyResult> elsewhere_;  // (adapter, property id)
};

}  // namespace

bool AdapterResult::all_pass() const {
    return std::none_of(properties.begin(), properties.end(), [](const PropertyResult& p) { return p.verdict == "fail"; });
}

bool AdapterResult::fails(const std::string& property) const {
    return std::any_of(properties.begin(), properties.end(),
                       [&](const PropertyResult& p) { return p.id == property && p.verdict == "fail"; });
}

ConformanceRun check_adapters(const std::vector<Adapter>& adapters, const ConformanceOptions& options) {
    return Scheduler(adapters, options).run();
}

namespace {

// Every few seconds of a long replay or shrink, a line on stderr.
void note_progress(const Job& job, bool shrink_it, std::size_t trace_length, std::size_t shortest, double seconds) {
    const std::uint64_t position = job.progress == nullptr ? 0 : job.progress->position.load();
    const std::uint64_t traces = Progress::trace_of(position);
    const std::uint64_t step = Progress::step_of(position);
    std::cerr << "kvcheck " << (shrink_it ? "shrink" : "replay") << ": " << static_cast<long long>(seconds) << " s: ";
    if (shrink_it && traces > 1) {
        std::cerr << traces - 1 << " shorter traces tried, the shortest failing one " << shortest << " operations\n";
    } else if (traces > 1) {
        std::cerr << "pinning the failure to its step: run " << traces - 1 << ", at step " << step + 1 << "\n";
    } else {
        std::cerr << "step " << step + 1 << " of " << trace_length << "\n";
    }
}

}  // namespace

ReplayResult replay_trace(const Adapter& adapter, const Trace& trace, PropertySet properties, bool shrink_it,
                          const ConformanceOptions& options) {
    auto body = [&](Channel& out) {
        const Runner runner = runner_for(adapter, properties, out);
        const RunResult run = runner.run(trace);
        if (!run.failure) {
            out.send("pass", std::to_string(run.steps_run) + " " + std::to_string(run.coverage.ops_skipped));
        } else if (shrink_it) {
            send_finding(shrink_failure(runner, trace, *run.failure), 1, out);
        } else {
            out.send("fail", encode({1, trace.size(), pin_failure(runner, trace, *run.failure), format_trace(trace)}));
        }
    };
    std::shared_ptr<Job> job;
    Sandbox sandbox(options.limits);
    if (options.isolate) {
        std::size_t shortest = trace.size();
        job = sandbox.start(body, [&shortest](const Message& m) {
            if (m.kind == "shrunk") shortest = std::stoul(m.payload);
        });
        const double started = monotonic_seconds();
        double noted = started;
        while (!job->done) {
            sandbox.poll(0.2);
            if (interrupted_by() != 0) sandbox.stop_all("interrupted by " + signal_name(interrupted_by()));
            const double now = monotonic_seconds();
            if (options.progress && !job->done && now - noted >= options.progress_seconds) {
                noted = now;
                note_progress(*job, shrink_it, trace.size(), shortest, now - started);
            }
        }
    } else {
        job = run_in_process(body);
    }
    ReplayResult result;
    result.trace = trace;
    result.engine_output = job->output;
    if (adapter.take_output) result.output = adapter.take_output(options.isolate ? job->pid : 0);
    if (job->fault && job->fault->kind == "stopped") {
        result.interrupted_by = interrupted_by();
        return result;
    }
    for (const Message& message : job->messages) {
        if (message.kind == "pass") {
            std::istringstream(message.payload) >> result.steps_run >> result.ops_skipped;
        } else if (message.kind == "fail") {
            const FoundFailure found = decode(message.payload);
            result.failed = true;
            result.failure = found.failure;
            result.trace = parse_trace(found.trace);
        } else if (message.kind == "error") {
            result.failed = true;
            result.failure = Failure{engine_error_id, 0, "the adapter failed outside any trace: " + one_line(message.payload), {}};
        }
    }
    if (job->fault) {
        const Fault& fault = *job->fault;
        result.failed = true;
        result.fault = fault.kind + ": " + fault.detail;
        // The trace the fault struck in: the replayed one, or one of the
        // shorter ones a shrink or a pinning run tried.
        ShrunkFault struck{job->last_begin.empty() ? format_trace(trace) : job->last_begin, job->last_step};
        if (shrink_it) struck = shrink_fault(adapter, struck.trace, fault, struck.step, properties, options, sandbox);
        if (interrupted_by() != 0) {
            result.interrupted_by = interrupted_by();
            return result;
        }
        result.trace = parse_trace(struck.trace);
        const std::size_t last = result.trace.empty() ? 0 : result.trace.size() - 1;
        result.failure = Failure{"fault:" + fault.kind, std::min(struck.step.value_or(last), last), fault.detail, {}};
    }
    return result;
}

}  // namespace kvcheck::cli
