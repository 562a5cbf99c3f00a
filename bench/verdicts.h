// Time to verdict over several first seeds, as the find benchmarks report
// it: per seed the time to the first failure (find), the shrinking time,
// their sum (the verdict), the traces run and the shrunk length; counters
// are the medians over the seeds that found the bug, and how many missed.
#pragma once

#include "bench_util.h"

#include <benchmark/benchmark.h>

#include <cstddef>
#include <optional>

namespace kvbench {

class VerdictSamples {
  public:
    // One seed's finding; `cpu_seconds`: the process's CPU time for it, when measured.
    void add(double find_seconds, double shrink_seconds, std::size_t traces, std::size_t shrunk_ops,
             std::optional<double> cpu_seconds = std::nullopt) {
        find_s_.add(find_seconds);
        shrink_s_.add(shrink_seconds);
        verdict_s_.add(find_seconds + shrink_seconds);
        traces_.add(static_cast<double>(traces));
        shrunk_ops_.add(static_cast<double>(shrunk_ops));
        if (cpu_seconds) verdict_cpu_s_.add(*cpu_seconds);
    }
    void missed() { ++missed_; }

    void report(benchmark::State& state, int seeds) const {
        state.counters["seeds"] = seeds;
        state.counters["missed"] = missed_;
        state.counters["find_s"] = find_s_.median();
        state.counters["traces_to_failure"] = traces_.median();
        state.counters["shrink_s"] = shrink_s_.median();
        state.counters["shrunk_ops"] = shrunk_ops_.median();
        state.counters["verdict_s"] = verdict_s_.median();
        if (verdict_cpu_s_.size() > 0) state.counters["verdict_cpu_s"] = verdict_cpu_s_.median();
        state.counters["verdict_s_max"] = verdict_s_.max();
    }

  private:
    Samples find_s_, shrink_s_, verdict_s_, verdict_cpu_s_, traces_, shrunk_ops_;
    int missed_ = 0;
};

}  // namespace kvbench
