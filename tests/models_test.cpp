// The models generation drives: they append in place through update, they
// are deterministic, and the attention decoder is exact enough to tell a
// correct cache from one that lost or repeated a token.
#include "kv/models.h"

#include <ATen/Parallel.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using kv::Layout;
using kv::models::Appender;
using kv::models::Decoder;
using kv::models::DecoderConfig;
using Tokens = std::vector<std::int64_t>;

constexpr std::int64_t new_tokens_max = 8;
const Tokens memory_tokens{5, 9, 2, 17, 30, 11};
const Tokens prompt_tokens{7, 3};

// The seeds every decoder test runs; eos -1 so that every generation runs
// the full new_tokens_max steps and a change anywhere in it is seen.
const std::vector<std::uint64_t> decoder_seeds{1, 2, 3, 4};

DecoderConfig config_for(std::uint64_t seed) {
    DecoderConfig config;
    config.seed = seed;
    config.eos_token = -1;
    return config;
}

Tokens joined(const Tokens& a, const Tokens& b) {
    Tokens all = a;
    all.insert(all.end(), b.begin(), b.end());
    return all;
}

// Same layer count and, layer by layer, bit-identical logical K and V.
bool same_content(const kv::Cache& a, const kv::Cache& b, std::string* why) {
    if (a.layer_count() != b.layer_count()) {
        *why = "layer count " + std::to_string(a.layer_count()) + " vs " + std::to_string(b.layer_count());
        return false;
    }
    for (std::int64_t layer = 0; layer < a.layer_count(); ++layer) {
        if (!at::equal(kv::logical_keys(a, layer), kv::logical_keys(b, layer))) {
            *why = "layer " + std::to_string(layer) + " keys differ";
            return false;
        }
        if (!at::equal(kv::logical_values(a, layer), kv::logical_values(b, layer))) {
            *why = "layer " + std::to_string(layer) + " values differ";
            return false;
        }
    }
    return true;
}

// A cache of the same layout whose every layer has token `position` removed
// (drop) or present twice (duplicate); the other tokens keep their K/V bits.
enum class Edit { drop, duplicate };

kv::CachePtr edited(const kv::Cache& cache, std::int64_t position, Edit edit) {
    auto keys = std::make_shared<kv::TensorList>();
    auto values = std::make_shared<kv::TensorList>();
    auto edit_one = [position, edit](const at::Tensor& t) {
        const std::int64_t length = t.size(2);
        const at::Tensor before = t.narrow(2, 0, position);
        const at::Tensor token = t.narrow(2, position, 1);
        const at::Tensor after = t.narrow(2, position + 1, length - position - 1);
        if (edit == Edit::drop) return at::cat({before, after}, 2);
        return at::cat({before, token, token, after}, 2);
    };
    for (std::int64_t layer = 0; layer < cache.layer_count(); ++layer) {
        keys->push_back(edit_one(kv::logical_keys(cache, layer)));
        values->push_back(edit_one(kv::logical_values(cache, layer)));
    }
    auto legacy = kv::Cache::from_slots(keys, values);
    return cache.layout() == Layout::legacy ? legacy : kv::from_legacy(*legacy);
}

Tokens generate_from(Decoder& decoder, const kv::ConstCachePtr& memory) {
    kv::Copier copier;
    return kv::generate(decoder, copier, prompt_tokens, memory, new_tokens_max);
}

std::string name(Layout layout) { return kv::layout_name(layout); }

// ---------------------------------------------------------------- Appender

TEST(ModelsAppender, AppendsInPlaceThroughUpdate) {
    for (const Layout layout : {Layout::modern, Layout::legacy}) {
        SCOPED_TRACE(name(layout));
        Appender appender({});
        const kv::CachePtr cache = kv::Cache::make(layout);
        appender.forward({1, 2, 3}, *cache);
        ASSERT_EQ(cache->layer_count(), 2);
        const at::Tensor first_keys = kv::logical_keys(*cache, 0);
        const at::Tensor first_copy = first_keys.clone();
        const void* list_before = layout == Layout::modern ? static_cast<const void*>(cache->layers().get())
                                                           : static_cast<const void*>(cache->key_cache().get());
        const kv::Layer* layer_before = layout == Layout::modern ? (*cache->layers())[0].get() : nullptr;

        appender.forward({4}, *cache);

        for (std::int64_t layer = 0; layer < 2; ++layer) {
            EXPECT_EQ(cache->get_seq_length(layer), 4);
            EXPECT_EQ(kv::logical_keys(*cache, layer).sizes().vec(), (std::vector<std::int64_t>{1, 2, 4, 4}));
            EXPECT_EQ(kv::logical_values(*cache, layer).sizes().vec(), (std::vector<std::int64_t>{1, 2, 4, 4}));
            EXPECT_EQ(kv::logical_keys(*cache, layer).scalar_type(), at::kFloat);
        }
        // The caller's objects grew; nothing was rebuilt around them.
        if (layout == Layout::modern) {
            EXPECT_EQ(cache->layers().get(), list_before);
            EXPECT_EQ((*cache->layers())[0].get(), layer_before);
        } else {
            EXPECT_EQ(cache->key_cache().get(), list_before);
        }
        // Appending rebinds: the old tensor is untouched and is the prefix.
        EXPECT_TRUE(at::equal(first_keys, first_copy));
        EXPECT_TRUE(at::equal(kv::logical_keys(*cache, 0).narrow(2, 0, 3), first_copy));
    }
}

