// What the harness knows of every operation, whatever the operation: names
// and kinds, traits (kvcheck/trace.h, "operation traits"), equality and
// hashing, each written once over the op structs' fields (Boost.PFR). The
// static_asserts below say what an op struct must state and contain:
// adding an op to the variant needs no change here.
#include "kvcheck/trace.h"

#include "kvcheck/splitmix.h"

#include <boost/pfr.hpp>

#include <functional>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kvcheck {
namespace {

// ---- what an op struct may contain -----------------------------------------

template <typename O, std::size_t... I>
constexpr bool field_types_supported(std::index_sequence<I...>) {
    return (detail::is_field_type_v<boost::pfr::tuple_element_t<I, O>> && ...);
}

template <typename O, std::size_t... I>
constexpr bool variable_field_last(std::index_sequence<I...>) {
    return (((!detail::is_variable_v<boost::pfr::tuple_element_t<I, O>> &&
              !detail::is_optional_v<boost::pfr::tuple_element_t<I, O>>) ||
             I + 1 == sizeof...(I)) &&
            ...);
}

// The traits every operation states (trace.h, "operation traits"), with the
// types the harness reads them as: an operation missing one does not compile.
template <typename O>
constexpr bool op_traits_stated() {
    static_assert(std::is_same_v<decltype(O::reach), const StoreReach>, "an op must state its `reach`");
    static_assert(std::is_same_v<decltype(O::changes_ids), const bool>, "an op must state `changes_ids`");
    static_assert(std::is_same_v<decltype(O::needs), const std::uint16_t>, "an op must state the capabilities it `needs`");
    static_assert(std::is_same_v<decltype(O::list_min), const std::size_t>, "an op must state `list_min`");
    static_assert(std::is_same_v<decltype(std::declval<const O&>().well_formed()), bool>,
                  "an op must say when it is `well_formed()`");
    return true;
}

template <typename O>
constexpr bool op_struct_valid() {
    static_assert(op_traits_stated<O>());
    constexpr std::size_t count = boost::pfr::tuple_size_v<O>;
    static_assert(count == O::fields.size(), "an op's `fields` must name each of its fields");
    static_assert(field_types_supported<O>(std::make_index_sequence<count>{}),
                  "an op field must be HandleName, std::string, CacheSpec, std::int64_t, Tokens, Ids, HandleNames or MetaSeed");
    static_assert(variable_field_last<O>(std::make_index_sequence<count>{}),
                  "only an op's last field may be variable-length (Ids, HandleNames) or optional (MetaSeed)");
    if constexpr (detail::has_out<O>()) {
        static_assert(std::is_same_v<boost::pfr::tuple_element_t<0, O>, HandleName>,
                      "an `out` field must be a HandleName");
    }
    return true;
}

template <std::size_t... K>
constexpr std::array<const char*, op_kind_count> names_of_kinds(std::index_sequence<K...>) {
    static_assert((op_struct_valid<std::variant_alternative_t<K, Op>>() && ...));
    return {std::variant_alternative_t<K, Op>::name...};
}

constexpr std::array<const char*, op_kind_count> kind_names = names_of_kinds(std::make_index_sequence<op_kind_count>{});

template <std::size_t... K>
constexpr std::array<std::uint16_t, op_kind_count> needs_of_kinds(std::index_sequence<K...>) {
    return {std::variant_alternative_t<K, Op>::needs...};
}

constexpr std::array<std::uint16_t, op_kind_count> kind_needs = needs_of_kinds(std::make_index_sequence<op_kind_count>{});

constexpr bool kind_names_unique() {
    for (std::size_t a = 0; a < op_kind_count; ++a) {
        for (std::size_t b = a + 1; b < op_kind_count; ++b) {
            if (std::string_view(kind_names[a]) == kind_names[b]) return false;
        }
    }
    return true;
}
static_assert(kind_names_unique(), "two ops share a name; the text could not tell them apart");

// ---- hashing: one overload per field type -----------------------------------

void mix(std::size_t& seed, std::size_t value) {
    seed ^= value + static_cast<std::size_t>(0x9e3779b97f4a7c15ULL) + (seed << 6) + (seed >> 2);
}

std::size_t field_hash(HandleName handle) { return std::hash<std::int64_t>{}(handle.value); }
// Mixed: the paged operations' fields are small numbers side by side
// (seq, parent, child), which an identity hash combined by `mix` collides.
std::size_t field_hash(std::int64_t value) { return static_cast<std::size_t>(splitmix64(static_cast<std::uint64_t>(value))); }
std::size_t field_hash(const std::string& id) { return std::hash<std::string>{}(id); }
std::size_t field_hash(MetaSeed meta) { return std::hash<std::int64_t>{}(meta.value); }

std::size_t field_hash(const CacheSpec& spec) {
    std::size_t seed = 0;
    mix(seed, static_cast<std::size_t>(spec.layout));
    mix(seed, static_cast<std::size_t>(spec.dtype));
    mix(seed, std::hash<std::uint64_t>{}(spec.seed));
    mix(seed, field_hash(spec.heads));
    mix(seed, field_hash(spec.head_dim));
    mix(seed, spec.layers.size());
    for (const LayerSpec& layer : spec.layers) {
        mix(seed, layer.slots);
        mix(seed, layer.initialized);
        mix(seed, field_hash(layer.tokens));
    }
    return seed;
}

template <typename T>
std::size_t field_hash(const std::vector<T>& values) {
    std::size_t seed = values.size();
    for (const T& value : values) mix(seed, field_hash(value));
    return seed;
}

}  // namespace

