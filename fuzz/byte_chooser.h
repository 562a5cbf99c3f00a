// The byte decoder: turns a fuzzer's input bytes into the harness's choices,
// so that `random_swarm` + `generate_trace` make a valid trace out of ANY
// input. One vocabulary with RapidCheck and the seeded runs: the fuzzer
// only decides what the workload chooses.
//
// Like libFuzzer's FuzzedDataProvider, each choice `below(n)` takes just
// enough bytes for n values (none for n == 1, one for n <= 256, ...), reads
// them big-endian and reduces them modulo n; unlike it, every choice reads
// from the front, so the bytes of a trace are in operation order and a
// mutation of byte i only changes choices from i on. When the bytes run out
// (or a choice needs more bytes than are left), every further choice comes
// from a SeededChooser seeded by a hash of the whole input: a short input
// stands for a full random trace, as a seed does, with its first choices
// fixed by its bytes. (Zeros instead made every short input the same plain
// trace, and libFuzzer took 10-30x more executions to reach a planted bug.)
//
// ChoiceRecorder is the inverse: it wraps another chooser and writes the
// bytes that make a ByteChooser repeat the same choices, so any seeded
// trace can become a byte seed.
//
//   kvcheck::fuzz::ByteChooser choose(data, size);
//   kvcheck::Swarm swarm = kvcheck::random_swarm(choose, options);
//   kvcheck::Trace trace = kvcheck::generate_trace(choose, swarm, options);
#pragma once

#include "kvcheck/workload.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcheck::fuzz {

class ByteChooser final : public Chooser {
  public:
    // Borrows `data`; it must outlive the chooser.
    ByteChooser(const std::uint8_t* data, std::size_t size);
    std::uint64_t below(std::uint64_t n) override;
    std::size_t bytes_used() const { return offset_; }
    // Choices made after the bytes ran out (drawn from the tail stream).
    std::size_t tail_choices() const { return tail_choices_; }

  private:
    const std::uint8_t* data_;
    std::size_t size_;
    std::size_t offset_ = 0;
    SeededChooser tail_;
    std::size_t tail_choices_ = 0;
};

// How many bytes a ByteChooser reads for below(n).
std::size_t bytes_for(std::uint64_t n);

class ChoiceRecorder final : public Chooser {
  public:
    explicit ChoiceRecorder(Chooser& source) : source_(source) {}
    std::uint64_t below(std::uint64_t n) override;
    const std::vector<std::uint8_t>& bytes() const { return bytes_; }

  private:
    Chooser& source_;
    std::vector<std::uint8_t> bytes_;
};

}  // namespace kvcheck::fuzz
