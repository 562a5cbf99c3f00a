// hit-consumed (paged): the cached tokens an alloc reports are exactly the
// K/V it attached: its table starts with that many tokens' worth of blocks
// that were cached (published) under those tokens before it and still are
// after it (a hit touches, never evicts), each carrying the request's keys
// (published by a request of its salt, under that salt's extra keys at its
// position, chaining from the previous hit's key, as far as the engine's
// pools have shown what its keys mean: key_learning.h), the rest are
// blocks it took fresh, and the sequence's K/V, read through its table,
// equal the engine's model on all its tokens under its extra keys.
//
// Checked: at each successful alloc.
// Not checked here: the hit blocks' own content (prefix-hit-exact), K/V
// after appends (paged-roundtrip, at export).
#include "checkers/key_learning.h"

namespace kvcheck::checkers {
namespace {

class HitConsumed final : public Checker {
  public:
    HitConsumed() : Checker(Property::hit_consumed) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        if (fact.by == PagedBy::alloc && !fact.refused) judge(fact, probe);
        learnt_.learn(fact);
    }

  private:
    void judge(const Paged& fact, Probe& probe) const {
        const std::int64_t b = fact.before.block_tokens;
        const auto length = static_cast<std::int64_t>(fact.tokens.size());
        const auto table = fact.after.tables.find(fact.seq);
        if (b < 1 || table == fact.after.tables.end()) {
            fail(probe, fact.what + " succeeded but the pool has no table for sequence " + std::to_string(fact.seq));
            return;
        }
        const std::int64_t blocks = (length + b - 1) / b;
        if (!expect(probe, static_cast<std::int64_t>(table->second.size()) == blocks, [&] {
                return fact.what + ": the table holds " + std::to_string(table->second.size()) + " blocks for " +
                       std::to_string(length) + " tokens (" + std::to_string(blocks) + " due)";
            })) {
            return;
        }
        const PagedKey* previous = nullptr;  // the key of the hit before
        for (std::int64_t i = 0; i < blocks; ++i) {
            const std::int64_t block = table->second[static_cast<std::size_t>(i)];
            const PagedBlock* const before = block_in(fact.before, block);
            const PagedBlock* const after = block_in(fact.after, block);
            if (before == nullptr || after == nullptr) {
                previous = nullptr;
                continue;  // refcount-exact's
            }
            const PagedBlock& was = *before;
            const PagedBlock& now = *after;
            const bool hit = i * b < fact.cached;
            // A hit is a block cached under this block's tokens, and still
            // cached after the alloc (a hit touches its block, never evicts it).
            const bool whole = (i + 1) * b <= length;
            const Tokens want = hit && whole ? Tokens(fact.tokens.begin() + i * b, fact.tokens.begin() + (i + 1) * b) : Tokens{};
            const bool cached = whole && was.keyed && was.key.tokens == want && now.keyed && now.key == was.key;
            if (!expect(probe, hit ? cached : in_free_queue(fact.before, block), [&] {
                    return fact.what + " reported " + std::to_string(fact.cached) + " cached tokens; its block " + std::to_string(i) +
                           " was " + block_text(fact.before, block) + " before it and is " + block_text(fact.after, block) +
                           " after it: " + (hit ? "not the block cached for " + tokens_text(want) : "not free");
                })) {
                return;
            }
            if (!hit) continue;
            const std::string why = foreign_key(learnt_, fact.salt, i, was.key, previous);
            if (!expect(probe, why.empty(), [&] {
                    return fact.what + " reported " + std::to_string(fact.cached) + " cached tokens; its block " + std::to_string(i) +
                           " is the hit " + block_text(fact.before, block) + ": " + why;
                })) {
                return;
            }
            previous = &was.key;
        }
        PagedEngine& paged = *probe.engine().paged();
        // With a window only the blocks inside it are read (the others may be the null block).
        const std::string difference =
            fact.after.window > 0 ? window_difference(paged, fact.after, fact.seq, fact.tokens, fact.salt)
                                  : view_difference(paged.paged_sequence_view(fact.seq), paged.paged_fresh_view(fact.tokens, fact.salt, 0, length));
        expect(probe, difference.empty(), [&] {
            return fact.what + " reported " + std::to_string(fact.cached) +
                   " cached tokens; the sequence's K/V are not the model's on its tokens: " + difference;
        });
    }

    KeyLearning learnt_;
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::hit_consumed>() {
    return std::make_unique<HitConsumed>();
}

}  // namespace kvcheck::checkers
