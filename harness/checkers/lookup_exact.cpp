// lookup-exact (paged): the cached tokens a lookup reports, and those an
// alloc reports, are the longest chain of the request's full blocks
// (ending before its last token) that the prefix index held before the
// operation: block i's key is (the identity of block i - 1's key, 0 for
// the first; the block's B tokens; the request's extra keys), and each key
// maps to at least one block. So a lookup that stops short (always 0, a
// cached free block not counted) or counts past a miss is caught, and an
// alloc that hits less than it could.
//
// A key's parent is an opaque number (the engine's chain hash), and a
// salt's extra keys are the engine's own string: neither is computed
// here. They are learnt from the pool as the engine reports it after each
// paged operation (key_learning.h). What is not learnt (or learnt two
// ways: a buggy engine) is not assumed, so the check is one-sided there: the reported chain must be possible (each of
// its blocks' tokens indexed under keys that may be its own) and at least
// as long as the part of the chain known to be indexed.
//
// Checked: at each lookup and successful alloc, against the index before it.
// Not checked here: that the hit blocks hold the model's K/V
// (prefix-hit-exact) or are the ones attached (hit-consumed).
#include "checkers/key_learning.h"

#include <optional>

namespace kvcheck::checkers {
namespace {

class LookupExact final : public Checker {
  public:
    LookupExact() : Checker(Property::lookup_exact) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        if ((fact.by == PagedBy::lookup || fact.by == PagedBy::alloc) && !fact.refused) judge(fact, probe);
        learnt_.learn(fact);
    }

  private:
    // The bounds of the chain a request may hit, in blocks.
    struct Chain {
        std::int64_t known = 0;     // its first `known` blocks are indexed, for certain
        std::int64_t possible = 0;  // no more than `possible` blocks can be
    };

    void judge(const Paged& fact, Probe& probe) const {
        const std::int64_t b = fact.before.block_tokens;
        const auto length = static_cast<std::int64_t>(fact.tokens.size());
        if (b < 1 || fact.cached < 0 || fact.cached % b != 0 || fact.cached >= length) return;  // prefix-hit-exact's
        const Chain chain = chain_of(fact.before, fact.tokens, fact.salt);
        const std::int64_t hit = fact.cached / b;
        expect(probe, chain.known <= hit && hit <= chain.possible, [&] {
            const bool short_of = hit < chain.known;
            return fact.what + " reported " + std::to_string(fact.cached) + " cached tokens; the index before it " +
                   (short_of ? "held the chain of its first " + std::to_string(chain.known * b) + " tokens"
                             : "held no chain past its first " + std::to_string(chain.possible * b) + " tokens") +
                   " (" + chain_text(fact.before, fact.tokens, short_of ? chain.known : chain.possible + 1) + ")";
        });
    }

    // Walks the request's blocks through the index.
    Chain chain_of(const PagedState& state, const Tokens& tokens, std::int64_t salt) const {
        const std::int64_t b = state.block_tokens;
        const auto hittable = static_cast<std::int64_t>((tokens.size() - 1) / static_cast<std::size_t>(b));
        Chain chain;
        std::optional<std::uint64_t> parent = 0;
        bool certain = true;
        for (std::int64_t i = 0; i < hittable; ++i) {
            const Tokens chunk(tokens.begin() + i * b, tokens.begin() + (i + 1) * b);
            const std::optional<std::string> extra = learnt_.extra(salt, i);
            std::optional<PagedKey> found;  // the one key it may be, when parent and extra are known
            bool may = false;
            for (const PagedIndexEntry& entry : state.index) {
                if (entry.blocks.empty() || entry.key.tokens != chunk) continue;
                if ((extra && entry.key.extra != *extra) || (parent && entry.key.parent != *parent)) continue;
                may = true;
                if (extra && parent) found = entry.key;
            }
            if (!may) break;
            chain.possible = i + 1;
            certain = certain && found.has_value();
            if (certain) chain.known = i + 1;
            parent = found ? learnt_.identity(*found) : std::nullopt;
        }
        return chain;
    }

    // What the index holds for each of the request's first `blocks` blocks.
    static std::string chain_text(const PagedState& state, const Tokens& tokens, std::int64_t blocks) {
        const std::int64_t b = state.block_tokens;
        std::string text;
        for (std::int64_t i = 0; i < blocks && (i + 1) * b < static_cast<std::int64_t>(tokens.size()); ++i) {
            const Tokens chunk(tokens.begin() + i * b, tokens.begin() + (i + 1) * b);
            std::size_t keys = 0;
            for (const PagedIndexEntry& entry : state.index) keys += !entry.blocks.empty() && entry.key.tokens == chunk ? 1 : 0;
            text += (i == 0 ? "" : "; ") + tokens_text(chunk) + ": " + std::to_string(keys) + " keys indexed";
        }
        return text;
    }

    KeyLearning learnt_;
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::lookup_exact>() {
    return std::make_unique<LookupExact>();
}

}  // namespace kvcheck::checkers
