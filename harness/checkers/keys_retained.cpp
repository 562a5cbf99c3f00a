// keys-retained (paged): a block keeps its identity (key) until it is
// taken again or evicted. A free changes no key (only counts and the free
// queue: a freed block stays hittable); no operation but evict and reset
// drops or changes the key of a block it does not take from the free
// queue, except the one cut a rewind makes (its last kept block, held
// alone, loses its key). An evict drops the key of every free block and
// keeps every held block's; a reset leaves no key and an empty index.
// So a manager that deletes keys on free (freed prefixes never hit
// again), or whose evict drops the wrong blocks' keys, is caught. "Taken"
// is read by the engine's declared free order: with a queue order
// declared, a block the operation took out of the free queue; with
// `unspecified` (an eviction policy of its own, LRU say, that frees a
// block's key before an allocation takes it, maybe another block), any
// block free before an operation that may take blocks (all but free and
// lookup).
//
// Checked: every block keyed before each paged operation, against its key
// after it; after a reset, every block and the index.
// Not checked here: that a taken block's key leaves the index
// (index-consistent), or when keys appear (published-after-written).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class KeysRetained final : public Checker {
  public:
    KeysRetained() : Checker(Property::keys_retained) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        if (fact.by == PagedBy::reset) {
            reset(fact, probe);
            return;
        }
        const std::size_t blocks = std::min(fact.before.blocks.size(), fact.after.blocks.size());
        for (std::size_t b = 1; b < blocks; ++b) {
            const auto block = static_cast<std::int64_t>(b);
            const PagedBlock& was = fact.before.blocks[b];
            const PagedBlock& now = fact.after.blocks[b];
            if (!was.keyed) continue;
            const bool kept = now.keyed && now.key == was.key;
            if (kept && fact.by != PagedBy::evict) continue;  // the queue is looked through only when it decides
            const bool free = in_free_queue(fact.before, block);
            if (fact.by == PagedBy::evict) {
                if (!expect(probe, free ? !now.keyed : kept, [&] {
                        return fact.what + (free ? " kept the key of the free " : " dropped the key of the held ") +
                               block_text(fact.before, block) + ": after it, " + block_text(fact.after, block) +
                               " (an evict drops the key of every free block, and only theirs)";
                    })) {
                    return;
                }
                continue;
            }
            const bool taken = free && (unordered(probe, fact) || !in_free_queue(fact.after, block));
            if (!expect(probe, kept || taken || cut_by_rewind(fact, block) || retaken_by_rewind(fact, block) ||
                                 retaken_behind_window(fact, block), [&] {
                    return fact.what + (now.keyed ? " changed the key of " : " dropped the key of ") + block_text(fact.before, block) +
                           ", which it did not take from the free queue: after it, " + block_text(fact.after, block) +
                           " (a block keeps its key until it is taken again or evicted)";
                })) {
                return;
            }
        }
    }

  private:
    static bool unordered(Probe& probe, const Paged& fact) {
        return probe.capabilities().paged_free_order == PagedFreeOrder::unspecified && fact.by != PagedBy::free &&
               fact.by != PagedBy::lookup;
    }

    void reset(const Paged& fact, Probe& probe) {
        if (!expect(probe, fact.after.index.empty(), [&] {
                return "after " + fact.what + ": the index holds " + std::to_string(fact.after.index.size()) +
                       " keys (a reset drops every key)";
            })) {
            return;
        }
        for (std::size_t b = 1; b < fact.after.blocks.size(); ++b) {
            const auto block = static_cast<std::int64_t>(b);
            if (!expect(probe, !fact.after.blocks[b].keyed, [&] {
                    return "after " + fact.what + ": " + block_text(fact.after, block) + " has a key (a reset drops every key)";
                })) {
                return;
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::keys_retained>() {
    return std::make_unique<KeysRetained>();
}

}  // namespace kvcheck::checkers
