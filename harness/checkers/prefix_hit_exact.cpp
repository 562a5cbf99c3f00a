// prefix-hit-exact (paged): the cached tokens an alloc or a lookup reports
// end on a block boundary before the last token; each block an alloc hit
// holds exactly that block's tokens, and its K/V equal, bit for bit, the
// engine's model on the request's tokens computed afresh (positions of
// that block), whatever the request's extra keys.
//
// Checked: at each alloc (the blocks its table starts with) and lookup.
// Not checked here: whether the hit blocks were the cached ones
// (hit-consumed), the rest of the sequence (hit-consumed).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class PrefixHitExact final : public Checker {
  public:
    PrefixHitExact() : Checker(Property::prefix_hit_exact) {}

    void paged(const Paged& fact, Probe& probe) override {
        if ((fact.by != PagedBy::alloc && fact.by != PagedBy::lookup) || fact.refused || !checking(probe)) return;
        const std::int64_t b = fact.before.block_tokens;
        const auto length = static_cast<std::int64_t>(fact.tokens.size());
        if (!expect(probe, b > 0 && fact.cached >= 0 && fact.cached % b == 0 && fact.cached < length, [&] {
                return fact.what + " reported " + std::to_string(fact.cached) + " cached tokens of " + std::to_string(length) +
                       ": a hit ends on a block boundary (" + std::to_string(b) + " tokens) before the last token";
            })) {
            return;
        }
        if (fact.by != PagedBy::alloc) return;
        const auto table = fact.after.tables.find(fact.seq);
        if (!expect(probe, table != fact.after.tables.end() && static_cast<std::int64_t>(table->second.size()) * b >= fact.cached,
                    [&] { return fact.what + " reported " + std::to_string(fact.cached) + " cached tokens, but its table holds fewer blocks"; })) {
            return;
        }
        PagedEngine& paged = *probe.engine().paged();
        for (std::int64_t i = 0; i * b < fact.cached; ++i) {
            const std::int64_t block = table->second[static_cast<std::size_t>(i)];
            const PagedBlock* const after = block_in(fact.after, block);
            if (after == nullptr) continue;  // refcount-exact's
            const Tokens want(fact.tokens.begin() + i * b, fact.tokens.begin() + (i + 1) * b);
            const PagedBlock& hit = *after;
            if (!expect(probe, hit.tokens == want, [&] {
                    return fact.what + " hit " + block_text(fact.after, block) + " for the tokens " + tokens_text(want);
                })) {
                return;
            }
            const std::string difference = view_difference(paged.paged_block_view(block, b), paged.paged_fresh_view(fact.tokens, fact.salt, i * b, b));
            if (!expect(probe, difference.empty(), [&] {
                    return fact.what + " hit " + block_text(fact.after, block) + ", whose K/V are not the model's on " +
                           tokens_text(want) + " at positions " + std::to_string(i * b) + ".." + std::to_string((i + 1) * b - 1) + ": " + difference;
                })) {
                return;
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::prefix_hit_exact>() {
    return std::make_unique<PrefixHitExact>();
}

}  // namespace kvcheck::checkers
