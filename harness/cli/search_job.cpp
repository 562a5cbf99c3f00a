#include "search_job.h"

#include "text.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

namespace kvcheck::cli {
namespace {

namespace fs = std::filesystem;

// A command's standard output and exit status (-1: it did not exit).
struct ChildOutput {
    int status = -1;
    std::string out;
};

// Runs argv[0] (a path) with argv, its standard output read to the end, its
// standard error this process's; waits for it.
ChildOutput run_child(const std::vector<std::string>& argv) {
    ChildOutput result;
    int pipe_ends[2];
    if (::pipe(pipe_ends) != 0) return result;
    std::vector<char*> args;
    for (const std::string& word : argv) args.push_back(const_cast<char*>(word.c_str()));
    args.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(pipe_ends[1], STDOUT_FILENO);
        ::close(pipe_ends[0]);
        ::close(pipe_ends[1]);
        ::execv(args[0], args.data());
        ::_exit(127);
    }
    ::close(pipe_ends[1]);
    char buffer[4096];
    for (ssize_t n; (n = ::read(pipe_ends[0], buffer, sizeof buffer)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        result.out.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(pipe_ends[0]);
    int status = 0;
    while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (pid > 0 && WIFEXITED(status)) result.status = WEXITSTATUS(status);
    return result;
}

}  // namespace

std::string one_line(std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    return text;
}

std::optional<Failure> answers_difference(const Trace& trace, const std::vector<std::string>& alone,
                                          const std::vector<std::string>& late) {
    for (std::size_t step = 0; step < std::min({alone.size(), late.size(), trace.size()}); ++step) {
        if (alone[step] == late[step]) continue;
        return Failure{shared_state_id, step,
                       "the engine answered otherwise after other engines ran in its process, no property failing: run "
                       "alone it answered \"" + alone[step] +
                           "\", run after the earlier traces of its process \"" + late[step] + "\"",
                       {}};
    }
    return std::nullopt;
}

// ---- what a child sends about a failure ---------------------------------------


std::string encode(const FoundFailure& found) {
    std::ostringstream out;
    out << "cases " << found.cases << "\nfound " << found.found_length << "\nstep " << found.failure.step
        << "\nproperty " << found.failure.property << "\nmessage " << escape_lines(found.failure.message) << "\n";
    for (const std::string& other : found.failure.also) out << "also " << escape_lines(other) << "\n";
    out << "seed " << found.seed << "\noutput " << escape_lines(found.output) << "\n";
    const Reproduction& r = found.reproduction;
    if (!r.kind.empty()) {
        out << "reproduction " << r.kind << " " << r.replays << " " << r.failed << " " << r.prefix_replays << " "
            << r.prefix_failed << "\nprefix " << escape_lines(r.prefix) << "\n";
    }
    out << "trace\n" << found.trace;
    return out.str();
}

FoundFailure decode(const std::string& payload) {
    FoundFailure found;
    std::istringstream in(payload);
    std::string line;
    while (std::getline(in, line) && line != "trace") {
        const std::size_t space = line.find(' ');
        const std::string key = line.substr(0, space);
        const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
        if (key == "cases") found.cases = std::stoul(value);
        if (key == "found") found.found_length = std::stoul(value);
        if (key == "step") found.failure.step = std::stoul(value);
        if (key == "property") found.failure.property = value;
        if (key == "message") found.failure.message = unescape_lines(value);
        if (key == "also") found.failure.also.push_back(unescape_lines(value));
        if (key == "seed") found.seed = std::stoull(value);
        if (key == "output") found.output = unescape_lines(value);
        if (key == "reproduction") {
            Reproduction& r = found.reproduction;
            std::istringstream(value) >> r.kind >> r.replays >> r.failed >> r.prefix_replays >> r.prefix_failed;
        }
        if (key == "prefix") found.reproduction.prefix = unescape_lines(value);
    }
    found.trace.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return found;
}

std::string encode(const SearchSummary& summary) {
    std::ostringstream out;
    out << "cases " << summary.cases << "\njudged " << summary.judged << "\nrepeats " << summary.repeats << "\n";
    for (const std::size_t count : summary.group_counts) out << "group " << count << "\n";
    if (!summary.blocked_by.empty()) out << "blocked-by " << escape_lines(summary.blocked_by) << "\n";
    return out.str();
}

SearchSummary decode_summary(const std::string& payload) {
    SearchSummary summary;
    std::istringstream in(payload);
    std::string line;
    while (std::getline(in, line)) {
        const std::size_t space = line.find(' ');
        const std::string key = line.substr(0, space);
        const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
        if (key == "cases") summary.cases = std::stoul(value);
        if (key == "judged") summary.judged = std::stoul(value);
        if (key == "repeats") summary.repeats = std::stoul(value);
        if (key == "group") summary.group_counts.push_back(std::stoul(value));
        if (key == "blocked-by") summary.blocked_by = unescape_lines(value);
    }
    return summary;
}

// ---- the child's work -------------------------------------------------------------

// Runs traces of `adapter` checking `properties` on fresh engines, each
// announced to the parent first ("begin": when the child dies, the parent
// knows which trace killed it) and each operation marked on the channel
// (the parent's silence limit, and the step a crash is pinned to); dumps go
// under the job's own directory, emptied first, which the parent removes
// however the child ends.
Runner runner_for(const Adapter& adapter, PropertySet properties, Channel& out) {
    Runner runner;
    // The engine's making and destruction are marked too: a death in a
    // plugin's create or an engine's destructor is not pinned on a step.
    runner.make = [&out, make = adapter.make]() -> std::shared_ptr<Engine> {
        const std::uint64_t before = out.engine_phase(true);
        std::shared_ptr<Engine> engine = make();
        out.restore(before);
        Engine* const raw = engine.get();
        return std::shared_ptr<Engine>(raw, [&out, engine = std::move(engine)](Engine*) mutable {
            const std::uint64_t at = out.engine_phase(false);
            engine.reset();
            out.restore(at);
        });
    };
    runner.options.properties = properties;
    runner.options.on_step = [&out](std::size_t step) { out.step(step); };
    if (!out.work_dir().empty()) runner.options.work_dir = out.work_dir() + "/run";
    runner.before_run = [&out, dir = runner.options.work_dir](const Trace& trace) {
        out.send("begin", format_trace(trace));
        std::error_code ignored;
        if (!dir.empty()) fs::remove_all(dir, ignored);
    };
    // For the parent's progress lines.
    runner.on_shorter = [&out](std::size_t operations) { out.send("shrunk", std::to_string(operations)); };
    return runner;
}

RunResult run_first_on(const Runner& runner, const EngineFactory& first, const Trace& trace) {
    Runner once = runner;
    auto made = std::make_shared<bool>(false);
    once.make = [made, first, make = runner.make] {
        if (*made) return make();
        *made = true;
        return first();
    };
    return once.run(trace);
}

void send_finding(const Finding& finding, std::size_t cases, Channel& out) {
    out.send("fail", encode({cases, finding.found.size(), finding.reported, format_trace(finding.shrunk.trace)}));
}

std::string encode_stats(std::size_t cases, const Coverage& coverage) {
    std::ostringstream out;
    out << "cases " << cases << "\n";
    for (std::size_t i = 0; i < shape_count; ++i) out << shape_id(static_cast<Shape>(i)) << " " << coverage.shapes[i] << "\n";
    for (std::size_t i = 0; i < op_kind_count; ++i) out << "op:" << op_kind_name(i) << " " << coverage.ops_run[i] << "\n";
    for (std::size_t i = 0; i < shape_count; ++i) out << "claimed:" << shape_id(static_cast<Shape>(i)) << " " << coverage.claimed[i] << "\n";
    return out.str();
}

void decode_stats(const std::string& payload, std::size_t* cases, Coverage* coverage) {
    std::istringstream in(payload);
    std::string key;
    std::uint64_t value = 0;
    while (in >> key >> value) {
        if (key == "cases") *cases += value;
        for (std::size_t i = 0; i < shape_count; ++i) {
            if (key == shape_id(static_cast<Shape>(i))) coverage->shapes[i] += static_cast<std::uint32_t>(value);
        }
        for (std::size_t i = 0; i < op_kind_count; ++i) {
            if (key == std::string("op:") + op_kind_name(i)) coverage->ops_run[i] += static_cast<std::uint32_t>(value);
        }
        for (std::size_t i = 0; i < shape_count; ++i) {
            if (key == std::string("claimed:") + shape_id(static_cast<Shape>(i))) coverage->claimed[i] += static_cast<std::uint32_t>(value);
        }
    }
}

namespace {

// One search's bookkeeping: the failures it reported, by identity
// (failure_shape), and the engine errors it met, by group.
class PropertySearch {
  public:
    PropertySearch(const Adapter& adapter, Property property, std::size_t index, const ConformanceOptions& options,
                   Channel& out)
        : adapter_(adapter), property_(property), index_(index), options_(options), out_(out) {}

