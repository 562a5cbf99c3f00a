// lease-respected: read leases on kvcheck's virtual clock hold what they
// promise, and nothing more (docs/semantics.md#leases). While an entry
// holds a live lease, every call that would remove or replace it (add,
// add_handle, extract, fill, delete, delete_all, load) is refused whole;
// once every lease on it expired (the clock at or past its expiry), none
// is refused for it. A lease on a stored entry is granted, one on an id
// that holds nothing refused; an unlease gives back a live lease and is
// refused when none is live (none taken, all given back, or expired). So an
// engine that frees a leased entry, lets a lease outlive its TTL by a tick
// or expire a tick early, or takes back a lease after expiry fails here.
//
// Checked: each Leased fact, right after its call: the refusal against
// whether one was due. Not checked here: what a refused call left behind
// (stored-immutable and store-contract read the store after every step, so
// a refusal that removed or changed an entry anyway fails there), eviction
// in a bounded store under leases (not modelled: such a declaration is
// refused, kvcheck/domain.h capabilities_fault).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class LeaseRespected final : public Checker {
  public:
    LeaseRespected() : Checker(Property::lease_respected) {}

    void leased(const Leased& leased, Probe& probe) override {
        if (!checking(probe)) return;
        const std::string at = " at t=" + std::to_string(leased.now_ms) + " ms";
        if (leased.refusal_due && !leased.refused) fail(probe, leased.what + at + " was not refused: " + leased.why);
        if (!leased.refusal_due && leased.refused) {
            fail(probe, leased.what + at + " was refused (" + *leased.refused + "): " + leased.why);
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::lease_respected>() {
    return std::make_unique<LeaseRespected>();
}

}  // namespace kvcheck::checkers
