// The paged reference: a KV cache as a pool of fixed-size blocks, the way
// serving engines hold it (docs/semantics.md#paged-caches).
//
// A pool of N blocks of B token slots; block 0 is the null block, never
// handed out, so N - 1 blocks serve. Each block holds, per layer, the keys
// and values of up to B tokens ([heads, B, head_dim], float32), a
// reference count, the tokens its slots hold, and at most one key: its
// identity in the prefix index, (parent key, its B tokens, the sequence's
// extra keys such as an adapter name or a salt). A sequence holds a block
// table (block ids in token order), its tokens and its extra keys, which
// the model mixes into every K/V it computes for it (Model::forward_extra,
// as a LoRA adapter does): a hit across extra keys reads another request's
// K/V.
//
// Ownership, in one paragraph: a block's count is the number of block
// tables holding it plus the pending copies reading it. A block whose
// count is 0 is in the free queue (ordered: freed blocks go to the back,
// allocation takes the front); it keeps its key, and stays hittable, until
// it is taken again (then it is evicted: its key leaves the index). A
// published block (one with a key), and any block whose count is above
// one, is never written: the first write of a sequence into a block whose
// count is above one copies that block, once, into a fresh block
// (copy-on-write), and the sequence's table points at the copy.
//
// Sliding windows (PoolConfig::window): a table may hold the null block
// (0) in place of a block wholly behind its sequence's window; it counts
// nothing and reads as zeros.
//
// The worker boundary. Writes (the K/V the model computes for new tokens,
// and copy-on-write copies) are pending until `step()`: the sequence that
// made them reads them (as a worker reads its own stream), nobody else
// does. `step()` completes them, then publishes the full blocks they
// filled (a block is hittable only once every slot is written), then ends
// the pending copies (their sources' references are released).
//
//   kv::models::Decoder decoder({});
//   kv::paged::Pool pool({16, 4, 2, 2, 4}, decoder);
//   pool.alloc("a", {5, 9, 2, 7, 1}, "");   // 0 cached tokens; 2 blocks
//   pool.step();                            // block 1 published
//   pool.alloc("b", {5, 9, 2, 7, 3}, "");   // 4 cached tokens: block 1 shared
#pragma once

#include "kv/cache.h"
#include "kv/generation.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kv::paged {

using BlockId = std::int64_t;
using Tokens = std::vector<std::int64_t>;

struct PoolConfig {
    std::int64_t blocks = 16;       // N, the null block included (>= 2)
    std::int64_t block_tokens = 4;  // B (>= 1)
    std::int64_t layers = 2;
    std::int64_t heads = 2;
    std::int64_t head_dim = 4;
    // Where freed blocks join the free queue: the back (FIFO, the model's)
    // or, when set, the front (LIFO: the block freed last is taken first).
    bool free_to_front = false;
    // When set (and not free_to_front): least recently used first. A block
    // is used by every operation after which the table of the sequence it
    // names holds it (alloc, append, fork, rewind, import); a freed block
    // joins the queue after every free block used before it or with it,
    // before those used after it. A reset forgets every use.
    bool free_by_last_use = false;
    // The model's attention window in tokens (sliding-window attention,
    // docs/semantics.md#sliding-windows); 0: full attention. With a window
    // W, at each step() a sequence of L tokens gives back the blocks wholly
    // before its next token's window (the first (L - W + 1) / B of its
    // table): they are released as by free and the null block takes their
    // place in the table, as vLLM's SlidingWindowManager frees them. The
    // model the pool is given must have the same window (the K/V behind
    // it are never read). A pool with a window takes no rewind: the blocks
    // behind the window are gone.
    std::int64_t window = 0;
};

// A block's identity in the prefix index. `parent` is the chain hash of the
// block before it (0 for a sequence's first block).
struct BlockKey {
    std::uint64_t parent = 0;
    Tokens tokens;
    std::string extra;

    friend bool operator<(const BlockKey& a, const BlockKey& b) {
        if (a.parent != b.parent) return a.parent < b.parent;
        if (a.tokens != b.tokens) return a.tokens < b.tokens;
        return a.extra < b.extra;
    }
    friend bool operator==(const BlockKey& a, const BlockKey& b) {
        return a.parent == b.parent && a.tokens == b.tokens && a.extra == b.extra;
    }
};

// The chain hash of a key: what its child's key names as its parent.
std::uint64_t chain_hash(const BlockKey& key);

struct Block {
    std::int64_t count = 0;
    std::optional<BlockKey> key;
    Tokens tokens;             // the tokens its slots hold (filled = tokens.size())
    std::int64_t written = 0;  // slots whose K/V are written; [written, filled) are pending
    std::uint64_t epoch = 0;   // bumped each time the block is taken from the free queue
    std::uint64_t used = 0;    // the operation that used it last (free_by_last_use; 0: none since a reset)
};