TEST(ModelsAppender, ValuesDependOnTokenPositionAndLayer) {
    Appender appender({});
    const auto one = kv::models::memory_cache(appender, {1, 2, 3}, Layout::modern);
    const auto two = kv::models::memory_cache(appender, {1, 2, 3}, Layout::legacy);
    const auto other = kv::models::memory_cache(appender, {1, 4, 3}, Layout::modern);
    std::string why;
    EXPECT_TRUE(same_content(*one, *two, &why)) << why;
    EXPECT_FALSE(same_content(*one, *other, &why));
    EXPECT_FALSE(at::equal(kv::logical_keys(*one, 0), kv::logical_keys(*one, 1)));
    EXPECT_FALSE(at::equal(kv::logical_keys(*one, 0), kv::logical_values(*one, 0)));
    // Same token at two positions: different K.
    const auto repeated = kv::models::memory_cache(appender, {6, 6}, Layout::modern);
    const at::Tensor keys = kv::logical_keys(*repeated, 0);
    EXPECT_FALSE(at::equal(keys.narrow(2, 0, 1), keys.narrow(2, 1, 1)));
}

TEST(ModelsAppender, HalfPrecisionIsExactAndFollowsTheCache) {
    Appender appender({});
    const auto reference = kv::models::memory_cache(appender, {1, 2, 3, 4}, Layout::modern);
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
        for (const Layout layout : {Layout::modern, Layout::legacy}) {
            SCOPED_TRACE(name(layout) + " " + std::string(c10::toString(dtype)));
            const auto cache = kv::models::memory_cache(appender, {1, 2, 3}, layout, dtype);
            EXPECT_EQ(kv::models::cache_dtype(*cache), dtype);
            appender.forward({4}, *cache);  // decodes in the cache's dtype
            for (std::int64_t layer = 0; layer < 2; ++layer) {
                const at::Tensor keys = kv::logical_keys(*cache, layer);
                EXPECT_EQ(keys.scalar_type(), dtype);
                EXPECT_TRUE(at::equal(keys.to(at::kFloat), kv::logical_keys(*reference, layer)));
                EXPECT_TRUE(at::equal(kv::logical_values(*cache, layer).to(at::kFloat),
                                      kv::logical_values(*reference, layer)));
            }
        }
    }
}

TEST(ModelsAppender, GeneratesTheSameWithCacheOrRecompute) {
    kv::models::AppenderConfig config;
    config.eos_token = -1;
    Appender appender(config);
    for (const Layout layout : {Layout::modern, Layout::legacy}) {
        const auto memory = kv::models::memory_cache(appender, memory_tokens, layout);
        kv::Copier copier;
        const Tokens cached = kv::generate(appender, copier, prompt_tokens, memory, new_tokens_max);
        EXPECT_EQ(cached.size(), static_cast<std::size_t>(new_tokens_max));
        EXPECT_EQ(cached, kv::models::generate_without_cache(appender, joined(memory_tokens, prompt_tokens),
                                                             new_tokens_max));
        EXPECT_EQ(memory->get_seq_length(0), 6) << "generate wrote into the memory";
    }
}

// ----------------------------------------------------------------- Decoder

