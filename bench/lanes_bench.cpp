// Time to the first failure of each concurrency mutant (LM*, adapters/
// mutants/lane_mutants.cpp), kvcheck's lanes search against a plain stress
// run on the same engine, side by side in one run (issue 44).
//
// kvcheck (`kvcheck/<M>`): the lanes search of `kvcheck run --lanes 3`
// (find_and_shrink: seeded lanes traces, the requests of
// docs/semantics.md#concurrent-clients interleaved by kvcheck's random or
// PCT schedule, every property checked at every call).
//
// Stress (`stress/<M>`): the same clients' requests (draw_lanes on the same
// trace seeds: the same calls per client), but no schedule control: one
// thread per client makes its calls in order on one engine, each call under
// one lock (calls are atomic, as at the operation level), and the order the
// threads take the lock in, the operating system's, is the schedule. The
// order is recorded as a lanes trace and run by kvcheck on a fresh engine
// with every property checked: the stress run is given kvcheck's own
// oracle, the most a stress test could have (the engine is deterministic,
// so the checked run does what the threads' run did).
//
// Both stop at the first failing trace or at traces_max; a seed whose
// search reaches traces_max is counted missed. Time is wall-clock and,
// beside it, this process's CPU time (threads included), which the load of
// other processes does not inflate.
#include "bench_util.h"

#include "run_util.h"
#include "side_by_side.h"

#include "kvcheck/lanes.h"
#include "kvcheck/paged.h"

#include <benchmark/benchmark.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

