// op-atomic (paged): an alloc, append, fork or import the engine refused
// (it threw: the pool could not hold the result) changed nothing: the
// pool reads exactly as before it (every block's count, identity, tokens,
// written slots and K/V digest; the free queue in order; the index; every
// table; the pending copies).
//
// Checked: at the step of every refused paged operation.
// Not checked here: whether the refusal was needed (a pool may refuse
// early); what a successful operation did (the other paged properties).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

std::string state_difference(const PagedState& before, const PagedState& after) {
    for (std::size_t b = 0; b < before.blocks.size() && b < after.blocks.size(); ++b) {
        if (!(before.blocks[b] == after.blocks[b])) {
            return "before: " + block_text(before, static_cast<std::int64_t>(b)) + "; after: " +
                   block_text(after, static_cast<std::int64_t>(b));
        }
    }
    if (before.blocks.size() != after.blocks.size()) return "the pool's block count changed";
    if (before.free_queue != after.free_queue) return "the free queue changed from " + tokens_text(before.free_queue) + " to " + tokens_text(after.free_queue);
    if (before.tables != after.tables) return "the block tables changed (" + std::to_string(before.tables.size()) + " -> " + std::to_string(after.tables.size()) + " sequences)";
    if (before.tokens != after.tokens) return "a sequence's tokens changed";
    if (!(before.index == after.index)) return "the prefix index changed";
    if (!(before.copies == after.copies)) return "the pending copies changed";
    return "";
}

class OpAtomic final : public Checker {
  public:
    OpAtomic() : Checker(Property::op_atomic) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!fact.refused || !checking(probe)) return;
        const std::string difference = state_difference(fact.before, fact.after);
        expect(probe, difference.empty(), [&] {
            return fact.what + " was refused (" + *fact.refused + ") but changed the pool: " + difference;
        });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::op_atomic>() {
    return std::make_unique<OpAtomic>();
}

}  // namespace kvcheck::checkers
