#include "reference/paged_reference.h"

#include "reference/cache_views.h"

#include <stdexcept>

namespace kvcheck::adapters {
namespace {

std::string seq_name(std::int64_t seq) { return "s" + std::to_string(seq); }
std::string extra_of(std::int64_t salt) { return salt == 0 ? "" : "salt-" + std::to_string(salt); }

// A cache of the first `slots` slots of each layer's K/V.
kv::CachePtr cache_of(const std::vector<std::pair<at::Tensor, at::Tensor>>& kv, std::int64_t first, std::int64_t slots) {
    kv::CachePtr cache = kv::Cache::make(kv::Layout::modern);
    for (std::size_t l = 0; l < kv.size(); ++l) {
        cache->update(kv[l].first.narrow(2, first, slots), kv[l].second.narrow(2, first, slots), static_cast<std::int64_t>(l));
    }
    return cache;
}

std::vector<std::pair<at::Tensor, at::Tensor>> layers_of(const kv::Cache& cache) {
    std::vector<std::pair<at::Tensor, at::Tensor>> kv;
    for (std::int64_t l = 0; l < cache.layer_count(); ++l) kv.emplace_back(kv::logical_keys(cache, l), kv::logical_values(cache, l));
    return kv;
}

}  // namespace

PagedReference::PagedReference(PoolFactory make_pool, kv::paged::PoolConfig config)
    : paged_model_(kv::models::DecoderConfig{config.layers, config.heads, config.head_dim, 32, -1, 1}) {
    pool_ = make_pool ? make_pool(config, paged_model_) : std::make_unique<kv::paged::Pool>(config, paged_model_);
}

Capabilities PagedReference::capabilities() const {
    Capabilities capabilities = ReferenceEngine::capabilities();
    capabilities.paged = true;
    // Trimming is the contiguous reference's (judged there): the paged
    // reference's traces stay those of the paged family and the store.
    capabilities.trim = false;
    capabilities.paged_free_order = pool_->config().free_to_front ? PagedFreeOrder::front : PagedFreeOrder::back;
    return capabilities;
}

std::int64_t PagedReference::paged_alloc(std::int64_t seq, const PagedTokens& tokens, std::int64_t salt) {
    return pool_->alloc(seq_name(seq), tokens, extra_of(salt));
}

PagedTokens PagedReference::paged_append(std::int64_t seq, std::int64_t count) { return pool_->append(seq_name(seq), count); }

void PagedReference::paged_fork(std::int64_t parent, std::int64_t child) { pool_->fork(seq_name(parent), seq_name(child)); }

void PagedReference::paged_free(std::int64_t seq) { pool_->free(seq_name(seq)); }

std::int64_t PagedReference::paged_lookup(const PagedTokens& tokens, std::int64_t salt) {
    return pool_->lookup(tokens, extra_of(salt));
}

void PagedReference::paged_evict() { pool_->evict(); }

void PagedReference::paged_reset() { pool_->reset(); }

void PagedReference::paged_step() { pool_->step(); }

void PagedReference::paged_import(std::int64_t seq, const CacheContent& content) {
    pool_->import_contiguous(seq_name(seq), *materialize(content));
}

PagedExported PagedReference::paged_export(std::int64_t seq) {
    const kv::CachePtr cache = pool_->export_contiguous(seq_name(seq));
    return {view_of(*cache), storage_numbers(*cache)};
}

void PagedReference::paged_rewind(std::int64_t seq, std::int64_t count, std::int64_t token) {
    pool_->rewind(seq_name(seq), count, token);
}

PagedState PagedReference::paged_state() {
    PagedState state;
    state.block_tokens = pool_->config().block_tokens;
    const auto& blocks = pool_->blocks();
    for (std::size_t b = 0; b < blocks.size(); ++b) {
        const kv::paged::Block& block = blocks[b];
        PagedBlock facts;
        facts.count = block.count;
        facts.keyed = block.key.has_value();
        if (block.key) facts.key = {block.key->parent, block.key->tokens, block.key->extra};
        facts.tokens = block.tokens;
        facts.written = block.written;
        if (!block.tokens.empty()) {
            const auto kv = pool_->block_kv(static_cast<std::int64_t>(b));
            facts.digest = digest_of(*cache_of(kv, 0, static_cast<std::int64_t>(block.tokens.size())));
        }
        state.blocks.push_back(std::move(facts));
    }
    state.free_queue.assign(pool_->free_queue().begin(), pool_->free_queue().end());
    for (const auto& [key, list] : pool_->index()) state.index.push_back({{key.parent, key.tokens, key.extra}, list});
    for (const auto& [name, sequence] : pool_->sequences()) {
        const std::int64_t seq = std::stoll(name.substr(1));
        state.tables[seq] = sequence.table;
        state.tokens[seq] = sequence.tokens;
    }
    for (const kv::paged::PendingCopy& copy : pool_->pending_copies()) state.copies.push_back({copy.source, copy.destination});
    return state;
}

CacheView PagedReference::paged_block_view(std::int64_t block, std::int64_t slots) {
    if (block < 0 || block >= pool_->config().blocks) throw std::invalid_argument("no block " + std::to_string(block));
    const auto kv = pool_->block_kv(block);
    const auto filled = static_cast<std::int64_t>(pool_->blocks()[static_cast<std::size_t>(block)].tokens.size());
    return view_of(*cache_of(kv, 0, std::min(slots, filled)));
}

CacheView PagedReference::paged_sequence_view(std::int64_t seq) { return view_of(*pool_->read_sequence(seq_name(seq))); }

CacheView PagedReference::paged_fresh_view(const PagedTokens& tokens, std::int64_t first, std::int64_t count) {
    const kv::CachePtr fresh = pool_->fresh(tokens);
    if (first < 0 || count < 0 || first + count > static_cast<std::int64_t>(tokens.size())) {
        throw std::invalid_argument("paged_fresh_view: positions outside the tokens");
    }
    return view_of(*cache_of(layers_of(*fresh), first, count));
}

std::vector<std::uint64_t> PagedReference::paged_pool_storage() {
    std::vector<std::uint64_t> numbers;
    for (const void* id : pool_->storage()) numbers.push_back(reinterpret_cast<std::uintptr_t>(id));
    return numbers;
}

std::optional<PagedTokens> PagedReference::paged_decode_exported(std::int64_t seq, std::int64_t count) {
    const std::string name = seq_name(seq);
    const kv::CachePtr cache = pool_->export_contiguous(name);
    PagedTokens tokens;
    std::int64_t next = pool_->sequences().at(name).next;
    for (std::int64_t i = 0; i < count; ++i) {
        tokens.push_back(next);
        next = paged_model_.forward({next}, *cache);
    }
    return tokens;
}

}  // namespace kvcheck::adapters
