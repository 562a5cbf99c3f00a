// no-leak (paged): once the trace has ended every sequence it made and no
// copy is pending (after a step, or after the free of the last sequence
// when no copy is pending), the pool holds no block table, every count is
// 0 and all N - 1 blocks are free. The sequences alive are the trace's
// (each alloc, fork or import the engine took, until its free), not the
// pool's: a table the pool keeps for a sequence the trace ended is a leak.
//
// Checked: after each step that leaves no sequence alive, and each free
// that leaves none alive and no pending copy.
// Not checked here: counts while sequences live (refcount-exact).
#include "checkers/checker.h"

#include <set>

namespace kvcheck::checkers {
namespace {

class NoLeak final : public Checker {
  public:
    NoLeak() : Checker(Property::no_leak) {}

    void paged(const Paged& fact, Probe& probe) override {
        const bool made = fact.by == PagedBy::alloc || fact.by == PagedBy::fork || fact.by == PagedBy::import;
        if (made && !fact.refused) alive_.insert(fact.seq);
        if (fact.by == PagedBy::free) alive_.erase(fact.seq);
        const bool emptied = fact.by == PagedBy::step || (fact.by == PagedBy::free && fact.after.copies.empty());
        if (!emptied || !alive_.empty() || !checking(probe)) return;
        const PagedState& s = fact.after;
        if (!expect(probe, s.tables.empty(), [&] {
                return "no sequence is left after " + fact.what + ", but the pool still holds a block table for sequence " +
                       std::to_string(s.tables.begin()->first) + ": " + tokens_text(s.tables.begin()->second);
            })) {
            return;
        }
        for (std::size_t b = 0; b < s.blocks.size(); ++b) {
            if (!expect(probe, s.blocks[b].count == 0, [&] {
                    return "no sequence is left after " + fact.what + ", but " + block_text(s, static_cast<std::int64_t>(b)) +
                           " is still referenced";
                })) {
                return;
            }
        }
        expect(probe, static_cast<std::int64_t>(s.free_queue.size()) == fact.blocks - 1, [&] {
            return "no sequence is left after " + fact.what + ", but " + std::to_string(s.free_queue.size()) + " of " +
                   std::to_string(fact.blocks - 1) + " blocks are free";
        });
    }

  private:
    std::set<std::int64_t> alive_;  // the trace's sequences, as the engine took them
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::no_leak>() {
    return std::make_unique<NoLeak>();
}

}  // namespace kvcheck::checkers
