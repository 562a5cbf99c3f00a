#include "kv/cache.h"

#include "kv/buffer_pool.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/tensor.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <cassert>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace kv {

const char* layout_name(Layout layout) {
    return layout == Layout::modern ? "modern" : "legacy";
}

at::Tensor empty_slot(const at::TensorOptions& options) {
    return at::empty({0}, options);
}

namespace {

bool holds_elements(const at::Tensor& t) { return t.defined() && t.numel() > 0; }

// A plain tensor: contiguous on the CPU, no autograd, no lazy conjugate or
// negation, not a zero tensor; its copy is its bytes. What caches hold.
// (ComplexHalf goes through clone, which warns that it is experimental.)
bool is_plain(const at::Tensor& t) {
    return t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.requires_grad() &&
           !t.is_conj() && !t.is_neg() && !t._is_zerotensor() && t.scalar_type() != at::kComplexHalf;
}

// Where a new slot's buffer comes from: libtorch's CPU allocator, or the
// buffer pool (kv/buffer_pool.h; blocks under its minimum size come from
// the CPU allocator all the same).
enum class Buffer { cpu, pool };

// An unfilled contiguous tensor of `sizes` and `dtype` with a storage of its
// own from the buffer pool, and where its bytes go. Built as
// at::detail::empty_strided_generic builds it for a CPU tensor (a resizable
// StorageImpl with the allocator's DataPtr, a TensorImpl of the CPU key
// set, then its sizes and strides), without what that re-derives from
// scratch: the checks of sizes a source tensor already passed.
at::Tensor empty_pooled(at::IntArrayRef sizes, at::IntArrayRef strides, caffe2::TypeMeta dtype, std::size_t bytes,
                        void** data) {
    c10::Allocator* const allocator = buffer_pool_allocator();
    c10::DataPtr buffer = allocator->allocate(bytes);
    *data = buffer.get();
    auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), bytes,
                                                         std::move(buffer), allocator, /*resizable=*/true);
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(std::move(storage)),
                                                     c10::DispatchKeySet(c10::DispatchKey::CPU), dtype);
    impl->set_sizes_and_strides(sizes, strides);
    return at::Tensor(std::move(impl));
}

// at::cat(pieces, -2) for what a model appends and what a merge joins:
// [batch, heads, tokens, dim] tensors of one dtype that agree but in tokens.
// The result is what cat gives (a new contiguous tensor of its own, version
// 0), made without the dispatcher and TensorIterator: that set-up was half
// of a small model step (two cats per layer per token), and a merge of many
// small parts paid it per part. A merge takes its buffer from the pool
// (`buffer`): a merge of large caches otherwise copies into fresh pages the
// kernel must zero and map first, as a clone did before the pool
// (BENCHMARKS.md). Anything else goes to at::cat, which also promotes mixed
// dtypes and reports mismatched shapes.
at::Tensor cat_tokens(at::ArrayRef<at::Tensor> pieces, Buffer buffer = Buffer::cpu) {
    const at::Tensor& first = pieces.front();
    // Each piece's values and the bytes of one of its [tokens, dim] blocks,
    // read once here, not once per row below.
    struct Block {
        const char* values;
        std::size_t bytes;
    };
    c10::SmallVector<Block, 8> blocks;
    const std::size_t element = first.element_size();
    std::int64_t tokens = 0;
    for (const at::Tensor& t : pieces) {
        const bool fast = t.defined() && is_plain(t) && t.dim() == 4 && t.scalar_type() == first.scalar_type() &&
                          t.size(0) == first.size(0) && t.size(1) == first.size(1) && t.size(3) == first.size(3);
        if (!fast) return at::cat(pieces, -2);
        tokens += t.size(2);
        const std::size_t bytes = static_cast<std::size_t>(t.size(2) * t.size(3)) * element;
        if (bytes > 0) blocks.push_back({static_cast<const char*>(t.data_ptr()), bytes});
    }
    const std::int64_t sizes[] = {first.size(0), first.size(1), tokens, first.size(3)};
    at::Tensor out;
    char* to = nullptr;
    if (buffer == Buffer::pool) {
        const std::int64_t strides[] = {sizes[1] * sizes[2] * sizes[3], sizes[2] * sizes[3], sizes[3], 1};
        void* data = nullptr;
        out = empty_pooled(sizes, strides, first.dtype(), static_cast<std::size_t>(sizes[0] * strides[0]) * element, &data);
        to = static_cast<char*>(data);
    } else {
        out = at::detail::empty_cpu(sizes, first.scalar_type());
        to = static_cast<char*>(out.data_ptr());
    }
    // Row by row of [batch, heads]: each piece's tokens x dim block in turn.
    const auto rows = static_cast<std::size_t>(first.size(0) * first.size(1));
    for (std::size_t row = 0; row < rows; ++row) {
        for (const Block& block : blocks) {
            std::memcpy(to, block.values + row * block.bytes, block.bytes);
            to += block.bytes;
        }
    }
    return out;
}

