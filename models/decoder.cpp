#include "kv/models.h"

#include "kvcheck/splitmix.h"

#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace kv::models {

namespace {

void check_config(const DecoderConfig& config) {
    if (config.layer_count < 1) throw std::invalid_argument("Decoder: layer_count must be >= 1");
    if (config.head_count < 1) throw std::invalid_argument("Decoder: head_count must be >= 1");
    if (config.head_dim < 1) throw std::invalid_argument("Decoder: head_dim must be >= 1");
    if (config.vocab_size < 1) throw std::invalid_argument("Decoder: vocab_size must be >= 1");
    if (config.eos_token < -1 || config.eos_token >= config.vocab_size) {
        throw std::invalid_argument("Decoder: eos_token must be -1 or in [0, vocab_size)");
    }
    if (config.window < 0) throw std::invalid_argument("Decoder: window must be >= 0 (0: full attention)");
}

void check_tokens(const std::vector<std::int64_t>& tokens, std::int64_t vocab_size) {
    if (tokens.empty()) throw std::invalid_argument("Decoder: forward needs at least one token");
    for (const std::int64_t token : tokens) {
        if (token < 0 || token >= vocab_size) {
            throw std::invalid_argument("Decoder: token " + std::to_string(token) +
                                        " outside [0, " + std::to_string(vocab_size) + ")");
        }
    }
}

// The weights' one seeded source: a splitmix64 stream (kvcheck/splitmix.h),
// whose output does not depend on the platform, the libtorch version or
// the thread count, which at::randn does not promise.
class WeightSource {
  public:
    explicit WeightSource(std::uint64_t seed) : stream_(seed) {}

    // Uniform in [-1, 1), on a grid of 2^-23: exact in float32.
    float uniform() {
        const auto bits = static_cast<std::int64_t>(stream_.next() >> 40U);  // 24 bits
        return static_cast<float>(bits - (std::int64_t{1} << 23)) / static_cast<float>(1 << 23);
    }

