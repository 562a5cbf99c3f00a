// owned-marker: only a cache that shares no storage with the store carries
// the owned marker: get_cache results, clones and merges carry it; stored
// entries, the items get hands out, conversion results and caches stored
// back never do; a handle marked owned shares no storage with a stored
// entry; and an owned copy shares storage with no other live cache but its
// own views (the global aliasing invariant, for owned copies).
//
// Checked: the marker of each handle an operation makes or stores back, at
// its step; the marker of each stored entry the run reads; every handle the
// run checks against the stored entries' storage; at full reads, every
// owned copy against every other live handle.
// Not checked here: whether an owned copy is copied again (single-copy) or
// holds the right content (layout-roundtrip, merge-correct).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class OwnedMarker final : public Checker {
  public:
    OwnedMarker() : Checker(Property::owned_marker) {}

    Reads reads() const override {
        Reads reads;
        reads.entry_marker = true;
        reads.handle_aliasing = true;
        return reads;
    }

    void made(const Made& made, Probe& probe) override {
        switch (made.by) {
            case MadeBy::get:
                if (made.object) check_owned(made.out, false, "the stored item handed out by get as", probe);
                return;
            case MadeBy::stored_back:
                check_owned(made.out, false, "a cache stored back as " + in_quotes(made.id) + ",", probe);
                return;
            case MadeBy::get_cache:
                if (made.object) check_owned(made.out, true, made.merged ? "the merged cache" : "the copy", probe);
                return;
            case MadeBy::clone: check_owned(made.out, true, "the clone", probe); return;
            case MadeBy::concat:
                if (made.object) check_owned(made.out, true, "the merged cache", probe);
                return;
            case MadeBy::to_legacy: check_owned(made.out, false, "to_legacy gave", probe); return;
            case MadeBy::from_legacy: check_owned(made.out, false, "from_legacy gave", probe); return;
            case MadeBy::make: return;
        }
    }

    void entry(const EntryFact& entry, Probe& probe) override {
        if (checking(probe) && probe.entry_owned(entry)) fail(probe, "stored entry " + in_quotes(entry.id) + " is marked owned");
    }

    void handle(const HandleFact& handle, Probe& probe) override {
        if (!checking(probe)) return;
        const HandleReading& reading = probe.handle(handle.handle);
        if (reading.exists && reading.owned) {
            if (const std::optional<std::string> entry = probe.aliased_entry(handle)) {
                fail(probe, handle_text(handle.handle) + " is marked owned but shares storage with stored entry " +
                                in_quotes(*entry));
                return;
            }
        }
        // An owned copy is the one cache a writer may change: nothing else
        // alive may share its storage, but for views of it.
        if (!handle.full_read || !probe.auditor().object(handle.object).expect_owned) return;
        if (const std::optional<std::int64_t> other = probe.handle_sharing(handle)) {
            fail(probe, "the owned copy " + handle_text(handle.handle) + " shares storage with " + handle_text(*other));
        }
    }

  private:
    void check_owned(std::int64_t out, bool expected, const std::string& what, Probe& probe) const {
        if (!checking(probe)) return;
        const bool owned = probe.handle(out).owned;
        expect(probe, owned == expected, [&] {
            return what + " " + handle_text(out) + (expected ? " is not marked owned" : " is marked owned");
        });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::owned_marker>() {
    return std::make_unique<OwnedMarker>();
}

}  // namespace kvcheck::checkers