TEST(ModelsDecoder, AppendsInPlaceThroughUpdate) {
    for (const Layout layout : {Layout::modern, Layout::legacy}) {
        SCOPED_TRACE(name(layout));
        Decoder decoder(config_for(1));
        const kv::CachePtr cache = kv::Cache::make(layout);
        decoder.forward(memory_tokens, *cache);
        const kv::CachePtr snapshot = kv::clone(*cache);
        const void* list_before = layout == Layout::modern ? static_cast<const void*>(cache->layers().get())
                                                           : static_cast<const void*>(cache->key_cache().get());
        decoder.forward({4}, *cache);
        EXPECT_EQ(cache->layer_count(), 2);
        for (std::int64_t layer = 0; layer < 2; ++layer) {
            EXPECT_EQ(cache->get_seq_length(layer), 7);
            EXPECT_EQ(kv::logical_keys(*cache, layer).sizes().vec(), (std::vector<std::int64_t>{1, 2, 7, 4}));
            EXPECT_EQ(kv::logical_values(*cache, layer).scalar_type(), at::kFloat);
            EXPECT_TRUE(at::equal(kv::logical_keys(*cache, layer).narrow(2, 0, 6),
                                  kv::logical_keys(*snapshot, layer)));
            // K and V of a layer are separate tensors with separate storage.
            EXPECT_NE(kv::logical_keys(*cache, layer).storage().data(),
                      kv::logical_values(*cache, layer).storage().data());
        }
        EXPECT_EQ(layout == Layout::modern ? static_cast<const void*>(cache->layers().get())
                                           : static_cast<const void*>(cache->key_cache().get()),
                  list_before);
    }
}

TEST(ModelsDecoder, SameSeedSameTokens) {
    for (const std::uint64_t seed : decoder_seeds) {
        Decoder first(config_for(seed));
        Decoder second(config_for(seed));
        const auto memory = kv::models::memory_cache(first, memory_tokens, Layout::modern);
        const Tokens tokens = generate_from(first, memory);
        EXPECT_EQ(tokens.size(), static_cast<std::size_t>(new_tokens_max));
        EXPECT_EQ(generate_from(first, memory), tokens) << "seed " << seed << ", same instance";
        EXPECT_EQ(generate_from(second, kv::models::memory_cache(second, memory_tokens, Layout::modern)), tokens)
            << "seed " << seed << ", second instance";
    }
}

TEST(ModelsDecoder, DifferentSeedsGiveDifferentTokens) {
    Decoder one(config_for(1));
    Decoder two(config_for(2));
    EXPECT_NE(kv::models::generate_without_cache(one, memory_tokens, new_tokens_max),
              kv::models::generate_without_cache(two, memory_tokens, new_tokens_max));
}

TEST(ModelsDecoder, SameTokensForAnyThreadCount) {
    const int threads_before = at::get_num_threads();
    Decoder decoder(config_for(3));
    at::set_num_threads(1);
    const Tokens single = kv::models::generate_without_cache(decoder, memory_tokens, new_tokens_max);
    at::set_num_threads(4);
    const Tokens multiple = kv::models::generate_without_cache(decoder, memory_tokens, new_tokens_max);
    at::set_num_threads(threads_before);
    EXPECT_EQ(single, multiple);
}

// The reason generation equivalence can be exact: K/V do not depend on how
// the sequence was split into forward calls.
TEST(ModelsDecoder, ChunkedPrefillIsBitExact) {
    for (const Layout layout : {Layout::modern, Layout::legacy}) {
        SCOPED_TRACE(name(layout));
        Decoder decoder(config_for(2));
        const auto whole = kv::models::memory_cache(decoder, joined(memory_tokens, prompt_tokens), layout);
        const auto parts = kv::models::memory_cache(decoder, {memory_tokens[0], memory_tokens[1]}, layout);
        decoder.forward({memory_tokens.begin() + 2, memory_tokens.end()}, *parts);
        for (const std::int64_t token : prompt_tokens) decoder.forward({token}, *parts);
        std::string why;
        EXPECT_TRUE(same_content(*whole, *parts, &why)) << why;
    }
}

TEST(ModelsDecoder, MemoryCacheGivesTheTokensOfRecompute) {
    for (const std::uint64_t seed : decoder_seeds) {
        Decoder decoder(config_for(seed));
        const Tokens recomputed =
            kv::models::generate_without_cache(decoder, joined(memory_tokens, prompt_tokens), new_tokens_max);
        ASSERT_EQ(recomputed.size(), static_cast<std::size_t>(new_tokens_max));
        for (const Layout layout : {Layout::modern, Layout::legacy}) {
            SCOPED_TRACE(name(layout) + " seed " + std::to_string(seed));
            const auto memory = kv::models::memory_cache(decoder, memory_tokens, layout);
            const auto snapshot = kv::clone(*memory);
            EXPECT_EQ(generate_from(decoder, memory), recomputed);
            std::string why;
            EXPECT_TRUE(same_content(*memory, *snapshot, &why)) << "the memory changed: " << why;
        }
    }
}

