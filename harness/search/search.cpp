#include "kvcheck/search.h"

#include <algorithm>
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
        const std::uint64_t seed = trace_seed(budget.seed, budget.stream, budget.first_index + result.cases);
        const Trace trace = trace_for_seed(seed, workload);
        const RunResult run = runner.run(trace);
        result.coverage.add(run.coverage);
        if (!run.failure || (runner.passes_over && runner.passes_over(*run.failure))) continue;
        ++result.cases;
        const double find_seconds = seconds_since(start);
        ShrinkOptions shrinking;
        shrinking.model = workload.capabilities.model;  // what the search drew in, the shrinker keeps to
        Finding finding = shrink_failure(runner, trace, *run.failure, shrinking);
        finding.seed = seed;
        finding.traces_tried = result.cases;
        finding.find_seconds = find_seconds;
        result.finding = std::move(finding);
        break;
    }
    return result;
}

// Failures within this many operations are pinned by one run reading every
// entry after every step, whose cost grows with the square of the length.
constexpr std::size_t pin_every_step_ops_max = 64;

Failure pin_failure(const Runner& runner, const Trace& trace, const Failure& found) {
    const std::size_t length = std::min(found.step + 1, trace.size());
    const auto prefix = [&trace](std::size_t n) { return Trace(trace.begin(), trace.begin() + static_cast<std::ptrdiff_t>(n)); };
    if (length <= pin_every_step_ops_max) {
        const std::optional<Failure> exact = runner.run(prefix(length), true).failure;
        return exact ? *exact : found;
    }
    std::size_t passes = 0;  // the empty prefix passes
    std::size_t fails = length;
    Failure failure = found;
    while (fails - passes > 1) {
        const std::size_t middle = passes + (fails - passes) / 2;
        if (const std::optional<Failure> earlier = runner.run(prefix(middle)).failure) {
            fails = middle;
            failure = *earlier;
        } else {
            passes = middle;
        }
    }
    return failure;
}

Finding shrink_failure(const Runner& runner, const Trace& trace, const Failure& failure, const ShrinkOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    ShrinkOptions shrinking = options;
    // A trace from elsewhere (a file, fuzz input) shrinks within the model the engine declares.
    if (!shrinking.model.declared && runner.make) shrinking.model = runner.make()->capabilities().model;
    Finding finding;
    finding.found = trace;
    finding.found_failure = failure;
    std::size_t shortest = trace.size();
    const Oracle oracle = [&](const Trace& candidate) -> std::optional<Failure> {
        if (runner.shrink_accepts && !runner.shrink_accepts(candidate)) return std::nullopt;
        std::optional<Failure> found = runner.run(candidate).failure;
        if (found && found->property == failure.property && candidate.size() < shortest) {
            shortest = candidate.size();
            if (runner.on_shorter) runner.on_shorter(shortest);
        }
        return found;
    };
    finding.shrunk = shrink(trace, failure, oracle, shrinking);
    finding.reported = pin_failure(runner, finding.shrunk.trace, finding.shrunk.failure);
    finding.shrink_seconds = seconds_since(start);
    return finding;
}

std::string shell_quoted(const std::string& text) {
    const bool plain = !text.empty() && text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                                "0123456789_./:=@%+,-") == std::string::npos;
    if (plain) return text;
    std::string quoted = "'";
    for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return quoted + "'";
}

std::string replay_command(const Adapter& adapter, const std::string& trace_file, std::optional<Property> property) {
    std::string command = "kvcheck replay " + shell_quoted(trace_file) + " --adapter " + shell_quoted(adapter.reference());
    if (property) command += " --property " + std::string(property_id(*property));
    return command;
}

}  // namespace kvcheck
