// The thread level (kvcheck/threads.h, docs/semantics.md#the-thread-level):
// a cooperative token-passing scheduler over one thread per client lane,
// the lanes' paged calls, the quiescent checks, and the search that finds,
// shrinks and replays a failure.
#include "kvcheck/threads.h"

#include "checkers/checker.h"
#include "kvcheck/yield.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

namespace kvcheck {
namespace {

constexpr std::size_t replays_of_a_finding = 3;
// A shrink step's candidates are tried at most this many times in all.
constexpr std::size_t shrink_runs_max = 2000;

// One thread runs at a time: `running_` holds the token, and a yield hands
// it to the lane the schedule picks (itself included).
class Scheduler {
  public:
    Scheduler(std::size_t lanes, const ThreadRunOptions& options)
        : done_(lanes, false), choose_(options.seed), replay_(options.schedule) {
        done_[0] = true;  // lane 0 ran alone before
    }

    void wait_turn(std::size_t lane) {
        std::unique_lock<std::mutex> held(mutex_);
        turn_.wait(held, [&] { return running_ == lane; });
    }

    // The lane that runs after `lane`'s yield at `point` (itself, or
    // another: then hand_over).
    std::size_t next_after(std::size_t lane, const char* point) {
        const std::lock_guard<std::mutex> held(mutex_);
        return pick(lane, std::strcmp(point, "lock") == 0);
    }

    // Runs `next` and waits until `lane` runs again.
    void hand_over(std::size_t lane, std::size_t next) {
        std::unique_lock<std::mutex> held(mutex_);
        running_ = next;
        turn_.notify_all();
        turn_.wait(held, [&] { return running_ == lane; });
    }

    void finish(std::size_t lane) {
        std::unique_lock<std::mutex> held(mutex_);
        done_[lane] = true;
        if (std::all_of(done_.begin(), done_.end(), [](bool d) { return d; })) return;
        running_ = pick(lane, true);
        turn_.notify_all();
    }

    const std::vector<std::int64_t>& schedule() const { return schedule_; }
    bool diverged() const { return diverged_; }

  private:
    // The next lane to run after `current` (done or yielding). With `wait`
    // (a lock it waits for, or its end) the fallback moves on to the next
    // lane, so that the holder runs.
    std::size_t pick(std::size_t current, bool wait) {
        std::vector<std::size_t> ready;
        for (std::size_t lane = 0; lane < done_.size(); ++lane) {
            if (!done_[lane]) ready.push_back(lane);
        }
        if (ready.size() == 1) return ready.front();
        std::size_t next = 0;
        if (!replay_) {
            next = ready[choose_.below(ready.size())];
        } else if (used_ < replay_->size()) {
            const std::int64_t want = (*replay_)[used_++];
            const bool can = want >= 0 && static_cast<std::size_t>(want) < done_.size() && !done_[static_cast<std::size_t>(want)];
            diverged_ = diverged_ || !can;
            next = can ? static_cast<std::size_t>(want) : fallback(ready, current, wait);
        } else {
            next = fallback(ready, current, wait);
        }
        schedule_.push_back(static_cast<std::int64_t>(next));
        return next;
    }

    static std::size_t fallback(const std::vector<std::size_t>& ready, std::size_t current, bool wait) {
        const bool current_ready = std::find(ready.begin(), ready.end(), current) != ready.end();
        if (current_ready && !wait) return current;
        const auto after = std::upper_bound(ready.begin(), ready.end(), current);
        return after == ready.end() ? ready.front() : *after;
    }

