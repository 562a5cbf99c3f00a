// merge-correct: a cache merged from several parts (get_cache of several
// ids that hold tokens, concat of handles) holds every layer of the parts
// concatenated along the sequence in request order, reports its true
// length, has every merged layer initialized, and shares no storage with
// its parts.
//
// A merge of parts of different dtypes has the dtype torch.cat promotes to,
// each part's values as they were (rounded to that part's dtype); an engine
// may instead refuse it with an error, and then its handle holds nothing
// (that the store is unchanged is stored-immutable's).
//
// Checked: the merged handle's view against the auditor's expected
// concatenation, at the merge's step; for concat, the storage it shares
// with its parts (when the engine reports storage identities); that a
// refused merge left no cache behind.
// Not checked here: the owned marker of the result (owned-marker), that the
// sources stay unchanged (stored-immutable), the copy count (single-copy).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class MergeCorrect final : public Checker {
  public:
    MergeCorrect() : Checker(Property::merge_correct) {}

    void made(const Made& made, Probe& probe) override {
        if (!checking(probe)) return;
        if (made.refused) {
            expect(probe, !probe.handle(made.out).exists, [&] {
                return "the engine refused the merge of mixed dtypes (" + *made.refused + ") but " +
                       handle_text(made.out) + " holds a cache";
            });
            return;
        }
        if (!made.object) return;
        const bool merge = (made.by == MadeBy::get_cache && made.merged) || made.by == MadeBy::concat;
        if (!merge) return;
        const std::string difference = probe.handle_difference(made.out, *made.object);
        if (!difference.empty()) {
            fail(probe, "the merged cache " + handle_text(made.out) + ": " + difference);
            return;
        }
        if (made.by != MadeBy::concat) return;
        if (const std::optional<std::int64_t> source = shared_source(probe, made.out, made.sources)) {
            fail(probe, "the merged cache " + handle_text(made.out) + " shares one storage with its source " + handle_text(*source));
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::merge_correct>() {
    return std::make_unique<MergeCorrect>();
}

}  // namespace kvcheck::checkers
