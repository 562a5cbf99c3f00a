// single-copy: the stored K/V are copied once at most along a generation's
// path: get_cache makes exactly one copy (its owned result), a generation
// copies its input once unless it is already an owned copy, and at most the
// input's copy chain plus one K/V set is alive while the model runs.
//
// Checked, from the engine's copy log and its peak of live K/V sets: the
// copies get_cache logs; the copies and the peak of every generation.
// Not checked here: that the copy is correct (layout-roundtrip,
// merge-correct) or independent of the store (stored-immutable); the
// copies other operations make, and their byte counts.
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class SingleCopy final : public Checker {
  public:
    SingleCopy() : Checker(Property::single_copy) {}

    Reads reads() const override {
        Reads reads;
        reads.copy_log = true;
        return reads;
    }

    void made(const Made& made, Probe& probe) override {
        if (made.by != MadeBy::get_cache || !made.object || !probe.capabilities().copy_log) return;
        const std::size_t copies = made.copies.value_or(0);
        expect(probe, copies == 1, [&] {
            return "get_cache " + std::to_string(made.ids) + " ids -> " + handle_text(made.out) + " made " +
                   std::to_string(copies) + " copies, expected 1";
        });
    }

    void generated(const Generated& generation, Probe& probe) override {
        if (!probe.capabilities().copy_log) return;
        const std::size_t copies = generation.copies.value_or(0);
        expect(probe, copies == generation.copies_expected, [&] {
            return generation_text(generation) + " made " + std::to_string(copies) + " copies of the K/V, expected " +
                   std::to_string(generation.copies_expected);
        });
        const std::int64_t peak = generation.result.peak_live_sets;
        expect(probe, peak <= generation.sets_max, [&] {
            return generation_text(generation) + " held " + std::to_string(peak) + " K/V sets alive, at most " +
                   std::to_string(generation.sets_max) + " allowed";
        });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::single_copy>() {
    return std::make_unique<SingleCopy>();
}

}  // namespace kvcheck::checkers
