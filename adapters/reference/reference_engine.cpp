#include "reference/reference_engine.h"

#include "reference/cache_views.h"
#include "reference/crashing_fs.h"

#include "kv/window.h"

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
    capabilities.lease_ttl_ms = leases_.ttl_ms();
    capabilities.batch = true;
    capabilities.owned_marker = owned_marker_;
    // A lock around the store, the handles and the model (hold): every call
    // may come from any thread.
    capabilities.thread_safe = true;
    capabilities.window = window_;
    if (quantized()) {
        capabilities.content_tolerance = quantized_tolerance();
        // A killed dump's states are compared with the expected content's
        // digests exactly (harness/durability/dump_kill.cpp).
        capabilities.dump_kill = false;
    }
    if (window_ > 0) {
        // A dump keeps the K/V, not the positions a window cut (Cache::dropped):
        // a loaded entry would number the next tokens from the wrong place.
        capabilities.dump = false;
        capabilities.dump_crash = false;
        capabilities.dump_kill = false;
        // A layer's K/V under the legacy names only stop counting at the
        // model's first write (docs/semantics.md#returned-caches): the
        // positions a cut of them moved on would count for the modern slot
        // the write starts. Sliding-window layers have no legacy names.
        capabilities.legacy_slot_names = false;
    }
    if (store_.capacity() > 0) {
        capabilities.policy.capacity_items = static_cast<std::int64_t>(store_.capacity());
        capabilities.policy.eviction = eviction_;
    }
    return capabilities;
}

std::unique_lock<std::recursive_mutex> ReferenceEngine::hold() const {
    if (!locked_) return {};
    std::unique_lock<std::recursive_mutex> held = lock_yielding(mutex_);
    // Under the thread level other clients' threads run here, and wait
    // for the lock: the lock, not the scheduler, keeps each call whole.
    yield("locked");
    return held;
}

void ReferenceEngine::unlocked_window(const char* point) const {
    if (!locked_) {
        yield(point);
        return;
    }
    mutex_.unlock();  // held once, by the call's hold()
    yield(point);
    lock_yielding(mutex_).release();  // the call's hold() owns it again, and lets it go at its end
}

void ReferenceEngine::set_capacity(std::size_t items, Eviction eviction) {
    if (eviction != Eviction::lru && eviction != Eviction::lrs) {
        throw std::invalid_argument(std::string("the reference evicts lru or lrs, not ") + eviction_name(eviction));
    }
    store_.set_capacity(items);
    eviction_ = eviction;
}

void ReferenceEngine::enable_leases(std::int64_t ttl_ms) {
    if (ttl_ms <= 0) throw std::invalid_argument("a lease lives 1 ms or more, not " + std::to_string(ttl_ms));
    leases_ = kv::Leases(ttl_ms);
    store_.set_pinned([this](const std::string& id) { return lease_live(id, LeaseUse::evict); });
}

void ReferenceEngine::enable_bundled_leases() {
    enable_leases(bundled_lease_ttl_ms);
    set_capacity(bundled_lease_capacity_items);
}

bool ReferenceEngine::lease_live(const std::string& id, LeaseUse) const { return leases_.live(id); }

void ReferenceEngine::refuse_leased(const std::vector<std::string>& ids, LeaseUse use, const char* what) const {
    if (leases_.ttl_ms() == 0) return;
    for (const std::string& id : ids) {
        if (!lease_live(id, use)) continue;
        const kv::Leases::Lease lease = leases_.lease(id);
        throw std::runtime_error(std::string(what) + ": '" + id + "' holds " + std::to_string(lease.count) +
                                 " live read lease(s) until t=" + std::to_string(lease.until_ms) + " ms");
    }
}

// docs/semantics.md#leases: the clock is kvcheck's, never the wall clock.
void ReferenceEngine::advance_clock(std::int64_t ms) {
    const auto held = hold();
    leases_.advance(ms);
}

void ReferenceEngine::lease(const std::string& id) {
    const auto held = hold();
    if (leases_.ttl_ms() == 0) throw std::logic_error("lease: leases are not enabled");
    if (store_.find(id) == nullptr) throw std::out_of_range("lease: no stored entry '" + id + "'");
    leases_.take(id);
}

void ReferenceEngine::unlease(const std::string& id) {
    const auto held = hold();
    if (!lease_live(id, LeaseUse::give_back)) throw std::runtime_error("unlease: '" + id + "' holds no live lease");
    leases_.give_back(id);
}

void ReferenceEngine::quantize(int mantissa_bits) {
    if (mantissa_bits < 1 || mantissa_bits > 22) {
        throw std::invalid_argument("the reference's quantized mantissa must keep 1 to 22 bits, got " + std::to_string(mantissa_bits));
    }
    mantissa_bits_ = mantissa_bits;
}

kv::CachePtr ReferenceEngine::built(const CacheContent& content) const { return materialize(content, mantissa_bits_); }

