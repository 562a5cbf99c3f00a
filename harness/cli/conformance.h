// Conformance runs: every chosen property against every chosen adapter,
// each (adapter, property) pair searched in its own child process with
// seeded random traces, a failure shrunk to a short trace, a fault (crash,
// hang, leak) attributed to the trace that caused it.
#pragma once

#include "adapters.h"
#include "kvcheck/executor.h"
#include "kvcheck/workload.h"
#include "sandbox.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck::cli {

struct ConformanceOptions {
    std::uint64_t seed = 20261202;
    std::size_t cases = 200;  // traces per property (when seconds == 0)
    double seconds = 0;       // time per property instead of a case count
    std::vector<Property> properties;  // empty: all
    Limits limits;
    std::size_t jobs = 2;     // child processes at once
    bool isolate = true;
    std::string trace_dir = "kvcheck-traces";
    bool progress = true;     // progress lines on stderr
    WorkloadOptions workload;
};

struct PropertyResult {
    std::string id;
    // "pass", "fail", "skipped", or "blocked": the search was cut short by
    // an engine error (reported under engine-error)
    std::string verdict = "pass";
    std::size_t cases = 0;
    double seconds = 0;
    std::string message;           // the failure, fault or skip reason
    std::vector<std::string> also; // other properties violated at the failing step
    std::string fault;             // "", or "crash: SIGSEGV", "hang: ...", "memory: ...", "exit: ..."
    std::string trace;             // the shrunk failing trace, as text
    std::size_t found_length = 0;  // operations before shrinking
    std::string trace_file;        // where the trace was written
    std::string reproduce;         // the command that replays it
    std::string output;            // an out-of-process engine's last output (Adapter::take_output)
};

struct AdapterResult {
    Adapter adapter;
    // A row per property, then engine-error: the adapter errors where it
    // should not (found while searching any property).
    std::vector<PropertyResult> properties;
    std::size_t traces = 0;  // distinct traces run, over every property's search
    Coverage coverage;       // the shapes of interest they met (Coverage::shapes)
    bool all_pass() const;
    bool fails(const std::string& property) const;
};

std::vector<AdapterResult> check_adapters(const std::vector<Adapter>& adapters, const ConformanceOptions& options);

// One trace against one adapter (replay / shrink): the failure if any, shrunk
// when `shrink_it`. Isolated like a conformance run.
struct ReplayResult {
    bool failed = false;
    Failure failure;
    std::string fault;
    Trace trace;  // shrunk when asked and failing, else the input
    std::string output;  // an out-of-process engine's last output (Adapter::take_output)
};
ReplayResult replay_trace(const Adapter& adapter, const Trace& trace, PropertySet properties, bool shrink_it,
                          const ConformanceOptions& options);

}  // namespace kvcheck::cli