    void run(PropertySet checked, const WorkloadOptions& workload) {
        model_ = workload.capabilities.model;  // what the search draws in, the shrinker keeps to
        for (std::size_t i = 0; i < shape_count; ++i) coverage_.claimed[i] = shape_claimed(static_cast<Shape>(i), workload.capabilities);
        Runner runner = runner_for(adapter_, checked, out_);
        // The first trace of an engine process keeps its answers, to
        // compare with its run at the end (check_independence).
        Runner recording = runner;
        recording.options.record_answers = true;
        const double start = monotonic_seconds();
        while (own_found_ < std::max<std::size_t>(options_.failures_max, 1)) {
            const bool spent = options_.seconds > 0 ? monotonic_seconds() - start >= options_.seconds : cases_ >= options_.cases;
            if (spent) break;
            const std::uint64_t seed = trace_seed(options_.seed, index_, cases_);
            const Trace trace = trace_for_seed(seed, workload);
            const bool first_in_process = history_.empty();
            const RunResult run = (first_in_process && options_.replays > 0 ? recording : runner).run(trace);
            ++cases_;
            coverage_.add(run.coverage);
            history_.push_back(trace);
            if (!run.failure && first_in_process) alone_ = Alone{trace, seed, run.answers};
            if (run.failure) triage(runner, trace, *run.failure, seed);
        }
        check_independence(runner, recording);
        finish();
    }

