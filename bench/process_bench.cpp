// Engines in another process (docs/protocol.md): the Python example store
// (python/examples/activation_memory_adapter.py) checked through the adapter
// protocol, as `kvcheck run --adapter x.py` checks it.
// - boundary/python_vs_reference: the same seeded traces (the default
//   workload, every property checked, the default schedule) run trace by
//   trace, interleaved, on the Python example through a ProcessEngine and
//   on the C++ reference in process; checked operations per second of each,
//   and the ratio of their times per operation;
// - boundary/python_vs_reference_no_generation: the same with generation
//   switched off in every trace's swarm: the Python decoder, run twice per
//   generation (the store's, and generation-equivalent's on a fresh copy),
//   costs several times the rest of a step;
// - boundary/python_jobs: the throughput of a `kvcheck run` on this
//   machine: the same traces shared by as many jobs as it has cores (what
//   `kvcheck run` starts by default), each a process of kvcheck's with an
//   adapter process of its own, all started before the clock runs;
//   checked operations per second of wall-clock time, all jobs together:
//   the median of python_jobs_rounds rounds (fresh processes each), and
//   the slowest and fastest round (a round is a second or two: one alone
//   swings with the machine's load);
// - cli/python_example: `kvcheck run` of the Python example as a user runs
//   it, warm starts against cold, alternating: checked operations per
//   second of the command's wall-clock time, everything included;
// - boundary/round_trip: one request and its reply (stored_ids, which the
//   adapter answers from a list) between kvcheck and the Python process,
//   the protocol's floor per request;
// - time_to_verdict/<bug>: per historic bug of the example, the property
//   that names it searched as `kvcheck run` does (seeded traces from
//   seeds_per_bug first seeds far apart, the one property checked, then
//   the shrinker), medians over the seeds of the time to the first failure,
//   of the shrinking and of the two (the verdict). Each search runs in a
//   child process of its own with an adapter process of its own, a warm
//   copy of a fork server, as in a kvcheck run: the adapter's start is in
//   the verdict (start_s: that part);
// - time_to_verdict_cold/<bug>: the same, each child's adapter process
//   started cold (Python importing torch: a second or more);
// - time_to_verdict_reused/<bug>: one adapter process for all the
//   searches, started outside the timing (traces reset it).
// The Python side's work is another process's: the numbers are wall-clock.
#include "bench_util.h"
#include "verdicts.h"

#include "bundled.h"
#include "kvcheck/executor.h"
#include "kvcheck/shrink.h"
#include "kvcheck/workload.h"
#include "process_engine.h"