struct Sequence {
    std::vector<BlockId> table;
    Tokens tokens;
    std::string extra;
    std::int64_t next = 1;  // the token the model gave after the last one (append feeds it)
    bool imported = false;  // from a contiguous cache: its tokens are unknown, its blocks never published
};

// A pending copy-on-write copy: its source is read until step().
struct PendingCopy {
    BlockId source = 0;
    BlockId destination = 0;
};

class Pool {
  public:
    // `model` computes K/V (the decoders of models/); it must outlive the pool.
    Pool(PoolConfig config, Model& model);
    virtual ~Pool() = default;
    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;

    const PoolConfig& config() const { return config_; }

    // ---- operations: each throws std::invalid_argument or std::runtime_error
    // ---- on what it cannot do, and then changes nothing.

    // A new sequence of `tokens` (non-empty) with extra keys `extra`: the
    // longest run of its full blocks the index holds, ending on a block
    // boundary before its last token, is shared (touched: taken out of the
    // free queue when free); the rest is allocated and the model runs over
    // the missing tokens, reading the hits' K/V. Returns the cached tokens.
    // Throws when `seq` exists, or when the free blocks do not suffice.
    std::int64_t alloc(const std::string& seq, const Tokens& tokens, const std::string& extra);
    // Decodes `k` (>= 1) tokens greedily on top of the sequence, reading
    // its K/V through the block table; returns them.
    Tokens append(const std::string& seq, std::int64_t k);
    // `child` (new) shares every block of `parent`.
    void fork(const std::string& parent, const std::string& child);
    // Ends a sequence (finished, preempted or aborted): its blocks' counts
    // drop, the last block first; those at 0 join the free queue.
    virtual void free(const std::string& seq);
    // Drops the sequence's last min(n, length - 1) tokens (n >= 1; it keeps
    // one at least) and makes `token` the next one append feeds (the token
    // speculative decoding's verifier chose). Blocks left empty leave its
    // table, the last first, as free releases them (a freed block keeps its
    // key: its tokens and K/V are still the key's). The last kept block,
    // now partial, is truncated in place when the sequence holds it alone
    // (it loses its key, published or pending: its tokens are no longer
    // the key's), or, when shared, is copied first into a fresh block
    // (pending until step(), like copy-on-write's copy) and the copy
    // truncated. Throws, changing nothing, when that copy finds no free block.
    void rewind(const std::string& seq, std::int64_t n, std::int64_t token);
    // The tokens alloc would find cached (read-only).
    virtual std::int64_t lookup(const Tokens& tokens, const std::string& extra) const;
    // Drops the key of every free block.
    virtual void evict();
    // Drops every key and puts the free blocks in id order; throws while a
    // sequence or a pending copy holds a block.
    void reset();
    // The worker boundary: pending writes complete, full blocks are
    // published, pending copies end; then, with a window, the blocks
    // behind each sequence's window are released (the null block in their
    // place).
    void step();
    // A sequence holding a contiguous cache's K/V (modern, float32, every
    // layer [1, heads, S, head_dim] of this pool's geometry, S >= 1): its
    // blocks are written (pending until step(), like every write) and never
    // published (its tokens are unknown: they read -1). Appending to it
    // feeds token 1 first.
    void import_contiguous(const std::string& seq, const Cache& cache);
    // A new modern float32 cache of exactly the sequence's K/V, sharing no
    // storage with the pool.
    virtual CachePtr export_contiguous(const std::string& seq) const;

    // ---- observations ----
    const std::vector<Block>& blocks() const { return blocks_; }
    const std::deque<BlockId>& free_queue() const { return free_; }
    const std::map<BlockKey, std::vector<BlockId>>& index() const { return index_; }
    const std::map<std::string, Sequence>& sequences() const { return sequences_; }
    const std::vector<PendingCopy>& pending_copies() const { return copies_; }
    // The sequence's K/V read through its table, as a new cache (what the
    // model reads; export_contiguous's reference behaviour).
    CachePtr read_sequence(const std::string& seq) const;
    // K/V of a block's filled slots, as its sequence reads them (pending
    // writes included): per layer {keys, values}, each [1, heads, filled, head_dim].
    virtual std::vector<std::pair<at::Tensor, at::Tensor>> block_kv(BlockId block) const;
    // The K/V the model computes for `tokens` under extra keys `extra`
    // with no past: a new cache.
    CachePtr fresh(const Tokens& tokens, const std::string& extra) const;
    // Identities of the pool's tensor storages.
    std::vector<const void*> storage() const;
    // The tensors block_kv reads, per layer, each [N, heads, B, head_dim]
    // float32: the written K/V and the pending writes. An observer that
    // reads many blocks reads their rows here rather than through a tensor
    // per block (PagedReference::paged_state).
    const std::vector<at::Tensor>& written_keys() const { return keys_; }
    const std::vector<at::Tensor>& written_values() const { return values_; }
    const std::vector<at::Tensor>& staged_keys() const { return staged_keys_; }
    const std::vector<at::Tensor>& staged_values() const { return staged_values_; }