namespace kvbench {
namespace {

using namespace kvcheck;

constexpr int seeds_per_mutant = 5;
constexpr std::uint64_t seed_spacing = 100003;  // first seeds this far apart never search the same seeds
constexpr std::size_t traces_max = 2000;        // per seed, for both
constexpr std::int64_t clients = 3;

WorkloadOptions lanes_options(const Adapter& adapter) {
    WorkloadOptions options;
    options.capabilities = adapter.make()->capabilities();
    options.lanes = clients;
    return options;
}

// A call the stress run cannot make: the bench is out of date with lanes.cpp.
struct NoStressCall : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// One call of a client request on the engine, as its transition makes it
// (harness/run/transitions.cpp, paged_transitions.cpp), without the
// auditor: the stress run's threads make these. A refusal is the engine's
// answer, not the stress run's failure (the checked run judges it).
void call(Engine& engine, const Op& step) {
    std::visit(
        [&engine](const auto& o) {
            using T = std::decay_t<decltype(o)>;
            if constexpr (std::is_same_v<T, op::Add>) {
                engine.add(o.id, expand(o.cache), item_metadata(o.meta));
            } else if constexpr (std::is_same_v<T, op::Delete>) {
                engine.remove(o.ids);
            } else if constexpr (std::is_same_v<T, op::GetCache>) {
                engine.get_cache(o.ids, o.out.value);
            } else if constexpr (std::is_same_v<T, op::Generate>) {
                engine.generate(o.source.value, o.prompt, o.max, false);
            } else if constexpr (std::is_same_v<T, op::Release>) {
                engine.release(o.handle.value);
            } else if constexpr (std::is_same_v<T, op::PagedLookup>) {
                engine.paged()->paged_lookup(o.tokens, o.salt);
            } else if constexpr (std::is_same_v<T, op::PagedAlloc>) {
                engine.paged()->paged_alloc(o.seq, o.tokens, o.salt);
            } else if constexpr (std::is_same_v<T, op::PagedAppend>) {
                engine.paged()->paged_append(o.seq, o.count);
            } else if constexpr (std::is_same_v<T, op::PagedFree>) {
                engine.paged()->paged_free(o.seq);
            } else if constexpr (std::is_same_v<T, op::PagedEvict>) {
                engine.paged()->paged_evict();
            } else if constexpr (std::is_same_v<T, op::PagedStep>) {
                engine.paged()->paged_step();
            } else {
                throw NoStressCall(std::string("lanes_bench: no stress call for ") + T::name);
            }
        },
        step);
}

void call_refusals_allowed(Engine& engine, const Op& step) {
    try {
        call(engine, step);
    } catch (const NoStressCall&) {
        throw;
    } catch (const std::exception&) {
        // refused, or the engine's own assertion: what the checked run judges
    }
}

// The stress run of one plan: lane 0 alone, then a thread per client
// racing for the lock; returns the order the calls ran in.
Trace stress_order(const Adapter& adapter, const LanePlan& plan) {
    const std::shared_ptr<Engine> engine = adapter.make();
    Trace order = plan.lanes.at(0);
    for (const Op& step : order) call_refusals_allowed(*engine, step);
    std::mutex lock;
    std::int64_t current = 0;
    std::vector<std::thread> threads;
    for (std::size_t lane = 1; lane < plan.lanes.size(); ++lane) {
        threads.emplace_back([&, lane] {
            for (const Op& step : plan.lanes[lane]) {
                const std::lock_guard<std::mutex> held(lock);
                if (current != static_cast<std::int64_t>(lane)) {
                    order.push_back(op::SwitchLane{static_cast<std::int64_t>(lane)});
                    current = static_cast<std::int64_t>(lane);
                }
                order.push_back(step);
                call_refusals_allowed(*engine, step);
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    return order;
}

// A search's first failure: its time, the share of the CPU spent until
// then (the rest: shrinking), and the traces run, its own included.
struct Found {
    double seconds = 0;
    double cpu_share = 1;
    std::size_t traces = 0;
};

std::optional<Found> stress_until_failure(const Adapter& adapter, std::uint64_t first_seed) {
    const WorkloadOptions options = lanes_options(adapter);
    const double start = now_seconds();
    for (std::size_t i = 0; i < traces_max; ++i) {
        SeededChooser choose(trace_seed(first_seed, 0, i));
        const Trace order = stress_order(adapter, draw_lanes(choose, options));
        if (props::run_on(adapter, order).failure) return Found{now_seconds() - start, 1, i + 1};
    }
    return std::nullopt;
}

std::optional<Found> kvcheck_until_failure(const Adapter& adapter, std::uint64_t first_seed) {
    const auto finding = props::find_and_shrink(adapter, first_seed, traces_max, lanes_options(adapter));
    if (!finding) return std::nullopt;
    // The shrinking's share of the CPU is taken out in proportion to its wall-clock share.
    const double total = finding->find_seconds + finding->shrink_seconds;
    return Found{finding->find_seconds, total > 0 ? finding->find_seconds / total : 1.0, finding->traces_tried};
}

// The searches of one side over the first seeds: medians over the seeds
// that found the bug, how many missed, and the wall-clock time of all
// (the missed ones' whole budget included).
class Tally {
  public:
    void found(double seconds, double cpu, std::size_t traces) {
        find_s_.add(seconds);
        find_cpu_s_.add(cpu);
        traces_.add(static_cast<double>(traces));
    }
    void missed() { ++missed_; }
    void report(benchmark::State& state, double total_seconds) const {
        state.counters["seeds"] = seeds_per_mutant;
        state.counters["traces_max"] = static_cast<double>(traces_max);
        state.counters["missed"] = missed_;
        state.counters["find_s"] = find_s_.median();
        state.counters["find_cpu_s"] = find_cpu_s_.median();
        state.counters["traces_to_failure"] = traces_.median();
        state.counters["total_s"] = total_seconds;
    }

  private:
    Samples find_s_, find_cpu_s_, traces_;
    int missed_ = 0;
};

// One side's searches from the first seeds.
template <std::optional<Found> (*until_failure)(const Adapter&, std::uint64_t)>
void time_to_failure(benchmark::State& state, const Adapter* adapter) {
    Tally tally;
    const double start = now_seconds();
    for (auto _ : state) {
        for (int k = 0; k < seeds_per_mutant; ++k) {
            const std::uint64_t first_seed = 1 + static_cast<std::uint64_t>(k) * seed_spacing;
            const double cpu_start = cpu_seconds();
            const std::optional<Found> found = until_failure(*adapter, first_seed);
            if (!found) {
                tally.missed();
                continue;
            }
            tally.found(found->seconds, (cpu_seconds() - cpu_start) * found->cpu_share, found->traces);
        }
    }
    tally.report(state, now_seconds() - start);
}

const bool registered = [] {
    for (const Adapter& adapter : adapters::bundled()) {
        if (adapter.lanes <= 1) continue;
        register_sides(adapter, {{"kvcheck/", time_to_failure<kvcheck_until_failure>}, {"stress/", time_to_failure<stress_until_failure>}});
    }
    return true;
}();

}  // namespace
}  // namespace kvbench