at::Tensor append(const at::Tensor& slot, const at::Tensor& piece) {
    if (!holds_elements(slot)) return cat_tokens({piece});
    return cat_tokens({slot, piece});
}

// A slot's bytes still to be copied: see copy_slot.
struct PendingCopy {
    void* target = nullptr;
    const void* source = nullptr;
    std::size_t bytes = 0;
};
// Inline room for the slots of 8 modern layers (4 slots each): a clone of a
// cache that size allocates nothing for its list of pending copies.
using PendingCopies = c10::SmallVector<PendingCopy, 32>;

// An unfilled tensor of t's sizes, strides and dtype with a storage of its
// own from the buffer pool, and where its bytes go; for a contiguous tensor
// the storage size is its nbytes().
at::Tensor empty_plain_like(const at::Tensor& t, void** data) {
    return empty_pooled(t.sizes(), t.strides(), t.dtype(), t.nbytes(), data);
}

// Copy of one slot; absent stays absent. The result is what t.clone()
// gives (same sizes, strides, dtype, a storage of its own). A plain tensor
// (is_plain), which is what caches hold, is made the way clone makes it (an
// empty_strided tensor, then a copy of the bytes) with three differences,
// each for the fixed cost of a clone (BENCHMARKS.md, notes):
// - its bytes are copied with memcpy, not copy_ (whose set-up per tensor
//   costs more than copying a small slot);
// - its buffer comes from the buffer pool (kv/buffer_pool.h): a clone of a
//   large cache copies into pages a freed clone left resident, instead of
//   fresh pages the kernel must zero and map first;
// - its bytes are not copied here but appended to `pending`, for
//   copy_pending once every slot of the cache is made: the allocations run
//   together while the allocator's state is in cache, then the copies run
//   back to back, instead of each copy evicting what the next allocation
//   reads.
at::Tensor copy_slot(const at::Tensor& t, PendingCopies& pending) {
    if (!t.defined()) return at::Tensor();
    if (!is_plain(t)) return t.clone();
    void* target = nullptr;
    at::Tensor copy = empty_plain_like(t, &target);
    const std::size_t bytes = t.nbytes();
    if (bytes > 0) pending.push_back({target, t.data_ptr(), bytes});
    return copy;
}

void copy_pending(const PendingCopies& pending) {
    for (const PendingCopy& piece : pending) {
        assert(piece.target != nullptr);
        assert(piece.source != nullptr);
        std::memcpy(piece.target, piece.source, piece.bytes);
    }
}

// The options of the first tensor a cache holds, in any slot of any layer;
// float32 when it holds none. Empty slots made for a cache take these, so a
// bfloat16 cache stays bfloat16 throughout.
at::TensorOptions cache_options(const Cache& cache) {
    auto first = [](std::initializer_list<const at::Tensor*> slots) -> const at::Tensor* {
        for (const at::Tensor* t : slots) {
            if (t->defined()) return t;
        }
        return nullptr;
    };
    for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
        const at::Tensor* found = nullptr;
        if (cache.layout() == Layout::legacy) {
            found = first({&(*cache.key_cache())[i], &(*cache.value_cache())[i]});
        } else {
            const Layer& layer = *(*cache.layers())[i];
            found = first({&layer.keys, &layer.values, &layer.key_cache, &layer.value_cache});
        }
        if (found) return found->options();
    }
    return at::TensorOptions().dtype(at::kFloat);
}

