// The workload: what to do next. Builds random traces from a stream of
// choices, so that RapidCheck (rc::gen), libFuzzer (the input bytes) and a
// plain seed all drive the same generator and produce the same vocabulary.
//
// Swarm testing: each trace first draws a Swarm (a weight per operation
// kind, some kinds switched off, a dtype (in some traces mixed with the
// others), which layouts, one geometry and the size of its caches), then
// draws its operations from it; runs differ in what they stress, not only
// in order.
//
// An engine that declares its model (Capabilities::model, kvcheck/domain.h)
// gets only that model's caches: each of its layer count and geometry, one
// token count (>= 1, drawn as any layer's is) in every layer, a dtype of
// the model's (one per trace; mixed only when the model has several), a
// layout of its own (conversions only when it holds both), odd layers
// only when the model has them. An engine that does not take modern
// caches (Capabilities::modern_layout) never gets one.
//
//   kvcheck::SeededChooser choose(42);
//   kvcheck::Swarm swarm = kvcheck::random_swarm(choose, options);
//   kvcheck::Trace trace = kvcheck::generate_trace(choose, swarm, options);
#pragma once

#include "kvcheck/domain.h"
#include "kvcheck/engine.h"
#include "kvcheck/trace.h"

#include <array>
#include <cstdint>
#include <string>

namespace kvcheck {

// A source of choices. `below(n)` is in [0, n); n >= 1.
class Chooser {
  public:
    virtual ~Chooser() = default;
    virtual std::uint64_t below(std::uint64_t n) = 0;
    bool one_in(std::uint64_t n) { return below(n) == 0; }
    std::int64_t between(std::int64_t low, std::int64_t high) {  // inclusive
        return low + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(high - low + 1)));
    }
};

class SeededChooser final : public Chooser {
  public:
    explicit SeededChooser(std::uint64_t seed) : state_(seed) {}
    std::uint64_t below(std::uint64_t n) override;

  private:
    std::uint64_t state_;
};

// Which sizes and shapes of cache traces draw (kvcheck run --scope). A
// trace is small (small_percent of them): caches of at most
// WorkloadOptions::cache_layers_max layers of layer_tokens_max tokens, 2
// heads of 4, so that most failures are found and shrunk in a few short
// steps. The others are sized: a layer ceiling of cache_layers_max (half of
// them) or in [1, cache_layers_max], a token ceiling among the powers of
// two from 64 to layer_tokens_max (each
// layer then draws its count spread over the powers of two below it, and a
// power of two or a neighbour of one a quarter of the time: where chunked
// and pooled code paths switch), half of them another geometry (heads and
// head_dim powers of two up to heads_max and head_dim_max), the token
// ceiling lowered so that a slot holds at most slot_values_max values.
struct Scope {
    const char* name = "default";
    std::int64_t small_percent = 50;
    std::int64_t cache_layers_max = 8;
    std::int64_t layer_tokens_max = 512;
    std::int64_t heads_max = 8;
    std::int64_t head_dim_max = 32;
    std::int64_t slot_values_max = 8192;
    // The most items a fill adds at once (stores under load): fills draw
    // among 8, 16, 32, 64, 256 and 1024 items up to it (0: no fill).
    std::int64_t store_items_max = 64;
};

// "small" (every trace small, as the first version drew them; no fill),
// "default" (above; fills of up to 64 items), "large" (for nightly runs: 16
// layers, 2048 tokens, slots of up to 64 Ki values, fills of up to 1024
// items); throws std::invalid_argument for another name.
Scope scope_named(const std::string& name);
// The scope in one line, for the header of a run.
std::string describe_scope(const Scope& scope);

struct WorkloadOptions {
    std::size_t trace_ops_max = 24;
    std::int64_t cache_layers_max = 3;  // of a small trace (Scope)
    std::int64_t layer_tokens_max = 5;  // of a small trace (Scope)
    std::int64_t prompt_tokens_max = 3;
    std::int64_t new_tokens_max = 4;
    std::int64_t id_pool = 4;     // ids a..d: repeats and missing ids are common
    std::int64_t dump_slots = 2;
    Scope scope;
    Capabilities capabilities;   // what the engine supports: nothing else is generated
    // Draw dump_kill (three processes a step): kvcheck run draws it in
    // dump-safe's own search only, the one property it judges.
    bool dump_kill = true;
    // Clients (kvcheck run --lanes, kvcheck/lanes.h): above 1, each trace
    // is that many lanes of requests interleaved by a seeded schedule.
    std::int64_t lanes = 1;
    // With lanes: requests for the thread level (kvcheck/threads.h): a
    // paged pin request now and then forks its sequence and frees the child.
    // Off, the draw is the operation level's, unchanged.
    bool threads = false;
};

struct Swarm {
    std::array<std::uint8_t, op_kind_count> weights{};  // 0: switched off
    Dtype dtype = Dtype::f32;
    bool mixed_dtypes = false;  // each cache takes any dtype: merges then promote, or are refused
    bool modern = true;
    bool legacy = true;
    bool odd_layers = true;  // one-sided, legacy-named and uninitialized layers
    // The trace's geometry and the ceilings of its caches (Scope).
    std::int64_t heads = cache_heads;
    std::int64_t head_dim = cache_head_dim;
    std::int64_t layers_max = 3;
    std::int64_t tokens_max = 5;
};

// Throws std::invalid_argument when the capabilities cannot be searched
// (capabilities_fault).
Swarm random_swarm(Chooser& choose, const WorkloadOptions& options);
// Every kind on, equal weights, small caches: the swarm of a plain random run.
Swarm uniform_swarm(const WorkloadOptions& options);
Trace generate_trace(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options);
CacheSpec random_cache_spec(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options);

// The trace a seed stands for (a random swarm, then a trace from it): the
// same seed and options give the same trace on every machine.
Trace trace_for_seed(std::uint64_t seed, const WorkloadOptions& options);

}  // namespace kvcheck
