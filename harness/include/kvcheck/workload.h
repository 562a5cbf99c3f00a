// The workload: what to do next. Builds random traces from a stream of
// choices, so that RapidCheck (rc::gen), libFuzzer (the input bytes) and a
// plain seed all drive the same generator and produce the same vocabulary.
//
// Swarm testing: each trace first draws a Swarm (a weight per operation
// kind, some kinds switched off, one dtype, which layouts), then draws its
// operations from it; runs differ in what they stress, not only in order.
//
//   kvcheck::SeededChooser choose(42);
//   kvcheck::Swarm swarm = kvcheck::random_swarm(choose, options);
//   kvcheck::Trace trace = kvcheck::generate_trace(choose, swarm, options);
#pragma once

#include "kvcheck/engine.h"
#include "kvcheck/trace.h"

#include <array>
#include <cstdint>

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

struct WorkloadOptions {
    std::size_t trace_ops_max = 24;
    std::int64_t cache_layers_max = 3;
    std::int64_t layer_tokens_max = 5;
    std::int64_t prompt_tokens_max = 3;
    std::int64_t new_tokens_max = 4;
    std::int64_t id_pool = 4;     // ids a..d: repeats and missing ids are common
    std::int64_t dump_slots = 2;
    Capabilities capabilities;   // what the engine supports: nothing else is generated
};

struct Swarm {
    std::array<std::uint8_t, op_kind_count> weights{};  // 0: switched off
    Dtype dtype = Dtype::f32;
    bool modern = true;
    bool legacy = true;
    bool odd_layers = true;  // one-sided, legacy-named and uninitialized layers
};

Swarm random_swarm(Chooser& choose, const WorkloadOptions& options);
// Every kind on, equal weights: the swarm of a plain random run.
Swarm uniform_swarm(const WorkloadOptions& options);
Trace generate_trace(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options);
CacheSpec random_cache_spec(Chooser& choose, const Swarm& swarm, const WorkloadOptions& options);

// The trace a seed stands for (a random swarm, then a trace from it): the
// same seed and options give the same trace on every machine.
Trace trace_for_seed(std::uint64_t seed, const WorkloadOptions& options);

}  // namespace kvcheck
