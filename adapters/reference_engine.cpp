#include "reference_engine.h"

#include <ATen/EmptyTensor.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

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

at::Tensor slot_tensor(const SlotContent& slot, at::ScalarType dtype) {
    if (!slot.present) return {};
    if (slot.segments.empty()) return kv::empty_slot(at::TensorOptions().dtype(dtype));
    std::vector<float> values;
    fill_slot(slot, values);
    // Made in place: at::tensor, reshape and to would be three trips through
    // the dispatcher per slot (and at::empty a fourth).
    at::Tensor made = at::detail::empty_cpu({cache_batch, cache_heads, slot.tokens(), cache_head_dim}, at::kFloat);
    assert(static_cast<std::size_t>(made.numel()) == values.size());
    std::memcpy(made.data_ptr<float>(), values.data(), values.size() * sizeof(float));
    return dtype == at::kFloat ? made : made.to(dtype);
}

// A slot's content_hash. A contiguous float32 slot (what caches mostly
// hold) is hashed where it lies: the conversion would cost two trips
// through the dispatcher per slot, most of a small cache's view.
std::uint64_t slot_hash(const at::Tensor& t) {
    const auto count = static_cast<std::size_t>(t.numel());
    if (t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu()) {
        return content_hash(count == 0 ? nullptr : t.data_ptr<float>(), count);
    }
    const at::Tensor values = t.to(at::kFloat).contiguous();
    return content_hash(values.data_ptr<float>(), count);
}

SlotView slot_view(const at::Tensor& t) {
    SlotView view;
    if (!t.defined()) return view;
    view.present = true;
    view.dtype = dtype_of(t.scalar_type());
    view.shape.assign(t.sizes().begin(), t.sizes().end());
    view.hash = slot_hash(t);
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

std::vector<std::uint64_t> as_numbers(const std::vector<const void*>& ids) {
    std::vector<std::uint64_t> numbers;
    numbers.reserve(ids.size());
    for (const void* id : ids) numbers.push_back(reinterpret_cast<std::uintptr_t>(id));
    return numbers;
}

}  // namespace

kv::CachePtr materialize(const CacheContent& content) {
    const at::ScalarType dtype = scalar_type(content.dtype);
    if (content.layout == Layout::legacy) {
        auto keys = std::make_shared<kv::TensorList>();
        auto values = std::make_shared<kv::TensorList>();
        for (const LayerContent& layer : content.layers) {
            keys->push_back(slot_tensor(layer.slots[kvcheck::keys], dtype));
            values->push_back(slot_tensor(layer.slots[kvcheck::values], dtype));
        }
        return kv::Cache::from_slots(std::move(keys), std::move(values));
    }
    auto layers = std::make_shared<kv::LayerList>();
    for (const LayerContent& layer : content.layers) {
        auto made = std::make_shared<kv::Layer>();
        made->keys = slot_tensor(layer.slots[kvcheck::keys], dtype);
        made->values = slot_tensor(layer.slots[kvcheck::values], dtype);
        made->key_cache = slot_tensor(layer.slots[kvcheck::key_cache], dtype);
        made->value_cache = slot_tensor(layer.slots[kvcheck::value_cache], dtype);
        made->is_initialized = layer.initialized;
        layers->push_back(std::move(made));
    }
    return kv::Cache::from_layers(std::move(layers));
}

