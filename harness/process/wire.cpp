#include "wire.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

namespace kvcheck::process {

namespace {

constexpr std::array<const char*, slot_count> slot_names{"keys", "values", "key_cache", "value_cache"};

Layout parse_layout(const std::string& text) {
    if (text == "modern") return Layout::modern;
    if (text == "legacy") return Layout::legacy;
    throw ProtocolError("unknown layout '" + text + "' (expected modern or legacy)");
}

Dtype parse_dtype(const std::string& text) {
    if (text == "f32") return Dtype::f32;
    if (text == "f16") return Dtype::f16;
    if (text == "bf16") return Dtype::bf16;
    throw ProtocolError("unknown dtype '" + text + "' (expected f32, f16 or bf16)");
}

template <typename Read>
auto in_member(const char* name, Read read) -> decltype(read()) {
    try {
        return read();
    } catch (const JsonError& error) {
        throw ProtocolError(std::string("'") + name + "': " + error.what());
    }
}

SlotView read_slot_view(const Json& slot) {
    SlotView view;
    if (slot.is_null()) return view;
    view.present = true;
    view.dtype = parse_dtype(read_string(slot, "dtype"));
    view.shape = read_ints(slot, "shape");
    view.hash = read_uint(slot, "hash");
    // docs/protocol.md section 5: an engine with a content tolerance sends
    // a slot's values too.
    if (const Json* values = slot.find("values"); values != nullptr && !values->is_null()) {
        in_member("values", [&] {
            for (const Json& value : values->as_array()) view.values.push_back(static_cast<float>(value.as_number()));
            return 0;
        });
    }
    return view;
}

// docs/protocol.md section 3: {"abs": a, "rel": r}, each a number >= 0
// (a missing one 0).
ContentTolerance read_tolerance(const Json& json) {
    for (const Json::Member& member : json.as_object()) {
        if (member.first != "abs" && member.first != "rel") throw ProtocolError("unknown key '" + member.first + "' (known: abs, rel)");
    }
    ContentTolerance tolerance;
    const auto read = [&json](const char* key, double& into) {
        const Json* found = json.find(key);
        if (found == nullptr) return;
        into = found->as_number();
        if (!(into >= 0) || !std::isfinite(into)) throw ProtocolError(std::string("'") + key + "' must be a finite number >= 0");
    };
    read("abs", tolerance.abs);
    read("rel", tolerance.rel);
    return tolerance;
}

}  // namespace

void append_content(std::string& out, const CacheContent& content) {
    out += "{\"layout\":\"";
    out += layout_name(content.layout);
    out += "\",\"dtype\":\"";
    out += dtype_name(content.dtype);
    out += "\",\"heads\":";
    json_append_int(out, content.heads);
    out += ",\"head_dim\":";
    json_append_int(out, content.head_dim);
    out += ",\"layers\":[";
    for (std::size_t i = 0; i < content.layers.size(); ++i) {
        const LayerContent& layer = content.layers[i];
        if (i > 0) out += ',';
        out += "{\"initialized\":";
        json_append_bool(out, layer.initialized);
        out += ",\"slots\":[";
        for (int s = 0; s < slot_count; ++s) {
            if (s > 0) out += ',';
            const SlotContent& slot = layer.slots[static_cast<std::size_t>(s)];
            if (!slot.present) {
                out += "null";
                continue;
            }
            out += '[';
            for (std::size_t k = 0; k < slot.segments.size(); ++k) {
                // A window's suffix of a segment is only ever compared, never sent.
                if (slot.segments[k].first != 0) throw std::logic_error("wire: a segment starting past its first token");
                if (k > 0) out += ',';
                out += '[';
                json_append_uint(out, slot.segments[k].seed);
                out += ',';
                json_append_int(out, slot.segments[k].tokens);
                out += ",\"";
                out += dtype_name(slot.segments[k].precision);
                out += "\"]";
            }
            out += ']';
        }
        out += "]}";
    }
    out += "]}";
}

Request::Request(std::string_view op) : text_("{\"op\":") { json_append_string(text_, op); }

std::string& Request::member(std::string_view name) {
    text_ += ',';
    json_append_string(text_, name);
    text_ += ':';
    return text_;
}

Request& Request::field(std::string_view name, std::string_view text) {
    json_append_string(member(name), text);
    return *this;
}

Request& Request::field(std::string_view name, std::int64_t value) {
    json_append_int(member(name), value);
    return *this;
}

Request& Request::flag(std::string_view name, bool value) {
    json_append_bool(member(name), value);
    return *this;
}

Request& Request::field(std::string_view name, const std::vector<std::string>& items) {
    append_strings(member(name), items);
    return *this;
}

Request& Request::field(std::string_view name, const std::vector<std::int64_t>& items) {
    append_ints(member(name), items);
    return *this;
}

Request& Request::field(std::string_view name, const CacheContent& content) {
    append_content(member(name), content);
    return *this;
}

Request& Request::field(std::string_view name, const Metadata& metadata) {
    std::string& out = member(name);
    out += '{';
    bool first = true;
    for (const auto& [key, value] : metadata) {
        if (!first) out += ',';
        first = false;
        json_append_string(out, key);
        out += ':';
        json_append_string(out, value);
    }
    out += '}';
    return *this;
}

void append_strings(std::string& out, const std::vector<std::string>& items) {
    out += '[';
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ',';
        json_append_string(out, items[i]);
    }
    out += ']';
}

