// Concurrent clients at the operation level (docs/semantics.md#concurrent-clients):
// a trace of several client lanes, each a run of requests (multi-call
// protocols), whose calls a seeded schedule interleaves. Each engine call
// is atomic; the schedule is the trace's order, and a `switch lane=N` line
// (op::SwitchLane) marks each context switch, so a trace file carries the
// lanes and the schedule and replays exactly, and the shrinker drops
// lanes, steps and context switches as it drops any line.
//
//   kvcheck::WorkloadOptions options;
//   options.lanes = 3;
//   kvcheck::Trace trace = kvcheck::trace_for_seed(7, options);  // 3 clients, random or PCT schedule
//   std::vector<std::int64_t> lane = kvcheck::lanes_of(trace);     // the lane of each step
//   std::cout << kvcheck::swimlanes(trace, failure.step, failure.property);  // the lanes side by side
#pragma once

#include "kvcheck/trace.h"
#include "kvcheck/workload.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck {

// How a schedule picks the next lane to run.
enum class ScheduleKind : std::uint8_t {
    random,  // any lane with calls left, uniformly
    // Probabilistic concurrency testing (Burckhardt et al., ASPLOS 2010):
    // lanes get distinct random priorities and the highest with calls left
    // runs; at `depth - 1` random steps the running lane drops below all
    // others. A bug that needs d ordering constraints among n lanes of k
    // calls is hit with probability at least 1 / (n k^(d-1)) per trace.
    pct,
};

// One lane's calls, in order, and the schedule's choice of kind.
struct LanePlan {
    std::vector<Trace> lanes;   // lane i's calls
    ScheduleKind kind = ScheduleKind::random;
    std::int64_t depth = 1;     // pct: its bug depth d (d - 1 priority changes)
};

// The requests of `options.lanes` clients drawn from `choose` (at least 2
// lanes): the protocols of docs/semantics.md#concurrent-clients on the
// engine's families, with handles and sequences of their own per lane.
LanePlan draw_lanes(Chooser& choose, const WorkloadOptions& options);
// The lanes interleaved by the plan's schedule, a switch before each run of
// one lane's calls.
Trace schedule_lanes(Chooser& choose, const LanePlan& plan);
// draw_lanes then schedule_lanes: trace_for_seed's trace when options.lanes > 1.
Trace concurrent_trace(Chooser& choose, const WorkloadOptions& options);

// The lane of each step of a trace (0 before its first switch); a switch
// is its own lane's step.
std::vector<std::int64_t> lanes_of(const Trace& trace);
// How many lanes make calls in a trace (1 for a trace without switches).
std::size_t lane_count(const Trace& trace);

// The request each step belongs to, as the lanes workload draws them
// (docs/semantics.md#the-requests-client-protocols): the index of the
// request's first call, and the index of its last call in the trace
// (trace.size() while it is still open at the end). A read is get_cache,
// the generations and the release of its handle; a pin is a lookup, the
// alloc of the same tokens, the appends and the free of its sequence; a
// churn alloc runs to the free of its sequence; any other call is a
// request of its own. A switch belongs to no request (first = last = its index).
struct RequestSpan {
    std::size_t first = 0;
    std::size_t last = 0;
};
std::vector<RequestSpan> requests_of(const Trace& trace);

// The conflicting steps of a failure at `step` of a lanes trace: the
// failing call, the calls so far of every request still open at it (its
// own included), and every other lane's call made inside one of those
// requests (after its first call, up to the failing step). Ascending.
std::vector<std::size_t> conflicting_steps(const Trace& trace, std::size_t step);

// The lanes side by side, in schedule order, one line per call, each line
// a `#` comment (a failure pasted into a trace file still parses): the
// step, then a column per lane; `*` marks a conflicting step, and the
// failing one is followed by `<- property`. "" for a trace of one lane.
std::string swimlanes(const Trace& trace, std::size_t step, const std::string& property);

}  // namespace kvcheck