CacheView view_of(const kv::Cache& cache) {
    CacheView view;
    view.layout = cache.layout() == kv::Layout::modern ? Layout::modern : Layout::legacy;
    view.layers.reserve(static_cast<std::size_t>(cache.layer_count()));
    for (std::int64_t i = 0; i < cache.layer_count(); ++i) {
        LayerView layer_view;
        if (cache.layout() == kv::Layout::legacy) {
            layer_view.slots[keys] = slot_view((*cache.key_cache())[i]);
            layer_view.slots[values] = slot_view((*cache.value_cache())[i]);
        } else {
            const kv::Layer& layer = *(*cache.layers())[i];
            layer_view.initialized = layer.is_initialized;
            layer_view.slots[keys] = slot_view(layer.keys);
            layer_view.slots[values] = slot_view(layer.values);
            layer_view.slots[key_cache] = slot_view(layer.key_cache);
            layer_view.slots[value_cache] = slot_view(layer.value_cache);
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

// ---- entry versions -----------------------------------------------------------

// K/V slots are 4-D (an empty one 1-D).
constexpr std::size_t geometry_dims_max = 4;

// A slot as it was: the tensor object itself, held so that no new tensor
// can take its address while the snapshot lives, and what can change about
// it in place. Its values change only through an in-place op, which bumps
// the version counter (the counter views share with their base); its
// geometry and storage may be changed in place, so they are kept as values.
// Compact (80 bytes): matching an entry's snapshot reads all of its slots,
// cold in a big store, so its size is what a poll of a version costs in
// memory traffic after the tensors themselves.
struct SlotSnapshot {
    at::Tensor tensor;  // undefined: the slot was absent
    std::int64_t version = 0;
    const void* storage = nullptr;
    const void* data = nullptr;
    std::int64_t offset = 0;
    // Inline, not vectors: a snapshot is taken whenever an entry is read
    // anew, and two allocations per slot were most of its cost. Slots of
    // more than geometry_dims_max dimensions, or of a size or stride over
    // 2^31 - 1, keep their tensor only and never match (trackable is
    // false), so they are read every time.
    std::array<std::int32_t, geometry_dims_max> sizes{};
    std::array<std::int32_t, geometry_dims_max> strides{};
    at::ScalarType dtype = at::kFloat;
    std::uint8_t dims = 0;
    bool trackable = false;  // see trackable(): never matches when false
};
static_assert(sizeof(SlotSnapshot) <= 80, "a snapshot of 12 slots stays under 1 KiB");

// Everything view_of, storage_identities and owned() read of a cache: the
// lists and layer objects (held, like the tensors), the flags, the slots.
struct EntrySnapshot {
    // The stored item it was taken of: while the store holds it (its
    // `stored` flag), the entry is found through it, without a look-up.
    kv::ItemPtr item;
    kv::Layout layout = kv::Layout::modern;
    bool owned = false;
    std::shared_ptr<kv::LayerList> layers;
    std::shared_ptr<kv::TensorList> key_cache;
    std::shared_ptr<kv::TensorList> value_cache;
    std::vector<kv::LayerPtr> layer_objects;
    std::vector<bool> initialized;
    std::vector<SlotSnapshot> slots;  // modern: 4 per layer; legacy: the keys, then the values
    std::size_t legacy_keys = 0;      // legacy: how many of the slots are keys
    std::uint64_t version = 0;
};

namespace {

// A tensor whose changes cannot be seen from its metadata: an inference
// tensor has no version counter, a storage-less one no storage to compare.
bool fits_inline(at::IntArrayRef values) {
    if (values.size() > geometry_dims_max) return false;
    for (const std::int64_t value : values) {
        if (value < 0 || value > std::numeric_limits<std::int32_t>::max()) return false;
    }
    return true;
}

bool trackable(const at::Tensor& t) {
    return !t.defined() ||
           (!t.is_inference() && t.has_storage() && fits_inline(t.sizes()) && fits_inline(t.strides()));
}

void keep_inline(at::IntArrayRef values, std::array<std::int32_t, geometry_dims_max>& kept) {
    for (std::size_t d = 0; d < values.size(); ++d) kept[d] = static_cast<std::int32_t>(values[d]);
}

bool same_inline(at::IntArrayRef values, const std::array<std::int32_t, geometry_dims_max>& kept, std::size_t dims) {
    if (values.size() != dims) return false;
    for (std::size_t d = 0; d < dims; ++d) {
        if (values[d] != kept[d]) return false;
    }
    return true;
}

// A trackable tensor's version counter, read from its TensorImpl (inline):
// Tensor::_version() is an out-of-line call through the autograd hooks'
// registry, per tensor, every time a snapshot is taken or matched.
std::int64_t version_of(const at::Tensor& t) {
    return static_cast<std::int64_t>(t.unsafeGetTensorImpl()->version_counter().current_version());
}

SlotSnapshot slot_snapshot(const at::Tensor& t) {
    SlotSnapshot slot;
    slot.tensor = t;
    slot.trackable = trackable(t);
    if (!t.defined() || !slot.trackable) return slot;
    slot.version = version_of(t);
    slot.storage = t.storage().unsafeGetStorageImpl();
    slot.data = t.storage().data();
    slot.dtype = t.scalar_type();
    slot.offset = t.storage_offset();
    slot.dims = static_cast<std::uint8_t>(t.dim());
    keep_inline(t.sizes(), slot.sizes);
    keep_inline(t.strides(), slot.strides);
    return slot;
}

bool unchanged(const SlotSnapshot& slot, const at::Tensor& t) {
    if (!t.defined() || !slot.tensor.defined()) return t.defined() == slot.tensor.defined();
    // The same object: whether it is trackable cannot have changed.
    return t.unsafeGetTensorImpl() == slot.tensor.unsafeGetTensorImpl() && slot.trackable &&
           version_of(t) == slot.version &&
           t.storage().unsafeGetStorageImpl() == slot.storage && t.storage().data() == slot.data &&
           t.scalar_type() == slot.dtype && t.storage_offset() == slot.offset &&
           same_inline(t.sizes(), slot.sizes, slot.dims) && same_inline(t.strides(), slot.strides, slot.dims);
}

std::array<const at::Tensor*, slot_count> layer_slots(const kv::Layer& layer) {
    return {&layer.keys, &layer.values, &layer.key_cache, &layer.value_cache};
}

// Lets go of everything `snapshot` holds, keeping the capacity of its lists.
void let_go(EntrySnapshot* snapshot) {
    snapshot->item.reset();
    snapshot->layers.reset();
    snapshot->key_cache.reset();
    snapshot->value_cache.reset();
    snapshot->layer_objects.clear();
    snapshot->initialized.clear();
    snapshot->slots.clear();
    snapshot->legacy_keys = 0;
}

// A snapshot's slot list is given room for at least this many slots (four
// layers) when it grows: the list is over 1 KiB, and every allocation of
// that size made glibc consolidate its free lists (a fifth of the cost of
// reading the entries a step reaches); snapshots are kept and reused, so
// each grows about once.
constexpr std::size_t snapshot_slots_min = 16;

void reserve_slots(EntrySnapshot* snapshot, std::size_t count) {
    if (snapshot->slots.capacity() < count) snapshot->slots.reserve(std::max(count, snapshot_slots_min));
}

// Fills `snapshot` anew, keeping the capacity of its lists: an entry read
// anew (added again, or changed) takes no allocation for them.
void take_snapshot(const kv::Cache& cache, EntrySnapshot* snapshot) {
    let_go(snapshot);
    snapshot->layout = cache.layout();
    snapshot->owned = cache.owned();
    if (cache.layout() == kv::Layout::modern) {
        snapshot->layers = cache.layers();
        snapshot->layer_objects.reserve(cache.layers()->size());
        snapshot->initialized.reserve(cache.layers()->size());
        reserve_slots(snapshot, cache.layers()->size() * slot_count);
        for (const kv::LayerPtr& layer : *cache.layers()) {
            snapshot->layer_objects.push_back(layer);
            snapshot->initialized.push_back(layer->is_initialized);
            for (const at::Tensor* t : layer_slots(*layer)) snapshot->slots.push_back(slot_snapshot(*t));
        }
    } else {
        snapshot->key_cache = cache.key_cache();
        snapshot->value_cache = cache.value_cache();
        snapshot->legacy_keys = cache.key_cache()->size();
        reserve_slots(snapshot, cache.key_cache()->size() + cache.value_cache()->size());
        for (const at::Tensor& t : *cache.key_cache()) snapshot->slots.push_back(slot_snapshot(t));
        for (const at::Tensor& t : *cache.value_cache()) snapshot->slots.push_back(slot_snapshot(t));
    }
}

// Is `cache` made of exactly what `snapshot` holds, unchanged?
bool matches(const EntrySnapshot& snapshot, const kv::Cache& cache) {
    if (cache.layout() != snapshot.layout || cache.owned() != snapshot.owned) return false;
    std::size_t slot = 0;
    if (cache.layout() == kv::Layout::modern) {
        const kv::LayerList& layers = *cache.layers();
        if (cache.layers() != snapshot.layers || layers.size() != snapshot.layer_objects.size()) return false;
        for (std::size_t i = 0; i < layers.size(); ++i) {
            if (layers[i] != snapshot.layer_objects[i] || layers[i]->is_initialized != snapshot.initialized[i]) return false;
            for (const at::Tensor* t : layer_slots(*layers[i])) {
                if (!unchanged(snapshot.slots[slot++], *t)) return false;
            }
        }
        return true;
    }
    if (cache.key_cache() != snapshot.key_cache || cache.value_cache() != snapshot.value_cache) return false;
    if (cache.key_cache()->size() != snapshot.legacy_keys ||
        cache.key_cache()->size() + cache.value_cache()->size() != snapshot.slots.size()) {
        return false;
    }
    for (const kv::TensorList* list : {cache.key_cache().get(), cache.value_cache().get()}) {
        for (const at::Tensor& t : *list) {
            if (!unchanged(snapshot.slots[slot++], t)) return false;
        }
    }
    return true;
}

// ---- reading many entries at once ----
//
// A full read of a big store finds its entries cold in memory, and a cache
// is a chain of objects: the cache, its lists and their arrays, the layer
// objects, each tensor's TensorImpl, its storage, then its values. Read an
// entry at a time, each link waits on the one before it. read_entries takes
// a chunk of entries and first asks the memory for every object of one link
// of the chunk before reading any of the next, so that the misses of a link
// overlap; then it reads each entry with the one-entry methods, from the
// cache. entry_versions does the same for the versions.

constexpr std::size_t warm_chunk = 32;

// The values of a slot brought in beyond this are left to the hardware's
// prefetcher (a long slot streams).
constexpr std::size_t warm_values_max = 256;

void prefetch(const void* object, std::size_t bytes = 64) {
    const char* at = static_cast<const char*>(object);
    for (std::size_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(at + offset);
}

// What a warm() brings in at the end of each chain: the values the facts
// (digest_of, owned(), storage_identities) hash, or the version counters a
// version (matches) compares.
enum class Warm { facts, versions };

// The version counter object of a tensor, for a prefetch: VariableVersion
// holds only the intrusive pointer to it and gives no access to it. (A
// prefetch of a wrong address is harmless: it never faults.)
const void* version_counter_of(const c10::TensorImpl* impl) {
    static_assert(sizeof(c10::VariableVersion) == sizeof(void*), "VariableVersion is one intrusive pointer");
    const void* counter = nullptr;
    std::memcpy(&counter, &impl->version_counter(), sizeof counter);
    return counter;
}

// Brings in what `warm` asks of `caches`, link by link. `impls` is scratch.
void warm(const std::vector<const kv::Cache*>& caches, std::vector<const c10::TensorImpl*>& impls, Warm what) {
    for (const kv::Cache* cache : caches) prefetch(cache, sizeof(kv::Cache));
    for (const kv::Cache* cache : caches) {
        if (cache->layout() == kv::Layout::modern) {
            prefetch(cache->layers().get());
        } else {
            prefetch(cache->key_cache().get());
            prefetch(cache->value_cache().get());
        }
    }
    for (const kv::Cache* cache : caches) {
        if (cache->layout() == kv::Layout::modern) {
            prefetch(cache->layers()->data(), cache->layers()->size() * sizeof(kv::LayerPtr));
        } else {
            prefetch(cache->key_cache()->data(), cache->key_cache()->size() * sizeof(at::Tensor));
            prefetch(cache->value_cache()->data(), cache->value_cache()->size() * sizeof(at::Tensor));
        }
    }
    impls.clear();
    for (const kv::Cache* cache : caches) {
        if (cache->layout() == kv::Layout::modern) {
            for (const kv::LayerPtr& layer : *cache->layers()) prefetch(layer.get(), sizeof(kv::Layer));
            continue;
        }
        for (const kv::TensorList* list : {cache->key_cache().get(), cache->value_cache().get()}) {
            for (const at::Tensor& t : *list) {
                if (t.defined()) impls.push_back(t.unsafeGetTensorImpl());
            }
        }
    }
    for (const kv::Cache* cache : caches) {
        if (cache->layout() != kv::Layout::modern) continue;
        for (const kv::LayerPtr& layer : *cache->layers()) {
            for (const at::Tensor* t : layer_slots(*layer)) {
                if (t->defined()) impls.push_back(t->unsafeGetTensorImpl());
            }
        }
    }
    for (const c10::TensorImpl* impl : impls) prefetch(impl, sizeof(c10::TensorImpl));
    for (const c10::TensorImpl* impl : impls) {
        if (impl->has_storage()) prefetch(impl->storage().unsafeGetStorageImpl(), sizeof(c10::StorageImpl));
        if (what == Warm::versions) prefetch(version_counter_of(impl));
    }
    if (what == Warm::versions) return;
    for (const c10::TensorImpl* impl : impls) {
        if (!impl->has_storage() || impl->storage().data() == nullptr) continue;
        const auto itemsize = static_cast<std::size_t>(impl->itemsize());
        prefetch(static_cast<const char*>(impl->storage().data()) + impl->storage_offset() * itemsize,
                 std::min(static_cast<std::size_t>(impl->numel()) * itemsize, warm_values_max));
    }
}

}  // namespace

// The items of ids[begin, end) and their caches, for a batch: through the
// snapshots where the store still holds the item a snapshot was taken of
// (no look-up), else from the store; null for a missing id (left to
// stored_cache, which names it). Each link is asked of the memory for the
// whole chunk before the next is read.
void ReferenceEngine::chunk_items(const std::vector<std::string>& ids, std::size_t begin, std::size_t end,
                                  std::vector<kv::ItemPtr>& items, std::vector<const kv::Cache*>& caches) {
    std::vector<const EntrySnapshot*>& snapshots = chunk_snapshots_;
    snapshots.clear();
    for (std::size_t i = begin; i < end; ++i) {
        const std::unique_ptr<EntrySnapshot>* snapshot = snapshots_.find(ids[i]);
        snapshots.push_back(snapshot ? snapshot->get() : nullptr);
        if (snapshots.back() != nullptr) prefetch(snapshots.back(), sizeof(EntrySnapshot));
    }
    for (const EntrySnapshot* snapshot : snapshots) {
        if (snapshot == nullptr) continue;
        if (snapshot->item) prefetch(snapshot->item.get(), sizeof(kv::Item));
        prefetch(snapshot->slots.data(), snapshot->slots.size() * sizeof(SlotSnapshot));
    }
    items.clear();
    caches.clear();
    for (std::size_t i = begin; i < end; ++i) {
        const EntrySnapshot* snapshot = snapshots[i - begin];
        if (snapshot != nullptr && snapshot->item && snapshot->item->stored) {
            items.push_back(snapshot->item);
        } else {
            const kv::ItemPtr* found = store_.find(ids[i]);
            items.push_back(found ? *found : nullptr);
        }
        if (items.back() != nullptr) caches.push_back(items.back()->cache.get());
    }
}

// Runs `take` on each of `ids`, a chunk of warm_chunk at a time: each
// chunk's items found (chunk_items) and their chains warmed (`what`) first,
// then found_item_ set to each entry's item before `take` reads it with the
// one-entry methods (a subclass's overrides included).
void ReferenceEngine::each_warmed(const std::vector<std::string>& ids, bool values,
                                  const std::function<void(const std::string&)>& take) {
    std::vector<kv::ItemPtr> items;
    std::vector<const kv::Cache*> caches;
    std::vector<const c10::TensorImpl*> impls;
    for (std::size_t begin = 0; begin < ids.size(); begin += warm_chunk) {
        const std::size_t end = std::min(ids.size(), begin + warm_chunk);
        chunk_items(ids, begin, end, items, caches);
        warm(caches, impls, values ? Warm::facts : Warm::versions);
        for (std::size_t i = begin; i < end; ++i) {
            found_item_ = std::move(items[i - begin]);
            take(ids[i]);
        }
    }
}

std::vector<EntryFacts> ReferenceEngine::read_entries(const std::vector<std::string>& ids, bool with_storage) {
    std::vector<EntryFacts> facts;
    facts.reserve(ids.size());
    each_warmed(ids, true, [&](const std::string& id) {
        facts.push_back({entry_digest(id), entry_owned(id), with_storage ? storage_of_entry(id) : std::vector<std::uint64_t>{}});
    });
    return facts;
}

// As read_entries, for the versions: the chain of each cache down to its
// tensors' version counters and storages, and the snapshots they are
// matched with (chunk_items), are asked for first.
std::vector<std::uint64_t> ReferenceEngine::entry_versions(const std::vector<std::string>& ids) {
    std::vector<std::uint64_t> versions;
    versions.reserve(ids.size());
    each_warmed(ids, false, [&](const std::string& id) { versions.push_back(entry_version(id)); });
    return versions;
}

// ---- CrashingFileSystem -----------------------------------------------------

void CrashingFileSystem::write_file(const std::string& path, const std::vector<char>& bytes) {
    if (budget_ < 0) throw PowerCut{};
    const auto size = static_cast<std::int64_t>(bytes.size());
    if (size <= budget_) {
        budget_ -= size;
        kv::posix_file_system().write_file(path, bytes);
        return;
    }
    kv::posix_file_system().write_file(path, std::vector<char>(bytes.begin(), bytes.begin() + budget_));
    budget_ = -1;
    throw PowerCut{};
}

void CrashingFileSystem::rename(const std::string& from, const std::string& to) {
    if (budget_ <= 0) {
        budget_ = -1;
        throw PowerCut{};
    }
    budget_ -= 1;  // a rename costs one unit of budget, so a crash can land just before it
    kv::posix_file_system().rename(from, to);
}

std::vector<char> CrashingFileSystem::read_file(const std::string& path, std::int64_t bytes_max) {
    return kv::posix_file_system().read_file(path, bytes_max);
}

void CrashingFileSystem::remove(const std::string& path) {
    if (budget_ < 0) throw PowerCut{};
    kv::posix_file_system().remove(path);
}

void CrashingFileSystem::make_dirs(const std::string& path) { kv::posix_file_system().make_dirs(path); }

std::vector<std::string> CrashingFileSystem::list(const std::string& dir) { return kv::posix_file_system().list(dir); }

// ---- ReferenceEngine ----------------------------------------------------------

ReferenceEngine::ReferenceEngine(std::shared_ptr<kv::Copier> copier)
    : copier_(copier), store_(std::move(copier)), model_(kv::models::DecoderConfig{}) {}

ReferenceEngine::~ReferenceEngine() = default;

Capabilities ReferenceEngine::capabilities() const {
    Capabilities capabilities;
    capabilities.entry_versions = true;
    return capabilities;
}

kv::ConstCachePtr ReferenceEngine::handle(Handle h) const {
    const auto found = handles_.find(h);
    return found == handles_.end() ? nullptr : found->second;
}

kv::ConstCachePtr ReferenceEngine::stored(const std::string& id) const {
    const kv::ItemPtr item = store_.get(id);
    if (!item) throw std::out_of_range("no stored entry '" + id + "'");
    return item->cache;
}

const kv::Cache& ReferenceEngine::stored_cache(const std::string& id) const {
    if (found_item_ == nullptr || !found_item_->stored || found_item_->id != id) {
        const kv::ItemPtr* found = store_.find(id);
        if (found == nullptr) throw std::out_of_range("no stored entry '" + id + "'");
        found_item_ = *found;
    }
    return *found_item_->cache;
}

kv::CachePtr ReferenceEngine::store_get_cache(const std::vector<std::string>& ids) {
    return store_.get_cache(ids);
}

void ReferenceEngine::store_add(const std::string& id, const kv::CachePtr& cache) {
    store_.add({{id, cache, {}}});
}

void ReferenceEngine::store_dump(const std::string& dir, kv::FileSystem& fs) { store_.dump(dir, fs); }

std::vector<std::int64_t> ReferenceEngine::run_generation(const kv::ConstCachePtr& past,
                                                          const std::vector<std::int64_t>& prompt,
                                                          std::int64_t max_new_tokens, bool stream,
                                                          kv::GenerationStats& stats) {
    if (!stream) return kv::generate(model_, *copier_, prompt, past, max_new_tokens, &stats);
    std::vector<std::int64_t> tokens;
    kv::generate_stream(model_, *copier_, prompt, past, max_new_tokens,
                        [&tokens](std::int64_t token) { tokens.push_back(token); }, &stats);
    return tokens;
}

void ReferenceEngine::add(const std::string& id, const CacheContent& content) {
    store_add(id, materialize(content));
}

void ReferenceEngine::add_handle(const std::string& id, Handle h) {
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("add_handle: handle holds no cache");
    // Storing a handed-out cache is the caller giving it to the store: the
    // store takes the object itself, as the Python store does, and clears
    // its owned marker.
    store_add(id, std::const_pointer_cast<kv::Cache>(cache));
}

void ReferenceEngine::get(const std::string& id, Handle out) {
    const kv::ItemPtr item = store_.get(id);
    handles_[out] = item ? item->cache : nullptr;
}

std::vector<std::optional<std::string>> ReferenceEngine::get_by_ids(const std::vector<std::string>& ids) {
    std::vector<std::optional<std::string>> found;
    for (const kv::ItemPtr& item : store_.get_by_ids(ids)) {
        found.push_back(item ? std::optional<std::string>(item->id) : std::nullopt);
    }
    return found;
}

std::vector<std::string> ReferenceEngine::get_all_ids() {
    std::vector<std::string> ids;
    for (const kv::ItemPtr& item : store_.get_all()) ids.push_back(item->id);
    return ids;
}

void ReferenceEngine::get_cache(const std::vector<std::string>& ids, Handle out) {
    handles_[out] = store_get_cache(ids);
}

void ReferenceEngine::remove(const std::vector<std::string>& ids) {
    store_.remove(ids);
    for (const std::string& id : ids) forget_snapshot(id);
}

// A removed entry's snapshot lets go of what it holds and is kept for the
// next new entry (up to spare_snapshots_max of them): a store whose ids
// come and go then takes no allocation to snapshot them.
void ReferenceEngine::forget_snapshot(const std::string& id) {
    std::unique_ptr<EntrySnapshot>* found = snapshots_.find(id);
    if (found == nullptr) return;
    let_go(found->get());
    if (spare_snapshots_.size() < spare_snapshots_max) spare_snapshots_.push_back(std::move(*found));
    snapshots_.erase(id);
}

void ReferenceEngine::remove_all() {
    store_.remove_all();
    snapshots_.clear();
}

void ReferenceEngine::dump(const std::string& dir) { store_dump(dir, kv::posix_file_system()); }

void ReferenceEngine::dump_interrupted(const std::string& dir, std::int64_t bytes_budget) {
    CrashingFileSystem fs(bytes_budget);
    try {
        store_dump(dir, fs);
    } catch (const CrashingFileSystem::PowerCut&) {
        // The process "died" here; whatever is on disk stays as it is.
    }
}

LoadResult ReferenceEngine::load(const std::string& dir) {
    snapshots_.clear();
    try {
        store_.load(dir);
        return {true, {}};
    } catch (const kv::DumpError& error) {
        return {false, error.what()};
    } catch (const kv::IoError& error) {
        return {false, error.what()};
    }
}

GenerateResult ReferenceEngine::generate(Handle h, const std::vector<std::int64_t>& prompt,
                                         std::int64_t max_new_tokens, bool stream) {
    kv::GenerationStats stats;
    GenerateResult result;
    result.tokens = run_generation(handle(h), prompt, max_new_tokens, stream, stats);
    result.peak_live_sets = stats.peak_live_sets;
    return result;
}

std::vector<std::int64_t> ReferenceEngine::generate_fresh(const CacheContent& content,
                                                          const std::vector<std::int64_t>& prompt,
                                                          std::int64_t max_new_tokens) {
    // A fresh deep copy is already private: run the model on it directly,
    // with no boundary and nothing logged.
    const kv::CachePtr fresh = materialize(content);
    std::vector<std::int64_t> tokens;
    kv::GenerationStats ignored;
    kv::run_model(model_, prompt, *fresh, max_new_tokens,
                  [&tokens](std::int64_t token) { tokens.push_back(token); }, &ignored);
    return tokens;
}

void ReferenceEngine::make(const CacheContent& content, Handle out) { handles_[out] = materialize(content); }

void ReferenceEngine::clone(Handle source, Handle out) {
    const kv::ConstCachePtr cache = handle(source);
    handles_[out] = cache ? copier_->clone(*cache, kv::CopyReason::user) : nullptr;
}

void ReferenceEngine::concat(const std::vector<Handle>& parts, Handle out) {
    std::vector<kv::ConstCachePtr> caches;
    for (Handle part : parts) {
        if (kv::ConstCachePtr cache = handle(part)) caches.push_back(std::move(cache));
    }
    handles_[out] = caches.empty() ? nullptr : copier_->concat(caches, kv::CopyReason::user);
}

void ReferenceEngine::to_legacy(Handle source, Handle out) {
    const kv::ConstCachePtr cache = handle(source);
    handles_[out] = cache ? kv::to_legacy(*cache) : nullptr;
}

void ReferenceEngine::from_legacy(Handle source, Handle out) {
    const kv::ConstCachePtr cache = handle(source);
    handles_[out] = cache ? kv::from_legacy(*cache) : nullptr;
}

void ReferenceEngine::release(Handle h) { handles_.erase(h); }

std::vector<std::string> ReferenceEngine::stored_ids() { return get_all_ids(); }

CacheView ReferenceEngine::view_entry(const std::string& id) { return view_of(stored_cache(id)); }

std::uint64_t ReferenceEngine::entry_digest(const std::string& id) { return digest_of(stored_cache(id)); }

bool ReferenceEngine::entry_owned(const std::string& id) { return stored_cache(id).owned(); }

std::uint64_t ReferenceEngine::handle_digest(Handle h) {
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("handle_digest: handle holds no cache");
    return digest_of(*cache);
}

CacheView ReferenceEngine::view_handle(Handle h) {
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("view_handle: handle holds no cache");
    return view_of(*cache);
}

HandleFacts ReferenceEngine::handle_facts(Handle h) {
    const kv::ConstCachePtr cache = handle(h);
    return {cache != nullptr, cache && cache->owned()};
}

std::vector<std::uint64_t> ReferenceEngine::storage_of_entry(const std::string& id) {
    return as_numbers(kv::storage_identities(stored_cache(id)));
}

std::vector<std::uint64_t> ReferenceEngine::storage_of_handle(Handle h) {
    const kv::ConstCachePtr cache = handle(h);
    return cache ? as_numbers(kv::storage_identities(*cache)) : std::vector<std::uint64_t>{};
}

std::vector<CopyRecord> ReferenceEngine::take_copies() {
    std::vector<CopyRecord> records;
    const auto& log = copier_->log();
    for (std::size_t i = copies_reported_; i < log.size(); ++i) {
        records.push_back({kv::copy_reason_name(log[i].reason), log[i].bytes});
    }
    copies_reported_ = log.size();
    return records;
}

// The version stays while the cache is made of the same objects, unchanged
// (the snapshot holds them, so "the same" cannot be an address reused by a
// new object); any difference gives a version never issued before.
std::uint64_t ReferenceEngine::entry_version(const std::string& id) {
    std::unique_ptr<EntrySnapshot>& snapshot = snapshots_.try_emplace(id).first->value;
    if (snapshot && snapshot->item && snapshot->item->stored) found_item_ = snapshot->item;
    const kv::Cache& cache = stored_cache(id);
    if (snapshot && matches(*snapshot, cache)) return snapshot->version;
    if (!snapshot && !spare_snapshots_.empty()) {
        snapshot = std::move(spare_snapshots_.back());
        spare_snapshots_.pop_back();
    }
    if (!snapshot) snapshot = std::make_unique<EntrySnapshot>();
    take_snapshot(cache, snapshot.get());
    snapshot->item = found_item_;  // stored_cache's: the item `cache` belongs to
    snapshot->version = ++versions_issued_;
    return snapshot->version;
}

}  // namespace kvcheck::adapters