  private:
    kvcheck::SplitMix64 stream_;
};

std::size_t at_index(std::int64_t i) {
    assert(i >= 0);
    return static_cast<std::size_t>(i);
}

// A row-major [rows, cols] matrix of uniform values times `scale`.
std::vector<float> seeded(WeightSource& random, std::int64_t rows, std::int64_t cols, float scale) {
    std::vector<float> data(at_index(rows * cols));
    for (float& value : data) value = random.uniform() * scale;
    return data;
}

// The arithmetic below is plain float32 scalar code, and every quantity of
// one token (its projections, its attention scores, weights and output, its
// logits) is computed by the same loops in the same order whatever else came
// in the forward call: nothing is blocked, tiled or reduced in an order that
// depends on the number of tokens. That is what makes a token's bits depend
// on its position and the cache alone. Nothing here may be reassociated, so
// the build must not use -ffast-math or -fassociative-math.

// out[c] = row · weight[:, c] for a row-major [inner, cols] weight; each
// sum runs over the inner index in ascending order.
void row_times(const float* row, const float* weight, std::int64_t inner, std::int64_t cols, float* out) {
    for (std::int64_t c = 0; c < cols; ++c) out[c] = 0.0F;
    for (std::int64_t e = 0; e < inner; ++e) {
        const float factor = row[e];
        const float* weight_row = weight + e * cols;
        for (std::int64_t c = 0; c < cols; ++c) out[c] += factor * weight_row[c];
    }
}

float dot(const float* a, const float* b, std::int64_t length) {
    float sum = 0.0F;
    for (std::int64_t d = 0; d < length; ++d) sum += a[d] * b[d];
    return sum;
}

// The geometry one layer's attention works on.
struct Heads {
    std::int64_t count;  // heads
    std::int64_t dims;   // head_dim
    std::int64_t width() const { return count * dims; }
};

// Side `part` (0 q, 1 k, 2 v) of the [n, 3E] projections as a new
// [1, heads, n, head_dim] float32 tensor in a storage of its own: K and V
// must never share storage with each other or with anything else (a legacy
// cache keeps the tensor itself, and the harness computes aliasing from
// storages). Every element is written: no `empty` contents survive.
at::Tensor to_heads(const std::vector<float>& qkv, std::int64_t count, Heads heads, std::int64_t part) {
    // empty_cpu, not at::empty: the dispatcher's set-up was a tenth of a
    // small model step. Every element is written below.
    at::Tensor t = at::detail::empty_cpu({1, heads.count, count, heads.dims}, at::kFloat);
    float* data = t.data_ptr<float>();
    const std::int64_t width = heads.width();
    std::int64_t written = 0;
    for (std::int64_t h = 0; h < heads.count; ++h) {
        for (std::int64_t i = 0; i < count; ++i) {
            const float* source = qkv.data() + i * 3 * width + part * width + h * heads.dims;
            for (std::int64_t d = 0; d < heads.dims; ++d, ++written) data[written] = source[d];
        }
    }
    assert(written == t.numel());
    return t;
}

// The geometry of the first layer whose logical keys (else values) are a
// 4-D tensor, else `fallback`.
Heads geometry_of(const Cache& cache, Heads fallback) {
    for (std::int64_t layer = 0; layer < cache.layer_count(); ++layer) {
        for (const at::Tensor& t : {logical_keys(cache, layer), logical_values(cache, layer)}) {
            if (t.defined() && t.dim() == 4 && t.size(1) > 0 && t.size(3) > 0) return Heads{t.size(1), t.size(3)};
        }
    }
    return fallback;
}

std::string shape_text(const at::Tensor& t) {
    std::string text = "[";
    for (std::int64_t i = 0; i < t.dim(); ++i) text += (i ? ", " : "") + std::to_string(t.size(i));
    return text + "]";
}

// What the cache holds for one side of `layer` after the update, as a
// contiguous float32 [1, heads, S, head_dim] tensor (the cache's own tensor
// when it already is one; only read). A cache of another geometry is
// refused rather than read out of bounds.
at::Tensor read_back(const at::Tensor& held, Heads heads, std::int64_t count, std::int64_t layer,
                     const char* side) {
    const bool fits = held.defined() && held.dim() == 4 && held.size(0) == 1 && held.size(1) == heads.count &&
                      held.size(2) >= count && held.size(3) == heads.dims;
    if (!fits) {
        throw std::invalid_argument("Decoder: layer " + std::to_string(layer) + " " + side + " of shape " +
                                    (held.defined() ? shape_text(held) : std::string("(none)")) + ", expected [1, " +
                                    std::to_string(heads.count) + ", >= " + std::to_string(count) + ", " +
                                    std::to_string(heads.dims) + "]");
    }
    // Checked first so that the common case costs no dispatcher call.
    if (held.scalar_type() == at::kFloat && held.is_contiguous()) return held;
    at::Tensor t = held.to(at::kFloat).contiguous();
    assert(t.scalar_type() == at::kFloat);
    assert(t.is_contiguous());
    return t;
}

// Causal attention of the `count` new tokens of one layer. qkv: their
// [n, 3E] projections (q in the first E columns); keys, values: contiguous
// float32 [1, H, S, D] with S >= n. The query of new token i sits at
// position P = S - n + i and sees keys 0..P, or with a window W > 0 keys
// max(0, P - W + 1)..P. Writes [n, E] into `out`. Token i's result is a
// function of its query and the cached rows it sees only.
void attend(const std::vector<float>& qkv, const float* keys, const float* values, std::int64_t total,
            std::int64_t count, Heads heads, std::int64_t window, std::vector<float>& out) {
    const std::int64_t past = total - count;
    assert(past >= 0);
    const std::int64_t width = heads.width();
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(heads.dims)));
    std::vector<float> weights(at_index(total));
    for (std::int64_t i = 0; i < count; ++i) {
        const std::int64_t visible = past + i + 1;
        const std::int64_t first = window > 0 ? std::max<std::int64_t>(0, visible - window) : 0;
        for (std::int64_t h = 0; h < heads.count; ++h) {
            const float* query = qkv.data() + i * 3 * width + h * heads.dims;
            const float* head_keys = keys + h * total * heads.dims;
            const float* head_values = values + h * total * heads.dims;
            // softmax(q·kᵀ · scale), stable: the maximum is subtracted first.
            float top = -std::numeric_limits<float>::infinity();
            for (std::int64_t j = first; j < visible; ++j) {
                const float score = dot(query, head_keys + j * heads.dims, heads.dims) * scale;
                weights[at_index(j)] = score;
                if (score > top) top = score;
            }
            float sum = 0.0F;
            for (std::int64_t j = first; j < visible; ++j) {
                const float e = std::exp(weights[at_index(j)] - top);
                weights[at_index(j)] = e;
                sum += e;
            }
            float* result = out.data() + i * width + h * heads.dims;
            for (std::int64_t d = 0; d < heads.dims; ++d) result[d] = 0.0F;
            for (std::int64_t j = first; j < visible; ++j) {
                const float weight = weights[at_index(j)] / sum;
                const float* row = head_values + j * heads.dims;
                for (std::int64_t d = 0; d < heads.dims; ++d) result[d] += weight * row[d];
            }
        }
    }
}