    std::mutex mutex_;
    std::condition_variable turn_;
    std::size_t running_ = 1;
    std::vector<bool> done_;
    SeededChooser choose_;
    std::optional<std::vector<std::int64_t>> replay_;
    std::size_t used_ = 0;
    std::vector<std::int64_t> schedule_;
    bool diverged_ = false;
};

// What the lane threads share. Only the thread holding the token touches
// it; the scheduler's mutex orders one holder's writes before the next's reads.
struct Shared {
    Engine& engine;
    PagedEngine& paged;
    Scheduler* scheduler = nullptr;
    std::int64_t in_call = 0;
    bool checking = false;  // a quiescent check reads the engine: no lane runs meanwhile
    ThreadRunResult result;
};

thread_local Shared* current_shared = nullptr;
thread_local std::size_t current_lane = 0;

void note(Shared& shared, std::string line) { shared.result.history.push_back(std::move(line)); }

void fail(Shared& shared, const std::string& property, const std::string& message) {
    if (shared.result.failure) return;
    shared.result.failure = Failure{property, shared.result.history.size() - 1, message, {}};
}

// The kvcheck::yield hook: a point inside the engine, on a lane's thread.
void yield_in_engine(const char* point) {
    Shared* shared = current_shared;
    if (shared == nullptr || shared->scheduler == nullptr || shared->checking) return;
    const std::size_t lane = current_lane;
    const std::size_t next = shared->scheduler->next_after(lane, point);
    if (next == lane) return;
    note(*shared, "  lane " + std::to_string(lane) + " paused at " + point + "; lane " + std::to_string(next) + " runs");
    shared->scheduler->hand_over(lane, next);
}

// The pool's whole-state invariants at a quiescent point.
void check_quiescent(Shared& shared, const std::string& after) {
    PagedState state;
    shared.checking = true;
    try {
        state = shared.paged.paged_state();
    } catch (...) {
        shared.checking = false;
        throw;
    }
    shared.checking = false;
    if (const std::optional<std::string> wrong = checkers::refcount_wrong(state)) {
        fail(shared, property_id(Property::refcount_exact), "at the quiescent point after " + after + ": " + *wrong);
    } else if (const std::optional<std::string> queue = checkers::free_queue_wrong(state)) {
        fail(shared, property_id(Property::free_iff_unreferenced), "at the quiescent point after " + after + ": " + *queue);
    }
}

// The sequences each lane holds (lane-private, so never raced on).
using Alive = std::set<std::int64_t>;

// Runs one paged call; returns its answer, or nothing when it was not
// applicable (a sequence a refused alloc never made).
std::optional<std::string> call(PagedEngine& paged, const Op& operation, Alive& alive) {
    return std::visit(
        [&](const auto& o) -> std::optional<std::string> {
            using O = std::decay_t<decltype(o)>;
            if constexpr (std::is_same_v<O, op::PagedLookup>) {
                return "cached " + std::to_string(paged.paged_lookup(o.tokens, o.salt));
            } else if constexpr (std::is_same_v<O, op::PagedAlloc>) {
                if (alive.count(o.seq) != 0) return std::nullopt;
                const std::int64_t cached = paged.paged_alloc(o.seq, o.tokens, o.salt);
                alive.insert(o.seq);
                return "cached " + std::to_string(cached);
            } else if constexpr (std::is_same_v<O, op::PagedAppend>) {
                if (alive.count(o.seq) == 0) return std::nullopt;
                return "appended " + checkers::tokens_text(paged.paged_append(o.seq, o.count));
            } else if constexpr (std::is_same_v<O, op::PagedFork>) {
                if (alive.count(o.parent) == 0 || alive.count(o.child) != 0) return std::nullopt;
                paged.paged_fork(o.parent, o.child);
                alive.insert(o.child);
                return std::string("forked");
            } else if constexpr (std::is_same_v<O, op::PagedFree>) {
                if (alive.count(o.seq) == 0) return std::nullopt;
                alive.erase(o.seq);
                paged.paged_free(o.seq);
                return std::string("freed");
            } else if constexpr (std::is_same_v<O, op::PagedEvict>) {
                paged.paged_evict();
                return std::string("evicted");
            } else if constexpr (std::is_same_v<O, op::PagedStep>) {
                paged.paged_step();
                return std::string("stepped");
            } else {
                throw std::invalid_argument(std::string("the thread level runs paged requests only, not ") + O::name);
            }
        },
        operation);
}

// May the engine refuse this call (op-atomic's refusals: the pool is full)?
bool may_refuse(const Op& operation) {
    return std::holds_alternative<op::PagedAlloc>(operation) || std::holds_alternative<op::PagedAppend>(operation) ||
           std::holds_alternative<op::PagedFork>(operation);
}

// The call's return (or throw), in the order calls returned; its index.
std::size_t returned(Shared& shared, std::size_t lane) {
    shared.result.returned.push_back(static_cast<std::int64_t>(lane));
    return shared.result.returned.size() - 1;
}

void run_call(Shared& shared, std::size_t lane, const Op& operation, Alive& alive) {
    const std::string who = "lane " + std::to_string(lane) + "'s " + format_op(operation);
    note(shared, "lane " + std::to_string(lane) + ": " + format_op(operation));
    struct Blame {  // the failure, if it was found at this call's return: this call
        Shared& shared;
        bool failed_before;
        std::optional<std::size_t> index;
        ~Blame() {
            if (!failed_before && shared.result.failure && index) shared.result.failing_call = *index;
        }
    } blame{shared, shared.result.failure.has_value(), std::nullopt};
    ++shared.in_call;
    std::optional<std::string> answer;
    try {
        answer = call(shared.paged, operation, alive);
    } catch (const std::invalid_argument&) {
        throw;
    } catch (const std::exception& error) {
        if (!may_refuse(operation)) {
            --shared.in_call;
            blame.index = returned(shared, lane);
            note(shared, "lane " + std::to_string(lane) + ": threw " + error.what());
            fail(shared, engine_error_id, "the engine threw at " + who + ": " + error.what());
            return;
        }
        answer = std::string("refused: ") + error.what();
    }
    --shared.in_call;
    blame.index = returned(shared, lane);
    note(shared, "lane " + std::to_string(lane) + ": -> " + answer.value_or("not applicable"));
    if (shared.in_call == 0 && !shared.result.failure) check_quiescent(shared, who);
}

void run_lane(Shared& shared, std::size_t lane, const Trace& calls) {
    current_shared = &shared;
    current_lane = lane;
    shared.scheduler->wait_turn(lane);
    Alive alive;
    try {
        for (const Op& operation : calls) {
            if (shared.result.failure) break;
            yield_in_engine("call");  // another lane may run first
            if (shared.result.failure) break;
            run_call(shared, lane, operation, alive);
        }
    } catch (const std::exception& error) {
        const bool failed_before = shared.result.failure.has_value();
        fail(shared, engine_error_id, "lane " + std::to_string(lane) + ": " + error.what());
        // At a quiescent check this lane ran: its last call's return.
        const std::vector<std::int64_t>& calls = shared.result.returned;
        const auto own = std::find(calls.rbegin(), calls.rend(), static_cast<std::int64_t>(lane));
        if (!failed_before && own != calls.rend()) shared.result.failing_call = static_cast<std::size_t>(calls.rend() - own) - 1;
    }
    shared.scheduler->finish(lane);
    current_shared = nullptr;
}

// The yield hooks kvcheck sets: its own, and those of the plugins loaded.
std::vector<kvcheck_yield_fn*>& hook_slots() {
    static std::vector<kvcheck_yield_fn*> slots{&yield_hook};
    return slots;
}

struct HooksSet {
    HooksSet() {
        for (kvcheck_yield_fn* slot : hook_slots()) *slot = &yield_in_engine;
    }
    ~HooksSet() {
        for (kvcheck_yield_fn* slot : hook_slots()) *slot = nullptr;
    }
    HooksSet(const HooksSet&) = delete;
    HooksSet& operator=(const HooksSet&) = delete;
};

}  // namespace

void add_yield_slot(kvcheck_yield_fn* slot) {
    if (slot != nullptr && std::find(hook_slots().begin(), hook_slots().end(), slot) == hook_slots().end()) {
        hook_slots().push_back(slot);
    }
}

ThreadRunResult run_threads(Engine& engine, const LanePlan& plan, const ThreadRunOptions& options) {
    const Capabilities capabilities = engine.capabilities();
    if (!capabilities.thread_safe || !capabilities.paged || engine.paged() == nullptr) {
        throw std::invalid_argument("the thread level needs a paged engine that declares thread_safe");
    }
    Shared shared{engine, *engine.paged(), nullptr, 0, false, {}};
    Alive setup;
    for (const Op& operation : plan.lanes.at(0)) {
        if (!shared.result.failure) run_call(shared, 0, operation, setup);
    }
    if (shared.result.failure || plan.lanes.size() < 2) return std::move(shared.result);
    Scheduler scheduler(plan.lanes.size(), options);
    shared.scheduler = &scheduler;
    {
        const HooksSet hooks;
        std::vector<std::thread> threads;
        for (std::size_t lane = 1; lane < plan.lanes.size(); ++lane) {
            threads.emplace_back(run_lane, std::ref(shared), lane, std::cref(plan.lanes[lane]));
        }
        for (std::thread& thread : threads) thread.join();
    }
    shared.result.schedule = scheduler.schedule();
    shared.result.diverged = scheduler.diverged();
    return std::move(shared.result);
}

LanePlan thread_plan(std::uint64_t seed, WorkloadOptions options) {
    options.threads = true;
    options.capabilities.store = false;  // the thread level judges the paged family
    SeededChooser choose(seed);
    return draw_lanes(choose, options);
}

namespace {

struct Shrinker {
    const EngineFactory& make;
    std::string property;
    std::size_t runs = 0;

