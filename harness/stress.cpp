// A plain stress run (kvcheck/stress.h): the thread level's plans and checks
// (thread_family.h) with the schedule left to the operating system.
#include "kvcheck/stress.h"

#include "durability/child.h"
#include "posix/ram_dir.h"
#include "posix/signal_name.h"
#include "thread_family.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <exception>
#include <filesystem>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include <stdlib.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kvcheck {
namespace {

using threads_detail::Family;

// What one lane's thread recorded: its history lines, numbered by the
// round's counter, and the engine's throw that ended it.
struct LaneRecord {
    std::vector<std::pair<std::size_t, std::string>> lines;
    std::vector<std::size_t> responses;  // the response line of each call
    std::optional<Failure> failure;
};

void run_calls(Family& family, std::size_t lane, const Trace& calls, std::atomic<std::size_t>& next_line, LaneRecord& record) {
    const std::string name = "lane " + std::to_string(lane);
    for (const Op& operation : calls) {
        const std::size_t invoked = next_line++;
        record.lines.emplace_back(invoked, name + ": " + format_op(operation));
        const threads_detail::CallOutcome outcome = threads_detail::call_family(family, lane, operation, invoked);
        const std::size_t response = next_line++;
        record.responses.push_back(response);
        if (outcome.error) {
            record.lines.emplace_back(response, name + ": threw " + *outcome.error);
            record.failure = Failure{engine_error_id, response,
                                     "the engine threw at " + name + "'s " + format_op(operation) + ": " + *outcome.error, {}};
            return;
        }
        record.lines.emplace_back(response, name + ": -> " + outcome.answer.value_or("not applicable"));
        family.responded(lane, response);
    }
}

// As the thread level's lanes: whatever else a lane throws (the engine's
// std::invalid_argument included) ends it as an engine error.
void run_lane(Family& family, std::size_t lane, const Trace& calls, std::atomic<std::size_t>& next_line, LaneRecord& record) {
    try {
        run_calls(family, lane, calls, next_line, record);
    } catch (const std::exception& error) {
        const std::size_t line = next_line++;
        record.lines.emplace_back(line, "lane " + std::to_string(lane) + ": threw " + error.what());
        record.failure = Failure{engine_error_id, line, "lane " + std::to_string(lane) + ": " + error.what(), {}};
    }
}

}  // namespace

ThreadRunResult run_stress(Engine& engine, const LanePlan& plan) {
    const std::unique_ptr<Family> family = threads_detail::family_for(engine, plan);
    std::atomic<std::size_t> next_line{0};
    std::vector<LaneRecord> records(plan.lanes.size());
    run_lane(*family, 0, plan.lanes.at(0), next_line, records[0]);
    if (!records[0].failure && plan.lanes.size() > 1) {
        // Every thread waits at the start line until all have started: the
        // lanes' calls overlap as much as the machine lets them.
        std::atomic<std::size_t> started{0};
        const std::size_t threads_count = plan.lanes.size() - 1;
        std::vector<std::thread> threads;
        for (std::size_t lane = 1; lane < plan.lanes.size(); ++lane) {
            threads.emplace_back([&, lane] {
                ++started;
                while (started.load() < threads_count) std::this_thread::yield();
                run_lane(*family, lane, plan.lanes[lane], next_line, records[lane]);
            });
        }
        for (std::thread& thread : threads) thread.join();
    }
    threads_detail::Shared shared{engine, *family, nullptr, 0, false, {}};
    ThreadRunResult& result = shared.result;
    result.history.resize(next_line.load());
    std::vector<std::pair<std::size_t, std::int64_t>> returns;  // (response line, lane)
    for (std::size_t lane = 0; lane < records.size(); ++lane) {
        for (auto& [line, text] : records[lane].lines) result.history[line] = std::move(text);
        for (const std::size_t line : records[lane].responses) returns.emplace_back(line, static_cast<std::int64_t>(lane));
        // The first throw, by its line.
        const std::optional<Failure>& failure = records[lane].failure;
        if (failure && (!result.failure || failure->step < result.failure->step)) result.failure = failure;
    }
    std::sort(returns.begin(), returns.end());
    for (std::size_t at = 0; at < returns.size(); ++at) {
        result.returned.push_back(returns[at].second);
        if (result.failure && returns[at].first == result.failure->step) result.failing_call = at;
    }
    if (result.failure) return std::move(result);
    try {
        family->quiescent(shared, "the round's last call (every lane ended)");
        if (!result.failure) family->ended(shared);
    } catch (const std::exception& error) {
        // As at the thread level: the engine threw when its state was read.
        result.failure = Failure{engine_error_id, result.history.empty() ? 0 : result.history.size() - 1,
                                 std::string("the engine threw when read at the end of the round: ") + error.what(), {}};
    }
    if (result.failure) result.failing_call = returns.empty() ? 0 : returns.size() - 1;
    return std::move(result);
}

