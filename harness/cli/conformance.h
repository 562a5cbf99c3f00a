// Conformance runs: every chosen property against every chosen adapter,
// each (adapter, property) pair searched in its own child process with
// seeded random traces, a failure shrunk to a short trace, a fault (crash,
// hang, leak) attributed to the trace that caused it.
#pragma once

#include "adapters.h"
#include "kvcheck/executor.h"
#include "kvcheck/workload.h"
#include "sandbox.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck::cli {

struct ConformanceOptions {
    std::uint64_t seed = 20261202;
    std::size_t cases = 200;  // traces per property (when seconds == 0)
    double seconds = 0;       // time per property instead of a case count
    std::vector<Property> properties;  // empty: all
    Limits limits;
    std::size_t failures_max = 3;  // distinct failures reported per property (--failures)
    std::size_t jobs = 2;     // child processes at once
    bool isolate = true;
    std::string trace_dir = "kvcheck-traces";  // must exist and be writable (the commands check it first)
    std::string trace_name_suffix;             // before ".trace": TraceDir::name_suffix() of the run
    bool progress = true;     // progress lines on stderr,
    double progress_seconds = 5;  // at most one per this many seconds per task (0: at every step of progress)
    WorkloadOptions workload;
    // --model: the model domain searched, instead of the one each engine
    // declares (kvcheck/domain.h).
    std::optional<ModelDomain> model;
    // --replays: how many times a finding's shrunk trace is replayed on an
    // engine nothing earlier reached before it is reported
    // (docs/semantics.md#reproduction); 0: not verified.
    std::size_t replays = 3;
};

// How a finding reproduced (docs/semantics.md#reproduction): its shrunk
// trace replayed on engines nothing earlier reached (a fresh adapter
// process; a fresh instance of an engine loaded in kvcheck's process).
struct Reproduction {
    // "reproduced": every replay failed as found. "flaky": some did (or
    // none, and no earlier trace run first made it fail again).
    // "shared-state": none did, but it fails after `prefix` ran first in
    // the same engine process: engines share state across instances.
    // "": not verified (--replays 0, or nothing to replay).
    std::string kind;
    std::size_t replays = 0;  // replays of the trace alone
    std::size_t failed = 0;   // of them, those that failed as found
    std::string prefix;       // shared-state: the trace run first, in the text format
    std::size_t prefix_replays = 0;  // replays of prefix then trace, in one process
    std::size_t prefix_failed = 0;   // of them, those that failed as found
    // How it reads in a report: "" when reproduced (or not verified), else
    // "flaky: failed 1 of 3 replays ..." or "shared-state: ...".
    std::string label() const;
};

// One distinct failure of a property (another failing check, or another
// message shape), or a fault; under engine-error, one group of engine
// errors of one message shape.
struct FailureReport {
    std::string message;
    std::vector<std::string> also; // other properties violated at the failing step
    std::string fault;             // "", or "crash: SIGSEGV", ... (see PropertyResult::fault)
    std::string trace;             // the shrunk failing trace; "" for an engine-error group not shrunk
    // A trace of several lanes (kvcheck/lanes.h): the lane of each of its
    // steps, the failing step, the conflicting steps (conflicting_steps),
    // and the lanes side by side as text (swimlanes). Empty for one lane.
    std::vector<std::int64_t> lanes;
    std::size_t step = 0;
    std::vector<std::size_t> conflicts;
    std::string swimlanes;
    // A thread-level finding (kvcheck run --threads): its trace file's first
    // line, "threads lanes=N schedule=...\n", written before `trace` (the
    // calls in the order they began); "" for any other.
    std::string threads;
    std::size_t found_length = 0;  // operations before shrinking
    std::size_t found_after = 0;   // traces its search had run when it was found, its own included
    std::uint64_t seed = 0;        // the seed of the trace it was found in (0: unknown)
    std::size_t count = 1;         // traces that failed this way (an engine-error group's size)
    std::string searching;         // the property whose search found it
    std::string shape;             // its identity (kvcheck::failure_shape)
    std::string trace_file;        // where the trace was written
    std::string trace_file_error;  // why it could not be (then there is no reproduce command)
    std::string reproduce;         // the command that replays it
    std::string output;            // an out-of-process engine's output while its trace ran, as found
    Reproduction reproduction;     // how its replays went
    std::string prefix_file;       // shared-state: where the prefix trace was written
};

// The verdict message of a property of the paged family for an engine that
// is no paged engine (Capabilities::paged): the table shows it as n/a.
inline constexpr const char* paged_not_applicable =
    "n/a: a property of paged caches, and the adapter is no paged engine (Capabilities::paged)";
// The verdict message of a contiguous property for a paged-only engine
// (Capabilities::store false).
inline constexpr const char* contiguous_not_applicable =
    "n/a: a property of contiguous caches, and the adapter is a paged engine only (Capabilities::store)";

