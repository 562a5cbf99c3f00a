#include "run_util.h"

#include <filesystem>
#include <fstream>
#include <functional>

namespace kvcheck::props {

RunResult run_on(const Adapter& adapter, const Trace& trace, PropertySet properties) {
    Runner runner;
    runner.make = adapter.make;
    runner.options.properties = properties;
    return runner.run(trace);
}

std::optional<Finding> find_and_shrink(const Adapter& adapter, std::uint64_t seed, std::size_t traces_max,
                                       const WorkloadOptions& options, PropertySet properties, const ModelDomain& model) {
    Runner runner;
    runner.make = adapter.make;
    runner.options.properties = properties;
    // What the engine supports, as kvcheck run draws it.
    WorkloadOptions workload = options;
    workload.capabilities = adapter.make()->capabilities();
    if (model.declared) workload.capabilities.model = model;
    return search(runner, {seed, 0, 0, traces_max, 0}, workload).finding;
}

std::string reproduce_command(const Adapter& adapter, const Trace& trace) {
    const std::filesystem::path dir = KVCHECK_TRACE_DIR;
    std::error_code ignored;
    std::filesystem::create_directories(dir, ignored);
    const std::string text = format_trace(trace);
    const std::filesystem::path path =
        dir / (adapter.name + "-" + std::to_string(std::hash<std::string>{}(text)) + ".trace");
    const std::string command = replay_command(adapter, path.string());
    std::ofstream(path) << "# replay: " << command << "\n" << text;
    return command;
}

}  // namespace kvcheck::props