  private:
    // A trace that passed as the first of its engine process, and what the
    // engine answered (check_independence).
    struct Alone {
        Trace trace;
        std::uint64_t seed = 0;
        std::vector<std::string> answers;  // RunResult::answers
    };

    // A failing trace: an engine error joins its group (the first of a
    // group is shrunk, keeping its shape); a failure of this property not
    // reported yet (by its shape as found, or as the shrink left a reported
    // one) is shrunk and reported; one of
    // another property not yet found broken is shrunk and reported to be
    // counted there ("other"). Everything else is passed over: what
    // follows a failure proves nothing.
    void triage(const Runner& runner, const Trace& trace, const Failure& failure, std::uint64_t seed) {
        const std::string shape = failure_shape(failure);
        if (failure.property == engine_error_id) {
            engine_error(runner, trace, failure, shape, seed);
            judge_without_raising_ops(runner, trace, failure, seed);
        } else if (parse_property(failure.property) == property_) {
            if (own_.count(shape) != 0) {
                ++repeats_;
                return;
            }
            // The first shrinks as kvcheck always shrank one (to any failure
            // of the property: --failures 1 reports what it reported), the
            // later ones keep their shape within a smaller budget, so that
            // none shrinks into one already reported.
            const bool first = own_found_ == 0;
            const FoundFailure found =
                shrunk(runner, trace, failure, seed, first ? ShrinkOptions{}.runs_max : later_shrink_runs_max, !first);
            own_.insert(shape);
            own_.insert(failure_shape(found.failure));
            ++own_found_;
            out_.send("failure", encode(found));
        } else if (others_.insert(failure.property).second) {
            out_.send("other", encode(shrunk(runner, trace, failure, seed, ShrinkOptions{}.runs_max, false)));
        }
    }

