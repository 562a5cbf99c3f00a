// eviction-as-declared: a store that declares a capacity
// (Capabilities::policy, docs/semantics.md#declared-store-contracts)
// evicts only when the items it is given would take it past that
// capacity, only what its declared policy names (lru: the least recently
// used; fifo: the first stored; lrs: the least recently stored, an
// overwrite moving an entry to the back; unspecified: any entry but one
// handed out; none: nothing, it refuses the add instead), never an entry
// under a live lease (a store that could make room only by evicting the
// item it is given refuses it whole, docs/semantics.md#leases), and holds
// no more than its capacity afterwards (under unspecified, unless every
// entry left is handed out or leased).
//
// Checked: at each step that stores items (add, add_handle, extract,
// fill), the entries the engine no longer lists, of those it held or was
// given, against the policy's (the Evicted fact); the entries and bytes it
// holds after.
// Not checked here: that what is left is intact, and that a cache handed
// out before its entry was evicted stays intact (stored-immutable,
// layout-roundtrip, generation-equivalent, which follow the evictions);
// the order of the listing (store-contract, in the declared order).
#include "checkers/checker.h"

#include <algorithm>

namespace kvcheck::checkers {
namespace {

std::string capacity_text(const StorePolicy& policy) {
    std::string text;
    if (policy.capacity_items > 0) text += std::to_string(policy.capacity_items) + " items";
    if (policy.capacity_bytes > 0) text += (text.empty() ? "" : ", ") + std::to_string(policy.capacity_bytes) + " bytes";
    return text;
}

std::string held_text(std::size_t items, std::int64_t bytes) {
    return std::to_string(items) + (items == 1 ? " item" : " items") + " (" + std::to_string(bytes) + " bytes)";
}

// Which entry a policy that names its victims evicts first.
const char* victim_text(Eviction eviction) {
    switch (eviction) {
        case Eviction::lru: return "the least recently used";
        case Eviction::lrs: return "the least recently stored";
        default: return "the first stored";
    }
}

bool same_ids(std::vector<std::string> a, std::vector<std::string> b) {
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    return a == b;
}

class EvictionAsDeclared final : public Checker {
  public:
    EvictionAsDeclared() : Checker(Property::eviction_as_declared) {}

    void evicted(const Evicted& e, Probe& probe) override {
        if (!checking(probe)) return;
        const std::string declared = std::string("declared: ") + capacity_text(e.policy) + ", eviction " +
                                     eviction_name(e.policy.eviction);
        for (const Evicted::Store& one : e.stores) {
            // "add "e"", or within a fill "fill i0..i63: storing "i5"".
            const std::string what = e.stores.size() == 1 ? e.what : e.what + ": storing " + in_quotes(one.id);
            if (!leases_kept(e, one, what, declared, probe)) return;
            if (!one.over && !one.gone.empty()) {
                fail(probe, what + " evicted " + id_list(one.gone) + ", but the store had room: with it, it would hold " +
                                held_text(one.items_before, one.bytes_before) + " (" + declared + ")");
                return;
            }
            if (!policy_kept(e, one, what, declared, probe)) return;
        }
        check_capacity(e, declared, probe);
    }

  private:
    // No entry `one` evicted is one of `kept` (ids the store never evicts);
    // else fails with "<what> evicted "<id>"<why>".
    bool none_gone_of(const Evicted::Store& one, const std::vector<std::string>& kept, const std::string& what,
                      const std::string& why, Probe& probe) const {
        for (const std::string& id : one.gone) {
            const bool held = std::find(kept.begin(), kept.end(), id) != kept.end();
            if (!expect(probe, !held, [&] { return what + " evicted " + in_quotes(id) + why; })) return false;
        }
        return true;
    }

    // docs/semantics.md#leases: an entry under a live lease is never
    // evicted; a store that can make room only by evicting the item it is
    // given refuses it whole, and refuses nothing else.
    bool leases_kept(const Evicted& e, const Evicted::Store& one, const std::string& what,
                     const std::string& declared, Probe& probe) const {
        if (!none_gone_of(one, e.leased, what, ", which holds a live lease (" + declared +
                                                     ": an entry under a live lease is never evicted)", probe)) {
            return false;
        }
        if (one.refused) {
            return expect(probe, one.refusal_due, [&] {
                return what + " was refused, but the store could make room: with it, it would hold " +
                       held_text(one.items_before, one.bytes_before) + ", " +
                       (e.leased.empty() ? std::string("none under a live lease") : "under a live lease only " + id_list(e.leased)) +
                       " (" + declared + ")";
            });
        }
        if (one.refusal_due && e.policy.eviction != Eviction::none) {
            return expect(probe, false, [&] {
                return what + " was stored, but the store had no room but by evicting it: every other entry holds a live lease (" +
                       id_list(e.leased) + "; " + declared + "): the add must be refused";
            });
        }
        return true;
    }

    bool policy_kept(const Evicted& e, const Evicted::Store& one, const std::string& what, const std::string& declared,
                     Probe& probe) const {
        switch (e.policy.eviction) {
            case Eviction::none:
                return expect(probe, one.gone.empty(), [&] {
                    return what + " evicted " + id_list(one.gone) + ", but the store evicts nothing (" + declared +
                           "): an add past the capacity must be refused";
                });
            case Eviction::lru:
            case Eviction::fifo:
            case Eviction::lrs:
                return expect(probe, same_ids(one.gone, one.due), [&] {
                    return what + " evicted " + id_list(one.gone) + ", expected " + id_list(one.due) + " (" +
                           victim_text(e.policy.eviction) + " first; " + declared + ")";
                });
            case Eviction::unspecified:
                return none_gone_of(one, e.handed_out, what, ", which a live handle holds (" + declared +
                                                             ": an entry handed out is never evicted)", probe);
        }
        return true;
    }

    // After the operation the store holds no more than its capacity; under
    // unspecified eviction, unless every entry left is handed out.
    void check_capacity(const Evicted& e, const std::string& declared, Probe& probe) const {
        const StorePolicy& policy = e.policy;
        const bool within = (policy.capacity_items == 0 || static_cast<std::int64_t>(e.items_after) <= policy.capacity_items) &&
                            (policy.capacity_bytes == 0 || e.bytes_after <= policy.capacity_bytes);
        if (within) return;
        if (policy.eviction == Eviction::unspecified) {
            const std::vector<std::string>& held = probe.auditor().order();
            const bool all_handed_out = std::all_of(held.begin(), held.end(), [&](const std::string& id) {
                return std::find(e.handed_out.begin(), e.handed_out.end(), id) != e.handed_out.end() ||
                       std::find(e.leased.begin(), e.leased.end(), id) != e.leased.end();
            });
            if (all_handed_out) return;
        }
        fail(probe, "after " + e.what + " the store holds " + held_text(e.items_after, e.bytes_after) +
                        ", over its capacity (" + declared + ")");
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::eviction_as_declared>() {
    return std::make_unique<EvictionAsDeclared>();
}

}  // namespace kvcheck::checkers
