// What the two trace targets (fuzz_ops, fuzz_layout) share: choosing the
// adapter, decoding an input into a trace, running it on a fresh engine,
// feeding the model states back as coverage, and reporting a violation.
//
// An input is either choice bytes (decoded by ByteChooser through the
// target's generator: every input is a valid trace) or, when its first
// byte is '#', a text trace in the corpus format (a '#' comment line, then
// one operation per line). Text traces are held to TextLimits; one over
// them, or one that does not parse, is rejected (the target returns -1, so
// libFuzzer does not keep it).
//
// On a violation the target shrinks the trace (kvcheck::shrink_failure, the
// path every kvcheck tool shares: the same check on fresh engines), prints
// it in the harness failure format, writes the shrunk text trace to
// <dir>/crash-<sha1 of the input>.trace, next to libFuzzer's crash-<sha1>,
// and aborts. <dir> is $KVCHECK_ARTIFACT_DIR, else
// libFuzzer's -artifact_prefix, else the working directory.
//
// Environment (read once, at start-up, and printed):
//   KVCHECK_ADAPTER=M3       the bundled adapter to check (default: the
//                            target's default_adapter, "reference" unless
//                            built with -DKVCHECK_FUZZ_ADAPTER="M1")
//   KVCHECK_ARTIFACT_DIR=d   where shrunk traces go
//   KVCHECK_SHRINK=0         report the trace as found (crash minimization)
//   KVCHECK_PRINT_TRACE=1    print every input's trace (to read a corpus)
//   KVCHECK_FUZZ_TMPDIR=d    where dumps go (default /dev/shm when writable)
#pragma once

#include "kvcheck/adapter.h"
#include "kvcheck/executor.h"
#include "kvcheck/workload.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace kvcheck::fuzz {

// Bounds on a text trace (choice bytes stay within the workload options),
// those of the default scope's largest caches. Beyond these, a text trace
// may not name h0 or one of an operation's own sources as the handle it
// makes, nor mix geometries (the generator never does, and a merge of two
// is not followed).
struct TextLimits {
    std::size_t trace_ops_max = 64;
    std::size_t cache_layers_max = 8;
    std::int64_t layer_tokens_max = 512;
    std::int64_t heads_max = 8;
    std::int64_t head_dim_max = 32;
    std::int64_t slot_values_max = 8192;  // heads * head_dim * tokens of one layer
    std::size_t prompt_tokens_max = 16;
    std::int64_t token_max = 31;  // the decoder's vocabulary is [0, 32)
    std::int64_t new_tokens_max = 16;
    std::size_t ids_max = 8;
    std::int64_t dump_slot_max = 7;
    std::int64_t dump_crash_bytes_max = std::int64_t{1} << 20;
    std::int64_t fill_items_max = 64;        // a fill's count (the default scope's)
    std::int64_t fill_first_max = 1 << 16;   // and its first id
};

// Makes a trace from choices; the options carry the adapter's capabilities.
using Generator = std::function<Trace(Chooser&, const WorkloadOptions&)>;
// Checks a trace on engines `make` builds, with `options` (the dump
// directory, whether to record coverage states). Returns the run (with its
// failure, if any).
using Check = std::function<RunResult(const Trace&, const EngineFactory& make, const RunOptions& options)>;

struct TraceTarget {
    std::string name;        // "ops", "layout": the corpus folder and the regression header
    std::string default_adapter = "reference";  // when KVCHECK_ADAPTER is not set
    WorkloadOptions workload;  // capabilities are filled from the adapter
    Generator generate;
    Check check;
};

// Reads the environment and libFuzzer's flags, makes one engine to learn
// its capabilities, and prints the settings. Exits with status 2 for an
// unknown adapter.
void init_target(int* argc, char*** argv, TraceTarget target);

// The whole of LLVMFuzzerTestOneInput for a trace target.
int run_input(const std::uint8_t* data, std::size_t size);

// Runs `trace` through the executor with every property on a fresh engine.
RunResult execute_fresh(const Trace& trace, const EngineFactory& make, const RunOptions& options);

}  // namespace kvcheck::fuzz
