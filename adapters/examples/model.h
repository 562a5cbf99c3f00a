// The vector engine's model: a deterministic stand-in for a decoder that
// writes into the cache it is given exactly as a transformers model does
// (one in-place update per layer per forward), and whose next token depends
// on every value the cache holds, so a dropped, duplicated or changed cached
// token changes what it generates.
//
// It keeps nothing between calls: `forward` mutates the caller's cache and
// returns. Any length read from the cache before a forward is stale after it.
//
//   Model model;
//   CachePtr working = Cache::make(Layout::modern);
//   RunStats stats;
//   run_model(model, {5, 7}, *working, 4, [](std::int64_t t) { ... }, stats);
#pragma once

#include "cache.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace vector_engine {

struct ModelConfig {
    std::size_t layer_count = 2;
    std::int64_t vocab_size = 32;
    std::int64_t eos_token = 0;
};

class Model {
  public:
    explicit Model(ModelConfig config = {});

    // Runs `tokens` (non-empty, each in [0, vocab)) on top of `cache`: for
    // each model layer, appends the tokens' K/V (a fixed function of token,
    // absolute position, layer and side, multiples of 1/8) in one update, in
    // the dtype of the cache's layer-0 keys (f32 when it has none) and the
    // geometry of the tokens it holds (cache_geometry: the model adapts to
    // the cache, 2 heads of 4 on a cache without tokens). The
    // position of the first token is cache.seq_length(0) before the call.
    // Returns the next token: a hash of the tokens and of every logical K/V
    // value of every layer of the cache after the update.
    std::int64_t forward(const std::vector<std::int64_t>& tokens, Cache& cache) const;
    std::int64_t eos_token() const { return config_.eos_token; }

  private:
    ModelConfig config_;
};

using TokenSink = std::function<void(std::int64_t token)>;

struct RunStats {
    std::int64_t peak_live_sets = 0;  // K/V sets alive on the working cache's copy chain, at most
};

// The model loop with no boundary: prefill `prompt` on top of `working`,
// then greedy decoding, feeding each token back, until EOS (emitted) or
// max_new_tokens tokens. Throws std::invalid_argument on an empty prompt or
// a negative limit.
void run_model(const Model& model, const std::vector<std::int64_t>& prompt, Cache& working,
               std::int64_t max_new_tokens, const TokenSink& sink, RunStats& stats);

}  // namespace vector_engine
