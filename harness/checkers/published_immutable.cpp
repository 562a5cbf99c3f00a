// published-immutable (paged): a block that is published (has an
// identity) or shared (count above one) while a sequence holds it is never
// written: across any paged operation its tokens and K/V stay as they were.
// And the filled slots of any block a table holds stay as they were: a
// write only fills the slots after them (so a copy whose K/V are its
// source's storage, changed when the source is taken again, is caught).
// (A free block may be taken and rewritten: it is evicted first. A rewind
// may cut the last block it keeps, held alone, to the slots it keeps: its
// tokens then are a prefix of what they were, and it has no identity. And
// a rewind releases the blocks it empties before it copies its shared
// last block: one of them, held by nothing else, may be free in between
// and come back as the copy's target - a new block, as with a LIFO free
// list, where the block freed last is taken first.)
//
// Checked: every block held and published or shared before a paged
// operation, against its tokens and K/V digest after it; every other block
// a table holds before and after it, its filled slots (their digest, or
// the engine's view of them when the block gained slots); neither for a
// block a rewind released and took back as its copy's target.
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
            const auto block = static_cast<std::int64_t>(b);
            if (retaken_by_rewind(fact, block) || retaken_behind_window(fact, block)) continue;
            if (cut_by_rewind(fact, block)) {
                const bool cut = now.tokens.size() < was.tokens.size() &&
                                 std::equal(now.tokens.begin(), now.tokens.end(), was.tokens.begin()) && !now.keyed;
                if (!expect(probe, cut, [&] {
                        return fact.what + " cut " + block_text(fact.before, block) + " to " + block_text(fact.after, block) +
                               ": a rewound block keeps a prefix of its tokens and loses its identity";
                    })) {
                    return;
                }
                continue;
            }
            if (was.count >= 1 && (was.keyed || was.count >= 2)) {
                if (!expect(probe, now.tokens == was.tokens && now.digest == was.digest, [&] {
                        return fact.what + " wrote into " + std::string(was.keyed ? "published " : "shared ") +
                               block_text(fact.before, block) + ": after it, " + block_text(fact.after, block) +
                               (now.tokens == was.tokens ? ", its K/V changed" : "");
                    })) {
                    return;
                }
                continue;
            }
            if (!kept_filled_slots(fact, probe, block)) return;
        }
    }

  private:
    // A block a table holds before and after the operation keeps its
    // filled slots (tokens and K/V): only slots after them are written.
    bool kept_filled_slots(const Paged& fact, Probe& probe, std::int64_t block) {
        const PagedBlock& was = fact.before.blocks[static_cast<std::size_t>(block)];
        const PagedBlock& now = fact.after.blocks[static_cast<std::size_t>(block)];
        if (was.tokens.empty() || tables_holding(fact.before, block) < 1 || tables_holding(fact.after, block) < 1) return true;
        const bool prefix = now.tokens.size() >= was.tokens.size() && std::equal(was.tokens.begin(), was.tokens.end(), now.tokens.begin());
        std::uint64_t digest = now.digest;
        if (prefix && now.tokens.size() > was.tokens.size()) {
            digest = view_digest(probe.engine().paged()->paged_block_view(block, static_cast<std::int64_t>(was.tokens.size())));
        }
        return expect(probe, prefix && digest == was.digest, [&] {
            return fact.what + " rewrote the filled slots of " + block_text(fact.before, block) +
                   ", which a block table holds: after it, " + block_text(fact.after, block) + (prefix ? ", its K/V changed" : "");
        });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::published_immutable>() {
    return std::make_unique<PublishedImmutable>();
}

}  // namespace kvcheck::checkers
