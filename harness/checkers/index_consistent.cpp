// index-consistent (paged): after every paged operation, every key of the
// prefix index maps only to blocks whose identity is that key and whose
// slots hold that key's tokens (no stale identity of a reused block, no
// superseded key), a block is indexed once, under its key, and a block
// with an identity is indexed.
//
// Checked: the pool as the engine reports it after each paged operation.
// Not checked here: that an indexed block is fully written
// (published-after-written) or holds the right K/V (prefix-hit-exact).
#include "checkers/checker.h"

#include <map>

namespace kvcheck::checkers {
namespace {

class IndexConsistent final : public Checker {
  public:
    IndexConsistent() : Checker(Property::index_consistent) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        const PagedState& s = fact.after;
        std::map<std::int64_t, int> indexed;
        for (const PagedIndexEntry& entry : s.index) {
            for (const std::int64_t block : entry.blocks) {
                ++indexed[block];
                if (block < 1 || block >= static_cast<std::int64_t>(s.blocks.size())) {
                    fail(probe, "after " + fact.what + ": the key " + tokens_text(entry.key.tokens) + " maps to " + block_text(s, block));
                    return;
                }
                const PagedBlock& b = s.blocks[static_cast<std::size_t>(block)];
                if (!expect(probe, b.keyed && b.key == entry.key && b.tokens == entry.key.tokens, [&] {
                        return "after " + fact.what + ": the key " + tokens_text(entry.key.tokens) +
                               (entry.key.extra.empty() ? "" : " +" + entry.key.extra) + " maps to " + block_text(s, block) +
                               (b.keyed ? (b.key == entry.key ? ", whose tokens are not the key's" : ", whose identity is another key")
                                        : ", which has no identity");
                    })) {
                    return;
                }
            }
        }
        for (std::size_t b = 1; b < s.blocks.size(); ++b) {
            const auto block = static_cast<std::int64_t>(b);
            const int times = indexed.count(block) != 0 ? indexed[block] : 0;
            if (!expect(probe, times == (s.blocks[b].keyed ? 1 : 0), [&] {
                    return "after " + fact.what + ": " + block_text(s, block) + " is indexed " + std::to_string(times) + " times";
                })) {
                return;
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::index_consistent>() {
    return std::make_unique<IndexConsistent>();
}

}  // namespace kvcheck::checkers
