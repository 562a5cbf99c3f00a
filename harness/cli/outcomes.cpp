#include "outcomes.h"

#include "interrupt.h"
#include "output.h"
#include "kvcheck/search.h"
#include "search_job.h"
#include "text.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace kvcheck::cli {

namespace fs = std::filesystem;

std::string Reproduction::label() const {
    const std::string alone = std::to_string(failed) + " of " + std::to_string(replays) + " replays on a fresh engine";
    if (kind == "flaky") {
        return "flaky: failed " + alone +
               (failed == 0 ? " (and no earlier trace run first in the same process made it fail again)" : "");
    }
    if (kind == "shared-state") {
        return "shared-state: engines share state across instances: the trace fails " + alone +
               ", but fails after the prefix trace ran first in the same engine process (" + std::to_string(prefix_failed) +
               " of " + std::to_string(prefix_replays) + " replays)";
    }
    return "";
}

// Writes the trace of `failure`, the `ordinal`-th (from 0) of `property`, to
// <trace dir>/<stem>-<property>.trace (the first) or ...-<property>-<n>.trace
// (the n-th), the run's name suffix before ".trace" when another run holds
// the directory (TraceDir). Each file is written whole or not at all
// (replace_file: a full disk leaves no empty trace, which would replay as
// a pass). The reproduce command names the file only once it is written.
void write_trace_file(const Adapter& adapter, const std::string& stem, const std::string& property, std::size_t ordinal,
                      FailureReport& failure, const ConformanceOptions& options) {
    const std::string name = options.trace_dir + "/" + stem + "-" + property + (ordinal == 0 ? "" : "-" + std::to_string(ordinal + 1));
    const std::string file = name + options.trace_name_suffix + ".trace";
    std::string reproduce = replay_command(adapter, file, parse_property(property));
    std::error_code error;
    fs::create_directories(options.trace_dir, error);  // made by TraceDir, unless removed since
    // A shared-state finding's first part: the trace that, run first in the
    // same engine process, makes the other fail (kvcheck replay --prefix).
    if (!failure.reproduction.prefix.empty()) {
        const std::string prefix_file = name + ".prefix" + options.trace_name_suffix + ".trace";
        std::ostringstream prefix;
        prefix << "# kvcheck: run first, in the same engine process, it makes " << file << " fail " << property
               << " on adapter " << printable(adapter.name, 200) << "\n"
               << failure.reproduction.prefix;
        if (const int failed = replace_file(prefix_file, prefix.str())) {
            failure.trace_file_error = "cannot write " + prefix_file + ": " + std::strerror(failed);
            return;
        }
        failure.prefix_file = prefix_file;
        reproduce += " --prefix " + shell_quoted(prefix_file);
    }
    std::ostringstream out;
    out << "# kvcheck: " << (failure.fault.empty() ? property + " fails" : "fault (" + printable(failure.fault, 200) + ")")
        << " on adapter " << printable(adapter.name, 200) << "\n# " << printable(failure.message, 2000) << "\n# seed "
        << options.seed << "\n# reproduce: " << reproduce << "\n"
        << failure.threads << failure.trace;
    if (const int failed = replace_file(file, out.str())) {
        failure.trace_file_error = "cannot write " + file + ": " + std::strerror(failed);
        return;
    }
    failure.trace_file = file;
    failure.reproduce = reproduce;
}

void settle_failures(const Adapter& adapter, const std::string& stem, PropertyResult& result,
                     const ConformanceOptions& options) {
    std::size_t ordinal = 0;
    for (FailureReport& failure : result.failures) {
        if (!failure.trace.empty()) write_trace_file(adapter, stem, result.id, ordinal++, failure, options);
    }
    if (result.failures.empty()) return;
    const FailureReport& first = result.failures.front();
    result.message = first.message;
    result.also = first.also;
    result.fault = first.fault;
    result.trace = first.trace;
    result.found_length = first.found_length;
    result.trace_file = first.trace_file;
    result.trace_file_error = first.trace_file_error;
    result.reproduce = first.reproduce;
    if (!first.output.empty()) result.output = first.output;  // the failing trace's, not the search's last
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
    // The model searched, when known here: --model, or a process adapter's
    // (a plugin's engines are not made in this process).
    if (options.model) {
        limits.model = *options.model;
    } else if (adapter.model) {
        limits.model = *adapter.model;
    }
    const ShrinkResult shrunk = shrink(trace, *alone, oracle, limits);
    // A fault that struck outside any step (while an engine was made or
    // destroyed) stays pinned on none.
    return {format_trace(shrunk.trace), step ? std::optional<std::size_t>(shrunk.failure.step) : std::nullopt, true};
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

}  // namespace kvcheck::cli
