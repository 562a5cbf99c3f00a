// What the parent makes of a conformance job's end: the failing trace
// written to its file, a fault (crash, hang, leak, ...) shrunk in fresh
// children and put in words, and jobs run to their end in the run's
// sandbox or, with --no-isolate, in kvcheck's own process.
#pragma once

#include "adapters.h"
#include "conformance.h"
#include "sandbox.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace kvcheck::cli {

// Writes the trace of `failure`, the `ordinal`-th (from 0) of `property`, to
// <trace dir>/<stem>-<property>.trace, or <stem>-<property>-<ordinal + 1>.trace
// after the first, and sets its trace_file and reproduce command, or
// trace_file_error.
void write_trace_file(const Adapter& adapter, const std::string& stem, const std::string& property, std::size_t ordinal,
                      FailureReport& failure, const ConformanceOptions& options);

// Writes the trace of each of the result's failures that has one, in
// order, and sets the result's top-level fields (message ... reproduce, and
// the engine's output when the first has it) to its first failure's.
void settle_failures(const Adapter& adapter, const std::string& stem, PropertyResult& result,
                     const ConformanceOptions& options);

// The operation at `step` of the trace text, for messages: " at step 3 (add)".
std::string step_text(const std::string& trace_text, std::optional<std::size_t> step);

// Runs one job to its end in `sandbox`, polling every job there; nullptr
// once the run is interrupted.
std::shared_ptr<Job> run_in(Sandbox& sandbox, const std::function<void(Channel&)>& body, const Limits& limits);

struct ShrunkFault {
    std::string trace;
    std::optional<std::size_t> step;  // where the fault struck in it
    bool recurred = true;             // false: the trace alone, in a fresh process, did not fault
};

// The trace of a fault, shrunk in fresh children of `sandbox` (see the
// definition for what each kind of fault allows).
ShrunkFault shrink_fault(const Adapter& adapter, const std::string& trace_text, const Fault& fault,
                         std::optional<std::size_t> step, PropertySet properties, const ConformanceOptions& options,
                         Sandbox& sandbox);

// "the engine crashed (SIGSEGV) at step 2 (add) while running the trace below".
std::string fault_message(const Fault& fault, const std::string& where);

// A job run in kvcheck's own process (--no-isolate): messages kept as a
// child's would be.
std::shared_ptr<Job> run_in_process(const std::function<void(Channel&)>& body);

}  // namespace kvcheck::cli
