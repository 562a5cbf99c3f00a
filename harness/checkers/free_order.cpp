// free-order (paged): the free queue keeps the order the engine declares
// (Capabilities::paged_free_order). Across a paged operation the blocks
// that stay free keep their relative order, and the blocks it frees join
// the back (`back`, the model's), the front (`front`, LIFO), or the front
// when they have no key and the back when they have one (`front_unhashed`,
// vLLM's). An engine declaring `unspecified` (an eviction policy of its
// own, LRU say) is not judged (kvcheck run reports the property skipped
// for it), nor is a reset (it may put the queue in
// any order: the reference sorts it).
//
// Checked: the free queue before and after each paged operation but reset.
// Not checked here: the order among the blocks one operation frees, and
// that the queue holds exactly the blocks at count 0 (free-iff-unreferenced).
#include "checkers/checker.h"

#include <algorithm>

namespace kvcheck::checkers {
namespace {

class FreeOrder final : public Checker {
  public:
    FreeOrder() : Checker(Property::free_order) {}

    void paged(const Paged& fact, Probe& probe) override {
        const PagedFreeOrder order = probe.capabilities().paged_free_order;
        if (order == PagedFreeOrder::unspecified || fact.by == PagedBy::reset || !checking(probe)) return;
        const std::vector<std::int64_t>& was = fact.before.free_queue;
        const std::vector<std::int64_t>& now = fact.after.free_queue;
        const QueueMembers in_was(was, fact.before.blocks.size());
        const QueueMembers in_now(now, fact.after.blocks.size());
        std::vector<std::int64_t> stayed, front, back;
        for (const std::int64_t block : was) {
            if (in_now.holds(block)) stayed.push_back(block);
        }
        for (const std::int64_t block : now) {
            if (in_was.holds(block)) continue;
            (joins_front(order, fact.after, block) ? front : back).push_back(block);
        }
        // Where each freed block may be: the front's in any order, then the
        // blocks that stayed, in their order, then the back's in any order.
        const auto front_end = now.begin() + static_cast<std::ptrdiff_t>(std::min(front.size(), now.size()));
        const auto back_begin = now.end() - static_cast<std::ptrdiff_t>(std::min(back.size(), now.size()));
        const bool ok = now.size() == stayed.size() + front.size() + back.size() &&
                        std::is_permutation(now.begin(), front_end, front.begin(), front.end()) &&
                        std::equal(front_end, back_begin, stayed.begin(), stayed.end()) &&
                        std::is_permutation(back_begin, now.end(), back.begin(), back.end());
        expect(probe, ok, [&] {
            return fact.what + ": the free queue went from " + tokens_text(was) + " to " + tokens_text(now) + "; declared " +
                   order_text(order) + ", it would be " + tokens_text(front) + " then " + tokens_text(stayed) + " then " +
                   tokens_text(back) + " (the freed blocks at the " + (front.empty() ? "back" : back.empty() ? "front" : "front and back") +
                   ", the blocks that stayed free in their order)";
        });
    }

  private:
    // Whether a block is in a queue, in one look: a mark per block id of
    // the pool (a queue of a thousand blocks looked through for each of a
    // thousand was most of a checked operation's time at 1,024 blocks). An
    // id outside the pool (a queue no sound pool holds) is looked for in
    // the queue itself.
    class QueueMembers {
      public:
        QueueMembers(const std::vector<std::int64_t>& queue, std::size_t blocks) : queue_(queue), marks_(blocks, false) {
            for (const std::int64_t block : queue) {
                if (block >= 0 && static_cast<std::size_t>(block) < blocks) marks_[static_cast<std::size_t>(block)] = true;
            }
        }
        bool holds(std::int64_t block) const {
            if (block >= 0 && static_cast<std::size_t>(block) < marks_.size()) return marks_[static_cast<std::size_t>(block)];
            return std::find(queue_.begin(), queue_.end(), block) != queue_.end();
        }

      private:
        const std::vector<std::int64_t>& queue_;
        std::vector<bool> marks_;
    };

    static bool joins_front(PagedFreeOrder order, const PagedState& state, std::int64_t block) {
        if (order == PagedFreeOrder::front) return true;
        if (order != PagedFreeOrder::front_unhashed) return false;
        return block < 1 || block >= static_cast<std::int64_t>(state.blocks.size()) || !state.blocks[static_cast<std::size_t>(block)].keyed;
    }

    static std::string order_text(PagedFreeOrder order) {
        switch (order) {
            case PagedFreeOrder::back: return "back (freed blocks join the back)";
            case PagedFreeOrder::front: return "front (freed blocks join the front)";
            case PagedFreeOrder::front_unhashed: return "front-unhashed (a freed block without a key joins the front, one with a key the back)";
            case PagedFreeOrder::unspecified: break;
        }
        return "unspecified";
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::free_order>() {
    return std::make_unique<FreeOrder>();
}

}  // namespace kvcheck::checkers
