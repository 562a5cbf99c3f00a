// Concurrent clients at the thread level (docs/semantics.md#the-thread-level):
// each client lane's calls run on a thread of its own against an engine that
// declares Capabilities::thread_safe, and the calls overlap for real.
// One thread runs at a time, between yield points (kvcheck/yield.h): the
// harness yields before every engine call, the engine where it chooses, and
// at each yield the schedule picks the lane that runs next, seeded, so a
// run is a function of its plan and its schedule and replays exactly.
//
// Judged, the paged family: at every quiescent point (every lane between
// calls) the pool's whole-state invariants, which hold whatever order the
// calls took effect in: refcount-exact and free-iff-unreferenced
// (checkers::refcount_wrong, checkers::free_queue_wrong); an engine call
// that throws where it may not (free, lookup, evict, step) is an engine
// error. Not judged here: the paged calls' own answers (hits, content,
// refusals) against a sequential order (the operation level judges those).
// The store family (reads, adds, deletes, dumps): at every quiescent point
// the copies clients hold, unchanged and sharing nothing with the store
// (stored-immutable), the listing (store-contract), and linearizability of
// the calls so far over their overlapping invocation-response intervals
// with the store read there (a store with a capacity: its evictions as its
// policy declares them); the dumps read back at the end
// (docs/semantics.md#the-thread-level).
//
//   kvcheck::WorkloadOptions options;  // options.capabilities = the engine's
//   options.lanes = 3;
//   kvcheck::ThreadFinding found = *kvcheck::search_threads(make, options, 7, 200);
//   kvcheck::ThreadRunResult again = kvcheck::run_threads(*make(), found.plan, {0, found.result.schedule});
#pragma once

#include "kvcheck/adapter.h"
#include "kvcheck/engine.h"
#include "kvcheck/executor.h"
#include "kvcheck/lanes.h"
#include "kvcheck/workload.h"
#include "kvcheck/yield.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck {

struct ThreadRunOptions {
    std::uint64_t seed = 0;  // the schedule's draws, when not replayed
    // Replay: the lane to run at each yield point that had a choice, in
    // order. Past its end, or where it names a lane that cannot run, the
    // running lane goes on (at a yield of a lock it waits for, the next
    // lane runs): so a shorter schedule is one of fewer context switches.
    std::optional<std::vector<std::int64_t>> schedule;
};

struct ThreadRunResult {
    // The first violation: property and message; `step` is the index of the
    // history line at which it was found.
    std::optional<Failure> failure;
    std::vector<std::int64_t> schedule;  // the choices made, replayable
    std::vector<std::string> history;    // calls, yields and returns, in the order they ran
    bool diverged = false;               // a replayed choice could not be followed
    // The lane of each call, in the order the calls returned (or threw;
    // lane 0's setup first), and of them the call at which the failure was
    // found (the one whose return reached the failing quiescent point, or
    // that threw). The calls another lane's call ran inside come before it.
    std::vector<std::int64_t> returned;
    std::size_t failing_call = 0;
};

// Why the thread level's store lanes cannot judge a store that declares
// these (a capacity in bytes, an eviction policy that names no order,
// leases, a content tolerance), or nothing: an unbounded store, or one of so many items evicted
// lru, fifo or lrs, whose evictions are in the model.
std::optional<std::string> store_not_judged_by_threads(const Capabilities& capabilities);

// Runs the plan's lane 0 alone, then lanes 1.. on a thread each under the
// schedule. The engine must declare thread_safe, a paged plan needs a paged
// engine and a store plan a store the thread level judges
// (store_not_judged_by_threads; else std::invalid_argument).
ThreadRunResult run_threads(Engine& engine, const LanePlan& plan, const ThreadRunOptions& options);

// The plan of a thread-level trace: draw_lanes's requests (options.threads:
// paged forks, store dumps), of the paged family for a paged engine, else
// of the store, for `seed`.
LanePlan thread_plan(std::uint64_t seed, WorkloadOptions options);

struct ThreadFinding {
    std::uint64_t seed = 0;    // of the trace (plan and schedule)
    std::size_t traces = 0;    // traces run until it was found
    LanePlan plan;             // shrunk
    ThreadRunResult result;    // its run, with the schedule that replays it
    std::size_t replays = 0;   // replays of the shrunk finding, on fresh engines
    std::size_t replays_same = 0;  // of them, how many failed alike (all: deterministic; else flaky)
};

// Up to `traces` thread-level traces from `seed` on, each on a fresh engine;
// the first failure shrunk (fewer lanes, calls, and schedule choices) and
// replayed 3 times.
std::optional<ThreadFinding> search_threads(const EngineFactory& make, const WorkloadOptions& options, std::uint64_t seed,
                                            std::size_t traces);

// The finding as text: the failure, the lanes' calls, the history (calls
// and yields of each lane in the order they ran), and the schedule.
std::string format_thread_finding(const ThreadFinding& finding);

// ---- a thread-level finding as a trace file (docs/semantics.md#the-thread-level) ----
// The file holds the calls in the order they returned, `switch lane=K` before
// each run of one lane's calls (a lanes trace, drawn side by side like any),
// the calls that never began after them, and a first line
//   threads lanes=N schedule=1,1,2
// that makes it a thread-level trace: `kvcheck replay` runs it on a thread
// per lane under that schedule (each lane's calls are its lines, in order).
struct ThreadTrace {
    LanePlan plan;
    std::vector<std::int64_t> schedule;
};
// The calls in the order they returned, then those that never ran; and the
// index in it of the failing call (result.failing_call).
Trace ran_trace(const LanePlan& plan, const ThreadRunResult& result, std::size_t* failing_step = nullptr);
// The header line and ran_trace's text.
std::string thread_trace_text(const LanePlan& plan, const ThreadRunResult& result);
// A trace file's text: nullopt without the `threads` line (an ordinary
// trace); the plan and schedule with it; TraceParseError when malformed.
std::optional<ThreadTrace> parse_thread_trace(const std::string& text);

// A plugin's yield hook (kvcheck_plugin::yield_hook), set with kvcheck's own
// for the length of each thread-level run.
void add_yield_slot(kvcheck_yield_fn* slot);

}  // namespace kvcheck
