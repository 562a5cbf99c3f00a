// op-atomic (paged): an alloc, append, fork, import or rewind the engine refused
// (it threw: the pool could not hold the result) changed nothing: the
// pool reads exactly as before it (every block's count, identity, tokens,
// written slots and K/V digest; the free queue in order; the index; every
// table; the pending copies). And a refusal was needed: an alloc of L
// tokens is refused only when the free queue (cached free blocks included:
// an alloc evicts them) held fewer than ceil(L / B) blocks, the most it
// can need whatever it hits (a hit that is free takes the place of the
// block it saves), or when its tokens are not the model's (the engine's
// fresh computation refuses them too); a fork only when the free queue
// held fewer blocks than the parent's table (a pool that copies eagerly);
// a rewind only when the free queue was empty while its kept last block
// is partial and shared (the copy it needs: one block).
// A pool refusing everything would otherwise pass every paged property.
// An engine that keeps a reserve of free blocks (a watermark) breaks it by
// design. With a sliding window, a refusal may have released the blocks
// behind a window (vLLM's allocate_slots does before it finds no room).
//
// Checked: at the step of every refused paged operation.
// Not checked here: whether a refused append or import was needed (the
// fact does not carry an append's count; the pool's geometry is the
// engine's to check); what a successful operation did (the other paged
// properties).
#include "checkers/checker.h"

#include <algorithm>
#include <exception>

namespace kvcheck::checkers {
namespace {

std::string state_difference(const PagedState& before, const PagedState& after) {
    for (std::size_t b = 0; b < before.blocks.size() && b < after.blocks.size(); ++b) {
        if (!(before.blocks[b] == after.blocks[b])) {
            return "before: " + block_text(before, static_cast<std::int64_t>(b)) + "; after: " +
                   block_text(after, static_cast<std::int64_t>(b));
        }
    }
    if (before.blocks.size() != after.blocks.size()) return "the pool's block count changed";
    if (before.free_queue != after.free_queue) return "the free queue changed from " + tokens_text(before.free_queue) + " to " + tokens_text(after.free_queue);
    if (before.tables != after.tables) return "the block tables changed (" + std::to_string(before.tables.size()) + " -> " + std::to_string(after.tables.size()) + " sequences)";
    if (before.tokens != after.tokens) return "a sequence's tokens changed";
    if (!(before.index == after.index)) return "the prefix index changed";
    if (!(before.copies == after.copies)) return "the pending copies changed";
    return "";
}

// With a sliding window a refused operation may still have released the
// blocks behind a sequence's window (vLLM's allocate_slots does so before it
// finds no room): `before` with those releases made, so that they are not
// a change. A table position is released when it held a block before and
// holds the null block after, behind the window; the block's count drops by
// one, and at 0 it joins the free queue (anywhere: its order is
// free-order's).
PagedState with_window_releases(const PagedState& before, const PagedState& after) {
    PagedState released = before;
    if (after.window <= 0) return released;
    std::vector<std::int64_t> freed;
    for (auto& [seq, table] : released.tables) {
        const auto now = after.tables.find(seq);
        if (now == after.tables.end() || now->second.size() != table.size()) continue;
        const auto behind = static_cast<std::size_t>(blocks_behind_window(after, seq));
        for (std::size_t i = 0; i < table.size() && i < behind; ++i) {
            const std::int64_t block = table[i];
            if (block == 0 || now->second[i] != 0 || block >= static_cast<std::int64_t>(released.blocks.size()) || block < 1) continue;
            table[i] = 0;
            if (--released.blocks[static_cast<std::size_t>(block)].count == 0) freed.push_back(block);
        }
    }
    if (freed.empty()) return released;
    // The free queue as the engine ordered it, of exactly the blocks free before and those freed.
    std::vector<std::int64_t> queue;
    for (const std::int64_t block : after.free_queue) {
        const bool known = std::find(before.free_queue.begin(), before.free_queue.end(), block) != before.free_queue.end() ||
                           std::find(freed.begin(), freed.end(), block) != freed.end();
        if (known) queue.push_back(block);
    }
    std::vector<std::int64_t> kept;
    for (const std::int64_t block : after.free_queue) {
        if (std::find(freed.begin(), freed.end(), block) == freed.end()) kept.push_back(block);
    }
    if (kept == before.free_queue && queue.size() == before.free_queue.size() + freed.size()) released.free_queue = queue;
    return released;
}

class OpAtomic final : public Checker {
  public:
    OpAtomic() : Checker(Property::op_atomic) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!fact.refused || !checking(probe)) return;
        const std::string difference = state_difference(with_window_releases(fact.before, fact.after), fact.after);
        if (!expect(probe, difference.empty(), [&] {
                return fact.what + " was refused (" + *fact.refused + ") but changed the pool: " + difference;
            })) {
            return;
        }
        const std::int64_t needed = most_needed(fact, probe);
        const auto free = static_cast<std::int64_t>(fact.before.free_queue.size());
        expect(probe, needed > free, [&] {
            return fact.what + " was refused (" + *fact.refused + ") while " + std::to_string(free) +
                   " blocks were free; it needs " + std::to_string(needed) + " at most";
        });
    }

  private:
    // The most blocks a refused operation may need; one more than the
    // pool holds when its refusal is not judged.
    static std::int64_t most_needed(const Paged& fact, Probe& probe) {
        const PagedState& s = fact.before;
        const auto unjudged = static_cast<std::int64_t>(s.blocks.size()) + 1;
        const std::int64_t b = s.block_tokens;
        if (fact.by == PagedBy::alloc && b > 0 && !fact.tokens.empty()) {
            try {
                probe.engine().paged()->paged_fresh_view(fact.tokens, fact.salt, 0, 0);
            } catch (const std::exception&) {
                return unjudged;  // not the model's tokens
            }
            return (static_cast<std::int64_t>(fact.tokens.size()) + b - 1) / b;
        }
        if (fact.by == PagedBy::fork) {
            const auto table = s.tables.find(fact.parent);
            if (table != s.tables.end()) return static_cast<std::int64_t>(table->second.size());
        }
        if (fact.by == PagedBy::rewind && b > 0) return rewind_needs(fact, s, b);
        return unjudged;
    }

    // A rewind needs a block only to copy its kept last block, when that
    // block is left partial and is shared.
    static std::int64_t rewind_needs(const Paged& fact, const PagedState& s, std::int64_t b) {
        const auto table = s.tables.find(fact.seq);
        const auto tokens = s.tokens.find(fact.seq);
        if (table == s.tables.end() || tokens == s.tokens.end()) return static_cast<std::int64_t>(s.blocks.size()) + 1;
        const auto length = static_cast<std::int64_t>(tokens->second.size());
        const std::int64_t kept = std::max<std::int64_t>(1, length - fact.dropped);
        if (kept >= length) return 0;
        const std::int64_t blocks_kept = (kept + b - 1) / b;
        if (kept % b == 0 || blocks_kept > static_cast<std::int64_t>(table->second.size())) return 0;
        const std::int64_t last = table->second[static_cast<std::size_t>(blocks_kept - 1)];
        if (last < 1 || last >= static_cast<std::int64_t>(s.blocks.size())) return 0;
        return s.blocks[static_cast<std::size_t>(last)].count > 1 ? 1 : 0;
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::op_atomic>() {
    return std::make_unique<OpAtomic>();
}

}  // namespace kvcheck::checkers
