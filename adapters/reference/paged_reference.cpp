#include "reference/paged_reference.h"

#include "reference/cache_views.h"

#include <cstring>
#include <optional>
#include <stdexcept>
#include <typeinfo>

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

// A block's digest (PagedBlock::digest: view_digest of paged_block_view of
// its filled slots) read straight from the pool's rows: the modern cache
// block_kv gives, each layer's keys and values [1, heads, filled, head_dim],
// hashed without a tensor made. Through block_kv a block costs a dozen
// trips through libtorch's dispatcher, and the pool is read around every
// paged operation: that was nearly all of a checked operation's time.
// Only for kv::paged::Pool itself, whose block_kv this mirrors: a subclass
// (a mutant) may read a block otherwise, and is read through block_kv.
//
// A digest is remembered with everything it is made of: the block's
// written and filled slots and its whole rows in the four tensors of each
// layer (a copy); it is given again only while all of them are the same,
// byte for byte, so that a block an operation did not touch costs a
// comparison, and one it changed (or whose rows changed by any other way)
// is hashed again.
class PagedReference::RowDigests {
  public:
    // Looks at the pool's tensors (at each reading: nothing is assumed of
    // them between two); false when the rows cannot be read here.
    bool attach(const kv::paged::Pool& pool) {
        config_ = pool.config();
        rows_.clear();
        bool usable = typeid(pool) == typeid(kv::paged::Pool);
        const std::vector<const std::vector<at::Tensor>*> lists = {&pool.written_keys(), &pool.staged_keys(),
                                                                   &pool.written_values(), &pool.staged_values()};
        for (const std::vector<at::Tensor>* list : lists) usable = usable && static_cast<std::int64_t>(list->size()) == config_.layers;
        for (std::int64_t l = 0; usable && l < config_.layers; ++l) {
            for (const std::vector<at::Tensor>* list : lists) {
                const at::Tensor& t = (*list)[static_cast<std::size_t>(l)];
                usable = usable && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                         t.sizes() == at::IntArrayRef({config_.blocks, config_.heads, config_.block_tokens, config_.head_dim});
                if (usable) rows_.push_back(t.data_ptr<float>());
            }
        }
        if (!usable) return false;
        row_floats_ = static_cast<std::size_t>(config_.heads * config_.block_tokens * config_.head_dim);
        const std::size_t memo_floats = static_cast<std::size_t>(config_.blocks) * rows_.size() * row_floats_;
        if (known_.size() != static_cast<std::size_t>(config_.blocks) || seen_.size() != memo_floats) {
            known_.assign(static_cast<std::size_t>(config_.blocks), Known{});
            seen_.assign(memo_floats, 0.0f);
        }
        return true;
    }

    // The digest, or nothing when it must be read through block_kv.
    std::optional<std::uint64_t> of(std::int64_t block, const kv::paged::Block& b) {
        const auto filled = static_cast<std::int64_t>(b.tokens.size());
        if (rows_.empty() || block < 0 || block >= config_.blocks || b.written < 0 || b.written > filled ||
            filled > config_.block_tokens) {
            return std::nullopt;
        }
        Known& known = known_[static_cast<std::size_t>(block)];
        float* seen = seen_.data() + static_cast<std::size_t>(block) * rows_.size() * row_floats_;
        if (known.valid && known.written == b.written && known.filled == filled && same_rows(block, seen)) return known.digest;
        for (std::size_t k = 0; k < rows_.size(); ++k) {
            std::memcpy(seen + k * row_floats_, row(k, block), row_floats_ * sizeof(float));
        }
        known = {true, b.written, filled, hash(block, b.written, filled)};
        return known.digest;
    }

  private:
    struct Known {
        bool valid = false;
        std::int64_t written = 0;
        std::int64_t filled = 0;
        std::uint64_t digest = 0;
    };

    // Block `block`'s rows in tensor k ([heads, B, head_dim], contiguous).
    const float* row(std::size_t k, std::int64_t block) const {
        return rows_[k] + static_cast<std::size_t>(block) * row_floats_;
    }

