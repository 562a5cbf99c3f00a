// The paged family: what a block manager implements so that kvcheck can
// drive it and check its ownership properties (docs/semantics.md#paged-caches).
//
// A paged engine is an Engine (kvcheck/engine.h) whose `paged()` returns
// this interface and whose capabilities say `paged`. The paged operations
// of a trace (paged_alloc, paged_append, ... in kvcheck/trace.h) call it;
// an engine without it never sees them, and the paged properties are
// skipped for it. Like Engine, it speaks only of facts, never of tensors:
// K/V leave as CacheViews (kvcheck/content.h), the pool's bookkeeping as a
// PagedState.
//
// Contract, in short:
// - Sequences are named by the trace (small integers). alloc, fork and
//   import of a sequence that exists, and operations on one that does not,
//   are never asked.
// - alloc, append, fork, import and rewind may refuse (throw) when the
//   pool cannot hold the result; a refusal must change nothing, and must be
//   needed (op-atomic): a refused alloc of L tokens must face fewer free
//   blocks, cached free ones included, than ceil(L / B); a refused fork
//   fewer than the parent's table; a refused rewind no free block while
//   its kept last block is partial and shared. The other operations must
//   not throw.
// - Sliding windows: a manager whose model attends over a window of W
//   tokens reports it (PagedState::window) and may release the blocks
//   wholly behind a sequence's window, the null block taking their place
//   in its table.
// - paged_rewind is asked only when Capabilities::paged_rewind is set.
// - Observations are read-only.
//
//   class MyManager : public kvcheck::Engine, public kvcheck::PagedEngine {
//       kvcheck::PagedEngine* paged() override { return this; }
//       ...
//   };
#pragma once

#include "kvcheck/content.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kvcheck {

using PagedTokens = std::vector<std::int64_t>;

// A block's identity in the prefix index: its parent's identity (an opaque
// number, 0 for a sequence's first block), its tokens, its extra keys.
struct PagedKey {
    std::uint64_t parent = 0;
    PagedTokens tokens;
    std::string extra;
    friend bool operator==(const PagedKey& a, const PagedKey& b) {
        return a.parent == b.parent && a.tokens == b.tokens && a.extra == b.extra;
    }
    friend bool operator!=(const PagedKey& a, const PagedKey& b) { return !(a == b); }
};

struct PagedBlock {
    std::int64_t count = 0;      // reference count
    bool keyed = false;          // has an identity (key)
    PagedKey key;
    PagedTokens tokens;          // the tokens its filled slots hold
    std::int64_t written = 0;    // slots whose K/V are written (the rest are pending)
    std::uint64_t digest = 0;    // view_digest of paged_block_view(block, its filled slots)
    friend bool operator==(const PagedBlock& a, const PagedBlock& b) {
        return a.count == b.count && a.keyed == b.keyed && (!a.keyed || a.key == b.key) && a.tokens == b.tokens &&
               a.written == b.written && a.digest == b.digest;
    }
};

struct PagedCopy {
    std::int64_t source = 0;
    std::int64_t destination = 0;
    friend bool operator==(const PagedCopy& a, const PagedCopy& b) {
        return a.source == b.source && a.destination == b.destination;
    }
};

struct PagedIndexEntry {
    PagedKey key;
    std::vector<std::int64_t> blocks;  // duplicates allowed, in the order a hit prefers them
    friend bool operator==(const PagedIndexEntry& a, const PagedIndexEntry& b) {
        return a.key == b.key && a.blocks == b.blocks;
    }
};

// The whole pool, as the engine reports it.
struct PagedState {
    std::int64_t block_tokens = 0;            // B
    // The model's attention window in tokens (docs/semantics.md#sliding-windows);
    // 0: full attention. With W > 0 a table may hold the null block (0) at
    // the positions wholly before its sequence's next token's window (the
    // first (L - W + 1) / B of a sequence of L tokens), and the content
    // properties compare only the blocks after those.
    std::int64_t window = 0;
    std::vector<PagedBlock> blocks;           // by id; block 0 is the null block
    std::vector<std::int64_t> free_queue;     // front first: the next block taken
    std::vector<PagedIndexEntry> index;
    std::map<std::int64_t, std::vector<std::int64_t>> tables;  // sequence -> its block table
    std::map<std::int64_t, PagedTokens> tokens;                // sequence -> its tokens (-1: unknown)
    std::vector<PagedCopy> copies;            // pending copy-on-write copies
    friend bool operator==(const PagedState& a, const PagedState& b) {
        return a.block_tokens == b.block_tokens && a.window == b.window && a.blocks == b.blocks && a.free_queue == b.free_queue &&
               a.index == b.index && a.tables == b.tables && a.tokens == b.tokens && a.copies == b.copies;
    }
};

