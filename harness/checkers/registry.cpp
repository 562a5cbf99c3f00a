// The property registry: ids, summaries, the capabilities each property
// needs (all from KVCHECK_PROPERTY_LIST, kvcheck/properties.h), and the
// checker of each. A property without a checker (make_checker<P> defined in
// its checkers/<name>.cpp) does not link.
#include "checkers/checker.h"

namespace kvcheck {
namespace {

struct PropertyInfo {
    Property property;
    const char* id;
    const char* summary;
    std::uint16_t needs;
};

constexpr std::array<PropertyInfo, property_count> property_table{{
#define KVCHECK_PROPERTY_INFO(name, id, summary, needs) {Property::name, id, summary, needs},
    KVCHECK_PROPERTY_LIST(KVCHECK_PROPERTY_INFO)
#undef KVCHECK_PROPERTY_INFO
}};

constexpr bool table_in_enum_order() {
    for (std::size_t i = 0; i < property_count; ++i) {
        if (static_cast<std::size_t>(property_table[i].property) != i) return false;
    }
    return true;
}
static_assert(table_in_enum_order());

}  // namespace

const char* property_id(Property property) { return property_table[static_cast<std::size_t>(property)].id; }

const char* property_summary(Property property) { return property_table[static_cast<std::size_t>(property)].summary; }

std::optional<Property> parse_property(const std::string& id) {
    for (const PropertyInfo& info : property_table) {
        if (id == info.id) return info.property;
    }
    return std::nullopt;
}

const std::array<Property, property_count>& all_properties() {
    static const std::array<Property, property_count> properties = [] {
        std::array<Property, property_count> list{};
        for (std::size_t i = 0; i < property_count; ++i) list[i] = property_table[i].property;
        return list;
    }();
    return properties;
}

bool paged_property(Property property) {
    return (property_table[static_cast<std::size_t>(property)].needs & property_needs_paged) != 0;
}

bool capacity_property(Property property) {
    return (property_table[static_cast<std::size_t>(property)].needs & property_needs_capacity) != 0;
}

PropertySet checkable(const Capabilities& capabilities) {
    PropertySet set = PropertySet::all();
    for (const PropertyInfo& info : property_table) {
        const bool missing = ((info.needs & property_needs_copy_log) && !capabilities.copy_log) ||
                             ((info.needs & property_needs_storage_identity) && !capabilities.storage_identity) ||
                             ((info.needs & property_needs_dump) && !capabilities.dump) ||
                             ((info.needs & property_needs_ownership) && !capabilities.owned_marker &&
                              !capabilities.storage_identity) ||
                             ((info.needs & property_needs_paged) && !capabilities.paged) ||
                             ((info.needs & property_needs_free_order) && capabilities.paged_free_order == PagedFreeOrder::unspecified) ||
                             ((info.needs & property_needs_capacity) && !capabilities.policy.bounded()) ||
                             ((info.needs & property_needs_trim) && !capabilities.trim) ||
                             ((info.needs & property_needs_leases) && capabilities.lease_ttl_ms <= 0) ||
                             ((info.needs & property_needs_batch) && !capabilities.batch) ||
                             (!(info.needs & property_needs_paged) && !capabilities.store);
        if (missing) set.remove(info.property);
    }
    // linearizable compares what concurrent requests read with the expected
    // content exactly: not under a content tolerance
    // (docs/semantics.md#content-tolerance).
    if (capabilities.content_tolerance.declared()) set.remove(Property::linearizable);
    return set;
}

namespace checkers {

std::vector<std::unique_ptr<Checker>> make_checkers() {
    std::vector<std::unique_ptr<Checker>> checkers;
#define KVCHECK_PROPERTY_CHECKER(name, id, summary, needs) checkers.push_back(make_checker<Property::name>());
    KVCHECK_PROPERTY_LIST(KVCHECK_PROPERTY_CHECKER)
#undef KVCHECK_PROPERTY_CHECKER
    return checkers;
}

}  // namespace checkers
}  // namespace kvcheck
