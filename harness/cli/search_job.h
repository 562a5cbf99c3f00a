// A conformance job's own work, in its child process, and what it tells
// the parent: the search of one (adapter, property) pair for violations
// (search_property), and the messages that carry what it found across the
// channel ("failure", "engine-error", "other", "stats", "skipped", and the
// verdict at the end: "pass", "fail" or "blocked"; see search_property)
// with their encoding.
#pragma once

#include "adapters.h"
#include "conformance.h"
#include "kvcheck/search.h"
#include "sandbox.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck::cli {

// The first step at which a trace's answers run alone (RunResult::answers,
// on a fresh engine process) and run later in a process differ, as a
// shared-state failure naming both; nullopt when they agree wherever both
// ran (docs/semantics.md#reproduction, engine independence).
std::optional<Failure> answers_difference(const Trace& trace, const std::vector<std::string>& alone,
                                          const std::vector<std::string>& late);

// A message's text on one line: line breaks become spaces.
std::string one_line(std::string text);

// A failure found by a search, as a "failure", "engine-error" or "other"
// message carries it.
struct FoundFailure {
    std::size_t cases = 0;         // traces run before it was found, its own included
    std::size_t found_length = 0;  // operations of the trace as found, before the shrink
    Failure failure;
    std::string trace;       // the shrunk trace, in the text format; "" for an engine-error group not shrunk
    std::uint64_t seed = 0;  // the seed of the trace as found
    std::string output{};    // an out-of-process engine's output while that trace ran (Adapter::take_output)
    Reproduction reproduction{};  // how its replays went (PropertySearch::verify)
};

std::string encode(const FoundFailure& found);
FoundFailure decode(const std::string& payload);

// What a search sends with its verdict ("pass", "fail" or "blocked").
struct SearchSummary {
    std::size_t cases = 0;    // traces run
    std::size_t judged = 0;   // of them, those not ended by an engine error
    std::size_t repeats = 0;  // failing traces passed over: they failed as one already reported
    // Per "engine-error" message sent, in order: the traces of the search
    // that failed in that group (the same message shape).
    std::vector<std::size_t> group_counts;
    std::string blocked_by;  // "blocked": why, naming the group that ended most traces and its first trace
};

std::string encode(const SearchSummary& summary);
SearchSummary decode_summary(const std::string& payload);

// How many engine-error groups (message shapes) one search shrinks; the
// groups after them are counted, with their first message and seed.
inline constexpr std::size_t error_groups_shrunk_max = 5;
// The shrinker's runs for each failure after a search's first, and for an
// engine-error group: a mutant's further failures and an engine's errors
// cost a bounded share of the run (the first failure keeps the shrinker's
// full budget, ShrinkOptions::runs_max).
inline constexpr std::size_t later_shrink_runs_max = 500;
// A finding whose replays all pass: the earlier traces of the search's
// engine process tried as the prefix that makes it fail again (the trace
// as found first, then the latest ones), and the shrinker's runs of the
// prefix found.
inline constexpr std::size_t prefix_candidates_max = 8;
inline constexpr std::size_t prefix_shrink_runs_max = 150;

// A property is judged when at least this share of its search's traces
// could be judged; below it, "blocked".
inline constexpr double judged_share_min = 0.9;
// A trace an engine error ended is run again without the operation that
// raised (and without what only it would have made), at most this many
// times; it is judged when such a run completes.
inline constexpr std::size_t raised_ops_dropped_max = 3;

// A "stats" message: traces run, the workload shapes they held and the
// operations they ran, by kind; decoding adds them to what is already
// counted.
std::string encode_stats(std::size_t cases, const Coverage& coverage);
void decode_stats(const std::string& payload, std::size_t* cases, Coverage* coverage);

// A runner for traces of `adapter` in a job: each trace announced on the
// channel before it runs ("begin"), each operation marked on it, dumps
// under the job's own directory.
Runner runner_for(const Adapter& adapter, PropertySet properties, Channel& out);

// Runs `trace` with its first engine made by `first` (an engine nothing
// earlier reached: isolated_factory), any later one (as a dump-safe kill
// test makes) by the runner's own factory.
RunResult run_first_on(const Runner& runner, const EngineFactory& first, const Trace& trace);

// Sends a shrunk finding as a "fail" message.
void send_finding(const Finding& finding, std::size_t cases, Channel& out);

// The search of `property` (index `index` of the run's list) on `adapter`,
// reported on `out`: see the definition for how traces are blamed and when
// the search ends.
void search_property(const Adapter& adapter, Property property, std::size_t index, const ConformanceOptions& options,
                     Channel& out);

}  // namespace kvcheck::cli