void check_layer_index(std::int64_t layer_index) {
    if (layer_index < 0) throw std::out_of_range("layer index must be >= 0");
}

}  // namespace

CachePtr Cache::make(Layout layout) {
    CachePtr cache(new Cache(layout));
    if (layout == Layout::modern) {
        cache->layers_ = std::make_shared<LayerList>();
    } else {
        cache->key_cache_ = std::make_shared<TensorList>();
        cache->value_cache_ = std::make_shared<TensorList>();
    }
    return cache;
}

CachePtr Cache::from_layers(std::shared_ptr<LayerList> layers) {
    assert(layers);
    CachePtr cache(new Cache(Layout::modern));
    cache->layers_ = std::move(layers);
    return cache;
}

CachePtr Cache::from_slots(std::shared_ptr<TensorList> key_cache,
                           std::shared_ptr<TensorList> value_cache) {
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

void Cache::update(const at::Tensor& k, const at::Tensor& v, std::int64_t layer_index) {
    check_layer_index(layer_index);
    if (!k.defined() || !v.defined()) throw std::invalid_argument("update needs both k and v");
    if (layout_ == Layout::modern) {
        update_modern(k, v, layer_index);
    } else {
        update_legacy(k, v, layer_index);
    }
}

void Cache::update_modern(const at::Tensor& k, const at::Tensor& v, std::int64_t layer_index) {
    while (static_cast<std::int64_t>(layers_->size()) <= layer_index) {
        layers_->push_back(std::make_shared<Layer>());
    }
    Layer& layer = *(*layers_)[layer_index];
    if (!layer.is_initialized) {
        // Lazy initialization drops whatever the layer held: this is how
        // tokens assigned to a bare layer get lost (docs/semantics.md#modern-layout).
        layer.keys = empty_slot(k.options());
        layer.values = empty_slot(v.options());
        layer.is_initialized = true;
    }
    layer.keys = append(layer.keys, k);
    layer.values = append(layer.values, v);
}

void Cache::update_legacy(const at::Tensor& k, const at::Tensor& v, std::int64_t layer_index) {
    auto& keys = *key_cache_;
    auto& values = *value_cache_;
    assert(keys.size() == values.size());
    const auto index = static_cast<std::size_t>(layer_index);
    while (keys.size() < index) {
        keys.push_back(empty_slot(k.options()));
        values.push_back(empty_slot(v.options()));
    }
    if (keys.size() == index) {
        keys.push_back(k);  // an alias of the caller's tensor, as transformers does
        values.push_back(v);
    } else if (!holds_elements(keys[index])) {
        keys[index] = k;
        values[index] = v;
    } else {
        keys[index] = cat_tokens({keys[index], k});
        values[index] = cat_tokens({values[index], v});
    }
}

std::int64_t Cache::get_seq_length(std::int64_t layer_index) const {
    const at::Tensor keys = logical_keys(*this, layer_index);
    if (!holds_elements(keys)) return 0;
    return keys.size(-2);
}

std::int64_t Cache::layer_count() const {
    if (layout_ == Layout::modern) return static_cast<std::int64_t>(layers_->size());
    return static_cast<std::int64_t>(key_cache_->size());
}

at::Tensor logical_keys(const Cache& cache, std::int64_t layer_index) {
    check_layer_index(layer_index);
    if (layer_index >= cache.layer_count()) return {};
    if (cache.layout() == Layout::legacy) return (*cache.key_cache())[layer_index];
    const Layer& layer = *(*cache.layers())[layer_index];
    return layer.is_initialized ? layer.key() : at::Tensor();
}

at::Tensor logical_values(const Cache& cache, std::int64_t layer_index) {
    check_layer_index(layer_index);
    if (layer_index >= cache.layer_count()) return {};
    if (cache.layout() == Layout::legacy) return (*cache.value_cache())[layer_index];
    const Layer& layer = *(*cache.layers())[layer_index];
    return layer.is_initialized ? layer.value() : at::Tensor();
}

CachePtr clone(const Cache& source) {
    PendingCopies pending;
    CachePtr copy;
    if (source.layout() == Layout::modern) {
        // A new list even when the source has no layers: a model filling the
        // copy must not add layers to the source.
        auto layers = std::make_shared<LayerList>();
        layers->reserve(source.layers()->size());
        for (const LayerPtr& layer : *source.layers()) {
            auto twin = std::make_shared<Layer>();
            twin->keys = copy_slot(layer->keys, pending);
            twin->values = copy_slot(layer->values, pending);
            twin->key_cache = copy_slot(layer->key_cache, pending);
            twin->value_cache = copy_slot(layer->value_cache, pending);
            twin->is_initialized = layer->is_initialized;
            layers->push_back(std::move(twin));
        }
        copy = Cache::from_layers(std::move(layers));
    } else {
        auto keys = std::make_shared<TensorList>();
        auto values = std::make_shared<TensorList>();
        keys->reserve(source.key_cache()->size());
        values->reserve(source.value_cache()->size());
        for (const at::Tensor& t : *source.key_cache()) keys->push_back(copy_slot(t, pending));
        for (const at::Tensor& t : *source.value_cache()) values->push_back(copy_slot(t, pending));
        copy = Cache::from_slots(std::move(keys), std::move(values));
    }
    copy_pending(pending);
    copy->set_owned(true);
    copy->set_dropped(source.dropped());
    return copy;
}

namespace {

at::Tensor cat_present(const std::vector<at::Tensor>& pieces) {
    std::vector<at::Tensor> present;
    for (const at::Tensor& t : pieces) {
        if (holds_elements(t)) present.push_back(t);
    }
    if (present.empty()) return at::Tensor();
    return cat_tokens(present, Buffer::pool);
}

}  // namespace

CachePtr concat(const std::vector<ConstCachePtr>& parts) {
    if (parts.empty()) throw std::invalid_argument("concat needs at least one cache");
    std::int64_t layers = 0;
    bool all_legacy = true;
    for (const ConstCachePtr& part : parts) {
        assert(part);
        layers = std::max(layers, part->layer_count());
        all_legacy = all_legacy && part->layout() == Layout::legacy;
    }
    // The merged dtype, of every merged slot: that of the parts holding any
    // tensor, promoted as torch.cat promotes its inputs (empty ones
    // included: two different floating dtypes of these give float32), so
    // that a layer only one part fills has it too; float32 when no part
    // holds a tensor. The other options: the first part holding a tensor.
    at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
    bool dtype_known = false;
    for (const ConstCachePtr& part : parts) {
        if (footprint(*part).tensors == 0) continue;
        const at::TensorOptions part_options = cache_options(*part);
        if (!dtype_known) {
            options = part_options;
            dtype_known = true;
        } else {
            options = options.dtype(c10::promoteTypes(options.dtype().toScalarType(),
                                                      part_options.dtype().toScalarType()));
        }
    }
    const at::ScalarType dtype = options.dtype().toScalarType();
    auto in_merged_dtype = [dtype](const at::Tensor& t) { return t.scalar_type() == dtype ? t : t.to(dtype); };
    std::vector<at::Tensor> merged_keys;
    std::vector<at::Tensor> merged_values;
    for (std::int64_t i = 0; i < layers; ++i) {
        std::vector<at::Tensor> keys;
        std::vector<at::Tensor> values;
        for (const ConstCachePtr& part : parts) {
            keys.push_back(logical_keys(*part, i));
            values.push_back(logical_values(*part, i));
        }
        at::Tensor k = cat_present(keys);
        at::Tensor v = cat_present(values);
        // A layer no part fills is still a merged layer: empty, initialized.
        merged_keys.push_back(k.defined() ? in_merged_dtype(k) : empty_slot(options));
        merged_values.push_back(v.defined() ? in_merged_dtype(v) : empty_slot(options));
    }
    CachePtr merged;
    if (all_legacy) {
        merged = Cache::from_slots(std::make_shared<TensorList>(std::move(merged_keys)),
                                   std::make_shared<TensorList>(std::move(merged_values)));
    } else {
        auto list = std::make_shared<LayerList>();
        for (std::size_t i = 0; i < merged_keys.size(); ++i) {
            auto layer = std::make_shared<Layer>();
            layer->keys = merged_keys[i];
            layer->values = merged_values[i];
            layer->is_initialized = true;  // a merged layer reports its true length
            list->push_back(std::move(layer));
        }
        merged = Cache::from_layers(std::move(list));
    }
    // A single part with one layer is cat of one tensor: still a new tensor.
    merged->set_owned(true);
    std::int64_t dropped = 0;
    for (const ConstCachePtr& part : parts) dropped += part->dropped();
    merged->set_dropped(dropped);
    return merged;
}

CachePtr to_legacy(const Cache& cache) {
    if (cache.layout() == Layout::legacy) throw std::invalid_argument("to_legacy: the cache is already legacy");
    auto keys = std::make_shared<TensorList>();
    auto values = std::make_shared<TensorList>();
    const at::TensorOptions options = cache_options(cache);
    for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
        at::Tensor k = logical_keys(cache, i);
        at::Tensor v = logical_values(cache, i);
        keys->push_back(k.defined() ? k : empty_slot(options));
        values->push_back(v.defined() ? v : empty_slot(options));
    }
    CachePtr legacy = Cache::from_slots(std::move(keys), std::move(values));
    legacy->set_dropped(cache.dropped());
    return legacy;
}

