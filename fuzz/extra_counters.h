// Extra coverage for libFuzzer: the harness's own model state, fed back as
// counters in the `__libfuzzer_extra_counters` section, which libFuzzer
// reads after every input like its own edge counters. A new state (op kind
// x layout x store-size bucket x owned), a new pair of consecutive states,
// or a state hit more often counts as new coverage, so the fuzzer keeps
// inputs that reach new model states, not only new code lines.
//
// The counters are cleared by libFuzzer before each input; engines other
// than libFuzzer (AFL++, honggfuzz) ignore the section.
//
//   kvcheck::fuzz::count_states(result.coverage.states);
//   kvcheck::fuzz::count_outcome("corrupt dump: zip record # fails its CRC-# check");
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck::fuzz {

// State ids and pairs of consecutive ids (hashed into a fixed table).
void count_states(const std::vector<std::uint16_t>& states);

// An outcome class, e.g. the kind of a load error: its text, digits and
// quoted names removed, is hashed into its own table, so that each way of
// being rejected is a feature (code inside libtorch is not instrumented).
void count_outcome(const std::string& outcome);

}  // namespace kvcheck::fuzz
