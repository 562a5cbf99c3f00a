// Harness throughput: the executor's operations per second on the
// reference, for stores of 10, 100 and 1,000 entries, checked four ways
// (the first, third and last interleaved round by round in one benchmark,
// so that their ratios do not carry the machine's drift):
// - checked: every checker on, the default schedule (what a step can reach
//   after each step, everything at full reads: harness/executor.cpp);
// - every_step: every checker on, every entry read after every step
//   (RunOptions::every_entry_every_step), the schedule before it;
// - no_generation_rerun (mixed only): every checker but
//   generation-equivalent, whose reference generation on a fresh copy
//   doubles the model's share;
// - unchecked: no checker (PropertySet::none()): the engine's operations
//   and the auditor's model of them; no step reads the store's entries,
//   listing or handles (harness/executor.cpp, reads_store_), and no
//   expected view or digest is made (Auditor::view_of, digest_of).
// And the stateful property's cases per second.
//
// A throughput trace first adds N entries, then runs a mix of operations on
// them (mix_ops_count of them, seeded). Only the mix is timed, from its
// first step (RunOptions::on_step) to the end of the run, the final full
// read of every entry included. Two mixes:
// - "mixed": the workload's kinds at about the weights of its uniform swarm,
//   generation included, files excluded (a dump's cost is the disk's);
// - "store": the same without generation, the model's share of the time.
// Handles are drawn from a pool of handle_pool_size names, reused, so that
// the number of live handles stays that of a short trace. At 1,000 entries
// each mix also runs without get_all ("<mix>_no_get_all"): the reference's
// get_all looks up every id in its map, a third or more of the unchecked
// run there, and checked it costs only a sixth more (one comparison of
// the id lists), so its share of the mix pulls the overhead down; without
// it the overhead is that of the other operations.
#include "bench_util.h"

#include "bundled.h"
#include "kvcheck/executor.h"
#include "kvcheck/workload.h"

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