void ReferenceEngine::set_window(std::int64_t window) {
    if (window < 1) throw std::invalid_argument("the reference's window must be at least 1 token, got " + std::to_string(window));
    window_ = window;
    kv::models::DecoderConfig config;
    config.window = window;
    model_ = kv::models::Decoder(config);
}

kv::CachePtr ReferenceEngine::windowed(kv::CachePtr cache) const {
    if (window_ > 0 && cache) kv::keep_window(*cache, window_);
    return cache;
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
    store_.add({{id, windowed(cache), metadata}});
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
    const auto held = hold();
    refuse_leased({id}, LeaseUse::replace, "add");
    store_add(id, built(content), metadata);
    leases_.forget(id);
}

void ReferenceEngine::add_handle(const std::string& id, Handle h) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("add_handle: handle holds no cache");
    refuse_leased({id}, LeaseUse::replace, "add_handle");
    leases_.forget(id);
    // Storing a handed-out cache is the caller giving it to the store: the
    // store takes the object itself, as the Python store does, and clears
    // its owned marker.
    store_add(id, std::const_pointer_cast<kv::Cache>(cache), {});
}

void ReferenceEngine::get(const std::string& id, Handle out) {
    const auto held = hold();
    const kv::ItemPtr item = store_.get(id);
    handed_out(id);
    handles_[out] = item ? item->cache : nullptr;
    handle_metadata_[out] = item ? item->metadata : Metadata{};
}

std::vector<std::optional<std::string>> ReferenceEngine::get_by_ids(const std::vector<std::string>& ids) {
    const auto held = hold();
    std::vector<std::optional<std::string>> found;
    for (const kv::ItemPtr& item : store_.get_by_ids(ids)) {
        found.push_back(item ? std::optional<std::string>(item->id) : std::nullopt);
    }
    for (const std::string& id : ids) handed_out(id);
    return found;
}

std::vector<std::string> ReferenceEngine::get_all_ids() {
    const auto held = hold();
    std::vector<std::string> ids;
    for (const kv::ItemPtr& item : store_.get_all()) ids.push_back(item->id);
    return ids;
}

void ReferenceEngine::get_cache(const std::vector<std::string>& ids, Handle out) {
    const auto held = hold();
    handles_[out] = windowed(store_get_cache(ids));
    for (const std::string& id : ids) handed_out(id);
}

void ReferenceEngine::remove(const std::vector<std::string>& ids) {
    const auto held = hold();
    refuse_leased(ids, LeaseUse::remove, "delete");
    store_.remove(ids);
    for (const std::string& id : ids) {
        versions_.forget(id);
        leases_.forget(id);
    }
}

void ReferenceEngine::remove_all() {
    const auto held = hold();
    refuse_leased(stored_ids(), LeaseUse::remove, "delete_all");
    store_.remove_all();
    versions_.clear();
    leases_.forget_all();
}

void ReferenceEngine::dump(const std::string& dir) {
    const auto held = hold();
    store_dump(dir, file_system());
}

void ReferenceEngine::dump_interrupted(const std::string& dir, std::int64_t bytes_budget) {
    const auto held = hold();
    CrashingFileSystem fs(bytes_budget, file_system());
    try {
        store_dump(dir, fs);
    } catch (const CrashingFileSystem::PowerCut&) {
        // The process "died" here; whatever is on disk stays as it is.
    }
}

LoadResult ReferenceEngine::load(const std::string& dir) {
    const auto held = hold();
    refuse_leased(stored_ids(), LeaseUse::remove, "load");
    versions_.clear();
    leases_.forget_all();
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
    const auto held = hold();
    kv::GenerationStats stats;
    GenerateResult result;
    result.tokens = run_generation(handle(h), prompt, max_new_tokens, stream, stats);
    result.peak_live_sets = stats.peak_live_sets;
    return result;
}

std::vector<std::int64_t> ReferenceEngine::generate_fresh(const CacheContent& content,
                                                          const std::vector<std::int64_t>& prompt,
                                                          std::int64_t max_new_tokens) {
    const auto held = hold();
    // A fresh deep copy is already private: run the model on it directly,
    // with no boundary and nothing logged.
    const kv::CachePtr fresh = built(content);
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
    const auto held = hold();
    kv::GenerationStats stats;
    GenerateResult result;
    const kv::CachePtr working = working_cache(handle(h));
    run_on(*working, prompt, max_new_tokens, result.tokens, stats);
    result.peak_live_sets = stats.peak_live_sets;
    bind(out, windowed(working));
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
    const auto held = hold();
    refuse_leased({id}, LeaseUse::replace, "extract");
    store_add(id, extracted(prompt), {});
    leases_.forget(id);
}

CacheView ReferenceEngine::fed_view(const CacheContent& content, const std::vector<std::int64_t>& tokens) {
    const auto held = hold();
    const kv::CachePtr fresh = built(content);
    if (!tokens.empty()) model_.forward(tokens, *fresh);
    return view_of(*windowed(fresh), quantized());
}

void ReferenceEngine::make(const CacheContent& content, Handle out) {
    const auto held = hold();
    handles_[out] = windowed(built(content));
}

