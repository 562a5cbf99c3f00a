// Helpers of the paged family's checkers (checker.h).
#include "checkers/checker.h"

#include <algorithm>

namespace kvcheck::checkers {

std::string block_text(const PagedState& state, std::int64_t block) {
    std::string text = "block " + std::to_string(block);
    if (block < 0 || block >= static_cast<std::int64_t>(state.blocks.size())) return text + " (not in the pool)";
    const PagedBlock& b = state.blocks[static_cast<std::size_t>(block)];
    text += " (count " + std::to_string(b.count);
    if (b.keyed) text += ", key " + tokens_text(b.key.tokens) + (b.key.extra.empty() ? "" : " +" + b.key.extra);
    text += ", tokens " + tokens_text(b.tokens) + ", " + std::to_string(b.written) + " written)";
    return text;
}

std::int64_t tables_holding(const PagedState& state, std::int64_t block) {
    std::int64_t count = 0;
    for (const auto& entry : state.tables) count += std::count(entry.second.begin(), entry.second.end(), block);
    return count;
}

std::int64_t copies_reading(const PagedState& state, std::int64_t block) {
    return std::count_if(state.copies.begin(), state.copies.end(), [block](const PagedCopy& c) { return c.source == block; });
}

const PagedBlock* block_in(const PagedState& state, std::int64_t block) {
    if (block < 1 || block >= static_cast<std::int64_t>(state.blocks.size())) return nullptr;
    return &state.blocks[static_cast<std::size_t>(block)];
}

bool in_free_queue(const PagedState& state, std::int64_t block) {
    return std::find(state.free_queue.begin(), state.free_queue.end(), block) != state.free_queue.end();
}

}  // namespace kvcheck::checkers
