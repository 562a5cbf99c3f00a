// free-iff-unreferenced (paged): after every paged operation, a block is in
// the free queue exactly when its count is 0, and at most once; the null
// block never is. So free blocks plus referenced blocks make N - 1.
//
// Checked: the pool as the engine reports it after each paged operation.
// Not checked here: whether the counts are right (refcount-exact).
#include "checkers/checker.h"

#include <optional>
#include <string>
#include <vector>

namespace kvcheck::checkers {

std::optional<std::string> free_queue_wrong(const PagedState& s) {
    // How many times each block is in the free queue: one pass, so that
    // the check grows with the pool, not with its square.
    std::vector<std::int64_t> in_queue(s.blocks.size(), 0);
    for (const std::int64_t block : s.free_queue) {
        if (block < 1 || block >= static_cast<std::int64_t>(s.blocks.size())) return "the free queue holds " + block_text(s, block);
        ++in_queue[static_cast<std::size_t>(block)];
    }
    for (std::size_t b = 1; b < s.blocks.size(); ++b) {
        const auto block = static_cast<std::int64_t>(b);
        const std::int64_t times = in_queue[b];
        const bool unreferenced = s.blocks[b].count == 0;
        if (times != (unreferenced ? 1 : 0)) {
            return block_text(s, block) + " is in the free queue " + std::to_string(times) + " times; expected " +
                   (unreferenced ? "once" : "never") + " (free queue " + tokens_text(s.free_queue) + ")";
        }
    }
    return std::nullopt;
}

namespace {

class FreeIffUnreferenced final : public Checker {
  public:
    FreeIffUnreferenced() : Checker(Property::free_iff_unreferenced) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        if (const std::optional<std::string> wrong = free_queue_wrong(fact.after)) fail(probe, "after " + fact.what + ": " + *wrong);
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::free_iff_unreferenced>() {
    return std::make_unique<FreeIffUnreferenced>();
}

}  // namespace kvcheck::checkers