namespace {

void crop_slot(at::Tensor& slot, std::int64_t keep) {
    if (!slot.defined() || slot.dim() != 4 || slot.size(2) <= keep) return;
    slot = slot.narrow(2, 0, keep).clone();
}

}  // namespace

void crop(Cache& cache, std::int64_t keep) {
    if (keep < 1) throw std::invalid_argument("crop: keep must be at least 1, got " + std::to_string(keep));
    if (cache.layout() == Layout::modern) {
        for (const LayerPtr& layer : *cache.layers()) {
            for (at::Tensor* slot : {&layer->keys, &layer->values, &layer->key_cache, &layer->value_cache}) crop_slot(*slot, keep);
        }
        return;
    }
    for (at::Tensor& slot : *cache.key_cache()) crop_slot(slot, keep);
    for (at::Tensor& slot : *cache.value_cache()) crop_slot(slot, keep);
}

at::Tensor batch_slot(const std::vector<at::Tensor>& rows, const BatchSteps& steps) {
    if (rows.empty() || steps.repeat < 1) throw std::invalid_argument("batch: no rows, or a repeat below 1");
    const std::int64_t width = static_cast<std::int64_t>(rows.size()) * steps.repeat;
    const bool reordered = !steps.reorder.empty();
    if (reordered && static_cast<std::int64_t>(steps.reorder.size()) != width) {
        throw std::invalid_argument("batch: reorder names " + std::to_string(steps.reorder.size()) + " rows of " +
                                    std::to_string(width));
    }
    for (const std::int64_t index : steps.reorder) {
        if (index < 0 || index >= width) throw std::invalid_argument("batch: reorder index out of range");
    }
    if (steps.select < 0 || steps.select >= width) throw std::invalid_argument("batch: select out of range");
    at::Tensor batch = at::cat(rows, 0).repeat_interleave(steps.repeat, 0);
    if (reordered) batch = batch.index_select(0, at::tensor(steps.reorder, at::kLong));
    return batch.index_select(0, at::tensor(std::vector<std::int64_t>{steps.select}, at::kLong));
}

