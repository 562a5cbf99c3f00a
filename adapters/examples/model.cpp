#include "model.h"

#include <kvcheck/splitmix.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace vector_engine {
namespace {

std::uint64_t mix(std::uint64_t x) { return kvcheck::splitmix64(x); }

std::uint64_t combine(std::uint64_t hash, std::uint64_t value) { return mix(hash ^ mix(value)); }

// A K or V element for a token: a multiple of 1/8 in [-4, 4), exact in every dtype.
float kv_value(std::int64_t token, std::int64_t position, std::size_t layer, int side, std::int64_t head,
               std::int64_t dim) {
    std::uint64_t h = mix(static_cast<std::uint64_t>(token));
    for (std::uint64_t part : {static_cast<std::uint64_t>(position), static_cast<std::uint64_t>(layer),
                               static_cast<std::uint64_t>(side), static_cast<std::uint64_t>(head),
                               static_cast<std::uint64_t>(dim)}) {
        h = combine(h, part);
    }
    return static_cast<float>(static_cast<int>(h % 64) - 32) / 8.0f;
}

Tensor token_kv(const std::vector<std::int64_t>& tokens, std::int64_t first_position, std::size_t layer, int side,
                DType dtype, std::pair<std::int64_t, std::int64_t> geometry) {
    const auto [heads, head_dim] = geometry;
    const auto count = static_cast<std::int64_t>(tokens.size());
    std::vector<float> values;
    values.reserve(static_cast<std::size_t>(heads * count * head_dim));
    for (std::int64_t head = 0; head < heads; ++head) {
        for (std::int64_t i = 0; i < count; ++i) {
            for (std::int64_t dim = 0; dim < head_dim; ++dim) {
                values.push_back(kv_value(tokens[static_cast<std::size_t>(i)], first_position + i, layer, side, head, dim));
            }
        }
    }
    return make_tensor(dtype, heads, count, head_dim, std::move(values));
}

std::uint64_t hash_tensor(std::uint64_t hash, const Tensor& tensor) {
    if (!tensor) return combine(hash, 0xA55E27ull);  // absent differs from empty
    hash = combine(hash, static_cast<std::uint64_t>(tensor->tokens));
    // Every bit of every value counts (kvcheck's values have full mantissas).
    for (float value : tensor->values) {
        std::uint32_t bits = 0;
        std::memcpy(&bits, &value, sizeof bits);
        hash = combine(hash, bits);
    }
    return hash;
}

}  // namespace

Model::Model(ModelConfig config) : config_(config) {
    if (config_.vocab_size < 1) throw std::invalid_argument("Model: vocab_size must be >= 1");
    if (config_.eos_token < -1 || config_.eos_token >= config_.vocab_size) {
        throw std::invalid_argument("Model: eos_token must be -1 or in [0, vocab_size)");
    }
}

std::int64_t Model::forward(const std::vector<std::int64_t>& tokens, Cache& cache) const {
    if (tokens.empty()) throw std::invalid_argument("forward: no tokens");
    for (std::int64_t token : tokens) {
        if (token < 0 || token >= config_.vocab_size) {
            throw std::invalid_argument("forward: token " + std::to_string(token) + " outside the vocabulary");
        }
    }
    const Tensor layer0_keys = logical(cache, 0, keys);
    const DType dtype = layer0_keys ? layer0_keys->dtype : DType::f32;
    const std::pair<std::int64_t, std::int64_t> geometry = cache_geometry(cache);
    const std::int64_t first_position = cache.seq_length(0);
    for (std::size_t layer = 0; layer < config_.layer_count; ++layer) {
        cache.update(token_kv(tokens, first_position, layer, 0, dtype, geometry),
                     token_kv(tokens, first_position, layer, 1, dtype, geometry), layer);
    }
    std::uint64_t hash = 0;
    for (std::int64_t token : tokens) hash = combine(hash, static_cast<std::uint64_t>(token));
    for (std::size_t layer = 0; layer < cache.layer_count(); ++layer) {
        hash = hash_tensor(hash, logical(cache, layer, keys));
        hash = hash_tensor(hash, logical(cache, layer, values));
    }
    return static_cast<std::int64_t>(hash % static_cast<std::uint64_t>(config_.vocab_size));
}

void run_model(const Model& model, const std::vector<std::int64_t>& prompt, Cache& working,
               std::int64_t max_new_tokens, const TokenSink& sink, RunStats& stats) {
    if (prompt.empty()) throw std::invalid_argument("generate: the prompt is empty");
    if (max_new_tokens < 0) throw std::invalid_argument("generate: max_new_tokens < 0");
    auto sample = [&] { stats.peak_live_sets = std::max(stats.peak_live_sets, live_sets_on_path(working)); };
    sample();
    if (max_new_tokens == 0) return;
    std::int64_t next = model.forward(prompt, working);
    for (std::int64_t produced = 1;; ++produced) {
        sample();
        sink(next);
        if (next == model.eos_token() || produced == max_new_tokens) return;
        next = model.forward({next}, working);
    }
}

}  // namespace vector_engine
