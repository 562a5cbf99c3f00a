#include "bundled.h"

#include "mutants/mutants.h"
#include "reference/reference_engine.h"

namespace kvcheck::adapters {

const std::vector<Adapter>& bundled() {
    static const std::vector<Adapter> adapters = [] {
        std::vector<Adapter> all = {{"reference", "the reference implementation", "bundled", {},
                                     [] { return std::shared_ptr<Engine>(std::make_shared<ReferenceEngine>()); }}};
        for (Adapter& mutant : mutant_adapters()) all.push_back(std::move(mutant));
        return all;
    }();
    return adapters;
}

const Adapter* find_bundled(const std::string& name) {
    for (const Adapter& adapter : bundled()) {
        if (adapter.name == name) return &adapter;
    }
    return nullptr;
}

}  // namespace kvcheck::adapters
