// KV caches in the two layouts of the transformers library, with the exact
// in-place `update` semantics a model relies on.
//
// Ownership, in one paragraph: a Cache is shared by pointer, like the Python
// object it models. `update` mutates the cache it is called on (the layer
// objects, the layer list, the slot lists), so whoever holds the pointer sees
// the new tokens. Tensors themselves are never written in place by this
// module: appending rebinds a slot to a new `cat` result. A cache is *owned*
// (the `owned` marker) only when it shares no storage with anything stored;
// `clone` and `concat` produce owned caches, everything else clears or never
// sets the marker.
//
//   auto cache = kv::Cache::make(kv::Layout::modern);
//   cache->update(k, v, 0);              // layer 0 lazily initialized, K/V appended
//   auto copy = kv::clone(*cache);       // owned, independent: copy->update leaves cache alone
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kv {

enum class Layout : std::uint8_t { modern, legacy };

const char* layout_name(Layout layout);

// A layer object of the modern layout. Each of the four slots is optional
// (an undefined tensor means absent) and independent of the others: a layer
// may hold only keys, only values, or its tensors under the legacy slot names
// used by the transition versions of transformers.
struct Layer {
    at::Tensor keys;
    at::Tensor values;
    at::Tensor key_cache;    // legacy slot name carried by a modern layer
    at::Tensor value_cache;  // legacy slot name carried by a modern layer
    bool is_initialized = false;

    // The tensor the layer exposes as its keys: the modern slot when present,
    // else the legacy-named one. Undefined when the layer holds neither.
    const at::Tensor& key() const { return keys.defined() ? keys : key_cache; }
    const at::Tensor& value() const { return values.defined() ? values : value_cache; }
};

using LayerPtr = std::shared_ptr<Layer>;
using LayerList = std::vector<LayerPtr>;
using TensorList = std::vector<at::Tensor>;

class Cache;
using CachePtr = std::shared_ptr<Cache>;
using ConstCachePtr = std::shared_ptr<const Cache>;

class Cache : public std::enable_shared_from_this<Cache> {
  public:
    // A new cache of either layout holds no layers.
    static CachePtr make(Layout layout);

    Layout layout() const { return layout_; }

    // Appends k and v (shape [batch, heads, seq, head_dim]) to layer
    // `layer_index` along seq, in place, exactly as transformers does:
    // modern: missing layers are appended empty; an uninitialized layer is
    //   lazily initialized (its held tensors are dropped), then the slots are
    //   rebound to cat(slot, k/v, -2) on the same layer object;
    // legacy: both lists are padded with empty tensors; a new slot aliases k
    //   itself, an empty slot is replaced by k, otherwise the slot is rebound
    //   to cat(slot, k, -2).
    void update(const at::Tensor& k, const at::Tensor& v, std::int64_t layer_index);

    // 0 when the layer is missing, uninitialized (modern) or holds no
    // elements; otherwise keys.size(-2).
    std::int64_t get_seq_length(std::int64_t layer_index = 0) const;

    std::int64_t layer_count() const;

    // Modern layout: the layer list (never null). Legacy layout: null.
    const std::shared_ptr<LayerList>& layers() const { return layers_; }
    // Legacy layout: the parallel slot lists (never null). Modern layout: null.
    const std::shared_ptr<TensorList>& key_cache() const { return key_cache_; }
    const std::shared_ptr<TensorList>& value_cache() const { return value_cache_; }

    // Tokens a window cut from the front of layer 0's keys (kv::keep_window,
    // docs/semantics.md#store-windows): the position of its first held
    // token, which a model numbers the next tokens from. 0 unless a window
    // cut it; clone and the conversions carry it, concat sums the parts'.
    std::int64_t dropped() const { return dropped_; }
    void set_dropped(std::int64_t tokens) { dropped_ = tokens; }

    // The owned-copy marker: set by clone/concat, cleared when stored.
    bool owned() const { return owned_; }
    void set_owned(bool owned) { owned_ = owned; }

    // Lineage, by generation: level 0 holds the caches this one was copied
    // from, level 1 the caches those were copied from, and so on (empty for
    // originals). Weak: lineage never keeps a K/V set alive. Used to count
    // the K/V sets alive along a generation path.
    using Lineage = std::vector<std::vector<std::weak_ptr<const Cache>>>;
    const Lineage& lineage() const { return lineage_; }
    void set_lineage(Lineage lineage) { lineage_ = std::move(lineage); }

    // Construction of a cache from parts, for clone, conversion and load.
    // The parts are taken as they are: no copy is made here.
    static CachePtr from_layers(std::shared_ptr<LayerList> layers);
    static CachePtr from_slots(std::shared_ptr<TensorList> key_cache,
                               std::shared_ptr<TensorList> value_cache);

  private:
    explicit Cache(Layout layout) : layout_(layout) {}

    void update_modern(const at::Tensor& k, const at::Tensor& v, std::int64_t layer_index);
    void update_legacy(const at::Tensor& k, const at::Tensor& v, std::int64_t layer_index);

    Layout layout_;
    std::shared_ptr<LayerList> layers_;
    std::shared_ptr<TensorList> key_cache_;
    std::shared_ptr<TensorList> value_cache_;
    bool owned_ = false;
    std::int64_t dropped_ = 0;
    Lineage lineage_;
};

// An empty tensor of the given options, as used for padding and lazy
// initialization (shape [0]).
at::Tensor empty_slot(const at::TensorOptions& options);

// An independent owned copy: no tensor, layer object or list is shared with
// `source`; every slot is copied on its own (one-sided and legacy-named
// layers included); `is_initialized` and the layout are preserved; an empty
// cache gets a new empty list. The copy is marked owned.
CachePtr clone(const Cache& source);

// Concatenation of several caches along seq, in the order given: layer i of
// the result is cat(part_0.layer_i, part_1.layer_i, ...) over the parts that
// have that layer, and is initialized. The result is modern when every part
// is modern, legacy when every part is legacy, else modern. The result is a
// new owned cache; the parts are not modified. Requires at least one part.
CachePtr concat(const std::vector<ConstCachePtr>& parts);

// A batch's steps (docs/semantics.md#batches): each row repeated `repeat`
// times in place (transformers' batch_repeat_interleave), the rows then
// reordered by `reorder` when it is not empty (reorder_cache: row j becomes
// row reorder[j]), then row `select` kept (batch_select_indices).
struct BatchSteps {
    std::int64_t repeat = 1;
    std::vector<std::int64_t> reorder;
    std::int64_t select = 0;
};

// One slot of the batch: `rows` (each [1, heads, seq, head_dim], of one
// shape and dtype) stacked along the batch, then `steps`; a new tensor of
// batch 1. Throws std::invalid_argument for an index out of range.
at::Tensor batch_slot(const std::vector<at::Tensor>& rows, const BatchSteps& steps);

// The row `steps` selects of the batch of `rows` (each modern, every layer
// initialized, keys and values of batch 1 and one geometry): a new cache
// whose every layer holds batch_slot of the rows' keys and of their values,
// sharing nothing with the rows. The rows are not modified. Throws
// std::invalid_argument for rows it cannot stack.
CachePtr batch_row(const std::vector<ConstCachePtr>& rows, const BatchSteps& steps);

// modern -> legacy: slot i holds layer i's key()/value(), aliased (no copy),
// or an empty tensor when the layer is uninitialized or lacks that side.
// Throws std::invalid_argument for a legacy cache (and from_legacy for a
// modern one): a conversion names its direction.
CachePtr to_legacy(const Cache& cache);
// legacy -> modern: every layer is initialized and holds copies of the
// slots (transformers copies them through update). Empty slots stay empty.
CachePtr from_legacy(const Cache& cache);

// Cuts the cache to its first `keep` tokens, in place, as transformers'
// DynamicCache.crop(keep) does: every slot of every layer holding more than
// `keep` tokens along seq is rebound to a new tensor holding its first
// `keep` (no storage of the old tensor kept); the others, empty slots and
// flags stay as they are; the layer objects and lists are the same. The
// caller owns the cache: a stored cache is read-only (kvcheck never asks
// to cut one). Requires keep >= 1.
void crop(Cache& cache, std::int64_t keep);

// The logical K or V of layer i: what a model sees. Undefined tensor when
// the layer is missing, uninitialized, or lacks that side.
at::Tensor logical_keys(const Cache& cache, std::int64_t layer_index);
at::Tensor logical_values(const Cache& cache, std::int64_t layer_index);

// Bytes and tensors held by a cache (all slots, all layers).
struct Footprint {
    std::int64_t tensors = 0;
    std::int64_t bytes = 0;
};
Footprint footprint(const Cache& cache);

// Every identity a cache is made of: its lists, its layer objects, and the
// data pointers of the tensor storages that hold bytes. Two caches alias iff
// they share one.
std::vector<const void*> storage_identities(const Cache& cache);

// Is any tensor storage, layer object or list of `a` also part of `b`?
bool shares_storage(const Cache& a, const Cache& b);

}  // namespace kv
