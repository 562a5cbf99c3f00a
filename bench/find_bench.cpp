// Time to find a bug, the RapidCheck-style seeded path: for each bundled
// mutant, find_and_shrink (properties/run_util.h: seeded traces from the
// default workload, every property checked, then the shrinker) from
// seeds_per_mutant first seeds far apart, and the medians over them of the
// time and the number of traces to the first failure, of the shrinking
// time and of the shrunk trace's length. Time is wall-clock (the dumps of a
// trace wait on the disk) and, beside it, this process's CPU time, which
// the load of other processes on a shared machine does not inflate.
#include "bench_util.h"
#include "verdicts.h"

#include "run_util.h"

#include <benchmark/benchmark.h>

#include <string>

namespace kvbench {
namespace {

using namespace kvcheck;

constexpr int seeds_per_mutant = 10;
constexpr std::uint64_t seed_spacing = 100003;  // first seeds this far apart never search the same seeds
constexpr std::size_t traces_max = 3000;        // as the mutant tests allow

void time_to_find(benchmark::State& state, const Adapter* adapter) {
    VerdictSamples verdicts;
    for (auto _ : state) {
        for (int k = 0; k < seeds_per_mutant; ++k) {
            const std::uint64_t first_seed = 1 + static_cast<std::uint64_t>(k) * seed_spacing;
            const double cpu_start = cpu_seconds();
            const auto finding = props::find_and_shrink(*adapter, first_seed, traces_max, WorkloadOptions{});
            const double cpu = cpu_seconds() - cpu_start;
            if (!finding) {
                verdicts.missed();
                continue;
            }
            verdicts.add(finding->find_seconds, finding->shrink_seconds, finding->traces_tried,
                         finding->shrunk.trace.size(), cpu);
        }
    }
    verdicts.report(state, seeds_per_mutant);
}

const bool registered = [] {
    for (const Adapter& adapter : adapters::bundled()) {
        if (adapter.breaks.empty()) continue;  // the reference: nothing to find
        if (adapter.lanes > 1) continue;     // a concurrency mutant: found with lanes (properties/lanes_test.cpp)
        benchmark::RegisterBenchmark(("time_to_find/" + adapter.name).c_str(), time_to_find, &adapter)
            ->Iterations(1)
            ->UseRealTime()
            ->Unit(benchmark::kSecond);
    }
    return true;
}();

}  // namespace
}  // namespace kvbench
