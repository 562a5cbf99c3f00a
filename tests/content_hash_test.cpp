// content_hash, the hash of a cache's values every view carries: what must
// count (each value, its position, the count) and what must not (the sign
// of a zero), at lengths on both sides of its 8-value steps.
#include "kvcheck/content.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

namespace {

using kvcheck::content_hash;

std::vector<float> ramp(std::size_t count) {
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i) * 0.5f - 3.0f;
    return values;
}

std::uint64_t hash_of(const std::vector<float>& values) { return content_hash(values.data(), values.size()); }

const std::size_t lengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 40, 41};

TEST(ContentHash, EveryValueCounts) {
    for (const std::size_t count : lengths) {
        const std::vector<float> base = ramp(count);
        for (std::size_t i = 0; i < count; ++i) {
            std::vector<float> changed = base;
            changed[i] += 0.125f;
            EXPECT_NE(hash_of(changed), hash_of(base)) << "value " << i << " of " << count;
        }
    }
}

TEST(ContentHash, PositionsCount) {
    for (const std::size_t count : lengths) {
        const std::vector<float> base = ramp(count);
        for (std::size_t i = 0; i < count; ++i) {
            for (std::size_t j = i + 1; j < count; ++j) {
                std::vector<float> swapped = base;
                std::swap(swapped[i], swapped[j]);
                EXPECT_NE(hash_of(swapped), hash_of(base)) << "values " << i << " and " << j << " of " << count;
            }
        }
    }
}

TEST(ContentHash, TheCountCounts) {
    std::set<std::uint64_t> hashes;
    for (std::size_t count = 0; count <= 33; ++count) hashes.insert(hash_of(std::vector<float>(count, 0.0f)));
    EXPECT_EQ(hashes.size(), 34u) << "runs of zeros of different lengths share a hash";
}

TEST(ContentHash, TheSignOfZeroDoesNot) {
    for (const std::size_t count : lengths) {
        std::vector<float> positive = ramp(count);
        std::vector<float> negative = positive;
        for (std::size_t i = 0; i < count; i += 3) {
            positive[i] = 0.0f;
            negative[i] = -0.0f;
        }
        EXPECT_EQ(hash_of(positive), hash_of(negative)) << count;
    }
}

}  // namespace
