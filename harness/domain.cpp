#include "kvcheck/domain.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>

namespace kvcheck {
namespace {

// The most layers a declared model may have: far above any real model's,
// low enough that a trace's caches stay in memory.
constexpr std::int64_t model_layers_max = 1024;

template <typename T>
bool has_repeat(const std::vector<T>& items) {
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (std::count(items.begin(), items.end(), items[i]) > 1) return true;
    }
    return false;
}

// docs/semantics.md#declared-store-contracts
std::string policy_fault(const StorePolicy& policy) {
    if (policy.capacity_items < 0) return "store_policy: 'capacity_items' must be 0 (no bound) or more, not " + std::to_string(policy.capacity_items);
    if (policy.capacity_bytes < 0) return "store_policy: 'capacity_bytes' must be 0 (no bound) or more, not " + std::to_string(policy.capacity_bytes);
    if (policy.eviction != Eviction::none && !policy.bounded()) {
        return std::string("store_policy: 'eviction' is ") + eviction_name(policy.eviction) +
               ", but no capacity is declared ('capacity_items' or 'capacity_bytes')";
    }
    return "";
}

std::string model_fault(const ModelDomain& model) {
    if (model.layers < 1 || model.layers > model_layers_max) {
        return "model: 'layers' must be in [1, " + std::to_string(model_layers_max) + "], not " + std::to_string(model.layers);
    }
    if (model.heads < 1 || model.heads > cache_heads_max) {
        return "model: 'heads' must be in [1, " + std::to_string(cache_heads_max) + "], not " + std::to_string(model.heads);
    }
    if (model.head_dim < 1 || model.head_dim > cache_head_dim_max) {
        return "model: 'head_dim' must be in [1, " + std::to_string(cache_head_dim_max) + "], not " +
               std::to_string(model.head_dim);
    }
    if (model.dtypes.empty()) return "model: 'dtypes' is empty (give at least one of f32, f16, bf16)";
    if (has_repeat(model.dtypes)) return "model: 'dtypes' names a dtype twice";
    if (model.layouts.empty()) return "model: 'layouts' is empty (give modern, legacy or both)";
    if (has_repeat(model.layouts)) return "model: 'layouts' names a layout twice";
    return "";
}

std::string joined(const ModelDomain& model, bool dtypes) {
    std::string text;
    const std::size_t count = dtypes ? model.dtypes.size() : model.layouts.size();
    for (std::size_t i = 0; i < count; ++i) {
        text += (i == 0 ? "" : "+") + std::string(dtypes ? dtype_name(model.dtypes[i]) : layout_name(model.layouts[i]));
    }
    return text;
}

bool odd_layer(const LayerSpec& layer, Layout layout) {
    if (layout == Layout::legacy) return false;  // a legacy layer is a key and a value, always
    return layer.slots != 0b0011 || !layer.initialized;
}

std::int64_t whole_number(const std::string& key, const std::string& value) {
    const bool digits = !value.empty() && value.size() <= 9 && value.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) throw std::invalid_argument("'" + key + "' takes a whole number, not '" + value + "'");
    return std::strtoll(value.c_str(), nullptr, 10);
}

// The words of `value` split at '+', each read by `read`.
template <typename T, typename Read>
std::vector<T> plus_list(const std::string& key, const std::string& value, Read read) {
    std::vector<T> items;
    std::size_t start = 0;
    for (;;) {
        const std::size_t end = value.find('+', start);
        const std::string word = value.substr(start, end == std::string::npos ? std::string::npos : end - start);
        const std::optional<T> item = read(word);
        if (!item) throw std::invalid_argument("'" + key + "': unknown value '" + word + "'");
        if (std::find(items.begin(), items.end(), *item) != items.end()) {
            throw std::invalid_argument("'" + key + "' names '" + word + "' twice");
        }
        items.push_back(*item);
        if (end == std::string::npos) return items;
        start = end + 1;
    }
}

std::optional<Dtype> dtype_named(const std::string& word) {
    for (Dtype dtype : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
        if (word == dtype_name(dtype)) return dtype;
    }
    return std::nullopt;
}

std::optional<Layout> layout_named(const std::string& word) {
    for (Layout layout : {Layout::modern, Layout::legacy}) {
        if (word == layout_name(layout)) return layout;
    }
    return std::nullopt;
}

}  // namespace

const char* eviction_name(Eviction eviction) {
    switch (eviction) {
        case Eviction::none: return "none";
        case Eviction::lru: return "lru";
        case Eviction::fifo: return "fifo";
        case Eviction::unspecified: return "unspecified";
        case Eviction::lrs: return "lrs";
    }
    return "?";
}

const char* listing_name(ListingOrder listing) {
    switch (listing) {
        case ListingOrder::insertion: return "insertion";
        case ListingOrder::recency: return "recency";
        case ListingOrder::unordered: return "unordered";
    }
    return "?";
}

std::optional<Eviction> parse_eviction(const std::string& text) {
    for (Eviction e : {Eviction::none, Eviction::lru, Eviction::fifo, Eviction::unspecified, Eviction::lrs}) {
        if (text == eviction_name(e)) return e;
    }
    return std::nullopt;
}

std::optional<ListingOrder> parse_listing(const std::string& text) {
    for (ListingOrder l : {ListingOrder::insertion, ListingOrder::recency, ListingOrder::unordered}) {
        if (text == listing_name(l)) return l;
    }
    return std::nullopt;
}

bool ModelDomain::holds(Dtype dtype) const { return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end(); }

bool ModelDomain::holds(Layout layout) const { return std::find(layouts.begin(), layouts.end(), layout) != layouts.end(); }

