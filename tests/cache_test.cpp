// The cache layouts: update semantics, clone, concat and the conversions.
#include "kv/cache.h"
#include "test_util.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

namespace {

using kv::Layout;
using kvtest::kv_tensor;
using kvtest::make_cache;
using kvtest::same_cache;

const Layout layouts[] = {Layout::modern, Layout::legacy};
const at::ScalarType dtypes[] = {at::kFloat, at::kHalf, at::kBFloat16};

TEST(CacheUpdate, NewCacheHasNoLayers) {
    for (Layout layout : layouts) {
        auto cache = kv::Cache::make(layout);
        EXPECT_EQ(cache->layer_count(), 0);
        EXPECT_EQ(cache->get_seq_length(), 0);
        EXPECT_FALSE(cache->owned());
    }
}

TEST(CacheUpdate, ModernAppendsInPlaceOnTheSameLayerObject) {
    auto cache = kv::Cache::make(Layout::modern);
    cache->update(kv_tensor(3, 1), kv_tensor(3, 2), 0);
    const kv::Layer* layer = (*cache->layers())[0].get();
    const auto* list = cache->layers().get();
    cache->update(kv_tensor(2, 3), kv_tensor(2, 4), 0);
    EXPECT_EQ((*cache->layers())[0].get(), layer) << "update must rebind on the same layer object";
    EXPECT_EQ(cache->layers().get(), list);
    EXPECT_EQ(cache->get_seq_length(), 5);
    EXPECT_TRUE(at::equal(layer->keys, at::cat({kv_tensor(3, 1), kv_tensor(2, 3)}, -2)));
}

TEST(CacheUpdate, ModernPadsMissingLayersUninitialized) {
    auto cache = kv::Cache::make(Layout::modern);
    cache->update(kv_tensor(2, 1), kv_tensor(2, 2), 2);
    ASSERT_EQ(cache->layer_count(), 3);
    EXPECT_FALSE((*cache->layers())[0]->is_initialized);
    EXPECT_EQ(cache->get_seq_length(0), 0);
    EXPECT_EQ(cache->get_seq_length(2), 2);
    EXPECT_EQ(cache->get_seq_length(7), 0);
}

TEST(CacheUpdate, BareLayerWithAssignedTensorsIsUninitializedAndLosesThem) {
    // The real bug behind M7: tensors assigned to a bare layer read as
    // length 0 and are dropped by the next update.
    auto layers = std::make_shared<kv::LayerList>();
    auto layer = std::make_shared<kv::Layer>();
    layer->keys = kv_tensor(4, 1);
    layer->values = kv_tensor(4, 2);
    layers->push_back(layer);
    auto cache = kv::Cache::from_layers(layers);
    EXPECT_EQ(cache->get_seq_length(), 0);
    cache->update(kv_tensor(1, 3), kv_tensor(1, 4), 0);
    EXPECT_EQ(cache->get_seq_length(), 1);
    EXPECT_TRUE(at::equal(layer->keys, kv_tensor(1, 3)));
}

TEST(CacheUpdate, LegacyFirstInsertAliasesTheCallersTensor) {
    auto cache = kv::Cache::make(Layout::legacy);
    at::Tensor k = kv_tensor(3, 1);
    at::Tensor v = kv_tensor(3, 2);
    cache->update(k, v, 1);
    ASSERT_EQ(cache->layer_count(), 2);
    EXPECT_EQ((*cache->key_cache())[0].numel(), 0) << "padding slot";
    EXPECT_TRUE((*cache->key_cache())[1].is_same(k)) << "first insert is an alias";
    cache->update(kv_tensor(1, 5), kv_tensor(1, 6), 0);
    EXPECT_EQ(cache->get_seq_length(0), 1) << "an empty slot is replaced";
    cache->update(kv_tensor(2, 7), kv_tensor(2, 8), 1);
    EXPECT_FALSE((*cache->key_cache())[1].is_same(k)) << "a later append rebinds";
    EXPECT_EQ(cache->get_seq_length(1), 5);
    EXPECT_TRUE(at::equal(k, kv_tensor(3, 1))) << "the caller's tensor is never written";
}

TEST(CacheUpdate, EveryFloatDtype) {
    for (Layout layout : layouts) {
        for (at::ScalarType dtype : dtypes) {
            auto cache = make_cache(layout, 2, 3, 9, dtype);
            cache->update(kv_tensor(1, 1, dtype), kv_tensor(1, 2, dtype), 1);
            EXPECT_EQ(cache->get_seq_length(1), 4);
            EXPECT_EQ(kv::logical_keys(*cache, 1).scalar_type(), dtype);
        }
    }
}

// update appends without at::cat for plain pieces (src/cache.cpp,
// cat_tokens): the result must be what at::cat gives, for every dtype, with
// several heads (the copy goes row by row of [batch, heads]), in a storage
// of its own at version 0; mixed dtypes and non-contiguous pieces go
// through at::cat itself (promotion, strides).
TEST(CacheUpdate, AppendIsWhatCatGives) {
    for (Layout layout : layouts) {
        for (at::ScalarType dtype : dtypes) {
            const at::Tensor first = at::randn({1, 3, 2, 4}).to(dtype);
            const at::Tensor second = at::randn({1, 3, 5, 4}).to(dtype);
            const at::Tensor first_v = at::randn({1, 3, 2, 4}).to(dtype);
            const at::Tensor second_v = at::randn({1, 3, 5, 4}).to(dtype);
            auto cache = kv::Cache::make(layout);
            cache->update(first, first_v, 0);
            cache->update(second, second_v, 0);
            const at::Tensor keys = kv::logical_keys(*cache, 0);
            const at::Tensor expected = at::cat({first, second}, -2);
            EXPECT_TRUE(at::equal(keys, expected));
            EXPECT_EQ(keys.sizes(), expected.sizes());
            EXPECT_EQ(keys.scalar_type(), dtype);
            EXPECT_TRUE(keys.is_contiguous());
            EXPECT_EQ(keys._version(), 0u);
            EXPECT_FALSE(keys.is_alias_of(first));
            EXPECT_FALSE(keys.is_alias_of(second));
            EXPECT_TRUE(at::equal(kv::logical_values(*cache, 0), at::cat({first_v, second_v}, -2)));
        }
    }
    // A float32 piece on a bfloat16 slot: at::cat promotes.
    auto mixed = kv::Cache::make(Layout::modern);
    mixed->update(kv_tensor(2, 1, at::kBFloat16), kv_tensor(2, 2, at::kBFloat16), 0);
    mixed->update(kv_tensor(1, 3), kv_tensor(1, 4), 0);
    EXPECT_EQ(kv::logical_keys(*mixed, 0).scalar_type(), at::kFloat);
    // A transposed (non-contiguous) piece: at::cat reads it by its strides.
    const at::Tensor base = at::randn({1, 2, 4, 3});
    const at::Tensor strided = base.transpose(2, 3);
    ASSERT_FALSE(strided.is_contiguous());
    auto odd = kv::Cache::make(Layout::legacy);
    odd->update(kv_tensor(2, 1), kv_tensor(2, 2), 0);
    odd->update(strided, strided, 0);
    EXPECT_TRUE(at::equal(kv::logical_keys(*odd, 0), at::cat({kv_tensor(2, 1), strided}, -2)));
}

TEST(Clone, IsIndependentAndOwned) {
    for (Layout layout : layouts) {
        auto source = make_cache(layout, 3, 4, 1);
        auto copy = kv::clone(*source);
        EXPECT_TRUE(copy->owned());
        EXPECT_TRUE(same_cache(*copy, *source));
        EXPECT_FALSE(kv::shares_storage(*copy, *source));
        const auto before = kv::clone(*source);
        copy->update(kv_tensor(2, 5), kv_tensor(2, 6), 0);
        copy->update(kv_tensor(2, 5), kv_tensor(2, 6), 4);
        std::string why;
        EXPECT_TRUE(same_cache(*source, *before, &why)) << why;
    }
}

TEST(Clone, OfAnEmptyCacheGetsItsOwnLayerList) {
    for (Layout layout : layouts) {
        auto source = kv::Cache::make(layout);
        auto copy = kv::clone(*source);
        copy->update(kv_tensor(2, 1), kv_tensor(2, 2), 1);
        EXPECT_EQ(source->layer_count(), 0) << kv::layout_name(layout);
        EXPECT_EQ(copy->layer_count(), 2);
    }
}

TEST(Clone, KeepsBothSlotNamesAndPrefersTheModernOnes) {
    auto layer = std::make_shared<kv::Layer>();
    layer->keys = kv_tensor(3, 1);
    layer->values = kv_tensor(3, 2);
    layer->key_cache = kv_tensor(5, 3);
    layer->value_cache = kv_tensor(5, 4);
    layer->is_initialized = true;
    auto source = kv::Cache::from_layers(std::make_shared<kv::LayerList>(kv::LayerList{layer}));
    auto copy = kv::clone(*source);
    std::string why;
    EXPECT_TRUE(same_cache(*copy, *source, &why)) << why;
    EXPECT_EQ(copy->get_seq_length(), 3) << "the modern slots win";
    EXPECT_TRUE(at::equal(kv::logical_keys(*copy, 0), kv_tensor(3, 1)));
}

TEST(Clone, OneSidedAndLegacyNamedLayersKeepEverySlot) {
    auto keys_only = std::make_shared<kv::Layer>();
    keys_only->keys = kv_tensor(2, 1);
    keys_only->is_initialized = true;
    auto values_only = std::make_shared<kv::Layer>();
    values_only->values = kv_tensor(2, 2);
    auto legacy_named = std::make_shared<kv::Layer>();
    legacy_named->key_cache = kv_tensor(3, 3);
    legacy_named->value_cache = kv_tensor(3, 4);
    legacy_named->is_initialized = true;
    auto source = kv::Cache::from_layers(
        std::make_shared<kv::LayerList>(kv::LayerList{keys_only, values_only, legacy_named}));
    auto copy = kv::clone(*source);
    std::string why;
    EXPECT_TRUE(same_cache(*copy, *source, &why)) << why;
    EXPECT_FALSE(kv::shares_storage(*copy, *source));
    EXPECT_EQ(copy->get_seq_length(2), 3) << "legacy-named slots are the layer's keys";
}

TEST(Clone, LegacyLayoutIsIndependent) {
    auto source = make_cache(Layout::legacy, 2, 3, 7, at::kBFloat16);
    auto copy = kv::clone(*source);
    EXPECT_EQ(copy->layout(), Layout::legacy);
    EXPECT_NE(copy->key_cache().get(), source->key_cache().get());
    EXPECT_FALSE(kv::shares_storage(*copy, *source));
    copy->update(kv_tensor(1, 1, at::kBFloat16), kv_tensor(1, 2, at::kBFloat16), 0);
    EXPECT_EQ(source->get_seq_length(0), 3);
}

TEST(Concat, LayersAreTheConcatenationInRequestOrderAndInitialized) {
    auto a = make_cache(Layout::modern, 2, 3, 1);
    auto b = make_cache(Layout::modern, 2, 4, 2);
    auto merged = kv::concat({a, b});
    EXPECT_TRUE(merged->owned());
    EXPECT_EQ(merged->get_seq_length(0), 7) << "the length-0 merged-cache bug";
    for (std::int64_t i = 0; i < 2; ++i) {
        EXPECT_TRUE((*merged->layers())[i]->is_initialized);
        EXPECT_TRUE(at::equal(kv::logical_keys(*merged, i),
                              at::cat({kv::logical_keys(*a, i), kv::logical_keys(*b, i)}, -2)));
    }
    auto reversed = kv::concat({b, a});
    EXPECT_FALSE(at::equal(kv::logical_keys(*reversed, 0), kv::logical_keys(*merged, 0)));
    EXPECT_FALSE(kv::shares_storage(*merged, *a));
    EXPECT_FALSE(kv::shares_storage(*merged, *b));
    merged->update(kv_tensor(1, 1), kv_tensor(1, 2), 0);
    EXPECT_EQ(a->get_seq_length(), 3);
    EXPECT_EQ(b->get_seq_length(), 4);
}

TEST(Concat, LegacyPartsGiveALegacyCacheAndMixedPartsAModernOne) {
    auto a = make_cache(Layout::legacy, 2, 2, 1);
    auto b = make_cache(Layout::legacy, 1, 3, 2);
    auto merged = kv::concat({a, b});
    EXPECT_EQ(merged->layout(), Layout::legacy);
    EXPECT_EQ(merged->get_seq_length(0), 5);
    EXPECT_EQ(merged->get_seq_length(1), 2);
    auto mixed = kv::concat({a, make_cache(Layout::modern, 2, 1, 3)});
    EXPECT_EQ(mixed->layout(), Layout::modern);
    EXPECT_EQ(mixed->get_seq_length(1), 3);
}

// Every merged slot has one dtype: that of the parts holding any tensor,
// promoted as torch.cat promotes (an empty part included), also in a layer
// only one part fills (corpus/regressions/ops-reference-merge-correct-
// promotion-by-empty-part.trace).
TEST(Concat, PromotesTheDtypeOverEveryPartHoldingATensor) {
    auto bf16 = make_cache(Layout::modern, 1, 2, 1, at::kBFloat16);
    auto empty_f32 = make_cache(Layout::modern, 1, 0, 2, at::kFloat);
    auto merged = kv::concat({bf16, empty_f32});
    EXPECT_EQ(kv::logical_keys(*merged, 0).scalar_type(), at::kFloat);
    EXPECT_EQ(merged->get_seq_length(0), 2);
    EXPECT_TRUE(at::equal(kv::logical_keys(*merged, 0), kv::logical_keys(*bf16, 0).to(at::kFloat)));

    auto f16_two_layers = make_cache(Layout::modern, 2, 0, 3, at::kHalf);
    f16_two_layers->update(kvtest::kv_tensor(1, 4, at::kHalf), kvtest::kv_tensor(1, 5, at::kHalf), 1);
    auto mixed = kv::concat({bf16, f16_two_layers});
    for (std::int64_t i = 0; i < 2; ++i) {
        EXPECT_EQ(kv::logical_keys(*mixed, i).scalar_type(), at::kFloat) << "layer " << i;
        EXPECT_EQ(kv::logical_values(*mixed, i).scalar_type(), at::kFloat) << "layer " << i;
    }

    // A part with no tensor at all has no dtype to give.
    auto bare = kv::Cache::make(Layout::modern);
    EXPECT_EQ(kv::logical_keys(*kv::concat({bf16, bare}), 0).scalar_type(), at::kBFloat16);
}

TEST(Conversion, ModernLegacyModernRoundTrips) {
    for (at::ScalarType dtype : dtypes) {
        auto modern = make_cache(Layout::modern, 3, 4, 5, dtype);
        auto legacy = kv::to_legacy(*modern);
        EXPECT_EQ(legacy->layout(), Layout::legacy);
        auto back = kv::from_legacy(*legacy);
        std::string why;
        EXPECT_TRUE(same_cache(*back, *modern, &why)) << why;
        EXPECT_FALSE(kv::shares_storage(*back, *modern)) << "from_legacy copies";
    }
}

TEST(Conversion, LegacyModernLegacyRoundTripsWithEmptySlots) {
    auto legacy = kv::Cache::make(Layout::legacy);
    legacy->update(kv_tensor(2, 1, at::kHalf), kv_tensor(2, 2, at::kHalf), 2);
    auto modern = kv::from_legacy(*legacy);
    for (std::int64_t i = 0; i < 3; ++i) EXPECT_TRUE((*modern->layers())[i]->is_initialized);
    auto back = kv::to_legacy(*modern);
    std::string why;
    EXPECT_TRUE(same_cache(*back, *legacy, &why)) << why;
}

TEST(Conversion, UninitializedLayersConvertToEmptySlots) {
    auto modern = kv::Cache::make(Layout::modern);
    modern->update(kv_tensor(2, 1), kv_tensor(2, 2), 1);
    auto legacy = kv::to_legacy(*modern);
    EXPECT_EQ((*legacy->key_cache())[0].numel(), 0);
    EXPECT_EQ(legacy->get_seq_length(1), 2);
    EXPECT_THROW(kv::to_legacy(*legacy), std::invalid_argument);
    EXPECT_THROW(kv::from_legacy(*modern), std::invalid_argument);
}

}  // namespace
