// The decoders generation drives: an in-place appender stand-in and a small
// deterministic attention decoder. Both write into the cache they are given
// exactly as a transformers model does, through Cache::update, one call per
// layer per forward, with K/V of shape [1, heads, n_tokens, head_dim].
//
// Ownership: a model owns its configuration and (the decoder) its weights,
// nothing else. It keeps no reference to a cache between calls: `forward`
// mutates the caller's cache in place (the layer objects, lists and slots it
// already holds are rebound to longer tensors; in the legacy layout a new
// slot aliases the tensor the model just made) and returns. Whatever the
// caller held of the cache's old tensors stays valid and unchanged, because
// update never writes into a tensor. The one thing a forward invalidates is
// any length or layer count read from the cache before it.
//
//   kv::models::Decoder decoder({});                        // 2 layers, 2 heads, seed 1 (by default)
//   auto memory = kv::models::memory_cache(decoder, {5, 9, 2}, kv::Layout::modern);
//   auto tokens = kv::generate(decoder, copier, {7, 3}, memory, 8);  // == recompute
#pragma once

#include "kv/generation.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kv::models {

// The dtype a model writes into `cache`: that of the layer-0 logical keys
// when the cache has them (a bfloat16 memory stays bfloat16 while the model
// decodes on top of it), else float32.
at::ScalarType cache_dtype(const Cache& cache);

// A model that can write its K/V in a chosen dtype. `forward` writes the
// cache's own dtype (cache_dtype); `forward_as` exists so that a memory of
// any dtype can be built from an empty cache, which has no dtype yet.
class TypedModel : public Model {
  public:
    std::int64_t forward(const std::vector<std::int64_t>& tokens, Cache& cache) final;

    // Runs `tokens` (non-empty, each in [0, vocab)) on top of `cache`,
    // appending K/V of `dtype` to each layer in place; returns the greedy
    // next token. Throws std::invalid_argument on a bad token list.
    virtual std::int64_t forward_as(const std::vector<std::int64_t>& tokens, Cache& cache,
                                    at::ScalarType dtype) = 0;
};

// Limits of both models. An eos_token of -1 means "never stops early".
struct AppenderConfig {
    std::int64_t layer_count = 2;
    std::int64_t head_count = 2;
    std::int64_t head_dim = 4;
    std::int64_t vocab_size = 32;
    std::int64_t eos_token = 0;
};

// The in-place appender stand-in. It attends to nothing: K/V are a fixed
// function of (token, absolute position, layer), multiples of 1/8 in
// [-4, 4], so they are exact in float32, float16 and bfloat16 alike. The
// position is cache.get_seq_length(0) before the call plus the token's
// index. The next token depends only on the last token and the new length
// of layer 0, so it cannot tell which tokens a cache holds; use Decoder for
// that.
class Appender final : public TypedModel {
  public:
    explicit Appender(AppenderConfig config);

    std::int64_t forward_as(const std::vector<std::int64_t>& tokens, Cache& cache,
                            at::ScalarType dtype) override;
    std::int64_t eos_token() const override { return config_.eos_token; }
    const AppenderConfig& config() const { return config_; }

  private:
    AppenderConfig config_;
};

struct DecoderConfig {
    std::int64_t layer_count = 2;
    std::int64_t head_count = 2;
    std::int64_t head_dim = 4;
    std::int64_t vocab_size = 32;
    std::int64_t eos_token = 0;
    std::uint64_t seed = 1;
    // The attention window in tokens (sliding-window attention): a token at
    // position P sees the keys of positions max(0, P - window + 1)..P. 0:
    // full attention (every earlier position), bit for bit what a decoder
    // without a window computed.
    std::int64_t window = 0;
};