namespace kvbench {
namespace {

using namespace kvcheck;

// Long enough that the full reads a big store gets every max(16, entries)
// steps, and the one at the end of the run, weigh in the mix as they do in
// a long run.
constexpr std::size_t mix_ops_count = 2000;
constexpr std::int64_t handle_pool_size = 8;
constexpr std::uint64_t mix_seed = 6;

const Adapter& reference() { return *adapters::find_bundled("reference"); }

// Small caches, as the workload makes them: up to 3 layers of up to 5
// tokens, float32, both layouts, odd layers included.
Swarm small_cache_swarm(const WorkloadOptions& options) {
    Swarm swarm = uniform_swarm(options);
    swarm.dtype = Dtype::f32;
    return swarm;
}

std::string entry_id(std::uint64_t i) { return "e" + std::to_string(i); }

Trace adds_of(std::size_t entries) {
    SeededChooser choose(mix_seed);
    const WorkloadOptions options;
    const Swarm swarm = small_cache_swarm(options);
    Trace trace;
    for (std::size_t i = 0; i < entries; ++i) trace.push_back(op::Add{entry_id(i), random_cache_spec(choose, swarm, options)});
    return trace;
}

// The mix: kinds and weights as the uniform swarm has them (adds 6,
// get_cache 4, generate 3, the rest 2), files and delete_all left out (a
// delete is followed by the add of the same id, so the store keeps its size).
Trace mix_of(std::size_t entries, bool generation, bool with_get_all) {
    SeededChooser choose(mix_seed + entries);
    const WorkloadOptions options;
    const Swarm swarm = small_cache_swarm(options);
    auto id = [&] { return entry_id(choose.below(entries)); };
    auto handle = [&] { return HandleName{choose.between(1, handle_pool_size)}; };
    // A result goes to a handle none of its sources is in.
    auto other_than = [&](std::initializer_list<HandleName> sources) {
        for (;;) {
            const HandleName out = handle();
            bool taken = false;
            for (const HandleName source : sources) taken = taken || source.value == out.value;
            if (!taken) return out;
        }
    };
    auto prompt = [&] { return Tokens{choose.between(1, 31), choose.between(1, 31)}; };
    enum Kind { add, get_cache, generate, get, get_by_ids, get_all, remove, make, clone, concat, to_legacy, from_legacy, add_handle };
    const std::vector<std::pair<Kind, int>> weights = {
        {add, 6}, {get_cache, 4}, {generate, generation ? 3 : 0}, {get, 2}, {get_by_ids, 2}, {get_all, with_get_all ? 2 : 0}, {remove, 2},
        {make, 2}, {clone, 2}, {concat, 2}, {to_legacy, 2}, {from_legacy, 2}, {add_handle, 2}};
    int total = 0;
    for (const auto& [kind, weight] : weights) total += weight;
    Trace trace;
    while (trace.size() < mix_ops_count) {
        int pick = static_cast<int>(choose.below(static_cast<std::uint64_t>(total)));
        std::size_t k = 0;
        while (pick >= weights[k].second) pick -= weights[k++].second;
        switch (weights[k].first) {
            case add: trace.push_back(op::Add{id(), random_cache_spec(choose, swarm, options)}); break;
            case get_cache: {
                const HandleName out = handle();
                trace.push_back(op::GetCache{out, {id()}});
                if (generation && choose.one_in(3)) trace.push_back(op::Generate{out, prompt(), choose.between(1, 4)});
                break;
            }
            case generate: trace.push_back(op::Generate{handle(), prompt(), choose.between(1, 4)}); break;
            case get: trace.push_back(op::Get{handle(), id()}); break;
            case get_by_ids: trace.push_back(op::GetByIds{{id(), id(), id()}}); break;
            case get_all: trace.push_back(op::GetAll{}); break;
            case remove: {
                const std::string removed = id();
                trace.push_back(op::Delete{{removed}});
                trace.push_back(op::Add{removed, random_cache_spec(choose, swarm, options)});
                break;
            }
            case make: trace.push_back(op::Make{handle(), random_cache_spec(choose, swarm, options)}); break;
            case clone: {
                const HandleName source = handle();
                trace.push_back(op::Clone{other_than({source}), source});
                break;
            }
            case concat: {
                const HandleName first = handle();
                const HandleName second = handle();
                trace.push_back(op::Concat{other_than({first, second}), {first, second}});
                break;
            }
            case to_legacy: {
                const HandleName source = handle();
                trace.push_back(op::ToLegacy{other_than({source}), source});
                break;
            }
            case from_legacy: {
                const HandleName source = handle();
                trace.push_back(op::FromLegacy{other_than({source}), source});
                break;
            }
            case add_handle: trace.push_back(op::AddHandle{id(), handle()}); break;
        }
    }
    return trace;
}

std::size_t ops_run(const RunResult& result) {
    std::size_t run = 0;
    for (const std::uint32_t count : result.coverage.ops_run) run += count;
    return run;
}

enum class Checking { checked, every_step, no_generation_rerun, unchecked };

const char* checking_name(Checking checking) {
    switch (checking) {
        case Checking::checked: return "checked";
        case Checking::every_step: return "every_step";
        case Checking::no_generation_rerun: return "no_generation_rerun";
        case Checking::unchecked: return "unchecked";
    }
    return "?";
}

RunOptions options_for(Checking checking) {
    RunOptions options;
    options.properties = checking == Checking::unchecked ? PropertySet::none() : PropertySet::all();
    if (checking == Checking::no_generation_rerun) options.properties.remove(Property::generation_equivalent);
    options.every_entry_every_step = checking == Checking::every_step;
    return options;
}

// One round of one way of checking: the wall and CPU seconds from the
// mix's first step to the end of the run (its final full read included),
// and the operations the mix ran.
struct MixTime {
    double seconds = 0;
    double cpu = 0;
    std::size_t ops = 0;
    std::string failure;
};

MixTime time_mix(std::size_t prefix_size, const Trace& trace, RunOptions options) {
    double wall_start = 0;
    double cpu_start = 0;
    options.on_step = [&](std::size_t step) {
        if (step != prefix_size) return;
        wall_start = now_seconds();
        cpu_start = cpu_seconds();
    };
    const auto engine = reference().make();
    const RunResult result = execute(trace, *engine, options);
    MixTime time;
    time.seconds = now_seconds() - wall_start;
    time.cpu = cpu_seconds() - cpu_start;
    if (result.failure) time.failure = "the reference failed: " + result.failure->property + ": " + result.failure->message;
    time.ops = ops_run(result) - prefix_size;  // every add of the prefix runs
    return time;
}

Trace with_mix(const Trace& prefix, std::size_t entries, bool generation, bool with_get_all = true) {
    Trace trace = prefix;
    const Trace mix = mix_of(entries, generation, with_get_all);
    trace.insert(trace.end(), mix.begin(), mix.end());
    return trace;
}

// The ways of checking whose ratios matter, interleaved round by round, so
// that a change in the machine's load moves all of them alike: checked,
// unchecked and (with generation) no_generation_rerun, in turn, the order
// reversed every other round (a run inherits the heap the one before it
// left). Counters per way: <way>_ops_per_s, <way>_ops_per_cpu_s (medians
// over rounds); overhead (and overhead_no_generation_rerun) = the median
// over rounds of the round's CPU seconds checked / unchecked: a ratio of
// two runs a few milliseconds apart, which the machine's drift over the
// benchmark moves far less than a ratio of two medians.
void executor_interleaved(benchmark::State& state, std::size_t entries, bool generation, bool with_get_all) {
    const Trace prefix = adds_of(entries);
    const Trace trace = with_mix(prefix, entries, generation, with_get_all);
    std::vector<Checking> ways = {Checking::checked, Checking::unchecked};
    if (generation) ways.push_back(Checking::no_generation_rerun);
    std::vector<Samples> seconds(ways.size()), cpu(ways.size());
    Samples overhead, overhead_no_rerun;
    std::size_t mix_ops_run = 0;
    std::size_t round = 0;
    for (auto _ : state) {
        double round_seconds = 0;
        std::vector<double> round_cpu(ways.size());
        for (std::size_t n = 0; n < ways.size(); ++n) {
            const std::size_t i = round % 2 == 0 ? n : ways.size() - 1 - n;
            const MixTime time = time_mix(prefix.size(), trace, options_for(ways[i]));
            if (!time.failure.empty()) {
                state.SkipWithError(time.failure.c_str());
                return;
            }
            seconds[i].add(time.seconds);
            cpu[i].add(time.cpu);
            round_cpu[i] = time.cpu;
            mix_ops_run = time.ops;
            round_seconds += time.seconds;
        }
        overhead.add(round_cpu[0] / round_cpu[1]);
        if (generation) overhead_no_rerun.add(round_cpu[2] / round_cpu[1]);
        ++round;
        state.SetIterationTime(round_seconds);
    }
    const auto ops = static_cast<double>(mix_ops_run);
    state.counters["entries"] = static_cast<double>(entries);
    state.counters["mix_ops_run"] = ops;
    for (std::size_t i = 0; i < ways.size(); ++i) {
        const std::string way = checking_name(ways[i]);
        state.counters[way + "_ops_per_s"] = ops / seconds[i].median();
        state.counters[way + "_ops_per_cpu_s"] = ops / cpu[i].median();
    }
    state.counters["overhead"] = overhead.median();
    if (generation) state.counters["overhead_no_generation_rerun"] = overhead_no_rerun.median();
}

// Every entry read after every step: the schedule before the current one,
// about 30 times slower at 1,000 entries, so measured on its own.
void executor_every_step(benchmark::State& state, std::size_t entries, bool generation) {
    const Trace prefix = adds_of(entries);
    const Trace trace = with_mix(prefix, entries, generation);
    Samples seconds, cpu;
    std::size_t mix_ops_run = 0;
    for (auto _ : state) {
        const MixTime time = time_mix(prefix.size(), trace, options_for(Checking::every_step));
        if (!time.failure.empty()) {
            state.SkipWithError(time.failure.c_str());
            return;
        }
        seconds.add(time.seconds);
        cpu.add(time.cpu);
        mix_ops_run = time.ops;
        state.SetIterationTime(time.seconds);
    }
    const auto ops = static_cast<double>(mix_ops_run);
    state.counters["entries"] = static_cast<double>(entries);
    state.counters["mix_ops_run"] = ops;
    state.counters["ops_per_s"] = ops / seconds.median();
    state.counters["ops_per_cpu_s"] = ops / cpu.median();
}

// The stateful property's loop (properties/stateful_test.cpp) without
// RapidCheck around it: 100 cases of sizes 0..99, a trace of
// 4 + size/3 operations each, through the reference, every checker on.
void stateful_cases(benchmark::State& state) {
    constexpr int cases_per_round = 100;
    std::uint64_t seed = 1;
    std::size_t ops = 0;
    const double start = now_seconds();
    const double cpu_start = cpu_seconds();
    for (auto _ : state) {
        for (int size = 0; size < cases_per_round; ++size) {
            WorkloadOptions options;
            options.trace_ops_max = 4 + static_cast<std::size_t>(size) / 3;
            const Trace trace = trace_for_seed(seed++, options);
            const auto engine = reference().make();
            const RunResult result = execute(trace, *engine);
            if (result.failure) {
                state.SkipWithError("the reference failed a stateful case");
                return;
            }
            ops += result.steps_run;
        }
    }
    const double seconds = now_seconds() - start;
    const double cpu = cpu_seconds() - cpu_start;
    const double cases = static_cast<double>(cases_per_round) * static_cast<double>(state.iterations());
    state.counters["cases_per_s"] = cases / seconds;
    state.counters["cases_per_cpu_s"] = cases / cpu;
    state.counters["ops_per_s"] = static_cast<double>(ops) / seconds;
}

const bool registered = [] {
    for (const bool generation : {true, false}) {
        for (const std::size_t entries : {10, 100, 1000}) {
            const std::string mix = generation ? "mixed" : "store";
            const std::string name = "executor/" + mix + "/" + std::to_string(entries) + "entries/";
            benchmark::RegisterBenchmark((name + "interleaved").c_str(), executor_interleaved, entries, generation, true)
                ->Iterations(15)
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond);
            if (entries == 1000) {
                const std::string without = "executor/" + mix + "_no_get_all/1000entries/interleaved";
                benchmark::RegisterBenchmark(without.c_str(), executor_interleaved, entries, generation, false)
                    ->Iterations(15)
                    ->UseManualTime()
                    ->Unit(benchmark::kMillisecond);
            }
            benchmark::RegisterBenchmark((name + "every_step").c_str(), executor_every_step, entries, generation)
                ->Iterations(entries < 1000 ? 15 : 3)
                ->UseManualTime()
                ->Unit(benchmark::kMillisecond);
        }
    }
    benchmark::RegisterBenchmark("stateful_property/100cases", stateful_cases)
        ->Iterations(5)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    return true;
}();

}  // namespace
}  // namespace kvbench
