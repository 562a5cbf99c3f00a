#include "conformance.h"

#include "interrupt.h"
#include "kvcheck/search.h"
#include "outcomes.h"
#include "search_job.h"

#include <iostream>
#include <sstream>

namespace kvcheck::cli {
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

// A shared-state finding's two parts (docs/semantics.md#reproduction): the
// prefix on an engine nothing earlier reached, the trace after it in that
// engine's process; its failure, if any. Else the trace alone, on another
// such engine, and the first step whose answers differ from the run after
// the prefix. (An engine loaded in this process runs alone after the two
// parts, in the same process: a difference it shows is one, but one it
// hides is not seen. A plugin's finding is replayed so by a kvcheck
// process of its own.)
RunResult replay_after(const Adapter& adapter, const Runner& runner, const Trace& prefix, const Trace& trace) {
    Runner recording = runner;
    recording.options.record_answers = true;
    const EngineFactory isolated = isolated_factory(adapter);
    run_first_on(runner, isolated, prefix);
    RunResult run = recording.run(trace);
    if (run.failure) return run;
    const RunResult alone = run_first_on(recording, isolated, trace);
    if (!alone.failure) run.failure = answers_difference(trace, alone.answers, run.answers);
    return run;
}

}  // namespace

ReplayResult replay_trace(const Adapter& adapter, const Trace& trace, PropertySet properties, bool shrink_it,
                          const ConformanceOptions& options, const std::optional<Trace>& prefix) {
    auto body = [&](Channel& out) {
        const Runner runner = runner_for(adapter, properties, out);
        RunResult run;
        if (prefix) {
            run = replay_after(adapter, runner, *prefix, trace);
        } else {
            run = runner.run(trace);
        }
        if (run.failure && run.failure->property == shared_state_id) {
            out.send("fail", encode({1, trace.size(), *run.failure, format_trace(trace)}));
        } else if (!run.failure) {
            out.send("pass", std::to_string(run.steps_run) + " " + std::to_string(run.coverage.ops_skipped));
        } else if (shrink_it) {
            ShrinkOptions shrinking;  // --model, else what the engine declares
            if (options.model) shrinking.model = *options.model;
            send_finding(shrink_failure(runner, trace, *run.failure, shrinking), 1, out);
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