// A small deterministic attention decoder, computed in float32. Weights
// (token embedding E [vocab, heads*head_dim], per layer Wq, Wk, Wv, Wo, an
// untied readout U [heads*head_dim, vocab]) come from a splitmix64 stream
// seeded by config.seed, so they are the same on every machine, libtorch
// version and thread count; the position term is sinusoidal. A token at
// absolute position P (cache.get_seq_length(0) + cache.dropped() before the call, plus its
// index) starts as x = E[token] + pos(P). Per layer: q, k, v = x·Wq, x·Wk,
// x·Wv; k and v, as [1, heads, n, head_dim] tensors in storages of their
// own, are cast to the write dtype and appended through update; attention
// then reads the layer's whole K/V back from the cache (cast to float32),
// each new token seeing every cached token and the new tokens up to itself,
// softmax(q·kᵀ/sqrt(head_dim))·v; then x += out·Wo. The next token is
// argmax(sin(8 · x_last·U)), the first maximum winning: the fold through
// sin keeps greedy decoding from settling on a fixed point (decoder.cpp
// says why), so the tokens follow every change of the cache.
//
// The arithmetic is plain scalar float32 loops over std::vector weights
// (libtorch only carries K/V in and out of the cache: per layer, the update
// and the read-back). Every quantity of a token at absolute position P is
// computed by the same loops in the same order, whatever the number of
// tokens in the forward call: nothing is blocked or reduced in an order
// that depends on it, and nothing depends on the thread count. So a float32
// memory cache plus a prompt gives bit-for-bit the logits of recomputing
// memory + prompt with no cache, and generation equivalence is an exact
// property, not a tolerance. Every cached key and value carries a positive
// attention weight, so dropping or duplicating a cached token changes the
// logits (and, for a sensitive seed, the tokens).
//
// Sliding windows (config.window W > 0): a token at position P attends
// only to positions P - W + 1..P, as a sliding-window layer does; the
// earlier K/V are not read at all (their values, zeros of a null block or
// anything else, change nothing), so a paged pool may free blocks wholly
// outside every window (docs/semantics.md#sliding-windows). Every layer
// has the window. W = 0 is full attention.
//
// Extra keys (forward_extra: a LoRA adapter's name, a cache salt, as a
// paged request carries them). A request with extra keys X starts each
// token as x = (E[token] + pos(P)) + A(X), A(X) an [E] row of uniform
// values from the splitmix64 stream seeded by the fold of (config.seed, the
// geometry, X's bytes, X's length) (`extra_seed`), added in float32 after
// the position term; "" adds nothing, so `forward` is unchanged. So the
// K/V and the tokens of the same request under two extra keys differ
// everywhere, as a LoRA's do: a prefix hit across extra keys reads K/V
// another adapter computed.
//
// Geometry. The decoder adapts to the cache it is given, as a family of
// models would: the first layer whose logical keys (else values) are a 4-D
// tensor [1, H, S, D] gives its heads H and head_dim D; a cache with no
// such tensor gets config.head_count and config.head_dim. It runs
// max(config.layer_count, the cache's layer count) layers, so every cached
// layer takes part. The weights of a geometry (H, D) come from the stream
// seeded by config.seed when (H, D) is the configured geometry, else by
// splitmix64(config.seed ^ splitmix64(H << 32 | D)); layer i's weights are
// the same whatever the number of layers run (drawn in order after the
// embeddings). So the configured geometry, run on caches of at most
// config.layer_count layers, computes exactly what a fixed-geometry
// decoder of that configuration computed. A cache whose later layer holds
// K/V of another geometry than the one chosen is refused: that layer's
// update (a concatenation) or its read-back throws.
class Decoder final : public TypedModel {
  public:
    explicit Decoder(DecoderConfig config);

    std::int64_t forward_as(const std::vector<std::int64_t>& tokens, Cache& cache,
                            at::ScalarType dtype) override;
    std::int64_t forward_extra(const std::vector<std::int64_t>& tokens, Cache& cache, const std::string& extra) override;
    std::int64_t eos_token() const override { return config_.eos_token; }
    const DecoderConfig& config() const { return config_; }

  private:
    // All weights are row-major float32 matrices; E = heads * head_dim.
    struct LayerWeights {
        std::vector<float> qkv;  // [E, 3E]: Wq | Wk | Wv side by side
        std::vector<float> out;  // [E, E]
    };
    struct Weights {
        std::vector<float> embedding;    // [vocab, E]
        std::vector<float> unembedding;  // [E, vocab], untied from embedding
        std::vector<double> position_rates;  // [E]: the position term's frequency per embedding column
        std::vector<LayerWeights> layers;
    };

    // The weights of geometry (heads, head_dim) with at least `layer_count`
    // layers, made on first use (and made again, the same layers first, when
    // more layers are needed).
    const Weights& weights_for(std::int64_t heads, std::int64_t head_dim, std::int64_t layer_count);
    // [n, E] row-major: embedding row plus position term per token, plus
    // `extra`'s row when it is not empty.
    std::vector<float> embed_rows(const Weights& weights, std::int64_t heads, std::int64_t head_dim,
                                  const std::vector<std::int64_t>& tokens, std::int64_t first_position,
                                  const std::string& extra) const;
    std::int64_t run(const std::vector<std::int64_t>& tokens, Cache& cache, at::ScalarType dtype, const std::string& extra);

    DecoderConfig config_;
    std::map<std::pair<std::int64_t, std::int64_t>, Weights> weights_;  // by (heads, head_dim)
};

// The prefill of a "memory": a new cache of `layout` holding the K/V that
// `model` writes for `memory_tokens` with no past, in `dtype`. An empty token
// list gives an empty cache. The result is not marked owned: it stands for
// what a store holds.
CachePtr memory_cache(TypedModel& model, const std::vector<std::int64_t>& memory_tokens,
                      Layout layout, at::ScalarType dtype = at::kFloat);

// Greedy generation with no cache at all: every step runs the whole
// sequence so far (`tokens` then the tokens generated) on a fresh float32
// cache. Stops at EOS (emitted) or after max_new_tokens, like kv::generate.
// `tokens` must not be empty; max_new_tokens >= 0.
std::vector<std::int64_t> generate_without_cache(TypedModel& model,
                                                 const std::vector<std::int64_t>& tokens,
                                                 std::int64_t max_new_tokens);

}  // namespace kv::models