void append_ints(std::string& out, const std::vector<std::int64_t>& items) {
    out += '[';
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ',';
        json_append_int(out, items[i]);
    }
    out += ']';
}

const Json& member(const Json& object, const char* name) {
    if (object.type() != Json::Type::object) {
        throw ProtocolError(std::string("expected an object holding '") + name + "', found " + object.type_name());
    }
    const Json* found = object.find(name);
    if (found == nullptr) throw ProtocolError(std::string("missing member '") + name + "'");
    return *found;
}

bool read_bool(const Json& object, const char* name) {
    return in_member(name, [&] { return member(object, name).as_bool(); });
}

std::int64_t read_int(const Json& object, const char* name) {
    return in_member(name, [&] { return member(object, name).as_int(); });
}

std::uint64_t read_uint(const Json& object, const char* name) {
    return in_member(name, [&] { return member(object, name).as_uint(); });
}

std::string read_string(const Json& object, const char* name) {
    return in_member(name, [&] { return member(object, name).as_string(); });
}

std::vector<std::string> read_strings(const Json& object, const char* name) {
    return in_member(name, [&] {
        std::vector<std::string> items;
        for (const Json& item : member(object, name).as_array()) items.push_back(item.as_string());
        return items;
    });
}

std::vector<std::int64_t> read_ints(const Json& object, const char* name) {
    return in_member(name, [&] {
        std::vector<std::int64_t> items;
        for (const Json& item : member(object, name).as_array()) items.push_back(item.as_int());
        return items;
    });
}

std::vector<std::uint64_t> read_uints(const Json& object, const char* name) {
    return in_member(name, [&] {
        std::vector<std::uint64_t> items;
        const std::vector<Json>& array = member(object, name).as_array();
        items.reserve(array.size());
        for (const Json& item : array) items.push_back(item.as_uint());
        return items;
    });
}

CacheView read_view(const Json& json) {
    CacheView view;
    view.layout = parse_layout(read_string(json, "layout"));
    const Json& layers = member(json, "layers");
    in_member("layers", [&] {
        for (const Json& layer : layers.as_array()) {
            LayerView layer_view;
            layer_view.initialized = read_bool(layer, "initialized");
            const std::vector<Json>& slots = member(layer, "slots").as_array();
            if (slots.size() != slot_count) {
                throw ProtocolError("a layer's 'slots' holds " + std::to_string(slots.size()) + " entries, expected " +
                                    std::to_string(slot_count) + " (keys, values, key_cache, value_cache)");
            }
            for (std::size_t s = 0; s < slot_count; ++s) {
                try {
                    layer_view.slots[s] = read_slot_view(slots[s]);
                } catch (const std::exception& error) {
                    throw ProtocolError(std::string("slot ") + slot_names[s] + ": " + error.what());
                }
            }
            view.layers.push_back(std::move(layer_view));
        }
        return 0;
    });
    return view;
}

std::optional<std::uint64_t> read_digest(const Json& facts) {
    if (facts.find("digest") != nullptr) return read_uint(facts, "digest");
    if (const Json* view = facts.find("view")) {
        try {
            return view_digest(read_view(*view));
        } catch (const std::exception& error) {
            throw ProtocolError(std::string("'view': ") + error.what());
        }
    }
    return std::nullopt;
}

Metadata read_metadata(const Json& object) {
    Metadata metadata;
    for (const auto& [key, value] : object.as_object()) metadata[key] = value.as_string();
    return metadata;
}

