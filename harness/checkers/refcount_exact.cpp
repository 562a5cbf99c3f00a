// refcount-exact (paged): after every paged operation, each block's count
// is the number of block tables holding it plus the pending copies reading
// it, never negative; the null block (0) counts 0 and is in no table, but
// for a model with a sliding window at the positions of a table wholly
// before its sequence's window (docs/semantics.md#sliding-windows): there
// it stands for a block released (a block freed while the sequence still
// reads it inside its window is caught here).
//
// Checked: the pool as the engine reports it after each paged operation.
// Not checked here: the free queue (free-iff-unreferenced), what a block
// holds (the content properties).
#include "checkers/checker.h"

#include <optional>
#include <string>
#include <vector>

namespace kvcheck::checkers {
namespace {

// Where the null block stands inside a window: " (sequence 2's block 1,
// inside its window of 3 tokens: its blocks from 1 on are read)", or "".
std::string null_where(const PagedState& s) {
    if (s.window <= 0) return "";
    for (const auto& [seq, table] : s.tables) {
        const std::int64_t behind = blocks_behind_window(s, seq);
        for (std::size_t i = static_cast<std::size_t>(std::max<std::int64_t>(0, behind)); i < table.size(); ++i) {
            if (table[i] != 0) continue;
            return " (sequence " + std::to_string(seq) + "'s block " + std::to_string(i) + ", inside its window of " +
                   std::to_string(s.window) + " tokens: its blocks from " + std::to_string(behind) + " on are read)";
        }
    }
    return "";
}

}  // namespace

std::optional<std::string> refcount_wrong(const PagedState& s) {
    // Holders per block, in one pass over the tables and the copies
    // (the check grows with the pool, not with pool x holders).
    std::vector<std::int64_t> held(s.blocks.size(), 0), read(s.blocks.size(), 0);
    auto count_in = [&s](std::vector<std::int64_t>& into, std::int64_t block) {
        if (block >= 0 && block < static_cast<std::int64_t>(s.blocks.size())) ++into[static_cast<std::size_t>(block)];
    };
    for (const auto& entry : s.tables) {
        const std::int64_t behind = blocks_behind_window(s, entry.first);
        for (std::size_t i = 0; i < entry.second.size(); ++i) {
            const std::int64_t block = entry.second[i];
            if (block == 0 && static_cast<std::int64_t>(i) < behind) continue;  // released behind the window
            count_in(held, block);
        }
    }
    for (const PagedCopy& copy : s.copies) count_in(read, copy.source);
    for (std::size_t b = 0; b < s.blocks.size(); ++b) {
        const auto block = static_cast<std::int64_t>(b);
        const std::int64_t tables = held[b];
        const std::int64_t copies = read[b];
        const std::int64_t expected = b == 0 ? 0 : tables + copies;
        if (b == 0 && tables != 0) {
            return "the null block is in " + std::to_string(tables) + " block tables" + null_where(s);
        }
        if (s.blocks[b].count != expected) {
            return block_text(s, block) + " is held by " + std::to_string(tables) + " tables and read by " +
                   std::to_string(copies) + " pending copies: its count should be " + std::to_string(expected);
        }
    }
    return std::nullopt;
}

namespace {

class RefcountExact final : public Checker {
  public:
    RefcountExact() : Checker(Property::refcount_exact) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        if (const std::optional<std::string> wrong = refcount_wrong(fact.after)) fail(probe, "after " + fact.what + ": " + *wrong);
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::refcount_exact>() {
    return std::make_unique<RefcountExact>();
}

}  // namespace kvcheck::checkers
