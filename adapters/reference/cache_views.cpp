#include "reference/cache_views.h"

#include <ATen/EmptyTensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cassert>
#include <cstring>
#include <stdexcept>
#include <string>

namespace kvcheck::adapters {
namespace {

at::ScalarType scalar_type(Dtype dtype) {
    switch (dtype) {
        case Dtype::f32: return at::kFloat;
        case Dtype::f16: return at::kHalf;
        case Dtype::bf16: return at::kBFloat16;
    }
    throw std::invalid_argument("unknown dtype");
}

Dtype dtype_of(at::ScalarType type) {
    if (type == at::kHalf) return Dtype::f16;
    if (type == at::kBFloat16) return Dtype::bf16;
    if (type == at::kFloat) return Dtype::f32;
    throw std::invalid_argument(std::string("a cache tensor has dtype ") + c10::toString(type));
}

// `made` (a new contiguous tensor of Narrow's dtype) holding `values`,
// each narrowed by Narrow's conversion (exact for values of its precision).
template <typename Narrow>
at::Tensor narrowed(at::Tensor& made, const std::vector<float>& values) {
    Narrow* out = made.data_ptr<Narrow>();
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = Narrow(values[i]);
    return made;
}

// The content_hash of a contiguous tensor of Narrow's dtype, its values
// widened to float32 (exactly, as .to(at::kFloat) widens them) here rather
// than by two trips through the dispatcher.
template <typename Narrow>
std::uint64_t widened_hash(const at::Tensor& t, std::size_t count) {
    std::vector<float> values(count);
    const Narrow* narrow = t.data_ptr<Narrow>();
    for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(narrow[i]);
    return content_hash(values.data(), count);
}

// `value` with only its top `bits` mantissa bits, rounded to the nearest,
// ties to even (7: the bfloat16 grid). Values are finite (slot_value).
float keep_mantissa(float value, int bits) {
    if (bits >= 23) return value;
    const int cut = 23 - bits;
    std::uint32_t pattern = bits_of(value);
    pattern += (std::uint32_t{1} << (cut - 1)) - 1 + ((pattern >> cut) & 1);
    return float_of(pattern & ~((std::uint32_t{1} << cut) - 1));
}

at::Tensor slot_tensor(const CacheContent& content, const SlotContent& slot, at::ScalarType dtype, int mantissa_bits) {
    if (!slot.present) return {};
    if (slot.segments.empty()) return kv::empty_slot(at::TensorOptions().dtype(dtype));
    std::vector<float> values;
    fill_slot(slot, content.heads, content.head_dim, values);
    for (float& value : values) value = keep_mantissa(value, mantissa_bits);
    // Made in place, in its dtype: at::tensor, reshape and to would be three
    // trips through the dispatcher per slot (and at::empty a fourth). The
    // values are already rounded to their precision, so each narrowing is
    // exact (what .to(dtype) would give).
    at::Tensor made = at::detail::empty_cpu({cache_batch, content.heads, slot.tokens(), content.head_dim}, dtype);
    assert(static_cast<std::size_t>(made.numel()) == values.size());
    if (dtype == at::kHalf) return narrowed<c10::Half>(made, values);
    if (dtype == at::kBFloat16) return narrowed<c10::BFloat16>(made, values);
    assert(dtype == at::kFloat);
    std::memcpy(made.data_ptr<float>(), values.data(), values.size() * sizeof(float));
    return made;
}

// A slot's content_hash. A contiguous slot (what caches mostly hold) is
// hashed where it lies, or widened here (float16, bfloat16): the conversion
// would cost two trips through the dispatcher per slot, most of a small
// cache's view.
std::uint64_t slot_hash(const at::Tensor& t) {
    const auto count = static_cast<std::size_t>(t.numel());
    if (t.is_contiguous() && t.device().is_cpu()) {
        if (t.scalar_type() == at::kFloat) return content_hash(count == 0 ? nullptr : t.data_ptr<float>(), count);
        if (t.scalar_type() == at::kHalf) return widened_hash<c10::Half>(t, count);
        if (t.scalar_type() == at::kBFloat16) return widened_hash<c10::BFloat16>(t, count);
    }
    const at::Tensor values = t.to(at::kFloat).contiguous();
    return content_hash(values.data_ptr<float>(), count);
}

SlotView slot_view(const at::Tensor& t, bool with_values) {
    SlotView view;
    if (!t.defined()) return view;
    view.present = true;
    view.dtype = dtype_of(t.scalar_type());
    view.shape.assign(t.sizes().begin(), t.sizes().end());
    view.hash = slot_hash(t);
    if (with_values && t.numel() > 0) {
        const at::Tensor widened = t.to(at::kFloat).contiguous();
        view.values.assign(widened.data_ptr<float>(), widened.data_ptr<float>() + widened.numel());
    }
    return view;
}

void digest_slot(ViewDigest& digest, const at::Tensor& t) {
    if (!t.defined()) {
        digest.absent_slot();
        return;
    }
    const at::IntArrayRef sizes = t.sizes();
    digest.slot(dtype_of(t.scalar_type()), sizes.data(), sizes.size(), slot_hash(t));
}

}  // namespace

kv::CachePtr materialize(const CacheContent& content, int mantissa_bits) {
    const at::ScalarType dtype = scalar_type(content.dtype);
    if (content.layout == Layout::legacy) {
        auto keys = std::make_shared<kv::TensorList>();
        auto values = std::make_shared<kv::TensorList>();
        for (const LayerContent& layer : content.layers) {
            keys->push_back(slot_tensor(content, layer.slots[kvcheck::keys], dtype, mantissa_bits));
            values->push_back(slot_tensor(content, layer.slots[kvcheck::values], dtype, mantissa_bits));
        }
        return kv::Cache::from_slots(std::move(keys), std::move(values));
    }
    auto layers = std::make_shared<kv::LayerList>();
    for (const LayerContent& layer : content.layers) {
        auto made = std::make_shared<kv::Layer>();
        made->keys = slot_tensor(content, layer.slots[kvcheck::keys], dtype, mantissa_bits);
        made->values = slot_tensor(content, layer.slots[kvcheck::values], dtype, mantissa_bits);
        made->key_cache = slot_tensor(content, layer.slots[kvcheck::key_cache], dtype, mantissa_bits);
        made->value_cache = slot_tensor(content, layer.slots[kvcheck::value_cache], dtype, mantissa_bits);
        made->is_initialized = layer.initialized;
        layers->push_back(std::move(made));
    }
    return kv::Cache::from_layers(std::move(layers));
}

CacheView view_of(const kv::Cache& cache, bool with_values) {
    CacheView view;
    view.layout = cache.layout() == kv::Layout::modern ? Layout::modern : Layout::legacy;
    view.layers.reserve(static_cast<std::size_t>(cache.layer_count()));
    for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
        LayerView layer_view;
        if (cache.layout() == kv::Layout::legacy) {
            layer_view.slots[keys] = slot_view((*cache.key_cache())[i], with_values);
            layer_view.slots[values] = slot_view((*cache.value_cache())[i], with_values);
        } else {
            const kv::Layer& layer = *(*cache.layers())[i];
            layer_view.initialized = layer.is_initialized;
            layer_view.slots[keys] = slot_view(layer.keys, with_values);
            layer_view.slots[values] = slot_view(layer.values, with_values);
            layer_view.slots[key_cache] = slot_view(layer.key_cache, with_values);
            layer_view.slots[value_cache] = slot_view(layer.value_cache, with_values);
        }
        view.layers.push_back(std::move(layer_view));  // a copy would allocate every shape again
    }
    return view;
}

