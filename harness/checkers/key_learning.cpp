// What a paged engine's keys mean, learnt from its pools (key_learning.h).
#include "checkers/key_learning.h"

namespace kvcheck::checkers {
namespace {

const PagedBlock* keyed(const PagedState& state, std::int64_t block) {
    const PagedBlock* b = block_in(state, block);
    return b != nullptr && b->keyed ? b : nullptr;
}

}  // namespace

void KeyLearning::see_sequence(const Paged& fact) {
    if (fact.by == PagedBy::alloc && !fact.refused) salt_of_[fact.seq] = fact.salt;
    if (fact.by == PagedBy::fork && !fact.refused && salt_of_.count(fact.parent) != 0) salt_of_[fact.seq] = salt_of_[fact.parent];
}

void KeyLearning::learn(const Paged& fact) {
    see_sequence(fact);
    const PagedState& state = fact.after;
    for (const auto& [seq, table] : state.tables) {
        const auto salt = salt_of_.find(seq);
        for (std::size_t i = 0; i < table.size(); ++i) {
            const PagedBlock* block = keyed(state, table[i]);
            if (block == nullptr) continue;
            if (salt != salt_of_.end()) {
                extra_of_[{salt->second, static_cast<std::int64_t>(i)}].see(block->key.extra);
                const PagedBlock* was = block_in(fact.before, table[i]);
                const bool published = was == nullptr || !was->keyed || was->key != block->key;
                if (published) publisher_of_[block->key].see(salt->second);
            }
            const PagedBlock* next = i + 1 < table.size() ? keyed(state, table[i + 1]) : nullptr;
            if (next != nullptr) identity_of_[block->key].see(next->key.parent);
        }
    }
}

std::optional<std::int64_t> KeyLearning::salt_of(std::int64_t seq) const {
    const auto at = salt_of_.find(seq);
    return at == salt_of_.end() ? std::nullopt : std::optional<std::int64_t>(at->second);
}

std::optional<std::string> KeyLearning::extra(std::int64_t salt, std::int64_t position) const {
    const auto at = extra_of_.find({salt, position});
    return at == extra_of_.end() ? std::nullopt : at->second.get();
}

std::optional<std::uint64_t> KeyLearning::identity(const PagedKey& key) const {
    const auto at = identity_of_.find(key);
    return at == identity_of_.end() ? std::nullopt : at->second.get();
}

std::optional<std::int64_t> KeyLearning::publisher(const PagedKey& key) const {
    const auto at = publisher_of_.find(key);
    return at == publisher_of_.end() ? std::nullopt : at->second.get();
}

std::string foreign_key(const KeyLearning& learnt, std::int64_t salt, std::int64_t position, const PagedKey& key,
                        const PagedKey* previous) {
    const std::optional<std::int64_t> publisher = learnt.publisher(key);
    if (publisher && *publisher != salt) {
        return "its key was published by a request of salt " + std::to_string(*publisher) + ", not " + std::to_string(salt) +
               " (a hit across extra keys reads K/V another request's extra keys computed)";
    }
    const std::optional<std::string> extra = learnt.extra(salt, position);
    if (extra && key.extra != *extra) {
        return "its key's extra keys are '" + key.extra + "', not salt " + std::to_string(salt) + "'s at block " +
               std::to_string(position) + " ('" + *extra + "')";
    }
    if (previous != nullptr) {
        const std::optional<std::uint64_t> parent = learnt.identity(*previous);
        if (parent && key.parent != *parent) {
            return "its key's parent is " + std::to_string(key.parent) + ", not the identity of the key before it (" +
                   std::to_string(*parent) + "): it does not chain from it";
        }
    }
    return "";
}

}  // namespace kvcheck::checkers
