#include "reference/reference_engine.h"

#include "reference/cache_views.h"
#include "reference/crashing_fs.h"

#include <stdexcept>

namespace kvcheck::adapters {

ReferenceEngine::ReferenceEngine(std::shared_ptr<kv::Copier> copier)
    : copier_(copier), store_(std::move(copier)), model_(kv::models::DecoderConfig{}) {}

ReferenceEngine::~ReferenceEngine() = default;

Capabilities ReferenceEngine::capabilities() const {
    Capabilities capabilities;
    capabilities.entry_versions = true;
    capabilities.metadata = true;
    capabilities.returned_caches = returned_caches_;
    capabilities.trim = true;
    capabilities.batch = true;
    capabilities.owned_marker = owned_marker_;
    if (store_.capacity() > 0) {
        capabilities.policy.capacity_items = static_cast<std::int64_t>(store_.capacity());
        capabilities.policy.eviction = eviction_;
    }
    return capabilities;
}

void ReferenceEngine::set_capacity(std::size_t items, Eviction eviction) {
    if (eviction != Eviction::lru && eviction != Eviction::lrs) {
        throw std::invalid_argument(std::string("the reference evicts lru or lrs, not ") + eviction_name(eviction));
    }
    store_.set_capacity(items);
    eviction_ = eviction;
}

void ReferenceEngine::handed_out(const std::string& id) {
    if (eviction_ == Eviction::lru) store_.touch(id);  // under lrs a store is the only use
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

void ReferenceEngine::store_add(const std::string& id, const kv::CachePtr& cache, const Metadata& metadata) {
    store_.add({{id, cache, metadata}});
}

void ReferenceEngine::store_dump(const std::string& dir, kv::FileSystem& fs) { store_.dump(dir, fs); }

kv::CachePtr ReferenceEngine::convert_from_legacy(const kv::Cache& cache) { return copier_->from_legacy(cache); }

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

void ReferenceEngine::add(const std::string& id, const CacheContent& content, const Metadata& metadata) {
    store_add(id, materialize(content), metadata);
}

void ReferenceEngine::add_handle(const std::string& id, Handle h) {
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("add_handle: handle holds no cache");
    // Storing a handed-out cache is the caller giving it to the store: the
    // store takes the object itself, as the Python store does, and clears
    // its owned marker.
    store_add(id, std::const_pointer_cast<kv::Cache>(cache), {});
}

void ReferenceEngine::get(const std::string& id, Handle out) {
    const kv::ItemPtr item = store_.get(id);
    handed_out(id);
    handles_[out] = item ? item->cache : nullptr;
    handle_metadata_[out] = item ? item->metadata : Metadata{};
}

std::vector<std::optional<std::string>> ReferenceEngine::get_by_ids(const std::vector<std::string>& ids) {
    std::vector<std::optional<std::string>> found;
    for (const kv::ItemPtr& item : store_.get_by_ids(ids)) {
        found.push_back(item ? std::optional<std::string>(item->id) : std::nullopt);
    }
    for (const std::string& id : ids) handed_out(id);
    return found;
}

std::vector<std::string> ReferenceEngine::get_all_ids() {
    std::vector<std::string> ids;
    for (const kv::ItemPtr& item : store_.get_all()) ids.push_back(item->id);
    return ids;
}

void ReferenceEngine::get_cache(const std::vector<std::string>& ids, Handle out) {
    handles_[out] = store_get_cache(ids);
    for (const std::string& id : ids) handed_out(id);
}

void ReferenceEngine::remove(const std::vector<std::string>& ids) {
    store_.remove(ids);
    for (const std::string& id : ids) versions_.forget(id);
}

void ReferenceEngine::remove_all() {
    store_.remove_all();
    versions_.clear();
}

void ReferenceEngine::dump(const std::string& dir) { store_dump(dir, file_system()); }

void ReferenceEngine::dump_interrupted(const std::string& dir, std::int64_t bytes_budget) {
    CrashingFileSystem fs(bytes_budget, file_system());
    try {
        store_dump(dir, fs);
    } catch (const CrashingFileSystem::PowerCut&) {
        // The process "died" here; whatever is on disk stays as it is.
    }
}

LoadResult ReferenceEngine::load(const std::string& dir) {
    versions_.clear();
    try {
        store_.load(dir, file_system());
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

kv::CachePtr ReferenceEngine::working_cache(const kv::ConstCachePtr& past) {
    const kv::CachePtr working = kv::own_for_generation(past, *copier_);
    // A fresh cache (no past) shares nothing with anything stored: the
    // caller owns it as it owns the boundary's copy.
    working->set_owned(true);
    return working;
}

void ReferenceEngine::run_on(kv::Cache& working, const std::vector<std::int64_t>& prompt, std::int64_t max_new_tokens,
                             std::vector<std::int64_t>& tokens, kv::GenerationStats& stats) {
    kv::run_model(model_, prompt, working, max_new_tokens,
                  [&tokens](std::int64_t token) { tokens.push_back(token); }, &stats);
}

// docs/semantics.md#returned-caches: the boundary's cache, written into by
// the model, handed to the caller.
GenerateResult ReferenceEngine::generate_returning(Handle h, const std::vector<std::int64_t>& prompt,
                                                   std::int64_t max_new_tokens, Handle out) {
    kv::GenerationStats stats;
    GenerateResult result;
    const kv::CachePtr working = working_cache(handle(h));
    run_on(*working, prompt, max_new_tokens, result.tokens, stats);
    result.peak_live_sets = stats.peak_live_sets;
    bind(out, working);
    return result;
}

kv::CachePtr ReferenceEngine::extracted(const std::vector<std::int64_t>& prompt) {
    if (prompt.empty()) throw std::invalid_argument("extract: the prompt is empty");
    const kv::CachePtr memory = kv::Cache::make(kv::Layout::modern);
    model_.forward(prompt, *memory);
    return memory;
}

// The store takes the cache the prefill wrote into and clears its marker:
// nothing else holds it.
void ReferenceEngine::extract(const std::string& id, const std::vector<std::int64_t>& prompt) {
    store_add(id, extracted(prompt), {});
}

CacheView ReferenceEngine::fed_view(const CacheContent& content, const std::vector<std::int64_t>& tokens) {
    const kv::CachePtr fresh = materialize(content);
    if (!tokens.empty()) model_.forward(tokens, *fresh);
    return view_of(*fresh);
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
    handles_[out] = cache ? convert_from_legacy(*cache) : nullptr;
}

// docs/semantics.md#trimming: kvcheck asks it only of a cache the caller
// owns (a stored item is read-only). No guard here, as transformers' crop
// has none: a mutant whose copy is its stored item (M28) then cuts the
// store, which stored-immutable reports, rather than refusing the trim.
void ReferenceEngine::trim(Handle h, std::int64_t keep) {
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("trim: the handle holds no cache");
    kv::crop(*std::const_pointer_cast<kv::Cache>(cache), keep);
}

// docs/semantics.md#batches: the row handed out is the one deliberate copy.
void ReferenceEngine::batch_row(const std::vector<Handle>& rows, std::int64_t repeat,
                                const std::vector<std::int64_t>& reorder, std::int64_t select, Handle out) {
    std::vector<kv::ConstCachePtr> caches;
    for (const Handle row : rows) {
        kv::ConstCachePtr cache = handle(row);
        if (!cache) throw std::invalid_argument("batch: a row's handle holds no cache");
        caches.push_back(std::move(cache));
    }
    handles_[out] = copier_->batch_row(caches, kv::BatchSteps{repeat, reorder, select}, kv::CopyReason::user);
}

void ReferenceEngine::release(Handle h) {
    handles_.erase(h);
    handle_metadata_.erase(h);
}

Metadata ReferenceEngine::entry_metadata(const std::string& id) {
    stored_cache(id);  // names a missing id
    return found_item_->metadata;
}

Metadata ReferenceEngine::handle_metadata(Handle h) {
    const auto found = handle_metadata_.find(h);
    return found == handle_metadata_.end() ? Metadata{} : found->second;
}

std::vector<std::string> ReferenceEngine::stored_ids() { return get_all_ids(); }

CacheView ReferenceEngine::view_entry(const std::string& id) { return view_of(stored_cache(id)); }

std::uint64_t ReferenceEngine::entry_digest(const std::string& id) { return digest_of(stored_cache(id)); }

bool ReferenceEngine::entry_owned(const std::string& id) { return owned_marker_ && stored_cache(id).owned(); }

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
    return {cache != nullptr, owned_marker_ && cache && cache->owned()};
}

std::vector<std::uint64_t> ReferenceEngine::storage_of_entry(const std::string& id) {
    return storage_numbers(stored_cache(id));
}

std::vector<std::uint64_t> ReferenceEngine::storage_of_handle(Handle h) {
    const kv::ConstCachePtr cache = handle(h);
    return cache ? storage_numbers(*cache) : std::vector<std::uint64_t>{};
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

// Stays while the entry's cache is made of the same objects, unchanged
// (reference/entry_versions.h).
std::uint64_t ReferenceEngine::entry_version(const std::string& id) {
    EntryVersions::Slot& slot = versions_.slot(id);
    if (kv::ItemPtr item = EntryVersions::stored_item(slot)) found_item_ = std::move(item);
    const kv::Cache& cache = stored_cache(id);
    return versions_.version(slot, found_item_, cache);  // stored_cache's item: the one `cache` belongs to
}

void ReferenceEngine::each_warmed(const std::vector<std::string>& ids, Warm what,
                                  const std::function<void(const std::string&)>& take) {
    const auto find = [this](const std::string& id) { return store_.find(id); };
    adapters::each_warmed(ids, versions_, find, what, [&](const std::string& id, kv::ItemPtr item) {
        found_item_ = std::move(item);
        take(id);
    });
}

std::vector<EntryFacts> ReferenceEngine::read_entries(const std::vector<std::string>& ids, bool with_storage) {
    std::vector<EntryFacts> facts;
    facts.reserve(ids.size());
    each_warmed(ids, Warm::facts, [&](const std::string& id) {
        facts.push_back({entry_digest(id), entry_owned(id), with_storage ? storage_of_entry(id) : std::vector<std::uint64_t>{}});
    });
    return facts;
}

std::vector<std::uint64_t> ReferenceEngine::entry_versions(const std::vector<std::string>& ids) {
    std::vector<std::uint64_t> versions;
    versions.reserve(ids.size());
    each_warmed(ids, Warm::versions, [&](const std::string& id) { versions.push_back(entry_version(id)); });
    return versions;
}

}  // namespace kvcheck::adapters
