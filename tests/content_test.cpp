// The content model of kvcheck/content.h: round_to agrees bit for bit with
// torch's casts (the engines under test cast with torch, and an SDK mirrors
// round_to), slot values are not exact in the half dtypes, and a slot's
// values follow its geometry and its segments' precisions.
#include "kvcheck/content.h"

#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using kvcheck::bits_of;
using kvcheck::Dtype;
using kvcheck::float_of;

// `values` cast by torch to `dtype` and back to float32.
std::vector<float> torch_round(const std::vector<float>& values, at::ScalarType dtype) {
    at::Tensor t = at::detail::empty_cpu({static_cast<std::int64_t>(values.size())}, at::kFloat);
    std::memcpy(t.data_ptr<float>(), values.data(), values.size() * sizeof(float));
    const at::Tensor back = t.to(dtype).to(at::kFloat).contiguous();
    const float* data = back.data_ptr<float>();
    return std::vector<float>(data, data + values.size());
}

// Values that probe every branch of both roundings: random bit patterns
// over the whole float32 range, the ties of each dtype (a kept last bit of
// 0 and of 1, exactly half a unit dropped), one unit of the last place
// either side of a tie, float16's subnormals and the edge of its range
// (65504, 65519.99, 65520, 65536), bfloat16's overflow (the largest
// float32), float32 subnormals, zeros and infinities, all with both signs.
std::vector<float> probe_values() {
    std::vector<float> values;
    std::mt19937_64 random(20250611);
    for (int i = 0; i < 200000; ++i) values.push_back(float_of(static_cast<std::uint32_t>(random())));
    for (int i = 0; i < 50000; ++i) {
        // Magnitudes from 2^-30 to 2^17: float16's subnormals and its top.
        const std::uint32_t exponent = 97 + static_cast<std::uint32_t>(random() % 48);
        values.push_back(float_of(exponent << 23 | static_cast<std::uint32_t>(random() & 0x7FFFFF)));
    }
    for (std::uint32_t exponent = 1; exponent < 255; ++exponent) {
        for (const std::uint32_t kept : {0u, 1u, 0x3FFu, 0x7Fu, 0x2AAu}) {
            // Ties for float16 (13 bits dropped) and bfloat16 (16 bits dropped).
            for (const std::uint32_t mantissa : {kept << 13 | 0x1000u, kept << 16 | 0x8000u}) {
                for (const std::int32_t nudge : {-1, 0, 1}) {
                    values.push_back(float_of(exponent << 23 | static_cast<std::uint32_t>(static_cast<std::int32_t>(mantissa) + nudge)));
                }
            }
        }
    }
    for (std::uint32_t units = 0; units < 2048; ++units) {
        values.push_back(static_cast<float>(units) * 0x1p-25f);  // float16 subnormals, and their ties
        values.push_back(static_cast<float>(units) * 0x1p-25f + 0x1p-40f);
    }
    for (const float edge : {65504.0f, 65519.99f, 65520.0f, 65535.0f, 65536.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f,
                             std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                             std::numeric_limits<float>::denorm_min(), 0.0f, std::numeric_limits<float>::infinity()}) {
        values.push_back(edge);
    }
    const std::size_t count = values.size();
    for (std::size_t i = 0; i < count; ++i) values.push_back(-values[i]);
    return values;
}

void expect_agrees_with_torch(Dtype dtype, at::ScalarType torch_dtype) {
    const std::vector<float> values = probe_values();
    const std::vector<float> expected = torch_round(values, torch_dtype);
    std::size_t compared = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
        const float ours = kvcheck::round_to(dtype, values[i]);
        if (std::isnan(values[i])) {
            EXPECT_TRUE(std::isnan(ours)) << "NaN input " << std::hex << bits_of(values[i]);
            continue;
        }
        ++compared;
        ASSERT_EQ(bits_of(ours), bits_of(expected[i]))
            << kvcheck::dtype_name(dtype) << ": input bits 0x" << std::hex << bits_of(values[i]) << " (" << values[i]
            << "): ours 0x" << bits_of(ours) << ", torch 0x" << bits_of(expected[i]);
    }
    EXPECT_GT(compared, 500000u);
}

