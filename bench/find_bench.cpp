// Time to find a bug, the RapidCheck-style seeded path: for each bundled
// mutant, find_and_shrink (properties/run_util.h: seeded traces from the
// default workload, every property checked, then the shrinker) from
// seeds_per_mutant first seeds far apart, and the medians over them of the
// time and the number of traces to the first failure, of the shrinking
// time and of the shrunk trace's length. Time is wall-clock (the dumps of a
// trace wait on the disk) and, beside it, this process's CPU time, which
// the load of other processes on a shared machine does not inflate.
#include "bench_util.h"

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
    Samples find_s, shrink_s, verdict_s, verdict_cpu_s, traces, shrunk_ops;
    int missed = 0;
    for (auto _ : state) {
        for (int k = 0; k < seeds_per_mutant; ++k) {
            const std::uint64_t first_seed = 1 + static_cast<std::uint64_t>(k) * seed_spacing;
            const double cpu_start = cpu_seconds();
            const auto finding = props::find_and_shrink(*adapter, first_seed, traces_max, WorkloadOptions{});
            const double cpu = cpu_seconds() - cpu_start;
            if (!finding) {
                ++missed;
                continue;
            }
            find_s.add(finding->find_seconds);
            shrink_s.add(finding->shrink_seconds);
            verdict_s.add(finding->find_seconds + finding->shrink_seconds);
            verdict_cpu_s.add(cpu);
            traces.add(static_cast<double>(finding->traces_tried));
            shrunk_ops.add(static_cast<double>(finding->shrunk.trace.size()));
        }
    }
    state.counters["seeds"] = seeds_per_mutant;
    state.counters["missed"] = missed;
    state.counters["find_s"] = find_s.median();
    state.counters["traces_to_failure"] = traces.median();
    state.counters["shrink_s"] = shrink_s.median();
    state.counters["shrunk_ops"] = shrunk_ops.median();
    state.counters["verdict_s"] = verdict_s.median();
    state.counters["verdict_cpu_s"] = verdict_cpu_s.median();
    state.counters["verdict_s_max"] = verdict_s.max();
}

const bool registered = [] {
    for (const Adapter& adapter : adapters::bundled()) {
        if (adapter.breaks.empty()) continue;  // the reference: nothing to find
        benchmark::RegisterBenchmark(("time_to_find/" + adapter.name).c_str(), time_to_find, &adapter)
            ->Iterations(1)
            ->UseRealTime()
            ->Unit(benchmark::kSecond);
    }
    return true;
}();

}  // namespace
}  // namespace kvbench
