#include "kv/paged_pool.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <stdexcept>

namespace kv::paged {
namespace {

std::uint64_t mix(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

std::string seq_text(const std::string& seq) { return "sequence '" + seq + "'"; }

}  // namespace

std::uint64_t chain_hash(const BlockKey& key) {
    std::uint64_t h = mix(key.parent ^ 0x5EED);
    for (const std::int64_t token : key.tokens) h = mix(h ^ static_cast<std::uint64_t>(token));
    for (const char c : key.extra) h = mix(h ^ static_cast<unsigned char>(c));
    return mix(h ^ key.extra.size());
}

Pool::Pool(PoolConfig config, Model& model) : config_(config), model_(model) {
    if (config_.blocks < 2 || config_.block_tokens < 1 || config_.layers < 1 || config_.heads < 1 || config_.head_dim < 1) {
        throw std::invalid_argument("paged pool: needs at least 2 blocks (the null block and one), blocks of at least 1 token, and a geometry of at least 1 layer, head and dim");
    }
    if (config_.window < 0) throw std::invalid_argument("paged pool: the window must be >= 0 tokens (0: full attention)");
    blocks_.resize(static_cast<std::size_t>(config_.blocks));
    for (BlockId b = 1; b < config_.blocks; ++b) free_.push_back(b);
    const auto shape = std::vector<std::int64_t>{config_.blocks, config_.heads, config_.block_tokens, config_.head_dim};
    for (std::int64_t l = 0; l < config_.layers; ++l) {
        keys_.push_back(at::zeros(shape, at::kFloat));  // float32, contiguous: block_kv reads their rows
        values_.push_back(at::zeros(shape, at::kFloat));
        staged_keys_.push_back(at::zeros(shape, at::kFloat));
        staged_values_.push_back(at::zeros(shape, at::kFloat));
    }
}

void Pool::use(const std::string& seq) {
    ++operations_;
    for (const BlockId block : sequence(seq).table) blocks_[static_cast<std::size_t>(block)].used = operations_;
}

Sequence& Pool::sequence(const std::string& seq) {
    const auto at = sequences_.find(seq);
    if (at == sequences_.end()) throw std::invalid_argument("paged pool: no " + seq_text(seq));
    return at->second;
}

// ---- keys and lookup ----------------------------------------------------------

std::vector<BlockKey> Pool::keys_of(const Tokens& tokens, const std::string& extra, std::size_t count) const {
    const std::string keyed = key_extra(extra);
    std::vector<BlockKey> keys;
    std::uint64_t parent = 0;
    const auto b = static_cast<std::size_t>(config_.block_tokens);
    for (std::size_t i = 0; i < count && (i + 1) * b <= tokens.size(); ++i) {
        BlockKey key{parent, Tokens(tokens.begin() + static_cast<std::ptrdiff_t>(i * b),
                                    tokens.begin() + static_cast<std::ptrdiff_t>((i + 1) * b)),
                     keyed};
        parent = chain_hash(key);
        keys.push_back(std::move(key));
    }
    return keys;
}

std::vector<BlockKey> Pool::block_keys(const Tokens& tokens, const std::string& extra) const {
    // A hit ends before the last token: the model must run over one at least.
    const std::size_t hittable = tokens.empty() ? 0 : (tokens.size() - 1) / static_cast<std::size_t>(config_.block_tokens);
    return keys_of(tokens, extra, hittable);
}

std::optional<BlockId> Pool::find(const BlockKey& key) const {
    const auto at = index_.find(key);
    if (at == index_.end() || at->second.empty()) return std::nullopt;
    return at->second.front();
}

std::vector<BlockId> Pool::hits(const Tokens& tokens, const std::string& extra) const {
    std::vector<BlockId> found;
    for (const BlockKey& key : block_keys(tokens, extra)) {
        const std::optional<BlockId> block = find(key);
        if (!block) break;
        found.push_back(*block);
    }
    return found;
}

std::int64_t Pool::lookup(const Tokens& tokens, const std::string& extra) const {
    return static_cast<std::int64_t>(hits(tokens, extra).size()) * config_.block_tokens;
}

// ---- blocks ------------------------------------------------------------------------

void Pool::remove_from_index(BlockId block) {
    Block& b = blocks_[static_cast<std::size_t>(block)];
    if (!b.key) return;
    const auto at = index_.find(*b.key);
    if (at != index_.end()) {
        auto& list = at->second;
        list.erase(std::remove(list.begin(), list.end(), block), list.end());
        if (list.empty()) index_.erase(at);
    }
    b.key.reset();
}

BlockId Pool::take_free() {
    if (free_.empty()) throw std::runtime_error("paged pool: out of blocks");
    const BlockId block = free_.front();
    free_.pop_front();
    remove_from_index(block);
    Block& b = blocks_[static_cast<std::size_t>(block)];
    b.tokens.clear();
    b.written = 0;
    ++b.epoch;
    return block;
}

void Pool::unref(BlockId block) {
    Block& b = blocks_[static_cast<std::size_t>(block)];
    if (b.count <= 0) throw std::logic_error("paged pool: block " + std::to_string(block) + " released with no reference");
    if (--b.count != 0) return;
    if (config_.free_to_front) {
        free_.push_front(block);
    } else if (config_.free_by_last_use) {
        const auto later = std::find_if(free_.begin(), free_.end(), [this, &b](BlockId other) {
            return blocks_[static_cast<std::size_t>(other)].used > b.used;
        });
        free_.insert(later, block);
    } else {
        free_.push_back(block);
    }
}

void Pool::copy_block(BlockId source, BlockId destination) {
    const std::vector<std::pair<at::Tensor, at::Tensor>> kv = block_kv(source);
    const auto filled = static_cast<std::int64_t>(blocks_[static_cast<std::size_t>(source)].tokens.size());
    stage(destination, 0, kv, 0, filled);
    blocks_[static_cast<std::size_t>(destination)].tokens = blocks_[static_cast<std::size_t>(source)].tokens;
    ++blocks_[static_cast<std::size_t>(source)].count;  // the copy reads it until step()
    copies_.push_back({source, destination});
}

void Pool::publish_later(BlockId block, BlockKey key) {
    publications_.push_back({block, blocks_[static_cast<std::size_t>(block)].epoch, std::move(key)});
}

void Pool::publish(BlockId block, const BlockKey& key) {
    blocks_[static_cast<std::size_t>(block)].key = key;
    index_[key].push_back(block);
}

void Pool::attach_hits(Sequence& sequence, const std::vector<BlockId>& hits, std::int64_t) {
    for (const BlockId block : hits) {
        Block& b = blocks_[static_cast<std::size_t>(block)];
        if (b.count++ == 0) free_.erase(std::find(free_.begin(), free_.end(), block));
        sequence.table.push_back(block);
    }
}

void Pool::release_sequence(Sequence& sequence) {
    for (auto it = sequence.table.rbegin(); it != sequence.table.rend(); ++it) {
        if (*it != 0) unref(*it);
    }
}

void Pool::stage(BlockId block, std::int64_t slot, const std::vector<std::pair<at::Tensor, at::Tensor>>& kv,
                 std::int64_t first, std::int64_t n) {
    if (n <= 0) return;
    for (std::size_t l = 0; l < kv.size(); ++l) {
        staged_keys_[l][block].narrow(1, slot, n).copy_(kv[l].first[0].narrow(1, first, n));
        staged_values_[l][block].narrow(1, slot, n).copy_(kv[l].second[0].narrow(1, first, n));
    }
}

// Copied row by row from the pool's (contiguous float32) tensors into new
// ones: a block is read at every append (its sequence's K/V) and export,
// and slicing and concatenating tensors cost a dozen trips through
// libtorch's dispatcher per block, most of an append's time.
std::vector<std::pair<at::Tensor, at::Tensor>> Pool::block_kv(BlockId block) const {
    if (block < 0 || block >= config_.blocks) throw std::out_of_range("paged pool: no block " + std::to_string(block));
    const Block& b = blocks_[static_cast<std::size_t>(block)];
    const auto filled = static_cast<std::int64_t>(b.tokens.size());
    if (b.written < 0 || b.written > filled || filled > config_.block_tokens) {
        throw std::logic_error("paged pool: block " + std::to_string(block) + " has " + std::to_string(b.written) +
                               " slots written of " + std::to_string(filled) + " filled");
    }
    const std::int64_t d = config_.head_dim;
    const std::int64_t rows = config_.heads * config_.block_tokens * d;  // a block's floats in each tensor
    std::vector<std::pair<at::Tensor, at::Tensor>> kv;
    kv.reserve(keys_.size());
    for (std::size_t l = 0; l < keys_.size(); ++l) {
        auto side = [&](const at::Tensor& main, const at::Tensor& staged) {
            at::Tensor out = at::detail::empty_cpu({1, config_.heads, filled, d}, at::kFloat);
            float* to = out.data_ptr<float>();
            const float* written = main.data_ptr<float>() + block * rows;
            const float* pending = staged.data_ptr<float>() + block * rows;
            for (std::int64_t h = 0; h < config_.heads; ++h) {
                for (std::int64_t slot = 0; slot < filled; ++slot, to += d) {
                    const float* from = (slot < b.written ? written : pending) + (h * config_.block_tokens + slot) * d;
                    std::copy(from, from + d, to);
                }
            }
            return out;
        };
        kv.emplace_back(side(keys_[l], staged_keys_[l]), side(values_[l], staged_values_[l]));
    }
    return kv;
}

// A null block in a table (behind a window) reads as B slots of zeros.
std::vector<std::pair<at::Tensor, at::Tensor>> Pool::null_kv() const {
    std::vector<std::pair<at::Tensor, at::Tensor>> kv;
    for (std::int64_t l = 0; l < config_.layers; ++l) {
        kv.emplace_back(at::zeros({1, config_.heads, config_.block_tokens, config_.head_dim}, at::kFloat),
                        at::zeros({1, config_.heads, config_.block_tokens, config_.head_dim}, at::kFloat));
    }
    return kv;
}

CachePtr Pool::gather(const Sequence& sequence) const {
    CachePtr cache = Cache::make(Layout::modern);
    if (sequence.table.empty()) return cache;
    std::vector<std::vector<at::Tensor>> keys(keys_.size()), values(keys_.size());
    for (const BlockId block : sequence.table) {
        auto kv = block == 0 && config_.window > 0 ? null_kv() : block_kv(block);
        for (std::size_t l = 0; l < kv.size(); ++l) {
            keys[l].push_back(kv[l].first);
            values[l].push_back(kv[l].second);
        }
    }
    for (std::size_t l = 0; l < keys.size(); ++l) {
        cache->update(at::cat(keys[l], 2), at::cat(values[l], 2), static_cast<std::int64_t>(l));
    }
    return cache;
}

void Pool::write_tokens(Sequence& sequence, const Cache& cache, std::int64_t first, const Tokens& tokens) {
    const std::int64_t b = config_.block_tokens;
    std::vector<std::pair<at::Tensor, at::Tensor>> kv;
    for (std::int64_t l = 0; l < config_.layers; ++l) kv.emplace_back(logical_keys(cache, l), logical_values(cache, l));
    std::int64_t done = 0;
    const auto n = static_cast<std::int64_t>(tokens.size());
    while (done < n) {
        const std::int64_t position = first + done;
        const auto index = static_cast<std::size_t>(position / b);
        const std::int64_t slot = position % b;
        if (index == sequence.table.size()) {
            const BlockId fresh = take_free();
            ++blocks_[static_cast<std::size_t>(fresh)].count;  // the table's reference
            sequence.table.push_back(fresh);
        } else if (must_copy(sequence.table[index])) {
            const BlockId shared = sequence.table[index];
            const BlockId fresh = take_free();
            ++blocks_[static_cast<std::size_t>(fresh)].count;  // the table's reference
            copy_block(shared, fresh);
            unref(shared);  // the table's reference moves to the copy
            sequence.table[index] = fresh;
        }
        const BlockId block = sequence.table[index];
        const std::int64_t run = std::min(b - slot, n - done);
        stage(block, slot, kv, position, run);
        Tokens& held = blocks_[static_cast<std::size_t>(block)].tokens;
        held.resize(static_cast<std::size_t>(slot));
        held.insert(held.end(), tokens.begin() + done, tokens.begin() + done + run);
        done += run;
        if (slot + run == b && !sequence.imported) {
            // sequence.tokens holds the first `first` tokens until the end.
            Tokens known = sequence.tokens;
            known.insert(known.end(), tokens.begin(), tokens.begin() + done);
            const std::vector<BlockKey> keys = keys_of(known, sequence.extra, index + 1);
            if (keys.size() == index + 1) publish_later(block, keys.back());
        }
    }
    sequence.tokens.insert(sequence.tokens.end(), tokens.begin(), tokens.end());
}

// ---- operations -----------------------------------------------------------------------

std::int64_t Pool::alloc(const std::string& seq, const Tokens& tokens, const std::string& extra) {
    if (sequences_.count(seq) != 0) throw std::invalid_argument("paged pool: " + seq_text(seq) + " exists");
    if (tokens.empty()) throw std::invalid_argument("paged pool: alloc of " + seq_text(seq) + " with no tokens");
    const std::vector<BlockId> shared = hits(tokens, extra);
    std::int64_t free_after_touch = free_blocks();
    for (const BlockId block : shared) free_after_touch -= blocks_[static_cast<std::size_t>(block)].count == 0 ? 1 : 0;
    const std::int64_t needed = blocks_for(static_cast<std::int64_t>(tokens.size())) - static_cast<std::int64_t>(shared.size());
    if (needed > free_after_touch) {
        throw std::runtime_error("paged pool: out of blocks (" + seq_text(seq) + " needs " + std::to_string(needed) + ", " +
                                 std::to_string(free_after_touch) + " free)");
    }
    const auto cached = static_cast<std::int64_t>(shared.size()) * config_.block_tokens;
    // The model runs before anything changes, over the hits' K/V: a bad
    // token throws here.
    Sequence reader;
    reader.table = shared;
    CachePtr working = gather(reader);
    const Tokens missing(tokens.begin() + cached, tokens.end());
    const std::int64_t next = model_.forward_extra(missing, *working, extra);
    Sequence& made = sequences_.emplace(seq, Sequence{}).first->second;
    made.extra = extra;
    made.next = next;
    attach_hits(made, shared, needed);
    made.tokens.assign(tokens.begin(), tokens.begin() + cached);
    write_tokens(made, *working, cached, missing);
    use(seq);
    return cached;
}

Tokens Pool::append(const std::string& seq, std::int64_t k) {
    Sequence& s = sequence(seq);
    if (k < 1) throw std::invalid_argument("paged pool: append of " + std::to_string(k) + " tokens");
    const auto length = static_cast<std::int64_t>(s.tokens.size());
    std::int64_t needed = blocks_for(length + k) - static_cast<std::int64_t>(s.table.size());
    if (length % config_.block_tokens != 0 && must_copy(s.table.back())) ++needed;
    if (needed > free_blocks()) {
        throw std::runtime_error("paged pool: out of blocks (append to " + seq_text(seq) + " needs " + std::to_string(needed) +
                                 ", " + std::to_string(free_.size()) + " free)");
    }
    CachePtr working = working_cache(s);
    Tokens added;
    std::int64_t next = s.next;
    for (std::int64_t i = 0; i < k; ++i) {
        added.push_back(next);
        next = model_.forward_extra({next}, *working, s.extra);
    }
    write_tokens(s, *working, length, added);
    s.next = next;
    use(seq);
    return added;
}

void Pool::fork(const std::string& parent, const std::string& child) {
    if (sequences_.count(child) != 0) throw std::invalid_argument("paged pool: " + seq_text(child) + " exists");
    const Sequence copy = sequence(parent);
    for (const BlockId block : copy.table) {
        if (block != 0) ref(block);  // the null block counts nothing
    }
    sequences_.emplace(child, copy);
    use(child);
}

void Pool::free(const std::string& seq) {
    Sequence& s = sequence(seq);
    release_sequence(s);
    sequences_.erase(seq);
}

void Pool::truncate_block(BlockId block, std::int64_t slots) {
    remove_from_index(block);
    publications_.erase(std::remove_if(publications_.begin(), publications_.end(),
                                       [block](const Publication& p) { return p.block == block; }),
                        publications_.end());
    Block& b = blocks_[static_cast<std::size_t>(block)];
    b.tokens.resize(static_cast<std::size_t>(slots));
    b.written = std::min(b.written, slots);
}

void Pool::rewind(const std::string& seq, std::int64_t n, std::int64_t token) {
    Sequence& s = sequence(seq);
    if (n < 1) throw std::invalid_argument("paged pool: rewind of " + std::to_string(n) + " tokens");
    if (config_.window > 0) throw std::invalid_argument("paged pool: no rewind with a window (the blocks behind it are gone)");
    const auto length = static_cast<std::int64_t>(s.tokens.size());
    const std::int64_t kept = std::max<std::int64_t>(1, length - n);
    if (kept == length) {
        s.next = token;
        use(seq);
        return;
    }
    const std::int64_t b = config_.block_tokens;
    const auto blocks_kept = static_cast<std::size_t>(blocks_for(kept));
    const std::int64_t slots = kept - static_cast<std::int64_t>(blocks_kept - 1) * b;  // in the last kept block
    const BlockId last = s.table[blocks_kept - 1];
    const bool copy = slots < b && must_copy(last);
    if (copy && free_blocks() < 1) {
        throw std::runtime_error("paged pool: out of blocks (rewind of " + seq_text(seq) + " copies its shared last block, 0 free)");
    }
    // Blocks left empty leave the table, the last first.
    while (s.table.size() > blocks_kept) {
        unref(s.table.back());
        s.table.pop_back();
    }
    if (slots < b) {
        if (copy) {
            const BlockId fresh = take_free();
            ++blocks_[static_cast<std::size_t>(fresh)].count;  // the table's reference
            copy_block(last, fresh);
            unref(last);  // the table's reference moves to the copy
            s.table.back() = fresh;
            blocks_[static_cast<std::size_t>(fresh)].tokens.resize(static_cast<std::size_t>(slots));
        } else {
            truncate_block(last, slots);
        }
    }
    s.tokens.resize(static_cast<std::size_t>(kept));
    s.next = token;
    use(seq);
}

void Pool::evict() {
    for (const BlockId block : free_) remove_from_index(block);
}

void Pool::reset() {
    if (!sequences_.empty() || !copies_.empty()) {
        throw std::runtime_error("paged pool: reset while " + std::to_string(sequences_.size()) + " sequences and " +
                                 std::to_string(copies_.size()) + " pending copies hold blocks");
    }
    index_.clear();
    for (Block& b : blocks_) {
        b.key.reset();
        b.used = 0;
    }
    std::sort(free_.begin(), free_.end());
}

void Pool::step() {
    for (std::size_t i = 1; i < blocks_.size(); ++i) {
        Block& b = blocks_[i];
        const auto filled = static_cast<std::int64_t>(b.tokens.size());
        if (b.written >= filled) continue;
        const auto block = static_cast<std::int64_t>(i);
        for (std::size_t l = 0; l < keys_.size(); ++l) {
            keys_[l][block].narrow(1, b.written, filled - b.written).copy_(staged_keys_[l][block].narrow(1, b.written, filled - b.written));
            values_[l][block].narrow(1, b.written, filled - b.written).copy_(staged_values_[l][block].narrow(1, b.written, filled - b.written));
        }
        b.written = filled;
    }
    for (Publication& p : publications_) {
        Block& b = blocks_[static_cast<std::size_t>(p.block)];
        if (b.epoch != p.epoch || b.key || b.written != config_.block_tokens) continue;
        publish(p.block, p.key);
    }
    publications_.clear();
    const std::vector<PendingCopy> ending = std::move(copies_);
    copies_.clear();
    for (const PendingCopy& copy : ending) end_copy(copy);
    for (auto& entry : sequences_) slide(entry.second);
}

std::int64_t Pool::blocks_behind_window(std::int64_t length) const {
    if (config_.window <= 0) return 0;
    // The next token, at position `length`, sees length - window + 1 on.
    return std::max<std::int64_t>(0, length - config_.window + 1) / config_.block_tokens;
}

void Pool::slide(Sequence& sequence) {
    const auto behind = static_cast<std::size_t>(
        std::min<std::int64_t>(blocks_behind_window(static_cast<std::int64_t>(sequence.tokens.size())),
                               static_cast<std::int64_t>(sequence.table.size())));
    for (std::size_t i = behind; i-- > 0;) {
        if (sequence.table[i] == 0) break;  // released at an earlier step, with all before it
        unref(sequence.table[i]);
        sequence.table[i] = 0;
    }
}

void Pool::import_contiguous(const std::string& seq, const Cache& cache) {
    if (sequences_.count(seq) != 0) throw std::invalid_argument("paged pool: " + seq_text(seq) + " exists");
    if (cache.layout() != Layout::modern || cache.layer_count() != config_.layers) {
        throw std::invalid_argument("paged pool: import needs a modern cache of " + std::to_string(config_.layers) + " layers");
    }
    std::int64_t length = -1;
    for (std::int64_t l = 0; l < config_.layers; ++l) {
        const at::Tensor k = logical_keys(cache, l);
        const at::Tensor v = logical_values(cache, l);
        if (!k.defined() || !v.defined() || k.dim() != 4 || !k.sizes().equals(v.sizes()) || k.size(0) != 1 ||
            k.size(1) != config_.heads || k.size(3) != config_.head_dim || k.scalar_type() != at::kFloat ||
            v.scalar_type() != at::kFloat || (length >= 0 && k.size(2) != length)) {
            throw std::invalid_argument("paged pool: import: layer " + std::to_string(l) + " is not float32 keys and values of [1, " +
                                        std::to_string(config_.heads) + ", S, " + std::to_string(config_.head_dim) +
                                        "] with one S in every layer");
        }
        length = k.size(2);
    }
    if (length < 1) throw std::invalid_argument("paged pool: import of a cache holding no tokens");
    if (blocks_for(length) > free_blocks()) {
        throw std::runtime_error("paged pool: out of blocks (import of " + std::to_string(length) + " tokens)");
    }
    Sequence created;
    created.imported = true;
    Sequence& made = sequences_.emplace(seq, std::move(created)).first->second;
    write_tokens(made, cache, 0, Tokens(static_cast<std::size_t>(length), -1));
    use(seq);
}

CachePtr Pool::export_contiguous(const std::string& seq) const { return read_sequence(seq); }

CachePtr Pool::read_sequence(const std::string& seq) const {
    const auto at = sequences_.find(seq);
    if (at == sequences_.end()) throw std::invalid_argument("paged pool: no " + seq_text(seq));
    return gather(at->second);
}

CachePtr Pool::fresh(const Tokens& tokens, const std::string& extra) const {
    CachePtr cache = Cache::make(Layout::modern);
    if (!tokens.empty()) model_.forward_extra(tokens, *cache, extra);
    return cache;
}

std::vector<const void*> Pool::storage() const {
    std::vector<const void*> ids;
    for (const auto* list : {&keys_, &values_, &staged_keys_, &staged_values_}) {
        for (const at::Tensor& t : *list) ids.push_back(t.data_ptr());
    }
    return ids;
}

}  // namespace kv::paged
