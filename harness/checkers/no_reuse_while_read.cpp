// no-reuse-while-read (paged): a block a pending copy reads is neither
// free nor taken again until the step ends the copy: it stays held
// (count at least one, out of the free queue), and its tokens and K/V stay
// as they were when the copy began.
//
// Checked: after each paged operation, every pending copy's source.
// Not checked here: the copy's content (cow-exact).
#include "checkers/checker.h"

#include <algorithm>

namespace kvcheck::checkers {
namespace {

class NoReuseWhileRead final : public Checker {
  public:
    NoReuseWhileRead() : Checker(Property::no_reuse_while_read) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        for (const PagedCopy& copy : fact.after.copies) {
            const PagedBlock* const after = block_in(fact.after, copy.source);
            if (after == nullptr) continue;  // refcount-exact's
            const PagedBlock& source = *after;
            if (!expect(probe, source.count >= 1 && !in_free_queue(fact.after, copy.source), [&] {
                    return "after " + fact.what + ": " + block_text(fact.after, copy.source) +
                           " is free while a pending copy into block " + std::to_string(copy.destination) + " reads it";
                })) {
                return;
            }
            const bool pending_before = std::find(fact.before.copies.begin(), fact.before.copies.end(), copy) != fact.before.copies.end();
            const PagedBlock* const before = block_in(fact.before, copy.source);
            if (!pending_before || before == nullptr) continue;
            const PagedBlock& was = *before;
            if (!expect(probe, source.tokens == was.tokens && source.digest == was.digest, [&] {
                    return fact.what + " rewrote " + block_text(fact.before, copy.source) + " while a pending copy into block " +
                           std::to_string(copy.destination) + " reads it: now " + block_text(fact.after, copy.source);
                })) {
                return;
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::no_reuse_while_read>() {
    return std::make_unique<NoReuseWhileRead>();
}

}  // namespace kvcheck::checkers
