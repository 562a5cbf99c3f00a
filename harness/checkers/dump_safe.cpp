// dump-safe: a load gives back a store that was dumped; a load may fail
// only when no complete dump is in its slot (never written, corrupted, or
// a dump crashed before one was complete), and a failed load leaves the
// store in memory as it was. A dump survives a power cut once it returned;
// a crash during one leaves the previous dump or the new one. A temporary
// file a killed dump left is no finding of its own: it is one only where
// it changes what a load returns, which the loads with it in place show
// (docs/semantics.md#durability); the message of such a load names it.
//
// Checked: every load's outcome against what its slot may hold (the
// auditor keeps, per slot, the stores a dump or an interrupted dump may
// have left), and after a failed load, the whole store against the one
// before it. For dump_kill, the same of every directory a real kill and
// the power-cut model (docs/durability.md) leave, each loaded by a fresh
// engine in a fresh process, with what a killed dump left beside it.
// Not checked here: file names or formats; durability of what the model
// does not follow (a dump it cannot follow is an engine error, not a pass).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class DumpSafe final : public Checker {
  public:
    DumpSafe() : Checker(Property::dump_safe) {}

    void loaded(const Loaded& load, Probe& probe) override {
        // A corrupted file's damage is named with its real byte offset.
        const std::string& damage = load.expected.damage;
        const std::string slot = "load of dump slot " + std::to_string(load.slot) + (damage.empty() ? "" : " (corrupted: " + damage + ")");
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

    void dump_killed(const DumpKilled& killed, Probe& probe) override {
        if (!killed.unfollowed.empty()) {
            probe.engine_error("dump_kill cannot model this engine's dump: " + killed.unfollowed);
            return;
        }
        const std::string dump = "dump to slot " + std::to_string(killed.slot);
        const DumpSlot& expected = killed.expected;
        const bool previous_may_fail = expected.candidates.empty() || expected.corrupted || expected.may_be_absent;
        for (const CrashLoad& load : killed.loads) {
            // Leftovers are the evidence of a load they changed.
            std::string left;
            for (const std::string& name : load.leftovers) left += " \"" + name + "\"";
            const std::string where = dump + ", " + (load.after_return ? "" : killed.kill + "; ") + load.state +
                                      (left.empty() ? "" : " (a killed dump's temporary file left beside it:" + left + ")") + ": ";
            if (!load.result.ok) {
                const bool may_fail = !load.after_return && previous_may_fail;
                expect(probe, may_fail, [&] {
                    return where + "a fresh engine's load failed although " +
                           (load.after_return ? "the dump had returned" : "the previous dump was complete") + ": " + load.result.error;
                });
                expect(probe, load.changed_by_failure.empty(), [&] { return where + "the failed load changed the store it was made on: " + load.changed_by_failure; });
            } else {
                expect(probe, load.matched, [&] {
                    return where + "a fresh engine loaded a store unlike " + (load.after_return ? "the dump" : "either dump") + ": " + load.difference;
                });
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::dump_safe>() {
    return std::make_unique<DumpSafe>();
}

}  // namespace kvcheck::checkers
