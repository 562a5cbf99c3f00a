#include "reference/entry_versions.h"

#include "kvcheck/content.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

namespace kvcheck::adapters {

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
// layers) when it grows: the list is over 1 KiB, and allocations of that
// size make glibc consolidate its free lists; snapshots are kept and
// reused, so each grows about once.
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

constexpr std::size_t warm_chunk = 32;

// The values of a slot brought in beyond this are left to the hardware's
// prefetcher (a long slot streams).
constexpr std::size_t warm_values_max = 256;

void prefetch(const void* object, std::size_t bytes = 64) {
    const char* at = static_cast<const char*>(object);
    for (std::size_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(at + offset);
}

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

// The items of ids[begin, end) and their caches: through the snapshots
// where the store still holds the item a snapshot was taken of (no
// look-up), else with `find`; null for a missing id. Each link is asked of
// the memory for the whole chunk before the next is read.
void chunk_items(const std::vector<std::string>& ids, std::size_t begin, std::size_t end, const EntryVersions& versions,
                 const std::function<const kv::ItemPtr*(const std::string&)>& find, std::vector<const EntrySnapshot*>& snapshots,
                 std::vector<kv::ItemPtr>& items, std::vector<const kv::Cache*>& caches) {
    snapshots.clear();
    for (std::size_t i = begin; i < end; ++i) {
        snapshots.push_back(versions.find(ids[i]));
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
            const kv::ItemPtr* found = find(ids[i]);
            items.push_back(found ? *found : nullptr);
        }
        if (items.back() != nullptr) caches.push_back(items.back()->cache.get());
    }
}

}  // namespace

void each_warmed(const std::vector<std::string>& ids, const EntryVersions& versions,
                 const std::function<const kv::ItemPtr*(const std::string&)>& find, Warm what,
                 const std::function<void(const std::string&, kv::ItemPtr)>& take) {
    std::vector<const EntrySnapshot*> snapshots;
    std::vector<kv::ItemPtr> items;
    std::vector<const kv::Cache*> caches;
    std::vector<const c10::TensorImpl*> impls;
    for (std::size_t begin = 0; begin < ids.size(); begin += warm_chunk) {
        const std::size_t end = std::min(ids.size(), begin + warm_chunk);
        chunk_items(ids, begin, end, versions, find, snapshots, items, caches);
        warm(caches, impls, what);
        for (std::size_t i = begin; i < end; ++i) take(ids[i], std::move(items[i - begin]));
    }
}

// ---- EntryVersions ------------------------------------------------------------

EntryVersions::EntryVersions() = default;
EntryVersions::~EntryVersions() = default;

EntryVersions::Slot& EntryVersions::slot(const std::string& id) { return snapshots_.try_emplace(id).first->value; }

kv::ItemPtr EntryVersions::stored_item(const Slot& slot) {
    return slot && slot->item && slot->item->stored ? slot->item : nullptr;
}

std::uint64_t EntryVersions::version(Slot& slot, const kv::ItemPtr& item, const kv::Cache& cache) {
    if (slot && matches(*slot, cache)) return slot->version;
    if (!slot && !spare_.empty()) {
        slot = std::move(spare_.back());
        spare_.pop_back();
    }
    if (!slot) slot = std::make_unique<EntrySnapshot>();
    take_snapshot(cache, slot.get());
    slot->item = item;
    slot->version = ++issued_;
    return slot->version;
}

void EntryVersions::forget(const std::string& id) {
    Slot* found = snapshots_.find(id);
    if (found == nullptr) return;
    let_go(found->get());
    if (spare_.size() < spare_max) spare_.push_back(std::move(*found));
    snapshots_.erase(id);
}

void EntryVersions::clear() { snapshots_.clear(); }

const EntrySnapshot* EntryVersions::find(const std::string& id) const {
    const Slot* found = snapshots_.find(id);
    return found ? found->get() : nullptr;
}

}  // namespace kvcheck::adapters
