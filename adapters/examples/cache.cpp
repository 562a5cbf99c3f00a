#include "cache.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace vector_engine {
namespace {

bool fits_bf16(float value) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    return (bits & 0xFFFFu) == 0;
}

bool fits_f16(float value) {
    if (value == 0.0f) return true;
    const float magnitude = std::fabs(value);
    if (!(magnitude <= 65504.0f)) return false;
    int exponent = 0;
    std::frexp(magnitude, &exponent);  // magnitude = m * 2^exponent, m in [0.5, 1)
    // Scaled so that the last representable bit is 1: 10 fraction bits for a
    // normal half, a fixed 2^-24 step for a subnormal one.
    const int shift = exponent - 1 >= -14 ? 11 - exponent : 24;
    const double scaled = std::ldexp(static_cast<double>(magnitude), shift);
    return scaled == std::floor(scaled);
}

// Appends `piece` to `slot` along seq, in place: the storage keeps its
// identity and holds the longer sequence.
void append_in_place(Storage& slot, const Storage& piece) {
    if (slot.tokens == 0) {
        slot.heads = piece.heads;
        slot.head_dim = piece.head_dim;
    }
    if (piece.tokens > 0 && (piece.heads != slot.heads || piece.head_dim != slot.head_dim)) {
        throw std::invalid_argument("append: K/V of " + std::to_string(piece.heads) + "x" + std::to_string(piece.head_dim) +
                                    " onto " + std::to_string(slot.heads) + "x" + std::to_string(slot.head_dim));
    }
    const std::int64_t heads = slot.heads;
    const std::int64_t tokens = slot.tokens + piece.tokens;
    std::vector<float> grown;
    grown.reserve(static_cast<std::size_t>(heads * tokens * slot.head_dim));
    const std::int64_t old_block = slot.tokens * slot.head_dim;
    const std::int64_t new_block = piece.tokens * slot.head_dim;
    for (std::int64_t head = 0; head < heads; ++head) {
        const auto old_at = slot.values.begin() + head * old_block;
        const auto new_at = piece.values.begin() + head * new_block;
        grown.insert(grown.end(), old_at, old_at + old_block);
        grown.insert(grown.end(), new_at, new_at + new_block);
    }
    slot.values.swap(grown);
    slot.tokens = tokens;
    slot.dtype = promote(slot.dtype, piece.dtype);
}

// A slot grows by `piece`: in place when it holds elements, else it becomes
// a copy of the piece (the slot's own storage, never the caller's).
void grow(Tensor& slot, const Tensor& piece) {
    if (holds_elements(slot)) {
        append_in_place(*slot, *piece);
    } else {
        slot = copy_tensor(piece);
    }
}

// The pieces concatenated along seq into a new tensor of `dtype`.
Tensor cat(const std::vector<Tensor>& pieces, DType dtype) {
    std::int64_t tokens = 0;
    for (const Tensor& piece : pieces) tokens += piece->tokens;
    Tensor out = empty_tensor(dtype);
    for (const Tensor& piece : pieces) append_in_place(*out, *piece);
    out->dtype = dtype;
    assert(out->tokens == tokens);
    return out;
}

template <typename F>
void for_each_tensor(const Cache& cache, F visit) {
    if (cache.layout() == Layout::modern) {
        for (const LayerPtr& layer : *cache.layers()) {
            for (const Tensor& slot : layer->slots) {
                if (slot) visit(slot);
            }
        }
        return;
    }
    for (const Tensor& t : *cache.key_cache()) {
        if (t) visit(t);
    }
    for (const Tensor& t : *cache.value_cache()) {
        if (t) visit(t);
    }
}

bool has_any_tensor(const Cache& cache) {
    bool any = false;
    for_each_tensor(cache, [&any](const Tensor&) { any = true; });
    return any;
}

std::uint64_t identity(const void* object) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(object)); }

}  // namespace

