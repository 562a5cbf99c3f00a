// Limits on what comes from outside kvcheck: the geometry a trace file may
// ask for, and how much of an engine's text a failure keeps. One home, read
// by the commands that read trace files, the workload (the largest scope
// draws up to the same geometry), the run's verdicts and the reports.
//
//   if (tokens > kvcheck::spec_layer_tokens_max) refuse();
//   failure.message = kvcheck::cut_text(engine_text);   // at most 8 KiB
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvcheck {

// The most layers, tokens in a layer and values in one slot (heads x
// head_dim x tokens) a spec may carry: the ceilings of the largest scope
// traces are generated in (Scope "large"), so that a hand-written trace is
// refused where it asks for more (spec_over_limits; 4,096 layers of 10^6 tokens made the
// reference allocate until it was stopped as hung), and a wider slot
// only for the widest geometry (256x1024) holding a few tokens.
inline constexpr std::int64_t spec_layers_max = 16;
inline constexpr std::int64_t spec_layer_tokens_max = 2048;
inline constexpr std::int64_t spec_slot_values_max = std::int64_t{1} << 20;

struct CacheSpec;
// Why `spec` asks for more than these limits ("layer 0 holds 1000000
// tokens, more than 2048 ..."), or "" when it does not. The text format
// carries any spec; kvcheck refuses a trace file holding such a one before
// it runs (kvcheck replay, shrink).
std::string spec_over_limits(const CacheSpec& spec);

// The most bytes of a failure's message (and of each of its `also`)
// kept: a message quotes what an engine said, and an engine may say
// megabytes (a 4 MiB exception text made a 109 MB JSON report). A longer
// one is cut by cut_text, with a note of the bytes left out; every report
// format carries at most this much of it.
constexpr std::size_t failure_message_bytes_max = 8192;

// `text` when it holds at most `bytes_max` bytes; else its first bytes (a
// UTF-8 sequence is not split) and " ... (N more bytes cut: kvcheck keeps
// at most <bytes_max> bytes of such text)".
std::string cut_text(const std::string& text, std::size_t bytes_max = failure_message_bytes_max);

}  // namespace kvcheck