    // A trace an engine error ended is judged on the rest of it: run again
    // on a fresh engine without the operation that raised (the handles only
    // it would have made are never made, and the operations that name them
    // are skipped), up to raised_ops_dropped_max times, while an operation
    // is left that runs. An engine that
    // refuses what its model cannot hold (an undeclared domain) is still
    // judged on everything else; one that raised on every operation of a
    // kind is blocked (finish), so that no property passes on a kind of
    // operation that never ran.
    void judge_without_raising_ops(const Runner& runner, const Trace& trace, const Failure& failure,
                                   std::uint64_t seed) {
        Trace rest = trace;
        Failure raised = failure;
        for (std::size_t dropped = 0; dropped < raised_ops_dropped_max; ++dropped) {
            if (raised.step >= rest.size()) break;
            ++raised_[raised_kind(rest[raised.step])];
            rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(raised.step));
            const RunResult again = runner.run(rest);
            coverage_.add(again.coverage);
            history_.push_back(rest);
            // Judged only if the engine did something: a trace whose every
            // operation raised (or was skipped with them) proves nothing.
            const auto& ran = again.coverage.ops_run;
            if (!again.failure && std::all_of(ran.begin(), ran.end(), [](std::uint32_t n) { return n == 0; })) break;
            if (!again.failure) return;
            if (again.failure->property != engine_error_id) {
                triage(runner, rest, *again.failure, seed);
                return;
            }
            raised = *again.failure;
        }
        ++errors_;
    }

    void engine_error(const Runner& runner, const Trace& trace, const Failure& failure, const std::string& shape,
                      std::uint64_t seed) {
        const auto known = groups_.find(shape);
        if (known != groups_.end()) {
            ++counts_[known->second];
            return;
        }
        groups_.emplace(shape, counts_.size());
        counts_.push_back(1);
        firsts_.push_back({cases_, seed, shape});
        if (counts_.size() <= error_groups_shrunk_max) {
            out_.send("engine-error", encode(shrunk(runner, trace, failure, seed, later_shrink_runs_max)));
        } else {
            const std::string output = adapter_.take_output ? adapter_.take_output(0) : "";
            out_.send("engine-error", encode(FoundFailure{cases_, trace.size(), failure, "", seed, output}));
        }
    }

    // The failure shrunk (keeping its shape, or, when `keep_shape` is
    // false, to any failure of its property), pinned to its step and
    // replay-verified (verify).
    FoundFailure shrunk(const Runner& runner, const Trace& trace, const Failure& failure, std::uint64_t seed,
                        std::size_t runs_max, bool keep_shape = true) {
        ShrinkOptions shrink;
        shrink.runs_max = runs_max;
        shrink.model = model_;
        if (keep_shape) {
            const std::string shape = failure_shape(failure);
            shrink.keeps = [shape](const Failure& candidate) { return failure_shape(candidate) == shape; };
        }
        // What the engine said while the trace ran, before the shrink's
        // runs replace it.
        const std::string output = adapter_.take_output ? adapter_.take_output(0) : "";
        const Finding finding = shrink_failure(runner, trace, failure, shrink);
        const Reproduction reproduction = verify(runner, trace, finding.shrunk.trace, finding.reported);
        return {cases_, trace.size(), finding.reported, format_trace(finding.shrunk.trace), seed, output, reproduction};
    }

    // ---- reproduction (docs/semantics.md#reproduction) ----

    // Runs `trace` on an engine nothing earlier reached (the first engine
    // of the run: isolated_factory; any later one the trace makes, as a
    // dump_safe kill test does, from the same process).
    RunResult run_isolated(const Runner& runner, const Trace& trace) {
        if (in_child_) return replay_in_child(trace, nullptr);
        const RunResult run = run_first_on(runner, isolated_factory(adapter_), trace);
        // The engine process is a fresh one now: what ran before is gone.
        history_.clear();
        history_.push_back(trace);
        alone_.reset();
        return run;
    }