TEST(ModelsDecoder, DroppingACachedTokenChangesTheTokens) {
    for (const std::uint64_t seed : decoder_seeds) {
        Decoder decoder(config_for(seed));
        for (const Layout layout : {Layout::modern, Layout::legacy}) {
            const auto memory = kv::models::memory_cache(decoder, memory_tokens, layout);
            const Tokens intact = generate_from(decoder, memory);
            for (std::int64_t position = 0; position < memory->get_seq_length(0); ++position) {
                SCOPED_TRACE(name(layout) + " seed " + std::to_string(seed) + " position " +
                             std::to_string(position));
                const auto dropped = edited(*memory, position, Edit::drop);
                ASSERT_EQ(dropped->get_seq_length(0), memory->get_seq_length(0) - 1);
                EXPECT_NE(generate_from(decoder, dropped), intact);
            }
        }
    }
}

TEST(ModelsDecoder, DuplicatingACachedTokenChangesTheTokens) {
    for (const std::uint64_t seed : decoder_seeds) {
        Decoder decoder(config_for(seed));
        for (const Layout layout : {Layout::modern, Layout::legacy}) {
            const auto memory = kv::models::memory_cache(decoder, memory_tokens, layout);
            const Tokens intact = generate_from(decoder, memory);
            for (std::int64_t position = 0; position < memory->get_seq_length(0); ++position) {
                SCOPED_TRACE(name(layout) + " seed " + std::to_string(seed) + " position " +
                             std::to_string(position));
                const auto doubled = edited(*memory, position, Edit::duplicate);
                ASSERT_EQ(doubled->get_seq_length(0), memory->get_seq_length(0) + 1);
                EXPECT_NE(generate_from(decoder, doubled), intact);
            }
        }
    }
}

TEST(ModelsDecoder, AMemoryMissingOneTokenGivesOtherTokens) {
    for (const std::uint64_t seed : decoder_seeds) {
        Decoder decoder(config_for(seed));
        const Tokens intact = generate_from(decoder, kv::models::memory_cache(decoder, memory_tokens, Layout::modern));
        for (std::size_t skipped = 0; skipped < memory_tokens.size(); ++skipped) {
            SCOPED_TRACE("seed " + std::to_string(seed) + " skipped " + std::to_string(skipped));
            Tokens shorter = memory_tokens;
            shorter.erase(shorter.begin() + static_cast<std::ptrdiff_t>(skipped));
            EXPECT_NE(generate_from(decoder, kv::models::memory_cache(decoder, shorter, Layout::modern)), intact);
        }
    }
}

TEST(ModelsDecoder, HalfPrecisionCachesGenerateDeterministically) {
    for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
        for (const Layout layout : {Layout::modern, Layout::legacy}) {
            SCOPED_TRACE(name(layout) + " " + std::string(c10::toString(dtype)));
            Decoder decoder(config_for(1));
            const auto memory = kv::models::memory_cache(decoder, memory_tokens, layout, dtype);
            EXPECT_EQ(kv::models::cache_dtype(*memory), dtype);
            const Tokens tokens = generate_from(decoder, memory);
            EXPECT_EQ(tokens.size(), static_cast<std::size_t>(new_tokens_max));
            EXPECT_EQ(generate_from(decoder, kv::models::memory_cache(decoder, memory_tokens, layout, dtype)),
                      tokens);
            // Decoding on top keeps the cache's dtype in every layer.
            const auto working = kv::clone(*memory);
            decoder.forward(prompt_tokens, *working);
            for (std::int64_t layer = 0; layer < working->layer_count(); ++layer) {
                EXPECT_EQ(kv::logical_keys(*working, layer).scalar_type(), dtype);
                EXPECT_EQ(kv::logical_values(*working, layer).scalar_type(), dtype);
                EXPECT_EQ(working->get_seq_length(layer), 8);
            }
        }
    }
}