namespace {

// A declared free order: "back", "front", "front-unhashed", "lru" or "unspecified".
PagedFreeOrder parse_free_order(const std::string& text) {
    if (text == "back") return PagedFreeOrder::back;
    if (text == "front") return PagedFreeOrder::front;
    if (text == "front-unhashed") return PagedFreeOrder::front_unhashed;
    if (text == "lru") return PagedFreeOrder::lru;
    if (text == "unspecified") return PagedFreeOrder::unspecified;
    throw ProtocolError("unknown free order '" + text + "' (known: back, front, front-unhashed, lru, unspecified)");
}

}  // namespace

Capabilities read_capabilities(const Json& flags) {
    Capabilities capabilities;
    // Its dump cannot run in a fork of kvcheck's process: dump_kill applies
    // only when the handshake offers dump_fork (AdapterProcess::read_dump_fork).
    capabilities.dump_kill = false;
    // A rewind is asked only of an adapter that claims it (protocol 4's
    // adapters written before it have none).
    capabilities.paged_rewind = false;
    // A free order is checked only when the adapter declares one.
    capabilities.paged_free_order = PagedFreeOrder::unspecified;
    const std::array<std::pair<const char*, bool*>, 25> known{{
        {"modern_layout", &capabilities.modern_layout},
        {"legacy_layout", &capabilities.legacy_layout},
        {"one_sided_layers", &capabilities.one_sided_layers},
        {"legacy_slot_names", &capabilities.legacy_slot_names},
        {"uninitialized_layers", &capabilities.uninitialized_layers},
        {"half_dtypes", &capabilities.half_dtypes},
        {"conversions", &capabilities.conversions},
        {"dump", &capabilities.dump},
        {"dump_crash", &capabilities.dump_crash},
        {"generate_stream", &capabilities.generate_stream},
        {"storage_identity", &capabilities.storage_identity},
        {"copy_log", &capabilities.copy_log},
        {"owned_marker", &capabilities.owned_marker},
        {"entry_versions", &capabilities.entry_versions},
        {"metadata", &capabilities.metadata},
        {"any_geometry", &capabilities.any_geometry},
        // Protocol 4: caches the model makes (generate_returning, extract, fed_view).
        {"returned_caches", &capabilities.returned_caches},
        // The paged family (docs/protocol.md, "Paged requests").
        {"paged", &capabilities.paged},
        {"store", &capabilities.store},
        {"paged_fork", &capabilities.paged_fork},
        {"paged_import", &capabilities.paged_import},
        {"paged_rewind", &capabilities.paged_rewind},
        // trim (docs/protocol.md, "Trimming"): off unless claimed.
        {"trim", &capabilities.trim},
        // Concurrent requests (docs/protocol.md section 11a): off unless claimed.
        {"thread_safe", &capabilities.thread_safe},
        // batch (docs/protocol.md, "Batches"): off unless claimed.
        {"batch", &capabilities.batch},
    }};
    const std::vector<Json::Member>& members =
        in_member("capabilities", [&]() -> const std::vector<Json::Member>& { return flags.as_object(); });
    for (const Json::Member& member : members) {
        // Named references, not a structured binding: C++17 lets no lambda
        // capture a structured binding (g++ accepts it, clang refuses).
        const std::string& name = member.first;
        const Json& value = member.second;
        if (name == "paged_free_order") {
            capabilities.paged_free_order = in_member("paged_free_order", [&] { return parse_free_order(value.as_string()); });
            continue;
        }
        // Read leases (docs/protocol.md, "Leases"): their TTL in ms of kvcheck's clock.
        if (name == "lease_ttl_ms") {
            capabilities.lease_ttl_ms = in_member("lease_ttl_ms", [&] { return value.as_int(); });
            continue;
        }
        if (name == "content_tolerance") {
            capabilities.content_tolerance = in_member("content_tolerance", [&] { return read_tolerance(value); });
            continue;
        }
        if (name == "window") {
            capabilities.window = in_member("window", [&] {
                const std::int64_t window = value.as_int();
                if (window < 0) throw ProtocolError("must be 0 (no window) or a token count, got " + std::to_string(window));
                return window;
            });
            continue;
        }
        bool found = false;
        for (const auto& [known_name, flag] : known) {
            if (name != known_name) continue;
            *flag = in_member(known_name, [&] { return value.as_bool(); });
            found = true;
        }
        if (!found) {
            std::string names;
            for (const auto& entry : known) names += std::string(names.empty() ? "" : ", ") + entry.first;
            names += ", paged_free_order, lease_ttl_ms, window, content_tolerance";
            throw ProtocolError("unknown capability '" + name + "' (known: " + names + ")");
        }
    }
    return capabilities;
}

