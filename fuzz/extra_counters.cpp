#include "extra_counters.h"

#include <cstddef>

namespace kvcheck::fuzz {
namespace {

// The executor's state ids are below 19 kinds * 3 layouts * 4 buckets * 2 = 456.
constexpr std::size_t state_count_max = 512;
constexpr std::size_t pair_counters = 4096;
constexpr std::size_t outcome_counters = 1024;

struct Counters {
    std::uint8_t states[state_count_max];
    std::uint8_t pairs[pair_counters];
    std::uint8_t outcomes[outcome_counters];
};

// libFuzzer finds the section through the linker's __start_/__stop_ symbols.
__attribute__((section("__libfuzzer_extra_counters"), used)) Counters counters;

void bump(std::uint8_t& counter) {
    if (counter != 0xFF) ++counter;
}

std::uint64_t fnv1a(const std::string& text) {
    std::uint64_t hash = 0xcbf29ce484222325ull;
    for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ull;
    return hash;
}

}  // namespace

void count_states(const std::vector<std::uint16_t>& states) {
    std::size_t previous = state_count_max;  // "before the first step"
    for (std::uint16_t state : states) {
        const std::size_t id = state % state_count_max;
        bump(counters.states[id]);
        bump(counters.pairs[(previous * 1031 + id) % pair_counters]);
        previous = id;
    }
}

void count_outcome(const std::string& outcome) {
    std::string shape;
    bool quoted = false;
    for (char c : outcome) {
        if (c == '\'' || c == '"') {
            quoted = !quoted;
            continue;
        }
        if (quoted) continue;
        if (c >= '0' && c <= '9') {
            if (shape.empty() || shape.back() != '#') shape.push_back('#');
            continue;
        }
        shape.push_back(c);
    }
    bump(counters.outcomes[fnv1a(shape) % outcome_counters]);
}

}  // namespace kvcheck::fuzz