    std::optional<ThreadRunResult> fails(const LanePlan& plan, const std::vector<std::int64_t>& schedule) {
        if (runs >= shrink_runs_max) return std::nullopt;
        ++runs;
        const std::shared_ptr<Engine> engine = make();
        ThreadRunResult result = run_threads(*engine, plan, {0, schedule});
        if (!result.failure || result.failure->property != property) return std::nullopt;
        return result;
    }
};

// The schedule with lane `gone` taken out: later lanes move down one, and a
// choice of `gone` becomes one of the lane after it (which ran once `gone`
// had nothing left to run).
std::vector<std::int64_t> without_lane(std::vector<std::int64_t> schedule, std::int64_t gone) {
    for (std::int64_t& lane : schedule) lane = lane > gone ? lane - 1 : lane;
    return schedule;
}

void shrink(Shrinker& shrinker, ThreadFinding& found, std::vector<std::int64_t>& schedule) {
    for (bool smaller = true; smaller;) {
        smaller = false;
        for (std::size_t lane = found.plan.lanes.size() - 1; lane >= 1 && found.plan.lanes.size() > 2; --lane) {
            LanePlan fewer = found.plan;
            fewer.lanes.erase(fewer.lanes.begin() + static_cast<std::ptrdiff_t>(lane));
            const std::vector<std::int64_t> moved = without_lane(schedule, static_cast<std::int64_t>(lane));
            if (auto result = shrinker.fails(fewer, moved)) {
                found.plan = std::move(fewer);
                schedule = moved;
                found.result = std::move(*result);
                smaller = true;
            }
        }
        for (std::size_t lane = 1; lane < found.plan.lanes.size(); ++lane) {
            for (std::size_t at = found.plan.lanes[lane].size(); at-- > 0;) {
                LanePlan fewer = found.plan;
                fewer.lanes[lane].erase(fewer.lanes[lane].begin() + static_cast<std::ptrdiff_t>(at));
                if (auto result = shrinker.fails(fewer, schedule)) {
                    found.plan = std::move(fewer);
                    found.result = std::move(*result);
                    smaller = true;
                }
            }
        }
        // Fewer choices: the schedule's shortest prefix that still fails,
        // then each choice left out in turn.
        for (std::size_t keep = 0; keep < schedule.size(); ++keep) {
            const std::vector<std::int64_t> prefix(schedule.begin(), schedule.begin() + static_cast<std::ptrdiff_t>(keep));
            if (auto result = shrinker.fails(found.plan, prefix)) {
                schedule = prefix;
                found.result = std::move(*result);
                smaller = true;
                break;
            }
        }
        for (std::size_t at = schedule.size(); at-- > 0;) {
            std::vector<std::int64_t> fewer = schedule;
            fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(at));
            if (auto result = shrinker.fails(found.plan, fewer)) {
                schedule = std::move(fewer);
                found.result = std::move(*result);
                smaller = true;
            }
        }
    }
    // The schedule that replays it: as many choices as were given, each
    // the lane that did run there (a choice that could not be followed
    // reads as the lane the fallback ran), not those made past them.
    std::vector<std::int64_t>& ran = found.result.schedule;
    ran.resize(std::min(schedule.size(), ran.size()));
}

}  // namespace