#include <benchmark/benchmark.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace kvbench {
namespace {

using namespace kvcheck;

constexpr std::size_t boundary_traces = 300;
constexpr int python_jobs_rounds = 5;
constexpr std::size_t round_trips = 2000;
constexpr int seeds_per_bug = 10;
constexpr std::uint64_t seed_spacing = 100003;
constexpr std::size_t traces_max = 2000;

std::string python() {
    const char* chosen = std::getenv("KVCHECK_PYTHON");
    return chosen != nullptr && *chosen != '\0' ? chosen : "/usr/bin/python3";
}

process::ProcessCommand example(const std::string& bug) {
    process::ProcessCommand command;
    command.argv = {python(), KVCHECK_SOURCE_DIR "/python/examples/activation_memory_adapter.py"};
    if (!bug.empty()) command.argv.insert(command.argv.end(), {"--bug", bug});
    for (const std::string& word : command.argv) command.text += (command.text.empty() ? "" : " ") + word;
    command.extra_env = {"PYTHONPATH=" KVCHECK_SOURCE_DIR "/python"};
    return command;
}

WorkloadOptions workload_of(const Engine& engine) {
    WorkloadOptions options;
    options.capabilities = engine.capabilities();
    return options;
}

// CPU seconds (user and system) process `pid` has used so far.
double process_cpu_seconds(int pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
        if (i == 14 || i == 15) ticks += std::stod(field);
    }
    return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::size_t ops_run(const RunResult& result) {
    std::size_t ran = 0;
    for (const std::uint32_t count : result.coverage.ops_run) ran += count;
    return ran;
}

// trace_for_seed's trace, or the same swarm's without generation.
Trace trace_of(std::uint64_t seed, const WorkloadOptions& options, bool generation) {
    if (generation) return trace_for_seed(seed, options);
    SeededChooser choose(seed);
    Swarm swarm = random_swarm(choose, options);
    swarm.weights[Op(op::Generate{}).index()] = 0;
    swarm.weights[Op(op::GenerateStream{}).index()] = 0;
    return generate_trace(choose, swarm, options);
}

void python_vs_reference(benchmark::State& state, bool generation) {
    process::ProcessLauncher launcher(example(""), {});
    const WorkloadOptions options = workload_of(*launcher.make());
    std::vector<Trace> traces;
    for (std::size_t i = 0; i < boundary_traces; ++i) traces.push_back(trace_of(1 + i, options, generation));
    const Adapter& reference = *adapters::find_bundled("reference");
    double python_s = 0, reference_s = 0, kvcheck_cpu_s = 0;
    std::size_t python_ops = 0, reference_ops = 0, python_failures = 0;
    const int adapter = launcher.process_id();
    const double adapter_cpu_start = process_cpu_seconds(adapter);
    for (auto _ : state) {
        for (const Trace& trace : traces) {
            double start = now_seconds();
            const double cpu_start = cpu_seconds();
            const std::shared_ptr<Engine> engine = launcher.make();
            const RunResult through = execute(trace, *engine);
            kvcheck_cpu_s += cpu_seconds() - cpu_start;
            python_s += now_seconds() - start;
            python_ops += ops_run(through);
            python_failures += through.failure.has_value();
            start = now_seconds();
            const std::shared_ptr<Engine> in_process = reference.make();
            const RunResult direct = execute(trace, *in_process);
            reference_s += now_seconds() - start;
            reference_ops += ops_run(direct);
        }
    }
    const double adapter_cpu_s = process_cpu_seconds(adapter) - adapter_cpu_start;
    const double ops = static_cast<double>(python_ops);
    state.counters["traces"] = static_cast<double>(traces.size());
    // CPU time per operation, kvcheck's side and the adapter's: unlike the
    // wall clock, not inflated by other work on a shared machine; their
    // sum bounds the time per operation on an idle one.
    state.counters["kvcheck_cpu_us_per_op"] = kvcheck_cpu_s / ops * 1e6;
    state.counters["adapter_cpu_us_per_op"] = adapter_cpu_s / ops * 1e6;
    state.counters["python_ops_per_cpu_s"] = ops / (kvcheck_cpu_s + adapter_cpu_s);
    state.counters["python_ops"] = static_cast<double>(python_ops);
    state.counters["python_failures"] = static_cast<double>(python_failures);
    state.counters["python_ops_per_s"] = static_cast<double>(python_ops) / python_s;
    state.counters["reference_ops_per_s"] = static_cast<double>(reference_ops) / reference_s;
    state.counters["python_us_per_op"] = python_s / static_cast<double>(python_ops) * 1e6;
    state.counters["reference_us_per_op"] = reference_s / static_cast<double>(reference_ops) * 1e6;
    state.counters["ratio"] = (python_s / static_cast<double>(python_ops)) / (reference_s / static_cast<double>(reference_ops));
}

// What one job of python_jobs did, written to its parent over a pipe.
struct JobResult {
    std::size_t ops = 0;
    std::size_t failures = 0;
    double kvcheck_cpu_s = 0;
    double adapter_cpu_s = 0;
};

// A job of python_jobs, in a forked process: starts its adapter process,
// says so (one byte on `ready`), waits for the go (a byte on `go`), runs
// every trace `jobs`th trace from `first`, and writes its JobResult to
// `out`.
[[noreturn]] void run_job(process::ProcessLauncher& launcher, const std::vector<Trace>& traces, std::size_t first,
                          std::size_t jobs, int ready, int go, int out) {
    JobResult result;
    {
        std::shared_ptr<Engine> engine = launcher.make();
        const int adapter = launcher.process_id();
        char byte = 'r';
        if (::write(ready, &byte, 1) != 1 || ::read(go, &byte, 1) != 1) ::_exit(3);
        const double cpu_start = cpu_seconds();
        const double adapter_start = process_cpu_seconds(adapter);
        for (std::size_t i = first; i < traces.size(); i += jobs) {
            if (i != first) engine = launcher.make();
            const RunResult run = execute(traces[i], *engine);
            result.ops += ops_run(run);
            result.failures += run.failure.has_value();
        }
        result.kvcheck_cpu_s = cpu_seconds() - cpu_start;
        result.adapter_cpu_s = process_cpu_seconds(adapter) - adapter_start;
    }
    const bool written = ::write(out, &result, sizeof result) == static_cast<ssize_t>(sizeof result);
    ::_exit(written ? 0 : 3);
}

void python_jobs(benchmark::State& state) {
    const std::size_t jobs = std::max(1u, std::thread::hardware_concurrency());
    process::ProcessLauncher launcher(example(""), {});
    const WorkloadOptions options = workload_of(*launcher.make());
    std::vector<Trace> traces;
    for (std::size_t i = 0; i < boundary_traces; ++i) traces.push_back(trace_of(1 + i, options, true));
    JobResult total;
    double wall_s = 0;
    Samples rates;  // each round's checked operations per second
    for (auto _ : state) {
        const std::size_t ops_before = total.ops;
        int ready[2], go[2], out[2];
        if (::pipe(ready) != 0 || ::pipe(go) != 0 || ::pipe(out) != 0) {
            state.SkipWithError("pipe failed");
            return;
        }
        std::vector<pid_t> children;
        for (std::size_t j = 0; j < jobs; ++j) {
            const pid_t pid = ::fork();
            if (pid == 0) run_job(launcher, traces, j, jobs, ready[1], go[0], out[1]);
            if (pid < 0) break;  // fewer jobs started: reported below
            children.push_back(pid);
        }
        char byte = 0;
        std::size_t started = 0;
        while (started < children.size() && ::read(ready[0], &byte, 1) == 1) ++started;
        const double start = now_seconds();
        for (std::size_t j = 0; j < jobs; ++j) {
            if (::write(go[1], "g", 1) != 1) break;
        }
        std::size_t reported = 0;
        JobResult one;
        while (reported < children.size() && ::read(out[0], &one, sizeof one) == static_cast<ssize_t>(sizeof one)) {
            total.ops += one.ops;
            total.failures += one.failures;
            total.kvcheck_cpu_s += one.kvcheck_cpu_s;
            total.adapter_cpu_s += one.adapter_cpu_s;
            ++reported;
        }
        const double round_s = now_seconds() - start;
        wall_s += round_s;
        rates.add(static_cast<double>(total.ops - ops_before) / round_s);
        for (const pid_t pid : children) ::waitpid(pid, nullptr, 0);
        for (const int fd : {ready[0], ready[1], go[0], go[1], out[0], out[1]}) ::close(fd);
        if (started < jobs || reported < jobs) {
            state.SkipWithError("a job did not start or did not report");
            return;
        }
    }
    const double ops = static_cast<double>(total.ops);
    state.counters["jobs"] = static_cast<double>(jobs);
    state.counters["python_ops"] = ops;
    state.counters["python_failures"] = static_cast<double>(total.failures);
    state.counters["python_ops_per_s"] = rates.median();
    state.counters["python_ops_per_s_min"] = rates.min();
    state.counters["python_ops_per_s_max"] = rates.max();
    state.counters["rounds"] = static_cast<double>(rates.size());
    state.counters["kvcheck_cpu_us_per_op"] = total.kvcheck_cpu_s / ops * 1e6;
    state.counters["adapter_cpu_us_per_op"] = total.adapter_cpu_s / ops * 1e6;
    state.counters["python_ops_per_cpu_s"] = ops / (total.kvcheck_cpu_s + total.adapter_cpu_s);
}

void round_trip(benchmark::State& state) {
    const std::string output = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/kvcheck-bench-round-trip.out";
    process::AdapterProcess adapter(example(""), output, 120);
    Samples micros;
    for (auto _ : state) {
        for (std::size_t i = 0; i < round_trips; ++i) {
            const double start = now_seconds();
            adapter.call(R"({"op":"stored_ids"})");
            micros.add((now_seconds() - start) * 1e6);
        }
    }
    adapter.shut_down();
    std::remove(output.c_str());
    state.counters["round_trips"] = static_cast<double>(round_trips);
    state.counters["round_trip_us"] = micros.median();
}

// cli/python_example: `kvcheck run` of the Python example, the default
// options (every property, 100 cases each, as many jobs as cores), as a
// user runs it, with warm starts and with KVCHECK_COLD_START=1, alternating
// round by round; checked operations (from its closing line) per second of
// the whole command's wall-clock time, adapter starts included.
struct CliRun {
    double ops = 0;
    double seconds = 0;
};

std::optional<CliRun> kvcheck_run(bool warm, std::uint64_t seed) {
    const std::string command = std::string(warm ? "" : "KVCHECK_COLD_START=1 ") + "'" KVCHECK_BINARY "' run --adapter '" +
                                KVCHECK_SOURCE_DIR "/python/examples/activation_memory_adapter.py' --quiet --seed " +
                                std::to_string(seed) + " 2>&1 >/dev/null";
    const double start = now_seconds();
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return std::nullopt;
    std::string text;
    char chunk[4096];
    while (const std::size_t n = std::fread(chunk, 1, sizeof chunk, pipe)) text.append(chunk, n);
    const int status = ::pclose(pipe);
    const double seconds = now_seconds() - start;
    const std::string marker = " operations checked, in ";
    const std::size_t at = text.find(marker);
    if (status != 0 || at == std::string::npos) return std::nullopt;
    std::size_t begin = at;
    while (begin > 0 && std::isdigit(static_cast<unsigned char>(text[begin - 1]))) --begin;
    if (begin == at) return std::nullopt;
    return CliRun{std::stod(text.substr(begin, at - begin)), seconds};
}

void cli_python_example(benchmark::State& state) {
    constexpr int rounds = 3;
    Samples warm_rate, cold_rate, ratio;
    double ops = 0;
    for (auto _ : state) {
        for (int round = 0; round < rounds; ++round) {
            const std::uint64_t seed = 1 + static_cast<std::uint64_t>(round);
            std::optional<CliRun> warm, cold;
            if (round % 2 == 0) {
                warm = kvcheck_run(true, seed);
                cold = kvcheck_run(false, seed);
            } else {
                cold = kvcheck_run(false, seed);
                warm = kvcheck_run(true, seed);
            }
            if (!warm || !cold) return state.SkipWithError("kvcheck run failed or printed no closing line");
            warm_rate.add(warm->ops / warm->seconds);
            cold_rate.add(cold->ops / cold->seconds);
            ratio.add(cold->seconds / warm->seconds);
            ops = warm->ops;
        }
    }
    state.counters["rounds"] = rounds;
    state.counters["ops_per_run"] = ops;
    state.counters["warm_ops_per_s"] = warm_rate.median();
    state.counters["cold_ops_per_s"] = cold_rate.median();
    state.counters["cold_over_warm_time"] = ratio.median();
}

struct Bug {
    const char* name;
    Property property;  // the property that names it
};

constexpr Bug bugs[] = {
    {"stored_to_generation", Property::stored_immutable},
    {"single_id_returns_stored", Property::stored_immutable},
    {"merge_uninitialized", Property::merge_correct},
    {"shallow_clone", Property::clone_independent},
    {"double_copy", Property::single_copy},
};

// What a search in a forked child sends back (time_to_verdict's fresh
// processes).
struct ChildVerdict {
    double start_s = 0;  // fork to the adapter process's handshake done
    double find_s = 0;   // then to the first failure
    double shrink_s = 0;
    std::size_t tried = 0;
    std::size_t shrunk_ops = 0;
    bool found = false;
};

// time_to_verdict/<bug> and time_to_verdict_cold/<bug>: each search in a
// child process of its own, forked from the benchmark, with an adapter
// process of its own, as `kvcheck run` searches each property in a
// sandboxed child: the adapter's start is part of the verdict. warm: the
// probe's process is a fork server, and each child's adapter a copy of it
// (docs/protocol.md section 10); cold: each child runs the command (Python
// imports torch again).
void time_to_verdict_fresh(benchmark::State& state, const Bug* bug, bool warm) {
    process::LaunchOptions launch;
    launch.warm_starts = warm;
    process::ProcessLauncher launcher(example(bug->name), launch);
    launcher.probe();
    if (launcher.warm() != warm) {
        state.SkipWithError("the example did not offer warm starts");
        return;
    }
    WorkloadOptions options;
    {
        // The capabilities, from a child's engine: this process keeps none
        // running (a child's copy would share its pipes).
        int pipe_fds[2];
        if (::pipe(pipe_fds) != 0) return state.SkipWithError("pipe failed");
        const pid_t pid = ::fork();
        if (pid == 0) {
            const Capabilities capabilities = launcher.make()->capabilities();
            const bool written = ::write(pipe_fds[1], &capabilities, sizeof capabilities) == sizeof capabilities;
            ::_exit(written ? 0 : 3);
        }
        Capabilities capabilities;
        const bool read = ::read(pipe_fds[0], &capabilities, sizeof capabilities) == sizeof capabilities;
        ::waitpid(pid, nullptr, 0);
        ::close(pipe_fds[0]);
        ::close(pipe_fds[1]);
        if (!read) return state.SkipWithError("no capabilities");
        options.capabilities = capabilities;
    }
    RunOptions run;
    run.properties = PropertySet::only(bug->property);
    VerdictSamples verdicts;
    Samples start_s;
    for (auto _ : state) {
        for (int k = 0; k < seeds_per_bug; ++k) {
            const std::uint64_t first_seed = 1 + static_cast<std::uint64_t>(k) * seed_spacing;
            int pipe_fds[2];
            if (::pipe(pipe_fds) != 0) return state.SkipWithError("pipe failed");
            const double start = now_seconds();
            const pid_t pid = ::fork();
            if (pid == 0) {
                ChildVerdict verdict;
                const std::shared_ptr<Engine> first = launcher.make();
                (void)first->stored_ids();  // the handshake is done; one request answered
                verdict.start_s = now_seconds() - start;
                const double searching = now_seconds();
                const Oracle oracle = [&](const Trace& candidate) {
                    return execute(candidate, *launcher.make(), run).failure;
                };
                std::optional<Failure> failure;
                Trace trace;
                while (!failure && verdict.tried < traces_max) {
                    trace = trace_for_seed(first_seed + verdict.tried++, options);
                    failure = oracle(trace);
                }
                verdict.find_s = now_seconds() - searching;
                if (failure) {
                    const double shrinking = now_seconds();
                    verdict.shrunk_ops = shrink(trace, *failure, oracle).trace.size();
                    verdict.shrink_s = now_seconds() - shrinking;
                    verdict.found = true;
                }
                const bool written = ::write(pipe_fds[1], &verdict, sizeof verdict) == sizeof verdict;
                ::_exit(written ? 0 : 3);
            }
            ChildVerdict verdict;
            const bool read = pid > 0 && ::read(pipe_fds[0], &verdict, sizeof verdict) == sizeof verdict;
            const double total = now_seconds() - start;
            if (pid > 0) ::waitpid(pid, nullptr, 0);
            ::close(pipe_fds[0]);
            ::close(pipe_fds[1]);
            if (!read) return state.SkipWithError("a search child did not report");
            if (!verdict.found) {
                verdicts.missed();
                continue;
            }
            // find: from the fork (the start included) to the failure; the
            // verdict is then the child's whole time, as the parent saw it
            // less the shrinking.
            verdicts.add(total - verdict.shrink_s, verdict.shrink_s, verdict.tried, verdict.shrunk_ops);
            start_s.add(verdict.start_s);
        }
    }
    verdicts.report(state, seeds_per_bug);
    state.counters["start_s"] = start_s.median();
}

void time_to_verdict(benchmark::State& state, const Bug* bug) {
    process::ProcessLauncher launcher(example(bug->name), {});
    const WorkloadOptions options = workload_of(*launcher.make());
    RunOptions run;
    run.properties = PropertySet::only(bug->property);
    const Oracle oracle = [&](const Trace& candidate) { return execute(candidate, *launcher.make(), run).failure; };
    VerdictSamples verdicts;
    for (auto _ : state) {
        for (int k = 0; k < seeds_per_bug; ++k) {
            const std::uint64_t first_seed = 1 + static_cast<std::uint64_t>(k) * seed_spacing;
            const double start = now_seconds();
            std::optional<Failure> failure;
            Trace trace;
            std::size_t tried = 0;
            while (!failure && tried < traces_max) {
                trace = trace_for_seed(first_seed + tried++, options);
                failure = oracle(trace);
            }
            const double found = now_seconds();
            if (!failure) {
                verdicts.missed();
                continue;
            }
            const ShrinkResult shrunk = shrink(trace, *failure, oracle);
            verdicts.add(found - start, now_seconds() - found, tried, shrunk.trace.size());
        }
    }
    verdicts.report(state, seeds_per_bug);
}

const bool registered = [] {
    benchmark::RegisterBenchmark("boundary/python_vs_reference", python_vs_reference, true)
        ->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
    benchmark::RegisterBenchmark("boundary/python_vs_reference_no_generation", python_vs_reference, false)
        ->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
    benchmark::RegisterBenchmark("boundary/python_jobs", python_jobs)
        ->Iterations(python_jobs_rounds)->UseRealTime()->Unit(benchmark::kSecond);
    benchmark::RegisterBenchmark("cli/python_example", cli_python_example)
        ->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
    benchmark::RegisterBenchmark("boundary/round_trip", round_trip)
        ->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
    for (const Bug& bug : bugs) {
        benchmark::RegisterBenchmark((std::string("time_to_verdict/") + bug.name).c_str(), time_to_verdict_fresh, &bug, true)
            ->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
    }
    for (const Bug& bug : bugs) {
        benchmark::RegisterBenchmark((std::string("time_to_verdict_cold/") + bug.name).c_str(), time_to_verdict_fresh, &bug,
                                     false)
            ->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
    }
    for (const Bug& bug : bugs) {
        benchmark::RegisterBenchmark((std::string("time_to_verdict_reused/") + bug.name).c_str(), time_to_verdict, &bug)
            ->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
    }
    return true;
}();

}  // namespace
}  // namespace kvbench