    // `trace` (after `prefix`, when given) replayed by a kvcheck process of
    // its own, `kvcheck replay` run from this binary: a plugin's replays
    // need a process whose statics no engine touched yet, and this one's
    // were (docs/semantics.md#reproduction). Its failure is what the
    // replay's first ERROR line names; a replay that could not run shows
    // nothing.
    RunResult replay_in_child(const Trace& trace, const Trace* prefix) {
        const std::string dir = out_.work_dir().empty()
                                    ? fs::temp_directory_path().string() + "/kvcheck-replay-" + std::to_string(::getpid())
                                    : out_.work_dir() + "/replay";
        std::error_code ignored;
        fs::create_directories(dir, ignored);
        const std::string trace_file = dir + "/trace.trace";
        const std::string prefix_file = dir + "/prefix.trace";
        std::ofstream(trace_file, std::ios::trunc) << format_trace(trace);
        std::vector<std::string> argv{"/proc/self/exe", "replay", trace_file, "--adapter", adapter_.source, "--no-isolate",
                                      "--quiet"};
        if (prefix != nullptr) {
            std::ofstream(prefix_file, std::ios::trunc) << format_trace(*prefix);
            argv.insert(argv.end(), {"--prefix", prefix_file});
        }
        // Progress, as any trace the search runs: the silence limit counts
        // from each replay, and a fault pins on the trace replayed.
        out_.send("begin", format_trace(trace));
        const ChildOutput child = run_child(argv);
        RunResult run;
        if (child.status == 1) {
            const std::size_t at = child.out.find("ERROR: ");
            if (at != std::string::npos) {
                const std::size_t start = at + 7;
                const std::size_t end = child.out.find(':', start);
                run.failure = Failure{child.out.substr(start, end - start), 0, child.out.substr(start), {}};
            }
        }
        fs::remove_all(dir, ignored);
        return run;
    }

    // What a finding is, for its replays: whether a run shows it again, a
    // failure of a property the finding names (its own or one it lists as
    // `also` at its step). The reported failure is pinned by a run that
    // reads every entry after every step, so it may name a property first
    // (stored-immutable) that a plain run only meets as `also`, or the
    // other way round: both are the finding.
    using Shows = std::function<bool(const RunResult&)>;
    static std::set<std::string> properties_of(const Failure& failure) {
        std::set<std::string> properties{failure.property};
        for (const std::string& also : failure.also) properties.insert(also.substr(0, also.find(':')));
        return properties;
    }
    static Shows fails_as(const Failure& failure) {
        return [named = properties_of(failure)](const RunResult& run) {
            if (!run.failure) return false;
            for (const std::string& property : properties_of(*run.failure)) {
                if (named.count(property) != 0) return true;
            }
            return false;
        };
    }

    // Whether `trace`, run on a fresh engine process after `prefix` (each on
    // its own engine), shows the finding again. For a plugin, in a fresh
    // kvcheck process (replay_in_child): its statics are its process's.
    bool fails_after(const Runner& runner, const Trace& prefix, const Trace& trace, const Shows& shows) {
        if (in_child_) return shows(replay_in_child(trace, &prefix));
        run_isolated(runner, prefix);
        const RunResult run = runner.run(trace);
        history_.push_back(trace);
        return shows(run);
    }

    // The shrunk trace replayed options_.replays times on engines nothing
    // earlier reached. None failing: the failure needs what ran before it
    // in the engine's process; the shortest prefix found (one earlier
    // trace, shrunk) makes it shared-state, none found, flaky.
    Reproduction verify(const Runner& runner, const Trace& found, const Trace& trace, const Failure& failure) {
        return verify(runner, found, trace, fails_as(failure));
    }

    Reproduction verify(const Runner& runner, const Trace& found, const Trace& trace, const Shows& shows) {
        Reproduction result;
        if (options_.replays == 0 || trace.empty()) return result;
        const std::vector<Trace> before = history_;  // this process's traces, the failing one last
        result.replays = options_.replays;
        for (std::size_t i = 0; i < result.replays; ++i) {
            if (shows(run_isolated(runner, trace))) ++result.failed;
        }
        result.kind = result.failed == result.replays ? "reproduced" : "flaky";
        if (result.failed > 0) return result;
        // The trace as found first (it ran everything the shrunk one did),
        // then the latest traces before it.
        std::vector<const Trace*> candidates{&found};
        for (auto it = before.rbegin(); it != before.rend() && candidates.size() < prefix_candidates_max; ++it) {
            if (*it != found) candidates.push_back(&*it);
        }
        for (const Trace* found_before : candidates) {
            const Trace candidate = runnable_prefix(runner, *found_before);
            if (!fails_after(runner, candidate, trace, shows)) continue;
            const Trace prefix = shrink_prefix(runner, candidate, trace, shows);
            result.kind = "shared-state";
            result.prefix = format_trace(prefix);
            result.prefix_replays = options_.replays;
            for (std::size_t i = 0; i < result.prefix_replays; ++i) {
                if (fails_after(runner, prefix, trace, shows)) ++result.prefix_failed;
            }
            return result;
        }
        return result;
    }

