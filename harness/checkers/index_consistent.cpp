// index-consistent (paged): after every paged operation, every key of the
// prefix index maps only to blocks whose identity is that key and whose
// slots hold that key's tokens (no stale identity of a reused block, no
// superseded key), a block is indexed once, under its key, and a block
// with an identity is indexed. And a table's keyed blocks carry its
// request's keys: each was published by a request of the sequence's salt,
// under that salt's extra keys at its position, chaining from the key of
// the keyed block before it (as far as the engine's pools have shown what
// its keys mean: key_learning.h). So a hit across extra keys (a manager
// that leaves them out of its keys) is an inconsistent index as soon as a
// table holds it.
//
// Checked: the pool as the engine reports it after each paged operation.
// Not checked here: that an indexed block is fully written
// (published-after-written) or holds the right K/V (prefix-hit-exact).
#include "checkers/key_learning.h"

#include <map>

namespace kvcheck::checkers {
namespace {

class IndexConsistent final : public Checker {
  public:
    IndexConsistent() : Checker(Property::index_consistent) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        learnt_.see_sequence(fact);
        if (judge_index(fact, probe)) judge_tables(fact, probe);
        learnt_.learn(fact);
    }

  private:
    // Each table's keyed blocks carry the keys of its sequence's salt.
    void judge_tables(const Paged& fact, Probe& probe) const {
        const PagedState& s = fact.after;
        for (const auto& entry : s.tables) {
            const std::int64_t seq = entry.first;  // not a structured binding: the lambda below captures it
            const std::vector<std::int64_t>& table = entry.second;
            const std::optional<std::int64_t> salt = learnt_.salt_of(seq);
            if (!salt) continue;
            const PagedKey* previous = nullptr;
            for (std::size_t i = 0; i < table.size(); ++i) {
                const PagedBlock* block = block_in(s, table[i]);
                if (block == nullptr || !block->keyed) {
                    previous = nullptr;
                    continue;
                }
                const std::string why = foreign_key(learnt_, *salt, static_cast<std::int64_t>(i), block->key, previous);
                if (!expect(probe, why.empty(), [&] {
                        return "after " + fact.what + ": sequence " + std::to_string(seq) + " (salt " + std::to_string(*salt) +
                               ") holds " + block_text(s, table[i]) + " as its block " + std::to_string(i) + ": " + why;
                    })) {
                    return;
                }
                previous = &block->key;
            }
        }
    }

    // Every key maps to blocks of that identity, each indexed once; false
    // when it found otherwise.
    bool judge_index(const Paged& fact, Probe& probe) const {
        const PagedState& s = fact.after;
        std::map<std::int64_t, int> indexed;
        for (const PagedIndexEntry& entry : s.index) {
            for (const std::int64_t block : entry.blocks) {
                ++indexed[block];
                if (block < 1 || block >= static_cast<std::int64_t>(s.blocks.size())) {
                    fail(probe, "after " + fact.what + ": the key " + tokens_text(entry.key.tokens) + " maps to " + block_text(s, block));
                    return false;
                }
                const PagedBlock& b = s.blocks[static_cast<std::size_t>(block)];
                if (!expect(probe, b.keyed && b.key == entry.key && b.tokens == entry.key.tokens, [&] {
                        return "after " + fact.what + ": the key " + tokens_text(entry.key.tokens) +
                               (entry.key.extra.empty() ? "" : " +" + entry.key.extra) + " maps to " + block_text(s, block) +
                               (b.keyed ? (b.key == entry.key ? ", whose tokens are not the key's" : ", whose identity is another key")
                                        : ", which has no identity");
                    })) {
                    return false;
                }
            }
        }
        for (std::size_t b = 1; b < s.blocks.size(); ++b) {
            const auto block = static_cast<std::int64_t>(b);
            const int times = indexed.count(block) != 0 ? indexed[block] : 0;
            if (!expect(probe, times == (s.blocks[b].keyed ? 1 : 0), [&] {
                    return "after " + fact.what + ": " + block_text(s, block) + " is indexed " + std::to_string(times) + " times";
                })) {
                return false;
            }
        }
        return true;
    }

    KeyLearning learnt_;
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::index_consistent>() {
    return std::make_unique<IndexConsistent>();
}

}  // namespace kvcheck::checkers
