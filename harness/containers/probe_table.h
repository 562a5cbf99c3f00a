// Linear probing over a power-of-two table, shared by the storage index and
// the id map: where a key's probe run starts, and deletion by backward
// shift. Internal to the harness.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcheck {

// Where each key's probe run starts in a table of a power-of-two size:
// Fibonacci hashing (the high bits of key * 2^64 / phi), which spreads keys
// alike in their low bits (addresses, hashes of similar ids).
class ProbeHomes {
  public:
    void resize(std::size_t slots) {  // a power of two, at least 2
        mask_ = slots - 1;
        shift_ = 64;
        for (std::size_t n = slots; n > 1; n >>= 1) --shift_;
    }
    std::size_t of(std::uint64_t key) const { return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
    std::size_t next(std::size_t at) const { return (at + 1) & mask_; }

  private:
    std::size_t mask_ = 0;
    unsigned shift_ = 63;
};

// Empties slot `hole`, then pulls back every later slot of its run that
// probing from its home would no longer reach past the hole, so that every
// key stays reachable with no tombstone. `is_free(slot)` tells an empty
// slot; `key_of(slot)` the key its home is computed from.
template <typename Slot, typename IsFree, typename KeyOf>
void erase_by_backward_shift(std::vector<Slot>& slots, std::size_t hole, const ProbeHomes& homes, IsFree&& is_free,
                             KeyOf&& key_of) {
    slots[hole] = Slot{};
    for (std::size_t at = homes.next(hole); !is_free(slots[at]); at = homes.next(at)) {
        const std::size_t want = homes.of(key_of(slots[at]));
        const bool reachable = hole <= at ? (want > hole && want <= at) : (want > hole || want <= at);
        if (reachable) continue;
        slots[hole] = slots[at];
        slots[at] = Slot{};
        hole = at;
    }
}

}  // namespace kvcheck