    // A candidate as a prefix: the steps it runs without a failure of its
    // own. One that fails (the trace as found does, in a process that
    // shares state) ends its run at that step, and the engine it ran on
    // with it, so what it left is not what the trace after it meets.
    Trace runnable_prefix(const Runner& runner, const Trace& candidate) {
        const RunResult run = run_isolated(runner, candidate);
        if (!run.failure || run.steps_run == 0) return candidate;
        return Trace(candidate.begin(), candidate.begin() + static_cast<std::ptrdiff_t>(run.steps_run - 1));
    }

    // The prefix made shorter while `trace` still fails after it: chunks
    // of operations removed, halves first, down to single operations
    // (ddmin), within prefix_shrink_runs_max runs. Any subsequence runs: an
    // operation that names what no earlier one made is skipped.
    Trace shrink_prefix(const Runner& runner, Trace prefix, const Trace& trace, const Shows& shows) {
        std::size_t runs = 0;
        for (std::size_t chunk = std::max<std::size_t>(prefix.size() / 2, 1); chunk >= 1; chunk /= 2) {
            for (std::size_t at = 0; at < prefix.size() && runs < prefix_shrink_runs_max;) {
                Trace candidate(prefix.begin(), prefix.begin() + static_cast<std::ptrdiff_t>(at));
                candidate.insert(candidate.end(), prefix.begin() + static_cast<std::ptrdiff_t>(std::min(at + chunk, prefix.size())),
                                 prefix.end());
                ++runs;
                if (fails_after(runner, candidate, trace, shows)) {
                    prefix = std::move(candidate);
                } else {
                    at += chunk;
                }
            }
            if (chunk == 1) break;
        }
        return prefix;
    }

    // Engine independence: the first trace that passed on a fresh engine
    // process, run again after all the others in that process. A failure
    // now is state one engine left for another (triage shrinks and
    // verifies it: its replays pass, its prefix is found); so are answers
    // that differ from its answers alone (answers_differ). One run per
    // search: sampled, cheap.
    void check_independence(const Runner& runner, const Runner& recording) {
        if (!alone_ || history_.size() < 2 || options_.replays == 0) return;
        const Alone alone = *alone_;
        const RunResult again = recording.run(alone.trace);
        history_.push_back(alone.trace);
        if (again.failure) {
            triage(runner, alone.trace, *again.failure, alone.seed);
            return;
        }
        if (const auto differs = answers_difference(alone.trace, alone.answers, again.answers)) {
            answers_differ(recording, alone, again.answers, differs->step);
        }
    }

    // The trace answered otherwise after the search's other traces than
    // alone, no property failing: cut after the step that differs (the
    // answers before it were the same), replayed alone (it must answer as
    // it did: else the engine answers at random, which is no finding of
    // this check) and verified as any finding, the difference being what a
    // replay must show. Reported ("shared-state") only when an earlier
    // trace run first makes it answer otherwise again, on every replay: a
    // two-part reproducer that fails, and no engine whose answers merely
    // vary (floating-point reductions, say) is reported.
    void answers_differ(const Runner& recording, const Alone& alone,
                        const std::vector<std::string>& late, std::size_t step) {
        const Trace trace(alone.trace.begin(), alone.trace.begin() + static_cast<std::ptrdiff_t>(step + 1));
        const std::vector<std::string> expected(alone.answers.begin(), alone.answers.begin() + static_cast<std::ptrdiff_t>(step + 1));
        const Shows shows = [trace, expected](const RunResult& run) {
            return run.failure ? run.failure->property == shared_state_id
                               : answers_difference(trace, expected, run.answers).has_value();
        };
        const Reproduction reproduction = verify(recording, alone.trace, trace, shows);
        if (reproduction.kind != "shared-state" || reproduction.prefix_failed < reproduction.prefix_replays) return;
        const Failure failure = *answers_difference(trace, expected, late);
        const std::string output = adapter_.take_output ? adapter_.take_output(0) : "";
        out_.send("shared-state", encode(FoundFailure{cases_, alone.trace.size(), failure, format_trace(trace), alone.seed,
                                                      output, reproduction}));
    }

