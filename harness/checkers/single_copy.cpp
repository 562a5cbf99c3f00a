// single-copy: the stored K/V are copied once at most along a generation's
// path, and every copy is accounted for: each operation logs exactly the
// copies its semantics make (get_cache one, its owned result, or for ids
// that hold no tokens none, or one of 0 bytes for an empty result; clone,
// concat and from_legacy one each; a generation one unless its input is
// already an owned copy; a batch one at least, of any size, as its
// stacking, repeat, reorder and select each may copy; nothing else any),
// each logged with the bytes of K/V it copied (under a window, from what
// the cache shows to all of it); and while the model runs, the K/V sets alive are the
// input's copy chain plus the boundary's copy, no more, and no fewer than
// the trace still holds (the lower bound only when the model ran: a
// generation of 0 tokens runs none).
//
// Checked, from the engine's copy log (read after every operation) and its
// peak of live K/V sets: the count and byte size of every operation's
// copies; the peak of every generation against both bounds.
// Not checked here: that a copy is correct (layout-roundtrip,
// merge-correct) or independent (clone-independent, stored-immutable).
#include "checkers/checker.h"

#include <limits>

namespace kvcheck::checkers {
namespace {

// Exactly the bytes of K/V copied; under a window, from the bytes the cache
// shows to all it holds (docs/semantics.md#store-windows).
bool sized_right(const Copies& copies, std::int64_t bytes) {
    if (!copies.bytes_shown) return bytes == *copies.bytes;
    return bytes >= *copies.bytes_shown && (!copies.bytes || bytes <= *copies.bytes);
}

std::string bytes_text(const Copies& copies) {
    if (!copies.bytes_shown) return std::to_string(*copies.bytes);
    if (!copies.bytes) return "at least " + std::to_string(*copies.bytes_shown);
    if (*copies.bytes_shown == *copies.bytes) return std::to_string(*copies.bytes);
    return std::to_string(*copies.bytes_shown) + " to " + std::to_string(*copies.bytes);
}

class SingleCopy final : public Checker {
  public:
    SingleCopy() : Checker(Property::single_copy) {}

    Reads reads() const override {
        Reads reads;
        reads.copy_log = true;
        return reads;
    }

    void copies(const Copies& copies, Probe& probe) override {
        if (!probe.capabilities().copy_log) return;
        const std::size_t made = copies.logged.size();
        const bool counted = expect(probe, made >= copies.min && made <= copies.max, [&] {
            const bool unbounded = copies.max == std::numeric_limits<std::size_t>::max();
            const std::string expected = copies.min == copies.max ? std::to_string(copies.min)
                                         : unbounded              ? "at least " + std::to_string(copies.min)
                                                                  : std::to_string(copies.min) + " or " + std::to_string(copies.max);
            return copies.what + " made " + std::to_string(made) + " copies of the K/V, expected " + expected;
        });
        if (!counted || (!copies.bytes && !copies.bytes_shown)) return;
        for (const CopyRecord& record : copies.logged) {
            const bool sized = expect(probe, sized_right(copies, record.bytes), [&] {
                return copies.what + " logged a copy (" + record.reason + ") of " + std::to_string(record.bytes) +
                       " bytes, but the K/V it copies are " + bytes_text(copies) + " bytes";
            });
            if (!sized) return;
        }
    }

    void generated(const Generated& generation, Probe& probe) override {
        if (!probe.capabilities().copy_log) return;
        const std::int64_t peak = generation.result.peak_live_sets;
        expect(probe, peak <= generation.sets_max, [&] {
            return generation_text(generation) + " held " + std::to_string(peak) + " K/V sets alive, at most " +
                   std::to_string(generation.sets_max) + " allowed";
        });
        // A generation of no token runs no model: an engine that samples its
        // sets at the model's forwards has nothing to report, and none is due.
        if (generation.max == 0) return;
        expect(probe, peak >= generation.sets_min, [&] {
            return generation_text(generation) + " reported " + std::to_string(peak) + " K/V sets alive, but " +
                   std::to_string(generation.sets_min) + " are: its input's copy chain the trace still holds, " +
                   "and the set the model writes into";
        });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::single_copy>() {
    return std::make_unique<SingleCopy>();
}

}  // namespace kvcheck::checkers
