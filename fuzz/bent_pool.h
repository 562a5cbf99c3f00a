// A paged engine that reports pool states no sound pool holds: the paged
// reference whose paged_state() is bent, at each call, the way the next
// byte of its plan says (the plan used in turn; 0 leaves it as it is):
//   1 the pool cut short (the blocks tables and copies name may be gone)
//   2 the pool grown          3 no blocks at all
//   4 a table naming blocks past the pool and below 1
//   5 a pending copy from and into blocks that are not there
//   6 a free queue and an index naming blocks that are not there
//   7 another block size
// For fuzz_paged_states and properties/paged_states_test.cpp: whatever an
// engine reports, the paged checkers read each state within its own bounds.
#pragma once

#include "reference/paged_reference.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvcheck::fuzz {

class BentPool final : public adapters::PagedReference {
  public:
    explicit BentPool(std::vector<std::uint8_t> plan) : plan_(std::move(plan)) {}
    static constexpr int ways = 8;  // how % ways picks one

    PagedState paged_state() override {
        PagedState state = PagedReference::paged_state();
        const std::uint8_t how = plan_.empty() ? 0 : plan_[calls_++ % plan_.size()];
        const auto size = static_cast<std::int64_t>(state.blocks.size());
        switch (how % ways) {
            case 0:  // as it is
                break;
            case 1:  // cut short: the blocks the tables and copies name may be gone
                state.blocks.resize(state.blocks.size() / 2);
                break;
            case 2:  // grown
                state.blocks.resize(state.blocks.size() * 2 + 1);
                break;
            case 3:  // no blocks at all
                state.blocks.clear();
                break;
            case 4:  // a table naming blocks past the pool and below 1
                for (auto& table : state.tables) {
                    table.second.push_back(size + how);
                    table.second.insert(table.second.begin(), -1 - how);
                }
                break;
            case 5:  // a pending copy from and into blocks that are not there
                state.copies.push_back({size + how, -how});
                state.copies.push_back({-1, size});
                break;
            case 6:  // a free queue and an index naming blocks that are not there
                state.free_queue.push_back(size + 1);
                for (PagedIndexEntry& entry : state.index) entry.blocks.push_back(size + how);
                break;
            default:  // another block size
                state.block_tokens = how % 3;
                break;
        }
        return state;
    }

  private:
    std::vector<std::uint8_t> plan_;
    std::size_t calls_ = 0;
};

}  // namespace kvcheck::fuzz