    // The verdict: fail when a failure of this property was found; else
    // blocked when engine errors ended more than the share of traces a
    // verdict may leave unjudged; else pass.
    void finish() {
        SearchSummary summary;
        summary.cases = cases_;
        summary.judged = cases_ - errors_;
        summary.repeats = repeats_;
        summary.group_counts = counts_;
        const bool blocked = cases_ > 0 && static_cast<double>(summary.judged) < judged_share_min * static_cast<double>(cases_);
        if (blocked && own_found_ == 0) summary.blocked_by = blocked_by(summary.judged);
        const std::string never_ran = kinds_never_ran();
        if (!never_ran.empty()) out_.send("not-applied", never_ran);
        out_.send("stats", encode_stats(cases_, coverage_));
        out_.send(own_found_ > 0 ? "fail" : blocked ? "blocked" : "pass", encode(summary));
    }

    // Why a search is blocked: the group that ended most traces (the
    // first found, of equal counts) and the first trace it ended.
    std::string blocked_by(std::size_t judged) const {
        std::size_t most = 0;
        for (std::size_t i = 1; i < counts_.size(); ++i) {
            if (counts_[i] > counts_[most]) most = i;
        }
        const First& first = firsts_[most];
        std::ostringstream out;
        out << "only " << judged << " of " << cases_ << " traces could be judged (at least "
            << static_cast<int>(judged_share_min * 100) << " % must be): " << errors_
            << " still raised with up to " << raised_ops_dropped_max << " operations that raised left out; "
            << "the group raised most often, in " << counts_[most] << " traces, is \"" << first.shape << "\", first at trace " << first.trace
            << " of this search (seed " << first.seed << "; see engine-error)";
        return out.str();
    }

    // The kinds of operation the engine raised on every time it was asked
    // (none ran): the property's pass says nothing of them, and the row
    // says so ("pass*", not applied).
    std::string kinds_never_ran() const {
        std::ostringstream out;
        for (std::size_t i = 0; i < raised_.size(); ++i) {
            const bool merges = i >= op_kind_count;
            const std::size_t kind = merges ? i - op_kind_count : i;
            const std::size_t ran = merges ? coverage_.merges_run[kind] : coverage_.ops_run[kind];
            if (raised_[i] == 0 || ran != 0) continue;
            out << (out.tellp() == 0 ? "" : "; ") << op_kind_name(kind) << (merges ? " of several parts (a merge)" : "")
                << ": each of the " << raised_[i] << " asked raised and none ran, so the traces were judged without it"
                << " (see engine-error)";
        }
        return out.str();
    }

    // What a raised operation is counted as (raised_): its kind, or, for a
    // get_cache of several ids or a concat of several parts, that kind's
    // merges (op_kind_count + its kind), which ran only if a merge did.
    static std::size_t raised_kind(const Op& operation) {
        const auto* get = std::get_if<op::GetCache>(&operation);
        const auto* concat = std::get_if<op::Concat>(&operation);
        const bool merge = (get != nullptr && get->ids.size() > 1) || (concat != nullptr && concat->parts.size() > 1);
        return (merge ? op_kind_count : 0) + operation.index();
    }

    struct First {
        std::size_t trace = 0;  // 1-based, in this search
        std::uint64_t seed = 0;
        std::string shape;
    };

