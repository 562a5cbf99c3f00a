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

bool retaken_behind_window(const Paged& fact, std::int64_t block) {
    if (fact.after.window <= 0 || fact.refused || copies_reading(fact.before, block) != 0) return false;
    std::int64_t released = 0;
    for (const auto& [seq, table] : fact.before.tables) {
        const auto now = fact.after.tables.find(seq);
        for (std::size_t i = 0; i < table.size(); ++i) {
            if (table[i] != block) continue;
            if (now == fact.after.tables.end() || i >= now->second.size() || now->second[i] != 0) return false;
            ++released;
        }
    }
    return released > 0 && tables_holding(fact.after, block) > 0;
}

const PagedBlock* block_in(const PagedState& state, std::int64_t block) {
    if (block < 1 || block >= static_cast<std::int64_t>(state.blocks.size())) return nullptr;
    return &state.blocks[static_cast<std::size_t>(block)];
}

bool in_free_queue(const PagedState& state, std::int64_t block) {
    return std::find(state.free_queue.begin(), state.free_queue.end(), block) != state.free_queue.end();
}

bool cut_by_rewind(const Paged& fact, std::int64_t block) {
    if (fact.by != PagedBy::rewind || fact.refused) return false;
    const auto was = fact.before.tables.find(fact.seq);
    const auto now = fact.after.tables.find(fact.seq);
    if (was == fact.before.tables.end() || now == fact.after.tables.end() || now->second.empty()) return false;
    const std::size_t last = now->second.size() - 1;
    const PagedBlock& before = fact.before.blocks[static_cast<std::size_t>(block)];
    return now->second[last] == block && last < was->second.size() && was->second[last] == block && before.count == 1 &&
           fact.after.blocks[static_cast<std::size_t>(block)].tokens != before.tokens;
}

bool retaken_by_rewind(const Paged& fact, std::int64_t block) {
    if (fact.by != PagedBy::rewind || fact.refused) return false;
    const auto was = fact.before.tables.find(fact.seq);
    const auto now = fact.after.tables.find(fact.seq);
    if (was == fact.before.tables.end() || now == fact.after.tables.end() || now->second.empty()) return false;
    const std::size_t kept = now->second.size();
    if (kept > was->second.size() || now->second.back() != block) return false;
    const auto dropped = std::count(was->second.begin() + static_cast<std::ptrdiff_t>(kept), was->second.end(), block);
    const PagedCopy copy{was->second[kept - 1], block};
    const auto copies = [&copy](const PagedState& state) { return std::count(state.copies.begin(), state.copies.end(), copy); };
    return dropped > 0 && tables_holding(fact.before, block) == dropped && copies_reading(fact.before, block) == 0 &&
           copies(fact.after) > copies(fact.before);
}

std::int64_t blocks_behind_window(const PagedState& state, std::int64_t seq) {
    const auto tokens = state.tokens.find(seq);
    if (state.window <= 0 || state.block_tokens < 1 || tokens == state.tokens.end()) return 0;
    const auto length = static_cast<std::int64_t>(tokens->second.size());
    return std::max<std::int64_t>(0, length - state.window + 1) / state.block_tokens;
}

std::string window_difference(PagedEngine& paged, const PagedState& state, std::int64_t seq, const Tokens& tokens,
                              std::int64_t salt) {
    const auto table = state.tables.find(seq);
    const std::int64_t b = state.block_tokens;
    if (table == state.tables.end() || b < 1) return "";
    const auto length = static_cast<std::int64_t>(tokens.size());
    for (auto i = static_cast<std::size_t>(blocks_behind_window(state, seq)); i < table->second.size(); ++i) {
        const std::int64_t first = static_cast<std::int64_t>(i) * b;
        const std::int64_t slots = std::min(b, length - first);
        if (slots <= 0) break;
        const std::int64_t block = table->second[i];
        if (block < 0 || block >= static_cast<std::int64_t>(state.blocks.size())) continue;  // refcount-exact's
        const std::string difference =
            view_difference(paged.paged_block_view(block, slots), paged.paged_fresh_view(tokens, salt, first, slots));
        if (!difference.empty()) {
            return "its block " + std::to_string(i) + ", " + block_text(state, block) + ", inside its window (positions " +
                   std::to_string(first) + ".." + std::to_string(first + slots - 1) + "): " + difference;
        }
    }
    return "";
}

}  // namespace kvcheck::checkers