// The first index of the largest value; a NaN counts as larger than any
// number, as at::argmax has it, so a poisoned state still gives one token.
std::int64_t first_argmax(const std::vector<float>& values) {
    std::int64_t best = 0;
    for (std::int64_t c = 1; c < static_cast<std::int64_t>(values.size()); ++c) {
        const float current = values[at_index(best)];
        if (std::isnan(current)) break;
        if (std::isnan(values[at_index(c)]) || values[at_index(c)] > current) best = c;
    }
    return best;
}

// Weight scales: unit weights give attention scores of a few units, so
// attention is neither uniform nor one-hot and every cached token carries a
// visible weight.
constexpr float embedding_scale = 1.0F;
constexpr float position_scale = 1.0F;
constexpr float projection_scale = 1.0F;
constexpr float output_scale = 1.0F;
constexpr float unembedding_scale = 1.0F;

// The readout folds the scaled logits through sin before the argmax. A plain
// argmax of x·Uᵀ is a near-linear function of a residual stream dominated by
// the last token, and greedy decoding then settles on a fixed point (the
// same token forever) for about a third of the seeds, whatever the cache
// holds. Folding makes the next token a sensitive function of the whole
// state: over 300 seeds with a 6-token memory, removing or doubling any one
// cached token changed the 8 generated tokens every time (1800 cases each). Sensitivity costs nothing in
// exactness, because the logits themselves are bit-reproducible.
constexpr float readout_gain = 8.0F;

// Extra keys' row: unit values like the embedding's, so that a request's
// extra keys move every K/V as much as another token would.
constexpr float extra_scale = 1.0F;
constexpr std::uint64_t extra_salt = 0x4C6F5241ULL;  // "LoRA": extra keys' stream apart from the weights'

}  // namespace

Decoder::Decoder(DecoderConfig config) : config_(config) {
    check_config(config_);
    weights_for(config_.head_count, config_.head_dim, config_.layer_count);
}

