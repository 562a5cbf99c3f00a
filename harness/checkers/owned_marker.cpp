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
//
// An engine without a marker (Capabilities::owned_marker false): "owned" is
// derived (Probe::owned, docs/semantics.md#ownership), so what is left to
// judge is the half that does not restate the definition: a cache that
// must be owned (a get_cache result, a clone, a merge, and the owned copy a
// generation wrote into) shares nothing with the store, at its step and
// whenever it is checked against the store; owned copies share nothing
// with other live handles. Unjudged: "not owned" (get, conversions, a
// cache stored back: with no marker there is nothing that could wrongly
// say owned) and the entries' markers (a stored entry is never owned).
//
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
                if (made.object) check_not_owned(made.out, "the stored item handed out by get as", probe);
                return;
            case MadeBy::stored_back:
                check_not_owned(made.out, "a cache stored back as " + in_quotes(made.id) + ",", probe);
                return;
            case MadeBy::get_cache:
                // An empty result (of ids that hold no tokens) may carry the
                // marker or not; marked, it shares nothing (handle, below).
                if (made.object && !made.tokenless) check_owned(made, made.merged ? "the merged cache" : "the copy", probe);
                return;
            case MadeBy::clone: check_owned(made, "the clone", probe); return;
            case MadeBy::batch: check_owned(made, "the batch row", probe); return;
            case MadeBy::concat:
                if (made.object) check_owned(made, "the merged cache", probe);
                return;
            case MadeBy::to_legacy: check_not_owned(made.out, "to_legacy gave", probe); return;
            case MadeBy::from_legacy: check_not_owned(made.out, "from_legacy gave", probe); return;
            case MadeBy::make: return;
        }
    }

    void entry(const EntryFact& entry, Probe& probe) override {
        if (!probe.capabilities().owned_marker) return;  // a stored entry is a stored object
        if (checking(probe) && probe.entry_owned(entry)) fail(probe, "stored entry " + in_quotes(entry.id) + " is marked owned");
    }

    void handle(const HandleFact& handle, Probe& probe) override {
        if (!checking(probe)) return;
        const bool must_be_owned = probe.auditor().object(handle.object).expect_owned;
        if (probe.capabilities().owned_marker) {
            if (probe.owned(handle.handle)) {
                if (const std::optional<std::string> entry = probe.aliased_entry(handle)) {
                    fail(probe, handle_text(handle.handle) + " is marked owned but shares one storage with stored entry " +
                                    in_quotes(*entry));
                    return;
                }
            }
        } else if (must_be_owned && !probe.owned(handle.handle)) {
            if (const std::optional<std::string> entry = probe.aliased_entry(handle)) {
                fail(probe, "the owned copy " + handle_text(handle.handle) + " shares one storage with stored entry " +
                                in_quotes(*entry) + derived_note);
                return;
            }
        }
        // An owned copy is the one cache a writer may change: nothing else
        // alive may share its storage, but for views of it.
        if (!handle.full_read || !must_be_owned) return;
        if (const std::optional<std::int64_t> other = probe.handle_sharing(handle)) {
            fail(probe, "the owned copy " + handle_text(handle.handle) + " shares one storage with " + handle_text(*other));
        }
    }

  private:
    static constexpr const char* derived_note =
        " (the engine keeps no owned marker: owned is derived, sharing no storage with the store)";

    void check_owned(const Made& made, const std::string& what, Probe& probe) const {
        if (!checking(probe) || probe.owned(made.out)) return;
        // A get_cache that handed out no cache where one was expected is
        // store-contract's (docs/semantics.md#reproduction).
        if (made.by == MadeBy::get_cache && made.object && !probe.handle(made.out).exists) return;
        if (probe.capabilities().owned_marker) {
            fail(probe, what + " " + handle_text(made.out) + " is not marked owned");
            return;
        }
        const std::optional<std::string> entry =
            made.object ? probe.aliased_entry({made.out, *made.object, false}) : std::nullopt;
        const std::string why = entry                          ? "shares one storage with stored entry " + in_quotes(*entry)
                                : !probe.handle(made.out).exists ? std::string("holds no cache")
                                                                 : std::string("shares one storage with the store");
        fail(probe, what + " " + handle_text(made.out) + " is not owned: it " + why + derived_note);
    }

    // Only a marker can wrongly say owned: without one there is nothing to check.
    void check_not_owned(std::int64_t out, const std::string& what, Probe& probe) const {
        if (!checking(probe) || !probe.capabilities().owned_marker) return;
        expect(probe, !probe.owned(out), [&] { return what + " " + handle_text(out) + " is marked owned"; });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::owned_marker>() {
    return std::make_unique<OwnedMarker>();
}

}  // namespace kvcheck::checkers