// A contiguous cache made of a sequence's blocks.
struct PagedExported {
    CacheView view;
    std::vector<std::uint64_t> storage;  // its storage identities (as Engine::storage_of_handle reports them)
};

class PagedEngine {
  public:
    virtual ~PagedEngine() = default;

    // ---- operations (docs/semantics.md#paged-operations) ----
    // Returns the tokens found cached (shared, not computed).
    virtual std::int64_t paged_alloc(std::int64_t seq, const PagedTokens& tokens, std::int64_t salt) = 0;
    // Decodes `count` tokens on top of the sequence; returns them.
    virtual PagedTokens paged_append(std::int64_t seq, std::int64_t count) = 0;
    virtual void paged_fork(std::int64_t parent, std::int64_t child) = 0;
    virtual void paged_free(std::int64_t seq) = 0;
    // The tokens an alloc of `tokens` would find cached; read-only.
    virtual std::int64_t paged_lookup(const PagedTokens& tokens, std::int64_t salt) = 0;
    virtual void paged_evict() = 0;  // drops the identity of every free block
    virtual void paged_reset() = 0;  // asked only when no sequence or pending copy holds a block
    virtual void paged_step() = 0;   // the worker boundary
    virtual void paged_import(std::int64_t seq, const CacheContent& content) = 0;
    virtual PagedExported paged_export(std::int64_t seq) = 0;
    // Drops the sequence's last min(count, length - 1) tokens (it keeps one
    // at least): blocks left empty leave its table (released as by free);
    // its last kept block, now partial, loses its identity when it had one
    // (its tokens are no longer its key's), or is copied first when shared
    // (count above one: the copy is pending until the step, like
    // copy-on-write's). The next append feeds `token` first (the token the
    // verifier chose), so later appends may write other tokens than those
    // dropped. May refuse only for the copy (no free block).
    virtual void paged_rewind(std::int64_t seq, std::int64_t count, std::int64_t token) = 0;

    // ---- observations ----
    virtual PagedState paged_state() = 0;
    // The K/V of a block's first `slots` filled slots (pending writes
    // included), as a modern cache of [1, heads, slots, head_dim] layers.
    virtual CacheView paged_block_view(std::int64_t block, std::int64_t slots) = 0;
    // A sequence's K/V read through its block table, as the model reads them.
    virtual CacheView paged_sequence_view(std::int64_t seq) = 0;
    // Positions [first, first + count) of the K/V the engine's model
    // computes for `tokens` under the extra keys of `salt` on an empty
    // cache (the fresh computation a hit must equal). The model mixes the
    // extra keys in, as a LoRA adapter does (docs/semantics.md#the-model):
    // the K/V of one request under two salts differ.
    virtual CacheView paged_fresh_view(const PagedTokens& tokens, std::int64_t salt, std::int64_t first, std::int64_t count) = 0;
    // The identities of the pool's storages.
    virtual std::vector<std::uint64_t> paged_pool_storage() = 0;
    // The tokens `count` greedy decoding steps give on top of the
    // sequence's exported contiguous cache (paged_export's form), decoded by
    // the engine's model outside the pool, which it leaves unchanged: what
    // paged_append(seq, count) must give through the block table
    // (generation-equivalent across forms). Nothing when the engine cannot
    // decode a contiguous cache: the check is then not made.
    virtual std::optional<PagedTokens> paged_decode_exported(std::int64_t seq, std::int64_t count) {
        (void)seq;
        (void)count;
        return std::nullopt;
    }
};

}  // namespace kvcheck
