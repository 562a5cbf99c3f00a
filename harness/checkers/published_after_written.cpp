// published-after-written (paged): a block is hittable (in the prefix
// index) only once every one of its B slots holds a token and is written:
// a request in the same step as the one computing a block never hits it
// unwritten.
//
// Checked: every indexed block, after each paged operation.
// Not checked here: what the written K/V are (prefix-hit-exact).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class PublishedAfterWritten final : public Checker {
  public:
    PublishedAfterWritten() : Checker(Property::published_after_written) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        const PagedState& s = fact.after;
        for (const PagedIndexEntry& entry : s.index) {
            for (const std::int64_t block : entry.blocks) {
                if (block < 1 || block >= static_cast<std::int64_t>(s.blocks.size())) continue;  // index-consistent's
                const PagedBlock& b = s.blocks[static_cast<std::size_t>(block)];
                const bool whole = b.written == s.block_tokens && static_cast<std::int64_t>(b.tokens.size()) == s.block_tokens;
                if (!expect(probe, whole, [&] {
                        return "after " + fact.what + ": " + block_text(s, block) + " is hittable with " +
                               std::to_string(b.written) + " of its " + std::to_string(s.block_tokens) + " slots written";
                    })) {
                    return;
                }
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::published_after_written>() {
    return std::make_unique<PublishedAfterWritten>();
}

}  // namespace kvcheck::checkers