    bool same_rows(std::int64_t block, const float* seen) const {
        for (std::size_t k = 0; k < rows_.size(); ++k) {
            if (std::memcmp(seen + k * row_floats_, row(k, block), row_floats_ * sizeof(float)) != 0) return false;
        }
        return true;
    }

    std::uint64_t hash(std::int64_t block, std::int64_t written, std::int64_t filled) {
        ViewDigest digest(Layout::modern, static_cast<std::size_t>(config_.layers));
        const std::int64_t shape[] = {1, config_.heads, filled, config_.head_dim};
        for (std::size_t l = 0; l < static_cast<std::size_t>(config_.layers); ++l) {
            digest.layer(true);
            for (std::size_t side = 0; side < 2; ++side) {  // keys, then values: written rows, then pending
                gather(row(4 * l + 2 * side, block), row(4 * l + 2 * side + 1, block), written, filled);
                digest.slot(Dtype::f32, shape, 4, content_hash(values_.data(), values_.size()));
            }
            digest.absent_slot();  // key_cache
            digest.absent_slot();  // value_cache
        }
        return digest.value();
    }

    // The block's [heads, filled, head_dim] values: slots below `written`
    // from the written rows, the rest from the pending ones.
    void gather(const float* main, const float* staged, std::int64_t written, std::int64_t filled) {
        const std::int64_t d = config_.head_dim;
        values_.clear();
        for (std::int64_t h = 0; h < config_.heads; ++h) {
            for (std::int64_t s = 0; s < filled; ++s) {
                const float* from = (s < written ? main : staged) + (h * config_.block_tokens + s) * d;
                values_.insert(values_.end(), from, from + d);
            }
        }
    }

    kv::paged::PoolConfig config_;
    std::vector<const float*> rows_;  // per layer: written keys, staged keys, written values, staged values
    std::size_t row_floats_ = 0;
    std::vector<Known> known_;        // by block
    std::vector<float> seen_;         // by block: its rows in each tensor when its digest was made
    std::vector<float> values_;
};

PagedReference::PagedReference(PoolFactory make_pool, kv::paged::PoolConfig config)
    : paged_model_(kv::models::DecoderConfig{config.layers, config.heads, config.head_dim, 32, -1, 1, config.window}),
      row_digests_(std::make_unique<RowDigests>()) {
    pool_ = make_pool ? make_pool(config, paged_model_) : std::make_unique<kv::paged::Pool>(config, paged_model_);
}

PagedReference::~PagedReference() = default;

Capabilities PagedReference::capabilities() const {
    Capabilities capabilities = ReferenceEngine::capabilities();
    capabilities.paged = true;
    // Trimming and batches are the contiguous reference's (judged there):
    // the paged reference's traces stay those of the paged family and the
    // store.
    capabilities.trim = false;
    capabilities.batch = false;
    const kv::paged::PoolConfig& config = pool_->config();
    capabilities.paged_free_order = config.free_to_front      ? PagedFreeOrder::front
                                    : config.free_by_last_use ? PagedFreeOrder::lru
                                                              : PagedFreeOrder::back;
    // A pool with a window takes no rewind (the blocks behind it are gone).
    capabilities.paged_rewind = config.window == 0;
    return capabilities;
}

std::int64_t PagedReference::paged_alloc(std::int64_t seq, const PagedTokens& tokens, std::int64_t salt) {
    const auto held = hold();
    return pool_->alloc(seq_name(seq), tokens, extra_of(salt));
}

PagedTokens PagedReference::paged_append(std::int64_t seq, std::int64_t count) {
    const auto held = hold();
    return pool_->append(seq_name(seq), count);
}

void PagedReference::paged_fork(std::int64_t parent, std::int64_t child) {
    const auto held = hold();
    pool_->fork(seq_name(parent), seq_name(child));
}

void PagedReference::paged_free(std::int64_t seq) {
    const auto held = hold();
    pool_->free(seq_name(seq));
}

std::int64_t PagedReference::paged_lookup(const PagedTokens& tokens, std::int64_t salt) {
    const auto held = hold();
    return pool_->lookup(tokens, extra_of(salt));
}

