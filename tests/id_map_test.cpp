// The id map behind the executor's readings, the auditor's entries and the
// reference adapter's snapshots, against std::unordered_map over seeded
// random inserts, finds and erases: ids drawn from a few, so that probe runs
// collide, wrap around the table's end and are cut by erases; the table
// grows several times. A key's address must not move while its id stays.
#include "id_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <unordered_map>

namespace {

using kvcheck::IdMap;

std::map<std::string, int> contents(const IdMap<int>& map) {
    std::map<std::string, int> seen;
    map.for_each([&seen](const std::string& id, int value) { seen[id] = value; });
    return seen;
}

TEST(IdMap, AgreesWithAnUnorderedMap) {
    for (const std::uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
        std::mt19937_64 random(seed);
        IdMap<int> map;
        std::unordered_map<std::string, int> model;
        std::unordered_map<std::string, const std::string*> keys;  // where each live id's key is
        const std::uint64_t ids = seed % 2 == 0 ? 24 : 3000;
        auto id = [&] { return "e" + std::to_string(random() % ids); };
        for (int step = 0; step < 30000; ++step) {
            const std::string name = id();
            const std::uint64_t action = random() % 4;
            if (action <= 1) {
                const auto [node, inserted] = map.try_emplace(name);
                ASSERT_EQ(inserted, model.count(name) == 0) << "seed " << seed << " step " << step << " " << name;
                ASSERT_EQ(node->key, name);
                if (inserted) {
                    ASSERT_EQ(node->value, 0) << "a new value is value-initialized";
                    keys[name] = &node->key;
                }
                ASSERT_EQ(&node->key, keys[name]) << "the key moved: seed " << seed << " step " << step;
                node->value = step;
                model[name] = step;
            } else if (action == 2) {
                ASSERT_EQ(map.erase(name), model.erase(name) == 1) << "seed " << seed << " step " << step;
                keys.erase(name);
            } else {
                const int* found = map.find(name);
                const auto expected = model.find(name);
                ASSERT_EQ(found != nullptr, expected != model.end()) << "seed " << seed << " step " << step << " " << name;
                if (found != nullptr) {
                    ASSERT_EQ(*found, expected->second);
                }
            }
            ASSERT_EQ(map.size(), model.size());
            if (step % 211 == 0) {
                const std::map<std::string, int> expected(model.begin(), model.end());
                ASSERT_EQ(contents(map), expected) << "seed " << seed;
                for (const auto& [live, value] : model) {
                    const int* found = map.find(live);
                    ASSERT_NE(found, nullptr) << live;
                    ASSERT_EQ(*found, value);
                }
            }
        }
        map.clear();
        EXPECT_EQ(map.size(), 0u);
        EXPECT_EQ(map.find("e1"), nullptr);
        EXPECT_TRUE(contents(map).empty());
        EXPECT_TRUE(map.try_emplace("e1").second) << "usable after clear";
    }
}

TEST(IdMap, EraseOfAMissingIdChangesNothing) {
    IdMap<int> map;
    EXPECT_FALSE(map.erase("a"));
    map.try_emplace("a").first->value = 7;
    EXPECT_FALSE(map.erase("b"));
    EXPECT_EQ(map.size(), 1u);
    EXPECT_EQ(*map.find("a"), 7);
    EXPECT_TRUE(map.erase("a"));
    EXPECT_EQ(map.find("a"), nullptr);
}

}  // namespace