void ReferenceEngine::clone(Handle source, Handle out) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(source);
    handles_[out] = cache ? copier_->clone(*cache, kv::CopyReason::user) : nullptr;
}

void ReferenceEngine::concat(const std::vector<Handle>& parts, Handle out) {
    const auto held = hold();
    std::vector<kv::ConstCachePtr> caches;
    for (Handle part : parts) {
        if (kv::ConstCachePtr cache = handle(part)) caches.push_back(std::move(cache));
    }
    handles_[out] = caches.empty() ? nullptr : windowed(copier_->concat(caches, kv::CopyReason::user));
}

void ReferenceEngine::to_legacy(Handle source, Handle out) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(source);
    handles_[out] = cache ? kv::to_legacy(*cache) : nullptr;
}

void ReferenceEngine::from_legacy(Handle source, Handle out) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(source);
    handles_[out] = cache ? convert_from_legacy(*cache) : nullptr;
}

// docs/semantics.md#trimming: kvcheck asks it only of a cache the caller
// owns (a stored item is read-only). No guard here, as transformers' crop
// has none: a mutant whose copy is its stored item (M28) then cuts the
// store, which stored-immutable reports, rather than refusing the trim.
void ReferenceEngine::trim(Handle h, std::int64_t keep) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("trim: the handle holds no cache");
    kv::crop(*std::const_pointer_cast<kv::Cache>(cache), keep);
}

// docs/semantics.md#batches: the row handed out is the one deliberate copy.
void ReferenceEngine::batch_row(const std::vector<Handle>& rows, std::int64_t repeat,
                                const std::vector<std::int64_t>& reorder, std::int64_t select, Handle out) {
    const auto held = hold();
    std::vector<kv::ConstCachePtr> caches;
    for (const Handle row : rows) {
        kv::ConstCachePtr cache = handle(row);
        if (!cache) throw std::invalid_argument("batch: a row's handle holds no cache");
        caches.push_back(std::move(cache));
    }
    handles_[out] = copier_->batch_row(caches, kv::BatchSteps{repeat, reorder, select}, kv::CopyReason::user);
}

void ReferenceEngine::release(Handle h) {
    const auto held = hold();
    handles_.erase(h);
    handle_metadata_.erase(h);
}

Metadata ReferenceEngine::entry_metadata(const std::string& id) {
    const auto held = hold();
    stored_cache(id);  // names a missing id
    return found_item_->metadata;
}

Metadata ReferenceEngine::handle_metadata(Handle h) {
    const auto held = hold();
    const auto found = handle_metadata_.find(h);
    return found == handle_metadata_.end() ? Metadata{} : found->second;
}

std::vector<std::string> ReferenceEngine::stored_ids() {
    const auto held = hold();
    return get_all_ids();
}

CacheView ReferenceEngine::view_entry(const std::string& id) {
    const auto held = hold();
    return view_of(stored_cache(id), quantized());
}

std::uint64_t ReferenceEngine::entry_digest(const std::string& id) {
    const auto held = hold();
    return digest_of(stored_cache(id));
}

bool ReferenceEngine::entry_owned(const std::string& id) {
    const auto held = hold();
    return owned_marker_ && stored_cache(id).owned();
}

std::uint64_t ReferenceEngine::handle_digest(Handle h) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("handle_digest: handle holds no cache");
    return digest_of(*cache);
}

CacheView ReferenceEngine::view_handle(Handle h) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(h);
    if (!cache) throw std::invalid_argument("view_handle: handle holds no cache");
    return view_of(*cache, quantized());
}

HandleFacts ReferenceEngine::handle_facts(Handle h) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(h);
    return {cache != nullptr, owned_marker_ && cache && cache->owned()};
}

std::vector<std::uint64_t> ReferenceEngine::storage_of_entry(const std::string& id) {
    const auto held = hold();
    return storage_numbers(stored_cache(id));
}

std::vector<std::uint64_t> ReferenceEngine::storage_of_handle(Handle h) {
    const auto held = hold();
    const kv::ConstCachePtr cache = handle(h);
    return cache ? storage_numbers(*cache) : std::vector<std::uint64_t>{};
}

std::vector<CopyRecord> ReferenceEngine::take_copies() {
    const auto held = hold();
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
    const auto held = hold();
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
    const auto held = hold();
    std::vector<EntryFacts> facts;
    facts.reserve(ids.size());
    each_warmed(ids, Warm::facts, [&](const std::string& id) {
        facts.push_back({entry_digest(id), entry_owned(id), with_storage ? storage_of_entry(id) : std::vector<std::uint64_t>{}});
    });
    return facts;
}

std::vector<std::uint64_t> ReferenceEngine::entry_versions(const std::vector<std::string>& ids) {
    const auto held = hold();
    std::vector<std::uint64_t> versions;
    versions.reserve(ids.size());
    each_warmed(ids, Warm::versions, [&](const std::string& id) { versions.push_back(entry_version(id)); });
    return versions;
}

}  // namespace kvcheck::adapters