TEST(RoundTo, Float16AgreesWithTorchBitForBit) { expect_agrees_with_torch(Dtype::f16, at::kHalf); }

TEST(RoundTo, BFloat16AgreesWithTorchBitForBit) { expect_agrees_with_torch(Dtype::bf16, at::kBFloat16); }

TEST(RoundTo, Float32IsTheIdentity) {
    for (const float value : probe_values()) {
        if (!std::isnan(value)) {
            EXPECT_EQ(bits_of(kvcheck::round_to(Dtype::f32, value)), bits_of(value));
        }
    }
}

TEST(RoundTo, TiesGoToEven) {
    // 1 + 2^-11 lies halfway between float16's 1 and 1 + 2^-10: to 1 (even).
    EXPECT_EQ(kvcheck::round_to(Dtype::f16, 1.0f + 0x1p-11f), 1.0f);
    // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: to 1 + 2^-9.
    EXPECT_EQ(kvcheck::round_to(Dtype::f16, 1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
    EXPECT_EQ(kvcheck::round_to(Dtype::bf16, 1.0f + 0x1p-8f), 1.0f);
    EXPECT_EQ(kvcheck::round_to(Dtype::bf16, 1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
    EXPECT_EQ(kvcheck::round_to(Dtype::f16, 65520.0f), std::numeric_limits<float>::infinity());
    EXPECT_EQ(kvcheck::round_to(Dtype::f16, 65519.0f), 65504.0f);
    EXPECT_EQ(kvcheck::round_to(Dtype::f16, 0x1p-25f), 0.0f);  // a tie with zero, which is even
    EXPECT_EQ(kvcheck::round_to(Dtype::f16, 3 * 0x1p-25f), 0x1p-23f);
}

// The values kvcheck fills caches with: almost none survives a cast to a
// half dtype, every class of magnitude occurs, and a bfloat16 value routed
// through float16 often loses bits (the small ones, float16 subnormals).
TEST(SlotValue, IsNotExactInTheHalfDtypesAndSpansItsRanges) {
    constexpr int count = 100000;
    int exact_f16 = 0;
    int exact_bf16 = 0;
    int large = 0;
    int small = 0;
    int bf16_lost_through_f16 = 0;
    for (int i = 0; i < count; ++i) {
        const float value = kvcheck::slot_value(7, i % 3, i / 48, i % 16);
        ASSERT_TRUE(std::isfinite(value));
        const float magnitude = std::fabs(value);
        if (kvcheck::round_to(Dtype::f16, value) == value) ++exact_f16;
        if (kvcheck::round_to(Dtype::bf16, value) == value) ++exact_bf16;
        if (magnitude >= 256.0f) ++large;
        if (magnitude < 0x1p-14f) ++small;
        ASSERT_LT(magnitude, 4096.0f);
        ASSERT_GE(magnitude, 0x1p-26f);
        const float stored = kvcheck::round_to(Dtype::bf16, value);
        if (kvcheck::round_to(Dtype::bf16, kvcheck::round_to(Dtype::f16, stored)) != stored) ++bf16_lost_through_f16;
    }
    EXPECT_LT(exact_f16, count / 1000);
    EXPECT_LT(exact_bf16, count / 100);
    EXPECT_NEAR(large, count / 16, count / 100);
    EXPECT_NEAR(small, count / 16, count / 100);
    EXPECT_GT(bf16_lost_through_f16, count / 40);
}

TEST(SlotValue, IsAPureFunctionOfItsArguments) {
    EXPECT_EQ(bits_of(kvcheck::slot_value(3, 1, 200, 63)), bits_of(kvcheck::slot_value(3, 1, 200, 63)));
    EXPECT_NE(bits_of(kvcheck::slot_value(3, 1, 200, 63)), bits_of(kvcheck::slot_value(4, 1, 200, 63)));
    EXPECT_NE(bits_of(kvcheck::slot_value(3, 1, 200, 63)), bits_of(kvcheck::slot_value(3, 0, 200, 63)));
    EXPECT_NE(bits_of(kvcheck::slot_value(3, 1, 200, 63)), bits_of(kvcheck::slot_value(3, 1, 201, 63)));
    EXPECT_NE(bits_of(kvcheck::slot_value(3, 1, 200, 63)), bits_of(kvcheck::slot_value(3, 1, 200, 62)));
}

// fill_slot: [head][token][dim], the segments' tokens in order within each
// head, each segment rounded to its own precision.
TEST(FillSlot, FollowsTheGeometryAndEachSegmentsPrecision) {
    kvcheck::SlotContent slot;
    slot.present = true;
    slot.segments = {{11, 2, Dtype::f16}, {12, 3, Dtype::bf16}, {13, 1, Dtype::f32}};
    constexpr std::int64_t heads = 3;
    constexpr std::int64_t head_dim = 5;
    std::vector<float> values;
    kvcheck::fill_slot(slot, heads, head_dim, values);
    ASSERT_EQ(values.size(), static_cast<std::size_t>(heads * 6 * head_dim));
    std::size_t at = 0;
    for (std::int64_t h = 0; h < heads; ++h) {
        for (const kvcheck::Segment& segment : slot.segments) {
            for (std::int64_t t = 0; t < segment.tokens; ++t) {
                for (std::int64_t d = 0; d < head_dim; ++d, ++at) {
                    const float expected = kvcheck::round_to(segment.precision, kvcheck::slot_value(segment.seed, h, t, d));
                    ASSERT_EQ(bits_of(values[at]), bits_of(expected)) << "head " << h << " token " << t << " dim " << d;
                }
            }
        }
    }
}

// fill_slot computes eight values at a time where the CPU has AVX-512 (r % 5
// and r % 12 by multiply and shift) and rounds a segment at once: every
// value, in every precision, is bit for bit round_to(slot_value(...)),
// including the tails of fewer than eight and geometries of odd sizes. The
// slots are large enough to reach all 256 exponent draws many times.
TEST(FillSlot, EveryValueIsTheScalarDefinitionsBitForBit) {
    for (const Dtype precision : {Dtype::f32, Dtype::f16, Dtype::bf16}) {
        for (const auto& [heads, head_dim, tokens] : {std::array<std::int64_t, 3>{3, 5, 7},
                                                     std::array<std::int64_t, 3>{2, 4, 1},
                                                     std::array<std::int64_t, 3>{4, 64, 40}}) {
            kvcheck::SlotContent slot;
            slot.present = true;
            slot.segments = {{0x5EEDull * heads + head_dim, tokens, precision}, {99, 3, Dtype::f32}};
            std::vector<float> values;
            kvcheck::fill_slot(slot, heads, head_dim, values);
            std::size_t at = 0;
            for (std::int64_t h = 0; h < heads; ++h) {
                for (const kvcheck::Segment& segment : slot.segments) {
                    for (std::int64_t t = 0; t < segment.tokens; ++t) {
                        for (std::int64_t d = 0; d < head_dim; ++d, ++at) {
                            const float expected =
                                kvcheck::round_to(segment.precision, kvcheck::slot_value(segment.seed, h, t, d));
                            ASSERT_EQ(bits_of(values[at]), bits_of(expected))
                                << "head " << h << " token " << t << " dim " << d << " of " << heads << "x" << head_dim;
                        }
                    }
                }
            }
            ASSERT_EQ(at, values.size());
        }
    }
}

// The expected view of a cache of another geometry has its shape, and its
// hash is that of the values rounded to the cache's dtype: a half cache's
// values cast back to float32 hash as its view says; unrounded ones do not.
TEST(ExpectedView, HasTheGeometryAndHashesTheRoundedValues) {
    const kvcheck::CacheSpec spec = kvcheck::parse_cache_spec("modern/bf16/5/3x8:[kv7]");
    const kvcheck::CacheContent content = kvcheck::expand(spec);
    const kvcheck::CacheView view = kvcheck::expected_view(content);
    ASSERT_EQ(view.layers.size(), 1u);
    const kvcheck::SlotView& keys = view.layers[0].slots[kvcheck::keys];
    EXPECT_EQ(keys.shape, (std::vector<std::int64_t>{1, 3, 7, 8}));
    EXPECT_EQ(keys.dtype, Dtype::bf16);
    const kvcheck::SlotContent& slot = content.layers[0].slots[kvcheck::keys];
    std::vector<float> rounded;
    kvcheck::fill_slot(slot, 3, 8, rounded);
    EXPECT_EQ(keys.hash, kvcheck::content_hash(rounded.data(), rounded.size()));
    std::vector<float> unrounded;
    for (std::int64_t h = 0; h < 3; ++h) {
        for (std::int64_t t = 0; t < 7; ++t) {
            for (std::int64_t d = 0; d < 8; ++d) unrounded.push_back(kvcheck::slot_value(slot.segments[0].seed, h, t, d));
        }
    }
    EXPECT_NE(keys.hash, kvcheck::content_hash(unrounded.data(), unrounded.size()));
    EXPECT_EQ(kvcheck::view_digest(view), kvcheck::expected_digest(content));
}

// A merge of float16 and bfloat16 parts is float32, and its values are each
// part's, rounded to that part's dtype: exactly what torch.cat gives.
TEST(ExpectedConcat, PromotesAndKeepsEachPartsRounding) {
    const kvcheck::CacheContent half = kvcheck::expand(kvcheck::parse_cache_spec("modern/f16/1:[kv2]"));
    const kvcheck::CacheContent brain = kvcheck::expand(kvcheck::parse_cache_spec("modern/bf16/2:[kv3]"));
    const kvcheck::CacheContent merged = kvcheck::expected_concat({half, brain});
    EXPECT_EQ(merged.dtype, Dtype::f32);
    const kvcheck::SlotContent& keys = merged.layers[0].slots[kvcheck::keys];
    ASSERT_EQ(keys.segments.size(), 2u);
    EXPECT_EQ(keys.segments[0].precision, Dtype::f16);
    EXPECT_EQ(keys.segments[1].precision, Dtype::bf16);
    const kvcheck::CacheView view = kvcheck::expected_view(merged);
    EXPECT_EQ(view.layers[0].slots[kvcheck::keys].dtype, Dtype::f32);
    EXPECT_EQ(view.layers[0].slots[kvcheck::keys].shape, (std::vector<std::int64_t>{1, 2, 5, 4}));
}

TEST(ExpectedConcat, NeedsOneGeometryAmongThePartsHoldingTokens) {
    const kvcheck::CacheContent small = kvcheck::expand(kvcheck::parse_cache_spec("modern/f32/1:[kv2]"));
    const kvcheck::CacheContent wide = kvcheck::expand(kvcheck::parse_cache_spec("modern/f32/2/4x8:[kv3]"));
    const kvcheck::CacheContent wide_empty = kvcheck::expand(kvcheck::parse_cache_spec("modern/f32/2/4x8:[kv0]"));
    EXPECT_FALSE(kvcheck::merged_geometry_ok({small, wide}));
    EXPECT_TRUE(kvcheck::merged_geometry_ok({small, wide_empty}));
    EXPECT_TRUE(kvcheck::merged_geometry_ok({wide, wide}));
    const kvcheck::CacheContent merged = kvcheck::expected_concat({wide_empty, small});
    EXPECT_EQ(merged.heads, 2);
    EXPECT_EQ(merged.head_dim, 4);
    EXPECT_EQ(kvcheck::expected_concat({wide, wide}).heads, 4);
}

}  // namespace
