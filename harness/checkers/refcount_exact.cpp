// refcount-exact (paged): after every paged operation, each block's count
// is the number of block tables holding it plus the pending copies reading
// it, never negative; the null block (0) is in no table and counts 0.
//
// Checked: the pool as the engine reports it after each paged operation.
// Not checked here: the free queue (free-iff-unreferenced), what a block
// holds (the content properties).
#include "checkers/checker.h"

#include <vector>

namespace kvcheck::checkers {
namespace {

class RefcountExact final : public Checker {
  public:
    RefcountExact() : Checker(Property::refcount_exact) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (!checking(probe)) return;
        const PagedState& s = fact.after;
        // Holders per block, in one pass over the tables and the copies
        // (the check grows with the pool, not with pool x holders).
        std::vector<std::int64_t> held(s.blocks.size(), 0), read(s.blocks.size(), 0);
        auto count_in = [&s](std::vector<std::int64_t>& into, std::int64_t block) {
            if (block >= 0 && block < static_cast<std::int64_t>(s.blocks.size())) ++into[static_cast<std::size_t>(block)];
        };
        for (const auto& entry : s.tables) {
            for (const std::int64_t block : entry.second) count_in(held, block);
        }
        for (const PagedCopy& copy : s.copies) count_in(read, copy.source);
        for (std::size_t b = 0; b < s.blocks.size(); ++b) {
            const auto block = static_cast<std::int64_t>(b);
            const std::int64_t tables = held[b];
            const std::int64_t copies = read[b];
            const std::int64_t expected = b == 0 ? 0 : tables + copies;
            if (b == 0 && tables != 0) {
                fail(probe, "after " + fact.what + ": the null block is in " + std::to_string(tables) + " block tables");
                return;
            }
            if (!expect(probe, s.blocks[b].count == expected, [&] {
                    return "after " + fact.what + ": " + block_text(s, block) + " is held by " + std::to_string(tables) +
                           " tables and read by " + std::to_string(copies) + " pending copies: its count should be " +
                           std::to_string(expected);
                })) {
                return;
            }
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::refcount_exact>() {
    return std::make_unique<RefcountExact>();
}

}  // namespace kvcheck::checkers