// The default decoder's tokens, pinned: the geometry a cache brings must not
// change what the configured geometry computes (the corpus and the reports
// of earlier runs rely on it).
TEST(ModelsDecoder, DefaultGeometryTokensArePinned) {
    const std::vector<Tokens> pinned = {
        {29, 4, 20, 1, 1, 22, 16, 7}, {2, 0, 5, 15, 20, 3, 12, 13}, {27, 13, 1, 1, 9, 8, 24, 25}, {10, 26, 20, 25, 29, 3, 14, 16}};
    for (std::size_t i = 0; i < decoder_seeds.size(); ++i) {
        Decoder decoder(config_for(decoder_seeds[i]));
        EXPECT_EQ(generate_from(decoder, kv::models::memory_cache(decoder, memory_tokens, Layout::modern)), pinned[i])
            << "seed " << decoder_seeds[i];
    }
}

// A modern cache of `layers` initialized layers, each holding K/V of shape
// [1, heads, 0, head_dim]: no token, but a geometry for the decoder to take.
kv::CachePtr shaped_cache(std::int64_t heads, std::int64_t head_dim, std::int64_t layers) {
    auto list = std::make_shared<kv::LayerList>();
    for (std::int64_t i = 0; i < layers; ++i) {
        auto layer = std::make_shared<kv::Layer>();
        layer->keys = at::zeros({1, heads, 0, head_dim});
        layer->values = at::zeros({1, heads, 0, head_dim});
        layer->is_initialized = true;
        list->push_back(std::move(layer));
    }
    return kv::Cache::from_layers(std::move(list));
}

Tokens generate_on(Decoder& decoder, const kv::CachePtr& cache, const Tokens& prompt) {
    std::vector<std::int64_t> tokens;
    kv::GenerationStats stats;
    kv::run_model(decoder, prompt, *cache, new_tokens_max, [&tokens](std::int64_t token) { tokens.push_back(token); },
                  &stats);
    return tokens;
}

// The decoder takes the geometry and the layer count of the cache it is
// given: it writes K/V of that shape into every layer, generation from a
// memory equals recomputing on an empty cache of the same geometry, bit for
// bit, and every cached token still counts.
TEST(ModelsDecoder, AdaptsToTheGeometryOfTheCache) {
    struct Geometry {
        std::int64_t heads, head_dim, layers;
    };
    for (const Geometry g : {Geometry{4, 8, 3}, Geometry{1, 16, 2}, Geometry{2, 4, 5}}) {
        SCOPED_TRACE(std::to_string(g.heads) + "x" + std::to_string(g.head_dim) + ", " + std::to_string(g.layers) + " layers");
        Decoder decoder(config_for(1));
        const kv::CachePtr memory = shaped_cache(g.heads, g.head_dim, g.layers);
        decoder.forward(memory_tokens, *memory);
        ASSERT_EQ(memory->layer_count(), std::max<std::int64_t>(g.layers, 2));
        for (std::int64_t layer = 0; layer < memory->layer_count(); ++layer) {
            EXPECT_EQ(kv::logical_keys(*memory, layer).sizes().vec(),
                      (std::vector<std::int64_t>{1, g.heads, static_cast<std::int64_t>(memory_tokens.size()), g.head_dim}));
        }
        const Tokens from_memory = generate_on(decoder, kv::clone(*memory), prompt_tokens);
        const Tokens recomputed = generate_on(decoder, shaped_cache(g.heads, g.head_dim, g.layers), joined(memory_tokens, prompt_tokens));
        EXPECT_EQ(from_memory, recomputed);
        Decoder again(config_for(1));
        EXPECT_EQ(generate_on(again, kv::clone(*memory), prompt_tokens), from_memory) << "a second decoder";
        bool some_token_counts = false;
        for (std::int64_t position = 0; position < memory->get_seq_length(0); ++position) {
            const kv::CachePtr dropped = edited(*memory, position, Edit::drop);
            some_token_counts = some_token_counts || generate_on(decoder, dropped, prompt_tokens) != from_memory;
        }
        EXPECT_TRUE(some_token_counts);
    }
    // Another geometry is another model: its tokens differ from the default's.
    Decoder decoder(config_for(1));
    EXPECT_NE(generate_on(decoder, shaped_cache(4, 8, 2), memory_tokens), generate_on(decoder, kv::Cache::make(Layout::modern), memory_tokens));
}

// A cache whose layers disagree on the geometry is refused, not misread.
TEST(ModelsDecoder, RefusesACacheOfTwoGeometries) {
    Decoder decoder(config_for(1));
    const kv::CachePtr mixed = shaped_cache(4, 8, 2);
    (*mixed->layers())[1]->keys = at::zeros({1, 2, 1, 4});
    (*mixed->layers())[1]->values = at::zeros({1, 2, 1, 4});
    EXPECT_ANY_THROW(decoder.forward(memory_tokens, *mixed));
}

// ------------------------------------------------------------ bad inputs

