// The executor's storage index. Internal to the harness.
#pragma once

#include "probe_table.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck {

// The storage index: which stored entries hold each storage identity, as
// (identity, entry) pairs in one open-addressing table (linear probing,
// deletion by backward shift). Indexing an entry or letting go of it takes
// no allocation per identity, where a node-based map would allocate and
// free one node per identity (ten per small entry).
// Entries are named by the address of their key in the run's readings (an
// entry is removed from the index before its reading is erased).
class StorageIndex {
  public:
    void add(std::uint64_t identity, const std::string* entry) {
        if ((used_ + 1) * 4 > slots_.size() * 3) grow();
        std::size_t at = homes_.of(identity);
        while (slots_[at].entry != nullptr) at = homes_.next(at);
        slots_[at] = {identity, entry};
        ++used_;
    }

    // Every pair (identity, entry).
    void remove(std::uint64_t identity, const std::string* entry) {
        if (used_ == 0) return;
        std::size_t at = homes_.of(identity);
        while (slots_[at].entry != nullptr) {
            if (slots_[at].identity == identity && slots_[at].entry == entry) {
                erase_at(at);  // the next pair moved into `at`, if any: look at it again
            } else {
                at = homes_.next(at);
            }
        }
    }

    template <typename F>
    void for_each_holder(std::uint64_t identity, F&& f) const {
        if (used_ == 0) return;
        for (std::size_t at = homes_.of(identity); slots_[at].entry != nullptr; at = homes_.next(at)) {
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

    void erase_at(std::size_t hole) {
        erase_by_backward_shift(
            slots_, hole, homes_, [](const Slot& slot) { return slot.entry == nullptr; },
            [](const Slot& slot) { return slot.identity; });
        --used_;
    }

    void grow() {
        std::vector<Slot> old = std::move(slots_);
        const std::size_t size = old.empty() ? 1024 : old.size() * 2;
        slots_.assign(size, Slot{});
        homes_.resize(size);  // identities are addresses, their low bits zero
        used_ = 0;
        for (const Slot& slot : old) {
            if (slot.entry != nullptr) add(slot.identity, slot.entry);
        }
    }

    std::vector<Slot> slots_;
    std::size_t used_ = 0;
    ProbeHomes homes_;
};

}  // namespace kvcheck
