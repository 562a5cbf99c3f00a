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

// Shapes of interest a run met: the rare situations ownership bugs hide in
// (kvcheck run --stats counts them; a test keeps floors on them so the
// workload cannot drift away from them unseen).
#define KVCHECK_SHAPE_LIST(X)                                                                      \
    X(re_add_after_delete, "an id deleted, then added again")                                      \
    X(same_content_twice, "the same content stored under two ids")                                 \
    X(metadata_item, "an item added with metadata")                                                \
    X(release_borrowed, "a release of what get handed out")                                        \
    X(release_owned, "a release of an owned copy or merge")                                        \
    X(copy_of_uninitialized, "a copy of a cache holding an uninitialized layer with tokens")      \
    X(conversion_of_owned, "a conversion of an owned copy")                                        \
    X(generation_from_owned, "a generation from an owned copy")                                    \
    X(merge, "a merge of several parts")                                                           \
    X(mixed_merge, "a merge of parts of different dtypes")                                         \
    X(slot_64_tokens, "a cache with a slot of 64 tokens or more")                                  \
    X(slot_256_tokens, "a cache with a slot of 256 tokens or more")                                \
    X(other_geometry, "a cache of other heads or head_dim than 2 x 4")                             \
    X(interrupted_dump, "a dump interrupted part way")                                             \
    X(corrupted_dump, "a dump file corrupted or truncated")                                        \
    X(failed_load, "a load the engine refused")                                                   \
    X(returned_cache_reused, "a trace that generated from or stored a cache a generation returned") \
    X(extracted_memory, "a memory the model made, stored by extract")                              \
    X(store_64_items, "a trace whose store held 64 items or more")

enum class Shape : std::uint8_t {
#define KVCHECK_SHAPE_ENUM(name, text) name,
    KVCHECK_SHAPE_LIST(KVCHECK_SHAPE_ENUM)
#undef KVCHECK_SHAPE_ENUM
};
#define KVCHECK_SHAPE_COUNT(name, text) +1
inline constexpr std::size_t shape_count = 0 KVCHECK_SHAPE_LIST(KVCHECK_SHAPE_COUNT);
#undef KVCHECK_SHAPE_COUNT
const char* shape_id(Shape shape);       // "re_add_after_delete"
const char* shape_summary(Shape shape);  // one line
// Whether an engine with `capabilities` can be drawn an operation that
// makes `shape`: a shape of operations it does not claim (a dump, a
// returned cache, the contiguous store of a paged-only engine) is never
// met, and a count of 0 there says nothing about the search.
bool shape_claimed(Shape shape, const Capabilities& capabilities);

// What a run covered, for distribution reports and fuzzer feedback.
struct Coverage {
    std::array<std::uint32_t, op_kind_count> ops_run{};
    std::array<std::uint32_t, op_kind_count> merges_run{};  // of them, merges of several parts the engine made
    std::uint32_t ops_skipped = 0;      // naming a handle nobody made, or inapplicable
    std::uint32_t modern_caches = 0;    // caches made or added, by layout
    std::uint32_t legacy_caches = 0;
    std::uint32_t generations_owned = 0;  // generate on an owned copy
    std::uint32_t merges = 0;             // get_cache / concat of several parts
    std::uint32_t mixed_merges = 0;       // of them, of parts of different dtypes
    std::uint32_t refused_merges = 0;     // of those, refused by the engine
    std::uint32_t store_size_max = 0;
    std::array<std::uint32_t, shape_count> shapes{};
    // Of the searches counted, how many had an engine that claims the
    // operations of each shape (shape_claimed): reports show a shape only
    // where some did.
    std::array<std::uint32_t, shape_count> claimed{};
    void count(Shape shape) { ++shapes[static_cast<std::size_t>(shape)]; }
    std::uint32_t count_of(Shape shape) const { return shapes[static_cast<std::size_t>(shape)]; }
    // Adds another run's counts (states are left out).
    void add(const Coverage& other);
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
    // Keep what the engine answered at each step (RunResult::answers): the
    // engine-independence check compares a trace's answers run alone with
    // its answers run after other traces (docs/semantics.md#reproduction).
    // Off, nothing extra is read.
    bool record_answers = false;
};

struct RunResult {
    std::optional<Failure> failure;
    std::size_t steps_run = 0;
    Coverage coverage;
    // With RunOptions::record_answers: per step run, what the engine
    // answered, as a short text ("skipped"; "get_cache h2: content 1a2b...;
    // 1 copy of 512 bytes"): lengths, content digests, tokens, copy counts,
    // refusals; never what an engine may choose freely (addresses, storage
    // identities, block numbers, error texts). Equal answers for equal
    // traces on fresh engines are what engine independence asks.
    std::vector<std::string> answers;
};

RunResult execute(const Trace& trace, Engine& engine, const RunOptions& options = {});

// The failure in the one format used everywhere:
//   ERROR: <property>: <message> at step N (<op>)
//   <the trace, the failing step marked>
//   SUMMARY: kvcheck: <property> violated after N operations
//   reproduce: <command>
std::string format_failure(const Failure& failure, const Trace& trace, const std::string& reproduce);

}  // namespace kvcheck
