// A plain stress run, the baseline kvcheck's thread level is measured
// against (docs/semantics.md#the-thread-level, "A plain stress run";
// BENCHMARKS.md): the lanes of a thread-level plan each on a thread of its
// own, all let go at once, with no schedule control and no yield hook (an
// engine's kvcheck_yield does nothing). Each call's invocation and response
// are numbered by one atomic counter; when the threads have ended, the
// round is judged by the thread level's own checks (harness/thread_family.h):
// refcount-exact and free-iff-unreferenced for the paged family; for a
// store, stored-immutable of the copies still held, store-contract,
// linearizable over the whole recorded history and the dumps read back.
// What is not judged: anything between the start and the end of a round
// (there is no quiescent point in between).
#pragma once

#include "kvcheck/threads.h"

#include <cstdint>
#include <optional>
#include <string>

namespace kvcheck {

// One round on `engine`: lane 0 alone, then lanes 1.. at once, then the
// checks. The history is numbered by the counter (invocations and
// responses in the order they were numbered); the schedule is empty.
// std::invalid_argument as run_threads (an engine the thread level cannot run).
ThreadRunResult run_stress(Engine& engine, const LanePlan& plan);

struct StressBudget {
    std::size_t rounds_max = 0;  // 0: no limit
    double seconds_max = 0;      // of wall-clock time, checked between rounds; 0: no limit
    // A round still this long (process/stillness.h: not counting the time
    // it waited for a CPU) is killed and reported hung.
    double still_seconds_max = 120;
    // A round that has used this much CPU time (a correct engine's round
    // uses milliseconds) is ended and reported hung: a broken engine's
    // corrupted structures may loop for ever.
    double round_cpu_seconds_max = 60;
};

struct StressOutcome {
    std::size_t rounds = 0;  // rounds run, the failing one included
    // The first failure: a property the checks found broken, engine-error
    // for an engine's throw, or engine-error "crashed" / "hung" for a round
    // that died by a signal or hung (free-running races on a broken engine
    // are data races: undefined behaviour, which may crash).
    std::optional<Failure> failure;
    std::uint64_t round_seed = 0;  // the failing round's plan (thread_plan)
    std::vector<std::string> history;  // the failing round's (none for a crash or hang)
    bool crashed = false;
    bool hung = false;
};

// Rounds of seed, seed + 1, ... (the plans of search_threads' traces), each
// on a fresh engine, until the first failure or the budget: all of them in
// one forked child, so that a crash or hang ends the search, not the caller.
StressOutcome stress_search(const EngineFactory& make, const WorkloadOptions& options, std::uint64_t seed,
                            const StressBudget& budget);

}  // namespace kvcheck
