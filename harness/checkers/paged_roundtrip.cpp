// paged-roundtrip (paged): an export is a contiguous cache of exactly the
// sequence's K/V - for a sequence only imported (or forked from one), the
// imported cache itself (export(import(c)) == c: tokens, shape, dtype,
// layout, every value); for one whose tokens are all known, the engine's
// model on them; otherwise what the sequence reads through its table - and
// it shares no storage with the pool (no stale tail, no view into a block).
//
// Checked: at each export.
// Not checked here: a sequence's K/V when it is not exported (hit-consumed
// at alloc).
#include "checkers/checker.h"

#include <algorithm>

namespace kvcheck::checkers {
namespace {

class PagedRoundtrip final : public Checker {
  public:
    PagedRoundtrip() : Checker(Property::paged_roundtrip) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (fact.by != PagedBy::exported || !fact.exported || !checking(probe)) return;
        PagedEngine& paged = *probe.engine().paged();
        CacheView expected;
        std::string source;
        const auto tokens = fact.after.tokens.find(fact.seq);
        const auto table = fact.after.tables.find(fact.seq);
        const bool released = fact.after.window > 0 && table != fact.after.tables.end() &&
                              std::find(table->second.begin(), table->second.end(), 0) != table->second.end();
        if (fact.imported && !released) {
            expected = expected_view(*fact.imported);
            source = "the cache it imported";
        } else if (fact.computed && tokens != fact.after.tokens.end() && fact.after.window > 0) {
            // With a window the blocks behind it may be the null block: the
            // export is what the table reads, whose blocks inside the
            // window are the model's K/V.
            const std::string windowed = window_difference(paged, fact.after, fact.seq, tokens->second, fact.salt);
            if (!expect(probe, windowed.empty(), [&] { return fact.what + ": the sequence's K/V are not the model's on its tokens " + tokens_text(tokens->second) + ": " + windowed; })) {
                return;
            }
            expected = paged.paged_sequence_view(fact.seq);
            source = "what it reads through its table";
        } else if (fact.computed && tokens != fact.after.tokens.end()) {
            expected = paged.paged_fresh_view(tokens->second, fact.salt, 0, static_cast<std::int64_t>(tokens->second.size()));
            source = "the model's K/V on its tokens " + tokens_text(tokens->second);
        } else {
            expected = paged.paged_sequence_view(fact.seq);
            source = "what it reads through its table";
        }
        const std::string difference = view_difference(fact.exported->view, expected);
        if (!expect(probe, difference.empty(), [&] { return fact.what + " is not " + source + ": " + difference; })) return;
        const std::vector<std::uint64_t> pool = paged.paged_pool_storage();
        for (const std::uint64_t id : fact.exported->storage) {
            if (!expect(probe, std::find(pool.begin(), pool.end(), id) == pool.end(),
                        [&] { return fact.what + " shares one storage with the pool"; })) {
                return;
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::paged_roundtrip>() {
    return std::make_unique<PagedRoundtrip>();
}

}  // namespace kvcheck::checkers
