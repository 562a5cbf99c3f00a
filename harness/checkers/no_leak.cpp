// no-leak (paged): once no sequence is left and a step has run (no
// pending copy), every count is 0 and all N - 1 blocks are free.
//
// Checked: after each step that leaves no sequence.
// Not checked here: counts while sequences live (refcount-exact).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class NoLeak final : public Checker {
  public:
    NoLeak() : Checker(Property::no_leak) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (fact.by != PagedBy::step || !fact.after.tables.empty() || !checking(probe)) return;
        const PagedState& s = fact.after;
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
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::no_leak>() {
    return std::make_unique<NoLeak>();
}

}  // namespace kvcheck::checkers