CachePtr batch_row(const std::vector<ConstCachePtr>& rows, const BatchSteps& steps) {
    if (rows.empty()) throw std::invalid_argument("batch: no rows");
    const std::int64_t layers = rows.front()->layer_count();
    auto result = std::make_shared<LayerList>();
    for (std::int64_t i = 0; i < layers; ++i) {
        std::vector<at::Tensor> keys;
        std::vector<at::Tensor> values;
        for (const ConstCachePtr& row : rows) {
            if (row->layout() != Layout::modern || row->layer_count() != layers) {
                throw std::invalid_argument("batch: the rows are not modern caches of one layer count");
            }
            const Layer& layer = *(*row->layers())[static_cast<std::size_t>(i)];
            if (!layer.is_initialized || !layer.keys.defined() || !layer.values.defined()) {
                throw std::invalid_argument("batch: layer " + std::to_string(i) + " of a row holds no keys and values");
            }
            keys.push_back(layer.keys);
            values.push_back(layer.values);
        }
        auto layer = std::make_shared<Layer>();
        layer->keys = batch_slot(keys, steps);
        layer->values = batch_slot(values, steps);
        layer->is_initialized = true;
        result->push_back(std::move(layer));
    }
    CachePtr row = Cache::from_layers(std::move(result));
    // The positions a window cut of the row moved on (Cache::dropped) are
    // the selected row's: row j of the reordered batch is row reorder[j] of
    // the repeated one, row r / repeat of the rows.
    // (batch_slot checked the indices; with no layer there is nothing cut.)
    if (layers > 0) {
        const std::int64_t repeated =
            steps.reorder.empty() ? steps.select : steps.reorder[static_cast<std::size_t>(steps.select)];
        row->set_dropped(rows[static_cast<std::size_t>(repeated / steps.repeat)]->dropped());
    }
    return row;
}

