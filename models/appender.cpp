#include "kv/models.h"

#include "kvcheck/splitmix.h"

#include <ATen/ops/from_blob.h>

#include <array>
#include <cassert>
#include <stdexcept>
#include <string>

namespace kv::models {

at::ScalarType cache_dtype(const Cache& cache) {
    const at::Tensor keys = logical_keys(cache, 0);
    return keys.defined() ? keys.scalar_type() : at::kFloat;
}

std::int64_t TypedModel::forward(const std::vector<std::int64_t>& tokens, Cache& cache) {
    return forward_as(tokens, cache, cache_dtype(cache));
}

namespace {

void check_config(const AppenderConfig& config) {
    if (config.layer_count < 1) throw std::invalid_argument("Appender: layer_count must be >= 1");
    if (config.head_count < 1) throw std::invalid_argument("Appender: head_count must be >= 1");
    if (config.head_dim < 1) throw std::invalid_argument("Appender: head_dim must be >= 1");
    if (config.vocab_size < 1) throw std::invalid_argument("Appender: vocab_size must be >= 1");
    if (config.eos_token < -1 || config.eos_token >= config.vocab_size) {
        throw std::invalid_argument("Appender: eos_token must be -1 or in [0, vocab_size)");
    }
}

void check_tokens(const std::vector<std::int64_t>& tokens, std::int64_t vocab_size) {
    if (tokens.empty()) throw std::invalid_argument("Appender: forward needs at least one token");
    for (const std::int64_t token : tokens) {
        if (token < 0 || token >= vocab_size) {
            throw std::invalid_argument("Appender: token " + std::to_string(token) +
                                        " outside [0, " + std::to_string(vocab_size) + ")");
        }
    }
}

// A fixed, platform-independent hash step.
std::uint64_t mix(std::uint64_t x) { return kvcheck::splitmix64(x); }

// One K or V entry: a multiple of 1/8 in [-4, 4]. Such a value needs at
// most 6 significant bits, so float16 and bfloat16 hold it exactly and a
// cast never changes what a checker compares.
float entry(std::int64_t token, std::int64_t position, std::int64_t layer, std::int64_t head,
            std::int64_t dim, std::uint64_t side) {
    std::uint64_t h = mix(static_cast<std::uint64_t>(token));
    h = mix(h ^ static_cast<std::uint64_t>(position));
    h = mix(h ^ static_cast<std::uint64_t>(layer));
    h = mix(h ^ static_cast<std::uint64_t>(head));
    h = mix(h ^ static_cast<std::uint64_t>(dim));
    h = mix(h ^ side);
    const auto eighths = static_cast<std::int64_t>(h % 65U) - 32;
    return static_cast<float>(eighths) / 8.0F;
}

}  // namespace

Appender::Appender(AppenderConfig config) : config_(config) { check_config(config_); }

std::int64_t Appender::forward_as(const std::vector<std::int64_t>& tokens, Cache& cache,
                                  at::ScalarType dtype) {
    check_tokens(tokens, config_.vocab_size);
    if (!at::isFloatingType(dtype)) throw std::invalid_argument("Appender: the K/V dtype must be floating");
    const auto count = static_cast<std::int64_t>(tokens.size());
    const std::int64_t first_position = cache.get_seq_length(0);
    const std::int64_t heads = config_.head_count;
    const std::int64_t dims = config_.head_dim;
    for (std::int64_t layer = 0; layer < config_.layer_count; ++layer) {
        // [1, heads, count, dims] in row-major order.
        std::vector<float> keys(static_cast<std::size_t>(heads * count * dims));
        std::vector<float> values(keys.size());
        std::size_t at = 0;
        for (std::int64_t head = 0; head < heads; ++head) {
            for (std::int64_t i = 0; i < count; ++i) {
                const std::int64_t token = tokens[static_cast<std::size_t>(i)];
                for (std::int64_t dim = 0; dim < dims; ++dim, ++at) {
                    keys[at] = entry(token, first_position + i, layer, head, dim, 0);
                    values[at] = entry(token, first_position + i, layer, head, dim, 1);
                }
            }
        }
        assert(at == keys.size());
        // from_blob borrows the vector; the cast (or clone) gives the cache
        // a tensor of its own before the vector goes away.
        const std::array<std::int64_t, 4> shape{1, heads, count, dims};
        auto own = [&shape, dtype](std::vector<float>& data) {
            const at::Tensor borrowed = at::from_blob(data.data(), shape, at::kFloat);
            return dtype == at::kFloat ? borrowed.clone() : borrowed.to(dtype);
        };
        cache.update(own(keys), own(values), layer);
    }
    const std::int64_t length = cache.get_seq_length(0);
    assert(length == first_position + count);
    const std::int64_t last = tokens.back();
    return (last * 7 + length * 13 + 5) % config_.vocab_size;
}

}  // namespace kv::models
