// trim-exact: a cache trimmed to its first `keep` tokens holds exactly what
// a fresh computation on the kept prefix holds: each slot its first `keep`
// tokens (content, shapes, dtypes, per-layer lengths, flags and layout as
// before), and a cache the model made exactly what the engine's model
// gives on a fresh copy of what it started from fed the tokens kept
// (Engine::fed_view). So a trim that keeps a token too many or too few, cuts
// one layer and not another, cuts the wrong end or leaves a stale length
// behind fails here.
//
// Checked: the view of the trimmed handle, right after the trim, against
// the auditor's expected view (docs/semantics.md#trimming).
// Not checked here: what the trim does to the store (stored-immutable:
// every entry is read again after it, and the handle against the entries'
// storage), a generation from the trimmed cache (generation-equivalent,
// which compares it with a fresh copy of the kept prefix), copies
// (single-copy: a trim makes none).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class TrimExact final : public Checker {
  public:
    TrimExact() : Checker(Property::trim_exact) {}

    void trimmed(const Trimmed& trimmed, Probe& probe) override {
        if (!checking(probe)) return;
        const std::string difference = probe.handle_difference(trimmed.handle, trimmed.object);
        if (difference.empty()) return;
        fail(probe, "trim " + handle_text(trimmed.handle) + " keep=" + std::to_string(trimmed.keep) + " (it held " +
                        std::to_string(trimmed.tokens_before) + " tokens): " + difference);
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::trim_exact>() {
    return std::make_unique<TrimExact>();
}

}  // namespace kvcheck::checkers