  protected:
    // ---- seams (the mutants override one each) ----
    // The keys of the blocks of `tokens` a prefix lookup may hit, in order.
    virtual std::vector<BlockKey> block_keys(const Tokens& tokens, const std::string& extra) const;
    // The extra keys a block key of a sequence with extra keys `extra` carries.
    virtual std::string key_extra(const std::string& extra) const { return extra; }
    // The block the index holds under `key`, if any.
    virtual std::optional<BlockId> find(const BlockKey& key) const;
    // Takes the block at the front of the free queue: evicts its key.
    virtual BlockId take_free();
    // Drops one reference; a block at 0 joins the back of the free queue
    // (the front with free_to_front).
    virtual void unref(BlockId block);
    // Takes one more reference on a held block (fork's sharing).
    virtual void ref(BlockId block) { ++blocks_[static_cast<std::size_t>(block)].count; }
    // Copies the filled slots of `source` into `destination`'s pending
    // writes (copy-on-write); the copy reads `source` until step().
    virtual void copy_block(BlockId source, BlockId destination);
    // Queues `block` to be published under `key` at step().
    virtual void publish_later(BlockId block, BlockKey key);
    // Whether a write into `block` must copy it first.
    virtual bool must_copy(BlockId block) const { return blocks_[block].count > 1; }
    // Ends a sequence (free's body).
    virtual void release_sequence(Sequence& sequence);
    // Starts a new sequence's table with the blocks a lookup hit, touching
    // each (taken out of the free queue when free); `rest` blocks are
    // taken after them for the tokens not cached.
    virtual void attach_hits(Sequence& sequence, const std::vector<BlockId>& hits, std::int64_t rest);
    // Makes a fully written block hittable under `key` (at step()).
    virtual void publish(BlockId block, const BlockKey& key);
    // Truncates the sequence's last kept block to `slots` slots (rewind;
    // held alone): its key, published or pending, is dropped.
    virtual void truncate_block(BlockId block, std::int64_t slots);
    // Ends a pending copy at step(): its source is no longer read.
    virtual void end_copy(const PendingCopy& copy) { unref(copy.source); }
    // The K/V an append decodes on: the sequence's, read through its table.
    virtual CachePtr working_cache(const Sequence& sequence) const { return gather(sequence); }
    // How many leading blocks of a table of `length` tokens lie wholly
    // before the window of the sequence's next token (0 without a window).
    virtual std::int64_t blocks_behind_window(std::int64_t length) const;
    // The blocks an operation may still take (its check before it changes anything).
    virtual std::int64_t free_blocks() const { return static_cast<std::int64_t>(free_.size()); }

    // Writes K/V of tokens into slots [from, from + n) of a block, pending.
    void stage(BlockId block, std::int64_t slot, const std::vector<std::pair<at::Tensor, at::Tensor>>& kv,
               std::int64_t first, std::int64_t n);
    // The K/V the null block reads as in a table: B slots of zeros per layer.
    std::vector<std::pair<at::Tensor, at::Tensor>> null_kv() const;
    // The sequence's K/V as a new contiguous cache (its own reads).
    CachePtr gather(const Sequence& sequence) const;
    // Writes the K/V of cache positions [first, first + n) into the
    // sequence's blocks (allocating as needed, copying a shared block
    // first), with their tokens; queues full blocks for publication.
    void write_tokens(Sequence& sequence, const Cache& cache, std::int64_t first, const Tokens& tokens);
    std::int64_t blocks_for(std::int64_t tokens) const {
        return (tokens + config_.block_tokens - 1) / config_.block_tokens;
    }
    void remove_from_index(BlockId block);
    // Releases the blocks behind the sequence's window, the last first;
    // the null block takes their place in its table.
    void slide(Sequence& sequence);
    // The chain keys of the first `count` full blocks of `tokens`.
    std::vector<BlockKey> keys_of(const Tokens& tokens, const std::string& extra, std::size_t count) const;
    // The hits of a lookup: the blocks the index holds for the leading keys.
    std::vector<BlockId> hits(const Tokens& tokens, const std::string& extra) const;
    Sequence& sequence(const std::string& seq);
    // Marks the blocks of the sequence's table used by the operation now
    // ending (free_by_last_use's order).
    void use(const std::string& seq);

    PoolConfig config_;
    Model& model_;
    std::vector<Block> blocks_;
    std::deque<BlockId> free_;
    std::map<BlockKey, std::vector<BlockId>> index_;
    std::map<std::string, Sequence> sequences_;
    std::vector<PendingCopy> copies_;
    struct Publication {
        BlockId block = 0;
        std::uint64_t epoch = 0;
        BlockKey key;
    };
    std::vector<Publication> publications_;
    std::uint64_t operations_ = 0;  // the operations that used blocks so far
    // Per layer [N, heads, B, head_dim]: written K/V, and pending writes.
    std::vector<at::Tensor> keys_, values_, staged_keys_, staged_values_;
};

}  // namespace kv::paged
