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
        if (fact.imported) {
            expected = expected_view(*fact.imported);
            source = "the cache it imported";
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