std::string op::fill_id(std::int64_t index) { return "i" + std::to_string(index); }

Metadata item_metadata(MetaSeed seed) {
    Metadata metadata;
    if (seed.value == 0) return metadata;
    SplitMix64 stream(static_cast<std::uint64_t>(seed.value));
    metadata["source"] = "doc-" + std::to_string(stream.next() % 1000);
    if (stream.next() % 2 == 0) metadata["turn"] = std::to_string(stream.next() % 50);
    // Text a careless format would mangle: spaces, separators, quotes.
    if (stream.next() % 3 == 0) metadata["note"] = "k=v, \"quoted\"; " + std::to_string(stream.next() % 7);
    return metadata;
}

// A valueless Op (index variant_npos) throws std::out_of_range.
const char* op_name(const Op& op) { return op_kind_name(op.index()); }

const char* op_kind_name(std::size_t kind) {
    if (kind >= op_kind_count) throw std::out_of_range("op kind " + std::to_string(kind) + " is out of range");
    return kind_names[kind];
}

StoreReach op_reach(const Op& op) {
    return std::visit([](const auto& o) { return std::decay_t<decltype(o)>::reach; }, op);
}

bool op_changes_ids(const Op& op) {
    return std::visit([](const auto& o) { return std::decay_t<decltype(o)>::changes_ids; }, op);
}

std::uint16_t op_needs(std::size_t kind) {
    if (kind >= op_kind_count) throw std::out_of_range("op kind " + std::to_string(kind) + " is out of range");
    return kind_needs[kind];
}

bool op_well_formed(const Op& op) {
    return std::visit([](const auto& o) { return o.well_formed(); }, op);
}

bool engine_supports(const Capabilities& capabilities, std::uint16_t needs) {
    if ((needs & needs_dump) && !capabilities.dump) return false;
    if ((needs & needs_dump_crash) && !capabilities.dump_crash) return false;
    if ((needs & needs_stream) && !capabilities.generate_stream) return false;
    if ((needs & needs_conversions) &&
        !(capabilities.conversions && capabilities.legacy_layout && capabilities.modern_layout)) {
        return false;
    }
    if ((needs & needs_dump_kill) && !capabilities.dump_kill) return false;
    if ((needs & needs_returned) && !capabilities.returned_caches) return false;
    if ((needs & needs_paged) && !capabilities.paged) return false;
    if ((needs & needs_paged_fork) && !capabilities.paged_fork) return false;
    if ((needs & needs_paged_import) && !capabilities.paged_import) return false;
    if ((needs & needs_paged_rewind) && !capabilities.paged_rewind) return false;
    if ((needs & needs_trim) && !capabilities.trim) return false;
    if ((needs & needs_leases) && capabilities.lease_ttl_ms <= 0) return false;
    if ((needs & needs_batch) && !capabilities.batch) return false;
    if (!(needs & needs_paged) && !capabilities.store) return false;
    return true;
}

bool engine_supports(const Capabilities& capabilities, const CacheSpec& spec) {
    if (spec.layout == Layout::legacy && !capabilities.legacy_layout) return false;
    if (spec.layout == Layout::modern && !capabilities.modern_layout) return false;
    if (spec.dtype != Dtype::f32 && !capabilities.half_dtypes) return false;
    const bool default_geometry = spec.heads == cache_heads && spec.head_dim == cache_head_dim;
    if (!default_geometry && !capabilities.any_geometry) return false;
    for (const LayerSpec& layer : spec.layers) {
        const bool one_sided = (layer.slots & 0b11) == 0b01 || (layer.slots & 0b11) == 0b10;
        if (one_sided && !capabilities.one_sided_layers) return false;
        if ((layer.slots & 0b1100) != 0 && !capabilities.legacy_slot_names) return false;
        if (!layer.initialized && !capabilities.uninitialized_layers) return false;
    }
    return true;
}

bool engine_supports(const Capabilities& capabilities, const Op& op) {
    if (!engine_supports(capabilities, op_needs(op.index()))) return false;
    bool supported = true;
    std::visit(
        [&](const auto& o) {
            boost::pfr::for_each_field(o, [&](const auto& field) {
                if constexpr (std::is_same_v<std::decay_t<decltype(field)>, CacheSpec>) {
                    supported = supported && engine_supports(capabilities, field);
                }
            });
        },
        op);
    return supported;
}

std::int64_t created_handle(const Op& op) {
    return std::visit(
        [](const auto& alternative) -> std::int64_t {
            if constexpr (detail::has_out<std::decay_t<decltype(alternative)>>()) {
                return boost::pfr::get<0>(alternative).value;
            } else {
                return 0;
            }
        },
        op);
}

bool operator==(const Op& a, const Op& b) {
    if (a.index() != b.index()) return false;
    return std::visit(
        [&b](const auto& alternative) {
            return boost::pfr::eq_fields(alternative, std::get<std::decay_t<decltype(alternative)>>(b));
        },
        a);
}

std::size_t hash_op(const Op& op) {
    std::size_t seed = op.index();
    std::visit([&seed](const auto& alternative) {
        boost::pfr::for_each_field(alternative, [&seed](const auto& field) { mix(seed, field_hash(field)); });
    }, op);
    return seed;
}

}  // namespace kvcheck