// view_digest(view_of(cache)), without building the view: no list of
// layers, no shape per slot.
std::uint64_t digest_of(const kv::Cache& cache) {
    const bool legacy = cache.layout() == kv::Layout::legacy;
    ViewDigest digest(legacy ? Layout::legacy : Layout::modern, static_cast<std::size_t>(cache.layer_count()));
    for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
        if (legacy) {
            digest.layer(true);
            digest_slot(digest, (*cache.key_cache())[i]);
            digest_slot(digest, (*cache.value_cache())[i]);
            digest.absent_slot();
            digest.absent_slot();
        } else {
            const kv::Layer& layer = *(*cache.layers())[i];
            digest.layer(layer.is_initialized);
            digest_slot(digest, layer.keys);
            digest_slot(digest, layer.values);
            digest_slot(digest, layer.key_cache);
            digest_slot(digest, layer.value_cache);
        }
    }
    return digest.value();
}

std::vector<std::uint64_t> storage_numbers(const kv::Cache& cache) {
    const std::vector<const void*> ids = kv::storage_identities(cache);
    std::vector<std::uint64_t> numbers;
    numbers.reserve(ids.size());
    for (const void* id : ids) numbers.push_back(reinterpret_cast<std::uintptr_t>(id));
    return numbers;
}

}  // namespace kvcheck::adapters
