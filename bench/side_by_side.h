// The searches of one adapter side by side (kvcheck's against a stress
// run: lanes_bench.cpp, threads_bench.cpp), each a Google Benchmark run.
#pragma once

#include "kvcheck/adapter.h"

#include <benchmark/benchmark.h>

#include <initializer_list>
#include <utility>

namespace kvbench {

using SideRun = void (*)(benchmark::State&, const kvcheck::Adapter*);

// Registers each side's run on `adapter` as "<side>/<adapter>": one
// iteration, timed by the wall clock, in seconds.
inline void register_sides(const kvcheck::Adapter& adapter, std::initializer_list<std::pair<const char*, SideRun>> sides) {
    for (const auto& [side, run] : sides) {
        benchmark::RegisterBenchmark((side + adapter.name).c_str(), run, &adapter)
            ->Iterations(1)
            ->UseRealTime()
            ->Unit(benchmark::kSecond);
    }
}

}  // namespace kvbench