const Decoder::Weights& Decoder::weights_for(std::int64_t heads, std::int64_t head_dim, std::int64_t layer_count) {
    Weights& weights = weights_[{heads, head_dim}];
    if (static_cast<std::int64_t>(weights.layers.size()) >= layer_count) return weights;
    const bool configured = heads == config_.head_count && head_dim == config_.head_dim;
    const std::uint64_t seed =
        configured ? config_.seed
                   : kvcheck::splitmix64(config_.seed ^ kvcheck::splitmix64(static_cast<std::uint64_t>(heads) << 32 |
                                                                            static_cast<std::uint64_t>(head_dim)));
    const std::int64_t width = heads * head_dim;
    WeightSource random(seed);
    weights = Weights{};
    weights.embedding = seeded(random, config_.vocab_size, width, embedding_scale);
    weights.unembedding = seeded(random, width, config_.vocab_size, unembedding_scale);
    // The same doubles embed_rows computed per element before (a pow per
    // element per token was a tenth of a small model step).
    weights.position_rates.reserve(at_index(width));
    for (std::int64_t e = 0; e < width; ++e) {
        weights.position_rates.push_back(std::pow(10000.0, -static_cast<double>(e - e % 2) / static_cast<double>(width)));
    }
    weights.layers.reserve(at_index(layer_count));
    for (std::int64_t layer = 0; layer < layer_count; ++layer) {
        LayerWeights layer_weights;
        layer_weights.qkv = seeded(random, width, 3 * width, projection_scale);
        layer_weights.out = seeded(random, width, width, output_scale);
        weights.layers.push_back(std::move(layer_weights));
    }
    return weights;
}

namespace {

// The seed of extra keys' row: config.seed, the geometry, then each byte
// and the length, each folded in by a splitmix64 step (the Python decoder's
// _extra_seed is the same fold).
std::uint64_t extra_seed(std::uint64_t seed, std::int64_t heads, std::int64_t head_dim, const std::string& extra) {
    std::uint64_t h = kvcheck::splitmix64(seed ^ extra_salt);
    h = kvcheck::splitmix64(h ^ (static_cast<std::uint64_t>(heads) << 32 | static_cast<std::uint64_t>(head_dim)));
    for (const char c : extra) h = kvcheck::splitmix64(h ^ static_cast<unsigned char>(c));
    return kvcheck::splitmix64(h ^ extra.size());
}

}  // namespace

// x_i = embedding[token_i] + position(first_position + i), [n, E] row-major.
// The position term is sinusoidal, computed in double from the position
// alone and rounded to float32 before the sum. Extra keys add their row
// after it.
std::vector<float> Decoder::embed_rows(const Weights& weights, std::int64_t heads, std::int64_t head_dim,
                                       const std::vector<std::int64_t>& tokens, std::int64_t first_position,
                                       const std::string& extra) const {
    const std::int64_t width = heads * head_dim;
    const auto count = static_cast<std::int64_t>(tokens.size());
    std::vector<float> adapter;
    if (!extra.empty()) {
        WeightSource random(extra_seed(config_.seed, heads, head_dim, extra));
        adapter = seeded(random, 1, width, extra_scale);
    }
    std::vector<float> x(at_index(count * width));
    for (std::int64_t i = 0; i < count; ++i) {
        const auto position = static_cast<double>(first_position + i);
        const float* embedded = weights.embedding.data() + tokens[at_index(i)] * width;
        for (std::int64_t e = 0; e < width; ++e) {
            const double angle = position * weights.position_rates[at_index(e)];
            const double term = e % 2 == 0 ? std::sin(angle) : std::cos(angle);
            float value = embedded[e] + static_cast<float>(term) * position_scale;
            if (!adapter.empty()) value += adapter[at_index(e)];
            x[at_index(i * width + e)] = value;
        }
    }
    return x;
}

std::int64_t Decoder::forward_as(const std::vector<std::int64_t>& tokens, Cache& cache,
                                 at::ScalarType dtype) {
    return run(tokens, cache, dtype, "");
}

std::int64_t Decoder::forward_extra(const std::vector<std::int64_t>& tokens, Cache& cache, const std::string& extra) {
    return run(tokens, cache, cache_dtype(cache), extra);
}

