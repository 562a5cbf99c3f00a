// Time to the first failure of each thread mutant (TM*, adapters/mutants/
// lane_mutants.cpp), kvcheck's thread level against a plain stress run on
// the same engine, side by side in one run (issue 44).
//
// kvcheck (`kvcheck/<TM>`): the search of `kvcheck run --threads` (trace i
// of a seed: thread_plan and schedule seed + i, run_threads on a fresh
// engine, every check at every quiescent point) up to the first failing
// trace; beside it, the whole search_threads (the same find, then the
// shrinking and 3 replays) as `kvcheck run --threads` reports it.
//
// Stress (`stress/<TM>`): the same plans (thread_plan of seed + i), each
// lane on a thread of its own let go at once, no schedule control and no
// yield hook, checked at the end of each round by the thread level's own
// checks (kvcheck/stress.h: run_stress, stress_search); rounds in a forked
// child until the first failure or the budget. A round that crashes or
// hangs counts as found.
//
// Stress to the named property (`stress_property/<TM>`): the stress run
// going on past rounds that crash, hang or throw (a fresh child from the
// next round on) until a round fails by a property the mutant breaks (what
// kvcheck reports), within the same budget a seed.
//
// Seeds: 10 first seeds 1,000,003 apart (no two search the same plans), the
// same lanes for both. Time is wall-clock and, beside it, CPU time (this
// process's for kvcheck; the stress child's, threads included, for stress),
// which the load of other processes does not inflate.
#include "bench_util.h"
#include "side_by_side.h"

#include "mutants/mutants.h"

#include "kvcheck/stress.h"
#include "kvcheck/threads.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <sys/resource.h>

namespace kvbench {
namespace {

using namespace kvcheck;

constexpr int seeds_per_mutant = 10;
constexpr std::uint64_t seed_spacing = 1000003;
constexpr std::int64_t lanes = 6;                // lane 0 and 5 client threads, both sides
constexpr std::size_t kvcheck_traces_max = 2000;  // per seed
constexpr double stress_seconds_max = 20;         // per seed: the stress run's budget
constexpr std::size_t stress_rounds_max = 1000000;
constexpr double stress_round_cpu_seconds_max = 10;  // a round using this much CPU (a correct one: milliseconds) is hung

WorkloadOptions thread_options(const Adapter& adapter) {
    WorkloadOptions options;
    options.capabilities = adapter.make()->capabilities();
    options.lanes = lanes;
    options.threads = true;
    return options;
}

double children_cpu_seconds() {
    rusage usage{};
    ::getrusage(RUSAGE_CHILDREN, &usage);
    return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

struct Found {
    double seconds = 0;
    double cpu = 0;
    std::size_t traces = 0;
    std::string how;  // the property, or crashed/hung
};

std::optional<Found> kvcheck_until_failure(const Adapter& adapter, std::uint64_t seed) {
    const WorkloadOptions options = thread_options(adapter);
    const double start = now_seconds();
    const double cpu_start = cpu_seconds();
    for (std::size_t trace = 0; trace < kvcheck_traces_max; ++trace) {
        const std::uint64_t trace_seed = seed + trace;
        const ThreadRunResult result = run_threads(*adapter.make(), thread_plan(trace_seed, options), {trace_seed, std::nullopt});
        if (result.failure) return Found{now_seconds() - start, cpu_seconds() - cpu_start, trace + 1, result.failure->property};
    }
    return std::nullopt;
}

// search_threads as `kvcheck run --threads` runs it: find, shrink, replay.
std::optional<Found> kvcheck_reported(const Adapter& adapter, std::uint64_t seed) {
    const double start = now_seconds();
    const double cpu_start = cpu_seconds();
    const std::optional<ThreadFinding> found = search_threads(adapter.make, thread_options(adapter), seed, kvcheck_traces_max);
    if (!found) return std::nullopt;
    return Found{now_seconds() - start, cpu_seconds() - cpu_start, found->traces, found->result.failure->property};
}

std::optional<Found> stress_until_failure(const Adapter& adapter, std::uint64_t seed) {
    const double start = now_seconds();
    const double cpu_start = children_cpu_seconds();
    const StressOutcome outcome =
        stress_search(adapter.make, thread_options(adapter), seed, {stress_rounds_max, stress_seconds_max, 120, stress_round_cpu_seconds_max});
    if (!outcome.failure) return std::nullopt;
    const std::string how = outcome.crashed ? "crashed" : outcome.hung ? "hung" : outcome.failure->property;
    return Found{now_seconds() - start, children_cpu_seconds() - cpu_start, outcome.rounds, how};
}

std::optional<Found> stress_until_property(const Adapter& adapter, std::uint64_t seed) {
    const double start = now_seconds();
    const double cpu_start = children_cpu_seconds();
    std::size_t rounds = 0;
    for (double spent = 0; spent < stress_seconds_max; spent = now_seconds() - start) {
        const StressOutcome outcome =
            stress_search(adapter.make, thread_options(adapter), seed + rounds, {stress_rounds_max, stress_seconds_max - spent, 120, stress_round_cpu_seconds_max});
        rounds += outcome.rounds;
        if (!outcome.failure) return std::nullopt;
        const std::optional<Property> property = parse_property(outcome.failure->property);
        if (property && std::find(adapter.breaks.begin(), adapter.breaks.end(), *property) != adapter.breaks.end()) {
            return Found{now_seconds() - start, children_cpu_seconds() - cpu_start, rounds, outcome.failure->property};
        }
    }
    return std::nullopt;
}

// One side's searches over the first seeds: medians over the seeds that
// found the bug, how many missed, and how it was found.
template <std::optional<Found> (*until_failure)(const Adapter&, std::uint64_t)>
void time_to_failure(benchmark::State& state, const Adapter* adapter) {
    Samples find_s, find_cpu_s, traces;
    int missed = 0;
    std::map<std::string, int> hows;
    const double start = now_seconds();
    for (auto _ : state) {
        for (int k = 0; k < seeds_per_mutant; ++k) {
            const std::uint64_t seed = 1 + static_cast<std::uint64_t>(k) * seed_spacing;
            const std::optional<Found> found = until_failure(*adapter, seed);
            if (!found) {
                ++missed;
                continue;
            }
            find_s.add(found->seconds);
            find_cpu_s.add(found->cpu);
            traces.add(static_cast<double>(found->traces));
            ++hows[found->how];
        }
    }
    state.counters["seeds"] = seeds_per_mutant;
    state.counters["lanes"] = lanes;
    state.counters["missed"] = missed;
    state.counters["find_s"] = find_s.median();
    state.counters["find_cpu_s"] = find_cpu_s.median();
    state.counters["find_s_max"] = find_s.max();
    state.counters["traces_to_failure"] = traces.median();
    state.counters["total_s"] = now_seconds() - start;
    std::string label;
    for (const auto& [how, count] : hows) label += (label.empty() ? "" : ", ") + how + " " + std::to_string(count);
    state.SetLabel(label);
}

const bool registered = [] {
    static const std::vector<Adapter> mutants = adapters::thread_mutant_adapters();
    for (const Adapter& adapter : mutants) {
        register_sides(adapter, {{"kvcheck/", time_to_failure<kvcheck_until_failure>},
                                 {"kvcheck_reported/", time_to_failure<kvcheck_reported>},
                                 {"stress/", time_to_failure<stress_until_failure>},
                                 {"stress_property/", time_to_failure<stress_until_property>}});
    }
    return true;
}();

}  // namespace
}  // namespace kvbench
