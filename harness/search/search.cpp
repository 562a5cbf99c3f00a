#include "kvcheck/search.h"

#include <chrono>

namespace kvcheck {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

RunResult Runner::run(const Trace& trace, bool every_entry_every_step) const {
    if (before_run) before_run(trace);
    RunOptions run_options = options;
    run_options.every_entry_every_step = options.every_entry_every_step || every_entry_every_step;
    if (!run_options.fresh_engine) run_options.fresh_engine = make;
    if (check) return check(trace, run_options);
    const std::shared_ptr<Engine> engine = make();
    return execute(trace, *engine, run_options);
}

SearchResult search(const Runner& runner, const Budget& budget, const WorkloadOptions& workload) {
    const auto start = std::chrono::steady_clock::now();
    SearchResult result;
    for (;; ++result.cases) {
        const bool spent = budget.seconds > 0 ? seconds_since(start) >= budget.seconds : result.cases >= budget.cases;
        if (spent) break;
        const std::uint64_t seed = budget.first_seed + result.cases;
        const Trace trace = trace_for_seed(seed, workload);
        const RunResult run = runner.run(trace);
        if (!run.failure) continue;
        ++result.cases;
        const double find_seconds = seconds_since(start);
        Finding finding = shrink_failure(runner, trace, *run.failure);
        finding.seed = seed;
        finding.traces_tried = result.cases;
        finding.find_seconds = find_seconds;
        result.finding = std::move(finding);
        break;
    }
    return result;
}

Finding shrink_failure(const Runner& runner, const Trace& trace, const Failure& failure, const ShrinkOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    Finding finding;
    finding.found = trace;
    finding.found_failure = failure;
    const Oracle oracle = [&runner](const Trace& candidate) -> std::optional<Failure> {
        if (runner.shrink_accepts && !runner.shrink_accepts(candidate)) return std::nullopt;
        return runner.run(candidate).failure;
    };
    finding.shrunk = shrink(trace, failure, oracle, options);
    // Both schedules find the same failures; should the exact one pass, the
    // failure is reported as the shrinker found it.
    const std::optional<Failure> exact = runner.run(finding.shrunk.trace, true).failure;
    finding.reported = exact ? *exact : finding.shrunk.failure;
    finding.shrink_seconds = seconds_since(start);
    return finding;
}

std::string replay_command(const Adapter& adapter, const std::string& trace_file, std::optional<Property> property) {
    std::string command = "kvcheck replay " + trace_file + " --adapter " + adapter.reference();
    if (property) command += " --property " + std::string(property_id(*property));
    return command;
}

}  // namespace kvcheck
