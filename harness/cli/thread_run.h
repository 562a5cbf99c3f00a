// kvcheck run --threads and kvcheck replay of a thread-level trace
// (docs/semantics.md#the-thread-level): the thread level's search
// (kvcheck/threads.h) per adapter in a child job, its finding written as a
// thread-level trace file and reported like any failure, its lanes side by
// side; a thread-level trace replayed on fresh engines.
#pragma once

#include "conformance.h"
#include "kvcheck/threads.h"

#include <string>
#include <vector>

namespace kvcheck::cli {

// The properties the thread level judges, in report order.
std::vector<Property> thread_properties();

// Every adapter at the thread level with options.workload.lanes clients:
// a row per judged property and engine-error. An adapter that is not a
// paged engine declaring thread_safe gets its rows skipped, saying why.
ConformanceRun check_threads(const std::vector<Adapter>& adapters, const ConformanceOptions& options);

// Replays a thread-level trace on fresh engines, `replays` times: exit 0
// when none fails, 1 otherwise (the report on `out`: the failure, the
// lanes side by side and what ran, and whether every replay failed alike).
int replay_threads(const Adapter& adapter, const ThreadTrace& trace, const std::string& reproduce, PropertySet properties,
                   const ConformanceOptions& options, std::ostream& out);

// A thread finding's lanes side by side (swimlanes), the schedule and what
// ran, as `#` comment lines.
std::string thread_swimlanes(const LanePlan& plan, const ThreadRunResult& result);
// What ran, in order (calls, answers, pauses inside the engine) and the
// schedule, as `#` comment lines (a thread-level trace file holds them).
std::string what_ran(const LanePlan& plan, const ThreadRunResult& result);

}  // namespace kvcheck::cli
