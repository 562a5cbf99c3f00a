// The vector engine's KV caches: a small, torch-free engine that keeps K/V
// in plain float vectors. It knows nothing of kvcheck; adapter.cpp is the
// only file that translates between the two.
//
// Ownership, in one paragraph. A tensor is a Storage shared by pointer
// (Tensor), so two caches alias exactly when they hold the same Storage (or
// the same layer object or list). `update` appends the model's new K/V *in
// place*: the layer objects, lists and the storages the cache already holds
// grow. That is only safe on a cache whose storages nobody else holds, which
// is what `clone` (Depth::deep) and `concat` produce and what the `owned`
// marker promises. `to_legacy` aliases its source's storages, as transformers
// does; `from_legacy` copies them.
//
//   CachePtr cache = Cache::make(Layout::modern);
//   cache->update(k, v, 0);                        // layer 0 lazily initialized, K/V appended
//   CachePtr copy = clone(*cache, Depth::deep);    // owned: copy->update leaves cache alone
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace vector_engine {

// The geometry a tensor has when nothing says otherwise (the model's, on a
// cache that holds no token yet).
inline constexpr std::int64_t default_heads = 2;
inline constexpr std::int64_t default_head_dim = 4;

enum class Layout : std::uint8_t { modern, legacy };
// A tag: the engine computes in float, and every value it holds is exact in
// the dtype of its tensor (is_exact_in checks): kvcheck's values come
// rounded to their dtype (kvcheck::fill_slot), the model's are multiples of
// 1/8 in [-4, 4], exact in all three types.
enum class DType : std::uint8_t { f32, f16, bf16 };

std::int64_t bytes_per_value(DType dtype);
bool is_exact_in(DType dtype, float value);
// The type a mix of two types computes in (torch's promotion): f32 unless equal.
DType promote(DType a, DType b);

// One K or V tensor, shape [1, heads, tokens, head_dim], row-major
// (head, token, dim); a tensor holding no token has shape [0]. Appending
// to a tensor that holds tokens needs the same heads and head_dim.
struct Storage {
    DType dtype = DType::f32;
    std::int64_t heads = default_heads;
    std::int64_t tokens = 0;
    std::int64_t head_dim = default_head_dim;
    std::vector<float> values;  // heads * tokens * head_dim
};
using Tensor = std::shared_ptr<Storage>;  // null: the slot is absent

Tensor make_tensor(DType dtype, std::int64_t heads, std::int64_t tokens, std::int64_t head_dim, std::vector<float> values);
Tensor empty_tensor(DType dtype);
Tensor copy_tensor(const Tensor& tensor);  // a new storage with the same content; null stays null
bool holds_elements(const Tensor& tensor);

// The four slots of a modern layer: its keys/values, and the legacy-named
// key_cache/value_cache that transition versions of transformers carry. Any
// of them may be absent, independently.
enum Slot : std::uint8_t { keys = 0, values = 1, key_cache = 2, value_cache = 3 };
inline constexpr int slot_count = 4;

struct Layer {
    std::array<Tensor, slot_count> slots;
    bool initialized = false;  // a bare layer given tensors by assignment is not
};
using LayerPtr = std::shared_ptr<Layer>;
using LayerList = std::vector<LayerPtr>;
using TensorList = std::vector<Tensor>;

class Cache;
using CachePtr = std::shared_ptr<Cache>;
using ConstCachePtr = std::shared_ptr<const Cache>;

class Cache : public std::enable_shared_from_this<Cache> {
  public:
    // A new cache of either layout holds no layers.
    static CachePtr make(Layout layout);
    static CachePtr from_layers(std::shared_ptr<LayerList> layers);
    static CachePtr from_slots(std::shared_ptr<TensorList> key_cache, std::shared_ptr<TensorList> value_cache);

    Layout layout() const { return layout_; }
    std::size_t layer_count() const;

    // Appends k and v (same dtype and token count) to layer `layer_index`
    // along seq, with transformers' semantics:
    // modern: missing layers are appended bare; an uninitialized layer is
    //   lazily initialized (keys/values become empty tensors of k's dtype:
    //   whatever they held is dropped); then keys/values grow;
    // legacy: both lists are padded with empty tensors; a new or empty slot
    //   takes k itself (an alias of the caller's tensor); otherwise it grows.
    // "Grows" is in place: the storage the slot holds is appended to.
    void update(const Tensor& k, const Tensor& v, std::size_t layer_index);
    // 0 when the layer is missing, uninitialized (modern) or holds nothing.
    std::int64_t seq_length(std::size_t layer_index = 0) const;

    // Modern: the layer list (never null); legacy: null, and the reverse.
    const std::shared_ptr<LayerList>& layers() const { return layers_; }
    const std::shared_ptr<TensorList>& key_cache() const { return key_cache_; }
    const std::shared_ptr<TensorList>& value_cache() const { return value_cache_; }

    // The owned-copy marker: set on copies, cleared when stored.
    bool owned() const { return owned_; }
    void set_owned(bool owned) { owned_ = owned; }

    // The caches this one was copied from, by generation (level 0: its
    // sources, level 1: theirs, ...). Weak: lineage keeps nothing alive.
    using Lineage = std::vector<std::vector<std::weak_ptr<const Cache>>>;
    const Lineage& lineage() const { return lineage_; }
    void set_lineage(Lineage lineage) { lineage_ = std::move(lineage); }

  private:
    explicit Cache(Layout layout) : layout_(layout) {}

    Layout layout_;
    std::shared_ptr<LayerList> layers_;
    std::shared_ptr<TensorList> key_cache_;
    std::shared_ptr<TensorList> value_cache_;
    bool owned_ = false;
    Lineage lineage_;
};

// What a model sees as layer i's keys (side keys) or values (side values):
// modern: the modern slot when present, else the legacy-named one, and
// nothing when the layer is uninitialized; legacy: the list entry.
Tensor logical(const Cache& cache, std::size_t layer_index, Slot side);
// Does the cache hold any K or V element a model would see?
bool holds_tokens(const Cache& cache);
// The dtype of the first tensor the cache holds (any slot, any layer), else f32.
DType cache_dtype(const Cache& cache);
// The heads and head_dim of the first logical K or V holding tokens, else
// the defaults.
std::pair<std::int64_t, std::int64_t> cache_geometry(const Cache& cache);

// How deep a clone goes. Depth::shallow is vector-engine-shallow's bug: the
// copy has its own lists and layer objects, but their tensors are the
// source's storages (copying a Layer copies the pointers).
enum class Depth : std::uint8_t { deep, shallow };

// A copy of `source`: new lists and layer objects, every present slot copied
// on its own (one-sided and legacy-named ones too), flags and layout kept.
// Not marked owned here: the caller (Copier) marks and logs copies.
CachePtr clone(const Cache& source, Depth depth);
// Layer i of the result: the logical keys (values) of every part that has
// them, concatenated in order; initialized. Modern unless every part is
// legacy. New storages throughout. Requires at least one part.
CachePtr concat(const std::vector<ConstCachePtr>& parts);
// modern -> legacy, aliasing each layer's logical keys/values (an empty
// tensor where a layer has none). Throws std::invalid_argument on a legacy cache.
CachePtr to_legacy(const Cache& cache);
// legacy -> modern, every layer initialized and holding copies. Throws on a modern cache.
CachePtr from_legacy(const Cache& cache);

// Bytes held by the cache's tensors, at their dtype's width.
std::int64_t footprint_bytes(const Cache& cache);

// Identities of everything a cache is made of: its lists, its layer objects
// and its storages. Two caches alias iff they share one.
std::vector<std::uint64_t> storage_identities(const Cache& cache);

// The K/V sets alive on the copy chain ending in `cache`: itself plus each
// lineage level with a live member.
std::int64_t live_sets_on_path(const Cache& cache);

}  // namespace vector_engine