std::int64_t bytes_per_value(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

bool is_exact_in(DType dtype, float value) {
    switch (dtype) {
        case DType::f32: return true;
        case DType::f16: return fits_f16(value);
        case DType::bf16: return fits_bf16(value);
    }
    return false;
}

DType promote(DType a, DType b) { return a == b ? a : DType::f32; }

Tensor make_tensor(DType dtype, std::int64_t heads, std::int64_t tokens, std::int64_t head_dim, std::vector<float> values) {
    if (heads < 1 || head_dim < 1 || tokens < 0 || values.size() != static_cast<std::size_t>(heads * tokens * head_dim)) {
        throw std::invalid_argument("make_tensor: " + std::to_string(values.size()) + " values for " + std::to_string(heads) +
                                    " heads of " + std::to_string(tokens) + " tokens of " + std::to_string(head_dim));
    }
    for (float value : values) {
        if (!is_exact_in(dtype, value)) throw std::invalid_argument("make_tensor: a value is not exact in its dtype");
    }
    auto storage = std::make_shared<Storage>();
    storage->dtype = dtype;
    storage->heads = heads;
    storage->tokens = tokens;
    storage->head_dim = head_dim;
    storage->values = std::move(values);
    return storage;
}

Tensor empty_tensor(DType dtype) {
    auto storage = std::make_shared<Storage>();
    storage->dtype = dtype;
    return storage;
}

Tensor copy_tensor(const Tensor& tensor) { return tensor ? std::make_shared<Storage>(*tensor) : nullptr; }

bool holds_elements(const Tensor& tensor) { return tensor && tensor->tokens > 0; }

// ---- Cache -------------------------------------------------------------------

CachePtr Cache::make(Layout layout) {
    if (layout == Layout::modern) return from_layers(std::make_shared<LayerList>());
    return from_slots(std::make_shared<TensorList>(), std::make_shared<TensorList>());
}

CachePtr Cache::from_layers(std::shared_ptr<LayerList> layers) {
    assert(layers);
    CachePtr cache(new Cache(Layout::modern));
    cache->layers_ = std::move(layers);
    return cache;
}

CachePtr Cache::from_slots(std::shared_ptr<TensorList> key_cache, std::shared_ptr<TensorList> value_cache) {
    assert(key_cache);
    assert(value_cache);
    if (key_cache->size() != value_cache->size()) {
        throw std::invalid_argument("legacy cache: key_cache and value_cache differ in length");
    }
    CachePtr cache(new Cache(Layout::legacy));
    cache->key_cache_ = std::move(key_cache);
    cache->value_cache_ = std::move(value_cache);
    return cache;
}

std::size_t Cache::layer_count() const { return layout_ == Layout::modern ? layers_->size() : key_cache_->size(); }

void Cache::update(const Tensor& k, const Tensor& v, std::size_t layer_index) {
    if (!k || !v) throw std::invalid_argument("update needs both k and v");
    if (k->tokens != v->tokens || k == v) throw std::invalid_argument("update: k and v must be distinct and equally long");
    if (layout_ == Layout::modern) {
        while (layers_->size() <= layer_index) layers_->push_back(std::make_shared<Layer>());
        Layer& layer = *(*layers_)[layer_index];
        if (!layer.initialized) {
            // Lazy initialization drops what the layer held under keys/values:
            // the tokens of a bare layer given tensors by assignment are lost.
            layer.slots[keys] = empty_tensor(k->dtype);
            layer.slots[values] = empty_tensor(v->dtype);
            layer.initialized = true;
        }
        grow(layer.slots[keys], k);
        grow(layer.slots[values], v);
        return;
    }
    TensorList& key_list = *key_cache_;
    TensorList& value_list = *value_cache_;
    while (key_list.size() < layer_index) {
        key_list.push_back(empty_tensor(k->dtype));
        value_list.push_back(empty_tensor(v->dtype));
    }
    if (key_list.size() == layer_index) {
        key_list.push_back(k);  // an alias of the caller's tensor, as transformers does
        value_list.push_back(v);
    } else if (!holds_elements(key_list[layer_index])) {
        key_list[layer_index] = k;
        value_list[layer_index] = v;
    } else {
        grow(key_list[layer_index], k);
        grow(value_list[layer_index], v);
    }
}

std::int64_t Cache::seq_length(std::size_t layer_index) const {
    const Tensor k = logical(*this, layer_index, keys);
    return holds_elements(k) ? k->tokens : 0;
}

// ---- cache-level operations ------------------------------------------------------

Tensor logical(const Cache& cache, std::size_t layer_index, Slot side) {
    assert(side == keys || side == values);
    if (layer_index >= cache.layer_count()) return nullptr;
    if (cache.layout() == Layout::legacy) {
        return side == keys ? (*cache.key_cache())[layer_index] : (*cache.value_cache())[layer_index];
    }
    const Layer& layer = *(*cache.layers())[layer_index];
    if (!layer.initialized) return nullptr;
    const Tensor& modern = layer.slots[side];
    return modern ? modern : layer.slots[side == keys ? key_cache : value_cache];
}

bool holds_tokens(const Cache& cache) {
    for (std::size_t i = 0; i < cache.layer_count(); ++i) {
        if (holds_elements(logical(cache, i, keys)) || holds_elements(logical(cache, i, values))) return true;
    }
    return false;
}

DType cache_dtype(const Cache& cache) {
    DType found = DType::f32;
    bool seen = false;
    for_each_tensor(cache, [&](const Tensor& t) {
        if (!seen) found = t->dtype;
        seen = true;
    });
    return found;
}

std::pair<std::int64_t, std::int64_t> cache_geometry(const Cache& cache) {
    for (std::size_t layer = 0; layer < cache.layer_count(); ++layer) {
        for (Slot side : {keys, values}) {
            const Tensor t = logical(cache, layer, side);
            if (holds_elements(t)) return {t->heads, t->head_dim};
        }
    }
    return {default_heads, default_head_dim};
}

CachePtr clone(const Cache& source, Depth depth) {
    const bool deep = depth == Depth::deep;
    if (source.layout() == Layout::modern) {
        // A new list even when the source has no layers: a model filling the
        // copy must not add layers to the source.
        auto layers = std::make_shared<LayerList>();
        for (const LayerPtr& layer : *source.layers()) {
            auto twin = std::make_shared<Layer>(*layer);  // the flag, and the tensor pointers
            if (deep) {
                for (Tensor& slot : twin->slots) slot = copy_tensor(slot);
            }
            layers->push_back(std::move(twin));
        }
        return Cache::from_layers(std::move(layers));
    }
    auto key_list = std::make_shared<TensorList>(*source.key_cache());
    auto value_list = std::make_shared<TensorList>(*source.value_cache());
    if (deep) {
        for (Tensor& t : *key_list) t = copy_tensor(t);
        for (Tensor& t : *value_list) t = copy_tensor(t);
    }
    return Cache::from_slots(std::move(key_list), std::move(value_list));
}

CachePtr concat(const std::vector<ConstCachePtr>& parts) {
    if (parts.empty()) throw std::invalid_argument("concat needs at least one cache");
    std::size_t layer_count = 0;
    bool all_legacy = true;
    bool dtype_known = false;
    DType dtype = DType::f32;
    for (const ConstCachePtr& part : parts) {
        assert(part);
        layer_count = std::max(layer_count, part->layer_count());
        all_legacy = all_legacy && part->layout() == Layout::legacy;
        if (!has_any_tensor(*part)) continue;
        dtype = dtype_known ? promote(dtype, cache_dtype(*part)) : cache_dtype(*part);
        dtype_known = true;
    }
    auto key_list = std::make_shared<TensorList>();
    auto value_list = std::make_shared<TensorList>();
    for (std::size_t i = 0; i < layer_count; ++i) {
        for (Slot side : {keys, values}) {
            std::vector<Tensor> pieces;
            for (const ConstCachePtr& part : parts) {
                Tensor piece = logical(*part, i, side);
                if (holds_elements(piece)) pieces.push_back(std::move(piece));
            }
            (side == keys ? key_list : value_list)->push_back(cat(pieces, dtype));
        }
    }
    if (all_legacy) return Cache::from_slots(std::move(key_list), std::move(value_list));
    auto layers = std::make_shared<LayerList>();
    for (std::size_t i = 0; i < layer_count; ++i) {
        auto layer = std::make_shared<Layer>();
        layer->slots[keys] = (*key_list)[i];
        layer->slots[values] = (*value_list)[i];
        layer->initialized = true;  // a merged layer reports its true length
        layers->push_back(std::move(layer));
    }
    return Cache::from_layers(std::move(layers));
}

CachePtr to_legacy(const Cache& cache) {
    if (cache.layout() == Layout::legacy) throw std::invalid_argument("to_legacy: the cache is already legacy");
    const DType dtype = cache_dtype(cache);
    auto key_list = std::make_shared<TensorList>();
    auto value_list = std::make_shared<TensorList>();
    for (std::size_t i = 0; i < cache.layer_count(); ++i) {
        Tensor k = logical(cache, i, keys);
        Tensor v = logical(cache, i, values);
        key_list->push_back(k ? k : empty_tensor(dtype));
        value_list->push_back(v ? v : empty_tensor(dtype));
    }
    return Cache::from_slots(std::move(key_list), std::move(value_list));
}

CachePtr from_legacy(const Cache& cache) {
    if (cache.layout() == Layout::modern) throw std::invalid_argument("from_legacy: the cache is already modern");
    auto layers = std::make_shared<LayerList>();
    for (std::size_t i = 0; i < cache.layer_count(); ++i) {
        auto layer = std::make_shared<Layer>();
        layer->slots[keys] = copy_tensor((*cache.key_cache())[i]);
        layer->slots[values] = copy_tensor((*cache.value_cache())[i]);
        layer->initialized = true;
        layers->push_back(std::move(layer));
    }
    return Cache::from_layers(std::move(layers));
}

std::int64_t footprint_bytes(const Cache& cache) {
    std::int64_t bytes = 0;
    for_each_tensor(cache, [&bytes](const Tensor& t) {
        bytes += static_cast<std::int64_t>(t->values.size()) * bytes_per_value(t->dtype);
    });
    return bytes;
}

std::vector<std::uint64_t> storage_identities(const Cache& cache) {
    std::vector<std::uint64_t> ids;
    if (cache.layout() == Layout::modern) {
        ids.push_back(identity(cache.layers().get()));
        for (const LayerPtr& layer : *cache.layers()) ids.push_back(identity(layer.get()));
    } else {
        ids.push_back(identity(cache.key_cache().get()));
        ids.push_back(identity(cache.value_cache().get()));
    }
    for_each_tensor(cache, [&ids](const Tensor& t) { ids.push_back(identity(t.get())); });
    return ids;
}

std::int64_t live_sets_on_path(const Cache& cache) {
    std::int64_t live = 1;
    for (const auto& level : cache.lineage()) {
        const bool any_alive = std::any_of(level.begin(), level.end(), [](const auto& weak) { return !weak.expired(); });
        if (any_alive) ++live;
    }
    return live;
}

}  // namespace vector_engine