namespace {

// The dtypes or layouts of a model, each name read by `parse`.
template <typename T, typename Parse>
std::vector<T> read_names(const Json& object, const char* name, Parse parse) {
    std::vector<T> items;
    for (const std::string& text : read_strings(object, name)) {
        try {
            items.push_back(parse(text));
        } catch (const ProtocolError& error) {
            throw ProtocolError(std::string("'") + name + "': " + error.what());
        }
    }
    return items;
}

// Refuses a member of `object` that is none of `keys`, naming them all.
void only_keys(const Json& object, const std::vector<const char*>& keys) {
    for (const auto& member : object.as_object()) {
        if (std::find_if(keys.begin(), keys.end(), [&](const char* key) { return member.first == key; }) != keys.end()) continue;
        std::string known;
        for (const char* key : keys) known += std::string(known.empty() ? "" : ", ") + key;
        throw ProtocolError("unknown key '" + member.first + "' (known: " + known + ")");
    }
}

ModelDomain read_model_members(const Json& object) {
    only_keys(object, {"layers", "heads", "head_dim", "dtypes", "layouts", "odd_layers"});
    ModelDomain model;
    model.declared = true;
    model.layers = read_int(object, "layers");
    model.heads = read_int(object, "heads");
    model.head_dim = read_int(object, "head_dim");
    model.dtypes = read_names<Dtype>(object, "dtypes", parse_dtype);
    model.layouts = read_names<Layout>(object, "layouts", parse_layout);
    model.odd_layers = read_bool(object, "odd_layers");
    return model;
}

}  // namespace

namespace {

// A handshake object read by `read`, every error of it named after `name`.
template <typename Read>
auto in_object(const char* name, Read read) -> decltype(read()) {
    try {
        return read();
    } catch (const JsonError& error) {
        throw ProtocolError(std::string("'") + name + "': " + error.what());
    } catch (const ProtocolError& error) {
        throw ProtocolError(std::string("'") + name + "': " + error.what());
    }
}

}  // namespace

ModelDomain read_model(const Json& object) {
    return in_object("model", [&] { return read_model_members(object); });
}

namespace {

StorePolicy read_policy_members(const Json& object) {
    only_keys(object, {"capacity_items", "capacity_bytes", "eviction", "listing"});
    StorePolicy policy;
    if (object.find("capacity_items") != nullptr) policy.capacity_items = read_int(object, "capacity_items");
    if (object.find("capacity_bytes") != nullptr) policy.capacity_bytes = read_int(object, "capacity_bytes");
    if (object.find("eviction") != nullptr) {
        const std::string text = read_string(object, "eviction");
        const std::optional<Eviction> eviction = parse_eviction(text);
        if (!eviction) throw ProtocolError("'eviction' is '" + text + "' (known: none, lru, fifo, lrs, unspecified)");
        policy.eviction = *eviction;
    }
    if (object.find("listing") != nullptr) {
        const std::string text = read_string(object, "listing");
        const std::optional<ListingOrder> listing = parse_listing(text);
        if (!listing) throw ProtocolError("'listing' is '" + text + "' (known: insertion, recency, unordered)");
        policy.listing = *listing;
    }
    return policy;
}

}  // namespace

StorePolicy read_policy(const Json& object) {
    return in_object("store_policy", [&] { return read_policy_members(object); });
}

std::vector<CopyRecord> read_copies(const Json& copies) {
    std::vector<CopyRecord> records;
    in_member("copies", [&] {
        for (const Json& copy : copies.as_array()) records.push_back({read_string(copy, "reason"), read_int(copy, "bytes")});
        return 0;
    });
    return records;
}

std::string printable_prefix(const std::string& bytes, std::size_t count_max) {
    std::string text;
    for (std::size_t i = 0; i < bytes.size() && i < count_max; ++i) {
        const unsigned char c = static_cast<unsigned char>(bytes[i]);
        if (c >= 0x20 && c < 0x7F) {
            text += static_cast<char>(c);
        } else {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
            text += escaped;
        }
    }
    if (bytes.size() > count_max) text += "...";
    return text;
}

}  // namespace kvcheck::process