// The verdict message of a property that judges a declared capacity for a
// store that declares none (Capabilities::policy): nothing may be evicted.
// The verdict message of linearizable in a run of one client (no --lanes):
// it judges requests of several clients only.
inline constexpr const char* lanes_not_applicable =
    "n/a: judged on traces of several clients only (kvcheck run --lanes N, docs/semantics.md#linearizable)";
inline constexpr const char* capacity_not_applicable =
    "n/a: the adapter declares no capacity (store_policy), so no entry may be evicted (stored-immutable holds it to that)";

// A property an adapter is known, before any job, not to be judged on: of
// the other cache family, or judging a capacity it does not declare. Known
// for an adapter whose model is known before any job (a process adapter's
// handshake gave it, with its families; a bundled adapter's engine made in
// kvcheck's process, commands.cpp's learn_declared). Its verdict is n/a
// without a job (a job is a fork, and each job of a process adapter starts
// one), and `kvcheck list --adapter` leaves it out: the message, else null.
const char* known_not_applicable(const Adapter& adapter, Property property);

struct PropertyResult {
    std::string id;
    // "pass", "fail", "skipped", "blocked" (fewer than 90 % of the search's
    // traces could be judged: the others ended in engine errors, reported
    // under engine-error) or "not-run" (the run was interrupted before this
    // property finished).
    std::string verdict = "pass";
    std::size_t cases = 0;
    std::size_t judged = 0;   // of the cases, those not ended by an engine error
    std::size_t repeats = 0;  // failing traces passed over: they failed as a failure reported did
    double seconds = 0;
    // Every distinct failure, a fault first; under engine-error, the groups.
    // The fields below, from message to reproduce, are the first's (the
    // report's shape before several failures were kept).
    std::vector<FailureReport> failures;
    std::string message;           // the failure, fault or skip reason
    std::vector<std::string> also; // other properties violated at the failing step
    std::string fault;             // "", or "crash: SIGSEGV", "hang: ...", "memory: ...", "exit: ...", "time: ..."
    std::string trace;             // the shrunk failing trace, as text
    std::size_t found_length = 0;  // operations before shrinking
    std::string trace_file;        // where the trace was written
    std::string trace_file_error;  // why it could not be (then there is no reproduce command)
    std::string reproduce;         // the command that replays it
    std::array<CapturedOutput, 2> engine_output;  // what the engine printed (stdout, stderr): the last bytes
    std::string output;            // an out-of-process engine's last output (Adapter::take_output)
    // Checks of the property that could not be applied to this engine, and
    // why ("kill/power-cut: not applied, because ..."): a pass holds
    // without them. Empty: all were.
    std::string not_applied;
};

struct AdapterResult {
    Adapter adapter;
    // A row per property, then engine-error (the adapter errors where it
    // should not, found while searching any property) and shared-state
    // (engines share state across instances: docs/semantics.md#reproduction).
    std::vector<PropertyResult> properties;
    std::string domain;      // the model domain searched (domain_text), as its searches report it
    std::size_t traces = 0;  // distinct traces run, over every property's search
    Coverage coverage;       // the shapes of interest they met (Coverage::shapes)
    // Operations of the traces begun by searches that sent no counts (a
    // fault or an interrupt ended them): in no kind of coverage.ops_run.
    std::size_t operations_begun = 0;
    bool all_pass() const;
    bool fails(const std::string& property) const;
};

struct ConformanceRun {
    std::vector<AdapterResult> adapters;
    int interrupted_by = 0;  // the signal that stopped the run early; 0: complete
};

// Every chosen property of every adapter. A Ctrl-C (interrupt.h) stops the
// children and returns what was finished, the rest "not-run".
ConformanceRun check_adapters(const std::vector<Adapter>& adapters, const ConformanceOptions& options);

// One trace against one adapter (replay / shrink): the failure if any, shrunk
// when `shrink_it`. Isolated like a conformance run, with progress lines on
// stderr every options.progress_seconds when options.progress.
struct ReplayResult {
    bool failed = false;
    Failure failure;
    std::string fault;
    Trace trace;  // shrunk when asked and failing, else the input (or the prefix a fault struck in)
    std::size_t steps_run = 0;    // a passing replay: the operations run,
    std::size_t ops_skipped = 0;  // and how many of them were skipped
    int interrupted_by = 0;       // the signal that stopped it; then nothing else is set
    std::array<CapturedOutput, 2> engine_output;
    std::string output;  // an out-of-process engine's last output (Adapter::take_output)
};
// `prefix`: a trace run first, on its own engine in the same engine
// process, its result ignored (a shared-state finding's first part).
ReplayResult replay_trace(const Adapter& adapter, const Trace& trace, PropertySet properties, bool shrink_it,
                          const ConformanceOptions& options, const std::optional<Trace>& prefix = std::nullopt);

}  // namespace kvcheck::cli
