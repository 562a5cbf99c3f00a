// Shared plumbing of the property suites: run a trace on a bundled adapter,
// find a failure by seeded search, shrink it, and print it the one way.
#pragma once

#include "bundled.h"
#include "kvcheck/executor.h"
#include "kvcheck/shrink.h"
#include "kvcheck/workload.h"

#include <chrono>
#include <optional>
#include <string>

namespace kvcheck::props {

// Runs `trace` on a fresh engine of `adapter`.
RunResult run_on(const adapters::BundledAdapter& adapter, const Trace& trace,
                 PropertySet properties = PropertySet::all());

struct Finding {
    std::uint64_t seed = 0;        // the seed of the first failing trace
    std::size_t traces_tried = 0;  // traces run until then
    Trace found;                   // that trace
    ShrinkResult shrunk;
    double find_seconds = 0;
    double shrink_seconds = 0;
};

// Searches seeds first_seed, first_seed+1, ... up to traces_max traces for
// a failing trace on `adapter`, then shrinks it.
std::optional<Finding> find_and_shrink(const adapters::BundledAdapter& adapter, std::uint64_t first_seed,
                                       std::size_t traces_max, const WorkloadOptions& options,
                                       PropertySet properties = PropertySet::all());

// The command that replays a failure of `adapter`: the trace goes to a file.
std::string reproduce_command(const std::string& adapter, const Trace& trace);

}  // namespace kvcheck::props