std::optional<ThreadFinding> search_threads(const EngineFactory& make, const WorkloadOptions& options, std::uint64_t seed,
                                            std::size_t traces) {
    for (std::size_t trace = 0; trace < traces; ++trace) {
        const std::uint64_t trace_seed = seed + trace;
        const LanePlan plan = thread_plan(trace_seed, options);
        const std::shared_ptr<Engine> engine = make();
        ThreadRunResult result = run_threads(*engine, plan, {trace_seed, std::nullopt});
        if (!result.failure) continue;
        ThreadFinding found;
        found.seed = trace_seed;
        found.traces = trace + 1;
        found.plan = plan;
        std::vector<std::int64_t> schedule = result.schedule;
        found.result = std::move(result);
        Shrinker shrinker{make, found.result.failure->property};
        shrink(shrinker, found, schedule);
        for (std::size_t replay = 0; replay < replays_of_a_finding; ++replay) {
            const std::shared_ptr<Engine> again = make();
            const ThreadRunResult rerun = run_threads(*again, found.plan, {0, found.result.schedule});
            ++found.replays;
            if (rerun.failure && rerun.failure->property == found.result.failure->property &&
                rerun.failure->message == found.result.failure->message && rerun.history == found.result.history) {
                ++found.replays_same;
            }
        }
        return found;
    }
    return std::nullopt;
}

