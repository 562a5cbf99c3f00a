#include "conformance.h"

#include "kvcheck/search.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

namespace kvcheck::cli {
namespace {

std::string one_line(std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    return text;
}

// A message on one line of the child's report and back: an engine's error
// may span lines (a Python traceback), and keeps them.
std::string escape_lines(const std::string& text) {
    std::string out;
    for (const char c : text) {
        if (c == '\\') out += "\\\\";
        else if (c == '\n') out += "\\n";
        else out += c;
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

// Runs traces of `adapter` checking `properties`, each announced to the
// parent first ("begin"): when the child dies, the parent knows which
// trace killed it.
Runner runner_for(const Adapter& adapter, PropertySet properties, Channel& out) {
    Runner runner;
    runner.make = adapter.make;
    runner.options.properties = properties;
    runner.before_run = [&out](const Trace& trace) { out.send("begin", format_trace(trace)); };
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

void write_trace_file(const Adapter& adapter, PropertyResult& result, const ConformanceOptions& options) {
    std::error_code error;
    std::filesystem::create_directories(options.trace_dir, error);
    const std::string file = options.trace_dir + "/" + adapter.name + "-" + result.id + ".trace";
    result.reproduce = replay_command(adapter, file, parse_property(result.id));
    std::ofstream out(file);
    out << "# kvcheck: " << (result.fault.empty() ? result.id + " fails" : "fault (" + result.fault + ")")
        << " on adapter " << adapter.name << "\n# " << one_line(result.message) << "\n# seed " << options.seed
        << "\n# reproduce: " << result.reproduce << "\n"
        << result.trace;
    if (out) result.trace_file = file;
}

// What a fault of the engine's process was, in words.
std::string fault_text(const Fault& fault) {
    if (fault.kind == "crash") return "the engine crashed (" + fault.detail + ")";
    if (fault.kind == "hang") return "the engine hung (" + fault.detail + ")";
    if (fault.kind == "memory") return "the engine exceeded the memory limit (" + fault.detail + ")";
    if (fault.kind == "protocol") return "the engine broke the adapter protocol (" + fault.detail + ")";
    if (fault.kind == "start") return "the engine's process failed to start (" + fault.detail + ")";
    return "the engine exited (" + fault.detail + ")";
}

// Shrinks a trace that made a child die, each candidate in a child of its
// own; hangs are not shrunk (each try would cost the full time limit), and
// leaks only a little.
std::string shrink_fault(const Adapter& adapter, const std::string& trace_text, const Fault& fault, PropertySet properties,
                         const ConformanceOptions& options) {
    if (fault.kind == "hang" || trace_text.empty()) return trace_text;
    Trace trace;
    try {
        trace = parse_trace(trace_text);
    } catch (const std::exception&) {
        return trace_text;
    }
    const Failure as_failure{"fault:" + fault.kind, trace.empty() ? 0 : trace.size() - 1, fault.detail, {}};
    Sandbox sandbox(options.limits);
    const Oracle oracle = [&](const Trace& candidate) -> std::optional<Failure> {
        auto job = sandbox.run([&](Channel& out) { runner_for(adapter, properties, out).run(candidate); });
        if (adapter.take_output) adapter.take_output(job->pid);
        if (!job->fault || job->fault->kind != fault.kind) return std::nullopt;
        return Failure{"fault:" + fault.kind, candidate.size() - 1, job->fault->detail, {}};
    };
    ShrinkOptions limits;
    limits.runs_max = fault.kind == "memory" ? 20 : 100;  // each leaking try fills the memory limit
    return format_trace(shrink(trace, as_failure, oracle, limits).trace);
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
        : adapters_(adapters), options_(options), sandbox_(options.limits) {
        properties_ = options.properties;
        if (properties_.empty()) properties_.assign(all_properties().begin(), all_properties().end());
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

    std::vector<AdapterResult> run() {
        std::vector<Task> running;
        while (!pending_.empty() || !running.empty()) {
            while (!pending_.empty() && running.size() < std::max<std::size_t>(options_.jobs, 1)) {
                running.push_back(start(pending_.front()));
                pending_.pop_front();
            }
            sandbox_.poll(0.2);
            const double now = monotonic_seconds();
            for (auto it = running.begin(); it != running.end();) {
                if (it->job->done) {
                    collect(*it, now);
                    it = running.erase(it);
                    continue;
                }
                if (options_.progress && now - it->last_progress >= 5) {
                    it->last_progress = now;
                    std::cerr << "         " << adapters_[it->adapter].name << " / " << property_id(properties_[it->property])
                              << ": " << count_begins(*it->job) << " traces so far\n";
                }
                ++it;
            }
        }
        settle_elsewhere();
        return results_;
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
        elsewhere_.emplace(key, std::move(result));
    }

    // A property whose own search passed, or was cut short, but that another
    // search found broken, fails with what that search found.
    void settle_elsewhere() {
        for (auto& [key, found] : elsewhere_) {
            AdapterResult& adapter = results_[key.first];
            for (PropertyResult& row : adapter.properties) {
                if (row.id != key.second || row.verdict == "fail") continue;
                const double seconds = row.seconds;
                row = found;
                row.seconds = seconds;
                write_trace_file(adapter.adapter, row, options_);
            }
        }
    }

    static std::size_t count_begins(const Job& job) {
        return static_cast<std::size_t>(std::count_if(job.messages.begin(), job.messages.end(),
                                                      [](const Message& m) { return m.kind == "begin"; }));
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
            task.job = sandbox_.start(body, [](const Message&) {});
        } else {
            task.job = std::make_shared<Job>();
            Job& job = *task.job;
            Channel channel([&job](const std::string& kind, const std::string& payload) {
                if (kind == "begin") job.last_begin = payload;
                job.messages.push_back({kind, payload});
            });
            body(channel);
            job.done = true;
        }
        return task;
    }

    void collect(const Task& task, double now) {
        const Adapter& adapter = adapters_[task.adapter];
        PropertyResult& result = results_[task.adapter].properties[task.property];
        const Job& job = *task.job;
        result.seconds = now - task.started;
        if (adapter.take_output) result.output = adapter.take_output(options_.isolate ? job.pid : 0);
        result.cases = count_begins(job);
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
        if (job.fault) {
            result.verdict = "fail";
            result.fault = job.fault->kind + ": " + job.fault->detail;
            result.message = fault_text(*job.fault) + " while running the trace below";
            result.trace = shrink_fault(adapter, job.last_begin, *job.fault, PropertySet::only(properties_[task.property]), options_);
            result.found_length = result.trace.empty() ? 0 : static_cast<std::size_t>(std::count(job.last_begin.begin(), job.last_begin.end(), '\n'));
        }
        if (result.verdict != "fail") result.output.clear();  // shown with a failure only
        if (result.verdict == "fail" && !result.trace.empty()) write_trace_file(adapter, result, options_);
        ++finished_;
        if (options_.progress) {
            char line[256];
            std::snprintf(line, sizeof line, "[%3zu/%zu] %-10s %-22s %-7s %5zu cases %6.2f s\n", finished_, total_,
                          adapter.name.c_str(), result.id.c_str(),
                          result.fault.empty() ? result.verdict.c_str() : "FAULT", result.cases, result.seconds);
            std::cerr << line;
        }
    }

    const std::vector<Adapter>& adapters_;
    const ConformanceOptions& options_;
    std::vector<Property> properties_;
    Sandbox sandbox_;
    std::deque<Task> pending_;
    std::vector<AdapterResult> results_;
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

std::vector<AdapterResult> check_adapters(const std::vector<Adapter>& adapters, const ConformanceOptions& options) {
    return Scheduler(adapters, options).run();
}

ReplayResult replay_trace(const Adapter& adapter, const Trace& trace, PropertySet properties, bool shrink_it,
                          const ConformanceOptions& options) {
    auto body = [&](Channel& out) {
        const Runner runner = runner_for(adapter, properties, out);
        if (const std::optional<Failure> failure = runner.run(trace, !shrink_it).failure) {
            if (shrink_it) {
                send_finding(shrink_failure(runner, trace, *failure), 1, out);
            } else {
                out.send("fail", encode({1, trace.size(), *failure, format_trace(trace)}));
            }
            return;
        }
        out.send("pass", "1");
    };
    std::shared_ptr<Job> job;
    if (options.isolate) {
        Sandbox sandbox(options.limits);
        job = sandbox.run(body);
    } else {
        job = std::make_shared<Job>();
        Channel channel([&job](const std::string& kind, const std::string& payload) { job->messages.push_back({kind, payload}); });
        body(channel);
    }
    ReplayResult result;
    result.trace = trace;
    if (adapter.take_output) result.output = adapter.take_output(options.isolate ? job->pid : 0);
    for (const Message& message : job->messages) {
        if (message.kind != "fail") continue;
        const FoundFailure found = decode(message.payload);
        result.failed = true;
        result.failure = found.failure;
        result.trace = parse_trace(found.trace);
    }
    if (job->fault) {
        result.failed = true;
        result.fault = job->fault->kind + ": " + job->fault->detail;
        result.failure = Failure{"fault:" + job->fault->kind, trace.empty() ? 0 : trace.size() - 1, job->fault->detail, {}};
        if (shrink_it) result.trace = parse_trace(shrink_fault(adapter, job->last_begin, *job->fault, properties, options));
    }
    return result;
}

}  // namespace kvcheck::cli
