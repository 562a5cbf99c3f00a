#include "kv/generation.h"

#include <algorithm>
#include <stdexcept>

namespace kv {

CachePtr own_for_generation(const ConstCachePtr& past, Copier& copier) {
    if (!past) return Cache::make(Layout::modern);
    // An owned copy shares no storage with anything stored: it is the one
    // copy of this generation, and the model may write into it.
    if (past->owned()) return std::const_pointer_cast<Cache>(past);
    return copier.clone(*past, CopyReason::generate);
}

void run_model(Model& model, const std::vector<std::int64_t>& prompt, Cache& working,
               std::int64_t max_new_tokens, const TokenSink& sink, GenerationStats* stats) {
    if (prompt.empty()) throw std::invalid_argument("generate: the prompt is empty");
    if (max_new_tokens < 0) throw std::invalid_argument("generate: max_new_tokens < 0");
    auto sample = [&working, stats] {
        if (stats) stats->peak_live_sets = std::max(stats->peak_live_sets, live_sets_on_path(working));
    };
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

void generate_stream(Model& model, Copier& copier, const std::vector<std::int64_t>& prompt,
                     const ConstCachePtr& past, std::int64_t max_new_tokens,
                     const TokenSink& sink, GenerationStats* stats) {
    const std::size_t logged_before = copier.log().size();
    const CachePtr working = own_for_generation(past, copier);
    if (stats) {
        for (std::size_t i = logged_before; i < copier.log().size(); ++i) {
            stats->copies += 1;
            stats->bytes_copied += copier.log()[i].bytes;
        }
    }
    run_model(model, prompt, *working, max_new_tokens, sink, stats);
}

std::vector<std::int64_t> generate(Model& model, Copier& copier,
                                   const std::vector<std::int64_t>& prompt,
                                   const ConstCachePtr& past, std::int64_t max_new_tokens,
                                   GenerationStats* stats) {
    std::vector<std::int64_t> tokens;
    generate_stream(model, copier, prompt, past, max_new_tokens,
                    [&tokens](std::int64_t token) { tokens.push_back(token); }, stats);
    return tokens;
}

}  // namespace kv
