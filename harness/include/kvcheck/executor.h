// The executor runs a trace against an engine, keeps the auditor's expected
// state in step, and runs the named checkers (harness/checkers/, one per
// property) around every operation; what each step reads is the schedule of
// harness/run/run.cpp. The first step with a violation ends the run and is
// reported as a Failure.
//
//   kvcheck::adapters::ReferenceEngine engine;
//   kvcheck::RunResult result = kvcheck::execute(trace, engine, {});
//   if (result.failure) std::cout << kvcheck::format_failure(*result.failure, trace, "kvcheck replay ...");
#pragma once

#include "kvcheck/engine.h"
#include "kvcheck/properties.h"
#include "kvcheck/trace.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck {

struct Failure {
    std::string property;  // a property id, or engine_error_id
    std::size_t step = 0;  // index of the operation in the trace
    std::string message;   // what and where, e.g. `entry "a" layer 1 keys content differs`
    // Other properties violated at the same step, as "<property>: <message>".
    // The one reported is the first in property order (the table above).
    std::vector<std::string> also;
};

// What a run covered, for distribution reports and fuzzer feedback.
struct Coverage {
    std::array<std::uint32_t, op_kind_count> ops_run{};
    std::uint32_t ops_skipped = 0;      // naming a handle nobody made, or inapplicable
    std::uint32_t modern_caches = 0;    // caches made or added, by layout
    std::uint32_t legacy_caches = 0;
    std::uint32_t generations_owned = 0;  // generate on an owned copy
    std::uint32_t merges = 0;             // get_cache / concat of several parts
    std::uint32_t store_size_max = 0;
    // A small set of (op kind x layout x store size bucket x owned) states
    // seen, as indices; the fuzzer feeds them back as coverage.
    std::vector<std::uint16_t> states;
};

struct RunOptions {
    PropertySet properties = PropertySet::all();
    std::string work_dir;  // dumps go under it; empty: a fresh temporary directory, removed after
    bool record_states = false;
    // Read every stored entry, the listing and every handle after every
    // step. By default the executor reads after a step what the step can
    // reach (the entries it names, those sharing storage with the handles it
    // names) and everything at full reads (around dump, load and delete_all,
    // every max(16, entries) steps, and at the end of the run): a change no
    // handle reaches is found, but at a later step than it happened. With
    // this option it is found at its step, at a cost that grows with the
    // store. Both find the same failures on the same traces
    // (properties/mutants_test.cpp, Schedule).
    bool every_entry_every_step = false;
    // Makes a fresh engine of the one under test: dump_kill loads what a
    // crash left with one, in a fresh process. Unset, dump_kill is skipped;
    // kvcheck::Runner sets it to its factory.
    std::function<std::shared_ptr<Engine>()> fresh_engine;
    // Called before each step with its index (progress reports, benchmarks
    // timing part of a trace). Must not touch the engine.
    std::function<void(std::size_t step)> on_step;
};

struct RunResult {
    std::optional<Failure> failure;
    std::size_t steps_run = 0;
    Coverage coverage;
};

RunResult execute(const Trace& trace, Engine& engine, const RunOptions& options = {});

// The failure in the one format used everywhere:
//   ERROR: <property>: <message> at step N (<op>)
//   <the trace, the failing step marked>
//   SUMMARY: kvcheck: <property> violated after N operations
//   reproduce: <command>
std::string format_failure(const Failure& failure, const Trace& trace, const std::string& reproduce);

}  // namespace kvcheck
