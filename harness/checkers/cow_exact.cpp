// cow-exact (paged): an append that writes into a block whose count is
// above one first copies exactly that block, once, into a fresh block (one
// that was free), every layer and every slot it held, bit for bit; the
// sequence's table then points at the copy, and the copy is pending (read
// from its source) until the step. A block the sequence holds alone is
// written in place: no copy.
//
// Checked: at each append, the appending sequence's table before and after,
// the pending copies it added, and the K/V of each copy's first slots
// against its source's.
// Not checked here: that the source is unchanged (published-immutable) or
// kept alive while read (no-reuse-while-read).
#include "checkers/checker.h"

#include <algorithm>

namespace kvcheck::checkers {
namespace {

// How many times the copy is pending: a copy into a block freed (its
// sequence ended or rewound) before the step may be pending again when
// that block is taken for another copy of the same source.
std::ptrdiff_t times(const std::vector<PagedCopy>& copies, const PagedCopy& copy) {
    return std::count(copies.begin(), copies.end(), copy);
}

class CowExact final : public Checker {
  public:
    CowExact() : Checker(Property::cow_exact) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (fact.by != PagedBy::append || fact.refused || !checking(probe)) return;
        const auto was = fact.before.tables.find(fact.seq);
        const auto now = fact.after.tables.find(fact.seq);
        if (was == fact.before.tables.end() || now == fact.after.tables.end()) return;
        std::size_t copies_due = 0;
        for (std::size_t i = 0; i < was->second.size() && i < now->second.size(); ++i) {
            const std::int64_t old_block = was->second[i];
            const std::int64_t new_block = now->second[i];
            const PagedBlock* const source_before = block_in(fact.before, old_block);
            const PagedBlock* const source_after = block_in(fact.after, old_block);
            const PagedBlock* const copied = block_in(fact.after, new_block);
            if (source_before == nullptr || source_after == nullptr || copied == nullptr) continue;  // refcount-exact's
            const PagedBlock& old_before = *source_before;
            const PagedBlock& old_after = *source_after;
            if (old_block == new_block) {
                const bool written = old_after.tokens != old_before.tokens;
                if (!expect(probe, !(written && old_before.count > 1), [&] {
                        return fact.what + " wrote into shared " + block_text(fact.before, old_block) +
                               " without copying it";
                    })) {
                    return;
                }
                continue;
            }
            ++copies_due;
            const std::string what = fact.what + " replaced " + block_text(fact.before, old_block) + " with " +
                                     block_text(fact.after, new_block);
            if (!expect(probe, old_before.count > 1, [&] { return what + ": a block it held alone was copied"; })) return;
            if (!expect(probe, in_free_queue(fact.before, new_block), [&] { return what + ", which was not free before"; })) return;
            if (!expect(probe, times(fact.after.copies, {old_block, new_block}) > times(fact.before.copies, {old_block, new_block}),
                        [&] { return what + " but no pending copy reads the source"; })) {
                return;
            }
            const PagedBlock& copy = *copied;
            const auto held = static_cast<std::int64_t>(old_before.tokens.size());
            const bool same_tokens = static_cast<std::int64_t>(copy.tokens.size()) >= held &&
                                     std::equal(old_before.tokens.begin(), old_before.tokens.end(), copy.tokens.begin());
            if (!expect(probe, same_tokens, [&] { return what + ": the copy does not hold the source's tokens"; })) return;
            PagedEngine& paged = *probe.engine().paged();
            const std::string difference =
                view_difference(paged.paged_block_view(new_block, held), paged.paged_block_view(old_block, held));
            if (!expect(probe, difference.empty(), [&] { return what + ": the copy's first " + std::to_string(held) + " slots differ from the source's: " + difference; })) {
                return;
            }
        }
        // Copies end only at the step: those added are the after's beyond
        // the before's, counted as multisets.
        std::size_t added = 0;
        for (std::size_t i = 0; i < fact.after.copies.size(); ++i) {
            const PagedCopy& copy = fact.after.copies[i];
            const bool first = std::find(fact.after.copies.begin(), fact.after.copies.begin() + static_cast<std::ptrdiff_t>(i), copy) ==
                               fact.after.copies.begin() + static_cast<std::ptrdiff_t>(i);
            if (first) added += static_cast<std::size_t>(std::max<std::ptrdiff_t>(0, times(fact.after.copies, copy) - times(fact.before.copies, copy)));
        }
        expect(probe, added == copies_due, [&] {
            return fact.what + " added " + std::to_string(added) + " pending copies for " + std::to_string(copies_due) +
                   " blocks it copied";
        });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::cow_exact>() {
    return std::make_unique<CowExact>();
}

}  // namespace kvcheck::checkers
