// splitmix64 (Steele, Lea and Flood, 2014): the one seeded source of every
// value kvcheck derives from a seed (cache content, content hashes, the
// workload's choices, the models' weights). Its output depends on nothing
// but its input: not the platform, the compiler or a library version.
//
//   std::uint64_t h = kvcheck::splitmix64(seed);   // one hash step
//   kvcheck::SplitMix64 stream(seed);               // a stream: stream.next(), ...
#pragma once

#include <cstdint>

namespace kvcheck {

inline constexpr std::uint64_t splitmix64_increment = 0x9E3779B97F4A7C15ull;

// The finalizer of x + increment: a fixed, well-mixed hash step.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
    x += splitmix64_increment;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// The stream: the n-th value is splitmix64(seed + n * increment).
class SplitMix64 {
  public:
    explicit constexpr SplitMix64(std::uint64_t seed) : state_(seed) {}
    constexpr std::uint64_t next() {
        const std::uint64_t value = splitmix64(state_);
        state_ += splitmix64_increment;
        return value;
    }

  private:
    std::uint64_t state_;
};

}  // namespace kvcheck
