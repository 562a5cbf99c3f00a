// published-immutable (paged): a block that is published (has an
// identity) or shared (count above one) while a sequence holds it is never
// written: across any paged operation its tokens and K/V stay as they were.
// (A free block may be taken and rewritten: it is evicted first.)
//
// Checked: every block held and published or shared before a paged
// operation, against its tokens and K/V digest after it.
// Not checked here: where the write went instead (cow-exact).
#include "checkers/checker.h"

#include <algorithm>

namespace kvcheck::checkers {
namespace {

class PublishedImmutable final : public Checker {
  public:
    PublishedImmutable() : Checker(Property::published_immutable) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        const std::size_t blocks = std::min(fact.before.blocks.size(), fact.after.blocks.size());
        for (std::size_t b = 1; b < blocks; ++b) {
            const PagedBlock& was = fact.before.blocks[b];
            const PagedBlock& now = fact.after.blocks[b];
            if (was.count < 1 || (!was.keyed && was.count < 2)) continue;
            const auto block = static_cast<std::int64_t>(b);
            if (!expect(probe, now.tokens == was.tokens && now.digest == was.digest, [&] {
                    return fact.what + " wrote into " + std::string(was.keyed ? "published " : "shared ") +
                           block_text(fact.before, block) + ": after it, " + block_text(fact.after, block) +
                           (now.tokens == was.tokens ? ", its K/V changed" : "");
                })) {
                return;
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::published_immutable>() {
    return std::make_unique<PublishedImmutable>();
}

}  // namespace kvcheck::checkers
