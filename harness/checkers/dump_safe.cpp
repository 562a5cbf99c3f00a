// dump-safe: a load gives back a store that was dumped; a load may fail
// only when no complete dump is in its slot (never written, corrupted, or
// a dump crashed before one was complete), and a failed load leaves the
// store in memory as it was.
//
// Checked: every load's outcome against what its slot may hold (the
// auditor keeps, per slot, the stores a dump or an interrupted dump may
// have left), and after a failed load, the whole store against the one
// before it.
// Not checked here: durability against a real power cut (the engine's own
// dump_interrupted simulates the crash), file names or formats.
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class DumpSafe final : public Checker {
  public:
    DumpSafe() : Checker(Property::dump_safe) {}

    void loaded(const Loaded& load, Probe& probe) override {
        const std::string slot = "load of dump slot " + std::to_string(load.slot);
        if (!load.result.ok) {
            const DumpSlot& expected = load.expected;
            const bool may_fail = expected.candidates.empty() || expected.corrupted || expected.may_be_absent;
            expect(probe, may_fail, [&] { return slot + " failed although a complete dump was written: " + load.result.error; });
            // Nothing in memory may be lost: the store must be as it was.
            if (!checking(probe)) return;
            const std::string difference = probe.store_difference();
            expect(probe, difference.empty(), [&] { return "after a failed load, " + difference; });
            return;
        }
        if (load.expected.candidates.empty()) {
            fail(probe, slot + " succeeded, but nothing was dumped there");
            return;
        }
        if (!load.matched) fail(probe, slot + " gave a store unlike any dump: " + load.difference);
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::dump_safe>() {
    return std::make_unique<DumpSafe>();
}

}  // namespace kvcheck::checkers