    const Adapter& adapter_;
    const Property property_;
    const std::size_t index_;
    const ConformanceOptions& options_;
    Channel& out_;
    ModelDomain model_;  // the domain searched (the engine's, or --model)
    std::size_t cases_ = 0;
    std::size_t errors_ = 0;   // traces an engine error left unjudged (judge_without_raising_ops)
    std::array<std::size_t, 2 * op_kind_count> raised_{};  // operations dropped because they raised, by raised_kind
    std::size_t repeats_ = 0;  // traces that failed as a reported failure of this property did
    std::size_t own_found_ = 0;
    Coverage coverage_;
    std::set<std::string> own_;     // shapes of this property's failures reported, as found and as shrunk
    std::set<std::string> others_;  // other properties found broken
    std::map<std::string, std::size_t> groups_;  // engine-error shape -> its group
    std::vector<std::size_t> counts_;             // per group: traces
    std::vector<First> firsts_;                   // per group: its first trace
    // The traces run in the engine process since it was last a fresh one,
    // in order (for in-process engines: since the search began).
    std::vector<Trace> history_;
    // A plugin's finding is replayed in a fresh kvcheck process: the
    // plugin's statics are its process's (replay_in_child).
    const bool in_child_ = replays_in_child(adapter_);
    std::optional<Alone> alone_;  // the first trace that passed in that process
};

}  // namespace

// Searches seeded traces for violations of one property: the property's
// own traces (stream `index` of the run's seed: kvcheck::trace_seed), with every property the engine can be judged
// on checked on each, so that a trace is blamed on what it breaks first
// (PropertySearch::triage). Engine errors never end a search: each is
// counted in its group (by message shape), the trace is judged without the
// operations that raised (judge_without_raising_ops), and the property is
// "blocked" only when fewer than judged_share_min of the traces could be
// judged, or when every operation of some kind raised. After a failure of this property the search goes
// on, within the same budget of traces or seconds, for failures that
// differ from those reported (another shape), until options.failures_max
// are found.
void search_property(const Adapter& adapter, Property property, std::size_t index, const ConformanceOptions& options,
                     Channel& out) {
    const std::shared_ptr<Engine> probe = adapter.make();
    const Capabilities capabilities = probe->capabilities();
    if (!checkable(capabilities).has(property)) {
        if (!capabilities.paged && paged_property(property)) {
            out.send("skipped", paged_not_applicable);
            return;
        }
        if (!capabilities.store && !paged_property(property)) {
            out.send("skipped", contiguous_not_applicable);
            return;
        }
        if (property == Property::free_order) {
            out.send("skipped", "the adapter declares no free-queue order (Capabilities::paged_free_order unspecified)");
            return;
        }
        if (capacity_property(property) && !capabilities.policy.bounded()) {
            out.send("skipped", capacity_not_applicable);
            return;
        }
        if (property == Property::trim_exact) {
            out.send("skipped", "the adapter does not claim trim (Capabilities::trim): no trim is drawn");
            return;
        }
        if (property == Property::lease_respected) {
            out.send("skipped", "the adapter declares no leases (Capabilities::lease_ttl_ms): no lease is drawn");
            return;
        }
        if (property == Property::batch_exact) {
            out.send("skipped", "the adapter does not claim batch (Capabilities::batch): no batch is drawn");
            return;
        }
        if (property == Property::linearizable && capabilities.content_tolerance.declared()) {
            out.send("skipped", "the adapter declares a content tolerance, and linearizable compares what concurrent "
                                "requests read with the expected content exactly (docs/semantics.md#content-tolerance)");
            return;
        }
        out.send("skipped", "the adapter does not report what this property needs (see Capabilities)");
        return;
    }
    WorkloadOptions workload = options.workload;
    workload.capabilities = capabilities;
    if (options.model) workload.capabilities.model = *options.model;
    const std::string fault = capabilities_fault(workload.capabilities);
    if (!fault.empty()) {
        out.send("error", (options.model ? "--model does not fit the engine: " : "the engine's capabilities: ") + fault);
        return;
    }
    out.send("domain", domain_text(workload.capabilities.model));
    if (property == Property::dump_safe && !capabilities.dump_kill) {
        // Said on the dump-safe row: a pass there did not kill a dump.
        out.send("not-applied",
                 std::string("kill/power-cut: not applied, because ") +
                     (adapter.take_output ? "its dumps cannot run in a copy of the adapter process with the dump shim armed: " +
                                                (adapter.dump_kill_absent.empty() ? std::string("the adapter does not serve dump_fork")
                                                                                  : adapter.dump_kill_absent)
                                          : "the engine declares that its dump cannot run in a fork (Capabilities::dump_kill)") +
                     ": its dumps were not killed at each call nor cut by a power failure, only dumped and loaded (and "
                     "interrupted by the engine itself, with dump_crash); a dump that never fsyncs can pass "
                     "(docs/durability.md)");
    }
    workload.dump_kill = property == Property::dump_safe;
    PropertySearch(adapter, property, index, options, out).run(checkable(capabilities), workload);
}

}  // namespace kvcheck::cli
