// batch-exact: a row of a batch holds exactly the cache it came from. The
// caches a `batch` stacks are rows of one batch; repeating each row,
// reordering the rows (a beam step's reorder) and selecting one moves whole
// rows: the row handed out holds, in every layer and slot, exactly the K/V
// of the row it names (content, shapes, dtypes, per-layer lengths and flags
// as they were). So a reorder that moves the keys and not the values, a
// repeat that interleaves the wrong way (row j from row j % rows instead of
// j / repeat), or a select off by one row fails here.
//
// Checked: the view of the row handed out, right after the batch, against
// the auditor's expected view of the row it came from
// (docs/semantics.md#batches).
// Not checked here: that the row shares nothing with the rows it was
// stacked from (clone-independent), its owned marker (owned-marker), what
// the batch does to the store (stored-immutable), a generation from the row
// (generation-equivalent, against a fresh copy of the row it came from),
// copies (single-copy: one, of the row handed out).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class BatchExact final : public Checker {
  public:
    BatchExact() : Checker(Property::batch_exact) {}

    void made(const Made& made, Probe& probe) override {
        if (made.by != MadeBy::batch || !made.object || !checking(probe)) return;
        const std::string difference = probe.handle_difference(made.out, *made.object);
        if (difference.empty()) return;
        fail(probe, made.how + ": " + difference);
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::batch_exact>() {
    return std::make_unique<BatchExact>();
}

}  // namespace kvcheck::checkers
