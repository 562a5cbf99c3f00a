// What dump_kill costs (harness/durability/dump_kill.h, docs/durability.md)
// on the reference, and what share of a run it is:
// - dump_kill/step/<entries>: one dump_kill step over a store of 1 or 10
//   small entries, against one plain dump of the same store: wall-clock
//   time per step, this process's CPU time, and the CPU time of its
//   children (the three processes a dump_kill forks: a complete dump, a
//   killed one, the loads), as the difference between a trace of the
//   store, a dump and steps_count such steps and the same trace without
//   them; medians of interleaved rounds;
// - dump_kill/workload: how many dump_kill steps the default workload
//   draws in the 200 traces of a kvcheck run's dump-safe search (the only
//   search that runs them), so that their share of a run is their count
//   times the cost above.
#include "bench_util.h"

#include "bundled.h"
#include "kvcheck/executor.h"
#include "kvcheck/workload.h"

#include <benchmark/benchmark.h>

#include <sys/resource.h>

#include <string>

namespace kvbench {
namespace {

using namespace kvcheck;

constexpr int steps_count = 8;
constexpr int rounds = 5;
constexpr std::uint64_t run_seed = 20261202;  // kvcheck run's default seed
constexpr std::size_t run_traces = 200;       // and its default cases

const Adapter& reference() { return *adapters::find_bundled("reference"); }

double children_cpu_seconds() {
    rusage usage{};
    ::getrusage(RUSAGE_CHILDREN, &usage);
    const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
    return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct Cost {
    double wall = 0;
    double cpu = 0;
    double children_cpu = 0;
};

Cost run_once(const Trace& trace) {
    const std::shared_ptr<Engine> engine = reference().make();
    RunOptions options;
    options.fresh_engine = reference().make;
    const double wall = now_seconds();
    const double cpu = cpu_seconds();
    const double children = children_cpu_seconds();
    const RunResult result = execute(trace, *engine, options);
    if (result.failure) throw std::runtime_error("the reference failed: " + result.failure->message);
    return {now_seconds() - wall, cpu_seconds() - cpu, children_cpu_seconds() - children};
}

Trace store_of(int entries) {
    Trace trace;
    for (int i = 0; i < entries; ++i) {
        trace.push_back(op::Add{"e" + std::to_string(i), parse_cache_spec("modern/f32/" + std::to_string(i) + ":[kv3 kv5 kv4]")});
    }
    trace.push_back(op::Dump{0});
    return trace;
}

void dump_kill_step(benchmark::State& state) {
    const int entries = static_cast<int>(state.range(0));
    const Trace base = store_of(entries);
    Trace killed = base;
    Trace dumped = base;
    for (int i = 0; i < steps_count; ++i) {
        killed.push_back(op::DumpKill{0, i});
        dumped.push_back(op::Dump{0});
    }
    Samples kill_wall, kill_cpu, kill_children, dump_wall;
    for (auto _ : state) {
        for (int round = 0; round < rounds; ++round) {
            const Cost none = run_once(base);
            const Cost kill = run_once(killed);
            const Cost dump = run_once(dumped);
            kill_wall.add((kill.wall - none.wall) / steps_count);
            kill_cpu.add((kill.cpu - none.cpu) / steps_count);
            kill_children.add((kill.children_cpu - none.children_cpu) / steps_count);
            dump_wall.add((dump.wall - none.wall) / steps_count);
        }
    }
    state.counters["dump_kill_ms"] = kill_wall.median() * 1e3;
    state.counters["dump_kill_cpu_ms"] = kill_cpu.median() * 1e3;
    state.counters["dump_kill_children_cpu_ms"] = kill_children.median() * 1e3;
    state.counters["dump_ms"] = dump_wall.median() * 1e3;
}

void dump_kill_workload(benchmark::State& state) {
    std::size_t steps = 0;
    std::size_t traces = 0;
    for (auto _ : state) {
        steps = 0;
        traces = 0;
        for (std::uint64_t seed = run_seed; seed < run_seed + run_traces; ++seed) {
            std::size_t in_trace = 0;
            for (const Op& operation : trace_for_seed(seed, WorkloadOptions{})) in_trace += std::holds_alternative<op::DumpKill>(operation);
            steps += in_trace;
            traces += in_trace > 0 ? 1 : 0;
        }
    }
    state.counters["traces"] = static_cast<double>(run_traces);
    state.counters["dump_kill_steps"] = static_cast<double>(steps);
    state.counters["traces_with_dump_kill"] = static_cast<double>(traces);
}

BENCHMARK(dump_kill_step)->Arg(1)->Arg(10)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(dump_kill_workload)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvbench
