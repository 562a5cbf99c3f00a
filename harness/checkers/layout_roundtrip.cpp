// layout-roundtrip: the operations that copy or convert a cache keep what
// it holds: a cache made from content, a clone, the copy get_cache makes of
// one entry, to_legacy and from_legacy each report exactly the expected
// view (content, shapes, dtypes, layer count, per-layer lengths, flags and
// layout). A dump/load round trip is dump-safe's.
//
// Checked: the view of the handle each of those operations makes, against
// the auditor's expected view, at the operation's step.
// Not checked here: merges (merge-correct), storage sharing
// (clone-independent, stored-immutable), the owned marker (owned-marker).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class LayoutRoundtrip final : public Checker {
  public:
    LayoutRoundtrip() : Checker(Property::layout_roundtrip) {}

    void made(const Made& made, Probe& probe) override {
        if (!made.object) return;
        switch (made.by) {
            case MadeBy::get_cache:
                if (!made.merged) check_view(made, "the copy", probe);
                return;
            case MadeBy::make: check_view(made, "the cache made as", probe); return;
            case MadeBy::clone: check_view(made, "the clone", probe); return;
            case MadeBy::to_legacy: check_view(made, "to_legacy gave", probe); return;
            case MadeBy::from_legacy: check_view(made, "from_legacy gave", probe); return;
            case MadeBy::get:
            case MadeBy::concat:
            case MadeBy::stored_back:
            case MadeBy::batch: return;  // batch-exact's
        }
    }

  private:
    void check_view(const Made& made, const char* what, Probe& probe) const {
        if (!checking(probe)) return;
        const std::string difference = probe.handle_difference(made.out, *made.object);
        if (!difference.empty()) fail(probe, std::string(what) + " " + handle_text(made.out) + ": " + difference);
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::layout_roundtrip>() {
    return std::make_unique<LayoutRoundtrip>();
}

}  // namespace kvcheck::checkers
