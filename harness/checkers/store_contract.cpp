// store-contract: the plain store API: get of a missing id gives nothing
// and of a stored one its item; get_by_ids answers position by position in
// request order (none for a missing id); get_all and the store's listing
// give the ids in insertion order (an overwritten id keeps its place, a
// re-added one goes last), or in the order the store declares (recency,
// or any: docs/semantics.md#declared-store-contracts); get_cache of ids none of which exists gives
// none, and of ids that exist but of which none holds tokens gives none or
// a new cache holding no K/V (that it shares nothing with the store is
// stored-immutable's).
//
// Checked: the answers of get (the item and its metadata), get_by_ids, get_all and get_cache at their
// step; the listing after every change of membership while the store is
// small, and at every full read.
// Not checked here: the content of what is handed out (stored-immutable,
// layout-roundtrip, merge-correct).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class StoreContract final : public Checker {
  public:
    StoreContract() : Checker(Property::store_contract) {}

    Reads reads() const override {
        Reads reads;
        reads.listing = true;
        return reads;
    }

    void made(const Made& made, Probe& probe) override {
        if (made.by == MadeBy::get) {
            check_exists(made, "get " + in_quotes(made.id) + ":", probe);
            check_metadata(made, probe);
        }
        // A refused merge of mixed dtypes is merge-correct's.
        if (made.by == MadeBy::get_cache && !made.refused) {
            const std::string what = "get_cache " + std::to_string(made.ids) + " ids ->";
            if (made.tokenless) {
                check_holds_no_kv(made, what, probe);
            } else {
                check_exists(made, what, probe);
            }
        }
    }

    void got_by_ids(const GotByIds& got, Probe& probe) override {
        if (!checking(probe)) return;
        const bool sized = expect(probe, got.found.size() == got.ids.size(), [&] {
            return "get_by_ids returned " + std::to_string(got.found.size()) + " items for " + std::to_string(got.ids.size()) + " ids";
        });
        if (!sized) return;
        for (std::size_t i = 0; i < got.ids.size(); ++i) {
            const bool exists = probe.auditor().entry(got.ids[i]).has_value();
            const bool ok = exists ? got.found[i] == got.ids[i] : !got.found[i].has_value();
            const bool right = expect(probe, ok, [&] {
                return "get_by_ids position " + std::to_string(i) + " (" + in_quotes(got.ids[i]) + ") returned " +
                       (got.found[i] ? in_quotes(*got.found[i]) : std::string("none"));
            });
            if (!right) return;
        }
    }

    void got_all(const GotAll& got, Probe& probe) override {
        if (!checking(probe)) return;
        const ListingOrder order = probe.capabilities().policy.listing;
        const std::vector<std::string>& expected = probe.auditor().listing(order);
        expect(probe, listed_as_declared(got.ids, expected, order), [&] {
            return "get_all returned " + id_list(got.ids) + ", expected " + id_list(expected) + " (" + order_text(order) + ")";
        });
    }

    void listing(bool, Probe& probe) override {
        if (!checking(probe)) return;
        const ListingOrder order = probe.capabilities().policy.listing;
        const std::vector<std::string>& expected = probe.auditor().listing(order);
        expect(probe, listed_as_declared(probe.listed(), expected, order), [&] {
            return "the store lists " + id_list(probe.listed()) + ", expected " + id_list(expected) + " (" + order_text(order) + ")";
        });
    }

  private:
    // docs/semantics.md#declared-store-contracts: the listing order a store declares.
    static bool listed_as_declared(const std::vector<std::string>& listed, const std::vector<std::string>& expected,
                                   ListingOrder order) {
        if (order != ListingOrder::unordered) return listed == expected;
        return ids_difference(listed, expected, false).empty();
    }

    static std::string order_text(ListingOrder order) {
        switch (order) {
            case ListingOrder::insertion: return "insertion order";
            case ListingOrder::recency: return "recency order, least recently used first";
            case ListingOrder::unordered: return "in any order";
        }
        return "";
    }

    // get hands back the item's metadata as it was stored.
    void check_metadata(const Made& made, Probe& probe) const {
        if (!made.object || !probe.capabilities().metadata || !checking(probe)) return;
        const Metadata got = probe.engine().handle_metadata(made.out);
        const Metadata& expected = probe.auditor().metadata(made.id);
        expect(probe, got == expected, [&] {
            return "get " + in_quotes(made.id) + ": " + handle_text(made.out) + " carries metadata " + metadata_text(got) +
                   ", expected " + metadata_text(expected);
        });
    }

    // docs/semantics.md#store: "none only if no cache is found" is as right
    // as none, as long as the cache holds nothing of the store's.
    void check_holds_no_kv(const Made& made, const std::string& what, Probe& probe) const {
        if (!checking(probe) || !made.object) return;
        const std::string held = kv_held(probe.engine().view_handle(made.out));
        expect(probe, held.empty(), [&] {
            return what + " " + handle_text(made.out) + ": no id it names holds tokens, but its " + held +
                   " (expected none, or a cache holding no K/V)";
        });
    }

    void check_exists(const Made& made, const std::string& what, Probe& probe) const {
        if (!checking(probe)) return;
        const bool expected = made.object.has_value();
        expect(probe, probe.handle(made.out).exists == expected, [&] {
            return what + " " + handle_text(made.out) + (expected ? " holds no cache, expected one" : " holds a cache, expected none");
        });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::store_contract>() {
    return std::make_unique<StoreContract>();
}

}  // namespace kvcheck::checkers