CachePtr from_legacy(const Cache& cache) {
    if (cache.layout() == Layout::modern) throw std::invalid_argument("from_legacy: the cache is already modern");
    auto layers = std::make_shared<LayerList>();
    for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
        const at::Tensor& k = (*cache.key_cache())[i];
        const at::Tensor& v = (*cache.value_cache())[i];
        auto layer = std::make_shared<Layer>();
        layer->keys = k.clone();
        layer->values = v.clone();
        layer->is_initialized = true;
        layers->push_back(std::move(layer));
    }
    CachePtr modern = Cache::from_layers(std::move(layers));
    modern->set_dropped(cache.dropped());
    return modern;
}

Footprint footprint(const Cache& cache) {
    Footprint total;
    auto add = [&total](const at::Tensor& t) {
        if (!t.defined()) return;
        total.tensors += 1;
        total.bytes += static_cast<std::int64_t>(t.nbytes());
    };
    if (cache.layout() == Layout::modern) {
        for (const LayerPtr& layer : *cache.layers()) {
            add(layer->keys);
            add(layer->values);
            add(layer->key_cache);
            add(layer->value_cache);
        }
    } else {
        for (const at::Tensor& t : *cache.key_cache()) add(t);
        for (const at::Tensor& t : *cache.value_cache()) add(t);
    }
    return total;
}

std::vector<const void*> storage_identities(const Cache& cache) {
    std::vector<const void*> ids;
    // The list(s), then per layer its object and up to four storages.
    ids.reserve(2 + static_cast<std::size_t>(cache.layer_count()) * 5);
    auto add_tensor = [&ids](const at::Tensor& t) {
        if (t.defined() && t.storage().nbytes() > 0) ids.push_back(t.storage().data());
    };
    if (cache.layout() == Layout::modern) {
        ids.push_back(cache.layers().get());
        for (const LayerPtr& layer : *cache.layers()) {
            ids.push_back(layer.get());
            add_tensor(layer->keys);
            add_tensor(layer->values);
            add_tensor(layer->key_cache);
            add_tensor(layer->value_cache);
        }
    } else {
        ids.push_back(cache.key_cache().get());
        ids.push_back(cache.value_cache().get());
        for (const at::Tensor& t : *cache.key_cache()) add_tensor(t);
        for (const at::Tensor& t : *cache.value_cache()) add_tensor(t);
    }
    return ids;
}

bool shares_storage(const Cache& a, const Cache& b) {
    if (&a == &b) return true;
    const auto b_ids = storage_identities(b);
    const std::unordered_set<const void*> ids(b_ids.begin(), b_ids.end());
    for (const void* id : storage_identities(a)) {
        if (ids.count(id) != 0) return true;
    }
    return false;
}

}  // namespace kv