namespace {

// The child's messages to the search (durability/child.h's framing).
enum : std::uint64_t { round_passed = 20, round_failed = 21 };

// Arms (or, with 0, disarms) SIGPROF after `seconds` of this process's CPU time.
void cpu_timer(double seconds) {
    itimerval timer{};
    timer.it_value.tv_sec = static_cast<time_t>(seconds);
    timer.it_value.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(timer.it_value.tv_sec)) * 1e6);
    ::setitimer(ITIMER_PROF, &timer, nullptr);
}

std::string seconds_text(double seconds) {
    std::ostringstream text;
    text << seconds;
    return text.str();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

StressOutcome stress_search(const EngineFactory& make, const WorkloadOptions& options, std::uint64_t seed,
                            const StressBudget& budget) {
    // The rounds' temporary files (a store's dumps) in a directory of the
    // search's own (under ram_dir.h's rule, as the thread level's dumps),
    // removed here: a round that crashes leaves its files.
    std::string temporary = (posix::ram_backed_temp_dir() / "kvcheck-stress-XXXXXX").string();
    if (::mkdtemp(temporary.data()) == nullptr) throw std::runtime_error("cannot make a temporary directory: " + temporary);
    struct Removed {
        const std::string& dir;
        ~Removed() {
            std::error_code ignored;
            std::filesystem::remove_all(dir, ignored);
        }
    } removed{temporary};
    const auto body = [&](int out) {
        // A crash is an expected outcome here, not an event to keep a core of.
        const rlimit no_core{0, 0};
        ::setrlimit(RLIMIT_CORE, &no_core);
        ::setenv("TMPDIR", temporary.c_str(), 1);
        const auto start = std::chrono::steady_clock::now();
        for (std::size_t round = 0; (budget.rounds_max == 0 || round < budget.rounds_max) &&
                                    (budget.seconds_max <= 0 || seconds_since(start) < budget.seconds_max);
             ++round) {
            const std::uint64_t round_seed = seed + round;
            const LanePlan plan = thread_plan(round_seed, options);
            const std::shared_ptr<Engine> engine = make();
            // A round that loops (a broken engine's corrupted structures may)
            // ends the child by SIGPROF when it has used this much CPU: read
            // as hung. CPU time, which the load of other processes does not
            // stretch (a correct round uses milliseconds).
            cpu_timer(budget.round_cpu_seconds_max);
            const ThreadRunResult result = run_stress(*engine, plan);
            cpu_timer(0);
            durability::Writer report;
            if (!result.failure) {
                report.number(round_passed);
                report.text("");
                durability::write_all(out, report.bytes());
                continue;
            }
            std::string history;
            for (const std::string& line : result.history) history += line + "\n";
            report.number(round_failed);
            report.text(result.failure->property);
            report.number(round_failed);
            report.text(result.failure->message);
            report.number(round_failed);
            report.text(history);
            report.number(round_failed);
            report.text(std::to_string(result.failure->step));
            durability::write_all(out, report.bytes());
            return;
        }
    };
    const durability::ChildEnd end = durability::run_child(body, budget.still_seconds_max);
    StressOutcome outcome;
    durability::Reader messages(end.output);
    std::vector<std::string> failed;
    while (!messages.done()) {
        const std::uint64_t kind = messages.number();
        std::string text = messages.text();
        if (kind == round_passed) ++outcome.rounds;
        if (kind == round_failed) failed.push_back(std::move(text));
        if (kind == durability::error_message) throw std::runtime_error("the stress run's child: " + text);
    }
    if (failed.size() == 4) {
        outcome.rounds += 1;
        outcome.round_seed = seed + outcome.rounds - 1;
        outcome.failure = Failure{failed[0], static_cast<std::size_t>(std::stoull(failed[3])), failed[1], {}};
        for (std::size_t at = 0, next = 0; (next = failed[2].find('\n', at)) != std::string::npos; at = next + 1) {
            outcome.history.push_back(failed[2].substr(at, next - at));
        }
        return outcome;
    }
    if (end.hung || !WIFEXITED(end.status) || WEXITSTATUS(end.status) != 0) {
        // The round after the last that passed died.
        outcome.rounds += 1;
        outcome.round_seed = seed + outcome.rounds - 1;
        const bool looped = WIFSIGNALED(end.status) && WTERMSIG(end.status) == SIGPROF;
        outcome.hung = end.hung || looped;
        outcome.crashed = !outcome.hung;
        const std::string how = end.hung   ? "hung (still for " + std::to_string(budget.still_seconds_max) + " s)"
                                : looped ? "hung (a round used " + seconds_text(budget.round_cpu_seconds_max) + " s of CPU)"
                                         : posix::wait_status_text(end.status);
        outcome.failure = Failure{engine_error_id, 0, "the stress round of seed " + std::to_string(outcome.round_seed) + " " + how, {}};
    }
    return outcome;
}

}  // namespace kvcheck
