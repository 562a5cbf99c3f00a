// From a seed to a short, replayable failure: the one path the RapidCheck
// suites, the kvcheck CLI and the fuzz targets share. A search runs seeded
// traces (trace_for_seed) on fresh engines until one fails; the failure is
// shrunk (kvcheck/shrink.h), then run once more reading every entry after
// every step, so that the step it reports is the step it happened.
//
//   kvcheck::Runner runner{adapter.make};
//   runner.options.properties = kvcheck::PropertySet::only(kvcheck::Property::single_copy);
//   kvcheck::SearchResult result = kvcheck::search(runner, {seed, 0, 0, 200}, workload);
//   if (result.finding) std::cout << kvcheck::format_failure(result.finding->reported, result.finding->shrunk.trace,
//                                                            kvcheck::replay_command(adapter, "t.trace"));
#pragma once

#include "kvcheck/adapter.h"
#include "kvcheck/executor.h"
#include "kvcheck/shrink.h"
#include "kvcheck/splitmix.h"
#include "kvcheck/workload.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace kvcheck {

// How each trace of a search or a shrink runs: on a fresh engine.
struct Runner {
    EngineFactory make;
    RunOptions options;
    // Called before each trace runs: a child process announces the trace to
    // its parent, so that the trace that kills it is known; a fuzz target
    // empties its dump directory.
    std::function<void(const Trace&)> before_run;
    // The traces the shrinker may try (a fuzz target keeps to those it can
    // replay as text); unset: all.
    std::function<bool(const Trace&)> shrink_accepts;
    // Failures a search passes over, to the next seed (unshrunk): a search
    // for one property past another already known to be broken.
    std::function<bool(const Failure&)> passes_over;
    // Told of each shorter trace the shrinker found failing the same way
    // (progress lines of a long shrink).
    std::function<void(std::size_t operations)> on_shorter;
    // How a trace is checked; unset: kvcheck::execute on one fresh engine
    // from `make`. A fuzz target adds checks of its own.
    std::function<RunResult(const Trace&, const RunOptions&)> check;

    RunResult run(const Trace& trace, bool every_entry_every_step = false) const;
};

// The seed of trace `index` of search `stream` of a run seeded `run_seed`
// (kvcheck run: stream p is the p-th property of the run's list):
// splitmix64 applied over the three, so that every (run seed, stream) pair
// has seeds of its own. Runs seeded S and S + 1 share no trace, nor do two
// streams of one run (both but with chance 2^-64 per pair of traces); the
// seeds of one stream are all different (splitmix64 is a bijection). The
// one place a trace's seed is derived: kvcheck run's searches and those of
// the property suites and benchmarks all come through search().
constexpr std::uint64_t trace_seed(std::uint64_t run_seed, std::uint64_t stream, std::uint64_t index) {
    return splitmix64(splitmix64(splitmix64(run_seed) ^ stream) ^ index);
}

// Traces trace_seed(seed, stream, first_index), then first_index + 1, ...:
// `cases` of them, or as many as fit in `seconds` when it is positive.
struct Budget {
    std::uint64_t seed = 0;         // the run's seed
    std::uint64_t stream = 0;       // whose traces (kvcheck run: the property's index in the run's list)
    std::uint64_t first_index = 0;  // a search resumed past a finding goes on from the next index
    std::size_t cases = 200;
    double seconds = 0;
};

struct Finding {
    std::uint64_t seed = 0;        // the seed of the first failing trace (trace_seed), for trace_for_seed
    std::size_t traces_tried = 0;  // traces run until then, itself included
    Trace found;                   // that trace
    Failure found_failure;         // and its failure
    ShrinkResult shrunk;           // the shrunk trace, with its failure as the shrinker saw it
    Failure reported;              // the shrunk trace's failure at the step it happened
    double find_seconds = 0;
    double shrink_seconds = 0;
};

struct SearchResult {
    std::size_t cases = 0;  // traces run
    Coverage coverage;      // what they covered, summed
    std::optional<Finding> finding;
};

SearchResult search(const Runner& runner, const Budget& budget, const WorkloadOptions& workload);

// The failure `found` (by the default schedule, possibly at a full read
// later than the step that broke something) pinned to the step it
// happened: a short trace is run again reading every entry after every
// step; a long one is bisected on its prefixes (each run ends reading every
// entry, so the shortest failing prefix ends with the step that did it),
// whose cost grows with n log n, not n squared. `found` stands when nothing
// better is found (which it should not: both schedules find the same
// failures).
Failure pin_failure(const Runner& runner, const Trace& trace, const Failure& found);

// Shrinks a failing trace and pins the failure to its step. With no
// declared options.model, the model the runner's engine declares.
Finding shrink_failure(const Runner& runner, const Trace& trace, const Failure& failure,
                       const ShrinkOptions& options = {});

// A failure's message with what differs between two occurrences of one
// bug made alike: its first line only (a Python adapter's error reply is
// "Type: message", then the traceback), every number, list of numbers, hex
// address, bracketed list ([b c], [1,2,4]) or mapping ({turn=3}), quoted
// identifier and path replaced by a placeholder; at most
// message_shape_chars_max characters.
//   message_shape("entry \"a7\" layer 3 keys [1,4] at 0x7f3a") == "entry \"_\" layer N keys [_] at 0x_"
inline constexpr std::size_t message_shape_chars_max = 300;
std::string message_shape(const std::string& message);

// A failure's identity, as distinct failures are told apart (as Hypothesis
// tells bugs apart by their origin): its property and its message's shape,
// "<property>: <shape>". Engine errors are grouped by it.
std::string failure_shape(const Failure& failure);

// `text` as one word of a POSIX shell command line (quoted when it must be).
std::string shell_quoted(const std::string& text);

// The command that replays a trace file on an adapter:
//   kvcheck replay FILE --adapter NAME [--property ID]
std::string replay_command(const Adapter& adapter, const std::string& trace_file,
                           std::optional<Property> property = std::nullopt);

}  // namespace kvcheck
