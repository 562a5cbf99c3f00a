// content_hash, the hash of a cache's values every view carries: what must
// count (each value, each of its bits, its position, the count) and what
// must not (the sign of a zero), and its value on fixed inputs, computed
// apart from this code (plain integers in Python, from the definition in
// docs/protocol.md), so that a change of the definition cannot go unseen.
#include "kvcheck/content.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

namespace {

using kvcheck::bits_of;
using kvcheck::content_hash;
using kvcheck::float_of;

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

// Every single-bit change of any value, at every position, changes the
// hash; except the sign of a zero, which must not.
TEST(ContentHash, EveryBitOfEveryValueCounts) {
    for (const std::size_t count : lengths) {
        const std::vector<float> base = ramp(count);
        const std::uint64_t base_hash = hash_of(base);
        for (std::size_t i = 0; i < count; ++i) {
            for (int bit = 0; bit < 32; ++bit) {
                std::vector<float> changed = base;
                changed[i] = float_of(bits_of(base[i]) ^ (1u << bit));
                const bool zero_sign = (bits_of(base[i]) | bits_of(changed[i])) == 0x80000000u;
                if (zero_sign) {
                    EXPECT_EQ(hash_of(changed), base_hash) << "value " << i << " of " << count;
                } else {
                    EXPECT_NE(hash_of(changed), base_hash) << "bit " << bit << " of value " << i << " of " << count;
                }
            }
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

std::vector<float> of_bits(const std::vector<std::uint32_t>& patterns) {
    std::vector<float> values;
    for (const std::uint32_t bits : patterns) values.push_back(float_of(bits));
    return values;
}

// The values of the definition, computed with plain integers apart from
// this code: splitmix64(S ^ splitmix64(n)), S the sum of splitmix64(i << 32
// | bits) modulo 2^64.
TEST(ContentHash, GoldenValues) {
    EXPECT_EQ(content_hash(nullptr, 0), 0xA706DD2F4D197E6Full);
    EXPECT_EQ(hash_of({0.0f}), 0xD300120A5EA35CACull);
    EXPECT_EQ(hash_of({-0.0f}), 0xD300120A5EA35CACull);
    EXPECT_EQ(hash_of({1.0f}), 0x54648985A5013C36ull);
    // Lengths below, at and past the eight values a vector step takes.
    EXPECT_EQ(hash_of(ramp(7)), 0xFA7898B490F89F7Eull);
    EXPECT_EQ(hash_of(ramp(9)), 0xB96AA709F8F55DD4ull);
    EXPECT_EQ(hash_of(ramp(41)), 0x453A6556EC051DFEull);
    EXPECT_EQ(hash_of(ramp(1000)), 0x3C70AE9810CE5BF9ull);
    // Infinities, a NaN, subnormals, all ones and -0 read as bits.
    EXPECT_EQ(hash_of(of_bits({0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x00000001u, 0x80000001u, 0x3F800000u,
                               0xFFFFFFFFu, 0x80000000u})),
              0x237FC9EF1D8CC3F8ull);
}

}  // namespace
