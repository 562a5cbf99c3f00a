// generation-equivalent: generating from a cache through the engine's
// boundary gives the tokens its model gives on a fresh deep copy of the
// same content (the decoder attends over every cached token, so a token
// dropped, duplicated or lost to an uninitialized layer changes them).
//
// Checked: every generation's tokens against the engine's generate_fresh
// of the content the auditor expects the source to hold.
// Not checked here: what the generation did to the store (stored-immutable)
// or how many copies it made (single-copy).
#include "checkers/checker.h"

namespace kvcheck::checkers {
namespace {

class GenerationEquivalent final : public Checker {
  public:
    GenerationEquivalent() : Checker(Property::generation_equivalent) {}

    void generated(const Generated& generation, Probe& probe) override {
        if (!checking(probe)) return;
        const std::vector<std::int64_t> reference = probe.engine().generate_fresh(generation.fresh, generation.prompt, generation.max);
        expect(probe, generation.result.tokens == reference, [&] {
            return generation_text(generation) + " gave tokens " + tokens_text(generation.result.tokens) +
                   ", a fresh copy gives " + tokens_text(reference);
        });
    }
};

}  // namespace

template <>
std::unique_ptr<Checker> make_checker<Property::generation_equivalent>() {
    return std::make_unique<GenerationEquivalent>();
}

}  // namespace kvcheck::checkers