std::int64_t Decoder::run(const std::vector<std::int64_t>& tokens, Cache& cache, at::ScalarType dtype,
                          const std::string& extra) {
    check_tokens(tokens, config_.vocab_size);
    if (!at::isFloatingType(dtype)) throw std::invalid_argument("Decoder: the K/V dtype must be floating");
    const auto count = static_cast<std::int64_t>(tokens.size());
    const Heads heads = geometry_of(cache, Heads{config_.head_count, config_.head_dim});
    const std::int64_t width = heads.width();
    const std::int64_t layer_count = std::max(config_.layer_count, cache.layer_count());
    const Weights& model = weights_for(heads.count, heads.dims, layer_count);
    // A window's cut (Cache::dropped) keeps the positions of what is left.
    std::vector<float> x =
        embed_rows(model, heads.count, heads.dims, tokens, cache.get_seq_length(0) + cache.dropped(), extra);
    std::vector<float> qkv(at_index(count * 3 * width));
    std::vector<float> attended(at_index(count * width));
    std::vector<float> product(at_index(width));
    for (std::int64_t layer = 0; layer < layer_count; ++layer) {
        const LayerWeights& weights = model.layers[at_index(layer)];
        for (std::int64_t i = 0; i < count; ++i) {
            row_times(x.data() + i * width, weights.qkv.data(), width, 3 * width, qkv.data() + i * 3 * width);
        }
        const at::Tensor k = to_heads(qkv, count, heads, 1);
        const at::Tensor v = to_heads(qkv, count, heads, 2);
        // A cast makes a new tensor; float32 K/V go in as they are.
        cache.update(dtype == at::kFloat ? k : k.to(dtype), dtype == at::kFloat ? v : v.to(dtype), layer);
        // Attend over what the cache holds now, as a model does: the past
        // is whatever the cache gave, in the cache's precision.
        const at::Tensor keys = read_back(logical_keys(cache, layer), heads, count, layer, "keys");
        const at::Tensor values = read_back(logical_values(cache, layer), heads, count, layer, "values");
        if (values.size(2) != keys.size(2)) {
            throw std::invalid_argument("Decoder: layer " + std::to_string(layer) + " holds " +
                                        std::to_string(keys.size(2)) + " keys but " +
                                        std::to_string(values.size(2)) + " values");
        }
        attend(qkv, keys.data_ptr<float>(), values.data_ptr<float>(), keys.size(2), count, heads, config_.window, attended);
        for (std::int64_t i = 0; i < count; ++i) {
            row_times(attended.data() + i * width, weights.out.data(), width, width, product.data());
            float* row = x.data() + i * width;
            for (std::int64_t e = 0; e < width; ++e) row[e] += product[at_index(e)];
        }
    }
    std::vector<float> logits(at_index(config_.vocab_size));
    row_times(x.data() + (count - 1) * width, model.unembedding.data(), width, config_.vocab_size, logits.data());
    for (float& logit : logits) logit = std::sin(logit * readout_gain);
    return first_argmax(logits);
}

CachePtr memory_cache(TypedModel& model, const std::vector<std::int64_t>& memory_tokens,
                      Layout layout, at::ScalarType dtype) {
    CachePtr cache = Cache::make(layout);
    if (!memory_tokens.empty()) model.forward_as(memory_tokens, *cache, dtype);
    assert(!cache->owned());
    return cache;
}

std::vector<std::int64_t> generate_without_cache(TypedModel& model,
                                                 const std::vector<std::int64_t>& tokens,
                                                 std::int64_t max_new_tokens) {
    if (tokens.empty()) throw std::invalid_argument("generate_without_cache: no tokens");
    if (max_new_tokens < 0) throw std::invalid_argument("generate_without_cache: max_new_tokens < 0");
    std::vector<std::int64_t> sequence = tokens;
    std::vector<std::int64_t> generated;
    while (static_cast<std::int64_t>(generated.size()) < max_new_tokens) {
        const CachePtr scratch = Cache::make(Layout::modern);
        const std::int64_t next = model.forward_as(sequence, *scratch, at::kFloat);
        generated.push_back(next);
        if (next == model.eos_token()) break;
        sequence.push_back(next);
    }
    return generated;
}

}  // namespace kv::models