void PagedReference::paged_evict() {
    const auto held = hold();
    pool_->evict();
}

void PagedReference::paged_reset() {
    const auto held = hold();
    pool_->reset();
}

void PagedReference::paged_step() {
    const auto held = hold();
    pool_->step();
}

void PagedReference::paged_import(std::int64_t seq, const CacheContent& content) {
    const auto held = hold();
    pool_->import_contiguous(seq_name(seq), *materialize(content));
}

PagedExported PagedReference::paged_export(std::int64_t seq) {
    const auto held = hold();
    const kv::CachePtr cache = pool_->export_contiguous(seq_name(seq));
    return {view_of(*cache), storage_numbers(*cache)};
}

void PagedReference::paged_rewind(std::int64_t seq, std::int64_t count, std::int64_t token) {
    const auto held = hold();
    pool_->rewind(seq_name(seq), count, token);
}

PagedState PagedReference::paged_state() {
    const auto held = hold();
    PagedState state;
    state.block_tokens = pool_->config().block_tokens;
    state.window = pool_->config().window;
    const auto& blocks = pool_->blocks();
    const bool rows = read_rows_ && row_digests_->attach(*pool_);
    state.blocks.reserve(blocks.size());
    for (std::size_t b = 0; b < blocks.size(); ++b) {
        const kv::paged::Block& block = blocks[b];
        PagedBlock facts;
        facts.count = block.count;
        facts.keyed = block.key.has_value();
        if (block.key) facts.key = {block.key->parent, block.key->tokens, block.key->extra};
        facts.tokens = block.tokens;
        facts.written = block.written;
        if (!block.tokens.empty()) {
            const std::optional<std::uint64_t> fast = rows ? row_digests_->of(static_cast<std::int64_t>(b), block) : std::nullopt;
            if (fast) {
                facts.digest = *fast;
            } else {
                const auto kv = pool_->block_kv(static_cast<std::int64_t>(b));
                facts.digest = digest_of(*cache_of(kv, 0, static_cast<std::int64_t>(block.tokens.size())));
            }
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
    const auto held = hold();
    if (block < 0 || block >= pool_->config().blocks) throw std::invalid_argument("no block " + std::to_string(block));
    const auto kv = pool_->block_kv(block);
    const auto filled = static_cast<std::int64_t>(pool_->blocks()[static_cast<std::size_t>(block)].tokens.size());
    return view_of(*cache_of(kv, 0, std::min(slots, filled)));
}

CacheView PagedReference::paged_sequence_view(std::int64_t seq) {
    const auto held = hold();
    return view_of(*pool_->read_sequence(seq_name(seq)));
}

CacheView PagedReference::paged_fresh_view(const PagedTokens& tokens, std::int64_t salt, std::int64_t first, std::int64_t count) {
    const auto held = hold();
    const kv::CachePtr fresh = pool_->fresh(tokens, extra_of(salt));
    if (first < 0 || count < 0 || first + count > static_cast<std::int64_t>(tokens.size())) {
        throw std::invalid_argument("paged_fresh_view: positions outside the tokens");
    }
    return view_of(*cache_of(layers_of(*fresh), first, count));
}

std::vector<std::uint64_t> PagedReference::paged_pool_storage() {
    const auto held = hold();
    std::vector<std::uint64_t> numbers;
    for (const void* id : pool_->storage()) numbers.push_back(reinterpret_cast<std::uintptr_t>(id));
    return numbers;
}

std::optional<PagedTokens> PagedReference::paged_decode_exported(std::int64_t seq, std::int64_t count) {
    const auto held = hold();
    const std::string name = seq_name(seq);
    const kv::CachePtr cache = pool_->export_contiguous(name);
    PagedTokens tokens;
    const kv::paged::Sequence& sequence = pool_->sequences().at(name);
    std::int64_t next = sequence.next;
    for (std::int64_t i = 0; i < count; ++i) {
        tokens.push_back(next);
        next = paged_model_.forward_extra({next}, *cache, sequence.extra);
    }
    return tokens;
}

}  // namespace kvcheck::adapters
