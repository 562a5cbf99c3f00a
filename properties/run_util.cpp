#include "run_util.h"

#include <filesystem>
#include <fstream>
#include <functional>

namespace kvcheck::props {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

RunResult run_on(const adapters::BundledAdapter& adapter, const Trace& trace, PropertySet properties) {
    const std::unique_ptr<Engine> engine = adapter.make();
    RunOptions options;
    options.properties = properties;
    return execute(trace, *engine, options);
}

std::optional<Finding> find_and_shrink(const adapters::BundledAdapter& adapter, std::uint64_t first_seed,
                                       std::size_t traces_max, const WorkloadOptions& options,
                                       PropertySet properties) {
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < traces_max; ++i) {
        const std::uint64_t seed = first_seed + i;
        Trace trace = trace_for_seed(seed, options);
        RunResult result = run_on(adapter, trace, properties);
        if (!result.failure) continue;
        Finding finding;
        finding.seed = seed;
        finding.traces_tried = i + 1;
        finding.found = trace;
        finding.find_seconds = seconds_since(start);
        const auto shrink_start = std::chrono::steady_clock::now();
        const Oracle oracle = [&](const Trace& candidate) { return run_on(adapter, candidate, properties).failure; };
        finding.shrunk = shrink(trace, *result.failure, oracle);
        finding.shrink_seconds = seconds_since(shrink_start);
        return finding;
    }
    return std::nullopt;
}

std::string reproduce_command(const std::string& adapter, const Trace& trace) {
    const auto path = std::filesystem::temp_directory_path() /
                      ("kvcheck-failure-" + adapter + "-" + std::to_string(std::hash<std::string>{}(format_trace(trace))) + ".trace");
    std::ofstream(path) << "# replay: kvcheck replay " << path.string() << " --adapter " << adapter << "\n"
                        << format_trace(trace);
    return "kvcheck replay " + path.string() + " --adapter " + adapter;
}

}  // namespace kvcheck::props