std::string capabilities_fault(const Capabilities& c) {
    if (!c.modern_layout && !c.legacy_layout) {
        return "modern_layout and legacy_layout are both false: the engine takes no cache at all";
    }
    if (!c.store && !c.paged) return "store and paged are both false: the engine has no operation at all";
    const std::string policy = policy_fault(c.policy);
    if (!policy.empty()) return policy;
    if (c.lease_ttl_ms < 0) return "lease_ttl_ms is " + std::to_string(c.lease_ttl_ms) + ": a lease lives 1 ms or more (0: no leases)";
    const ModelDomain& model = c.model;
    if (!model.declared) return "";
    const std::string fault = model_fault(model);
    if (!fault.empty()) return fault;
    for (Layout layout : model.layouts) {
        const bool taken = layout == Layout::modern ? c.modern_layout : c.legacy_layout;
        if (!taken) {
            return std::string("model: 'layouts' holds ") + layout_name(layout) + ", but the engine's " + layout_name(layout) +
                   "_layout capability is false";
        }
    }
    for (Dtype dtype : model.dtypes) {
        if (dtype != Dtype::f32 && !c.half_dtypes) {
            return std::string("model: 'dtypes' holds ") + dtype_name(dtype) + ", but the engine's half_dtypes capability is false";
        }
    }
    if ((model.heads != cache_heads || model.head_dim != cache_head_dim) && !c.any_geometry) {
        return "model: 'heads' x 'head_dim' is " + std::to_string(model.heads) + "x" + std::to_string(model.head_dim) +
               ", but the engine's any_geometry capability is false (it takes 2x4 only)";
    }
    return "";
}

std::string spec_fault(const ModelDomain& model, const CacheSpec& spec) {
    if (!model.declared) return "";
    if (static_cast<std::int64_t>(spec.layers.size()) != model.layers) {
        return std::to_string(spec.layers.size()) + " layers, not " + std::to_string(model.layers);
    }
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        const std::int64_t tokens = spec.layers[i].tokens;
        if (tokens < 1) return "layer " + std::to_string(i) + " holds no token";
        if (tokens != spec.layers.front().tokens) {
            return "layer " + std::to_string(i) + " holds " + std::to_string(tokens) + " tokens, layer 0 " +
                   std::to_string(spec.layers.front().tokens);
        }
        if (!model.odd_layers && odd_layer(spec.layers[i], spec.layout)) return "layer " + std::to_string(i) + " is odd";
    }
    if (spec.heads != model.heads || spec.head_dim != model.head_dim) {
        return "geometry " + std::to_string(spec.heads) + "x" + std::to_string(spec.head_dim) + ", not " +
               std::to_string(model.heads) + "x" + std::to_string(model.head_dim);
    }
    if (!model.holds(spec.dtype)) return std::string("dtype ") + dtype_name(spec.dtype) + " is not the model's";
    if (!model.holds(spec.layout)) return std::string("layout ") + layout_name(spec.layout) + " is not the model's";
    return "";
}

Layout fresh_layout(const Capabilities& c) {
    const bool modern = c.modern_layout && (!c.model.declared || c.model.holds(Layout::modern));
    return modern ? Layout::modern : Layout::legacy;
}

std::string domain_text(const ModelDomain& model) {
    if (!model.declared) return "any (undeclared)";
    return "layers=" + std::to_string(model.layers) + " heads=" + std::to_string(model.heads) +
           " head_dim=" + std::to_string(model.head_dim) + " dtype=" + joined(model, true) +
           " layout=" + joined(model, false) + (model.odd_layers ? " odd_layers=yes" : "");
}

ModelDomain parse_model_domain(const std::string& text) {
    std::map<std::string, std::string> pairs;
    std::size_t start = 0;
    while (start <= text.size()) {
        std::size_t end = text.find_first_of(", ", start);
        if (end == std::string::npos) end = text.size();
        const std::string pair = text.substr(start, end - start);
        start = end + 1;
        if (pair.empty()) continue;
        const std::size_t eq = pair.find('=');
        if (eq == std::string::npos) throw std::invalid_argument("'" + pair + "' is not key=value");
        const std::string key = pair.substr(0, eq);
        if (!pairs.emplace(key, pair.substr(eq + 1)).second) throw std::invalid_argument("'" + key + "' is given twice");
    }
    ModelDomain model;
    model.declared = true;
    for (const char* required : {"layers", "dtype", "layout"}) {
        if (pairs.count(required) == 0) throw std::invalid_argument(std::string("'") + required + "' is missing");
    }
    for (const auto& pair : pairs) {
        const std::string& key = pair.first;
        const std::string& value = pair.second;
        if (key == "layers") {
            model.layers = whole_number(key, value);
        } else if (key == "heads") {
            model.heads = whole_number(key, value);
        } else if (key == "head_dim") {
            model.head_dim = whole_number(key, value);
        } else if (key == "dtype") {
            model.dtypes = plus_list<Dtype>(key, value, dtype_named);
        } else if (key == "layout") {
            model.layouts = plus_list<Layout>(key, value, layout_named);
        } else if (key == "odd_layers") {
            if (value != "yes" && value != "no") throw std::invalid_argument("'odd_layers' takes yes or no, not '" + value + "'");
            model.odd_layers = value == "yes";
        } else {
            throw std::invalid_argument("unknown key '" + key + "' (known: layers, heads, head_dim, dtype, layout, odd_layers)");
        }
    }
    const std::string fault = model_fault(model);
    if (!fault.empty()) throw std::invalid_argument(fault.substr(std::string("model: ").size()));
    return model;
}

}  // namespace kvcheck
