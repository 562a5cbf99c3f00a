// clone-independent: a copy shares no tensor storage, layer object or list
// with its source: a clone, not for an empty cache (the model filling the
// clone must not add layers to the source), not for layers holding one side
// only or legacy-named slots; the copy from_legacy makes
// (docs/semantics.md#conversion-copies); and a batch's row, with any of the
// rows it was stacked from (docs/semantics.md#batches).
//
// Checked, when the engine reports storage identities: the copy's storage
// against its source's, at the step that made it. The copy a generation
// makes of a cache that is not an owned copy (one that is not stored: made,
// or a conversion's result) is judged by its effect: the model filling that
// copy must leave the source's content as it was, read after the generation
// (under a content tolerance: exactly as read when it was made).
// Not checked here: the clone's content (layout-roundtrip), its owned
// marker (owned-marker), what a generation does to a stored entry
// (stored-immutable).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class CloneIndependent final : public Checker {
  public:
    CloneIndependent() : Checker(Property::clone_independent) {}

    void made(const Made& made, Probe& probe) override {
        if (!made.object || !checking(probe)) return;
        // Under a content tolerance a handle's first reading is judged
        // within it and every later one exactly
        // (docs/semantics.md#content-tolerance): read here, when the handle
        // is made, so that a generation from it must leave it exactly as it
        // was. How it differs from what was expected is the other
        // properties' to report (merge-correct, layout-roundtrip, ...).
        if (probe.capabilities().content_tolerance.declared()) probe.handle_difference(made.out, *made.object);
        const bool copy = made.by == MadeBy::clone || made.by == MadeBy::from_legacy || made.by == MadeBy::batch;
        if (!copy) return;
        if (const std::optional<std::int64_t> source = shared_source(probe, made.out, made.sources)) {
            const std::string what = made.by == MadeBy::clone   ? "the clone "
                                     : made.by == MadeBy::batch ? "the batch row "
                                                                : "the copy from_legacy made, ";
            fail(probe, what + handle_text(made.out) + " shares one storage with its source " + handle_text(*source));
        }
    }

    void generated(const Generated& generation, Probe& probe) override {
        if (generation.owned || generation.source == 0 || !checking(probe)) return;
        const std::optional<ObjectId> source = probe.auditor().handle(generation.source);
        if (!source || probe.auditor().object(*source).origin == Origin::stored_item) return;
        const std::string difference = probe.handle_difference(generation.source, *source);
        if (!difference.empty()) {
            fail(probe, generation_text(generation) + " changed its source through the copy it decoded on: " + difference);
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::clone_independent>() {
    return std::make_unique<CloneIndependent>();
}

}  // namespace kvcheck::checkers
