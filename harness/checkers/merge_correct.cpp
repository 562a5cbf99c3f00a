// merge-correct: a cache merged from several parts (get_cache of several
// ids that hold tokens, concat of handles) holds every layer of the parts
// concatenated along the sequence in request order, reports its true
// length, has every merged layer initialized, and shares no storage with
// its parts.
//
// Checked: the merged handle's view against the auditor's expected
// concatenation, at the merge's step; for concat, the storage it shares
// with its parts (when the engine reports storage identities).
// Not checked here: the owned marker of the result (owned-marker), that the
// sources stay unchanged (stored-immutable), the copy count (single-copy).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class MergeCorrect final : public Checker {
  public:
    MergeCorrect() : Checker(Property::merge_correct) {}

    void made(const Made& made, Probe& probe) override {
        if (!made.object || !checking(probe)) return;
        const bool merge = (made.by == MadeBy::get_cache && made.merged) || made.by == MadeBy::concat;
        if (!merge) return;
        const std::string difference = probe.handle_difference(made.out, *made.object);
        if (!difference.empty()) {
            fail(probe, "the merged cache " + handle_text(made.out) + ": " + difference);
            return;
        }
        if (made.by != MadeBy::concat) return;
        if (const std::optional<std::int64_t> source = shared_source(probe, made.out, made.sources)) {
            fail(probe, "the merged cache " + handle_text(made.out) + " shares storage with its source " + handle_text(*source));
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::merge_correct>() {
    return std::make_unique<MergeCorrect>();
}

}  // namespace kvcheck::checkers
