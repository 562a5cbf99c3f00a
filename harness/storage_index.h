// The executor's storage index. Internal to the harness.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck {

// The storage index: which stored entries hold each storage identity, as
// (identity, entry) pairs in one open-addressing table (linear probing,
// deletion by backward shift). Indexing an entry or letting go of it takes
// no allocation per identity; a node-based map allocated and freed one node
// per identity, ten per small entry, and was most of (re)indexing one.
// Entries are named by the address of their key in the run's readings (an
// entry is removed from the index before its reading is erased).
class StorageIndex {
  public:
    void add(std::uint64_t identity, const std::string* entry) {
        if ((used_ + 1) * 4 > slots_.size() * 3) grow();
        std::size_t at = home(identity);
        while (slots_[at].entry != nullptr) at = (at + 1) & mask_;
        slots_[at] = {identity, entry};
        ++used_;
    }

    // Every pair (identity, entry).
    void remove(std::uint64_t identity, const std::string* entry) {
        if (used_ == 0) return;
        std::size_t at = home(identity);
        while (slots_[at].entry != nullptr) {
            if (slots_[at].identity == identity && slots_[at].entry == entry) {
                erase_at(at);  // the next pair moved into `at`, if any: look at it again
            } else {
                at = (at + 1) & mask_;
            }
        }
    }

    template <typename F>
    void for_each_holder(std::uint64_t identity, F&& f) const {
        if (used_ == 0) return;
        for (std::size_t at = home(identity); slots_[at].entry != nullptr; at = (at + 1) & mask_) {
            if (slots_[at].identity == identity) f(*slots_[at].entry);
        }
    }

    void clear() {
        std::fill(slots_.begin(), slots_.end(), Slot{});
        used_ = 0;
    }

  private:
    struct Slot {
        std::uint64_t identity = 0;
        const std::string* entry = nullptr;  // null: free
    };

    // Fibonacci hashing: identities are addresses, their low bits zero.
    std::size_t home(std::uint64_t identity) const {
        return static_cast<std::size_t>((identity * 0x9E3779B97F4A7C15ull) >> shift_);
    }

    void erase_at(std::size_t hole) {
        slots_[hole] = Slot{};
        --used_;
        // Pull back every later pair of the run that probing from its home
        // would no longer reach past the hole.
        for (std::size_t at = (hole + 1) & mask_; slots_[at].entry != nullptr; at = (at + 1) & mask_) {
            const std::size_t want = home(slots_[at].identity);
            const bool reachable = hole <= at ? (want > hole && want <= at) : (want > hole || want <= at);
            if (reachable) continue;
            slots_[hole] = slots_[at];
            slots_[at] = Slot{};
            hole = at;
        }
    }

    void grow() {
        std::vector<Slot> old = std::move(slots_);
        const std::size_t size = old.empty() ? 1024 : old.size() * 2;
        slots_.assign(size, Slot{});
        mask_ = size - 1;
        shift_ = 64;
        for (std::size_t n = size; n > 1; n >>= 1) --shift_;
        used_ = 0;
        for (const Slot& slot : old) {
            if (slot.entry != nullptr) add(slot.identity, slot.entry);
        }
    }

    std::vector<Slot> slots_;
    std::size_t used_ = 0;
    std::size_t mask_ = 0;
    unsigned shift_ = 64;
};

}  // namespace kvcheck