// A copy of the cache (modern) whose every layer's K/V at positions
// [first, first + count) are zeros, as a null block's are.
kv::CachePtr zeroed(const kv::Cache& cache, std::int64_t first, std::int64_t count) {
    kv::CachePtr copy = kv::clone(cache);
    for (std::int64_t layer = 0; layer < copy->layer_count(); ++layer) {
        kv::logical_keys(*copy, layer).narrow(2, first, count).zero_();
        kv::logical_values(*copy, layer).narrow(2, first, count).zero_();
    }
    return copy;
}

// Sliding windows: a token reads the last `window` positions only, so the
// K/V before them may be anything (a paged pool frees their blocks), and
// one inside it changes the tokens; prefill in parts stays bit-exact.
TEST(ModelsDecoder, AWindowReadsOnlyTheKeysInsideIt) {
    constexpr std::int64_t window = 3;
    const auto length = static_cast<std::int64_t>(memory_tokens.size());
    for (const std::uint64_t seed : decoder_seeds) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        DecoderConfig config = config_for(seed);
        config.window = window;
        Decoder decoder(config);
        const auto memory = kv::models::memory_cache(decoder, memory_tokens, Layout::modern);
        const Tokens intact = generate_from(decoder, memory);
        EXPECT_EQ(intact, kv::models::generate_without_cache(decoder, joined(memory_tokens, prompt_tokens), new_tokens_max));
        // The first prompt token, at position `length`, sees length - window + 1 on.
        const std::int64_t unseen = length - window + 1;
        EXPECT_EQ(generate_from(decoder, zeroed(*memory, 0, unseen)), intact);
        EXPECT_NE(generate_from(decoder, zeroed(*memory, unseen, 1)), intact);
        Decoder full(config_for(seed));
        EXPECT_NE(generate_from(full, kv::models::memory_cache(full, memory_tokens, Layout::modern)), intact)
            << "the window changes nothing";
        const auto parts = kv::models::memory_cache(decoder, {memory_tokens[0], memory_tokens[1]}, Layout::modern);
        decoder.forward({memory_tokens.begin() + 2, memory_tokens.end()}, *parts);
        std::string why;
        EXPECT_TRUE(same_content(*memory, *parts, &why)) << why;
    }
}

// A window of at least every position is full attention, bit for bit.
TEST(ModelsDecoder, AWindowLongerThanTheSequenceIsFullAttention) {
    Decoder full(config_for(1));
    DecoderConfig config = config_for(1);
    config.window = 64;
    Decoder wide(config);
    const auto a = kv::models::memory_cache(full, joined(memory_tokens, prompt_tokens), Layout::modern);
    const auto b = kv::models::memory_cache(wide, joined(memory_tokens, prompt_tokens), Layout::modern);
    std::string why;
    EXPECT_TRUE(same_content(*a, *b, &why)) << why;
    EXPECT_EQ(generate_from(full, a), generate_from(wide, b));
}

TEST(ModelsInput, BadConfigsAndTokensAreRejected) {
    DecoderConfig no_layers;
    no_layers.layer_count = 0;
    EXPECT_THROW(Decoder{no_layers}, std::invalid_argument);
    DecoderConfig far_eos;
    far_eos.eos_token = far_eos.vocab_size;
    EXPECT_THROW(Decoder{far_eos}, std::invalid_argument);
    DecoderConfig negative_window;
    negative_window.window = -1;
    EXPECT_THROW(Decoder{negative_window}, std::invalid_argument);
    kv::models::AppenderConfig no_heads;
    no_heads.head_count = 0;
    EXPECT_THROW(Appender{no_heads}, std::invalid_argument);

    Decoder decoder({});
    Appender appender({});
    const kv::CachePtr cache = kv::Cache::make(Layout::modern);
    EXPECT_THROW(decoder.forward({}, *cache), std::invalid_argument);
    EXPECT_THROW(decoder.forward({32}, *cache), std::invalid_argument);
    EXPECT_THROW(appender.forward({-1}, *cache), std::invalid_argument);
    EXPECT_THROW(appender.forward_as({1}, *cache, at::kLong), std::invalid_argument);
    EXPECT_EQ(cache->layer_count(), 0) << "a rejected forward must not touch the cache";
    EXPECT_THROW(kv::models::generate_without_cache(decoder, {}, 4), std::invalid_argument);
    EXPECT_EQ(kv::models::memory_cache(decoder, {}, Layout::legacy)->layer_count(), 0);
}

}  // namespace
