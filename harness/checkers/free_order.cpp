// free-order (paged): the free queue keeps the order the engine declares
// (Capabilities::paged_free_order). Across a paged operation the blocks
// that stay free keep their relative order, and the blocks it frees join
// the back (`back`, the model's), the front (`front`, LIFO), or the front
// when they have no key and the back when they have one (`front_unhashed`,
// vLLM's). With `lru` the queue is in the order of its blocks' last uses,
// least recent first (blocks used last by one operation in any order): a
// block is used by every successful alloc, append, fork, rewind or import
// after which the table of a sequence the operation names holds it (a free,
// a lookup, a step or an evict uses nothing); a reset forgets every use.
// An engine declaring `unspecified` (an eviction policy of its own) is not
// judged (kvcheck run reports the property skipped for it), nor is a reset
// (it may put the queue in any order: the reference sorts it).
//
// Checked: the free queue before and after each paged operation but reset.
// Not checked here: the order among the blocks one operation frees, and
// that the queue holds exactly the blocks at count 0 (free-iff-unreferenced).
#include "checkers/checker.h"

#include <algorithm>
#include <map>

namespace kvcheck::checkers {
namespace {

class FreeOrder final : public Checker {
  public:
    FreeOrder() : Checker(Property::free_order) {}

    void paged(const Paged& fact, Probe& probe) override {
        const PagedFreeOrder order = probe.capabilities().paged_free_order;
        if (order == PagedFreeOrder::unspecified || !checking(probe)) return;
        if (order == PagedFreeOrder::lru) {
            least_recent_first(fact, probe);
            return;
        }
        if (fact.by == PagedBy::reset) return;
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

    // lru: the blocks' last uses, this operation's included, never decrease
    // along the queue.
    void least_recent_first(const Paged& fact, Probe& probe) {
        if (fact.by == PagedBy::reset) {
            used_.clear();
            return;
        }
        const bool uses = fact.by == PagedBy::alloc || fact.by == PagedBy::append || fact.by == PagedBy::fork ||
                          fact.by == PagedBy::rewind || fact.by == PagedBy::import;
        const auto table = fact.after.tables.find(fact.seq);
        if (uses && !fact.refused && table != fact.after.tables.end()) {
            ++uses_;
            for (const std::int64_t block : table->second) used_[block] = uses_;
        }
        const std::vector<std::int64_t>& now = fact.after.free_queue;
        for (std::size_t i = 1; i < now.size(); ++i) {
            const std::uint64_t before = last_use(now[i - 1]);
            const std::uint64_t after = last_use(now[i]);
            if (!expect(probe, before <= after, [&] {
                    return fact.what + ": the free queue is " + tokens_text(now) + "; declared " + order_text(PagedFreeOrder::lru) +
                           ", block " + std::to_string(now[i - 1]) + ", used last by use " + std::to_string(before) +
                           ", is ahead of block " + std::to_string(now[i]) + ", used last by use " + std::to_string(after) +
                           " (uses count the allocs, appends, forks, rewinds and imports since the start or a reset; 0: none)";
                })) {
                return;
            }
        }
    }

    std::uint64_t last_use(std::int64_t block) const {
        const auto at = used_.find(block);
        return at == used_.end() ? 0 : at->second;
    }

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
            case PagedFreeOrder::lru: return "lru (the least recently used free block first)";
            case PagedFreeOrder::unspecified: break;
        }
        return "unspecified";
    }

    std::uint64_t uses_ = 0;                      // the operations that used blocks so far
    std::map<std::int64_t, std::uint64_t> used_;  // block -> the use that was its last
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::free_order>() {
    return std::make_unique<FreeOrder>();
}

}  // namespace kvcheck::checkers
