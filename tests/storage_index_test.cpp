// The executor's storage index against a plain multiset of (identity,
// entry) pairs, over seeded random adds and removes: identities drawn from
// a few, so that runs of one home collide, wrap around the table's end and
// are cut by removals; the table grows several times.
#include "storage_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

using kvcheck::StorageIndex;

std::vector<std::string> holders(const StorageIndex& index, std::uint64_t identity) {
    std::vector<std::string> found;
    index.for_each_holder(identity, [&found](const std::string& entry) { found.push_back(entry); });
    std::sort(found.begin(), found.end());
    return found;
}

std::vector<std::string> holders(const std::multimap<std::uint64_t, const std::string*>& model, std::uint64_t identity) {
    std::vector<std::string> found;
    const auto [from, to] = model.equal_range(identity);
    for (auto at = from; at != to; ++at) found.push_back(*at->second);
    std::sort(found.begin(), found.end());
    return found;
}

void remove_all_pairs(std::multimap<std::uint64_t, const std::string*>& model, std::uint64_t identity,
                      const std::string* entry) {
    for (auto at = model.lower_bound(identity); at != model.end() && at->first == identity;) {
        at = at->second == entry ? model.erase(at) : std::next(at);
    }
}

TEST(StorageIndex, AgreesWithAMultimap) {
    const std::array<std::string, 6> entries = {"a", "b", "c", "d", "e", "f"};
    for (const std::uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
        std::mt19937_64 random(seed);
        StorageIndex index;
        std::multimap<std::uint64_t, const std::string*> model;
        // Addresses, as the index gets them: 16-byte aligned.
        const std::uint64_t identities = seed % 2 == 0 ? 40 : 5000;
        auto identity = [&] { return 0x10000 + 16 * (random() % identities); };
        for (int step = 0; step < 20000; ++step) {
            const std::uint64_t id = identity();
            const std::string* entry = &entries[random() % entries.size()];
            if (random() % 3 != 0) {
                index.add(id, entry);
                model.emplace(id, entry);
            } else {
                index.remove(id, entry);
                remove_all_pairs(model, id, entry);
            }
            if (step % 97 == 0) {
                for (std::uint64_t probe = 0; probe < identities; ++probe) {
                    const std::uint64_t at = 0x10000 + 16 * probe;
                    ASSERT_EQ(holders(index, at), holders(model, at)) << "seed " << seed << " step " << step;
                }
            }
        }
        index.clear();
        EXPECT_TRUE(holders(index, 0x10000).empty());
    }
}

TEST(StorageIndex, RemoveTakesEveryCopyOfAPair) {
    StorageIndex index;
    const std::string a = "a";
    const std::string b = "b";
    index.add(64, &a);
    index.add(64, &b);
    index.add(64, &a);
    index.remove(64, &a);
    EXPECT_EQ(holders(index, 64), std::vector<std::string>{"b"});
    index.remove(64, &b);
    EXPECT_TRUE(holders(index, 64).empty());
}

}  // namespace