std::string format_thread_finding(const ThreadFinding& found) {
    const Failure& failure = *found.result.failure;
    std::string text = "ERROR: " + failure.property + ": " + failure.message + " (thread level, trace seed " +
                       std::to_string(found.seed) + ", found after " + std::to_string(found.traces) + " traces)\n";
    text += "# the lanes' calls (lane 0 ran alone first):\n";
    for (std::size_t lane = 0; lane < found.plan.lanes.size(); ++lane) {
        for (const Op& operation : found.plan.lanes[lane]) text += "#   lane " + std::to_string(lane) + ": " + format_op(operation) + "\n";
    }
    text += "# what ran, in order:\n";
    for (std::size_t line = 0; line < found.result.history.size(); ++line) {
        text += (line == failure.step ? "# > " : "#   ") + found.result.history[line] + "\n";
    }
    text += "# schedule (the lane run at each yield with a choice): " + checkers::tokens_text(found.result.schedule) + "\n";
    text += "SUMMARY: kvcheck: " + failure.property + " violated at the thread level, " +
            (found.replays_same == found.replays ? std::string("replayed alike ")
                                                 : std::string("flaky: replayed alike ") + std::to_string(found.replays_same) + " of ") +
            std::to_string(found.replays) + " times\n";
    return text;
}

}  // namespace kvcheck
