#include "adapter.h"

#include <stdexcept>

namespace vector_engine {
namespace {

DType dtype_of(kvcheck::Dtype dtype) {
    switch (dtype) {
        case kvcheck::Dtype::f32: return DType::f32;
        case kvcheck::Dtype::f16: return DType::f16;
        case kvcheck::Dtype::bf16: return DType::bf16;
    }
    throw std::invalid_argument("unknown dtype");
}

kvcheck::Dtype kvcheck_dtype(DType dtype) {
    switch (dtype) {
        case DType::f32: return kvcheck::Dtype::f32;
        case DType::f16: return kvcheck::Dtype::f16;
        case DType::bf16: return kvcheck::Dtype::bf16;
    }
    throw std::invalid_argument("unknown dtype");
}

Tensor slot_tensor(const kvcheck::CacheContent& content, const kvcheck::SlotContent& slot, DType dtype) {
    if (!slot.present) return nullptr;
    std::vector<float> values;
    kvcheck::fill_slot(slot, content.heads, content.head_dim, values);
    return make_tensor(dtype, content.heads, slot.tokens(), content.head_dim, std::move(values));
}

kvcheck::SlotView slot_view(const Tensor& tensor) {
    kvcheck::SlotView view;
    if (!tensor) return view;
    view.present = true;
    view.dtype = kvcheck_dtype(tensor->dtype);
    view.shape = tensor->tokens == 0 ? std::vector<std::int64_t>{0}
                                     : std::vector<std::int64_t>{1, tensor->heads, tensor->tokens, tensor->head_dim};
    view.hash = kvcheck::content_hash(tensor->values.data(), tensor->values.size());
    return view;
}

}  // namespace

CachePtr materialize(const kvcheck::CacheContent& content) {
    const DType dtype = dtype_of(content.dtype);
    if (content.layout == kvcheck::Layout::legacy) {
        auto key_list = std::make_shared<TensorList>();
        auto value_list = std::make_shared<TensorList>();
        for (const kvcheck::LayerContent& layer : content.layers) {
            key_list->push_back(slot_tensor(content, layer.slots[kvcheck::keys], dtype));
            value_list->push_back(slot_tensor(content, layer.slots[kvcheck::values], dtype));
        }
        return Cache::from_slots(std::move(key_list), std::move(value_list));
    }
    auto layers = std::make_shared<LayerList>();
    for (const kvcheck::LayerContent& layer : content.layers) {
        auto made = std::make_shared<Layer>();
        for (int s = 0; s < slot_count; ++s) made->slots[s] = slot_tensor(content, layer.slots[s], dtype);
        made->initialized = layer.initialized;
        layers->push_back(std::move(made));
    }
    return Cache::from_layers(std::move(layers));
}

kvcheck::CacheView view_of(const Cache& cache) {
    kvcheck::CacheView view;
    view.layout = cache.layout() == Layout::modern ? kvcheck::Layout::modern : kvcheck::Layout::legacy;
    for (std::size_t i = 0; i < cache.layer_count(); ++i) {
        kvcheck::LayerView layer_view;
        if (cache.layout() == Layout::legacy) {
            layer_view.slots[kvcheck::keys] = slot_view((*cache.key_cache())[i]);
            layer_view.slots[kvcheck::values] = slot_view((*cache.value_cache())[i]);
        } else {
            const Layer& layer = *(*cache.layers())[i];
            layer_view.initialized = layer.initialized;
            for (int s = 0; s < slot_count; ++s) layer_view.slots[s] = slot_view(layer.slots[s]);
        }
        view.layers.push_back(layer_view);
    }
    return view;
}

VectorEngine::VectorEngine(Depth copies) : depth_(copies), copier_(copies), store_(copier_) {}

std::string VectorEngine::name() const { return depth_ == Depth::deep ? "vector-engine" : "vector-engine-shallow"; }

CachePtr VectorEngine::handle(kvcheck::Handle h) const {
    const auto found = handles_.find(h);
    return found == handles_.end() ? nullptr : found->second;
}

CachePtr VectorEngine::stored(const std::string& id) const {
    const Item* item = store_.get(id);
    if (item == nullptr) throw std::out_of_range("no stored entry '" + id + "'");
    return item->cache;
}

// ---- the store -----------------------------------------------------------------

void VectorEngine::add(const std::string& id, const kvcheck::CacheContent& content, const kvcheck::Metadata& metadata) {
    store_.add(id, materialize(content), Metadata(metadata.begin(), metadata.end()));
}

void VectorEngine::add_handle(const std::string& id, kvcheck::Handle h) {
    CachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("add_handle: handle holds no cache");
    // The caller gives the cache object to the store, which takes it as it
    // is and clears its owned marker.
    store_.add(id, std::move(cache), {});
}

void VectorEngine::get(const std::string& id, kvcheck::Handle out) {
    const Item* item = store_.get(id);
    handles_[out] = item ? item->cache : nullptr;
    handle_metadata_[out] = item ? kvcheck::Metadata(item->metadata.begin(), item->metadata.end()) : kvcheck::Metadata{};
}

std::vector<std::optional<std::string>> VectorEngine::get_by_ids(const std::vector<std::string>& ids) {
    std::vector<std::optional<std::string>> found;
    for (const std::string& id : ids) {
        const Item* item = store_.get(id);
        found.push_back(item ? std::optional<std::string>(item->id) : std::nullopt);
    }
    return found;
}

std::vector<std::string> VectorEngine::get_all_ids() { return store_.ids(); }

void VectorEngine::get_cache(const std::vector<std::string>& ids, kvcheck::Handle out) {
    handles_[out] = store_.get_cache(ids);
}

void VectorEngine::remove(const std::vector<std::string>& ids) { store_.remove(ids); }

void VectorEngine::remove_all() { store_.remove_all(); }

void VectorEngine::dump(const std::string& dir) { store_.dump(dir, disk_); }

void VectorEngine::dump_interrupted(const std::string& dir, std::int64_t bytes_budget) {
    CrashingDisk disk(bytes_budget);
    try {
        store_.dump(dir, disk);
    } catch (const CrashingDisk::PowerCut&) {
        // The process "died" here: the disk keeps what was written.
    }
}

kvcheck::LoadResult VectorEngine::load(const std::string& dir) {
    try {
        store_.load(dir, disk_);
        return {true, {}};
    } catch (const DumpError& error) {
        return {false, error.what()};
    }
}

// ---- generation ----------------------------------------------------------------

kvcheck::GenerateResult VectorEngine::generate(kvcheck::Handle h, const std::vector<std::int64_t>& prompt,
                                               std::int64_t max_new_tokens, bool stream) {
    // The engine's generation always streams; the batch form collects the stream.
    (void)stream;
    kvcheck::GenerateResult result;
    RunStats stats;
    vector_engine::generate(model_, copier_, handle(h), prompt, max_new_tokens,
                            [&result](std::int64_t token) { result.tokens.push_back(token); }, stats);
    result.peak_live_sets = stats.peak_live_sets;
    return result;
}

std::vector<std::int64_t> VectorEngine::generate_fresh(const kvcheck::CacheContent& content,
                                                       const std::vector<std::int64_t>& prompt,
                                                       std::int64_t max_new_tokens) {
    // A fresh cache is private already: the model runs on it directly, with
    // no boundary and nothing logged.
    const CachePtr fresh = materialize(content);
    std::vector<std::int64_t> tokens;
    RunStats ignored;
    run_model(model_, prompt, *fresh, max_new_tokens, [&tokens](std::int64_t token) { tokens.push_back(token); },
              ignored);
    return tokens;
}

// ---- cache-level -----------------------------------------------------------------

void VectorEngine::make(const kvcheck::CacheContent& content, kvcheck::Handle out) {
    handles_[out] = materialize(content);
}

void VectorEngine::clone(kvcheck::Handle source, kvcheck::Handle out) {
    const CachePtr cache = handle(source);
    handles_[out] = cache ? copier_.clone(*cache, "clone") : nullptr;
}

void VectorEngine::concat(const std::vector<kvcheck::Handle>& parts, kvcheck::Handle out) {
    std::vector<ConstCachePtr> caches;
    for (kvcheck::Handle part : parts) {
        if (CachePtr cache = handle(part)) caches.push_back(std::move(cache));
    }
    handles_[out] = caches.empty() ? nullptr : copier_.concat(caches, "concat");
}

void VectorEngine::to_legacy(kvcheck::Handle source, kvcheck::Handle out) {
    const CachePtr cache = handle(source);
    if (!cache) {
        handles_[out] = nullptr;
        return;
    }
    CachePtr legacy = vector_engine::to_legacy(*cache);
    legacy->set_lineage(cache->lineage());  // the same K/V set as its source, with the same history
    handles_[out] = std::move(legacy);
}

void VectorEngine::from_legacy(kvcheck::Handle source, kvcheck::Handle out) {
    const CachePtr cache = handle(source);
    handles_[out] = cache ? copier_.from_legacy(*cache) : nullptr;
}

void VectorEngine::release(kvcheck::Handle h) {
    handles_.erase(h);
    handle_metadata_.erase(h);
}

kvcheck::Metadata VectorEngine::entry_metadata(const std::string& id) {
    const Item* item = store_.get(id);
    if (item == nullptr) throw std::out_of_range("no stored entry '" + id + "'");
    return kvcheck::Metadata(item->metadata.begin(), item->metadata.end());
}

kvcheck::Metadata VectorEngine::handle_metadata(kvcheck::Handle h) {
    const auto found = handle_metadata_.find(h);
    return found == handle_metadata_.end() ? kvcheck::Metadata{} : found->second;
}

// ---- observations ----------------------------------------------------------------

std::vector<std::string> VectorEngine::stored_ids() { return store_.ids(); }

kvcheck::CacheView VectorEngine::view_entry(const std::string& id) { return view_of(*stored(id)); }

bool VectorEngine::entry_owned(const std::string& id) { return stored(id)->owned(); }

kvcheck::CacheView VectorEngine::view_handle(kvcheck::Handle h) {
    const CachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("view_handle: handle holds no cache");
    return view_of(*cache);
}

kvcheck::HandleFacts VectorEngine::handle_facts(kvcheck::Handle h) {
    const CachePtr cache = handle(h);
    return {cache != nullptr, cache && cache->owned()};
}

std::vector<std::uint64_t> VectorEngine::storage_of_entry(const std::string& id) {
    return storage_identities(*stored(id));
}

std::vector<std::uint64_t> VectorEngine::storage_of_handle(kvcheck::Handle h) {
    const CachePtr cache = handle(h);
    return cache ? storage_identities(*cache) : std::vector<std::uint64_t>{};
}

std::vector<kvcheck::CopyRecord> VectorEngine::take_copies() {
    std::vector<kvcheck::CopyRecord> records;
    const std::vector<CopyEvent>& log = copier_.log();
    for (std::size_t i = copies_reported_; i < log.size(); ++i) records.push_back({log[i].reason, log[i].bytes});
    copies_reported_ = log.size();
    return records;
}

}  // namespace vector_engine
