// The model boundary. A model appends the new tokens' K/V to the cache it is
// given, in place; the boundary makes sure that cache is never a stored one:
// it clones the incoming cache exactly once, unless the cache is already an
// owned copy, which it hands to the model as is (the owned marker is the
// permission to write: an owned copy shares no storage with anything stored).
//
//   kv::Copier copier;
//   auto tokens = kv::generate(model, copier, prompt, store.get_cache({"a"}), 8);
//   // one copy logged (by get_cache), none by generate; the store is unchanged
#pragma once

#include "kv/cache.h"
#include "kv/copy.h"

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kv {

class Model {
  public:
    virtual ~Model() = default;
    // Runs `tokens` on top of `cache`, appending their K/V to it in place
    // through Cache::update, and returns the greedy next token.
    virtual std::int64_t forward(const std::vector<std::int64_t>& tokens, Cache& cache) = 0;
    // `forward` for a request with extra keys (a LoRA adapter's name, a
    // cache salt: the paged family's, docs/semantics.md#the-model): a model
    // that serves them mixes them into what it computes, so the K/V of the
    // same tokens under other extra keys differ. "" is `forward` itself. A
    // model that cannot tell extra keys apart refuses any.
    virtual std::int64_t forward_extra(const std::vector<std::int64_t>& tokens, Cache& cache, const std::string& extra) {
        if (!extra.empty()) throw std::invalid_argument("this model takes no extra keys ('" + extra + "')");
        return forward(tokens, cache);
    }
    virtual std::int64_t eos_token() const = 0;
};

struct GenerationStats {
    std::int64_t copies = 0;          // copies made by the boundary
    std::int64_t bytes_copied = 0;    // bytes those copies hold
    std::int64_t peak_live_sets = 0;  // K/V sets alive on the path, at most, while the model ran
};

using TokenSink = std::function<void(std::int64_t token)>;

// The cache the model may write into: `past` itself when it is an owned
// copy, else a clone of it (logged as CopyReason::generate); a new empty
// modern cache when `past` is null.
CachePtr own_for_generation(const ConstCachePtr& past, Copier& copier);

// The model loop, with no boundary: prefill `prompt` on top of `working`,
// then greedy decoding, feeding each token back, until EOS (emitted) or
// `max_new_tokens` tokens. Every token goes to `sink` as it is produced.
// `prompt` must not be empty; max_new_tokens >= 0.
void run_model(Model& model, const std::vector<std::int64_t>& prompt, Cache& working,
               std::int64_t max_new_tokens, const TokenSink& sink, GenerationStats* stats);

// Boundary + model loop.
std::vector<std::int64_t> generate(Model& model, Copier& copier,
                                   const std::vector<std::int64_t>& prompt,
                                   const ConstCachePtr& past, std::int64_t max_new_tokens,
                                   GenerationStats* stats = nullptr);
void generate_stream(Model& model, Copier& copier, const std::vector<std::int64_t>& prompt,
                     const ConstCachePtr& past, std::int64_t max_new_tokens,
                     const TokenSink& sink, GenerationStats* stats = nullptr);

}  // namespace kv
