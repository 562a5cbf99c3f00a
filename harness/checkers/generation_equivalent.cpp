// generation-equivalent: generating from a cache through the engine's
// boundary gives the tokens its model gives on a fresh deep copy of the
// same content (the decoder attends over every cached token, so a token
// dropped, duplicated or lost to an uninitialized layer changes them).
//
// Checked: every generation's tokens against the engine's generate_fresh
// of the content the auditor expects the source to hold (a cache the model
// made: what it started from, fed the tokens fed since, then the prompt);
// the cache a turn returns against the engine's fed_view of the same
// (docs/semantics.md#returned-caches). Across the paged forms: the tokens
// a paged append decodes through the block table against those the
// engine's model decodes from the sequence's exported contiguous cache
// (PagedEngine::paged_decode_exported, read before the append), when the
// engine offers it.
// Not checked here: what the generation did to the store (stored-immutable)
// or how many copies it made (single-copy).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class GenerationEquivalent final : public Checker {
  public:
    GenerationEquivalent() : Checker(Property::generation_equivalent) {}

    void paged(const Paged& fact, Probe& probe) override {
        if (fact.by != PagedBy::append || fact.refused || !fact.decoded_exported || !checking(probe)) return;
        expect(probe, fact.appended == *fact.decoded_exported, [&] {
            return fact.what + " decoded " + tokens_text(fact.appended) +
                   " through the block table; decoding the sequence's exported contiguous cache gives " +
                   tokens_text(*fact.decoded_exported);
        });
    }

    void generated(const Generated& generation, Probe& probe) override {
        if (!checking(probe)) return;
        // From a cache the model made: a fresh copy of what it started
        // from, fed what the model was fed since, then the prompt (turn 2
        // from turn 1's cache is one generation over both turns).
        Tokens prompt = generation.history;
        prompt.insert(prompt.end(), generation.prompt.begin(), generation.prompt.end());
        const std::vector<std::int64_t> reference = probe.engine().generate_fresh(generation.fresh, prompt, generation.max);
        expect(probe, generation.result.tokens == reference, [&] {
            return generation_text(generation) + " gave tokens " + tokens_text(generation.result.tokens) +
                   ", a fresh copy gives " + tokens_text(reference) +
                   (generation.history.empty() ? "" : " (fed " + tokens_text(generation.history) + " first)");
        });
        if (!generation.returned_object || !checking(probe)) return;
        const std::string difference = probe.handle_difference(generation.returned, *generation.returned_object);
        if (!difference.empty()) {
            fail(probe, "the cache " + generation_text(generation) + " returned as " + handle_text(generation.returned) +
                            " is not the source's K/V followed by those of the tokens fed: " + difference);
        }
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::generation_equivalent>() {
    return std::make_unique<GenerationEquivalent>();
}

}  // namespace kvcheck::checkers
